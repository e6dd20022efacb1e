//! The packet number space: sealing keys, the replay window, what to acknowledge and when,
//! and what the sender remembers of each packet for RTT and loss decisions.

use std::collections::VecDeque;

use crate::cc::Feedback;
use crate::crypto::{CryptoError, Opened, ReplayWindow, SessionKeys};
use crate::transfer::REORDER_PACKETS;
use crate::wire::{self, AckFrame, Frame, Writer};

use super::Connection;

/// ACK cadence: every 32 data packets, or 5 ms after the first unacknowledged one; on a
/// long path at most `ACKS_PER_RTT` times a minimum RTT (see
/// [`Connection::ack_spacing_us`]).
pub(super) const ACK_EVERY: u32 = 32;

pub(super) const ACK_DELAY_US: u64 = 5_000;

/// ACKs a round trip needs at most: the controller reads a round from a few, and the
/// reverse path may be thin. An ACK every 32 packets is 800 a second at 300 Mbit/s, 0.6
/// Mbit/s of feedback, and on a long lossy path each carries the loss map of a round trip's
/// losses: 1.3 Mbit/s at 250 ms and 1 %, more than a satellite's 1 Mbit/s return channel.
/// At 32 a round an ACK acknowledges 3 % of a BDP and tells a loss 3 % of an RTT later than
/// at once; at 16 the feedback halved again but ACK aggregation (Wi-Fi, cable) cost 1-2
/// points of the link (`bench/sim-matrix`).
pub(super) const ACKS_PER_RTT: u64 = 32;

/// The most that spacing holds an ACK back (QUIC's default `max_ack_delay`): a minimum RTT
/// taken from a slow handshake cannot hold feedback back for long.
pub(super) const MAX_ACK_SPACING_US: u64 = 25_000;

/// Sent-packet times kept for RTT and reordering decisions.
pub(super) const MAX_SENT_HISTORY: usize = 1 << 22;

/// What the sender remembers of one packet it sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct SentRecord {
    pub(super) at_us: u64,
    /// The pacer's sending time lost to the host by then (see [`Feedback::send_stall_bytes`]),
    /// and left unused for want of data or room in flight ([`Feedback::send_idle_bytes`]).
    pub(super) stalled: u64,
    pub(super) idle: u64,
    /// Of `idle`, the time with nothing at all to send ([`Feedback::send_app_idle_bytes`]).
    pub(super) app_idle: u64,
    /// Sent as part of the pacer's catch-up (see `Pacer::catching_up`).
    pub(super) catch_up: bool,
    /// Carried DATA or tunnel stream bytes (what the receiver counts in `rx_bytes`).
    pub(super) data: bool,
}

/// The packet number space: keys, what was received and is to be acknowledged, and what
/// was sent.
pub(super) struct PacketSpace {
    pub(super) keys: Option<SessionKeys>,
    /// The driver seals what `poll_transmit` writes (`Connection::poll_transmit_deferred`).
    pub(super) defer_seal: bool,
    /// The packet number of the datagram just written and left unsealed.
    pub(super) unsealed: Option<u64>,

    // Receiving packets from the peer.
    pub(super) replay: ReplayWindow,
    /// Largest packet number received, and when it arrived (µs).
    pub(super) largest_rx: Option<(u64, u64)>,
    pub(super) ack_pending: u32,
    pub(super) ack_deadline: Option<u64>,
    /// When the last ACK went out.
    pub(super) last_ack_us: u64,
    pub(super) ack_now: bool,
    /// Data bytes received (the ACK reports them for the sender's delivery rate).
    pub(super) rx_bytes: u64,
    /// Arrival time of the last data counted in `rx_bytes`, µs.
    pub(super) rx_bytes_at_us: u64,

    // Sending packets to the peer.
    pub(super) next_pn: u64,
    pub(super) sent_base: u64,
    /// Per packet number from `sent_base`: what the sender knows of its sending.
    pub(super) sent_times: VecDeque<SentRecord>,
    pub(super) largest_acked: Option<u64>,
    /// How much reordering the loss rule allows.
    pub(super) reordering: Reordering,
}

