use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use hayate_io::fs::{
    create_local_part, hash_file, read_at, umask, Change, EntryKind, FsError, PartFile, Root,
    SourceError, SourceFile,
};

fn setup() -> (tempfile::TempDir, Root) {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("hello.txt"), b"hello world").unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    fs::write(dir.path().join("sub/inner.bin"), b"inner").unwrap();
    let root = Root::open(dir.path()).unwrap();
    (dir, root)
}

fn read_all(root: &Root, rel: &str) -> Vec<u8> {
    let (mut f, meta) = root.open_read(rel).unwrap();
    let mut v = Vec::new();
    f.read_to_end(&mut v).unwrap();
    assert_eq!(meta.len(), v.len() as u64);
    v
}

fn assert_no_leak(e: &FsError, dir: &Path) {
    let msg = e.to_string();
    assert!(
        !msg.contains(dir.to_str().unwrap()),
        "error leaks the root path: {msg}"
    );
}

#[test]
fn reads_files_beneath_the_root() {
    let (_dir, root) = setup();
    assert_eq!(read_all(&root, "hello.txt"), b"hello world");
    assert_eq!(read_all(&root, "sub/inner.bin"), b"inner");
    assert_eq!(read_all(&root, "./sub//inner.bin"), b"inner");
}

#[test]
fn escapes_are_rejected() {
    let (dir, root) = setup();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), b"secret").unwrap();
    symlink("/etc/passwd", dir.path().join("passwd-link")).unwrap();
    symlink(outside.path(), dir.path().join("out-dir")).unwrap();
    symlink("../../../../../../etc", dir.path().join("sub/rel-up")).unwrap();
    symlink("/proc/self/root/etc/passwd", dir.path().join("magic")).unwrap();

    for rel in [
        "../x",
        "/etc/passwd",
        "a/../../x",
        "sub/../../hello.txt",
        "..",
        "passwd-link",
        "out-dir/secret",
        "sub/rel-up/passwd",
        "magic",
    ] {
        let e = root.open_read(rel).expect_err(rel);
        assert!(
            matches!(e, FsError::Escapes(_) | FsError::InvalidPath(_)),
            "{rel}: {e:?}"
        );
        assert!(e.to_string().contains(rel), "message names the path: {e}");
        assert_no_leak(&e, dir.path());
    }
    // The kernel check (not just our `..` filter) catches symlinks.
    assert!(matches!(
        root.open_read("passwd-link"),
        Err(FsError::Escapes(_))
    ));
    assert!(matches!(
        root.open_read("out-dir/secret"),
        Err(FsError::Escapes(_))
    ));
    assert_eq!(
        root.open_read("/etc/passwd").unwrap_err().to_string(),
        "path escapes the served root: /etc/passwd"
    );
}

#[test]
fn symlinks_inside_the_root_are_allowed() {
    let (dir, root) = setup();
    symlink("hello.txt", dir.path().join("alias")).unwrap();
    symlink("../hello.txt", dir.path().join("sub/up-alias")).unwrap();
    symlink("sub", dir.path().join("subdir-alias")).unwrap();
    assert_eq!(read_all(&root, "alias"), b"hello world");
    assert_eq!(read_all(&root, "sub/up-alias"), b"hello world");
    assert_eq!(read_all(&root, "subdir-alias/inner.bin"), b"inner");
}

#[test]
fn invalid_and_missing_paths() {
    let (dir, root) = setup();
    for rel in ["", ".", "./", "a\0b"] {
        let e = root.open_read(rel).expect_err(rel);
        assert!(matches!(e, FsError::InvalidPath(_)), "{rel:?}: {e:?}");
    }
    let e = root.open_read("nope/missing.txt").unwrap_err();
    assert!(matches!(e, FsError::NotFound(_)), "{e:?}");
    assert_eq!(e.to_string(), "no such file or directory: nope/missing.txt");
    assert_no_leak(&e, dir.path());
    assert!(matches!(
        root.open_read("sub"),
        Err(FsError::IsADirectory(_))
    ));
    assert!(matches!(
        root.open_read("hello.txt/x"),
        Err(FsError::InvalidPath(_))
    ));
    // A FIFO is refused without blocking in open().
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    assert!(matches!(root.open_read("fifo"), Err(FsError::NotAFile(_))));
}

#[test]
fn create_part_needs_its_parent_writes_and_commits() {
    let (dir, root) = setup();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    // A missing parent is an error naming it, and nothing is created.
    let e = root.create_part("new/deeper/file.bin", 1).unwrap_err();
    assert!(matches!(e, FsError::NotFound(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "no such file or directory: new/deeper (parent directory)"
    );
    assert!(!dir.path().join("new").exists());
    fs::create_dir_all(dir.path().join("new/deeper")).unwrap();
    let mut part = root
        .create_part("new/deeper/file.bin", data.len() as u64)
        .unwrap();
    let part_path = dir.path().join("new/deeper/.file.bin.hayate-part");
    let meta = fs::metadata(&part_path).unwrap();
    assert_eq!(meta.len(), data.len() as u64, "sized up front");
    assert_eq!(meta.mode() & 0o777, 0o600);
    // Write out of order, as blocks arrive.
    part.write_at(100_000, &data[100_000..]).unwrap();
    part.write_at(0, &data[..100_000]).unwrap();
    assert_eq!(part.hash().unwrap(), blake3::hash(&data));
    assert!(!dir.path().join("new/deeper/file.bin").exists());

    let mtime = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    part.commit(Some(0o4755), Some(mtime)).unwrap();
    let final_path = dir.path().join("new/deeper/file.bin");
    assert_eq!(fs::read(&final_path).unwrap(), data);
    let meta = fs::metadata(&final_path).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o755, "setuid bit stripped");
    assert_eq!(meta.modified().unwrap(), mtime);
    assert!(!part_path.exists());
}

#[test]
fn commit_replaces_an_existing_file() {
    let (dir, root) = setup();
    let mut part = root.create_part("hello.txt", 3).unwrap();
    part.write_at(0, b"new").unwrap();
    part.commit(None, None).unwrap();
    assert_eq!(fs::read(dir.path().join("hello.txt")).unwrap(), b"new");
}

#[test]
fn abandon_leaves_only_the_part_file_and_resume_keeps_it() {
    let (dir, root) = setup();
    let mut part = root.create_part("up.bin", 10).unwrap();
    part.write_at(0, b"01234").unwrap();
    part.abandon();
    hayate_io::writeback::settle_all();
    let mut names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".up.bin.hayate-part", "hello.txt", "sub"]);
    // Reopening keeps the data written so far, resized to the final size.
    let mut part = root.create_part("up.bin", 8).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(read_at(part.file().unwrap(), 0, &mut buf).unwrap(), 8);
    assert_eq!(&buf[..8], b"01234\0\0\0");
    part.abandon();
}

#[test]
fn create_part_refuses_escapes_and_bad_targets() {
    let (dir, root) = setup();
    let outside = tempfile::tempdir().unwrap();
    symlink(outside.path(), dir.path().join("out-dir")).unwrap();
    for rel in ["../x", "/tmp/x", "a/../../x", "out-dir/x", "out-dir/new/x"] {
        let e = root.create_part(rel, 1).expect_err(rel);
        assert!(matches!(e, FsError::Escapes(_)), "{rel}: {e:?}");
        assert_no_leak(&e, dir.path());
    }
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    assert!(matches!(
        root.create_part("sub", 1),
        Err(FsError::NotAFile(_))
    ));
    assert!(matches!(
        root.create_part("hello.txt/x", 1),
        Err(FsError::InvalidPath(_))
    ));
    assert!(matches!(
        root.create_part("x.hayate-part", 1),
        Err(FsError::InvalidPath(_))
    ));
    // A planted symlink in place of the temp file is not followed.
    let victim = outside.path().join("victim");
    fs::write(&victim, b"keep").unwrap();
    symlink(&victim, dir.path().join(".planted.hayate-part")).unwrap();
    assert!(root.create_part("planted", 100).is_err());
    assert_eq!(fs::read(&victim).unwrap(), b"keep");
}

