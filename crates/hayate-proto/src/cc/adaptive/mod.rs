//! Adaptive rate: find the bottleneck from what the receiver actually takes in, hold it with
//! a short queue, shrug off random loss, back off when the queue or the receiver says so,
//! and share a bottleneck fairly with other flows.
//!
//! Searching (startup) is BBR's: the pacing rate doubles per round trip until the queue
//! builds (and stays: a host stall's held ACKs come in together, late), then the queue of
//! that overshoot is drained (BBR's way too: until no more than a BDP is in flight; then at
//! the estimate until an RTT sample shows the queue gone). The rate follows the latest
//! quarter round's deliveries, so it rises smoothly rather than once a round. From the first
//! signs of its own queue it sends no more than it has in flight (a short buffer overflows
//! before the queue stands long enough to end the search). The delivery
//! rate is measured by the receiver's clock (ACK `rx_bytes`/`rx_time_us`), so it is exact
//! even when ACKs are delayed or bunched. Each round's rate is bytes over time (samples
//! weighted by the time they cover, so a stall and the burst that catches it up cancel out),
//! and the largest of recent rounds is the estimate.
//!
//! Then the controller cycles between two phases:
//! - **grow**: pace at the estimate plus an increment that starts at one datagram per round trip
//!   and doubles every round, until the queue builds (RTT samples above a small target over
//!   the path's minimum RTT for a quarter of it: a host's stall is shorter), or until
//!   sending more visibly gets nothing more through without any queue (a policer): then it
//!   starts over from the estimate;
//! - **drain**: the estimate becomes (a little under) what this flow was delivered over the
//!   two rounds the queue built in, which under a FIFO queue is its share of the bottleneck,
//!   and pacing under
//!   that by as much as the queue holds empties the queue in about a round trip; growing
//!   starts again as soon as an RTT sample shows the queue (nearly) gone.
//!
//! A lone flow thus holds its bottleneck with a queue of a few milliseconds. Flows sharing one
//! get the same increments, whatever their rates: the smaller flow gains relatively more each
//! cycle and the drain takes back in proportion, so shares converge (additive increase,
//! multiplicative decrease, with the queue as the signal instead of loss). While shares keep
//! moving every flow yields a little more; a queue far above the target (a newcomer's startup,
//! or a path that got slower) makes every flow yield more. Delivery samples past startup count
//! at most what the flow sends, so the burst a draining queue delivers does not undo a yield.
//!
//! A newcomer's startup does not stop at the queue the flows already there keep: while its
//! deliveries still grow by a quarter per round trip the path is still taking more, and it
//! keeps doubling (the others yield to the queue it adds) until that stops.
//!
//! What the sender sent while its host held it (a busy VM stops it for tens of ms) arrives
//! as a trickle a round trip later: those delivery samples are the sender's, not the path's,
//! and are left out (BBR's application-limited samples).
//!
//! Random loss does not count as congestion: it is taken out of the delivery rate (scaled back
//! up by the recent loss ratio, at most the random loss) and never shrinks the estimate by
//! itself. What the pacer sent catching up after its host held it is left out of both
//! ratios: a burst over the rate overflows a short buffer by itself. Loss over the random
//! loss of calm rounds (those that sent at most the estimate) while growing does: a buffer
//! shorter than the queue target overflows before any delay shows, and the grow phase stops
//! there as it stops at a queue. The receiver's OS dropping datagrams means the receiver
//! (disk, CPU) is the bottleneck: the estimate is cut to what it took in.

mod estimator;
mod loss;
mod params;
mod queue;
mod state;
#[cfg(test)]
mod tests;

use super::{Feedback, RateControl};
use estimator::Estimator;
use loss::LossClassifier;
pub use params::Params;
use queue::QueueSignal;
pub use state::Mode;
use state::{Phase, State};

/// Bytes sent at `bw` bytes/s over `us`.
fn bytes_in(bw: u64, us: u64) -> u64 {
    (bw as u128 * us as u128 / 1_000_000) as u64
}

/// Past startup, in flight up to twice the bandwidth-delay product (plus room for bursts)
/// keeps the pipe full through ACK jitter. Of the base RTT, not the smoothed one: a standing
/// queue must not widen it.
fn congestion_cap(p: &Params, bw: u64, min_rtt_us: u64) -> u64 {
    p.congestion_cap_bdps * bytes_in(bw, min_rtt_us.max(p.rtt_floor_us)) + p.cap_burst_bytes
}