/// How much reordering the loss rule allows, as RACK's reordering window (RFC 8985, 6.2):
/// at first a packet is lost once [`REORDER_PACKETS`] later ones, or one sent an eighth of
/// the smoothed RTT (at least 1 ms) after it, were acknowledged. A loss found to have been
/// declared wrongly (its block arrived after all: the path reorders) drops the packet count
/// for the session and doubles the time allowance, at most once a round trip and up to one
/// smoothed RTT; the allowance halves again after 16 round trips without such a loss.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reordering {
    /// Reordering was seen: only the time allowance counts.
    seen: bool,
    /// The time allowance in eighths of the smoothed RTT.
    eighths: u64,
    /// When `eighths` last changed, µs.
    changed_us: u64,
}

impl Default for Reordering {
    fn default() -> Self {
        Reordering {
            seen: false,
            eighths: 1,
            changed_us: 0,
        }
    }
}

impl Reordering {
    /// Some blocks' losses were declared wrongly.
    pub(super) fn on_spurious(&mut self, now_us: u64, srtt_us: u64) {
        self.seen = true;
        if self.eighths < 8 && now_us >= self.changed_us + srtt_us {
            self.eighths *= 2;
            self.changed_us = now_us;
        }
    }

    /// A loss map came with no loss declared wrongly.
    pub(super) fn on_quiet(&mut self, now_us: u64, srtt_us: u64) {
        if self.eighths > 1 && now_us >= self.changed_us + 16 * srtt_us {
            self.eighths /= 2;
            self.changed_us = now_us;
        }
    }

    /// Packets a later acknowledged packet must be ahead by, and µs it must have been sent
    /// after, for an earlier one to be lost.
    fn allowance(&self, srtt_us: u64) -> (u64, u64) {
        let packets = if self.seen { u64::MAX } else { REORDER_PACKETS };
        (packets, (srtt_us * self.eighths / 8).max(1_000))
    }
}

/// Keeps the differences between the receiver's clock and ours positive: the two start at
/// different moments (each at its own session start), by up to about a round trip.
const CLOCK_BIAS_US: u64 = 1 << 40;

impl Connection {
    pub(super) fn on_ack(&mut self, now_us: u64, rx_at_us: u64, a: &AckFrame) -> Feedback {
        let mut fb = Feedback {
            now_us,
            ..Default::default()
        };
        if a.largest_pn < self.space.next_pn
            && self.space.largest_acked.is_none_or(|l| a.largest_pn > l)
        {
            let prev = self.space.largest_acked.and_then(|l| self.sent_record(l));
            self.space.largest_acked = Some(a.largest_pn);
            if let Some(sent) = self.sent_record(a.largest_pn) {
                if let Some(before) = prev {
                    fb.send_stall_bytes = sent.stalled.saturating_sub(before.stalled);
                    fb.send_idle_bytes = sent.idle.saturating_sub(before.idle);
                    fb.send_app_idle_bytes = sent.app_idle.saturating_sub(before.app_idle);
                }
                let raw = rx_at_us.saturating_sub(sent.at_us);
                let rtt = if raw > a.ack_delay_us {
                    raw - a.ack_delay_us
                } else {
                    raw
                };
                self.path.rtt.on_sample(now_us, rtt);
                fb.rtt_us = Some(rtt);
                fb.rtt_sent_us = sent.at_us;
                fb.rx_lag_us = a.ack_delay_us;
                // A data packet whose bytes the ACK newly counts was dated on arrival by the
                // receiver (`rx_time_us`): the RTT less that one-way delay is the way back,
                // up to the offset between the two hosts' clocks, and its rise over its
                // least is what the ACKs waited behind on the way back.
                let (b0, t0) = self.path.rx_last_counted;
                let fresh = a.rx_bytes > b0 && a.rx_time_us > t0;
                if fresh {
                    self.path.rx_last_counted = (a.rx_bytes, a.rx_time_us);
                }
                if sent.data && fresh {
                    let owd = (a.rx_time_us + CLOCK_BIAS_US).saturating_sub(sent.at_us);
                    let back = (rtt + 2 * CLOCK_BIAS_US).saturating_sub(owd);
                    let least = self.path.back_min.push(now_us, back);
                    fb.back_queue_us = Some(back - least);
                }
            }
            // Forget send times nobody will ask for again.
            let keep_from = a.largest_pn.saturating_sub(4 * REORDER_PACKETS.max(1024));
            while self.space.sent_base < keep_from && !self.space.sent_times.is_empty() {
                self.space.sent_times.pop_front();
                self.space.sent_base += 1;
            }
        }
        self.timers.pto_base_us = now_us;
        self.timers.pto_count = 0;
        if let Some((b0, t0)) = self.path.prev_ack_rx {
            if a.rx_time_us > t0 + 1_000 && a.rx_bytes >= b0 {
                // The receiver counts payload; the pacer counts whole datagrams.
                let payload = (a.rx_bytes - b0) as u128 * 1_000_000 / (a.rx_time_us - t0) as u128;
                let per_dgram = (self.path.block_size
                    + wire::SEALED_HEADER_LEN
                    + wire::DATA_HEADER_LEN
                    + wire::TAG_LEN) as u128;
                fb.rx_rate = Some((payload * per_dgram / self.path.block_size as u128) as u64);
                fb.rx_interval_us = a.rx_time_us - t0;
                self.path.prev_ack_rx = Some((a.rx_bytes, a.rx_time_us));
            }
        } else {
            self.path.prev_ack_rx = Some((a.rx_bytes, a.rx_time_us));
        }
        fb.rx_buffered = a.rx_buffered;
        fb.rx_buffer = a.rx_buffer;
        fb.rx_drops = a.rx_drops.saturating_sub(self.path.peer_drops);
        self.path.peer_drops = self.path.peer_drops.max(a.rx_drops);
        self.path.peer_store_room = match a.store_room {
            wire::MAX_VARINT => u64::MAX,
            n => n,
        };
        fb
    }

