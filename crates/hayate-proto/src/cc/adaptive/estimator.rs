//! The estimator: the path's delivery rate (bottleneck bandwidth) from the receiver's
//! samples, per round and over a window of rounds, and what the sender really sent.

use std::collections::VecDeque;

use super::params::Params;
use super::{Adaptive, Feedback, State};

/// The delivery-rate estimator's state: this round's delivery samples, the window of per-round rates, what was sent.
#[derive(Debug, Clone)]
pub(super) struct Estimator {
    /// Per-round delivery rates (see `round_sample`), newest last.
    pub(super) bw_rounds: Vec<u64>,
    /// This round: the largest delivery-rate sample, the count of all of them, and their
    /// sum weighted by the time each covers (a mean of bytes over time, not of ratios: the
    /// receiver's clock ticks in bursts on a loaded host, and short intervals read high or
    /// low at random).
    pub(super) round_max: u64,
    pub(super) round_rx_sum: f64,
    pub(super) round_rx_w: f64,
    pub(super) round_rx_n: u32,
    /// The same sum of this round's samples as measured (none scaled up for random loss).
    pub(super) round_raw_sum: f64,
    /// When a delivery sample last covered a stall of the sender's host, µs.
    pub(super) stall_seen_us: Option<u64>,
    /// Rounds since a round had such a sample (`u32::MAX`: none yet).
    pub(super) rounds_since_stall: u32,
    /// The last round's `round_raw_sum`, `round_rx_w` and `round_rx_n`.
    pub(super) last_round_sum: f64,
    pub(super) last_round_w: f64,
    pub(super) last_round_n: u32,
    /// What the last round really sent, bytes/s (this round's deliveries answer it).
    pub(super) prev_sent_rate: u64,
    /// The pace as this round began, or the estimate if that was more (a yield's pace):
    /// what this round's deliveries, sent a round trip earlier, went out at, at most.
    pub(super) round_pace: u64,
    pub(super) round_sent: u64,
    /// Startup: the delivery rate over the latest quarter round.
    pub(super) recent: RecentRate,
    /// Startup: the delivery samples of the last round trip while a queue stood (see
    /// `queued_samples`).
    pub(super) queued_rx: RecentRate,
    /// Startup: the quarter round's rate of paced samples only (none mostly a catch-up's),
    /// and the most it read over the last round trip (see `recent_peak`).
    pub(super) paced_recent: RecentRate,
    pub(super) recent_peak: WindowedMax,
}

impl Estimator {
    pub(super) fn new() -> Self {
        Estimator {
            bw_rounds: Vec::new(),
            round_max: 0,
            round_rx_sum: 0.0,
            round_rx_w: 0.0,
            round_rx_n: 0,
            round_raw_sum: 0.0,
            stall_seen_us: None,
            rounds_since_stall: u32::MAX,
            last_round_sum: 0.0,
            last_round_w: 0.0,
            last_round_n: 0,
            prev_sent_rate: 0,
            round_pace: u64::MAX,
            round_sent: 0,
            recent: RecentRate::default(),
            queued_rx: RecentRate::default(),
            paced_recent: RecentRate::default(),
            recent_peak: WindowedMax::default(),
        }
    }

    /// Startup's readings of the latest deliveries, when it ends.
    pub(super) fn clear_recent(&mut self) {
        self.recent.clear();
        self.paced_recent.clear();
        self.recent_peak.clear();
    }
}

/// The sender's host stalled it while it sent what `rx` (bytes/s) measures: a busy VM stops
/// a sender for tens of ms, and the trickle it sent meanwhile arrives a round trip later.
/// Read as a share, that once cut a 1 Gbit/s flow to 350 Mbit/s on the harness. Or the
/// sender waited with a full window: a receiver's stall holds its ACKs, the flight fills
/// the cap, and the gap in sending comes back as a gap in deliveries a round trip later
/// (and in sending again, while the window is what limits it). Taken in, such gaps left
/// a 1 Gbit/s, 250 ms search at three quarters of the link on the harness. Waiting counts
/// only for a gap (`gap`: far under the estimate, no queue to keep the bottleneck busy
/// meanwhile): startup's flight cap makes it wait some of every round trip, and its hold
/// most of it, and what arrives then is still what the path carries (left out, startup
/// grew faster than its cap lets the queue grow, and lost twice as much on a short
/// buffer).
fn sender_limited(p: &Params, fb: &Feedback, rx: u64, gap: bool) -> bool {
    let idle = if gap { fb.send_idle_bytes } else { 0 };
    a_good_part(p, fb, rx, fb.send_stall_bytes + idle)
}

/// `part` (bytes) is over `Params::sender_limited` of what the sample `rx` (bytes/s)
/// measures over its interval.
fn a_good_part(p: &Params, fb: &Feedback, rx: u64, part: u64) -> bool {
    let bytes = rx as f64 * fb.rx_interval_us as f64 / 1e6;
    part as f64 > p.sender_limited * bytes
}

