//! Reliable, ordered, flow-controlled byte streams: the tunnel's (`hayate tunnel`), in both
//! directions at once, each direction ended on its own (half-close), and the control
//! stream's halves (`crate::control` frames its messages onto them; its bytes travel in
//! CTRL frames, and it is neither paced nor counted by the rate controller).
//!
//! A stream is acknowledged selectively, as file blocks are: the receiver reports what it holds as a loss
//! map over stream *positions* (`wire::StreamAckFrame`), and the sender declares a chunk lost
//! with the same rule as a block (its packet was overtaken, see `Connection`), sends it again
//! before anything new, and reports what was delivered and lost to the rate controller.
//!
//! Positions: byte `i` of the stream is position `i`; the end of the stream (FIN) takes one
//! position of its own, right after the last byte, so that its delivery is acknowledged like
//! a byte's.
//!
//! Memory is bounded on both sides: the sender keeps at most [`SEND_BUFFER`] unacknowledged
//! bytes (its writer is told how much room there is), the receiver at most [`RECV_WINDOW`]
//! bytes beyond what its reader took (the limit it advertises; a sender that goes beyond it
//! breaks the protocol).

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;

use crate::wire::{LossMapFrame, StreamAckFrame};

/// Most bytes a sender keeps unacknowledged (its writer waits beyond that).
pub const SEND_BUFFER: usize = 16 << 20;
/// Most bytes a receiver holds beyond what its reader has taken.
pub const RECV_WINDOW: u64 = 16 << 20;
/// The tunnel's stream's id in STREAM_ACK frames (one tunnel per session).
pub const STREAM_ID: u32 = 0;
/// The control stream's id in STREAM_ACK frames (`crate::control`): its sender and
/// receiver are this module's, its bytes travel in CTRL frames.
pub const CONTROL_STREAM_ID: u32 = 1;
/// Chunks looked at per acknowledgement when deciding losses (bounds the work per ACK).
const LOSS_SCAN: usize = 4096;

/// A peer that broke the stream's rules (the session is closed with a protocol error).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StreamError {
    /// Bytes beyond the limit this side advertised.
    #[error("stream data beyond the advertised limit")]
    FlowControl,
    /// Bytes beyond the stream's end, or an end other than the one already told.
    #[error("stream data beyond its end, or two different ends")]
    BadFin,
}

/// A set of disjoint, non-adjacent half-open ranges of positions.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// Adds the positions of `r`.
    pub fn insert(&mut self, r: Range<u64>) {
        if r.start >= r.end {
            return;
        }
        let (mut s, mut e) = (r.start, r.end);
        // A range starting at or before `s` that reaches it.
        if let Some((&ps, &pe)) = self.map.range(..=s).next_back() {
            if pe >= s {
                s = ps;
                e = e.max(pe);
            }
        }
        // Ranges starting within [s, e] are swallowed.
        let inside: Vec<u64> = self.map.range(s..=e).map(|(&k, _)| k).collect();
        for k in inside {
            let ke = self.map.remove(&k).expect("listed");
            e = e.max(ke);
        }
        self.map.insert(s, e);
    }

    /// Every position of `r` is in the set.
    pub fn contains(&self, r: &Range<u64>) -> bool {
        if r.start >= r.end {
            return true;
        }
        self.map
            .range(..=r.start)
            .next_back()
            .is_some_and(|(_, &e)| e >= r.end)
    }

    /// Some position of `r` is in the set.
    pub fn intersects(&self, r: &Range<u64>) -> bool {
        if r.start >= r.end {
            return false;
        }
        if let Some((_, &e)) = self.map.range(..=r.start).next_back() {
            if e > r.start {
                return true;
            }
        }
        self.map.range(r.start..r.end).next().is_some()
    }

    /// Forgets every position below `x`.
    pub fn remove_below(&mut self, x: u64) {
        while let Some((&s, &e)) = self.map.iter().next() {
            if s >= x {
                break;
            }
            self.map.remove(&s);
            if e > x {
                self.map.insert(x, e);
                break;
            }
        }
    }

    /// The range holding `x`, if any.
    pub fn range_at(&self, x: u64) -> Option<Range<u64>> {
        let (&s, &e) = self.map.range(..=x).next_back()?;
        (e > x).then_some(s..e)
    }

    /// The ranges starting at or after `x`, in order.
    pub fn ranges_from(&self, x: u64) -> impl Iterator<Item = Range<u64>> + '_ {
        self.map.range(x..).map(|(&s, &e)| s..e)
    }

    /// No position at all.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// One past the highest position in the set.
    pub fn max_end(&self) -> Option<u64> {
        self.map.iter().next_back().map(|(_, &e)| e)
    }

    /// How many disjoint ranges.
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

/// A chunk the sender put in a packet.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    end: u64,
    pn: u64,
}

/// What [`StreamSend::next_chunk`] put in the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Position of its first byte.
    pub offset: u64,
    /// Data bytes (the FIN takes none).
    pub len: usize,
    /// It ends the stream.
    pub fin: bool,
    /// A retransmission.
    pub retx: bool,
}

