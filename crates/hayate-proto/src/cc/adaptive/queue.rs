//! The queue signal: queueing delay on the path (RTT over the minimum, less what the ACKs
//! waited behind on the way back) and at the receiver (its backlog and socket buffer), the
//! queue target, and the bottleneck buffer learnt short.

use std::collections::VecDeque;

use super::params::{Params, Rule};
use super::{Adaptive, Feedback};

/// The queue signal's state: queueing delay on the path and at the receiver, per round and standing, and the bottleneck buffer learnt short.
#[derive(Debug, Clone)]
pub(super) struct QueueSignal {
    pub(super) round_queue_hits: u32,
    pub(super) round_samples: u32,
    /// Least queueing delay seen this round, µs.
    pub(super) round_min_queue_us: u64,
    /// The same of the path's queue alone; the receiver's largest backlog this round and
    /// its latest (µs, see `backlog_melting`).
    pub(super) round_min_path_queue_us: u64,
    /// The last round's least path queue (0 without RTT samples), µs: a queue that stood
    /// all round.
    pub(super) last_round_min_path_queue_us: u64,
    pub(super) round_max_lag_us: u64,
    /// The largest path queue that stood (see `StandingQueue`) this round and the last, µs.
    pub(super) round_max_path_queue_us: u64,
    pub(super) last_round_max_path_queue_us: u64,
    pub(super) standing: StandingQueue,
    /// The bottleneck's buffer, µs: the largest queue that stood in the rounds in which
    /// growing last overflowed it, when that is under `Params::shallow_targets` queue targets
    /// (`u64::MAX`: not known to be that short), and when that was. See `queue_target_us`.
    pub(super) shallow_buffer_us: u64,
    pub(super) shallow_since_us: u64,
    pub(super) lag_us: u64,
    /// Consecutive RTT samples above the queue target (startup exits on 3 over
    /// `grow_queue_persist_us`), and when the first came.
    pub(super) queued_samples: u32,
    pub(super) queued_since_us: u64,
    /// Consecutive RTT samples above the grow phase's limit, when the first came, and the
    /// least queue (`path_queue_us`, `queue_delay_us`) among them.
    pub(super) grow_queued_samples: u32,
    pub(super) grow_queued_since_us: u64,
    pub(super) grow_queued_floor_us: (u64, u64),
    /// Queueing delay, µs: on the path (latest RTT − min RTT, `path_queue_us`) plus the
    /// receiver's backlog that counts (`receiver_queue_us`).
    pub(super) queue_delay_us: u64,
    pub(super) path_queue_us: u64,
    /// What the receiver's socket buffer holds of data, bytes (0: unknown).
    pub(super) rx_room: u64,
    /// The path's own delay variation, which the queue target allows for.
    pub(super) spread: DelaySpread,
}

impl QueueSignal {
    pub(super) fn new() -> Self {
        QueueSignal {
            round_queue_hits: 0,
            round_samples: 0,
            round_min_queue_us: u64::MAX,
            round_min_path_queue_us: u64::MAX,
            last_round_min_path_queue_us: 0,
            round_max_lag_us: 0,
            round_max_path_queue_us: 0,
            last_round_max_path_queue_us: 0,
            standing: StandingQueue::default(),
            shallow_buffer_us: u64::MAX,
            shallow_since_us: 0,
            lag_us: 0,
            queued_samples: 0,
            queued_since_us: 0,
            grow_queued_samples: 0,
            grow_queued_since_us: 0,
            grow_queued_floor_us: (0, 0),
            queue_delay_us: 0,
            path_queue_us: 0,
            rx_room: 0,
            spread: DelaySpread::default(),
        }
    }
}

