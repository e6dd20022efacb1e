//! Adaptive rate: find the bottleneck from what the receiver actually takes in, hold it with
//! a short queue, shrug off random loss, back off when the queue or the receiver says so.
//!
//! The model is BBR's (a windowed max of the delivery rate is the bottleneck bandwidth; pace
//! at gain × that), with hayate's own signals:
//! - the delivery rate is measured by the receiver's clock (ACK `rx_bytes`/`rx_time_us`), so
//!   it is exact even when ACKs are delayed or bunched;
//! - random loss must not shrink the estimate: while the queue is empty, loss cannot be
//!   congestion, so the sample is scaled back up by the recent loss ratio;
//! - queueing delay (RTT over the path's minimum) above a target means we overshoot: pace
//!   below the estimate until it drains;
//! - the receiver's OS dropping datagrams means the receiver (disk, CPU) is the bottleneck:
//!   the estimate is cut to what it took in.

use super::{Feedback, RateControl};

/// Pacing gain while searching for the bottleneck: the rate doubles per round trip, so the
/// round that finds the limit overfills the queue by at most one BDP.
const STARTUP_GAIN: f64 = 2.0;
const DRAIN_GAIN: f64 = 0.75;
/// Gentle probing: +15 % for one round, -15 % the next, then six rounds at the estimate.
/// A 1-BDP buffer absorbs the probe without loss; a 0.1-BDP buffer loses little.
const PROBE_CYCLE: [f64; 8] = [1.15, 0.85, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
/// Rounds over which the maximum delivery rate is remembered.
const BW_WINDOW: usize = 10;
/// Starting guess: 32 Mbit/s, a rate most paths carry for one round trip.
const INITIAL_RATE: u64 = 4_000_000;
const MIN_RATE: u64 = 50_000;
/// Random loss larger than this is not compensated (it is too much to be noise).
const MAX_LOSS_COMPENSATION: f64 = 0.25;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Startup,
    Drain,
    ProbeBw,
}

#[derive(Debug, Clone)]
pub struct Adaptive {
    max_rate: Option<u64>,
    min_rate: u64,
    mode: Mode,
    /// Per-round maxima of delivery-rate samples, newest last.
    bw_rounds: Vec<u64>,
    round_max: u64,
    round_start_us: u64,
    round_sent: u64,
    round_lost: u64,
    round_queue_hits: u32,
    round_samples: u32,
    loss_ewma: f64,
    /// Startup: rounds without 25 % growth.
    plateau_rounds: u32,
    plateau_bw: u64,
    cycle: usize,
    /// Consecutive RTT samples above the queue target (startup exits on 3).
    queued_samples: u32,
    /// Consecutive probing rounds with a standing queue.
    queued_rounds: u32,
    /// Queueing delay (latest RTT − min RTT), µs.
    queue_delay_us: u64,
    min_rtt_us: u64,
    srtt_us: u64,
    rate: u64,
}

