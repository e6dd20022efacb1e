//! The two-message handshake (PROTOCOL.md, "Handshake"): PSK-MACed ClientHello, PSK+DH-MACed
//! ServerHello, and the key schedule that turns them into per-session AES-GCM keys.

use std::sync::Arc;

use ring::hkdf::{KeyType, Prk, Salt, HKDF_SHA256};
use ring::hmac;
use x25519_dalek::{PublicKey, StaticSecret};

use crate::crypto::{PacketKey, Psk, SessionKeys};
use crate::rng::Rng;
use crate::wire::{
    client_hello_ids, hello_datagram_len, mtu_proven_by, peek_kind, AddrFamily, Cid, CidShard,
    ClientHello, HelloReject, HelloRetry, PacketKind, RejectReason, ServerHello, WireError,
    CLIENT_HELLO_LEN, CLIENT_HELLO_MAC_OFFSET, HELLO_REJECT_LEN, HELLO_RETRY_LEN, MIN_MTU,
    RETRY_TOKEN_LEN, SERVER_HELLO_LEN, SERVER_HELLO_MAC_OFFSET, VERSION,
};

/// A client follows at most this many HelloRetries in one handshake (a server restarted
/// between two hellos may ask twice; more is a loop or an attack).
const MAX_RETRIES: u8 = 3;

const HELLO_SALT: &[u8] = b"hayate v1 hello";
const LABEL_HELLO_MAC: &[u8] = b"client hello mac";
const LABEL_C2S: &[u8] = b"hayate v1 c2s";
const LABEL_S2C: &[u8] = b"hayate v1 s2c";
const LABEL_SERVER_HELLO: &[u8] = b"hayate v1 server hello";

/// Why a handshake packet was not taken.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// It does not parse.
    #[error("malformed handshake packet: {0}")]
    Malformed(WireError),
    /// Its MAC does not verify.
    #[error("handshake MAC does not verify (peer holds another key, or forged packet)")]
    BadMac,
    /// It speaks a protocol version we do not.
    #[error("unsupported protocol version {0}")]
    UnsupportedVersion(u8),
    /// It is not the packet expected at this point.
    #[error("packet not expected at this point of the handshake")]
    UnexpectedPacket,
    /// The server refused the session.
    #[error("server rejected the hello: {0:?}")]
    Rejected(RejectReason),
}

impl From<WireError> for HandshakeError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::UnsupportedVersion(v) => HandshakeError::UnsupportedVersion(v),
            e => HandshakeError::Malformed(e),
        }
    }
}

struct Len32;

impl KeyType for Len32 {
    fn len(&self) -> usize {
        32
    }
}

fn expand32(prk: &Prk, label: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    prk.expand(&[label], Len32)
        .and_then(|okm| okm.fill(&mut out))
        .expect("32 bytes is a valid HKDF-SHA256 output length");
    out
}

fn hello_mac_key(psk: &Psk) -> hmac::Key {
    let prk = Salt::new(HKDF_SHA256, HELLO_SALT).extract(psk.as_bytes());
    hmac::Key::new(hmac::HMAC_SHA256, &expand32(&prk, LABEL_HELLO_MAC))
}

/// Everything derived from the DH: the traffic keys and the ServerHello MAC key.
struct Schedule {
    c2s: [u8; 32],
    s2c: [u8; 32],
    server_hello_key: hmac::Key,
}

