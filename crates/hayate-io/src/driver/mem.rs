//! Memory-to-memory sessions for `hayate perf --hayate`: hayate's real transport (handshake,
//! sealing, pacing, rate control, loss maps, end-to-end BLAKE3) on real UDP sockets, with a
//! generated pattern instead of files on the sending side and a checking, counting sink on
//! the receiving side. What a `hayate cp` would get on a path, minus the disk.
//!
//! Both sides, [`run_client`] and [`run_server`], run on the driver's one loop
//! (`engine::run`) as `hayate cp` and `hayate serve` do; only the policy (`Probe`) and the
//! storage (`Mem`) differ.
//!
//! A test: the sender sends virtual files one after another, [`OPEN_FILES`] open at once so
//! the path never idles between two files, each sized to about [`FILE_SECS`] at the current
//! pacing rate. `time` after the session is established it aborts what is still open (reason
//! [`END_REASON`]), and the session ends. The receiver checks every block against the pattern
//! as it arrives (counting mismatches) and hashes each file in order, so every file that
//! completes is verified end to end with BLAKE3 exactly as a real transfer is.
//!
//! Upload (client sends): the client `send_file`s `hayate-perf/<n>`. Download (server sends):
//! the client `request`s `hayate-perf/<n>` and the server `offer`s a virtual file of its
//! choosing. A server built for one direction refuses the other.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hayate_proto::crypto::Psk;
use hayate_proto::wire::{AddrFamily, Cid};
use hayate_proto::{
    BlockSink, BlockSource, Config, Connection, Endpoint, Event, Stats, StorageError, XferId,
};

use super::engine::{self, Flow, Net, Policy, Session};
use super::link::Links;
use super::StopFlag;
use crate::udp::UdpSocket;

/// Reason the sender gives when it aborts its open files at the end of the test.
pub const END_REASON: &str = "hayate perf: time is up";
/// Names of the virtual files: this prefix and a number.
pub const PATH_PREFIX: &str = "hayate-perf/";
/// Files open at once on the sender.
pub const OPEN_FILES: usize = 3;
/// Each file holds about this much time at the pacing rate when it starts.
pub const FILE_SECS: f64 = 0.5;
/// Smallest virtual file in bytes (1 MiB), however slow the pacing rate.
pub const MIN_FILE: u64 = 1 << 20;
/// Largest virtual file in bytes (1 GiB); also the size when the sender is not paced.
pub const MAX_FILE: u64 = 1 << 30;
/// A receiver refuses offers larger than this (they cost a bitset of their blocks).
pub const MAX_OFFER: u64 = 64 << 30;
/// The caller's observer runs at least this often.
const OBSERVE_EVERY: Duration = Duration::from_millis(20);
/// In-order data is hashed in batches of this size (BLAKE3's SIMD path wants big inputs).
const HASH_BATCH: usize = 256 * 1024;

/// The deterministic content of the virtual files: each aligned 8-byte word is a mix of its
/// index and the file's seed, so a block checked at the wrong offset or of the wrong file
/// does not match. Cheap to generate and to check, no allocation.
pub mod pattern {
    const MUL: u64 = 0x9E37_79B9_7F4A_7C15;

    #[inline]
    fn word(seed: u64, w: u64) -> [u8; 8] {
        let x = (w ^ seed).wrapping_mul(MUL);
        (x ^ (x >> 29)).to_le_bytes()
    }

    /// A file's seed, from its name (FNV-1a).
    pub fn seed(name: &str) -> u64 {
        name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// Writes the pattern's bytes `offset..offset + buf.len()` into `buf`.
    pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
        let s = (offset % 8) as usize;
        let head = if s == 0 { 0 } else { (8 - s).min(buf.len()) };
        let (h, rest) = buf.split_at_mut(head);
        if head > 0 {
            h.copy_from_slice(&word(seed, offset / 8)[s..s + head]);
        }
        let mut w = (offset + head as u64) / 8;
        let mut chunks = rest.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&word(seed, w));
            w += 1;
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let n = tail.len();
            tail.copy_from_slice(&word(seed, w)[..n]);
        }
    }

    /// Whether `data` equals the pattern's bytes at `offset`.
    pub fn matches(seed: u64, offset: u64, data: &[u8]) -> bool {
        let s = (offset % 8) as usize;
        let head = if s == 0 { 0 } else { (8 - s).min(data.len()) };
        let (h, rest) = data.split_at(head);
        if head > 0 && h != &word(seed, offset / 8)[s..s + head] {
            return false;
        }
        let mut w = (offset + head as u64) / 8;
        let mut chunks = rest.chunks_exact(8);
        for c in &mut chunks {
            if c != word(seed, w) {
                return false;
            }
            w += 1;
        }
        let tail = chunks.remainder();
        tail.is_empty() || tail == &word(seed, w)[..tail.len()]
    }
}