#[test]
fn create_part_in_read_only_dir_is_permission_denied() {
    let (dir, root) = setup();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir(dir.path().join("ro")).unwrap();
    fs::set_permissions(dir.path().join("ro"), fs::Permissions::from_mode(0o555)).unwrap();
    let euid = unsafe { libc::geteuid() };
    // Root ignores permission bits; drop the filesystem uid (per thread, and with it the
    // DAC-override capabilities) in a scratch thread so the check applies.
    let result = std::thread::spawn(move || {
        if euid == 0 {
            unsafe { libc::setfsuid(65534) };
            assert_eq!(
                unsafe { libc::setfsuid(65534) },
                65534,
                "setfsuid took effect"
            );
        }
        root.create_part("ro/file", 10).map(|_| ())
    })
    .join()
    .unwrap();
    let e = result.unwrap_err();
    assert!(matches!(e, FsError::PermissionDenied(_)), "{e:?}");
    assert_eq!(e.to_string(), "permission denied: ro/file");
}

#[test]
fn local_part_for_downloads() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("download.iso");
    let mut part = create_local_part(&dest, 5).unwrap();
    assert!(dir.path().join(".download.iso.hayate-part").exists());
    part.write_at(0, b"abcde").unwrap();
    assert_eq!(part.hash().unwrap(), blake3::hash(b"abcde"));
    part.commit(Some(0o644), None).unwrap();
    assert_eq!(fs::read(&dest).unwrap(), b"abcde");
    assert_eq!(fs::metadata(&dest).unwrap().mode() & 0o777, 0o644);

    let missing = dir.path().join("no/such/dir/f");
    assert!(matches!(
        create_local_part(&missing, 1),
        Err(FsError::NotFound(_))
    ));
    assert!(matches!(
        create_local_part(dir.path(), 1),
        Err(FsError::InvalidPath(_) | FsError::NotAFile(_))
    ));
}

#[test]
fn hashing_and_read_at() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f");
    let data: Vec<u8> = (0..5_000_000u32).map(|i| (i * 7 % 256) as u8).collect();
    fs::write(&p, &data).unwrap();
    let f = fs::File::open(&p).unwrap();
    assert_eq!(hash_file(&f).unwrap(), blake3::hash(&data));
    let mut buf = vec![0u8; 1000];
    assert_eq!(read_at(&f, 4_999_500, &mut buf).unwrap(), 500);
    assert_eq!(&buf[..500], &data[4_999_500..]);
    fs::write(&p, b"").unwrap();
    assert_eq!(hash_file(&f).unwrap(), blake3::hash(b""));
}

/// A file that another handle truncates while it is hashed makes the hash an error, never a
/// SIGBUS: a mapped file that shrinks kills the process reading it (a server hashing a file
/// its users can write).
#[test]
fn a_file_truncated_while_hashed_is_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f");
    // Sparse: no disk used, and hashing it takes far longer than the cut takes to come.
    let len = 2u64 << 30;
    fs::File::create(&p).unwrap().set_len(len).unwrap();
    let f = fs::File::open(&p).unwrap();
    let go = std::sync::Arc::new(std::sync::Barrier::new(2));
    let cutter = {
        let (p, go) = (p.clone(), go.clone());
        std::thread::spawn(move || {
            go.wait();
            std::thread::sleep(Duration::from_millis(20));
            let w = fs::OpenOptions::new().write(true).open(&p).unwrap();
            w.set_len(1 << 20).unwrap();
        })
    };
    go.wait();
    let r = hash_file(&f);
    cutter.join().unwrap();
    match r {
        Err(e) => assert!(e.to_string().contains("shrank"), "{e}"),
        // Only if this thread was held up until after the cut: then the file is 1 MiB.
        Ok(h) => assert_eq!(h, blake3::hash(&vec![0u8; 1 << 20])),
    }
}

#[test]
fn root_open_errors() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("file"), b"x").unwrap();
    assert!(matches!(
        Root::open(&dir.path().join("file")),
        Err(FsError::InvalidPath(_))
    ));
    assert!(matches!(
        Root::open(&dir.path().join("missing")),
        Err(FsError::NotFound(_))
    ));
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn whole_fs_resolves_like_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    fs::create_dir(&home).unwrap();
    fs::write(home.join("a.txt"), b"a").unwrap();
    fs::write(dir.path().join("up.txt"), b"up").unwrap();
    symlink(dir.path().join("up.txt"), home.join("abs-link")).unwrap();
    let root = Root::whole_fs(&home).unwrap();

    assert_eq!(read_all(&root, "a.txt"), b"a");
    assert_eq!(read_all(&root, "./a.txt"), b"a");
    assert_eq!(read_all(&root, "../up.txt"), b"up");
    assert_eq!(read_all(&root, "abs-link"), b"up");
    let abs = dir.path().join("up.txt");
    assert_eq!(read_all(&root, abs.to_str().unwrap()), b"up");
    // Magic links stay refused.
    let magic = format!("/proc/self/root{}", home.join("a.txt").display());
    let e = root.open_read(&magic).unwrap_err();
    assert!(matches!(e, FsError::InvalidPath(_)), "{e:?}");

    // Writes: relative with `..`, and absolute; parents must exist.
    assert!(matches!(
        root.create_part("../made/x.bin", 2),
        Err(FsError::NotFound(_))
    ));
    fs::create_dir(dir.path().join("made")).unwrap();
    fs::create_dir(dir.path().join("abs")).unwrap();
    let mut p = root.create_part("../made/x.bin", 2).unwrap();
    p.write_at(0, b"xy").unwrap();
    p.commit(None, None).unwrap();
    assert_eq!(fs::read(dir.path().join("made/x.bin")).unwrap(), b"xy");
    let abs = dir.path().join("abs/y.bin");
    let mut p = root.create_part(abs.to_str().unwrap(), 1).unwrap();
    p.write_at(0, b"y").unwrap();
    p.commit(None, None).unwrap();
    assert_eq!(fs::read(&abs).unwrap(), b"y");

    // The tree ops take the same paths; "" and "." are the working directory.
    assert_eq!(root.stat("").unwrap().kind, EntryKind::Dir);
    assert_eq!(root.stat(".").unwrap().kind, EntryKind::Dir);
    assert_eq!(root.stat("/").unwrap().kind, EntryKind::Dir);
    assert_eq!(root.stat("../up.txt").unwrap().size, 2);
    let link = root.stat("abs-link").unwrap();
    assert_eq!(link.kind, EntryKind::Symlink);
    assert_eq!(link.target, dir.path().join("up.txt").to_str().unwrap());
    root.mkdirs("../d1", None).unwrap();
    root.mkdirs("../d1/d2", Some(0o700)).unwrap();
    assert!(dir.path().join("d1/d2").is_dir());
    root.symlink("../d1/l", "/etc/hostname").unwrap();
    assert_eq!(
        fs::read_link(dir.path().join("d1/l")).unwrap(),
        Path::new("/etc/hostname")
    );
    root.set_meta("../up.txt", Some(0o640), None).unwrap();
    assert_eq!(
        fs::metadata(dir.path().join("up.txt")).unwrap().mode() & 0o777,
        0o640
    );
    // A name is needed to create a file.
    assert!(matches!(
        root.create_part("sub/..", 1),
        Err(FsError::InvalidPath(_))
    ));
    assert!(matches!(
        Root::whole_fs(&dir.path().join("nope")),
        Err(FsError::NotFound(_))
    ));
}

/// a/, a/b/ (empty), a/f, a/c/g, a/c/in -> f, a/c/out -> /outside, a/c/dirlink -> ../b
fn tree() -> (tempfile::TempDir, tempfile::TempDir, Root) {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), b"s").unwrap();
    let a = dir.path().join("a");
    fs::create_dir_all(a.join("b")).unwrap();
    fs::create_dir_all(a.join("c")).unwrap();
    fs::write(a.join("f"), b"12345").unwrap();
    fs::write(a.join("c/g"), b"g").unwrap();
    symlink("../f", a.join("c/in")).unwrap();
    symlink(outside.path(), a.join("c/out")).unwrap();
    symlink("../b", a.join("c/dirlink")).unwrap();
    let root = Root::open(dir.path()).unwrap();
    (dir, outside, root)
}

