//! Deadlines: the idle timeout, the probe timeout (PTO), keep-alive PINGs, and the next
//! moment anything is due (`poll_timeout`).

use std::time::{Duration, Instant};

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
                    || self.ctrl.tx.has_sendable()
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
                if self.has_data_to_send() {
                    match self.path.pacer.next_send_time(now_us) {
                        Some(x) => min(x),
                        None => min(now_us),
                    }
                }
            }
        }
        t.map(at)
    }

    pub(super) fn pto_deadline(&self) -> u64 {
        let backoff = 1u64 << self.timers.pto_count.min(6);
        // Backing off stops at an eighth of the idle timeout: a probe at most every 1.9 s of
        // the default 15 s. Doubling on to 64 probe timeouts left a session that had lost
        // its last few probes (30 % loss each way) a single probe more before the timeout
        // ended it, all data out and no loss map back to say what to resend.
        let most = (self.cfg.idle_timeout.as_micros() as u64 / 8).max(self.path.rtt.pto());
        self.timers.pto_base_us + (self.path.rtt.pto() * backoff).min(most)
    }

    /// Something sent is still awaiting an answer from the peer.
    pub(super) fn outstanding(&self) -> bool {
        self.ctrl.tx.has_unacked()
            || self.stream_outstanding()
            || self
                .xfers.outgoing
                .values()
                .any(|o| o.ready && o.next_new > 0 && !o.all_acked())
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