/// The path's own delay variation: how far RTT samples stray from one another beyond a
/// trend. A queue at the bottleneck changes smoothly (at the rate the pace differs from the
/// bottleneck's), so three consecutive samples of it, growing or draining, lie on a line
/// (by their send times, as the sender recorded them: a sender woken late reads a batch of
/// ACKs at once, and the reading time less the RTT puts each off the line by how late the
/// batch was read, more often the more ACKs a flow gets); delay the path adds by itself (a
/// radio's retries, a scheduler, a shared medium) varies from one datagram to the next. Each sample's distance from the line
/// through its neighbours, as a median over the latest `Params::spread_samples`, measures
/// that variation; ACKs that bunch (a reverse path that holds them) fall on lines too
/// (samples taken in one release fall evenly) and barely count. The queue target is raised
/// by a multiple of it (`Params::spread_gain`): read as a queue, a few ms of variation on a
/// short path made the controller yield round after round (53-76 % of the link at 10 ms).
#[derive(Debug, Clone, Default)]
pub(super) struct DelaySpread {
    /// The last two samples, (sent at, RTT) µs, oldest first.
    last: [Option<(u64, u64)>; 2],
    /// The latest distances from the line, µs, oldest first.
    recent: VecDeque<u64>,
    /// Their median, µs.
    median_us: u64,
    /// Room to find the median in, kept between samples (one comes per ACK).
    scratch: Vec<u64>,
}

impl DelaySpread {
    /// Takes in an RTT sample of a datagram sent at `sent_us`; keeps the latest `keep`
    /// distances.
    pub(super) fn push(&mut self, sent_us: u64, rtt_us: u64, keep: usize) {
        if let [Some((t0, x0)), Some((t1, x1))] = self.last {
            if sent_us > t0 && t1 >= t0 && t1 <= sent_us {
                let w = (t1 - t0) as f64 / (sent_us - t0) as f64;
                let line = x0 as f64 + (rtt_us as f64 - x0 as f64) * w;
                self.recent.push_back((x1 as f64 - line).abs() as u64);
                while self.recent.len() > keep {
                    self.recent.pop_front();
                }
                self.scratch.clear();
                self.scratch.extend(self.recent.iter().copied());
                let mid = self.scratch.len() / 2;
                self.median_us = *self.scratch.select_nth_unstable(mid).1;
            }
        }
        self.last = [self.last[1], Some((sent_us, rtt_us))];
    }

    /// The median distance from the line, µs, once `least` distances were measured (0
    /// before: a few samples are a host's stall as likely as the path's variation).
    pub(super) fn median_us(&self, least: usize) -> u64 {
        if self.recent.len() >= least {
            self.median_us
        } else {
            0
        }
    }
}

/// How much of the receiver's lag counts as queue, µs (see `Params::rx_buffer_calm`): the lag
/// scales with the bytes waiting, so the part of it over the `calm` share.
fn receiver_queue_us(p: &Params, fb: &Feedback, calm: f64) -> u64 {
    if fb.rx_buffer == 0 {
        return fb.rx_lag_us.saturating_sub(p.rx_lag_allowance_us);
    }
    let over = fb.rx_buffered as f64 - calm * fb.rx_buffer as f64;
    if over <= 0.0 {
        return 0;
    }
    (fb.rx_lag_us as f64 * over / fb.rx_buffered as f64) as u64
}

/// The least path queue over the latest stretch of time: a queue that stood that long. A
/// host's stall makes single samples read far over any buffer (the ACKs it held come back
/// together, the first ones late: 29 ms on the harness's 100 ms path with 10 ms of buffer),
/// and falls back within a fraction of the stall; a queue the flow keeps stands until it
/// drains it. Taken as the buffer's depth, such a spike made a 10 ms buffer read as deep,
/// and growing overflowed it again and again (2.1-2.4 % retransmitted where 1.7 % was
/// without stalls, the simulator; 2.1-2.2 % on the harness).
#[derive(Debug, Clone, Default)]
pub(super) struct StandingQueue {
    /// When the samples came (µs), oldest first: those of the stretch, and the latest before
    /// it (what the queue was when the stretch began, however long ago that sample came).
    times: VecDeque<u64>,
    /// (µs, queue µs) of the samples no later one is at most, so the first is the least (a
    /// sliding-window minimum: a fast path's feedback comes hundreds of times per stretch).
    least: VecDeque<(u64, u64)>,
}

