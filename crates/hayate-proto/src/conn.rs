//! One session between a client and a server: handshake, sealing, acknowledgements, the
//! control stream, and any number of file transfers in either direction.
//!
//! Sans-IO: the caller passes datagrams and the current time in, asks for datagrams to send
//! and for the next deadline, and reads events. File data goes through [`BlockSource`] and
//! [`BlockSink`], so the core never touches a file.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::cc::{Feedback, RateConfig, RateControl};
use crate::control::{flags, Ctrl, CtrlRecv, CtrlSend, MetaEntry, MetaOp};
use crate::crypto::{Psk, ReplayWindow, SessionKeys};
use crate::handshake::{ClientHandshake, HandshakeError};
use crate::pacer::Pacer;
use crate::rng::Rng;
use crate::rtt::RttEstimator;
use crate::transfer::{DataVerdict, Incoming, Layout, Outgoing, XferId, REORDER_PACKETS};
use crate::wire::{self, AckFrame, AddrFamily, Cid, Frame, Writer};

mod tunnel;

/// Where outgoing file data comes from.
pub trait BlockSource {
    /// Fill `buf` with the file bytes of transfer `xfer` at `offset` (exactly `buf.len()`).
    fn read(&mut self, xfer: XferId, offset: u64, buf: &mut [u8]) -> Result<(), String>;
}

/// What an `Offer` says about a file.
#[derive(Debug, Clone, Copy)]
pub struct FileOffer<'a> {
    pub path: &'a str,
    pub size: u64,
    pub mode: u32,
    pub mtime: i64,
    /// [`crate::control::flags`].
    pub flags: u32,
    /// The whole file's BLAKE3, when known up front.
    pub hash: Option<[u8; 32]>,
}

impl<'a> FileOffer<'a> {
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

/// Where incoming file data goes.
pub trait BlockSink {
    fn write(&mut self, xfer: XferId, offset: u64, data: &[u8]) -> Result<(), String>;

    /// Whether a new block of `xfer` can be taken now without waiting (storage
    /// backpressure). A block the sink is not ready for is dropped as if the path had lost
    /// it: the loss map reports it missing, the sender sends it again, and the delivery
    /// rate the sender measures is what the sink took, so a slow disk or FIFO reader slows
    /// the sender as a slow link would, and the driver's loop never waits on storage.
    fn ready(&mut self, _xfer: XferId) -> bool {
        true
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// Largest IP packet to send (client: requested; server: the most it allows).
    pub mtu: u16,
    pub rate: RateConfig,
    /// Give up when the peer is silent this long.
    pub idle_timeout: Duration,
    /// Client: give up when no handshake answer arrives in this time.
    pub connect_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mtu: 1500,
            rate: RateConfig::Fixed(100_000_000 / 8),
            idle_timeout: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

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
    /// Server: the client asks for a tunnel to `host:port` (`hayate tunnel`); answer with
    /// [`Connection::answer_tunnel`].
    TunnelRequested { host: String, port: u16 },
    /// Client: the server's answer to [`Connection::open_tunnel`].
    TunnelAnswered { result: Result<(), String> },
    /// Server: the client has no more requests.
    Bye,
    /// The session is over; `error` is None for a normal close.
    Closed { error: Option<String> },
}

/// Counters for stats lines, JSON and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub packets_sent: u64,
    pub packets_received: u64,
    pub data_packets_sent: u64,
    pub data_packets_retransmitted: u64,
    pub data_bytes_sent: u64,
    pub blocks_declared_lost: u64,
    pub data_packets_received: u64,
    pub duplicate_blocks_received: u64,
    pub data_bytes_received: u64,
    pub data_bytes_acked: u64,
    pub data_bytes_lost: u64,
    pub dropped_malformed: u64,
    pub dropped_auth: u64,
    pub dropped_replay: u64,
    pub dropped_unexpected: u64,
    /// `srtt_us` and `min_rtt_us` are an initial guess until this is set by a first sample.
    pub srtt_us: u64,
    pub min_rtt_us: u64,
    /// At least one RTT sample was taken (a session refused at the handshake has none).
    pub rtt_sampled: bool,
    /// Current pacing rate, bytes/s (0 = unpaced).
    pub pacing_rate: u64,
    /// Sending time the host took away (woken late with data waiting), in bytes at the
    /// pacing rate; the pacer pays it back (see `pacer`).
    pub send_time_lost_bytes: u64,
    pub pings_sent: u64,
    /// HelloRetries followed (the server asked this client to prove its address).
    pub hello_retries: u64,
    /// New blocks dropped because the storage was not ready for them (see
    /// [`BlockSink::ready`]); the sender sends them again.
    pub blocks_refused_by_sink: u64,
}

enum State {
    /// Client waiting for the ServerHello.
    Handshake {
        hs: Box<ClientHandshake>,
        next_send_us: u64,
        backoff_us: u64,
        deadline_us: u64,
    },
    /// Server: keys agreed, waiting for the client's first sealed packet.
    AwaitConfirm,
    Established,
    /// CLOSE sent or received; answer stragglers until `until_us`.
    Draining {
        until_us: u64,
    },
    Closed,
}

/// A sender sends at most this much of its offered files before the receiver's `Ready`
/// (saving the round trip of waiting for it), and a receiver keeps up to twice as much
/// until it has accepted the files: what does not fit is sent again.
const EAGER_BYTES: u64 = 2 << 20;
const STASH_BYTES: usize = 2 * EAGER_BYTES as usize;
/// ACK cadence: every 32 data packets, or 5 ms after the first unacknowledged one.
const ACK_EVERY: u32 = 32;
const ACK_DELAY_US: u64 = 5_000;
/// Sent-packet times kept for RTT and reordering decisions.
const MAX_SENT_HISTORY: usize = 1 << 22;
/// Most incoming files one session may have open at once (`hayate cp` keeps 64 active; a
/// peer may pipeline more, up to this), and most blocks they may hold together: each block
/// costs a bit of loss map, so this caps a hostile peer's offers at 512 MiB of state (6 TB
/// of file at 1500-byte packets) and a few MB of bookkeeping.
pub const MAX_OPEN_INCOMING: usize = 16384;
pub const MAX_INCOMING_BLOCKS: u64 = 1 << 32;
const DRAIN_US: u64 = 2_000_000;

/// What the sender remembers of one packet it sent.
#[derive(Debug, Clone, Copy)]
struct SentRecord {
    at_us: u64,
    /// The pacer's sending time lost to the host by then (see [`Feedback::send_stall_bytes`]),
    /// and left unused for want of data or room in flight ([`Feedback::send_idle_bytes`]).
    stalled: u64,
    idle: u64,
    /// Sent as part of the pacer's catch-up (see [`Pacer::catching_up`]).
    catch_up: bool,
}

pub struct Connection {
    side: Side,
    cfg: Config,
    psk: Psk,
    state: State,
    epoch: Instant,
    keys: Option<SessionKeys>,
    my_cid: Cid,
    peer_cid: Cid,
    fam: AddrFamily,
    mtu: u16,
    block_size: usize,
    payload_limit: usize,

    // Receiving packets from the peer.
    replay: ReplayWindow,
    largest_rx: Option<(u64, u64)>,
    ack_pending: u32,
    ack_deadline: Option<u64>,
    ack_now: bool,
    rx_bytes: u64,
    /// Some incoming file holds blocks that came before it was accepted.
    stash_pending: bool,
    /// Arrival time of the last data counted in `rx_bytes`, µs.
    rx_bytes_at_us: u64,
    rx_buffered: u64,
    rx_buffer: u64,
    rx_drops: u64,
    rx_drops_base: Option<u64>,
    last_rx_us: u64,
    /// A PATH_CHALLENGE's token to echo in our next packet.
    path_response_due: Option<[u8; wire::PATH_TOKEN_LEN]>,
    /// The last PATH_RESPONSE's token, for the endpoint (see [`Connection::take_path_response`]).
    path_response_rx: Option<[u8; wire::PATH_TOKEN_LEN]>,

    // Sending packets to the peer.
    next_pn: u64,
    sent_base: u64,
    /// Per packet number from `sent_base`: what the sender knows of its sending.
    sent_times: VecDeque<SentRecord>,
    largest_acked: Option<u64>,
    rtt: RttEstimator,
    cc: Box<dyn RateControl>,
    pacer: Pacer,
    prev_ack_rx: Option<(u64, u64)>,
    peer_drops: u64,
    pto_base_us: u64,
    pto_count: u32,
    ping_pending: bool,
    /// See [`Connection::keep_alive`]; and when its last PING was queued.
    keep_alive: bool,
    keep_alive_us: u64,

