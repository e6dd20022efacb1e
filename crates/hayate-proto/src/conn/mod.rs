//! One session between a client and a server: handshake, sealing, acknowledgements, the
//! control stream, and any number of file transfers in either direction.
//!
//! Sans-IO: the caller passes datagrams and the current time in, asks for datagrams to send
//! and for the next deadline, and reads events. File data goes through [`BlockSource`] and
//! [`BlockSink`], so the core never touches a file.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cc::{Feedback, RateConfig, RememberedPath};
use crate::control::{Ctrl, CtrlRecv, CtrlSend};
use crate::crypto::{CryptoError, Opened, PacketKey, Psk, ReplayWindow};
use crate::pacer::Pacer;
use crate::rng::Rng;
use crate::rtt::{RttEstimator, WindowedMin};
use crate::stream::CONTROL_STREAM_ID;
use crate::wire::{self, AddrFamily, Cid, Frame};

mod delta;
mod events;
mod paths;
mod spaces;
mod state;
mod stats;
mod storage;
mod streams;
#[cfg(test)]
mod test_pair;
mod timers;
mod transfers;
mod transmit;
mod tunnel;

pub use events::Event;
pub use paths::ReceiverState;
pub use stats::{CcTraceRow, Stats};
pub use storage::{BlockSink, BlockSource, NoFiles, StorageError};
pub use transfers::{FileOffer, MAX_INCOMING_BLOCKS, MAX_OPEN_INCOMING};

/// A datagram [`Connection::poll_transmit_deferred`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Its length, the AEAD tag included.
    pub len: usize,
    /// Still to be sealed, under this packet number, with [`Connection::send_key`]
    /// (`PacketKey::seal_datagram`); None: it goes as it is (a hello).
    pub seal_pn: Option<u64>,
}

use paths::PathData;
use spaces::PacketSpace;
use state::{Hello, State};
use streams::ControlStream;
use timers::Timers;
use transfers::Transfers;

/// A session's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest IP packet to send (client: requested; server: the most it allows).
    pub mtu: u16,
    /// How fast to send: fixed, unlimited or adaptive (the server may narrow what the client
    /// asks for).
    pub rate: RateConfig,
    /// Give up when the peer is silent this long.
    pub idle_timeout: Duration,
    /// Client: give up when no handshake answer arrives in this time.
    pub connect_timeout: Duration,
    /// The path to this peer as an earlier session measured it: an adaptive sender starts
    /// near its rate once the path confirms it (see [`RateControl::remember`]). Only the
    /// sender's controller uses it: a client's uploads.
    ///
    /// [`RateControl::remember`]: crate::cc::RateControl::remember
    pub remembered: Option<RememberedPath>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mtu: 1500,
            rate: RateConfig::Fixed(100_000_000 / 8),
            idle_timeout: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(5),
            remembered: None,
        }
    }
}

/// Which end of the session this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Connects, asks for and sends files.
    Client,
    /// Accepts sessions and answers their requests.
    Server,
}

