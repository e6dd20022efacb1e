//! Development driver (the `hayate` binary wires the same calls):
//! `cargo run -p hayate-perf --bin hayate-perf-dev -- client 127.0.0.1 --udp`.
use clap::Parser;

#[derive(Parser)]
enum Cmd {
    #[command(flatten)]
    Perf(hayate_perf::PerfCommand),
    /// `hayate bench mem`
    Mem(hayate_perf::MemArgs),
}

fn main() {
    let r = match Cmd::parse() {
        Cmd::Perf(c) => hayate_perf::run_perf(c),
        Cmd::Mem(a) => hayate_perf::run_bench_mem(a),
    };
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1)
        }
    }
}
