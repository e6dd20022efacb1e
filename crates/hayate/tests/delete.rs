//! `hayate cp -r --delete` against the real binary, both ways, to a `hayate serve --root`
//! daemon and through a real sshd (`hayate serve --stdio` at the far side): the tree ends
//! byte-exact and verified, what the source lacks is removed (links as links, nothing
//! outside the destination tree, nothing at all when the copy failed), and a daemon never
//! removes anything outside its root, whatever a client holding the key asks.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::sshd::Sshd;
use common::*;

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len];
    blake3::Hasher::new()
        .update(&seed.to_le_bytes())
        .update(b"hayate delete test data")
        .finalize_xof()
        .fill(&mut out);
    out
}

/// What `--delete` removes from the destination `build` makes: relative paths, directories
/// with their trailing `/`.
const EXTRA: &[&str] = &[
    "sub/gone.bin",
    "olddir/deep/x.bin",
    "olddir/deep/",
    "olddir/deep2/",
    "olddir/",
    "out-file",
    "out-dir",
    "gone-link",
];

/// What stays at the destination though the source lacks it: an interrupted copy's temp file
/// and the directory that holds it (left to `hayate clean`).
const KEPT: &[&str] = &["held", "held/.y.bin.hayate-part", "sub/.x.bin.hayate-part"];

/// A source tree, and a destination holding an older copy of it: a changed file, an
/// unchanged one, files and directories since removed from the source, links pointing out of
/// the tree (to a file and a directory in `outside`), a dangling link, temp files.
fn build(src: &Path, dst: &Path, outside: &Path) {
    for d in [src, dst, outside] {
        fs::create_dir_all(d).unwrap();
    }
    fs::write(outside.join("secret"), b"secret").unwrap();
    fs::create_dir_all(outside.join("d")).unwrap();
    fs::write(outside.join("d/f"), b"outside file").unwrap();

    let old_a = bytes(300_000, 1);
    let mut new_a = old_a.clone();
    new_a[150_000..154_096].copy_from_slice(&bytes(4096, 2));
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::create_dir_all(src.join("newdir")).unwrap();
    fs::create_dir_all(src.join("empty")).unwrap();
    fs::write(src.join("a.bin"), &new_a).unwrap();
    fs::write(src.join("sub/b.bin"), bytes(100_000, 3)).unwrap();
    fs::write(src.join("sub/new.bin"), bytes(50_000, 4)).unwrap();
    fs::write(src.join("newdir/c.txt"), b"new dir").unwrap();
    symlink("a.bin", src.join("link")).unwrap();

    fs::create_dir_all(dst.join("sub")).unwrap();
    fs::create_dir_all(dst.join("olddir/deep")).unwrap();
    fs::create_dir_all(dst.join("olddir/deep2")).unwrap();
    fs::create_dir_all(dst.join("held")).unwrap();
    fs::write(dst.join("a.bin"), &old_a).unwrap();
    fs::write(dst.join("sub/b.bin"), bytes(100_000, 3)).unwrap();
    fs::write(dst.join("sub/gone.bin"), b"gone").unwrap();
    fs::write(dst.join("olddir/deep/x.bin"), b"x").unwrap();
    fs::write(dst.join("sub/.x.bin.hayate-part"), b"part").unwrap();
    fs::write(dst.join("held/.y.bin.hayate-part"), b"part").unwrap();
    symlink(outside.join("secret"), dst.join("out-file")).unwrap();
    symlink(outside.join("d"), dst.join("out-dir")).unwrap();
    symlink("nowhere", dst.join("gone-link")).unwrap();
}

