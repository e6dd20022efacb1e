//! The control stream: reliable, ordered messages both ways, some said twice, and what
//! arriving messages do.

use std::ops::ControlFlow;
use std::time::Instant;

use crate::control::{Ctrl, CtrlRecv, CtrlSend, MetaEntry, MetaOp};
use crate::transfer::{Incoming, Layout};
use crate::wire::{self, StreamAckFrame, Writer};

use super::transfers::{too_large, MAX_INCOMING_BLOCKS, MAX_OPEN_INCOMING};
use super::{Connection, Event, Side};

/// Control bytes sent at once, unpaced, when no more than this is queued: the messages a
/// peer waits on. More (leaf hashes, listings) go paced by the rate controller, counted
/// as data is: 4 MiB of leaf hashes per GiB let out as fast as acknowledgements came
/// overflowed any bottleneck slower than 4 MiB per round trip.
pub(super) const CTRL_UNPACED: u64 = 16 << 10;

/// The control stream's two directions and what rides on them.
pub(super) struct ControlStream {
    pub(super) tx: CtrlSend,
    pub(super) rx: CtrlRecv,
    /// Control stream bytes from this offset on go out a second time once sent.
    pub(super) twice: Option<u64>,
    pub(super) bye_sent: bool,
    pub(super) next_meta: u32,
}

