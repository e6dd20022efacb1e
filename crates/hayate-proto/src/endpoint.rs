//! Server side of many sessions on one socket: answers handshakes (without amplification, and
//! with a stateless retry when hellos come faster than it spends key exchanges on), routes
//! sealed packets to their connection by connection id, moves a session to a new client
//! address only after that address proves it (path validation), and forgets dead sessions.
//!
//! Nothing unauthenticated changes a session: a datagram from an address other than the
//! session's is fed to the connection, and only if it opens under the session key and is not
//! a replay does the endpoint challenge that address (a PATH_CHALLENGE, RFC 9000 section 8.2).
//! Until the answer comes back from there, the session stays where it was and the new
//! address gets at most [`PATH_AMPLIFICATION`] times the bytes it sent.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::conn::{BlockSink, Config, Connection};
use crate::crypto::{CryptoError, Opened, Psk};
use crate::handshake::{self, HandshakeError};
use crate::retry::RetryTokens;
use crate::rng::Rng;
use crate::wire::{self, AddrFamily, Cid, CidShard, PacketKind, RejectReason, PATH_TOKEN_LEN};

/// Half-open sessions are capped so a flood of (replayed) hellos costs bounded memory.
const MAX_HALF_OPEN: usize = 1024;
const HALF_OPEN_TTL: Duration = Duration::from_secs(10);
/// At most this many HelloRejects per second, whoever asks.
const REJECTS_PER_SEC: u32 = 50;
/// Key exchanges per second (and the burst) spent on hellos from addresses that have not
/// proven themselves with a retry token. An X25519 accept costs ~0.1 ms of CPU here, so this
/// is about 2 % of a core; beyond it every hello gets a HelloRetry, which costs a MAC.
const HELLO_BUDGET_PER_SEC: f64 = 200.0;
const HELLO_BURST: f64 = 32.0;
/// At most this many HelloRetries per second: beyond it a flood costs a parse and a drop (a
/// client whose hello is dropped sends it again).
const REPLIES_PER_SEC: u32 = 20_000;
/// At most this many bytes of repeated ServerHellos per second (about 680 of Ethernet's
/// size). A repeat is padded to the agreed MTU, up to the hello's own size (it must prove
/// the way back again), so a flood of replayed hellos would otherwise be reflected byte for
/// byte. A client needs a repeat only when its first reply was lost, and each rung of its
/// MTU ladder is a new hello, answered within the key-exchange budget.
const REPEATED_REPLY_BYTES_PER_SEC: u32 = 1_000_000;
/// A new address gets at most this many times the bytes it sent until it answers a
/// challenge (RFC 9000 section 8).
pub const PATH_AMPLIFICATION: u64 = 3;
/// A challenge to the same address is repeated no sooner than this.
const PATH_PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// Bytes of a sealed datagram carrying only a PATH_CHALLENGE.
const PATH_CHALLENGE_LEN: usize = wire::SEALED_HEADER_LEN + 1 + PATH_TOKEN_LEN + wire::TAG_LEN;

/// What to do with a datagram after the endpoint looked at it.
#[derive(Debug)]
pub enum Route {
    /// Feed it to this connection with [`Endpoint::handle`].
    Conn(Cid),
    /// A new session was created (already answered); send `reply` back.
    NewConn(Cid, Vec<u8>),
    /// Send these bytes back to the sender (a repeated ServerHello, a HelloRetry or a
    /// HelloReject).
    Reply(Vec<u8>),
    /// Dropped; the reason was counted.
    Drop,
}

/// What the endpoint did with datagrams that did not simply go to a session.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct EndpointStats {
    /// ClientHellos that started a session.
    pub hellos_accepted: u64,
    /// Repeated ClientHellos of a session already started, answered with its cached
    /// ServerHello.
    pub hellos_repeated: u64,
    /// ClientHellos whose MAC did not verify (another key); a reject answers them, within
    /// its per-second cap.
    pub hellos_rejected_auth: u64,
    /// Hellos answered with a HelloRetry (over the key-exchange budget, no valid token).
    pub hellos_retried: u64,
    /// Hellos whose retry token was not ours, expired, or for another address.
    pub retry_tokens_invalid: u64,
    /// Datagrams that did not parse.
    pub dropped_malformed: u64,
    /// Sealed packets for a connection id no session has.
    pub dropped_unknown_cid: u64,
    /// Datagrams for a session from another address that did not open or were replays.
    pub dropped_other_path: u64,
    /// Rejects not sent because more than the per-second cap were due.
    pub rejects_rate_limited: u64,
    /// Hellos dropped because more retries or repeated replies than the per-second cap
    /// were due.
    pub retries_rate_limited: u64,
    /// Sessions still awaiting their client's first sealed packet, the oldest dropped to
    /// make room for new ones (those past their time to live are not counted).
    pub half_open_evicted: u64,
    /// Hellos dropped because the connection id drawn for them was taken (the
    /// retransmitted hello draws anew).
    pub cid_collisions: u64,
    /// PATH_CHALLENGEs sent to new addresses.
    pub path_challenges_sent: u64,
    /// Their bytes.
    pub path_challenge_bytes: u64,
    /// Sessions moved to a new address after it answered a challenge.
    pub paths_validated: u64,
}

