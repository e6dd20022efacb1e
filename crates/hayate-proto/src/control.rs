//! The reliable, ordered control stream (CTRL frames) and the messages it carries.
//! It is a byte stream of `crate::stream`'s kind: the receiver's ACK tells the in-order end
//! (`ctrl_offset`) and, while anything arrived beyond a gap, a STREAM_ACK maps it; the
//! sender sends again only what was lost, so bulk control traffic (a delta's leaf hashes, a
//! big tree's listing) keeps going over a lossy path instead of waiting for a probe timeout.

use crate::cc::Policy;
use crate::stream::{StreamRecv, StreamSend, CONTROL_STREAM_ID};
use crate::wire::{LossMapFrame, StreamAckFrame};

use serde::{Deserialize, Serialize};

/// Control messages; `docs/PROTOCOL.md` gives their meaning. Order of variants is wire format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Ctrl {
    Offer {
        xfer: u32,
        path: String,
        size: u64,
        mode: u32,
        mtime: i64,
        /// [`flags`] the receiver applies (client uploads) or echoes (answers to a Get).
        flags: u32,
        /// The whole file's BLAKE3 when the sender knew it up front (`UPDATE`).
        hash: Option<[u8; 32]>,
    },
    Get {
        xfer: u32,
        path: String,
        flags: u32,
    },
    Ready {
        xfer: u32,
        have: Vec<(u64, u64)>,
        /// Blocks the receiver holds in part (delta): only these bytes of each are sent.
        parts: Vec<BlockSpan>,
        /// Where the file goes, when the receiver chose it (an `INTO_DIR` offer).
        path: Option<String>,
    },
    Reject {
        xfer: u32,
        reason: String,
    },
    Sent {
        xfer: u32,
        blake3: [u8; 32],
    },
    Verified {
        xfer: u32,
        blake3: [u8; 32],
    },
    Failed {
        xfer: u32,
        reason: String,
    },
    Bye,
    /// Client's transfer preferences, sent first: rates in bytes/s, 0 = no limit.
    Params {
        rate_max: u64,
        rate_min: u64,
        adaptive: bool,
        policy: Policy,
    },
    /// The receiver declines an offer without error (exists and `NO_CLOBBER`, or identical
    /// and `UPDATE`).
    Skip {
        xfer: u32,
        reason: String,
    },
    /// Client: a file-system request that moves no file data (trees, links, metadata).
    Meta {
        id: u32,
        op: MetaOp,
    },
    /// Server: the answer to `Meta` `id`; a long listing comes in several parts, the last
    /// with `more: false`.
    MetaReply {
        id: u32,
        result: Result<Vec<MetaEntry>, String>,
        more: bool,
    },
    /// Receiver, instead of `Ready`: it holds a basis for the offered file (`basis`: what
    /// kind, see [`basis`]); the sender sends its leaf hashes (`Sums`), the receiver answers
    /// with `Ready` whose `have` are the blocks the basis already holds.
    WantSums {
        xfer: u32,
        basis: u8,
    },
    /// Sender: the leaf hashes `first..first + leaves.len()` of the offered file, in order
    /// (see `docs/PROTOCOL.md`, delta transfers).
    Sums {
        xfer: u32,
        first: u64,
        leaves: Vec<LeafHash>,
    },
    /// Client: connect the session's byte stream (`crate::stream`) to `host:port` as the
    /// server itself sees it (`hayate tunnel`). Stream bytes may follow at once.
    Tunnel {
        host: String,
        port: u16,
    },
    /// Server: the answer to `Tunnel`: connected, or why not (`"connection refused"`, or
    /// "this server opens no tunnels").
    TunnelReply {
        result: Result<(), String>,
    },
    /// Receiver, after `WantSums` and before `Ready`: the leaves of blocks below `upto` are
    /// compared. Of the blocks from the previous `Compared`'s `upto` (or 0) to this one it
    /// holds `have` and `parts` (as in `Ready`); the sender may send the rest of them now,
    /// while the receiver compares the others.
    Compared {
        xfer: u32,
        upto: u64,
        have: Vec<(u64, u64)>,
        parts: Vec<BlockSpan>,
    },
}

