//! A real OpenSSH server for tests: throwaway host and user keys, a config in a temporary
//! directory, listening on a free loopback port, killed on drop (also on panic).
//!
//! `Sshd::start()` returns None (after saying why on stderr) where sshd cannot run, so tests
//! that need it skip instead of failing on machines without openssh-server.

#![allow(dead_code)]

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

pub struct Sshd {
    dir: tempfile::TempDir,
    child: Child,
    port: u16,
    key: PathBuf,
    user: String,
}

fn skip(reason: &str) -> Option<Sshd> {
    skip_unless_ci(reason);
    None
}

/// A test that cannot run here says SKIP and why, except under CI (`CI` set), which has
/// everything these tests need: there it fails, so a broken setup cannot pass unnoticed.
pub fn skip_unless_ci(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "cannot run this test, and CI is set: {reason}"
    );
    println!("SKIP: {reason}");
}

fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

fn keygen(ssh_keygen: &Path, path: &Path, comment: &str) -> Result<(), String> {
    let out = Command::new(ssh_keygen)
        .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ssh-keygen: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ssh-keygen failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn current_user() -> Option<String> {
    let out = Command::new("id").arg("-un").output().ok()?;
    let name = String::from_utf8(out.stdout).ok()?.trim().to_string();
    if out.status.success() && !name.is_empty() {
        return Some(name);
    }
    std::env::var("USER").ok().filter(|u| !u.is_empty())
}

/// Single-quotes `s` for a shell when it has anything but plain path characters.
fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Runs `cmd` with a deadline; kills it when the deadline passes.
fn output_with_deadline(mut cmd: Command, limit: Duration) -> Result<Output, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().map_err(|e| e.to_string()),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{cmd:?} did not finish within {limit:?}"));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

impl Sshd {
    /// None (after printing "SKIP: <reason>" to stderr; a panic instead when `CI` is set) when /usr/sbin/sshd or ssh-keygen
    /// is missing or sshd cannot be run here. Generates throwaway host and user ed25519 keys,
    /// writes an sshd_config (127.0.0.1, a free port, keys and pid file in a temporary
    /// directory), starts `sshd -D -e -f cfg`, waits until the port accepts TCP (at most 10 s)
    /// and checks that one `ssh ... true` works.
    pub fn start() -> Option<Sshd> {
        if !Path::new(SSHD).is_file() {
            return skip(&format!(
                "{SSHD} is missing (apt-get install openssh-server)"
            ));
        }
        let Some(ssh_keygen) = which("ssh-keygen") else {
            return skip("ssh-keygen is missing (apt-get install openssh-client)");
        };
        if which("ssh").is_none() {
            return skip("ssh is missing (apt-get install openssh-client)");
        }
        let Some(user) = current_user() else {
            return skip("cannot tell the current user's name");
        };
        let root = is_root();
        if root {
            // sshd's privilege separation directory; packages create it only when the service
            // has been started once.
            if let Err(e) = fs::create_dir_all("/run/sshd") {
                return skip(&format!("cannot create /run/sshd: {e}"));
            }
        }
        let dir = match tempfile::Builder::new().prefix("hayate-sshd").tempdir() {
            Ok(d) => d,
            Err(e) => return skip(&format!("no temporary directory: {e}")),
        };
        let host_key = dir.path().join("host_ed25519");
        let key = dir.path().join("user_ed25519");
        for (path, comment) in [(&host_key, "hayate-test-host"), (&key, "hayate-test-user")] {
            if let Err(e) = keygen(&ssh_keygen, path, comment) {
                return skip(&e);
            }
        }
        let authorized = dir.path().join("authorized_keys");
        let pubkey = match fs::read(key.with_extension("pub")) {
            Ok(k) => k,
            Err(e) => return skip(&format!("no public key: {e}")),
        };
        if let Err(e) = fs::write(&authorized, pubkey) {
            return skip(&format!("cannot write authorized_keys: {e}"));
        }

        let mut last_err = String::new();
        // A free port may be taken between asking and binding: a few tries.
        for _ in 0..3 {
            let port = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)) {
                Ok(l) => l.local_addr().map(|a| a.port()).unwrap_or(0),
                Err(e) => return skip(&format!("cannot bind 127.0.0.1: {e}")),
            };
            match Self::try_start(&dir, port, &host_key, &authorized) {
                Ok(child) => {
                    let sshd = Sshd {
                        dir,
                        child,
                        port,
                        key,
                        user,
                    };
                    return match sshd.check() {
                        Ok(()) => Some(sshd),
                        Err(e) => skip(&format!("sshd runs but ssh into it fails: {e}")),
                    };
                }
                Err(e) => last_err = e,
            }
        }
        skip(&format!("cannot run sshd: {last_err}"))
    }

    fn try_start(
        dir: &tempfile::TempDir,
        port: u16,
        host_key: &Path,
        authorized: &Path,
    ) -> Result<Child, String> {
        let d = dir.path();
        let cfg = d.join("sshd_config");
        let log = d.join("sshd.log");
        let config = format!(
            "ListenAddress 127.0.0.1\n\
             Port {port}\n\
             HostKey {}\n\
             AuthorizedKeysFile {}\n\
             PidFile {}\n\
             PermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             StrictModes no\n\
             UsePAM no\n\
             UseDNS no\n\
             LogLevel ERROR\n\
             PrintMotd no\n\
             PrintLastLog no\n\
             MaxStartups 100:30:200\n\
             MaxSessions 100\n\
             Subsystem sftp internal-sftp\n",
            host_key.display(),
            authorized.display(),
            d.join("sshd.pid").display(),
        );
        fs::write(&cfg, config).map_err(|e| format!("cannot write sshd_config: {e}"))?;
        let log_file = fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut child = Command::new(SSHD)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot run {SSHD}: {e}"))?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                let said = fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("sshd exited ({st}): {}", said.trim()));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(child);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                let said = fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "sshd did not listen on {addr} within 10 s: {}",
                    said.trim()
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn check(&self) -> Result<(), String> {
        let mut cmd = self.command();
        cmd.arg(self.target()).arg("true");
        let out = output_with_deadline(cmd, Duration::from_secs(20))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{}: {} (sshd log: {})",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                self.log().trim()
            ))
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The user key's path (private half).
    pub fn key(&self) -> &Path {
        &self.key
    }

    /// The server's temporary directory (config, keys, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What sshd wrote to stderr so far (errors only, LogLevel ERROR).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// The `-e` value for hayate cp: "ssh -p PORT -i KEY -o StrictHostKeyChecking=no
    /// -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR -o IdentitiesOnly=yes"
    pub fn ssh_command(&self) -> String {
        let mut s = String::from("ssh");
        for a in self.ssh_args() {
            s.push(' ');
            s.push_str(&quote(&a));
        }
        s
    }

    fn ssh_args(&self) -> Vec<String> {
        vec![
            "-p".into(),
            self.port.to_string(),
            "-i".into(),
            self.key.display().to_string(),
            "-o".into(),
            "StrictHostKeyChecking=no".into(),
            "-o".into(),
            "UserKnownHostsFile=/dev/null".into(),
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            "LogLevel=ERROR".into(),
            "-o".into(),
            "IdentitiesOnly=yes".into(),
        ]
    }

    /// `ssh` with the options of [`Sshd::ssh_command`], ready for `.arg(target).arg(cmd)`.
    pub fn command(&self) -> Command {
        let mut c = Command::new("ssh");
        c.args(self.ssh_args());
        c
    }

    /// user@127.0.0.1 (the current user's name)
    pub fn target(&self) -> String {
        format!("{}@127.0.0.1", self.user)
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
