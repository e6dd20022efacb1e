//! The real `hayate` binary on loopback: each test starts its own `hayate serve` on
//! 127.0.0.1 and drives `hayate cp` / `hayate keygen` as a user would, then checks exit
//! codes, messages, JSON and the files on both sides byte for byte.

mod common;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use tempfile::TempDir;

/// A temp dir with `root/` (served), `local/` (the client's side), `outside/` (must never
/// be touched through the server), a key and a running server.
struct Fx {
    tmp: TempDir,
    root: PathBuf,
    local: PathBuf,
    outside: PathBuf,
    key: PathBuf,
    srv: Server,
}

impl Fx {
    fn new() -> Fx {
        Fx::with_server_args(&[])
    }
    /// [`Fx::new`] with these options for the server.
    fn with_server_args(args: &[&str]) -> Fx {
        Fx::with_server(&[], args)
    }
    /// [`Fx::new`] with these environment variables and options for the server.
    fn with_server(env: &[(&str, &Path)], args: &[&str]) -> Fx {
        let tmp = tempfile::Builder::new()
            .prefix("hayate-loopback-")
            .tempdir()
            .expect("tempdir");
        let root = tmp.path().join("root");
        let local = tmp.path().join("local");
        let outside = tmp.path().join("outside");
        for d in [&root, &local, &outside] {
            fs::create_dir(d).unwrap();
        }
        let key = keygen(tmp.path(), "key");
        let srv = Server::start_with(&root, &key, env, args);
        Fx {
            tmp,
            root,
            local,
            outside,
            key,
            srv,
        }
    }
    fn url(&self, p: &str) -> String {
        self.srv.url(p)
    }
    fn cp<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Run {
        cp(&self.key, args)
    }
}

fn hex(h: &blake3::Hash) -> String {
    h.to_hex().to_string()
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn lower(s: &str) -> String {
    s.to_lowercase()
}

/// Checks the one-object JSON summary of a single-file transfer of `len` bytes.
fn check_json(run: &Run, len: u64, hash: &blake3::Hash) -> serde_json::Value {
    let j = run.json();
    for k in [
        "bytes",
        "seconds",
        "goodput_bps",
        "packets_sent",
        "packets_retransmitted",
        "blake3",
        "verified",
        "srtt_ms",
        "min_rtt_ms",
    ] {
        assert!(j.get(k).is_some(), "JSON lacks {k:?}: {j}");
    }
    // What was not measured is absent: no error on success, and a loss ratio only for
    // what this side sent (a download's sender is the far side).
    assert!(j.get("error").is_none(), "{j}");
    assert_eq!(
        j.get("loss_ratio").is_some(),
        j["data_packets_sent"].as_u64() > Some(0),
        "{j}"
    );
    assert_eq!(j["bytes"].as_u64(), Some(len), "{j}");
    assert_eq!(j["verified"].as_bool(), Some(true), "{j}");
    assert_eq!(j["blake3"].as_str(), Some(hex(hash).as_str()), "{j}");
    assert!(j["seconds"].as_f64().is_some_and(|x| x >= 0.0), "{j}");
    assert!(j["goodput_bps"].as_f64().is_some_and(|x| x >= 0.0), "{j}");
    assert!(j["packets_sent"].as_u64().is_some_and(|x| x > 0), "{j}");
    assert!(j["packets_retransmitted"].as_u64().is_some(), "{j}");
    if let Some(l) = j.get("loss_ratio") {
        assert!(l.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x)), "{j}");
    }
    j
}

/// Uploads a `len`-byte file and downloads it again, checking content, JSON and leftovers.
fn roundtrip(len: u64, extra: &[&str]) {
    let fx = Fx::new();
    let src = fx.local.join("src.bin");
    let hash = write_random(&src, len, len);

    let mut args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
    args.extend(["--json".into(), s(&src), fx.url("up.bin")]);
    let up = fx.cp(&args);
    up.assert_ok();
    check_json(&up, len, &hash);
    let on_server = fx.root.join("up.bin");
    assert_eq!(fs::metadata(&on_server).unwrap().len(), len);
    assert_eq!(hash_file(&on_server), hash, "uploaded content differs");
    if len <= 1 << 20 {
        assert_eq!(fs::read(&on_server).unwrap(), fs::read(&src).unwrap());
    }

    let dst = fx.local.join("down.bin");
    let mut args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
    args.extend(["--json".into(), fx.url("up.bin"), s(&dst)]);
    let down = fx.cp(&args);
    down.assert_ok();
    check_json(&down, len, &hash);
    assert_eq!(fs::metadata(&dst).unwrap().len(), len);
    assert_eq!(hash_file(&dst), hash, "downloaded content differs");
    if len <= 1 << 20 {
        assert_eq!(fs::read(&dst).unwrap(), fs::read(&src).unwrap());
    }
    assert_eq!(part_files(&fx.root), Vec::<String>::new());
    assert_eq!(part_files(&fx.local), Vec::<String>::new());
}

#[test]
fn roundtrip_empty_file() {
    roundtrip(0, &[]);
}

#[test]
fn roundtrip_one_byte() {
    roundtrip(1, &[]);
}

#[test]
fn roundtrip_odd_size_just_over_three_blocks() {
    let bs = hayate_proto::wire::block_size(1500, hayate_proto::wire::AddrFamily::V4);
    roundtrip(bs as u64 * 3 + 7, &[]);
}

#[test]
fn roundtrip_odd_size_100003() {
    roundtrip(100_003, &[]);
}

#[test]
fn roundtrip_odd_size_small_mtu() {
    // The smallest MTU allowed, so blocks are small and many.
    roundtrip(100_003, &["--mtu", "1280"]);
}

#[test]
fn roundtrip_256_mib() {
    let t = std::time::Instant::now();
    roundtrip(256 << 20, &["--rate", "max"]);
    eprintln!("256 MiB up and down in {:.1} s", t.elapsed().as_secs_f64());
}

/// Both sides' AEAD on threads (the default for a client on 4 cores or more; on fewer, as on
/// CI's, the loop's thread seals and opens): a `hayate-seal` thread seals and sends, a
/// `hayate-open` thread receives and opens. A file goes up and comes back down, paced so
/// that the copies last a while, verified and whole both ways, and each process had both
/// threads while it copied.
#[test]
fn a_copy_with_its_aead_on_threads_is_verified_both_ways() {
    let fx = Fx::with_server(&[("HAYATE_AEAD", Path::new("threads"))], &[]);
    let aead_threads = |pid| {
        let names = thread_names(pid);
        ["hayate-seal", "hayate-open"]
            .iter()
            .all(|t| names.iter().any(|n| n == t))
    };
    assert!(aead_threads(fx.srv.pid()), "the server has no AEAD threads");
    let src = fx.local.join("src.bin");
    let len = 24 << 20;
    let hash = write_random(&src, len, 9);
    let down = fx.local.join("down.bin");
    for (from, to) in [(s(&src), fx.url("up.bin")), (fx.url("up.bin"), s(&down))] {
        let mut cmd = hayate();
        cmd.env("HAYATE_AEAD", "threads")
            .args(["cp", "--json", "--rate", "300M", "--key-file"])
            .arg(&fx.key)
            .args([&from, &to]);
        let mut job = spawn_cmd(&mut cmd);
        let mut threads = false;
        while !job.try_finished() {
            threads |= aead_threads(job.pid());
            std::thread::sleep(Duration::from_millis(5));
        }
        let run = job.wait(Duration::from_secs(60));
        run.assert_ok();
        check_json(&run, len, &hash);
        assert!(threads, "{from} -> {to}: the client had no AEAD threads");
    }
    assert_eq!(hash_file(&fx.root.join("up.bin")), hash);
    assert_eq!(hash_file(&down), hash);
}

#[test]
fn several_files_into_a_remote_dir_and_back() {
    let fx = Fx::new();
    let sizes = [("a", 0u64), ("b", 1), ("c", 100_003)];
    let mut hashes = Vec::new();
    for (name, len) in sizes {
        hashes.push(write_random(&fx.local.join(name), len, len + 7));
    }
    let srcs: Vec<String> = sizes.iter().map(|(n, _)| s(&fx.local.join(n))).collect();

    fs::create_dir(fx.root.join("dir")).unwrap();
    let mut args = vec!["--json".to_string()];
    args.extend(srcs.clone());
    args.push(fx.url("dir/"));
    let up = fx.cp(&args);
    up.assert_ok();
    let j = up.json();
    assert_eq!(j["verified"].as_bool(), Some(true), "{j}");
    assert_eq!(j["bytes"].as_u64(), Some(100_004), "{j}");
    let files = j["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no files: {j}"));
    assert_eq!(files.len(), 3, "{j}");
    for ((name, len), hash) in sizes.iter().zip(&hashes) {
        let f = files
            .iter()
            .find(|f| f["path"].as_str().is_some_and(|p| p.ends_with(name)))
            .unwrap_or_else(|| panic!("no entry for {name}: {j}"));
        assert_eq!(f["bytes"].as_u64(), Some(*len), "{f}");
        assert_eq!(f["blake3"].as_str(), Some(hex(hash).as_str()), "{f}");
        let got = fx.root.join("dir").join(name);
        assert_eq!(
            fs::read(&got).unwrap(),
            fs::read(fx.local.join(name)).unwrap()
        );
    }

    // And all three back into a local directory.
    let into = fx.local.join("back");
    fs::create_dir(&into).unwrap();
    let mut args = vec!["--json".to_string()];
    args.extend(sizes.iter().map(|(n, _)| fx.url(&format!("dir/{n}"))));
    args.push(s(&into));
    let down = fx.cp(&args);
    down.assert_ok();
    let j = down.json();
    assert_eq!(j["verified"].as_bool(), Some(true), "{j}");
    assert_eq!(j["files"].as_array().map(Vec::len), Some(3), "{j}");
    for (name, _) in sizes {
        assert_eq!(
            fs::read(into.join(name)).unwrap(),
            fs::read(fx.local.join(name)).unwrap(),
            "{name}"
        );
    }
    assert_eq!(part_files(&fx.root), Vec::<String>::new());
    assert_eq!(part_files(&fx.local), Vec::<String>::new());
}

#[test]
fn several_sources_need_the_remote_path_to_be_a_directory() {
    // No trailing slash: with several sources PATH is still a directory, which must exist
    // (as with scp: a typo is not made into a directory).
    let fx = Fx::new();
    write_random(&fx.local.join("a"), 10, 1);
    write_random(&fx.local.join("b"), 20, 2);
    let r = fx.cp(&[s(&fx.local.join("a")), s(&fx.local.join("b")), fx.url("d")]);
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert_eq!(r.stderr.trim(), "hayate: d: no such directory", "{r:#?}");
    assert_eq!(tree(&fx.root), Vec::<String>::new());
    fs::create_dir(fx.root.join("d")).unwrap();
    fx.cp(&[s(&fx.local.join("a")), s(&fx.local.join("b")), fx.url("d")])
        .assert_ok();
    assert_eq!(tree(&fx.root), ["d", "d/a", "d/b"]);
    assert_eq!(
        fs::read(fx.root.join("d/b")).unwrap(),
        fs::read(fx.local.join("b")).unwrap()
    );
}

#[test]
fn two_sources_with_one_destination_are_refused() {
    let fx = Fx::new();
    for d in ["x", "y"] {
        fs::create_dir(fx.local.join(d)).unwrap();
        fs::create_dir(fx.root.join(d)).unwrap();
        write_random(&fx.local.join(d).join("f"), 5000, d.len() as u64);
        write_random(&fx.root.join(d).join("f"), 5000, 3 + d.len() as u64);
    }
    let before = tree(fx.tmp.path());
    let up = fx.cp(&[
        s(&fx.local.join("x/f")),
        s(&fx.local.join("y/f")),
        fx.url("d/"),
    ]);
    up.assert_failed();
    assert!(up.stderr.contains("d/f"), "{up:#?}");
    let into = s(&fx.local);
    let down = fx.cp(&[fx.url("x/f"), fx.url("y/f"), into]);
    down.assert_failed();
    assert!(down.stderr.contains("local/f"), "{down:#?}");
    assert_eq!(tree(fx.tmp.path()), before, "something was written");
}

/// `cp F DEST` with one file: the server decides between `DEST/F` (a directory) and `DEST`
/// (anything else), and the report names where the file went.
#[test]
fn one_file_goes_into_an_existing_remote_dir_or_becomes_the_path() {
    let fx = Fx::new();
    let src = fx.local.join("f.bin");
    write_random(&src, 5000, 21);
    fs::create_dir(fx.root.join("d")).unwrap();
    fs::write(fx.root.join("old"), b"x").unwrap();
    // A link to a directory leads into it, as with scp (the link stays).
    std::os::unix::fs::symlink("d", fx.root.join("ln")).unwrap();
    for (dest, lands) in [
        ("d", "d/f.bin"),
        ("new", "new"),
        ("old", "old"),
        ("ln", "ln/f.bin"),
        ("d/g", "d/g"),
    ] {
        let up = fx.cp(&["--json".into(), s(&src), fx.url(dest)]);
        up.assert_ok();
        let j = up.json();
        assert_eq!(j["files"][0]["dest"].as_str(), Some(lands), "{dest}: {j}");
        let got = fx.root.join(lands);
        assert!(!fs::symlink_metadata(&got).unwrap().is_symlink(), "{dest}");
        assert_eq!(fs::read(&got).unwrap(), fs::read(&src).unwrap(), "{dest}");
    }
    assert_eq!(tree(&fx.root), ["d", "d/f.bin", "d/g", "ln", "new", "old"]);
    assert_eq!(fs::read_link(fx.root.join("ln")).unwrap(), Path::new("d"));

    // Several sources into the link to a directory: into the directory. Into a link to a
    // file: refused, as into the file itself.
    let src2 = fx.local.join("f2.bin");
    write_random(&src2, 3000, 22);
    fx.cp(&[s(&src), s(&src2), fx.url("ln")]).assert_ok();
    assert_eq!(
        fs::read(fx.root.join("d/f2.bin")).unwrap(),
        fs::read(&src2).unwrap()
    );
    std::os::unix::fs::symlink("old", fx.root.join("ln-file")).unwrap();
    for dest in ["old", "ln-file"] {
        let r = fx.cp(&[s(&src), s(&src2), fx.url(dest)]);
        r.assert_failed();
        assert!(
            r.stderr.contains(&format!("{dest}: not a directory")),
            "{r:#?}"
        );
    }
    assert_eq!(
        fs::read(fx.root.join("old")).unwrap(),
        fs::read(&src).unwrap()
    );
}

