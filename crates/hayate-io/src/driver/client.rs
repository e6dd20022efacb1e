//! `hayate cp` against a running server: one session, any number of uploads and downloads,
//! pipelined. Each file either ends verified under its final name or is reported with what
//! is missing.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hayate_proto::crypto::Psk;
use hayate_proto::wire::AddrFamily;
use hayate_proto::{BlockSink, BlockSource, Config, Connection, Event, Stats, XferId};

use super::{SendBatch, StopFlag};
use crate::fs::{create_local_part, read_at, PartFile};
use crate::udp::{RecvBufs, UdpSocket};

/// Transfers in flight at once; more are queued (bounds open files and state).
const MAX_ACTIVE: usize = 64;

pub struct ClientOptions {
    pub server: SocketAddr,
    pub psk: Psk,
    pub proto: Config,
}

#[derive(Debug, Clone)]
pub enum Transfer {
    Upload { local: PathBuf, remote: String },
    Download { remote: String, local: PathBuf },
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct FileResult {
    pub upload: bool,
    pub local: PathBuf,
    pub remote: String,
    pub bytes: u64,
    /// BLAKE3 of the whole file, hex, when verified.
    pub blake3: Option<String>,
    pub verified: bool,
    pub error: Option<String>,
}

#[derive(Debug)]
pub struct Report {
    pub files: Vec<FileResult>,
    pub seconds: f64,
    pub stats: Stats,
    /// Session-level failure (no server, wrong key, interrupted, peer vanished).
    pub error: Option<String>,
}

impl Report {
    pub fn all_verified(&self) -> bool {
        self.error.is_none() && self.files.iter().all(|f| f.verified)
    }
    pub fn bytes_verified(&self) -> u64 {
        self.files
            .iter()
            .filter(|f| f.verified)
            .map(|f| f.bytes)
            .sum()
    }
}

/// A snapshot for progress bars and stats lines.
pub struct Progress<'a> {
    pub elapsed: Duration,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub files_done: usize,
    pub files_total: usize,
    pub stats: &'a Stats,
    pub connected: bool,
}

struct Active {
    idx: usize,
    upload: bool,
    size: u64,
    file: Option<File>,
    part: Option<PartFile>,
}

#[derive(Default)]
struct Files {
    act: HashMap<XferId, Active>,
}

