//! Per-file state on each side of a transfer: what the sender knows is delivered, lost or in
//! flight, and what the receiver holds (its loss map).

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::bitset::Bitset;
use crate::control::BlockSpan;
use crate::wire::LossMapFrame;

/// A transfer's id: chosen by the client, unique within a session; DATA frames, loss maps
/// and control messages name their transfer by it.
pub type XferId = u32;

/// Packet-count reordering threshold: a block is lost once 16 later packets have arrived.
pub(crate) const REORDER_PACKETS: u64 = 16;

/// Marks in the sender's per-block "last packet number" window.
const UNSENT: u64 = u64::MAX;
const QUEUED: u64 = u64::MAX - 1;

/// Blocks of a transfer: sizes and offsets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub size: u64,
    pub block_size: u64,
}

impl Layout {
    pub fn new(size: u64, block_size: usize) -> Self {
        Layout {
            size,
            block_size: block_size as u64,
        }
    }

    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(self.block_size)
    }

    pub fn offset(&self, block: u64) -> u64 {
        block * self.block_size
    }

    pub fn len(&self, block: u64) -> usize {
        (self.size - self.offset(block)).min(self.block_size) as usize
    }
}

/// Sender-side state of one file.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub id: XferId,
    pub path: String,
    pub layout: Layout,
    /// The receiver said Ready: data may flow.
    pub ready: bool,
    /// Its first blocks may go with the offer, before `Ready` (a skip is unlikely).
    pub eager: bool,
    acked: Bitset,
    /// Lowest block not yet acknowledged.
    cum: u64,
    /// Next block never sent.
    pub next_new: u64,
    /// `last_pn[i]` = packet that last carried block `base + i` (or a mark).
    base: u64,
    last_pn: VecDeque<u64>,
    retx: VecDeque<u64>,
    /// Blocks to send once more after `retx`: see [`Outgoing::send_again`].
    again: VecDeque<u64>,
    /// Blocks whose last copy was a second one (`again`): acknowledged while it is on its
    /// way, the first copy arrived, and no loss was declared wrongly.
    copies: std::collections::HashSet<u64>,
    /// BLAKE3 over blocks in order; `hash_next` is the next block it needs.
    hasher: blake3::Hasher,
    /// Blocks are hashed in batches: BLAKE3 only uses its wide SIMD path on long inputs,
    /// and one 1.4 KB block at a time cost more CPU than encryption.
    hash_buf: Vec<u8>,
    pub hash_next: u64,
    pub hash: Option<[u8; 32]>,
    /// `Sent` has been queued on the control stream.
    pub sent_announced: bool,
    pub bytes_acked: u64,
    /// Bytes the receiver already had before we sent anything (resume).
    pub bytes_had: u64,
    /// Data bytes sent, and of those settled by loss maps (acknowledged or declared lost):
    /// what is left when the transfer ends was delivered without a map saying so.
    pub sent_bytes: u64,
    pub settled_bytes: u64,
    /// The receiver asked for leaf hashes (`WantSums`) and the driver has not started them.
    pub sums_wanted: bool,
    /// What the receiver compares them with ([`crate::control::basis`]), once it asked.
    pub basis: Option<u8>,
    /// Blocks the receiver holds in part (`Ready`'s `parts`): the bytes of each still to send.
    spans: HashMap<u64, (u32, u32)>,
    /// A delta's receiver has compared the leaves of the blocks below this (`Compared`):
    /// they may go before its `Ready`.
    pub upto: u64,
}

/// Result of applying a loss map.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct MapOutcome {
    pub newly_acked_bytes: u64,
    pub lost_blocks: u64,
    pub lost_bytes: u64,
    /// Of those bytes, the ones whose last packet was tagged (see [`Outgoing::on_loss_map`]).
    pub tagged_acked_bytes: u64,
    pub tagged_lost_bytes: u64,
    /// Blocks acknowledged whose loss had been declared wrongly: an earlier transmission
    /// arrived after all (the path reorders more than the loss rule allowed).
    pub spurious_blocks: u64,
}

impl Outgoing {
    pub fn new(id: XferId, path: String, layout: Layout) -> Self {
        Outgoing {
            id,
            path,
            layout,
            ready: false,
            eager: false,
            acked: Bitset::new(layout.blocks()),
            cum: 0,
            next_new: 0,
            base: 0,
            last_pn: VecDeque::new(),
            retx: VecDeque::new(),
            again: VecDeque::new(),
            copies: Default::default(),
            hasher: blake3::Hasher::new(),
            hash_buf: Vec::new(),
            hash_next: 0,
            hash: None,
            sent_announced: false,
            bytes_acked: 0,
            bytes_had: 0,
            sent_bytes: 0,
            settled_bytes: 0,
            sums_wanted: false,
            basis: None,
            spans: HashMap::new(),
            upto: 0,
        }
    }

