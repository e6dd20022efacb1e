//! Starting the far side through the user's own `ssh`, as scp, rsync and mosh do.
//!
//! The near side runs `ssh [opts] [user@]host -- hayate serve --stdio`; the far side answers with
//! one banner line on stdout ([`Banner`]) naming the UDP port and a fresh session key. The ssh
//! channel itself stays open: closing our end of its stdin tells the far side to exit, and it can
//! carry the data when UDP does not get through ([`SshChild::channel`]).

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The first word of the banner line.
pub const BANNER_TAG: &str = "HAYATE-STDIO";

/// The far side's first line on stdout after `hayate serve --stdio`:
/// `HAYATE-STDIO 1 port=<udp port> key=<64 hex> addr=<ip or ->\n`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Banner {
    /// The far side's wire protocol version (`hayate_proto::wire::VERSION`); the near side
    /// refuses one that differs from its own.
    pub version: u32,
    /// The UDP port the far side listens on for this one copy.
    pub port: u16,
    /// The fresh session key the far side made for this copy (the PSK of the handshake),
    /// 64 hex digits on the line.
    pub key: [u8; 32],
    /// The far side's address as the ssh connection reached it (from `$SSH_CONNECTION`),
    /// `-` on the line when unknown; the near side then resolves the host name itself.
    pub addr: Option<IpAddr>,
}

impl Banner {
    /// The banner line, with its trailing `\n`.
    pub fn format(&self) -> String {
        let mut key = String::with_capacity(64);
        for b in self.key {
            key.push_str(&format!("{b:02x}"));
        }
        let addr = match self.addr {
            Some(a) => a.to_string(),
            None => "-".to_string(),
        };
        format!(
            "{BANNER_TAG} {} port={} key={key} addr={addr}\n",
            self.version, self.port
        )
    }

    /// Parses a banner line (trailing `\r`/`\n` allowed). Unknown `name=value` fields are
    /// ignored (room for later versions); `port` and `key` are required, `addr` defaults to none.
    pub fn parse(line: &str) -> Result<Banner, String> {
        let line = line.trim_end_matches(['\n', '\r']);
        let mut words = line.split_ascii_whitespace();
        if words.next() != Some(BANNER_TAG) {
            return Err(format!("not a banner (want {BANNER_TAG}): {line:?}"));
        }
        let version: u32 = words
            .next()
            .ok_or_else(|| format!("banner without a version: {line:?}"))?
            .parse()
            .map_err(|_| format!("banner with a bad version: {line:?}"))?;
        let (mut port, mut key, mut addr) = (None, None, None);
        for w in words {
            let Some((name, value)) = w.split_once('=') else {
                return Err(format!("banner field without '=': {w:?}"));
            };
            match name {
                "port" => {
                    let p: u16 = value
                        .parse()
                        .map_err(|_| format!("banner with a bad port: {value:?}"))?;
                    if p == 0 {
                        return Err("banner with port 0".to_string());
                    }
                    port = Some(p);
                }
                "key" => key = Some(parse_hex32(value)?),
                "addr" => {
                    addr = Some(if value == "-" {
                        None
                    } else {
                        Some(
                            value
                                .parse::<IpAddr>()
                                .map_err(|_| format!("banner with a bad addr: {value:?}"))?,
                        )
                    })
                }
                _ => {}
            }
        }
        Ok(Banner {
            version,
            port: port.ok_or_else(|| format!("banner without port=: {line:?}"))?,
            key: key.ok_or_else(|| "banner without key=".to_string())?,
            addr: addr.flatten(),
        })
    }
}

fn parse_hex32(s: &str) -> Result<[u8; 32], String> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return Err(format!(
            "banner key must be 64 hex digits, got {} characters",
            b.len()
        ));
    }
    let nib = |c: u8| -> Result<u8, String> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err("banner key is not hex".to_string()),
        }
    };
    let mut key = [0u8; 32];
    for (i, k) in key.iter_mut().enumerate() {
        *k = nib(b[2 * i])? << 4 | nib(b[2 * i + 1])?;
    }
    Ok(key)
}

/// Reads `$SSH_CONNECTION` ("client_ip client_port server_ip server_port") and returns server_ip.
pub fn ssh_connection_server_ip() -> Option<IpAddr> {
    let v = std::env::var("SSH_CONNECTION").ok()?;
    parse_ssh_connection(&v)
}