#[test]
fn download_into_existing_dir_keeps_the_name() {
    let fx = Fx::new();
    write_random(&fx.root.join("r.bin"), 5000, 3);
    fx.cp(&[fx.url("r.bin"), s(&fx.local)]).assert_ok();
    assert_eq!(
        fs::read(fx.local.join("r.bin")).unwrap(),
        fs::read(fx.root.join("r.bin")).unwrap()
    );
}

/// A lone source is asked for without listing it first; refused as a directory, it must
/// still be reported as one, exactly as next to another source (which is listed).
#[test]
fn a_directory_source_without_r_is_reported_as_a_dir_alone_or_not() {
    let fx = Fx::new();
    fs::create_dir(fx.root.join("d")).unwrap();
    write_random(&fx.root.join("d").join("f"), 3000, 31);
    write_random(&fx.root.join("g"), 2000, 32);
    let dir_entry = |run: &Run| {
        run.assert_failed();
        let j = run.json();
        let e = j["other_entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["path"] == "d")
            .unwrap_or_else(|| panic!("no entry for d among other_entries: {j}"))
            .clone();
        assert_eq!(e["kind"], "dir", "{j}");
        assert_eq!(e["verified"], false, "{j}");
        assert!(
            e["error"].as_str().is_some_and(|m| m.contains("use -r")),
            "{j}"
        );
        assert!(
            !j["files"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["path"] == "d"),
            "{j}"
        );
        assert!(
            run.stderr.contains("d: is a directory (use -r)"),
            "{run:#?}"
        );
        e
    };

    let alone = fx.cp(&["--json".into(), fx.url("d"), s(&fx.local)]);
    let alone_entry = dir_entry(&alone);
    assert_eq!(alone.json()["file_count"], 0, "{alone:#?}");
    // Named as the destination itself, too.
    let named = fx.cp(&["--json".into(), fx.url("d"), s(&fx.local.join("new"))]);
    dir_entry(&named);
    assert_eq!(
        tree(&fx.local),
        Vec::<String>::new(),
        "something was written"
    );

    let with_g = fx.cp(&["--json".into(), fx.url("d"), fx.url("g"), s(&fx.local)]);
    assert_eq!(dir_entry(&with_g), alone_entry);
    assert_eq!(tree(&fx.local), ["g"]);
}

#[test]
fn a_server_traces_each_sessions_rate_control_and_counts_what_it_sent() {
    let fx = Fx::new();
    let trace = fx.tmp.path().join("cc.tsv");
    // Sessions on four threads: each still gets its own file, numbered in the process.
    let srv = Server::start_with(
        &fx.root,
        &fx.key,
        &[("HAYATE_CC_TRACE", &trace)],
        &["--threads", "4"],
    );
    write_random(&fx.root.join("t.bin"), 4 << 20, 9);
    for n in ["a", "b", "c", "d"] {
        cp(&fx.key, &[srv.url("t.bin"), s(&fx.local.join(n))]).assert_ok();
    }
    assert!(eventually(Duration::from_secs(10), || srv
        .log
        .text()
        .matches("session closed")
        .count()
        == 4));
    // The server sent the downloads: each session's trace has the sender's columns.
    for n in [1, 2, 3, 4] {
        let text = fs::read_to_string(trace.with_extension(format!("tsv.{n}"))).unwrap();
        let mut lines = text.lines();
        let head: Vec<&str> = lines.next().unwrap().split('\t').collect();
        let sent = head.iter().position(|c| *c == "sent_bytes").unwrap();
        let last: Vec<&str> = lines.last().expect("trace lines").split('\t').collect();
        assert!(last[sent].parse::<u64>().unwrap() >= 4 << 20, "{text}");
    }
    // 4 MiB in datagrams of at most 8972 bytes (loopback's agreed 9000): that many data
    // packets at least.
    let log = srv.log.text();
    let data: Vec<u64> = log
        .lines()
        .filter_map(|l| l.split(" out, ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(data.len(), 4, "{log}");
    assert!(data.iter().all(|&d| d >= (4 << 20) / 8972), "{log}");
}

#[test]
fn json_is_the_only_thing_on_stdout() {
    let fx = Fx::new();
    let src = fx.local.join("j.bin");
    let hash = write_random(&src, 50_000, 9);
    // Even with stats lines requested, stdout carries only the JSON object.
    let up = fx.cp(&["--json", "--interval", "0.01", &s(&src), &fx.url("j.bin")]);
    up.assert_ok();
    check_json(&up, 50_000, &hash);
    assert_eq!(up.stdout.trim().lines().count(), 1, "{up:#?}");
}

#[test]
fn quiet_prints_nothing_on_success() {
    let fx = Fx::new();
    let src = fx.local.join("q.bin");
    write_random(&src, 100_003, 4);
    let up = fx.cp(&["-q", &s(&src), &fx.url("q.bin")]);
    up.assert_ok();
    assert_eq!(
        (up.stdout.as_str(), up.stderr.as_str()),
        ("", ""),
        "{up:#?}"
    );
    let down = fx.cp(&["-q", &fx.url("q.bin"), &s(&fx.local.join("q2.bin"))]);
    down.assert_ok();
    assert_eq!(
        (down.stdout.as_str(), down.stderr.as_str()),
        ("", ""),
        "{down:#?}"
    );
    assert_eq!(
        fs::read(fx.local.join("q2.bin")).unwrap(),
        fs::read(&src).unwrap()
    );
}

#[test]
fn key_file_from_environment() {
    let fx = Fx::new();
    let src = fx.local.join("e.bin");
    write_random(&src, 3000, 5);
    let run = spawn_cmd(hayate().env("HAYATE_KEY_FILE", &fx.key).args([
        "cp",
        &s(&src),
        &fx.url("e.bin"),
    ]))
    .wait(Duration::from_secs(60));
    run.assert_ok();
    assert_eq!(
        fs::read(fx.root.join("e.bin")).unwrap(),
        fs::read(&src).unwrap()
    );
    // And without any key: a clear error before anything is sent.
    let run = common::run(["cp".to_string(), s(&src), fx.url("e2.bin")]);
    run.assert_failed();
    assert!(lower(&run.stderr).contains("key"), "{run:#?}");
    assert!(!fx.root.join("e2.bin").exists());
    // A key file that is not there: named, and its cause said once.
    let missing = fx.tmp.path().join("no-such-key");
    let run = common::run([
        "cp".to_string(),
        "--key-file".to_string(),
        s(&missing),
        s(&src),
        fx.url("e3.bin"),
    ]);
    run.assert_failed();
    assert!(run.stderr.contains(&s(&missing)), "{run:#?}");
    assert_eq!(
        run.stderr.matches("No such file or directory").count(),
        1,
        "{run:#?}"
    );
}

#[test]
fn wrong_key_is_refused() {
    let fx = Fx::new();
    let other = keygen(fx.tmp.path(), "other-key");
    let src = fx.local.join("w.bin");
    write_random(&src, 100_003, 6);

    let up = cp(&other, &[s(&src), fx.url("w.bin")]);
    up.assert_failed();
    let err = lower(&up.stderr);
    assert!(
        err.contains("key") && err.contains("authentication"),
        "{up:#?}"
    );
    assert!(up.elapsed < Duration::from_secs(10), "{up:#?}");
    assert_eq!(
        tree(&fx.root),
        Vec::<String>::new(),
        "server created something"
    );

    write_random(&fx.root.join("r.bin"), 1000, 6);
    let dst = fx.local.join("r.bin");
    let down = cp(&other, &[fx.url("r.bin"), s(&dst)]);
    down.assert_failed();
    let err = lower(&down.stderr);
    assert!(
        err.contains("key") && err.contains("authentication"),
        "{down:#?}"
    );
    assert!(!dst.exists());
    assert_eq!(part_files(&fx.local), Vec::<String>::new());
    assert_eq!(tree(&fx.root), ["r.bin"]);

    // --json: one object with the error, and no RTT (none was measured: the handshake
    // failed), no loss ratio, no hash.
    for args in [
        ["--json".to_string(), s(&src), fx.url("w.bin")],
        ["--json".to_string(), fx.url("r.bin"), s(&dst)],
    ] {
        let r = cp(&other, &args);
        assert_eq!(r.status.code(), Some(1), "{r:#?}");
        let j = r.json();
        let e = lower(
            j["error"]
                .as_str()
                .unwrap_or_else(|| panic!("no error: {j}")),
        );
        assert!(e.contains("key") && e.contains("authentication"), "{j}");
        for absent in ["srtt_ms", "min_rtt_ms", "loss_ratio", "blake3"] {
            assert!(j.get(absent).is_none(), "{absent} was not measured: {j}");
        }
        assert_eq!(j["verified"], false, "{j}");
        assert_eq!(j["bytes"], 0, "{j}");
    }

    // The server is unharmed: the right key still works.
    fx.cp(&[s(&src), fx.url("w.bin")]).assert_ok();
}

/// The refusal names the path and says it escapes the root.
fn assert_escape_refused(run: &Run, path: &str) {
    run.assert_failed();
    let err = lower(&run.stderr);
    assert!(
        err.contains("escapes") && err.contains("root") && run.stderr.contains(path),
        "unclear refusal for {path}: {run:#?}"
    );
}

#[test]
fn dotdot_paths_are_refused() {
    let fx = Fx::new();
    let src = fx.local.join("x");
    write_random(&src, 1000, 7);
    fs::create_dir(fx.root.join("sub")).unwrap();
    let before = tree(fx.tmp.path());

    for p in ["../x", "sub/../../x", "../outside/x"] {
        let up = fx.cp(&[s(&src), fx.url(p)]);
        assert_escape_refused(&up, p);
    }
    assert!(!fx.tmp.path().join("x").exists());
    assert_eq!(tree(&fx.outside), Vec::<String>::new());

    fs::write(fx.outside.join("secret"), b"secret").unwrap();
    let dst = fx.local.join("got");
    let down = fx.cp(&[fx.url("../outside/secret"), s(&dst)]);
    assert_escape_refused(&down, "../outside/secret");
    assert!(!dst.exists());
    let mut after = tree(fx.tmp.path());
    after.retain(|p| p != "outside/secret");
    assert_eq!(after, before, "something was written");
}

#[test]
fn absolute_paths_are_refused() {
    let fx = Fx::new();
    let src = fx.local.join("x");
    write_random(&src, 1000, 8);

    // hayate://h:p//abs/path names the absolute path /abs/path.
    let target = fx.outside.join("x");
    let abs = s(&target);
    let up = fx.cp(&[s(&src), fx.url(&abs)]);
    assert_escape_refused(&up, &abs);
    assert!(!target.exists());
    assert_eq!(tree(&fx.outside), Vec::<String>::new());

    let etc = format!("/etc/hayate-loopback-test-{}", std::process::id());
    let up = fx.cp(&[s(&src), fx.url(&etc)]);
    let leaked = Path::new(&etc).exists();
    let _ = fs::remove_file(&etc);
    assert!(!leaked, "{etc} was written");
    assert_escape_refused(&up, &etc);

    let dst = fx.local.join("passwd");
    let down = fx.cp(&[fx.url("/etc/passwd"), s(&dst)]);
    assert_escape_refused(&down, "/etc/passwd");
    assert!(!dst.exists());
    assert_eq!(part_files(&fx.local), Vec::<String>::new());
    assert_eq!(tree(&fx.root), Vec::<String>::new());
}

#[test]
fn symlinks_out_of_the_root_are_refused() {
    let fx = Fx::new();
    fs::write(fx.outside.join("secret"), b"secret").unwrap();
    symlink(fx.outside.join("secret"), fx.root.join("abs-file")).unwrap();
    symlink("../outside/secret", fx.root.join("rel-file")).unwrap();
    symlink(&fx.outside, fx.root.join("abs-dir")).unwrap();
    symlink("../outside", fx.root.join("rel-dir")).unwrap();
    // A relative link that stays inside is fine (so the refusals are about escaping).
    write_random(&fx.root.join("inside.bin"), 777, 10);
    symlink("inside.bin", fx.root.join("in-link")).unwrap();
    fx.cp(&[fx.url("in-link"), s(&fx.local.join("in-link"))])
        .assert_ok();
    assert_eq!(
        fs::read(fx.local.join("in-link")).unwrap(),
        fs::read(fx.root.join("inside.bin")).unwrap()
    );

    for p in ["abs-file", "rel-file", "abs-dir/secret", "rel-dir/secret"] {
        let dst = fx.local.join("got");
        let down = fx.cp(&[fx.url(p), s(&dst)]);
        assert!(
            lower(&down.stderr).contains("escapes"),
            "unclear refusal for {p}: {down:#?}"
        );
        down.assert_failed();
        assert!(!dst.exists(), "{p} was downloaded");
    }

    let src = fx.local.join("up");
    write_random(&src, 5000, 11);
    for p in ["abs-dir/up", "rel-dir/up", "abs-dir/new/up"] {
        let up = fx.cp(&[s(&src), fx.url(p)]);
        assert!(
            lower(&up.stderr).contains("escapes"),
            "unclear refusal for {p}: {up:#?}"
        );
        up.assert_failed();
    }
    // Uploading onto a symlinked file name must not write through it either.
    let up = fx.cp(&[s(&src), fx.url("abs-file")]);
    assert_eq!(
        fs::read(fx.outside.join("secret")).unwrap(),
        b"secret",
        "{up:#?}"
    );
    assert_eq!(tree(&fx.outside), ["secret"], "written outside the root");
    assert_eq!(part_files(&fx.local), Vec::<String>::new());
}

#[test]
fn missing_source_is_named_and_the_others_still_go() {
    let fx = Fx::new();
    write_random(&fx.local.join("a"), 1000, 12);
    write_random(&fx.local.join("b"), 100_003, 13);
    let missing = fx.local.join("no-such-file");
    fs::create_dir(fx.root.join("m")).unwrap();
    let up = fx.cp(&[
        s(&fx.local.join("a")),
        s(&missing),
        s(&fx.local.join("b")),
        fx.url("m/"),
    ]);
    up.assert_failed();
    assert!(
        up.stderr.contains("no-such-file") && lower(&up.stderr).contains("no such file"),
        "{up:#?}"
    );
    assert_eq!(up.stderr.matches("no-such-file").count(), 1, "{up:#?}");
    assert_eq!(tree(&fx.root), ["m", "m/a", "m/b"]);
    for n in ["a", "b"] {
        assert_eq!(
            fs::read(fx.root.join("m").join(n)).unwrap(),
            fs::read(fx.local.join(n)).unwrap()
        );
    }

    // Alone: same clear error.
    let up = fx.cp(&[s(&missing), fx.url("x")]);
    up.assert_failed();
    assert!(up.stderr.contains("no-such-file"), "{up:#?}");
    assert!(!fx.root.join("x").exists());

    // A missing remote source, next to one that exists.
    write_random(&fx.root.join("here"), 2000, 14);
    let into = fx.local.join("into");
    fs::create_dir(&into).unwrap();
    let down = fx.cp(&[fx.url("not-here"), fx.url("here"), s(&into)]);
    down.assert_failed();
    assert!(
        down.stderr.contains("not-here") && lower(&down.stderr).contains("no such file"),
        "{down:#?}"
    );
    assert_eq!(tree(&into), ["here"]);
}

#[test]
fn download_into_a_missing_directory_fails_clearly() {
    let fx = Fx::new();
    write_random(&fx.root.join("f"), 3000, 15);
    let dst = fx.local.join("nodir").join("f");
    let down = fx.cp(&[fx.url("f"), s(&dst)]);
    down.assert_failed();
    assert!(
        down.stderr.contains("nodir") && lower(&down.stderr).contains("no such"),
        "{down:#?}"
    );
    assert!(!fx.local.join("nodir").exists());

    // Several sources need an existing directory.
    let down = fx.cp(&[fx.url("f"), fx.url("f"), s(&fx.local.join("nodir2"))]);
    down.assert_failed();
    assert!(down.stderr.contains("nodir2"), "{down:#?}");
    assert_eq!(tree(&fx.local), Vec::<String>::new());
}

#[test]
fn download_into_an_unwritable_directory_fails_clearly() {
    let fx = Fx::new();
    write_random(&fx.root.join("f"), 3000, 16);
    // As root, permission bits do not stop us: use sysfs, where nobody can create files.
    let (dir, _guard) = if unsafe { libc::geteuid() } == 0 {
        (PathBuf::from("/sys"), None)
    } else {
        let d = fx.local.join("ro");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o555)).unwrap();
        (d.clone(), Some(RestoreWritable(d)))
    };
    let dst = dir.join(format!("hayate-loopback-{}", std::process::id()));
    let down = fx.cp(&[fx.url("f"), s(&dst)]);
    down.assert_failed();
    assert!(
        lower(&down.stderr).contains("permission denied") && down.stderr.contains(&s(&dir)),
        "{down:#?}"
    );
    assert!(!dst.exists());

    // A destination whose "directory" is a regular file.
    fs::write(fx.local.join("plain"), b"x").unwrap();
    let dst = fx.local.join("plain").join("f");
    let down = fx.cp(&[fx.url("f"), s(&dst)]);
    down.assert_failed();
    assert!(down.stderr.contains("plain"), "{down:#?}");
    assert_eq!(fs::read(fx.local.join("plain")).unwrap(), b"x");
}

struct RestoreWritable(PathBuf);
impl Drop for RestoreWritable {
    fn drop(&mut self) {
        let _ = fs::set_permissions(&self.0, fs::Permissions::from_mode(0o755));
    }
}

#[test]
fn upload_to_an_uncreatable_remote_path_fails_clearly() {
    let fx = Fx::new();
    let src = fx.local.join("u");
    write_random(&src, 3000, 17);
    fs::write(fx.root.join("plain"), b"x").unwrap();
    let up = fx.cp(&[s(&src), fx.url("plain/u")]);
    up.assert_failed();
    assert!(
        up.stderr.contains("plain") && lower(&up.stderr).contains("refused"),
        "{up:#?}"
    );
    assert_eq!(tree(&fx.root), ["plain"]);
}

/// `--json` names where each failure was (`error_kind`) beside the text (`error`), which is
/// what the user reads on stderr.
#[test]
fn json_names_the_kind_of_each_failure() {
    let fx = Fx::new();
    let entry = |j: &serde_json::Value, path: &str| -> serde_json::Value {
        let all = j["files"].as_array().into_iter().flatten();
        let all = all.chain(j["other_entries"].as_array().into_iter().flatten());
        all.clone()
            .find(|e| e["path"].as_str().is_some_and(|p| p.ends_with(path)))
            .cloned()
            .unwrap_or_else(|| panic!("no entry for {path}: {j}"))
    };
    let kind_and_text = |e: &serde_json::Value| {
        (
            e["error_kind"].as_str().unwrap_or_default().to_string(),
            e["error"].as_str().unwrap_or_default().to_string(),
        )
    };

    // This side's file system (a source not there), a directory without -r, and a copy
    // that went: one upload.
    write_random(&fx.local.join("a"), 1000, 40);
    fs::create_dir(fx.local.join("d")).unwrap();
    fs::create_dir(fx.root.join("m")).unwrap();
    let up = fx.cp(&[
        "--json".into(),
        s(&fx.local.join("a")),
        s(&fx.local.join("no-such-file")),
        s(&fx.local.join("d")),
        fx.url("m/"),
    ]);
    up.assert_failed();
    let j = up.json();
    let (kind, text) = kind_and_text(&entry(&j, "no-such-file"));
    assert_eq!(kind, "local", "{j}");
    assert!(lower(&text).contains("no such file"), "{j}");
    let (kind, text) = kind_and_text(&entry(&j, "/d"));
    assert_eq!(
        (kind.as_str(), text.as_str()),
        ("needs_recursive", "is a directory (use -r)"),
        "{j}"
    );
    let a = entry(&j, "/a");
    assert!(
        a.get("error").is_none() && a.get("error_kind").is_none(),
        "{j}"
    );
    assert!(
        up.stderr
            .contains(&format!("{}: {text}", s(&fx.local.join("d")))),
        "{up:#?}"
    );

    // The far side's rules: no parent directory to put it in.
    fs::write(fx.root.join("plain"), b"x").unwrap();
    let up = fx.cp(&["--json".into(), s(&fx.local.join("a")), fx.url("plain/u")]);
    up.assert_failed();
    let j = up.json();
    let (kind, text) = kind_and_text(&entry(&j, "/a"));
    assert_eq!(kind, "refused", "{j}");
    assert!(text.starts_with("refused: "), "{j}");
    assert!(up.stderr.contains(&text), "{up:#?}");

    // The far side's own error: a remote source not there, listed beside one that is.
    write_random(&fx.root.join("here"), 2000, 41);
    let into = fx.local.join("into");
    fs::create_dir(&into).unwrap();
    let down = fx.cp(&[
        "--json".into(),
        fx.url("not-here"),
        fx.url("here"),
        s(&into),
    ]);
    down.assert_failed();
    let j = down.json();
    let (kind, text) = kind_and_text(&entry(&j, "not-here"));
    assert_eq!(kind, "remote", "{j}");
    assert!(lower(&text).contains("no such file"), "{j}");
}

#[test]
fn no_server_times_out_with_a_clear_error() {
    let tmp = TempDir::new().unwrap();
    let key = keygen(tmp.path(), "key");
    let src = tmp.path().join("s");
    write_random(&src, 1000, 18);
    let port = free_udp_port();
    let url = |p: &str| format!("hayate://127.0.0.1:{port}/{p}");

    for args in [
        vec![s(&src), url("s")],
        vec![url("s"), s(&tmp.path().join("d"))],
    ] {
        let mut all = vec!["--connect-timeout".to_string(), "1".to_string()];
        all.extend(args);
        let run = cp(&key, &all);
        run.assert_failed();
        assert!(lower(&run.stderr).contains("no answer"), "{run:#?}");
        assert!(
            run.elapsed < Duration::from_secs(4),
            "took {:?}",
            run.elapsed
        );
    }
    assert!(!tmp.path().join("d").exists());
    assert_eq!(part_files(tmp.path()), Vec::<String>::new());
}

#[test]
fn keygen_writes_mode_0600_and_refuses_to_overwrite() {
    let tmp = TempDir::new().unwrap();
    let path = tmp.path().join("k");
    let r = run(["keygen", "--out", &s(&path)]);
    r.assert_ok();
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    let first = fs::read(&path).unwrap();
    assert!(!first.is_empty());

    let r = run(["keygen", "--out", &s(&path)]);
    r.assert_failed();
    assert!(r.stderr.contains("--force"), "{r:#?}");
    assert_eq!(fs::read(&path).unwrap(), first, "key overwritten");

    let r = run(["keygen", "--out", &s(&path), "--force"]);
    r.assert_ok();
    let second = fs::read(&path).unwrap();
    assert_ne!(second, first, "--force did not write a new key");
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
        0o600
    );

    // Two fresh keys differ.
    let other = keygen(tmp.path(), "k2");
    assert_ne!(fs::read(other).unwrap(), second);

    // The file may be named as ssh-keygen's users expect: a plain argument, or -o; one
    // place only, and some place.
    let third = tmp.path().join("k3");
    run(["keygen", &s(&third)]).assert_ok();
    assert_eq!(fs::metadata(&third).unwrap().len(), first.len() as u64);
    let fourth = tmp.path().join("k4");
    run(["keygen", "-o", &s(&fourth)]).assert_ok();
    assert!(fourth.exists());
    let r = run([
        "keygen",
        &s(&tmp.path().join("k5")),
        "--out",
        &s(&tmp.path().join("k6")),
    ]);
    r.assert_failed();
    assert!(!tmp.path().join("k5").exists() && !tmp.path().join("k6").exists());
    run(["keygen"]).assert_failed();
}

