//! Write-behind: a receiver's gathered runs of blocks are written to their file by a
//! background thread, so the protocol loop never waits on `pwrite` (the page-cache copy, or
//! a disk that throttles dirty pages).
//!
//! Each file is bound to one writer thread (a FIFO or device to a thread of its own) and
//! its jobs run in the order they were queued,
//! so work queued after some writes (the hashing of a subtree they completed, see
//! [`Queue::then`]) sees those bytes in the file. A file may have at most
//! [`MAX_QUEUED`] bytes waiting; past that, [`Queue::write`] waits (backpressure on the
//! writer of this file only). Errors are kept and returned by the next call. A stream's
//! queue also carries the writes into its holding file and the moves out of it
//! ([`Queue::write_into`], [`Queue::move_from`]), in order with its own writes.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use crate::threads::Pool;

/// Bytes one file may have queued for writing before its writer waits: enough to ride out
/// a writer thread's scheduling gaps at several Gbit/s, small next to the page cache.
pub const MAX_QUEUED: usize = 16 << 20;

/// Spare run buffers kept per file for reuse (a fresh 256 KiB buffer costs page faults).
const SPARES: usize = 8;

enum Job {
    Write {
        to: Target,
        buf: Vec<u8>,
        state: Arc<Shared>,
        /// The shared writer thread it is queued on (its load, see `Pool::least_loaded`).
        pooled: Option<usize>,
    },
    Then(Box<dyn FnOnce() + Send>),
}

/// Sees each positional write once it is done, on the writer thread, in queue order (see
/// [`Queue::observe`]).
pub type Observer = Arc<Mutex<dyn FnMut(u64, &[u8]) + Send>>;

#[derive(Default, Debug)]
struct State {
    queued: usize,
    /// The first write that failed: its OS error code, if any, and text.
    error: Option<(Option<i32>, String)>,
    spares: Vec<Vec<u8>>,
}

#[derive(Default, Debug)]
struct Shared {
    state: Mutex<State>,
    /// Signalled whenever queued bytes are written.
    written: Condvar,
    /// `state.queued` and whether `state.error` is set, kept beside the lock (written under
    /// it): the protocol loop asks both for every block it receives, and reads them here
    /// without taking the lock the writer thread takes for every run.
    queued: AtomicUsize,
    failed: AtomicBool,
}

static POOL: OnceLock<Pool<Job>> = OnceLock::new();

fn pool() -> &'static Pool<Job> {
    POOL.get_or_init(|| {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
        Pool::start(n, "hayate-write", run)
    })
}

fn run(job: Job) {
    match job {
        Job::Then(f) => f(),
        Job::Write {
            to:
                Target {
                    file,
                    from,
                    at,
                    append,
                    observer,
                },
            mut buf,
            state,
            pooled,
        } => {
            let mut r = Ok(());
            if let Some((from, len)) = &from {
                buf.resize(*len, 0);
                r = read_exact_at(from, &mut buf, at);
            }
            if r.is_ok() {
                r = if append {
                    (&*file).write_all(&buf)
                } else {
                    file.write_all_at(&buf, at)
                };
            }
            if let (Ok(()), Some((from, len))) = (&r, &from) {
                // Gone on to the destination: its space in the holding file is not needed.
                let _ = rustix::fs::fallocate(
                    from,
                    rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
                    at,
                    *len as u64,
                );
            }
            drop(from);
            if let (Ok(()), Some(o)) = (&r, observer) {
                (o.lock().expect("write observer"))(at, &buf);
            }
            // Before anyone learns the write is done: a drained file must be closable (its
            // lock released) once its owner drops it.
            drop(file);
            let len = buf.len();
            let mut s = state.state.lock().expect("write state");
            s.queued -= buf.len();
            state.queued.store(s.queued, Ordering::Release);
            if let Err(e) = r {
                s.error.get_or_insert((e.raw_os_error(), e.to_string()));
                state.failed.store(true, Ordering::Release);
            }
            if s.spares.len() < SPARES {
                buf.clear();
                s.spares.push(buf);
            }
            drop(s);
            state.written.notify_all();
            if let Some(i) = pooled {
                pool().add_load(i, -(len as isize));
            }
        }
    }
}

