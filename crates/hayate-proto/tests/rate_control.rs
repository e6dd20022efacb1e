//! The adaptive rate controller on simulated paths: it must find the bottleneck, hold it with
//! a short queue, ignore random loss, follow a rate step-down, share a bottleneck fairly with
//! another transfer, and follow a receiver slower than the link.

use hayate_proto::cc::{AdaptiveParams, Policy, RateConfig, RememberedPath};
use hayate_proto::sim::{
    self, ClientSpec, CoDelParams, GilbertElliott, JitterDist, JitterParams, LinkParams,
    PolicerParams, RateStep, ReceiverParams, Scenario, TcpSpec,
};
use hayate_proto::wire::{block_size, AddrFamily};

const MBIT: u64 = 1_000_000 / 8;

/// File bytes per 1500-byte packet on the wire: the simulator's link counts whole packets.
fn payload_share() -> f64 {
    block_size(1500, AddrFamily::V4) as f64 / 1500.0
}

fn data(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 2654435761usize) >> 13) as u8)
        .collect()
}

/// A path like the WAN harness: `rate` bytes/s bottleneck, RTT, 1-BDP tail-drop buffer.
fn path(rate: u64, rtt_ms: u64, loss: f64, buffer_bdp: f64) -> (LinkParams, LinkParams) {
    let bdp = rate * rtt_ms / 1000;
    let fwd = LinkParams {
        delay_us: rtt_ms * 500,
        rate: Some(rate),
        queue_bytes: ((bdp as f64 * buffer_bdp) as u64).max(3_000),
        loss,
        ..LinkParams::default()
    };
    let rev = LinkParams {
        delay_us: rtt_ms * 500,
        loss,
        ..LinkParams::default()
    };
    (fwd, rev)
}

fn adaptive(sc: &mut Scenario) {
    sc.client.rate = RateConfig::ADAPTIVE;
    sc.server.rate = RateConfig::ADAPTIVE;
}

/// Mean goodput (bytes/s) at the server over 100 ms buckets [from, to), stopping before the
/// tail where the transfer winds down (the last bucket at half the peak or more).
fn mean_rate(r: &sim::SimResult, from_s: f64, to_s: f64) -> f64 {
    let t = &r.server_rx_trace;
    let peak = t.iter().copied().max().unwrap_or(0);
    let last_full = t.iter().rposition(|&b| b * 2 >= peak).unwrap_or(0);
    let (a, b) = ((from_s * 10.0) as usize, (to_s * 10.0) as usize);
    let b = b.min(last_full);
    assert!(
        b > a,
        "trace too short: {} buckets",
        r.server_rx_trace.len()
    );
    r.server_rx_trace[a..b].iter().sum::<u64>() as f64 / ((b - a) as f64 / 10.0)
}

/// Mean goodput once the transfer is under way: from 2 s to half a second before the end.
fn steady_rate(r: &sim::SimResult) -> f64 {
    let secs = r.server_rx_trace.len() as f64 / 10.0;
    mean_rate(r, 2.0, secs - 0.5)
}

/// The server's goodput per 100 ms, Mbit/s, for failure messages.
fn trace_mbit(r: &sim::SimResult) -> String {
    let t: Vec<String> = r
        .server_rx_trace
        .iter()
        .map(|b| format!("{:.0}", *b as f64 * 8e-5))
        .collect();
    t.join(" ")
}

/// Prints the steady goodput against `capacity` (bytes/s) under `label`, and asserts it is
/// at least `floor` of it (the trace in the failure message).
fn assert_steady(r: &sim::SimResult, capacity: f64, floor: f64, label: &str) {
    let steady = steady_rate(r);
    let (got, of) = (steady / 1.25e5, capacity / 1.25e5);
    eprintln!("{label}: {got:.1} of {of:.1} Mbit/s");
    assert!(
        steady >= floor * capacity,
        "{label}: {got:.1} of {of:.1} Mbit/s; trace {}",
        trace_mbit(r)
    );
}

fn run_upload(
    rate: u64,
    rtt_ms: u64,
    loss: f64,
    bdp: f64,
    bytes: usize,
    seed: u64,
) -> sim::SimResult {
    let mut sc = Scenario::new(seed);
    (sc.forward, sc.reverse) = path(rate, rtt_ms, loss, bdp);
    adaptive(&mut sc);
    sc.uploads = vec![("f".into(), data(bytes))];
    let r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.server_files["f"].len(), bytes);
    r
}

#[test]
fn converges_to_the_bottleneck_with_a_short_queue() {
    for (rtt, seed) in [(20, 1), (100, 2), (250, 3)] {
        let r = run_upload(100 * MBIT, rtt, 0.0, 1.0, 60_000_000, seed);
        let steady = steady_rate(&r);
        // Payload share of the wire; then 95 % of that.
        let capacity = 100.0 * MBIT as f64 * payload_share();
        assert!(
            steady >= 0.95 * capacity,
            "rtt {rtt}: {:.1} of {:.1} Mbit/s",
            steady / 1.25e5,
            capacity / 1.25e5
        );
        // Queueing: the smoothed RTT stays near the base.
        let base = rtt * 1000;
        assert!(
            r.client.srtt_us < base + base / 4 + 5_000,
            "rtt {rtt}: srtt {} µs",
            r.client.srtt_us
        );
        let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
        assert!(retx < 0.01, "rtt {rtt}: retransmitted {retx:.3}");
    }
}

/// From the first packet (handshake included) to 90 % of a 1 Gbit/s link: within 1 s plus
/// 10 round trips, the goal. Startup doubles from 32 Mbit/s, so this is the longest
/// climb the harness asks for.
#[test]
fn reaches_the_link_rate_within_a_second_and_ten_round_trips() {
    for (rtt, bytes, seed) in [(100, 200_000_000, 51), (250, 400_000_000, 52)] {
        let r = run_upload(1000 * MBIT, rtt, 0.0, 1.0, bytes, seed);
        let capacity = 1000.0 * MBIT as f64 * payload_share();
        let first = r
            .server_rx_trace
            .iter()
            .position(|&b| b as f64 * 10.0 >= 0.9 * capacity)
            .map(|i| (i as u64 + 1) * 100);
        let goal = 1000 + 10 * rtt;
        eprintln!("rtt {rtt}: 90 % after {first:?} ms, goal {goal} ms");
        assert!(
            first.is_some_and(|ms| ms <= goal),
            "rtt {rtt}: 90 % after {first:?} ms, goal {goal} ms; Mbit/s per 100 ms: {}",
            trace_mbit(&r)
        );
        // The benchmark's steady goodput counts from 2 s on: by then the climb is done. The
        // rate rises with what gets through, not once a round (the round's mean lags a rate
        // that doubles within it): stepping once a round, the in-flight cap held the climb to
        // 1.5 times per round trip, and 2-3 s carried 64 % of the link at 250 ms.
        let early = mean_rate(&r, 2.0, 3.0);
        assert!(
            early >= 0.85 * capacity,
            "rtt {rtt}: {:.0} of {:.0} Mbit/s over 2-3 s; Mbit/s per 100 ms: {}",
            early / 1.25e5,
            capacity / 1.25e5,
            trace_mbit(&r)
        );
    }
}

/// Startup's drain ends without leaving the link a quarter empty for a round trip: the RTT
/// samples that show its queue gone come a round trip after it went, and it paced at three
/// quarters of the link until then (at 250 ms, three 100 ms buckets at 75-94 %); it now
/// paces at the estimate once no more than a BDP is in flight.
#[test]
fn startups_drain_leaves_no_gap() {
    let r = run_upload(300 * MBIT, 250, 0.0, 1.0, 150_000_000, 54);
    let capacity = 300.0 * MBIT as f64 * payload_share();
    let t = &r.server_rx_trace;
    let t90 = t
        .iter()
        .position(|&b| b as f64 * 10.0 >= 0.9 * capacity)
        .expect("never reached 90 %");
    // From two buckets on (the climb's last round trip comes in bumps) for 2 s.
    let worst = t[t90 + 2..t90 + 22].iter().copied().min().unwrap() as f64 * 10.0;
    assert!(
        worst >= 0.97 * capacity,
        "worst 100 ms {:.0} of {:.0} Mbit/s; Mbit/s per 100 ms: {}",
        worst / 1.25e5,
        capacity / 1.25e5,
        trace_mbit(&r)
    );
}

/// A short path (10 ms): the queue target's 2 ms floor is a fifth of the RTT, and the probes
/// that reach it must not be taken for a big queue (that kept this path at 81 %). The queue
/// a probe leaves is drained gently (over 30 ms, not one round trip): draining it in one
/// round trip left the link 30 % under-filled for the round trip the drain's end waits for
/// (96.8-98.0 % here).
#[test]
fn a_short_path_is_kept_full() {
    for (loss, seed) in [(0.0, 41), (0.01, 42)] {
        let rate = 500 * MBIT;
        let r = run_upload(rate, 10, loss, 1.0, (rate * 6) as usize, seed);
        let capacity = rate as f64 * payload_share() * (1.0 - loss);
        assert_steady(&r, capacity, 0.985, &format!("loss {loss}"));
    }
}

#[test]
fn random_loss_is_treated_as_noise() {
    for (loss, seed) in [(0.001, 4), (0.01, 5), (0.03, 6), (0.05, 7)] {
        let r = run_upload(100 * MBIT, 100, loss, 1.0, 60_000_000, seed);
        let steady = steady_rate(&r);
        let capacity = 100.0 * MBIT as f64 * payload_share() * (1.0 - loss);
        let trace = trace_mbit(&r);
        assert!(
            steady >= 0.95 * capacity,
            "loss {loss}: {:.1} of {:.1} Mbit/s; trace {}",
            steady / 1.25e5,
            capacity / 1.25e5,
            trace
        );
        let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
        assert!(retx <= loss + 0.01, "loss {loss}: retransmitted {retx:.3}");
    }
}

#[test]
fn shallow_buffer_costs_little() {
    let r = run_upload(100 * MBIT, 100, 0.0, 0.1, 40_000_000, 8);
    let steady = steady_rate(&r);
    let capacity = 100.0 * MBIT as f64 * payload_share();
    assert!(steady >= 0.9 * capacity, "{:.1} Mbit/s", steady / 1.25e5);
    let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
    assert!(retx < 0.03, "retransmitted {retx:.3}");
}

