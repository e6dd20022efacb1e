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
    Handshake(Box<Hello>),
    /// Server: keys agreed, waiting for the client's first sealed packet.
    AwaitConfirm,
    Established,
    /// CLOSE sent or received; answer stragglers until `until_us`.
    Draining {
        until_us: u64,
    },
    Closed,
}

/// The MTUs a client tries in turn, largest first: its own limit, then the sizes common
/// paths are limited to (Ethernet's 1500, tunnels' around 1400), then the protocol's floor.
pub(super) fn mtu_ladder(mtu: u16) -> Vec<u16> {
    let mut v = vec![mtu.max(wire::MIN_MTU)];
    for m in [1500, 1400, wire::MIN_MTU] {
        if m < *v.last().expect("not empty") {
            v.push(m);
        }
    }
    v
}

/// A client's handshake in flight: path MTU discovery folded into it. Each hello is padded
/// to the MTU it offers, so the path carries it or drops it; one whose answer does not come
/// back by the next retransmission is joined by another attempt one rung down the ladder
/// ([`mtu_ladder`]), and every attempt so far goes out again at each retransmission. The
/// first ServerHello to arrive wins: on a long path the big attempt's answer still comes
/// first, a path that drops big datagrams answers the smaller one. The attempts share the
/// client's cid; the server sees each as a new hello (its random differs) and forgets the
/// ones never confirmed.
pub(super) struct Hello {
    /// One per rung of the ladder, drawn up front (a seeded run repeats exactly).
    pub(super) attempts: Vec<ClientHandshake>,
    /// How many attempts are in play (the first this many).
    pub(super) offered: usize,
    /// Attempts to send now, in order.
    pub(super) due: Vec<usize>,
    pub(super) next_send_us: u64,
    pub(super) backoff_us: u64,
    pub(super) deadline_us: u64,
    /// When each attempt first went out, µs: its answer times the handshake's round trip
    /// (from the first sending: a resent hello's answer reads long, never short).
    pub(super) first_sent_us: Vec<Option<u64>>,
}

impl Hello {
    pub(super) fn new(
        psk: &crate::crypto::Psk,
        mtu: u16,
        rng: &mut crate::rng::Rng,
        deadline_us: u64,
    ) -> Self {
        let ladder = mtu_ladder(mtu);
        let first = ClientHandshake::with_rng(psk, ladder[0], rng);
        let mut attempts = vec![];
        for &m in &ladder[1..] {
            attempts.push(first.retry_smaller(psk, m, rng));
        }
        attempts.insert(0, first);
        Hello {
            first_sent_us: vec![None; attempts.len()],
            attempts,
            offered: 0,
            due: vec![],
            next_send_us: 0,
            backoff_us: 200_000,
            deadline_us,
        }
    }

    /// The attempt to send now, if one is due: at each retransmission time the ladder
    /// gains a rung and every attempt in play is queued.
    pub(super) fn poll_send(&mut self, now_us: u64) -> Option<&ClientHandshake> {
        if self.due.is_empty() {
            if now_us < self.next_send_us {
                return None;
            }
            self.offered = (self.offered + 1).min(self.attempts.len());
            self.due = (0..self.offered).collect();
            self.next_send_us = now_us + self.backoff_us;
            self.backoff_us = (self.backoff_us * 2).min(1_000_000);
        }
        let i = self.due.remove(0);
        self.first_sent_us[i].get_or_insert(now_us);
        Some(&self.attempts[i])
    }

