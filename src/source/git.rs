//! The agent's git source: one bare mirror of the configured repository under the state
//! directory, fetched with gix on every trigger, and the manifest files of the fetched commit
//! read straight from its tree (never a work tree that could be reset under the user).
//!
//! Layout: `<state_dir>/git/<slug>-<hash>.git` is a bare repository; the configured branch is
//! fetched into `refs/remotes/origin/<branch>` with a forcing refspec, so a force-pushed branch
//! is followed (and reported as such). The remote is anonymous: its URL is never written to the
//! mirror's config, and URL rewriting (`url.*.insteadOf`) is never applied.
//!
//! Isolation: the mirror is created and opened with gix's isolated options — no system, global
//! or user git config, no `GIT_*`, `HOME`, `XDG_*` or `SSH_*` environment. Credentials come
//! only from files named in the config: an https token is answered to gix's credential request
//! (user `git`), an ssh key becomes an in-memory `core.sshCommand`. What still comes from the
//! host: for `file://` gix spawns `git-upload-pack`, and for `ssh://` it spawns `ssh`; those
//! programs inherit the process environment and read their own configuration (the upload-pack
//! side of a local transfer sees the user's git config, `ssh` reads `~/.ssh/config`; host keys
//! come only from `[source] known_hosts_file`, strictly checked). That is the server side of
//! the transfer, as it would be on any forge.
//!
//! Bounded: the mirror is shallow (the tip at first, then the commits since the last fetched
//! one), the https token goes only to the configured host and no redirect is followed, and the
//! manifest files of a commit are sized from their object headers against the revision budget
//! before any is read (SECURITY-AUDIT.md H3, M1, M2).
//! `git://` connections are made by `daemon` (no Nagle, no delayed ACKs), not by gix.
//!
//! One user: `open` clears lock files a killed predecessor left in the mirror, so only one
//! `GitSource` per state directory may exist at a time (one agent per state directory).
//!
//! Blocking: `fetch` blocks; the agent runs it in `spawn_blocking` with an interrupt flag that
//! the shutdown token sets.

mod daemon;
mod remote_url;
pub(super) mod tree;
mod unpack;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use gix::ObjectId;
use gix::bstr::{BString, ByteSlice};
use gix::remote::Direction;
use secrecy::{ExposeSecret, SecretString};

use crate::config::SourceConfig;
use tree::SubPath;

/// The name the mirror gives the remote in its tracking refs (`refs/remotes/origin/<branch>`).
const REMOTE_NAME: &str = "origin";
/// The user name sent with an https token (forges ignore it; git's own convention).
pub(super) const TOKEN_USER: &str = "git";
/// Subdirectory of the state directory that holds the mirrors.
const MIRRORS_DIR: &str = "git";

/// One fetched commit and the manifest files in its tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    /// The commit id, full hex.
    pub commit: String,
    /// Manifest files below the source's sub-path, by `/`-separated path relative to it.
    pub files: BTreeMap<String, String>,
    /// The commit the branch pointed to before this fetch, if it had been fetched before.
    pub previous: Option<String>,
    /// The branch was rewritten: `commit` does not descend from `previous`.
    pub force_pushed: bool,
}

/// Fetching or reading the git source failed. Messages name the remote without credentials.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// `[source] url` cannot be used.
    #[error("invalid source url {url}")]
    InvalidUrl {
        /// The URL, without userinfo.
        url: String,
    },
    /// `[source] url` carries a password; credentials belong in `token_file`.
    #[error("source url {url} carries a password; put the token in token_file instead")]
    PasswordInUrl {
        /// The URL, without userinfo.
        url: String,
    },
    /// `[source] branch` is not a valid branch name.
    #[error("invalid branch name {branch:?}")]
    InvalidBranch {
        /// The configured branch.
        branch: String,
    },
    /// `[source] path` is absolute or leaves the repository.
    #[error("invalid source path {path:?}: it must be relative and stay inside the repository")]
    InvalidPath {
        /// The configured path.
        path: String,
    },
    /// The state directory could not hold the mirror.
    #[error("creating {}", .path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The bare mirror could not be created or opened.
    #[error("opening the git mirror at {}", .path.display())]
    Mirror {
        /// The mirror's directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: gix::Error,
    },
    /// A lock file a killed predecessor left in the mirror could not be removed.
    #[error("removing the stale lock file {}", .path.display())]
    StaleLock {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Talking to the remote failed (unreachable, refused, authentication, protocol).
    #[error("fetching origin/{branch} of {url}")]
    Fetch {
        /// The URL, without userinfo.
        url: String,
        /// The configured branch.
        branch: String,
        /// The cause.
        #[source]
        source: gix::Error,
    },
    /// The remote answered but has no such branch (deleted, or never pushed).
    #[error("branch {branch} not found on the remote {url}")]
    BranchNotFound {
        /// The URL, without userinfo.
        url: String,
        /// The configured branch.
        branch: String,
    },
    /// The interrupt flag was set (shutdown) before the fetch finished.
    #[error("fetching origin/{branch} of {url} was interrupted")]
    Interrupted {
        /// The URL, without userinfo.
        url: String,
        /// The configured branch.
        branch: String,
    },
    /// An object of the fetched commit could not be read from the mirror.
    #[error("reading commit {}", short(.commit))]
    ReadCommit {
        /// The commit.
        commit: ObjectId,
        /// The cause.
        #[source]
        source: gix::Error,
    },
    /// `[source] path` does not exist in the commit.
    #[error("path {path} not found in commit {}", short(.commit))]
    PathNotFound {
        /// Repository-relative path.
        path: String,
        /// The commit.
        commit: ObjectId,
    },
    /// `[source] path` names a file, not a directory, in the commit.
    #[error("path {path} in commit {} is not a directory", short(.commit))]
    NotADirectory {
        /// Repository-relative path.
        path: String,
        /// The commit.
        commit: ObjectId,
    },
    /// A manifest file is larger than any manifest needs to be; refused before it is read.
    #[error(
        "file {path} in commit {} is {bytes} bytes, more than the {} MiB a manifest file may hold",
        short(.commit),
        proxops_core::manifest::MAX_FILE_BYTES / (1024 * 1024)
    )]
    TooLarge {
        /// Repository-relative path of the file.
        path: String,
        /// The commit.
        commit: ObjectId,
        /// Its size.
        bytes: u64,
    },
    /// The manifest files of a commit hold more than a revision may (file count or bytes in
    /// all, from the blob headers); refused before any of them is read.
    #[error(
        "the manifest files below {path} in commit {} are too many or too large: {files} or \
         more files of {bytes} or more bytes, more than the {} files or {} MiB a revision may \
         hold (the largest so far: {largest}, {largest_bytes} bytes); remove large or generated \
         .yaml files, or split the repository between agents",
        short(.commit),
        proxops_core::repository::MAX_REVISION_FILES,
        proxops_core::repository::MAX_REVISION_BYTES / (1024 * 1024)
    )]
    RevisionTooLarge {
        /// The source's sub-path (`.` for the repository root).
        path: String,
        /// The commit.
        commit: ObjectId,
        /// Files counted when a limit was passed.
        files: usize,
        /// Bytes counted when a limit was passed.
        bytes: u64,
        /// Repository-relative path of the largest file counted.
        largest: String,
        /// Its size.
        largest_bytes: u64,
    },
    /// A manifest file is not UTF-8.
    #[error("file {path} in commit {} is not UTF-8", short(.commit))]
    NotUtf8 {
        /// Repository-relative path of the file.
        path: String,
        /// The commit.
        commit: ObjectId,
        /// Where decoding failed.
        #[source]
        source: std::str::Utf8Error,
    },
}

impl SourceError {
    /// Whether retrying soon may help (network trouble), as opposed to a problem that needs a
    /// new commit or a config change (bad settings, a deleted branch, rejected credentials,
    /// an unreadable file).
    pub fn is_transient(&self) -> bool {
        match self {
            SourceError::Fetch { source, .. } => !matches!(
                source.dominant_class(),
                Some(
                    gix::error::Class::Unauthenticated
                        | gix::error::Class::PermissionDenied
                        | gix::error::Class::Validation
                        | gix::error::Class::Unsupported
                )
            ),
            SourceError::CreateDir { .. }
            | SourceError::Mirror { .. }
            | SourceError::StaleLock { .. } => true,
            _ => false,
        }
    }
}

fn short(commit: &ObjectId) -> String {
    commit.to_hex_with_len(12).to_string()
}

