//! The adaptive controller across link models in the simulator (issue 42): for each model ×
//! RTT × loss row, one upload's steady utilisation, the share it retransmitted and the
//! median queueing delay at the bottleneck; beside cross traffic (a TCP CUBIC flow, a
//! BBR-like flow, on/off short flows) also the cross traffic's throughput, and on a link
//! whose rate halves and recovers. `bench/sim-matrix` runs it in release mode.
//!
//! ```text
//! cargo run --release -p hayate-proto --example sim_matrix -- [--models fifo,codel,...]
//!     [--rtts 10,50,100,250] [--losses 0,0.01] [--rate-mbit 300] [--secs 6] [--seeds 1]
//!     [--jobs 2] [--ablate all|rule,rule] [--trace DIR]
//! ```
//!
//! With `--trace DIR`, each row's client writes its rate controller's trace to
//! `DIR/MODEL-RTTms-LOSS-SEED.tsv`, in the columns of `HAYATE_CC_TRACE`.
//!
//! With `--ablate`, the rows run once as the controller is and once with each named rule of
//! its state machine switched off (`AdaptiveRule`), and a table says per rule how much
//! worse the worst row and the mean got: steady (points), retransmitted (points), median
//! queueing delay (ms), and how many rows got worse than `NOISE`.
//!
//! **Steady** is the server's goodput from 2 s to half a second before the end, over
//! capacity × payload share × (1 − loss), as `tests/rate_control.rs` measures it; the
//! capacity is the policer's rate with a policer, the link's otherwise, and the loss the
//! mean random loss (Bernoulli, or Gilbert-Elliott's mean). **retx** is retransmitted ÷ sent
//! data packets; **q50** the median time the forward link's datagrams waited in its queue.
//!
//! With cross traffic (it starts with the upload and runs until the upload is done) the
//! window is from 2 s to half a second before the upload's end, **hayate %** is steady as
//! above and **cross %** the cross traffic's data rate over the same window, over capacity ×
//! 1448/1500 (a TCP segment's data share) × (1 − loss). On the link whose rate changes the
//! capacity is the rate's mean over that window. In `cubic-late` the upload joins a CUBIC
//! flow that has run for 5 s, and the window starts 2 s after it joined. Beside TCP,
//! **compete s** says how long after it started the upload's controller first competed
//! (`--policy fair`'s `compete` state), `-` if never.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use hayate_proto::cc::{Ablation, AdaptiveParams, AdaptiveRule, RateConfig};
use hayate_proto::sim::{
    self, CoDelParams, FlowSize, GilbertElliott, JitterDist, JitterParams, LinkParams,
    PolicerParams, RateStep, Scenario, ShortFlows, TcpSpec,
};
use hayate_proto::wire::{block_size, AddrFamily};
use hayate_proto::CcTraceRow;

const MBIT: u64 = 1_000_000 / 8;

/// The link models, by name.
const MODELS: &[(&str, &str)] = &[
    ("fifo", "tail-drop FIFO, 1 BDP"),
    ("fifo-0.1", "tail-drop FIFO, 0.1 BDP"),
    (
        "codel",
        "CoDel (5 ms / 100 ms) on a 2-BDP buffer (fq_codel, one flow)",
    ),
    (
        "policer",
        "token bucket at the rate, 10 ms burst, on a link 3 x as fast (1-BDP FIFO)",
    ),
    (
        "jitter",
        "1-BDP FIFO, + exponential jitter of 1 ms mean each way, order kept",
    ),
    (
        "jitter-reorder",
        "1-BDP FIFO, + uniform jitter 0-1 ms each way, reordering",
    ),
    (
        "ackagg",
        "1-BDP FIFO, ACKs released in bursts every 8 ms (Wi-Fi, cable)",
    ),
    (
        "gilbert",
        "1-BDP FIFO, the loss in bursts (Gilbert-Elliott, mean run 4)",
    ),
    (
        "thin-rev",
        "1-BDP FIFO, ACKs through 1 Mbit/s (64 KB buffer)",
    ),
    (
        "ratestep",
        "1-BDP FIFO (of the full rate), the rate halves at 1/3 of --secs and recovers at 2/3",
    ),
    (
        "busyhost",
        "1-BDP FIFO, the sender's host wakes it 0-4 ms late every time it waits (cores busy)",
    ),
    ("cubic", "1-BDP FIFO, beside one TCP CUBIC bulk flow"),
    (
        "cubic-late",
        "1-BDP FIFO, joining a TCP CUBIC bulk flow 5 s after it started (its queue standing)",
    ),
    ("bbr", "1-BDP FIFO, beside one BBR-like bulk flow"),
    (
        "onoff",
        "1-BDP FIFO, beside on/off short CUBIC flows: 30 % mean load, Pareto sizes (mean 100 kB, shape 1.5)",
    ),
];

