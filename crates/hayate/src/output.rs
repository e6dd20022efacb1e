//! What `hayate cp` shows: a progress bar on a terminal, periodic stats lines, a summary,
//! or exactly one JSON object on stdout.
//!
//! One system of units everywhere: rates in bits/s (kbit/s, Mbit/s, Gbit/s), sizes in
//! decimal bytes (kB, MB, GB), as `units` formats them. A rate is always of what moved in
//! this run: bytes a resumed file already had, and skipped files, took no time.

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::time::Duration;

use hayate_io::driver::client::{FileError, Kind, Progress, Report, Ui};
use hayate_proto::Stats;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::units::{fmt_bits, fmt_bytes};

pub struct Output {
    quiet: bool,
    json: bool,
    interval: Option<Duration>,
    bar: Option<ProgressBar>,
    /// Recent (elapsed, moved) samples: the bar's rate is over the last few seconds.
    recent: VecDeque<(Duration, u64)>,
    last_line: Duration,
    /// What had moved at the last stats line.
    last_moved: u64,
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
                // indicatif's own byte and rate keys are binary and count every position
                // change; the message is ours (see `bar_message`).
                ProgressStyle::with_template("{bar:30.cyan/blue} {msg}")
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
            recent: VecDeque::new(),
            last_line: Duration::ZERO,
            last_moved: 0,
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
        if let Some(w) = p.waiting {
            line.push_str(&format!("  ({w})"));
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
        let rate = (p.bytes_moved.saturating_sub(self.last_moved)) as f64 / dt;
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
        self.last_moved = p.bytes_moved;
        self.last = s.clone();
        line
    }

