//! An upload to a running `hayate serve` (see the `server` example), as `hayate cp` does
//! it: the driver finds the rate, resends what the receiver's loss maps say is missing, and
//! the file is BLAKE3-verified end to end before it gets its name on the server.
//!
//! ```sh
//! cargo run -p hayate-io --example upload -- FILE 127.0.0.1:5300 /path/to/key
//! ```

use hayate_io::driver::client::{run, ClientOptions, Job, Progress, Transport, Ui};
use hayate_io::driver::StopFlag;
use hayate_proto::cc::RateConfig;
use hayate_proto::crypto::Psk;
use hayate_proto::Config;

/// Prints a line a second.
struct Lines(f64);

impl Ui for Lines {
    fn progress(&mut self, p: &Progress<'_>) {
        let t = p.elapsed.as_secs_f64();
        if t - self.0 >= 1.0 {
            self.0 = t;
            println!(
                "{t:5.1} s  {} / {} bytes  {:.0} Mbit/s",
                p.bytes_done,
                p.bytes_total,
                8.0 * p.bytes_moved as f64 / t / 1e6
            );
        }
    }

    fn note(&mut self, msg: &str) {
        println!("{msg}");
    }
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(file), Some(server), Some(key)) = (args.next(), args.next(), args.next()) else {
        anyhow::bail!("usage: upload FILE SERVER_ADDR KEY_FILE");
    };
    let text = hayate_io::keyfile::read_key_file(key.as_ref())?;
    let opts = ClientOptions::new(
        Transport::Udp(server.parse()?),
        Psk::parse_key_file(&text.contents)?,
        Config {
            // Found by itself, no cap (what `hayate cp` does without --rate).
            rate: RateConfig::ADAPTIVE,
            ..Config::default()
        },
    );
    let job = Job::Upload {
        sources: vec![file.into()],
        dest: String::new(),
    };
    let report = run(opts, job, StopFlag::new(), &mut Lines(0.0));
    for f in &report.files {
        match (&f.error, &f.blake3) {
            (Some(e), _) => println!("{}: {e}", f.local.display()),
            (None, Some(h)) => println!("{}: verified, BLAKE3 {h}", f.local.display()),
            (None, None) => println!("{}: done", f.local.display()),
        }
    }
    if let Some(e) = report.error {
        anyhow::bail!(e);
    }
    anyhow::ensure!(
        report.files.iter().all(|f| f.verified),
        "not every file verified"
    );
    Ok(())
}
