//! The near side of `hayate cp`: one session, any number of files, directory trees and links,
//! pipelined. Each file either ends verified under its final name, is skipped on purpose
//! (`--no-clobber`, `--update`), or is reported with what is missing (and its temp file and
//! resume state are kept for a rerun).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hayate_proto::cc::PathMeasurement;
use hayate_proto::control::{basis, flags, EntryKind as WireKind, MetaEntry, MetaOp};
use hayate_proto::crypto::Psk;
use hayate_proto::wire::AddrFamily;
use hayate_proto::{
    BlockSink, BlockSource, Config, Connection, Event, FileOffer, Stats, StorageError, XferId,
};

use super::engine::{self, Flow, Net, Policy};
use super::link::{Links, StreamLink, STREAM_PEER};
use super::resume::save_progress;
use super::{dest_mode, systime, StopFlag};
use crate::delta::{basis_for, keep_small_if_same, pump_sums, Basis};
use crate::fs::{
    self, create_local_part, create_local_part_inplace, EntryKind, PartFile, Root, SourceError,
    SourceFile,
};
use crate::udp::UdpSocket;
use crate::verify::{Known, Landing, ReceiveError, Sending, WholeHash};

/// Transfers in flight at once; more are queued (bounds open files and state).
const MAX_ACTIVE: usize = 64;
/// Largest datagram on the stream fallback (no IP path limits it; bigger means fewer frames).
const STREAM_MTU: u16 = 16384;
/// Why a directory source without `-r` is not copied (any direction, any number of sources).
const DIR_NEEDS_R: &str = "is a directory (use -r)";
/// Most entries a listing of a tree may hold (a runaway tree is an error, not an OOM).
const MAX_LIST: usize = 4_000_000;

/// How datagrams reach the far side.
pub enum Transport {
    /// UDP to this address.
    Udp(SocketAddr),
    /// Only the byte stream (ssh channel).
    Stream(StreamLink),
    /// UDP first; the stream if no UDP answer came within `after`.
    UdpThenStream {
        /// The far side's UDP address: its banner's port, at the banner's address or else
        /// the host name resolved here.
        addr: SocketAddr,
        /// The ssh channel, held in reserve until UDP answers or the fallback is taken.
        stream: StreamLink,
        /// How long after the start UDP may stay without a handshake answer before the
        /// session starts again on `stream` (sooner if the UDP session gives up).
        after: Duration,
    },
}

/// How [`run`] reaches the far side and the user's options for the whole job.
pub struct ClientOptions {
    /// How datagrams reach the far side: UDP, the ssh channel, or UDP with the channel as
    /// fallback.
    pub path: Transport,
    /// The key both sides hold: the far side's fresh session key from its ssh banner, or
    /// the key file's key for a `hayate://` daemon.
    pub psk: Psk,
    /// Protocol settings asked of the server (MTU, rate, timeouts); on the ssh channel the
    /// MTU is replaced by the stream's 16 KiB.
    pub proto: Config,
    /// [`flags`]: PRESERVE (`-p`), NO_CLOBBER, UPDATE.
    pub flags: u32,
    /// `-r`: directories are copied with everything beneath them.
    pub recursive: bool,
    /// `hayate cp - DEST`: the upload's one source, named `-` in the job, is standard input
    /// already spooled into this (unnamed) file.
    pub stdin: Option<File>,
    /// `hayate cp SRC -`: the download's destination `-` is standard output, written in
    /// order as the bytes come (no temp file, no resume).
    pub stdout: bool,
    /// `--retry-changed`: a file whose source changed while it was sent (by either side) is
    /// sent once more from the start (opened afresh); only a second change fails it.
    pub retry_changed: bool,
    /// `--delete` (with `recursive`): once the whole copy has succeeded, each directory a
    /// source directory was copied to loses what that source does not have ([`Deleted`]).
    pub delete: bool,
}

impl ClientOptions {
    /// A plain job: no flags, not recursive, no standard streams, no retries. Set the
    /// public fields for more.
    pub fn new(path: Transport, psk: Psk, proto: Config) -> Self {
        ClientOptions {
            path,
            psk,
            proto,
            flags: 0,
            recursive: false,
            stdin: None,
            stdout: false,
            retry_changed: false,
            delete: false,
        }
    }
}

/// How `-` appears in a [`Job`] for standard input or output.
pub const STDIO: &str = "-";

/// What the user asked for.
#[derive(Debug, Clone)]
pub enum Job {
    /// Local sources to a remote destination ("" = the far side's home / root).
    Upload {
        /// Local files, directories (with `-r`) or links as the user named them; [`STDIO`]
        /// for standard input ([`ClientOptions::stdin`]).
        sources: Vec<PathBuf>,
        /// Path on the far side as the user typed it (relative to its home or `--root`); a
        /// directory there, or ending in `/`, receives the sources under their own names.
        dest: String,
    },
    /// Remote sources to a local destination.
    Download {
        /// Paths on the far side as the user typed them (relative to its home or
        /// `--root`); the last component may be a glob the far side matches.
        sources: Vec<String>,
        /// Local file or directory to write to (a directory when there are several
        /// sources or a pattern); [`STDIO`] with [`ClientOptions::stdout`].
        dest: PathBuf,
    },
}

/// What a [`FileResult`] is about (`"file"`, `"dir"`, `"symlink"` in the JSON summary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A file, its content sent and verified; also a named source that is a link (followed)
    /// and an entry that is no file, directory or link (skipped or failed).
    File,
    /// A directory created at the destination (`-r`: a tree's directories, and a missing
    /// destination directory).
    Dir,
    /// A symbolic link recreated at the destination with the same target (`-r` trees).
    Symlink,
}

/// The outcome of one entry of the job (one file, directory or link), as the report and the
/// JSON summary show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileResult {
    /// Whether this is a file, a directory or a link.
    pub kind: Kind,
    /// True when it went from here to the far side, false for a download.
    pub upload: bool,
    /// The local side: an upload's source or a download's destination; [`STDIO`] for
    /// standard input or output; empty for a remote directory made for an upload.
    pub local: PathBuf,
    /// Path on the far side as sent to it (relative to its home or `--root`): an upload's
    /// destination or a download's source.
    pub remote: String,
    /// Size of the file in bytes (as listed or offered, then as opened); 0 for directories,
    /// links and files that failed before their size was known.
    pub bytes: u64,
    /// BLAKE3 of the whole file, hex, when verified.
    pub blake3: Option<String>,
    /// Files: content verified in place. Directories and links: created.
    pub verified: bool,
    /// Not copied on purpose (exists with --no-clobber, identical with --update).
    pub skipped: Option<String>,
    /// Bytes the destination already had from an interrupted copy (not sent again), as
    /// checked against the source's leaf hashes.
    pub resumed_bytes: u64,
    /// Bytes the file already at the destination had the same (delta): copied there from
    /// it, not sent.
    pub reused_bytes: u64,
    /// Bytes of this file sent as data in this run: neither what was already there (resumed
    /// or reused) nor a skipped file; for an unfinished file, what got there.
    pub moved_bytes: u64,
    /// Why it failed (where, and the text for the user); None when it succeeded or was
    /// skipped. Files left unfinished by a session failure get that failure and what is
    /// missing.
    pub error: Option<FileError>,
}

impl FileResult {
    fn new(kind: Kind, upload: bool, local: PathBuf, remote: String, bytes: u64) -> Self {
        Self {
            kind,
            upload,
            local,
            remote,
            bytes,
            blake3: None,
            verified: false,
            skipped: None,
            resumed_bytes: 0,
            reused_bytes: 0,
            moved_bytes: 0,
            error: None,
        }
    }
    /// Bytes not sent because the destination had them (resumed or reused).
    pub fn kept_bytes(&self) -> u64 {
        self.resumed_bytes + self.reused_bytes
    }
    /// Succeeded: no error, and verified (files), created (directories, links) or skipped on
    /// purpose.
    pub fn ok(&self) -> bool {
        self.error.is_none() && (self.verified || self.skipped.is_some())
    }
    /// The source as the user named it.
    pub fn source(&self) -> String {
        if self.upload {
            self.local.display().to_string()
        } else {
            self.remote.clone()
        }
    }
}

/// An entry `--delete` removed, or tried to: beneath a directory a source directory was
/// copied to, and not in that source.
#[derive(Debug, Clone)]
pub struct Deleted {
    /// A directory, a link, or a file (anything else that is not a directory, too).
    pub kind: Kind,
    /// True when it was on the far side (an upload's destination), false when local.
    pub upload: bool,
    /// Its path: on the far side as sent to it (relative to its home or `--root`), or local.
    pub path: String,
    /// Why it is still there; None when it was removed (or was gone already).
    pub error: Option<FileError>,
}

/// What [`run`] did: every entry's outcome and the session's.
#[derive(Debug)]
pub struct Report {
    /// One result per file, directory and link of the job, in the order they were planned.
    pub files: Vec<FileResult>,
    /// `--delete`: what was removed (or failed to be), children before their directory.
    pub deleted: Vec<Deleted>,
    /// `--delete`: why nothing was removed, when the copy did not fully succeed.
    pub not_deleted: Option<String>,
    /// Wall-clock seconds from the start of [`run`] to its end (ssh startup not included).
    pub seconds: f64,
    /// The session's counters at the end (after a fallback, those of the session on the
    /// ssh channel).
    pub stats: Stats,
    /// Session-level failure (no server, wrong key, interrupted, peer vanished).
    pub error: Option<SessionError>,
    /// The data went over the ssh channel because UDP got no answer.
    pub via_stream: bool,
    /// What this side's rate controller measured of the path, when worth remembering (it
    /// sent long enough to find the rate, not held down by a cap or by having nothing to
    /// send): uploads over UDP only. See [`crate::pathcache`].
    pub measured: Option<PathMeasurement>,
}

/// Why one entry of the job failed ([`FileResult::error`], [`Deleted::error`]): the variant
/// says where the failure was, `Display` is the text the user sees (the lower layer's own
/// words where it has them), [`FileError::kind`] its stable name (`"error_kind"` in the JSON
/// summary).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// This side's file system: a source that cannot be read, a destination that cannot be
    /// written or renamed into place, a directory or link that cannot be made, a local
    /// listing or removal that failed.
    #[error("{0}")]
    Local(String),
    /// The far side could not do what was asked of it (list, make a directory or link, set
    /// metadata, remove), in its words.
    #[error("{0}")]
    Remote(String),
    /// An upload the far side did not take: writing or verifying it there failed (its
    /// words), or the hash it verified is not ours.
    #[error("far side: {0}")]
    RemoteReceive(String),
    /// The far side would not send or take it (its rules, or a source that is no file or
    /// changed as it was read there): its reason.
    #[error("refused: {0}")]
    Refused(String),
    /// What landed here is not what was sent (its BLAKE3 differs), or the source changed
    /// while it was sent.
    #[error("{0}")]
    Verification(String),
    /// A directory named without `-r`.
    #[error("{}", DIR_NEEDS_R)]
    NeedsRecursive,
    /// A pattern that matched nothing on the far side.
    #[error("no match")]
    NoMatch,
    /// Not something the job can do as asked: no regular file, a destination that is no
    /// directory (or none), two sources to one name, standard input into a directory.
    #[error("{0}")]
    Invalid(String),
    /// The far side answered with something this side will not use (an invalid name or
    /// path, an empty listing).
    #[error("{0}")]
    Protocol(String),
    /// The session ended before this was done (interrupted, the far side gone or silent, no
    /// answer at all): why, and what a transfer under way is missing (a rerun resumes).
    #[error(
        "{why}{}",
        unfinished.as_ref().map_or_else(String::new, |u| format!("; {u} (a rerun resumes)"))
    )]
    Session {
        /// The session's failure, as [`Report::error`] says it.
        why: String,
        /// A transfer under way: how far it got.
        unfinished: Option<Unfinished>,
    },
}

