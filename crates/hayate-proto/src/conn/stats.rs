//! Counters of a session, and the rate controller's trace.

use crate::cc::Feedback;

use super::Connection;

/// Counters for stats lines, JSON and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Datagrams sent, of every kind (hellos, control, data).
    pub packets_sent: u64,
    /// Datagrams taken: authentic, fresh packets of this session.
    pub packets_received: u64,
    /// Packets carrying a DATA frame, retransmissions included.
    pub data_packets_sent: u64,
    /// Of `data_packets_sent`, those resending a block declared lost.
    pub data_packets_retransmitted: u64,
    /// File bytes sent in DATA frames, retransmissions included.
    pub data_bytes_sent: u64,
    /// Of `data_bytes_sent`, those in retransmissions.
    pub data_bytes_retransmitted: u64,
    /// Blocks the receiver's loss maps showed missing (each time one was).
    pub blocks_declared_lost: u64,
    /// Of those, blocks that arrived after all (declared lost too early: the path
    /// reorders; the loss rule then allows more, see `Reordering`).
    pub blocks_lost_spuriously: u64,
    /// DATA frames received, duplicates included.
    pub data_packets_received: u64,
    /// Blocks received that were already written, or of no open transfer.
    pub duplicate_blocks_received: u64,
    /// File bytes written to the sink.
    pub data_bytes_received: u64,
    /// Of our file bytes, those the receiver's loss maps showed delivered.
    pub data_bytes_acked: u64,
    /// Of our file bytes, those declared lost (counted once per loss).
    pub data_bytes_lost: u64,
    /// Datagrams dropped because they did not parse.
    pub dropped_malformed: u64,
    /// Datagrams dropped because they did not authenticate (AEAD or MAC).
    pub dropped_auth: u64,
    /// Packets dropped as replays (their packet number already seen or too old).
    pub dropped_replay: u64,
    /// Datagrams dropped because they made no sense in the session's state.
    pub dropped_unexpected: u64,
    /// Smoothed RTT, µs. It and `min_rtt_us` are an initial guess until `rtt_sampled`.
    pub srtt_us: u64,
    /// Smallest RTT in the estimator's window, µs.
    pub min_rtt_us: u64,
    /// At least one RTT sample was taken (a session refused at the handshake has none).
    pub rtt_sampled: bool,
    /// Current pacing rate, bytes/s (0 = unpaced).
    pub pacing_rate: u64,
    /// The path MTU the handshake agreed (largest IP packet, bytes); before it, the one
    /// offered.
    pub mtu: u16,
    /// Sending time the host took away (woken late with data waiting), in bytes at the
    /// pacing rate; the pacer pays it back (see `pacer`).
    pub send_time_lost_bytes: u64,
    /// PINGs sent (keep-alive, probes, the client's first sealed packet).
    pub pings_sent: u64,
    /// Control stream chunks declared lost (sent again).
    pub ctrl_chunks_lost: u64,
    /// HelloRetries followed (the server asked this client to prove its address).
    pub hello_retries: u64,
    /// New blocks dropped because the storage was not ready for them (see
    /// [`BlockSink::ready`](super::BlockSink::ready)); the sender sends them again.
    pub blocks_refused_by_sink: u64,
}

/// One feedback as the rate controller saw it, and what it decided.
#[derive(Debug, Clone)]
pub struct CcTraceRow {
    /// What the controller was told.
    pub feedback: Feedback,
    /// Pacing rate after it, bytes/s (0 = unpaced).
    pub rate: u64,
    /// The controller's state after it (its name for it).
    pub state: &'static str,
    /// Data bytes sent so far (the real sending rate, next to the set one).
    pub sent_bytes: u64,
    /// The controller's in-flight cap after it, bytes (0 = none).
    pub cap: u64,
    /// Sending time the pacer lost so far to late wake-ups, as bytes at its rate.
    pub pacer_lost: u64,
    /// The share of a full catch-up the pacer makes (see
    /// [`Pacer::catch_up_room`](crate::pacer::Pacer::catch_up_room)).
    pub catch_up_room: f64,
    /// How late the host usually wakes the sender for a burst, µs (see
    /// [`Pacer::lateness_us`](crate::pacer::Pacer::lateness_us)).
    pub wake_late_us: u64,
}

impl CcTraceRow {
    /// The column names of [`tsv`](Self::tsv), tab-separated (the first line of a
    /// `HAYATE_CC_TRACE` file; `bench/wan` and the tests read the columns by name).
    pub const TSV_HEADER: &'static str = "t_ms\trtt_us\tmin_rtt_us\tsrtt_us\trx_bps\tdelivered\tlost_bytes\trx_drops\tin_flight\trate_bps\tstate\tsent_bytes\trx_lag_us\trx_buffered\trx_buffer\tcap\tpacer_lost\tcatch_up_room\twake_late_us";

    /// The row as one line of tab-separated values, without its newline (rates in bit/s,
    /// `-` where the feedback had no RTT or delivery-rate sample).
    pub fn tsv(&self) -> String {
        let f = &self.feedback;
        let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        format!(
            "{:.3}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:.4}\t{}",
            f.now_us as f64 / 1e3,
            opt(f.rtt_us),
            f.min_rtt_us,
            f.srtt_us,
            opt(f.rx_rate.map(|r| r * 8)),
            f.delivered,
            f.lost_bytes,
            f.rx_drops,
            f.in_flight,
            self.rate * 8,
            self.state,
            self.sent_bytes,
            f.rx_lag_us,
            f.rx_buffered,
            f.rx_buffer,
            self.cap,
            self.pacer_lost,
            self.catch_up_room,
            self.wake_late_us
        )
    }
}

impl Connection {
    /// The session's counters, with the path's current RTT and pacing figures filled in.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats.clone();
        s.srtt_us = self.path.rtt.srtt();
        s.min_rtt_us = self.path.rtt.min();
        s.rtt_sampled = self.path.rtt.has_sample();
        s.pacing_rate = self.path.pacer.rate().unwrap_or(0);
        s.mtu = self.path.mtu;
        s.send_time_lost_bytes = self.path.pacer.lost_bytes();
        s
    }
}
