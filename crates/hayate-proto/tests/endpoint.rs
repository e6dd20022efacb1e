//! The endpoint under attack: nothing unauthenticated changes a session (a replayed or
//! forged datagram from another address moves nothing and gets nothing), a client's new
//! address is used only after it answers a path challenge (and gets at most 3x what it sent
//! until then), hellos beyond the key-exchange budget get a stateless retry, and a seeded run
//! repeats exactly.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hayate_proto::conn::{BlockSink, BlockSource, Config, Connection, FileOffer, StorageError};
use hayate_proto::crypto::Psk;
use hayate_proto::endpoint::{Endpoint, Route, PATH_AMPLIFICATION};
use hayate_proto::handshake::ClientHandshake;
use hayate_proto::rng::Rng;
use hayate_proto::sim::{self, LinkParams, Scenario};
use hayate_proto::wire::{peek_kind, AddrFamily, HelloRetry, PacketKind};
use hayate_proto::XferId;

struct Null;

impl BlockSink for Null {
    fn write(&mut self, _: XferId, _: u64, _: &[u8]) -> Result<(), StorageError> {
        Ok(())
    }
}

impl BlockSource for Null {
    fn read(&mut self, _: XferId, _: u64, buf: &mut [u8]) -> Result<(), StorageError> {
        buf.fill(7);
        Ok(())
    }
}

const A: &str = "192.0.2.10:40000";
const B: &str = "198.51.100.7:5555";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn psk() -> Psk {
    Psk::from_bytes([3; 32])
}

fn drain(c: &mut Connection, now: Instant) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; c.max_datagram()];
    while let Some(n) = c.poll_transmit(now, &mut buf, &mut Null) {
        out.push(buf[..n].to_vec());
    }
    out
}

/// A client and a server session, established over address A; returns the session's cid.
fn established(now: Instant) -> (Connection, Endpoint, u32) {
    let mut ep = Endpoint::with_rng(psk(), Config::default(), now, Rng::seeded(1));
    let mut c = Connection::client_with_rng(
        Config::default(),
        &psk(),
        AddrFamily::V4,
        now,
        &mut Rng::seeded(2),
    );
    let mut cid = None;
    for _ in 0..4 {
        for mut d in drain(&mut c, now) {
            match ep.route(now, addr(A), &d) {
                Route::NewConn(id, mut reply) => {
                    cid = Some(id);
                    assert!(c.handle_datagram(now, &mut reply, &mut Null));
                }
                Route::Conn(id) => {
                    assert!(ep
                        .handle(id, now, now, addr(A), &mut d, &mut Null)
                        .is_none());
                }
                r => panic!("unexpected {r:?}"),
            }
        }
        let id = cid.expect("session created");
        let mut buf = vec![0u8; 1500];
        let sc = ep.conn_mut(id).unwrap();
        while let Some(n) = sc.poll_transmit(now, &mut buf, &mut Null) {
            c.handle_datagram(now, &mut buf[..n], &mut Null);
        }
    }
    let id = cid.unwrap();
    assert!(c.is_established());
    assert!(ep.conn_mut(id).unwrap().is_established());
    (c, ep, id)
}

/// The client's next datagram (it has a control message to say).
fn next_from_client(c: &mut Connection, now: Instant) -> Vec<u8> {
    c.meta(hayate_proto::control::MetaOp::List {
        path: "x".into(),
        recursive: false,
    });
    drain(c, now).pop().expect("the client says something")
}