impl FileError {
    /// The variant's stable snake_case name (`"error_kind"` in the JSON summary).
    pub fn kind(&self) -> &'static str {
        match self {
            FileError::Local(_) => "local",
            FileError::Remote(_) => "remote",
            FileError::RemoteReceive(_) => "remote_receive",
            FileError::Refused(_) => "refused",
            FileError::Verification(_) => "verification",
            FileError::NeedsRecursive => "needs_recursive",
            FileError::NoMatch => "no_match",
            FileError::Invalid(_) => "invalid",
            FileError::Protocol(_) => "protocol",
            FileError::Session { .. } => "session",
        }
    }

    /// A source that could not be read or hashed here, or that changed while it was sent.
    fn source(e: &SourceError) -> FileError {
        if e.changed() {
            FileError::Verification(e.to_string())
        } else {
            FileError::Local(e.to_string())
        }
    }

    /// A download's verdict that failed here.
    fn receive(e: &ReceiveError) -> FileError {
        match e {
            ReceiveError::Mismatch { .. } => FileError::Verification(e.to_string()),
            ReceiveError::Hash(_) | ReceiveError::Unfinished(_) | ReceiveError::Commit(_) => {
                FileError::Local(e.to_string())
            }
        }
    }

    /// The session's failure, for an entry it left with nothing under way.
    fn session(why: &str) -> FileError {
        FileError::Session {
            why: why.to_string(),
            unfinished: None,
        }
    }
}

/// Serialized as the text the user sees.
impl serde::Serialize for FileError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// How far a transfer got before its session ended ([`FileError::Session`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfinished {
    /// An upload: the bytes the far side acknowledged of the file's.
    Acked {
        /// Bytes acknowledged.
        acked: u64,
        /// The file's size.
        size: u64,
    },
    /// A download: the blocks received of the file's, and the first few ranges missing.
    Blocks {
        /// Blocks received.
        got: u64,
        /// The file's blocks.
        of: u64,
        /// The first missing ranges of blocks (at most five).
        missing: Vec<(u64, u64)>,
        /// More ranges are missing than `missing` holds.
        more: bool,
    },
}

impl std::fmt::Display for Unfinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unfinished::Acked { acked, size } => {
                write!(f, "the far side acknowledged {acked} of {size} bytes")
            }
            Unfinished::Blocks {
                got,
                of,
                missing,
                more,
            } => {
                let first: Vec<String> = missing.iter().map(|(a, b)| format!("{a}..{b}")).collect();
                write!(
                    f,
                    "received {got} of {of} blocks, missing blocks {}{}",
                    first.join(", "),
                    if *more { ", ..." } else { "" }
                )
            }
        }
    }
}

/// Why a copy failed as a whole ([`Report::error`]); the files it left unfinished carry it
/// too, with what each is missing.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The current directory cannot be used (local paths are resolved from it).
    #[error("current directory: {0}")]
    CurrentDir(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A download of several sources, or of a pattern, into something that is no
    /// directory.
    #[error(
        "{}: not a directory ({})",
        dest.display(),
        if *pattern { "a pattern may match several files" } else { "several sources need one" }
    )]
    NotADirectory {
        /// The destination as the user named it.
        dest: PathBuf,
        /// The source is one pattern (else there are several sources).
        pattern: bool,
    },
    /// No UDP socket to talk to the far side from.
    #[error("cannot open a UDP socket: {0}")]
    UdpSocket(#[source] std::io::Error),
    /// The driver's loop failed (its socket or channel).
    #[error(transparent)]
    Io(std::io::Error),
    /// The session ended (the far side's channel closed, say) before its handshake was done.
    #[error("the session ended before it started")]
    NeverStarted,
    /// Stopped by the user (a signal).
    #[error("interrupted")]
    Interrupted,
    /// The ssh channel the data went over closed before the copy was done.
    #[error("the ssh channel closed")]
    ChannelClosed,
    /// The connection ended with an error, in its own words (no answer, another key, the
    /// far side went silent, or the reason the far side closed with).
    #[error("{0}")]
    Closed(String),
}

impl SessionError {
    fn current_dir(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        SessionError::CurrentDir(e.into())
    }
}

impl Report {
    /// No session-level error and every result [`ok`](FileResult::ok): the copy fully
    /// succeeded.
    pub fn all_verified(&self) -> bool {
        self.error.is_none()
            && self.files.iter().all(|f| f.ok())
            && self.deleted.iter().all(|d| d.error.is_none())
    }
    /// Total size of the files verified at the destination (skipped ones not counted).
    pub fn bytes_verified(&self) -> u64 {
        self.files
            .iter()
            .filter(|f| f.kind == Kind::File && f.verified)
            .map(|f| f.bytes)
            .sum()
    }
    /// What interrupted copies already held at the destination (checked, not sent again).
    pub fn resumed_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.resumed_bytes).sum()
    }
    /// What the files already at the destination had the same (delta): not sent.
    pub fn reused_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.reused_bytes).sum()
    }
    /// What reached the destination in this run (resumed and skipped bytes not counted).
    pub fn moved_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.moved_bytes).sum()
    }
    /// The size of the files skipped on purpose (-n, -u).
    pub fn skipped_bytes(&self) -> u64 {
        self.files
            .iter()
            .filter(|f| f.kind == Kind::File && f.skipped.is_some())
            .map(|f| f.bytes)
            .sum()
    }
    /// Number of file results (directories and links not counted), whatever their outcome.
    pub fn file_count(&self) -> usize {
        self.files.iter().filter(|f| f.kind == Kind::File).count()
    }
}

/// A snapshot for progress bars and stats lines.
pub struct Progress<'a> {
    /// Time since [`run`] started.
    pub elapsed: Duration,
    /// Done so far, counting what was already there (resumed) and skipped files.
    pub bytes_done: u64,
    /// What reached the destination in this run: what a rate is computed from.
    pub bytes_moved: u64,
    /// Size of every file planned so far; grows as listings of trees arrive and is
    /// corrected to each file's size when it is opened or offered.
    pub bytes_total: u64,
    /// Files (not directories or links) that have ended, verified, skipped or failed.
    pub files_done: usize,
    /// Files (not directories or links) planned so far.
    pub files_total: usize,
    /// The session's counters now ([`Connection::stats`]).
    pub stats: &'a Stats,
    /// The handshake has completed; until then nothing moves (and a UI may stay quiet).
    pub connected: bool,
    /// What the copy waits for while no bytes move, if it does.
    pub waiting: Option<Waiting>,
}

/// Work that holds a copy up after its bytes have moved (or before they can), so a user
/// sees why a finished bar does not end yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// Every byte is acknowledged: the far side writes the rest out and verifies.
    FarSideVerifying,
    /// Every byte is here: the last subtrees are written and hashed.
    Verifying,
    /// A file is hashed to be compared with what is at the destination: whole (`--update`),
    /// or in leaves (a delta, a verified resume), and the leaf hashes exchanged.
    Hashing,
}

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Waiting::FarSideVerifying => "the far side is writing and verifying",
            Waiting::Verifying => "verifying",
            Waiting::Hashing => "hashing to compare with the destination",
        })
    }
}

/// What the driver tells the user while it runs.
pub trait Ui {
    /// A progress snapshot, about every 100 ms while the session runs (on the loop's thread:
    /// return quickly).
    fn progress(&mut self, p: &Progress<'_>);
    /// A one-line notice (e.g. the switch to the ssh channel).
    fn note(&mut self, msg: &str);
}

struct Active {
    idx: usize,
    upload: bool,
    size: u64,
    mode: u32,
    mtime: i64,
    file: Option<Sending>,
    part: Option<PartFile>,
    /// A download's hash, computed as its blocks land.
    landing: Option<Landing>,
    saved: Option<u64>,
    no_space: bool,
    /// Why writing this download's destination failed here, if it did.
    write_error: Option<Arc<std::io::Error>>,
    /// A download offered with `--update` over a local file of its size: skipped if that
    /// file hashes to the far side's hash (the first), else accepted.
    compare: Option<([u8; 32], WholeHash)>,
    /// A download compared leaf by leaf with a basis (delta, verified resume): its blocks
    /// answered as their leaves are compared, the file once every leaf is.
    basis: Option<Basis>,
}

/// An upload's source, opened: offered at once, or with `--update` once it is hashed.
struct Upload {
    idx: usize,
    /// What is hashed is what is then sent (the same open file), and a change while it is
    /// hashed is caught as one while it is sent.
    src: SourceFile,
    mode: u32,
    mtime: i64,
    /// The offer's flags.
    flags: u32,
}

#[derive(Default)]
struct Files {
    act: HashMap<XferId, Active>,
    /// Uploads with `--update` whose source the workers are hashing, in the order started.
    hashing: Vec<(Upload, WholeHash)>,
}

impl Files {
    /// Whether a whole-file hash for `--update` holds up one of the transfers.
    fn hashing(&self) -> bool {
        !self.hashing.is_empty()
            || self.act.values().any(|a| {
                a.compare.is_some()
                    || a.basis.is_some()
                    || a.file.as_ref().is_some_and(Sending::sums_pending)
            })
    }
}

impl BlockSource for Files {
    fn read(&mut self, xfer: XferId, offset: u64, buf: &mut [u8]) -> Result<(), StorageError> {
        Ok(self
            .act
            .get_mut(&xfer)
            .and_then(|a| a.file.as_mut())
            .ok_or(StorageError::NotOpen)?
            .read(offset, buf)?)
    }
}

impl BlockSink for Files {
    fn write(&mut self, xfer: XferId, offset: u64, data: &[u8]) -> Result<(), StorageError> {
        let a = self.act.get_mut(&xfer).ok_or(StorageError::NotOpen)?;
        let (Some(p), Some(l)) = (a.part.as_mut(), a.landing.as_mut()) else {
            return Err(StorageError::NotOpen);
        };
        p.write_at(offset, data)
            .and_then(|()| l.wrote(p, offset, data.len() as u64))
            .map_err(|e| {
                a.no_space |= e.raw_os_error() == Some(libc::ENOSPC);
                let e = Arc::new(e);
                a.write_error.get_or_insert_with(|| e.clone());
                StorageError::Other(Box::new(e))
            })
    }

    fn ready(&mut self, xfer: XferId) -> bool {
        self.act
            .get(&xfer)
            .and_then(|a| a.part.as_ref())
            .is_none_or(PartFile::has_room)
    }

