//! The adaptive rate controller: BBR's model with a queue-delay signal and a loss classifier.
//!
//! **The model.** The path is a bottleneck of rate `bw` behind a FIFO buffer, with a base
//! round trip `min_rtt` and a delay that may vary by itself from one datagram to the next
//! (a radio, a scheduler). The controller estimates `bw` from what the receiver says it
//! took in (the `estimator`), watches the queue it keeps in front of the bottleneck as RTT
//! over `min_rtt` (less what the ACKs waited behind on the way back, which the data's
//! one-way delay tells apart) plus the receiver's backlog, against a target that allows for
//! the delay the path varies by itself (the `queue` signal), and tells random loss, which
//! it compensates and otherwise ignores, from a buffer overflowing, which it treats like a
//! queue (the `loss` classifier). The `state` machine paces at the estimate times a gain,
//! searches upward by doubling (Startup) and then by an additive increment (ProbeBw's Up),
//! and yields (Drain, ProbeBw's Down) when a queue stands. All tunables are in [`Params`].
//!
//! ```text
//!                   deliveries stop growing, a round loses a lot,
//!   +---------+     a queue stands and is not someone else's,      +-------+
//!   | Startup | ------ or the receiver drops ------------------->  | Drain |
//!   +---------+                                                    +-------+
//!   pace 2 x bw, in flight <= 1.5 BDP                          pace 0.75 x bw
//!                                                                  |
//!        queue gone (an RTT sample of what was sent since), no     |
//!        queue most of a round, or 3 rounds                        |
//!   +-------------------------- ProbeBw ---------------------------|------+
//!   |                                                              v      |
//!   |   +---------+  queue gone, or no queue / 3 rounds      +--------+   |
//!   |   | Down(n) | ---------------------------------------> | Refill |   |
//!   |   +---------+                                          +--------+   |
//!   |   pace share x gain   ^    ^ pace bw(1 - random), round end |  ^    |
//!   |                       |    |   sent 1.1 x what arrived,     v  |    |
//!   |   queue over 1.5      |    |   no queue (round end, k>=2) +-------+ |
//!   |   targets stood, or   |    |  <-------------------------- | Up(k) | |
//!   |   overflow loss ------+----+----------------------------- +-------+ |
//!   |   (Refill too, at round end)                  pace bw + increment(k) |
//!   +---------------------------------------------------------------------+
//! ```
//!
//! | state | condition | next state | what changes |
//! |---|---|---|---|
//! | Startup | RTT samples show our own queue beginning (not another flow's, not a host stall's late ACKs) | Startup | the in-flight cap holds at what was in flight (`hold_at_queue`), until the queue goes |
//! | Startup | `startup_exit_samples` RTT samples over the queue target, standing `grow_queue_persist`, and deliveries no longer growing | Drain | estimate = deliveries of the latest quarter round, or of the last round trip under a queue if more (`leave_startup`) |
//! | Startup | round end: `startup_full_rounds` rounds without `startup_full_growth`, or the round lost over `startup_exit_loss` | Drain | as above |
//! | Startup | the receiver's OS dropped datagrams | Drain | estimate = what the receiver took in |
//! | Drain | an RTT sample of what was sent since the drain began shows the queue gone (`drain_floor` of the target) | ProbeBw(Refill) | a new round starts |
//! | Drain | round end: most RTT samples under the target, or `max_drain_rounds` rounds | ProbeBw(Refill) | |
//! | ProbeBw(Refill) | round end: a queue stood all round, or the round lost more than random loss | ProbeBw(Down(1)) | estimate = the share found × gain (`queue_found`); an overflow learns the buffer's depth |
//! | ProbeBw(Refill) | round end, otherwise | ProbeBw(Up(1)) | the increment starts doubling |
//! | ProbeBw(Up(k)) | an RTT sample: the path's queue over `grow_queue` targets on `grow_queue_samples` samples, standing `grow_queue_persist` | ProbeBw(Down(0)) | estimate = share × gain, sized by the least queue meanwhile |
//! | ProbeBw(Up(k)) | round end: as for Refill | ProbeBw(Down(1)) | as for Refill |
//! | ProbeBw(Up(k)) | round end: k ≥ `grow_undelivered_rounds`, sent over `grow_undelivered` × what arrived, no queue (a policer) | ProbeBw(Refill) | the increment starts over |
//! | ProbeBw(Up(k)) | round end, otherwise | ProbeBw(Up(k+1)) | |
//! | ProbeBw(Down(n)) | an RTT sample shows the queue gone | ProbeBw(Refill) | a new round starts; the rounds of the drain are no one's share |
//! | ProbeBw(Down(n)) | round end: n = 0, or a queue still stands and n < `max_drain_rounds` | ProbeBw(Down(n+1)) | |
//! | ProbeBw(Down(n)) | round end, otherwise | ProbeBw(Refill) | |
//! | ProbeBw(any) | the receiver's OS dropped datagrams | ProbeBw(Refill) | estimate = what the receiver took in |
//!
//! **Sharing with traffic that does not yield** (`policy.rs`). Past Startup, a queue that
//! stood all round for `contend_rounds` rounds through `contend_yields` of our yields, or
//! was never gone for `contend_standing_rounds` rounds and `contend_standing_us` through as
//! many, is another flow's, one that keeps the buffer full (TCP CUBIC, or BBR): the flow is
//! *contended* until the queue has been gone as many rounds. A flow whose falls from full
//! come every few rounds (drains, not cuts) is rate-based (BBR, see `policy.rs`).
//! Contended, the [`Policy`] changes the table:
//!
//! | policy | state | condition | next state | what changes |
//! |---|---|---|---|---|
//! | Fair | ProbeBw(Up(k)) | no cut yet since contention began | | pace = `contend_search_gain` × the estimate; a queue does not end Up |
//! | Fair | ProbeBw(Up(k)) | after a cut | | pace = CUBIC's curve (RFC 9438): its window over the RTT; a queue does not end Up |
//! | Fair | ProbeBw(Refill, Up) | round end: the buffer overflowed (the RTT fell by `contend_drop` from full, not within `contend_stall_rounds` of a stall of our host, or the round lost over random loss), once per overflow | ProbeBw(Down(1)) | estimate = share × `contend_beta`, no drain; a new curve from the share |
//! | Fair | ProbeBw(Down(n)) | round end | ProbeBw(Refill) | (no draining a queue that is not ours) |
//! | Fair, the other flow rate-based | ProbeBw(Up(k)) | k < `contend_cruise_rounds` | | pace = the estimate; neither a queue nor loss ends Up, nothing cuts |
//! | Fair, the other flow rate-based | ProbeBw(Up(k)) | k = `contend_cruise_rounds`, + 1 | | pace = `contend_search_gain` × the estimate |
//! | Fair, the other flow rate-based | ProbeBw(Up(k)) | round end, k > `contend_cruise_rounds` + 1 | ProbeBw(Down(1)) | pace = `drain_gain` × the estimate for a round |
//! | Low | ProbeBw(any) | round end: a queue stood all round | ProbeBw(Down(1)) | estimate = share × `low_beta` (down to the rate floor) |
//! | Low | Startup | as Startup's queue exit, whether or not deliveries still grow | Drain | (a queue there as it starts is someone else's: no newcomer's claim) |
//!
//! **Careful resume** (RFC 9959). A session given a remembered path ([`RememberedPath`]:
//! the rate and minimum RTT an earlier session to the same peer found, and its age) waits in
//! Startup for the path's first RTT sample (Reconnaissance): the handshake's round trip
//! (`RateControl::on_handshake_rtt`, before any data), or else the first data's. Then,
//! inside Startup:
//!
//! ```text
//!   Reconnaissance --first RTT sample (the handshake's), within [resume_rtt_low, resume_rtt_high] x the
//!        |           remembered one, memory under resume_max_age_us--> Unvalidated
//!        +--otherwise, or the jump no faster than Startup already is--> Ignored
//!   Unvalidated: pace resume_jump_gain x the remembered rate (less if the RTT is longer
//!        |       now), in flight that rate over the RTT  --its first packet acked-->
//!   Validating:  Startup's rules, no slower than the jump --its last packet acked--> Validated
//!   Unvalidated or Validating: a queue over resume_retreat_queue targets standing
//!        grow_queue_persist, a loss ratio over resume_retreat_loss, or the receiver
//!        dropping --> Retreated: estimate = what the jump got delivered, Drain
//! ```
//!
//! | state | condition | next state | what changes |
//! |---|---|---|---|
//! | Startup (Reconnaissance) | the first RTT sample (the handshake's, or else the first data's) is comparable with the remembered one, the memory is fresh, the jump is faster than Startup's pace | Startup (Unvalidated) | pace and in-flight cap at least the jump's |
//! | Startup (Reconnaissance) | otherwise | Startup | the memory is ignored (but for the contention detector's floor, below) |
//! | Startup (Unvalidated) | a feedback acknowledges a packet sent since the jump began | Startup (Validating) | Startup's rules pace, no slower than the jump |
//! | Startup (Validating) | a feedback acknowledges a packet sent since validation began | Startup | the jump is validated |
//! | Startup (Unvalidated, Validating) | the path's queue over `resume_retreat_queue` targets on `grow_queue_samples` samples, standing `grow_queue_persist`; the jump's packets lost over `resume_retreat_loss`; the receiver's OS dropped datagrams | Drain | estimate = the jump's delivery rate (safe retreat) |
//!
//! A remembered path whose first RTT sample is comparable (age and RTT as above, whether or
//! not the jump is made) also lends its minimum RTT as the floor the contention detector
//! measures the queue from, for `resume_base_us` (the RTT estimator's window), or until the
//! flow gets `resume_alone_share` of the remembered rate delivered (then it has the path to
//! itself, and the floor was a route that got longer since): a flow that joins behind
//! another's standing queue never sees the path's floor by itself (see `policy.rs`).
//!
//! What a session measured is worth remembering ([`RateControl::measured`]) after
//! `remember_min_rounds` rounds in ProbeBw, unless the sender had nothing to send for over
//! `remember_app_limited` of what it delivered meanwhile, or the estimate is at the rate
//! cap. Trace name of Unvalidated and Validating: `resume`.
//!
//! A round lasts the smoothed RTT; it ends with the first feedback after that. There is no
//! ProbeRtt: the minimum RTT comes from the connection's `RttEstimator` (its own window), and
//! the controller keeps the queue short instead of emptying it periodically. Trace names (the
//! `state` column of `HAYATE_CC_TRACE`, parsed by `bench/wan` and the tests, so kept):
//! `startup`, `resume` (careful resume's jump), `drain`, `probe` (Refill and Up), `compete`
//! (Refill and Up while competing under `Policy::Fair`, see below), `yield` (Down).
//!
//! Each rule group of the table can be switched off on its own (`Params::ablation`, a
//! [`Rule`] set, empty by default) to measure what it pays for across the simulator's link
//! models: `bench/sim-matrix --ablate`, whose table is in `bench/README.md`.
//!
//! **The estimate.** The delivery rate is measured by the receiver's clock, so it is exact
//! even when ACKs are delayed or bunched. A round's rate is bytes over time (samples weighted
//! by the time they cover, so a stall and the burst that catches it up cancel out), at most a
//! quarter over the pace (more is timestamps bunching), and the largest of the last
//! `bw_window` rounds is the estimate. Samples the sender's host held back (a busy VM stops it
//! for tens of ms), or sent after a gap with no room in flight, are the sender's, not the
//! path's, and are left out. Samples of sending that had nothing at all to send (an
//! application slower than the path: an ssh session through `hayate tunnel`) are a floor
//! under the path's rate: taken in only when they show more than the pace in force presumes,
//! never to lower it (BBR's application-limited samples). Startup's rate follows the latest
//! quarter round's deliveries, so it rises smoothly rather than once a round.
//!
//! **Sharing.** Flows on one bottleneck get the same increments whatever their rates: the
//! smaller flow gains relatively more each cycle and Down takes back in proportion, so shares
//! converge (additive increase, multiplicative decrease, with the queue as the signal instead
//! of loss). Down's estimate is what this flow was delivered over the two rounds the queue
//! built in (its share of a FIFO bottleneck) times `share_gain`; while shares keep moving,
//! `converge_gain`; a queue far over the target (a newcomer's search, a slower path),
//! `big_queue_gain`. Past Startup, samples count at most what the flow sends, so the burst a
//! draining queue delivers does not undo a yield. A newcomer's Startup does not stop at the
//! queue the flows already there keep: while its deliveries still grow by a quarter per round
//! trip the path is taking more, and it keeps doubling.
//!
//! **Loss.** Random loss is taken out of the delivery rate (scaled back up by the recent
//! loss ratio, at most the random loss) and never shrinks the estimate by itself. The
//! random loss is learnt from calm rounds (those that sent at most the estimate). Refill
//! paces at the estimate less the random loss, at what gets through: random loss stays the
//! same there, while loss that a pace over the bottleneck causes stops. Without that round,
//! a policer's drops (no queue shows them) read as random loss, and the compensation kept
//! the pace at 1/(1 − l) of the policed rate, losing l, whatever l was (the simulator: 30 %
//! at 10 ms). Loss over random loss after a round that grew is a buffer overflowing (a
//! buffer shorter than the queue target overflows before any delay shows), and ends Up as a
//! queue does. Loss over it in a calm round on a buffer known to be short is another flow
//! overflowing that buffer: it stays out of the random loss, and is not answered by itself
//! (a yield to it misread bursty loss and a policer's drops as such, and cost up to 13
//! points of the link in `bench/sim-matrix`; sharing did not need it). What the pacer sent
//! catching up after its host held it is left out of both ratios (the pacer, `pacer.rs`,
//! has its own test of those bursts' losses, `Pacer::on_fates`). The receiver's OS dropping
//! datagrams means the receiver (disk, CPU) is the bottleneck: the estimate is cut to what
//! it took in.