/// The destination is the source again (every file byte for byte, links with their
/// targets) plus only what [`KEPT`] says; `outside` is untouched; the JSON says verified and
/// names exactly [`EXTRA`] as deleted, as do the `deleting` lines on stderr.
fn check(src: &Path, dst: &Path, outside: &Path, run: &Run) {
    run.assert_ok();
    let mut want: BTreeSet<String> = tree(src).into_iter().collect();
    want.extend(KEPT.iter().map(|k| k.to_string()));
    let got: BTreeSet<String> = tree(dst).into_iter().collect();
    assert_eq!(got, want, "{run:#?}");
    for f in ["a.bin", "sub/b.bin", "sub/new.bin", "newdir/c.txt"] {
        assert!(
            fs::read(src.join(f)).unwrap() == fs::read(dst.join(f)).unwrap(),
            "{f} differs"
        );
    }
    assert_eq!(
        fs::read_link(dst.join("link")).unwrap(),
        PathBuf::from("a.bin")
    );
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"secret");
    assert_eq!(fs::read(outside.join("d/f")).unwrap(), b"outside file");

    let j = run.json();
    assert_eq!(j["verified"], true, "{j}");
    assert!(j.get("not_deleted").is_none(), "{j}");
    for f in j["files"].as_array().unwrap() {
        assert_eq!(f["verified"], true, "{f}");
    }
    let deleted = j["deleted"].as_array().unwrap();
    assert_eq!(deleted.len(), EXTRA.len(), "{j}");
    let at = |rel: &str| {
        deleted
            .iter()
            .position(|d| d["path"].as_str().unwrap().ends_with(&format!("/{rel}")))
            .unwrap_or_else(|| panic!("{rel} not deleted: {j}"))
    };
    for rel in EXTRA {
        let (rel, is_dir) = match rel.strip_suffix('/') {
            Some(r) => (r, true),
            None => (*rel, false),
        };
        let d = &deleted[at(rel)];
        let path = d["path"].as_str().unwrap();
        assert!(d.get("error").is_none(), "{d}");
        let kind = if is_dir {
            "dir"
        } else if ["out-file", "out-dir", "gone-link"].contains(&rel) {
            "symlink"
        } else {
            "file"
        };
        assert_eq!(d["kind"], kind, "{d}");
        let slash = if is_dir { "/" } else { "" };
        assert!(
            run.stderr.contains(&format!("deleting {path}{slash}\n")),
            "{rel}: {}",
            run.stderr
        );
        // Children before their directory.
        if let Some((parent, _)) = rel.rsplit_once('/').filter(|(p, _)| p.starts_with("old")) {
            assert!(at(parent) > at(rel), "{parent} before {rel}: {j}");
        }
    }
    // Only what changed was sent: a.bin's changed leaf, sub/new.bin, newdir/c.txt. The leaf
    // travels as the blocks that cover it, a datagram's worth of file each (the MTU less 64
    // bytes of headers): at most two of 8936 bytes at loopback's agreed 9000.
    let moved = j["bytes"].as_u64().unwrap();
    let block = j["mtu"].as_u64().unwrap() - 64;
    assert!(
        (50_007..=50_007 + (3 * 4096).max(2 * block)).contains(&moved),
        "{moved} bytes moved: {j}"
    );
}

/// A copy that fails (a source file where the destination holds a directory with something
/// in it) removes nothing, and says so.
fn check_failed(dst: &Path, run: &Run) {
    run.assert_failed();
    let j = run.json();
    assert_eq!(j["verified"], false, "{j}");
    assert_eq!(j["deleted"].as_array().unwrap().len(), 0, "{j}");
    assert!(
        j["not_deleted"]
            .as_str()
            .is_some_and(|w| w.contains("nothing deleted")),
        "{j}"
    );
    assert!(run.stderr.contains("--delete: nothing deleted"), "{run:#?}");
    assert!(!run.stderr.contains("deleting "), "{run:#?}");
    for rel in EXTRA {
        assert!(
            fs::symlink_metadata(dst.join(rel.trim_end_matches('/'))).is_ok(),
            "{rel} was deleted by a copy that failed"
        );
    }
}

/// Makes the next copy over `dst` fail: `a.bin` is a directory there.
fn break_a(dst: &Path) {
    fs::remove_file(dst.join("a.bin")).unwrap();
    fs::create_dir_all(dst.join("a.bin/in")).unwrap();
}

struct Daemon {
    _dir: tempfile::TempDir,
    root: PathBuf,
    local: PathBuf,
    outside: PathBuf,
    key: PathBuf,
    server: Server,
}

impl Daemon {
    fn new(args: &[&str]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let local = dir.path().join("local");
        let outside = dir.path().join("outside");
        for d in [&root, &local, &outside] {
            fs::create_dir_all(d).unwrap();
        }
        let key = keygen(dir.path(), "key");
        let server = Server::start_with(&root, &key, &[], args);
        Daemon {
            _dir: dir,
            root,
            local,
            outside,
            key,
            server,
        }
    }
    fn cp(&self, args: &[String]) -> Run {
        cp(&self.key, args)
    }
}