    fn room(&self) -> Option<u64> {
        self.act
            .values()
            .filter_map(|a| a.part.as_ref())
            .filter_map(PartFile::room)
            .min()
    }
}

/// Hands the connection the hash of every upload the workers have finished, and starts the
/// rest of those whose blocks have all gone out. Returns whether one is still being hashed
/// after its last block went out (the loop should look again soon).
fn give_source_hashes(conn: &mut Connection, files: &mut Files) -> bool {
    pump_sums(
        conn,
        files
            .act
            .iter_mut()
            .filter_map(|(x, a)| Some((*x, a.file.as_mut()?))),
    );
    let waiting = conn.sources_awaiting_hash();
    for x in &waiting {
        if let Some(s) = files.act.get_mut(x).and_then(|a| a.file.as_mut()) {
            s.finish();
        }
    }
    for (x, a) in files.act.iter_mut() {
        if let Some(r) = a.file.as_mut().and_then(Sending::hash_ready) {
            match r {
                Ok(h) => conn.set_source_hash(*x, h),
                Err(e) => conn.fail_source(*x, &e.to_string()),
            }
        }
    }
    !conn.sources_awaiting_hash().is_empty()
}

/// Goes on with the `--update` transfers whose whole-file hash the workers have finished: an
/// upload is offered with its source's hash; a download skipped if the local file is the
/// same, else accepted.
fn settle_update_hashes(
    conn: &mut Connection,
    files: &mut Files,
    s: &mut Session<'_>,
    ui: &mut dyn Ui,
) {
    let mut i = 0;
    while i < files.hashing.len() {
        let Some(r) = files.hashing[i].1.poll() else {
            i += 1;
            continue;
        };
        let (up, _) = files.hashing.remove(i);
        match r.map_err(SourceError::from).and_then(|h| {
            up.src.check()?;
            Ok(h)
        }) {
            Ok(h) => {
                if let Some((x, a)) = s.offer_upload(conn, up, Some(*h.as_bytes())) {
                    files.act.insert(x, a);
                }
            }
            Err(e) => {
                if s.retry_changed_source(up.idx, e.changed()) {
                    let path = s.results[up.idx].local.display().to_string();
                    ui.note(&format!("{path}: {e}: sending it again from the start"));
                } else {
                    s.results[up.idx].error = Some(FileError::source(&e));
                }
            }
        }
    }
    let decided: Vec<(XferId, bool)> = files
        .act
        .iter_mut()
        .filter_map(|(x, a)| {
            let (want, hash) = a.compare.as_mut()?;
            let r = hash.poll()?;
            Some((*x, r.is_ok_and(|h| h.as_bytes() == want)))
        })
        .collect();
    for (xfer, same) in decided {
        let a = files.act.get_mut(&xfer).expect("listed");
        let (want, _) = a.compare.take().expect("compared");
        if same {
            let r = &mut s.results[a.idx];
            r.skipped = Some("identical at the destination (--update)".into());
            r.blake3 = Some(hex(&want));
            conn.skip(xfer, "identical");
            files.act.remove(&xfer);
        } else if !accept_download(conn, s, xfer, a) {
            files.act.remove(&xfer);
        }
    }
    settle_bases(conn, files, s);
}

/// Goes on with the downloads compared with a basis: the sender's leaf hashes that came are
/// compared with the basis's, and the blocks whose leaves are compared answered (the
/// download is received from the first), the file accepted once every leaf is.
fn settle_bases(conn: &mut Connection, files: &mut Files, s: &mut Session<'_>) {
    let bs = conn.block_size() as u64;
    let xfers: Vec<XferId> = files
        .act
        .iter()
        .filter(|(_, a)| a.basis.is_some())
        .map(|(x, _)| *x)
        .collect();
    for xfer in xfers {
        while let Some(a) = files.act.get_mut(&xfer) {
            let Some(b) = a.basis.as_mut() else {
                break;
            };
            for (first, leaves) in conn.take_sums(xfer) {
                b.sums(first, leaves);
            }
            let kind = b.kind;
            let Some(mut d) = b.poll(bs) else {
                break;
            };
            if a.landing.is_none() && !begin_download(conn, s, xfer, a) {
                files.act.remove(&xfer);
                break;
            }
            if d.done {
                let b = a.basis.take().expect("listed");
                if let Some(p) = a.part.as_mut() {
                    d.known.extend(b.finish(p));
                }
            }
            let (Some(landing), Some(p)) = (a.landing.as_mut(), a.part.as_mut()) else {
                break;
            };
            let ranges = d.kept.byte_ranges(bs, a.size);
            if let Err(e) = landing.hold(p, &ranges, (d.upto * bs).min(a.size), d.known) {
                let r = &mut s.results[a.idx];
                let e = format!("cannot write {}: {e}", r.local.display());
                r.error = Some(FileError::Local(e.clone()));
                conn.reject(xfer, &format!("client {e}"));
                if let Some(a) = files.act.remove(&xfer) {
                    if let Some(p) = a.part {
                        p.discard();
                    }
                }
                break;
            }
            let kept: u64 = ranges.iter().map(|&(a, b)| b - a).sum();
            let r = &mut s.results[a.idx];
            if kind == basis::DEST {
                r.reused_bytes += kept;
            } else {
                r.resumed_bytes += kept;
            }
            if d.done {
                conn.accept_with(xfer, &d.kept.have, &d.kept.spans, None);
                break;
            }
            conn.accept_compared(xfer, d.upto, &d.kept.have, &d.kept.spans);
        }
    }
}

/// Accepts download `xfer` into a temp file or standard output: at once, or, when there is
/// a basis (what an earlier run left there, or the file at the destination), as the far
/// side's leaf hashes are compared with it (`settle_bases`). False if that failed (said in
/// its result: the transfer is over).
fn accept_download(
    conn: &mut Connection,
    s: &mut Session<'_>,
    xfer: XferId,
    a: &mut Active,
) -> bool {
    let r = &mut s.results[a.idx];
    let size = a.size;
    let part = if s.stdout {
        PartFile::stdout(size)
    } else if s.opts_flags & flags::INPLACE != 0 {
        create_local_part_inplace(&r.local, size)
    } else {
        create_local_part(&r.local, size)
    };
    let mut p = match part {
        Ok(p) => p,
        Err(e) => {
            r.error = Some(FileError::Local(e.to_string()));
            conn.reject(xfer, &format!("client cannot write: {e}"));
            return false;
        }
    };
    let fl = s.opts_flags & flags::WHOLE_FILE;
    let basis = basis_for(&mut p, size, fl, a.mtime);
    a.part = Some(p);
    match basis {
        Some(b) => {
            conn.want_sums(xfer, b.kind);
            a.basis = Some(b);
            true
        }
        None => {
            if !begin_download(conn, s, xfer, a) {
                return false;
            }
            if let (Some(l), Some(p)) = (a.landing.as_mut(), a.part.as_mut()) {
                // Holding nothing: nothing to wait for, nothing to fail.
                let _ = l.hold(p, &[], size, Known::default());
            }
            conn.accept_with(xfer, &[], &[], None);
            true
        }
    }
}

/// Starts receiving download `xfer` into its temp file (in `a`): its verification starts;
/// what the file already holds is told to it and the sender next. False if that failed
/// (said in its result and to the sender: the transfer is over).
fn begin_download(
    conn: &mut Connection,
    s: &mut Session<'_>,
    xfer: XferId,
    a: &mut Active,
) -> bool {
    let r = &mut s.results[a.idx];
    let p = a.part.as_mut().expect("opened");
    match Landing::begin(p, a.size) {
        Ok(landing) => {
            a.landing = Some(landing);
            (r.reused_bytes, r.resumed_bytes) = (0, 0);
            true
        }
        Err(e) => {
            // Worded as a failed write is (`IncomingFailed`): a disk found full here (the
            // background reserve already short) or at the first writes reads the same.
            let e = format!("cannot write {}: {e}", r.local.display());
            r.error = Some(FileError::Local(e.clone()));
            conn.reject(xfer, &format!("client {e}"));
            // Short of space, say (the reserve failed): what this run made goes.
            if let Some(p) = a.part.take() {
                p.drop_unstarted();
            }
            false
        }
    }
}

/// Gives the verdict on every download whose blocks have all landed and whose hash the
/// workers have finished: committed under its final name if it matches, else removed.
fn settle_downloads(conn: &mut Connection, files: &mut Files, s: &mut Session<'_>) {
    let ready: Vec<(XferId, Result<[u8; 32], ReceiveError>)> = files
        .act
        .iter_mut()
        .filter_map(|(x, a)| Some((*x, a.landing.as_ref()?.verdict(a.part.as_mut()?)?)))
        .collect();
    for (xfer, verdict) in ready {
        let a = files.act.remove(&xfer).expect("listed");
        let mut part = a.part.expect("accepted downloads have a part file");
        let preserve = s.opts_flags & flags::PRESERVE != 0;
        let verdict = match verdict {
            Ok(h) => {
                keep_small_if_same(&mut part, &h);
                let mode = dest_mode(a.mode, s.opts_flags);
                part.commit(Some(mode), preserve.then(|| systime(a.mtime)))
                    .map(|_| h)
                    .map_err(ReceiveError::Commit)
            }
            Err(e) => {
                part.discard();
                Err(e)
            }
        };
        let r = &mut s.results[a.idx];
        match &verdict {
            Ok(h) => {
                r.verified = true;
                r.blake3 = Some(hex(h));
                r.moved_bytes = a.size.saturating_sub(r.kept_bytes());
                s.finished_bytes += a.size;
            }
            Err(e) => r.error = Some(FileError::receive(e)),
        }
        conn.finish_incoming(xfer, verdict.map_err(|e| e.to_string()));
    }
}

fn hex(h: &[u8; 32]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why a meta request was sent: what to do with its answer.
enum Pending {
    /// What the upload destination is (directory or not).
    DestStat,
    /// What the upload destination, a symbolic link, points to (a directory or not).
    DestLinkTarget,
    /// The listing of download source `i`.
    SourceList(usize, Vec<MetaEntry>),
    /// The expansion of the download pattern `sources[i]` by the far side.
    Glob(usize, Vec<MetaEntry>),
    /// The listing of `src`, a directory one of the patterns matched, going to `base`.
    Matched {
        src: String,
        base: PathBuf,
        acc: Vec<MetaEntry>,
    },
    /// A directory, link or metadata change recorded in `results[i]`.
    Op(usize),
    /// The listing of the unlisted download source `results[i]` after the server refused
    /// it: a directory is then reported as one.
    Refused(usize),
    /// `--delete`: the far side's listing of where `trees[i]` went.
    PruneList(usize, Vec<MetaEntry>),
    /// `--delete`: the removal of `deleted[i]` on the far side.
    Remove(usize),
}

/// `--delete`: a source directory copied with `-r`, and where it went.
struct Tree {
    /// Where it went: a path on the far side (an upload) or a local one (a download).
    dest: String,
    /// Every path beneath the source directory, relative to it (`""` for itself): what the
    /// destination keeps.
    keep: HashSet<String>,
}

/// Whether a path a listing from the far side gave (relative to what was listed) is plain
/// names only: a far side that sends `..` or `/` must not steer a download out of its
/// destination.
fn plain_relative(p: &str) -> bool {
    p.is_empty() || p.split('/').all(|c| !matches!(c, "" | "." | ".."))
}

/// Whether the last component of `path` names a temp or state file of an interrupted copy:
/// `--delete` leaves those to `hayate clean`.
fn temp_file_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(fs::PART_SUFFIX) || name.ends_with(fs::STATE_SUFFIX)
}

/// `dir` as a directory to list: with a trailing `/`, so a final link to a directory is
/// followed, as the copy into it followed it.
fn as_dir(dir: &str) -> String {
    if dir.ends_with('/') {
        dir.to_string()
    } else {
        format!("{dir}/")
    }
}

/// Directory metadata applied last (writing files into a directory changes its mtime).
struct DirMeta {
    /// Local path (downloads) or remote path (uploads).
    path: String,
    mode: u32,
    mtime: i64,
    idx: usize,
}

fn join_remote(base: &str, rel: &str) -> String {
    match (base.trim_end_matches('/'), rel) {
        (b, "") => b.to_string(),
        ("", r) if !base.starts_with('/') => r.to_string(),
        (b, r) => format!("{b}/{r}"),
    }
}

fn remote_basename(p: &str) -> String {
    p.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Where download source `i` goes: into `dest` if that is a directory (or there are several
/// sources), else `dest` itself.
fn download_base(sources: &[String], dest: &Path, i: usize) -> PathBuf {
    let into_dir = sources.len() > 1 || dest.is_dir();
    let name = remote_basename(&sources[i]);
    if into_dir && !name.is_empty() {
        dest.join(&name)
    } else {
        dest.to_path_buf()
    }
}

fn local_basename(p: &Path) -> Option<String> {
    let name = match p.file_name() {
        Some(n) => n.to_owned(),
        None => std::fs::canonicalize(p).ok()?.file_name()?.to_owned(),
    };
    name.to_str().map(str::to_string)
}

fn path_str(p: &Path) -> Result<&str, String> {
    p.to_str()
        .ok_or_else(|| format!("{}: not valid UTF-8", p.display()))
}

/// The session: plans the job as answers arrive, runs the transfers, records every result.
struct Session<'a> {
    opts_flags: u32,
    recursive: bool,
    job: &'a Job,
    local: Option<Root>,
    results: Vec<FileResult>,
    queue: VecDeque<usize>,
    pending: HashMap<u32, Pending>,
    dirs: Vec<DirMeta>,
    dirs_sent: bool,
    bytes_total: u64,
    finished_bytes: u64,
    /// The one file of this upload is offered as `DEST/NAME` with `INTO_DIR`: the server
    /// picks between that and `DEST`, sparing the round trip of looking at `DEST` first.
    into_dir: bool,
    /// Where each download source goes, and its name: two may not reach one place.
    bases: HashMap<PathBuf, String>,
    /// See [`ClientOptions::stdin`].
    stdin: Option<File>,
    /// See [`ClientOptions::stdout`].
    stdout: bool,
    /// `--retry-changed`, and the uploads (result indexes) already sent again once.
    retry_changed: bool,
    retried: std::collections::HashSet<usize>,
    /// See [`ClientOptions::delete`]; the trees to prune, whether pruning has begun (or was
    /// given up), what it removed, and why it removed nothing.
    delete: bool,
    trees: Vec<Tree>,
    pruned: bool,
    deleted: Vec<Deleted>,
    not_deleted: Option<String>,
}

impl<'a> Session<'a> {
    fn new(job: &'a Job, opts_flags: u32, recursive: bool) -> Self {
        Session {
            opts_flags,
            recursive,
            job,
            local: None,
            results: Vec::new(),
            queue: VecDeque::new(),
            pending: HashMap::new(),
            dirs: Vec::new(),
            dirs_sent: false,
            bytes_total: 0,
            finished_bytes: 0,
            into_dir: false,
            bases: HashMap::new(),
            stdin: None,
            stdout: false,
            retry_changed: false,
            retried: Default::default(),
            delete: false,
            trees: Vec::new(),
            pruned: false,
            deleted: Vec::new(),
            not_deleted: None,
        }
    }

    /// Whether file `i`, failed (`changed`: because its source changed while it was sent),
    /// is sent again (`--retry-changed`, once): if so its result is reset and it goes to the
    /// front of the queue, to be opened (an upload) or asked for (a download) afresh.
    fn retry_changed_source(&mut self, i: usize, changed: bool) -> bool {
        if !self.retry_changed || !changed || !self.retried.insert(i) {
            return false;
        }
        let r = &mut self.results[i];
        r.error = None;
        r.verified = false;
        r.blake3 = None;
        r.resumed_bytes = 0;
        r.reused_bytes = 0;
        r.moved_bytes = 0;
        self.queue.push_front(i);
        true
    }

    fn preserve(&self) -> bool {
        self.opts_flags & flags::PRESERVE != 0
    }

    fn push(&mut self, r: FileResult) -> usize {
        self.results.push(r);
        self.results.len() - 1
    }

    fn fail(&mut self, kind: Kind, upload: bool, local: PathBuf, remote: String, e: FileError) {
        let i = self.push(FileResult::new(kind, upload, local, remote, 0));
        self.results[i].error = Some(e);
    }

    /// First requests, once the session is up.
    fn start(&mut self, conn: &mut Connection) {
        match self.job {
            Job::Upload { sources, dest } if self.can_place_into_dir(sources, dest) => {
                self.into_dir = true;
                self.plan_upload(conn, None);
            }
            Job::Upload { dest, .. } => {
                let id = conn.meta(MetaOp::List {
                    path: dest.clone(),
                    recursive: false,
                });
                self.pending.insert(id, Pending::DestStat);
            }
            Job::Download { sources, dest } if self.unlisted_download() => {
                // One file: ask for it at once, sparing the round trip of listing it first.
                // The server's offer says how big it is; a refusal is looked into then
                // (see `on_refused`).
                let base = if self.stdout {
                    PathBuf::from(STDIO)
                } else {
                    download_base(sources, dest, 0)
                };
                let i = self.push(FileResult::new(
                    Kind::File,
                    false,
                    base,
                    sources[0].clone(),
                    0,
                ));
                self.queue.push_back(i);
            }
            Job::Download { sources, .. } => {
                for (i, s) in sources.iter().enumerate() {
                    if crate::glob::is_pattern(s) {
                        let id = conn.meta(MetaOp::Glob { pattern: s.clone() });
                        self.pending.insert(id, Pending::Glob(i, Vec::new()));
                        continue;
                    }
                    let id = conn.meta(MetaOp::List {
                        path: s.clone(),
                        recursive: self.recursive,
                    });
                    self.pending.insert(id, Pending::SourceList(i, Vec::new()));
                }
            }
        }
    }

    fn on_meta(
        &mut self,
        conn: &mut Connection,
        id: u32,
        result: Result<Vec<MetaEntry>, String>,
        more: bool,
    ) {
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        match p {
            Pending::DestStat => {
                let dest_kind = result.ok().and_then(|v| v.first().map(|e| e.kind));
                if let (Some(WireKind::Symlink), Job::Upload { dest, .. }) = (dest_kind, self.job) {
                    // Followed, as scp does: a link to a directory is that directory.
                    let id = conn.meta(MetaOp::List {
                        path: format!("{dest}/"),
                        recursive: false,
                    });
                    self.pending.insert(id, Pending::DestLinkTarget);
                    return;
                }
                self.plan_upload(conn, dest_kind);
            }
            Pending::DestLinkTarget => {
                // Anything but a directory (a file, a dangling link) stays a link to write
                // through.
                let to_dir =
                    result.is_ok_and(|v| v.first().is_some_and(|e| e.kind == WireKind::Dir));
                let kind = if to_dir {
                    WireKind::Dir
                } else {
                    WireKind::Symlink
                };
                self.plan_upload(conn, Some(kind));
            }
            Pending::SourceList(i, mut acc) => match result {
                Ok(v) if more => {
                    acc.extend(v);
                    self.pending.insert(id, Pending::SourceList(i, acc));
                }
                Ok(v) => {
                    acc.extend(v);
                    self.plan_download(i, acc);
                }
                Err(e) => {
                    let Job::Download { sources, dest } = self.job else {
                        return;
                    };
                    let e = FileError::Remote(e);
                    self.fail(Kind::File, false, dest.clone(), sources[i].clone(), e);
                }
            },
            Pending::Glob(i, mut acc) => match result {
                Ok(v) if more => {
                    acc.extend(v);
                    self.pending.insert(id, Pending::Glob(i, acc));
                }
                Ok(v) => {
                    acc.extend(v);
                    self.plan_matches(conn, i, acc);
                }
                Err(e) => {
                    let Job::Download { sources, dest } = self.job else {
                        return;
                    };
                    let e = FileError::Remote(e);
                    self.fail(Kind::File, false, dest.clone(), sources[i].clone(), e);
                }
            },
            Pending::Matched { src, base, mut acc } => match result {
                Ok(v) if more => {
                    acc.extend(v);
                    self.pending.insert(id, Pending::Matched { src, base, acc });
                }
                Ok(v) => {
                    acc.extend(v);
                    self.plan_download_at(src, base, acc);
                }
                Err(e) => self.fail(Kind::Dir, false, base, src, FileError::Remote(e)),
            },
            Pending::Op(i) => match result {
                Ok(_) => self.results[i].verified = true,
                Err(e) => self.results[i].error = Some(FileError::Remote(e)),
            },
            Pending::Refused(i) => {
                if result.is_ok_and(|v| v.first().is_some_and(|e| e.kind == WireKind::Dir)) {
                    self.results[i].kind = Kind::Dir;
                    self.results[i].error = Some(FileError::NeedsRecursive);
                }
            }
            Pending::PruneList(t, mut acc) => match result {
                Ok(v) if more => {
                    acc.extend(v);
                    self.pending.insert(id, Pending::PruneList(t, acc));
                }
                Ok(v) => {
                    acc.extend(v);
                    let listed = acc.into_iter().map(|e| (e.path, e.kind)).collect();
                    self.prune_tree(conn, t, Ok(listed));
                }
                Err(e) => self.prune_tree(conn, t, Err(e)),
            },
            Pending::Remove(i) => {
                if let Err(e) = result {
                    self.deleted[i].error = Some(FileError::Remote(e));
                }
            }
        }
    }

    /// The one download source is asked for without being listed first, so its kind is a
    /// guess (a file) until the server answers.
    fn unlisted_download(&self) -> bool {
        matches!(self.job, Job::Download { sources, .. }
            if sources.len() == 1 && !crate::glob::is_pattern(&sources[0]))
            && !self.recursive
    }

    /// The server would not send or take `results[i]`.
    fn on_refused(&mut self, conn: &mut Connection, i: usize, reason: String) {
        // Set now so the result still fails if the session ends before the listing below.
        self.results[i].error = Some(FileError::Refused(reason));
        if self.unlisted_download() && !self.results[i].upload {
            // The refusal is only text: the listing says whether the guess was wrong (a
            // directory), at the cost of a round trip on this failure path only.
            let id = conn.meta(MetaOp::List {
                path: self.results[i].remote.clone(),
                recursive: false,
            });
            self.pending.insert(id, Pending::Refused(i));
        }
    }

    fn meta_op(&mut self, conn: &mut Connection, op: MetaOp, r: FileResult) {
        let i = self.push(r);
        let id = conn.meta(op);
        self.pending.insert(id, Pending::Op(i));
    }

    /// One regular file to a destination that may or may not be a directory (`cp F DEST`),
    /// a plain copy (`--no-clobber` and `--update` answer with a skip, which names no path).
    fn can_place_into_dir(&self, sources: &[PathBuf], dest: &str) -> bool {
        self.opts_flags & (flags::NO_CLOBBER | flags::UPDATE) == 0
            && self.stdin.is_none()
            && sources.len() == 1
            && !dest.is_empty()
            && !dest.ends_with('/')
            && std::fs::metadata(&sources[0]).is_ok_and(|m| m.is_file())
    }

    fn plan_upload(&mut self, conn: &mut Connection, dest_kind: Option<WireKind>) {
        let Job::Upload { sources, dest } = self.job else {
            return;
        };
        if let Some(f) = &self.stdin {
            // Standard input has no name to give a file in a directory.
            let local = PathBuf::from(STDIO);
            if dest.is_empty() || dest.ends_with('/') || dest_kind == Some(WireKind::Dir) {
                let e = FileError::Invalid(
                    "is a directory: - (standard input) needs a file name as DEST".into(),
                );
                self.fail(Kind::File, true, local, dest.clone(), e);
                return;
            }
            let size = f.metadata().map(|m| m.len()).unwrap_or(0);
            let i = self.push(FileResult::new(Kind::File, true, local, dest.clone(), size));
            self.bytes_total += size;
            self.queue.push_back(i);
            return;
        }
        let several = sources.len() > 1;
        let dest_is_dir = dest_kind == Some(WireKind::Dir) || self.into_dir;
        let into_dir = several || dest.is_empty() || dest.ends_with('/') || dest_is_dir;
        if into_dir && !dest_is_dir && !dest.is_empty() {
            // As scp: only `-r` makes the destination directory, and only it (its parent
            // must exist); without `-r` a missing one is a typo to report, not to build.
            if dest_kind.is_some() || !self.recursive {
                let why = if dest_kind.is_some() {
                    "not a directory"
                } else {
                    "no such directory"
                };
                let e = FileError::Invalid(why.into());
                self.fail(Kind::Dir, true, PathBuf::new(), dest.clone(), e);
                return;
            }
            self.meta_op(
                conn,
                MetaOp::Mkdir {
                    path: dest.clone(),
                    mode: None,
                },
                FileResult::new(Kind::Dir, true, PathBuf::new(), dest.clone(), 0),
            );
        }
        for src in sources {
            let target = |name: &str| {
                if into_dir {
                    join_remote(dest, name)
                } else {
                    dest.clone()
                }
            };
            let meta = match std::fs::metadata(src) {
                Ok(m) => m,
                Err(e) => {
                    let e = FileError::Local(e.to_string());
                    self.fail(Kind::File, true, src.clone(), dest.clone(), e);
                    continue;
                }
            };
            let Some(name) = local_basename(src) else {
                self.fail(
                    Kind::File,
                    true,
                    src.clone(),
                    dest.clone(),
                    FileError::Invalid("no usable name".into()),
                );
                continue;
            };
            if meta.is_file() {
                let i = self.push(FileResult::new(
                    Kind::File,
                    true,
                    src.clone(),
                    target(&name),
                    meta.len(),
                ));
                self.bytes_total += meta.len();
                self.queue.push_back(i);
            } else if meta.is_dir() && !self.recursive {
                self.fail(
                    Kind::Dir,
                    true,
                    src.clone(),
                    target(&name),
                    FileError::NeedsRecursive,
                );
            } else if meta.is_dir() {
                self.plan_upload_tree(conn, src, &target(&name));
            } else {
                self.fail(
                    Kind::File,
                    true,
                    src.clone(),
                    target(&name),
                    FileError::Invalid("not a regular file".into()),
                );
            }
        }
    }

    fn plan_upload_tree(&mut self, conn: &mut Connection, src: &Path, base: &str) {
        let listed = path_str(src).and_then(|s| {
            self.local
                .as_ref()
                .ok_or_else(|| "no local root".to_string())?
                .list(s, true, MAX_LIST)
                .map_err(|e| e.to_string())
        });
        let entries = match listed {
            Ok(v) => v,
            Err(e) => {
                let e = FileError::Local(e);
                self.fail(Kind::Dir, true, src.to_path_buf(), base.to_string(), e);
                return;
            }
        };
        if self.delete {
            self.trees.push(Tree {
                dest: base.to_string(),
                keep: entries.iter().map(|e| e.path.clone()).collect(),
            });
        }
        let preserve = self.preserve();
        for e in entries {
            let local = if e.path.is_empty() {
                src.to_path_buf()
            } else {
                src.join(&e.path)
            };
            let remote = join_remote(base, &e.path);
            match e.kind {
                EntryKind::Dir => {
                    let mode = Some(dest_mode(e.mode, self.opts_flags));
                    let r = FileResult::new(Kind::Dir, true, local, remote.clone(), 0);
                    self.meta_op(
                        conn,
                        MetaOp::Mkdir {
                            path: remote.clone(),
                            mode,
                        },
                        r,
                    );
                    if preserve {
                        let idx = self.results.len() - 1;
                        self.dirs.push(DirMeta {
                            path: remote,
                            mode: e.mode,
                            mtime: e.mtime,
                            idx,
                        });
                    }
                }
                EntryKind::Symlink => {
                    let r = FileResult::new(Kind::Symlink, true, local, remote.clone(), 0);
                    self.meta_op(
                        conn,
                        MetaOp::Symlink {
                            path: remote,
                            target: e.target,
                        },
                        r,
                    );
                }
                EntryKind::File => {
                    let i = self.push(FileResult::new(Kind::File, true, local, remote, e.size));
                    self.bytes_total += e.size;
                    self.queue.push_back(i);
                }
                EntryKind::Other => {
                    let i = self.push(FileResult::new(Kind::File, true, local, remote, 0));
                    self.results[i].skipped = Some("not a regular file, directory or link".into());
                }
            }
        }
    }

    /// What the pattern `sources[i]` matched, each copied as if it had been named: files
    /// at once, directories (with `-r`) listed first. No match is an error naming the pattern.
    fn plan_matches(&mut self, conn: &mut Connection, i: usize, matched: Vec<MetaEntry>) {
        let Job::Download { sources, dest } = self.job else {
            return;
        };
        if matched.is_empty() {
            self.fail(
                Kind::File,
                false,
                dest.clone(),
                sources[i].clone(),
                FileError::NoMatch,
            );
            return;
        }
        for mut e in matched {
            let src = std::mem::take(&mut e.path);
            let name = remote_basename(&src);
            if name.is_empty() || !plain_relative(&name) {
                let why =
                    FileError::Protocol(format!("the far side matched an invalid name {name:?}"));
                self.fail(Kind::File, false, dest.clone(), sources[i].clone(), why);
                continue;
            }
            let base = dest.join(name);
            if e.kind == WireKind::Dir && self.recursive {
                let id = conn.meta(MetaOp::List {
                    path: src.clone(),
                    recursive: true,
                });
                let acc = Vec::new();
                self.pending.insert(id, Pending::Matched { src, base, acc });
            } else {
                self.plan_download_at(src, base, vec![e]);
            }
        }
    }

    fn plan_download(&mut self, i: usize, entries: Vec<MetaEntry>) {
        let Job::Download { sources, dest } = self.job else {
            return;
        };
        self.plan_download_at(sources[i].clone(), download_base(sources, dest, i), entries);
    }

    /// Plans the download of `src` (listed as `entries`) to `base`.
    fn plan_download_at(&mut self, src: String, base: PathBuf, entries: Vec<MetaEntry>) {
        let src = &src;
        // Two patterns (or a pattern and a name) may reach one name: the copies would race on
        // one temp file.
        if let Some(prev) = self.bases.insert(base.clone(), src.clone()) {
            let e = FileError::Invalid(format!(
                "{prev} and {src} would both be copied to {}",
                base.display()
            ));
            self.fail(Kind::File, false, base, src.clone(), e);
            return;
        }
        let Some(root) = entries.first() else {
            let e = FileError::Protocol("empty listing".into());
            self.fail(Kind::File, false, base, src.clone(), e);
            return;
        };
        match root.kind {
            WireKind::File | WireKind::Symlink => {
                let i = self.push(FileResult::new(
                    Kind::File,
                    false,
                    base,
                    src.clone(),
                    root.size,
                ));
                self.bytes_total += root.size;
                self.queue.push_back(i);
                return;
            }
            WireKind::Dir if !self.recursive => {
                self.fail(
                    Kind::Dir,
                    false,
                    base,
                    src.clone(),
                    FileError::NeedsRecursive,
                );
                return;
            }
            WireKind::Other => {
                self.fail(
                    Kind::File,
                    false,
                    base,
                    src.clone(),
                    FileError::Invalid("not a regular file".into()),
                );
                return;
            }
            WireKind::Dir => {}
        }
        if let Some(bad) = entries.iter().find(|e| !plain_relative(&e.path)) {
            let why = FileError::Protocol(format!(
                "the far side listed an invalid path {:?}",
                bad.path
            ));
            self.fail(Kind::Dir, false, base, src.clone(), why);
            return;
        }
        if let (true, Some(dest)) = (self.delete, base.to_str()) {
            self.trees.push(Tree {
                dest: dest.to_string(),
                keep: entries.iter().map(|e| e.path.clone()).collect(),
            });
        }
        let preserve = self.preserve();
        let Some(local) = self.local.take() else {
            return;
        };
        for e in entries {
            let lpath = if e.path.is_empty() {
                base.clone()
            } else {
                base.join(&e.path)
            };
            let remote = join_remote(src, &e.path);
            match e.kind {
                WireKind::Dir => {
                    let mut r = FileResult::new(Kind::Dir, false, lpath.clone(), remote, 0);
                    let mode = dest_mode(e.mode, self.opts_flags);
                    match path_str(&lpath)
                        .and_then(|p| local.mkdirs(p, Some(mode)).map_err(|e| e.to_string()))
                    {
                        Ok(()) => r.verified = true,
                        Err(e) => r.error = Some(FileError::Local(e)),
                    }
                    let idx = self.push(r);
                    if preserve {
                        self.dirs.push(DirMeta {
                            path: lpath.display().to_string(),
                            mode: e.mode,
                            mtime: e.mtime,
                            idx,
                        });
                    }
                }
                WireKind::Symlink => {
                    let mut r = FileResult::new(Kind::Symlink, false, lpath.clone(), remote, 0);
                    match path_str(&lpath)
                        .and_then(|p| local.symlink(p, &e.target).map_err(|e| e.to_string()))
                    {
                        Ok(()) => r.verified = true,
                        Err(e) => r.error = Some(FileError::Local(e)),
                    }
                    if r.verified && preserve {
                        let _ =
                            path_str(&lpath).map(|p| local.set_meta(p, None, Some((e.mtime, 0))));
                    }
                    self.push(r);
                }
                WireKind::File => {
                    let i = self.push(FileResult::new(Kind::File, false, lpath, remote, e.size));
                    self.bytes_total += e.size;
                    self.queue.push_back(i);
                }
                WireKind::Other => {
                    let i = self.push(FileResult::new(Kind::File, false, lpath, remote, 0));
                    self.results[i].skipped = Some("not a regular file, directory or link".into());
                }
            }
        }
        self.local = Some(local);
    }

    /// Starts the transfer of `results[i]` (into `files`), unless it finished at once (an
    /// error, a skip).
    fn start_file(&mut self, conn: &mut Connection, files: &mut Files, i: usize) {
        let r = &mut self.results[i];
        let fl = self.opts_flags;
        if r.upload {
            let stdin = self.stdin.as_ref().filter(|_| r.local == Path::new(STDIO));
            let opened = match stdin {
                Some(f) => f
                    .try_clone()
                    .and_then(|f| f.metadata().map(|m| (f, m)))
                    .map_err(|e| format!("standard input: {e}")),
                None => open_source(&r.local),
            };
            let (f, m) = match opened {
                Ok(x) => x,
                Err(e) => {
                    r.error = Some(FileError::Local(e));
                    return;
                }
            };
            self.bytes_total = self.bytes_total - r.bytes + m.len();
            r.bytes = m.len();
            let into_dir = if self.into_dir { flags::INTO_DIR } else { 0 };
            let no_resume = if stdin.is_some() { flags::NO_RESUME } else { 0 };
            let source = SourceFile::new(f, m.len());
            // The spool file has no name to watch; nothing else writes to it.
            let watched = if stdin.is_some() {
                source
            } else {
                source.watch({
                    let path = r.local.clone();
                    Box::new(move || std::fs::metadata(&path).map(|m| (m.dev(), m.ino())))
                })
            };
            let up = Upload {
                idx: i,
                src: watched,
                // Standard input's spool file is 0600 and new: the far side makes the file
                // as a new file is made there (0666 less its umask).
                mode: if stdin.is_some() { 0o666 } else { m.mode() },
                mtime: m.mtime(),
                flags: fl | into_dir | no_resume,
            };
            if fl & flags::UPDATE == 0 {
                if let Some((x, a)) = self.offer_upload(conn, up, None) {
                    files.act.insert(x, a);
                }
                return;
            }
            // The offer carries the hash: the workers compute it, the loop goes on meanwhile
            // (`settle_update_hashes`).
            match up.src.try_clone_file() {
                Ok(f) => {
                    let hash = WholeHash::start(f, up.src.size());
                    files.hashing.push((up, hash));
                }
                Err(e) => r.error = Some(FileError::Local(e.to_string())),
            }
        } else {
            if fl & flags::NO_CLOBBER != 0
                && !self.stdout
                && std::fs::symlink_metadata(&r.local).is_ok()
            {
                r.skipped = Some("destination exists (--no-clobber)".into());
                return;
            }
            let x = conn.request_ext(&r.remote, fl & (flags::UPDATE | flags::PRESERVE));
            files.act.insert(
                x,
                Active {
                    idx: i,
                    upload: false,
                    size: r.bytes,
                    mode: 0o644,
                    mtime: 0,
                    file: None,
                    part: None,
                    landing: None,
                    saved: None,
                    no_space: false,
                    write_error: None,
                    compare: None,
                    basis: None,
                },
            );
        }
    }

    /// Offers upload `up` (with its hash for `--update`); the transfer if it started.
    fn offer_upload(
        &mut self,
        conn: &mut Connection,
        up: Upload,
        hash: Option<[u8; 32]>,
    ) -> Option<(XferId, Active)> {
        let r = &mut self.results[up.idx];
        let size = up.src.size();
        let x = conn.send_file_ext(&FileOffer {
            path: &r.remote,
            size,
            mode: up.mode,
            mtime: up.mtime,
            flags: up.flags,
            hash,
        });
        let sending = match Sending::new(up.src) {
            Ok(s) => s,
            Err(e) => {
                r.error = Some(FileError::Local(format!(
                    "cannot read {}: {e}",
                    r.local.display()
                )));
                conn.fail_source(x, &e.to_string());
                return None;
            }
        };
        Some((
            x,
            Active {
                idx: up.idx,
                upload: true,
                size,
                mode: up.mode,
                mtime: up.mtime,
                file: Some(sending),
                part: None,
                landing: None,
                saved: None,
                no_space: false,
                write_error: None,
                compare: None,
                basis: None,
            },
        ))
    }

    /// `--delete`, once every transfer and request of the copy is over: if all of it
    /// succeeded, each tree's destination is listed (the far side's by a request, a local
    /// one here) and what its source lacks removed (`prune_tree`); else nothing is.
    fn prune(&mut self, conn: &mut Connection) {
        self.pruned = true;
        let failed = self.results.iter().filter(|r| !r.ok()).count();
        if failed > 0 {
            self.not_deleted = Some(format!(
                "nothing deleted: {failed} entr{} of the copy failed",
                if failed == 1 { "y" } else { "ies" }
            ));
            return;
        }
        for t in 0..self.trees.len() {
            let top = as_dir(&self.trees[t].dest);
            if matches!(self.job, Job::Upload { .. }) {
                let id = conn.meta(MetaOp::List {
                    path: top,
                    recursive: true,
                });
                self.pending.insert(id, Pending::PruneList(t, Vec::new()));
                continue;
            }
            let listed = match &self.local {
                Some(local) => local
                    .list(&top, true, MAX_LIST)
                    .map(|v| {
                        v.into_iter()
                            .map(|e| {
                                let w = super::server::to_wire(e);
                                (w.path, w.kind)
                            })
                            .collect()
                    })
                    .map_err(|e| e.to_string()),
                None => Err("no local root".into()),
            };
            self.prune_tree(conn, t, listed);
        }
    }

    /// Removes from where `trees[t]` went what `listed` (its listing, the top first, parents
    /// before children) holds and the source does not: children before their directory, a
    /// link as a link (the listing never follows one). Temp and state files of interrupted
    /// copies stay, and so do the directories holding them.
    fn prune_tree(
        &mut self,
        conn: &mut Connection,
        t: usize,
        listed: Result<Vec<(String, WireKind)>, String>,
    ) {
        let upload = matches!(self.job, Job::Upload { .. });
        let tree = &self.trees[t];
        // The listing is the far side's for an upload, this side's for a download.
        let cannot = |e: String, invalid: bool| Deleted {
            kind: Kind::Dir,
            upload,
            path: tree.dest.clone(),
            error: Some({
                let e = format!("cannot list it: {e}");
                match (invalid, upload) {
                    (true, _) => FileError::Invalid(e),
                    (false, true) => FileError::Remote(e),
                    (false, false) => FileError::Local(e),
                }
            }),
        };
        let listed = match listed {
            Ok(v)
                if v.first()
                    .is_some_and(|(p, k)| p.is_empty() && *k == WireKind::Dir) =>
            {
                v
            }
            Ok(_) => {
                self.deleted.push(cannot("not a directory".into(), true));
                return;
            }
            Err(e) => {
                self.deleted.push(cannot(e, false));
                return;
            }
        };
        // The directories above a kept temp file cannot be emptied.
        let mut held = HashSet::new();
        for (p, _) in &listed {
            if temp_file_name(p) && !tree.keep.contains(p) {
                let mut at = p.as_str();
                while let Some((parent, _)) = at.rsplit_once('/') {
                    held.insert(parent.to_string());
                    at = parent;
                }
            }
        }
        let extra: Vec<(String, WireKind)> = listed
            .into_iter()
            .skip(1)
            .rev()
            .filter(|(p, k)| {
                let kept = tree.keep.contains(p) || temp_file_name(p);
                let holds_temp = *k == WireKind::Dir && held.contains(p);
                !kept && !holds_temp
            })
            .collect();
        let dest = tree.dest.clone();
        for (rel, kind) in extra {
            let dir = kind == WireKind::Dir;
            let kind = match kind {
                WireKind::Dir => Kind::Dir,
                WireKind::Symlink => Kind::Symlink,
                WireKind::File | WireKind::Other => Kind::File,
            };
            let path = if upload {
                join_remote(&dest, &rel)
            } else {
                Path::new(&dest).join(&rel).display().to_string()
            };
            let i = self.deleted.len();
            self.deleted.push(Deleted {
                kind,
                upload,
                path,
                error: None,
            });
            if upload {
                let id = conn.meta(MetaOp::Remove {
                    top: dest.clone(),
                    path: rel,
                    dir,
                });
                self.pending.insert(id, Pending::Remove(i));
            } else if let Some(local) = &self.local {
                if let Err(e) = local.remove(&dest, &rel, dir) {
                    self.deleted[i].error = Some(FileError::Local(e.to_string()));
                }
            }
        }
    }

    /// Directory modes and mtimes, deepest first, once every file is in place.
    fn finish_dirs(&mut self, conn: &mut Connection) {
        self.dirs_sent = true;
        let dirs = std::mem::take(&mut self.dirs);
        for d in dirs.into_iter().rev() {
            if self.results[d.idx].error.is_some() {
                continue;
            }
            if matches!(self.job, Job::Upload { .. }) {
                let id = conn.meta(MetaOp::SetMeta {
                    path: d.path,
                    mode: Some(d.mode & 0o777),
                    mtime: Some(d.mtime),
                });
                self.pending.insert(id, Pending::Op(d.idx));
            } else if let Some(local) = &self.local {
                if let Err(e) = local.set_meta(&d.path, Some(d.mode & 0o777), Some((d.mtime, 0))) {
                    self.results[d.idx].error = Some(FileError::Local(e.to_string()));
                }
            }
        }
    }
}

/// Writes down what a download already has, for a rerun: not while it is still compared
/// with a basis (see [`let_go`]).
fn save_download_state(conn: &Connection, xfer: XferId, a: &mut Active) {
    if let (Some(part), None) = (&mut a.part, &a.basis) {
        save_progress(conn, xfer, part, a.size, a.mtime, &mut a.saved);
    }
}

/// A download's temp file when the download ends unfinished: kept for a rerun to resume;
/// but not one still compared with the file at the destination, which holds that file only
/// as far as its copy got, and no resume state (a rerun compares the destination again, and
/// would send the rest of the file if it took that temp file for its basis).
fn let_go(a: Active) {
    if let Some(p) = a.part {
        if a.basis.is_some() {
            p.drop_unstarted();
        } else {
            p.abandon();
        }
    }
}

/// How much of a file still in flight is at the destination, counting what it already had.
fn in_flight_done(conn: &Connection, xfer: XferId, a: &Active) -> u64 {
    if a.upload {
        conn.outgoing_acked_bytes(xfer).unwrap_or(0)
    } else {
        conn.incoming_progress(xfer)
            .map(|(got, n)| (a.size * got).checked_div(n).unwrap_or(0))
            .unwrap_or(0)
    }
}

/// Resume or delta credit of an upload: what the receiver said it had, and from what.
fn credit_upload(conn: &Connection, xfer: XferId, r: &mut FileResult) {
    if let Some(b) = conn.outgoing_skipped_bytes(xfer) {
        if conn.outgoing_basis(xfer) == Some(basis::DEST) {
            r.reused_bytes = b;
        } else {
            r.resumed_bytes = b;
        }
    }
}

fn new_conn(cfg: &Config, psk: &Psk, peer: SocketAddr, now: Instant) -> Connection {
    let fam = AddrFamily::of(&peer);
    let mut c = Connection::client(cfg.clone(), psk, fam, now);
    c.hash_sources_outside();
    c
}

/// Runs the whole job. Never panics on I/O trouble: everything ends up in the report.
/// Returns once the writes and resume states of files it let go are in place (see
/// [`writeback::settle_all`](crate::writeback::settle_all)).
pub fn run(opts: ClientOptions, job: Job, stop: StopFlag, ui: &mut dyn Ui) -> Report {
    let report = run_job(opts, job, stop, ui);
    crate::writeback::settle_all();
    report
}

fn run_job(opts: ClientOptions, job: Job, stop: StopFlag, ui: &mut dyn Ui) -> Report {
    let start = Instant::now();
    let mut s = Session::new(&job, opts.flags, opts.recursive);
    s.stdin = opts.stdin;
    s.stdout = opts.stdout;
    s.retry_changed = opts.retry_changed;
    s.delete = opts.delete && opts.recursive;
    let report =
        |s: Session<'_>, stats: Stats, error: Option<SessionError>, via_stream: bool| Report {
            files: s.results,
            deleted: s.deleted,
            not_deleted: s.not_deleted,
            seconds: start.elapsed().as_secs_f64(),
            stats,
            error,
            via_stream,
            measured: None,
        };
    match std::env::current_dir()
        .map_err(SessionError::current_dir)
        .and_then(|d| Root::whole_fs(&d).map_err(SessionError::current_dir))
    {
        Ok(r) => s.local = Some(r),
        Err(e) => return report(s, Stats::default(), Some(e), false),
    }
    if let Job::Download { sources, dest } = &job {
        let patterns = sources.iter().any(|p| crate::glob::is_pattern(p));
        if (sources.len() > 1 || patterns) && !opts.stdout && !dest.is_dir() {
            let e = SessionError::NotADirectory {
                dest: dest.clone(),
                pattern: sources.len() == 1,
            };
            return report(s, Stats::default(), Some(e), false);
        }
    }

    let (peer, mut spare_stream, fallback_after, udp_target) = match opts.path {
        Transport::Udp(a) => (a, None, None, Some(a)),
        Transport::Stream(st) => (STREAM_PEER, Some(st), None, None),
        Transport::UdpThenStream {
            addr,
            stream,
            after,
        } => (addr, Some(stream), Some(after), Some(addr)),
    };
    let links = match udp_target {
        Some(a) => {
            let bind: SocketAddr = if a.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }
                .parse()
                .expect("addr");
            match UdpSocket::bind(bind) {
                Ok(sock) => Links::new(Some(sock), None),
                Err(e) => {
                    return report(s, Stats::default(), Some(SessionError::UdpSocket(e)), false)
                }
            }
        }
        None => Links::new(None, spare_stream.take()),
    };
    // The ssh channel is another path: what UDP's remembered says nothing of it.
    let stream_cfg = Config {
        mtu: STREAM_MTU,
        remembered: None,
        ..opts.proto.clone()
    };
    let via_stream = udp_target.is_none();
    let conn = if via_stream {
        new_conn(&stream_cfg, &opts.psk, peer, Instant::now())
    } else {
        let cfg = Config {
            mtu: crate::udp::mtu_toward(opts.proto.mtu, peer),
            ..opts.proto.clone()
        };
        new_conn(&cfg, &opts.psk, peer, Instant::now())
    };
    let mut net = Net::one(links, conn, peer);
    let mut c = Client {
        s,
        ui,
        stop,
        start,
        psk: opts.psk,
        stream_cfg,
        spare_stream,
        fallback_after,
        via_stream,
        connected: false,
        started: false,
        session_error: None,
        bye_at: None,
        last_progress: Instant::now() - Duration::from_secs(1),
        last_state: Instant::now(),
    };
    if let Err(e) = engine::run(&mut c, &mut net) {
        c.session_error.get_or_insert(SessionError::Io(e));
    }
    let Client {
        mut s,
        mut session_error,
        started,
        via_stream,
        ..
    } = c;
    if !started && session_error.is_none() {
        session_error = Some(SessionError::NeverStarted);
    }
    let (conn, files) = net.the_one().expect("a client's one session");

