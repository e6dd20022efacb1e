//! The file transfers of a session, both ways: the table of outgoing and incoming files,
//! what the application asks for (send, request, offer, accept, reject, verdicts), DATA and
//! LOSSMAP frames, and the sender's whole-file hash.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::cc::Feedback;
use crate::control::{flags, BlockSpan, Ctrl};
use crate::transfer::{DataVerdict, Incoming, Layout, Outgoing, XferId};
use crate::wire::{self, Writer};

use super::{BlockSink, BlockSource, Connection, Event, StorageError};

/// What an `Offer` says about a file.
#[derive(Debug, Clone, Copy)]
pub struct FileOffer<'a> {
    /// Path the file goes to, as the sender names it.
    pub path: &'a str,
    /// Size in bytes.
    pub size: u64,
    /// Unix permission bits.
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// [`crate::control::flags`].
    pub flags: u32,
    /// The whole file's BLAKE3, when known up front.
    pub hash: Option<[u8; 32]>,
}

impl<'a> FileOffer<'a> {
    /// An offer of a file with no flags and no hash.
    pub fn plain(path: &'a str, size: u64, mode: u32, mtime: i64) -> Self {
        Self {
            path,
            size,
            mode,
            mtime,
            flags: 0,
            hash: None,
        }
    }
}

/// A sender sends at most this much of its offered files before the receiver's `Ready`
/// (saving the round trip of waiting for it), and a receiver keeps up to twice as much
/// until it has accepted the files: what does not fit is sent again.
pub(super) const EAGER_BYTES: u64 = 2 << 20;

pub(super) const STASH_BYTES: usize = 2 * EAGER_BYTES as usize;

/// Most incoming files one session may have open at once (`hayate cp` keeps 64 active; a
/// peer may pipeline more, up to this), and most blocks they may hold together: each block
/// costs a bit of loss map, so this caps a hostile peer's offers at 512 MiB of state (6 TB
/// of file at 1500-byte packets) and a few MB of bookkeeping.
pub const MAX_OPEN_INCOMING: usize = 16384;

/// Most blocks the incoming files of one session may hold together (see
/// [`MAX_OPEN_INCOMING`]).
pub const MAX_INCOMING_BLOCKS: u64 = 1 << 32;

/// The file transfers of this session, both ways.
pub(super) struct Transfers {
    pub(super) outgoing: BTreeMap<XferId, Outgoing>,
    pub(super) incoming: BTreeMap<XferId, Incoming>,
    /// Downloads asked for and not yet offered.
    pub(super) pending_gets: BTreeMap<XferId, String>,
    /// The incoming transfer whose loss map goes first in the next ACK.
    pub(super) map_rotation: XferId,
    pub(super) next_xfer: XferId,
    /// In-flight bytes of finished outgoing transfers, settled by [`Connection::retire`].
    pub(super) retired_in_flight: u64,
    /// Some incoming file holds blocks that came before it was accepted.
    pub(super) stash_pending: bool,
    /// Some transfer may need its hash finished or `Sent` announced without sending data.
    pub(super) hash_work: bool,
    /// The last attempt to send file data found its bytes not read yet
    /// ([`StorageError::NotReady`]): no deadline for data until the next attempt.
    pub(super) source_blocked: bool,
    /// The driver hashes what this side sends (off the protocol loop) and hands each file's
    /// hash in with [`Connection::set_source_hash`]; the connection reads no block only to
    /// hash it. Off: the connection hashes blocks as it sends them (the simulator).
    pub(super) external_hash: bool,
}

pub(super) fn too_large(path: &str, size: u64) -> String {
    format!(
        "{path}: {size} bytes is more than the protocol can number ({} blocks)",
        wire::BLOCK_LIMIT
    )
}

impl Connection {
    /// Client: upload a file to `path` on the server. Returns its transfer id.
    pub fn send_file(&mut self, path: &str, size: u64, mode: u32, mtime: i64) -> XferId {
        self.send_file_ext(&FileOffer::plain(path, size, mode, mtime))
    }

