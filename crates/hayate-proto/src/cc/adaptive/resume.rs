//! Careful resume (RFC 9959, "Convergence of Congestion Control from Retained State"): a
//! session to a peer seen recently starts near the rate an earlier one found, once the path
//! confirms it is the same, and retreats at once if the path says no. Also what a session
//! measured, for the I/O shell to remember.

use super::loss::enough_datagrams;
use super::state::State;
use super::{bytes_in, Adaptive, Feedback};
use crate::cc::{PathMeasurement, RememberedPath};

/// Where careful resume is (see the module doc of `adaptive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumePhase {
    /// No remembered path was given.
    Off,
    /// Reconnaissance: a remembered path waits for the first RTT sample to confirm it.
    Reconnaissance,
    /// The remembered path was not used: too old, an RTT not comparable with it, or no
    /// faster than the search already is.
    Ignored,
    /// The jump: pacing at part of the remembered rate, until the first of its packets is
    /// acknowledged.
    Unvalidated,
    /// The jump's packets come back (the search goes on from what they deliver) until the
    /// last one is acknowledged.
    Validating,
    /// Every packet of the jump came back without a queue or a burst of loss.
    Validated,
    /// The path said no (a queue, loss, the receiver dropping) while the jump was
    /// unvalidated: the estimate went to what the jump got delivered, and the queue drains.
    Retreated,
}

/// Careful resume's state, and the tallies that say whether what this session measures is
/// worth remembering.
#[derive(Debug, Clone)]
pub(super) struct Resume {
    pub(super) phase: ResumePhase,
    saved: Option<RememberedPath>,
    /// The jump's pace, bytes/s, and its in-flight cap, bytes.
    jump: u64,
    jump_cap: u64,
    /// When the jump began (Unvalidated) and when its first packet was acknowledged
    /// (Validating), µs.
    since_us: u64,
    until_us: u64,
    /// Validating: the fates of the jump's packets, and the delivery samples (rate × µs, µs).
    lost: u64,
    delivered: u64,
    rx_sum: f64,
    rx_w: f64,
    /// RTT samples in a row over the retreat's queue limit, and when the first came.
    queued_samples: u32,
    queued_since_us: u64,
    /// A comparable remembered path's minimum RTT, and until when the contention detector
    /// measures the queue from it (µs; see `Params::resume_base_us`).
    base: Option<(u64, u64)>,
    /// Past Startup: rounds, bytes delivered, and sending time with nothing to send.
    pub(super) probe_rounds: u32,
    probe_delivered: u64,
    probe_app_idle: u64,
}

impl Resume {
    pub(super) fn new() -> Self {
        Resume {
            phase: ResumePhase::Off,
            saved: None,
            jump: 0,
            jump_cap: 0,
            since_us: 0,
            until_us: 0,
            lost: 0,
            delivered: 0,
            rx_sum: 0.0,
            rx_w: 0.0,
            queued_samples: 0,
            queued_since_us: 0,
            base: None,
            probe_rounds: 0,
            probe_delivered: 0,
            probe_app_idle: 0,
        }
    }

    /// The jump is on and not yet validated.
    pub(super) fn jumping(&self) -> bool {
        matches!(
            self.phase,
            ResumePhase::Unvalidated | ResumePhase::Validating
        )
    }
}

/// When the newest packet `fb` acknowledges was sent, µs, if it has an RTT sample.
fn sent_at(fb: &Feedback) -> Option<u64> {
    fb.rtt_us.map(|_| fb.rtt_sent_us)
}

impl Adaptive {
    /// Where careful resume is (for traces and tests).
    pub fn resume_phase(&self) -> ResumePhase {
        self.resume.phase
    }

    /// Careful resume's Reconnaissance: the path an earlier session measured, until the
    /// first RTT sample says whether it is the same one.
    pub(super) fn remember_path(&mut self, path: RememberedPath) {
        if self.state == State::Startup && self.resume.phase == ResumePhase::Off {
            self.resume.saved = Some(path);
            self.resume.phase = ResumePhase::Reconnaissance;
        }
    }

