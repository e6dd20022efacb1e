//! The adaptive rate controller on simulated paths: it must find the bottleneck, hold it with
//! a short queue, ignore random loss, and follow a rate step-down.

use hayate_proto::cc::RateConfig;
use hayate_proto::sim::{self, LinkParams, RateStep, Scenario};

const MBIT: u64 = 1_000_000 / 8;

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
    sc.client.rate = RateConfig::Adaptive { max: None, min: 0 };
    sc.server.rate = RateConfig::Adaptive { max: None, min: 0 };
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
        let secs = r.server_rx_trace.len() as f64 / 10.0;
        let steady = mean_rate(&r, 2.0, secs - 0.5);
        // Payload share of the wire: 1426 of 1500 bytes; then 95 % of that.
        let capacity = 100.0 * MBIT as f64 * 1426.0 / 1500.0;
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

#[test]
fn random_loss_is_treated_as_noise() {
    for (loss, seed) in [(0.001, 4), (0.01, 5), (0.03, 6), (0.05, 7)] {
        let r = run_upload(100 * MBIT, 100, loss, 1.0, 60_000_000, seed);
        let secs = r.server_rx_trace.len() as f64 / 10.0;
        let steady = mean_rate(&r, 2.0, secs - 0.5);
        let capacity = 100.0 * MBIT as f64 * 1426.0 / 1500.0 * (1.0 - loss);
        let trace: Vec<String> = r
            .server_rx_trace
            .iter()
            .map(|b| format!("{:.0}", *b as f64 * 8e-5))
            .collect();
        assert!(
            steady >= 0.95 * capacity,
            "loss {loss}: {:.1} of {:.1} Mbit/s; trace {}",
            steady / 1.25e5,
            capacity / 1.25e5,
            trace.join(" ")
        );
        let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
        assert!(retx <= loss + 0.01, "loss {loss}: retransmitted {retx:.3}");
    }
}

#[test]
fn shallow_buffer_costs_little() {
    let r = run_upload(100 * MBIT, 100, 0.0, 0.1, 40_000_000, 8);
    let secs = r.server_rx_trace.len() as f64 / 10.0;
    let steady = mean_rate(&r, 2.0, secs - 0.5);
    let capacity = 100.0 * MBIT as f64 * 1426.0 / 1500.0;
    assert!(steady >= 0.9 * capacity, "{:.1} Mbit/s", steady / 1.25e5);
    let retx = r.client.data_packets_retransmitted as f64 / r.client.data_packets_sent as f64;
    assert!(retx < 0.03, "retransmitted {retx:.3}");
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
    let capacity = 30.0 * MBIT as f64 * 1426.0 / 1500.0;
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
