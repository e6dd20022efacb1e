//! `hayate perf client`: asks the server for one test, runs our side, prints both views.

use crate::auth::{random_bytes, Key};
use crate::ctl::{Ctl, Mode, Msg, TestRequest, VERSION};
use crate::report::{Out, Summary};
use crate::units::{hex, parse_rate, unhex};
use crate::{finish_as_sender, hayate, seq_limit, tcp, udp, ClientArgs};
use anyhow::{anyhow, bail, Context, Result};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

pub const DEFAULT_PORT: u16 = 5301;
/// UDP payload that fills a 1500-byte IPv4 packet.
pub const DEFAULT_UDP_SIZE: usize = 1472;
pub const DEFAULT_TCP_WRITE: usize = 128 << 10;
pub const DEFAULT_RATE: u64 = 100_000_000;

fn resolve(s: &str) -> Result<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Ok(ip) = s.trim_matches(|c| c == '[' || c == ']').parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_PORT));
    }
    let with_port = match s.rsplit_once(':') {
        Some((_, p)) if p.parse::<u16>().is_ok() => s.to_string(),
        _ => format!("{s}:{DEFAULT_PORT}"),
    };
    with_port
        .to_socket_addrs()
        .with_context(|| format!("resolving {s}"))?
        .next()
        .ok_or_else(|| anyhow!("{s} has no address"))
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Udp => "udp",
        Mode::Tcp => "tcp",
        Mode::Hayate => "hayate",
    }
}

