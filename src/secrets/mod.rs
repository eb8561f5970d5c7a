//! Secrets from the cluster's SOPS document: cloud-init SSH keys and passwords, decrypted
//! in-process with the age backend, held only in memory as `SecretString`s.
//!
//! - [`sops`]: read and decrypt a SOPS file (age identity, AES-256-GCM values, MAC check), and
//!   list its key names without decrypting.
//! - [`refs`]: `proxops validate`'s check that every `ssh-key-refs` / `ci-password-ref` names a
//!   key of its cluster's SOPS document.
//! - [`resolve`]: a pass's side (agent and CLI): the cluster's document decrypted once, every
//!   VM's refs resolved into the core's `Sealed` values, or the pass refused (fail closed).
//! - `tree`: the order-preserving YAML reader these use.

pub mod refs;
pub mod resolve;
pub mod sops;
mod tree;

pub use sops::{
    AgeIdentity, KeyNames, RefStatus, SopsDocument, SopsError, key_names, load_identity,
};

#[cfg(test)]
mod tests;
