use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use hayate_io::udp::{RecvBufs, UdpSocket, DEFAULT_RECV_BATCH};

fn lo() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// `count` datagrams: the i-th is `len(i)` bytes, each byte derived from (i, offset).
fn payload(count: usize, seg: usize, last: usize) -> Vec<u8> {
    let mut data = Vec::new();
    for i in 0..count {
        let len = if i + 1 == count { last } else { seg };
        data.extend((0..len).map(|j| (i * 31 + j * 7) as u8 ^ (i >> 8) as u8));
    }
    data
}

/// Receives until `want` datagrams arrived (or 5 s passed); returns (source, bytes) each.
fn recv_n(sock: &UdpSocket, want: usize) -> Vec<(SocketAddr, Vec<u8>)> {
    let mut bufs = RecvBufs::new(DEFAULT_RECV_BATCH);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < want && Instant::now() < deadline {
        let n = sock.recv_batch(&mut bufs).unwrap();
        if n == 0 {
            sock.wait_readable(Some(Duration::from_millis(100)))
                .unwrap();
            continue;
        }
        let before = got.len();
        got.extend(bufs.datagrams().map(|(a, d)| (a, d.to_vec())));
        assert_eq!(
            got.len() - before,
            n,
            "recv_batch count != datagrams yielded"
        );
    }
    got
}

fn check_batch(tx: &UdpSocket, rx: &UdpSocket, count: usize, seg: usize, last: usize) {
    let data = payload(count, seg, last);
    let dest = rx.local_addr().unwrap();
    let mut off = 0;
    let mut sent = 0;
    while sent < count {
        match tx.send_batch(dest, &data[off..], seg) {
            Ok(n) => {
                sent += n;
                off = (off + n * seg).min(data.len());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tx.wait_writable(Some(Duration::from_secs(1))).unwrap();
            }
            Err(e) => panic!("send_batch: {e}"),
        }
    }
    assert_eq!(sent, count);
    let got = recv_n(rx, count);
    assert_eq!(got.len(), count, "all datagrams arrive");
    let from = tx.local_addr().unwrap();
    for (i, (src, d)) in got.iter().enumerate() {
        assert_eq!(*src, from);
        let len = if i + 1 == count { last } else { seg };
        assert_eq!(d.len(), len, "datagram {i} length");
        let start = i * seg;
        assert_eq!(
            &d[..],
            &data[start..start + len],
            "datagram {i} intact, in order"
        );
    }
}

#[test]
fn hundred_datagrams_arrive_intact_and_in_order() {
    let tx = UdpSocket::bind(lo()).unwrap();
    let rx = UdpSocket::bind(lo()).unwrap();
    check_batch(&tx, &rx, 100, 1400, 1400);
}

#[test]
fn gso_batch_with_odd_last_segment_is_split_by_stride() {
    let tx = UdpSocket::bind(lo()).unwrap();
    let rx = UdpSocket::bind(lo()).unwrap();
    eprintln!(
        "gso segments {}, gro segments {}, rcvbuf {}, sndbuf {}",
        tx.max_gso_segments(),
        rx.gro_segments(),
        rx.recv_buffer_size(),
        rx.send_buffer_size()
    );
    assert!(
        tx.max_gso_segments() > 1,
        "GSO expected on Linux 6.x loopback"
    );
    // One GSO send (40 × 1400 < 64 KiB) that loopback hands to the GRO socket whole.
    check_batch(&tx, &rx, 41, 1400, 777);
    // Several GSO sends per call, and tiny segments (limited by segment count, not bytes).
    check_batch(&tx, &rx, 300, 1200, 1);
    check_batch(&tx, &rx, 200, 100, 99);
}

#[test]
fn gro_coalesces_on_loopback() {
    let tx = UdpSocket::bind(lo()).unwrap();
    let rx = UdpSocket::bind(lo()).unwrap();
    let data = payload(40, 1400, 1400);
    assert_eq!(
        tx.send_batch(rx.local_addr().unwrap(), &data, 1400)
            .unwrap(),
        40
    );
    rx.wait_readable(Some(Duration::from_secs(1))).unwrap();
    let mut bufs = RecvBufs::new(4);
    // 40 datagrams fit in 4 buffers only if the kernel delivered them coalesced.
    assert_eq!(rx.recv_batch(&mut bufs).unwrap(), 40);
    assert_eq!(bufs.datagrams().count(), 40);
}