/// Models with cross traffic: their table has a cross % column.
const CROSS: &[&str] = &["cubic", "cubic-late", "bbr", "onoff"];

/// When the upload joins the cross traffic in `cubic-late`, µs.
const LATE_JOIN_US: u64 = 5_000_000;

/// A TCP segment's data share of the wire bytes.
const TCP_DATA_SHARE: f64 = 1448.0 / 1500.0;

#[derive(Debug, Clone)]
struct Row {
    model: &'static str,
    rate: u64,
    rtt_ms: u64,
    loss: f64,
    secs: u64,
    seed: u64,
    /// The rule switched off, if any.
    off: Option<AdaptiveRule>,
}

#[derive(Debug, Clone, Default)]
struct Outcome {
    ok: bool,
    steady_pct: f64,
    retx_pct: f64,
    q50_ms: f64,
    drops: u64,
    /// The cross traffic's data rate, % (models with cross traffic).
    cross_pct: f64,
    /// Seconds from the upload's start until its controller first competed (beside
    /// TCP), if it did.
    compete_s: Option<f64>,
    error: Option<String>,
}

fn data(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 2654435761usize) >> 13) as u8)
        .collect()
}

fn payload_share() -> f64 {
    block_size(1500, AddrFamily::V4) as f64 / 1500.0
}

/// The scenario of a row, and the capacity (bytes/s on the wire) and mean loss its
/// utilisation is measured against.
fn scenario(row: &Row) -> (Scenario, f64, f64) {
    let mut sc = Scenario::new(row.seed);
    let rate = row.rate;
    let bdp = rate * row.rtt_ms / 1000;
    let mut fwd = LinkParams {
        delay_us: row.rtt_ms * 500,
        rate: Some(rate),
        queue_bytes: bdp.max(3_000),
        loss: row.loss,
        ..LinkParams::default()
    };
    let mut rev = LinkParams {
        delay_us: row.rtt_ms * 500,
        loss: row.loss,
        ..LinkParams::default()
    };
    let capacity = rate as f64;
    match row.model {
        "fifo" => {}
        "fifo-0.1" => fwd.queue_bytes = (bdp / 10).max(3_000),
        "codel" => {
            fwd.queue_bytes = (2 * bdp).max(3_000);
            fwd.aqm = Some(CoDelParams::default());
        }
        "policer" => {
            fwd.rate = Some(3 * rate);
            fwd.queue_bytes = (3 * bdp).max(3_000);
            fwd.policer = Some(PolicerParams {
                rate,
                burst_bytes: rate / 100,
            });
        }
        "jitter" | "jitter-reorder" => {
            let j = JitterParams {
                mean_us: if row.model == "jitter" { 1_000 } else { 500 },
                dist: if row.model == "jitter" {
                    JitterDist::Exponential
                } else {
                    JitterDist::Uniform
                },
                reorder: row.model == "jitter-reorder",
            };
            fwd.jitter = Some(j);
            rev.jitter = Some(j);
        }
        "ackagg" => rev.aggregate_us = 8_000,
        "gilbert" => {
            let ge = GilbertElliott::with_mean(row.loss, 4.0);
            fwd.loss = 0.0;
            rev.loss = 0.0;
            fwd.burst_loss = Some(ge);
            rev.burst_loss = Some(ge);
        }
        "thin-rev" => {
            rev.rate = Some(MBIT);
            rev.queue_bytes = 64_000;
        }
        "ratestep" => {
            sc.forward_steps = vec![
                RateStep {
                    at_us: row.secs * 1_000_000 / 3,
                    rate: Some(rate / 2),
                },
                RateStep {
                    at_us: row.secs * 2_000_000 / 3,
                    rate: Some(rate),
                },
            ];
        }
        "busyhost" => sc.client_wake_late_us = 2_000,
        "cubic" | "cubic-late" | "bbr" => {
            let flow = TcpSpec {
                start_us: 0,
                stop_us: u64::MAX,
            };
            if row.model != "bbr" {
                sc.tcp_flows = vec![flow];
            } else {
                sc.bbr_flows = vec![flow];
            }
        }
        "onoff" => {
            sc.short_flows = Some(ShortFlows {
                load: (0.3 * rate as f64 * TCP_DATA_SHARE) as u64,
                size: FlowSize::Pareto {
                    mean: 100_000,
                    shape: 1.5,
                },
                start_us: 0,
                stop_us: u64::MAX,
            });
        }
        m => panic!("unknown model {m}"),
    }
    sc.forward = fwd;
    sc.reverse = rev;
    sc.client.rate = RateConfig::ADAPTIVE;
    sc.server.rate = RateConfig::ADAPTIVE;
    if let Some(rule) = row.off {
        sc.client_cc_params = Some(AdaptiveParams {
            ablation: Ablation::default().without(rule),
            ..AdaptiveParams::default()
        });
    }
    sc.uploads = vec![("f".into(), data((rate * row.secs) as usize))];
    sc.limit_us = row.secs * 5_000_000;
    if CROSS.contains(&row.model) {
        // Sharing, the upload takes longer.
        sc.limit_us = row.secs * 20_000_000;
    }
    if row.model == "cubic-late" {
        // The scenario's own client only keeps the simulation going; the upload is a
        // second client's, which joins once CUBIC's queue stands.
        let mut late = sc.another_client(LATE_JOIN_US);
        late.uploads = std::mem::take(&mut sc.uploads);
        sc.uploads = vec![("tiny".into(), data(1000))];
        sc.extra_clients.push(late);
        sc.limit_us += LATE_JOIN_US;
    }
    (sc, capacity, row.loss)
}

