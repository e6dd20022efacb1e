//! Verification that streams: the BLAKE3 of a file that arrives out of order, hashed as it
//! lands instead of by re-reading the whole file at the end.
//!
//! BLAKE3 is a tree of 1 KiB chunks, and any aligned subtree can be hashed on its own and
//! merged later (`blake3::hazmat`). A receiver counts the bytes written into each
//! [`SUBTREE_LEN`] subtree of the file; when one is whole, a worker thread reads it back
//! (it was just written: the page cache has it) and hashes it to its chaining value. When
//! the last block has landed, the chaining values are merged into the root hash, which is
//! compared with the sender's. The protocol loop never hashes and never waits: it hands
//! subtrees to the workers and asks [`StreamHash::result`] when it needs the answer.
//! Memory per file: 37 bytes per MiB of file (a fill count and a chaining value).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};

use crate::fs::SourceError;
use crate::pagebuf::PageBuf;

/// Bytes per subtree hashed as one job: big enough that BLAKE3 runs its widest SIMD path
/// and a job's overhead is noise, small enough that a subtree completes soon after its
/// bytes arrive.
pub const SUBTREE_LEN: u64 = 1 << 20;

/// Bytes per leaf of the hashes compared for delta transfers and verified resume: a subtree
/// of 4 BLAKE3 chunks, aligned. Small enough that a file changed in scattered 4 KiB pages
/// sends little more than those pages; hashing in leaves this small runs at about half the
/// speed of whole subtrees (1.4 against 2.8 GB/s a core here).
pub const LEAF_LEN: u64 = 4096;

/// Bytes of a leaf's chaining value that travel (`Ctrl::Sums`): its first 16 bytes.
pub const LEAF_HASH: usize = 16;

/// A leaf's chaining value as compared: position-dependent (it is a subtree of the file's
/// BLAKE3 tree at its offset), so two leaves at the same index match only if their bytes do.
pub type Leaf = [u8; LEAF_HASH];

/// The chaining values of the [`LEAF_LEN`] leaves of `data`, which starts at `offset` (a
/// leaf boundary).
pub(crate) fn leaf_cvs(data: &[u8], offset: u64) -> impl Iterator<Item = ChainingValue> + '_ {
    data.chunks(LEAF_LEN as usize)
        .enumerate()
        .map(move |(i, piece)| {
            let mut h = blake3::Hasher::new();
            h.set_input_offset(offset + i as u64 * LEAF_LEN);
            h.update(piece);
            h.finalize_non_root()
        })
}

/// What is compared of a leaf: the first [`LEAF_HASH`] bytes of its chaining value.
pub fn leaf_hash(cv: &ChainingValue) -> Leaf {
    cv[..LEAF_HASH].try_into().expect("sized")
}

/// Leaf chaining values of `data` (one subtree, at `offset`) and the subtree's chaining
/// value merged from them, or (`single`: the subtree is the whole file) the file's root hash.
fn hash_leaves(
    data: &[u8],
    offset: u64,
    single: bool,
) -> (Vec<ChainingValue>, Result<ChainingValue, blake3::Hash>) {
    let cvs: Vec<ChainingValue> = leaf_cvs(data, offset).collect();
    if single {
        return (cvs, Err(blake3::hash(data)));
    }
    let cv = node_of(
        &|at: u64| cvs[((at - offset) / LEAF_LEN) as usize],
        offset,
        data.len() as u64,
        LEAF_LEN,
    );
    (cvs, Ok(cv))
}

/// The chaining value of the subtree of `len` bytes at `offset` in `file`, whose leaves
/// `known` has (`None`: not known) are not read: only the others are, into `buf`.
fn hash_with_known(
    file: &File,
    offset: u64,
    len: usize,
    known: &[Option<ChainingValue>],
    buf: &mut [u8],
) -> std::io::Result<ChainingValue> {
    let leaf = LEAF_LEN as usize;
    let n = len.div_ceil(leaf);
    let known = |j: usize| known.get(j).copied().flatten();
    let mut cvs = Vec::with_capacity(n);
    let mut j = 0;
    while j < n {
        if let Some(cv) = known(j) {
            cvs.push(cv);
            j += 1;
            continue;
        }
        let mut k = j + 1;
        while k < n && known(k).is_none() {
            k += 1;
        }
        let (a, b) = (j * leaf, (k * leaf).min(len));
        let data = &mut buf[..b - a];
        file.read_exact_at(data, offset + a as u64)?;
        cvs.extend(leaf_cvs(data, offset + a as u64));
        j = k;
    }
    Ok(node_of(
        &|at: u64| cvs[((at - offset) / LEAF_LEN) as usize],
        offset,
        len as u64,
        LEAF_LEN,
    ))
}

/// Why a file's hash could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HashError {
    /// Reading bytes `start..end` of the file for the workers failed (the file shrank, or
    /// the disk failed).
    #[error("cannot read bytes {start}..{end} to hash them: {source}")]
    Read {
        /// Where the subtree starts in the file.
        start: u64,
        /// Where it ends.
        end: u64,
        /// What the read said.
        source: Arc<std::io::Error>,
    },
    /// A delta transfer's blocks could not be copied from the file at the destination into
    /// the temp file before it was hashed.
    #[error("cannot copy from the destination: {source}")]
    Copy {
        /// What the copy said.
        source: Arc<std::io::Error>,
    },
    /// The hashing threads have ended (the process is going down).
    #[error("the hashing threads are gone")]
    WorkersGone,
}