    // Whatever is still open did not finish: say what is missing, keep partial files.
    let why = session_error
        .as_ref()
        .map_or_else(|| "session ended".into(), ToString::to_string);
    for (xfer, mut a) in files.act.drain() {
        if !a.upload {
            save_download_state(conn, xfer, &mut a);
        }
        let r = &mut s.results[a.idx];
        r.moved_bytes = in_flight_done(conn, xfer, &a).saturating_sub(r.kept_bytes());
        let unfinished = if a.upload {
            let acked = conn.outgoing_acked_bytes(xfer).unwrap_or(0);
            Some(Unfinished::Acked {
                acked,
                size: a.size,
            })
        } else if let Some((got, of)) = conn.incoming_progress(xfer) {
            let mut missing = conn.incoming_missing(xfer).unwrap_or_default();
            let more = missing.len() > 5;
            missing.truncate(5);
            Some(Unfinished::Blocks {
                got,
                of,
                missing,
                more,
            })
        } else {
            None
        };
        r.error.get_or_insert(FileError::Session {
            why: why.clone(),
            unfinished,
        });
        let_go(a);
    }
    for (up, _) in files.hashing.drain(..) {
        s.results[up.idx]
            .error
            .get_or_insert_with(|| FileError::session(&why));
    }
    for i in std::mem::take(&mut s.queue) {
        s.results[i]
            .error
            .get_or_insert_with(|| FileError::session(&why));
    }
    // Removals the far side never answered: not known to have happened.
    for (_, p) in s.pending.drain() {
        if let Pending::Remove(i) = p {
            s.deleted[i]
                .error
                .get_or_insert_with(|| FileError::session(&why));
        }
    }
    if s.delete && !s.pruned {
        s.not_deleted = Some(format!("nothing deleted: {why}"));
    }
    let stats = conn.stats();
    let measured = if via_stream {
        None
    } else {
        conn.rate_controller().measured()
    };
    Report {
        measured,
        ..report(s, stats, session_error, via_stream)
    }
}

