//! Byte layouts of docs/PROTOCOL.md: hellos, the sealed-packet header and the frames inside
//! sealed packets. Everything here is allocation-free except decoding a LOSSMAP's gap list.

use std::ops::Range;

/// 2: 4-byte cids and packet numbers in the sealed header, 6-byte block numbers.
/// 3: `Ready` says where an `INTO_DIR` offer's file goes.
/// 5: HelloRetry and the ClientHello's retry token; PATH_CHALLENGE / PATH_RESPONSE frames.
/// 6: delta transfers and verified resume (`WantSums` / `Sums` messages).
/// 7: the tunnel's byte stream: STREAM / STREAM_ACK frames, `Tunnel` / `TunnelReply` control
///    messages.
/// 8: `MetaOp::Remove` (`cp -r --delete`).
/// 9: the control stream selectively acknowledged (STREAM_ACK for stream 1).
/// 10: the sharing policy in `Params`.
/// 11: hellos padded to the MTU they offer or agree: the padding proves the path carries it;
///     ACK's `store_room` (the receiver's storage window).
/// 12: control bytes paced and counted; `Ready`'s `parts` (blocks held in part).
/// 13: `Compared`: a delta's receiver lets blocks flow as its comparison goes.
pub const VERSION: u8 = 13;
/// The first three bytes of every hello (ClientHello, ServerHello, HelloReject, HelloRetry):
/// ASCII `HYT`.
pub const MAGIC: [u8; 3] = *b"HYT";
/// Size of a ClientHello's fields, bytes. On the wire it is zero-padded further, to the
/// largest UDP payload of the MTU it offers ([`hello_datagram_len`]): a hello that arrives
/// proves the path carries datagrams that big. Every reply is at most as big as the hello
/// it answers (no amplification).
pub const CLIENT_HELLO_LEN: usize = 1200;
/// Size of a ServerHello's fields, bytes; zero-padded on the wire to the largest UDP payload
/// of the MTU it agrees, which proves the way back.
pub const SERVER_HELLO_LEN: usize = 120;
/// Size of a HelloReject, bytes (the same in every version).
pub const HELLO_REJECT_LEN: usize = 48;
/// Magic, kind, version, client cid slot, client random, token.
pub const HELLO_RETRY_LEN: usize = 5 + 8 + 32 + RETRY_TOKEN_LEN;
/// A server's address-validation token (see [`HelloRetry`]).
pub const RETRY_TOKEN_LEN: usize = 32;
/// A path challenge's random (see `Frame::PathChallenge`).
pub const PATH_TOKEN_LEN: usize = 8;
/// kind u8, dest_cid u32, pn u32 (the low half of the packet number; see [`decode_pn`]).
pub const SEALED_HEADER_LEN: usize = 9;
/// The AES-256-GCM tag at the end of every sealed packet, bytes.
pub const TAG_LEN: usize = 16;
/// DATA frame header: type u8, xfer u32, block u48.
pub const DATA_HEADER_LEN: usize = 11;
/// Block numbers must be below this (6 bytes on the wire): files up to ~400 PB.
pub const BLOCK_LIMIT: u64 = 1 << 48;
/// Smallest `mtu` (largest IP packet, bytes) either side may announce in its hello.
pub const MIN_MTU: u16 = 1280;
/// Largest value a QUIC varint can carry.
pub const MAX_VARINT: u64 = (1 << 62) - 1;

// Packet kinds: the byte after the magic in a hello, the first byte of a sealed packet.
pub(crate) const KIND_CLIENT_HELLO: u8 = 0x01;
pub(crate) const KIND_SERVER_HELLO: u8 = 0x02;
pub(crate) const KIND_SEALED: u8 = 0x03;
pub(crate) const KIND_HELLO_REJECT: u8 = 0x04;
pub(crate) const KIND_HELLO_RETRY: u8 = 0x05;

// Frame types: the first byte of each frame in a sealed packet's plaintext.
pub(crate) const FRAME_PADDING: u8 = 0x00;
pub(crate) const FRAME_PING: u8 = 0x01;
pub(crate) const FRAME_ACK: u8 = 0x02;
pub(crate) const FRAME_CTRL: u8 = 0x03;
pub(crate) const FRAME_DATA: u8 = 0x04;
pub(crate) const FRAME_LOSSMAP: u8 = 0x05;
pub(crate) const FRAME_CLOSE: u8 = 0x06;
pub(crate) const FRAME_PATH_CHALLENGE: u8 = 0x07;
pub(crate) const FRAME_PATH_RESPONSE: u8 = 0x08;
pub(crate) const FRAME_STREAM: u8 = 0x09;
pub(crate) const FRAME_STREAM_ACK: u8 = 0x0a;
/// STREAM frame flag: the chunk ends the stream (its end is the stream's end).
pub(crate) const STREAM_FIN: u8 = 0x01;

/// Connection id: chosen by each side for the packets it receives, routed on before opening.
pub type Cid = u32;

/// The first byte of every sealed packet (its kind).
pub const SEALED_KIND_BYTE: u8 = KIND_SEALED;
/// Where a sealed packet carries its destination cid's low byte (the cid is big-endian at
/// bytes 1-4): a server spreading its sessions over threads routes on it ([`CidShard`])
/// before anything is opened, in the kernel.
pub const SEALED_CID_LOW_BYTE_AT: usize = 4;

/// One of `count` threads that share a server's port: it draws the cids of the sessions it
/// serves so that their low byte is `index` modulo `count`, and the kernel hands it their
/// sealed packets (a socket filter reads that byte, [`SEALED_CID_LOW_BYTE_AT`]). A cid is
/// still random in its other 30-odd bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CidShard {
    index: u8,
    count: u8,
}

impl CidShard {
    /// The only thread: every cid.
    pub const ALL: CidShard = CidShard { index: 0, count: 1 };

    /// Thread `index` of `count` (`count` from 1 to 64, `index` below it).
    pub fn new(index: u8, count: u8) -> Option<CidShard> {
        ((1..=64).contains(&count) && index < count).then_some(CidShard { index, count })
    }

    /// The number of threads.
    pub fn count(self) -> u8 {
        self.count
    }

    /// Which thread serves `cid`.
    pub fn of(cid: Cid, count: u8) -> u8 {
        (cid as u8) % count.max(1)
    }

    /// `cid` moved into this thread's class (its low byte's residue replaced).
    pub fn place(self, cid: Cid) -> Cid {
        let (low, count) = (cid & 0xff, Cid::from(self.count));
        let mut placed = low - low % count + Cid::from(self.index);
        if placed > 0xff {
            placed -= count; // the class's last member under 256
        }
        (cid & !0xff) | placed
    }
}

