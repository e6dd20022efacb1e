//! The state machine: Startup, Drain, ProbeBw (Down, Refill, Up), the transitions between
//! them and the pacing rate each state sets.

use super::loss::enough_datagrams;
use super::{bytes_in, congestion_cap, Adaptive, Feedback, Policy, Rule};

//STATE
/// The controller's state without ProbeBw's phase (for traces and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Searching for the path's rate, doubling each round until deliveries stop growing.
    Startup,
    /// Emptying the queue startup built.
    Drain,
    /// At the estimated rate, probing above it, yielding when a queue forms.
    ProbeBw,
}

/// Where the controller is (see the module doc for the transitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Searching for the path's rate, doubling each round until deliveries stop growing.
    Startup,
    /// Emptying the queue startup built.
    Drain,
    /// At the estimated rate, probing above it, yielding when a queue forms.
    ProbeBw(Phase),
}

/// Where a flow in `ProbeBw` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Under the estimate (just set to our share) until the queue is gone; rounds so far
    /// (0: the rest of the round in which the queue was found). Trace name `yield`.
    Down(u32),
    /// One round at the estimate, no increment: its deliveries and losses are what the
    /// path carries at that rate (a calm round). Trace name `probe`.
    Refill,
    /// At the estimate plus an increment that doubles every minimum RTT; rounds so far
    /// (from 1). Trace name `probe`.
    Up(u32),
}

impl Adaptive {
    /// Its current mode (for traces and tests).
    pub fn mode(&self) -> Mode {
        match self.state {
            State::Startup => Mode::Startup,
            State::Drain => Mode::Drain,
            State::ProbeBw(_) => Mode::ProbeBw,
        }
    }

    /// Contended under `Policy::Fair`: competing as a loss-based flow (see `policy.rs`).
    pub(super) fn competing(&self) -> bool {
        self.contention.contended && self.p.policy == Policy::Fair
    }

    /// Contended under `Policy::Low`: giving way (see `policy.rs`).
    pub(super) fn scavenging(&self) -> bool {
        self.contention.contended && self.p.policy == Policy::Low
    }

    /// The round trip the in-flight caps allow for: the base one, plus the queue another
    /// flow keeps standing when competing with it (our data waits in it too).
    pub(super) fn cap_rtt_us(&self) -> u64 {
        if self.competing() {
            self.min_rtt_us + self.queue.last_round_min_path_queue_us
        } else {
            self.min_rtt_us
        }
    }

    /// In ProbeBw, whatever the phase.
    pub(super) fn in_probe_bw(&self) -> bool {
        matches!(self.state, State::ProbeBw(_))
    }

    pub(super) fn draining(&self) -> bool {
        matches!(self.state, State::ProbeBw(Phase::Down(_)))
    }

    /// The path still carries more of what we send, whatever queue others keep: the last
    /// round's deliveries grew by a quarter (BBR's full-pipe test), or this round's so far
    /// are half again the last round's. A newcomer's deliveries grow like that as long as
    /// the flows already there yield to it; a lone flow's stop growing once it passes the
    /// bottleneck.
    /// Not when this round loses far more than random loss does: that is our overshoot
    /// overflowing a short buffer.
    pub(super) fn startup_still_growing(&self) -> bool {
        // `Policy::Low` forgoes the newcomer's claim: a queue that stands as it starts is
        // someone else's to keep (searching on into it made a CUBIC flow lose and cut, and
        // the scavenger held 30-40 % of a 300 Mbit/s path for the 20 s CUBIC took to grow back).
        if !self.p.ablation.on(Rule::StartupStillGrowing) || self.p.policy == Policy::Low {
            return false;
        }
        let settled = self.round_settled();
        let lost = self.loss.round_lost as f64 / settled.max(1) as f64;
        // Over enough datagrams to say: one random loss among the first 14 of a round read
        // as 7 % and ended a newcomer's search at its first 30 Mbit/s (the simulator, 300
        // Mbit/s, 100 ms, 1 % loss).
        if enough_datagrams(&self.p, settled)
            && lost
                > (self.p.startup_overshoot_loss_ratio * self.loss.loss_ewma)
                    .max(self.p.startup_overshoot_min_loss)
        {
            return false;
        }
        let last = self.est.bw_rounds.last().copied().unwrap_or(0);
        self.plateau_rounds == 0
            || (last > 0 && self.round_sample() as f64 >= self.p.startup_round_growth * last as f64)
    }

