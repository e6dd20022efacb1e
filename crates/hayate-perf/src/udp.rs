//! Paced UDP generator and sink.
//!
//! Datagram layout (big-endian): `HYPF` | kind u8 (0 data, 1 punch) | 3 zero bytes | test_id u32
//! | data: seq u64, send time u64 (ns since the sender's start) | punch: token (16 bytes).

use crate::ctl::{Ctl, IntervalReport, Msg, ReceiverReport, SenderReport, Side};
use crate::report::{Origin, Out};
use crate::stats::{Arrival, UdpRecvStats};
use anyhow::{bail, Context, Result};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

pub const MAGIC: &[u8; 4] = b"HYPF";
pub const HEADER: usize = 28;
pub const PUNCH_LEN: usize = 28;
const KIND_DATA: u8 = 0;
const KIND_PUNCH: u8 = 1;
const BATCH: usize = 64;
/// Sleep until this close to a datagram's due time, then spin: sleeps overshoot by tens of µs.
const SPIN_NS: u64 = 40_000;

pub fn punch_packet(test_id: u32, token: &[u8; 16]) -> Vec<u8> {
    let mut p = vec![0u8; PUNCH_LEN];
    p[..4].copy_from_slice(MAGIC);
    p[4] = KIND_PUNCH;
    p[8..12].copy_from_slice(&test_id.to_be_bytes());
    p[12..28].copy_from_slice(token);
    p
}

/// Waits for a punch carrying the test's token from `peer_ip`; returns its source address.
/// This is the only way the server learns where to send reverse-test data.
pub fn wait_punch(
    sock: &UdpSocket,
    peer_ip: IpAddr,
    test_id: u32,
    token: &[u8; 16],
    timeout: Duration,
) -> Result<SocketAddr> {
    let want = punch_packet(test_id, token);
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 2048];
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    while Instant::now() < deadline {
        match sock.recv_from(&mut buf) {
            Ok((n, src)) => {
                if src.ip() == peer_ip && n == PUNCH_LEN && crate::auth::ct_eq(&buf[..n], &want) {
                    return Ok(src);
                }
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e).context("waiting for the client's UDP punch"),
        }
    }
    bail!("the client's UDP packets never arrived (firewall?)")
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Deterministic PRNG for the loss test hook (SplitMix64).
struct SplitMix(u64);
impl SplitMix {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub struct DropHook {
    every: u64,
    random: f64,
    rng: SplitMix,
}

impl DropHook {
    pub fn new(every: u64, random: f64, seed: u64) -> Self {
        DropHook {
            every,
            random,
            rng: SplitMix(seed),
        }
    }
    fn drop(&mut self, seq: u64) -> bool {
        (self.every > 0 && (seq + 1).is_multiple_of(self.every))
            || (self.random > 0.0 && self.rng.next_f64() < self.random)
    }
}

pub struct SendParams {
    pub interval_ns: u64,
    pub size: usize,
    pub time: Duration,
    pub test_id: u32,
    pub drop: DropHook,
}

/// Lets the pacing thread's sleeps end close to the asked time (default slack is 50 µs).
fn tight_timer_slack() {
    #[cfg(target_os = "linux")]
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// Sends every datagram whose due time (seq × interval) has come, in batches of up to
/// [`BATCH`] per system call, sleeping in between; stops at `time`.
pub fn send(sock: &UdpSocket, mut p: SendParams, ctl: &Ctl, out: &mut Out) -> Result<SenderReport> {
    tight_timer_slack();
    let size = p.size.max(HEADER);
    let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; size]).collect();
    for b in &mut bufs {
        b[..4].copy_from_slice(MAGIC);
        b[4] = KIND_DATA;
        b[8..12].copy_from_slice(&p.test_id.to_be_bytes());
    }
    let end_ns = p.time.as_nanos() as u64;
    let interval = p.interval_ns.max(1);
    let total = end_ns.div_ceil(interval);
    let t0 = Instant::now();
    let mut seq = 0u64;
    let (mut sent_dgrams, mut sent_bytes, mut skipped) = (0u64, 0u64, 0u64);
    let mut tick = Ticker::new(Side::Sender);
    loop {
        let now = t0.elapsed().as_nanos() as u64;
        tick.poll(now, sent_bytes, sent_dgrams, None, out, ctl)?;
        // The peer's report lines are shown as they come; a dead peer ends the test.
        if let Some(m) = drain_remote(ctl, out)? {
            bail!("unexpected control message during the test: {m:?}");
        }
        // Datagrams due before the end are still sent if we woke late; a sender that cannot
        // keep up at all stops a little after the end instead of running on.
        if seq >= total || now >= end_ns + 100_000_000 {
            break;
        }
        let due = (now / interval + 1).min(total);
        if seq < due {
            let upto = due.min(seq + BATCH as u64);
            let mut n = 0;
            while seq < upto {
                if p.drop.drop(seq) {
                    skipped += 1;
                } else {
                    let b = &mut bufs[n];
                    b[12..20].copy_from_slice(&seq.to_be_bytes());
                    b[20..28].copy_from_slice(&now.to_be_bytes());
                    n += 1;
                }
                seq += 1;
            }
            sendmmsg_all(sock, &bufs[..n])?;
            sent_dgrams += n as u64;
            sent_bytes += (n * size) as u64;
            continue;
        }
        let next = seq * interval;
        let wait = next.saturating_sub(now).min(end_ns.saturating_sub(now));
        if wait > SPIN_NS {
            // Wake for the next second's report too.
            let to_tick = tick.next_ns().saturating_sub(now);
            std::thread::sleep(Duration::from_nanos((wait - SPIN_NS).min(to_tick.max(1))));
        } else {
            std::hint::spin_loop();
        }
    }
    let dur = t0.elapsed();
    tick.finish(
        dur.as_nanos() as u64,
        sent_bytes,
        sent_dgrams,
        None,
        out,
        ctl,
    )?;
    Ok(SenderReport {
        duration_s: dur.as_secs_f64(),
        datagrams: seq,
        bytes: sent_bytes,
        skipped,
        streams: Vec::new(),
        hayate: None,
    })
}

