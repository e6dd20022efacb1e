//! The real `hayate serve` under attack while a real `hayate cp` download runs through it.
//! A UDP relay in the test stands between the client and the server (as a NAT or an
//! on-path observer would), so the test sees every datagram the client sends, can replay
//! them from other addresses, move the client to a new port, or stop its acknowledgements.
//! Each case asserts that the victim's transfer completes verified, what the attacker's
//! addresses received, and the server's peak memory; each prints what it measured.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use hayate_proto::crypto::Psk;
use hayate_proto::handshake::ClientHandshake;

const SEALED: u8 = 0x03;

/// Shared controls and observations of the relay.
#[derive(Default)]
struct RelayState {
    /// Sealed datagrams the client sent, as sent (the first few hundred).
    captured: Mutex<Vec<Vec<u8>>>,
    /// The client's ClientHello.
    hello: Mutex<Option<Vec<u8>>>,
    /// Set: the relay forwards the client's datagrams from a fresh socket (a NAT rebinding).
    rebind: AtomicBool,
    /// Set: the client's datagrams are dropped (it stopped acknowledging).
    mute_client: AtomicBool,
    /// Set: the client's next sealed datagram is held back (put in `diverted`) instead of
    /// forwarded, as an on-path attacker that races it would.
    divert_next: AtomicBool,
    diverted: Mutex<Option<Vec<u8>>>,
    /// Server to client bytes relayed, in all.
    down_bytes: AtomicU64,
    stop: AtomicBool,
}

