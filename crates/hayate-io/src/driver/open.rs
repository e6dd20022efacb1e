//! Receiving and opening off the protocol's loop ([`AeadPlace::Threads`](super::link::AeadPlace)):
//! a `hayate-open` thread takes the UDP datagrams from the kernel (`recvmmsg`), opens those
//! of the sessions whose receive keys the loop has told it (AES-256-GCM in place, about a
//! third of a receiving loop's CPU), and hands them over in batches, waking the loop through
//! an eventfd. The loop feeds them to the core as opened (`Connection::handle_opened_at`):
//! the core still checks that each is for the session, fresh and well formed. Datagrams of
//! no known session (hellos, a session's first packets before the loop told the key) go to
//! the loop as they came, and it handles them as before.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hayate_proto::crypto::{CryptoError, Opened, PacketKey};
use hayate_proto::wire::{self, Cid};

use crate::clock::wait_any_until;
use crate::udp::{RecvBufs, UdpSocket, DEFAULT_RECV_BATCH};

/// Batches received and not yet taken by the loop, at most; beyond, the thread waits and
/// the socket's buffer holds what arrives (as it would for a loop that is behind).
const BATCHES_QUEUED: usize = 4;

/// What the thread made of one datagram: `None` if it left it as it came.
pub(crate) type Opening = Option<Result<Opened, CryptoError>>;

/// One `recvmmsg`'s datagrams, and per datagram (in [`RecvBufs::datagrams`]'s order) its
/// sender, arrival time and opening.
pub(crate) struct RecvBatch {
    pub bufs: RecvBufs,
    pub meta: Vec<(SocketAddr, Instant, Opening)>,
}

/// A session's receive key, and the highest packet number opened under it (which dates the
/// 32 low bits a header carries).
struct KeyEntry {
    key: Arc<PacketKey>,
    largest: Option<u64>,
}

type Keys = Arc<Mutex<HashMap<Cid, KeyEntry>>>;

/// The `hayate-open` thread of a UDP socket.
pub(crate) struct OpenThread {
    keys: Keys,
    /// What the loop knows the thread holds, to tell it only what changed.
    told: HashMap<Cid, Arc<PacketKey>>,
    batches: Receiver<io::Result<RecvBatch>>,
    spare: SyncSender<RecvBatch>,
    /// Readable while batches wait for the loop.
    ready: Arc<OwnedFd>,
    /// Set, and `wake` written, when the thread is to stop.
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

fn eventfd() -> io::Result<OwnedFd> {
    rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )
    .map_err(io::Error::from)
}

fn signal(fd: &OwnedFd) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

impl OpenThread {
    pub fn start(sock: Arc<UdpSocket>) -> io::Result<Self> {
        let keys: Keys = Arc::default();
        let (tx, batches) = sync_channel(BATCHES_QUEUED);
        let (spare, spares) = sync_channel::<RecvBatch>(BATCHES_QUEUED + 1);
        let ready = Arc::new(eventfd()?);
        let wake = Arc::new(eventfd()?);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let t = Thread {
                sock,
                keys: keys.clone(),
                tx,
                spares,
                ready: ready.clone(),
                wake: wake.clone(),
                stop: stop.clone(),
            };
            std::thread::Builder::new()
                .name("hayate-open".into())
                .spawn(move || t.run())?
        };
        Ok(OpenThread {
            keys,
            told: HashMap::new(),
            batches,
            spare,
            ready,
            stop,
            wake,
            thread: Some(thread),
        })
    }

    /// Session `cid` opens with `key` from now on (a new session, or new keys).
    pub fn learn(&mut self, cid: Cid, key: &Arc<PacketKey>) {
        if self.told.get(&cid).is_some_and(|k| Arc::ptr_eq(k, key)) {
            return;
        }
        self.told.insert(cid, key.clone());
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.insert(
            cid,
            KeyEntry {
                key: key.clone(),
                largest: None,
            },
        );
    }

    /// Session `cid` is gone: its datagrams are no longer opened.
    pub fn forget(&mut self, cid: Cid) {
        if self.told.remove(&cid).is_some() {
            let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
            keys.remove(&cid);
        }
    }

    /// Every batch the thread has ready, to `f`, in order; then their buffers go back.
    pub fn take(&mut self, f: &mut dyn FnMut(&mut RecvBatch)) -> io::Result<()> {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&*self.ready, &mut b);
        loop {
            match self.batches.try_recv() {
                Ok(Ok(mut batch)) => {
                    f(&mut batch);
                    let _ = self.spare.try_send(batch);
                }
                Ok(Err(e)) => return Err(e),
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => {
                    return Err(io::Error::other("the receiving thread ended"))
                }
            }
        }
    }

    /// Readable while batches wait (the loop waits on it instead of the socket).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.ready.as_fd()
    }
}

