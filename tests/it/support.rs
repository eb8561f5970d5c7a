//! Helpers shared by the end-to-end tests: running the built binary, locating fixtures.

use std::path::{Path, PathBuf};
use std::process::Output;

/// The repository root (where Cargo.toml is).
pub(crate) fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `tests/fixtures/<rel>`.
pub(crate) fn fixture(rel: &str) -> PathBuf {
    repo_root().join("tests/fixtures").join(rel)
}

/// Runs the built `proxops` binary with `args`, from the repository root.
pub(crate) fn proxops(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_proxops"))
        .args(args)
        .current_dir(repo_root())
        .env_remove("RUST_LOG")
        .output()
        .expect("the proxops binary runs")
}

/// Stdout as text.
pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Stderr as text.
pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A running process's peak resident set size so far (`VmHWM` of `/proc/<pid>/status`), in KiB.
pub(crate) fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

/// `kill <which> <pid>` (`-TERM`, `-HUP`, ...), asserting it was delivered.
pub(crate) fn signal(pid: u32, which: &str) {
    let status = std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {which} {pid}");
}

/// SIGTERM to `child`, then waits up to `limit` for it to exit.
pub(crate) fn terminate(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> std::process::ExitStatus {
    signal(child.id(), "-TERM");
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {} did not stop on SIGTERM",
            child.id()
        );
        std::thread::park_timeout(std::time::Duration::from_millis(50));
    }
}
