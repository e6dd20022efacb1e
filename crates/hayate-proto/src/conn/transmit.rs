//! Building datagrams: control frames (ACK, loss maps, PING, PATH_RESPONSE, CTRL) first,
//! then DATA, sealed under the session key.

use crate::transfer::XferId;
use crate::wire::{self, Frame, Writer};

use super::{BlockSource, Connection, StorageError};

impl Connection {
    pub(super) fn send_control(
        &mut self,
        now_us: u64,
        buf: &mut [u8],
        with_ack: bool,
    ) -> Option<usize> {
        let limit = self.path.payload_limit - wire::TAG_LEN;
        let ping = std::mem::take(&mut self.timers.ping_pending);
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
            self.write_ctrl_sack(&mut w);
            self.write_stream_ack(&mut w);
            self.write_loss_maps(&mut w);
        }
        if ping {
            let _ = Frame::Ping.encode(&mut w);
        }
        if let Some(token) = self.path.response_due.take() {
            let _ = Frame::PathResponse(token).encode(&mut w);
        }
        // Control stream bytes, as many as fit.
        let room = w.remaining().saturating_sub(1 + 8 + 8);
        let mut ctrl_bytes = false;
        if room > 16 {
            if let Some((offset, data)) = self.ctrl.tx.next_chunk(room, self.space.next_pn) {
                Frame::Ctrl {
                    offset,
                    data: &data,
                }
                .encode(&mut w)
                .expect("sized to fit");
                ctrl_bytes = true;
            }
        }
        let n = w.pos();
        let out = self.seal_frames(now_us, buf, |w2| {
            w2.put_bytes(&scratch[..n]).expect("fits");
        });
        self.scratch = scratch;
        if let (Some(total), true) = (out, ctrl_bytes) {
            // Control bytes take their part of the pace, as data does (the receiver counts
            // them delivered).
            self.charge_sent(now_us, total);
        }
        out
    }

    /// A packet of `total` bytes carrying data (file blocks, stream or control bytes) went
    /// out: the pacer and the rate controller count it, and the pace follows (it may
    /// depend on what is in flight, see `RateControl::pacing_rate_with`).
    pub(super) fn charge_sent(&mut self, now_us: u64, total: usize) {
        self.path.pacer.on_sent(total);
        self.path.cc.on_sent(now_us, total as u64);
        let rate = self.path.cc.pacing_rate_with(self.in_flight_bytes());
        self.path.pacer.set_rate(rate);
    }

    pub(super) fn send_data(
        &mut self,
        now_us: u64,
        buf: &mut [u8],
        src: &mut dyn BlockSource,
    ) -> Option<usize> {
        // The tunnel's stream first: a keystroke does not wait behind a file.
        if self.stream_sendable() {
            return self.send_stream(now_us, buf);
        }
        // Retransmissions first, then new blocks, in transfer order; a transfer whose bytes
        // are not read yet (`StorageError::NotReady`) is passed over for the next one.
        self.xfers.source_blocked = false;
        let mut unread: Vec<XferId> = Vec::new();
        let hdr = wire::SEALED_HEADER_LEN;
        let body = hdr + wire::DATA_HEADER_LEN;
        let (xfer, block, second, len) = loop {
            let mut pick: Option<(XferId, u64, Option<bool>)> = None;
            for o in self.xfers.outgoing.values_mut() {
                if !o.flowing() || unread.contains(&o.id) {
                    continue;
                }
                if let Some((b, second)) = o.pop_retx() {
                    pick = Some((o.id, b, Some(second)));
                    break;
                }
            }
            if pick.is_none() {
                // Only files still waiting for `Ready` ask whether there is eager room (a sum
                // over them, taken once): the steady state, every file answered, never pays
                // for it.
                let mut room = None;
                for o in self.xfers.outgoing.values() {
                    if unread.contains(&o.id) {
                        continue;
                    }
                    if o.flowing() || (o.eager && *room.get_or_insert_with(|| self.eager_room())) {
                        if let Some(b) = o.peek_new() {
                            pick = Some((o.id, b, None));
                            break;
                        }
                    }
                }
            }
            // `second`: a retransmission, from the second copies or not.
            let Some((xfer, block, second)) = pick else {
                self.xfers.source_blocked = !unread.is_empty();
                return None;
            };
            let o = self.xfers.outgoing.get_mut(&xfer).expect("picked");
            let len = o.layout.len(block);
            let offset = o.layout.offset(block);
            let mut read = Ok(());
            if second.is_none() && !self.xfers.external_hash {
                // Blocks the receiver already had (resume) still count in the file hash.
                let mut skipped = std::mem::take(&mut self.scratch);
                while read.is_ok() && o.hash_next < block {
                    let b = o.hash_next;
                    skipped.resize(o.layout.len(b), 0);
                    read = src.read(xfer, o.layout.offset(b), &mut skipped);
                    if read.is_ok() {
                        o.hash_block(b, &skipped);
                    }
                }
                self.scratch = skipped;
            }
            if read.is_ok() {
                read = src.read(xfer, offset, &mut buf[body..body + len]);
            }
            match read {
                Ok(()) => break (xfer, block, second, len),
                Err(StorageError::NotReady) => {
                    // Asked for again on a later call, first in line.
                    if let Some(second) = second {
                        o.unpop_retx(block, second);
                    }
                    unread.push(xfer);
                }
                Err(e) => {
                    let path = o.path.clone();
                    self.fail_outgoing(xfer, format!("cannot read {path}: {e}"));
                    return None;
                }
            }
        };
        let retx = second.is_some();
        let pn = self.space.next_pn;
        // At the session's tail (nothing new left anywhere) each retransmission goes twice.
        // With many small files that is every batch's tail: their retransmissions double
        // (twice the loss rate instead of once), and each file verifies a round trip sooner.
        if second == Some(false) && self.xfers.outgoing.values().all(|o| o.peek_new().is_none()) {
            if let Some(o) = self.xfers.outgoing.get_mut(&xfer) {
                o.send_again(block);
            }
        }
        let o = self.xfers.outgoing.get_mut(&xfer).expect("picked");
        if !retx && !self.xfers.external_hash {
            o.hash_block(block, &buf[body..body + len]);
        }
        // A block the receiver holds in part (a delta): only the bytes it lacks go.
        let (from, len) = o.span(block);
        if from > 0 {
            buf.copy_within(body + from..body + from + len, body);
        }
        if second == Some(true) {
            o.on_sent_copy(block, pn);
        } else {
            o.on_sent(block, pn);
        }
        o.sent_bytes += len as u64;
        wire::write_sealed_header(buf, self.peer_cid, pn);
        wire::write_data_header(&mut buf[hdr..], xfer, block);
        let total = self.seal_packet(buf, wire::DATA_HEADER_LEN + len, pn);
        self.space.next_pn += 1;
        self.record_sent(now_us, true);
        self.stats.data_packets_sent += 1;
        self.stats.data_bytes_sent += len as u64;
        if retx {
            self.stats.data_packets_retransmitted += 1;
            self.stats.data_bytes_retransmitted += len as u64;
        }
        self.charge_sent(now_us, total);
        // Last new block out and hashed: announce the file's hash.
        self.maybe_announce(xfer);
        Some(total)
    }

    pub(super) fn seal_frames(
        &mut self,
        now_us: u64,
        buf: &mut [u8],
        fill: impl FnOnce(&mut Writer<'_>),
    ) -> Option<usize> {
        self.space.keys.as_ref()?;
        let hdr = wire::SEALED_HEADER_LEN;
        let limit = self.path.payload_limit - wire::TAG_LEN;
        let pn = self.space.next_pn;
        wire::write_sealed_header(buf, self.peer_cid, pn);
        let mut w = Writer::new(&mut buf[hdr..limit]);
        fill(&mut w);
        let n = w.pos();
        let total = self.seal_packet(buf, n, pn);
        self.space.next_pn += 1;
        self.record_sent(now_us, false);
        Some(total)
    }

    /// Seals the datagram in `buf` (its sealed header, then `plain_len` bytes) under `pn`
    /// and returns its length; while the driver seals (`poll_transmit_deferred`), leaves it
    /// as it is and notes `pn` for the driver.
    pub(super) fn seal_packet(&mut self, buf: &mut [u8], plain_len: usize, pn: u64) -> usize {
        let total = wire::SEALED_HEADER_LEN + plain_len + wire::TAG_LEN;
        if self.space.defer_seal {
            assert!(buf.len() >= total, "no room for the tag");
            self.space.unsealed = Some(pn);
            return total;
        }
        let keys = self.space.keys.as_ref().expect("sealed only with keys");
        keys.send.seal(buf, plain_len, pn)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::conn::test_pair::TunnelPair;
    use crate::conn::NoFiles;

    /// What `poll_transmit_deferred` writes is the datagram `poll_transmit` would write,
    /// but unsealed: the peer refuses it as it is (an authentication failure, counted,
    /// nothing changed) and takes it once the driver seals it with `send_key`. A stream
    /// sent that way, with the client's every datagram sealed by its driver, arrives whole.
    #[test]
    fn a_deferred_datagram_is_refused_until_the_driver_seals_it() {
        let mut p = TunnelPair::new(Duration::from_millis(1));
        p.seal_in_driver = true;
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 13) as u8).collect();
        assert_eq!(p.c.stream_write(&data), data.len());
        let mut buf = vec![0u8; 1500];
        let now = p.now;
        let t =
            p.c.poll_transmit_deferred(now, &mut buf, &mut NoFiles)
                .expect("stream bytes to send");
        let pn = t
            .seal_pn
            .expect("an established session's datagrams are sealed");
        let mut d = buf[..t.len].to_vec();
        p.to_server.push_back((now, d.clone()));
        p.run(Duration::from_millis(1));
        assert_eq!(p.server().stats().dropped_auth, 1);
        assert!(p.server().stream_peek().is_empty());
        let key = p.c.send_key().expect("keys").clone();
        assert_eq!(key.seal_datagram(&mut d, pn), t.len);
        p.to_server.push_back((p.now, d));
        p.run(Duration::from_secs(3));
        assert_eq!(p.server().stats().dropped_auth, 1);
        assert!(
            p.server().stream_peek() == &data[..],
            "the stream did not arrive whole"
        );
        assert!(p.c.stats().data_packets_sent > 100);
    }
}