/// A new address a session's peer seems to use, being validated.
struct PathProbe {
    addr: SocketAddr,
    token: [u8; PATH_TOKEN_LEN],
    /// Bytes of authenticated datagrams from it, and bytes we sent to it.
    received: u64,
    sent: u64,
    last_sent: Option<Instant>,
}

struct Entry {
    conn: Connection,
    addr: SocketAddr,
    /// For a repeated ClientHello: its random and the reply we gave (its fields, and the
    /// length they were padded to).
    client_key: (u64, [u8; 32]),
    reply: [u8; wire::SERVER_HELLO_LEN],
    reply_len: usize,
    created: Instant,
    probe: Option<PathProbe>,
}

/// Counts replies within the current second.
struct PerSecond {
    start: Instant,
    count: u32,
}

impl PerSecond {
    fn new(now: Instant) -> Self {
        PerSecond {
            start: now,
            count: 0,
        }
    }

    /// Whether one more fits under `limit` this second (and counts it if so).
    fn admit(&mut self, now: Instant, limit: u32) -> bool {
        self.admit_n(now, 1, limit)
    }

    /// Whether `n` more fit under `limit` this second (and counts them if so).
    fn admit_n(&mut self, now: Instant, n: u32, limit: u32) -> bool {
        if now.saturating_duration_since(self.start) >= Duration::from_secs(1) {
            *self = PerSecond::new(now);
        }
        if self.count.saturating_add(n) > limit {
            return false;
        }
        self.count += n;
        true
    }
}

/// A token bucket of key exchanges: `share` of the server's (one of its threads).
struct HelloBudget {
    tokens: f64,
    last: Instant,
    share: f64,
}

impl HelloBudget {
    fn burst(&self) -> f64 {
        (HELLO_BURST * self.share).max(1.0)
    }

    fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * HELLO_BUDGET_PER_SEC * self.share).min(self.burst());
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A server's sessions on one socket (see the module doc).
pub struct Endpoint {
    psk: Psk,
    cfg: Config,
    /// Ordered, so sessions are visited in the same order on every run.
    conns: BTreeMap<Cid, Entry>,
    by_hello: HashMap<(u64, [u8; 32]), Cid>,
    stats: EndpointStats,
    reject_window: PerSecond,
    reply_window: PerSecond,
    repeat_bytes: PerSecond,
    rng: Rng,
    tokens: RetryTokens,
    budget: HelloBudget,
    /// The thread of a server's this endpoint is, which its cids say.
    shard: CidShard,
}

impl Endpoint {
    /// An endpoint drawing its randomness from the OS.
    pub fn new(psk: Psk, cfg: Config, now: Instant) -> Self {
        Self::with_rng(psk, cfg, now, Rng::os())
    }

    /// An endpoint drawing cids, handshake randoms, keys and tokens from `rng` (seeded: a
    /// simulated run repeats exactly).
    pub fn with_rng(psk: Psk, cfg: Config, now: Instant, mut rng: Rng) -> Self {
        let tokens = RetryTokens::new(&mut rng, now);
        Endpoint {
            psk,
            cfg,
            conns: BTreeMap::new(),
            by_hello: HashMap::new(),
            stats: EndpointStats::default(),
            reject_window: PerSecond::new(now),
            reply_window: PerSecond::new(now),
            repeat_bytes: PerSecond::new(now),
            rng,
            tokens,
            budget: HelloBudget {
                tokens: HELLO_BURST,
                last: now,
                share: 1.0,
            },
            shard: CidShard::ALL,
        }
    }

    /// Makes this endpoint thread `shard` of a server's: the sessions it accepts get cids
    /// of that thread's class, so that the kernel routes their packets to its socket, and
    /// its limits on hellos, replies and half-open sessions are its share of the server's
    /// (hellos are spread over the threads by address).
    pub fn set_shard(&mut self, shard: CidShard) {
        self.shard = shard;
        self.budget.share = 1.0 / f64::from(shard.count());
        self.budget.tokens = self.budget.tokens.min(self.budget.burst());
    }