    pub(super) fn sent_record(&self, pn: u64) -> Option<SentRecord> {
        self.space.sent_record(pn)
    }
}

impl PacketSpace {
    pub(super) fn sent_time(&self, pn: u64) -> Option<u64> {
        self.sent_record(pn).map(|r| r.at_us)
    }

    pub(super) fn sent_record(&self, pn: u64) -> Option<SentRecord> {
        if pn < self.sent_base {
            return None;
        }
        self.sent_times.get((pn - self.sent_base) as usize).copied()
    }

    /// The loss rule every acknowledgement (loss maps, the streams' maps) is read with:
    /// [`PacketSpace::overtaken`] by the last packet the peer acknowledged, with the
    /// reordering allowance of [`Reordering`]. Nothing is lost before the peer acknowledged
    /// anything.
    pub(super) fn loss_rule(&self, srtt_us: u64) -> impl Fn(u64) -> bool + '_ {
        let (packets, reorder_us) = self.reordering.allowance(srtt_us);
        let rule = self
            .largest_acked
            .map(|l| self.overtaken(l, packets, reorder_us));
        move |pn| rule.as_ref().is_some_and(|r| r(pn))
    }

    /// The loss rule of loss maps and the tunnel's stream acknowledgements alike: what was
    /// sent in packet `pn` is lost once `largest` (the packet the peer acknowledged last)
    /// overtook it by `packets` packets or by `reorder_us`; until then it may still be on
    /// its way.
    pub(super) fn overtaken(
        &self,
        largest: u64,
        packets: u64,
        reorder_us: u64,
    ) -> impl Fn(u64) -> bool + '_ {
        let largest_time = self.sent_time(largest);
        move |pn: u64| {
            if pn >= largest {
                return false;
            }
            if largest - pn >= packets {
                return true;
            }
            match (self.sent_record(pn), largest_time) {
                (Some(r), Some(lt)) => r.at_us + reorder_us <= lt,
                _ => true,
            }
        }
    }

    /// Whether packet `pn` went out in the pacer's catch-up (see `Pacer::catching_up`).
    pub(super) fn caught_up(&self) -> impl Fn(u64) -> bool + '_ {
        move |pn: u64| self.sent_record(pn).is_some_and(|r| r.catch_up)
    }
}

