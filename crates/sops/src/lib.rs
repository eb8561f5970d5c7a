//! SOPS files (age backend) decrypted in-process, so a PVE node needs no `sops` binary.
//!
//! A SOPS file is the plaintext document with each leaf replaced by
//! `ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]`, plus a top-level `sops:` mapping of metadata
//! (`tests/data/FORMAT.md` describes it). Decrypting is, in order:
//!
//! 1. parse the YAML keeping key order, raw scalar text and quoting ([`tree`]);
//! 2. read the metadata (age recipients, `lastmodified`, `mac`, the encryption selector);
//! 3. open the 32-byte data key from any `sops.age[].enc` with the [`AgeIdentity`];
//! 4. decrypt every leaf the metadata says is encrypted: AES-256-GCM with SOPS's 32-byte nonce,
//!    additional data = the keys on the path, each followed by `:` (list indices do not count);
//! 5. recompute the MAC (SHA-512 over every leaf's plaintext in document order, written as Go
//!    writes it) and compare it with `sops.mac`, itself encrypted with `lastmodified` as
//!    additional data. A file whose MAC does not match is refused.
//!
//! Decrypted values only ever live in [`SecretString`](secrecy::SecretString)s;
//! [`SopsDocument`]'s `Debug` shows key paths, never values, and no error text holds a value.
//! [`encrypted_tree`] gives the document without decrypting anything (SOPS keeps keys in clear
//! text), for callers that only need key names.
//!
//! # Boundary
//!
//! This crate knows SOPS and age, nothing of ProxOps: no manifests, no PVE, no agent
//! configuration, no layout of the document's keys (the `cloud-init.ssh-keys.*` convention lives
//! in the `proxops` package's `secrets` module). Its only IO is reading the files it is handed
//! ([`SopsDocument::load`], [`AgeIdentity::from_file`]) and the `SOPS_AGE_KEY_FILE` variable
//! ([`identity_file`]); [`SopsDocument::decrypt`] works on text. Only the age backend is read:
//! PGP, KMS and Vault recipients are refused with [`SopsError::NoAgeRecipient`].
//!
//! # Why not `rops`
//!
//! Rust has no equivalent of the official Go library that Flux decrypts with (`getsops/sops/v3`).
//! The nearest crate, `rops`, is at 0.1.x, its default features pull in the AWS SDK, and it reads
//! YAML through `serde_yaml`, which is archived upstream. What SOPS needs from YAML (document
//! order, raw scalar text and whether it was quoted, for the MAC) is a few hundred lines over
//! serde-saphyr's event parser, which the project already uses; the cryptography is the `age`
//! and `aes-gcm` crates. The tests decrypt files written by real sops releases
//! (`tests/data/PROVENANCE.md`).

#![warn(missing_docs)]

mod document;
mod error;
mod file;
mod identity;
mod scalar;
pub mod tree;

pub use document::{Leaf, SopsDocument, ValueType};
pub use error::SopsError;
pub use file::encrypted_tree;
pub use identity::{AgeIdentity, SOPS_AGE_KEY_FILE, identity_file, load_identity};