/// What one acknowledgement told the sender (as `transfer::MapOutcome` for blocks).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AckOutcome {
    /// Bytes acknowledged for the first time.
    pub newly_acked_bytes: u64,
    /// Chunks declared lost (queued to be sent again).
    pub lost_chunks: u64,
    /// Their bytes.
    pub lost_bytes: u64,
    /// Of `newly_acked_bytes`, those sent in the pacer's catch-up.
    pub tagged_acked_bytes: u64,
    /// Of `lost_bytes`, those sent in the pacer's catch-up.
    pub tagged_lost_bytes: u64,
}

/// The sending half.
#[derive(Debug)]
pub struct StreamSend {
    /// Bytes from position `base` to `written`.
    buf: VecDeque<u8>,
    /// Every position below is acknowledged and forgotten.
    base: u64,
    /// End of the bytes written so far; with `fin`, the end of the stream (its FIN is at
    /// this position).
    written: u64,
    fin: bool,
    /// The first position never sent.
    next_new: u64,
    /// Positions at or above `base` the receiver acknowledged.
    acked: RangeSet,
    /// Chunks sent and neither acknowledged nor declared lost, by start position.
    in_flight: BTreeMap<u64, InFlight>,
    /// The same, by packet number.
    by_pn: BTreeMap<u64, u64>,
    /// Positions declared lost, to send again before anything new.
    retx: VecDeque<Range<u64>>,
    /// The receiver takes bytes below this.
    limit: u64,
    /// Most bytes held (written and not acknowledged).
    capacity: usize,
}

impl StreamSend {
    /// A sender allowed `limit` bytes until the receiver says more (its first window),
    /// holding at most [`SEND_BUFFER`] bytes.
    pub fn new(limit: u64) -> Self {
        Self::with_capacity(limit, SEND_BUFFER)
    }

    /// As [`StreamSend::new`], holding at most `capacity` bytes (the control stream's
    /// writer never waits: its messages are bounded by what queues them).
    pub fn with_capacity(limit: u64, capacity: usize) -> Self {
        StreamSend {
            buf: VecDeque::new(),
            base: 0,
            written: 0,
            fin: false,
            next_new: 0,
            acked: RangeSet::default(),
            in_flight: BTreeMap::new(),
            by_pn: BTreeMap::new(),
            retx: VecDeque::new(),
            limit,
            capacity,
        }
    }

    /// How many bytes [`StreamSend::write`] takes now.
    pub fn room(&self) -> usize {
        if self.fin {
            return 0;
        }
        self.capacity.saturating_sub(self.buf.len())
    }

    /// End of the bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Every position below this is acknowledged.
    pub fn acked_prefix(&self) -> u64 {
        self.base
    }

    /// Bytes to send that were never sent or were declared lost: the queue ahead of any
    /// new write.
    pub fn unsent(&self) -> u64 {
        self.written.saturating_sub(self.next_new)
            + self.retx.iter().map(|r| r.end - r.start).sum::<u64>()
    }

    /// The receiver may take bytes below `limit` (a window it told outside a STREAM_ACK).
    pub fn raise_limit(&mut self, limit: u64) {
        self.limit = self.limit.max(limit);
    }

    /// Sends everything from position `pos` on once more, as soon as possible, whether
    /// or not it is lost (a message the peer waits on, said twice). The chunks in flight
    /// there are no longer waited for: their copies are.
    pub fn send_again_from(&mut self, pos: u64) {
        let pos = pos.max(self.base);
        let first = self
            .in_flight
            .range(..=pos)
            .next_back()
            .filter(|(_, c)| c.end > pos)
            .map_or(pos, |(&s, _)| s);
        let starts: Vec<u64> = self.in_flight.range(first..).map(|(&s, _)| s).collect();
        for s in starts {
            let c = self.in_flight.remove(&s).expect("listed");
            self.by_pn.remove(&c.pn);
            self.queue_retx(s..c.end);
        }
    }

