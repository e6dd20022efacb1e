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

/// The user's ssh command (`-e/--ssh`, split into words) and the command it runs on the far
/// side: `hayate serve --stdio` on a UDP port in `ports` (`cp HOST:PATH` and `tunnel` alike).
pub fn far_side_command(
    ssh: &str,
    remote_path: &str,
    ports: (u16, u16),
) -> anyhow::Result<(Vec<String>, String)> {
    use hayate_io::ssh::{shell_quote, split_command};
    let command = split_command(ssh).map_err(|e| anyhow!("--ssh: {e}"))?;
    if command.is_empty() {
        anyhow::bail!("--ssh: empty command");
    }
    let remote_cmd = format!(
        "{} serve --stdio --port-range {}-{}",
        shell_quote(remote_path),
        ports.0,
        ports.1
    );
    Ok((command, remote_cmd))
}
