//! Paths remembered between runs: the rate and minimum RTT an upload's controller found to
//! a peer, so that the next upload to it within the hour starts near that rate (careful
//! resume, see `hayate_proto::cc`). One small file per user:
//! `$XDG_CACHE_HOME/hayate/paths`, else `~/.cache/hayate/paths`.
//!
//! The file is text, one path a line: `KEY RATE_BYTES_PER_S MIN_RTT_US UNIX_SECS`, the key
//! the peer's IP address (`ip` or `[v6]`). A line that does not parse is skipped, a file
//! that cannot be read is an empty cache: the cache is a hint, never a reason to fail. It
//! keeps at most [`MAX_ENTRIES`] paths (the newest), is written whole to a temporary file
//! and renamed over the old one (readers never see half a file), mode 0600.

use std::fs::{self, OpenOptions, Permissions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hayate_proto::cc::{PathMeasurement, RememberedPath};

/// Paths kept; the oldest go first.
pub const MAX_ENTRIES: usize = 256;
/// A path measured longer ago than this is not used (and not kept).
pub const MAX_AGE: Duration = Duration::from_secs(3600);

/// One remembered path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The peer's address (the path is the address's, whatever the port).
    pub peer: IpAddr,
    /// The bottleneck rate found, bytes/s.
    pub rate: u64,
    /// The minimum RTT, µs.
    pub min_rtt_us: u64,
    /// When it was measured, seconds since the Unix epoch.
    pub at_secs: u64,
}

/// The per-user cache file: `$XDG_CACHE_HOME/hayate/paths`, else `$HOME/.cache/hayate/paths`
/// (`None` without either).
pub fn default_path() -> Option<PathBuf> {
    let nonempty = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty());
    let base = nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| nonempty("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("hayate").join("paths"))
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Parses a cache file's text: the lines that make sense.
pub fn parse(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|line| {
            let mut w = line.split_ascii_whitespace();
            let key = w.next()?;
            let peer: IpAddr = key
                .strip_prefix('[')
                .and_then(|k| k.strip_suffix(']'))
                .unwrap_or(key)
                .parse()
                .ok()?;
            let rate = w.next()?.parse().ok()?;
            let min_rtt_us = w.next()?.parse().ok()?;
            let at_secs = w.next()?.parse().ok()?;
            (w.next().is_none() && rate > 0 && min_rtt_us > 0).then_some(Entry {
                peer,
                rate,
                min_rtt_us,
                at_secs,
            })
        })
        .collect()
}

fn format(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|e| {
            let key = match e.peer {
                IpAddr::V4(a) => a.to_string(),
                IpAddr::V6(a) => format!("[{a}]"),
            };
            format!("{key} {} {} {}\n", e.rate, e.min_rtt_us, e.at_secs)
        })
        .collect()
}

/// Every entry in the file at `path` (none if it is missing or unreadable).
pub fn load(path: &Path) -> Vec<Entry> {
    // A cache file of megabytes is not ours: leave it unread.
    match fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() <= 1 << 20 => {}
        _ => return Vec::new(),
    }
    fs::read(path)
        .map(|b| parse(&String::from_utf8_lossy(&b)))
        .unwrap_or_default()
}

/// The path to `peer` remembered in the file at `path`, if measured within [`MAX_AGE`]
/// (at `now_secs`), as the controller takes it.
pub fn lookup_at(path: &Path, peer: IpAddr, now_secs: u64) -> Option<RememberedPath> {
    load(path)
        .into_iter()
        .filter(|e| e.peer == peer && e.at_secs <= now_secs)
        .max_by_key(|e| e.at_secs)
        .map(|e| (e, now_secs - e.at_secs))
        .filter(|(_, age)| *age <= MAX_AGE.as_secs())
        .map(|(e, age)| RememberedPath {
            rate: e.rate,
            min_rtt_us: e.min_rtt_us,
            age_us: age * 1_000_000,
        })
}

/// [`lookup_at`] now.
pub fn lookup(path: &Path, peer: IpAddr) -> Option<RememberedPath> {
    lookup_at(path, peer, now_secs())
}

