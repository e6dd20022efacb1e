//! `hayate cp HOST:PATH` through a real OpenSSH server on loopback (started per test with
//! throwaway keys): the far side is `hayate serve --stdio`, started by ssh.
//! Skipped, saying so, where sshd cannot run (no openssh-server, not root).

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::sshd::Sshd;
use common::{hayate, spawn_cmd, tree, Run, BIN};

struct Fx {
    sshd: Sshd,
    dir: tempfile::TempDir,
}

impl Fx {
    fn new() -> Option<Fx> {
        let sshd = Sshd::start()?;
        let dir = tempfile::tempdir().expect("tempdir");
        Some(Fx { sshd, dir })
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    /// `user@127.0.0.1:<absolute path>` for a path in our temp dir (the far side is us).
    fn remote(&self, rel: &str) -> String {
        format!("{}:{}", self.sshd.target(), self.p(rel).display())
    }
    fn cmd(&self) -> Command {
        let mut c = hayate();
        c.arg("cp")
            .arg("-e")
            .arg(self.sshd.ssh_command())
            .arg("--remote-path")
            .arg(BIN);
        c
    }
    fn cp(&self, args: &[&str]) -> Run {
        run(self.cmd().args(args), Duration::from_secs(120))
    }
}

fn run(cmd: &mut Command, limit: Duration) -> Run {
    spawn_cmd(cmd).wait(limit)
}

fn write(path: &Path, len: usize, seed: u8) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap();
    }
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[i % 4] ^ seed)
        .collect();
    fs::write(path, data).unwrap();
}

fn json(r: &Run) -> serde_json::Value {
    serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("bad JSON ({e}):\n{}\nstderr:\n{}", r.stdout, r.stderr))
}

macro_rules! fx {
    () => {
        match Fx::new() {
            Some(f) => f,
            None => return,
        }
    };
}

#[test]
fn upload_and_download_one_file() {
    let fx = fx!();
    write(&fx.p("a.bin"), 3_000_001, 1);
    fs::create_dir(fx.p("far")).unwrap();
    let r = fx.cp(&[
        "--json",
        fx.p("a.bin").to_str().unwrap(),
        &fx.remote("far/"),
    ]);
    r.assert_ok();
    let j = json(&r);
    assert_eq!(j["verified"], true, "{j}");
    assert_eq!(j["transport"], "udp", "{j}");
    assert_eq!(
        fs::read(fx.p("a.bin")).unwrap(),
        fs::read(fx.p("far/a.bin")).unwrap()
    );

    let r = fx.cp(&[&fx.remote("far/a.bin"), fx.p("back.bin").to_str().unwrap()]);
    r.assert_ok();
    assert_eq!(
        fs::read(fx.p("a.bin")).unwrap(),
        fs::read(fx.p("back.bin")).unwrap()
    );
}

