//! `hayate tunnel` as ssh's ProxyCommand, through a real OpenSSH server on loopback (started
//! per test with throwaway keys): commands and exit statuses, rsync, scp and sftp byte-exact,
//! an interactive session, a slow reader, far-side errors, a broken standard output or an
//! unreadable standard input (over UDP and in the fallback), the UDP-blocked fallback.
//! Skipped, saying so, where sshd cannot run.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::sshd::{skip_unless_ci, Sshd};
use common::BIN;

struct Fx {
    sshd: Sshd,
    dir: tempfile::TempDir,
}

/// Single-quotes for a shell.
fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
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

    /// The ProxyCommand: `hayate tunnel` with the test's ssh options and `extra` options.
    fn proxy(&self, extra: &str) -> String {
        format!(
            "{} tunnel -e {} --remote-path {} {extra} %h %p",
            q(BIN),
            q(&self.sshd.ssh_command()),
            q(BIN)
        )
    }

    /// ssh (the test's options) through the tunnel.
    fn ssh(&self, extra: &str) -> Command {
        let mut c = self.sshd.command();
        c.arg("-o")
            .arg(format!("ProxyCommand={}", self.proxy(extra)));
        c
    }

    /// The `-e`/`--rsh` value for rsync and the option list for scp/sftp.
    fn rsh(&self, extra: &str) -> String {
        // rsync splits this itself: quotes, but no backslashes.
        format!(
            "{} -o \"ProxyCommand={}\"",
            self.sshd.ssh_command(),
            self.proxy(extra)
        )
    }

    fn target(&self) -> String {
        self.sshd.target()
    }

    /// scp's and sftp's options (they take -P for the port) with the ProxyCommand.
    fn scp_opts(&self, extra: &str) -> Vec<String> {
        let mut v = vec![
            "-P".to_string(),
            self.sshd.port().to_string(),
            "-i".to_string(),
            self.sshd.key().display().to_string(),
        ];
        for o in [
            "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null",
            "BatchMode=yes",
            "LogLevel=ERROR",
            "IdentitiesOnly=yes",
        ] {
            v.push("-o".into());
            v.push(o.into());
        }
        v.push("-o".into());
        v.push(format!("ProxyCommand={}", self.proxy(extra)));
        v
    }

    /// A far side whose UDP port answers nothing: a banner naming a port nobody listens on.
    fn far_side_without_udp(&self) -> PathBuf {
        let fake = self.p("fake-hayate");
        let port = common::free_udp_port();
        fs::write(
            &fake,
            format!(
                "#!/bin/sh\necho 'HAYATE-STDIO {} port={port} key={} addr=127.0.0.1'\nexec cat >/dev/null\n",
                hayate_version(),
                "ab".repeat(32)
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
        fake
    }

    /// `hayate tunnel` for `port` whose UDP gets no answer within a second: the TCP fallback.
    fn tunnel_without_udp(&self, port: u16) -> Command {
        let fake = self.far_side_without_udp();
        let mut c = Command::new(BIN);
        c.arg("tunnel")
            .arg("-e")
            .arg(self.sshd.ssh_command())
            .arg("--remote-path")
            .arg(fake)
            .arg("--udp-timeout")
            .arg("1")
            .arg("--ssh-port")
            .arg(self.sshd.port().to_string())
            .arg("127.0.0.1")
            .arg(port.to_string());
        c
    }

    /// `hayate tunnel` itself, as ssh would run it, for `port` on the far side.
    fn tunnel(&self, port: u16) -> Command {
        let mut c = Command::new(BIN);
        c.arg("tunnel")
            .arg("-e")
            .arg(self.sshd.ssh_command())
            .arg("--remote-path")
            .arg(BIN)
            .arg("--ssh-port")
            .arg(self.sshd.port().to_string())
            .arg("127.0.0.1")
            .arg(port.to_string());
        c
    }
}

/// The pid of `parent`'s child process (ssh's ProxyCommand: the tunnel).
fn child_of(parent: u32) -> Option<u32> {
    let kids = fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).ok()?;
    kids.split_whitespace().next()?.parse().ok()
}

