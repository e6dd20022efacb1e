use std::time::{Duration, Instant};

use hayate_io::clock::{set_timer_slack_ns, sleep_until, wait_readable_until};
use hayate_io::udp::UdpSocket;

/// Median and max lateness of `sleep_until` over `n` waits of `gap`.
fn lateness(n: usize, gap: Duration) -> (Duration, Duration) {
    let mut late: Vec<Duration> = (0..n)
        .map(|_| {
            let deadline = Instant::now() + gap;
            sleep_until(deadline);
            let now = Instant::now();
            assert!(now >= deadline, "woke early");
            now - deadline
        })
        .collect();
    late.sort();
    (late[n / 2], late[n - 1])
}

#[test]
fn sleep_until_is_precise() {
    std::thread::spawn(|| {
        set_timer_slack_ns(1).unwrap();
        let (median, max) = lateness(200, Duration::from_micros(300));
        eprintln!("sleep_until 300 µs: median late {median:?}, max {max:?}");
        // Generous bound for a shared CI VM; typical is a few µs.
        assert!(median < Duration::from_micros(100), "median {median:?}");
        let (median, _) = lateness(200, Duration::from_micros(30));
        eprintln!("sleep_until 30 µs (spin only): median late {median:?}");
        assert!(median < Duration::from_micros(50));
        // A deadline in the past returns at once.
        let t = Instant::now();
        sleep_until(t - Duration::from_millis(1));
        assert!(t.elapsed() < Duration::from_millis(1));
    })
    .join()
    .unwrap();
}

#[test]
fn wait_readable_until_times_out_on_time_and_wakes_on_data() {
    let rx = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    set_timer_slack_ns(1).unwrap();
    // The median of several: a shared VM now and then stops for a few ms (one CI run woke
    // 7.8 ms late), which says nothing about the timeout itself.
    let mut late: Vec<Duration> = (0..7)
        .map(|_| {
            let deadline = Instant::now() + Duration::from_millis(5);
            assert!(!wait_readable_until(&rx, deadline).unwrap());
            Instant::now() - deadline
        })
        .collect();
    late.sort();
    eprintln!("wait_readable_until timeout late by {late:?}");
    assert!(
        late[late.len() / 2] < Duration::from_millis(1),
        "late {late:?}"
    );

    let dest = rx.local_addr().unwrap();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        tx.send_to(dest, b"wake").unwrap();
    });
    let t = Instant::now();
    assert!(wait_readable_until(&rx, t + Duration::from_secs(5)).unwrap());
    assert!(t.elapsed() < Duration::from_secs(1));
    sender.join().unwrap();
}
