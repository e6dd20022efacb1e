//! A `hayate serve` in a few lines: serves a directory to clients that hold the key.
//!
//! ```sh
//! cargo run -p hayate-io --example server -- 127.0.0.1:5300 /srv/data /path/to/key
//! ```
//! Then, from another shell: `hayate cp --key-file /path/to/key FILE hayate://127.0.0.1:5300/`.
//! Stops on Ctrl-C (the driver polls the stop flag).

use std::path::PathBuf;

use hayate_io::driver::server::{serve, Scope, ServerOptions};
use hayate_io::driver::StopFlag;
use hayate_proto::cc::RateConfig;
use hayate_proto::crypto::Psk;
use hayate_proto::Config;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(root), Some(key)) = (args.next(), args.next(), args.next()) else {
        anyhow::bail!("usage: server LISTEN_ADDR ROOT_DIR KEY_FILE");
    };
    let text = hayate_io::keyfile::read_key_file(key.as_ref())?;
    let psk = Psk::parse_key_file(&text.contents)?;
    let opts = ServerOptions {
        listen: listen.parse()?,
        // Nothing outside ROOT is reachable (openat2 RESOLVE_BENEATH).
        scope: Scope::Confined(PathBuf::from(root)),
        psk,
        proto: Config {
            // The server adapts to each client's own cap; no cap of its own.
            rate: RateConfig::ADAPTIVE,
            ..Config::default()
        },
        // One thread per core.
        threads: 0,
    };
    let stop = StopFlag::new();
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.inner())?;
    serve(opts, stop, &mut |line| eprintln!("server: {line}"))
}