    /// [`send_file`](Self::send_file) with flags and the source's hash when known.
    pub fn send_file_ext(&mut self, f: &FileOffer<'_>) -> XferId {
        let xfer = self.alloc_xfer();
        self.start_outgoing(xfer, f);
        xfer
    }

    /// Client: download `path` from the server.
    pub fn request(&mut self, path: &str) -> XferId {
        self.request_ext(path, 0)
    }

    /// [`request`](Self::request) with [`flags`] (`UPDATE` asks for the hash up front).
    pub fn request_ext(&mut self, path: &str, flags: u32) -> XferId {
        let xfer = self.alloc_xfer();
        self.xfers.pending_gets.insert(xfer, path.to_string());
        // A download starts when this arrives (see `offer`).
        self.say_twice(&Ctrl::Get {
            xfer,
            path: path.to_string(),
            flags,
        });
        xfer
    }

    /// Server: answer a `GetRequested` by sending the file.
    pub fn offer(&mut self, xfer: XferId, path: &str, size: u64, mode: u32, mtime: i64) {
        self.start_outgoing(xfer, &FileOffer::plain(path, size, mode, mtime));
    }

    /// [`offer`](Self::offer) echoing the request's flags, with the hash when asked for.
    pub fn offer_ext(&mut self, xfer: XferId, f: &FileOffer<'_>) {
        self.start_outgoing(xfer, f);
    }

    /// Decline an `Offered` file without error (already there, or identical).
    pub fn skip(&mut self, xfer: XferId, reason: &str) {
        if self.xfers.incoming.remove(&xfer).is_some() {
            self.ctrl.tx.push(&Ctrl::Skip {
                xfer,
                reason: reason.to_string(),
            });
        }
    }

    /// Blocks of an outgoing file the receiver already had (resume), in bytes.
    pub fn outgoing_skipped_bytes(&self, xfer: XferId) -> Option<u64> {
        self.xfers.outgoing.get(&xfer).map(|o| o.bytes_had)
    }

    /// Accept an `Offered` file; `have` lists block ranges already present (resume).
    pub fn accept(&mut self, xfer: XferId, have: &[(u64, u64)]) {
        self.accept_with(xfer, have, &[], None);
    }

    /// [`accept`](Self::accept), telling the sender where the file goes (the answer to an
    /// [`flags::INTO_DIR`] offer).
    pub fn accept_at(&mut self, xfer: XferId, have: &[(u64, u64)], path: Option<&str>) {
        self.accept_with(xfer, have, &[], path);
    }

    /// [`accept_at`](Self::accept_at), with blocks held in part (a delta): of each of
    /// `spans`, only its bytes are sent, and written.
    pub fn accept_with(
        &mut self,
        xfer: XferId,
        have: &[(u64, u64)],
        spans: &[BlockSpan],
        path: Option<&str>,
    ) {
        if let Some(inc) = self.xfers.incoming.get_mut(&xfer) {
            inc.accepted = true;
            // After `Compared` messages (a delta's comparison), only what lies beyond them:
            // the blocks below were answered there, and some may have arrived since.
            let from = inc.horizon;
            let (have, parts) = inc.mark_held(have, spans, u64::MAX);
            if let Some(p) = path {
                inc.path = p.to_string();
            }
            let have = if from > 0 { have } else { inc.have_ranges() };
            // The sender stops at its eager limit until this comes (see `offer`).
            self.say_twice(&Ctrl::Ready {
                xfer,
                have,
                parts,
                path: path.map(str::to_string),
            });
            self.check_incoming_complete(xfer);
        }
    }

    /// Refuse an offer or a get (or abort an incoming transfer).
    pub fn reject(&mut self, xfer: XferId, reason: &str) {
        self.xfers.incoming.remove(&xfer);
        self.retire(xfer);
        self.ctrl.tx.push(&Ctrl::Reject {
            xfer,
            reason: reason.to_string(),
        });
    }

    /// Report the verdict on a completed incoming file: Ok(hash) once it is verified and in
    /// place under its final name, Err(reason) otherwise.
    pub fn finish_incoming(&mut self, xfer: XferId, result: Result<[u8; 32], String>) {
        if self.xfers.incoming.remove(&xfer).is_none() {
            return;
        }
        // The sender waits on this verdict alone: lost, it would wait for a probe timeout
        // (the simulator, 1 Gbit/s, 250 ms, 1 % loss: one of three runs ended 1.6 s late,
        // about 1 % of them would). Say it twice.
        self.say_twice(&match result {
            Ok(blake3) => Ctrl::Verified { xfer, blake3 },
            Err(reason) => Ctrl::Failed { xfer, reason },
        });
    }

