//! The test sshd itself: starts, accepts the throwaway key, runs a command.

#[path = "common/sshd.rs"]
mod sshd;

use std::process::Command;

use sshd::Sshd;

#[test]
fn sshd_runs_a_command() {
    let Some(sshd) = Sshd::start() else {
        return;
    };
    assert!(sshd.port() > 0);
    assert!(sshd.target().ends_with("@127.0.0.1"), "{}", sshd.target());
    let cmd = sshd.ssh_command();
    assert!(
        cmd.starts_with(&format!("ssh -p {} -i ", sshd.port())),
        "{cmd}"
    );
    // Through the -e string, as hayate cp will run it (split by a shell).
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("{cmd} {} echo ok", sshd.target()))
        .output()
        .expect("run ssh");
    assert!(
        out.status.success(),
        "ssh failed: {:?} {}; sshd log: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        sshd.log()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    // And through Command, with the remote exit status coming back.
    let st = sshd
        .command()
        .arg(sshd.target())
        .arg("exit 7")
        .status()
        .expect("run ssh");
    assert_eq!(st.code(), Some(7));
}