/// What a test is configured with (the same on both sides, except `proto`).
#[derive(Debug, Clone)]
pub struct MemOptions {
    /// The key both sides hold (the client's handshake key, the server endpoint's key).
    pub psk: Psk,
    /// Client: MTU and rate wish (a cap, a floor, adaptive or fixed). Server: what it allows.
    pub proto: Config,
    /// The sender sends for this long after the session is established.
    pub time: Duration,
    /// false: the client sends to the server; true: the server sends to the client.
    pub reverse: bool,
    /// Give up when the test has not ended this long after `time`.
    pub grace: Duration,
}

/// A snapshot of one side, for per-second reports.
#[derive(Debug, Clone, Default)]
pub struct MemProgress {
    /// Time since the session was established; None before.
    pub since_connected: Option<Duration>,
    /// Since established: when the sender stopped (sender), or when we learned it (receiver).
    pub ended: Option<Duration>,
    /// Since established: when the sink last got new data.
    pub last_delivery: Option<Duration>,
    /// This side's session counters ([`Connection::stats`]) when the snapshot was taken.
    pub stats: Stats,
    /// Bytes handed to the sink (new blocks only: what the receiver got).
    pub delivered_bytes: u64,
    /// Delivered blocks whose content differed from the pattern.
    pub mismatches: u64,
    /// Files this side began: sent or offered (sender), accepted (receiver).
    pub files_started: u64,
    /// Files whose BLAKE3 the receiver verified (and the sender confirmed, on its side).
    pub files_verified: u64,
    /// Total size in bytes of the files counted in `files_verified`.
    pub bytes_verified: u64,
    /// Files that failed: a BLAKE3 mismatch, or refused, skipped or failed by the peer (not
    /// those cut by the end of the test).
    pub files_failed: u64,
    /// Files cut by the end of the test.
    pub files_aborted: u64,
    /// Bytes of file per DATA block ([`Connection::block_size`], set by the MTU).
    pub block_size: usize,
    /// The MTU agreed in the handshake (before it, the configured one).
    pub mtu: u16,
    /// Datagrams the kernel dropped on our socket (receive buffer full).
    pub kernel_drops: u64,
}

/// How one side's test ended.
#[derive(Debug, Clone, Default)]
pub struct MemReport {
    /// The side's last snapshot, taken as the session ended.
    pub progress: MemProgress,
    /// Session-level failure (no handshake, peer vanished, interrupted, stopped).
    pub error: Option<String>,
    /// Per-file failures (at most a few), e.g. a BLAKE3 mismatch.
    pub failures: Vec<String>,
}

/// Called at least every 20 ms and once at the end; returning false stops the test.
pub type Observer<'a> = &'a mut dyn FnMut(&MemProgress) -> bool;

struct SendFile {
    seed: u64,
    size: u64,
}

struct RecvFile {
    seed: u64,
    size: u64,
    /// Everything below this offset is hashed (or in `buf`, about to be).
    frontier: u64,
    hasher: blake3::Hasher,
    buf: Vec<u8>,
    /// Blocks beyond the frontier (offset → length), already checked against the pattern:
    /// hashed from the regenerated pattern when the frontier reaches them.
    ahead: BTreeMap<u64, usize>,
    mismatches: u64,
}