/// A tenth of a BDP on a 10 ms path is 1 ms of buffer, under the queue the grow phase waits
/// for: the delay never rises, the buffer just overflows. Those losses are not random: the
/// controller must stop growing at them, not scale its deliveries back up by them (that made
/// every delivery read as the rate sent, and the sender ran at 1.4 times the link, 28 % of
/// what it sent retransmitted). Nor may it keep the buffer full, losing what random loss
/// does not explain: it takes the depth the buffer overflowed at for the buffer's and
/// keeps the queue under it (before, 1.6 % was retransmitted here without random loss,
/// 0.8 % since; 1.8 % with 1 % random loss).
#[test]
fn a_buffer_shorter_than_the_queue_target_is_not_overrun() {
    short_buffer_upload(10, 6, [(0.0, 71), (0.01, 72)], 0.01);
}

/// A 300 Mbit/s upload of `secs` over an `rtt_ms` path with a 0.1-BDP buffer, with each
/// (random loss, seed): it keeps 95 % of the link and retransmits at most the random loss
/// plus `allowance`.
fn short_buffer_upload(rtt_ms: u64, secs: u64, runs: [(f64, u64); 2], allowance: f64) {
    for (loss, seed) in runs {
        let rate = 300 * MBIT;
        let r = run_upload(rate, rtt_ms, loss, 0.1, (rate * secs) as usize, seed);
        let steady = steady_rate(&r);
        let capacity = rate as f64 * payload_share() * (1.0 - loss);
        let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
        eprintln!(
            "{rtt_ms} ms, loss {loss}: {:.1} of {:.1} Mbit/s, retransmitted {:.2} %, queue drops {}",
            steady / 1.25e5,
            capacity / 1.25e5,
            retx * 100.0,
            r.fwd_queue_drops
        );
        assert!(
            retx <= loss + allowance,
            "loss {loss}: retransmitted {retx:.4}"
        );
        assert!(
            steady >= 0.95 * capacity,
            "loss {loss}: {:.1} of {:.1} Mbit/s; trace {}",
            steady / 1.25e5,
            capacity / 1.25e5,
            trace_mbit(&r)
        );
    }
}

/// A long path with a tenth of a BDP of buffer (10 ms at 100 ms): the queue shows over the
/// target before the buffer overflows, but what was sent before the yield took effect (a
/// round trip of it, the increment doubled meanwhile) overflows it. The depth it overflowed
/// at is learnt from the losses that come back while the flow yields, too (before, 1.28 %
/// was retransmitted here without random loss; 0.44 % since, 1.58 % with 1 % loss).
#[test]
fn a_short_buffer_on_a_long_path_is_not_overrun() {
    short_buffer_upload(100, 16, [(0.0, 73), (0.01, 74)], 0.006);
}

/// Startup on a short buffer (1 Gbit/s, 100 ms, 10 ms of buffer, no random loss): the
/// queue shows a round trip after the rate passed the bottleneck, and the search, doubling
/// meanwhile, had up to half a BDP more in flight than the path holds. Holding what is in
/// flight from the first signs of its own queue, it loses only what was already on its way
/// (7.1 MB before, 4.2 MB since).
#[test]
fn startup_holds_at_its_own_queue_on_a_short_buffer() {
    let rate = 1000 * MBIT;
    let mut sc = Scenario::new(77);
    (sc.forward, sc.reverse) = path(rate, 100, 0.0, 0.1);
    adaptive(&mut sc);
    sc.cc_trace = true;
    let bytes = 150_000_000;
    sc.uploads = vec![("f".into(), data(bytes))];
    let r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.server_files["f"].len(), bytes);
    // What startup lost is reported by the time its drain ends.
    let lost: u64 = r.clients[0]
        .cc_trace
        .iter()
        .take_while(|row| row.state != "probe")
        .map(|row| row.feedback.lost_bytes)
        .sum();
    eprintln!("startup lost {:.2} MB", lost as f64 / 1e6);
    assert!(lost <= 5_000_000, "startup lost {lost} bytes");
}

/// The same path, 1 % random loss, and a host that stalls the path for 20-30 ms every few
/// hundred ms. The ACKs a stall held come back together, the first ones late: single RTT
/// samples read a queue of 20-30 ms on a 10 ms buffer. Taken for the buffer's depth, they
/// made it read deep again, and growing overflowed it again and again (the first of these
/// retransmitted 2.07 %; 1.49-1.51 % since only a queue that stood counts).
#[test]
fn host_stalls_do_not_make_a_short_buffer_read_deep() {
    for (stall, seed) in [((500, 20, 4), 75), ((300, 30, 3), 76)] {
        let rate = 300 * MBIT;
        let mut sc = Scenario::new(seed);
        (sc.forward, sc.reverse) = path(rate, 100, 0.01, 0.1);
        (sc.forward.stall_every_us, sc.forward.stall_us) = (stall.0 * 1000, stall.1 * 1000);
        sc.forward.stall_release_speedup = stall.2;
        adaptive(&mut sc);
        let bytes = (rate * 16) as usize;
        sc.uploads = vec![("f".into(), data(bytes))];
        let r = sim::run(&sc);
        assert!(r.ok, "{:?}", r.error);
        assert_eq!(r.server_files["f"].len(), bytes);
        let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
        eprintln!(
            "stalls {stall:?}: retransmitted {:.2} %, queue drops {}",
            retx * 100.0,
            r.fwd_queue_drops
        );
        assert!(retx <= 0.016, "stalls {stall:?}: retransmitted {retx:.4}");
    }
}

/// `secs` of data at `rate` over an `rtt_ms`, 1-BDP path whose forward link stalls: (every
/// ms, for ms, released at n× the pace; 0 = all at once).
fn stalled_upload(
    rate: u64,
    rtt_ms: u64,
    loss: f64,
    (every_ms, stall_ms, speedup): (u64, u64, u64),
    secs: u64,
    seed: u64,
) -> sim::SimResult {
    let mut sc = Scenario::new(seed);
    (sc.forward, sc.reverse) = path(rate, rtt_ms, loss, 1.0);
    sc.forward.stall_every_us = every_ms * 1000;
    sc.forward.stall_us = stall_ms * 1000;
    sc.forward.stall_release_speedup = speedup;
    adaptive(&mut sc);
    sc.uploads = vec![("f".into(), data((rate * secs) as usize))];
    let r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    r
}

/// On a short path a stall of 20 ms is two round trips: the first ACK after it shows a queue
/// and a delivery rate over the stall, and a round may hold little else. A share read off
/// that cut a 1 Gbit/s flow to 22 Mbit/s on the harness, and it took seconds to grow back.
#[test]
fn a_stall_on_a_short_path_is_not_read_as_a_share() {
    let rate = 500 * MBIT;
    let r = stalled_upload(rate, 10, 0.0, (250, 20, 2), 4, 81);
    assert_steady(&r, rate as f64 * payload_share(), 0.8, "20 ms stalls");
}

/// A busy host (a descheduled VM, emulator or router) holds the path for tens of ms now and
/// then and lets the backlog go at once: the delay jumps and falls back within the stall,
/// unlike a queue the flow builds. Those spikes must not be taken for congestion.
#[test]
fn host_stalls_are_not_congestion() {
    for (rate_mbit, stall_ms, seed) in [(300, 30, 21), (1000, 40, 23)] {
        let rate = rate_mbit * MBIT;
        let r = stalled_upload(rate, 100, 0.0, (500, stall_ms, 0), 12, seed);
        let steady = steady_rate(&r);
        let capacity = rate as f64 * payload_share();
        let trace = trace_mbit(&r);
        assert!(
            steady >= 0.9 * capacity,
            "{rate_mbit} Mbit/s, {stall_ms} ms stalls: {:.1} of {:.1} Mbit/s; trace {}",
            steady / 1.25e5,
            capacity / 1.25e5,
            trace
        );
    }
}

/// A 250 ms path that stalls now and then (20 ms every 500 ms, the backlog let go at 4
/// times the rate): a stall in startup's last rounds must not set the estimate it leaves
/// with. What arrived over the stall, and over the gap in sending that the flight cap made
/// of it a round trip later, read 0.55-0.85 of the link, and growing back from there took
/// 3 s: these runs at 91.2-94.7 % of what the link carries (98.9-99.7 % with what arrives
/// once startup's queue stands, and the sender's own gaps left out; the run with 3 % loss
/// at 95.9 % with the first alone).
#[test]
fn stalls_on_a_long_path_are_not_read_as_shares() {
    for (rate_mbit, loss, secs, seed) in [
        (300, 0.0, 12, 93),
        (1000, 0.0, 8, 1),
        (1000, 0.0, 8, 2),
        (1000, 0.03, 8, 2),
    ] {
        let rate = rate_mbit * MBIT;
        let r = stalled_upload(rate, 250, loss, (500, 20, 4), secs, seed);
        let capacity = rate as f64 * payload_share() * (1.0 - loss);
        let label = format!("{rate_mbit} Mbit/s, loss {loss}, seed {seed}");
        assert_steady(&r, capacity, 0.97, &label);
    }
}

/// The stalls of a real harness or VM are short and frequent, and the backlog goes out at
/// CPU speed, in order: for a few ms the receiver sees data come in at several times the link
/// rate. Startup must not take such a burst for the bottleneck: leaving at twice the link
/// overfills a 1-BDP buffer for a second and costs a large share of the file again.
#[test]
fn bursty_host_stalls_do_not_fool_startup() {
    for (stall_ms, every_ms, loss, seed) in
        [(2, 20, 0.0, 31), (5, 50, 0.001, 32), (10, 100, 0.01, 33)]
    {
        let rate = 500 * MBIT;
        let r = stalled_upload(rate, 100, loss, (every_ms, stall_ms, 10), 8, seed);
        let steady = steady_rate(&r);
        let capacity = rate as f64 * payload_share() * (1.0 - loss);
        let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
        let trace = trace_mbit(&r);
        eprintln!(
            "{stall_ms} ms every {every_ms} ms, loss {loss}: {:.1} of {:.1} Mbit/s, retransmitted {retx:.4}, queue drops {}; trace {trace}",
            steady / 1.25e5,
            capacity / 1.25e5,
            r.fwd_queue_drops
        );
        assert!(
            retx <= loss + 0.01,
            "{stall_ms} ms stalls every {every_ms} ms: retransmitted {retx:.4}; trace {trace}"
        );
        assert!(
            steady >= 0.9 * capacity,
            "{stall_ms} ms stalls every {every_ms} ms: {:.1} of {:.1} Mbit/s; trace {trace}",
            steady / 1.25e5,
            capacity / 1.25e5
        );
    }
}

/// The sender's own host stalls (a 2-core VM that also runs the receiver and the path's
/// emulator): for 3 ms every 20 ms it neither sends nor reads ACKs, then catches up. The
/// queue its catch-up builds is found and drained like any other, but the drain must stop
/// when the queue is gone: draining on to the end of a round idled the link after every
/// stall (90.8 % of the link here; 94.8 % with the drain that stops).
#[test]
fn a_stalling_sender_keeps_the_link_full() {
    for seed in [61, 62] {
        let retx = stalling_sender(seed, 1.0, 0.93);
        assert!(retx < 0.01, "seed {seed}: retransmitted {retx:.3}");
    }
}

