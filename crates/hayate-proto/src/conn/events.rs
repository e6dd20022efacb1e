//! What the session tells the application.

use crate::control::{MetaEntry, MetaOp};
use crate::transfer::XferId;

use super::Connection;

/// Something the application should know or answer, from [`Connection::poll_event`].
/// Transfers are named by their [`XferId`], which both ends share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Handshake done (client: server proved the key; server: client proved it).
    Connected,
    /// The peer will send us a file (upload to a server, or answer to our `request`).
    /// Answer with [`Connection::accept`] or [`Connection::reject`].
    Offered {
        /// The transfer.
        xfer: XferId,
        /// Where the sender says the file goes.
        path: String,
        /// Size in bytes.
        size: u64,
        /// Unix permission bits.
        mode: u32,
        /// Modification time, seconds since the epoch.
        mtime: i64,
        /// [`crate::control::flags`].
        flags: u32,
        /// The source's BLAKE3 when known up front.
        hash: Option<[u8; 32]>,
    },
    /// Server: the client asks for a file. Answer with [`Connection::offer`] or `reject`.
    GetRequested {
        /// The transfer, numbered by the client.
        xfer: XferId,
        /// The file asked for.
        path: String,
        /// [`crate::control::flags`].
        flags: u32,
    },
    /// The receiver took our offer and chose where the file goes (an `INTO_DIR` offer).
    Placed {
        /// The transfer.
        xfer: XferId,
        /// Where the receiver put it.
        path: String,
    },
    /// The peer refused or aborted a transfer.
    Rejected {
        /// The transfer.
        xfer: XferId,
        /// The peer's reason, for the user.
        reason: String,
    },
    /// The receiver declined our offer without error (`NO_CLOBBER`, `UPDATE`).
    Skipped {
        /// The transfer.
        xfer: XferId,
        /// Why (say, the file is already there), for the user.
        reason: String,
    },
    /// Server: a file-system request; answer with [`Connection::meta_reply`].
    MetaRequested {
        /// The request's number, to quote in the answer.
        id: u32,
        /// What is asked.
        op: MetaOp,
    },
    /// Client: (part of) the answer to [`Connection::meta`]; more parts follow if `more`.
    MetaReplied {
        /// The number [`Connection::meta`] returned.
        id: u32,
        /// The entries, or why the server could not.
        result: Result<Vec<MetaEntry>, String>,
        /// More parts of this answer follow.
        more: bool,
    },
    /// Every block has arrived and the sender's hash is known: verify the file, then call
    /// [`Connection::finish_incoming`].
    IncomingComplete {
        /// The transfer.
        xfer: XferId,
        /// The whole file's BLAKE3 as the sender computed it.
        blake3: [u8; 32],
    },
    /// A receive failed locally (write error) and the sender was told.
    IncomingFailed {
        /// The transfer.
        xfer: XferId,
        /// What failed, for the user.
        reason: String,
    },
    /// The receiver verified our file (Ok, with its BLAKE3) or reported failure (Err).
    OutgoingDone {
        /// The transfer.
        xfer: XferId,
        /// The verified hash, or why the transfer failed.
        result: Result<[u8; 32], String>,
    },
    /// Server: the client has no more requests.
    Bye,
    /// Server: the client asks for a tunnel to `host:port` (`hayate tunnel`); answer with
    /// [`Connection::answer_tunnel`](super::Connection::answer_tunnel).
    TunnelRequested {
        /// Where to connect, as the server resolves it.
        host: String,
        /// The TCP port there.
        port: u16,
    },
    /// Client: the server's answer to
    /// [`Connection::open_tunnel`](super::Connection::open_tunnel).
    TunnelAnswered {
        /// Connected, or why not (`"connection refused"`, …).
        result: Result<(), String>,
    },
    /// The session is over; `error` is None for a normal close.
    Closed {
        /// Why the session ended, for the user; `None`: normally.
        error: Option<String>,
    },
}

impl Connection {
    /// The next event, if any; call until `None` after each datagram or timeout.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}