    /// Queues as much of `data` as there is room for; returns how much.
    pub fn write(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.room());
        self.buf.extend(&data[..n]);
        self.written += n as u64;
        n
    }

    /// Nothing more will be written: the stream's end follows the bytes written.
    pub fn finish(&mut self) {
        self.fin = true;
    }

    /// [`StreamSend::finish`] was called.
    pub fn is_finished(&self) -> bool {
        self.fin
    }

    /// Every byte and the end were acknowledged.
    pub fn is_done(&self) -> bool {
        self.fin && self.base > self.written
    }

    /// Bytes written and not yet acknowledged (what the sender holds).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The receiver's limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    fn fin_unsent(&self) -> bool {
        self.fin && self.next_new <= self.written
    }

    /// Something may go out now (a retransmission, new bytes within the limit, the end).
    pub fn has_sendable(&self) -> bool {
        !self.retx.is_empty()
            || (self.next_new < self.written && self.next_new < self.limit)
            || (self.fin_unsent() && self.next_new == self.written)
    }

    /// New bytes wait for the receiver's limit to open.
    pub fn is_blocked(&self) -> bool {
        self.next_new < self.written && self.next_new >= self.limit
    }

    /// Something sent awaits an acknowledgement, or waits for room at the receiver: the
    /// session keeps probing meanwhile.
    pub fn is_outstanding(&self) -> bool {
        !self.in_flight.is_empty() || !self.retx.is_empty() || self.is_blocked()
    }

    /// Whether the next chunk is a retransmission.
    pub fn has_retx(&self) -> bool {
        !self.retx.is_empty()
    }

    /// Puts the next chunk (a retransmission first, else new bytes) of at most `max` bytes
    /// into `out` (at least `max` long), as sent in packet `pn`. None: nothing to send.
    pub fn next_chunk(&mut self, max: usize, pn: u64, out: &mut [u8]) -> Option<Chunk> {
        while let Some(r) = self.retx.pop_front() {
            // What was acknowledged meanwhile (a late copy arrived) is not sent again.
            let mut a = r.start.max(self.base);
            while let Some(got) = self.acked.range_at(a).filter(|_| a < r.end) {
                a = got.end;
            }
            if a >= r.end {
                continue;
            }
            // Up to the next acknowledged position, within this range.
            let mut b = r.end;
            if let Some(next) = self.acked.ranges_from(a).next() {
                b = b.min(next.start);
            }
            let data_end = b.min(self.written);
            let len = ((data_end.saturating_sub(a)) as usize).min(max);
            let fin = self.fin && a + len as u64 == self.written && b > self.written;
            let span_end = a + len as u64 + u64::from(fin);
            if span_end < r.end {
                self.retx.push_front(span_end..r.end);
            }
            if span_end == a {
                continue;
            }
            self.copy(a, len, out);
            self.on_sent(a, span_end, pn);
            return Some(Chunk {
                offset: a,
                len,
                fin,
                retx: true,
            });
        }
        let a = self.next_new;
        let end = self.written.min(self.limit).min(a + max as u64);
        let len = end.saturating_sub(a) as usize;
        let fin = self.fin_unsent() && a + len as u64 == self.written;
        if len == 0 && !fin {
            return None;
        }
        let span_end = a + len as u64 + u64::from(fin);
        self.copy(a, len, out);
        self.on_sent(a, span_end, pn);
        self.next_new = span_end;
        Some(Chunk {
            offset: a,
            len,
            fin,
            retx: false,
        })
    }

    fn copy(&self, at: u64, len: usize, out: &mut [u8]) {
        let i = (at - self.base) as usize;
        let (x, y) = self.buf.as_slices();
        let mut done = 0;
        if i < x.len() {
            let n = (x.len() - i).min(len);
            out[..n].copy_from_slice(&x[i..i + n]);
            done = n;
        }
        if done < len {
            let j = i + done - x.len();
            out[done..len].copy_from_slice(&y[j..j + len - done]);
        }
    }

    fn on_sent(&mut self, start: u64, end: u64, pn: u64) {
        self.in_flight.insert(start, InFlight { end, pn });
        self.by_pn.insert(pn, start);
    }

    /// Data bytes (not the FIN position) in `[a, b)`.
    fn data_len(&self, a: u64, b: u64) -> u64 {
        b.min(self.written).saturating_sub(a)
    }

    /// The receiver's STREAM_ACK. `is_lost(pn)`: the packet `pn` was overtaken (the
    /// connection's reordering rule); `tagged(pn)`: it was sent in the pacer's catch-up.
    pub fn on_ack(
        &mut self,
        ack: &StreamAckFrame,
        is_lost: impl Fn(u64) -> bool,
        tagged: impl Fn(u64) -> bool,
    ) -> AckOutcome {
        let mut out = AckOutcome::default();
        self.limit = self.limit.max(ack.limit);
        let m = &ack.map;
        // Nothing beyond what was sent can have been received.
        let sent_end = self.next_new;
        let mut got: Vec<Range<u64>> = Vec::with_capacity(m.gaps.len() + 2);
        got.push(0..m.cum.min(sent_end));
        let mut prev = m.start;
        for g in &m.gaps {
            got.push(prev.min(sent_end)..g.start.min(sent_end));
            prev = g.end;
        }
        got.push(prev.min(sent_end)..m.end.min(sent_end));
        for r in got {
            if r.start >= r.end || r.end <= self.base {
                continue;
            }
            self.acked.insert(r.start.max(self.base)..r.end);
            // Chunks now wholly acknowledged leave the flight.
            let first = self
                .in_flight
                .range(..=r.start)
                .next_back()
                .map_or(r.start, |(&s, _)| s);
            let candidates: Vec<u64> = self
                .in_flight
                .range(first..r.end)
                .map(|(&s, _)| s)
                .collect();
            for s in candidates {
                let c = self.in_flight[&s];
                if self.acked.contains(&(s..c.end)) || c.end <= self.base {
                    self.in_flight.remove(&s);
                    self.by_pn.remove(&c.pn);
                    let n = self.data_len(s, c.end);
                    out.newly_acked_bytes += n;
                    if tagged(c.pn) {
                        out.tagged_acked_bytes += n;
                    }
                }
            }
        }
        // The acknowledged prefix is forgotten.
        if let Some(r) = self.acked.range_at(self.base) {
            let new_base = r.end;
            let drop = (new_base.min(self.written) - self.base.min(self.written)) as usize;
            self.buf.drain(..drop.min(self.buf.len()));
            self.base = new_base;
            self.acked.remove_below(new_base);
            let below: Vec<u64> = self.in_flight.range(..new_base).map(|(&s, _)| s).collect();
            for s in below {
                let c = self.in_flight[&s];
                if c.end <= new_base {
                    self.in_flight.remove(&s);
                    self.by_pn.remove(&c.pn);
                    let n = self.data_len(s, c.end);
                    out.newly_acked_bytes += n;
                    if tagged(c.pn) {
                        out.tagged_acked_bytes += n;
                    }
                }
            }
        }
        // Losses: chunks of overtaken packets that the map shows missing (in a gap, or at or
        // above `top`, where nothing has arrived). Packet numbers only grow with time, so the
        // oldest are looked at first and the scan stops at the first packet still in flight.
        let missing = |s: u64, e: u64| {
            e > m.top
                || m.gaps
                    .iter()
                    .any(|g| g.start < e && s < g.end && g.start >= m.start)
        };
        let mut lost: Vec<(u64, u64)> = Vec::new();
        for (&pn, &s) in self.by_pn.iter().take(LOSS_SCAN) {
            if !is_lost(pn) {
                break;
            }
            let c = self.in_flight[&s];
            if missing(s, c.end) {
                lost.push((pn, s));
            }
        }
        for (pn, s) in lost {
            let c = self.in_flight.remove(&s).expect("in flight");
            self.by_pn.remove(&pn);
            let n = self.data_len(s, c.end);
            out.lost_chunks += 1;
            out.lost_bytes += n;
            if tagged(pn) {
                out.tagged_lost_bytes += n;
            }
            self.queue_retx(s..c.end);
        }
        out
    }

    /// Probe timeout (nothing heard for the RTT and its variance): a flight of at most
    /// `max_chunks` chunks (interactive use: a keystroke, its echo) is presumed lost and
    /// queued to go out again at once, so that the probe carries the data instead of only
    /// asking what arrived: a lost keystroke then costs the timeout and one round trip, not
    /// two. A bigger flight waits for the acknowledgement the probe elicits. Returns the
    /// bytes queued again.
    pub fn on_probe_timeout(&mut self, max_chunks: usize) -> u64 {
        if self.in_flight.is_empty() || self.in_flight.len() > max_chunks {
            return 0;
        }
        self.by_pn.clear();
        let mut n = 0;
        for (s, c) in std::mem::take(&mut self.in_flight) {
            n += self.data_len(s, c.end);
            self.queue_retx(s..c.end);
        }
        n
    }

    /// Queues `r` to be sent again, in position order.
    fn queue_retx(&mut self, r: Range<u64>) {
        let at = self
            .retx
            .iter()
            .position(|q| q.start > r.start)
            .unwrap_or(self.retx.len());
        self.retx.insert(at, r);
    }

    /// Chunks in flight (tests, stats).
    pub fn chunks_in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