/// A 300 Mbit/s, 10 ms path with a `buffer_bdp` buffer, the sender held 3 ms every 20 ms:
/// checks the steady goodput is at least `share` of the link; returns the share of data
/// packets retransmitted.
fn stalling_sender(seed: u64, buffer_bdp: f64, share: f64) -> f64 {
    let stalls = |sc: &mut Scenario| {
        sc.client_stall_every_us = 20_000;
        sc.client_stall_us = 3_000;
    };
    busy_sender(seed, (300, 10, buffer_bdp), stalls, share)
}

/// An upload on a `(Mbit/s, RTT ms, buffer BDP)` path from a sender whose host `host`
/// makes busy: checks the steady goodput is at least `share` of the link; returns the share
/// of data packets retransmitted.
fn busy_sender(
    seed: u64,
    (mbit, rtt_ms, buffer_bdp): (u64, u64, f64),
    host: impl FnOnce(&mut Scenario),
    share: f64,
) -> f64 {
    let rate = mbit * MBIT;
    let mut sc = Scenario::new(seed);
    (sc.forward, sc.reverse) = path(rate, rtt_ms, 0.0, buffer_bdp);
    host(&mut sc);
    adaptive(&mut sc);
    sc.uploads = vec![("f".into(), data((rate * 6) as usize))];
    let r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    let steady = steady_rate(&r);
    let capacity = rate as f64 * payload_share();
    let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
    eprintln!(
        "seed {seed}, {buffer_bdp} BDP: {:.1} of {:.1} Mbit/s, retransmitted {:.2} %",
        steady / 1.25e5,
        capacity / 1.25e5,
        retx * 100.0
    );
    assert!(
        steady >= share * capacity,
        "seed {seed}: {:.1} of {:.1} Mbit/s; trace {}",
        steady / 1.25e5,
        capacity / 1.25e5,
        trace_mbit(&r)
    );
    retx
}

/// The sender's host wakes it late every time it waits (0-4 ms, 2 ms on average: its cores
/// busy with a build), for the pacer's next burst as for an ACK. The pacer's burst after a
/// wake-up must cover the lateness it has seen: with a credit of 1 ms the sender got under
/// half its pace out, read that as the path's rate, and crawled (a 30 MB copy on a loopback
/// took 6 s during a build, against 0.08 s on a quiet host).
#[test]
fn a_sender_woken_late_every_time_keeps_the_link_full() {
    for seed in [71, 72] {
        let busy = |sc: &mut Scenario| sc.client_wake_late_us = 2_000;
        let retx = busy_sender(seed, (100, 20, 1.0), busy, 0.9);
        assert!(retx < 0.01, "seed {seed}: retransmitted {retx:.3}");
    }
}

/// A busy VM holds the sender now and then: the feedback says so (the delivery rate of what
/// it sent meanwhile is the sender's, not the path's), and only then.
#[test]
fn feedback_tells_of_the_senders_stalls() {
    for (stall_us, seed) in [(75_000, 1), (0, 1)] {
        let rate = 300 * MBIT;
        let mut sc = Scenario::new(seed);
        (sc.forward, sc.reverse) = path(rate, 50, 0.0, 1.0);
        sc.client_stall_every_us = 500_000;
        sc.client_stall_us = stall_us;
        sc.cc_trace = true;
        adaptive(&mut sc);
        sc.uploads = vec![("f".into(), data((rate * 3) as usize))];
        let r = sim::run(&sc);
        assert!(r.ok, "{:?}", r.error);
        let told: u64 = r.clients[0]
            .cc_trace
            .iter()
            .map(|row| row.feedback.send_stall_bytes)
            .sum();
        if stall_us > 0 {
            // Most of every stall's sending time, at the pacing rate.
            assert!(told as f64 > 0.5 * rate as f64 * 0.075 * 3.0, "told {told}");
        } else {
            assert!(told < rate / 100, "told {told} without stalls");
        }
    }
}

#[test]
fn follows_a_rate_step_down() {
    let mut sc = Scenario::new(9);
    (sc.forward, sc.reverse) = path(100 * MBIT, 50, 0.0, 1.0);
    adaptive(&mut sc);
    sc.forward_steps = vec![RateStep {
        at_us: 3_000_000,
        rate: Some(30 * MBIT),
    }];
    sc.uploads = vec![("f".into(), data(60_000_000))];
    let r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    // Within ~1 s (20 RTT) the delivered rate is the new bottleneck, and the queue drained.
    let after = r.server_rx_trace[40..60].iter().sum::<u64>() as f64 / 2.0;
    let capacity = 30.0 * MBIT as f64 * payload_share();
    assert!(
        after >= 0.9 * capacity,
        "{:.1} Mbit/s after the step",
        after / 1.25e5
    );
    let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
    assert!(retx < 0.05, "retransmitted {retx:.3}");
}

#[test]
fn cap_and_floor_are_respected() {
    let mut sc = Scenario::new(10);
    (sc.forward, sc.reverse) = path(100 * MBIT, 20, 0.0, 1.0);
    sc.client.rate = RateConfig::Adaptive {
        max: Some(20 * MBIT),
        min: 0,
        policy: Policy::Fair,
    };
    sc.uploads = vec![("f".into(), data(10_000_000))];
    let r = sim::run(&sc);
    assert!(r.ok);
    let secs = r.server_rx_trace.len() as f64 / 10.0;
    let steady = mean_rate(&r, 1.0, secs - 0.3);
    assert!(
        steady <= 20.5 * MBIT as f64 && steady >= 18.0 * MBIT as f64,
        "{:.1}",
        steady / 1.25e5
    );
}

/// Jain's fairness index of some rates: 1 when equal, 1/n when one takes everything.
fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    sum * sum / (x.len() as f64 * sq)
}

/// Mean of a 100 ms trace over buckets [a, b), bytes/s.
fn mean_of(trace: &[u64], a: usize, b: usize) -> f64 {
    let b = b.min(trace.len());
    let a = a.min(b);
    trace[a..b].iter().sum::<u64>() as f64 / ((b - a).max(1) as f64 / 10.0)
}

fn mbit(bytes_per_s: f64) -> f64 {
    bytes_per_s / 1.25e5
}

/// The last 100 ms bucket before the first of two flows winds down.
fn both_running_until(a: &[u64], b: &[u64]) -> usize {
    let last = |t: &[u64]| t.iter().rposition(|&x| x > 0).unwrap_or(0);
    last(a).min(last(b)).saturating_sub(5)
}

/// Hosts that neither stall nor wake their senders late.
fn quiet(_: &mut Scenario) {}

/// Two uploads of `mb` MB through one `rate_mbit` Mbit/s, `rtt_ms`, 1-BDP bottleneck, the
/// second `after_s` seconds after the first. From 2 s after the second starts until the
/// first winds down they share the link: fairly (Jain's index of their means ≥ 0.95, and of
/// every second's ≥ 0.9: a newcomer is not left at a sliver for long; the controller before
/// the newcomer's startup and drain fixes gave 0.67–0.89 here), and together they still fill
/// it (≥ 90 %).
fn two_flows(rate_mbit: u64, rtt_ms: u64, loss: f64, after_s: u64, mb: usize, seed: u64) {
    let fairness = two_flows_at(
        rate_mbit, rtt_ms, loss, 1.0, after_s, 0, mb, seed, 0.9, quiet,
    );
    assert!(fairness >= 0.95, "Jain {fairness:.3}");
}

