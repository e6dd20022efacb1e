//! Files under the served root, opened so that client-supplied paths cannot escape it.
//!
//! Every lookup of a client path goes through `openat2(2)` with `RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS` relative to the root's directory fd: the kernel refuses any
//! resolution (`..`, absolute symlinks, relative symlinks climbing out, `/proc` magic links)
//! that would leave the root, with no check-then-use race. Note that `RESOLVE_BENEATH`
//! rejects absolute symlinks even if they point back inside the root; relative ones that stay
//! inside work.
//!
//! Error messages name the client's relative path, never the server's root path: they are
//! sent to remote clients.
//!
//! [`Root::whole_fs`] is the other mode, for sessions started over ssh (the user has a shell
//! there anyway): paths resolve as in a shell from a working directory, `..`, absolute paths
//! and absolute symlinks included; only `/proc` magic links stay refused.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsStr;
use std::fs::{File, FileTimes, Metadata, Permissions};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use crate::pagebuf::PageBuf;
use rustix::fs::{
    self as rfs, AtFlags, FallocateFlags, FileType, FlockOperation, Mode, OFlags, ResolveFlags,
    Stat, Timespec, Timestamps,
};
use rustix::io::Errno;

/// Suffix of in-progress upload/download files: `.<name>.hayate-part`.
pub const PART_SUFFIX: &str = ".hayate-part";
/// Suffix of the resume state kept next to a temp file: `.<name>.hayate-state`.
pub const STATE_SUFFIX: &str = ".hayate-state";
/// Largest state sidecar [`PartFile::load_state`] reads.
const MAX_STATE: u64 = 16 << 20;

/// Why a path could not be used. Each carries the path as the client named it (never the
/// server's root), sometimes with a detail; the messages are sent to remote clients.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// A confined root: the path is absolute, climbs above it with `..`, or resolves
    /// outside it (a symlink, `EXDEV` from `openat2`).
    #[error("path escapes the served root: {0}")]
    Escapes(String),
    /// Malformed or unusable: empty, a NUL byte, no file name, a reserved `.hayate-part` /
    /// `.hayate-state` name, a component that is no directory, a name too long, a link loop.
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// Nothing there (`ENOENT`), or the parent directory, a home directory or user is missing.
    #[error("no such file or directory: {0}")]
    NotFound(String),
    /// A directory named before a `..` does not exist (`nodir` of `nodir/../x`).
    #[error("{0}: no such directory")]
    NoSuchDir(String),
    /// Something other than the regular file needed (a device, FIFO, directory where a file
    /// is written), or the file changed under the open.
    #[error("not a regular file: {0}")]
    NotAFile(String),
    /// A file to be sent is a directory (a client asked for one without `-r`).
    #[error("is a directory: {0}")]
    IsADirectory(String),
    /// `EACCES`/`EPERM`, or a read-only file system.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The temp file is locked (`flock`) by another open [`PartFile`], in this process or
    /// another, or by one let go whose queued writes are not all in yet: the server tries
    /// again for a while.
    #[error("{0}: another transfer is writing this file right now")]
    Busy(String),
    /// A FIFO destination that nobody has open for reading (yet): [`Root::create_part`]
    /// does not wait for one; its caller may try again.
    #[error("{0}: nothing reads from this FIFO")]
    NoReader(String),
    /// The cause is in the message only (see `KeyFileWriteError::Io`).
    #[error("{0}: {1}")]
    Io(String, io::Error),
}

/// What an [`Entry`] is, from its `lstat` file type (links are not followed).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link; its target is in [`Entry::target`].
    Symlink,
    /// A device, FIFO or socket: listed, never copied.
    Other,
}

/// One file system entry as `lstat` sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    /// Relative to the listed path, components joined with `/`; `""` for the path itself.
    pub path: String,
    /// File, directory, link or other.
    pub kind: EntryKind,
    /// Length of a regular file; 0 for everything else.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Modification time, seconds since the epoch (negative before it); what `-p` keeps.
    pub mtime: i64,
    /// Nanoseconds within `mtime`'s second (0..1e9); not carried on the wire.
    pub mtime_nsec: u32,
    /// A symlink's target, verbatim; empty for everything else.
    pub target: String,
}

/// Where client paths resolve. Confined ([`Root::open`]): the server's `--root`, an `O_PATH`
/// directory fd all client paths are resolved beneath. Whole-filesystem
/// ([`Root::whole_fs`]): the working directory paths start from, as in a shell.
#[derive(Debug)]
pub struct Root {
    dir: OwnedFd,
    confined: bool,
    /// `~` and `~user` at the start of a path mean home directories (the far side of an ssh
    /// copy, as scp's remote paths); elsewhere `~` is an ordinary name.
    tilde: bool,
}

impl Root {
    /// Opens `dir` (the operator's own path, so errors may name it).
    pub fn open(dir: &Path) -> Result<Self, FsError> {
        Ok(Self {
            dir: open_dir(dir)?,
            confined: true,
            tilde: false,
        })
    }

    /// The whole file system, relative paths starting at `cwd` (the ssh user's home, the
    /// client's working directory): paths behave like scp's. The user can reach all of this
    /// with a shell anyway, so nothing is confined except `/proc` magic links.
    pub fn whole_fs(cwd: &Path) -> Result<Self, FsError> {
        // Holding the directory (not its name) keeps relative paths meaning the same place
        // even if it is renamed; openat2 without BENEATH resolves `..`, absolute paths and
        // absolute symlinks from it as ordinary resolution does.
        Ok(Self {
            dir: open_dir(cwd)?,
            confined: false,
            tilde: false,
        })
    }

    /// Paths starting with `~` or `~user` (then `/` or the end) start in that home directory,
    /// as a remote path given to scp does: the far side of an ssh copy, where no shell
    /// expanded them. Only for [`whole_fs`](Self::whole_fs) roots.
    pub fn expand_tilde(mut self) -> Self {
        self.tilde = !self.confined;
        self
    }