    /// The grow phase's increment in round `k`, bytes/s: the same for every flow on the path,
    /// whatever its rate. It doubles per minimum RTT of time, not per round: a round ends
    /// with the first feedback after it, and a smaller flow's feedback comes further apart
    /// (on a 10 ms path its rounds took 15 ms where the larger flow's took 11.7, and by the
    /// time the queue showed the larger flow's increment was 4 times the smaller's).
    pub(super) fn increment(&self, k: u32) -> f64 {
        if k == 0 {
            return 0.0;
        }
        let rtt = self.min_rtt_us.max(self.p.rtt_floor_us) as f64 / 1e6;
        self.p.grow_step * 2f64.powf(self.grow_doublings.min(self.p.max_grow_doublings)) / rtt
    }

    /// Moves the increment's doubling on to `now_us` (see `grow_doublings`).
    pub(super) fn advance_growth(&mut self, now_us: u64) {
        let dt = now_us.saturating_sub(self.grow_since_us);
        self.grow_since_us = now_us;
        if !matches!(self.state, State::ProbeBw(Phase::Up(_))) {
            self.grow_doublings = 0.0;
            return;
        }
        // On a short buffer the increment stops doubling while a queue shows: the queue
        // shows a round trip late, and the increment doubled meanwhile overflowed the buffer
        // (the simulator, 300 Mbit/s, 10 ms, 1 ms of buffer: 1.3 % retransmitted with the
        // learnt target alone, 0.7 % with this; 1.5 % before either). Every flow sees the
        // queue at once, so their increments stay equal.
        if self.shallow()
            && !self.queue_gone(self.queue.path_queue_us)
            && self.p.ablation.on(Rule::ShallowGrowthPause)
        {
            return;
        }
        self.grow_doublings += dt as f64 / self.min_rtt_us.max(self.p.rtt_floor_us) as f64;
    }

    /// The queue built: what we were delivered meanwhile is our share of the bottleneck (less
    /// if it keeps falling, or the queue is far too long); drain under that. "Meanwhile" is
    /// this round and the one before: a shared host stalls for tens of ms now and then, and
    /// a share read off such a stall alone would throw most of the rate away.
    ///
    /// `(path_q_us, q_us)`: the least queue (on the path; with the receiver's backlog) while
    /// it was found, not the latest sample's. A sender whose host held it reads the ACKs
    /// that waited meanwhile as a queue that jumped (35 ms on the harness's 100 ms path,
    /// where 8 had stood): sized by that, the cut was the big queue's, 0.7 of the link.
    pub(super) fn queue_found(&mut self, queues: (u64, u64)) {
        self.cut(queues, None);
    }

