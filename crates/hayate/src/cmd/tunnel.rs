//! `hayate tunnel HOST PORT`: ssh's `ProxyCommand`. ssh's byte stream (our standard input
//! and output) is carried to PORT on HOST as HOST itself sees it (its sshd), over hayate's
//! transport: paced UDP with selective retransmission instead of one TCP connection that
//! halves its window at every loss. The far side is started as `hayate cp` starts it,
//! through the user's own ssh (told `-o ProxyCommand=none`, so it never comes back here).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use hayate_io::driver::tunnel::{self, Outcome, TcpTunnelError, TunnelOptions};
use hayate_io::driver::StopFlag;
use hayate_io::ssh::{shell_quote, SshChild, SshSpec};
use hayate_proto::cc::RateConfig;
use hayate_proto::crypto::Psk;
use hayate_proto::Config;

use super::cp::{rate_config, resolve, Family};
use super::serve::{parse_port_range, DEFAULT_PORT_RANGE};
use crate::units::parse_rate;

pub const AFTER_HELP: &str = "\
Use it as ssh's ProxyCommand, and everything over ssh goes over hayate's transport
(rsync, scp, sftp, git, an interactive shell):
  ssh -o ProxyCommand='hayate tunnel %h %p' host
  rsync -e \"ssh -o ProxyCommand='hayate tunnel %h %p'\" big.iso host:
  in ~/.ssh/config:   Host far-*
                        ProxyCommand hayate tunnel %h %p

The far side is started through your own ssh (with -o ProxyCommand=none) as `hayate serve
--stdio`; hayate must be installed there. It connects to PORT on HOST as HOST itself sees it
(--connect, normally its own sshd). If UDP does not get through within --udp-timeout, the
stream goes straight to HOST:PORT over TCP instead, as without the tunnel.

ssh's own flow control still caps one channel at its window (about 2 MB in OpenSSH) per
round trip: on a 100 ms path, about 20 MB/s per channel.";

#[derive(Args, Debug)]
pub struct TunnelArgs {
    /// The far host ([USER@]HOST): where ssh starts the far side, and whose PORT the stream
    /// reaches (as HOST itself sees it)
    #[arg(value_name = "HOST")]
    pub host: String,
    /// The port on HOST the stream goes to (ssh's %p: its sshd)
    #[arg(value_name = "PORT")]
    pub port: u16,
    /// Where the far side connects, as it resolves the name (its own sshd: localhost)
    #[arg(long, value_name = "ADDR", default_value = "localhost")]
    pub connect: String,
    /// The ssh command that starts the far side, and its options (e.g. 'ssh -i key');
    /// `-o ProxyCommand=none` is added
    #[arg(short = 'e', long = "ssh", value_name = "CMD", default_value = "ssh")]
    pub ssh: String,
    /// The port that ssh connects to (default: PORT)
    #[arg(short = 'P', long = "ssh-port", value_name = "PORT")]
    pub ssh_port: Option<u16>,
    /// hayate's path on the far side, if it is not on the PATH there
    #[arg(long, value_name = "PATH", default_value = "hayate")]
    pub remote_path: String,
    /// UDP ports the far side may listen on (open these in its firewall)
    #[arg(long, value_name = "LOW-HIGH", default_value = DEFAULT_PORT_RANGE, value_parser = parse_port_range)]
    pub port_range: (u16, u16),
    /// Seconds without a UDP answer before the stream goes straight to HOST:PORT over TCP
    #[arg(long, default_value_t = 3.0, value_name = "SECS")]
    pub udp_timeout: f64,
    /// Rate cap in bits/s (k/M/G suffixes); `max` = no cap. The rate itself is found
    /// automatically
    #[arg(long, default_value = "max", value_parser = parse_rate)]
    pub rate: RateConfig,
    /// Never pace below this many bits/s, whatever the path says
    #[arg(long, value_parser = parse_rate, value_name = "RATE")]
    pub rate_min: Option<RateConfig>,
    /// How to share a bottleneck with other traffic: `fair` or `low` (see `hayate cp`)
    #[arg(long, default_value = "fair", value_parser = crate::cmd::cp::parse_policy, value_name = "fair|low")]
    pub policy: hayate_proto::cc::Policy,
    /// Largest IP packet to send, bytes; less when the path carries less (see `hayate cp`)
    #[arg(long, default_value_t = crate::cmd::cp::MTU_LIMIT, value_parser = clap::value_parser!(u16).range(1280..))]
    pub mtu: u16,
    /// IPv4 only (ssh and UDP)
    #[arg(short = '4', conflicts_with = "ipv6")]
    pub ipv4: bool,
    /// IPv6 only (ssh and UDP)
    #[arg(short = '6')]
    pub ipv6: bool,
    /// Say what the tunnel does (on stderr): the ssh command, the UDP address, the end
    #[arg(short, long)]
    pub verbose: bool,
}

impl TunnelArgs {
    fn family(&self) -> Family {
        match (self.ipv4, self.ipv6) {
            (true, _) => Family::V4,
            (_, true) => Family::V6,
            _ => Family::Any,
        }
    }
}

fn note(msg: &str) {
    eprintln!("hayate tunnel: {msg}");
}

