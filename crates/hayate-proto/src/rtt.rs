//! Round-trip time estimation (RFC 6298 smoothing plus a windowed minimum, which the rate
//! controller uses as the path's base RTT).

/// Estimates a path's round-trip time from samples: smoothed (RFC 6298), its variation, and
/// a windowed minimum. All times in µs.
#[derive(Debug, Clone)]
pub struct RttEstimator {
    srtt: Option<u64>,
    rttvar: u64,
    latest: u64,
    min: WindowedMin,
}

/// The least of the samples of the last [`MIN_RTT_WINDOW_US`] (as the RTT's minimum keeps
/// it), forgotten in [`MIN_RTT_BUCKETS`] steps.
#[derive(Debug, Clone)]
pub struct WindowedMin {
    /// The least sample of each stretch of `MIN_RTT_WINDOW_US / MIN_RTT_BUCKETS` (when it
    /// began, the least sample), oldest first, covering the last window.
    buckets: [(u64, u64); MIN_RTT_BUCKETS],
    n_buckets: usize,
    /// The least of those: the windowed minimum.
    min: u64,
}

impl Default for WindowedMin {
    fn default() -> Self {
        WindowedMin {
            buckets: [(0, u64::MAX); MIN_RTT_BUCKETS],
            n_buckets: 0,
            min: u64::MAX,
        }
    }
}

impl WindowedMin {
    /// Takes in a sample `v` at `now_us`; returns the windowed minimum.
    pub fn push(&mut self, now_us: u64, v: u64) -> u64 {
        const SPAN: u64 = MIN_RTT_WINDOW_US / MIN_RTT_BUCKETS as u64;
        let n = self.n_buckets;
        match self.buckets[..n].last_mut() {
            Some((start, m)) if now_us.saturating_sub(*start) < SPAN => *m = (*m).min(v),
            _ => {
                // A new stretch; the oldest falls out of the window once all are in use.
                if n == MIN_RTT_BUCKETS {
                    self.buckets.rotate_left(1);
                    self.buckets[n - 1] = (now_us, v);
                } else {
                    self.buckets[n] = (now_us, v);
                    self.n_buckets += 1;
                }
            }
        }
        let n = self.n_buckets;
        self.min = self.buckets[..n]
            .iter()
            .map(|&(_, m)| m)
            .min()
            .unwrap_or(u64::MAX);
        self.min
    }

    /// The windowed minimum, `None` before any sample.
    pub fn get(&self) -> Option<u64> {
        (self.min != u64::MAX).then_some(self.min)
    }
}

/// The least variation a probe timeout allows for (RFC 9002's kGranularity): timers
/// are not more precise than this.
const GRANULARITY_US: u64 = 1_000;
/// Before any sample: a conservative guess for a long path.
pub const INITIAL_RTT_US: u64 = 200_000;
/// How long a minimum RTT sample stays authoritative: long enough that a flow's queue
/// empties at least once within it, short enough that a route change raising the RTT is
/// believed within seconds.
const MIN_RTT_WINDOW_US: u64 = 10_000_000;
/// The window is forgotten in these steps. When the minimum expires, the next is the least
/// sample of the rest of the window, not whatever sample comes next (one taken while a
/// queue stood would raise the base RTT by that queue, and the rate controller would take
/// the queue for part of the path).
const MIN_RTT_BUCKETS: usize = 5;

impl Default for RttEstimator {
    fn default() -> Self {
        RttEstimator {
            srtt: None,
            rttvar: INITIAL_RTT_US / 2,
            latest: INITIAL_RTT_US,
            min: WindowedMin::default(),
        }
    }
}

impl RttEstimator {
    /// A sample of `rtt_us` taken at `now_us`.
    pub fn on_sample(&mut self, now_us: u64, rtt_us: u64) {
        let rtt = rtt_us.max(1);
        self.latest = rtt;
        self.min.push(now_us, rtt);
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(s) => {
                let d = s.abs_diff(rtt);
                self.rttvar = (3 * self.rttvar + d) / 4;
                self.srtt = Some((7 * s + rtt) / 8);
            }
        }
    }

    /// Whether any sample came in (before it, the figures are [`INITIAL_RTT_US`] guesses).
    pub fn has_sample(&self) -> bool {
        self.srtt.is_some()
    }

    /// Smoothed RTT, µs.
    pub fn srtt(&self) -> u64 {
        self.srtt.unwrap_or(INITIAL_RTT_US)
    }

    /// RTT variation (RFC 6298's RTTVAR), µs.
    pub fn rttvar(&self) -> u64 {
        self.rttvar
    }

    /// The last sample, µs.
    pub fn latest(&self) -> u64 {
        self.latest
    }

    /// Minimum RTT seen (the path's propagation delay), or the smoothed RTT before samples.
    pub fn min(&self) -> u64 {
        self.min.get().unwrap_or_else(|| self.srtt())
    }

    /// Probe timeout (RFC 9002 §6.2.1): how long an answer to a packet may take before we
    /// poke the peer. `max_ack_delay_us` is how long the peer may hold its ACK: the samples
    /// have it taken out, so without it a steady path (RTTVAR near zero) would probe every
    /// delayed ACK.
    pub fn pto(&self, max_ack_delay_us: u64) -> u64 {
        self.srtt() + (4 * self.rttvar).max(GRANULARITY_US) + max_ack_delay_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converges_and_tracks_min() {
        let mut r = RttEstimator::default();
        assert!(!r.has_sample());
        for i in 0..100 {
            r.on_sample(i * 1000, 50_000 + (i % 3) * 1000);
        }
        assert!((49_000..53_000).contains(&r.srtt()));
        assert_eq!(r.min(), 50_000);
        assert!(r.pto(5_000) >= r.srtt() + 5_000 + GRANULARITY_US);
    }

    /// An old minimum is forgotten within the window, and the next one is the least of the
    /// samples still in it, not the sample that happens to come when the old one expires.
    #[test]
    fn the_minimum_expires_to_the_least_recent_sample() {
        let mut r = RttEstimator::default();
        r.on_sample(0, 100_000);
        for i in 1..=900u64 {
            r.on_sample(i * 10_000, 110_000);
        }
        assert_eq!(r.min(), 100_000);
        // A queue stands from 9 s on: when the 100 ms sample expires, the base is still
        // the 110 ms of the last few seconds.
        for i in 901..=1100u64 {
            r.on_sample(i * 10_000, 140_000);
        }
        assert_eq!(r.min(), 110_000);
        // Once those age out too, the path's RTT has risen (a route change).
        for i in 1101..=2200u64 {
            r.on_sample(i * 10_000, 140_000);
        }
        assert_eq!(r.min(), 140_000);
        r.on_sample(22_010_000, 120_000);
        assert_eq!(r.min(), 120_000);
    }
}
