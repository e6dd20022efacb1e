//! A sender whose driver hashes its files (`Connection::hash_sources_outside`): resuming a
//! file the receiver mostly has reads only the missing blocks inside `poll_transmit` (it used
//! to read and hash every kept block there, gigabytes in one call), the file's hash is
//! announced only once the driver hands it in, and the session is kept alive meanwhile.

use std::time::{Duration, Instant};

use hayate_proto::conn::{BlockSink, BlockSource, Config, Connection};
use hayate_proto::crypto::Psk;
use hayate_proto::endpoint::{Endpoint, Route};
use hayate_proto::rng::Rng;
use hayate_proto::wire::AddrFamily;
use hayate_proto::{Event, XferId};

/// File bytes: byte i of the file is `i as u8`; counts what the sender read.
#[derive(Default)]
struct Source {
    read_bytes: u64,
}

impl BlockSource for Source {
    fn read(&mut self, _: XferId, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (offset + i as u64) as u8;
        }
        self.read_bytes += buf.len() as u64;
        Ok(())
    }
}

#[derive(Default)]
struct Sink {
    written: u64,
}

impl BlockSink for Sink {
    fn write(&mut self, _: XferId, _: u64, data: &[u8]) -> Result<(), String> {
        self.written += data.len() as u64;
        Ok(())
    }
}

fn file_hash(size: u64) -> [u8; 32] {
    let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
    *blake3::hash(&data).as_bytes()
}

#[test]
fn a_resumed_send_reads_only_what_is_missing_and_waits_for_the_drivers_hash() {
    let t0 = Instant::now();
    let psk = Psk::from_bytes([9; 32]);
    let addr = "192.0.2.1:4000".parse().unwrap();
    let mut ep = Endpoint::with_rng(psk.clone(), Config::default(), t0, Rng::seeded(1));
    let mut c = Connection::client_with_rng(
        Config::default(),
        &psk,
        AddrFamily::V4,
        t0,
        &mut Rng::seeded(2),
    );
    c.hash_sources_outside();
    let size: u64 = 20 << 20;
    let xfer = c.send_file("f.bin", size, 0o644, 0);
    let (mut src, mut sink) = (Source::default(), Sink::default());
    let mut cid = None;
    let mut now = t0;
    let mut hash_given = false;
    let mut waiting_since = None;
    let mut verified = None;
    let mut buf = vec![0u8; 1500];
    let mut kept_blocks = 0;
    for _ in 0..200_000 {
        // Fine steps while data flows, coarse ones while the driver hashes.
        now += if c.sources_awaiting_hash().is_empty() {
            Duration::from_micros(20)
        } else {
            Duration::from_millis(5)
        };
        while let Some(n) = c.poll_transmit(now, &mut buf, &mut src) {
            let d = &mut buf[..n];
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
        let Some(id) = cid else { continue };
        let s = ep.conn_mut(id).unwrap();
        if s.poll_timeout(now).is_some_and(|t| t <= now) {
            s.handle_timeout(now);
        }
        while let Some(e) = s.poll_event() {
            match e {
                Event::Offered { xfer, size, .. } => {
                    // The receiver kept the first 90 % of the file from an earlier run.
                    let bs = s.block_size() as u64;
                    kept_blocks = (size * 9 / 10) / bs;
                    s.accept(xfer, &[(0, kept_blocks)]);
                }
                Event::IncomingComplete { xfer, blake3 } => {
                    assert_eq!(
                        blake3,
                        file_hash(size),
                        "the sender announced its file's hash"
                    );
                    s.finish_incoming(xfer, Ok(blake3));
                }
                _ => {}
            }
        }
        let mut sbuf = vec![0u8; 1500];
        while let Some(n) = s.poll_transmit(now, &mut sbuf, &mut Source::default()) {
            c.handle_datagram(now, &mut sbuf[..n], &mut sink);
        }
        if c.poll_timeout(now).is_some_and(|t| t <= now) {
            c.handle_timeout(now);
        }
        while let Some(e) = c.poll_event() {
            if let Event::OutgoingDone { result, .. } = e {
                verified = Some(result);
            }
        }
        // Every block out, no hash yet: the connection asks the driver and waits for it,
        // probing meanwhile; the driver's hash (a slow disk) comes 20 s later, past the
        // idle timeout (15 s) a silent session would end at.
        let awaiting = c.sources_awaiting_hash() == [xfer];
        if awaiting && !hash_given {
            let since = *waiting_since.get_or_insert(now);
            if now.duration_since(since) > Duration::from_secs(20) {
                c.set_source_hash(xfer, file_hash(size));
                hash_given = true;
            }
        }
        if verified.is_some() {
            break;
        }
    }
    assert!(hash_given, "the connection asked for the driver's hash");
    assert_eq!(verified, Some(Ok(file_hash(size))));
    assert!(
        c.is_established() || c.is_draining(),
        "the session lived through the wait"
    );
    let bs = c.block_size() as u64;
    let missing = size - kept_blocks * bs;
    // Only the missing tenth was read (plus retransmissions there, none on this clean path).
    assert_eq!(
        src.read_bytes, missing,
        "kept blocks were read by the sender"
    );
}
