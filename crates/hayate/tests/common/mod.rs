//! Helpers for driving the real `hayate` binary on loopback: a server per test (killed on
//! drop, also on panic), client runs with a deadline, file generation and hashing.

#![allow(dead_code)]

pub mod sshd;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_hayate");

/// A command for the binary with a clean environment as far as hayate is concerned: no
/// key file from the environment, and the paths `cp` remembers kept out of the user's own
/// cache (in a directory of this test process's, see [`test_cache_home`]).
pub fn hayate() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("HAYATE_KEY_FILE")
        .env_remove("RUST_LOG")
        .env("XDG_CACHE_HOME", test_cache_home());
    c
}

/// This test process's `XDG_CACHE_HOME` for hayate (see [`hayate`]): under the target
/// directory's scratch space, which `cargo clean` empties, not the system's temp dir.
pub fn test_cache_home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hayate-test-cache-{}", std::process::id()))
}

/// A UDP port on 127.0.0.1 that was free a moment ago (the caller must cope with a race).
pub fn free_udp_port() -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    s.local_addr().expect("local addr").port()
}

/// Writes a fresh key with `hayate keygen` and returns its path.
pub fn keygen(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let out = hayate()
        .args(["keygen", "--out"])
        .arg(&path)
        .output()
        .expect("run keygen");
    assert!(out.status.success(), "keygen failed: {out:?}");
    path
}

/// Lines a child wrote to a pipe so far, collected by a background thread.
#[derive(Clone, Default)]
pub struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn collect(pipe: impl Read + Send + 'static) -> Self {
        let lines = Lines::default();
        let l = lines.clone();
        thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                match line {
                    Ok(line) => l.0.lock().unwrap().push(line),
                    Err(_) => break,
                }
            }
        });
        lines
    }
    pub fn snapshot(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    pub fn text(&self) -> String {
        self.snapshot().join("\n")
    }
    pub fn contains(&self, needle: &str) -> bool {
        self.snapshot().iter().any(|l| l.contains(needle))
    }
}

/// A running `hayate serve` on 127.0.0.1, killed (SIGKILL) when dropped.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    pub root: PathBuf,
    pub key: PathBuf,
    pub log: Lines,
}

impl Server {
    /// Starts a server on a free port serving `root` with `key`, and waits until it says
    /// "listening on". Retries with another port if the one picked was taken meanwhile.
    pub fn start(root: &Path, key: &Path) -> Server {
        Self::start_with_env(root, key, &[])
    }

    /// [`Server::start`] with these environment variables set for the server.
    pub fn start_with_env(root: &Path, key: &Path, env: &[(&str, &Path)]) -> Server {
        Self::start_with(root, key, env, &[])
    }

    /// [`Server::start`] with these environment variables and options for the server.
    pub fn start_with(root: &Path, key: &Path, env: &[(&str, &Path)], args: &[&str]) -> Server {
        Self::start_listening(root, key, env, args, |port| {
            vec!["--listen".into(), format!("127.0.0.1:{port}")]
        })
    }

    /// [`Server::start_with`], told where to listen by `listen(port)` instead of `--listen
    /// 127.0.0.1:PORT` (it must still take loopback datagrams at that port).
    pub fn start_listening(
        root: &Path,
        key: &Path,
        env: &[(&str, &Path)],
        args: &[&str],
        listen: impl Fn(u16) -> Vec<String>,
    ) -> Server {
        let mut last_log = String::new();
        for _attempt in 0..5 {
            let port = free_udp_port();
            let mut child = hayate()
                .envs(env.iter().copied())
                .arg("serve")
                .args(listen(port))
                .arg("--root")
                .arg(root)
                .arg("--key-file")
                .arg(key)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn hayate serve");
            let log = Lines::collect(child.stderr.take().expect("stderr piped"));
            let mut server = Server {
                child: Some(child),
                port,
                root: root.to_path_buf(),
                key: key.to_path_buf(),
                log,
            };
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if server.log.contains("listening on") {
                    return server;
                }
                let exited = server.child.as_mut().unwrap().try_wait().expect("try_wait");
                if let Some(status) = exited {
                    // Give the reader thread a moment to collect the last words.
                    thread::sleep(Duration::from_millis(50));
                    last_log = server.log.text();
                    server.child = None;
                    assert!(
                        last_log.contains("cannot listen"),
                        "hayate serve exited ({status}) before listening:\n{last_log}"
                    );
                    break; // port race: try another one
                }
                assert!(
                    Instant::now() < deadline,
                    "hayate serve did not print \"listening on\" within 20 s:\n{}",
                    server.log.text()
                );
                thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("could not start hayate serve on a free port:\n{last_log}");
    }

    /// `hayate://127.0.0.1:PORT/<path>`
    pub fn url(&self, path: &str) -> String {
        format!("hayate://127.0.0.1:{}/{}", self.port, path)
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("server running").id() as i32
    }

    /// Sends `sig` and waits (up to `within`) for the server to exit; returns its status.
    pub fn signal_and_wait(&mut self, sig: i32, within: Duration) -> ExitStatus {
        signal(self.pid(), sig);
        let mut child = self.child.take().expect("server running");
        match wait_until(&mut child, Instant::now() + within) {
            Some(st) => st,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "hayate serve did not exit within {within:?} of signal {sig}:\n{}",
                    self.log.text()
                );
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: plain kill(2) on a child we spawned and have not reaped.
    let r = unsafe { libc::kill(pid, sig) };
    assert_eq!(r, 0, "kill({pid}, {sig}) failed");
}

fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// What a finished client run printed.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn ok(&self) -> bool {
        self.status.success()
    }
    /// Panics (showing everything) unless the run succeeded.
    pub fn assert_ok(&self) -> &Self {
        assert!(self.ok(), "hayate failed: {self:#?}");
        self
    }
    pub fn assert_failed(&self) -> &Self {
        assert!(
            !self.ok(),
            "hayate should have failed but exited 0: {self:#?}"
        );
        self
    }
    /// The one JSON object on stdout (fails if there is anything else there).
    pub fn json(&self) -> serde_json::Value {
        let mut it = serde_json::Deserializer::from_str(&self.stdout).into_iter();
        let v: serde_json::Value = it
            .next()
            .unwrap_or_else(|| panic!("no JSON on stdout: {self:#?}"))
            .unwrap_or_else(|e| panic!("bad JSON on stdout ({e}): {self:#?}"));
        assert!(
            it.next().is_none(),
            "more than one JSON value on stdout: {self:#?}"
        );
        assert!(v.is_object(), "JSON on stdout is not an object: {self:#?}");
        v
    }
}

