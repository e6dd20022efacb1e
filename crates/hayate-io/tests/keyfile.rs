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
