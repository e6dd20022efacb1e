//! `SshChild` against fake "ssh" programs: small shell scripts that behave like ssh plus a far
//! side in the ways that matter (a banner, a missing hayate, an ssh failure, silence).

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hayate_io::ssh::{Banner, SshChild, SshError, SshSpec};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fn fake_ssh(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn spec(ssh: &Path) -> SshSpec {
    SshSpec {
        // Run through sh, not exec'd directly: another test thread forking while this
        // script was open for writing would make exec fail with ETXTBSY.
        command: vec![
            "/bin/sh".into(),
            ssh.to_str().unwrap().to_string(),
            "-o".into(),
            "A=b c".into(),
        ],
        options: vec!["-i".into(), "my key".into()],
        port: Some(2222),
        jump: Some("jumper".into()),
        user: Some("alice".into()),
        host: "far.example".into(),
        remote_cmd: "hayate serve --stdio".into(),
    }
}

fn expected_banner() -> Banner {
    let mut key = [0u8; 32];
    for (i, k) in key.iter_mut().enumerate() {
        *k = i as u8;
    }
    Banner {
        version: 1,
        port: 5301,
        key,
        addr: Some("10.1.2.3".parse().unwrap()),
    }
}

#[test]
fn reads_banner_after_noise_and_passes_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let args = dir.path().join("args");
    let ssh = fake_ssh(
        dir.path(),
        "ssh",
        &format!(
            r#"for a in "$@"; do printf '%s\n' "$a"; done > '{}'
echo 'Welcome to far.example'
echo
echo 'remote noise on stderr' >&2
sleep 0.1
printf 'HAYATE-STDIO 1 port=5301 key={KEY} addr=10.1.2.3\n'
cat > /dev/null
exit 3"#,
            args.display()
        ),
    );
    let mut child = SshChild::spawn(&spec(&ssh), true).unwrap();
    let b = child.read_banner(Duration::from_secs(10)).unwrap();
    assert_eq!(b, expected_banner());
    let got = fs::read_to_string(&args).unwrap();
    assert_eq!(
        got.lines().collect::<Vec<_>>(),
        [
            "-o",
            "A=b c",
            "-i",
            "my key",
            "-p",
            "2222",
            "-J",
            "jumper",
            // scp's own options, so a RemoteCommand or RequestTTY in a config cannot interfere.
            "-x",
            "-oPermitLocalCommand=no",
            "-oClearAllForwardings=yes",
            "-oRemoteCommand=none",
            "-oRequestTTY=no",
            "-oControlPersist=no",
            "-oForwardAgent=no",
            "alice@far.example",
            "--",
            "hayate serve --stdio"
        ]
    );
    // Closing stdin ends `cat`; the script's own exit code comes back.
    assert_eq!(child.finish(Duration::from_secs(10)), Some(3));
}

#[test]
fn exit_127_is_hayate_missing() {
    let dir = tempfile::tempdir().unwrap();
    let ssh = fake_ssh(
        dir.path(),
        "ssh",
        "echo 'bash: line 1: hayate: command not found' >&2; exit 127",
    );
    let mut child = SshChild::spawn(&spec(&ssh), true).unwrap();
    let e = child.read_banner(Duration::from_secs(10)).unwrap_err();
    match &e {
        SshError::HayateMissing { host } => assert_eq!(host, "far.example"),
        other => panic!("want HayateMissing, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("far.example") && msg.contains("--remote-path"),
        "{msg}"
    );
}

#[test]
fn not_found_message_is_hayate_missing_whatever_the_code() {
    let dir = tempfile::tempdir().unwrap();
    let ssh = fake_ssh(
        dir.path(),
        "ssh",
        "echo 'sh: 1: hayate: not found' >&2; exit 1",
    );
    let mut child = SshChild::spawn(&spec(&ssh), true).unwrap();
    let e = child.read_banner(Duration::from_secs(10)).unwrap_err();
    assert!(matches!(e, SshError::HayateMissing { .. }), "{e:?}");
}

#[test]
fn ssh_failure_carries_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let ssh = fake_ssh(
        dir.path(),
        "ssh",
        "echo 'first line' >&2; echo 'alice@far.example: Permission denied (publickey).' >&2; exit 255",
    );
    let mut child = SshChild::spawn(&spec(&ssh), true).unwrap();
    let e = child.read_banner(Duration::from_secs(10)).unwrap_err();
    match &e {
        SshError::Failed { host, code, stderr } => {
            assert_eq!(host, "far.example");
            assert_eq!(*code, 255);
            assert!(
                stderr.contains("Permission denied (publickey)"),
                "{stderr:?}"
            );
            assert!(stderr.contains("first line"), "{stderr:?}");
        }
        other => panic!("want Failed, got {other:?}"),
    }
    assert!(child.stderr_tail().contains("Permission denied"));
    assert!(e.to_string().contains("exit 255"), "{e}");
}