/// Why a received file was not put under its name ([`Landing::verdict`], and the commit
/// after it).
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// The file's BLAKE3 is not the sender's.
    #[error("BLAKE3 mismatch: the data written differs from the source")]
    Mismatch {
        /// The sender's hash.
        expected: [u8; 32],
        /// The hash of what was written.
        got: [u8; 32],
    },
    /// The file's hash could not be had.
    #[error(transparent)]
    Hash(#[from] HashError),
    /// A device or FIFO destination: writing the last bytes out, or their in-order hash,
    /// failed.
    #[error("cannot verify: {0}")]
    Unfinished(#[source] std::io::Error),
    /// It verified, but the temp file could not be renamed to its name (or its mode and
    /// mtime set).
    #[error("cannot rename into place: {0}")]
    Commit(#[source] std::io::Error),
}

/// What the workers fill in.
#[derive(Default)]
struct Shared {
    cvs: Vec<Option<ChainingValue>>,
    /// A file of one subtree: its root hash directly.
    single: Option<blake3::Hash>,
    outstanding: usize,
    error: Option<HashError>,
    /// Subtrees hashed from the bytes as they were written (`Feed`), not read back.
    fed: usize,
    /// [`LEAF_LEN`] leaf chaining values of each subtree hashed with leaves (delta), until
    /// taken.
    leaves: std::collections::BTreeMap<usize, Vec<ChainingValue>>,
}

struct Job {
    file: Arc<File>,
    /// The subtree's bytes as the sender read them for sending; `None`: read from `file`.
    data: Option<Held>,
    index: usize,
    offset: u64,
    len: usize,
    single: bool,
    /// Also the subtree's leaf hashes (see [`LeafHash`]).
    leaves: bool,
    /// Copy the subtree from this file into `file` first (a delta's basis, see [`LeafHash`]).
    copy_from: Option<Arc<File>>,
    /// Chaining values of leaves already known (see [`Known`]): those are not read.
    known: Option<KnownLeaves>,
    shared: Arc<Mutex<Shared>>,
}

impl Job {
    /// Reading the subtree for this job failed.
    fn read_error(&self, e: std::io::Error) -> HashError {
        HashError::Read {
            start: self.offset,
            end: self.offset + self.len as u64,
            source: Arc::new(e),
        }
    }
}

/// The worker threads, one per core, started on first use and shared by every file.
struct Pool {
    jobs: Mutex<Sender<Job>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let n = std::thread::available_parallelism().map_or(2, |n| n.get());
        for i in 0..n {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("hayate-hash-{i}"))
                .spawn(move || worker(&rx))
                .expect("cannot start a hashing thread");
        }
        Pool {
            jobs: Mutex::new(tx),
        }
    })
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    let mut buf = PageBuf::zeroed(SUBTREE_LEN as usize);
    loop {
        let job = match rx.lock().expect("job queue").recv() {
            Ok(j) => j,
            Err(_) => return,
        };
        if job.data.is_none()
            && !job.leaves
            && job.shared.lock().expect("hash state").cvs[job.index].is_some()
        {
            // Hashed already from the bytes as they were written (`Feed`): this job was
            // queued behind those writes, so the feed is done with them.
            job.shared.lock().expect("hash state").outstanding -= 1;
            continue;
        }
        if let Some(from) = &job.copy_from {
            let range = [(job.offset, job.offset + job.len as u64)];
            if let Err(e) = crate::fs::copy_ranges(from, &job.file, &range) {
                let mut s = job.shared.lock().expect("hash state");
                s.outstanding -= 1;
                s.error.get_or_insert(HashError::Copy {
                    source: Arc::new(e),
                });
                continue;
            }
        }
        if let Some(known) = job.known.as_ref().filter(|_| !job.single) {
            let cv = hash_with_known(&job.file, job.offset, job.len, &known.0, &mut buf);
            let mut s = job.shared.lock().expect("hash state");
            s.outstanding -= 1;
            match cv {
                Ok(cv) => s.cvs[job.index] = Some(cv),
                Err(e) => {
                    s.error.get_or_insert(job.read_error(e));
                }
            }
            continue;
        }
        let (data, read) = match &job.data {
            Some(held) => (&held.0[..job.len], Ok(())),
            None => {
                let data = &mut buf[..job.len];
                let read = job.file.read_exact_at(data, job.offset);
                (&*data, read)
            }
        };
        let mut s = job.shared.lock().expect("hash state");
        s.outstanding -= 1;
        match read {
            Err(e) => {
                s.error.get_or_insert(job.read_error(e));
            }
            Ok(()) if job.leaves => {
                drop(s);
                let (leaves, cv) = hash_leaves(data, job.offset, job.single);
                let mut s = job.shared.lock().expect("hash state");
                s.leaves.insert(job.index, leaves);
                match cv {
                    Ok(cv) => s.cvs[job.index] = Some(cv),
                    Err(root) => s.single = Some(root),
                }
            }
            Ok(()) if job.single => {
                drop(s);
                let h = blake3::hash(data);
                job.shared.lock().expect("hash state").single = Some(h);
            }
            Ok(()) => {
                drop(s);
                let mut h = blake3::Hasher::new();
                h.set_input_offset(job.offset);
                h.update(data);
                let cv = h.finalize_non_root();
                job.shared.lock().expect("hash state").cvs[job.index] = Some(cv);
            }
        }
    }
}

/// The streaming hash of one incoming file (see the module doc).
pub struct StreamHash {
    file: Arc<File>,
    size: u64,
    /// Bytes landed per subtree so far.
    filled: Vec<u32>,
    shared: Arc<Mutex<Shared>>,
    /// Jobs also keep their leaf hashes (see [`LeafHash`]).
    leaves: bool,
    /// Jobs first copy their subtree from this file (see [`LeafHash`]).
    copy_from: Option<Arc<File>>,
    /// Leaves of subtrees not yet whole whose chaining values are known (see [`Known`]).
    known: HashMap<usize, KnownLeaves>,
}

impl StreamHash {
    /// A hash of a `size`-byte file being written into `file` (a handle of its own, e.g.
    /// `try_clone` of the writer's).
    pub fn new(file: File, size: u64) -> Self {
        let n = size.div_ceil(SUBTREE_LEN) as usize;
        StreamHash {
            file: Arc::new(file),
            size,
            filled: vec![0; n],
            shared: Arc::new(Mutex::new(Shared {
                cvs: vec![None; n],
                ..Shared::default()
            })),
            leaves: false,
            copy_from: None,
            known: HashMap::new(),
        }
    }

    fn subtree_len(&self, i: usize) -> u64 {
        (self.size - i as u64 * SUBTREE_LEN).min(SUBTREE_LEN)
    }

    /// Records that `len` bytes at `offset` are written (each byte once) and returns the
    /// subtrees this made whole. The caller makes sure their bytes have reached the file
    /// (flushes any buffered writes) and then passes them to [`submit`](Self::submit).
    pub fn landed(&mut self, offset: u64, len: u64) -> Vec<usize> {
        let mut whole = Vec::new();
        let end = (offset + len).min(self.size);
        let mut at = offset;
        while at < end {
            let i = (at / SUBTREE_LEN) as usize;
            let stop = ((i as u64 + 1) * SUBTREE_LEN).min(end);
            let f = &mut self.filled[i];
            *f += (stop - at) as u32;
            if u64::from(*f) >= self.subtree_len(i) {
                whole.push(i);
            }
            at = stop;
        }
        whole
    }

    /// Hands whole subtrees to the workers.
    pub fn submit(&mut self, subtrees: &[usize]) {
        if let Some(jobs) = self.jobs(subtrees) {
            jobs.send();
        }
    }

    /// The hashing of whole subtrees, counted as outstanding from now on, to be handed to
    /// the workers (by [`Jobs::send`]) once their bytes are in the file.
    pub fn jobs(&mut self, subtrees: &[usize]) -> Option<Jobs> {
        if subtrees.is_empty() {
            return None;
        }
        self.shared.lock().expect("hash state").outstanding += subtrees.len();
        Some(Jobs(
            subtrees
                .iter()
                .map(|&index| Job {
                    file: self.file.clone(),
                    data: None,
                    index,
                    offset: index as u64 * SUBTREE_LEN,
                    len: self.subtree_len(index) as usize,
                    single: self.filled.len() == 1,
                    leaves: self.leaves,
                    copy_from: self.copy_from.clone(),
                    known: self.known.remove(&index),
                    shared: self.shared.clone(),
                })
                .collect(),
        ))
    }