/// The address family of a session's UDP flow: it sets the IP header's size, and so how
/// many file bytes a datagram of a given MTU carries ([`block_size`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrFamily {
    /// IPv4: 28 bytes of IP and UDP headers.
    V4,
    /// IPv6: 48 bytes of IP and UDP headers.
    V6,
}

impl AddrFamily {
    /// The family of a flow to or from `addr`.
    pub fn of(addr: &std::net::SocketAddr) -> Self {
        if addr.is_ipv4() {
            AddrFamily::V4
        } else {
            AddrFamily::V6
        }
    }

    /// Bytes of IP and UDP headers in front of each datagram.
    pub fn header_len(self) -> usize {
        match self {
            AddrFamily::V4 => 28,
            AddrFamily::V6 => 48,
        }
    }
}

/// Largest UDP payload for an IP packet of `mtu` bytes (IP + UDP headers subtracted).
pub fn udp_payload_limit(mtu: u16, fam: AddrFamily) -> usize {
    (mtu as usize).saturating_sub(fam.header_len())
}

/// Length of a hello datagram that offers or agrees `mtu`: the largest UDP payload of an IP
/// packet that size, at least the hello's fields ([`CLIENT_HELLO_LEN`]).
pub fn hello_datagram_len(mtu: u16, fam: AddrFamily) -> usize {
    udp_payload_limit(mtu, fam).max(CLIENT_HELLO_LEN)
}

/// The largest MTU that a datagram of `len` bytes of UDP payload proves the path carries.
pub fn mtu_proven_by(len: usize, fam: AddrFamily) -> u16 {
    (len + fam.header_len()).min(u16::MAX as usize) as u16
}

/// File bytes per DATA block: what is left of a full datagram after the sealed header, the
/// tag and the DATA frame header.
pub fn block_size(mtu: u16, fam: AddrFamily) -> usize {
    udp_payload_limit(mtu, fam).saturating_sub(SEALED_HEADER_LEN + TAG_LEN + DATA_HEADER_LEN)
}

/// Why bytes could not be decoded, or a value could not be encoded. A datagram that fails
/// to decode is dropped and counted, never answered (`docs/PROTOCOL.md`).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The input ended before the layout did.
    #[error("truncated")]
    Truncated,
    /// A hello does not start with [`MAGIC`].
    #[error("bad magic")]
    BadMagic,
    /// The packet kind byte is none of the known kinds (or not the kind being decoded).
    #[error("unknown packet kind {0:#04x}")]
    UnknownKind(u8),
    /// A hello of another protocol version than [`VERSION`].
    #[error("unsupported version {0}")]
    UnsupportedVersion(u8),
    /// A frame type byte that names no frame: the whole packet is malformed.
    #[error("unknown frame type {0:#04x}")]
    UnknownFrame(u8),
    /// A field out of its range or breaking an invariant (named in the message).
    #[error("bad value: {0}")]
    BadValue(&'static str),
    /// Bytes after the end of a fixed-size layout.
    #[error("trailing bytes")]
    TrailingBytes,
    /// Encoding: the output buffer is too small (nothing was written).
    #[error("no space left in the output buffer")]
    NoSpace,
}

/// What a datagram is, from its first bytes ([`peek_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketKind {
    /// A [`ClientHello`] (client → server), kind `0x01`.
    ClientHello,
    /// A [`ServerHello`] (server → client), kind `0x02`.
    ServerHello,
    /// A sealed packet of an established session, kind `0x03`: header, AEAD-sealed frames,
    /// tag.
    Sealed,
    /// A [`HelloReject`] (server → client), kind `0x04`.
    HelloReject,
    /// A [`HelloRetry`] (server → client), kind `0x05`.
    HelloRetry,
}

/// Classifies a datagram without validating more than its first bytes. A sealed packet must
/// at least hold a header and a tag; hellos are checked for magic here and fully by `decode`.
pub fn peek_kind(datagram: &[u8]) -> Result<PacketKind, WireError> {
    match datagram.first() {
        None => Err(WireError::Truncated),
        Some(&KIND_SEALED) => {
            if datagram.len() >= SEALED_HEADER_LEN + TAG_LEN {
                Ok(PacketKind::Sealed)
            } else {
                Err(WireError::Truncated)
            }
        }
        Some(_) => {
            if datagram.len() < 4 {
                return Err(if MAGIC.starts_with(datagram) {
                    WireError::Truncated
                } else {
                    WireError::BadMagic
                });
            }
            if datagram[..3] != MAGIC {
                return Err(WireError::BadMagic);
            }
            match datagram[3] {
                KIND_CLIENT_HELLO => Ok(PacketKind::ClientHello),
                KIND_SERVER_HELLO => Ok(PacketKind::ServerHello),
                KIND_HELLO_REJECT => Ok(PacketKind::HelloReject),
                KIND_HELLO_RETRY => Ok(PacketKind::HelloRetry),
                k => Err(WireError::UnknownKind(k)),
            }
        }
    }
}

fn sealed_header(datagram: &[u8]) -> Result<&[u8; SEALED_HEADER_LEN], WireError> {
    if datagram.len() < SEALED_HEADER_LEN + TAG_LEN {
        return Err(WireError::Truncated);
    }
    if datagram[0] != KIND_SEALED {
        return Err(WireError::UnknownKind(datagram[0]));
    }
    Ok(datagram[..SEALED_HEADER_LEN]
        .try_into()
        .expect("length checked"))
}

/// Destination connection id of a sealed packet (used to route it before opening).
pub fn sealed_dest_cid(datagram: &[u8]) -> Result<Cid, WireError> {
    let h = sealed_header(datagram)?;
    Ok(u32::from_be_bytes(h[1..5].try_into().expect("4 bytes")))
}

/// The low 32 bits of a sealed packet's number (unauthenticated until the packet opens);
/// [`decode_pn`] recovers the whole number.
pub fn sealed_pn_bits(datagram: &[u8]) -> Result<u32, WireError> {
    let h = sealed_header(datagram)?;
    Ok(u32::from_be_bytes(h[5..9].try_into().expect("4 bytes")))
}

/// The full packet number whose low 32 bits are `bits` and which lies closest to `expected`
/// (one past the highest authenticated pn), as in RFC 9000 A.3. Half the space either side
/// is far more than any reordering; a wrong guess only makes the packet fail to open.
pub fn decode_pn(bits: u32, expected: u64) -> u64 {
    const WIN: u64 = 1 << 32;
    const HALF: u64 = WIN / 2;
    let candidate = (expected & !(WIN - 1)) | u64::from(bits);
    if candidate.saturating_add(HALF) <= expected && candidate < u64::MAX - WIN {
        candidate + WIN
    } else if candidate > expected.saturating_add(HALF) && candidate >= WIN {
        candidate - WIN
    } else {
        candidate
    }
}

