//! `hayate man` and `hayate completions SHELL`: both made from the clap definitions, so
//! they say what the binary accepts and never drift from it.

use std::io::{self, Write};

use clap::Command;
use clap_mangen::Man;

/// One page for everything: hayate(1) with its commands, then a section per command (and
/// per `perf`/`bench` subcommand) with its synopsis, description, options and notes.
pub fn man(mut cmd: Command, w: &mut dyn Write) -> io::Result<()> {
    cmd.build();
    let top = Man::new(cmd.clone());
    top.render_title(w)?;
    top.render_name_section(w)?;
    top.render_synopsis_section(w)?;
    top.render_description_section(w)?;
    // The commands are described below on this page, not on pages of their own.
    writeln!(w, ".SH COMMANDS")?;
    for sub in cmd.get_subcommands().filter(|c| c.get_name() != "help") {
        writeln!(w, ".TP\n\\fBhayate {}\\fR", sub.get_name())?;
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        writeln!(w, "{}", escape(about.lines().next().unwrap_or_default()))?;
    }
    if let Some(after) = cmd.get_after_help() {
        notes(w, ".SH EXAMPLES", &after.to_string())?;
    }
    for sub in cmd.get_subcommands() {
        section(w, sub, "hayate")?;
    }
    writeln!(w, ".SH FILES")?;
    writeln!(
        w,
        "Partial copies are kept as .NAME.hayate\\-part and .NAME.hayate\\-state next to \
         their destination until a rerun resumes them; \\fBhayate clean\\fR lists and removes \
         abandoned ones."
    )?;
    top.render_version_section(w)
}

fn section(w: &mut dyn Write, cmd: &Command, parent: &str) -> io::Result<()> {
    if cmd.is_hide_set() || cmd.get_name() == "help" {
        return Ok(());
    }
    let full = format!("{parent} {}", cmd.get_name());
    if cmd.has_subcommands() {
        for sub in cmd.get_subcommands() {
            section(w, sub, &full)?;
        }
        return Ok(());
    }
    writeln!(w, ".SH \"{}\"", full.to_uppercase())?;
    let man = Man::new(cmd.clone().bin_name(&full));
    let mut buf = Vec::new();
    man.render_synopsis_section(&mut buf)?;
    man.render_description_section(&mut buf)?;
    man.render_options_section(&mut buf)?;
    // The page has one level of sections (.SH, one per command); a command's parts are
    // subsections under it.
    let text = String::from_utf8_lossy(&buf);
    for line in text.lines() {
        match line.strip_prefix(".SH ") {
            Some(title) => writeln!(w, ".SS {}", title_case(title))?,
            None => writeln!(w, "{line}")?,
        }
    }
    if let Some(after) = cmd.get_after_help() {
        notes(w, ".SS Notes", &after.to_string())?;
    }
    Ok(())
}

fn title_case(s: &str) -> String {
    let s = s.trim_matches('"').to_lowercase();
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => s,
    }
}

/// Text laid out by hand (examples in columns) kept as it is: no filling, roff's special
/// characters escaped.
fn notes(w: &mut dyn Write, heading: &str, text: &str) -> io::Result<()> {
    writeln!(w, "{heading}")?;
    writeln!(w, ".nf")?;
    for line in text.lines() {
        writeln!(w, "{}", escape(line))?;
    }
    writeln!(w, ".fi")
}

/// A line of text as roff reads it literally.
fn escape(line: &str) -> String {
    let esc = line.replace('\\', "\\e").replace('-', "\\-");
    if esc.starts_with('.') || esc.starts_with('\'') {
        format!("\\&{esc}")
    } else {
        esc
    }
}

/// Completions for `shell`.
pub fn completions(shell: clap_complete::Shell, mut cmd: Command) -> Vec<u8> {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "hayate", &mut buf);
    buf
}

/// Writes `text` to stdout; a reader that stopped early (`| head`) is not an error.
pub fn print(text: &[u8]) -> io::Result<()> {
    match io::stdout().lock().write_all(text) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}
