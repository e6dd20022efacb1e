//! The session's lifecycle: handshake (client), waiting for the client's confirmation
//! (server), established, draining after a CLOSE, closed.

use std::time::Instant;

use crate::control::Ctrl;
use crate::handshake::{ClientEstablished, ClientHandshake, HandshakeError};
use crate::pacer::Pacer;
use crate::transfer::{Layout, Outgoing};
use crate::wire;

use super::{Connection, Event};

pub(super) enum State {
    /// Client waiting for the ServerHello.
    Handshake {
        hs: Box<ClientHandshake>,
        next_send_us: u64,
        backoff_us: u64,
        deadline_us: u64,
    },
    /// Server: keys agreed, waiting for the client's first sealed packet.
    AwaitConfirm,
    Established,
    /// CLOSE sent or received; answer stragglers until `until_us`.
    Draining {
        until_us: u64,
    },
    Closed,
}

/// How long a closed session keeps answering stragglers with its CLOSE, µs.
pub(super) const DRAIN_US: u64 = 2_000_000;

impl Connection {
    /// The handshake is done and the session not closing: transfers can run.
    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established)
    }

    /// The session is over, draining done: it neither sends nor takes anything more.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// No more events can come except by timeouts of a draining session.
    pub fn is_draining(&self) -> bool {
        matches!(self.state, State::Draining { .. } | State::Closed)
    }

    /// Client: no more requests. The packet that says so goes out with whatever control
    /// messages are still unsent (a download's `Verified`), then a CLOSE follows and the
    /// session is over: nothing the server could still say matters, and waiting for its own
    /// CLOSE cost the job a round trip. Lost both, the server's idle timeout ends it.
    pub fn bye(&mut self) {
        if !self.ctrl.bye_sent {
            self.ctrl.bye_sent = true;
            self.ctrl.tx.push(&Ctrl::Bye);
        }
    }

    /// Close now, telling the peer why (code 0 = normal).
    pub fn close(&mut self, now: Instant, code: u64, reason: &str) {
        let now_us = self.now_us(now);
        self.close_us(now_us, code, reason);
    }

    pub(super) fn close_us(&mut self, now_us: u64, code: u64, reason: &str) {
        if self.is_draining() {
            return;
        }
        if self.space.keys.is_some() && !matches!(self.state, State::Handshake { .. }) {
            self.close_frame = Some((code, reason.to_string()));
            self.state = State::Draining {
                until_us: now_us + DRAIN_US,
            };
        } else {
            self.state = State::Closed;
        }
        let error = (code != 0).then(|| reason.to_string());
        self.events.push_back(Event::Closed { error });
    }

    /// A datagram while the client waits for the ServerHello: a HelloRetry, the ServerHello
    /// (or the server's refusal), or noise. `None` when the handshake is over; else whether
    /// the datagram was taken (see [`handle_datagram`](Self::handle_datagram)).
    pub(super) fn handle_handshake_datagram(&mut self, now_us: u64, data: &[u8]) -> Option<bool> {
        let State::Handshake {
            hs, next_send_us, ..
        } = &mut self.state
        else {
            return None;
        };
        if wire::peek_kind(data) == Ok(wire::PacketKind::HelloRetry) {
            match hs.handle_retry(&self.psk, data) {
                Ok(true) => {
                    // Answer at once: the server holds no state for us meanwhile.
                    *next_send_us = now_us;
                    self.stats.hello_retries += 1;
                }
                Ok(false) => self.stats.dropped_unexpected += 1,
                Err(HandshakeError::BadMac) => self.stats.dropped_auth += 1,
                Err(_) => self.stats.dropped_malformed += 1,
            }
            return Some(false);
        }
        match hs.handle(&self.psk, data) {
            Ok(est) => {
                self.on_server_hello(now_us, est);
                return Some(true);
            }
            Err(HandshakeError::Rejected(r)) => {
                let reason = match r {
                    wire::RejectReason::AuthFailed => {
                        "the server refused our key (authentication failed): \
                         client and server key files differ"
                    }
                    wire::RejectReason::VersionUnsupported => {
                        "the server does not speak this protocol version"
                    }
                    wire::RejectReason::Busy => "the server is busy",
                };
                self.state = State::Closed;
                self.events.push_back(Event::Closed {
                    error: Some(reason.to_string()),
                });
            }
            Err(HandshakeError::BadMac) => self.stats.dropped_auth += 1,
            Err(_) => self.stats.dropped_malformed += 1,
        }
        Some(false)
    }

    /// Client: the server proved the key; the session takes the agreed MTU and keys.
    fn on_server_hello(&mut self, now_us: u64, est: ClientEstablished) {
        self.peer_cid = est.server_cid;
        self.path.mtu = est.mtu;
        self.path.block_size = wire::block_size(est.mtu, self.path.fam);
        self.path.payload_limit = wire::udp_payload_limit(est.mtu, self.path.fam);
        self.path.pacer = Pacer::new(self.path.payload_limit);
        self.path.pacer.set_rate(self.path.cc.pacing_rate());
        self.space.keys = Some(est.keys);
        self.state = State::Established;
        self.timers.last_rx_us = now_us;
        self.timers.pto_base_us = now_us;
        // The server trusts us only once a sealed packet opens: say something.
        if !self.ctrl.tx.has_unsent() {
            self.timers.ping_pending = true;
        }
        // Transfers queued before the handshake learned the block size now.
        for o in self.xfers.outgoing.values_mut() {
            o.layout = Layout::new(o.layout.size, self.path.block_size);
            let eager = o.eager;
            *o = Outgoing::new(o.id, o.path.clone(), o.layout);
            o.eager = eager;
            o.finish_empty_hash();
        }
        self.events.push_back(Event::Connected);
    }

    /// Server: the client's first sealed packet opened, so it holds the keys.
    pub(super) fn on_confirmed(&mut self, now_us: u64) {
        self.state = State::Established;
        self.timers.pto_base_us = now_us;
        self.events.push_back(Event::Connected);
    }

    /// An authentic packet while draining: the peer did not hear our CLOSE, say it again.
    pub(super) fn on_packet_while_draining(&mut self) {
        if self.close_frame.is_none() {
            self.close_frame = Some((0, "closed".into()));
        }
    }

    /// CLOSE: the peer ended the session.
    pub(super) fn on_close_frame(&mut self, now_us: u64, code: u64, reason: &str) {
        let error = (code != 0).then(|| format!("peer closed the session: {reason}"));
        self.state = State::Draining {
            until_us: now_us + DRAIN_US,
        };
        self.events.push_back(Event::Closed { error });
    }
}
