//! wanblast: paced UDP blaster for bench/wan's self-test.
//!
//! iperf3 sends one datagram per system call and tops out below 1 Gbit/s on this
//! 2-core VM, which would measure the generator instead of the link. This sends
//! 1472-byte datagrams with UDP GSO (up to 44 per call), paced per millisecond.
//! Usage: wanblast ADDR:PORT RATE_BPS SECONDS

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const SEG: usize = 1472;
const SEGS_PER_SEND: usize = 44; // 44 × 1472 = 64768 < 65507, the UDP limit

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 4 {
        eprintln!("usage: wanblast ADDR:PORT RATE_BPS SECONDS");
        std::process::exit(2);
    }
    let dst: SocketAddr = a[1].parse().expect("ADDR:PORT");
    let rate: f64 = a[2].parse().expect("RATE_BPS");
    let secs: f64 = a[3].parse().expect("SECONDS");
    let sock = UdpSocket::bind("0.0.0.0:0").expect("bind");
    sock.connect(dst).expect("connect");
    let seg = SEG as libc::c_int;
    // SAFETY: setsockopt with a valid int; failure just means no GSO.
    let gso = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            &seg as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        )
    } == 0;
    let chunk = if gso { SEG * SEGS_PER_SEND } else { SEG };
    let buf = vec![0x5au8; chunk];
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let (mut sent, mut errs) = (0u64, 0u64);
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        // Payload bytes allowed so far (pacing on UDP payload; the wire adds 42 B per datagram).
        let allowed = rate / 8.0 * (now - start).as_secs_f64() * SEG as f64 / (SEG + 42) as f64;
        if (sent as f64) + chunk as f64 <= allowed {
            match sock.send(&buf) {
                Ok(n) => sent += n as u64,
                Err(_) => errs += 1, // ENOBUFS/ECONNREFUSED from ICMP: keep blasting
            }
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let t = start.elapsed().as_secs_f64();
    println!(
        "wanblast gso={} sent_bytes={} seconds={:.3} offered_wire_bps={:.0} send_errors={}",
        gso,
        sent,
        t,
        sent as f64 * (SEG + 42) as f64 / SEG as f64 * 8.0 / t,
        errs
    );
}