impl StandingQueue {
    /// Adds the sample `q_us` at `now_us`; returns the least queue over the `span_us` up to
    /// it (0 until samples cover that long).
    pub(super) fn push(&mut self, now_us: u64, q_us: u64, span_us: u64) -> u64 {
        self.times.push_back(now_us);
        while self.least.back().is_some_and(|&(_, q)| q >= q_us) {
            self.least.pop_back();
        }
        self.least.push_back((now_us, q_us));
        let start = now_us.saturating_sub(span_us);
        while self.times.len() > 1 && self.times[1] <= start {
            self.times.pop_front();
        }
        let first = self.times[0];
        while self.least.front().is_some_and(|&(t, _)| t < first) {
            self.least.pop_front();
        }
        match self.least.front() {
            Some(&(_, q)) if first <= start => q,
            _ => 0,
        }
    }
}

impl Adaptive {
    /// Queueing delay that counts as "the queue is building".
    /// At least 2 ms: a real host wakes the sender up to a millisecond late now and then, and
    /// the pacer makes up for it with a burst that queues for as long; a lower target reads
    /// those bursts as congestion (on a 10 ms path every few round trips). A buffer that
    /// holds less than 3 targets (see `shallow_buffer_us`) overflows before the queue shows
    /// over the target: there a third of it, so that growing stops at half of it.
    pub(super) fn queue_target_us(&self) -> u64 {
        let shallow = (self.queue.shallow_buffer_us / self.p.shallow_targets)
            .max(self.p.min_shallow_target_us);
        self.deep_target_us().min(shallow) + self.spread_allowance_us()
    }

    /// What the queue target allows for the path's own delay variation (see
    /// `DelaySpread`), µs.
    pub(super) fn spread_allowance_us(&self) -> u64 {
        if !self.p.ablation.on(Rule::SpreadAllowance) {
            return 0;
        }
        let spread = self
            .queue
            .spread
            .median_us(self.p.spread_min_samples)
            .saturating_sub(self.p.spread_floor_us);
        ((spread as f64 * self.p.spread_gain) as u64)
            .min(self.min_rtt_us / self.p.spread_max_rtt_div)
    }

    pub(super) fn deep_target_us(&self) -> u64 {
        (self.min_rtt_us / self.p.queue_target_rtt_div)
            .clamp(self.p.queue_target_min_us, self.p.queue_target_max_us)
    }

    /// The bottleneck's buffer is known to be too short for the usual queue target.
    pub(super) fn shallow(&self) -> bool {
        self.queue.shallow_buffer_us / self.p.shallow_targets < self.deep_target_us()
    }

    /// The receiver's backlog is well under its peak of this round: its host stalled (for
    /// 300 ms on the harness) and now catches up faster than data comes in. A receiver
    /// slower than the link keeps a backlog that grows or stands; this one is no reason to
    /// slow down (read as one, it cut a 1 Gbit/s flow to 126 Mbit/s).
    pub(super) fn backlog_melting(&self) -> bool {
        self.queue.lag_us + self.queue_target_us() < self.queue.round_max_lag_us
    }

    /// A queue of `q_us` is (nearly) gone (see `Params::drain_floor`).
    pub(super) fn queue_gone(&self, q_us: u64) -> bool {
        q_us as f64 <= self.p.drain_floor * self.queue_target_us() as f64
    }

    /// How long the queue must stay over the grow phase's limit before it counts. A host or
    /// path that stalls for a few ms and then catches up delays the packets of the stall
    /// too, but their ACKs come back bunched within a fraction of the stall, and the delay
    /// falls back; a queue the flow builds stays until it drains it. Waiting this long lets
    /// that queue grow by at most a quarter of it (the increment is at most `Params::max_grow`).
    pub(super) fn grow_queue_persist_us(&self) -> u64 {
        (self.min_rtt_us / self.p.grow_queue_persist_rtt_div).clamp(
            self.p.grow_queue_persist_min_us,
            self.p.grow_queue_persist_max_us,
        )
    }

    /// The least queues (on the path; with the receiver's backlog) this round so far.
    pub(super) fn least_queues(&self) -> (u64, u64) {
        (
            self.queue
                .round_min_path_queue_us
                .min(self.queue.path_queue_us),
            self.queue.round_min_queue_us.min(self.queue.queue_delay_us),
        )
    }