#[test]
fn list_walks_a_tree_parents_first_never_following_links() {
    let (_dir, outside, root) = tree();
    let list = root.list("a", true, 100).unwrap();
    let paths: Vec<_> = list.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        ["", "b", "c", "c/dirlink", "c/g", "c/in", "c/out", "f"]
    );
    let by = |p: &str| list.iter().find(|e| e.path == p).unwrap().clone();
    assert_eq!(by("").kind, EntryKind::Dir);
    assert_eq!(by("b").kind, EntryKind::Dir);
    assert_eq!(by("f").kind, EntryKind::File);
    assert_eq!(by("f").size, 5);
    assert_eq!(by("c/in").kind, EntryKind::Symlink);
    assert_eq!(by("c/in").target, "../f");
    let out = by("c/out");
    assert_eq!(out.kind, EntryKind::Symlink);
    assert_eq!(out.target, outside.path().to_str().unwrap());
    assert!(list.iter().all(|e| !e.path.contains("secret")));
    assert_eq!(by("c/dirlink").kind, EntryKind::Symlink);

    // Non-recursive, or a file: the entry alone.
    let one = root.list("a", false, 100).unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].kind, EntryKind::Dir);
    assert_eq!(one[0].path, "");
    let f = root.list("a/f", true, 100).unwrap();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].size, 5);
    // The root itself lists as "".
    let all = root.list("", true, 100).unwrap();
    assert_eq!(all[0].path, "");
    assert_eq!(all[1].path, "a");
    assert_eq!(all[2].path, "a/b");
    assert_eq!(all.len(), 9);

    // Exactly max is fine, one more is an error.
    assert_eq!(root.list("a", true, 8).unwrap().len(), 8);
    let e = root.list("a", true, 7).unwrap_err();
    assert!(e.to_string().contains("more than 7 entries"), "{e}");
    assert!(root.list("a", true, 2).is_err());

    // A symlink named as the path to list is reported, not followed.
    let l = root.list("a/c/out", true, 100).unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].kind, EntryKind::Symlink);
    assert!(matches!(
        root.list("nope", true, 10),
        Err(FsError::NotFound(_))
    ));
}

#[test]
fn list_names_an_unreadable_subdirectory() {
    let (dir, _outside, root) = tree();
    // Everything else readable to the unprivileged user below; only a/c is not.
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(dir.path().join("a/c"), fs::Permissions::from_mode(0o000)).unwrap();
    let euid = unsafe { libc::geteuid() };
    let r = std::thread::spawn(move || {
        if euid == 0 {
            unsafe { libc::setfsuid(65534) };
            assert_eq!(unsafe { libc::setfsuid(65534) }, 65534);
        }
        root.list("a", true, 100)
    })
    .join()
    .unwrap();
    fs::set_permissions(dir.path().join("a/c"), fs::Permissions::from_mode(0o755)).unwrap();
    let e = r.unwrap_err();
    assert_eq!(e.to_string(), "permission denied: a/c");
    assert_no_leak(&e, dir.path());
}

#[test]
fn stat_reports_links_and_metadata() {
    let (dir, _outside, root) = tree();
    let mtime = SystemTime::UNIX_EPOCH + Duration::new(1_500_000_000, 123_456_789);
    let f = fs::File::options()
        .write(true)
        .open(dir.path().join("a/f"))
        .unwrap();
    f.set_modified(mtime).unwrap();
    fs::set_permissions(dir.path().join("a/f"), fs::Permissions::from_mode(0o640)).unwrap();
    let e = root.stat("a/f").unwrap();
    assert_eq!(e.kind, EntryKind::File);
    assert_eq!((e.size, e.mode), (5, 0o640));
    assert_eq!((e.mtime, e.mtime_nsec), (1_500_000_000, 123_456_789));
    assert_eq!(e.path, "");
    assert_eq!(root.stat("a/c/out").unwrap().kind, EntryKind::Symlink);
    assert_eq!(root.stat("a/c/in").unwrap().target, "../f");
    assert_eq!(root.stat("a/c/dirlink").unwrap().kind, EntryKind::Symlink);
    // A trailing slash follows a final symlink, as in a shell (and only beneath the root).
    assert_eq!(root.stat("a/c/dirlink/").unwrap().kind, EntryKind::Dir);
    assert_eq!(root.stat("a/c/dirlink/.").unwrap().kind, EntryKind::Dir);
    let l = root.list("a/c/dirlink/", true, 10).unwrap();
    assert_eq!((l.len(), l[0].kind.clone()), (1, EntryKind::Dir));
    assert!(matches!(root.stat("a/c/out/"), Err(FsError::Escapes(_))));
}

#[test]
fn mkdirs_creates_applies_mode_and_refuses_files() {
    let (dir, _outside, root) = tree();
    // Only the last component is made: a missing parent is an error.
    let e = root.mkdirs("x/y/z", None).unwrap_err();
    assert!(matches!(e, FsError::NotFound(_)), "{e:?}");
    assert!(!dir.path().join("x").exists());
    root.mkdirs("x", None).unwrap();
    root.mkdirs("x/y", None).unwrap();
    root.mkdirs("x/y/z", None).unwrap();
    let m = fs::metadata(dir.path().join("x/y/z")).unwrap();
    assert!(m.is_dir());
    assert_eq!(m.mode() & 0o777, 0o777 & !umask());
    root.mkdirs("x/y/z", Some(0o4711)).unwrap();
    assert_eq!(
        fs::metadata(dir.path().join("x/y/z")).unwrap().mode() & 0o7777,
        0o711
    );
    assert_eq!(
        fs::metadata(dir.path().join("x/y")).unwrap().mode() & 0o777,
        0o777 & !umask(),
        "only the last component gets the mode"
    );
    root.mkdirs("a/b", Some(0o750)).unwrap();
    assert_eq!(
        fs::metadata(dir.path().join("a/b")).unwrap().mode() & 0o777,
        0o750
    );
    assert!(matches!(
        root.mkdirs("a/f", None),
        Err(FsError::InvalidPath(_))
    ));
    assert!(matches!(
        root.mkdirs("a/f/sub", None),
        Err(FsError::InvalidPath(_))
    ));
    assert!(matches!(
        root.mkdirs("", None),
        Err(FsError::InvalidPath(_))
    ));
    assert!(matches!(
        root.mkdirs(".", Some(0o777)),
        Err(FsError::InvalidPath(_))
    ));
}

#[test]
fn symlink_creates_replaces_and_refuses_directories() {
    let (dir, _outside, root) = tree();
    assert!(matches!(
        root.symlink("new/dir/l1", "../../a/f"),
        Err(FsError::NotFound(_))
    ));
    fs::create_dir_all(dir.path().join("new/dir")).unwrap();
    root.symlink("new/dir/l1", "../../a/f").unwrap();
    let l1 = dir.path().join("new/dir/l1");
    assert_eq!(fs::read_link(&l1).unwrap(), Path::new("../../a/f"));
    assert_eq!(read_all(&root, "new/dir/l1"), b"12345");
    // Replaces a symlink and a file.
    root.symlink("new/dir/l1", "other").unwrap();
    assert_eq!(fs::read_link(&l1).unwrap(), Path::new("other"));
    fs::write(dir.path().join("plain"), b"p").unwrap();
    root.symlink("plain", "a/f").unwrap();
    assert_eq!(
        fs::read_link(dir.path().join("plain")).unwrap(),
        Path::new("a/f")
    );
    // A target pointing out is stored as is (opens through it are refused).
    root.symlink("esc", "/etc/passwd").unwrap();
    assert_eq!(
        fs::read_link(dir.path().join("esc")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert!(matches!(root.open_read("esc"), Err(FsError::Escapes(_))));
    // Directories are not replaced; no temp names are left behind.
    let e = root.symlink("a/b", "x").unwrap_err();
    assert!(matches!(e, FsError::InvalidPath(_)), "{e:?}");
    assert!(dir.path().join("a/b").is_dir());
    assert_eq!(names(&dir.path().join("new/dir")), ["l1"]);
    assert!(names(dir.path()).iter().all(|n| !n.starts_with(".hayate")));
    assert!(matches!(
        root.symlink("z", ""),
        Err(FsError::InvalidPath(_))
    ));
    assert!(matches!(
        root.symlink("z.hayate-state", "x"),
        Err(FsError::InvalidPath(_))
    ));
}

#[test]
fn set_meta_on_files_dirs_and_links() {
    let (dir, _outside, root) = tree();
    root.set_meta("a/f", Some(0o2600), Some((1_400_000_000, 5)))
        .unwrap();
    let m = fs::symlink_metadata(dir.path().join("a/f")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600);
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_400_000_000, 5));
    root.set_meta("a/b", Some(0o700), Some((1_300_000_000, 0)))
        .unwrap();
    let m = fs::metadata(dir.path().join("a/b")).unwrap();
    assert_eq!((m.mode() & 0o777, m.mtime()), (0o700, 1_300_000_000));
    // A symlink: its own mtime, mode ignored, the target untouched.
    let before = fs::metadata(dir.path().join("a/f")).unwrap();
    root.set_meta("a/c/in", Some(0o777), Some((1_200_000_000, 7)))
        .unwrap();
    let l = fs::symlink_metadata(dir.path().join("a/c/in")).unwrap();
    assert_eq!((l.mtime(), l.mtime_nsec()), (1_200_000_000, 7));
    let after = fs::metadata(dir.path().join("a/f")).unwrap();
    assert_eq!(before.mode(), after.mode());
    assert_eq!(before.mtime(), after.mtime());
    // A link pointing out: its own mtime only.
    let out = root.stat("a/c/out").unwrap();
    root.set_meta("a/c/out", Some(0o777), Some((1_100_000_000, 0)))
        .unwrap();
    assert_eq!(root.stat("a/c/out").unwrap().mtime, 1_100_000_000);
    assert_eq!(root.stat("a/c/out").unwrap().target, out.target);
    assert!(matches!(
        root.set_meta("nope", None, None),
        Err(FsError::NotFound(_))
    ));
}