fn run_row(row: &Row, trace: Option<&Path>) -> Outcome {
    let (mut sc, capacity, loss) = scenario(row);
    let beside_tcp = matches!(row.model, "cubic" | "cubic-late" | "bbr");
    // Beside TCP the trace says when the controller began to compete.
    sc.cc_trace = trace.is_some() || beside_tcp;
    for c in &mut sc.extra_clients {
        c.cc_trace = sc.cc_trace;
    }
    let r = sim::run(&sc);
    // The upload's client: the second in `cubic-late`.
    let up = &r.clients[if row.model == "cubic-late" { 1 } else { 0 }];
    if let Some(dir) = trace {
        let name = format!(
            "{}-{}ms-{}-{}.tsv",
            row.model, row.rtt_ms, row.loss, row.seed
        );
        if let Err(e) = write_trace(&dir.join(&name), &up.cc_trace) {
            eprintln!("sim-matrix: cannot write {}: {e}", dir.join(name).display());
        }
    }
    let compete_s = beside_tcp
        .then(|| {
            up.cc_trace
                .iter()
                .find(|t| t.state == "compete")
                // The controller's clock starts with its connection.
                .map(|t| t.feedback.now_us as f64 / 1e6)
        })
        .flatten();
    let t = &up.server_rx_trace;
    let peak = t.iter().copied().max().unwrap_or(0);
    let last_full = t.iter().rposition(|&b| b * 2 >= peak).unwrap_or(0);
    // From 2 s after the upload began.
    let a = (up.start_us / 100_000) as usize + 20;
    let mut b = t.len().saturating_sub(5);
    // Sharing the link or losing half of it, the upload's rate falls below half its peak
    // before the end.
    if !CROSS.contains(&row.model) && row.model != "ratestep" {
        b = b.min(last_full);
    }
    let mean_over = |t: &[u64]| {
        if b > a {
            t.iter().take(b).skip(a).sum::<u64>() as f64 / ((b - a) as f64 / 10.0)
        } else {
            0.0
        }
    };
    let steady = mean_over(t);
    let mut capacity = capacity;
    if row.model == "ratestep" && b > a {
        let (down, up) = (row.secs * 10 / 3, row.secs * 20 / 3);
        let halved = (a..b).filter(|&i| (down..up).contains(&(i as u64))).count();
        capacity *= 1.0 - 0.5 * halved as f64 / (b - a) as f64;
    }
    let cross = match row.model {
        "onoff" => mean_over(&r.short_rx_trace),
        "cubic" | "cubic-late" | "bbr" => mean_over(&r.tcp_rx_trace[0]),
        _ => 0.0,
    };
    let c = &up.stats;
    Outcome {
        ok: r.ok,
        steady_pct: 100.0 * steady / (capacity * payload_share() * (1.0 - loss)),
        retx_pct: 100.0 * c.data_packets_retransmitted as f64 / c.data_packets_sent.max(1) as f64,
        q50_ms: r.fwd_queue_delay_median_ms(),
        drops: r.fwd_queue_drops + r.fwd_aqm_drops + r.fwd_policer_drops,
        cross_pct: 100.0 * cross / (capacity * TCP_DATA_SHARE * (1.0 - loss)),
        compete_s,
        error: r.error.clone(),
    }
}

