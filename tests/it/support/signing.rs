//! Real commit signatures for the end-to-end tests: an ed25519 key made by `ssh-keygen`
//! (`gpg.format = ssh`) and an OpenPGP key made by GnuPG in a throwaway `GNUPGHOME`; commits
//! are signed by `git commit -S` itself, never by our code. Nothing touches the network or
//! the user's keys (every `git` is isolated, `tests/it/git_server.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::git_server::{TestRepo, git_command};

/// One signing identity `git commit -S` can use.
pub(crate) enum Signer {
    /// An SSH key pair (`gpg.format = ssh`, `user.signingkey` = the private key file).
    Ssh {
        /// Holds the key files.
        dir: tempfile::TempDir,
    },
    /// A GnuPG key in its own home (`gpg.format = openpgp`).
    Gpg {
        /// The `GNUPGHOME`.
        home: tempfile::TempDir,
        /// The key's fingerprint.
        fingerprint: String,
    },
}

fn run(command: &mut Command) -> String {
    let output = command.output().expect("the program runs");
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

impl Signer {
    /// A new ed25519 SSH key (no passphrase).
    pub(crate) fn ssh() -> Signer {
        let dir = tempfile::tempdir().unwrap();
        run(Command::new("ssh-keygen")
            .args([
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "ops@example.org",
                "-f",
            ])
            .arg(dir.path().join("id_ed25519")));
        Signer::Ssh { dir }
    }

    /// A new GnuPG key (GnuPG's default algorithm, no passphrase, no expiry).
    pub(crate) fn gpg() -> Signer {
        // Short path: gpg-agent's socket lives in the home and sockets have a length limit.
        let home = tempfile::Builder::new()
            .prefix("g")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(
            home.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        run(Command::new("gpg").env("GNUPGHOME", home.path()).args([
            "--batch",
            "--quiet",
            "--passphrase",
            "",
            "--quick-gen-key",
            "Ops Signer <ops@example.org>",
            "default",
            "default",
            "never",
        ]));
        let listing = run(Command::new("gpg").env("GNUPGHOME", home.path()).args([
            "--batch",
            "--with-colons",
            "--list-secret-keys",
        ]));
        let fingerprint = listing
            .lines()
            .find_map(|l| l.strip_prefix("fpr:"))
            .and_then(|rest| rest.split(':').find(|f| !f.is_empty()))
            .expect("gpg lists the new key's fingerprint")
            .to_owned();
        Signer::Gpg { home, fingerprint }
    }

    /// The line for an allowed signers file (`principal keytype base64`).
    pub(crate) fn allowed_signers_line(&self) -> String {
        match self {
            Signer::Ssh { dir } => {
                let public = std::fs::read_to_string(dir.path().join("id_ed25519.pub")).unwrap();
                format!("ops@example.org namespaces=\"git\" {}", public.trim())
            }
            Signer::Gpg { .. } => panic!("an OpenPGP key has no allowed signers line"),
        }
    }

    /// The armored public key (`gpg --armor --export`).
    pub(crate) fn armored_public_key(&self) -> String {
        match self {
            Signer::Gpg { home, fingerprint } => run(Command::new("gpg")
                .env("GNUPGHOME", home.path())
                .args(["--batch", "--armor", "--export", fingerprint])),
            Signer::Ssh { .. } => panic!("an SSH key has no OpenPGP export"),
        }
    }

    /// Writes `text` to `dir/name`; returns the path.
    pub(crate) fn write_to(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Writes `files`, commits them signed with `git commit -S` and pushes; returns the commit.
    pub(crate) fn commit_files(
        &self,
        repo: &TestRepo,
        files: &[(&str, &str)],
        message: &str,
    ) -> String {
        for (path, contents) in files {
            repo.write(path, contents);
        }
        repo.git(&["add", "--all"]);
        let mut command = git_command(&repo.work_path());
        match self {
            Signer::Ssh { dir } => {
                command
                    .arg("-c")
                    .arg("gpg.format=ssh")
                    .arg("-c")
                    .arg(format!(
                        "user.signingkey={}",
                        dir.path().join("id_ed25519").display()
                    ));
            }
            Signer::Gpg { home, fingerprint } => {
                command
                    .env("GNUPGHOME", home.path())
                    .arg("-c")
                    .arg("gpg.format=openpgp")
                    .arg("-c")
                    .arg(format!("user.signingkey={fingerprint}"));
            }
        }
        run(command.args(["commit", "--quiet", "--allow-empty", "-S", "-m", message]));
        let commit = repo.head();
        assert!(
            repo.git(&["cat-file", "commit", &commit])
                .contains("gpgsig "),
            "git signed the commit"
        );
        repo.push();
        commit
    }
}