/// One session between a client and a server, sans-IO: feed it datagrams
/// ([`handle_datagram_at`](Self::handle_datagram_at)) and the time
/// ([`handle_timeout`](Self::handle_timeout)), take datagrams
/// ([`poll_transmit`](Self::poll_transmit)), the next deadline
/// ([`poll_timeout`](Self::poll_timeout)) and events ([`poll_event`](Self::poll_event)).
pub struct Connection {
    side: Side,
    cfg: Config,
    psk: Psk,
    state: State,
    /// CLOSE to send (again) while draining: code and reason.
    close_frame: Option<(u64, String)>,
    /// Time zero of every `_us` value in this session.
    epoch: Instant,
    my_cid: Cid,
    peer_cid: Cid,
    path: PathData,
    space: PacketSpace,
    timers: Timers,
    ctrl: ControlStream,
    xfers: Transfers,
    /// `hayate tunnel`'s byte stream, once asked for (see `tunnel.rs`).
    tunnel: Option<Box<tunnel::Tunnel>>,
    events: VecDeque<Event>,
    stats: Stats,
    /// A reusable buffer (frames being built, blocks read only to hash them).
    scratch: Vec<u8>,
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
        let mut cc = cfg.rate.build();
        if let Some(p) = cfg.remembered {
            cc.remember(p);
        }
        let mtu = cfg.mtu;
        let mut pacer = Pacer::new(wire::udp_payload_limit(mtu, fam));
        pacer.set_rate(cc.pacing_rate());
        Connection {
            side,
            psk,
            state: State::Closed,
            close_frame: None,
            epoch: now,
            my_cid: 0,
            peer_cid: 0,
            path: PathData {
                fam,
                mtu,
                block_size: wire::block_size(mtu, fam),
                payload_limit: wire::udp_payload_limit(mtu, fam),
                rtt: RttEstimator::default(),
                back_min: WindowedMin::default(),
                rx_last_counted: (0, 0),
                pacer,
                cc,
                response_due: None,
                response_rx: None,
                rx_buffered: 0,
                rx_buffer: 0,
                rx_drops: 0,
                rx_drops_base: None,
                store_room: u64::MAX,
                store_room_sent: u64::MAX,
                peer_store_room: u64::MAX,
                prev_ack_rx: None,
                peer_drops: 0,
                cc_trace: None,
            },
            space: PacketSpace {
                keys: None,
                defer_seal: false,
                unsealed: None,
                replay: ReplayWindow::new(),
                largest_rx: None,
                ack_pending: 0,
                ack_deadline: None,
                last_ack_us: 0,
                ack_now: false,
                rx_bytes: 0,
                rx_bytes_at_us: 0,
                next_pn: 0,
                sent_base: 0,
                sent_times: VecDeque::new(),
                largest_acked: None,
                reordering: Default::default(),
            },
            timers: Timers {
                last_rx_us: 0,
                pto_base_us: 0,
                pto_count: 0,
                ping_pending: false,
                keep_alive: false,
                keep_alive_us: 0,
            },
            ctrl: ControlStream {
                tx: CtrlSend::default(),
                rx: CtrlRecv::default(),
                twice: None,
                bye_sent: false,
                next_meta: 1,
            },
            xfers: Transfers {
                outgoing: BTreeMap::new(),
                incoming: BTreeMap::new(),
                pending_gets: BTreeMap::new(),
                map_rotation: 0,
                next_xfer: 1,
                retired_in_flight: 0,
                stash_pending: false,
                hash_work: false,
                source_blocked: false,
                external_hash: false,
            },
            tunnel: None,
            events: VecDeque::new(),
            stats: Stats::default(),
            scratch: Vec::new(),
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
        let deadline_us = cfg.connect_timeout.as_micros() as u64;
        let hello = Hello::new(psk, cfg.mtu, rng, deadline_us);
        let (rate_max, rate_min, adaptive, policy) = cfg.rate.to_params();
        let mut c = Connection::base(Side::Client, cfg, psk.clone(), fam, now);
        c.ctrl.tx.push(&Ctrl::Params {
            rate_max,
            rate_min,
            adaptive,
            policy,
        });
        c.my_cid = hello.attempts[0].client_cid();
        c.state = State::Handshake(Box::new(hello));
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
        c.space.keys = Some(accept.keys);
        c.state = State::AwaitConfirm;
        c
    }

    fn now_us(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_micros() as u64
    }

    /// Whether this is the client or the server end.
    pub fn side(&self) -> Side {
        self.side
    }

    /// Our connection id: the one the peer puts in the packets it sends us.
    pub fn my_cid(&self) -> Cid {
        self.my_cid
    }

    /// Bytes of file per DATA frame (set by the MTU; final once the handshake is done).
    pub fn block_size(&self) -> usize {
        self.path.block_size
    }

    /// The MTU agreed in the handshake (before it, the configured one).
    pub fn mtu(&self) -> u16 {
        self.path.mtu
    }

