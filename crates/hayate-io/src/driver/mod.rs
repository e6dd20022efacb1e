//! Event loops that run `hayate-proto` sessions on real sockets and files: one thread each,
//! receive a batch, feed the core, let it transmit (batched with GSO), then sleep until the
//! core's next deadline or the next datagram.

mod batch;
pub mod client;
mod engine;
pub mod link;
pub mod mem;
mod open;
pub(crate) mod resume;
pub mod server;
pub mod tunnel;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hayate_proto::control::flags;
use hayate_proto::Connection;

pub use batch::SendBatch;

/// Set from a signal handler to make a loop stop cleanly.
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    /// A flag not yet set.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the flag (for good); every clone sees it. A loop notices it at its next turn
    /// (within 200 ms) and ends its sessions.
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    /// Whether [`stop`](Self::stop) was called on this flag or a clone of it.
    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    /// The flag itself, for `signal_hook::flag::register`.
    pub fn inner(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

/// The mode a received file or directory gets: exact with `-p`, else masked by the umask.
pub(crate) fn dest_mode(mode: u32, fl: u32) -> u32 {
    if fl & flags::PRESERVE != 0 {
        mode & 0o777
    } else {
        mode & 0o777 & !crate::fs::umask()
    }
}

/// Seconds since the epoch (negative before it) as a `SystemTime`.
pub(crate) fn systime(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

/// `HAYATE_CC_TRACE=FILE`: every feedback the rate controller got and what it decided, as
/// tab-separated lines (for tuning it on real paths; bench/wan reads them). A client writes
/// FILE; a server writes `FILE.N` for its Nth session (it is the sender of downloads).
pub(crate) struct CcTrace {
    out: std::io::BufWriter<std::fs::File>,
}

impl CcTrace {
    pub(crate) fn from_env(conn: &mut Connection) -> Option<CcTrace> {
        Self::create(Self::path()?.into(), conn)
    }

    /// A server's next session: the `n`th to begin in this process (from 1), whichever of
    /// a daemon's threads serves it.
    pub(crate) fn from_env_session(conn: &mut Connection) -> Option<CcTrace> {
        static BEGUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut path = Self::path()?;
        let n = BEGUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        path.push(format!(".{n}"));
        Self::create(path.into(), conn)
    }

    /// Set and not empty (`HAYATE_CC_TRACE=` is off, not a file named `.1`).
    fn path() -> Option<std::ffi::OsString> {
        std::env::var_os("HAYATE_CC_TRACE").filter(|p| !p.is_empty())
    }

    fn create(path: std::path::PathBuf, conn: &mut Connection) -> Option<CcTrace> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path).ok()?);
        use std::io::Write;
        writeln!(out, "{}", hayate_proto::CcTraceRow::TSV_HEADER).ok()?;
        conn.enable_cc_trace();
        Some(CcTrace { out })
    }

    pub(crate) fn flush(&mut self, conn: &mut Connection) {
        use std::io::Write;
        for r in conn.take_cc_trace() {
            let _ = writeln!(self.out, "{}", r.tsv());
        }
        let _ = self.out.flush();
    }
}

/// A pipe for tests (both ends close-on-exec): the fds a tunnel or an ssh channel runs on.
#[cfg(test)]
pub(crate) fn test_pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe")
}
