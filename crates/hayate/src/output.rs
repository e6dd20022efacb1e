//! What `hayate cp` shows: a progress bar on a terminal, periodic stats lines, a summary,
//! or exactly one JSON object on stdout.

use std::io::IsTerminal;
use std::time::Duration;

use hayate_io::driver::client::{Kind, Progress, Report, Ui};
use hayate_proto::Stats;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::units::{fmt_bits, fmt_bytes};

pub struct Output {
    quiet: bool,
    json: bool,
    interval: Option<Duration>,
    bar: Option<ProgressBar>,
    last_line: Duration,
    last_bytes: u64,
    /// The counters at the last line: each line shows what changed since.
    last: Stats,
}

impl Output {
    pub fn new(quiet: bool, json: bool, interval: Option<f64>) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            b
        });
        Output {
            quiet,
            json,
            interval: interval.filter(|s| *s > 0.0).map(Duration::from_secs_f64),
            bar,
            last_line: Duration::ZERO,
            last_bytes: 0,
            last: Stats::default(),
        }
    }

    /// One stats line for the time since the last one. What this side sends (an upload)
    /// has retransmissions, loss and a pace; what it only receives (a download) has the
    /// duplicates it got, and the pace is the far side's, not shown.
    fn interval_line(&mut self, p: &Progress<'_>) -> String {
        let dt = (p.elapsed - self.last_line).as_secs_f64();
        let (s, l) = (p.stats, &self.last);
        let sent = s.data_packets_sent - l.data_packets_sent;
        let retx = s.data_packets_retransmitted - l.data_packets_retransmitted;
        let lost = s.blocks_declared_lost - l.blocks_declared_lost;
        let recv = s.data_packets_received - l.data_packets_received;
        let dup = s.duplicate_blocks_received - l.duplicate_blocks_received;
        let pct = |a: u64, b: u64| {
            if b == 0 {
                0.0
            } else {
                100.0 * a as f64 / b as f64
            }
        };
        let rate = (p.bytes_done.saturating_sub(self.last_bytes)) as f64 / dt;
        let head = format!(
            "{:7.2}s {:>13} {:>10} done",
            p.elapsed.as_secs_f64(),
            fmt_bits(rate),
            fmt_bytes(p.bytes_done)
        );
        let rtt = s.srtt_us as f64 / 1000.0;
        let line = if sent == 0 && recv > 0 {
            format!("{head}  dup {:5.2}%  rtt {rtt:7.2} ms", pct(dup, recv))
        } else {
            let pace = if s.pacing_rate == 0 {
                "max".to_string()
            } else {
                fmt_bits(s.pacing_rate as f64)
            };
            format!(
                "{head}  retx {:5.2}%  loss {:5.2}%  rtt {rtt:7.2} ms  pace {pace}",
                pct(retx, sent),
                pct(lost, sent),
            )
        };
        self.last_line = p.elapsed;
        self.last_bytes = p.bytes_done;
        self.last = s.clone();
        line
    }

    /// A notice on its own line (above the bar, if there is one); silent with -q.
    pub fn note_line(&mut self, msg: &str) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(b) => b.println(format!("hayate: {msg}")),
            None => eprintln!("hayate: {msg}"),
        }
    }

    pub fn progress(&mut self, p: &Progress<'_>) {
        if let Some(b) = &self.bar {
            b.set_length(p.bytes_total);
            b.set_position(p.bytes_done.min(p.bytes_total));
            if p.files_total > 1 {
                b.set_message(format!("{}/{} files", p.files_done, p.files_total));
            }
        }
        let Some(iv) = self.interval else { return };
        if p.elapsed < self.last_line + iv {
            return;
        }
        let line = self.interval_line(p);
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    pub fn finish(&mut self, r: &Report) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        for f in &r.files {
            if let Some(e) = &f.error {
                // A failure of the destination itself (not a directory, none there) has no
                // source to name: the destination is what is wrong.
                let name = match f.source() {
                    s if s.is_empty() => f.remote.clone(),
                    s => s,
                };
                eprintln!("hayate: {name}: {e}");
            }
        }
        if let Some(e) = &r.error {
            eprintln!("hayate: {e}");
        }
        let bytes = r.bytes_verified();
        let goodput = if r.seconds > 0.0 {
            bytes as f64 * 8.0 / r.seconds
        } else {
            0.0
        };
        let s = &r.stats;
        let loss_ratio = if s.data_packets_sent == 0 {
            0.0
        } else {
            s.blocks_declared_lost as f64 / s.data_packets_sent as f64
        };
        let files_n = r.file_count();
        let skipped = r.files.iter().filter(|f| f.skipped.is_some()).count();
        let resumed = r.resumed_bytes();
        if self.json {
            let entry = |f: &hayate_io::driver::client::FileResult| {
                serde_json::json!({
                    "kind": f.kind,
                    "path": f.source(),
                    "dest": if f.upload { f.remote.clone() } else { f.local.display().to_string() },
                    "direction": if f.upload { "upload" } else { "download" },
                    "bytes": f.bytes,
                    "blake3": f.blake3,
                    "verified": f.verified,
                    "skipped": f.skipped,
                    "resumed_bytes": f.resumed_bytes,
                    "error": f.error,
                })
            };
            let files: Vec<_> = r
                .files
                .iter()
                .filter(|f| f.kind == Kind::File)
                .map(entry)
                .collect();
            let others: Vec<_> = r
                .files
                .iter()
                .filter(|f| f.kind != Kind::File)
                .map(entry)
                .collect();
            let mut obj = serde_json::json!({
                "bytes": bytes,
                "file_count": files_n,
                "skipped": skipped,
                "resumed_bytes": resumed,
                "data_bytes_sent": s.data_bytes_sent,
                "transport": if r.via_stream { "ssh" } else { "udp" },
                "seconds": r.seconds,
                "goodput_bps": goodput,
                "packets_sent": s.packets_sent,
                "packets_received": s.packets_received,
                "data_packets_sent": s.data_packets_sent,
                "packets_retransmitted": s.data_packets_retransmitted,
                "loss_ratio": loss_ratio,
                "srtt_ms": s.srtt_us as f64 / 1000.0,
                "min_rtt_ms": s.min_rtt_us as f64 / 1000.0,
                "verified": r.all_verified(),
                // One file: its hash; several: see "entries".
                "blake3": if files_n == 1 {
                    r.files.iter().find(|f| f.kind == Kind::File).and_then(|f| f.blake3.clone())
                } else {
                    None
                },
                "error": r.error,
            });
            obj["files"] = serde_json::Value::Array(files);
            // Directories and links (with -r).
            obj["other_entries"] = serde_json::Value::Array(others);
            println!("{obj}");
        } else if !self.quiet && r.all_verified() {
            let mut extra = String::new();
            if resumed > 0 {
                extra.push_str(&format!(", {} resumed (already there)", fmt_bytes(resumed)));
            }
            if skipped > 0 {
                extra.push_str(&format!(", {skipped} skipped"));
            }
            if r.via_stream {
                extra.push_str(", over the ssh channel");
            }
            eprintln!(
                "{} in {} file{} in {:.2} s: {} (retransmitted {:.2}%){extra}, verified",
                fmt_bytes(bytes),
                files_n,
                if files_n == 1 { "" } else { "s" },
                r.seconds,
                fmt_bits(goodput / 8.0),
                100.0 * s.data_packets_retransmitted as f64 / s.data_packets_sent.max(1) as f64
            );
        }
    }
}