/// Two flows, the second `after_s` s and `offset_us` µs into the first, behind a buffer of
/// `buffer_bdp` BDPs, on hosts `hosts` describes (how they stall, or wake the senders);
/// checks they both ran long enough, used the link and stayed close to even every second
/// (Jain at least `worst_floor`); returns the Jain index of their mean rates.
#[allow(clippy::too_many_arguments)]
fn two_flows_at(
    rate_mbit: u64,
    rtt_ms: u64,
    loss: f64,
    buffer_bdp: f64,
    after_s: u64,
    offset_us: u64,
    mb: usize,
    seed: u64,
    worst_floor: f64,
    hosts: impl Fn(&mut Scenario),
) -> f64 {
    let mut sc = Scenario::new(seed);
    (sc.forward, sc.reverse) = path(rate_mbit * MBIT, rtt_ms, loss, buffer_bdp);
    adaptive(&mut sc);
    hosts(&mut sc);
    let size = mb * 1_000_000;
    sc.uploads = vec![("a".into(), data(size))];
    let mut second = sc.another_client(after_s * 1_000_000 + offset_us);
    second.uploads = vec![("b".into(), data(size))];
    sc.extra_clients.push(second);
    let r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.server_files["a"].len(), size);
    assert_eq!(r.server_files["b"].len(), size);

    let (a, b) = (&r.clients[0].server_rx_trace, &r.clients[1].server_rx_trace);
    let from = (after_s as usize + 2) * 10;
    let until = both_running_until(a, b);
    let rates = [
        mean_of(a, from, until.max(from + 1)),
        mean_of(b, from, until.max(from + 1)),
    ];
    let fairness = jain(&rates);
    let worst_second = (from..until.saturating_sub(9))
        .step_by(10)
        .map(|s| jain(&[mean_of(a, s, s + 10), mean_of(b, s, s + 10)]))
        .fold(1.0f64, f64::min);
    let capacity = (rate_mbit * MBIT) as f64 * payload_share() * (1.0 - loss);
    let util = (rates[0] + rates[1]) / capacity;
    let retx: Vec<f64> = r
        .clients
        .iter()
        .map(|c| c.stats.data_packets_retransmitted as f64 / c.stats.data_packets_sent as f64)
        .collect();
    let show = |t: &[u64]| {
        t.chunks(5)
            .map(|x| format!("{:.0}", mbit(x.iter().sum::<u64>() as f64 * 2.0)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let report = format!(
        "{rate_mbit} Mbit/s, {rtt_ms} ms, loss {loss}: {:.1} + {:.1} Mbit/s over {:.1}..{:.1} s: \
         Jain {fairness:.3} (worst second {worst_second:.3}), utilisation {:.1} %, \
         retransmitted {:.2} % / {:.2} %, srtt {} / {} µs\n a: {}\n b: {}",
        mbit(rates[0]),
        mbit(rates[1]),
        from as f64 / 10.0,
        until as f64 / 10.0,
        util * 100.0,
        retx[0] * 100.0,
        retx[1] * 100.0,
        r.clients[0].stats.srtt_us,
        r.clients[1].stats.srtt_us,
        show(a),
        show(b),
    );
    eprintln!("{report}");
    assert!(until >= from + 30, "a flow ended at {until}: {report}");
    assert!(worst_second >= worst_floor, "{report}");
    assert!(util >= 0.90, "{report}");
    for x in retx {
        assert!(x <= loss + 0.02, "{report}");
    }
    fairness
}

#[test]
fn two_flows_share_the_link_fairly() {
    two_flows(100, 50, 0.0, 2, 80, 11);
}

#[test]
fn two_flows_share_a_lossy_link_fairly() {
    two_flows(100, 50, 0.01, 2, 80, 12);
}

/// A short path: the first flow's probe queue (3 ms) is a third of a round trip there, and a
/// newcomer that took it for its own overshoot left its search at a sixth of the link
/// (Jain 0.933 at the first offset); equal increments then took tens of seconds to even that
/// out. Where in the first flow's probe cycle (a few round trips) the newcomer starts moves a
/// single pair's index by a few hundredths either way: three starts, and their mean.
#[test]
fn two_flows_share_a_short_path_fairly() {
    let js: Vec<f64> = [0, 37_000, 74_000]
        .iter()
        .map(|&off| two_flows_at(300, 10, 0.0, 1.0, 2, off, 200, 14, 0.9, quiet))
        .collect();
    let mean = js.iter().sum::<f64>() / js.len() as f64;
    assert!(mean >= 0.95, "Jain {js:.3?}");
    assert!(js.iter().all(|&j| j >= 0.9), "Jain {js:.3?}");
}

/// The same path with a tenth of a BDP of buffer (1 ms): growing overflows it before any
/// queue shows over the target. Until the controller took the depth it overflowed at for
/// the buffer's, the first flow kept it full (1.6 % of what it sent lost), and the
/// newcomer, whose datagrams met a full buffer, was held at 12 Mbit/s (Jain 0.54, 11-14 %
/// retransmitted). Now 0.94-0.99 over the 6-9 s both run (three start offsets), but the
/// shares even out slowly and not always: the worst second reads 0.80-0.90, and which
/// flow leads moves with small timing changes (a floor of 0.7 here; issue 42).
#[test]
fn two_flows_share_a_shallow_buffer_fairly() {
    let js: Vec<f64> = [0, 37_000, 74_000]
        .iter()
        .map(|&off| two_flows_at(300, 10, 0.0, 0.1, 2, off, 260, 15, 0.7, quiet))
        .collect();
    assert!(js.iter().all(|&j| j >= 0.9), "Jain {js:.3?}");
}

/// A newcomer's search overflows a buffer too short for the queue at which flows yield to
/// it on a deep one (`two_flows_share_the_link_fairly`): the flow already there must take
/// those losses for what they are (its own pace lost nothing before) and make room, not
/// read them as random loss and leave the newcomer at what its search found (25-30 of 95
/// Mbit/s, Jain 0.815-0.886). Past that, the two flows' shares even out only by the cycles of
/// yields and equal increments, each about a second here: cutting to 0.95 when shares
/// move, the newcomer still had 36 Mbit/s to the first flow's 58 after 13 s (Jain
/// 0.943-0.960, mean 0.952); the 0.98 takes the deeper `converge_gain`.
#[test]
fn a_newcomer_is_let_in_on_a_short_buffer() {
    let js: Vec<f64> = [(0, 16), (37_000, 17), (74_000, 18), (111_000, 19)]
        .iter()
        .map(|&(off, seed)| two_flows_at(100, 100, 0.0, 0.1, 3, off, 150, seed, 0.8, quiet))
        .collect();
    let mean = js.iter().sum::<f64>() / js.len() as f64;
    assert!(mean >= 0.98, "Jain {js:.3?}");
    assert!(js.iter().all(|&j| j >= 0.95), "Jain {js:.3?}");
}

/// A newcomer on a long, lossy path behind a flow that fills it: the queue that flow keeps
/// while the newcomer's search adds to it stands all round, and its data waits there too,
/// so startup's in-flight cap counts it (capped by the base RTT alone the newcomer could
/// not double, and its search ended at 30-50 of 300 Mbit/s); and one random loss among a
/// round's first datagrams is not taken for the overshoot that ends a search (it ended one
/// at its first 30 Mbit/s). Before: Jain 0.985, 0.837, 0.978 for these starts.
#[test]
fn a_newcomer_gets_in_on_a_long_lossy_path() {
    for (off, seed) in [(37_000, 201), (74_000, 202), (111_000, 203)] {
        let j = two_flows_at(300, 100, 0.01, 1.0, 5, off, 469, seed, 0.8, quiet);
        assert!(j >= 0.95, "offset {off} µs: Jain {j:.3}");
    }
}

/// A newcomer that starts as the first flow's probe begins searches under that flow's queue
/// for rounds while its own share of it doubles. It leaves its search with what its last
/// round trip under the queue carried, not the mean since the queue began (that left it at
/// 75 Mbit/s where the round trip carried 111, and the shares evened out only slowly:
/// Jain 0.924 for both of these starts).
#[test]
fn a_newcomer_searching_under_a_probe_keeps_its_latest_share() {
    for seed in [13, 14] {
        let j = two_flows_at(300, 100, 0.0, 1.0, 5, 950_000, 400, seed, 0.8, quiet);
        assert!(j >= 0.96, "seed {seed}: Jain {j:.3}");
    }
}

/// A newcomer on a 250 ms path that starts while the first flow's probe raises the queue
/// within rounds: its flight meets startup's cap and waits, and the gap comes back a round
/// trip later as a dip in its deliveries. Its cap is sized on the most a quarter round
/// carried in the last round trip, so the dip does not shrink it (sized on the latest
/// quarter round, each dip made the next gap longer: its search ended at 76 Mbit/s where
/// its last rounds carried 107-144, and these starts read Jain 0.897 and 0.844).
#[test]
fn a_newcomer_whose_flight_waits_on_a_long_path_keeps_its_cap() {
    for off in [500_000, 800_000] {
        let j = two_flows_at(300, 250, 0.0, 1.0, 5, off, 800, 31, 0.5, quiet);
        assert!(j >= 0.92, "offset {off} µs: Jain {j:.3}");
    }
}

/// The shape of `bench/wan --share`: a long path, the second flow 5 s into the first.
#[test]
fn two_flows_share_a_long_path_fairly() {
    two_flows(300, 100, 0.0, 5, 400, 13);
}

/// Two flows whose senders' hosts stall (each held 20 ms about every 200 ms, as on the
/// 2-core harness, where the emulator, both senders and the receiver share the cores):
/// Jain's index of their mean rates while both run, the second 5 s and `offset_us` in.
fn two_stalling_flows(offset_us: u64, seed: u64) -> f64 {
    let mut sc = Scenario::new(seed);
    (sc.forward, sc.reverse) = path(100 * MBIT, 50, 0.0, 1.0);
    adaptive(&mut sc);
    sc.client_stall_every_us = 200_000;
    sc.client_stall_us = 20_000;
    let size = 190_000_000;
    sc.uploads = vec![("a".into(), data(size))];
    let mut second = sc.another_client(5_000_000 + offset_us);
    second.uploads = vec![("b".into(), data(size))];
    sc.extra_clients.push(second);
    let r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    let (a, b) = (&r.clients[0].server_rx_trace, &r.clients[1].server_rx_trace);
    let until = both_running_until(a, b);
    assert!(until >= 170, "a flow ended at {until}");
    let rates = [mean_of(a, 70, until), mean_of(b, 70, until)];
    let j = jain(&rates);
    eprintln!(
        "stalling senders, offset {offset_us}: {:.1} + {:.1} Mbit/s, Jain {j:.3}",
        mbit(rates[0]),
        mbit(rates[1])
    );
    j
}

/// Stalling senders must not push shares apart as they once did. A share read only off the
/// deliveries taken while the queue stood came out low for the smaller flow at every yield
/// (Jain 0.58-0.70 here). Then the pacer made up for each stall (up to 10 ms, at 1.25 times
/// the rate): those bursts into a full link built queues that both flows yielded to, the
/// smaller one reading its share low while the larger one's burst went through, and the
/// shares drifted apart (0.59-0.97 by start, mean 0.81; most yields at Up(1)-Up(3) where
/// steady senders yield at Up(5)-Up(6)). Now the pacer does not make a stall up: 0.976-1.000,
/// issue 42's 0.98 on average.
#[test]
fn two_flows_behind_stalling_senders_stay_even() {
    let js: Vec<f64> = [
        (0, 41),
        (37_000, 42),
        (74_000, 43),
        (111_000, 44),
        (0, 51),
        (37_000, 52),
        (74_000, 53),
        (111_000, 54),
    ]
    .iter()
    .map(|&(off, seed)| two_stalling_flows(off, seed))
    .collect();
    let mean = js.iter().sum::<f64>() / js.len() as f64;
    assert!(mean >= 0.98, "Jain {js:.3?}");
    assert!(js.iter().all(|&j| j >= 0.95), "Jain {js:.3?}");
}

/// Both senders' hosts wake them 0-8 ms late every time they wait (for the pacer's next
/// datagram as for an ACK): each reads the ACKs that came in meanwhile at once. The delay
/// spread that raises the queue target must be measured by when each acknowledged packet
/// was sent, not by when its ACK was read less its RTT: that put the samples of a batch out
/// of line, the spread grew with a flow's own rate (2 ms at 60 Mbit/s, 4-6 ms at 230), and
/// the larger flow, with the higher target, yielded later and grew back sooner (Jain
/// 0.755 at the first start here, 220 Mbit/s to 60). Now 0.982, 0.937, 0.999: a burst
/// after a late wake-up still queues behind itself, more for the larger flow (issue 42).
#[test]
fn two_flows_behind_senders_woken_late_stay_even() {
    let late = |sc: &mut Scenario| sc.client_wake_late_us = 4_000;
    let js: Vec<f64> = [(0, 21), (37_000, 22), (74_000, 23)]
        .iter()
        .map(|&(off, seed)| two_flows_at(300, 50, 0.0, 1.0, 5, off, 400, seed, 0.8, late))
        .collect();
    let mean = js.iter().sum::<f64>() / js.len() as f64;
    assert!(mean >= 0.96, "Jain {js:.3?}");
    assert!(js.iter().all(|&j| j >= 0.9), "Jain {js:.3?}");
}

/// The server takes datagrams in at `rx_rate` bytes/s (a slow disk), behind a socket buffer
/// of `buffer` bytes whose overflows the kernel counts: the sender must follow the receiver,
/// not the link, and not pour datagrams into the full buffer.
fn slow_receiver(rx_rate: u64, buffer: u64, seed: u64) -> (f64, f64) {
    let mut sc = Scenario::new(seed);
    (sc.forward, sc.reverse) = path(100 * MBIT, 50, 0.0, 1.0);
    adaptive(&mut sc);
    sc.server_receiver = Some(ReceiverParams {
        rate: rx_rate,
        buffer_bytes: buffer,
        stall_every_us: 0,
        stall_us: 0,
        catch_up: 0,
    });
    sc.uploads = vec![("f".into(), data(30_000_000))];
    let r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    let steady = steady_rate(&r);
    let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
    let trace: Vec<String> = r
        .server_rx_trace
        .chunks(5)
        .map(|x| format!("{:.0}", mbit(x.iter().sum::<u64>() as f64 * 2.0)))
        .collect();
    eprintln!(
        "receiver {:.0} Mbit/s, buffer {} KB: {:.1} Mbit/s steady, retransmitted {:.2} %, \
         {} receiver drops, srtt {} µs\n {}",
        mbit(rx_rate as f64),
        buffer / 1000,
        mbit(steady),
        retx * 100.0,
        r.server_os_drops,
        r.client.srtt_us,
        trace.join(" ")
    );
    (steady, retx)
}

/// What a short receive buffer loses to startup's overshoot swings with the timing of the
/// first round trips: over receivers of 34-46 Mbit/s one run lost 3.3-6.8 %, a run the
/// next packet's timing moved from 4.6 to 5.5 %. Their mean is what tells.
#[test]
fn follows_a_receiver_slower_than_the_link() {
    // 34-46 Mbit/s of datagrams on a 100 Mbit/s path; what arrives of it is payload.
    let mut retx_sum = 0.0;
    let rates = [34, 36, 38, 40, 42, 44, 46];
    for (i, r) in rates.iter().enumerate() {
        let rx = r * MBIT;
        let payload = mbit(rx as f64) * payload_share();
        let buffers: &[u64] = if *r == 40 {
            &[256_000, 4_000_000]
        } else {
            &[256_000]
        };
        for &buffer in buffers {
            let (steady, retx) = slow_receiver(rx, buffer, 21 + i as u64);
            assert!(
                mbit(steady) >= 0.9 * payload && mbit(steady) <= 1.02 * payload,
                "{r} Mbit/s, buffer {buffer}: {:.1} of {payload:.1} Mbit/s",
                mbit(steady)
            );
            if buffer == 256_000 {
                retx_sum += retx;
                assert!(retx < 0.08, "{r} Mbit/s: retransmitted {retx:.3}");
            } else {
                assert!(retx < 0.01, "buffer {buffer}: retransmitted {retx:.3}");
            }
        }
    }
    let mean = retx_sum / rates.len() as f64;
    assert!(mean < 0.055, "retransmitted {mean:.3} on average");
}

/// A receiver `speed` times as fast as the link whose host stops it for `stall_us` now and
/// then (catching up at `catch_up` times the pace data came in), behind a raised socket
/// buffer of `buffer` bytes: its steady goodput over the link's payload capacity.
fn stalling_receiver(
    rtt_ms: u64,
    speed: f64,
    (stall_every_us, stall_us, catch_up): (u64, u64, u64),
    buffer: u64,
    seed: u64,
) -> (f64, f64) {
    let rate = 300 * MBIT;
    let mut sc = Scenario::new(seed);
    (sc.forward, sc.reverse) = path(rate, rtt_ms, 0.0, 1.0);
    adaptive(&mut sc);
    sc.server_receiver = Some(ReceiverParams {
        rate: (rate as f64 * speed) as u64,
        buffer_bytes: buffer,
        stall_every_us,
        stall_us,
        catch_up,
    });
    sc.uploads = vec![("f".into(), data((rate * 8) as usize))];
    let r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.server_os_drops, 0);
    let share = steady_rate(&r) / (rate as f64 * payload_share());
    let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
    eprintln!(
        "{rtt_ms} ms, receiver at {speed} x the link stalls {} ms every {} ms (catching up at \
         {catch_up} x), {} MB buffer: {:.1} % of the link, retransmitted {:.2} %",
        stall_us / 1000,
        stall_every_us / 1000,
        buffer / 1_000_000,
        share * 100.0,
        retx * 100.0
    );
    (share, retx)
}

/// A receiver on a busy host falls tens of ms behind and catches up, slowly when it is
/// barely faster than the link; its buffer holds what came meanwhile. That backlog is no
/// queue to drain, and no reason to stop sending: on the harness, treating it as both kept
/// 1 Gbit/s paths at 82-91 % of the link where a sender at a fixed pace got 95 % (here:
/// 83.7 and 94.4 %). But while its feedback is overdue nothing says the path takes more:
/// probing on blind overflowed the 10 ms path's buffer (0.30 % retransmitted here).
/// The last two cases stall long enough, in a buffer small enough, that the kernel's count
/// (which runs ahead while a backlog is read) passes a quarter of the buffer (0.41 at 10 ms).
#[test]
fn a_receiver_that_stalls_behind_a_large_buffer_gets_the_link() {
    for (rtt_ms, speed, stalls, buffer, seed) in [
        (10, 10.0, (300_000, 80_000, 4), 64_000_000, 76),
        (100, 1.1, (1_000_000, 150_000, 4), 64_000_000, 73),
        (10, 2.0, (1_000_000, 180_000, 2), 24_000_000, 71),
        (100, 2.0, (1_000_000, 180_000, 2), 60_000_000, 71),
    ] {
        let (share, retx) = stalling_receiver(rtt_ms, speed, stalls, buffer, seed);
        assert!(share >= 0.96, "{rtt_ms} ms: {:.1} %", share * 100.0);
        assert!(
            retx < 0.002,
            "{rtt_ms} ms: retransmitted {:.2} %",
            retx * 100.0
        );
    }
}

/// The same stalling sender on a shallow buffer (0.1 BDP: 1 ms of queue on a 10 ms path):
/// what it sends to make up for a stall must not overflow the buffer over and over, nor
/// may those losses pass for the path's random loss (the rate then ran away over the link).
/// The stalls' own cost stays (a queue emptied by a stall, a burst past it).
#[test]
fn a_stalling_sender_does_not_overflow_a_shallow_buffer() {
    for seed in [61, 62] {
        let retx = stalling_sender(seed, 0.1, 0.85);
        // Without a cut on catch-ups that lose: 9 %; with their losses counted as the
        // path's too: 32 %. The same buffer without stalls loses under 1 % (see above).
        assert!(retx < 0.05, "seed {seed}: retransmitted {retx:.3}");
    }
}

/// Mean Mbit/s of a 100 ms trace over buckets [a, b).
fn trace_mean_mbit(t: &[u64], a: usize, b: usize) -> f64 {
    mbit(mean_of(t, a, b))
}

/// The simulator's TCP CUBIC cross traffic is a fair stand-in for the real thing: alone it
/// fills the link (less its headers), and a second stream started later gets a share.
#[test]
fn the_simulated_cubic_flow_fills_the_link_and_shares_it() {
    let mut sc = Scenario::new(31);
    (sc.forward, sc.reverse) = path(100 * MBIT, 10, 0.0, 1.0);
    sc.limit_us = 15_000_000;
    // The scenario's own client only keeps the simulation going.
    let mut idle = sc.another_client(14_000_000);
    idle.uploads = vec![("idle".into(), data(1000))];
    sc.extra_clients.push(idle);
    sc.uploads = vec![("first".into(), data(1000))];
    sc.tcp_flows = vec![
        TcpSpec {
            start_us: 0,
            stop_us: u64::MAX,
        },
        TcpSpec {
            start_us: 5_000_000,
            stop_us: u64::MAX,
        },
    ];
    let r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    let (a, b) = (&r.tcp_rx_trace[0], &r.tcp_rx_trace[1]);
    let alone = trace_mean_mbit(a, 10, 50);
    let shares = [trace_mean_mbit(a, 80, 140), trace_mean_mbit(b, 80, 140)];
    eprintln!(
        "CUBIC alone {alone:.1} Mbit/s; two: {shares:.1?}; loss events {:?}",
        r.tcp_loss_events
    );
    // 1448 data bytes in 1500 on the wire.
    assert!(alone >= 0.9 * 100.0 * 1448.0 / 1500.0, "alone {alone:.1}");
    assert!(shares.iter().all(|&s| s >= 25.0), "{shares:.1?}");
    assert!(shares[0] + shares[1] >= 90.0, "{shares:.1?}");
    assert!(
        r.tcp_loss_events.iter().all(|&n| n >= 3),
        "{:?}",
        r.tcp_loss_events
    );
}

/// A hayate upload that joins a TCP CUBIC stream 3 s in, on `rate_mbit` × `rtt_ms` with a
/// 1-BDP buffer, under `policy`: the mean Mbit/s of each from 5 s to the end (40 s).
fn beside_cubic(rate_mbit: u64, rtt_ms: u64, seed: u64, policy: Policy) -> (f64, f64) {
    beside_tcp(rate_mbit, rtt_ms, seed, policy, false, |_| {})
}

/// An upload joining a TCP stream (BBR-like if `bbr`, else CUBIC) `join_s` into it, on a
/// 1-BDP path, for up to `secs`: the upload is the second client's (`late` sets it up),
/// `host` sets up the scenario (the hayate sender's host).
#[allow(clippy::too_many_arguments)]
fn joining_tcp(
    rate_mbit: u64,
    rtt_ms: u64,
    seed: u64,
    bbr: bool,
    join_s: u64,
    secs: u64,
    host: impl FnOnce(&mut Scenario),
    late: impl FnOnce(&mut ClientSpec),
) -> sim::SimResult {
    let mut sc = Scenario::new(seed);
    (sc.forward, sc.reverse) = path(rate_mbit * MBIT, rtt_ms, 0.0, 1.0);
    adaptive(&mut sc);
    host(&mut sc);
    sc.limit_us = secs * 1_000_000;
    let flow = TcpSpec {
        start_us: 0,
        stop_us: u64::MAX,
    };
    if bbr {
        sc.bbr_flows = vec![flow];
    } else {
        sc.tcp_flows = vec![flow];
    }
    // The scenario's own client only keeps the simulation going.
    sc.uploads = vec![("tiny".into(), data(1000))];
    let mut up = sc.another_client(join_s * 1_000_000);
    up.uploads = vec![("f".into(), data((rate_mbit * MBIT * secs) as usize))];
    late(&mut up);
    sc.extra_clients.push(up);
    let r = sim::run(&sc);
    let limit = Some("simulation time limit reached".to_string());
    assert!(r.ok || r.error == limit, "{:?}", r.error);
    r
}

/// The same beside a TCP stream paced by a BBR-like controller (`bbr`) or CUBIC.
/// `host` sets up the hayate sender's host (stalls).
fn beside_tcp(
    rate_mbit: u64,
    rtt_ms: u64,
    seed: u64,
    policy: Policy,
    bbr: bool,
    host: impl FnOnce(&mut Scenario),
) -> (f64, f64) {
    let r = joining_tcp(rate_mbit, rtt_ms, seed, bbr, 3, 40, host, |late| {
        late.cc_params = Some(AdaptiveParams {
            policy,
            ..AdaptiveParams::default()
        });
    });
    let (h, t) = (&r.clients[1].server_rx_trace, &r.tcp_rx_trace[0]);
    let end = h.len().min(t.len()).min(395);
    let (hayate, tcp) = (trace_mean_mbit(h, 50, end), trace_mean_mbit(t, 50, end));
    eprintln!(
        "{rate_mbit} Mbit/s, {rtt_ms} ms, {}: {} {tcp:.1} Mbit/s, hayate {hayate:.1} Mbit/s \
         (share {:.2})",
        policy.name(),
        if bbr { "BBR" } else { "CUBIC" },
        hayate / (hayate + tcp)
    );
    (hayate, tcp)
}

/// `--policy fair` beside a TCP CUBIC stream that keeps a 1-BDP buffer full: the queue
/// stands through hayate's yields, so it competes as a loss-based flow does (a search, then
/// a cut to 0.7 when the buffer overflows and CUBIC's curve between) instead of yielding to
/// nothing. Yielding to that queue left it 1.8-2.7 Mbit/s of 100 (shares 0.02-0.03).
/// Measured (the simulated CUBIC has Linux's fast convergence): shares 0.50 (100 Mbit/s,
/// 10 ms), 0.44 (100, 50), 0.51 (300, 10), 0.61 (300, 50). With the delivery estimate
/// holding the pace up between cuts, 0.64 and 0.69 at 10 ms: the pace came back within a
/// few round trips of each cut.
#[test]
fn fair_holds_a_share_beside_cubic() {
    for (rate, rtt, seed) in [(100, 10, 32), (100, 50, 33), (300, 10, 34), (300, 50, 35)] {
        let (hayate, tcp) = beside_cubic(rate, rtt, seed, Policy::Fair);
        let share = hayate / (hayate + tcp);
        assert!(
            (0.35..=0.65).contains(&share),
            "{rate} Mbit/s, {rtt} ms: hayate {hayate:.1}, CUBIC {tcp:.1}"
        );
        assert!(hayate + tcp >= 0.9 * rate as f64, "{hayate:.1} + {tcp:.1}");
    }
}

/// The same on a host that holds the hayate sender 20 ms every 200 ms. Each stall drains
/// the queue by what hayate did not send, a fall of the RTT as deep as CUBIC's cuts make
/// on this path: read as CUBIC's, hayate cut every half second where CUBIC cut every two
/// to four, and held 0.18 of a 300 Mbit/s, 10 ms path. A fall within
/// `Params::contend_stall_rounds` of a stall is hayate's own, and while the pace follows
/// CUBIC's curve the pacer does not make the stalls up (`RateControl::makes_up_stalls`;
/// made up, 0.27). Measured: 0.44.
#[test]
fn fair_holds_a_share_beside_cubic_on_a_stalling_host() {
    let (hayate, tcp) = beside_tcp(300, 10, 34, Policy::Fair, false, |sc| {
        sc.client_stall_every_us = 200_000;
        sc.client_stall_us = 20_000;
    });
    let share = hayate / (hayate + tcp);
    assert!(
        (0.35..=0.65).contains(&share),
        "hayate {hayate:.1}, CUBIC {tcp:.1}"
    );
}

/// `--policy fair` beside a BBR-like stream (BBRv1's essentials: it paces at the largest
/// delivery rate of 10 round trips, probes 1.25 times over it one round in 8 and drains
/// 0.75 the next, and ignores loss). Its drains read as a loss-based flow's cuts, and
/// cutting at each of them left hayate 1-2 % of the link; its overflows are not answered
/// by a cut of its own. Seen as rate-based (`Contention::rate_based`), hayate holds its
/// estimate and probes as such a flow does.
/// Measured: shares 0.41-0.43 (100 Mbit/s, 50 ms), 0.39-0.41 (300, 50), 0.14-0.26 (300,
/// 100: it moves with small changes elsewhere); 0.01-0.03 before. (On a 10 ms path hayate takes
/// 0.96, as before: it never sees that flow's drains there, and competes as beside CUBIC,
/// whose cuts never come.)
#[test]
fn fair_holds_a_share_beside_bbr() {
    let mut shares = Vec::new();
    for (rate, rtt, seed) in [(100, 50, 43), (300, 50, 44), (300, 100, 45)] {
        let (hayate, bbr) = beside_tcp(rate, rtt, seed, Policy::Fair, true, |_| {});
        let share = hayate / (hayate + bbr);
        assert!(
            share >= 0.1,
            "{rate} Mbit/s, {rtt} ms: hayate {hayate:.1}, BBR {bbr:.1}"
        );
        assert!(hayate + bbr >= 0.9 * rate as f64, "{hayate:.1} + {bbr:.1}");
        shares.push(share);
    }
    let mean = shares.iter().sum::<f64>() / shares.len() as f64;
    assert!(mean >= 0.25, "shares {shares:.2?}");
}

/// `--policy low` gives way to the same CUBIC stream: at most a tenth of the link (as
/// LEDBAT), down to its rate floor. On the faster paths its search used to push on into
/// CUBIC's queue as a newcomer's does, CUBIC lost and cut, and for the 20 s its curve took
/// to grow back the scavenger held 30-40 % (measured: 0.7 and 2.4 of 300 Mbit/s now).
#[test]
fn low_gives_way_to_cubic() {
    for (rate, rtt, seed) in [(100, 10, 32), (100, 50, 33), (300, 50, 35), (300, 100, 37)] {
        let (hayate, tcp) = beside_cubic(rate, rtt, seed, Policy::Low);
        assert!(
            hayate <= 0.1 * (hayate + tcp),
            "{rate} Mbit/s, {rtt} ms: hayate {hayate:.1}, CUBIC {tcp:.1}"
        );
        assert!(
            tcp >= 0.85 * rate as f64,
            "{rate} Mbit/s, {rtt} ms: CUBIC {tcp:.1}"
        );
    }
}

/// Two `--policy low` flows alone on a path: each other's queue goes when both yield, so
/// neither takes it for a loss-based flow's, and they share as two default flows do.
#[test]
fn two_low_flows_share_evenly() {
    let mut sc = Scenario::new(36);
    (sc.forward, sc.reverse) = path(100 * MBIT, 50, 0.0, 1.0);
    adaptive(&mut sc);
    let low = AdaptiveParams {
        policy: Policy::Low,
        ..AdaptiveParams::default()
    };
    sc.client_cc_params = Some(low.clone());
    sc.uploads = vec![("a".into(), data(300_000_000))];
    let mut second = sc.another_client(3_000_000);
    second.uploads = vec![("b".into(), data(300_000_000))];
    second.cc_params = Some(low);
    sc.extra_clients.push(second);
    sc.limit_us = 30_000_000;
    let r = sim::run(&sc);
    let limit = Some("simulation time limit reached".to_string());
    assert!(r.ok || r.error == limit, "{:?}", r.error);
    let (a, b) = (&r.clients[0].server_rx_trace, &r.clients[1].server_rx_trace);
    let until = both_running_until(a, b).min(295);
    let rates = [mean_of(a, 100, until), mean_of(b, 100, until)];
    let j = jain(&rates);
    eprintln!(
        "two low flows: {:.1} + {:.1} Mbit/s, Jain {j:.3}",
        mbit(rates[0]),
        mbit(rates[1])
    );
    assert!(j >= 0.98, "Jain {j:.3}");
    assert!(mbit(rates[0] + rates[1]) >= 85.0, "{rates:?}");
}

/// A 1 GiB-like upload (`bytes`) on `rate` × `rtt_ms` (1-BDP buffer), remembering `saved`
/// (careful resume) or not; with the controller's trace.
fn resume_upload(
    rate: u64,
    rtt_ms: u64,
    bytes: usize,
    seed: u64,
    saved: Option<RememberedPath>,
) -> sim::SimResult {
    let mut sc = Scenario::new(seed);
    (sc.forward, sc.reverse) = path(rate, rtt_ms, 0.0, 1.0);
    adaptive(&mut sc);
    sc.client.remembered = saved;
    sc.cc_trace = true;
    sc.uploads = vec![("f".into(), data(bytes))];
    let mut r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.server_files["f"].len(), bytes);
    // Two of these side by side with the other tests' transfers ran out of memory.
    r.server_files.clear();
    r
}