    /// [`queue_found`](Self::queue_found) with the share's gain given (the policy's cuts,
    /// see `policy.rs`) instead of chosen by the queue and the shares' history; a cut to a
    /// given share does not drain a queue that is not ours, either.
    /// Returns the share (before the gain).
    pub(super) fn cut(&mut self, (path_q_us, q_us): (u64, u64), gain: Option<f64>) -> u64 {
        let w = self.est.round_rx_w + self.est.last_round_w;
        // All of both rounds' deliveries, not only those taken while the queue stood. With
        // senders whose hosts stall, that selection read the smaller of two flows 10-15 %
        // under its estimate at every yield (the queue stands longest while a flow catches
        // up after a stall) and the shares drifted apart: Jain 0.67-0.72 on the harness
        // (300 Mbit/s, 50 ms, 2 cores), 0.58-0.77 in the simulator with senders held 20 ms
        // every 200 ms. What a sender sent while its host held it is left out already
        // (`sender_limited`).
        let mut share = if self.est.round_rx_n + self.est.last_round_n >= self.p.share_min_samples {
            ((self.est.round_raw_sum + self.est.last_round_sum) / w.max(1.0)) as u64
        } else if self.est.round_max > 0 {
            self.est.round_max
        } else {
            // No delivery said anything (the sender's host held it): keep the estimate.
            self.bottleneck()
        };
        // At most half of what it was, per drain: a path that really got that much slower
        // shows its queue again at once, and the next drain halves again. A receiver that
        // fell behind once read as 5-7 % of a 1 Gbit/s link on the harness, and the flow
        // took 2-3 s to grow back.
        share = share.max(self.bottleneck() / self.p.share_floor_div);
        // Nor more than was paced (see `round_sample`): a host stall's bunched receiver
        // timestamps read 3.9 Gbit/s on the harness's 1 Gbit/s path, and the yield set the
        // estimate to twice the link.
        share = share.min(self.pace_ceiling());
        // Random loss took its part after the bottleneck carried it. Only random loss: the
        // recent loss ratio would include what overflowed a short buffer, and make the share
        // what was sent (a flow at 1.4 times the link lost a quarter of it that way).
        let l = self.random_loss().unwrap_or(self.loss.loss_ewma);
        share = (share as f64 / (1.0 - l.min(self.p.max_loss_compensation))) as u64;
        let policy_cut = gain.is_some();
        let gain = gain.unwrap_or_else(|| {
            let big = (self.min_rtt_us as f64 * self.p.big_queue)
                .max(self.queue_target_us() as f64 * self.p.big_queue_targets);
            if path_q_us as f64 > big && self.p.ablation.on(Rule::BigQueueGain) {
                self.p.big_queue_gain
            } else {
                self.share_gain(share)
            }
        });
        self.shares.push(share);
        if self.shares.len() > self.p.share_history {
            self.shares.remove(0);
        }
        self.est.bw_rounds.clear();
        self.est.bw_rounds.push((share as f64 * gain) as u64);
        self.state = State::ProbeBw(Phase::Down(0));
        // Under it by as much as the queue holds, so that it empties in about a round trip
        // (not more: a queue drained too far leaves the link idle), or `Params::min_drain_span_us`.
        let span = self.min_rtt_us.max(self.p.min_drain_span_us) as f64;
        self.drain_gain = if policy_cut {
            1.0
        } else {
            (1.0 - q_us as f64 / span)
                .clamp(self.p.min_queue_drain_gain, self.p.max_queue_drain_gain)
        };
        share
    }

    /// What of a share just found becomes the estimate. Shares that keep moving mean flows
    /// are still sorting out who gets what: a deeper cut then evens them out faster (equal
    /// increments give back the same amount to each, so the cut's cost falls on the
    /// larger). Steady shares, a lone flow's or flows already even, keep the shallow cut and
    /// the link full. Moving means apart from more than one remembered share: one odd
    /// reading (a host's hiccup while the queue stood) would otherwise make the next
    /// `Params::share_history` cuts deep too (a lone flow on the harness's 100 ms path then spent
    /// most drains at the deeper cut).
    pub(super) fn share_gain(&self, share: u64) -> f64 {
        let s = share as f64;
        let apart = self
            .shares
            .iter()
            .filter(|&&h| s < self.p.share_moving * h as f64 || self.p.share_moving * s > h as f64)
            .count();
        if !self.shares.is_empty()
            && apart >= self.p.shares_apart.min(self.shares.len())
            && self.p.ablation.on(Rule::ConvergeGain)
        {
            self.p.converge_gain
        } else {
            self.p.share_gain
        }
    }

    /// The search found the bottleneck: drain its queue. What gets through now is the
    /// estimate (the means of the rounds lag a rate that doubled within them: a 100 ms path
    /// then drained to 0.55 of the link and took a second to grow back). Or what arrived
    /// over the last round trip while a queue stood, if more: while it stands the bottleneck
    /// is busy, and what arrives is what it carries. On a long path the quarter round is
    /// longer than startup waits for its queue to stand (a 250 ms path: 62 ms, 25), and part
    /// of it still went out under the link (the harness: left at 0.81 of a 1 Gbit/s link,
    /// and 3 s of growing to make up for it). Not since the queue began: another flow's
    /// queue may have stood for rounds while a newcomer's share of it doubled (300 Mbit/s,
    /// 100 ms: it left at 75 Mbit/s, its last round trip carried 111, and the two flows
    /// read Jain 0.924).
    pub(super) fn leave_startup(&mut self) {
        let queued = std::mem::take(&mut self.est.queued_rx).rate() as u64;
        self.push_bw_round(self.recent_rate().max(queued.min(self.startup_cap())));
        self.est.clear_recent();
        self.state = State::Drain;
    }