/// Remembers `m` for `peer` in the file at `path` (at `now_secs`): replaces the peer's
/// entry, drops entries older than [`MAX_AGE`], keeps the newest [`MAX_ENTRIES`], and writes
/// the whole file anew (temporary file, then rename; mode 0600; the directory made 0700 if
/// missing).
pub fn store_at(path: &Path, peer: IpAddr, m: PathMeasurement, now_secs: u64) -> io::Result<()> {
    let mut entries: Vec<Entry> = load(path)
        .into_iter()
        .filter(|e| e.peer != peer && e.at_secs + MAX_AGE.as_secs() >= now_secs)
        .collect();
    entries.push(Entry {
        peer,
        rate: m.rate,
        min_rtt_us: m.min_rtt_us,
        at_secs: now_secs,
    });
    entries.sort_by_key(|e| e.at_secs);
    let excess = entries.len().saturating_sub(MAX_ENTRIES);
    entries.drain(..excess);
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("the cache file has no directory"))?;
    if !dir.is_dir() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("the cache file has no name"))?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.set_permissions(Permissions::from_mode(0o600))?;
        f.write_all(format(&entries).as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// [`store_at`] now.
pub fn store(path: &Path, peer: IpAddr, m: PathMeasurement) -> io::Result<()> {
    store_at(path, peer, m, now_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(rate: u64) -> PathMeasurement {
        PathMeasurement {
            rate,
            min_rtt_us: 250_000,
        }
    }

    #[test]
    fn stores_and_finds_within_the_hour() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/hayate/paths");
        let a: IpAddr = "10.0.0.2".parse().unwrap();
        let b: IpAddr = "fd00::2".parse().unwrap();
        store_at(&p, a, m(60_000_000), 1_000_000).unwrap();
        store_at(&p, b, m(7_000_000), 1_000_010).unwrap();
        let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let got = lookup_at(&p, a, 1_000_100).unwrap();
        assert_eq!(got.rate, 60_000_000);
        assert_eq!(got.min_rtt_us, 250_000);
        assert_eq!(got.age_us, 100_000_000);
        assert_eq!(lookup_at(&p, b, 1_000_100).unwrap().rate, 7_000_000);
        // Older than an hour: not used.
        assert_eq!(lookup_at(&p, a, 1_000_000 + 3601), None);
        // A newer measurement replaces the old one.
        store_at(&p, a, m(50_000_000), 1_000_200).unwrap();
        assert_eq!(lookup_at(&p, a, 1_000_300).unwrap().rate, 50_000_000);
        assert_eq!(load(&p).len(), 2);
        // No temporary file left behind.
        assert_eq!(fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
    }

    #[test]
    fn keeps_the_newest_and_drops_the_stale() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("paths");
        for i in 0..(MAX_ENTRIES as u64 + 10) {
            let ip = IpAddr::from([10, 1, (i >> 8) as u8, i as u8]);
            store_at(&p, ip, m(1_000 + i), 5_000 + i).unwrap();
        }
        let e = load(&p);
        assert_eq!(e.len(), MAX_ENTRIES);
        assert_eq!(e[0].rate, 1_010);
        // Two hours on, a store keeps only the fresh one.
        store_at(&p, "10.9.9.9".parse().unwrap(), m(5), 5_000 + 7_200 + 300).unwrap();
        assert_eq!(load(&p).len(), 1);
    }

    #[test]
    fn a_corrupt_file_is_an_empty_cache() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("paths");
        let a: IpAddr = "10.0.0.2".parse().unwrap();
        fs::write(
            &p,
            b"\xff\xfe garbage\n10.0.0.2 12 x 5\n10.0.0.2 -1 5 5\n\n[::1 5 5 5\n",
        )
        .unwrap();
        assert_eq!(load(&p), Vec::new());
        assert_eq!(lookup_at(&p, a, 10), None);
        // A good line among bad ones is used; storing rewrites the file clean.
        fs::write(&p, "junk\n10.0.0.2 1000 2000 5 \n").unwrap();
        assert_eq!(lookup_at(&p, a, 10).unwrap().rate, 1000);
        store_at(&p, "10.0.0.3".parse().unwrap(), m(9), 20).unwrap();
        assert_eq!(
            fs::read_to_string(&p).unwrap(),
            "10.0.0.2 1000 2000 5\n10.0.0.3 9 250000 20\n"
        );
        // A directory where the file should be: no entries, and storing fails cleanly.
        let q = d.path().join("dir");
        fs::create_dir(&q).unwrap();
        assert_eq!(lookup_at(&q, a, 10), None);
        assert!(store_at(&q, a, m(1), 10).is_err());
        // A missing file.
        assert_eq!(lookup_at(&d.path().join("none"), a, 10), None);
    }
}
