//! The link model, free of I/O so it can be tested deterministically.
//!
//! One `Link` per direction: a virtual FIFO serializing at `rate`, a tail-drop
//! queue of `buffer` bytes in front of it, independent random loss on the wire,
//! then a fixed one-way propagation delay.

/// Why a packet was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// The virtual queue would exceed `buffer` bytes (tail drop).
    Queue,
    /// The random-loss coin said so.
    Loss,
}

/// What happens to one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Hand it on at this time (ns on the caller's clock).
    Release(u64),
    Drop(Drop),
}

#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// Bits per second; 0 means unlimited (no serialization, no queue).
    pub rate_bps: u64,
    /// One-way propagation delay in ns (RTT/2 per direction).
    pub delay_ns: u64,
    /// Tail-drop queue size in bytes (bytes waiting to be serialized).
    pub buffer_bytes: u64,
    /// Independent per-packet loss probability, 0..=1.
    pub loss: f64,
    /// Bytes added to each IP packet's length for serialization (Ethernet header).
    pub overhead_bytes: u64,
    pub seed: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LinkStats {
    pub packets: u64,
    pub bytes: u64,
    pub delivered: u64,
    pub drops_queue: u64,
    pub drops_loss: u64,
    /// Largest backlog seen, bytes.
    pub max_backlog: u64,
}

#[derive(Debug)]
pub struct Link {
    cfg: LinkConfig,
    /// Time (ns) when the last admitted packet finishes serializing.
    last_departure: u64,
    /// Loss threshold on a u64 draw (avoids float math per packet).
    loss_threshold: u64,
    rng: SplitMix64,
    pub stats: LinkStats,
}

impl Link {
    pub fn new(cfg: LinkConfig) -> Self {
        let loss = cfg.loss.clamp(0.0, 1.0);
        let loss_threshold = if loss >= 1.0 {
            u64::MAX
        } else {
            (loss * u64::MAX as f64) as u64
        };
        Link {
            rng: SplitMix64(cfg.seed),
            cfg,
            last_departure: 0,
            loss_threshold,
            stats: LinkStats::default(),
        }
    }

    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    /// Serialization time of `bytes` in ns (rounded up so rate is never exceeded).
    pub fn tx_time_ns(&self, bytes: u64) -> u64 {
        if self.cfg.rate_bps == 0 {
            return 0;
        }
        (bytes * 8 * 1_000_000_000).div_ceil(self.cfg.rate_bps)
    }

    /// Bytes still waiting to be serialized at `now` (queue occupancy).
    pub fn backlog_bytes(&self, now: u64) -> u64 {
        if self.cfg.rate_bps == 0 || self.last_departure <= now {
            return 0;
        }
        // u128: (ns × bps) overflows u64 beyond ~18 s × 1 Gbit/s of backlog.
        ((self.last_departure - now) as u128 * self.cfg.rate_bps as u128 / 8_000_000_000) as u64
    }

    /// Decide the fate of an IP packet of `ip_len` bytes arriving at `now` (ns).
    pub fn on_packet(&mut self, now: u64, ip_len: u64) -> Decision {
        let wire = ip_len + self.cfg.overhead_bytes;
        self.stats.packets += 1;
        self.stats.bytes += ip_len;
        let backlog = self.backlog_bytes(now);
        if self.cfg.rate_bps != 0 && backlog > 0 && backlog + wire > self.cfg.buffer_bytes {
            // An empty queue always takes one packet, so a tiny buffer still passes traffic.
            self.stats.drops_queue += 1;
            return Decision::Drop(Drop::Queue);
        }
        self.stats.max_backlog = self.stats.max_backlog.max(backlog + wire);
        let departure = self.last_departure.max(now) + self.tx_time_ns(wire);
        self.last_departure = departure;
        // Lost on the wire after serialization: a lost packet still used link time.
        if self.loss_threshold != 0 && self.rng.next_u64() < self.loss_threshold {
            self.stats.drops_loss += 1;
            return Decision::Drop(Drop::Loss);
        }
        self.stats.delivered += 1;
        Decision::Release(departure + self.cfg.delay_ns)
    }
}