/// A GRO super-buffer read late: its segments arrived together, long before the read, and
/// each one says so (dated at the read, the newest told an ACK its wait was none).
#[test]
fn a_late_gro_buffer_dates_every_segment_by_its_arrival() {
    let tx = UdpSocket::bind(lo()).unwrap();
    let rx = UdpSocket::bind(lo()).unwrap();
    std::thread::sleep(Duration::from_millis(50)); // receive timestamps on (see below)
    let data = payload(40, 1400, 1400);
    tx.send_batch(rx.local_addr().unwrap(), &data, 1400)
        .unwrap();
    std::thread::sleep(Duration::from_millis(60));
    rx.wait_readable(Some(Duration::from_secs(1))).unwrap();
    let mut bufs = RecvBufs::new(4);
    assert_eq!(rx.recv_batch(&mut bufs).unwrap(), 40);
    let read = Instant::now();
    let late: Vec<Duration> = bufs
        .datagrams_at()
        .map(|(_, at, _)| read.saturating_duration_since(at))
        .collect();
    assert_eq!(late.len(), 40);
    assert!(
        late.iter().all(|&w| w >= Duration::from_millis(50)),
        "waits before the read {late:?}"
    );
}

#[test]
fn sendmmsg_fallback_without_gso() {
    let tx = UdpSocket::bind(lo()).unwrap();
    let rx = UdpSocket::bind(lo()).unwrap();
    tx.disable_gso();
    assert_eq!(tx.max_gso_segments(), 1);
    check_batch(&tx, &rx, 150, 1400, 3);
}

#[test]
fn ipv6_and_single_sends() {
    let Ok(rx) = UdpSocket::bind("[::1]:0".parse().unwrap()) else {
        skip("no IPv6 loopback");
        return;
    };
    let tx = UdpSocket::bind("[::1]:0".parse().unwrap()).unwrap();
    check_batch(&tx, &rx, 50, 1400, 10);
    tx.send_to(rx.local_addr().unwrap(), b"hello").unwrap();
    let got = recv_n(&rx, 1);
    assert_eq!(got, vec![(tx.local_addr().unwrap(), b"hello".to_vec())]);
}

#[test]
fn several_sources_are_reported() {
    let rx = UdpSocket::bind(lo()).unwrap();
    let a = UdpSocket::bind(lo()).unwrap();
    let b = UdpSocket::bind(lo()).unwrap();
    let dest = rx.local_addr().unwrap();
    a.send_to(dest, b"from a").unwrap();
    b.send_to(dest, b"from b").unwrap();
    a.send_to(dest, b"a again").unwrap();
    let got = recv_n(&rx, 3);
    let aa = a.local_addr().unwrap();
    let ba = b.local_addr().unwrap();
    assert_eq!(
        got,
        vec![
            (aa, b"from a".to_vec()),
            (ba, b"from b".to_vec()),
            (aa, b"a again".to_vec())
        ]
    );
}

#[test]
fn recv_when_empty_and_wait_timeouts() {
    let rx = UdpSocket::bind(lo()).unwrap();
    let mut bufs = RecvBufs::new(8);
    assert_eq!(rx.recv_batch(&mut bufs).unwrap(), 0);
    assert_eq!(bufs.datagrams().count(), 0);
    let t = Instant::now();
    assert!(!rx.wait_readable(Some(Duration::from_millis(20))).unwrap());
    assert!(t.elapsed() >= Duration::from_millis(20));
    assert!(rx.wait_writable(Some(Duration::ZERO)).unwrap());
    let tx = UdpSocket::bind(lo()).unwrap();
    tx.send_to(rx.local_addr().unwrap(), b"x").unwrap();
    assert!(rx.wait_readable(Some(Duration::from_secs(1))).unwrap());
}

#[test]
fn bad_segment_size_is_rejected() {
    let tx = UdpSocket::bind(lo()).unwrap();
    let dest = tx.local_addr().unwrap();
    assert!(tx.send_batch(dest, b"abc", 0).is_err());
    assert!(tx.send_batch(dest, b"abc", 70_000).is_err());
    assert_eq!(tx.send_batch(dest, b"", 1400).unwrap(), 0);
}

