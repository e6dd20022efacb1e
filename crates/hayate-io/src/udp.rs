//! Batched, non-blocking UDP socket.
//!
//! Sending uses UDP GSO through `quinn-udp` (one `sendmsg` carries up to ~64 KiB of
//! equal-sized datagrams) and falls back to `sendmmsg(2)` when GSO is unavailable.
//! Receiving uses our own `recvmmsg(2)` with UDP GRO enabled: `quinn-udp`'s receive path
//! drops control messages it does not know, and we need `SO_RXQ_OVFL` to count kernel drops.
//! Nothing on the send or receive path allocates.

use std::io::{self, IoSlice};
use std::mem::{self, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hayate_proto::ReceiverState;
use quinn_udp::{Transmit, UdpSocketState};

use crate::clock::poll_fd;

/// Largest UDP payload of one IPv4 datagram; also the most a GSO batch may carry in total
/// (the kernel builds the batch as one IP packet of at most 64 KiB before segmenting it).
pub const MAX_UDP_PAYLOAD: usize = 65_507;

/// The longest a GRO super-buffer's segments take to arrive: one poll of the NIC's queue
/// (64 full-size frames at 1 Gbit/s take 0.8 ms).
const GRO_SPAN_MAX: Duration = Duration::from_millis(2);
/// Size of each receive buffer: one datagram, or one GRO super-buffer (at most 64 KiB).
pub const RECV_BUF_SIZE: usize = 65_536;

/// Default number of receive buffers (`recvmmsg` batch).
pub const DEFAULT_RECV_BATCH: usize = 32;

/// Requested socket buffer size. The kernel doubles what it grants (bookkeeping overhead).
const WANTED_SOCKET_BUFFER: usize = 64 << 20;

/// Most messages per `sendmmsg` in the non-GSO fallback (stack arrays, no allocation).
const MMSG_BATCH: usize = 64;

// Socket option numbers the `libc` crate does not export for Linux (asm-generic values,
// used by x86, arm, riscv, powerpc, loongarch; mips and sparc differ and just skip them).
#[cfg(not(any(target_arch = "mips", target_arch = "mips64", target_arch = "sparc64")))]
mod sockopt {
    pub const SO_SNDBUFFORCE: libc::c_int = 32;
    pub const SO_RCVBUFFORCE: libc::c_int = 33;
    pub const SO_RXQ_OVFL: libc::c_int = 40;
    pub const SO_MEMINFO: libc::c_int = 55;
    pub const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
    pub const SUPPORTED: bool = true;
}
#[cfg(any(target_arch = "mips", target_arch = "mips64", target_arch = "sparc64"))]
mod sockopt {
    pub const SO_SNDBUFFORCE: libc::c_int = -1;
    pub const SO_RCVBUFFORCE: libc::c_int = -1;
    pub const SO_RXQ_OVFL: libc::c_int = -1;
    pub const SO_MEMINFO: libc::c_int = -1;
    pub const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = -1;
    pub const SUPPORTED: bool = false;
}

/// Control-message room per received datagram: SO_RXQ_OVFL + UDP_GRO + SO_TIMESTAMPNS, plus room for the
/// address/TOS messages in case someone re-enables them.
const CTRL_LEN: usize = 256;

#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct CtrlBuf([u8; CTRL_LEN]);

/// A non-blocking UDP socket with batched send (GSO / sendmmsg) and receive (recvmmsg / GRO).
#[derive(Debug)]
pub struct UdpSocket {
    io: std::net::UdpSocket,
    state: UdpSocketState,
    rxq_ovfl: bool,
    /// Latest `SO_RXQ_OVFL` counter seen (the kernel reports the socket's running total).
    drops: AtomicU64,
    recv_buffer: usize,
    send_buffer: usize,
    /// Bound to an IPv6 address: IPv4 peers are reached through v4-mapped addresses.
    v6: bool,
    /// Set by [`UdpSocket::disable_gso`] (benchmarks, tests, NICs that mangle GSO).
    gso_off: AtomicBool,
}

/// The MTU of the kernel's route to `peer`: the outgoing interface's (65536 for loopback,
/// 1420 for a WireGuard tunnel, 9000 on a jumbo-frame LAN), or less if ICMP taught it so.
/// An upper bound on the path's MTU, which the handshake then proves (`docs/PROTOCOL.md`,
/// "Path MTU"). `None` when the kernel cannot say (no route).
pub fn route_mtu(peer: SocketAddr) -> Option<u16> {
    let bind: SocketAddr = if peer.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    // Connecting a UDP socket sends nothing: it only looks the route up.
    let s = std::net::UdpSocket::bind(bind).ok()?;
    s.connect(peer).ok()?;
    let mtu = if peer.is_ipv4() {
        rustix::net::sockopt::ip_mtu(&s)
    } else {
        rustix::net::sockopt::ipv6_mtu(&s)
    }
    .ok()?;
    Some(mtu.min(u32::from(u16::MAX)) as u16)
}

/// The largest MTU a client offers toward `peer`: its own `limit`, or less when the route's
/// interface is smaller ([`route_mtu`]).
pub fn mtu_toward(limit: u16, peer: SocketAddr) -> u16 {
    route_mtu(peer).map_or(limit, |r| limit.min(r))
}

impl UdpSocket {
    /// Binds a non-blocking socket, raises its buffers as far as allowed, enables GRO and
    /// drop counting where the kernel supports them.
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        Self::setup(std::net::UdpSocket::bind(addr)?, addr)
    }

    /// `count` sockets sharing `addr` (`SO_REUSEPORT`), one per thread of a server, each
    /// set up as [`bind`](Self::bind) does. The kernel hands socket `i` every sealed packet
    /// whose destination cid's low byte is `i` modulo `count` (a classic BPF program on the
    /// group reads that byte, `wire::SEALED_CID_LOW_BYTE_AT`), and spreads everything else
    /// (hellos) by the sender's address and port, so that a client's retried hello meets the
    /// same socket. A port another socket holds is refused as by `bind`, even one of another
    /// group of the same user's: a second server on the port fails instead of joining.
    /// Where the kernel takes no such program, one socket.
    pub fn bind_group(addr: SocketAddr, count: usize) -> io::Result<Vec<Self>> {
        let count = count.clamp(1, 64);
        if count == 1 || !sockopt::SUPPORTED {
            return Ok(vec![Self::bind(addr)?]);
        }
        if addr.port() != 0 {
            // Reuse-port sockets join any group of the same user's on the port: a plain bind
            // first says whether the port is taken.
            drop(std::net::UdpSocket::bind(addr)?);
        }
        let mut group: Vec<std::net::UdpSocket> = Vec::with_capacity(count);
        let mut at = addr;
        for _ in 0..count {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(at),
                socket2::Type::DGRAM,
                Some(socket2::Protocol::UDP),
            )?;
            s.set_reuse_port(true)?;
            s.bind(&at.into())?;
            let s = std::net::UdpSocket::from(s);
            // Port 0: the others join the port the first one got.
            at = s.local_addr()?;
            group.push(s);
        }
        if attach_cid_router(group[0].as_raw_fd(), count).is_err() {
            group.truncate(1);
        }
        group.into_iter().map(|s| Self::setup(s, addr)).collect()
    }

    fn setup(io: std::net::UdpSocket, addr: SocketAddr) -> io::Result<Self> {
        // quinn-udp sets non-blocking, UDP_GRO, IP_PMTUDISC_PROBE (no fragmentation) and
        // probes GSO support.
        let state = UdpSocketState::new((&io).into())?;
        let fd = io.as_raw_fd();

        // quinn enables IP_PKTINFO / IP_RECVTOS / IPV6_RECV*: we read none of them, and each
        // costs a control message per received datagram. Errors are irrelevant here.
        if addr.is_ipv4() {
            let _ = setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_PKTINFO, 0);
            let _ = setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 0);
        } else {
            let _ = setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 0);
            let _ = setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 0);
            let _ = setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 0);
        }

        let recv_buffer = raise_buffer(fd, libc::SO_RCVBUF, sockopt::SO_RCVBUFFORCE);
        let send_buffer = raise_buffer(fd, libc::SO_SNDBUF, sockopt::SO_SNDBUFFORCE);
        let rxq_ovfl = sockopt::SUPPORTED
            && setsockopt_int(fd, libc::SOL_SOCKET, sockopt::SO_RXQ_OVFL, 1).is_ok();
        // Arrival times: what the path did, apart from how late this process read it.
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1);

        Ok(Self {
            io,
            state,
            rxq_ovfl,
            drops: AtomicU64::new(0),
            recv_buffer,
            send_buffer,
            gso_off: AtomicBool::new(false),
            v6: addr.is_ipv6(),
        })
    }

    /// The address the socket is bound to (the port the kernel chose for port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.local_addr()
    }

    /// The underlying std socket (e.g. to `connect` or set options).
    pub fn std_socket(&self) -> &std::net::UdpSocket {
        &self.io
    }

    /// Most datagrams one GSO send may carry; 1 when GSO is unavailable (or was disabled after
    /// the kernel rejected it).
    pub fn max_gso_segments(&self) -> usize {
        if self.gso_off.load(Ordering::Relaxed) {
            1
        } else {
            self.state.max_gso_segments()
        }
    }

    /// Sends without GSO from now on (one `sendmmsg` per up to 64 datagrams).
    pub fn disable_gso(&self) {
        self.gso_off.store(true, Ordering::Relaxed);
    }

    /// Most datagrams the kernel may coalesce into one receive buffer; 1 without GRO.
    pub fn gro_segments(&self) -> usize {
        self.state.gro_segments()
    }

    /// Receive buffer size the kernel granted (as reported by `SO_RCVBUF`, i.e. doubled).
    pub fn recv_buffer_size(&self) -> usize {
        self.recv_buffer
    }

    /// Send buffer size the kernel granted (as reported by `SO_SNDBUF`, i.e. doubled).
    pub fn send_buffer_size(&self) -> usize {
        self.send_buffer
    }

    /// Sends `data` as back-to-back datagrams of `seg` bytes (the last may be shorter) to
    /// `dest`. Returns how many datagrams the kernel accepted; the caller resends the rest
    /// after [`wait_writable`](Self::wait_writable). Errors (including `WouldBlock`) are only
    /// returned when not even one datagram was accepted.
    ///
    /// `seg` must fit the path MTU (`mtu - 28` for IPv4): the kernel rejects oversized GSO
    /// segments with EINVAL, which also makes quinn-udp turn GSO off for this socket.
    pub fn send_batch(&self, dest: SocketAddr, data: &[u8], seg: usize) -> io::Result<usize> {
        if seg == 0 || seg > MAX_UDP_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("segment size {seg} out of range 1..={MAX_UDP_PAYLOAD}"),
            ));
        }
        let dest = self.native(dest);
        let mut sent = 0usize;
        let mut off = 0usize;
        let mut dest_addr: Option<socket2::SockAddr> = None;
        while off < data.len() {
            let gso = self.max_gso_segments();
            let result = if gso > 1 {
                let per = gso.min(MAX_UDP_PAYLOAD / seg).max(1);
                let end = data.len().min(off + per * seg);
                let chunk = &data[off..end];
                let transmit = Transmit {
                    destination: dest,
                    ecn: None,
                    contents: chunk,
                    segment_size: (chunk.len() > seg).then_some(seg),
                    src_ip: None,
                };
                match self.state.try_send((&self.io).into(), &transmit) {
                    Ok(()) => Ok((chunk.len().div_ceil(seg), chunk.len())),
                    // quinn-udp turned GSO off (EIO/EINVAL from a NIC without it): retry this
                    // chunk through the sendmmsg path.
                    Err(e)
                        if self.state.max_gso_segments() == 1
                            && e.kind() != io::ErrorKind::WouldBlock =>
                    {
                        continue
                    }
                    Err(e) => Err(e),
                }
            } else {
                let dest_addr = dest_addr.get_or_insert_with(|| socket2::SockAddr::from(dest));
                sendmmsg(self.io.as_raw_fd(), dest_addr, &data[off..], seg)
            };
            match result {
                Ok((datagrams, bytes)) => {
                    sent += datagrams;
                    off += bytes;
                }
                Err(e) if sent == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(sent)
    }

    /// On a dual-stack IPv6 socket, IPv4 destinations must be given v4-mapped.
    fn native(&self, dest: SocketAddr) -> SocketAddr {
        match dest {
            SocketAddr::V4(a) if self.v6 => {
                SocketAddr::new(a.ip().to_ipv6_mapped().into(), a.port())
            }
            other => other,
        }
    }

    /// Sends one datagram. `WouldBlock` when the socket buffer is full.
    pub fn send_to(&self, dest: SocketAddr, data: &[u8]) -> io::Result<()> {
        let dest = self.native(dest);
        loop {
            match self.io.send_to(data, dest) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Receives as many datagrams as are ready (up to the buffers' capacity) without
    /// blocking. Returns the number of datagrams (GRO super-buffers count as their segments),
    /// 0 when nothing was ready; never `WouldBlock`. Read them with [`RecvBufs::datagrams`].
    pub fn recv_batch(&self, bufs: &mut RecvBufs) -> io::Result<usize> {
        bufs.filled = 0;
        let n = bufs.capacity();
        bufs.prepare();
        let got = loop {
            // SAFETY: prepare() pointed every header at buffers owned by `bufs`, which stays
            // mutably borrowed (and so unmoved) for the whole call.
            let r = unsafe {
                libc::recvmmsg(
                    self.io.as_raw_fd(),
                    bufs.hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(e),
            }
        };
        let mut datagrams = 0;
        let mut max_drops = None;
        for i in 0..got {
            let (meta, drops) = decode(&bufs.hdrs[i], &bufs.names[i]);
            if let Some(d) = drops {
                max_drops = Some(max_drops.map_or(d, |m: u32| m.max(d)));
            }
            if meta.len > 0 {
                datagrams += meta.len.div_ceil(meta.stride);
            }
            bufs.metas[i] = meta;
        }
        bufs.filled = got;
        if let Some(d) = max_drops {
            // The counter is a running u32 total; keep the largest seen.
            self.drops.fetch_max(u64::from(d), Ordering::Relaxed);
        }
        Ok(datagrams)
    }

    /// Blocks until readable or `timeout` passes (`None`: forever). True if readable.
    pub fn wait_readable(&self, timeout: Option<Duration>) -> io::Result<bool> {
        Ok(self.poll(true, false, timeout)?.0)
    }

    /// Blocks until writable (socket buffer has room) or `timeout` passes. True if writable.
    pub fn wait_writable(&self, timeout: Option<Duration>) -> io::Result<bool> {
        Ok(self.poll(false, true, timeout)?.1)
    }

    /// Blocks until any requested readiness or `timeout`; returns (readable, writable).
    /// Errors pending on the socket count as both (the next call reports them).
    pub fn poll(
        &self,
        read: bool,
        write: bool,
        timeout: Option<Duration>,
    ) -> io::Result<(bool, bool)> {
        let mut events = 0;
        if read {
            events |= libc::POLLIN;
        }
        if write {
            events |= libc::POLLOUT;
        }
        let revents = poll_fd(self.as_fd(), events, timeout)?;
        let err = revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0;
        Ok((
            read && (err || revents & libc::POLLIN != 0),
            write && (err || revents & libc::POLLOUT != 0),
        ))
    }

    /// `(waiting, size)` of the receive buffer, in the kernel's accounting (each datagram
    /// counts with its buffer overhead, as when the kernel decides to drop): `SO_MEMINFO`'s
    /// `rmem_alloc` and `rcvbuf`. `None` where the kernel does not tell (Linux < 4.11).
    pub fn receive_buffer_fill(&self) -> Option<(u64, u64)> {
        if !sockopt::SUPPORTED {
            return None;
        }
        let mut info = [0u32; 2];
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: `info` is writable for `len` bytes; the kernel writes at most that many.
        let rc = unsafe {
            libc::getsockopt(
                self.io.as_raw_fd(),
                libc::SOL_SOCKET,
                sockopt::SO_MEMINFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let (used, size) = (
            info[libc::SK_MEMINFO_RMEM_ALLOC as usize],
            info[libc::SK_MEMINFO_RCVBUF as usize],
        );
        (rc == 0 && len as usize == std::mem::size_of_val(&info) && size > 0)
            .then_some((u64::from(used), u64::from(size)))
    }

    /// The receive buffer's fill and drops, for the peer's rate controller.
    pub fn receiver_state(&self) -> ReceiverState {
        let (buffered, buffer) = self.receive_buffer_fill().unwrap_or((0, 0));
        ReceiverState {
            buffered,
            buffer,
            os_drops: self.kernel_drops(),
            store_room: None,
        }
    }

    /// Datagrams the kernel dropped on this socket's receive queue so far (buffer full etc.).
    /// From `SO_RXQ_OVFL` when available: cheap, but only updated when a datagram arrives
    /// after the drops. Otherwise from `/proc/net/udp{,6}`; 0 if neither is available.
    pub fn kernel_drops(&self) -> u64 {
        if self.rxq_ovfl {
            self.drops.load(Ordering::Relaxed)
        } else {
            self.kernel_drops_proc().unwrap_or(0)
        }
    }

    /// Exact drop count from `/proc/net/udp{,6}` (reads and parses the whole table: call it
    /// for stats, not per packet). `None` if the socket is not listed there.
    pub fn kernel_drops_proc(&self) -> Option<u64> {
        let ino = std::fs::metadata(format!("/proc/self/fd/{}", self.io.as_raw_fd()))
            .ok()?
            .ino();
        ["/proc/net/udp", "/proc/net/udp6"]
            .iter()
            .find_map(|table| proc_drops(table, ino))
    }
}

impl AsFd for UdpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.io.as_fd()
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.io.as_raw_fd()
    }
}

/// Preallocated receive buffers and `recvmmsg` headers for [`UdpSocket::recv_batch`].
pub struct RecvBufs {
    storage: Box<[u8]>,
    metas: Vec<Meta>,
    filled: usize,
    names: Vec<MaybeUninit<libc::sockaddr_storage>>,
    ctrls: Vec<CtrlBuf>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iovs`/`hdrs` point into this struct's own heap buffers and are
// rewritten before every use (`prepare`), so moving the struct to another thread is sound.
unsafe impl Send for RecvBufs {}

#[derive(Clone, Copy, Debug)]
struct Meta {
    addr: SocketAddr,
    len: usize,
    stride: usize,
    /// Kernel receive timestamp (CLOCK_REALTIME), ns; 0 if none.
    rx_real_ns: u64,
}

impl RecvBufs {
    /// `batch` buffers of [`RECV_BUF_SIZE`] bytes (`batch` = datagrams or GRO super-buffers
    /// per `recvmmsg`).
    pub fn new(batch: usize) -> Self {
        let batch = batch.max(1);
        let unspecified = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0);
        Self {
            storage: vec![0u8; batch * RECV_BUF_SIZE].into_boxed_slice(),
            metas: vec![
                Meta {
                    addr: unspecified,
                    len: 0,
                    stride: 1,
                    rx_real_ns: 0,
                };
                batch
            ],
            filled: 0,
            names: vec![MaybeUninit::zeroed(); batch],
            ctrls: vec![CtrlBuf([0; CTRL_LEN]); batch],
            // SAFETY: iovec and mmsghdr are plain C structs; all-zero is a valid value.
            iovs: vec![unsafe { mem::zeroed() }; batch],
            hdrs: vec![unsafe { mem::zeroed() }; batch],
        }
    }

    /// Number of receive buffers.
    pub fn capacity(&self) -> usize {
        self.metas.len()
    }

    /// The datagrams of the last [`UdpSocket::recv_batch`], in arrival order, GRO
    /// super-buffers split by their stride. Empty datagrams are skipped.
    pub fn datagrams(&mut self) -> impl Iterator<Item = (SocketAddr, &mut [u8])> + '_ {
        let metas = &self.metas[..self.filled];
        self.storage
            .chunks_mut(RECV_BUF_SIZE)
            .zip(metas.iter())
            .flat_map(|(buf, m)| {
                let addr = m.addr;
                buf[..m.len].chunks_mut(m.stride).map(move |d| (addr, d))
            })
    }

    /// Like [`datagrams`](Self::datagrams), with each datagram's arrival time by the kernel's
    /// receive timestamp, mapped onto the monotonic clock; now where the kernel gave none
    /// or it is implausible.
    pub fn datagrams_at(&mut self) -> impl Iterator<Item = (SocketAddr, Instant, &mut [u8])> + '_ {
        // Both clocks read back to back; retried if this thread was preempted between them,
        // which would shift every arrival (and the minimum RTT, for good) by the preemption.
        let mut now = Instant::now();
        let mut real_now = 0;
        for _ in 0..4 {
            real_now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let after = Instant::now();
            if after.duration_since(now) < Duration::from_micros(20) {
                break;
            }
            now = after;
        }
        let metas = &self.metas[..self.filled];
        self.storage
            .chunks_mut(RECV_BUF_SIZE)
            .zip(metas.iter())
            .flat_map(move |(buf, m)| {
                let addr = m.addr;
                let age = real_now.saturating_sub(m.rx_real_ns);
                // Older than 1 s is a clock step, not a wait.
                let first = if m.rx_real_ns > 0 && age < 1_000_000_000 {
                    now.checked_sub(Duration::from_nanos(age)).unwrap_or(now)
                } else {
                    now
                };
                // A GRO super-buffer carries the first segment's timestamp only; the others
                // came later, within the one poll of the NIC that merged them. Spread them
                // from the first over at most `GRO_SPAN_MAX` (until now if that is sooner):
                // the newest (whose arrival dates an ACK) is then not dated early, which would
                // make RTTs read short and spoil the minimum RTT; nor, when the buffer waited
                // for a busy receiver, dated at the read, which hid the wait from the ACK and
                // made it read as a queue on the path (10 ms at 1 Gbit/s).
                let n = m.len.div_ceil(m.stride.max(1)).max(1) as u32;
                let span = now.saturating_duration_since(first).min(GRO_SPAN_MAX);
                buf[..m.len]
                    .chunks_mut(m.stride)
                    .enumerate()
                    .map(move |(i, d)| {
                        let at = if n > 1 {
                            first + span * i as u32 / (n - 1)
                        } else {
                            first
                        };
                        (addr, at, d)
                    })
            })
    }

    fn prepare(&mut self) {
        let base = self.storage.as_mut_ptr();
        for i in 0..self.capacity() {
            self.iovs[i] = libc::iovec {
                // SAFETY: i * RECV_BUF_SIZE + RECV_BUF_SIZE <= storage.len().
                iov_base: unsafe { base.add(i * RECV_BUF_SIZE) }.cast(),
                iov_len: RECV_BUF_SIZE,
            };
            let h = &mut self.hdrs[i];
            h.msg_len = 0;
            h.msg_hdr.msg_name = self.names[i].as_mut_ptr().cast();
            h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = self.ctrls[i].0.as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = CTRL_LEN as _;
            h.msg_hdr.msg_flags = 0;
        }
    }
}

impl std::fmt::Debug for RecvBufs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBufs")
            .field("capacity", &self.capacity())
            .field("filled", &self.filled)
            .finish()
    }
}

/// Decodes one received message: source, length, GRO stride, and the SO_RXQ_OVFL counter.
fn decode(hdr: &libc::mmsghdr, name: &MaybeUninit<libc::sockaddr_storage>) -> (Meta, Option<u32>) {
    let mut len = hdr.msg_len as usize;
    let msg = &hdr.msg_hdr;
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        // Cannot happen with 64 KiB buffers; a cut datagram is useless, so drop it.
        len = 0;
    }
    let mut stride = len;
    let mut drops = None;
    let mut rx_real_ns = 0;
    // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG_* macros stay within it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::SOL_UDP, libc::UDP_GRO) => {
                    stride = data.cast::<libc::c_int>().read_unaligned() as usize;
                }
                (libc::SOL_SOCKET, t) if t == sockopt::SO_RXQ_OVFL => {
                    drops = Some(data.cast::<u32>().read_unaligned());
                }
                (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
                    let ts = data.cast::<libc::timespec>().read_unaligned();
                    rx_real_ns = (ts.tv_sec as u64)
                        .saturating_mul(1_000_000_000)
                        .saturating_add(ts.tv_nsec as u64);
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    if stride == 0 || stride > len {
        stride = len.max(1);
    }
    // SAFETY: the kernel wrote a sockaddr of the family it reports (zeroed → unspecified).
    let addr = unsafe { sockaddr_to_std(name.assume_init_ref(), msg.msg_namelen) };
    (
        Meta {
            addr,
            len,
            stride,
            rx_real_ns,
        },
        drops,
    )
}

fn sockaddr_to_std(ss: &libc::sockaddr_storage, len: libc::socklen_t) -> SocketAddr {
    let len = len as usize;
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: family and length say this is a sockaddr_in.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            ))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: family and length say this is a sockaddr_in6.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            // Report IPv4 peers of a dual-stack socket as plain IPv4 (sends map them back).
            if let Some(v4) = ip.to_ipv4_mapped() {
                return SocketAddr::V4(SocketAddrV4::new(v4, u16::from_be(a.sin6_port)));
            }
            SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            ))
        }
        _ => SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0),
    }
}

/// One `sendmmsg` of up to [`MMSG_BATCH`] datagrams from `data`; returns (datagrams, bytes).
fn sendmmsg(
    fd: RawFd,
    dest: &socket2::SockAddr,
    data: &[u8],
    seg: usize,
) -> io::Result<(usize, usize)> {
    // SAFETY: plain C structs; zero is valid, and the pointers set below outlive the call.
    let mut hdrs: [libc::mmsghdr; MMSG_BATCH] = unsafe { mem::zeroed() };
    let mut iovs: [MaybeUninit<IoSlice<'_>>; MMSG_BATCH] = [MaybeUninit::uninit(); MMSG_BATCH];
    let mut count = 0;
    for (i, chunk) in data.chunks(seg).take(MMSG_BATCH).enumerate() {
        iovs[i].write(IoSlice::new(chunk));
        let h = &mut hdrs[i].msg_hdr;
        h.msg_name = dest.as_ptr() as *mut libc::c_void;
        h.msg_namelen = dest.len();
        // IoSlice is ABI-compatible with iovec on unix.
        h.msg_iov = iovs[i].as_mut_ptr().cast();
        h.msg_iovlen = 1;
        count = i + 1;
    }
    loop {
        // SAFETY: `count` headers are initialised and point at live buffers.
        let r = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), count as libc::c_uint, 0) };
        if r >= 0 {
            let n = r as usize;
            let bytes = (n * seg).min(data.len());
            return Ok((n, bytes));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The classic BPF program of a [`UdpSocket::bind_group`]: a sealed packet (first byte
/// `SEALED_KIND_BYTE`) goes to socket `cid_low_byte % count`; anything else to an index past
/// the group, which makes the kernel pick by its hash of the addresses and ports. The
/// program sees the UDP payload from offset 0; a load past a short datagram ends it
/// returning 0 (socket 0, whose endpoint drops it).
fn attach_cid_router(fd: RawFd, count: usize) -> io::Result<()> {
    use hayate_proto::wire::{SEALED_CID_LOW_BYTE_AT, SEALED_KIND_BYTE};
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let mut prog = [
        // A = datagram[0]
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 0),
        // sealed? go on : return "none of the group"
        op(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            0,
            3,
            u32::from(SEALED_KIND_BYTE),
        ),
        // A = the cid's low byte, modulo the group's size
        op(
            libc::BPF_LD | libc::BPF_B | libc::BPF_ABS,
            0,
            0,
            SEALED_CID_LOW_BYTE_AT as u32,
        ),
        op(
            libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K,
            0,
            0,
            count as u32,
        ),
        op(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, u32::MAX),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // `fprog` points at `prog`, alive for the call.
    setsockopt(
        fd,
        libc::SOL_SOCKET,
        sockopt::SO_ATTACH_REUSEPORT_CBPF,
        &fprog,
    )
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    setsockopt(fd, level, name, &value)
}

/// `setsockopt(2)` with `value` as the option's bytes.
fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: passes a valid `T` and its size; the kernel only reads them.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn getsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: passes a valid c_int buffer and its size.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Raises a socket buffer: the `*FORCE` variant ignores `net.core.[rw]mem_max` but needs
/// CAP_NET_ADMIN; otherwise the plain option is silently capped at that sysctl. Returns the
/// size granted.
fn raise_buffer(fd: RawFd, opt: libc::c_int, force_opt: libc::c_int) -> usize {
    let want = WANTED_SOCKET_BUFFER as libc::c_int;
    let current = getsockopt_int(fd, libc::SOL_SOCKET, opt).unwrap_or(0);
    if current < want {
        let forced =
            sockopt::SUPPORTED && setsockopt_int(fd, libc::SOL_SOCKET, force_opt, want).is_ok();
        if !forced {
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, opt, want);
        }
    }
    getsockopt_int(fd, libc::SOL_SOCKET, opt).map_or(0, |v| v.max(0) as usize)
}

/// The `drops` column of the row of `/proc/net/udp*` whose inode is `ino`.
fn proc_drops(table: &str, ino: u64) -> Option<u64> {
    let text = std::fs::read_to_string(table).ok()?;
    text.lines().skip(1).find_map(|line| {
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() >= 13 && cols[9].parse::<u64>().ok()? == ino {
            cols[12].parse().ok()
        } else {
            None
        }
    })
}
