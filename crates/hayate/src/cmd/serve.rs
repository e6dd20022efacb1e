use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use hayate_io::driver::server::{serve_stdio, serve_with, Rules, Scope, ServerOptions};
use hayate_io::driver::StopFlag;
use hayate_io::ssh::{ssh_connection_server_ip, Banner};
use hayate_proto::cc::RateConfig;
use hayate_proto::Config;

use crate::units::parse_rate;
use crate::KeyArgs;

/// UDP ports the far side of an ssh copy picks from unless told otherwise.
pub const DEFAULT_PORT_RANGE: &str = "5301-5399";

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address and UDP port to listen on
    #[arg(long, default_value = "0.0.0.0:5300", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// UDP port to listen on, on every IPv4 address (--listen 0.0.0.0:PORT)
    #[arg(short, long, value_name = "PORT", conflicts_with_all = ["listen", "stdio"])]
    pub port: Option<u16>,
    /// Directory to serve (required unless --stdio): uploads land beneath it, downloads come
    /// from it, nothing else
    #[arg(long, value_name = "DIR", required_unless_present = "stdio")]
    pub root: Option<PathBuf>,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Most this server sends per session, bits/s (k/M/G) or `max`; clients may ask for less
    #[arg(long, default_value = "max", value_parser = parse_rate)]
    pub rate: RateConfig,
    /// Largest datagram (IP MTU) the server accepts to use
    #[arg(long, default_value_t = 65535, value_parser = clap::value_parser!(u16).range(1280..))]
    pub max_mtu: u16,
    /// Only print errors
    #[arg(short, long)]
    pub quiet: bool,
    /// Be the far side of `hayate cp HOST:PATH` (started by it over ssh): one client, a fresh
    /// session key told over stdout, the user's own file system, gone when stdin closes
    #[arg(long, conflicts_with_all = ["root", "key_file"])]
    pub stdio: bool,
    /// Refuse every removal a client asks for (`hayate cp -r --delete`): uploads still
    /// replace files, nothing beneath --root is deleted
    #[arg(long, conflicts_with = "stdio")]
    pub no_delete: bool,
    /// Threads to spread sessions over (each serves its own sessions, and sessions on two
    /// threads never wait on each other); 0: one per core, at most 8
    #[arg(long, default_value_t = 0, value_name = "N", conflicts_with = "stdio",
          value_parser = clap::value_parser!(u16).range(0..=64))]
    pub threads: u16,
    /// With --stdio: UDP ports to pick from, LOW-HIGH
    #[arg(long, default_value = DEFAULT_PORT_RANGE, value_parser = parse_port_range, value_name = "LOW-HIGH")]
    pub port_range: (u16, u16),
}

pub fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let p = |x: &str| {
        x.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("bad port {x:?} in {s:?}"))
    };
    let (a, b) = (p(a)?, p(b)?);
    if a > b {
        return Err(format!("{s}: the low port is above the high one"));
    }
    Ok((a, b))
}

fn proto(a: &ServeArgs) -> Config {
    Config {
        mtu: a.max_mtu,
        rate: a.rate,
        idle_timeout: Duration::from_secs(15),
        connect_timeout: Duration::from_secs(5),
        remembered: None,
    }
}

pub fn run(a: ServeArgs) -> anyhow::Result<i32> {
    let stop = StopFlag::new();
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, stop.inner())?;
    }
    if a.stdio {
        return run_stdio(a, stop);
    }
    let psk = super::load_key(a.key.key_file.as_deref())?;
    let opts = ServerOptions {
        listen: match a.port {
            Some(port) => SocketAddr::from(([0, 0, 0, 0], port)),
            None => a.listen,
        },
        scope: Scope::Confined(a.root.clone().expect("clap requires --root")),
        psk,
        proto: proto(&a),
        threads: usize::from(a.threads),
    };
    let quiet = a.quiet;
    let mut log = |line: &str| {
        if !quiet {
            eprintln!("hayate serve: {line}");
        }
    };
    let rules = Rules {
        delete: !a.no_delete,
    };
    serve_with(opts, rules, stop, &mut log)?;
    Ok(0)
}

/// Takes fd `fd` for the channel and puts something harmless in its place, so no stray
/// print can corrupt the framed stream.
fn take_fd(fd: i32, replacement: &str, write: bool) -> anyhow::Result<OwnedFd> {
    // SAFETY: dup of a standard fd; the new fd is ours alone.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        bail!("cannot take fd {fd}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: `dup` is a fresh fd nobody else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(dup) };
    let f = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .open(replacement)
        .with_context(|| format!("cannot open {replacement}"))?;
    // SAFETY: dup2 onto a standard fd number.
    unsafe { libc::dup2(f.as_raw_fd(), fd) };
    Ok(owned)
}

fn run_stdio(a: ServeArgs, stop: StopFlag) -> anyhow::Result<i32> {
    let cwd = std::env::current_dir().context("current directory")?;
    let chan_in = take_fd(0, "/dev/null", false)?;
    // Anything printed later goes to stderr (the user's terminal through ssh).
    let chan_out = {
        // SAFETY: dup of fd 1, owned by us.
        let dup = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
        if dup < 0 {
            bail!("cannot take stdout: {}", std::io::Error::last_os_error());
        }
        // SAFETY: fresh fd; fd 2 is a valid fd to copy onto 1.
        unsafe {
            libc::dup2(2, 1);
            OwnedFd::from_raw_fd(dup)
        }
    };
    let addr = ssh_connection_server_ip();
    let mut banner_out = std::fs::File::from(chan_out.try_clone()?);
    let mut announce = |port: u16, psk: &hayate_proto::crypto::Psk| {
        let b = Banner {
            version: u32::from(hayate_proto::wire::VERSION),
            port,
            key: *psk.as_bytes(),
            addr,
        };
        banner_out.write_all(b.format().as_bytes())?;
        banner_out.flush()
    };
    // Every file's failure and the session's own reach the near side, which names them
    // once; the log here would only say them again, through ssh's stderr.
    let mut log = |_: &str| {};
    let cfg = proto(&a);
    serve_stdio(
        Scope::WholeFs(cwd),
        cfg,
        a.port_range,
        (chan_in, chan_out),
        &mut announce,
        stop,
        &mut log,
    )?;
    Ok(0)
}