/// The sender's host stalled it for a good part of the time it sent what `rx` measures.
fn host_stalled(p: &Params, fb: &Feedback, rx: u64) -> bool {
    a_good_part(p, fb, rx, fb.send_stall_bytes)
}

/// What `rx` measures is mostly the burst that makes up for such a stall (the pacer's
/// catch-up, up to a quarter over the pace). The stall and its catch-up cancel out only
/// together: with the stall's samples left out (`sender_limited`) and the catch-up's taken
/// in, a sender whose host stalls reads more than it sends, and takes the link from a flow
/// beside it (the simulator, one sender held 20 ms every 200 ms beside a steady one: 78-84
/// of 88 Mbit/s; both held: Jain 0.56-1.00, mean 0.80 over 16 starts, 0.64-1.00 and 0.86
/// with the catch-up left out too).
fn catching_up(p: &Params, fb: &Feedback, rx: u64) -> bool {
    a_good_part(p, fb, rx, fb.catch_up_delivered)
}

/// The sender had nothing at all to send for a good part of the time it sent what `rx`
/// (bytes/s) measures: an application slower than the path (an ssh session through a
/// tunnel: its handshake, the pauses between commands). Such a sample is a floor under the
/// path's rate, never a measure of it (BBR's application-limited samples).
fn app_limited(p: &Params, fb: &Feedback, rx: u64) -> bool {
    a_good_part(p, fb, rx, fb.send_app_idle_bytes)
}

/// Delivery samples over the latest stretch of receiver time: what the path carries now.
/// Startup paces at twice this, so its rate rises smoothly with what gets through, where a
/// round's mean lags a rate that doubles within the round.
#[derive(Debug, Clone, Default)]
pub(super) struct RecentRate {
    /// (µs covered, bytes), oldest first.
    samples: VecDeque<(f64, f64)>,
    us: f64,
    bytes: f64,
}

impl RecentRate {
    /// Adds a sample of `rate` bytes/s over `us`, keeping at least `span_us` of the latest.
    pub(super) fn push(&mut self, us: f64, rate: f64, span_us: f64) {
        self.samples.push_back((us, rate * us));
        self.us += us;
        self.bytes += rate * us;
        while let Some(&(u, b)) = self.samples.front() {
            if self.us - u < span_us {
                break;
            }
            self.samples.pop_front();
            self.us -= u;
            self.bytes -= b;
        }
    }

    pub(super) fn clear(&mut self) {
        *self = RecentRate::default();
    }

    /// Bytes/s, 0 without samples.
    pub(super) fn rate(&self) -> f64 {
        if self.us > 0.0 {
            self.bytes / self.us
        } else {
            0.0
        }
    }
}

/// The largest of the readings over the latest stretch of time (BBR's max filter, exact:
/// a falling sequence of the readings that could still become the largest).
#[derive(Debug, Clone, Default)]
pub(super) struct WindowedMax {
    /// (µs, reading), the readings falling, the oldest first.
    falling: VecDeque<(u64, u64)>,
}

impl WindowedMax {
    /// Adds `value` read at `now_us`, keeping what was read over the last `span_us`.
    pub(super) fn push(&mut self, now_us: u64, value: u64, span_us: u64) {
        while self.falling.back().is_some_and(|&(_, v)| v <= value) {
            self.falling.pop_back();
        }
        self.falling.push_back((now_us, value));
        while self
            .falling
            .front()
            .is_some_and(|&(t, _)| t + span_us < now_us)
        {
            self.falling.pop_front();
        }
    }

    pub(super) fn clear(&mut self) {
        self.falling.clear();
    }

    /// The largest reading kept, 0 without any.
    pub(super) fn max(&self) -> u64 {
        self.falling.front().map_or(0, |&(_, v)| v)
    }
}

impl Adaptive {
    /// Current bottleneck estimate, bytes/s.
    pub fn bottleneck(&self) -> u64 {
        // While a queue drains the estimate holds at the share found: the samples of a drain
        // only tell how fast the queue empties. Startup's rate rises within a round: the
        // latest quarter round counts too.
        let current = if self.draining() {
            0
        } else if self.state == State::Startup {
            self.round_sample().max(self.recent_rate())
        } else {
            self.round_sample()
        };
        self.est
            .bw_rounds
            .iter()
            .copied()
            .chain(std::iter::once(current))
            .max()
            .unwrap_or(0)
    }

