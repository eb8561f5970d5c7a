//! Secrets from the cluster's SOPS document: cloud-init SSH keys and passwords, decrypted
//! in-process by the `proxops-sops` crate (age backend), held only in memory as `SecretString`s.
//!
//! - [`sops`]: ProxOps's layout of the document (`cloud-init.ssh-keys.*`,
//!   `cloud-init.passwords.*`, `secrets.*`): its key names without decrypting, and a reference
//!   looked up in a decrypted document.
//! - [`refs`]: `proxops validate`'s check that every `ssh-key-refs` / `ci-password-ref` names a
//!   key of its cluster's SOPS document.
//! - [`resolve`]: a pass's side (agent and CLI): the cluster's document decrypted once, every
//!   VM's refs resolved into the core's `Sealed` values, or the pass refused (fail closed).

pub mod refs;
pub mod resolve;
pub mod sops;

pub use proxops_sops::{AgeIdentity, SopsDocument, SopsError, load_identity};
pub use sops::{KeyNames, RefStatus, key_names};

#[cfg(test)]
mod tests;
