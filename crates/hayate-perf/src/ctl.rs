//! The TCP control connection: one JSON object per line in each direction.
//!
//! server → client: `challenge`, then `accept` or `refused`; during the test the remote side's
//! `interval` lines; the sender's `done` and the receiver's `result` close the test.

use crate::stats::RangeReport;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Mutex;
use std::time::Duration;

pub const VERSION: u32 = 1;
/// No control line is longer than this; a peer that sends more is cut off.
const MAX_LINE: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Udp,
    Tcp,
    Hayate,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Sender,
    Receiver,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestRequest {
    pub mode: Mode,
    /// Gap between datagrams (UDP); the rate the user asked for is kept for the report.
    pub interval_ns: u64,
    pub rate_bps: Option<u64>,
    pub size: usize,
    pub time_s: f64,
    pub streams: u32,
    pub reverse: bool,
    /// Client's nonce (hex) and HMAC proof (hex) over the server's challenge and the nonce.
    pub nonce: String,
    pub proof: Option<String>,
    /// Test hooks for the generator: skip sending (but count as sent) every Nth datagram, or
    /// each with probability `drop_random` from a PRNG seeded with `seed`.
    #[serde(default)]
    pub drop_every: u64,
    #[serde(default)]
    pub drop_random: f64,
    #[serde(default)]
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IntervalReport {
    pub side: Side,
    pub start: f64,
    pub end: f64,
    pub bytes: u64,
    /// Datagrams (UDP); 0 for TCP.
    pub datagrams: u64,
    /// Receiver, UDP: sequence numbers passed over in this interval but not received.
    pub lost: Option<u64>,
    pub total_bytes: u64,
    pub total_datagrams: u64,
    /// TCP: bytes per stream in this interval.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stream_bytes: Vec<u64>,
    /// hayate: what the transport saw in this interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hayate: Option<HayateInterval>,
}

/// `--hayate`, one interval. A sender's `bytes`/`datagrams` are the data it sent (new and
/// retransmitted); a receiver's are what it got: `bytes` are new data handed to the sink (the
/// goodput), `datagrams` all data packets that arrived.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HayateInterval {
    /// Sender: data bytes the receiver acknowledged in the interval (goodput, as the sender
    /// sees it one round trip later).
    pub acked_bytes: u64,
    /// Sender: data packets retransmitted in the interval, and their share of data packets.
    pub retransmitted: u64,
    pub retransmit_percent: f64,
    /// Sender: data bytes declared lost in the interval.
    pub lost_bytes: u64,
    /// Sender: smoothed RTT and pacing rate at the end of the interval.
    pub rtt_ms: f64,
    pub pacing_bps: f64,
    /// Receiver: duplicate blocks in the interval.
    pub duplicates: u64,
    /// Both: files verified by BLAKE3 so far.
    pub files_verified: u64,
    /// Receiver: delivered blocks that differed from the pattern so far.
    pub mismatches: u64,
}

