//! The human report (the seeds' gen/get format) and the JSON lines of `--json`.

use crate::ctl::{HayateReport, IntervalReport, Mode, ReceiverReport, SenderReport, Side, TcpInfo};
use crate::stats::RangeReport;
use crate::units::{mb, per_sec};
use serde::Serialize;
use std::io::Write;

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Measured by this process.
    Local,
    /// Measured by the peer and sent over the control connection.
    Remote,
}

/// Where report lines go: human lines to stdout, or with `json` JSON to stdout and the human
/// lines to stderr. Intervals are kept for the plot.
pub struct Out {
    pub json: bool,
    pub mode: Mode,
    pub receiver_intervals: Vec<IntervalReport>,
    pub sender_intervals: Vec<IntervalReport>,
}

#[derive(Serialize)]
struct JsonInterval<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    origin: Origin,
    #[serde(flatten)]
    r: &'a IntervalReport,
    rate_bps: f64,
}

impl Out {
    pub fn new(mode: Mode, json: bool) -> Self {
        Out {
            json,
            mode,
            receiver_intervals: Vec::new(),
            sender_intervals: Vec::new(),
        }
    }

    pub fn human(&self, line: &str) {
        if self.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }

    fn json_line<T: Serialize>(&self, v: &T) {
        let mut o = std::io::stdout().lock();
        let _ = serde_json::to_writer(&mut o, v);
        let _ = o.write_all(b"\n");
        let _ = o.flush();
    }

    pub fn interval(&mut self, origin: Origin, r: &IntervalReport) {
        self.human(&interval_line(self.mode, r));
        if self.json {
            let dur = r.end - r.start;
            self.json_line(&JsonInterval {
                kind: "interval",
                origin,
                r,
                rate_bps: 8.0 * per_sec(r.bytes, dur),
            });
        }
        match r.side {
            Side::Receiver => self.receiver_intervals.push(r.clone()),
            Side::Sender => self.sender_intervals.push(r.clone()),
        }
    }

    pub fn summary(&self, s: &Summary) {
        for l in summary_lines(s) {
            self.human(&l);
        }
        if self.json {
            self.json_line(s);
        }
    }
}

/// `+1.000 108.139460MB / 75622 rcv ||| 108.139MB / 1.000s (865.024Mbit/s)`: sizes in
/// decimal MB, rates in bits/s, as everywhere in hayate.
pub fn interval_line(mode: Mode, r: &IntervalReport) -> String {
    if mode == Mode::Hayate {
        return hayate_interval_line(r);
    }
    let tag = match r.side {
        Side::Sender => "snd",
        Side::Receiver => "rcv",
    };
    let count = match mode {
        Mode::Tcp => format!("{} streams", r.stream_bytes.len()),
        _ => r.datagrams.to_string(),
    };
    let mut l = format!(
        "+{:.3} {:.6}MB / {} {} ||| {:.3}MB / {:.3}s ({:.3}Mbit/s)",
        r.end,
        mb(r.bytes),
        count,
        tag,
        mb(r.total_bytes),
        r.end,
        8.0 * per_sec(r.total_bytes, r.end) / 1e6,
    );
    if let Some(lost) = r.lost {
        let exp = r.datagrams + lost;
        let pct = if exp > 0 {
            100.0 * lost as f64 / exp as f64
        } else {
            0.0
        };
        l += &format!(" lost {lost} ({pct:.3}%)");
    }
    l
}

/// `+1.000 95.123456MB / 67890 snd ||| 190.247MB / 1.000s | acked 760.123Mbit/s retx 0.012%
/// rtt 0.210ms pace 800.000Mbit/s` (sender) or `... rcv ||| ... | goodput 760.987Mbit/s, 2 files
/// verified` (receiver).
fn hayate_interval_line(r: &IntervalReport) -> String {
    let h = r.hayate.clone().unwrap_or_default();
    let dur = r.end - r.start;
    let head = |tag: &str| {
        format!(
            "+{:.3} {:.6}MB / {} {} ||| {:.3}MB / {:.3}s",
            r.end,
            mb(r.bytes),
            r.datagrams,
            tag,
            mb(r.total_bytes),
            r.end
        )
    };
    match r.side {
        Side::Sender => format!(
            "{} | acked {:.3}Mbit/s retx {:.3}% rtt {:.3}ms pace {:.3}Mbit/s",
            head("snd"),
            8.0 * per_sec(h.acked_bytes, dur) / 1e6,
            h.retransmit_percent,
            h.rtt_ms,
            h.pacing_bps / 1e6
        ),
        Side::Receiver => {
            let mut l = format!(
                "{} | goodput {:.3}Mbit/s, {} file{} verified",
                head("rcv"),
                8.0 * per_sec(r.bytes, dur) / 1e6,
                h.files_verified,
                if h.files_verified == 1 { "" } else { "s" }
            );
            if h.duplicates > 0 {
                l += &format!(", {} duplicates", h.duplicates);
            }
            if h.mismatches > 0 {
                l += &format!(", {} BLOCKS DIFFER FROM THE PATTERN", h.mismatches);
            }
            l
        }
    }
}