fn parse_ssh_connection(v: &str) -> Option<IpAddr> {
    let ip = v.split_ascii_whitespace().nth(2)?;
    // A link-local IPv6 address may carry a zone ("fe80::1%eth0"), which IpAddr does not take.
    let ip = ip.split('%').next()?;
    ip.parse().ok()
}

/// How to reach the far side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshSpec {
    /// `-e/--ssh` command line, split shell-like (e.g. "ssh -p 2222 -i 'my key'"); default ["ssh"].
    pub command: Vec<String>,
    /// More ssh options, placed after `command` (scp's `-i KEY`, `-o OPT`, `-F FILE`, `-4`, `-v`).
    pub options: Vec<String>,
    /// scp's -P → ssh -p
    pub port: Option<u16>,
    /// scp's -J → ssh -J
    pub jump: Option<String>,
    /// Login name on the far side (`user@` of `[user@]host:path`); None leaves it to ssh
    /// (its config, else the local user). Must not start with `-`.
    pub user: Option<String>,
    /// The far side as the user named it (a host name, ssh config alias or address), given
    /// to ssh as is. Must not be empty or start with `-`.
    pub host: String,
    /// Remote command, already a shell command line (the caller quotes).
    pub remote_cmd: String,
}

/// What scp passes to every ssh it starts, for the same reasons: the far side is a program
/// speaking over the channel, so no `RemoteCommand` from ~/.ssh/config may replace it, no
/// terminal may mangle its bytes, and no forwarding or local command belongs to a copy. The
/// user's own options come first (ssh takes the first value given), so `-o` can still
/// override any of these on purpose.
pub const SCP_SSH_OPTIONS: [&str; 7] = [
    "-x",
    "-oPermitLocalCommand=no",
    "-oClearAllForwardings=yes",
    "-oRemoteCommand=none",
    "-oRequestTTY=no",
    "-oControlPersist=no",
    "-oForwardAgent=no",
];

impl SshSpec {
    /// The full argument vector:
    /// `command... options... [-p port] [-J jump] SCP_SSH_OPTIONS... [user@]host -- remote_cmd`.
    pub fn argv(&self) -> Vec<String> {
        let mut v: Vec<String> = if self.command.is_empty() {
            vec!["ssh".to_string()]
        } else {
            self.command.clone()
        };
        v.extend(self.options.iter().cloned());
        if let Some(p) = self.port {
            v.push("-p".to_string());
            v.push(p.to_string());
        }
        if let Some(j) = &self.jump {
            v.push("-J".to_string());
            v.push(j.clone());
        }
        v.extend(SCP_SSH_OPTIONS.iter().map(|o| o.to_string()));
        v.push(match &self.user {
            Some(u) => format!("{u}@{}", self.host),
            None => self.host.clone(),
        });
        v.push("--".to_string());
        v.push(self.remote_cmd.clone());
        v
    }
}

/// Splits a command line the way a POSIX shell would split words: blanks separate words,
/// `'…'` is literal, `"…"` is literal except that `\` escapes `$`, `` ` ``, `"`, `\` and
/// newline, and `\` outside quotes escapes any character. No expansions are done.
pub fn split_command(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => return Err(format!("unterminated ' in {s:?}")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('$' | '`' | '"' | '\\')) => cur.push(c),
                            Some('\n') => {}
                            Some(c) => {
                                cur.push('\\');
                                cur.push(c);
                            }
                            None => return Err(format!("unterminated \" in {s:?}")),
                        },
                        Some(c) => cur.push(c),
                        None => return Err(format!("unterminated \" in {s:?}")),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(c) => {
                    in_word = true;
                    cur.push(c);
                }
                None => return Err(format!("trailing \\ in {s:?}")),
            },
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Quotes `s` for a POSIX shell when needed: returned as is when it has only characters that
/// are never special (`A-Za-z0-9_@%+=:,./-`), otherwise in single quotes (`'` as `'\''`).
pub fn shell_quote(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        return s.to_string();
    }
    let mut q = String::with_capacity(s.len() + 2);
    q.push('\'');
    for c in s.chars() {
        if c == '\'' {
            q.push_str("'\\''");
        } else {
            q.push(c);
        }
    }
    q.push('\'');
    q
}