    /// The pace and the in-flight cap of an unvalidated jump (at least), if one is on.
    pub(super) fn jump_floor(&self) -> Option<(u64, u64)> {
        self.resume
            .jumping()
            .then_some((self.resume.jump, self.resume.jump_cap))
    }

    /// What a feedback means for careful resume: confirm the path and jump, move on through
    /// the jump's validation, or retreat. Called after the RTT sample is taken in (the
    /// queue is up to date) and before the state machine's rules.
    pub(super) fn resume_on_feedback(&mut self, fb: &Feedback) {
        match self.resume.phase {
            ResumePhase::Reconnaissance if fb.rtt_us.is_some() && fb.min_rtt_us > 0 => {
                self.reconnoitre(fb.now_us, fb.min_rtt_us)
            }
            ResumePhase::Unvalidated | ResumePhase::Validating => self.validate(fb),
            _ => {}
        }
    }

    /// The handshake's round trip, before any data: the first RTT sample of the path (as
    /// QUIC's careful resume takes its handshake's), so a confirmed jump starts with the
    /// first data packet instead of a round trip later.
    pub(super) fn resume_on_handshake(&mut self, now_us: u64, rtt_us: u64) {
        if self.resume.phase == ResumePhase::Reconnaissance && rtt_us > 0 {
            self.reconnoitre(now_us, rtt_us);
        }
    }

    /// How far the minimum RTT is over a comparable remembered path's, while that counts
    /// (`Params::resume_base_us`), µs. A flow that joins behind another's standing queue
    /// never sees the path's floor by itself: its minimum RTT has that queue in it, its
    /// yields push the queue just under a target measured from there, and it finds the
    /// other flow only once it has given most of its share away. The contention detector
    /// measures the queue from the remembered floor instead (the rest of the controller
    /// from its own minimum: a floor that is wrong must not size its drains).
    pub(super) fn floor_offset_us(&self, now_us: u64) -> u64 {
        match self.resume.base {
            Some((floor, until_us)) if now_us < until_us => self.min_rtt_us.saturating_sub(floor),
            _ => 0,
        }
    }

    /// At a round's end: the remembered floor stops counting once this flow gets delivered
    /// what the path carried then (`Params::resume_alone_share` of the remembered rate). A
    /// path that carries as much as before has no one else's queue on it: a floor under
    /// what it shows now is a route that got longer since, and the contention found over
    /// that floor (a queue that never went) was our own queue, and ends with it.
    pub(super) fn drop_base_when_alone(&mut self) {
        let Some(saved) = self.resume.saved else {
            return;
        };
        if self.resume.base.is_some()
            && self.bottleneck() as f64 >= self.p.resume_alone_share * saved.rate as f64
        {
            self.resume.base = None;
            self.contention = Default::default();
        }
    }

    /// The first RTT sample, `rtt_us` at `now_us`: jump if it matches the remembered path.
    fn reconnoitre(&mut self, now_us: u64, rtt_us: u64) {
        let saved = self.resume.saved.expect("a remembered path");
        let rtt = rtt_us as f64;
        let saved_rtt = saved.min_rtt_us.max(1) as f64;
        let same = saved.age_us <= self.p.resume_max_age_us
            && rtt >= self.p.resume_rtt_low * saved_rtt
            && rtt <= self.p.resume_rtt_high * saved_rtt
            && self.state == State::Startup;
        if same {
            self.resume.base = Some((saved.min_rtt_us, now_us + self.p.resume_base_us));
        }
        // The RFC's jump is half the saved window: over a longer RTT that is a lower rate.
        let jump =
            self.clamp(self.p.resume_jump_gain * saved.rate as f64 * (saved_rtt / rtt).min(1.0));
        if !same || jump <= self.rate {
            self.resume.phase = ResumePhase::Ignored;
            return;
        }
        self.resume.jump = jump;
        self.resume.jump_cap =
            bytes_in(jump, rtt_us.max(self.p.rtt_floor_us)) + self.p.cap_burst_bytes;
        self.resume.since_us = now_us;
        self.resume.phase = ResumePhase::Unvalidated;
        self.rate = jump;
    }

