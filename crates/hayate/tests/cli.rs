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

/// `--json` with a copy that cannot start: exactly one object, with the error and nothing
/// that was not measured, and the exit code of that failure.
fn assert_json_error(r: &Run, code: i32, says: &str) {
    assert_eq!(r.status.code(), Some(code), "{r:#?}");
    let j = r.json();
    let e = j["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {r:#?}"));
    assert!(e.contains(says), "{says:?} not in {e:?}");
    assert_eq!(j["verified"], false, "{j}");
    for absent in [
        "bytes",
        "seconds",
        "goodput_bps",
        "srtt_ms",
        "blake3",
        "loss_ratio",
    ] {
        assert!(j.get(absent).is_none(), "{absent} was not measured: {j}");
    }
    // The error is still said on stderr, once.
    assert_eq!(r.stderr.matches(says).count(), 1, "{r:#?}");
}

#[test]
fn json_is_one_object_when_the_copy_cannot_start() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("f");
    std::fs::write(&f, b"data").unwrap();
    let f = f.to_str().unwrap();
    // Wrong arguments found after parsing (exit 2).
    let r = run(&["cp", "--json", f, "/tmp/elsewhere"]);
    assert_json_error(&r, 2, "one side must be remote");
    let r = run(&["cp", "--json", "--rate", "1M", "--rate-min", "2M", f, "h:x"]);
    assert_json_error(&r, 2, "--rate-min is above --rate");
    let r = run(&["cp", "--json", "--fixed", "--policy", "low", f, "h:x"]);
    assert_json_error(&r, 2, "--policy makes no sense with --fixed");
    let r = run(&["cp", "--json", "--policy", "greedy", f, "h:x"]);
    assert_json_error(&r, 2, "unknown policy `greedy` (known: fair, low)");
    // Refused by the parser itself (exit 2).
    let r = run(&["cp", "--bogus", "--json", f, "h:x"]);
    assert_json_error(&r, 2, "unexpected argument '--bogus'");
    // A key file that cannot be read (exit 1).
    let key = tmp.path().join("no-key");
    let url = "hayate://127.0.0.1:9/x";
    let r = run(&["cp", "--json", "--key-file", key.to_str().unwrap(), f, url]);
    assert_json_error(&r, 1, "cannot read key file");
    // A key file that is not a key.
    let r = run(&["cp", "--json", "--key-file", f, f, url]);
    assert_json_error(&r, 1, "malformed key file");
    // ssh that fails, and ssh that cannot be run at all.
    let r = run(&["cp", "--json", "-e", "false", f, "somehost:x"]);
    assert_json_error(&r, 1, "ssh to somehost failed (exit 1)");
    let r = run(&["cp", "--json", "-e", "/nonexistent/ssh", f, "somehost:x"]);
    assert_json_error(&r, 1, "cannot run /nonexistent/ssh");
    // Help is not an error: no JSON.
    let r = run(&["cp", "--json", "--help"]);
    r.assert_ok();
    assert!(!r.stdout.starts_with('{'), "{r:#?}");
}

#[test]
fn man_page_is_roff_and_describes_cp_and_its_options() {
    let r = run(&["man"]);
    r.assert_ok();
    let m = &r.stdout;
    assert!(m.contains("\n.TH hayate 1 "), "{m}");
    assert!(m.contains("\n.SH NAME\n"), "{m}");
    // cp has its own section with the plain synopsis, and its options are listed (roff
    // writes a dash as \-).
    let cp = at(m, "\n.SH \"HAYATE CP\"\n");
    let serve = at(m, "\n.SH \"HAYATE SERVE\"\n");
    let cp_part = &m[cp..serve.max(cp)];
    assert!(cp_part.contains("\\fBhayate cp\\fR"), "{cp_part}");
    assert!(cp_part.contains("SOURCE... DEST"), "{cp_part}");
    // Each option is an item of its own: `.TP`, then the option in bold.
    for opt in [
        r"\fB\-\-bwlimit\fR \fI<RATE>\fR",
        r"\fB\-\-remote\-path\fR",
        r"\fB\-\-json\fR",
        r"\fB\-\-progress\fR",
        r"\fB\-i\fR \fI<KEY>\fR",
        r"\fB\-l\fR \fI<KBIT>\fR",
        r"\fB\-4\fR",
    ] {
        assert!(
            cp_part.contains(&format!(".TP\n{opt}")),
            "{opt} not an item of the cp section:\n{cp_part}"
        );
    }
    // The examples stay laid out as written (no filling).
    assert!(cp_part.contains(".nf\n"), "{cp_part}");
    assert!(
        cp_part.contains("  hayate cp big.iso me@server:isos/ "),
        "{cp_part}"
    );
    // Every line is roff: none starts with a stray dot that is not a request.
    for l in m.lines() {
        if let Some(rest) = l.strip_prefix('.') {
            assert!(
                rest.starts_with(|c: char| c.is_ascii_alphabetic()),
                "stray line {l:?}"
            );
        }
    }
}

