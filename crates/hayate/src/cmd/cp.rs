//! `hayate cp`: scp's command line. `[user@]host:path` starts the far side through the user's
//! own ssh (`hayate serve --stdio`, a fresh session key over the channel, no key files);
//! `hayate://host:port/path` talks to a running `hayate serve`.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use hayate_io::driver::client::{self, ClientOptions, Job, Transport, STDIO};
use hayate_io::driver::link::StreamLink;
use hayate_io::driver::StopFlag;
use hayate_io::pathcache;
use hayate_io::ssh::{shell_quote, SshChild, SshSpec};
use hayate_proto::cc::{Policy, RateConfig};
use hayate_proto::control::flags;
use hayate_proto::crypto::Psk;
use hayate_proto::Config;

use super::location::{parse_location, Location};
use super::serve::{parse_port_range, DEFAULT_PORT_RANGE};
use crate::output::Output;
use crate::units::{fmt_bits, parse_bwlimit, parse_kbit, parse_rate};
use crate::KeyArgs;

pub const DEFAULT_PORT: u16 = 5300;
/// Version of the ssh banner and protocol this build speaks.
const BANNER_VERSION: u32 = hayate_proto::wire::VERSION as u32;

/// Examples under `hayate cp --help`: the ssh mode first, as it is the one most users want.
pub const AFTER_HELP: &str = "\
SOURCE and DEST are as with scp: one local, the other remote.
  [USER@]HOST:PATH           over your own ssh (keys, agent, ~/.ssh/config apply); the far
                             side is started as `hayate serve --stdio`, no key file needed
  hayate://HOST[:PORT]/PATH  a running `hayate serve --root DIR` (needs --key-file)

Examples:
  hayate cp big.iso me@server:isos/          upload (relative paths are from the remote home)
  hayate cp me@server:/data/big.iso .        download
  hayate cp -r -p photos/ server:backup/     a tree, with modes and mtimes
  hayate cp -r --delete photos server:bk/    and bk/photos loses what photos no longer has
  hayate cp 'server:logs/*.log' dst/        a pattern, expanded by the far side (no shell)
  tar c dir | hayate cp - server:dir.tar     - is standard input (as SOURCE) or output (as DEST)
  hayate cp --key-file ~/.hayate.key big.iso hayate://server:5300/isos/

Exit codes: 0 all verified (or skipped on purpose), 1 a file failed or the copy could not
start, 2 the command line is wrong, 130 interrupted (128 + the signal).";