/// Why the far side could not be started or did not answer with its banner.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    /// The ssh command (named) could not be started, or reading its output failed (the
    /// step named: `poll`, `read from ssh`); or the spec's host or user was unusable.
    #[error("cannot run {0}: {1}")]
    Spawn(String, std::io::Error),
    /// Remote shell said command not found / exit 127 / 126.
    #[error("hayate is not installed on {host} (or not on the PATH of a non-interactive ssh session): install it there, or point to it with --remote-path PATH")]
    HayateMissing {
        /// The far side, as in [`SshSpec::host`].
        host: String,
    },
    /// ssh exited (or was killed) before a banner came, for another reason (connection,
    /// authentication, the remote command failing).
    #[error("ssh to {host} failed (exit {code}){}", said(.stderr))]
    Failed {
        /// The far side, as in [`SshSpec::host`].
        host: String,
        /// ssh's exit status (255: ssh itself failed), or minus the signal that killed it.
        code: i32,
        /// The last lines (up to 20) ssh wrote to stderr, newline-joined; may be empty.
        stderr: String,
    },
    /// The far side's output held no valid banner (garbage, too many noise lines, an exit
    /// without one): what was wrong.
    #[error("the far side did not answer with a hayate banner: {0}")]
    BadBanner(String),
    /// No banner within the timeout given to [`SshChild::read_banner`] (that timeout).
    #[error("timed out after {0:?} waiting for the far side")]
    Timeout(std::time::Duration),
}