    /// `rel` with a leading `~` or `~user` replaced by that home directory (when enabled).
    fn expand<'a>(&self, rel: &'a str) -> Result<std::borrow::Cow<'a, str>, FsError> {
        use std::borrow::Cow;
        let Some(rest) = rel.strip_prefix('~').filter(|_| self.tilde) else {
            return Ok(Cow::Borrowed(rel));
        };
        let (user, tail) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let home = home_dir((!user.is_empty()).then_some(user)).ok_or_else(|| {
            if user.is_empty() {
                FsError::NotFound(format!("{rel}: no home directory"))
            } else {
                FsError::NotFound(format!("{rel}: no such user {user}"))
            }
        })?;
        Ok(Cow::Owned(format!("{}{tail}", home.trim_end_matches('/'))))
    }

    /// Opens the regular file `rel` (relative to the root) for reading.
    pub fn open_read(&self, rel: &str) -> Result<(File, Metadata), FsError> {
        let expanded = self.expand(rel)?;
        let rel = expanded.as_ref();
        let (abs, comps) = self.parse(rel, false)?;
        let path = path_str(abs, &comps);
        // Look at the target through O_PATH first so that opening a FIFO or device (which
        // may block or have side effects) never happens; then open it for real and check it
        // is still the same inode.
        let probe = self.at(&path, OFlags::PATH, rel)?;
        let st = rfs::fstat(&probe).map_err(|e| errno_error(e, rel))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Directory => return Err(FsError::IsADirectory(rel.to_string())),
            _ => return Err(FsError::NotAFile(rel.to_string())),
        }
        let fd = self.at(&path, OFlags::RDONLY | OFlags::NOCTTY, rel)?;
        let file = File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| FsError::Io(rel.to_string(), e))?;
        use std::os::unix::fs::MetadataExt;
        if !meta.is_file() || meta.dev() != st.st_dev || meta.ino() != st.st_ino {
            return Err(FsError::NotAFile(rel.to_string()));
        }
        Ok((file, meta))
    }

    /// Prepares the upload destination `rel`, whose parent directory must exist (as with
    /// scp: a typo in it is an error, not a new tree). A regular file (or nothing) there is
    /// written as the temp file `.<name>.hayate-part` next to it (created mode 0600, sized to
    /// `size`, kept for resume), renamed over it by [`PartFile::commit`]; a symlink is
    /// followed (beneath the root when confined) and its target written so; a device or FIFO
    /// is written in place, in order, never replaced. [`FsError::Busy`] if another open
    /// `PartFile` holds the temp file.
    pub fn create_part(&self, rel: &str, size: u64) -> Result<PartFile, FsError> {
        self.create_part_with(rel, size, false)
    }

    /// [`create_part`](Self::create_part), but an existing regular file there is written in
    /// place (`--inplace`): no temp file; only what differs is written. Anything else there
    /// (nothing, a device) is treated as `create_part` treats it.
    pub fn create_part_inplace(&self, rel: &str, size: u64) -> Result<PartFile, FsError> {
        self.create_part_with(rel, size, true)
    }

    /// [`create_part`](Self::create_part) (`in_place` false) or
    /// [`create_part_inplace`](Self::create_part_inplace).
    fn create_part_with(&self, rel: &str, size: u64, in_place: bool) -> Result<PartFile, FsError> {
        let expanded = self.expand(rel)?;
        let rel = expanded.as_ref();
        let (abs, parents, name) = self.parse_named(rel)?;
        let dir_path = path_str(abs, &parents);
        let dir = self.dir_at(abs, &parents, None).map_err(|e| match e {
            FsError::NotFound(_) => FsError::NotFound(format!("{dir_path} (parent directory)")),
            e => e,
        })?;
        let lookup = Lookup {
            base: self.dir.as_fd(),
            wait_for_reader: false,
            resolve: self.resolve_flags(),
            dir_path: Some(dir_path.clone()),
        };
        PartFile::create(&lookup, dir, name, rel, size, in_place)
    }

    /// (device, inode) of what `rel` leads to now, as [`open_read`](Self::open_read) would
    /// open it.
    pub fn identity(&self, rel: &str) -> Result<(u64, u64), FsError> {
        let expanded = self.expand(rel)?;
        let rel = expanded.as_ref();
        let (abs, comps) = self.parse(rel, false)?;
        let fd = self.at(&path_str(abs, &comps), OFlags::PATH, rel)?;
        let st = rfs::fstat(&fd).map_err(|e| errno_error(e, rel))?;
        Ok((st.st_dev, st.st_ino))
    }

    /// Another handle on the same root (the same directory, not its name).
    pub fn try_clone(&self) -> io::Result<Root> {
        Ok(Root {
            dir: self.dir.try_clone()?,
            confined: self.confined,
            tilde: self.tilde,
        })
    }

    /// lstat of `rel` (a symlink is reported as a symlink, with its target). `path` is "".
    /// As in a shell, a trailing `/` (or `/.`) follows a final symlink (beneath the root).
    pub fn stat(&self, rel: &str) -> Result<Entry, FsError> {
        let expanded = self.expand(rel)?;
        let rel = expanded.as_ref();
        let (abs, comps) = self.parse(rel, true)?;
        let fd = self.at(&path_str(abs, &comps), lstat_flags(rel), rel)?;
        let st = rfs::fstat(&fd).map_err(|e| errno_error(e, rel))?;
        let target = link_target(&st, &fd, "", rel)?;
        Ok(entry(&st, String::new(), target))
    }

    /// `rel` itself first (path ""), then, if it is a directory and `recursive`, everything
    /// beneath it, depth-first, parents before children (names sorted), paths relative to
    /// `rel` joined with '/'. Never follows symlinks (they are listed as Symlink with their
    /// target). Stops with an error after `max` entries. Unreadable subdirectories are an
    /// error naming them. `rel` itself is looked at as by [`stat`](Self::stat).
    pub fn list(&self, rel: &str, recursive: bool, max: usize) -> Result<Vec<Entry>, FsError> {
        let expanded = self.expand(rel)?;
        let rel = expanded.as_ref();
        let (abs, comps) = self.parse(rel, true)?;
        let top = self.at(&path_str(abs, &comps), lstat_flags(rel), rel)?;
        let st = rfs::fstat(&top).map_err(|e| errno_error(e, rel))?;
        let target = link_target(&st, &top, "", rel)?;
        let mut out = Vec::new();
        let too_many = || {
            FsError::Io(
                rel.to_string(),
                io::Error::other(format!("more than {max} entries")),
            )
        };
        if max == 0 {
            return Err(too_many());
        }
        out.push(entry(&st, String::new(), target));
        if !recursive || out[0].kind != EntryKind::Dir {
            return Ok(out);
        }
        let shown = |sub: &str| -> String {
            match (rel.trim_end_matches('/'), sub) {
                (r, "") => r.to_string(),
                ("", s) => s.to_string(),
                (r, s) => format!("{r}/{s}"),
            }
        };
        let dir = rfs::openat(
            &top,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| errno_error(e, rel))?;
        // Explicit stack of sorted, already-stat'ed entries per directory: one fd open at a
        // time whatever the depth. Subdirectories are reopened from `top` with
        // RESOLVE_NO_SYMLINKS, so a directory swapped for a symlink meanwhile is refused.
        let first = read_entries(&dir, "", &shown(""), max)?;
        drop(dir);
        let mut stack = vec![first.into_iter()];
        while let Some(frame) = stack.last_mut() {
            let Some(e) = frame.next() else {
                stack.pop();
                continue;
            };
            if out.len() >= max {
                return Err(too_many());
            }
            let is_dir = e.kind == EntryKind::Dir;
            let sub = e.path.clone();
            out.push(e);
            if is_dir {
                let fd = openat2_retry(
                    &top,
                    &sub,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
                    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
                    &shown(&sub),
                )?;
                let children = read_entries(&fd, &sub, &shown(&sub), max)?;
                stack.push(children.into_iter());
            }
        }
        Ok(out)
    }

    /// The entries of one directory whose names match the last component of `pattern`
    /// ([`crate::glob`]), sorted, each as `lstat` sees it with `path` the pattern's directory
    /// part (as given, `~` unexpanded) joined with the name: what to ask for next. The
    /// directory is resolved as [`list`](Self::list) resolves a path (beneath the root when
    /// confined); no shell is involved. An empty result is no error here.
    pub fn glob(&self, pattern: &str, max: usize) -> Result<Vec<Entry>, FsError> {
        let (dir_part, name_pat) = crate::glob::split(pattern);
        let dir_rel = if dir_part.is_empty() { "." } else { dir_part };
        let expanded = self.expand(dir_rel)?;
        let rel = expanded.as_ref();
        let (abs, comps) = self.parse(rel, true)?;
        // The directory part ends with `/`: a symlink to a directory is followed, as a shell does.
        let top = self.at(
            &path_str(abs, &comps),
            OFlags::PATH | OFlags::DIRECTORY,
            rel,
        )?;
        let dir = rfs::openat(
            &top,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| errno_error(e, rel))?;
        let entries = read_entries(&dir, "", rel, max)?;
        Ok(entries
            .into_iter()
            .filter(|e| crate::glob::matches(name_pat, &e.path))
            .map(|mut e| {
                e.path = format!("{dir_part}{}", e.path);
                e
            })
            .collect())
    }

    /// mkdir of `rel` (fine if it is a directory already), whose parent must exist; `mode`
    /// (masked 0o777) applied when given (also if it already existed). Error if it exists and
    /// is not a directory.
    pub fn mkdirs(&self, rel: &str, mode: Option<u32>) -> Result<(), FsError> {
        let expanded = self.expand(rel)?;
        let rel = expanded.as_ref();
        let (abs, comps) = self.parse(rel, !self.confined)?;
        let dir = self.dir_at(abs, &comps, Some(Mode::from_raw_mode(0o777)))?;
        if let Some(mode) = mode {
            chmod_fd(&dir, mode & 0o777).map_err(|e| errno_error(e, rel))?;
        }
        Ok(())
    }

    /// Creates symlink `rel` -> `target` (target stored verbatim, never resolved); replaces an
    /// existing symlink or regular file at `rel` atomically (created under a temp name, then
    /// renamed), refuses to replace a directory. The parent directory must exist.
    /// A target pointing out of a confined root is allowed: it is only a link, and opens
    /// through it are refused like any other escape.
    pub fn symlink(&self, rel: &str, target: &str) -> Result<(), FsError> {
        let expanded = self.expand(rel)?;
        let rel = expanded.as_ref();
        if target.is_empty() || target.contains('\0') {
            return Err(FsError::InvalidPath(format!(
                "{rel}: invalid symbolic link target"
            )));
        }
        let (abs, parents, name) = self.parse_named(rel)?;
        reserved(name, rel)?;
        let dir = self.dir_at(abs, &parents, None)?;
        let is_dir = || FsError::InvalidPath(format!("{rel}: is a directory"));
        match rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                return Err(is_dir())
            }
            Ok(_) => {}
            Err(Errno::NOENT) => match rfs::symlinkat(target, &dir, name) {
                // Raced with a creator: fall through to replacing it.
                Err(Errno::EXIST) => {}
                r => return r.map_err(|e| errno_error(e, rel)),
            },
            Err(e) => return Err(errno_error(e, rel)),
        }
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmp = loop {
            // Short temp name: `.<name>...` could exceed NAME_MAX for long names.
            let tmp = format!(
                ".hayate-link.{}.{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            );
            match rfs::symlinkat(target, &dir, tmp.as_str()) {
                Ok(()) => break tmp,
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(errno_error(e, rel)),
            }
        };
        rfs::renameat(&dir, tmp.as_str(), &dir, name).map_err(|e| {
            let _ = rfs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
            match e {
                Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST => is_dir(),
                e => errno_error(e, rel),
            }
        })
    }

    /// Sets mode (masked 0o777) and/or mtime (seconds, nanoseconds) of `rel` without
    /// following a final symlink (for a symlink only the mtime is set; mode is ignored).
    pub fn set_meta(
        &self,
        rel: &str,
        mode: Option<u32>,
        mtime: Option<(i64, u32)>,
    ) -> Result<(), FsError> {
        let expanded = self.expand(rel)?;
        let rel = expanded.as_ref();
        let (abs, comps) = self.parse(rel, !self.confined)?;
        let fd = self.at(&path_str(abs, &comps), OFlags::PATH | OFlags::NOFOLLOW, rel)?;
        let st = rfs::fstat(&fd).map_err(|e| errno_error(e, rel))?;
        let is_link = FileType::from_raw_mode(st.st_mode) == FileType::Symlink;
        if let (Some(mode), false) = (mode, is_link) {
            chmod_fd(&fd, mode & 0o777).map_err(|e| errno_error(e, rel))?;
        }
        if let Some((sec, nsec)) = mtime {
            let times = Timestamps {
                last_access: Timespec {
                    tv_sec: 0,
                    tv_nsec: rfs::UTIME_OMIT,
                },
                last_modification: Timespec {
                    tv_sec: sec,
                    tv_nsec: nsec.into(),
                },
            };
            // On the O_PATH fd itself: a symlink's own time, never its target's.
            rfs::utimensat(
                &fd,
                "",
                &times,
                AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| errno_error(e, rel))?;
        }
        Ok(())
    }

    /// Removes the entry `rel` beneath the directory `top` (`cp -r --delete`): a file, link
    /// or other entry when `dir` is false (a link itself, never what it leads to), an empty
    /// directory when `dir` is true (anything else there is an error: what was listed
    /// changed). `top` is resolved as [`list`](Self::list) resolves `top/` (a final link to a
    /// directory followed; beneath the root when confined); `rel` must be plain names beneath
    /// it (no `..`, `.`, empty component or leading `/`) and no link on the way to its last
    /// component is followed (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` from `top`): nothing
    /// outside `top` is ever touched. Temp and state files (`.hayate-part`, `.hayate-state`)
    /// are refused. An entry already gone is no error.
    pub fn remove(&self, top: &str, rel: &str, dir: bool) -> Result<(), FsError> {
        let shown = match top.trim_end_matches('/') {
            "" => rel.to_string(),
            t => format!("{t}/{rel}"),
        };
        if rel.is_empty()
            || rel.starts_with('/')
            || rel.contains('\0')
            || rel.split('/').any(|c| matches!(c, "" | "." | ".."))
        {
            return Err(FsError::InvalidPath(format!(
                "{}: not a path beneath the directory it is removed from",
                shown.replace('\0', "\\0")
            )));
        }
        let expanded = self.expand(top)?;
        let top_rel = expanded.as_ref();
        let (abs, comps) = self.parse(top_rel, true)?;
        let top_fd = self.at(
            &path_str(abs, &comps),
            OFlags::PATH | OFlags::DIRECTORY,
            top_rel,
        )?;
        let (parents, name) = match rel.rsplit_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, rel),
        };
        reserved(name, &shown)?;
        let parent = match parents {
            None => top_fd,
            Some(p) => openat2_retry(
                &top_fd,
                p,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW,
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
                &shown,
            )
            .map_err(|e| match e {
                // A link on the way (ELOOP under RESOLVE_NO_SYMLINKS): not followed.
                FsError::InvalidPath(m) if m.ends_with("too many symbolic links") => {
                    FsError::InvalidPath(format!(
                        "{shown}: a symbolic link on the way, not followed"
                    ))
                }
                e => e,
            })?,
        };
        let flags = if dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        match rfs::unlinkat(&parent, name, flags) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(Errno::ISDIR) => Err(FsError::InvalidPath(format!("{shown}: is a directory now"))),
            Err(Errno::NOTDIR) => Err(FsError::InvalidPath(format!(
                "{shown}: no longer a directory"
            ))),
            Err(Errno::NOTEMPTY | Errno::EXIST) => Err(FsError::InvalidPath(format!(
                "{shown}: directory not empty"
            ))),
            Err(e) => Err(errno_error(e, &shown)),
        }
    }

    fn resolve_flags(&self) -> ResolveFlags {
        if self.confined {
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
        } else {
            ResolveFlags::NO_MAGICLINKS
        }
    }

    /// openat2 of a path from [`path_str`] with this root's resolve flags.
    fn at(&self, path: &str, flags: OFlags, shown: &str) -> Result<OwnedFd, FsError> {
        openat2_retry(&self.dir, path, flags, self.resolve_flags(), shown)
    }

    /// Splits a client path: (absolute, components). Confined: as [`components`], except that
    /// `allow_top` accepts "" and "." as the root itself. Whole-fs: `..` and absolute paths
    /// are fine, "" and "." are the working directory.
    ///
    /// A `..` is resolved by the kernel (beneath the root when confined: a path that climbs
    /// out, even through a symlink, is refused as escaping), after the directory before it
    /// is found to exist: `nodir/../x` is "nodir: no such directory", not a missing `x`.
    fn parse<'a>(&self, rel: &'a str, allow_top: bool) -> Result<(bool, Vec<&'a str>), FsError> {
        let (abs, comps) = if !self.confined {
            split(rel, true)?
        } else {
            match split(rel, false) {
                Ok((false, c)) if c.is_empty() && allow_top => return Ok((false, c)),
                _ => (false, components(rel)?),
            }
        };
        for (i, c) in comps.iter().enumerate() {
            if *c == ".." && i > 0 && comps[i - 1] != ".." {
                let before = path_str(abs, &comps[..i]);
                match self.at(&before, OFlags::PATH | OFlags::DIRECTORY, &before) {
                    Err(FsError::NotFound(_)) => return Err(FsError::NoSuchDir(before)),
                    Err(e) => return Err(e),
                    Ok(_) => {}
                }
            }
        }
        Ok((abs, comps))
    }

    /// For creating an entry: (absolute, parent components, final name).
    fn parse_named<'a>(&self, rel: &'a str) -> Result<(bool, Vec<&'a str>, &'a str), FsError> {
        // Said before looking at what comes before the `..`.
        if rel.rsplit('/').find(|c| !c.is_empty() && *c != ".") == Some("..") {
            return Err(FsError::InvalidPath(format!("{rel}: names no file")));
        }
        let (abs, mut comps) = self.parse(rel, false)?;
        match comps.pop() {
            Some(name) if name != ".." => Ok((abs, comps, name)),
            _ => Err(FsError::InvalidPath(format!("{rel}: names no file"))),
        }
    }

    /// `O_PATH` fd of the directory `comps`. With `create`, its last component is made (with
    /// that mode) if missing, never its parents: a missing parent is an error, as with scp
    /// and `mkdir` without `-p`. Errors name the client's prefix that failed.
    fn dir_at(&self, abs: bool, comps: &[&str], create: Option<Mode>) -> Result<OwnedFd, FsError> {
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
        let full = path_str(abs, comps);
        let (mode, (last, parents)) = match (self.at(&full, dir_flags, &full), create) {
            (Err(FsError::NotFound(_)), Some(mode)) if !comps.is_empty() => {
                (mode, comps.split_last().expect("not empty"))
            }
            (r, _) => return r,
        };
        let parent_path = path_str(abs, parents);
        let parent = self.at(&parent_path, dir_flags, &parent_path)?;
        // Made inside the already-resolved parent; mkdirat never follows a symlink in its
        // last component, so this cannot land outside the root.
        match rfs::mkdirat(&parent, *last, mode) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(errno_error(e, &full)),
        }
        self.at(&full, dir_flags, &full)
    }
}