/// `--mtu`'s default: jumbo frames. Datagrams bigger than this cost no less CPU per byte on
/// a loopback path, and a lost one costs more.
pub const MTU_LIMIT: u16 = 9000;
#[derive(Args, Debug)]
pub struct CpArgs {
    /// Files to copy: local paths (`-`: standard input), or [USER@]HOST:PATH (ssh) or
    /// hayate://HOST[:PORT]/PATH when DEST is local (`*`, `?`, `[...]` in the last component
    /// are expanded by the far side)
    #[arg(required = true, num_args = 1.., value_name = "SOURCE")]
    pub sources: Vec<String>,
    /// Where they go: [USER@]HOST:PATH (ssh), hayate://HOST[:PORT]/PATH, or a local path
    /// when the sources are remote (`-`: standard output)
    #[arg(required = true, value_name = "DEST")]
    pub dest: String,
    /// Copy directories with everything beneath them (links are copied as links)
    #[arg(short, long)]
    pub recursive: bool,
    /// Preserve modification times and modes
    #[arg(short, long)]
    pub preserve: bool,
    /// Never overwrite an existing destination file
    #[arg(short = 'n', long)]
    pub no_clobber: bool,
    /// Skip files whose destination is already identical (compared by BLAKE3)
    #[arg(short, long, conflicts_with = "no_clobber")]
    pub update: bool,
    /// Send whole files: no delta against a file already at the destination (by default
    /// only the 4 KiB leaves that differ from it are sent)
    #[arg(short = 'W', long)]
    pub whole_file: bool,
    /// Write an existing destination file in place instead of through a temp file renamed
    /// over it (for files too big to have twice): only what differs is written. Until the
    /// copy verifies the file is neither old nor new
    #[arg(long)]
    pub inplace: bool,
    /// A source file that changes while it is sent is sent once more from the start
    /// (opened afresh); only a second change fails it
    #[arg(long)]
    pub retry_changed: bool,
    /// With -r, as rsync --delete: once the whole copy has succeeded, remove from each
    /// directory a source directory was copied to what that source does not have (links as
    /// links, never anything outside it; "deleting PATH" lines). Nothing is removed if
    /// anything failed
    #[arg(long)]
    pub delete: bool,
    /// The ssh command and its options, as with rsync -e (e.g. 'ssh -i key -o Foo=bar')
    #[arg(short = 'e', long = "ssh", value_name = "CMD", default_value = "ssh")]
    pub ssh: String,
    /// ssh port (scp's -P)
    #[arg(short = 'P', long = "ssh-port", value_name = "PORT")]
    pub ssh_port: Option<u16>,
    /// ssh identity (private key) file, passed to ssh as -i
    #[arg(short = 'i', value_name = "KEY")]
    pub identity: Option<String>,
    /// An ssh option, passed to ssh as -o (repeatable), e.g. -o Compression=no
    #[arg(short = 'o', value_name = "OPTION", action = clap::ArgAction::Append)]
    pub ssh_options: Vec<String>,
    /// ssh config file instead of ~/.ssh/config, passed to ssh as -F
    #[arg(short = 'F', value_name = "CONFIG")]
    pub ssh_config: Option<String>,
    /// IPv4 only: for ssh and for hayate's UDP
    #[arg(short = '4', conflicts_with = "ipv6")]
    pub ipv4: bool,
    /// IPv6 only: for ssh and for hayate's UDP
    #[arg(short = '6')]
    pub ipv6: bool,
    /// ssh jump host (scp's -J)
    #[arg(short = 'J', long, value_name = "[USER@]HOST")]
    pub jump: Option<String>,
    /// hayate's path on the far side, if it is not on the PATH there
    #[arg(long, value_name = "PATH", default_value = "hayate")]
    pub remote_path: String,
    /// UDP ports the far side may listen on (open these in its firewall)
    #[arg(long, value_name = "LOW-HIGH", default_value = DEFAULT_PORT_RANGE, value_parser = parse_port_range)]
    pub port_range: (u16, u16),
    /// Carry the data over the ssh channel instead of UDP (for paths that block UDP)
    #[arg(long)]
    pub via_ssh: bool,
    /// Seconds without a UDP answer before falling back to the ssh channel
    #[arg(long, default_value_t = 3.0, value_name = "SECS")]
    pub udp_timeout: f64,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Rate cap in bits/s (k/M/G suffixes); `max` = no cap. The rate itself is found
    /// automatically (or is exactly this with --fixed)
    #[arg(long, default_value = "max", value_parser = parse_rate)]
    pub rate: RateConfig,
    /// Rate cap in Kbit/s, as scp's -l (-l 8000 = 8 Mbit/s); same as --rate
    #[arg(short = 'l', value_name = "KBIT", value_parser = parse_kbit,
          conflicts_with_all = ["rate", "bwlimit"])]
    pub limit: Option<RateConfig>,
    /// Rate cap as rsync's --bwlimit: KiB/s unless a suffix says otherwise (K/M/G = 1024
    /// based, KB/MB/GB = 1000 based, B = bytes/s); 0 = no cap. Same as --rate
    #[arg(long, value_name = "RATE", value_parser = parse_bwlimit, conflicts_with = "rate")]
    pub bwlimit: Option<RateConfig>,
    /// Never pace below this many bits/s, whatever the path says (like Aspera's minimum rate)
    #[arg(long, value_parser = parse_rate, value_name = "RATE")]
    pub rate_min: Option<RateConfig>,
    /// Pace at exactly --rate (`max`: no pacing at all) instead of adapting to the path
    #[arg(long)]
    pub fixed: bool,
    /// How to share a bottleneck with traffic that keeps a queue standing (TCP): `fair`
    /// competes for a share as TCP does, `low` gives way to it (for background jobs)
    #[arg(long, default_value = "fair", value_parser = parse_policy, value_name = "fair|low")]
    pub policy: Policy,
    /// Neither use nor update the paths remembered in ~/.cache/hayate/paths (uploads to a
    /// host seen within the hour start near the rate measured then)
    #[arg(long)]
    pub no_cache: bool,
    /// Largest IP packet to send, bytes. Less is used when the route's interface is smaller
    /// (Ethernet's 1500, a VPN's 1420), and the handshake proves the path carries it,
    /// stepping down to 1500, 1400, then 1280 when it does not
    #[arg(long, default_value_t = MTU_LIMIT, value_parser = clap::value_parser!(u16).range(1280..))]
    pub mtu: u16,
    /// Print a stats line every SECS seconds (to stderr)
    #[arg(long, value_name = "SECS")]
    pub interval: Option<f64>,
    /// Print one JSON summary object on stdout at the end (and nothing else there)
    #[arg(long)]
    pub json: bool,
    /// No progress bar, no summary: only errors
    #[arg(short, long)]
    pub quiet: bool,
    /// Say what hayate does: the ssh command line, the far side's UDP port, the address and
    /// path the data takes, the rate cap; passes -v to ssh too (-vv, -vvv for more of ssh's)
    #[arg(short, long, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Show progress even when stderr is not a terminal, as rsync --progress does: a line
    /// a second (a bar on a terminal, as without it)
    #[arg(long, conflicts_with = "quiet")]
    pub progress: bool,
    /// Seconds to wait for the far side to answer (ssh login not included)
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    pub connect_timeout: f64,
}