    /// Startup: from the first signs of our queue, sends no more than what is in flight then
    /// (less what it loses), until the queue goes again.
    ///
    /// The queue shows a round trip after the rate passed the bottleneck, and startup leaves
    /// only once it stood a while over the queue target: meanwhile it kept doubling up to
    /// its in-flight cap, half a BDP over the path, and a short buffer lost all of that
    /// over its depth (1 Gbit/s, 100 ms, 10 ms of buffer: 5-8 MB, 0.5-0.8 % of a 1 GiB
    /// file by itself). Holding there loses only what was already on its way.
    ///
    /// Not on a queue that stood all last round (another flow's: a newcomer held behind it
    /// stopped growing and left startup at a fifth of its share), nor on one already over
    /// the queue target when first seen (a host's stall: its late ACKs read tens of ms at
    /// once, where ours rises through the target).
    pub(super) fn hold_at_queue(&mut self, in_flight: u64) {
        if !self.p.ablation.on(Rule::StartupHold) {
            return;
        }
        let q = self
            .queue
            .path_queue_us
            .saturating_sub(self.queue.last_round_min_path_queue_us);
        // Over what the path varies by itself, as the queue target allows for.
        let beginning = self.p.startup_hold_queue_us + self.spread_allowance_us();
        let over = q > beginning
            && (self.hold_in_flight.is_some() || q <= self.deep_target_us())
            && self.queue.last_round_min_path_queue_us <= beginning
            && self.startup_rounds >= self.p.startup_hold_rounds;
        if over == self.hold_in_flight.is_some() {
            self.hold_samples = 0;
            return;
        }
        self.hold_samples += 1;
        if self.hold_samples < self.p.startup_hold_samples {
            return;
        }
        self.hold_samples = 0;
        if over {
            self.hold_in_flight = Some(in_flight);
        } else {
            self.hold_in_flight = None;
            // Not our queue after all: the rounds held say nothing of the bottleneck (counted
            // as a plateau, they ended searches early: two flows behind stalling senders,
            // Jain 0.83 on average over four starts, 0.88 without).
            self.plateau_rounds = 0;
            self.plateau_bw = self.bottleneck();
        }
    }

    pub(super) fn update_rate(&mut self) {
        let est = self.bottleneck();
        if est == 0 {
            return;
        }
        let bw = est as f64;
        self.loss.round_calm &= match self.state {
            State::Startup => false,
            State::ProbeBw(Phase::Refill) => true,
            State::ProbeBw(Phase::Up(_)) => false,
            _ => true,
        };
        self.rate = self.clamp(match self.state {
            State::Startup => bw * self.p.startup_gain,
            State::Drain => bw * self.p.drain_gain,
            State::ProbeBw(Phase::Down(_)) => bw * self.drain_gain,
            // No increment, and less the random loss known: a round at what gets through,
            // where the random loss it loses stays what it is, and a policer's drops (which
            // the calm rounds at the compensated pace learn as random loss as well: a pace
            // 1/(1 - l) over the policed rate loses l) stop, so the estimate of random loss
            // comes down (see `classify_round_loss`).
            State::ProbeBw(Phase::Refill) => {
                bw * (1.0
                    - self
                        .random_loss()
                        .unwrap_or(0.0)
                        .min(self.p.max_loss_compensation))
            }
            State::ProbeBw(Phase::Up(k)) => {
                if self.competing() && self.contention.rate_based() {
                    // A rate-based flow's cycle: cruise at the estimate, then probe a round.
                    if k >= self.p.contend_cruise_rounds {
                        bw * self.p.contend_search_gain
                    } else {
                        bw
                    }
                } else if self.competing() && self.contention.searching {
                    bw * self.p.contend_search_gain
                } else if self.competing() {
                    // CUBIC's curve instead of the increment (see `policy.rs`): its window
                    // over the RTT, and nothing under it. Not held at what gets delivered
                    // as well: the rounds after a cut still deliver the share from before
                    // it, and with that as a floor the pace was back within a few round
                    // trips of every cut, a constant rate that kept whatever share it had.
                    self.contention
                        .curve_rate(&self.p, self.now_us, self.srtt_us) as f64
                } else {
                    bw + self.increment(k).min(bw * self.p.max_grow)
                }
            }
        });
        if let Some((jump, _)) = self.jump_floor() {
            if self.state == State::Startup {
                // Careful resume: no slower than the jump until it is validated.
                self.rate = self.rate.max(jump);
            }
        }
        self.congestion_cap = congestion_cap(&self.p, est.max(self.rate), self.cap_rtt_us());
        self.drained_rate = self.clamp(bw);
        self.blind_rate = self.rate.min(self.drained_rate);
        self.drained_in_flight = bytes_in(est, self.min_rtt_us);
    }