#[test]
fn serve_handles_sessions_in_a_row_and_at_once() {
    let fx = Fx::new();
    // One after another, both directions.
    for i in 0..3u64 {
        let src = fx.local.join(format!("seq{i}"));
        write_random(&src, 10_000 + i, i);
        fx.cp(&[s(&src), fx.url(&format!("seq{i}"))]).assert_ok();
        let back = fx.local.join(format!("back{i}"));
        fx.cp(&[fx.url(&format!("seq{i}")), s(&back)]).assert_ok();
        assert_eq!(fs::read(&back).unwrap(), fs::read(&src).unwrap());
    }

    // Two clients at once: 8 MiB each at 100 Mbit/s take ~0.7 s, so they overlap.
    let before = fx.srv.log.snapshot().len();
    let mut procs = Vec::new();
    for i in 0..2u64 {
        let src = fx.local.join(format!("par{i}"));
        write_random(&src, 8 << 20, 100 + i);
        let mut cmd = hayate();
        cmd.args(["cp", "--key-file", &s(&fx.key), "--rate", "100M"]);
        cmd.args([s(&src), fx.url(&format!("par{i}"))]);
        procs.push(spawn_cmd(&mut cmd));
    }
    for p in procs {
        p.wait(Duration::from_secs(60)).assert_ok();
    }
    for i in 0..2 {
        let n = format!("par{i}");
        assert_eq!(hash_file(&fx.root.join(&n)), hash_file(&fx.local.join(&n)));
    }
    let log = fx.srv.log.snapshot()[before..].to_vec();
    let established: Vec<usize> = (0..log.len())
        .filter(|&i| log[i].contains("established"))
        .collect();
    assert_eq!(established.len(), 2, "{log:#?}");
    // Closes of these two sessions only: a client is done once its files are verified, and
    // the previous session's close may be logged after it exited.
    let peers: Vec<&str> = established
        .iter()
        .map(|&i| log[i].split(": session").next().unwrap_or(""))
        .collect();
    let first_close = log
        .iter()
        .position(|l| l.contains("session closed") && peers.iter().any(|p| l.starts_with(p)));
    assert!(
        first_close.is_some_and(|c| established[1] < c),
        "the two sessions did not overlap: {log:#?}"
    );
    assert_eq!(part_files(&fx.root), Vec::<String>::new());
}

#[test]
fn sigterm_and_sigint_stop_the_server_cleanly() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut fx = Fx::new();
        let st = fx.srv.signal_and_wait(sig, Duration::from_secs(5));
        assert_eq!(
            st.code(),
            Some(0),
            "signal {sig}: {st:?}\n{}",
            fx.srv.log.text()
        );
    }
}

/// Starts a slow 64 MiB upload and waits until the server has its temp file.
fn slow_upload(fx: &Fx, name: &str) -> Running {
    slow_upload_with(fx, name, &[])
}

