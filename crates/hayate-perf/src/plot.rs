//! `--plot FILE.svg`: throughput per interval (and loss % for UDP, retransmitted % for hayate)
//! as a self-contained SVG.

use crate::ctl::IntervalReport;
use crate::units::per_sec;
use std::fmt::Write;

const W: f64 = 800.0;
const H: f64 = 420.0;
const L: f64 = 80.0; // margins: room for tick labels and axis titles
const R: f64 = 80.0;
const T: f64 = 50.0;
const B: f64 = 60.0;

/// The smallest 1, 2 or 5 × 10^k that is ≥ v.
fn nice_ceil(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= v * (1.0 - 1e-12) {
            return m * p;
        }
    }
    10.0 * p
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn fmt_tick(v: f64) -> String {
    if v == v.round() {
        format!("{v:.0}")
    } else if (v * 10.0) == (v * 10.0).round() {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A second series in percent, drawn dashed against a right-hand axis.
pub struct Percent {
    /// Element id of the polyline.
    pub id: &'static str,
    /// Axis and legend label.
    pub label: &'static str,
    /// (end of interval in s, percent)
    pub points: Vec<(f64, f64)>,
}

/// UDP: the share of datagrams lost per receiver interval.
pub fn loss_series(iv: &[IntervalReport]) -> Percent {
    Percent {
        id: "loss",
        label: "loss (%)",
        points: iv
            .iter()
            .map(|r| {
                let lost = r.lost.unwrap_or(0);
                let exp = r.datagrams + lost;
                (
                    r.end,
                    if exp > 0 {
                        100.0 * lost as f64 / exp as f64
                    } else {
                        0.0
                    },
                )
            })
            .collect(),
    }
}

/// hayate: the share of data packets retransmitted per sender interval.
pub fn retransmit_series(sender: &[IntervalReport]) -> Percent {
    Percent {
        id: "retransmitted",
        label: "retransmitted (%)",
        points: sender
            .iter()
            .map(|r| {
                (
                    r.end,
                    r.hayate.as_ref().map_or(0.0, |h| h.retransmit_percent),
                )
            })
            .collect(),
    }
}

/// Receiver intervals → SVG; `second` adds a percent series and its right-hand axis.
/// `(start, end, bytes)` per interval, with a stub (a last report a few ms after the one
/// before, carrying the final datagrams) folded into the interval before it: drawn alone, its
/// rate is a few datagrams over a few ms, a drop that did not happen.
fn whole_intervals(iv: &[IntervalReport]) -> Vec<(f64, f64, u64)> {
    let mut lens: Vec<f64> = iv.iter().map(|r| r.end - r.start).collect();
    lens.sort_by(f64::total_cmp);
    let typical = lens.get(lens.len() / 2).copied().unwrap_or(0.0);
    let mut out: Vec<(f64, f64, u64)> = Vec::new();
    for r in iv {
        match out.last_mut() {
            Some(last) if r.end - r.start < typical / 4.0 => {
                last.1 = r.end;
                last.2 += r.bytes;
            }
            _ => out.push((r.start, r.end, r.bytes)),
        }
    }
    out
}

pub fn svg(title: &str, iv: &[IntervalReport], second: Option<Percent>) -> String {
    let with_loss = second.is_some();
    let (second_id, second_label, loss) = match second {
        Some(p) => (p.id, p.label, p.points),
        None => ("loss", "loss (%)", Vec::new()),
    };
    // The axis spans the test as it ran, not the next round number (a 3 s test drawn to
    // 5 s reads as one that stopped early).
    let tmax = iv
        .iter()
        .map(|r| r.end)
        .chain(loss.iter().map(|p| p.0))
        .fold(0.0, f64::max)
        .max(1e-3);
    let mbps: Vec<(f64, f64)> = whole_intervals(iv)
        .iter()
        .map(|&(start, end, bytes)| (end, 8.0 * per_sec(bytes, end - start) / 1e6))
        .collect();
    let ymax = nice_ceil(mbps.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-3) * 1.1);
    let lmax = nice_ceil(loss.iter().map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.1).min(100.0);
    let (pw, ph) = (W - L - R, H - T - B);
    let x = |t: f64| L + pw * t / tmax;
    // Round steps (1, 2, 5 x 10^n) up to the test's end, at most about five of them.
    let step = nice_ceil(tmax / 5.0);
    let xticks: Vec<f64> = (0..)
        .map(|i| i as f64 * step)
        .take_while(|t| *t <= tmax * 1.0001)
        .collect();
    let y = |v: f64| T + ph * (1.0 - v / ymax);
    let yl = |v: f64| T + ph * (1.0 - v / lmax);

    let mut s = String::new();
    let _ = writeln!(s, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<title>{}</title>"#, esc(title));
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="25" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        esc(title)
    );
    // Grid and ticks.
    let _ = writeln!(s, r##"<g id="grid" stroke="#ddd" stroke-width="1">"##);
    for i in 0..=5 {
        let f = i as f64 / 5.0;
        let _ = writeln!(
            s,
            r#"<line x1="{L}" x2="{}" y1="{:.1}" y2="{:.1}"/>"#,
            W - R,
            T + ph * (1.0 - f),
            T + ph * (1.0 - f)
        );
    }
    for &t in &xticks {
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" x2="{:.1}" y1="{T}" y2="{}"/>"#,
            x(t),
            x(t),
            T + ph
        );
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(
        s,
        r#"<g id="axes" stroke="black" stroke-width="1.5"><line x1="{L}" y1="{}" x2="{}" y2="{}"/><line x1="{L}" y1="{T}" x2="{L}" y2="{}"/>"#,
        T + ph,
        W - R,
        T + ph,
        T + ph
    );
    if with_loss {
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{T}" x2="{}" y2="{}"/>"#,
            W - R,
            W - R,
            T + ph
        );
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(s, r#"<g id="ticks">"#);
    for &t in &xticks {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            x(t),
            T + ph + 18.0,
            fmt_tick(t)
        );
    }
    for i in 0..=5 {
        let f = i as f64 / 5.0;

        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            L - 6.0,
            T + ph * (1.0 - f) + 4.0,
            fmt_tick(ymax * f)
        );
        if with_loss {
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{:.1}" fill="#c0392b">{}</text>"##,
                W - R + 6.0,
                T + ph * (1.0 - f) + 4.0,
                fmt_tick(lmax * f)
            );
        }
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(
        s,
        r#"<text id="xlabel" x="{}" y="{}" text-anchor="middle">time (s)</text>"#,
        L + pw / 2.0,
        H - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text id="ylabel" transform="translate(20 {}) rotate(-90)" text-anchor="middle">throughput (Mbit/s)</text>"#,
        T + ph / 2.0
    );
    if with_loss {
        let _ = writeln!(
            s,
            r##"<text id="y2label" transform="translate({} {}) rotate(90)" text-anchor="middle" fill="#c0392b">{}</text>"##,
            W - 20.0,
            T + ph / 2.0,
            esc(second_label)
        );
    }
    let pts = |v: &[(f64, f64)], f: &dyn Fn(f64) -> f64| {
        v.iter()
            .map(|(t, val)| format!("{:.2},{:.2}", x(*t), f(*val)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let _ = writeln!(
        s,
        r##"<polyline id="throughput" fill="none" stroke="#1f77b4" stroke-width="2" points="{}"/>"##,
        pts(&mbps, &y)
    );
    if with_loss {
        let _ = writeln!(
            s,
            r##"<polyline id="{}" fill="none" stroke="#c0392b" stroke-width="2" stroke-dasharray="6 3" points="{}"/>"##,
            second_id,
            pts(&loss, &yl)
        );
    }
    // Legend.
    let _ = writeln!(s, r#"<g id="legend">"#);
    let _ = writeln!(
        s,
        r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#1f77b4" stroke-width="2"/><text x="{}" y="{}">throughput (Mbit/s)</text>"##,
        L + 10.0,
        T + 12.0,
        L + 35.0,
        T + 12.0,
        L + 40.0,
        T + 16.0
    );
    if with_loss {
        let _ = writeln!(
            s,
            r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#c0392b" stroke-width="2" stroke-dasharray="6 3"/><text x="{}" y="{}">{}</text>"##,
            L + 10.0,
            T + 30.0,
            L + 35.0,
            T + 30.0,
            L + 40.0,
            T + 34.0,
            esc(second_label)
        );
    }
    let _ = writeln!(s, "</g>\n</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice() {
        assert_eq!(nice_ceil(0.7), 1.0);
        assert_eq!(nice_ceil(1.0), 1.0);
        assert_eq!(nice_ceil(1.1), 2.0);
        assert_eq!(nice_ceil(37.0), 50.0);
        assert_eq!(nice_ceil(501.0), 1000.0);
    }

    #[test]
    fn escapes_title() {
        let s = svg("a<b & \"c\"", &[], Some(loss_series(&[])));
        assert!(s.contains("a&lt;b &amp; &quot;c&quot;"));
    }

    fn interval(start: f64, end: f64, bytes: u64) -> IntervalReport {
        IntervalReport {
            side: crate::ctl::Side::Receiver,
            start,
            end,
            bytes,
            datagrams: 0,
            lost: Some(0),
            total_bytes: 0,
            total_datagrams: 0,
            stream_bytes: Vec::new(),
            hayate: None,
        }
    }

    #[test]
    fn a_three_second_test_spans_three_seconds_and_its_last_datagrams_draw_no_drop() {
        let iv = vec![
            interval(0.0, 1.0, 25_000_000),
            interval(1.0, 2.0, 25_000_000),
            interval(2.0, 3.0, 25_000_000),
            // The final report: one datagram, a moment later.
            interval(3.0, 3.0001, 1472),
        ];
        let s = svg("t", &iv, Some(loss_series(&iv)));
        let ticks: Vec<f64> = s
            .split(r#"text-anchor="middle">"#)
            .skip(1)
            .filter_map(|t| t.split('<').next()?.parse().ok())
            .collect();
        assert_eq!(ticks, [0.0, 1.0, 2.0, 3.0]);
        let line = s
            .split(r#"id="throughput""#)
            .nth(1)
            .and_then(|t| t.split("points=\"").nth(1))
            .and_then(|t| t.split('"').next())
            .unwrap();
        let ys: Vec<f64> = line
            .split(' ')
            .map(|p| p.split(',').nth(1).unwrap().parse().unwrap())
            .collect();
        assert_eq!(ys.len(), 3, "{line}");
        assert!(
            ys.iter().all(|y| (y - ys[0]).abs() < 0.5),
            "a drop drawn: {line}"
        );
    }
}