/// A running client (or any hayate command) whose output is collected in the background.
pub struct Running {
    child: Option<Child>,
    stdout: Lines,
    stderr: Lines,
    started: Instant,
}

impl Running {
    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> &Lines {
        &self.stderr
    }
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }
    pub fn try_finished(&mut self) -> bool {
        self.child
            .as_mut()
            .expect("running")
            .try_wait()
            .expect("try_wait")
            .is_some()
    }
    /// Waits up to `timeout` for the process to exit (killing it and panicking otherwise).
    pub fn wait(mut self, timeout: Duration) -> Run {
        let mut child = self.child.take().expect("running");
        let status = match wait_until(&mut child, self.started + timeout) {
            Some(st) => st,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                thread::sleep(Duration::from_millis(50));
                panic!(
                    "hayate did not finish within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                    self.stdout.text(),
                    self.stderr.text()
                );
            }
        };
        let elapsed = self.started.elapsed();
        // The pipes close when the process exits; let the readers drain them.
        let until = Instant::now() + Duration::from_secs(2);
        while Arc::strong_count(&self.stdout.0) + Arc::strong_count(&self.stderr.0) > 2
            && Instant::now() < until
        {
            thread::sleep(Duration::from_millis(5));
        }
        Run {
            status,
            stdout: join_lines(&self.stdout),
            stderr: join_lines(&self.stderr),
            elapsed,
        }
    }
}

fn join_lines(l: &Lines) -> String {
    let mut s = l.text();
    if !s.is_empty() {
        s.push('\n');
    }
    s
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `hayate ARGS...` in the background.
pub fn spawn<I, S>(args: I) -> Running
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    spawn_cmd(hayate().args(args))
}

pub fn spawn_cmd(cmd: &mut Command) -> Running {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hayate");
    let stdout = Lines::collect(child.stdout.take().expect("stdout piped"));
    let stderr = Lines::collect(child.stderr.take().expect("stderr piped"));
    Running {
        child: Some(child),
        stdout,
        stderr,
        started: Instant::now(),
    }
}

/// Runs `hayate ARGS...` to completion (at most 60 s).
pub fn run<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    spawn(args).wait(Duration::from_secs(60))
}

/// `hayate cp --key-file KEY ARGS...` to completion.
pub fn cp<S: AsRef<std::ffi::OsStr>>(key: &Path, args: &[S]) -> Run {
    let mut cmd = hayate();
    cmd.arg("cp").arg("--key-file").arg(key).args(args);
    spawn_cmd(&mut cmd).wait(Duration::from_secs(60))
}

/// Writes `len` pseudo-random bytes (a BLAKE3 XOF stream keyed by `seed`) to `path` and
/// returns their BLAKE3 hash.
pub fn write_random(path: &Path, len: u64, seed: u64) -> blake3::Hash {
    let mut xof = blake3::Hasher::new()
        .update(&seed.to_le_bytes())
        .update(b"hayate loopback test data")
        .finalize_xof();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create test file"));
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        xof.fill(&mut buf[..n]);
        h.update(&buf[..n]);
        f.write_all(&buf[..n]).expect("write test file");
        left -= n as u64;
    }
    f.flush().expect("flush test file");
    h.finalize()
}

/// BLAKE3 of a file's contents.
pub fn hash_file(path: &Path) -> blake3::Hash {
    let mut f =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize()
}

/// Every entry beneath `dir` (relative paths, sorted), following no symlinks.
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().display().to_string());
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                walk(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Any `.hayate-part` file beneath `dir`.
pub fn part_files(dir: &Path) -> Vec<String> {
    tree(dir)
        .into_iter()
        .filter(|p| p.ends_with(".hayate-part"))
        .collect()
}

/// Polls `cond` every 10 ms until it holds or `within` passes; returns whether it held.
pub fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// The names of process `pid`'s threads.
pub fn thread_names(pid: i32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect()
}
