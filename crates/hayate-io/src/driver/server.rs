//! `hayate serve`: many sessions on one UDP socket, files confined beneath `--root`; and
//! `hayate serve --stdio`, the far side of a copy started over ssh: whole file system as the
//! ssh user sees it, one client, UDP plus the ssh channel as a fallback path, gone when the
//! channel closes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hayate_proto::control::{flags, EntryKind as WireKind, MetaEntry, MetaOp};
use hayate_proto::crypto::Psk;
use hayate_proto::wire::{Cid, CidShard};
use hayate_proto::{
    BlockSink, BlockSource, Config, Connection, Endpoint, Event, FileOffer, StorageError, XferId,
};

use super::engine::{self, Flow, Net, Policy, Session};
use super::link::{AeadPlace, Links, StreamLink};
use super::resume::save_progress;
use super::tunnel::FarEnd;
use super::{dest_mode, systime, StopFlag};
use crate::delta::{basis_for, keep_small_if_same, pump_sums, Basis};
use crate::fs::{Entry, EntryKind, FsError, PartFile, Root, SourceError, SourceFile};
use crate::udp::UdpSocket;
use crate::verify::{HashError, Known, Landing, ReceiveError, Sending, WholeHash};

/// Most entries one listing may return (a runaway tree is an error, not an OOM).
const MAX_LIST: usize = 4_000_000;
/// How long an upload whose temp file another process holds, or whose FIFO destination
/// has no reader, is tried again before it is refused.
const BUSY_WAIT: Duration = Duration::from_secs(5);
/// How often it is tried meanwhile.
const BUSY_POLL: Duration = Duration::from_millis(100);
/// How often the resume state of running receives is written down.
const STATE_EVERY: Duration = Duration::from_millis(500);

/// Which files a server's clients reach.
pub enum Scope {
    /// `--root DIR`: nothing outside it.
    Confined(PathBuf),
    /// The far side of an ssh copy: what the ssh user can reach; relative paths from here.
    WholeFs(PathBuf),
}

/// What [`serve`] runs with.
pub struct ServerOptions {
    /// UDP address to bind and serve on.
    pub listen: SocketAddr,
    /// Which files clients reach: `--root` for `serve`, the whole file system for `--stdio`.
    pub scope: Scope,
    /// The key every client must hold (the key file's; a fresh one under `--stdio`).
    pub psk: Psk,
    /// What the server allows clients (largest MTU, rates) and its timeouts.
    pub proto: Config,
    /// Threads the sessions are spread over (each serves its own: sessions on two threads
    /// never wait on each other's sealing, opening or turns); 0: one per core, at most 8.
    /// `--stdio` serves its one client on one.
    pub threads: usize,
}

/// What a daemon's clients may do beyond reading and writing files beneath its root
/// ([`serve_with`]).
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// `cp -r --delete` may remove entries (beneath the root, as everything else); false
    /// (`hayate serve --no-delete`) refuses every removal.
    pub delete: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Rules { delete: true }
    }
}

/// One line per notable thing, for the operator's log (written from each serving thread).
pub type Log<'a> = &'a mut (dyn FnMut(&str) + Send);

struct Incoming {
    part: PartFile,
    path: String,
    size: u64,
    mode: u32,
    mtime: i64,
    flags: u32,
    /// Missing-range count at the last state save, to skip unchanged saves.
    saved: Option<u64>,
    /// A write failed for lack of space: the partial file is removed, not kept.
    no_space: bool,
    /// Its hash, computed as blocks land.
    landing: Landing,
    /// Accepted whole (`Ready` sent): not a delta whose leaves are still compared.
    answered: bool,
}

impl Incoming {
    /// The upload ends unfinished: its temp file stays for a rerun to resume, with its
    /// resume state; but not one still compared with the file at the destination, which
    /// holds that file only as far as its copy got, and no resume state (a rerun compares
    /// the destination again, and would send the rest of the file if it took that temp
    /// file for its basis).
    fn let_go(mut self, c: &Connection, xfer: XferId) {
        if self.answered {
            self.saved = None;
            save_state(c, xfer, &mut self);
            self.part.abandon();
        } else {
            self.part.drop_unstarted();
        }
    }
}

/// An upload as offered.
struct Upload {
    path: String,
    size: u64,
    mode: u32,
    mtime: i64,
    flags: u32,
}

/// A file asked for, opened to be sent.
struct Download {
    path: String,
    /// With `--update` its hash is taken through this same open file before it is offered:
    /// what is hashed is what is sent, and a change meanwhile is caught as one while sent.
    src: SourceFile,
    mode: u32,
    mtime: i64,
    flags: u32,
}

/// An upload offered with `--update` over a file of the same size: skipped if that file
/// hashes to the sender's hash, else received.
struct Deciding {
    up: Upload,
    /// Opened (and its name held against other uploads) before the decision, as for any
    /// upload.
    part: PartFile,
    want: [u8; 32],
    hash: WholeHash,
}

/// The files one session is reading and writing.
#[derive(Default)]
struct SessionFiles {
    out: HashMap<XferId, Sending>,
    inc: HashMap<XferId, Incoming>,
    /// Downloads asked for with `--update`, offered with their hash once the workers have it.
    offering: HashMap<XferId, (Download, WholeHash)>,
    /// Uploads offered with `--update`, received or skipped once the file there is hashed.
    deciding: HashMap<XferId, Deciding>,
    /// Uploads compared leaf by leaf with a basis (delta, verified resume).
    bases: HashMap<XferId, Comparing>,
}

/// An upload compared leaf by leaf with a basis (delta, verified resume): its blocks are
/// answered as their leaves are compared (`Compared`), the file once every leaf is.
struct Comparing {
    basis: Basis,
    /// The upload and its temp file, until a first block is answered: then it is received
    /// (in `SessionFiles::inc`).
    waiting: Option<(Upload, PartFile)>,
}

impl SessionFiles {
    /// Whether a whole-file hash for `--update`, or leaf hashes for a delta transfer, hold
    /// up one of its transfers.
    fn hashing(&self) -> bool {
        !self.offering.is_empty()
            || !self.deciding.is_empty()
            || !self.bases.is_empty()
            || self.out.values().any(Sending::sums_pending)
    }
}