impl Drop for OpenThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        signal(&self.wake);
        if let Some(t) = self.thread.take() {
            // A thread waiting for room in the queue needs a batch taken to see the stop.
            while !t.is_finished() {
                while self.batches.try_recv().is_ok() {}
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = t.join();
        }
    }
}

/// The thread's side.
struct Thread {
    sock: Arc<UdpSocket>,
    keys: Keys,
    tx: SyncSender<io::Result<RecvBatch>>,
    spares: Receiver<RecvBatch>,
    ready: Arc<OwnedFd>,
    wake: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
}

impl Thread {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn run(self) {
        let mut allocated = 0;
        let mut next: Option<RecvBatch> = None;
        while !self.stopped() {
            let mut batch = match next.take().or_else(|| self.spares.try_recv().ok()) {
                Some(b) => b,
                None if allocated <= BATCHES_QUEUED => {
                    allocated += 1;
                    RecvBatch {
                        bufs: RecvBufs::new(DEFAULT_RECV_BATCH),
                        meta: Vec::new(),
                    }
                }
                // Every buffer is with the loop: wait for one.
                None => match self.spares.recv_timeout(Duration::from_millis(50)) {
                    Ok(b) => b,
                    Err(_) => continue,
                },
            };
            let n = match self.sock.recv_batch(&mut batch.bufs) {
                Ok(n) => n,
                Err(e) => {
                    let _ = self.tx.send(Err(e));
                    signal(&self.ready);
                    return;
                }
            };
            if n == 0 {
                next = Some(batch);
                let fds = [
                    (self.sock.as_fd(), libc::POLLIN),
                    (self.wake.as_fd(), libc::POLLIN),
                ];
                let _ = wait_any_until(&fds, Instant::now() + Duration::from_secs(1));
                continue;
            }
            open_all(&mut batch, &self.keys);
            // Waits while the loop has `BATCHES_QUEUED` batches to take.
            if self.tx.send(Ok(batch)).is_err() {
                return;
            }
            signal(&self.ready);
        }
    }
}

