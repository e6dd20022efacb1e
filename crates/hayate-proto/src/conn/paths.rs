//! The path to the peer: packet sizes, RTT, rate control and pacing, the receive path each
//! side reports, and path validation (PATH_CHALLENGE/RESPONSE).

use std::time::Instant;

use crate::cc::{Adaptive, AdaptiveParams, Feedback, RateConfig, RateControl};
use crate::pacer::Pacer;
use crate::rtt::{RttEstimator, WindowedMin};
use crate::wire::{self, AddrFamily, Frame};

use super::{CcTraceRow, Connection, State};

/// The path to the peer: packet sizes, RTT, rate control and pacing, what each side
/// reports of its receive path, and path validation.
pub(super) struct PathData {
    pub(super) fam: AddrFamily,
    pub(super) mtu: u16,
    pub(super) block_size: usize,
    pub(super) payload_limit: usize,
    pub(super) rtt: RttEstimator,
    /// The least delay on the way back (the RTT less a data packet's one-way delay, up to
    /// the clocks' offset; see `Connection::on_ack`) in the RTT's window.
    pub(super) back_min: WindowedMin,
    /// The receiver's byte count and its time in the last ACK that counted new bytes.
    pub(super) rx_last_counted: (u64, u64),
    pub(super) cc: Box<dyn RateControl>,
    pub(super) pacer: Pacer,
    /// A PATH_CHALLENGE's token to echo in our next packet.
    pub(super) response_due: Option<[u8; wire::PATH_TOKEN_LEN]>,
    /// The last PATH_RESPONSE's token, for the endpoint (see [`Connection::take_path_response`]).
    pub(super) response_rx: Option<[u8; wire::PATH_TOKEN_LEN]>,
    // This host's receive path, as the driver reports it (see `set_receiver_state`).
    pub(super) rx_buffered: u64,
    pub(super) rx_buffer: u64,
    pub(super) rx_drops: u64,
    pub(super) rx_drops_base: Option<u64>,
    /// This host's storage room (see `BlockSink::room`), and what the last ACK said of it.
    pub(super) store_room: u64,
    pub(super) store_room_sent: u64,
    /// The peer's storage room, from its latest ACK: at most this much in flight.
    pub(super) peer_store_room: u64,
    // The peer's receive path, from its ACKs: the last (bytes, time) report and drop count.
    pub(super) prev_ack_rx: Option<(u64, u64)>,
    pub(super) peer_drops: u64,
    /// Every feedback and the rate it led to, when asked for (tuning the controller on real
    /// paths needs what it saw, not only what it did).
    pub(super) cc_trace: Option<Vec<CcTraceRow>>,
}

/// What the I/O shell knows of this host's receive path (see
/// [`Connection::set_receiver_state`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiverState {
    /// Bytes waiting in the socket's receive buffer, as the kernel counts them
    /// (per-datagram overhead included).
    pub buffered: u64,
    /// The socket receive buffer's size, counted the same way; 0: unknown.
    pub buffer: u64,
    /// Datagrams the OS dropped because that buffer was full, counted since the socket opened.
    pub os_drops: u64,
    /// File bytes this side's storage takes now (`BlockSink::room`); `None`: no limit.
    pub store_room: Option<u64>,
}

/// A storage window below this counts as shut, and one opened to twice this is
/// advertised at once (see [`Connection::set_receiver_state`]).
const STORE_UPDATE: u64 = 1 << 20;

impl Connection {
    /// Runs the adaptive controller with these tunables instead of the defaults, from now
    /// on (the simulator's ablation runs); a fixed or unlimited rate is left as it is.
    pub fn set_adaptive_params(&mut self, p: AdaptiveParams) {
        if let RateConfig::Adaptive { max, min, .. } = self.cfg.rate {
            self.path.cc = Box::new(Adaptive::with_params(max, min, p));
            self.path.pacer.set_rate(self.path.cc.pacing_rate());
        }
    }

    /// Starts recording every feedback the rate controller gets (see [`CcTraceRow`]).
    pub fn enable_cc_trace(&mut self) {
        self.path.cc_trace.get_or_insert_with(Vec::new);
    }

