//! A server whose disk reads slower than its page cache holds (an ext4 on a loop device,
//! reads throttled by the cgroup v1 `blkio` controller, memory limited by the `memory`
//! controller).
//! - A 1.5 GiB upload (reads at 40 MiB/s, 600 MiB of memory) must complete verified, and a
//!   second client's small upload must be served at once meanwhile. Verifying by re-reading
//!   the file at the end took the server's loop away for most of a minute here: the client
//!   gave up ("the peer went silent for 15 s") and the second client got no answer.
//! - A download of a file not in the page cache (reads at 4 MiB/s) must not hold up a second
//!   client either: reading it with `pread` on the server's loop stopped every session for
//!   the quarter second each 1 MiB chunk took.
//! - An upload to a disk whose writes are slow (mounted `sync`, writes throttled) must not
//!   hold up a second client's small uploads.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn sh(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The throttled file system; everything is undone on drop.
struct SlowDisk {
    loopdev: String,
    mnt: PathBuf,
    /// The cgroups' name (one per test).
    cg: &'static str,
    _dir: tempfile::TempDir,
}

impl SlowDisk {
    /// Reads at `read_bps` bytes/s; processes in the cgroups get `memory` bytes.
    fn new(cg: &'static str, read_bps: u64, memory: u64) -> Result<SlowDisk, String> {
        Self::with(cg, read_bps, None, memory)
    }

    /// Reads at `read_bps`, and, with `write_bps`, writes synchronously (mounted `sync`) at
    /// that many bytes/s: every `pwrite` waits for the disk.
    fn with(
        cg: &'static str,
        read_bps: u64,
        write_bps: Option<u64>,
        memory: u64,
    ) -> Result<SlowDisk, String> {
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root".into());
        }
        for c in ["blkio", "memory"] {
            if !Path::new(&format!("/sys/fs/cgroup/{c}/tasks")).exists() {
                return Err(format!("no cgroup v1 {c} controller"));
            }
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let img = dir.path().join("disk.img");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(3 << 30))
            .map_err(|e| e.to_string())?;
        let loopdev = sh(Command::new("losetup").args(["-f", "--show"]).arg(&img))?;
        let mut disk = SlowDisk {
            loopdev,
            mnt: dir.path().join("mnt"),
            cg,
            _dir: dir,
        };
        sh(Command::new("mkfs.ext4").args(["-q", "-F", &disk.loopdev]))?;
        std::fs::create_dir_all(&disk.mnt).map_err(|e| e.to_string())?;
        let mut mount = Command::new("mount");
        if write_bps.is_some() {
            mount.args(["-o", "sync"]);
        }
        sh(mount.arg(&disk.loopdev).arg(&disk.mnt))?;
        let majmin = sh(Command::new("lsblk").args(["-dno", "MAJ:MIN", &disk.loopdev]))?;
        for c in ["blkio", "memory"] {
            std::fs::create_dir_all(format!("/sys/fs/cgroup/{c}/{cg}"))
                .map_err(|e| e.to_string())?;
        }
        std::fs::write(
            format!("/sys/fs/cgroup/blkio/{cg}/blkio.throttle.read_bps_device"),
            format!("{} {}", majmin.trim(), read_bps),
        )
        .map_err(|e| format!("blkio throttle: {e}"))?;
        if let Some(bps) = write_bps {
            std::fs::write(
                format!("/sys/fs/cgroup/blkio/{cg}/blkio.throttle.write_bps_device"),
                format!("{} {}", majmin.trim(), bps),
            )
            .map_err(|e| format!("blkio write throttle: {e}"))?;
        }
        std::fs::write(
            format!("/sys/fs/cgroup/memory/{cg}/memory.limit_in_bytes"),
            format!("{memory}"),
        )
        .map_err(|e| format!("memory limit: {e}"))?;
        std::fs::create_dir_all(disk.root()).map_err(|e| e.to_string())?;
        // Keep the loop device from being torn down under a failed setup.
        disk.loopdev = disk.loopdev.trim().to_string();
        Ok(disk)
    }

    fn root(&self) -> PathBuf {
        self.mnt.join("root")
    }

    /// Mounts the file system again: nothing of it stays in the page cache.
    fn remount(&self) -> Result<(), String> {
        sh(Command::new("umount").arg(&self.mnt))?;
        sh(Command::new("mount").arg(&self.loopdev).arg(&self.mnt))?;
        Ok(())
    }

    /// `hayate serve` on `port` over the disk's root, inside its cgroups (a shell puts
    /// itself there, then execs), and a thread collecting its log.
    fn serve(
        &self,
        port: u16,
        key: &Path,
    ) -> (std::process::Child, std::thread::JoinHandle<String>) {
        let cg = self.cg;
        let script = format!(
            "echo $$ > /sys/fs/cgroup/blkio/{cg}/tasks && echo $$ > /sys/fs/cgroup/memory/{cg}/tasks \
             && exec \"$0\" serve --listen 127.0.0.1:{port} --root \"$1\" --key-file \"$2\""
        );
        let mut server = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .arg(BIN)
            .arg(self.root())
            .arg(key)
            .env_remove("HAYATE_KEY_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = server.stderr.take().unwrap();
        let log = std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::BufReader::new(log), &mut s).ok();
            s
        });
        std::thread::sleep(Duration::from_millis(500));
        (server, log)
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = Command::new("losetup").args(["-d", &self.loopdev]).status();
        for c in ["blkio", "memory"] {
            let _ = std::fs::remove_dir(format!("/sys/fs/cgroup/{c}/{}", self.cg));
        }
    }
}