#[test]
fn delete_to_and_from_a_daemon_removes_only_what_the_source_lacks() {
    let fx = Daemon::new(&[]);
    // Up: local/t goes to root/far/t; far/ holds a sibling that is no part of the tree.
    let (src, dst) = (fx.local.join("t"), fx.root.join("far/t"));
    build(&src, &dst, &fx.outside);
    fs::write(fx.root.join("far/sibling"), b"not in the tree").unwrap();
    let args = |extra: &[&str]| {
        let mut v: Vec<String> = ["-r", "--delete", "--json"].map(String::from).to_vec();
        v.extend(extra.iter().map(|a| a.to_string()));
        v
    };
    let r = fx.cp(&args(&[&s(&src), &fx.server.url("far/")]));
    check(&src, &dst, &fx.outside, &r);
    assert_eq!(
        fs::read(fx.root.join("far/sibling")).unwrap(),
        b"not in the tree"
    );
    assert!(fx.server.log.contains("deleted far/t/olddir"));
    // Again: nothing left to delete, nothing to send but the tails.
    let r = fx.cp(&args(&[&s(&src), &fx.server.url("far/")]));
    r.assert_ok();
    assert_eq!(r.json()["deleted"].as_array().unwrap().len(), 0, "{r:#?}");

    // Down: root/u goes to local/down/u.
    let (src, dst) = (fx.root.join("u"), fx.local.join("down/u"));
    build(&src, &dst, &fx.outside);
    fs::write(fx.local.join("down/sibling"), b"not in the tree").unwrap();
    let r = fx.cp(&args(&[&fx.server.url("u"), &s(&fx.local.join("down"))]));
    check(&src, &dst, &fx.outside, &r);
    assert_eq!(
        fs::read(fx.local.join("down/sibling")).unwrap(),
        b"not in the tree"
    );

    // A copy that fails deletes nothing, either way.
    for (src, dst, up) in [
        (fx.local.join("t2"), fx.root.join("far/t2"), true),
        (fx.root.join("u2"), fx.local.join("down/u2"), false),
    ] {
        build(&src, &dst, &fx.outside);
        break_a(&dst);
        let r = if up {
            fx.cp(&args(&[&s(&src), &fx.server.url("far/")]))
        } else {
            fx.cp(&args(&[&fx.server.url("u2"), &s(&fx.local.join("down"))]))
        };
        check_failed(&dst, &r);
    }
}

/// The destination directory itself may be a link (followed, as the copy follows it); the
/// plain output says what went, and -q says nothing.
#[test]
fn delete_through_a_linked_destination_and_what_it_prints() {
    let fx = Daemon::new(&[]);
    let src = fx.local.join("t");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/keep"), b"keep").unwrap();
    fs::create_dir_all(fx.root.join("real/t/d")).unwrap();
    fs::write(fx.root.join("real/t/d/old"), b"old").unwrap();
    fs::write(fx.root.join("real/t/old2"), b"old").unwrap();
    symlink("real", fx.root.join("via")).unwrap();
    let r = fx.cp(&[
        "-r".into(),
        "--delete".into(),
        s(&src),
        fx.server.url("via/"),
    ]);
    r.assert_ok();
    assert_eq!(tree(&fx.root.join("real/t")), ["d", "d/keep"]);
    assert!(r.stderr.contains("deleting via/t/d/old\n"), "{r:#?}");
    assert!(r.stderr.contains("deleting via/t/old2\n"), "{r:#?}");
    assert!(r.stderr.contains(", 2 deleted"), "{r:#?}");

    fs::write(fx.root.join("real/t/old3"), b"old").unwrap();
    let r = fx.cp(&[
        "-r".into(),
        "--delete".into(),
        "-q".into(),
        s(&src),
        fx.server.url("via/"),
    ]);
    r.assert_ok();
    assert_eq!(r.stderr, "", "{r:#?}");
    assert!(!fx.root.join("real/t/old3").exists());

    // Without -r it is a usage error (exit 2), and nothing runs.
    let r = fx.cp(&["--delete".into(), s(&src), fx.server.url("via/")]);
    assert_eq!(r.status.code(), Some(2), "{r:#?}");
    assert!(r.stderr.contains("--delete needs -r"), "{r:#?}");
}

