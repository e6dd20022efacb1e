//! TCP streams with big buffers: goodput per stream and the kernel's view (TCP_INFO).

use crate::ctl::{Ctl, IntervalReport, ReceiverReport, SenderReport, Side, StreamReport, TcpInfo};
use crate::report::{Origin, Out};
use crate::udp::drain_remote;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// What we ask for; without CAP_NET_ADMIN the kernel caps it at wmem_max/rmem_max, and then
/// we leave the buffers to autotuning (up to tcp_wmem/tcp_rmem max), which goes further.
const BUFFER: usize = 32 << 20;
const MAX_STREAMS: u32 = 128;

pub fn max_streams() -> u32 {
    MAX_STREAMS
}

fn setsockopt_int(fd: i32, opt: i32, v: usize) -> bool {
    let v = v as libc::c_int;
    // SAFETY: setsockopt with a c_int of the right size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            &v as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        ) == 0
    }
}

/// Big buffers only where the kernel grants them in full (FORCE needs privilege): a capped
/// SO_RCVBUF would switch autotuning off and make the window smaller, not bigger.
fn big_buffers(s: &socket2::Socket) {
    let fd = s.as_raw_fd();
    setsockopt_int(fd, libc::SO_SNDBUFFORCE, BUFFER);
    setsockopt_int(fd, libc::SO_RCVBUFFORCE, BUFFER);
}

pub fn listener(ip: std::net::IpAddr) -> Result<TcpListener> {
    let addr = SocketAddr::new(ip, 0);
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    big_buffers(&s); // inherited by accepted sockets, before the handshake sets window scaling
    s.bind(&addr.into())?;
    s.listen(MAX_STREAMS as i32)?;
    Ok(s.into())
}

pub fn connect(addr: SocketAddr, token: &[u8; 16], index: u32) -> Result<TcpStream> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    big_buffers(&s);
    s.connect_timeout(&addr.into(), Duration::from_secs(5))
        .with_context(|| format!("connecting data stream to {addr}"))?;
    let mut t: TcpStream = s.into();
    t.set_nodelay(false).ok();
    let mut hello = [0u8; 20];
    hello[..16].copy_from_slice(token);
    hello[16..].copy_from_slice(&index.to_be_bytes());
    t.write_all(&hello)?;
    Ok(t)
}

/// Accepts the test's `n` streams: only from `peer_ip` and carrying the token; others are
/// dropped. Returns them ordered by stream index.
pub fn accept(
    l: &TcpListener,
    n: u32,
    peer_ip: std::net::IpAddr,
    token: &[u8; 16],
) -> Result<Vec<TcpStream>> {
    l.set_nonblocking(true)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let mut count = 0;
    while count < n {
        if Instant::now() > deadline {
            bail!("only {count} of {n} data streams connected");
        }
        let (mut s, from) = match l.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if from.ip() != peer_ip {
            continue;
        }
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut hello = [0u8; 20];
        if s.read_exact(&mut hello).is_err() || !crate::auth::ct_eq(&hello[..16], token) {
            continue;
        }
        let idx = u32::from_be_bytes(hello[16..].try_into().unwrap());
        if idx < n && got[idx as usize].is_none() {
            s.set_read_timeout(None)?;
            got[idx as usize] = Some(s);
            count += 1;
        }
    }
    Ok(got.into_iter().map(|s| s.unwrap()).collect())
}

pub fn tcp_info(s: &TcpStream) -> Option<TcpInfo> {
    // SAFETY: getsockopt fills at most `len` bytes of a zeroed tcp_info.
    let mut i: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut i as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0).then_some(TcpInfo {
        cwnd_segments: i.tcpi_snd_cwnd,
        mss: i.tcpi_snd_mss,
        rtt_us: i.tcpi_rtt,
        rttvar_us: i.tcpi_rttvar,
        total_retrans: i.tcpi_total_retrans,
    })
}

fn buffer_of(s: &TcpStream, opt: i32) -> usize {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt of a c_int.
    unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            &mut v as *mut _ as *mut libc::c_void,
            &mut len,
        );
    }
    v.max(0) as usize
}

/// Emits one line per second with the per-stream byte counts until `finished` says so.
fn report_loop(
    side: Side,
    t0: Instant,
    counters: &[Arc<AtomicU64>],
    finished: &dyn Fn() -> bool,
    ctl: &Ctl,
    out: &mut Out,
) -> Result<(f64, Option<crate::ctl::Msg>)> {
    // The sender's `done` may come before the last bytes are read: kept for the caller.
    let mut stash = None;
    let n = counters.len();
    let mut last = vec![0u64; n];
    let mut last_t = 0.0;
    let mut next = Duration::from_secs(1);
    let emit = |at: f64, last: &mut Vec<u64>, last_t: &mut f64, out: &mut Out| -> Result<()> {
        let now: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let per: Vec<u64> = now.iter().zip(last.iter()).map(|(a, b)| a - b).collect();
        let r = IntervalReport {
            side,
            start: *last_t,
            end: at,
            bytes: per.iter().sum(),
            datagrams: 0,
            lost: None,
            total_bytes: now.iter().sum(),
            total_datagrams: 0,
            stream_bytes: per,
            hayate: None,
        };
        out.interval(Origin::Local, &r);
        ctl.send(&crate::ctl::Msg::Interval(r))?;
        *last = now;
        *last_t = at;
        Ok(())
    };
    loop {
        let el = t0.elapsed();
        if finished() {
            let end = el.as_secs_f64();
            if end > last_t + 0.001 {
                emit(end, &mut last, &mut last_t, out)?;
            }
            return Ok((end, stash));
        }
        if el >= next {
            emit(next.as_secs_f64(), &mut last, &mut last_t, out)?;
            next += Duration::from_secs(1);
        }
        if stash.is_none() {
            stash = drain_remote(ctl, out)?;
        }
        thread::sleep(Duration::from_millis(10).min(next.saturating_sub(t0.elapsed())));
    }
}