/// Opens each datagram of a session whose key the thread holds.
fn open_all(batch: &mut RecvBatch, keys: &Mutex<HashMap<Cid, KeyEntry>>) {
    batch.meta.clear();
    let mut keys = keys.lock().unwrap_or_else(|e| e.into_inner());
    for (from, at, d) in batch.bufs.datagrams_at() {
        let entry = match wire::peek_kind(d) {
            Ok(wire::PacketKind::Sealed) => wire::sealed_dest_cid(d)
                .ok()
                .and_then(|cid| keys.get_mut(&cid)),
            _ => None,
        };
        let opening = match (entry, wire::sealed_pn_bits(d)) {
            (Some(e), Ok(bits)) => {
                let pn = wire::decode_pn(bits, e.largest.map_or(0, |l| l + 1));
                let r = e.key.open_datagram(d, pn);
                if r.is_ok() && e.largest.is_none_or(|l| pn > l) {
                    e.largest = Some(pn);
                }
                Some(r)
            }
            _ => None,
        };
        batch.meta.push((from, at, opening));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sealed datagram for `cid` with packet number `pn`, and its plaintext.
    fn sealed(key: &PacketKey, cid: Cid, pn: u64, len: usize) -> (Vec<u8>, Vec<u8>) {
        let plain: Vec<u8> = (0..len).map(|i| (i as u64 * 7 + pn) as u8).collect();
        let mut d = vec![0u8; wire::SEALED_HEADER_LEN + len + wire::TAG_LEN];
        wire::write_sealed_header(&mut d, cid, pn);
        d[wire::SEALED_HEADER_LEN..][..len].copy_from_slice(&plain);
        key.seal_datagram(&mut d, pn);
        (d, plain)
    }

    /// Takes batches until `want` datagrams came (or 5 s passed): (from, bytes, opening).
    fn take_n(t: &mut OpenThread, want: usize) -> Vec<(SocketAddr, Vec<u8>, Opening)> {
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(5);
        while got.len() < want && Instant::now() < until {
            let _ = wait_any_until(
                &[(t.fd(), libc::POLLIN)],
                Instant::now() + Duration::from_millis(100),
            );
            t.take(&mut |b: &mut RecvBatch| {
                let RecvBatch { bufs, meta } = b;
                for ((from, d), &(at_from, _, o)) in bufs.datagrams().zip(meta.iter()) {
                    assert_eq!(from, at_from);
                    got.push((from, d.to_vec(), o));
                }
            })
            .unwrap();
        }
        got
    }

    /// The thread opens the datagrams of the sessions it was told the keys of, each under
    /// its packet number (the plaintext is then in place), says which failed to open, and
    /// passes on as they came those of other sessions, anything not sealed, and, once told
    /// a session is gone, its datagrams too.
    #[test]
    fn the_thread_opens_what_it_holds_keys_for_and_passes_on_the_rest() {
        let rx = Arc::new(UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap());
        let tx = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let (to, from) = (rx.local_addr().unwrap(), tx.local_addr().unwrap());
        let mut t = OpenThread::start(rx).unwrap();
        let keys = [
            Arc::new(PacketKey::new(&[1; 32])),
            Arc::new(PacketKey::new(&[2; 32])),
        ];
        t.learn(10, &keys[0]);
        t.learn(20, &keys[1]);
        // What the thread should make of a datagram.
        #[derive(Debug)]
        enum Want {
            Opens(Vec<u8>),
            Fails,
            AsItCame,
        }
        let mut cases: Vec<(Vec<u8>, Want)> = Vec::new();
        for pn in 0..40u64 {
            let (k, cid) = if pn % 3 == 0 { (1, 20) } else { (0, 10) };
            let (d, plain) = sealed(&keys[k], cid, pn, 100 + pn as usize);
            cases.push((d, Want::Opens(plain)));
        }
        let (mut forged, _) = sealed(&keys[0], 10, 41, 300);
        forged[50] ^= 4;
        cases.push((forged, Want::Fails));
        let (other, _) = sealed(&keys[0], 30, 0, 64);
        cases.push((other, Want::AsItCame));
        cases.push((vec![0xff; 80], Want::AsItCame));
        for (d, _) in &cases {
            tx.send_to(to, d).unwrap();
        }
        let got = take_n(&mut t, cases.len());
        assert_eq!(got.len(), cases.len());
        for (i, ((f, d, o), (sent, want))) in got.iter().zip(&cases).enumerate() {
            assert_eq!(*f, from);
            match (o, want) {
                (Some(Ok(o)), Want::Opens(plain)) => {
                    assert_eq!(o.plain_len(), plain.len(), "datagram {i}");
                    assert!(
                        d[wire::SEALED_HEADER_LEN..][..plain.len()] == plain[..],
                        "datagram {i}"
                    );
                    assert_eq!(
                        o.pn(),
                        wire::decode_pn(wire::sealed_pn_bits(sent).unwrap(), 0)
                    );
                }
                (Some(Err(_)), Want::Fails) => {}
                (None, Want::AsItCame) => assert!(d == sent, "datagram {i} changed"),
                (o, want) => panic!("datagram {i}: {o:?}, not {want:?}"),
            }
        }
        // Once the loop forgets cid 10 (its session reaped), its datagrams pass as they came.
        t.forget(10);
        let (d, _) = sealed(&keys[0], 10, 42, 64);
        tx.send_to(to, &d).unwrap();
        let got = take_n(&mut t, 1);
        assert!(got.len() == 1 && got[0].2.is_none() && got[0].1 == d);
    }
}