    /// Hands subtree `index` to the workers with its bytes, already read (`data`, at least
    /// the subtree's length). False if too many bytes are held so already: the caller
    /// submits the subtree later, to be read back.
    pub fn submit_read(&self, index: usize, data: Arc<PageBuf>) -> bool {
        let len = self.subtree_len(index) as usize;
        let Some(held) = Held::new(data, len) else {
            return false;
        };
        self.shared.lock().expect("hash state").outstanding += 1;
        Jobs(vec![Job {
            file: self.file.clone(),
            leaves: false,
            data: Some(held),
            index,
            offset: index as u64 * SUBTREE_LEN,
            len,
            single: self.filled.len() == 1,
            copy_from: None,
            known: None,
            shared: self.shared.clone(),
        }])
        .send();
        true
    }

    /// Subtrees still being hashed.
    pub fn outstanding(&self) -> usize {
        self.shared.lock().expect("hash state").outstanding
    }

    /// The file's BLAKE3 once every subtree is hashed; `None` while some are not (not yet
    /// landed, or still with a worker); `Err` if reading one back failed.
    pub fn result(&self) -> Option<Result<blake3::Hash, HashError>> {
        let s = self.shared.lock().expect("hash state");
        if let Some(e) = &s.error {
            return Some(Err(e.clone()));
        }
        if self.size == 0 {
            return Some(Ok(blake3::hash(b"")));
        }
        if s.outstanding > 0 {
            return None;
        }
        if self.filled.len() == 1 {
            return s.single.map(Ok);
        }
        if s.cvs.iter().any(Option::is_none) {
            return None;
        }
        let cv = |i: u64| s.cvs[(i / SUBTREE_LEN) as usize].expect("checked");
        Some(Ok(root(&cv, self.size)))
    }

    /// The chaining values of the whole subtrees hashed so far, by index (for delta and
    /// verified resume).
    pub fn subtree_cvs(&self) -> Vec<Option<ChainingValue>> {
        self.shared.lock().expect("hash state").cvs.clone()
    }
}

/// Bytes of all files that wait with the workers in memory (`StreamHash::submit_read`), at
/// most [`MAX_HELD`]: beyond it, subtrees are read back from their files instead.
static HELD: AtomicUsize = AtomicUsize::new(0);
/// See [`HELD`].
const MAX_HELD: usize = 64 << 20;

/// A subtree's bytes with the workers, counted in [`HELD`] until dropped.
struct Held(Arc<PageBuf>);

impl Held {
    fn new(data: Arc<PageBuf>, len: usize) -> Option<Held> {
        if data.len() < len {
            return None;
        }
        let n = data.len();
        if HELD.fetch_add(n, Ordering::Relaxed) + n > MAX_HELD {
            HELD.fetch_sub(n, Ordering::Relaxed);
            return None;
        }
        Some(Held(data))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.fetch_sub(self.0.len(), Ordering::Relaxed);
    }
}

/// The receiver's in-order hashing: each positional write is seen once it is in the file
/// (on the writer thread, `writeback::Queue::observe`), and a subtree whose bytes all came
/// in order, run after run, gets its chaining value from them, so its job need not read
/// it back. A write out of order (a retransmission, a resumed file's gap) drops the
/// subtree in progress: it is read back as before.
struct Feed {
    shared: Arc<Mutex<Shared>>,
    size: u64,
    /// Where the next in-order write starts.
    next: u64,
    /// The subtree being hashed, and its hasher.
    cur: Option<(usize, blake3::Hasher)>,
}

impl Feed {
    fn wrote(&mut self, at: u64, mut data: &[u8]) {
        if at != self.next {
            self.cur = None;
        }
        let mut pos = at;
        while !data.is_empty() && pos < self.size {
            let i = (pos / SUBTREE_LEN) as usize;
            let start = i as u64 * SUBTREE_LEN;
            let end = (start + SUBTREE_LEN).min(self.size);
            let take = ((end - pos) as usize).min(data.len());
            if self.cur.is_none() && pos == start {
                let mut h = blake3::Hasher::new();
                h.set_input_offset(start);
                self.cur = Some((i, h));
            }
            if let Some((_, h)) = &mut self.cur {
                h.update(&data[..take]);
            }
            pos += take as u64;
            data = &data[take..];
            if pos == end {
                if let Some((i, h)) = self.cur.take() {
                    let cv = h.finalize_non_root();
                    let mut s = self.shared.lock().expect("hash state");
                    if s.cvs[i].is_none() {
                        s.cvs[i] = Some(cv);
                        s.fed += 1;
                    }
                }
            }
        }
        self.next = pos;
    }
}

/// Subtrees to hash, already counted as outstanding (see [`StreamHash::jobs`]).
pub struct Jobs(Vec<Job>);

impl Jobs {
    /// Hands them to the hashing threads.
    pub fn send(self) {
        let tx = pool().jobs.lock().expect("job queue");
        for job in self.0 {
            if let Err(e) = tx.send(job) {
                let mut s = e.0.shared.lock().expect("hash state");
                s.outstanding -= 1;
                s.error.get_or_insert(HashError::WorkersGone);
            }
        }
    }
}

/// Subtrees of one [`WholeHash`] with the workers at most: the pool is shared, and a 100 GB
/// file queued whole would hold up every other file's verification behind its 100 000 jobs.
pub const WHOLE_WINDOW: usize = 64;

/// The BLAKE3 of a whole file already there (`--update` compares files by it), hashed by the
/// workers [`WHOLE_WINDOW`] subtrees at a time, topped up as they finish whenever the
/// protocol loop asks for the result. The loop never hashes and never waits.
pub struct WholeHash {
    hash: StreamHash,
    /// Subtrees before this one went to the workers.
    next: usize,
}

impl WholeHash {
    /// Starts hashing the first `size` bytes of `file` (a handle of its own, e.g. a
    /// `try_clone` of the one the file is sent through).
    pub fn start(file: File, size: u64) -> Self {
        let mut w = WholeHash {
            hash: StreamHash::new(file, size),
            next: 0,
        };
        w.top_up();
        w
    }

    fn top_up(&mut self) {
        let n = self.hash.filled.len();
        let room = WHOLE_WINDOW.saturating_sub(self.hash.outstanding());
        let end = (self.next + room).min(n);
        if end == self.next {
            return;
        }
        let from = self.next as u64 * SUBTREE_LEN;
        let to = (end as u64 * SUBTREE_LEN).min(self.hash.size);
        let whole = self.hash.landed(from, to - from);
        self.hash.submit(&whole);
        self.next = end;
    }