fn open_dir(dir: &Path) -> Result<OwnedFd, FsError> {
    let shown = dir.display().to_string();
    rfs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::NOTDIR => FsError::InvalidPath(format!("{shown}: not a directory")),
        e => errno_error(e, &shown),
    })
}

/// `O_PATH`, plus `O_NOFOLLOW` (the final symlink itself, never what it points to) unless
/// `rel` ends in `/` or `/.`.
fn lstat_flags(rel: &str) -> OFlags {
    if rel.ends_with('/') || rel.ends_with("/.") {
        OFlags::PATH
    } else {
        OFlags::PATH | OFlags::NOFOLLOW
    }
}

/// The string handed to openat2 for split components ("." for none).
fn path_str(abs: bool, comps: &[&str]) -> String {
    let joined = comps.join("/");
    match (abs, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

fn reserved(name: &str, shown: &str) -> Result<(), FsError> {
    for suffix in [PART_SUFFIX, STATE_SUFFIX] {
        if name.ends_with(suffix) {
            return Err(FsError::InvalidPath(format!(
                "{shown}: names ending in {suffix} are reserved"
            )));
        }
    }
    Ok(())
}

fn entry(st: &Stat, path: String, target: String) -> Entry {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    Entry {
        path,
        size: if kind == EntryKind::File {
            st.st_size as u64
        } else {
            0
        },
        kind,
        mode: st.st_mode & 0o7777,
        mtime: st.st_mtime,
        mtime_nsec: st.st_mtime_nsec as u32,
        target,
    }
}

/// The target of `name` in `dir` if `st` says it is a symlink ("" with an `O_PATH` fd of the
/// link itself), else "".
fn link_target(st: &Stat, dir: &OwnedFd, name: &str, shown: &str) -> Result<String, FsError> {
    if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
        return Ok(String::new());
    }
    let target = rfs::readlinkat(dir, name, Vec::new()).map_err(|e| errno_error(e, shown))?;
    target.into_string().map_err(|_| {
        FsError::InvalidPath(format!("{shown}: symbolic link target is not valid UTF-8"))
    })
}

/// The entries of the open directory `dir` (at `sub` relative to the listing), lstat'ed and
/// sorted by name; at most `max`.
fn read_entries(dir: &OwnedFd, sub: &str, shown: &str, max: usize) -> Result<Vec<Entry>, FsError> {
    let mut names = Vec::new();
    for item in rfs::Dir::read_from(dir).map_err(|e| errno_error(e, shown))? {
        let item = item.map_err(|e| errno_error(e, shown))?;
        let name = item.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let Ok(name) = std::str::from_utf8(name) else {
            return Err(FsError::InvalidPath(format!(
                "{shown}: contains a name that is not valid UTF-8 ({})",
                String::from_utf8_lossy(name)
            )));
        };
        if names.len() >= max {
            return Err(FsError::Io(
                shown.to_string(),
                io::Error::other(format!("more than {max} entries")),
            ));
        }
        names.push(name.to_string());
    }
    names.sort_unstable();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let path = if sub.is_empty() {
            name.clone()
        } else {
            format!("{sub}/{name}")
        };
        let child_shown = if shown.is_empty() {
            name.clone()
        } else {
            format!("{shown}/{name}")
        };
        let st = match rfs::statat(dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Deleted since readdir: it is simply not there any more.
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(errno_error(e, &child_shown)),
        };
        let target = link_target(&st, dir, &name, &child_shown)?;
        out.push(entry(&st, path, target));
    }
    Ok(out)
}

/// chmod of the inode behind an `O_PATH` fd (fchmod refuses those): fchmodat2 with
/// AT_EMPTY_PATH (Linux 6.6), else through the fd's /proc magic link, as glibc does.
fn chmod_fd(fd: &OwnedFd, mode: u32) -> Result<(), Errno> {
    const SYS_FCHMODAT2: libc::c_long = 452;
    // SAFETY: plain syscall on a valid fd and a NUL-terminated empty path.
    let r = unsafe {
        libc::syscall(
            SYS_FCHMODAT2,
            fd.as_raw_fd(),
            c"".as_ptr(),
            mode as libc::c_uint,
            libc::AT_EMPTY_PATH,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = Errno::from_io_error(&io::Error::last_os_error()).unwrap_or(Errno::NOSYS);
    if !matches!(e, Errno::NOSYS | Errno::INVAL | Errno::PERM) {
        return Err(e);
    }
    rfs::chmod(
        format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
        Mode::from_raw_mode(mode),
    )
}

/// The process umask, read once (without changing it when /proc tells).
pub fn umask() -> u32 {
    static UMASK: OnceLock<u32> = OnceLock::new();
    *UMASK.get_or_init(|| {
        let from_proc = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("Umask:"))?;
                u32::from_str_radix(line["Umask:".len()..].trim(), 8).ok()
            });
        from_proc.unwrap_or_else(|| {
            // SAFETY: umask cannot fail; the old value is restored at once.
            unsafe {
                let old = libc::umask(0o022);
                libc::umask(old);
                old as u32
            }
        })
    })
}

/// A destination being written: the temp file `.<name>.hayate-part`, renamed to `<name>` by
/// [`commit`](Self::commit) only.
///
/// Writes that continue one another are gathered and written [`PartFile::RUN`] bytes at a
/// time: a receiver at 1 Gbit/s otherwise makes 80 000 `pwrite`s a second, each costing more
/// than its copy (1430-byte writes into tmpfs ran at 430-940 MB/s here, 256 KiB ones at
/// 1.2-2.2 GB/s). What is gathered reaches the file before anything reads it or claims it:
/// [`hash`](Self::hash), [`save_state`](Self::save_state), [`commit`](Self::commit),
/// [`flush`](Self::flush), and on drop. A gathered write that fails fails every later call.
#[derive(Debug)]
pub struct PartFile {
    file: Arc<File>,
    /// Gathered bytes, for the file at `run_at`.
    run: Vec<u8>,
    run_at: u64,
    /// Size the file was created with (bounds the gathering buffer for small files).
    size: u64,
    /// Writes gathered runs in the background (the temp file; `None` for a device or FIFO,
    /// written in order as blocks come).
    behind: Option<crate::writeback::Queue>,
    dir: OwnedFd,
    part_name: String,
    state_name: String,
    /// Held while the resume state is written (on the writer thread, see
    /// [`save_state`](Self::save_state)) and while it is removed; true once it was removed
    /// for good (committed or discarded): a save still queued then writes nothing.
    state_gone: Arc<Mutex<bool>>,
    final_name: String,
    /// Path as shown in errors (client-relative on the server).
    shown: String,
    /// Length of the temp file before `create` resized it (0 when new).
    existing_len: u64,
    /// Space for a large file, being reserved in the background.
    space: Option<Reserve>,
    /// The destination is a device or FIFO: written in place, in order; `file` is then an
    /// unnamed temp file holding blocks that arrived ahead of the ones still missing.
    stream: Option<Box<Stream>>,
    /// The symlink the destination was reached through, if it was.
    link: Option<Entry>,
    /// `--inplace`: `file` is the destination itself (it was a regular file of this
    /// length), written where it is: no temp file, no rename, no resume state.
    inplace: Option<u64>,
    /// The file at the destination already holds what was offered (see
    /// [`keep_destination`](Self::keep_destination)): the commit keeps it, if it is still
    /// the file that was compared.
    keep: Option<FileIdentity>,
}

/// What tells a file apart from itself after a change: device and inode, size, and the
/// modification and status-change times (every write moves them; no user can set the
/// latter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileIdentity {
    /// The identity of the open file `f`.
    pub fn of(f: &File) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = f.metadata()?;
        Ok(FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// The file's size then.
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// Whether this user may set a file's mode and times (`meta` is its): it owns the file,
/// or this is root.
pub fn ours(meta: &Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid();
    me.is_root() || meta.uid() == me.as_raw()
}

/// Reserves a file's space (`fallocate`) in the background, a chunk at a time, so a disk
/// too small for the file fails the transfer as it starts, not when it fills. On tmpfs that
/// also takes the page allocation out of the receiver's write path (1 GiB: 0.2-0.3 s of
/// `fallocate` here; writes into fresh pages ran at 0.5-2 GB/s, into reserved ones at 3.5).
/// A file system without `fallocate` is written as before.
#[derive(Debug)]
struct Reserve {
    job: Arc<ReserveJob>,
}

#[derive(Debug)]
struct ReserveJob {
    /// The file was closed: reserve no more of it.
    stop: AtomicBool,
    /// The errno that ended it short of space (ENOSPC, EDQUOT), 0 otherwise.
    short: AtomicI32,
}

impl Reserve {
    /// Bytes per `fallocate`: tmpfs holds the inode lock through one call, and the receiver's
    /// writes wait for it meanwhile (4 MiB: 1 ms, or 8 where the guest's pages are cold).
    const CHUNK: u64 = 4 << 20;
    /// Files this small are reserved at once, before the transfer starts (the receiver's
    /// loop waits for it: 1 MiB of cold tmpfs pages takes about 2 ms here).
    const AT_ONCE: u64 = 1 << 20;

    /// Reserves `size` bytes of `file`: at once for a small file (running short of space
    /// then is the caller's error), else on the one background worker, files in the order
    /// they came.
    fn start(file: &Arc<File>, size: u64) -> io::Result<Option<Reserve>> {
        if size == 0 {
            return Ok(None);
        }
        if size <= Self::AT_ONCE {
            return match rfs::fallocate(file, FallocateFlags::empty(), 0, size) {
                Err(e) if short_of_space(e) => Err(e.into()),
                _ => Ok(None),
            };
        }
        // The queue holds the file weakly: a file let go while it waits there is closed (and
        // its lock, which keeps another transfer of it out, let go) as soon as its writes are
        // in, not once the worker gets to it behind other files.
        type Work = (Weak<File>, u64, Arc<ReserveJob>);
        static WORKER: OnceLock<Option<mpsc::Sender<Work>>> = OnceLock::new();
        let worker = WORKER.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Work>();
            std::thread::Builder::new()
                .name("hayate-reserve".into())
                .spawn(move || {
                    // Behind the transfer itself: on a host short of CPU, the sender and
                    // receiver (and the link they share) come first.
                    // SAFETY: setpriority on this thread's own id; no memory involved.
                    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as _, 10) };
                    for (file, size, job) in rx {
                        Self::run(file, size, &job);
                    }
                })
                .ok()
                .map(|_| tx)
        });
        let Some(worker) = worker else {
            return Ok(None);
        };
        let job = Arc::new(ReserveJob {
            stop: AtomicBool::new(false),
            short: AtomicI32::new(0),
        });
        let work = (Arc::downgrade(file), size, job.clone());
        match worker.send(work) {
            Ok(()) => Ok(Some(Reserve { job })),
            Err(_) => Ok(None),
        }
    }

    fn run(file: Weak<File>, size: u64, job: &ReserveJob) {
        let mut at = 0;
        while at < size && !job.stop.load(Ordering::Relaxed) {
            let len = Self::CHUNK.min(size - at);
            let Some(file) = file.upgrade() else {
                return;
            };
            match rfs::fallocate(&*file, FallocateFlags::empty(), at, len) {
                Ok(()) => at += len,
                Err(e) => {
                    // Closed first: a file discarded for this error frees its space at once.
                    drop(file);
                    if short_of_space(e) {
                        job.short.store(e.raw_os_error(), Ordering::Relaxed);
                    }
                    return;
                }
            }
        }
    }

    /// The file system is short of space for the file.
    fn check(&self) -> io::Result<()> {
        match self.job.short.load(Ordering::Relaxed) {
            0 => Ok(()),
            code => Err(io::Error::from_raw_os_error(code)),
        }
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        self.job.stop.store(true, Ordering::Relaxed);
    }
}

fn short_of_space(e: Errno) -> bool {
    e == Errno::NOSPC || e == Errno::DQUOT
}

impl PartFile {
    /// Contiguous bytes gathered before they are written.
    pub const RUN: usize = 256 * 1024;

