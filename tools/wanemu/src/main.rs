//! hayate-wanemu: emulate a WAN link per direction on NFQUEUE.
//!
//! Run it in a router namespace whose FORWARD chain sends each direction to its
//! own queue, e.g. `iptables -t mangle -A FORWARD -i veth-c -j NFQUEUE --queue-num 0`.
//! Each direction runs on its own thread with its own netlink socket; packets stay
//! in the kernel and only verdicts (by id) travel.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use clap::Parser;
use hayate_wanemu::model::{self, Decision, Histogram, Link, LinkConfig, LinkStats};
use hayate_wanemu::nfq::{self, MsgBuf, Queue, RecvBatch};

#[derive(Parser, Debug)]
#[command(
    name = "hayate-wanemu",
    about = "WAN link emulator on NFQUEUE: rate, tail-drop queue, random loss, delay"
)]
struct Args {
    /// NFQUEUE number for the forward direction (client → server).
    #[arg(long, default_value_t = 0)]
    queue_fwd: u16,
    /// NFQUEUE number for the reverse direction (server → client).
    #[arg(long, default_value_t = 1)]
    queue_rev: u16,
    /// Link rate per direction, e.g. 1gbit, 500mbit; 0 = unlimited.
    #[arg(long, default_value = "1gbit", value_parser = model::parse_rate)]
    rate: u64,
    /// Round-trip propagation delay; each direction adds half.
    #[arg(long, default_value = "100ms", value_parser = model::parse_duration_ns)]
    rtt: u64,
    /// Random loss per packet, both directions (e.g. 1% or 0.01).
    #[arg(long, default_value = "0", value_parser = model::parse_loss)]
    loss: f64,
    /// Random loss on the reverse direction (default: same as --loss).
    #[arg(long, value_parser = model::parse_loss)]
    loss_rev: Option<f64>,
    /// Tail-drop queue in bytes (e.g. 12500000 or 12M); default 1 BDP.
    #[arg(long, value_parser = model::parse_bytes)]
    buffer: Option<u64>,
    /// Bytes added to each IP packet for serialization (Ethernet header).
    #[arg(long, default_value_t = 14)]
    overhead: u64,
    /// Seed for the loss coins (the reverse direction uses seed+1).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Kernel queue length in packets (packets held in flight per direction).
    #[arg(long, default_value_t = 262_144)]
    queue_maxlen: u32,
    /// Netlink socket receive buffer in bytes.
    #[arg(long, default_value = "64M", value_parser = model::parse_bytes)]
    rcvbuf: u64,
    /// Bytes of each packet copied to us (enough for the IP header).
    #[arg(long, default_value_t = 64)]
    copy_range: u32,
    /// SCHED_FIFO priority for the link threads (0 = normal scheduling).
    #[arg(long, default_value_t = 0)]
    rt_prio: i32,
    /// Print per-direction stats every N seconds to stderr (0 = only at exit).
    #[arg(long, default_value_t = 0.0)]
    stats_interval: f64,
}

static STOP: AtomicBool = AtomicBool::new(false);
/// Bumped by SIGUSR1: each direction prints what it held since the last mark (a bench run
/// marks before and after one transfer, to know how faithful the link was during it).
static MARK: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

extern "C" fn on_mark(_: libc::c_int) {
    MARK.fetch_add(1, Ordering::Relaxed);
}

fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

struct DirStats {
    name: &'static str,
    queue: u16,
    link: LinkStats,
    lateness: Histogram,
    /// Lateness since the last mark.
    window: Histogram,
    window_packets: u64,
    recv_calls: u64,
    verdict_sends: u64,
    /// Packets whose arrival time came from the kernel's receive timestamp.
    kernel_ts: u64,
}

impl DirStats {
    fn line(&self, secs: f64) -> String {
        format!(
            "wanemu dir={} queue={} packets={} bytes={} delivered={} drop_queue={} drop_loss={} \
             max_backlog={} rate_in_mbps={:.1} {} \
             recv_calls={} verdict_sends={} kernel_ts={}",
            self.name,
            self.queue,
            self.link.packets,
            self.link.bytes,
            self.link.delivered,
            self.link.drops_queue,
            self.link.drops_loss,
            self.link.max_backlog,
            if secs > 0.0 {
                self.link.bytes as f64 * 8.0 / secs / 1e6
            } else {
                0.0
            },
            self.lateness.lateness_fields(),
            self.recv_calls,
            self.verdict_sends,
            self.kernel_ts,
        )
    }
}

