//! Whole sessions over the simulated network: every transfer must end verified and
//! byte-exact, whatever the network does to the datagrams.

use hayate_proto::cc::RateConfig;
use hayate_proto::crypto::Psk;
use hayate_proto::sim::{self, LinkParams, Rng, Scenario};
use hayate_proto::wire::{block_size, AddrFamily};

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

fn lossy(loss: f64, reorder: f64, dup: f64, corrupt: f64) -> LinkParams {
    LinkParams {
        delay_us: 20_000,
        rate: Some(12_500_000),
        queue_bytes: 1 << 20,
        loss,
        reorder,
        reorder_us: 3_000,
        duplicate: dup,
        corrupt,
        ..LinkParams::default()
    }
}

fn check(sc: &Scenario) -> sim::SimResult {
    let r = sim::run(sc);
    assert!(
        r.ok,
        "seed {} failed: {:?} rejected {:?}",
        sc.seed, r.error, r.rejected
    );
    for (p, d) in &sc.uploads {
        assert_eq!(r.server_files.get(p), Some(d), "upload {p} differs");
    }
    for (p, d) in &sc.downloads {
        assert_eq!(r.client_files.get(p), Some(d), "download {p} differs");
    }
    r
}

#[test]
fn clean_path_upload_and_download() {
    let mut sc = Scenario::new(1);
    sc.uploads = vec![("up.bin".into(), data(1, 1_000_000))];
    sc.downloads = vec![("down.bin".into(), data(2, 777_777))];
    let r = check(&sc);
    assert_eq!(r.client.data_packets_retransmitted, 0);
    assert_eq!(r.server.dropped_auth + r.client.dropped_auth, 0);
}

#[test]
fn edge_sizes() {
    let bs = block_size(1500, AddrFamily::V4);
    for (i, len) in [0usize, 1, bs - 1, bs, bs + 1, 2 * bs, 100_001]
        .into_iter()
        .enumerate()
    {
        let mut sc = Scenario::new(10 + i as u64);
        sc.uploads = vec![(format!("u{len}"), data(i as u64, len))];
        sc.downloads = vec![(format!("d{len}"), data(100 + i as u64, len))];
        check(&sc);
    }
}

#[test]
fn many_seeds_and_impairments_all_verify() {
    let settings = [
        (0.01, 0.0, 0.0, 0.0),
        (0.05, 0.05, 0.01, 0.0),
        (0.10, 0.10, 0.05, 0.01),
        (0.30, 0.0, 0.0, 0.0),
        (0.30, 0.20, 0.10, 0.02),
        (0.0, 0.0, 0.0, 0.05),
    ];
    let mut corrupted_total = 0;
    for (si, &(loss, reorder, dup, corrupt)) in settings.iter().enumerate() {
        for seed in 0..8u64 {
            let mut sc = Scenario::new(1000 * si as u64 + seed);
            sc.forward = lossy(loss, reorder, dup, corrupt);
            sc.reverse = lossy(loss, reorder, dup, corrupt);
            // At 30 % loss each way half the hello round trips fail: allow more tries.
            sc.client.connect_timeout = std::time::Duration::from_secs(20);
            let len = 50_000 + (seed as usize * 37_919) % 400_000;
            sc.uploads = vec![
                ("a/one".into(), data(seed, len)),
                ("a/two".into(), data(seed + 1, len / 3 + 1)),
            ];
            sc.downloads = vec![("srv".into(), data(seed + 2, len / 2))];
            let r = check(&sc);
            if loss >= 0.05 {
                assert!(
                    r.client.data_packets_retransmitted + r.server.data_packets_retransmitted > 0
                );
            }
            if corrupt > 0.0 {
                let dropped = r.server.dropped_auth
                    + r.server.dropped_malformed
                    + r.client.dropped_auth
                    + r.client.dropped_malformed
                    + r.endpoint.dropped_malformed
                    + r.client.dropped_unexpected
                    + r.server.dropped_unexpected
                    + r.endpoint.dropped_unknown_cid
                    + r.endpoint.hellos_rejected_auth;
                // A flipped bit never gets through: each corrupted datagram is dropped (a
                // flipped packet number may look like a replay instead).
                let replay = r.server.dropped_replay + r.client.dropped_replay;
                assert!(
                    dropped + replay >= r.corrupted,
                    "{dropped} + {replay} < {}",
                    r.corrupted
                );
                corrupted_total += r.corrupted;
            }
        }
    }
    assert!(corrupted_total > 0);
}

