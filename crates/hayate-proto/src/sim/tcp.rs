//! TCP flows as cross traffic on the simulated forward link, ACK-clocked, with one of two
//! congestion controllers:
//!
//! - **CUBIC**: loss-based and unpaced (Linux sends so without fq), with CUBIC's window
//!   curve, its Reno-friendly floor and a 0.7 cut per loss event (RFC 9438).
//! - **BBR-like** (`sim/bbr.rs`): paced at its model's rate, its window 2 × BDP; loss only
//!   counted.
//!
//! Only a flow's window matters here, not its bytes: a lost segment is not resent as such,
//! a new one takes its place (a bulk flow has no end; a short flow, `size`, ends once that
//! many bytes are acknowledged). The receiver acknowledges each segment on its own, over a
//! reverse path that neither loses nor queues.

use std::collections::BTreeMap;

use super::bbr::{AckSample, Bbr};
use super::Rng;

/// Bytes of a full segment on the wire (what the link's rate and queue count) and of it
/// that is data (what the flow's goodput counts).
pub const WIRE_BYTES: usize = 1500;
pub const DATA_BYTES: u64 = 1448;

/// RFC 9438's constants: the curve's scale (segments/s³) and the multiplicative decrease.
const C: f64 = 0.4;
const BETA: f64 = 0.7;
const INITIAL_WINDOW: f64 = 10.0;
const MIN_RTO_US: u64 = 200_000;
const INITIAL_RTO_US: u64 = 1_000_000;

/// One bulk flow: sends from `start_us` until `stop_us`.
#[derive(Debug, Clone)]
pub struct TcpSpec {
    /// When it starts sending, µs of virtual time.
    pub start_us: u64,
    /// When it stops, µs of virtual time.
    pub stop_us: u64,
}

/// A segment sent and neither acknowledged nor given up.
#[derive(Debug, Clone, Copy)]
struct Sent {
    /// When, µs.
    at: u64,
    /// Segments delivered when it was sent, and when the last of them was acknowledged,
    /// and when that one had been sent (the delivery-rate sample's two intervals).
    delivered: u64,
    delivered_us: u64,
    first_sent_us: u64,
}