/// Writes the sealed header: kind, `dest_cid` and the low 32 bits of `pn`. Panics if `buf`
/// is shorter than `SEALED_HEADER_LEN` (caller bug).
pub fn write_sealed_header(buf: &mut [u8], dest_cid: Cid, pn: u64) {
    let h = &mut buf[..SEALED_HEADER_LEN];
    h[0] = KIND_SEALED;
    h[1..5].copy_from_slice(&dest_cid.to_be_bytes());
    h[5..9].copy_from_slice(&(pn as u32).to_be_bytes());
}

/// Writes a DATA frame header at the start of `buf`; the caller places the payload right
/// after it (`buf[DATA_HEADER_LEN..]`) without an intermediate copy. Panics if `buf` is
/// shorter than `DATA_HEADER_LEN` or `block >= BLOCK_LIMIT` (caller bugs: transfers of more
/// blocks are refused when offered).
pub fn write_data_header(buf: &mut [u8], xfer: u32, block: u64) {
    assert!(block < BLOCK_LIMIT, "block {block} does not fit 6 bytes");
    let h = &mut buf[..DATA_HEADER_LEN];
    h[0] = FRAME_DATA;
    h[1..5].copy_from_slice(&xfer.to_be_bytes());
    h[5..11].copy_from_slice(&block.to_be_bytes()[2..]);
}

/// Bytes a STREAM frame takes before its data: type, flags, offset, length.
pub(crate) fn stream_header_len(offset: u64, len: usize) -> usize {
    2 + varint_len(offset) + varint_len(len as u64)
}

/// Encoded size of `v` as a QUIC varint (8 for values too large to encode, which
/// [`Writer::put_varint`] rejects).
pub fn varint_len(v: u64) -> usize {
    if v < (1 << 6) {
        1
    } else if v < (1 << 14) {
        2
    } else if v < (1 << 30) {
        4
    } else {
        8
    }
}

/// Cursor writer over a caller buffer; every put returns `Err(NoSpace)` instead of panicking,
/// and writes nothing when it fails.
pub struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    /// A writer at the start of `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }

    /// Bytes written so far (the offset of the next byte in the buffer).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left in the buffer.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The bytes written so far.
    pub fn written(&self) -> &[u8] {
        &self.buf[..self.pos]
    }

    fn take(&mut self, n: usize) -> Result<&mut [u8], WireError> {
        if self.remaining() < n {
            return Err(WireError::NoSpace);
        }
        let s = &mut self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Writes one byte.
    pub fn put_u8(&mut self, v: u8) -> Result<(), WireError> {
        self.take(1)?[0] = v;
        Ok(())
    }

    /// Writes `v` big-endian, 2 bytes.
    pub fn put_u16(&mut self, v: u16) -> Result<(), WireError> {
        self.put_bytes(&v.to_be_bytes())
    }

    /// Writes `v` big-endian, 4 bytes.
    pub fn put_u32(&mut self, v: u32) -> Result<(), WireError> {
        self.put_bytes(&v.to_be_bytes())
    }

    /// Writes `v` big-endian, 8 bytes.
    pub fn put_u64(&mut self, v: u64) -> Result<(), WireError> {
        self.put_bytes(&v.to_be_bytes())
    }

    /// The low 6 bytes of `v` (the caller checks that it fits).
    pub fn put_u48(&mut self, v: u64) -> Result<(), WireError> {
        self.put_bytes(&v.to_be_bytes()[2..])
    }

    /// Writes `v` as a QUIC varint (RFC 9000 §16) in [`varint_len`] bytes;
    /// `Err(BadValue)` above [`MAX_VARINT`].
    pub fn put_varint(&mut self, v: u64) -> Result<(), WireError> {
        if v > MAX_VARINT {
            return Err(WireError::BadValue("varint out of range"));
        }
        match varint_len(v) {
            1 => self.put_u8(v as u8),
            2 => self.put_u16(v as u16 | 0x4000),
            4 => self.put_u32(v as u32 | 0x8000_0000),
            _ => self.put_u64(v | 0xc000_0000_0000_0000),
        }
    }

    /// Writes `b` as it is.
    pub fn put_bytes(&mut self, b: &[u8]) -> Result<(), WireError> {
        self.take(b.len())?.copy_from_slice(b);
        Ok(())
    }
}

/// Cursor reader; every get returns `Err(Truncated)` if the input runs out.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let (head, rest) = self
            .buf
            .split_first_chunk::<N>()
            .ok_or(WireError::Truncated)?;
        self.buf = rest;
        Ok(*head)
    }

    /// Reads one byte.
    pub fn get_u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    /// Reads a big-endian u16.
    pub fn get_u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    /// Reads a big-endian u32.
    pub fn get_u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    /// Reads a big-endian u64.
    pub fn get_u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// Reads a big-endian 6-byte number (a DATA frame's block number).
    pub fn get_u48(&mut self) -> Result<u64, WireError> {
        let mut b = [0u8; 8];
        b[2..].copy_from_slice(&self.array::<6>()?);
        Ok(u64::from_be_bytes(b))
    }

    /// Reads a QUIC varint (RFC 9000 §16).
    pub fn get_varint(&mut self) -> Result<u64, WireError> {
        let first = *self.buf.first().ok_or(WireError::Truncated)?;
        let len = 1usize << (first >> 6);
        if self.buf.len() < len {
            return Err(WireError::Truncated);
        }
        let mut v = u64::from(first & 0x3f);
        for &b in &self.buf[1..len] {
            v = (v << 8) | u64::from(b);
        }
        self.buf = &self.buf[len..];
        Ok(v)
    }

    /// Takes the next `n` bytes, borrowed from the input.
    pub fn get_bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// Takes everything that is left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
}

/// ACK: what a side has received from its peer and how its receive path is doing; the
/// sender's RTT and delivery-rate samples come from it (`docs/PROTOCOL.md`, ACK). Every field
/// is a varint on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckFrame {
    /// Highest packet number received from the peer.
    pub largest_pn: u64,
    /// µs between `largest_pn` arriving at the receiver's host (its kernel timestamp where
    /// there is one) and this ACK being sent: the deliberate delay plus the receiver's backlog.
    pub ack_delay_us: u64,
    /// Every control-stream byte below this offset has been received.
    pub ctrl_offset: u64,
    /// DATA (and tunnel stream) payload bytes received in this session, duplicates excluded.
    pub rx_bytes: u64,
    /// When the last bytes counted in `rx_bytes` arrived at the receiver's host, µs since its
    /// session start.
    pub rx_time_us: u64,
    /// Bytes waiting in the receiver's socket buffer, and the buffer's size, both as the
    /// kernel counts them (overhead included; size 0: unknown).
    pub rx_buffered: u64,
    /// The receiver's socket receive buffer size, in `rx_buffered`'s units; 0: unknown.
    pub rx_buffer: u64,
    /// Datagrams the receiver's OS dropped (socket buffer full), in total.
    pub rx_drops: u64,
    /// File bytes the receiver's storage takes now, whatever the transfer: the sender keeps
    /// no more in flight ([`MAX_VARINT`]: no limit).
    pub store_room: u64,
}