    /// Data flows: the receiver accepted the file, or has compared some of it (a delta).
    pub fn flowing(&self) -> bool {
        self.ready || self.upto > 0
    }

    /// Blocks below this may go now: all of them, but for a delta's receiver still
    /// comparing (those it has compared).
    fn limit(&self) -> u64 {
        if self.ready || self.basis.is_none() {
            self.layout.blocks()
        } else {
            self.upto
        }
    }

    /// The receiver compared the blocks below `upto` (`Compared`): of those it holds `have`
    /// and `spans`, the rest may go. Returns the bytes of `have` that had gone already (see
    /// [`mark_have`](Self::mark_have)). Ignored once it said `Ready`, or for an `upto` not
    /// beyond the last.
    pub fn on_compared(&mut self, upto: u64, have: &[(u64, u64)], spans: &[BlockSpan]) -> u64 {
        let upto = upto.min(self.layout.blocks());
        if self.ready || self.basis.is_none() || upto <= self.upto {
            return 0;
        }
        self.upto = upto;
        let settled = self.mark_have(have);
        self.mark_spans(spans);
        settled
    }

    /// The receiver holds these blocks in part (a delta): only each span's bytes are sent.
    /// Their other bytes count as had. Spans that do not fit their block are ignored (the
    /// block goes whole).
    pub fn mark_spans(&mut self, spans: &[BlockSpan]) {
        for sp in spans {
            let b = sp.block;
            if b >= self.layout.blocks() || self.acked.get(b) || self.spans.contains_key(&b) {
                continue;
            }
            let len = self.layout.len(b);
            if sp.is_empty() || sp.to as usize > len {
                continue;
            }
            self.bytes_had += (len - sp.len()) as u64;
            self.spans.insert(b, (sp.from, sp.to));
        }
    }

    /// The bytes of `block` that go in its DATA frame: `(offset in the block, length)`.
    pub fn span(&self, block: u64) -> (usize, usize) {
        match self.spans.get(&block) {
            Some(&(from, to)) => (from as usize, (to - from) as usize),
            None => (0, self.layout.len(block)),
        }
    }

    /// The receiver already holds these block ranges (resume, delta): never send them.
    /// Returns the bytes of those that were sent already (with the offer, before `Ready`):
    /// settled now, as no loss map will ever acknowledge them.
    pub fn mark_have(&mut self, have: &[(u64, u64)]) -> u64 {
        let mut settled = 0;
        for &(a, b) in have {
            let b = b.min(self.layout.blocks());
            if a < b {
                for blk in a..b {
                    if !self.acked.get(blk) {
                        let len = self.layout.len(blk) as u64;
                        self.bytes_acked += len;
                        self.bytes_had += len;
                        if blk < self.next_new {
                            settled += len;
                        }
                    }
                }
                self.acked.set_range(a, b);
            }
        }
        self.settled_bytes += settled;
        self.advance();
        settled
    }

    pub fn all_acked(&self) -> bool {
        self.acked.is_full()
    }

    pub fn has_retx(&self) -> bool {
        !self.retx.is_empty() || !self.again.is_empty()
    }

    /// Next block that has never been sent, skipping blocks the receiver already has.
    pub fn peek_new(&self) -> Option<u64> {
        let b = self.acked.next_zero(self.next_new);
        (b < self.limit()).then_some(b)
    }

    /// Next block to retransmit (dropping entries acknowledged meanwhile), and whether it
    /// is a second copy (see [`Outgoing::send_again`]).
    pub fn pop_retx(&mut self) -> Option<(u64, bool)> {
        while let Some(b) = self.retx.pop_front() {
            if !self.acked.get(b) {
                return Some((b, false));
            }
        }
        while let Some(b) = self.again.pop_front() {
            if !self.acked.get(b) {
                return Some((b, true));
            }
        }
        None
    }

    /// Puts back a retransmission [`pop_retx`](Self::pop_retx) gave (`second`: from the
    /// second copies), first in line: its bytes could not be read yet.
    pub fn unpop_retx(&mut self, block: u64, second: bool) {
        if second {
            self.again.push_front(block);
        } else {
            self.retx.push_front(block);
        }
    }

    /// Retransmitted `block` goes once more, after the other retransmissions: with nothing
    /// new left to send, a retransmission that is lost too costs the whole job a round trip
    /// (the loss map that says so comes a round trip after it), where a second copy costs
    /// one datagram (1 % loss: some 200 blocks of the last round trip at 1 Gbit/s, 250 ms).
    pub fn send_again(&mut self, block: u64) {
        self.again.push_back(block);
    }