impl Adaptive {
    pub fn new(max_rate: Option<u64>, min_rate: u64) -> Self {
        let mut a = Adaptive {
            max_rate,
            min_rate,
            mode: Mode::Startup,
            bw_rounds: Vec::new(),
            round_max: 0,
            round_start_us: 0,
            round_sent: 0,
            round_lost: 0,
            round_queue_hits: 0,
            round_samples: 0,
            loss_ewma: 0.0,
            plateau_rounds: 0,
            plateau_bw: 0,
            cycle: 0,
            queued_samples: 0,
            queued_rounds: 0,
            queue_delay_us: 0,
            min_rtt_us: 0,
            srtt_us: 0,
            rate: INITIAL_RATE,
        };
        a.rate = a.clamp(INITIAL_RATE as f64);
        a
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Current bottleneck estimate, bytes/s.
    pub fn bottleneck(&self) -> u64 {
        self.bw_rounds
            .iter()
            .copied()
            .chain(std::iter::once(self.round_max))
            .max()
            .unwrap_or(0)
    }

    fn clamp(&self, r: f64) -> u64 {
        let mut r = r.max(MIN_RATE as f64) as u64;
        if let Some(m) = self.max_rate {
            r = r.min(m);
        }
        r.max(self.min_rate)
    }

    /// Queueing delay that counts as "the queue is building".
    fn queue_target_us(&self) -> u64 {
        (self.min_rtt_us / 20).clamp(1_000, 25_000)
    }

    fn round_len_us(&self) -> u64 {
        self.srtt_us.max(2_000)
    }

    fn end_round(&mut self, now_us: u64) {
        let sent = self.round_sent.max(1) as f64;
        let loss = (self.round_lost as f64 / sent).min(1.0);
        if self.round_sent > 0 {
            self.loss_ewma = 0.75 * self.loss_ewma + 0.25 * loss;
        }
        if self.round_samples > 0 || self.bw_rounds.is_empty() {
            self.bw_rounds.push(self.round_max);
            if self.bw_rounds.len() > BW_WINDOW {
                self.bw_rounds.remove(0);
            }
        }
        let queue_building =
            self.round_samples > 0 && self.round_queue_hits * 2 > self.round_samples;
        let bw = self.bottleneck();
        match self.mode {
            Mode::Startup => {
                if bw as f64 >= self.plateau_bw as f64 * 1.25 {
                    self.plateau_bw = bw;
                    self.plateau_rounds = 0;
                } else {
                    self.plateau_rounds += 1;
                }
                // A burst of loss is the shallow buffer overflowing (random loss is lower).
                if self.plateau_rounds >= 3 || loss > 0.15 {
                    self.mode = Mode::Drain;
                }
            }
            Mode::Drain => {
                if !queue_building {
                    self.mode = Mode::ProbeBw;
                    self.cycle = 0;
                }
            }
            Mode::ProbeBw => {
                self.cycle = (self.cycle + 1) % PROBE_CYCLE.len();
                let n = self.bw_rounds.len();
                let recent = self.bw_rounds[n.saturating_sub(2)..]
                    .iter()
                    .copied()
                    .max()
                    .unwrap_or(0);
                // A standing queue while delivering well under the estimate: the path got
                // slower (or another flow arrived). A probe's queue delivers at the estimate.
                let slower = (recent as f64) < 0.9 * bw as f64;
                self.queued_rounds = if queue_building && slower {
                    self.queued_rounds + 1
                } else {
                    0
                };
                if self.queued_rounds >= 2 {
                    self.bw_rounds.clear();
                    self.bw_rounds.push(recent);
                    self.queued_rounds = 0;
                }
            }
        }
        self.round_max = 0;
        self.round_sent = 0;
        self.round_lost = 0;
        self.round_queue_hits = 0;
        self.round_samples = 0;
        self.round_start_us = now_us;
    }

    fn update_rate(&mut self) {
        let bw = self.bottleneck();
        if bw == 0 {
            return;
        }
        let queued = self.queue_delay_us > self.queue_target_us();
        let gain = match self.mode {
            Mode::Startup => STARTUP_GAIN,
            Mode::Drain => DRAIN_GAIN,
            // Overshooting: skip the probe and pace under the estimate until it drains.
            Mode::ProbeBw if queued => 0.9,
            Mode::ProbeBw => PROBE_CYCLE[self.cycle],
        };
        self.rate = self.clamp(bw as f64 * gain);
    }
}

impl RateControl for Adaptive {
    fn pacing_rate(&self) -> Option<u64> {
        Some(self.rate)
    }

    fn on_sent(&mut self, _now_us: u64, bytes: u64) {
        self.round_sent += bytes;
    }

