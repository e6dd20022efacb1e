//! The command line itself, on the real binary: help texts, usage lines, and what is said
//! before any copy starts.

mod common;

use common::{hayate, Run};

fn run(args: &[&str]) -> Run {
    common::run(args)
}

/// Where `needle` first appears in `hay`, failing with the whole text when it does not.
fn at(hay: &str, needle: &str) -> usize {
    hay.find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in:\n{hay}"))
}

#[test]
fn top_level_help_shows_cp_over_ssh_first() {
    let r = run(&["--help"]);
    r.assert_ok();
    let h = &r.stdout;
    // cp is the first command listed, and its line names the ssh form before hayate://.
    let cp_line = h
        .lines()
        .find(|l| l.trim_start().starts_with("cp "))
        .unwrap_or_else(|| panic!("no cp line:\n{h}"));
    assert!(at(h, "  cp ") < at(h, "  serve "), "{h}");
    assert!(
        at(cp_line, "[USER@]HOST:PATH") < at(cp_line, "hayate://"),
        "{cp_line}"
    );
    // The examples: an ssh upload and download before the hayate:// one.
    let up = at(h, "hayate cp big.iso me@server:isos/");
    let down = at(h, "hayate cp me@server:/data/big.iso .");
    let daemon = at(h, "hayate cp --key-file KEY big.iso hayate://server:5300/");
    assert!(up < down && down < daemon, "{h}");
}

#[test]
fn cp_help_has_a_plain_usage_line_and_ssh_first() {
    for args in [&["cp", "--help"][..], &["help", "cp"], &["cp", "-h"]] {
        let r = run(args);
        r.assert_ok();
        let h = &r.stdout;
        assert!(
            h.contains("Usage: hayate cp [OPTIONS] SOURCE... DEST\n"),
            "{args:?}:\n{h}"
        );
        assert!(!h.contains("<SRC... DST>"), "{h}");
        assert!(!h.contains("DST> <"), "{h}");
        // The first line describes cp with the ssh form before hayate://.
        let first = h.lines().next().unwrap();
        assert!(
            at(first, "[USER@]HOST:PATH") < at(first, "hayate://"),
            "{first}"
        );
        assert!(h.contains("<SOURCE>..."), "{h}");
        assert!(h.contains("<DEST>"), "{h}");
    }
    // The long help (--help) explains both forms, ssh first, and the exit codes.
    let h = run(&["cp", "--help"]).stdout;
    let ssh = at(&h, "[USER@]HOST:PATH           over your own ssh");
    let daemon = at(
        &h,
        "hayate://HOST[:PORT]/PATH  a running `hayate serve --root DIR`",
    );
    assert!(ssh < daemon, "{h}");
    assert!(h.contains("Exit codes: 0 all verified"), "{h}");
    assert!(h.contains("130 interrupted"), "{h}");
}

#[test]
fn cp_usage_errors_show_the_plain_usage() {
    let r = run(&["cp", "only-one"]);
    assert_eq!(r.status.code(), Some(2), "{r:#?}");
    assert!(
        r.stderr
            .contains("Usage: hayate cp [OPTIONS] SOURCE... DEST"),
        "{r:#?}"
    );
}

#[test]
fn serve_usage_says_root_is_required_or_stdio() {
    let r = run(&["serve", "--help"]);
    r.assert_ok();
    let h = &r.stdout;
    assert!(
        h.contains("Usage: hayate serve --root DIR [--key-file FILE] [OPTIONS]\n"),
        "{h}"
    );
    assert!(h.contains("       hayate serve --stdio [OPTIONS]"), "{h}");
    assert!(h.contains("(required unless --stdio)"), "{h}");
    // And it is enforced, naming the missing option.
    let r = common::spawn_cmd(hayate().args(["serve", "--key-file", "/nonexistent"]))
        .wait(std::time::Duration::from_secs(30));
    assert_eq!(r.status.code(), Some(2), "{r:#?}");
    assert!(r.stderr.contains("--root <DIR>"), "{r:#?}");
}
