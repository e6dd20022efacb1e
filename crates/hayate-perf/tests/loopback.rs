//! Loopback runs of the real binary: a server per test on port 0, clients against it.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::net::{TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_hayate-perf-dev");

struct Server {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(key: Option<&std::path::Path>) -> Server {
        let mut cmd = Command::new(BIN);
        cmd.args(["server", "--listen", "127.0.0.1:0"]);
        if let Some(k) = key {
            cmd.arg("--key-file").arg(k);
        }
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut first = String::new();
        err.read_line(&mut first).unwrap();
        let port = first
            .split_whitespace()
            .find_map(|w| w.strip_prefix("127.0.0.1:"))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {first:?}"));
        let log = Arc::new(Mutex::new(vec![first]));
        let l2 = log.clone();
        std::thread::spawn(move || {
            for line in err.lines() {
                let Ok(line) = line else { break };
                l2.lock().unwrap().push(line);
            }
        });
        Server { child, port, log }
    }
    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs the client, killing it if it takes longer than 20 s.
fn client(args: &[&str]) -> Run {
    let mut child = Command::new(BIN)
        .arg("client")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut o = child.stdout.take().unwrap();
    let mut e = child.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut s = String::new();
        o.read_to_string(&mut s).unwrap();
        s
    });
    let te = std::thread::spawn(move || {
        let mut s = String::new();
        e.read_to_string(&mut s).unwrap();
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("client {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        ok: status.success(),
        stdout: to.join().unwrap(),
        stderr: te.join().unwrap(),
    }
}

/// This run's directory for keys and plots: under target/tmp (cargo's scratch space for
/// integration tests), not /tmp, where every run left its files behind.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hayate-perf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn key_file(name: &str, byte: u8) -> std::path::PathBuf {
    let p = scratch(name);
    let hex: String = (0..32).map(|i| format!("{:02x}", byte ^ i)).collect();
    std::fs::write(&p, format!("# test key\nhayate-key-v1 {hex}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

fn intervals<'a>(lines: &'a [Value], side: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|v| v["type"] == "interval" && v["side"] == side)
        .collect()
}

#[test]
fn udp_loopback_json_totals_and_plot() {
    let s = Server::start(None);
    let svg = scratch("udp.svg");
    let svg_s = svg.to_str().unwrap();
    let r = client(&[
        &s.addr(),
        "--udp",
        "--rate",
        "50M",
        "--time",
        "2",
        "--json",
        "--plot",
        svg_s,
    ]);
    assert!(r.ok, "{}\n{}", r.stderr, s.log());
    let lines = json_lines(&r.stdout);
    let sum = lines.last().unwrap();
    assert_eq!(sum["type"], "summary");
    assert_eq!(lines.iter().filter(|v| v["type"] == "summary").count(), 1);
    let (sent, received, lost) = (u(sum, "sent"), u(sum, "received"), u(sum, "lost"));
    assert_eq!(sent, received + lost);
    assert_eq!(lost, 0, "loss on loopback at 50 Mbit/s");
    // 50 Mbit/s of 1472-byte datagrams for 2 s.
    let expect = 50e6 * 2.0 / (1472.0 * 8.0);
    assert!(
        (sent as f64 - expect).abs() < expect * 0.02,
        "sent {sent}, expected ~{expect}"
    );
    assert_eq!(u(sum, "bytes"), received * 1472);
    let ranges = sum["ranges"].as_array().unwrap();
    assert_eq!(ranges.len(), 1);
    assert_eq!(u(&ranges[0], "received"), received);
    assert_eq!(u(&ranges[0], "end"), sent);
    // Per-second lines from both sides, and they add up to the totals.
    let snd = intervals(&lines, "sender");
    let rcv = intervals(&lines, "receiver");
    assert!(snd.len() >= 2 && rcv.len() >= 2, "{}", r.stdout);
    assert!(snd.iter().all(|v| v["origin"] == "local"));
    assert!(rcv.iter().all(|v| v["origin"] == "remote"));
    assert_eq!((snd[0]["end"].as_f64().unwrap() * 1e3).round(), 1000.0);
    assert_eq!(snd.iter().map(|v| u(v, "datagrams")).sum::<u64>(), sent);
    assert_eq!(rcv.iter().map(|v| u(v, "datagrams")).sum::<u64>(), received);
    assert_eq!(u(rcv.last().unwrap(), "total_datagrams"), received);
    // Human lines go to stderr with --json.
    assert!(r.stderr.contains("+1.000 "), "{}", r.stderr);
    assert!(r.stderr.contains(" rcv ||| "));
    assert!(r
        .stderr
        .contains(&format!("--END-- received {received} / {sent} (100.000%)")));
    assert!(r
        .stderr
        .contains(&format!("received ..{sent}: {received} 100.000%")));

    // The SVG is well-formed and holds both series.
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let series = |id: &str| {
        doc.descendants()
            .find(|n| n.attribute("id") == Some(id))
            .unwrap_or_else(|| panic!("no series {id}"))
    };
    for id in ["throughput", "loss"] {
        let pl = series(id);
        assert_eq!(pl.tag_name().name(), "polyline");
        let pts: Vec<(f64, f64)> = pl
            .attribute("points")
            .unwrap()
            .split_whitespace()
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect();
        // One point per receiver interval; the throughput line folds a final stub report
        // (the last datagrams, ms after the one before) into the interval before it.
        if id == "throughput" {
            assert!(
                (rcv.len().saturating_sub(1)..=rcv.len()).contains(&pts.len()),
                "{id}: {} points for {} intervals",
                pts.len(),
                rcv.len()
            );
        } else {
            assert_eq!(pts.len(), rcv.len(), "{id}");
        }
        assert!(pts
            .iter()
            .all(|&(x, y)| (0.0..=800.0).contains(&x) && (0.0..=420.0).contains(&y)));
    }
    let texts: String = doc.descendants().filter_map(|n| n.text()).collect();
    for label in ["time (s)", "throughput (Mbit/s)", "loss (%)"] {
        assert!(texts.contains(label), "missing {label}");
    }
    std::fs::remove_file(&svg).ok();
}

#[test]
fn tcp_two_streams() {
    let s = Server::start(None);
    let r = client(&[
        &s.addr(),
        "--tcp",
        "--streams",
        "2",
        "--time",
        "1",
        "--json",
    ]);
    assert!(r.ok, "{}\n{}", r.stderr, s.log());
    let lines = json_lines(&r.stdout);
    let sum = lines.last().unwrap();
    assert_eq!(sum["mode"], "tcp");
    let streams = sum["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 2);
    let mut total = 0;
    for st in streams {
        assert!(u(st, "bytes") > 0);
        assert!(st["goodput_bps"].as_f64().unwrap() > 0.0);
        let info = &st["sender_tcp_info"];
        assert!(u(info, "cwnd_segments") > 0, "{st}");
        assert!(u(info, "mss") > 0);
        assert!(info["total_retrans"].is_u64());
        assert!(info["rtt_us"].is_u64());
        total += u(st, "bytes");
    }
    // TCP delivers all it accepted: receiver total == sum of streams == sender total.
    assert_eq!(total, u(sum, "bytes"));
    assert_eq!(total, u(&sum["sender"], "bytes"));
    let rcv = intervals(&lines, "receiver");
    assert!(!rcv.is_empty());
    assert!(rcv
        .iter()
        .all(|v| v["stream_bytes"].as_array().unwrap().len() == 2));
    assert_eq!(rcv.iter().map(|v| u(v, "bytes")).sum::<u64>(), total);
    assert!(r.stderr.contains("stream 1: "), "{}", r.stderr);
    assert!(r.stderr.contains("cwnd "));
}

#[test]
fn reverse_with_key_and_server_side_loss_hook() {
    let k = key_file("good", 1);
    let s = Server::start(Some(&k));
    let ks = k.to_str().unwrap();
    let r = client(&[
        &s.addr(),
        "--reverse",
        "--key-file",
        ks,
        "--rate",
        "20M",
        "--time",
        "1",
    ]);
    assert!(r.ok, "{}\n{}", r.stderr, s.log());
    // Human report on stdout: our own receiver lines, the server's sender lines, the summary.
    assert!(r.stdout.contains(" rcv ||| "), "{}", r.stdout);
    assert!(r.stdout.contains(" snd ||| "));
    let end = r
        .stdout
        .lines()
        .find(|l| l.starts_with("--END-- received "))
        .unwrap();
    let nums: Vec<u64> = end
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(nums[0], nums[1], "{end}");
    assert!(end.ends_with("(100.000%)"));
    assert!(r.stdout.contains("Total: "));

    // The generator is the server here: the hook travels in the request.
    let r = client(&[
        &s.addr(),
        "--reverse",
        "--key-file",
        ks,
        "--interval-us",
        "200",
        "--size",
        "200",
        "--time",
        "0.6",
        "--drop-every",
        "10",
        "--json",
    ]);
    assert!(r.ok, "{}\n{}", r.stderr, s.log());
    let sum = json_lines(&r.stdout).pop().unwrap();
    let (sent, lost) = (u(&sum, "sent"), u(&sum, "lost"));
    assert_eq!(sent, 3000);
    assert_eq!(lost, sent / 10);
    assert_eq!(u(&sum["sender"], "skipped"), lost);
}

/// Binds a UDP socket, asks for a reverse test with `proof`, and counts datagrams that arrive.
fn attacker(port: u16, proof: Option<String>) -> (String, usize) {
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let mut ctl = TcpStream::connect(("127.0.0.1", port)).unwrap();
    ctl.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rd = BufReader::new(ctl.try_clone().unwrap());
    let mut ch = String::new();
    rd.read_line(&mut ch).unwrap();
    let ch: Value = serde_json::from_str(&ch).unwrap();
    assert_eq!(ch["type"], "challenge");
    let req = serde_json::json!({
        "type": "request", "mode": "udp", "interval_ns": 10_000, "rate_bps": null, "size": 1472,
        "time_s": 1.0, "streams": 1, "reverse": true, "nonce": "00".repeat(32), "proof": proof,
        // Not part of the protocol: a server that trusted a client-given port would use it.
        "udp_port": udp_port,
    });
    use std::io::Write;
    writeln!(ctl, "{req}").unwrap();
    let mut answer = String::new();
    rd.read_line(&mut answer).unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut n = 0;
    let t0 = Instant::now();
    let mut buf = [0u8; 2048];
    while t0.elapsed() < Duration::from_millis(1200) {
        if udp.recv(&mut buf).is_ok() {
            n += 1;
        }
    }
    (answer, n)
}

#[test]
fn reverse_refused_without_server_key_and_nothing_sent() {
    let k = key_file("client-only", 2);
    let s = Server::start(None);
    let r = client(&[
        &s.addr(),
        "--reverse",
        "--key-file",
        k.to_str().unwrap(),
        "--time",
        "1",
    ]);
    assert!(!r.ok);
    assert!(
        r.stderr
            .contains("server has no key; reverse tests need `--key-file` on both sides"),
        "{}",
        r.stderr
    );
    let (answer, got) = attacker(s.port, Some("11".repeat(32)));
    assert!(answer.contains(r#""type":"refused""#), "{answer}");
    assert_eq!(
        got, 0,
        "the server sent datagrams to an unauthenticated client"
    );
    // Forward tests still run on that server afterwards.
    let r = client(&[&s.addr(), "--rate", "10M", "--time", "0.3"]);
    assert!(r.ok, "{}", r.stderr);
}

#[test]
fn wrong_key_or_no_key_refused_and_nothing_sent() {
    let good = key_file("server", 3);
    let bad = key_file("wrong", 4);
    let s = Server::start(Some(&good));
    let r = client(&[
        &s.addr(),
        "--reverse",
        "--key-file",
        bad.to_str().unwrap(),
        "--time",
        "1",
    ]);
    assert!(!r.ok);
    assert!(r.stderr.contains("authentication failed"), "{}", r.stderr);
    // Forward tests need the proof too on a keyed server.
    let r = client(&[
        &s.addr(),
        "--key-file",
        bad.to_str().unwrap(),
        "--time",
        "0.3",
    ]);
    assert!(!r.ok);
    assert!(r.stderr.contains("authentication failed"), "{}", r.stderr);
    let r = client(&[&s.addr(), "--reverse", "--time", "1"]);
    assert!(!r.ok);
    assert!(r.stderr.contains("requires a key"), "{}", r.stderr);
    for proof in [Some("22".repeat(32)), None, Some("zz".into())] {
        let (answer, got) = attacker(s.port, proof);
        assert!(answer.contains("authentication failed"), "{answer}");
        assert_eq!(
            got, 0,
            "the server sent datagrams to an unauthenticated client"
        );
    }
    assert!(s.log().contains("refused a test"));
}

#[test]
fn lossy_path_reported_loss_matches_configured() {
    let s = Server::start(None);
    let p = 0.1;
    let r = client(&[
        &s.addr(),
        "--interval-us",
        "200",
        "--size",
        "200",
        "--time",
        "1.5",
        "--drop-random",
        "0.1",
        "--seed",
        "7",
        "--json",
    ]);
    assert!(r.ok, "{}\n{}", r.stderr, s.log());
    let lines = json_lines(&r.stdout);
    let sum = lines.last().unwrap();
    let (sent, received, lost) = (u(sum, "sent"), u(sum, "received"), u(sum, "lost"));
    assert_eq!(sent, 7500);
    assert_eq!(sent, received + lost);
    // Binomial(sent, p): within 5 standard deviations.
    let mean = sent as f64 * p;
    let sd = (sent as f64 * p * (1.0 - p)).sqrt();
    assert!(
        (lost as f64 - mean).abs() < 5.0 * sd,
        "lost {lost}, expected {mean} ± {sd}"
    );
    assert_eq!(
        u(&sum["sender"], "skipped"),
        lost,
        "loss beyond the simulated one"
    );
    let pct = sum["loss_percent"].as_f64().unwrap();
    assert!((pct - 100.0 * lost as f64 / sent as f64).abs() < 1e-9);
    // Per-interval loss adds up to the total.
    let rcv = intervals(&lines, "receiver");
    let lost_iv: u64 = rcv.iter().map(|v| u(v, "lost")).sum();
    assert!(
        lost_iv.abs_diff(lost) <= 1,
        "interval losses {lost_iv} vs {lost}"
    );
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

/// Checks one `--hayate` JSON run: both sides' lines, totals that add up, no loss at a modest
/// cap on loopback, the cap respected, files verified. Returns the summary.
fn check_hayate_json(lines: &[Value], reverse: bool, cap_bps: f64, time_s: f64) -> Value {
    let sum = lines.last().unwrap().clone();
    assert_eq!(sum["type"], "summary");
    assert_eq!(lines.iter().filter(|v| v["type"] == "summary").count(), 1);
    assert_eq!(sum["mode"], "hayate");
    assert_eq!(sum["reverse"], reverse);
    let h = &sum["hayate"];
    let snd = intervals(lines, "sender");
    let rcv = intervals(lines, "receiver");
    assert!(snd.len() >= 2 && rcv.len() >= 2, "{lines:?}");
    let (snd_origin, rcv_origin) = if reverse {
        ("remote", "local")
    } else {
        ("local", "remote")
    };
    assert!(snd.iter().all(|v| v["origin"] == snd_origin));
    assert!(rcv.iter().all(|v| v["origin"] == rcv_origin));
    assert_eq!((f(snd[0], "end") * 1e3).round(), 1000.0);
    assert_eq!((f(rcv[0], "end") * 1e3).round(), 1000.0);
    // Receiver lines: bytes delivered to the sink per second; they add up to the total.
    let delivered = u(&sum, "bytes");
    assert!(delivered > 0);
    assert_eq!(u(h, "bytes_delivered"), delivered);
    assert_eq!(u(&sum["receiver"], "bytes"), delivered);
    assert_eq!(rcv.iter().map(|v| u(v, "bytes")).sum::<u64>(), delivered);
    assert_eq!(u(rcv.last().unwrap(), "total_bytes"), delivered);
    // Sender lines: data put on the wire; they add up to what the sender reports.
    let sent = u(h, "data_bytes_sent");
    assert!(sent >= delivered);
    assert_eq!(u(&sum["sender"], "bytes"), sent);
    assert_eq!(snd.iter().map(|v| u(v, "bytes")).sum::<u64>(), sent);
    assert_eq!(
        snd.iter().map(|v| u(v, "datagrams")).sum::<u64>(),
        u(h, "data_packets_sent")
    );
    assert_eq!(
        snd.iter()
            .map(|v| u(&v["hayate"], "retransmitted"))
            .sum::<u64>(),
        u(h, "packets_retransmitted")
    );
    // The sender's view each second: RTT and pacing rate.
    for v in &snd {
        let hv = &v["hayate"];
        assert!(f(hv, "rtt_ms") > 0.0 && f(hv, "pacing_bps") > 0.0, "{v}");
        assert!(
            f(hv, "pacing_bps") <= cap_bps * 1.001,
            "pacing above the cap: {v}"
        );
    }
    // Data flowed for about `time_s` (a stall would end the receiver's time early), goodput
    // under the cap, no loss to speak of on loopback. No floor on the goodput: a busy host
    // (a parallel build) can starve an unoptimized core, and that is not what this tests.
    let secs = f(&sum, "duration_s");
    assert!(
        secs > time_s * 0.8 && secs < time_s + 0.5,
        "duration {secs}"
    );
    let goodput = f(h, "goodput_bps");
    assert!((goodput - f(&sum, "throughput_bps")).abs() < 1.0);
    assert!(goodput > 0.0);
    assert!(goodput < cap_bps * 1.02, "goodput {goodput} above the cap");
    assert!(f(h, "loss_percent") < 1.0, "{h}");
    assert!(f(h, "retransmit_percent") < 1.0, "{h}");
    let lp = 100.0 * u(h, "data_bytes_lost") as f64 / sent as f64;
    assert!((f(h, "loss_percent") - lp).abs() < 1e-9);
    // Every completed file verified by BLAKE3, every block matched the pattern. The first
    // file holds ~2 MB (half a second at the initial rate) and goes out before the others:
    // with several times that delivered it has completed.
    assert_eq!(u(h, "files_failed"), 0, "{h}");
    assert_eq!(h["verified"], u(h, "files_verified") > 0, "{h}");
    if delivered > 8_000_000 {
        assert!(u(h, "files_verified") >= 1, "{h}");
    }
    assert_eq!(u(h, "pattern_mismatches"), 0);
    assert_eq!(u(h, "mtu"), 1500);
    // The sender saw the verdicts too, except one crossing its abort at the deadline.
    let sv = u(&sum["sender"]["hayate"], "files_verified");
    let sa = u(&sum["sender"]["hayate"], "files_aborted");
    assert!(
        sv <= u(h, "files_verified") && u(h, "files_verified") <= sv + sa,
        "{sum}"
    );
    sum
}

#[test]
fn hayate_loopback_json_totals_and_plot() {
    let k = key_file("hayate", 5);
    let ks = k.to_str().unwrap();
    let s = Server::start(Some(&k));
    let svg = scratch("hayate.svg");
    let r = client(&[
        &s.addr(),
        "--hayate",
        "--key-file",
        ks,
        "--rate",
        "200M",
        "--time",
        "2",
        "--json",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(r.ok, "{}\n{}", r.stderr, s.log());
    let lines = json_lines(&r.stdout);
    check_hayate_json(&lines, false, 200e6, 2.0);
    // Human lines on stderr: both sides each second, then the summary.
    for want in [
        "+1.000 ",
        " snd ||| ",
        " rcv ||| ",
        "| acked ",
        " retx ",
        " rtt ",
        " pace ",
        "| goodput ",
        "--END-- hayate, ",
        "Total: ",
        "retransmitted ",
        "verified: ",
        "checked by BLAKE3 end to end",
        "every delivered block matched the pattern",
    ] {
        assert!(r.stderr.contains(want), "no {want:?} in\n{}", r.stderr);
    }
    // The plot: goodput per second and the sender's retransmitted share.
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
    for id in ["throughput", "retransmitted"] {
        let pl = doc
            .descendants()
            .find(|n| n.attribute("id") == Some(id))
            .unwrap_or_else(|| panic!("no series {id}"));
        let n = pl.attribute("points").unwrap().split_whitespace().count();
        assert!(n >= 2, "{id}: {n} points");
    }
    let texts: String = doc.descendants().filter_map(|n| n.text()).collect();
    assert!(texts.contains("retransmitted (%)"));
    std::fs::remove_file(&svg).ok();
}

#[test]
fn hayate_reverse_loopback() {
    let k = key_file("hayate-rev", 6);
    let ks = k.to_str().unwrap();
    let s = Server::start(Some(&k));
    let r = client(&[
        &s.addr(),
        "--hayate",
        "--reverse",
        "--key-file",
        ks,
        "--rate",
        "200M",
        "--time",
        "2",
        "--json",
    ]);
    assert!(r.ok, "{}\n{}", r.stderr, s.log());
    check_hayate_json(&json_lines(&r.stdout), true, 200e6, 2.0);
    // Human output on stdout without --json.
    let r = client(&[
        &s.addr(),
        "--hayate",
        "--reverse",
        "--key-file",
        ks,
        "--rate",
        "100M",
        "--time",
        "1",
    ]);
    assert!(r.ok, "{}\n{}", r.stderr, s.log());
    assert!(r.stdout.contains(" rcv ||| "), "{}", r.stdout);
    assert!(r.stdout.contains(" snd ||| "));
    assert!(r.stdout.contains("--END-- hayate, "));
    assert!(r.stdout.contains("verified: "), "{}", r.stdout);
    assert!(
        s.log()
            .contains("Hayate reverse (we send), 2 s, key proved"),
        "{}",
        s.log()
    );
}

#[test]
fn hayate_needs_the_key() {
    // No key on the client: refused before anything is sent.
    let r = client(&["127.0.0.1:1", "--hayate", "--time", "1"]);
    assert!(!r.ok);
    assert!(
        r.stderr.contains("--hayate needs --key-file on both sides"),
        "{}",
        r.stderr
    );
    // No key on the server.
    let k = key_file("hayate-client-only", 7);
    let s = Server::start(None);
    let r = client(&[
        &s.addr(),
        "--hayate",
        "--key-file",
        k.to_str().unwrap(),
        "--time",
        "1",
    ]);
    assert!(!r.ok);
    assert!(
        r.stderr
            .contains("server has no key; --hayate tests need `--key-file` on both sides"),
        "{}",
        r.stderr
    );
    // A different key: the control handshake refuses it (no UDP port is even opened).
    let good = key_file("hayate-server", 8);
    let s = Server::start(Some(&good));
    let r = client(&[
        &s.addr(),
        "--hayate",
        "--key-file",
        k.to_str().unwrap(),
        "--time",
        "1",
    ]);
    assert!(!r.ok);
    assert!(r.stderr.contains("authentication failed"), "{}", r.stderr);
}

#[test]
fn bench_mem_positive() {
    let out = Command::new(BIN)
        .args([
            "mem",
            "--size",
            "8M",
            "--threads",
            "2",
            "--iterations",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let lines = json_lines(std::str::from_utf8(&out.stdout).unwrap());
    assert_eq!(lines.len(), 4);
    for (v, (op, t)) in lines
        .iter()
        .zip([("fill", 1), ("copy", 1), ("fill", 2), ("copy", 2)])
    {
        assert_eq!(v["op"], op);
        assert_eq!(u(v, "threads"), t);
        assert!(v["gb_per_s"].as_f64().unwrap() > 0.0);
    }
}