#[test]
fn retransmissions_stay_close_to_the_loss() {
    let mut sc = Scenario::new(77);
    sc.forward = lossy(0.03, 0.0, 0.0, 0.0);
    sc.reverse = lossy(0.03, 0.0, 0.0, 0.0);
    // Paced below the 12.5 MB/s bottleneck: only the random loss should cost resends.
    sc.client.rate = RateConfig::Fixed(10_000_000);
    sc.uploads = vec![("f".into(), data(5, 4_000_000))];
    let r = check(&sc);
    assert_eq!(r.fwd_queue_drops, 0);
    let ratio = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
    assert!(ratio < 0.03 + 0.02, "retransmitted {ratio:.3}");
}

#[test]
fn paced_rate_is_held() {
    let mut sc = Scenario::new(3);
    sc.forward = LinkParams {
        delay_us: 10_000,
        ..LinkParams::default()
    };
    sc.client.rate = RateConfig::Fixed(5_000_000);
    sc.uploads = vec![("f".into(), data(9, 5_000_000))];
    let r = check(&sc);
    let secs = r.elapsed_us as f64 / 1e6;
    // 5 MB at 5 MB/s plus a few RTTs of handshake and verification.
    assert!((1.0..1.3).contains(&secs), "took {secs} s");
}

#[test]
fn wrong_key_is_refused_with_a_clear_error() {
    let mut sc = Scenario::new(4);
    sc.client_psk = Psk::from_bytes([8; 32]);
    sc.uploads = vec![("f".into(), data(1, 1000))];
    let r = sim::run(&sc);
    assert!(!r.ok);
    let e = r.error.unwrap();
    assert!(e.contains("authentication failed"), "{e}");
    assert!(r.server_files.is_empty());
}

#[test]
fn missing_download_is_rejected() {
    let mut sc = Scenario::new(5);
    sc.missing_downloads = vec!["nope".into()];
    let r = sim::run(&sc);
    assert!(!r.ok);
    assert_eq!(
        r.rejected,
        vec![("nope".to_string(), "not found: nope".to_string())]
    );
}

#[test]
fn empty_session_closes_cleanly() {
    let r = sim::run(&Scenario::new(6));
    assert!(r.ok, "{:?}", r.error);
}

#[test]
fn server_not_there_times_out() {
    let mut sc = Scenario::new(7);
    sc.forward.loss = 1.0;
    sc.uploads = vec![("f".into(), data(1, 1000))];
    let r = sim::run(&sc);
    assert!(!r.ok);
    assert!(r.error.unwrap().contains("no answer from the server"));
}

#[test]
fn link_rate_step_down_is_survived() {
    let mut sc = Scenario::new(8);
    sc.forward = lossy(0.0, 0.0, 0.0, 0.0);
    sc.forward_steps = vec![sim::RateStep {
        at_us: 200_000,
        rate: Some(2_000_000),
    }];
    sc.client.rate = RateConfig::Fixed(10_000_000);
    sc.uploads = vec![("f".into(), data(1, 3_000_000))];
    check(&sc);
}

#[test]
fn pacing_holds_from_the_first_packet() {
    // Unlimited bottleneck with a tiny queue in front of a slow link: an unpaced start would
    // overflow it before the first ACK could slow the sender down.
    let mut sc = Scenario::new(12);
    sc.forward = LinkParams {
        delay_us: 100_000,
        rate: Some(2_000_000),
        queue_bytes: 30_000,
        ..LinkParams::default()
    };
    sc.client.rate = RateConfig::Fixed(1_500_000);
    sc.uploads = vec![("f".into(), data(3, 1_000_000))];
    let r = check(&sc);
    assert_eq!(r.fwd_queue_drops, 0, "burst at start overflowed the queue");
}

#[test]
fn download_rate_follows_the_clients_wish() {
    let mut sc = Scenario::new(13);
    sc.server.rate = RateConfig::Unlimited;
    sc.client.rate = RateConfig::Fixed(2_000_000);
    sc.downloads = vec![("d".into(), data(4, 2_000_000))];
    let r = check(&sc);
    let secs = r.elapsed_us as f64 / 1e6;
    assert!((0.95..1.3).contains(&secs), "took {secs} s");
}