#[test]
fn kernel_drops_are_counted() {
    let rx = UdpSocket::bind(lo()).unwrap();
    let tx = UdpSocket::bind(lo()).unwrap();
    assert_eq!(rx.kernel_drops(), 0);
    // Shrink the receive buffer so a burst overflows it.
    socket2::SockRef::from(&rx.as_fd())
        .set_recv_buffer_size(4096)
        .unwrap();
    let dest = rx.local_addr().unwrap();
    let data = payload(40, 1400, 1400);
    tx.disable_gso(); // individual skbs, so the queue overflows datagram by datagram
    for _ in 0..20 {
        let _ = tx.send_batch(dest, &data, 1400);
    }
    let mut bufs = RecvBufs::new(DEFAULT_RECV_BATCH);
    while rx.recv_batch(&mut bufs).unwrap() > 0 {}
    // The SO_RXQ_OVFL counter rides on the next datagram that gets queued.
    tx.send_to(dest, b"after").unwrap();
    assert_eq!(recv_n(&rx, 1).len(), 1);
    let drops = rx.kernel_drops();
    let proc = rx.kernel_drops_proc();
    eprintln!("kernel_drops {drops}, /proc says {proc:?}");
    assert!(drops > 0, "a 4 KiB receive buffer must have overflowed");
    assert!(drops <= 800);
    // /proc/net/udp is only a cross-check: some sandboxes do not list their sockets there.
    match proc {
        Some(p) => assert_eq!(p, drops),
        None => eprintln!("note: this machine's /proc/net/udp does not list the socket"),
    }
}

#[test]
fn dual_stack_socket_talks_plain_ipv4() {
    let Ok(server) = UdpSocket::bind("[::]:0".parse().unwrap()) else {
        skip("no IPv6");
        return;
    };
    let port = server.local_addr().unwrap().port();
    let client = UdpSocket::bind(lo()).unwrap();
    client
        .send_to(SocketAddr::from(([127, 0, 0, 1], port)), b"v4 hello")
        .unwrap();
    let got = recv_n(&server, 1);
    // Seen as plain IPv4, not ::ffff:127.0.0.1 ...
    assert_eq!(
        got,
        vec![(client.local_addr().unwrap(), b"v4 hello".to_vec())]
    );
    // ... and a plain IPv4 destination works for replies, single and batched.
    server.send_to(got[0].0, b"reply").unwrap();
    assert_eq!(server.send_batch(got[0].0, &[1u8; 3000], 1000).unwrap(), 3);
    let back = recv_n(&client, 4);
    assert_eq!(back.len(), 4);
    assert_eq!(back[0].1, b"reply");
    assert!(back[1..].iter().all(|(_, d)| d == &[1u8; 1000]));
}

/// A datagram read late still carries when it arrived: the kernel's timestamp, not the read.
#[test]
fn arrival_time_is_the_kernels_not_the_reads() {
    let rx = UdpSocket::bind(lo()).unwrap();
    let tx = UdpSocket::bind(lo()).unwrap();
    // The kernel turns receive timestamps on for the whole host from a work queue the first
    // time a socket asks, when no other socket has them on: until then it stamps datagrams
    // when they are read. Give it that moment.
    std::thread::sleep(Duration::from_millis(50));
    let sent = Instant::now();
    tx.send_to(rx.local_addr().unwrap(), b"late").unwrap();
    std::thread::sleep(Duration::from_millis(60));
    let mut bufs = RecvBufs::new(DEFAULT_RECV_BATCH);
    assert!(rx.wait_readable(Some(Duration::from_secs(5))).unwrap());
    assert_eq!(rx.recv_batch(&mut bufs).unwrap(), 1);
    let read = Instant::now();
    let (_, at, d) = bufs.datagrams_at().next().unwrap();
    assert_eq!(d, b"late");
    assert!(
        at >= sent - Duration::from_millis(5)
            && read.duration_since(at) >= Duration::from_millis(50),
        "arrival {:?} after sending, read {:?} after arrival",
        at.saturating_duration_since(sent),
        read.saturating_duration_since(at)
    );
}