#[test]
fn a_replayed_datagram_from_another_address_changes_nothing_and_gets_nothing() {
    let now = Instant::now();
    let (mut c, mut ep, id) = established(now);
    let d = next_from_client(&mut c, now);
    // The real one first, from the session's address.
    assert!(ep
        .handle(id, now, now, addr(A), &mut d.clone(), &mut Null)
        .is_none());
    // The same bytes again from elsewhere: a replay.
    assert!(ep
        .handle(id, now, now, addr(B), &mut d.clone(), &mut Null)
        .is_none());
    // Forged: flipped bits, truncated, a live cid with garbage.
    let mut flipped = d.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    assert!(ep
        .handle(id, now, now, addr(B), &mut flipped, &mut Null)
        .is_none());
    let mut short = d[..d.len() - 3].to_vec();
    assert!(ep
        .handle(id, now, now, addr(B), &mut short, &mut Null)
        .is_none());
    let mut garbage = d.clone();
    garbage[9..].fill(0x5a);
    assert!(ep
        .handle(id, now, now, addr(B), &mut garbage, &mut Null)
        .is_none());
    assert_eq!(ep.conn_addr(id), Some(addr(A)));
    let st = ep.stats();
    assert_eq!(st.dropped_other_path, 4);
    assert_eq!((st.path_challenges_sent, st.path_challenge_bytes), (0, 0));
    let cs = ep.conn_mut(id).unwrap().stats();
    // Same packet number as the one already taken: the replay window drops them unopened.
    assert_eq!(cs.dropped_replay + cs.dropped_auth, 4);
    let taken = cs.packets_received;
    assert!(ep
        .handle(id, now, now, addr(B), &mut d.clone(), &mut Null)
        .is_none());
    assert_eq!(ep.conn_mut(id).unwrap().stats().packets_received, taken);
}

#[test]
fn a_rebound_client_moves_only_after_answering_from_its_new_address() {
    let t0 = Instant::now();
    let (mut c, mut ep, id) = established(t0);
    // The client's NAT gave it a new port: its next (fresh, authentic) datagram comes from B.
    let d = next_from_client(&mut c, t0);
    let got = d.len() as u64;
    let mut ch = ep
        .handle(id, t0, t0, addr(B), &mut d.clone(), &mut Null)
        .expect("a challenge to the new address");
    assert!(ch.len() as u64 <= PATH_AMPLIFICATION * got);
    assert_eq!(
        ep.conn_addr(id),
        Some(addr(A)),
        "not moved before the answer"
    );
    // Another datagram from B within the probe interval: no second challenge.
    let d2 = next_from_client(&mut c, t0);
    assert!(ep
        .handle(id, t0, t0, addr(B), &mut d2.clone(), &mut Null)
        .is_none());

    // The client answers; the answer comes from B.
    assert!(c.handle_datagram(t0, &mut ch, &mut Null));
    let answers = drain(&mut c, t0);
    assert!(!answers.is_empty());
    for mut a in answers {
        ep.handle(id, t0, t0, addr(B), &mut a, &mut Null);
    }
    assert_eq!(ep.conn_addr(id), Some(addr(B)));
    let st = ep.stats();
    assert_eq!((st.paths_validated, st.path_challenges_sent), (1, 1));
    assert!(st.path_challenge_bytes <= PATH_AMPLIFICATION * got);
}

#[test]
fn an_answer_by_the_old_path_moves_nothing() {
    let t0 = Instant::now();
    let (mut c, mut ep, id) = established(t0);
    let d = next_from_client(&mut c, t0);
    let mut ch = ep
        .handle(id, t0, t0, addr(B), &mut d.clone(), &mut Null)
        .expect("a challenge");
    // An on-path attacker raced the client's datagram from B and forwards our challenge to
    // the client, which answers from its real address A.
    c.handle_datagram(t0, &mut ch, &mut Null);
    for mut a in drain(&mut c, t0) {
        ep.handle(id, t0, t0, addr(A), &mut a, &mut Null);
    }
    assert_eq!(ep.conn_addr(id), Some(addr(A)));
    assert_eq!(ep.stats().paths_validated, 0);
    // B gets no more challenges than its own bytes allow: none without new fresh datagrams.
    let later = t0 + Duration::from_secs(1);
    assert!(ep
        .handle(id, later, later, addr(B), &mut d.clone(), &mut Null)
        .is_none());
    assert_eq!(ep.stats().path_challenges_sent, 1);
}