#[test]
fn completions_name_cp_and_its_options_for_each_shell() {
    for (shell, marks) in [
        (
            "bash",
            &["_hayate()", "cp)", "--bwlimit", "--remote-path"][..],
        ),
        ("zsh", &["#compdef hayate", "'cp:", "--bwlimit"]),
        ("fish", &["complete -c hayate", "-a \"cp\"", "-l bwlimit"]),
    ] {
        let r = run(&["completions", shell]);
        r.assert_ok();
        for m in marks {
            assert!(r.stdout.contains(m), "{shell}: {m:?} not in:\n{}", r.stdout);
        }
    }
    let r = run(&["completions", "tcsh"]);
    assert_eq!(r.status.code(), Some(2), "{r:#?}");
}

/// `hayate clean` lists exactly the regular files named `.NAME.hayate-part` and
/// `.NAME.hayate-state` beneath PATH, with sizes; `--delete` removes those and nothing
/// else, and no link (to a file or a directory) is followed.
#[test]
fn clean_lists_and_deletes_only_partial_copies_and_follows_no_link() {
    use std::fs;
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("data");
    let out = tmp.path().join("outside");
    fs::create_dir_all(d.join("sub/deep")).unwrap();
    fs::create_dir_all(&out).unwrap();
    fs::write(d.join(".a.bin.hayate-part"), vec![7u8; 123_456]).unwrap();
    fs::write(d.join(".a.bin.hayate-state"), b"state").unwrap();
    fs::write(d.join("sub/deep/.x.hayate-part"), vec![1u8; 2_000_000]).unwrap();
    // Not ours: no name before the suffix, no leading dot, another suffix, the file itself.
    for keep in [
        ".hayate-part",
        "a.hayate-part",
        ".a.hayate-part.old",
        "a.bin",
    ] {
        fs::write(d.join(keep), b"keep").unwrap();
    }
    // A directory and a FIFO with our names are not files to remove.
    fs::create_dir(d.join(".dir.hayate-part")).unwrap();
    let fifo = std::ffi::CString::new(d.join(".f.hayate-part").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    // Links leading out: to a directory with a partial file, and named like one.
    fs::write(out.join(".o.hayate-part"), b"outside").unwrap();
    symlink(&out, d.join("sub/out")).unwrap();
    symlink(out.join(".o.hayate-part"), d.join(".l.hayate-part")).unwrap();

    let ds = d.to_str().unwrap();
    let r = run(&["clean", ds]);
    r.assert_ok();
    let want_lines = [
        format!("  123.5 kB  {ds}/.a.bin.hayate-part"),
        format!("       5 B  {ds}/.a.bin.hayate-state"),
        format!("    2.0 MB  {ds}/sub/deep/.x.hayate-part"),
    ];
    let listed: Vec<&str> = r.stdout.lines().filter(|l| l.contains(ds)).collect();
    assert_eq!(listed, want_lines, "{r:#?}");
    assert!(
        r.stdout
            .contains("3 files, 2.1 MB, left by interrupted copies"),
        "{r:#?}"
    );
    // Listing removed nothing.
    assert!(d.join(".a.bin.hayate-part").exists());

    let r = run(&["clean", "--delete", ds]);
    r.assert_ok();
    assert!(r.stdout.contains("removed 3 files, 2.1 MB"), "{r:#?}");
    let left = common::tree(&d);
    assert_eq!(
        left,
        [
            ".a.hayate-part.old",
            ".dir.hayate-part",
            ".f.hayate-part",
            ".hayate-part",
            ".l.hayate-part",
            "a.bin",
            "a.hayate-part",
            "sub",
            "sub/deep",
            "sub/out",
        ],
        "{r:#?}"
    );
    assert_eq!(fs::read(out.join(".o.hayate-part")).unwrap(), b"outside");
    let r = run(&["clean", ds]);
    r.assert_ok();
    assert!(r.stdout.contains("no partial copies beneath"), "{r:#?}");
    // A PATH that is not a directory is named.
    let r = run(&["clean", d.join("a.bin").to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(r.stderr.contains("a.bin: Not a directory"), "{r:#?}");
}