fn schedule(
    psk: &Psk,
    own: &StaticSecret,
    peer_eph: &[u8; 32],
    client_random: &[u8; 32],
    server_random: &[u8; 32],
) -> Result<Schedule, HandshakeError> {
    let dh = own.diffie_hellman(&PublicKey::from(*peer_eph));
    // A low-order peer key makes dh all-zero: no forward secrecy, so refuse it.
    if !dh.was_contributory() {
        return Err(HandshakeError::Malformed(WireError::BadValue(
            "non-contributory X25519 key",
        )));
    }
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(client_random);
    salt[32..].copy_from_slice(server_random);
    let mut ikm = [0u8; 64];
    ikm[..32].copy_from_slice(psk.as_bytes());
    ikm[32..].copy_from_slice(dh.as_bytes());
    let prk = Salt::new(HKDF_SHA256, &salt).extract(&ikm);
    ikm.fill(0);
    Ok(Schedule {
        c2s: expand32(&prk, LABEL_C2S),
        s2c: expand32(&prk, LABEL_S2C),
        server_hello_key: hmac::Key::new(hmac::HMAC_SHA256, &expand32(&prk, LABEL_SERVER_HELLO)),
    })
}

/// What the ServerHello MAC covers: the whole ClientHello, then the ServerHello up to its MAC.
fn server_hello_mac_input(
    client_hello: &[u8],
    server_hello: &[u8],
) -> [u8; CLIENT_HELLO_LEN + SERVER_HELLO_MAC_OFFSET] {
    let mut m = [0u8; CLIENT_HELLO_LEN + SERVER_HELLO_MAC_OFFSET];
    m[..CLIENT_HELLO_LEN].copy_from_slice(client_hello);
    m[CLIENT_HELLO_LEN..].copy_from_slice(&server_hello[..SERVER_HELLO_MAC_OFFSET]);
    m
}

fn random_cid(rng: &mut Rng) -> Cid {
    Cid::from_be_bytes(rng.array())
}