    /// Largest datagram this session sends; size transmit buffers to it.
    pub fn max_datagram(&self) -> usize {
        self.path.payload_limit.max(wire::CLIENT_HELLO_LEN)
    }

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
        self.handle_input(now, arrived, data, None, sink)
    }

    /// [`handle_datagram_at`](Self::handle_datagram_at) for a sealed datagram a driver
    /// opened already, on another thread, under this session's receive key
    /// ([`recv_key`](Self::recv_key), `PacketKey::open_datagram`), or failed to open (then
    /// `data` is garbage and only counted). Everything else is checked as for any datagram:
    /// that it is for this session, fresh (not a replay), and well formed.
    pub fn handle_opened_at(
        &mut self,
        now: Instant,
        arrived: Instant,
        data: &mut [u8],
        opened: Result<Opened, CryptoError>,
        sink: &mut dyn BlockSink,
    ) -> bool {
        self.handle_input(now, arrived, data, Some(opened), sink)
    }

    /// The key that opens what the peer sends, once the handshake agreed it.
    pub fn recv_key(&self) -> Option<&Arc<PacketKey>> {
        self.space.keys.as_ref().map(|k| &k.recv)
    }

    fn handle_input(
        &mut self,
        now: Instant,
        arrived: Instant,
        data: &mut [u8],
        opened: Option<Result<Opened, CryptoError>>,
        sink: &mut dyn BlockSink,
    ) -> bool {
        let now_us = self.now_us(now);
        // Not capped at `now`: a driver reads the clock once per loop, so a datagram often
        // arrived after the `now` it is handled with, and capping it would date it early
        // (an ACK's RTT would read short and spoil the minimum RTT).
        let rx_at_us = self.now_us(arrived);
        if let Some(taken) = self.handle_handshake_datagram(now_us, data) {
            return taken;
        }
        if matches!(self.state, State::Closed) {
            self.stats.dropped_unexpected += 1;
            return false;
        }
        let Some((pn, plain)) = self.open_packet(data, opened) else {
            return false;
        };
        self.space.replay.mark(pn);
        self.stats.packets_received += 1;
        self.timers.last_rx_us = now_us;
        if matches!(self.state, State::AwaitConfirm) {
            self.on_confirmed(now_us);
        }
        if let State::Draining { .. } = self.state {
            self.on_packet_while_draining();
            return true;
        }
        if self.space.largest_rx.is_none_or(|(l, _)| pn > l) {
            self.space.largest_rx = Some((pn, rx_at_us));
        }

        if self.xfers.stash_pending {
            self.flush_stashes(sink);
        }
        self.handle_frames(now, now_us, rx_at_us, plain, sink);
        true
    }

    /// Acts on the frames of an authentic, fresh packet, in order, each by its handler;
    /// then feeds the rate controller what the ACK and loss maps said, and schedules our
    /// ACK. A CLOSE, or a control stream the peer broke, ends it at once.
    fn handle_frames(
        &mut self,
        now: Instant,
        now_us: u64,
        rx_at_us: u64,
        plain: &[u8],
        sink: &mut dyn BlockSink,
    ) {
        let mut eliciting = false;
        let mut has_data = false;
        let mut fb: Option<Feedback> = None;
        // The control stream's acknowledgement: the ACK's in-order end and the map, if the
        // packet has one, taken together after the packet's frames.
        let mut ctrl_cum = None;
        let mut ctrl_map = None;
        for frame in wire::parse_frames(plain).map_while(Result::ok) {
            match frame {
                Frame::Padding => {}
                Frame::Ping => {
                    eliciting = true;
                    self.on_ping();
                }
                Frame::Ack(a) => {
                    ctrl_cum = Some(a.ctrl_offset);
                    fb = Some(self.on_ack(now_us, rx_at_us, &a));
                }
                Frame::Ctrl { offset, data } => {
                    eliciting = true;
                    if self.on_ctrl_frame(now, rx_at_us, offset, data).is_break() {
                        return;
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
                Frame::Stream { offset, fin, data } => {
                    eliciting = true;
                    has_data = true;
                    if let Err(e) = self.on_stream(rx_at_us, offset, fin, data) {
                        self.close(now, 2, &format!("protocol error: {e}"));
                        return;
                    }
                }
                Frame::StreamAck(a) if a.map.xfer == CONTROL_STREAM_ID => ctrl_map = Some(a),
                Frame::StreamAck(a) => {
                    let fb = fb.get_or_insert_with(|| Feedback {
                        now_us,
                        ..Default::default()
                    });
                    self.on_stream_ack(&a, fb);
                }
                Frame::PathChallenge(token) => self.on_path_challenge(token),
                Frame::PathResponse(token) => self.on_path_response(token),
                Frame::Close { code, reason } => {
                    self.on_close_frame(now_us, code, reason);
                    return;
                }
            }
        }
        if let Some(cum) = ctrl_cum {
            self.on_ctrl_ack(cum, ctrl_map.as_ref());
        }
        if let Some(fb) = fb {
            self.on_feedback(fb);
        }
        if eliciting {
            self.schedule_ack(now_us, has_data);
        }
    }

    /// As [`poll_transmit`](Self::poll_transmit), but a sealed packet is left for the caller
    /// to seal ([`Transmit::seal_pn`], with [`send_key`](Self::send_key)), so that a driver
    /// can seal on another thread than the protocol's. The datagram's length already counts
    /// the tag; its last 16 bytes are where it goes.
    pub fn poll_transmit_deferred(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        src: &mut dyn BlockSource,
    ) -> Option<Transmit> {
        self.space.defer_seal = true;
        self.space.unsealed = None;
        let len = self.poll_transmit(now, buf, src);
        self.space.defer_seal = false;
        let seal_pn = self.space.unsealed.take();
        len.map(|len| Transmit { len, seal_pn })
    }

    /// The key that seals what this side sends, once the handshake agreed it.
    pub fn send_key(&self) -> Option<&Arc<PacketKey>> {
        self.space.keys.as_ref().map(|k| &k.send)
    }

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
            State::Handshake(h) => {
                let n = h.poll_send(now_us)?.write_datagram(self.path.fam, buf);
                self.stats.packets_sent += 1;
                return Some(n);
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

        self.arm_pto_if_quiet(now_us);
        if std::mem::take(&mut self.xfers.hash_work) {
            self.finish_hashes(src);
        }
        let ack_due = self.space.ack_now || self.space.ack_deadline.is_some_and(|d| now_us >= d);
        if ack_due
            || self.ctrl_urgent()
            || self.timers.ping_pending
            || self.path.response_due.is_some()
        {
            let sent = self.send_control(now_us, buf, ack_due);
            if !self.ctrl.tx.has_unsent() {
                if let Some(at) = self.ctrl.twice.take() {
                    self.ctrl.tx.send_again_from(at);
                }
            }
            if self.ctrl.bye_sent && !self.ctrl.tx.has_unsent() {
                self.close_us(now_us, 0, "done");
            }
            return sent;
        }
        if self.ctrl_bulk() && self.path.pacer.can_send(now_us, self.path.payload_limit) {
            // Bulk control (a delta's leaf hashes, a big listing) first, paced, and not held
            // by the in-flight window: that counts DATA, and blocks sent before `Ready` stay
            // in flight until the `Ready` these leaf hashes lead to.
            return self.send_control(now_us, buf, false);
        }
        if self.window_full() {
            self.path.pacer.idle(now_us);
        } else if self.path.pacer.can_send(now_us, self.path.payload_limit) {
            let sent = self.send_data(now_us, buf, src);
            if sent.is_none() {
                self.path.pacer.app_idle(now_us);
            }
            return sent;
        } else if !self.has_data_to_send() {
            self.path.pacer.app_idle(now_us);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::Layout;

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
        assert_eq!(c.path.rx_drops, 0);
        c.set_receiver_state(drops(1005));
        assert_eq!(c.path.rx_drops, 5);
    }

    /// However many probes went unanswered, the next comes within an eighth of the idle
    /// timeout: a session that lost a few in a row still has several before it gives up.
    #[test]
    fn probes_back_off_to_an_eighth_of_the_idle_timeout() {
        let psk = Psk::from_bytes([7; 32]);
        let cfg = Config::default();
        let most = cfg.idle_timeout.as_micros() as u64 / 8;
        let mut c = Connection::client(cfg, &psk, AddrFamily::V4, Instant::now());
        c.timers.pto_base_us = 1_000;
        let first = c.pto_deadline() - 1_000;
        assert!(first < most, "{first}");
        for n in 1..12 {
            c.timers.pto_count = n;
            let gap = c.pto_deadline() - 1_000;
            assert!(gap <= most, "after {n}: {gap} µs");
            assert!(gap >= first.min(most), "after {n}: {gap} µs");
        }
        c.timers.pto_count = 10;
        assert_eq!(c.pto_deadline() - 1_000, most);
    }

    /// Block numbers are 6 bytes on the wire: a file of more blocks is refused up front, by
    /// the sender and by a receiver offered one, with a reason, never truncated.
    #[test]
    fn files_beyond_the_block_numbering_are_refused() {
        let psk = Psk::from_bytes([7; 32]);
        let now = Instant::now();
        let mut c = Connection::client(Config::default(), &psk, AddrFamily::V4, now);
        let limit = wire::BLOCK_LIMIT * c.path.block_size as u64;
        assert_eq!(
            Layout::new(limit, c.path.block_size).blocks(),
            wire::BLOCK_LIMIT
        );
        let big = c.send_file("big", limit + 1, 0o644, 0);
        assert!(!c.xfers.outgoing.contains_key(&big));
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
        assert!(c.xfers.incoming.is_empty());
        assert!(matches!(c.poll_event(), Some(Event::Rejected { xfer, .. }) if xfer == get));
    }
}