/// Small, seeded, fast PRNG (SplitMix64); quality is ample for loss coins.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Latency histogram with 1 µs buckets up to `max_us`, plus an overflow bucket.
#[derive(Debug, Clone)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    max_ns: u64,
}

impl Histogram {
    pub fn new(max_us: usize) -> Self {
        Histogram {
            buckets: vec![0; max_us + 1],
            count: 0,
            max_ns: 0,
        }
    }

    pub fn record_ns(&mut self, ns: u64) {
        let i = ((ns / 1000) as usize).min(self.buckets.len() - 1);
        self.buckets[i] += 1;
        self.count += 1;
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn record_n(&mut self, ns: u64, n: u64) {
        let i = ((ns / 1000) as usize).min(self.buckets.len() - 1);
        self.buckets[i] += n;
        self.count += n;
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// Upper edge (µs) of the bucket holding quantile `q`; None when empty.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let target = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= target {
                return Some(i as u64 + 1);
            }
        }
        Some(self.buckets.len() as u64)
    }

    /// `late_p50_us=.. late_p99_us=.. late_max_us=..` for stats lines ("-" when empty).
    pub fn lateness_fields(&self) -> String {
        let q = |p| {
            self.quantile_us(p)
                .map_or("-".to_string(), |v| v.to_string())
        };
        format!(
            "late_p50_us={} late_p99_us={} late_max_us={}",
            q(0.5),
            q(0.99),
            self.max_ns() / 1000
        )
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.max_ns = self.max_ns.max(other.max_ns);
    }
}

/// Parse a rate like `1gbit`, `500mbit`, `200M`, `1e9` into bits per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("bit/s")
        .or_else(|| t.strip_suffix("bps"))
        .or_else(|| t.strip_suffix("bit"))
        .unwrap_or(&t);
    let (num, mult) = split_suffix(
        t,
        &[("k", 1e3), ("m", 1e6), ("g", 1e9), ("t", 1e12), ("", 1.0)],
    );
    let v: f64 = num.parse().map_err(|_| format!("bad rate {s:?}"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("bad rate {s:?}"));
    }
    Ok((v * mult).round() as u64)
}

/// Parse a duration like `100ms`, `250`, `1.5s`, `500us` into ns (plain number = ms).
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = split_suffix(
        &t,
        &[("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9), ("", 1e6)],
    );
    let v: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("bad duration {s:?}"));
    }
    Ok((v * mult).round() as u64)
}

/// Parse a loss like `1%`, `0.5%` or `0.01` into a probability.
pub fn parse_loss(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let v = if let Some(p) = t.strip_suffix('%') {
        p.trim()
            .parse::<f64>()
            .map_err(|_| format!("bad loss {s:?}"))?
            / 100.0
    } else {
        t.parse::<f64>().map_err(|_| format!("bad loss {s:?}"))?
    };
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("loss {s:?} out of range"));
    }
    Ok(v)
}

/// Parse a byte size like `12500000`, `64k`, `16M`, `1G` (binary multiples).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("ib")
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(&t);
    let (num, mult) = split_suffix(
        t,
        &[
            ("k", 1024.0),
            ("m", 1048576.0),
            ("g", 1073741824.0),
            ("", 1.0),
        ],
    );
    let v: f64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("bad size {s:?}"));
    }
    Ok((v * mult).round() as u64)
}