fn sendmmsg_all(sock: &UdpSocket, bufs: &[Vec<u8>]) -> Result<()> {
    let mut iov: Vec<libc::iovec> = bufs
        .iter()
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: zeroed mmsghdr is a valid empty header; we fill in the iovec pointers only.
    let mut msgs: Vec<libc::mmsghdr> = iov
        .iter_mut()
        .map(|v| {
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = v as *mut libc::iovec;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    let mut done = 0;
    let mut refused = 0;
    while done < msgs.len() {
        // SAFETY: msgs/iov point into live buffers for the duration of the call.
        let r = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                msgs[done..].as_mut_ptr(),
                (msgs.len() - done) as libc::c_uint,
                0,
            )
        };
        if r >= 0 {
            done += r as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                // Queue full: back off briefly and retry the same datagrams.
                std::thread::sleep(Duration::from_micros(50));
            }
            // An ICMP port unreachable from earlier: the receiver is gone or not yet there.
            Some(libc::ECONNREFUSED) if refused < 3 => refused += 1,
            _ => return Err(e).context("sending datagrams"),
        }
    }
    Ok(())
}

/// Emits one interval report per second of the test (and a last partial one).
struct Ticker {
    side: Side,
    next: u64,
    last: u64,
    last_bytes: u64,
    last_dgrams: u64,
    last_expected: u64,
}