/// The controller's states in order, each once per stretch (`startup resume drain ...`).
fn states(r: &sim::SimResult) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    for row in &r.clients[0].cc_trace {
        if v.last() != Some(&row.state) {
            v.push(row.state);
        }
    }
    v
}

/// Whole job: file bytes over the time to the end of the session, bytes/s.
fn whole_rate(r: &sim::SimResult, bytes: usize) -> f64 {
    bytes as f64 / (r.elapsed_us as f64 / 1e6)
}

/// What the first session measured, as the next one gets it a minute later.
fn remembered_from(r: &sim::SimResult) -> RememberedPath {
    let m = r.clients[0]
        .measured
        .expect("a measurement worth remembering");
    RememberedPath {
        rate: m.rate,
        min_rtt_us: m.min_rtt_us,
        age_us: 60_000_000,
    }
}

/// When the goodput first reached 90 % of `capacity` (bytes/s), ms.
fn t90_ms(r: &sim::SimResult, capacity: f64) -> u64 {
    r.server_rx_trace
        .iter()
        .position(|&b| b as f64 * 10.0 >= 0.9 * capacity)
        .map_or(u64::MAX, |i| (i as u64 + 1) * 100)
}

/// A path seen a minute ago: the second transfer starts near its rate once the first RTT
/// sample confirms the path (careful resume), so its whole job is close to the steady rate.
/// The same seed without the memory for comparison.
#[test]
fn a_remembered_path_starts_near_its_rate() {
    let (rate, rtt, bytes) = (500 * MBIT, 250, 300_000_000);
    let first = resume_upload(rate, rtt, bytes, 61, None);
    let saved = remembered_from(&first);
    let capacity = 500.0 * MBIT as f64 * payload_share();
    assert!(
        (0.95 * capacity..1.05 * capacity).contains(&(saved.rate as f64)),
        "measured {:.1} of {:.1} Mbit/s",
        saved.rate as f64 / 1.25e5,
        capacity / 1.25e5
    );
    assert!((250_000..260_000).contains(&saved.min_rtt_us), "{saved:?}");
    let second = resume_upload(rate, rtt, bytes, 61, Some(saved));
    let steady = steady_rate(&first);
    let (w1, w2) = (whole_rate(&first, bytes), whole_rate(&second, bytes));
    let (t1, t2) = (t90_ms(&first, capacity), t90_ms(&second, capacity));
    eprintln!(
        "steady {:.1} Mbit/s; whole job: first {:.1} % (90 % after {t1} ms), second {:.1} % \
         (90 % after {t2} ms); states {:?}",
        steady / 1.25e5,
        100.0 * w1 / steady,
        100.0 * w2 / steady,
        states(&second),
    );
    assert_eq!(
        states(&second)[..2],
        ["resume", "startup"],
        "{:?}",
        states(&second)
    );
    // The handshake (whose round trip confirms the path) and half a round trip at half the
    // rate: 90 % within 4 round trips of the start, where the search took 6-7. Waiting for
    // the first data's round trip to confirm it cost one more (1 000 ms here).
    assert!(
        t2 <= 800 && t2 + 600 <= t1,
        "90 % after {t2} ms, {t1} without"
    );
    assert!(
        w2 >= w1 + 0.02 * steady,
        "whole job {:.1} %, {:.1} % without; trace {}",
        100.0 * w2 / steady,
        100.0 * w1 / steady,
        trace_mbit(&second)
    );
    assert_eq!(second.client.data_packets_retransmitted, 0);
}

