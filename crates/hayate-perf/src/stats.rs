//! What a UDP sink learns from sequence numbers and send timestamps: unique, duplicate and
//! reordered datagrams, RFC 3550 interarrival jitter, and which sequence ranges were lost.

use serde::{Deserialize, Serialize};

/// Loss is reported per range of this many sequence numbers, as the seeds' sink did.
pub const RANGE: u64 = 100_000;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RangeReport {
    /// First sequence number of the range.
    pub start: u64,
    /// One past the last sequence number of the range.
    pub end: u64,
    pub received: u64,
    pub percent: f64,
}

#[derive(Debug)]
pub struct UdpRecvStats {
    seen: Vec<u64>,
    /// Sequence numbers at or above this are ignored (a bound on memory against garbage).
    seq_limit: u64,
    pub unique: u64,
    pub bytes: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub out_of_range: u64,
    /// Highest sequence number seen plus one (0 before the first datagram).
    pub next_expected: u64,
    last_transit_ns: Option<i128>,
    jitter_ns: f64,
}

pub enum Arrival {
    New,
    Duplicate,
    Ignored,
}

impl UdpRecvStats {
    pub fn new(seq_limit: u64) -> Self {
        UdpRecvStats {
            seen: Vec::new(),
            seq_limit,
            unique: 0,
            bytes: 0,
            duplicated: 0,
            reordered: 0,
            out_of_range: 0,
            next_expected: 0,
            last_transit_ns: None,
            jitter_ns: 0.0,
        }
    }

    /// Records one datagram: `send_ns` on the sender's clock, `recv_ns` on ours (`None`: no
    /// jitter sample). Only differences of transit times matter, so the clocks need not agree.
    pub fn record(&mut self, seq: u64, len: usize, send_ns: u64, recv_ns: Option<u64>) -> Arrival {
        if seq >= self.seq_limit {
            self.out_of_range += 1;
            return Arrival::Ignored;
        }
        let (w, bit) = ((seq / 64) as usize, 1u64 << (seq % 64));
        if w >= self.seen.len() {
            self.seen.resize((w + 1).max(self.seen.len() * 2), 0);
        }
        if self.seen[w] & bit != 0 {
            self.duplicated += 1;
            return Arrival::Duplicate;
        }
        self.seen[w] |= bit;
        self.unique += 1;
        self.bytes += len as u64;
        if seq + 1 > self.next_expected {
            self.next_expected = seq + 1;
        } else {
            // Arrived after a higher sequence number: reordered (RFC 4737's sense).
            self.reordered += 1;
        }
        if let Some(recv_ns) = recv_ns {
            let transit = recv_ns as i128 - send_ns as i128;
            if let Some(prev) = self.last_transit_ns {
                let d = (transit - prev).abs() as f64;
                self.jitter_ns += (d - self.jitter_ns) / 16.0;
            }
            self.last_transit_ns = Some(transit);
        }
        Arrival::New
    }

    pub fn jitter_ms(&self) -> f64 {
        self.jitter_ns / 1e6
    }

    fn count_bits(&self, start: u64, end: u64) -> u64 {
        let mut n = 0u64;
        let mut s = start;
        while s < end {
            let w = (s / 64) as usize;
            let Some(&word) = self.seen.get(w) else { break };
            let lo = s % 64;
            let hi = (end - (w as u64) * 64).min(64);
            let mask = if hi - lo == 64 {
                u64::MAX
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            n += (word & mask).count_ones() as u64;
            s = (w as u64 + 1) * 64;
        }
        n
    }

    /// Datagrams received with a sequence number below `sent`.
    pub fn received_below(&self, sent: u64) -> u64 {
        self.count_bits(0, sent)
    }

    /// Share received per range of [`RANGE`] sequence numbers, over the `sent` ones.
    pub fn ranges(&self, sent: u64) -> Vec<RangeReport> {
        let mut out = Vec::new();
        let mut start = 0;
        while start < sent {
            let end = (start + RANGE).min(sent);
            let received = self.count_bits(start, end);
            out.push(RangeReport {
                start,
                end,
                received,
                percent: 100.0 * received as f64 / (end - start) as f64,
            });
            start = end;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_dups_reorder_and_ranges() {
        let mut s = UdpRecvStats::new(1 << 30);
        for seq in [0u64, 1, 3, 2, 3, 5] {
            s.record(seq, 100, seq * 1000, Some(seq * 1000 + 50));
        }
        assert_eq!(s.unique, 5);
        assert_eq!(s.duplicated, 1);
        assert_eq!(s.reordered, 1); // 2 after 3
        assert_eq!(s.bytes, 500);
        assert_eq!(s.next_expected, 6);
        assert_eq!(s.received_below(6), 5);
        assert_eq!(s.received_below(3), 3);
        assert_eq!(s.jitter_ms(), 0.0); // constant transit: no jitter
    }

    #[test]
    fn ranges_over_many() {
        let mut s = UdpRecvStats::new(1 << 30);
        // Lose every 10th datagram in the first range, every 4th in the second, none after.
        let sent = 250_000u64;
        for seq in 0..sent {
            let lost = (seq < 100_000 && seq % 10 == 0)
                || (100_000..200_000).contains(&seq) && seq % 4 == 0;
            if !lost {
                s.record(seq, 10, 0, Some(0));
            }
        }
        let r = s.ranges(sent);
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].start, r[0].end, r[0].received), (0, 100_000, 90_000));
        assert_eq!(r[1].received, 75_000);
        assert!((r[1].percent - 75.0).abs() < 1e-9);
        assert_eq!(
            (r[2].start, r[2].end, r[2].received),
            (200_000, 250_000, 50_000)
        );
        assert_eq!(r[2].percent, 100.0);
        assert_eq!(s.received_below(sent), 215_000);
    }

    #[test]
    fn jitter_rfc3550() {
        let mut s = UdpRecvStats::new(1000);
        // Transit alternates 0 and 1 ms: D = 1 ms each step; J converges toward 1 ms.
        for seq in 0..200u64 {
            let extra = if seq % 2 == 0 { 0 } else { 1_000_000 };
            s.record(seq, 1, seq * 10_000_000, Some(seq * 10_000_000 + extra));
        }
        assert!((s.jitter_ms() - 1.0).abs() < 0.01, "{}", s.jitter_ms());
        // After one step J = D/16.
        let mut t = UdpRecvStats::new(1000);
        t.record(0, 1, 0, Some(0));
        t.record(5, 1, 0, None); // no stamp: no sample
        t.record(1, 1, 0, Some(1_600_000));
        assert!((t.jitter_ms() - 0.1).abs() < 1e-9);
    }

    #[test]
    fn garbage_sequence_is_bounded() {
        let mut s = UdpRecvStats::new(1000);
        assert!(matches!(s.record(u64::MAX, 1, 0, None), Arrival::Ignored));
        assert_eq!(s.out_of_range, 1);
        assert_eq!(s.unique, 0);
    }
}
