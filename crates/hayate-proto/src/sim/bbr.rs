//! A BBR-like congestion controller for the simulator's TCP flows (`sim/tcp.rs`): BBRv1's
//! essentials, a stand-in for a BBR sender on the same bottleneck, not a faithful port.
//!
//! - **Model**: the bottleneck rate is the windowed maximum of the delivery-rate samples
//!   over the last 10 round trips; the propagation delay the minimum RTT over 10 s.
//!   BDP = rate × min RTT.
//! - **Startup**: pacing and window gain 2/ln 2 ≈ 2.89, until the rate estimate has not
//!   grown by 25 % in 3 rounds (the pipe is full). **Drain**: pacing gain 1/2.89 until what
//!   is in flight is down to one BDP.
//! - **ProbeBw**: pacing gain cycles through 1.25, 0.75, 1 × 6, one phase per min RTT (the
//!   1.25 phase lasts until a BDP × 1.25 is in flight or a loss, the 0.75 phase ends early
//!   once in flight is down to a BDP), starting at a random phase other than 0.75; the
//!   window is 2 × BDP.
//! - **ProbeRtt**: when the min RTT is 10 s old, the window falls to 4 segments for
//!   200 ms and a round, then the old window returns. What is sent meanwhile (and acknowledged
//!   up to a round after) is application-limited: its rate samples count only if they raise
//!   the estimate, so the estimate survives the pause.
//!
//! Loss does not change the model or the window (BBRv1 only counts it). Left out: packet
//! conservation in recovery, the long-term (policer) model, app-limited samples (the flows
//! are bulk or short but never idle), ACK aggregation's extra window.

use std::collections::VecDeque;

use super::Rng;

/// 2 / ln 2: the smallest gain that doubles the delivery rate every round.
const HIGH_GAIN: f64 = 2.885;
/// The pacing gains of ProbeBw's eight phases.
const CYCLE: [f64; 8] = [1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
/// Rounds the bandwidth filter spans.
const BW_ROUNDS: u64 = 10;
/// How long a min RTT sample holds, and ProbeRtt's stay, µs.
const MIN_RTT_WINDOW_US: u64 = 10_000_000;
const PROBE_RTT_US: u64 = 200_000;
/// The smallest window, segments.
const MIN_CWND: f64 = 4.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Startup,
    Drain,
    ProbeBw,
    ProbeRtt,
}

/// What one acknowledgment tells the model.
#[derive(Debug, Clone, Copy)]
pub(super) struct AckSample {
    pub now: u64,
    pub rtt_us: u64,
    /// Segments delivered in all, and when the acknowledged segment was sent.
    pub delivered: u64,
    pub delivered_at_send: u64,
    /// The delivery-rate sample's interval, µs.
    pub interval_us: u64,
    /// Segments in flight after this acknowledgment.
    pub inflight: u64,
    /// Segments this acknowledgment showed lost.
    pub lost: u64,
}

#[derive(Debug)]
pub(super) struct Bbr {
    mode: Mode,
    /// (round, its largest delivery-rate sample, segments/µs), oldest first.
    bw: VecDeque<(u64, f64)>,
    round: u64,
    next_round_delivered: u64,
    full_bw: f64,
    full_bw_rounds: u32,
    filled: bool,
    min_rtt_us: u64,
    min_rtt_stamp: u64,
    probe_rtt_done: Option<u64>,
    probe_rtt_round_done: bool,
    prior_cwnd: f64,
    /// Segments sent before this many were delivered give application-limited samples.
    app_limited_until: u64,
    cycle: usize,
    cycle_stamp: u64,
    cwnd: f64,
    rng: Rng,
}

impl Bbr {
    pub fn new(initial_cwnd: f64, rng: Rng) -> Self {
        Bbr {
            mode: Mode::Startup,
            bw: VecDeque::new(),
            round: 0,
            next_round_delivered: 0,
            full_bw: 0.0,
            full_bw_rounds: 0,
            filled: false,
            min_rtt_us: u64::MAX,
            min_rtt_stamp: 0,
            probe_rtt_done: None,
            probe_rtt_round_done: false,
            prior_cwnd: 0.0,
            app_limited_until: 0,
            cycle: 0,
            cycle_stamp: 0,
            cwnd: initial_cwnd,
            rng,
        }
    }

    /// The window, segments.
    pub fn cwnd(&self) -> f64 {
        self.cwnd
    }

    /// The pacing rate, segments/µs (`None` before the first sample: unpaced).
    pub fn pacing_rate(&self) -> Option<f64> {
        let bw = self.max_bw();
        (bw > 0.0).then(|| self.pacing_gain() * bw)
    }

    fn max_bw(&self) -> f64 {
        self.bw.iter().map(|&(_, b)| b).fold(0.0, f64::max)
    }

    /// Segments in one bandwidth-delay product (`None` before a sample).
    fn bdp(&self) -> Option<f64> {
        let bw = self.max_bw();
        (bw > 0.0 && self.min_rtt_us != u64::MAX).then_some(bw * self.min_rtt_us as f64)
    }