    /// The text beside the bar: done of total, the rate over the last 3 s of what moved,
    /// the time left at that rate, and files when there are several.
    fn bar_message(&mut self, p: &Progress<'_>) -> String {
        self.recent.push_back((p.elapsed, p.bytes_moved));
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| p.elapsed.saturating_sub(*t) > Duration::from_secs(3))
        {
            self.recent.pop_front();
        }
        let (t0, m0) = *self.recent.front().expect("just pushed");
        let dt = (p.elapsed - t0).as_secs_f64();
        let rate = (dt > 0.0).then(|| p.bytes_moved.saturating_sub(m0) as f64 / dt);
        let left = p.bytes_total.saturating_sub(p.bytes_done);
        let mut m = format!("{}/{}", fmt_bytes(p.bytes_done), fmt_bytes(p.bytes_total));
        match rate {
            Some(r) if r > 0.0 => {
                let eta = (left as f64 / r) as u64;
                m.push_str(&format!(
                    " {} ETA {}:{:02}:{:02}",
                    fmt_bits(r),
                    eta / 3600,
                    eta / 60 % 60,
                    eta % 60
                ));
            }
            _ => {}
        }
        if p.files_total > 1 {
            m.push_str(&format!(" {}/{} files", p.files_done, p.files_total));
        }
        if let Some(w) = p.waiting {
            m.push_str(&format!(" ({w})"));
        }
        m
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
        if self.bar.is_some() {
            let msg = self.bar_message(p);
            if let Some(b) = &self.bar {
                b.set_length(p.bytes_total);
                b.set_position(p.bytes_done.min(p.bytes_total));
                b.set_message(msg);
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
        // `--delete`: as rsync says it, a directory with a trailing `/`.
        for d in &r.deleted {
            let slash = if d.kind == Kind::Dir { "/" } else { "" };
            match &d.error {
                Some(e) => eprintln!("hayate: cannot delete {}{slash}: {e}", d.path),
                None if !self.quiet => eprintln!("deleting {}{slash}", d.path),
                None => {}
            }
        }
        if let Some(why) = &r.not_deleted {
            if !self.quiet {
                eprintln!("hayate: --delete: {why}");
            }
        }
        if let Some(e) = &r.error {
            eprintln!("hayate: {e}");
        }
        if self.json {
            println!("{}", report_json(r));
        } else if !self.quiet && r.all_verified() {
            eprintln!("{}", summary_line(r));
        }
    }
}

/// The one line after a copy that verified: what is verified, then what moved in this run
/// and its rate, then what was already there (reused by a delta, resumed) and what was
/// skipped, each apart and
/// none of it in the rate. Retransmissions only when this side sent the data.
pub fn summary_line(r: &Report) -> String {
    let s = &r.stats;
    let files = |n: usize| format!("{n} file{}", if n == 1 { "" } else { "s" });
    let verified: Vec<_> = r
        .files
        .iter()
        .filter(|f| f.kind == Kind::File && f.verified)
        .collect();
    let moved = r.moved_bytes();
    let skipped = r.files.iter().filter(|f| f.skipped.is_some()).count();
    if verified.is_empty() && skipped > 0 {
        return format!(
            "{} skipped ({}) in {:.2} s, nothing to copy",
            files(skipped),
            fmt_bytes(r.skipped_bytes()),
            r.seconds
        );
    }
    let mut line = format!(
        "{} in {} verified in {:.2} s: {} moved",
        fmt_bytes(r.bytes_verified()),
        files(verified.len()),
        r.seconds,
        fmt_bytes(moved),
    );
    if r.seconds > 0.0 && moved > 0 {
        line.push_str(&format!(" at {}", fmt_bits(moved as f64 / r.seconds)));
    }
    let reused = r.reused_bytes();
    if reused > 0 {
        line.push_str(&format!(
            ", {} reused (same at the destination)",
            fmt_bytes(reused)
        ));
    }
    let resumed = r.resumed_bytes();
    if resumed > 0 {
        line.push_str(&format!(", {} resumed (already there)", fmt_bytes(resumed)));
    }
    if skipped > 0 {
        line.push_str(&format!(
            ", {} skipped ({})",
            files(skipped),
            fmt_bytes(r.skipped_bytes())
        ));
    }
    let deleted = r.deleted.iter().filter(|d| d.error.is_none()).count();
    if deleted > 0 {
        line.push_str(&format!(", {deleted} deleted"));
    }
    if s.data_packets_sent > 0 {
        line.push_str(&format!(
            ", retransmitted {:.2}%",
            100.0 * s.data_packets_retransmitted as f64 / s.data_packets_sent as f64
        ));
    }
    if r.via_stream {
        line.push_str(", over the ssh channel");
    }
    line
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
    put("reused_bytes", json!(r.reused_bytes()));
    put("data_bytes_sent", json!(s.data_bytes_sent));
    put("transport", json!(if r.via_stream { "ssh" } else { "udp" }));
    if s.mtu > 0 {
        put("mtu", json!(s.mtu));
    }
    put("seconds", json!(r.seconds));
    if r.seconds > 0.0 {
        put("goodput_bps", json!(moved as f64 * 8.0 / r.seconds));
    }
    put("packets_sent", json!(s.packets_sent));
    put("packets_received", json!(s.packets_received));
    put("data_packets_sent", json!(s.data_packets_sent));
    put("packets_retransmitted", json!(s.data_packets_retransmitted));
    put(
        "data_bytes_retransmitted",
        json!(s.data_bytes_retransmitted),
    );
    // Blocks this side received while its disk was behind: dropped, and sent again.
    if s.blocks_refused_by_sink > 0 {
        put("blocks_refused", json!(s.blocks_refused_by_sink));
    }
    // Blocks declared lost that arrived after all: the path reorders.
    if s.blocks_lost_spuriously > 0 {
        put("blocks_lost_spuriously", json!(s.blocks_lost_spuriously));
    }
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
    put("error", json!(r.error.as_ref().map(ToString::to_string)));
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
            ("reused_bytes", json!(f.reused_bytes)),
            ("error", json!(f.error.as_ref().map(ToString::to_string))),
            ("error_kind", json!(f.error.as_ref().map(FileError::kind))),
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
    // `--delete`: what was removed, and what could not be (with `error`).
    let deleted = r.deleted.iter().map(|d| {
        let mut e = Map::new();
        e.insert("kind".into(), json!(d.kind));
        e.insert("path".into(), json!(d.path));
        let dir = if d.upload { "upload" } else { "download" };
        e.insert("direction".into(), json!(dir));
        if let Some(err) = &d.error {
            e.insert("error".into(), json!(err.to_string()));
            e.insert("error_kind".into(), json!(err.kind()));
        }
        Value::Object(e)
    });
    o.insert("deleted".into(), Value::Array(deleted.collect()));
    if let Some(why) = &r.not_deleted {
        o.insert("not_deleted".into(), json!(why));
    }
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
    use hayate_io::driver::client::FileResult;

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
            waiting: None,
        })
    }

    #[test]
    fn progress_says_what_a_finished_looking_copy_waits_for() {
        use hayate_io::driver::client::Waiting;
        let stats = Stats::default();
        let mut out = Output::new(false, false, None, true);
        let p = Progress {
            elapsed: Duration::from_secs(3),
            bytes_done: 1 << 30,
            bytes_moved: 1 << 30,
            bytes_total: 1 << 30,
            files_done: 0,
            files_total: 1,
            stats: &stats,
            connected: true,
            waiting: Some(Waiting::FarSideVerifying),
        };
        let l = out.progress_line(&p);
        assert!(l.contains("100.0%"), "{l}");
        assert!(l.contains("(the far side is writing and verifying)"), "{l}");
        let m = out.bar_message(&Progress {
            waiting: Some(Waiting::Hashing),
            ..p
        });
        assert!(
            m.contains("(hashing to compare with the destination)"),
            "{m}"
        );
        let m = out.bar_message(&Progress { waiting: None, ..p });
        assert!(!m.contains('('), "{m}");
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

    #[test]
    fn an_interval_line_rates_what_moved_not_what_was_resumed() {
        let mut out = Output::new(true, false, Some(1.0), false);
        let stats = Stats::default();
        let l = out.interval_line(&Progress {
            elapsed: Duration::from_secs(1),
            bytes_done: 500_000_000,
            bytes_moved: 1_000_000,
            bytes_total: 1_000_000_000,
            files_done: 0,
            files_total: 1,
            stats: &stats,
            connected: true,
            waiting: None,
        });
        assert!(l.contains("  8.0 Mbit/s"), "{l}");
        assert!(l.contains("500.0 MB done"), "{l}");
    }

    #[test]
    fn the_bar_says_decimal_sizes_and_the_rate_in_bits_of_what_moved() {
        let mut out = Output::new(true, false, None, false);
        let stats = Stats::default();
        let at = |secs: f64, done: u64, moved: u64| Progress {
            elapsed: Duration::from_secs_f64(secs),
            bytes_done: done,
            bytes_moved: moved,
            bytes_total: 1_000_000_000,
            files_done: 0,
            files_total: 1,
            stats: &stats,
            connected: true,
            waiting: None,
        };
        // A resume: 500 MB were there from the start and are no part of the rate.
        assert_eq!(
            out.bar_message(&at(0.0, 500_000_000, 0)),
            "500.0 MB/1.00 GB"
        );
        assert_eq!(
            out.bar_message(&at(1.0, 510_000_000, 10_000_000)),
            "510.0 MB/1.00 GB 80.0 Mbit/s ETA 0:00:49"
        );
        // The rate is of the last 3 s only (the whole run's would be 32 Mbit/s).
        out.bar_message(&at(2.0, 510_000_000, 10_000_000));
        out.bar_message(&at(3.0, 510_000_000, 10_000_000));
        assert_eq!(
            out.bar_message(&at(4.0, 516_000_000, 16_000_000)),
            "516.0 MB/1.00 GB 16.0 Mbit/s ETA 0:04:02"
        );
    }

    fn file(bytes: u64, resumed: u64, verified: bool, skipped: bool) -> FileResult {
        FileResult {
            kind: Kind::File,
            upload: true,
            local: "f".into(),
            remote: "f".into(),
            bytes,
            blake3: None,
            verified,
            skipped: skipped.then(|| "exists (--no-clobber)".to_string()),
            resumed_bytes: resumed,
            reused_bytes: 0,
            moved_bytes: if verified { bytes - resumed } else { 0 },
            error: None,
        }
    }

    fn report(files: Vec<FileResult>, seconds: f64, sent: u64, retx: u64) -> Report {
        Report {
            files,
            deleted: Vec::new(),
            not_deleted: None,
            seconds,
            stats: Stats {
                data_packets_sent: sent,
                data_packets_retransmitted: retx,
                ..Default::default()
            },
            error: None,
            via_stream: false,
            measured: None,
        }
    }

    #[test]
    fn the_summary_rates_only_what_moved_and_shows_resumed_and_skipped_apart() {
        // 1 GB verified, of which 900 MB were already there: 100 MB in 1 s is 800 Mbit/s,
        // not 8 Gbit/s.
        let r = report(
            vec![
                file(1_000_000_000, 900_000_000, true, false),
                file(5_000_000, 0, false, true),
            ],
            1.0,
            1000,
            10,
        );
        assert_eq!(
            summary_line(&r),
            "1.00 GB in 1 file verified in 1.00 s: 100.0 MB moved at 800.0 Mbit/s, \
             900.0 MB resumed (already there), 1 file skipped (5.0 MB), retransmitted 1.00%"
        );
        // A download: this side sent no data, so no retransmission figure.
        let r = report(
            vec![file(2_500, 0, true, false), file(500, 0, true, false)],
            0.5,
            0,
            0,
        );
        assert_eq!(
            summary_line(&r),
            "3.0 kB in 2 files verified in 0.50 s: 3.0 kB moved at 48.0 kbit/s"
        );
        // Everything skipped: nothing moved, no rate.
        let r = report(vec![file(5_000_000, 0, false, true)], 0.2, 0, 0);
        assert_eq!(
            summary_line(&r),
            "1 file skipped (5.0 MB) in 0.20 s, nothing to copy"
        );
    }
}
