//! Counters of a session, and the rate controller's trace.

use crate::cc::Feedback;

use super::Connection;

/// Counters for stats lines, JSON and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub packets_sent: u64,
    pub packets_received: u64,
    pub data_packets_sent: u64,
    pub data_packets_retransmitted: u64,
    pub data_bytes_sent: u64,
    pub blocks_declared_lost: u64,
    pub data_packets_received: u64,
    pub duplicate_blocks_received: u64,
    pub data_bytes_received: u64,
    pub data_bytes_acked: u64,
    pub data_bytes_lost: u64,
    pub dropped_malformed: u64,
    pub dropped_auth: u64,
    pub dropped_replay: u64,
    pub dropped_unexpected: u64,
    /// `srtt_us` and `min_rtt_us` are an initial guess until this is set by a first sample.
    pub srtt_us: u64,
    pub min_rtt_us: u64,
    /// At least one RTT sample was taken (a session refused at the handshake has none).
    pub rtt_sampled: bool,
    /// Current pacing rate, bytes/s (0 = unpaced).
    pub pacing_rate: u64,
    /// Sending time the host took away (woken late with data waiting), in bytes at the
    /// pacing rate; the pacer pays it back (see `pacer`).
    pub send_time_lost_bytes: u64,
    pub pings_sent: u64,
    /// HelloRetries followed (the server asked this client to prove its address).
    pub hello_retries: u64,
    /// New blocks dropped because the storage was not ready for them (see
    /// [`BlockSink::ready`]); the sender sends them again.
    pub blocks_refused_by_sink: u64,
}

/// One feedback as the rate controller saw it, and what it decided.
#[derive(Debug, Clone)]
pub struct CcTraceRow {
    pub feedback: Feedback,
    /// Pacing rate after it, bytes/s (0 = unpaced).
    pub rate: u64,
    pub state: &'static str,
    /// Data bytes sent so far (the real sending rate, next to the set one).
    pub sent_bytes: u64,
    /// The controller's in-flight cap after it, bytes (0 = none).
    pub cap: u64,
    /// Sending time the pacer lost so far to late wake-ups, as bytes at its rate.
    pub pacer_lost: u64,
    /// The share of a full catch-up the pacer makes (see [`Pacer::catch_up_room`]).
    pub catch_up_room: f64,
}

impl Connection {
    pub fn stats(&self) -> Stats {
        let mut s = self.stats.clone();
        s.srtt_us = self.path.rtt.srtt();
        s.min_rtt_us = self.path.rtt.min();
        s.rtt_sampled = self.path.rtt.has_sample();
        s.pacing_rate = self.path.pacer.rate().unwrap_or(0);
        s.send_time_lost_bytes = self.path.pacer.lost_bytes();
        s
    }
}
