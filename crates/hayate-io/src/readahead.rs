//! Read-ahead: a sender's file chunks are read by background threads, so the protocol loop
//! never waits on `pread` from a slow disk (and, on a server, no session waits on another's).
//!
//! [`SourceFile`](crate::fs::SourceFile) asks for the chunks after the one it sends from
//! ([`submit`]); each file is bound to one reader thread, which reads its chunks in the
//! order they were asked for (a disk reads one file's chunks in order best). When a chunk is
//! read, the thread writes to the eventfd of the loop whose thread opened the file
//! ([`LoopWaker`], which the loop waits on), so the loop sends on at once rather than at its
//! next poll. A chunk not read yet is [`hayate_proto::StorageError::NotReady`] to the
//! protocol core, which asks again later.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::pagebuf::PageBuf;
use crate::threads::Pool;

/// Where a reader thread leaves a chunk: its buffer and how many bytes of the file it
/// holds, or why it could not be read.
type Slot = Arc<Mutex<Option<io::Result<(PageBuf, usize)>>>>;

/// A chunk being read ahead, or a block being read again (a retransmission).
#[derive(Debug)]
pub(crate) struct Pending {
    /// File offset of the chunk.
    pub start: u64,
    len: usize,
    slot: Slot,
}

impl Pending {
    /// How many bytes were asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether file offset `pos` is among the bytes asked for.
    pub fn holds(&self, pos: u64) -> bool {
        pos >= self.start && pos - self.start < self.len as u64
    }

    /// The chunk and how many of its bytes the file had, once read (or why it could not be).
    pub fn take(&self) -> Option<io::Result<(PageBuf, usize)>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

struct Job {
    file: Arc<File>,
    start: u64,
    buf: PageBuf,
    slot: Slot,
    waker: Option<Arc<Waker>>,
}

/// A loop's eventfd, and whether a reader wrote to it since the loop last read it (so that
/// neither side makes a system call per chunk or per turn when nothing happened).
#[derive(Debug)]
pub(crate) struct Waker {
    fd: OwnedFd,
    signalled: AtomicBool,
}

impl Waker {
    fn wake(&self) {
        if !self.signalled.swap(true, Ordering::AcqRel) {
            let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
        }
    }
}

/// Reader threads. They wait on disks, not on cores: several, so that files sharing one
/// (round robin) rarely wait behind another's slow disk.
const READERS: usize = 8;

thread_local! {
    /// The eventfd of the loop running on this thread, if one is.
    static LOOP_WAKER: std::cell::RefCell<Option<Arc<Waker>>> = const { std::cell::RefCell::new(None) };
}

/// A driver loop's eventfd: readable once a chunk asked for by a file opened on the loop's
/// thread was read. Set for its thread while it lives.
pub(crate) struct LoopWaker {
    waker: Option<Arc<Waker>>,
}

impl LoopWaker {
    /// Creates the eventfd and makes it this thread's (without one, the loop polls).
    pub fn install() -> LoopWaker {
        let waker = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .ok()
        .map(|fd| {
            Arc::new(Waker {
                fd,
                signalled: AtomicBool::new(false),
            })
        });
        LOOP_WAKER.with(|w| *w.borrow_mut() = waker.clone());
        LoopWaker { waker }
    }

    /// The fd to wait on (readable: a chunk was read).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.waker.as_ref().map(|w| w.fd.as_fd())
    }

    /// Resets it, before the loop looks at what the readers finished (a chunk a reader
    /// leaves after this is seen this turn, or wakes the next wait).
    pub fn drain(&self) {
        if let Some(w) = &self.waker {
            if w.signalled.swap(false, Ordering::AcqRel) {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(&w.fd, &mut b);
            }
        }
    }
}

impl Drop for LoopWaker {
    fn drop(&mut self) {
        LOOP_WAKER.with(|w| *w.borrow_mut() = None);
    }
}

/// The waker of the loop running on this thread, for the files it opens.
pub(crate) fn current_waker() -> Option<Arc<Waker>> {
    LOOP_WAKER.with(|w| w.borrow().clone())
}

fn pool() -> &'static Pool<Job> {
    static POOL: OnceLock<Pool<Job>> = OnceLock::new();
    POOL.get_or_init(|| Pool::start(READERS, "hayate-read", run))
}

fn run(mut job: Job) {
    let r = crate::fs::read_at(&job.file, job.start, &mut job.buf).map(|n| (job.buf, n));
    *job.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    if let Some(w) = &job.waker {
        w.wake();
    }
}

/// Which reader thread a new file's chunks go to (the same one for all of them).
pub(crate) fn thread_for_file() -> usize {
    pool().next()
}

/// Asks reader thread `thread` to read `buf.len()` bytes of `file` at `start` into `buf`,
/// and to wake `waker` then. Without reader threads (none could be started) the chunk is
/// read here and now.
pub(crate) fn submit(
    thread: usize,
    file: &Arc<File>,
    start: u64,
    buf: PageBuf,
    waker: Option<Arc<Waker>>,
) -> Pending {
    let slot: Slot = Arc::new(Mutex::new(None));
    let len = buf.len();
    let job = Job {
        file: file.clone(),
        start,
        buf,
        slot: slot.clone(),
        waker,
    };
    if let Err(job) = pool().send(thread, job) {
        run(job);
    }
    Pending { start, len, slot }
}

/// Reads `buf.len()` bytes of `file` at `offset` only if the page cache holds them all
/// (`preadv2` with `RWF_NOWAIT`): the bytes read (fewer at the end of the file), or `None`
/// if reading would wait for the disk, or the file system cannot tell.
pub(crate) fn read_cached(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<Option<usize>> {
    let mut done = 0;
    while done < buf.len() {
        let mut iov = [io::IoSliceMut::new(&mut buf[done..])];
        match rustix::io::preadv2(
            file,
            &mut iov,
            offset + done as u64,
            rustix::io::ReadWriteFlags::NOWAIT,
        ) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::OPNOTSUPP) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(done))
}
