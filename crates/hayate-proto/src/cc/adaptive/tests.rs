use std::collections::VecDeque;

use super::*;
use crate::cc::RememberedPath;

fn fb(now_us: u64, rtt: u64, min: u64, rx: u64) -> Feedback {
    Feedback {
        now_us,
        rtt_us: Some(rtt),
        rtt_sent_us: now_us.saturating_sub(rtt),
        srtt_us: rtt,
        min_rtt_us: min,
        rx_rate: Some(rx),
        rx_interval_us: 5_000,
        ..Default::default()
    }
}

#[test]
fn startup_grows_then_settles_on_the_bottleneck() {
    let mut a = Adaptive::new(None, 0);
    let cap = 50_000_000u64;
    let mut now = 0;
    for _ in 0..400 {
        now += 5_000;
        // Sent at the pacing rate; a policer lets `cap` through, no queue ever builds.
        let rate = a.pacing_rate().unwrap();
        a.on_sent(now, rate * 5_000 / 1_000_000);
        a.on_feedback(&fb(now, 50_000, 50_000, rate.min(cap)));
    }
    assert_eq!(a.mode(), Mode::ProbeBw);
    let r = a.pacing_rate().unwrap() as f64;
    assert!(
        (0.8 * cap as f64..1.2 * cap as f64).contains(&r),
        "rate {r}"
    );
}

/// Startup's drain ends as soon as an RTT sample of what was sent since it began shows
/// the queue gone, as the grow phase's does, not at the end of a round (the rest of which
/// ran at three quarters of the link). A sample of what was sent before it began does not
/// end it: the search's last burst may still be on its way to the bottleneck.
#[test]
fn startup_drain_ends_when_the_queue_is_gone() {
    let cap = 50_000_000u64;
    let mut a = Adaptive::new(None, 0);
    let mut now = 0;
    while a.mode() == Mode::Startup {
        now = policed(&mut a, cap, now, 1);
        assert!(now < 5_000_000, "startup never ended");
    }
    assert_eq!(a.mode(), Mode::Drain);
    let from = now;
    now += 5_000;
    a.on_feedback(&fb(now, 80_000, 50_000, cap));
    assert_eq!(a.mode(), Mode::Drain, "left with the queue still there");
    // 50 ms path: until `from` + 50 ms every sample is of what was sent before.
    while now + 5_000 < from + 50_000 {
        now += 5_000;
        a.on_feedback(&fb(now, 50_000, 50_000, cap));
        assert_eq!(
            a.mode(),
            Mode::Drain,
            "left on a sample sent before the drain"
        );
    }
    now = from + 50_000;
    a.on_feedback(&fb(now, 50_000, 50_000, cap));
    assert_eq!(a.mode(), Mode::ProbeBw);
}

/// Sends at the pacing rate for `steps` of 5 ms through a policer that lets `cap` through
/// without a queue (50 ms path), from `now`; returns the time after.
fn policed(a: &mut Adaptive, cap: u64, mut now: u64, steps: u32) -> u64 {
    for _ in 0..steps {
        now += 5_000;
        let rate = a.pacing_rate().unwrap();
        a.on_sent(now, rate * 5_000 / 1_000_000);
        a.on_feedback(&fb(now, 50_000, 50_000, rate.min(cap)));
    }
    now
}