impl BlockSource for SessionFiles {
    fn read(&mut self, xfer: XferId, offset: u64, buf: &mut [u8]) -> Result<(), StorageError> {
        Ok(self
            .out
            .get_mut(&xfer)
            .ok_or(StorageError::NotOpen)?
            .read(offset, buf)?)
    }
}

impl BlockSink for SessionFiles {
    fn write(&mut self, xfer: XferId, offset: u64, data: &[u8]) -> Result<(), StorageError> {
        let f = self.inc.get_mut(&xfer).ok_or(StorageError::NotOpen)?;
        f.part
            .write_at(offset, data)
            .and_then(|()| f.landing.wrote(&mut f.part, offset, data.len() as u64))
            .map_err(|e| {
                f.no_space |= e.raw_os_error() == Some(libc::ENOSPC);
                StorageError::from(e)
            })
    }

    fn ready(&mut self, xfer: XferId) -> bool {
        self.inc.get(&xfer).is_none_or(|f| f.part.has_room())
    }

    fn room(&self) -> Option<u64> {
        self.inc.values().filter_map(|f| f.part.room()).min()
    }
}

/// Hands the connection the hash of every download the workers have finished, and starts
/// the rest of those whose blocks have all gone out. Returns whether one is still being
/// hashed after its last block went out.
fn give_source_hashes(c: &mut Connection, f: &mut SessionFiles) -> bool {
    pump_sums(c, f.out.iter_mut().map(|(x, s)| (*x, s)));
    for x in c.sources_awaiting_hash() {
        if let Some(s) = f.out.get_mut(&x) {
            s.finish();
        }
    }
    for (x, s) in f.out.iter_mut() {
        if let Some(r) = s.hash_ready() {
            match r {
                Ok(h) => c.set_source_hash(*x, h),
                Err(e) => c.fail_source(*x, &e.to_string()),
            }
        }
    }
    !c.sources_awaiting_hash().is_empty()
}

/// Goes on with the `--update` downloads and uploads whose whole-file hash the workers have
/// finished: the download is offered with its hash (or refused if it cannot be read); the
/// upload skipped if the file there is the same, else received.
fn settle_update_hashes(c: &mut Connection, f: &mut SessionFiles) {
    let offers: Vec<(XferId, Result<blake3::Hash, HashError>)> = f
        .offering
        .iter_mut()
        .filter_map(|(x, (_, h))| Some((*x, h.poll()?)))
        .collect();
    for (xfer, r) in offers {
        let (d, _) = f.offering.remove(&xfer).expect("listed");
        match r.map_err(SourceError::from).and_then(|h| {
            d.src.check()?;
            Ok(h)
        }) {
            Ok(h) => offer_download(c, f, xfer, d, Some(h)),
            Err(e) => c.reject(xfer, &format!("{}: {e}", d.path)),
        }
    }
    let decided: Vec<(XferId, bool)> = f
        .deciding
        .iter_mut()
        .filter_map(|(x, d)| {
            let r = d.hash.poll()?;
            Some((*x, r.is_ok_and(|h| *h.as_bytes() == d.want)))
        })
        .collect();
    for (xfer, same) in decided {
        let d = f.deciding.remove(&xfer).expect("listed");
        if same {
            skip_upload(c, xfer, d.part, "identical at the destination (--update)");
        } else {
            accept_upload(c, f, xfer, d.part, d.up);
        }
    }
    settle_bases(c, f);
}

/// Goes on with the uploads compared with a basis: the sender's leaf hashes that came are
/// compared with the basis's, and the blocks whose leaves are compared answered (the
/// upload is received from the first), the file accepted once every leaf is.
fn settle_bases(c: &mut Connection, f: &mut SessionFiles) {
    let bs = c.block_size() as u64;
    let xfers: Vec<XferId> = f.bases.keys().copied().collect();
    for xfer in xfers {
        while let Some(cmp) = f.bases.get_mut(&xfer) {
            for (first, leaves) in c.take_sums(xfer) {
                cmp.basis.sums(first, leaves);
            }
            let Some(mut d) = cmp.basis.poll(bs) else {
                break;
            };
            if let Some((up, part)) = cmp.waiting.take() {
                if !take_upload(c, f, xfer, part, up) {
                    f.bases.remove(&xfer);
                    break;
                }
            }
            let Some(inc) = f.inc.get_mut(&xfer) else {
                // Failed meanwhile.
                f.bases.remove(&xfer);
                break;
            };
            if d.done {
                let b = f.bases.remove(&xfer).expect("listed").basis;
                d.known.extend(b.finish(&mut inc.part));
            }
            let ranges = d.kept.byte_ranges(bs, inc.size);
            let upto = (d.upto * bs).min(inc.size);
            if let Err(e) = inc.landing.hold(&mut inc.part, &ranges, upto, d.known) {
                c.reject(xfer, &format!("cannot write {}: {e}", inc.path));
                f.bases.remove(&xfer);
                if let Some(inc) = f.inc.remove(&xfer) {
                    inc.part.discard();
                }
                break;
            }
            if d.done {
                let placed = (inc.flags & flags::INTO_DIR != 0).then(|| inc.path.clone());
                inc.answered = true;
                c.accept_with(xfer, &d.kept.have, &d.kept.spans, placed.as_deref());
                break;
            }
            c.accept_compared(xfer, d.upto, &d.kept.have, &d.kept.spans);
        }
    }
}

/// Gives the verdict on every upload whose blocks have all landed and whose hash the workers
/// have finished: committed under its final name if it matches the sender's, else removed.
fn settle_verified(c: &mut Connection, f: &mut SessionFiles, addr: SocketAddr, log: Log<'_>) {
    let ready: Vec<(XferId, Result<[u8; 32], ReceiveError>)> = f
        .inc
        .iter_mut()
        .filter_map(|(x, i)| Some((*x, i.landing.verdict(&mut i.part)?)))
        .collect();
    for (xfer, verdict) in ready {
        let mut inc = f.inc.remove(&xfer).expect("listed");
        let result = match verdict {
            Ok(h) => {
                keep_small_if_same(&mut inc.part, &h);
                let kept = if inc.part.keeps_destination() {
                    ", the same as the file there: kept"
                } else {
                    ""
                };
                let mtime = (inc.flags & flags::PRESERVE != 0).then(|| systime(inc.mtime));
                match inc.part.commit(Some(dest_mode(inc.mode, inc.flags)), mtime) {
                    Ok(()) => {
                        log(&format!("{addr}: received {} (verified{kept})", inc.path));
                        Ok(h)
                    }
                    Err(e) => Err(ReceiveError::Commit(e)),
                }
            }
            Err(e) => {
                inc.part.discard();
                Err(e)
            }
        };
        if let Err(e) = &result {
            log(&format!("{addr}: upload {} failed: {e}", inc.path));
        }
        c.finish_incoming(xfer, result.map_err(|e| e.to_string()));
    }
}