    /// The buffer overflowed with at most the queue that stood this round and the last: if
    /// that is under `Params::shallow_targets` queue targets, it is the buffer's depth.
    pub(super) fn learn_buffer(&mut self, now_us: u64) {
        let full = self
            .queue
            .round_max_path_queue_us
            .max(self.queue.last_round_max_path_queue_us);
        if full / self.p.shallow_targets < self.deep_target_us() {
            self.queue.shallow_buffer_us = full;
            self.queue.shallow_since_us = now_us;
        }
    }

    /// Takes in an RTT sample: the queue on the path and at the receiver, this round's
    /// least and largest, the standing queue, the buffer learnt short, and the runs of
    /// samples over the queue target and over the limit of ProbeBw's Up phase.
    pub(super) fn on_rtt_sample(&mut self, fb: &Feedback, rtt: u64) {
        // Less what the ACK waited behind on the way back (a thin or busy reverse path),
        // which is not ours to drain.
        self.queue.path_queue_us = rtt
            .saturating_sub(fb.min_rtt_us)
            .saturating_sub(fb.back_queue_us.unwrap_or(0));
        self.queue
            .spread
            .push(fb.rtt_sent_us, rtt, self.p.spread_samples);
        let calm = if self.queue.rx_room >= self.congestion_cap {
            self.p.rx_buffer_calm_roomy
        } else {
            self.p.rx_buffer_calm
        };
        self.queue.queue_delay_us = self.queue.path_queue_us + receiver_queue_us(&self.p, fb, calm);
        self.queue.round_min_queue_us =
            self.queue.round_min_queue_us.min(self.queue.queue_delay_us);
        self.queue.round_min_path_queue_us = self
            .queue
            .round_min_path_queue_us
            .min(self.queue.path_queue_us);
        let stood = self.queue.standing.push(
            fb.now_us,
            self.queue.path_queue_us,
            self.grow_queue_persist_us(),
        );
        self.queue.round_max_path_queue_us = self.queue.round_max_path_queue_us.max(stood);
        if stood > self.queue.shallow_buffer_us {
            // The buffer holds more than we thought.
            self.queue.shallow_buffer_us = stood;
        }
        if fb.now_us > self.queue.shallow_since_us + self.p.shallow_memory_us {
            self.queue.shallow_buffer_us = u64::MAX;
        }
        self.queue.lag_us = fb.rx_lag_us;
        self.queue.round_max_lag_us = self.queue.round_max_lag_us.max(fb.rx_lag_us);
        self.queue.round_samples += 1;
        let target = self.queue_target_us();
        // Sample by sample only the path's queue counts: the receiver's backlog jumps
        // whenever its host stalls for a moment and then melts at CPU speed. A backlog
        // that stands all round (a receiver slower than the link) counts at round end.
        if self.queue.path_queue_us > target {
            self.queue.round_queue_hits += 1;
            if self.queue.queued_samples == 0 {
                self.queue.queued_since_us = fb.now_us;
            }
            self.queue.queued_samples += 1;
        } else {
            self.queue.queued_samples = 0;
            self.est.queued_rx.clear();
        }
        if self.queue.path_queue_us as f64 > self.p.grow_queue * target as f64 {
            if self.queue.grow_queued_samples == 0 {
                self.queue.grow_queued_since_us = fb.now_us;
                self.queue.grow_queued_floor_us = (u64::MAX, u64::MAX);
            }
            self.queue.grow_queued_samples += 1;
            let (p, q) = self.queue.grow_queued_floor_us;
            self.queue.grow_queued_floor_us = (
                p.min(self.queue.path_queue_us),
                q.min(self.queue.queue_delay_us),
            );
        } else {
            self.queue.grow_queued_samples = 0;
        }
    }

    /// At the end of a round: whether most of its RTT samples showed a queue over the
    /// target, the least queue that stood all round (the path's alone while the receiver's
    /// backlog melts, see `backlog_melting`), and whether that is over the target.
    pub(super) fn round_queue(&self) -> (bool, u64, bool) {
        let queue_building = self.queue.round_samples > 0
            && self.queue.round_queue_hits * 2 > self.queue.round_samples;
        let round_queue = if self.backlog_melting() {
            self.queue.round_min_path_queue_us
        } else {
            self.queue.round_min_queue_us
        };
        let standing = self.queue.round_samples > 0 && round_queue > self.queue_target_us();
        (queue_building, round_queue, standing)
    }
}