/// The bytes `from..to` of `block`: of a block the receiver holds in part (a delta whose
/// matching leaves cover the rest of it), what is still to be sent. A DATA frame for that
/// block carries these bytes alone (or the whole block, sent before `Ready`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockSpan {
    /// Block number.
    pub block: u64,
    /// Offsets in the block: `from < to <= ` the block's length.
    pub from: u32,
    /// End (exclusive).
    pub to: u32,
}

impl BlockSpan {
    /// Bytes the span covers.
    pub fn len(&self) -> usize {
        (self.to - self.from) as usize
    }

    /// Whether it covers nothing (never, in a valid span).
    pub fn is_empty(&self) -> bool {
        self.to <= self.from
    }
}

/// Bytes per leaf of the hashes `Sums` carries: an aligned subtree of 4 BLAKE3 chunks.
pub const LEAF_LEN: u64 = 4096;

/// What `Sums` carries per leaf: the first 16 bytes of the leaf's BLAKE3 chaining value
/// (non-root, at its offset in the file).
pub type LeafHash = [u8; 16];

/// Most leaf hashes in one `Sums` message (512 KiB of them: well within [`MAX_MESSAGE`]).
pub(crate) const SUMS_PER_MESSAGE: usize = 32768;

/// `WantSums.basis`: what the receiver compares the sender's leaves with.
pub mod basis {
    /// The temp file an interrupted copy left (verified resume): matching blocks are kept.
    pub const RESUME: u8 = 0;
    /// The file already at the destination (delta): matching blocks are copied from it.
    pub const DEST: u8 = 1;
}

/// Bits of `Offer.flags` / `Get.flags`.
pub mod flags {
    /// Apply the source's mtime (the mode is always carried over, masked by the umask
    /// without this flag).
    pub const PRESERVE: u32 = 1;
    /// Leave an existing destination alone.
    pub const NO_CLOBBER: u32 = 2;
    /// Skip a destination whose content is already identical (BLAKE3 of the whole file).
    pub const UPDATE: u32 = 4;
    /// The offered path is `DIR/NAME`: the file goes there if `DIR` is a directory, else it
    /// is `DIR` itself (`cp FILE DEST`). The receiver decides, and says where in `Ready`:
    /// the sender saves the round trip of asking first.
    pub const INTO_DIR: u32 = 8;
    /// The offered content cannot be sent again (standard input): the receiver resumes
    /// nothing from an earlier temp file, whatever its state says.
    pub const NO_RESUME: u32 = 16;
    /// (`-W`) The receiver sends no leaf hashes of the file at the destination: the whole
    /// file is sent (a kept temp file is still checked against the sender's leaves).
    pub const WHOLE_FILE: u32 = 32;
    /// (`--inplace`) The file at the destination is written in place, not through a temp
    /// file: only the blocks that differ are written.
    pub const INPLACE: u32 = 64;
}

/// File-system requests carried by `Ctrl::Meta`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaOp {
    /// `path` itself (lstat), then, if it is a directory and `recursive`, everything beneath.
    List {
        /// The path to list (relative to the server's root, or the ssh user's).
        path: String,
        /// Also everything beneath a directory, parents before children, never following
        /// links.
        recursive: bool,
    },
    /// mkdir -p, applying `mode` to the last component.
    Mkdir {
        /// The directory to create, with any missing parents.
        path: String,
        /// Permission bits for the last component (`None`: 0777 masked by the server's
        /// umask).
        mode: Option<u32>,
    },
    /// Create (or replace) a symbolic link; the target is stored verbatim.
    Symlink {
        /// Where the link goes.
        path: String,
        /// What it points to, as given.
        target: String,
    },
    /// Set mode and/or mtime (seconds) without following a final symlink.
    SetMeta {
        /// The file or directory to change.
        path: String,
        /// Permission bits to set (`None`: leave them).
        mode: Option<u32>,
        /// Modification time to set, seconds since the Unix epoch (`None`: leave it).
        mtime: Option<i64>,
    },
    /// The entries of one directory whose names match the pattern's last component (`*`,
    /// `?`, `[...]`, `\\` escapes; no shell), expanded by the server; each entry's `path` is
    /// the pattern's directory part joined with the name. No match is an empty list.
    Glob {
        /// A path whose last component is the pattern.
        pattern: String,
    },
    /// (`cp -r --delete`) Remove the one entry `path` beneath the directory `top`: a file,
    /// link or other entry (`dir` false; a link itself, never what it leads to) or an empty
    /// directory (`dir` true). `top` is resolved as `List` resolves `top/`; `path` is plain
    /// names beneath it, and no link on the way to its last component is followed.
    Remove {
        /// The directory the tree was copied to.
        top: String,
        /// Plain names beneath `top`, joined with `/`.
        path: String,
        /// The entry is a directory (removed only if empty).
        dir: bool,
    },
}