/// The configured repository, mirrored bare under the state directory.
pub struct GitSource {
    pub(super) url: gix::Url,
    /// `url` without userinfo, for messages.
    pub(super) display_url: String,
    branch: String,
    pub(super) sub_path: SubPath,
    pub(super) token: Option<SecretString>,
    ssh_key_file: Option<PathBuf>,
    known_hosts_file: Option<PathBuf>,
    mirror: PathBuf,
    /// Serialises fetches into the one mirror.
    pub(super) fetching: Mutex<()>,
    /// Tests serve https with a throwaway certificate; nothing else may skip verification.
    #[cfg(test)]
    accept_invalid_certs: bool,
    last_good: Mutex<Option<Revision>>,
    /// `[source] verify` (`None`: off).
    verify: Option<super::verify::Policy>,
}

impl std::fmt::Debug for GitSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitSource")
            .field("url", &self.display_url)
            .field("branch", &self.branch)
            .field("sub_path", &self.sub_path)
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("ssh_key_file", &self.ssh_key_file)
            .field("mirror", &self.mirror)
            .finish_non_exhaustive()
    }
}

impl GitSource {
    /// Validates the source settings and creates (or reopens) the bare mirror under
    /// `<state_dir>/git/`. Does not touch the network.
    pub fn open(config: &SourceConfig, state_dir: &Path) -> Result<GitSource, SourceError> {
        let display_url = remote_url::redact_userinfo(&config.url);
        if remote_url::has_password(&config.url) {
            return Err(SourceError::PasswordInUrl { url: display_url });
        }
        // The parse error is dropped: its text quotes the URL, userinfo and all.
        let url = gix::url::parse(config.url.as_bytes().as_bstr()).map_err(|_| {
            SourceError::InvalidUrl {
                url: display_url.clone(),
            }
        })?;
        if config.branch.is_empty()
            || gix::refs::FullName::try_from(tracking_ref(&config.branch)).is_err()
            || gix::refs::FullName::try_from(format!("refs/heads/{}", config.branch)).is_err()
        {
            return Err(SourceError::InvalidBranch {
                branch: config.branch.clone(),
            });
        }
        let sub_path = SubPath::parse(&config.path)?;

        let mirrors = state_dir.join(MIRRORS_DIR);
        std::fs::create_dir_all(&mirrors).map_err(|source| SourceError::CreateDir {
            path: mirrors.clone(),
            source,
        })?;
        let mirror = mirrors.join(remote_url::mirror_dir_name(&config.url));
        let opened = if mirror.join("HEAD").is_file() {
            gix::open_opts(&mirror, gix::open::Options::isolated()).map(drop)
        } else {
            gix::ThreadSafeRepository::init_opts(
                &mirror,
                gix::create::Kind::Bare,
                gix::create::Options::default(),
                gix::open::Options::isolated(),
            )
            .map(drop)
        };
        opened.map_err(|source| SourceError::Mirror {
            path: mirror.clone(),
            source,
        })?;
        remove_stale_locks(&mirror)?;

        Ok(GitSource {
            url,
            display_url,
            branch: config.branch.clone(),
            sub_path,
            token: config.token.clone(),
            ssh_key_file: config.ssh_key_file.clone(),
            known_hosts_file: config.known_hosts_file.clone(),
            mirror,
            fetching: Mutex::new(()),
            #[cfg(test)]
            accept_invalid_certs: false,
            last_good: Mutex::new(None),
            verify: config.verify.clone(),
        })
    }

    /// The remote URL without userinfo, as errors and logs name it.
    pub fn remote(&self) -> &str {
        &self.display_url
    }

    /// The branch followed.
    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// The bare mirror's directory.
    pub fn mirror_path(&self) -> &Path {
        &self.mirror
    }