    fn create(
        lookup: &Lookup<'_>,
        dir: OwnedFd,
        name: &str,
        shown: &str,
        size: u64,
        inplace: bool,
    ) -> Result<Self, FsError> {
        reserved(name, shown)?;
        let (found, link) = find_dest(lookup, dir, name, shown)?;
        let (dir, name) = match found {
            Found::Replace(dir, name) => (dir, name),
            Found::Special(out, dir, name) => {
                return Self::in_order(out, dir, name, shown, size, link);
            }
        };
        let name = name.as_str();
        reserved(name, shown)?;
        let dir = if inplace {
            match Self::in_place_of(dir, name, shown, size)? {
                Ok(mut p) => {
                    p.link = link;
                    return Ok(p);
                }
                Err(dir) => dir,
            }
        } else {
            dir
        };
        let part_name = format!(".{name}{PART_SUFFIX}");
        // NOFOLLOW: a planted symlink named like our temp file must not redirect the write.
        let fd = rfs::openat2(
            &dir,
            part_name.as_str(),
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| match e {
            Errno::LOOP => {
                FsError::InvalidPath(format!("{shown}: temp file {part_name} is a symbolic link"))
            }
            e => errno_error(e, shown),
        })?;
        let file = File::from(fd);
        // Before anything changes the file: a second writer (another session resuming the
        // same destination) must not resize or write under the first one.
        match rfs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => return Err(FsError::Busy(shown.to_string())),
            Err(e) => return Err(errno_error(e, shown)),
        }
        let meta = file
            .metadata()
            .map_err(|e| FsError::Io(shown.to_string(), e))?;
        if !meta.is_file() {
            return Err(FsError::NotAFile(format!(
                "{shown} (temp file {part_name})"
            )));
        }
        let io_err = |e: io::Error| match e.raw_os_error() {
            Some(code) => errno_error(Errno::from_raw_os_error(code), shown),
            None => FsError::Io(shown.to_string(), e),
        };
        // A kept temp file may have been created by an older umask; keep it private.
        file.set_permissions(Permissions::from_mode(0o600))
            .map_err(io_err)?;
        let existing_len = meta.len();
        let file = Arc::new(file);
        let sized = file
            .set_len(size)
            .and_then(|()| Reserve::start(&file, size));
        let space = match sized {
            Ok(space) => space,
            Err(e) => {
                // Refused (no space, say): a temp file this made holds nothing to resume;
                // left, it would keep the space it got.
                if existing_len == 0 {
                    let _ = rfs::unlinkat(&dir, part_name.as_str(), AtFlags::empty());
                } else {
                    let _ = file.set_len(existing_len);
                }
                return Err(io_err(e));
            }
        };
        Ok(Self {
            behind: Some(crate::writeback::Queue::new(file.clone())),
            file,
            run: Vec::new(),
            run_at: 0,
            size,
            dir,
            part_name,
            state_name: format!(".{name}{STATE_SUFFIX}"),
            state_gone: Arc::default(),
            final_name: name.to_string(),
            shown: shown.to_string(),
            existing_len,
            space,
            stream: None,
            link,
            inplace: None,
            keep: None,
        })
    }

    /// The regular file `name` in `dir`, opened to be written in place (`--inplace`) and
    /// sized to `size`; `dir` back if there is no regular file there.
    fn in_place_of(
        dir: OwnedFd,
        name: &str,
        shown: &str,
        size: u64,
    ) -> Result<Result<Self, OwnedFd>, FsError> {
        let fd = match rfs::openat(
            &dir,
            name,
            OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::LOOP | Errno::NXIO | Errno::ISDIR) => return Ok(Err(dir)),
            Err(e) => return Err(errno_error(e, shown)),
        };
        let file = File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| FsError::Io(shown.to_string(), e))?;
        if !meta.is_file() {
            return Ok(Err(dir));
        }
        match rfs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => return Err(FsError::Busy(shown.to_string())),
            Err(e) => return Err(errno_error(e, shown)),
        }
        let old = meta.len();
        let file = Arc::new(file);
        let space = file
            .set_len(size)
            .and_then(|()| Reserve::start(&file, size))
            .map_err(|e| FsError::Io(shown.to_string(), e))?;
        Ok(Ok(Self {
            behind: Some(crate::writeback::Queue::new(file.clone())),
            file,
            run: Vec::new(),
            run_at: 0,
            size,
            dir,
            part_name: name.to_string(),
            state_name: String::new(),
            state_gone: Arc::default(),
            final_name: name.to_string(),
            shown: shown.to_string(),
            existing_len: 0,
            space,
            stream: None,
            link: None,
            inplace: Some(old),
            keep: None,
        }))
    }

    /// The length the destination had before it was opened to be written in place
    /// (`--inplace`), or `None` if it is not.
    pub fn in_place_len(&self) -> Option<u64> {
        self.inplace
    }

    /// A destination written in place, in order (a device, a FIFO, standard output): blocks
    /// that come early wait in an unnamed temp file.
    fn in_order(
        out: File,
        dir: OwnedFd,
        name: String,
        shown: &str,
        size: u64,
        link: Option<Entry>,
    ) -> Result<Self, FsError> {
        let file = spill_file().map_err(|e| {
            FsError::Io(
                shown.to_string(),
                io::Error::new(e.kind(), format!("no temporary file for reordering: {e}")),
            )
        })?;
        // A pipe's default 64 KiB makes its writer and reader take turns 16 times per MiB;
        // 1 MiB (the unprivileged maximum) lets each side run longer. Best effort.
        if rfs::fstat(&out).is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Fifo) {
            // SAFETY: fcntl on a descriptor we own; failure is harmless.
            unsafe { libc::fcntl(out.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
        }
        Ok(Self {
            file: Arc::new(file),
            run: Vec::new(),
            run_at: 0,
            size,
            behind: None,
            dir,
            part_name: String::new(),
            state_name: String::new(),
            state_gone: Arc::default(),
            final_name: name,
            shown: shown.to_string(),
            existing_len: 0,
            space: None,
            stream: Some(Box::new(Stream::new(out))),
            link,
            inplace: None,
            keep: None,
        })
    }

    /// Client side: a download to `-`, written to standard output as it comes in order,
    /// as a device or FIFO destination is (whatever stdout is: a pipe, a terminal, a file it
    /// was redirected to, written at its offset). What is verified is the hash of exactly
    /// the bytes written; there is no resume.
    pub fn stdout(size: u64) -> Result<Self, FsError> {
        let shown = "- (standard output)";
        let out = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| FsError::Io(shown.to_string(), e))?;
        // Only there to fill the field: nothing is looked up in it for a stream.
        let dir = rfs::open(
            "/",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| errno_error(e, "/"))?;
        Self::in_order(File::from(out), dir, String::new(), shown, size, None)
    }

    /// The temp file's length before this `create_part` resized it: 0 for a fresh one,
    /// so the driver can tell a resumable part from a new one.
    pub fn existing_len(&self) -> u64 {
        self.existing_len
    }

    /// Whether this is a device or FIFO written in place (no temp file, no resume).
    pub fn in_place(&self) -> bool {
        self.stream.is_some()
    }

    /// What is at the destination (None if nothing), for --no-clobber/--update: the file a
    /// symlink leads to, or the dangling symlink itself.
    pub fn final_exists(&self) -> Option<Entry> {
        let st = match rfs::statat(
            &self.dir,
            self.final_name.as_str(),
            AtFlags::SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            Err(_) => return self.link.clone(),
        };
        let target = link_target(&st, &self.dir, &self.final_name, &self.shown).unwrap_or_default();
        Some(entry(&st, String::new(), target))
    }

    /// Atomically replaces the resume state `.<name>.hayate-state` next to the temp file
    /// (contents are the driver's business), on the writer thread once every write queued
    /// before it is in the file: the state never claims bytes the file does not hold, and
    /// the protocol loop does not wait for a disk that is behind (it saved every half
    /// second, and each save waited for up to 16 MiB of queued writes). The state is a hint
    /// (a resume compares every byte it keeps), so a save that fails there is let go.
    pub fn save_state(&mut self, data: &[u8]) -> io::Result<()> {
        if self.stream.is_some() || self.inplace.is_some() || self.keep.is_some() {
            return Ok(());
        }
        self.push_run()?;
        let save = StateSave {
            dir: self.dir.try_clone()?,
            name: self.state_name.clone(),
            shown: self.shown.clone(),
            data: data.to_vec(),
            gone: self.state_gone.clone(),
        };
        match &self.behind {
            Some(q) => q.then(move || {
                let _ = save.run();
            }),
            None => save.run(),
        }
    }

    /// Removes the resume state for good (see `state_gone`).
    fn remove_state(&self) -> io::Result<()> {
        let mut gone = self.state_gone.lock().expect("state lock");
        *gone = true;
        let _ = rfs::unlinkat(
            &self.dir,
            format!("{}.tmp", self.state_name).as_str(),
            AtFlags::empty(),
        );
        match rfs::unlinkat(&self.dir, self.state_name.as_str(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(io::Error::new(
                io::Error::from(e).kind(),
                format!("{}: cannot remove transfer state: {e}", self.shown),
            )),
        }
    }

    /// Whatever is at the destination's name, opened for reading (not through a link).
    fn open_final(&self) -> io::Result<OwnedFd> {
        Ok(rfs::openat(
            &self.dir,
            self.final_name.as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// The regular file now at the destination, opened for reading (a delta transfer's
    /// basis), with its length; `None` if there is none (or a device, FIFO or link).
    pub fn open_existing(&self) -> Option<(File, u64)> {
        if self.stream.is_some() {
            return None;
        }
        let fd = self.open_final().ok()?;
        let st = rfs::fstat(&fd).ok()?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return None;
        }
        Some((File::from(fd), st.st_size as u64))
    }

    /// Whether a resume state is saved next to the temp file (see
    /// [`save_state`](Self::save_state)): a transfer into it was accepted and ran a while.
    pub fn has_state(&self) -> bool {
        self.stream.is_none()
            && self.inplace.is_none()
            && rfs::statat(
                &self.dir,
                self.state_name.as_str(),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
    }

    /// The resume state saved by [`save_state`](Self::save_state), if present and a regular
    /// file of at most 16 MiB.
    pub fn load_state(&self) -> Option<Vec<u8>> {
        if self.stream.is_some() || self.inplace.is_some() {
            return None;
        }
        // A save still queued (see `save_state`) is read back.
        if let Some(q) = &self.behind {
            q.settle();
        }
        let fd = rfs::openat(
            &self.dir,
            self.state_name.as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let st = rfs::fstat(&fd).ok()?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
            || st.st_size as u64 > MAX_STATE
        {
            return None;
        }
        let mut data = Vec::new();
        File::from(fd)
            .take(MAX_STATE + 1)
            .read_to_end(&mut data)
            .ok()?;
        (data.len() as u64 <= MAX_STATE).then_some(data)
    }

    /// The temp file, with every gathered write in it.
    pub fn file(&mut self) -> io::Result<&File> {
        self.flush()?;
        Ok(&self.file)
    }

    /// Whether the destination is a device or FIFO, written in order as blocks come: its
    /// [`hash`](Self::hash) is then of what went out, and [`file`](Self::file) holds only
    /// blocks that came early.
    pub fn writes_in_order(&self) -> bool {
        self.stream.is_some()
    }

    /// The temp file's name inside the destination directory.
    pub fn part_name(&self) -> &str {
        &self.part_name
    }

    /// Writes all of `data` at `offset`: gathered when it continues the previous write,
    /// else after what was gathered (pwrite, restarting on short writes).
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check()?;
        if let Some(s) = &mut self.stream {
            return s.put(&self.file, offset, data);
        }
        let end = self.run_at + self.run.len() as u64;
        if self.run.is_empty() || offset != end || self.run.len() + data.len() > Self::RUN {
            self.push_run()?;
            if data.len() >= Self::RUN {
                return self.queue(offset, data.to_vec());
            }
            self.run_at = offset;
        }
        if self.run.capacity() == 0 {
            let cap = self.size.clamp(data.len() as u64, Self::RUN as u64) as usize;
            self.run = match &self.behind {
                Some(q) => q.buffer(cap),
                None => Vec::with_capacity(cap),
            };
        }
        self.run.extend_from_slice(data);
        if self.run.len() == Self::RUN {
            self.push_run()?;
        }
        Ok(())
    }

    /// Hands what was gathered to the writer, without waiting for it to be written.
    fn push_run(&mut self) -> io::Result<()> {
        self.check()?;
        if self.run.is_empty() {
            return Ok(());
        }
        let run = std::mem::take(&mut self.run);
        self.queue(self.run_at, run)
    }

    fn queue(&mut self, at: u64, buf: Vec<u8>) -> io::Result<()> {
        match &self.behind {
            Some(q) => q.write(at, buf),
            None => self.file.write_all_at(&buf, at),
        }
    }

    /// Writes what was gathered and waits until every write reached the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.push_run()?;
        if let Some(s) = &mut self.stream {
            s.drain(&self.file)?;
        }
        match &self.behind {
            Some(q) => q.drain(),
            None => Ok(()),
        }
    }

    /// Has `f` see every write of this file from now on, once it is in the file (see
    /// [`Queue::observe`](crate::writeback::Queue::observe)); nothing for a destination
    /// written in order.
    pub fn observe_writes(&mut self, f: crate::writeback::Observer) {
        if let Some(q) = &mut self.behind {
            q.observe(f);
        }
    }

    /// Runs `f` (on the writer thread) once everything written so far is in the file, or
    /// at once when nothing is written behind. The protocol loop does not wait.
    pub fn after_writes(&mut self, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
        self.push_run()?;
        match &self.behind {
            Some(q) => q.then(f),
            None => {
                f();
                Ok(())
            }
        }
    }

    /// The error of a write that failed earlier, again.
    fn check(&self) -> io::Result<()> {
        if let Some(r) = &self.space {
            r.check()?;
        }
        if let Some(s) = &self.stream {
            s.out.check()?;
        }
        match &self.behind {
            Some(q) => q.check(),
            None => Ok(()),
        }
    }

    /// Moves writes on without waiting; whether every byte written so far is in the
    /// destination (so [`hash`](Self::hash) and [`commit`](Self::commit) will not wait).
    pub fn pump(&mut self) -> io::Result<bool> {
        self.check()?;
        if let Some(s) = &mut self.stream {
            return s.pump(&self.file);
        }
        let Some(q) = &self.behind else {
            return Ok(true);
        };
        if !self.run.is_empty() && q.has_room(self.run.len()) {
            self.push_run()?;
        }
        Ok(self.run.is_empty() && self.behind.as_ref().is_some_and(|q| q.idle()))
    }

    /// File bytes that can be written now before [`has_room`](Self::has_room) says no, once
    /// the writer is behind (half its queue taken): the receive window a session advertises
    /// (see `BlockSink::room`). `None` while it keeps up: a window of the queue's size
    /// would cap a long fat path's flight (16 MiB in a 250 ms round trip is 537 Mbit/s),
    /// and a writer that keeps up drains what arrives as it comes.
    pub fn room(&self) -> Option<u64> {
        let (room, reserve) = match (&self.stream, &self.behind) {
            (Some(s), _) => (s.out.room(), Stream::GATHER + Stream::CHUNK),
            (None, Some(q)) => (q.room(), Self::RUN),
            (None, None) => return None,
        };
        (room < crate::writeback::MAX_QUEUED / 2).then(|| room.saturating_sub(reserve) as u64)
    }

    /// Whether a block can be written now without waiting for the writer (storage
    /// backpressure: see `BlockSink::ready`).
    pub fn has_room(&self) -> bool {
        match (&self.stream, &self.behind) {
            (Some(s), _) => s.out.has_room(Stream::GATHER + Stream::CHUNK),
            (None, Some(q)) => q.has_room(Self::RUN),
            (None, None) => true,
        }
    }

    /// BLAKE3 of the temp file's current contents (multi-threaded).
    pub fn hash(&mut self) -> io::Result<blake3::Hash> {
        self.flush()?;
        match &self.stream {
            // What went out to the device, in order: nothing else is left to read back.
            // (`flush` drained the writer: every write is in, and hashed.)
            Some(s) => s
                .complete(self.size)
                .map(|()| s.hasher.lock().expect("stream hash").finalize()),
            None => hash_file(&self.file),
        }
    }

    /// Sets permissions (`mode & 0o777`: setuid/setgid/sticky bits from a remote peer are
    /// never applied) and mtime, then renames the temp file to the final name. Call only after
    /// the hash was verified. Does not fsync (like cp/scp); call `file().sync_all()` first if
    /// durability across power loss matters.
    /// A device or FIFO is only checked to have had every byte: its mode and times are the
    /// system's, not the source's.
    pub fn commit(mut self, mode: Option<u32>, mtime: Option<SystemTime>) -> io::Result<()> {
        self.flush()?;
        if let Some(s) = &self.stream {
            return s.complete(self.size);
        }
        if let Some(id) = self.keep {
            return self.commit_kept(id, mode, mtime);
        }
        if let Some(mode) = mode {
            self.file
                .set_permissions(Permissions::from_mode(mode & 0o777))?;
        }
        if let Some(mtime) = mtime {
            self.file.set_times(FileTimes::new().set_modified(mtime))?;
        }
        if self.inplace.is_some() {
            return Ok(());
        }
        rfs::renameat(
            &self.dir,
            self.part_name.as_str(),
            &self.dir,
            self.final_name.as_str(),
        )
        .map_err(|e| {
            io::Error::new(
                io::Error::from(e).kind(),
                format!("{}: cannot rename temp file into place: {e}", self.shown),
            )
        })?;
        self.remove_state()
    }

    /// Empties the temp file and stops reserving its space (see `Reserve`), while the file
    /// at the destination is read where it is (a delta's probe): nothing is in the temp file
    /// until the basis is copied into it, and an interrupted run leaves nothing a rerun
    /// would resume from. Whoever then copies into it sizes it again.
    pub fn empty_for_probe(&mut self) -> io::Result<()> {
        self.space = None;
        self.file.set_len(0)
    }

    /// The file at the destination holds what was offered already, every byte (`ident`: as
    /// it was when it was compared): nothing is written into the temp file, which gives back
    /// what was reserved for it, and the commit keeps the destination, its inode, links and
    /// attributes, instead of renaming a copy over it. No resume state is kept.
    pub fn keep_destination(&mut self, ident: FileIdentity) {
        if self.stream.is_some() || self.inplace.is_some() {
            return;
        }
        self.keep = Some(ident);
        self.space = None;
        let _ = self.file.set_len(0);
        let _ = self.remove_state();
    }

    /// After the verification: if the destination (a regular file of at most `max` bytes,
    /// this user's, or this is root) already holds exactly the bytes verified (`hash`, the
    /// BLAKE3 of the whole file), keep it (see [`keep_destination`](Self::keep_destination))
    /// instead of renaming the copy over it. Reads at most `max` bytes, on the caller's thread.
    pub fn keep_if_same(&mut self, hash: &[u8; 32], max: u64) {
        if self.keep.is_some() || self.stream.is_some() || self.inplace.is_some() {
            return;
        }
        if self.size > max {
            return;
        }
        let Ok(dest) = self.open_final().map(File::from) else {
            return;
        };
        let (Ok(meta), Ok(id)) = (dest.metadata(), FileIdentity::of(&dest)) else {
            return;
        };
        if !meta.is_file() || meta.len() != self.size || !ours(&meta) {
            return;
        }
        let mut buf = vec![0; self.size as usize];
        if dest.read_exact_at(&mut buf, 0).is_err() || blake3::hash(&buf).as_bytes() != hash {
            return;
        }
        if FileIdentity::of(&dest).is_ok_and(|now| now == id) {
            self.keep_destination(id);
        }
    }

    /// The commit keeps the destination as it is (see
    /// [`keep_destination`](Self::keep_destination)).
    pub fn keeps_destination(&self) -> bool {
        self.keep.is_some()
    }

    /// The commit of a destination kept (see [`keep_destination`](Self::keep_destination)):
    /// an error, and nothing changed but the temp file removed, if it is no longer the file
    /// that was compared.
    fn commit_kept(
        self,
        id: FileIdentity,
        mode: Option<u32>,
        mtime: Option<SystemTime>,
    ) -> io::Result<()> {
        let _ = rfs::unlinkat(&self.dir, self.part_name.as_str(), AtFlags::empty());
        let dest = self.open_final().map(File::from);
        let same = dest
            .as_ref()
            .ok()
            .and_then(|f| FileIdentity::of(f).ok())
            .is_some_and(|now| now == id);
        let dest = match dest {
            Ok(f) if same => f,
            _ => {
                return Err(io::Error::other(format!(
                    "{}: the file there changed while it was compared with the source; \
                     nothing was written: run the copy again",
                    self.shown
                )))
            }
        };
        if let Some(mode) = mode {
            let now = dest.metadata()?.permissions().mode() & 0o7777;
            if now != mode & 0o777 {
                dest.set_permissions(Permissions::from_mode(mode & 0o777))?;
            }
        }
        if let Some(mtime) = mtime {
            dest.set_times(FileTimes::new().set_modified(mtime))?;
        }
        Ok(())
    }

    /// Closes the temp file and leaves it (and its resume state) in place for a later resume.
    /// Does not wait for writes still queued: see `Drop`.
    pub fn abandon(self) {}

    /// Drops a temp file no data of this run went into: removed if this run made it (it
    /// holds nothing, and may hold reserved space), kept if it holds an earlier run's bytes.
    pub fn drop_unstarted(self) {
        if self.existing_len == 0 {
            self.discard();
        } else {
            self.abandon();
        }
    }

    /// Removes the temp file and its resume state (after a failed verification).
    pub fn discard(mut self) {
        // Writes still queued land in the unlinked file (its handle is the writer's), never
        // in a new file of the same name.
        self.run.clear();
        if self.stream.is_some() || self.inplace.is_some() {
            // Written in place: what is there stays (it was the destination).
            return;
        }
        let _ = rfs::unlinkat(&self.dir, self.part_name.as_str(), AtFlags::empty());
        let _ = self.remove_state();
        // Nothing to wait for (see `Drop`): what is still queued goes into the unlinked file.
        self.behind = None;
    }
}

/// A resume state to write (see [`PartFile::save_state`]).
struct StateSave {
    dir: OwnedFd,
    name: String,
    shown: String,
    data: Vec<u8>,
    gone: Arc<Mutex<bool>>,
}

impl StateSave {
    fn run(self) -> io::Result<()> {
        let gone = self.gone.lock().expect("state lock");
        if *gone {
            return Ok(());
        }
        let tmp = format!("{}.tmp", self.name);
        let ctx = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("{}: cannot save transfer state: {e}", self.shown),
            )
        };
        // A stale or planted entry under the tmp name is removed, never written through.
        let _ = rfs::unlinkat(&self.dir, tmp.as_str(), AtFlags::empty());
        let fd = rfs::openat(
            &self.dir,
            tmp.as_str(),
            OFlags::WRONLY
                | OFlags::CREATE
                | OFlags::EXCL
                | OFlags::NOFOLLOW
                | OFlags::NOCTTY
                | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| ctx(e.into()))?;
        File::from(fd).write_all_at(&self.data, 0).map_err(ctx)?;
        rfs::renameat(&self.dir, tmp.as_str(), &self.dir, self.name.as_str())
            .map_err(|e| ctx(e.into()))?;
        drop(gone);
        Ok(())
    }
}

