//! `hayate tunnel`: a byte stream between this host's standard input and output (ssh's
//! `ProxyCommand` end) and a TCP connection the far side opens (normally to its own sshd),
//! carried by the session's stream (`hayate_proto::stream`) under the same pacing, rate
//! control and loss recovery as file blocks.
//!
//! The client's policy ([`run`]) asks for the tunnel once the session is up and then moves
//! bytes between the fds and the stream each turn; the server's side is `FarEnd`, which
//! `driver/server.rs` keeps per session. Both wait on their fds through
//! `engine::Policy::wait_fds`, in the one loop.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use hayate_proto::crypto::Psk;
use hayate_proto::wire::AddrFamily;
use hayate_proto::{Config, Connection, Event, Stats};

use super::engine::{self, Flow, Net, Policy, Session};
use super::link::Links;
use super::StopFlag;
use crate::udp::UdpSocket;

/// Bytes read from an fd at once.
const READ_CHUNK: usize = 256 << 10;

/// When standard output breaks (EPIPE), standard input ending within this long too is ssh
/// leaving: it closes its ends of both pipes, one after the other, and that is the normal
/// end of a tunnel, not an error.
const SSH_LEAVING: Duration = Duration::from_millis(100);

/// A tunnel session moves no files.
pub use hayate_proto::NoFiles;

/// Why a [`Pump`] stopped moving bytes one way.
#[derive(Debug)]
pub struct PumpError {
    /// Writing to the fd failed (else reading from it).
    pub writing: bool,
    /// What the system said.
    pub error: io::Error,
}

impl std::fmt::Display for PumpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.writing { "write" } else { "read" };
        write!(f, "cannot {what}: {}", self.error)
    }
}

/// Moves bytes between a pair of fds (standard input and output, or both halves of a TCP
/// socket) and a session's stream, never waiting on either.
pub struct Pump {
    rd: OwnedFd,
    /// None once closed (the peer's stream ended and every byte went out).
    wr: Option<OwnedFd>,
    /// `wr` is a socket: its end is a `shutdown(SHUT_WR)`, not a close.
    socket: bool,
    /// `rd` and `wr` are one file (a socket on both standard input and output, as socat
    /// or inetd hand it over, or the far side's TCP connection): they share the file status
    /// flags, so `wr`'s may not be put back while `rd` is still read.
    shared: bool,
    read_eof: bool,
    buf: Vec<u8>,
    /// Why moving bytes failed, once it did.
    pub error: Option<PumpError>,
    /// What the loop should wait for (set by [`Pump::pump`]).
    want_read: bool,
    want_write: bool,
    /// Original file status flags of `rd` and `wr`, restored on drop.
    flags: [(i32, i32); 2],
}

fn get_flags(fd: &OwnedFd) -> i32 {
    // SAFETY: F_GETFL on an fd we own.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) }
}

/// The fd's file type bits and identity (`st_mode & S_IFMT`, device, inode).
fn file_id(fd: &OwnedFd) -> Option<(u32, u64, u64)> {
    // SAFETY: fstat into a zeroed stat of an fd we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    Some((st.st_mode & libc::S_IFMT, st.st_dev, st.st_ino))
}

