//! `hayate`: fast file transfer over long, lossy links. This file only parses the command
//! line and dispatches; each subcommand lives in `cmd/`.

mod cmd;
mod output;
mod units;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "hayate",
    version,
    about = "Move files at line rate over long, lossy links (encrypted, verified, paced UDP)",
    after_help = "\
Copy as with scp, through your own ssh (hayate installed on both sides, nothing else):
  hayate cp big.iso me@server:isos/        upload
  hayate cp me@server:/data/big.iso .      download
Any ssh session over hayate's transport (rsync, scp, sftp, git, a shell):
  ssh -o ProxyCommand='hayate tunnel %h %p' server
Or with a standing server and a pre-shared key:
  hayate cp --key-file KEY big.iso hayate://server:5300/isos/

See `hayate cp --help`, `hayate man`."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand, Debug)]
// Built once per run from the command line: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Copy files as scp does: to or from [USER@]HOST:PATH over your own ssh, or
    /// hayate://HOST[:PORT]/PATH on a running `hayate serve`
    #[command(
        override_usage = "hayate cp [OPTIONS] SOURCE... DEST",
        after_help = cmd::cp::AFTER_HELP
    )]
    Cp(cmd::cp::CpArgs),
    /// ssh's ProxyCommand: any ssh session (rsync, scp, sftp, git, a shell) over hayate's
    /// transport to PORT on HOST
    #[command(
        override_usage = "hayate tunnel [OPTIONS] HOST PORT\n       \
                          ssh -o ProxyCommand='hayate tunnel %h %p' HOST",
        after_help = cmd::tunnel::AFTER_HELP
    )]
    Tunnel(cmd::tunnel::TunnelArgs),
    /// Write a fresh random 256-bit key (mode 0600)
    Keygen {
        /// Where to write the key (or as --out FILE)
        #[arg(value_name = "FILE", required_unless_present = "out")]
        file: Option<PathBuf>,
        /// Where to write the key
        #[arg(long, short = 'o', value_name = "FILE", conflicts_with = "file")]
        out: Option<PathBuf>,
        /// Overwrite an existing file
        #[arg(long)]
        force: bool,
    },
    /// Serve uploads into and downloads out of a directory (for hayate:// copies)
    #[command(
        override_usage = "hayate serve --root DIR [--key-file FILE] [OPTIONS]\n       \
                                hayate serve --stdio [OPTIONS]    (started by `hayate cp` over ssh)"
    )]
    Serve(cmd::serve::ServeArgs),
    /// Probe a path: what it carries over UDP, TCP and hayate's own transport
    #[command(subcommand)]
    Perf(hayate_perf::PerfCommand),
    /// Measure this host
    #[command(subcommand)]
    Bench(BenchCommand),
    /// List the partial copies interrupted transfers left beneath PATH (--delete: remove them)
    Clean(cmd::clean::CleanArgs),
    /// Print the manual page (roff): `hayate man | man -l -`
    Man,
    /// Print shell completions: `hayate completions bash > /etc/bash_completion.d/hayate`
    Completions {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Memory copy and fill bandwidth: the ceiling of any transfer on this host
    Mem(hayate_perf::MemArgs),
}

/// Shared by commands that need the pre-shared key.
#[derive(Args, Debug, Clone)]
pub struct KeyArgs {
    /// Pre-shared key file (from `hayate keygen`), for hayate:// servers
    #[arg(long, env = "HAYATE_KEY_FILE", value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

/// A mistake on the command line found after parsing: exit code 2, as clap's own.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// `hayate cp ... --json ...`: a command line clap refused still gets its JSON object.
fn wants_json(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    let args: Vec<_> = args.take_while(|a| a != "--").collect();
    args.first().is_some_and(|a| a == "cp") && args.iter().any(|a| a == "--json")
}

fn main() -> ExitCode {
    let matches = Cli::command().try_get_matches().unwrap_or_else(|e| {
        if e.use_stderr() && wants_json(std::env::args_os().skip(1)) {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            let msg = first.strip_prefix("error: ").unwrap_or(first);
            println!("{}", output::error_json(msg));
        }
        e.exit()
    });
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // HAYATE_KEY_FILE is for hayate:// servers: an ssh copy ignores it, and only refuses a
    // --key-file given on the command line.
    let key_from_env = matches
        .subcommand_matches("cp")
        .is_some_and(|m| m.value_source("key_file") == Some(ValueSource::EnvVariable));
    let result = match cli.cmd {
        Command::Keygen { file, out, force } => {
            // clap requires one of them.
            let out = file.or(out).unwrap_or_default();
            cmd::keygen::run(&out, force)
        }
        Command::Serve(a) => cmd::serve::run(a),
        Command::Cp(a) => cmd::cp::run(a, key_from_env),
        Command::Tunnel(a) => cmd::tunnel::run(a),
        Command::Perf(c) => hayate_perf::run_perf(c),
        Command::Bench(BenchCommand::Mem(a)) => hayate_perf::run_bench_mem(a),
        Command::Clean(a) => cmd::clean::run(a),
        Command::Man => {
            let mut page = Vec::new();
            cmd::docs::man(Cli::command(), &mut page)
                .and_then(|()| cmd::docs::print(&page))
                .map(|()| 0)
                .map_err(anyhow::Error::from)
        }
        Command::Completions { shell } => {
            cmd::docs::print(&cmd::docs::completions(shell, Cli::command()))
                .map(|()| 0)
                .map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            // One write: stderr is unbuffered, and `eprintln!` writes each piece of the
            // message on its own, so the ssh beside us (same terminal) could land in the
            // middle of it ("hayate is not installed on kex_exchange_identification: ...").
            use std::io::Write;
            let msg = format!("hayate: {e:#}\n");
            let _ = std::io::stderr().write_all(msg.as_bytes());
            ExitCode::from(if e.is::<Usage>() { 2 } else { 1 })
        }
    }
}