/// Reads all of `buf` at `at` (restarting on short reads); running out is an error.
fn read_exact_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
    file.read_exact_at(buf, at).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::other("temporary file lost data")
        } else {
            e
        }
    })
}

/// Where a queued write goes, and where its bytes come from if not from its buffer.
struct Target {
    file: Arc<File>,
    /// `len` bytes read at `at` from another file (then let go there, see
    /// [`Queue::move_from`]) instead of the job's buffer.
    from: Option<(Arc<File>, usize)>,
    /// Where in the file, or for an appending queue where in the stream (the offset its
    /// observer sees).
    at: u64,
    /// Written where the last write ended (a FIFO, a device, standard output).
    append: bool,
    observer: Option<Observer>,
}

/// The shared writer thread a new file is bound to: the least loaded.
fn pooled() -> usize {
    pool().least_loaded()
}

/// Where a queue's jobs run.
#[derive(Debug)]
enum Thread {
    /// One of the shared writer threads, by index.
    Pooled(usize),
    /// A thread of its own (a FIFO or device, whose writes may block for long).
    Own(Mutex<Sender<Job>>),
}

/// One file's queue on its writer thread.
pub struct Queue {
    file: Arc<File>,
    /// Written in order at the file's current position instead of at offsets.
    append: bool,
    thread: Thread,
    shared: Arc<Shared>,
    observer: Option<Observer>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("append", &self.append)
            .field("thread", &self.thread)
            .field("observed", &self.observer.is_some())
            .finish()
    }
}

impl Queue {
    /// Writes at the offsets given (a regular file).
    pub fn new(file: Arc<File>) -> Self {
        Self::with(file, false)
    }

    /// Writes one after another, each where the last ended (a FIFO, a device, a pipe).
    pub fn appending(file: Arc<File>) -> Self {
        Self::with(file, true)
    }