fn set_flags(fd: &OwnedFd, fl: i32) -> io::Result<()> {
    // SAFETY: F_SETFL on an fd we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Pump {
    /// `rd`/`wr` are made non-blocking (and put back as they were when the pump is dropped:
    /// a terminal shares its flags with the shell).
    pub fn new(rd: OwnedFd, wr: OwnedFd) -> io::Result<Pump> {
        let (fr, fw) = (get_flags(&rd), get_flags(&wr));
        set_flags(&rd, fr | libc::O_NONBLOCK)?;
        set_flags(&wr, fw | libc::O_NONBLOCK)?;
        let (idr, idw) = (file_id(&rd), file_id(&wr));
        let socket = idw.is_some_and(|(t, _, _)| t == libc::S_IFSOCK);
        // A socket is one file however often it is dup'ed; a pipe or terminal opened twice
        // is two, each with its own flags, and is left to be put back on its own.
        let shared = socket && idr.is_some() && idr == idw;
        Ok(Pump {
            flags: [(rd.as_raw_fd(), fr), (wr.as_raw_fd(), fw)],
            rd,
            wr: Some(wr),
            socket,
            shared,
            read_eof: false,
            buf: vec![0; READ_CHUNK],
            error: None,
            want_read: true,
            want_write: false,
        })
    }

    /// Nothing more is read: standard input ended (or the socket's reading half), or reading
    /// it failed ([`Pump::error`]).
    pub fn read_eof(&self) -> bool {
        self.read_eof
    }

    /// The writing half is closed: the peer's stream ended and every byte was written.
    pub fn write_closed(&self) -> bool {
        self.wr.is_none()
    }

    /// Moves what can move now, both ways. `send`: bytes read may go to the stream (the
    /// tunnel is asked for).
    pub fn pump(&mut self, conn: &mut Connection, send: bool) {
        // Towards the fd first: what arrived frees the peer's window.
        while let Some(wr) = &self.wr {
            let p = conn.stream_peek();
            if p.is_empty() {
                break;
            }
            // SAFETY: writes from a valid slice to an fd we own.
            let n = unsafe { libc::write(wr.as_raw_fd(), p.as_ptr().cast(), p.len()) };
            if n > 0 {
                conn.stream_consume(n as usize);
                continue;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => break,
                _ => {
                    self.error.get_or_insert(PumpError {
                        writing: true,
                        error: e,
                    });
                    self.close_write();
                }
            }
        }
        if self.wr.is_some() && conn.stream_read_done() {
            self.close_write();
        }
        // From the fd, as much as the stream takes.
        let mut reads = 0;
        while send && !self.read_eof && reads < 16 {
            let room = conn.stream_room().min(self.buf.len());
            if room == 0 {
                break;
            }
            reads += 1;
            // SAFETY: reads into our own buffer from an fd we own.
            let n = unsafe { libc::read(self.rd.as_raw_fd(), self.buf.as_mut_ptr().cast(), room) };
            if n > 0 {
                let took = conn.stream_write(&self.buf[..n as usize]);
                debug_assert_eq!(took, n as usize);
                continue;
            }
            if n == 0 {
                self.read_eof = true;
                conn.stream_finish();
                break;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => break,
                _ => {
                    self.error.get_or_insert(PumpError {
                        writing: false,
                        error: e,
                    });
                    // No more reads, but no end of stream either: the peer must not take
                    // a failure for the end (the owner of the pump closes the session).
                    self.read_eof = true;
                }
            }
        }
        self.want_read = send && !self.read_eof && conn.stream_room() > 0;
        self.want_write = self.wr.is_some() && !conn.stream_peek().is_empty();
    }

    /// Whether the reading half ends (end of file) within `limit`; what it still holds is
    /// read and dropped meanwhile. For a session already over: it waits on the fd.
    fn input_ends_within(&mut self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while !self.read_eof {
            // SAFETY: reads into our own buffer from an fd we own.
            let n = unsafe {
                libc::read(
                    self.rd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                )
            };
            if n == 0 {
                self.read_eof = true;
            } else if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => {}
                    io::ErrorKind::WouldBlock => {
                        let left = until.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return false;
                        }
                        let _ = crate::clock::poll_fd(self.rd.as_fd(), libc::POLLIN, Some(left));
                    }
                    _ => return false,
                }
            } else if Instant::now() >= until {
                return false;
            }
        }
        true
    }

    fn close_write(&mut self) {
        if let Some(wr) = self.wr.take() {
            if self.socket {
                // The peer sees the end only from a shutdown: closing one fd of a socket
                // still open for reading tells it nothing.
                // SAFETY: shutdown of a socket we own.
                unsafe { libc::shutdown(wr.as_raw_fd(), libc::SHUT_WR) };
            }
            // `rd` is still read, non-blocking: a shared file keeps the flags until the drop
            // (a blocking read would stop the loop, and the session with it).
            if !self.shared {
                self.restore(&wr, 1);
            }
        }
    }

    fn restore(&self, fd: &OwnedFd, i: usize) {
        let (raw, fl) = self.flags[i];
        if fd.as_raw_fd() == raw && fl >= 0 {
            let _ = set_flags(fd, fl);
        }
    }

    /// The fds the loop waits on for this pump.
    pub fn wait_fds(&self) -> Vec<(BorrowedFd<'_>, libc::c_short)> {
        let mut v = Vec::with_capacity(2);
        if self.want_read {
            v.push((self.rd.as_fd(), libc::POLLIN));
        }
        if let Some(wr) = self.wr.as_ref().filter(|_| self.want_write) {
            v.push((wr.as_fd(), libc::POLLOUT));
        }
        v
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.restore(&self.rd, 0);
        if let Some(wr) = &self.wr {
            self.restore(wr, 1);
        }
    }
}

/// The far side's end of a tunnel: a TCP connection being opened, then its pump.
pub(crate) enum FarEnd {
    Connecting {
        sock: socket2::Socket,
        /// Addresses still to try if this one fails.
        rest: Vec<SocketAddr>,
    },
    Open(Pump),
    Failed,
}

/// What an error connecting says to the client: "connection refused" for a closed port.
fn connect_error(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => "connection refused".to_string(),
        Some(libc::ETIMEDOUT) => "connection timed out".to_string(),
        Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => "no route to host".to_string(),
        _ => e.to_string(),
    }
}

fn start_connect(addr: SocketAddr) -> io::Result<socket2::Socket> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM.cloexec(),
        Some(socket2::Protocol::TCP),
    )?;
    s.set_nonblocking(true)?;
    let _ = s.set_tcp_nodelay(true);
    match s.connect(&addr.into()) {
        Ok(()) => Ok(s),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(s),
        Err(e) => Err(e),
    }
}