/// The client's policy on the driver's loop (`engine`): the job's planner and its files,
/// the fallback to the ssh channel, progress, and when the session is done.
struct Client<'a, 'u> {
    s: Session<'a>,
    ui: &'u mut dyn Ui,
    stop: StopFlag,
    start: Instant,
    psk: Psk,
    stream_cfg: Config,
    /// The ssh channel, kept for a fallback while UDP has not answered.
    spare_stream: Option<StreamLink>,
    /// UDP without an answer this long after the start falls back to the channel.
    fallback_after: Option<Duration>,
    via_stream: bool,
    connected: bool,
    started: bool,
    session_error: Option<SessionError>,
    bye_at: Option<Instant>,
    last_progress: Instant,
    last_state: Instant,
}

impl Client<'_, '_> {
    /// Credits uploads with what the receiver said it already had.
    fn credit_resumed(&mut self, conn: &Connection, files: &Files, only: Option<XferId>) {
        for (x, a) in files.act.iter() {
            if a.upload && only.is_none_or(|o| o == *x) {
                credit_upload(conn, *x, &mut self.s.results[a.idx]);
            }
        }
    }

    fn show_progress(&mut self, conn: &Connection, files: &Files) {
        let s = &self.s;
        let stats = conn.stats();
        let active: u64 = files
            .act
            .iter()
            .map(|(x, a)| in_flight_done(conn, *x, a))
            .sum();
        let active_moved: u64 = files
            .act
            .iter()
            .map(|(x, a)| in_flight_done(conn, *x, a).saturating_sub(s.results[a.idx].kept_bytes()))
            .sum();
        let finished_moved: u64 = s.results.iter().map(|r| r.moved_bytes).sum();
        let files_total = s.results.iter().filter(|r| r.kind == Kind::File).count();
        let files_done = s
            .results
            .iter()
            .filter(|r| r.kind == Kind::File && (r.ok() || r.error.is_some()))
            .count();
        let all_moved = !files.act.is_empty() && s.finished_bytes + active >= s.bytes_total;
        let waiting = if files.hashing() {
            Some(Waiting::Hashing)
        } else if all_moved && files.act.values().any(|a| a.upload) {
            Some(Waiting::FarSideVerifying)
        } else if all_moved {
            Some(Waiting::Verifying)
        } else {
            None
        };
        self.ui.progress(&Progress {
            waiting,
            elapsed: self.start.elapsed(),
            bytes_done: s.finished_bytes + active,
            bytes_moved: finished_moved + active_moved,
            bytes_total: s.bytes_total,
            files_done,
            files_total,
            stats: &stats,
            connected: self.connected,
        });
    }
}

