use std::path::Path;

use hayate_proto::crypto::Psk;

pub fn run(out: &Path, force: bool) -> anyhow::Result<i32> {
    let psk = Psk::generate();
    hayate_io::keyfile::write_new_key_file(out, &psk.to_key_file_string(), force)?;
    eprintln!(
        "wrote a new key to {} (mode 0600); copy it to the other side",
        out.display()
    );
    Ok(0)
}
