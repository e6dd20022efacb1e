//! Where a session's datagrams travel: the UDP socket, or — when a firewall blocks UDP — the
//! ssh channel, each sealed datagram framed with a length prefix. The protocol above cannot
//! tell the difference: the stream is just a lossless (if full: lossy) datagram path, so the
//! same encryption, loss maps and verification apply.

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use hayate_proto::crypto::PacketKey;
use hayate_proto::wire::Cid;
use hayate_proto::ReceiverState;

use super::batch::SendBatch;
use super::open::{OpenThread, Opening, RecvBatch};
use crate::clock::wait_any_until;
use crate::udp::{RecvBufs, UdpSocket};

/// The peer address datagrams from the stream appear to come from. No UDP datagram can carry
/// it (source port 0), and those that claim it are dropped.
pub const STREAM_PEER: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));

/// Largest framed datagram accepted from the stream.
const MAX_FRAME: usize = 65536;

/// Bytes queued towards the stream before further datagrams are dropped. Dropping (instead
/// of blocking) keeps both ends reading, so two full pipes can never deadlock, and the rate
/// controller sees the drops as what they are: a path that is full.
const MAX_QUEUED: usize = 4 << 20;

/// A byte stream (pipe, ssh channel) carrying length-prefixed datagrams.
pub struct StreamLink {
    rd: OwnedFd,
    wr: OwnedFd,
    inbuf: Vec<u8>,
    /// Consumed prefix of `inbuf`.
    inpos: usize,
    out: VecDeque<u8>,
    eof: bool,
    /// Datagrams [`send`](Self::send) dropped because 4 MiB were already queued.
    pub dropped: u64,
}

impl StreamLink {
    /// `rd`/`wr` are made non-blocking; `pending` is data already read past a banner.
    pub fn new(rd: OwnedFd, wr: OwnedFd, pending: Vec<u8>) -> io::Result<Self> {
        set_nonblocking(&rd)?;
        set_nonblocking(&wr)?;
        Ok(Self {
            rd,
            wr,
            inbuf: pending,
            inpos: 0,
            out: VecDeque::new(),
            eof: false,
            dropped: 0,
        })
    }

    /// The other end closed (or the framing broke): nothing more will come.
    pub fn is_eof(&self) -> bool {
        self.eof
    }

    /// Queues one datagram; drops it when the queue is full.
    pub fn send(&mut self, d: &[u8]) {
        if self.eof {
            return;
        }
        if self.out.len() + d.len() + 4 > MAX_QUEUED {
            self.dropped += 1;
            return;
        }
        self.out.extend((d.len() as u32).to_be_bytes());
        self.out.extend(d);
    }

    /// Writes as much of the queue as the stream takes now.
    pub fn flush(&mut self) {
        while !self.out.is_empty() {
            let (a, _) = self.out.as_slices();
            // SAFETY: writes from a valid slice to an fd we own.
            let n = unsafe { libc::write(self.wr.as_raw_fd(), a.as_ptr().cast(), a.len()) };
            if n > 0 {
                self.out.drain(..n as usize);
                continue;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => return,
                _ => {
                    // EPIPE: the far side is gone.
                    self.eof = true;
                    self.out.clear();
                    return;
                }
            }
        }
    }