impl Drop for PartFile {
    /// What was gathered is queued for writing (a resumed transfer finds it), unless the
    /// file was discarded, and nothing waits for it: the protocol loop lets a file go (a
    /// cancelled or failed transfer, to a disk that is behind, or a FIFO nobody reads)
    /// without waiting for its writes. The temp file stays locked until every job queued
    /// for it has run (its writes, then its resume state saves), so another transfer of the
    /// same file finds it busy until then, never half-written; a process exits only after
    /// [`writeback::settle_all`](crate::writeback::settle_all). An error here has nobody
    /// left to tell, and a resume state is saved behind the writes it covers.
    fn drop(&mut self) {
        if let Some(s) = &mut self.stream {
            s.push_now();
            return;
        }
        let run = std::mem::take(&mut self.run);
        match &self.behind {
            Some(q) => {
                if !run.is_empty() {
                    let _ = q.write_now(self.run_at, run);
                }
                let lock = self.file.clone();
                let _ = q.then(move || drop(lock));
            }
            None if !run.is_empty() => {
                let _ = self.file.write_all_at(&run, self.run_at);
            }
            None => {}
        }
    }
}

/// Copies the byte ranges `[a, b)` of `from` to the same offsets of `to`: in the kernel
/// (`copy_file_range`, which shares extents where the file system can), else through a
/// buffer (across file systems, or where the call is missing).
pub fn copy_ranges(from: &File, to: &File, ranges: &[(u64, u64)]) -> io::Result<()> {
    let mut kernel = true;
    let mut buf = Vec::new();
    for &(a, b) in ranges {
        let mut at = a;
        while at < b {
            let len = (b - at).min(1 << 30) as usize;
            if kernel {
                let (mut src, mut dst) = (at, at);
                match rfs::copy_file_range(from, Some(&mut src), to, Some(&mut dst), len) {
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("the file ends before byte {b}"),
                        ))
                    }
                    Ok(n) => {
                        at += n as u64;
                        continue;
                    }
                    Err(Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                        kernel = false;
                    }
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            let n = (b - at).min(1 << 20) as usize;
            buf.resize(n, 0);
            from.read_exact_at(&mut buf, at)?;
            to.write_all_at(&buf, at)?;
            at += n as u64;
        }
    }
    Ok(())
}

