//! `hayate perf server`: runs tests one after another, each on its own control connection.

use crate::auth::{random_bytes, Key};
use crate::ctl::{Ctl, Mode, Msg, TestRequest, VERSION};
use crate::report::{Out, Summary};
use crate::units::{hex, unhex};
use crate::{finish_as_sender, hayate, seq_limit, tcp, udp, ServerArgs};
use anyhow::{Context, Result};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

pub const NO_KEY_REVERSE: &str = "server has no key; reverse tests need `--key-file` on both sides";
pub const AUTH_FAILED: &str =
    "authentication failed: the client did not prove it holds the server's key";

pub fn run(args: ServerArgs) -> Result<i32> {
    let key = args.key_file.as_deref().map(Key::load).transpose()?;
    let listener =
        TcpListener::bind(args.listen).with_context(|| format!("listening on {}", args.listen))?;
    // Tests read this line to learn the port when listening on port 0.
    eprintln!(
        "hayate perf server listening on {} ({})",
        listener.local_addr()?,
        if key.is_some() {
            "key required for every test"
        } else {
            "no key: forward UDP and TCP tests only"
        }
    );
    for conn in listener.incoming() {
        let s = match conn {
            Ok(s) => s,
            Err(e) => {
                eprintln!("accept: {e}");
                continue;
            }
        };
        let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
        match handle(s, key.as_ref()) {
            Ok(()) => {}
            Err(e) => eprintln!("test from {peer}: {e:#}"),
        }
    }
    Ok(0)
}

fn validate(r: &TestRequest) -> Option<String> {
    let bad = |s: &str| Some(s.to_string());
    if !(r.time_s > 0.0 && r.time_s <= 3600.0) {
        return bad("time must be in (0, 3600] s");
    }
    match r.mode {
        Mode::Udp => {
            if r.size < udp::HEADER || r.size > 65507 {
                return Some(format!("size must be {}..=65507 bytes", udp::HEADER));
            }
            if r.interval_ns < 100 {
                return bad("interval below 100 ns");
            }
            if !(0.0..=1.0).contains(&r.drop_random) {
                return bad("drop_random must be in [0, 1]");
            }
        }
        Mode::Tcp => {
            if r.streams == 0 || r.streams > tcp::max_streams() {
                return Some(format!("streams must be 1..={}", tcp::max_streams()));
            }
            if r.size == 0 || r.size > 64 << 20 {
                return bad("write size must be 1 byte .. 64 MiB");
            }
        }
        Mode::Hayate => {
            if !(hayate::MIN_MTU..=hayate::MAX_MTU).contains(&r.size) {
                return Some(format!(
                    "MTU must be {}..={} bytes",
                    hayate::MIN_MTU,
                    hayate::MAX_MTU
                ));
            }
        }
    }
    None
}

fn handle(stream: TcpStream, key: Option<&Key>) -> Result<()> {
    let ctl = Ctl::new(stream)?;
    let peer = ctl.peer;
    let challenge = random_bytes::<32>();
    ctl.send(&Msg::Challenge {
        version: VERSION,
        challenge: hex(&challenge),
        keyed: key.is_some(),
    })?;
    let req = ctl.expect(Duration::from_secs(10), "a test request", |m| match m {
        Msg::Request(r) => Some(r),
        _ => None,
    })?;
    let proved = match (key, req.proof.as_deref().and_then(unhex), unhex(&req.nonce)) {
        (Some(k), Some(proof), Some(nonce)) if nonce.len() == 32 => {
            k.verify(&challenge, &nonce, &proof)
        }
        _ => false,
    };
    let refusal = if key.is_some() && !proved {
        Some(AUTH_FAILED.to_string())
    } else if key.is_none() && req.mode == Mode::Hayate {
        Some(hayate::SERVER_NO_KEY.to_string())
    } else if key.is_none() && req.reverse {
        Some(NO_KEY_REVERSE.to_string())
    } else {
        validate(&req)
    };
    if let Some(reason) = refusal {
        eprintln!("refused a test from {peer}: {reason}");
        ctl.send(&Msg::Refused { reason })?;
        return Ok(());
    }
    eprintln!(
        "test from {peer}: {:?}{}, {} s{}",
        req.mode,
        if req.reverse {
            " reverse (we send)"
        } else {
            ""
        },
        req.time_s,
        if proved { ", key proved" } else { "" }
    );
    // From here on the peer has proved the key, or the test is forward (we only receive).
    let test_id = u32::from_be_bytes(random_bytes::<4>());
    let token = random_bytes::<16>();
    let mut out = Out::new(req.mode, false);
    let time = Duration::from_secs_f64(req.time_s);
    let max_time = time + Duration::from_secs(15);
    let (snd, rcv) = match req.mode {
        Mode::Udp => {
            let sock = udp::bind_udp(SocketAddr::new(ctl.local.ip(), 0))?;
            ctl.send(&Msg::Accept {
                data_port: sock.local_addr()?.port(),
                test_id,
                token: hex(&token),
            })?;
            if req.reverse {
                // Data goes only to the address that echoed this test's secret token, from the
                // control connection's (authenticated) peer address.
                let to =
                    udp::wait_punch(&sock, peer.ip(), test_id, &token, Duration::from_secs(5))?;
                sock.connect(to)?;
                let params = udp::SendParams {
                    interval_ns: req.interval_ns,
                    size: req.size,
                    time,
                    test_id,
                    drop: udp::DropHook::new(req.drop_every, req.drop_random, req.seed),
                };
                let snd = udp::send(&sock, params, &ctl, &mut out)?;
                let rcv = finish_as_sender(&ctl, &mut out, snd.clone())?;
                (snd, rcv)
            } else {
                let params = udp::RecvParams {
                    test_id,
                    size: req.size,
                    peer_ip: peer.ip(),
                    seq_limit: seq_limit(&req),
                    punch: None,
                    max_time,
                };
                let (rcv, snd) = udp::recv(&sock, params, &ctl, &mut out)?;
                ctl.send(&Msg::Result(rcv.clone()))?;
                (snd, rcv)
            }
        }
        Mode::Tcp => {
            let l = tcp::listener(ctl.local.ip())?;
            ctl.send(&Msg::Accept {
                data_port: l.local_addr()?.port(),
                test_id,
                token: hex(&token),
            })?;
            let streams = tcp::accept(&l, req.streams, peer.ip(), &token)?;
            drop(l);
            if req.reverse {
                let snd = tcp::send(streams, req.size, time, &ctl, &mut out)?;
                let rcv = finish_as_sender(&ctl, &mut out, snd.clone())?;
                (snd, rcv)
            } else {
                let (rcv, snd) = tcp::recv(streams, &ctl, &mut out, max_time)?;
                ctl.send(&Msg::Result(rcv.clone()))?;
                (snd, rcv)
            }
        }
        // Keyed server and proved key (refused above otherwise): the hayate session itself
        // is keyed with the same key.
        Mode::Hayate => {
            let key = key.expect("hayate tests need a keyed server");
            hayate::server(&ctl, &mut out, key, &req, test_id, &hex(&token))?
        }
    };
    out.summary(&Summary::new(req.mode, req.reverse, &req, snd, rcv));
    Ok(())
}