impl BlockSource for Files {
    fn read(&mut self, xfer: XferId, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        let f = self
            .act
            .get(&xfer)
            .and_then(|a| a.file.as_ref())
            .ok_or("transfer not open")?;
        match read_at(f, offset, buf) {
            Ok(n) if n == buf.len() => Ok(()),
            Ok(_) => Err("file shrank while being sent".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl BlockSink for Files {
    fn write(&mut self, xfer: XferId, offset: u64, data: &[u8]) -> Result<(), String> {
        let p = self
            .act
            .get(&xfer)
            .and_then(|a| a.part.as_ref())
            .ok_or("transfer not open")?;
        p.write_at(offset, data).map_err(|e| e.to_string())
    }
}

fn hex(h: &[u8; 32]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs the whole job. Never panics on I/O trouble: everything ends up in the report.
pub fn run(
    opts: ClientOptions,
    transfers: Vec<Transfer>,
    stop: StopFlag,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Report {
    let start = Instant::now();
    let mut results: Vec<FileResult> = transfers
        .iter()
        .map(|t| {
            let (upload, local, remote) = match t {
                Transfer::Upload { local, remote } => (true, local, remote),
                Transfer::Download { remote, local } => (false, local, remote),
            };
            FileResult {
                upload,
                local: local.clone(),
                remote: remote.clone(),
                bytes: 0,
                blake3: None,
                verified: false,
                error: None,
            }
        })
        .collect();
    let report = |results: Vec<FileResult>, stats: Stats, error: Option<String>| Report {
        files: results,
        seconds: start.elapsed().as_secs_f64(),
        stats,
        error,
    };

    // Open every source first: a missing one is reported, the others still go.
    let mut queue: VecDeque<(usize, Option<File>)> = VecDeque::new();
    for (i, t) in transfers.iter().enumerate() {
        match t {
            Transfer::Upload { local, .. } => match open_source(local) {
                Ok((f, size)) => {
                    results[i].bytes = size;
                    queue.push_back((i, Some(f)));
                }
                Err(e) => results[i].error = Some(e),
            },
            Transfer::Download { .. } => queue.push_back((i, None)),
        }
    }
    if queue.is_empty() {
        return report(results, Stats::default(), None);
    }

    let bind: SocketAddr = if opts.server.is_ipv4() {
        "0.0.0.0:0".parse().expect("addr")
    } else {
        "[::]:0".parse().expect("addr")
    };
    let sock = match UdpSocket::bind(bind) {
        Ok(s) => s,
        Err(e) => {
            return report(
                results,
                Stats::default(),
                Some(format!("cannot open a UDP socket: {e}")),
            )
        }
    };
    let _ = crate::clock::set_timer_slack_ns(1);
    let fam = if opts.server.is_ipv4() {
        AddrFamily::V4
    } else {
        AddrFamily::V6
    };
    let mut conn = Connection::client(opts.proto.clone(), &opts.psk, fam, Instant::now());
    let mut files = Files::default();
    let mut rbufs = RecvBufs::new(32);
    let mut batch = SendBatch::new(65536, 64);
    let mut bytes_total: u64 = results.iter().filter(|r| r.upload).map(|r| r.bytes).sum();
    let files_total = transfers.len();
    let mut finished_bytes = 0u64;
    let mut session_error: Option<String> = None;
    let mut bye_at: Option<Instant> = None;
    let mut last_progress = Instant::now() - Duration::from_secs(1);
    let mut connected = false;

    loop {
        let now = Instant::now();
        if stop.is_stopped() && session_error.is_none() {
            session_error = Some("interrupted".into());
            conn.close(now, 1, "client interrupted");
        }
        // Start queued transfers while there is room.
        while files.act.len() < MAX_ACTIVE && session_error.is_none() {
            let Some((i, file)) = queue.pop_front() else {
                break;
            };
            let (xfer, upload, size) = match &transfers[i] {
                Transfer::Upload { remote, .. } => {
                    let f = file.as_ref().expect("opened");
                    let (mode, mtime) = f
                        .metadata()
                        .map(|m| (m.mode(), m.mtime()))
                        .unwrap_or((0o644, 0));
                    (
                        conn.send_file(remote, results[i].bytes, mode, mtime),
                        true,
                        results[i].bytes,
                    )
                }
                Transfer::Download { remote, .. } => (conn.request(remote), false, 0),
            };
            files.act.insert(
                xfer,
                Active {
                    idx: i,
                    upload,
                    size,
                    file,
                    part: None,
                },
            );
        }

        if let Err(e) = sock.recv_batch(&mut rbufs) {
            session_error.get_or_insert(format!("receive failed: {e}"));
            break;
        }
        for (from, d) in rbufs.datagrams() {
            if from == opts.server {
                conn.handle_datagram(now, d, &mut files);
            }
        }
        conn.set_receiver_state(0, sock.kernel_drops());
        if conn.poll_timeout(now).is_some_and(|t| t <= now) {
            conn.handle_timeout(now);
        }
        while let Some(ev) = conn.poll_event() {
            match ev {
                Event::Connected => connected = true,
                Event::Offered { xfer, size, .. } => {
                    let Some(a) = files.act.get_mut(&xfer) else {
                        continue;
                    };
                    let r = &mut results[a.idx];
                    match create_local_part(&r.local, size) {
                        Ok(p) => {
                            a.part = Some(p);
                            a.size = size;
                            r.bytes = size;
                            bytes_total += size;
                            conn.accept(xfer, &[]);
                        }
                        Err(e) => {
                            r.error = Some(e.to_string());
                            conn.reject(xfer, &format!("client cannot write: {e}"));
                            files.act.remove(&xfer);
                        }
                    }
                }
                Event::IncomingComplete { xfer, blake3 } => {
                    let Some(a) = files.act.remove(&xfer) else {
                        continue;
                    };
                    let r = &mut results[a.idx];
                    let part = a.part.expect("accepted downloads have a part file");
                    let verdict = match part.hash() {
                        Ok(h) if *h.as_bytes() == blake3 => part
                            .commit(None, None)
                            .map(|_| blake3)
                            .map_err(|e| format!("cannot rename into place: {e}")),
                        Ok(_) => {
                            part.abandon();
                            Err("BLAKE3 mismatch after transfer".to_string())
                        }
                        Err(e) => Err(format!("cannot read back for verification: {e}")),
                    };
                    match &verdict {
                        Ok(h) => {
                            r.verified = true;
                            r.blake3 = Some(hex(h));
                            finished_bytes += a.size;
                        }
                        Err(e) => r.error = Some(e.clone()),
                    }
                    conn.finish_incoming(xfer, verdict);
                }
                Event::IncomingFailed { xfer, reason } => {
                    if let Some(a) = files.act.remove(&xfer) {
                        results[a.idx].error = Some(reason);
                        if let Some(p) = a.part {
                            p.abandon();
                        }
                    }
                }
                Event::OutgoingDone { xfer, result } => {
                    if let Some(a) = files.act.remove(&xfer) {
                        let r = &mut results[a.idx];
                        match result {
                            Ok(h) => {
                                r.verified = true;
                                r.blake3 = Some(hex(&h));
                                finished_bytes += a.size;
                            }
                            Err(e) => r.error = Some(format!("server: {e}")),
                        }
                    }
                }
                Event::Rejected { xfer, reason } => {
                    if let Some(a) = files.act.remove(&xfer) {
                        results[a.idx].error = Some(format!("server refused: {reason}"));
                    }
                }
                Event::GetRequested { .. } | Event::Bye => {}
                Event::Closed { error } => {
                    if let Some(e) = error {
                        session_error.get_or_insert(e);
                    }
                }
            }
        }

        if files.act.is_empty() && queue.is_empty() && bye_at.is_none() && session_error.is_none() {
            conn.bye();
            bye_at = Some(now);
        }
        while let Some(n) = conn.poll_transmit(now, batch.slot(), &mut files) {
            batch.commit(&sock, opts.server, n);
        }
        batch.flush(&sock);

        if now.duration_since(last_progress) >= Duration::from_millis(100) {
            last_progress = now;
            let stats = conn.stats();
            let active: u64 = files
                .act
                .iter()
                .map(|(x, a)| {
                    if a.upload {
                        conn.outgoing_acked_bytes(*x).unwrap_or(0)
                    } else {
                        conn.incoming_progress(*x)
                            .map(|(got, n)| (a.size * got).checked_div(n).unwrap_or(0))
                            .unwrap_or(0)
                    }
                })
                .sum();
            progress(&Progress {
                elapsed: start.elapsed(),
                bytes_done: finished_bytes + active,
                bytes_total,
                files_done: results
                    .iter()
                    .filter(|r| r.verified || r.error.is_some())
                    .count(),
                files_total,
                stats: &stats,
                connected,
            });
        }

        if conn.is_draining() {
            break;
        }
        // All done and said goodbye: don't wait long for the server's CLOSE.
        if bye_at.is_some_and(|t| now.duration_since(t) > Duration::from_secs(2)) {
            break;
        }
        let next = conn
            .poll_timeout(now)
            .unwrap_or(now + Duration::from_millis(100))
            .min(now + Duration::from_millis(100));
        if next > Instant::now() {
            if let Err(e) = crate::clock::wait_readable_until(&sock, next) {
                session_error.get_or_insert(format!("socket wait failed: {e}"));
                break;
            }
        }
    }

    // Whatever is still open did not finish: say what is missing, keep partial files.
    for (xfer, a) in files.act.drain() {
        let r = &mut results[a.idx];
        let why = session_error
            .clone()
            .unwrap_or_else(|| "session ended".into());
        let detail = if a.upload {
            let acked = conn.outgoing_acked_bytes(xfer).unwrap_or(0);
            format!("{why}; server acknowledged {acked} of {} bytes", a.size)
        } else if let Some((got, n)) = conn.incoming_progress(xfer) {
            let missing = conn.incoming_missing(xfer).unwrap_or_default();
            let first: Vec<String> = missing
                .iter()
                .take(5)
                .map(|(a, b)| format!("{a}..{b}"))
                .collect();
            format!(
                "{why}; received {got} of {n} blocks, missing blocks {}{}",
                first.join(", "),
                if missing.len() > 5 { ", ..." } else { "" }
            )
        } else {
            why
        };
        r.error.get_or_insert(detail);
        if let Some(p) = a.part {
            p.abandon();
        }
    }
    for (i, _) in queue {
        results[i].error.get_or_insert_with(|| {
            session_error
                .clone()
                .unwrap_or_else(|| "not started".into())
        });
    }
    let stats = conn.stats();
    report(results, stats, session_error)
}

/// Errors do not repeat the path: the report already names the file.
fn open_source(path: &PathBuf) -> Result<(File, u64), String> {
    let f = File::open(path).map_err(|e| e.to_string())?;
    let m = f.metadata().map_err(|e| e.to_string())?;
    if !m.is_file() {
        return Err("not a regular file".into());
    }
    Ok((f, m.len()))
}
