//! The sharing policy: what the controller does about a queue that is not its own.
//!
//! A delay-based flow yields whenever a queue stands; a loss-based flow (TCP CUBIC or Reno)
//! keeps the bottleneck's buffer full and yields only when it overflows. Beside such a flow
//! the queue never goes, and a flow that yields to it gives up its share a little more at
//! every yield, down to nothing. The contention detector tells that case apart (Copa's
//! test): the queue stood over the target all round for `Params::contend_rounds` rounds in a
//! row, through `Params::contend_yields` of our own yields. A queue we keep alone goes when
//! we yield, and so does one another hayate flow keeps (it yields too). Not on a buffer
//! known to be short: there a newcomer's queue stands through our yields as well.
//!
//! A flow that joins behind a loss-based one never sees the path empty: its minimum RTT has
//! that flow's standing queue in it, and over that minimum each of its yields pushes the
//! queue just under the target while the other flow grows into what the yield gave away.
//! The first test then waits for the other flow's next cut (10-20 s on a 50 ms path), the
//! share draining meanwhile. So does a slower one: the queue was never (nearly) gone, under
//! `Params::drain_floor` of the target, for `Params::contend_standing_rounds` rounds and
//! `Params::contend_standing_us`, through as many yields. A path remembered from an earlier
//! session lends the floor (both tests measure the queue from its minimum RTT for
//! `Params::resume_base_us`, see careful resume; the rest of the controller from its own):
//! the queue over it stands through our yields, and the first test finds the other flow
//! within seconds (2.0 and 3.5 s after joining in the simulator at 50 and 100 ms, where it
//! took 19 s and over 20 s without).
//!
//! While contended, the [`Policy`] decides:
//! - [`Policy::Fair`] competes as a loss-based flow does, by CUBIC's rules (RFC 9438) in
//!   rate terms: the queue no longer ends a probe; first it searches, pacing
//!   `Params::contend_search_gain` times what it gets through, as a TCP newcomer's slow
//!   start does (what our yields gave away while the detector made sure is taken back in a
//!   few round trips); when the buffer overflows the estimate is cut to
//!   `Params::contend_beta` of the share; between overflows the pace is CUBIC's window
//!   curve over the RTT (`curve_rate`), so that beside a CUBIC flow both grow alike. It is
//!   a window's pace: as the queue drains after a cut the RTT falls and the pace rises, as
//!   a window flow's does, and nothing else holds it up (held at what gets delivered, the
//!   pace was back within a few round trips of each cut, and kept whatever share it had).
//!   Nor is a stall of our host made up meanwhile (`RateControl::makes_up_stalls`). The
//!   overflow is ours when a round loses more than random loss explains; the other flow's
//!   when the RTT, having stood at the deepest seen lately (the buffer full), falls by
//!   `Params::contend_drop` of it: that flow lost what overflowed and cut. Not within
//!   `Params::contend_stall_rounds` of our host holding our sender: that fall is ours. A
//!   paced flow beside a bursty one rarely loses at those moments (the bursts meet the full
//!   buffer), and cutting only on its own losses it kept the buffer full and left CUBIC
//!   nothing.
//!   Our own cut's fall does not count: after a cut the RTT must fall and fill again first,
//!   and the `Params::contend_cut_rounds` rounds after a cut, which still hold samples of
//!   the buffer full before it, do not show it full again (read so, one overflow made two
//!   cuts, to 0.49 of the pace where CUBIC cuts to 0.7).
//!
//!   A rate-based flow (BBR) keeps a queue standing too, but never cuts: it paces at the
//!   largest delivery rate of its last round trips, probes over it a round in 8 and drains
//!   the next. Its drains look like cuts, and cutting at each hands it our share a little
//!   more every time, down to nothing. It shows itself by the spacing of its falls: a
//!   loss-based flow takes seconds to grow back and overflow again (hundreds of round trips
//!   at 10 ms, tens at 250 ms), a rate-based one drains every few round trips. Once
//!   `Params::contend_quick_falls` falls in a row came within `Params::contend_fall_spacing`
//!   rounds of the one before, the other flow is taken for rate-based until contention
//!   ends, and `Fair` competes as it does: no cuts, the estimate held (the largest round of
//!   the window), two rounds at `Params::contend_search_gain` over it after
//!   `Params::contend_cruise_rounds` at it (the second's deliveries show the first's
//!   probe), then a round at `Params::drain_gain`.
//! - [`Policy::Low`] (a scavenger, as LEDBAT): every round the foreign queue stands, the
//!   estimate is cut to `Params::low_beta` of the share, down to the rate floor. It makes
//!   no newcomer's claim either: its search ends at a standing queue even while what it
//!   gets through still grows (a default flow searches on into another's queue, or it would
//!   stay at a sliver), so it never pushes a loss-based flow into a cut.
//!
//! Contention ends once the queue was (nearly) gone `Params::contend_rounds` rounds in a
//! row, counted only once the curve is back at the window before the last cut (both flows
//! cut at an overflow, and the queue can be gone until they grow back): the other flow left,
//! or was not elastic, and the delay signal is ours again.