impl Connection {
    pub(super) fn write_ack(&mut self, now_us: u64, w: &mut Writer<'_>) {
        let (largest_pn, at) = self.space.largest_rx.unwrap_or((0, now_us));
        let ack = AckFrame {
            largest_pn,
            ack_delay_us: now_us.saturating_sub(at),
            ctrl_offset: self.ctrl.rx.offset(),
            rx_bytes: self.space.rx_bytes,
            // When the last of those bytes arrived: the rate the sender derives is the
            // path's, not how fast this process happened to get to them.
            rx_time_us: if self.space.rx_bytes_at_us > 0 {
                self.space.rx_bytes_at_us
            } else {
                now_us
            },
            rx_buffered: self.path.rx_buffered,
            rx_buffer: self.path.rx_buffer,
            rx_drops: self.path.rx_drops,
            store_room: self.path.store_room.min(wire::MAX_VARINT),
        };
        self.path.store_room_sent = self.path.store_room;
        Frame::Ack(ack).encode(w).expect("an ACK always fits");
        self.space.ack_now = false;
        self.space.ack_pending = 0;
        self.space.ack_deadline = None;
        self.space.last_ack_us = now_us;
    }

    pub(super) fn record_sent(&mut self, now_us: u64, data: bool) {
        self.space.sent_times.push_back(SentRecord {
            at_us: now_us,
            stalled: self.path.pacer.lost_bytes(),
            idle: self.path.pacer.idle_bytes(),
            app_idle: self.path.pacer.app_idle_bytes(),
            catch_up: self.path.pacer.catching_up(),
            data,
        });
        if self.space.sent_times.len() > MAX_SENT_HISTORY {
            self.space.sent_times.pop_front();
            self.space.sent_base += 1;
        }
        self.stats.packets_sent += 1;
    }