#[test]
fn confined_tree_ops_refuse_escapes() {
    let (dir, outside, root) = tree();
    symlink(outside.path(), dir.path().join("out-dir")).unwrap();
    let bad = [
        "../x",
        "/tmp/x",
        "a/../../x",
        "out-dir/x",
        "a/c/out/x",
        "a/c/out/new/x",
    ];
    for rel in bad {
        let check = |r: Result<(), FsError>, what: &str| {
            let e = r.expect_err(&format!("{what} {rel}"));
            assert!(matches!(e, FsError::Escapes(_)), "{what} {rel}: {e:?}");
            assert_no_leak(&e, dir.path());
        };
        check(root.stat(rel).map(|_| ()), "stat");
        check(root.list(rel, true, 100).map(|_| ()), "list");
        check(root.mkdirs(rel, Some(0o777)), "mkdirs");
        check(root.symlink(rel, "t"), "symlink");
        check(root.set_meta(rel, Some(0o777), Some((1, 0))), "set_meta");
    }
    // Nothing appeared outside, and the outside dir kept its metadata.
    assert_eq!(names(outside.path()), ["secret"]);
    let m = fs::metadata(outside.path()).unwrap();
    assert_ne!(m.mtime(), 1);
    // ".." that stays inside the root is resolved (by the kernel, beneath the root).
    assert_eq!(root.stat("a/../a/f").unwrap().kind, EntryKind::File);
    // Through a link it is the link's target's parent that counts: a/c/dirlink -> ../b,
    // so a/c/dirlink/.. is a/, not a/c/.
    assert_eq!(root.stat("a/c/dirlink/../f").unwrap().kind, EntryKind::File);
    // The directory before a ".." must exist, and the error says which one is missing.
    let e = root.stat("nodir/../a").unwrap_err();
    assert!(matches!(e, FsError::NoSuchDir(_)), "{e:?}");
    assert_eq!(e.to_string(), "nodir: no such directory");
    let e = root.mkdirs("a/nodir/../new", Some(0o755)).unwrap_err();
    assert_eq!(e.to_string(), "a/nodir: no such directory");
    assert!(!dir.path().join("a/new").exists());
}

#[test]
fn dotdot_inside_the_root_reads_and_writes_where_it_leads() {
    let (dir, root) = setup();
    assert_eq!(read_all(&root, "sub/../hello.txt"), b"hello world");
    let mut p = root.create_part("sub/../made.bin", 2).unwrap();
    p.write_at(0, b"ok").unwrap();
    p.commit(None, None).unwrap();
    assert_eq!(fs::read(dir.path().join("made.bin")).unwrap(), b"ok");
    let e = root.open_read("nodir/../hello.txt").unwrap_err();
    assert_eq!(e.to_string(), "nodir: no such directory");
    let e = root.create_part("nodir/../x.bin", 2).unwrap_err();
    assert_eq!(e.to_string(), "nodir: no such directory");
    assert!(!dir.path().join("x.bin").exists());
}

#[test]
fn part_file_lock_is_exclusive_until_dropped() {
    let (dir, root) = setup();
    let mut first = root.create_part("big.bin", 10).unwrap();
    first.write_at(0, b"0123456789").unwrap();
    let e = root.create_part("big.bin", 100).unwrap_err();
    assert!(matches!(e, FsError::Busy(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "big.bin: another transfer is writing this file right now"
    );
    assert_eq!(
        fs::metadata(dir.path().join(".big.bin.hayate-part"))
            .unwrap()
            .len(),
        10,
        "the busy attempt did not resize"
    );
    first.abandon();
    hayate_io::writeback::settle_all();
    let again = root.create_part("big.bin", 10).unwrap();
    assert_eq!(again.existing_len(), 10);
    drop(again);
    hayate_io::writeback::settle_all();
    let third = root.create_part("big.bin", 10).unwrap();
    third.commit(None, None).unwrap();
    let fourth = root.create_part("big.bin", 4).unwrap();
    assert_eq!(fourth.existing_len(), 0, "a fresh part after a commit");
}

/// The resume state is saved behind the file's queued writes, without waiting for them (a
/// disk that is behind does not hold up the protocol loop, which saves every half second);
/// a save still queued when the file is discarded writes nothing.
/// Holds up `part`'s writer (a slow disk) until the returned sender is used (or 10 s).
fn hold_writer(part: &mut PartFile) -> std::sync::mpsc::Sender<()> {
    let (go, gate) = std::sync::mpsc::channel::<()>();
    part.after_writes(move || {
        let _ = gate.recv_timeout(Duration::from_secs(10));
    })
    .unwrap();
    go
}

#[test]
fn resume_state_saves_do_not_wait_for_the_writer() {
    let (dir, root) = setup();
    let state = dir.path().join(".w.bin.hayate-state");
    for discard in [false, true] {
        let mut part = root.create_part("w.bin", 4 << 20).unwrap();
        let go = hold_writer(&mut part);
        part.write_at(0, &vec![7u8; 1 << 20]).unwrap();
        let t = std::time::Instant::now();
        part.save_state(b"half").unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the save waited for the writer"
        );
        assert!(!state.exists(), "saved before the writes it covers");
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        part.after_writes(move || {
            let _ = done_tx.send(());
        })
        .unwrap();
        if discard {
            part.discard();
            go.send(()).unwrap();
            done.recv_timeout(Duration::from_secs(10)).unwrap();
            assert!(!state.exists(), "a save queued before the discard wrote");
        } else {
            go.send(()).unwrap();
            done.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(part.load_state().unwrap(), b"half");
            part.commit(None, None).unwrap();
            assert!(!state.exists());
        }
    }
}

#[test]
fn a_part_file_let_go_does_not_wait_for_its_writes() {
    let (dir, root) = setup();
    let mut part = root.create_part("g.bin", 4 << 20).unwrap();
    let go = hold_writer(&mut part);
    part.write_at(0, &vec![5u8; 3 << 20]).unwrap();
    part.save_state(b"three").unwrap();
    // Gathered, not yet handed to the writer: dropping the file hands it over.
    part.write_at(3 << 20, &[6u8; 1000]).unwrap();
    let t = std::time::Instant::now();
    part.abandon();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "letting the file go waited for its writes"
    );
    // Until its writes and state are in, another transfer of the file finds it busy.
    assert!(matches!(
        root.create_part("g.bin", 4 << 20),
        Err(FsError::Busy(_))
    ));
    go.send(()).unwrap();
    hayate_io::writeback::settle_all();
    // The space reservation's worker (one per process, at a low priority) may be in the
    // middle of one of the file's `fallocate` calls, holding it open for that long.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let part = loop {
        match root.create_part("g.bin", 4 << 20) {
            Err(FsError::Busy(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => break other.unwrap(),
        }
    };
    assert_eq!(part.load_state().unwrap(), b"three");
    part.abandon();
    let got = fs::read(dir.path().join(".g.bin.hayate-part")).unwrap();
    assert!(got[..3 << 20].iter().all(|&b| b == 5));
    assert!(got[3 << 20..(3 << 20) + 1000].iter().all(|&b| b == 6));
}

#[test]
fn a_fifo_destination_let_go_while_its_reader_waits_does_not_hang() {
    let (dir, root) = setup();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let data: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 251) as u8).collect();
    // The reader opens the FIFO but reads only once told to: the pipe (64 KiB) fills.
    let (read_now, wait) = std::sync::mpsc::channel::<()>();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut f = fs::File::open(fifo).unwrap();
            let _ = wait.recv_timeout(Duration::from_secs(20));
            let mut v = Vec::new();
            f.read_to_end(&mut v).unwrap();
            v
        })
    };
    let mut part = create_when_read(&root, "fifo", 3 << 20);
    part.write_at(0, &data).unwrap();
    let t = std::time::Instant::now();
    part.abandon();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "letting a FIFO go waited for its reader"
    );
    read_now.send(()).unwrap();
    // What was written in order still goes out, then the FIFO closes.
    assert_eq!(reader.join().unwrap(), data);
}

