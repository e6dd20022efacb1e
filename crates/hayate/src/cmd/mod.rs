pub mod clean;
pub mod cp;
pub mod docs;
pub mod keygen;
pub mod location;
pub mod serve;
pub mod tunnel;

use std::path::Path;

use anyhow::{anyhow, Context};
use hayate_proto::crypto::Psk;

/// Load the pre-shared key, with a hint on how to get one.
pub fn load_key(path: Option<&Path>) -> anyhow::Result<Psk> {
    let path = path.ok_or_else(|| {
        anyhow!("no key: pass --key-file FILE or set HAYATE_KEY_FILE (create one with `hayate keygen --out FILE`)")
    })?;
    let k = hayate_io::keyfile::read_key_file(path)?;
    if k.too_open {
        eprintln!(
            "hayate: warning: key file {} is readable by others (mode {:o}); chmod 600 it",
            path.display(),
            k.mode
        );
    }
    Psk::parse_key_file(&k.contents).with_context(|| format!("key file {}", path.display()))
}
