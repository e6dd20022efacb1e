//! A session's tunnel (`hayate tunnel`): the client asks the server (`Ctrl::Tunnel`) to
//! connect the session's byte stream (`crate::stream`) somewhere as the server sees it; the
//! server answers (`Ctrl::TunnelReply`). The stream's chunks go out under the pacer exactly
//! as file blocks do (before them: a keystroke should not wait behind a file), and the
//! receiver's STREAM_ACK rides with its ACKs; losses are declared with the loss maps' rule
//! and delivered and lost bytes go into the rate controller's `Feedback` as blocks' do.

use std::time::Instant;

use super::{Connection, Event, Side};
use crate::cc::Feedback;
use crate::control::Ctrl;
use crate::stream::{StreamRecv, StreamSend, RECV_WINDOW};
use crate::wire::{self, StreamAckFrame, Writer};

/// Most STREAM frame header bytes: type, flags, offset (8), length (4).
const MAX_STREAM_HEADER: usize = 2 + 8 + 4;
/// A probe timeout sends the stream's flight again when it is at most this many chunks.
const PTO_RESEND_CHUNKS: usize = 16;

/// Both halves of the session's stream.
#[derive(Debug)]
pub(super) struct Tunnel {
    send: StreamSend,
    recv: StreamRecv,
    /// The server answered the request (client: with `Ok`; an error drops the tunnel).
    answered: bool,
}

impl Tunnel {
    fn new() -> Box<Tunnel> {
        Box::new(Tunnel {
            send: StreamSend::new(RECV_WINDOW),
            recv: StreamRecv::new(RECV_WINDOW),
            answered: false,
        })
    }
}

impl Connection {
    /// Client: asks the server to connect the session's stream to `host:port` (as the
    /// server resolves and reaches it). Bytes may be written at once; the answer comes as
    /// [`Event::TunnelAnswered`].
    pub fn open_tunnel(&mut self, host: &str, port: u16) {
        if self.side != Side::Client || self.tunnel.is_some() {
            return;
        }
        self.ctrl.tx.push(&Ctrl::Tunnel {
            host: host.to_string(),
            port,
        });
        self.tunnel = Some(Tunnel::new());
    }

    /// Server: the answer to [`Event::TunnelRequested`]. An error ends the tunnel (what
    /// the client sent meanwhile is dropped).
    pub fn answer_tunnel(&mut self, result: Result<(), String>) {
        if self.side != Side::Server {
            return;
        }
        let Some(t) = self.tunnel.as_mut().filter(|t| !t.answered) else {
            return;
        };
        t.answered = true;
        if result.is_err() {
            self.tunnel = None;
        }
        self.ctrl.tx.push(&Ctrl::TunnelReply { result });
    }

    /// The session has a tunnel (asked for, or being answered).
    pub fn has_tunnel(&self) -> bool {
        self.tunnel.is_some()
    }

    /// How many bytes [`Connection::stream_write`] takes now (0 without a tunnel).
    pub fn stream_room(&self) -> usize {
        self.tunnel.as_ref().map_or(0, |t| t.send.room())
    }

    /// Queues bytes on the stream; returns how many it took (see `stream_room`).
    pub fn stream_write(&mut self, data: &[u8]) -> usize {
        self.tunnel.as_mut().map_or(0, |t| t.send.write(data))
    }

    /// This side's direction of the stream ends after the bytes written (half-close).
    pub fn stream_finish(&mut self) {
        if let Some(t) = &mut self.tunnel {
            t.send.finish();
        }
    }

    /// The stream's bytes that arrived in order and were not taken yet (a first part of
    /// them; take them with `stream_consume`).
    pub fn stream_peek(&self) -> &[u8] {
        self.tunnel.as_ref().map_or(&[], |t| t.recv.peek())
    }

