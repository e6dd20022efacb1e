//! `hayate tunnel` as ssh's ProxyCommand, through a real OpenSSH server on loopback (started
//! per test with throwaway keys): commands and exit statuses, rsync, scp and sftp byte-exact,
//! an interactive session, a slow reader, far-side errors, the UDP-blocked fallback.
//! Skipped, saying so, where sshd cannot run.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
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
        format!(
            "{} -o {}",
            self.sshd.ssh_command(),
            q(&format!("ProxyCommand={}", self.proxy(extra)))
        )
    }

    fn target(&self) -> String {
        self.sshd.target()
    }
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
    let (tx, rx) = mpsc::channel();
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
            let _ = tx.send(());
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
