//! The sharing policy: what the controller does about a queue that is not its own.
//!
//! A delay-based flow yields whenever a queue stands; a loss-based flow (TCP CUBIC or Reno)
//! keeps the bottleneck's buffer full and yields only when it overflows. Beside such a flow
//! the queue never goes. The contention detector tells that case apart (Copa's test): the
//! queue stood over the target all round, round after round, through two of our own yields
//! (another delay-based flow yields too, and the queue goes). A queue we keep alone goes
//! when we yield.
//!
//! While contended, the [`Policy`] decides:
//! - [`Policy::Fair`] (the default): the controller's own rules, unchanged (it yields to the
//!   queue as to any other).
//! - [`Policy::Low`] (a scavenger, as LEDBAT): every round the foreign queue stands, the
//!   estimate is cut to `Params::low_beta` of the share, down to the rate floor.
//!
//! Contention ends once the queue was (nearly) gone `Params::contend_rounds` rounds in a
//! row: the other flow left, or was not elastic, and the delay signal is ours again.

use super::params::Params;

/// How a flow shares a bottleneck with traffic that keeps a queue standing (see the module
/// doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Policy {
    /// The controller's own rules: a share beside other hayate flows.
    #[default]
    Fair,
    /// Stay out of the way: give way to any traffic that keeps a queue standing, down to
    /// the rate floor (for background jobs).
    Low,
}

impl Policy {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Fair => "fair",
            Policy::Low => "low",
        }
    }

    /// Parses [`name`](Self::name).
    pub fn from_name(s: &str) -> Option<Policy> {
        match s {
            "fair" => Some(Policy::Fair),
            "low" => Some(Policy::Low),
            _ => None,
        }
    }
}

/// The contention detector's state.
#[derive(Debug, Clone, Default)]
pub(super) struct Contention {
    /// Rounds in a row whose least path queue stood over the queue target ...
    held_rounds: u32,
    /// ... through this many yields of ours (Down phases) ...
    yields: u32,
    /// ... whether the last round was one of them.
    was_yield: bool,
    /// A queue not ours stands: the policy is in force ...
    pub(super) contended: bool,
    /// ... until the queue was gone this many rounds in a row.
    gone_rounds: u32,
}

impl Contention {
    /// At a round's end: its least path queue (`None` without RTT samples), the queue
    /// target, whether the round was one of our yields.
    pub(super) fn end_round(
        &mut self,
        p: &Params,
        least_us: Option<u64>,
        target_us: u64,
        yielded: bool,
    ) {
        let was_yield = std::mem::replace(&mut self.was_yield, yielded);
        let Some(least) = least_us else {
            return;
        };
        if least as f64 <= p.drain_floor * target_us as f64 {
            self.held_rounds = 0;
            self.yields = 0;
            self.gone_rounds += 1;
            self.contended &= self.gone_rounds < p.contend_rounds;
            return;
        }
        self.gone_rounds = 0;
        if least > target_us {
            self.held_rounds += 1;
            self.yields += u32::from(yielded && !was_yield);
            self.contended |=
                self.held_rounds >= p.contend_rounds && self.yields >= p.contend_yields;
        } else {
            self.held_rounds = 0;
            self.yields = 0;
        }
    }
}
