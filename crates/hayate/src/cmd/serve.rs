use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use hayate_io::driver::server::{serve, ServerOptions};
use hayate_io::driver::StopFlag;
use hayate_proto::Config;

use crate::units::parse_rate;
use crate::KeyArgs;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address and UDP port to listen on
    #[arg(long, default_value = "0.0.0.0:5300", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// Directory to serve: uploads land beneath it, downloads come from it, nothing else
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Most this server sends per session, bits/s (k/M/G) or `max`; clients may ask for less
    #[arg(long, default_value = "max", value_parser = parse_rate)]
    pub rate: hayate_proto::cc::RateConfig,
    /// Largest datagram (IP MTU) the server accepts to use
    #[arg(long, default_value_t = 65535, value_parser = clap::value_parser!(u16).range(1280..))]
    pub max_mtu: u16,
    /// Only print errors
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(a: ServeArgs) -> anyhow::Result<i32> {
    let psk = super::load_key(a.key.key_file.as_deref())?;
    let stop = StopFlag::new();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.inner())?;
    }
    let opts = ServerOptions {
        listen: a.listen,
        root: a.root,
        psk,
        proto: Config {
            mtu: a.max_mtu,
            rate: a.rate,
            idle_timeout: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(5),
        },
    };
    let quiet = a.quiet;
    let mut log = |line: &str| {
        if !quiet {
            eprintln!("hayate serve: {line}");
        }
    };
    serve(opts, stop, &mut log)?;
    Ok(0)
}