/// Writes down what an incoming file already has, so a rerun can resume it: not while it
/// is still compared (see [`Incoming::let_go`]).
fn save_state(c: &Connection, xfer: XferId, inc: &mut Incoming) {
    if inc.answered {
        save_progress(c, xfer, &mut inc.part, inc.size, inc.mtime, &mut inc.saved);
    }
}

pub(crate) fn to_wire(e: Entry) -> MetaEntry {
    MetaEntry {
        path: e.path,
        kind: match e.kind {
            EntryKind::File => WireKind::File,
            EntryKind::Dir => WireKind::Dir,
            EntryKind::Symlink => WireKind::Symlink,
            EntryKind::Other => WireKind::Other,
        },
        size: e.size,
        mode: e.mode,
        mtime: e.mtime,
        target: e.target,
    }
}

/// Runs until `stop` is set. Partial uploads stay under their `.hayate-part` names.
pub fn serve(opts: ServerOptions, stop: StopFlag, log: Log<'_>) -> anyhow::Result<()> {
    serve_with(opts, Rules::default(), stop, log)
}

/// [`serve`] with what clients may do beyond reading and writing beneath the root.
pub fn serve_with(
    opts: ServerOptions,
    rules: Rules,
    stop: StopFlag,
    log: Log<'_>,
) -> anyhow::Result<()> {
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get().min(8)),
        n => n,
    };
    let group = UdpSocket::bind_group(opts.listen, threads)
        .with_context(|| format!("cannot listen on {}", opts.listen))?;
    let r = if group.len() == 1 {
        let sock = group.into_iter().next().expect("one socket");
        let mut srv = Server::new(&opts, stop, log)?;
        srv.rules = rules;
        srv.log_listening(&sock, 1)?;
        srv.run(Links::new(Some(sock), None), &opts, CidShard::ALL)
    } else {
        serve_group(&opts, rules, group, stop, log)
    };
    // Uploads let go at the end are written, and their resume states saved, before exit.
    crate::writeback::settle_all();
    r
}