impl RecvFile {
    fn new(name: &str, size: u64) -> Self {
        RecvFile {
            seed: pattern::seed(name),
            size,
            frontier: 0,
            hasher: blake3::Hasher::new(),
            buf: Vec::with_capacity(HASH_BATCH + 65536),
            ahead: BTreeMap::new(),
            mismatches: 0,
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> bool {
        let ok = pattern::matches(self.seed, offset, data);
        if !ok {
            self.mismatches += 1;
        }
        if offset == self.frontier {
            self.buf.extend_from_slice(data);
            self.frontier += data.len() as u64;
            while let Some(len) = self.ahead.remove(&self.frontier) {
                let n = self.buf.len();
                self.buf.resize(n + len, 0);
                pattern::fill(self.seed, self.frontier, &mut self.buf[n..]);
                self.frontier += len as u64;
                self.hash_some();
            }
            self.hash_some();
        } else if offset > self.frontier {
            self.ahead.insert(offset, data.len());
        }
        // Below the frontier: the core never writes a block twice.
        ok
    }

    fn hash_some(&mut self) {
        if self.buf.len() >= HASH_BATCH {
            self.hasher.update(&self.buf);
            self.buf.clear();
        }
    }

    /// The receiver's verdict on a complete file (for `Connection::finish_incoming`).
    fn finish(mut self, expected: &[u8; 32]) -> Result<[u8; 32], Verdict> {
        self.hasher.update(&self.buf);
        if self.frontier != self.size || !self.ahead.is_empty() {
            return Err(Verdict::Gaps {
                in_order: self.frontier,
                size: self.size,
            });
        }
        if self.mismatches > 0 {
            return Err(Verdict::Pattern(self.mismatches));
        }
        let h = *self.hasher.finalize().as_bytes();
        if &h == expected {
            Ok(h)
        } else {
            Err(Verdict::Mismatch {
                expected: *expected,
                got: h,
            })
        }
    }
}

/// Why the receiver refused a complete probe file.
#[derive(Debug, thiserror::Error)]
enum Verdict {
    /// The core completed a transfer this side holds no file for.
    #[error("transfer not open")]
    NotOpen,
    /// Not every byte reached the hash in order (bytes).
    #[error("receiver saw {in_order} of {size} bytes in order")]
    Gaps { in_order: u64, size: u64 },
    /// Blocks whose bytes are not the pattern's.
    #[error("{0} blocks differ from the pattern")]
    Pattern(u64),
    /// The sender's hash is another.
    #[error("BLAKE3 mismatch: the data received differs from the data sent")]
    Mismatch { expected: [u8; 32], got: [u8; 32] },
}

/// The virtual files of one session: a source on the sender, a sink on the receiver.
#[derive(Default)]
struct Mem {
    send: HashMap<XferId, SendFile>,
    recv: HashMap<XferId, RecvFile>,
    delivered: u64,
    mismatches: u64,
}

/// [`StorageError::PastEnd`] unless `len` bytes at `offset` are within `size`.
fn within(offset: u64, len: usize, size: u64) -> Result<(), StorageError> {
    if offset + len as u64 > size {
        return Err(StorageError::PastEnd {
            offset,
            len: len as u64,
            size,
        });
    }
    Ok(())
}

impl BlockSource for Mem {
    fn read(&mut self, xfer: XferId, offset: u64, buf: &mut [u8]) -> Result<(), StorageError> {
        let f = self.send.get(&xfer).ok_or(StorageError::NotOpen)?;
        within(offset, buf.len(), f.size)?;
        pattern::fill(f.seed, offset, buf);
        Ok(())
    }
}

impl BlockSink for Mem {
    fn write(&mut self, xfer: XferId, offset: u64, data: &[u8]) -> Result<(), StorageError> {
        let f = self.recv.get_mut(&xfer).ok_or(StorageError::NotOpen)?;
        within(offset, data.len(), f.size)?;
        if !f.write(offset, data) {
            self.mismatches += 1;
        }
        self.delivered += data.len() as u64;
        Ok(())
    }
}

fn file_size(pacing_rate: u64) -> u64 {
    if pacing_rate == 0 {
        return MAX_FILE; // unpaced: as fast as the host goes
    }
    ((pacing_rate as f64 * FILE_SECS) as u64).clamp(MIN_FILE, MAX_FILE)
}

fn valid_name(path: &str) -> bool {
    path.strip_prefix(PATH_PREFIX)
        .is_some_and(|n| !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The state of one test on one side, shared by both loops.
struct Test {
    time: Duration,
    /// This side sends the data.
    sending: bool,
    is_server: bool,
    /// Transfers in progress: sender, offered files (with sizes); receiver, requests and
    /// accepted files.
    open: HashMap<XferId, u64>,
    next_name: u64,
    connected_at: Option<Instant>,
    ended_at: Option<Instant>,
    last_delivery: Option<Instant>,
    p: MemProgress,
    failures: Vec<String>,
    /// Receiver verdicts on complete files, given to the core only after the next transmit
    /// pass (see [`Test::settle`]).
    verdicts: Vec<(XferId, Result<[u8; 32], Verdict>)>,
}

impl Test {
    fn new(opts: &MemOptions, is_server: bool) -> Self {
        Test {
            time: opts.time,
            sending: opts.reverse == is_server,
            is_server,
            open: HashMap::new(),
            next_name: 0,
            connected_at: None,
            ended_at: None,
            last_delivery: None,
            p: MemProgress::default(),
            failures: Vec::new(),
            verdicts: Vec::new(),
        }
    }

    fn fail(&mut self, what: String) {
        self.p.files_failed += 1;
        if self.failures.len() < 8 {
            self.failures.push(what);
        }
    }

    fn next_name(&mut self) -> String {
        let n = self.next_name;
        self.next_name += 1;
        format!("{PATH_PREFIX}{n}")
    }

    /// Sender: start files until [`OPEN_FILES`] are open (client: uploads of our own).
    fn top_up_uploads(&mut self, conn: &mut Connection, mem: &mut Mem) {
        if !self.sending || self.is_server || self.connected_at.is_none() {
            return;
        }
        while self.ended_at.is_none() && self.open.len() < OPEN_FILES {
            let name = self.next_name();
            let size = file_size(conn.stats().pacing_rate);
            let xfer = conn.send_file(&name, size, 0o644, 0);
            mem.send.insert(
                xfer,
                SendFile {
                    seed: pattern::seed(&name),
                    size,
                },
            );
            self.open.insert(xfer, size);
            self.p.files_started += 1;
        }
    }

    /// Receiver on the client: ask for files until [`OPEN_FILES`] are open.
    fn top_up_requests(&mut self, conn: &mut Connection) {
        if self.sending || self.is_server || self.connected_at.is_none() {
            return;
        }
        while self.ended_at.is_none() && self.open.len() < OPEN_FILES {
            let name = self.next_name();
            let xfer = conn.request(&name);
            self.open.insert(xfer, 0);
        }
    }

    /// Sender: at the end of the test, abort what is still open. Files the receiver already
    /// has whole stay open for their verdict (it is on its way).
    fn check_deadline(&mut self, conn: &mut Connection, mem: &mut Mem, now: Instant) {
        let Some(t0) = self.connected_at else { return };
        if !self.sending || self.ended_at.is_some() || now < t0 + self.time {
            return;
        }
        self.ended_at = Some(now);
        let mut cut: Vec<XferId> = self
            .open
            .iter()
            .filter(|&(x, &size)| conn.outgoing_acked_bytes(*x) != Some(size))
            .map(|(x, _)| *x)
            .collect();
        cut.sort_unstable();
        for xfer in cut {
            self.open.remove(&xfer);
            conn.reject(xfer, END_REASON);
            mem.send.remove(&xfer);
            self.p.files_aborted += 1;
        }
    }

    fn on_event(
        &mut self,
        conn: &mut Connection,
        mem: &mut Mem,
        ev: Event,
        now: Instant,
    ) -> Option<String> {
        match ev {
            Event::Connected => {
                self.connected_at.get_or_insert(now);
            }
            Event::Offered {
                xfer, path, size, ..
            } => {
                let wanted = !self.sending
                    && self.ended_at.is_none()
                    && (self.is_server || self.open.contains_key(&xfer));
                if !wanted {
                    conn.reject(xfer, "not part of this test");
                    self.open.remove(&xfer);
                } else if !valid_name(&path) || size > MAX_OFFER {
                    conn.reject(xfer, "not a hayate perf file");
                    self.open.remove(&xfer);
                } else {
                    mem.recv.insert(xfer, RecvFile::new(&path, size));
                    self.open.insert(xfer, size);
                    self.p.files_started += 1;
                    conn.accept(xfer, &[]);
                }
            }
            Event::GetRequested { xfer, path, .. } => {
                if !self.sending {
                    conn.reject(xfer, "this test sends the other way");
                } else if self.ended_at.is_some() {
                    conn.reject(xfer, END_REASON);
                } else if !valid_name(&path) {
                    conn.reject(xfer, "not a hayate perf file");
                } else {
                    let size = file_size(conn.stats().pacing_rate);
                    mem.send.insert(
                        xfer,
                        SendFile {
                            seed: pattern::seed(&path),
                            size,
                        },
                    );
                    self.open.insert(xfer, size);
                    self.p.files_started += 1;
                    conn.offer(xfer, &path, size, 0o644, 0);
                }
            }
            Event::IncomingComplete { xfer, blake3 } => {
                let size = self.open.remove(&xfer).unwrap_or(0);
                let verdict = match mem.recv.remove(&xfer) {
                    Some(f) => f.finish(&blake3),
                    None => Err(Verdict::NotOpen),
                };
                match &verdict {
                    Ok(_) => {
                        self.p.files_verified += 1;
                        self.p.bytes_verified += size;
                    }
                    Err(e) => self.fail(format!("file {xfer}: {e}")),
                }
                self.verdicts.push((xfer, verdict));
            }
            Event::IncomingFailed { xfer, reason } => {
                self.open.remove(&xfer);
                mem.recv.remove(&xfer);
                self.fail(format!("file {xfer}: {reason}"));
            }
            Event::OutgoingDone { xfer, result } => {
                let size = self.open.remove(&xfer).unwrap_or(0);
                mem.send.remove(&xfer);
                match result {
                    Ok(_) => {
                        self.p.files_verified += 1;
                        self.p.bytes_verified += size;
                    }
                    Err(e) => self.fail(format!("file {xfer}: receiver: {e}")),
                }
            }
            Event::Rejected { xfer, reason } => {
                self.open.remove(&xfer);
                mem.send.remove(&xfer);
                let had_data = mem.recv.remove(&xfer).is_some();
                if reason == END_REASON && !self.sending {
                    self.ended_at.get_or_insert(now);
                    if had_data {
                        self.p.files_aborted += 1;
                    }
                } else {
                    self.fail(format!("file {xfer}: peer refused: {reason}"));
                }
            }
            Event::Skipped { xfer, reason } => {
                self.open.remove(&xfer);
                mem.send.remove(&xfer);
                self.fail(format!("file {xfer}: peer skipped it: {reason}"));
            }
            Event::MetaRequested { id, .. } => {
                conn.meta_reply(id, Err("no file system in a hayate perf test".into()));
            }
            Event::MetaReplied { .. }
            | Event::Placed { .. }
            | Event::Bye
            | Event::TunnelRequested { .. }
            | Event::TunnelAnswered { .. } => {}
            Event::Closed { error } => return error,
        }
        None
    }

    /// Hands the verdicts on complete files to the core. Called after a transmit pass: the
    /// core forgets a transfer on `finish_incoming`, and with it the loss map that would
    /// acknowledge the file's last blocks. Completion makes the core ACK at once, so the pass
    /// before this carried that final map, and the sender learns of those deliveries (its
    /// rate controller counts them) before the verdict. Without this, before proto commit
    /// 9c56634 settled finished transfers, those blocks stayed "in flight" on the sender for
    /// good, and after a few files its in-flight cap stalled the session.
    fn settle(&mut self, conn: &mut Connection) {
        for (xfer, verdict) in self.verdicts.drain(..) {
            conn.finish_incoming(xfer, verdict.map_err(|e| e.to_string()));
        }
    }

    /// The receiver's side is done: everything we asked for is settled after the sender's end.
    fn receiver_done(&self) -> bool {
        !self.sending && self.ended_at.is_some() && self.open.is_empty() && self.verdicts.is_empty()
    }

    fn note_delivery(&mut self, mem: &Mem, before: u64, now: Instant) {
        if mem.delivered > before {
            self.last_delivery = Some(now);
        }
    }

    fn progress(&mut self, conn: &Connection, mem: &Mem, drops: u64, now: Instant) -> &MemProgress {
        let since = |t: Option<Instant>| {
            t.zip(self.connected_at)
                .map(|(t, c)| t.saturating_duration_since(c))
        };
        self.p.since_connected = self.connected_at.map(|c| now.saturating_duration_since(c));
        self.p.ended = since(self.ended_at);
        self.p.last_delivery = since(self.last_delivery);
        self.p.stats = conn.stats();
        self.p.delivered_bytes = mem.delivered;
        self.p.mismatches = mem.mismatches;
        self.p.block_size = conn.block_size();
        self.p.mtu = conn.mtu();
        self.p.kernel_drops = drops;
        &self.p
    }

    fn report(self, error: Option<String>) -> MemReport {
        MemReport {
            progress: self.p,
            error,
            failures: self.failures,
        }
    }
}

/// Client side of a test against [`run_server`] at `server`.
pub fn run_client(
    server: SocketAddr,
    opts: MemOptions,
    stop: &StopFlag,
    observe: Observer<'_>,
) -> MemReport {
    let start = Instant::now();
    let test = Test::new(&opts, false);
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("addr")
    } else {
        "[::]:0".parse().expect("addr")
    };
    let sock = match UdpSocket::bind(bind) {
        Ok(s) => s,
        Err(e) => return test.report(Some(format!("cannot open a UDP socket: {e}"))),
    };
    let fam = AddrFamily::of(&server);
    let cfg = Config {
        mtu: crate::udp::mtu_toward(opts.proto.mtu, server),
        ..opts.proto.clone()
    };
    let conn = Connection::client(cfg, &opts.psk, fam, Instant::now());
    let mut net = Net::one(Links::new(Some(sock), None), conn, server);
    let mut p = Probe {
        test,
        stop,
        observe,
        give_up: start + opts.proto.connect_timeout + opts.time + opts.grace,
        grace: opts.grace,
        accept_by: None,
        error: None,
        bye_at: None,
        next_observe: start,
        delivered: 0,
        cid: None,
        last: MemProgress::default(),
    };
    if let Err(e) = engine::run(&mut p, &mut net) {
        p.error.get_or_insert(e.to_string());
    }
    p.finish(&mut net)
}

/// Server side of one test: serves the first session that `peer` opens on `sock` (datagrams
/// from other addresses are ignored) and returns when it ends.
pub fn run_server(
    sock: UdpSocket,
    peer: IpAddr,
    opts: MemOptions,
    stop: &StopFlag,
    observe: Observer<'_>,
) -> MemReport {
    let start = Instant::now();
    let ep = Endpoint::new(opts.psk.clone(), opts.proto.clone(), Instant::now());
    let mut net = Net::many(Links::new(Some(sock), None), ep);
    let mut p = Probe {
        test: Test::new(&opts, true),
        stop,
        observe,
        give_up: start + Duration::from_secs(10) + opts.time + opts.grace,
        grace: opts.grace,
        accept_by: Some((start + Duration::from_secs(10), peer.to_canonical())),
        error: None,
        bye_at: None,
        next_observe: start,
        delivered: 0,
        cid: None,
        last: MemProgress::default(),
    };
    if let Err(e) = engine::run(&mut p, &mut net) {
        p.error.get_or_insert(e.to_string());
    }
    p.finish(&mut net)
}

/// The probe's policy on the driver's loop (`engine`), for either side.
struct Probe<'a> {
    test: Test,
    stop: &'a StopFlag,
    observe: Observer<'a>,
    give_up: Instant,
    grace: Duration,
    /// Server: the handshake must come by then, from this address.
    accept_by: Option<(Instant, IpAddr)>,
    error: Option<String>,
    bye_at: Option<Instant>,
    next_observe: Instant,
    /// What the sink had at the start of the turn.
    delivered: u64,
    /// Server: the one session of the test.
    cid: Option<Cid>,
    last: MemProgress,
}

impl Probe<'_> {
    fn drops(net: &Net<Mem>) -> u64 {
        net.links.udp.as_ref().map_or(0, |s| s.kernel_drops())
    }

    /// The test's session and its sink, once there is one.
    fn session<'n>(&self, net: &'n mut Net<Mem>) -> Option<Session<'n, Mem>> {
        let cid = match self.accept_by {
            Some(_) => self.cid?,
            None => *net.cids().first()?,
        };
        net.session(cid)
    }

    /// A last observation, then the report.
    fn finish(mut self, net: &mut Net<Mem>) -> MemReport {
        let now = Instant::now();
        let drops = Self::drops(net);
        if let Some(s) = self.session(net) {
            self.last = self.test.progress(s.conn, s.files, drops, now).clone();
        }
        (self.observe)(&self.last);
        self.test.report(self.error)
    }
}