/// Startup holds what it has in flight from the first signs of its own queue (rising
/// through the queue target) until it goes; not at a host stall's late ACKs (far over
/// the target at once), nor over a queue that stood all last round (another flow's).
/// Never less than what the path delivers meanwhile over the base RTT.
#[test]
fn startup_holds_at_its_own_queue_only() {
    const LINK: u64 = 15_000_000;
    // Three rounds of a 50 ms path that delivers what was sent a round trip before, up
    // to LINK bytes/s (0.75 MB over the base RTT), with `standing` µs of queue, then RTT
    // samples `qs` µs over that (LINK comes through a queue), `held` bytes in flight;
    // returns the in-flight cap after each.
    let caps = |held: u64, standing: u64, qs: &[u64]| {
        let mut a = Adaptive::new(None, 0);
        let mut now = 0;
        let mut sent = VecDeque::new();
        let mut step = |a: &mut Adaptive, dt: u64, q: u64| {
            now += dt;
            let rate = a.pacing_rate().unwrap();
            a.on_sent(now, rate * dt / 1_000_000);
            sent.push_back((now, rate));
            while sent.len() > 1 && sent[1].0 + 50_000 <= now {
                sent.pop_front();
            }
            let rx = if q > 0 { LINK } else { sent[0].1.min(LINK) };
            let f = fb(now, 50_000 + standing + q, 50_000, rx);
            a.on_feedback(&Feedback {
                in_flight: held,
                ..f
            });
            a.in_flight_cap().unwrap()
        };
        for _ in 0..32 {
            step(&mut a, 5_000, 0);
        }
        assert_eq!(a.mode(), Mode::Startup);
        qs.iter()
            .map(|&q| step(&mut a, 1_000, q))
            .collect::<Vec<_>>()
    };
    const HELD: u64 = 1_000_000;
    let ours = caps(HELD, 0, &[300, 600, 900, 1_200, 100, 100]);
    assert!(ours[0] > HELD, "{ours:?}");
    assert_eq!(ours[2..4], [HELD, HELD], "{ours:?}");
    assert!(ours[5] > HELD, "held after the queue went: {ours:?}");
    let stall = caps(HELD, 0, &[20_000, 15_000, 10_000]);
    assert!(stall.iter().all(|&c| c > HELD), "{stall:?}");
    let foreign = caps(HELD, 3_000, &[300, 600, 900, 1_200]);
    assert!(foreign.iter().all(|&c| c > HELD), "{foreign:?}");
    // A flight shorter than what comes through the queue over the base RTT.
    let short = caps(HELD / 4, 0, &[300, 600, 900, 1_200, 1_500]);
    let carried = LINK * 50_000 / 1_000_000;
    assert!(short[3] < 2 * carried, "not held: {short:?}");
    assert!(
        short[3..].iter().all(|&c| c >= carried * 8 / 10),
        "held under what the path carries: {short:?}"
    );
}

/// A hold taken with nothing in flight (everything just acknowledged, or lost since) still
/// lets a few datagrams go: a cap of nothing sends nothing, and no acknowledgement would
/// come to lift it (a tunnel session stalled for good that way).
#[test]
fn a_hold_of_nothing_in_flight_still_sends() {
    let mut a = Adaptive::new(None, 0);
    let mut now = 0;
    for _ in 0..32 {
        now += 5_000;
        let rate = a.pacing_rate().unwrap();
        a.on_sent(now, rate * 5_000 / 1_000_000);
        a.on_feedback(&fb(now, 50_000, 50_000, rate));
    }
    assert_eq!(a.mode(), Mode::Startup);
    let floor = (a.p.startup_hold_min_datagrams as f64 * a.p.grow_step) as u64;
    for q in [300, 600, 900, 1_200] {
        now += 1_000;
        a.on_feedback(&Feedback {
            in_flight: 0,
            ..fb(now, 50_000 + q, 50_000, 1_000)
        });
    }
    assert!(a.hold_in_flight.is_some(), "no hold taken");
    let cap = a.in_flight_cap().unwrap();
    assert!(cap >= floor, "cap {cap} under {floor}");
}