#[test]
fn garbage_instead_of_banner() {
    let dir = tempfile::tempdir().unwrap();
    let ssh = fake_ssh(
        dir.path(),
        "ssh",
        "echo 'HAYATE-STDIO 1 port=nope'; cat >/dev/null",
    );
    let mut child = SshChild::spawn(&spec(&ssh), true).unwrap();
    let e = child.read_banner(Duration::from_secs(10)).unwrap_err();
    assert!(matches!(e, SshError::BadBanner(_)), "{e:?}");

    // Exiting 0 with only noise is not a banner either.
    let ssh = fake_ssh(dir.path(), "ssh0", "echo hello; exit 0");
    let mut child = SshChild::spawn(&spec(&ssh), true).unwrap();
    let e = child.read_banner(Duration::from_secs(10)).unwrap_err();
    assert!(matches!(e, SshError::BadBanner(_)), "{e:?}");
}

#[test]
fn times_out_and_drop_reaps() {
    let dir = tempfile::tempdir().unwrap();
    let ssh = fake_ssh(dir.path(), "ssh", "echo 'just noise'; exec sleep 30");
    let mut child = SshChild::spawn(&spec(&ssh), true).unwrap();
    let pid = child.id();
    let t0 = Instant::now();
    let e = child.read_banner(Duration::from_millis(400)).unwrap_err();
    let took = t0.elapsed();
    assert!(
        matches!(e, SshError::Timeout(d) if d == Duration::from_millis(400)),
        "{e:?}"
    );
    assert!(took >= Duration::from_millis(390), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    drop(child);
    // Killed and reaped: no process (nor zombie) with that pid is left.
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
}

#[test]
fn finish_kills_after_grace() {
    let dir = tempfile::tempdir().unwrap();
    // Ignores stdin EOF, keeps writing to stdout.
    let ssh = fake_ssh(
        dir.path(),
        "ssh",
        &format!("printf 'HAYATE-STDIO 1 port=5301 key={KEY} addr=10.1.2.3\\n'; exec yes"),
    );
    let mut child = SshChild::spawn(&spec(&ssh), true).unwrap();
    child.read_banner(Duration::from_secs(10)).unwrap();
    let t0 = Instant::now();
    assert_eq!(child.finish(Duration::from_millis(300)), None);
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn channel_keeps_bytes_after_banner() {
    let dir = tempfile::tempdir().unwrap();
    // The banner and the first channel bytes in one write, then an echo of stdin.
    let ssh = fake_ssh(
        dir.path(),
        "ssh",
        &format!("printf 'HAYATE-STDIO 1 port=5301 key={KEY} addr=-\\nEARLY'; exec cat"),
    );
    let mut child = SshChild::spawn(&spec(&ssh), true).unwrap();
    let b = child.read_banner(Duration::from_secs(10)).unwrap();
    assert_eq!(b.addr, None);
    assert_eq!(b.port, 5301);
    let (w, r, early) = child.channel();
    assert_eq!(early, b"EARLY");
    let mut w = File::from(w);
    let mut r = File::from(r);
    w.write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    r.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    drop(w); // EOF for cat
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    assert_eq!(child.finish(Duration::from_secs(10)), Some(0));
}

#[test]
fn spawn_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-ssh");
    let mut s = spec(&missing);
    s.command.remove(0); // exec it directly: it does not exist
    let e = SshChild::spawn(&s, true).err().unwrap();
    assert!(matches!(e, SshError::Spawn(..)), "{e:?}");
    let ssh = fake_ssh(dir.path(), "ssh", "exit 0");
    let mut s = spec(&ssh);
    s.host = "-oProxyCommand=evil".into();
    assert!(matches!(
        SshChild::spawn(&s, true),
        Err(SshError::Spawn(..))
    ));
}