#[test]
fn resume_state_save_load_commit_discard() {
    let (dir, root) = setup();
    let mut part = root.create_part("r.bin", 4).unwrap();
    assert_eq!(part.existing_len(), 0);
    assert_eq!(part.load_state(), None);
    assert!(part.final_exists().is_none());
    part.save_state(b"state-1").unwrap();
    part.save_state(b"state-2").unwrap();
    assert_eq!(part.load_state().unwrap(), b"state-2");
    let state = dir.path().join(".r.bin.hayate-state");
    assert_eq!(fs::metadata(&state).unwrap().mode() & 0o777, 0o600);
    part.write_at(0, b"ab").unwrap();
    part.abandon();
    hayate_io::writeback::settle_all();
    assert_eq!(
        names(dir.path()),
        [
            ".r.bin.hayate-part",
            ".r.bin.hayate-state",
            "hello.txt",
            "sub"
        ]
    );

    // Resume: the kept part and its state.
    let mut part = root.create_part("r.bin", 4).unwrap();
    assert_eq!(part.existing_len(), 4);
    assert_eq!(part.load_state().unwrap(), b"state-2");
    part.write_at(2, b"cd").unwrap();
    part.commit(None, None).unwrap();
    assert_eq!(names(dir.path()), ["hello.txt", "r.bin", "sub"]);
    assert_eq!(fs::read(dir.path().join("r.bin")).unwrap(), b"abcd");

    // final_exists sees the committed file; discard removes part and state.
    let mut part = root.create_part("r.bin", 8).unwrap();
    let fin = part.final_exists().unwrap();
    assert_eq!((fin.kind, fin.size), (EntryKind::File, 4));
    part.save_state(b"x").unwrap();
    part.discard();
    assert_eq!(names(dir.path()), ["hello.txt", "r.bin", "sub"]);

    // A state that is a symlink or too big is not read.
    let mut part = root.create_part("s.bin", 1).unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("v"), b"victim").unwrap();
    symlink(
        outside.path().join("v"),
        dir.path().join(".s.bin.hayate-state"),
    )
    .unwrap();
    assert_eq!(part.load_state(), None);
    part.save_state(b"mine").unwrap();
    assert_eq!(fs::read(outside.path().join("v")).unwrap(), b"victim");
    assert_eq!(part.load_state().unwrap(), b"mine");
    fs::File::options()
        .write(true)
        .open(dir.path().join(".s.bin.hayate-state"))
        .unwrap()
        .set_len(17 << 20)
        .unwrap();
    assert_eq!(part.load_state(), None);
    part.discard();
    assert!(matches!(
        root.create_part("t.hayate-state", 1),
        Err(FsError::InvalidPath(_))
    ));
    // final_exists reports what a symlink leads to, or the link itself when it dangles.
    symlink("hello.txt", dir.path().join("ln")).unwrap();
    let part = root.create_part("ln", 1).unwrap();
    let fin = part.final_exists().unwrap();
    assert_eq!((fin.kind, fin.size), (EntryKind::File, 11));
    part.discard();
    symlink("nowhere", dir.path().join("dangling")).unwrap();
    let part = root.create_part("dangling", 1).unwrap();
    let fin = part.final_exists().unwrap();
    assert_eq!(
        (fin.kind, fin.target.as_str()),
        (EntryKind::Symlink, "nowhere")
    );
    part.discard();
}

#[test]
fn umask_is_stable() {
    let u = umask();
    assert_eq!(u & !0o777, 0);
    assert_eq!(umask(), u);
}

/// A source file read in order, with a jump back (a retransmission) in between, then past
/// what is read ahead, gives the file's bytes everywhere; a file that shrank says so.
#[test]
fn a_source_file_reads_ahead_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let data: Vec<u8> = (0..(SourceFile::CHUNK * 2 + 5000) as u32)
        .map(|i| (i % 251) as u8)
        .collect();
    std::fs::write(&path, &data).unwrap();
    let mut src = SourceFile::new(std::fs::File::open(&path).unwrap(), data.len() as u64);
    let block = 1430;
    let mut buf = vec![0u8; block];
    let mut offsets: Vec<u64> = (0..data.len() / block)
        .map(|i| (i * block) as u64)
        .collect();
    offsets.insert(300, 7 * block as u64);
    offsets.insert(10, 3);
    for off in offsets {
        let n = block.min(data.len() - off as usize);
        read_now(&mut src, off, &mut buf[..n]).unwrap();
        assert_eq!(&buf[..n], &data[off as usize..off as usize + n], "at {off}");
    }
    let last = (data.len() - 10) as u64;
    read_now(&mut src, last, &mut buf[..10]).unwrap();
    assert_eq!(&buf[..10], &data[data.len() - 10..]);

    // Shrunk behind its back: what is still read ahead is served, the rest is an error.
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1000)
        .unwrap();
    let mut src = SourceFile::new(std::fs::File::open(&path).unwrap(), data.len() as u64);
    let err = read_now(&mut src, 0, &mut buf).unwrap_err();
    assert!(
        matches!(
            err,
            SourceError::Changed {
                how: Change::Shrank | Change::Size { .. }
            }
        ),
        "{err}"
    );
}

#[test]
fn a_part_file_gathers_writes_and_hands_them_over_before_anything_reads() {
    let (dir, root) = setup();
    let run = PartFile::RUN;
    let size = run * 3 + 777;
    let data: Vec<u8> = (0..size as u32).map(|i| (i % 253) as u8 + 1).collect();
    let path = dir.path().join(".g.bin.hayate-part");
    let mut part = root.create_part("g.bin", size as u64).unwrap();
    // Datagram-sized writes in order: the first ones wait in the gathering buffer.
    let mut at = 0;
    for _ in 0..10 {
        part.write_at(at as u64, &data[at..at + 1430]).unwrap();
        at += 1430;
    }
    assert!(
        fs::read(&path).unwrap()[..at].iter().all(|&b| b == 0),
        "gathered, not written"
    );
    // The resume state never claims what the file does not hold: once it is saved (behind
    // the writes, on the writer thread), they are in the file.
    part.save_state(b"have 0-14300").unwrap();
    assert_eq!(part.load_state().unwrap(), b"have 0-14300");
    assert!(fs::read(&path).unwrap()[..at] == data[..at]);
    // In order past a whole run (written as it fills), a jump back (a retransmission),
    // a write bigger than a run, and the short tail.
    while at + 1430 <= 2 * run {
        part.write_at(at as u64, &data[at..at + 1430]).unwrap();
        at += 1430;
    }
    // Whole runs are written behind, by a writer thread: in the file once flushed.
    part.flush().unwrap();
    assert!(fs::read(&path).unwrap()[..at] == data[..at]);
    let gap = at;
    at += 1430;
    part.write_at(at as u64, &data[at..at + run + 10]).unwrap();
    at += run + 10;
    part.write_at(gap as u64, &data[gap..gap + 1430]).unwrap();
    part.write_at(at as u64, &data[at..]).unwrap();
    assert_eq!(part.hash().unwrap(), blake3::hash(&data));
    assert!(fs::read(&path).unwrap() == data);

    // Dropped (the session ended): what was gathered still reaches the file.
    let mut part = root.create_part("h.bin", 100).unwrap();
    part.write_at(0, b"kept").unwrap();
    drop(part);
    hayate_io::writeback::settle_all();
    assert_eq!(
        &fs::read(dir.path().join(".h.bin.hayate-part")).unwrap()[..4],
        b"kept"
    );
}

