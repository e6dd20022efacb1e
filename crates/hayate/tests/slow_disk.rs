//! A server whose disk reads slower than its page cache holds (an ext4 on a loop device,
//! reads throttled to 40 MiB/s by the cgroup v1 `blkio` controller, 600 MiB of memory by the
//! `memory` controller): a 1.5 GiB upload must complete verified, and a second client's small
//! upload must be served at once meanwhile. Verifying by re-reading the file at the end took
//! the server's loop away for most of a minute here: the client gave up ("the peer went
//! silent for 15 s") and the second client got no answer.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const CG: &str = "hayate-slow-disk-test";

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
    _dir: tempfile::TempDir,
}

impl SlowDisk {
    fn new() -> Result<SlowDisk, String> {
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
            _dir: dir,
        };
        sh(Command::new("mkfs.ext4").args(["-q", "-F", &disk.loopdev]))?;
        std::fs::create_dir_all(&disk.mnt).map_err(|e| e.to_string())?;
        sh(Command::new("mount").arg(&disk.loopdev).arg(&disk.mnt))?;
        let majmin = sh(Command::new("lsblk").args(["-dno", "MAJ:MIN", &disk.loopdev]))?;
        for c in ["blkio", "memory"] {
            std::fs::create_dir_all(format!("/sys/fs/cgroup/{c}/{CG}"))
                .map_err(|e| e.to_string())?;
        }
        std::fs::write(
            format!("/sys/fs/cgroup/blkio/{CG}/blkio.throttle.read_bps_device"),
            format!("{} {}", majmin.trim(), 40 << 20),
        )
        .map_err(|e| format!("blkio throttle: {e}"))?;
        std::fs::write(
            format!("/sys/fs/cgroup/memory/{CG}/memory.limit_in_bytes"),
            format!("{}", 600 << 20),
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
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = Command::new("losetup").args(["-d", &self.loopdev]).status();
        for c in ["blkio", "memory"] {
            let _ = std::fs::remove_dir(format!("/sys/fs/cgroup/{c}/{CG}"));
        }
    }
}

#[test]
fn an_upload_to_a_disk_slower_than_its_cache_completes_and_others_are_served() {
    let disk = match SlowDisk::new() {
        Ok(d) => d,
        Err(why) => {
            common::sshd::skip_unless_ci(&format!("cannot build a throttled disk: {why}"));
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "k");
    let size: u64 = 1536 << 20;
    let src = dir.path().join("big.bin");
    let want = write_random(&src, size, 5);
    let small = dir.path().join("small.bin");
    write_random(&small, 1 << 20, 6);

    // The server runs inside the throttled cgroups (a shell puts itself there, then execs).
    let port = free_udp_port();
    let script = format!(
        "echo $$ > /sys/fs/cgroup/blkio/{CG}/tasks && echo $$ > /sys/fs/cgroup/memory/{CG}/tasks \
         && exec \"$0\" serve --listen 127.0.0.1:{port} --root \"$1\" --key-file \"$2\""
    );
    let mut server = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .arg(BIN)
        .arg(disk.root())
        .arg(&key)
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
    let url = |p: &str| format!("hayate://127.0.0.1:{port}/{p}");

    let mut cmd = hayate();
    cmd.args(["cp", "--json", "--key-file"])
        .arg(&key)
        .arg(&src)
        .arg(url("big.bin"));
    let big = spawn_cmd(&mut cmd);
    // Once most of the data is in, another client comes with a small file.
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    let second = cp(&key, &[small.display().to_string(), url("small.bin")]);
    let second_took = started.elapsed();
    let run = big.wait(Duration::from_secs(120));
    let _ = server.kill();
    let _ = server.wait();
    let log = log.join().unwrap_or_default();
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