/// A daemon's threads, one per socket of `group`: thread `i` serves the sessions whose cids
/// are of class `i` (the kernel routes their packets to socket `i`, `UdpSocket::bind_group`).
/// They share the log, the stop flag and a board of uploads asked to give way (a rerun's
/// session and the old one may be on two threads). The first to fail stops the others.
fn serve_group(
    opts: &ServerOptions,
    rules: Rules,
    group: Vec<UdpSocket>,
    stop: StopFlag,
    log: Log<'_>,
) -> anyhow::Result<()> {
    let count = group.len();
    let log = std::sync::Mutex::new(log);
    let board = Arc::new(GiveWay::default());
    std::thread::scope(|scope| {
        let mut threads = Vec::new();
        for (i, sock) in group.into_iter().enumerate() {
            let (stop, board, log) = (stop.clone(), board.clone(), &log);
            let shard = CidShard::new(i as u8, count as u8).expect("at most 64 sockets");
            let work = move || -> anyhow::Result<()> {
                let mut line = |l: &str| (log.lock().unwrap_or_else(|e| e.into_inner()))(l);
                let mut srv = Server::new(opts, stop.clone(), &mut line)?;
                srv.rules = rules;
                srv.board = Some(Board {
                    shared: board,
                    me: i as u8,
                    count: count as u8,
                    seen: 0,
                });
                if i == 0 {
                    srv.log_listening(&sock, count)?;
                }
                let links = Links::with_aead(Some(sock), None, AeadPlace::for_loops(count));
                let r = srv.run(links, opts, shard);
                if r.is_err() {
                    stop.stop();
                }
                r
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("hayate-serve-{i}"))
                    .spawn_scoped(scope, work)
                    .context("cannot start a serving thread")?,
            );
        }
        let mut first_err = None;
        for t in threads {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a serving thread panicked")));
            if let Err(e) = r {
                stop.stop();
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    })
}

/// Uploads a session on one of a daemon's threads found held by another session of ours
/// (see [`Server::supersede`]): each other thread makes its sessions' receives of that path
/// give way, once, within the offer's wait.
#[derive(Default)]
struct GiveWay {
    asks: std::sync::Mutex<Vec<Ask>>,
    /// Asks posted so far: a thread that saw this many looks no further (every turn).
    posted: std::sync::atomic::AtomicU64,
}

/// One thread's view of the [`GiveWay`] board.
struct Board {
    shared: Arc<GiveWay>,
    /// This thread's index, and how many there are.
    me: u8,
    count: u8,
    /// `GiveWay::posted` when this thread last looked.
    seen: u64,
}

struct Ask {
    /// The path, normalized ([`norm_path`]).
    path: String,
    until: Instant,
    /// The threads that have looked at it (bit `i`: thread `i`; the asker's own is set).
    seen: u64,
}

impl GiveWay {
    fn post(&self, path: String, by: u8, now: Instant) {
        let mut asks = self.asks.lock().unwrap_or_else(|e| e.into_inner());
        asks.retain(|a| a.path != path && now < a.until);
        asks.push(Ask {
            path,
            until: now + BUSY_WAIT,
            seen: 1 << by,
        });
        self.posted
            .fetch_add(1, std::sync::atomic::Ordering::Release);
    }
}

impl Board {
    /// The paths this thread has not looked at yet (nothing to lock if none was posted
    /// since it last looked); forgets the asks every thread has seen, or whose wait is over.
    fn take(&mut self, now: Instant) -> Vec<String> {
        let posted = self
            .shared
            .posted
            .load(std::sync::atomic::Ordering::Acquire);
        if posted == self.seen {
            return Vec::new();
        }
        self.seen = posted;
        let mut asks = self.shared.asks.lock().unwrap_or_else(|e| e.into_inner());
        let all = if self.count >= 64 {
            u64::MAX
        } else {
            (1 << self.count) - 1
        };
        let mut mine = Vec::new();
        for a in asks.iter_mut() {
            if a.seen & (1 << self.me) == 0 {
                a.seen |= 1 << self.me;
                mine.push(a.path.clone());
            }
        }
        asks.retain(|a| a.seen != all && now < a.until);
        mine
    }
}

/// A client's path as the offers it names compare: empty and `.` components dropped.
fn norm_path(p: &str) -> String {
    p.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// The far side of an ssh copy: binds a UDP port from `ports`, prints the banner with a fresh
/// session key through `announce` (stdout, read by the client over ssh), then serves the one
/// client over UDP or over the channel (`chan_in`/`chan_out`), until the channel closes.
pub fn serve_stdio(
    scope: Scope,
    proto: Config,
    ports: (u16, u16),
    chan: (std::os::fd::OwnedFd, std::os::fd::OwnedFd),
    announce: &mut dyn FnMut(u16, &Psk) -> std::io::Result<()>,
    stop: StopFlag,
    log: Log<'_>,
) -> anyhow::Result<()> {
    let mut sock = None;
    let mut last_err = None;
    for port in ports.0..=ports.1 {
        // Dual-stack: IPv6 any accepts IPv4 clients through mapped addresses.
        let v6: SocketAddr = (std::net::Ipv6Addr::UNSPECIFIED, port).into();
        let v4: SocketAddr = (std::net::Ipv4Addr::UNSPECIFIED, port).into();
        match UdpSocket::bind(v6).or_else(|_| UdpSocket::bind(v4)) {
            Ok(s) => {
                sock = Some(s);
                break;
            }
            Err(e) => last_err = Some(e),
        }
    }
    let sock = sock.with_context(|| {
        format!(
            "no free UDP port in {}-{}: {}",
            ports.0,
            ports.1,
            last_err.map(|e| e.to_string()).unwrap_or_default()
        )
    })?;
    let port = sock.local_addr()?.port();
    let psk = Psk::generate();
    let opts = ServerOptions {
        listen: sock.local_addr()?,
        scope,
        psk: psk.clone(),
        proto,
        threads: 1,
    };
    let mut srv = Server::new(&opts, stop, log)?;
    // The ssh user's own far side may open what the user could reach through ssh anyway.
    srv.allow_tunnels = true;
    announce(port, &psk).context("cannot write to the ssh channel")?;
    let stream = StreamLink::new(chan.0, chan.1, Vec::new())?;
    // A client that never connects is given up on after a while.
    srv.unconnected_until = Some(Instant::now() + Duration::from_secs(120));
    let r = srv.run(Links::new(Some(sock), Some(stream)), &opts, CidShard::ALL);
    crate::writeback::settle_all();
    r
}

/// The server's policy on the driver's loop (`engine`): each session's files, events,
/// verdicts and `--update` decisions.
struct Server<'l> {
    root: Root,
    shown_root: String,
    stop: StopFlag,
    log: Log<'l>,
    /// Gives up at this time if no session has begun by then (`--stdio`).
    unconnected_until: Option<Instant>,
    last_state: Instant,
    save_states: bool,
    /// Offers whose temp file another session holds, for [`Server::supersede`].
    busy_offers: Vec<(Cid, Event)>,
    /// Offers whose temp file another process still holds (the far side of a killed copy,
    /// not yet gone), or whose FIFO has no reader yet: tried again each 100 ms until the
    /// time given, then refused. The loop never sleeps on them: other sessions go on.
    waiting: Vec<(Cid, Event, Instant)>,
    /// `hayate tunnel`: only the far side started over ssh (`--stdio`) opens them; a
    /// daemon exposes its root and nothing else.
    allow_tunnels: bool,
    /// Each session's tunnel end (its TCP connection).
    tunnels: HashMap<Cid, FarEnd>,
    /// What clients may do besides reading and writing (the far side over ssh: all of it).
    rules: Rules,
    /// On one of a daemon's threads: the board of uploads to give way, shared with the
    /// others.
    board: Option<Board>,
}

impl<'l> Server<'l> {
    fn new(opts: &ServerOptions, stop: StopFlag, log: Log<'l>) -> anyhow::Result<Self> {
        let (root, shown_root) = match &opts.scope {
            Scope::Confined(dir) => (
                Root::open(dir).map_err(|e| anyhow::anyhow!("--root: {e}"))?,
                dir.display().to_string(),
            ),
            Scope::WholeFs(cwd) => (
                Root::whole_fs(cwd)
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                    .expand_tilde(),
                "/".to_string(),
            ),
        };
        Ok(Self {
            root,
            shown_root,
            stop,
            log,
            unconnected_until: None,
            last_state: Instant::now(),
            save_states: false,
            busy_offers: Vec::new(),
            waiting: Vec::new(),
            allow_tunnels: false,
            tunnels: HashMap::new(),
            rules: Rules::default(),
            board: None,
        })
    }

    fn log_listening(&mut self, sock: &UdpSocket, threads: usize) -> anyhow::Result<()> {
        let on = if threads > 1 {
            format!(", {threads} threads")
        } else {
            String::new()
        };
        (self.log)(&format!(
            "listening on {} (root {}, receive buffer {} KiB{on})",
            sock.local_addr()?,
            self.shown_root,
            sock.recv_buffer_size() / 1024
        ));
        Ok(())
    }

    /// Serves until stopped (or, under ssh, until the channel closes), then closes every
    /// session, keeping what unfinished uploads hold for a rerun.
    fn run(&mut self, links: Links, opts: &ServerOptions, shard: CidShard) -> anyhow::Result<()> {
        let mut ep = Endpoint::new(opts.psk.clone(), opts.proto.clone(), Instant::now());
        ep.set_shard(shard);
        let mut net = Net::many(links, ep);
        let r = engine::run(self, &mut net);
        self.shutdown(&mut net);
        Ok(r?)
    }

    /// An upload whose temp file another session of ours still writes (a client killed and
    /// rerun before its old session timed out): the old receive gives way, keeping its
    /// resume state, and the new one takes over. The offer is then tried again at once,
    /// and for a few seconds of turns if another process holds the file (or a session on
    /// another of a daemon's threads, which is asked to give way too).
    fn supersede(&mut self, net: &mut Net<SessionFiles>, cid: Cid, ev: Event, now: Instant) {
        let Event::Offered { path, .. } = &ev else {
            return;
        };
        let want = norm_path(path);
        self.give_way(net, &want, Some(cid));
        if let Some(s) = net.session(cid) {
            if let Some(ev) = on_event(&self.root, s.conn, s.files, ev, s.addr, self.log, false) {
                self.waiting.push((cid, ev, now + BUSY_WAIT));
                if let Some(b) = &self.board {
                    b.shared.post(want, b.me, now);
                }
            }
        }
    }

    /// The receives of `want` (a normalized path) of every session but `except` give way,
    /// keeping their resume state; so do its undecided `--update` offers.
    fn give_way(&mut self, net: &mut Net<SessionFiles>, want: &str, except: Option<Cid>) {
        for other in net.cids() {
            if Some(other) == except {
                continue;
            }
            let Some(s) = net.session(other) else {
                continue;
            };
            let (f, c) = (s.files, s.conn);
            let old: Vec<XferId> = f
                .inc
                .iter()
                .filter(|(_, i)| norm_path(&i.path) == want)
                .map(|(x, _)| *x)
                .collect();
            let undecided: Vec<XferId> = f
                .deciding
                .iter()
                .filter(|(_, d)| norm_path(&d.up.path) == want)
                .map(|(x, _)| *x)
                .collect();
            for x in undecided {
                if let Some(d) = f.deciding.remove(&x) {
                    (self.log)(&format!(
                        "{}: superseded by a newer upload of the same file",
                        d.up.path
                    ));
                    d.part.drop_unstarted();
                    c.reject(x, "superseded by a newer upload of the same file");
                }
            }
            for x in old {
                if let Some(inc) = f.inc.remove(&x) {
                    (self.log)(&format!(
                        "{}: superseded by a newer upload of the same file",
                        inc.path
                    ));
                    inc.let_go(c, x);
                    c.reject(x, "superseded by a newer upload of the same file");
                }
            }
        }
    }

    /// Tries the waiting offers again; the last try refuses one still busy.
    fn retry_waiting(&mut self, net: &mut Net<SessionFiles>, now: Instant) {
        for (cid, ev, until) in std::mem::take(&mut self.waiting) {
            let Some(s) = net.session(cid) else {
                continue; // the session is gone
            };
            let last_try = now >= until;
            if let Some(ev) = on_event(&self.root, s.conn, s.files, ev, s.addr, self.log, last_try)
            {
                self.waiting.push((cid, ev, until));
            }
        }
    }

    fn shutdown(&mut self, net: &mut Net<SessionFiles>) {
        let now = Instant::now();
        for cid in net.cids() {
            if let Some(s) = net.session(cid) {
                for (x, inc) in s.files.inc.iter_mut() {
                    inc.saved = None;
                    save_state(s.conn, *x, inc);
                }
                s.conn.close(now, 1, "server shutting down");
            }
            net.transmit(cid);
        }
        for (_, f) in net.files.drain() {
            abandon(f, self.log);
        }
    }
}

impl Policy for Server<'_> {
    type Files = SessionFiles;

    fn wake_by(&self, now: Instant) -> Instant {
        let wait = if self.waiting.is_empty() {
            Duration::from_millis(200)
        } else {
            BUSY_POLL
        };
        now + wait
    }

    fn begin(&mut self, now: Instant, net: &mut Net<SessionFiles>) -> Flow {
        if self.unconnected_until.is_some_and(|t| now >= t) {
            (self.log)("no client connected within 120 s");
            return Flow::Stop;
        }
        // Under ssh, a closed channel means the client is gone (done, or killed).
        if self.stop.is_stopped() || net.links.stream_eof() {
            return Flow::Stop;
        }
        self.save_states = now.duration_since(self.last_state) >= STATE_EVERY;
        if self.save_states {
            self.last_state = now;
        }
        Flow::Go
    }

    fn accept(&mut self, _cid: Cid, c: &mut Connection, _from: SocketAddr) -> bool {
        self.unconnected_until = None;
        // Files it sends are hashed by the workers (`Sending`).
        c.hash_sources_outside();
        true
    }

    fn on_event(&mut self, s: &mut Session<'_, SessionFiles>, ev: Event, _now: Instant) {
        if let Event::TunnelRequested { host, port } = &ev {
            if !self.allow_tunnels {
                (self.log)(&format!("{}: refused a tunnel to {host}:{port}", s.addr));
                s.conn.answer_tunnel(Err(NO_TUNNELS.to_string()));
                return;
            }
            match FarEnd::connect(host, *port) {
                Ok(t) => {
                    self.tunnels.insert(s.cid, t);
                }
                Err(e) => s.conn.answer_tunnel(Err(e)),
            }
            return;
        }
        if let Event::MetaRequested {
            id,
            op: MetaOp::Remove { top, path, .. },
        } = &ev
        {
            if !self.rules.delete {
                (self.log)(&format!("{}: refused to delete {top}/{path}", s.addr));
                s.conn.meta_reply(*id, Err(NO_DELETE.to_string()));
                return;
            }
        }
        let ev = place_into_dir(&self.root, ev);
        if let Some(busy) = on_event(&self.root, s.conn, s.files, ev, s.addr, self.log, false) {
            self.busy_offers.push((s.cid, busy));
        }
    }

    fn turn(&mut self, s: &mut Session<'_, SessionFiles>, _now: Instant) -> bool {
        if let Some(t) = self.tunnels.get_mut(&s.cid) {
            t.turn(s.conn);
        }
        let tunnel = self.tunnels.get(&s.cid).is_some_and(FarEnd::is_live);
        let (c, f) = (&mut *s.conn, &mut *s.files);
        settle_verified(c, f, s.addr, self.log);
        settle_update_hashes(c, f);
        // Keep-alive PINGs, set here only, for whichever needs them: the peer may hear
        // nothing else while a big file is hashed, and an idle shell through a tunnel is not
        // a dead session (the client pings too, but either side's pings keep both alive).
        c.keep_alive(f.hashing() || tunnel);
        let hashing = give_source_hashes(c, f) || f.hashing();
        if self.save_states {
            for (x, inc) in f.inc.iter_mut() {
                save_state(c, *x, inc);
            }
        }
        hashing || f.inc.values().any(|i| i.landing.verifying())
    }

    fn end(&mut self, now: Instant, net: &mut Net<SessionFiles>) -> Flow {
        // The ssh channel closed in this turn: the client is done with us, so leave now
        // rather than after the idle wait (it is waiting for ssh, and so for us, to exit).
        if net.links.stream_eof() {
            return Flow::Stop;
        }
        let asked = self.board.as_mut().map(|b| b.take(now)).unwrap_or_default();
        for path in asked {
            self.give_way(net, &path, None);
        }
        self.retry_waiting(net, now);
        for (cid, ev) in std::mem::take(&mut self.busy_offers) {
            self.supersede(net, cid, ev, now);
        }
        Flow::Go
    }

    fn reaped(&mut self, cid: Cid, f: SessionFiles) {
        self.tunnels.remove(&cid);
        abandon(f, self.log);
    }

    fn wait_fds(&self) -> Vec<(std::os::fd::BorrowedFd<'_>, libc::c_short)> {
        self.tunnels.values().flat_map(FarEnd::wait_fds).collect()
    }
}

