//! A delta's receiver answers the blocks whose leaves it has compared (`Compared`) while it
//! compares the rest: the sender sends those blocks at once and nothing beyond them, what
//! the receiver holds is never sent nor counted as delivered, and the file completes after
//! `Ready` answers the rest.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hayate_proto::conn::{BlockSink, StorageError};
use hayate_proto::endpoint::Route;
use hayate_proto::{Event, XferId};

mod common;
use common::{endpoint_and_client, file_hash, Source};

/// Every write, by offset: its length, and how many times it came.
#[derive(Default)]
struct Sink {
    writes: BTreeMap<u64, (usize, u32)>,
}

impl BlockSink for Sink {
    fn write(&mut self, _: XferId, offset: u64, data: &[u8]) -> Result<(), StorageError> {
        for (i, b) in data.iter().enumerate() {
            assert_eq!(
                *b,
                (offset + i as u64) as u8,
                "the bytes written are the file's"
            );
        }
        let w = self.writes.entry(offset).or_insert((data.len(), 0));
        w.1 += 1;
        Ok(())
    }
}

#[test]
fn blocks_flow_as_their_leaves_are_compared_and_not_beyond() {
    answered_in_parts(0);
}

/// The same with every 13th datagram lost either way: a lost `Compared`, leaf hashes or
/// blocks are sent again, and still nothing beyond an answer is sent or written.
#[test]
fn answers_in_parts_survive_loss() {
    answered_in_parts(13);
}

/// An upload whose receiver answers in three parts; `lose`: every so many datagrams of
/// each direction are lost (0: none).
fn answered_in_parts(lose: u64) {
    let mut sent = [0u64; 2];
    let mut lost = |dir: usize| {
        sent[dir] += 1;
        lose > 0 && sent[dir].is_multiple_of(lose)
    };
    let t0 = Instant::now();
    let addr = "192.0.2.1:4000".parse().unwrap();
    let (mut ep, mut c) = endpoint_and_client(t0);
    c.hash_sources_outside();
    let size: u64 = 12 << 20;
    let xfer = c.send_file("f.bin", size, 0o644, 0);
    let mut sink = Sink::default();
    let mut cid = None;
    let mut now = t0;
    let mut buf = vec![0u8; 1500];
    let mut sbuf = vec![0u8; 1500];
    // The receiver's answers: blocks [0, a) compared, half of them held; then [a, b),
    // the first tenth of them held; then `Ready`, the last block held.
    let mut stage = 0;
    let (mut a, mut b, mut blocks, mut bs) = (0u64, 0u64, 0u64, 0u64);
    let mut held = Vec::new();
    let mut verified = None;
    let mut settle = 0;
    for _ in 0..2_000_000 {
        now += Duration::from_micros(20);
        while let Some(n) = c.poll_transmit(now, &mut buf, &mut Source::default()) {
            let d = &mut buf[..n];
            if cid.is_some() && lost(0) {
                continue;
            }
            match ep.route(now, addr, d) {
                Route::NewConn(id, mut reply) => {
                    cid = Some(id);
                    c.handle_datagram(now, &mut reply, &mut sink);
                }
                Route::Conn(id) => {
                    ep.handle(id, now, now, addr, d, &mut sink);
                }
                _ => {}
            }
        }
        // The sender's driver: leaf hashes (their values are the receiver's business).
        for x in c.sums_wanted() {
            let leaves = size.div_ceil(4096) as usize;
            c.send_sums(x, 0, &vec![[7u8; 16]; leaves]);
            c.set_source_hash(x, file_hash(size));
        }
        let Some(id) = cid else { continue };
        let s = ep.conn_mut(id).unwrap();
        if s.poll_timeout(now).is_some_and(|t| t <= now) {
            s.handle_timeout(now);
        }
        while let Some(e) = s.poll_event() {
            match e {
                Event::Offered { xfer, .. } => s.want_sums(xfer, 1),
                Event::IncomingComplete { xfer, blake3 } => s.finish_incoming(xfer, Ok(blake3)),
                _ => {}
            }
        }
        bs = s.block_size() as u64;
        blocks = size.div_ceil(bs);
        let sums_in: u64 = s.take_sums(xfer).iter().map(|(_, l)| l.len() as u64).sum();
        settle += sums_in;
        let last_write = sink.writes.keys().next_back().map(|&o| o / bs);
        match stage {
            0 if settle > 0 => {
                // Nothing flows before the first answer.
                assert!(sink.writes.is_empty(), "data before any answer");
                a = blocks / 3;
                held.push((0, a / 2));
                s.accept_compared(xfer, a, &[(0, a / 2)], &[]);
                stage = 1;
            }
            1 if sink.writes.len() as u64 == a - a / 2 => {
                // Everything compared arrived, nothing beyond: wait a while to be sure.
                stage = 2;
                settle = 0;
            }
            1 | 2 => {
                assert!(
                    last_write.is_none_or(|l| l < a),
                    "a block beyond the answer came"
                );
                if stage == 2 {
                    settle += 1;
                    if settle > 2000 {
                        b = 2 * blocks / 3;
                        let h = (a, a + (b - a) / 10);
                        held.push(h);
                        // Ranges outside [a, b) are not this answer's: ignored.
                        s.accept_compared(xfer, b, &[(0, 3), h, (b, b + 5)], &[]);
                        stage = 3;
                    }
                }
            }
            3 if sink.writes.len() as u64 == (a - a / 2) + (b - a) - (held[1].1 - held[1].0) => {
                held.push((blocks - 1, blocks));
                s.accept_with(xfer, &[(0, 2), (blocks - 1, blocks)], &[], None);
                stage = 4;
            }
            3 => assert!(
                last_write.is_none_or(|l| l < b),
                "a block beyond the answer came"
            ),
            _ => {}
        }
        while let Some(n) = s.poll_transmit(now, &mut sbuf, &mut Source::default()) {
            if !lost(1) {
                c.handle_datagram(now, &mut sbuf[..n], &mut sink);
            }
        }
        if c.poll_timeout(now).is_some_and(|t| t <= now) {
            c.handle_timeout(now);
        }
        while let Some(e) = c.poll_event() {
            if let Event::OutgoingDone { result, .. } = e {
                verified = Some(result);
            }
        }
        if verified.is_some() {
            break;
        }
    }
    assert_eq!(stage, 4, "every answer was given");
    assert_eq!(verified, Some(Ok(file_hash(size))));
    // Every block not held arrived once, whole; no held block came.
    let held_blocks = |blk: u64| held.iter().any(|&(x, y)| (x..y).contains(&blk));
    let expected: Vec<u64> = (0..blocks).filter(|&k| !held_blocks(k)).collect();
    let got: Vec<u64> = sink.writes.keys().map(|&o| o / bs).collect();
    assert_eq!(got, expected);
    assert!(
        sink.writes.values().all(|&(_, n)| n == 1),
        "a block came twice"
    );
    let st = c.stats();
    if lose > 0 {
        assert!(st.data_packets_retransmitted > 0, "nothing was lost");
    }
    let held_bytes: u64 =
        held.iter().map(|&(x, y)| (y - x) * bs).sum::<u64>() - (blocks * bs - size);
    // What the receiver held was not counted as delivered (the last blocks may have gone
    // unmapped: the verdict came first).
    let sent = size - held_bytes;
    assert!(
        st.data_bytes_acked <= sent && st.data_bytes_acked > sent * 9 / 10,
        "{} acknowledged of {sent} sent",
        st.data_bytes_acked
    );
}