    /// Feed block data to the whole-file hash; blocks must come in order.
    pub fn hash_block(&mut self, block: u64, data: &[u8]) {
        const BATCH: usize = 256 * 1024;
        debug_assert_eq!(block, self.hash_next);
        if self.hash_buf.capacity() == 0 {
            self.hash_buf
                .reserve_exact(BATCH + self.layout.block_size as usize);
        }
        self.hash_buf.extend_from_slice(data);
        self.hash_next += 1;
        let last = self.hash_next == self.layout.blocks();
        if self.hash_buf.len() >= BATCH || last {
            self.hasher.update(&self.hash_buf);
            self.hash_buf.clear();
        }
        if last {
            self.hash = Some(*self.hasher.finalize().as_bytes());
            self.hash_buf = Vec::new();
        }
    }

    /// A file with no blocks hashes to the empty hash at once.
    pub fn finish_empty_hash(&mut self) {
        if self.layout.blocks() == 0 && self.hash.is_none() {
            self.hash = Some(*self.hasher.finalize().as_bytes());
        }
    }

    /// Record that `block` went out in packet `pn`.
    pub fn on_sent(&mut self, block: u64, pn: u64) {
        if !self.copies.is_empty() {
            self.copies.remove(&block);
        }
        self.record_sent(block, pn);
    }

    /// Record that a second copy of retransmitted `block` (see
    /// [`send_again`](Self::send_again)) went out in packet `pn`.
    pub fn on_sent_copy(&mut self, block: u64, pn: u64) {
        self.copies.insert(block);
        self.record_sent(block, pn);
    }

    fn record_sent(&mut self, block: u64, pn: u64) {
        if block < self.base {
            return;
        }
        let i = (block - self.base) as usize;
        while self.last_pn.len() <= i {
            self.last_pn.push_back(UNSENT);
        }
        self.last_pn[i] = pn;
        if block >= self.next_new {
            self.next_new = block + 1;
        }
    }

    fn last_pn(&self, block: u64) -> u64 {
        if block < self.base {
            return UNSENT;
        }
        self.last_pn
            .get((block - self.base) as usize)
            .copied()
            .unwrap_or(UNSENT)
    }

    fn set_last_pn(&mut self, block: u64, v: u64) {
        if block >= self.base {
            if let Some(x) = self.last_pn.get_mut((block - self.base) as usize) {
                *x = v;
            }
        }
    }

    /// Acknowledges blocks `a..b`; returns the bytes newly acknowledged, and of those the
    /// ones whose last packet was `tagged`.
    /// Acknowledges blocks `[a, b)`; returns their new bytes, those of tagged packets, and
    /// how many were declared lost wrongly: still queued to go again, or last sent (not as
    /// a second copy) in a packet after `largest`, the highest the receiver has (so an
    /// earlier one arrived).
    fn ack_range(
        &mut self,
        a: u64,
        b: u64,
        largest: u64,
        tagged: &impl Fn(u64) -> bool,
    ) -> (u64, u64, u64) {
        let b = b.min(self.layout.blocks());
        // Everything below `cum` is acknowledged already: every loss map acknowledges from
        // block 0, and scanning (and setting) that prefix again made each ACK cost more the
        // further the file got (11 % of the sender's CPU near the end of 1 GiB).
        let a = a.max(self.cum);
        if a >= b {
            return (0, 0, 0);
        }
        // Count bytes only where bits flip; the last block may be short.
        let (mut bytes, mut tagged_bytes, mut spurious) = (0u64, 0u64, 0u64);
        let mut i = self.acked.next_zero_before(a, b);
        while i < b {
            let j = self.acked.next_one_before(i, b);
            bytes += (j - i) * self.layout.block_size;
            if j == self.layout.blocks() {
                bytes -= self.layout.block_size - self.layout.len(j - 1) as u64;
            }
            for k in i..j {
                let pn = self.last_pn(k);
                let copy = !self.copies.is_empty() && self.copies.remove(&k);
                if pn == QUEUED || (pn != UNSENT && pn > largest && !copy) {
                    spurious += 1;
                } else if pn != UNSENT && tagged(pn) {
                    tagged_bytes += self.layout.len(k) as u64;
                }
            }
            i = self.acked.next_zero_before(j, b);
        }
        self.acked.set_range(a, b);
        self.bytes_acked += bytes;
        (bytes, tagged_bytes, spurious)
    }

    fn advance(&mut self) {
        let c = self.acked.next_zero(self.cum);
        self.cum = c;
        while self.base < c && !self.last_pn.is_empty() {
            self.last_pn.pop_front();
            self.base += 1;
        }
        if self.last_pn.is_empty() {
            self.base = self.base.max(c);
        }
    }

