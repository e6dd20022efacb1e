//! Round-trip time estimation (RFC 6298 smoothing plus a windowed minimum, which the rate
//! controller uses as the path's base RTT).

#[derive(Debug, Clone)]
pub struct RttEstimator {
    srtt: Option<u64>,
    rttvar: u64,
    latest: u64,
    min: u64,
    /// Windowed min: the minimum is forgotten slowly so a route change can raise it.
    min_stamp: u64,
}

/// Before any sample: a conservative guess for a long path.
pub const INITIAL_RTT_US: u64 = 200_000;
/// How long a minimum RTT sample stays authoritative.
const MIN_RTT_WINDOW_US: u64 = 10_000_000;

impl Default for RttEstimator {
    fn default() -> Self {
        RttEstimator {
            srtt: None,
            rttvar: INITIAL_RTT_US / 2,
            latest: INITIAL_RTT_US,
            min: u64::MAX,
            min_stamp: 0,
        }
    }
}

impl RttEstimator {
    pub fn on_sample(&mut self, now_us: u64, rtt_us: u64) {
        let rtt = rtt_us.max(1);
        self.latest = rtt;
        if rtt <= self.min || now_us.saturating_sub(self.min_stamp) > MIN_RTT_WINDOW_US {
            self.min = rtt;
            self.min_stamp = now_us;
        }
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

    pub fn has_sample(&self) -> bool {
        self.srtt.is_some()
    }

    pub fn srtt(&self) -> u64 {
        self.srtt.unwrap_or(INITIAL_RTT_US)
    }

    pub fn rttvar(&self) -> u64 {
        self.rttvar
    }

    pub fn latest(&self) -> u64 {
        self.latest
    }

    /// Minimum RTT seen (the path's propagation delay), or the smoothed RTT before samples.
    pub fn min(&self) -> u64 {
        if self.min == u64::MAX {
            self.srtt()
        } else {
            self.min
        }
    }

    /// Probe timeout: how long silence may last before we poke the peer.
    pub fn pto(&self) -> u64 {
        (self.srtt() + 4 * self.rttvar).max(5_000)
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
        assert!(r.pto() >= r.srtt());
    }
}