impl Ticker {
    fn new(side: Side) -> Self {
        Ticker {
            side,
            next: 1_000_000_000,
            last: 0,
            last_bytes: 0,
            last_dgrams: 0,
            last_expected: 0,
        }
    }
    fn next_ns(&self) -> u64 {
        self.next
    }
    /// `expected`: for a UDP sink, highest sequence number seen + 1, to count the losses.
    fn poll(
        &mut self,
        now: u64,
        bytes: u64,
        dgrams: u64,
        expected: Option<u64>,
        out: &mut Out,
        ctl: &Ctl,
    ) -> Result<()> {
        while now >= self.next {
            let at = self.next;
            self.emit(at, bytes, dgrams, expected, out, ctl)?;
            self.next += 1_000_000_000;
        }
        Ok(())
    }
    fn finish(
        &mut self,
        now: u64,
        bytes: u64,
        dgrams: u64,
        expected: Option<u64>,
        out: &mut Out,
        ctl: &Ctl,
    ) -> Result<()> {
        self.poll(now, bytes, dgrams, expected, out, ctl)?;
        // Whatever came after the last line goes in a last one, however short, so the lines
        // add up to the totals (a sender's last batch can follow a tick by microseconds).
        let changed = bytes > self.last_bytes || dgrams > self.last_dgrams;
        if changed || (now > self.last + 1_000_000 && now < 1_000_000_000) {
            self.emit(now.max(self.last), bytes, dgrams, expected, out, ctl)?;
        }
        Ok(())
    }
    fn emit(
        &mut self,
        at: u64,
        bytes: u64,
        dgrams: u64,
        expected: Option<u64>,
        out: &mut Out,
        ctl: &Ctl,
    ) -> Result<()> {
        let d = dgrams - self.last_dgrams;
        let lost = expected.map(|e| (e - self.last_expected).saturating_sub(d));
        let r = IntervalReport {
            side: self.side,
            start: self.last as f64 / 1e9,
            end: at as f64 / 1e9,
            bytes: bytes - self.last_bytes,
            datagrams: d,
            lost,
            total_bytes: bytes,
            total_datagrams: dgrams,
            stream_bytes: Vec::new(),
            hayate: None,
        };
        out.interval(Origin::Local, &r);
        ctl.send(&Msg::Interval(r))?;
        self.last = at;
        self.last_bytes = bytes;
        self.last_dgrams = dgrams;
        if let Some(e) = expected {
            self.last_expected = e;
        }
        Ok(())
    }
}

/// Shows the peer's interval lines that have arrived; anything else here is a protocol error.
pub fn drain_remote(ctl: &Ctl, out: &mut Out) -> Result<Option<Msg>> {
    while let Some(m) = ctl.try_recv()? {
        match m {
            Msg::Interval(r) => out.interval(Origin::Remote, &r),
            other => return Ok(Some(other)),
        }
    }
    Ok(None)
}

pub struct RecvParams {
    pub test_id: u32,
    pub size: usize,
    /// Only datagrams from this address count (the control connection's peer).
    pub peer_ip: IpAddr,
    /// Bound on sequence numbers (memory), from the requested rate and time.
    pub seq_limit: u64,
    /// Client side of a reverse test: punch to send until data arrives.
    pub punch: Option<Vec<u8>>,
    /// Give up if the sender has not reported `done` by then.
    pub max_time: Duration,
}