/// The receiving half.
#[derive(Debug)]
pub struct StreamRecv {
    /// In-order bytes the reader has not taken yet, from position `read`.
    ready: VecDeque<u8>,
    read: u64,
    /// Chunks above the in-order end, by position (no two overlap).
    pending: BTreeMap<u64, Vec<u8>>,
    /// Positions received at or above the in-order end (the FIN's included).
    received: RangeSet,
    fin_at: Option<u64>,
    window: u64,
    /// The stream's id in its STREAM_ACK frames.
    id: u32,
    /// The limit last told to the sender.
    advertised: u64,
    /// Where the next acknowledgement's map starts (a long map is told in parts).
    cursor: u64,
}

impl Default for StreamRecv {
    fn default() -> Self {
        Self::new(RECV_WINDOW)
    }
}

impl StreamRecv {
    /// A receiver that holds at most `window` bytes its reader has not taken.
    pub fn new(window: u64) -> Self {
        StreamRecv {
            ready: VecDeque::new(),
            read: 0,
            pending: BTreeMap::new(),
            received: RangeSet::default(),
            fin_at: None,
            window,
            id: STREAM_ID,
            advertised: window,
            cursor: 0,
        }
    }

    /// The same, for the stream `id` (its STREAM_ACK frames say so).
    pub fn with_id(window: u64, id: u32) -> Self {
        StreamRecv {
            id,
            ..Self::new(window)
        }
    }

    /// Positions above the in-order end have arrived: only a map tells the sender which.
    pub fn has_gaps(&self) -> bool {
        !self.received.is_empty()
    }

    /// One past the last in-order byte.
    fn contiguous(&self) -> u64 {
        self.read + self.ready.len() as u64
    }

    /// Every position below this has arrived (the FIN's included, once it is in order).
    pub fn cum(&self) -> u64 {
        let c = self.contiguous();
        if self.fin_at == Some(c) {
            c + 1
        } else {
            c
        }
    }

    /// The sender may send below this.
    pub fn limit(&self) -> u64 {
        self.read + self.window
    }

    /// Bytes held (in order and not) : at most the window.
    pub fn held(&self) -> u64 {
        self.ready.len() as u64 + self.pending.values().map(|v| v.len() as u64).sum::<u64>()
    }

