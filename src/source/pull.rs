//! Fetching a pull request's head for a plan preview (issue 18 item 3).
//!
//! GitHub and Gitea (so Forgejo) both publish each pull request's head as
//! `refs/pull/<number>/head` in the base repository: GitHub "Checking out pull requests
//! locally" (docs.github.com: `git fetch origin pull/ID/head:BRANCHNAME`); Gitea
//! `PullRequest.GetGitRefName` returns `refs/pull/<index>/head` (go-gitea/gitea
//! `models/issues/pull.go`, `PullPrefix = "refs/pull/"`; assumed from its documentation and
//! that name, the file was not fetched).
//!
//! Isolation: previews use their own bare mirror ([`preview_state_dir`] under the state
//! directory), never the followed branch's mirror, so a pull request's head can never become
//! the followed branch's ref, the enforced revision or the applied one, and a preview fetch
//! never waits for (or holds) the lock of a pass's fetch. The head is fetched with depth 1
//! (no history, no blob older than the head) into `refs/proxops/pull/<number>` with a forcing
//! refspec, and its manifest files are read from its tree under the same revision budget as
//! any revision (`git::tree::read_manifest_files`). The token, the ssh settings, the
//! credential rule (token only to the configured scheme, host and port) and the no-redirect
//! rule are those of the followed source: this is the same [`GitSource`], opened on another
//! directory.

use std::path::{Path, PathBuf};
use std::sync::PoisonError;
use std::sync::atomic::{AtomicBool, Ordering};

use gix::bstr::BString;
use gix::remote::Direction;

use super::git::{GitSource, SourceError, tree};

/// A fetched pull request head.
#[derive(Debug)]
pub struct PullHead {
    /// The commit `refs/pull/<n>/head` pointed to, full hex.
    pub commit: String,
    /// Its manifest files, or why they were refused (over the revision budget, unreadable).
    pub files: Result<std::collections::BTreeMap<String, String>, SourceError>,
}

/// Where the previews' mirror lives: `<state_dir>/previews` (its own `git/` inside).
pub fn preview_state_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("previews")
}

/// The remote ref of pull request `number`'s head.
pub fn pull_head_ref(number: u64) -> String {
    format!("refs/pull/{number}/head")
}

/// The private ref the head is fetched into (never under `refs/heads` or `refs/remotes`).
pub fn private_ref(number: u64) -> String {
    format!("refs/proxops/pull/{number}")
}

impl GitSource {
    /// Fetches `refs/pull/<number>/head` (depth 1) into [`private_ref`] and reads the
    /// manifest files of that commit under the revision budget. Blocks.
    ///
    /// # Errors
    /// The remote cannot be reached or has no such ref. A tree over budget is
    /// [`PullHead::files`]'s error: the commit is known then.
    pub fn fetch_pull(&self, number: u64, interrupt: &AtomicBool) -> Result<PullHead, SourceError> {
        let _one_at_a_time = self.fetching.lock().unwrap_or_else(PoisonError::into_inner);
        let remote_ref = pull_head_ref(number);
        let local_ref = private_ref(number);
        let fetch_error = |source| SourceError::Fetch {
            url: self.display_url.clone(),
            branch: remote_ref.clone(),
            source,
        };
        let repo = self.open_mirror()?;
        let refspec = format!("+{remote_ref}:{local_ref}");
        let remote = repo
            .remote_at_without_url_rewrite(self.url.clone())
            .and_then(|remote| remote.with_refspecs([refspec.as_str()], Direction::Fetch))
            .map_err(fetch_error)?
            .with_fetch_tags(gix::remote::fetch::Tags::None);
        let mut connection = super::git::connect(&remote).map_err(fetch_error)?;
        // The same credentials as the followed branch's fetch: the token only for its remote.
        connection.set_credentials(super::git::token_credentials(
            self.token.clone(),
            self.url.clone(),
        ));
        let prepare = connection
            .prepare_fetch(
                gix::progress::Discard,
                gix::remote::ref_map::Options::default(),
            )
            .map_err(fetch_error)?;
        let wanted = BString::from(remote_ref.clone());
        let advertised = prepare
            .ref_map()
            .mappings
            .iter()
            .any(|mapping| mapping.remote.as_name() == Some(wanted.as_ref()));
        if !advertised {
            return Err(SourceError::BranchNotFound {
                url: self.display_url.clone(),
                branch: remote_ref,
            });
        }
        let depth_one = gix::remote::fetch::Shallow::DepthAtRemote(1.try_into().expect("1 > 0"));
        let received = prepare
            .with_shallow(depth_one)
            .receive(gix::progress::Discard, interrupt);
        if interrupt.load(Ordering::Relaxed) {
            return Err(SourceError::Interrupted {
                url: self.display_url.clone(),
                branch: remote_ref,
            });
        }
        received.map_err(fetch_error)?;
        let mirror_error = |source| SourceError::Mirror {
            path: self.mirror_path().to_path_buf(),
            source,
        };
        let mut reference = repo
            .find_reference(local_ref.as_str())
            .map_err(mirror_error)?;
        let commit = reference.peel_to_id().map_err(mirror_error)?.detach();
        Ok(PullHead {
            commit: commit.to_string(),
            files: tree::read_manifest_files(&repo, commit, &self.sub_path),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::test_repo::TestRepo;

    fn source_of(repo: &TestRepo, state: &Path) -> GitSource {
        let config = crate::config::SourceConfig {
            url: repo.url(),
            branch: "main".to_owned(),
            path: String::new(),
            poll: crate::config::Poll::Every(std::time::Duration::from_secs(60)),
            token: None,
            ssh_key_file: None,
            known_hosts_file: None,
            verify: None,
        };
        GitSource::open(&config, &preview_state_dir(state)).unwrap()
    }

    #[test]
    fn a_pull_head_is_fetched_into_a_private_ref_and_never_moves_the_followed_branch() {
        let repo = TestRepo::new();
        let base = repo.commit_files(&[("vm/a.yaml", "kind: VM\n")], "base");
        repo.switch_new("feature");
        let head = repo.commit_files(&[("vm/b.yaml", "kind: VM\n")], "feature");
        repo.git(&["push", "origin", "HEAD:refs/pull/7/head"]);
        let state = tempfile::tempdir().unwrap();
        let source = source_of(&repo, state.path());
        let revision = source.fetch_pull(7, &AtomicBool::new(false)).unwrap();
        assert_eq!(revision.commit, head);
        assert!(revision.files.unwrap().contains_key("vm/b.yaml"));
        let mirror = gix::open(source.mirror_path()).unwrap();
        assert!(
            mirror
                .try_find_reference("refs/proxops/pull/7")
                .unwrap()
                .is_some()
        );
        assert!(
            mirror
                .try_find_reference("refs/remotes/origin/main")
                .unwrap()
                .is_none(),
            "the followed branch's ref is never written by a preview"
        );
        assert_ne!(revision.commit, base);
    }

    #[test]
    fn a_pull_request_the_remote_does_not_have_is_named_in_the_error() {
        let repo = TestRepo::new();
        repo.commit_files(&[("vm/a.yaml", "kind: VM\n")], "base");
        let state = tempfile::tempdir().unwrap();
        let source = source_of(&repo, state.path());
        let error = source.fetch_pull(9, &AtomicBool::new(false)).unwrap_err();
        assert!(error.to_string().contains("refs/pull/9/head"), "{error}");
    }
}
