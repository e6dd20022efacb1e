//! What an interrupted receive had already written, kept next to its temp file (for `hayate
//! clean` and for people; a rerun checks the temp file itself against the sender's leaf
//! hashes, see `crate::delta`). Stored as byte ranges (not blocks) because the next session may use
//! a different block size. The whole-file BLAKE3 at the end still proves the result.

use hayate_proto::{Connection, XferId};

use crate::fs::PartFile;

/// Files smaller than this are simply sent again: not worth a state file.
pub const MIN_RESUME_SIZE: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeState {
    /// Identity of the source the bytes came from: a changed source starts over.
    pub size: u64,
    pub mtime: i64,
    /// Byte ranges `[start, end)` written and reported received, sorted, disjoint.
    pub have: Vec<(u64, u64)>,
}

const MAGIC: &str = "hayate-resume-v1";

impl ResumeState {
    /// From the block ranges still missing in a receive with `block_size`-byte blocks.
    pub fn from_missing(size: u64, mtime: i64, block_size: u64, missing: &[(u64, u64)]) -> Self {
        let mut have = Vec::new();
        let mut at = 0u64;
        for &(a, b) in missing {
            let (sa, sb) = ((a * block_size).min(size), (b * block_size).min(size));
            if sa > at {
                have.push((at, sa));
            }
            at = at.max(sb);
        }
        if at < size {
            have.push((at, size));
        }
        Self { size, mtime, have }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut s = format!("{MAGIC} size={} mtime={}\n", self.size, self.mtime);
        for (a, b) in &self.have {
            s.push_str(&format!("{a}-{b}\n"));
        }
        s.into_bytes()
    }

    /// None for anything malformed or inconsistent. (A rerun does not trust the state: it
    /// checks the temp file leaf by leaf against the sender's, see `crate::delta`.)
    #[cfg(test)]
    pub fn decode(data: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(data).ok()?;
        let mut lines = text.lines();
        let mut head = lines.next()?.split(' ');
        if head.next()? != MAGIC {
            return None;
        }
        let size = head.next()?.strip_prefix("size=")?.parse().ok()?;
        let mtime = head.next()?.strip_prefix("mtime=")?.parse().ok()?;
        let mut have: Vec<(u64, u64)> = Vec::new();
        for l in lines {
            let (a, b) = l.split_once('-')?;
            let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
            if a >= b || b > size || have.last().is_some_and(|l| l.1 > a) {
                return None;
            }
            have.push((a, b));
        }
        Some(Self { size, mtime, have })
    }
}

/// Saves the state of receive `xfer` into `part`'s state file, unless nothing changed since
/// the last save (`saved` remembers the missing-byte count then).
pub(crate) fn save_progress(
    c: &Connection,
    xfer: XferId,
    part: &mut PartFile,
    size: u64,
    mtime: i64,
    saved: &mut Option<u64>,
) {
    if size < MIN_RESUME_SIZE {
        return;
    }
    let Some(missing) = c.incoming_missing(xfer) else {
        return;
    };
    let key = missing.iter().map(|(a, b)| b - a).sum::<u64>();
    if *saved == Some(key) {
        return;
    }
    let st = ResumeState::from_missing(size, mtime, c.block_size() as u64, &missing);
    if part.save_state(&st.encode()).is_ok() {
        *saved = Some(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        // 10 blocks of 100 bytes, last one 50: size 950; missing 2..4 and 9..10.
        let s = ResumeState::from_missing(950, 7, 100, &[(2, 4), (9, 10)]);
        assert_eq!(s.have, vec![(0, 200), (400, 900)]);
        assert_eq!(ResumeState::decode(&s.encode()), Some(s.clone()));
        // Tail range reaching the end covers the short last block.
        let t = ResumeState::from_missing(950, 7, 100, &[(0, 5)]);
        assert_eq!(t.have, vec![(500, 950)]);
    }

    #[test]
    fn garbage_is_refused() {
        for bad in [
            &b""[..],
            b"nope size=1 mtime=0\n",
            b"hayate-resume-v1 size=10 mtime=0\n5-3\n",
            b"hayate-resume-v1 size=10 mtime=0\n0-11\n",
            b"hayate-resume-v1 size=10 mtime=0\n0-5\n4-6\n",
            b"hayate-resume-v1 size=x mtime=0\n",
            b"\xff\xfe",
        ] {
            assert_eq!(ResumeState::decode(bad), None, "{bad:?}");
        }
    }
}
