//! Helpers shared by the end-to-end tests: running the built binary, locating fixtures, and
//! (in [`agent`]) the agent's agent.toml and the agent as a child process.

pub(crate) mod agent;
pub(crate) mod forge;
pub(crate) mod notify;
pub(crate) mod pmxcfs;

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