/// What a [`MetaEntry`] is (by lstat: links are not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link ([`MetaEntry::target`] holds where it points).
    Symlink,
    /// Anything else (device, FIFO, socket): not copied.
    Other,
}

/// One listed entry; `path` is relative to the listed path ("" for the path itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaEntry {
    /// Relative to the listed path, `/`-separated ("" for the path itself); for a
    /// [`MetaOp::Glob`], the pattern's directory part joined with the name.
    pub path: String,
    /// What it is.
    pub kind: EntryKind,
    /// Size in bytes of a regular file (0 for anything else).
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
    /// A symbolic link's target, verbatim ("" for anything else).
    pub target: String,
}

/// Largest encoded message accepted; bounds the memory a peer can make us buffer.
pub(crate) const MAX_MESSAGE: usize = 1 << 20;

/// How far past its contiguous offset a receiver takes control stream bytes; a sender never
/// sends past what the peer acknowledged plus this.
pub(crate) const WINDOW: u64 = 4 * MAX_MESSAGE as u64;

/// Why the control stream cannot go on (the session closes with a protocol error).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum CtrlError {
    #[error("control message too large ({0} bytes)")]
    TooLarge(usize),
    #[error("undecodable control message")]
    Decode,
    #[error("control stream data beyond the allowed window")]
    Window,
}

/// Outgoing half: messages framed onto a [`StreamSend`] (selective acknowledgement and
/// loss recovery as the tunnel's stream; the window is [`WINDOW`] beyond what the peer
/// acknowledged in order).
#[derive(Debug)]
pub(crate) struct CtrlSend {
    s: StreamSend,
}

impl Default for CtrlSend {
    fn default() -> Self {
        CtrlSend {
            s: StreamSend::with_capacity(WINDOW, usize::MAX),
        }
    }
}

impl CtrlSend {
    pub fn push(&mut self, msg: &Ctrl) {
        let body = postcard::to_allocvec(msg).expect("control messages always serialize");
        let n = self.s.write(&(body.len() as u32).to_be_bytes()) + self.s.write(&body);
        debug_assert_eq!(
            n,
            body.len() + 4,
            "the control stream never refuses a message"
        );
    }

    /// End of the messages queued so far.
    pub fn end(&self) -> u64 {
        self.s.written()
    }

    /// Bytes never sent, or declared lost and not yet sent again.
    pub fn unsent(&self) -> u64 {
        self.s.unsent()
    }

    /// Something not yet sent (or to be sent again), within the window or not.
    pub fn has_unsent(&self) -> bool {
        self.s.unsent() > 0
    }

    /// Something to send now: a retransmission or new bytes within the window.
    pub fn has_sendable(&self) -> bool {
        self.s.has_sendable()
    }

    /// Something sent awaits its acknowledgement, or waits for the window.
    pub fn has_unacked(&self) -> bool {
        self.s.is_outstanding()
    }

    /// Next chunk of at most `max` bytes, sent in packet `pn`, with its offset.
    pub fn next_chunk(&mut self, max: usize, pn: u64) -> Option<(u64, Vec<u8>)> {
        let mut out = vec![0u8; max];
        let c = self.s.next_chunk(max, pn, &mut out)?;
        out.truncate(c.len);
        Some((c.offset, out))
    }

    /// An ACK's `ctrl_offset`: the peer holds every byte below `cum`. `map`: its STREAM_ACK
    /// for this stream from the same packet, or None when it sent none (it then holds
    /// nothing beyond `cum`). `is_lost(pn)`: the connection's rule for overtaken packets.
    /// Returns the chunks declared lost (to be sent again).
    pub fn on_ack(
        &mut self,
        cum: u64,
        map: Option<&StreamAckFrame>,
        is_lost: impl Fn(u64) -> bool,
    ) -> u64 {
        let cum = cum.min(self.end());
        self.s.raise_limit(cum + WINDOW);
        let only_cum;
        let ack = match map {
            Some(m) => m,
            None => {
                only_cum = StreamAckFrame {
                    limit: cum + WINDOW,
                    map: LossMapFrame {
                        xfer: CONTROL_STREAM_ID,
                        cum,
                        top: cum,
                        start: cum,
                        end: cum,
                        gaps: Vec::new(),
                    },
                };
                &only_cum
            }
        };
        self.s.on_ack(ack, is_lost, |_| false).lost_chunks
    }