/// Resident memory of `pid`, bytes.
fn rss(pid: u32) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

macro_rules! fx {
    () => {
        match Fx::new() {
            Some(f) => f,
            None => return,
        }
    };
}

fn run(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t1 = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t2 = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} did not finish within {limit:?}; stderr: {}",
                String::from_utf8_lossy(&t2.join().unwrap())
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: t1.join().unwrap(),
        stderr: t2.join().unwrap(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

fn write(path: &Path, len: usize, seed: u8) {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[i % 4] ^ seed)
        .collect();
    fs::write(path, data).unwrap();
}

fn which(prog: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {prog}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_command_and_its_exit_status() {
    let fx = fx!();
    let mut c = fx.ssh("");
    c.arg(fx.target()).arg("echo through the tunnel; exit 7");
    let out = run(c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(7), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "through the tunnel\n");
    // Nothing about the tunnel on stderr when all goes well.
    assert!(
        !text(&out.stderr).contains("hayate"),
        "stderr: {}",
        text(&out.stderr)
    );
}

#[test]
fn rsync_and_scp_and_sftp_are_byte_exact() {
    let fx = fx!();
    write(&fx.p("big.bin"), 20_000_003, 3);
    fs::create_dir(fx.p("far")).unwrap();
    let far = |rel: &str| format!("{}:{}", fx.target(), fx.p(rel).display());
    if which("rsync") {
        let mut c = Command::new("rsync");
        c.arg("-a")
            .arg("-e")
            .arg(fx.rsh(""))
            .arg(fx.p("big.bin"))
            .arg(far("far/rsynced.bin"));
        let out = run(c, Duration::from_secs(120));
        assert!(out.status.success(), "rsync: {}", text(&out.stderr));
        assert!(fs::read(fx.p("big.bin")).unwrap() == fs::read(fx.p("far/rsynced.bin")).unwrap());
        // And back.
        let mut c = Command::new("rsync");
        c.arg("-a")
            .arg("-e")
            .arg(fx.rsh(""))
            .arg(far("far/rsynced.bin"))
            .arg(fx.p("back-rsync.bin"));
        let out = run(c, Duration::from_secs(120));
        assert!(out.status.success(), "rsync back: {}", text(&out.stderr));
        assert!(fs::read(fx.p("big.bin")).unwrap() == fs::read(fx.p("back-rsync.bin")).unwrap());
    } else {
        skip_unless_ci("rsync is missing (apt-get install rsync)");
    }
    let mut c = Command::new("scp");
    c.args(fx.scp_opts(""))
        .arg(fx.p("big.bin"))
        .arg(far("far/scped.bin"));
    let out = run(c, Duration::from_secs(120));
    assert!(out.status.success(), "scp: {}", text(&out.stderr));
    assert!(fs::read(fx.p("big.bin")).unwrap() == fs::read(fx.p("far/scped.bin")).unwrap());
    let mut c = Command::new("scp");
    c.args(fx.scp_opts(""))
        .arg(far("far/scped.bin"))
        .arg(fx.p("back-scp.bin"));
    let out = run(c, Duration::from_secs(120));
    assert!(out.status.success(), "scp back: {}", text(&out.stderr));
    assert!(fs::read(fx.p("big.bin")).unwrap() == fs::read(fx.p("back-scp.bin")).unwrap());
    // sftp, driven by a batch file.
    let batch = fx.p("batch");
    fs::write(
        &batch,
        format!(
            "get {} {}\n",
            fx.p("far/scped.bin").display(),
            fx.p("back-sftp.bin").display()
        ),
    )
    .unwrap();
    let mut c = Command::new("sftp");
    c.args(fx.scp_opts(""))
        .arg("-b")
        .arg(&batch)
        .arg(fx.target());
    let out = run(c, Duration::from_secs(120));
    assert!(out.status.success(), "sftp: {}", text(&out.stderr));
    assert!(fs::read(fx.p("big.bin")).unwrap() == fs::read(fx.p("back-sftp.bin")).unwrap());
}

#[test]
fn an_interactive_session_driven_by_a_script() {
    let fx = fx!();
    let mut c = fx.ssh("");
    c.arg(fx.target()).arg("sh");
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // The first answer waits for ssh's login; the others are a round trip each.
    writeln!(input, "echo ready").unwrap();
    assert_eq!(lines.next().expect("a line back").unwrap(), "ready");
    let mut took = Vec::new();
    for i in 0..50 {
        let t = Instant::now();
        writeln!(input, "echo line-{i}").unwrap();
        input.flush().unwrap();
        let got = lines.next().expect("a line back").unwrap();
        assert_eq!(got, format!("line-{i}"));
        took.push(t.elapsed());
    }
    took.sort();
    println!(
        "echo round trips: median {:?}, worst {:?}",
        took[25], took[49]
    );
    writeln!(input, "exit 3").unwrap();
    drop(input);
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(3));
    // Loopback: a round trip through both ends, a shell and back in milliseconds (a
    // debug build on a busy host: generous bounds).
    assert!(took[25] < Duration::from_millis(100), "{took:?}");
    assert!(took[49] < Duration::from_secs(1), "{took:?}");
}