fn eq_ct(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Client side of the handshake. Immutable after `new`: retransmissions resend the same
/// bytes, and a forged or garbled reply cannot disturb it.
pub struct ClientHandshake {
    hello: [u8; CLIENT_HELLO_LEN],
    cid: Cid,
    random: [u8; 32],
    mtu: u16,
    // StaticSecret rather than EphemeralSecret: DH must be repeatable, or the first
    // forged ServerHello would consume the key.
    eph: StaticSecret,
    /// The server's retry token carried by `hello` (zeros: none yet), and how many
    /// HelloRetries were followed.
    token: [u8; RETRY_TOKEN_LEN],
    retries: u8,
}

/// Outcome of a successful client handshake.
#[derive(Debug)]
pub struct ClientEstablished {
    /// The server's connection id: ours to put in every packet we send.
    pub server_cid: Cid,
    /// The MTU agreed on: the least of the client's wish and the server's limit.
    pub mtu: u16,
    /// send = c2s, recv = s2c
    pub keys: SessionKeys,
}

impl ClientHandshake {
    /// Fresh cid, random and ephemeral key; builds and MACs the hello once. An `mtu` below
    /// `MIN_MTU` is raised to it (the protocol has no smaller paths).
    pub fn new(psk: &Psk, mtu: u16) -> Self {
        Self::with_rng(psk, mtu, &mut Rng::os())
    }

    /// [`new`](Self::new) with the cid, random and ephemeral key drawn from `rng`.
    pub fn with_rng(psk: &Psk, mtu: u16, rng: &mut Rng) -> Self {
        Self::attempt(psk, None, mtu, rng)
    }

    /// Another attempt at the same handshake offering a smaller `mtu`, for a path that did
    /// not carry the first: the same cid, a fresh random and key (so the server takes it
    /// for a new hello, not a repeat of the one whose answer never came back).
    pub fn retry_smaller(&self, psk: &Psk, mtu: u16, rng: &mut Rng) -> Self {
        Self::attempt(psk, Some(self.cid), mtu, rng)
    }

    /// A hello with a fresh key and random, and `cid` or a fresh one.
    fn attempt(psk: &Psk, cid: Option<Cid>, mtu: u16, rng: &mut Rng) -> Self {
        let eph = StaticSecret::from(rng.array::<32>());
        let mut hs = ClientHandshake {
            hello: [0; CLIENT_HELLO_LEN],
            cid: cid.unwrap_or_else(|| random_cid(rng)),
            random: rng.array(),
            mtu: mtu.max(MIN_MTU),
            eph,
            token: [0; RETRY_TOKEN_LEN],
            retries: 0,
        };
        hs.build_hello(psk);
        hs
    }

    fn build_hello(&mut self, psk: &Psk) {
        let hello = ClientHello {
            client_cid: self.cid,
            client_random: self.random,
            client_eph: PublicKey::from(&self.eph).to_bytes(),
            mtu: self.mtu,
            token: self.token,
            mac: [0; 32],
        };
        let mut bytes = hello.encode();
        let mac = hmac::sign(&hello_mac_key(psk), &bytes[..CLIENT_HELLO_MAC_OFFSET]);
        bytes[CLIENT_HELLO_MAC_OFFSET..].copy_from_slice(mac.as_ref());
        self.hello = bytes;
    }

    /// Feeds a HelloRetry: `Ok(true)` if it echoes our ids and carries a new token, in which
    /// case [`hello`](Self::hello) now carries that token and should go out at once.
    /// `Ok(false)`: a token we already carry, or more retries than a handshake follows.
    pub fn handle_retry(&mut self, psk: &Psk, datagram: &[u8]) -> Result<bool, HandshakeError> {
        let rt = HelloRetry::decode(datagram)?;
        if rt.client_cid != u64::from(self.cid) {
            return Err(HandshakeError::UnexpectedPacket);
        }
        // As for a reject, the echoed random is its only authenticator.
        if !eq_ct(&rt.client_random, &self.random) {
            return Err(HandshakeError::BadMac);
        }
        if rt.token == self.token || self.retries >= MAX_RETRIES {
            return Ok(false);
        }
        self.retries += 1;
        self.token = rt.token;
        self.build_hello(psk);
        Ok(true)
    }

    /// The ClientHello's fields, unpadded; the same bytes on every retransmission.
    pub fn hello(&self) -> &[u8] {
        &self.hello
    }

    /// Writes the ClientHello datagram into `buf`: the hello zero-padded to the largest UDP
    /// payload of the offered MTU, so that its arrival proves the path carries that much.
    /// Returns its length; `buf` must hold [`hello_datagram_len`] bytes.
    pub fn write_datagram(&self, fam: AddrFamily, buf: &mut [u8]) -> usize {
        let n = hello_datagram_len(self.mtu, fam);
        buf[..CLIENT_HELLO_LEN].copy_from_slice(&self.hello);
        buf[CLIENT_HELLO_LEN..n].fill(0);
        n
    }

    /// [`write_datagram`](Self::write_datagram) into a new buffer.
    pub fn datagram(&self, fam: AddrFamily) -> Vec<u8> {
        let mut b = vec![0; hello_datagram_len(self.mtu, fam)];
        self.write_datagram(fam, &mut b);
        b
    }

    /// The client's connection id, chosen for the hello.
    pub fn client_cid(&self) -> Cid {
        self.cid
    }

    /// The mtu this client offered.
    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    /// Feeds a datagram from the server. `Ok` = established. `Err(Rejected)` = a HelloReject
    /// echoing our cid and random. Anything else is an error the caller counts and ignores
    /// while it keeps waiting: `BadMac` (forged, or a server with another key),
    /// `Malformed`, `UnexpectedPacket` (not for us, or not a handshake reply).
    pub fn handle(&self, psk: &Psk, datagram: &[u8]) -> Result<ClientEstablished, HandshakeError> {
        match peek_kind(datagram)? {
            PacketKind::ServerHello => {
                let sh = ServerHello::decode(datagram)?;
                if sh.client_cid != self.cid {
                    return Err(HandshakeError::UnexpectedPacket);
                }
                let s = schedule(
                    psk,
                    &self.eph,
                    &sh.server_eph,
                    &self.random,
                    &sh.server_random,
                )
                .map_err(|_| HandshakeError::BadMac)?;
                hmac::verify(
                    &s.server_hello_key,
                    &server_hello_mac_input(&self.hello, datagram),
                    &sh.mac,
                )
                .map_err(|_| HandshakeError::BadMac)?;
                if sh.mtu > self.mtu {
                    return Err(HandshakeError::Malformed(WireError::BadValue(
                        "server mtu above the offered one",
                    )));
                }
                // The padding proves the way back carries the agreed size. IPv6's header
                // size is assumed, the larger: a server on a dual-stack socket sees an IPv4
                // client as IPv6 and pads 20 bytes less.
                if mtu_proven_by(datagram.len(), AddrFamily::V6) < sh.mtu {
                    return Err(HandshakeError::Malformed(WireError::BadValue(
                        "server hello shorter than the mtu it agrees",
                    )));
                }
                Ok(ClientEstablished {
                    server_cid: sh.server_cid,
                    mtu: sh.mtu,
                    keys: SessionKeys {
                        send: Arc::new(PacketKey::new(&s.c2s)),
                        recv: Arc::new(PacketKey::new(&s.s2c)),
                    },
                })
            }
            PacketKind::HelloReject => {
                let rj = HelloReject::decode(datagram)?;
                if rj.client_cid != u64::from(self.cid) {
                    return Err(HandshakeError::UnexpectedPacket);
                }
                // The echoed random is the reject's only authenticator.
                if !eq_ct(&rj.client_random, &self.random) {
                    return Err(HandshakeError::BadMac);
                }
                Err(HandshakeError::Rejected(rj.reason))
            }
            PacketKind::ClientHello | PacketKind::Sealed | PacketKind::HelloRetry => {
                Err(HandshakeError::UnexpectedPacket)
            }
        }
    }
}

/// Outcome of a verified ClientHello on the server.
#[derive(Debug)]
pub struct ServerAccept {
    /// The client's connection id (the one the server puts in its packets).
    pub client_cid: Cid,
    /// The server's connection id for this session, freshly drawn.
    pub server_cid: Cid,
    /// The ClientHello's random, which identifies a repeated hello.
    pub client_random: [u8; 32],
    /// Negotiated: the least of the client's offer, the server's limit and what the hello's
    /// size proved the path carries (never below `MIN_MTU`).
    pub mtu: u16,
    /// The ServerHello's fields. Cache them: a retransmitted ClientHello must get these same
    /// bytes (calling `server_accept` again would make a new session).
    pub reply: [u8; SERVER_HELLO_LEN],
    /// Length of the ServerHello datagram: `reply` zero-padded to the largest UDP payload of
    /// the agreed MTU, never longer than the hello (see [`reply_datagram`]).
    ///
    /// [`reply_datagram`]: Self::reply_datagram
    pub reply_len: usize,
    /// send = s2c, recv = c2s
    pub keys: SessionKeys,
}

impl ServerAccept {
    /// The ServerHello datagram: [`reply`](Self::reply) padded to
    /// [`reply_len`](Self::reply_len).
    pub fn reply_datagram(&self) -> Vec<u8> {
        padded_reply(&self.reply, self.reply_len)
    }
}

/// A ServerHello's fields zero-padded to `len` bytes.
pub fn padded_reply(reply: &[u8; SERVER_HELLO_LEN], len: usize) -> Vec<u8> {
    let mut b = vec![0; len.max(SERVER_HELLO_LEN)];
    b[..SERVER_HELLO_LEN].copy_from_slice(reply);
    b
}

/// Verifies a ClientHello datagram that came over `fam` and builds the ServerHello with
/// fresh cid, random and ephemeral key. `mtu = min(client's, max_mtu, proven)`, where
/// `proven` is what the datagram's own size shows the path carries; never below `MIN_MTU`.
/// `BadMac` / `UnsupportedVersion` are worth a [`hello_reject`]; `Malformed` is dropped.
pub fn server_accept(
    psk: &Psk,
    hello: &[u8],
    max_mtu: u16,
    fam: AddrFamily,
) -> Result<ServerAccept, HandshakeError> {
    server_accept_with(psk, hello, max_mtu, fam, &mut Rng::os())
}

/// Checks a ClientHello's shape and MAC, the cheap part of [`server_accept`] (no key
/// exchange), and returns it decoded.
pub fn verify_client_hello(psk: &Psk, hello: &[u8]) -> Result<ClientHello, HandshakeError> {
    let ch = ClientHello::decode(hello)?;
    hmac::verify(
        &hello_mac_key(psk),
        &hello[..CLIENT_HELLO_MAC_OFFSET],
        &ch.mac,
    )
    .map_err(|_| HandshakeError::BadMac)?;
    Ok(ch)
}

/// [`server_accept`] with the cid, random and ephemeral key drawn from `rng`.
pub fn server_accept_with(
    psk: &Psk,
    hello: &[u8],
    max_mtu: u16,
    fam: AddrFamily,
    rng: &mut Rng,
) -> Result<ServerAccept, HandshakeError> {
    let ch = verify_client_hello(psk, hello)?;
    accept_verified(psk, &ch, hello, max_mtu, fam, CidShard::ALL, rng)
}

/// The key exchange of [`server_accept_with`] for a hello that [`verify_client_hello`]
/// already passed (`ch` is `hello` decoded).
pub fn accept_verified(
    psk: &Psk,
    ch: &ClientHello,
    hello: &[u8],
    max_mtu: u16,
    fam: AddrFamily,
    shard: CidShard,
    rng: &mut Rng,
) -> Result<ServerAccept, HandshakeError> {
    let eph = StaticSecret::from(rng.array::<32>());
    let mtu = ch
        .mtu
        .min(max_mtu)
        .min(mtu_proven_by(hello.len(), fam))
        .max(MIN_MTU);
    let mut sh = ServerHello {
        client_cid: ch.client_cid,
        server_cid: shard.place(random_cid(rng)),
        server_random: rng.array(),
        server_eph: PublicKey::from(&eph).to_bytes(),
        mtu,
        mac: [0; 32],
    };
    let s = schedule(
        psk,
        &eph,
        &ch.client_eph,
        &ch.client_random,
        &sh.server_random,
    )?;
    let unsigned = sh.encode();
    let mac = hmac::sign(
        &s.server_hello_key,
        &server_hello_mac_input(&hello[..CLIENT_HELLO_LEN], &unsigned),
    );
    sh.mac.copy_from_slice(mac.as_ref());
    Ok(ServerAccept {
        client_cid: ch.client_cid,
        server_cid: sh.server_cid,
        client_random: ch.client_random,
        mtu: sh.mtu,
        reply: sh.encode(),
        // Never longer than the hello: no amplification.
        reply_len: hello_datagram_len(sh.mtu, fam).min(hello.len()),
        keys: SessionKeys {
            send: Arc::new(PacketKey::new(&s.s2c)),
            recv: Arc::new(PacketKey::new(&s.c2s)),
        },
    })
}

/// A HelloRetry carrying `token` for `hello`, if it is shaped like a ClientHello (always
/// smaller than the hello it answers).
pub fn hello_retry(hello: &[u8], token: [u8; RETRY_TOKEN_LEN]) -> Option<[u8; HELLO_RETRY_LEN]> {
    let (client_cid, client_random) = client_hello_ids(hello)?;
    Some(
        HelloRetry {
            client_cid,
            client_random,
            token,
        }
        .encode(),
    )
}

/// A HelloReject for `hello` (which failed with `BadMac` or `UnsupportedVersion`), if it is
/// shaped enough like a ClientHello to echo its ids. Rate limiting is the caller's job.
pub fn hello_reject(hello: &[u8], reason: RejectReason) -> Option<[u8; HELLO_REJECT_LEN]> {
    let (client_cid, client_random) = client_hello_ids(hello)?;
    Some(
        HelloReject {
            client_cid,
            client_random,
            reason,
            max_version: u16::from(VERSION),
        }
        .encode(),
    )
}