/// What a `--no-delete` daemon answers a removal.
const NO_DELETE: &str = "this server deletes nothing (hayate serve --no-delete)";

/// What a daemon answers a tunnel request.
const NO_TUNNELS: &str = "this server opens no tunnels (a `hayate serve --root` daemon serves \
                          files only; `hayate tunnel` starts its own far side over ssh)";

fn abandon(f: SessionFiles, log: Log<'_>) {
    for (_, d) in f.deciding {
        d.part.drop_unstarted();
    }
    for (_, part) in f.bases.into_values().filter_map(|b| b.waiting) {
        part.drop_unstarted();
    }
    for (_, inc) in f.inc {
        if inc.part.in_place() {
            log(&format!(
                "incomplete upload into {} (a device or FIFO: nothing kept)",
                inc.path
            ));
        } else if !inc.answered {
            log(&format!(
                "incomplete upload into {} (still compared: nothing kept)",
                inc.path
            ));
            inc.part.drop_unstarted();
            continue;
        } else {
            log(&format!(
                "incomplete upload kept as {} (a rerun resumes it)",
                inc.part.part_name()
            ));
        }
        inc.part.abandon();
    }
}

/// An `INTO_DIR` offer of `DIR/NAME` names `DIR/NAME` if `DIR` is a directory (or a link to
/// one: a destination link is followed, as scp does), else `DIR` itself. The flag stays set,
/// so that `Ready` tells the client which.
fn place_into_dir(root: &Root, mut ev: Event) -> Event {
    if let Event::Offered {
        path, flags: fl, ..
    } = &mut ev
    {
        if *fl & flags::INTO_DIR != 0 {
            // A path without a directory part leaves nothing to choose.
            if let Some((dir, _)) = path.trim_end_matches('/').rsplit_once('/') {
                // The trailing '/' follows a final symlink (beneath a confined root).
                let followed = format!("{dir}/");
                if !dir.is_empty() && !root.stat(&followed).is_ok_and(|e| e.kind == EntryKind::Dir)
                {
                    *path = dir.to_string();
                }
            }
        }
    }
    ev
}