#[test]
fn slow_readers_on_either_side_lose_nothing_and_bound_memory() {
    let fx = fx!();
    const N: usize = 64 << 20;
    // Download: the far side writes 64 MiB, we read nothing for 3 s, then all of it.
    let mut c = fx.ssh("");
    c.arg(fx.target())
        .arg(format!("head -c {N} /dev/zero | tr '\\0' 'x'"));
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_secs(3));
    let peak = child_of(child.id()).map_or(0, rss);
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0usize;
    loop {
        let k = out.read(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        assert!(buf[..k].iter().all(|&b| b == b'x'));
        n += k;
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(n, N);
    assert!(
        peak < 200 << 20,
        "tunnel RSS {peak} while its reader stalled"
    );

    // Upload: we write 64 MiB, the far side reads nothing for 3 s.
    let dest = fx.p("up.bin");
    let mut c = fx.ssh("");
    c.arg(fx.target())
        .arg(format!("sleep 3; cat > {}", dest.display()));
    let mut child = c
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut input = child.stdin.take().unwrap();
    let writer = thread::spawn(move || {
        let chunk = vec![b'y'; 1 << 20];
        for _ in 0..64 {
            input.write_all(&chunk).unwrap();
        }
    });
    thread::sleep(Duration::from_secs(2));
    let peak = child_of(pid).map_or(0, rss);
    writer.join().unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(fs::metadata(&dest).unwrap().len(), N as u64);
    assert!(
        peak < 200 << 20,
        "tunnel RSS {peak} while the far reader stalled"
    );
}

#[test]
fn far_side_errors_are_clear() {
    let fx = fx!();
    // A port nothing listens on, on the far side.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let out = run(fx.tunnel(closed), Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "connection refused by 127.0.0.1:{closed} on the far side"
        )),
        "{err}"
    );
    // No hayate there.
    let mut c = fx.sshd.command();
    c.arg("-o")
        .arg(format!(
            "ProxyCommand={} tunnel -e {} --remote-path /nonexistent/hayate %h %p",
            q(BIN),
            q(&fx.sshd.ssh_command())
        ))
        .arg(fx.target())
        .arg("true");
    let out = run(c, Duration::from_secs(60));
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("hayate is not installed on 127.0.0.1"),
        "{err}"
    );
}

/// Waits for `child` (its stderr piped) to exit within 30 s, killing it and failing if it
/// does not: its status and what it said on stderr.
fn exit_within_limit(mut child: std::process::Child) -> (std::process::ExitStatus, String) {
    let mut err = child.stderr.take().unwrap();
    let t = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let limit = Duration::from_secs(30);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the tunnel ran on for {limit:?}; stderr: {}",
                text(&t.join().unwrap())
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    (status, text(&t.join().unwrap()))
}

