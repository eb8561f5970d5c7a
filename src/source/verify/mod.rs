//! Signed commits (`[source] verify`, issue 18): whether the commits of a new revision carry
//! a good signature by an allowed key, checked in-process before anything of the revision
//! is planned or applied.
//!
//! - `head`: the fetched commit must be signed.
//! - `range`: every commit reachable from the fetched commit and not from the revision in
//!   force (the last applied or enforced one), merges and both sides of them included. On
//!   the very first pass (nothing in force yet) only the fetched commit. After a force-push
//!   (the revision in force is no ancestor) the walk still hides what the old revision
//!   reaches, so it covers the new side down to the merge base. When the revision in force
//!   is not in the mirror at all, or the histories share nothing, the walk covers every
//!   commit the shallow mirror holds (down to its shallow boundary, `source::git`), at most
//!   [`MAX_RANGE`] commits; more is refused.
//!
//! The signed payload is the raw commit object without its `gpgsig` header, as gix's
//! `Commit::signature` gives it (git `commit.c`, `parse_buffer_signed_by_header`). SSH
//! signatures ([`ssh`]) are checked against `allowed_signers_file` ([`allowed_signers`]),
//! OpenPGP ones ([`openpgp`]) against `gpg_keyring_file`. X.509 (`gpgsm`) signatures are
//! refused as unsupported; signed tags are out of scope (only commits are followed).

pub mod allowed_signers;
pub mod openpgp;
pub mod ssh;

use std::fmt;
use std::path::{Path, PathBuf};

use gix::ObjectId;

/// The most commits one pass verifies; a longer range is refused (a runaway walk after a
/// rewrite of the whole history is no revision to apply unreviewed).
pub const MAX_RANGE: usize = 10_000;

/// `[source] verify`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Only the fetched commit.
    Head,
    /// Every new commit since the revision in force.
    Range,
}

impl Mode {
    /// The configured word.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Head => "head",
            Mode::Range => "range",
        }
    }
}

/// What `[source] verify` asks for, with the keys it trusts.
#[derive(Debug, Clone)]
pub struct Policy {
    /// `head` or `range`.
    pub mode: Mode,
    /// The lines of `allowed_signers_file` (empty without one).
    pub signers: Vec<allowed_signers::Entry>,
    /// The keys of `gpg_keyring_file` (empty without one).
    pub keyring: openpgp::Keyring,
}

/// Why a `[source] verify` key file cannot be used: the file, the line when one is at fault,
/// and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFileError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line, when a line is at fault.
    pub line: Option<usize>,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for KeyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file.display(), self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl Policy {
    /// Reads the key files. At least one must be named.
    ///
    /// # Errors
    /// Every problem of the files, each located (file and line).
    pub fn load(
        mode: Mode,
        allowed_signers_file: Option<&Path>,
        gpg_keyring_file: Option<&Path>,
    ) -> Result<Policy, Vec<KeyFileError>> {
        let read = |file: &Path| {
            std::fs::read_to_string(file).map_err(|error| {
                vec![KeyFileError {
                    file: file.to_path_buf(),
                    line: None,
                    message: format!("cannot be read: {error}"),
                }]
            })
        };
        let mut errors = Vec::new();
        let mut signers = Vec::new();
        if let Some(file) = allowed_signers_file {
            match read(file).and_then(|text| {
                allowed_signers::parse(&text).map_err(|lines| {
                    lines
                        .into_iter()
                        .map(|l| KeyFileError {
                            file: file.to_path_buf(),
                            line: Some(l.line),
                            message: l.message,
                        })
                        .collect()
                })
            }) {
                Ok(entries) if entries.is_empty() => errors.push(KeyFileError {
                    file: file.to_path_buf(),
                    line: None,
                    message: "lists no signer; add `principal ssh-ed25519 AAAA...` lines"
                        .to_owned(),
                }),
                Ok(entries) => signers = entries,
                Err(found) => errors.extend(found),
            }
        }
        let mut keyring = openpgp::Keyring::default();
        if let Some(file) = gpg_keyring_file {
            match read(file).and_then(|text| {
                openpgp::Keyring::parse(&text).map_err(|message| {
                    vec![KeyFileError {
                        file: file.to_path_buf(),
                        line: None,
                        message,
                    }]
                })
            }) {
                Ok(keys) => keyring = keys,
                Err(found) => errors.extend(found),
            }
        }
        if errors.is_empty() {
            Ok(Policy {
                mode,
                signers,
                keyring,
            })
        } else {
            Err(errors)
        }
    }
}