/// Held by every test of this file: each times another client beside a big transfer, and
/// run at once on 2 cores, one's big transfer and burst of small uploads slowed another's
/// past its bound (3 of 6 small uploads over 0.5 s in the slow-writes test).
static TIMED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A server on a slow disk and a client uploading `size` random bytes (from `seed`) to it as
/// `big.bin`, with a 1 MiB file beside it for another client to send meanwhile.
struct BigUpload {
    dir: tempfile::TempDir,
    key: PathBuf,
    port: u16,
    server: std::process::Child,
    log: std::thread::JoinHandle<String>,
    big: Running,
    want: blake3::Hash,
}

impl BigUpload {
    fn start(disk: &SlowDisk, size: u64, seed: u64) -> BigUpload {
        let dir = tempfile::tempdir().unwrap();
        let key = keygen(dir.path(), "k");
        let src = dir.path().join("big.bin");
        let want = write_random(&src, size, seed);
        write_random(&dir.path().join("small.bin"), 1 << 20, seed + 1);
        let port = free_udp_port();
        let (server, log) = disk.serve(port, &key);
        let mut cmd = hayate();
        cmd.args(["cp", "--json", "--key-file"])
            .arg(&key)
            .arg(&src)
            .arg(format!("hayate://127.0.0.1:{port}/big.bin"));
        let big = spawn_cmd(&mut cmd);
        BigUpload {
            dir,
            key,
            port,
            server,
            log,
            big,
            want,
        }
    }

    /// Another client uploads the small file as `name`.
    fn send_small(&self, name: &str) -> Run {
        let small = self.dir.path().join("small.bin");
        let url = format!("hayate://127.0.0.1:{}/{name}", self.port);
        cp(&self.key, &[small.display().to_string(), url])
    }

    /// Waits for the big upload, stops the server; the upload's run and the server's log.
    fn finish(mut self, timeout: Duration) -> (Run, String) {
        let run = self.big.wait(timeout);
        let _ = self.server.kill();
        let _ = self.server.wait();
        (run, self.log.join().unwrap_or_default())
    }
}

#[test]
fn an_upload_to_a_disk_slower_than_its_cache_completes_and_others_are_served() {
    let _timed = TIMED.lock().unwrap_or_else(|e| e.into_inner());
    let disk = match SlowDisk::new("hayate-slow-disk-up", 40 << 20, 600 << 20) {
        Ok(d) => d,
        Err(why) => {
            common::sshd::skip_unless_ci(&format!("cannot build a throttled disk: {why}"));
            return;
        }
    };
    let up = BigUpload::start(&disk, 1536 << 20, 5);
    let want = up.want;
    // Once most of the data is in, another client comes with a small file.
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    let second = up.send_small("small.bin");
    let second_took = started.elapsed();
    let (run, log) = up.finish(Duration::from_secs(120));
    println!(
        "slow disk: 1.5 GiB upload {:.2} s; second client {:.2} s",
        run.elapsed.as_secs_f64(),
        second_took.as_secs_f64()
    );
    run.assert_ok();
    assert_eq!(run.json()["verified"], true, "{}", run.stdout);
    second.assert_ok();
    assert!(
        second_took < Duration::from_secs(5),
        "a second client waited {second_took:?} during the first's verification\n{log}"
    );
    assert_eq!(hash_file(&disk.root().join("big.bin")), want);
}