    /// The last revision a `fetch` returned successfully: in this process, or else the one
    /// an earlier run left in the mirror (its tracking ref moves only on a good fetch), so a
    /// restarted agent keeps the last good revision in force while the remote is down.
    /// Blocks (reads the mirror) when nothing was fetched in this process.
    pub fn last_good(&self) -> Option<Revision> {
        if let Some(revision) = self
            .last_good
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Some(revision);
        }
        let _one_at_a_time = self.fetching.lock().unwrap_or_else(PoisonError::into_inner);
        match self.mirrored_tip() {
            Ok(revision) => revision,
            Err(error) => {
                tracing::debug!(%error, "no last good revision in the mirror");
                None
            }
        }
    }

    /// The manifest files of `commit` as the mirror holds them: a revision fetched before
    /// (the agent keeps the last valid one in force while HEAD is invalid, and reads it
    /// here after a restart). Read from the commit's tree under the same revision budget as
    /// a fetch. `None` when the mirror does not hold that commit (or it is not a full hex
    /// id). Blocks; touches no network.
    ///
    /// # Errors
    /// The mirror cannot be opened, or the commit's tree cannot be read or is over budget.
    pub fn revision_at(&self, commit: &str) -> Result<Option<Revision>, SourceError> {
        let _one_at_a_time = self.fetching.lock().unwrap_or_else(PoisonError::into_inner);
        let Ok(id) = ObjectId::from_hex(commit.as_bytes()) else {
            return Ok(None);
        };
        let repo = self.open_mirror()?;
        if repo.find_commit(id).is_err() {
            return Ok(None);
        }
        let files = tree::read_manifest_files(&repo, id, &self.sub_path)?;
        Ok(Some(Revision {
            commit: id.to_string(),
            files,
            previous: None,
            force_pushed: false,
        }))
    }

    /// Whether `[source] verify` is on.
    pub fn verifies(&self) -> bool {
        self.verify.is_some()
    }

    /// `[source] verify` for `head`, fetched before: `Ok(None)` when verification is off,
    /// else the commits verified (`range`: those reachable from `head` and not from `base`,
    /// the revision in force; [`super::verify::check`]). Blocks; touches no network.
    ///
    /// # Errors
    /// The first commit that is not verified, and why (a mirror that cannot be read refuses
    /// too: nothing unverified is applied).
    pub fn verify(
        &self,
        head: &str,
        base: Option<&str>,
    ) -> Result<Option<super::verify::Verified>, super::verify::Refusal> {
        use super::verify::{Refusal, Why};
        let Some(policy) = &self.verify else {
            return Ok(None);
        };
        let _one_at_a_time = self.fetching.lock().unwrap_or_else(PoisonError::into_inner);
        let refuse = |why| Refusal {
            commit: head.to_owned(),
            why,
        };
        let id = ObjectId::from_hex(head.as_bytes())
            .map_err(|e| refuse(Why::Unreadable(e.to_string())))?;
        let base = base.and_then(|b| ObjectId::from_hex(b.as_bytes()).ok());
        let repo = self
            .open_mirror()
            .map_err(|e| refuse(Why::Unreadable(crate::error_chain::error_text(&e))))?;
        super::verify::check(&repo, policy, id, base).map(Some)
    }

    /// The revision the mirror's tracking ref points to, read from its tree.
    fn mirrored_tip(&self) -> Result<Option<Revision>, SourceError> {
        let repo = self.open_mirror()?;
        let Some(commit) = self.tracking_tip(&repo, &tracking_ref(&self.branch))? else {
            return Ok(None);
        };
        let files = tree::read_manifest_files(&repo, commit, &self.sub_path)?;
        Ok(Some(Revision {
            commit: commit.to_string(),
            files,
            previous: None,
            force_pushed: false,
        }))
    }

    /// Fetches the branch and reads the manifest files of its tip. Blocks; setting
    /// `interrupt` aborts a running transfer.
    ///
    /// # Errors
    ///
    /// A deleted branch or an unreachable remote is an error; [`GitSource::last_good`] still
    /// holds the revision fetched before.
    pub fn fetch(&self, interrupt: &AtomicBool) -> Result<Revision, SourceError> {
        let _one_at_a_time = self.fetching.lock().unwrap_or_else(PoisonError::into_inner);
        let span =
            tracing::debug_span!("git_fetch", url = %self.display_url, branch = %self.branch);
        let _entered = span.enter();
        tracing::debug!("fetching");
        let revision = self.fetch_locked(interrupt).inspect_err(|err| {
            tracing::debug!(error = %err, "fetch failed");
        })?;
        tracing::debug!(
            commit = %revision.commit,
            files = revision.files.len(),
            force_pushed = revision.force_pushed,
            "fetched"
        );
        *self
            .last_good
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(revision.clone());
        Ok(revision)
    }

    fn fetch_locked(&self, interrupt: &AtomicBool) -> Result<Revision, SourceError> {
        if interrupt.load(Ordering::Relaxed) {
            return Err(self.interrupted());
        }
        let repo = self.open_mirror()?;
        let tracking = tracking_ref(&self.branch);
        let previous = self.tracking_tip(&repo, &tracking)?;

        // Shallow, so no blob of the history before the last fetched commit is ever stored
        // (SECURITY-AUDIT.md H3: a 100 MiB blob anywhere in history landed in the mirror).
        // The first fetch takes the tip alone. Later ones take the commits newer than the one
        // fetched before (`deepen-since` its committer time), enough to tell a fast-forward
        // from a force-push. git's upload-pack refuses `deepen-since` when no commit is that
        // new (a branch reset to an older commit): then the tip alone.
        let since = previous
            .and_then(|id| repo.find_commit(id).ok()?.time().ok())
            .map(|cutoff| gix::remote::fetch::Shallow::Since { cutoff });
        let tip_only = || gix::remote::fetch::Shallow::DepthAtRemote(1.try_into().expect("1 > 0"));
        let received = match since {
            Some(since) => match self.receive(&repo, interrupt, since) {
                Err(SourceError::Fetch { source, .. }) if !interrupt.load(Ordering::Relaxed) => {
                    tracing::debug!(error = %source, "fetching the commits since the last fetch failed; fetching the tip alone");
                    self.receive(&repo, interrupt, tip_only())
                }
                other => other,
            },
            None => self.receive(&repo, interrupt, tip_only()),
        };
        let received = match received {
            Ok(received) => received,
            Err(_) if interrupt.load(Ordering::Relaxed) => return Err(self.interrupted()),
            Err(err) => return Err(err),
        };

        let commit =
            self.tracking_tip(&repo, &tracking)?
                .ok_or_else(|| SourceError::BranchNotFound {
                    url: self.display_url.clone(),
                    branch: self.branch.clone(),
                })?;
        let force_pushed = match previous {
            Some(previous) if previous != commit => !descends_from(&repo, commit, previous)?,
            _ => false,
        };
        let files = tree::read_manifest_files(&repo, commit, &self.sub_path)?;
        // Last, once every object this fetch needs is read: `repo` is dropped right after.
        if let Some(pack) = received {
            match unpack::unpack_small_pack(
                &repo,
                &pack.index_path,
                &pack.data_path,
                pack.num_objects,
            ) {
                Ok(unpacked) => {
                    tracing::debug!(?unpacked, pack = %pack.data_path.display(), "received pack")
                }
                // Harmless: the objects stay in the pack, as gix wrote it.
                Err(error) => {
                    tracing::warn!(%error, pack = %pack.data_path.display(), "could not store a small received pack as loose objects; it stays a pack")
                }
            }
        }
        Ok(Revision {
            commit: commit.to_string(),
            files,
            previous: previous.map(|id| id.to_string()),
            force_pushed,
        })
    }

    pub(super) fn open_mirror(&self) -> Result<gix::Repository, SourceError> {
        let mirror_error = |source| SourceError::Mirror {
            path: self.mirror.clone(),
            source,
        };
        let mut repo =
            gix::open_opts(&self.mirror, gix::open::Options::isolated()).map_err(mirror_error)?;
        // Only ssh:// and scp-like URLs run it.
        let mut config = repo.config_snapshot_mut();
        config
            .set_value(
                &gix::config::tree::Core::SSH_COMMAND,
                ssh_command(
                    self.ssh_key_file.as_deref(),
                    self.known_hosts_file.as_deref(),
                )
                .as_str(),
            )
            .map_err(mirror_error)?;
        config
            .set_value(&gix::config::tree::Ssh::VARIANT, "ssh")
            .map_err(mirror_error)?;
        // No redirect is followed: a forge that moves the repository (or is made to point
        // elsewhere) gets an error naming the remote, and the URL is changed by the operator.
        config
            .set_value(&gix::config::tree::Http::FOLLOW_REDIRECTS, "false")
            .map_err(mirror_error)?;
        config.commit().map_err(mirror_error)?;
        Ok(repo)
    }

    /// The commit `refs/remotes/origin/<branch>` points to in the mirror, if any.
    fn tracking_tip(
        &self,
        repo: &gix::Repository,
        tracking: &str,
    ) -> Result<Option<ObjectId>, SourceError> {
        let mirror_error = |source| SourceError::Mirror {
            path: self.mirror.clone(),
            source,
        };
        let Some(mut reference) = repo.try_find_reference(tracking).map_err(mirror_error)? else {
            return Ok(None);
        };
        let id = reference.peel_to_id().map_err(mirror_error)?;
        Ok(Some(id.detach()))
    }

    /// One fetch of `+refs/heads/<branch>:refs/remotes/origin/<branch>`, as shallow as asked.
    fn receive(
        &self,
        repo: &gix::Repository,
        interrupt: &AtomicBool,
        shallow: gix::remote::fetch::Shallow,
    ) -> Result<Option<ReceivedPack>, SourceError> {
        let fetch_error = |source| SourceError::Fetch {
            url: self.display_url.clone(),
            branch: self.branch.clone(),
            source,
        };
        let refspec = format!("+refs/heads/{}:{}", self.branch, tracking_ref(&self.branch));
        let remote = repo
            .remote_at_without_url_rewrite(self.url.clone())
            .and_then(|remote| remote.with_refspecs([refspec.as_str()], Direction::Fetch))
            .map_err(fetch_error)?
            .with_fetch_tags(gix::remote::fetch::Tags::None);
        let mut connection = connect(&remote).map_err(fetch_error)?;
        // Never fall back to git's credential helpers or a terminal prompt: an agent has no
        // one to ask, and the host's helpers are not ours to use. The token goes only to the
        // configured scheme, host and port (SECURITY-AUDIT.md M1: after a redirect to another
        // host, gix asks again for the URL it was redirected to, and got the token).
        connection.set_credentials(token_credentials(self.token.clone(), self.url.clone()));
        #[cfg(test)]
        if self.accept_invalid_certs {
            connection.set_transport_options(tests::accept_invalid_certs(repo, &self.url));
        }
        let prepare = connection
            .prepare_fetch(
                gix::progress::Discard,
                gix::remote::ref_map::Options::default(),
            )
            .map_err(fetch_error)?;
        let wanted = BString::from(format!("refs/heads/{}", self.branch));
        let advertised = prepare
            .ref_map()
            .mappings
            .iter()
            .any(|mapping| mapping.remote.as_name() == Some(wanted.as_ref()));
        if !advertised {
            return Err(SourceError::BranchNotFound {
                url: self.display_url.clone(),
                branch: self.branch.clone(),
            });
        }
        let outcome = prepare
            .with_shallow(shallow)
            .receive(gix::progress::Discard, interrupt)
            .map_err(fetch_error)?;
        Ok(match outcome.status {
            gix::remote::fetch::Status::Change {
                write_pack_bundle:
                    gix::odb::pack::bundle::write::Outcome {
                        index_path: Some(index_path),
                        data_path: Some(data_path),
                        index,
                        ..
                    },
                ..
            } => Some(ReceivedPack {
                index_path,
                data_path,
                num_objects: index.num_objects,
            }),
            _ => None,
        })
    }

    fn interrupted(&self) -> SourceError {
        SourceError::Interrupted {
            url: self.display_url.clone(),
            branch: self.branch.clone(),
        }
    }
}

/// Opens `remote`'s fetch connection: `git://` through `daemon` (gix's own would stall about
/// 40 ms per request), every other scheme through gix.
pub(super) fn connect<'a, 'repo>(
    remote: &'a gix::Remote<'repo>,
) -> Result<
    gix::remote::Connection<
        'a,
        'static,
        'repo,
        Box<dyn gix::protocol::transport::client::blocking_io::Transport + Send>,
    >,
    gix::Error,
> {
    if remote
        .url(Direction::Fetch)
        .is_some_and(|url| url.scheme == gix::url::Scheme::Git)
    {
        let (url, version) = remote.sanitized_url_and_version(Direction::Fetch)?;
        let transport = daemon::connect(&url, version).map_err(gix::Error::from_error)?;
        Ok(remote.to_connection_with_transport(transport))
    } else {
        remote.connect(Direction::Fetch)
    }
}

/// The pack one fetch wrote into the mirror.
struct ReceivedPack {
    index_path: PathBuf,
    data_path: PathBuf,
    num_objects: u32,
}