    /// Transfers still open, for a message when a session dies.
    pub fn open_transfers(&self) -> Vec<(XferId, String)> {
        let mut v: Vec<_> = self
            .xfers
            .outgoing
            .values()
            .map(|o| (o.id, o.path.clone()))
            .chain(self.xfers.incoming.values().map(|i| (i.id, i.path.clone())))
            .chain(self.xfers.pending_gets.iter().map(|(x, p)| (*x, p.clone())))
            .collect();
        v.sort();
        v
    }

    /// Progress of an incoming transfer: (blocks received, blocks in all).
    pub fn incoming_progress(&self, xfer: XferId) -> Option<(u64, u64)> {
        self.xfers
            .incoming
            .get(&xfer)
            .map(|i| (i.received_blocks(), i.layout.blocks()))
    }

    /// Missing block ranges of an incoming transfer (for "what is missing" reports).
    pub fn incoming_missing(&self, xfer: XferId) -> Option<Vec<(u64, u64)>> {
        self.xfers.incoming.get(&xfer).map(|i| i.missing_ranges())
    }

    /// Bytes of our outgoing files the peer has acknowledged.
    pub fn outgoing_acked_bytes(&self, xfer: XferId) -> Option<u64> {
        self.xfers.outgoing.get(&xfer).map(|o| o.bytes_acked)
    }

    pub(super) fn alloc_xfer(&mut self) -> XferId {
        let x = self.xfers.next_xfer;
        self.xfers.next_xfer += 1;
        x
    }

    pub(super) fn start_outgoing(&mut self, xfer: XferId, f: &FileOffer<'_>) {
        let layout = Layout::new(f.size, self.path.block_size);
        if layout.blocks() > wire::BLOCK_LIMIT {
            self.fail_outgoing(xfer, too_large(f.path, f.size));
            return;
        }
        let mut o = Outgoing::new(xfer, f.path.to_string(), layout);
        // Not when the receiver may well answer with a skip: what went out would be wasted.
        o.eager = f.flags & (flags::NO_CLOBBER | flags::UPDATE) == 0;
        o.finish_empty_hash();
        self.xfers.outgoing.insert(xfer, o);
        // A file's start waits on this and on the `Ready` that answers it: either lost, the
        // sender stops at its eager limit until a probe timeout (the simulator, 1 Gbit/s,
        // 250 ms, 3 % loss: 2 of 12 runs; startup then read the stop as the path's rate, left
        // at 20 Mbit/s and took 5 s more to grow). Said twice, like the verdicts.
        self.say_twice(&Ctrl::Offer {
            xfer,
            path: f.path.to_string(),
            size: f.size,
            mode: f.mode,
            mtime: f.mtime,
            flags: f.flags,
            hash: f.hash,
        });
    }

    /// Ends an outgoing transfer. Its last blocks are often proven delivered by `Verified`
    /// rather than by a loss map: without settling them here they would count as in flight
    /// forever, and after a few hundred small files the in-flight cap would stall the session.
    pub(super) fn retire(&mut self, xfer: XferId) -> Option<Outgoing> {
        let o = self.xfers.outgoing.remove(&xfer)?;
        self.xfers.retired_in_flight += o.sent_bytes.saturating_sub(o.settled_bytes);
        Some(o)
    }