/// Client side: the destination of a download at the user's own `dest` (not sandboxed; the
/// parent directory must exist), treated as [`Root::create_part`] treats an upload's.
pub fn create_local_part(dest: &Path, size: u64) -> Result<PartFile, FsError> {
    create_local(dest, size, false)
}

/// [`create_local_part`], writing an existing regular file in place (`--inplace`; see
/// [`Root::create_part_inplace`]).
pub fn create_local_part_inplace(dest: &Path, size: u64) -> Result<PartFile, FsError> {
    create_local(dest, size, true)
}

fn create_local(dest: &Path, size: u64, inplace: bool) -> Result<PartFile, FsError> {
    let shown = dest.display().to_string();
    let name = dest
        .file_name()
        .and_then(OsStr::to_str)
        .filter(|n| *n != "." && *n != ".." && !dest.as_os_str().as_encoded_bytes().ends_with(b"/"))
        .ok_or_else(|| FsError::InvalidPath(format!("{shown}: no usable file name")))?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = rfs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::NOENT | Errno::NOTDIR => {
            FsError::NotFound(format!("{} (parent directory)", parent.display()))
        }
        e => errno_error(e, &parent.display().to_string()),
    })?;
    // The user's own paths: symlinks (also /proc's, as /dev/stdout is) are followed as any
    // program opening the name would.
    let lookup = Lookup {
        base: rfs::CWD,
        // The client's own download: its one session has nothing else to serve meanwhile.
        wait_for_reader: true,
        resolve: ResolveFlags::empty(),
        dir_path: parent.to_str().map(str::to_string),
    };
    PartFile::create(&lookup, dir, name, &shown, size, inplace)
}

/// How to open the directories symlink targets name: from `base` with `resolve` (a confined
/// root's `RESOLVE_BENEATH` keeps a followed link beneath it).
struct Lookup<'a> {
    base: BorrowedFd<'a>,
    /// A FIFO without a reader is waited for (up to [`FIFO_READER_WAIT`]); else
    /// [`FsError::NoReader`] at once.
    wait_for_reader: bool,
    resolve: ResolveFlags,
    /// The destination's directory as a path from `base` (None: not valid UTF-8, and then
    /// no relative link target can be followed).
    dir_path: Option<String>,
}

/// What a destination name leads to.
enum Found {
    /// Nothing yet, or a regular file: the directory and name the temp file is renamed to.
    Replace(OwnedFd, String),
    /// A device or FIFO, open for writing (blocking); its directory and name.
    Special(File, OwnedFd, String),
}

/// Symlinks followed at most, as the kernel's own limit.
const MAX_LINKS: usize = 40;

/// Follows `name` in `dir` through symlinks (dangling ones too: their target is what gets
/// created, as open(2) with O_CREAT does); returns what it leads to and the first link.
fn find_dest(
    l: &Lookup<'_>,
    mut dir: OwnedFd,
    name: &str,
    shown: &str,
) -> Result<(Found, Option<Entry>), FsError> {
    let mut name = name.to_string();
    let mut dir_path = l.dir_path.clone();
    let mut link = None;
    for _ in 0..MAX_LINKS {
        let st = match rfs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok((Found::Replace(dir, name), link)),
            Err(e) => return Err(errno_error(e, shown)),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => return Ok((Found::Replace(dir, name), link)),
            FileType::Directory => return Err(FsError::NotAFile(shown.to_string())),
            FileType::Socket => {
                return Err(FsError::NotAFile(format!(
                    "{shown} (a socket: nothing can be written to it)"
                )))
            }
            FileType::Symlink => {
                let target = link_target(&st, &dir, &name, shown)?;
                if link.is_none() {
                    link = Some(entry(&st, String::new(), target.clone()));
                }
                let (tdir, tname) = match target.rsplit_once('/') {
                    Some(("", n)) => (Some("/"), n),
                    Some((d, n)) => (Some(d), n),
                    None => (None, target.as_str()),
                };
                if matches!(tname, "" | "." | "..") {
                    // Ends in a directory: nothing to write a file to.
                    return Err(FsError::NotAFile(shown.to_string()));
                }
                if let Some(d) = tdir {
                    let next = if d.starts_with('/') {
                        d.to_string()
                    } else {
                        let here = dir_path.as_deref().ok_or_else(|| {
                            FsError::InvalidPath(format!(
                                "{shown}: directory name is not valid UTF-8"
                            ))
                        })?;
                        format!("{here}/{d}")
                    };
                    dir = openat2_retry(
                        l.base,
                        next.as_str(),
                        OFlags::PATH | OFlags::DIRECTORY,
                        l.resolve,
                        shown,
                    )?;
                    dir_path = Some(next);
                }
                name = tname.to_string();
            }
            _ => {
                let out = open_special(&dir, &name, shown, l.wait_for_reader)?;
                return Ok((Found::Special(out, dir, name), link));
            }
        }
    }
    Err(FsError::InvalidPath(format!(
        "{shown}: too many symbolic links"
    )))
}

/// How long a FIFO destination may have no reader before the copy gives up on it (a client
/// waits this long for its own download; a server tries again on later turns).
pub const FIFO_READER_WAIT: Duration = Duration::from_secs(5);

/// Opens the device or FIFO `name` for writing, as it is (no O_TRUNC, never created). A FIFO
/// without a reader is waited for briefly if `wait`, else refused as [`FsError::NoReader`].
/// Writes then block as they would for any writer.
fn open_special(dir: &OwnedFd, name: &str, shown: &str, wait: bool) -> Result<File, FsError> {
    let until = Instant::now() + FIFO_READER_WAIT;
    let fd = loop {
        match rfs::openat(
            dir,
            name,
            OFlags::WRONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => break fd,
            Err(Errno::NXIO) if !wait => return Err(FsError::NoReader(shown.to_string())),
            Err(Errno::NXIO) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(Errno::NXIO) => {
                return Err(FsError::Io(
                    shown.to_string(),
                    io::Error::other(format!(
                        "nothing reads from this FIFO (waited {} s)",
                        FIFO_READER_WAIT.as_secs()
                    )),
                ))
            }
            Err(e) => return Err(errno_error(e, shown)),
        }
    };
    let st = rfs::fstat(&fd).map_err(|e| errno_error(e, shown))?;
    if matches!(
        FileType::from_raw_mode(st.st_mode),
        FileType::RegularFile | FileType::Directory | FileType::Symlink
    ) {
        // Swapped for a file since it was looked at: that one would be written in place.
        return Err(FsError::Io(
            shown.to_string(),
            io::Error::other("changed while being opened"),
        ));
    }
    let flags = rfs::fcntl_getfl(&fd).map_err(|e| errno_error(e, shown))?;
    rfs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK).map_err(|e| errno_error(e, shown))?;
    Ok(File::from(fd))
}

/// An unnamed temp file (nothing to clean up, whatever happens): `O_TMPFILE` in the temp
/// directory, or a name removed at once where that is not supported.
/// An unnamed temp file in `$TMPDIR` (`O_TMPFILE`; where that is not supported, a named
/// one removed at once), mode 0600.
pub fn spill_file() -> io::Result<File> {
    let tmp = std::env::temp_dir();
    if let Ok(fd) = rfs::open(
        &tmp,
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    ) {
        return Ok(File::from(fd));
    }
    static SEQ: AtomicU64 = AtomicU64::new(0);
    loop {
        let path = tmp.join(format!(
            ".hayate-spill.{}.{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match rfs::open(
            &path,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => {
                let _ = rfs::unlink(&path);
                return Ok(File::from(fd));
            }
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// A device or FIFO being written: the bytes go out strictly in order, as they would from
/// scp, and are hashed as they go, so what is verified is exactly what was written. Blocks
/// that arrive ahead of a missing one wait in an unnamed temp file (its space freed as they
/// go out), so only what is in flight is held, not the whole file. All of it (writes,
/// hashing, the temp file's writes and reads) runs on the stream's writer thread; the
/// protocol loop only keeps the account of what is held where.
#[derive(Debug)]
struct Stream {
    /// The destination, written in order by a writer thread.
    out: crate::writeback::Queue,
    /// In-order bytes not yet handed to `out`.
    gathered: Vec<u8>,
    /// Bytes that went out (handed to `out`) so far.
    next: u64,
    /// Ranges `[start, end)` held in the temp file, disjoint, none adjacent.
    held: BTreeMap<u64, u64>,
    /// What the writer thread wrote so far, hashed there behind each write.
    hasher: Arc<Mutex<blake3::Hasher>>,
}

impl Stream {
    /// Bytes moved from the temp file to the destination at a time.
    const CHUNK: usize = 1 << 20;
    /// In-order bytes gathered before they are handed to the writer.
    const GATHER: usize = 64 << 10;

    fn new(out: File) -> Self {
        let hasher = Arc::new(Mutex::new(blake3::Hasher::new()));
        let mut queue = crate::writeback::Queue::appending(Arc::new(out));
        let h = hasher.clone();
        queue.observe(Arc::new(Mutex::new(move |_at: u64, data: &[u8]| {
            h.lock().expect("stream hash").update(data);
        })));
        Stream {
            out: queue,
            gathered: Vec::new(),
            next: 0,
            held: BTreeMap::new(),
            hasher,
        }
    }

    fn put(&mut self, spill: &Arc<File>, offset: u64, data: &[u8]) -> io::Result<()> {
        let end = offset + data.len() as u64;
        if end <= self.next {
            return Ok(());
        }
        if offset > self.next {
            // Into the holding file on the writer thread, in order with what goes out: the
            // moves out of it are queued behind.
            let mut buf = self.out.buffer(data.len());
            buf.extend_from_slice(data);
            self.out.write_into(spill, offset, buf)?;
            let (mut a, mut b) = (offset, end);
            let touching: Vec<u64> = self
                .held
                .range(..=b)
                .rev()
                .take_while(|(_, &e)| e >= a)
                .map(|(&s, _)| s)
                .collect();
            for s in touching {
                let e = self.held.remove(&s).expect("listed");
                a = a.min(s);
                b = b.max(e);
            }
            self.held.insert(a, b);
            return Ok(());
        }
        self.emit(&data[(self.next - offset) as usize..])?;
        self.release(spill)
    }

    /// Queues the held bytes that now continue the output to be moved from the temp file to
    /// the destination (read, written and let go on the writer thread), as far as the
    /// writer has room (the rest goes on the next call: see `PartFile::pump`).
    fn release(&mut self, spill: &Arc<File>) -> io::Result<()> {
        while let Some((&s, &e)) = self.held.first_key_value() {
            if s > self.next {
                break;
            }
            if s < self.next {
                // Already out from a later copy of those bytes: let that part go.
                let (spill, len) = (spill.clone(), self.next.min(e) - s);
                self.out.then(move || {
                    let _ = rfs::fallocate(
                        &spill,
                        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                        s,
                        len,
                    );
                })?;
            }
            if self.next < e {
                // What was gathered goes first: it comes before the held bytes.
                self.push()?;
            }
            while self.next < e {
                if !self.out.has_room(Self::GATHER + Self::CHUNK) {
                    // Resumed from here on the next call.
                    self.held.pop_first();
                    self.held.insert(self.next, e);
                    return Ok(());
                }
                let n = (e - self.next).min(Self::CHUNK as u64);
                self.out.move_from(spill, self.next, n as usize)?;
                self.next += n;
            }
            self.held.pop_first();
        }
        Ok(())
    }

    fn emit(&mut self, data: &[u8]) -> io::Result<()> {
        self.next += data.len() as u64;
        self.gathered.extend_from_slice(data);
        if self.gathered.len() >= Self::GATHER {
            self.push()?;
        }
        Ok(())
    }

    fn push(&mut self) -> io::Result<()> {
        if self.gathered.is_empty() {
            return self.out.check();
        }
        let at = self.next - self.gathered.len() as u64;
        let buf = std::mem::replace(&mut self.gathered, self.out.buffer(Self::GATHER));
        self.out.write(at, buf)
    }

    /// Hands what was gathered to the writer without waiting for room (the file is let go).
    fn push_now(&mut self) {
        if !self.gathered.is_empty() {
            let at = self.next - self.gathered.len() as u64;
            let _ = self.out.write_now(at, std::mem::take(&mut self.gathered));
        }
    }

    /// Everything that can go out (the held bytes that continue the output) is written,
    /// waiting for the writer as long as that takes.
    fn drain(&mut self, spill: &Arc<File>) -> io::Result<()> {
        loop {
            self.release(spill)?;
            self.push()?;
            self.out.drain()?;
            if self
                .held
                .first_key_value()
                .is_none_or(|(&s, _)| s > self.next)
            {
                return Ok(());
            }
        }
    }

    /// Moves on what can go out without waiting; whether nothing is left to write.
    fn pump(&mut self, spill: &Arc<File>) -> io::Result<bool> {
        self.release(spill)?;
        if self.out.has_room(self.gathered.len()) {
            self.push()?;
        }
        Ok(self.gathered.is_empty()
            && self.out.idle()
            && self
                .held
                .first_key_value()
                .is_none_or(|(&s, _)| s > self.next))
    }

    /// Every one of `size` bytes went out.
    fn complete(&self, size: u64) -> io::Result<()> {
        if self.next == size {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "only {} of {size} bytes reached the destination",
                self.next
            )))
        }
    }
}

/// How every error about a source that changed while it was sent begins (the far side's
/// reasons are text: a client finds a changed source in them by these words).
pub const CHANGED_WHILE_SENT: &str = "changed while being sent";

/// Why a file being sent could not be read or hashed ([`SourceFile`], and
/// [`Sending`](crate::verify::Sending) around it).
#[derive(Debug, Clone, thiserror::Error)]
pub enum SourceError {
    /// The file changed since it was opened: what was read of it would arrive as neither
    /// its old nor its new self.
    #[error("{} ({how})", CHANGED_WHILE_SENT)]
    Changed {
        /// What tells it changed.
        how: Change,
    },
    /// A read of bytes `offset..end` past the end of the file as offered (`size` bytes).
    #[error("read of bytes {offset}..{end} past the end of the file as offered ({size} bytes)")]
    PastEnd {
        /// Where the read started.
        offset: u64,
        /// Where it ended.
        end: u64,
        /// The file's size as offered.
        size: u64,
    },
    /// Reading the file, or its metadata, failed.
    #[error(transparent)]
    Io(Arc<io::Error>),
    /// Hashing it failed (the file is read again on the hashing threads).
    #[error(transparent)]
    Hash(#[from] crate::verify::HashError),
    /// The bytes are still being read by a reader thread (see `readahead`): not a failure,
    /// the read is asked for again later.
    #[error("not read yet")]
    NotReady,
}

impl SourceError {
    /// Whether the file changed while it was sent ([`SourceError::Changed`]): a rerun, or
    /// `--retry-changed`, sends it afresh.
    pub fn changed(&self) -> bool {
        matches!(self, SourceError::Changed { .. })
    }
}

impl From<io::Error> for SourceError {
    fn from(e: io::Error) -> Self {
        SourceError::Io(Arc::new(e))
    }
}

impl From<SourceError> for hayate_proto::StorageError {
    fn from(e: SourceError) -> Self {
        match e {
            SourceError::NotReady => hayate_proto::StorageError::NotReady,
            e => hayate_proto::StorageError::Other(Box::new(e)),
        }
    }
}

/// How a file being sent changed ([`SourceError::Changed`]).
#[derive(Debug, Clone)]
pub enum Change {
    /// Its size is not what it was (bytes).
    Size {
        /// When it was opened.
        was: u64,
        /// Now.
        now: u64,
    },
    /// Same size, another mtime: written to.
    Modified,
    /// Its name leads to another file now (an editor's save, a second copy).
    Replaced,
    /// Its name leads nowhere now (removed, or a directory on the way is gone).
    NameGone(Arc<io::Error>),
    /// A read found fewer bytes than the file had when opened.
    Shrank,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Size { was, now } => write!(f, "size {was} -> {now} bytes"),
            Change::Modified => f.write_str("modified"),
            Change::Replaced => f.write_str("replaced by another file"),
            Change::NameGone(e) => write!(f, "its name now leads nowhere: {e}"),
            Change::Shrank => f.write_str("it shrank"),
        }
    }
}

