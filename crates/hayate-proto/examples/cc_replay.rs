//! Replays a rate-controller trace from the WAN harness (`WAN_KEEP_LOGS=1 bench/wan ...`
//! keeps `hayate-cc-*.tsv`) through a fresh adaptive controller, open loop, and prints every
//! feedback after which its pacing rate fell by more than 30 %, next to what the traced
//! sender did then. Up to the first cut both saw the same feedback; after it the trace shows
//! what the traced controller's own choices brought, so only the first difference says much.
//!
//! `cargo run --release -p hayate-proto --example cc_replay -- TRACE.tsv`

use hayate_proto::cc::{Adaptive, Feedback, RateControl};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: cc_replay TRACE.tsv (a hayate-cc-*.tsv kept by bench/wan)")?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().ok_or("empty trace")?.split('\t').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| format!("{path}: no column {name}"))
    };
    let (t, rtt, min_rtt, srtt) = (
        col("t_ms")?,
        col("rtt_us")?,
        col("min_rtt_us")?,
        col("srtt_us")?,
    );
    let (rx, delivered, lost, drops) = (
        col("rx_bps")?,
        col("delivered")?,
        col("lost_bytes")?,
        col("rx_drops")?,
    );
    let (in_flight, rate, sent, lag) = (
        col("in_flight")?,
        col("rate_bps")?,
        col("sent_bytes")?,
        col("rx_lag_us")?,
    );
    let mut a = Adaptive::new(None, 0);
    let (mut prev_sent, mut prev_rx_us, mut last_rate) = (0u64, 0u64, 0u64);
    for (n, line) in lines.enumerate() {
        let c: Vec<&str> = line.split('\t').collect();
        let num = |i: usize| c.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let now_us = c
            .get(t)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("{path}: line {}: bad time", n + 2))?
            * 1000.0;
        let now_us = now_us as u64;
        if num(sent) > prev_sent {
            a.on_sent(now_us, num(sent) - prev_sent);
            prev_sent = num(sent);
        }
        // The trace keeps the receive rate (bit/s) but not the receiver's interval: the time
        // between the ACKs that carried one stands in for it.
        let rx_rate = c.get(rx).is_some_and(|v| *v != "-").then(|| num(rx) / 8);
        let rx_interval_us = if rx_rate.is_some() {
            let i = now_us.saturating_sub(prev_rx_us).max(1);
            prev_rx_us = now_us;
            i
        } else {
            0
        };
        a.on_feedback(&Feedback {
            now_us,
            rtt_us: Some(num(rtt)),
            // Not kept in the trace: taken as arrived when read.
            rtt_sent_us: now_us.saturating_sub(num(rtt) + num(lag)),
            rx_lag_us: num(lag),
            srtt_us: num(srtt),
            min_rtt_us: num(min_rtt),
            rx_rate,
            rx_interval_us,
            delivered: num(delivered),
            lost_bytes: num(lost),
            rx_drops: num(drops),
            in_flight: num(in_flight),
            ..Default::default()
        });
        let r = a.pacing_rate().unwrap_or(0);
        if (r as f64) < 0.7 * last_rate as f64 {
            println!(
                "{:.3} s  {:<8} {:.0} -> {:.0} Mbit/s  (traced sender: {:.0} Mbit/s)",
                now_us as f64 / 1e6,
                a.name(),
                last_rate as f64 * 8e-6,
                r as f64 * 8e-6,
                num(rate) as f64 * 1e-6
            );
        }
        last_rate = r;
    }
    Ok(())
}