#[test]
fn a_download_from_a_slow_disk_does_not_hold_up_another_client() {
    let _timed = TIMED.lock().unwrap_or_else(|e| e.into_inner());
    let disk = match SlowDisk::new("hayate-slow-disk-down", 4 << 20, 600 << 20) {
        Ok(d) => d,
        Err(why) => {
            common::sshd::skip_unless_ci(&format!("cannot build a throttled disk: {why}"));
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "k");
    // 12 s of reading at 4 MiB/s.
    let want = write_random(&disk.root().join("big.bin"), 48 << 20, 7);
    disk.remount().unwrap();
    let small = dir.path().join("small.bin");
    let small_hash = write_random(&small, 8 << 20, 8);

    let port = free_udp_port();
    let (mut server, log) = disk.serve(port, &key);
    let url = |p: &str| format!("hayate://127.0.0.1:{port}/{p}");
    let got = dir.path().join("big.bin");
    let mut cmd = hayate();
    cmd.args(["cp", "--json", "--key-file"])
        .arg(&key)
        .arg(url("big.bin"))
        .arg(&got);
    let big = spawn_cmd(&mut cmd);
    std::thread::sleep(Duration::from_millis(1500));
    // Alone, this upload takes a fraction of a second.
    let started = Instant::now();
    let second = cp(&key, &[small.display().to_string(), url("small.bin")]);
    let second_took = started.elapsed();
    let run = big.wait(Duration::from_secs(90));
    let _ = server.kill();
    let _ = server.wait();
    let log = log.join().unwrap_or_default();
    println!(
        "slow source: 48 MiB download {:.2} s; second client's 8 MiB upload {:.2} s",
        run.elapsed.as_secs_f64(),
        second_took.as_secs_f64()
    );
    second.assert_ok();
    assert!(
        second_took < Duration::from_secs(3),
        "a second client took {second_took:?} beside a download from a slow disk\n{log}"
    );
    assert_eq!(hash_file(&disk.root().join("small.bin")), small_hash);
    run.assert_ok();
    assert_eq!(run.json()["verified"], true, "{}", run.stdout);
    assert_eq!(hash_file(&got), want);
}

/// A disk whose writes are slow (synchronous, 20 MiB/s): the receiver's writer is always
/// 16 MiB behind. Another client's small uploads meanwhile are served at once: they waited
/// up to 0.5-1 s each, every other one, when the server saved its resume state every half
/// second by waiting for those writes on its loop, and when a new file's writes were put
/// behind the slow file's on a shared writer thread (round robin).
#[test]
fn an_upload_to_a_disk_with_slow_writes_does_not_hold_up_another_client() {
    let _timed = TIMED.lock().unwrap_or_else(|e| e.into_inner());
    let disk = match SlowDisk::with("hayate-slow-disk-write", 1 << 30, Some(20 << 20), 600 << 20) {
        Ok(d) => d,
        Err(why) => {
            common::sshd::skip_unless_ci(&format!("cannot build a throttled disk: {why}"));
            return;
        }
    };
    // About 13 s of writing.
    let up = BigUpload::start(&disk, 256 << 20, 9);
    let want = up.want;
    std::thread::sleep(Duration::from_secs(2));
    let mut took = Vec::new();
    for i in 0..6 {
        let started = Instant::now();
        let r = up.send_small(&format!("small{i}.bin"));
        took.push(started.elapsed());
        r.assert_ok();
        std::thread::sleep(Duration::from_millis(300));
    }
    let (run, log) = up.finish(Duration::from_secs(120));
    println!(
        "slow writes: 256 MiB upload {:.2} s; small uploads meanwhile {took:?}",
        run.elapsed.as_secs_f64()
    );
    run.assert_ok();
    assert_eq!(run.json()["verified"], true, "{}", run.stdout);
    let slow = took
        .iter()
        .filter(|t| **t > Duration::from_millis(500))
        .count();
    assert!(
        slow <= 1,
        "{slow} of 6 small uploads took over 0.5 s beside a disk with slow writes: {took:?}\n{log}"
    );
    assert_eq!(hash_file(&disk.root().join("big.bin")), want);
}

/// A client cancels its upload to a disk with slow writes (10 MiB/s, the file's 16 MiB of
/// queued writes full): the server lets the file go without waiting for what is still
/// queued for it (1.6 s of writing), and another client's small uploads, back to back across
/// the cancel, are served at once. The server's loop waited for those writes when it let a
/// file go.
#[test]
fn a_cancelled_upload_to_a_disk_with_slow_writes_does_not_hold_up_another_client() {
    let _timed = TIMED.lock().unwrap_or_else(|e| e.into_inner());
    let disk = match SlowDisk::with(
        "hayate-slow-disk-cancel",
        1 << 30,
        Some(10 << 20),
        600 << 20,
    ) {
        Ok(d) => d,
        Err(why) => {
            common::sshd::skip_unless_ci(&format!("cannot build a throttled disk: {why}"));
            return;
        }
    };
    let up = BigUpload::start(&disk, 256 << 20, 11);
    // The disk falls 16 MiB behind within a second or two.
    std::thread::sleep(Duration::from_secs(3));
    let pid = up.big.pid();
    let cancel = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        signal(pid, libc::SIGINT);
        Instant::now()
    });
    let started = Instant::now();
    let mut took = Vec::new();
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(4) {
        let t = Instant::now();
        let r = up.send_small(&format!("small{i}.bin"));
        took.push(t.elapsed());
        r.assert_ok();
        i += 1;
    }
    let cancelled = cancel.join().unwrap();
    let (run, log) = up.finish(Duration::from_secs(30));
    println!(
        "cancelled 0.3 s in, after {:.2} s; small uploads back to back: {took:?}",
        cancelled.duration_since(started).as_secs_f64()
    );
    assert!(!run.status.success(), "the cancelled upload succeeded");
    let worst = took.iter().max().copied().unwrap_or_default();
    assert!(
        worst < Duration::from_millis(800),
        "a small upload took {worst:?} beside a cancelled one to a disk with slow writes: \
         {took:?}\n{log}"
    );
}