/// The path got slower since (200 of a remembered 1000 Mbit/s): the jump (500 Mbit/s)
/// builds a queue, retreats to what it got delivered within a round trip, loses at most
/// part of its own flight, and the job is no slower than without the memory.
#[test]
fn a_remembered_rate_the_path_no_longer_carries_retreats() {
    let (rate, rtt, bytes) = (200 * MBIT, 250, 150_000_000);
    let without = resume_upload(rate, rtt, bytes, 62, None);
    let saved = RememberedPath {
        rate: 1000 * MBIT,
        min_rtt_us: 250_000,
        age_us: 600_000_000,
    };
    let with = resume_upload(rate, rtt, bytes, 62, Some(saved));
    let st = states(&with);
    assert_eq!(st[..2], ["resume", "drain"], "{st:?}");
    let retreat_ms = with.clients[0]
        .cc_trace
        .iter()
        .find(|r| r.state == "drain")
        .map(|r| r.feedback.now_us / 1000)
        .unwrap();
    let jump_flight = 500 * MBIT / 4; // half the remembered rate over the RTT
    let lost = with.client.data_packets_retransmitted * 1500;
    let (a, b) = (without.elapsed_us as f64, with.elapsed_us as f64);
    eprintln!(
        "retreat at {retreat_ms} ms, {lost} B retransmitted (jump's flight {jump_flight} B); \
         {:.2} s, {:.2} s without",
        b / 1e6,
        a / 1e6
    );
    // The first RTT sample comes after the handshake and a round trip of data (~500 ms),
    // the jump's queue a round trip later.
    assert!(retreat_ms < 1_100, "retreat at {retreat_ms} ms");
    assert!(lost < jump_flight / 2, "{lost} B retransmitted");
    assert!(b <= 1.03 * a, "{:.2} s, {:.2} s without", b / 1e6, a / 1e6);
}

