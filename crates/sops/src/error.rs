//! Why reading or decrypting a SOPS file failed.

use std::path::PathBuf;

/// Reading or decrypting a SOPS file failed. Messages name the file; none holds a secret.
#[derive(Debug, thiserror::Error)]
pub enum SopsError {
    /// The SOPS file could not be read.
    #[error("reading SOPS file {}", .path.display())]
    Read {
        /// The SOPS file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No age identity file is configured.
    #[error(
        "no age identity to decrypt {}: set [secrets] age_key_file in agent.toml or SOPS_AGE_KEY_FILE",
        .path.display()
    )]
    MissingIdentity {
        /// The SOPS file that needed it.
        path: PathBuf,
    },
    /// The age identity file could not be read.
    #[error("reading age identity file {}", .path.display())]
    IdentityRead {
        /// The identity file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The age identity file holds no usable identity.
    #[error("age identity file {}: {reason}", .path.display())]
    IdentityInvalid {
        /// The identity file.
        path: PathBuf,
        /// What is wrong (a line number at most, never the line).
        reason: String,
    },
    /// The file has no `sops` metadata: it was never encrypted.
    #[error("{}: not encrypted by sops (no `sops` metadata); encrypt it with `sops encrypt --age ...`", .path.display())]
    Unencrypted {
        /// The SOPS file.
        path: PathBuf,
    },
    /// None of the file's age recipients matches the identity.
    #[error(
        "{}: wrong age identity: no identity in {} matches a recipient of the file ({})",
        .path.display(), .identity.display(), .recipients.join(", ")
    )]
    WrongIdentity {
        /// The SOPS file.
        path: PathBuf,
        /// The identity file used.
        identity: PathBuf,
        /// The file's age recipients.
        recipients: Vec<String>,
    },
    /// The file names no age recipient (e.g. PGP or KMS only).
    #[error("{}: no age recipient in the `sops` metadata; only the age backend is supported", .path.display())]
    NoAgeRecipient {
        /// The SOPS file.
        path: PathBuf,
    },
    /// The recomputed MAC differs from `sops.mac`, or `sops.mac` does not decrypt.
    #[error("{}: MAC mismatch: the file was changed without sops", .path.display())]
    MacMismatch {
        /// The SOPS file.
        path: PathBuf,
    },
    /// An encrypted value fails AES-GCM authentication.
    #[error("{}: {key}: the encrypted value does not authenticate: the file was changed without sops", .path.display())]
    Tampered {
        /// The SOPS file.
        path: PathBuf,
        /// The key path, e.g. `cloud-init.passwords.default`.
        key: String,
    },
    /// The file is not a SOPS document this reader understands.
    #[error("{}:{line}:{column}: malformed SOPS file: {message}", .path.display())]
    Malformed {
        /// The SOPS file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong (never a value).
        message: String,
    },
}