/// Opens the temp file for an upload (or, `--inplace`, the destination itself). Never
/// waits: a busy one is tried again on later turns (`Server::waiting`).
fn open_part(root: &Root, path: &str, size: u64, fl: u32) -> Result<PartFile, FsError> {
    if fl & flags::INPLACE != 0 {
        root.create_part_inplace(path, size)
    } else {
        root.create_part(path, size)
    }
}

/// Handles one session event. Returns an offer it could not take yet because its temp file
/// is busy (unless `last_try`), for [`Server::supersede`] and later turns.
fn on_event(
    root: &Root,
    c: &mut Connection,
    f: &mut SessionFiles,
    ev: Event,
    addr: SocketAddr,
    log: Log<'_>,
    last_try: bool,
) -> Option<Event> {
    match ev {
        Event::Connected => log(&format!("{addr}: session {:08x} established", c.my_cid())),
        Event::Offered {
            xfer,
            ref path,
            size,
            mode,
            mtime,
            flags,
            hash,
        } => {
            let part = match open_part(root, path, size, flags) {
                Ok(p) => p,
                Err(FsError::Busy(_) | FsError::NoReader(_)) if !last_try => return Some(ev),
                Err(FsError::NoReader(p)) => {
                    let e = format!(
                        "{p}: nothing reads from this FIFO (waited {} s)",
                        BUSY_WAIT.as_secs()
                    );
                    log(&format!("{addr}: refused upload: {e}"));
                    c.reject(xfer, &e);
                    return None;
                }
                Err(e) => {
                    log(&format!("{addr}: refused upload: {e}"));
                    c.reject(xfer, &e.to_string());
                    return None;
                }
            };
            let up = Upload {
                path: path.clone(),
                size,
                mode,
                mtime,
                flags,
            };
            match skip_reason(root, &up.path, &part, size, flags, hash) {
                Skip::No => accept_upload(c, f, xfer, part, up),
                Skip::Yes(reason) => skip_upload(c, xfer, part, &reason),
                // Hashed by the workers: the loop goes on meanwhile (`settle_update_hashes`).
                Skip::IfSame(file, want) => {
                    let hash = WholeHash::start(file, size);
                    f.deciding.insert(
                        xfer,
                        Deciding {
                            up,
                            part,
                            want,
                            hash,
                        },
                    );
                }
            }
        }
        Event::GetRequested { xfer, path, flags } => match root.open_read(&path) {
            Ok((file, meta)) => {
                let src = SourceFile::new(file, meta.len());
                let src = match root.try_clone() {
                    Ok(r) => {
                        let path = path.clone();
                        src.watch(Box::new(move || {
                            r.identity(&path).map_err(std::io::Error::other)
                        }))
                    }
                    Err(_) => src,
                };
                let d = Download {
                    path,
                    src,
                    mode: meta.mode(),
                    mtime: meta.mtime(),
                    flags,
                };
                if flags & flags::UPDATE == 0 {
                    offer_download(c, f, xfer, d, None);
                    return None;
                }
                // The offer carries the hash: the workers compute it, the loop goes on
                // meanwhile (`settle_update_hashes`).
                match d.src.try_clone_file() {
                    Ok(file) => {
                        let hash = WholeHash::start(file, d.src.size());
                        f.offering.insert(xfer, (d, hash));
                    }
                    Err(e) => c.reject(xfer, &format!("{}: {e}", d.path)),
                }
            }
            Err(e) => {
                log(&format!("{addr}: refused download: {e}"));
                // A client asks for one source without listing it first: this is where
                // `cp HOST:DIR .` learns it needed `-r`.
                let hint = if matches!(e, FsError::IsADirectory(_)) {
                    " (use -r)"
                } else {
                    ""
                };
                c.reject(xfer, &format!("{e}{hint}"));
            }
        },
        Event::MetaRequested { id, op } => {
            let result = match op {
                MetaOp::List { path, recursive } => root
                    .list(&path, recursive, MAX_LIST)
                    .map(|v| v.into_iter().map(to_wire).collect()),
                MetaOp::Glob { pattern } => root
                    .glob(&pattern, MAX_LIST)
                    .map(|v| v.into_iter().map(to_wire).collect()),
                MetaOp::Mkdir { path, mode } => root.mkdirs(&path, mode).map(|()| Vec::new()),
                MetaOp::Symlink { path, target } => {
                    root.symlink(&path, &target).map(|()| Vec::new())
                }
                MetaOp::SetMeta { path, mode, mtime } => root
                    .set_meta(&path, mode, mtime.map(|t| (t, 0)))
                    .map(|()| Vec::new()),
                MetaOp::Remove { top, path, dir } => {
                    let r = root.remove(&top, &path, dir);
                    if r.is_ok() {
                        log(&format!("{addr}: deleted {top}/{path}"));
                    }
                    r.map(|()| Vec::new())
                }
            };
            c.meta_reply(id, result.map_err(|e| e.to_string()));
        }
        Event::IncomingComplete { xfer, blake3 } => {
            // The verdict follows when the last subtrees are hashed (`settle_verified`).
            if let Some(inc) = f.inc.get_mut(&xfer) {
                inc.landing.complete(blake3);
            }
            settle_verified(c, f, addr, log);
        }
        Event::IncomingFailed { xfer, reason } => {
            if let Some(d) = f.deciding.remove(&xfer) {
                log(&format!("{addr}: upload {} failed: {reason}", d.up.path));
                d.part.drop_unstarted();
            }
            if let Some(inc) = f.inc.remove(&xfer) {
                log(&format!("{addr}: upload {} failed: {reason}", inc.path));
                if inc.no_space {
                    // Keeping it would leave the disk full for everything else.
                    inc.part.discard();
                } else {
                    inc.let_go(c, xfer);
                }
            }
        }
        Event::OutgoingDone { xfer, result } => {
            f.out.remove(&xfer);
            if let Err(e) = result {
                log(&format!("{addr}: download failed: {e}"));
            }
        }
        Event::Rejected { xfer, reason } => {
            f.out.remove(&xfer);
            f.offering.remove(&xfer);
            if let Some((_, part)) = f.bases.remove(&xfer).and_then(|b| b.waiting) {
                part.drop_unstarted();
            }
            if let Some(d) = f.deciding.remove(&xfer) {
                d.part.drop_unstarted();
            }
            if let Some(inc) = f.inc.remove(&xfer) {
                inc.let_go(c, xfer);
            }
            log(&format!("{addr}: client aborted a transfer: {reason}"));
        }
        Event::Skipped { xfer, .. } => {
            f.out.remove(&xfer);
        }
        Event::Bye
        | Event::MetaReplied { .. }
        | Event::Placed { .. }
        | Event::TunnelRequested { .. }
        | Event::TunnelAnswered { .. } => {}
        Event::Closed { error } => {
            let s = c.stats();
            // Blocks that came while the disk was behind were dropped, to be sent again.
            let refused = match s.blocks_refused_by_sink {
                0 => String::new(),
                n => format!(", {n} blocks refused while the disk was behind"),
            };
            match error {
                None => log(&format!(
                    "{addr}: session closed ({} packets in, {} out, {} of them data, {} retransmitted{refused})",
                    s.packets_received,
                    s.packets_sent,
                    s.data_packets_sent,
                    s.data_packets_retransmitted
                )),
                Some(e) => log(&format!("{addr}: session ended: {e}")),
            }
            for (x, inc) in f.inc.drain() {
                inc.let_go(c, x);
            }
            for (_, d) in f.deciding.drain() {
                d.part.drop_unstarted();
            }
            for (_, part) in f.bases.drain().filter_map(|(_, b)| b.waiting) {
                part.drop_unstarted();
            }
            f.out.clear();
            f.offering.clear();
        }
    }
    None
}