    /// The reader took `n` bytes of `stream_peek`: room for the peer to send more.
    pub fn stream_consume(&mut self, n: usize) {
        if let Some(t) = &mut self.tunnel {
            t.recv.consume(n);
            if t.recv.window_update_due() {
                self.space.ack_now = true;
            }
        }
    }

    /// The peer ended its direction and every byte was taken.
    pub fn stream_read_done(&self) -> bool {
        self.tunnel.as_ref().is_some_and(|t| t.recv.is_finished())
    }

    /// This side's direction ended and the peer acknowledged all of it.
    pub fn stream_write_done(&self) -> bool {
        self.tunnel.as_ref().is_some_and(|t| t.send.is_done())
    }

    pub(super) fn on_tunnel_ctrl(&mut self, now: Instant, msg: Ctrl) {
        match msg {
            Ctrl::Tunnel { host, port } => {
                if self.side != Side::Server {
                    self.close(now, 2, "protocol error: a tunnel request from the server");
                    return;
                }
                if self.tunnel.is_some() {
                    return;
                }
                self.tunnel = Some(Tunnel::new());
                self.events.push_back(Event::TunnelRequested { host, port });
            }
            Ctrl::TunnelReply { result } => {
                let Some(t) = self.tunnel.as_mut().filter(|t| !t.answered) else {
                    return;
                };
                t.answered = true;
                if result.is_err() {
                    self.tunnel = None;
                }
                self.events.push_back(Event::TunnelAnswered { result });
            }
            _ => {}
        }
    }

    /// A STREAM frame. Data for no tunnel (before the request, which travels on the
    /// control stream, or after a refusal) is dropped: it was not acknowledged and comes
    /// again if it is still wanted.
    pub(super) fn on_stream(
        &mut self,
        rx_at_us: u64,
        offset: u64,
        fin: bool,
        data: &[u8],
    ) -> Result<(), String> {
        let Some(t) = &mut self.tunnel else {
            self.stats.dropped_unexpected += 1;
            return Ok(());
        };
        let new = t
            .recv
            .on_chunk(offset, fin, data)
            .map_err(|e| e.to_string())?;
        if new > 0 {
            self.space.rx_bytes += new;
            self.space.rx_bytes_at_us = self.space.rx_bytes_at_us.max(rx_at_us);
            self.stats.data_bytes_received += new;
        } else {
            self.stats.duplicate_blocks_received += 1;
        }
        self.stats.data_packets_received += 1;
        // The stream's end is worth telling at once (the peer may be waiting to finish).
        if fin {
            self.space.ack_now = true;
        }
        Ok(())
    }

    /// The peer's STREAM_ACK: its window, what it holds, what is lost.
    pub(super) fn on_stream_ack(&mut self, a: &StreamAckFrame, fb: &mut Feedback) {
        let Some(mut t) = self.tunnel.take() else {
            return;
        };
        let tagged = self.space.caught_up();
        let out = t
            .send
            .on_ack(a, self.space.loss_rule(self.path.rtt.srtt()), tagged);
        self.tunnel = Some(t);
        fb.delivered += out.newly_acked_bytes;
        fb.lost_blocks += out.lost_chunks;
        fb.lost_bytes += out.lost_bytes;
        fb.catch_up_delivered += out.tagged_acked_bytes;
        fb.catch_up_lost_bytes += out.tagged_lost_bytes;
        self.stats.data_bytes_acked += out.newly_acked_bytes;
        self.stats.blocks_declared_lost += out.lost_chunks;
        self.stats.data_bytes_lost += out.lost_bytes;
    }

    /// Appends this side's STREAM_ACK (with every ACK while there is a tunnel).
    pub(super) fn write_stream_ack(&mut self, w: &mut Writer<'_>) {
        let Some(t) = &mut self.tunnel else {
            return;
        };
        // Room for the fixed fields (type, limit and 6 varints) and some gaps.
        if w.remaining() < 64 {
            return;
        }
        let max_gaps = ((w.remaining() - 60) / 6).min(128);
        let a = t.recv.ack(max_gaps);
        if let Ok(end) = a.encode_fitting(w) {
            if end < a.map.end {
                t.recv.resume_ack_at(end);
            }
        }
    }