/// The controller's trace as `HAYATE_CC_TRACE` writes it (tab-separated, one feedback a line).
fn write_trace(path: &Path, rows: &[CcTraceRow]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "{}", CcTraceRow::TSV_HEADER)?;
    for r in rows {
        writeln!(out, "{}", r.tsv())?;
    }
    out.flush()
}

/// Exits with a usage error (status 2).
fn usage_error(msg: &str) -> ! {
    eprintln!("sim-matrix: {msg} (--help lists the models and options)");
    std::process::exit(2)
}

fn arg_list<T: std::str::FromStr>(args: &[String], name: &str, default: &str) -> Vec<T> {
    let v = match args.iter().position(|a| a == name) {
        Some(i) => match args.get(i + 1) {
            Some(v) => v.as_str(),
            None => usage_error(&format!("{name} needs a value")),
        },
        None => default,
    };
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .unwrap_or_else(|_| usage_error(&format!("{name}: cannot read {s}")))
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("models:");
        for (m, d) in MODELS {
            println!("  {m:<15} {d}");
        }
        return;
    }
    let all: String = MODELS.iter().map(|m| m.0).collect::<Vec<_>>().join(",");
    let models: Vec<String> = arg_list(&args, "--models", &all);
    let rtts: Vec<u64> = arg_list(&args, "--rtts", "10,50,100,250");
    let losses: Vec<f64> = arg_list(&args, "--losses", "0,0.01");
    let rate_mbit: u64 = arg_list(&args, "--rate-mbit", "300")[0];
    let secs: u64 = arg_list(&args, "--secs", "6")[0];
    let seeds: Vec<u64> = arg_list(&args, "--seeds", "1");
    let jobs: usize = arg_list(&args, "--jobs", "2")[0];
    let trace: Option<PathBuf> =
        args.iter()
            .position(|a| a == "--trace")
            .map(|i| match args.get(i + 1) {
                Some(d) => PathBuf::from(d),
                None => usage_error("--trace needs a directory"),
            });
    if let Some(dir) = &trace {
        if let Err(e) = std::fs::create_dir_all(dir) {
            usage_error(&format!("cannot create {}: {e}", dir.display()));
        }
    }

    let mut rows = Vec::new();
    for m in &models {
        let model = MODELS
            .iter()
            .find(|(n, _)| n == m)
            .unwrap_or_else(|| usage_error(&format!("unknown model {m}")))
            .0;
        for &rtt_ms in &rtts {
            for &loss in &losses {
                if model == "gilbert" && loss == 0.0 {
                    continue;
                }
                for &seed in &seeds {
                    rows.push(Row {
                        model,
                        rate: rate_mbit * MBIT,
                        rtt_ms,
                        loss,
                        secs,
                        seed: seed * 1000 + rtt_ms + (loss * 1e4) as u64,
                        off: None,
                    });
                }
            }
        }
    }
    let ablate: Vec<String> = arg_list(&args, "--ablate", "");
    let rules: Vec<(AdaptiveRule, &str)> = AdaptiveRule::ALL
        .iter()
        .copied()
        .filter(|(_, n)| ablate.iter().any(|a| a == "all" || a == n))
        .collect();
    let base_rows = rows.len();
    for &(rule, _) in &rules {
        for i in 0..base_rows {
            rows.push(Row {
                off: Some(rule),
                ..rows[i].clone()
            });
        }
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Outcome>>> = Mutex::new(vec![None; rows.len()]);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(row) = rows.get(i) else { break };
                let o = run_row(row, trace.as_deref().filter(|_| row.off.is_none()));
                results.lock().unwrap()[i] = Some(o);
            });
        }
    });
    let results: Vec<Outcome> = results
        .into_inner()
        .unwrap()
        .into_iter()
        .map(Option::unwrap)
        .collect();

    println!(
        "sim-matrix: {rate_mbit} Mbit/s, {secs} s uploads, seeds {seeds:?}; steady % of \
         capacity x (1 - loss), retransmitted %, median queueing delay ms, drops at the link"
    );
    let mut last_model = "";
    for (row, o) in rows.iter().zip(&results).take(base_rows) {
        if row.model != last_model {
            last_model = row.model;
            let desc = MODELS.iter().find(|m| m.0 == row.model).unwrap().1;
            println!("\n{}: {desc}", row.model);
            if CROSS.contains(&row.model) {
                println!(
                    "{:>7} {:>6} {:>6} {:>9} {:>8} {:>7} {:>7} {:>7} {:>10}  result",
                    "rtt ms",
                    "loss %",
                    "seed",
                    "hayate %",
                    "cross %",
                    "retx %",
                    "q50 ms",
                    "drops",
                    "compete s"
                );
            } else {
                println!(
                    "{:>7} {:>6} {:>6} {:>9} {:>7} {:>7} {:>7}  result",
                    "rtt ms", "loss %", "seed", "steady %", "retx %", "q50 ms", "drops"
                );
            }
        }
        let result = if o.ok {
            "ok".to_string()
        } else {
            format!("FAILED: {}", o.error.as_deref().unwrap_or("?"))
        };
        if CROSS.contains(&row.model) {
            let compete = o
                .compete_s
                .map_or_else(|| "-".to_string(), |t| format!("{t:.1}"));
            println!(
                "{:>7} {:>6.2} {:>6} {:>9.1} {:>8.1} {:>7.2} {:>7.1} {:>7} {:>10}  {}",
                row.rtt_ms,
                row.loss * 100.0,
                row.seed,
                o.steady_pct,
                o.cross_pct,
                o.retx_pct,
                o.q50_ms,
                o.drops,
                compete,
                result
            );
        } else {
            println!(
                "{:>7} {:>6.2} {:>6} {:>9.1} {:>7.2} {:>7.1} {:>7}  {}",
                row.rtt_ms,
                row.loss * 100.0,
                row.seed,
                o.steady_pct,
                o.retx_pct,
                o.q50_ms,
                o.drops,
                result
            );
        }
    }
    print_ablation(&rows, &results, base_rows, &rules);
}