    ctrl_tx: CtrlSend,
    ctrl_rx: CtrlRecv,
    /// `hayate tunnel`'s byte stream, once asked for (see `conn/tunnel.rs`).
    tunnel: Option<Box<tunnel::Tunnel>>,
    outgoing: BTreeMap<XferId, Outgoing>,
    incoming: BTreeMap<XferId, Incoming>,
    pending_gets: BTreeMap<XferId, String>,
    map_rotation: XferId,
    next_xfer: XferId,
    next_meta: u32,
    /// In-flight bytes of finished outgoing transfers, settled by [`Connection::retire`].
    retired_in_flight: u64,
    bye_sent: bool,
    /// Control stream bytes from this offset on go out a second time once sent.
    ctrl_twice: Option<u64>,
    /// Some transfer may need its hash finished or `Sent` announced without sending data.
    hash_work: bool,
    /// The driver hashes what this side sends (off the protocol loop) and hands each file's
    /// hash in with [`Connection::set_source_hash`]; the connection reads no block only to
    /// hash it. Off: the connection hashes blocks as it sends them (the simulator).
    external_hash: bool,
    close_frame: Option<(u64, String)>,
    events: VecDeque<Event>,
    stats: Stats,
    scratch: Vec<u8>,
    /// Every feedback and the rate it led to, when asked for (tuning the controller on real
    /// paths needs what it saw, not only what it did).
    cc_trace: Option<Vec<CcTraceRow>>,
}

/// What the I/O shell knows of this host's receive path (see
/// [`Connection::set_receiver_state`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiverState {
    /// Bytes waiting in the socket's receive buffer, and the buffer's size, as the kernel
    /// counts them (per-datagram overhead included); `buffer` 0: unknown.
    pub buffered: u64,
    pub buffer: u64,
    /// Datagrams the OS dropped because that buffer was full, counted since the socket opened.
    pub os_drops: u64,
}

/// One feedback as the rate controller saw it, and what it decided.
#[derive(Debug, Clone)]
pub struct CcTraceRow {
    pub feedback: Feedback,
    /// Pacing rate after it, bytes/s (0 = unpaced).
    pub rate: u64,
    pub state: &'static str,
    /// Data bytes sent so far (the real sending rate, next to the set one).
    pub sent_bytes: u64,
    /// The controller's in-flight cap after it, bytes (0 = none).
    pub cap: u64,
    /// Sending time the pacer lost so far to late wake-ups, as bytes at its rate.
    pub pacer_lost: u64,
    /// The share of a full catch-up the pacer makes (see [`Pacer::catch_up_room`]).
    pub catch_up_room: f64,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("side", &self.side)
            .field("my_cid", &self.my_cid)
            .field("peer_cid", &self.peer_cid)
            .finish_non_exhaustive()
    }
}

impl Connection {
    fn base(side: Side, cfg: Config, psk: Psk, fam: AddrFamily, now: Instant) -> Self {
        let cc = cfg.rate.build();
        let mtu = cfg.mtu;
        let mut pacer = Pacer::new(wire::udp_payload_limit(mtu, fam));
        pacer.set_rate(cc.pacing_rate());
        Connection {
            side,
            psk,
            state: State::Closed,
            epoch: now,
            keys: None,
            my_cid: 0,
            peer_cid: 0,
            fam,
            mtu,
            block_size: wire::block_size(mtu, fam),
            payload_limit: wire::udp_payload_limit(mtu, fam),
            replay: ReplayWindow::new(),
            largest_rx: None,
            ack_pending: 0,
            ack_deadline: None,
            ack_now: false,
            rx_bytes: 0,
            stash_pending: false,
            rx_bytes_at_us: 0,
            rx_buffered: 0,
            rx_buffer: 0,
            rx_drops: 0,
            rx_drops_base: None,
            last_rx_us: 0,
            path_response_due: None,
            path_response_rx: None,
            next_pn: 0,
            sent_base: 0,
            sent_times: VecDeque::new(),
            largest_acked: None,
            rtt: RttEstimator::default(),
            pacer,
            cc,
            prev_ack_rx: None,
            peer_drops: 0,
            pto_base_us: 0,
            pto_count: 0,
            ping_pending: false,
            keep_alive: false,
            keep_alive_us: 0,
            ctrl_tx: CtrlSend::default(),
            ctrl_rx: CtrlRecv::default(),
            tunnel: None,
            outgoing: BTreeMap::new(),
            incoming: BTreeMap::new(),
            pending_gets: BTreeMap::new(),
            map_rotation: 0,
            next_xfer: 1,
            next_meta: 1,
            retired_in_flight: 0,
            bye_sent: false,
            ctrl_twice: None,
            hash_work: false,
            external_hash: false,
            close_frame: None,
            events: VecDeque::new(),
            stats: Stats::default(),
            scratch: Vec::new(),
            cc_trace: None,
            cfg,
        }
    }

    /// A client session; its first `poll_transmit` yields the ClientHello.
    pub fn client(cfg: Config, psk: &Psk, fam: AddrFamily, now: Instant) -> Self {
        Self::client_with_rng(cfg, psk, fam, now, &mut Rng::os())
    }

    /// [`client`](Self::client) with its cid, handshake random and key drawn from `rng` (a
    /// seeded one makes a simulated run repeat exactly).
    pub fn client_with_rng(
        cfg: Config,
        psk: &Psk,
        fam: AddrFamily,
        now: Instant,
        rng: &mut Rng,
    ) -> Self {
        let hs = ClientHandshake::with_rng(psk, cfg.mtu, rng);
        let deadline_us = cfg.connect_timeout.as_micros() as u64;
        let (rate_max, rate_min, adaptive) = cfg.rate.to_params();
        let mut c = Connection::base(Side::Client, cfg, psk.clone(), fam, now);
        c.ctrl_tx.push(&Ctrl::Params {
            rate_max,
            rate_min,
            adaptive,
        });
        c.my_cid = hs.client_cid();
        c.state = State::Handshake {
            hs: Box::new(hs),
            next_send_us: 0,
            backoff_us: 200_000,
            deadline_us,
        };
        c
    }

    /// A server session for a verified ClientHello (see `handshake::server_accept`).
    pub fn server(
        cfg: Config,
        psk: &Psk,
        accept: crate::handshake::ServerAccept,
        fam: AddrFamily,
        now: Instant,
    ) -> Self {
        let mut cfg = cfg;
        cfg.mtu = accept.mtu;
        let mut c = Connection::base(Side::Server, cfg, psk.clone(), fam, now);
        c.my_cid = accept.server_cid;
        c.peer_cid = accept.client_cid;
        c.keys = Some(accept.keys);
        c.state = State::AwaitConfirm;
        c
    }

    fn now_us(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_micros() as u64
    }

    pub fn side(&self) -> Side {
        self.side
    }

    pub fn my_cid(&self) -> Cid {
        self.my_cid
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    /// Largest datagram this session sends; size transmit buffers to it.
    pub fn max_datagram(&self) -> usize {
        self.payload_limit.max(wire::CLIENT_HELLO_LEN)
    }

    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established)
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// No more events can come except by timeouts of a draining session.
    pub fn is_draining(&self) -> bool {
        matches!(self.state, State::Draining { .. } | State::Closed)
    }

    /// Starts recording every feedback the rate controller gets (see [`CcTraceRow`]).
    pub fn enable_cc_trace(&mut self) {
        self.cc_trace.get_or_insert_with(Vec::new);
    }