/// A 4 MiB tmpfs at a fresh directory, unmounted on drop; None (and a message) where this
/// process may not mount (not root).
struct SmallFs(tempfile::TempDir);

impl SmallFs {
    fn mount() -> Option<SmallFs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            skip("cannot mount a small tmpfs (needs root)");
            return None;
        }
        Some(SmallFs(dir))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

fn is_no_space(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC)
}

/// A destination too small for the file fails as the transfer starts, not once the disk is
/// full: a small file when it is created, a large one at its first writes, however little of
/// it has come.
#[test]
fn a_destination_too_small_for_the_file_fails_at_once() {
    let Some(small) = SmallFs::mount() else {
        return;
    };
    let root = Root::open(small.0.path()).unwrap();
    let filler = small.0.path().join("filler");
    fs::write(&filler, vec![0u8; 7 << 19]).unwrap();
    match root.create_part("small.bin", 1 << 20) {
        Err(FsError::Io(_, e)) if is_no_space(&e) => {}
        other => panic!("expected no space, got {other:?}"),
    }
    fs::remove_file(&filler).unwrap();
    let mut part = root.create_part("big.bin", 64 << 20).unwrap();
    let block = vec![7u8; 1430];
    let t0 = std::time::Instant::now();
    let mut written = 0u64;
    let err = loop {
        match part.write_at(written, &block).and_then(|()| part.flush()) {
            Ok(()) => written += block.len() as u64,
            Err(e) => break e,
        }
        // Slower than any receiver, so the reservation wins the race if it works at all.
        std::thread::sleep(Duration::from_millis(1));
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no error after {written} bytes"
        );
    };
    assert!(is_no_space(&err), "{err:?}");
    assert!(written < 1 << 20, "failed only after {written} bytes");
    // As a receiver does with a file it cannot write: what was reserved goes with it.
    part.discard();
    // Fits: reserved and written in full.
    let mut part = root.create_part("fits.bin", 3 << 20).unwrap();
    part.write_at(0, &vec![1u8; 3 << 20]).unwrap();
    part.commit(None, None).unwrap();
    assert_eq!(
        fs::metadata(small.0.path().join("fits.bin")).unwrap().len(),
        3 << 20
    );
}

/// A test that cannot run on this host: under `CI` (where `.ci/run` installed everything it
/// needs) that is a failure; elsewhere it says SKIP on stdout.
fn skip(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "cannot run under CI: {reason}"
    );
    println!("SKIP: {reason}");
}

/// Skips (printing SKIP) where a test needs root, but fails under CI, which runs as root.
fn need_root(what: &str) -> bool {
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{what} needs root, and CI is set: failing instead of skipping"
    );
    println!("SKIP: {what} needs root");
    false
}

fn mknod(path: &Path, mode: libc::mode_t, dev: libc::dev_t) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    assert_eq!(
        unsafe { libc::mknod(c.as_ptr(), mode, dev) },
        0,
        "mknod {path:?}"
    );
}

#[test]
fn a_symlinked_destination_is_followed_and_stays_a_link() {
    let (dir, root) = setup();
    fs::write(dir.path().join("sub/target.bin"), b"old").unwrap();
    symlink("sub/target.bin", dir.path().join("ln")).unwrap();
    let mut part = root.create_part("ln", 3).unwrap();
    assert!(!part.in_place());
    assert!(
        dir.path().join("sub/.target.bin.hayate-part").exists(),
        "the temp file is next to the link's target"
    );
    part.write_at(0, b"new").unwrap();
    part.commit(Some(0o644), None).unwrap();
    let ln = dir.path().join("ln");
    assert!(fs::symlink_metadata(&ln).unwrap().file_type().is_symlink());
    assert_eq!(fs::read_link(&ln).unwrap(), Path::new("sub/target.bin"));
    assert_eq!(fs::read(dir.path().join("sub/target.bin")).unwrap(), b"new");

    // A dangling link: its target is created, through a chain of links and `..`.
    symlink("../made.bin", dir.path().join("sub/up")).unwrap();
    symlink("sub/up", dir.path().join("chain")).unwrap();
    let mut part = root.create_part("chain", 1).unwrap();
    part.write_at(0, b"m").unwrap();
    part.commit(None, None).unwrap();
    assert_eq!(fs::read(dir.path().join("made.bin")).unwrap(), b"m");
    assert!(fs::symlink_metadata(dir.path().join("chain"))
        .unwrap()
        .file_type()
        .is_symlink());

    // Confined: a link leading out of the root is refused, and nothing outside is touched.
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("victim"), b"keep").unwrap();
    symlink(outside.path().join("victim"), dir.path().join("abs-out")).unwrap();
    symlink("../../escape", dir.path().join("sub/rel-out")).unwrap();
    for rel in ["abs-out", "sub/rel-out"] {
        let e = root.create_part(rel, 1).unwrap_err();
        assert!(matches!(e, FsError::Escapes(_)), "{rel}: {e:?}");
        assert_no_leak(&e, dir.path());
    }
    assert_eq!(fs::read(outside.path().join("victim")).unwrap(), b"keep");
    // A link to a directory is a directory.
    symlink("sub", dir.path().join("to-dir")).unwrap();
    assert!(matches!(
        root.create_part("to-dir", 1),
        Err(FsError::NotAFile(_))
    ));
}

/// `create_part` of a FIFO, once its reader (a thread just started) has it open: until then
/// it says so at once (it never waits on the caller's loop), and the caller tries again.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

fn create_when_read(root: &Root, rel: &str, size: u64) -> hayate_io::fs::PartFile {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match root.create_part(rel, size) {
            Err(FsError::NoReader(_)) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            r => return r.unwrap(),
        }
    }
}

#[test]
fn a_fifo_destination_is_written_in_order_and_never_replaced() {
    let (dir, root) = setup();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || fs::read(fifo).unwrap())
    };
    // Through a symlink too.
    symlink("fifo", dir.path().join("to-fifo")).unwrap();
    let mut part = create_when_read(&root, "to-fifo", data.len() as u64);
    assert!(part.in_place());
    // Blocks arrive out of order, with duplicates and overlaps.
    let cuts = [0, 1000, 700_000, 1_500_000, 2_999_999, 3_000_000];
    for &(a, b) in &[(3, 4), (1, 2), (4, 5), (2, 3), (1, 2), (0, 1)] {
        part.write_at(cuts[a] as u64, &data[cuts[a]..cuts[b]])
            .unwrap();
    }
    part.write_at(500, &data[500..800_000]).unwrap();
    assert_eq!(part.hash().unwrap(), blake3::hash(&data));
    part.commit(Some(0o644), None).unwrap();
    // Checked first: a FIFO replaced by a file leaves its reader waiting for ever.
    let m = fs::symlink_metadata(&fifo).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()));
    assert_eq!(reader.join().unwrap(), data);
    assert_eq!(m.mode() & 0o777, 0o600, "the FIFO's mode is its own");
    assert!(names(dir.path()).iter().all(|n| !n.contains("hayate")));

    // Short of data: not complete, so neither hashed nor committed.
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || fs::read(fifo).unwrap())
    };
    let mut part = create_when_read(&root, "fifo", 10);
    part.write_at(5, b"fghij").unwrap();
    let e = part.hash().unwrap_err();
    assert_eq!(e.to_string(), "only 0 of 10 bytes reached the destination");
    drop(part);
    assert_eq!(reader.join().unwrap(), b"");
}