    pub(super) fn end_round(&mut self, now_us: u64) {
        let loss = self.classify_round_loss();
        if (self.queue.round_samples > 0 && !self.draining()) || self.est.bw_rounds.is_empty() {
            self.push_bw_round(self.round_sample());
        }
        let (queue_building, round_queue, standing) = self.round_queue();
        // Not on a buffer known to be short: there a delay-based newcomer's queue stands
        // through our yields too, and it is not a loss-based flow's.
        let shallow = self.shallow();
        if self.state != State::Startup && !shallow {
            let yielded = self.draining();
            let queues = (self.queue.round_samples > 0).then_some((
                self.queue.round_min_path_queue_us,
                self.queue.round_max_path_queue_us,
            ));
            let target = self.queue_target_us();
            let floor = self.floor_offset_us(now_us);
            if self.contention.end_round(
                &self.p,
                now_us,
                queues,
                floor,
                self.min_rtt_us,
                target,
                yielded,
                self.est.rounds_since_stall <= self.p.contend_stall_rounds,
            ) {
                let rate = self.bottleneck();
                self.contention
                    .start_epoch(&self.p, now_us, rate, self.srtt_us, false);
            }
        } else if shallow {
            self.contention = Default::default();
        }
        let (competing, scavenging) = (self.competing(), self.scavenging());

        let bw = self.bottleneck();
        match self.state {
            State::Startup => {
                self.startup_rounds += 1;
                if bw as f64 >= self.plateau_bw as f64 * self.p.startup_full_growth {
                    self.plateau_bw = bw;
                    self.plateau_rounds = 0;
                } else if self.est.round_rx_n > 0 {
                    // A round whose every sample was the sender's (see `sender_limited`)
                    // says nothing of the path.
                    self.plateau_rounds += 1;
                }
                // A burst of loss is the shallow buffer overflowing (random loss is lower).
                if self.plateau_rounds >= self.p.startup_full_rounds
                    || (loss > self.p.startup_exit_loss
                        && self.p.ablation.on(Rule::StartupLossExit))
                {
                    self.leave_startup();
                }
            }
            State::Drain => {
                self.drain_rounds += 1;
                if !queue_building || self.drain_rounds >= self.p.max_drain_rounds {
                    self.state = State::ProbeBw(Phase::Refill);
                }
            }
            State::ProbeBw(_) => {
                if self.draining() && self.overflowing() {
                    // What was sent before the yield took effect overflowed the buffer a
                    // round trip after the queue showed (1 Gbit/s, 100 ms, 10 ms of
                    // buffer: growing stopped at 7.5 ms of queue, 15 % over the link, and
                    // 1.5 % of the data was lost, all of it there).
                    self.learn_buffer(now_us);
                }
                let State::ProbeBw(phase) = self.state else {
                    unreachable!("in ProbeBw");
                };
                let next = match phase {
                    _ if scavenging && standing => {
                        // A queue not ours stood all round: give way (see `policy.rs`).
                        let _ = self.cut(self.least_queues(), Some(self.p.low_beta));
                        Phase::Down(1)
                    }
                    Phase::Up(k)
                        if competing
                            && self.contention.rate_based()
                            && k > self.p.contend_cruise_rounds + 1 =>
                    {
                        // Beside a rate-based flow: the probe's round and the round its
                        // deliveries came back in are over, and a round under the estimate
                        // lets its queue go (no cut: see `policy.rs`).
                        self.drain_gain = self.p.drain_gain;
                        Phase::Down(1)
                    }
                    Phase::Refill | Phase::Up(_)
                        if competing
                            && !self.contention.rate_based()
                            && self.contention.overflowed(
                                &self.p,
                                self.loss_over_random(self.loss.round_lost, self.round_settled()),
                            ) =>
                    {
                        // The buffer the other flow keeps full overflowed: both cut.
                        let share = self.cut(self.least_queues(), Some(self.p.contend_beta));
                        self.contention
                            .start_epoch(&self.p, now_us, share, self.srtt_us, true);
                        Phase::Down(1)
                    }
                    Phase::Refill | Phase::Up(_)
                        if standing
                            && !competing
                            && self.p.ablation.on(Rule::StandingQueueYield)
                            && self.queue.round_samples >= self.p.grow_queue_samples
                            && self.est.round_rx_n + self.est.last_round_n
                                >= self.p.share_min_samples =>
                    {
                        // A queue stood all round: the path got slower, or another flow grew.
                        // Not on a round or two of samples: after a host stall of 20 ms the
                        // first ACK shows a queue and a delivery over the stall, and a share
                        // read off that one sample cut a 1 Gbit/s flow to 22 Mbit/s.
                        self.queue_found((self.queue.round_min_path_queue_us, round_queue));
                        Phase::Down(1)
                    }
                    Phase::Refill | Phase::Up(_)
                        if self.overflowing() && self.p.ablation.on(Rule::OverflowYield) =>
                    {
                        // The increment was lost, not queued: a buffer too short to show a
                        // queue. What got through is the share.
                        self.learn_buffer(now_us);
                        self.queue_found(self.least_queues());
                        Phase::Down(1)
                    }
                    Phase::Up(k)
                        if k >= self.p.grow_undelivered_rounds
                            && self.p.ablation.on(Rule::UndeliveredRefill)
                            && self.est.round_rx_n > 0
                            && self.est.prev_sent_rate as f64
                                > self.p.grow_undelivered * self.rx_mean() =>
                    {
                        // Sending more got nothing more through, and no queue says why:
                        // start over from the estimate.
                        Phase::Refill
                    }
                    Phase::Refill => Phase::Up(1),
                    Phase::Up(k) => Phase::Up(k + 1),
                    // The round the queue was found in is not a whole round of draining.
                    Phase::Down(0) => Phase::Down(1),
                    Phase::Down(n)
                        if standing
                            && !competing
                            && n < self.p.max_drain_rounds
                            && self.p.ablation.on(Rule::DownWhileStanding) =>
                    {
                        Phase::Down(n + 1)
                    }
                    Phase::Down(_) => Phase::Refill,
                };
                self.state = State::ProbeBw(next);
            }
        }
        self.est.last_round_sum = self.est.round_raw_sum;
        self.est.last_round_w = self.est.round_rx_w;
        self.est.last_round_n = self.est.round_rx_n;
        self.loss.last_round_calm = self.loss.round_calm;
        self.queue.last_round_max_path_queue_us = self.queue.round_max_path_queue_us;
        self.queue.last_round_min_path_queue_us = if self.queue.round_samples > 0 {
            self.queue.round_min_path_queue_us
        } else {
            0
        };
        self.start_round(now_us);
    }