/// Worse than this is a rule paying for itself: steady points lost, retransmitted points
/// gained, median queueing delay gained (ms and share).
const NOISE: (f64, f64, f64, f64) = (0.5, 0.1, 1.0, 0.25);

/// The ablation table: per rule, what switching it off did to the rows.
fn print_ablation(
    rows: &[Row],
    results: &[Outcome],
    base_rows: usize,
    rules: &[(AdaptiveRule, &str)],
) {
    if rules.is_empty() {
        return;
    }
    println!(
        "\nablation over {base_rows} rows (change with the rule off; worse = steady -{} pt, \
         retx +{} pt or q50 +{} ms and +{:.0} %, or a failed run)",
        NOISE.0,
        NOISE.1,
        NOISE.2,
        NOISE.3 * 100.0
    );
    println!(
        "{:<24} {:>13} {:>13} {:>13} {:>11}  {:<8} worst row",
        "rule", "steady min/avg", "retx max/avg", "q50 max/avg", "rows worse", "verdict"
    );
    for (k, (_, name)) in rules.iter().enumerate() {
        let (mut ds, mut dr, mut dq) = (Vec::new(), Vec::new(), Vec::new());
        let mut worse = 0;
        let mut worst: Option<(f64, usize)> = None;
        for i in 0..base_rows {
            let (b, o) = (&results[i], &results[base_rows * (k + 1) + i]);
            let (s, r, q) = (
                o.steady_pct - b.steady_pct,
                o.retx_pct - b.retx_pct,
                o.q50_ms - b.q50_ms,
            );
            ds.push(s);
            dr.push(r);
            dq.push(q);
            let bad = (b.ok && !o.ok)
                || s < -NOISE.0
                || r > NOISE.1
                || (q > NOISE.2 && q > NOISE.3 * b.q50_ms);
            if bad {
                worse += 1;
                // Ranked by steady points lost, plus ten per retransmitted point.
                let cost = -s + 10.0 * r;
                if worst.is_none_or(|(c, _)| cost > c) {
                    worst = Some((cost, i));
                }
            }
        }
        let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let worst_row = worst.map_or(String::new(), |(_, i)| {
            let (r, b, o) = (&rows[i], &results[i], &results[base_rows * (k + 1) + i]);
            format!(
                "{} {} ms {}% seed {}: steady {:.1} -> {:.1}, retx {:.2} -> {:.2}, q50 {:.1} -> {:.1}{}",
                r.model,
                r.rtt_ms,
                r.loss * 100.0,
                r.seed,
                b.steady_pct,
                o.steady_pct,
                b.retx_pct,
                o.retx_pct,
                b.q50_ms,
                o.q50_ms,
                if o.ok { "" } else { " FAILED" }
            )
        });
        println!(
            "{:<24} {:>6.1}/{:<6.2} {:>6.2}/{:<6.2} {:>6.1}/{:<6.2} {:>11}  {:<8} {}",
            name,
            min(&ds),
            avg(&ds),
            max(&dr),
            avg(&dr),
            max(&dq),
            avg(&dq),
            worse,
            if worse > 0 { "pays" } else { "no gain" },
            worst_row
        );
    }
}