/// `--hayate`, one side's totals at the end of a test.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HayateReport {
    pub data_packets_sent: u64,
    pub data_packets_retransmitted: u64,
    pub data_bytes_sent: u64,
    pub data_bytes_acked: u64,
    pub data_bytes_lost: u64,
    pub blocks_declared_lost: u64,
    pub data_packets_received: u64,
    pub duplicate_blocks_received: u64,
    /// New data handed to the sink (receiver).
    pub delivered_bytes: u64,
    /// Delivered blocks that differed from the pattern (receiver).
    pub mismatches: u64,
    pub srtt_us: u64,
    pub min_rtt_us: u64,
    /// Pacing rate at the end, bits/s.
    pub pacing_bps: u64,
    pub files_started: u64,
    pub files_verified: u64,
    pub bytes_verified: u64,
    pub files_failed: u64,
    /// Files cut by the end of the test.
    pub files_aborted: u64,
    /// First few per-file failures.
    #[serde(default)]
    pub failures: Vec<String>,
    pub block_size: usize,
    pub mtu: u16,
    /// Datagrams this side's kernel dropped (socket receive buffer full).
    pub kernel_drops: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TcpInfo {
    pub cwnd_segments: u32,
    pub mss: u32,
    pub rtt_us: u32,
    pub rttvar_us: u32,
    pub total_retrans: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamReport {
    pub bytes: u64,
    pub duration_s: f64,
    pub info: Option<TcpInfo>,
    /// Socket buffer the kernel granted (SO_SNDBUF for a sender, SO_RCVBUF for a receiver).
    pub buffer: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SenderReport {
    pub duration_s: f64,
    /// UDP: sequence numbers used (including test-hook skips, which count as sent).
    pub datagrams: u64,
    pub bytes: u64,
    /// UDP test hook: datagrams counted as sent but deliberately not sent.
    pub skipped: u64,
    pub streams: Vec<StreamReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hayate: Option<HayateReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReceiverReport {
    pub duration_s: f64,
    /// UDP: unique datagrams received with a sequence number below `sent`.
    pub datagrams: u64,
    pub bytes: u64,
    pub sent: u64,
    pub lost: u64,
    pub reordered: u64,
    pub duplicated: u64,
    pub out_of_range: u64,
    pub jitter_ms: f64,
    pub ranges: Vec<RangeReport>,
    pub streams: Vec<StreamReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hayate: Option<HayateReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Msg {
    Challenge {
        version: u32,
        challenge: String,
        keyed: bool,
    },
    Request(TestRequest),
    Accept {
        data_port: u16,
        test_id: u32,
        token: String,
    },
    Refused {
        reason: String,
    },
    Interval(IntervalReport),
    Done(SenderReport),
    Result(ReceiverReport),
}

/// A control connection: writes are serialized, reads come from a thread through a channel so
/// the data loops can poll without blocking.
pub struct Ctl {
    stream: TcpStream,
    writer: Mutex<TcpStream>,
    rx: Receiver<Result<Msg, String>>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

impl Ctl {
    pub fn new(stream: TcpStream) -> Result<Self> {
        stream.set_nodelay(true).ok();
        let peer = stream.peer_addr()?;
        let local = stream.local_addr()?;
        let reader = stream.try_clone()?;
        let writer = Mutex::new(stream.try_clone()?);
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("perf-ctl".into())
            .spawn(move || {
                let mut r = BufReader::new(reader);
                loop {
                    let mut line = String::new();
                    match (&mut r).take(MAX_LINE).read_line(&mut line) {
                        Ok(0) => break,
                        Ok(_) if !line.ends_with('\n') => {
                            let _ = tx.send(Err("control line too long or cut off".into()));
                            break;
                        }
                        Ok(_) => {
                            let m = serde_json::from_str::<Msg>(&line)
                                .map_err(|e| format!("bad control message: {e}"));
                            let bad = m.is_err();
                            if tx.send(m).is_err() || bad {
                                break;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(format!("control connection: {e}")));
                            break;
                        }
                    }
                }
            })?;
        Ok(Ctl {
            stream,
            writer,
            rx,
            peer,
            local,
        })
    }

    pub fn send(&self, m: &Msg) -> Result<()> {
        let mut line = serde_json::to_vec(m)?;
        line.push(b'\n');
        let mut w = self.writer.lock().unwrap();
        w.write_all(&line)
            .context("writing to the control connection")?;
        Ok(())
    }

    /// Next message, `None` on timeout; an error if the peer closed or sent garbage.
    pub fn recv_timeout(&self, t: Duration) -> Result<Option<Msg>> {
        match self.rx.recv_timeout(t) {
            Ok(Ok(m)) => Ok(Some(m)),
            Ok(Err(e)) => Err(anyhow!(e)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => bail!("the peer closed the control connection"),
        }
    }

    pub fn try_recv(&self) -> Result<Option<Msg>> {
        match self.rx.try_recv() {
            Ok(Ok(m)) => Ok(Some(m)),
            Ok(Err(e)) => Err(anyhow!(e)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => bail!("the peer closed the control connection"),
        }
    }

    /// Waits for a message, failing on anything but `want` (or a refusal, reported as such).
    pub fn expect<T>(&self, t: Duration, what: &str, want: impl Fn(Msg) -> Option<T>) -> Result<T> {
        let m = self
            .recv_timeout(t)?
            .ok_or_else(|| anyhow!("timed out waiting for {what}"))?;
        if let Msg::Refused { reason } = &m {
            bail!("the server refused the test: {reason}");
        }
        let dbg = format!("{m:?}");
        want(m).ok_or_else(|| {
            anyhow!(
                "expected {what}, got {}",
                dbg.chars().take(80).collect::<String>()
            )
        })
    }
}

impl Drop for Ctl {
    fn drop(&mut self) {
        // Wakes the reader thread so it ends with the connection.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msg_json_shape() {
        let m = Msg::Refused { reason: "x".into() };
        let s = serde_json::to_string(&m).unwrap();
        assert_eq!(s, r#"{"type":"refused","reason":"x"}"#);
        let back: Msg = serde_json::from_str(&s).unwrap();
        assert!(matches!(back, Msg::Refused { .. }));
        let r = TestRequest {
            mode: Mode::Udp,
            interval_ns: 1000,
            rate_bps: None,
            size: 1472,
            time_s: 1.0,
            streams: 1,
            reverse: false,
            nonce: "00".into(),
            proof: None,
            drop_every: 0,
            drop_random: 0.0,
            seed: 0,
        };
        let s = serde_json::to_string(&Msg::Request(r)).unwrap();
        assert!(s.starts_with(r#"{"type":"request","mode":"udp""#), "{s}");
        assert!(matches!(
            serde_json::from_str::<Msg>(&s).unwrap(),
            Msg::Request(_)
        ));
    }

    #[test]
    fn hayate_fields_are_optional_on_the_wire() {
        // UDP and TCP messages carry no `hayate` object, and messages without one still parse.
        let old = r#"{"type":"interval","side":"receiver","start":0.0,"end":1.0,"bytes":5,"datagrams":1,"lost":0,"total_bytes":5,"total_datagrams":1}"#;
        let Msg::Interval(r) = serde_json::from_str::<Msg>(old).unwrap() else {
            panic!("not an interval");
        };
        assert!(r.hayate.is_none());
        assert!(!serde_json::to_string(&Msg::Interval(r.clone()))
            .unwrap()
            .contains("hayate"));
        let with = IntervalReport {
            hayate: Some(HayateInterval {
                retransmitted: 3,
                rtt_ms: 0.25,
                ..Default::default()
            }),
            ..r
        };
        let back: Msg =
            serde_json::from_str(&serde_json::to_string(&Msg::Interval(with.clone())).unwrap())
                .unwrap();
        let Msg::Interval(b) = back else { panic!() };
        assert_eq!(b.hayate, with.hayate);
        let done =
            r#"{"type":"done","duration_s":1.0,"datagrams":0,"bytes":0,"skipped":0,"streams":[]}"#;
        assert!(matches!(
            serde_json::from_str::<Msg>(done).unwrap(),
            Msg::Done(SenderReport { hayate: None, .. })
        ));
    }
}