    /// Probe timeout: a small flight goes out again with the probe; a bigger one waits for
    /// the acknowledgement the probe elicits, which tells what was lost.
    pub fn on_probe_timeout(&mut self) {
        self.s.on_probe_timeout(PTO_RESEND_CHUNKS);
    }

    /// What is sent from `offset` on goes out once more.
    pub fn send_again_from(&mut self, offset: u64) {
        self.s.send_again_from(offset);
    }
}

/// Chunks of a flight sent again at a probe timeout (see [`CtrlSend::on_probe_timeout`]).
const PTO_RESEND_CHUNKS: usize = 16;

/// Incoming half: reassembles chunks ([`StreamRecv`]) and yields whole messages in order.
#[derive(Debug)]
pub(crate) struct CtrlRecv {
    r: StreamRecv,
    /// In-order bytes taken from `r`, not yet a whole message.
    assembled: Vec<u8>,
}

impl Default for CtrlRecv {
    fn default() -> Self {
        CtrlRecv {
            r: StreamRecv::with_id(WINDOW, CONTROL_STREAM_ID),
            assembled: Vec::new(),
        }
    }
}

impl CtrlRecv {
    /// Every byte below this has been received (an ACK's `ctrl_offset`).
    pub fn offset(&self) -> u64 {
        self.r.cum()
    }

    /// Accepts a chunk; returns how many of its bytes were new.
    pub fn on_chunk(&mut self, offset: u64, data: &[u8]) -> Result<u64, CtrlError> {
        let new = self
            .r
            .on_chunk(offset, false, data)
            .map_err(|_| CtrlError::Window)?;
        // Taken at once, so the window is always `WINDOW` beyond the in-order end, as the
        // sender presumes from `ctrl_offset`.
        loop {
            let p = self.r.peek();
            if p.is_empty() {
                break;
            }
            let n = p.len();
            self.assembled.extend_from_slice(p);
            self.r.consume(n);
        }
        Ok(new)
    }

    /// The map of what arrived beyond the in-order end, when anything did (sent with every
    /// ACK then; without it the sender takes `ctrl_offset` to be all there is).
    pub fn sack(&mut self, max_gaps: usize) -> Option<StreamAckFrame> {
        self.r.has_gaps().then(|| self.r.ack(max_gaps))
    }

    /// Only the map up to `end` went out: the next one goes on from there.
    pub fn resume_sack_at(&mut self, end: u64) {
        self.r.resume_ack_at(end);
    }