/// Why a commit is not verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// The commit carries no signature.
    NoSignature,
    /// A signature in a format ProxOps does not verify (X.509).
    Unsupported(String),
    /// A signature by a key that is not allowed (not listed, or revoked).
    KeyNotAllowed(String),
    /// The signature does not match the commit, or does not parse.
    BadSignature(String),
    /// The key was not valid when the commit was made or signed.
    Expired(String),
    /// Signed for another purpose than git commits.
    WrongNamespace(String),
    /// The commit could not be read from the mirror.
    Unreadable(String),
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::NoSignature => f.write_str("no signature"),
            Why::Unsupported(what) => write!(f, "unsupported signature: {what}"),
            Why::KeyNotAllowed(what) => write!(f, "key not allowed: {what}"),
            Why::BadSignature(what) => write!(f, "bad signature: {what}"),
            Why::Expired(what) => write!(f, "expired key: {what}"),
            Why::WrongNamespace(what) => write!(f, "wrong namespace: {what}"),
            Why::Unreadable(what) => write!(f, "unreadable: {what}"),
        }
    }
}

/// A revision refused by `[source] verify`: the first commit (newest first) that is not
/// verified, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The commit, full hex.
    pub commit: String,
    /// Why.
    pub why: Why,
}

impl Refusal {
    /// The commit's short id (12 hex digits), as every view names it.
    pub fn short(&self) -> &str {
        self.commit.get(..12).unwrap_or(&self.commit)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unverified: {}: {}", self.short(), self.why)
    }
}

/// What was verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The commits checked, newest first.
    pub commits: Vec<String>,
}

/// Verifies `head` (and, in `range` mode, the commits since `base`) in `repo`.
///
/// # Errors
/// The first commit that is not verified, and why.
pub fn check(
    repo: &gix::Repository,
    policy: &Policy,
    head: ObjectId,
    base: Option<ObjectId>,
) -> Result<Verified, Refusal> {
    let refuse = |commit: ObjectId, why: Why| Refusal {
        commit: commit.to_string(),
        why,
    };
    let commits = match (policy.mode, base) {
        (Mode::Head, _) | (Mode::Range, None) => vec![head],
        (Mode::Range, Some(base)) if base == head => Vec::new(),
        (Mode::Range, Some(base)) => range(repo, head, base)?,
    };
    for &commit in &commits {
        verify_commit(repo, policy, commit).map_err(|why| refuse(commit, why))?;
    }
    Ok(Verified {
        commits: commits.iter().map(ToString::to_string).collect(),
    })
}