impl FarEnd {
    /// Starts connecting to `host:port` (as this host resolves it; each address in turn).
    pub(crate) fn connect(host: &str, port: u16) -> Result<FarEnd, String> {
        let mut addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {host}: {e}"))?
            .collect();
        addrs.reverse();
        let mut last = None;
        while let Some(a) = addrs.pop() {
            match start_connect(a) {
                Ok(sock) => return Ok(FarEnd::Connecting { sock, rest: addrs }),
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or_else(|| format!("no address for {host}"), |e| connect_error(&e)))
    }

    /// Moves the tunnel on: a connection attempt finishing (the client is told), bytes
    /// moving, errors ending the session.
    pub(crate) fn turn(&mut self, conn: &mut Connection) {
        if let FarEnd::Connecting { sock, rest, .. } = self {
            let ready = crate::clock::poll_fd(sock.as_fd(), libc::POLLOUT, Some(Duration::ZERO))
                .unwrap_or(0);
            if ready == 0 {
                return;
            }
            let err = match sock.take_error() {
                Ok(None) => sock.peer_addr().err(),
                Ok(Some(e)) | Err(e) => Some(e),
            };
            if let Some(e) = err {
                // The next address, if there is one ("localhost": ::1, then 127.0.0.1).
                while let Some(a) = rest.pop() {
                    if let Ok(s) = start_connect(a) {
                        *sock = s;
                        return;
                    }
                }
                conn.answer_tunnel(Err(connect_error(&e)));
                *self = FarEnd::Failed;
                return;
            }
            let FarEnd::Connecting { sock, .. } = std::mem::replace(self, FarEnd::Failed) else {
                unreachable!("matched above");
            };
            let fd = OwnedFd::from(sock);
            match fd.try_clone().and_then(|wr| Pump::new(fd, wr)) {
                Ok(p) => {
                    conn.answer_tunnel(Ok(()));
                    *self = FarEnd::Open(p);
                }
                Err(e) => {
                    conn.answer_tunnel(Err(e.to_string()));
                    return;
                }
            }
        }
        if let FarEnd::Open(p) = self {
            p.pump(conn, true);
            if let Some(e) = p.error.take() {
                conn.close(
                    Instant::now(),
                    1,
                    &format!("the far side's connection: {e}"),
                );
                *self = FarEnd::Failed;
            }
        }
    }

    /// Being opened or open: the session carries (or is about to carry) a stream.
    pub(crate) fn is_live(&self) -> bool {
        !matches!(self, FarEnd::Failed)
    }

    pub(crate) fn wait_fds(&self) -> Vec<(BorrowedFd<'_>, libc::c_short)> {
        match self {
            FarEnd::Connecting { sock, .. } => vec![(sock.as_fd(), libc::POLLOUT)],
            FarEnd::Open(p) => p.wait_fds(),
            FarEnd::Failed => Vec::new(),
        }
    }
}

/// How to reach the far side and where its end connects.
pub struct TunnelOptions {
    /// The far side's UDP address and the session key (from the ssh banner).
    pub addr: SocketAddr,
    /// The session key from the banner.
    pub psk: Psk,
    /// MTU, rate, timeouts.
    pub proto: Config,
    /// No session within this long: [`Outcome::NoUdp`].
    pub udp_timeout: Duration,
    /// Where the far side connects, as it resolves it.
    pub far_host: String,
    /// The TCP port there.
    pub far_port: u16,
}

/// How a tunnel ended.
pub enum Outcome {
    /// Both directions ended (or ssh stopped us): exit 0.
    Done,
    /// UDP never got an answer: the caller falls back (the fds are given back; nothing was
    /// read from them).
    NoUdp {
        /// Standard input, as it was taken.
        stdin: OwnedFd,
        /// Standard output, as it was taken.
        stdout: OwnedFd,
    },
    /// The far side refused (`"connection refused"`, …).
    Refused(String),
    /// The session or the fds failed (the reason).
    Failed(String),
}

/// The client's policy.
struct TunnelClient {
    pump: Option<Pump>,
    fds: Option<(OwnedFd, OwnedFd)>,
    far: (String, u16),
    stop: StopFlag,
    start: Instant,
    udp_timeout: Duration,
    connected: bool,
    no_udp: bool,
    refused: Option<String>,
    error: Option<String>,
    bye_at: Option<Instant>,
}

impl Policy for TunnelClient {
    type Files = NoFiles;

    fn begin(&mut self, now: Instant, net: &mut Net<NoFiles>) -> Flow {
        let Some((conn, _)) = net.the_one() else {
            return Flow::Stop;
        };
        if self.stop.is_stopped() {
            // ssh ended (it sends its ProxyCommand a SIGHUP): say goodbye and go.
            conn.close(now, 0, "tunnel closed");
            let cid = conn.my_cid();
            net.transmit(cid);
            return Flow::Stop;
        }
        if self.no_udp || (!self.connected && now.duration_since(self.start) >= self.udp_timeout) {
            self.no_udp = true;
            return Flow::Stop;
        }
        Flow::Go
    }

    fn on_event(&mut self, s: &mut Session<'_, NoFiles>, ev: Event, _now: Instant) {
        match ev {
            Event::Connected => {
                self.connected = true;
                s.conn.open_tunnel(&self.far.0, self.far.1);
                // An idle shell is not a dead session.
                s.conn.keep_alive(true);
                if let Some((rd, wr)) = self.fds.take() {
                    match Pump::new(rd, wr) {
                        Ok(p) => self.pump = Some(p),
                        Err(e) => {
                            self.error = Some(format!("standard input/output: {e}"));
                            s.conn.close(Instant::now(), 1, "tunnel failed");
                        }
                    }
                }
            }
            Event::TunnelAnswered { result: Err(e) } => {
                self.refused.get_or_insert(e);
                s.conn.close(Instant::now(), 0, "tunnel refused");
            }
            Event::Closed { error: Some(_) } if !self.connected => {
                // No handshake answer: UDP does not get through.
                self.no_udp = true;
            }
            Event::Closed { error: Some(e) } if self.refused.is_none() => {
                self.error.get_or_insert(e);
            }
            _ => {}
        }
    }