/// A remembered RTT unlike the path's (20 ms against 250) is another path: no jump, and the
/// transfer goes exactly as without it.
#[test]
fn a_remembered_path_with_another_rtt_is_ignored() {
    let (rate, rtt, bytes) = (100 * MBIT, 250, 30_000_000);
    let without = resume_upload(rate, rtt, bytes, 63, None);
    let saved = RememberedPath {
        rate: 100 * MBIT,
        min_rtt_us: 20_000,
        age_us: 60_000_000,
    };
    let with = resume_upload(rate, rtt, bytes, 63, Some(saved));
    assert!(!states(&with).contains(&"resume"), "{:?}", states(&with));
    assert_eq!(with.elapsed_us, without.elapsed_us);
    // Too old a memory is ignored the same way.
    let old = RememberedPath {
        min_rtt_us: 250_000,
        age_us: 3_700_000_000,
        ..saved
    };
    let with = resume_upload(rate, rtt, bytes, 63, Some(old));
    assert_eq!(with.elapsed_us, without.elapsed_us);
}

// ---- Link models beyond a FIFO (the rows of `bench/sim-matrix` where the goal is met) -------

/// A 300 Mbit/s upload of 5 s over `rtt_ms` with `loss` each way, the path changed by
/// `shape`; its steady goodput over `capacity` (bytes/s on the wire) × (1 − loss) must be at
/// least `floor`.
fn shaped_upload(
    rtt_ms: u64,
    loss: f64,
    seed: u64,
    floor: f64,
    shape: impl FnOnce(&mut LinkParams, &mut LinkParams),
) -> sim::SimResult {
    let rate = 300 * MBIT;
    let mut sc = Scenario::new(seed);
    (sc.forward, sc.reverse) = path(rate, rtt_ms, loss, 1.0);
    shape(&mut sc.forward, &mut sc.reverse);
    adaptive(&mut sc);
    sc.uploads = vec![("f".into(), data((rate * 5) as usize))];
    let r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    let capacity = rate as f64 * payload_share() * (1.0 - loss);
    assert_steady(&r, capacity, floor, &format!("{rtt_ms} ms, loss {loss}"));
    r
}

/// CoDel (fq_codel with one flow) on a deep buffer: the controller's own queue stays under
/// CoDel's 5 ms target, so CoDel seldom drops.
#[test]
fn codel_keeps_the_link_full() {
    for (rtt, loss, seed) in [(50, 0.01, 81), (250, 0.0, 82)] {
        let r = shaped_upload(rtt, loss, seed, 0.95, |fwd, _| {
            fwd.queue_bytes *= 2;
            fwd.aqm = Some(CoDelParams::default());
        });
        let drops = r.fwd_aqm_drops as f64 / r.fwd_delivered as f64;
        assert!(drops < 0.002, "{rtt} ms: CoDel dropped {drops:.4}");
    }
}

/// A token-bucket policer at 300 Mbit/s (10 ms of burst) on a 900 Mbit/s link: the goal is
/// 90 % of the policed rate, and not much more sent than gets through. Its drops come
/// without a queue, and learnt as the path's random loss from rounds at the compensated
/// pace they made that pace 1.3-1.4 times the policed rate: 30 % of what was sent was
/// dropped at 10 ms, 4-9 % at 50-250 ms. Refill now paces at what gets through, where a
/// policer drops nothing and random loss is what it is.
#[test]
fn a_policer_is_kept_full() {
    for (rtt, loss, seed) in [(10, 0.0, 80), (50, 0.0, 83), (100, 0.01, 84)] {
        let r = shaped_upload(rtt, loss, seed, 0.90, |fwd, _| {
            let rate = fwd.rate.unwrap();
            fwd.rate = Some(3 * rate);
            fwd.queue_bytes *= 3;
            fwd.policer = Some(PolicerParams {
                rate,
                burst_bytes: rate / 100,
            });
        });
        let c = &r.client;
        let retx = c.data_packets_retransmitted as f64 / c.data_packets_sent as f64;
        assert!(
            retx < loss + 0.08,
            "{rtt} ms, loss {loss}: {:.1} % of what was sent retransmitted",
            100.0 * retx
        );
    }
}

/// ACKs released in bursts every 8 ms (Wi-Fi, cable): the receiver's clock dates the
/// deliveries, so bunched feedback does not read as a faster path. Seed 2110 at 10 ms and
/// 1 %: its first calm rounds lost nothing, a loss-free path was assumed, and the first
/// round at the path's 1 % (2.8 % of 378 datagrams) read as an overflow; the buffer learnt
/// from it as short held the upload at 72 %. The loss test allows for the random loss a few
/// calm rounds cannot rule out (`Params::random_loss_floor_datagrams`).
#[test]
fn ack_aggregation_costs_little() {
    for (rtt, loss, seed) in [(10, 0.0, 85), (100, 0.01, 86), (10, 0.01, 2110)] {
        shaped_upload(rtt, loss, seed, 0.95, |_, rev| rev.aggregate_us = 8_000);
    }
}

/// The feedback through a 1 Mbit/s reverse path (64 KB of buffer). On the long lossy path
/// an ACK every 32 packets, each with the loss map of a round trip's losses, took 1.3
/// Mbit/s: the reverse queue filled, read as a queue of ours, and the upload got 55 %.
#[test]
fn a_thin_reverse_path_is_enough() {
    for (rtt, loss, seed) in [(10, 0.01, 87), (100, 0.0, 88), (250, 0.01, 89)] {
        let r = shaped_upload(rtt, loss, seed, 0.95, |_, rev| {
            rev.rate = Some(MBIT);
            rev.queue_bytes = 64_000;
        });
        assert_eq!(r.rev_queue_drops, 0, "{rtt} ms: feedback dropped");
    }
}

/// On a long path the receiver acknowledges a few times a round trip, not every 32
/// packets: at 300 Mbit/s and 250 ms that was 619 ACKs and 1.3 Mbit/s of feedback a second
/// over the run (with 1 % loss), now about 120 and 0.25 Mbit/s. A short path keeps its
/// cadence.
#[test]
fn feedback_on_a_long_path_is_a_few_acks_a_round_trip() {
    for (rtt, acks_per_s) in [(10, 600.0..900.0), (250, 80.0..160.0)] {
        let r = shaped_upload(rtt, 0.01, 90, 0.95, |_, _| {});
        let secs = r.elapsed_us as f64 / 1e6;
        let acks = r.server.packets_sent as f64 / secs;
        let kbit = r.rev_delivered_bytes as f64 * 8.0 / secs / 1e3;
        assert!(
            acks_per_s.contains(&acks),
            "{rtt} ms: {acks:.0} ACKs a second"
        );
        if rtt == 250 {
            assert!(kbit < 400.0, "{rtt} ms: {kbit:.0} kbit/s of feedback");
        }
    }
}

/// ACKs that wait on the way back, behind other traffic on a busy reverse path
/// (exponential extra delay of 4 ms mean, order kept: 0-20 ms), are no queue of ours, and
/// yielding to them would not shorten them. The RTT holds that wait; the RTT less the
/// data's one-way delay (the receiver dates each arrival) is the way back alone, and its rise
/// comes off the queue signal. Before: 64.5 % at 10 ms.
#[test]
fn a_busy_reverse_path_is_no_queue_of_ours() {
    for (rtt, seed) in [(10, 92), (50, 93)] {
        shaped_upload(rtt, 0.0, seed, 0.95, |_, rev| {
            rev.jitter = Some(JitterParams {
                mean_us: 4_000,
                dist: JitterDist::Exponential,
                reorder: false,
            });
        });
    }
}