impl Policy for Client<'_, '_> {
    type Files = Files;

    fn wake_by(&self, now: Instant) -> Instant {
        now + Duration::from_millis(100)
    }

    fn begin(&mut self, now: Instant, net: &mut Net<Files>) -> Flow {
        let (conn, _) = net.the_one().expect("one session");
        // No UDP answer: the far side listens on the ssh channel too.
        let udp_silent = !self.connected
            && self.spare_stream.is_some()
            && (self
                .fallback_after
                .is_some_and(|t| now.duration_since(self.start) >= t)
                || conn.is_draining());
        if udp_silent {
            if let Some(st) = self.spare_stream.take() {
                let peer = match &net.conns {
                    engine::Conns::One { peer, .. } => *peer,
                    engine::Conns::Many(_) => STREAM_PEER,
                };
                self.ui.note(&format!(
                    "no UDP reply from {peer} (blocked by a firewall?): carrying the data over the ssh channel instead (slower)"
                ));
                self.via_stream = true;
                let mut conn = new_conn(&self.stream_cfg, &self.psk, STREAM_PEER, now);
                while conn.poll_event().is_some() {}
                net.replace_one(Some(Links::new(None, Some(st))), conn, STREAM_PEER);
            }
        }
        let stream_eof = net.links.stream_eof();
        let (conn, _) = net.the_one().expect("one session");
        if self.stop.is_stopped() && self.session_error.is_none() {
            self.session_error = Some(SessionError::Interrupted);
            conn.close(now, 1, "client interrupted");
        }
        if self.via_stream && stream_eof && self.session_error.is_none() && self.bye_at.is_none() {
            self.session_error = Some(SessionError::ChannelClosed);
            conn.close(now, 1, "channel closed");
        }
        Flow::Go
    }