impl Ui for Output {
    fn progress(&mut self, p: &Progress<'_>) {
        Output::progress(self, p);
    }
    fn note(&mut self, msg: &str) {
        self.note_line(msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(out: &mut Output, secs: f64, bytes: u64, stats: &Stats) -> String {
        out.interval_line(&Progress {
            elapsed: Duration::from_secs_f64(secs),
            bytes_done: bytes,
            bytes_total: 1 << 30,
            files_done: 0,
            files_total: 1,
            stats,
            connected: true,
        })
    }

    #[test]
    fn an_upload_line_has_retransmissions_and_the_pace() {
        let mut out = Output::new(true, false, Some(1.0));
        let stats = Stats {
            data_packets_sent: 1000,
            data_packets_retransmitted: 10,
            pacing_rate: 12_500_000,
            ..Default::default()
        };
        let l = line(&mut out, 1.0, 1_000_000, &stats);
        assert!(l.contains("retx  1.00%"), "{l}");
        assert!(l.contains("pace 100.0 Mbit/s"), "{l}");
        assert!(l.contains("8.0 Mbit/s"), "{l}");
    }

    #[test]
    fn a_download_line_has_duplicates_not_our_own_pace() {
        let mut out = Output::new(true, false, Some(1.0));
        let stats = Stats {
            data_packets_received: 2000,
            duplicate_blocks_received: 20,
            pacing_rate: 4_000_000,
            ..Default::default()
        };
        let l = line(&mut out, 1.0, 2_000_000, &stats);
        assert!(l.contains("dup  1.00%"), "{l}");
        assert!(!l.contains("pace") && !l.contains("retx"), "{l}");
        // Only what came in since the last line counts.
        let later = Stats {
            data_packets_received: 3000,
            duplicate_blocks_received: 20,
            ..stats
        };
        let l = line(&mut out, 2.0, 3_000_000, &later);
        assert!(l.contains("dup  0.00%"), "{l}");
    }
}
