//! Collects datagrams for one destination and hands them to the kernel in as few calls as
//! possible: equal-sized datagrams go out as one GSO super-buffer (or one sendmmsg).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::udp::UdpSocket;

/// One reusable buffer of datagrams for one destination, sent in as few syscalls as the
/// kernel allows; datagrams of one batch have one size, except a shorter last one.
pub struct SendBatch {
    buf: Vec<u8>,
    len: usize,
    seg: usize,
    count: usize,
    max_count: usize,
    max_datagram: usize,
    dest: Option<SocketAddr>,
    /// Datagrams the kernel refused to take even after waiting (counted, not fatal: the
    /// protocol recovers them like any loss).
    pub send_failures: u64,
}

impl SendBatch {
    /// Room for `max_count` datagrams of at most `max_datagram` bytes each; a full batch is
    /// sent at once.
    pub fn new(max_datagram: usize, max_count: usize) -> Self {
        SendBatch {
            buf: vec![0; max_datagram * (max_count + 1)],
            len: 0,
            seg: 0,
            count: 0,
            max_count,
            max_datagram,
            dest: None,
            send_failures: 0,
        }
    }

    /// Space for the next datagram: write into it, then call `commit`.
    pub fn slot(&mut self) -> &mut [u8] {
        &mut self.buf[self.len..self.len + self.max_datagram]
    }

    /// Adds the `n` bytes just written into `slot()` for `dest`, flushing as needed.
    pub fn commit(&mut self, sock: &UdpSocket, dest: SocketAddr, n: usize) {
        if self.count > 0 && (Some(dest) != self.dest || n > self.seg) {
            // Doesn't fit this batch's shape: send what came before, move it to the front.
            let start = self.len;
            self.flush_range(sock, 0, start);
            self.buf.copy_within(start..start + n, 0);
        }
        if self.count == 0 {
            self.seg = n;
            self.dest = Some(dest);
        }
        self.len += n;
        self.count += 1;
        // A shorter datagram can only be the last of a GSO batch.
        if n < self.seg || self.count >= self.max_count {
            self.flush(sock);
        }
    }

    /// Sends every datagram committed so far, waiting up to about a second for room in the
    /// socket buffer; what the kernel still refuses is counted in `send_failures`.
    pub fn flush(&mut self, sock: &UdpSocket) {
        let len = self.len;
        self.flush_range(sock, 0, len);
    }

    fn flush_range(&mut self, sock: &UdpSocket, from: usize, to: usize) {
        let (Some(dest), seg) = (self.dest, self.seg) else {
            self.reset();
            return;
        };
        let mut off = from;
        let mut stalls = 0;
        while off < to {
            match sock.send_batch(dest, &self.buf[off..to], seg) {
                Ok(n) => off = (off + n * seg).min(to),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && stalls < 100 => {
                    stalls += 1;
                    let _ = sock.wait_writable(Some(Duration::from_millis(10)));
                }
                Err(_) => {
                    // Unreachable peer, buffer full for a second, ...: drop like the network would.
                    self.send_failures += (to - off).div_ceil(seg) as u64;
                    break;
                }
            }
        }
        self.reset();
    }

    fn reset(&mut self) {
        self.len = 0;
        self.count = 0;
        self.seg = 0;
        self.dest = None;
    }
}
