//! Path MTU: copies through network namespaces whose links are narrower or wider than
//! Ethernet's 1500 bytes, as over a VPN or on a jumbo-frame LAN. The handshake must find
//! what the path carries (docs/PROTOCOL.md, "Path MTU"); before it did, a copy over a
//! 1420-byte link acknowledged nothing and never ended.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

/// Network namespaces made for one test, deleted (with their links) when dropped.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("run ip");
    assert!(st.success(), "ip {}", args.join(" "));
}

fn in_ns(ns: &str, args: &[&str]) {
    let st = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .status()
        .expect("run ip netns exec");
    assert!(st.success(), "in {ns}: {}", args.join(" "));
}

/// Namespaces `c` (the client) and `s` (the server), and with `router` a third between
/// them. The link from `c` is `first` bytes; the router's link to `s` is `second`. Returns
/// the namespaces' names and the server's address, or `None` (after saying SKIP, or failing
/// under CI) where namespaces cannot be made.
fn topology(tag: &str, net: u8, first: u16, second: Option<u16>) -> Option<(Namespaces, String)> {
    let id = std::process::id() % 100_000;
    let name = |n: &str| format!("hm{id}{tag}{n}");
    let ok = Command::new("ip")
        .args(["netns", "add", &name("c")])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        common::sshd::skip_unless_ci("cannot create a network namespace (needs root and iproute2)");
        return None;
    }
    let mut nss = Namespaces(vec![name("c")]);
    let link = |a: &str, ns_a: &str, b: &str, ns_b: &str, mtu: u16, sub: &str| {
        ip(&[
            "link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b, "netns", ns_b,
        ]);
        for (dev, ns, host) in [(a, ns_a, "1"), (b, ns_b, "2")] {
            in_ns(
                ns,
                &["ip", "addr", "add", &format!("{sub}.{host}/24"), "dev", dev],
            );
            in_ns(
                ns,
                &["ip", "link", "set", dev, "mtu", &mtu.to_string(), "up"],
            );
        }
    };
    let sub1 = format!("10.{net}.1");
    let server = match second {
        None => {
            ip(&["netns", "add", &name("s")]);
            nss.0.push(name("s"));
            link(&name("a"), &name("c"), &name("b"), &name("s"), first, &sub1);
            format!("{sub1}.2")
        }
        Some(inner) => {
            let sub2 = format!("10.{net}.2");
            for n in ["r", "s"] {
                ip(&["netns", "add", &name(n)]);
                nss.0.push(name(n));
            }
            link(&name("a"), &name("c"), &name("b"), &name("r"), first, &sub1);
            link(&name("d"), &name("r"), &name("e"), &name("s"), inner, &sub2);
            in_ns(&name("r"), &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
            in_ns(
                &name("c"),
                &["ip", "route", "add", "default", "via", &format!("{sub1}.2")],
            );
            in_ns(
                &name("s"),
                &["ip", "route", "add", "default", "via", &format!("{sub2}.1")],
            );
            format!("{sub2}.2")
        }
    };
    for ns in &nss.0 {
        in_ns(ns, &["ip", "link", "set", "lo", "up"]);
    }
    Some((nss, server))
}

/// `hayate serve` in namespace `ns` on `addr:5300`, up and listening.
fn serve_in(ns: &str, addr: &str, root: &Path, key: &Path) -> Running {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, BIN, "serve", "--listen"])
        .arg(format!("{addr}:5300"))
        .arg("--root")
        .arg(root)
        .arg("--key-file")
        .arg(key)
        .env_remove("HAYATE_KEY_FILE")
        .env("XDG_CACHE_HOME", test_cache_home());
    let server = spawn_cmd(&mut cmd);
    assert!(
        eventually(Duration::from_secs(20), || server
            .stderr()
            .contains("listening on")),
        "hayate serve did not start: {}",
        server.stderr().text()
    );
    server
}

/// `hayate cp --json ARGS...` from namespace `ns`.
fn cp_in(ns: &str, key: &Path, args: &[&str]) -> Run {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, BIN, "cp", "--json", "--key-file"])
        .arg(key)
        .args(args)
        .env_remove("HAYATE_KEY_FILE")
        .env("XDG_CACHE_HOME", test_cache_home());
    spawn_cmd(&mut cmd).wait(Duration::from_secs(60))
}

/// Up and back through the path; both copies byte-exact, the first at the MTU `expect`,
/// the second within `again`.
fn round_trip(
    tag: &str,
    net: u8,
    first: u16,
    second: Option<u16>,
    expect: u64,
    again: std::ops::RangeInclusive<u64>,
) {
    let Some((nss, server)) = topology(tag, net, first, second) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "key");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let src = dir.path().join("src.bin");
    let h = write_random(&src, 8 << 20, net as u64);
    let s_ns = nss.0.last().unwrap().clone();
    let _server = serve_in(&s_ns, &server, &root, &key);
    let url = format!("hayate://{server}:5300/f.bin");

    let up = cp_in(&nss.0[0], &key, &[src.to_str().unwrap(), &url]);
    up.assert_ok();
    let j = up.json();
    assert_eq!(j["mtu"], expect, "up: {j}");
    assert_eq!(hash_file(&root.join("f.bin")), h);

    let back = dir.path().join("back.bin");
    let down = cp_in(&nss.0[0], &key, &[&url, back.to_str().unwrap()]);
    down.assert_ok();
    let mtu = down.json()["mtu"].as_u64();
    assert!(
        mtu.is_some_and(|m| again.contains(&m)),
        "down: {}",
        down.stdout
    );
    assert_eq!(hash_file(&back), h);
}

/// A link of 1420 bytes (a WireGuard tunnel's): the client offers what its interface takes.
#[test]
fn a_narrow_link_is_used_at_its_own_mtu() {
    round_trip("n", 171, 1420, None, 1420, 1420..=1420);
}

/// A jumbo-frame LAN: 9000-byte datagrams, the default limit.
#[test]
fn a_jumbo_link_is_used_whole() {
    round_trip("j", 172, 9000, None, 9000, 9000..=9000);
}

/// The client's own link takes 9000 bytes, a hop beyond it only 1420: the 9000 and 1500
/// hellos vanish there, and the handshake settles one rung lower. The router's ICMP
/// "fragmentation needed" teaches the client's kernel the hop's 1420, which the next
/// session's offer takes from the route.
#[test]
fn a_narrow_hop_beyond_the_first_link_is_found() {
    round_trip("h", 173, 9000, Some(1420), 1400, 1400..=1420);
}
