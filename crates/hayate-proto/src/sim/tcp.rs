//! A TCP CUBIC bulk flow as cross traffic on the simulated forward link: loss-based,
//! ACK-clocked and unpaced (Linux sends so without fq), with CUBIC's window curve, its
//! Reno-friendly floor and a 0.7 cut per loss event (RFC 9438). Only its window matters
//! here, not its bytes: lost segments are not resent, and the receiver acknowledges each
//! segment on its own, over a reverse path that neither loses nor queues.

use std::collections::BTreeMap;

/// Bytes of a full segment on the wire (what the link's rate and queue count) and of it
/// that is data (what the flow's goodput counts).
pub const WIRE_BYTES: usize = 1500;
pub const DATA_BYTES: u64 = 1448;

/// RFC 9438's constants: the curve's scale (segments/s³) and the multiplicative decrease.
const C: f64 = 0.4;
const BETA: f64 = 0.7;
const INITIAL_WINDOW: f64 = 10.0;
const MIN_RTO_US: u64 = 200_000;

/// One bulk flow: sends from `start_us` until `stop_us`.
#[derive(Debug, Clone)]
pub struct TcpSpec {
    /// When it starts sending, µs of virtual time.
    pub start_us: u64,
    /// When it stops, µs of virtual time.
    pub stop_us: u64,
}

#[derive(Debug)]
pub(super) struct Tcp {
    pub spec: TcpSpec,
    started: bool,
    /// Congestion window and slow-start threshold, segments.
    cwnd: f64,
    ssthresh: f64,
    next_seq: u64,
    /// Sent and neither acknowledged nor given up: seq → when sent, µs.
    outstanding: BTreeMap<u64, u64>,
    /// Losses of segments sent before this one belong to the loss event already answered.
    recovery_until: u64,
    srtt_us: u64,
    min_rtt_us: u64,
    /// CUBIC: the window before the last cut, when the curve's epoch began, its time to
    /// reach `w_max` (s), and the Reno-friendly window.
    w_max: f64,
    epoch_start_us: Option<u64>,
    k: f64,
    w_est: f64,
    /// Data bytes that reached the receiver per 100 ms.
    pub rx_trace: Vec<u64>,
    pub loss_events: u64,
}

impl Tcp {
    pub fn new(spec: TcpSpec) -> Self {
        Tcp {
            spec,
            started: false,
            cwnd: INITIAL_WINDOW,
            ssthresh: f64::INFINITY,
            next_seq: 0,
            outstanding: BTreeMap::new(),
            recovery_until: 0,
            srtt_us: 0,
            min_rtt_us: u64::MAX,
            w_max: 0.0,
            epoch_start_us: None,
            k: 0.0,
            w_est: 0.0,
            rx_trace: Vec::new(),
            loss_events: 0,
        }
    }

    /// When its timers want it next (start, or the retransmission timeout), µs.
    pub fn next_timer(&self) -> Option<u64> {
        if !self.started {
            return Some(self.spec.start_us);
        }
        // Sent in sequence order: the first outstanding segment is the oldest.
        self.outstanding
            .first_key_value()
            .map(|(_, &t)| t + self.rto_us())
    }

    fn rto_us(&self) -> u64 {
        (2 * self.srtt_us).max(MIN_RTO_US)
    }

    /// Starts it, or gives up on everything outstanding after a timeout (the tail of a
    /// window all lost): the window restarts from one segment.
    pub fn on_timer(&mut self, now: u64) {
        if !self.started {
            self.started = now >= self.spec.start_us;
            return;
        }
        if self.next_timer().is_some_and(|t| now >= t) {
            self.outstanding.clear();
            self.cut();
            self.cwnd = 1.0;
        }
    }

    /// Segments to put on the wire now: their sequence numbers.
    pub fn poll_send(&mut self, now: u64) -> Vec<u64> {
        let mut out = Vec::new();
        if !self.started || now >= self.spec.stop_us {
            return out;
        }
        while (self.outstanding.len() as f64) < self.cwnd.floor().max(1.0) {
            self.outstanding.insert(self.next_seq, now);
            out.push(self.next_seq);
            self.next_seq += 1;
        }
        out
    }

    /// The receiver got segment `seq`.
    pub fn on_delivered(&mut self, now: u64) {
        let bucket = (now / 100_000) as usize;
        if self.rx_trace.len() <= bucket {
            self.rx_trace.resize(bucket + 1, 0);
        }
        self.rx_trace[bucket] += DATA_BYTES;
    }

    /// The acknowledgment of `seq` arrived. The link is FIFO, so everything sent before it
    /// and still outstanding was lost.
    pub fn on_ack(&mut self, now: u64, seq: u64) {
        let Some(sent) = self.outstanding.remove(&seq) else {
            return;
        };
        let rtt = now.saturating_sub(sent).max(1);
        self.min_rtt_us = self.min_rtt_us.min(rtt);
        self.srtt_us = match self.srtt_us {
            0 => rtt,
            s => (7 * s + rtt) / 8,
        };
        let rest = self.outstanding.split_off(&seq);
        let lost = std::mem::replace(&mut self.outstanding, rest);
        if lost.range(self.recovery_until..).next().is_some() {
            self.cut();
        } else if seq >= self.recovery_until {
            self.grow(now);
        }
    }

    /// A loss event: the window falls to `BETA` of itself and a new curve begins.
    fn cut(&mut self) {
        self.loss_events += 1;
        self.w_max = self.cwnd;
        self.cwnd = (self.cwnd * BETA).max(2.0);
        self.ssthresh = self.cwnd;
        self.epoch_start_us = None;
        self.recovery_until = self.next_seq;
    }

    fn grow(&mut self, now: u64) {
        if self.cwnd < self.ssthresh {
            self.cwnd += 1.0;
            return;
        }
        let epoch = *self.epoch_start_us.get_or_insert_with(|| {
            self.k = ((self.w_max - self.cwnd).max(0.0) / C).cbrt();
            self.w_max = self.w_max.max(self.cwnd);
            self.w_est = self.cwnd;
            now
        });
        let rtt = if self.min_rtt_us == u64::MAX {
            0
        } else {
            self.min_rtt_us
        };
        let t = (now - epoch + rtt) as f64 / 1e6;
        let target = C * (t - self.k).powi(3) + self.w_max;
        self.w_est += 3.0 * (1.0 - BETA) / (1.0 + BETA) / self.cwnd;
        if target > self.cwnd {
            self.cwnd += (target - self.cwnd).min(self.cwnd) / self.cwnd;
        } else {
            self.cwnd += 0.01 / self.cwnd;
        }
        self.cwnd = self.cwnd.max(self.w_est);
    }
}