impl Connection {
    /// Client: a file-system request on the server; the answer comes as `MetaReplied`.
    pub fn meta(&mut self, op: MetaOp) -> u32 {
        let id = self.ctrl.next_meta;
        self.ctrl.next_meta += 1;
        self.ctrl.tx.push(&Ctrl::Meta { id, op });
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
                    self.ctrl.tx.push(&Ctrl::MetaReply {
                        id,
                        result: Ok(p.to_vec()),
                        more: i < last,
                    });
                }
            }
            result => self.ctrl.tx.push(&Ctrl::MetaReply {
                id,
                result,
                more: false,
            }),
        }
    }

    /// Queues a message a peer waits on: once everything queued has been sent, it goes out
    /// a second time with the rest of the stream from the chunk that holds it (only from
    /// the earliest such message still unsent twice: the stream is not sent twice whole).
    /// A lost copy then costs nothing; the stream's loss recovery covers the rest.
    pub(super) fn say_twice(&mut self, msg: &Ctrl) {
        let at = self.ctrl.tx.end();
        self.ctrl.tx.push(msg);
        self.ctrl.twice = Some(self.ctrl.twice.map_or(at, |t| t.min(at)));
    }

    pub(super) fn drain_ctrl(&mut self, now: Instant) {
        loop {
            match self.ctrl.rx.next_message() {
                Ok(Some(msg)) => self.on_ctrl(now, msg),
                Ok(None) => return,
                Err(e) => {
                    self.close(now, 2, &format!("protocol error: {e}"));
                    return;
                }
            }
        }
    }

    pub(super) fn on_ctrl(&mut self, now: Instant, msg: Ctrl) {
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
                let solicited = self.xfers.pending_gets.remove(&xfer).is_some();
                if self.side == Side::Client && !solicited {
                    self.stats.dropped_unexpected += 1;
                    return;
                }
                if self.xfers.incoming.contains_key(&xfer)
                    || self.xfers.outgoing.contains_key(&xfer)
                {
                    return;
                }
                let layout = Layout::new(size, self.path.block_size);
                let held: u64 = self
                    .xfers
                    .incoming
                    .values()
                    .map(|i| i.layout.blocks())
                    .sum();
                let refusal = if layout.blocks() > wire::BLOCK_LIMIT {
                    // Only a peer that ignores its own limit offers this; refuse it aloud.
                    Some(too_large(&path, size))
                } else if self.xfers.incoming.len() >= MAX_OPEN_INCOMING {
                    Some(format!(
                        "{path}: more than {MAX_OPEN_INCOMING} files offered at once"
                    ))
                } else if held + layout.blocks() > MAX_INCOMING_BLOCKS {
                    Some(format!(
                        "{path}: {size} bytes is more than this receiver tracks at once \
                         ({MAX_INCOMING_BLOCKS} blocks of {} bytes in all)",
                        self.path.block_size
                    ))
                } else {
                    None
                };
                if let Some(reason) = refusal {
                    self.ctrl.tx.push(&Ctrl::Reject {
                        xfer,
                        reason: reason.clone(),
                    });
                    if solicited {
                        self.events.push_back(Event::Rejected { xfer, reason });
                    }
                    return;
                }
                self.xfers
                    .incoming
                    .insert(xfer, Incoming::new(xfer, path.clone(), layout));
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
                if self.side == Side::Server && self.xfers.outgoing.len() >= MAX_OPEN_INCOMING {
                    self.ctrl.tx.push(&Ctrl::Reject {
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
            Ctrl::Ready {
                xfer,
                have,
                parts,
                path,
            } => {
                if let Some(o) = self.xfers.outgoing.get_mut(&xfer) {
                    if !o.ready {
                        o.ready = true;
                        self.xfers.retired_in_flight += o.mark_have(&have);
                        o.mark_spans(&parts);
                        self.xfers.hash_work = true;
                        if let Some(path) = path {
                            self.events.push_back(Event::Placed { xfer, path });
                        }
                    }
                }
            }
            Ctrl::Reject { xfer, reason } => {
                let known = self.retire(xfer).is_some()
                    | self.xfers.incoming.remove(&xfer).is_some()
                    | self.xfers.pending_gets.remove(&xfer).is_some();
                if known {
                    self.events.push_back(Event::Rejected { xfer, reason });
                }
            }
            Ctrl::Sent { xfer, blake3 } => {
                if let Some(inc) = self.xfers.incoming.get_mut(&xfer) {
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
                policy,
            } => {
                if self.side == Side::Server {
                    self.path.cc = self
                        .cfg
                        .rate
                        .negotiate(rate_max, rate_min, adaptive, policy)
                        .build();
                    self.path.pacer.set_rate(self.path.cc.pacing_rate());
                }
            }
            Ctrl::WantSums { xfer, basis } => self.on_want_sums(xfer, basis),
            Ctrl::Compared {
                xfer,
                upto,
                have,
                parts,
            } => self.on_compared(xfer, upto, &have, &parts),
            Ctrl::Sums {
                xfer,
                first,
                leaves,
            } => self.on_sums(xfer, first, leaves),
            Ctrl::Bye => {
                if self.side == Side::Server {
                    self.events.push_back(Event::Bye);
                    self.close(now, 0, "bye");
                }
            }
            m @ (Ctrl::Tunnel { .. } | Ctrl::TunnelReply { .. }) => self.on_tunnel_ctrl(now, m),
        }
    }

    /// Control bytes to send now, unpaced: a few messages (an `Offer`, a `Ready`, a
    /// verdict) that the peer waits on, at most [`CTRL_UNPACED`] unsent.
    pub(super) fn ctrl_urgent(&self) -> bool {
        self.ctrl.tx.has_sendable() && self.ctrl.tx.unsent() <= CTRL_UNPACED
    }

    /// More control bytes to send than [`CTRL_UNPACED`] (a delta's leaf hashes, a big
    /// tree's listing): they go as data does, paced at the controller's rate.
    pub(super) fn ctrl_bulk(&self) -> bool {
        self.ctrl.tx.has_sendable() && self.ctrl.tx.unsent() > CTRL_UNPACED
    }

    /// The peer's acknowledgement of the control stream: `cum` from its ACK, `map` from its
    /// STREAM_ACK for the control stream in the same packet (none: it holds nothing beyond
    /// `cum`). Chunks of overtaken packets that it lacks are sent again, by the loss rule of
    /// blocks (`PacketSpace::overtaken`).
    pub(super) fn on_ctrl_ack(&mut self, cum: u64, map: Option<&StreamAckFrame>) {
        let is_lost = self.space.loss_rule(self.path.rtt.srtt());
        let lost = self.ctrl.tx.on_ack(cum, map, is_lost);
        self.stats.ctrl_chunks_lost += lost;
    }

    /// Appends the map of this side's control stream when anything arrived beyond a gap
    /// (right after the ACK, so it always fits).
    pub(super) fn write_ctrl_sack(&mut self, w: &mut Writer<'_>) {
        if w.remaining() < 64 {
            return;
        }
        let max_gaps = ((w.remaining() - 60) / 6).min(64);
        if let Some(a) = self.ctrl.rx.sack(max_gaps) {
            if let Ok(end) = a.encode_fitting(w) {
                if end < a.map.end {
                    self.ctrl.rx.resume_sack_at(end);
                }
            }
        }
    }

    /// CTRL: a chunk of the peer's control stream; the messages it completes take effect.
    /// Breaks when the stream is broken (the session is then closed).
    pub(super) fn on_ctrl_frame(
        &mut self,
        now: Instant,
        rx_at_us: u64,
        offset: u64,
        data: &[u8],
    ) -> ControlFlow<()> {
        self.space.ack_now = true;
        match self.ctrl.rx.on_chunk(offset, data) {
            Ok(new) => {
                // Delivered, as far as the sender's rate is concerned: bulk control goes
                // paced at that rate, as data does.
                if new > 0 {
                    self.space.rx_bytes += new;
                    self.space.rx_bytes_at_us = self.space.rx_bytes_at_us.max(rx_at_us);
                }
                self.drain_ctrl(now)
            }
            Err(e) => {
                self.close(now, 2, &format!("protocol error: {e}"));
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::cc::Fixed;
    use crate::conn::test_pair::TunnelPair;
    use crate::control::Ctrl;

    /// Bulk control bytes (a delta's leaf hashes) go at the controller's pace, as data
    /// does, not as fast as acknowledgements make room; the receiver counts them
    /// delivered. A few bytes (a message the peer waits on) go at once.
    #[test]
    fn bulk_control_goes_at_the_pace() {
        let mut p = TunnelPair::new(Duration::from_millis(10));
        // 1 MB/s.
        p.c.path.cc = Box::new(Fixed::new(Some(1_000_000)));
        p.c.path.pacer.set_rate(Some(1_000_000));
        let rx0 = p.server().space.rx_bytes;
        let sent0 = p.c.stats.packets_sent;
        p.c.ctrl.tx.push(&Ctrl::Reject {
            xfer: 7,
            reason: "small".into(),
        });
        p.run(Duration::from_millis(2));
        assert!(p.c.stats.packets_sent > sent0, "a small message waits");
        let start = p.c.ctrl.tx.end();
        for i in 0..32 {
            p.c.ctrl.tx.push(&Ctrl::Sums {
                xfer: 9,
                first: i * 1000,
                leaves: vec![[i as u8; 16]; 1000],
            });
        }
        let bulk = p.c.ctrl.tx.end() - start;
        assert!(bulk > 500_000);
        p.run(Duration::from_millis(100));
        let went = p.c.ctrl.tx.end() - p.c.ctrl.tx.unsent() - start;
        // 100 ms at 1 MB/s, and the pacer's allowance of a burst.
        assert!(
            (50_000..200_000).contains(&went),
            "{went} of {bulk} bytes in 100 ms at 1 MB/s"
        );
        p.run(Duration::from_millis(1000));
        assert_eq!(p.c.ctrl.tx.unsent(), 0);
        assert!(p.server().ctrl.rx.offset() >= start + bulk);
        assert!(p.server().space.rx_bytes - rx0 >= bulk);
    }

    /// A controller that allows `cap` data bytes in flight, at 10 MB/s.
    #[derive(Debug)]
    struct Capped(u64);

    impl crate::cc::RateControl for Capped {
        fn pacing_rate(&self) -> Option<u64> {
            Some(10_000_000)
        }
        fn in_flight_cap(&self) -> Option<u64> {
            Some(self.0)
        }
        fn name(&self) -> &'static str {
            "capped"
        }
    }

    /// Bulk control is not held by the in-flight window, which counts DATA: blocks a sender
    /// sent before a delta's `Ready` stay in flight until the `Ready` that its leaf hashes
    /// lead to, so holding those behind the window stalled both (a 1 GiB delta upload took
    /// a minute, or never finished).
    #[test]
    fn bulk_control_goes_while_data_fills_the_window() {
        let mut p = TunnelPair::new(Duration::from_millis(10));
        p.c.path.cc = Box::new(Capped(64_000));
        p.c.path.pacer.set_rate(Some(10_000_000));
        // Blocks in flight that nothing will acknowledge before the leaf hashes are in.
        p.c.stats.data_bytes_sent += 100_000;
        assert!(p.c.window_full());
        let start = p.c.ctrl.tx.end();
        for i in 0..16 {
            p.c.ctrl.tx.push(&Ctrl::Sums {
                xfer: 9,
                first: i * 1000,
                leaves: vec![[i as u8; 16]; 1000],
            });
        }
        let bulk = p.c.ctrl.tx.end() - start;
        p.run(Duration::from_millis(300));
        assert!(p.c.window_full());
        assert_eq!(p.c.ctrl.tx.unsent(), 0, "of {bulk} bytes");
        assert!(p.server().ctrl.rx.offset() >= start + bulk);
    }
}
