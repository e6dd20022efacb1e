//! Collects datagrams for one destination and hands them to the kernel in as few calls as
//! possible: equal-sized datagrams go out as one GSO super-buffer (or one sendmmsg).
//!
//! Sealing (AES-256-GCM, a quarter to a third of a sending loop's CPU) happens here, just
//! before the send: on the loop's thread, or, where the host has cores to spare
//! ([`AeadPlace::Threads`](super::link::AeadPlace)), on a `hayate-seal` thread that seals and
//! sends each batch while the loop builds the next. The protocol core leaves its datagrams
//! unsealed for this (`Connection::poll_transmit_deferred`).

use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hayate_proto::crypto::PacketKey;

use crate::udp::UdpSocket;

/// Batches handed to a seal thread and not sent yet, at most: enough that the loop never
/// waits while the thread works through one, few enough that what the core counted as sent
/// leaves within a fraction of a millisecond.
const BATCHES_IN_FLIGHT: usize = 4;

/// Datagrams for one destination in one buffer, at `i * seg` each.
struct Batch {
    buf: Vec<u8>,
    len: usize,
    seg: usize,
    dest: Option<SocketAddr>,
    /// The key the datagrams still to be sealed take (one session's: a batch has one
    /// destination, and one key).
    key: Option<Arc<PacketKey>>,
    /// Per datagram, its packet number if it is still to be sealed.
    pns: Vec<Option<u64>>,
}

impl Batch {
    fn new(buf: Vec<u8>) -> Self {
        Batch {
            buf,
            len: 0,
            seg: 0,
            dest: None,
            key: None,
            pns: Vec::new(),
        }
    }

    fn count(&self) -> usize {
        self.pns.len()
    }

    fn reset(&mut self) {
        self.len = 0;
        self.seg = 0;
        self.dest = None;
        self.key = None;
        self.pns.clear();
    }

    /// Seals what is still to be sealed, then sends it all, waiting up to about a second
    /// for room in the socket buffer; what the kernel still refuses adds to `failures`.
    fn seal_and_send(&mut self, sock: &UdpSocket, failures: &AtomicU64) {
        if let Some(dest) = self.dest.filter(|_| self.len > 0) {
            let seg = self.seg;
            if let Some(key) = &self.key {
                for (i, pn) in self.pns.iter().enumerate() {
                    if let Some(pn) = *pn {
                        let at = i * seg;
                        let end = (at + seg).min(self.len);
                        key.seal_datagram(&mut self.buf[at..end], pn);
                    }
                }
            }
            let mut off = 0;
            let mut stalls = 0;
            while off < self.len {
                match sock.send_batch(dest, &self.buf[off..self.len], seg) {
                    Ok(n) => off = (off + n * seg).min(self.len),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && stalls < 100 => {
                        stalls += 1;
                        let _ = sock.wait_writable(Some(Duration::from_millis(10)));
                    }
                    Err(_) => {
                        // Unreachable peer, buffer full for a second, ...: drop like the
                        // network would.
                        let left = (self.len - off).div_ceil(seg) as u64;
                        failures.fetch_add(left, Ordering::Relaxed);
                        break;
                    }
                }
            }
        }
        self.reset();
    }
}

/// A `hayate-seal` thread: seals and sends the batches it is handed, in order, and hands
/// their buffers back.
struct SealThread {
    jobs: Option<SyncSender<Batch>>,
    free: Receiver<Vec<u8>>,
    /// Buffers not allocated yet (up to [`BATCHES_IN_FLIGHT`] + the loop's own).
    unallocated: usize,
    thread: Option<JoinHandle<()>>,
}

impl SealThread {
    fn start(sock: Arc<UdpSocket>, failures: Arc<AtomicU64>) -> io::Result<Self> {
        let (jobs, rx) = sync_channel::<Batch>(BATCHES_IN_FLIGHT);
        let (give_back, free) = sync_channel::<Vec<u8>>(BATCHES_IN_FLIGHT + 1);
        let thread = std::thread::Builder::new()
            .name("hayate-seal".into())
            .spawn(move || {
                while let Ok(mut b) = rx.recv() {
                    b.seal_and_send(&sock, &failures);
                    let _ = give_back.try_send(b.buf);
                }
            })?;
        Ok(SealThread {
            jobs: Some(jobs),
            free,
            unallocated: BATCHES_IN_FLIGHT,
            thread: Some(thread),
        })
    }

