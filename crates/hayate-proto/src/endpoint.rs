//! Server side of many sessions on one socket: answers handshakes (without amplification),
//! routes sealed packets to their connection by connection id, and forgets dead sessions.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::conn::{Config, Connection};
use crate::crypto::Psk;
use crate::handshake::{self, HandshakeError};
use crate::wire::{self, AddrFamily, Cid, PacketKind, RejectReason};

/// Half-open sessions are capped so a flood of (replayed) hellos costs bounded memory.
const MAX_HALF_OPEN: usize = 1024;
const HALF_OPEN_TTL: Duration = Duration::from_secs(10);
/// At most this many HelloRejects per second, whoever asks.
const REJECTS_PER_SEC: u32 = 50;

/// What to do with a datagram after the endpoint looked at it.
#[derive(Debug)]
pub enum Route {
    /// Feed it to this connection (`Endpoint::conn_mut`).
    Conn(Cid),
    /// A new session was created (already answered); send `reply` back.
    NewConn(Cid, Vec<u8>),
    /// Send these bytes back to the sender (a repeated ServerHello or a HelloReject).
    Reply(Vec<u8>),
    /// Dropped; the reason was counted.
    Drop,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct EndpointStats {
    pub hellos_accepted: u64,
    pub hellos_repeated: u64,
    pub hellos_rejected_auth: u64,
    pub dropped_malformed: u64,
    pub dropped_unknown_cid: u64,
    pub rejects_rate_limited: u64,
    pub half_open_evicted: u64,
    pub cid_collisions: u64,
}

struct Entry {
    conn: Connection,
    addr: SocketAddr,
    /// For a repeated ClientHello: its random and the reply we gave.
    client_key: (u64, [u8; 32]),
    reply: Vec<u8>,
    created: Instant,
}

pub struct Endpoint {
    psk: Psk,
    cfg: Config,
    conns: HashMap<Cid, Entry>,
    by_hello: HashMap<(u64, [u8; 32]), Cid>,
    stats: EndpointStats,
    reject_window: (Instant, u32),
}

impl Endpoint {
    pub fn new(psk: Psk, cfg: Config, now: Instant) -> Self {
        Endpoint {
            psk,
            cfg,
            conns: HashMap::new(),
            by_hello: HashMap::new(),
            stats: EndpointStats::default(),
            reject_window: (now, 0),
        }
    }

    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    pub fn conn_mut(&mut self, cid: Cid) -> Option<&mut Connection> {
        self.conns.get_mut(&cid).map(|e| &mut e.conn)
    }

    pub fn conn_addr(&self, cid: Cid) -> Option<SocketAddr> {
        self.conns.get(&cid).map(|e| e.addr)
    }

    pub fn cids(&self) -> Vec<Cid> {
        self.conns.keys().copied().collect()
    }

    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Look at a datagram from `from` and decide where it goes.
    pub fn route(&mut self, now: Instant, from: SocketAddr, data: &[u8]) -> Route {
        match wire::peek_kind(data) {
            Ok(PacketKind::Sealed) => match wire::sealed_dest_cid(data) {
                Ok(cid) if self.conns.contains_key(&cid) => {
                    // Follow the client if its address changed (NAT rebinding); the packet
                    // still has to open under the session key before it counts.
                    if let Some(e) = self.conns.get_mut(&cid) {
                        if e.addr != from && e.conn.is_established() {
                            e.addr = from;
                        }
                    }
                    Route::Conn(cid)
                }
                _ => {
                    self.stats.dropped_unknown_cid += 1;
                    Route::Drop
                }
            },
            Ok(PacketKind::ClientHello) => self.on_hello(now, from, data),
            Ok(_) => {
                self.stats.dropped_malformed += 1;
                Route::Drop
            }
            Err(wire::WireError::UnsupportedVersion(_)) => {
                self.reject(now, data, RejectReason::VersionUnsupported)
            }
            Err(_) => {
                self.stats.dropped_malformed += 1;
                Route::Drop
            }
        }
    }