impl CpArgs {
    /// --rate, -l or --bwlimit (only one may be given).
    pub fn rate_cap(&self) -> RateConfig {
        self.limit.or(self.bwlimit).unwrap_or(self.rate)
    }

    pub fn family(&self) -> Family {
        match (self.ipv4, self.ipv6) {
            (true, _) => Family::V4,
            (_, true) => Family::V6,
            _ => Family::Any,
        }
    }

    /// The options given to hayate that are ssh's: passed on as they are.
    fn ssh_options(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(i) = &self.identity {
            v.extend(["-i".to_string(), i.clone()]);
        }
        if let Some(f) = &self.ssh_config {
            v.extend(["-F".to_string(), f.clone()]);
        }
        for o in &self.ssh_options {
            v.extend(["-o".to_string(), o.clone()]);
        }
        if self.ipv4 {
            v.push("-4".into());
        }
        if self.ipv6 {
            v.push("-6".into());
        }
        if self.verbose > 0 {
            v.push(format!("-{}", "v".repeat(self.verbose.min(3) as usize)));
        }
        v
    }

    /// SOURCE... DEST as one list, as scp sees them.
    pub fn paths(&self) -> Vec<String> {
        let mut v = self.sources.clone();
        v.push(self.dest.clone());
        v
    }
}

/// Where the far side is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Far {
    Ssh { user: Option<String>, host: String },
    Daemon { host: String, port: u16 },
}