    /// Authenticates a datagram as a packet of this session: sealed, for our connection
    /// id, not a replay, opening under the peer's key, and every frame parsing (checked
    /// before any acts, so a malformed tail cannot leave a packet half-applied). Returns its
    /// packet number and plaintext; a datagram that fails is counted and dropped. `opened`:
    /// the driver opened it already (or failed to), see `Connection::handle_opened_at`.
    pub(super) fn open_packet<'a>(
        &mut self,
        data: &'a mut [u8],
        opened: Option<Result<Opened, CryptoError>>,
    ) -> Option<(u64, &'a [u8])> {
        match wire::peek_kind(data) {
            Ok(wire::PacketKind::Sealed) => {}
            Ok(_) => {
                // Retransmitted hellos are the endpoint's business; anything else is noise.
                self.stats.dropped_unexpected += 1;
                return None;
            }
            Err(_) => {
                self.stats.dropped_malformed += 1;
                return None;
            }
        }
        if wire::sealed_dest_cid(data).ok() != Some(self.my_cid) {
            self.stats.dropped_unexpected += 1;
            return None;
        }
        let Ok(pn_bits) = wire::sealed_pn_bits(data) else {
            self.stats.dropped_malformed += 1;
            return None;
        };
        let pn = match &opened {
            // The number it opened under: the nonce proves it.
            Some(Ok(o)) => o.pn(),
            _ => wire::decode_pn(pn_bits, self.space.largest_rx.map_or(0, |(l, _)| l + 1)),
        };
        if !self.space.replay.is_fresh(pn) {
            self.stats.dropped_replay += 1;
            return None;
        }
        let plain: &[u8] = match opened {
            None => {
                let keys = self
                    .space
                    .keys
                    .as_ref()
                    .expect("sealed packets only after keys");
                match keys.recv.open(data, pn) {
                    Ok(p) => p,
                    Err(_) => {
                        self.stats.dropped_auth += 1;
                        return None;
                    }
                }
            }
            Some(Ok(o)) => {
                match data.get(wire::SEALED_HEADER_LEN..wire::SEALED_HEADER_LEN + o.plain_len()) {
                    Some(p) => p,
                    None => {
                        self.stats.dropped_malformed += 1;
                        return None;
                    }
                }
            }
            Some(Err(_)) => {
                self.stats.dropped_auth += 1;
                return None;
            }
        };
        if wire::parse_frames(plain).any(|f| f.is_err()) {
            self.stats.dropped_malformed += 1;
            return None;
        }
        Some((pn, plain))
    }

    /// PING: only asks for an ACK.
    pub(super) fn on_ping(&mut self) {
        self.space.ack_now = true;
    }

    /// After a packet that asks for an ACK: data is acknowledged in batches
    /// (`ACK_EVERY` packets or `ACK_DELAY_US`, spaced by [`Self::ack_spacing_us`]),
    /// anything else at once.
    pub(super) fn schedule_ack(&mut self, now_us: u64, has_data: bool) {
        if has_data {
            self.space.ack_pending += 1;
            let spacing = self.ack_spacing_us();
            if self.space.ack_deadline.is_none() {
                self.space.ack_deadline = Some(now_us + ACK_DELAY_US.max(spacing));
            }
            if self.space.ack_pending == ACK_EVERY {
                // A batch is due, once the spacing since the last ACK is over.
                let spaced = self.space.last_ack_us + spacing;
                self.space.ack_deadline = self.space.ack_deadline.map(|d| d.min(spaced));
            }
        } else {
            self.space.ack_now = true;
        }
    }

    /// The least time between two ACKs of data: a minimum RTT over `ACKS_PER_RTT`, at most
    /// `MAX_ACK_SPACING_US` (0 before a sample). On a short path `ACK_EVERY` packets take
    /// longer than that at any rate this host reaches, and nothing changes.
    pub(super) fn ack_spacing_us(&self) -> u64 {
        if self.path.rtt.has_sample() {
            (self.path.rtt.min() / ACKS_PER_RTT).min(MAX_ACK_SPACING_US)
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::conn::test_pair::TunnelPair;
    use crate::crypto::CryptoError;

    /// A server whose driver opens its datagrams (`Endpoint::handle_opened`) takes a
    /// stream whole; a datagram the driver failed to open, and an opened one delivered
    /// twice, change nothing and are counted (authentication, replay), as when the core
    /// opens them itself.
    #[test]
    fn datagrams_a_driver_opened_still_face_the_replay_and_session_checks() {
        let mut p = TunnelPair::new(Duration::from_millis(1));
        p.open_in_driver = Some(None);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        assert_eq!(p.c.stream_write(&data), data.len());
        p.run(Duration::from_secs(2));
        assert!(
            p.server().stream_peek() == &data[..],
            "the stream did not arrive whole"
        );

        // A datagram the driver could not open: only counted.
        let cid = p.cid;
        let before = p.server().stats();
        let now = p.now;
        let mut junk = vec![0u8; 200];
        crate::wire::write_sealed_header(&mut junk, cid, 1 << 20);
        let addr = "192.0.2.1:4000".parse().unwrap();
        let r = p.ep.handle_opened(
            cid,
            now,
            now,
            addr,
            &mut junk,
            Err(CryptoError::Auth),
            &mut crate::conn::NoFiles,
        );
        assert!(r.is_none());
        let after = p.server().stats();
        assert_eq!(after.dropped_auth, before.dropped_auth + 1);
        assert_eq!(after.packets_received, before.packets_received);

        // The client's next datagram, opened, delivered twice: the second is a replay.
        p.c.stream_write(b"one more");
        let mut buf = vec![0u8; 1500];
        let n =
            p.c.poll_transmit(p.now, &mut buf, &mut crate::conn::NoFiles)
                .expect("a datagram");
        let key = p.server().recv_key().unwrap().clone();
        let bits = crate::wire::sealed_pn_bits(&buf[..n]).unwrap();
        let pn = crate::wire::decode_pn(bits, 0);
        for _ in 0..2 {
            let mut d = buf[..n].to_vec();
            let opened = key.open_datagram(&mut d, pn);
            assert!(opened.is_ok());
            p.ep.handle_opened(
                cid,
                now,
                now,
                addr,
                &mut d,
                opened,
                &mut crate::conn::NoFiles,
            );
        }
        let last = p.server().stats();
        assert_eq!(last.packets_received, after.packets_received + 1);
        assert_eq!(last.dropped_replay, after.dropped_replay + 1);
        assert!(p.server().stream_peek().ends_with(b"one more"));
    }
}
