use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use hayate_io::keyfile::{read_key_file, write_new_key_file, KeyFileWriteError};

#[test]
fn new_key_file_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("hayate.key");
    write_new_key_file(&p, "k1\n", false).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o600);
    let read = read_key_file(&p).unwrap();
    assert_eq!(read.contents, "k1\n");
    assert!(!read.too_open);
    assert_eq!(read.mode, 0o600);
}

#[test]
fn refuses_to_overwrite_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("hayate.key");
    write_new_key_file(&p, "first", false).unwrap();
    let e = write_new_key_file(&p, "second", false).unwrap_err();
    assert!(matches!(e, KeyFileWriteError::Exists(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "key file exists: {} (use --force to overwrite)",
            p.display()
        )
    );
    assert_eq!(read_key_file(&p).unwrap().contents, "first");
}

#[test]
fn force_replaces_and_stays_private() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("hayate.key");
    fs::write(&p, "old").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
    let read = read_key_file(&p).unwrap();
    assert!(read.too_open, "0644 must be flagged");
    write_new_key_file(&p, "new", true).unwrap();
    let read = read_key_file(&p).unwrap();
    assert_eq!(read.contents, "new");
    assert_eq!(read.mode, 0o600);
    // No temp siblings left behind.
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    // Force also works when nothing exists yet.
    let q = dir.path().join("other.key");
    write_new_key_file(&q, "x", true).unwrap();
    assert_eq!(fs::metadata(&q).unwrap().mode() & 0o7777, 0o600);
}

#[test]
fn errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("missing/dir/hayate.key");
    let e = write_new_key_file(&p, "x", false).unwrap_err();
    assert!(e.to_string().contains("missing/dir/hayate.key"), "{e}");
    let e = read_key_file(&p).unwrap_err();
    assert!(e.to_string().contains("missing/dir/hayate.key"), "{e}");
}

#[test]
fn force_writes_through_a_symlink_and_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.key");
    fs::write(&real, "old").unwrap();
    let link = dir.path().join("link.key");
    std::os::unix::fs::symlink("real.key", &link).unwrap();
    write_new_key_file(&link, "new\n", true).unwrap();
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read_to_string(&real).unwrap(), "new\n");
    assert_eq!(fs::metadata(&real).unwrap().mode() & 0o7777, 0o600);
    // Dangling: the target is created, the link stays.
    let dangling = dir.path().join("dangling.key");
    std::os::unix::fs::symlink("made.key", &dangling).unwrap();
    write_new_key_file(&dangling, "made\n", true).unwrap();
    assert!(fs::symlink_metadata(&dangling)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        fs::read_to_string(dir.path().join("made.key")).unwrap(),
        "made\n"
    );
}

#[test]
fn force_writes_into_a_fifo_without_replacing_it() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || fs::read_to_string(fifo).unwrap())
    };
    write_new_key_file(&fifo, "key\n", true).unwrap();
    // Checked first: a FIFO replaced by a file leaves its reader waiting for ever.
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(
        &fs::symlink_metadata(&fifo).unwrap().file_type()
    ));
    assert_eq!(reader.join().unwrap(), "key\n");
}

#[test]
fn a_huge_key_file_is_refused_after_a_bounded_read() {
    let e = read_key_file(std::path::Path::new("/dev/zero")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot read key file /dev/zero: larger than 4096 bytes: not a key file"
    );
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big.key");
    fs::write(&p, vec![b'a'; 4097]).unwrap();
    assert!(read_key_file(&p).is_err());
    fs::write(&p, vec![b'a'; 4096]).unwrap();
    assert!(read_key_file(&p).is_ok());
}