    /// The rows recorded since the last call.
    pub fn take_cc_trace(&mut self) -> Vec<CcTraceRow> {
        self.path
            .cc_trace
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The rate controller (for its state in stats and traces).
    pub fn rate_controller(&self) -> &dyn RateControl {
        &*self.path.cc
    }

    /// The I/O shell reports the receiver-side facts the peer's rate controller wants; the
    /// next ACK carries them.
    pub fn set_receiver_state(&mut self, st: ReceiverState) {
        self.path.rx_buffer = st.buffer;
        self.path.rx_buffered = if st.buffer > 0 { st.buffered } else { 0 };
        // The socket's counter runs for its whole life (a server's spans many sessions):
        // report only the drops since this session first looked.
        let base = *self.path.rx_drops_base.get_or_insert(st.os_drops);
        self.path.rx_drops = st.os_drops.saturating_sub(base);
        self.path.store_room = st.store_room.unwrap_or(u64::MAX);
        // A window that was nearly shut and has opened: say so now, or a sender that
        // stopped for it would wait for its probe timeout.
        if self.path.store_room_sent < STORE_UPDATE && self.path.store_room >= 2 * STORE_UPDATE {
            self.space.ack_now = true;
        }
    }

    pub(super) fn in_flight_bytes(&self) -> u64 {
        // Sent minus delivered minus declared lost: an estimate good enough for pacing caps.
        self.stats.data_bytes_sent.saturating_sub(
            self.stats.data_bytes_acked + self.stats.data_bytes_lost + self.xfers.retired_in_flight,
        )
    }

    /// The rate controller's in-flight cap is reached: wait for feedback.
    ///
    /// Never with nothing in flight: only an acknowledgement moves the controller, and with
    /// nothing in flight none is coming, nor a probe timeout (nothing is outstanding). A cap
    /// at or below zero bytes (the adaptive controller's startup hold, taken when everything
    /// had just been acknowledged) would otherwise stop the session for good with data
    /// waiting: the tunnel's far side held 16 MiB unsent, its reader idle, both ends asleep.
    ///
    /// Nor past the room the peer's storage last said it had (its receive window).
    pub(super) fn window_full(&self) -> bool {
        let in_flight = self.in_flight_bytes();
        in_flight > 0
            && (in_flight >= self.path.peer_store_room
                || self
                    .path
                    .cc
                    .in_flight_cap()
                    .is_some_and(|cap| in_flight >= cap))
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

    /// The token of the last PATH_RESPONSE the peer sent, once.
    pub fn take_path_response(&mut self) -> Option<[u8; wire::PATH_TOKEN_LEN]> {
        self.path.response_rx.take()
    }

    /// PATH_CHALLENGE: echo its token in our next packet.
    pub(super) fn on_path_challenge(&mut self, token: [u8; wire::PATH_TOKEN_LEN]) {
        self.path.response_due = Some(token);
    }

    /// PATH_RESPONSE: kept for the endpoint, which sent the challenge.
    pub(super) fn on_path_response(&mut self, token: [u8; wire::PATH_TOKEN_LEN]) {
        self.path.response_rx = Some(token);
    }

    /// What one packet's ACK and loss maps said goes to the rate controller, and the
    /// pacer takes the rate it sets.
    pub(super) fn on_feedback(&mut self, mut fb: Feedback) {
        fb.srtt_us = self.path.rtt.srtt();
        fb.min_rtt_us = self.path.rtt.min();
        fb.in_flight = self.in_flight_bytes();
        self.path.cc.on_feedback(&fb);
        self.path.pacer.on_fates(
            (
                fb.catch_up_lost_bytes,
                fb.catch_up_lost_bytes + fb.catch_up_delivered,
            ),
            (
                fb.lost_bytes - fb.catch_up_lost_bytes,
                fb.lost_bytes + fb.delivered - fb.catch_up_lost_bytes - fb.catch_up_delivered,
            ),
        );
        let rate = self.path.cc.pacing_rate_with(fb.in_flight);
        self.path.pacer.set_rate(rate);
        // Whether the controller competes changes only with what a feedback tells it.
        self.path.pacer.set_make_up(self.path.cc.makes_up_stalls());
        if let Some(t) = &mut self.path.cc_trace {
            t.push(CcTraceRow {
                feedback: fb,
                rate: rate.unwrap_or(0),
                state: self.path.cc.name(),
                sent_bytes: self.stats.data_bytes_sent,
                cap: self.path.cc.in_flight_cap().unwrap_or(0),
                pacer_lost: self.path.pacer.lost_bytes(),
                catch_up_room: self.path.pacer.catch_up_room(),
                wake_late_us: self.path.pacer.lateness_us(),
            });
        }
    }
}
