//! `hayate clean [PATH]`: the partial copies an interrupted transfer left behind
//! (`.NAME.hayate-part`, fully allocated, and `.NAME.hayate-state`), listed with their sizes
//! and, with `--delete`, removed.
//!
//! The walk goes through directory fds (`openat` with `O_NOFOLLOW`, `unlinkat`), so no link
//! beneath PATH is ever followed, and a directory swapped for a link during the walk is not
//! either: only regular files with those names, beneath PATH, are touched.

use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use hayate_io::fs::{PART_SUFFIX, STATE_SUFFIX};
use rustix::fs::{self as rfs, AtFlags, FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use crate::units::fmt_bytes;

#[derive(Args, Debug)]
pub struct CleanArgs {
    /// Directory to look beneath (recursively, never through a link found inside it)
    #[arg(value_name = "PATH", default_value = ".")]
    pub path: PathBuf,
    /// Remove the files listed (and nothing else); a copy still running keeps its own
    #[arg(long)]
    pub delete: bool,
}

/// One leftover file.
struct Leftover {
    path: PathBuf,
    size: u64,
}

/// `.NAME.hayate-part` or `.NAME.hayate-state` with a non-empty NAME.
fn is_leftover(name: &[u8]) -> bool {
    let Some(rest) = name.strip_prefix(b".") else {
        return false;
    };
    [PART_SUFFIX, STATE_SUFFIX].iter().any(|suf| {
        rest.strip_suffix(suf.as_bytes())
            .is_some_and(|stem| !stem.is_empty())
    })
}

/// The temp file a state file belongs to: `.NAME.hayate-state` -> `.NAME.hayate-part`.
fn part_of(name: &[u8]) -> Vec<u8> {
    match name.strip_suffix(STATE_SUFFIX.as_bytes()) {
        Some(stem) => [stem, PART_SUFFIX.as_bytes()].concat(),
        None => name.to_vec(),
    }
}

/// Whether a running copy holds the temp file `part` in `dir` (it keeps an exclusive
/// lock on it while it writes).
fn in_use(dir: &OwnedFd, part: &[u8]) -> bool {
    let Ok(name) = std::ffi::CString::new(part) else {
        return false;
    };
    // NONBLOCK: a FIFO put there meanwhile must not hang us; NOFOLLOW: nor a link.
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    match rfs::openat(dir, name.as_c_str(), flags, Mode::empty()) {
        Ok(fd) => matches!(
            rfs::flock(&fd, FlockOperation::NonBlockingLockShared),
            Err(Errno::WOULDBLOCK)
        ),
        Err(_) => false,
    }
}

struct Walk {
    delete: bool,
    found: Vec<Leftover>,
    busy: Vec<PathBuf>,
    errors: usize,
}

impl Walk {
    fn error(&mut self, path: &Path, e: impl std::fmt::Display) {
        eprintln!("hayate: {}: {e}", path.display());
        self.errors += 1;
    }

    fn dir(&mut self, fd: OwnedFd, shown: &Path) {
        let entries = match rfs::Dir::read_from(&fd) {
            Ok(d) => d,
            Err(e) => return self.error(shown, e),
        };
        let mut names: Vec<Vec<u8>> = Vec::new();
        for e in entries {
            match e {
                Ok(e) => {
                    let n = e.file_name().to_bytes();
                    if n != b"." && n != b".." {
                        names.push(n.to_vec());
                    }
                }
                Err(e) => return self.error(shown, e),
            }
        }
        names.sort();
        for name in names {
            let path = shown.join(OsStr::from_bytes(&name));
            let c = std::ffi::CString::new(name.clone()).expect("no NUL in a file name");
            let st = match rfs::statat(&fd, c.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue,
                Err(e) => {
                    self.error(&path, e);
                    continue;
                }
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => {
                    let flags =
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                    match rfs::openat(&fd, c.as_c_str(), flags, Mode::empty()) {
                        Ok(sub) => self.dir(sub, &path),
                        // Replaced by a link since the stat: not followed.
                        Err(Errno::LOOP | Errno::NOTDIR | Errno::NOENT) => {}
                        Err(e) => self.error(&path, e),
                    }
                }
                FileType::RegularFile if is_leftover(&name) => {
                    if in_use(&fd, &part_of(&name)) {
                        self.busy.push(path);
                        continue;
                    }
                    if self.delete {
                        if let Err(e) = remove(&fd, c.as_c_str()) {
                            self.error(&path, e);
                            continue;
                        }
                    }
                    self.found.push(Leftover {
                        path,
                        size: st.st_size as u64,
                    });
                }
                _ => {}
            }
        }
    }
}

/// Unlinks `name` in `dir` if it is still a regular file.
fn remove(dir: &OwnedFd, name: &CStr) -> rustix::io::Result<()> {
    let st = rfs::statat(dir.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(Errno::PERM);
    }
    rfs::unlinkat(dir, name, AtFlags::empty())
}

pub fn run(a: CleanArgs) -> anyhow::Result<i32> {
    // PATH itself is the user's choice and may be a link to a directory; nothing found
    // beneath it is followed.
    let top = rfs::open(
        &a.path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
    .with_context(|| format!("{}", a.path.display()))?;
    let mut w = Walk {
        delete: a.delete,
        found: Vec::new(),
        busy: Vec::new(),
        errors: 0,
    };
    w.dir(top, &a.path);
    let total: u64 = w.found.iter().map(|l| l.size).sum();
    for l in &w.found {
        println!("{:>10}  {}", fmt_bytes(l.size), l.path.display());
    }
    for b in &w.busy {
        println!(
            "{:>10}  {} (a copy is writing it: left alone)",
            "-",
            b.display()
        );
    }
    let n = w.found.len();
    let files = if n == 1 { "file" } else { "files" };
    if n == 0 {
        println!("no partial copies beneath {}", a.path.display());
    } else if a.delete {
        println!("removed {n} {files}, {}", fmt_bytes(total));
    } else {
        println!(
            "{n} {files}, {}, left by interrupted copies (a rerun resumes them; \
             `hayate clean --delete` removes them)",
            fmt_bytes(total)
        );
    }
    Ok(if w.errors > 0 { 1 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for yes in [".a.hayate-part", ".a.b.hayate-state", "..x.hayate-part"] {
            assert!(is_leftover(yes.as_bytes()), "{yes}");
        }
        for no in [
            ".hayate-part",
            "..hayate-part",
            "a.hayate-part",
            ".a.hayate-part.x",
            ".a.hayate-parts",
            "a",
        ] {
            assert!(!is_leftover(no.as_bytes()), "{no}");
        }
        assert_eq!(part_of(b".a.hayate-state"), b".a.hayate-part");
        assert_eq!(part_of(b".a.hayate-part"), b".a.hayate-part");
    }
}