impl AckFrame {
    fn fields(&self) -> [u64; 9] {
        [
            self.largest_pn,
            self.ack_delay_us,
            self.ctrl_offset,
            self.rx_bytes,
            self.rx_time_us,
            self.rx_buffered,
            self.rx_buffer,
            self.rx_drops,
            self.store_room,
        ]
    }
}

/// A receiver's view of one incoming transfer. `gaps` are ABSOLUTE block ranges (missing
/// blocks), sorted, disjoint, non-empty and within `[start, end)`;
/// `cum <= start <= end <= top`. `top` is one past the highest block received: nothing at or
/// above it has arrived, which lets the sender find losses at the tail.
/// On the wire they are deltas (PROTOCOL.md, LOSSMAP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LossMapFrame {
    /// The transfer (or, in a [`StreamAckFrame`], the stream) this map is about.
    pub xfer: u32,
    /// Every block below `cum` has been received.
    pub cum: u64,
    /// One past the highest block received: no block at or above it has arrived.
    pub top: u64,
    /// First block this map covers (`>= cum`).
    pub start: u64,
    /// One past the last block this map covers.
    pub end: u64,
    /// The missing runs within `[start, end)`, absolute block ranges; every other block of
    /// `[start, end)` has been received.
    pub gaps: Vec<Range<u64>>,
}

impl LossMapFrame {
    /// Checks the invariants the decoder enforces, so we never send what the peer rejects.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.cum > self.start || self.start > self.end || self.end > self.top {
            return Err(WireError::BadValue("lossmap bounds"));
        }
        if self.top > MAX_VARINT {
            return Err(WireError::BadValue("varint out of range"));
        }
        let mut prev = self.start;
        for g in &self.gaps {
            if g.start >= g.end {
                return Err(WireError::BadValue("empty gap"));
            }
            if g.start < prev {
                return Err(WireError::BadValue("gaps unsorted or overlapping"));
            }
            if g.end > self.end {
                return Err(WireError::BadValue("gap outside the map"));
            }
            prev = g.end;
        }
        Ok(())
    }

    fn gap_len(prev_end: u64, g: &Range<u64>) -> usize {
        varint_len(g.start.saturating_sub(prev_end)) + varint_len(g.end.saturating_sub(g.start))
    }

    fn head_len(&self, lead: &[u8]) -> usize {
        lead.len()
            + varint_len(u64::from(self.xfer))
            + varint_len(self.cum)
            + varint_len(self.top)
            + varint_len(self.start)
    }

    /// Bytes the whole frame takes, type byte included.
    pub fn encoded_len(&self) -> usize {
        self.encoded_len_after(&[FRAME_LOSSMAP])
    }

    fn encoded_len_after(&self, lead: &[u8]) -> usize {
        let mut n = self.head_len(lead) + varint_len(self.end) + varint_len(self.gaps.len() as u64);
        let mut prev = self.start;
        for g in &self.gaps {
            n += Self::gap_len(prev, g);
            prev = g.end;
        }
        n
    }

    fn encode_prefix(
        &self,
        w: &mut Writer,
        end: u64,
        ngaps: usize,
        lead: &[u8],
    ) -> Result<(), WireError> {
        let mut tmp = [0u8; 16 + 6 * 8];
        let mut hw = Writer::new(&mut tmp);
        hw.put_bytes(lead)?;
        for v in [
            u64::from(self.xfer),
            self.cum,
            self.top,
            self.start,
            end,
            ngaps as u64,
        ] {
            hw.put_varint(v)?;
        }
        let need = hw.pos()
            + self.gaps[..ngaps]
                .iter()
                .scan(self.start, |prev, g| {
                    let l = Self::gap_len(*prev, g);
                    *prev = g.end;
                    Some(l)
                })
                .sum::<usize>();
        if w.remaining() < need {
            return Err(WireError::NoSpace);
        }
        w.put_bytes(hw.written())?;
        let mut prev = self.start;
        for g in &self.gaps[..ngaps] {
            w.put_varint(g.start - prev)?;
            w.put_varint(g.end - g.start)?;
            prev = g.end;
        }
        Ok(())
    }

    /// Writes the whole map, or nothing (`Err`) if it is invalid or does not fit.
    pub fn encode(&self, w: &mut Writer) -> Result<(), WireError> {
        self.validate()?;
        self.encode_prefix(w, self.end, self.gaps.len(), &[FRAME_LOSSMAP])
    }

    /// Writes as many leading gaps as fit in `w`. If some are left out, the map written ends
    /// at the start of the first one left out, so it still states only facts. Returns the
    /// `end` actually written (`self.end` if every gap fit). `Err(NoSpace)` if not even an
    /// empty map fits; nothing is written on error.
    pub fn encode_fitting(&self, w: &mut Writer) -> Result<u64, WireError> {
        self.encode_fitting_after(w, &[FRAME_LOSSMAP])
    }

    /// [`LossMapFrame::encode_fitting`] behind `lead` (a frame type and any fields before
    /// the map's own).
    fn encode_fitting_after(&self, w: &mut Writer, lead: &[u8]) -> Result<u64, WireError> {
        self.validate()?;
        let room = w.remaining();
        let head = self.head_len(lead);
        // The size strictly grows with k (each gap adds >= 2 bytes, and end/count never
        // shrink), so the first k that does not fit ends the search.
        let mut best: Option<(usize, u64)> = None;
        let mut gaps_len = 0usize;
        let mut prev = self.start;
        for k in 0..=self.gaps.len() {
            let end = self.gaps.get(k).map_or(self.end, |g| g.start);
            if head + varint_len(end) + varint_len(k as u64) + gaps_len > room {
                break;
            }
            best = Some((k, end));
            if let Some(g) = self.gaps.get(k) {
                gaps_len += Self::gap_len(prev, g);
                prev = g.end;
            }
        }
        let (k, end) = best.ok_or(WireError::NoSpace)?;
        self.encode_prefix(w, end, k, lead)?;
        Ok(end)
    }

    fn decode(r: &mut Reader) -> Result<Self, WireError> {
        let xfer =
            u32::try_from(r.get_varint()?).map_err(|_| WireError::BadValue("xfer out of range"))?;
        let cum = r.get_varint()?;
        let top = r.get_varint()?;
        let start = r.get_varint()?;
        let end = r.get_varint()?;
        if cum > start || start > end || end > top {
            return Err(WireError::BadValue("lossmap bounds"));
        }
        let n = r.get_varint()?;
        // Each gap takes at least two bytes: refuse counts the packet cannot hold before
        // allocating for them.
        if n > (r.remaining() / 2) as u64 {
            return Err(WireError::Truncated);
        }
        let mut gaps = Vec::with_capacity(n as usize);
        let mut prev = start;
        for _ in 0..n {
            let delta = r.get_varint()?;
            let len = r.get_varint()?;
            if len == 0 {
                return Err(WireError::BadValue("empty gap"));
            }
            let gs = prev
                .checked_add(delta)
                .ok_or(WireError::BadValue("gap outside the map"))?;
            let ge = gs
                .checked_add(len)
                .ok_or(WireError::BadValue("gap outside the map"))?;
            if ge > end {
                return Err(WireError::BadValue("gap outside the map"));
            }
            gaps.push(gs..ge);
            prev = ge;
        }
        Ok(LossMapFrame {
            xfer,
            cum,
            top,
            start,
            end,
            gaps,
        })
    }
}

