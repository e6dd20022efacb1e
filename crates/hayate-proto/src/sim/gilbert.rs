//! Bursty loss: the Gilbert-Elliott two-state channel. Each datagram is lost with the
//! loss probability of the state the channel is in, then the channel moves from Good to
//! Bad with probability `p` or from Bad to Good with probability `r`. The channel is Bad a
//! share `p / (p + r)` of the time and stays there `1 / r` datagrams on average, so with no
//! loss in Good and all lost in Bad, losses come in runs of mean length `1 / r` at a mean
//! rate `p / (p + r)` ([`GilbertElliott::mean_loss`]).

use super::Rng;

/// The channel's transition and loss probabilities, per datagram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GilbertElliott {
    /// Good → Bad.
    pub p: f64,
    /// Bad → Good.
    pub r: f64,
    /// Loss probability in Good (often 0).
    pub loss_good: f64,
    /// Loss probability in Bad (often 1).
    pub loss_bad: f64,
}

impl GilbertElliott {
    /// Losses at `mean` in runs of `burst` datagrams on average: all lost in Bad, none in
    /// Good.
    pub fn with_mean(mean: f64, burst: f64) -> Self {
        let r = 1.0 / burst;
        GilbertElliott {
            p: r * mean / (1.0 - mean),
            r,
            loss_good: 0.0,
            loss_bad: 1.0,
        }
    }

    /// The long-run share of datagrams lost.
    pub fn mean_loss(&self) -> f64 {
        let bad = self.p / (self.p + self.r);
        bad * self.loss_bad + (1.0 - bad) * self.loss_good
    }
}

#[derive(Debug, Clone)]
pub(super) struct Channel {
    p: GilbertElliott,
    bad: bool,
}

impl Channel {
    pub fn new(p: GilbertElliott) -> Self {
        Channel { p, bad: false }
    }

    /// The next datagram: true if it is lost.
    pub fn lose(&mut self, rng: &mut Rng) -> bool {
        let lost = rng.chance(if self.bad {
            self.p.loss_bad
        } else {
            self.p.loss_good
        });
        self.bad = rng.chance(if self.bad { 1.0 - self.p.r } else { self.p.p });
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_loss_and_burst_length_match_the_parameters() {
        for (mean, burst, seed) in [(0.01, 3.0, 1), (0.03, 10.0, 2), (0.001, 1.5, 3)] {
            let ge = GilbertElliott::with_mean(mean, burst);
            assert!((ge.mean_loss() - mean).abs() < 1e-12);
            let mut ch = Channel::new(ge);
            let mut rng = Rng::new(seed);
            let (mut lost, mut runs, mut prev) = (0u64, 0u64, false);
            let n = 20_000_000u64;
            for _ in 0..n {
                let l = ch.lose(&mut rng);
                lost += l as u64;
                runs += (l && !prev) as u64;
                prev = l;
            }
            let got = lost as f64 / n as f64;
            let run = lost as f64 / runs as f64;
            assert!((got / mean - 1.0).abs() < 0.05, "mean {got} want {mean}");
            assert!((run / burst - 1.0).abs() < 0.05, "run {run} want {burst}");
        }
    }

    /// With loss in both states, the mean is the states' losses weighted by their shares.
    #[test]
    fn mean_loss_with_loss_in_both_states() {
        let ge = GilbertElliott {
            p: 0.01,
            r: 0.2,
            loss_good: 0.001,
            loss_bad: 0.5,
        };
        let mut ch = Channel::new(ge);
        let mut rng = Rng::new(9);
        let n = 10_000_000;
        let lost = (0..n).filter(|_| ch.lose(&mut rng)).count();
        let got = lost as f64 / n as f64;
        assert!((got / ge.mean_loss() - 1.0).abs() < 0.05, "{got}");
    }
}
