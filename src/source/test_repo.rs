//! Test fixture: a real git repository in a temp dir, driven with the `git` binary.
//!
//! `TestRepo` holds a bare "server" repository (`origin.git`, what a source fetches from) and a
//! work repository whose commits are pushed to it, so tests can commit, force-push and delete
//! branches exactly as a user would. `GitDaemon` serves the temp dir over `git://` on
//! 127.0.0.1 and is killed on drop. Every `git` runs with `GIT_CONFIG_GLOBAL=/dev/null`,
//! `GIT_CONFIG_NOSYSTEM=1` and a fixed author/committer identity, so the host's config cannot
//! change what a test sees.
//!
//! The same file is compiled into the end-to-end test binary (`tests/it/git_server.rs`), so it
//! uses nothing but `std` and `tempfile`. Test setup failures panic: that is a failed test.

#![allow(
    dead_code,
    unreachable_pub,
    reason = "a fixture library shared by two test crates; each uses a subset"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "fixture setup failures are test failures"
)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The branch a new `TestRepo` starts on.
pub const DEFAULT_BRANCH: &str = "main";

/// A served bare repository plus the work repository that pushes to it.
pub struct TestRepo {
    dir: tempfile::TempDir,
}

impl TestRepo {
    /// An empty repository on `main`, with nothing pushed yet.
    pub fn new() -> TestRepo {
        let dir = tempfile::tempdir().expect("temp dir for a test repository");
        let repo = TestRepo { dir };
        git(
            repo.dir.path(),
            &[
                "init",
                "--quiet",
                "--bare",
                "-b",
                DEFAULT_BRANCH,
                "origin.git",
            ],
        );
        // A forge lets a user delete the default branch; a bare `git init` does not.
        git(
            &repo.bare_path(),
            &["config", "receive.denyDeleteCurrent", "ignore"],
        );
        git(
            repo.dir.path(),
            &["init", "--quiet", "-b", DEFAULT_BRANCH, "work"],
        );
        repo.git(&[
            "remote",
            "add",
            "origin",
            &repo.bare_path().to_string_lossy(),
        ]);
        repo
    }

    /// The directory holding `origin.git` and `work` (a `git daemon --base-path`).
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The bare repository that sources fetch from.
    pub fn bare_path(&self) -> PathBuf {
        self.dir.path().join("origin.git")
    }

