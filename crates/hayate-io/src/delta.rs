//! Delta transfers and verified resume, the receiver's half: a file it already holds (the
//! one at the destination, or the temp file an interrupted copy left) is its *basis*; it
//! hashes the basis into [`LEAF_LEN`] leaves on the worker threads while the sender's leaf
//! hashes come in (`Ctrl::Sums`), compares them in order, and answers the blocks whose
//! leaves are compared as it goes ([`Decision`]: in `Compared` messages of 8-64 MiB of the
//! file, the rest in `Ready`), the blocks that lie wholly inside matching leaves as `have`,
//! so the sender sends the others while the rest is compared. Those the sender never sends:
//! the file at the destination is copied into the temp file as it is hashed (the copy is
//! what is hashed), or (resume) they are there already. The whole-file BLAKE3 is verified
//! at the end as for any transfer, from the chaining values of the leaves kept and what
//! arrived, read back (`verify::Known`).
//!
//! A leaf's hash is a chaining value of the file's BLAKE3 tree at its offset, so two leaves
//! at the same index match only if their bytes (and lengths) do: data that moved (an
//! insertion shifting the rest) matches nothing after it. The basis is hashed only up to
//! the offered size, so a destination longer than the source matches up to its end.

use std::collections::VecDeque;
use std::fs::File;

use blake3::hazmat::ChainingValue;
use hayate_proto::control::{basis, flags, BlockSpan, LeafHash};
use hayate_proto::{Connection, XferId};

use crate::driver::resume::MIN_RESUME_SIZE;
use crate::fs::{ours, FileIdentity, PartFile};
use crate::verify::{leaf_hash, Known, LeafHash as Hasher, Leaves, Sending, LEAF_LEN, SUBTREE_LEN};

/// Leaves per subtree.
const SUBTREE_LEAVES: u64 = SUBTREE_LEN / LEAF_LEN;

/// Files smaller than this are sent whole over a destination: the round trip of the
/// hashes costs more than the bytes.
pub const DELTA_MIN: u64 = 64 << 10;

/// A verified file sent whole for being small (under [`DELTA_MIN`]) whose destination
/// already holds the same bytes: `part` keeps the destination instead of replacing it, as a
/// delta does for a bigger one (see [`Probe`]).
pub fn keep_small_if_same(part: &mut PartFile, hash: &[u8; 32]) {
    part.keep_if_same(hash, DELTA_MIN - 1);
}

/// Most block ranges a receiver names in `Ready` (a message is at most 1 MiB, and these
/// take up to 10 bytes each): past this, the shortest are sent instead.
pub const MAX_HAVE_RANGES: usize = 40_000;

/// Most blocks held in part a receiver names in `Ready` (up to 14 bytes each): past this,
/// the ones that would save least are sent whole.
pub const MAX_SPANS: usize = 20_000;

/// What a receiver holds of an offered file, as it tells the sender in `Ready`: whole
/// blocks, and blocks held in part with the span of each still to come (a changed 4 KiB
/// leaf costs its 4 KiB, not the one or two blocks of up to 8.9 KB it lies in).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    /// Block ranges `[a, b)` held whole.
    pub have: Vec<(u64, u64)>,
    /// Blocks held but for these bytes.
    pub spans: Vec<BlockSpan>,
}