/// `hayate serve --no-delete` copies the tree and refuses every removal (exit 1, each named).
#[test]
fn a_no_delete_daemon_copies_and_removes_nothing() {
    let fx = Daemon::new(&["--no-delete"]);
    let (src, dst) = (fx.local.join("t"), fx.root.join("t"));
    build(&src, &dst, &fx.outside);
    let r = fx.cp(&[
        "-r".into(),
        "--delete".into(),
        "--json".into(),
        s(&src),
        fx.server.url(""),
    ]);
    r.assert_failed();
    let j = r.json();
    for f in j["files"].as_array().unwrap() {
        assert_eq!(f["verified"], true, "{f}");
    }
    let deleted = j["deleted"].as_array().unwrap();
    assert_eq!(deleted.len(), EXTRA.len(), "{j}");
    for d in deleted {
        assert!(d["error"].as_str().unwrap().contains("--no-delete"), "{d}");
    }
    assert!(r.stderr.contains("cannot delete t/olddir/: "), "{r:#?}");
    for rel in EXTRA {
        assert!(fs::symlink_metadata(dst.join(rel.trim_end_matches('/'))).is_ok());
    }
}

/// A client holding the key asks a daemon for removals with the protocol core itself: none
/// outside the root (or outside the directory named) happens, whatever the path says; a link
/// is removed as a link.
#[test]
fn a_daemon_removes_nothing_outside_its_root_whatever_a_client_asks() {
    use hayate_proto::conn::{BlockSink, BlockSource, Config, Connection};
    use hayate_proto::control::MetaOp;
    use hayate_proto::crypto::Psk;
    use hayate_proto::wire::AddrFamily;
    use hayate_proto::{Event, StorageError, XferId};

    struct Nothing;
    impl BlockSource for Nothing {
        fn read(&mut self, _: XferId, _: u64, _: &mut [u8]) -> Result<(), StorageError> {
            Err(StorageError::NotOpen)
        }
    }
    impl BlockSink for Nothing {
        fn write(&mut self, _: XferId, _: u64, _: &[u8]) -> Result<(), StorageError> {
            Err(StorageError::NotOpen)
        }
    }

    /// Each op's answer from the daemon `fx`.
    fn ask(fx: &Daemon, ops: &[MetaOp]) -> Vec<Result<(), String>> {
        let text = hayate_io::keyfile::read_key_file(&fx.key).unwrap();
        let psk = Psk::parse_key_file(&text.contents).unwrap();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(2)))
            .unwrap();
        let to: std::net::SocketAddr = ([127, 0, 0, 1], fx.server.port).into();
        let mut c = Connection::client(Config::default(), &psk, AddrFamily::V4, Instant::now());
        let mut ids = Vec::new();
        let mut answers = vec![None; ops.len()];
        let mut buf = vec![0u8; 65536];
        let until = Instant::now() + Duration::from_secs(20);
        while answers.iter().any(Option::is_none) {
            assert!(Instant::now() < until, "no answers: {answers:?}");
            let now = Instant::now();
            if c.poll_timeout(now).is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
            let mut out = vec![0u8; c.max_datagram()];
            while let Some(n) = c.poll_transmit(now, &mut out, &mut Nothing) {
                let _ = sock.send_to(&out[..n], to);
            }
            while let Ok((n, _)) = sock.recv_from(&mut buf) {
                c.handle_datagram(Instant::now(), &mut buf[..n], &mut Nothing);
            }
            while let Some(e) = c.poll_event() {
                match e {
                    Event::Connected => ids = ops.iter().map(|op| c.meta(op.clone())).collect(),
                    Event::MetaReplied { id, result, .. } => {
                        let i = ids.iter().position(|x| *x == id).expect("asked");
                        answers[i] = Some(result.map(|_| ()));
                    }
                    Event::Closed { error } => panic!("session closed: {error:?}"),
                    _ => {}
                }
            }
        }
        answers.into_iter().map(Option::unwrap).collect()
    }

    let rm = |top: &str, path: &str, dir: bool| MetaOp::Remove {
        top: top.into(),
        path: path.into(),
        dir,
    };
    let fx = Daemon::new(&[]);
    let out = &fx.outside;
    fs::write(out.join("secret"), b"secret").unwrap();
    fs::create_dir_all(out.join("d")).unwrap();
    fs::write(out.join("d/f"), b"f").unwrap();
    fs::create_dir_all(fx.root.join("t/sub")).unwrap();
    fs::write(fx.root.join("t/in.txt"), b"in").unwrap();
    fs::write(fx.root.join("t/sub/g"), b"g").unwrap();
    fs::write(fx.root.join("top.txt"), b"top").unwrap();
    symlink(out, fx.root.join("t/link-out")).unwrap();
    symlink(out.join("secret"), fx.root.join("t/secret-link")).unwrap();
    symlink(out, fx.root.join("top-out")).unwrap();
    symlink("t/sub", fx.root.join("t-sub")).unwrap();
    let outside_name = out.file_name().unwrap().to_str().unwrap().to_string();

    let refused = [
        rm("..", &format!("{outside_name}/secret"), false),
        rm(&s(out), "secret", false),
        rm("/", "etc/hostname", false),
        rm("top-out", "secret", false),
        rm("top-out", "d", true),
        rm("t", "../top.txt", false),
        rm("t", "sub/../in.txt", false),
        rm("t", "link-out/secret", false),
        rm("t", "link-out/d/f", false),
        rm("t", "/etc/hostname", false),
        rm("t", "", true),
        rm("t", ".", true),
        rm("t/sub", "g/", false),
    ];
    let answers = ask(&fx, &refused);
    for (op, a) in refused.iter().zip(&answers) {
        let e = a.as_ref().expect_err(&format!("{op:?} was allowed"));
        assert!(
            !e.contains(fx.root.to_str().unwrap()),
            "{op:?}: the error names the root: {e}"
        );
    }
    assert_eq!(fs::read(out.join("secret")).unwrap(), b"secret");
    assert_eq!(fs::read(out.join("d/f")).unwrap(), b"f");
    for f in ["t/in.txt", "t/sub/g", "top.txt"] {
        assert!(fx.root.join(f).exists(), "{f}");
    }

    // Beneath the root: links themselves, a file through a top that is a link inside.
    let allowed = [
        rm("t", "link-out", false),
        rm("t", "secret-link", false),
        rm("t-sub", "g", false),
        rm("t", "in.txt", false),
    ];
    for (op, a) in allowed.iter().zip(ask(&fx, &allowed)) {
        a.unwrap_or_else(|e| panic!("{op:?}: {e}"));
    }
    assert_eq!(tree(&fx.root.join("t")), ["sub"]);
    assert_eq!(fs::read(out.join("secret")).unwrap(), b"secret");
    assert_eq!(fs::read(out.join("d/f")).unwrap(), b"f");
}