/// 100 ms each way, no rate limit, `loss` each way; both ends paced at a fixed 10 MB/s.
fn long_fixed(seed: u64, loss: f64) -> Scenario {
    let mut sc = Scenario::new(seed);
    let one_way = LinkParams {
        delay_us: 100_000,
        loss,
        ..LinkParams::default()
    };
    sc.forward = one_way.clone();
    sc.reverse = one_way;
    sc.client.rate = RateConfig::Fixed(10_000_000);
    sc.server.rate = RateConfig::Fixed(10_000_000);
    sc
}

/// Data goes with the offer, before the receiver's Ready: the first blocks arrive half a
/// round trip after the handshake, not a round trip and a half. Kept until the receiver has
/// accepted, none of them is lost or sent twice.
#[test]
fn first_blocks_go_with_the_offer() {
    let mut sc = long_fixed(14, 0.0);
    sc.uploads = vec![("up".into(), data(5, 3_000_000))];
    sc.downloads = vec![("down".into(), data(6, 3_000_000))];
    let r = check(&sc);
    let first = |t: &[u64]| t.iter().position(|&b| b > 0);
    // Handshake done at 200 ms; offer and data reach the server at 300 ms. Waiting for
    // Ready, they would reach it at 500 ms.
    assert_eq!(
        first(&r.server_rx_trace),
        Some(3),
        "{:?}",
        r.server_rx_trace
    );
    // The Get reaches the server at 300 ms, its offer and data the client at 400 ms.
    let down = &r.clients[0].rx_trace;
    assert_eq!(first(down), Some(4), "{down:?}");
    assert_eq!(r.client.data_packets_retransmitted, 0);
    assert_eq!(r.server.data_packets_retransmitted, 0);
}

/// The client is done once its last file is verified: its goodbye and a CLOSE go out
/// together and it does not wait for the server's own CLOSE (a round trip more per job).
/// The server still hears the goodbye and ends the session normally, and a download's
/// `Verified` goes out before it.
#[test]
fn the_client_is_done_when_its_files_are_verified() {
    for download in [false, true] {
        let mut sc = long_fixed(15, 0.0);
        let file = vec![("f".into(), data(7, 2_000_000))];
        if download {
            sc.downloads = file;
        } else {
            sc.uploads = file;
        }
        let r = check(&sc);
        let end = r.clients[0].end_us;
        if !download {
            // The server's Verified takes 100 ms to reach the client.
            let after = end - r.server_verified_us;
            assert!(
                after <= 105_000,
                "done {after} µs after the server verified"
            );
        }
        assert_eq!(r.elapsed_us, end);
        assert_eq!(r.server_closed, vec![None], "download {download}");
        assert_eq!(r.server_heard_verified, download as u64);
    }
}

/// A job's tail, on a lossy path: with nothing new left to send, a retransmission lost
/// again, or a lost `Sent` or verdict, would each cost the whole job a round trip or a
/// probe timeout more. Retransmissions then go twice, and those two messages too. 10 MB at
/// a fixed 10 MB/s over 200 ms with 3 % loss each way, 16 runs: 1.72 s on average (1.99 s
/// with neither; 1.89 s without the retransmissions' second copies, 1.84 s without the
/// messages').
#[test]
fn a_lossy_tail_costs_no_extra_round_trips() {
    let mut total_ms = 0;
    for seed in 0..16u64 {
        let mut sc = long_fixed(40 + seed, 0.03);
        sc.uploads = vec![("f".into(), data(seed, 10_000_000))];
        total_ms += check(&sc).elapsed_us / 1000;
    }
    let mean = total_ms / 16;
    assert!(mean <= 1750, "{mean} ms on average");
}