#[derive(Debug)]
pub(super) struct Tcp {
    pub spec: TcpSpec,
    started: bool,
    /// Congestion window and slow-start threshold, segments.
    cwnd: f64,
    ssthresh: f64,
    next_seq: u64,
    /// Sent and neither acknowledged nor given up, by sequence number.
    outstanding: BTreeMap<u64, Sent>,
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
    /// The BBR-like controller, if that is this flow's.
    bbr: Option<Bbr>,
    /// Segments acknowledged; when the last was, and when it had been sent.
    delivered: u64,
    delivered_us: u64,
    first_sent_us: u64,
    /// BBR: when the pacer lets the next segment go, µs.
    next_send_us: f64,
    /// A short flow's size (data bytes), and the bytes of it that reached the receiver.
    size: Option<u64>,
    rx_bytes: u64,
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
            bbr: None,
            delivered: 0,
            delivered_us: 0,
            first_sent_us: 0,
            next_send_us: 0.0,
            size: None,
            rx_bytes: 0,
            rx_trace: Vec::new(),
            loss_events: 0,
        }
    }

    /// A flow with the BBR-like controller; `rng` picks its first ProbeBw phase.
    pub fn bbr(spec: TcpSpec, rng: Rng) -> Self {
        Tcp {
            bbr: Some(Bbr::new(INITIAL_WINDOW, rng)),
            ..Tcp::new(spec)
        }
    }

    /// A short CUBIC flow of `size` data bytes, starting at `now`.
    pub fn short(now: u64, size: u64) -> Self {
        Tcp {
            size: Some(size),
            ..Tcp::new(TcpSpec {
                start_us: now,
                stop_us: u64::MAX,
            })
        }
    }

    /// A short flow delivered all its bytes (and had them acknowledged).
    pub fn done(&self) -> bool {
        self.size
            .is_some_and(|s| self.delivered >= s.div_ceil(DATA_BYTES))
    }

    /// When its timers want it next (start, the retransmission timeout, the pacer), µs.
    pub fn next_timer(&self) -> Option<u64> {
        if !self.started {
            return Some(self.spec.start_us);
        }
        let rto = self.rto_at();
        if self.bbr.is_none() || !self.window_open() {
            return rto;
        }
        let pace = self.next_send_us.ceil() as u64;
        if pace >= self.spec.stop_us {
            return rto;
        }
        Some(rto.map_or(pace, |r| r.min(pace)))
    }

    /// When the oldest segment outstanding times out.
    fn rto_at(&self) -> Option<u64> {
        // Sent in sequence order: the first outstanding segment is the oldest.
        self.outstanding
            .first_key_value()
            .map(|(_, s)| s.at + self.rto_us())
    }

    fn rto_us(&self) -> u64 {
        match self.srtt_us {
            // RFC 6298's 1 s before the first sample: 200 ms would time out every window
            // on a path of a longer RTT, before any acknowledgment could come back.
            0 => INITIAL_RTO_US,
            s => (2 * s).max(MIN_RTO_US),
        }
    }

    /// Starts it, or gives up on everything outstanding after a timeout (the tail of a
    /// window all lost): CUBIC's window restarts from one segment, BBR's model stays.
    pub fn on_timer(&mut self, now: u64) {
        if !self.started {
            self.started = now >= self.spec.start_us;
            self.delivered_us = now;
            self.first_sent_us = now;
            return;
        }
        if self.rto_at().is_some_and(|t| now >= t) {
            self.outstanding.clear();
            if self.bbr.is_some() {
                self.loss_events += 1;
                self.recovery_until = self.next_seq;
                return;
            }
            self.cut();
            self.cwnd = 1.0;
        }
    }

    fn window(&self) -> f64 {
        self.bbr.as_ref().map_or(self.cwnd, Bbr::cwnd)
    }

    /// Whether the window (and a short flow's size) lets another segment go.
    fn window_open(&self) -> bool {
        let n = self.outstanding.len() as u64;
        (n as f64) < self.window().floor().max(1.0)
            && self
                .size
                .is_none_or(|s| self.delivered + n < s.div_ceil(DATA_BYTES))
    }

    /// Segments to put on the wire now: their sequence numbers.
    pub fn poll_send(&mut self, now: u64) -> Vec<u64> {
        let mut out = Vec::new();
        if !self.started || now >= self.spec.stop_us {
            return out;
        }
        let pace = self.bbr.as_ref().and_then(Bbr::pacing_rate);
        while self.window_open() {
            if let Some(rate) = pace {
                if (now as f64) < self.next_send_us {
                    break;
                }
                // µs per segment; at most one segment's time is owed after a late wake-up.
                let gap = 1.0 / rate;
                self.next_send_us = self.next_send_us.max(now as f64 - gap) + gap;
            }
            self.outstanding.insert(
                self.next_seq,
                Sent {
                    at: now,
                    delivered: self.delivered,
                    delivered_us: self.delivered_us,
                    first_sent_us: self.first_sent_us,
                },
            );
            out.push(self.next_seq);
            self.next_seq += 1;
        }
        out
    }

    /// The receiver got a segment: the data bytes it adds to the flow's (a short flow's
    /// last segment may be partly empty, and nothing past its size counts).
    pub fn on_delivered(&mut self, now: u64) -> u64 {
        let bytes = match self.size {
            Some(s) => DATA_BYTES.min(s - self.rx_bytes),
            None => DATA_BYTES,
        };
        self.rx_bytes += bytes;
        let bucket = (now / 100_000) as usize;
        if self.rx_trace.len() <= bucket {
            self.rx_trace.resize(bucket + 1, 0);
        }
        self.rx_trace[bucket] += bytes;
        bytes
    }

    /// The acknowledgment of `seq` arrived. The link is FIFO, so everything sent before it
    /// and still outstanding was lost.
    pub fn on_ack(&mut self, now: u64, seq: u64) {
        let Some(sent) = self.outstanding.remove(&seq) else {
            return;
        };
        self.delivered += 1;
        self.delivered_us = now;
        self.first_sent_us = sent.at;
        let rtt = now.saturating_sub(sent.at).max(1);
        self.min_rtt_us = self.min_rtt_us.min(rtt);
        self.srtt_us = match self.srtt_us {
            0 => rtt,
            s => (7 * s + rtt) / 8,
        };
        let rest = self.outstanding.split_off(&seq);
        let lost = std::mem::replace(&mut self.outstanding, rest);
        let new_loss = lost.range(self.recovery_until..).next().is_some();
        if let Some(bbr) = &mut self.bbr {
            if new_loss {
                self.loss_events += 1;
                self.recovery_until = self.next_seq;
            }
            bbr.on_ack(AckSample {
                now,
                rtt_us: rtt,
                delivered: self.delivered,
                delivered_at_send: sent.delivered,
                interval_us: (now - sent.delivered_us).max(sent.at - sent.first_sent_us),
                inflight: self.outstanding.len() as u64,
                lost: lost.len() as u64,
            });
        } else if new_loss {
            self.cut();
        } else if seq >= self.recovery_until {
            self.grow(now);
        }
    }

    /// A loss event: the window falls to `BETA` of itself and a new curve begins. With
    /// fast convergence (RFC 9438 §4.7, on in Linux): a window that did not get back to the
    /// last curve's top lets go of more, its curve aiming at `(1 + BETA) / 2` of it, so a
    /// flow that has more than its share makes room for a newcomer.
    fn cut(&mut self) {
        self.loss_events += 1;
        self.w_max = if self.cwnd < self.w_max {
            self.cwnd * (1.0 + BETA) / 2.0
        } else {
            self.cwnd
        };
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