    fn turn(&mut self, s: &mut Session<'_, NoFiles>, now: Instant) -> bool {
        let Some(p) = self.pump.as_mut() else {
            return false;
        };
        if self.refused.is_some() || self.error.is_some() {
            return false;
        }
        p.pump(s.conn, true);
        match p.error.take() {
            Some(e) if e.writing => {
                // Nothing more reaches ssh, so the tunnel is over both ways: the session
                // closes now, and the far side's end with it. Waiting for standard input
                // to end as well would wait for ever if ssh keeps it open.
                let ssh_left =
                    e.error.raw_os_error() == Some(libc::EPIPE) && p.input_ends_within(SSH_LEAVING);
                if ssh_left {
                    s.conn.close(now, 0, "tunnel closed");
                } else {
                    let why = format!("cannot write to standard output: {}", e.error);
                    s.conn.close(now, 1, &why);
                    self.error = Some(why);
                }
                return false;
            }
            Some(e) => {
                // A read error is not an end of file: ssh's bytes stop partway, which the
                // far side must not take for ssh's end.
                let why = format!("cannot read standard input: {}", e.error);
                s.conn.close(now, 1, &why);
                self.error = Some(why);
                return false;
            }
            None => {}
        }
        let done = p.read_eof() && s.conn.stream_write_done() && p.write_closed();
        if done && self.bye_at.is_none() {
            s.conn.bye();
            self.bye_at = Some(now);
        }
        false
    }

    fn end(&mut self, now: Instant, net: &mut Net<NoFiles>) -> Flow {
        let Some((conn, _)) = net.the_one() else {
            return Flow::Stop;
        };
        if conn.is_draining() || conn.is_closed() {
            return Flow::Stop;
        }
        if self
            .bye_at
            .is_some_and(|t| now.duration_since(t) > Duration::from_secs(2))
        {
            return Flow::Stop;
        }
        Flow::Go
    }