/// The commits reachable from `head` and not from `base`, newest first (breadth first).
///
/// The walk reads parents from the objects the mirror holds and ignores its `shallow` file:
/// a later shallow fetch (`deepen-since` the last fetched commit) marks that commit as a
/// shallow boundary although its parents are in the mirror, and a walk that stopped there
/// would let an unverified commit below it through. A parent the mirror does not hold
/// refuses the range (fail closed: a commit dated in the past is left out of a
/// `deepen-since` fetch), except when `base` itself is not in the mirror (a new mirror: the
/// walk then covers what the mirror holds).
fn range(repo: &gix::Repository, head: ObjectId, base: ObjectId) -> Result<Vec<ObjectId>, Refusal> {
    use std::collections::{HashSet, VecDeque};
    let refuse = |commit: ObjectId, why: Why| Refusal {
        commit: commit.to_string(),
        why,
    };
    let parents = |id: ObjectId| -> Result<Vec<ObjectId>, Refusal> {
        let commit = repo
            .find_commit(id)
            .map_err(|e| refuse(id, Why::Unreadable(e.to_string())))?;
        Ok(commit.parent_ids().map(gix::Id::detach).collect())
    };
    let base_known = repo.has_object(base);
    let mut hidden = HashSet::new();
    if base_known {
        let mut queue = VecDeque::from([base]);
        while let Some(id) = queue.pop_front() {
            if !hidden.insert(id) {
                continue;
            }
            for parent in parents(id)? {
                if repo.has_object(parent) {
                    queue.push_back(parent);
                }
            }
        }
    }
    let mut commits = Vec::new();
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([head]);
    while let Some(id) = queue.pop_front() {
        if hidden.contains(&id) || !seen.insert(id) {
            continue;
        }
        commits.push(id);
        if commits.len() > MAX_RANGE {
            return Err(refuse(
                head,
                Why::Unreadable(format!(
                    "more than {MAX_RANGE} commits since the revision in force; verify them \
                     by hand and set the branch to a reviewed commit"
                )),
            ));
        }
        for parent in parents(id)? {
            if repo.has_object(parent) {
                queue.push_back(parent);
            } else if base_known && !hidden.contains(&parent) {
                return Err(refuse(
                    id,
                    Why::Unreadable(format!(
                        "its parent {} is not in the git mirror (a shallow fetch leaves out \
                         commits dated before the last fetched one), so the commits since \
                         the revision in force cannot all be verified",
                        parent.to_hex_with_len(12)
                    )),
                ));
            }
        }
    }
    Ok(commits)
}

/// Verifies one commit's signature.
fn verify_commit(repo: &gix::Repository, policy: &Policy, id: ObjectId) -> Result<String, Why> {
    let commit = repo
        .find_commit(id)
        .map_err(|e| Why::Unreadable(e.to_string()))?;
    let time = commit
        .time()
        .map_err(|e| Why::Unreadable(e.to_string()))?
        .seconds;
    let Some((signature, signed)) = commit
        .signature()
        .map_err(|e| Why::Unreadable(e.to_string()))?
    else {
        return Err(Why::NoSignature);
    };
    let payload = signed.to_bstring();
    let armored = String::from_utf8_lossy(&signature);
    verify_signature(policy, &armored, &payload, time)
}

/// Verifies an armored signature over `payload` made at `time`; returns who signed.
///
/// # Errors
/// Why it is not a good signature by an allowed key.
pub fn verify_signature(
    policy: &Policy,
    armored: &str,
    payload: &[u8],
    time: i64,
) -> Result<String, Why> {
    let start = armored.trim_start();
    if start.starts_with("-----BEGIN SSH SIGNATURE-----") {
        if policy.signers.is_empty() {
            return Err(Why::KeyNotAllowed(
                "an SSH signature, and no allowed_signers_file is configured".to_owned(),
            ));
        }
        ssh::verify(&policy.signers, armored, payload, time)
    } else if start.starts_with("-----BEGIN PGP SIGNATURE-----") {
        if policy.keyring.is_empty() {
            return Err(Why::KeyNotAllowed(
                "an OpenPGP signature, and no gpg_keyring_file is configured".to_owned(),
            ));
        }
        policy.keyring.verify(armored, payload)
    } else if start.starts_with("-----BEGIN SIGNED MESSAGE-----") {
        Err(Why::Unsupported(
            "X.509 (gpgsm) signatures are not verified".to_owned(),
        ))
    } else {
        Err(Why::Unsupported(
            "not an SSH or OpenPGP signature".to_owned(),
        ))
    }
}