    /// When the next hello goes out.
    pub(super) fn next_send_us(&self, now_us: u64) -> u64 {
        if self.due.is_empty() {
            self.next_send_us
        } else {
            now_us
        }
    }
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
        if self.space.keys.is_some() && !matches!(self.state, State::Handshake(_)) {
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
    /// (or the server's refusal), or noise, for any of the attempts in play. `None` when the
    /// handshake is over; else whether the datagram was taken (see
    /// [`handle_datagram`](Self::handle_datagram)).
    pub(super) fn handle_handshake_datagram(&mut self, now_us: u64, data: &[u8]) -> Option<bool> {
        let State::Handshake(h) = &mut self.state else {
            return None;
        };
        // The attempts share a cid: which one a reply answers shows in its MAC or echoed
        // random, so an attempt it is not for says BadMac and the next is asked.
        let mut last = HandshakeError::UnexpectedPacket;
        if wire::peek_kind(data) == Ok(wire::PacketKind::HelloRetry) {
            for i in 0..h.attempts.len() {
                match h.attempts[i].handle_retry(&self.psk, data) {
                    Ok(true) => {
                        // Answer at once: the server holds no state for us meanwhile.
                        if !h.due.contains(&i) {
                            h.due.push(i);
                        }
                        // The server answers the hello with the token: its round trip
                        // starts with that sending.
                        h.first_sent_us[i] = None;
                        self.stats.hello_retries += 1;
                        return Some(false);
                    }
                    Ok(false) => {
                        self.stats.dropped_unexpected += 1;
                        return Some(false);
                    }
                    Err(e @ (HandshakeError::BadMac | HandshakeError::UnexpectedPacket)) => {
                        last = e
                    }
                    Err(e) => {
                        last = e;
                        break;
                    }
                }
            }
            self.count_handshake_drop(&last);
            return Some(false);
        }
        for (i, hs) in h.attempts.iter().enumerate() {
            match hs.handle(&self.psk, data) {
                Ok(est) => {
                    let rtt_us = h.first_sent_us[i].map(|t| now_us.saturating_sub(t));
                    self.on_server_hello(now_us, est, rtt_us);
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
                    return Some(false);
                }
                Err(e @ (HandshakeError::BadMac | HandshakeError::UnexpectedPacket)) => last = e,
                Err(e) => {
                    last = e;
                    break;
                }
            }
        }
        self.count_handshake_drop(&last);
        Some(false)
    }

    fn count_handshake_drop(&mut self, e: &HandshakeError) {
        match e {
            HandshakeError::BadMac => self.stats.dropped_auth += 1,
            HandshakeError::UnexpectedPacket => self.stats.dropped_unexpected += 1,
            _ => self.stats.dropped_malformed += 1,
        }
    }

    /// Client: the server proved the key; the session takes the agreed MTU and keys, and
    /// the rate controller the handshake's round trip (`rtt_us`).
    fn on_server_hello(&mut self, now_us: u64, est: ClientEstablished, rtt_us: Option<u64>) {
        self.peer_cid = est.server_cid;
        self.path.mtu = est.mtu;
        self.path.block_size = wire::block_size(est.mtu, self.path.fam);
        self.path.payload_limit = wire::udp_payload_limit(est.mtu, self.path.fam);
        if let Some(rtt_us) = rtt_us {
            self.path.cc.on_handshake_rtt(now_us, rtt_us);
        }
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

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use crate::cc::RateControl;
    use crate::conn::{Config, Connection, NoFiles};
    use crate::crypto::Psk;
    use crate::endpoint::{Endpoint, Route};
    use crate::handshake::ClientHandshake;
    use crate::rng::Rng;
    use crate::wire::AddrFamily;

    /// A controller that only records the handshake's round trip it is told.
    #[derive(Debug)]
    struct Recorder(Arc<Mutex<Option<u64>>>);

    impl RateControl for Recorder {
        fn pacing_rate(&self) -> Option<u64> {
            Some(10_000_000)
        }
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn on_handshake_rtt(&mut self, _now_us: u64, rtt_us: u64) {
            *self.0.lock().unwrap() = Some(rtt_us);
        }
    }

    fn hello(c: &mut Connection, now: Instant) -> Vec<u8> {
        let mut buf = vec![0u8; c.max_datagram()];
        let n = c
            .poll_transmit(now, &mut buf, &mut NoFiles)
            .expect("a hello");
        buf.truncate(n);
        buf
    }

    /// The controller learns the handshake's round trip: from the hello's sending to the
    /// server's answer, and, when the server asked for a retry first, from the hello that
    /// carried the token (the answer is to that one).
    #[test]
    fn the_handshakes_round_trip_is_timed_from_the_hello_it_answers() {
        let psk = Psk::from_bytes([9; 32]);
        let t0 = Instant::now();
        let from: SocketAddr = "192.0.2.7:4000".parse().unwrap();
        for over_budget in [false, true] {
            let mut ep = Endpoint::with_rng(psk.clone(), Config::default(), t0, Rng::seeded(2));
            if over_budget {
                // Other clients spend the key-exchange budget (a burst of 32) just before
                // our hello arrives.
                let mut rng = Rng::seeded(3);
                for i in 0..40u16 {
                    let hs = ClientHandshake::with_rng(&psk, 1500, &mut rng);
                    let other = SocketAddr::from(([10, 0, 0, i as u8], 2000 + i));
                    ep.route(t0 + Duration::from_millis(40), other, hs.hello());
                }
            }
            let seen = Arc::new(Mutex::new(None));
            let mut c = Connection::client_with_rng(
                Config::default(),
                &psk,
                AddrFamily::V4,
                t0,
                &mut Rng::seeded(4),
            );
            c.path.cc = Box::new(Recorder(seen.clone()));
            let mut h = hello(&mut c, t0);
            let mut now = t0;
            let mut sent = t0;
            let reply = loop {
                now += Duration::from_millis(40);
                match ep.route(now, from, &h) {
                    Route::NewConn(_, r) => break r,
                    Route::Reply(mut retry) => {
                        now += Duration::from_millis(40);
                        assert!(!c.handle_datagram(now, &mut retry, &mut NoFiles));
                        h = hello(&mut c, now);
                        sent = now;
                    }
                    r => panic!("{r:?}"),
                }
            };
            assert_eq!(over_budget, sent > t0, "a retry only over the budget");
            now += Duration::from_millis(40);
            assert!(c.handle_datagram(now, &mut reply.clone(), &mut NoFiles));
            let rtt = seen.lock().unwrap().expect("told the round trip");
            assert_eq!(
                rtt,
                (now - sent).as_micros() as u64,
                "over budget: {over_budget}"
            );
        }
    }
}