    /// Apply the receiver's loss map, sent with an ACK whose largest packet number is
    /// `largest`. `is_lost(pn)` says whether a packet sent as `pn` must have arrived by now
    /// if it was going to (the reordering rule, see PROTOCOL.md); `tagged(pn)` picks packets
    /// whose fates are also counted apart (the sender's catch-up after its host held it).
    pub fn on_loss_map(
        &mut self,
        lm: &LossMapFrame,
        largest: u64,
        is_lost: impl Fn(u64) -> bool,
        tagged: impl Fn(u64) -> bool,
    ) -> MapOutcome {
        // Before `Ready`, the blocks a delta's receiver compared: a map may show blocks it
        // holds of a `Compared` not yet here (behind the map in its packet, or lost), which
        // that credits, not the map (they were never sent).
        let n = self.limit();
        let mut out = MapOutcome::default();
        let mut ack = |o: &mut Self, a: u64, b: u64| {
            let (bytes, t, spurious) = o.ack_range(a, b.min(n), largest, &tagged);
            out.newly_acked_bytes += bytes;
            out.tagged_acked_bytes += t;
            out.spurious_blocks += spurious;
        };
        ack(self, 0, lm.cum.min(n));
        let mut prev = lm.start;
        for g in &lm.gaps {
            ack(self, prev, g.start);
            prev = g.end;
        }
        ack(self, prev, lm.end);
        for g in &lm.gaps {
            for b in g.start..g.end.min(n) {
                self.check_lost(b, &is_lost, &tagged, &mut out);
            }
        }
        // Blocks sent beyond the receiver's highest: lost if overtaken by later packets. At
        // most `budget` are declared per map; blocks declared before and still waiting in
        // the retransmission queue are passed over without counting: counted, they used up
        // every later map's budget, and when the in-flight cap held the retransmissions
        // back, the blocks beyond them were never declared lost, so what was in flight
        // never fell under the cap (a sender stalled for good, pinging).
        // Blocks sent with the offer beyond what a delta's receiver has compared wait in
        // its stash, unwritten: not lost.
        let mut b = lm.top.max(self.base);
        let mut budget = 4096;
        let sent_end = self.next_new.min(n);
        while b < sent_end && budget > 0 {
            if self.acked.get(b) {
                // Held by the receiver (resume, delta) or acknowledged: a run of them can
                // be most of a file, above the highest block that arrived.
                b = self.acked.next_zero_before(b, sent_end);
                continue;
            }
            let pn = self.last_pn(b);
            if pn == QUEUED {
                b += 1;
                continue;
            }
            if pn != UNSENT && !is_lost(pn) {
                break;
            }
            self.check_lost(b, &is_lost, &tagged, &mut out);
            b += 1;
            budget -= 1;
        }
        self.advance();
        out
    }

    fn check_lost(
        &mut self,
        b: u64,
        is_lost: &impl Fn(u64) -> bool,
        tagged: &impl Fn(u64) -> bool,
        out: &mut MapOutcome,
    ) {
        if self.acked.get(b) || b >= self.next_new {
            return;
        }
        let pn = self.last_pn(b);
        if pn != UNSENT && pn != QUEUED && is_lost(pn) {
            self.set_last_pn(b, QUEUED);
            self.retx.push_back(b);
            out.lost_blocks += 1;
            out.lost_bytes += self.span(b).1 as u64;
            if tagged(pn) {
                out.tagged_lost_bytes += self.layout.len(b) as u64;
            }
        }
    }
}

/// Receiver-side state of one file.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub id: XferId,
    pub path: String,
    pub layout: Layout,
    /// The local side accepted it (Ready sent): data is written.
    pub accepted: bool,
    received: Bitset,
    cum: u64,
    top: u64,
    cursor: u64,
    pub expected_hash: Option<[u8; 32]>,
    /// `IncomingComplete` has been emitted.
    pub completed: bool,
    pub bytes_received: u64,
    /// Blocks that came with the offer, before it was accepted: written once it is.
    pub stash: BTreeMap<u64, Vec<u8>>,
    pub stash_bytes: usize,
    /// Leaf hashes were asked for (`WantSums`); those arrived, until the driver takes them.
    pub sums_asked: bool,
    pub sums: Vec<(u64, Vec<crate::control::LeafHash>)>,
    /// Leaf hashes arrived so far (at most one per leaf of the file).
    pub sums_received: u64,
    /// Blocks held in part (delta), and the bytes of each still to come.
    spans: HashMap<u64, (u32, u32)>,
    /// A delta's leaves are compared for the blocks below this (`Compared` sent): those
    /// are written as they come, before the file is accepted.
    pub horizon: u64,
}

/// What [`Incoming::check`] makes of an arriving block.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DataVerdict {
    New,
    Duplicate,
    Invalid,
}

impl Incoming {
    pub fn new(id: XferId, path: String, layout: Layout) -> Self {
        Incoming {
            id,
            path,
            layout,
            accepted: false,
            // Allocated when accepted (`allocate`): an offer costs no loss map until the
            // receiver has taken it on (and reserved its space).
            received: Bitset::new(0),
            cum: 0,
            top: 0,
            cursor: 0,
            expected_hash: None,
            completed: false,
            bytes_received: 0,
            stash: BTreeMap::new(),
            stash_bytes: 0,
            sums_asked: false,
            sums: Vec::new(),
            sums_received: 0,
            spans: HashMap::new(),
            horizon: 0,
        }
    }