    /// The transitions an RTT sample makes: Startup holds its flight at its own queue, and
    /// leaves once a queue stood a while; ProbeBw's Up phase yields (to Down) once the queue
    /// stood over its limit a while.
    pub(super) fn on_queue_sample(&mut self, fb: &Feedback) {
        // The queue is growing: the pipe is full, stop doubling now, not rounds later.
        // Once it stood a while: after a host stall the held ACKs come in together, the
        // first ones far late, and three of them ended a 1 Gbit/s, 250 ms search at 47
        // Mbit/s (growing from there took 7 s in the simulator).
        // Unless what we get through still grows by a quarter per round: then the queue
        // is someone else's (flows already on the path keep one while they probe), and
        // leaving now would strand a newcomer at a sliver (on a 10 ms path: a sixth of
        // the link, and equal increments took tens of seconds to even that out).
        if self.state == State::Startup {
            self.hold_at_queue(fb.in_flight);
        }
        if self.state == State::Startup
            && self.p.ablation.on(Rule::StartupQueueExit)
            && self.queue.queued_samples >= self.p.startup_exit_samples
            && fb.now_us - self.queue.queued_since_us >= self.grow_queue_persist_us()
            && !self.startup_still_growing()
        {
            self.leave_startup();
        }
        if matches!(self.state, State::ProbeBw(Phase::Up(_)))
            && !self.competing()
            && self.queue.grow_queued_samples >= self.p.grow_queue_samples
            && fb.now_us - self.queue.grow_queued_since_us >= self.grow_queue_persist_us()
        {
            self.queue_found(self.queue.grow_queued_floor_us);
        }
    }