/// Removes the `*.lock` files of refs and other mirror files. A fetch killed mid-way (kill -9,
/// power loss) leaves them behind and every later ref update would fail on them. Only one
/// agent uses a state directory, and this runs before its first fetch, so no live fetch holds
/// them.
fn remove_stale_locks(mirror: &Path) -> Result<(), SourceError> {
    let mut locks: Vec<PathBuf> = [
        "HEAD.lock",
        "config.lock",
        "packed-refs.lock",
        "shallow.lock",
    ]
    .iter()
    .map(|name| mirror.join(name))
    .filter(|path| path.is_file())
    .collect();
    locks.extend(
        walkdir::WalkDir::new(mirror.join("refs"))
            .follow_links(false)
            .into_iter()
            .filter_map(Result::ok)
            .filter(|entry| {
                entry.file_type().is_file()
                    && entry.file_name().to_string_lossy().ends_with(".lock")
            })
            .map(walkdir::DirEntry::into_path),
    );
    for path in locks {
        tracing::warn!(path = %path.display(), "removing a stale git lock file");
        std::fs::remove_file(&path).map_err(|source| SourceError::StaleLock { path, source })?;
    }
    Ok(())
}

/// The credentials of every fetch: the token (as [`TOKEN_USER`]) for a request to the
/// configured remote, nothing for any other request.
pub(super) fn token_credentials(
    token: Option<SecretString>,
    configured: gix::Url,
) -> impl FnMut(
    gix::credentials::helper::Action,
) -> gix::Result<Option<gix::credentials::protocol::Outcome>> {
    move |action| match (action, &token) {
        (gix::credentials::helper::Action::Get(context), Some(token))
            if is_configured_remote(&context, &configured) =>
        {
            Ok(Some(gix::credentials::protocol::Outcome {
                identity: gix::sec::identity::Account {
                    username: TOKEN_USER.to_owned(),
                    password: token.expose_secret().to_owned(),
                    oauth_refresh_token: None,
                },
                next: context.into(),
            }))
        }
        _ => Ok(None),
    }
}