/// Blocks that come ahead of a gap wait in a holding file and move on to the FIFO once the
/// gap is filled, read and written on the writer thread: here the whole file arrives last
/// block first, more than the writer's queue holds, while the reader takes it slowly.
#[test]
fn a_fifo_destination_takes_a_file_that_arrives_backwards() {
    let (dir, root) = setup();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let data: Vec<u8> = (0..40_000_000u32).map(|i| (i % 251) as u8).collect();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut f = fs::File::open(fifo).unwrap();
            let mut out = Vec::new();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = std::io::Read::read(&mut f, &mut buf).unwrap();
                if n == 0 {
                    return out;
                }
                out.extend_from_slice(&buf[..n]);
                if out.len() % (4 << 20) < n {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        })
    };
    let mut part = create_when_read(&root, "fifo", data.len() as u64);
    let block = 1_000_003;
    let mut starts: Vec<usize> = (0..data.len()).step_by(block).collect();
    starts.reverse();
    for (i, &a) in starts.iter().enumerate() {
        let b = (a + block).min(data.len());
        part.write_at(a as u64, &data[a..b]).unwrap();
        if i % 7 == 0 {
            part.pump().unwrap();
        }
    }
    // A duplicate of bytes already gone out, and one straddling the end of what went.
    part.write_at(10, &data[10..5000]).unwrap();
    assert_eq!(part.hash().unwrap(), blake3::hash(&data));
    part.commit(Some(0o644), None).unwrap();
    let got = reader.join().unwrap();
    assert!(
        got == data,
        "the FIFO's reader got {} bytes, not the file",
        got.len()
    );
}

#[test]
fn a_device_destination_is_written_and_never_replaced() {
    if !need_root("mknod of a test /dev/null") {
        return;
    }
    let (dir, root) = setup();
    // The null device (1, 3), made here rather than touching the real one.
    let null = dir.path().join("null");
    mknod(&null, libc::S_IFCHR | 0o666, libc::makedev(1, 3));
    fs::set_permissions(&null, fs::Permissions::from_mode(0o666)).unwrap();
    let full = dir.path().join("full");
    mknod(&full, libc::S_IFCHR | 0o666, libc::makedev(1, 7));
    let data = vec![7u8; 2 << 20];
    let mut part = root.create_part("null", data.len() as u64).unwrap();
    part.write_at(1 << 20, &data[1 << 20..]).unwrap();
    part.write_at(0, &data[..1 << 20]).unwrap();
    assert_eq!(part.hash().unwrap(), blake3::hash(&data));
    part.commit(Some(0o600), None).unwrap();
    let m = fs::symlink_metadata(&null).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &m.file_type()
    ));
    assert_eq!(m.rdev(), libc::makedev(1, 3));
    assert_eq!(m.mode() & 0o777, 0o666);
    // /dev/full: the write error comes back (written behind: by the flush at the latest),
    // and the device stays.
    let mut part = root.create_part("full", 10).unwrap();
    let e = part
        .write_at(0, b"0123456789")
        .and_then(|()| part.flush())
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    part.discard();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &fs::symlink_metadata(&full).unwrap().file_type()
    ));
    // The real /dev/null, as a download's destination.
    let mut part = create_local_part(Path::new("/dev/null"), 3).unwrap();
    part.write_at(0, b"abc").unwrap();
    part.commit(Some(0o600), None).unwrap();
    let m = fs::metadata("/dev/null").unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &m.file_type()
    ));
    assert_eq!(m.mode() & 0o777, 0o666);
    assert!(!Path::new("/dev/.null.hayate-part").exists());
}

#[test]
fn a_socket_destination_is_refused() {
    let (dir, root) = setup();
    let _l = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).unwrap();
    let e = root.create_part("sock", 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "not a regular file: sock (a socket: nothing can be written to it)"
    );
}

#[test]
fn tilde_means_a_home_directory_only_when_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let home = std::env::var("HOME").unwrap();
    let root = Root::whole_fs(dir.path()).unwrap().expand_tilde();
    assert_eq!(root.stat("~").unwrap().kind, EntryKind::Dir);
    let mut mine = tempfile::Builder::new()
        .prefix("hayate-tilde")
        .tempfile_in(&home)
        .unwrap();
    std::io::Write::write_all(&mut mine, b"in home").unwrap();
    let name = mine
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(read_all(&root, &format!("~/{name}")), b"in home");
    // `~root` from the password database.
    assert_eq!(root.stat("~root/").unwrap().kind, EntryKind::Dir);
    let e = root.stat("~no-such-user-hayate/x").unwrap_err();
    assert_eq!(
        e.to_string(),
        "no such file or directory: ~no-such-user-hayate/x: no such user no-such-user-hayate"
    );
    // Not expanded: a name like any other.
    let plain = Root::whole_fs(dir.path()).unwrap();
    fs::create_dir(dir.path().join("~")).unwrap();
    fs::write(dir.path().join("~/f"), b"literal").unwrap();
    assert_eq!(read_all(&plain, "~/f"), b"literal");
    let confined = Root::open(dir.path()).unwrap().expand_tilde();
    assert_eq!(read_all(&confined, "~/f"), b"literal");
}

/// `SourceFile::read_block`, waiting while a reader thread still reads the chunk ahead
/// (a driver's loop does other work meanwhile).
fn read_now(src: &mut SourceFile, offset: u64, buf: &mut [u8]) -> Result<(), SourceError> {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match src.read_block(offset, buf) {
            Err(SourceError::NotReady) if std::time::Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(1));
            }
            r => return r,
        }
    }
}