    /// Drain, and ProbeBw's Down phase, end as soon as an RTT sample shows the queue gone.
    pub(super) fn exit_drain_when_queue_gone(&mut self, fb: &Feedback) {
        // Startup's drain: a sample of what was sent before it began tells nothing of the
        // queue the last round of the search is still putting up at the bottleneck (on a
        // path whose delay varies, such a sample read the queue gone before the search's
        // last burst arrived: a 25 ms queue then stood at 250 ms, the yield to it cut the
        // estimate to 0.67 of the link, and growing back took 3 s).
        let fresh = if self.state == State::Drain {
            let since = *self.drain_from_us.get_or_insert(fb.now_us);
            fb.rtt_us.is_some() && fb.rtt_sent_us >= since
        } else {
            self.drain_from_us = None;
            true
        };
        let any_drain = self.draining() || self.state == State::Drain;
        if any_drain
            && fresh
            && fb.rtt_us.is_some()
            && self.queue_gone(self.queue.queue_delay_us)
            && self.p.ablation.on(Rule::EarlyDrainExit)
        {
            // The queue is (nearly) out: grow again now, not at the end of a round (a round
            // more of draining left the link idle for most of it: a 10 ms path lost 5-8 %
            // of the link to that; startup's drain, at three quarters of the link, lost up
            // to a round trip of a quarter of it). Growing starts a round of its own: what
            // arrives now was sent while draining, and what a draining queue delivers (more
            // to the flow that had more in it) is no one's share.
            self.state = State::ProbeBw(Phase::Refill);
            self.est.last_round_sum = 0.0;
            self.est.last_round_w = 0.0;
            self.est.last_round_n = 0;
            // What the rest of this round reports was sent before the cut, by a round that
            // was calm only if both parts were.
            self.loss.last_round_calm &= self.loss.round_calm;
            self.start_round(fb.now_us);
        }
    }

    /// Startup: a flight held at its queue stays no less than what the path carries.
    pub(super) fn hold_no_less_than_carried(&mut self) {
        if self.state == State::Startup
            && self.hold_in_flight.is_some()
            && self.queue.path_queue_us > self.p.startup_hold_queue_us
            && self.p.ablation.on(Rule::StartupHold)
        {
            // While a queue stands what arrives is what the path carries: hold no less than
            // most of that over the base RTT. The flight is short when the queue first shows
            // if the pace dipped a round trip before (a receiver's stall: held at 20 of 31
            // MB, a 1 Gbit/s, 250 ms search ended at 624 Mbit/s and took 3 s to grow back).
            // Not all of it: on a short buffer a flight a little under it is what keeps the
            // overshoot's queue from overflowing (raised to all of it, the simulator's
            // shallow row with stalls lost 0.1 point more).
            let carried =
                self.p.hold_carried * bytes_in(self.round_sample(), self.min_rtt_us) as f64;
            let carried = carried as u64;
            if let Some(h) = &mut self.hold_in_flight {
                *h = (*h).max(carried);
            }
        }
    }

    /// The receiver's OS dropped datagrams: it could not keep up, and the estimate is cut to
    /// what it took in. Startup ends (to Drain); ProbeBw starts over at Refill.
    pub(super) fn on_receiver_drops(&mut self, fb: &Feedback) {
        // The receiver could not keep up: believe only what it took in, which is less
        // than we send (a sample above that is its timestamps bunching).
        let took = fb
            .rx_rate
            .unwrap_or(self.rate / self.p.rx_drop_guess_div)
            .min(self.rate);
        self.est.bw_rounds.clear();
        self.est.round_max = took;
        self.est.round_rx_sum = took as f64;
        self.est.round_raw_sum = took as f64;
        self.est.round_rx_w = 1.0;
        self.est.round_rx_n = 1;
        match self.state {
            State::Startup => {
                self.est.clear_recent();
                self.state = State::Drain;
            }
            State::Drain => {}
            State::ProbeBw(_) => self.state = State::ProbeBw(Phase::Refill),
        }
    }
}