/// The receiver's view of the tunnel's byte stream (`crate::stream`): its flow-control limit
/// and, as a loss map over stream positions instead of blocks, what it holds. `map.xfer` is
/// the stream's id (0: the one tunnel stream). A position is a byte offset; the end of the
/// stream (FIN) takes one position of its own, after the last byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamAckFrame {
    /// The sender may send stream bytes below this offset.
    pub limit: u64,
    /// What the receiver holds, over stream positions.
    pub map: LossMapFrame,
}

impl StreamAckFrame {
    fn lead(&self) -> ([u8; 9], usize) {
        let mut b = [0u8; 9];
        let mut w = Writer::new(&mut b);
        w.put_u8(FRAME_STREAM_ACK).expect("fits");
        w.put_varint(self.limit.min(MAX_VARINT)).expect("fits");
        let n = w.pos();
        (b, n)
    }

    /// Bytes the whole frame takes, type byte included.
    pub fn encoded_len(&self) -> usize {
        let (_, n) = self.lead();
        self.map.encoded_len_after(&[0u8; 9][..n])
    }

    /// Writes the whole frame, or nothing (`Err`).
    pub fn encode(&self, w: &mut Writer) -> Result<(), WireError> {
        if self.limit > MAX_VARINT {
            return Err(WireError::BadValue("varint out of range"));
        }
        self.map.validate()?;
        let (b, n) = self.lead();
        self.map
            .encode_prefix(w, self.map.end, self.map.gaps.len(), &b[..n])
    }

    /// As [`LossMapFrame::encode_fitting`]: as many leading gaps as fit; returns the `end`
    /// written.
    pub fn encode_fitting(&self, w: &mut Writer) -> Result<u64, WireError> {
        if self.limit > MAX_VARINT {
            return Err(WireError::BadValue("varint out of range"));
        }
        let (b, n) = self.lead();
        self.map.encode_fitting_after(w, &b[..n])
    }

    fn decode(r: &mut Reader) -> Result<Self, WireError> {
        let limit = r.get_varint()?;
        let map = LossMapFrame::decode(r)?;
        Ok(StreamAckFrame { limit, map })
    }
}

/// One frame of a sealed packet's plaintext, borrowing its bytes from the packet
/// (`docs/PROTOCOL.md`, Frames).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Ends the frame list; the rest of the packet is zeros. Encodes as a single zero byte.
    Padding,
    /// Asks the peer for an immediate ACK.
    Ping,
    /// What the sender of the frame has received (see [`AckFrame`]).
    Ack(AckFrame),
    /// Bytes of the reliable control stream.
    Ctrl {
        /// Stream offset of `data`'s first byte.
        offset: u64,
        /// The bytes (length-prefixed on the wire).
        data: &'a [u8],
    },
    /// Payload runs to the end of the packet, so DATA must be the last frame.
    Data {
        /// The transfer the block belongs to.
        xfer: u32,
        /// Block number (below [`BLOCK_LIMIT`]): the file bytes at `block × block_size`.
        block: u64,
        /// The block's file bytes.
        payload: &'a [u8],
    },
    /// A receiver's view of one incoming transfer (see [`LossMapFrame`]).
    LossMap(LossMapFrame),
    /// Ends the session at once.
    Close {
        /// 0: a normal close; anything else an error.
        code: u64,
        /// Why, in words (UTF-8).
        reason: &'a str,
    },
    /// Asks the peer to echo `token` in a PATH_RESPONSE (RFC 9000 section 8.2): sent by a
    /// server to a client's new address before it moves the session there.
    PathChallenge([u8; PATH_TOKEN_LEN]),
    /// The echo of a PATH_CHALLENGE's token, from the address being validated.
    PathResponse([u8; PATH_TOKEN_LEN]),
    /// Bytes of the tunnel's stream at `offset`; `fin`: they end it (an empty chunk may carry
    /// only the end).
    Stream {
        /// Stream position of `data`'s first byte.
        offset: u64,
        /// The stream ends right after `data`.
        fin: bool,
        /// The bytes (length-prefixed on the wire).
        data: &'a [u8],
    },
    /// The receiver's acknowledgement and flow-control limit of the tunnel's stream.
    StreamAck(StreamAckFrame),
}