/// A job's head, on a lossy path: a lost `Offer` or `Ready` held the sender at its eager
/// limit until a probe timeout. Said twice, each is lost only with both copies. 3 MB at a
/// fixed 10 MB/s over 200 ms with 10 % loss each way, 24 runs each way; from the first
/// byte in to 2.5 MB in (a lost handshake delays both), at most 2.0 s uploading, 0.4 s
/// downloading, before; 0.4 and 0.2 s after.
#[test]
fn a_lossy_head_costs_no_probe_timeout() {
    for (download, most) in [(false, 5), (true, 3)] {
        let mut gaps = Vec::new();
        for seed in 0..24u64 {
            let mut sc = long_fixed(400 + seed, 0.1);
            let f = vec![("f".into(), data(seed, 3_000_000))];
            if download {
                sc.downloads = f;
            } else {
                sc.uploads = f;
            }
            let r = check(&sc);
            let c = &r.clients[0];
            // 100 ms buckets of bytes taken in.
            let t = if download {
                &c.rx_trace
            } else {
                &c.server_rx_trace
            };
            let first = t.iter().position(|&x| x > 0).unwrap();
            let mut sum = 0;
            let most_in = t
                .iter()
                .position(|&x| {
                    sum += x;
                    sum >= 2_500_000
                })
                .unwrap();
            gaps.push(most_in - first);
        }
        assert!(
            gaps.iter().all(|&g| g <= most),
            "download {download}: 100 ms buckets {gaps:?}"
        );
    }
}

/// Clients that send at one instant take turns at a full queue. Two flows paced alike and
/// started together, 1.2 times the link between them, reach the bottleneck's queue at the
/// same instants: each must lose about what the other does (in a fixed order the first
/// took every free place and the second every drop).
#[test]
fn flows_at_one_full_queue_lose_alike() {
    let mut sc = Scenario::new(6);
    sc.forward = LinkParams {
        delay_us: 5_000,
        rate: Some(10_000_000),
        queue_bytes: 15_000,
        ..LinkParams::default()
    };
    sc.reverse = LinkParams {
        delay_us: 5_000,
        ..LinkParams::default()
    };
    sc.client.rate = RateConfig::Fixed(6_000_000);
    sc.uploads = vec![("a".into(), data(10, 6_000_000))];
    let mut b = sc.another_client(0);
    b.uploads = vec![("b".into(), data(11, 6_000_000))];
    sc.extra_clients.push(b);
    let r = check(&sc);
    assert_eq!(r.server_files.get("b").map(Vec::len), Some(6_000_000));
    let lost: Vec<f64> = r
        .clients
        .iter()
        .map(|c| c.stats.data_packets_retransmitted as f64 / c.stats.data_packets_sent as f64)
        .collect();
    assert!(lost.iter().all(|&l| l > 0.05), "retransmitted {lost:.3?}");
    assert!(
        lost[0] < 1.5 * lost[1] && lost[1] < 1.5 * lost[0],
        "retransmitted {lost:.3?}"
    );
}

/// The handshake finds the path's MTU: each hello is padded to the MTU it offers, and a
/// path that drops big datagrams (as a router drops an IP packet over its MTU with the
/// don't-fragment bit set) answers a smaller attempt one retransmission later.
#[test]
fn the_handshake_finds_what_the_path_carries() {
    // (client's limit, forward MTU, reverse MTU, one-way delay) -> agreed MTU.
    let cases = [
        (9000, None, None, 10_000, 9000),
        (9000, Some(1500), Some(1500), 10_000, 1500),
        (9000, Some(1420), None, 10_000, 1400),
        // The way back is narrower than the way out: the padded ServerHello proves it.
        (9000, None, Some(1500), 10_000, 1500),
        (1500, Some(1300), Some(1300), 10_000, 1280),
        // A long path: the first retransmission (200 ms) comes before the big attempt's
        // answer could, yet that answer still arrives first and wins.
        (9000, None, None, 125_000, 9000),
    ];
    for (i, (limit, fwd, rev, delay_us, expect)) in cases.into_iter().enumerate() {
        let mut sc = Scenario::new(500 + i as u64);
        sc.client.mtu = limit;
        sc.server.mtu = u16::MAX;
        sc.forward.mtu = fwd;
        sc.forward.delay_us = delay_us;
        sc.reverse.mtu = rev;
        sc.reverse.delay_us = delay_us;
        sc.uploads = vec![("up.bin".into(), data(i as u64, 300_000))];
        sc.downloads = vec![("down.bin".into(), data(50 + i as u64, 300_000))];
        let r = check(&sc);
        let own = &r.clients[0];
        assert_eq!(own.mtu, expect, "case {i}");
        // Each rung of the ladder that failed cost one retransmission interval: the k-th
        // attempt first goes out at 0, 200, 600, 1400 ms.
        let failed = [9000u16, 1500, 1400, 1280]
            .iter()
            .filter(|&&m| m > expect && m <= limit)
            .count();
        let budget = 2 * delay_us + [0, 200_000, 600_000, 1_400_000][failed] + 5_000;
        let connected = own.connected_us.expect("connected");
        assert!(
            connected <= budget,
            "case {i}: connected at {connected} µs, budget {budget}"
        );
        // Nothing the session sent after the handshake was too big for the path.
        assert_eq!(r.client.data_packets_retransmitted, 0, "case {i}");
    }
}