/// Whether a credential request is for the configured remote: the same scheme, host and port
/// (the port the scheme implies when none is written). A request without a URL is refused.
pub(super) fn is_configured_remote(
    context: &gix::credentials::protocol::Context,
    configured: &gix::Url,
) -> bool {
    let Some(asked) = context
        .url
        .as_ref()
        .and_then(|url| gix::url::parse(url.as_bstr()).ok())
    else {
        return false;
    };
    let same_host = match (asked.host(), configured.host()) {
        (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
        _ => false,
    };
    asked.scheme == configured.scheme
        && same_host
        && asked.port_or_default() == configured.port_or_default()
}

fn tracking_ref(branch: &str) -> String {
    format!("refs/remotes/{REMOTE_NAME}/{branch}")
}

/// `core.sshCommand`, with the key file if one is configured (else ssh's own defaults for the
/// agent's user). gix runs it through `sh -c`, hence the quoting. `BatchMode` keeps ssh from
/// prompting for a passphrase or password nobody can type; the timeouts keep a dead server
/// from holding a fetch (and so the agent's shutdown) forever, since gix checks the interrupt
/// flag while receiving the pack, not while connecting.
///
/// Host keys: `StrictHostKeyChecking=yes` always, so an unknown key is refused rather than
/// trusted on first use (SECURITY-AUDIT.md M2), and with `[source] known_hosts_file` that
/// file is the only one consulted (the config requires it for ssh sources).
fn ssh_command(key_file: Option<&Path>, known_hosts: Option<&Path>) -> String {
    let quote = |path: &Path| path.to_string_lossy().replace('\'', r"'\''");
    let identity = key_file.map_or_else(String::new, |key| {
        format!("-i '{}' -o IdentitiesOnly=yes ", quote(key))
    });
    let known = known_hosts.map_or_else(String::new, |file| {
        format!(
            "-o UserKnownHostsFile='{}' -o GlobalKnownHostsFile=/dev/null ",
            quote(file)
        )
    });
    format!(
        "ssh {identity}{known}-o StrictHostKeyChecking=yes -o BatchMode=yes \
         -o ConnectTimeout=30 -o ServerAliveInterval=15 -o ServerAliveCountMax=4"
    )
}

/// Whether `ancestor` is reachable from `commit` in the mirror. The mirror is shallow: the walk
/// ends at its shallow boundary, which the fetch puts just behind the commit fetched before.
fn descends_from(
    repo: &gix::Repository,
    commit: ObjectId,
    ancestor: ObjectId,
) -> Result<bool, SourceError> {
    let read = |source| SourceError::ReadCommit { commit, source };
    for info in repo.rev_walk([commit]).all().map_err(read)? {
        if info.map_err(read)?.id == ancestor {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::config::Poll;
    use crate::source::test_repo::{TestRepo, closed_port, git};

    fn config(url: &str) -> SourceConfig {
        SourceConfig {
            url: url.to_owned(),
            branch: "main".to_owned(),
            path: ".".to_owned(),
            poll: Poll::Every(Duration::from_secs(60)),
            token: None,
            ssh_key_file: None,
            known_hosts_file: None,
            verify: None,
        }
    }

    fn open(url: &str, state: &Path) -> GitSource {
        GitSource::open(&config(url), state).unwrap()
    }

    fn fetch(source: &GitSource) -> Result<Revision, SourceError> {
        source.fetch(&AtomicBool::new(false))
    }

    fn keys(revision: &Revision) -> Vec<&str> {
        revision.files.keys().map(String::as_str).collect()
    }

    /// The error and its causes, as `main` prints them.
    fn chain(err: &SourceError) -> String {
        let mut text = err.to_string();
        let mut source = std::error::Error::source(err);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    }

    #[test]
    fn a_source_can_be_shared_with_blocking_tasks() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<GitSource>();
        shareable::<Revision>();
        shareable::<SourceError>();
    }

    #[test]
    fn first_fetch_clones_bare_and_reads_the_tree_of_the_branch() {
        let repo = TestRepo::new();
        let commit = repo.commit_files(
            &[
                ("vm/base/web.yaml", "kind: VM\n"),
                ("iso.yml", "kind: ISO\n"),
                ("README.md", "# ops\n"),
            ],
            "first",
        );
        repo.switch_new("other");
        repo.commit_files(&[("other.yaml", "kind: VM\n")], "on another branch");
        let state = tempfile::tempdir().unwrap();

        let revision = fetch(&open(&repo.url(), state.path())).unwrap();

        assert_eq!(revision.commit, commit);
        assert_eq!(keys(&revision), ["iso.yml", "vm/base/web.yaml"]);
        assert_eq!(revision.files["vm/base/web.yaml"], "kind: VM\n");
        assert_eq!(revision.previous, None);
        assert!(!revision.force_pushed);
    }

    #[test]
    fn a_new_commit_is_found_on_the_next_fetch() {
        let repo = TestRepo::new();
        let first = repo.commit_files(&[("a.yaml", "a: 1\n"), ("b.yaml", "b: 1\n")], "first");
        let state = tempfile::tempdir().unwrap();
        let source = open(&repo.url(), state.path());
        assert_eq!(fetch(&source).unwrap().commit, first);

        repo.remove("b.yaml");
        let second = repo.commit_files(&[("a.yaml", "a: 2\n")], "second");
        let revision = fetch(&source).unwrap();

        assert_eq!(revision.commit, second);
        assert_eq!(revision.previous.as_deref(), Some(first.as_str()));
        assert!(!revision.force_pushed);
        assert_eq!(keys(&revision), ["a.yaml"]);
        assert_eq!(revision.files["a.yaml"], "a: 2\n");
    }

    fn packs(source: &GitSource) -> usize {
        std::fs::read_dir(source.mirror_path().join("objects/pack"))
            .unwrap()
            .filter(|entry| {
                let path = entry.as_ref().unwrap().path();
                path.extension()
                    .is_some_and(|ext| ext == "pack" || ext == "idx")
            })
            .count()
    }

    #[test]
    fn small_fetches_are_stored_as_loose_objects_and_leave_no_pack_behind() {
        let repo = TestRepo::new();
        let mut commits = vec![repo.commit_files(&[("vm/a.yaml", "a: 0\n")], "first")];
        let state = tempfile::tempdir().unwrap();
        let source = open(&repo.url(), state.path());
        fetch(&source).unwrap();
        for i in 1..6 {
            commits.push(repo.commit_files(&[("vm/a.yaml", &format!("a: {i}\n"))], "change"));
            assert_eq!(fetch(&source).unwrap().commit, commits[i]);
        }

        assert_eq!(
            packs(&source),
            0,
            "git's CLI unpacks packs under 100 objects too"
        );
        for (i, commit) in commits.iter().enumerate() {
            let revision = source.revision_at(commit).unwrap().unwrap();
            assert_eq!(revision.files["vm/a.yaml"], format!("a: {i}\n"));
        }
        // git itself finds the mirror whole, and a restarted source reads its tip.
        git(source.mirror_path(), &["fsck", "--no-progress"]);
        drop(source);
        let restarted = open(&repo.url(), state.path());
        assert_eq!(restarted.last_good().unwrap().commit, commits[5]);
    }

    #[test]
    fn a_fetch_of_a_hundred_objects_or_more_is_kept_as_one_pack() {
        let repo = TestRepo::new();
        repo.commit_files(&[("vm/a.yaml", "a: 0\n")], "first");
        let state = tempfile::tempdir().unwrap();
        let source = open(&repo.url(), state.path());
        fetch(&source).unwrap();
        let contents: Vec<(String, String)> = (0..120)
            .map(|i| (format!("vm/{i:03}.yaml"), format!("n: {i}\n")))
            .collect();
        let files: Vec<(&str, &str)> = contents
            .iter()
            .map(|(path, text)| (path.as_str(), text.as_str()))
            .collect();
        let commit = repo.commit_files(&files, "120 new files");

        let revision = fetch(&source).unwrap();

        assert_eq!(revision.commit, commit);
        assert_eq!(revision.files.len(), 121);
        assert_eq!(packs(&source), 2, "one .pack and its .idx");
        git(source.mirror_path(), &["fsck", "--no-progress"]);
    }

    #[test]
    fn fetching_an_unchanged_branch_returns_the_same_commit() {
        let repo = TestRepo::new();
        let commit = repo.commit_files(&[("a.yaml", "a: 1\n")], "first");
        let state = tempfile::tempdir().unwrap();
        let source = open(&repo.url(), state.path());
        let first = fetch(&source).unwrap();

        let again = fetch(&source).unwrap();

        assert_eq!(again.commit, commit);
        assert_eq!(again.previous.as_deref(), Some(commit.as_str()));
        assert!(!again.force_pushed);
        assert_eq!(again.files, first.files);
    }

    #[test]
    fn a_restarted_source_knows_the_commit_fetched_before_the_restart() {
        let repo = TestRepo::new();
        let first = repo.commit_files(&[("a.yaml", "a: 1\n")], "first");
        let state = tempfile::tempdir().unwrap();
        fetch(&open(&repo.url(), state.path())).unwrap();
        let second = repo.commit_files(&[("a.yaml", "a: 2\n")], "second");

        let restarted = open(&repo.url(), state.path());
        // Before any fetch, the last good revision is the one the mirror holds.
        assert_eq!(
            restarted.last_good().map(|r| r.commit).as_deref(),
            Some(first.as_str())
        );
        let revision = fetch(&restarted).unwrap();

        assert_eq!(revision.commit, second);
        assert_eq!(revision.previous.as_deref(), Some(first.as_str()));
    }

    #[test]
    fn the_sub_path_scopes_the_files_and_their_keys() {
        let repo = TestRepo::new();
        repo.commit_files(
            &[
                ("clusters/prod/vm/web.yaml", "web\n"),
                ("clusters/prod/iso.yml", "iso\n"),
                ("clusters/lab/vm/test.yaml", "test\n"),
                ("top.yaml", "top\n"),
            ],
            "layout",
        );
        let state = tempfile::tempdir().unwrap();
        let mut settings = config(&repo.url());
        settings.path = "./clusters/prod/".to_owned();

        let revision = fetch(&GitSource::open(&settings, state.path()).unwrap()).unwrap();

        assert_eq!(keys(&revision), ["iso.yml", "vm/web.yaml"]);
        assert_eq!(revision.files["vm/web.yaml"], "web\n");
    }

    #[test]
    fn lock_files_left_by_a_killed_agent_do_not_block_the_next_fetch() {
        let repo = TestRepo::new();
        repo.commit_files(&[("a.yaml", "a: 1\n")], "first");
        let state = tempfile::tempdir().unwrap();
        let source = open(&repo.url(), state.path());
        fetch(&source).unwrap();
        let mirror = source.mirror_path().to_path_buf();
        std::fs::write(mirror.join("refs/remotes/origin/main.lock"), "").unwrap();
        std::fs::write(mirror.join("packed-refs.lock"), "").unwrap();
        let second = repo.commit_files(&[("a.yaml", "a: 2\n")], "second");

        let restarted = open(&repo.url(), state.path());
        let revision = fetch(&restarted).unwrap();

        assert_eq!(revision.commit, second);
        assert!(!mirror.join("refs/remotes/origin/main.lock").exists());
    }

    #[test]
    fn a_sub_path_missing_from_the_commit_is_an_error_naming_it() {
        let repo = TestRepo::new();
        let commit = repo.commit_files(&[("clusters/prod.yaml", "x\n")], "layout");
        let state = tempfile::tempdir().unwrap();
        let mut settings = config(&repo.url());

        settings.path = "clusters/lab/vm".to_owned();
        let err = fetch(&GitSource::open(&settings, state.path()).unwrap()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("path clusters/lab not found in commit {}", &commit[..12])
        );

        settings.path = "clusters/prod.yaml".to_owned();
        let err = fetch(&GitSource::open(&settings, state.path()).unwrap()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "path clusters/prod.yaml in commit {} is not a directory",
                &commit[..12]
            )
        );
    }

    #[test]
    fn dot_files_and_dot_directories_are_skipped() {
        let repo = TestRepo::new();
        repo.commit_files(
            &[
                ("vm/web.yaml", "web\n"),
                ("vm/.draft.yaml", "draft\n"),
                (".github/workflows/ci.yml", "ci\n"),
                (".proxops.yaml", "hidden\n"),
                ("vm/.old/legacy.yaml", "legacy\n"),
            ],
            "dots",
        );
        let state = tempfile::tempdir().unwrap();

        let revision = fetch(&open(&repo.url(), state.path())).unwrap();

        assert_eq!(keys(&revision), ["vm/web.yaml"]);
    }

    #[test]
    fn symlinks_are_not_followed() {
        let repo = TestRepo::new();
        repo.write("real/a.yaml", "a\n");
        std::os::unix::fs::symlink("real", repo.work_path().join("linked")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", repo.work_path().join("host.yaml")).unwrap();
        repo.commit("links");
        repo.push();
        let state = tempfile::tempdir().unwrap();

        let revision = fetch(&open(&repo.url(), state.path())).unwrap();

        assert_eq!(keys(&revision), ["real/a.yaml"]);
    }

    #[test]
    fn a_force_push_is_followed_and_flagged() {
        let repo = TestRepo::new();
        let base = repo.commit_files(&[("a.yaml", "a: 1\n")], "base");
        let abandoned = repo.commit_files(&[("a.yaml", "a: 2\n")], "to be rewritten");
        let state = tempfile::tempdir().unwrap();
        let source = open(&repo.url(), state.path());
        assert_eq!(fetch(&source).unwrap().commit, abandoned);

        repo.reset_hard(&base);
        repo.write("a.yaml", "a: 3\n");
        let rewritten = repo.commit("rewritten");
        repo.force_push();
        let revision = fetch(&source).unwrap();

        assert_eq!(revision.commit, rewritten);
        assert_eq!(revision.previous.as_deref(), Some(abandoned.as_str()));
        assert!(revision.force_pushed);
        assert_eq!(revision.files["a.yaml"], "a: 3\n");

        let next = repo.commit_files(&[("a.yaml", "a: 4\n")], "after the rewrite");
        let revision = fetch(&source).unwrap();
        assert_eq!(revision.commit, next);
        assert!(!revision.force_pushed);
    }

    /// Bytes on disk below `dir`.
    fn disk_bytes(dir: &Path) -> u64 {
        walkdir::WalkDir::new(dir)
            .into_iter()
            .filter_map(Result::ok)
            .filter_map(|entry| entry.metadata().ok())
            .filter(std::fs::Metadata::is_file)
            .map(|meta| meta.len())
            .sum()
    }

    #[test]
    fn a_100_mib_blob_in_history_is_not_stored_by_the_mirror_after_a_fetch() {
        let repo = TestRepo::new();
        // Incompressible, so a pack holding it would be 100 MiB too.
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let noise: Vec<u8> = (0..100 * 1024 * 1024 / 8)
            .flat_map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()
            })
            .collect();
        repo.write("images/disk.raw", &noise);
        repo.commit_files(&[("a.yaml", "a: 1\n")], "a large blob");
        drop(noise);
        repo.remove("images/disk.raw");
        let tip = repo.commit_files(&[("a.yaml", "a: 2\n")], "the blob removed again");
        let state = tempfile::tempdir().unwrap();
        let source = open(&repo.url(), state.path());

        let revision = fetch(&source).unwrap();
        assert_eq!(revision.commit, tip);
        assert_eq!(revision.files["a.yaml"], "a: 2\n");
        let stored = disk_bytes(source.mirror_path());
        assert!(stored < 1024 * 1024, "the mirror holds {stored} bytes");

        // A fast-forward is still told from a force-push, and the old history stays out.
        let next = repo.commit_files(&[("a.yaml", "a: 3\n")], "next");
        let revision = fetch(&source).unwrap();
        assert_eq!(revision.commit, next);
        assert!(!revision.force_pushed);
        let stored = disk_bytes(source.mirror_path());
        assert!(stored < 1024 * 1024, "the mirror holds {stored} bytes");
    }

    #[test]
    fn manifest_files_over_the_revision_byte_budget_are_refused_from_their_headers() {
        let repo = TestRepo::new();
        // Five 7 MiB manifests of one repeated byte: 35 MiB, a few KiB packed.
        let big = "#".repeat(7 * 1024 * 1024);
        let files: Vec<(String, &str)> = (0..5)
            .map(|i| (format!("vm/base/f{i}.yaml"), big.as_str()))
            .collect();
        let files: Vec<(&str, &str)> = files.iter().map(|(p, c)| (p.as_str(), *c)).collect();
        let commit = repo.commit_files(&files, "generated");
        let state = tempfile::tempdir().unwrap();

        let err = fetch(&open(&repo.url(), state.path())).unwrap_err();

        assert!(
            matches!(err, SourceError::RevisionTooLarge { .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "the manifest files below . in commit {} are too many or too large: 5 or more \
                 files of 36700160 or more bytes, more than the 20000 files or 32 MiB a revision \
                 may hold (the largest so far: vm/base/f0.yaml, 7340032 bytes); remove large or \
                 generated .yaml files, or split the repository between agents",
                &commit[..12]
            )
        );
        assert!(!err.is_transient());
    }

    #[test]
    fn a_branch_reset_to_an_older_commit_counts_as_force_pushed() {
        let repo = TestRepo::new();
        let base = repo.commit_files(&[("a.yaml", "a: 1\n")], "base");
        repo.commit_files(&[("a.yaml", "a: 2\n")], "reverted by reset");
        let state = tempfile::tempdir().unwrap();
        let source = open(&repo.url(), state.path());
        fetch(&source).unwrap();

        repo.reset_hard(&base);
        repo.force_push();
        let revision = fetch(&source).unwrap();

        assert_eq!(revision.commit, base);
        assert!(revision.force_pushed);
        assert_eq!(revision.files["a.yaml"], "a: 1\n");
    }

    #[test]
    fn a_deleted_branch_is_an_error_and_last_good_keeps_the_previous_revision() {
        let repo = TestRepo::new();
        repo.commit_files(&[("a.yaml", "a: 1\n")], "first");
        repo.switch_new("keep");
        repo.push();
        let state = tempfile::tempdir().unwrap();
        let source = open(&repo.url(), state.path());
        let good = fetch(&source).unwrap();

        repo.delete_remote_branch("main");
        let err = fetch(&source).unwrap_err();

        assert!(matches!(err, SourceError::BranchNotFound { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("branch main not found on the remote {}", repo.url())
        );
        assert!(!err.is_transient());
        assert_eq!(source.last_good(), Some(good));
    }

    #[test]
    fn a_reopened_source_offers_the_revision_an_earlier_run_fetched_as_last_good() {
        let repo = TestRepo::new();
        let commit = repo.commit_files(&[("a.yaml", "a: 1\n")], "first");
        let state = tempfile::tempdir().unwrap();
        let daemon = repo.serve();
        let url = daemon.url("origin.git");
        let good = fetch(&open(&url, state.path())).unwrap();
        drop(daemon);

        let restarted = open(&url, state.path());
        assert!(fetch(&restarted).is_err(), "the remote is down");
        let last = restarted.last_good().unwrap();
        assert_eq!(last.commit, commit);
        assert_eq!(last.files, good.files);
        assert!(!last.force_pushed);
    }

    #[test]
    fn an_earlier_fetched_commit_is_read_back_from_the_mirror_after_newer_ones() {
        let repo = TestRepo::new();
        let first = repo.commit_files(&[("a.yaml", "a: 1\n")], "first");
        let state = tempfile::tempdir().unwrap();
        let source = open(&repo.url(), state.path());
        let fetched = fetch(&source).unwrap();
        repo.commit_files(&[("a.yaml", "a: 2\n")], "second");
        fetch(&source).unwrap();

        let restarted = open(&repo.url(), state.path());
        let old = restarted.revision_at(&first).unwrap().unwrap();
        assert_eq!(old.commit, first);
        assert_eq!(old.files, fetched.files);
        assert_eq!(
            restarted
                .revision_at("0123456789012345678901234567890123456789")
                .unwrap(),
            None
        );
        assert_eq!(restarted.revision_at("not hex").unwrap(), None);
    }

    #[test]
    fn a_fresh_mirror_has_no_last_good_revision() {
        let state = tempfile::tempdir().unwrap();
        let source = open(
            &format!("git://127.0.0.1:{}/r.git", closed_port()),
            state.path(),
        );
        assert!(fetch(&source).is_err());
        assert_eq!(source.last_good(), None);
    }

    #[test]
    fn a_branch_never_pushed_is_not_found() {
        let repo = TestRepo::new();
        let state = tempfile::tempdir().unwrap();

        let err = fetch(&open(&repo.url(), state.path())).unwrap_err();

        assert!(matches!(err, SourceError::BranchNotFound { .. }), "{err:?}");
    }

    #[test]
    fn an_unreachable_remote_is_an_error_naming_remote_and_branch() {
        let repo = TestRepo::new();
        repo.commit_files(&[("a.yaml", "a: 1\n")], "first");
        let daemon = repo.serve();
        let url = daemon.url("origin.git");
        let state = tempfile::tempdir().unwrap();
        let source = open(&url, state.path());
        let good = fetch(&source).unwrap();

        drop(daemon);
        let err = fetch(&source).unwrap_err();

        assert!(matches!(err, SourceError::Fetch { .. }), "{err:?}");
        assert_eq!(err.to_string(), format!("fetching origin/main of {url}"));
        assert!(err.is_transient(), "{}", chain(&err));
        assert_eq!(source.last_good(), Some(good));
    }

    #[test]
    fn a_closed_port_is_an_error_without_a_last_good_revision() {
        let url = format!("git://127.0.0.1:{}/ops.git", closed_port());
        let state = tempfile::tempdir().unwrap();
        let source = open(&url, state.path());

        let err = fetch(&source).unwrap_err();

        assert_eq!(err.to_string(), format!("fetching origin/main of {url}"));
        assert_eq!(source.last_good(), None);
    }

    #[test]
    fn git_protocol_via_git_daemon_on_localhost_works() {
        let repo = TestRepo::new();
        let first = repo.commit_files(&[("vm/web.yaml", "web\n")], "first");
        let daemon = repo.serve();
        let state = tempfile::tempdir().unwrap();
        let source = open(&daemon.url("origin.git"), state.path());

        assert_eq!(fetch(&source).unwrap().commit, first);
        let second = repo.commit_files(&[("vm/db.yaml", "db\n")], "second");
        let revision = fetch(&source).unwrap();

        assert_eq!(revision.commit, second);
        assert_eq!(keys(&revision), ["vm/db.yaml", "vm/web.yaml"]);
    }

    #[test]
    fn the_state_dir_holds_one_bare_repository_and_no_work_tree() {
        let repo = TestRepo::new();
        let commit = repo.commit_files(&[("vm/web.yaml", "web\n")], "first");
        let state = tempfile::tempdir().unwrap();
        let source = open(&repo.url(), state.path());
        fetch(&source).unwrap();
        fetch(&source).unwrap();

        let top: Vec<_> = std::fs::read_dir(state.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(top, ["git"]);
        let mirrors: Vec<_> = std::fs::read_dir(state.path().join("git"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(mirrors, [source.mirror_path().to_path_buf()]);
        let mirror = source.mirror_path();
        assert!(
            mirror.extension().is_some_and(|ext| ext == "git"),
            "{}",
            mirror.display()
        );
        assert_eq!(git(mirror, &["rev-parse", "--is-bare-repository"]), "true");
        assert_eq!(
            git(mirror, &["rev-parse", "refs/remotes/origin/main"]),
            commit
        );
        assert!(!mirror.join("index").exists());
        assert!(!mirror.join("vm").exists());
        // The URL is not persisted: the remote is anonymous.
        assert!(
            !std::fs::read_to_string(mirror.join("config"))
                .unwrap()
                .contains("url")
        );
    }

    #[test]
    fn a_manifest_that_is_not_utf8_is_an_error_naming_file_and_commit() {
        let repo = TestRepo::new();
        repo.write("ops/vm/base/x.yaml", [0x66, 0x6f, 0xff, 0x0a]);
        repo.write("ops/notes.txt", [0xff]);
        let commit = repo.commit("latin-1");
        repo.push();
        let state = tempfile::tempdir().unwrap();
        let mut settings = config(&repo.url());
        settings.path = "ops".to_owned();

        let err = fetch(&GitSource::open(&settings, state.path()).unwrap()).unwrap_err();

        assert_eq!(
            err.to_string(),
            format!(
                "file ops/vm/base/x.yaml in commit {} is not UTF-8",
                &commit[..12]
            )
        );
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn a_manifest_over_the_size_limit_is_refused_naming_file_and_commit() {
        let repo = TestRepo::new();
        let huge = vec![b'#'; proxops_core::manifest::MAX_FILE_BYTES + 1];
        repo.write("vm/huge.yaml", huge);
        let commit = repo.commit("huge");
        repo.push();
        let state = tempfile::tempdir().unwrap();

        let err = fetch(&open(&repo.url(), state.path())).unwrap_err();

        assert_eq!(
            err.to_string(),
            format!(
                "file vm/huge.yaml in commit {} is 8388609 bytes, more than the 8 MiB a manifest \
                 file may hold",
                &commit[..12]
            )
        );
    }

    #[test]
    fn an_interrupted_fetch_says_so() {
        let repo = TestRepo::new();
        repo.commit_files(&[("a.yaml", "a\n")], "first");
        let state = tempfile::tempdir().unwrap();
        let source = open(&repo.url(), state.path());

        let err = source.fetch(&AtomicBool::new(true)).unwrap_err();

        assert!(matches!(err, SourceError::Interrupted { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("fetching origin/main of {} was interrupted", repo.url())
        );
    }

    #[test]
    fn invalid_settings_are_refused_when_opening() {
        let state = tempfile::tempdir().unwrap();
        let mut settings = config("https://git.example.org/ops.git");
        settings.branch = "bad..name".to_owned();
        let err = GitSource::open(&settings, state.path()).unwrap_err();
        assert_eq!(err.to_string(), r#"invalid branch name "bad..name""#);

        let mut settings = config("https://git.example.org/ops.git");
        settings.path = "../elsewhere".to_owned();
        let err = GitSource::open(&settings, state.path()).unwrap_err();
        assert!(matches!(err, SourceError::InvalidPath { .. }), "{err}");

        let err = GitSource::open(
            &config("https://git:hunter2@git.example.org/ops.git"),
            state.path(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "source url https://git.example.org/ops.git carries a password; put the token in token_file instead"
        );
        assert!(!format!("{err:?}").contains("hunter2"));
    }

    #[test]
    fn the_remote_is_named_without_userinfo() {
        let state = tempfile::tempdir().unwrap();
        let mut settings = config("https://glpat-AsUserName@git.example.org/ops.git");
        settings.token = Some(SecretString::from("glpat-FromTheFile"));
        let source = GitSource::open(&settings, state.path()).unwrap();

        assert_eq!(source.remote(), "https://git.example.org/ops.git");
        assert_eq!(source.branch(), "main");
        let debug = format!("{source:?}");
        assert!(!debug.contains("glpat"), "{debug}");
        let mirror = source.mirror_path().to_string_lossy().into_owned();
        assert!(!mirror.contains("glpat"), "{mirror}");
    }

    /// Captures everything gix and we trace, at every level.
    fn capture_traces<T>(f: impl FnOnce() -> T) -> (T, String) {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = Arc::clone(&buffer);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || SharedWriter(Arc::clone(&writer)))
            .finish();
        let result = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8_lossy(&buffer.lock().unwrap()).into_owned();
        (result, text)
    }

    struct SharedWriter(Arc<Mutex<Vec<u8>>>);

    impl Write for SharedWriter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The transport options the mirror's config gives `url` (redirects and all), with the
    /// reqwest backend made to skip certificate verification.
    pub(super) fn accept_invalid_certs(
        repo: &gix::Repository,
        url: &gix::Url,
    ) -> Box<dyn std::any::Any> {
        use gix::protocol::transport::client::blocking_io::http;
        let backend = http::reqwest::Options {
            configure_client: Some(Box::new(|builder| {
                Ok(builder.tls_danger_accept_invalid_certs(true))
            })),
            configure_request: None,
        };
        let configured = url.to_bstring();
        let mut options = repo
            .transport_options(configured.as_bstr(), None)
            .unwrap()
            .and_then(|options| options.downcast::<http::Options>().ok())
            .map_or_else(http::Options::default, |options| *options);
        options.backend = Some(Arc::new(Mutex::new(backend)));
        Box::new(options)
    }

    /// A throwaway self-signed certificate for 127.0.0.1 (P-256), for the https test server.
    const TEST_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBkDCCATagAwIBAgIUBUrYJTMoZt2nV3szTzfNRZbFJuYwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJMTI3LjAuMC4xMCAXDTI2MTEyOTEwMjYzM1oYDzIxMjYxMTA1
MTAyNjMzWjAUMRIwEAYDVQQDDAkxMjcuMC4wLjEwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAATyewdoGkDqgnST30nIYTzmtRGdxOE1oXoBzwgTsuAH1mU3WGDWaBe2
51s8bev+0Noo0XS4DKWUqddk3TaKX4IIo2QwYjAdBgNVHQ4EFgQUs3yTEtx14AdC
+f6rS2dz5kiVCbswHwYDVR0jBBgwFoAUs3yTEtx14AdC+f6rS2dz5kiVCbswDwYD
VR0TAQH/BAUwAwEB/zAPBgNVHREECDAGhwR/AAABMAoGCCqGSM49BAMCA0gAMEUC
IG8VTQZ4uJrMiPWOjiNOpGcsjmbrVZ84yP6P76wJaesbAiEA370OKsJIZV+Xk3ej
Oey+MgtvbS2L7IoQZfQ+L4PsU20=
-----END CERTIFICATE-----
";
    /// The private key of [`TEST_CERT`]; it protects nothing.
    const TEST_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgUart7G1UoU2K1Lyj
8vFi8EWV9yxGP/Shk0QuGLxmPxKhRANCAATyewdoGkDqgnST30nIYTzmtRGdxOE1
oXoBzwgTsuAH1mU3WGDWaBe251s8bev+0Noo0XS4DKWUqddk3TaKX4II
-----END PRIVATE KEY-----
";

    /// An https server that rejects every request with 401 and records `Authorization` headers.
    fn serve_unauthorized() -> (u16, Arc<Mutex<Vec<String>>>) {
        serve_https(|_| {
            "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"ops\"\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n"
                .to_owned()
        })
    }

    /// An https server on 127.0.0.1 that answers every request with `respond(request line)`
    /// and records every request line and `Authorization` header it receives.
    fn serve_https(
        respond: impl Fn(&str) -> String + Send + 'static,
    ) -> (u16, Arc<Mutex<Vec<String>>>) {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(TEST_CERT.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(TEST_KEY.as_bytes()).unwrap(),
        )
        .unwrap();
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let connection = rustls::ServerConnection::new(Arc::clone(&config)).unwrap();
                let mut tls = rustls::StreamOwned::new(connection, stream);
                let mut headers = Vec::new();
                let mut request_line = String::new();
                {
                    let mut reader = BufReader::new(&mut tls);
                    let _ = reader.read_line(&mut request_line);
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                        headers.push(std::mem::take(&mut line));
                    }
                }
                for header in headers {
                    if let Some((name, value)) = header.split_once(':')
                        && name.eq_ignore_ascii_case("authorization")
                    {
                        record.lock().unwrap().push(value.trim().to_owned());
                    }
                }
                record
                    .lock()
                    .unwrap()
                    .push(format!("request {}", request_line.trim()));
                let _ = tls.write_all(respond(&request_line).as_bytes());
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        (port, seen)
    }

    fn base64(input: &[u8]) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in input.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[test]
    fn an_https_token_is_sent_as_basic_auth_and_never_printed_or_traced() {
        const TOKEN: &str = "glpat-Sup3rS3cretT0ken";
        let (port, seen) = serve_unauthorized();
        let url = format!("https://127.0.0.1:{port}/ops.git");
        let state = tempfile::tempdir().unwrap();
        let mut settings = config(&url);
        settings.token = Some(SecretString::from(TOKEN));
        let mut source = GitSource::open(&settings, state.path()).unwrap();
        source.accept_invalid_certs = true;

        let (result, traces) = capture_traces(|| fetch(&source));

        let err = result.unwrap_err();
        assert!(matches!(err, SourceError::Fetch { .. }), "{err:?}");
        assert!(
            !err.is_transient(),
            "rejected credentials need a fix: {}",
            chain(&err)
        );
        let expected = format!("Basic {}", base64(format!("git:{TOKEN}").as_bytes()));
        assert!(
            seen.lock().unwrap().contains(&expected),
            "{:?}",
            seen.lock().unwrap()
        );
        let encoded = base64(TOKEN.as_bytes());
        for text in [
            chain(&err),
            format!("{err:?}"),
            format!("{source:?}"),
            traces.clone(),
        ] {
            assert!(!text.contains(TOKEN), "token leaked: {text}");
            assert!(
                !text.contains(&expected[6..]),
                "encoded credentials leaked: {text}"
            );
            assert!(!text.contains(&encoded), "encoded token leaked: {text}");
        }
        assert!(
            traces.contains("git_fetch"),
            "tracing was captured: {traces}"
        );
    }

    #[test]
    fn the_git_token_is_not_sent_to_another_host_after_a_redirect() {
        const TOKEN: &str = "glpat-FILE-TOKEN-for-the-forge";
        // B, the other host (`localhost`, another port): asks for credentials and records them.
        let (other, seen_by_other) = serve_unauthorized();
        // A, the configured forge: redirects every request to B.
        let (forge, seen_by_forge) = serve_https(move |request| {
            let target = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
            format!(
                "HTTP/1.1 302 Found\r\nLocation: https://localhost:{other}{target}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            )
        });
        let state = tempfile::tempdir().unwrap();
        let mut settings = config(&format!("https://127.0.0.1:{forge}/ops.git"));
        settings.token = Some(SecretString::from(TOKEN));
        let mut source = GitSource::open(&settings, state.path()).unwrap();
        source.accept_invalid_certs = true;

        let err = fetch(&source).unwrap_err();

        assert!(matches!(err, SourceError::Fetch { .. }), "{err:?}");
        let forge_saw = seen_by_forge.lock().unwrap().clone();
        assert!(
            forge_saw
                .iter()
                .any(|l| l.starts_with("request GET /ops.git/info/refs")),
            "{forge_saw:?}"
        );
        let other_saw = seen_by_other.lock().unwrap().clone();
        assert!(
            other_saw.iter().all(|l| l.starts_with("request ")),
            "the other host got credentials: {other_saw:?}"
        );
        // Redirects are not followed at all (with them followed, the other host gets the
        // request without credentials: checked by hand with `http.followRedirects=initial`).
        assert!(other_saw.is_empty(), "{other_saw:?}");
        assert!(!chain(&err).contains(TOKEN), "{}", chain(&err));
    }

    #[test]
    fn credentials_are_answered_only_for_the_configured_scheme_host_and_port() {
        let configured =
            gix::url::parse("https://git.example.org/ops.git".as_bytes().as_bstr()).unwrap();
        let asked = |url: Option<&str>| gix::credentials::protocol::Context {
            url: url.map(Into::into),
            ..Default::default()
        };
        for same in [
            "https://git.example.org/ops.git",
            "https://GIT.example.org:443/other/path.git",
        ] {
            assert!(
                is_configured_remote(&asked(Some(same)), &configured),
                "{same}"
            );
        }
        for other in [
            "https://localhost/ops.git",
            "https://git.example.org:8443/ops.git",
            "http://git.example.org/ops.git",
            "https://git.example.org.evil.example/ops.git",
            "ssh://git@git.example.org/ops.git",
        ] {
            assert!(
                !is_configured_remote(&asked(Some(other)), &configured),
                "{other}"
            );
        }
        assert!(!is_configured_remote(&asked(None), &configured));
    }

    #[test]
    fn without_a_token_no_credentials_are_sent_and_nobody_is_prompted() {
        let (port, seen) = serve_unauthorized();
        let url = format!("https://127.0.0.1:{port}/ops.git");
        let state = tempfile::tempdir().unwrap();
        let mut source = open(&url, state.path());
        source.accept_invalid_certs = true;

        let err = fetch(&source).unwrap_err();

        assert!(matches!(err, SourceError::Fetch { .. }), "{err:?}");
        let seen = seen.lock().unwrap().clone();
        assert!(seen.iter().all(|l| l.starts_with("request ")), "{seen:?}");
    }

    #[test]
    fn an_ssh_key_file_is_passed_to_ssh_through_the_in_memory_config() {
        let state = tempfile::tempdir().unwrap();
        let key = state.path().join("id ed25519's key");
        std::fs::write(&key, "not a key").unwrap();
        let url = format!("ssh://git@127.0.0.1:{}/ops.git", closed_port());
        let mut settings = config(&url);
        settings.ssh_key_file = Some(key.clone());
        let known_hosts = state.path().join("forge's known_hosts");
        settings.known_hosts_file = Some(known_hosts.clone());
        let source = GitSource::open(&settings, state.path()).unwrap();

        let repo = source.open_mirror().unwrap();
        let options = repo.ssh_connect_options().unwrap();
        let command = options.command.unwrap().to_string_lossy().into_owned();
        assert_eq!(
            command,
            format!(
                "ssh -i '{}' -o IdentitiesOnly=yes -o UserKnownHostsFile='{}' \
                 -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes \
                 -o BatchMode=yes -o ConnectTimeout=30 -o ServerAliveInterval=15 \
                 -o ServerAliveCountMax=4",
                key.display().to_string().replace('\'', r"'\''"),
                known_hosts.display().to_string().replace('\'', r"'\''")
            )
        );
        let on_disk = std::fs::read_to_string(source.mirror_path().join("config")).unwrap();
        assert!(!on_disk.contains("sshCommand"), "{on_disk}");

        let (result, traces) = capture_traces(|| fetch(&source));
        let err = result.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "fetching origin/main of {}",
                remote_url::redact_userinfo(&url)
            )
        );
        assert!(traces.contains("IdentitiesOnly=yes"), "{traces}");
    }

    #[test]
    fn without_a_key_file_ssh_still_never_prompts_nor_trusts_an_unknown_host_key() {
        let command = ssh_command(None, None);
        assert!(
            command.starts_with("ssh -o StrictHostKeyChecking=yes"),
            "{command}"
        );
        assert!(!command.contains("accept-new"), "{command}");
        assert!(command.contains("-o BatchMode=yes"), "{command}");
        assert!(!command.contains("-i "), "{command}");
    }

    /// Set by `hostile_global_git_config_is_ignored` for the child process it starts.
    const HOSTILE_CHILD: &str = "PROXOPS_TEST_HOSTILE_GIT_CONFIG_CHILD";

    #[test]
    fn a_hostile_global_git_config_is_ignored() {
        // The environment of this process cannot be changed safely (edition 2024 makes
        // `set_var` unsafe, and the crate forbids unsafe), so the check runs in a child.
        let dir = tempfile::tempdir().unwrap();
        let hostile = dir.path().join("gitconfig");
        let repo = TestRepo::new();
        repo.commit_files(&[("a.yaml", "a\n")], "first");
        std::fs::write(
            &hostile,
            format!(
                "[url \"file:///nonexistent/\"]\n\tinsteadOf = {}\n\
                 [protocol]\n\tallow = never\n\
                 [core]\n\tsshCommand = false\n",
                repo.url()
            ),
        )
        .unwrap();
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "source::git::tests::hostile_global_git_config_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOSTILE_CHILD, repo.url())
            .env("GIT_CONFIG_GLOBAL", &hostile)
            .env("GIT_CONFIG_SYSTEM", &hostile)
            .env("GIT_DIR", dir.path())
            .env("GIT_CONFIG_COUNT", "1")
            .env("GIT_CONFIG_KEY_0", "protocol.file.allow")
            .env("GIT_CONFIG_VALUE_0", "never")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    #[test]
    #[ignore = "run by a_hostile_global_git_config_is_ignored in a child process"]
    fn hostile_global_git_config_child() {
        let Some(url) = std::env::var_os(HOSTILE_CHILD) else {
            return;
        };
        let url = url.to_string_lossy().into_owned();
        // The hostile config is live for the git binary...
        let state = tempfile::tempdir().unwrap();
        let plain_git = std::process::Command::new("git")
            .args(["ls-remote", &url])
            .current_dir(state.path())
            .env_remove("GIT_DIR")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&plain_git.stderr);
        assert!(
            !plain_git.status.success() && stderr.contains("not allowed"),
            "git itself obeys the hostile config: {stderr}"
        );
        // ...and has no effect on the source.
        let revision = fetch(&open(&url, state.path())).unwrap();
        assert_eq!(keys(&revision), ["a.yaml"]);
    }
}
