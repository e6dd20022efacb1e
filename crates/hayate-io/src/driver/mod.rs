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