    fn wait_fds(&self) -> Vec<(BorrowedFd<'_>, libc::c_short)> {
        self.pump.as_ref().map(Pump::wait_fds).unwrap_or_default()
    }
}

/// Runs the client's end of a tunnel over UDP: standard input (`stdin`) into the stream,
/// the stream out to `stdout`, until both directions ended.
pub fn run(
    opts: TunnelOptions,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stop: StopFlag,
) -> (Outcome, Stats) {
    let bind: SocketAddr = if opts.addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .expect("addr");
    let sock = match UdpSocket::bind(bind) {
        Ok(s) => s,
        Err(e) => {
            return (
                Outcome::Failed(format!("cannot open a UDP socket: {e}")),
                Stats::default(),
            )
        }
    };
    let fam = AddrFamily::of(&opts.addr);
    let cfg = Config {
        mtu: crate::udp::mtu_toward(opts.proto.mtu, opts.addr),
        ..opts.proto.clone()
    };
    let conn = Connection::client(cfg, &opts.psk, fam, Instant::now());
    let mut net = Net::one(Links::new(Some(sock), None), conn, opts.addr);
    let mut c = TunnelClient {
        pump: None,
        fds: Some((stdin, stdout)),
        far: (opts.far_host, opts.far_port),
        stop,
        start: Instant::now(),
        udp_timeout: opts.udp_timeout,
        connected: false,
        no_udp: false,
        refused: None,
        error: None,
        bye_at: None,
    };
    if let Err(e) = engine::run(&mut c, &mut net) {
        c.error.get_or_insert(e.to_string());
    }
    let stats = net
        .the_one()
        .map(|(conn, _)| conn.stats())
        .unwrap_or_default();
    drop(c.pump.take());
    let out = if c.no_udp {
        match c.fds.take() {
            Some((stdin, stdout)) => Outcome::NoUdp { stdin, stdout },
            None => Outcome::Failed("no UDP answer".into()),
        }
    } else if let Some(r) = c.refused {
        Outcome::Refused(r)
    } else if let Some(e) = c.error {
        Outcome::Failed(e)
    } else {
        Outcome::Done
    };
    (out, stats)
}

/// How often the fallback's blocking copies look at whether they should stop (ssh's signal,
/// or the other direction having failed).
const TCP_POLL: Duration = Duration::from_millis(100);

/// Why the TCP fallback ([`run_tcp`]) ended in error; each says which end failed.
#[derive(Debug, thiserror::Error)]
pub enum TcpTunnelError {
    /// The TCP connection could not be opened (the caller names where to).
    #[error("{0}")]
    Connect(io::Error),
    /// The TCP connection failed once open (the caller names where to).
    #[error("{0}")]
    Connection(io::Error),
    /// Reading standard input failed: ssh's bytes can no longer be carried.
    #[error("cannot read standard input: {0}")]
    Stdin(io::Error),
    /// Writing standard output failed while ssh still runs.
    #[error("cannot write to standard output: {0}")]
    Stdout(io::Error),
}

/// Reads from `fd` into `buf` once it has something, looking at `quit` every [`TCP_POLL`]
/// meanwhile: `None` when told to quit, `Some(0)` at its end.
fn read_or_quit(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    quit: &dyn Fn() -> bool,
) -> io::Result<Option<usize>> {
    loop {
        if quit() {
            return Ok(None);
        }
        match crate::clock::poll_fd(fd, libc::POLLIN, Some(TCP_POLL)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        // SAFETY: reads into a valid buffer from a borrowed, open fd.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => {}
            _ => return Err(e),
        }
    }
}

/// Writes all of `buf` to `fd` (which may have been left non-blocking by whoever shares it).
fn write_all_fd(fd: BorrowedFd<'_>, mut buf: &[u8], quit: &dyn Fn() -> bool) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: writes from a valid slice to a borrowed, open fd.
        let n = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        if n >= 0 {
            buf = &buf[n as usize..];
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock if !quit() => {
                let _ = crate::clock::poll_fd(fd, libc::POLLOUT, Some(TCP_POLL));
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

/// The fallback when UDP does not get through: the stream straight over TCP to `addr`
/// (HOST:PORT as this host reaches it), both directions copied until both ended.
///
/// Either direction failing ends both at once (the TCP connection is shut down, so the far
/// end sees it too): a tunnel missing one direction only hangs ssh. The exception is ssh
/// leaving: standard output breaking (EPIPE) with standard input ending within
/// `SSH_LEAVING` is the normal end.
pub fn run_tcp(
    addr: SocketAddr,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stop: StopFlag,
) -> Result<(), TcpTunnelError> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let tcp = std::net::TcpStream::connect(addr).map_err(TcpTunnelError::Connect)?;
    let _ = tcp.set_nodelay(true);
    let up = tcp.try_clone().map_err(TcpTunnelError::Connection)?;
    let down = tcp;
    // Set when the downward direction is over and the upward one should not wait for more.
    let quit = Arc::new(AtomicBool::new(false));
    let t = {
        let (quit, stop) = (quit.clone(), stop.clone());
        std::thread::Builder::new()
            .name("tunnel-up".into())
            .spawn(move || -> Result<(), TcpTunnelError> {
                let quit = || quit.load(Ordering::Relaxed) || stop.is_stopped();
                let mut buf = vec![0u8; 64 << 10];
                let res = loop {
                    match read_or_quit(stdin.as_fd(), &mut buf, &quit) {
                        Ok(None) => break Ok(()),
                        Ok(Some(0)) => {
                            let _ = up.shutdown(std::net::Shutdown::Write);
                            break Ok(());
                        }
                        Ok(Some(n)) => {
                            if let Err(e) = io::Write::write_all(&mut &up, &buf[..n]) {
                                break Err(TcpTunnelError::Connection(e));
                            }
                        }
                        Err(e) => break Err(TcpTunnelError::Stdin(e)),
                    }
                };
                if res.is_err() {
                    // Ends the downward direction too (its read sees the end).
                    let _ = up.shutdown(std::net::Shutdown::Both);
                }
                res
            })
            .map_err(TcpTunnelError::Connection)?
    };
    let stopped = || stop.is_stopped();
    let mut buf = vec![0u8; 64 << 10];
    let down_res = loop {
        let n = match read_or_quit(down.as_fd(), &mut buf, &stopped) {
            Ok(None) | Ok(Some(0)) => break Ok(()),
            Ok(Some(n)) => n,
            Err(e) => break Err(TcpTunnelError::Connection(e)),
        };
        if let Err(e) = write_all_fd(stdout.as_fd(), &buf[..n], &stopped) {
            break Err(TcpTunnelError::Stdout(e));
        }
    };
    drop(stdout);
    let epipe = matches!(&down_res, Err(TcpTunnelError::Stdout(e)) if e.raw_os_error() == Some(libc::EPIPE));
    let ssh_left = epipe && {
        let until = Instant::now() + SSH_LEAVING;
        while !t.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        t.is_finished()
    };
    if down_res.is_err() {
        // Nothing more reaches ssh (or comes from the far side): both ways are over.
        let _ = down.shutdown(std::net::Shutdown::Both);
        quit.store(true, Ordering::Relaxed);
    }
    // Otherwise the other direction ends with standard input, or with us.
    let up_res = t.join().unwrap_or_else(|_| {
        Err(TcpTunnelError::Connection(io::Error::other(
            "the copying thread panicked",
        )))
    });
    if ssh_left && up_res.is_ok() {
        return Ok(());
    }
    match (down_res, up_res) {
        // What failed first explains the other: a failed standard input shuts the
        // connection down, which the downward direction sees as its end.
        (Err(TcpTunnelError::Connection(_)), Err(e)) => Err(e),
        (Err(e), _) | (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(())) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::server::{serve, Scope, ServerOptions};
    use crate::driver::test_pipe as pipe;

    /// Standard input and output may be one socket (socat's `EXEC:`, inetd, systemd's
    /// socket activation): the end of the peer's stream must be a shutdown the other end
    /// sees, and the reading half must stay non-blocking (a blocking read would stop the
    /// loop, and the session with it).
    #[test]
    fn one_socket_for_both_halves_is_half_closed_and_never_blocks() {
        use std::io::{Read, Write};
        use std::os::unix::net::UnixStream;
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let rd = OwnedFd::from(ours);
        let wr = rd.try_clone().unwrap();
        let psk = Psk::generate();
        let mut conn = Connection::client(Config::default(), &psk, AddrFamily::V4, Instant::now());
        conn.open_tunnel("127.0.0.1", 22);
        let room = conn.stream_room();
        let mut p = Pump::new(rd, wr).unwrap();
        // The peer's stream ended and every byte went out.
        p.close_write();
        assert!(p.write_closed());
        theirs
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 8];
        let end = theirs.read(&mut b);
        assert!(matches!(end, Ok(0)), "the other end saw no end: {end:?}");
        assert_ne!(
            get_flags(&p.rd) & libc::O_NONBLOCK,
            0,
            "the reading half was made blocking"
        );
        // Nothing to read: the pump comes back at once, still waiting for input.
        p.pump(&mut conn, true);
        assert!(!p.read_eof());
        assert!(!p.wait_fds().is_empty());
        // What the other end still writes goes into the stream.
        theirs.write_all(b"after").unwrap();
        p.pump(&mut conn, true);
        assert_eq!(conn.stream_room(), room - 5);
        // And its end, too.
        theirs.shutdown(std::net::Shutdown::Write).unwrap();
        p.pump(&mut conn, true);
        assert!(p.read_eof());
    }

    #[test]
    fn a_daemon_refuses_tunnels() {
        let root = tempfile::tempdir().unwrap();
        let psk = Psk::generate();
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let stop = StopFlag::new();
        let server = {
            let (stop, psk, dir) = (stop.clone(), psk.clone(), root.path().to_path_buf());
            std::thread::spawn(move || {
                let opts = ServerOptions {
                    listen: addr,
                    scope: Scope::Confined(dir),
                    psk,
                    proto: Config::default(),
                    threads: 1,
                };
                let mut log = |_: &str| {};
                serve(opts, stop, &mut log).map_err(|e| e.to_string())
            })
        };
        let (stdin, _keep_writing_end) = pipe();
        let (_keep_reading_end, stdout) = pipe();
        let opts = TunnelOptions {
            addr,
            psk,
            proto: Config::default(),
            udp_timeout: Duration::from_secs(5),
            far_host: "localhost".into(),
            far_port: 22,
        };
        let (out, _) = run(opts, stdin, stdout, StopFlag::new());
        stop.stop();
        server.join().unwrap().unwrap();
        match out {
            Outcome::Refused(r) => assert!(r.contains("opens no tunnels"), "{r}"),
            Outcome::Done => panic!("a daemon opened a tunnel"),
            Outcome::NoUdp { .. } => panic!("no answer from the daemon"),
            Outcome::Failed(e) => panic!("failed: {e}"),
        }
    }
}

#[cfg(test)]
mod loopback {
    //! Both ends of a tunnel in this process, over loopback UDP: the client's [`run`] on a
    //! pair of pipes (ssh's end), the far side's `serve_stdio` connecting to a TCP listener
    //! of the test (sshd's place).
    use super::*;
    use crate::driver::server::{serve_stdio, Scope};
    use crate::driver::test_pipe as pipe;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::mpsc;
    use std::thread::{self, JoinHandle};

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[i % 4] ^ seed)
            .collect()
    }

    struct Ends {
        far_stop: StopFlag,
        far: Option<JoinHandle<Result<(), String>>>,
        /// Our ends of the far side's ssh channel: open, so it does not see ssh leave.
        _chan: (OwnedFd, OwnedFd),
        client: Option<JoinHandle<Outcome>>,
        client_stop: StopFlag,
        /// Writes to the client's standard input.
        stdin: Option<std::fs::File>,
        /// Reads the client's standard output.
        stdout: Option<std::fs::File>,
        /// The far side's TCP connection, as the service sees it.
        service: TcpStream,
    }

    impl Ends {
        fn start() -> Ends {
            let (stdin_r, stdin_w) = pipe();
            let mut e = Ends::start_with(stdin_r);
            e.stdin = Some(std::fs::File::from(stdin_w));
            e
        }

        /// Both ends, the client reading `stdin` as its standard input.
        fn start_with(stdin_r: OwnedFd) -> Ends {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let far_port = listener.local_addr().unwrap().port();
            let (chan_in, keep_w) = pipe();
            let (keep_r, chan_out) = pipe();
            let far_stop = StopFlag::new();
            let (tx, rx) = mpsc::channel();
            let far = {
                let stop = far_stop.clone();
                let dir = std::env::temp_dir();
                thread::spawn(move || {
                    let mut announce = |port: u16, psk: &Psk| {
                        let _ = tx.send((port, psk.clone()));
                        Ok(())
                    };
                    let mut log = |_: &str| {};
                    serve_stdio(
                        Scope::WholeFs(dir),
                        Config::default(),
                        (0, 0),
                        (chan_in, chan_out),
                        &mut announce,
                        stop,
                        &mut log,
                    )
                    .map_err(|e| e.to_string())
                })
            };
            let (port, psk) = rx.recv_timeout(Duration::from_secs(10)).expect("far side");
            let (stdout_r, stdout_w) = pipe();
            let client_stop = StopFlag::new();
            let client = {
                let stop = client_stop.clone();
                let opts = TunnelOptions {
                    addr: ([127, 0, 0, 1], port).into(),
                    psk,
                    proto: Config {
                        rate: hayate_proto::cc::RateConfig::Adaptive {
                            max: None,
                            min: 0,
                            policy: hayate_proto::cc::Policy::Fair,
                        },
                        ..Config::default()
                    },
                    udp_timeout: Duration::from_secs(5),
                    far_host: "127.0.0.1".into(),
                    far_port,
                };
                thread::spawn(move || run(opts, stdin_r, stdout_w, stop).0)
            };
            listener.set_nonblocking(false).unwrap();
            let (service, _) = listener.accept().unwrap();
            Ends {
                far_stop,
                far: Some(far),
                _chan: (keep_w, keep_r),
                client: Some(client),
                client_stop,
                stdin: None,
                stdout: Some(std::fs::File::from(stdout_r)),
                service,
            }
        }

        /// Waits for the client to end (both directions closed), then stops the far side.
        fn finish(mut self, limit: Duration) -> Outcome {
            let c = self.client.take().unwrap();
            let t = Instant::now();
            while !c.is_finished() {
                assert!(
                    t.elapsed() < limit,
                    "the client did not end within {limit:?}"
                );
                thread::sleep(Duration::from_millis(10));
            }
            let out = c.join().unwrap();
            self.far_stop.stop();
            self.far.take().unwrap().join().unwrap().unwrap();
            out
        }
    }

    impl Drop for Ends {
        fn drop(&mut self) {
            self.client_stop.stop();
            self.far_stop.stop();
        }
    }

    /// Both directions at once, each reader stalled first: every byte arrives, in order.
    fn exchange(up: usize, down: usize, stall: Duration, limit: Duration) {
        let mut e = Ends::start();
        let up_data = pattern(up, 1);
        let down_data = pattern(down, 2);
        let t0 = Instant::now();
        let writer = {
            let mut stdin = e.stdin.take().unwrap();
            let d = up_data.clone();
            thread::spawn(move || {
                for c in d.chunks(64 << 10) {
                    stdin.write_all(c).unwrap();
                }
            })
        };
        let reader = {
            let mut stdout = e.stdout.take().unwrap();
            thread::spawn(move || {
                thread::sleep(stall);
                let mut v = Vec::new();
                stdout.read_to_end(&mut v).unwrap();
                v
            })
        };
        let service_w = {
            let mut s = e.service.try_clone().unwrap();
            let d = down_data.clone();
            thread::spawn(move || {
                for c in d.chunks(64 << 10) {
                    s.write_all(c).unwrap();
                }
                s.shutdown(std::net::Shutdown::Write).unwrap();
            })
        };
        let service_r = {
            let mut s = e.service.try_clone().unwrap();
            thread::spawn(move || {
                thread::sleep(stall);
                let mut v = Vec::new();
                s.read_to_end(&mut v).unwrap();
                v
            })
        };
        fn wait<T>(h: &JoinHandle<T>, what: &str, t0: Instant, limit: Duration) {
            while !h.is_finished() {
                assert!(t0.elapsed() < limit, "{what} not done within {limit:?}");
                thread::sleep(Duration::from_millis(10));
            }
        }
        wait(&writer, "writing standard input", t0, limit);
        writer.join().unwrap();
        wait(&service_w, "the service's writing", t0, limit);
        service_w.join().unwrap();
        wait(&service_r, "the service's reading", t0, limit);
        let got_up = service_r.join().unwrap();
        assert_eq!(got_up.len(), up);
        assert!(got_up == up_data, "upload bytes differ");
        wait(&reader, "reading standard output", t0, limit);
        let got_down = reader.join().unwrap();
        assert_eq!(got_down.len(), down);
        assert!(got_down == down_data, "download bytes differ");
        match e.finish(limit.saturating_sub(t0.elapsed())) {
            Outcome::Done => {}
            Outcome::Failed(f) => panic!("failed: {f}"),
            Outcome::Refused(r) => panic!("refused: {r}"),
            Outcome::NoUdp { .. } => panic!("no UDP"),
        }
    }

    /// No sshd needed (so it always runs): both directions at once, each reader stalled
    /// for a second while the other side keeps writing, every byte arrives in order and both
    /// ends close. A stall anywhere (a read not resumed, an acknowledgement never sent) fails
    /// it within the limit instead of hanging.
    #[test]
    fn both_ways_with_stalled_readers() {
        exchange(
            8 << 20,
            8 << 20,
            Duration::from_secs(1),
            Duration::from_secs(120),
        );
    }

    fn describe(o: &Outcome) -> String {
        match o {
            Outcome::Done => "done".into(),
            Outcome::Failed(f) => format!("failed: {f}"),
            Outcome::Refused(r) => format!("refused: {r}"),
            Outcome::NoUdp { .. } => "no UDP".into(),
        }
    }

    /// The service sees its connection end (EOF), then closed outright (writing fails), within
    /// `limit`: the far side let go of it.
    fn wait_closed_by_far_side(service: &mut TcpStream, limit: Duration) {
        let t0 = Instant::now();
        service.set_read_timeout(Some(limit)).unwrap();
        let mut v = Vec::new();
        let r = service.read_to_end(&mut v);
        assert!(r.is_ok(), "the far side's connection did not end: {r:?}");
        service.set_write_timeout(Some(limit)).unwrap();
        let chunk = vec![0u8; 64 << 10];
        let e = loop {
            assert!(
                t0.elapsed() < limit,
                "the far side still takes bytes after {limit:?}"
            );
            if let Err(e) = service.write_all(&chunk) {
                break e;
            }
            thread::sleep(Duration::from_millis(10));
        };
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "the far side's connection is not closed: {e}"
        );
    }