impl Frame<'_> {
    /// Whether a packet carrying this frame asks the peer for an acknowledgement.
    pub fn is_ack_eliciting(&self) -> bool {
        matches!(
            self,
            Frame::Ping
                | Frame::Ctrl { .. }
                | Frame::Data { .. }
                | Frame::PathChallenge(_)
                | Frame::Stream { .. }
        )
    }

    /// Bytes the frame takes, type byte included.
    pub fn encoded_len(&self) -> usize {
        match self {
            Frame::Padding | Frame::Ping => 1,
            Frame::Ack(a) => 1 + a.fields().iter().map(|&v| varint_len(v)).sum::<usize>(),
            Frame::Ctrl { offset, data } => {
                1 + varint_len(*offset) + varint_len(data.len() as u64) + data.len()
            }
            Frame::Data { payload, .. } => DATA_HEADER_LEN + payload.len(),
            Frame::LossMap(m) => m.encoded_len(),
            Frame::Close { code, reason } => {
                1 + varint_len(*code) + varint_len(reason.len() as u64) + reason.len()
            }
            Frame::PathChallenge(_) | Frame::PathResponse(_) => 1 + PATH_TOKEN_LEN,
            Frame::Stream { offset, data, .. } => {
                stream_header_len(*offset, data.len()) + data.len()
            }
            Frame::StreamAck(a) => a.encoded_len(),
        }
    }

    /// Appends this frame to `w`. On error nothing is written.
    pub fn encode(&self, w: &mut Writer) -> Result<(), WireError> {
        if let Frame::LossMap(m) = self {
            return m.encode(w);
        }
        if let Frame::StreamAck(a) = self {
            return a.encode(w);
        }
        match self {
            Frame::Ack(a) if a.fields().iter().any(|&v| v > MAX_VARINT) => {
                return Err(WireError::BadValue("varint out of range"))
            }
            Frame::Ctrl { offset, data }
                if offset.saturating_add(data.len() as u64) > MAX_VARINT =>
            {
                return Err(WireError::BadValue("ctrl offset out of range"))
            }
            Frame::Close { code, .. } if *code > MAX_VARINT => {
                return Err(WireError::BadValue("varint out of range"))
            }
            Frame::Data { block, .. } if *block >= BLOCK_LIMIT => {
                return Err(WireError::BadValue("block number out of range"))
            }
            Frame::Stream { offset, data, .. }
                if offset.saturating_add(data.len() as u64) >= MAX_VARINT =>
            {
                return Err(WireError::BadValue("stream offset out of range"))
            }
            _ => {}
        }
        if w.remaining() < self.encoded_len() {
            return Err(WireError::NoSpace);
        }
        match self {
            Frame::Padding => w.put_u8(FRAME_PADDING),
            Frame::Ping => w.put_u8(FRAME_PING),
            Frame::Ack(a) => {
                w.put_u8(FRAME_ACK)?;
                a.fields().iter().try_for_each(|&v| w.put_varint(v))
            }
            Frame::Ctrl { offset, data } => {
                w.put_u8(FRAME_CTRL)?;
                w.put_varint(*offset)?;
                w.put_varint(data.len() as u64)?;
                w.put_bytes(data)
            }
            Frame::Data {
                xfer,
                block,
                payload,
            } => {
                w.put_u8(FRAME_DATA)?;
                w.put_u32(*xfer)?;
                w.put_u48(*block)?;
                w.put_bytes(payload)
            }
            Frame::Close { code, reason } => {
                w.put_u8(FRAME_CLOSE)?;
                w.put_varint(*code)?;
                w.put_varint(reason.len() as u64)?;
                w.put_bytes(reason.as_bytes())
            }
            Frame::PathChallenge(t) => {
                w.put_u8(FRAME_PATH_CHALLENGE)?;
                w.put_bytes(t)
            }
            Frame::PathResponse(t) => {
                w.put_u8(FRAME_PATH_RESPONSE)?;
                w.put_bytes(t)
            }
            Frame::Stream { offset, fin, data } => {
                w.put_u8(FRAME_STREAM)?;
                w.put_u8(if *fin { STREAM_FIN } else { 0 })?;
                w.put_varint(*offset)?;
                w.put_varint(data.len() as u64)?;
                w.put_bytes(data)
            }
            Frame::LossMap(_) | Frame::StreamAck(_) => unreachable!("handled above"),
        }
    }
}

/// Iterates over the frames of an opened packet's plaintext.
pub fn parse_frames(plain: &[u8]) -> FrameIter<'_> {
    FrameIter {
        r: Reader::new(plain),
        done: false,
    }
}

/// Yields frames until the plaintext ends, a PADDING or DATA frame consumes the rest, or an
/// error (yielded once, then the iterator ends). A packet with any error must be dropped as a
/// whole: frames yielded before the error are not trustworthy on their own.
pub struct FrameIter<'a> {
    r: Reader<'a>,
    done: bool,
}

impl<'a> FrameIter<'a> {
    fn parse_one(&mut self) -> Result<Frame<'a>, WireError> {
        let r = &mut self.r;
        match r.get_u8()? {
            FRAME_PADDING => {
                if r.rest().iter().any(|&b| b != 0) {
                    return Err(WireError::BadValue("non-zero padding"));
                }
                Ok(Frame::Padding)
            }
            FRAME_PING => Ok(Frame::Ping),
            FRAME_ACK => {
                let mut f = [0u64; 9];
                for v in &mut f {
                    *v = r.get_varint()?;
                }
                let [largest_pn, ack_delay_us, ctrl_offset, rx_bytes, rx_time_us, rx_buffered, rx_buffer, rx_drops, store_room] =
                    f;
                Ok(Frame::Ack(AckFrame {
                    largest_pn,
                    ack_delay_us,
                    ctrl_offset,
                    rx_bytes,
                    rx_time_us,
                    rx_buffered,
                    rx_buffer,
                    rx_drops,
                    store_room,
                }))
            }
            FRAME_CTRL => {
                let offset = r.get_varint()?;
                let len = r.get_varint()?;
                if len > r.remaining() as u64 {
                    return Err(WireError::Truncated);
                }
                if offset + len > MAX_VARINT {
                    return Err(WireError::BadValue("ctrl offset out of range"));
                }
                let data = r.get_bytes(len as usize)?;
                Ok(Frame::Ctrl { offset, data })
            }
            FRAME_DATA => {
                let xfer = r.get_u32()?;
                let block = r.get_u48()?;
                Ok(Frame::Data {
                    xfer,
                    block,
                    payload: r.rest(),
                })
            }
            FRAME_LOSSMAP => Ok(Frame::LossMap(LossMapFrame::decode(r)?)),
            FRAME_CLOSE => {
                let code = r.get_varint()?;
                let len = r.get_varint()?;
                if len > r.remaining() as u64 {
                    return Err(WireError::Truncated);
                }
                let bytes = r.get_bytes(len as usize)?;
                let reason = std::str::from_utf8(bytes)
                    .map_err(|_| WireError::BadValue("close reason not UTF-8"))?;
                Ok(Frame::Close { code, reason })
            }
            FRAME_PATH_CHALLENGE => Ok(Frame::PathChallenge(r.array()?)),
            FRAME_PATH_RESPONSE => Ok(Frame::PathResponse(r.array()?)),
            FRAME_STREAM => {
                let flags = r.get_u8()?;
                if flags & !STREAM_FIN != 0 {
                    return Err(WireError::BadValue("unknown stream flags"));
                }
                let offset = r.get_varint()?;
                let len = r.get_varint()?;
                if len > r.remaining() as u64 {
                    return Err(WireError::Truncated);
                }
                // The end of the stream takes a position of its own: it must be a varint too.
                if offset + len >= MAX_VARINT {
                    return Err(WireError::BadValue("stream offset out of range"));
                }
                let data = r.get_bytes(len as usize)?;
                Ok(Frame::Stream {
                    offset,
                    fin: flags & STREAM_FIN != 0,
                    data,
                })
            }
            FRAME_STREAM_ACK => Ok(Frame::StreamAck(StreamAckFrame::decode(r)?)),
            t => Err(WireError::UnknownFrame(t)),
        }
    }
}