/// Takes standard input or output for the tunnel and puts /dev/null in its place: nothing
/// else may read ssh's bytes or write among them, and the copy we keep is the only one, so
/// closing it is what ssh sees as the end.
fn take_std(fd: i32, write: bool) -> anyhow::Result<OwnedFd> {
    // SAFETY: dup of a standard fd; the new fd is ours alone.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        bail!("cannot take fd {fd}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: `dup` is a fresh fd nobody else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(dup) };
    let null = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .open("/dev/null")
        .context("cannot open /dev/null")?;
    // SAFETY: dup2 onto a standard fd number.
    unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd) };
    Ok(owned)
}

pub fn run(a: TunnelArgs) -> anyhow::Result<i32> {
    if !(a.udp_timeout > 0.0 && a.udp_timeout < 3600.0) {
        bail!("--udp-timeout must be more than 0 and less than 3600 seconds");
    }
    let rate = rate_config(a.rate, a.rate_min, false, a.policy)?;
    let stop = StopFlag::new();
    // ssh ends its ProxyCommand with SIGHUP: a clean end, the far side told.
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, stop.inner())?;
    }
    let stdin = take_std(0, false)?;
    let stdout = take_std(1, true)?;

    let (user, host) = match a.host.rsplit_once('@') {
        Some((u, h)) => (Some(u.to_string()), h.to_string()),
        None => (None, a.host.clone()),
    };
    let (psk, udp, child) = start_far_side(&a, user, &host)?;
    let proto = Config {
        mtu: a.mtu,
        rate,
        idle_timeout: Duration::from_secs(15),
        connect_timeout: Duration::from_secs_f64(a.udp_timeout),
        remembered: None,
    };
    let shown = format!("{host}:{}", a.port);
    let (stdin, stdout) = match udp {
        Some(addr) => {
            if a.verbose {
                note(&format!(
                    "the far side listens on UDP {addr}; it connects to {}:{}",
                    a.connect, a.port
                ));
            }
            let opts = TunnelOptions {
                addr,
                psk,
                proto,
                udp_timeout: Duration::from_secs_f64(a.udp_timeout),
                far_host: a.connect.clone(),
                far_port: a.port,
            };
            let (out, stats) = tunnel::run(opts, stdin, stdout, stop.clone());
            if a.verbose {
                note(&format!(
                    "done: {} packets sent ({} retransmitted), {} received",
                    stats.packets_sent, stats.data_packets_retransmitted, stats.packets_received
                ));
            }
            match out {
                Outcome::Done => {
                    child.finish(Duration::from_secs(2));
                    return Ok(0);
                }
                Outcome::Refused(reason) => {
                    child.finish(Duration::from_secs(2));
                    if reason == "connection refused" {
                        bail!("connection refused by {shown} on the far side");
                    }
                    bail!("cannot reach {shown} on the far side: {reason}");
                }
                Outcome::Failed(e) => {
                    child.finish(Duration::from_secs(2));
                    bail!("{e}");
                }
                Outcome::NoUdp { stdin, stdout } => {
                    note(&format!(
                        "no UDP reply from {addr} within {} s (blocked?): connecting to {shown} over TCP instead",
                        a.udp_timeout
                    ));
                    (stdin, stdout)
                }
            }
        }
        None => {
            note(&format!(
                "no address for {host} to send UDP to: connecting to {shown} over TCP instead"
            ));
            (stdin, stdout)
        }
    };
    child.finish(Duration::from_secs(2));
    let addr = resolve(&host, a.port, a.family())?;
    match tunnel::run_tcp(addr, stdin, stdout, stop) {
        Ok(()) => Ok(0),
        Err(TcpTunnelError::Connect(e)) => bail!("cannot connect to {shown} over TCP: {e}"),
        Err(TcpTunnelError::Connection(e)) => bail!("the TCP connection to {shown}: {e}"),
        Err(e) => bail!("{e}"),
    }
}

/// Runs `ssh -o ProxyCommand=none HOST hayate serve --stdio`, reads its banner: the session
/// key, and the UDP address to use (None: none known).
fn start_far_side(
    a: &TunnelArgs,
    user: Option<String>,
    host: &str,
) -> anyhow::Result<(Psk, Option<SocketAddr>, SshChild)> {
    let (command, remote_cmd) = super::far_side_command(&a.ssh, &a.remote_path, a.port_range)?;
    let mut options = vec!["-oProxyCommand=none".to_string()];
    if a.ipv4 {
        options.push("-4".into());
    }
    if a.ipv6 {
        options.push("-6".into());
    }
    let spec = SshSpec {
        command,
        options,
        port: Some(a.ssh_port.unwrap_or(a.port)),
        jump: None,
        user,
        host: host.to_string(),
        remote_cmd,
    };
    if a.verbose {
        let line: Vec<String> = spec.argv().iter().map(|w| shell_quote(w)).collect();
        note(&format!("running {}", line.join(" ")));
    }
    let mut child = SshChild::spawn(&spec, false)?;
    let banner = child.read_banner(Duration::from_secs(120))?;
    let ours = u32::from(hayate_proto::wire::VERSION);
    if banner.version != ours {
        bail!(
            "the far side's hayate speaks version {} and this one {ours}: install the same hayate on both sides",
            banner.version
        );
    }
    let family = a.family();
    let ip: Option<IpAddr> = banner
        .addr
        .filter(|ip| family.admits(*ip))
        .or_else(|| resolve(host, banner.port, family).ok().map(|s| s.ip()));
    Ok((
        Psk::from_bytes(banner.key),
        ip.map(|ip| SocketAddr::new(ip, banner.port)),
        child,
    ))
}