/// Whether an offered file is received (see [`skip_reason`]).
pub(crate) enum Skip {
    No,
    /// Not at all, for this reason.
    Yes(String),
    /// Not if this file, the one at the destination, hashes to this (`--update`).
    IfSame(std::fs::File, [u8; 32]),
}

/// Whether an offered file need not be received at all (`--no-clobber`, `--update`).
pub(crate) fn skip_reason(
    root: &Root,
    path: &str,
    part: &PartFile,
    size: u64,
    flags: u32,
    hash: Option<[u8; 32]>,
) -> Skip {
    if flags & (flags::NO_CLOBBER | flags::UPDATE) == 0 {
        return Skip::No;
    }
    let Some(existing) = part.final_exists() else {
        return Skip::No;
    };
    if flags & flags::NO_CLOBBER != 0 {
        return Skip::Yes("destination exists (--no-clobber)".into());
    }
    let Some(want) = hash else {
        return Skip::No;
    };
    if existing.kind != EntryKind::File || existing.size != size {
        return Skip::No;
    }
    match root.open_read(path) {
        Ok((file, meta)) if meta.len() == size => Skip::IfSame(file, want),
        _ => Skip::No,
    }
}

/// Declines an upload on purpose; its temp file goes unless an earlier run left it.
fn skip_upload(c: &mut Connection, xfer: XferId, part: PartFile, reason: &str) {
    c.skip(xfer, reason);
    part.drop_unstarted();
}

