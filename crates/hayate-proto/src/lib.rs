//! Sans-IO core of hayate: everything about the protocol, nothing about sockets, files,
//! threads or clocks. Callers feed datagrams and the current time in, and take datagrams,
//! timer deadlines and events out. See `docs/PROTOCOL.md` for the wire format.
//!
//! - [`wire`], [`crypto`], [`handshake`]: bytes on the wire and keys.
//! - [`conn`]: one session (control stream, transfers, acks, pacing); [`endpoint`]: a server's
//!   many sessions on one socket.
//! - [`control`]: what the control stream's messages carry that a driver sees (file-system
//!   requests and listings, offer flags, leaf hashes); the messages themselves are internal.
//! - [`transfer`]: transfer ids (the per-file loss map and retransmission state are
//!   internal); [`cc`]: rate control.
//! - `sim` (cargo feature `sim`, on for this crate's tests): a simulated network to run
//!   whole transfers in milliseconds.

#![warn(missing_docs)]

pub mod bitset;
pub mod cc;
pub mod conn;
pub mod control;
pub mod crypto;
pub mod endpoint;
pub mod handshake;
pub mod pacer;
pub mod retry;
pub mod rng;
pub mod rtt;
#[cfg(feature = "sim")]
pub mod sim;
pub mod stream;
pub mod transfer;
pub mod wire;

pub use conn::{
    BlockSink, BlockSource, CcTraceRow, Config, Connection, Event, FileOffer, NoFiles,
    ReceiverState, Side, Stats, StorageError, Transmit,
};
pub use endpoint::{Endpoint, Route};
pub use transfer::XferId;
