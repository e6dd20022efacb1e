//! `hayate cp`: scp-like copies to and from a `hayate serve`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use hayate_io::driver::client::{self, ClientOptions, Transfer};
use hayate_io::driver::StopFlag;
use hayate_proto::cc::RateConfig;
use hayate_proto::Config;

use crate::output::Output;
use crate::units::parse_rate;
use crate::KeyArgs;

pub const DEFAULT_PORT: u16 = 5300;

#[derive(Args, Debug)]
pub struct CpArgs {
    /// SRC... DST, where either the sources or DST are hayate://HOST[:PORT]/PATH
    #[arg(required = true, num_args = 2.., value_name = "SRC... DST")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Rate cap in bits/s (k/M/G suffixes); `max` = no cap. The rate itself is found
    /// automatically (or is exactly this with --fixed)
    #[arg(long, default_value = "max", value_parser = parse_rate)]
    pub rate: RateConfig,
    /// Never pace below this many bits/s, whatever the path says (like Aspera's minimum rate)
    #[arg(long, value_parser = parse_rate, value_name = "RATE")]
    pub rate_min: Option<RateConfig>,
    /// Pace at exactly --rate (`max`: no pacing at all) instead of adapting to the path
    #[arg(long)]
    pub fixed: bool,
    /// Path MTU in bytes: no datagram is bigger
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u16).range(1280..))]
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
    /// Seconds to wait for the server to answer
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    pub connect_timeout: f64,
}

/// A parsed `hayate://host:port/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub host: String,
    pub port: u16,
    pub path: String,
}

