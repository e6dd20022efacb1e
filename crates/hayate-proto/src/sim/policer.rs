//! A token-bucket policer (an ISP's rate limit): tokens accrue at `rate` bytes/s up to
//! `burst_bytes`; a datagram passes if the bucket holds its size, which it takes, and is
//! dropped otherwise. There is no queue: what exceeds the rate is lost at once, so the
//! delay never shows it, only loss does. The bucket starts full.

/// The policer's rate and bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicerParams {
    /// Sustained rate, bytes/s.
    pub rate: u64,
    /// Bucket depth, bytes: what may pass at once after an idle spell.
    pub burst_bytes: u64,
}

#[derive(Debug, Clone)]
pub(super) struct Policer {
    p: PolicerParams,
    /// Tokens in byte-µs (bytes × 10⁶), so refills at any rate stay exact.
    tokens: u128,
    last_us: u64,
}

impl Policer {
    pub fn new(p: PolicerParams) -> Self {
        Policer {
            p,
            tokens: p.burst_bytes as u128 * 1_000_000,
            last_us: 0,
        }
    }

    /// A datagram of `len` bytes arrives at `now`: true if it passes.
    pub fn pass(&mut self, now: u64, len: u64) -> bool {
        let cap = self.p.burst_bytes as u128 * 1_000_000;
        let dt = now.saturating_sub(self.last_us) as u128;
        self.tokens = (self.tokens + dt * self.p.rate as u128).min(cap);
        self.last_us = self.last_us.max(now);
        let need = len as u128 * 1_000_000;
        if self.tokens >= need {
            self.tokens -= need;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offered at 4 times the rate: the bucket's burst passes first, then exactly the rate.
    #[test]
    fn passes_the_burst_then_the_rate() {
        let p = PolicerParams {
            rate: 1_000_000,
            burst_bytes: 150_000,
        };
        let mut pol = Policer::new(p);
        let len = 1500u64;
        // One datagram every 375 µs: 4 MB/s offered.
        let mut passed_first = 0;
        let mut t = 0;
        while t < 50_000 {
            passed_first += pol.pass(t, len) as u64;
            t += 375;
        }
        // 50 ms: the bucket (100 datagrams) plus 50 ms of the rate (33 datagrams).
        assert!((132..=135).contains(&passed_first), "{passed_first}");
        let mut passed = 0u64;
        while t < 10_050_000 {
            passed += pol.pass(t, len) as u64;
            t += 375;
        }
        // Then 10 s at the rate: 10 MB.
        let bytes = passed * len;
        assert!((9_990_000..=10_010_000).contains(&bytes), "{bytes}");
    }

    /// An idle spell refills the bucket, and never beyond its depth.
    #[test]
    fn refills_up_to_the_burst() {
        let mut pol = Policer::new(PolicerParams {
            rate: 1_000_000,
            burst_bytes: 15_000,
        });
        let n = (0..100).filter(|_| pol.pass(0, 1500)).count();
        assert_eq!(n, 10);
        let n = (0..100).filter(|_| pol.pass(1_000_000, 1500)).count();
        assert_eq!(n, 10);
    }
}