    pub(super) fn on_loss_map(&mut self, lm: &wire::LossMapFrame, fb: &mut Feedback) {
        let Some(largest) = self.space.largest_acked else {
            return;
        };
        let is_lost = self.space.loss_rule(self.path.rtt.srtt());
        let caught_up = self.space.caught_up();
        // Before its Ready (which may travel behind the first loss map in the same packet)
        // a map can only show resumed blocks: those are credited by Ready, not counted as
        // deliveries (they would inflate the delivery rate).
        let Some(o) = self
            .xfers
            .outgoing
            .get_mut(&lm.xfer)
            .filter(|o| o.flowing())
        else {
            return;
        };
        let out = o.on_loss_map(lm, largest, is_lost, caught_up);
        let srtt = self.path.rtt.srtt();
        if out.spurious_blocks > 0 {
            self.space.reordering.on_spurious(fb.now_us, srtt);
        } else {
            self.space.reordering.on_quiet(fb.now_us, srtt);
        }
        self.stats.blocks_lost_spuriously += out.spurious_blocks;
        o.settled_bytes += out.newly_acked_bytes + out.lost_bytes;
        fb.delivered += out.newly_acked_bytes;
        fb.lost_blocks += out.lost_blocks;
        fb.lost_bytes += out.lost_bytes;
        fb.catch_up_delivered += out.tagged_acked_bytes;
        fb.catch_up_lost_bytes += out.tagged_lost_bytes;
        self.stats.data_bytes_acked += out.newly_acked_bytes;
        self.stats.blocks_declared_lost += out.lost_blocks;
        self.stats.data_bytes_lost += out.lost_bytes;
        self.check_outgoing_done(lm.xfer);
    }

    pub(super) fn on_data(
        &mut self,
        now: Instant,
        rx_at_us: u64,
        xfer: XferId,
        block: u64,
        payload: &[u8],
        sink: &mut dyn BlockSink,
    ) {
        self.stats.data_packets_received += 1;
        let Some(inc) = self.xfers.incoming.get_mut(&xfer) else {
            // Data for a transfer that already finished (a late retransmission) or never was.
            self.stats.duplicate_blocks_received += 1;
            return;
        };
        let verdict = inc.check(block, payload.len());
        if verdict == DataVerdict::Invalid {
            self.stats.dropped_malformed += 1;
            return;
        }
        if !inc.takes(block) {
            // Sent with the offer: kept until it is accepted (or, a delta, compared),
            // within `STASH_BYTES`.
            if verdict == DataVerdict::New && !inc.stash.contains_key(&block) {
                let stashed: usize = self.xfers.incoming.values().map(|i| i.stash_bytes).sum();
                if stashed + payload.len() <= STASH_BYTES {
                    let inc = self.xfers.incoming.get_mut(&xfer).expect("looked up");
                    inc.stash.insert(block, payload.to_vec());
                    inc.stash_bytes += payload.len();
                    self.xfers.stash_pending = true;
                    // Delivered now, as far as the sender's rate is concerned.
                    self.space.rx_bytes += payload.len() as u64;
                    self.space.rx_bytes_at_us = self.space.rx_bytes_at_us.max(rx_at_us);
                }
            } else {
                self.stats.duplicate_blocks_received += 1;
            }
            return;
        }
        if verdict == DataVerdict::Duplicate {
            self.stats.duplicate_blocks_received += 1;
            return;
        }
        if !sink.ready(xfer) {
            self.stats.blocks_refused_by_sink += 1;
            return;
        }
        if self.write_block(xfer, block, payload, sink) {
            self.space.rx_bytes += payload.len() as u64;
            self.space.rx_bytes_at_us = self.space.rx_bytes_at_us.max(rx_at_us);
        }
        let _ = now;
    }

    /// Writes a new block of an accepted file; false if the write failed (the transfer is
    /// then failed and the sender told).
    pub(super) fn write_block(
        &mut self,
        xfer: XferId,
        block: u64,
        payload: &[u8],
        sink: &mut dyn BlockSink,
    ) -> bool {
        let Some(inc) = self.xfers.incoming.get_mut(&xfer) else {
            return false;
        };
        let (offset, bytes) = inc.placement(block, payload);
        match sink.write(xfer, offset, bytes) {
            Ok(()) => {
                inc.on_written(block, bytes.len());
                self.stats.data_bytes_received += bytes.len() as u64;
                self.check_incoming_complete(xfer);
                true
            }
            Err(e) => {
                let reason = format!("cannot write {}: {e}", inc.path);
                self.xfers.incoming.remove(&xfer);
                self.ctrl.tx.push(&Ctrl::Failed {
                    xfer,
                    reason: reason.clone(),
                });
                self.events
                    .push_back(Event::IncomingFailed { xfer, reason });
                false
            }
        }
    }