/// A busy VM holds the sender for a round: what it sent meanwhile trickles in a round trip
/// later, behind a queue its own catch-up or the host's stall left. That is the sender's
/// shortfall, not the path's share (read as one, it cut a 1 Gbit/s flow to 350 Mbit/s).
#[test]
fn a_stalled_sender_is_not_read_as_a_share() {
    let cap = 50_000_000u64;
    let mut a = Adaptive::new(None, 0);
    let mut now = policed(&mut a, cap, 0, 400);
    assert_eq!(a.mode(), Mode::ProbeBw);
    // Deliveries at a tenth of the link for eight rounds, sent while the host
    // took the sender's time, with a queue over the grow phase's limit all along.
    for _ in 0..80 {
        now += 5_000;
        a.on_sent(now, 5_000_000 * 5_000 / 1_000_000);
        a.on_feedback(&Feedback {
            send_stall_bytes: cap * 5_000 / 1_000_000,
            ..fb(now, 62_000, 50_000, cap / 10)
        });
    }
    assert!(
        a.bottleneck() as f64 >= 0.9 * cap as f64,
        "estimate {} of {cap}",
        a.bottleneck()
    );
    // The same deliveries from a sender that kept its pace are the path's: a share (read
    // over the two rounds the queue is found in, so the second yield takes it all in).
    let mut b = Adaptive::new(None, 0);
    let mut now = policed(&mut b, cap, 0, 400);
    for _ in 0..80 {
        now += 5_000;
        b.on_sent(now, 5_000_000 * 5_000 / 1_000_000);
        b.on_feedback(&fb(now, 62_000, 50_000, cap / 10));
    }
    assert!(b.bottleneck() < cap / 2, "estimate {}", b.bottleneck());
}

/// The whole host stops for 30 ms: the sender then makes up for the time lost (sending
/// faster than its pace for a while) and the receiver's timestamps of what waited come
/// bunched (deliveries at several times the link). Neither is the path taking more.
#[test]
fn a_host_stall_does_not_raise_the_estimate() {
    // The stall's packets came in late (a queue shows, 12 ms over the 50 ms path, and the
    // flow yields, reading a share off those deliveries), or not.
    for rtt in [50_000, 62_000] {
        host_stall(rtt);
    }
}

fn host_stall(rtt: u64) {
    let cap = 50_000_000u64;
    let mut a = Adaptive::new(None, 0);
    let mut now = policed(&mut a, cap, 0, 400);
    assert_eq!(a.mode(), Mode::ProbeBw);
    let before = a.bottleneck();
    let pace = a.pacing_rate().unwrap();
    now += 30_000;
    for i in 0..12 {
        now += 5_000;
        // Twice the pace sent while catching up; the receiver reports four times the link.
        a.on_sent(now, 2 * pace * 5_000 / 1_000_000);
        let rx = if i < 3 { 4 * cap } else { cap };
        a.on_feedback(&fb(now, rtt, 50_000, rx));
    }
    if rtt > 50_000 {
        assert_eq!(a.name(), "yield");
    }
    // Without the cap on the pace: twice the estimate before.
    assert!(
        a.bottleneck() as f64 <= 1.3 * before.max(pace) as f64,
        "rtt {rtt}: estimate {} after the stall, {before} before (pace {pace})",
        a.bottleneck()
    );
    assert!(
        a.pacing_rate().unwrap() as f64 <= 1.35 * cap as f64,
        "pace {}",
        a.pacing_rate().unwrap()
    );
}

/// The receiver's host stops for 300 ms, then reads its backlog twice as fast as data
/// comes in: a backlog that melts is a receiver keeping up, no reason to slow down (read as
/// a slow receiver it cut a 1 Gbit/s flow to 126 Mbit/s on the harness). A backlog that
/// stands is one.
#[test]
fn a_receiver_catching_up_is_not_a_slow_receiver() {
    let cap = 50_000_000u64;
    for (melts, seed_lag) in [(true, 300_000u64), (false, 100_000)] {
        let mut a = Adaptive::new(None, 0);
        let mut now = policed(&mut a, cap, 0, 400);
        assert_eq!(a.name(), "probe");
        now += 300_000;
        let mut lag = seed_lag;
        for _ in 0..30 {
            now += 5_000;
            let rate = a.pacing_rate().unwrap();
            a.on_sent(now, rate * 5_000 / 1_000_000);
            a.on_feedback(&Feedback {
                rx_lag_us: lag,
                ..fb(now, 50_000, 50_000, cap)
            });
            if melts {
                lag -= 5_000;
            }
        }
        if melts {
            assert_eq!(a.name(), "probe", "a melting backlog slowed the sender");
            assert!(a.pacing_rate().unwrap() as f64 >= 0.9 * cap as f64);
        } else {
            assert_eq!(a.name(), "yield", "a standing backlog went unheeded");
        }
    }
}

