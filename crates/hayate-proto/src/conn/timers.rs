//! Deadlines: the idle timeout, the probe timeout (PTO), keep-alive PINGs, and the next
//! moment anything is due (`poll_timeout`).

use std::time::{Duration, Instant};

use super::spaces::ACK_DELAY_US;
use super::{Connection, Event, State};

/// Liveness: the idle timeout, probe timeouts and keep-alive PINGs.
pub(super) struct Timers {
    /// When the last authentic packet arrived, µs (the idle timeout counts from it).
    pub(super) last_rx_us: u64,
    pub(super) pto_base_us: u64,
    pub(super) pto_count: u32,
    pub(super) ping_pending: bool,
    /// See [`Connection::keep_alive`]; and when its last PING was queued.
    pub(super) keep_alive: bool,
    pub(super) keep_alive_us: u64,
}

impl Connection {
    /// The next moment `handle_timeout` (or `poll_transmit`) has work, if any.
    pub fn poll_timeout(&mut self, now: Instant) -> Option<Instant> {
        let now_us = self.now_us(now);
        let at = |us: u64| self.epoch + Duration::from_micros(us);
        let mut t: Option<u64> = None;
        let mut min = |x: u64| t = Some(t.map_or(x, |y: u64| y.min(x)));
        match &self.state {
            State::Handshake(h) => {
                min(h.next_send_us(now_us));
                min(h.deadline_us);
            }
            State::Closed => return None,
            State::Draining { until_us } => {
                if self.close_frame.is_some() {
                    min(now_us);
                }
                min(*until_us);
            }
            State::AwaitConfirm | State::Established => {
                min(self.timers.last_rx_us + self.cfg.idle_timeout.as_micros() as u64);
                if self.space.ack_now
                    || self.ctrl_urgent()
                    || self.timers.ping_pending
                    || self.xfers.hash_work
                    || self.path.response_due.is_some()
                {
                    min(now_us);
                }
                if let Some(d) = self.space.ack_deadline {
                    min(d);
                }
                if let Some(d) = self.keep_alive_due() {
                    min(d);
                }
                if self.outstanding() {
                    min(self.pto_deadline());
                }
                // (`has_data_to_send` counts bulk control, and otherwise says no while the
                // in-flight window is full: `poll_transmit` would send nothing before an ACK.)
                if self.has_data_to_send() && (!self.xfers.source_blocked || self.ctrl_bulk()) {
                    match self.path.pacer.next_send_time(now_us) {
                        Some(x) => min(x),
                        None => min(now_us),
                    }
                }
            }
        }
        t.map(at)
    }

    /// The probe timeout, before backing off. The peer runs this code: it holds an ACK of
    /// data at most `ACK_DELAY_US`, or its spacing on a long path (its minimum RTT is
    /// about ours).
    pub(super) fn pto_us(&self) -> u64 {
        self.path.rtt.pto(ACK_DELAY_US.max(self.ack_spacing_us()))
    }

    /// When the next probe is due: a probe timeout after the last ACK, the last probe, or
    /// the packet that ended a quiet spell ([`Connection::arm_pto_if_quiet`]), whichever
    /// was last.
    pub(super) fn pto_deadline(&self) -> u64 {
        let backoff = 1u64 << self.timers.pto_count.min(6);
        let pto = self.pto_us();
        // Backing off stops at an eighth of the idle timeout: a probe at most every 1.9 s of
        // the default 15 s. Doubling on to 64 probe timeouts left a session that had lost
        // its last few probes (30 % loss each way) a single probe more before the timeout
        // ended it, all data out and no loss map back to say what to resend.
        let most = (self.cfg.idle_timeout.as_micros() as u64 / 8).max(pto);
        self.timers.pto_base_us + (pto * backoff).min(most)
    }

    /// Called before each packet is sent: with nothing awaiting an answer, the probe timer
    /// counts from now, so from the packet about to end the quiet spell (RFC 9002 §6.2.1).
    /// Counted from the last ACK instead, a keystroke after a minute of quiet (an idle ssh
    /// session through the tunnel) found its probe overdue the moment it was sent and went
    /// twice.
    pub(super) fn arm_pto_if_quiet(&mut self, now_us: u64) {
        if !self.outstanding() {
            self.timers.pto_base_us = now_us;
            self.timers.pto_count = 0;
        }
    }

    /// Something sent is still awaiting an answer from the peer.
    pub(super) fn outstanding(&self) -> bool {
        self.ctrl.tx.has_unacked()
            || self.stream_outstanding()
            || self
                .xfers.outgoing
                .values()
                .any(|o| o.flowing() && o.next_new > 0 && !o.all_acked())
            || self.xfers.outgoing.values().any(|o| o.sent_announced)
            // Sent out, its hash still being computed: the receiver waits for it, so keep
            // the session alive meanwhile.
            || self
                .xfers.outgoing
                .values()
                .any(|o| o.ready && o.hash.is_none() && o.peek_new().is_none())
    }