    /// Reads what is available and hands out each complete datagram.
    pub fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &mut [u8])) {
        let mut chunk = [0u8; 64 * 1024];
        for _ in 0..64 {
            // SAFETY: reads into a valid stack buffer from an fd we own.
            let n =
                unsafe { libc::read(self.rd.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
            if n > 0 {
                self.inbuf.extend_from_slice(&chunk[..n as usize]);
                continue;
            }
            if n == 0 {
                self.eof = true;
                break;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => break,
                _ => {
                    self.eof = true;
                    break;
                }
            }
        }
        loop {
            let avail = &mut self.inbuf[self.inpos..];
            if avail.len() < 4 {
                break;
            }
            let len = u32::from_be_bytes(avail[..4].try_into().expect("4 bytes")) as usize;
            if len > MAX_FRAME {
                // Not our framing: stop trusting the stream.
                self.eof = true;
                break;
            }
            if avail.len() < 4 + len {
                break;
            }
            f(STREAM_PEER, &mut avail[4..4 + len]);
            self.inpos += 4 + len;
        }
        if self.inpos > 0 && (self.inpos == self.inbuf.len() || self.inpos > 1 << 20) {
            self.inbuf.drain(..self.inpos);
            self.inpos = 0;
        }
    }

    /// Whether the queue can take one more datagram of any size. Senders stop at this (the
    /// channel is reliable: a datagram dropped here would only be resent); `send` still
    /// drops beyond `MAX_QUEUED` as a last resort.
    pub fn has_room(&self) -> bool {
        !self.eof && self.out.len() + 4 + MAX_FRAME <= MAX_QUEUED
    }

    fn wants_write(&self) -> bool {
        !self.out.is_empty()
    }
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on an fd we own.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// What [`Links::recv`] hands each datagram to: its sender, its arrival, its bytes, and
/// whether a thread opened it already.
pub type OnDatagram<'a> = dyn FnMut(SocketAddr, Instant, &mut [u8], Opening) + 'a;

/// Where the AEAD (sealing what is sent, opening what arrives) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AeadPlace {
    /// On the loop's thread.
    Loop,
    /// A `hayate-seal` thread seals and sends the UDP datagrams, a `hayate-open` thread
    /// receives and opens them: the loop does neither.
    Threads,
}

impl AeadPlace {
    /// For a process that runs `loops` loops at once: threads where the host has two cores
    /// for each loop's own and two to spare (a client, one loop: 4 cores). Where the loops,
    /// the disk and hash workers and the peer already fill the cores (2 cores; a daemon with
    /// a loop per core), CPU moved to another thread is not CPU saved: the hand-offs cost
    /// more than they free. `HAYATE_AEAD=loop` or `=threads` chooses instead (benchmarks,
    /// tests).
    pub fn for_loops(loops: usize) -> AeadPlace {
        match std::env::var("HAYATE_AEAD").as_deref() {
            Ok("threads") => AeadPlace::Threads,
            Ok("loop") => AeadPlace::Loop,
            _ if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 * loops + 2 => {
                AeadPlace::Threads
            }
            _ => AeadPlace::Loop,
        }
    }
}

/// The paths a driver sends and receives on: a UDP socket, a stream, or both (a far side
/// started over ssh listens on both until the client picks one).
pub struct Links {
    /// The UDP socket, if this driver has one (not on a client that carries its data over
    /// the ssh channel only).
    pub udp: Option<Arc<UdpSocket>>,
    /// The ssh channel (or another byte stream), if this driver uses one; datagrams for
    /// [`STREAM_PEER`] go here.
    pub stream: Option<StreamLink>,
    batch: SendBatch,
    rbufs: RecvBufs,
    /// Receives and opens the UDP datagrams, with [`AeadPlace::Threads`].
    opener: Option<OpenThread>,
}

impl Links {
    /// Links over the given paths, with a send batch of up to 64 datagrams of 64 KiB, the
    /// AEAD where [`AeadPlace::for_loops`] says for a process of one loop.
    pub fn new(udp: Option<UdpSocket>, stream: Option<StreamLink>) -> Self {
        Self::with_aead(udp, stream, AeadPlace::for_loops(1))
    }

    /// As [`new`](Self::new), with the UDP datagrams' AEAD at `aead` (the stream's is always
    /// on the loop's thread: its queues are the loop's).
    pub fn with_aead(udp: Option<UdpSocket>, stream: Option<StreamLink>, aead: AeadPlace) -> Self {
        let udp = udp.map(Arc::new);
        let threads = udp.clone().filter(|_| aead == AeadPlace::Threads);
        // Without the threads (the system refused one) the loop does the work.
        let opener = threads.clone().and_then(|s| OpenThread::start(s).ok());
        Self {
            udp,
            stream,
            batch: SendBatch::new(65536, 64, threads),
            rbufs: RecvBufs::new(32),
            opener,
        }
    }

    /// Whether a `hayate-seal` thread seals and sends the UDP datagrams.
    pub fn seals_on_thread(&self) -> bool {
        self.batch.seals_on_thread()
    }

    /// Whether a `hayate-open` thread receives and opens the UDP datagrams.
    pub fn opens_on_thread(&self) -> bool {
        self.opener.is_some()
    }

    /// Datagrams to session `cid` open with `key` (a no-op unless a thread opens them).
    pub fn learn_key(&mut self, cid: Cid, key: &Arc<PacketKey>) {
        if let Some(o) = &mut self.opener {
            o.learn(cid, key);
        }
    }

    /// Session `cid` is gone.
    pub fn forget_key(&mut self, cid: Cid) {
        if let Some(o) = &mut self.opener {
            o.forget(cid);
        }
    }

    /// Every datagram that arrived on either path, handed to `f` with its sender, when it
    /// arrived (the kernel's timestamp on UDP; now on the stream, whose own buffering hides
    /// it), and whether a thread opened it already (`None`: as it came).
    pub fn recv(&mut self, f: &mut OnDatagram<'_>) -> io::Result<()> {
        if let Some(o) = &mut self.opener {
            o.take(&mut |b: &mut RecvBatch| {
                let RecvBatch { bufs, meta } = b;
                for ((from, d), &(_, at, opened)) in bufs.datagrams().zip(meta.iter()) {
                    if from != STREAM_PEER {
                        f(from, at, d, opened);
                    }
                }
            })?;
        } else if let Some(sock) = &self.udp {
            sock.recv_batch(&mut self.rbufs)?;
            for (from, at, d) in self.rbufs.datagrams_at() {
                if from != STREAM_PEER {
                    f(from, at, d, None);
                }
            }
        }
        if let Some(s) = &mut self.stream {
            let now = Instant::now();
            s.recv(&mut |from, d| f(from, now, d, None));
        }
        Ok(())
    }

    /// Space for the next datagram: write into it, then `commit`.
    pub fn slot(&mut self) -> &mut [u8] {
        self.batch.slot()
    }

    /// Sends the `n` bytes just written into `slot()` to `dest`, sealed first with the key
    /// under the packet number if `seal` says so.
    pub fn commit(&mut self, dest: SocketAddr, n: usize, seal: Option<(&Arc<PacketKey>, u64)>) {
        if dest == STREAM_PEER {
            if let Some(s) = &mut self.stream {
                let d = &mut self.batch.slot()[..n];
                if let Some((key, pn)) = seal {
                    key.seal_datagram(d, pn);
                }
                s.send(d);
            }
        } else if let Some(sock) = &self.udp {
            self.batch.commit(sock, dest, n, seal);
        }
    }

    /// Whether a datagram to `dest` may be sent now: always on UDP (the network drops what
    /// it cannot carry, and the rate controller reads that), on the stream only while its
    /// queue has room (see [`StreamLink::has_room`]).
    pub fn has_room(&self, dest: SocketAddr) -> bool {
        if dest != STREAM_PEER {
            return true;
        }
        self.stream.as_ref().is_some_and(StreamLink::has_room)
    }

    /// A single datagram outside the batch (handshake replies).
    pub fn send_one(&mut self, dest: SocketAddr, d: &[u8]) {
        if dest == STREAM_PEER {
            if let Some(s) = &mut self.stream {
                s.send(d);
                s.flush();
            }
        } else if let Some(sock) = &self.udp {
            let _ = sock.send_to(dest, d);
        }
    }

    /// Sends what [`commit`](Self::commit) batched for UDP, and writes as much of the
    /// stream's queue as it takes now.
    pub fn flush(&mut self) {
        if let Some(sock) = &self.udp {
            self.batch.flush(sock);
        }
        if let Some(s) = &mut self.stream {
            s.flush();
        }
    }

    /// Sends what is batched and waits until the kernel has every datagram (the seal
    /// thread's queue is empty): the loop's last packets are out before it returns.
    pub fn finish(&mut self) {
        if let Some(sock) = &self.udp {
            self.batch.finish(sock);
        }
        if let Some(s) = &mut self.stream {
            s.flush();
        }
    }

    /// What the peer's rate controller should know of this side's receive path: the UDP
    /// socket's (a stream has TCP's own flow control).
    pub fn receiver_state(&self) -> ReceiverState {
        self.udp
            .as_ref()
            .map_or(ReceiverState::default(), |s| s.receiver_state())
    }

    /// The stream's other end closed (the ssh channel is gone); false without a stream.
    pub fn stream_eof(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_eof())
    }

    /// Sleeps until a datagram may be waiting on either path, the stream can take queued
    /// bytes, one of `extra` is ready, or `deadline` passes (µs precision, see
    /// `clock::wait_any_until`).
    pub fn wait_until(
        &self,
        deadline: Instant,
        extra: &[(std::os::fd::BorrowedFd<'_>, libc::c_short)],
    ) -> io::Result<()> {
        let mut fds = Vec::with_capacity(3 + extra.len());
        fds.extend_from_slice(extra);
        if let Some(o) = &self.opener {
            fds.push((o.fd(), libc::POLLIN));
        } else if let Some(s) = &self.udp {
            fds.push((s.as_fd(), libc::POLLIN));
        }
        if let Some(s) = self.stream.as_ref().filter(|s| !s.eof) {
            fds.push((s.rd.as_fd(), libc::POLLIN));
            if s.wants_write() {
                fds.push((s.wr.as_fd(), libc::POLLOUT));
            }
        }
        wait_any_until(&fds, deadline).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::test_pipe as pipe;

    #[test]
    fn frames_cross_a_pipe_in_order_and_garbage_ends_the_stream() {
        let (r1, w1) = pipe();
        let (r2, w2) = pipe();
        let mut a = StreamLink::new(r1, w2, Vec::new()).unwrap();
        let mut b = StreamLink::new(r2, w1, b"\0\0\0\x03xyz".to_vec()).unwrap();
        for i in 0..100u8 {
            a.send(&vec![i; i as usize * 7]);
        }
        a.flush();
        let mut got = Vec::new();
        for _ in 0..10 {
            b.recv(&mut |from, d| {
                assert_eq!(from, STREAM_PEER);
                got.push(d.to_vec());
            });
        }
        assert_eq!(got.len(), 101);
        assert_eq!(got[0], b"xyz");
        for i in 0..100u8 {
            assert_eq!(got[i as usize + 1], vec![i; i as usize * 7]);
        }
        // A length beyond any datagram: not hayate framing, stop.
        a.out.extend([0xff, 0xff, 0xff, 0xff]);
        a.flush();
        b.recv(&mut |_, _| panic!("no datagram expected"));
        assert!(b.is_eof());
    }

    #[test]
    fn full_queue_drops_instead_of_blocking() {
        let (r1, w1) = pipe();
        let (_r2, w2) = pipe();
        let mut a = StreamLink::new(r1, w2, Vec::new()).unwrap();
        drop(w1);
        let d = vec![0u8; 60000];
        for _ in 0..200 {
            a.send(&d);
            a.flush();
        }
        assert!(a.dropped > 0, "12 MB into a 64 KiB pipe nobody reads");
    }
}