impl<'a> Iterator for FrameIter<'a> {
    type Item = Result<Frame<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.r.is_empty() {
            return None;
        }
        let res = self.parse_one();
        if res.is_err() || self.r.is_empty() {
            self.done = true;
        }
        Some(res)
    }
}

impl std::iter::FusedIterator for FrameIter<'_> {}

// ---------------------------------------------------------------------------------------
// Handshake packets
// ---------------------------------------------------------------------------------------

/// Offset of the MAC in a ClientHello (it covers bytes `0..CLIENT_HELLO_MAC_OFFSET`).
pub const CLIENT_HELLO_MAC_OFFSET: usize = 1168;
/// Offset of the MAC in a ServerHello (it covers ClientHello ‖ bytes `0..SERVER_HELLO_MAC_OFFSET`).
pub const SERVER_HELLO_MAC_OFFSET: usize = 88;
/// Where a ClientHello carries the server's retry token (zeros when it has none).
const CLIENT_HELLO_TOKEN: Range<usize> = 79..79 + RETRY_TOKEN_LEN;
const CLIENT_HELLO_PAD: Range<usize> = CLIENT_HELLO_TOKEN.end..CLIENT_HELLO_MAC_OFFSET;

fn check_len(d: &[u8], len: usize) -> Result<(), WireError> {
    match d.len().cmp(&len) {
        std::cmp::Ordering::Less => Err(WireError::Truncated),
        std::cmp::Ordering::Greater => Err(WireError::TrailingBytes),
        std::cmp::Ordering::Equal => Ok(()),
    }
}

/// Magic, kind and version of a hello of exactly `len` bytes.
fn check_hello_prefix(d: &[u8], len: usize, kind: u8) -> Result<(), WireError> {
    check_hello_shape(d, len, kind)?;
    if d[4] != VERSION {
        return Err(WireError::UnsupportedVersion(d[4]));
    }
    Ok(())
}

/// Magic, kind and version of a hello of at least `len` bytes whose bytes after `len` are
/// zero (the padding that proves the path's MTU).
fn check_padded_hello(d: &[u8], len: usize, kind: u8) -> Result<(), WireError> {
    if d.len() < len {
        return Err(WireError::Truncated);
    }
    check_hello_prefix(&d[..len], len, kind)?;
    if d[len..].iter().any(|&b| b != 0) {
        return Err(WireError::BadValue("non-zero hello padding"));
    }
    Ok(())
}

/// Length, magic and kind, whatever the version.
fn check_hello_shape(d: &[u8], len: usize, kind: u8) -> Result<(), WireError> {
    check_len(d, len)?;
    if d[..3] != MAGIC {
        return Err(WireError::BadMagic);
    }
    if d[3] != kind {
        return Err(WireError::UnknownKind(d[3]));
    }
    Ok(())
}

fn write_hello_prefix(b: &mut [u8], kind: u8) {
    b[..3].copy_from_slice(&MAGIC);
    b[3] = kind;
    b[4] = VERSION;
}

fn u16_at(d: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(d[at..at + 2].try_into().expect("2 bytes"))
}

fn u64_at(d: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(d[at..at + 8].try_into().expect("8 bytes"))
}

/// A cid in its 8-byte hello slot (v1 had 64-bit cids; the slot stays so every version's
/// hello can be echoed in a HelloReject).
fn cid_at(d: &[u8], at: usize) -> Result<Cid, WireError> {
    Cid::try_from(u64_at(d, at)).map_err(|_| WireError::BadValue("cid wider than 32 bits"))
}

fn put_cid(b: &mut [u8], at: usize, cid: Cid) {
    b[at..at + 8].copy_from_slice(&u64::from(cid).to_be_bytes());
}

fn arr32_at(d: &[u8], at: usize) -> [u8; 32] {
    d[at..at + 32].try_into().expect("32 bytes")
}

fn check_mtu(mtu: u16) -> Result<u16, WireError> {
    if mtu < MIN_MTU {
        Err(WireError::BadValue("mtu below 1280"))
    } else {
        Ok(mtu)
    }
}

/// The client's first message, [`CLIENT_HELLO_LEN`] bytes (`docs/PROTOCOL.md`, ClientHello).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The client's connection id: the server puts it in every packet it sends.
    pub client_cid: Cid,
    /// Fresh random bytes (key derivation salt; echoed by a reject or retry).
    pub client_random: [u8; 32],
    /// The client's ephemeral X25519 public key.
    pub client_eph: [u8; 32],
    /// The client's path MTU (largest IP packet, bytes), at least [`MIN_MTU`].
    pub mtu: u16,
    /// The token of the server's HelloRetry, all zeros in a first hello.
    pub token: [u8; RETRY_TOKEN_LEN],
    /// HMAC-SHA256 under the PSK's hello key of bytes `0..CLIENT_HELLO_MAC_OFFSET`.
    pub mac: [u8; 32],
}

impl ClientHello {
    /// The hello's bytes, padding zeroed.
    pub fn encode(&self) -> [u8; CLIENT_HELLO_LEN] {
        let mut b = [0u8; CLIENT_HELLO_LEN];
        write_hello_prefix(&mut b, KIND_CLIENT_HELLO);
        put_cid(&mut b, 5, self.client_cid);
        b[13..45].copy_from_slice(&self.client_random);
        b[45..77].copy_from_slice(&self.client_eph);
        b[77..79].copy_from_slice(&self.mtu.to_be_bytes());
        b[CLIENT_HELLO_TOKEN].copy_from_slice(&self.token);
        b[CLIENT_HELLO_MAC_OFFSET..].copy_from_slice(&self.mac);
        b
    }

    /// Strict: at least [`CLIENT_HELLO_LEN`] bytes, magic, kind, version, zero padding (inside
    /// the fields and after them), mtu ≥ 1280. Does not check the MAC. A wrong version gives
    /// `UnsupportedVersion` (see [`client_hello_ids`]).
    pub fn decode(d: &[u8]) -> Result<Self, WireError> {
        check_padded_hello(d, CLIENT_HELLO_LEN, KIND_CLIENT_HELLO)?;
        if d[CLIENT_HELLO_PAD].iter().any(|&b| b != 0) {
            return Err(WireError::BadValue("non-zero hello padding"));
        }
        Ok(ClientHello {
            client_cid: cid_at(d, 5)?,
            client_random: arr32_at(d, 13),
            client_eph: arr32_at(d, 45),
            mtu: check_mtu(u16_at(d, 77))?,
            token: arr32_at(d, CLIENT_HELLO_TOKEN.start),
            mac: arr32_at(d, CLIENT_HELLO_MAC_OFFSET),
        })
    }
}