/// The receive buffer's fill is what the peer's rate controller weighs a receiver's backlog
/// by: it must rise with datagrams waiting and fall back once they are read.
#[test]
fn receive_buffer_fill_follows_what_waits() {
    let tx = UdpSocket::bind(lo()).unwrap();
    let rx = UdpSocket::bind(lo()).unwrap();
    let (idle, size) = rx.receive_buffer_fill().expect("SO_MEMINFO on Linux");
    assert_eq!(idle, 0);
    assert!(size >= rx.recv_buffer_size() as u64 / 2, "size {size}");
    let data = payload(100, 1400, 1400);
    for d in data.chunks(1400) {
        tx.send_to(rx.local_addr().unwrap(), d).unwrap();
    }
    rx.wait_readable(Some(Duration::from_secs(1))).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let (waiting, _) = rx.receive_buffer_fill().unwrap();
    // Each datagram counts with its buffer overhead.
    assert!(waiting >= 100 * 1400, "{waiting} bytes waiting");
    let st = rx.receiver_state();
    assert_eq!((st.buffered, st.buffer), (waiting, size));
    assert_eq!(recv_n(&rx, 100).len(), 100);
    assert_eq!(rx.receive_buffer_fill().unwrap().0, 0);
}

/// A test that cannot run on this host: under `CI` (where `.ci/run` installed everything it
/// needs) that is a failure; elsewhere it says SKIP on stdout.
fn skip(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "cannot run under CI: {reason}"
    );
    println!("SKIP: {reason}");
}

/// Everything waiting on `sock` now (after a short settle), as payloads.
fn drain_now(sock: &UdpSocket) -> Vec<Vec<u8>> {
    std::thread::sleep(Duration::from_millis(50));
    let mut bufs = RecvBufs::new(DEFAULT_RECV_BATCH);
    let mut got = Vec::new();
    while sock.recv_batch(&mut bufs).unwrap() > 0 {
        got.extend(bufs.datagrams().map(|(_, d)| d.to_vec()));
    }
    got
}

/// A server's sockets on one port: each sealed packet reaches the socket its cid's low byte
/// names (whatever address sent it: a client that moved still reaches its session's
/// thread), hellos from one address always the same socket, and the port stays one
/// server's.
#[test]
fn a_socket_group_routes_sealed_packets_by_cid_and_keeps_its_port() {
    use hayate_proto::wire::{SEALED_CID_LOW_BYTE_AT, SEALED_KIND_BYTE};
    let group = UdpSocket::bind_group(lo(), 3).unwrap();
    assert_eq!(group.len(), 3, "this kernel takes a reuse-port program");
    let port = group[0].local_addr().unwrap();
    assert!(group.iter().all(|s| s.local_addr().unwrap() == port));

    let sealed = |low: u8| {
        let mut d = vec![0u8; 64];
        d[0] = SEALED_KIND_BYTE;
        d[1..4].copy_from_slice(&[0xa5, 0x5a, 0x11]);
        d[SEALED_CID_LOW_BYTE_AT] = low;
        d
    };
    for client in 0..3 {
        let tx = std::net::UdpSocket::bind(lo()).unwrap();
        for low in [0u8, 1, 2, 3, 4, 5, 128, 254, 255] {
            tx.send_to(&sealed(low), port).unwrap();
        }
        for (i, s) in group.iter().enumerate() {
            let got: Vec<u8> = drain_now(s)
                .iter()
                .map(|d| d[SEALED_CID_LOW_BYTE_AT])
                .collect();
            let want: Vec<u8> = [0u8, 1, 2, 3, 4, 5, 128, 254, 255]
                .into_iter()
                .filter(|b| usize::from(*b) % 3 == i)
                .collect();
            assert_eq!(got, want, "socket {i}, client {client}");
        }
        // Anything else: by address, so one client's hellos all meet one socket.
        for _ in 0..10 {
            tx.send_to(b"\x01hello", port).unwrap();
        }
        let counts: Vec<usize> = group.iter().map(|s| drain_now(s).len()).collect();
        assert_eq!(counts.iter().sum::<usize>(), 10, "{counts:?}");
        assert!(
            counts.contains(&10),
            "one client's hellos split: {counts:?}"
        );
    }
    // A second server on the port fails, alone or as a group; so does a plain socket.
    assert!(UdpSocket::bind_group(port, 2).is_err());
    assert!(UdpSocket::bind(port).is_err());
    drop(group);
    // Once the group is gone the port is free again.
    assert_eq!(UdpSocket::bind_group(port, 2).unwrap().len(), 2);
}