    /// ssh's end of our standard output closes while ssh still runs (our standard input
    /// still open): bytes for it cannot be written, and the tunnel ends at once with that
    /// error, its session closed so that the far side lets go of its connection, instead of
    /// running on with standard input unread until a signal.
    #[test]
    fn a_broken_standard_output_ends_the_tunnel_with_an_error() {
        let mut e = Ends::start();
        drop(e.stdout.take());
        e.service.write_all(b"for ssh").unwrap();
        wait_closed_by_far_side(&mut e.service, Duration::from_secs(20));
        match e.finish(Duration::from_secs(10)) {
            Outcome::Failed(f) => assert!(f.contains("cannot write to standard output"), "{f}"),
            o => panic!("{}", describe(&o)),
        }
    }

    /// ssh leaving closes its ends of both our pipes: the broken standard output is then the
    /// normal end, and the tunnel ends without an error.
    #[test]
    fn ssh_closing_both_pipes_is_a_clean_end() {
        let mut e = Ends::start();
        drop(e.stdout.take());
        drop(e.stdin.take());
        e.service.write_all(b"for ssh").unwrap();
        wait_closed_by_far_side(&mut e.service, Duration::from_secs(20));
        match e.finish(Duration::from_secs(10)) {
            Outcome::Done => {}
            o => panic!("{}", describe(&o)),
        }
    }