/// Receives an upload into its temp file: at once, or, when there is a basis (what an
/// earlier run left there, or the file at the destination), as the sender's leaf hashes
/// are compared with it (`settle_bases`).
fn accept_upload(
    c: &mut Connection,
    f: &mut SessionFiles,
    xfer: XferId,
    mut part: PartFile,
    up: Upload,
) {
    match basis_for(&mut part, up.size, up.flags, up.mtime) {
        Some(basis) => {
            c.want_sums(xfer, basis.kind);
            f.bases.insert(
                xfer,
                Comparing {
                    basis,
                    waiting: Some((up, part)),
                },
            );
        }
        None => {
            if take_upload(c, f, xfer, part, up) {
                let inc = f.inc.get_mut(&xfer).expect("taken");
                inc.answered = true;
                // Holding nothing: nothing to wait for, nothing to fail.
                let _ = inc
                    .landing
                    .hold(&mut inc.part, &[], inc.size, Known::default());
                let placed = (inc.flags & flags::INTO_DIR != 0).then(|| inc.path.clone());
                c.accept_with(xfer, &[], &[], placed.as_deref());
            }
        }
    }
}

/// Receives an upload into its temp file (its verification started): what the file
/// already holds is told to its landing and the sender next. False if that failed (the
/// upload is rejected).
fn take_upload(
    c: &mut Connection,
    f: &mut SessionFiles,
    xfer: XferId,
    mut part: PartFile,
    up: Upload,
) -> bool {
    let landing = match Landing::begin(&mut part, up.size) {
        Ok(l) => l,
        Err(e) => {
            c.reject(xfer, &format!("{}: {e}", up.path));
            // Short of space, say (the reserve failed): what this run made goes.
            part.drop_unstarted();
            return false;
        }
    };
    f.inc.insert(
        xfer,
        Incoming {
            part,
            path: up.path,
            size: up.size,
            mode: up.mode,
            mtime: up.mtime,
            flags: up.flags,
            saved: None,
            no_space: false,
            landing,
            answered: false,
        },
    );
    true
}

/// Sends a file asked for, offering it (with its hash for `--update`).
fn offer_download(
    c: &mut Connection,
    f: &mut SessionFiles,
    xfer: XferId,
    d: Download,
    hash: Option<blake3::Hash>,
) {
    c.offer_ext(
        xfer,
        &FileOffer {
            path: &d.path,
            size: d.src.size(),
            mode: d.mode,
            mtime: d.mtime,
            flags: d.flags,
            hash: hash.map(|h| *h.as_bytes()),
        },
    );
    match Sending::new(d.src) {
        Ok(s) => {
            f.out.insert(xfer, s);
        }
        Err(e) => c.fail_source(xfer, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hayate_proto::wire::AddrFamily;
    use hayate_proto::{NoFiles, Route};

    /// The far side of a tunnel keeps its session alive on its own, every turn, from the
    /// request on: its keep-alive is what the hashing and the tunnel need together, so the
    /// turn that finds no hashing to do does not switch off what the tunnel asked for.
    /// Without a tunnel (and no hashing) it is off.
    #[test]
    fn an_open_tunnel_keeps_its_session_alive_every_turn() {
        let service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = service.local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let psk = Psk::generate();
        let cfg = Config::default();
        let opts = ServerOptions {
            listen: ([127, 0, 0, 1], 0).into(),
            scope: Scope::WholeFs(dir.path().to_path_buf()),
            psk: psk.clone(),
            proto: cfg.clone(),
            threads: 1,
        };
        let mut log = |_: &str| {};
        let mut srv = Server::new(&opts, StopFlag::new(), &mut log).unwrap();
        srv.allow_tunnels = true;
        let t0 = Instant::now();
        let mut ep = Endpoint::new(psk.clone(), cfg.clone(), t0);
        let mut client = Connection::client(cfg, &psk, AddrFamily::V4, t0);
        let mut files = SessionFiles::default();
        let addr: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let mut cid = None;
        let mut buf = vec![0u8; 2048];
        let (mut asked, mut answered, mut turns) = (false, false, 0);
        for i in 0..2_000 {
            let now = t0 + Duration::from_millis(i);
            if client.is_established() && !asked {
                client.open_tunnel("127.0.0.1", port);
                asked = true;
            }
            while let Some(n) = client.poll_transmit(now, &mut buf, &mut NoFiles) {
                match ep.route(now, addr, &buf[..n]) {
                    Route::NewConn(id, mut reply) => {
                        cid = Some(id);
                        client.handle_datagram(now, &mut reply, &mut NoFiles);
                    }
                    Route::Conn(id) => {
                        ep.handle(id, now, now, addr, &mut buf[..n], &mut NoFiles);
                    }
                    _ => {}
                }
            }
            while let Some(ev) = client.poll_event() {
                if let Event::TunnelAnswered { result } = ev {
                    assert_eq!(result, Ok(()));
                    answered = true;
                }
            }
            let Some(id) = cid else { continue };
            let conn = ep.conn_mut(id).expect("session");
            if conn.poll_timeout(now).is_some_and(|t| t <= now) {
                conn.handle_timeout(now);
            }
            let mut s = Session {
                cid: id,
                addr,
                conn,
                files: &mut files,
            };
            while let Some(ev) = s.conn.poll_event() {
                srv.on_event(&mut s, ev, now);
            }
            srv.turn(&mut s, now);
            if srv.tunnels.contains_key(&id) {
                assert!(s.conn.keeps_alive(), "turn {turns} with a tunnel");
                turns += 1;
            }
            while let Some(n) = s.conn.poll_transmit(now, &mut buf, &mut NoFiles) {
                client.handle_datagram(now, &mut buf[..n], &mut NoFiles);
            }
            if answered && turns >= 20 {
                break;
            }
            // The far side's TCP connection opens in real time.
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(answered, "the tunnel was never opened");
        let id = cid.expect("session");
        assert!(matches!(srv.tunnels.get(&id), Some(FarEnd::Open(_))));
        // Nothing needs it any more.
        srv.tunnels.remove(&id);
        let conn = ep.conn_mut(id).expect("session");
        let mut s = Session {
            cid: id,
            addr,
            conn,
            files: &mut files,
        };
        srv.turn(&mut s, t0);
        assert!(!s.conn.keeps_alive());
    }
}