/// Which side is remote, and the job for the driver.
pub fn plan(paths: &[String]) -> anyhow::Result<(Far, Job)> {
    let locs: Vec<Location> = paths
        .iter()
        .map(|p| parse_location(p, DEFAULT_PORT).map_err(anyhow::Error::msg))
        .collect::<Result<_, _>>()?;
    let (srcs, dst) = locs.split_at(locs.len() - 1);
    let far_of = |l: &Location| match l {
        Location::Local(_) => None,
        Location::Ssh { user, host, path } => Some((
            Far::Ssh {
                user: user.clone(),
                host: host.clone(),
            },
            path.clone(),
        )),
        Location::Daemon { host, port, path } => Some((
            Far::Daemon {
                host: host.clone(),
                port: *port,
            },
            path.clone(),
        )),
    };
    match (&dst[0], far_of(&dst[0])) {
        (_, Some((far, path))) => {
            let mut sources = Vec::new();
            for s in srcs {
                match s {
                    Location::Local(p) => sources.push(p.clone()),
                    _ => bail!(
                        "copying between two remote places is not supported: one side must be local"
                    ),
                }
            }
            if sources.len() > 1 {
                let dir = path.trim_end_matches('/');
                refuse_duplicates(
                    sources.iter().map(|p| {
                        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
                        (p.display().to_string(), name.unwrap_or_default())
                    }),
                    |n| {
                        if dir.is_empty() {
                            n.to_string()
                        } else {
                            format!("{dir}/{n}")
                        }
                    },
                )?;
            }
            Ok((
                far,
                Job::Upload {
                    sources,
                    dest: path,
                },
            ))
        }
        (Location::Local(dest), None) => {
            let mut far: Option<Far> = None;
            let mut sources = Vec::new();
            for s in srcs {
                let Some((f, path)) = far_of(s) else {
                    bail!("one side must be remote ([USER@]HOST:PATH or hayate://HOST/PATH) and the other local");
                };
                if far.as_ref().is_some_and(|x| *x != f) {
                    bail!("all remote sources must be on the same host");
                }
                far = Some(f);
                // The far side's home (or the served root), as scp treats `host:`.
                sources.push(if path.is_empty() {
                    ".".to_string()
                } else {
                    path
                });
            }
            let far = far.expect("at least one source");
            if sources.len() > 1 {
                // A pattern's matches are checked by the client once the far side says what
                // they are.
                refuse_duplicates(
                    sources
                        .iter()
                        .filter(|p| !hayate_io::glob::is_pattern(p))
                        .map(|p| {
                            (
                                p.clone(),
                                p.trim_end_matches('/')
                                    .rsplit('/')
                                    .next()
                                    .unwrap_or_default()
                                    .to_string(),
                            )
                        }),
                    |n| dest.join(n).display().to_string(),
                )?;
            }
            Ok((
                far,
                Job::Download {
                    sources,
                    dest: dest.clone(),
                },
            ))
        }
        _ => unreachable!("a location is local or remote"),
    }
}

/// Several sources land in one directory under their own names: two with the same name
/// would race on one temp file, so refuse before anything is written.
fn refuse_duplicates(
    named: impl Iterator<Item = (String, String)>,
    dest: impl Fn(&str) -> String,
) -> anyhow::Result<()> {
    let mut seen = std::collections::HashMap::new();
    for (src, name) in named {
        if let Some(prev) = seen.insert(name.clone(), src.clone()) {
            bail!("{prev} and {src} would both be copied to {}", dest(&name));
        }
    }
    Ok(())
}

/// Which addresses UDP may use (-4, -6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Any,
    V4,
    V6,
}

impl Family {
    pub fn admits(self, ip: IpAddr) -> bool {
        match self {
            Family::Any => true,
            Family::V4 => ip.is_ipv4(),
            Family::V6 => ip.is_ipv6(),
        }
    }
}

pub fn resolve(host: &str, port: u16, family: Family) -> anyhow::Result<SocketAddr> {
    let mut addrs = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {host}"))?;
    match family {
        Family::Any => addrs.next(),
        f => addrs.find(|a| f.admits(a.ip())),
    }
    .with_context(|| match family {
        Family::Any => format!("no address for {host}"),
        Family::V4 => format!("no IPv4 address for {host} (-4)"),
        Family::V6 => format!("no IPv6 address for {host} (-6)"),
    })
}

/// `key_from_env`: `--key-file` came from `HAYATE_KEY_FILE`, which an ssh copy ignores.
pub fn run(a: CpArgs, key_from_env: bool) -> anyhow::Result<i32> {
    let json = a.json;
    let r = copy(a, key_from_env);
    // A copy that could not start still owes --json its one object.
    if let (true, Err(e)) = (json, &r) {
        println!("{}", crate::output::error_json(&format!("{e:#}")));
    }
    r
}

