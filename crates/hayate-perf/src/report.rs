//! The human report (the seeds' gen/get format) and the JSON lines of `--json`.

use crate::ctl::{IntervalReport, Mode, ReceiverReport, SenderReport, Side, TcpInfo};
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
/// lines to stderr. Receiver intervals are kept for the plot.
pub struct Out {
    pub json: bool,
    pub mode: Mode,
    pub receiver_intervals: Vec<IntervalReport>,
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
        if r.side == Side::Receiver {
            self.receiver_intervals.push(r.clone());
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

/// `+1.000 108.139460MB / 75622 rcv ||| 108.139MB / 1.000s (108.128MB/s)`
pub fn interval_line(mode: Mode, r: &IntervalReport) -> String {
    let tag = match r.side {
        Side::Sender => "snd",
        Side::Receiver => "rcv",
    };
    let count = match mode {
        Mode::Tcp => format!("{} streams", r.stream_bytes.len()),
        _ => r.datagrams.to_string(),
    };
    let mut l = format!(
        "+{:.3} {:.6}MB / {} {} ||| {:.3}MB / {:.3}s ({:.3}MB/s)",
        r.end,
        mb(r.bytes),
        count,
        tag,
        mb(r.total_bytes),
        r.end,
        per_sec(r.total_bytes, r.end) / 1e6,
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
        let sent = rcv.sent;
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
            received: rcv.datagrams,
            lost: rcv.lost,
            loss_percent: if sent > 0 {
                100.0 * rcv.lost as f64 / sent as f64
            } else {
                0.0
            },
            reordered: rcv.reordered,
            duplicated: rcv.duplicated,
            jitter_ms: rcv.jitter_ms,
            ranges: rcv.ranges.clone(),
            streams,
            sender: snd,
            receiver: rcv,
        }
    }
}

fn total_line(bytes: u64, secs: f64) -> String {
    let bps = per_sec(bytes, secs);
    format!(
        "Total: {:.3}s, {:.6}MB, {:.3}MiB/s ({:.3}Mbps {:.3}Mibps)",
        secs,
        mb(bytes),
        bps / (1024.0 * 1024.0),
        bps * 8.0 / 1e6,
        bps * 8.0 / (1024.0 * 1024.0)
    )
}

pub fn summary_lines(s: &Summary) -> Vec<String> {
    let mut v = Vec::new();
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
                    "stream {}: {:.6}MB / {:.3}s ({:.3}Mbps)",
                    st.stream,
                    mb(st.bytes),
                    st.duration_s,
                    st.goodput_bps / 1e6
                );
                if let Some(i) = &st.sender_tcp_info {
                    l += &format!(
                        " | cwnd {} x {}B ({:.1}KiB), rtt {:.3}ms ±{:.3}, retrans {}",
                        i.cwnd_segments,
                        i.mss,
                        i.cwnd_segments as f64 * i.mss as f64 / 1024.0,
                        i.rtt_us as f64 / 1e3,
                        i.rttvar_us as f64 / 1e3,
                        i.total_retrans
                    );
                }
                l += &format!(
                    " | sndbuf {:.1}KiB rcvbuf {:.1}KiB",
                    st.sender_buffer as f64 / 1024.0,
                    st.receiver_buffer as f64 / 1024.0
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
                "sent {} datagrams of {}B, {:.6}MB in {:.3}s ({:.3}Mbps offered)",
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