/// The adaptive rate controller: finds the path's rate from delivery rates, RTT and losses
/// (BBR-like search, a hold when a queue stands, a fair share beside other flows).
#[derive(Debug, Clone)]
pub struct Adaptive {
    max_rate: Option<u64>,
    min_rate: u64,
    /// Where the state machine is (see the module doc).
    state: State,
    round_start_us: u64,
    /// The latest feedback's time.
    now_us: u64,
    /// How often the grow phase's increment has doubled since it began (one per minimum
    /// RTT), and when that was last brought up to date.
    grow_doublings: f64,
    grow_since_us: u64,
    /// Startup: rounds without 25 % growth.
    plateau_rounds: u32,
    plateau_bw: u64,
    drain_rounds: u32,
    /// Our shares at the last drains, newest last.
    shares: Vec<u64>,
    /// As of the latest feedback: the congestion cap, and the pacing rate past it (see
    /// `pacing_rate_with`; asked per datagram, so not worked out each time).
    congestion_cap: u64,
    blind_rate: u64,
    min_rtt_us: u64,
    srtt_us: u64,
    rate: u64,
    /// Pacing gain while a queue found by growing drains.
    drain_gain: f64,
    /// Startup's drain: in flight at most this, the queue is out; pace at `drained_rate`
    /// then (see `pacing_rate_with`).
    drained_in_flight: u64,
    drained_rate: u64,
    /// Startup: RTT samples in a row showing our queue begin (see `Params::startup_hold_queue_us`),
    /// and what was in flight when it showed (the cap while it does).
    hold_samples: u32,
    hold_in_flight: Option<u64>,
    startup_rounds: u32,
    est: Estimator,
    queue: QueueSignal,
    loss: LossClassifier,
    /// The tunables.
    p: Params,
}

impl Adaptive {
    /// A controller that stays within `[min_rate, max_rate]` bytes/s (`None`: no cap).
    pub fn new(max_rate: Option<u64>, min_rate: u64) -> Self {
        Self::with_params(max_rate, min_rate, Params::default())
    }

    /// The same with other tunables than the defaults.
    pub fn with_params(max_rate: Option<u64>, min_rate: u64, p: Params) -> Self {
        let mut a = Adaptive {
            max_rate,
            min_rate,
            state: State::Startup,
            round_start_us: 0,
            now_us: 0,
            grow_doublings: 0.0,
            grow_since_us: 0,
            plateau_rounds: 0,
            plateau_bw: 0,
            drain_rounds: 0,
            shares: Vec::new(),
            congestion_cap: u64::MAX,
            blind_rate: p.initial_rate,
            min_rtt_us: 0,
            srtt_us: 0,
            rate: p.initial_rate,
            drain_gain: p.max_queue_drain_gain,
            drained_in_flight: 0,
            drained_rate: p.initial_rate,
            hold_samples: 0,
            hold_in_flight: None,
            startup_rounds: 0,
            est: Estimator::new(),
            queue: QueueSignal::new(),
            loss: LossClassifier::new(),
            p,
        };
        a.rate = a.clamp(a.p.initial_rate as f64);
        a
    }

    fn clamp(&self, r: f64) -> u64 {
        let mut r = r.max(self.p.min_rate as f64) as u64;
        if let Some(m) = self.max_rate {
            r = r.min(m);
        }
        r.max(self.min_rate)
    }

    fn round_len_us(&self) -> u64 {
        self.srtt_us.max(self.p.min_round_us)
    }

    /// Clears this round's tallies for the next one, from `now_us`.
    fn start_round(&mut self, now_us: u64) {
        // What was really sent: a sender short of CPU falls behind its pacing rate, and
        // that shortfall is not the path refusing more.
        let dur = now_us.saturating_sub(self.round_start_us).max(1);
        self.est.prev_sent_rate = (self.est.round_sent as u128 * 1_000_000 / dur as u128) as u64;
        self.est.round_pace = self
            .rate
            .max(self.est.bw_rounds.iter().copied().max().unwrap_or(0));
        self.est.round_max = 0;
        self.est.round_rx_sum = 0.0;
        self.est.round_rx_w = 0.0;
        self.est.round_rx_n = 0;
        self.est.round_raw_sum = 0.0;
        self.est.round_sent = 0;
        self.loss.round_lost = 0;
        self.loss.round_delivered = 0;
        self.loss.round_catch_up_lost = 0;
        self.loss.round_catch_up_delivered = 0;
        self.loss.round_rx_drops = 0;
        self.queue.round_queue_hits = 0;
        self.queue.round_samples = 0;
        self.queue.round_min_queue_us = u64::MAX;
        self.queue.round_min_path_queue_us = u64::MAX;
        self.queue.round_max_lag_us = 0;
        self.queue.round_max_path_queue_us = 0;
        self.round_start_us = now_us;
        self.loss.round_calm = true;
    }
}

impl RateControl for Adaptive {
    fn pacing_rate(&self) -> Option<u64> {
        Some(self.rate)
    }