use super::params::{Params, Rule};

/// How a flow shares a bottleneck with traffic that keeps a queue standing (see the module
/// doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Policy {
    /// Hold a fair share: compete with loss-based and rate-based flows as they do (the
    /// default); beside other hayate flows, the controller's own rules.
    #[default]
    Fair,
    /// Stay out of the way: yield to any standing queue, down to the rate floor (for
    /// background jobs).
    Low,
}

impl Policy {
    /// Its name on the command line and in traces.
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

/// The contention detector's state, and `Policy::Fair`'s window curve while contended.
#[derive(Debug, Clone, Default)]
pub(super) struct Contention {
    /// Rounds in a row whose least path queue stood over the queue target ...
    held_rounds: u32,
    /// ... through this many yields of ours (Down phases; another delay-based flow yields
    /// too, and within two of ours the queue is gone) ...
    yields: u32,
    /// ... whether the last round was one of them.
    was_yield: bool,
    /// Rounds in a row in which the queue was never (nearly) gone, and our yields through
    /// them: the slower test, for a queue that our yields push just under the target
    /// without ever emptying (see `Params::contend_standing_rounds`).
    standing_rounds: u32,
    standing_yields: u32,
    standing_since_us: u64,
    /// A queue not ours stands: the policy is in force ...
    pub(super) contended: bool,
    /// ... until the queue was gone this many rounds in a row, with the curve back at the
    /// window before the last cut (the other flow no longer takes its part).
    gone_rounds: u32,
    /// The largest RTT that stood over the last `Params::contend_full_rounds` rounds while
    /// contended (the minimum plus the path's queue), µs: the buffer is full there. An RTT,
    /// not a queue: where a queue never goes, the minimum RTT drifts up as its window
    /// forgets the emptier past.
    full_rtt_us: u64,
    /// Those rounds' largest RTTs, oldest first.
    recent_full_us: std::collections::VecDeque<u64>,
    /// The minimum RTT at the last round's end: a round in which it moved measured its
    /// queues against two minimums, and says nothing of the buffer.
    last_min_rtt_us: u64,
    /// Since the last cut the RTT fell from full (the cut's own effect, or the other
    /// flow's), then the buffer was full again (within a target) ...
    low_since_cut: bool,
    reached_full: bool,
    /// ... and this round the RTT fell from there by `Params::contend_drop` of it: the
    /// other flow lost what overflowed and cut.
    fell: bool,
    /// Rounds since the RTT last fell from full: a fall that comes sooner than `Params::contend_fall_spacing` rounds after the
    /// one before is not a loss-based flow's cut (its window takes seconds to grow back and
    /// overflow again) but a rate-based flow's periodic drain (BBR's every 8 rounds).
    since_fall: u32,
    /// Falls in a row that came that soon.
    quick_falls: u32,
    /// Rounds since the last cut.
    since_cut: u32,
    /// The other flow is rate-based (see [`rate_based`](Self::rate_based)).
    rate_based: bool,
    /// No cut since contention began: the flow searches (its pace `contend_search_gain`
    /// times what it gets through, per round) until the buffer overflows, as a TCP
    /// newcomer's slow start does: what our yields gave away while the detector made sure
    /// is taken back in a few round trips, not along the curve's seconds.
    pub(super) searching: bool,
    /// CUBIC's curve (RFC 9438 §4.2) in rate terms: when the epoch began (µs), the window
    /// before the last cut (bytes, its rate times the RTT then), and the time to get back
    /// to it (s).
    epoch_us: u64,
    w_max: f64,
    k_s: f64,
}

impl Contention {
    /// At a round's end: its least path queue and the largest that stood (`None` without
    /// RTT samples), how far the minimum RTT is over a remembered path's floor (the tests
    /// of whether the queue is another flow's add it), the minimum RTT, the queue target,
    /// whether the round was one of our yields, whether our sender's host held it lately.
    /// Returns whether contention began with this round.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn end_round(
        &mut self,
        p: &Params,
        now_us: u64,
        queues_us: Option<(u64, u64)>,
        floor_offset_us: u64,
        min_rtt_us: u64,
        target_us: u64,
        yielded: bool,
        stalled: bool,
    ) -> bool {
        self.since_cut = self.since_cut.saturating_add(1);
        self.since_fall = self.since_fall.saturating_add(1);
        self.fell = false;
        let Some((least, most)) = queues_us else {
            return false;
        };
        let was = self.contended;
        let was_yield = std::mem::replace(&mut self.was_yield, yielded);
        let yield_began = yielded && !was_yield;
        let over_floor = least + floor_offset_us;
        if over_floor as f64 <= p.drain_floor * target_us as f64 {
            self.held_rounds = 0;
            self.yields = 0;
            self.standing_rounds = 0;
            self.standing_yields = 0;
            // Not while the curve is still under the window before the last cut: both flows
            // cut, and the queue can be gone until they grow back.
            if now_us >= self.epoch_us + (self.k_s * 1e6) as u64 {
                self.gone_rounds += 1;
            }
            self.contended &= self.gone_rounds < p.contend_rounds;
        } else {
            self.gone_rounds = 0;
            if self.standing_rounds == 0 {
                self.standing_since_us = now_us;
            }
            self.standing_rounds += 1;
            self.standing_yields += u32::from(yield_began);
            if over_floor > target_us {
                self.held_rounds += 1;
                self.yields += u32::from(yield_began);
            } else {
                self.held_rounds = 0;
                self.yields = 0;
            }
            self.contended |= (self.held_rounds >= p.contend_rounds
                && self.yields >= p.contend_yields)
                || (self.standing_rounds >= p.contend_standing_rounds
                    && now_us >= self.standing_since_us + p.contend_standing_us
                    && self.standing_yields >= p.contend_yields);
        }
        if !self.contended {
            return false;
        }
        if !was {
            self.since_fall = u32::MAX;
            self.quick_falls = 0;
            self.rate_based = false;
            self.full_rtt_us = 0;
            self.recent_full_us.clear();
            self.low_since_cut = true;
            self.reached_full = false;
        }
        let steady = std::mem::replace(&mut self.last_min_rtt_us, min_rtt_us) == min_rtt_us;
        if steady {
            if self.recent_full_us.len() >= p.contend_full_rounds {
                self.recent_full_us.pop_front();
            }
            self.recent_full_us.push_back(min_rtt_us + most);
            self.full_rtt_us = self.recent_full_us.iter().copied().max().unwrap_or(0);
            // Full within half a band, fallen by a band: a band is a share of the RTT, and
            // at least a queue target (under it is the queue's jitter).
            let band = ((p.contend_drop * self.full_rtt_us as f64) as u64).max(target_us);
            let low = min_rtt_us + least + band <= self.full_rtt_us;
            // Not just after our host held our sender: the queue fell by what we did not
            // send (see `Params::contend_stall_rounds`).
            let fall = self.reached_full && low && !stalled;
            if fall {
                // Soon after the last fall: maybe a rate-based flow's drain (see
                // `rate_based`); the buffer must be full again before the next fall counts.
                let quick = self.since_fall < p.contend_fall_spacing;
                self.since_fall = 0;
                self.quick_falls = if quick { self.quick_falls + 1 } else { 0 };
                // Until contention ends: a drain missed (the queue not quite full when it
                // came, the minimum RTT moving) spaces the next fall out like a cut.
                self.rate_based |= self.quick_falls >= p.contend_quick_falls
                    && p.ablation.on(Rule::RateBasedCompete);
                self.reached_full = false;
            }
            self.fell = fall && !self.rate_based;
            // After our own cut the queue falls first (if the cut was big enough to show):
            // that fall is ours, and the buffer must fill again before the next one counts.
            // Not in the rounds right after the cut: the fall takes them (the cut shows a
            // round trip late, then the queue drains), and their largest queue is the
            // full buffer's, from before it.
            self.low_since_cut |= low;
            self.reached_full |= !fall
                && self.low_since_cut
                && self.since_cut >= p.contend_cut_rounds
                && min_rtt_us + most + band / 2 >= self.full_rtt_us;
        }
        !was
    }