    fn on_event(&mut self, x: &mut engine::Session<'_, Files>, ev: Event, _now: Instant) {
        let (conn, files) = (&mut *x.conn, &mut *x.files);
        if let Event::OutgoingDone { xfer, .. } = &ev {
            // A small upload may be done in the turn its receiver's Ready came.
            self.credit_resumed(conn, files, Some(*xfer));
        }
        let s = &mut self.s;
        match ev {
            Event::Connected => {
                self.connected = true;
                if !self.started {
                    self.started = true;
                    s.start(conn);
                }
            }
            Event::MetaReplied { id, result, more } => s.on_meta(conn, id, result, more),
            Event::Offered {
                xfer,
                size,
                mode,
                mtime,
                flags: fl,
                hash,
                ..
            } => {
                let Some(a) = files.act.get_mut(&xfer) else {
                    return;
                };
                let r = &mut s.results[a.idx];
                s.bytes_total = s.bytes_total - r.bytes + size;
                r.bytes = size;
                a.size = size;
                a.mode = mode;
                a.mtime = mtime;
                if let Some(want) = hash.filter(|_| fl & flags::UPDATE != 0 && !s.stdout) {
                    let local = File::open(&r.local)
                        .ok()
                        .filter(|f| f.metadata().is_ok_and(|m| m.is_file() && m.len() == size));
                    if let Some(f) = local {
                        // Hashed by the workers, the loop going on meanwhile
                        // (`settle_update_hashes`).
                        a.compare = Some((want, WholeHash::start(f, size)));
                        return;
                    }
                }
                if !accept_download(conn, s, xfer, a) {
                    files.act.remove(&xfer);
                }
            }
            Event::IncomingComplete { xfer, blake3 } => {
                // The verdict follows when the last subtrees are hashed (below).
                if let Some(l) = files.act.get_mut(&xfer).and_then(|a| a.landing.as_mut()) {
                    l.complete(blake3);
                }
            }
            Event::IncomingFailed { xfer, reason } => {
                if let Some(mut a) = files.act.remove(&xfer) {
                    // The core names the transfer by the far side's path; a write that
                    // failed here (a full disk) is about the local destination.
                    let r = &mut s.results[a.idx];
                    r.error = Some(FileError::Local(match a.write_error.take() {
                        Some(e) => format!("cannot write {}: {e}", r.local.display()),
                        None => reason,
                    }));
                    if a.no_space {
                        // Keeping it would leave the disk full for everything else.
                        if let Some(p) = a.part {
                            p.discard();
                        }
                    } else {
                        save_download_state(conn, xfer, &mut a);
                        let_go(a);
                    }
                }
            }
            Event::OutgoingDone { xfer, result } => {
                if let Some(a) = files.act.remove(&xfer) {
                    // Checked after the far side's verdict too: a file changed after its
                    // last read is not the one that was verified.
                    let src = a.file.as_ref().map(|s| &s.file);
                    let local = src.and_then(|f| f.failure().cloned());
                    let changed = src.and_then(|f| f.check().err());
                    let failed = local.or(changed);
                    if let Some(e) = &failed {
                        if s.retry_changed_source(a.idx, e.changed()) {
                            let path = s.results[a.idx].local.display().to_string();
                            self.ui
                                .note(&format!("{path}: {e}: sending it again from the start"));
                            return;
                        }
                    }
                    let r = &mut s.results[a.idx];
                    match (result, failed) {
                        (_, Some(e)) => r.error = Some(FileError::source(&e)),
                        (Ok(h), None) => {
                            r.verified = true;
                            r.blake3 = Some(hex(&h));
                            r.moved_bytes = a.size.saturating_sub(r.kept_bytes());
                            s.finished_bytes += a.size;
                        }
                        (Err(e), None) => r.error = Some(FileError::RemoteReceive(e)),
                    }
                }
            }
            Event::Skipped { xfer, reason } => {
                if let Some(a) = files.act.remove(&xfer) {
                    s.results[a.idx].skipped = Some(reason);
                    s.finished_bytes += a.size;
                }
            }
            Event::Rejected { xfer, reason } => {
                if let Some(a) = files.act.remove(&xfer) {
                    // A download whose source changed on the far side: what landed is
                    // of the old file, so it goes, and the file is asked for afresh.
                    let changed = reason.contains(fs::CHANGED_WHILE_SENT);
                    if !a.upload && s.retry_changed_source(a.idx, changed) {
                        if let Some(p) = a.part {
                            p.discard();
                        }
                        let r = &s.results[a.idx];
                        self.ui.note(&format!(
                            "{}: far side: {reason}: asking for it again from the start",
                            r.remote
                        ));
                        return;
                    }
                    let idx = a.idx;
                    let_go(a);
                    s.on_refused(conn, idx, reason);
                }
            }
            Event::Placed { xfer, path } => {
                if let Some(a) = files.act.get(&xfer) {
                    s.results[a.idx].remote = path;
                }
            }
            Event::GetRequested { .. }
            | Event::Bye
            | Event::MetaRequested { .. }
            | Event::TunnelRequested { .. }
            | Event::TunnelAnswered { .. } => {}
            Event::Closed { error } => {
                if let Some(e) = error {
                    if self.connected || self.spare_stream.is_none() {
                        self.session_error.get_or_insert(SessionError::Closed(e));
                    }
                }
            }
        }
    }