    /// A chunk from the peer; returns how many of its bytes were new.
    pub fn on_chunk(&mut self, offset: u64, fin: bool, data: &[u8]) -> Result<u64, StreamError> {
        let end = offset.saturating_add(data.len() as u64);
        if end > self.limit() {
            return Err(StreamError::FlowControl);
        }
        if let Some(f) = self.fin_at {
            if end > f || (fin && end != f) {
                return Err(StreamError::BadFin);
            }
        }
        if fin {
            if end < self.contiguous() || self.received.max_end().is_some_and(|m| m > end + 1) {
                return Err(StreamError::BadFin);
            }
            self.fin_at = Some(end);
            if end >= self.contiguous() {
                self.received.insert(end..end + 1);
            }
        }
        let c = self.contiguous();
        let mut new = 0;
        if end > c {
            // The parts not held yet.
            let mut a = offset.max(c);
            while a < end {
                if let Some(r) = self.received.range_at(a) {
                    a = r.end;
                    continue;
                }
                let b = self
                    .received
                    .ranges_from(a)
                    .next()
                    .map_or(end, |r| r.start.min(end));
                let piece = &data[(a - offset) as usize..(b - offset) as usize];
                new += piece.len() as u64;
                if a == self.contiguous() {
                    self.ready.extend(piece);
                } else {
                    self.pending.insert(a, piece.to_vec());
                }
                self.received.insert(a..b);
                a = b;
            }
            // What now follows in order.
            loop {
                let c = self.contiguous();
                let Some(e) = self.pending.first_entry() else {
                    break;
                };
                if *e.key() != c {
                    break;
                }
                let v = e.remove();
                self.ready.extend(&v);
            }
            let c = self.contiguous();
            self.received.remove_below(c);
        }
        Ok(new)
    }

    /// The in-order bytes waiting for the reader (the first part of them: call again after
    /// [`StreamRecv::consume`]).
    pub fn peek(&self) -> &[u8] {
        self.ready.as_slices().0
    }