    fn on_hello(&mut self, now: Instant, from: SocketAddr, data: &[u8]) -> Route {
        if let Some((cid, random)) = wire::client_hello_ids(data) {
            if let Some(sid) = self.by_hello.get(&(cid, random)) {
                if let Some(e) = self.conns.get(sid) {
                    // Same hello again (our reply was lost): same answer, never bigger.
                    if data.len() == wire::CLIENT_HELLO_LEN && e.reply.len() < data.len() {
                        self.stats.hellos_repeated += 1;
                        return Route::Reply(e.reply.clone());
                    }
                }
                return Route::Drop;
            }
        }
        match handshake::server_accept(&self.psk, data, self.cfg.mtu) {
            Ok(acc) => {
                self.evict_half_open(now);
                let fam = if from.is_ipv4() {
                    AddrFamily::V4
                } else {
                    AddrFamily::V6
                };
                let sid = acc.server_cid;
                if self.conns.contains_key(&sid) {
                    // A 32-bit cid drawn twice: drop the hello; its retransmission draws anew.
                    self.stats.cid_collisions += 1;
                    return Route::Drop;
                }
                let key = (u64::from(acc.client_cid), acc.client_random);
                let reply = acc.reply.to_vec();
                let conn = Connection::server(self.cfg.clone(), &self.psk, acc, fam, now);
                self.by_hello.insert(key, sid);
                self.conns.insert(
                    sid,
                    Entry {
                        conn,
                        addr: from,
                        client_key: key,
                        reply: reply.clone(),
                        created: now,
                    },
                );
                self.stats.hellos_accepted += 1;
                Route::NewConn(sid, reply)
            }
            Err(HandshakeError::BadMac) => {
                self.stats.hellos_rejected_auth += 1;
                self.reject(now, data, RejectReason::AuthFailed)
            }
            Err(HandshakeError::UnsupportedVersion(_)) => {
                self.reject(now, data, RejectReason::VersionUnsupported)
            }
            Err(_) => {
                self.stats.dropped_malformed += 1;
                Route::Drop
            }
        }
    }

    fn reject(&mut self, now: Instant, data: &[u8], reason: RejectReason) -> Route {
        if now.duration_since(self.reject_window.0) >= Duration::from_secs(1) {
            self.reject_window = (now, 0);
        }
        if self.reject_window.1 >= REJECTS_PER_SEC {
            self.stats.rejects_rate_limited += 1;
            return Route::Drop;
        }
        match handshake::hello_reject(data, reason) {
            Some(r) if r.len() < data.len() => {
                self.reject_window.1 += 1;
                Route::Reply(r.to_vec())
            }
            _ => Route::Drop,
        }
    }

    fn evict_half_open(&mut self, now: Instant) {
        let half_open: Vec<(Cid, Instant)> = self
            .conns
            .iter()
            .filter(|(_, e)| !e.conn.is_established() && !e.conn.is_draining())
            .map(|(k, e)| (*k, e.created))
            .collect();
        let mut expired: Vec<Cid> = half_open
            .iter()
            .filter(|(_, t)| now.duration_since(*t) > HALF_OPEN_TTL)
            .map(|(k, _)| *k)
            .collect();
        if half_open.len() - expired.len() >= MAX_HALF_OPEN {
            let mut rest: Vec<_> = half_open
                .iter()
                .filter(|(k, _)| !expired.contains(k))
                .collect();
            rest.sort_by_key(|(_, t)| *t);
            let n = rest.len() + 1 - MAX_HALF_OPEN;
            expired.extend(rest.iter().take(n).map(|(k, _)| *k));
            self.stats.half_open_evicted += n as u64;
        }
        for k in expired {
            self.remove(k);
        }
    }

    /// Drop a session (closed, or half-open for too long).
    pub fn remove(&mut self, cid: Cid) -> Option<Connection> {
        let e = self.conns.remove(&cid)?;
        self.by_hello.remove(&e.client_key);
        Some(e.conn)
    }

    /// Remove half-open sessions past their time and closed ones; returns removed ids.
    pub fn reap(&mut self, now: Instant) -> Vec<Cid> {
        let dead: Vec<Cid> = self
            .conns
            .iter()
            .filter(|(_, e)| {
                e.conn.is_closed()
                    || (!e.conn.is_established()
                        && !e.conn.is_draining()
                        && now.duration_since(e.created) > HALF_OPEN_TTL)
            })
            .map(|(k, _)| *k)
            .collect();
        for k in &dead {
            self.remove(*k);
        }
        dead
    }
}
