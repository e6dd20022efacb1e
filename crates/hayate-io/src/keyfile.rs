//! Pre-shared key files: created private (0600) from the first byte on, never silently
//! overwritten.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why [`write_new_key_file`] wrote no key.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileWriteError {
    /// Something is already at this path and `force` was not given; it is left untouched.
    #[error("key file exists: {} (use --force to overwrite)", .0.display())]
    Exists(PathBuf),
    /// Creating, writing, syncing or renaming the file failed.
    // The cause is in the message, and not also the error's source: printed as a chain
    // (`hayate: {e:#}`) it read twice.
    #[error("cannot write key file {}: {err}", path.display())]
    Io {
        /// The key file's path as given.
        path: PathBuf,
        /// What the OS said.
        err: io::Error,
    },
}

/// Why [`read_key_file`] returned no contents.
#[derive(Debug, thiserror::Error)]
#[error("cannot read key file {}: {err}", path.display())]
pub struct KeyFileReadError {
    /// The key file's path as given.
    pub path: PathBuf,
    /// What the OS said, or `InvalidData` for a file too large or not UTF-8 text.
    pub err: io::Error,
}

/// A key file's contents and whether its permissions were too open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFileContents {
    /// The whole file as text, unparsed (at most [`MAX_KEY_FILE`] bytes).
    pub contents: String,
    /// True when group or others may read (or write) the file: the caller should warn.
    pub too_open: bool,
    /// Permission bits as found (`mode & 0o7777`).
    pub mode: u32,
}

/// Largest key file [`read_key_file`] reads (a key file is under 100 bytes).
pub const MAX_KEY_FILE: u64 = 4096;

/// Writes a new key file with mode 0600. Without `force`, fails if `path` exists
/// (`O_CREAT|O_EXCL`, so no race either). With `force`, a regular file at `path` (or where
/// a symlink there leads: the link stays) is replaced atomically by a private temp sibling
/// renamed over it, so the old key is never exposed; a device, FIFO or terminal (e.g.
/// `/dev/stdout`) is written to as it is, never replaced.
pub fn write_new_key_file(
    path: &Path,
    contents: &str,
    force: bool,
) -> Result<(), KeyFileWriteError> {
    let io_err = |err| KeyFileWriteError::Io {
        path: path.to_path_buf(),
        err,
    };
    if !force {
        let file = create_private(path).map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                KeyFileWriteError::Exists(path.to_path_buf())
            } else {
                io_err(e)
            }
        })?;
        if let Err(e) = fill(file, contents) {
            // Do not leave a truncated key behind.
            let _ = fs::remove_file(path);
            return Err(io_err(e));
        }
        return Ok(());
    }

    match fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            return Err(io_err(io::Error::new(
                io::ErrorKind::IsADirectory,
                "is a directory",
            )))
        }
        Ok(m) if !m.is_file() => {
            let mut f = OpenOptions::new().write(true).open(path).map_err(io_err)?;
            return f.write_all(contents.as_bytes()).map_err(io_err);
        }
        _ => {}
    }
    let real = follow_links(path).map_err(io_err)?;
    let path = real.as_path();
    let name = path
        .file_name()
        .ok_or_else(|| io_err(io::Error::new(io::ErrorKind::InvalidInput, "no file name")))?;
    let mut attempt = 0u32;
    let (tmp, file) = loop {
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".tmp{}-{attempt}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        match create_private(&tmp) {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
            Err(e) => return Err(io_err(e)),
        }
    };
    let result = fill(file, contents).and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(e));
    }
    Ok(())
}

/// Where `path` leads through symlinks, itself when it is none; a dangling link leads to
/// the name it would create.
fn follow_links(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) => dir.join(target),
                    None => target,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(io::Error::other("too many symbolic links"))
}

/// Reads a key file (at most [`MAX_KEY_FILE`] bytes of it: anything bigger is no key file,
/// and `/dev/zero` must not fill memory); `too_open` tells the caller to warn about
/// group/other access.
pub fn read_key_file(path: &Path) -> Result<KeyFileContents, KeyFileReadError> {
    let err = |err| KeyFileReadError {
        path: path.to_path_buf(),
        err,
    };
    let file = File::open(path).map_err(err)?;
    let mode = file.metadata().map_err(err)?.permissions().mode() & 0o7777;
    let mut data = Vec::new();
    file.take(MAX_KEY_FILE + 1)
        .read_to_end(&mut data)
        .map_err(err)?;
    if data.len() as u64 > MAX_KEY_FILE {
        return Err(err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_KEY_FILE} bytes: not a key file"),
        )));
    }
    let contents = String::from_utf8(data)
        .map_err(|_| err(io::Error::new(io::ErrorKind::InvalidData, "not text")))?;
    Ok(KeyFileContents {
        contents,
        too_open: mode & 0o077 != 0,
        mode,
    })
}

fn create_private(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    // The umask can only remove bits; make the mode exactly 0600 regardless.
    file.set_permissions(Permissions::from_mode(0o600))?;
    Ok(file)
}

fn fill(mut file: File, contents: &str) -> io::Result<()> {
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}