fn run_direction(
    name: &'static str,
    q: Queue,
    cfg: LinkConfig,
    rt_prio: i32,
    stats_interval: f64,
) -> std::io::Result<DirStats> {
    // Default timer slack (50 µs) would show up directly as release lateness.
    // SAFETY: prctl with integer args.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    if rt_prio > 0 {
        let p = libc::sched_param {
            sched_priority: rt_prio,
        };
        // SAFETY: p is valid; 0 = calling thread.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } != 0 {
            eprintln!(
                "wanemu: {name}: SCHED_FIFO unavailable: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    let mut link = Link::new(cfg);
    let mut pending: VecDeque<(u32, u64)> = VecDeque::with_capacity(1 << 16);
    let mut out = MsgBuf::default();
    let mut batch = RecvBatch::new(64, 512);
    let mut st = DirStats {
        name,
        queue: q.num,
        link: LinkStats::default(),
        lateness: Histogram::new(100_000),
        window: Histogram::new(100_000),
        window_packets: 0,
        recv_calls: 0,
        verdict_sends: 0,
        kernel_ts: 0,
    };
    let start = now_ns();
    let mut next_report = if stats_interval > 0.0 {
        start + (stats_interval * 1e9) as u64
    } else {
        u64::MAX
    };

    let mut mark = MARK.load(Ordering::Relaxed);

    // Accept every packet whose release time has come, as one batch verdict.
    let release_due =
        |now: u64, pending: &mut VecDeque<(u32, u64)>, out: &mut MsgBuf, st: &mut DirStats| {
            let mut last = None;
            while let Some(&(id, t)) = pending.front() {
                if t > now {
                    break;
                }
                st.lateness.record_ns(now - t);
                st.window.record_ns(now - t);
                last = Some(id);
                pending.pop_front();
            }
            if let Some(id) = last {
                out.verdict_batch(q.num, id, nfq::NF_ACCEPT);
            }
        };

    while !STOP.load(Ordering::Relaxed) {
        let now = now_ns();
        release_due(now, &mut pending, &mut out, &mut st);
        let n = batch.recv(&q)?;
        st.recv_calls += 1;
        if n > 0 {
            let arrival = now_ns();
            // Kernel timestamps are CLOCK_REALTIME; map them onto our monotonic clock so
            // time a packet spent waiting for us (a stall) still counts as link time.
            let real_minus_mono = clock_ns(libc::CLOCK_REALTIME).wrapping_sub(arrival);
            for i in 0..n {
                let res = nfq::parse_packets(batch.get(i), |p| {
                    let mut t = arrival;
                    if let Some(ts) = p.tstamp_real_ns {
                        let mono = ts.wrapping_sub(real_minus_mono);
                        // Trust it only if plausible (not in the future, not over 1 s old).
                        if mono <= arrival && arrival - mono < 1_000_000_000 {
                            t = mono;
                            st.kernel_ts += 1;
                        }
                    }
                    st.window_packets += 1;
                    match link.on_packet(t, p.len as u64) {
                        Decision::Release(t) => pending.push_back((p.id, t)),
                        // Drops go out before any later batch accept, so they can't be swept up by it.
                        Decision::Drop(_) => out.verdict(q.num, p.id, nfq::NF_DROP),
                    }
                });
                if let Err(e) = res {
                    eprintln!(
                        "wanemu: {name}: netlink error: {}",
                        std::io::Error::from_raw_os_error(e)
                    );
                }
            }
            release_due(now_ns(), &mut pending, &mut out, &mut st);
            if !out.buf.is_empty() {
                st.verdict_sends += 1;
            }
            q.send(&mut out)?;
            if n == 64 {
                continue; // more may be waiting: drain before sleeping
            }
        } else if !out.buf.is_empty() {
            st.verdict_sends += 1;
            q.send(&mut out)?;
        }
        let m = MARK.load(Ordering::Relaxed);
        if m != mark {
            mark = m;
            println!(
                "wanemu-window dir={name} mark={m} packets={} {}",
                st.window_packets,
                st.window.lateness_fields()
            );
            st.window = Histogram::new(100_000);
            st.window_packets = 0;
        }
        if now >= next_report {
            st.link = link.stats;
            eprintln!("{}", st.line((now - start) as f64 / 1e9));
            next_report += (stats_interval * 1e9) as u64;
        }
        // Sleep until a packet arrives or the head packet is due (capped so STOP is seen).
        let now = now_ns();
        let wait = pending
            .front()
            .map_or(50_000_000, |&(_, t)| t.saturating_sub(now))
            .min(50_000_000);
        if wait == 0 {
            continue;
        }
        let ts = libc::timespec {
            tv_sec: (wait / 1_000_000_000) as libc::time_t,
            tv_nsec: (wait % 1_000_000_000) as libc::c_long,
        };
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&q),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: pfd and ts are valid for the call.
        unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    }
    st.link = link.stats;
    Ok(st)
}

