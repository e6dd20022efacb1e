//! `--hayate`: hayate's own transport, memory to memory (hayate-io's `driver::mem`): the
//! adaptive rate, the loss maps, the retransmissions and the end-to-end BLAKE3 of a real
//! `hayate cp`, without the disk. Per-second lines from both sides, as for UDP and TCP.
//!
//! The server starts a hayate endpoint on a fresh UDP port for the one test, keyed with the
//! key file's key (so `--hayate` needs `--key-file` on both sides), only after the control
//! handshake proved the key, and takes sessions only from the control connection's address.

use crate::auth::Key;
use crate::ctl::{
    Ctl, HayateInterval, HayateReport, IntervalReport, Msg, ReceiverReport, SenderReport, Side,
};
use crate::report::{Origin, Out};
use crate::udp::drain_remote;
use crate::{ctl::TestRequest, finish_as_sender};
use anyhow::{anyhow, bail, Context, Result};
use hayate_io::driver::mem::{self, MemOptions, MemProgress, MemReport};
use hayate_io::driver::StopFlag;
use hayate_proto::cc::{Policy, RateConfig};
use hayate_proto::Config;
use std::net::SocketAddr;
use std::time::Duration;

pub const NEEDS_KEY: &str = "--hayate needs --key-file on both sides: hayate's transport is \
                             keyed by a pre-shared key (make one with `hayate keygen`)";
pub const SERVER_NO_KEY: &str = "server has no key; --hayate tests need `--key-file` on both sides";
/// hayate's MTU bounds (`hayate cp --mtu`).
pub const MIN_MTU: usize = 1280;
pub const MAX_MTU: usize = 65535;
pub const DEFAULT_MTU: usize = 1500;
/// How long after its time a test may take to end before we give up.
const GRACE: Duration = Duration::from_secs(15);

/// The client's transport settings: `--rate` is a cap on the adaptive rate, as for `hayate
/// cp`; `mtu` bounds every datagram.
pub fn client_config(cap_bps: Option<u64>, mtu: usize) -> Config {
    Config {
        mtu: mtu.clamp(MIN_MTU, MAX_MTU) as u16,
        rate: RateConfig::Adaptive {
            max: cap_bps.map(|b| (b / 8).max(1)),
            min: 0,
            policy: Policy::Fair,
        },
        idle_timeout: Duration::from_secs(15),
        connect_timeout: Duration::from_secs(5),
        remembered: None,
    }
}

/// The server allows what the client asks (its cap, its MTU).
fn server_config() -> Config {
    Config {
        mtu: MAX_MTU as u16,
        rate: RateConfig::Unlimited,
        idle_timeout: Duration::from_secs(15),
        connect_timeout: Duration::from_secs(5),
        remembered: None,
    }
}

/// The counters one side's lines are made of.
#[derive(Debug, Default, Clone, Copy)]
struct Snap {
    bytes: u64,
    dgrams: u64,
    acked: u64,
    retx: u64,
    lost: u64,
    dups: u64,
}

fn snap(side: Side, p: &MemProgress) -> Snap {
    let s = &p.stats;
    match side {
        Side::Sender => Snap {
            bytes: s.data_bytes_sent,
            dgrams: s.data_packets_sent,
            acked: s.data_bytes_acked,
            retx: s.data_packets_retransmitted,
            lost: s.data_bytes_lost,
            dups: 0,
        },
        Side::Receiver => Snap {
            bytes: p.delivered_bytes,
            dgrams: s.data_packets_received,
            dups: s.duplicate_blocks_received,
            ..Snap::default()
        },
    }
}

/// One interval report per second since the session was established (and a last partial
/// one), shown here and sent to the peer.
struct Ticker {
    side: Side,
    next: Duration,
    last_t: Duration,
    last: Snap,
}

impl Ticker {
    fn new(side: Side) -> Self {
        Ticker {
            side,
            next: Duration::from_secs(1),
            last_t: Duration::ZERO,
            last: Snap::default(),
        }
    }

    fn poll(&mut self, p: &MemProgress, out: &mut Out, ctl: &Ctl) -> Result<()> {
        let Some(now) = p.since_connected else {
            return Ok(());
        };
        while now >= self.next {
            self.emit(self.next, p, out, ctl)?;
            self.next += Duration::from_secs(1);
        }
        Ok(())
    }