    fn pacing_rate_with(&self, in_flight: u64) -> Option<u64> {
        // Past the congestion cap only what the receiver's buffer can take lets the sender
        // on: its feedback is overdue (it stopped a while), so nothing says whether the
        // path takes more. No probing then: a grow phase's increment kept up blind for 50
        // ms overflowed a 10 ms path's buffer on the harness.
        if self.in_probe_bw() && in_flight > self.congestion_cap {
            return Some(self.blind_rate);
        }
        // Startup's drain: with a BDP or less in flight the queue is out (what is still on
        // its way left at the drain's pace), but the RTT samples that say so come a round
        // trip later, and three quarters of the link meanwhile left it a quarter empty for
        // that round trip (the simulator, 250 ms: 100 ms buckets at 75 %, 0.6 points of a
        // transfer's steady rate). Pace at the estimate until they do. Where the bottleneck
        // is far from the sender this comes early and holds some of the queue instead: the
        // grow phase then finds it standing and yields.
        if self.state == State::Drain && in_flight <= self.drained_in_flight {
            return Some(self.drained_rate);
        }
        Some(self.rate)
    }

    fn on_sent(&mut self, _now_us: u64, bytes: u64) {
        self.est.round_sent += bytes;
    }

    fn on_feedback(&mut self, fb: &Feedback) {
        self.now_us = fb.now_us;
        self.queue.rx_room = (fb.rx_buffer as f64 * self.p.rx_buffer_payload) as u64;
        self.min_rtt_us = fb.min_rtt_us;
        self.srtt_us = fb.srtt_us;
        if let Some(rtt) = fb.rtt_us {
            self.on_rtt_sample(fb, rtt);
            self.on_queue_sample(fb);
        }
        self.exit_drain_when_queue_gone(fb);
        let ends_round = fb.now_us >= self.round_start_us + self.round_len_us();
        self.loss.round_lost += fb.lost_bytes;
        self.loss.round_delivered += fb.delivered;
        self.loss.round_catch_up_lost += fb.catch_up_lost_bytes;
        self.loss.round_catch_up_delivered += fb.catch_up_delivered;
        if let Some(h) = &mut self.hold_in_flight {
            // What the held flight lost is not sent again into the queue that lost it.
            *h = h.saturating_sub(fb.lost_bytes);
        }
        let mut carried = self.on_delivery_sample(fb, ends_round);
        self.hold_no_less_than_carried();
        self.loss.round_rx_drops += fb.rx_drops;
        if fb.rx_drops > 0 {
            self.on_receiver_drops(fb);
            carried = None;
        }
        self.advance_growth(fb.now_us);
        if ends_round {
            self.end_round(fb.now_us);
            if let Some(part) = carried {
                self.add_to_round(part);
            }
        }
        self.update_rate();
    }

    fn in_flight_cap(&self) -> Option<u64> {
        // Bounded so a stalled receiver is not flooded: by the congestion cap, or by what
        // the receiver's buffer is known to hold.
        // None before the first sample: the first flight (data sent with an offer, before
        // any ACK) is bounded by the pacing rate and the connection's eager limit.
        if self.min_rtt_us == 0 {
            return None;
        }
        if self.state == State::Startup {
            // While searching, the round that finds the limit sends at twice what the path
            // carries: a cap on what was delivered bounds the queue that round leaves, so a
            // 1-BDP buffer does not overflow before the signal gets back. Of the base RTT
            // (see `congestion_cap`), plus a queue that stood all last round: that one is
            // other flows' (ours builds within the round that finds the limit, and startup
            // ends on it), and our data waits in it too. A newcomer behind flows keeping 30-40
            // ms of queue on a 100 ms path, capped by the base RTT alone, could not double:
            // its deliveries stopped growing and its search ended at 30-50 of 300 Mbit/s.
            let bw = self.bottleneck().max(self.p.initial_rate);
            let rtt =
                self.min_rtt_us.max(self.p.rtt_floor_us) + self.queue.last_round_min_path_queue_us;
            let cap = self.p.startup_in_flight_bdps * bytes_in(bw, rtt) as f64;
            let cap = cap as u64 + self.p.cap_burst_bytes;
            return Some(self.hold_in_flight.map_or(cap, |h| h.min(cap)));
        }
        let bw = self.bottleneck().max(self.rate);
        let cap = congestion_cap(&self.p, bw, self.min_rtt_us);
        // A receiver that stops for a while holds what comes meanwhile in its buffer (what
        // is in flight is on the path or there): as much as that holds, within reason.
        let room = self
            .queue
            .rx_room
            .min(cap + bytes_in(bw, self.p.rx_stall_room_us));
        Some(cap.max(room))
    }

    fn name(&self) -> &'static str {
        match self.state {
            State::Startup => "startup",
            State::Drain => "drain",
            State::ProbeBw(Phase::Refill | Phase::Up(_)) => "probe",
            State::ProbeBw(Phase::Down(_)) => "yield",
        }
    }
}