    /// The hash once every subtree is hashed, `None` until then (more go to the workers as
    /// earlier ones finish); `Err` if the file could not be read (it shrank meanwhile).
    pub fn poll(&mut self) -> Option<Result<blake3::Hash, HashError>> {
        if let Some(r) = self.hash.result() {
            return Some(r);
        }
        self.top_up();
        None
    }
}

/// Merges the subtrees of `[0, size)` (more than one) into the root hash, along BLAKE3's
/// left-balanced tree: every split falls on a `SUBTREE_LEN` boundary.
fn root(cv: &dyn Fn(u64) -> ChainingValue, size: u64) -> blake3::Hash {
    let left = left_subtree_len(size);
    let l = node(cv, 0, left);
    let r = node(cv, left, size - left);
    merge_subtrees_root(&l, &r, Mode::Hash)
}

fn node(cv: &dyn Fn(u64) -> ChainingValue, start: u64, len: u64) -> ChainingValue {
    node_of(cv, start, len, SUBTREE_LEN)
}

/// The chaining value of the subtree `[start, start + len)` from those of its aligned
/// pieces of `unit` bytes (a power of two of at least a chunk: every split of a longer
/// subtree then falls on a `unit` boundary).
fn node_of(cv: &dyn Fn(u64) -> ChainingValue, start: u64, len: u64, unit: u64) -> ChainingValue {
    if len <= unit {
        return cv(start);
    }
    let left = left_subtree_len(len);
    let l = node_of(cv, start, left, unit);
    let r = node_of(cv, start + left, len - left, unit);
    merge_subtrees_non_root(&l, &r, Mode::Hash)
}

/// A file hashed into [`LEAF_LEN`] leaves (for delta transfers and verified resume) by the
/// workers, [`WHOLE_WINDOW`] subtrees at a time, and to its BLAKE3 in the same pass. The
/// leaves are taken a subtree at a time, in order, as they are ready; the next subtrees go
/// to the workers as earlier ones are taken. The protocol loop never hashes and never waits.
///
/// A receiver's basis at the destination is first copied into the temp file, a subtree at a
/// time by the worker that then hashes the copy ([`start_copying`](Self::start_copying)):
/// what matches the sender's leaves is then already in place, and its chaining values are
/// those of the bytes the temp file holds, so the verification need not read them again
/// (see [`Known`]).
pub struct LeafHash {
    hash: StreamHash,
    /// Subtrees before this one went to the workers.
    next: usize,
    /// Subtrees before this one had their leaves taken.
    taken: usize,
}

impl LeafHash {
    /// Starts hashing the first `size` bytes of `file` (a handle of its own).
    pub fn start(file: File, size: u64) -> Self {
        Self::start_copying(file, None, size)
    }

    /// Starts hashing the first `size` bytes of `file` (a handle of its own), each subtree
    /// first copied into it from `from` (`copy_file_range`: a reflink where the file system
    /// shares extents). A failed copy is an error of the hash.
    pub fn start_copying(file: File, from: Option<File>, size: u64) -> Self {
        let mut hash = StreamHash::new(file, size);
        hash.leaves = true;
        hash.copy_from = from.map(Arc::new);
        let mut h = LeafHash {
            hash,
            next: 0,
            taken: 0,
        };
        h.top_up();
        h
    }

    fn top_up(&mut self) {
        let n = self.hash.filled.len();
        let room = WHOLE_WINDOW.saturating_sub(self.next - self.taken);
        let end = (self.next + room).min(n);
        if end == self.next {
            return;
        }
        let from = self.next as u64 * SUBTREE_LEN;
        let to = (end as u64 * SUBTREE_LEN).min(self.hash.size);
        let whole = self.hash.landed(from, to - from);
        self.hash.submit(&whole);
        self.next = end;
    }

    /// The leaves of the next subtree once the workers have them; `Err` if the file could
    /// not be read (it shrank meanwhile) or copied.
    pub fn take(&mut self) -> Option<Result<Leaves, HashError>> {
        if self.done() {
            return None;
        }
        let got = {
            let mut s = self.hash.shared.lock().expect("hash state");
            if let Some(e) = &s.error {
                return Some(Err(e.clone()));
            }
            s.leaves
                .remove(&self.taken)
                .map(|cvs| (cvs, s.cvs[self.taken]))
        };
        let (cvs, subtree) = got?;
        let first = self.taken as u64 * (SUBTREE_LEN / LEAF_LEN);
        self.taken += 1;
        self.top_up();
        Some(Ok(Leaves {
            first,
            cvs,
            subtree,
        }))
    }

    /// Subtrees still with the workers (being copied or hashed).
    pub fn outstanding(&self) -> usize {
        self.hash.outstanding()
    }

    /// Every subtree's leaves were taken.
    pub fn done(&self) -> bool {
        self.taken == self.hash.filled.len()
    }

    /// The whole file's BLAKE3, once every subtree is hashed.
    pub fn result(&self) -> Option<Result<blake3::Hash, HashError>> {
        self.hash.result()
    }
}

/// The leaves of one subtree, as [`LeafHash::take`] gives them.
pub struct Leaves {
    /// Index of the first leaf in the file.
    pub first: u64,
    /// Each leaf's chaining value ([`leaf_hash`] is what is compared).
    pub cvs: Vec<ChainingValue>,
    /// The whole subtree's chaining value; `None` for a file of one subtree.
    pub subtree: Option<ChainingValue>,
}

/// Chaining values of parts of a file already in its temp file, hashed from the temp file
/// itself (a delta's or resume's basis, see [`LeafHash`]): whole subtrees, and leaves of the
/// others. [`Landing::start_known`] uses those that lie wholly in the ranges the temp file
/// keeps, so the verification reads back only what arrived.
#[derive(Default)]
pub struct Known {
    subtrees: HashMap<usize, KnownSubtree>,
    /// A file of one subtree known whole: its root hash.
    root: Option<blake3::Hash>,
}

enum KnownSubtree {
    Whole(ChainingValue),
    Leaves(KnownLeaves),
}

/// Leaf chaining values of one subtree, counted in [`KNOWN`] until dropped.
struct KnownLeaves(Box<[Option<ChainingValue>]>);

/// Bytes of known leaf chaining values all files hold ([`Known`]), at most [`MAX_KNOWN`]:
/// beyond it, subtrees are read back whole. 8.25 KiB per subtree held in part: 64 MiB is
/// about 8 GiB of a file changed in scattered pages.
static KNOWN: AtomicUsize = AtomicUsize::new(0);
/// See [`KNOWN`].
const MAX_KNOWN: usize = 64 << 20;