    fn on_feedback(&mut self, fb: &Feedback) {
        self.min_rtt_us = fb.min_rtt_us;
        self.srtt_us = fb.srtt_us;
        if let Some(rtt) = fb.rtt_us {
            self.queue_delay_us = rtt.saturating_sub(fb.min_rtt_us);
            self.round_samples += 1;
            if self.queue_delay_us > self.queue_target_us() {
                self.round_queue_hits += 1;
                self.queued_samples += 1;
            } else {
                self.queued_samples = 0;
            }
            // The queue is growing: the pipe is full, stop doubling now, not rounds later.
            if self.mode == Mode::Startup && self.queued_samples >= 3 {
                self.mode = Mode::Drain;
            }
        }
        self.round_lost += fb.lost_bytes;
        if let Some(rx) = fb.rx_rate {
            let queue_empty = self.queue_delay_us <= self.queue_target_us();
            let sample = if queue_empty {
                // Random loss took its share before the receiver saw the data; the path
                // itself carried more.
                let l = self.loss_ewma.min(MAX_LOSS_COMPENSATION);
                (rx as f64 / (1.0 - l)) as u64
            } else {
                rx
            };
            self.round_max = self.round_max.max(sample);
        }
        if fb.rx_drops > 0 {
            // The receiver could not keep up: believe only what it took in.
            let took = fb.rx_rate.unwrap_or(self.rate / 2);
            self.bw_rounds.clear();
            self.round_max = took;
            if self.mode == Mode::Startup {
                self.mode = Mode::Drain;
            }
        }
        if fb.now_us >= self.round_start_us + self.round_len_us() {
            self.end_round(fb.now_us);
        }
        self.update_rate();
    }

    fn in_flight_cap(&self) -> Option<u64> {
        // Twice the bandwidth-delay product (plus room for bursts): enough to keep the pipe
        // full through ACK jitter, bounded so a stalled receiver is not flooded.
        // The base RTT, not the smoothed one: a standing queue must not widen the cap.
        let bw = self.bottleneck().max(self.rate);
        let rtt = self.min_rtt_us.max(1_000);
        Some((2 * bw as u128 * rtt as u128 / 1_000_000) as u64 + 256 * 1024)
    }

    fn name(&self) -> &'static str {
        match self.mode {
            Mode::Startup => "startup",
            Mode::Drain => "drain",
            Mode::ProbeBw => "probe",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fb(now_us: u64, rtt: u64, min: u64, rx: u64) -> Feedback {
        Feedback {
            now_us,
            rtt_us: Some(rtt),
            srtt_us: rtt,
            min_rtt_us: min,
            rx_rate: Some(rx),
            ..Default::default()
        }
    }

    #[test]
    fn startup_grows_then_settles_on_the_bottleneck() {
        let mut a = Adaptive::new(None, 0);
        let cap = 50_000_000u64;
        let mut now = 0;
        for _ in 0..400 {
            now += 5_000;
            let rx = a.pacing_rate().unwrap().min(cap);
            a.on_feedback(&fb(now, 50_000, 50_000, rx));
        }
        assert_eq!(a.mode(), Mode::ProbeBw);
        let r = a.pacing_rate().unwrap() as f64;
        assert!(
            (0.8 * cap as f64..1.2 * cap as f64).contains(&r),
            "rate {r}"
        );
    }

    #[test]
    fn cap_and_floor_hold() {
        let mut a = Adaptive::new(Some(1_000_000), 500_000);
        a.on_feedback(&fb(100_000, 10_000, 10_000, 100_000_000));
        assert_eq!(a.pacing_rate(), Some(1_000_000));
        let mut b = Adaptive::new(None, 2_000_000);
        b.on_feedback(&fb(100_000, 10_000, 10_000, 1_000));
        assert_eq!(b.pacing_rate(), Some(2_000_000));
    }

    #[test]
    fn receiver_drops_cut_the_estimate() {
        let mut a = Adaptive::new(None, 0);
        a.on_feedback(&fb(100_000, 10_000, 10_000, 80_000_000));
        a.on_feedback(&Feedback {
            rx_drops: 100,
            ..fb(200_000, 10_000, 10_000, 10_000_000)
        });
        // At most the +15 % probe above what the receiver took, far below the 80 MB/s seen.
        assert!(
            a.pacing_rate().unwrap() <= 11_500_000,
            "{:?}",
            a.pacing_rate()
        );
    }
}