#[test]
fn a_source_that_changes_fails_its_reads_and_says_how() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("src.bin");
    let data = vec![5u8; SourceFile::CHUNK * 3];
    let open = |p: &Path| {
        let p2 = p.to_path_buf();
        SourceFile::new(fs::File::open(p).unwrap(), data.len() as u64).watch(Box::new(move || {
            fs::metadata(&p2).map(|m| (m.dev(), m.ino()))
        }))
    };
    let mut buf = vec![0u8; 1430];
    let last = (data.len() - 1430) as u64;

    // Appended to: the next read from the file fails, and the failure is kept.
    fs::write(&path, &data).unwrap();
    let mut src = open(&path);
    read_now(&mut src, 0, &mut buf).unwrap();
    src.check().unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"more")
        .unwrap();
    let e = read_now(&mut src, last, &mut buf).unwrap_err();
    let (was, now) = (data.len() as u64, data.len() as u64 + 4);
    assert!(
        matches!(e, SourceError::Changed { how: Change::Size { was: w, now: n } } if (w, n) == (was, now)),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        format!("changed while being sent (size {was} -> {now} bytes)")
    );
    assert_eq!(src.failure().map(ToString::to_string), Some(e.to_string()));

    // Overwritten in place, same size: the mtime tells, even for a block read ahead.
    fs::write(&path, &data).unwrap();
    let mut src = open(&path);
    read_now(&mut src, last - SourceFile::CHUNK as u64 + 1430, &mut buf).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .write_all_at(b"x", 10)
        .unwrap();
    let e = read_now(&mut src, last, &mut buf).unwrap_err();
    assert!(e.changed(), "{e}");
    assert_eq!(e.to_string(), "changed while being sent (modified)");

    // Replaced under its name (the open file itself unchanged).
    let mut src = open(&path);
    let other = dir.path().join("other.bin");
    fs::write(&other, &data).unwrap();
    fs::rename(&other, &path).unwrap();
    let e = read_now(&mut src, last, &mut buf).unwrap_err();
    assert!(
        matches!(
            e,
            SourceError::Changed {
                how: Change::Replaced
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "changed while being sent (replaced by another file)"
    );
}

/// `--delete`'s removal: one entry beneath a directory, a link as a link, an empty directory;
/// nothing outside that directory (no `..`, no link on the way, none out of a confined root).
#[test]
fn remove_takes_one_entry_beneath_its_directory_and_nothing_outside() {
    for confined in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret"), b"secret").unwrap();
        fs::create_dir(outside.path().join("d")).unwrap();
        fs::write(outside.path().join("d/f"), b"f").unwrap();
        let d = dir.path();
        fs::create_dir_all(d.join("t/sub/empty")).unwrap();
        fs::write(d.join("t/f"), b"x").unwrap();
        fs::write(d.join("t/sub/g"), b"y").unwrap();
        fs::write(d.join("t/.f.hayate-part"), b"part").unwrap();
        symlink(outside.path().join("secret"), d.join("t/out-file")).unwrap();
        symlink(outside.path().join("d"), d.join("t/out-dir")).unwrap();
        symlink("sub", d.join("t/in-dir")).unwrap();
        // The top itself may be a link to a directory (followed, as the copy followed it).
        symlink("t", d.join("top-link")).unwrap();
        let (root, top) = if confined {
            (Root::open(d).unwrap(), "top-link".to_string())
        } else {
            (
                Root::whole_fs(outside.path()).unwrap(),
                d.join("top-link").display().to_string(),
            )
        };

        // Plain entries: a file, a link (itself, not its target), an empty directory.
        root.remove(&top, "f", false).unwrap();
        root.remove(&top, "out-file", false).unwrap();
        root.remove(&top, "out-dir", false).unwrap();
        root.remove(&top, "sub/empty", true).unwrap();
        assert!(!d.join("t/f").exists() && !d.join("t/sub/empty").exists());
        assert!(fs::symlink_metadata(d.join("t/out-file")).is_err());
        assert!(fs::symlink_metadata(d.join("t/out-dir")).is_err());
        assert_eq!(fs::read(outside.path().join("secret")).unwrap(), b"secret");
        assert_eq!(fs::read(outside.path().join("d/f")).unwrap(), b"f");
        // Already gone: no error.
        root.remove(&top, "f", false).unwrap();

        // What was listed changed: a directory is not removed as a file, a file not as a
        // directory, a directory with something in it not at all.
        let e = root.remove(&top, "sub", false).unwrap_err();
        assert!(e.to_string().contains("is a directory now"), "{e}");
        let e = root.remove(&top, "sub/g", true).unwrap_err();
        assert!(e.to_string().contains("no longer a directory"), "{e}");
        let e = root.remove(&top, "sub", true).unwrap_err();
        assert!(e.to_string().contains("directory not empty"), "{e}");

        // Never through a link on the way, never a `..`, `.`, empty or absolute path.
        symlink(outside.path().join("d"), d.join("t/sub/link")).unwrap();
        for (rel, is_dir) in [
            ("in-dir/g", false),
            ("sub/link/f", false),
            ("../t/sub/g", false),
            ("sub/../f", false),
            ("./sub/g", false),
            ("sub//g", false),
            ("/etc/passwd", false),
            ("", true),
            ("sub/", true),
        ] {
            let e = root.remove(&top, rel, is_dir).unwrap_err();
            assert!(
                matches!(e, FsError::InvalidPath(_)),
                "{rel}: {e:?} (confined: {confined})"
            );
            if confined {
                assert_no_leak(&e, d);
            }
        }
        assert_eq!(fs::read(d.join("t/sub/g")).unwrap(), b"y");
        assert_eq!(fs::read(outside.path().join("d/f")).unwrap(), b"f");
        // Temp and state files are left to `hayate clean`.
        let e = root.remove(&top, ".f.hayate-part", false).unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        assert!(d.join("t/.f.hayate-part").exists());
    }

    // Confined: the top must be beneath the root too.
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), b"secret").unwrap();
    symlink(outside.path(), dir.path().join("out")).unwrap();
    let root = Root::open(dir.path()).unwrap();
    for top in ["out", "..", "/tmp", "../x"] {
        let e = root.remove(top, "secret", false).unwrap_err();
        assert!(matches!(e, FsError::Escapes(_)), "{top}: {e:?}");
        assert_no_leak(&e, dir.path());
    }
    assert_eq!(fs::read(outside.path().join("secret")).unwrap(), b"secret");
}

/// A block behind the chunk being sent (a retransmission) that the page cache no longer
/// holds is not read on the caller's thread: it is `NotReady` until the file's reader
/// thread has read it, then its bytes.
#[test]
fn a_block_sent_again_that_left_the_page_cache_is_read_by_the_reader_thread() {
    // Not in /tmp: a tmpfs holds files in memory, and those are read on the caller's thread.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("f");
    let data: Vec<u8> = (0..(SourceFile::CHUNK * 2 + 5000) as u32)
        .map(|i| (i % 249) as u8)
        .collect();
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    file.sync_all().unwrap();
    let mut src = SourceFile::new(file.try_clone().unwrap(), data.len() as u64);
    let block = 1430;
    let mut buf = vec![0u8; block];
    // Into the second chunk, and the third (the file's last) read ahead.
    let into_second = SourceFile::CHUNK as u64 + 10;
    read_now(&mut src, into_second, &mut buf).unwrap();
    let mut third = vec![0u8; 100];
    read_now(&mut src, (SourceFile::CHUNK * 2) as u64, &mut third).unwrap();
    read_now(&mut src, into_second, &mut buf).unwrap();
    assert_eq!(
        &buf[..],
        &data[into_second as usize..into_second as usize + block]
    );
    let back = 7 * block as u64;
    // The file leaves the page cache (the chunk held stays in memory). Until a read that
    // must not wait says the block is gone: a page locked by I/O at the time may be passed
    // over (a clean-clone CI run, and a local run beside the other tests, read the block
    // on the caller's thread after two tries 20 ms apart).
    let evict = || {
        for _ in 0..100 {
            rustix::fs::fadvise(
                &file,
                0,
                std::num::NonZeroU64::new(data.len() as u64),
                rustix::fs::Advice::DontNeed,
            )
            .unwrap();
            let mut probe = [0u8; 1];
            let cached = rustix::io::preadv2(
                &file,
                &mut [std::io::IoSliceMut::new(&mut probe)],
                back,
                rustix::io::ReadWriteFlags::NOWAIT,
            );
            if cached.is_err() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("the block stays in the page cache");
    };
    evict();
    let first = src.read_block(back, &mut buf);
    assert!(
        matches!(first, Err(SourceError::NotReady)),
        "read on the caller's thread: {first:?}"
    );
    read_now(&mut src, back, &mut buf).unwrap();
    assert_eq!(&buf[..], &data[back as usize..back as usize + block]);
    // Asked again later (the datagram was lost again): read again, as the first time.
    evict();
    buf.fill(0);
    read_now(&mut src, back, &mut buf).unwrap();
    assert_eq!(&buf[..], &data[back as usize..back as usize + block]);
}

/// Reads that jump forward to short stretches (a delta's changed leaves) read those bytes
/// alone, not the 1 MiB chunk around each; a long enough run from there is read in chunks
/// again. The chunks read whole are what `take_chunks` hands out.
#[test]
fn a_source_read_in_scattered_stretches_reads_no_whole_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let chunk = SourceFile::CHUNK;
    let data: Vec<u8> = (0..(chunk * 8 + 777) as u32)
        .map(|i| (i % 241) as u8)
        .collect();
    std::fs::write(&path, &data).unwrap();
    let mut src = SourceFile::new(std::fs::File::open(&path).unwrap(), data.len() as u64);
    src.keep_chunks(true);
    let block = 8936;
    let mut buf = vec![0u8; block];
    let starts = |v: Vec<(u64, std::sync::Arc<hayate_io::pagebuf::PageBuf>)>| -> Vec<u64> {
        v.into_iter().map(|(s, _)| s).collect()
    };
    // From the start: in chunks.
    read_now(&mut src, 0, &mut buf).unwrap();
    assert_eq!(&buf[..], &data[..block]);
    assert_eq!(starts(src.take_chunks()), vec![0]);
    // Jumps past what is read ahead, to stretches of a block or two: those bytes alone.
    for at in [6 * chunk + 5000, 6 * chunk + 5000 + block, 7 * chunk + 100] {
        read_now(&mut src, at as u64, &mut buf).unwrap();
        assert_eq!(&buf[..], &data[at..at + block], "at {at}");
    }
    assert_eq!(starts(src.take_chunks()), Vec::<u64>::new());
    // A run of more than 64 KiB from there: the chunk is read whole.
    let mut at = 7 * chunk + 100 + block;
    while at < 7 * chunk + 100 + (80 << 10) {
        read_now(&mut src, at as u64, &mut buf).unwrap();
        assert_eq!(&buf[..], &data[at..at + block], "at {at}");
        at += block;
    }
    assert_eq!(starts(src.take_chunks()), vec![7 * chunk as u64]);
}