    /// This round's delivery rate: the mean of its samples weighted by the time each covers,
    /// so bytes over time. Not the largest: a path or host that stalls for a few ms and then
    /// catches up makes single samples read several times the link, and startup leaving at
    /// that overfills the queue for a second; flows that all overestimate keep a queue
    /// standing.
    ///
    /// While probing it is at most what we really send: more arrives only while a queue
    /// drains, and taking that in would undo the cut that drained it (by more for the
    /// flow that had more queued, the larger one: that stalls shares at uneven).
    ///
    /// Nor more than a quarter over the pace as the round began: a sender its host held
    /// sends faster while it makes up for the time lost, but on average no more than its
    /// pace, and a round of such a catch-up let in the bunched timestamps of a receiver
    /// stalled by the same host (on the harness, 10 ms, 1 %: deliveries of 4.3 Gbit/s, the
    /// pace at 2.5 Gbit/s for 200 ms, 13 MB lost). A quarter over it: what arrives now was
    /// sent about then, but the grow phase's increment rises within a round, and capped at
    /// the pace itself a smaller flow grew too slowly to even out.
    pub(super) fn round_sample(&self) -> u64 {
        match self.state {
            _ if self.est.round_rx_n == 0 => 0,
            State::ProbeBw(_) => (self.rx_mean() as u64)
                .min(self.sent_rate())
                .min(self.pace_ceiling()),
            _ => (self.rx_mean() as u64).min(self.sample_cap()),
        }
    }

    /// The most a probing round's deliveries (and the share a yield reads off them) can be
    /// (see `round_sample`).
    pub(super) fn pace_ceiling(&self) -> u64 {
        self.est
            .round_pace
            .saturating_add(self.est.round_pace / self.p.sample_headroom_div)
    }

    /// Nothing gets through faster than it is sent for long: more than the pacing rate, or
    /// (while searching) than what the last round really sent (what arrives now left about
    /// then), is the receiver's timestamps bunching (GRO, an emulator's or a host's
    /// catch-up after a stall), and taken as the bottleneck while searching it would set
    /// the rate several times too high.
    pub(super) fn sample_cap(&self) -> u64 {
        let d = self.p.sample_headroom_div;
        let mut cap = self.rate + self.rate / d;
        if self.state == State::Startup && self.est.prev_sent_rate > 0 {
            cap = cap.min(self.est.prev_sent_rate / d * (d + 1));
        }
        cap
    }

    /// What we really send, bytes/s: this round so far or the last, whichever is more.
    pub(super) fn sent_rate(&self) -> u64 {
        let dur = self.now_us.saturating_sub(self.round_start_us).max(1);
        let now = (self.est.round_sent as u128 * 1_000_000 / dur as u128) as u64;
        now.max(self.est.prev_sent_rate)
    }

    /// Startup: the delivery rate over the latest quarter round, within what was sent (more
    /// is timestamps bunching, see `sample_cap`).
    pub(super) fn recent_rate(&self) -> u64 {
        (self.est.recent.rate() as u64).min(self.startup_cap())
    }

    /// Startup: the most a quarter round carried over the last round trip, of samples that
    /// were not mostly a catch-up's (see `in_flight_cap`).
    pub(super) fn recent_peak(&self) -> u64 {
        self.est.recent_peak.max()
    }

    /// The most startup believes arrives: a quarter over the pace, half over what it sent.
    pub(super) fn startup_cap(&self) -> u64 {
        let sent = self.sent_rate();
        (self.rate + self.rate / self.p.sample_headroom_div)
            .min(sent + sent / self.p.startup_sent_headroom_div)
    }

    /// This round's mean delivery rate (loss-compensated while no queue stood), bytes/s.
    pub(super) fn rx_mean(&self) -> f64 {
        self.est.round_rx_sum / self.est.round_rx_w.max(1.0)
    }

    /// A delivery sample of `rx` bytes/s over `w` µs covers a stall: far longer than this
    /// round's samples are, and far under the estimate. The burst that makes up for it comes
    /// next.
    pub(super) fn is_gap(&self, rx: u64, w: f64) -> bool {
        self.in_probe_bw()
            && self.est.round_rx_n >= self.p.gap_min_samples
            && w > self.p.gap_intervals * self.est.round_rx_w / self.est.round_rx_n as f64
            && (rx as f64) < self.p.gap_rate * self.bottleneck() as f64
    }

    /// Adds a delivery sample (rate × µs, loss-compensated and raw, and µs) to this round's.
    pub(super) fn add_to_round(&mut self, (sum, raw, w): (f64, f64, f64)) {
        self.est.round_rx_sum += sum;
        self.est.round_raw_sum += raw;
        self.est.round_rx_w += w;
        self.est.round_rx_n += 1;
    }

    /// Remembers a round's delivery rate among the last `Params::bw_window`.
    pub(super) fn push_bw_round(&mut self, rate: u64) {
        self.est.bw_rounds.push(rate);
        if self.est.bw_rounds.len() > self.p.bw_window {
            self.est.bw_rounds.remove(0);
        }
    }