    /// `Policy::Fair`: the buffer overflowed, once since the last cut: for us (`lost`, a
    /// round losing more than random loss), or for the other flow, whose cut shows as the
    /// RTT falling from full. A paced flow beside a loss-based one loses little when the
    /// buffer overflows (the other flow's bursts meet the full buffer and take the drops);
    /// cutting only on our own losses left that flow nothing.
    pub(super) fn overflowed(&self, p: &Params, lost: bool) -> bool {
        self.fell || (lost && self.since_cut >= p.contend_cut_rounds)
    }

    /// The other flow is rate-based (BBR): it paces at what it gets delivered, and drains
    /// a round every few (the RTT falls from full sooner than `Params::contend_fall_spacing`
    /// rounds after the fall before, `Params::contend_quick_falls` times in a row) instead
    /// of cutting. Cutting at its drains would hand it our share, a little more each time:
    /// compete as it does instead (see the module doc). Until contention ends.
    pub(super) fn rate_based(&self) -> bool {
        self.rate_based
    }

    /// A new epoch of the curve at `now_us`: `rate` (bytes/s) over `rtt_us` was the window
    /// when the buffer overflowed (`cut` true: the estimate was cut to `contend_beta` of it;
    /// false: contention just began, and the curve starts at its plateau).
    pub(super) fn start_epoch(
        &mut self,
        p: &Params,
        now_us: u64,
        rate: u64,
        rtt_us: u64,
        cut: bool,
    ) {
        self.epoch_us = now_us;
        self.w_max = rate as f64 * rtt_us as f64 / 1e6;
        self.k_s = 0.0;
        self.searching = !cut;
        if cut {
            self.since_cut = 0;
            self.low_since_cut = false;
            self.reached_full = false;
            self.k_s =
                (self.w_max / p.grow_step * (1.0 - p.contend_beta) / p.contend_cubic_c).cbrt();
        }
    }