impl KnownLeaves {
    fn new(cvs: Vec<Option<ChainingValue>>) -> Option<Self> {
        let n = cvs.len() * std::mem::size_of::<Option<ChainingValue>>();
        if KNOWN.fetch_add(n, Ordering::Relaxed) + n > MAX_KNOWN {
            KNOWN.fetch_sub(n, Ordering::Relaxed);
            return None;
        }
        Some(KnownLeaves(cvs.into_boxed_slice()))
    }
}

impl Drop for KnownLeaves {
    fn drop(&mut self) {
        KNOWN.fetch_sub(
            self.0.len() * std::mem::size_of::<Option<ChainingValue>>(),
            Ordering::Relaxed,
        );
    }
}

impl Known {
    /// Subtree `index` is known whole.
    pub fn whole(&mut self, index: usize, cv: ChainingValue) {
        self.subtrees.insert(index, KnownSubtree::Whole(cv));
    }

    /// These leaves of subtree `index` are known (by their index in it); false if there is
    /// no room for them (they will be read back).
    pub fn leaves(&mut self, index: usize, cvs: Vec<Option<ChainingValue>>) -> bool {
        match KnownLeaves::new(cvs) {
            Some(k) => {
                self.subtrees.insert(index, KnownSubtree::Leaves(k));
                true
            }
            None => false,
        }
    }

    /// What `other` knows too.
    pub fn extend(&mut self, other: Known) {
        self.subtrees.extend(other.subtrees);
        self.root = self.root.or(other.root);
    }

    /// A file of one subtree is known whole: this is its root hash.
    pub fn root(&mut self, hash: blake3::Hash) {
        self.root = Some(hash);
    }

    /// Subtrees known, whole or in part.
    pub fn len(&self) -> usize {
        self.subtrees.len() + usize::from(self.root.is_some())
    }

    /// Nothing is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether `[a, b)` lies inside one of `ranges` (in order, disjoint, not touching).
fn inside(ranges: &[(u64, u64)], a: u64, b: u64) -> bool {
    let i = ranges.partition_point(|r| r.1 < b);
    ranges.get(i).is_some_and(|r| r.0 <= a && b <= r.1)
}

/// An incoming file's temp file and its streaming hash, as a driver keeps them together.
pub struct Landing {
    /// The subtree hashes; `None` for a device or FIFO destination, which its `PartFile`
    /// hashes in order as the bytes go out.
    tree: Option<StreamHash>,
    /// The sender's hash, once every block has landed: the verdict is due.
    expect: Option<[u8; 32]>,
    /// The byte ranges the temp file held before any arrived ([`hold`](Self::hold)).
    held: Vec<(u64, u64)>,
    /// Chaining values of held bytes of subtrees not wholly told yet.
    pending: Known,
}

impl Landing {
    /// Starts hashing a `size`-byte file written into `part`, of which the byte ranges in
    /// `have` (in order, disjoint) are already there (a resumed transfer): those are hashed
    /// at once, by the workers.
    pub fn start(
        part: &mut crate::fs::PartFile,
        size: u64,
        have: &[(u64, u64)],
    ) -> std::io::Result<Self> {
        Self::start_known(part, size, have, Known::default())
    }

    /// [`start`](Self::start), where the chaining values in `known` that lie wholly inside
    /// `have` stand for the bytes there: they are not read back.
    pub fn start_known(
        part: &mut crate::fs::PartFile,
        size: u64,
        have: &[(u64, u64)],
        known: Known,
    ) -> std::io::Result<Self> {
        let mut l = Self::begin(part, size)?;
        l.hold(part, have, size, known)?;
        Ok(l)
    }

    /// Starts hashing a `size`-byte file written into `part`, of which what it already
    /// holds is told later, piece by piece ([`hold`](Self::hold)): a delta's receiver
    /// answers the blocks whose leaves it has compared while it compares the others.
    pub fn begin(part: &mut crate::fs::PartFile, size: u64) -> std::io::Result<Self> {
        let tree = if part.writes_in_order() {
            None
        } else {
            let hash = StreamHash::new(part.file()?.try_clone()?, size);
            if hash.filled.len() > 1 {
                // A file of one subtree hashes to its root directly, from the file.
                let mut feed = Feed {
                    shared: hash.shared.clone(),
                    size,
                    next: u64::MAX,
                    cur: None,
                };
                part.observe_writes(Arc::new(Mutex::new(move |at: u64, data: &[u8]| {
                    feed.wrote(at, data)
                })));
            }
            Some(hash)
        };
        Ok(Landing {
            tree,
            expect: None,
            held: Vec::new(),
            pending: Known::default(),
        })
    }

    /// The byte ranges `have` (in order, disjoint, beyond those told before) are in the
    /// temp file `part` already: they count as landed, hashed by the workers unless `known`
    /// has their chaining values. What is beyond `upto` is not told yet: the chaining values
    /// of a subtree reaching past it wait until it is (its bytes may be held or arrive).
    /// Subtrees this makes whole go to the workers once what was written into them before
    /// is in the file (as for [`wrote`](Self::wrote)).
    pub fn hold(
        &mut self,
        part: &mut crate::fs::PartFile,
        have: &[(u64, u64)],
        upto: u64,
        known: Known,
    ) -> std::io::Result<()> {
        let Some(hash) = &mut self.tree else {
            return Ok(());
        };
        let size = hash.size;
        let mut whole = Vec::new();
        for &(a, b) in have {
            let (start, end) = (a.min(size), b.min(size));
            whole.extend(hash.landed(start, end.saturating_sub(start)));
            if start < end {
                match self.held.last_mut() {
                    Some(last) if last.1 >= start => last.1 = last.1.max(end),
                    _ => self.held.push((start, end)),
                }
            }
        }
        self.pending.extend(known);
        if upto >= size {
            if let Some(root) = self.pending.root.take() {
                if hash.filled.len() == 1 && inside(&self.held, 0, size) {
                    hash.shared.lock().expect("hash state").single = Some(root);
                    whole.clear();
                }
            }
        }
        if hash.filled.len() > 1 {
            let told: Vec<usize> = self
                .pending
                .subtrees
                .keys()
                .copied()
                .filter(|&i| i as u64 * SUBTREE_LEN + hash.subtree_len(i) <= upto)
                .collect();
            for i in told {
                let k = self.pending.subtrees.remove(&i).expect("listed");
                let start = i as u64 * SUBTREE_LEN;
                let len = hash.subtree_len(i);
                match k {
                    KnownSubtree::Whole(cv) if inside(&self.held, start, start + len) => {
                        hash.shared.lock().expect("hash state").cvs[i] = Some(cv);
                        whole.retain(|&w| w != i);
                    }
                    KnownSubtree::Whole(_) => {}
                    KnownSubtree::Leaves(mut k) => {
                        for (j, cv) in k.0.iter_mut().enumerate() {
                            let a = start + j as u64 * LEAF_LEN;
                            let b = (a + LEAF_LEN).min(start + len);
                            if cv.is_some() && (a >= b || !inside(&self.held, a, b)) {
                                *cv = None;
                            }
                        }
                        hash.known.insert(i, k);
                    }
                }
            }
        }
        match hash.jobs(&whole) {
            Some(jobs) => part.after_writes(move || jobs.send()),
            None => Ok(()),
        }
    }