/// Writes `chunk`-byte buffers on every stream for `time`, then half-closes each.
pub fn send(
    streams: Vec<TcpStream>,
    chunk: usize,
    time: Duration,
    ctl: &Ctl,
    out: &mut Out,
) -> Result<SenderReport> {
    let t0 = Instant::now();
    let counters: Vec<Arc<AtomicU64>> = streams
        .iter()
        .map(|_| Arc::new(AtomicU64::new(0)))
        .collect();
    let live = Arc::new(AtomicU64::new(streams.len() as u64));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = streams
        .into_iter()
        .zip(counters.iter().cloned())
        .map(|(mut s, c)| {
            let (live, stop) = (live.clone(), stop.clone());
            thread::spawn(move || -> Result<StreamReport> {
                let buf = vec![0x5au8; chunk.max(1)];
                // Wakes a write stuck on a full window, so the deadline is kept.
                s.set_write_timeout(Some(Duration::from_millis(200))).ok();
                let res = (|| -> Result<()> {
                    while t0.elapsed() < time && !stop.load(Ordering::Relaxed) {
                        match s.write(&buf) {
                            Ok(n) => {
                                c.fetch_add(n as u64, Ordering::Relaxed);
                            }
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::WouldBlock
                                        | std::io::ErrorKind::TimedOut
                                        | std::io::ErrorKind::Interrupted
                                ) => {}
                            Err(e) => return Err(e).context("writing a data stream"),
                        }
                    }
                    Ok(())
                })();
                let info = tcp_info(&s);
                let buffer = buffer_of(&s, libc::SO_SNDBUF);
                // FIN after the queued data; closing later is graceful too (nothing to read).
                let _ = s.shutdown(Shutdown::Write);
                let duration_s = t0.elapsed().as_secs_f64();
                live.fetch_sub(1, Ordering::Relaxed);
                res?;
                Ok(StreamReport {
                    bytes: c.load(Ordering::Relaxed),
                    duration_s,
                    info,
                    buffer,
                })
            })
        })
        .collect();
    let r = report_loop(
        Side::Sender,
        t0,
        &counters,
        &|| live.load(Ordering::Relaxed) == 0,
        ctl,
        out,
    );
    if r.is_err() {
        stop.store(true, Ordering::Relaxed);
    }
    let (dur, stash) = r?;
    if let Some(m) = stash {
        bail!("unexpected control message during the test: {m:?}");
    }
    let reports = handles
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("a stream thread panicked"))?
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(SenderReport {
        duration_s: dur,
        datagrams: 0,
        bytes: reports.iter().map(|r| r.bytes).sum(),
        skipped: 0,
        streams: reports,
        hayate: None,
    })
}

/// Reads every stream to its end; then waits for the sender's `done`.
pub fn recv(
    streams: Vec<TcpStream>,
    ctl: &Ctl,
    out: &mut Out,
    max_time: Duration,
) -> Result<(ReceiverReport, SenderReport)> {
    let t0 = Instant::now();
    let counters: Vec<Arc<AtomicU64>> = streams
        .iter()
        .map(|_| Arc::new(AtomicU64::new(0)))
        .collect();
    let live = Arc::new(AtomicU64::new(streams.len() as u64));
    let handles: Vec<_> = streams
        .into_iter()
        .zip(counters.iter().cloned())
        .map(|(mut s, c)| {
            let live = live.clone();
            thread::spawn(move || -> Result<StreamReport> {
                let mut buf = vec![0u8; 256 << 10];
                s.set_read_timeout(Some(max_time)).ok();
                let res = loop {
                    match s.read(&mut buf) {
                        Ok(0) => break Ok(()),
                        Ok(n) => {
                            c.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(e).context("reading a data stream"),
                    }
                };
                let duration_s = t0.elapsed().as_secs_f64();
                let info = tcp_info(&s);
                let buffer = buffer_of(&s, libc::SO_RCVBUF);
                live.fetch_sub(1, Ordering::Relaxed);
                res?;
                Ok(StreamReport {
                    bytes: c.load(Ordering::Relaxed),
                    duration_s,
                    info,
                    buffer,
                })
            })
        })
        .collect();
    let (dur, mut stash) = report_loop(
        Side::Receiver,
        t0,
        &counters,
        &|| live.load(Ordering::Relaxed) == 0,
        ctl,
        out,
    )?;
    let streams = handles
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("a stream thread panicked"))?
        })
        .collect::<Result<Vec<_>>>()?;
    let snd = loop {
        let next = match stash.take() {
            Some(m) => Some(m),
            None => ctl.recv_timeout(Duration::from_secs(10))?,
        };
        match next {
            Some(crate::ctl::Msg::Interval(r)) => out.interval(Origin::Remote, &r),
            Some(crate::ctl::Msg::Done(s)) => break s,
            Some(m) => bail!("unexpected control message: {m:?}"),
            None => bail!("the sender never sent `done`"),
        }
    };
    let bytes = streams.iter().map(|s| s.bytes).sum();
    Ok((
        ReceiverReport {
            duration_s: dur,
            datagrams: 0,
            bytes,
            sent: 0,
            lost: 0,
            reordered: 0,
            duplicated: 0,
            out_of_range: 0,
            jitter_ms: 0.0,
            ranges: Vec::new(),
            streams,
            hayate: None,
        },
        snd,
    ))
}