fn slow_upload_with(fx: &Fx, name: &str, extra: &[&str]) -> Running {
    let src = fx.local.join(name);
    write_random(&src, 64 << 20, 19);
    let mut cmd = hayate();
    cmd.args(["cp", "--key-file", &s(&fx.key), "--rate", "40M"]);
    cmd.args(extra);
    cmd.args([s(&src), fx.url(name)]);
    let client = spawn_cmd(&mut cmd);
    let part = fx.root.join(format!(".{name}.hayate-part"));
    assert!(
        eventually(Duration::from_secs(10), || part.exists()),
        "no {} on the server: {:?}",
        part.display(),
        tree(&fx.root)
    );
    // Let some data land.
    std::thread::sleep(Duration::from_millis(500));
    client
}

#[test]
fn killed_client_leaves_only_part_and_state_files_and_sigterm_exits_0() {
    let mut fx = Fx::new();
    let mut client = slow_upload(&fx, "big.bin");
    assert!(
        !client.try_finished(),
        "upload finished too early to interrupt"
    );
    signal(client.pid(), libc::SIGKILL);
    let _ = client.wait(Duration::from_secs(10));
    assert_eq!(
        tree(&fx.root),
        [".big.bin.hayate-part", ".big.bin.hayate-state"]
    );

    let st = fx
        .srv
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(5));
    assert_eq!(st.code(), Some(0), "{st:?}\n{}", fx.srv.log.text());
    assert_eq!(
        tree(&fx.root),
        [".big.bin.hayate-part", ".big.bin.hayate-state"]
    );
    assert!(
        fx.srv.log.contains("incomplete upload kept"),
        "{}",
        fx.srv.log.text()
    );
}

/// The cids of the sessions the server's log says were established, in order.
fn established_cids(log: &Lines) -> Vec<u32> {
    log.snapshot()
        .iter()
        .filter_map(|l| l.split_once(": session ")?.1.strip_suffix(" established"))
        .map(|h| u32::from_str_radix(h, 16).expect("a hex cid"))
        .collect()
}

/// A client killed and run again at once: its old session still holds the temp file and
/// gives way to the new one (which resumes), whichever of the daemon's threads serves
/// either. A session's thread is its cid's low byte modulo the thread count; reruns are
/// tried until one lands on another thread than its old session.
#[test]
fn a_rerun_takes_over_from_its_killed_session_on_any_thread() {
    const THREADS: u32 = 4;
    let fx = Fx::with_server_args(&["--threads", "4"]);
    assert!(fx.srv.log.contains("4 threads"), "{}", fx.srv.log.text());
    let mut crossed = 0;
    for round in 0..8 {
        let name = format!("r{round}.bin");
        let client = slow_upload(&fx, &name);
        let old = *established_cids(&fx.srv.log).last().expect("a session");
        signal(client.pid(), libc::SIGKILL);
        let _ = client.wait(Duration::from_secs(10));
        let t0 = Instant::now();
        let r = fx.cp(&[s(&fx.local.join(&name)), fx.url(&name)]);
        r.assert_ok();
        // Well within the old session's idle timeout (15 s): it gave way, not timed out.
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        assert!(r.stderr.contains("resumed"), "{}", r.stderr);
        assert_eq!(
            hash_file(&fx.root.join(&name)),
            hash_file(&fx.local.join(&name))
        );
        let new = *established_cids(&fx.srv.log).last().expect("a session");
        assert_ne!(new, old);
        if old % 256 % THREADS != new % 256 % THREADS {
            crossed += 1;
            if crossed == 2 {
                break;
            }
        }
    }
    assert!(crossed >= 1, "no rerun landed on another thread");
    let log = fx.srv.log.text();
    assert!(log.contains("superseded by a newer upload"), "{log}");

    // A second daemon on the port fails, instead of joining the first one's sockets.
    let listen = format!("127.0.0.1:{}", fx.srv.port);
    let root = s(&fx.root);
    let key = s(&fx.key);
    let second = spawn([
        "serve",
        "--listen",
        &listen,
        "--root",
        &root,
        "--key-file",
        &key,
        "--threads",
        "2",
    ]);
    let r = second.wait(Duration::from_secs(10));
    r.assert_failed();
    assert!(r.stderr.contains("cannot listen on"), "{}", r.stderr);
}

#[test]
fn sigterm_during_an_upload_keeps_it_partial_and_the_client_fails() {
    let mut fx = Fx::new();
    let client = slow_upload(&fx, "big.bin");
    let st = fx
        .srv
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(5));
    assert_eq!(st.code(), Some(0), "{st:?}\n{}", fx.srv.log.text());
    let run = client.wait(Duration::from_secs(30));
    run.assert_failed();
    assert!(!run.stderr.is_empty(), "{run:#?}");
    assert_eq!(
        tree(&fx.root),
        [".big.bin.hayate-part", ".big.bin.hayate-state"]
    );
}

#[test]
fn interrupted_download_leaves_only_part_and_state_files() {
    let fx = Fx::new();
    write_random(&fx.root.join("big.bin"), 64 << 20, 20);
    let dst = fx.local.join("big.bin");
    let mut cmd = hayate();
    cmd.args(["cp", "--key-file", &s(&fx.key), "--rate", "40M"]);
    cmd.args([fx.url("big.bin"), s(&dst)]);
    let mut client = spawn_cmd(&mut cmd);
    let part = fx.local.join(".big.bin.hayate-part");
    assert!(eventually(Duration::from_secs(10), || part.exists()));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !client.try_finished(),
        "download finished too early to interrupt"
    );
    signal(client.pid(), libc::SIGTERM);
    let run = client.wait(Duration::from_secs(10));
    run.assert_failed();
    assert!(lower(&run.stderr).contains("interrupted"), "{run:#?}");
    assert!(!dst.exists());
    assert_eq!(
        tree(&fx.local),
        [".big.bin.hayate-part", ".big.bin.hayate-state"]
    );
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: plain mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Reads a FIFO to its end in the background.
fn drain_fifo(path: &Path) -> std::thread::JoinHandle<Vec<u8>> {
    let path = path.to_path_buf();
    std::thread::spawn(move || fs::read(path).unwrap())
}

fn is_fifo(path: &Path) -> bool {
    std::os::unix::fs::FileTypeExt::is_fifo(&fs::symlink_metadata(path).unwrap().file_type())
}