    /// Writes the blocks that came before their files were accepted, for those accepted since.
    pub(super) fn flush_stashes(&mut self, sink: &mut dyn BlockSink) {
        let ids: Vec<XferId> = self
            .xfers
            .incoming
            .iter()
            .filter(|(_, i)| i.stash.keys().next().is_some_and(|&b| i.takes(b)))
            .map(|(x, _)| *x)
            .collect();
        for xfer in ids {
            let Some(inc) = self.xfers.incoming.get_mut(&xfer) else {
                continue;
            };
            // Of a delta still comparing, the blocks beyond what it compared stay.
            let rest = if inc.accepted {
                BTreeMap::new()
            } else {
                inc.stash.split_off(&inc.horizon)
            };
            let stash = std::mem::replace(&mut inc.stash, rest);
            inc.stash_bytes = inc.stash.values().map(Vec::len).sum();
            for (block, data) in stash {
                let fresh = self
                    .xfers
                    .incoming
                    .get(&xfer)
                    .is_some_and(|i| i.check(block, data.len()) == DataVerdict::New);
                if !fresh {
                    // The receiver had it already (resume), or the transfer failed.
                    self.stats.duplicate_blocks_received += 1;
                    continue;
                }
                if !self.write_block(xfer, block, &data, sink) {
                    break;
                }
            }
        }
        self.xfers.stash_pending = self.xfers.incoming.values().any(|i| !i.stash.is_empty());
    }

    pub(super) fn check_incoming_complete(&mut self, xfer: XferId) {
        if let Some(inc) = self.xfers.incoming.get_mut(&xfer) {
            if inc.accepted && !inc.completed && inc.all_received() {
                if let Some(h) = inc.expected_hash {
                    inc.completed = true;
                    self.events
                        .push_back(Event::IncomingComplete { xfer, blake3: h });
                    // Tell the sender at once that everything is here.
                    self.space.ack_now = true;
                }
            }
        }
    }

    pub(super) fn check_outgoing_done(&mut self, _xfer: XferId) {
        // Completion is decided by the receiver's Verified/Failed; nothing to do on acks.
    }

    pub(super) fn has_data_to_send(&self) -> bool {
        let mut room = None;
        self.ctrl_bulk()
            || !self.window_full()
                && (self.stream_sendable()
                    || self.xfers.outgoing.values().any(|o| {
                        (o.flowing() && o.has_retx())
                            || ((o.flowing()
                                || (o.eager && *room.get_or_insert_with(|| self.eager_room())))
                                && o.peek_new().is_some())
                    }))
    }

    /// Offered files not yet answered may take more data: under `EAGER_BYTES` went out so far.
    pub(super) fn eager_room(&self) -> bool {
        let sent: u64 = self
            .xfers
            .outgoing
            .values()
            .filter(|o| !o.flowing())
            .map(|o| o.sent_bytes)
            .sum();
        sent < EAGER_BYTES
    }