    /// The curve's rate at `now_us` over `rtt_us`, bytes/s: CUBIC's window (or its
    /// Reno-friendly estimate, if more) over the RTT, so that beside a CUBIC flow both grow
    /// alike between the overflows both see.
    pub(super) fn curve_rate(&self, p: &Params, now_us: u64, rtt_us: u64) -> u64 {
        let t = now_us.saturating_sub(self.epoch_us) as f64 / 1e6;
        let rtt = (rtt_us.max(p.rtt_floor_us)) as f64 / 1e6;
        let mss = p.grow_step;
        let cubic = p.contend_cubic_c * (t - self.k_s).powi(3) * mss + self.w_max;
        let beta = p.contend_beta;
        let reno = self.w_max * beta + 3.0 * (1.0 - beta) / (1.0 + beta) * t / rtt * mss;
        (cubic.max(reno).max(mss) / rtt) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `rounds` rounds of `round_us` each, starting at `now_us`: the least path queue
    /// of round `i` is `least(i)`, every third round one of our yields. Returns the time the
    /// flow became contended, if it did.
    fn feed(
        c: &mut Contention,
        p: &Params,
        mut now_us: u64,
        round_us: u64,
        rounds: u32,
        least: impl Fn(u32) -> u64,
    ) -> Option<u64> {
        let (min_rtt, target) = (80_000, 4_000);
        for i in 0..rounds {
            now_us += round_us;
            let q = least(i);
            if c.end_round(
                p,
                now_us,
                Some((q, q + 1_000)),
                0,
                min_rtt,
                target,
                i % 3 == 0,
                false,
            ) {
                return Some(now_us);
            }
        }
        None
    }

    /// A flow contended behind a standing queue (80 ms minimum RTT, a 4 ms target), fed
    /// one 120 ms round at a time.
    struct Contest {
        c: Contention,
        p: Params,
        now_us: u64,
    }

    impl Contest {
        fn new() -> Contest {
            let (mut c, p) = (Contention::default(), Params::default());
            let standing = |i: u32| if i % 3 == 1 { 3_000 } else { 5_000 };
            let now_us = feed(&mut c, &p, 0, 90_000, 100, standing).expect("contended");
            Contest { c, p, now_us }
        }

        /// A round whose path queue went from `least` to `most`, µs, our sender held
        /// lately or not: whether it shows the buffer overflowed.
        fn round(&mut self, least: u64, most: u64, stalled: bool) -> bool {
            self.now_us += 120_000;
            let queues = Some((least, most));
            let (p, now) = (&self.p, self.now_us);
            self.c
                .end_round(p, now, queues, 0, 80_000, 4_000, false, stalled);
            self.c.overflowed(p, false)
        }

        /// The buffer fills over three rounds (130 ms full), and no round overflows.
        fn fill(&mut self) {
            for (least, most) in [(27_000, 30_000), (37_000, 40_000), (47_000, 50_000)] {
                assert!(!self.round(least, most, false), "overflowed while filling");
            }
        }
    }

    /// One overflow, one cut. After the cut the RTT falls over a round or two, and the
    /// first round of the fall still holds the full buffer's samples: its largest queue is
    /// near full while its least is low. Read as the buffer full again, that round made the
    /// next one a second fall, and the flow cut twice for one overflow (to 0.49 of its
    /// pace). The rounds right after a cut do not show the buffer full again.
    #[test]
    fn a_fall_spread_over_rounds_is_one_overflow() {
        let mut t = Contest::new();
        // The buffer fills, and stands full a round.
        t.fill();
        assert!(!t.round(48_000, 50_000, false));
        // The other flow cuts: the RTT falls, and both cut (as `state.rs` does).
        assert!(t.round(20_000, 50_000, false), "the fall is an overflow");
        t.c.start_epoch(&t.p, t.now_us, 10_000_000, 130_000, true);
        // Our cut shows a round later, the fall spread over two rounds: the first still
        // holds samples of the full buffer.
        assert!(!t.round(30_000, 49_000, false), "cut twice");
        assert!(!t.round(10_000, 20_000, false), "cut twice");
        // Both grow back into the buffer; once a round stood full, the next fall counts.
        t.fill();
        assert!(t.round(15_000, 50_000, false), "the next overflow");
    }

    /// A fall from full just after our host held our sender is ours: the queue drained by
    /// what we did not send. It is not the other flow's cut, and the buffer full before it
    /// still counts for the next fall, which is.
    #[test]
    fn a_fall_while_our_host_held_us_is_not_the_other_flows_cut() {
        let mut t = Contest::new();
        t.fill();
        assert!(!t.round(48_000, 50_000, false));
        // Our host held us: the queue falls as far as a cut would make it, and refills.
        assert!(!t.round(20_000, 50_000, true), "our stall read as a cut");
        assert!(!t.round(30_000, 49_000, true), "our stall read as a cut");
        assert!(!t.round(47_000, 50_000, false));
        // The other flow's cut, the buffer still full from before.
        assert!(t.round(20_000, 50_000, false), "the cut after the stall");
    }

    /// Beside a rate-based flow the buffer is "full" at the top of its recent cycles, not at
    /// a spike long past: after one early spike (30 ms of queue) its cycles (a probe to 20
    /// ms every 8 rounds, then a drain to 5) still show as quick falls, and it is taken for
    /// rate-based. Measured from the spike, the buffer was never full again and its drains
    /// went unseen.
    #[test]
    fn a_rate_based_flow_is_found_after_an_early_spike() {
        let mut t = Contest::new();
        t.round(20_000, 30_000, false);
        for i in 0..120 {
            match i % 8 {
                6 => t.round(16_000, 20_000, false),
                7 => t.round(5_000, 9_000, false),
                _ => t.round(14_000, 17_000, false),
            };
        }
        assert!(t.c.rate_based(), "its drains went unseen");
    }

    /// Behind a loss-based flow's standing queue our yields push the queue just under the
    /// target, never out: the slower test finds it after `contend_standing_us`, where the
    /// first test (a queue over the target all round) never does.
    #[test]
    fn a_queue_never_gone_through_our_yields_is_another_flows() {
        let p = Params::default();
        // Over the target two rounds in three, just under it after each yield: 3-5 ms
        // standing over an 80 ms minimum, a 4 ms target (on the emulated WAN, hayate behind
        // a CUBIC flow at 300 Mbit/s, 50 ms).
        let standing = |i: u32| if i % 3 == 1 { 3_000 } else { 5_000 };
        let mut c = Contention::default();
        let at = feed(&mut c, &p, 0, 90_000, 100, standing).expect("contended");
        assert!(
            (p.contend_standing_us..p.contend_standing_us + 200_000).contains(&at),
            "contended at {at} µs"
        );
        assert!(c.contended);

        // The same queue, gone once every 8 rounds (our own, or another hayate flow's: on
        // the emulated WAN it goes at least that often): never contended.
        let mut c = Contention::default();
        let gone_at_times = |i: u32| if i % 8 == 7 { 1_000 } else { standing(i) };
        assert_eq!(feed(&mut c, &p, 0, 90_000, 400, gone_at_times), None);
        // Nor on a short path within its first seconds of a millisecond standing (two flows
        // at 10 ms; a 2 ms target's half is within a host's jitter).
        let mut c = Contention::default();
        let short = |i: u32| if i % 200 == 199 { 500 } else { 3_000 };
        assert_eq!(feed(&mut c, &p, 0, 10_000, 2_000, short), None);
    }
}
