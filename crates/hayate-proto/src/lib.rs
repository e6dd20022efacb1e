//! Sans-IO core of hayate: everything about the protocol, nothing about sockets, files,
//! threads or clocks. Callers feed datagrams and the current time in, and take datagrams,
//! timer deadlines and events out. See `docs/PROTOCOL.md` for the wire format.
//!
//! - [`wire`], [`crypto`], [`handshake`]: bytes on the wire and keys.
//! - [`conn`]: one session (control stream, transfers, acks, pacing); [`endpoint`]: a server's
//!   many sessions on one socket.
//! - [`transfer`]: per-file loss map and retransmission state; [`cc`]: rate control.
//! - `sim` (cargo feature `sim`, on for this crate's tests): a simulated network to run
//!   whole transfers in milliseconds.

#![warn(missing_docs)]

pub mod bitset;
pub mod cc;
pub mod conn;
#[allow(missing_docs)] // Not yet documented item by item.
pub mod control;
pub mod crypto;
pub mod endpoint;
pub mod handshake;
pub mod pacer;
pub mod retry;
pub mod rng;
pub mod rtt;
#[cfg(feature = "sim")]
#[allow(missing_docs)] // Not yet documented item by item.
pub mod sim;
pub mod stream;
#[allow(missing_docs)] // Not yet documented item by item.
pub mod transfer;
#[allow(missing_docs)] // Not yet documented item by item.
pub mod wire;

pub use conn::{
    BlockSink, BlockSource, CcTraceRow, Config, Connection, Event, FileOffer, ReceiverState, Side,
    Stats,
};
pub use endpoint::{Endpoint, Route};
pub use transfer::XferId;