/// A round's losses are the fates of what was sent a round trip earlier: a round in
/// which the sender stalled (and sent little) does not make the usual random loss reported
/// next look like a buffer overflowing.
#[test]
fn random_loss_after_a_stalled_round_is_not_overflow() {
    let mut a = Adaptive::new(None, 0);
    a.state = State::ProbeBw(Phase::Up(3));
    a.rate = 50_000_000;
    a.est.bw_rounds = vec![50_000_000];
    a.loss.random_lost = 3.0;
    a.loss.random_settled = 100.0;
    let mut now = 1_000_000;
    a.start_round(now);
    // A round the host stalled: a tenth of the usual sending.
    now += 50_000;
    a.on_sent(now, 250_000);
    a.on_feedback(&fb(now, 50_000, 50_000, 50_000_000));
    assert_eq!(a.name(), "probe");
    // A round of feedback telling of 2.5 MB sent before, `lost` of every 250 kB lost.
    let round = |a: &mut Adaptive, now: &mut u64, lost: u64| {
        for _ in 0..10 {
            *now += 5_000;
            a.on_sent(*now, 250_000);
            a.on_feedback(&Feedback {
                delivered: 250_000 - lost,
                lost_bytes: lost,
                ..fb(*now, 50_000, 50_000, 50_000_000)
            });
        }
    };
    // The round after the stall hears of 3 % lost, as usual.
    round(&mut a, &mut now, 7_500);
    assert_eq!(a.name(), "probe", "3 % loss read as overflow");
    // Four times the random loss is overflow.
    round(&mut a, &mut now, 30_000);
    assert_eq!(a.name(), "yield");
}

/// A host stall holds the ACKs and lets them go together, the first ones far late:
/// three such RTT samples at one instant are not a queue, and startup goes on. (They
/// ended a 1 Gbit/s, 250 ms search at 47 Mbit/s in the simulator, and growing from there
/// took 7 s.) A queue that stands for a while ends it.
#[test]
fn a_burst_of_late_acks_does_not_end_startup() {
    let mut a = Adaptive::new(None, 0);
    let mut now = 0;
    // Sent at the pacing rate through a policer at 80 Mbit/s; ACKs after `rtt`.
    let step = |a: &mut Adaptive, now: &mut u64, dt: u64, rtt: u64| {
        *now += dt;
        let rate = a.pacing_rate().unwrap();
        a.on_sent(*now, rate * dt / 1_000_000);
        a.on_feedback(&fb(*now, rtt, 250_000, rate.min(10_000_000)));
    };
    for _ in 0..100 {
        step(&mut a, &mut now, 5_000, 250_000);
    }
    assert_eq!(a.mode(), Mode::Startup);
    // 75 ms of nothing, then the held ACKs at once, 75 down to 50 ms late.
    now += 75_000;
    for late in [75_000, 70_000, 60_000, 50_000] {
        step(&mut a, &mut now, 0, 250_000 + late);
    }
    step(&mut a, &mut now, 5_000, 250_000);
    assert_eq!(a.mode(), Mode::Startup);
    // A queue that stays: the search is over.
    for _ in 0..100 {
        step(&mut a, &mut now, 5_000, 290_000);
    }
    assert_ne!(a.mode(), Mode::Startup);
}

/// One odd share among steady ones (a host's hiccup while the queue stood) is not shares
/// moving: the cuts after it stay shallow. A share far from the others, or shares that
/// keep falling, are.
#[test]
fn one_odd_share_is_not_shares_moving() {
    let mut a = Adaptive::new(None, 0);
    a.shares = vec![60_000_000, 60_000_000, 52_000_000, 60_000_000];
    assert_eq!(a.share_gain(60_000_000), Params::default().share_gain);
    a.shares = vec![60_000_000; 4];
    assert_eq!(a.share_gain(52_000_000), Params::default().converge_gain);
    a.shares = vec![100, 92, 85, 78];
    assert_eq!(a.share_gain(72), Params::default().converge_gain);
    a.shares = vec![50];
    assert_eq!(a.share_gain(60), Params::default().converge_gain);
    a.shares.clear();
    assert_eq!(a.share_gain(60), Params::default().share_gain);
}

