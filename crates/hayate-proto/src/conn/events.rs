//! What the session tells the application.

use crate::control::{MetaEntry, MetaOp};
use crate::transfer::XferId;

use super::Connection;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Handshake done (client: server proved the key; server: client proved it).
    Connected,
    /// The peer will send us a file (upload to a server, or answer to our `request`).
    /// Answer with [`Connection::accept`] or [`Connection::reject`].
    Offered {
        xfer: XferId,
        path: String,
        size: u64,
        mode: u32,
        mtime: i64,
        /// [`crate::control::flags`].
        flags: u32,
        /// The source's BLAKE3 when known up front.
        hash: Option<[u8; 32]>,
    },
    /// Server: the client asks for a file. Answer with [`Connection::offer`] or `reject`.
    GetRequested {
        xfer: XferId,
        path: String,
        flags: u32,
    },
    /// The receiver took our offer and chose where the file goes (an `INTO_DIR` offer).
    Placed { xfer: XferId, path: String },
    /// The peer refused or aborted a transfer.
    Rejected { xfer: XferId, reason: String },
    /// The receiver declined our offer without error (`NO_CLOBBER`, `UPDATE`).
    Skipped { xfer: XferId, reason: String },
    /// Server: a file-system request; answer with [`Connection::meta_reply`].
    MetaRequested { id: u32, op: MetaOp },
    /// Client: (part of) the answer to [`Connection::meta`]; more parts follow if `more`.
    MetaReplied {
        id: u32,
        result: Result<Vec<MetaEntry>, String>,
        more: bool,
    },
    /// Every block has arrived and the sender's hash is known: verify the file, then call
    /// [`Connection::finish_incoming`].
    IncomingComplete { xfer: XferId, blake3: [u8; 32] },
    /// A receive failed locally (write error) and the sender was told.
    IncomingFailed { xfer: XferId, reason: String },
    /// The receiver verified our file (Ok, with its BLAKE3) or reported failure (Err).
    OutgoingDone {
        xfer: XferId,
        result: Result<[u8; 32], String>,
    },
    /// Server: the client has no more requests.
    Bye,
    /// The session is over; `error` is None for a normal close.
    Closed { error: Option<String> },
}

impl Connection {
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}
