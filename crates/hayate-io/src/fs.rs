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

use std::ffi::OsStr;
use std::fs::{File, FileTimes, Metadata, Permissions};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::time::SystemTime;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Suffix of in-progress upload/download files: `.<name>.hayate-part`.
pub const PART_SUFFIX: &str = ".hayate-part";

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("path escapes the served root: {0}")]
    Escapes(String),
    #[error("invalid path: {0}")]
    InvalidPath(String),
    #[error("no such file or directory: {0}")]
    NotFound(String),
    #[error("not a regular file: {0}")]
    NotAFile(String),
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("{0}: {1}")]
    Io(String, #[source] io::Error),
}

/// The server's `--root`: an `O_PATH` directory fd all client paths are resolved beneath.
#[derive(Debug)]
pub struct Root {
    dir: OwnedFd,
}

impl Root {
    /// Opens `dir` (the operator's own path, so errors may name it).
    pub fn open(dir: &Path) -> Result<Self, FsError> {
        let shown = dir.display().to_string();
        let dir = rfs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::NOTDIR => FsError::InvalidPath(format!("{shown}: not a directory")),
            e => errno_error(e, &shown),
        })?;
        Ok(Self { dir })
    }

    /// Opens the regular file `rel` (relative to the root) for reading.
    pub fn open_read(&self, rel: &str) -> Result<(File, Metadata), FsError> {
        let comps = components(rel)?;
        let path = comps.join("/");
        // Look at the target through O_PATH first so that opening a FIFO or device (which
        // may block or have side effects) never happens; then open it for real and check it
        // is still the same inode.
        let probe = beneath(&self.dir, &path, OFlags::PATH, rel)?;
        let st = rfs::fstat(&probe).map_err(|e| errno_error(e, rel))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(FsError::NotAFile(rel.to_string()));
        }
        let fd = beneath(&self.dir, &path, OFlags::RDONLY | OFlags::NOCTTY, rel)?;
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

    /// Prepares the upload destination `rel`: creates missing parent directories beneath the
    /// root and opens (creating, mode 0600) the temp file `.<name>.hayate-part` next to the
    /// final name, sized to `size`. An existing temp file is kept (for resume), only resized.
    pub fn create_part(&self, rel: &str, size: u64) -> Result<PartFile, FsError> {
        let comps = components(rel)?;
        let (name, parents) = comps.split_last().expect("components() is never empty");
        let mut dir: Option<OwnedFd> = None;
        for i in 0..parents.len() {
            let prefix = parents[..=i].join("/");
            let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
            let fd = match beneath(&self.dir, &prefix, dir_flags, &prefix) {
                Err(FsError::NotFound(_)) => {
                    // Create it inside the already-confined parent; mkdirat never follows a
                    // symlink in its last component, so this cannot land outside the root.
                    let parent = dir.as_ref().unwrap_or(&self.dir);
                    match rfs::mkdirat(parent, parents[i], Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(errno_error(e, &prefix)),
                    }
                    beneath(&self.dir, &prefix, dir_flags, &prefix)?
                }
                other => other?,
            };
            dir = Some(fd);
        }
        let dir = match dir {
            Some(d) => d,
            None => rustix::io::dup(&self.dir).map_err(|e| errno_error(e, rel))?,
        };
        PartFile::create(dir, name, rel, size)
    }
}

/// A destination being written: the temp file `.<name>.hayate-part`, renamed to `<name>` by
/// [`commit`](Self::commit) only.
#[derive(Debug)]
pub struct PartFile {
    file: File,
    dir: OwnedFd,
    part_name: String,
    final_name: String,
    /// Path as shown in errors (client-relative on the server).
    shown: String,
}

