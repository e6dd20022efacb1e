//! `hayate perf`: what a path can carry. A paced UDP probe (loss, reordering, jitter, loss per
//! range of sequence numbers), TCP streams with the kernel's view, hayate's own transport
//! memory to memory (what a `hayate cp` would get), per-second reports on both sides, JSON
//! lines and SVG plots; and `hayate bench mem`, the host's memory bandwidth.
//!
//! A test: the client opens a TCP control connection, the server sends a challenge, the client
//! asks for a test (proving the key with an HMAC when it has one), the server accepts with a
//! data port and a secret token, the data flows, and the sender's `done` and the receiver's
//! `result` close it. A server sends data only to a peer that proved the key.

mod auth;
mod client;
mod ctl;
mod hayate;
mod mem;
mod plot;
mod report;
mod server;
mod stats;
mod tcp;
mod udp;
mod units;

use anyhow::{bail, Result};
use ctl::{Ctl, Msg, ReceiverReport, SenderReport, TestRequest};
use report::{Origin, Out};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Subcommand, Debug)]
pub enum PerfCommand {
    /// Serve tests (sink and generator) one after another.
    Server(ServerArgs),
    /// Run one test against a `hayate perf server`.
    Client(ClientArgs),
}

#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// Address and port for the control connections.
    #[arg(long, default_value = "0.0.0.0:5301")]
    pub listen: SocketAddr,
    /// Key file (`hayate-key-v1 <64 hex>`): every test must prove it; needed for --reverse
    /// and --hayate.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct ClientArgs {
    /// The server: HOST or HOST:PORT (port 5301 by default).
    pub server: String,
    /// Paced UDP datagrams (the default).
    #[arg(long, group = "mode")]
    pub udp: bool,
    /// TCP streams with big socket buffers.
    #[arg(long, group = "mode")]
    pub tcp: bool,
    /// hayate's own transport, memory to memory: what a `hayate cp` would get (needs the key
    /// on both sides).
    #[arg(long, group = "mode")]
    pub hayate: bool,
    /// UDP payload rate in bits/s, suffixes k, M, G (default 100M); with --hayate a cap on
    /// the adaptive rate (default none, `max`).
    #[arg(long, conflicts_with = "interval_us")]
    pub rate: Option<String>,
    /// UDP: fixed gap between datagrams in µs, instead of --rate.
    #[arg(long)]
    pub interval_us: Option<f64>,
    /// UDP payload bytes (default 1472: a 1500-byte IPv4 packet); TCP write size (128 KiB);
    /// hayate: the MTU (1500).
    #[arg(long)]
    pub size: Option<usize>,
    /// Seconds of sending.
    #[arg(long, default_value_t = 10.0)]
    pub time: f64,
    /// TCP streams.
    #[arg(long, default_value_t = 1)]
    pub streams: u32,
    /// The server sends (needs the key on both sides).
    #[arg(long)]
    pub reverse: bool,
    /// One JSON object per line on stdout (intervals, then the summary); text goes to stderr.
    #[arg(long)]
    pub json: bool,
    /// Write throughput (and loss) per second as an SVG chart.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Key file shared with the server.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Test hook: the generator skips every Nth datagram (counted as sent).
    #[arg(long, hide = true, default_value_t = 0)]
    pub drop_every: u64,
    /// Test hook: the generator skips each datagram with this probability (counted as sent).
    #[arg(long, hide = true, default_value_t = 0.0)]
    pub drop_random: f64,
    /// Seed for --drop-random.
    #[arg(long, hide = true, default_value_t = 1)]
    pub seed: u64,
}

#[derive(clap::Args, Debug)]
pub struct MemArgs {
    /// Buffer size (suffixes K, M, G: binary).
    #[arg(long, default_value = "256M")]
    pub size: String,
    /// Threads for the parallel run (default: all CPUs).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Runs of each measurement; the best counts.
    #[arg(long, default_value_t = 5)]
    pub iterations: usize,
    /// JSON lines on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `hayate perf server|client`; returns the process exit code.
pub fn run_perf(cmd: PerfCommand) -> Result<i32> {
    match cmd {
        PerfCommand::Server(a) => server::run(a),
        PerfCommand::Client(a) => client::run(a),
    }
}

/// Runs `hayate bench mem`; returns the process exit code.
pub fn run_bench_mem(args: MemArgs) -> Result<i32> {
    let size = units::parse_size(&args.size)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if args.iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    if !args.json {
        println!(
            "memory bandwidth, {:.1} MB buffers, best of {}",
            size as f64 / 1e6,
            args.iterations
        );
    }
    for r in mem::run(size, threads, args.iterations) {
        if args.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            println!(
                "{} {:>2} thread{}: {:8.1} Gbit/s",
                r.op,
                r.threads,
                if r.threads == 1 { " " } else { "s" },
                // In bits, to set beside a link's rate.
                r.gb_per_s * 8.0
            );
        }
    }
    Ok(0)
}

/// Bound on sequence numbers a sink tracks: twice what the request can produce.
fn seq_limit(r: &TestRequest) -> u64 {
    let expected = (r.time_s * 1e9 / r.interval_ns.max(1) as f64) as u64 + 1;
    expected.saturating_mul(2).clamp(1 << 20, 1 << 34)
}

/// Sender's end of a test: report `done`, show the peer's last lines, wait for its `result`.
fn finish_as_sender(ctl: &Ctl, out: &mut Out, snd: SenderReport) -> Result<ReceiverReport> {
    ctl.send(&Msg::Done(snd))?;
    loop {
        match ctl.recv_timeout(Duration::from_secs(15))? {
            Some(Msg::Interval(r)) => out.interval(Origin::Remote, &r),
            Some(Msg::Result(r)) => return Ok(r),
            Some(m) => bail!("unexpected control message: {m:?}"),
            None => bail!("the receiver sent no result"),
        }
    }
}