    /// `len` bytes were written at `offset` through `part`; whole subtrees go to the workers
    /// (after what `part` gathered reaches the file).
    pub fn wrote(
        &mut self,
        part: &mut crate::fs::PartFile,
        offset: u64,
        len: u64,
    ) -> std::io::Result<()> {
        let Some(hash) = &mut self.tree else {
            return Ok(());
        };
        let whole = hash.landed(offset, len);
        match hash.jobs(&whole) {
            // Hashed once the writer has put their bytes in the file.
            Some(jobs) => part.after_writes(move || jobs.send()),
            None => Ok(()),
        }
    }

    /// Every block has landed and the sender's hash is `want`: the verdict is due.
    pub fn complete(&mut self, want: [u8; 32]) {
        self.expect = Some(want);
    }

    /// Whether the verdict is due but not ready: the workers are not done, or (a device or
    /// FIFO) the writer has not put every byte out yet.
    pub fn verifying(&self) -> bool {
        self.expect.is_some() && self.tree.as_ref().is_none_or(|t| t.result().is_none())
    }

    /// Once due and ready: `Ok(hash)` if the file matches the sender's hash, else why not.
    pub fn verdict(
        &self,
        part: &mut crate::fs::PartFile,
    ) -> Option<Result<[u8; 32], ReceiveError>> {
        let want = self.expect?;
        let got = match &self.tree {
            Some(t) => t.result()?.map_err(ReceiveError::Hash),
            // In order as it went out: due once the writer has put every byte out.
            None => match part.pump() {
                Ok(false) => return None,
                Ok(true) => part.hash().map_err(ReceiveError::Unfinished),
                Err(e) => Err(ReceiveError::Unfinished(e)),
            },
        };
        Some(got.and_then(|h| match *h.as_bytes() {
            got if got == want => Ok(want),
            got => Err(ReceiveError::Mismatch {
                expected: want,
                got,
            }),
        }))
    }
}

/// A file being sent and its BLAKE3, hashed by the workers a subtree at a time as the
/// sender's reads pass it (the bytes are then in the page cache), and all at once for what
/// the sender skips (blocks a resumed receiver already has). The protocol loop never hashes.
pub struct Sending {
    /// The source being read for sending; the driver asks it whether it failed or changed
    /// ([`SourceFile::check`](crate::fs::SourceFile::check)) once the receiver's verdict is in.
    pub file: crate::fs::SourceFile,
    hash: StreamHash,
    /// Subtrees before this one were handed to the workers (or are with them already).
    next: usize,
    /// Subtrees handed over with the bytes read for sending (not to be read again).
    submitted: Vec<bool>,
    given: bool,
    /// The receiver asked for the file's leaf hashes (delta, verified resume): the whole
    /// file is hashed by this pass, not as the reads pass.
    sums: Option<LeafHash>,
}

impl Sending {
    /// Starts sending `file`: its read-ahead chunks are kept for the workers to hash, and a
    /// second handle on it is opened for them (the only error: that handle failed).
    pub fn new(mut file: crate::fs::SourceFile) -> std::io::Result<Self> {
        let hash = StreamHash::new(file.try_clone_file()?, file.size());
        file.keep_chunks(true);
        Ok(Sending {
            submitted: vec![false; hash.filled.len()],
            file,
            hash,
            next: 0,
            given: false,
            sums: None,
        })
    }

    /// Reads a block for sending (see [`SourceFile::read_block`](crate::fs::SourceFile)).
    /// The aligned chunks the file reads ahead go to the workers as they are: the file is
    /// not read a second time to be hashed.
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError> {
        let r = self.file.read_block(offset, buf);
        for (start, data) in self.file.take_chunks() {
            let i = (start / SUBTREE_LEN) as usize;
            // With leaf hashes asked for, their pass hashes the file (blocks go while it
            // does, a delta's receiver answering them as it compares).
            if self.sums.is_none()
                && i >= self.next
                && !self.submitted[i]
                && self.hash.submit_read(i, data)
            {
                self.submitted[i] = true;
            }
        }
        r?;
        self.reached(offset + buf.len() as u64);
        Ok(())
    }

    /// The sender has read up to `end`: every subtree that ends there or before is hashed.
    fn reached(&mut self, end: u64) {
        if self.sums.is_some() {
            return;
        }
        let n = self.hash.filled.len();
        let size = self.hash.size;
        let from = self.next;
        while self.next < n && ((self.next as u64 + 1) * SUBTREE_LEN).min(size) <= end {
            self.next += 1;
        }
        let batch: Vec<usize> = (from..self.next).filter(|&i| !self.submitted[i]).collect();
        self.hash.submit(&batch);
    }

    /// Nothing more will be read for sending: hash whatever is left.
    pub fn finish(&mut self) {
        self.reached(self.hash.size);
    }

    /// The receiver wants the leaf hashes: the workers hash the whole file into leaves (and
    /// its BLAKE3) from now on, read once whatever the receiver then asks for.
    pub fn start_sums(&mut self) -> std::io::Result<()> {
        if self.sums.is_none() {
            self.sums = Some(LeafHash::start(
                self.file.try_clone_file()?,
                self.file.size(),
            ));
        }
        Ok(())
    }

    /// The next piece of leaf hashes, once the workers have it; `Err` if the file cannot
    /// be read.
    pub fn next_sums(&mut self) -> Option<Result<(u64, Vec<Leaf>), HashError>> {
        let r = self.sums.as_mut()?.take()?;
        Some(r.map(|l| (l.first, l.cvs.iter().map(leaf_hash).collect())))
    }

    /// Leaf hashes were asked for and all of them handed out.
    pub fn sums_done(&self) -> bool {
        self.sums.as_ref().is_some_and(LeafHash::done)
    }

    /// Leaf hashes were asked for and not all handed out yet.
    pub fn sums_pending(&self) -> bool {
        self.sums.as_ref().is_some_and(|s| !s.done())
    }