    /// The work repository in which commits are made.
    pub fn work_path(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// `file://` URL of the bare repository.
    pub fn url(&self) -> String {
        format!("file://{}", self.bare_path().display())
    }

    /// Writes `contents` to `path` (relative to the work tree), creating directories.
    pub fn write(&self, path: &str, contents: impl AsRef<[u8]>) -> &TestRepo {
        let file = self.work_path().join(path);
        std::fs::create_dir_all(file.parent().expect("a file path has a parent")).unwrap();
        std::fs::write(file, contents).unwrap();
        self
    }

    /// Removes `path` (a file or directory) from the work tree.
    pub fn remove(&self, path: &str) -> &TestRepo {
        let target = self.work_path().join(path);
        if target.is_dir() {
            std::fs::remove_dir_all(target).unwrap();
        } else {
            std::fs::remove_file(target).unwrap();
        }
        self
    }

    /// Commits everything in the work tree and returns the commit id (full hex). Not pushed.
    pub fn commit(&self, message: &str) -> String {
        self.git(&["add", "--all"]);
        self.git(&["commit", "--quiet", "--allow-empty", "-m", message]);
        self.head()
    }

    /// Writes `files`, commits them and pushes the current branch; returns the commit id.
    pub fn commit_files(&self, files: &[(&str, &str)], message: &str) -> String {
        for (path, contents) in files {
            self.write(path, contents);
        }
        let commit = self.commit(message);
        self.push();
        commit
    }

    /// Pushes the current branch to the bare repository (fast-forward only).
    pub fn push(&self) {
        self.git(&["push", "--quiet", "origin", "HEAD"]);
    }

    /// Pushes the current branch with `--force`.
    pub fn force_push(&self) {
        self.git(&["push", "--quiet", "--force", "origin", "HEAD"]);
    }

    /// Moves the current branch of the work repository to `rev` (`git reset --hard`).
    pub fn reset_hard(&self, rev: &str) {
        self.git(&["reset", "--quiet", "--hard", rev]);
    }

    /// Creates `branch` at the current commit and switches to it.
    pub fn switch_new(&self, branch: &str) {
        self.git(&["switch", "--quiet", "-c", branch]);
    }

    /// Deletes `branch` from the bare repository.
    pub fn delete_remote_branch(&self, branch: &str) {
        self.git(&["push", "--quiet", "origin", "--delete", branch]);
    }

    /// The current commit of the work repository (full hex).
    pub fn head(&self) -> String {
        self.git(&["rev-parse", "HEAD"])
    }

    /// Runs `git` in the work repository and returns its trimmed stdout.
    pub fn git(&self, args: &[&str]) -> String {
        git(&self.work_path(), args)
    }

    /// Serves the bare repository over `git://127.0.0.1:<port>/origin.git`.
    pub fn serve(&self) -> GitDaemon {
        GitDaemon::start(self.root())
    }
}

impl Default for TestRepo {
    fn default() -> TestRepo {
        TestRepo::new()
    }
}

/// A `git` command isolated from the host's and user's configuration.
pub fn git_command(dir: &Path) -> Command {
    isolated("git", dir)
}

/// `program` (a git program) in `dir`, isolated from the host's and user's configuration.
fn isolated(program: impl AsRef<std::ffi::OsStr>, dir: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "ProxOps Test")
        .env("GIT_AUTHOR_EMAIL", "test@proxops.invalid")
        .env("GIT_COMMITTER_NAME", "ProxOps Test")
        .env("GIT_COMMITTER_EMAIL", "test@proxops.invalid")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .stdin(Stdio::null());
    command
}

/// Runs `git args` in `dir`, panicking with its stderr on failure; returns trimmed stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let output = git_command(dir)
        .args(args)
        .output()
        .expect("the git binary runs");
    assert!(
        output.status.success(),
        "git {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A 127.0.0.1 port that nothing listens on (bound once, then released).
pub fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `git daemon` serving a directory on 127.0.0.1; killed on drop.
pub struct GitDaemon {
    child: Child,
    port: u16,
}

impl GitDaemon {
    /// How long the daemon may take to start listening.
    const STARTUP: Duration = Duration::from_secs(10);

    /// Serves every repository below `base_path` (pushes allowed) on a free port.
    pub fn start(base_path: &Path) -> GitDaemon {
        let port = closed_port();
        // `git daemon` execs `git-daemon` as a child, which killing `git` would orphan (still
        // listening): run the real program so that drop stops the server.
        let exec_path = git(base_path, &["--exec-path"]);
        let mut child = isolated(Path::new(&exec_path).join("git-daemon"), base_path)
            .args([
                "--reuseaddr",
                "--export-all",
                "--enable=receive-pack",
                "--informative-errors",
                "--listen=127.0.0.1",
            ])
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base_path.display()))
            .arg(base_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("git daemon starts");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Self::STARTUP;
        // Poll with connects instead of sleeping: the daemon binds within milliseconds.
        while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("git daemon exited before listening on {addr}: {status}");
            }
            if Instant::now() > deadline {
                child.kill().ok();
                panic!(
                    "git daemon did not listen on {addr} within {:?}",
                    Self::STARTUP
                );
            }
        }
        GitDaemon { child, port }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `git://` URL of `repo` (a path below the base path, e.g. `origin.git`).
    pub fn url(&self, repo: &str) -> String {
        format!("git://127.0.0.1:{}/{repo}", self.port)
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}