/// A file being sent. New data goes out in order, a datagram's worth at a time: reading
/// ahead in chunks makes each block a copy instead of a system call (at 1 Gbit/s that is
/// 80 000 `pread`s a second fewer, on a sender that shares its cores with the receiver).
/// Blocks asked for out of order (retransmissions, and a delta's scattered changed leaves)
/// are read on their own, leaving the chunk for the in-order stream: from the page cache,
/// else by the reader thread.
///
/// A file that changes while it is sent would arrive as neither its old nor its new self
/// (or cut at the old size) and still verify, as the hash is of what was read: so its size,
/// mtime and inode (and, with [`watch`](Self::watch), what its name leads to) are checked
/// against what they were when it was opened, on every read from the file and at its last
/// block, before the sender announces the hash; a change fails the read.
pub struct SourceFile {
    file: Arc<File>,
    size: u64,
    /// The reader thread that reads this file's chunks ahead, and the chunks it was asked
    /// for after the one held, in order (see `readahead`).
    reader: usize,
    coming: VecDeque<crate::readahead::Pending>,
    /// Blocks read on their own asked of the reader thread (see `read_back`).
    back: VecDeque<crate::readahead::Pending>,
    /// The current run of forward reads: where it started and where the last one ended (a
    /// run from the file's start is read in chunks at once).
    run_start: u64,
    run_end: u64,
    /// The loop that opened the file, woken when a chunk is read.
    waker: Option<Arc<crate::readahead::Waker>>,
    /// The file is in memory: read on the loop, nothing read ahead.
    in_memory: bool,
    ahead: Arc<PageBuf>,
    /// File offset of `ahead[0]`, and how many bytes of `ahead` hold the file's.
    start: u64,
    len: usize,
    keep_chunks: bool,
    /// Chunks read whole, for [`take_chunks`](Self::take_chunks).
    chunks: Vec<(u64, Arc<PageBuf>)>,
    /// Chunks read earlier that a hash job may still hold: reused once it let go (a fresh
    /// 1 MiB buffer per chunk costs page faults).
    lent: Vec<Arc<PageBuf>>,
    /// Chunk buffers nothing holds, ready for the next read.
    free: Vec<PageBuf>,
    /// The file as it was opened.
    was: Ident,
    locate: Option<Locate>,
    /// Why a read failed.
    failure: Option<SourceError>,
}

/// Where a source's name leads now: (device, inode).
pub type Locate = Box<dyn Fn() -> io::Result<(u64, u64)> + Send>;

/// What tells a file's contents changed: size, mtime, and which inode it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ident {
    size: u64,
    mtime: (i64, i64),
    dev: u64,
    ino: u64,
}