/// Sends 100 fresh hellos from 100 addresses at one instant; returns how many were
/// accepted and how many retried.
fn hundred_hellos(ep: &mut Endpoint, now: Instant) -> (u32, u32) {
    let mut rng = Rng::seeded(6);
    let (mut accepted, mut retried) = (0, 0);
    for i in 0..100u16 {
        let hs = ClientHandshake::with_rng(&psk(), 1500, &mut rng);
        let from = SocketAddr::from(([10, 1, (i >> 8) as u8, i as u8], 1000 + i));
        match ep.route(now, from, hs.hello()) {
            Route::NewConn(..) => accepted += 1,
            Route::Reply(r) => {
                assert_eq!(peek_kind(&r), Ok(PacketKind::HelloRetry));
                let rt = HelloRetry::decode(&r).unwrap();
                assert_eq!(rt.client_cid, u64::from(hs.client_cid()));
                assert!(r.len() < hs.hello().len());
                retried += 1;
            }
            r => panic!("unexpected {r:?}"),
        }
    }
    (accepted, retried)
}

#[test]
fn hellos_over_the_budget_get_a_retry_and_a_token_gets_in() {
    let now = Instant::now();
    // One of a server's four threads spends a quarter of its key-exchange budget.
    let mut ep = Endpoint::with_rng(psk(), Config::default(), now, Rng::seeded(5));
    ep.set_shard(hayate_proto::wire::CidShard::new(1, 4).unwrap());
    assert_eq!(hundred_hellos(&mut ep, now), (8, 92));

    let mut ep = Endpoint::with_rng(psk(), Config::default(), now, Rng::seeded(5));
    assert_eq!(hundred_hellos(&mut ep, now), (32, 68));
    assert_eq!(ep.len(), 32);

    // A real client, still over budget: it follows the retry and gets in from its address.
    let mut c = Connection::client_with_rng(
        Config::default(),
        &psk(),
        AddrFamily::V4,
        now,
        &mut Rng::seeded(7),
    );
    let hello = drain(&mut c, now).pop().unwrap();
    let Route::Reply(mut retry) = ep.route(now, addr(A), &hello) else {
        panic!("over budget: a retry")
    };
    assert!(!c.handle_datagram(now, &mut retry, &mut Null));
    assert_eq!(c.stats().hello_retries, 1);
    let second = drain(&mut c, now).pop().expect("the hello again at once");
    assert_ne!(second, hello, "it carries the token");
    // From another address the token is worth nothing.
    assert!(matches!(ep.route(now, addr(B), &second), Route::Reply(_)));
    assert_eq!(ep.stats().retry_tokens_invalid, 1);
    let Route::NewConn(_, mut reply) = ep.route(now, addr(A), &second) else {
        panic!("a valid token gets a session")
    };
    assert!(c.handle_datagram(now, &mut reply, &mut Null));
    assert!(c.is_established());
    // An expired token does not.
    let mut late = Connection::client_with_rng(
        Config::default(),
        &psk(),
        AddrFamily::V4,
        now,
        &mut Rng::seeded(8),
    );
    let h = drain(&mut late, now).pop().unwrap();
    let Route::Reply(mut r) = ep.route(now, addr(B), &h) else {
        panic!("a retry")
    };
    late.handle_datagram(now, &mut r, &mut Null);
    let h2 = drain(&mut late, now).pop().unwrap();
    let much_later = now + Duration::from_secs(12);
    let before = ep.stats().retry_tokens_invalid;
    let _ = ep.route(much_later, addr(B), &h2);
    assert_eq!(ep.stats().retry_tokens_invalid, before + 1);
}