    /// Next complete message, if any.
    pub fn next_message(&mut self) -> Result<Option<Ctrl>, CtrlError> {
        if self.assembled.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes(self.assembled[..4].try_into().expect("4 bytes")) as usize;
        if len > MAX_MESSAGE {
            return Err(CtrlError::TooLarge(len));
        }
        if self.assembled.len() < 4 + len {
            return Ok(None);
        }
        let msg =
            postcard::from_bytes(&self.assembled[4..4 + len]).map_err(|_| CtrlError::Decode)?;
        self.assembled.drain(..4 + len);
        Ok(Some(msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sender with more queued than the receiver takes stops at the window, carries on as
    /// acknowledgements come, and the receiver never refuses a chunk.
    #[test]
    fn the_sender_stays_within_the_receivers_window() {
        let (mut tx, mut rx) = (CtrlSend::default(), CtrlRecv::default());
        let mut pushed = 0u32;
        while tx.end() < 3 * WINDOW {
            tx.push(&Ctrl::Skip {
                xfer: pushed,
                reason: "x".repeat(100),
            });
            pushed += 1;
        }
        let mut got = 0u32;
        let mut stalls = 0;
        let mut pn = 0;
        while got < pushed {
            let mut sent = 0;
            while let Some((off, data)) = tx.next_chunk(1200, pn) {
                pn += 1;
                rx.on_chunk(off, &data).expect("within the window");
                sent += data.len() as u64;
            }
            if tx.has_unsent() {
                assert!(!tx.has_sendable());
                assert!(tx.unsent() > 0);
                stalls += 1;
            }
            assert!(sent <= WINDOW);
            while let Some(m) = rx.next_message().unwrap() {
                assert!(matches!(m, Ctrl::Skip { xfer, .. } if xfer == got));
                got += 1;
            }
            assert_eq!(tx.on_ack(rx.offset(), None, |_| true), 0);
        }
        assert!(stalls >= 2, "{stalls}");
        assert!(!tx.has_unacked());
    }

    /// A message said twice goes out again with what follows it, not with everything still
    /// unacknowledged before it; never below what the peer acknowledged.
    #[test]
    fn send_again_repeats_only_the_tail() {
        let mut tx = CtrlSend::default();
        tx.push(&Ctrl::Bye);
        tx.push(&Ctrl::Bye);
        let at = tx.end();
        tx.push(&Ctrl::Skip {
            xfer: 3,
            reason: "same".into(),
        });
        let mut pn = 0;
        while tx.next_chunk(4, pn).is_some() {
            pn += 1;
        }
        tx.send_again_from(at);
        let again: Vec<(u64, u64)> = send_all(&mut tx, 1000, &mut pn)
            .into_iter()
            .map(|(o, d)| (o, o + d.len() as u64))
            .collect();
        // From the chunk that holds `at` (chunks of 4) to the end, once.
        assert_eq!(again.first().map(|r| r.0), Some(at / 4 * 4));
        assert_eq!(again.last().map(|r| r.1), Some(tx.end()));
        assert!(again.windows(2).all(|w| w[0].1 == w[1].0));
        tx.on_ack(tx.end() - 1, None, |_| false);
        tx.send_again_from(0);
        let (o, d) = tx.next_chunk(1000, pn).expect("the tail");
        assert_eq!((o, o + d.len() as u64), (tx.end() - 1, tx.end()));
        assert!(tx.next_chunk(1000, pn + 1).is_none());
    }

    /// Chunks that arrived beyond a gap are not sent again: the receiver's map says it holds
    /// them, and only the lost ones are.
    #[test]
    fn only_lost_chunks_are_sent_again() {
        let (mut tx, chunks, mut pn) = msgs_sent();
        let mut rx = CtrlRecv::default();
        for (i, (o, d)) in chunks.iter().enumerate() {
            if i % 3 != 0 {
                rx.on_chunk(*o, d).unwrap();
            }
        }
        assert_eq!(rx.offset(), 0);
        let lost = chunks.len().div_ceil(3) as u64;
        let map = rx.sack(64).expect("gaps");
        assert_eq!(tx.on_ack(rx.offset(), Some(&map), |_| true), lost);
        let resent = send_all(&mut tx, 100, &mut pn);
        assert_eq!(resent.len() as u64, lost);
        for (o, d) in resent {
            assert_eq!(o % 300, 0, "chunk {o} arrived");
            rx.on_chunk(o, &d).unwrap();
        }
        assert!(rx.sack(64).is_none());
        assert_eq!(messages(&mut rx), msgs());
        tx.on_ack(rx.offset(), None, |_| true);
        assert!(!tx.has_unacked());
    }

    /// Every chunk `tx` has to send now, of at most `max` bytes, in packets from `pn` on.
    fn send_all(tx: &mut CtrlSend, max: usize, pn: &mut u64) -> Vec<(u64, Vec<u8>)> {
        let mut chunks = Vec::new();
        while let Some(c) = tx.next_chunk(max, *pn) {
            *pn += 1;
            chunks.push(c);
        }
        chunks
    }

    /// [`msgs`] queued and sent in chunks of 100 bytes: the sender, its chunks and the next
    /// packet number.
    fn msgs_sent() -> (CtrlSend, Vec<(u64, Vec<u8>)>, u64) {
        let mut tx = CtrlSend::default();
        for m in msgs() {
            tx.push(&m);
        }
        let mut pn = 0;
        let chunks = send_all(&mut tx, 100, &mut pn);
        (tx, chunks, pn)
    }

    /// The whole messages `rx` has.
    fn messages(rx: &mut CtrlRecv) -> Vec<Ctrl> {
        let mut got = Vec::new();
        while let Some(m) = rx.next_message().unwrap() {
            got.push(m);
        }
        got
    }

    fn msgs() -> Vec<Ctrl> {
        vec![
            Ctrl::Get {
                xfer: 1,
                path: "a/b.txt".into(),
                flags: flags::UPDATE,
            },
            Ctrl::Offer {
                xfer: 2,
                path: "x".repeat(3000),
                size: 1 << 40,
                mode: 0o644,
                mtime: -5,
                flags: 0,
                hash: Some([3; 32]),
            },
            Ctrl::Meta {
                id: 9,
                op: MetaOp::List {
                    path: "d".into(),
                    recursive: true,
                },
            },
            Ctrl::MetaReply {
                id: 9,
                result: Ok(vec![MetaEntry {
                    path: "l".into(),
                    kind: EntryKind::Symlink,
                    size: 0,
                    mode: 0o777,
                    mtime: 1,
                    target: "../x".into(),
                }]),
                more: false,
            },
            Ctrl::Ready {
                xfer: 2,
                have: vec![(0, 10), (20, 30)],
                parts: vec![BlockSpan {
                    block: 10,
                    from: 96,
                    to: 4192,
                }],
                path: None,
            },
            Ctrl::Ready {
                xfer: 3,
                have: Vec::new(),
                parts: Vec::new(),
                path: Some("d/f".into()),
            },
            Ctrl::Compared {
                xfer: 4,
                upto: 5000,
                have: vec![(0, 4000), (4001, 5000)],
                parts: vec![BlockSpan {
                    block: 4000,
                    from: 0,
                    to: 4096,
                }],
            },
            Ctrl::Sent {
                xfer: 2,
                blake3: [7; 32],
            },
            Ctrl::Bye,
        ]
    }

    #[test]
    fn stream_survives_loss_reorder_and_duplication() {
        let (mut tx, chunks, mut pn) = msgs_sent();
        // Deliver in reverse, with every third chunk "lost" the first time round.
        let mut rx = CtrlRecv::default();
        for (i, (o, d)) in chunks.iter().enumerate().rev() {
            if i % 3 != 0 {
                rx.on_chunk(*o, d).unwrap();
                rx.on_chunk(*o, d).unwrap();
            }
        }
        // Chunk 0 was lost, so nothing can be assembled yet.
        assert_eq!(rx.next_message().unwrap(), None);
        assert_eq!(rx.offset(), 0);
        // A probe timeout with no word from the receiver: everything goes again.
        tx.on_ack(rx.offset(), None, |_| false);
        tx.send_again_from(0);
        for (o, d) in send_all(&mut tx, 77, &mut pn) {
            rx.on_chunk(o, &d).unwrap();
        }
        assert_eq!(messages(&mut rx), msgs());
        tx.on_ack(rx.offset(), None, |_| false);
        assert!(!tx.has_unacked());
    }

    #[test]
    fn garbage_and_oversize_are_errors_not_panics() {
        let mut rx = CtrlRecv::default();
        rx.on_chunk(0, &[0, 0, 0, 2, 0xff, 0xff]).unwrap();
        assert_eq!(rx.next_message(), Err(CtrlError::Decode));
        let mut rx = CtrlRecv::default();
        rx.on_chunk(0, &[0xff, 0, 0, 0]).unwrap();
        assert!(matches!(rx.next_message(), Err(CtrlError::TooLarge(_))));
        let mut rx = CtrlRecv::default();
        assert_eq!(
            rx.on_chunk(u64::MAX - 1, &[1, 2, 3]),
            Err(CtrlError::Window)
        );
    }

    /// `MetaOp::Remove` (version 8) is tag 5 of `MetaOp`, after the five before it, and comes
    /// through the stream intact.
    #[test]
    fn remove_is_the_sixth_meta_op() {
        let m = Ctrl::Meta {
            id: 3,
            op: MetaOp::Remove {
                top: "t".into(),
                path: "a/b".into(),
                dir: true,
            },
        };
        let body = postcard::to_allocvec(&m).unwrap();
        assert_eq!(body[..3], [10, 3, 5]);
        let mut tx = CtrlSend::default();
        tx.push(&m);
        let (off, data) = tx.next_chunk(1000, 0).unwrap();
        let mut rx = CtrlRecv::default();
        rx.on_chunk(off, &data).unwrap();
        assert_eq!(rx.next_message().unwrap(), Some(m));
    }
}