/// Through a real sshd: the far side is `hayate serve --stdio`; absolute paths both ways.
#[test]
fn delete_over_ssh_both_ways() {
    let Some(sshd) = Sshd::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let p = |rel: &str| dir.path().join(rel);
    let outside = p("outside");
    let cp = |args: &[&str]| {
        let mut c = hayate();
        c.arg("cp")
            .arg("-e")
            .arg(sshd.ssh_command())
            .arg("--remote-path")
            .arg(BIN)
            .args(["-r", "--delete", "--json"])
            .args(args);
        spawn_cmd(&mut c).wait(Duration::from_secs(120))
    };
    let remote = |path: &Path| format!("{}:{}", sshd.target(), path.display());

    // Up into far/ (the tree goes to far/t).
    build(&p("t"), &p("far/t"), &outside);
    let r = cp(&[&s(&p("t")), &remote(&p("far"))]);
    check(&p("t"), &p("far/t"), &outside, &r);
    // Down into back/ (the tree goes to back/t).
    build(&p("far/u"), &p("back/u"), &outside);
    let r = cp(&[&remote(&p("far/u")), &s(&p("back"))]);
    check(&p("far/u"), &p("back/u"), &outside, &r);

    // A failed copy deletes nothing, either way.
    build(&p("t2"), &p("far/t2"), &outside);
    break_a(&p("far/t2"));
    check_failed(&p("far/t2"), &cp(&[&s(&p("t2")), &remote(&p("far"))]));
    build(&p("far/u2"), &p("back/u2"), &outside);
    break_a(&p("back/u2"));
    check_failed(&p("back/u2"), &cp(&[&remote(&p("far/u2")), &s(&p("back"))]));
}
