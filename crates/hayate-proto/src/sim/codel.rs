//! CoDel active queue management at the bottleneck (RFC 8289): a datagram that waited in
//! the queue longer than `target` (5 ms), while the queue has stayed over it for a whole
//! `interval` (100 ms), is dropped at the head as it leaves; while that lasts, drops come at
//! `interval / sqrt(count)` apart, closer and closer until the delay falls under the target.
//! fq_codel with a single flow (the scenario's flows share one queue here) is the same queue;
//! its per-flow scheduling only matters between flows.
//!
//! The simulated link works out each datagram's departure when it enters (a FIFO's
//! departures depend only on what came before), so the dequeue-time decision is taken then,
//! in arrival order, with the datagram's own dequeue time as `now`: exactly RFC 8289's
//! sequence of decisions. A dropped datagram takes no time on the wire; the next one leaves
//! at the same instant. Two simplifications: the RFC's guard against dropping the last
//! datagram in the queue (`bytes_in_queue <= MTU`) is left out, since at the simulated
//! rates one datagram's serialisation is far under the target, and the tail-drop limit
//! (`LinkParams::queue_bytes`) counts only the datagrams CoDel will let through.

/// CoDel's two parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CoDelParams {
    /// Acceptable standing queue delay, µs (RFC 8289: 5 ms).
    pub target_us: u64,
    /// How long the delay must stay over `target_us` before dropping starts, and the base of
    /// the drop spacing, µs (RFC 8289: 100 ms, a worst-case RTT).
    pub interval_us: u64,
}

impl Default for CoDelParams {
    fn default() -> Self {
        CoDelParams {
            target_us: 5_000,
            interval_us: 100_000,
        }
    }
}

/// CoDel's state (RFC 8289 section 5's variables).
#[derive(Debug, Clone)]
pub(super) struct CoDel {
    p: CoDelParams,
    /// When the sojourn time will have been over target for an interval (0: it is not over).
    first_above_time: u64,
    /// In the dropping state, the next drop's time.
    drop_next: u64,
    count: u32,
    lastcount: u32,
    dropping: bool,
    /// The previous datagram started the dropping state: its successor, dequeued right
    /// after the drop, is returned whatever its own sojourn says (the RFC's `dequeue`).
    just_entered: bool,
}

impl CoDel {
    pub fn new(p: CoDelParams) -> Self {
        CoDel {
            p,
            first_above_time: 0,
            drop_next: 0,
            count: 0,
            lastcount: 0,
            dropping: false,
            just_entered: false,
        }
    }

    fn control_law(&self, t: u64, count: u32) -> u64 {
        t + (self.p.interval_us as f64 / (count.max(1) as f64).sqrt()) as u64
    }

    /// The queue ran empty before this datagram came (RFC 8289: a dequeue found nothing).
    pub fn on_empty(&mut self) {
        self.first_above_time = 0;
        self.dropping = false;
        self.just_entered = false;
    }

    /// RFC 8289's `dodequeue`: is it all right to drop the head, dequeued at `now` after
    /// waiting `sojourn_us`?
    fn ok_to_drop(&mut self, now: u64, sojourn_us: u64) -> bool {
        if sojourn_us < self.p.target_us {
            self.first_above_time = 0;
            return false;
        }
        if self.first_above_time == 0 {
            self.first_above_time = now + self.p.interval_us;
            false
        } else {
            now >= self.first_above_time
        }
    }

    /// The datagram at the head leaves at `now` after waiting `sojourn_us`: true if CoDel
    /// drops it.
    pub fn drop_at_dequeue(&mut self, now: u64, sojourn_us: u64) -> bool {
        let ok = self.ok_to_drop(now, sojourn_us);
        if std::mem::take(&mut self.just_entered) {
            return false;
        }
        if self.dropping {
            if !ok {
                self.dropping = false;
                return false;
            }
            if now >= self.drop_next {
                self.count += 1;
                self.drop_next = self.control_law(self.drop_next, self.count);
                return true;
            }
            false
        } else if ok {
            self.dropping = true;
            self.just_entered = true;
            let delta = self.count.saturating_sub(self.lastcount);
            self.count =
                if delta > 1 && now.saturating_sub(self.drop_next) < 16 * self.p.interval_us {
                    delta
                } else {
                    1
                };
            self.drop_next = self.control_law(now, self.count);
            self.lastcount = self.count;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unresponsive sender at `overload` times a 10 Mbit/s link for 40 s: the share
    /// dropped, and the median and 90th percentile of the queueing delay after 10 s, µs.
    fn unresponsive(overload: f64) -> (f64, u64, u64) {
        let rate = 1_250_000u64; // bytes/s
        let ser = 1500 * 1_000_000 / rate; // 1.2 ms a datagram
        let gap = (ser as f64 / overload) as u64;
        let mut codel = CoDel::new(CoDelParams::default());
        let mut busy_until = 0u64;
        let (mut sojourns, mut drops, mut sent) = (Vec::new(), 0u64, 0u64);
        for i in 0..40_000_000 / gap {
            let now = i * gap;
            if now >= busy_until {
                codel.on_empty();
            }
            let start = busy_until.max(now);
            sent += 1;
            if codel.drop_at_dequeue(start, start - now) {
                drops += 1;
                continue;
            }
            busy_until = start + ser;
            if now > 10_000_000 {
                sojourns.push(start - now);
            }
        }
        sojourns.sort_unstable();
        let median = sojourns[sojourns.len() / 2];
        let p90 = sojourns[sojourns.len() * 9 / 10];
        (drops as f64 / sent as f64, median, p90)
    }

    /// A mild overload (5 %): a tail-drop queue would grow without bound; CoDel sheds the
    /// excess and holds the delay near its target.
    #[test]
    fn holds_a_mild_unresponsive_overload_near_the_target() {
        let (dropped, median, p90) = unresponsive(1.05);
        assert!((0.04..0.06).contains(&dropped), "dropped {dropped:.3}");
        assert!((3_000..12_000).contains(&median), "median {median} µs");
        assert!(p90 < 15_000, "p90 {p90} µs");
    }

    /// A heavy one (1.5 times the link): CoDel's drop rate only grows with the square root
    /// of its count, so the queue stands far over the target for long stretches (that is
    /// CoDel, not a fault of the model: it relies on senders that answer a drop), but over
    /// time it sheds the third that does not fit.
    #[test]
    fn sheds_a_heavy_unresponsive_overload() {
        let (dropped, _, _) = unresponsive(1.5);
        assert!((0.30..0.36).contains(&dropped), "dropped {dropped:.3}");
    }

    /// Under the target nothing is ever dropped, however long it lasts.
    #[test]
    fn a_queue_under_the_target_is_left_alone() {
        let mut codel = CoDel::new(CoDelParams::default());
        for i in 0..100_000u64 {
            assert!(!codel.drop_at_dequeue(i * 1000, 4_999));
        }
    }
}