    fn finish(&mut self, end: Duration, p: &MemProgress, out: &mut Out, ctl: &Ctl) -> Result<()> {
        self.poll(p, out, ctl)?;
        let end = end.max(self.last_t);
        let s = snap(self.side, p);
        // Whatever came after the last line goes in a last one, however short, so the lines
        // add up to the totals.
        let changed = s.bytes > self.last.bytes || s.dgrams > self.last.dgrams;
        if changed || (end > self.last_t + Duration::from_millis(1) && end < Duration::from_secs(1))
        {
            self.emit(end, p, out, ctl)?;
        }
        Ok(())
    }

    fn emit(&mut self, at: Duration, p: &MemProgress, out: &mut Out, ctl: &Ctl) -> Result<()> {
        let s = snap(self.side, p);
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let dgrams = d(s.dgrams, self.last.dgrams);
        let retx = d(s.retx, self.last.retx);
        let sender = self.side == Side::Sender;
        let r = IntervalReport {
            side: self.side,
            start: self.last_t.as_secs_f64(),
            end: at.as_secs_f64(),
            bytes: d(s.bytes, self.last.bytes),
            datagrams: dgrams,
            lost: None,
            total_bytes: s.bytes,
            total_datagrams: s.dgrams,
            stream_bytes: Vec::new(),
            hayate: Some(HayateInterval {
                acked_bytes: d(s.acked, self.last.acked),
                retransmitted: retx,
                retransmit_percent: if dgrams > 0 {
                    100.0 * retx as f64 / dgrams as f64
                } else {
                    0.0
                },
                lost_bytes: d(s.lost, self.last.lost),
                rtt_ms: if sender {
                    p.stats.srtt_us as f64 / 1e3
                } else {
                    0.0
                },
                pacing_bps: if sender {
                    p.stats.pacing_rate as f64 * 8.0
                } else {
                    0.0
                },
                duplicates: d(s.dups, self.last.dups),
                files_verified: p.files_verified,
                mismatches: p.mismatches,
            }),
        };
        out.interval(Origin::Local, &r);
        ctl.send(&Msg::Interval(r))?;
        self.last_t = at;
        self.last = s;
        Ok(())
    }
}

fn side_report(r: &MemReport) -> HayateReport {
    let p = &r.progress;
    let s = &p.stats;
    HayateReport {
        data_packets_sent: s.data_packets_sent,
        data_packets_retransmitted: s.data_packets_retransmitted,
        data_bytes_sent: s.data_bytes_sent,
        data_bytes_acked: s.data_bytes_acked,
        data_bytes_lost: s.data_bytes_lost,
        blocks_declared_lost: s.blocks_declared_lost,
        data_packets_received: s.data_packets_received,
        duplicate_blocks_received: s.duplicate_blocks_received,
        delivered_bytes: p.delivered_bytes,
        mismatches: p.mismatches,
        srtt_us: s.srtt_us,
        min_rtt_us: s.min_rtt_us,
        pacing_bps: s.pacing_rate.saturating_mul(8),
        files_started: p.files_started,
        files_verified: p.files_verified,
        bytes_verified: p.bytes_verified,
        files_failed: p.files_failed,
        files_aborted: p.files_aborted,
        failures: r.failures.clone(),
        block_size: p.block_size,
        mtu: p.mtu,
        kernel_drops: p.kernel_drops,
    }
}