/// `(client_cid, client_random)` of anything shaped like a ClientHello of any version (magic,
/// kind, at least 1200 bytes), so a HelloReject can echo them. Only hellos at least as large
/// as ours qualify, so a reject never amplifies.
pub fn client_hello_ids(d: &[u8]) -> Option<(u64, [u8; 32])> {
    if d.len() < CLIENT_HELLO_LEN || d[..3] != MAGIC || d[3] != KIND_CLIENT_HELLO {
        return None;
    }
    Some((u64_at(d, 5), arr32_at(d, 13)))
}

/// The server's answer to a ClientHello whose MAC verified, [`SERVER_HELLO_LEN`] bytes
/// (`docs/PROTOCOL.md`, ServerHello).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHello {
    /// Echo of the hello's `client_cid`.
    pub client_cid: Cid,
    /// The server's connection id: the client puts it in every packet it sends.
    pub server_cid: Cid,
    /// Fresh random bytes (key derivation salt).
    pub server_random: [u8; 32],
    /// The server's ephemeral X25519 public key.
    pub server_eph: [u8; 32],
    /// The negotiated MTU: the smaller of the client's and the server's limit.
    pub mtu: u16,
    /// HMAC-SHA256 under the session's server hello key of the ClientHello followed by
    /// bytes `0..SERVER_HELLO_MAC_OFFSET`.
    pub mac: [u8; 32],
}

impl ServerHello {
    /// The hello's bytes.
    pub fn encode(&self) -> [u8; SERVER_HELLO_LEN] {
        let mut b = [0u8; SERVER_HELLO_LEN];
        write_hello_prefix(&mut b, KIND_SERVER_HELLO);
        put_cid(&mut b, 5, self.client_cid);
        put_cid(&mut b, 13, self.server_cid);
        b[21..53].copy_from_slice(&self.server_random);
        b[53..85].copy_from_slice(&self.server_eph);
        b[85..87].copy_from_slice(&self.mtu.to_be_bytes());
        b[SERVER_HELLO_MAC_OFFSET..].copy_from_slice(&self.mac);
        b
    }

    /// Strict: at least [`SERVER_HELLO_LEN`] bytes, magic, kind, version, zero reserved byte
    /// and padding, mtu ≥ 1280. Does not check the MAC, nor that the padding proves the mtu.
    pub fn decode(d: &[u8]) -> Result<Self, WireError> {
        check_padded_hello(d, SERVER_HELLO_LEN, KIND_SERVER_HELLO)?;
        if d[87] != 0 {
            return Err(WireError::BadValue("non-zero reserved byte"));
        }
        Ok(ServerHello {
            client_cid: cid_at(d, 5)?,
            server_cid: cid_at(d, 13)?,
            server_random: arr32_at(d, 21),
            server_eph: arr32_at(d, 53),
            mtu: check_mtu(u16_at(d, 85))?,
            mac: arr32_at(d, SERVER_HELLO_MAC_OFFSET),
        })
    }
}

/// Why a server refused a ClientHello ([`HelloReject::reason`]; its byte on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RejectReason {
    /// The hello's MAC does not verify: the client holds another key.
    AuthFailed = 1,
    /// The server does not speak the hello's version.
    VersionUnsupported = 2,
    /// The server is busy. Clients understand it; this server does not send it (it
    /// answers a flood of hellos with a [`HelloRetry`]).
    Busy = 3,
}

impl RejectReason {
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(RejectReason::AuthFailed),
            2 => Some(RejectReason::VersionUnsupported),
            3 => Some(RejectReason::Busy),
            _ => None,
        }
    }
}

/// A server's refusal of a well-formed ClientHello, [`HELLO_REJECT_LEN`] bytes, so the client
/// can say why instead of timing out (`docs/PROTOCOL.md`, HelloReject).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloReject {
    /// Echo of the hello's cid slot, all 8 bytes as received (any version's hello).
    pub client_cid: u64,
    /// Echo of the hello's random: only someone who saw the hello can forge a reject.
    pub client_random: [u8; 32],
    /// Why.
    pub reason: RejectReason,
    /// The highest protocol version the server supports.
    pub max_version: u16,
}

impl HelloReject {
    /// The reject's bytes.
    pub fn encode(&self) -> [u8; HELLO_REJECT_LEN] {
        let mut b = [0u8; HELLO_REJECT_LEN];
        write_hello_prefix(&mut b, KIND_HELLO_REJECT);
        b[5..13].copy_from_slice(&self.client_cid.to_be_bytes());
        b[13..45].copy_from_slice(&self.client_random);
        b[45] = self.reason as u8;
        b[46..48].copy_from_slice(&self.max_version.to_be_bytes());
        b
    }

    /// Any version's reject is read (its layout is the same in every version), so a client
    /// can say which version a newer server wants.
    pub fn decode(d: &[u8]) -> Result<Self, WireError> {
        check_hello_shape(d, HELLO_REJECT_LEN, KIND_HELLO_REJECT)?;
        Ok(HelloReject {
            client_cid: u64_at(d, 5),
            client_random: arr32_at(d, 13),
            reason: RejectReason::from_u8(d[45]).ok_or(WireError::BadValue("reject reason"))?,
            max_version: u16_at(d, 46),
        })
    }
}

/// A server's stateless answer to a ClientHello when hellos come faster than it will spend
/// key exchanges on (QUIC's Retry, RFC 9000 section 8.1): the client sends its hello again
/// with `token`, which proves it receives at its address. Authenticated only by the echoed
/// cid and random, like a [`HelloReject`]; it is smaller than the hello it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloRetry {
    /// Echo of the hello's cid slot (8 bytes).
    pub client_cid: u64,
    /// Echo of the hello's random.
    pub client_random: [u8; 32],
    /// What the client puts in its next hello's `token`: issue time and a MAC over the
    /// client's address and hello ids (see [`crate::retry`]).
    pub token: [u8; RETRY_TOKEN_LEN],
}

impl HelloRetry {
    /// The retry's bytes.
    pub fn encode(&self) -> [u8; HELLO_RETRY_LEN] {
        let mut b = [0u8; HELLO_RETRY_LEN];
        write_hello_prefix(&mut b, KIND_HELLO_RETRY);
        b[5..13].copy_from_slice(&self.client_cid.to_be_bytes());
        b[13..45].copy_from_slice(&self.client_random);
        b[45..].copy_from_slice(&self.token);
        b
    }

    /// Strict: exact length, magic, kind and version.
    pub fn decode(d: &[u8]) -> Result<Self, WireError> {
        check_hello_prefix(d, HELLO_RETRY_LEN, KIND_HELLO_RETRY)?;
        Ok(HelloRetry {
            client_cid: u64_at(d, 5),
            client_random: arr32_at(d, 13),
            token: arr32_at(d, 45),
        })
    }
}