    /// A buffer for the loop's next batch: one the thread is done with, a new one while
    /// fewer than the limit exist, or else the next one the thread finishes (the only wait:
    /// the thread is [`BATCHES_IN_FLIGHT`] batches behind).
    fn buffer(&mut self, size: usize) -> Vec<u8> {
        if let Ok(b) = self.free.try_recv() {
            return b;
        }
        if self.unallocated > 0 {
            self.unallocated -= 1;
            return vec![0; size];
        }
        self.free.recv().unwrap_or_else(|_| vec![0; size])
    }

    /// Waits until every batch handed over is sent.
    fn finish(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SealThread {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Datagrams for one destination, sealed and sent in as few syscalls as the kernel allows;
/// datagrams of one batch have one size, except a shorter last one.
pub struct SendBatch {
    cur: Batch,
    max_count: usize,
    max_datagram: usize,
    sealer: Option<SealThread>,
    /// Datagrams the kernel refused to take even after waiting (counted, not fatal: the
    /// protocol recovers them like any loss).
    send_failures: Arc<AtomicU64>,
}

impl SendBatch {
    /// Room for `max_count` datagrams of at most `max_datagram` bytes each; a full batch is
    /// sent at once. With `seal_thread`, a thread seals and sends the batches on that
    /// socket (on the loop's thread if it cannot be started).
    pub fn new(max_datagram: usize, max_count: usize, seal_thread: Option<Arc<UdpSocket>>) -> Self {
        let send_failures = Arc::new(AtomicU64::new(0));
        let sealer = seal_thread.and_then(|s| SealThread::start(s, send_failures.clone()).ok());
        SendBatch {
            cur: Batch::new(vec![0; max_datagram * (max_count + 1)]),
            max_count,
            max_datagram,
            sealer,
            send_failures,
        }
    }

    /// Whether a seal thread seals and sends the batches.
    pub fn seals_on_thread(&self) -> bool {
        self.sealer.is_some()
    }

    /// Datagrams the kernel refused to take even after waiting.
    pub fn send_failures(&self) -> u64 {
        self.send_failures.load(Ordering::Relaxed)
    }

    /// Space for the next datagram: write into it, then call `commit`.
    pub fn slot(&mut self) -> &mut [u8] {
        let at = self.cur.len;
        &mut self.cur.buf[at..at + self.max_datagram]
    }

    /// Adds the `n` bytes just written into `slot()` for `dest`, to be sealed with `key`
    /// under the given packet number if it is not sealed yet; sends as needed.
    pub fn commit(
        &mut self,
        sock: &UdpSocket,
        dest: SocketAddr,
        n: usize,
        seal: Option<(&Arc<PacketKey>, u64)>,
    ) {
        let other_key = match (&self.cur.key, seal) {
            (Some(k), Some((key, _))) => !Arc::ptr_eq(k, key),
            _ => false,
        };
        if self.cur.count() > 0 && (Some(dest) != self.cur.dest || n > self.cur.seg || other_key) {
            // Doesn't fit this batch's shape: send what came before, and start the next
            // batch with this datagram.
            let start = self.cur.len;
            self.dispatch(sock, start..start + n);
        }
        if self.cur.count() == 0 {
            self.cur.seg = n;
            self.cur.dest = Some(dest);
        }
        if let Some((key, _)) = seal {
            self.cur.key.get_or_insert_with(|| key.clone());
        }
        self.cur.pns.push(seal.map(|(_, pn)| pn));
        self.cur.len += n;
        // A shorter datagram can only be the last of a GSO batch.
        if n < self.cur.seg || self.cur.count() >= self.max_count {
            self.flush(sock);
        }
    }

    /// Sends every datagram committed so far (hands them to the seal thread, if there is
    /// one).
    pub fn flush(&mut self, sock: &UdpSocket) {
        if self.cur.count() > 0 {
            let end = self.cur.len;
            self.dispatch(sock, end..end);
        }
    }

    /// Waits until everything flushed so far has been handed to the kernel.
    pub fn finish(&mut self, sock: &UdpSocket) {
        self.flush(sock);
        if let Some(mut s) = self.sealer.take() {
            s.finish();
        }
    }

    /// Sends the current batch (up to its `len`) and starts the next one with the bytes at
    /// `carry` (a datagram written past the batch) at its front.
    fn dispatch(&mut self, sock: &UdpSocket, carry: Range<usize>) {
        if let Some(s) = &mut self.sealer {
            let mut buf = s.buffer(self.cur.buf.len());
            buf[..carry.len()].copy_from_slice(&self.cur.buf[carry]);
            let b = std::mem::replace(&mut self.cur, Batch::new(buf));
            if let Some(jobs) = &s.jobs {
                // The thread runs as long as `jobs` lives: it takes the batch.
                let _ = jobs.send(b);
            }
        } else {
            self.cur.seal_and_send(sock, &self.send_failures);
            self.cur.buf.copy_within(carry, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use hayate_proto::wire;

    use super::*;
    use crate::driver::link::AeadPlace;
    use crate::udp::{RecvBufs, DEFAULT_RECV_BATCH};

    fn lo() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    /// Everything `sock` receives until it has been quiet for 300 ms.
    fn drain(sock: &UdpSocket) -> Vec<Vec<u8>> {
        let mut bufs = RecvBufs::new(DEFAULT_RECV_BATCH);
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if sock.recv_batch(&mut bufs).unwrap() == 0 {
                if !sock
                    .wait_readable(Some(Duration::from_millis(300)))
                    .unwrap()
                {
                    break;
                }
                continue;
            }
            got.extend(bufs.datagrams().map(|(_, d)| d.to_vec()));
        }
        got
    }

    /// On the loop's thread and on a seal thread alike: each datagram reaches its
    /// destination in order, sealed under its own packet number with its session's key
    /// (it opens with them and nothing else), or as it was given if it came sealed (a
    /// hello); a change of size, destination or key starts a new batch, and `finish` waits
    /// until all of it is out.
    #[test]
    fn datagrams_are_sealed_under_their_numbers_and_sent_in_order_on_either_thread() {
        for place in [AeadPlace::Loop, AeadPlace::Threads] {
            let tx = Arc::new(UdpSocket::bind(lo()).unwrap());
            let rx = [
                UdpSocket::bind(lo()).unwrap(),
                UdpSocket::bind(lo()).unwrap(),
            ];
            let dest = [rx[0].local_addr().unwrap(), rx[1].local_addr().unwrap()];
            let keys = [
                Arc::new(PacketKey::new(&[1; 32])),
                Arc::new(PacketKey::new(&[2; 32])),
            ];
            let thread = (place == AeadPlace::Threads).then(|| tx.clone());
            let mut b = SendBatch::new(2048, 8, thread);
            assert_eq!(b.seals_on_thread(), place == AeadPlace::Threads);
            // Per destination: (pn if sealed, plaintext) in the order sent.
            let mut sent: [Vec<(Option<u64>, Vec<u8>)>; 2] = [Vec::new(), Vec::new()];
            for i in 0..300u64 {
                let to = usize::from(i % 13 >= 9);
                let len = if i % 7 == 6 { 300 } else { 1000 };
                let hello = i % 11 == 0;
                let slot = b.slot();
                let plain: Vec<u8> = (0..len - wire::SEALED_HEADER_LEN - wire::TAG_LEN)
                    .map(|j| (i as usize * 31 + j * 7) as u8)
                    .collect();
                wire::write_sealed_header(slot, 7, i);
                slot[wire::SEALED_HEADER_LEN..][..plain.len()].copy_from_slice(&plain);
                let seal = (!hello).then_some((&keys[to], i));
                b.commit(&tx, dest[to], len, seal);
                sent[to].push((seal.map(|(_, pn)| pn), plain));
                if i % 5 == 4 {
                    b.flush(&tx);
                }
            }
            b.finish(&tx);
            for to in 0..2 {
                let got = drain(&rx[to]);
                assert_eq!(got.len(), sent[to].len(), "{place:?}: datagrams to {to}");
                for (k, (mut d, (pn, plain))) in got.into_iter().zip(&sent[to]).enumerate() {
                    let body = match pn {
                        Some(pn) => {
                            let mut copy = d.clone();
                            let other = keys[1 - to].open(&mut copy, *pn).is_ok();
                            assert!(!other, "{place:?}: {to}/{k} opens with the other key");
                            let opened = keys[to].open(&mut d, *pn);
                            opened.unwrap_or_else(|_| panic!("{place:?}: {to}/{k} does not open"))
                        }
                        None => &mut d[wire::SEALED_HEADER_LEN..][..plain.len()],
                    };
                    assert!(
                        body[..] == plain[..],
                        "{place:?}: {to}/{k} changed or reordered"
                    );
                }
            }
            assert_eq!(b.send_failures(), 0);
        }
    }
}