/// `hayate cp` over ssh waits for ssh, and so for the far side, to exit: the far side leaves
/// as soon as ssh closes its input, not after an idle wait. A copy of one byte costs what
/// an ssh login that runs `true` costs, plus the transfer's round trips (under 150 ms more;
/// the far side lingered 200 ms after the copy when it slept out its idle wait first).
/// Best of three each, taken alternately, so a loaded host slows both the same way.
#[test]
fn a_small_copy_costs_about_one_ssh_login() {
    let fx = fx!();
    write(&fx.p("one"), 1, 3);
    fs::create_dir(fx.p("far")).unwrap();
    let (mut login, mut copy) = (Duration::MAX, Duration::MAX);
    for _ in 0..3 {
        let t = Instant::now();
        let st = fx
            .sshd
            .command()
            .arg(fx.sshd.target())
            .arg("true")
            .stdin(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
        login = login.min(t.elapsed());
        let t = Instant::now();
        fx.cp(&["-q", fx.p("one").to_str().unwrap(), &fx.remote("far/one")])
            .assert_ok();
        copy = copy.min(t.elapsed());
    }
    assert_eq!(
        fs::read(fx.p("far/one")).unwrap(),
        fs::read(fx.p("one")).unwrap()
    );
    assert!(
        copy < login + Duration::from_millis(150),
        "a one-byte copy took {copy:?}, an ssh login {login:?}"
    );
}

#[test]
fn several_files_to_a_directory_and_back() {
    let fx = fx!();
    for (i, n) in ["x", "y", "z"].iter().enumerate() {
        write(&fx.p(&format!("src/{n}")), 10_000 * (i + 1), i as u8);
    }
    fs::create_dir(fx.p("far")).unwrap();
    let srcs: Vec<String> = ["x", "y", "z"]
        .iter()
        .map(|n| fx.p(&format!("src/{n}")).display().to_string())
        .collect();
    let mut args: Vec<&str> = srcs.iter().map(String::as_str).collect();
    let dst = fx.remote("far");
    args.push(&dst);
    fx.cp(&args).assert_ok();
    fs::create_dir(fx.p("back")).unwrap();
    let r1 = fx.remote("far/x");
    let r2 = fx.remote("far/z");
    let back = fx.p("back").display().to_string();
    fx.cp(&[&r1, &r2, &back]).assert_ok();
    for n in ["x", "z"] {
        assert_eq!(
            fs::read(fx.p(&format!("src/{n}"))).unwrap(),
            fs::read(fx.p(&format!("back/{n}"))).unwrap()
        );
    }
    assert!(!fx.p("back/y").exists());
}

/// A tree with nested and empty directories, links (inside, dangling, pointing out), odd
/// modes and old mtimes.
fn make_tree(root: &Path) {
    write(&root.join("top.txt"), 1234, 1);
    write(&root.join("a/b/c/deep.bin"), 200_000, 2);
    write(&root.join("a/small"), 1, 3);
    write(&root.join("a/empty-file"), 0, 0);
    fs::create_dir_all(root.join("empty/dir")).unwrap();
    std::os::unix::fs::symlink("b/c/deep.bin", root.join("a/link-in")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("link-out")).unwrap();
    std::os::unix::fs::symlink("nowhere", root.join("dangling")).unwrap();
    fs::set_permissions(root.join("a/small"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(root.join("top.txt"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(root.join("a/b"), fs::Permissions::from_mode(0o700)).unwrap();
    for (i, p) in [
        "top.txt",
        "a/b/c/deep.bin",
        "a/small",
        "a/empty-file",
        "empty/dir",
        "empty",
        "a/b/c",
        "a/b",
        "a",
    ]
    .iter()
    .enumerate()
    {
        let t = std::time::UNIX_EPOCH + Duration::from_secs(1_500_000_000 + i as u64 * 1000);
        let f = fs::File::open(root.join(p)).unwrap();
        f.set_times(fs::FileTimes::new().set_modified(t)).unwrap();
    }
}

/// Every entry beneath `root`: (relative path, kind, content or link target, mode, mtime).
fn snapshot(root: &Path) -> Vec<(String, char, Vec<u8>, u32, i64)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if m.file_type().is_symlink() {
                let t = fs::read_link(&p).unwrap();
                out.push((rel, 'l', t.as_os_str().as_encoded_bytes().to_vec(), 0, 0));
            } else if m.is_dir() {
                out.push((rel, 'd', Vec::new(), m.mode() & 0o777, m.mtime()));
                stack.push(p);
            } else {
                out.push((rel, 'f', fs::read(&p).unwrap(), m.mode() & 0o777, m.mtime()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn tree_upload_and_download_keep_content_links_modes_and_mtimes() {
    let fx = fx!();
    make_tree(&fx.p("tree"));
    let want = snapshot(&fx.p("tree"));
    assert!(want.len() >= 12);

    // Upload into a directory that does not exist yet: it becomes the copy (scp -r).
    let r = fx.cp(&[
        "-r",
        "-p",
        "--json",
        fx.p("tree").to_str().unwrap(),
        &fx.remote("far"),
    ]);
    r.assert_ok();
    assert_eq!(snapshot(&fx.p("far")), want, "uploaded tree differs");
    // Links were copied as links, never followed.
    assert!(fs::symlink_metadata(fx.p("far/link-out"))
        .unwrap()
        .file_type()
        .is_symlink());

    // Download into an existing directory: lands under the source's name.
    fs::create_dir(fx.p("back")).unwrap();
    let r = fx.cp(&[
        "-r",
        "-p",
        &fx.remote("far"),
        fx.p("back").to_str().unwrap(),
    ]);
    r.assert_ok();
    assert_eq!(snapshot(&fx.p("back/far")), want, "downloaded tree differs");
}

#[test]
fn directory_without_r_is_refused() {
    let fx = fx!();
    write(&fx.p("d/f"), 10, 0);
    let r = fx.cp(&[fx.p("d").to_str().unwrap(), &fx.remote("x")]);
    assert!(!r.ok());
    assert!(r.stderr.contains("use -r"), "{}", r.stderr);
    let r = fx.cp(&[&fx.remote("d"), fx.p("y").to_str().unwrap()]);
    assert!(!r.ok());
    assert!(r.stderr.contains("use -r"), "{}", r.stderr);
}

#[test]
fn no_clobber_and_update_skip_and_say_so() {
    let fx = fx!();
    write(&fx.p("f"), 5_000_000, 7);
    fs::create_dir(fx.p("far")).unwrap();
    fx.cp(&[fx.p("f").to_str().unwrap(), &fx.remote("far/f")])
        .assert_ok();
    // Same content: --update sends nothing.
    let r = fx.cp(&[
        "--update",
        "--json",
        fx.p("f").to_str().unwrap(),
        &fx.remote("far/f"),
    ]);
    r.assert_ok();
    let j = json(&r);
    assert_eq!(j["skipped"], 1, "{j}");
    assert!(j["data_bytes_sent"].as_u64().unwrap() < 100_000, "{j}");
    // Different content, --no-clobber: left alone.
    write(&fx.p("f"), 5_000_000, 8);
    let r = fx.cp(&[
        "-n",
        "--json",
        fx.p("f").to_str().unwrap(),
        &fx.remote("far/f"),
    ]);
    r.assert_ok();
    assert_eq!(json(&r)["skipped"], 1);
    assert_ne!(
        fs::read(fx.p("f")).unwrap(),
        fs::read(fx.p("far/f")).unwrap()
    );
    // Different content, --update: copied.
    let r = fx.cp(&[
        "-u",
        "--json",
        fx.p("f").to_str().unwrap(),
        &fx.remote("far/f"),
    ]);
    r.assert_ok();
    assert_eq!(json(&r)["skipped"], 0);
    assert_eq!(
        fs::read(fx.p("f")).unwrap(),
        fs::read(fx.p("far/f")).unwrap()
    );
    // Default: overwrite.
    write(&fx.p("f"), 1000, 9);
    fx.cp(&[fx.p("f").to_str().unwrap(), &fx.remote("far/f")])
        .assert_ok();
    assert_eq!(
        fs::read(fx.p("f")).unwrap(),
        fs::read(fx.p("far/f")).unwrap()
    );
}

#[test]
fn killed_upload_resumes_and_sends_only_the_rest() {
    let fx = fx!();
    let size = 256usize << 20;
    write(&fx.p("big"), size, 5);
    fs::create_dir(fx.p("far")).unwrap();
    // Capped so the kill lands midway on any machine.
    let mut child = fx
        .cmd()
        .args([
            "--rate",
            "400M",
            "-q",
            fx.p("big").to_str().unwrap(),
            &fx.remote("far/big"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let part = fx.p("far/.big.hayate-part");
    let state = fx.p("far/.big.hayate-state");
    // Kill it once a quarter has landed, not after a fixed time: on a loaded machine 2 s got
    // under 10 %. Data arrives mostly in order, so the quarter has landed once the part file
    // holds the source's bytes just before it (its space is reserved from the start, so
    // what is allocated says nothing).
    let quarter = (size / 4 - 4096) as u64;
    let mut want = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(
        &fs::File::open(fx.p("big")).unwrap(),
        &mut want,
        quarter,
    )
    .unwrap();
    let written = || {
        let mut got = vec![0u8; 4096];
        fs::File::open(&part)
            .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut got, quarter))
            .is_ok_and(|()| got == want)
    };
    let t0 = Instant::now();
    while !(state.exists() && written()) && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // The far side notices the closed channel, writes its state and exits.
    std::thread::sleep(Duration::from_millis(1000));
    assert!(part.exists(), "the partial upload is kept");
    assert!(
        !fx.p("far/big").exists(),
        "nothing is presented as complete"
    );

    let r = fx.cp(&[
        "--json",
        fx.p("big").to_str().unwrap(),
        &fx.remote("far/big"),
    ]);
    r.assert_ok();
    let j = json(&r);
    let resumed = j["resumed_bytes"].as_u64().unwrap();
    let sent = j["data_bytes_sent"].as_u64().unwrap();
    let again = j["data_bytes_retransmitted"].as_u64().unwrap();
    let size = size as u64;
    assert!(
        resumed > size / 10,
        "the first run got somewhere: {}",
        r.stderr
    );
    assert!(resumed < size, "{j}");
    // Only what was missing went (plus a little: block edges, blocks sent before the
    // receiver said what it had), and again only what was lost (the loopback drops a few
    // % when the receiver falls behind on a loaded host).
    assert!(
        sent - again <= size - resumed + size / 50,
        "sent {sent} bytes ({again} again) with {resumed} of {size} already there: {j}"
    );
    assert!(sent <= size - resumed + size / 5, "{j}");
    assert_eq!(
        fs::read(fx.p("big")).unwrap(),
        fs::read(fx.p("far/big")).unwrap()
    );
    assert!(
        !part.exists() && !state.exists(),
        "temp and state files removed"
    );
}

#[test]
fn via_ssh_carries_the_data_over_the_channel() {
    let fx = fx!();
    write(&fx.p("m"), 64 << 20, 4);
    let r = fx.cp(&[
        "--via-ssh",
        "--json",
        fx.p("m").to_str().unwrap(),
        &fx.remote("m2"),
    ]);
    r.assert_ok();
    let j = json(&r);
    assert_eq!(j["transport"], "ssh");
    // The channel is reliable and pushes back when full: nothing is lost, nothing resent.
    assert_eq!(j["packets_retransmitted"], 0, "{j}");
    println!(
        "via ssh: 64 MiB up at {:.2} Gbit/s",
        j["goodput_bps"].as_f64().unwrap_or(0.0) / 1e9
    );
    assert_eq!(fs::read(fx.p("m")).unwrap(), fs::read(fx.p("m2")).unwrap());
    let r = fx.cp(&[
        "--via-ssh",
        "--json",
        &fx.remote("m2"),
        fx.p("m3").to_str().unwrap(),
    ]);
    r.assert_ok();
    assert_eq!(fs::read(fx.p("m")).unwrap(), fs::read(fx.p("m3")).unwrap());
}

/// The far side runs in a network namespace of its own: its UDP port is unreachable from
/// here (datagrams to it vanish, as behind a firewall), but ssh's channel still works.
#[test]
fn udp_blocked_falls_back_to_the_ssh_channel() {
    let fx = fx!();
    let ns = format!("hy-udpblk-{}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        common::sshd::skip_unless_ci("cannot create a network namespace (needs root and iproute2)");
        return;
    }
    struct Ns(String);
    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _ns = Ns(ns.clone());
    let wrapper = fx.p("hayate-in-netns");
    fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec ip netns exec {ns} {BIN} \"$@\"\n"),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    write(&fx.p("f"), 3 << 20, 6);
    let r = run(
        hayate()
            .args(["cp", "-e", &fx.sshd.ssh_command(), "--remote-path"])
            .arg(&wrapper)
            .args([
                "--udp-timeout",
                "1",
                "--json",
                fx.p("f").to_str().unwrap(),
                &fx.remote("g"),
            ]),
        Duration::from_secs(60),
    );
    r.assert_ok();
    assert!(
        r.stderr.contains("ssh channel"),
        "says so in one line: {}",
        r.stderr
    );
    assert_eq!(json(&r)["transport"], "ssh");
    assert_eq!(fs::read(fx.p("f")).unwrap(), fs::read(fx.p("g")).unwrap());
}

#[test]
fn missing_remote_hayate_says_how_to_fix_it() {
    let fx = fx!();
    write(&fx.p("f"), 10, 0);
    let r = run(
        hayate().args([
            "cp",
            "-e",
            &fx.sshd.ssh_command(),
            "--remote-path",
            "/nonexistent/hayate",
            fx.p("f").to_str().unwrap(),
            &fx.remote("g"),
        ]),
        Duration::from_secs(30),
    );
    assert!(!r.ok());
    assert!(r.stderr.contains("not installed"), "{}", r.stderr);
    assert!(r.stderr.contains("--remote-path"), "{}", r.stderr);
    assert!(!fx.p("g").exists());
}

#[test]
fn bad_host_and_denied_login_fail_clearly() {
    let fx = fx!();
    write(&fx.p("f"), 10, 0);
    let r = fx.cp(&[fx.p("f").to_str().unwrap(), "no-such-host.invalid:g"]);
    assert!(!r.ok());
    assert!(r.stderr.contains("no-such-host.invalid"), "{}", r.stderr);

    // A key the server does not know: ssh's "Permission denied" comes through.
    let other = fx.p("otherkey");
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)
        .status()
        .unwrap();
    assert!(st.success());
    let ssh = format!(
        "ssh -p {} -i {} -o IdentitiesOnly=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes",
        fx.sshd.port(),
        other.display()
    );
    let r = run(
        hayate().args([
            "cp",
            "-e",
            &ssh,
            "--remote-path",
            BIN,
            fx.p("f").to_str().unwrap(),
            &fx.remote("g"),
        ]),
        Duration::from_secs(30),
    );
    assert!(!r.ok());
    assert!(
        r.stderr.to_lowercase().contains("permission denied"),
        "{}",
        r.stderr
    );
    assert!(!fx.p("g").exists());
    // With --json: one object on stdout that says why, and nothing unmeasured.
    let r = run(
        hayate().args([
            "cp",
            "--json",
            "-e",
            &ssh,
            "--remote-path",
            BIN,
            fx.p("f").to_str().unwrap(),
            &fx.remote("g"),
        ]),
        Duration::from_secs(30),
    );
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    let j = r.json();
    let e = j["error"].as_str().unwrap_or_default().to_lowercase();
    assert!(
        e.contains("ssh to 127.0.0.1 failed") && e.contains("permission denied"),
        "{j}"
    );
    assert!(
        j.get("bytes").is_none() && j.get("srtt_ms").is_none(),
        "{j}"
    );
}

#[test]
fn no_space_left_fails_without_presenting_anything_as_complete() {
    let fx = fx!();
    let mnt = fx.p("small");
    fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        common::sshd::skip_unless_ci("cannot mount a small tmpfs (needs root)");
        return;
    }
    struct Mnt(PathBuf);
    impl Drop for Mnt {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _m = Mnt(mnt.clone());
    write(&fx.p("big"), 16 << 20, 3);
    let r = fx.cp(&[fx.p("big").to_str().unwrap(), &fx.remote("small/")]);
    assert!(!r.ok());
    assert!(r.stderr.to_lowercase().contains("space"), "{}", r.stderr);
    assert!(
        !mnt.join("big").exists(),
        "no truncated file under the final name"
    );
    assert!(
        !mnt.join(".big.hayate-part").exists(),
        "a full disk is not left full: {}",
        r.stderr
    );
    // The space is free again for the next copy.
    write(&fx.p("tiny"), 100_000, 4);
    fx.cp(&[fx.p("tiny").to_str().unwrap(), &fx.remote("small/")])
        .assert_ok();
    assert_eq!(
        fs::read(fx.p("tiny")).unwrap(),
        fs::read(mnt.join("tiny")).unwrap()
    );
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: plain mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

fn is_fifo(path: &Path) -> bool {
    std::os::unix::fs::FileTypeExt::is_fifo(&fs::symlink_metadata(path).unwrap().file_type())
}

/// The null device (1, 3) and nothing else: a type, numbers and mode never changed.
fn assert_null_device(path: &Path) {
    let m = fs::symlink_metadata(path).unwrap();
    assert!(
        std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type()),
        "{} is no longer a device",
        path.display()
    );
    assert_eq!(m.rdev(), libc::makedev(1, 3), "{}", path.display());
}

#[test]
fn dev_null_fifos_and_links_as_destinations_both_ways() {
    let fx = fx!();
    write(&fx.p("a.bin"), 3_000_001, 7);
    let data = fs::read(fx.p("a.bin")).unwrap();
    let a = fx.p("a.bin").display().to_string();

    // Links, both ways: the target gets the data, the link stays.
    write(&fx.p("far/target.bin"), 10, 1);
    std::os::unix::fs::symlink("target.bin", fx.p("far/ln")).unwrap();
    fx.cp(&[&a, &fx.remote("far/ln")]).assert_ok();
    assert_eq!(fs::read(fx.p("far/target.bin")).unwrap(), data);
    assert!(fs::symlink_metadata(fx.p("far/ln"))
        .unwrap()
        .file_type()
        .is_symlink());
    fs::write(fx.p("here.bin"), b"old").unwrap();
    std::os::unix::fs::symlink("here.bin", fx.p("here-ln")).unwrap();
    let here_ln = fx.p("here-ln").display().to_string();
    fx.cp(&[&fx.remote("far/ln"), &here_ln]).assert_ok();
    assert_eq!(fs::read(fx.p("here.bin")).unwrap(), data);
    assert!(fs::symlink_metadata(fx.p("here-ln"))
        .unwrap()
        .file_type()
        .is_symlink());

    // FIFOs, both ways: read in order, still FIFOs.
    for (name, up) in [("far/fifo", true), ("near-fifo", false)] {
        mkfifo(&fx.p(name));
        let reader = {
            let p = fx.p(name);
            std::thread::spawn(move || fs::read(p).unwrap())
        };
        let r = if up {
            fx.cp(&[&a, &fx.remote(name)])
        } else {
            fx.cp(&[&fx.remote("a.bin"), fx.p(name).to_str().unwrap()])
        };
        r.assert_ok();
        // Checked first: a FIFO replaced by a file leaves its reader waiting for ever.
        assert!(is_fifo(&fx.p(name)), "{name}");
        assert_eq!(reader.join().unwrap(), data, "{name}");
    }

    if !common::sshd::is_root() {
        common::sshd::skip_unless_ci("writing to /dev/null and making a device need root");
        return;
    }
    // A device made here, then the real /dev/null, both ways.
    let null = fx.p("null");
    let c = std::ffi::CString::new(null.to_str().unwrap()).unwrap();
    // SAFETY: plain mknod(2) on a NUL-terminated path.
    let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(made, 0, "mknod");
    let r = fx.cp(&["--json", &a, &fx.remote("null")]);
    r.assert_ok();
    assert_eq!(json(&r)["verified"], true);
    assert_null_device(&null);
    let dev_null = format!("{}:/dev/null", fx.sshd.target());
    fx.cp(&[&a, &dev_null]).assert_ok();
    assert_null_device(Path::new("/dev/null"));
    fx.cp(&[&fx.remote("a.bin"), "/dev/null"]).assert_ok();
    assert_null_device(Path::new("/dev/null"));
    assert!(fs::read_dir("/dev").unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains("hayate")));
}

/// The far side's home, as its ssh session sees it.
fn remote_home(fx: &Fx) -> PathBuf {
    let out = fx
        .sshd
        .command()
        .arg(fx.sshd.target())
        .arg("pwd")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

#[test]
fn tilde_is_the_far_sides_home_both_ways() {
    let fx = fx!();
    let home = remote_home(&fx);
    let literal_before = home.join("~").exists();
    let dir = tempfile::Builder::new()
        .prefix("hayate-tilde-")
        .tempdir_in(&home)
        .unwrap();
    let name = dir
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    write(&fx.p("t.bin"), 100_000, 3);
    let t = fx.p("t.bin").display().to_string();
    let user = fx.sshd.target().split('@').next().unwrap().to_string();
    let host = fx.sshd.target();

    fx.cp(&[&t, &format!("{host}:~/{name}/")]).assert_ok();
    assert_eq!(
        fs::read(dir.path().join("t.bin")).unwrap(),
        fs::read(&t).unwrap()
    );
    fx.cp(&[&t, &format!("{host}:~{user}/{name}/u.bin")])
        .assert_ok();
    assert!(dir.path().join("u.bin").is_file());
    let back = fx.p("back.bin").display().to_string();
    fx.cp(&[&format!("{host}:~/{name}/u.bin"), &back])
        .assert_ok();
    assert_eq!(fs::read(&back).unwrap(), fs::read(&t).unwrap());
    let back2 = fx.p("back2.bin").display().to_string();
    fx.cp(&[&format!("{host}:~{user}/{name}/t.bin"), &back2])
        .assert_ok();
    assert_eq!(fs::read(&back2).unwrap(), fs::read(&t).unwrap());
    // Never a directory named `~`.
    assert_eq!(home.join("~").exists(), literal_before);
    let r = fx.cp(&[&t, &format!("{host}:~no-such-user-hayate/x")]);
    r.assert_failed();
    assert!(
        r.stderr.contains("no such user no-such-user-hayate"),
        "{r:#?}"
    );
}

#[test]
fn missing_parent_directories_are_an_error_both_ways() {
    let fx = fx!();
    write(&fx.p("m.bin"), 1000, 4);
    let m = fx.p("m.bin").display().to_string();
    let r = fx.cp(&[&m, &fx.remote("no/such/m.bin")]);
    r.assert_failed();
    assert_eq!(r.status.code(), Some(1));
    // Said once, by the near side, naming the missing directory.
    assert_eq!(
        r.stderr.trim(),
        format!(
            "hayate: {m}: refused: no such file or directory: {} (parent directory)",
            fx.p("no/such").display()
        ),
        "{r:#?}"
    );
    assert!(!fx.p("no").exists());
    let r = fx.cp(&[
        &fx.remote("m.bin"),
        fx.p("nope/deeper/m.bin").to_str().unwrap(),
    ]);
    r.assert_failed();
    assert!(r.stderr.contains("(parent directory)"), "{r:#?}");
    assert!(!fx.p("nope").exists());
    // -r: the top directory only.
    write(&fx.p("tree/f"), 10, 5);
    let tree = fx.p("tree").display().to_string();
    fx.cp(&["-r", &tree, &fx.remote("x/y/")]).assert_failed();
    assert!(!fx.p("x").exists());
    fx.cp(&["-r", &tree, &fx.remote("top/")]).assert_ok();
    assert!(fx.p("top/tree/f").is_file());
    fx.cp(&["-r", &fx.remote("tree"), fx.p("down/a/b").to_str().unwrap()])
        .assert_failed();
    assert!(!fx.p("down").exists());
}

#[test]
fn hayate_key_file_in_the_environment_is_ignored_over_ssh() {
    let fx = fx!();
    write(&fx.p("k.bin"), 5000, 6);
    let k = fx.p("k.bin").display().to_string();
    let r = run(
        fx.cmd()
            .env("HAYATE_KEY_FILE", fx.p("no-such.key"))
            .args([&k, &fx.remote("k2.bin")]),
        Duration::from_secs(120),
    );
    r.assert_ok();
    assert_eq!(fs::read(fx.p("k2.bin")).unwrap(), fs::read(&k).unwrap());
    // Given on the command line it is still a mistake to point out.
    let r = fx.cp(&["--key-file", "/dev/null", &k, &fx.remote("k3.bin")]);
    r.assert_failed();
    assert!(
        r.stderr.contains("--key-file is for hayate:// servers"),
        "{r:#?}"
    );
}

/// How a source is changed while it is being sent.
#[derive(Debug, Clone, Copy)]
enum Change {
    Append,
    Truncate,
    Overwrite,
}

fn change(path: &Path, how: Change) {
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    match how {
        Change::Append => {
            let len = f.metadata().unwrap().len();
            std::os::unix::fs::FileExt::write_all_at(&f, b"appended", len).unwrap()
        }
        Change::Truncate => f.set_len(f.metadata().unwrap().len() / 2).unwrap(),
        Change::Overwrite => {
            std::os::unix::fs::FileExt::write_all_at(&f, b"overwritten", 1000).unwrap()
        }
    }
}

#[test]
fn a_source_changed_while_sent_fails_both_ways_and_is_never_verified() {
    let fx = fx!();
    for how in [Change::Append, Change::Truncate, Change::Overwrite] {
        for up in [true, false] {
            let (src, dst) = if up {
                (fx.p("near-src.bin"), fx.p("far-dst.bin"))
            } else {
                (fx.p("far-src.bin"), fx.p("near-dst.bin"))
            };
            let _ = fs::remove_file(&dst);
            write(&src, 16 << 20, 9);
            let part = dst.with_file_name(format!(
                ".{}.hayate-part",
                dst.file_name().unwrap().to_str().unwrap()
            ));
            let _ = fs::remove_file(&part);
            let (from, to) = if up {
                (src.display().to_string(), fx.remote("far-dst.bin"))
            } else {
                (fx.remote("far-src.bin"), dst.display().to_string())
            };
            // 16 MiB at 50 Mbit/s: about 3 s, time to change it on the way.
            let running = spawn_cmd(fx.cmd().args(["--json", "--rate", "50M", &from, &to]));
            assert!(
                common::eventually(Duration::from_secs(30), || part.exists()),
                "{how:?} up={up}: the transfer did not start"
            );
            std::thread::sleep(Duration::from_millis(300));
            change(&src, how);
            let r = running.wait(Duration::from_secs(120));
            assert_eq!(r.status.code(), Some(1), "{how:?} up={up}: {r:#?}");
            assert!(
                r.stderr.contains("changed while being sent"),
                "{how:?} up={up}: {r:#?}"
            );
            assert_eq!(json(&r)["verified"], false, "{how:?} up={up}");
            assert!(
                !dst.exists(),
                "{how:?} up={up}: a changed source was put in place"
            );
        }
    }
}

/// An ssh config with a `RemoteCommand` (and a forced terminal) breaks a plain
/// `ssh HOST COMMAND`; hayate starts its far side with scp's options, so the copy works.
/// The identity, the config and an option are given with scp's -i, -F and -o.
#[test]
fn scp_options_reach_ssh_and_a_remote_command_in_the_config_is_overridden() {
    let fx = fx!();
    write(&fx.p("f"), 200_000, 7);
    let cfg = fx.p("ssh_config");
    fs::write(
        &cfg,
        format!(
            "Host *\n  Port {}\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  \
             BatchMode yes\n  LogLevel ERROR\n  RemoteCommand echo hijacked\n  RequestTTY yes\n",
            fx.sshd.port()
        ),
    )
    .unwrap();
    let key = fx.sshd.key().to_str().unwrap().to_string();
    // Without scp's options the config wins and ssh refuses to run our command.
    let plain = Command::new("ssh")
        .args(["-F", cfg.to_str().unwrap(), "-i", &key])
        .args(["-o", "IdentitiesOnly=yes", &fx.sshd.target(), "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!plain.status.success(), "{plain:?}");
    assert!(
        String::from_utf8_lossy(&plain.stderr)
            .contains("Cannot execute command-line and remote command"),
        "{plain:?}"
    );
    let cfg_s = cfg.to_str().unwrap();
    let r = run(
        hayate().args([
            "cp",
            "-F",
            cfg_s,
            "-i",
            &key,
            "-o",
            "IdentitiesOnly=yes",
            "--remote-path",
            BIN,
            "--json",
            fx.p("f").to_str().unwrap(),
            &fx.remote("g"),
        ]),
        Duration::from_secs(60),
    );
    r.assert_ok();
    assert_eq!(fs::read(fx.p("f")).unwrap(), fs::read(fx.p("g")).unwrap());
    assert!(!r.stdout.contains("hijacked"), "{r:#?}");
    // Without the identity the same command is refused: -i is what logged in.
    let r = run(
        hayate().args([
            "cp",
            "-F",
            cfg_s,
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "IdentityFile=/dev/null",
            "--remote-path",
            BIN,
            fx.p("f").to_str().unwrap(),
            &fx.remote("h"),
        ]),
        Duration::from_secs(60),
    );
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(
        r.stderr.to_lowercase().contains("permission denied"),
        "{r:#?}"
    );
    assert!(!fx.p("h").exists());
}

/// -v says what hayate does (the ssh command line, the far side's port, where the data
/// goes) and makes ssh verbose too; -4 and -6 reach ssh.
#[test]
fn verbose_says_what_happens_and_the_address_family_reaches_ssh() {
    let fx = fx!();
    write(&fx.p("f"), 100_000, 8);
    let r = fx.cp(&["-v", "-4", fx.p("f").to_str().unwrap(), &fx.remote("g")]);
    r.assert_ok();
    let err = &r.stderr;
    let running = err
        .lines()
        .find(|l| l.starts_with("hayate: running ssh "))
        .unwrap_or_else(|| panic!("no ssh command line: {err}"));
    for part in [
        " -4 ",
        " -v ",
        " -oRemoteCommand=none ",
        " -oRequestTTY=no ",
        " -x ",
        " -oClearAllForwardings=yes ",
        " serve --stdio --port-range 5301-5399",
    ] {
        assert!(running.contains(part), "{part:?} not in {running}");
    }
    // ssh's own debug output comes through.
    assert!(err.contains("debug1:"), "{err}");
    let port_line = err
        .lines()
        .find(|l| l.starts_with("hayate: the far side listens on UDP port "))
        .unwrap_or_else(|| panic!("{err}"));
    let port: u16 = port_line["hayate: the far side listens on UDP port ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((5301..=5399).contains(&port), "{port_line}");
    assert!(
        err.contains(&format!("hayate: data over UDP to 127.0.0.1:{port}")),
        "{err}"
    );
    assert!(err.contains("hayate: the data went over UDP"), "{err}");
    assert_eq!(fs::read(fx.p("f")).unwrap(), fs::read(fx.p("g")).unwrap());

    // -6 reaches ssh: 127.0.0.1 has no IPv6 address, and ssh says so.
    let r = fx.cp(&["-6", fx.p("f").to_str().unwrap(), &fx.remote("h")]);
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(r.stderr.contains("ssh to 127.0.0.1 failed"), "{r:#?}");
    assert!(!fx.p("h").exists());
}

#[test]
fn remote_glob_copies_every_match_into_a_directory() {
    let fx = fx!();
    write(&fx.p("far/one.fits"), 70_000, 1);
    write(&fx.p("far/two.fits"), 1, 2);
    write(&fx.p("far/three.fit"), 10, 3);
    write(&fx.p("far/.hidden.fits"), 10, 4);
    write(&fx.p("far/sub.fits/inner"), 10, 5);
    fs::create_dir(fx.p("back")).unwrap();
    let back = fx.p("back").display().to_string();
    let r = fx.cp(&["--json", &fx.remote("far/*.fits"), &back]);
    // `sub.fits` is a directory: without -r it fails, named, and the files still arrive.
    r.assert_failed();
    assert!(r.stderr.contains("sub.fits"), "{r:#?}");
    for n in ["one.fits", "two.fits"] {
        assert_eq!(
            fs::read(fx.p(&format!("far/{n}"))).unwrap(),
            fs::read(fx.p(&format!("back/{n}"))).unwrap()
        );
    }
    assert!(!fx.p("back/three.fit").exists(), "not matched");
    assert!(!fx.p("back/.hidden.fits").exists(), "`*` skips dot files");

    // With -r the directory comes too; `?` and `[...]` work as in a shell.
    fs::remove_dir_all(fx.p("back")).unwrap();
    fs::create_dir(fx.p("back")).unwrap();
    fx.cp(&["-r", &fx.remote("far/[os]*.fit?"), &back])
        .assert_ok();
    assert_eq!(
        tree(&fx.p("back")),
        ["one.fits", "sub.fits", "sub.fits/inner"]
    );

    // Several matches need a directory as the destination.
    let r = fx.cp(&[&fx.remote("far/*.fits"), fx.p("file").to_str().unwrap()]);
    r.assert_failed();
    assert!(r.stderr.contains("not a directory"), "{r:#?}");
}

#[test]
fn remote_glob_with_no_match_is_an_error_naming_the_pattern() {
    let fx = fx!();
    fs::create_dir(fx.p("far")).unwrap();
    write(&fx.p("far/a.txt"), 10, 1);
    let pattern = fx.remote("far/*.fits");
    let r = fx.cp(&["--json", &pattern, fx.p("").to_str().unwrap()]);
    r.assert_failed();
    let want = format!("{}: no match", fx.p("far/*.fits").display());
    assert!(r.stderr.contains(&want), "{want:?} in {r:#?}");
    assert_eq!(json(&r)["verified"], false);
    // A pattern in a directory that is not there names the directory.
    let r = fx.cp(&[&fx.remote("nodir/*.fits"), fx.p("").to_str().unwrap()]);
    r.assert_failed();
    assert!(r.stderr.contains("nodir"), "{r:#?}");
}

#[test]
fn remote_glob_is_expanded_by_the_far_side_never_a_shell() {
    let fx = fx!();
    // Names a shell would act on, and a sentinel they would remove or create.
    fs::create_dir_all(fx.p("far/x")).unwrap();
    let names = [
        "a;rm -rf x",
        "$(touch pwned)",
        "b*c",
        "`touch pwned2`",
        "q'\"z",
    ];
    for (i, n) in names.iter().enumerate() {
        write(&fx.p(&format!("far/{n}")), 1000 + i, i as u8);
    }
    fs::create_dir(fx.p("back")).unwrap();
    let back = fx.p("back").display().to_string();
    fx.cp(&[&fx.remote("far/*"), &back]).assert_failed(); // far/x is a directory (no -r)
    for n in names {
        assert_eq!(
            fs::read(fx.p(&format!("far/{n}"))).unwrap(),
            fs::read(fx.p(&format!("back/{n}"))).unwrap(),
            "{n}"
        );
    }
    assert!(fx.p("far/x").is_dir(), "nothing ran `rm -rf x`");
    let home = remote_home(&fx);
    for p in [
        fx.p("pwned"),
        fx.p("far/pwned"),
        home.join("pwned"),
        home.join("pwned2"),
    ] {
        assert!(!p.exists(), "{} was created", p.display());
    }
    // A pattern made of shell syntax is only a pattern; `\*` matches a literal `*`.
    fs::remove_dir_all(fx.p("back")).unwrap();
    fs::create_dir(fx.p("back")).unwrap();
    fx.cp(&[&fx.remote("far/b\\*?"), &back]).assert_ok();
    assert_eq!(tree(&fx.p("back")), ["b*c"]);
    fx.cp(&[&fx.remote("far/$(touch pwned)*"), &back])
        .assert_ok();
    assert_eq!(tree(&fx.p("back")), ["$(touch pwned)", "b*c"]);
    assert!(!home.join("pwned").exists() && !fx.p("pwned").exists());
}

#[test]
fn remote_glob_after_tilde_is_in_the_far_sides_home() {
    let fx = fx!();
    let home = remote_home(&fx);
    let dir = tempfile::Builder::new()
        .prefix("hayate-glob-")
        .tempdir_in(&home)
        .unwrap();
    let name = dir.path().file_name().unwrap().to_str().unwrap();
    write(&dir.path().join("logs/a.log"), 5000, 1);
    write(&dir.path().join("logs/b.log"), 6000, 2);
    write(&dir.path().join("logs/c.txt"), 10, 3);
    fs::create_dir(fx.p("dst")).unwrap();
    let dst = format!("{}/", fx.p("dst").display());
    let src = format!("{}:~/{name}/logs/*.log", fx.sshd.target());
    fx.cp(&[&src, &dst]).assert_ok();
    assert_eq!(tree(&fx.p("dst")), ["a.log", "b.log"]);
    assert_eq!(
        fs::read(dir.path().join("logs/b.log")).unwrap(),
        fs::read(fx.p("dst/b.log")).unwrap()
    );
}

/// Runs `cmd` with `input` on its stdin; its stdout as bytes, stderr as text, exit code.
fn run_piped(cmd: &mut Command, input: Vec<u8>) -> (Vec<u8>, String, Option<i32>) {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    (
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

#[test]
fn stdin_to_remote_and_remote_to_stdout_round_trip() {
    let fx = fx!();
    fs::create_dir(fx.p("far")).unwrap();
    for (len, seed) in [(5_000_003usize, 1u64), (0, 2), (1, 3)] {
        let data = random_bytes(len, seed);
        let (out, err, code) =
            run_piped(fx.cmd().args(["-", &fx.remote("far/up.bin")]), data.clone());
        assert_eq!(code, Some(0), "{len}: {err}");
        assert!(out.is_empty(), "nothing on stdout: {out:?}");
        assert!(
            fs::read(fx.p("far/up.bin")).unwrap() == data,
            "{len}: stdin -> remote"
        );
        // Made as a new file is made there, not with the spool file's 0600.
        let mode = fs::metadata(fx.p("far/up.bin")).unwrap().mode() & 0o777;
        assert_ne!(mode, 0o600, "{mode:o}");

        let (out, err, code) =
            run_piped(fx.cmd().args([&fx.remote("far/up.bin"), "-"]), Vec::new());
        assert_eq!(code, Some(0), "{len}: {err}");
        assert_eq!(out.len(), data.len(), "{len}: {err}");
        assert!(out == data, "{len}: remote -> stdout differs");
        assert!(!err.contains("hayate-part"), "{err}");
    }
    // Standard output redirected to a file opened for appending: written after what is
    // there, at the file's offset, never a temp file renamed over it.
    let data = random_bytes(300_001, 9);
    fs::write(fx.p("far/up.bin"), &data).unwrap();
    fs::write(fx.p("log"), b"head\n").unwrap();
    let log = fs::OpenOptions::new()
        .append(true)
        .open(fx.p("log"))
        .unwrap();
    let st = fx
        .cmd()
        .args([&fx.remote("far/up.bin"), "-"])
        .stdout(log)
        .status()
        .unwrap();
    assert!(st.success());
    let mut want = b"head\n".to_vec();
    want.extend(&data);
    assert!(
        fs::read(fx.p("log")).unwrap() == want,
        "appended to stdout's file"
    );
    // No temp file was left beside the destination, nor in the local directory.
    assert_eq!(tree(&fx.p("far")), ["up.bin"]);
    assert!(!fx.p("-").exists(), "stdout is not a file named -");
}

#[test]
fn stdin_and_stdout_refuse_what_they_cannot_do() {
    let fx = fx!();
    fs::create_dir(fx.p("far")).unwrap();
    write(&fx.p("far/f"), 10, 1);
    // Standard input has no name to put in a directory.
    let (_, err, code) = run_piped(fx.cmd().args(["-", &fx.remote("far")]), b"x".to_vec());
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("needs a file name"), "{err}");
    assert!(!fx.p("far/-").exists());
    for args in [
        vec!["--json".to_string(), fx.remote("far/f"), "-".into()],
        vec!["-r".to_string(), fx.remote("far"), "-".into()],
        vec![fx.remote("far/f"), fx.remote("far/f"), "-".into()],
        vec![fx.remote("far/*"), "-".into()],
        vec![
            "-".into(),
            fx.p("far/f").display().to_string(),
            fx.remote("far/"),
        ],
    ] {
        let (_, err, code) = run_piped(fx.cmd().args(&args), Vec::new());
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains("standard "), "{args:?}: {err}");
    }
    // A missing source to stdout fails, with nothing written.
    let (out, err, code) = run_piped(fx.cmd().args([&fx.remote("far/nope"), "-"]), Vec::new());
    assert_eq!(code, Some(1), "{err}");
    assert!(out.is_empty());
    assert!(err.contains("nope"), "{err}");
}

#[test]
fn stdout_copy_that_fails_verification_exits_1() {
    let fx = fx!();
    write(&fx.p("far-src.bin"), 32 << 20, 4);
    let out = fs::File::create(fx.p("out.bin")).unwrap();
    // 32 MiB at 50 Mbit/s: about 5 s, time to change the source on the way.
    let child = fx
        .cmd()
        .args(["--rate", "50M", &fx.remote("far-src.bin"), "-"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        common::eventually(Duration::from_secs(30), || fs::metadata(fx.p("out.bin"))
            .is_ok_and(|m| m.len() > 0)),
        "nothing reached stdout"
    );
    change(&fx.p("far-src.bin"), Change::Overwrite);
    let r = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert!(err.contains("changed while being sent"), "{err}");
    assert!(!err.contains("verified in"), "{err}");
}