    fn with(file: Arc<File>, append: bool) -> Self {
        let thread = if append {
            // A FIFO or device write may block for as long as its reader likes: on a shared
            // thread it would hold up every other file's writes. Its own thread ends when
            // the queue is dropped (the channel closes).
            let (tx, rx) = channel::<Job>();
            let spawned = std::thread::Builder::new()
                .name("hayate-write-stream".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        run(job);
                    }
                });
            match spawned {
                Ok(_) => Thread::Own(Mutex::new(tx)),
                Err(_) => Thread::Pooled(pooled()),
            }
        } else {
            Thread::Pooled(pooled())
        };
        Queue {
            file,
            append,
            thread,
            shared: Arc::default(),
            observer: None,
        }
    }

    /// Has `f` see every write queued from now on, with its offset (for an appending queue,
    /// the one its caller gave) and bytes, once it is in the file (on the writer thread, in
    /// order): the receiver's hash takes in-order data from there instead of reading it back
    /// or hashing it on the protocol loop.
    pub fn observe(&mut self, f: Observer) {
        self.observer = Some(f);
    }

    /// Bytes that can be queued now without waiting.
    pub fn room(&self) -> usize {
        MAX_QUEUED.saturating_sub(self.shared.queued.load(Ordering::Acquire))
    }

    /// Whether `len` more bytes can be queued without waiting.
    pub fn has_room(&self, len: usize) -> bool {
        let queued = self.shared.queued.load(Ordering::Acquire);
        queued == 0 || queued + len <= MAX_QUEUED
    }

    fn send(&self, job: Job) -> io::Result<()> {
        let sent = match &self.thread {
            Thread::Pooled(i) => pool().send(*i, job).is_ok(),
            Thread::Own(tx) => tx.lock().expect("writer queue").send(job).is_ok(),
        };
        if sent {
            Ok(())
        } else {
            Err(io::Error::other("the writer thread is gone"))
        }
    }

    /// Queues `buf` to be written at `at` (when appending: after the last write, `at` only
    /// telling the observer where in the stream it is), after waiting while
    /// this file has more than [`MAX_QUEUED`] bytes waiting (see [`has_room`](Self::has_room)
    /// to avoid that). Returns an earlier write's error, if one failed.
    pub fn write(&self, at: u64, buf: Vec<u8>) -> io::Result<()> {
        self.queue_write(at, buf, true)
    }

    /// Queues `buf` as [`write`](Self::write) does, but never waits: past [`MAX_QUEUED`]
    /// too (a file let go, whose last run must not hold up the protocol loop).
    pub fn write_now(&self, at: u64, buf: Vec<u8>) -> io::Result<()> {
        self.queue_write(at, buf, false)
    }

    fn queue_write(&self, at: u64, buf: Vec<u8>, wait: bool) -> io::Result<()> {
        let to = Target {
            file: self.file.clone(),
            from: None,
            at,
            append: self.append,
            observer: self.observer.clone(),
        };
        self.queue(to, buf, wait)
    }

    /// Queues `buf` to be written at `at` into `other`, a file of this file's own (a stream's
    /// holding file for bytes that came ahead of a gap), on this file's writer thread, in
    /// order with its writes, without waiting; the observer does not see it. Counts
    /// against [`MAX_QUEUED`] until it is written.
    pub fn write_into(&self, other: &Arc<File>, at: u64, buf: Vec<u8>) -> io::Result<()> {
        let to = Target {
            file: other.clone(),
            from: None,
            at,
            append: false,
            observer: None,
        };
        self.queue(to, buf, false)
    }

    /// Queues the `len` bytes at `at` of `other` (written there by
    /// [`write_into`](Self::write_into)) to be written to this file as [`write`](Self::write)
    /// writes a buffer at `at`, without waiting, then let go in `other` (a hole punched): read
    /// on the writer thread, not by the caller.
    pub fn move_from(&self, other: &Arc<File>, at: u64, len: usize) -> io::Result<()> {
        let to = Target {
            file: self.file.clone(),
            from: Some((other.clone(), len)),
            at,
            append: self.append,
            observer: self.observer.clone(),
        };
        self.queue(to, Vec::new(), false)
    }

    fn queue(&self, to: Target, buf: Vec<u8>, wait: bool) -> io::Result<()> {
        let len = to.from.as_ref().map_or(buf.len(), |&(_, len)| len);
        let mut s = self.shared.state.lock().expect("write state");
        while wait && s.queued > 0 && s.queued + len > MAX_QUEUED && s.error.is_none() {
            s = self.shared.written.wait(s).expect("write state");
        }
        error(&s)?;
        s.queued += len;
        self.shared.queued.store(s.queued, Ordering::Release);
        drop(s);
        let pooled = match self.thread {
            Thread::Pooled(i) => Some(i),
            Thread::Own(_) => None,
        };
        if let Some(i) = pooled {
            pool().add_load(i, len as isize);
        }
        self.send(Job::Write {
            to,
            buf,
            state: self.shared.clone(),
            pooled,
        })
    }

    /// Runs `f` on the writer thread once every write queued so far is done.
    pub fn then(&self, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
        self.send(Job::Then(Box::new(f)))
    }

    /// Waits until every job queued so far, writes and [`then`](Self::then) alike, has run.
    pub fn settle(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        if self
            .then(move || {
                let _ = tx.send(());
            })
            .is_ok()
        {
            let _ = rx.recv();
        }
    }

    /// Waits until every queued write is done; the first error of any.
    pub fn drain(&self) -> io::Result<()> {
        let mut s = self.shared.state.lock().expect("write state");
        while s.queued > 0 {
            s = self.shared.written.wait(s).expect("write state");
        }
        error(&s)
    }

    /// Whether every queued write is done.
    pub fn idle(&self) -> bool {
        self.shared.state.lock().expect("write state").queued == 0
    }

    /// The first error of a write done so far, without waiting.
    pub fn check(&self) -> io::Result<()> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        error(&self.shared.state.lock().expect("write state"))
    }

    /// An empty buffer with room for `cap` bytes, reused when one is spare.
    pub fn buffer(&self, cap: usize) -> Vec<u8> {
        let spare = self.shared.state.lock().expect("write state").spares.pop();
        match spare {
            Some(b) if b.capacity() >= cap => b,
            _ => Vec::with_capacity(cap),
        }
    }
}