/// Runs `cmd` (a tunnel) with its standard output closed at once and its standard input
/// held open; its exit status and stderr.
fn with_broken_stdout(mut cmd: Command) -> (std::process::ExitStatus, String) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdin = child.stdin.take();
    drop(child.stdout.take());
    let r = exit_within_limit(child);
    drop(stdin);
    r
}

/// Runs `cmd` (a tunnel) with a standard input that cannot be read (`/dev/null` opened
/// only for writing); its exit status and stderr.
fn with_unreadable_stdin(mut cmd: Command) -> (std::process::ExitStatus, String) {
    let wronly = fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap();
    let mut child = cmd
        .stdin(Stdio::from(wronly))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take();
    let r = exit_within_limit(child);
    drop(stdout);
    r
}

/// The tunnel's standard output breaks while its standard input stays open (sshd's banner,
/// the first thing it says, cannot be written): the tunnel ends at once, saying why in one
/// line, with a failure status, instead of running on until a signal.
#[test]
fn a_broken_standard_output_is_a_clear_error() {
    let fx = fx!();
    let (status, err) = with_broken_stdout(fx.tunnel(fx.sshd.port()));
    assert_eq!(status.code(), Some(1), "stderr: {err}");
    assert!(err.contains("cannot write to standard output"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Standard input cannot be read (an fd open only for writing): the tunnel ends at once with
/// that error in one line and a failure status, rather than taking it for ssh's end.
#[test]
fn a_failed_read_of_standard_input_is_a_clear_error() {
    let fx = fx!();
    let (status, err) = with_unreadable_stdin(fx.tunnel(fx.sshd.port()));
    assert_eq!(status.code(), Some(1), "stderr: {err}");
    assert!(err.contains("cannot read standard input"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Where UDP gets no answer the stream goes over TCP; its standard output breaking while
/// standard input stays open ends it at once, naming standard output (not the connection,
/// which was made), with a failure status.
#[test]
fn a_broken_standard_output_in_the_tcp_fallback_is_a_clear_error() {
    let fx = fx!();
    let (status, err) = with_broken_stdout(fx.tunnel_without_udp(fx.sshd.port()));
    assert_eq!(status.code(), Some(1), "stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].contains("over TCP instead"), "{err}");
    assert!(
        lines[1].contains("cannot write to standard output"),
        "{err}"
    );
    assert!(!err.contains("cannot connect"), "{err}");
}

/// The TCP fallback's standard input cannot be read: one line naming it, a failure status,
/// at once.
#[test]
fn a_failed_read_of_standard_input_in_the_tcp_fallback_is_a_clear_error() {
    let fx = fx!();
    let (status, err) = with_unreadable_stdin(fx.tunnel_without_udp(fx.sshd.port()));
    assert_eq!(status.code(), Some(1), "stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[1].contains("cannot read standard input"), "{err}");
    assert!(!err.contains("cannot connect"), "{err}");
}

#[test]
fn udp_blocked_falls_back_to_tcp() {
    let fx = fx!();
    let fake = fx.far_side_without_udp();
    let mut c = fx.sshd.command();
    c.arg("-o")
        .arg(format!(
            "ProxyCommand={} tunnel -e {} --remote-path {} --udp-timeout 1 %h %p",
            q(BIN),
            q(&fx.sshd.ssh_command()),
            q(fake.to_str().unwrap())
        ))
        .arg(fx.target())
        .arg("echo fell back; exit 4");
    let out = run(c, Duration::from_secs(60));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert_eq!(text(&out.stdout), "fell back\n");
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("hayate tunnel"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(said[0].contains("over TCP instead"), "{err}");
}

/// The protocol version this build speaks (the banner's): from a real far side's banner.
fn hayate_version() -> u32 {
    let out = Command::new(BIN)
        .args(["serve", "--stdio", "--port-range", "5301-5399"])
        .stdin(Stdio::null())
        .output()
        .expect("run hayate serve --stdio");
    let line = String::from_utf8_lossy(&out.stdout);
    line.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no banner: {line:?}"))
}