fn copy(a: CpArgs, key_from_env: bool) -> anyhow::Result<i32> {
    check_args(&a, key_from_env).map_err(|e| crate::Usage(format!("{e:#}")))?;
    let (far, job) = plan(&a.paths())?;
    let rate = rate_config(a.rate_cap(), a.rate_min, a.fixed, a.policy)?;
    let stop = StopFlag::new();
    // Which signal stopped the copy decides the exit code, as a shell reports it (128 + n).
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.inner())?;
        let seen = interrupted.clone();
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            signal_hook::low_level::register(sig, move || {
                seen.store(sig, std::sync::atomic::Ordering::SeqCst)
            })?;
        }
    }
    let mut proto = Config {
        mtu: a.mtu,
        rate,
        idle_timeout: Duration::from_secs(15),
        connect_timeout: Duration::from_secs_f64(a.connect_timeout),
        remembered: None,
    };
    let mut fl = 0;
    if a.preserve {
        fl |= flags::PRESERVE;
    }
    if a.no_clobber {
        fl |= flags::NO_CLOBBER;
    }
    if a.update {
        fl |= flags::UPDATE;
    }
    if a.whole_file {
        fl |= flags::WHOLE_FILE;
    }
    if a.inplace {
        fl |= flags::INPLACE;
    }
    let mut out = Output::new(a.quiet, a.json, a.interval, a.progress);
    if a.verbose > 0 {
        out.note_line(&match rate {
            RateConfig::Adaptive { max: Some(m), .. } => {
                format!("rate: found by itself, capped at {}", fmt_bits(m as f64))
            }
            RateConfig::Adaptive { max: None, .. } => "rate: found by itself, no cap".into(),
            RateConfig::Fixed(r) => format!("rate: fixed at {}", fmt_bits(r as f64)),
            RateConfig::Unlimited => "rate: unpaced".into(),
        });
    }

    // Standard input is read to its end first: the offer needs its size, the BLAKE3 is of
    // all of it, and a slow producer cannot stall the session meanwhile.
    let stdin = if writes_stdin(&a) {
        Some(spool_stdin()?)
    } else {
        None
    };
    let (transport, psk, ssh) = match &far {
        Far::Daemon { host, port } => {
            let psk = super::load_key(a.key.key_file.as_deref())?;
            let addr = resolve(host, *port, a.family())?;
            if a.verbose > 0 {
                out.note_line(&format!("server {host}:{port} is {addr}: data over UDP"));
            }
            (Transport::Udp(addr), psk, None)
        }
        Far::Ssh { user, host } => {
            let (t, psk, child) = start_far_side(&a, user.clone(), host, &mut out)?;
            (t, psk, Some(child))
        }
    };
    // Careful resume: an upload to a host seen within the hour starts near the rate it
    // measured then (the client is the sender only in uploads).
    let upload = matches!(job, Job::Upload { .. });
    let peer_ip = match &transport {
        Transport::Udp(addr) | Transport::UdpThenStream { addr, .. } => Some(addr.ip()),
        Transport::Stream(_) => None,
    };
    let cache = (!a.no_cache && upload && matches!(rate, RateConfig::Adaptive { .. }))
        .then(pathcache::default_path)
        .flatten()
        .zip(peer_ip);
    if let Some((file, ip)) = &cache {
        proto.remembered = pathcache::lookup(file, *ip);
        if let (Some(p), true) = (proto.remembered, a.verbose > 0) {
            out.note_line(&format!(
                "remembered path to {ip}: {} at {:.1} ms RTT, {} s ago (starting near it once the path confirms; --no-cache not to)",
                fmt_bits(p.rate as f64),
                p.min_rtt_us as f64 / 1000.0,
                p.age_us / 1_000_000
            ));
        }
    }
    let opts = ClientOptions {
        path: transport,
        psk,
        proto,
        flags: fl,
        recursive: a.recursive,
        stdin,
        stdout: reads_stdout(&a),
        retry_changed: a.retry_changed,
        delete: a.delete,
    };
    let report = client::run(opts, job, stop, &mut out);
    if let (Some((file, ip)), Some(m), true) = (&cache, report.measured, report.all_verified()) {
        // A cache that cannot be written is only a slower start next time.
        if let Err(e) = pathcache::store(file, *ip, m) {
            if a.verbose > 0 {
                out.note_line(&format!(
                    "cannot remember the path in {}: {e}",
                    file.display()
                ));
            }
        } else if a.verbose > 0 {
            out.note_line(&format!(
                "remembered the path to {ip}: {} at {:.1} ms RTT",
                fmt_bits(m.rate as f64),
                m.min_rtt_us as f64 / 1000.0
            ));
        }
    }
    if a.verbose > 0 && report.via_stream {
        out.note_line("the data went over the ssh channel");
    } else if a.verbose > 0 && report.stats.mtu > 0 {
        out.note_line(&format!(
            "the data went over UDP, path MTU {} bytes (proven by the handshake)",
            report.stats.mtu
        ));
    }
    out.finish(&report);
    if let Some(child) = ssh {
        child.finish(Duration::from_secs(5));
    }
    let signal = interrupted.load(std::sync::atomic::Ordering::SeqCst);
    Ok(if signal != 0 {
        128 + signal
    } else if report.all_verified() {
        0
    } else {
        1
    })
}