/// Waits until every job queued so far on the shared writer threads has run: what a process
/// does before it exits, so that the last writes and resume states of the files it let go
/// without waiting (`PartFile`'s `Drop`) are in place. Streams' own threads are not waited
/// for: their output is not resumable.
pub fn settle_all() {
    let Some(pool) = POOL.get() else {
        return;
    };
    let done: Vec<_> = (0..pool.len())
        .filter_map(|i| {
            let (tx, rx) = channel::<()>();
            let job = Job::Then(Box::new(move || {
                let _ = tx.send(());
            }));
            pool.send(i, job).ok().map(|()| rx)
        })
        .collect();
    for rx in done {
        let _ = rx.recv();
    }
}

fn error(s: &State) -> io::Result<()> {
    match &s.error {
        None => Ok(()),
        Some((Some(code), _)) => Err(io::Error::from_raw_os_error(*code)),
        Some((None, text)) => Err(io::Error::other(text.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::time::Duration;

    #[test]
    fn writes_land_in_order_with_work_queued_after_them() {
        let file = Arc::new(tempfile::tempfile().unwrap());
        let q = Queue::new(file.clone());
        let n = 200usize;
        for i in 0..n {
            let mut b = q.buffer(64 << 10);
            b.resize(64 << 10, i as u8);
            q.write(i as u64 * (64 << 10), b).unwrap();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let f2 = file.clone();
        q.then(move || {
            // Everything queued before is in the file when this runs.
            let mut last = vec![0u8; 64 << 10];
            f2.read_exact_at(&mut last, (n as u64 - 1) * (64 << 10))
                .unwrap();
            tx.send(last.iter().all(|&x| x == (n - 1) as u8)).unwrap();
        })
        .unwrap();
        assert!(rx.recv().unwrap());
        q.drain().unwrap();
        assert_eq!(file.metadata().unwrap().len(), n as u64 * (64 << 10));
    }

    #[test]
    fn an_appending_queue_writes_in_order_and_tells_when_it_is_full() {
        let file = Arc::new(tempfile::tempfile().unwrap());
        let q = Queue::appending(file.clone());
        assert!(q.has_room(MAX_QUEUED));
        for i in 0..100u8 {
            q.write(0, vec![i; 1000]).unwrap();
        }
        q.drain().unwrap();
        let mut got = vec![0u8; 100_000];
        file.read_exact_at(&mut got, 0).unwrap();
        assert!(got
            .chunks(1000)
            .enumerate()
            .all(|(i, c)| c.iter().all(|&b| b == i as u8)));
        // A writer stuck behind a job that waits: the queue fills and says so.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        q.then(move || {
            let _ = wait.recv();
        })
        .unwrap();
        q.write(0, vec![0; MAX_QUEUED - 10]).unwrap();
        assert!(q.has_room(10));
        assert!(!q.has_room(11));
        go.send(()).unwrap();
        q.drain().unwrap();
        assert!(q.has_room(MAX_QUEUED));
    }

    #[test]
    fn a_stuck_pipe_holds_up_only_its_own_queue() {
        use std::os::fd::FromRawFd;
        let mut fds = [0i32; 2];
        // SAFETY: pipe(2) into a two-element array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors are fresh and owned here.
        let (rd, wr) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        let stuck = Queue::appending(Arc::new(wr));
        // More than a pipe holds, and nobody reads: its writer blocks.
        stuck.write(0, vec![1; 1 << 20]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!stuck.idle());
        // Every shared writer thread still writes other files at once.
        for _ in 0..8 {
            let file = Arc::new(tempfile::tempfile().unwrap());
            let q = Queue::new(file.clone());
            q.write(0, vec![2; 4096]).unwrap();
            let t0 = std::time::Instant::now();
            q.drain().unwrap();
            assert!(t0.elapsed() < Duration::from_secs(2));
            assert_eq!(file.metadata().unwrap().len(), 4096);
        }
        drop(rd);
        // The reader gone, the stuck write fails (EPIPE) instead of hanging.
        assert!(stuck.drain().is_err());
    }

    #[test]
    fn a_failed_write_is_reported_by_later_calls() {
        // A file opened read-only: every write fails with EBADF.
        let path = tempfile::NamedTempFile::new().unwrap();
        let file = Arc::new(File::open(path.path()).unwrap());
        let q = Queue::new(file);
        q.write(0, vec![1; 10]).unwrap();
        let e = q.drain().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        assert!(q.write(10, vec![1; 10]).is_err());
        assert!(q.check().is_err());
    }
}