impl Ident {
    fn of(file: &File) -> io::Result<Ident> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok(Ident {
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

impl SourceFile {
    /// Bytes read ahead at a time, aligned (less at the end of the file): one hashing
    /// subtree, so a chunk read for sending is hashed as it is (`verify::Sending`).
    pub const CHUNK: usize = crate::verify::SUBTREE_LEN as usize;

    /// Chunks kept for reuse while hash jobs hold them: about what the hash workers have
    /// queued at the sending rate (more are dropped, and allocated afresh when needed).
    const LENT_MAX: usize = 8;

    /// `size`: the file's length as offered (the file as it is now is what later reads
    /// are checked against). Opened on a driver loop's thread, the reader thread that reads
    /// it ahead wakes that loop when a chunk is read; elsewhere a read that says
    /// [`SourceError::NotReady`] is to be tried again a little later.
    pub fn new(file: File, size: u64) -> Self {
        let was = Ident::of(&file).unwrap_or(Ident {
            size,
            mtime: (0, 0),
            dev: 0,
            ino: 0,
        });
        SourceFile {
            file: Arc::new(file),
            size,
            reader: crate::readahead::thread_for_file(),
            coming: VecDeque::new(),
            back: VecDeque::new(),
            run_start: 0,
            run_end: 0,
            waker: crate::readahead::current_waker(),
            in_memory: false,
            ahead: Arc::new(PageBuf::zeroed(0)),
            start: 0,
            len: 0,
            keep_chunks: false,
            chunks: Vec::new(),
            lent: Vec::new(),
            free: Vec::new(),
            was,
            locate: None,
            failure: None,
        }
        .in_memory_or_ahead()
    }

    /// A file in memory (tmpfs, ramfs: no disk to wait for, and no `RWF_NOWAIT` to tell) is
    /// read on the loop, as a page cache hit is: handing its chunks to a reader thread only
    /// added a wake-up per file (a tree of 10 000 small files took 12-30 % longer).
    fn in_memory_or_ahead(mut self) -> Self {
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        const RAMFS_MAGIC: i64 = 0x8584_58f6;
        // `f_type`'s width differs between targets.
        #[allow(clippy::unnecessary_cast)]
        let in_memory =
            |f: rustix::fs::StatFs| matches!(f.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC);
        self.in_memory = rustix::fs::fstatfs(&*self.file).is_ok_and(in_memory);
        self
    }

    /// Also checks that the file's name still leads to this file (not replaced by another,
    /// as an editor's save or a second copy does): `locate` says where it leads now.
    pub fn watch(mut self, locate: Locate) -> Self {
        self.locate = Some(locate);
        self
    }

    /// A second handle on the same open file (for hashing it on another thread).
    pub fn try_clone_file(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// The file's length as offered.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Why a read failed, if one did (the protocol's error names the far side's path).
    pub fn failure(&self) -> Option<&SourceError> {
        self.failure.as_ref()
    }

    /// Whether the file is still as it was opened: [`SourceError::Changed`] and how, if not.
    pub fn check(&self) -> Result<(), SourceError> {
        let now = Ident::of(&self.file)?;
        let how = if now.size != self.was.size {
            Change::Size {
                was: self.was.size,
                now: now.size,
            }
        } else if now.mtime != self.was.mtime {
            Change::Modified
        } else if let Some(l) = &self.locate {
            match l() {
                Ok(at) if at == (self.was.dev, self.was.ino) => return Ok(()),
                Ok(_) => Change::Replaced,
                Err(e) => Change::NameGone(Arc::new(e)),
            }
        } else {
            return Ok(());
        };
        Err(SourceError::Changed { how })
    }

    /// Fills `out` with the file's bytes at `offset`; an error if the file ends first or
    /// changed since it was opened.
    pub fn read_block(&mut self, offset: u64, out: &mut [u8]) -> Result<(), SourceError> {
        let r = self.read_checked(offset, out);
        match &r {
            Ok(()) | Err(SourceError::NotReady) => {}
            Err(e) => {
                self.failure.get_or_insert_with(|| e.clone());
            }
        }
        r
    }

    /// [`read_block`](Self::read_block), keeping track of the run of forward reads: a read
    /// that starts where the last ended extends it, one that jumps forward starts a new
    /// one, one behind (a retransmission) leaves it alone. Only a read that succeeded
    /// counts (one that is `NotReady` is asked again).
    fn read_checked(&mut self, offset: u64, out: &mut [u8]) -> Result<(), SourceError> {
        let end = offset + out.len() as u64;
        let continues = offset == self.run_end;
        let jumps = !continues && (self.len == 0 || offset >= self.start + self.len as u64);
        let run_start = if continues { self.run_start } else { offset };
        let in_run = run_start == 0 || end - run_start >= Self::RUN_MIN;
        self.read_in(offset, out, in_run)?;
        if continues || jumps {
            self.run_start = run_start;
            self.run_end = end;
        }
        Ok(())
    }

    /// Reads `out` at `offset`; `in_run`: in a run of forward reads long enough to read
    /// in whole chunks.
    fn read_in(&mut self, offset: u64, out: &mut [u8], in_run: bool) -> Result<(), SourceError> {
        let end = offset + out.len() as u64;
        if end > self.size {
            return Err(SourceError::PastEnd {
                offset,
                end,
                size: self.size,
            });
        }
        let mut pos = offset;
        let mut done = 0;
        while done < out.len() {
            let held = self.start + self.len as u64;
            if pos >= self.start && pos < held {
                let from = (pos - self.start) as usize;
                let k = (self.len - from).min(out.len() - done);
                out[done..done + k].copy_from_slice(&self.ahead[from..from + k]);
                done += k;
                pos += k as u64;
                continue;
            }
            // Going forward in a run of reads (the file in order, or a long stretch a delta
            // sends): the aligned chunk that holds `pos` is read whole, and the next ones
            // ahead. Going back (a retransmission), or jumping forward to a short stretch
            // (a delta's changed leaves, scattered): only the bytes asked for.
            let forward = self.len == 0 || pos >= held;
            if forward && (done > 0 || in_run || self.coming.iter().any(|c| c.holds(pos))) {
                self.read_ahead(pos)?;
                continue;
            }
            // A block sent a moment ago is in the page cache; if not (a long path, memory
            // pressure, a delta's jump), the file's reader thread reads it, as it reads
            // chunks ahead.
            let n = match crate::readahead::read_cached(&self.file, pos, &mut out[done..])? {
                Some(n) => n,
                None if self.in_memory => read_at(&self.file, pos, &mut out[done..])?,
                None => self.read_back(pos, &mut out[done..])?,
            };
            self.check()?;
            if n < out.len() - done {
                return Err(SourceError::Changed {
                    how: Change::Shrank,
                });
            }
            return Ok(());
        }
        if end >= self.size {
            // The last block: after it the hash is announced.
            self.check()?;
        }
        Ok(())
    }

    /// Bytes read forward in one run (each read starting where the last ended) from which
    /// on the file is read in whole chunks: a delta's changed leaf, even one that spans two
    /// blocks, is read on its own, not as the 1 MiB chunk around it.
    const RUN_MIN: u64 = 64 << 10;

    /// Chunks read ahead of the one being sent: a slow disk has 4 MiB to read while the
    /// loop sends what it has.
    const AHEAD: usize = 4;

    /// Blocks read on their own (retransmissions, a delta's scattered leaves) being read by
    /// the reader thread at most: more are asked for only as these are taken (or
    /// forgotten, oldest first).
    const BACK_MAX: usize = 64;

    /// A block read on its own that the page cache does not hold: handed to the file's
    /// reader thread the first time it is asked for, [`SourceError::NotReady`] until
    /// that thread has read it, then its bytes once.
    fn read_back(&mut self, pos: u64, out: &mut [u8]) -> Result<usize, SourceError> {
        let asked = self
            .back
            .iter()
            .position(|p| p.start == pos && p.len() == out.len());
        let Some(i) = asked else {
            if self.back.len() >= Self::BACK_MAX {
                self.back.pop_front();
            }
            let buf = PageBuf::zeroed(out.len());
            let p = crate::readahead::submit(self.reader, &self.file, pos, buf, self.waker.clone());
            self.back.push_back(p);
            return Err(SourceError::NotReady);
        };
        let Some(r) = self.back[i].take() else {
            return Err(SourceError::NotReady);
        };
        self.back.remove(i);
        let (buf, n) = r?;
        out[..n].copy_from_slice(&buf[..n]);
        Ok(n)
    }

    /// Makes the aligned [`CHUNK`](Self::CHUNK) that holds `pos` the one held, and keeps it
    /// for [`take_chunks`](Self::take_chunks) too: from what a reader thread read ahead, or
    /// from the page cache; [`SourceError::NotReady`] while a reader thread still reads it.
    /// Asks for the chunks after it.
    fn read_ahead(&mut self, pos: u64) -> Result<(), SourceError> {
        let start = pos - pos % Self::CHUNK as u64;
        let want = (self.size - start).min(Self::CHUNK as u64) as usize;
        // Chunks read ahead and skipped (the receiver already had them).
        while self.coming.front().is_some_and(|c| c.start < start) {
            self.coming.pop_front();
        }
        let (buf, n) = match self.coming.front() {
            Some(c) if c.start == start => match c.take() {
                Some(r) => {
                    self.coming.pop_front();
                    r?
                }
                None => {
                    // The reader is behind (it is a thread among others on a busy host):
                    // what the page cache holds is not waited for.
                    let mut buf = self.spare(want);
                    match crate::readahead::read_cached(&self.file, start, &mut buf)? {
                        Some(n) => {
                            self.coming.pop_front();
                            (buf, n)
                        }
                        None => {
                            self.lend(Arc::new(buf));
                            self.top_up(start);
                            return Err(SourceError::NotReady);
                        }
                    }
                }
            },
            _ if self.in_memory => {
                let mut buf = self.spare(want);
                let n = read_at(&self.file, start, &mut buf)?;
                (buf, n)
            }
            _ => {
                // Nothing asked for it yet (the first chunk, or after a jump): what the page
                // cache holds is read now, the rest by the reader thread.
                self.coming.clear();
                let mut buf = self.spare(want);
                match crate::readahead::read_cached(&self.file, start, &mut buf)? {
                    Some(n) => (buf, n),
                    None => {
                        let c = crate::readahead::submit(
                            self.reader,
                            &self.file,
                            start,
                            buf,
                            self.waker.clone(),
                        );
                        self.coming.push_back(c);
                        self.top_up(start);
                        return Err(SourceError::NotReady);
                    }
                }
            }
        };
        self.len = 0;
        self.check()?;
        if n < want || buf.len() != want {
            return Err(SourceError::Changed {
                how: Change::Shrank,
            });
        }
        let old = std::mem::replace(&mut self.ahead, Arc::new(buf));
        self.lend(old);
        self.start = start;
        self.len = n;
        if self.keep_chunks {
            self.chunks.push((start, self.ahead.clone()));
        }
        self.top_up(start);
        Ok(())
    }

    /// Asks the reader thread for the chunks after `start`'s, up to [`AHEAD`](Self::AHEAD)
    /// of them waiting.
    fn top_up(&mut self, start: u64) {
        if self.in_memory {
            return;
        }
        let chunk = Self::CHUNK as u64;
        let mut next = self.coming.back().map_or(start, |c| c.start) + chunk;
        while self.coming.len() < Self::AHEAD && next < self.size {
            let want = (self.size - next).min(chunk) as usize;
            let buf = self.spare(want);
            let c =
                crate::readahead::submit(self.reader, &self.file, next, buf, self.waker.clone());
            self.coming.push_back(c);
            next += chunk;
        }
    }

    /// A chunk buffer done with is kept for reuse: at once if nothing else holds it, else
    /// among the lent ones until the hash job holding it lets go.
    fn lend(&mut self, old: Arc<PageBuf>) {
        if old.is_empty() {
            return;
        }
        match Arc::try_unwrap(old) {
            Ok(b) if self.free.len() <= Self::AHEAD => self.free.push(b),
            Ok(_) => {}
            Err(held) if self.lent.len() < Self::LENT_MAX => self.lent.push(held),
            Err(_) => {}
        }
    }

    /// A buffer of `want` bytes: a free one, or one a hash job has let go of, else a fresh
    /// one (a fresh 1 MiB buffer costs page faults wherever it is first written).
    fn spare(&mut self, want: usize) -> PageBuf {
        if let Some(i) = self.free.iter().position(|b| b.len() == want) {
            return self.free.swap_remove(i);
        }
        let free = self
            .lent
            .iter_mut()
            .position(|c| Arc::get_mut(c).is_some_and(|b| b.len() == want));
        match free {
            Some(i) => {
                Arc::try_unwrap(self.lent.swap_remove(i)).unwrap_or_else(|_| PageBuf::zeroed(want))
            }
            None => PageBuf::zeroed(want),
        }
    }

    /// The whole chunks read since the last call, with their offsets (only with
    /// [`keep_chunks`](Self::keep_chunks)): the sender's hash is taken from them, not by
    /// reading the file a second time.
    pub fn take_chunks(&mut self) -> Vec<(u64, Arc<PageBuf>)> {
        std::mem::take(&mut self.chunks)
    }

    /// Whether [`take_chunks`](Self::take_chunks) gets the chunks read.
    pub fn keep_chunks(&mut self, on: bool) {
        self.keep_chunks = on;
        self.chunks.clear();
    }
}

/// Reads into `buf` at `offset` until it is full or end of file; returns the bytes read.
pub fn read_at(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// BLAKE3 of a whole file, from offset 0 to its length when called, hashed on all cores.
/// Read 4 MiB at a time with `pread`, so memory stays bounded whatever the size; a file
/// another process shrinks meanwhile is an error (a mapping would have died of SIGBUS).
pub fn hash_file(file: &File) -> io::Result<blake3::Hash> {
    const CHUNK: u64 = 4 << 20;
    let len = file.metadata()?.len();
    let mut hasher = blake3::Hasher::new();
    let mut buf = PageBuf::zeroed(len.min(CHUNK) as usize);
    let mut off = 0u64;
    while off < len {
        let want = (len - off).min(CHUNK) as usize;
        let n = read_at(file, off, &mut buf[..want])?;
        if n < want {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the file shrank while being hashed (from {len} bytes to {})",
                    off + n as u64
                ),
            ));
        }
        hasher.update_rayon(&buf[..n]);
        off += n as u64;
    }
    Ok(hasher.finalize())
}

/// Splits a client path into its normal components; rejects what can never be beneath the
/// root or is malformed. `.` and empty components (`a//b`, `./a`) are ignored.
fn components(rel: &str) -> Result<Vec<&str>, FsError> {
    if rel.is_empty() {
        return Err(FsError::InvalidPath("empty path".into()));
    }
    let (_, comps) = split(rel, false)?;
    if comps.is_empty() {
        return Err(FsError::InvalidPath(format!("{rel}: names no file")));
    }
    Ok(comps)
}

/// (absolute, components) of a path; `.` and empty components dropped. Only `whole` (the
/// whole-filesystem mode) accepts a leading `/` and any `..`; otherwise a `..` must stay
/// beneath the top (`a/../b`, not `a/../../b`). The result may be empty.
fn split(rel: &str, whole: bool) -> Result<(bool, Vec<&str>), FsError> {
    if rel.contains('\0') {
        return Err(FsError::InvalidPath(format!(
            "{}: contains a NUL byte",
            rel.replace('\0', "\\0")
        )));
    }
    let abs = rel.starts_with('/');
    if abs && !whole {
        return Err(FsError::Escapes(rel.to_string()));
    }
    let mut comps = Vec::new();
    let mut depth = 0usize;
    for c in rel.split('/') {
        match c {
            "" | "." => {}
            ".." if !whole && depth == 0 => return Err(FsError::Escapes(rel.to_string())),
            ".." => {
                depth = depth.saturating_sub(1);
                comps.push(c);
            }
            c => {
                depth += 1;
                comps.push(c);
            }
        }
    }
    Ok((abs, comps))
}

/// `openat2` retried on EAGAIN, errors named `shown`.
fn openat2_retry(
    dir: impl AsFd,
    path: &str,
    flags: OFlags,
    resolve: ResolveFlags,
    shown: &str,
) -> Result<OwnedFd, FsError> {
    let flags = flags | OFlags::CLOEXEC;
    let mut tries = 0;
    loop {
        match rfs::openat2(dir.as_fd(), path, flags, Mode::empty(), resolve) {
            // EAGAIN: a concurrent rename raced the `..` check; the kernel asks us to retry.
            Err(Errno::AGAIN) if tries < 8 => tries += 1,
            Err(Errno::NOTDIR) => {
                return Err(FsError::InvalidPath(format!(
                    "{shown}: a path component is not a directory"
                )))
            }
            r => return r.map_err(|e| errno_error(e, shown)),
        }
    }
}

fn errno_error(e: Errno, shown: &str) -> FsError {
    let shown = shown.to_string();
    match e {
        Errno::XDEV => FsError::Escapes(shown),
        Errno::NOENT => FsError::NotFound(shown),
        Errno::ACCESS | Errno::PERM => FsError::PermissionDenied(shown),
        Errno::ROFS => FsError::PermissionDenied(format!("{shown} (read-only file system)")),
        Errno::ISDIR => FsError::NotAFile(shown),
        Errno::NAMETOOLONG => FsError::InvalidPath(format!("{shown}: name too long")),
        Errno::LOOP => FsError::InvalidPath(format!("{shown}: too many symbolic links")),
        e => FsError::Io(shown, io::Error::from(e)),
    }
}

/// The home directory of `user` (the password database), or of the current user (`$HOME`,
/// else the password database) when None.
fn home_dir(user: Option<&str>) -> Option<String> {
    if user.is_none() {
        if let Some(h) = std::env::var("HOME").ok().filter(|h| !h.is_empty()) {
            return Some(h);
        }
    }
    let name = match user {
        Some(u) => Some(std::ffi::CString::new(u).ok()?),
        None => None,
    };
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: the reentrant lookups write only into `pw` and `buf` (whose length is passed)
    // and set `found` to `&mut pw` or null.
    let r = unsafe {
        match &name {
            Some(n) => {
                libc::getpwnam_r(n.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut found)
            }
            None => libc::getpwuid_r(
                libc::geteuid(),
                &mut pw,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            ),
        }
    };
    if r != 0 || found.is_null() || pw.pw_dir.is_null() {
        return None;
    }
    // SAFETY: pw_dir points into `buf`, NUL-terminated, alive until `buf` is dropped.
    let dir = unsafe { std::ffi::CStr::from_ptr(pw.pw_dir) };
    dir.to_str()
        .ok()
        .filter(|d| !d.is_empty())
        .map(str::to_string)
}