    /// The file's hash, once, when the workers have it, if the file is still as it was
    /// opened; else why not.
    pub fn hash_ready(&mut self) -> Option<Result<[u8; 32], SourceError>> {
        if self.given {
            return None;
        }
        let r = match &self.sums {
            Some(s) => s.result()?,
            None => self.hash.result()?,
        };
        self.given = true;
        Some(r.map_err(SourceError::from).and_then(|h| {
            self.file.check()?;
            Ok(*h.as_bytes())
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::{Duration, Instant};

    fn wait(h: &StreamHash) -> Result<blake3::Hash, HashError> {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(r) = h.result() {
                return r;
            }
            assert!(Instant::now() < until, "hashing did not finish");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn data(len: usize) -> Vec<u8> {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Lands `d` in blocks of `bs` in a scrambled order and compares with `blake3::hash`.
    fn check(len: usize, bs: usize) {
        let d = data(len);
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&d).unwrap();
        let mut h = StreamHash::new(f.try_clone().unwrap(), len as u64);
        let blocks = len.div_ceil(bs.max(1));
        let mut order: Vec<usize> = (0..blocks).collect();
        // A fixed scramble: reversed odd blocks after the even ones.
        order.sort_by_key(|&b| (b % 2, if b % 2 == 1 { usize::MAX - b } else { b }));
        for b in order {
            let off = b * bs;
            let n = bs.min(len - off);
            let whole = h.landed(off as u64, n as u64);
            h.submit(&whole);
        }
        assert_eq!(wait(&h).unwrap(), blake3::hash(&d), "len {len} bs {bs}");
    }

    #[test]
    fn out_of_order_subtrees_merge_to_the_plain_hash() {
        let m = SUBTREE_LEN as usize;
        for len in [
            0,
            1,
            1024,
            1025,
            m - 1,
            m,
            m + 1,
            2 * m,
            3 * m + 7,
            5 * m - 1,
            8 * m + 4096,
        ] {
            check(len, 1383);
        }
        check(7 * m + 3, 65536);
    }

    #[test]
    fn a_file_shorter_than_announced_is_an_error_not_a_hash() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data(1000)).unwrap();
        let mut h = StreamHash::new(f.try_clone().unwrap(), 3 * SUBTREE_LEN);
        let whole = h.landed(0, 3 * SUBTREE_LEN);
        h.submit(&whole);
        let e = wait(&h).unwrap_err();
        assert!(matches!(e, HashError::Read { .. }), "{e}");
        assert!(e.to_string().starts_with("cannot read bytes"), "{e}");
    }

    fn wait_whole(w: &mut WholeHash) -> Result<blake3::Hash, HashError> {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(r) = w.poll() {
                return r;
            }
            assert!(
                w.hash.outstanding() <= WHOLE_WINDOW,
                "more than a window queued"
            );
            assert!(Instant::now() < until, "hashing did not finish");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    #[test]
    fn a_whole_file_hashes_a_window_at_a_time_to_the_plain_hash() {
        let m = SUBTREE_LEN as usize;
        for len in [0, 1, m, m + 1, (WHOLE_WINDOW + 3) * m + 5] {
            let d = data(len);
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&d).unwrap();
            let mut w = WholeHash::start(f.try_clone().unwrap(), len as u64);
            assert!(w.next <= WHOLE_WINDOW, "len {len}: {} submitted", w.next);
            assert_eq!(wait_whole(&mut w).unwrap(), blake3::hash(&d), "len {len}");
        }
    }

    #[test]
    fn a_whole_file_that_shrank_is_an_error() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data(1000)).unwrap();
        let mut w = WholeHash::start(f, 3 * SUBTREE_LEN);
        let e = wait_whole(&mut w).unwrap_err();
        assert!(matches!(e, HashError::Read { .. }), "{e}");
    }

    #[test]
    fn nothing_is_claimed_before_every_byte_landed() {
        let len = 2 * SUBTREE_LEN as usize + 10;
        let d = data(len);
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&d).unwrap();
        let mut h = StreamHash::new(f.try_clone().unwrap(), len as u64);
        let whole = h.landed(0, 2 * SUBTREE_LEN);
        assert_eq!(whole, vec![0, 1]);
        h.submit(&whole);
        std::thread::sleep(Duration::from_millis(50));
        assert!(h.result().is_none());
        let whole = h.landed(2 * SUBTREE_LEN, 10);
        h.submit(&whole);
        assert_eq!(wait(&h).unwrap(), blake3::hash(&d));
    }

    #[test]
    fn leaf_hashes_come_in_order_and_merge_to_the_plain_hash() {
        let m = SUBTREE_LEN as usize;
        let l = LEAF_LEN as usize;
        for len in [
            1,
            l - 1,
            l,
            l + 1,
            m,
            m + 5,
            (WHOLE_WINDOW + 2) * m + 3 * l + 7,
        ] {
            let d = data(len);
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&d).unwrap();
            let mut h = LeafHash::start(f.try_clone().unwrap(), len as u64);
            let mut leaves = Vec::new();
            let until = Instant::now() + Duration::from_secs(30);
            while !h.done() {
                match h.take() {
                    Some(r) => {
                        let l = r.unwrap();
                        assert_eq!(l.first, leaves.len() as u64);
                        assert_eq!(l.subtree.is_some(), len > m, "len {len}");
                        leaves.extend(l.cvs.iter().map(leaf_hash));
                    }
                    None => std::thread::sleep(Duration::from_micros(200)),
                }
                assert!(Instant::now() < until);
            }
            assert_eq!(leaves.len(), len.div_ceil(l), "len {len}");
            for (i, leaf) in leaves.iter().enumerate() {
                let mut x = blake3::Hasher::new();
                x.set_input_offset((i * l) as u64);
                x.update(&d[i * l..((i + 1) * l).min(len)]);
                assert_eq!(
                    leaf[..],
                    x.finalize_non_root()[..LEAF_HASH],
                    "len {len} leaf {i}"
                );
            }
            let r = loop {
                if let Some(r) = h.result() {
                    break r.unwrap();
                }
                std::thread::sleep(Duration::from_micros(200));
            };
            assert_eq!(r, blake3::hash(&d), "len {len}");
        }
    }