/// What ssh printed, after a colon; nothing when it printed nothing.
fn said(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

/// How many stderr lines are kept for error messages.
const STDERR_KEEP: usize = 20;
/// How many lines before the banner are skipped at most (motd noise from shell rc files).
const MAX_NOISE_LINES: usize = 64;
/// A line longer than this without a newline is not going to become a banner.
const MAX_LINE: usize = 4096;

/// A running `ssh` with the far side behind it.
pub struct SshChild {
    child: Child,
    reaped: bool,
    stdin: Option<ChildStdin>,
    stdout: Option<ChildStdout>,
    /// Bytes read from stdout and not yet consumed (after the banner: the channel's first bytes).
    buf: Vec<u8>,
    stderr_lines: Arc<Mutex<VecDeque<String>>>,
    stderr_thread: Option<JoinHandle<()>>,
    host: String,
    /// The word the far side's shell would complain about when hayate is missing.
    remote_prog: String,
}

impl SshChild {
    /// Spawns `command... [-p port] [-J jump] [user@]host -- remote_cmd` (stdin/stdout piped;
    /// stderr piped and collected by a thread that also forwards each line to our stderr
    /// prefixed with "remote: " unless `quiet`). ssh's password prompts go through /dev/tty.
    pub fn spawn(spec: &SshSpec, quiet: bool) -> Result<SshChild, SshError> {
        let argv = spec.argv();
        let invalid = |msg: String| {
            SshError::Spawn(
                argv[0].clone(),
                io::Error::new(io::ErrorKind::InvalidInput, msg),
            )
        };
        // A "host" or "user" starting with '-' would be taken as an ssh option.
        if spec.host.is_empty() || spec.host.starts_with('-') {
            return Err(invalid(format!("bad host name {:?}", spec.host)));
        }
        if let Some(u) = &spec.user {
            if u.is_empty() || u.starts_with('-') {
                return Err(invalid(format!("bad user name {u:?}")));
            }
        }
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| SshError::Spawn(argv[0].clone(), e))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take().expect("stderr is piped");
        let stderr_lines = Arc::new(Mutex::new(VecDeque::new()));
        let lines = stderr_lines.clone();
        let stderr_thread = thread::Builder::new()
            .name("ssh-stderr".to_string())
            .spawn(move || collect_stderr(stderr, lines, quiet))
            .ok();
        Ok(SshChild {
            child,
            reaped: false,
            stdin,
            stdout,
            buf: Vec::new(),
            stderr_lines,
            stderr_thread,
            host: spec.host.clone(),
            remote_prog: remote_program(&spec.remote_cmd),
        })
    }

    /// Waits for the banner line (skipping up to 64 blank/noise lines before it that do not
    /// start with "HAYATE-STDIO"), at most `timeout`. If ssh exits first, the failure is
    /// classified: exit 127/126 or the remote shell saying the hayate command was not found →
    /// [`SshError::HayateMissing`]; otherwise [`SshError::Failed`] with the last stderr lines.
    pub fn read_banner(&mut self, timeout: Duration) -> Result<Banner, SshError> {
        let deadline = Instant::now() + timeout;
        let mut noise = 0usize;
        loop {
            // Whole lines already buffered.
            while let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=nl).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_start_matches('\u{feff}').trim();
                if line.starts_with(BANNER_TAG) {
                    return Banner::parse(line).map_err(SshError::BadBanner);
                }
                noise += 1;
                if noise > MAX_NOISE_LINES {
                    return Err(SshError::BadBanner(format!(
                        "no banner in the first {MAX_NOISE_LINES} lines (last: {line:?})"
                    )));
                }
            }
            if self.buf.len() > MAX_LINE {
                return Err(SshError::BadBanner(format!(
                    "a line of more than {MAX_LINE} bytes"
                )));
            }
            let Some(stdout) = self.stdout.as_mut() else {
                return Err(SshError::BadBanner(
                    "the channel was already taken".to_string(),
                ));
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(SshError::Timeout(timeout));
            }
            let ready = poll_readable(stdout.as_raw_fd(), deadline - now)
                .map_err(|e| SshError::Spawn("poll".to_string(), e))?;
            if !ready {
                continue; // the deadline check above ends it
            }
            let mut chunk = [0u8; 4096];
            match stdout.read(&mut chunk) {
                Ok(0) => return Err(self.classify_eof(deadline)),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(SshError::Spawn("read from ssh".to_string(), e)),
            }
        }
    }

    /// stdout ended before a banner: wait for ssh to exit and say why.
    fn classify_eof(&mut self, deadline: Instant) -> SshError {
        // A partial last line is the last thing the far side said.
        let partial = String::from_utf8_lossy(&self.buf).trim().to_string();
        let wait_until = deadline.max(Instant::now() + Duration::from_secs(1));
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => {
                    self.reaped = true;
                    break Some(st);
                }
                Ok(None) if Instant::now() < wait_until => thread::sleep(Duration::from_millis(5)),
                _ => break None,
            }
        };
        // Let the stderr collector take in the last lines.
        if let Some(t) = &self.stderr_thread {
            let until = Instant::now() + Duration::from_secs(1);
            while !t.is_finished() && Instant::now() < until {
                thread::sleep(Duration::from_millis(5));
            }
        }
        let Some(status) = status else {
            return SshError::BadBanner(format!(
                "the far side closed its output without a banner{}",
                if partial.is_empty() {
                    String::new()
                } else {
                    format!(" (it said {partial:?})")
                }
            ));
        };
        let tail = self.stderr_tail();
        let code = status.code();
        if matches!(code, Some(126 | 127)) || says_missing(&tail, &self.remote_prog) {
            return SshError::HayateMissing {
                host: self.host.clone(),
            };
        }
        match code {
            Some(0) => SshError::BadBanner(if partial.is_empty() {
                "the far side exited without saying anything".to_string()
            } else {
                format!("the far side exited after saying {partial:?}")
            }),
            Some(code) => SshError::Failed {
                host: self.host.clone(),
                code,
                stderr: tail,
            },
            None => {
                use std::os::unix::process::ExitStatusExt;
                SshError::Failed {
                    host: self.host.clone(),
                    code: -status.signal().unwrap_or(0),
                    stderr: if tail.is_empty() {
                        format!("ssh killed by signal {}", status.signal().unwrap_or(0))
                    } else {
                        tail
                    },
                }
            }
        }
    }

    /// Raw fds of the channel for the framed fallback transport: (write end = ssh's stdin,
    /// read end = ssh's stdout), plus any bytes already read after the banner line (they come
    /// before whatever is read from the fd). Both fds are in blocking mode.
    ///
    /// Panics when called a second time.
    pub fn channel(&mut self) -> (OwnedFd, OwnedFd, Vec<u8>) {
        let w = self.stdin.take().expect("SshChild::channel called twice");
        let r = self.stdout.take().expect("SshChild::channel called twice");
        (
            OwnedFd::from(w),
            OwnedFd::from(r),
            std::mem::take(&mut self.buf),
        )
    }

    /// The last stderr lines (up to 20), joined with newlines.
    pub fn stderr_tail(&self) -> String {
        let lines = self.stderr_lines.lock().unwrap_or_else(|e| e.into_inner());
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// The ssh process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Closes our end of stdin (the far side sees EOF and exits), waits up to `grace` (reading
    /// and discarding whatever still comes on stdout), then kills. Returns ssh's exit code (None
    /// when it had to be killed or died by a signal).
    pub fn finish(mut self, grace: Duration) -> Option<i32> {
        drop(self.stdin.take());
        let deadline = Instant::now() + grace;
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => {
                    self.reaped = true;
                    return st.code();
                }
                Ok(None) => {}
                Err(_) => break,
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let step = (deadline - now).min(Duration::from_millis(10));
            match self.stdout.as_mut() {
                Some(out) => {
                    if let Ok(true) = poll_readable(out.as_raw_fd(), step) {
                        let mut sink = [0u8; 16384];
                        match out.read(&mut sink) {
                            Ok(0) | Err(_) => drop(self.stdout.take()),
                            Ok(_) => {}
                        }
                    }
                }
                None => thread::sleep(step),
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
        None
    }
}

impl Drop for SshChild {
    fn drop(&mut self) {
        if !self.reaped {
            drop(self.stdin.take());
            if let Ok(None) = self.child.try_wait() {
                let _ = self.child.kill();
            }
            let _ = self.child.wait();
            self.reaped = true;
        }
    }
}

fn collect_stderr(
    stderr: std::process::ChildStderr,
    lines: Arc<Mutex<VecDeque<String>>>,
    quiet: bool,
) {
    let mut r = BufReader::new(stderr);
    let mut raw = Vec::new();
    loop {
        raw.clear();
        match r.read_until(b'\n', &mut raw) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let line = String::from_utf8_lossy(&raw);
        let line = line.trim_end_matches(['\n', '\r']);
        if !quiet {
            let _ = writeln!(io::stderr().lock(), "remote: {line}");
        }
        if line.trim().is_empty() {
            continue;
        }
        let mut l = lines.lock().unwrap_or_else(|e| e.into_inner());
        if l.len() == STDERR_KEEP {
            l.pop_front();
        }
        l.push_back(line.to_string());
    }
}

/// The program word of a remote command line (skipping `exec`, `env` and `NAME=value`).
fn remote_program(cmd: &str) -> String {
    let words = split_command(cmd)
        .unwrap_or_else(|_| cmd.split_ascii_whitespace().map(String::from).collect());
    words
        .into_iter()
        .find(|w| {
            let assignment = w.contains('=') && !w.starts_with('/');
            w != "exec" && w != "env" && !assignment
        })
        .unwrap_or_else(|| "hayate".to_string())
}

/// Whether the far side's shell said that `prog` does not exist, in any of the ways shells say
/// it: bash "bash: hayate: command not found", dash "sh: 1: hayate: not found", zsh
/// "zsh:1: command not found: hayate", fish "Unknown command: hayate", or
/// "bash: /opt/hayate: No such file or directory".
fn says_missing(stderr: &str, prog: &str) -> bool {
    let base = prog.rsplit('/').next().unwrap_or(prog);
    stderr.lines().any(|l| {
        let names_it = l.contains(prog) || (!base.is_empty() && l.contains(base));
        names_it
            && (l.contains("command not found")
                || l.ends_with(": not found")
                || l.contains("Unknown command")
                || l.contains(&format!("{prog}: No such file or directory"))
                || l.contains(&format!("{prog}: Permission denied")))
    })
}

/// Waits until `fd` is readable (or hung up), at most `timeout`. Ok(false) on timeout.
fn poll_readable(fd: i32, timeout: Duration) -> io::Result<bool> {
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let r = unsafe { libc::poll(&mut pfd, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(r > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn banner() -> Banner {
        let mut key = [0u8; 32];
        for (i, k) in key.iter_mut().enumerate() {
            *k = (i as u8).wrapping_mul(37).wrapping_add(5);
        }
        Banner {
            version: 1,
            port: 60123,
            key,
            addr: Some("192.0.2.7".parse().unwrap()),
        }
    }

    #[test]
    fn banner_round_trip() {
        let b = banner();
        let line = b.format();
        assert!(line.starts_with("HAYATE-STDIO 1 port=60123 key="));
        assert!(line.ends_with(" addr=192.0.2.7\n"));
        assert_eq!(Banner::parse(&line).unwrap(), b);
        let b6 = Banner {
            addr: Some("2001:db8::1".parse().unwrap()),
            ..banner()
        };
        assert_eq!(Banner::parse(&b6.format()).unwrap(), b6);
        let none = Banner {
            addr: None,
            ..banner()
        };
        assert!(none.format().ends_with(" addr=-\n"));
        assert_eq!(Banner::parse(&none.format()).unwrap(), none);
        // CRLF, no newline, uppercase hex, extra fields, missing addr.
        let crlf = none.format().replace('\n', "\r\n");
        assert_eq!(Banner::parse(&crlf).unwrap(), none);
        assert_eq!(Banner::parse(none.format().trim_end()).unwrap(), none);
        let hex: String = b.key.iter().map(|x| format!("{x:02X}")).collect();
        let line = format!("HAYATE-STDIO 1 key={hex} port=60123 future=yes addr=192.0.2.7");
        assert_eq!(Banner::parse(&line).unwrap(), b);
        let line = format!("HAYATE-STDIO 2 port=60123 key={hex}");
        assert_eq!(
            Banner::parse(&line).unwrap(),
            Banner {
                version: 2,
                addr: None,
                ..banner()
            }
        );
    }

    #[test]
    fn banner_garbage() {
        let good = banner().format();
        let key: String = banner().key.iter().map(|x| format!("{x:02x}")).collect();
        for bad in [
            "".to_string(),
            "hello".to_string(),
            "HAYATE-STDIO".to_string(),
            "HAYATE-STDIO x port=1 key=00".to_string(),
            good.replace("HAYATE-STDIO", "HAYATE-STDI0"),
            good.replace("port=60123", "port=70000"),
            good.replace("port=60123", "port=0"),
            good.replace("port=60123", "port="),
            good.replace("port=60123 ", ""),
            good.replace(&key, &key[..62]),
            good.replace(&key, &format!("{key}00")),
            good.replace(&key, &format!("zz{}", &key[2..])),
            good.replace(&format!("key={key}"), ""),
            good.replace("addr=192.0.2.7", "addr=example.com"),
            good.replace("addr=192.0.2.7", "addr"),
            format!("x{good}"),
        ] {
            assert!(Banner::parse(&bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn ssh_connection() {
        assert_eq!(
            parse_ssh_connection("10.0.0.1 51234 10.0.0.2 22"),
            Some("10.0.0.2".parse().unwrap())
        );
        assert_eq!(
            parse_ssh_connection("fe80::1%eth0 51234 fe80::2%eth0 22"),
            Some("fe80::2".parse().unwrap())
        );
        assert_eq!(parse_ssh_connection("10.0.0.1 51234"), None);
        assert_eq!(parse_ssh_connection("a b c d"), None);
        assert_eq!(parse_ssh_connection(""), None);
    }

    fn split(s: &str) -> Vec<String> {
        split_command(s).unwrap()
    }

    #[test]
    fn split_command_words() {
        assert_eq!(split("ssh"), ["ssh"]);
        assert!(split("").is_empty());
        assert!(split("  \t ").is_empty());
        assert_eq!(
            split("ssh -p 2222 -i 'my key'"),
            ["ssh", "-p", "2222", "-i", "my key"]
        );
        assert_eq!(split("  ssh   -v\t-x  "), ["ssh", "-v", "-x"]);
        assert_eq!(split(r#"a "b c" d"#), ["a", "b c", "d"]);
        assert_eq!(split(r"a\ b c"), ["a b", "c"]);
        assert_eq!(split(r#"'it'\''s'"#), ["it's"]);
        assert_eq!(split(r#""say \"hi\"""#), [r#"say "hi""#]);
        assert_eq!(split(r#""a\b \$x \\ \`""#), [r"a\b $x \ `"]);
        assert_eq!(split(r"'a\b'"), [r"a\b"]);
        assert_eq!(split(r#"x''y"#), ["xy"]);
        assert_eq!(split(r#"'' """#), ["", ""]);
        assert_eq!(
            split(r#"-o "ProxyCommand=ssh -W %h:%p j""#),
            ["-o", "ProxyCommand=ssh -W %h:%p j"]
        );
        assert_eq!(split("a\\\nb"), ["ab"]);
        assert_eq!(split("a\nb"), ["a", "b"]);
        assert_eq!(split("é 'ü x'"), ["é", "ü x"]);
    }

    #[test]
    fn split_command_errors() {
        for bad in ["'abc", "\"abc", "abc\\", "a 'b\"", "\"a\\"] {
            assert!(split_command(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn shell_quote_words() {
        assert_eq!(shell_quote("abc"), "abc");
        assert_eq!(
            shell_quote("/a/b-c_d.e:f,g@h%i+j=k"),
            "/a/b-c_d.e:f,g@h%i+j=k"
        );
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
        assert_eq!(shell_quote("~/x"), "'~/x'");
        assert_eq!(shell_quote("a;rm -rf /"), "'a;rm -rf /'");
        assert_eq!(shell_quote("é"), "'é'");
        // Round trip through our own splitter for nasty inputs.
        for s in [
            "plain",
            "two words",
            "it's",
            "''",
            "\\",
            "a\"b",
            "$(x) `y` *?[]{}",
            "\n\t",
            "",
            "-e",
        ] {
            let q = shell_quote(s);
            assert_eq!(split(&q), [s], "quote of {s:?} = {q:?}");
            let line = format!("cmd {q} {q}");
            assert_eq!(split(&line), ["cmd", s, s]);
        }
    }

    #[test]
    fn argv_layout() {
        let scp = SCP_SSH_OPTIONS.map(String::from);
        let spec = SshSpec {
            command: vec![],
            options: vec!["-i".into(), "k2".into(), "-4".into()],
            port: Some(2222),
            jump: Some("gw".into()),
            user: Some("bob".into()),
            host: "h".into(),
            remote_cmd: "hayate serve --stdio".into(),
        };
        let want: Vec<String> = ["ssh", "-i", "k2", "-4", "-p", "2222", "-J", "gw"]
            .iter()
            .map(|s| s.to_string())
            .chain(scp.iter().cloned())
            .chain(["bob@h", "--", "hayate serve --stdio"].map(String::from))
            .collect();
        assert_eq!(spec.argv(), want);
        let spec = SshSpec {
            command: split("ssh -i k"),
            options: vec![],
            port: None,
            jump: None,
            user: None,
            ..spec
        };
        let want: Vec<String> = ["ssh", "-i", "k"]
            .map(String::from)
            .into_iter()
            .chain(scp.iter().cloned())
            .chain(["h", "--", "hayate serve --stdio"].map(String::from))
            .collect();
        assert_eq!(spec.argv(), want);
    }

    #[test]
    fn missing_detection() {
        assert_eq!(remote_program("hayate serve --stdio"), "hayate");
        assert_eq!(
            remote_program("exec '/opt/my dir/hayate' serve"),
            "/opt/my dir/hayate"
        );
        assert_eq!(remote_program("env RUST_LOG=x hayate serve"), "hayate");
        for (err, prog) in [
            ("bash: hayate: command not found", "hayate"),
            ("sh: 1: hayate: not found", "hayate"),
            ("zsh:1: command not found: hayate", "hayate"),
            ("fish: Unknown command: hayate", "hayate"),
            (
                "bash: line 1: /opt/hayate: No such file or directory",
                "/opt/hayate",
            ),
        ] {
            assert!(says_missing(err, prog), "{err:?}");
        }
        for (err, prog) in [
            ("Permission denied (publickey).", "hayate"),
            ("hayate: /srv/x: No such file or directory", "hayate"),
            (
                "ssh: Could not resolve hostname nohost: Name or service not known",
                "hayate",
            ),
            ("bash: foo: command not found", "hayate"),
        ] {
            assert!(!says_missing(err, prog), "{err:?}");
        }
    }
}