impl Kept {
    /// The file's byte ranges held, in order, disjoint: the whole blocks, and of the
    /// blocks held in part what is outside their spans.
    pub fn byte_ranges(&self, block: u64, size: u64) -> Vec<(u64, u64)> {
        let mut pieces: Vec<(u64, u64)> = self
            .have
            .iter()
            .map(|&(a, b)| ((a * block).min(size), (b * block).min(size)))
            .collect();
        for sp in &self.spans {
            let start = sp.block * block;
            let end = (start + block).min(size);
            pieces.push((start, start + u64::from(sp.from)));
            pieces.push((start + u64::from(sp.to), end));
        }
        pieces.retain(|&(a, b)| a < b);
        pieces.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(pieces.len());
        for (a, b) in pieces {
            match out.last_mut() {
                Some(last) if last.1 >= a => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        out
    }
}

/// Bytes of the file a receiver answers at least in one `Compared` (but for the last
/// blocks, which `Ready` answers): more messages cost more than the data they let go
/// early. Also well beyond what the sender may have sent with the offer (2 MiB), which
/// waits in the receiver's stash until it is compared.
pub const PART_MIN: u64 = 8 << 20;

/// Bytes of the file one `Compared` answers at most (whatever the comparison caught up
/// with meanwhile goes in several): a message stays well under its ranges' caps.
pub const PART_MAX: u64 = 64 << 20;

/// What a receiver comparing a basis can answer now ([`Basis::poll`]).
pub struct Decision {
    /// The blocks below this are answered (all of them when `done`).
    pub upto: u64,
    /// What the basis holds of the blocks from the previous decision's `upto` (or 0).
    pub kept: Kept,
    /// The chaining values of what it holds, hashed so far, for the verification.
    pub known: Known,
    /// Every leaf is compared: the file is accepted (after [`Basis::finish`]), with `kept`
    /// in `Ready`; else `kept` goes in a `Compared`.
    pub done: bool,
}

/// Leaf hashes a sender keeps queued on the control stream, not yet sent, at most: enough
/// to keep the stream's window full, little enough that a message queued behind them
/// waits for a few packets, not for megabytes.
pub const SUMS_BACKLOG: u64 = 64 << 10;

/// What a receiver compares the sender's leaves with, and how far it got.
pub struct Basis {
    /// [`basis::RESUME`] or [`basis::DEST`].
    pub kind: u8,
    /// Hashes the temp file (or, `--inplace`, the destination), the basis copied into it
    /// first where the basis is another file.
    hash: Hasher,
    /// Leaves of the basis that are hashed (it may be shorter than the offer).
    basis_leaves: u64,
    /// Size of the offered file and its leaf count.
    size: u64,
    leaves: u64,
    /// Next leaf to compare; the basis's and the sender's leaves from there, as arrived.
    at: u64,
    /// Leaves the hasher has handed over: those before it are copied into the temp file
    /// (where the basis is another file), and no worker touches them any more.
    taken: u64,
    /// Blocks below this are answered (see [`Decision`]).
    answered: u64,
    mine: VecDeque<ChainingValue>,
    theirs: VecDeque<LeafHash>,
    /// Matching leaf ranges, in order.
    matched: Vec<(u64, u64)>,
    /// The subtree being compared: its chaining value, and those of its matching leaves.
    subtree: Option<ChainingValue>,
    subtree_leaves: Vec<Option<ChainingValue>>,
    /// What the temp file is known to hold, for the verification.
    known: Known,
    /// A destination as long as the offer, read where it is while every leaf matches.
    probe: Option<Probe>,
    /// After a probe: the chaining values of the subtrees it read whole, each one's copy
    /// compared whole with it (the sender's leaves of those were used up).
    reread: Vec<ChainingValue>,
    /// The probe read the whole file and every leaf matched: the destination is kept as it
    /// is (this is what it was then).
    unchanged: Option<FileIdentity>,
}

/// A destination as long as the offered file is first read where it is, not copied: while
/// every leaf matches, nothing is written, and a file found the same throughout is kept as
/// it is (no copy, no rename: its inode, links and attributes stay, and a snapshot of the
/// file system sees no change). At the first leaf that differs the basis starts over,
/// copying the destination into the temp file as it hashes it; the subtrees read before
/// then are compared whole with their copies (a copy that differs from what was read, the
/// destination having changed meanwhile, is sent). What that costs is hashing those
/// subtrees twice, which is why only a destination likely the same is probed (see
/// [`basis_for`]): one of another length (an appended log, say) or older than the source
/// (changed since it was copied) is copied from the start.
struct Probe {
    /// The destination and the temp file (handles of their own), for the start over.
    dest: File,
    temp: File,
    /// The destination before it was read.
    ident: FileIdentity,
    /// Chaining values of the subtrees read so far, all of whose leaves matched.
    subtrees: Vec<ChainingValue>,
    /// The sender's leaves of the subtree being compared, up to the one being compared.
    current: Vec<LeafHash>,
}

/// The basis for offered file of `size` bytes (with `flags`, last changed at `mtime`, in
/// seconds) being received into `part`, if there is one: the temp file an earlier copy left
/// (checked leaf by leaf, whatever its resume state says; unless it has none and there is a
/// file at the destination to compare with), else the file at the destination unless
/// `WHOLE_FILE`. That one is read where it is first (see [`Probe`]) when it is
/// likely the same and ours: as long as the offer, not older than it (as `-p` left it, or
/// written after the source last changed), and owned by this user (or this is root); else
/// it is copied as it is hashed.
pub fn basis_for(part: &mut PartFile, size: u64, fl: u32, mtime: i64) -> Option<Basis> {
    if size == 0 || fl & flags::NO_RESUME != 0 || part.writes_in_order() {
        return None;
    }
    if let Some(old) = part.in_place_len() {
        // `--inplace`: the destination is the file written; what matches stays where it is.
        if fl & flags::WHOLE_FILE != 0 || old == 0 || size < DELTA_MIN {
            return None;
        }
        let file = part.file().ok()?.try_clone().ok()?;
        return Some(Basis::start(basis::DEST, file, None, old.min(size), size));
    }
    // A temp file with no resume state beside it was left by a run that stopped before
    // its transfer was accepted (a delta still comparing: the destination copied into it
    // up to where the copy got, and nothing after): the destination is the better basis.
    let cut_short = || {
        !part.has_state()
            && fl & flags::WHOLE_FILE == 0
            && size >= DELTA_MIN
            && part.open_existing().is_some_and(|(_, len)| len > 0)
    };
    if part.existing_len() > 0 && size >= MIN_RESUME_SIZE && !cut_short() {
        let len = part.existing_len().min(size);
        let file = part.file().ok()?.try_clone().ok()?;
        return Some(Basis::start(basis::RESUME, file, None, len, size));
    }
    if fl & flags::WHOLE_FILE != 0 || size < DELTA_MIN {
        return None;
    }
    let (from, len) = part.open_existing().filter(|(_, len)| *len > 0)?;
    let file = part.file().ok()?.try_clone().ok()?;
    // Kept, its mode and mtime may be set as a copy's would be: ours to change.
    let likely_same = || {
        use std::os::unix::fs::MetadataExt;
        from.metadata()
            .is_ok_and(|m| m.mtime() >= mtime && ours(&m))
    };
    if len == size && likely_same() {
        if let Some(probe) = Basis::probe(file.try_clone().ok()?, from.try_clone().ok()?) {
            // Nothing is written yet: what is reserved for the temp file is not needed if
            // the destination is kept, and a copy takes its space as it goes.
            if part.empty_for_probe().is_ok() {
                return Some(probe);
            }
        }
    }
    Some(Basis::start(
        basis::DEST,
        file,
        Some(from),
        len.min(size),
        size,
    ))
}

impl Basis {
    /// Starts hashing the first `len` bytes of `file`, the temp file of an offered file of
    /// `size` bytes (or the destination written in place), those bytes first copied into
    /// it from `from` where that is given (the file at the destination).
    pub fn start(kind: u8, file: File, from: Option<File>, len: u64, size: u64) -> Self {
        Basis {
            kind,
            hash: Hasher::start_copying(file, from, len),
            basis_leaves: len.div_ceil(LEAF_LEN),
            size,
            leaves: size.div_ceil(LEAF_LEN),
            at: 0,
            taken: 0,
            answered: 0,
            mine: VecDeque::new(),
            theirs: VecDeque::new(),
            matched: Vec::new(),
            subtree: None,
            subtree_leaves: Vec::new(),
            known: Known::default(),
            probe: None,
            reread: Vec::new(),
            unchanged: None,
        }
    }

    /// Starts reading the file at the destination, `dest`, as long as the offer, where it is
    /// (see [`Probe`]); `temp` is the temp file, for a start over. `None` if `dest` cannot
    /// be looked at.
    fn probe(temp: File, dest: File) -> Option<Self> {
        let ident = FileIdentity::of(&dest).ok()?;
        let size = ident.size();
        let mut b = Basis::start(basis::DEST, dest.try_clone().ok()?, None, size, size);
        b.probe = Some(Probe {
            dest,
            temp,
            ident,
            subtrees: Vec::new(),
            current: Vec::new(),
        });
        Some(b)
    }

    /// A leaf differed while probing: start over, copying the destination into the temp file
    /// as it is hashed, from the first subtree; the subtrees read whole are compared with
    /// their copies, the one being compared leaf by leaf again (the sender's leaves of it,
    /// `current` and `differing`, go back in front of those still to compare).
    fn start_over(&mut self, differing: LeafHash) {
        let p = self.probe.take().expect("probing");
        let first = self.at - self.at % SUBTREE_LEAVES;
        for l in p.current.into_iter().chain([differing]).rev() {
            self.theirs.push_front(l);
        }
        self.at = 0;
        self.taken = 0;
        self.reread = p.subtrees;
        debug_assert_eq!(self.reread.len() as u64 * SUBTREE_LEAVES, first);
        // Emptied for the probe (see `PartFile::empty_for_probe`): a failure here fails
        // the copies, and nothing of the basis is then held.
        let _ = p.temp.set_len(self.size);
        self.hash = Hasher::start_copying(p.temp, Some(p.dest), self.size);
        self.mine.clear();
        self.matched.clear();
        self.subtree = None;
        self.subtree_leaves.clear();
        self.known = Known::default();
    }

    /// A subtree of the file read before a start over: its copy, hashed, is held if it is
    /// what was read then. False while the workers are on it.
    fn compare_reread(&mut self) -> bool {
        let index = (self.at / SUBTREE_LEAVES) as usize;
        let n = match self.hash.take() {
            None => return false,
            Some(Ok(l)) => {
                let n = l.cvs.len() as u64;
                self.taken += n;
                if let Some(cv) = l.subtree.filter(|cv| *cv == self.reread[index]) {
                    self.matched.push((self.at, self.at + n));
                    self.known.whole(index, cv);
                }
                n
            }
            // Not copied or not read: the rest of the basis is not trusted (sent).
            Some(Err(_)) => {
                let rest = self.reread.len() as u64 * SUBTREE_LEAVES;
                self.basis_leaves = rest;
                rest - self.at
            }
        };
        self.at += n;
        if self.at >= self.reread.len() as u64 * SUBTREE_LEAVES {
            self.reread = Vec::new();
        }
        true
    }

    /// The sender's leaves `first..`, as they came (in order: the connection checks).
    pub fn sums(&mut self, first: u64, leaves: Vec<LeafHash>) {
        debug_assert_eq!(first, self.at + self.theirs.len() as u64);
        self.theirs.extend(leaves);
    }

    /// Compares what both sides have hashed so far, and says what can be answered, in
    /// blocks of `block` bytes: once every leaf is compared (and no copy into the temp file
    /// is still going on), the rest of the file; before, at least [`PART_MIN`] of it more
    /// than answered, when its leaves are compared and no worker still copies there (not
    /// while a destination is read where it is: a leaf found different there starts the
    /// comparison over). Called again until `None` (or `done`).
    pub fn poll(&mut self, block: u64) -> Option<Decision> {
        while self.at < self.leaves {
            if !self.reread.is_empty() {
                if self.compare_reread() {
                    continue;
                }
                break;
            }
            let Some(&theirs) = self.theirs.front() else {
                break;
            };
            let mine = if self.at >= self.basis_leaves {
                None
            } else {
                if self.mine.is_empty() {
                    match self.hash.take() {
                        Some(Ok(Leaves {
                            first,
                            cvs,
                            subtree,
                        })) => {
                            debug_assert_eq!(first, self.at);
                            self.taken = first + cvs.len() as u64;
                            self.mine.extend(cvs);
                            self.subtree = subtree;
                        }
                        // Still hashing.
                        None => break,
                        // The basis shrank or cannot be read: nothing more of it matches.
                        Some(Err(_)) => {
                            self.basis_leaves = self.at;
                            continue;
                        }
                    }
                }
                self.mine.pop_front()
            };
            self.theirs.pop_front();
            let same = mine.filter(|cv| leaf_hash(cv) == theirs);
            if let Some(p) = &mut self.probe {
                if same.is_none() {
                    self.start_over(theirs);
                    continue;
                }
                p.current.push(theirs);
            }
            if same.is_some() {
                match self.matched.last_mut() {
                    Some(last) if last.1 == self.at => last.1 += 1,
                    _ => self.matched.push((self.at, self.at + 1)),
                }
            }
            self.subtree_leaves.push(same);
            self.at += 1;
            if self.at.is_multiple_of(SUBTREE_LEAVES) || self.at == self.leaves {
                self.subtree_compared();
            }
        }
        if self.at == self.leaves {
            if let Some(p) = self.probe.take() {
                // Every leaf matched, and the lengths are the same.
                self.unchanged = Some(p.ident);
            }
        }
        let blocks = self.size.div_ceil(block);
        // A copy that failed leaves later ones with the workers: they write into the temp
        // file, so blocks may land there only once they are done.
        let idle = self.hash.outstanding() == 0;
        if self.at == self.leaves && idle {
            return Some(self.decide(block, blocks, true));
        }
        if self.probe.is_some() || !self.reread.is_empty() {
            return None;
        }
        let copied = if idle {
            self.at
        } else {
            self.at.min(self.taken)
        };
        let upto = ((copied * LEAF_LEN).min(self.size) / block).min(blocks);
        if upto.saturating_sub(self.answered) * block < PART_MIN {
            return None;
        }
        let upto = upto.min(self.answered + PART_MAX / block);
        Some(self.decide(block, upto, false))
    }

    /// Answers the blocks from those answered to `upto`.
    fn decide(&mut self, block: u64, upto: u64, done: bool) -> Decision {
        let kept = kept_in(&self.matched, self.size, block, self.answered, upto);
        self.answered = upto;
        // Ranges wholly before what is still to answer are done with.
        let end = (upto * block).min(self.size);
        self.matched
            .retain(|&(_, b)| (b * LEAF_LEN).min(self.size) > end);
        Decision {
            upto,
            kept,
            known: std::mem::take(&mut self.known),
            done,
        }
    }

    /// The leaves of the subtree before `at` are all compared: what of it is known.
    fn subtree_compared(&mut self) {
        let index = ((self.at - 1) / SUBTREE_LEAVES) as usize;
        let leaves = std::mem::take(&mut self.subtree_leaves);
        let subtree = self.subtree.take();
        if let Some(p) = &mut self.probe {
            // Every leaf of it matched (else the probe ended). A file of one subtree has
            // none to compare a copy with: a start over is then within it.
            p.subtrees.extend(subtree);
            p.current.clear();
        }
        if self.leaves <= SUBTREE_LEAVES {
            // A file of one subtree is verified from its root hash (see `finish`) or read.
            return;
        }
        if leaves.iter().all(Option::is_some) {
            if let Some(cv) = subtree {
                self.known.whole(index, cv);
                return;
            }
        }
        if leaves.iter().any(Option::is_some) {
            self.known.leaves(index, leaves);
        }
    }

    /// Once the last [`Decision`] is taken: what else the temp file holds (a file of one
    /// subtree found the same: its root hash), for the verification; and, when the
    /// destination proved the same as the offer throughout, `part` keeps it instead of a
    /// copy (the chaining values are then the destination's).
    pub fn finish(mut self, part: &mut PartFile) -> Known {
        if let Some(ident) = self.unchanged {
            if self.leaves <= SUBTREE_LEAVES {
                // One subtree: what stands for it is the file's hash, as read.
                match self.hash.result() {
                    Some(Ok(h)) => self.known.root(h),
                    _ => return Known::default(),
                }
            }
            part.keep_destination(ident);
        }
        self.known
    }

    /// The destination proved the same as the offer throughout (once compared).
    pub fn unchanged(&self) -> bool {
        self.unchanged.is_some()
    }
}

/// Sender: starts the leaf hashes the receivers asked for, and queues the pieces the workers
/// have finished, while the control stream's backlog is small. Returns whether some are
/// still being hashed (the loop should look again soon).
pub fn pump_sums<'a>(
    c: &mut Connection,
    out: impl Iterator<Item = (XferId, &'a mut Sending)>,
) -> bool {
    let wanted = c.sums_wanted();
    let mut pending = false;
    for (x, s) in out {
        if wanted.contains(&x) {
            if let Err(e) = s.start_sums() {
                c.fail_source(x, &format!("cannot read: {e}"));
                continue;
            }
        }
        while c.ctrl_backlog() < SUMS_BACKLOG {
            match s.next_sums() {
                Some(Ok((first, v))) => c.send_sums(x, first, &v),
                Some(Err(e)) => {
                    c.fail_source(x, &e.to_string());
                    break;
                }
                None => break,
            }
        }
        pending |= s.sums_pending();
    }
    pending
}

/// What matching leaf ranges `matched` (in order) hold of a file of `size` bytes in blocks
/// of `block` bytes: the blocks wholly inside them, and the blocks partly inside them with
/// the span that covers the rest (from its first byte outside them to its last). When
/// there are more than [`MAX_HAVE_RANGES`] or [`MAX_SPANS`], those that save least are
/// left out (sent whole).
pub fn kept(matched: &[(u64, u64)], size: u64, block: u64) -> Kept {
    kept_in(matched, size, block, 0, size.div_ceil(block))
}

/// [`kept`] of the blocks `from..to` alone.
pub fn kept_in(matched: &[(u64, u64)], size: u64, block: u64, from: u64, to: u64) -> Kept {
    let (lo, hi) = ((from * block).min(size), (to * block).min(size));
    let leaf = |l: u64| (l * LEAF_LEN).clamp(lo, hi);
    // The bytes outside the matching leaves, and the blocks they touch: whole, or a span.
    let mut touched: Vec<(u64, u64, u64)> = Vec::new(); // (block, lo, hi) in file offsets
    let mut at = lo;
    let mut gaps: Vec<(u64, u64)> = Vec::new();
    for &(a, b) in matched {
        if leaf(a) > at {
            gaps.push((at, leaf(a)));
        }
        at = at.max(leaf(b));
    }
    if at < hi {
        gaps.push((at, hi));
    }
    for (lo, hi) in gaps {
        for b in lo / block..=(hi - 1) / block {
            let (s, e) = (b * block, ((b + 1) * block).min(size));
            let (l, h) = (lo.max(s), hi.min(e));
            match touched.last_mut() {
                Some(t) if t.0 == b => t.2 = h,
                _ => touched.push((b, l, h)),
            }
        }
    }
    let mut have: Vec<(u64, u64)> = Vec::new();
    let mut spans = Vec::new();
    let mut next = from;
    for &(b, lo, hi) in &touched {
        if next < b {
            have.push((next, b));
        }
        next = b + 1;
        let (s, e) = (b * block, ((b + 1) * block).min(size));
        if lo > s || hi < e {
            spans.push(BlockSpan {
                block: b,
                from: (lo - s) as u32,
                to: (hi - s) as u32,
            });
        }
    }
    if next < to {
        have.push((next, to));
    }
    if have.len() > MAX_HAVE_RANGES {
        let mut longest: Vec<usize> = (0..have.len()).collect();
        longest.sort_by_key(|&i| std::cmp::Reverse(have[i].1 - have[i].0));
        longest.truncate(MAX_HAVE_RANGES);
        longest.sort_unstable();
        have = longest.into_iter().map(|i| have[i]).collect();
    }
    if spans.len() > MAX_SPANS {
        let full = |sp: &BlockSpan| ((sp.block + 1) * block).min(size) - sp.block * block;
        spans.sort_by_key(|sp| std::cmp::Reverse(full(sp) - sp.len() as u64));
        spans.truncate(MAX_SPANS);
        spans.sort_unstable_by_key(|sp| sp.block);
    }
    Kept { have, spans }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::Landing;
    use std::time::{Duration, Instant};

    fn data(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn leaf_hashes(d: &[u8]) -> Vec<LeafHash> {
        crate::verify::leaf_cvs(d, 0)
            .map(|cv| leaf_hash(&cv))
            .collect()
    }

    /// What [`rebuild`] found.
    struct Rebuilt {
        /// Bytes held (not sent).
        held: u64,
        /// Subtrees whose chaining values were known, whole or in part.
        known: usize,
        /// The destination was kept as it was (the same inode).
        kept: bool,
        /// `Compared` answers before the last.
        parts: usize,
    }

    /// Copies `new` over a destination holding `old` as a receiver does: the basis hashed
    /// (`meanwhile` runs once it started), compared with `new`'s leaves, what was not kept
    /// written as if it arrived, verified and committed.
    fn rebuild(old: &[u8], new: &[u8], meanwhile: impl FnOnce(&std::path::Path)) -> Rebuilt {
        rebuild_with(old, new, |b, dest, theirs| {
            meanwhile(dest);
            b.sums(0, theirs.to_vec());
        })
    }

    /// [`rebuild`], the sender's leaves (`theirs`) given to the basis by `feed`.
    fn rebuild_with(
        old: &[u8],
        new: &[u8],
        feed: impl FnOnce(&mut Basis, &std::path::Path, &[LeafHash]),
    ) -> Rebuilt {
        rebuild_fed(old, new, feed, 0)
    }

    /// [`rebuild_with`]; with `step`, the sender's leaves that `feed` did not give come
    /// `step` at a time, each once those before are compared (as they come over a path
    /// slower than the hashing). Each answer is told to the landing as a driver does, and
    /// the blocks it does not hold arrive then, as if sent.
    fn rebuild_fed(
        old: &[u8],
        new: &[u8],
        feed: impl FnOnce(&mut Basis, &std::path::Path, &[LeafHash]),
        step: usize,
    ) -> Rebuilt {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let root = crate::fs::Root::open(dir.path()).unwrap();
        let len = new.len() as u64;
        let dest = dir.path().join("f");
        std::fs::write(&dest, old).unwrap();
        let ino = std::fs::metadata(&dest).unwrap().ino();
        let mut part = root.create_part("f", len).unwrap();
        let mut b = basis_for(&mut part, len, 0, 0).expect("a basis");
        assert_eq!(b.kind, basis::DEST);
        let theirs = leaf_hashes(new);
        feed(&mut b, &dest, &theirs);
        let mut fed = b.at + b.theirs.len() as u64;
        let block = 8952;
        let mut landing = Landing::begin(&mut part, len).unwrap();
        let (mut held, mut n_known, mut parts, mut answered) = (0, 0, 0, 0);
        let mut b = Some(b);
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let basis = b.as_mut().expect("comparing");
            if step > 0 && fed < theirs.len() as u64 && basis.at == fed {
                let n = step.min(theirs.len() - fed as usize);
                basis.sums(fed, theirs[fed as usize..fed as usize + n].to_vec());
                fed += n as u64;
            }
            let Some(mut d) = basis.poll(block) else {
                assert!(Instant::now() < until, "never compared");
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            if d.done {
                d.known
                    .extend(b.take().expect("comparing").finish(&mut part));
            }
            n_known += d.known.len();
            let ranges = d.kept.byte_ranges(block, len);
            let upto = (d.upto * block).min(len);
            assert!(ranges.iter().all(|&(a, b)| answered <= a && b <= upto));
            landing.hold(&mut part, &ranges, upto, d.known).unwrap();
            // What it does not hold arrives.
            let mut at = answered;
            for &(a, b) in ranges.iter().chain([(upto, upto)].iter()) {
                if at < a {
                    part.write_at(at, &new[at as usize..a as usize]).unwrap();
                    landing.wrote(&mut part, at, a - at).unwrap();
                }
                at = b;
            }
            held += ranges.iter().map(|&(a, b)| b - a).sum::<u64>();
            answered = upto;
            if d.done {
                assert_eq!(upto, len);
                break;
            }
            parts += 1;
        }
        landing.complete(*blake3::hash(new).as_bytes());
        let v = loop {
            if let Some(v) = landing.verdict(&mut part) {
                break v;
            }
            assert!(Instant::now() < until, "no verdict");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(v.unwrap(), *blake3::hash(new).as_bytes());
        part.commit(None, None).unwrap();
        assert!(std::fs::read(&dest).unwrap() == new, "the result differs");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["f"], "a temp file is left");
        Rebuilt {
            held,
            known: n_known,
            kept: std::fs::metadata(&dest).unwrap().ino() == ino,
            parts,
        }
    }

    /// `old` with these leaves overwritten by fresh bytes.
    fn leaves_changed(old: &[u8], leaves: &[usize]) -> Vec<u8> {
        let mut new = old.to_vec();
        let l = LEAF_LEN as usize;
        for &leaf in leaves {
            new[leaf * l..(leaf + 1) * l].copy_from_slice(&data(l, leaf as u64 + 9));
        }
        new
    }

    /// A temp file for `name`, as a rerun gets it: once the background threads of the run
    /// before let go of it (its lock).
    fn part_when_free(root: &crate::fs::Root, name: &str, len: u64) -> PartFile {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match root.create_part(name, len) {
                Err(crate::fs::FsError::Busy(_)) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                r => return r.unwrap(),
            }
        }
    }

    fn poll_until(b: &mut Basis, block: u64) -> Kept {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(d) = b.poll(block) {
                assert!(d.done, "a small file is answered at once");
                return d.kept;
            }
            assert!(Instant::now() < until, "never compared");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A destination the same as the offer throughout is read where it is, never copied:
    /// it is kept (the same inode), and verified from what was read.
    #[test]
    fn a_destination_found_the_same_is_kept_not_copied() {
        let len = 3 * SUBTREE_LEN as usize + 5000;
        let old = data(len, 11);
        let r = rebuild(&old, &old, |_| {});
        assert_eq!(r.held, len as u64);
        assert_eq!(r.known, 4);
        assert!(r.kept, "the destination was replaced");
        // One byte different, at the very end: copied and replaced.
        let mut new = old.clone();
        new[len - 1] ^= 1;
        let r = rebuild(&old, &new, |_| {});
        assert_eq!(r.held, (len - (5000 - 4096)) as u64);
        assert!(!r.kept);
        // A file of one subtree, the same: kept, verified from its hash as read.
        let small = data(300_000, 18);
        let r = rebuild(&small, &small, |_| {});
        assert_eq!((r.held, r.known), (300_000, 1));
        assert!(r.kept, "the destination was replaced");
        let mut new = small.clone();
        new[150_000] ^= 1;
        let r = rebuild(&small, &new, |_| {});
        assert_eq!(r.held, 300_000 - 4096);
        assert!(!r.kept);
    }

    /// A difference past the first subtrees: the basis starts over copying, the subtrees
    /// read before are held whole (their copies are what was read), the rest leaf by leaf.
    #[test]
    fn a_late_difference_starts_over_copying_and_holds_what_was_read() {
        let len = 6 * SUBTREE_LEN as usize;
        let old = data(len, 12);
        let new = leaves_changed(&old, &[4 * SUBTREE_LEAVES as usize + 17]);
        let r = rebuild(&old, &new, |_| {});
        assert_eq!(r.held, len as u64 - LEAF_LEN);
        assert_eq!(r.known, 6);
        assert!(!r.kept);
    }

    /// The destination changes after its first subtrees were read (all matching) and
    /// before a difference further on starts the copy: the copy of a changed subtree is not
    /// what was read, so that subtree is sent whole, and the result is exact.
    #[test]
    fn a_destination_changed_after_it_was_read_is_sent_where_it_changed() {
        let m = SUBTREE_LEN as usize;
        let len = 5 * m;
        let old = data(len, 14);
        let l = LEAF_LEN as usize;
        let new = leaves_changed(&old, &[3 * SUBTREE_LEAVES as usize + 5]);
        let r = rebuild_with(&old, &new, |b, dest, theirs| {
            let first = (2 * SUBTREE_LEAVES) as usize;
            b.sums(0, theirs[..first].to_vec());
            let until = Instant::now() + Duration::from_secs(30);
            while b.at < first as u64 {
                assert!(b.poll(8952).is_none());
                assert!(Instant::now() < until, "never compared");
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(b.probe.is_some(), "still reading where it is");
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(dest).unwrap();
            f.write_all_at(&[0x5a; 100], 1000).unwrap();
            b.sums(first as u64, theirs[first..].to_vec());
        });
        assert_eq!(r.held, (len - m - l) as u64);
        assert!(!r.kept);
    }

    /// Only a destination likely the same is read where it is first: as long as the offer
    /// and not older than the source; one changed since (older) or of another length is
    /// copied as it is hashed from the start.
    #[test]
    fn only_a_destination_likely_the_same_is_probed() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::fs::Root::open(dir.path()).unwrap();
        let len = 2 * SUBTREE_LEN;
        std::fs::write(dir.path().join("f"), data(len as usize, 17)).unwrap();
        let probed = |size: u64, mtime: i64| {
            let mut part = root.create_part("f", size).unwrap();
            let b = basis_for(&mut part, size, 0, mtime).expect("a basis");
            part.discard();
            b.probe.is_some()
        };
        assert!(probed(len, 0));
        assert!(
            !probed(len, i64::MAX),
            "the source changed after the destination"
        );
        assert!(!probed(len + 1, 0), "another length");
        assert!(!probed(len - 1, 0), "another length");
    }

    /// A run cut short while it probes leaves an empty temp file: the rerun probes the
    /// destination again (it does not take the empty temp file for kept bytes).
    #[test]
    fn a_probe_cut_short_leaves_nothing_to_resume_from() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::fs::Root::open(dir.path()).unwrap();
        let len = 2 * SUBTREE_LEN;
        std::fs::write(dir.path().join("f"), data(len as usize, 19)).unwrap();
        let mut part = root.create_part("f", len).unwrap();
        let b = basis_for(&mut part, len, 0, 0).expect("a basis");
        assert!(b.probe.is_some());
        drop(b);
        part.abandon();
        let temp = dir.path().join(".f.hayate-part");
        assert_eq!(std::fs::metadata(&temp).unwrap().len(), 0);
        let mut part = part_when_free(&root, "f", len);
        let b = basis_for(&mut part, len, 0, 0).expect("a basis");
        assert_eq!(b.kind, basis::DEST);
        assert!(b.probe.is_some());
        part.discard();
    }

    /// A temp file left with no resume state (a run that crashed while it compared, the
    /// destination copied into it part of the way) is not resumed from when there is a
    /// destination to compare with; with a state beside it, it is.
    #[test]
    fn a_temp_file_without_a_state_gives_way_to_the_destination() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::fs::Root::open(dir.path()).unwrap();
        let len = 2 * SUBTREE_LEN;
        let old = data(len as usize, 20);
        std::fs::write(dir.path().join("f"), &old).unwrap();
        let temp = dir.path().join(".f.hayate-part");
        std::fs::write(&temp, &old[..SUBTREE_LEN as usize / 2]).unwrap();
        let kind = || {
            let mut part = part_when_free(&root, "f", len);
            let b = basis_for(&mut part, len, 0, i64::MAX).expect("a basis");
            // Its copies into the temp file done, before the temp file is written again.
            let until = Instant::now() + Duration::from_secs(10);
            while b.hash.outstanding() > 0 {
                assert!(Instant::now() < until, "never copied");
                std::thread::sleep(Duration::from_millis(1));
            }
            part.abandon();
            b.kind
        };
        assert_eq!(kind(), basis::DEST);
        std::fs::write(&temp, &old[..SUBTREE_LEN as usize / 2]).unwrap();
        std::fs::write(dir.path().join(".f.hayate-state"), b"hayate-resume-v1").unwrap();
        assert_eq!(kind(), basis::RESUME);
    }

    /// A destination kept as it is, replaced by another file before the commit: the commit
    /// fails and says so, the file there stays, and no temp file is left.
    #[test]
    fn a_kept_destination_replaced_before_the_commit_fails_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::fs::Root::open(dir.path()).unwrap();
        let len = 2 * SUBTREE_LEN as usize;
        let old = data(len, 16);
        let dest = dir.path().join("f");
        std::fs::write(&dest, &old).unwrap();
        let mut part = root.create_part("f", len as u64).unwrap();
        let mut b = basis_for(&mut part, len as u64, 0, 0).expect("a basis");
        b.sums(0, leaf_hashes(&old));
        poll_until(&mut b, 8952);
        assert!(b.unchanged());
        let _ = b.finish(&mut part);
        std::fs::write(dir.path().join("g"), b"another").unwrap();
        std::fs::rename(dir.path().join("g"), &dest).unwrap();
        let e = part.commit(None, None).unwrap_err();
        assert!(
            e.to_string().contains("changed while it was compared"),
            "{e}"
        );
        assert_eq!(std::fs::read(&dest).unwrap(), b"another");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// A destination with a few changed leaves: the basis is copied into the temp file as
    /// it is hashed, the matching leaves are kept, and the file built from them and the
    /// changed bytes verifies from the chaining values the comparison kept.
    #[test]
    fn a_basis_is_copied_as_it_is_hashed_and_its_leaves_verify_the_result() {
        let len = 5 * SUBTREE_LEN as usize + 3000;
        let old = data(len, 1);
        let l = LEAF_LEN as usize;
        let new = leaves_changed(&old, &[2, 300, 301, 1100]);
        let r = rebuild(&old, &new, |_| {});
        assert_eq!(r.held, (len - 4 * l) as u64);
        // Subtrees 0, 1 and 4 in part, the others whole.
        assert_eq!(r.known, 6);
        assert!(!r.kept);
    }

    /// A destination changed and cut short while it is hashed (past the first window of
    /// subtrees, which go to the workers at once): what changed and what is gone do not
    /// match, are sent, and the result is exact.
    #[test]
    fn a_destination_changed_while_it_is_hashed_still_gives_the_exact_file() {
        let m = SUBTREE_LEN as usize;
        let len = (crate::verify::WHOLE_WINDOW + 16) * m;
        let old = data(len, 3);
        let r = rebuild(&old, &old, |dest| {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(dest).unwrap();
            let at = crate::verify::WHOLE_WINDOW * m + m / 2;
            f.write_all_at(&[0x5a; 100], at as u64).unwrap();
            f.set_len((len - 5 * m) as u64).unwrap();
        });
        let held = r.held as usize;
        assert!(!r.kept);
        // The changed leaf and what is gone are not kept; the subtrees hashed before the
        // cut are (the cut subtree goes to the workers only once 12 are taken).
        assert!(held <= len - 5 * m - LEAF_LEN as usize, "{held}");
        assert!(held >= 12 * m, "{held}");
    }

    /// A file of several [`PART_MIN`]s whose leaves come slower than the basis is hashed is
    /// answered in parts as they are compared, the blocks of each arriving before the rest
    /// is compared: it holds exactly what an answer all at once holds (a changed leaf costs
    /// its 4096 bytes, an appended tail its own), and the result verifies from the chaining
    /// values handed over with the parts.
    #[test]
    fn a_big_file_is_answered_in_parts_as_its_leaves_are_compared() {
        let old = data(3 * PART_MIN as usize, 5);
        // Some in every subtree: those astride an answer's end have bytes written before
        // the answer that makes them whole.
        let changed: Vec<usize> = (0..384).map(|k| 7 + k * 16).collect();
        let mut new = leaves_changed(&old, &changed);
        new.extend(data(70_000, 6));
        let r = rebuild_fed(&old, &new, |_, _, _| {}, 512);
        assert!(
            r.parts >= 2,
            "answered in {} parts before the last",
            r.parts
        );
        assert_eq!(r.held, old.len() as u64 - 384 * LEAF_LEN);
        assert!(r.known > 0);
        // The same, the leaves all at once.
        let once = rebuild(&old, &new, |_| {});
        assert_eq!(once.held, r.held);
    }

    /// Leaves of 4096 in blocks of 10 000: a changed leaf costs its 4096 bytes, wherever it
    /// lies against the blocks; the held ranges and the spans cover the file exactly once.
    #[test]
    fn a_changed_leaf_is_a_span_of_the_blocks_it_lies_in() {
        let size = 100_000u64;
        let leaves = size.div_ceil(LEAF_LEN);
        let bs = 10_000;
        // Leaf 3 (12288..16384, inside block 1) and leaf 7 (28672..32768: blocks 2 and 3)
        // changed; the last (partial) leaf too.
        let matched = [(0, 3), (4, 7), (8, leaves - 1)];
        let k = kept(&matched, size, bs);
        assert_eq!(
            k.spans,
            vec![
                BlockSpan {
                    block: 1,
                    from: 2288,
                    to: 6384
                },
                BlockSpan {
                    block: 2,
                    from: 8672,
                    to: 10_000
                },
                BlockSpan {
                    block: 3,
                    from: 0,
                    to: 2768
                },
                BlockSpan {
                    block: 9,
                    from: 8304,
                    to: 10_000
                },
            ]
        );
        assert_eq!(k.have, vec![(0, 1), (4, 9)]);
        let sent: u64 = k.spans.iter().map(|s| s.len() as u64).sum();
        assert_eq!(sent, 4096 * 2 + (size - (leaves - 1) * LEAF_LEN));
        let held: u64 = k.byte_ranges(bs, size).iter().map(|&(a, b)| b - a).sum();
        assert_eq!(held, size - sent);
        // Nothing matched: every block whole, nothing held.
        let k = kept(&[], size, bs);
        assert_eq!(k, Kept::default());
        // Everything matched: all held.
        let k = kept(&[(0, leaves)], size, bs);
        assert_eq!((k.have, k.spans.len()), (vec![(0, 10)], 0));
    }

    /// Two changed leaves in one block make one span from the first to the last changed
    /// byte; the matching leaf between them is sent too.
    #[test]
    fn one_span_per_block() {
        let k = kept(&[(0, 1), (2, 3), (4, 8)], 8 * 4096, 5 * 4096);
        assert_eq!(
            k.spans,
            vec![BlockSpan {
                block: 0,
                from: 4096,
                to: 4 * 4096
            }]
        );
        assert_eq!(k.have, vec![(1, 2)]);
        assert_eq!(
            k.byte_ranges(5 * 4096, 8 * 4096),
            vec![(0, 4096), (4 * 4096, 8 * 4096)]
        );
    }
}