    fn verdict(
        landing: &mut Landing,
        part: &mut crate::fs::PartFile,
    ) -> Result<[u8; 32], ReceiveError> {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(v) = landing.verdict(part) {
                return v;
            }
            assert!(Instant::now() < until, "no verdict");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The chaining value of leaf `j` of `d`.
    fn leaf_cv(d: &[u8], j: usize) -> ChainingValue {
        let l = LEAF_LEN as usize;
        leaf_cvs(&d[j * l..((j + 1) * l).min(d.len())], (j * l) as u64)
            .next()
            .unwrap()
    }

    /// Known chaining values stand for the kept bytes (they are not read back: a wrong one
    /// fails the verdict), but only inside the kept ranges (a wrong one for a leaf that
    /// arrives is not used).
    #[test]
    fn known_leaves_stand_for_kept_bytes_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::fs::Root::open(dir.path()).unwrap();
        let len = 3 * SUBTREE_LEN as usize + 5000;
        let d = data(len);
        let per = (SUBTREE_LEN / LEAF_LEN) as usize;
        let l = LEAF_LEN as usize;
        // Leaf 3 of subtree 1 arrives; everything else is in the temp file already.
        let gap = per + 3;
        let have = [(0, (gap * l) as u64), (((gap + 1) * l) as u64, len as u64)];
        for wrong in [None, Some(per + 7), Some(gap)] {
            let mut part = root.create_part("out", len as u64).unwrap();
            part.write_at(0, &d[..gap * l]).unwrap();
            part.write_at(((gap + 1) * l) as u64, &d[(gap + 1) * l..])
                .unwrap();
            part.flush().unwrap();
            let mut known = Known::default();
            let mut cvs: Vec<Option<ChainingValue>> =
                (per..2 * per).map(|j| Some(leaf_cv(&d, j))).collect();
            if let Some(w) = wrong {
                cvs[w - per] = Some([7; 32]);
            }
            assert!(known.leaves(1, cvs));
            let mut landing = Landing::start_known(&mut part, len as u64, &have, known).unwrap();
            part.write_at((gap * l) as u64, &d[gap * l..(gap + 1) * l])
                .unwrap();
            landing
                .wrote(&mut part, (gap * l) as u64, l as u64)
                .unwrap();
            landing.complete(*blake3::hash(&d).as_bytes());
            let v = verdict(&mut landing, &mut part);
            match wrong {
                Some(w) if w != gap => assert!(
                    matches!(v, Err(ReceiveError::Mismatch { .. })),
                    "a known leaf was read back: {v:?}"
                ),
                _ => assert_eq!(v.unwrap(), *blake3::hash(&d).as_bytes(), "{wrong:?}"),
            }
            part.discard();
        }
    }

    /// Reads for sending, waiting while the reader thread still reads the chunk ahead (a
    /// driver's loop would do other work meanwhile).
    fn read_ready(s: &mut Sending, offset: u64, buf: &mut [u8]) {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            match s.read(offset, buf) {
                Ok(()) => return,
                Err(SourceError::NotReady) => {
                    assert!(Instant::now() < until, "never read");
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("read at {offset}: {e}"),
            }
        }
    }

    #[test]
    fn a_sent_file_hashes_as_reads_pass_and_skipped_parts_at_the_end() {
        let len = 5 * SUBTREE_LEN as usize + 333;
        let d = data(len);
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&d).unwrap();
        let src = crate::fs::SourceFile::new(f, len as u64);
        let mut s = Sending::new(src).unwrap();
        let mut buf = vec![0u8; 1400];
        // Reads the first two subtrees, then jumps (a resumed receiver has the rest but the
        // last block).
        let mut off = 0;
        while off + 1400 <= 2 * SUBTREE_LEN as usize {
            read_ready(&mut s, off as u64, &mut buf);
            off += 1400;
        }
        assert_eq!(s.next, 1, "only whole subtrees passed are hashed");
        let last = len - 333;
        let mut tail = vec![0u8; 333];
        read_ready(&mut s, last as u64, &mut tail);
        assert_eq!(s.next, 6);
        let until = Instant::now() + Duration::from_secs(20);
        let h = loop {
            if let Some(r) = s.hash_ready() {
                break r.unwrap();
            }
            assert!(Instant::now() < until);
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(h, *blake3::hash(&d).as_bytes());
        assert!(s.hash_ready().is_none(), "given once");
    }

    #[test]
    fn a_sent_file_is_hashed_from_the_chunks_read_for_sending() {
        // Blocks of an odd size straddle every chunk boundary; some are read again (as
        // retransmissions are) after later ones.
        let len = 4 * SUBTREE_LEN as usize + 777;
        let d = data(len);
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&d).unwrap();
        let src = crate::fs::SourceFile::new(f, len as u64);
        let mut s = Sending::new(src).unwrap();
        let block = 1371;
        let mut off = 0;
        let mut n = 0;
        while off < len {
            let k = block.min(len - off);
            let mut buf = vec![0u8; k];
            read_ready(&mut s, off as u64, &mut buf);
            assert_eq!(buf, d[off..off + k], "bytes at {off}");
            n += 1;
            if n % 97 == 0 && off > 5 * block {
                let back = off - 5 * block;
                let mut again = vec![0u8; block];
                read_ready(&mut s, back as u64, &mut again);
                assert_eq!(again, d[back..back + block], "bytes again at {back}");
            }
            off += k;
        }
        assert!(
            s.submitted.iter().all(|&b| b),
            "every subtree went to the workers with the bytes read for sending"
        );
        s.finish();
        let until = Instant::now() + Duration::from_secs(20);
        let h = loop {
            if let Some(r) = s.hash_ready() {
                break r.unwrap();
            }
            assert!(Instant::now() < until);
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(h, *blake3::hash(&d).as_bytes());
    }

    #[test]
    fn a_received_file_is_hashed_from_its_in_order_writes_and_gaps_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::fs::Root::open(dir.path()).unwrap();
        let len = 6 * SUBTREE_LEN as usize + 999;
        let d = data(len);
        let mut part = root.create_part("f", len as u64).unwrap();
        let block = 1400usize;
        let mut landing = Landing::start(&mut part, len as u64, &[]).unwrap();
        // Blocks in order, but a few "lost" in subtree 2 that come at the end.
        let lost = |b: usize| {
            (2 * SUBTREE_LEN as usize..3 * SUBTREE_LEN as usize).contains(&(b * block))
                && b.is_multiple_of(50)
        };
        let blocks = len.div_ceil(block);
        let write = |b: usize, part: &mut crate::fs::PartFile, l: &mut Landing| {
            let off = b * block;
            let end = (off + block).min(len);
            part.write_at(off as u64, &d[off..end]).unwrap();
            l.wrote(part, off as u64, (end - off) as u64).unwrap();
        };
        for b in (0..blocks).filter(|&b| !lost(b)) {
            write(b, &mut part, &mut landing);
        }
        for b in (0..blocks).filter(|&b| lost(b)) {
            write(b, &mut part, &mut landing);
        }
        landing.complete(*blake3::hash(&d).as_bytes());
        let until = Instant::now() + Duration::from_secs(20);
        let v = loop {
            if let Some(v) = landing.verdict(&mut part) {
                break v;
            }
            assert!(Instant::now() < until, "no verdict");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(v.unwrap(), *blake3::hash(&d).as_bytes());
        let fed = landing.tree.as_ref().unwrap().shared.lock().unwrap().fed;
        // Subtree 2 had gaps, the last is cut short by the end of the file: at most 6 of 7
        // came in order, and at least the 4 before and after the gaps did.
        assert!(
            (4..=6).contains(&fed),
            "{fed} subtrees hashed from the writes"
        );
        part.discard();
    }
}