/// `hayate cp - DEST`: the one source is standard input.
fn writes_stdin(a: &CpArgs) -> bool {
    a.sources.iter().any(|s| s == STDIO)
}

/// `hayate cp SRC -`: the destination is standard output.
fn reads_stdout(a: &CpArgs) -> bool {
    a.dest == STDIO
}

/// Standard input, read to its end into an unnamed temp file in `$TMPDIR`.
fn spool_stdin() -> anyhow::Result<std::fs::File> {
    let mut f = hayate_io::fs::spill_file()
        .context("no temporary file to hold standard input ($TMPDIR)")?;
    std::io::copy(&mut std::io::stdin().lock(), &mut f).context("reading standard input")?;
    Ok(f)
}

/// What is wrong with the command line itself (exit code 2, as clap's own errors).
fn check_args(a: &CpArgs, key_from_env: bool) -> anyhow::Result<()> {
    if writes_stdin(a) && a.sources.len() > 1 {
        bail!("- (standard input) must be the only SOURCE");
    }
    if reads_stdout(a) {
        if a.sources.len() > 1 {
            bail!("- (standard output) takes one SOURCE");
        }
        if a.sources.iter().any(|s| hayate_io::glob::is_pattern(s)) {
            bail!("- (standard output) takes one file, not a pattern");
        }
        for (set, opt) in [
            (a.recursive, "-r"),
            (a.no_clobber, "-n"),
            (a.update, "-u"),
            (a.json, "--json"),
        ] {
            if set {
                bail!("{opt} cannot be used with - (standard output) as DEST");
            }
        }
    }
    if a.delete && !a.recursive {
        bail!("--delete needs -r (it removes what a copied directory's source lacks)");
    }
    let (far, _) = plan(&a.paths())?;
    if !(a.connect_timeout > 0.0 && a.connect_timeout < 3600.0) {
        bail!("--connect-timeout must be more than 0 and less than 3600 seconds");
    }
    if !(a.udp_timeout > 0.0 && a.udp_timeout < 3600.0) {
        bail!("--udp-timeout must be more than 0 and less than 3600 seconds");
    }
    rate_config(a.rate_cap(), a.rate_min, a.fixed, a.policy)?;
    match far {
        Far::Daemon { .. } if a.via_ssh => {
            bail!("--via-ssh needs an ssh destination (HOST:PATH), not hayate://")
        }
        Far::Ssh { .. } if a.key.key_file.is_some() && !key_from_env => {
            bail!("--key-file is for hayate:// servers; over ssh a fresh key is made for each copy")
        }
        _ => Ok(()),
    }
}

