//! The session's lifecycle: handshake (client), waiting for the client's confirmation
//! (server), established, draining after a CLOSE, closed.

use crate::control::Ctrl;
use crate::handshake::ClientHandshake;
use std::time::Instant;

use super::{events::Event, Connection};

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

pub(super) const DRAIN_US: u64 = 2_000_000;

impl Connection {
    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established)
    }

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
}