    /// The reader took `n` bytes of [`StreamRecv::peek`].
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.ready.len());
        self.ready.drain(..n);
        self.read += n as u64;
    }

    /// Copies up to `buf.len()` in-order bytes out; returns how many.
    pub fn read(&mut self, buf: &mut [u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            let p = self.peek();
            if p.is_empty() {
                break;
            }
            let n = p.len().min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&p[..n]);
            self.consume(n);
            done += n;
        }
        done
    }

    /// The peer ended the stream and the reader took every byte.
    pub fn is_finished(&self) -> bool {
        self.fin_at == Some(self.read)
    }

    /// The stream's end has arrived, in order (the reader may still have bytes to take).
    pub fn fin_received(&self) -> bool {
        self.fin_at == Some(self.contiguous())
    }

    /// The reader made room enough that the sender should hear of it now (it may be
    /// waiting for it): a quarter of the window since the limit was last told.
    pub fn window_update_due(&self) -> bool {
        self.limit() >= self.advertised + self.window / 4
    }

    /// Only the map up to `end` went out: the next one goes on from there.
    pub fn resume_ack_at(&mut self, end: u64) {
        self.cursor = end;
    }

    /// The acknowledgement to send: the limit and a loss map over positions describing at
    /// most `max_gaps` gaps (a longer one is told in parts, as a transfer's loss map).
    pub fn ack(&mut self, max_gaps: usize) -> StreamAckFrame {
        let cum = self.cum();
        let top = self.received.max_end().unwrap_or(cum).max(cum);
        if self.cursor < cum || self.cursor >= top {
            self.cursor = cum;
        }
        let start = self.cursor;
        let mut gaps = Vec::new();
        let mut end = top;
        let mut i = start;
        // Skip what is held at the start.
        if let Some(r) = self.received.range_at(i) {
            i = r.end;
        }
        while i < top {
            let next = self
                .received
                .ranges_from(i)
                .next()
                .expect("top is the end of a held range");
            if gaps.len() == max_gaps {
                end = i;
                break;
            }
            gaps.push(i..next.start);
            i = next.end;
        }
        self.cursor = if end >= top { cum } else { end };
        self.advertised = self.limit();
        StreamAckFrame {
            limit: self.limit(),
            map: LossMapFrame {
                xfer: self.id,
                cum,
                top,
                start,
                end,
                gaps,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn range_set_merges_and_answers() {
        let mut s = RangeSet::default();
        s.insert(10..20);
        s.insert(30..40);
        s.insert(20..25);
        assert_eq!(s.len(), 2);
        assert!(s.contains(&(10..25)));
        assert!(!s.contains(&(10..26)));
        s.insert(5..35);
        assert_eq!(s.len(), 1);
        assert!(s.contains(&(5..40)));
        assert!(s.intersects(&(39..50)));
        assert!(!s.intersects(&(40..50)));
        s.remove_below(12);
        assert_eq!(s.range_at(12), Some(12..40));
        assert_eq!(s.range_at(11), None);
        assert_eq!(s.max_end(), Some(40));
    }

    proptest! {
        #[test]
        fn range_set_matches_a_bitmap(ops in proptest::collection::vec((0u64..200, 0u64..30), 1..40)) {
            let mut s = RangeSet::default();
            let mut bits = [false; 256];
            for (a, l) in ops {
                s.insert(a..a + l);
                for b in &mut bits[a as usize..(a + l) as usize] {
                    *b = true;
                }
            }
            for (i, &b) in bits.iter().enumerate() {
                prop_assert_eq!(s.contains(&(i as u64..i as u64 + 1)), b);
            }
            // Disjoint and not adjacent.
            let v: Vec<_> = s.ranges_from(0).collect();
            for w in v.windows(2) {
                prop_assert!(w[0].end < w[1].start);
            }
        }
    }

    /// A simulated path for one direction: each packet is lost with `loss`, delivered after
    /// a random delay (so reordered); the receiver acknowledges every `ack_every` packets.
    struct Path {
        rng: ChaCha8Rng,
        loss: f64,
        dup: f64,
        /// Holds a third of the packets back each round, in random order.
        reorder: bool,
    }

    fn overtaken(largest: u64) -> impl Fn(u64) -> bool {
        move |pn| pn + 16 <= largest
    }

    /// Sends `data` through a lossy path; the reader takes at most `read_per_round` bytes a
    /// round. Returns what the reader got and the sender's loss count.
    fn transfer(
        data: &[u8],
        path: &mut Path,
        read_per_round: usize,
        window: u64,
    ) -> (Vec<u8>, u64) {
        let mut tx = StreamSend::new(window);
        let mut rx = StreamRecv::new(window);
        let mut got = Vec::new();
        let mut written = 0;
        let mut pn = 0u64;
        let mut in_net: Vec<(u64, Chunk, Vec<u8>)> = Vec::new();
        let mut largest_rx = 0;
        let mut lost_total = 0;
        let mut buf = vec![0u8; 1400];
        for round in 0..200_000 {
            written += tx.write(&data[written..]);
            if written == data.len() {
                tx.finish();
            }
            // Send a burst.
            for _ in 0..8 {
                let Some(c) = tx.next_chunk(1400, pn, &mut buf) else {
                    break;
                };
                if !path.rng.gen_bool(path.loss) {
                    in_net.push((pn, c, buf[..c.len].to_vec()));
                    if path.rng.gen_bool(path.dup) {
                        in_net.push((pn, c, buf[..c.len].to_vec()));
                    }
                }
                pn += 1;
            }
            // Deliver a random subset (reordering).
            let keep = if path.reorder {
                in_net.sort_by_key(|_| path.rng.gen::<u32>());
                in_net.len() / 3
            } else {
                0
            };
            for (p, c, d) in in_net.drain(keep..) {
                largest_rx = largest_rx.max(p);
                rx.on_chunk(c.offset, c.fin, &d).expect("within limit");
                assert!(rx.held() <= window);
            }
            // Read.
            let mut tmp = vec![0u8; read_per_round];
            let n = rx.read(&mut tmp);
            got.extend_from_slice(&tmp[..n]);
            // Acknowledge (loses acks too, at the same rate).
            if !path.rng.gen_bool(path.loss) {
                let a = rx.ack(8);
                let o = tx.on_ack(&a, overtaken(largest_rx), |_| false);
                lost_total += o.lost_chunks;
            }
            // Probe: when nothing can go out, a PING (a packet of its own) reveals the tail.
            if !tx.has_sendable() && tx.is_outstanding() && round % 5 == 0 {
                pn += 1;
                if !path.rng.gen_bool(path.loss) {
                    largest_rx = largest_rx.max(pn);
                }
            }
            assert!(tx.buffered() <= SEND_BUFFER);
            if tx.is_done() && rx.is_finished() {
                return (got, lost_total);
            }
        }
        panic!("did not finish: got {} of {}", got.len(), data.len());
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i * 31 + seed as usize) as u8 ^ (i >> 9) as u8)
            .collect()
    }

    #[test]
    fn lossless_in_order() {
        let data = pattern(100_000, 1);
        let mut p = Path {
            rng: ChaCha8Rng::seed_from_u64(1),
            loss: 0.0,
            dup: 0.0,
            reorder: false,
        };
        let (got, lost) = transfer(&data, &mut p, 1 << 20, RECV_WINDOW);
        assert_eq!(got, data);
        assert_eq!(lost, 0);
    }

    #[test]
    fn lossy_reordered_duplicated_is_byte_exact() {
        for seed in 0..8 {
            let data = pattern(300_000 + seed as usize * 777, seed as u8);
            let mut p = Path {
                rng: ChaCha8Rng::seed_from_u64(seed),
                loss: 0.1,
                dup: 0.05,
                reorder: true,
            };
            let (got, lost) = transfer(&data, &mut p, 1 << 20, RECV_WINDOW);
            assert!(got == data, "seed {seed}");
            assert!(lost > 0);
        }
    }

    #[test]
    fn slow_reader_bounds_memory_and_loses_nothing() {
        let data = pattern(2_000_000, 7);
        let mut p = Path {
            rng: ChaCha8Rng::seed_from_u64(9),
            loss: 0.02,
            dup: 0.0,
            reorder: true,
        };
        // A 64 KiB window, a reader taking 1000 bytes a round.
        let (got, _) = transfer(&data, &mut p, 1000, 64 << 10);
        assert!(got == data);
    }

    #[test]
    fn empty_stream_only_ends() {
        let mut p = Path {
            rng: ChaCha8Rng::seed_from_u64(3),
            loss: 0.3,
            dup: 0.0,
            reorder: true,
        };
        let (got, _) = transfer(&[], &mut p, 100, RECV_WINDOW);
        assert!(got.is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn any_loss_pattern_delivers_exactly(seed in 0u64..1_000_000, len in 0usize..60_000, loss in 0.0f64..0.3, window in 3_000u64..100_000) {
            let data = pattern(len, seed as u8);
            let mut p = Path { rng: ChaCha8Rng::seed_from_u64(seed), loss, dup: 0.02, reorder: true };
            let (got, _) = transfer(&data, &mut p, 2000, window);
            prop_assert!(got == data);
        }
    }

    #[test]
    fn sender_respects_the_limit_and_buffer() {
        let mut tx = StreamSend::new(5000);
        let big = vec![1u8; SEND_BUFFER + 10];
        assert_eq!(tx.write(&big), SEND_BUFFER);
        assert_eq!(tx.room(), 0);
        let mut buf = vec![0u8; 1400];
        let mut sent = 0;
        let mut pn = 0;
        while let Some(c) = tx.next_chunk(1400, pn, &mut buf) {
            sent += c.len;
            pn += 1;
        }
        assert_eq!(sent, 5000);
        assert!(tx.is_blocked() && tx.is_outstanding());
    }

    #[test]
    fn receiver_refuses_beyond_window_and_a_second_end() {
        let mut rx = StreamRecv::new(100);
        assert_eq!(
            rx.on_chunk(90, false, &[0; 20]),
            Err(StreamError::FlowControl)
        );
        assert_eq!(rx.on_chunk(0, true, &[1; 10]), Ok(10));
        assert_eq!(rx.on_chunk(0, true, &[1; 12]), Err(StreamError::BadFin));
        assert_eq!(rx.on_chunk(5, false, &[1; 5]), Ok(0));
        assert!(rx.fin_received());
        assert_eq!(rx.cum(), 11);
        let mut b = [0u8; 64];
        assert_eq!(rx.read(&mut b), 10);
        assert!(rx.is_finished());
    }

    #[test]
    fn ack_maps_gaps_and_tail() {
        let mut rx = StreamRecv::new(1 << 20);
        rx.on_chunk(0, false, &[0; 100]).unwrap();
        rx.on_chunk(200, false, &[0; 100]).unwrap();
        rx.on_chunk(400, false, &[0; 100]).unwrap();
        let a = rx.ack(8);
        assert_eq!(a.map.cum, 100);
        assert_eq!(a.map.top, 500);
        assert_eq!(a.map.gaps, vec![100..200, 300..400]);
        assert_eq!(a.limit, 1 << 20);
        // Only one gap per map: told in two parts.
        let a = rx.ack(1);
        assert_eq!((a.map.start, a.map.end, a.map.gaps.len()), (100, 300, 1));
        let a = rx.ack(1);
        assert_eq!((a.map.start, a.map.end), (300, 500));
        a.map.validate().unwrap();
    }

    #[test]
    fn a_lost_tail_is_found_by_a_later_packet() {
        let mut tx = StreamSend::new(1 << 20);
        tx.write(&[5u8; 3000]);
        tx.finish();
        let mut buf = vec![0u8; 1400];
        let c0 = tx.next_chunk(1400, 0, &mut buf).unwrap();
        let mut rx = StreamRecv::new(1 << 20);
        rx.on_chunk(c0.offset, c0.fin, &buf[..c0.len]).unwrap();
        let _c1 = tx.next_chunk(1400, 1, &mut buf).unwrap();
        let c2 = tx.next_chunk(1400, 2, &mut buf).unwrap();
        assert!(c2.fin && c2.len == 200);
        assert!(tx.next_chunk(1400, 3, &mut buf).is_none());
        // Packets 1 and 2 vanished; a probe (pn 20) was answered.
        let o = tx.on_ack(&rx.ack(8), |pn| pn + 16 <= 20, |_| false);
        assert_eq!(o.newly_acked_bytes, 1400);
        assert_eq!(o.lost_chunks, 2);
        assert_eq!(o.lost_bytes, 1600);
        let r1 = tx.next_chunk(1400, 21, &mut buf).unwrap();
        assert_eq!(
            (r1.offset, r1.len, r1.fin, r1.retx),
            (1400, 1400, false, true)
        );
        let r2 = tx.next_chunk(1400, 22, &mut buf).unwrap();
        assert_eq!(
            (r2.offset, r2.len, r2.fin, r2.retx),
            (2800, 200, true, true)
        );
    }

    #[test]
    fn a_probe_timeout_resends_a_small_flight_at_once() {
        let mut tx = StreamSend::new(1 << 20);
        let mut buf = vec![0u8; 1400];
        tx.write(b"ls\n");
        let c = tx.next_chunk(1400, 0, &mut buf).unwrap();
        assert_eq!((c.offset, c.len), (0, 3));
        assert!(!tx.has_sendable());
        assert_eq!(tx.on_probe_timeout(16), 3);
        let r = tx.next_chunk(1400, 1, &mut buf).unwrap();
        assert_eq!((r.offset, r.len, r.retx), (0, 3, true));
        assert_eq!(&buf[..3], b"ls\n");
        // The first copy arrives after all: acknowledged once, nothing else to send.
        let mut rx = StreamRecv::new(1 << 20);
        rx.on_chunk(0, false, b"ls\n").unwrap();
        let o = tx.on_ack(&rx.ack(8), |_| true, |_| false);
        assert_eq!((o.newly_acked_bytes, o.lost_chunks), (3, 0));
        assert!(!tx.is_outstanding());
        // A bulk flight is left to the acknowledgements.
        tx.write(&vec![1u8; 100_000]);
        let mut pn = 2;
        while tx.next_chunk(1400, pn, &mut buf).is_some() {
            pn += 1;
        }
        assert_eq!(tx.on_probe_timeout(16), 0);
    }

    #[test]
    fn frames_round_trip_and_reject_bad_flags() {
        use crate::wire::{parse_frames, Frame, Writer, FRAME_STREAM};
        let mut rx = StreamRecv::new(1 << 20);
        rx.on_chunk(0, false, &[0; 100]).unwrap();
        rx.on_chunk(300, true, &[0; 100]).unwrap();
        let ack = rx.ack(8);
        let frames = [
            Frame::Stream {
                offset: 70_000,
                fin: true,
                data: b"hello",
            },
            Frame::Stream {
                offset: 0,
                fin: false,
                data: b"",
            },
            Frame::StreamAck(ack.clone()),
        ];
        let mut buf = [0u8; 256];
        let mut w = Writer::new(&mut buf);
        for f in &frames {
            let before = w.pos();
            f.encode(&mut w).unwrap();
            assert_eq!(w.pos() - before, f.encoded_len());
        }
        let n = w.pos();
        let back: Vec<_> = parse_frames(&buf[..n]).map(Result::unwrap).collect();
        assert_eq!(back, frames);
        assert_eq!(ack.map.top, 401);
        // Unknown flag bits: malformed.
        let bad = [FRAME_STREAM, 0x02, 0, 0];
        assert!(parse_frames(&bad).any(|f| f.is_err()));
        // Only part of a long map fits: it ends before the first gap left out.
        let mut small = [0u8; 17];
        let mut w = Writer::new(&mut small);
        let end = Frame::StreamAck(ack.clone());
        if let Frame::StreamAck(a) = &end {
            assert_eq!(a.encode_fitting(&mut w).unwrap(), 100);
        }
    }
}

/// Random schedules of everything a sender and a receiver may see (writes of any size,
/// chunks of any size, loss, reordering, maps told in parts, lost acknowledgements, probe
/// timeouts, a reader of any pace): the sender's books always balance (bytes sent are
/// acknowledged, declared lost, or in a chunk in flight, which is what the session's
/// in-flight count assumes), a sender holding bytes always has something to send or to
/// wait for (else nothing would wake it), and every byte arrives in order.
#[cfg(test)]
mod chaos {
    use super::*;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn run(seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let window = rng.gen_range(5_000u64..200_000);
        let len = rng.gen_range(0usize..400_000);
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + seed as usize) as u8).collect();
        let mut tx = StreamSend::with_capacity(window, rng.gen_range(3_000usize..300_000));
        let mut rx = StreamRecv::new(window);
        let mut got = Vec::new();
        let mut written = 0;
        let mut pn = 0u64;
        let mut net: Vec<(u64, Chunk, Vec<u8>)> = Vec::new();
        let mut largest_rx = 0u64;
        let (mut sent, mut acked, mut lost) = (0u64, 0u64, 0u64);
        let mut buf = vec![0u8; 1400];
        let loss = rng.gen_range(0.0..0.3);
        for round in 0..400_000 {
            let n = rng.gen_range(0..20_000).min(len - written);
            written += tx.write(&data[written..written + n]);
            if written == len && !tx.is_finished() && rng.gen_bool(0.5) {
                tx.finish();
            }
            for _ in 0..rng.gen_range(0..10) {
                let max = rng.gen_range(1..1400);
                let Some(c) = tx.next_chunk(max, pn, &mut buf) else {
                    break;
                };
                sent += c.len as u64;
                if !rng.gen_bool(loss) {
                    net.push((pn, c, buf[..c.len].to_vec()));
                }
                pn += 1;
            }
            net.shuffle(&mut rng);
            let keep = rng.gen_range(0..=net.len());
            for (p, c, d) in net.drain(keep..) {
                largest_rx = largest_rx.max(p);
                rx.on_chunk(c.offset, c.fin, &d).expect("within limit");
            }
            let mut tmp = vec![0u8; rng.gen_range(0..30_000)];
            let k = rx.read(&mut tmp);
            got.extend_from_slice(&tmp[..k]);
            if rng.gen_bool(0.7) {
                let a = rx.ack(rng.gen_range(1..6));
                if !rng.gen_bool(loss) {
                    let o = tx.on_ack(&a, |p| p + 8 <= largest_rx, |_| false);
                    acked += o.newly_acked_bytes;
                    lost += o.lost_bytes;
                }
            }
            if rng.gen_bool(0.05) {
                lost += tx.on_probe_timeout(16);
                // The probe itself: a packet of its own that arrives, later than the rest.
                pn += 1;
                if !rng.gen_bool(loss) {
                    largest_rx = largest_rx.max(pn - 1);
                }
            }
            let in_chunks: u64 = tx
                .in_flight
                .iter()
                .map(|(&s, c)| c.end.min(tx.written).saturating_sub(s))
                .sum();
            assert_eq!(sent - acked - lost, in_chunks, "seed {seed} round {round}");
            if tx.is_finished() && tx.is_done() && rx.is_finished() {
                assert!(got == data, "seed {seed}");
                return;
            }
            // Nothing can stall: something is in flight, queued, or waits for window.
            let pending_data = tx.written > tx.base || (tx.fin && !tx.is_done());
            if pending_data {
                assert!(
                    tx.has_sendable() || tx.is_outstanding() || !net.is_empty(),
                    "seed {seed} round {round}: stalled at {} of {} (sent to {}, limit {})",
                    tx.base,
                    tx.written,
                    tx.next_new,
                    tx.limit
                );
            }
        }
        panic!(
            "seed {seed}: did not finish: {} of {len} read, {} acknowledged",
            got.len(),
            tx.base
        );
    }

    #[test]
    fn random_schedules_balance_the_books_and_never_stall() {
        for seed in 0..1000 {
            run(seed);
        }
    }
}