    /// Probe timeout: a small flight of the stream (interactive use) goes out again with
    /// the probe (see `StreamSend::on_probe_timeout`).
    pub(super) fn stream_on_pto(&mut self) {
        if let Some(t) = &mut self.tunnel {
            let n = t.send.on_probe_timeout(PTO_RESEND_CHUNKS);
            self.stats.data_bytes_lost += n;
        }
    }

    /// The stream has something to send now.
    pub(super) fn stream_sendable(&self) -> bool {
        self.tunnel.as_ref().is_some_and(|t| t.send.has_sendable())
    }

    /// The stream awaits acknowledgements or window: keep probing.
    pub(super) fn stream_outstanding(&self) -> bool {
        self.tunnel
            .as_ref()
            .is_some_and(|t| t.send.is_outstanding())
    }

    /// One STREAM chunk in a sealed packet, as `send_data` sends a block.
    pub(super) fn send_stream(&mut self, now_us: u64, buf: &mut [u8]) -> Option<usize> {
        self.space.keys.as_ref()?;
        let hdr = wire::SEALED_HEADER_LEN;
        let limit = self.path.payload_limit - wire::TAG_LEN;
        let t = self.tunnel.as_mut()?;
        let pn = self.space.next_pn;
        let at = hdr + MAX_STREAM_HEADER;
        let c = t.send.next_chunk(limit - at, pn, &mut buf[at..limit])?;
        let h = wire::stream_header_len(c.offset, c.len);
        buf.copy_within(at..at + c.len, hdr + h);
        {
            let mut w = Writer::new(&mut buf[hdr..hdr + h]);
            w.put_u8(wire::FRAME_STREAM).expect("sized");
            w.put_u8(if c.fin { wire::STREAM_FIN } else { 0 })
                .expect("sized");
            w.put_varint(c.offset).expect("sized");
            w.put_varint(c.len as u64).expect("sized");
        }
        wire::write_sealed_header(buf, self.peer_cid, pn);
        let total = self.seal_packet(buf, h + c.len, pn);
        self.space.next_pn += 1;
        self.record_sent(now_us, true);
        self.stats.data_packets_sent += 1;
        self.stats.data_bytes_sent += c.len as u64;
        if c.retx {
            self.stats.data_packets_retransmitted += 1;
            self.stats.data_bytes_retransmitted += c.len as u64;
        }
        self.charge_sent(now_us, total);
        Some(total)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::cc::RateControl;
    use crate::conn::test_pair::TunnelPair;

    /// A controller whose in-flight cap is zero bytes, whatever it hears: what the adaptive
    /// controller reports while it holds a flight it measured with nothing in flight.
    #[derive(Debug)]
    struct ZeroCap;

    impl RateControl for ZeroCap {
        fn pacing_rate(&self) -> Option<u64> {
            Some(100_000_000)
        }
        fn in_flight_cap(&self) -> Option<u64> {
            Some(0)
        }
        fn name(&self) -> &'static str {
            "zero-cap"
        }
    }

    /// A rate controller's cap at zero with nothing in flight must not stop the stream:
    /// nothing else would ever wake the sender (no acknowledgement is coming, nothing is
    /// outstanding for a probe). The bytes still go out, a packet per acknowledgement.
    #[test]
    fn a_zero_cap_with_nothing_in_flight_still_sends() {
        let mut p = TunnelPair::new(Duration::from_millis(1));
        p.c.path.cc = Box::new(ZeroCap);
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();
        assert_eq!(p.c.stream_write(&data), data.len());
        p.run(Duration::from_secs(2));
        let got = p.server().stream_peek().to_vec();
        assert_eq!(got.len(), data.len(), "the stream stalled");
        assert!(got == data);
        assert!(!p.c.stream_outstanding());
    }
}
