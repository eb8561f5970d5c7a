//! Git fixtures for end-to-end tests: `TestRepo` (a bare repository in a temp dir plus a work
//! repository that commits, force-pushes and deletes branches with the real `git` binary) and
//! `GitDaemon` (serves it over `git://` on 127.0.0.1, killed on drop).
//!
//! The implementation is `src/source/test_repo.rs`, shared with the unit tests of the git
//! source so both exercise the same fixtures; it needs only `std` and `tempfile`.
//!
//! ```ignore
//! let repo = TestRepo::new();
//! let commit = repo.commit_files(&[("vm/web.yaml", "...")], "add web");
//! let daemon = repo.serve();
//! let url = daemon.url("origin.git"); // or repo.url() for file://
//! ```

#[path = "../../src/source/test_repo.rs"]
mod test_repo;

#[allow(unused_imports, reason = "each end-to-end test uses a subset")]
pub(crate) use test_repo::{DEFAULT_BRANCH, GitDaemon, TestRepo, closed_port, git, git_command};