    fn pacing_gain(&self) -> f64 {
        match self.mode {
            Mode::Startup => HIGH_GAIN,
            Mode::Drain => 1.0 / HIGH_GAIN,
            Mode::ProbeBw => CYCLE[self.cycle],
            Mode::ProbeRtt => 1.0,
        }
    }

    fn cwnd_gain(&self) -> f64 {
        match self.mode {
            Mode::Startup | Mode::Drain => HIGH_GAIN,
            _ => 2.0,
        }
    }

    pub fn on_ack(&mut self, s: AckSample) {
        // Rounds: one ends when a segment sent after its start is acknowledged.
        let round_start = s.delivered_at_send >= self.next_round_delivered;
        if round_start {
            self.next_round_delivered = s.delivered;
            self.round += 1;
        }
        // The bandwidth filter.
        let sample = (s.delivered - s.delivered_at_send) as f64 / s.interval_us.max(1) as f64;
        if s.delivered_at_send >= self.app_limited_until || sample >= self.max_bw() {
            match self.bw.back_mut() {
                Some((r, b)) if *r == self.round => *b = b.max(sample),
                _ => self.bw.push_back((self.round, sample)),
            }
            // Older than the window: gone (when a sample comes, so that a pause leaves the
            // estimate alone until the first sample after it).
            while self
                .bw
                .front()
                .is_some_and(|&(r, _)| r + BW_ROUNDS <= self.round)
            {
                self.bw.pop_front();
            }
        }
        // Startup: is the pipe full?
        if round_start && !self.filled {
            let bw = self.max_bw();
            if bw >= self.full_bw * 1.25 {
                self.full_bw = bw;
                self.full_bw_rounds = 0;
            } else {
                self.full_bw_rounds += 1;
                self.filled = self.full_bw_rounds >= 3;
            }
        }
        let bdp = self.bdp().unwrap_or(f64::INFINITY);
        if self.mode == Mode::Startup && self.filled {
            self.mode = Mode::Drain;
        }
        if self.mode == Mode::Drain && s.inflight as f64 <= bdp {
            self.enter_probe_bw(s.now, true);
        }
        if self.mode == Mode::ProbeBw {
            let gain = CYCLE[self.cycle];
            let full = s.now - self.cycle_stamp > self.min_rtt_us;
            let next = if gain > 1.0 {
                full && (s.lost > 0 || s.inflight as f64 >= gain * bdp)
            } else if gain < 1.0 {
                full || s.inflight as f64 <= bdp
            } else {
                full
            };
            if next {
                self.cycle = (self.cycle + 1) % CYCLE.len();
                self.cycle_stamp = s.now;
            }
        }
        // The min RTT filter, and ProbeRtt.
        let expired = s.now > self.min_rtt_stamp + MIN_RTT_WINDOW_US;
        if s.rtt_us <= self.min_rtt_us || expired {
            self.min_rtt_us = s.rtt_us;
            self.min_rtt_stamp = s.now;
        }
        if expired && self.mode != Mode::ProbeRtt {
            self.mode = Mode::ProbeRtt;
            self.prior_cwnd = self.cwnd;
            self.probe_rtt_done = None;
        }
        if self.mode == Mode::ProbeRtt {
            self.app_limited_until = s.delivered + s.inflight;
            match self.probe_rtt_done {
                None if s.inflight as f64 <= MIN_CWND => {
                    self.probe_rtt_done = Some(s.now + PROBE_RTT_US);
                    self.probe_rtt_round_done = false;
                    self.next_round_delivered = s.delivered;
                }
                None => {}
                Some(done) => {
                    self.probe_rtt_round_done |= round_start;
                    if self.probe_rtt_round_done && s.now >= done {
                        self.min_rtt_stamp = s.now;
                        self.cwnd = self.cwnd.max(self.prior_cwnd);
                        if self.filled {
                            self.enter_probe_bw(s.now, false);
                        } else {
                            self.mode = Mode::Startup;
                        }
                    }
                }
            }
        }
        // The window: 2 BDP (2.89 in Startup and Drain), grown by what is acknowledged.
        let target = self.cwnd_gain() * bdp;
        if self.filled {
            self.cwnd = (self.cwnd + 1.0).min(target);
        } else if self.cwnd < target {
            self.cwnd += 1.0;
        }
        self.cwnd = self.cwnd.max(MIN_CWND);
        if self.mode == Mode::ProbeRtt {
            self.cwnd = self.cwnd.min(MIN_CWND);
        }
    }

    /// Into ProbeBw at a random phase other than 0.75 (after Drain), or at 1 × (after
    /// ProbeRtt, so it probes soon).
    fn enter_probe_bw(&mut self, now: u64, random: bool) {
        self.mode = Mode::ProbeBw;
        self.cycle = if random {
            // One of 0, 2, 3, ..., 7.
            match self.rng.next_u64() % 7 {
                0 => 0,
                n => n as usize + 1,
            }
        } else {
            2
        };
        self.cycle_stamp = now;
    }
}