struct Relay {
    /// Where the client sends (its "server").
    front: SocketAddr,
    state: Arc<RelayState>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Relay {
    fn start(server: SocketAddr) -> Relay {
        let front_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        front_sock
            .set_read_timeout(Some(Duration::from_millis(1)))
            .unwrap();
        let front = front_sock.local_addr().unwrap();
        let state = Arc::new(RelayState::default());
        let st = state.clone();
        let handle = thread::spawn(move || {
            let mut back = UdpSocket::bind("127.0.0.1:0").unwrap();
            back.set_nonblocking(true).unwrap();
            let mut rebound = false;
            let mut client: Option<SocketAddr> = None;
            let mut buf = vec![0u8; 65536];
            while !st.stop.load(Ordering::Relaxed) {
                if st.rebind.load(Ordering::Relaxed) && !rebound {
                    rebound = true;
                    back = UdpSocket::bind("127.0.0.1:0").unwrap();
                    back.set_nonblocking(true).unwrap();
                }
                if let Ok((n, from)) = front_sock.recv_from(&mut buf) {
                    client = Some(from);
                    let d = &buf[..n];
                    if d.first() == Some(&SEALED) {
                        let mut cap = st.captured.lock().unwrap();
                        if cap.len() < 500 {
                            cap.push(d.to_vec());
                        }
                    } else if d.starts_with(b"HYT\x01") {
                        st.hello.lock().unwrap().get_or_insert_with(|| d.to_vec());
                    }
                    let divert =
                        d.first() == Some(&SEALED) && st.divert_next.swap(false, Ordering::Relaxed);
                    if divert {
                        *st.diverted.lock().unwrap() = Some(d.to_vec());
                    } else if !st.mute_client.load(Ordering::Relaxed) {
                        let _ = back.send_to(d, server);
                    }
                }
                while let Ok((n, _)) = back.recv_from(&mut buf) {
                    st.down_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    if let Some(c) = client {
                        let _ = front_sock.send_to(&buf[..n], c);
                    }
                }
            }
        });
        Relay {
            front,
            state,
            handle: Some(handle),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("hayate://{}/{path}", self.front)
    }

    /// Waits until the client has sent at least `n` sealed datagrams; returns copies.
    fn captured(&self, n: usize) -> Vec<Vec<u8>> {
        assert!(
            eventually(Duration::from_secs(10), || self
                .state
                .captured
                .lock()
                .unwrap()
                .len()
                >= n),
            "the client sent fewer than {n} sealed datagrams"
        );
        self.state.captured.lock().unwrap().clone()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// An attacker's socket that counts what it receives.
struct Attacker {
    sock: Arc<UdpSocket>,
    received: Arc<AtomicU64>,
    sent: u64,
    stop: Arc<AtomicBool>,
}

impl Attacker {
    fn new(ip: &str) -> Attacker {
        let sock = Arc::new(UdpSocket::bind(format!("{ip}:0")).unwrap());
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, r, st) = (sock.clone(), received.clone(), stop.clone());
        thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !st.load(Ordering::Relaxed) {
                if let Ok((n, _)) = s.recv_from(&mut buf) {
                    r.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        });
        Attacker {
            sock,
            received,
            sent: 0,
            stop,
        }
    }

    fn send(&mut self, to: SocketAddr, d: &[u8]) {
        if self.sock.send_to(d, to).is_ok() {
            self.sent += d.len() as u64;
        }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Peak resident memory (VmHWM, bytes) and CPU seconds of a process.
fn proc_usage(pid: i32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // Fields 14 and 15 of stat (utime, stime) are 11 and 12 after the command name.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (hwm, (ticks(11) + ticks(12)) as f64 / tck)
}

/// A server with one file to download.
struct Fixture {
    _dir: tempfile::TempDir,
    server: Server,
    key: std::path::PathBuf,
    dst: std::path::PathBuf,
    hash: blake3::Hash,
}

const SIZE: u64 = 48 << 20;

fn fixture() -> Fixture {
    fixture_with(&[])
}

/// [`fixture`] with these environment variables for the server.
fn fixture_with(env: &[(&str, &std::path::Path)]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let dst = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    let key = keygen(dir.path(), "k");
    let hash = write_random(&root.join("f.bin"), SIZE, 37);
    let server = Server::start_with_env(&root, &key, env);
    Fixture {
        _dir: dir,
        server,
        key,
        dst,
        hash,
    }
}

impl Fixture {
    fn server_addr(&self) -> SocketAddr {
        format!("127.0.0.1:{}", self.server.port).parse().unwrap()
    }

    /// Starts the download through `relay` at a rate that makes it last a few seconds.
    fn download(&self, relay: &Relay) -> Running {
        let mut cmd = hayate();
        cmd.arg("cp")
            .arg("--key-file")
            .arg(&self.key)
            .args(["--rate", "150M", "--json"])
            .arg(relay.url("f.bin"))
            .arg(&self.dst);
        spawn_cmd(&mut cmd)
    }

    fn assert_verified(&self, run: &Run) {
        run.assert_ok();
        let j = run.json();
        assert_eq!(j["verified"], true, "{j}");
        assert_eq!(hash_file(&self.dst.join("f.bin")), self.hash);
    }
}

fn report(case: &str, attacker_sent: u64, attacker_got: u64, run: &Run, pid: i32) {
    let (hwm, cpu) = proc_usage(pid);
    println!(
        "adversary {case}: attacker sent {attacker_sent} B, received {attacker_got} B; \
         victim {:.2} s; server peak RSS {:.1} MB, CPU {cpu:.2} s",
        run.elapsed.as_secs_f64(),
        hwm as f64 / 1e6
    );
    assert!(
        hwm < 400 << 20,
        "server peak RSS {hwm} B: memory not bounded under attack"
    );
}

#[test]
fn a_replayed_datagram_from_another_address_gets_nothing_and_moves_nothing() {
    replays(&fixture());
}

/// The server's AEAD on threads (the default where a daemon has the cores for it): what its
/// `hayate-open` thread opens still meets the core's replay and forgery checks.
#[test]
fn with_the_aead_on_threads_replays_and_forgeries_change_nothing() {
    let threads = [("HAYATE_AEAD", std::path::Path::new("threads"))];
    for case in [replays, forgeries] {
        let fx = fixture_with(&threads);
        let names = thread_names(fx.server.pid());
        assert!(names.iter().any(|n| n == "hayate-open"), "{names:?}");
        case(&fx);
    }
}

fn replays(fx: &Fixture) {
    let relay = Relay::start(fx.server_addr());
    let client = fx.download(&relay);
    let captured = relay.captured(20);
    let mut att = Attacker::new("127.0.0.1");
    // The datagram of the report: one 65-byte-class control datagram the client sent,
    // replayed unchanged from another port, and every other captured one too.
    for d in &captured {
        for _ in 0..3 {
            att.send(fx.server_addr(), d);
        }
    }
    let run = client.wait(Duration::from_secs(60));
    thread::sleep(Duration::from_millis(200));
    report("replay", att.sent, att.received(), &run, fx.server.pid());
    fx.assert_verified(&run);
    assert_eq!(att.received(), 0, "a replay earned the attacker bytes");
}

#[test]
fn a_forwarded_fresh_datagram_earns_at_most_three_times_its_size_and_no_session() {
    let fx = fixture();
    let relay = Relay::start(fx.server_addr());
    let client = fx.download(&relay);
    relay.captured(20);
    // An on-path attacker races the client: it takes the client's next datagram and
    // delivers it from its own address. It is fresh and authentic, so the server
    // challenges that address, but sends it nothing else and keeps the session.
    let mut att = Attacker::new("127.0.0.1");
    for _ in 0..5 {
        relay.state.divert_next.store(true, Ordering::Relaxed);
        assert!(eventually(Duration::from_secs(5), || relay
            .state
            .diverted
            .lock()
            .unwrap()
            .is_some()));
        let d = relay.state.diverted.lock().unwrap().take().unwrap();
        att.send(fx.server_addr(), &d);
        thread::sleep(Duration::from_millis(150));
    }
    let run = client.wait(Duration::from_secs(60));
    thread::sleep(Duration::from_millis(200));
    report("race", att.sent, att.received(), &run, fx.server.pid());
    fx.assert_verified(&run);
    assert!(att.received() > 0, "the new address was never challenged");
    assert!(
        att.received() <= 3 * att.sent,
        "the new address got {} B for {} B",
        att.received(),
        att.sent
    );
}

#[test]
fn a_client_whose_port_changes_mid_transfer_finishes() {
    let fx = fixture();
    let relay = Relay::start(fx.server_addr());
    let client = fx.download(&relay);
    relay.captured(50);
    thread::sleep(Duration::from_millis(500));
    relay.state.rebind.store(true, Ordering::Relaxed);
    let run = client.wait(Duration::from_secs(60));
    println!(
        "adversary rebinding: victim {:.2} s, {} B relayed down",
        run.elapsed.as_secs_f64(),
        relay.state.down_bytes.load(Ordering::Relaxed)
    );
    fx.assert_verified(&run);
}

#[test]
fn forged_truncated_oversized_and_flipped_datagrams_change_nothing() {
    forgeries(&fixture());
}

fn forgeries(fx: &Fixture) {
    let relay = Relay::start(fx.server_addr());
    let client = fx.download(&relay);
    let captured = relay.captured(30);
    let mut att = Attacker::new("127.0.0.1");
    let to = fx.server_addr();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        for d in &captured {
            // A live connection id with a body of garbage.
            let mut forged = d.clone();
            for b in forged[5..].iter_mut() {
                *b = rnd() as u8;
            }
            att.send(to, &forged);
            // A higher packet number, so it is not a replay, and a wrong tag.
            let mut ahead = d.clone();
            ahead[5..9].copy_from_slice(&((rnd() as u32) | 0x10000).to_be_bytes());
            att.send(to, &ahead);
            // Truncated and bit-flipped copies.
            att.send(to, &d[..d.len() / 2]);
            att.send(to, &d[..9]);
            let mut flipped = d.clone();
            let i = 9 + (rnd() as usize) % (d.len() - 9);
            flipped[i] ^= 1 << (rnd() % 8);
            att.send(to, &flipped);
        }
        let mut big = vec![SEALED; 60_000];
        big[1..5].copy_from_slice(&captured[0][1..5]);
        att.send(to, &big);
    }
    let run = client.wait(Duration::from_secs(60));
    thread::sleep(Duration::from_millis(200));
    report("forgeries", att.sent, att.received(), &run, fx.server.pid());
    fx.assert_verified(&run);
    assert_eq!(att.received(), 0);
}

#[test]
fn garbage_at_line_rate_does_not_stop_a_transfer() {
    let fx = fixture();
    let relay = Relay::start(fx.server_addr());
    let to = fx.server_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let got = Arc::new(AtomicU64::new(0));
    let flooder = {
        let (stop, sent, got) = (stop.clone(), sent.clone(), got.clone());
        thread::spawn(move || {
            let att = Attacker::new("127.0.0.1");
            let mut x = 88172645463325252u64;
            let mut buf = vec![0u8; 1500];
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let n = 1 + (x % 1400) as usize;
                buf[0] = [SEALED, b'H', 0x01, 0xff][(x >> 20) as usize % 4];
                for (i, b) in buf[1..n].iter_mut().enumerate() {
                    *b = (x >> (i % 56)) as u8 ^ i as u8;
                }
                if att.sock.send_to(&buf[..n], to).is_ok() {
                    sent.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
            got.store(att.received(), Ordering::Relaxed);
        })
    };
    let client = fx.download(&relay);
    let run = client.wait(Duration::from_secs(90));
    stop.store(true, Ordering::Relaxed);
    flooder.join().unwrap();
    report(
        "garbage flood",
        sent.load(Ordering::Relaxed),
        got.load(Ordering::Relaxed),
        &run,
        fx.server.pid(),
    );
    fx.assert_verified(&run);
    assert_eq!(got.load(Ordering::Relaxed), 0);
}

#[test]
fn a_hello_flood_from_many_addresses_does_not_crowd_out_a_client() {
    let fx = fixture();
    let to = fx.server_addr();
    let text = hayate_io::keyfile::read_key_file(&fx.key).expect("read the test key");
    let psk = Psk::parse_key_file(&text.contents).expect("parse the test key");
    // The same download alone first, for comparison.
    let relay = Relay::start(to);
    let alone = fx.download(&relay).wait(Duration::from_secs(60));
    fx.assert_verified(&alone);
    std::fs::remove_file(fx.dst.join("f.bin")).unwrap();
    drop(relay);
    // A download runs; then valid hellos (an attacker that holds the key, or replays many
    // captured ones) come from 200 loopback addresses.
    let relay = Relay::start(to);
    let client = fx.download(&relay);
    relay.captured(20);
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let flooder = {
        let (stop, counts, psk) = (stop.clone(), counts.clone(), psk.clone());
        thread::spawn(move || {
            let atts: Vec<Attacker> = (2..202)
                .map(|i| Attacker::new(&format!("127.0.{}.{}", i / 250, 1 + i % 250)))
                .collect();
            let hellos: Vec<Vec<u8>> = (0..400)
                .map(|_| ClientHandshake::new(&psk, 1500).hello().to_vec())
                .collect();
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let a = &atts[i % atts.len()];
                if a.sock.send_to(&hellos[i % hellos.len()], to).is_ok() {
                    counts.0.fetch_add(1200, Ordering::Relaxed);
                }
                i += 1;
                // About 20 000 hellos a second (190 Mbit/s): a hundred times the key-exchange
                // budget, from a sender that leaves this 2-core host's other core to the
                // server, its client and the relay.
                if i.is_multiple_of(64) {
                    thread::sleep(Duration::from_millis(3));
                }
            }
            counts
                .1
                .store(atts.iter().map(|a| a.received()).sum(), Ordering::Relaxed);
        })
    };
    let run = client.wait(Duration::from_secs(90));
    stop.store(true, Ordering::Relaxed);
    flooder.join().unwrap();
    let (sent, got) = (
        counts.0.load(Ordering::Relaxed),
        counts.1.load(Ordering::Relaxed),
    );
    report("hello flood", sent, got, &run, fx.server.pid());
    println!(
        "adversary hello flood: the same download alone took {:.2} s",
        alone.elapsed.as_secs_f64()
    );
    fx.assert_verified(&run);
    assert!(got < sent / 10, "replies {got} B for {sent} B of hellos");
    assert!(
        run.elapsed < alone.elapsed * 3,
        "a running download slowed from {:?} to {:?} under a hello flood",
        alone.elapsed,
        run.elapsed
    );
}

#[test]
fn a_peer_that_stops_acknowledging_is_let_go_and_others_are_served() {
    let fx = fixture();
    let relay = Relay::start(fx.server_addr());
    let mut victim = fx.download(&relay);
    relay.captured(50);
    // The client falls silent: nothing of it reaches the server any more.
    relay.state.mute_client.store(true, Ordering::Relaxed);
    signal(victim.pid(), libc::SIGKILL);
    assert!(eventually(Duration::from_secs(5), || victim.try_finished()));
    thread::sleep(Duration::from_millis(1500));
    let at_mute = relay.state.down_bytes.load(Ordering::Relaxed);
    // Meanwhile another client is served at once.
    std::fs::write(fx.server.root.join("small.bin"), vec![5u8; 1 << 20]).unwrap();
    let other = cp(
        &fx.key,
        &[
            fx.server.url("small.bin"),
            fx.dst.join("small.bin").display().to_string(),
        ],
    );
    other.assert_ok();
    assert!(
        other.elapsed < Duration::from_secs(5),
        "a second client waited {:?}",
        other.elapsed
    );
    // The server stops sending to the silent peer (no acknowledgements: nothing in flight
    // is freed), and forgets it after its idle timeout.
    thread::sleep(Duration::from_secs(3));
    let later = relay.state.down_bytes.load(Ordering::Relaxed);
    println!(
        "adversary silent peer: {} B sent to it in the 3 s after its last 1.5 s; second client {:.2} s",
        later - at_mute,
        other.elapsed.as_secs_f64()
    );
    assert!(
        later - at_mute < 1 << 20,
        "the server kept sending to a silent peer: {} B",
        later - at_mute
    );
    let (hwm, _) = proc_usage(fx.server.pid());
    assert!(hwm < 400 << 20);
}

/// A client that holds the key and offers 100 000 files at once, driven from the test with
/// the protocol core over a plain UDP socket.
#[test]
fn a_peer_offering_100_000_files_is_refused_beyond_a_bound_and_others_are_served() {
    use hayate_proto::conn::{
        BlockSink, BlockSource, Config, Connection, StorageError, MAX_OPEN_INCOMING,
    };
    use hayate_proto::wire::AddrFamily;
    use hayate_proto::{Event, XferId};

    struct Ones;
    impl BlockSource for Ones {
        fn read(&mut self, _: XferId, _: u64, buf: &mut [u8]) -> Result<(), StorageError> {
            buf.fill(1);
            Ok(())
        }
    }
    impl BlockSink for Ones {
        fn write(&mut self, _: XferId, _: u64, _: &[u8]) -> Result<(), StorageError> {
            Ok(())
        }
    }

    let fx = fixture();
    let text = hayate_io::keyfile::read_key_file(&fx.key).expect("read the test key");
    let psk = Psk::parse_key_file(&text.contents).expect("parse the test key");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(2)))
        .unwrap();
    let to = fx.server_addr();
    let mut c = Connection::client(Config::default(), &psk, AddrFamily::V4, Instant::now());
    for i in 0..100_000 {
        // Into a directory that does not exist: nothing is left on the server's disk.
        c.send_file(&format!("nodir/f{i}"), 1 << 30, 0o644, 0);
    }
    let (mut offered_back, mut rejected) = (0u64, 0u64);
    let mut buf = vec![0u8; 65536];
    // The flood runs for 8 s from the handshake (which must come within 20 s).
    let mut until = Instant::now() + Duration::from_secs(20);
    let mut closed = None;
    let mut other: Option<Run> = None;
    while Instant::now() < until {
        let now = Instant::now();
        if c.poll_timeout(now).is_some_and(|t| t <= now) {
            c.handle_timeout(now);
        }
        let mut out = vec![0u8; c.max_datagram()];
        while let Some(n) = c.poll_transmit(now, &mut out, &mut Ones) {
            let _ = sock.send_to(&out[..n], to);
        }
        while let Ok((n, _)) = sock.recv_from(&mut buf) {
            offered_back += n as u64;
            c.handle_datagram(Instant::now(), &mut buf[..n], &mut Ones);
        }
        while let Some(e) = c.poll_event() {
            match e {
                Event::Rejected { .. } => rejected += 1,
                Event::Connected => until = Instant::now() + Duration::from_secs(8),
                Event::Closed { error } => closed = Some(error),
                _ => {}
            }
        }
        if other.is_none() && rejected > 0 {
            // While the flood of offers is being refused, another client downloads.
            let mut cmd = hayate();
            cmd.arg("cp")
                .arg("--key-file")
                .arg(&fx.key)
                .arg(fx.server.url("f.bin"))
                .arg(&fx.dst);
            other = Some(spawn_cmd(&mut cmd).wait(Duration::from_secs(60)));
        }
    }
    let (hwm, cpu) = proc_usage(fx.server.pid());
    let other = other.expect("the server answered some offers");
    println!(
        "adversary 100 000 offers: {rejected} refused, {offered_back} B back; other client \
         {:.2} s; server peak RSS {:.1} MB, CPU {cpu:.2} s",
        other.elapsed.as_secs_f64(),
        hwm as f64 / 1e6
    );
    fx.assert_verified(&Run {
        stdout: "{\"verified\":true}".into(),
        ..other
    });
    // Offers come through the control stream at its pace: in the time given the server
    // refuses thousands (beyond `MAX_OPEN_INCOMING` open ones it would refuse them all)
    // while allocating nothing for an offer it has not taken on.
    assert!(rejected >= 1000, "{rejected} refused");
    // The flooding client kept within the control stream's window: the server had no cause
    // to end its session.
    assert_eq!(closed, None, "the flooding session was closed");
    const _: () = assert!(MAX_OPEN_INCOMING < 100_000);
    assert!(hwm < 400 << 20, "server peak RSS {hwm} B");
    assert!(
        !fx.server.root.join("nodir").exists(),
        "refused offers left something behind"
    );
}