mod estimator;
mod loss;
mod params;
mod policy;
mod queue;
mod resume;
mod state;
#[cfg(test)]
mod tests;

use super::{Feedback, PathMeasurement, RateControl, RememberedPath};
use estimator::Estimator;
use loss::LossClassifier;
pub use params::{Ablation, Params, Rule};
use policy::Contention;
pub use policy::Policy;
use queue::QueueSignal;
use resume::Resume;
pub use resume::ResumePhase;
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
    /// When Startup's drain began, µs (`None` outside it): only what was sent since can
    /// show its queue gone (see `exit_drain_when_queue_gone`).
    drain_from_us: Option<u64>,
    /// Startup: RTT samples in a row showing our queue begin (see `Params::startup_hold_queue_us`),
    /// and what was in flight when it showed (the cap while it does).
    hold_samples: u32,
    hold_in_flight: Option<u64>,
    startup_rounds: u32,
    est: Estimator,
    queue: QueueSignal,
    loss: LossClassifier,
    /// Careful resume from a remembered path, and what is worth remembering of this one.
    resume: Resume,
    /// Whether a queue not ours stands (see `policy.rs`).
    contention: Contention,
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
            drain_from_us: None,
            startup_rounds: 0,
            est: Estimator::new(),
            queue: QueueSignal::new(),
            loss: LossClassifier::new(),
            resume: Resume::new(),
            contention: Contention::default(),
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
        self.est.rounds_since_stall = self.est.rounds_since_stall.saturating_add(1);
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
        if self.in_probe_bw()
            && in_flight > self.congestion_cap
            && self.p.ablation.on(Rule::BlindPastCap)
        {
            return Some(self.blind_rate);
        }
        // Startup's drain: with a BDP or less in flight the queue is out (what is still on
        // its way left at the drain's pace), but the RTT samples that say so come a round
        // trip later, and three quarters of the link meanwhile left it a quarter empty for
        // that round trip (the simulator, 250 ms: 100 ms buckets at 75 %, 0.6 points of a
        // transfer's steady rate). Pace at the estimate until they do. Where the bottleneck
        // is far from the sender this comes early and holds some of the queue instead: the
        // grow phase then finds it standing and yields.
        if self.state == State::Drain
            && in_flight <= self.drained_in_flight
            && self.p.ablation.on(Rule::DrainAtEstimate)
        {
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
        }
        // Before Startup's rules: an unvalidated jump retreats on its own terms.
        self.resume_on_feedback(fb);
        if fb.rtt_us.is_some() {
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
        self.tally_for_memory(fb, ends_round);
        if ends_round {
            self.end_round(fb.now_us);
            self.drop_base_when_alone();
            if let Some(part) = carried {
                self.add_to_round(part);
            }
        }
        self.update_rate();
        if self.resume.jumping() && self.state != State::Startup {
            // Startup's own rules ended the search (a round's loss, the receiver's drops)
            // while the jump was unvalidated: that is the path saying no, too.
            self.resume.phase = ResumePhase::Retreated;
        }
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
            //
            // While a queue stands, of the most a quarter round carried in the last round
            // trip, not the latest one: another flow's probe raises the queue within rounds,
            // the flight meets the cap and waits, and the gap that leaves comes back a round
            // trip later as a dip in deliveries; a cap that follows the dip makes the next
            // gap longer (two flows on a 250 ms path: a newcomer left its search at 76
            // Mbit/s where its last rounds carried 107-144). Not of a catch-up's samples:
            // a sender woken late bunches its datagrams, and their quarter round reads over
            // the path (a newcomer took 232 of 300 Mbit/s that way). Not without a queue: a
            // policer's burst reads over its rate too.
            let mut bw = self.bottleneck().max(self.p.initial_rate);
            if self.queue.queued_samples > 0 {
                bw = bw.max(self.recent_peak());
            }
            let rtt =
                self.min_rtt_us.max(self.p.rtt_floor_us) + self.queue.last_round_min_path_queue_us;
            let cap = self.p.startup_in_flight_bdps * bytes_in(bw, rtt) as f64;
            let mut cap = cap as u64 + self.p.cap_burst_bytes;
            if let Some((_, jump_cap)) = self.jump_floor() {
                // Careful resume's jump: its window, until what it delivers says more.
                cap = cap.max(jump_cap);
            }
            let hold_floor = (self.p.startup_hold_min_datagrams as f64 * self.p.grow_step) as u64;
            return Some(
                self.hold_in_flight
                    .map_or(cap, |h| h.max(hold_floor).min(cap)),
            );
        }
        let bw = self.bottleneck().max(self.rate);
        let cap = congestion_cap(&self.p, bw, self.cap_rtt_us());
        // A receiver that stops for a while holds what comes meanwhile in its buffer (what
        // is in flight is on the path or there): as much as that holds, within reason.
        let room = self
            .queue
            .rx_room
            .min(cap + bytes_in(bw, self.p.rx_stall_room_us));
        Some(cap.max(room))
    }

    fn name(&self) -> &'static str {
        if self.resume.jumping() {
            return "resume";
        }
        match self.state {
            State::Startup => "startup",
            State::Drain => "drain",
            State::ProbeBw(Phase::Refill | Phase::Up(_)) if self.competing() => "compete",
            State::ProbeBw(Phase::Refill | Phase::Up(_)) => "probe",
            State::ProbeBw(Phase::Down(_)) => "yield",
        }
    }

    /// While competing under `Policy::Fair` (see `policy.rs`) at a pace set by the delivery
    /// estimate (the newcomer's search, or beside a rate-based flow): a flow beside it takes
    /// whatever this one leaves unsent and never gives it back. Not while following CUBIC's
    /// curve: that pace is a window over the RTT, and a catch-up burst over it raised the
    /// RTT, so the curve's rate fell, and the queue then fell back from the burst's peak,
    /// which read as the other flow's cut (the simulator, a sender held 20 ms every 200 ms
    /// beside CUBIC at 300 Mbit/s, 10 ms: a share of 0.27 made up, 0.44 not).
    fn makes_up_stalls(&self) -> bool {
        self.competing() && (self.contention.rate_based() || self.contention.searching)
    }

    fn remember(&mut self, path: RememberedPath) {
        self.remember_path(path);
    }

    fn on_handshake_rtt(&mut self, now_us: u64, rtt_us: u64) {
        self.resume_on_handshake(now_us, rtt_us);
    }

    fn measured(&self) -> Option<PathMeasurement> {
        self.measurement()
    }
}