fn enable_rx_timestamps() -> Option<std::net::UdpSocket> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").ok()?;
    let on: libc::c_int = 1;
    // SAFETY: valid fd and int option.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            &on as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    (r == 0).then_some(s)
}

fn main() {
    let args = Args::parse();
    let one_way = args.rtt / 2;
    let bdp = (args.rate as u128 * args.rtt as u128 / 8_000_000_000) as u64;
    let buffer = args.buffer.unwrap_or(bdp).max(1514);
    let mk = |loss: f64, seed: u64| LinkConfig {
        rate_bps: args.rate,
        delay_ns: one_way,
        buffer_bytes: buffer,
        loss,
        overhead_bytes: args.overhead,
        seed,
    };
    let fwd_cfg = mk(args.loss, args.seed);
    let rev_cfg = mk(
        args.loss_rev.unwrap_or(args.loss),
        args.seed.wrapping_add(1),
    );

    // SAFETY: installing an async-signal-safe handler that only stores an atomic.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGTERM,
            on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGUSR1,
            on_mark as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }

    let open = |num| {
        Queue::open(
            num,
            args.copy_range,
            args.queue_maxlen,
            args.rcvbuf as usize,
        )
        .unwrap_or_else(|e| {
            eprintln!("wanemu: cannot open NFQUEUE {num}: {e} (root? nfnetlink_queue?)");
            std::process::exit(2);
        })
    };
    // Any socket asking for receive timestamps makes the kernel stamp every incoming skb,
    // which NFQUEUE then reports (NFQA_TIMESTAMP). Kept open for our lifetime.
    let _ts_sock = enable_rx_timestamps();
    let qf = open(args.queue_fwd);
    let qr = open(args.queue_rev);

    eprintln!(
        "wanemu: rate={} bit/s rtt={} ms buffer={} B (bdp {} B) loss fwd={} rev={} queues fwd={} rev={}",
        args.rate,
        args.rtt as f64 / 1e6,
        buffer,
        bdp,
        fwd_cfg.loss,
        rev_cfg.loss,
        args.queue_fwd,
        args.queue_rev
    );
    let started = now_ns();
    let failed = Arc::new(AtomicBool::new(false));
    let spawn = |name: &'static str, q: Queue, cfg: LinkConfig| {
        let (rt, si, failed) = (args.rt_prio, args.stats_interval, failed.clone());
        std::thread::Builder::new()
            .name(format!("wanemu-{name}"))
            .spawn(move || {
                let r = run_direction(name, q, cfg, rt, si);
                if let Err(e) = &r {
                    eprintln!("wanemu: {name}: {e}");
                    failed.store(true, Ordering::Relaxed);
                    STOP.store(true, Ordering::Relaxed);
                }
                r
            })
            .expect("spawn")
    };
    let hf = spawn("fwd", qf, fwd_cfg);
    let hr = spawn("rev", qr, rev_cfg);
    // The bench script waits for this line before sending traffic.
    println!("wanemu: ready");
    let _ = std::io::stdout().flush();

    let results = [hf.join(), hr.join()];
    let secs = (now_ns() - started) as f64 / 1e9;
    let mut all = Histogram::new(100_000);
    for r in results.into_iter().flatten().flatten() {
        println!("{}", r.line(secs));
        all.merge(&r.lateness);
    }
    println!(
        "wanemu total seconds={:.3} released={} {}",
        secs,
        all.count(),
        all.lateness_fields()
    );
    if failed.load(Ordering::Relaxed) {
        std::process::exit(1);
    }
}