#[test]
fn a_seeded_simulation_repeats_exactly() {
    let run = || {
        let mut sc = Scenario::new(42);
        sc.forward = LinkParams {
            delay_us: 10_000,
            rate: Some(12_500_000),
            queue_bytes: 256 << 10,
            loss: 0.01,
            ..LinkParams::default()
        };
        sc.reverse = LinkParams {
            delay_us: 10_000,
            ..LinkParams::default()
        };
        sc.uploads = vec![("a.bin".into(), vec![9u8; 3_000_000])];
        sim::run(&sc)
    };
    let (a, b) = (run(), run());
    assert!(a.ok && b.ok, "{:?} {:?}", a.error, b.error);
    assert_eq!(a.elapsed_us, b.elapsed_us);
    assert_eq!(a.client, b.client);
    assert_eq!(a.server, b.server);
    assert_eq!(a.fwd_delivered, b.fwd_delivered);
}

/// Moves everything either side has to say to the other, a millisecond at a time (bulk
/// control goes paced), until both are quiet; returns the events of the server's session.
fn pump(c: &mut Connection, ep: &mut Endpoint, id: u32, t0: Instant) -> Vec<hayate_proto::Event> {
    let mut events = Vec::new();
    let mut now = t0;
    let mut quiet = 0;
    for _ in 0..10_000 {
        now += Duration::from_millis(1);
        let mut moved = false;
        for mut d in drain(c, now) {
            moved = true;
            ep.handle(id, now, now, addr(A), &mut d, &mut Null);
        }
        let s = ep.conn_mut(id).unwrap();
        while let Some(e) = s.poll_event() {
            events.push(e);
        }
        for mut d in drain(s, now) {
            moved = true;
            c.handle_datagram(now, &mut d, &mut Null);
        }
        // Quiet for a while: nothing more to say (the pacer waits less than that).
        quiet = if moved { 0 } else { quiet + 1 };
        if quiet == 50 {
            break;
        }
    }
    events
}

#[test]
fn a_peer_offering_more_than_a_receiver_tracks_is_refused_not_obeyed() {
    use hayate_proto::conn::{MAX_INCOMING_BLOCKS, MAX_OPEN_INCOMING};
    use hayate_proto::Event;
    let now = Instant::now();
    let (mut c, mut ep, id) = established(now);
    // A file of more blocks than a receiver keeps loss maps for: refused by name.
    let huge = MAX_INCOMING_BLOCKS * 2000;
    c.send_file("huge.bin", huge, 0o644, 0);
    // Then 20 000 small files at once, where a real client keeps 64 going (`NO_CLOBBER`:
    // no block goes before an answer, so only the offers and answers travel; with 20 000
    // files each sending a block on its own, the sender's per-packet walk over them made
    // this test take 20 s).
    for i in 0..20_000 {
        let name = format!("f{i}");
        let mut f = FileOffer::plain(&name, 10, 0o644, 0);
        f.flags = hayate_proto::control::flags::NO_CLOBBER;
        c.send_file_ext(&f);
    }
    let events = pump(&mut c, &mut ep, id, now);
    let offered = events
        .iter()
        .filter(|e| matches!(e, Event::Offered { .. }))
        .count();
    assert_eq!(offered, MAX_OPEN_INCOMING);
    let mut rejected = Vec::new();
    while let Some(e) = c.poll_event() {
        if let Event::Rejected { reason, .. } = e {
            rejected.push(reason);
        }
    }
    assert_eq!(rejected.len(), 20_001 - MAX_OPEN_INCOMING);
    assert!(rejected[0].starts_with("huge.bin: "), "{}", rejected[0]);
    assert!(rejected[0].contains("more than this receiver tracks"));
    assert!(
        rejected[1].contains("files offered at once"),
        "{}",
        rejected[1]
    );
}