/// Receives until the sender's `done` has arrived and the tail has drained; returns both
/// sides' reports.
pub fn recv(
    sock: &UdpSocket,
    p: RecvParams,
    ctl: &Ctl,
    out: &mut Out,
) -> Result<(ReceiverReport, SenderReport)> {
    sock.set_read_timeout(Some(Duration::from_millis(20)))?;
    let slot = p.size.max(HEADER) + 64;
    let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; slot]).collect();
    let mut stats = UdpRecvStats::new(p.seq_limit);
    let stamped = enable_rx_timestamps(sock);
    let mut tick = Ticker::new(Side::Receiver);
    let t0 = Instant::now();
    let mut last_punch: Option<Instant> = None;
    let mut got_data = false;
    let mut done: Option<(SenderReport, Instant)> = None;
    let mut last_arrival_ns = 0u64;
    loop {
        if !got_data {
            if let Some(pk) = &p.punch {
                if last_punch.is_none_or(|t| t.elapsed() >= Duration::from_millis(100)) {
                    let _ = sock.send(pk);
                    last_punch = Some(Instant::now());
                }
            }
        }
        let got = recvmmsg_batch(sock, &mut bufs)?;
        let now = t0.elapsed().as_nanos() as u64;
        for (i, (len, src, kts)) in got.iter().enumerate() {
            if src.is_some_and(|s| s.ip() != p.peer_ip) {
                continue;
            }
            let b = &bufs[i][..*len];
            if *len < HEADER || &b[..4] != MAGIC || b[4] != KIND_DATA {
                continue;
            }
            if u32::from_be_bytes(b[8..12].try_into().unwrap()) != p.test_id {
                continue;
            }
            let seq = u64::from_be_bytes(b[12..20].try_into().unwrap());
            let sent_ns = u64::from_be_bytes(b[20..28].try_into().unwrap());
            // Jitter on the kernel's arrival stamps when we have them, else our own clock.
            let arrival = if stamped { *kts } else { Some(now) };
            if let Arrival::New = stats.record(seq, *len, sent_ns, arrival) {
                got_data = true;
                last_arrival_ns = now;
            }
        }
        tick.poll(
            now,
            stats.bytes,
            stats.unique,
            Some(stats.next_expected),
            out,
            ctl,
        )?;
        if done.is_none() {
            if let Some(m) = drain_remote(ctl, out)? {
                match m {
                    Msg::Done(s) => done = Some((s, Instant::now())),
                    other => bail!("unexpected control message during the test: {other:?}"),
                }
            }
        }
        if let Some((s, at)) = &done {
            let all = stats.unique >= s.datagrams.saturating_sub(s.skipped);
            let idle = Duration::from_nanos(now.saturating_sub(last_arrival_ns));
            if all
                || (at.elapsed() > Duration::from_millis(250) && idle > Duration::from_millis(250))
                || at.elapsed() > Duration::from_secs(2)
            {
                break;
            }
        } else if t0.elapsed() > p.max_time {
            bail!(
                "the sender never finished (no `done` after {:?})",
                p.max_time
            );
        }
    }
    let (snd, _) = done.unwrap();
    let end_ns = if last_arrival_ns > 0 {
        last_arrival_ns
    } else {
        t0.elapsed().as_nanos() as u64
    };
    tick.finish(
        end_ns.max(tick.last),
        stats.bytes,
        stats.unique,
        Some(stats.next_expected),
        out,
        ctl,
    )?;
    let sent = snd.datagrams;
    let received = stats.received_below(sent);
    let rep = ReceiverReport {
        duration_s: end_ns as f64 / 1e9,
        datagrams: received,
        bytes: stats.bytes,
        sent,
        lost: sent - received,
        reordered: stats.reordered,
        duplicated: stats.duplicated,
        out_of_range: stats.out_of_range + (stats.unique - received),
        jitter_ms: stats.jitter_ms(),
        ranges: stats.ranges(sent),
        streams: Vec::new(),
        hayate: None,
    };
    Ok((rep, snd))
}

/// Asks the kernel to stamp each datagram's arrival (CLOCK_REALTIME, ns): jitter then measures
/// the path, not how late this thread was scheduled.
fn enable_rx_timestamps(sock: &UdpSocket) -> bool {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with a c_int.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            &one as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        ) == 0
    }
}

/// Control buffer per message, aligned for cmsghdr; room for one timestamp.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Cmsg([u8; 64]);

/// One datagram from a batch: length, source, kernel arrival time (ns) if stamped.
type Got = (usize, Option<SocketAddr>, Option<u64>);

fn kernel_timestamp(m: &libc::msghdr) -> Option<u64> {
    // SAFETY: walks the control data the kernel wrote, within msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(m);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                return Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(m, c);
        }
    }
    None
}