pub fn run(a: ClientArgs) -> Result<i32> {
    let mode = if a.tcp {
        Mode::Tcp
    } else if a.hayate {
        Mode::Hayate
    } else {
        Mode::Udp
    };
    if !(a.time > 0.0 && a.time <= 3600.0) {
        bail!("--time must be in (0, 3600] seconds");
    }
    if mode == Mode::Hayate {
        if a.key_file.is_none() {
            bail!("{}", hayate::NEEDS_KEY);
        }
        if a.interval_us.is_some() {
            bail!("--interval-us does not apply to --hayate: it finds its rate (--rate is a cap)");
        }
        if a.drop_every > 0 || a.drop_random > 0.0 {
            bail!("the loss test hooks apply to --udp only");
        }
    }
    let size = a.size.unwrap_or(match mode {
        Mode::Tcp => DEFAULT_TCP_WRITE,
        Mode::Udp => DEFAULT_UDP_SIZE,
        Mode::Hayate => hayate::DEFAULT_MTU,
    });
    if mode == Mode::Hayate && !(hayate::MIN_MTU..=hayate::MAX_MTU).contains(&size) {
        bail!(
            "--size is the MTU with --hayate: {}..={} bytes",
            hayate::MIN_MTU,
            hayate::MAX_MTU
        );
    }
    let (interval_ns, rate_bps) = match (&a.rate, a.interval_us) {
        // hayate: no fixed gap; the rate is a cap (none by default, as for `hayate cp`).
        (r, _) if mode == Mode::Hayate => (
            0,
            r.as_deref()
                .filter(|r| !r.eq_ignore_ascii_case("max"))
                .map(parse_rate)
                .transpose()?,
        ),
        (_, Some(us)) => {
            if us.is_nan() || us <= 0.0 {
                bail!("--interval-us must be positive");
            }
            ((us * 1e3).round() as u64, None)
        }
        (r, None) => {
            let bps = r
                .as_deref()
                .map(parse_rate)
                .transpose()?
                .unwrap_or(DEFAULT_RATE);
            (
                ((size as f64 * 8.0 * 1e9) / bps as f64).round().max(1.0) as u64,
                Some(bps),
            )
        }
    };
    let key = a.key_file.as_deref().map(Key::load).transpose()?;
    let addr = resolve(&a.server)?;
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connecting to the perf server at {addr}"))?;
    let ctl = Ctl::new(stream)?;
    let (challenge, keyed) = ctl.expect(
        Duration::from_secs(10),
        "the server's challenge",
        |m| match m {
            Msg::Challenge {
                version: VERSION,
                challenge,
                keyed,
            } => Some((challenge, keyed)),
            _ => None,
        },
    )?;
    let challenge = unhex(&challenge)
        .filter(|c| c.len() == 32)
        .context("bad challenge")?;
    if keyed && key.is_none() {
        bail!("the server requires a key: pass --key-file with the server's key");
    }
    if mode == Mode::Hayate && !keyed {
        bail!("{}", hayate::SERVER_NO_KEY);
    }
    let nonce = random_bytes::<32>();
    let req = TestRequest {
        mode,
        interval_ns,
        rate_bps,
        size,
        time_s: a.time,
        streams: a.streams,
        reverse: a.reverse,
        nonce: hex(&nonce),
        proof: key.as_ref().map(|k| hex(&k.proof(&challenge, &nonce))),
        drop_every: a.drop_every,
        drop_random: a.drop_random,
        seed: a.seed,
    };
    ctl.send(&Msg::Request(req.clone()))?;
    let (data_port, test_id, token) = ctl.expect(
        Duration::from_secs(10),
        "the server's answer",
        |m| match m {
            Msg::Accept {
                data_port,
                test_id,
                token,
            } => Some((data_port, test_id, token)),
            _ => None,
        },
    )?;
    let token: [u8; 16] = unhex(&token)
        .and_then(|t| t.try_into().ok())
        .context("bad token from the server")?;
    let data = SocketAddr::new(ctl.peer.ip(), data_port);
    let mut out = Out::new(mode, a.json);
    out.human(&format!(
        "hayate perf {} {} {}: {}{} for {} s",
        mode_name(mode),
        if a.reverse { "from" } else { "to" },
        addr,
        match mode {
            Mode::Tcp => format!("{} stream(s), {} B writes", a.streams, size),
            Mode::Hayate => format!(
                "hayate's transport, memory to memory, adaptive rate{}, MTU {}",
                rate_bps.map_or(String::new(), |r| format!(
                    " capped at {:.3} Mbit/s",
                    r as f64 / 1e6
                )),
                size
            ),
            Mode::Udp => format!(
                "{} B datagrams every {:.3} µs ({:.3} Mbit/s)",
                size,
                interval_ns as f64 / 1e3,
                size as f64 * 8.0 * 1e3 / interval_ns as f64
            ),
        },
        if a.drop_every > 0 || a.drop_random > 0.0 {
            " [test hook: simulated loss]"
        } else {
            ""
        },
        a.time
    ));
    let time = Duration::from_secs_f64(a.time);
    let (snd, rcv) = match mode {
        Mode::Udp => {
            let local = SocketAddr::new(
                match data.ip() {
                    IpAddr::V4(_) => IpAddr::from([0u8; 4]),
                    IpAddr::V6(_) => IpAddr::from([0u16; 8]),
                },
                0,
            );
            let sock = udp::bind_udp(local)?;
            sock.connect(data)?;
            if a.reverse {
                let params = udp::RecvParams {
                    test_id,
                    size,
                    peer_ip: data.ip(),
                    seq_limit: seq_limit(&req),
                    punch: Some(udp::punch_packet(test_id, &token)),
                    max_time: time + Duration::from_secs(15),
                };
                let (rcv, snd) = udp::recv(&sock, params, &ctl, &mut out)?;
                ctl.send(&Msg::Result(rcv.clone()))?;
                (snd, rcv)
            } else {
                let params = udp::SendParams {
                    interval_ns,
                    size,
                    time,
                    test_id,
                    drop: udp::DropHook::new(a.drop_every, a.drop_random, a.seed),
                };
                let snd = udp::send(&sock, params, &ctl, &mut out)?;
                let rcv = finish_as_sender(&ctl, &mut out, snd.clone())?;
                (snd, rcv)
            }
        }
        Mode::Tcp => {
            let streams = (0..a.streams)
                .map(|i| tcp::connect(data, &token, i))
                .collect::<Result<Vec<_>>>()?;
            if a.reverse {
                let (rcv, snd) =
                    tcp::recv(streams, &ctl, &mut out, time + Duration::from_secs(15))?;
                ctl.send(&Msg::Result(rcv.clone()))?;
                (snd, rcv)
            } else {
                let snd = tcp::send(streams, size, time, &ctl, &mut out)?;
                let rcv = finish_as_sender(&ctl, &mut out, snd.clone())?;
                (snd, rcv)
            }
        }
        Mode::Hayate => {
            let key = key.as_ref().expect("checked above");
            let proto = hayate::client_config(rate_bps, size);
            hayate::client(&ctl, &mut out, data, key, &req, proto)?
        }
    };
    let summary = Summary::new(mode, a.reverse, &req, snd, rcv);
    out.summary(&summary);
    if let Some(path) = &a.plot {
        let title = format!(
            "hayate perf {} {} {} — received per second",
            mode_name(mode),
            if a.reverse { "from" } else { "to" },
            addr
        );
        let second = match mode {
            Mode::Udp => Some(crate::plot::loss_series(&out.receiver_intervals)),
            Mode::Hayate => Some(crate::plot::retransmit_series(&out.sender_intervals)),
            Mode::Tcp => None,
        };
        let svg = crate::plot::svg(&title, &out.receiver_intervals, second);
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
        out.human(&format!("plot written to {}", path.display()));
    }
    Ok(0)
}
