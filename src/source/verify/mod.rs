//! Signed commits (`[source] verify`, issue 18): whether the commits of a new revision carry
//! a good signature by an allowed key, checked in-process before anything of the revision
//! is planned or applied.
//!
//! - `head`: the fetched commit must be signed.
//! - `range`: every commit reachable from the fetched commit and not from the revision in
//!   force (the last applied or enforced one), merges and both sides of them included. On
//!   the very first pass (nothing in force yet) only the fetched commit. After a force-push
//!   (the revision in force is no ancestor) the walk still hides what the old revision
//!   reaches, so it covers the new side down to the merge base (or its roots, when the
//!   histories share nothing). The walk reads the mirror's objects, not its shallow
//!   boundary, and refuses when a parent is missing (`range`); when the revision in force
//!   is not in the mirror at all it covers what the mirror holds. At most [`MAX_RANGE`]
//!   commits; more is refused.
//!
//! The signed payload is the raw commit object without its `gpgsig` header, as gix's
//! `Commit::signature` gives it; git/git @ 1a3e64c6c4, `commit.c`,
//! `parse_buffer_signed_by_header`, builds the same payload (it also drops a second
//! `gpgsig-sha256` header, which gix keeps: GAPS.md #120). SSH
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    use super::*;
    use crate::source::test_repo::{TestRepo, git_command};

    fn run(command: &mut Command) -> String {
        let output = command.output().unwrap();
        assert!(
            output.status.success(),
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// A new ed25519 key in `dir`; its allowed signers line with `options`.
    fn ssh_key(dir: &Path, name: &str, options: &str) -> (std::path::PathBuf, String) {
        let key = dir.join(name);
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "", "-f"])
            .arg(&key));
        let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
        (key, format!("ops@example.org {options} {}", public.trim()))
    }

    fn ssh_policy(dir: &Path, mode: Mode, lines: &[&str]) -> Policy {
        let file = dir.join("allowed_signers");
        std::fs::write(&file, lines.join("\n")).unwrap();
        Policy::load(mode, Some(&file), None).unwrap()
    }

    /// Commits `files` on the work repository, signed with the SSH `key` when given.
    fn commit(repo: &TestRepo, key: Option<&Path>, file: &str, message: &str) -> ObjectId {
        repo.write(file, message);
        repo.git(&["add", "--all"]);
        let mut command = git_command(&repo.work_path());
        if let Some(key) = key {
            command
                .arg("-c")
                .arg("gpg.format=ssh")
                .arg("-c")
                .arg(format!("user.signingkey={}", key.display()))
                .args(["commit", "-q", "-S", "-m", message]);
        } else {
            command.args(["commit", "-q", "-m", message]);
        }
        run(&mut command);
        ObjectId::from_hex(repo.head().as_bytes()).unwrap()
    }

    fn open(repo: &TestRepo) -> gix::Repository {
        gix::open_opts(repo.work_path(), gix::open::Options::isolated()).unwrap()
    }

    /// The armored signature and the signed payload of `commit`.
    fn signed_parts(repo: &gix::Repository, commit: ObjectId) -> (String, Vec<u8>, i64) {
        let commit = repo.find_commit(commit).unwrap();
        let time = commit.time().unwrap().seconds;
        let (signature, signed) = commit.signature().unwrap().unwrap();
        (
            String::from_utf8_lossy(&signature).into_owned(),
            signed.to_bstring().to_vec(),
            time,
        )
    }

    #[test]
    fn an_ssh_signed_commit_verifies_and_a_tampered_payload_is_a_bad_signature() {
        let keys = tempfile::tempdir().unwrap();
        let (key, line) = ssh_key(keys.path(), "signer", "namespaces=\"git\"");
        let policy = ssh_policy(keys.path(), Mode::Head, &[&line]);
        let repo = TestRepo::new();
        let signed = commit(&repo, Some(&key), "a.yaml", "signed");
        let git = open(&repo);

        check(&git, &policy, signed, None).unwrap();
        let (signature, mut payload, time) = signed_parts(&git, signed);
        assert_eq!(
            verify_signature(&policy, &signature, &payload, time).unwrap(),
            "ops@example.org"
        );
        let at = payload.len() - 2;
        payload[at] ^= 1;
        let why = verify_signature(&policy, &signature, &payload, time).unwrap_err();
        assert!(matches!(why, Why::BadSignature(_)), "{why}");
    }

    #[test]
    fn a_key_outside_its_validity_or_namespace_is_refused_with_that_reason() {
        let keys = tempfile::tempdir().unwrap();
        let (key, _) = ssh_key(keys.path(), "signer", "");
        let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
        let repo = TestRepo::new();
        let signed = commit(&repo, Some(&key), "a.yaml", "signed");
        let git = open(&repo);
        let (signature, payload, time) = signed_parts(&git, signed);

        let expired = ssh_policy(
            keys.path(),
            Mode::Head,
            &[&format!(
                "a@example.org valid-before=20000101Z {}",
                public.trim()
            )],
        );
        let why = verify_signature(&expired, &signature, &payload, time).unwrap_err();
        assert!(matches!(why, Why::Expired(_)), "{why}");

        let elsewhere = ssh_policy(
            keys.path(),
            Mode::Head,
            &[&format!(
                "a@example.org namespaces=\"file\" {}",
                public.trim()
            )],
        );
        let why = verify_signature(&elsewhere, &signature, &payload, time).unwrap_err();
        assert!(matches!(why, Why::WrongNamespace(_)), "{why}");

        // A signature made for another namespace (`ssh-keygen -Y sign -n file`).
        let message = keys.path().join("message");
        std::fs::write(&message, &payload).unwrap();
        run(Command::new("ssh-keygen")
            .args(["-q", "-Y", "sign", "-n", "file", "-f"])
            .arg(&key)
            .arg(&message));
        let other = std::fs::read_to_string(keys.path().join("message.sig")).unwrap();
        let open_policy = ssh_policy(
            keys.path(),
            Mode::Head,
            &[&format!("a@example.org {}", public.trim())],
        );
        let why = verify_signature(&open_policy, &other, &payload, time).unwrap_err();
        assert_eq!(
            why,
            Why::WrongNamespace("signed in namespace `file`, not `git`".to_owned())
        );
    }

    #[test]
    fn range_mode_checks_both_sides_of_a_merge_and_names_the_unsigned_commit() {
        let keys = tempfile::tempdir().unwrap();
        let (key, line) = ssh_key(keys.path(), "signer", "");
        let policy = ssh_policy(keys.path(), Mode::Range, &[&line]);
        let repo = TestRepo::new();
        let base = commit(&repo, Some(&key), "a.yaml", "base");
        repo.git(&["checkout", "-q", "-b", "side"]);
        let unsigned = commit(&repo, None, "side.yaml", "unsigned on the side");
        repo.git(&["checkout", "-q", "main"]);
        let main = commit(&repo, Some(&key), "b.yaml", "signed on main");
        let mut merge = git_command(&repo.work_path());
        merge
            .arg("-c")
            .arg("gpg.format=ssh")
            .arg("-c")
            .arg(format!("user.signingkey={}", key.display()))
            .args(["merge", "-q", "-S", "--no-ff", "-m", "merge", "side"]);
        run(&mut merge);
        let head = ObjectId::from_hex(repo.head().as_bytes()).unwrap();
        let git = open(&repo);

        let refusal = check(&git, &policy, head, Some(base)).unwrap_err();
        assert_eq!(refusal.commit, unsigned.to_string());
        assert_eq!(refusal.why, Why::NoSignature);
        assert_eq!(
            refusal.to_string(),
            format!("unverified: {}: no signature", &unsigned.to_string()[..12])
        );
        // From the main side alone, everything is signed; `head` mode checks the merge only.
        assert_eq!(
            check(&git, &policy, main, Some(base)).unwrap().commits,
            [main.to_string()]
        );
        let head_only = Policy {
            mode: Mode::Head,
            ..policy.clone()
        };
        check(&git, &head_only, head, Some(base)).unwrap();
        // The first pass (nothing in force) checks HEAD alone.
        check(&git, &policy, head, None).unwrap();
    }

    #[test]
    fn an_openpgp_signature_by_a_key_in_the_keyring_verifies_and_a_tampered_one_does_not() {
        let home = tempfile::Builder::new()
            .prefix("g")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(
            home.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let gpg = |args: &[&str]| {
            run(Command::new("gpg")
                .env("GNUPGHOME", home.path())
                .args(["--batch", "--quiet", "--passphrase", ""])
                .args(args))
        };
        gpg(&[
            "--quick-gen-key",
            "Ops <ops@example.org>",
            "default",
            "default",
            "never",
        ]);
        gpg(&[
            "--quick-gen-key",
            "Other <other@example.org>",
            "default",
            "default",
            "never",
        ]);
        let keyring = home.path().join("ops.asc");
        std::fs::write(&keyring, gpg(&["--armor", "--export", "ops@example.org"])).unwrap();
        let policy = Policy::load(Mode::Head, None, Some(&keyring)).unwrap();
        assert_eq!(policy.keyring.len(), 1);

        let payload =
            b"tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\nauthor a <a@b> 1 +0000\n\nx\n";
        let message = home.path().join("payload");
        std::fs::write(&message, payload).unwrap();
        let sign_as = |user: &str| {
            let out = home.path().join(format!("{user}.sig"));
            run(Command::new("gpg")
                .env("GNUPGHOME", home.path())
                .args([
                    "--batch",
                    "--quiet",
                    "--passphrase",
                    "",
                    "--local-user",
                    user,
                ])
                .args(["--armor", "--detach-sign", "--output"])
                .arg(&out)
                .arg(&message));
            std::fs::read_to_string(out).unwrap()
        };
        let good = sign_as("ops@example.org");
        assert!(verify_signature(&policy, &good, payload, 1).is_ok());
        let mut tampered = payload.to_vec();
        tampered[0] ^= 1;
        let why = verify_signature(&policy, &good, &tampered, 1).unwrap_err();
        assert!(matches!(why, Why::BadSignature(_)), "{why}");
        let stranger = sign_as("other@example.org");
        let why = verify_signature(&policy, &stranger, payload, 1).unwrap_err();
        assert!(matches!(why, Why::KeyNotAllowed(_)), "{why}");
        // An SSH-only policy does not accept an OpenPGP signature.
        let keys = tempfile::tempdir().unwrap();
        let (_, line) = ssh_key(keys.path(), "signer", "");
        let ssh_only = ssh_policy(keys.path(), Mode::Head, &[&line]);
        let why = verify_signature(&ssh_only, &good, payload, 1).unwrap_err();
        assert!(matches!(why, Why::KeyNotAllowed(_)), "{why}");
    }

    #[test]
    fn key_files_are_read_with_located_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let errors = Policy::load(Mode::Range, Some(&missing), None).unwrap_err();
        assert!(
            errors[0]
                .to_string()
                .starts_with(&format!("{}: cannot be read", missing.display()))
        );
        let bad = dir.path().join("allowed");
        std::fs::write(
            &bad,
            "# team\nops@example.org cert-authority ssh-ed25519 AAAA\n",
        )
        .unwrap();
        let errors = Policy::load(Mode::Range, Some(&bad), None).unwrap_err();
        assert!(
            errors[0]
                .to_string()
                .starts_with(&format!("{}:2: cert-authority", bad.display())),
            "{errors:?}"
        );
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "# nobody yet\n").unwrap();
        let errors = Policy::load(Mode::Range, Some(&empty), None).unwrap_err();
        assert!(errors[0].message.contains("lists no signer"), "{errors:?}");
        let not_pgp = dir.path().join("keyring.asc");
        std::fs::write(&not_pgp, "hello\n").unwrap();
        let errors = Policy::load(Mode::Range, None, Some(&not_pgp)).unwrap_err();
        assert!(
            errors[0]
                .to_string()
                .starts_with(&not_pgp.display().to_string()),
            "{errors:?}"
        );
    }
}