/// Runs one side's loop with the per-second lines; returns its report and any control
/// message other than an interval that came meanwhile (the sender's `done`).
fn run_side(
    side: Side,
    ctl: &Ctl,
    out: &mut Out,
    run: impl FnOnce(&StopFlag, mem::Observer<'_>) -> MemReport,
) -> Result<(MemReport, Option<Msg>)> {
    let mut tick = Ticker::new(side);
    let mut stash: Option<Msg> = None;
    let mut failed: Option<anyhow::Error> = None;
    let stop = StopFlag::new();
    let rep = {
        let mut observe = |p: &MemProgress| -> bool {
            if failed.is_some() {
                return false;
            }
            let r = tick.poll(p, out, ctl).and_then(|()| {
                if stash.is_none() {
                    stash = drain_remote(ctl, out)?;
                }
                Ok(())
            });
            match r {
                Ok(()) => true,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        };
        run(&stop, &mut observe)
    };
    if let Some(e) = failed {
        return Err(e);
    }
    if let Some(e) = &rep.error {
        bail!("hayate session: {e}");
    }
    let p = &rep.progress;
    let end = match side {
        Side::Sender => p.ended.or(p.since_connected),
        Side::Receiver => p.last_delivery,
    }
    .unwrap_or_default();
    tick.finish(end, p, out, ctl)?;
    Ok((rep, stash))
}

fn sender_report(rep: &MemReport) -> SenderReport {
    let p = &rep.progress;
    SenderReport {
        duration_s: p
            .ended
            .or(p.since_connected)
            .unwrap_or_default()
            .as_secs_f64(),
        datagrams: p.stats.data_packets_sent,
        bytes: p.stats.data_bytes_sent,
        skipped: 0,
        streams: Vec::new(),
        hayate: Some(side_report(rep)),
    }
}

fn receiver_report(rep: &MemReport) -> ReceiverReport {
    let p = &rep.progress;
    ReceiverReport {
        duration_s: p.last_delivery.unwrap_or_default().as_secs_f64(),
        datagrams: p.stats.data_packets_received,
        bytes: p.delivered_bytes,
        sent: 0,
        lost: 0,
        reordered: 0,
        duplicated: p.stats.duplicate_blocks_received,
        out_of_range: 0,
        jitter_ms: 0.0,
        ranges: Vec::new(),
        streams: Vec::new(),
        hayate: Some(side_report(rep)),
    }
}

/// Receiver's end of a test: the sender's `done` (maybe already here), then our `result`.
fn finish_as_receiver(
    ctl: &Ctl,
    out: &mut Out,
    stash: Option<Msg>,
    rcv: &ReceiverReport,
) -> Result<SenderReport> {
    let mut next = stash;
    let snd = loop {
        let m = match next.take() {
            Some(m) => Some(m),
            None => ctl.recv_timeout(Duration::from_secs(15))?,
        };
        match m {
            Some(Msg::Interval(r)) => out.interval(Origin::Remote, &r),
            Some(Msg::Done(s)) => break s,
            Some(m) => bail!("unexpected control message: {m:?}"),
            None => bail!("the sender never sent `done`"),
        }
    };
    ctl.send(&Msg::Result(rcv.clone()))?;
    Ok(snd)
}

/// Client side: `data` is the server's hayate port.
pub fn client(
    ctl: &Ctl,
    out: &mut Out,
    data: SocketAddr,
    key: &Key,
    req: &TestRequest,
    proto: Config,
) -> Result<(SenderReport, ReceiverReport)> {
    let opts = MemOptions {
        psk: key.psk(),
        proto,
        time: Duration::from_secs_f64(req.time_s),
        reverse: req.reverse,
        grace: GRACE,
    };
    let side = if req.reverse {
        Side::Receiver
    } else {
        Side::Sender
    };
    let (rep, stash) = run_side(side, ctl, out, |stop, obs| {
        mem::run_client(data, opts, stop, obs)
    })?;
    finish(side, ctl, out, &rep, stash)
}

/// Server side: a fresh UDP port for this test, told to the client in the `accept`.
pub fn server(
    ctl: &Ctl,
    out: &mut Out,
    key: &Key,
    req: &TestRequest,
    test_id: u32,
    token: &str,
) -> Result<(SenderReport, ReceiverReport)> {
    let sock = hayate_io::udp::UdpSocket::bind(SocketAddr::new(ctl.local.ip(), 0))
        .context("binding the hayate UDP port")?;
    ctl.send(&Msg::Accept {
        data_port: sock.local_addr()?.port(),
        test_id,
        token: token.to_string(),
    })?;
    let opts = MemOptions {
        psk: key.psk(),
        proto: server_config(),
        time: Duration::from_secs_f64(req.time_s),
        reverse: req.reverse,
        grace: GRACE,
    };
    let side = if req.reverse {
        Side::Sender
    } else {
        Side::Receiver
    };
    let peer = ctl.peer.ip();
    let (rep, stash) = run_side(side, ctl, out, |stop, obs| {
        mem::run_server(sock, peer, opts, stop, obs)
    })?;
    finish(side, ctl, out, &rep, stash)
}

fn finish(
    side: Side,
    ctl: &Ctl,
    out: &mut Out,
    rep: &MemReport,
    stash: Option<Msg>,
) -> Result<(SenderReport, ReceiverReport)> {
    match side {
        Side::Sender => {
            if let Some(m) = stash {
                return Err(anyhow!("unexpected control message during the test: {m:?}"));
            }
            let snd = sender_report(rep);
            let rcv = finish_as_sender(ctl, out, snd.clone())?;
            Ok((snd, rcv))
        }
        Side::Receiver => {
            let rcv = receiver_report(rep);
            let snd = finish_as_receiver(ctl, out, stash, &rcv)?;
            Ok((snd, rcv))
        }
    }
}