    /// Reading standard input fails (here a connection reset): that is not its end of file.
    /// The tunnel ends at once with that error, its session closed so that the far side lets
    /// go of its connection, instead of passing an end of stream on as if ssh had finished.
    #[test]
    fn a_failed_read_of_standard_input_ends_the_tunnel_with_an_error() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let writer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (reader, _) = l.accept().unwrap();
        let mut e = Ends::start_with(OwnedFd::from(reader));
        // The tunnel is up (the far side connected): now its standard input fails.
        socket2::SockRef::from(&writer)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(writer);
        wait_closed_by_far_side(&mut e.service, Duration::from_secs(20));
        match e.finish(Duration::from_secs(10)) {
            Outcome::Failed(f) => assert!(f.contains("cannot read standard input"), "{f}"),
            o => panic!("{}", describe(&o)),
        }
    }
}

#[cfg(test)]
mod tcp_fallback {
    //! [`run_tcp`] between a pair of pipes (ssh's end) and a TCP listener of the test (the
    //! far host's sshd).
    use super::*;
    use crate::driver::test_pipe as pipe;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::thread::{self, JoinHandle};

    struct Fallback {
        run: Option<JoinHandle<Result<(), TcpTunnelError>>>,
        stop: StopFlag,
        /// Writes to the tunnel's standard input.
        stdin: Option<std::fs::File>,
        /// Reads the tunnel's standard output.
        stdout: Option<std::fs::File>,
        /// The connection as the far host's service sees it.
        service: TcpStream,
    }