/// A flow growing (a few rounds in) from an estimate of `cap` bytes/s, at the start of a
/// round; and the time.
fn growing_at(cap: u64) -> (Adaptive, u64) {
    let mut a = Adaptive::new(None, 0);
    a.state = State::ProbeBw(Phase::Up(3));
    a.rate = cap;
    a.est.bw_rounds = vec![cap];
    let now = 1_000_000;
    a.start_round(now);
    (a, now)
}

/// A queue found while growing is sized by what stood all along, not by the last
/// sample: after the sender's host held it, the ACKs that waited meanwhile read as a
/// queue that jumped, and a cut sized by that one was the big queue's (0.7 of the link).
/// A queue that is that big all along still gets the big cut.
#[test]
fn a_queue_is_sized_by_what_stood_not_by_a_late_ack() {
    let cap = 50_000_000u64;
    for (queues, big) in [([6_000, 6_000, 25_000], false), ([25_000; 3], true)] {
        let (mut a, mut now) = growing_at(cap);
        // 50 ms path: growing stops at a queue of 3.75 ms that stands 12.5 ms; a big
        // queue is over 16.7 ms. The last sample comes after 20 ms of nothing.
        for (q, dt) in queues.into_iter().zip([5_000, 5_000, 20_000]) {
            now += dt;
            a.on_sent(now, cap * dt / 1_000_000);
            a.on_feedback(&fb(now, 50_000 + q, 50_000, cap));
        }
        assert_eq!(a.name(), "yield", "{queues:?}: no queue found");
        let est = a.bottleneck() as f64 / cap as f64;
        if big {
            assert!(est < 0.75, "{queues:?}: estimate {est:.3} of the link");
        } else {
            assert!(est > 0.9, "{queues:?}: estimate {est:.3} of the link");
        }
    }
}

/// A buffer learnt short stays short through a host stall's late ACKs (single samples
/// far over it that fall back within the stall), and is taken deeper once a deeper
/// queue stands.
#[test]
fn only_a_queue_that_stood_deepens_a_short_buffer() {
    let (mut a, mut now) = growing_at(100_000_000);
    a.queue.shallow_buffer_us = 10_000;
    a.queue.shallow_since_us = now;
    let feed = |a: &mut Adaptive, now: &mut u64, q: u64, dt: u64| {
        *now += dt;
        a.on_feedback(&fb(*now, 100_000 + q, 100_000, 100_000_000));
    };
    for _ in 0..20 {
        feed(&mut a, &mut now, 2_000, 2_000);
    }
    for q in (11_000..=29_000).rev().step_by(2_000) {
        feed(&mut a, &mut now, q, 200);
    }
    for _ in 0..20 {
        feed(&mut a, &mut now, 2_000, 2_000);
    }
    assert_eq!(
        a.queue.shallow_buffer_us, 10_000,
        "a stall's spike deepened the buffer"
    );
    for _ in 0..20 {
        feed(&mut a, &mut now, 14_000, 2_000);
    }
    assert!(
        a.queue.shallow_buffer_us >= 13_000,
        "{} µs",
        a.queue.shallow_buffer_us
    );
}

/// A stall's sample (long, with little in it) that ends a round goes with the burst
/// that makes up for it into the next: split, a yield two rounds on read the burst
/// without the stall (here 1.41 times the link).
#[test]
fn a_stall_and_its_burst_count_in_one_round() {
    let cap = 50_000_000u64;
    let (mut a, mut now) = growing_at(cap);
    let feed = |a: &mut Adaptive, now: &mut u64, dt: u64, q: u64, rx: u64| {
        *now += dt;
        a.on_sent(*now, cap * dt / 1_000_000);
        let mut f = fb(*now, 50_000 + q, 50_000, rx);
        f.rx_interval_us = dt;
        a.on_feedback(&f);
    };
    // A round at the link, ended by the first feedback after a 30 ms stall.
    for _ in 0..10 {
        feed(&mut a, &mut now, 5_000, 1_000, cap);
    }
    feed(&mut a, &mut now, 30_000, 1_000, cap / 30);
    // The burst (15 ms at 3 times the link), then a round trip at the link.
    for _ in 0..10 {
        feed(&mut a, &mut now, 1_500, 1_000, 3 * cap);
    }
    for _ in 0..8 {
        feed(&mut a, &mut now, 5_000, 1_000, cap);
    }
    // Then a queue (growing stops at 3.75 ms that stands 12.5 ms).
    for _ in 0..5 {
        feed(&mut a, &mut now, 5_000, 6_000, cap);
    }
    assert_eq!(a.name(), "yield", "no queue found");
    let est = a.bottleneck() as f64 / cap as f64;
    assert!(est < 1.05, "estimate {est:.3} of the link");
}