    /// This thread's share of a server-wide `limit` (at least 1).
    fn part<T: From<u8> + std::ops::Div<Output = T> + Ord>(&self, limit: T) -> T {
        (limit / T::from(self.shard.count())).max(T::from(1))
    }

    /// What the endpoint did with datagrams that did not simply go to a session.
    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    /// The session with connection id `cid`.
    pub fn conn_mut(&mut self, cid: Cid) -> Option<&mut Connection> {
        self.conns.get_mut(&cid).map(|e| &mut e.conn)
    }

    /// Where the session's datagrams go: the client's address as last validated.
    pub fn conn_addr(&self, cid: Cid) -> Option<SocketAddr> {
        self.conns.get(&cid).map(|e| e.addr)
    }

    /// The sessions, in cid order.
    pub fn cids(&self) -> Vec<Cid> {
        self.conns.keys().copied().collect()
    }

    /// The number of sessions.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether there are no sessions.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Look at a datagram from `from` and decide where it goes. Changes no session.
    pub fn route(&mut self, now: Instant, from: SocketAddr, data: &[u8]) -> Route {
        match wire::peek_kind(data) {
            Ok(PacketKind::Sealed) => match wire::sealed_dest_cid(data) {
                Ok(cid) if self.conns.contains_key(&cid) => Route::Conn(cid),
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

    /// Feeds a datagram that [`route`](Self::route) sent to session `cid`. If it came from
    /// an address other than the session's and was authentic and fresh, the session's peer
    /// may have moved: returns a PATH_CHALLENGE to send back to `from` (within its
    /// amplification budget), and moves the session there once `from` answers one.
    pub fn handle(
        &mut self,
        cid: Cid,
        now: Instant,
        arrived: Instant,
        from: SocketAddr,
        data: &mut [u8],
        sink: &mut dyn BlockSink,
    ) -> Option<Vec<u8>> {
        self.handle_input(cid, now, arrived, from, data, None, sink)
    }

    /// [`handle`](Self::handle) for a datagram the driver opened already under the
    /// session's receive key, or failed to (see `Connection::handle_opened_at`).
    #[allow(clippy::too_many_arguments)]
    pub fn handle_opened(
        &mut self,
        cid: Cid,
        now: Instant,
        arrived: Instant,
        from: SocketAddr,
        data: &mut [u8],
        opened: Result<Opened, CryptoError>,
        sink: &mut dyn BlockSink,
    ) -> Option<Vec<u8>> {
        self.handle_input(cid, now, arrived, from, data, Some(opened), sink)
    }

    #[allow(clippy::too_many_arguments)]
    fn handle_input(
        &mut self,
        cid: Cid,
        now: Instant,
        arrived: Instant,
        from: SocketAddr,
        data: &mut [u8],
        opened: Option<Result<Opened, CryptoError>>,
        sink: &mut dyn BlockSink,
    ) -> Option<Vec<u8>> {
        let e = self.conns.get_mut(&cid)?;
        let len = data.len() as u64;
        let taken = match opened {
            None => e.conn.handle_datagram_at(now, arrived, data, sink),
            Some(o) => e.conn.handle_opened_at(now, arrived, data, o, sink),
        };
        if from == e.addr {
            // An answer that came back by the old path validates nothing.
            if taken {
                e.conn.take_path_response();
            }
            return None;
        }
        if !taken {
            self.stats.dropped_other_path += 1;
            return None;
        }
        if e.probe.as_ref().is_none_or(|p| p.addr != from) {
            e.probe = Some(PathProbe {
                addr: from,
                token: self.rng.array(),
                received: 0,
                sent: 0,
                last_sent: None,
            });
        }
        let p = e.probe.as_mut().expect("just set");
        p.received += len;
        if e.conn.take_path_response() == Some(p.token) {
            e.addr = from;
            e.probe = None;
            self.stats.paths_validated += 1;
            return None;
        }
        let due = p
            .last_sent
            .is_none_or(|t| now.saturating_duration_since(t) >= PATH_PROBE_INTERVAL);
        let fits = p.sent + PATH_CHALLENGE_LEN as u64 <= PATH_AMPLIFICATION * p.received;
        if !due || !fits {
            return None;
        }
        let mut buf = vec![0u8; e.conn.max_datagram()];
        let n = e.conn.seal_path_challenge(now, p.token, &mut buf)?;
        debug_assert_eq!(n, PATH_CHALLENGE_LEN);
        buf.truncate(n);
        p.sent += n as u64;
        p.last_sent = Some(now);
        self.stats.path_challenges_sent += 1;
        self.stats.path_challenge_bytes += n as u64;
        Some(buf)
    }

    fn on_hello(&mut self, now: Instant, from: SocketAddr, data: &[u8]) -> Route {
        if let Some((cid, random)) = wire::client_hello_ids(data) {
            if let Some(sid) = self.by_hello.get(&(cid, random)) {
                if let Some(e) = self.conns.get(sid) {
                    // Same hello again (our reply was lost): same answer, never bigger.
                    let n = e.reply_len as u32;
                    if e.reply_len <= data.len()
                        && self.repeat_bytes.admit_n(
                            now,
                            n,
                            self.part(REPEATED_REPLY_BYTES_PER_SEC),
                        )
                    {
                        self.stats.hellos_repeated += 1;
                        return Route::Reply(handshake::padded_reply(&e.reply, e.reply_len));
                    }
                }
                return Route::Drop;
            }
        }
        // Under a flood the cheapest answer wins: a hello without a valid token beyond the
        // budget gets a retry before its MAC is checked (the token costs a short HMAC, the
        // MAC one over 1168 bytes), and retries themselves are capped per second.
        let Ok(ch) = wire::ClientHello::decode(data) else {
            return self.hello_unverified(now, data);
        };
        let ids = (u64::from(ch.client_cid), ch.client_random);
        let has_token = ch.token != [0; wire::RETRY_TOKEN_LEN];
        let proven = has_token && self.tokens.check(now, from, ids.0, &ids.1, &ch.token);
        if has_token && !proven {
            self.stats.retry_tokens_invalid += 1;
        }
        if !proven && !self.budget.take(now) {
            if !self.reply_window.admit(now, self.part(REPLIES_PER_SEC)) {
                self.stats.retries_rate_limited += 1;
                return Route::Drop;
            }
            let token = self.tokens.mint(now, from, ids.0, &ids.1);
            return match handshake::hello_retry(data, token) {
                Some(r) if r.len() < data.len() => {
                    self.stats.hellos_retried += 1;
                    Route::Reply(r.to_vec())
                }
                _ => Route::Drop,
            };
        }
        if handshake::verify_client_hello(&self.psk, data).is_err() {
            self.stats.hellos_rejected_auth += 1;
            return self.reject(now, data, RejectReason::AuthFailed);
        }
        let fam = AddrFamily::of(&from);
        match handshake::accept_verified(
            &self.psk,
            &ch,
            data,
            self.cfg.mtu,
            fam,
            self.shard,
            &mut self.rng,
        ) {
            Ok(acc) => {
                self.evict_half_open(now);
                let sid = acc.server_cid;
                if self.conns.contains_key(&sid) {
                    // A 32-bit cid drawn twice: drop the hello; its retransmission draws anew.
                    self.stats.cid_collisions += 1;
                    return Route::Drop;
                }
                let reply = acc.reply_datagram();
                let (fields, reply_len) = (acc.reply, acc.reply_len);
                let conn = Connection::server(self.cfg.clone(), &self.psk, acc, fam, now);
                self.by_hello.insert(ids, sid);
                self.conns.insert(
                    sid,
                    Entry {
                        conn,
                        addr: from,
                        client_key: ids,
                        reply: fields,
                        reply_len,
                        created: now,
                        probe: None,
                    },
                );
                self.stats.hellos_accepted += 1;
                Route::NewConn(sid, reply)
            }
            Err(_) => {
                self.stats.dropped_malformed += 1;
                Route::Drop
            }
        }
    }

    /// A hello that does not decode: a version we do not speak gets a reject, anything
    /// else is dropped.
    fn hello_unverified(&mut self, now: Instant, data: &[u8]) -> Route {
        match handshake::verify_client_hello(&self.psk, data) {
            Err(HandshakeError::UnsupportedVersion(_)) => {
                self.reject(now, data, RejectReason::VersionUnsupported)
            }
            _ => {
                self.stats.dropped_malformed += 1;
                Route::Drop
            }
        }
    }

    fn reject(&mut self, now: Instant, data: &[u8], reason: RejectReason) -> Route {
        if !self.reject_window.admit(now, self.part(REJECTS_PER_SEC)) {
            self.stats.rejects_rate_limited += 1;
            return Route::Drop;
        }
        match handshake::hello_reject(data, reason) {
            Some(r) if r.len() < data.len() => Route::Reply(r.to_vec()),
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
        let most = self.part(MAX_HALF_OPEN);
        if half_open.len() - expired.len() >= most {
            let mut rest: Vec<_> = half_open
                .iter()
                .filter(|(k, _)| !expired.contains(k))
                .collect();
            rest.sort_by_key(|(k, t)| (*t, *k));
            let n = rest.len() + 1 - most;
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