    /// Blocks of it may be written: it is accepted, or some compared (a delta).
    pub fn taking(&self) -> bool {
        self.accepted || self.horizon > 0
    }

    /// Whether `block` is written when it comes (else, sent with the offer, it is kept
    /// until it is: see `stash`).
    pub fn takes(&self, block: u64) -> bool {
        self.accepted || block < self.horizon
    }

    /// Blocks held in part: only each span's bytes are to come (and be written). Spans
    /// that do not fit a missing block are left out (the block comes whole).
    pub fn mark_spans(&mut self, spans: &[BlockSpan]) -> Vec<BlockSpan> {
        let mut kept = Vec::new();
        for &sp in spans {
            let b = sp.block;
            if b >= self.layout.blocks() || self.received.get(b) || self.spans.contains_key(&b) {
                continue;
            }
            if sp.is_empty() || sp.to as usize > self.layout.len(b) {
                continue;
            }
            self.spans.insert(b, (sp.from, sp.to));
            kept.push(sp);
        }
        kept
    }

    /// Where `payload`, arrived for `block`, goes: its file offset and the bytes to write
    /// (of a block held in part, only the span's, whether the span or the whole block came).
    pub fn placement<'a>(&self, block: u64, payload: &'a [u8]) -> (u64, &'a [u8]) {
        let offset = self.layout.offset(block);
        match self.spans.get(&block) {
            Some(&(from, to)) if payload.len() == self.layout.len(block) => (
                offset + u64::from(from),
                &payload[from as usize..to as usize],
            ),
            Some(&(from, _)) => (offset + u64::from(from), payload),
            None => (offset, payload),
        }
    }

    /// What the receiver holds of the blocks from `horizon` (those not answered yet) to
    /// `to`: `have` and `spans` outside them are left out (answered before, or not yet),
    /// the rest marked. Returns what was marked, for the answer.
    pub fn mark_held(
        &mut self,
        have: &[(u64, u64)],
        spans: &[BlockSpan],
        to: u64,
    ) -> (Vec<(u64, u64)>, Vec<BlockSpan>) {
        let from = self.horizon;
        let have: Vec<(u64, u64)> = have
            .iter()
            .map(|&(a, b)| (a.max(from), b.min(to)))
            .filter(|&(a, b)| a < b)
            .collect();
        let spans: Vec<BlockSpan> = spans
            .iter()
            .filter(|sp| (from..to).contains(&sp.block))
            .copied()
            .collect();
        self.allocate();
        self.mark_have(&have);
        let parts = self.mark_spans(&spans);
        (have, parts)
    }

    /// Blocks held already (resume, delta): received, but not data that arrived. They do
    /// not raise `top`: the loss maps cover what the sender has sent; a delta's held
    /// ranges answered far ahead of its data would have them walk thousands of gaps (the
    /// changed blocks not sent yet) at a few hundred a map, acknowledging what is in flight
    /// only once a rotation came round to it.
    pub fn mark_have(&mut self, have: &[(u64, u64)]) {
        for &(a, b) in have {
            self.received.set_range(a, b);
        }
        self.cum = self.received.next_zero(0);
    }

    /// Ranges of blocks held, for `Ready { have }`.
    pub fn have_ranges(&self) -> Vec<(u64, u64)> {
        self.received.ones_ranges()
    }

    /// The loss map's bitset, sized to the file: called when the offer is accepted.
    pub fn allocate(&mut self) {
        if self.received.len() != self.layout.blocks() {
            self.received = Bitset::new(self.layout.blocks());
        }
    }

    pub fn check(&self, block: u64, len: usize) -> DataVerdict {
        let span = |&(from, to): &(u32, u32)| (to - from) as usize == len;
        if block >= self.layout.blocks()
            || (len != self.layout.len(block) && !self.spans.get(&block).is_some_and(span))
        {
            DataVerdict::Invalid
        } else if self.received.get(block) {
            DataVerdict::Duplicate
        } else {
            DataVerdict::New
        }
    }

    /// Record a block as written.
    pub fn on_written(&mut self, block: u64, len: usize) {
        if self.received.set(block) {
            self.bytes_received += len as u64;
            self.top = self.top.max(block + 1);
            if block == self.cum {
                self.cum = self.received.next_zero(self.cum);
            }
        }
    }

    pub fn all_received(&self) -> bool {
        self.received.is_full()
    }

    pub fn received_blocks(&self) -> u64 {
        self.received.count_ones()
    }

    /// The missing block ranges (for an error message when a transfer cannot finish).
    pub fn missing_ranges(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let n = self.layout.blocks();
        if !self.taking() {
            // Not accepted yet (a delta's receiver still comparing leaves): nothing written,
            // and no map of blocks allocated to look into.
            if n > 0 {
                out.push((0, n));
            }
            return out;
        }
        let mut i = self.received.next_zero(0);
        while i < n {
            let j = self.received.next_one(i);
            out.push((i, j));
            i = self.received.next_zero(j);
        }
        out
    }

    /// Build the next loss map: gaps from the rotating cursor upwards, at most `max_gaps`.
    /// The caller shrinks `max_gaps` to what fits its packet.
    pub fn loss_map(&mut self, max_gaps: usize) -> LossMapFrame {
        // Everything below `cum` is here, held or arrived.
        self.top = self.top.max(self.cum);
        if self.cursor < self.cum || self.cursor >= self.top {
            self.cursor = self.cum;
        }
        let start = self.cursor;
        let mut gaps = Vec::new();
        let mut i = self.received.next_zero(start).min(self.top);
        let mut end = self.top;
        while i < self.top {
            if gaps.len() == max_gaps {
                end = i;
                break;
            }
            let j = self.received.next_one(i).min(self.top);
            gaps.push(i..j);
            i = self.received.next_zero(j).min(self.top);
        }
        self.cursor = if end >= self.top { self.cum } else { end };
        LossMapFrame {
            xfer: self.id,
            cum: self.cum,
            top: self.top,
            start,
            end,
            gaps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_edges() {
        let l = Layout::new(10, 4);
        assert_eq!(l.blocks(), 3);
        assert_eq!(l.len(2), 2);
        assert_eq!(Layout::new(0, 4).blocks(), 0);
        assert_eq!(Layout::new(8, 4).len(1), 4);
    }

    #[test]
    fn loss_map_round_trip_between_receiver_and_sender() {
        let layout = Layout::new(1000 * 10, 10);
        let mut rx = Incoming::new(1, "f".into(), layout);
        rx.allocate();
        let mut tx = Outgoing::new(1, "f".into(), layout);
        tx.ready = true;
        for b in 0..1000 {
            tx.on_sent(b, b);
            if b % 7 != 3 {
                rx.on_written(b, 10);
            }
        }
        // Receiver saw up to packet 999: everything missing below is lost.
        let (mut lost, mut acked, mut tagged_lost, mut tagged_acked) = (0, 0, 0, 0);
        for _ in 0..10 {
            let lm = rx.loss_map(20);
            let o = tx.on_loss_map(&lm, 999, |pn| pn + REORDER_PACKETS <= 999, |pn| pn % 2 == 0);
            lost += o.lost_blocks;
            acked += o.newly_acked_bytes;
            tagged_lost += o.tagged_lost_bytes;
            tagged_acked += o.tagged_acked_bytes;
        }
        let missing = (0..1000).filter(|b| b % 7 == 3).count() as u64;
        // Gaps sent within 16 packets of the newest (990 and 997) may still be in flight.
        let overtaken = (0..1000u64).filter(|b| b % 7 == 3 && b + 16 <= 999).count() as u64;
        assert_eq!(lost, overtaken);
        assert_eq!(overtaken, missing - 2);
        assert_eq!(acked, (1000 - missing) * 10);
        // The tagged (even) packets' fates are counted apart.
        let even_lost = (0..1000u64)
            .filter(|b| b % 7 == 3 && b + 16 <= 999 && b % 2 == 0)
            .count() as u64;
        let even_acked = (0..1000u64).filter(|b| b % 7 != 3 && b % 2 == 0).count() as u64;
        assert_eq!(tagged_lost, even_lost * 10);
        assert_eq!(tagged_acked, even_acked * 10);
        let mut got = Vec::new();
        while let Some((b, _)) = tx.pop_retx() {
            got.push(b);
        }
        assert_eq!(got.len() as u64, overtaken);
        assert!(got.iter().all(|b| b % 7 == 3));
    }

    /// A block whose loss was declared, then shown delivered (its first packet came late),
    /// is counted as a spurious loss: while still queued to go again, and once sent again in
    /// a packet the receiver has not had yet. A block lost for real and resent is not.
    #[test]
    fn a_loss_declared_wrongly_is_found_out() {
        let layout = Layout::new(100, 10);
        let mut rx = Incoming::new(1, "f".into(), layout);
        rx.allocate();
        let mut tx = Outgoing::new(1, "f".into(), layout);
        tx.ready = true;
        for b in 0..10 {
            tx.on_sent(b, b);
        }
        // 2, 3 and 5 are missing when packet 40 (a probe) arrives: all three declared lost.
        for b in [0, 1, 4, 6, 7, 8, 9] {
            rx.on_written(b, 10);
        }
        let o = tx.on_loss_map(&rx.loss_map(100), 40, |pn| pn < 40, |_| false);
        assert_eq!((o.lost_blocks, o.spurious_blocks), (3, 0));
        // 3 is sent again as packet 50; 5 waits in the queue; 2 was lost for real.
        let mut again = Vec::new();
        while let Some((b, _)) = tx.pop_retx() {
            again.push(b);
        }
        assert_eq!(again, vec![2, 3, 5]);
        tx.on_sent(2, 45);
        tx.on_sent(3, 50);
        tx.unpop_retx(5, false);
        // The first 3 and 5 arrive late, then packet 45 (2's resend); the receiver's highest
        // is 45, so 3 (last sent as 50) and 5 (never resent) came from their first packets.
        rx.on_written(3, 10);
        rx.on_written(5, 10);
        rx.on_written(2, 10);
        let o = tx.on_loss_map(&rx.loss_map(100), 45, |pn| pn < 40, |_| false);
        assert_eq!(o.spurious_blocks, 2);
        assert_eq!(o.newly_acked_bytes, 30);
    }

    /// At the tail a retransmission goes twice; the first copy arriving while the second is
    /// on its way is no loss declared wrongly.
    #[test]
    fn a_second_copy_on_its_way_is_no_wrong_loss() {
        let layout = Layout::new(50, 10);
        let mut rx = Incoming::new(1, "f".into(), layout);
        rx.allocate();
        let mut tx = Outgoing::new(1, "f".into(), layout);
        tx.ready = true;
        for b in 0..5 {
            tx.on_sent(b, b);
        }
        for b in [0, 1, 3, 4] {
            rx.on_written(b, 10);
        }
        let o = tx.on_loss_map(&rx.loss_map(100), 10, |pn| pn < 10, |_| false);
        assert_eq!(o.lost_blocks, 1);
        assert_eq!(tx.pop_retx(), Some((2, false)));
        tx.on_sent(2, 11);
        tx.send_again(2);
        assert_eq!(tx.pop_retx(), Some((2, true)));
        tx.on_sent_copy(2, 12);
        rx.on_written(2, 10);
        let o = tx.on_loss_map(&rx.loss_map(100), 11, |pn| pn < 10, |_| false);
        assert_eq!((o.newly_acked_bytes, o.spurious_blocks), (10, 0));
    }

    #[test]
    fn tail_losses_beyond_top_are_found() {
        let layout = Layout::new(100, 10);
        let mut rx = Incoming::new(1, "f".into(), layout);
        rx.allocate();
        let mut tx = Outgoing::new(1, "f".into(), layout);
        for b in 0..10 {
            tx.on_sent(b, b);
        }
        for b in 0..6 {
            rx.on_written(b, 10);
        }
        // A later PING (pn 50) arrived: blocks 6..10 are overtaken.
        let lm = rx.loss_map(100);
        let o = tx.on_loss_map(&lm, 50, |pn| pn < 50, |_| false);
        assert_eq!(o.lost_blocks, 4);
        assert_eq!(o.lost_bytes, 40);
    }

    #[test]
    fn every_block_sent_beyond_the_receivers_top_is_declared_lost_in_a_few_maps() {
        // 20 000 blocks out, the receiver has the first 100 only, and nothing can be resent
        // meanwhile (the in-flight cap holds the retransmissions back): later maps must go
        // on past the blocks already queued, not stop at them.
        let n = 20_000u64;
        let layout = Layout::new(n * 10, 10);
        let mut rx = Incoming::new(1, "f".into(), layout);
        rx.allocate();
        let mut tx = Outgoing::new(1, "f".into(), layout);
        tx.ready = true;
        for b in 0..n {
            tx.on_sent(b, b);
        }
        for b in 0..100 {
            rx.on_written(b, 10);
        }
        let mut lost = 0;
        for _ in 0..8 {
            let lm = rx.loss_map(64);
            lost += tx.on_loss_map(&lm, n, |_| true, |_| false).lost_blocks;
        }
        assert_eq!(lost, n - 100);
    }

    #[test]
    fn an_offer_not_yet_accepted_misses_everything() {
        // Its block map is not allocated until it is accepted: asking what is missing must
        // not walk an empty map for ever (a delta's receiver saves its resume state while it
        // still compares leaves).
        let layout = Layout::new(1000 * 10 + 3, 10);
        let mut rx = Incoming::new(1, "f".into(), layout);
        assert_eq!(rx.missing_ranges(), vec![(0, 1001)]);
        rx.allocate();
        rx.accepted = true;
        rx.on_written(0, 10);
        rx.on_written(7, 10);
        assert_eq!(rx.missing_ranges(), vec![(1, 7), (8, 1001)]);
    }

    /// A block held in part: the sender sends its span alone, the receiver takes the span
    /// (or the whole block, sent before `Ready`) and writes only the span's bytes; a span
    /// that does not fit its block, or another length, is refused.
    #[test]
    fn a_block_held_in_part_travels_as_its_span() {
        let layout = Layout::new(1000 * 10 + 3, 10);
        let spans = [
            BlockSpan {
                block: 4,
                from: 2,
                to: 7,
            },
            BlockSpan {
                block: 1000,
                from: 1,
                to: 3,
            },
            // Past its block's end, and past the file: ignored.
            BlockSpan {
                block: 5,
                from: 2,
                to: 11,
            },
            BlockSpan {
                block: 1001,
                from: 0,
                to: 1,
            },
        ];
        let mut tx = Outgoing::new(1, "f".into(), layout);
        tx.mark_have(&[(0, 4)]);
        tx.mark_spans(&spans);
        assert_eq!(
            (tx.span(4), tx.span(1000), tx.span(5)),
            ((2, 5), (1, 2), (0, 10))
        );
        assert_eq!(tx.bytes_had, 40 + 5 + 1);

        let mut rx = Incoming::new(1, "f".into(), layout);
        rx.allocate();
        rx.accepted = true;
        rx.mark_have(&[(0, 4)]);
        assert_eq!(rx.mark_spans(&spans), spans[..2].to_vec());
        assert_eq!(rx.check(4, 5), DataVerdict::New);
        assert_eq!(rx.check(4, 10), DataVerdict::New);
        assert_eq!(rx.check(4, 4), DataVerdict::Invalid);
        assert_eq!(rx.check(5, 5), DataVerdict::Invalid);
        let block: Vec<u8> = (0..10).collect();
        assert_eq!(rx.placement(4, &block[2..7]), (42, &block[2..7]));
        assert_eq!(rx.placement(4, &block), (42, &block[2..7]));
        assert_eq!(rx.placement(5, &block), (50, &block[..]));
        assert_eq!(rx.check(1000, 2), DataVerdict::New);
        // The short last block, whole: its span.
        assert_eq!(rx.placement(1000, &block[..3]), (10_001, &block[1..3]));
    }

    /// Before `Ready`, a delta's sender sends only the blocks its receiver compared, and a
    /// loss map that shows blocks beyond those (held ones, of a `Compared` behind the map
    /// or lost) acknowledges none of them: `Compared` credits them, as had.
    #[test]
    fn a_delta_sender_sends_what_was_compared_and_credits_held_blocks_once() {
        let layout = Layout::new(100 * 10, 10);
        let mut tx = Outgoing::new(1, "f".into(), layout);
        tx.basis = Some(1);
        assert!(!tx.flowing());
        assert_eq!(tx.peek_new(), None, "nothing before an answer");
        assert_eq!(tx.on_compared(40, &[(0, 10)], &[]), 0);
        assert!(tx.flowing());
        for b in 10..40 {
            assert_eq!(tx.peek_new(), Some(b));
            tx.on_sent(b, b);
        }
        assert_eq!(tx.peek_new(), None, "nothing beyond the answer");
        // The receiver has 10..40 and holds 40..60 (its next answer, not here yet).
        let lm = LossMapFrame {
            xfer: 1,
            cum: 60,
            top: 60,
            start: 60,
            end: 60,
            gaps: Vec::new(),
        };
        let out = tx.on_loss_map(&lm, 39, |_| true, |_| false);
        assert_eq!(out.newly_acked_bytes, 30 * 10);
        assert_eq!(out.lost_blocks, 0);
        assert_eq!(tx.on_compared(70, &[(40, 60)], &[]), 0);
        assert_eq!(tx.bytes_had, 30 * 10);
        assert_eq!(tx.peek_new(), Some(60));
        // An answer not beyond the last is ignored.
        tx.on_compared(50, &[(60, 70)], &[]);
        assert_eq!(tx.peek_new(), Some(60));
    }

    /// Blocks held (resume, delta) do not raise the loss map's top: a delta answered far
    /// ahead of its data has its maps cover what was sent, not walk the changed blocks not
    /// sent yet, a few hundred gaps a map.
    #[test]
    fn held_blocks_beyond_the_data_are_not_mapped() {
        let layout = Layout::new(10_000 * 10, 10);
        let mut rx = Incoming::new(1, "f".into(), layout);
        rx.allocate();
        rx.accepted = true;
        // Every other block held, to the end: a changed one between each two.
        let have: Vec<(u64, u64)> = (0..5000).map(|i| (2 * i, 2 * i + 1)).collect();
        rx.mark_have(&have);
        rx.on_written(1, 10);
        rx.on_written(3, 10);
        let lm = rx.loss_map(100);
        assert_eq!((lm.cum, lm.top, lm.gaps.len()), (5, 5, 0));
        rx.on_written(7, 10);
        let lm = rx.loss_map(100);
        assert_eq!((lm.cum, lm.top), (5, 8));
        assert_eq!(lm.gaps, vec![5..6]);
        lm.validate().unwrap();
    }
}