    /// The jump's packets coming back: on to Validating with the first, Validated with the
    /// last; retreat when the path says no.
    fn validate(&mut self, fb: &Feedback) {
        // The path's queue over the limit a while: the jump is more than it carries now.
        let limit = self.p.resume_retreat_queue * self.queue_target_us() as f64;
        let persist = self.grow_queue_persist_us();
        let r = &mut self.resume;
        if fb.rtt_us.is_some() {
            if self.queue.path_queue_us as f64 > limit {
                if r.queued_samples == 0 {
                    r.queued_since_us = fb.now_us;
                }
                r.queued_samples += 1;
            } else {
                r.queued_samples = 0;
            }
        }
        let queued = r.queued_samples >= self.p.grow_queue_samples
            && fb.now_us - r.queued_since_us >= persist;
        if r.phase == ResumePhase::Validating {
            r.lost += fb.lost_bytes;
            r.delivered += fb.delivered;
            if let Some(rx) = fb.rx_rate {
                let w = fb.rx_interval_us.max(1) as f64;
                r.rx_sum += rx as f64 * w;
                r.rx_w += w;
            }
        }
        let settled = r.lost + r.delivered;
        let lossy = enough_datagrams(&self.p, settled)
            && r.lost as f64 > self.p.resume_retreat_loss * settled as f64;
        if queued || lossy || fb.rx_drops > 0 {
            self.retreat();
            return;
        }
        let r = &mut self.resume;
        match (r.phase, sent_at(fb)) {
            (ResumePhase::Unvalidated, Some(t)) if t >= r.since_us => {
                r.phase = ResumePhase::Validating;
                r.until_us = fb.now_us;
            }
            (ResumePhase::Validating, Some(t)) if t >= r.until_us => {
                r.phase = ResumePhase::Validated;
            }
            _ => {}
        }
    }

    /// Safe retreat: the estimate is what the jump really got delivered, and its queue
    /// drains (Drain, then ProbeBw, as when Startup finds the bottleneck).
    fn retreat(&mut self) {
        let r = &mut self.resume;
        r.phase = ResumePhase::Retreated;
        let delivered = if r.rx_w > 0.0 {
            (r.rx_sum / r.rx_w) as u64
        } else {
            self.bottleneck()
        };
        let delivered = delivered.min(self.rate).max(self.p.min_rate);
        if self.state != State::Startup {
            // The receiver's drops already cut the estimate (`on_receiver_drops`).
            return;
        }
        self.est.bw_rounds.clear();
        self.push_bw_round(delivered);
        self.est.clear_recent();
        self.est.queued_rx.clear();
        self.hold_in_flight = None;
        self.drain_rounds = 0;
        self.state = State::Drain;
    }

    /// Past Startup: the tallies for `measured`.
    pub(super) fn tally_for_memory(&mut self, fb: &Feedback, ends_round: bool) {
        if !self.in_probe_bw() {
            return;
        }
        let r = &mut self.resume;
        r.probe_delivered += fb.delivered;
        r.probe_app_idle += fb.send_app_idle_bytes;
        if ends_round {
            r.probe_rounds += 1;
        }
    }

    /// What this session measured, when worth remembering (see `RateControl::measured`).
    pub(super) fn measurement(&self) -> Option<PathMeasurement> {
        let r = &self.resume;
        let rate = self.bottleneck();
        let found = self.in_probe_bw() && r.probe_rounds >= self.p.remember_min_rounds;
        let app_limited =
            r.probe_app_idle as f64 > self.p.remember_app_limited * r.probe_delivered as f64;
        let capped = self
            .max_rate
            .is_some_and(|m| rate as f64 >= self.p.remember_under_cap * m as f64);
        (found && !app_limited && !capped && rate > 0 && self.min_rtt_us > 0).then_some(
            PathMeasurement {
                rate,
                min_rtt_us: self.min_rtt_us,
            },
        )
    }
}