    pub(super) fn write_loss_maps(&mut self, w: &mut Writer<'_>) {
        let ids: Vec<XferId> = self
            .xfers
            .incoming
            .range(self.xfers.map_rotation..)
            .chain(self.xfers.incoming.range(..self.xfers.map_rotation))
            .filter(|(_, i)| i.taking())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            // Room for the fixed fields (at most 6 varints of 8 bytes + type) and some gaps.
            if w.remaining() < 64 {
                self.xfers.map_rotation = id;
                return;
            }
            let inc = self.xfers.incoming.get_mut(&id).expect("listed");
            let max_gaps = (w.remaining() - 50) / 6;
            let lm = inc.loss_map(max_gaps);
            if lm.encode_fitting(w).is_err() {
                self.xfers.map_rotation = id;
                return;
            }
        }
        self.xfers.map_rotation = 0;
    }

    pub(super) fn maybe_announce(&mut self, xfer: XferId) {
        let src_hash = match self.xfers.outgoing.get_mut(&xfer) {
            // Not before `Ready`: a delta's sender may have sent all it was answered so
            // far, and its hash be known, long before.
            Some(o) if o.ready && !o.sent_announced && o.peek_new().is_none() => {
                if o.hash.is_none() {
                    // Trailing blocks the receiver already had: hashed on the next poll, or
                    // by the driver, which says so with `set_source_hash`.
                    self.xfers.hash_work |= !self.xfers.external_hash;
                    return;
                }
                o.sent_announced = true;
                o.hash
            }
            _ => return,
        };
        if let Some(blake3) = src_hash {
            // The receiver cannot verify without it: twice, like its verdict.
            self.say_twice(&Ctrl::Sent { xfer, blake3 });
        }
    }

    pub(super) fn fail_outgoing(&mut self, xfer: XferId, reason: String) {
        self.retire(xfer);
        self.ctrl.tx.push(&Ctrl::Reject {
            xfer,
            reason: reason.clone(),
        });
        self.events.push_back(Event::OutgoingDone {
            xfer,
            result: Err(reason),
        });
    }

    /// Hash blocks nobody will send (resume) and announce `Sent` for transfers whose data
    /// is all out. Called from `poll_transmit` paths that don't send data.
    pub fn finish_hashes(&mut self, src: &mut dyn BlockSource) {
        let ids: Vec<XferId> = self
            .xfers
            .outgoing
            .values()
            .filter(|o| o.ready && !o.sent_announced && o.peek_new().is_none())
            .filter(|o| !self.xfers.external_hash || o.hash.is_some())
            .map(|o| o.id)
            .collect();
        for xfer in ids {
            if self.xfers.external_hash {
                self.maybe_announce(xfer);
                continue;
            }
            let mut scratch = std::mem::take(&mut self.scratch);
            let o = self.xfers.outgoing.get_mut(&xfer).expect("listed");
            let n = o.layout.blocks();
            let mut failed = None;
            while o.hash_next < n {
                let b = o.hash_next;
                scratch.resize(o.layout.len(b), 0);
                match src.read(xfer, o.layout.offset(b), &mut scratch) {
                    Ok(()) => {}
                    Err(StorageError::NotReady) => {
                        // Not read yet: hashed on a later call.
                        self.xfers.hash_work = true;
                        break;
                    }
                    Err(e) => {
                        failed = Some(format!("cannot read {}: {e}", o.path));
                        break;
                    }
                }
                o.hash_block(b, &scratch);
            }
            self.scratch = scratch;
            match failed {
                Some(reason) => self.fail_outgoing(xfer, reason),
                None if self.xfers.hash_work => break,
                None => self.maybe_announce(xfer),
            }
        }
    }

    /// From now on the driver supplies every outgoing file's BLAKE3 (see
    /// [`set_source_hash`](Self::set_source_hash)) instead of the connection hashing blocks as
    /// it sends them: the per-byte work leaves the protocol loop, and a resumed send never
    /// reads the blocks the receiver already has just to hash them.
    pub fn hash_sources_outside(&mut self) {
        self.xfers.external_hash = true;
    }

    /// Outgoing transfers whose every new block has gone out and whose hash is still
    /// missing: the driver should finish hashing them (see
    /// [`hash_sources_outside`](Self::hash_sources_outside)).
    pub fn sources_awaiting_hash(&self) -> Vec<XferId> {
        self.xfers
            .outgoing
            .values()
            .filter(|o| o.ready && o.hash.is_none() && o.peek_new().is_none())
            .map(|o| o.id)
            .collect()
    }

    /// The BLAKE3 of an outgoing file, computed by the driver; announced to the receiver once
    /// its last new block has gone out.
    pub fn set_source_hash(&mut self, xfer: XferId, hash: [u8; 32]) {
        if let Some(o) = self.xfers.outgoing.get_mut(&xfer) {
            o.hash = Some(hash);
            self.maybe_announce(xfer);
        }
    }

    /// An outgoing file could not be read or changed while being sent: the transfer fails
    /// with `reason`, the receiver is told.
    pub fn fail_source(&mut self, xfer: XferId, reason: &str) {
        if self.xfers.outgoing.contains_key(&xfer) {
            self.fail_outgoing(xfer, reason.to_string());
        }
    }
}
