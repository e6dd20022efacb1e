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
    /// --progress without a terminal: a plain line a second instead of a bar.
    progress_lines: bool,
    /// When the last progress line was printed, and what had moved then.
    last_progress: Option<(Duration, u64)>,
}

impl Output {
    pub fn new(quiet: bool, json: bool, interval: Option<f64>, progress: bool) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let bar = (!quiet && terminal).then(|| {
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
            progress_lines: progress && !quiet && !terminal,
            last_progress: None,
        }
    }

    /// A progress line as rsync --progress prints one, for logs: done of total, percent,
    /// the rate since the last line (bits/s, of what moved: resumed bytes took no time),
    /// and files when there are several.
    fn progress_line(&mut self, p: &Progress<'_>) -> String {
        let (t0, m0) = self.last_progress.unwrap_or((Duration::ZERO, 0));
        let dt = (p.elapsed - t0).as_secs_f64();
        let rate = if dt > 0.0 {
            p.bytes_moved.saturating_sub(m0) as f64 / dt
        } else {
            0.0
        };
        self.last_progress = Some((p.elapsed, p.bytes_moved));
        let pct = if p.bytes_total == 0 {
            100.0
        } else {
            100.0 * p.bytes_done.min(p.bytes_total) as f64 / p.bytes_total as f64
        };
        let mut line = format!(
            "{:>10} of {:>10} {pct:5.1}% {:>13} {:7.1}s",
            fmt_bytes(p.bytes_done),
            fmt_bytes(p.bytes_total),
            fmt_bits(rate),
            p.elapsed.as_secs_f64()
        );
        if p.files_total > 1 {
            line.push_str(&format!("  {}/{} files", p.files_done, p.files_total));
        }
        line
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
        let due = match self.last_progress {
            None => true,
            Some((t, _)) => p.elapsed >= t + Duration::from_secs(1),
        };
        if self.progress_lines && p.connected && due {
            let line = self.progress_line(p);
            eprintln!("{line}");
        }
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
        let moved = r.moved_bytes();
        // From what moved in this run only: resumed and skipped bytes took no time.
        let goodput = (r.seconds > 0.0).then(|| moved as f64 * 8.0 / r.seconds);
        let s = &r.stats;
        let files_n = r.file_count();
        let skipped = r.files.iter().filter(|f| f.skipped.is_some()).count();
        let resumed = r.resumed_bytes();
        if self.json {
            println!("{}", report_json(r));
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
                fmt_bits(goodput.unwrap_or(0.0) / 8.0),
                100.0 * s.data_packets_retransmitted as f64 / s.data_packets_sent.max(1) as f64
            );
        }
    }
}

/// The object `--json` prints for a copy that ran: a field is there only when it was
/// measured (no RTT before a first sample, no loss ratio for what this side did not send,
/// no hash for a file that did not verify).
pub fn report_json(r: &Report) -> serde_json::Value {
    use serde_json::{json, Map, Value};
    let s = &r.stats;
    let files_n = r.file_count();
    let moved = r.moved_bytes();
    let mut o = Map::new();
    let mut put = |k: &str, v: Value| {
        if !v.is_null() {
            o.insert(k.to_string(), v);
        }
    };
    put("bytes", json!(moved));
    put("verified_bytes", json!(r.bytes_verified()));
    put("file_count", json!(files_n));
    put(
        "skipped",
        json!(r.files.iter().filter(|f| f.skipped.is_some()).count()),
    );
    put("skipped_bytes", json!(r.skipped_bytes()));
    put("resumed_bytes", json!(r.resumed_bytes()));
    put("data_bytes_sent", json!(s.data_bytes_sent));
    put("transport", json!(if r.via_stream { "ssh" } else { "udp" }));
    put("seconds", json!(r.seconds));
    if r.seconds > 0.0 {
        put("goodput_bps", json!(moved as f64 * 8.0 / r.seconds));
    }
    put("packets_sent", json!(s.packets_sent));
    put("packets_received", json!(s.packets_received));
    put("data_packets_sent", json!(s.data_packets_sent));
    put("packets_retransmitted", json!(s.data_packets_retransmitted));
    if s.data_packets_sent > 0 {
        put(
            "loss_ratio",
            json!(s.blocks_declared_lost as f64 / s.data_packets_sent as f64),
        );
    }
    if s.rtt_sampled {
        put("srtt_ms", json!(s.srtt_us as f64 / 1000.0));
        put("min_rtt_ms", json!(s.min_rtt_us as f64 / 1000.0));
    }
    put("verified", json!(r.all_verified()));
    // One file: its hash; several: see "files".
    if files_n == 1 {
        let h = r.files.iter().find(|f| f.kind == Kind::File);
        put("blake3", json!(h.and_then(|f| f.blake3.clone())));
    }
    put("error", json!(r.error));
    let entry = |f: &hayate_io::driver::client::FileResult| {
        let mut e = Map::new();
        for (k, v) in [
            ("kind", json!(f.kind)),
            ("path", json!(f.source())),
            (
                "dest",
                json!(if f.upload {
                    f.remote.clone()
                } else {
                    f.local.display().to_string()
                }),
            ),
            (
                "direction",
                json!(if f.upload { "upload" } else { "download" }),
            ),
            ("bytes", json!(f.bytes)),
            ("moved_bytes", json!(f.moved_bytes)),
            ("blake3", json!(f.blake3)),
            ("verified", json!(f.verified)),
            ("skipped", json!(f.skipped)),
            ("resumed_bytes", json!(f.resumed_bytes)),
            ("error", json!(f.error)),
        ] {
            if !v.is_null() {
                e.insert(k.to_string(), v);
            }
        }
        Value::Object(e)
    };
    let (files, others): (Vec<_>, Vec<_>) = r.files.iter().partition(|f| f.kind == Kind::File);
    o.insert(
        "files".into(),
        Value::Array(files.into_iter().map(entry).collect()),
    );
    // Directories and links (with -r).
    o.insert(
        "other_entries".into(),
        Value::Array(others.into_iter().map(entry).collect()),
    );
    Value::Object(o)
}

/// The object `--json` prints when the copy could not start (or the command line was
/// wrong): the error, and nothing that was not measured.
pub fn error_json(msg: &str) -> serde_json::Value {
    serde_json::json!({ "error": msg, "verified": false })
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
            bytes_moved: bytes,
            bytes_total: 1 << 30,
            files_done: 0,
            files_total: 1,
            stats,
            connected: true,
        })
    }

    #[test]
    fn an_upload_line_has_retransmissions_and_the_pace() {
        let mut out = Output::new(true, false, Some(1.0), false);
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
        let mut out = Output::new(true, false, Some(1.0), false);
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