/// The same jitter on both directions of the path (see `shaped_upload`).
fn jitter_both_ways(
    mean_us: u64,
    dist: JitterDist,
    reorder: bool,
) -> impl FnOnce(&mut LinkParams, &mut LinkParams) {
    move |fwd, rev| {
        let j = JitterParams {
            mean_us,
            dist,
            reorder,
        };
        (fwd.jitter, rev.jitter) = (Some(j), Some(j));
    }
}

/// A path that reorders (uniform jitter of 0-1 ms each way, 25 packets' worth at 300
/// Mbit/s): the first losses declared wrongly teach the loss rule how much reordering to
/// allow, and little more is sent again than is lost. With a fixed 16-packet rule, 1.6 % was
/// sent again on a path that lost nothing.
#[test]
fn reordering_is_not_read_as_loss() {
    for (rtt, loss, seed) in [(10, 0.0, 91), (100, 0.01, 92)] {
        let r = shaped_upload(
            rtt,
            loss,
            seed,
            0.95,
            jitter_both_ways(500, JitterDist::Uniform, true),
        );
        let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
        assert!(retx < loss + 0.003, "{rtt} ms: retransmitted {retx:.4}");
        assert!(
            r.client.blocks_lost_spuriously > 0,
            "{rtt} ms: no reordering seen"
        );
    }
}

/// A path whose delay varies by itself (exponential jitter of 1 ms mean per datagram each
/// way, order kept: a running maximum, 1-5 ms over the minimum at 300 Mbit/s) on a short
/// round trip, where the queue target is 2 ms: the variation is not a queue. Read as one,
/// the controller yielded round after round, 53-76 % of the link.
#[test]
fn delay_that_varies_by_itself_is_not_read_as_a_queue() {
    for (rtt, loss, seed) in [(10, 0.0, 93), (10, 0.01, 94), (50, 0.0, 95)] {
        shaped_upload(
            rtt,
            loss,
            seed,
            0.93,
            jitter_both_ways(1_000, JitterDist::Exponential, false),
        );
    }
}

/// Startup's drain ends only on a sample of what was sent since it began. On a long path
/// that reorders (uniform jitter of 0-1 ms each way), a sample of what was sent before read
/// the queue gone while the search's last burst was still on its way to the bottleneck; the
/// queue it then put up was yielded to with a deep cut, and growing back at 250 ms took
/// seconds (86.8 % of the link in `bench/sim-matrix`).
#[test]
fn startups_drain_waits_for_what_was_sent_since() {
    for seed in [96, 97] {
        shaped_upload(
            250,
            0.01,
            seed,
            0.95,
            jitter_both_ways(500, JitterDist::Uniform, true),
        );
    }
}

/// Loss in bursts (Gilbert-Elliott, 1 % in runs of 4 datagrams, each way) is random loss
/// too. On calm rounds a burst used to read as another flow overflowing a short buffer, and
/// the yield to it cost 87-96 % in `bench/sim-matrix`.
#[test]
fn bursty_loss_is_treated_as_noise() {
    for (rtt, seed) in [(10, 89), (100, 90)] {
        let r = shaped_upload(rtt, 0.01, seed, 0.95, |fwd, rev| {
            let ge = GilbertElliott::with_mean(0.01, 4.0);
            (fwd.loss, rev.loss) = (0.0, 0.0);
            (fwd.burst_loss, rev.burst_loss) = (Some(ge), Some(ge));
        });
        let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
        assert!(retx < 0.02, "{rtt} ms: retransmitted {retx:.3}");
    }
}

/// Joins a TCP CUBIC flow 5 s after it began (its queue standing) on a 300 Mbit/s, 1-BDP
/// path, with `remembered` given: (hayate's share of what both moved over the 20 s after
/// its first 2, when it began to compete, s after it joined).
fn joining_cubic(rtt_ms: u64, seed: u64, remembered: Option<RememberedPath>) -> (f64, f64) {
    let rate_mbit = 300;
    let r = joining_tcp(
        rate_mbit,
        rtt_ms,
        seed,
        false,
        5,
        30,
        |_| {},
        |late| {
            late.config.remembered = remembered;
            late.cc_trace = true;
        },
    );
    let (h, t) = (&r.clients[1].server_rx_trace, &r.tcp_rx_trace[0]);
    let (hayate, tcp) = (trace_mean_mbit(h, 70, 270), trace_mean_mbit(t, 70, 270));
    let compete_s = r.clients[1]
        .cc_trace
        .iter()
        .find(|t| t.state == "compete")
        .map_or(f64::INFINITY, |t| t.feedback.now_us as f64 / 1e6);
    let share = hayate / (hayate + tcp);
    eprintln!(
        "{rate_mbit} Mbit/s, {rtt_ms} ms, remembered {}: hayate {hayate:.1}, CUBIC {tcp:.1} \
         Mbit/s (share {share:.2}), competing from {compete_s:.1} s",
        remembered.is_some()
    );
    (share, compete_s)
}

/// A flow that joins a loss-based one never sees the path without that flow's queue: its
/// minimum RTT has the queue in it, its yields push the queue just under a target measured
/// from there, and it finds the other flow only once it gave most of its share away. A
/// path remembered from an earlier session gives it the path's floor, and the queue that
/// stands over it through its yields is found within seconds. The share is then what
/// competing by CUBIC's rules holds, in the 35-65 % (0.50 and 0.41 at 50 and 100 ms
/// over the 20 s after the join). Without the memory it reads more over those 20 s, but
/// falls all along (the simulated CUBIC erodes it slower than Linux's does on the emulated
/// WAN, where the memory takes `fair` from 29-35 % to 63-64 % at 50 ms).
#[test]
fn a_remembered_path_finds_the_loss_based_flow_it_joins_sooner() {
    for (rtt, seed) in [(50, 71), (100, 72)] {
        let base = Some(RememberedPath {
            rate: 300 * MBIT,
            min_rtt_us: rtt * 1_000 + 100,
            age_us: 60_000_000,
        });
        let (share_blind, at_blind) = joining_cubic(rtt, seed, None);
        let (share, at) = joining_cubic(rtt, seed, base);
        assert!(
            at < 5.0 && at < at_blind,
            "{rtt} ms: competing from {at:.1} s, {at_blind:.1} s without the memory"
        );
        assert!(
            (0.35..=0.65).contains(&share),
            "{rtt} ms: share {share:.2} ({share_blind:.2} without)"
        );
    }
}

/// The other side of lending a remembered floor: a route that got longer since (60 ms now,
/// 50 then), the flow alone. Over the floor its own queue never goes, and it takes it for
/// another flow's and competes; once it gets what the path carried then, the floor and the
/// contention go, and it keeps the queue short again.
#[test]
fn a_remembered_floor_under_a_longer_route_is_dropped() {
    let (rate_mbit, rtt_ms) = (300, 60);
    let mut sc = Scenario::new(73);
    (sc.forward, sc.reverse) = path(rate_mbit * MBIT, rtt_ms, 0.0, 1.0);
    adaptive(&mut sc);
    sc.cc_trace = true;
    sc.client.remembered = Some(RememberedPath {
        rate: rate_mbit * MBIT,
        min_rtt_us: 50_000,
        age_us: 60_000_000,
    });
    sc.uploads = vec![("f".into(), data((rate_mbit * MBIT * 10) as usize))];
    let r = sim::run(&sc);
    assert!(r.ok, "{:?}", r.error);
    let c = &r.clients[0];
    let last_compete = c
        .cc_trace
        .iter()
        .rfind(|t| t.state == "compete")
        .map_or(0.0, |t| t.feedback.now_us as f64 / 1e6);
    let q50_ms = r.fwd_queue_delay_median_ms();
    let steady = trace_mean_mbit(&c.server_rx_trace, 20, c.server_rx_trace.len() - 5);
    eprintln!(
        "route 60 ms, 50 remembered: competed until {last_compete:.1} s, median queue \
         {q50_ms:.1} ms, {steady:.1} Mbit/s"
    );
    assert!(last_compete < 2.0, "competed until {last_compete:.1} s");
    assert!(q50_ms <= 10.0, "median queue {q50_ms:.1} ms");
    assert!(
        steady >= 0.9 * rate_mbit as f64 * payload_share(),
        "{steady:.1} Mbit/s"
    );
}

/// A remembered floor does not make a newcomer take another hayate flow's queue for a
/// loss-based flow's: that queue goes at the first flow's yields, and the newcomer (which
/// remembers the path, as a user's second transfer to a host does) never competes. The
/// shares are a little less even than without the memory (Jain 0.987 and 0.935 at 50 and
/// 100 ms, 0.996 and 0.987 without): careful resume's jump, not the floor (the same
/// without it).
#[test]
fn a_remembered_floor_beside_another_hayate_flow_is_not_taken_for_contention() {
    for (rtt_ms, seed) in [(50, 74), (100, 75)] {
        let mut sc = Scenario::new(seed);
        (sc.forward, sc.reverse) = path(300 * MBIT, rtt_ms, 0.0, 1.0);
        adaptive(&mut sc);
        let size = 400_000_000;
        sc.uploads = vec![("a".into(), data(size))];
        let mut second = sc.another_client(5_000_000);
        second.uploads = vec![("b".into(), data(size))];
        second.config.remembered = Some(RememberedPath {
            rate: 300 * MBIT,
            min_rtt_us: rtt_ms * 1_000 + 100,
            age_us: 60_000_000,
        });
        second.cc_trace = true;
        sc.extra_clients.push(second);
        let r = sim::run(&sc);
        assert!(r.ok, "{:?}", r.error);
        let (a, b) = (&r.clients[0].server_rx_trace, &r.clients[1].server_rx_trace);
        let until = both_running_until(a, b);
        let rates = [mean_of(a, 70, until), mean_of(b, 70, until)];
        let j = jain(&rates);
        let competed = r.clients[1].cc_trace.iter().any(|t| t.state == "compete");
        eprintln!(
            "{rtt_ms} ms, the second remembering the path: {:.1} + {:.1} Mbit/s, Jain {j:.3}, \
             competed {competed}",
            mbit(rates[0]),
            mbit(rates[1])
        );
        assert!(!competed, "{rtt_ms} ms: the newcomer competed");
        assert!(j >= 0.9, "{rtt_ms} ms: Jain {j:.3}");
    }
}