/// A share read at a sliver of the estimate (a receiver that fell behind, on the
/// harness: 5-7 % of the link) cuts it by half at most; a path that really got that
/// slow shows its queue again, and the next drain halves again.
#[test]
fn one_drain_cuts_the_estimate_by_half_at_most() {
    let cap = 50_000_000u64;
    let (mut a, mut now) = growing_at(cap);
    // A queue that stands (6 ms on a 50 ms path) while a twentieth of the link arrives.
    for _ in 0..6 {
        now += 5_000;
        a.on_sent(now, cap * 5_000 / 1_000_000);
        a.on_feedback(&fb(now, 56_000, 50_000, cap / 20));
    }
    assert_eq!(a.name(), "yield", "no queue found");
    let est = a.bottleneck() as f64 / cap as f64;
    assert!((0.45..0.6).contains(&est), "estimate {est:.3} of the link");
}

#[test]
fn cap_and_floor_hold() {
    let mut a = Adaptive::new(Some(1_000_000), 500_000);
    a.on_feedback(&fb(100_000, 10_000, 10_000, 100_000_000));
    assert_eq!(a.pacing_rate(), Some(1_000_000));
    let mut b = Adaptive::new(None, 2_000_000);
    b.on_feedback(&fb(100_000, 10_000, 10_000, 1_000));
    assert_eq!(b.pacing_rate(), Some(2_000_000));
}

#[test]
fn receiver_drops_cut_the_estimate() {
    let mut a = Adaptive::new(None, 0);
    a.on_feedback(&fb(100_000, 10_000, 10_000, 80_000_000));
    a.on_feedback(&Feedback {
        rx_drops: 100,
        ..fb(200_000, 10_000, 10_000, 10_000_000)
    });
    // At most the +15 % probe above what the receiver took, far below the 80 MB/s seen.
    assert!(
        a.pacing_rate().unwrap() <= 11_500_000,
        "{:?}",
        a.pacing_rate()
    );
}

/// A search is not ended by one random loss among a round's first datagrams (read as a
/// 7 % overshoot, it stranded a newcomer at 30 Mbit/s), but is by a round's worth.
#[test]
fn startup_loss_counts_over_enough_datagrams() {
    let mut a = Adaptive::new(None, 0);
    a.loss.loss_ewma = 0.01;
    a.loss.round_lost = 1_436;
    a.loss.round_delivered = 13 * 1_436;
    assert!(a.startup_still_growing());
    a.loss.round_lost = 7 * 1_436;
    a.loss.round_delivered = 93 * 1_436;
    assert!(!a.startup_still_growing());
}

/// An application slower than the path (an ssh handshake through a tunnel: a few hundred
/// bytes per round trip) leaves startup's pace where it was; its samples are a floor under
/// the path's rate, not a measure of it. A sample as slow that is not application-limited
/// (the sender had data and was paced) still counts.
#[test]
fn application_limited_samples_do_not_lower_the_pace() {
    let run = |app_limited: bool| {
        let mut a = Adaptive::new(None, 0);
        let initial = a.pacing_rate().unwrap();
        let mut now = 0;
        for _ in 0..200 {
            now += 5_000;
            a.on_sent(now, 600);
            // 600 bytes in 5 ms: 120 kB/s, the rest of the pace unused.
            let mut f = fb(now, 10_000, 10_000, 120_000);
            if app_limited {
                f.send_idle_bytes = initial * 5_000 / 1_000_000;
                f.send_app_idle_bytes = f.send_idle_bytes;
            }
            a.on_feedback(&f);
        }
        (initial, a.pacing_rate().unwrap(), a.mode())
    };
    let (initial, rate, mode) = run(true);
    assert_eq!(
        mode,
        Mode::Startup,
        "an application-limited round is no plateau"
    );
    assert!(
        rate >= initial,
        "pace {rate} fell under the initial {initial}"
    );
    let (initial, rate, _) = run(false);
    assert!(
        rate < initial / 4,
        "a slow path's samples were ignored: {rate}"
    );
}