    /// The rows recorded since the last call.
    pub fn take_cc_trace(&mut self) -> Vec<CcTraceRow> {
        self.cc_trace
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    pub fn stats(&self) -> Stats {
        let mut s = self.stats.clone();
        s.srtt_us = self.rtt.srtt();
        s.min_rtt_us = self.rtt.min();
        s.rtt_sampled = self.rtt.has_sample();
        s.pacing_rate = self.pacer.rate().unwrap_or(0);
        s.send_time_lost_bytes = self.pacer.lost_bytes();
        s
    }

    pub fn rate_controller(&self) -> &dyn RateControl {
        &*self.cc
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The I/O shell reports the receiver-side facts the peer's rate controller wants; the
    /// next ACK carries them.
    pub fn set_receiver_state(&mut self, st: ReceiverState) {
        self.rx_buffer = st.buffer;
        self.rx_buffered = if st.buffer > 0 { st.buffered } else { 0 };
        // The socket's counter runs for its whole life (a server's spans many sessions):
        // report only the drops since this session first looked.
        let base = *self.rx_drops_base.get_or_insert(st.os_drops);
        self.rx_drops = st.os_drops.saturating_sub(base);
    }

    // ----- application requests -----

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
        self.pending_gets.insert(xfer, path.to_string());
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
        if self.incoming.remove(&xfer).is_some() {
            self.ctrl_tx.push(&Ctrl::Skip {
                xfer,
                reason: reason.to_string(),
            });
        }
    }

    /// Client: a file-system request on the server; the answer comes as `MetaReplied`.
    pub fn meta(&mut self, op: MetaOp) -> u32 {
        let id = self.next_meta;
        self.next_meta += 1;
        self.ctrl_tx.push(&Ctrl::Meta { id, op });
        id
    }

    /// Server: answer a `MetaRequested`, split so no message nears the size limit.
    pub fn meta_reply(&mut self, id: u32, result: Result<Vec<MetaEntry>, String>) {
        const PER_MESSAGE: usize = 2048;
        match result {
            Ok(entries) if entries.len() > PER_MESSAGE => {
                let parts: Vec<_> = entries.chunks(PER_MESSAGE).collect();
                let last = parts.len() - 1;
                for (i, p) in parts.into_iter().enumerate() {
                    self.ctrl_tx.push(&Ctrl::MetaReply {
                        id,
                        result: Ok(p.to_vec()),
                        more: i < last,
                    });
                }
            }
            result => self.ctrl_tx.push(&Ctrl::MetaReply {
                id,
                result,
                more: false,
            }),
        }
    }

    /// Blocks of an outgoing file the receiver already had (resume), in bytes.
    pub fn outgoing_skipped_bytes(&self, xfer: XferId) -> Option<u64> {
        self.outgoing.get(&xfer).map(|o| o.bytes_had)
    }

    /// Accept an `Offered` file; `have` lists block ranges already present (resume).
    pub fn accept(&mut self, xfer: XferId, have: &[(u64, u64)]) {
        self.accept_at(xfer, have, None);
    }

    /// [`accept`](Self::accept), telling the sender where the file goes (the answer to an
    /// [`flags::INTO_DIR`](crate::control::flags::INTO_DIR) offer).
    pub fn accept_at(&mut self, xfer: XferId, have: &[(u64, u64)], path: Option<&str>) {
        if let Some(inc) = self.incoming.get_mut(&xfer) {
            inc.accepted = true;
            inc.allocate();
            inc.mark_have(have);
            if let Some(p) = path {
                inc.path = p.to_string();
            }
            let have = inc.have_ranges();
            // The sender stops at its eager limit until this comes (see `offer`).
            self.say_twice(&Ctrl::Ready {
                xfer,
                have,
                path: path.map(str::to_string),
            });
            self.check_incoming_complete(xfer);
        }
    }

    /// Refuse an offer or a get (or abort an incoming transfer).
    pub fn reject(&mut self, xfer: XferId, reason: &str) {
        self.incoming.remove(&xfer);
        self.retire(xfer);
        self.ctrl_tx.push(&Ctrl::Reject {
            xfer,
            reason: reason.to_string(),
        });
    }

    /// Report the verdict on a completed incoming file: Ok(hash) once it is verified and in
    /// place under its final name, Err(reason) otherwise.
    pub fn finish_incoming(&mut self, xfer: XferId, result: Result<[u8; 32], String>) {
        if self.incoming.remove(&xfer).is_none() {
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

    /// Queues a message a peer waits on: it goes out twice, and with it the rest of the
    /// stream from there (only from the earliest such message still unsent twice: the
    /// stream is not sent twice whole).
    fn say_twice(&mut self, msg: &Ctrl) {
        let at = self.ctrl_tx.end();
        self.ctrl_tx.push(msg);
        self.ctrl_twice = Some(self.ctrl_twice.map_or(at, |t| t.min(at)));
    }

    /// Client: no more requests. The packet that says so goes out with whatever control
    /// messages are still unsent (a download's `Verified`), then a CLOSE follows and the
    /// session is over: nothing the server could still say matters, and waiting for its own
    /// CLOSE cost the job a round trip. Lost both, the server's idle timeout ends it.
    pub fn bye(&mut self) {
        if !self.bye_sent {
            self.bye_sent = true;
            self.ctrl_tx.push(&Ctrl::Bye);
        }
    }

    /// Close now, telling the peer why (code 0 = normal).
    pub fn close(&mut self, now: Instant, code: u64, reason: &str) {
        let now_us = self.now_us(now);
        self.close_us(now_us, code, reason);
    }

    fn close_us(&mut self, now_us: u64, code: u64, reason: &str) {
        if self.is_draining() {
            return;
        }
        if self.keys.is_some() && !matches!(self.state, State::Handshake { .. }) {
            self.close_frame = Some((code, reason.to_string()));
            self.state = State::Draining {
                until_us: now_us + DRAIN_US,
            };
        } else {
            self.state = State::Closed;
        }
        let error = (code != 0).then(|| reason.to_string());
        self.events.push_back(Event::Closed { error });
    }

    /// Transfers still open, for a message when a session dies.
    pub fn open_transfers(&self) -> Vec<(XferId, String)> {
        let mut v: Vec<_> = self
            .outgoing
            .values()
            .map(|o| (o.id, o.path.clone()))
            .chain(self.incoming.values().map(|i| (i.id, i.path.clone())))
            .chain(self.pending_gets.iter().map(|(x, p)| (*x, p.clone())))
            .collect();
        v.sort();
        v
    }

    /// Progress of an incoming transfer: (received blocks, total blocks, missing ranges).
    pub fn incoming_progress(&self, xfer: XferId) -> Option<(u64, u64)> {
        self.incoming
            .get(&xfer)
            .map(|i| (i.received_blocks(), i.layout.blocks()))
    }

    /// Missing block ranges of an incoming transfer (for "what is missing" reports).
    pub fn incoming_missing(&self, xfer: XferId) -> Option<Vec<(u64, u64)>> {
        self.incoming.get(&xfer).map(|i| i.missing_ranges())
    }

    /// Bytes of our outgoing files the peer has acknowledged.
    pub fn outgoing_acked_bytes(&self, xfer: XferId) -> Option<u64> {
        self.outgoing.get(&xfer).map(|o| o.bytes_acked)
    }

    fn alloc_xfer(&mut self) -> XferId {
        let x = self.next_xfer;
        self.next_xfer += 1;
        x
    }

    fn start_outgoing(&mut self, xfer: XferId, f: &FileOffer<'_>) {
        let layout = Layout::new(f.size, self.block_size);
        if layout.blocks() > wire::BLOCK_LIMIT {
            self.fail_outgoing(xfer, too_large(f.path, f.size));
            return;
        }
        let mut o = Outgoing::new(xfer, f.path.to_string(), layout);
        // Not when the receiver may well answer with a skip: what went out would be wasted.
        o.eager = f.flags & (flags::NO_CLOBBER | flags::UPDATE) == 0;
        o.finish_empty_hash();
        self.outgoing.insert(xfer, o);
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

    // ----- receiving -----

    /// Process one datagram from the peer. Invalid datagrams are dropped and counted.
    /// Returns whether it was taken: a handshake reply that established the session, or a
    /// sealed packet that opened under the session key and was not a replay. Only such a
    /// datagram may teach the caller anything about the peer (its address, say).
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        data: &mut [u8],
        sink: &mut dyn BlockSink,
    ) -> bool {
        self.handle_datagram_at(now, now, data, sink)
    }

    /// [`handle_datagram`](Self::handle_datagram) for a datagram that reached the host at
    /// `arrived` (the kernel's receive timestamp), perhaps well before `now`. The path's
    /// measurements (RTT, the receive rate reported to the sender) use the arrival time, so
    /// time a datagram spent waiting for this process (a busy or descheduled host) is not
    /// read as queueing on the path. A receiver that stays behind still shows: its socket
    /// buffer fills, the in-flight cap holds the sender to its pace, and drops are reported.
    pub fn handle_datagram_at(
        &mut self,
        now: Instant,
        arrived: Instant,
        data: &mut [u8],
        sink: &mut dyn BlockSink,
    ) -> bool {
        let now_us = self.now_us(now);
        // Not capped at `now`: a driver reads the clock once per loop, so a datagram often
        // arrived after the `now` it is handled with, and capping it would date it early
        // (an ACK's RTT would read short and spoil the minimum RTT).
        let rx_at_us = self.now_us(arrived);
        if let State::Handshake {
            hs, next_send_us, ..
        } = &mut self.state
        {
            if wire::peek_kind(data) == Ok(wire::PacketKind::HelloRetry) {
                match hs.handle_retry(&self.psk, data) {
                    Ok(true) => {
                        // Answer at once: the server holds no state for us meanwhile.
                        *next_send_us = now_us;
                        self.stats.hello_retries += 1;
                    }
                    Ok(false) => self.stats.dropped_unexpected += 1,
                    Err(HandshakeError::BadMac) => self.stats.dropped_auth += 1,
                    Err(_) => self.stats.dropped_malformed += 1,
                }
                return false;
            }
            match hs.handle(&self.psk, data) {
                Ok(est) => {
                    self.peer_cid = est.server_cid;
                    self.mtu = est.mtu;
                    self.block_size = wire::block_size(est.mtu, self.fam);
                    self.payload_limit = wire::udp_payload_limit(est.mtu, self.fam);
                    self.pacer = Pacer::new(self.payload_limit);
                    self.pacer.set_rate(self.cc.pacing_rate());
                    self.keys = Some(est.keys);
                    self.state = State::Established;
                    self.last_rx_us = now_us;
                    self.pto_base_us = now_us;
                    // The server trusts us only once a sealed packet opens: say something.
                    if !self.ctrl_tx.has_unsent() {
                        self.ping_pending = true;
                    }
                    // Transfers queued before the handshake learned the block size now.
                    for o in self.outgoing.values_mut() {
                        o.layout = Layout::new(o.layout.size, self.block_size);
                        let eager = o.eager;
                        *o = Outgoing::new(o.id, o.path.clone(), o.layout);
                        o.eager = eager;
                        o.finish_empty_hash();
                    }
                    self.events.push_back(Event::Connected);
                    return true;
                }
                Err(HandshakeError::Rejected(r)) => {
                    let reason = match r {
                        wire::RejectReason::AuthFailed => {
                            "the server refused our key (authentication failed): \
                             client and server key files differ"
                        }
                        wire::RejectReason::VersionUnsupported => {
                            "the server does not speak this protocol version"
                        }
                        wire::RejectReason::Busy => "the server is busy",
                    };
                    self.state = State::Closed;
                    self.events.push_back(Event::Closed {
                        error: Some(reason.to_string()),
                    });
                }
                Err(HandshakeError::BadMac) => self.stats.dropped_auth += 1,
                Err(_) => self.stats.dropped_malformed += 1,
            }
            return false;
        }
        if matches!(self.state, State::Closed) {
            self.stats.dropped_unexpected += 1;
            return false;
        }
        match wire::peek_kind(data) {
            Ok(wire::PacketKind::Sealed) => {}
            Ok(_) => {
                // Retransmitted hellos are the endpoint's business; anything else is noise.
                self.stats.dropped_unexpected += 1;
                return false;
            }
            Err(_) => {
                self.stats.dropped_malformed += 1;
                return false;
            }
        }
        if wire::sealed_dest_cid(data).ok() != Some(self.my_cid) {
            self.stats.dropped_unexpected += 1;
            return false;
        }
        let Ok(pn_bits) = wire::sealed_pn_bits(data) else {
            self.stats.dropped_malformed += 1;
            return false;
        };
        let pn = wire::decode_pn(pn_bits, self.largest_rx.map_or(0, |(l, _)| l + 1));
        if !self.replay.is_fresh(pn) {
            self.stats.dropped_replay += 1;
            return false;
        }
        let keys = self.keys.as_ref().expect("sealed packets only after keys");
        let plain = match keys.recv.open(data, pn) {
            Ok(p) => p,
            Err(_) => {
                self.stats.dropped_auth += 1;
                return false;
            }
        };
        // Validate every frame before acting on any, so a malformed tail cannot leave a
        // packet half-applied.
        if wire::parse_frames(plain).any(|f| f.is_err()) {
            self.stats.dropped_malformed += 1;
            return false;
        }
        self.replay.mark(pn);
        self.stats.packets_received += 1;
        self.last_rx_us = now_us;
        if matches!(self.state, State::AwaitConfirm) {
            self.state = State::Established;
            self.pto_base_us = now_us;
            self.events.push_back(Event::Connected);
        }
        if let State::Draining { .. } = self.state {
            // The peer did not hear our CLOSE: say it again.
            if self.close_frame.is_none() {
                self.close_frame = Some((0, "closed".into()));
            }
            return true;
        }
        if self.largest_rx.is_none_or(|(l, _)| pn > l) {
            self.largest_rx = Some((pn, rx_at_us));
        }

        if self.stash_pending {
            self.flush_stashes(sink);
        }
        let mut eliciting = false;
        let mut has_data = false;
        let mut fb: Option<Feedback> = None;
        for frame in wire::parse_frames(plain).map_while(Result::ok) {
            match frame {
                Frame::Padding => {}
                Frame::Ping => {
                    eliciting = true;
                    self.ack_now = true;
                }
                Frame::Ack(a) => fb = Some(self.on_ack(now_us, rx_at_us, &a)),
                Frame::Ctrl { offset, data } => {
                    eliciting = true;
                    self.ack_now = true;
                    match self.ctrl_rx.on_chunk(offset, data) {
                        Ok(_) => self.drain_ctrl(now),
                        Err(e) => {
                            self.close(now, 2, &format!("protocol error: {e}"));
                            return true;
                        }
                    }
                }
                Frame::Data {
                    xfer,
                    block,
                    payload,
                } => {
                    eliciting = true;
                    has_data = true;
                    self.on_data(now, rx_at_us, xfer, block, payload, sink);
                }
                Frame::LossMap(lm) => {
                    let fb = fb.get_or_insert_with(|| Feedback {
                        now_us,
                        ..Default::default()
                    });
                    self.on_loss_map(&lm, fb);
                }
                Frame::PathChallenge(token) => {
                    self.path_response_due = Some(token);
                }
                Frame::PathResponse(token) => {
                    self.path_response_rx = Some(token);
                }
                Frame::Stream { offset, fin, data } => {
                    eliciting = true;
                    has_data = true;
                    if let Err(e) = self.on_stream(rx_at_us, offset, fin, data) {
                        self.close(now, 2, &format!("protocol error: {e}"));
                        return true;
                    }
                }
                Frame::StreamAck(a) => {
                    let fb = fb.get_or_insert_with(|| Feedback {
                        now_us,
                        ..Default::default()
                    });
                    self.on_stream_ack(&a, fb);
                }
                Frame::Close { code, reason } => {
                    let error = (code != 0).then(|| format!("peer closed the session: {reason}"));
                    self.state = State::Draining {
                        until_us: now_us + DRAIN_US,
                    };
                    self.events.push_back(Event::Closed { error });
                    return true;
                }
            }
        }
        if let Some(mut fb) = fb {
            fb.srtt_us = self.rtt.srtt();
            fb.min_rtt_us = self.rtt.min();
            fb.in_flight = self.in_flight_bytes();
            self.cc.on_feedback(&fb);
            self.pacer.on_fates(
                (
                    fb.catch_up_lost_bytes,
                    fb.catch_up_lost_bytes + fb.catch_up_delivered,
                ),
                (
                    fb.lost_bytes - fb.catch_up_lost_bytes,
                    fb.lost_bytes + fb.delivered - fb.catch_up_lost_bytes - fb.catch_up_delivered,
                ),
            );
            let rate = self.cc.pacing_rate_with(fb.in_flight);
            self.pacer.set_rate(rate);
            if let Some(t) = &mut self.cc_trace {
                t.push(CcTraceRow {
                    feedback: fb,
                    rate: rate.unwrap_or(0),
                    state: self.cc.name(),
                    sent_bytes: self.stats.data_bytes_sent,
                    cap: self.cc.in_flight_cap().unwrap_or(0),
                    pacer_lost: self.pacer.lost_bytes(),
                    catch_up_room: self.pacer.catch_up_room(),
                });
            }
        }
        if eliciting {
            if has_data {
                self.ack_pending += 1;
                if self.ack_deadline.is_none() {
                    self.ack_deadline = Some(now_us + ACK_DELAY_US);
                }
            } else {
                self.ack_now = true;
            }
        }
        true
    }

    fn in_flight_bytes(&self) -> u64 {
        // Sent minus delivered minus declared lost: an estimate good enough for pacing caps.
        self.stats.data_bytes_sent.saturating_sub(
            self.stats.data_bytes_acked + self.stats.data_bytes_lost + self.retired_in_flight,
        )
    }

    /// Ends an outgoing transfer. Its last blocks are often proven delivered by `Verified`
    /// rather than by a loss map: without settling them here they would count as in flight
    /// forever, and after a few hundred small files the in-flight cap would stall the session.
    fn retire(&mut self, xfer: XferId) -> Option<Outgoing> {
        let o = self.outgoing.remove(&xfer)?;
        self.retired_in_flight += o.sent_bytes.saturating_sub(o.settled_bytes);
        Some(o)
    }

    fn on_ack(&mut self, now_us: u64, rx_at_us: u64, a: &AckFrame) -> Feedback {
        let mut fb = Feedback {
            now_us,
            ..Default::default()
        };
        if a.largest_pn < self.next_pn && self.largest_acked.is_none_or(|l| a.largest_pn > l) {
            let prev = self.largest_acked.and_then(|l| self.sent_record(l));
            self.largest_acked = Some(a.largest_pn);
            if let Some(sent) = self.sent_record(a.largest_pn) {
                if let Some(before) = prev {
                    fb.send_stall_bytes = sent.stalled.saturating_sub(before.stalled);
                    fb.send_idle_bytes = sent.idle.saturating_sub(before.idle);
                }
                let raw = rx_at_us.saturating_sub(sent.at_us);
                let rtt = if raw > a.ack_delay_us {
                    raw - a.ack_delay_us
                } else {
                    raw
                };
                self.rtt.on_sample(now_us, rtt);
                fb.rtt_us = Some(rtt);
                fb.rx_lag_us = a.ack_delay_us;
            }
            // Forget send times nobody will ask for again.
            let keep_from = a.largest_pn.saturating_sub(4 * REORDER_PACKETS.max(1024));
            while self.sent_base < keep_from && !self.sent_times.is_empty() {
                self.sent_times.pop_front();
                self.sent_base += 1;
            }
        }
        if self.ctrl_tx.on_ack(a.ctrl_offset) {
            self.pto_count = 0;
        }
        self.pto_base_us = now_us;
        self.pto_count = 0;
        if let Some((b0, t0)) = self.prev_ack_rx {
            if a.rx_time_us > t0 + 1_000 && a.rx_bytes >= b0 {
                // The receiver counts payload; the pacer counts whole datagrams.
                let payload = (a.rx_bytes - b0) as u128 * 1_000_000 / (a.rx_time_us - t0) as u128;
                let per_dgram = (self.block_size
                    + wire::SEALED_HEADER_LEN
                    + wire::DATA_HEADER_LEN
                    + wire::TAG_LEN) as u128;
                fb.rx_rate = Some((payload * per_dgram / self.block_size as u128) as u64);
                fb.rx_interval_us = a.rx_time_us - t0;
                self.prev_ack_rx = Some((a.rx_bytes, a.rx_time_us));
            }
        } else {
            self.prev_ack_rx = Some((a.rx_bytes, a.rx_time_us));
        }
        fb.rx_buffered = a.rx_buffered;
        fb.rx_buffer = a.rx_buffer;
        fb.rx_drops = a.rx_drops.saturating_sub(self.peer_drops);
        self.peer_drops = self.peer_drops.max(a.rx_drops);
        fb
    }

    fn sent_time(&self, pn: u64) -> Option<u64> {
        self.sent_record(pn).map(|r| r.at_us)
    }

    fn sent_record(&self, pn: u64) -> Option<SentRecord> {
        if pn < self.sent_base {
            return None;
        }
        self.sent_times.get((pn - self.sent_base) as usize).copied()
    }

    fn on_loss_map(&mut self, lm: &wire::LossMapFrame, fb: &mut Feedback) {
        let Some(largest) = self.largest_acked else {
            return;
        };
        let reorder_us = (self.rtt.srtt() / 8).max(1_000);
        let largest_time = self.sent_time(largest);
        let sent_base = self.sent_base;
        let times = &self.sent_times;
        let is_lost = |pn: u64| {
            if pn >= largest {
                return false;
            }
            if largest - pn >= REORDER_PACKETS {
                return true;
            }
            match (
                pn.checked_sub(sent_base)
                    .and_then(|i| times.get(i as usize)),
                largest_time,
            ) {
                (Some(r), Some(lt)) => r.at_us + reorder_us <= lt,
                _ => true,
            }
        };
        let caught_up = |pn: u64| {
            pn.checked_sub(sent_base)
                .and_then(|i| times.get(i as usize))
                .is_some_and(|r| r.catch_up)
        };
        // Before its Ready (which may travel behind the first loss map in the same packet)
        // a map can only show resumed blocks: those are credited by Ready, not counted as
        // deliveries (they would inflate the delivery rate).
        let Some(o) = self.outgoing.get_mut(&lm.xfer).filter(|o| o.ready) else {
            return;
        };
        let out = o.on_loss_map(lm, is_lost, caught_up);
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

    fn on_data(
        &mut self,
        now: Instant,
        rx_at_us: u64,
        xfer: XferId,
        block: u64,
        payload: &[u8],
        sink: &mut dyn BlockSink,
    ) {
        self.stats.data_packets_received += 1;
        let Some(inc) = self.incoming.get_mut(&xfer) else {
            // Data for a transfer that already finished (a late retransmission) or never was.
            self.stats.duplicate_blocks_received += 1;
            return;
        };
        let verdict = inc.check(block, payload.len());
        if verdict == DataVerdict::Invalid {
            self.stats.dropped_malformed += 1;
            return;
        }
        if !inc.accepted {
            // Sent with the offer: kept until it is accepted, within `STASH_BYTES`.
            if verdict == DataVerdict::New && !inc.stash.contains_key(&block) {
                let stashed: usize = self.incoming.values().map(|i| i.stash_bytes).sum();
                if stashed + payload.len() <= STASH_BYTES {
                    let inc = self.incoming.get_mut(&xfer).expect("looked up");
                    inc.stash.insert(block, payload.to_vec());
                    inc.stash_bytes += payload.len();
                    self.stash_pending = true;
                    // Delivered now, as far as the sender's rate is concerned.
                    self.rx_bytes += payload.len() as u64;
                    self.rx_bytes_at_us = self.rx_bytes_at_us.max(rx_at_us);
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
            self.rx_bytes += payload.len() as u64;
            self.rx_bytes_at_us = self.rx_bytes_at_us.max(rx_at_us);
        }
        let _ = now;
    }

    /// Writes a new block of an accepted file; false if the write failed (the transfer is
    /// then failed and the sender told).
    fn write_block(
        &mut self,
        xfer: XferId,
        block: u64,
        payload: &[u8],
        sink: &mut dyn BlockSink,
    ) -> bool {
        let Some(inc) = self.incoming.get_mut(&xfer) else {
            return false;
        };
        let offset = inc.layout.offset(block);
        match sink.write(xfer, offset, payload) {
            Ok(()) => {
                inc.on_written(block, payload.len());
                self.stats.data_bytes_received += payload.len() as u64;
                self.check_incoming_complete(xfer);
                true
            }
            Err(e) => {
                let reason = format!("cannot write {}: {e}", inc.path);
                self.incoming.remove(&xfer);
                self.ctrl_tx.push(&Ctrl::Failed {
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
    fn flush_stashes(&mut self, sink: &mut dyn BlockSink) {
        let ids: Vec<XferId> = self
            .incoming
            .iter()
            .filter(|(_, i)| i.accepted && !i.stash.is_empty())
            .map(|(x, _)| *x)
            .collect();
        for xfer in ids {
            let Some(inc) = self.incoming.get_mut(&xfer) else {
                continue;
            };
            let stash = std::mem::take(&mut inc.stash);
            inc.stash_bytes = 0;
            for (block, data) in stash {
                let fresh = self
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
        self.stash_pending = self.incoming.values().any(|i| !i.stash.is_empty());
    }

    fn check_incoming_complete(&mut self, xfer: XferId) {
        if let Some(inc) = self.incoming.get_mut(&xfer) {
            if inc.accepted && !inc.completed && inc.all_received() {
                if let Some(h) = inc.expected_hash {
                    inc.completed = true;
                    self.events
                        .push_back(Event::IncomingComplete { xfer, blake3: h });
                    // Tell the sender at once that everything is here.
                    self.ack_now = true;
                }
            }
        }
    }

    fn check_outgoing_done(&mut self, _xfer: XferId) {
        // Completion is decided by the receiver's Verified/Failed; nothing to do on acks.
    }

    fn drain_ctrl(&mut self, now: Instant) {
        loop {
            match self.ctrl_rx.next_message() {
                Ok(Some(msg)) => self.on_ctrl(now, msg),
                Ok(None) => return,
                Err(e) => {
                    self.close(now, 2, &format!("protocol error: {e}"));
                    return;
                }
            }
        }
    }

    fn on_ctrl(&mut self, now: Instant, msg: Ctrl) {
        match msg {
            Ctrl::Offer {
                xfer,
                path,
                size,
                mode,
                mtime,
                flags,
                hash,
            } => {
                let solicited = self.pending_gets.remove(&xfer).is_some();
                if self.side == Side::Client && !solicited {
                    self.stats.dropped_unexpected += 1;
                    return;
                }
                if self.incoming.contains_key(&xfer) || self.outgoing.contains_key(&xfer) {
                    return;
                }
                let layout = Layout::new(size, self.block_size);
                let held: u64 = self.incoming.values().map(|i| i.layout.blocks()).sum();
                let refusal = if layout.blocks() > wire::BLOCK_LIMIT {
                    // Only a peer that ignores its own limit offers this; refuse it aloud.
                    Some(too_large(&path, size))
                } else if self.incoming.len() >= MAX_OPEN_INCOMING {
                    Some(format!(
                        "{path}: more than {MAX_OPEN_INCOMING} files offered at once"
                    ))
                } else if held + layout.blocks() > MAX_INCOMING_BLOCKS {
                    Some(format!(
                        "{path}: {size} bytes is more than this receiver tracks at once \
                         ({MAX_INCOMING_BLOCKS} blocks of {} bytes in all)",
                        self.block_size
                    ))
                } else {
                    None
                };
                if let Some(reason) = refusal {
                    self.ctrl_tx.push(&Ctrl::Reject {
                        xfer,
                        reason: reason.clone(),
                    });
                    if solicited {
                        self.events.push_back(Event::Rejected { xfer, reason });
                    }
                    return;
                }
                self.incoming
                    .insert(xfer, Incoming::new(xfer, path.clone(), layout, mode, mtime));
                self.events.push_back(Event::Offered {
                    xfer,
                    path,
                    size,
                    mode,
                    mtime,
                    flags,
                    hash,
                });
            }
            Ctrl::Get { xfer, path, flags } => {
                if self.side == Side::Server && self.outgoing.len() >= MAX_OPEN_INCOMING {
                    self.ctrl_tx.push(&Ctrl::Reject {
                        xfer,
                        reason: format!(
                            "{path}: more than {MAX_OPEN_INCOMING} files asked for at once"
                        ),
                    });
                } else if self.side == Side::Server {
                    self.events
                        .push_back(Event::GetRequested { xfer, path, flags });
                } else {
                    self.stats.dropped_unexpected += 1;
                }
            }
            Ctrl::Skip { xfer, reason } => {
                if self.retire(xfer).is_some() {
                    self.events.push_back(Event::Skipped { xfer, reason });
                }
            }
            Ctrl::Meta { id, op } => {
                if self.side == Side::Server {
                    self.events.push_back(Event::MetaRequested { id, op });
                } else {
                    self.stats.dropped_unexpected += 1;
                }
            }
            Ctrl::MetaReply { id, result, more } => {
                if self.side == Side::Client {
                    self.events
                        .push_back(Event::MetaReplied { id, result, more });
                } else {
                    self.stats.dropped_unexpected += 1;
                }
            }
            Ctrl::Ready { xfer, have, path } => {
                if let Some(o) = self.outgoing.get_mut(&xfer) {
                    if !o.ready {
                        o.ready = true;
                        o.mark_have(&have);
                        self.hash_work = true;
                        if let Some(path) = path {
                            self.events.push_back(Event::Placed { xfer, path });
                        }
                    }
                }
            }
            Ctrl::Reject { xfer, reason } => {
                let known = self.retire(xfer).is_some()
                    | self.incoming.remove(&xfer).is_some()
                    | self.pending_gets.remove(&xfer).is_some();
                if known {
                    self.events.push_back(Event::Rejected { xfer, reason });
                }
            }
            Ctrl::Sent { xfer, blake3 } => {
                if let Some(inc) = self.incoming.get_mut(&xfer) {
                    inc.expected_hash = Some(blake3);
                    self.check_incoming_complete(xfer);
                }
            }
            Ctrl::Verified { xfer, blake3 } => {
                if let Some(o) = self.retire(xfer) {
                    let result = if o.hash == Some(blake3) {
                        Ok(blake3)
                    } else {
                        Err("the receiver's hash differs from ours".to_string())
                    };
                    self.events.push_back(Event::OutgoingDone { xfer, result });
                }
            }
            Ctrl::Failed { xfer, reason } => {
                if self.retire(xfer).is_some() {
                    self.events.push_back(Event::OutgoingDone {
                        xfer,
                        result: Err(reason),
                    });
                }
            }
            Ctrl::Params {
                rate_max,
                rate_min,
                adaptive,
            } => {
                if self.side == Side::Server {
                    self.cc = self
                        .cfg
                        .rate
                        .negotiate(rate_max, rate_min, adaptive)
                        .build();
                    self.pacer.set_rate(self.cc.pacing_rate());
                }
            }
            Ctrl::Bye => {
                if self.side == Side::Server {
                    self.events.push_back(Event::Bye);
                    self.close(now, 0, "bye");
                }
            }
            m @ (Ctrl::Tunnel { .. } | Ctrl::TunnelReply { .. }) => self.on_tunnel_ctrl(now, m),
        }
    }

    // ----- timers -----

    /// The next moment `handle_timeout` (or `poll_transmit`) has work, if any.
    pub fn poll_timeout(&mut self, now: Instant) -> Option<Instant> {
        let now_us = self.now_us(now);
        let at = |us: u64| self.epoch + Duration::from_micros(us);
        let mut t: Option<u64> = None;
        let mut min = |x: u64| t = Some(t.map_or(x, |y: u64| y.min(x)));
        match &self.state {
            State::Handshake {
                next_send_us,
                deadline_us,
                ..
            } => {
                min(*next_send_us);
                min(*deadline_us);
            }
            State::Closed => return None,
            State::Draining { until_us } => {
                if self.close_frame.is_some() {
                    min(now_us);
                }
                min(*until_us);
            }
            State::AwaitConfirm | State::Established => {
                min(self.last_rx_us + self.cfg.idle_timeout.as_micros() as u64);
                if self.ack_now
                    || self.ctrl_tx.has_sendable()
                    || self.ping_pending
                    || self.hash_work
                    || self.path_response_due.is_some()
                {
                    min(now_us);
                }
                if let Some(d) = self.ack_deadline {
                    min(d);
                }
                if let Some(d) = self.keep_alive_due() {
                    min(d);
                }
                if self.outstanding() {
                    min(self.pto_deadline());
                }
                if self.has_data_to_send() {
                    match self.pacer.next_send_time(now_us) {
                        Some(x) => min(x),
                        None => min(now_us),
                    }
                }
            }
        }
        t.map(at)
    }

    fn pto_deadline(&self) -> u64 {
        let backoff = 1u64 << self.pto_count.min(6);
        // Backing off stops at an eighth of the idle timeout: a probe at most every 1.9 s of
        // the default 15 s. Doubling on to 64 probe timeouts left a session that had lost
        // its last few probes (30 % loss each way) a single probe more before the timeout
        // ended it, all data out and no loss map back to say what to resend.
        let most = (self.cfg.idle_timeout.as_micros() as u64 / 8).max(self.rtt.pto());
        self.pto_base_us + (self.rtt.pto() * backoff).min(most)
    }

    /// Something sent is still awaiting an answer from the peer.
    fn outstanding(&self) -> bool {
        self.ctrl_tx.has_unacked()
            || self.stream_outstanding()
            || self
                .outgoing
                .values()
                .any(|o| o.ready && o.next_new > 0 && !o.all_acked())
            || self.outgoing.values().any(|o| o.sent_announced)
            // Sent out, its hash still being computed: the receiver waits for it, so keep
            // the session alive meanwhile.
            || self
                .outgoing
                .values()
                .any(|o| o.ready && o.hash.is_none() && o.peek_new().is_none())
    }

    fn has_data_to_send(&self) -> bool {
        !self.window_full()
            && (self.stream_sendable()
                || self.outgoing.values().any(|o| {
                    (o.ready && o.has_retx())
                        || ((o.ready || (o.eager && self.eager_room())) && o.peek_new().is_some())
                }))
    }

    /// Offered files not yet answered may take more data: under `EAGER_BYTES` went out so far.
    fn eager_room(&self) -> bool {
        let sent: u64 = self
            .outgoing
            .values()
            .filter(|o| !o.ready)
            .map(|o| o.sent_bytes)
            .sum();
        sent < EAGER_BYTES
    }

    /// The rate controller's in-flight cap is reached: wait for feedback.
    fn window_full(&self) -> bool {
        self.cc
            .in_flight_cap()
            .is_some_and(|cap| self.in_flight_bytes() >= cap)
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        let now_us = self.now_us(now);
        match &mut self.state {
            State::Handshake { deadline_us, .. } => {
                if now_us >= *deadline_us {
                    let secs = self.cfg.connect_timeout.as_secs_f64();
                    self.state = State::Closed;
                    self.events.push_back(Event::Closed {
                        error: Some(format!(
                            "no answer from the server within {secs:.0} s \
                             (is `hayate serve` running there, and is UDP let through?)"
                        )),
                    });
                }
                return;
            }
            State::Draining { until_us } => {
                if now_us >= *until_us {
                    self.state = State::Closed;
                }
                return;
            }
            State::Closed => return,
            _ => {}
        }
        let idle = self.cfg.idle_timeout.as_micros() as u64;
        if now_us >= self.last_rx_us + idle {
            let open = self.open_transfers();
            let what = if open.is_empty() {
                String::new()
            } else {
                let names: Vec<&str> = open.iter().take(5).map(|(_, p)| p.as_str()).collect();
                let more = match open.len().saturating_sub(5) {
                    0 => String::new(),
                    n => format!(" and {n} more"),
                };
                format!("; unfinished: {}{more}", names.join(", "))
            };
            self.state = State::Closed;
            self.events.push_back(Event::Closed {
                error: Some(format!(
                    "the peer went silent for {} s{what}",
                    self.cfg.idle_timeout.as_secs()
                )),
            });
            return;
        }
        if self.keep_alive_due().is_some_and(|d| now_us >= d) {
            self.ping_pending = true;
            self.keep_alive_us = now_us;
        }
        if self.outstanding() && now_us >= self.pto_deadline() {
            self.ctrl_tx.rewind();
            self.ping_pending = true;
            self.pto_count += 1;
            self.pto_base_us = now_us;
        }
    }

    // ----- sending -----

    /// Write the next datagram to send into `buf` (at least `max_datagram()` bytes) and
    /// return its length, or None when nothing may be sent now (see `poll_timeout`).
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        src: &mut dyn BlockSource,
    ) -> Option<usize> {
        let now_us = self.now_us(now);
        match &mut self.state {
            State::Handshake {
                hs,
                next_send_us,
                backoff_us,
                ..
            } => {
                if now_us < *next_send_us {
                    return None;
                }
                let hello = hs.hello();
                buf[..hello.len()].copy_from_slice(hello);
                *next_send_us = now_us + *backoff_us;
                *backoff_us = (*backoff_us * 2).min(1_000_000);
                self.stats.packets_sent += 1;
                return Some(hello.len());
            }
            State::Closed | State::AwaitConfirm => return None,
            State::Draining { .. } => {
                let (code, reason) = self.close_frame.take()?;
                return self.seal_frames(now_us, buf, |w| {
                    Frame::Close {
                        code,
                        reason: &reason,
                    }
                    .encode(w)
                    .ok();
                });
            }
            State::Established => {}
        }

        if std::mem::take(&mut self.hash_work) {
            self.finish_hashes(src);
        }
        let ack_due = self.ack_now
            || self.ack_pending >= ACK_EVERY
            || self.ack_deadline.is_some_and(|d| now_us >= d);
        if ack_due
            || self.ctrl_tx.has_sendable()
            || self.ping_pending
            || self.path_response_due.is_some()
        {
            let sent = self.send_control(now_us, buf, ack_due);
            if !self.ctrl_tx.has_unsent() {
                if let Some(at) = self.ctrl_twice.take() {
                    self.ctrl_tx.resend_from(at);
                }
            }
            if self.bye_sent && !self.ctrl_tx.has_unsent() {
                self.close_us(now_us, 0, "done");
            }
            return sent;
        }
        if self.window_full() {
            self.pacer.idle(now_us);
        } else if self.pacer.can_send(now_us, self.payload_limit) {
            let sent = self.send_data(now_us, buf, src);
            if sent.is_none() {
                self.pacer.idle(now_us);
            }
            return sent;
        } else if !self.has_data_to_send() {
            self.pacer.idle(now_us);
        }
        None
    }

    fn send_control(&mut self, now_us: u64, buf: &mut [u8], with_ack: bool) -> Option<usize> {
        let limit = self.payload_limit - wire::TAG_LEN;
        let ping = std::mem::take(&mut self.ping_pending);
        if ping {
            self.stats.pings_sent += 1;
        }
        // Work around the borrow of self inside the closure: build frames into scratch first.
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.resize(limit - wire::SEALED_HEADER_LEN, 0);
        let mut w = Writer::new(&mut scratch);
        if with_ack {
            self.write_ack(now_us, &mut w);
            self.write_stream_ack(&mut w);
            self.write_loss_maps(&mut w);
        }
        if ping {
            let _ = Frame::Ping.encode(&mut w);
        }
        if let Some(token) = self.path_response_due.take() {
            let _ = Frame::PathResponse(token).encode(&mut w);
        }
        // Control stream bytes, as many as fit.
        let room = w.remaining().saturating_sub(1 + 8 + 8);
        if room > 16 {
            if let Some((offset, data)) = self.ctrl_tx.next_chunk(room) {
                Frame::Ctrl {
                    offset,
                    data: &data,
                }
                .encode(&mut w)
                .expect("sized to fit");
            }
        }
        let n = w.pos();
        let out = self.seal_frames(now_us, buf, |w2| {
            w2.put_bytes(&scratch[..n]).expect("fits");
        });
        self.scratch = scratch;
        out
    }

    fn write_ack(&mut self, now_us: u64, w: &mut Writer<'_>) {
        let (largest_pn, at) = self.largest_rx.unwrap_or((0, now_us));
        let ack = AckFrame {
            largest_pn,
            ack_delay_us: now_us.saturating_sub(at),
            ctrl_offset: self.ctrl_rx.offset(),
            rx_bytes: self.rx_bytes,
            // When the last of those bytes arrived: the rate the sender derives is the
            // path's, not how fast this process happened to get to them.
            rx_time_us: if self.rx_bytes_at_us > 0 {
                self.rx_bytes_at_us
            } else {
                now_us
            },
            rx_buffered: self.rx_buffered,
            rx_buffer: self.rx_buffer,
            rx_drops: self.rx_drops,
        };
        Frame::Ack(ack).encode(w).expect("an ACK always fits");
        self.ack_now = false;
        self.ack_pending = 0;
        self.ack_deadline = None;
    }

    fn write_loss_maps(&mut self, w: &mut Writer<'_>) {
        let ids: Vec<XferId> = self
            .incoming
            .range(self.map_rotation..)
            .chain(self.incoming.range(..self.map_rotation))
            .filter(|(_, i)| i.accepted)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            // Room for the fixed fields (at most 6 varints of 8 bytes + type) and some gaps.
            if w.remaining() < 64 {
                self.map_rotation = id;
                return;
            }
            let inc = self.incoming.get_mut(&id).expect("listed");
            let max_gaps = (w.remaining() - 50) / 6;
            let lm = inc.loss_map(max_gaps);
            if lm.encode_fitting(w).is_err() {
                self.map_rotation = id;
                return;
            }
        }
        self.map_rotation = 0;
    }

    fn send_data(
        &mut self,
        now_us: u64,
        buf: &mut [u8],
        src: &mut dyn BlockSource,
    ) -> Option<usize> {
        // The tunnel's stream first: a keystroke does not wait behind a file.
        if self.stream_sendable() {
            return self.send_stream(now_us, buf);
        }
        // Retransmissions first, then new blocks, in transfer order.
        let mut pick: Option<(XferId, u64, bool)> = None;
        let mut again = false;
        for o in self.outgoing.values_mut() {
            if !o.ready {
                continue;
            }
            if let Some((b, second)) = o.pop_retx() {
                pick = Some((o.id, b, true));
                again = !second;
                break;
            }
        }
        // At the session's tail (nothing new left anywhere) each retransmission goes twice.
        // With many small files that is every batch's tail: their retransmissions double
        // (twice the loss rate instead of once), and each file verifies a round trip sooner.
        if again && self.outgoing.values().all(|o| o.peek_new().is_none()) {
            if let Some((xfer, block, _)) = pick {
                if let Some(o) = self.outgoing.get_mut(&xfer) {
                    o.send_again(block);
                }
            }
        }
        if pick.is_none() {
            // Only files still waiting for `Ready` ask whether there is eager room (a sum over
            // them): the steady state, every file answered, never pays for it.
            for o in self.outgoing.values() {
                if o.ready || (o.eager && self.eager_room()) {
                    if let Some(b) = o.peek_new() {
                        pick = Some((o.id, b, false));
                        break;
                    }
                }
            }
        }
        let (xfer, block, retx) = pick?;
        let pn = self.next_pn;
        let o = self.outgoing.get_mut(&xfer).expect("picked");
        let len = o.layout.len(block);
        let offset = o.layout.offset(block);
        let hdr = wire::SEALED_HEADER_LEN;
        let body = hdr + wire::DATA_HEADER_LEN;
        if !retx && !self.external_hash {
            // Blocks the receiver already had (resume) still count in the file hash.
            let mut skipped = std::mem::take(&mut self.scratch);
            while o.hash_next < block {
                let b = o.hash_next;
                skipped.resize(o.layout.len(b), 0);
                if let Err(e) = src.read(xfer, o.layout.offset(b), &mut skipped) {
                    self.scratch = skipped;
                    self.fail_outgoing(
                        xfer,
                        format!("cannot read {}: {e}", self.outgoing[&xfer].path),
                    );
                    return None;
                }
                o.hash_block(b, &skipped);
            }
            self.scratch = skipped;
        }
        if let Err(e) = src.read(xfer, offset, &mut buf[body..body + len]) {
            let path = o.path.clone();
            self.fail_outgoing(xfer, format!("cannot read {path}: {e}"));
            return None;
        }
        if !retx && !self.external_hash {
            o.hash_block(block, &buf[body..body + len]);
        }
        o.on_sent(block, pn);
        o.sent_bytes += len as u64;
        wire::write_sealed_header(buf, self.peer_cid, pn);
        wire::write_data_header(&mut buf[hdr..], xfer, block);
        let keys = self.keys.as_ref().expect("established");
        let total = keys.send.seal(buf, wire::DATA_HEADER_LEN + len, pn);
        self.next_pn += 1;
        self.record_sent(now_us);
        self.stats.data_packets_sent += 1;
        self.stats.data_bytes_sent += len as u64;
        if retx {
            self.stats.data_packets_retransmitted += 1;
        }
        self.pacer.on_sent(total);
        self.cc.on_sent(now_us, total as u64);
        // The rate may depend on what is in flight (see `RateControl::pacing_rate_with`).
        self.pacer
            .set_rate(self.cc.pacing_rate_with(self.in_flight_bytes()));
        // Last new block out and hashed: announce the file's hash.
        self.maybe_announce(xfer);
        Some(total)
    }

    fn maybe_announce(&mut self, xfer: XferId) {
        let src_hash = match self.outgoing.get_mut(&xfer) {
            Some(o) if !o.sent_announced && o.peek_new().is_none() => {
                if o.hash.is_none() {
                    // Trailing blocks the receiver already had: hashed on the next poll, or
                    // by the driver, which says so with `set_source_hash`.
                    self.hash_work |= !self.external_hash;
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

    fn fail_outgoing(&mut self, xfer: XferId, reason: String) {
        self.retire(xfer);
        self.ctrl_tx.push(&Ctrl::Reject {
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
            .outgoing
            .values()
            .filter(|o| o.ready && !o.sent_announced && o.peek_new().is_none())
            .filter(|o| !self.external_hash || o.hash.is_some())
            .map(|o| o.id)
            .collect();
        for xfer in ids {
            if self.external_hash {
                self.maybe_announce(xfer);
                continue;
            }
            let mut scratch = std::mem::take(&mut self.scratch);
            let o = self.outgoing.get_mut(&xfer).expect("listed");
            let n = o.layout.blocks();
            let mut failed = None;
            while o.hash_next < n {
                let b = o.hash_next;
                scratch.resize(o.layout.len(b), 0);
                if let Err(e) = src.read(xfer, o.layout.offset(b), &mut scratch) {
                    failed = Some(format!("cannot read {}: {e}", o.path));
                    break;
                }
                o.hash_block(b, &scratch);
            }
            self.scratch = scratch;
            match failed {
                Some(reason) => self.fail_outgoing(xfer, reason),
                None => self.maybe_announce(xfer),
            }
        }
    }

    fn record_sent(&mut self, now_us: u64) {
        self.sent_times.push_back(SentRecord {
            at_us: now_us,
            stalled: self.pacer.lost_bytes(),
            idle: self.pacer.idle_bytes(),
            catch_up: self.pacer.catching_up(),
        });
        if self.sent_times.len() > MAX_SENT_HISTORY {
            self.sent_times.pop_front();
            self.sent_base += 1;
        }
        self.stats.packets_sent += 1;
    }

    /// A datagram that carries only a PATH_CHALLENGE with `token`, for the endpoint to send
    /// to an address the peer seems to have moved to (see `Endpoint`). `None` before the
    /// session has keys.
    pub fn seal_path_challenge(
        &mut self,
        now: Instant,
        token: [u8; wire::PATH_TOKEN_LEN],
        buf: &mut [u8],
    ) -> Option<usize> {
        if !matches!(self.state, State::Established | State::AwaitConfirm) {
            return None;
        }
        let now_us = self.now_us(now);
        self.seal_frames(now_us, buf, |w| {
            Frame::PathChallenge(token).encode(w).expect("fits");
        })
    }

    /// From now on the driver supplies every outgoing file's BLAKE3 (see
    /// [`set_source_hash`](Self::set_source_hash)) instead of the connection hashing blocks as
    /// it sends them: the per-byte work leaves the protocol loop, and a resumed send never
    /// reads the blocks the receiver already has just to hash them.
    pub fn hash_sources_outside(&mut self) {
        self.external_hash = true;
    }

    /// While `on`, a PING goes out whenever the peer has been silent for an eighth of the
    /// idle timeout, though nothing awaits an answer: the driver is busy with something the
    /// peer will hear about (hashing a whole file for `--update`), and neither side's idle
    /// timeout may end the session meanwhile. The peer's ACK keeps this side's alive.
    pub fn keep_alive(&mut self, on: bool) {
        self.keep_alive = on;
    }

    /// When the next keep-alive PING is due, if one is.
    /// Also while a download has been asked for and not answered: the request itself is
    /// retransmitted until acknowledged (the control stream), but the server may take long
    /// to answer (hashing for `--update`), and probing at the RTT's pace meanwhile would
    /// be a storm of pings.
    fn keep_alive_due(&self) -> Option<u64> {
        let every = self.cfg.idle_timeout.as_micros() as u64 / 8;
        (self.keep_alive || !self.pending_gets.is_empty())
            .then(|| self.last_rx_us.max(self.keep_alive_us) + every)
    }

    /// Outgoing transfers whose every new block has gone out and whose hash is still
    /// missing: the driver should finish hashing them (see
    /// [`hash_sources_outside`](Self::hash_sources_outside)).
    pub fn sources_awaiting_hash(&self) -> Vec<XferId> {
        self.outgoing
            .values()
            .filter(|o| o.ready && o.hash.is_none() && o.peek_new().is_none())
            .map(|o| o.id)
            .collect()
    }

    /// The BLAKE3 of an outgoing file, computed by the driver; announced to the receiver once
    /// its last new block has gone out.
    pub fn set_source_hash(&mut self, xfer: XferId, hash: [u8; 32]) {
        if let Some(o) = self.outgoing.get_mut(&xfer) {
            o.hash = Some(hash);
            self.maybe_announce(xfer);
        }
    }

    /// An outgoing file could not be read or changed while being sent: the transfer fails
    /// with `reason`, the receiver is told.
    pub fn fail_source(&mut self, xfer: XferId, reason: &str) {
        if self.outgoing.contains_key(&xfer) {
            self.fail_outgoing(xfer, reason.to_string());
        }
    }

    /// The token of the last PATH_RESPONSE the peer sent, once.
    pub fn take_path_response(&mut self) -> Option<[u8; wire::PATH_TOKEN_LEN]> {
        self.path_response_rx.take()
    }

    fn seal_frames(
        &mut self,
        now_us: u64,
        buf: &mut [u8],
        fill: impl FnOnce(&mut Writer<'_>),
    ) -> Option<usize> {
        let keys = self.keys.as_ref()?;
        let hdr = wire::SEALED_HEADER_LEN;
        let limit = self.payload_limit - wire::TAG_LEN;
        let pn = self.next_pn;
        wire::write_sealed_header(buf, self.peer_cid, pn);
        let mut w = Writer::new(&mut buf[hdr..limit]);
        fill(&mut w);
        let n = w.pos();
        let total = keys.send.seal(buf, n, pn);
        self.next_pn += 1;
        self.record_sent(now_us);
        Some(total)
    }
}

fn too_large(path: &str, size: u64) -> String {
    format!(
        "{path}: {size} bytes is more than the protocol can number ({} blocks)",
        wire::BLOCK_LIMIT
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receiver_drops_count_from_the_sessions_start() {
        let psk = Psk::from_bytes([7; 32]);
        let mut c = Connection::client(Config::default(), &psk, AddrFamily::V4, Instant::now());
        // A long-lived socket had dropped 1000 datagrams before this session.
        let drops = |os_drops| ReceiverState {
            os_drops,
            ..ReceiverState::default()
        };
        c.set_receiver_state(drops(1000));
        assert_eq!(c.rx_drops, 0);
        c.set_receiver_state(drops(1005));
        assert_eq!(c.rx_drops, 5);
    }

    /// However many probes went unanswered, the next comes within an eighth of the idle
    /// timeout: a session that lost a few in a row still has several before it gives up.
    #[test]
    fn probes_back_off_to_an_eighth_of_the_idle_timeout() {
        let psk = Psk::from_bytes([7; 32]);
        let cfg = Config::default();
        let most = cfg.idle_timeout.as_micros() as u64 / 8;
        let mut c = Connection::client(cfg, &psk, AddrFamily::V4, Instant::now());
        c.pto_base_us = 1_000;
        let first = c.pto_deadline() - 1_000;
        assert!(first < most, "{first}");
        for n in 1..12 {
            c.pto_count = n;
            let gap = c.pto_deadline() - 1_000;
            assert!(gap <= most, "after {n}: {gap} µs");
            assert!(gap >= first.min(most), "after {n}: {gap} µs");
        }
        c.pto_count = 10;
        assert_eq!(c.pto_deadline() - 1_000, most);
    }

    /// Block numbers are 6 bytes on the wire: a file of more blocks is refused up front, by
    /// the sender and by a receiver offered one, with a reason, never truncated.
    #[test]
    fn files_beyond_the_block_numbering_are_refused() {
        let psk = Psk::from_bytes([7; 32]);
        let now = Instant::now();
        let mut c = Connection::client(Config::default(), &psk, AddrFamily::V4, now);
        let limit = wire::BLOCK_LIMIT * c.block_size as u64;
        assert_eq!(Layout::new(limit, c.block_size).blocks(), wire::BLOCK_LIMIT);
        let big = c.send_file("big", limit + 1, 0o644, 0);
        assert!(!c.outgoing.contains_key(&big));
        match c.poll_event() {
            Some(Event::OutgoingDone {
                xfer,
                result: Err(e),
            }) => {
                assert_eq!(xfer, big);
                assert!(e.contains("more than the protocol can number"), "{e}");
            }
            other => panic!("{other:?}"),
        }

        let get = c.request("remote");
        c.on_ctrl(
            now,
            Ctrl::Offer {
                xfer: get,
                path: "remote".into(),
                size: u64::MAX,
                mode: 0o644,
                mtime: 0,
                flags: 0,
                hash: None,
            },
        );
        assert!(c.incoming.is_empty());
        assert!(matches!(c.poll_event(), Some(Event::Rejected { xfer, .. }) if xfer == get));
    }
}
