//! Delta transfers and verified resume, the receiver's half: a file it already holds (the
//! one at the destination, or the temp file an interrupted copy left) is its *basis*; it
//! hashes the basis into [`LEAF_LEN`] leaves on the worker threads while the sender's leaf
//! hashes come in (`Ctrl::Sums`), compares them in order, and accepts the file with the
//! blocks that lie wholly inside matching leaves as `have`. Those the sender never sends:
//! they are copied from the destination into the temp file, or (resume) already there. The
//! whole-file BLAKE3 is verified at the end as for any transfer.
//!
//! A leaf's hash is a chaining value of the file's BLAKE3 tree at its offset, so two leaves
//! at the same index match only if their bytes (and lengths) do: data that moved (an
//! insertion shifting the rest) matches nothing after it. The basis is hashed only up to
//! the offered size, so a destination longer than the source matches up to its end.

use std::collections::VecDeque;
use std::fs::File;

use hayate_proto::control::{basis, flags, LeafHash};
use hayate_proto::{Connection, XferId};

use crate::driver::resume::{ResumeState, MIN_RESUME_SIZE};
use crate::fs::PartFile;
use crate::verify::{LeafHash as Hasher, Sending, LEAF_LEN};

/// Files smaller than this are sent whole over a destination: the round trip of the
/// hashes costs more than the bytes.
pub const DELTA_MIN: u64 = 64 << 10;

/// Most block ranges a receiver names in `Ready` (a message is at most 1 MiB): past this,
/// the shortest are sent instead.
pub const MAX_HAVE_RANGES: usize = 50_000;

/// Leaf hashes a sender keeps queued on the control stream, not yet sent, at most: enough
/// to keep the stream's window full, little enough that a message queued behind them
/// waits for a few packets, not for megabytes.
pub const SUMS_BACKLOG: u64 = 64 << 10;

/// What a receiver compares the sender's leaves with, and how far it got.
pub struct Basis {
    /// [`basis::RESUME`] or [`basis::DEST`].
    pub kind: u8,
    /// The basis, to copy matching blocks from (`DEST`).
    file: File,
    /// Matching blocks are copied from `file` (not: they are where they belong already).
    copy: bool,
    hash: Hasher,
    /// Leaves of the basis that are hashed (it may be shorter than the offer).
    basis_leaves: u64,
    /// Size of the offered file and its leaf count.
    size: u64,
    leaves: u64,
    /// Next leaf to compare; the basis's and the sender's leaves from there, as arrived.
    at: u64,
    mine: VecDeque<LeafHash>,
    theirs: VecDeque<LeafHash>,
    /// Matching leaf ranges, in order.
    matched: Vec<(u64, u64)>,
}

/// The basis for offered file of `size` bytes (with `flags`) being received into `part`,
/// if there is one: the temp file an earlier copy left (checked leaf by leaf, whatever its
/// resume state says), else the file at the destination unless `WHOLE_FILE`.
pub fn basis_for(part: &mut PartFile, size: u64, fl: u32) -> Option<Basis> {
    if size == 0 || fl & flags::NO_RESUME != 0 || part.writes_in_order() {
        return None;
    }
    if let Some(old) = part.in_place_len() {
        // `--inplace`: the destination is the file written; what matches stays where it is.
        if fl & flags::WHOLE_FILE != 0 || old == 0 || size < DELTA_MIN {
            return None;
        }
        let file = part.file().ok()?.try_clone().ok()?;
        let mut b = Basis::start(basis::DEST, file, old.min(size), size).ok()?;
        b.copy = false;
        return Some(b);
    }
    if part.existing_len() > 0 && size >= MIN_RESUME_SIZE {
        let len = part.existing_len().min(size);
        let file = part.file().ok()?.try_clone().ok()?;
        return Basis::start(basis::RESUME, file, len, size).ok();
    }
    if fl & flags::WHOLE_FILE != 0 || size < DELTA_MIN {
        return None;
    }
    let (file, len) = part.open_existing().filter(|(_, len)| *len > 0)?;
    Basis::start(basis::DEST, file, len.min(size), size).ok()
}

impl Basis {
    /// Starts hashing the first `len` bytes of `file` for an offered file of `size` bytes.
    pub fn start(kind: u8, file: File, len: u64, size: u64) -> std::io::Result<Self> {
        let hash = Hasher::start(file.try_clone()?, len);
        Ok(Basis {
            kind,
            copy: kind == basis::DEST,
            file,
            hash,
            basis_leaves: len.div_ceil(LEAF_LEN),
            size,
            leaves: size.div_ceil(LEAF_LEN),
            at: 0,
            mine: VecDeque::new(),
            theirs: VecDeque::new(),
            matched: Vec::new(),
        })
    }

    /// The sender's leaves `first..`, as they came (in order: the connection checks).
    pub fn sums(&mut self, first: u64, leaves: Vec<LeafHash>) {
        debug_assert_eq!(first, self.at + self.theirs.len() as u64);
        self.theirs.extend(leaves);
    }

    /// Compares what both sides have hashed so far; once every leaf is compared, the block
    /// ranges (of `block` bytes) the basis already holds.
    pub fn poll(&mut self, block: u64) -> Option<Vec<(u64, u64)>> {
        while self.at < self.leaves {
            let Some(&theirs) = self.theirs.front() else {
                break;
            };
            let same = if self.at >= self.basis_leaves {
                false
            } else {
                if self.mine.is_empty() {
                    match self.hash.take() {
                        Some(Ok((first, v))) => {
                            debug_assert_eq!(first, self.at);
                            self.mine.extend(v);
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
                self.mine.pop_front() == Some(theirs)
            };
            self.theirs.pop_front();
            if same {
                match self.matched.last_mut() {
                    Some(last) if last.1 == self.at => last.1 += 1,
                    _ => self.matched.push((self.at, self.at + 1)),
                }
            }
            self.at += 1;
        }
        (self.at == self.leaves).then(|| self.have(block))
    }

    /// Blocks wholly inside matching leaves, the fewest short ranges dropped when there
    /// are more than [`MAX_HAVE_RANGES`].
    fn have(&self, block: u64) -> Vec<(u64, u64)> {
        let bytes = self
            .matched
            .iter()
            .map(|&(a, b)| (a * LEAF_LEN, (b * LEAF_LEN).min(self.size)))
            .collect();
        let st = ResumeState {
            size: self.size,
            mtime: 0,
            have: bytes,
        };
        let mut have = st.have_blocks(block);
        if have.len() > MAX_HAVE_RANGES {
            let mut longest: Vec<usize> = (0..have.len()).collect();
            longest.sort_by_key(|&i| std::cmp::Reverse(have[i].1 - have[i].0));
            longest.truncate(MAX_HAVE_RANGES);
            longest.sort_unstable();
            have = longest.into_iter().map(|i| have[i]).collect();
        }
        have
    }

    /// The file to copy matching blocks from, for a `DEST` basis (a `RESUME` basis holds
    /// them already).
    pub fn into_copy_source(self) -> Option<File> {
        self.copy.then_some(self.file)
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