/// A repeated hello gets the same ServerHello again, padded as the first (it must prove the
/// way back too), never longer than the hello; a flood of one replayed hello is answered
/// with at most about 1 MB of repeats a second, not reflected byte for byte.
#[test]
fn repeated_hellos_get_the_same_padded_reply_within_a_byte_budget() {
    let now = Instant::now();
    let mut ep = Endpoint::with_rng(psk(), Config::default(), now, Rng::seeded(9));
    let hs = ClientHandshake::with_rng(&psk(), 1500, &mut Rng::seeded(10));
    let hello = hs.datagram(AddrFamily::V4);
    assert_eq!(hello.len(), 1472);
    let Route::NewConn(_, first) = ep.route(now, addr(A), &hello) else {
        panic!("a session")
    };
    assert_eq!(first.len(), 1472);
    let Route::Reply(again) = ep.route(now, addr(A), &hello) else {
        panic!("the same answer")
    };
    assert_eq!(again, first);
    assert_eq!(hs.handle(&psk(), &again).unwrap().mtu, 1500);
    // A shorter copy of the hello (padding cut) gets nothing: the answer would be longer.
    assert!(matches!(
        ep.route(now, addr(A), &hello[..1300]),
        Route::Drop
    ));

    let (mut replied, mut sent) = (0usize, 0usize);
    for _ in 0..20_000 {
        sent += hello.len();
        if let Route::Reply(r) = ep.route(now, addr(B), &hello) {
            replied += r.len();
        }
    }
    assert!(
        (900_000..=1_000_000).contains(&replied),
        "{replied} B of repeats for {sent} B of hellos within a second"
    );
    // The next second has a budget again.
    let later = now + Duration::from_millis(1001);
    assert!(matches!(ep.route(later, addr(A), &hello), Route::Reply(_)));
}

/// A server's thread `i` of `n` accepts sessions only with cids of its class, and the
/// client's sealed packets carry that class where the kernel's socket filter reads it: byte
/// `SEALED_CID_LOW_BYTE_AT`, after the kind byte.
#[test]
fn a_shards_sessions_get_cids_of_its_class_seen_at_the_filtered_byte() {
    use hayate_proto::wire::{CidShard, SEALED_CID_LOW_BYTE_AT, SEALED_KIND_BYTE};
    let now = Instant::now();
    for (index, count) in [(0u8, 2u8), (1, 2), (2, 3), (5, 7), (63, 64)] {
        let shard = CidShard::new(index, count).unwrap();
        let mut ep = Endpoint::with_rng(psk(), Config::default(), now, Rng::seeded(9));
        ep.set_shard(shard);
        for seed in 0..24 {
            // Half a second apart: within the thread's share of the key-exchange budget.
            let now = now + Duration::from_millis(500 * seed);
            let mut c = Connection::client_with_rng(
                Config::default(),
                &psk(),
                AddrFamily::V4,
                now,
                &mut Rng::seeded(100 + seed),
            );
            let from: SocketAddr = format!("192.0.2.1:{}", 1000 + seed).parse().unwrap();
            let mut id = None;
            for d in drain(&mut c, now) {
                if let Route::NewConn(cid, mut reply) = ep.route(now, from, &d) {
                    assert!(c.handle_datagram(now, &mut reply, &mut Null));
                    id = Some(cid);
                }
            }
            let id = id.expect("accepted");
            assert_eq!(
                CidShard::of(id, count),
                index,
                "cid {id:08x} of shard {index}/{count}"
            );
            let d = next_from_client(&mut c, now);
            assert_eq!(d[0], SEALED_KIND_BYTE);
            assert_eq!(d[SEALED_CID_LOW_BYTE_AT] % count, index);
            assert!(matches!(ep.route(now, from, &d), Route::Conn(x) if x == id));
        }
    }
    assert!(CidShard::new(2, 2).is_none() && CidShard::new(0, 0).is_none());
    assert!(CidShard::new(0, 65).is_none());
    // Placing keeps a cid's other bits and lands in the class, also near 255.
    let s = CidShard::new(2, 3).unwrap();
    for low in [0u32, 1, 2, 3, 250, 253, 254, 255] {
        let placed = s.place(0xabcd_ef00 | low);
        assert_eq!(placed & !0xff, 0xabcd_ef00);
        assert_eq!(CidShard::of(placed, 3), 2, "{low} -> {placed:08x}");
    }
}