    impl Fallback {
        /// The fallback running, `stdin` its standard input (a pipe of ours when None).
        fn start(stdin: Option<OwnedFd>) -> Fallback {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let (stdin_r, stdin_w) = match stdin {
                Some(fd) => (fd, None),
                None => {
                    let (r, w) = pipe();
                    (r, Some(std::fs::File::from(w)))
                }
            };
            let (stdout_r, stdout_w) = pipe();
            let stop = StopFlag::new();
            let run = {
                let stop = stop.clone();
                thread::spawn(move || run_tcp(addr, stdin_r, stdout_w, stop))
            };
            let (service, _) = listener.accept().unwrap();
            Fallback {
                run: Some(run),
                stop,
                stdin: stdin_w,
                stdout: Some(std::fs::File::from(stdout_r)),
                service,
            }
        }

        /// What `run_tcp` returned, which it must within `limit`.
        fn finish(mut self, limit: Duration) -> Result<(), TcpTunnelError> {
            let run = self.run.take().unwrap();
            let t = Instant::now();
            while !run.is_finished() {
                assert!(
                    t.elapsed() < limit,
                    "the fallback did not end within {limit:?}"
                );
                thread::sleep(Duration::from_millis(10));
            }
            run.join().unwrap()
        }
    }

    impl Drop for Fallback {
        fn drop(&mut self) {
            self.stop.stop();
        }
    }

    /// The service sees the connection end within `limit`.
    fn wait_ended(service: &mut TcpStream, limit: Duration) {
        service.set_read_timeout(Some(limit)).unwrap();
        let mut v = Vec::new();
        let r = service.read_to_end(&mut v);
        assert!(
            r.is_ok()
                || r.as_ref()
                    .is_err_and(|e| e.kind() == io::ErrorKind::ConnectionReset),
            "the connection did not end: {r:?}"
        );
    }

    /// Everything both ways, then both ends close: a clean end.
    #[test]
    fn copies_both_ways_and_ends_cleanly() {
        let mut f = Fallback::start(None);
        f.stdin.as_mut().unwrap().write_all(b"from ssh").unwrap();
        drop(f.stdin.take());
        f.service.write_all(b"for ssh").unwrap();
        f.service.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        f.service.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"from ssh");
        let mut out = Vec::new();
        f.stdout.take().unwrap().read_to_end(&mut out).unwrap();
        assert_eq!(out, b"for ssh");
        let r = f.finish(Duration::from_secs(10));
        assert!(r.is_ok(), "{r:?}");
    }

    /// ssh's end of our standard output closes while ssh still runs (standard input open):
    /// the fallback ends at once with that error and lets go of the connection, instead of
    /// waiting for standard input to end or a signal.
    #[test]
    fn a_broken_standard_output_ends_the_fallback_with_an_error() {
        let mut f = Fallback::start(None);
        drop(f.stdout.take());
        f.service.write_all(b"for ssh").unwrap();
        wait_ended(&mut f.service, Duration::from_secs(10));
        match f.finish(Duration::from_secs(10)) {
            Err(e @ TcpTunnelError::Stdout(_)) => {
                assert!(
                    e.to_string()
                        .starts_with("cannot write to standard output: "),
                    "{e}"
                )
            }
            r => panic!("{r:?}"),
        }
    }

    /// ssh leaving closes its ends of both our pipes: the broken standard output is then the
    /// normal end.
    #[test]
    fn ssh_closing_both_pipes_is_a_clean_end_of_the_fallback() {
        let mut f = Fallback::start(None);
        drop(f.stdout.take());
        drop(f.stdin.take());
        f.service.write_all(b"for ssh").unwrap();
        wait_ended(&mut f.service, Duration::from_secs(10));
        let r = f.finish(Duration::from_secs(10));
        assert!(r.is_ok(), "{r:?}");
    }

    /// Reading standard input fails (an fd open only for writing): an error naming it, and
    /// the connection ends, rather than an end of file passed on while the other direction
    /// waits for ever.
    #[test]
    fn a_failed_read_of_standard_input_ends_the_fallback_with_an_error() {
        let wronly = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap();
        let mut f = Fallback::start(Some(OwnedFd::from(wronly)));
        wait_ended(&mut f.service, Duration::from_secs(10));
        match f.finish(Duration::from_secs(10)) {
            Err(e @ TcpTunnelError::Stdin(_)) => {
                assert!(
                    e.to_string().starts_with("cannot read standard input: "),
                    "{e}"
                )
            }
            r => panic!("{r:?}"),
        }
    }
}
