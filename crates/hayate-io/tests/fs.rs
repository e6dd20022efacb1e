use std::fs;
use std::io::Read;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use hayate_io::fs::{create_local_part, hash_file, read_at, FsError, Root};

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
        "sub/../hello.txt",
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
    assert!(matches!(root.open_read("sub"), Err(FsError::NotAFile(_))));
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
fn create_part_creates_parents_writes_and_commits() {
    let (dir, root) = setup();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let part = root
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
    let part = root.create_part("hello.txt", 3).unwrap();
    part.write_at(0, b"new").unwrap();
    part.commit(None, None).unwrap();
    assert_eq!(fs::read(dir.path().join("hello.txt")).unwrap(), b"new");
}

#[test]
fn abandon_leaves_only_the_part_file_and_resume_keeps_it() {
    let (dir, root) = setup();
    let part = root.create_part("up.bin", 10).unwrap();
    part.write_at(0, b"01234").unwrap();
    part.abandon();
    let mut names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".up.bin.hayate-part", "hello.txt", "sub"]);
    // Reopening keeps the data written so far, resized to the final size.
    let part = root.create_part("up.bin", 8).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(read_at(part.file(), 0, &mut buf).unwrap(), 8);
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
    let part = create_local_part(&dest, 5).unwrap();
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