    /// Takes in the receiver's delivery-rate sample, unless it is the sender's (see
    /// `sender_limited`): into this round's sums, or, for a stall's sample that ends a round,
    /// returned to open the next one (see `is_gap`).
    pub(super) fn on_delivery_sample(
        &mut self,
        fb: &Feedback,
        ends_round: bool,
    ) -> Option<(f64, f64, f64)> {
        if fb.rx_rate.is_some_and(|rx| host_stalled(&self.p, fb, rx)) {
            self.est.stall_seen_us = Some(fb.now_us);
            self.est.rounds_since_stall = 0;
        }
        let mut carried = None;
        let gap = |rx: u64| {
            self.queue.path_queue_us <= self.p.busy_queue_us
                && (rx as f64) < self.p.gap_rate * self.bottleneck() as f64
        };
        // An application-limited sample is taken in only when it shows more than the pace
        // in force presumes: taken as it came, an ssh handshake's trickle through a tunnel
        // set startup's pace to 1 Mbit/s, and the copy that followed spent 0.7 s of a
        // clean 10 ms path climbing back to 500 Mbit/s.
        let app_floor = match self.state {
            State::Startup => self
                .bottleneck()
                .max((self.rate as f64 / self.p.startup_gain) as u64),
            _ => self.bottleneck(),
        };
        // The catch-up after a stall of the host is left out as the stall is (see
        // `catching_up`). Only after a stall: the pacer catches up on a host's every late
        // wake-up too, a few datagrams at a time, and those samples are the path's.
        let after_stall = self.est.stall_seen_us.is_some_and(|t| {
            fb.now_us.saturating_sub(t) <= 2 * self.srtt_us.max(self.p.rtt_floor_us)
        });
        if let Some(rx) = fb.rx_rate.filter(|&rx| {
            let floor_only = app_limited(&self.p, fb, rx) && rx <= app_floor;
            let catch_up = after_stall && catching_up(&self.p, fb, rx);
            !(sender_limited(&self.p, fb, rx, gap(rx)) || floor_only || catch_up)
        }) {
            let queue_empty = self.queue.queue_delay_us <= self.queue_target_us();
            // Random loss took its share before the receiver saw the data; the path itself
            // carried more. Here the recent loss ratio (a flow that overfills a short
            // buffer is stopped by `overflowing` and its share is read with random loss
            // only; scaling samples by random loss alone left a newcomer further under its
            // share after the losses of its startup: two flows on a 100 ms path, Jain 0.980
            // -> 0.953 over 12 start offsets), but no more than the random loss once that
            // is known: a 1 ms buffer that a host's stalls overflow keeps the recent ratio
            // high, and every delivery scaled up by it read as the rate sent, which then
            // stayed over the link (the simulator: 10-25 % retransmitted).
            let l = if queue_empty {
                self.loss
                    .loss_ewma
                    .min(self.random_loss().unwrap_or(1.0))
                    .min(self.p.max_loss_compensation)
            } else {
                0.0
            };
            let sample = (rx as f64 / (1.0 - l)) as u64;
            self.est.round_max = self.est.round_max.max(sample.min(self.sample_cap()));
            // The sums take every sample whole: over time they are bytes over time, exact
            // however the samples bunch, where capping each one would lose the bytes of
            // every burst (a path that stalls and catches up would read as slower).
            let w = fb.rx_interval_us.max(1) as f64;
            let part = (sample as f64 * w, rx as f64 * w, w);
            // A stall's sample (see `is_gap`) that ends a round opens the next one instead: a
            // round that fell due while the path or a host stalled ends with the first
            // feedback after it, and the burst that makes up for the stall comes next. Split
            // between rounds they read as one round too slow and one far too fast, and a
            // yield two rounds on read the burst without the stall (the simulator, 1 Gbit/s,
            // 100 ms, 30 ms stalls: its share at 1.09 times the link, and a 10 ms buffer
            // kept full).
            if ends_round && self.is_gap(rx, w) {
                carried = Some(part);
            } else {
                self.add_to_round(part);
            }
            if self.state == State::Startup {
                let span = (self.min_rtt_us / self.p.startup_recent_rtt_div)
                    .max(self.p.startup_recent_min_us) as f64;
                self.est.recent.push(w, sample as f64, span);
                if !catching_up(&self.p, fb, rx) {
                    self.est.paced_recent.push(w, sample as f64, span);
                    let r = (self.est.paced_recent.rate() as u64).min(self.startup_cap());
                    self.est.recent_peak.push(fb.now_us, r, self.min_rtt_us);
                }
                if self.queue.queued_samples > 0 {
                    self.est
                        .queued_rx
                        .push(w, sample as f64, self.min_rtt_us as f64);
                }
            }
        }
        carried
    }
}