pub fn parse_remote(s: &str) -> Option<Result<Remote, String>> {
    let rest = s.strip_prefix("hayate://")?;
    Some((|| {
        let (hostport, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let (h, p) = h
                .split_once(']')
                .ok_or_else(|| format!("{s}: unclosed [ in IPv6 address"))?;
            (h.to_string(), p.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (hostport.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(format!("{s}: no host"));
        }
        let port = match port {
            None | Some("") => DEFAULT_PORT,
            Some(p) => p.parse().map_err(|_| format!("{s}: bad port {p:?}"))?,
        };
        Ok(Remote {
            host,
            port,
            path: path.to_string(),
        })
    })())
}

fn resolve(r: &Remote) -> anyhow::Result<SocketAddr> {
    (r.host.as_str(), r.port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {}", r.host))?
        .next()
        .with_context(|| format!("no address for {}", r.host))
}

fn basename(p: &str) -> String {
    p.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Work out which files go where.
pub fn plan(paths: &[String]) -> anyhow::Result<(Remote, Vec<Transfer>)> {
    let (srcs, dst) = paths.split_at(paths.len() - 1);
    let dst = &dst[0];
    let remote_srcs: Vec<_> = srcs.iter().filter_map(|s| parse_remote(s)).collect();
    match parse_remote(dst) {
        Some(r) => {
            let r = r.map_err(anyhow::Error::msg)?;
            if !remote_srcs.is_empty() {
                bail!("copying between two remote places is not supported: one side must be local");
            }
            let into_dir = srcs.len() > 1 || r.path.is_empty() || r.path.ends_with('/');
            let transfers: Vec<Transfer> = srcs
                .iter()
                .map(|s| {
                    let name = basename(s);
                    let remote = if into_dir {
                        if r.path.is_empty() || r.path.ends_with('/') {
                            format!("{}{}", r.path, name)
                        } else {
                            format!("{}/{}", r.path, name)
                        }
                    } else {
                        r.path.clone()
                    };
                    Transfer::Upload {
                        local: PathBuf::from(s),
                        remote,
                    }
                })
                .collect();
            refuse_duplicates(&transfers)?;
            Ok((r, transfers))
        }
        None => {
            if remote_srcs.len() != srcs.len() {
                bail!("one side must be remote (hayate://HOST:PORT/PATH) and the other local");
            }
            let remotes: Vec<Remote> = remote_srcs
                .into_iter()
                .collect::<Result<_, _>>()
                .map_err(anyhow::Error::msg)?;
            let first = remotes[0].clone();
            if remotes
                .iter()
                .any(|r| r.host != first.host || r.port != first.port)
            {
                bail!("all remote sources must be on the same server");
            }
            let dst_path = Path::new(dst);
            let into_dir = remotes.len() > 1 || dst.ends_with('/') || dst_path.is_dir();
            if remotes.len() > 1 && !dst_path.is_dir() {
                bail!("{dst}: not a directory (several sources need a directory destination)");
            }
            let mut transfers = Vec::new();
            for r in &remotes {
                if r.path.is_empty() || r.path.ends_with('/') {
                    bail!(
                        "hayate://{}:{}/{}: names a directory; give a file path",
                        r.host,
                        r.port,
                        r.path
                    );
                }
                let local = if into_dir {
                    dst_path.join(basename(&r.path))
                } else {
                    dst_path.to_path_buf()
                };
                transfers.push(Transfer::Download {
                    remote: r.path.clone(),
                    local,
                });
            }
            refuse_duplicates(&transfers)?;
            Ok((first, transfers))
        }
    }
}

/// Two sources with the same destination would race on one temp file: refuse up front.
fn refuse_duplicates(transfers: &[Transfer]) -> anyhow::Result<()> {
    let mut seen = std::collections::HashMap::new();
    for t in transfers {
        let (src, dst) = match t {
            Transfer::Upload { local, remote } => (local.display().to_string(), remote.clone()),
            Transfer::Download { remote, local } => (remote.clone(), local.display().to_string()),
        };
        if let Some(prev) = seen.insert(dst.clone(), src.clone()) {
            bail!("{prev} and {src} would both be copied to {dst}");
        }
    }
    Ok(())
}

pub fn run(a: CpArgs) -> anyhow::Result<i32> {
    let (remote, transfers) = plan(&a.paths)?;
    let psk = super::load_key(a.key.key_file.as_deref())?;
    let server = resolve(&remote)?;
    if !(a.connect_timeout > 0.0 && a.connect_timeout < 3600.0) {
        bail!("--connect-timeout must be between 0 and 3600 seconds");
    }
    let rate = rate_config(a.rate, a.rate_min, a.fixed)?;
    let stop = StopFlag::new();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.inner())?;
    }
    let opts = ClientOptions {
        server,
        psk,
        proto: Config {
            mtu: a.mtu,
            rate,
            idle_timeout: Duration::from_secs(15),
            connect_timeout: Duration::from_secs_f64(a.connect_timeout),
        },
    };
    let mut out = Output::new(a.quiet, a.json, a.interval);
    let report = client::run(opts, transfers, stop, &mut |p| out.progress(p));
    out.finish(&report);
    Ok(if report.all_verified() { 0 } else { 1 })
}

/// Combine --rate, --rate-min and --fixed into what the engine runs.
pub fn rate_config(
    rate: RateConfig,
    rate_min: Option<RateConfig>,
    fixed: bool,
) -> anyhow::Result<RateConfig> {
    let as_bytes = |r: RateConfig| match r {
        RateConfig::Fixed(b) => Some(b),
        _ => None,
    };
    if fixed {
        if rate_min.is_some() {
            bail!("--rate-min makes no sense with --fixed");
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
    Ok(RateConfig::Adaptive { max, min })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remotes() {
        let r = parse_remote("hayate://h:99/a/b").unwrap().unwrap();
        assert_eq!((r.host.as_str(), r.port, r.path.as_str()), ("h", 99, "a/b"));
        let r = parse_remote("hayate://[::1]:7/x").unwrap().unwrap();
        assert_eq!((r.host.as_str(), r.port, r.path.as_str()), ("::1", 7, "x"));
        let r = parse_remote("hayate://host").unwrap().unwrap();
        assert_eq!((r.port, r.path.as_str()), (DEFAULT_PORT, ""));
        assert!(parse_remote("hayate://:5/x").unwrap().is_err());
        assert!(parse_remote("hayate://h:port/x").unwrap().is_err());
        assert!(parse_remote("/local").is_none());
    }

    #[test]
    fn planning() {
        let p = |v: &[&str]| plan(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let (_, t) = p(&["a/x.bin", "hayate://h/dir/"]).unwrap();
        assert!(matches!(&t[0], Transfer::Upload { remote, .. } if remote == "dir/x.bin"));
        let (_, t) = p(&["a/x.bin", "hayate://h/y.bin"]).unwrap();
        assert!(matches!(&t[0], Transfer::Upload { remote, .. } if remote == "y.bin"));
        let (_, t) = p(&["a", "b", "hayate://h/d"]).unwrap();
        assert!(matches!(&t[1], Transfer::Upload { remote, .. } if remote == "d/b"));
        let (_, t) = p(&["a", "b", "hayate://h/"]).unwrap();
        assert!(matches!(&t[1], Transfer::Upload { remote, .. } if remote == "b"));
        assert!(p(&["x/a", "y/a", "hayate://h/d/"]).is_err());
        assert!(p(&["hayate://h/x/a", "hayate://h/y/a", "/tmp"]).is_err());
        assert!(p(&["a", "b"]).is_err());
        assert!(p(&["hayate://h/a", "hayate://h/b"]).is_err());
        assert!(p(&["hayate://h/", "out"]).is_err());
    }
}