/// One `recvmmsg` (waiting for the first datagram up to the socket's read timeout).
fn recvmmsg_batch(sock: &UdpSocket, bufs: &mut [Vec<u8>]) -> Result<Vec<Got>> {
    let n = bufs.len();
    let mut names: Vec<libc::sockaddr_storage> = vec![unsafe { std::mem::zeroed() }; n];
    let mut ctrl = vec![Cmsg([0; 64]); n];
    let mut iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = (0..n)
        .map(|i| {
            // SAFETY: a zeroed mmsghdr is valid; pointers below live across the call.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = &mut iov[i] as *mut libc::iovec;
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_name = &mut names[i] as *mut _ as *mut libc::c_void;
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            m.msg_hdr.msg_control = ctrl[i].0.as_mut_ptr() as *mut libc::c_void;
            m.msg_hdr.msg_controllen = 64;
            m
        })
        .collect();
    // SAFETY: all buffers outlive the call; the kernel writes at most the given lengths.
    let r = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            msgs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_WAITFORONE,
            std::ptr::null_mut(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if is_timeout(&e) || e.raw_os_error() == Some(libc::ECONNREFUSED) {
            return Ok(Vec::new());
        }
        return Err(e).context("receiving datagrams");
    }
    Ok(msgs[..r as usize]
        .iter()
        .zip(names.iter())
        .map(|(m, name)| {
            (
                m.msg_len as usize,
                sockaddr_to_std(name, m.msg_hdr.msg_namelen),
                kernel_timestamp(&m.msg_hdr),
            )
        })
        .collect())
}

fn sockaddr_to_std(s: &libc::sockaddr_storage, len: u32) -> Option<SocketAddr> {
    // SAFETY: the kernel filled `s` with a sockaddr of family ss_family and length `len`.
    unsafe {
        match s.ss_family as i32 {
            libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
                let a = &*(s as *const _ as *const libc::sockaddr_in);
                Some(SocketAddr::new(
                    IpAddr::from(u32::from_be(a.sin_addr.s_addr).to_be_bytes()),
                    u16::from_be(a.sin_port),
                ))
            }
            libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
                let a = &*(s as *const _ as *const libc::sockaddr_in6);
                Some(SocketAddr::new(
                    IpAddr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                ))
            }
            _ => None,
        }
    }
}

/// Asks for big socket buffers: the privileged FORCE variant first (it ignores rmem_max), then
/// the ordinary one.
pub fn big_buffers(sock: &socket2::Socket, bytes: usize) {
    let fd = sock.as_raw_fd();
    let v = bytes as libc::c_int;
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        // SAFETY: setsockopt with a c_int value of the right size.
        let ok = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                force,
                &v as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as u32,
            )
        } == 0;
        if !ok {
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    plain,
                    &v as *const _ as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as u32,
                );
            }
        }
    }
}

pub fn bind_udp(addr: SocketAddr) -> Result<UdpSocket> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    big_buffers(&s, 16 << 20);
    s.bind(&addr.into())
        .with_context(|| format!("binding UDP {addr}"))?;
    Ok(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_hook_rates() {
        let mut d = DropHook::new(10, 0.0, 0);
        assert_eq!((0..1000).filter(|&s| d.drop(s)).count(), 100);
        let mut r = DropHook::new(0, 0.05, 42);
        let n = (0..100_000).filter(|&s| r.drop(s)).count();
        assert!((4_700..5_300).contains(&n), "{n}");
        let mut none = DropHook::new(0, 0.0, 1);
        assert_eq!((0..1000).filter(|&s| none.drop(s)).count(), 0);
    }

    #[test]
    fn punch_layout() {
        let p = punch_packet(7, &[9; 16]);
        assert_eq!(&p[..4], MAGIC);
        assert_eq!(p[4], KIND_PUNCH);
        assert_eq!(&p[8..12], &7u32.to_be_bytes());
        assert_eq!(&p[12..], &[9; 16]);
    }
}
