//! The loss classifier: random loss (the path's own, compensated) against congestive loss
//! (a buffer overflowing). The pacer's own catch-up bursts are told apart by the pacer
//! (`pacer.rs`) and reported in `Feedback::catch_up_*`.

use super::params::Params;
use super::{Adaptive, State};

/// The loss classifier's state: this round's fates, the recent and the random loss.
#[derive(Debug, Clone)]
pub(super) struct LossClassifier {
    /// Bytes this round's feedback reported lost, and delivered: the fates of what was sent
    /// about a round trip earlier (not of `round_sent`, nor of the last round's: a sender
    /// that stalled in that round would read its usual losses as many).
    pub(super) round_lost: u64,
    pub(super) round_delivered: u64,
    /// Of those, the pacer's catch-up (see `Feedback::catch_up_delivered`).
    pub(super) round_catch_up_lost: u64,
    pub(super) round_catch_up_delivered: u64,
    /// Datagrams the receiver's OS dropped this round.
    pub(super) round_rx_drops: u64,
    pub(super) loss_ewma: f64,
    /// The path's random loss: lost over settled (delivered or lost) bytes reported in rounds
    /// after calm rounds (sending at most the estimate, so nothing of theirs overflowed a
    /// queue), each older round weighing `Params::random_loss_decay` less. Of what the pacer sent
    /// at its rate only, not its catch-ups (see `end_round`).
    pub(super) random_lost: f64,
    pub(super) random_settled: f64,
    /// This round has sent at most the estimate so far (no startup, no grow increment).
    pub(super) round_calm: bool,
    /// The last round was calm.
    pub(super) last_round_calm: bool,
}

impl LossClassifier {
    pub(super) fn new() -> Self {
        LossClassifier {
            round_lost: 0,
            round_delivered: 0,
            round_catch_up_lost: 0,
            round_catch_up_delivered: 0,
            round_rx_drops: 0,
            loss_ewma: 0.0,
            random_lost: 0.0,
            random_settled: 0.0,
            round_calm: false,
            last_round_calm: false,
        }
    }
}

/// `settled` bytes are enough datagrams (`Params::grow_step` is one datagram's bytes) for a loss
/// ratio to say anything: too few do not (the last blocks of a transfer, one lost of two).
pub(super) fn enough_datagrams(p: &Params, settled: u64) -> bool {
    settled as f64 / p.grow_step >= p.overflow_min_datagrams
}

impl Adaptive {
    /// Bytes whose fate (delivered or lost) this round's feedback reported.
    pub(super) fn round_settled(&self) -> u64 {
        self.loss.round_lost + self.loss.round_delivered
    }

    /// The path's random loss, once calm rounds were seen (see `random_lost`).
    pub(super) fn random_loss(&self) -> Option<f64> {
        (self.loss.random_settled > 0.0).then(|| self.loss.random_lost / self.loss.random_settled)
    }

    /// This round's reported losses (of what the last round sent, which grew) are more than
    /// random loss explains: the bottleneck's buffer overflowed.
    pub(super) fn overflowing(&self) -> bool {
        !self.loss.last_round_calm
            && self.loss_over_random(self.loss.round_lost, self.round_settled())
    }

    /// `lost` of `settled` bytes is more than the path's random loss explains.
    pub(super) fn loss_over_random(&self, lost: u64, settled: u64) -> bool {
        let Some(p) = self.random_loss() else {
            return false;
        };
        let p =
            p.max(self.p.random_loss_floor_datagrams * self.p.grow_step / self.loss.random_settled);
        if !enough_datagrams(&self.p, settled) {
            return false;
        }
        let n = settled as f64 / self.p.grow_step;
        let loss = lost as f64 / settled as f64;
        loss > self.p.overflow_ratio * p
            + self.p.overflow_sigmas * (p.max(self.p.overflow_margin) / n).sqrt()
            + self.p.overflow_margin
    }

    /// At the end of a round: its loss ratio. Updates the recent loss (not with a search's
    /// overshoot) and the random loss (from calm rounds only, not with another flow's
    /// overflow of a short buffer), both of what was paced at the rate, not of the pacer's
    /// catch-up bursts.
    pub(super) fn classify_round_loss(&mut self) -> f64 {
        let settled = self.round_settled();
        let loss = self.loss.round_lost as f64 / settled.max(1) as f64;
        // The path's loss is read off what was paced at the rate: what the pacer sent in
        // a catch-up burst overflows a short buffer by itself, and counted as the path's
        // random loss it made the compensation pace a 10 ms path with a 1 ms buffer at 1.3
        // times its rate (the simulator: 32 % retransmitted).
        let (paced_lost, paced_settled) = (
            self.loss
                .round_lost
                .saturating_sub(self.loss.round_catch_up_lost),
            settled
                .saturating_sub(self.loss.round_catch_up_lost + self.loss.round_catch_up_delivered),
        );
        let paced_loss = paced_lost as f64 / paced_settled.max(1) as f64;
        // A search round that loses far more than the path did so far is its overshoot
        // overflowing a short buffer (see `startup_still_growing`), not the path's loss.
        let overshoot = self.state == State::Startup
            && loss
                > (self.p.startup_overshoot_loss_ratio * self.loss.loss_ewma)
                    .max(self.p.startup_overshoot_min_loss);
        if paced_settled > 0 && !overshoot {
            let g = self.p.loss_ewma_gain;
            self.loss.loss_ewma = (1.0 - g) * self.loss.loss_ewma + g * paced_loss;
        }
        // What was paced at the estimate alone (a calm round) lost more than random loss
        // explains, on a buffer known to be short, and not at the receiver: another flow
        // overflowed the buffer (a newcomer's search, where the buffer is too short for the
        // queue that makes flows yield on a deep one). That is not the path's random loss:
        // taken for it, the compensation kept the flows already there at the rate they had,
        // and left the newcomer with what its search found (the simulator, 100 Mbit/s,
        // 100 ms, 0.1 BDP: a fifth to a third of the link, Jain 0.82-0.89 over four starts).
        let foreign = self.in_probe_bw()
            && (self.shallow() || self.contention.contended)
            && self.loss.last_round_calm
            && self.loss.round_rx_drops == 0
            && paced_settled > 0
            && self.loss_over_random(paced_lost, paced_settled);
        if self.loss.last_round_calm && paced_settled > 0 && !foreign {
            self.loss.random_lost =
                self.p.random_loss_decay * self.loss.random_lost + paced_lost as f64;
            self.loss.random_settled =
                self.p.random_loss_decay * self.loss.random_settled + paced_settled as f64;
        }
        loss
    }
}