/// What a session measured is worth remembering once the rate was found (rounds past
/// Startup), and not when a rate cap or an application slower than the path held it.
#[test]
fn a_measurement_is_remembered_only_when_it_found_the_path() {
    let cap = 50_000_000u64;
    let mut a = Adaptive::new(None, 0);
    assert_eq!(a.measured(), None);
    let now = policed(&mut a, cap, 0, 400);
    let m = a.measured().expect("found the rate");
    assert!((0.8 * cap as f64..1.2 * cap as f64).contains(&(m.rate as f64)));
    assert_eq!(m.min_rtt_us, 50_000);
    // Capped under the path: it measured the cap.
    let mut capped = Adaptive::new(Some(cap / 2), 0);
    policed(&mut capped, cap, 0, 400);
    assert_eq!(capped.measured(), None);
    // An application that left the sender idle half the time.
    let mut idle = a.clone();
    let mut t = now;
    for _ in 0..100 {
        t += 5_000;
        let rate = idle.pacing_rate().unwrap();
        idle.on_sent(t, rate * 5_000 / 1_000_000);
        idle.on_feedback(&Feedback {
            delivered: 100_000,
            send_app_idle_bytes: 100_000,
            ..fb(t, 50_000, 50_000, cap / 2)
        });
    }
    assert_eq!(idle.measured(), None);
}

/// A path an earlier session measured a second ago: 100 MB/s over 50 ms.
const SAVED: RememberedPath = RememberedPath {
    rate: 100_000_000,
    min_rtt_us: 50_000,
    age_us: 1_000_000,
};

/// A controller given `path` as remembered, as a session starts.
fn remembering(path: RememberedPath) -> Adaptive {
    let mut a = Adaptive::new(None, 0);
    a.remember(path);
    a
}

/// Careful resume in the controller alone: the jump waits for the first RTT sample, paces
/// at half the remembered rate, and a queue standing during its validation retreats to what
/// it got delivered.
#[test]
fn a_jump_waits_for_the_path_and_retreats_on_a_queue() {
    let saved = SAVED;
    let mut a = remembering(saved);
    assert_eq!(a.resume_phase(), ResumePhase::Reconnaissance);
    let start = a.pacing_rate().unwrap();
    assert!(start < saved.rate / 2);
    // The first RTT sample: comparable, so the jump is on.
    a.on_feedback(&fb(50_000, 50_000, 50_000, 1_000_000));
    assert_eq!(a.resume_phase(), ResumePhase::Unvalidated);
    assert_eq!(a.pacing_rate(), Some(saved.rate / 2));
    assert_eq!(a.name(), "resume");
    // A round trip later the jump's packets come back behind a growing queue: the path
    // carries 20 MB/s, not 50.
    let mut now = 50_000;
    for i in 0..40 {
        now += 2_000;
        let q = i * 1_000;
        a.on_feedback(&Feedback {
            delivered: 40_000,
            ..fb(now, 50_000 + q, 50_000, 20_000_000)
        });
        if a.resume_phase() == ResumePhase::Retreated {
            break;
        }
    }
    assert_eq!(a.resume_phase(), ResumePhase::Retreated, "at {now} µs");
    assert_eq!(a.mode(), Mode::Drain);
    let b = a.bottleneck();
    assert!((15_000_000..=25_000_000).contains(&b), "estimate {b}");
    // An RTT that is not comparable: ignored.
    let mut other = remembering(RememberedPath {
        min_rtt_us: 4_000,
        ..saved
    });
    other.on_feedback(&fb(50_000, 50_000, 50_000, 1_000_000));
    assert_eq!(other.resume_phase(), ResumePhase::Ignored);
    assert!(other.pacing_rate().unwrap() <= start);
}

