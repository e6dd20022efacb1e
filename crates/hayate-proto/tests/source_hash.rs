//! A sender whose driver hashes its files (`Connection::hash_sources_outside`): resuming a
//! file the receiver mostly has reads only the missing blocks inside `poll_transmit` (it used
//! to read and hash every kept block there, gigabytes in one call), the file's hash is
//! announced only once the driver hands it in, and the session is kept alive meanwhile.

use std::time::{Duration, Instant};

use hayate_proto::conn::{BlockSink, Connection, StorageError};
use hayate_proto::endpoint::{Endpoint, Route};
use hayate_proto::{Event, XferId};

mod common;
use common::{endpoint_and_client, file_hash, Source};

#[derive(Default)]
struct Sink {
    written: u64,
}

impl BlockSink for Sink {
    fn write(&mut self, _: XferId, _: u64, data: &[u8]) -> Result<(), StorageError> {
        self.written += data.len() as u64;
        Ok(())
    }
}

#[test]
fn a_resumed_send_reads_only_what_is_missing_and_waits_for_the_drivers_hash() {
    let t0 = Instant::now();
    let addr = "192.0.2.1:4000".parse().unwrap();
    let (mut ep, mut c) = endpoint_and_client(t0);
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

/// A client and a server session, established, moving datagrams between them at each step.
struct Pair {
    c: Connection,
    ep: Endpoint,
    cid: hayate_proto::wire::Cid,
    now: Instant,
}

impl Pair {
    fn new() -> Pair {
        let t0 = Instant::now();
        let (ep, c) = endpoint_and_client(t0);
        let mut p = Pair {
            c,
            ep,
            cid: Default::default(),
            now: t0,
        };
        p.run(Duration::from_millis(100));
        assert!(p.c.is_established() && p.server().is_established());
        p
    }

    fn server(&mut self) -> &mut Connection {
        self.ep.conn_mut(self.cid).expect("server session")
    }

    /// Runs `d` of virtual time in 10 ms steps; both sides' events are dropped.
    fn run(&mut self, d: Duration) {
        let addr = "192.0.2.1:4000".parse().unwrap();
        let until = self.now + d;
        let mut buf = vec![0u8; 1500];
        while self.now < until {
            self.now += Duration::from_millis(10);
            let now = self.now;
            if self.c.poll_timeout(now).is_some_and(|t| t <= now) {
                self.c.handle_timeout(now);
            }
            while let Some(n) = self.c.poll_transmit(now, &mut buf, &mut Source::default()) {
                let d = &mut buf[..n];
                match self.ep.route(now, addr, d) {
                    Route::NewConn(id, mut reply) => {
                        self.cid = id;
                        self.c
                            .handle_datagram(now, &mut reply, &mut Sink::default());
                    }
                    Route::Conn(id) => {
                        self.ep.handle(id, now, now, addr, d, &mut Sink::default());
                    }
                    _ => {}
                }
            }
            while self.c.poll_event().is_some() {}
            let Some(s) = self.ep.conn_mut(self.cid) else {
                continue;
            };
            if s.poll_timeout(now).is_some_and(|t| t <= now) {
                s.handle_timeout(now);
            }
            while s.poll_event().is_some() {}
            while let Some(n) = s.poll_transmit(now, &mut buf, &mut Source::default()) {
                self.c
                    .handle_datagram(now, &mut buf[..n], &mut Sink::default());
            }
        }
    }
}

/// Either side's driver may spend longer than the idle timeout on something the peer waits
/// for (a whole-file hash for `--update`) while nothing is in flight: `keep_alive` keeps the
/// session up, with a PING an eighth of the idle timeout into each silence, not a stream
/// of them. Without it the silent session ends.
#[test]
fn keep_alive_outlasts_the_idle_timeout_on_either_side() {
    for server_side in [false, true] {
        let mut p = Pair::new();
        let pings = |p: &mut Pair| p.c.stats().pings_sent + p.server().stats().pings_sent;
        let before = pings(&mut p);
        if server_side {
            p.server().keep_alive(true);
        } else {
            p.c.keep_alive(true);
        }
        p.run(Duration::from_secs(40));
        assert!(p.c.is_established(), "server side {server_side}");
        assert!(p.server().is_established(), "server side {server_side}");
        let sent = pings(&mut p) - before;
        // Every 1.875 s of the default 15 s: about 21 in 40 s.
        assert!((15..=30).contains(&sent), "{sent} pings in 40 s");
        if server_side {
            p.server().keep_alive(false);
        } else {
            p.c.keep_alive(false);
        }
        p.run(Duration::from_secs(20));
        assert!(
            !p.c.is_established(),
            "a silent session outlived the timeout"
        );
    }
}

/// A download asked for and not yet answered (the server hashes for `--update`, keeping the
/// session alive): the client waits at the keep-alive's pace, not probing every round trip.
#[test]
fn an_unanswered_get_waits_without_a_storm_of_pings() {
    let mut p = Pair::new();
    p.server().keep_alive(true);
    let before = p.c.stats().pings_sent;
    // The server's driver drops the request's event: it never answers.
    p.c.request("big.bin");
    p.run(Duration::from_secs(10));
    assert!(p.c.is_established() && p.server().is_established());
    let sent = p.c.stats().pings_sent - before;
    // At most one per 1.875 s of silence, and the server's pings answer some silences.
    assert!(sent <= 8, "{sent} pings in 10 s");
}