fn split_suffix<'a>(t: &'a str, table: &[(&str, f64)]) -> (&'a str, f64) {
    for (suf, mult) in table {
        if let Some(n) = t.strip_suffix(suf) {
            // "1e9" must not lose its exponent to a unit; only strip a suffix after a digit/dot.
            if suf.is_empty() || n.ends_with(|c: char| c.is_ascii_digit() || c == '.') {
                return (n.trim(), *mult);
            }
        }
    }
    (t, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn cfg(rate: u64, delay: u64, buffer: u64, loss: f64) -> LinkConfig {
        LinkConfig {
            rate_bps: rate,
            delay_ns: delay,
            buffer_bytes: buffer,
            loss,
            overhead_bytes: 14,
            seed: 7,
        }
    }

    #[test]
    fn single_packet_gets_serialization_plus_delay() {
        let mut l = Link::new(cfg(1_000_000_000, 50 * MS, 1 << 20, 0.0));
        // 1486 + 14 = 1500 bytes = 12 µs at 1 Gbit/s.
        assert_eq!(
            l.on_packet(1000, 1486),
            Decision::Release(1000 + 12_000 + 50 * MS)
        );
    }

    #[test]
    fn back_to_back_packets_are_spaced_at_line_rate() {
        let mut l = Link::new(cfg(1_000_000_000, 0, 1 << 20, 0.0));
        let mut last = 0;
        for i in 0..100 {
            match l.on_packet(0, 1486) {
                Decision::Release(t) => {
                    assert_eq!(t, (i + 1) * 12_000);
                    last = t;
                }
                d => panic!("unexpected {d:?}"),
            }
        }
        assert_eq!(last, 1_200_000);
    }

    #[test]
    fn long_run_rate_matches_configured_rate() {
        // Offer 2× the link for 1 s with a tiny buffer; delivered bytes ≈ rate × 1 s.
        let rate = 500_000_000;
        let mut l = Link::new(cfg(rate, 0, 64 * 1024, 0.0));
        let mut delivered_wire = 0u64;
        let mut last_release = 0;
        let gap = 1500 * 8 * 1_000_000_000 / (2 * rate); // ns between arrivals
        let mut now = 0;
        while now < 1_000_000_000 {
            if let Decision::Release(t) = l.on_packet(now, 1486) {
                delivered_wire += 1500;
                last_release = t;
            }
            now += gap;
        }
        let measured = delivered_wire as f64 * 8.0 / (last_release as f64 / 1e9);
        assert!(
            (measured / rate as f64 - 1.0).abs() < 0.001,
            "measured {measured}"
        );
        assert!(l.stats.drops_queue > 0);
    }

    #[test]
    fn tail_drop_when_buffer_full() {
        // Buffer holds 10 wire packets of 1500 bytes.
        let mut l = Link::new(cfg(1_000_000_000, 0, 15_000, 0.0));
        let mut ok = 0;
        let mut dropped = 0;
        for _ in 0..20 {
            match l.on_packet(0, 1486) {
                Decision::Release(_) => ok += 1,
                Decision::Drop(Drop::Queue) => dropped += 1,
                d => panic!("unexpected {d:?}"),
            }
        }
        assert_eq!(ok, 10);
        assert_eq!(dropped, 10);
        assert_eq!(l.stats.drops_queue, 10);
        assert_eq!(l.stats.max_backlog, 15_000);
        // After the queue drains, packets pass again.
        assert!(matches!(l.on_packet(1_000_000, 1486), Decision::Release(_)));
    }

    #[test]
    fn empty_queue_always_admits_one_packet() {
        let mut l = Link::new(cfg(1_000_000, 0, 100, 0.0));
        assert!(matches!(l.on_packet(0, 1486), Decision::Release(_)));
        assert_eq!(l.on_packet(0, 1486), Decision::Drop(Drop::Queue));
    }

    #[test]
    fn backlog_drains_linearly() {
        let mut l = Link::new(cfg(8_000_000_000, 0, 1 << 20, 0.0)); // 1 byte per ns
        l.on_packet(0, 986); // 1000 wire bytes
        assert_eq!(l.backlog_bytes(0), 1000);
        assert_eq!(l.backlog_bytes(400), 600);
        assert_eq!(l.backlog_bytes(1000), 0);
        assert_eq!(l.backlog_bytes(5000), 0);
    }

    #[test]
    fn loss_rate_is_close_to_configured_and_seeded() {
        let run = |seed| {
            let mut c = cfg(0, 0, 0, 0.01);
            c.seed = seed;
            let mut l = Link::new(c);
            for _ in 0..1_000_000 {
                l.on_packet(0, 1000);
            }
            l.stats.drops_loss
        };
        let a = run(1);
        assert_eq!(a, run(1), "same seed, same losses");
        assert_ne!(a, run(2));
        // 1 % of 1e6 = 10000, σ ≈ 99.5; allow 5σ.
        assert!((a as i64 - 10_000).abs() < 500, "losses {a}");
    }

    #[test]
    fn zero_and_full_loss() {
        let mut l = Link::new(cfg(0, 0, 0, 0.0));
        for _ in 0..10_000 {
            assert!(matches!(l.on_packet(0, 100), Decision::Release(0)));
        }
        let mut l = Link::new(cfg(0, 0, 0, 1.0));
        for _ in 0..1000 {
            assert_eq!(l.on_packet(0, 100), Decision::Drop(Drop::Loss));
        }
    }

    #[test]
    fn lost_packets_still_use_link_time() {
        let mut l = Link::new(cfg(1_000_000_000, 0, 1 << 20, 1.0));
        l.on_packet(0, 1486);
        assert_eq!(l.backlog_bytes(0), 1500);
    }

    #[test]
    fn unlimited_rate_is_pure_delay() {
        let mut l = Link::new(cfg(0, 5 * MS, 0, 0.0));
        assert_eq!(l.on_packet(10, 65_000), Decision::Release(10 + 5 * MS));
        assert_eq!(l.on_packet(10, 65_000), Decision::Release(10 + 5 * MS));
    }

    #[test]
    fn releases_are_monotonic_fifo() {
        let mut l = Link::new(cfg(100_000_000, 20 * MS, 1 << 20, 0.0));
        let mut rng = SplitMix64(3);
        let mut now = 0;
        let mut prev = 0;
        for _ in 0..10_000 {
            now += rng.next_u64() % 200_000;
            let len = 40 + rng.next_u64() % 1460;
            if let Decision::Release(t) = l.on_packet(now, len) {
                assert!(t >= prev);
                assert!(t >= now + 20 * MS);
                prev = t;
            }
        }
    }

    #[test]
    fn histogram_quantiles() {
        let mut h = Histogram::new(1000);
        assert_eq!(h.quantile_us(0.5), None);
        for us in 0..100u64 {
            h.record_ns(us * 1000 + 500);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile_us(0.5), Some(50));
        assert_eq!(h.quantile_us(0.99), Some(99));
        h.record_ns(10_000_000_000); // overflow bucket
        assert_eq!(h.quantile_us(1.0), Some(1001));
        let mut g = Histogram::new(1000);
        g.record_n(2000, 5);
        g.merge(&h);
        assert_eq!(g.count(), 106);
    }

    #[test]
    fn parses_units() {
        assert_eq!(parse_rate("1gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("500mbit"), Ok(500_000_000));
        assert_eq!(parse_rate("200M"), Ok(200_000_000));
        assert_eq!(parse_rate("1.5Gbit/s"), Ok(1_500_000_000));
        assert_eq!(parse_rate("1e9"), Ok(1_000_000_000));
        assert_eq!(parse_rate("0"), Ok(0));
        assert!(parse_rate("fast").is_err());
        assert_eq!(parse_duration_ns("100ms"), Ok(100 * MS));
        assert_eq!(parse_duration_ns("250"), Ok(250 * MS));
        assert_eq!(parse_duration_ns("1.5s"), Ok(1500 * MS));
        assert_eq!(parse_duration_ns("500us"), Ok(500_000));
        assert_eq!(parse_loss("1%"), Ok(0.01));
        assert_eq!(parse_loss("0.1%"), Ok(0.001));
        assert_eq!(parse_loss("0.03"), Ok(0.03));
        assert!(parse_loss("150%").is_err());
        assert_eq!(parse_bytes("64k"), Ok(65536));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("16MiB"), Ok(16 << 20));
        assert_eq!(parse_bytes("12500000"), Ok(12_500_000));
    }
}