impl PartFile {
    fn create(dir: OwnedFd, name: &str, shown: &str, size: u64) -> Result<Self, FsError> {
        if name.ends_with(PART_SUFFIX) {
            return Err(FsError::InvalidPath(format!(
                "{shown}: names ending in {PART_SUFFIX} are reserved"
            )));
        }
        match rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                return Err(FsError::NotAFile(shown.to_string()))
            }
            Ok(_) | Err(Errno::NOENT) => {}
            Err(e) => return Err(errno_error(e, shown)),
        }
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
        file.set_len(size).map_err(io_err)?;
        Ok(Self {
            file,
            dir,
            part_name,
            final_name: name.to_string(),
            shown: shown.to_string(),
        })
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// The temp file's name inside the destination directory.
    pub fn part_name(&self) -> &str {
        &self.part_name
    }

    /// Writes all of `data` at `offset` (pwrite, restarting on short writes).
    pub fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    /// BLAKE3 of the temp file's current contents (multi-threaded).
    pub fn hash(&self) -> io::Result<blake3::Hash> {
        hash_file(&self.file)
    }

    /// Sets permissions (`mode & 0o777`: setuid/setgid/sticky bits from a remote peer are
    /// never applied) and mtime, then renames the temp file to the final name. Call only after
    /// the hash was verified. Does not fsync (like cp/scp); call `file().sync_all()` first if
    /// durability across power loss matters.
    pub fn commit(self, mode: Option<u32>, mtime: Option<SystemTime>) -> io::Result<()> {
        if let Some(mode) = mode {
            self.file
                .set_permissions(Permissions::from_mode(mode & 0o777))?;
        }
        if let Some(mtime) = mtime {
            self.file.set_times(FileTimes::new().set_modified(mtime))?;
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
        })
    }

    /// Closes the temp file and leaves it in place for a later resume.
    pub fn abandon(self) {}
}

/// Client side: a temp-then-rename destination for a download at the user's own `dest`
/// (not sandboxed; the parent directory must exist).
pub fn create_local_part(dest: &Path, size: u64) -> Result<PartFile, FsError> {
    let shown = dest.display().to_string();
    let name = dest
        .file_name()
        .and_then(OsStr::to_str)
        .filter(|n| *n != "." && *n != "..")
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
    PartFile::create(dir, name, &shown, size)
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

/// BLAKE3 of a whole file, from offset 0 to its current length, hashed on all cores.
/// Maps the file when possible (no copy); the file must not shrink meanwhile (SIGBUS).
pub fn hash_file(file: &File) -> io::Result<blake3::Hash> {
    let len = file.metadata()?.len();
    let mut hasher = blake3::Hasher::new();
    if len == 0 {
        return Ok(hasher.finalize());
    }
    if let Ok(len) = usize::try_from(len) {
        if let Some(map) = Mmap::new(file, len) {
            hasher.update_rayon(map.as_slice());
            return Ok(hasher.finalize());
        }
    }
    let mut buf = vec![0u8; 4 << 20];
    let mut off = 0u64;
    loop {
        let n = read_at(file, off, &mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update_rayon(&buf[..n]);
        off += n as u64;
    }
    Ok(hasher.finalize())
}

/// Read-only shared mapping of a file, unmapped on drop.
struct Mmap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mmap {
    fn new(file: &File, len: usize) -> Option<Self> {
        use std::os::fd::AsRawFd;
        // SAFETY: maps `len` bytes of an open file read-only; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        // SAFETY: advisory only, on the mapping just created.
        unsafe { libc::madvise(ptr, len, libc::MADV_SEQUENTIAL) };
        Some(Self { ptr, len })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the region mmap returned.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Splits a client path into its normal components; rejects what can never be beneath the
/// root or is malformed. `.` and empty components (`a//b`, `./a`) are ignored.
fn components(rel: &str) -> Result<Vec<&str>, FsError> {
    if rel.is_empty() {
        return Err(FsError::InvalidPath("empty path".into()));
    }
    if rel.contains('\0') {
        return Err(FsError::InvalidPath(format!(
            "{}: contains a NUL byte",
            rel.replace('\0', "\\0")
        )));
    }
    if rel.starts_with('/') {
        return Err(FsError::Escapes(rel.to_string()));
    }
    let mut comps = Vec::new();
    for c in rel.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(FsError::Escapes(rel.to_string())),
            c => comps.push(c),
        }
    }
    if comps.is_empty() {
        return Err(FsError::InvalidPath(format!("{rel}: names no file")));
    }
    Ok(comps)
}

/// `openat2(dir, path, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, errors named `shown`.
fn beneath(dir: &OwnedFd, path: &str, flags: OFlags, shown: &str) -> Result<OwnedFd, FsError> {
    let flags = flags | OFlags::CLOEXEC;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
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
