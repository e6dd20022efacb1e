//! Delay jitter and ACK aggregation: two ways a real path's delivery times differ from a
//! constant delay after a FIFO.
//!
//! **Jitter**: each datagram gets an extra delay drawn from a distribution, as when the
//! queueing of other traffic on the way varies. By default it keeps order (a datagram never
//! arrives before the one sent ahead of it, as through one queue); with `reorder`, each delay
//! is independent and later datagrams may overtake (parallel paths, a multi-queue NIC).
//! Keeping order makes each datagram wait for the latest one ahead of it (as netem does with
//! a FIFO child), so the delay added is the running maximum of the draws, more than their
//! mean, and more the more datagrams come per mean delay: at 300 Mbit/s an exponential draw
//! of 1 ms mean adds about 4 ms, varying.
//!
//! **Aggregation**: the link holds what arrives and lets it go in bursts, every `every_us`
//! (a Wi-Fi station waiting for a transmit opportunity, a cable modem's request-grant
//! cycle, a receiver's interrupt coalescing). On the reverse path this bunches
//! acknowledgements: the sender hears of a burst's worth of deliveries at one instant.

use super::Rng;

/// How the extra delay is distributed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JitterDist {
    /// Uniform on [0, 2 × mean].
    Uniform,
    /// Exponential with the mean (a long tail).
    Exponential,
}

/// Extra per-datagram delay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JitterParams {
    /// Mean extra delay, µs.
    pub mean_us: u64,
    /// Its distribution.
    pub dist: JitterDist,
    /// Delays are independent, so datagrams may overtake one another (false: order kept).
    pub reorder: bool,
}

#[derive(Debug, Clone)]
pub(super) struct Jitter {
    p: JitterParams,
    /// The latest arrival handed out (order kept).
    last_at: u64,
}

impl Jitter {
    pub fn new(p: JitterParams) -> Self {
        Jitter { p, last_at: 0 }
    }

    /// The arrival of a datagram due at `at` without jitter.
    pub fn arrival(&mut self, at: u64, rng: &mut Rng) -> u64 {
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let mean = self.p.mean_us as f64;
        let extra = match self.p.dist {
            JitterDist::Uniform => 2.0 * mean * u,
            JitterDist::Exponential => -mean * (1.0 - u).ln(),
        };
        let at = at + extra as u64;
        if self.p.reorder {
            return at;
        }
        self.last_at = self.last_at.max(at);
        self.last_at
    }
}

/// The release slot a datagram due at `at` leaves in: the next multiple of `every_us`
/// after `phase_us` (0: no aggregation).
pub(super) fn aggregate(at: u64, every_us: u64, phase_us: u64) -> u64 {
    if every_us == 0 {
        return at;
    }
    let k = (at + every_us - 1).saturating_sub(phase_us) / every_us;
    (k * every_us + phase_us).max(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_has_its_mean_and_keeps_order_unless_asked() {
        for dist in [JitterDist::Uniform, JitterDist::Exponential] {
            let p = JitterParams {
                mean_us: 2_000,
                dist,
                reorder: true,
            };
            let mut j = Jitter::new(p);
            let mut rng = Rng::new(5);
            let n = 200_000u64;
            let extra: u64 = (0..n)
                .map(|i| j.arrival(i * 1000, &mut rng) - i * 1000)
                .sum();
            let mean = extra as f64 / n as f64;
            assert!((mean / 2000.0 - 1.0).abs() < 0.02, "{dist:?}: mean {mean}");

            let mut j = Jitter::new(JitterParams {
                reorder: false,
                ..p
            });
            let mut last = 0;
            for i in 0..n {
                let at = j.arrival(i * 100, &mut rng);
                assert!(at >= last && at >= i * 100);
                last = at;
            }
        }
    }

    #[test]
    fn aggregation_releases_on_the_slots() {
        assert_eq!(aggregate(1234, 0, 0), 1234);
        assert_eq!(aggregate(1, 4_000, 0), 4_000);
        assert_eq!(aggregate(4_000, 4_000, 0), 4_000);
        assert_eq!(aggregate(4_001, 4_000, 0), 8_000);
        assert_eq!(aggregate(4_001, 4_000, 300), 4_300);
        assert_eq!(aggregate(100, 4_000, 300), 300);
        for at in 0..20_000 {
            let r = aggregate(at, 4_000, 1_700);
            assert!(r >= at && r < at + 4_000 && (r - 1_700).is_multiple_of(4_000));
        }
    }
}
