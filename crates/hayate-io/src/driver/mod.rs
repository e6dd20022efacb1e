//! Event loops that run `hayate-proto` sessions on real sockets and files: one thread each,
//! receive a batch, feed the core, let it transmit (batched with GSO), then sleep until the
//! core's next deadline or the next datagram.

mod batch;
pub mod client;
pub mod link;
pub mod mem;
mod resume;
pub mod server;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hayate_proto::control::flags;

pub use batch::SendBatch;

/// Set from a signal handler to make a loop stop cleanly.
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
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