    fn turn(&mut self, x: &mut engine::Session<'_, Files>, now: Instant) -> bool {
        let (conn, files) = (&mut *x.conn, &mut *x.files);
        self.credit_resumed(conn, files, None);
        let s = &mut self.s;
        settle_update_hashes(conn, files, s, self.ui);
        // Start queued transfers while there is room: here, after the events that queue
        // them (the session up, a listing answered, a transfer done), so their offers and
        // first data go out in this pass, not after the next wake-up.
        while self.started
            && files.act.len() + files.hashing.len() < MAX_ACTIVE
            && self.session_error.is_none()
        {
            let Some(i) = s.queue.pop_front() else {
                break;
            };
            s.start_file(conn, files, i);
        }
        // The far side may hear nothing else while a big file is hashed here.
        conn.keep_alive(files.hashing());

        let idle = self.started
            && files.act.is_empty()
            && files.hashing.is_empty()
            && s.queue.is_empty()
            && s.pending.is_empty();
        // `--delete` once the copy is over, before directory times are set (removing from a
        // directory changes its mtime).
        if idle && s.delete && !s.pruned && self.session_error.is_none() {
            s.prune(conn);
        }
        let idle = idle && s.pending.is_empty();
        if idle && !s.dirs_sent && self.session_error.is_none() {
            s.finish_dirs(conn);
        }
        let idle = idle && s.pending.is_empty();
        if idle && self.bye_at.is_none() && self.session_error.is_none() {
            conn.bye();
            self.bye_at = Some(now);
        }
        false
    }

    fn settle(&mut self, x: &mut engine::Session<'_, Files>, now: Instant) -> bool {
        let (conn, files) = (&mut *x.conn, &mut *x.files);
        if now.duration_since(self.last_state) >= Duration::from_millis(500) {
            self.last_state = now;
            for (x, a) in files.act.iter_mut() {
                if !a.upload {
                    save_download_state(conn, *x, a);
                }
            }
        }
        if now.duration_since(self.last_progress) >= Duration::from_millis(100) {
            self.last_progress = now;
            self.show_progress(conn, files);
        }
        // After the transmit pass: the loss map that acknowledges a file's last blocks went
        // out before its verdict ends the transfer in the core.
        settle_downloads(conn, files, &mut self.s);
        let hashing = give_source_hashes(conn, files);
        hashing
            || files.hashing()
            || files
                .act
                .values()
                .any(|a| a.landing.as_ref().is_some_and(Landing::verifying))
    }

    fn end(&mut self, now: Instant, net: &mut Net<Files>) -> Flow {
        let (conn, _) = net.the_one().expect("one session");
        // A UDP attempt that failed (refused, timed out) still has the channel to try.
        if conn.is_draining() && (self.connected || self.spare_stream.is_none()) {
            return Flow::Stop;
        }
        // All done and said goodbye: don't wait long for the server's CLOSE.
        if self
            .bye_at
            .is_some_and(|t| now.duration_since(t) > Duration::from_secs(2))
        {
            return Flow::Stop;
        }
        Flow::Go
    }
}

/// Errors do not repeat the path: the report already names the file.
fn open_source(path: &Path) -> Result<(File, std::fs::Metadata), String> {
    let f = File::open(path).map_err(|e| e.to_string())?;
    let m = f.metadata().map_err(|e| e.to_string())?;
    if !m.is_file() {
        return Err("not a regular file".into());
    }
    Ok((f, m))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session's failure on a file under way reads as it always did: why, how far it got,
    /// and that a rerun resumes; on anything else, just why.
    #[test]
    fn a_session_failure_says_what_is_missing() {
        let up = FileError::Session {
            why: "interrupted".into(),
            unfinished: Some(Unfinished::Acked {
                acked: 4096,
                size: 10000,
            }),
        };
        assert_eq!(
            up.to_string(),
            "interrupted; the far side acknowledged 4096 of 10000 bytes (a rerun resumes)"
        );
        let down = |missing: Vec<(u64, u64)>, more| FileError::Session {
            why: "no answer".into(),
            unfinished: Some(Unfinished::Blocks {
                got: 3,
                of: 20,
                missing,
                more,
            }),
        };
        assert_eq!(
            down(vec![(3, 5), (9, 20)], false).to_string(),
            "no answer; received 3 of 20 blocks, missing blocks 3..5, 9..20 (a rerun resumes)"
        );
        assert_eq!(
            down((0..5).map(|i| (i * 2, i * 2 + 1)).collect(), true).to_string(),
            "no answer; received 3 of 20 blocks, missing blocks 0..1, 2..3, 4..5, 6..7, 8..9, \
             ... (a rerun resumes)"
        );
        assert_eq!(
            FileError::session("session ended").to_string(),
            "session ended"
        );
        assert_eq!(FileError::session("x").kind(), "session");
    }

    /// `cp HOST:FILE DEST` asks for the file at once; listing it first cost a round trip
    /// before the first byte. Several sources, or `-r`, are listed first (a tree needs it).
    #[test]
    fn one_download_is_asked_for_without_listing_it_first() {
        let conn = || {
            Connection::client(
                Config::default(),
                &Psk::from_bytes([7; 32]),
                AddrFamily::V4,
                Instant::now(),
            )
        };
        let dest = PathBuf::from("/nonexistent/hayate-test/out.bin");
        let one = Job::Download {
            sources: vec!["dir/f.bin".into()],
            dest: dest.clone(),
        };
        let mut s = Session::new(&one, 0, false);
        s.start(&mut conn());
        assert!(s.pending.is_empty(), "listed the one source first");
        assert_eq!(s.queue.len(), 1);
        assert_eq!(s.results[0].remote, "dir/f.bin");
        assert_eq!(s.results[0].local, dest);

        let mut s = Session::new(&one, 0, true);
        s.start(&mut conn());
        assert_eq!(s.pending.len(), 1, "-r must list the source");
        assert!(s.queue.is_empty());

        let two = Job::Download {
            sources: vec!["a".into(), "b".into()],
            dest,
        };
        let mut s = Session::new(&two, 0, false);
        s.start(&mut conn());
        assert_eq!(s.pending.len(), 2);
    }

    /// A download's paths come from the far side's listings: only plain names beneath what
    /// was listed are taken, so a hostile far side cannot steer a copy (or `--delete`) out.
    #[test]
    fn listed_paths_must_be_plain_names() {
        for ok in ["", "a", "a/b", "a.b/.c", "...", "a b/c~"] {
            assert!(plain_relative(ok), "{ok}");
        }
        for bad in ["..", "a/..", "../a", ".", "a/./b", "/a", "a//b", "a/", "/"] {
            assert!(!plain_relative(bad), "{bad}");
        }
        assert!(temp_file_name("d/.f.hayate-part") && temp_file_name(".f.hayate-state"));
        assert!(!temp_file_name("d.hayate-part/f"));
        assert_eq!(as_dir("a"), "a/");
        assert_eq!(as_dir("a/"), "a/");
    }
}