impl Policy for Probe<'_> {
    type Files = Mem;

    fn wake_by(&self, _now: Instant) -> Instant {
        self.next_observe
    }

    fn begin(&mut self, now: Instant, net: &mut Net<Mem>) -> Flow {
        if self.error.is_none() {
            if self.stop.is_stopped() {
                self.error = Some("interrupted".into());
            } else if self
                .accept_by
                .is_some_and(|(t, _)| self.cid.is_none() && now >= t)
            {
                self.error =
                    Some("the client's hayate handshake never arrived (UDP blocked?)".into());
            } else if now >= self.give_up {
                self.error = Some(format!(
                    "the test did not end within {:.0} s of its time",
                    self.grace.as_secs_f64()
                ));
            }
        }
        let server = self.accept_by.is_some();
        let Some(s) = self.session(net) else {
            return if self.error.is_some() {
                Flow::Stop
            } else {
                Flow::Go
            };
        };
        self.delivered = s.files.delivered;
        if let Some(e) = &self.error {
            // Tell the peer why, once.
            if !s.conn.is_draining() {
                s.conn.close(now, 1, e);
            }
            if server {
                let cid = s.cid;
                net.transmit(cid);
                return Flow::Stop;
            }
            return Flow::Go;
        }
        if !server {
            self.test.check_deadline(s.conn, s.files, now);
            self.test.top_up_uploads(s.conn, s.files);
        }
        Flow::Go
    }

    fn admits(&self, from: SocketAddr) -> bool {
        self.accept_by
            .is_none_or(|(_, peer)| from.ip().to_canonical() == peer)
    }

    fn accept(&mut self, cid: Cid, _conn: &mut Connection, _from: SocketAddr) -> bool {
        // One session per test.
        if self.cid.is_some() {
            return false;
        }
        self.cid = Some(cid);
        true
    }

    fn on_event(&mut self, s: &mut Session<'_, Mem>, ev: Event, now: Instant) {
        if self.accept_by.is_some() && Some(s.cid) != self.cid {
            return;
        }
        if let Some(e) = self.test.on_event(s.conn, s.files, ev, now) {
            self.error.get_or_insert(e);
        }
    }

    fn turn(&mut self, s: &mut Session<'_, Mem>, now: Instant) -> bool {
        if self.accept_by.is_some() {
            self.test.check_deadline(s.conn, s.files, now);
        } else if self.error.is_none() {
            let t = &mut self.test;
            t.top_up_requests(s.conn);
            let sender_done = t.sending && t.ended_at.is_some() && t.open.is_empty();
            if (sender_done || t.receiver_done()) && self.bye_at.is_none() {
                s.conn.bye();
                self.bye_at = Some(now);
            }
        }
        false
    }

    fn settle(&mut self, s: &mut Session<'_, Mem>, now: Instant) -> bool {
        self.test.note_delivery(s.files, self.delivered, now);
        self.test.settle(s.conn);
        false
    }

    fn end(&mut self, now: Instant, net: &mut Net<Mem>) -> Flow {
        let drops = Self::drops(net);
        let observe_now = now >= self.next_observe;
        if observe_now {
            self.next_observe = now + OBSERVE_EVERY;
        }
        let Some(s) = self.session(net) else {
            if observe_now && !(self.observe)(&self.last) {
                self.error.get_or_insert("stopped".into());
            }
            return Flow::Go;
        };
        if observe_now {
            self.last = self.test.progress(s.conn, s.files, drops, now).clone();
            if !(self.observe)(&self.last) && self.error.is_none() {
                self.error = Some("stopped".into());
                // The client sends its CLOSE in the next turn, then leaves as draining.
                s.conn.close(now, 1, "test stopped");
                return Flow::Go;
            }
        }
        // The client's bye (or its CLOSE, or an error) ended the session.
        if s.conn.is_draining() {
            return Flow::Stop;
        }
        // Said goodbye: don't wait long for the server's CLOSE.
        if self
            .bye_at
            .is_some_and(|t| now.duration_since(t) > Duration::from_secs(2))
        {
            return Flow::Stop;
        }
        Flow::Go
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hayate_proto::cc::RateConfig;

    #[test]
    fn pattern_fill_and_match_at_any_offset() {
        let seed = pattern::seed("hayate-perf/7");
        let mut whole = vec![0u8; 4096];
        pattern::fill(seed, 0, &mut whole);
        for off in [0usize, 1, 3, 7, 8, 9, 1000, 1417, 4000] {
            for len in [0usize, 1, 5, 8, 13, 64, 90] {
                if off + len > whole.len() {
                    continue;
                }
                let mut b = vec![0u8; len];
                pattern::fill(seed, off as u64, &mut b);
                assert_eq!(b, whole[off..off + len], "fill at {off}+{len}");
                assert!(pattern::matches(seed, off as u64, &b));
                if len > 0 {
                    b[len / 2] ^= 1;
                    assert!(!pattern::matches(seed, off as u64, &b), "{off}+{len}");
                }
            }
        }
        // Another file or another offset does not match.
        assert!(!pattern::matches(
            pattern::seed("hayate-perf/8"),
            0,
            &whole[..64]
        ));
        assert!(!pattern::matches(seed, 8, &whole[..64]));
    }

    #[test]
    fn sink_hashes_out_of_order_blocks() {
        let name = "hayate-perf/1";
        let seed = pattern::seed(name);
        let size = 3 * HASH_BATCH as u64 + 12345;
        let mut data = vec![0u8; size as usize];
        pattern::fill(seed, 0, &mut data);
        let want = *blake3::hash(&data).as_bytes();
        let bs = 1416usize;
        let blocks: Vec<(u64, usize)> = (0..size)
            .step_by(bs)
            .map(|o| (o, bs.min((size - o) as usize)))
            .collect();
        // Deliver with every 7th block late (as after a loss).
        let mut f = RecvFile::new(name, size);
        let (late, early): (Vec<_>, Vec<_>) =
            blocks.iter().enumerate().partition(|(i, _)| i % 7 == 3);
        for (_, b) in early.iter().chain(late.iter()) {
            let (o, l) = **b;
            assert!(f.write(o, &data[o as usize..o as usize + l]));
        }
        assert_eq!(f.finish(&want).unwrap(), want);
        // A corrupted block is caught.
        let mut f = RecvFile::new(name, size);
        let mut bad = data.clone();
        bad[5000] ^= 0x40;
        for &(o, l) in &blocks {
            f.write(o, &bad[o as usize..o as usize + l]);
        }
        let e = f.finish(&want).unwrap_err();
        assert!(matches!(e, Verdict::Pattern(1)), "{e}");
    }

    fn run_pair(reverse: bool) -> (MemReport, MemReport) {
        let psk = Psk::from_bytes([9; 32]);
        let sock = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = sock.local_addr().unwrap();
        let base = MemOptions {
            psk: psk.clone(),
            proto: Config {
                rate: RateConfig::Unlimited,
                mtu: 65535,
                ..Config::default()
            },
            // Two seconds: at 50 Mbit/s the first of the three files open at once (2 MB
            // each) verifies after about 1 s, with no margin for a busy host in one.
            time: Duration::from_millis(2000),
            reverse,
            grace: Duration::from_secs(10),
        };
        let sopts = base.clone();
        let srv = std::thread::spawn(move || {
            run_server(
                sock,
                "127.0.0.1".parse().unwrap(),
                sopts,
                &StopFlag::new(),
                &mut |_| true,
            )
        });
        let copts = MemOptions {
            proto: Config {
                rate: RateConfig::Adaptive {
                    max: Some(50_000_000 / 8),
                    min: 0,
                    policy: hayate_proto::cc::Policy::Fair,
                },
                mtu: 1500,
                ..Config::default()
            },
            ..base
        };
        let mut ticks = 0;
        let c = run_client(addr, copts, &StopFlag::new(), &mut |_| {
            ticks += 1;
            true
        });
        assert!(ticks > 10, "observer ran {ticks} times");
        (c, srv.join().unwrap())
    }

    fn check(snd: &MemReport, rcv: &MemReport) {
        assert_eq!(snd.error, None);
        assert_eq!(rcv.error, None);
        assert!(snd.failures.is_empty() && rcv.failures.is_empty());
        let (s, r) = (&snd.progress, &rcv.progress);
        // 50 Mbit/s for 2 s is 12 MB; a busy host (tests run side by side) gets less.
        assert!(r.delivered_bytes > 256 << 10, "{r:?}");
        assert_eq!(r.delivered_bytes, r.stats.data_bytes_received);
        assert!(s.stats.data_bytes_sent >= r.delivered_bytes);
        assert_eq!(r.mismatches, 0);
        assert!(r.files_verified >= 1, "{r:?}");
        // A verdict can cross the sender's abort at the deadline: the receiver then counts the
        // file verified and the sender counts it cut.
        assert!(s.files_verified <= r.files_verified);
        assert!(r.files_verified <= s.files_verified + s.files_aborted);
        assert!(r.files_aborted <= s.files_aborted);
        let ended = s.ended.expect("sender ended");
        assert!(ended >= Duration::from_millis(2000) && ended < Duration::from_secs(7));
    }

    #[test]
    fn loopback_upload_and_download() {
        let (c, s) = run_pair(false);
        check(&c, &s);
        let (c, s) = run_pair(true);
        check(&s, &c);
    }
}