/// Runs `ssh HOST hayate serve --stdio`, reads its banner, and picks the data path.
fn start_far_side(
    a: &CpArgs,
    user: Option<String>,
    host: &str,
    out: &mut Output,
) -> anyhow::Result<(Transport, Psk, SshChild)> {
    let (command, remote_cmd) = super::far_side_command(&a.ssh, &a.remote_path, a.port_range)?;
    let spec = SshSpec {
        command,
        options: a.ssh_options(),
        port: a.ssh_port,
        jump: a.jump.clone(),
        user,
        host: host.to_string(),
        remote_cmd,
    };
    if a.verbose > 0 {
        let line: Vec<String> = spec.argv().iter().map(|w| shell_quote(w)).collect();
        out.note_line(&format!("running {}", line.join(" ")));
    }
    let mut child = SshChild::spawn(&spec, a.quiet)?;
    // Long enough for a password prompt or a slow jump host.
    let banner = child.read_banner(Duration::from_secs(120))?;
    if banner.version != BANNER_VERSION {
        bail!(
            "the far side's hayate speaks version {} and this one {BANNER_VERSION}: install the same hayate on both sides",
            banner.version
        );
    }
    let psk = Psk::from_bytes(banner.key);
    let (wr, rd, pending) = child.channel();
    let stream = StreamLink::new(rd, wr, pending)?;
    if a.verbose > 0 {
        out.note_line(&format!(
            "the far side listens on UDP port {} (its address as ssh reached it: {})",
            banner.port,
            banner
                .addr
                .map_or("unknown".to_string(), |ip| ip.to_string())
        ));
    }
    if a.via_ssh {
        if a.verbose > 0 {
            out.note_line("data over the ssh channel (--via-ssh)");
        }
        return Ok((Transport::Stream(stream), psk, child));
    }
    // The far side's own view of its address (from SSH_CONNECTION) works for ssh aliases;
    // otherwise resolve the name as given.
    let family = a.family();
    let ip: Option<IpAddr> = banner
        .addr
        .filter(|ip| family.admits(*ip))
        .or_else(|| resolve(host, banner.port, family).ok().map(|s| s.ip()));
    if a.verbose > 0 {
        if let Some(ip) = ip {
            out.note_line(&format!(
                "data over UDP to {}, or the ssh channel if nothing answers within {} s",
                SocketAddr::new(ip, banner.port),
                a.udp_timeout
            ));
        }
    }
    let t = match ip {
        Some(ip) => Transport::UdpThenStream {
            addr: SocketAddr::new(ip, banner.port),
            stream,
            after: Duration::from_secs_f64(a.udp_timeout),
        },
        None => {
            out.note_line(&format!(
                "no address for {host} to send UDP to: carrying the data over the ssh channel (slower)"
            ));
            Transport::Stream(stream)
        }
    };
    Ok((t, psk, child))
}

/// Combine --rate, --rate-min and --fixed into what the engine runs.
pub fn rate_config(
    rate: RateConfig,
    rate_min: Option<RateConfig>,
    fixed: bool,
    policy: Policy,
) -> anyhow::Result<RateConfig> {
    let as_bytes = |r: RateConfig| match r {
        RateConfig::Fixed(b) => Some(b),
        _ => None,
    };
    if fixed {
        if rate_min.is_some() {
            bail!("--rate-min makes no sense with --fixed");
        }
        if policy != Policy::Fair {
            bail!("--policy makes no sense with --fixed");
        }
        return Ok(rate);
    }
    let max = as_bytes(rate);
    let min = rate_min.and_then(as_bytes).unwrap_or(0);
    if let Some(m) = max {
        if min > m {
            bail!("--rate-min is above --rate");
        }
    }
    Ok(RateConfig::Adaptive { max, min, policy })
}

/// `--policy`'s values.
pub fn parse_policy(s: &str) -> Result<Policy, String> {
    Policy::from_name(s).ok_or_else(|| format!("unknown policy `{s}` (known: fair, low)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> anyhow::Result<(Far, Job)> {
        plan(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn planning() {
        let (far, job) = p(&["a/x.bin", "b", "me@host:dir/"]).unwrap();
        assert_eq!(
            far,
            Far::Ssh {
                user: Some("me".into()),
                host: "host".into()
            }
        );
        assert!(
            matches!(job, Job::Upload { ref sources, ref dest } if sources.len() == 2 && dest == "dir/")
        );
        let (far, job) = p(&["hayate://h:99/x", "hayate://h:99/y", "out"]).unwrap();
        assert_eq!(
            far,
            Far::Daemon {
                host: "h".into(),
                port: 99
            }
        );
        assert!(matches!(job, Job::Download { ref sources, .. } if sources == &["x", "y"]));
        let (_, job) = p(&["host:", "."]).unwrap();
        assert!(matches!(job, Job::Download { ref sources, .. } if sources == &["."]));
        assert!(p(&["a", "b"]).is_err(), "both local");
        assert!(p(&["h1:a", "h2:b", "out"]).is_err(), "two hosts");
        assert!(p(&["h1:a", "h1:b"]).is_err(), "both remote");
        assert!(p(&["a", "hayate://h:port/x"]).is_err(), "bad port");
    }
}