/// The handshake's round trip is the first RTT sample careful resume waits for: comparable
/// with the remembered one, the jump is on before any data feedback (so it paces the first
/// data packet); not comparable, the memory is ignored and Startup goes on as it would.
#[test]
fn the_handshakes_round_trip_confirms_the_path_before_any_data() {
    let saved = SAVED;
    let mut a = remembering(saved);
    a.on_handshake_rtt(52_000, 52_000);
    assert_eq!(a.resume_phase(), ResumePhase::Unvalidated);
    // Half the remembered rate, over the (slightly longer) RTT now.
    let jump = a.pacing_rate().unwrap();
    assert!(
        (saved.rate / 2 * 50 / 52..=saved.rate / 2).contains(&jump),
        "jump {jump}"
    );
    // The first data feedback takes the jump on to its validation, not to a second look.
    a.on_feedback(&fb(110_000, 52_000, 52_000, 1_000_000));
    assert_ne!(a.resume_phase(), ResumePhase::Reconnaissance);
    // An RTT ten times over the remembered one: another path.
    let mut other = remembering(saved);
    let start = other.pacing_rate().unwrap();
    other.on_handshake_rtt(600_000, 600_000);
    assert_eq!(other.resume_phase(), ResumePhase::Ignored);
    assert_eq!(other.pacing_rate(), Some(start));
    // Without a memory the handshake's round trip changes nothing.
    let mut plain = Adaptive::new(None, 0);
    plain.on_handshake_rtt(50_000, 50_000);
    assert_eq!(plain.resume_phase(), ResumePhase::Off);
    assert_eq!(plain.pacing_rate(), Some(start));
}

/// A comparable remembered path lends its minimum RTT as the floor the contention detector
/// measures queues from, for `Params::resume_base_us`, whether or not the jump is made;
/// then the path's own minimum rules again. Getting delivered what the path carried then
/// drops it sooner. An RTT that is not comparable lends nothing.
#[test]
fn a_remembered_paths_minimum_rtt_is_the_floor_for_a_while() {
    let saved = SAVED;
    // A slow remembered rate: no jump (Startup is faster already), the floor all the same.
    for rate in [saved.rate, 6_000_000] {
        let mut a = remembering(RememberedPath { rate, ..saved });
        // Joining behind another flow's 30 ms standing queue: the path's own minimum is 80 ms.
        a.on_handshake_rtt(80_000, 80_000);
        a.on_feedback(&fb(160_000, 80_000, 80_000, 1_000_000));
        assert_eq!(a.floor_offset_us(160_000), 30_000, "remembered rate {rate}");
        let until = 80_000 + a.p.resume_base_us;
        assert_eq!(a.floor_offset_us(until - 1), 30_000);
        assert_eq!(a.floor_offset_us(until), 0, "the memory aged out");
    }
    // Delivered what the path carried then: the path is ours alone, and the floor a route
    // that got longer since (80 ms now, 50 then). It goes at once.
    let mut a = remembering(saved);
    a.on_handshake_rtt(80_000, 80_000);
    let mut now = 80_000;
    while a.floor_offset_us(now) > 0 && now < 3_000_000 {
        now += 5_000;
        let rate = a.pacing_rate().unwrap();
        a.on_sent(now, rate * 5_000 / 1_000_000);
        a.on_feedback(&Feedback {
            delivered: saved.rate * 5_000 / 1_000_000,
            ..fb(now, 80_000, 80_000, saved.rate)
        });
    }
    assert!(now < 1_000_000, "still the remembered floor at {now} µs");
    // Its own minimum under the memory's: no offset.
    let mut a = remembering(saved);
    a.on_feedback(&fb(50_000, 45_000, 45_000, 1_000_000));
    assert_eq!(a.floor_offset_us(50_000), 0);
    // Not comparable: ten times the RTT is another path.
    let mut other = remembering(saved);
    other.on_feedback(&fb(600_000, 600_000, 600_000, 1_000_000));
    assert_eq!(other.floor_offset_us(600_000), 0);
}