/// `--hayate`: the headline numbers of a test.
#[derive(Debug, Clone, Serialize)]
pub struct HayateSummary {
    /// New data the receiver got, over the receiver's time (session start to last delivery).
    pub bytes_delivered: u64,
    pub goodput_bps: f64,
    /// What the sender put on the wire (data only, new and retransmitted).
    pub data_bytes_sent: u64,
    pub data_packets_sent: u64,
    pub packets_retransmitted: u64,
    pub retransmit_percent: f64,
    /// Data bytes the sender declared lost, over the data bytes it sent.
    pub data_bytes_lost: u64,
    pub loss_percent: f64,
    pub rtt_ms: f64,
    pub min_rtt_ms: f64,
    /// The sender's pacing rate at the end, bits/s.
    pub pacing_bps: f64,
    pub files_verified: u64,
    pub bytes_verified: u64,
    pub files_failed: u64,
    pub files_aborted: u64,
    pub pattern_mismatches: u64,
    /// Every file that completed was verified by BLAKE3 end to end (at least one did), and
    /// every delivered block matched the pattern.
    pub verified: bool,
    pub failures: Vec<String>,
    pub block_size: usize,
    pub mtu: u16,
}

impl HayateSummary {
    fn new(snd: &HayateReport, rcv: &HayateReport, rcv_duration_s: f64) -> Self {
        let pct = |a: u64, b: u64| {
            if b > 0 {
                100.0 * a as f64 / b as f64
            } else {
                0.0
            }
        };
        let failures: Vec<String> = rcv
            .failures
            .iter()
            .chain(snd.failures.iter())
            .cloned()
            .collect();
        let files_failed = rcv.files_failed.max(snd.files_failed);
        HayateSummary {
            bytes_delivered: rcv.delivered_bytes,
            goodput_bps: 8.0 * per_sec(rcv.delivered_bytes, rcv_duration_s),
            data_bytes_sent: snd.data_bytes_sent,
            data_packets_sent: snd.data_packets_sent,
            packets_retransmitted: snd.data_packets_retransmitted,
            retransmit_percent: pct(snd.data_packets_retransmitted, snd.data_packets_sent),
            data_bytes_lost: snd.data_bytes_lost,
            loss_percent: pct(snd.data_bytes_lost, snd.data_bytes_sent),
            rtt_ms: snd.srtt_us as f64 / 1e3,
            min_rtt_ms: snd.min_rtt_us as f64 / 1e3,
            pacing_bps: snd.pacing_bps as f64,
            files_verified: rcv.files_verified,
            bytes_verified: rcv.bytes_verified,
            files_failed,
            // A file whose verdict crossed the sender's abort was cut only on the sender's books.
            files_aborted: snd
                .files_aborted
                .saturating_sub(rcv.files_verified.saturating_sub(snd.files_verified)),
            pattern_mismatches: rcv.mismatches,
            verified: rcv.files_verified > 0 && files_failed == 0 && rcv.mismatches == 0,
            failures,
            block_size: snd.block_size,
            mtu: snd.mtu,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct StreamSummary {
    pub stream: usize,
    pub bytes: u64,
    pub duration_s: f64,
    pub goodput_bps: f64,
    /// The sending kernel's view at the end: congestion window, RTT, retransmissions.
    pub sender_tcp_info: Option<TcpInfo>,
    pub receiver_tcp_info: Option<TcpInfo>,
    pub sender_buffer: usize,
    pub receiver_buffer: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub mode: Mode,
    pub reverse: bool,
    pub size: usize,
    pub rate_bps: Option<u64>,
    pub interval_us: f64,
    pub time_s: f64,
    /// Receiver's view: bytes delivered, over its duration.
    pub bytes: u64,
    pub duration_s: f64,
    pub throughput_bps: f64,
    // UDP
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub loss_percent: f64,
    pub reordered: u64,
    pub duplicated: u64,
    pub jitter_ms: f64,
    pub ranges: Vec<RangeReport>,
    // TCP
    pub streams: Vec<StreamSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hayate: Option<HayateSummary>,
    pub sender: SenderReport,
    pub receiver: ReceiverReport,
}

impl Summary {
    pub fn new(
        mode: Mode,
        reverse: bool,
        req: &crate::ctl::TestRequest,
        snd: SenderReport,
        rcv: ReceiverReport,
    ) -> Self {
        let streams = snd
            .streams
            .iter()
            .zip(rcv.streams.iter())
            .enumerate()
            .map(|(i, (s, r))| StreamSummary {
                stream: i,
                bytes: r.bytes,
                duration_s: r.duration_s,
                goodput_bps: 8.0 * per_sec(r.bytes, r.duration_s),
                sender_tcp_info: s.info.clone(),
                receiver_tcp_info: r.info.clone(),
                sender_buffer: s.buffer,
                receiver_buffer: r.buffer,
            })
            .collect();
        let hayate = match (&snd.hayate, &rcv.hayate) {
            (Some(s), Some(r)) => Some(HayateSummary::new(s, r, rcv.duration_s)),
            _ => None,
        };
        // hayate: data packets the sender sent and the receiver got, blocks declared lost.
        let (sent, received, lost, loss_percent) = match &hayate {
            Some(h) => (
                snd.datagrams,
                rcv.datagrams,
                snd.hayate.as_ref().map_or(0, |s| s.blocks_declared_lost),
                h.loss_percent,
            ),
            None => (
                rcv.sent,
                rcv.datagrams,
                rcv.lost,
                if rcv.sent > 0 {
                    100.0 * rcv.lost as f64 / rcv.sent as f64
                } else {
                    0.0
                },
            ),
        };
        Summary {
            kind: "summary",
            mode,
            reverse,
            size: req.size,
            rate_bps: req.rate_bps,
            interval_us: req.interval_ns as f64 / 1e3,
            time_s: req.time_s,
            bytes: rcv.bytes,
            duration_s: rcv.duration_s,
            throughput_bps: 8.0 * per_sec(rcv.bytes, rcv.duration_s),
            sent,
            received,
            lost,
            loss_percent,
            reordered: rcv.reordered,
            duplicated: rcv.duplicated,
            jitter_ms: rcv.jitter_ms,
            ranges: rcv.ranges.clone(),
            streams,
            hayate,
            sender: snd,
            receiver: rcv,
        }
    }
}

fn total_line(bytes: u64, secs: f64) -> String {
    let bps = per_sec(bytes, secs);
    format!(
        "Total: {:.3}s, {:.6}MB, {:.3}Mbit/s",
        secs,
        mb(bytes),
        bps * 8.0 / 1e6,
    )
}

pub fn summary_lines(s: &Summary) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(h) = &s.hayate {
        hayate_summary_lines(s, h, &mut v);
        return v;
    }
    match s.mode {
        Mode::Tcp => {
            v.push(format!(
                "--END-- tcp, {} stream{}, {:.6}MB sent, {:.6}MB received",
                s.streams.len(),
                if s.streams.len() == 1 { "" } else { "s" },
                mb(s.sender.bytes),
                mb(s.bytes)
            ));
            v.push(total_line(s.bytes, s.duration_s));
            for st in &s.streams {
                let mut l = format!(
                    "stream {}: {:.6}MB / {:.3}s ({:.3}Mbit/s)",
                    st.stream,
                    mb(st.bytes),
                    st.duration_s,
                    st.goodput_bps / 1e6
                );
                if let Some(i) = &st.sender_tcp_info {
                    l += &format!(
                        " | cwnd {} x {}B ({:.1}kB), rtt {:.3}ms ±{:.3}, retrans {}",
                        i.cwnd_segments,
                        i.mss,
                        i.cwnd_segments as f64 * i.mss as f64 / 1e3,
                        i.rtt_us as f64 / 1e3,
                        i.rttvar_us as f64 / 1e3,
                        i.total_retrans
                    );
                }
                l += &format!(
                    " | sndbuf {:.1}kB rcvbuf {:.1}kB",
                    st.sender_buffer as f64 / 1e3,
                    st.receiver_buffer as f64 / 1e3
                );
                v.push(l);
            }
        }
        _ => {
            v.push(format!(
                "--END-- received {} / {} ({:.3}%)",
                s.received,
                s.sent,
                if s.sent > 0 {
                    100.0 * s.received as f64 / s.sent as f64
                } else {
                    0.0
                }
            ));
            v.push(total_line(s.bytes, s.duration_s));
            v.push(format!(
                "lost {} ({:.3}%), reordered {}, duplicated {}, jitter {:.3}ms",
                s.lost, s.loss_percent, s.reordered, s.duplicated, s.jitter_ms
            ));
            v.push(format!(
                "sent {} datagrams of {}B, {:.6}MB in {:.3}s ({:.3}Mbit/s offered)",
                s.sender.datagrams,
                s.size,
                mb(s.sender.bytes),
                s.sender.duration_s,
                8.0 * per_sec(s.sender.bytes, s.sender.duration_s) / 1e6
            ));
            for r in &s.ranges {
                v.push(format!(
                    "received ..{}: {} {:.3}%",
                    r.end, r.received, r.percent
                ));
            }
        }
    }
    v
}

fn hayate_summary_lines(s: &Summary, h: &HayateSummary, v: &mut Vec<String>) {
    v.push(format!(
        "--END-- hayate, {:.6}MB delivered, goodput {:.3}Mbit/s",
        mb(h.bytes_delivered),
        h.goodput_bps / 1e6
    ));
    v.push(total_line(s.bytes, s.duration_s));
    v.push(format!(
        "sent {:.6}MB in {} data packets, retransmitted {} ({:.3}%), lost {:.3}% ({} B declared lost)",
        mb(h.data_bytes_sent),
        h.data_packets_sent,
        h.packets_retransmitted,
        h.retransmit_percent,
        h.loss_percent,
        h.data_bytes_lost
    ));
    v.push(format!(
        "rtt {:.3}ms (min {:.3}ms), final pace {:.3}Mbit/s, {} B blocks (MTU {})",
        h.rtt_ms,
        h.min_rtt_ms,
        h.pacing_bps / 1e6,
        h.block_size,
        h.mtu
    ));
    let files = format!(
        "{} file{} ({:.6}MB) checked by BLAKE3 end to end, {} cut at the time limit",
        h.files_verified,
        if h.files_verified == 1 { "" } else { "s" },
        mb(h.bytes_verified),
        h.files_aborted
    );
    let blocks = if h.pattern_mismatches == 0 {
        "every delivered block matched the pattern".to_string()
    } else {
        format!(
            "{} delivered blocks differed from the pattern",
            h.pattern_mismatches
        )
    };
    if h.verified {
        v.push(format!("verified: yes, {files}; {blocks}"));
    } else if h.files_verified == 0 && h.files_failed == 0 && h.pattern_mismatches == 0 {
        v.push(format!(
            "verified: NO, no file completed in the time (try a longer --time); {blocks}"
        ));
    } else {
        v.push(format!(
            "verified: NO, {files}, {} failed; {blocks}",
            h.files_failed
        ));
    }
    for f in &h.failures {
        v.push(format!("  {f}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_in_bits_and_sizes_in_decimal_mb() {
        let r = IntervalReport {
            side: Side::Receiver,
            start: 0.0,
            end: 2.0,
            bytes: 125_000_000,
            datagrams: 1000,
            lost: None,
            total_bytes: 250_000_000,
            total_datagrams: 2000,
            stream_bytes: Vec::new(),
            hayate: None,
        };
        // 250 MB in 2 s = 1000 Mbit/s.
        assert_eq!(
            interval_line(Mode::Udp, &r),
            "+2.000 125.000000MB / 1000 rcv ||| 250.000MB / 2.000s (1000.000Mbit/s)"
        );
        assert_eq!(
            total_line(250_000_000, 2.0),
            "Total: 2.000s, 250.000000MB, 1000.000Mbit/s"
        );
    }
}