#[test]
fn served_destinations_follow_links_beneath_the_root_and_write_fifos_in_place() {
    let fx = Fx::new();
    let src = fx.local.join("d.bin");
    let want = write_random(&src, 2_000_003, 21);

    // A link inside the root: its target is replaced, the link stays.
    fs::create_dir(fx.root.join("sub")).unwrap();
    fs::write(fx.root.join("sub/target.bin"), b"old").unwrap();
    symlink("sub/target.bin", fx.root.join("ln")).unwrap();
    fx.cp(&[s(&src), fx.url("ln")]).assert_ok();
    assert_eq!(hash_file(&fx.root.join("sub/target.bin")), want);
    assert_eq!(
        fs::read_link(fx.root.join("ln")).unwrap(),
        Path::new("sub/target.bin")
    );

    // A link leading out of the root: refused, nothing outside written.
    fs::write(fx.outside.join("victim"), b"keep").unwrap();
    symlink(fx.outside.join("victim"), fx.root.join("abs-out")).unwrap();
    symlink("../outside/victim", fx.root.join("rel-out")).unwrap();
    for name in ["abs-out", "rel-out"] {
        let r = fx.cp(&[s(&src), fx.url(name)]);
        r.assert_failed();
        assert!(r.stderr.contains("escapes the served root"), "{r:#?}");
        assert!(!r.stderr.contains(&s(&fx.root)), "leaks the root: {r:#?}");
    }
    assert_eq!(fs::read(fx.outside.join("victim")).unwrap(), b"keep");

    // A FIFO: the bytes come out of it in order, and it stays a FIFO.
    mkfifo(&fx.root.join("fifo"));
    let reader = drain_fifo(&fx.root.join("fifo"));
    fx.cp(&[s(&src), fx.url("fifo")]).assert_ok();
    // Checked first: a FIFO replaced by a file leaves its reader waiting for ever.
    assert!(is_fifo(&fx.root.join("fifo")));
    assert_eq!(blake3::hash(&reader.join().unwrap()), want);

    // Downloads into a local FIFO and through a local link, likewise.
    mkfifo(&fx.local.join("fifo"));
    let reader = drain_fifo(&fx.local.join("fifo"));
    fx.cp(&[fx.url("ln"), s(&fx.local.join("fifo"))])
        .assert_ok();
    assert!(is_fifo(&fx.local.join("fifo")));
    assert_eq!(blake3::hash(&reader.join().unwrap()), want);
    fs::write(fx.local.join("real.bin"), b"old").unwrap();
    symlink("real.bin", fx.local.join("down-ln")).unwrap();
    fx.cp(&[fx.url("ln"), s(&fx.local.join("down-ln"))])
        .assert_ok();
    assert_eq!(hash_file(&fx.local.join("real.bin")), want);
    assert!(fs::symlink_metadata(fx.local.join("down-ln"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(part_files(fx.tmp.path()), Vec::<String>::new());
}

#[test]
fn served_uploads_need_the_parent_directory() {
    let fx = Fx::new();
    let src = fx.local.join("p.bin");
    write_random(&src, 10_000, 22);
    let r = fx.cp(&[s(&src), fx.url("no/such/p.bin")]);
    r.assert_failed();
    assert!(r.stderr.contains("no/such (parent directory)"), "{r:#?}");
    assert!(!fx.root.join("no").exists());
    // Several files into a missing directory, without -r: nothing is made.
    let r = fx.cp(&[s(&src), s(&src), fx.url("newdir/")]);
    r.assert_failed();
    assert!(!fx.root.join("newdir").exists());
    // -r makes the top directory only.
    fs::create_dir(fx.local.join("tree")).unwrap();
    fs::write(fx.local.join("tree/f"), b"f").unwrap();
    let r = fx.cp(&["-r".to_string(), s(&fx.local.join("tree")), fx.url("a/b/")]);
    r.assert_failed();
    assert!(!fx.root.join("a").exists());
    fx.cp(&["-r".to_string(), s(&fx.local.join("tree")), fx.url("top/")])
        .assert_ok();
    assert_eq!(fs::read(fx.root.join("top/tree/f")).unwrap(), b"f");
}

#[test]
fn a_huge_key_file_is_refused_after_a_bounded_read() {
    let fx = Fx::new();
    let src = fx.local.join("k.bin");
    write_random(&src, 1000, 23);
    let r = cp(Path::new("/dev/zero"), &[s(&src), fx.url("k.bin")]);
    r.assert_failed();
    assert_eq!(
        r.stderr.trim(),
        "hayate: cannot read key file /dev/zero: larger than 4096 bytes: not a key file"
    );
    assert!(r.elapsed < Duration::from_secs(10), "{r:#?}");
    assert!(!fx.root.join("k.bin").exists());
}

#[test]
fn keygen_force_writes_through_a_link_to_stdout_and_keeps_it() {
    let tmp = TempDir::new().unwrap();
    // What /dev/stdout is: a link to the process's fd 1 (here a pipe).
    let out = tmp.path().join("stdout");
    symlink("/proc/self/fd/1", &out).unwrap();
    let r = run(["keygen", "--out", &s(&out), "--force"]);
    r.assert_ok();
    assert!(r.stdout.contains("hayate-key-v1"), "{r:#?}");
    assert!(fs::symlink_metadata(&out).unwrap().file_type().is_symlink());
    assert_eq!(fs::read_link(&out).unwrap(), Path::new("/proc/self/fd/1"));
    // A link to a regular file: the file gets the key, the link stays.
    fs::write(tmp.path().join("real"), b"old").unwrap();
    symlink("real", tmp.path().join("k")).unwrap();
    run(["keygen", "--out", &s(&tmp.path().join("k")), "--force"]).assert_ok();
    assert!(fs::read_to_string(tmp.path().join("real"))
        .unwrap()
        .contains("hayate-key-v1"));
    assert!(fs::symlink_metadata(tmp.path().join("k"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn errors_name_what_is_wrong_once() {
    let fx = Fx::new();
    let src = fx.local.join("n.bin");
    write_random(&src, 1000, 24);
    // A destination that must be a directory and is a file: it is named, not an empty source.
    fs::write(fx.root.join("plain"), b"p").unwrap();
    let r = fx.cp(&[s(&src), fx.url("plain/")]);
    r.assert_failed();
    assert_eq!(r.stderr.trim(), "hayate: plain/: not a directory", "{r:#?}");
    let r = fx.cp(&[s(&src), fx.url("missing/")]);
    r.assert_failed();
    assert_eq!(
        r.stderr.trim(),
        "hayate: missing/: no such directory",
        "{r:#?}"
    );
    // Limits say what is allowed.
    let r = fx.cp(&[
        "--udp-timeout".to_string(),
        "0".into(),
        s(&src),
        "h:x".into(),
    ]);
    assert_eq!(r.status.code(), Some(2), "a usage error: {r:#?}");
    assert_eq!(
        r.stderr.trim(),
        "hayate: --udp-timeout must be more than 0 and less than 3600 seconds"
    );
    let r = run(["perf", "client", "127.0.0.1", "--rate", "abc"]);
    r.assert_failed();
    assert_eq!(r.stderr.trim(), "hayate: not a number: \"abc\"", "{r:#?}");
}

#[test]
fn an_interrupted_copy_exits_128_plus_the_signal() {
    for (sig, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let fx = Fx::new();
        let mut client = slow_upload(&fx, "big.bin");
        assert!(
            !client.try_finished(),
            "upload finished too early to interrupt"
        );
        signal(client.pid(), sig);
        let run = client.wait(Duration::from_secs(10));
        assert_eq!(run.status.code(), Some(code), "{run:#?}");
        assert!(lower(&run.stderr).contains("interrupted"), "{run:#?}");
        assert!(!fx.root.join("big.bin").exists());
    }
}

#[test]
fn json_of_an_interrupted_copy_reports_what_moved() {
    let fx = Fx::new();
    let mut client = slow_upload_with(&fx, "big.bin", &["--json"]);
    assert!(
        !client.try_finished(),
        "upload finished too early to interrupt"
    );
    signal(client.pid(), libc::SIGINT);
    let run = client.wait(Duration::from_secs(10));
    assert_eq!(run.status.code(), Some(130), "{run:#?}");
    let j = run.json();
    assert!(
        lower(j["error"].as_str().unwrap_or_default()).contains("interrupted"),
        "{j}"
    );
    assert_eq!(j["verified"], false, "{j}");
    assert!(j.get("blake3").is_none(), "{j}");
    // At 40 Mbit/s for at least half a second, megabytes had landed; not all 64 MiB.
    let moved = j["bytes"].as_u64().unwrap();
    assert!(moved > 1_000_000 && moved < 64 << 20, "{j}");
    assert_eq!(j["files"][0]["moved_bytes"].as_u64(), Some(moved), "{j}");
    // The file's error is the session's, with what it is missing.
    let e = &j["files"][0];
    assert_eq!(e["error_kind"], "session", "{j}");
    let text = e["error"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("interrupted; the far side acknowledged ")
            && text.ends_with(" bytes (a rerun resumes)"),
        "{j}"
    );
    assert_eq!(j["verified_bytes"], 0, "{j}");
    // Measured on this run: the RTT is there, and the rate is what moved over the time.
    assert!(j["srtt_ms"].as_f64().is_some(), "{j}");
    let secs = j["seconds"].as_f64().unwrap();
    let bps = j["goodput_bps"].as_f64().unwrap();
    assert!((bps - moved as f64 * 8.0 / secs).abs() < 1.0, "{j}");
}

/// scp's -l (Kbit/s) and rsync's --bwlimit (KiB/s) cap the rate as --rate does.
#[test]
fn scp_and_rsync_rate_limits_cap_the_rate() {
    let fx = Fx::new();
    let src = fx.local.join("l.bin");
    write_random(&src, 1_000_000, 31);
    // 1 MB at 4 Mbit/s (-l 4000) or 500 KiB/s (--bwlimit 500): about 2 s either way, where
    // the uncapped copy on loopback takes a fraction of that. Whole files (-W): a delta
    // against the last copy would send nothing.
    for limit in [["-l", "4000"], ["--bwlimit", "500"]] {
        let r = fx.cp(&[
            limit[0],
            limit[1],
            "-W",
            "--json",
            &s(&src),
            &fx.url("l.bin"),
        ]);
        r.assert_ok();
        let j = r.json();
        let secs = j["seconds"].as_f64().unwrap();
        let bps = j["goodput_bps"].as_f64().unwrap();
        assert!(secs > 1.5, "{limit:?} not capped: {j}");
        assert!(bps < 4_300_000.0, "{limit:?} not capped: {j}");
    }
    let r = fx.cp(&["-W", "--json", &s(&src), &fx.url("l.bin")]);
    r.assert_ok();
    assert!(r.json()["seconds"].as_f64().unwrap() < 1.5, "{r:#?}");
    // One cap at a time, said as a usage error.
    let r = fx.cp(&["-l", "4000", "--rate", "1M", &s(&src), &fx.url("l.bin")]);
    assert_eq!(r.status.code(), Some(2), "{r:#?}");
    assert!(
        r.stderr
            .contains("'-l <KBIT>' cannot be used with '--rate <RATE>'"),
        "{r:#?}"
    );
    let r = fx.cp(&["--bwlimit", "fast", &s(&src), &fx.url("l.bin")]);
    assert_eq!(r.status.code(), Some(2), "{r:#?}");
    assert!(r.stderr.contains("invalid --bwlimit \"fast\""), "{r:#?}");
    // -v says what the cap came to.
    let r = fx.cp(&["-v", "-l", "80000", &s(&src), &fx.url("l.bin")]);
    r.assert_ok();
    assert!(
        r.stderr
            .contains("hayate: rate: found by itself, capped at 80.0 Mbit/s"),
        "{r:#?}"
    );
}

/// -4 and -6 choose the address family of hayate's UDP.
#[test]
fn address_family_options_choose_the_udp_address() {
    let fx = Fx::new();
    let src = fx.local.join("a.bin");
    write_random(&src, 10_000, 32);
    let r = fx.cp(&["-6", &s(&src), &fx.url("a.bin")]);
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert_eq!(
        r.stderr.trim(),
        "hayate: no IPv6 address for 127.0.0.1 (-6)",
        "{r:#?}"
    );
    let v6 = format!("hayate://[::1]:{}/a.bin", fx.srv.port);
    let r = fx.cp(&["-4", &s(&src), &v6]);
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(r.stderr.contains("no IPv4 address for ::1 (-4)"), "{r:#?}");
    let r = fx.cp(&["-4", "-v", &s(&src), &fx.url("a.bin")]);
    r.assert_ok();
    assert!(
        r.stderr.contains(&format!(
            "hayate: server 127.0.0.1:{0} is 127.0.0.1:{0}: data over UDP",
            fx.srv.port
        )),
        "{r:#?}"
    );
}

/// --progress prints progress lines when stderr is not a terminal (as rsync does); without
/// it a log gets none.
#[test]
fn progress_prints_lines_without_a_terminal() {
    let fx = Fx::new();
    let src = fx.local.join("p.bin");
    write_random(&src, 2_000_000, 33);
    fn progress_lines(r: &Run) -> Vec<&str> {
        r.stderr
            .lines()
            .filter(|l| l.contains(" of ") && l.contains(" MB ") && l.contains('%'))
            .collect()
    }
    let r = fx.cp(&["--progress", "-l", "6000", &s(&src), &fx.url("p.bin")]);
    r.assert_ok();
    let lines = progress_lines(&r);
    assert!(lines.len() >= 2, "{r:#?}");
    for l in &lines {
        assert!(l.ends_with('s') && l.contains("bit/s"), "{l}");
    }
    let r = fx.cp(&["-l", "6000", &s(&src), &fx.url("p2.bin")]);
    r.assert_ok();
    assert_eq!(progress_lines(&r), Vec::<&str>::new(), "{r:#?}");
    // Not with -q.
    let r = fx.cp(&["-q", "--progress", &s(&src), &fx.url("p3.bin")]);
    assert_eq!(r.status.code(), Some(2), "{r:#?}");
}

/// What a real interrupted upload leaves is what `hayate clean` finds; while a copy still
/// writes its temp file, clean leaves it alone.
#[test]
fn clean_finds_what_an_interrupted_copy_left_and_spares_a_running_one() {
    let fx = Fx::new();
    let mut client = slow_upload(&fx, "big.bin");
    let root = s(&fx.root);
    let part = fx.root.join(".big.bin.hayate-part");
    let r = run(["clean", "--delete", &root]);
    r.assert_ok();
    assert!(
        r.stdout.contains(&format!(
            "{root}/.big.bin.hayate-part (a copy is writing it: left alone)"
        )),
        "{r:#?}"
    );
    assert!(part.exists());
    assert!(!client.try_finished());
    signal(client.pid(), libc::SIGINT);
    let run_ = client.wait(Duration::from_secs(10));
    assert_eq!(run_.status.code(), Some(130), "{run_:#?}");
    // The server lets go of the file once it has seen the client leave.
    let mut listed = String::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            listed = run(["clean", &root]).stdout;
            !listed.contains("a copy is writing it")
        }),
        "{listed}"
    );
    // Fully allocated: the whole size is listed, with the state file beside it.
    assert!(
        listed.contains(&format!("   67.1 MB  {root}/.big.bin.hayate-part")),
        "{listed}"
    );
    assert!(
        listed.contains(&format!("{root}/.big.bin.hayate-state")),
        "{listed}"
    );
    let r = run(["clean", "--delete", &root]);
    r.assert_ok();
    assert!(r.stdout.contains("removed 2 files"), "{r:#?}");
    assert_eq!(tree(&fx.root), Vec::<String>::new());
}

/// A size as the summary prints it ("3.0 MB", "120.5 kB", "1.00 GB", "0 B"), in bytes.
fn size_of(text: &str) -> f64 {
    let (n, unit) = text
        .trim()
        .split_once(' ')
        .unwrap_or_else(|| panic!("not a size: {text:?}"));
    let n: f64 = n.parse().unwrap_or_else(|_| panic!("not a size: {text:?}"));
    n * match unit {
        "B" => 1.0,
        "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        _ => panic!("not a decimal size unit: {text:?}"),
    }
}

/// The summary line: verified size, file count, seconds, what moved and its rate in bits/s,
/// with resumed and skipped bytes apart and out of the rate.
#[test]
fn the_summary_line_rates_what_moved_and_shows_the_rest_apart() {
    let fx = Fx::new();
    let src = fx.local.join("s.bin");
    write_random(&src, 3_000_000, 40);
    let r = fx.cp(&[s(&src), fx.url("s.bin")]);
    r.assert_ok();
    let line = r.stderr.trim();
    assert_eq!(line.lines().count(), 1, "{r:#?}");
    let (head, tail) = line.split_once(" s: ").expect(line);
    let rest = head
        .strip_prefix("3.0 MB in 1 file verified in ")
        .unwrap_or_else(|| panic!("{line}"));
    assert!(rest.parse::<f64>().is_ok_and(|t| t > 0.0), "{line}");
    let (moved, after) = tail.split_once(" moved at ").expect(line);
    assert_eq!(moved, "3.0 MB", "{line}");
    let (rate, after) = after.split_once(", ").expect(line);
    let (num, unit) = rate.split_once(' ').expect(line);
    assert!(num.parse::<f64>().is_ok(), "{line}");
    assert!(["kbit/s", "Mbit/s", "Gbit/s"].contains(&unit), "{line}");
    assert!(
        after.starts_with("retransmitted ") && after.ends_with('%'),
        "{line}"
    );

    // Interrupted, then resumed: what was there is said apart, and moved + resumed is the
    // whole file.
    let client = slow_upload(&fx, "big.bin");
    signal(client.pid(), libc::SIGINT);
    assert_eq!(
        client.wait(Duration::from_secs(10)).status.code(),
        Some(130)
    );
    let big = s(&fx.local.join("big.bin"));
    let r = fx.cp(&[big.clone(), fx.url("big.bin")]);
    r.assert_ok();
    let line = r.stderr.trim();
    assert!(line.starts_with("67.1 MB in 1 file verified in "), "{line}");
    let moved = size_of(
        line.split_once(" s: ")
            .unwrap()
            .1
            .split(" moved")
            .next()
            .unwrap(),
    );
    let resumed = line
        .split(", ")
        .find_map(|p| p.strip_suffix(" resumed (already there)"))
        .unwrap_or_else(|| panic!("no resumed part: {line}"));
    let resumed = size_of(resumed);
    assert!(resumed > 1e6, "{line}");
    assert!(((moved + resumed) - 67.1e6).abs() < 0.3e6, "{line}");

    // Identical already (-u): skipped, said with its size, nothing moved.
    let r = fx.cp(&["-u".to_string(), big, fx.url("big.bin")]);
    r.assert_ok();
    let line = r.stderr.trim();
    assert!(line.starts_with("1 file skipped (67.1 MB) in "), "{line}");
    assert!(line.ends_with(" s, nothing to copy"), "{line}");
}

/// A `-u` download compares the far side's hash with the local file's: identical is
/// skipped (nothing moves), the same size with other bytes is copied.
#[test]
fn update_download_skips_an_identical_file_and_copies_a_changed_one() {
    let fx = Fx::new();
    let (served, local) = (fx.root.join("f.bin"), fx.local.join("f.bin"));
    let want = write_random(&served, 3 << 20, 1);
    write_random(&local, 3 << 20, 1);
    let r = fx.cp(&["-u".into(), "--json".into(), fx.url("f.bin"), s(&local)]);
    r.assert_ok();
    let j = r.json();
    assert_eq!(j["skipped"], 1, "{j}");
    let f = &j["files"][0];
    assert_eq!(
        f["skipped"], "identical at the destination (--update)",
        "{j}"
    );
    assert_eq!(f["moved_bytes"], 0, "{j}");
    assert_eq!(f["blake3"].as_str(), Some(hex(&want).as_str()), "{j}");
    assert_eq!(hash_file(&local), want);

    let changed = write_random(&served, 3 << 20, 2);
    let r = fx.cp(&["-u".into(), "--json".into(), fx.url("f.bin"), s(&local)]);
    r.assert_ok();
    assert_eq!(r.json()["skipped"], 0, "{}", r.stdout);
    assert_eq!(hash_file(&local), changed);
    assert_eq!(part_files(&fx.local), Vec::<String>::new());
}

/// `-u` has the server hash the whole file it serves before offering it: a minute for
/// 100 GB. Its other sessions go on meanwhile: a second client's whole copy, handshake
/// included, is done while the first still waits for its offer. (A loop that hashed kept it
/// from even connecting: "no answer from the server within 5 s".)
#[test]
fn a_big_update_hash_on_the_server_does_not_hold_up_another_client() {
    let fx = Fx::new();
    // Sparse: nothing written, no disk used; hashed as fast as the CPU goes, ~3 GB/s here,
    // and abandoned when the test ends (only what was hashed by then is read).
    let size = 64u64 << 30;
    fs::File::create(fx.root.join("big.bin"))
        .unwrap()
        .set_len(size)
        .unwrap();
    let small = fx.local.join("small.bin");
    let small_hash = write_random(&small, 64 << 10, 3);
    let local = fx.local.join("big.bin");
    let mut cmd = hayate();
    cmd.args(["cp", "--key-file", &s(&fx.key), "-u"]);
    cmd.args([fx.url("big.bin"), s(&local)]);
    let mut big = spawn_cmd(&mut cmd);
    assert!(
        eventually(Duration::from_secs(10), || fx
            .srv
            .log
            .contains("established")),
        "the -u download never connected:\n{}",
        fx.srv.log.text()
    );
    // Its request follows the handshake by a round trip: the server is hashing by now.
    std::thread::sleep(Duration::from_millis(200));
    let r = fx.cp(&[s(&small), fx.url("small.bin")]);
    r.assert_ok();
    assert_eq!(hash_file(&fx.root.join("small.bin")), small_hash);
    // The offer, and with it the client's temp file, comes only once the hash is done.
    let part = fx.local.join(".big.bin.hayate-part");
    assert!(
        !big.try_finished() && !part.exists(),
        "the -u download got its offer before the small copy ({:?}) was done",
        r.elapsed
    );
    signal(big.pid(), libc::SIGKILL);
    let _ = big.wait(Duration::from_secs(10));
}

#[test]
fn remote_glob_from_a_daemon_stays_beneath_the_root() {
    let fx = Fx::new();
    fs::create_dir(fx.root.join("d")).unwrap();
    write_random(&fx.root.join("d/x.fits"), 5000, 1);
    write_random(&fx.root.join("d/y.fits"), 7000, 2);
    write_random(&fx.root.join("d/z.txt"), 10, 3);
    write_random(&fx.outside.join("secret.fits"), 10, 4);
    symlink(&fx.outside, fx.root.join("out")).unwrap();
    let into = fx.local.join("back");
    fs::create_dir(&into).unwrap();
    fx.cp(&[fx.url("d/*.fits"), s(&into)]).assert_ok();
    assert_eq!(tree(&into), ["x.fits", "y.fits"]);
    assert_eq!(
        fs::read(into.join("y.fits")).unwrap(),
        fs::read(fx.root.join("d/y.fits")).unwrap()
    );
    // Neither `..` nor a link leading out lists what is outside the root.
    for p in ["../outside/*.fits", "out/*.fits"] {
        let r = fx.cp(&[fx.url(p), s(&into)]);
        r.assert_failed();
        assert!(r.stderr.contains("escapes the served root"), "{p}: {r:#?}");
    }
    let r = fx.cp(&[fx.url("d/*.none"), s(&into)]);
    r.assert_failed();
    assert!(r.stderr.contains("d/*.none: no match"), "{r:#?}");
    assert_eq!(tree(&into), ["x.fits", "y.fits"]);
}

#[test]
fn stdin_and_stdout_with_a_daemon() {
    use std::io::Write;
    use std::process::Stdio;
    let fx = Fx::new();
    let data: Vec<u8> = (0..1_000_003u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let mut child = hayate()
        .args(["cp", "--key-file"])
        .arg(&fx.key)
        .args(["-", &fx.url("in.bin")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&data).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(fs::read(fx.root.join("in.bin")).unwrap() == data);
    let out = hayate()
        .args(["cp", "--key-file"])
        .arg(&fx.key)
        .args([&fx.url("in.bin"), "-"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout == data, "stdout differs");
}

#[test]
fn two_patterns_matching_one_name_copy_it_once_and_name_the_clash() {
    let fx = Fx::new();
    for d in ["a", "b"] {
        fs::create_dir(fx.root.join(d)).unwrap();
    }
    write_random(&fx.root.join("a/same.x"), 1000, 1);
    write_random(&fx.root.join("b/same.x"), 2000, 2);
    write_random(&fx.root.join("b/other.x"), 3000, 3);
    let into = fx.local.join("back");
    fs::create_dir(&into).unwrap();
    let r = fx.cp(&[fx.url("a/*.x"), fx.url("b/*.x"), s(&into)]);
    r.assert_failed();
    assert!(r.stderr.contains("would both be copied to"), "{r:#?}");
    assert!(r.stderr.contains("same.x"), "{r:#?}");
    assert_eq!(tree(&into), ["other.x", "same.x"]);
    // The one that arrived is whole, from one of the two sources, never a mix.
    let got = fs::read(into.join("same.x")).unwrap();
    assert!(
        got == fs::read(fx.root.join("a/same.x")).unwrap()
            || got == fs::read(fx.root.join("b/same.x")).unwrap()
    );
    assert_eq!(part_files(&fx.local), Vec::<String>::new());
}

/// Starts a 16 MiB upload at 50 Mbit/s (about 3 s) with `extra` options and waits until the
/// server has its temp file.
fn slow_changing_upload(fx: &Fx, src: &Path, name: &str, extra: &[&str]) -> Running {
    write_random(src, 16 << 20, 23);
    let mut cmd = hayate();
    cmd.args(["cp", "--key-file", &s(&fx.key), "--json", "--rate", "50M"]);
    cmd.args(extra);
    cmd.args([s(src), fx.url(name)]);
    let client = spawn_cmd(&mut cmd);
    let part = fx.root.join(format!(".{name}.hayate-part"));
    assert!(
        eventually(Duration::from_secs(10), || part.exists()),
        "the upload did not start"
    );
    std::thread::sleep(Duration::from_millis(300));
    client
}

fn append(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

/// A source appended to while it is sent: without --retry-changed the file fails
/// ("changed while being sent", exit 1, nothing put in place); with it, it is sent again
/// from the start and ends verified with the new content.
#[test]
fn retry_changed_sends_a_changed_source_again_and_ends_verified_with_the_new_content() {
    let fx = Fx::new();
    let src = fx.local.join("grows.bin");

    let running = slow_changing_upload(&fx, &src, "plain.bin", &[]);
    append(&src, b"appended while sent");
    let r = running.wait(Duration::from_secs(120));
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(r.stderr.contains("changed while being sent"), "{r:#?}");
    assert!(!r.stderr.contains("sending it again"), "{r:#?}");
    assert_eq!(r.json()["verified"], false, "{r:#?}");
    assert!(!fx.root.join("plain.bin").exists(), "{:?}", tree(&fx.root));

    let running = slow_changing_upload(&fx, &src, "retried.bin", &["--retry-changed"]);
    append(&src, b"appended while sent");
    let r = running.wait(Duration::from_secs(120));
    assert_eq!(r.status.code(), Some(0), "{r:#?}");
    assert!(
        r.stderr.contains(&format!(
            "{}: changed while being sent (size {} -> {} bytes): sending it again from the start",
            s(&src),
            16 << 20,
            (16 << 20) + 19
        )),
        "{r:#?}"
    );
    let j = r.json();
    assert_eq!(j["verified"], true, "{j}");
    // The second send checks what the first left against the new content's leaves: the
    // unchanged start of the file is not sent again.
    assert_eq!(
        j["bytes"].as_u64().unwrap() + j["resumed_bytes"].as_u64().unwrap(),
        (16 << 20) + 19,
        "{j}"
    );
    assert_eq!(
        j["files"][0]["bytes"].as_u64(),
        Some((16 << 20) + 19),
        "{j}"
    );
    let now = hash_file(&src);
    assert_eq!(j["blake3"].as_str(), Some(hex(&now).as_str()), "{j}");
    assert_eq!(
        fs::read(fx.root.join("retried.bin")).unwrap(),
        fs::read(&src).unwrap()
    );
    // What the first try left is gone with it (the plain run's is kept for a rerun).
    assert_eq!(part_files(&fx.root), [".plain.bin.hayate-part"]);
}

/// --retry-changed sends a file once more, not forever: a source that keeps changing fails
/// on its second send, and is not put in place.
#[test]
fn retry_changed_fails_a_source_that_changes_again() {
    let fx = Fx::new();
    let src = fx.local.join("busy.bin");
    let mut running = slow_changing_upload(&fx, &src, "busy.bin", &["--retry-changed"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !running.try_finished() && std::time::Instant::now() < deadline {
        append(&src, b"more");
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = running.wait(Duration::from_secs(10));
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert_eq!(
        r.stderr.matches("sending it again from the start").count(),
        1,
        "{r:#?}"
    );
    assert!(r.stderr.contains("changed while being sent"), "{r:#?}");
    assert_eq!(r.json()["verified"], false, "{r:#?}");
    assert!(!fx.root.join("busy.bin").exists(), "{:?}", tree(&fx.root));
}

/// The same for a download, whose source (on the far side) is appended to while it is sent:
/// without --retry-changed it fails; with it, it is asked for again and ends verified with
/// the new content, and nothing of the first try is left behind.
#[test]
fn retry_changed_asks_again_for_a_download_whose_source_changed() {
    let fx = Fx::new();
    let src = fx.root.join("grows.bin");
    for retry in [false, true] {
        write_random(&src, 16 << 20, 29);
        let dst = fx.local.join(format!("got-{retry}.bin"));
        let mut cmd = hayate();
        cmd.args(["cp", "--key-file", &s(&fx.key), "--json", "--rate", "50M"]);
        if retry {
            cmd.arg("--retry-changed");
        }
        cmd.args([fx.url("grows.bin"), s(&dst)]);
        let running = spawn_cmd(&mut cmd);
        let part = fx.local.join(format!(".got-{retry}.bin.hayate-part"));
        assert!(
            eventually(Duration::from_secs(10), || part.exists()),
            "the download did not start"
        );
        std::thread::sleep(Duration::from_millis(300));
        append(&src, b"appended while sent");
        let r = running.wait(Duration::from_secs(120));
        assert!(r.stderr.contains("changed while being sent"), "{r:#?}");
        if retry {
            assert_eq!(r.status.code(), Some(0), "{r:#?}");
            assert!(
                r.stderr
                    .contains("grows.bin: far side: cannot read grows.bin: changed while being sent (size 16777216 -> 16777235 bytes): asking for it again from the start"),
                "{r:#?}"
            );
            let j = r.json();
            assert_eq!(j["verified"], true, "{j}");
            assert_eq!(j["bytes"].as_u64(), Some((16 << 20) + 19), "{j}");
            assert_eq!(fs::read(&dst).unwrap(), fs::read(&src).unwrap());
        } else {
            assert_eq!(r.status.code(), Some(1), "{r:#?}");
            assert!(!r.stderr.contains("again from the start"), "{r:#?}");
            assert_eq!(r.json()["verified"], false, "{r:#?}");
            assert!(!dst.exists());
            let _ = fs::remove_file(&part);
            let _ = fs::remove_file(fx.local.join(format!(".got-{retry}.bin.hayate-state")));
        }
    }
    assert_eq!(tree(&fx.local), ["got-true.bin"]);
}

/// A `..` that stays beneath the served root is resolved, not refused: `sub/../x` is `x`
/// when `sub` exists, both ways; when the directory before it does not exist the error says
/// so ("nodir: no such directory"), and nothing is written. Climbing out is still refused.
#[test]
fn dotdot_inside_the_root_works_or_names_the_missing_directory() {
    let fx = Fx::new();
    let src = fx.local.join("x");
    let hash = write_random(&src, 300_000, 31);
    fs::create_dir(fx.root.join("sub")).unwrap();

    fx.cp(&[s(&src), fx.url("sub/../inside.bin")]).assert_ok();
    assert_eq!(hash_file(&fx.root.join("inside.bin")), hash);
    let dst = fx.local.join("back.bin");
    fx.cp(&[fx.url("sub/../inside.bin"), s(&dst)]).assert_ok();
    assert_eq!(hash_file(&dst), hash);

    let up = fx.cp(&[s(&src), fx.url("nodir/../other.bin")]);
    up.assert_failed();
    assert!(up.stderr.contains("nodir: no such directory"), "{up:#?}");
    assert!(!lower(&up.stderr).contains("escapes"), "{up:#?}");
    let down = fx.cp(&[fx.url("nodir/../inside.bin"), s(&fx.local.join("no.bin"))]);
    down.assert_failed();
    assert!(
        down.stderr.contains("nodir: no such directory"),
        "{down:#?}"
    );
    assert!(!fx.local.join("no.bin").exists());
    assert_eq!(tree(&fx.root), ["inside.bin", "sub"]);

    let out = fx.cp(&[s(&src), fx.url("sub/../../x")]);
    assert_escape_refused(&out, "sub/../../x");
}

/// A 4 MiB tmpfs mounted at `at` (made here), unmounted on drop; None where this process
/// may not mount (SKIP, a failure under CI).
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(at: &Path) -> Option<SmallFs> {
        fs::create_dir(at).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
            .arg(at)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            common::sshd::skip_unless_ci("cannot mount a small tmpfs (needs root)");
            return None;
        }
        Some(SmallFs(at.to_path_buf()))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A download onto a full local disk names the local destination with "No space left on
/// device" (not the far side's source), whether the disk is found full as the file is
/// created (a small file) or at its first writes (a large one); nothing is left there.
#[test]
fn a_full_local_disk_on_a_download_names_the_local_destination() {
    let fx = Fx::new();
    let Some(small) = SmallFs::mount(&fx.local.join("small")) else {
        return;
    };
    write_random(&fx.root.join("big.bin"), 16 << 20, 41);
    write_random(&fx.root.join("two.bin"), 2 << 20, 42);
    fs::write(small.0.join("filler"), vec![0u8; 3 << 20]).unwrap();
    for name in ["big.bin", "two.bin"] {
        let dst = small.0.join(name);
        let r = fx.cp(&["--json", &fx.url(name), &s(&dst)]);
        assert_eq!(r.status.code(), Some(1), "{r:#?}");
        let line = r
            .stderr
            .lines()
            .find(|l| l.contains("No space left on device"))
            .unwrap_or_else(|| panic!("{name}: no ENOSPC line: {r:#?}"));
        let (before, _) = line.split_once("No space left on device").unwrap();
        assert!(before.ends_with(&format!("{}: ", s(&dst))), "{line}");
        // The source (the far side's path) first, then what is wrong: the local file.
        assert!(
            line.starts_with(&format!("hayate: {name}: cannot write ")),
            "{line}"
        );
        assert_eq!(r.json()["verified"], false, "{r:#?}");
        assert!(!dst.exists(), "{name}");
    }
    assert_eq!(tree(&small.0), ["filler"]);
}

/// A FIFO destination whose reader is slow holds back only its own transfer: the server's
/// loop does not wait on it (the writes go through a writer thread, and blocks the FIFO has
/// no room for are refused and sent again), so another client is served at once.
#[test]
fn a_slow_fifo_reader_does_not_stall_other_sessions() {
    let fx = Fx::new();
    let src = fx.local.join("big.bin");
    let size = 12u64 << 20;
    let want = write_random(&src, size, 31);
    let fifo = fx.root.join("slow");
    mkfifo(&fifo);
    // Reads at most 4 MiB/s (256 KiB every 60 ms or slower): 3 s or more.
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut f = fs::File::open(fifo).unwrap();
            let (mut h, mut buf, mut n) = (blake3::Hasher::new(), vec![0u8; 256 << 10], 0u64);
            loop {
                let got = f.read(&mut buf).unwrap();
                if got == 0 {
                    return (h.finalize(), n);
                }
                h.update(&buf[..got]);
                n += got as u64;
                std::thread::sleep(Duration::from_millis(60));
            }
        })
    };
    let mut big = spawn([
        "cp".to_string(),
        "--key-file".into(),
        s(&fx.key),
        "--json".into(),
        s(&src),
        fx.url("slow"),
    ]);
    std::thread::sleep(Duration::from_millis(800));
    let small = fx.local.join("small.bin");
    write_random(&small, 200_000, 32);
    let t0 = Instant::now();
    fx.cp(&[s(&small), fx.url("small.bin")]).assert_ok();
    let took = t0.elapsed();
    assert!(
        !big.try_finished(),
        "the slow transfer ended before the other client came: this proves nothing"
    );
    assert!(
        took < Duration::from_millis(1500),
        "the other client took {took:?}"
    );
    let r = big.wait(Duration::from_secs(90));
    assert_eq!(r.json()["verified"], true, "{r:#?}");
    let (got, n) = reader.join().unwrap();
    assert_eq!(n, size);
    assert_eq!(got, want);
    assert!(is_fifo(&fifo));
    println!(
        "slow FIFO: another client's upload took {took:?}; the slow one {:?}",
        r.elapsed
    );
}

/// Holds an exclusive `flock` on `path` (as the far side of a killed copy still does for a
/// moment) until dropped.
struct Held {
    _file: fs::File,
}
impl Held {
    fn new(path: &Path) -> Held {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        // SAFETY: flock(2) on an fd this struct owns.
        assert_eq!(
            unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) },
            0
        );
        Held { _file: f }
    }
}

#[test]
fn an_upload_whose_temp_file_is_held_waits_without_stalling_other_sessions() {
    let fx = Fx::new();
    let other = fx.root.join("other");
    write_random(&other, 1 << 20, 7);

    // Held for 1.5 s, then let go: the upload waits for it, then lands.
    let src = fx.local.join("held");
    write_random(&src, 100_000, 8);
    let lock = Held::new(&fx.root.join(".held.hayate-part"));
    let mut cmd = hayate();
    cmd.args([
        "cp",
        "-q",
        "--key-file",
        &s(&fx.key),
        &s(&src),
        &fx.url("held"),
    ]);
    let mut waiting = spawn_cmd(&mut cmd);
    std::thread::sleep(Duration::from_millis(300));
    // Meanwhile another client's download goes through at once.
    let t0 = Instant::now();
    fx.cp(&[fx.url("other"), s(&fx.local.join("other"))])
        .assert_ok();
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(1200),
        "another session waited {took:?} behind the busy upload"
    );
    assert!(
        !waiting.try_finished(),
        "the upload did not wait for its temp file"
    );
    std::thread::sleep(Duration::from_millis(1200));
    drop(lock);
    waiting.wait(Duration::from_secs(20)).assert_ok();
    assert_eq!(hash_file(&fx.root.join("held")), hash_file(&src));

    // Held for good: refused after a while, saying why.
    let src = fx.local.join("stuck");
    write_random(&src, 100_000, 9);
    let _lock = Held::new(&fx.root.join(".stuck.hayate-part"));
    let t0 = Instant::now();
    let r = fx.cp(&[s(&src), fx.url("stuck")]);
    assert!(!r.ok());
    assert!(
        r.stderr.contains("another transfer is writing this file"),
        "{}",
        r.stderr
    );
    assert!(t0.elapsed() >= Duration::from_secs(4), "{:?}", t0.elapsed());
    assert!(!fx.root.join("stuck").exists());
}

#[test]
fn a_served_fifo_is_waited_for_its_reader_then_refused_without_stalling_others() {
    let fx = Fx::new();
    let src = fx.local.join("f.bin");
    let want = write_random(&src, 300_000, 23);
    let other = fx.root.join("other");
    write_random(&other, 1 << 20, 24);

    // The reader comes a second late: the upload waits for it.
    mkfifo(&fx.root.join("late"));
    let mut cmd = hayate();
    cmd.args([
        "cp",
        "-q",
        "--key-file",
        &s(&fx.key),
        &s(&src),
        &fx.url("late"),
    ]);
    let upload = spawn_cmd(&mut cmd);
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    fx.cp(&[fx.url("other"), s(&fx.local.join("other"))])
        .assert_ok();
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(1200),
        "another session waited {took:?} behind the FIFO"
    );
    std::thread::sleep(Duration::from_millis(700));
    let reader = drain_fifo(&fx.root.join("late"));
    upload.wait(Duration::from_secs(20)).assert_ok();
    assert_eq!(blake3::hash(&reader.join().unwrap()), want);

    // Nobody ever reads: refused after a while, saying why; still a FIFO.
    mkfifo(&fx.root.join("unread"));
    let r = fx.cp(&[s(&src), fx.url("unread")]);
    r.assert_failed();
    assert!(r.stderr.contains("nothing reads from this FIFO"), "{r:#?}");
    assert!(is_fifo(&fx.root.join("unread")));
}

// ----- delta transfers (issue 40) -----

/// `len` pseudo-random bytes from `seed`.
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len];
    blake3::Hasher::new()
        .update(&seed.to_le_bytes())
        .update(b"hayate delta test data")
        .finalize_xof()
        .fill(&mut out);
    out
}

/// Overwrites `n` 4 KiB pages of `d`, spread over it, with fresh bytes.
fn scatter_pages(d: &mut [u8], n: usize, seed: u64) {
    let pages = d.len() / 4096;
    for i in 0..n {
        let p = (i * pages / n + (seed as usize % 7)) % pages;
        let fresh = random_bytes(4096, seed * 1000 + i as u64);
        d[p * 4096..(p + 1) * 4096].copy_from_slice(&fresh);
    }
}

/// Copies `new` over a destination holding `old` (upload to the daemon, or download from
/// it), checks the result byte for byte and that no temp file is left, and returns the
/// file's JSON entry.
fn delta_copy(
    fx: &Fx,
    name: &str,
    old: &[u8],
    new: &[u8],
    upload: bool,
    extra: &[&str],
) -> serde_json::Value {
    let (src, dst) = if upload {
        (fx.local.join(name), fx.root.join(name))
    } else {
        (fx.root.join(name), fx.local.join(name))
    };
    fs::write(&src, new).unwrap();
    fs::write(&dst, old).unwrap();
    let mut args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
    // Loopback's 8.9 KB blocks: a changed 4 KiB leaf costs its own bytes, not the one or
    // two blocks it lies in.
    args.push("--json".into());
    if upload {
        args.extend([s(&src), fx.url(name)]);
    } else {
        args.extend([fx.url(name), s(&dst)]);
    }
    let r = fx.cp(&args);
    r.assert_ok();
    let got = fs::read(&dst).unwrap();
    assert!(
        got == new,
        "{name}: the result differs from the source ({} vs {} bytes)",
        got.len(),
        new.len()
    );
    assert_eq!(part_files(&fx.root), Vec::<String>::new());
    assert_eq!(part_files(&fx.local), Vec::<String>::new());
    let j = r.json();
    assert_eq!(j["verified"].as_bool(), Some(true), "{j}");
    assert_eq!(
        j["blake3"].as_str(),
        Some(hex(&blake3::hash(new)).as_str()),
        "{j}"
    );
    let f = j["files"][0].clone();
    let (moved, reused) = (
        f["moved_bytes"].as_u64().unwrap(),
        f["reused_bytes"].as_u64().unwrap(),
    );
    assert_eq!(
        moved + reused + f["resumed_bytes"].as_u64().unwrap(),
        new.len() as u64,
        "{j}"
    );
    assert_eq!(j["reused_bytes"].as_u64(), Some(reused), "{j}");
    if upload {
        // What went new is what was moved, but for the blocks that leave with the offer,
        // before the receiver's request for leaf hashes arrives: at most the eager
        // allowance (2 MiB); how much of it goes is a race with the receiver, wide on a
        // loaded host. That nothing goes beyond an answer once the request
        // is in is tested exactly in hayate-proto's `tests/delta.rs`.
        let sent = j["data_bytes_sent"].as_u64().unwrap();
        let again = j["data_bytes_retransmitted"].as_u64().unwrap();
        assert!(sent - again <= moved + (2 << 20), "{j}");
    }
    f
}

fn delta_cases(upload: bool) {
    let fx = Fx::new();
    let len = 8 << 20;
    let old = random_bytes(len, 1);

    // Scattered in-place changes: 20 pages of 4 KiB.
    let mut new = old.clone();
    scatter_pages(&mut new, 20, 2);
    let f = delta_copy(&fx, "pages.bin", &old, &new, upload, &[]);
    let moved = f["moved_bytes"].as_u64().unwrap();
    assert_eq!(moved, 20 * 4096, "{f}");

    // Unchanged: nothing is sent, and the file there is kept as it is (the same inode,
    // not a copy renamed over it).
    let dst = |name: &str| {
        if upload {
            fx.root.join(name)
        } else {
            fx.local.join(name)
        }
    };
    // One under 64 KiB is sent whole, and kept all the same.
    let sizes = [
        ("same.bin", len),
        ("small-same.bin", 300_000),
        ("tiny-same.bin", 10_000),
    ];
    for (name, n) in sizes {
        let d = &old[..n];
        fs::write(dst(name), d).unwrap();
        let ino = fs::metadata(dst(name)).unwrap().ino();
        let f = delta_copy(&fx, name, d, d, upload, &[]);
        let moved = if n < 64 << 10 { n as u64 } else { 0 };
        assert_eq!(f["moved_bytes"].as_u64(), Some(moved), "{f}");
        assert_eq!(
            fs::metadata(dst(name)).unwrap().ino(),
            ino,
            "{name} replaced"
        );
    }
    // Changed, it is replaced.
    let mut tiny = old[..10_000].to_vec();
    fs::write(dst("tiny.bin"), &tiny).unwrap();
    let ino = fs::metadata(dst("tiny.bin")).unwrap().ino();
    tiny[5000] ^= 1;
    delta_copy(&fx, "tiny.bin", &old[..10_000], &tiny, upload, &[]);
    assert_ne!(fs::metadata(dst("tiny.bin")).unwrap().ino(), ino);
    // -p still gives it the source's mtime.
    let (src, to) = if upload {
        (fx.local.join("same-p.bin"), fx.url("same-p.bin"))
    } else {
        (fx.root.join("same-p.bin"), s(&fx.local.join("same-p.bin")))
    };
    fs::write(&src, &old).unwrap();
    let then = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    fs::File::options()
        .write(true)
        .open(&src)
        .unwrap()
        .set_times(fs::FileTimes::new().set_modified(then))
        .unwrap();
    fs::write(dst("same-p.bin"), &old).unwrap();
    let ino = fs::metadata(dst("same-p.bin")).unwrap().ino();
    let from = if upload {
        s(&src)
    } else {
        fx.url("same-p.bin")
    };
    let r = fx.cp(&["-p".to_string(), "--json".into(), from, to]);
    r.assert_ok();
    let f = r.json()["files"][0].clone();
    assert_eq!(f["moved_bytes"].as_u64(), Some(0), "{f}");
    let meta = fs::metadata(dst("same-p.bin")).unwrap();
    assert_eq!(meta.ino(), ino, "replaced");
    assert_eq!(meta.modified().unwrap(), then);
    assert_eq!(fs::read(dst("same-p.bin")).unwrap(), old);

    // Appended to (a growing log), by an amount that is no whole leaf.
    let mut new = old.clone();
    new.extend(random_bytes(1_000_003, 3));
    let f = delta_copy(&fx, "grown.bin", &old, &new, upload, &[]);
    let moved = f["moved_bytes"].as_u64().unwrap();
    assert!((1_000_003..1_000_003 + 4096).contains(&moved), "{f}");

    // Truncated: the source is a prefix of the destination (which is longer).
    let new = old[..len / 2 + 12345].to_vec();
    let f = delta_copy(&fx, "cut.bin", &old, &new, upload, &[]);
    assert!(f["moved_bytes"].as_u64().unwrap() <= 2 * 4096, "{f}");

    // A destination longer than the source, and different at its start.
    let mut new = old[..len / 2].to_vec();
    new[..4096].copy_from_slice(&random_bytes(4096, 4));
    let f = delta_copy(&fx, "longer.bin", &old, &new, upload, &[]);
    assert!(f["moved_bytes"].as_u64().unwrap() <= 3 * 4096, "{f}");

    // An empty destination: everything is sent.
    let f = delta_copy(&fx, "empty.bin", &[], &old, upload, &[]);
    assert_eq!(f["moved_bytes"].as_u64(), Some(len as u64), "{f}");
    assert_eq!(f["reused_bytes"].as_u64(), Some(0), "{f}");

    // Nothing in common: everything is sent, and the result is still exact.
    let other = random_bytes(len, 5);
    let f = delta_copy(&fx, "other.bin", &old, &other, upload, &[]);
    assert_eq!(f["reused_bytes"].as_u64(), Some(0), "{f}");

    // -W: the whole file, whatever is there.
    let mut new = old.clone();
    scatter_pages(&mut new, 3, 6);
    let f = delta_copy(&fx, "whole.bin", &old, &new, upload, &["-W"]);
    assert_eq!(f["moved_bytes"].as_u64(), Some(len as u64), "{f}");
    assert_eq!(f["reused_bytes"].as_u64(), Some(0), "{f}");
}

#[test]
fn delta_upload_sends_only_what_changed() {
    delta_cases(true);
}

/// A file big enough that hashing it takes a while, answered in parts as it is compared
/// (`Compared`): only the changed pages are moved, the parts' accounts add up, and an
/// upload sends no more than the offer's eager allowance beyond what was moved; both ways.
#[test]
fn a_big_delta_sends_only_what_it_was_answered_both_ways() {
    let fx = Fx::new();
    let old = random_bytes(64 << 20, 7);
    let mut new = old.clone();
    scatter_pages(&mut new, 20, 8);
    for upload in [true, false] {
        let f = delta_copy(&fx, "big.bin", &old, &new, upload, &[]);
        assert_eq!(f["moved_bytes"].as_u64(), Some(20 * 4096), "{f}");
        assert_eq!(
            f["reused_bytes"].as_u64(),
            Some((64 << 20) - 20 * 4096),
            "{f}"
        );
    }
}

#[test]
fn delta_download_sends_only_what_changed() {
    delta_cases(false);
}

/// A delta download killed while it is still compared (blocks of it answered and landed)
/// leaves no resume state: its temp file holds the destination only as far as the copy
/// got, so the rerun compares the destination again and sends what changed (had it taken
/// that temp file for its basis, it would have sent the rest of the file).
#[test]
fn a_delta_killed_while_compared_reruns_from_the_destination() {
    let fx = Fx::new();
    let old = random_bytes(64 << 20, 31);
    let mut new = old.clone();
    scatter_pages(&mut new, 40, 32);
    fs::write(fx.root.join("d.bin"), &new).unwrap();
    let dst = fx.local.join("d.bin");
    fs::write(&dst, &old).unwrap();
    // Older than the source: copied as it is compared (not read where it is first).
    let then = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    fs::File::options()
        .write(true)
        .open(&dst)
        .unwrap()
        .set_times(fs::FileTimes::new().set_modified(then))
        .unwrap();
    // 256 KiB of leaf hashes at 1 Mbit/s: compared over about 2 s, in parts of 8 MiB.
    let mut cmd = hayate();
    cmd.args(["cp", "--key-file", &s(&fx.key), "--rate", "1M"]);
    cmd.args([fx.url("d.bin"), s(&dst)]);
    let client = spawn_cmd(&mut cmd);
    let part = fx.local.join(".d.bin.hayate-part");
    assert!(eventually(Duration::from_secs(10), || part.exists()));
    std::thread::sleep(Duration::from_millis(1300));
    signal(client.pid(), libc::SIGKILL);
    let _ = client.wait(Duration::from_secs(10));
    assert!(part.exists(), "the temp file went: the kill came too late");
    assert!(
        !fx.local.join(".d.bin.hayate-state").exists(),
        "a resume state was saved while the file was compared"
    );
    let r = fx.cp(&["--json".to_string(), fx.url("d.bin"), s(&dst)]);
    r.assert_ok();
    assert!(fs::read(&dst).unwrap() == new, "the result differs");
    let f = &r.json()["files"][0];
    assert!(f["moved_bytes"].as_u64().unwrap() <= 40 * 4096, "{f}");
    assert_eq!(part_files(&fx.local), Vec::<String>::new());
}

/// Overwrites `len` bytes of `path` at `at` with fresh bytes.
fn damage(path: &Path, at: u64, len: usize) {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&random_bytes(len, 99), at).unwrap();
}

/// A rerun that finds the temp file of an interrupted copy damaged where the state file says
/// it holds data: the damaged leaves are sent again (the kept ones are checked against the
/// sender's leaf hashes), never trusted into a failed verification.
#[test]
fn a_damaged_part_file_is_repaired_on_resume_of_an_upload() {
    let fx = Fx::new();
    let client = slow_upload(&fx, "big.bin");
    std::thread::sleep(Duration::from_millis(700));
    signal(client.pid(), libc::SIGKILL);
    let _ = client.wait(Duration::from_secs(10));
    let part = fx.root.join(".big.bin.hayate-part");
    let state = fs::read_to_string(fx.root.join(".big.bin.hayate-state")).unwrap();
    assert!(
        state.lines().nth(1).is_some_and(|l| l.starts_with("0-")),
        "{state}"
    );
    damage(&part, 300_000, 5000);
    let src = fx.local.join("big.bin");
    let r = fx.cp(&["--json".to_string(), s(&src), fx.url("big.bin")]);
    r.assert_ok();
    assert_eq!(hash_file(&fx.root.join("big.bin")), hash_file(&src));
    let f = &r.json()["files"][0];
    let resumed = f["resumed_bytes"].as_u64().unwrap();
    assert!(resumed > 1 << 20, "{f}");
    assert!(resumed < (64 << 20) - 5000, "{f}");
    assert_eq!(part_files(&fx.root), Vec::<String>::new());
}

#[test]
fn a_damaged_part_file_is_repaired_on_resume_of_a_download() {
    let fx = Fx::new();
    let src = fx.root.join("big.bin");
    write_random(&src, 64 << 20, 21);
    let dst = fx.local.join("big.bin");
    let mut cmd = hayate();
    cmd.args(["cp", "--key-file", &s(&fx.key), "--rate", "40M"]);
    cmd.args([fx.url("big.bin"), s(&dst)]);
    let client = spawn_cmd(&mut cmd);
    let part = fx.local.join(".big.bin.hayate-part");
    assert!(eventually(Duration::from_secs(10), || part.exists()));
    std::thread::sleep(Duration::from_millis(1200));
    signal(client.pid(), libc::SIGTERM);
    client.wait(Duration::from_secs(10)).assert_failed();
    damage(&part, 300_000, 5000);
    let r = fx.cp(&["--json".to_string(), fx.url("big.bin"), s(&dst)]);
    r.assert_ok();
    assert_eq!(hash_file(&dst), hash_file(&src));
    let f = &r.json()["files"][0];
    let resumed = f["resumed_bytes"].as_u64().unwrap();
    assert!(resumed > 1 << 20, "{f}");
    assert_eq!(f["reused_bytes"].as_u64(), Some(0), "{f}");
    assert_eq!(part_files(&fx.local), Vec::<String>::new());
}

/// `-r` over a tree already at the destination: unchanged files send nothing, changed ones
/// their changed leaves, new ones everything; both ways.
#[test]
fn a_tree_sends_only_the_changed_leaves_of_changed_files() {
    let fx = Fx::new();
    let old_a = random_bytes(3 << 20, 10);
    let mut new_a = old_a.clone();
    scatter_pages(&mut new_a, 5, 11);
    let b = random_bytes(2 << 20, 12);
    let c = random_bytes(300_000, 13);
    for (base, upload) in [(fx.local.join("t"), true), (fx.root.join("u"), false)] {
        let far = if upload {
            fx.root.join("t")
        } else {
            fx.local.join("u")
        };
        for d in [&base, &far] {
            fs::create_dir_all(d.join("sub")).unwrap();
        }
        fs::write(base.join("a.bin"), &new_a).unwrap();
        fs::write(base.join("sub/b.bin"), &b).unwrap();
        fs::write(base.join("sub/c.bin"), &c).unwrap();
        fs::write(far.join("a.bin"), &old_a).unwrap();
        fs::write(far.join("sub/b.bin"), &b).unwrap();
        // Ethernet-sized blocks: the bound below counts leaves (see `delta_copy`).
        let mtu = ["--mtu".to_string(), "1500".into()];
        let r = if upload {
            fx.cp(&[
                &mtu[..],
                &["-r".into(), "--json".into(), s(&base), fx.url("")],
            ]
            .concat())
        } else {
            fx.cp(&[
                &mtu[..],
                &["-r".into(), "--json".into(), fx.url("u"), s(&fx.local)],
            ]
            .concat())
        };
        r.assert_ok();
        for f in ["a.bin", "sub/b.bin", "sub/c.bin"] {
            assert!(
                fs::read(far.join(f)).unwrap() == fs::read(base.join(f)).unwrap(),
                "{f}"
            );
        }
        let j = r.json();
        let moved = j["bytes"].as_u64().unwrap();
        assert!((300_000..=300_000 + 5 * 8192).contains(&moved), "{j}");
        assert_eq!(
            j["reused_bytes"].as_u64().unwrap() + moved,
            (5 << 20) + 300_000,
            "{j}"
        );
    }
}

/// `--inplace`: the destination file itself is written (same inode, no temp file), only
/// where it differs; shorter and longer sources too; both ways.
#[test]
fn inplace_writes_only_what_differs_into_the_destination_itself() {
    let fx = Fx::new();
    let old = random_bytes(4 << 20, 20);
    for upload in [true, false] {
        let dst = if upload {
            fx.root.join("in.bin")
        } else {
            fx.local.join("in.bin")
        };
        let mut new = old.clone();
        scatter_pages(&mut new, 10, 21);
        fs::write(&dst, &old).unwrap();
        let ino = fs::metadata(&dst).unwrap().ino();
        let f = delta_copy(&fx, "in.bin", &old, &new, upload, &["--inplace"]);
        assert!(f["moved_bytes"].as_u64().unwrap() <= 10 * 8192, "{f}");
        assert_eq!(
            fs::metadata(&dst).unwrap().ino(),
            ino,
            "not written in place"
        );
        for new in [
            old[..3_000_000].to_vec(),
            [old.clone(), random_bytes(70_000, 22)].concat(),
        ] {
            let f = delta_copy(&fx, "in.bin", &old, &new, upload, &["--inplace"]);
            assert!(f["moved_bytes"].as_u64().unwrap() <= 80_000, "{f}");
            assert_eq!(
                fs::metadata(&dst).unwrap().ino(),
                ino,
                "not written in place"
            );
        }
    }
}

/// An upload remembers the path it measured in `$XDG_CACHE_HOME/hayate/paths` (0600), the
/// next upload to the same host uses it (`-v` says so), and `--no-cache` neither reads nor
/// writes the file. A corrupt cache file is no reason to fail. A measurement counts only
/// once the controller has run 8 rounds past startup, neither held by the application nor
/// by a cap; on loopback a copy does not always qualify (a 192 MiB upload did in 5 of 6
/// runs here; with the other loopback tests running beside it, one run in five had none of
/// 5 uploads qualify), so up to 8 uploads are allowed for the first one.
#[test]
fn uploads_remember_the_path_unless_told_not_to() {
    let fx = Fx::new();
    let cache = fx.tmp.path().join("cache");
    let file = cache.join("hayate/paths");
    let src = fx.local.join("src.bin");
    write_random(&src, 192 << 20, 7);
    let cp = |args: &[&str]| {
        let mut cmd = hayate();
        cmd.env("XDG_CACHE_HOME", &cache)
            .arg("cp")
            .arg("--key-file")
            .arg(&fx.key)
            // The whole file each time (not a delta against the copy already there).
            .arg("-W")
            .args(args)
            .arg(&src)
            .arg(fx.url("up.bin"));
        spawn_cmd(&mut cmd).wait(Duration::from_secs(60))
    };
    cp(&["--no-cache", "-q"]).assert_ok();
    assert!(!cache.exists(), "--no-cache wrote the cache");
    let mut tries = 0;
    while !file.exists() {
        tries += 1;
        assert!(tries <= 8, "no upload of 8 remembered its path");
        cp(&["-v"]).assert_ok();
    }
    let text = fs::read_to_string(&file).unwrap();
    let line: Vec<&str> = text.lines().collect();
    assert_eq!(line.len(), 1, "{text}");
    assert!(line[0].starts_with("127.0.0.1 "), "{text}");
    assert_eq!(
        fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let again = cp(&["-v"]);
    again.assert_ok();
    assert!(
        again.stderr.contains("remembered path to 127.0.0.1"),
        "{}",
        again.stderr
    );
    let quiet = cp(&["-v", "--no-cache"]);
    quiet.assert_ok();
    assert!(!quiet.stderr.contains("remembered path"));
    fs::write(&file, b"\xff\x00 not a cache\n127.0.0.1 x y z\n").unwrap();
    cp(&["-q"]).assert_ok();
}

/// `hayate serve --port PORT` (`-p`) listens on every IPv4 address at PORT, as iperf's and
/// ssh's users type it; it goes with neither `--listen` nor `--stdio`.
#[test]
fn serve_port_listens_on_every_address() {
    let tmp = TempDir::new().unwrap();
    let key = keygen(tmp.path(), "key");
    let root = tmp.path().join("root");
    fs::create_dir(&root).unwrap();
    let src = tmp.path().join("f");
    fs::write(&src, b"over --port").unwrap();

    let r = run([
        "serve",
        "--port",
        "5300",
        "--listen",
        "127.0.0.1:5300",
        "--root",
        &s(&root),
    ]);
    r.assert_failed();
    assert!(r.stderr.contains("cannot be used with"), "{r:#?}");
    run(["serve", "--stdio", "-p", "5300"]).assert_failed();

    let server = Server::start_listening(&root, &key, &[], &[], |port| {
        vec!["-p".into(), port.to_string()]
    });
    let addr = format!("listening on 0.0.0.0:{}", server.port);
    assert!(server.log.contains(&addr), "{}", server.log.text());
    run([
        "cp",
        "-q",
        "--key-file",
        &s(&key),
        &s(&src),
        &server.url("f"),
    ])
    .assert_ok();
    assert_eq!(fs::read(root.join("f")).unwrap(), b"over --port");
}