/// A server whose disk is slower than the network (40 Mbit/s behind a 2 MiB write queue, a
/// 100 Mbit/s path): its ACKs advertise the queue's room and the client keeps no more in
/// flight, so blocks are not sent only to be refused and sent again, and the upload runs at
/// the disk's rate.
#[test]
fn a_slow_disk_is_not_sent_more_than_it_takes() {
    let len = 16 << 20;
    let disk = sim::DiskParams {
        rate: 5_000_000,
        queue_bytes: 2 << 20,
    };
    let mut sc = Scenario::new(77);
    sc.client.rate = RateConfig::ADAPTIVE;
    sc.forward = LinkParams {
        delay_us: 10_000,
        rate: Some(12_500_000),
        queue_bytes: 250_000,
        ..LinkParams::default()
    };
    sc.reverse.delay_us = 10_000;
    sc.server_disk = Some(disk);
    sc.uploads = vec![("up.bin".into(), data(77, len))];
    let r = check(&sc);
    let blocks = r.server.data_packets_received;
    let refused = r.server.blocks_refused_by_sink;
    let secs = r.clients[0].end_us as f64 / 1e6;
    println!(
        "slow disk: {refused} of {blocks} blocks refused, {} retransmitted, {secs:.2} s ({:.1} Mbit/s)",
        r.client.data_packets_retransmitted,
        len as f64 * 8.0 / secs / 1e6
    );
    assert!(refused * 100 <= blocks, "{refused} of {blocks} refused");
    assert!(
        r.client.data_packets_retransmitted * 50 <= r.client.data_packets_sent,
        "{} of {} sent again",
        r.client.data_packets_retransmitted,
        r.client.data_packets_sent
    );
    // At the disk's rate: 16 MiB at 5 MB/s is 3.4 s (plus the handshake and the last RTTs).
    assert!(secs < 3.4 / 0.85, "{secs:.2} s");
}

/// Downloads from a server whose disk reads slower than the link: each block not read yet
/// is `NotReady` to the server's connection, which sends another file's blocks meanwhile,
/// and otherwise waits (no busy deadline, nothing failed, nothing retransmitted) until the
/// disk has read on. Two files read at once (each at the disk's rate, from its first read)
/// take as long as one: one file waiting does not hold up the other.
#[test]
fn a_slow_source_disk_is_waited_for() {
    let len = 4 << 20;
    let rate = 5_000_000;
    let mut sc = Scenario::new(78);
    sc.server.rate = RateConfig::ADAPTIVE;
    sc.forward.delay_us = 10_000;
    sc.reverse = LinkParams {
        delay_us: 10_000,
        rate: Some(12_500_000),
        queue_bytes: 250_000,
        ..LinkParams::default()
    };
    sc.server_read_rate = Some(rate);
    sc.downloads = vec![
        ("a.bin".into(), data(78, len)),
        ("b.bin".into(), data(79, len)),
    ];
    let r = check(&sc);
    let secs = r.clients[0].end_us as f64 / 1e6;
    let disk_secs = len as f64 / rate as f64;
    println!(
        "slow source: {secs:.2} s for {disk_secs:.2} s of reading each file, {} of {} sent again",
        r.server.data_packets_retransmitted, r.server.data_packets_sent
    );
    assert_eq!(
        r.server.data_packets_retransmitted, 0,
        "nothing lost, nothing sent again"
    );
    assert!(secs >= disk_secs, "{secs:.2} s: faster than the disk reads");
    assert!(
        secs < disk_secs + 0.5,
        "{secs:.2} s for {disk_secs:.2} s of reading each"
    );
}