    /// Acts on the deadlines passed by `now`: gives up the handshake or an idle session,
    /// ends draining, and queues keep-alive and probe PINGs (the probe also resends the
    /// unacknowledged control stream).
    pub fn handle_timeout(&mut self, now: Instant) {
        let now_us = self.now_us(now);
        match &mut self.state {
            State::Handshake(h) => {
                if now_us >= h.deadline_us {
                    let secs = self.cfg.connect_timeout.as_secs_f64();
                    self.state = State::Closed;
                    self.events.push_back(Event::Closed {
                        error: Some(format!(
                            "no answer from the server within {secs:.0} s \
                             (is `hayate serve` running there, and is UDP let through?)"
                        )),
                    });
                }
                return;
            }
            State::Draining { until_us } => {
                if now_us >= *until_us {
                    self.state = State::Closed;
                }
                return;
            }
            State::Closed => return,
            _ => {}
        }
        let idle = self.cfg.idle_timeout.as_micros() as u64;
        if now_us >= self.timers.last_rx_us + idle {
            let open = self.open_transfers();
            let what = if open.is_empty() {
                String::new()
            } else {
                let names: Vec<&str> = open.iter().take(5).map(|(_, p)| p.as_str()).collect();
                let more = match open.len().saturating_sub(5) {
                    0 => String::new(),
                    n => format!(" and {n} more"),
                };
                format!("; unfinished: {}{more}", names.join(", "))
            };
            self.state = State::Closed;
            self.events.push_back(Event::Closed {
                error: Some(format!(
                    "the peer went silent for {} s{what}",
                    self.cfg.idle_timeout.as_secs()
                )),
            });
            return;
        }
        if self.keep_alive_due().is_some_and(|d| now_us >= d) {
            self.timers.ping_pending = true;
            self.timers.keep_alive_us = now_us;
        }
        if self.outstanding() && now_us >= self.pto_deadline() {
            self.ctrl.tx.on_probe_timeout();
            self.stream_on_pto();
            self.timers.ping_pending = true;
            self.timers.pto_count += 1;
            self.timers.pto_base_us = now_us;
        }
    }

    /// While `on`, a PING goes out whenever the peer has been silent for an eighth of the
    /// idle timeout, though nothing awaits an answer: the driver is busy with something the
    /// peer will hear about (hashing a whole file for `--update`), and neither side's idle
    /// timeout may end the session meanwhile. The peer's ACK keeps this side's alive.
    pub fn keep_alive(&mut self, on: bool) {
        self.timers.keep_alive = on;
    }

    /// Whether [`keep_alive`](Self::keep_alive) is on.
    pub fn keeps_alive(&self) -> bool {
        self.timers.keep_alive
    }

    /// When the next keep-alive PING is due, if one is.
    /// Also while a download has been asked for and not answered: the request itself is
    /// retransmitted until acknowledged (the control stream), but the server may take long
    /// to answer (hashing for `--update`), and probing at the RTT's pace meanwhile would
    /// be a storm of pings.
    pub(super) fn keep_alive_due(&self) -> Option<u64> {
        let every = self.cfg.idle_timeout.as_micros() as u64 / 8;
        (self.timers.keep_alive || !self.xfers.pending_gets.is_empty())
            .then(|| self.timers.last_rx_us.max(self.timers.keep_alive_us) + every)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::conn::test_pair::TunnelPair;
    use crate::Stats;

    /// What a probe would show: packets of stream data sent, resent, and PINGs.
    fn sends(s: &Stats) -> (u64, u64, u64) {
        (
            s.data_packets_sent,
            s.data_packets_retransmitted,
            s.pings_sent,
        )
    }

    /// An interactive session through the tunnel on a 20 ms path: a keystroke after a quiet
    /// spell longer than the probe timeout, and its echo, each go exactly once, however
    /// steady the path (RTTVAR shrinks towards nothing, and only the peer's ACK delay in the
    /// probe timeout keeps a delayed ACK from looking late). A probe counted from the last
    /// ACK, long ago, would be due the moment the keystroke went out.
    #[test]
    fn a_write_after_quiet_is_sent_once() {
        let mut p = TunnelPair::new(Duration::from_millis(10));
        for i in 0..40 {
            // Longer than any probe timeout this path has.
            let quiet = if i % 10 == 9 { 5_000 } else { 300 };
            p.run(Duration::from_millis(quiet));
            let before = (sends(&p.c.stats()), sends(&p.server().stats()));
            assert_eq!(p.c.stream_write(b"k"), 1);
            p.run(Duration::from_millis(60));
            let got = p.server().stream_peek().to_vec();
            assert_eq!(got, b"k", "keystroke {i} did not arrive");
            p.server().stream_consume(1);
            assert_eq!(p.server().stream_write(b"K"), 1);
            p.run(Duration::from_millis(60));
            assert_eq!(p.c.stream_peek(), b"K", "echo {i} did not arrive");
            p.c.stream_consume(1);
            p.run(Duration::from_millis(100));
            let (c0, s0) = before;
            let (c1, s1) = (sends(&p.c.stats()), sends(&p.server().stats()));
            assert_eq!(
                (c1.0 - c0.0, c1.1 - c0.1, c1.2 - c0.2),
                (1, 0, 0),
                "keystroke {i}: (data packets, resent, pings) from the client; srtt {} µs, pto {} µs",
                p.c.path.rtt.srtt(),
                p.c.pto_us()
            );
            assert_eq!(
                (s1.0 - s0.0, s1.1 - s0.1, s1.2 - s0.2),
                (1, 0, 0),
                "echo {i}: (data packets, resent, pings) from the server"
            );
        }
        assert!(p.c.stats().rtt_sampled);
    }

    /// The probe still recovers a keystroke lost after a quiet spell: once its timeout
    /// passes, counted from when it was sent, not never.
    #[test]
    fn a_lost_write_after_quiet_is_probed_for() {
        let mut p = TunnelPair::new(Duration::from_millis(10));
        for i in 0..5 {
            p.run(Duration::from_millis(2_000));
            let (sent, resent, _) = sends(&p.c.stats());
            p.lose_to_server = 1;
            assert_eq!(p.c.stream_write(b"k"), 1);
            p.run(Duration::from_millis(200));
            assert_eq!(
                p.server().stream_peek(),
                b"k",
                "lost keystroke {i} not resent"
            );
            p.server().stream_consume(1);
            let c = sends(&p.c.stats());
            assert_eq!((c.0 - sent, c.1 - resent), (2, 1), "keystroke {i}");
        }
    }
}
