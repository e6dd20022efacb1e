use std::path::Path;

use hayate_proto::crypto::Psk;

pub fn run(out: &Path, force: bool) -> anyhow::Result<i32> {
    let psk = Psk::generate();
    hayate_io::keyfile::write_new_key_file(out, &psk.to_key_file_string(), force)?;
    // A device or FIFO (`/dev/stdout`) was written as it is: its mode is its own.
    if std::fs::metadata(out).is_ok_and(|m| m.is_file()) {
        eprintln!(
            "wrote a new key to {} (mode 0600); copy it to the other side",
            out.display()
        );
    } else {
        eprintln!("wrote a new key to {}", out.display());
    }
    Ok(0)
}
