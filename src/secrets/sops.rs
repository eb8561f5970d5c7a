//! The cluster's SOPS document as ProxOps lays it out: `cloud-init.ssh-keys.<name>`,
//! `cloud-init.passwords.<name>` and `secrets.<name>`. Decryption itself is the `proxops-sops`
//! crate; this module only knows which keys a manifest reference names.
//!
//! [`key_names`] lists the names a document offers without decrypting anything (SOPS keeps keys
//! in clear text); [`resolve`] looks a manifest reference up in a decrypted document.

use std::collections::BTreeSet;
use std::path::Path;

use proxops_sops::tree::{Node, Value};
use proxops_sops::{SopsDocument, SopsError};
use secrecy::{ExposeSecret, SecretString};

/// The SOPS document's section of ProxOps's own secrets.
pub const SECRETS: &str = "secrets";
/// The SOPS document's section of cloud-init data.
pub const CLOUD_INIT: &str = "cloud-init";
/// `cloud-init.ssh-keys`: OpenSSH public key lines.
pub const SSH_KEYS: &str = "ssh-keys";
/// `cloud-init.passwords`: cloud-init user passwords.
pub const PASSWORDS: &str = "passwords";
/// Prefix of an `ssh-key-refs` entry.
pub const SSH_KEY_REF_PREFIX: &str = "cloud-init.ssh-keys.";
/// Prefix of a `ci-password-ref`.
pub const PASSWORD_REF_PREFIX: &str = "cloud-init.passwords.";

/// A manifest reference as written (`cloud-init.ssh-keys.admin`,
/// `cloud-init.passwords.default`) looked up in a decrypted document; `None` when missing,
/// empty or not a reference.
pub fn resolve<'a>(document: &'a SopsDocument, reference: &str) -> Option<&'a SecretString> {
    let is_ref = reference
        .strip_prefix(SSH_KEY_REF_PREFIX)
        .or_else(|| reference.strip_prefix(PASSWORD_REF_PREFIX))
        .is_some();
    if !is_ref {
        return None;
    }
    document
        .get(reference)
        .filter(|value| !value.expose_secret().is_empty())
}

/// A snippet's `${secret:<ref>}` looked up in a decrypted document: `secrets.<name>`,
/// `cloud-init.passwords.<name>` or `cloud-init.ssh-keys.<name>`; `None` when missing, empty
/// or of another section.
pub fn resolve_snippet_ref<'a>(
    document: &'a SopsDocument,
    reference: &str,
) -> Option<&'a SecretString> {
    let is_ref = reference
        .strip_prefix(SECRETS)
        .is_some_and(|rest| rest.starts_with('.'))
        || reference.starts_with(SSH_KEY_REF_PREFIX)
        || reference.starts_with(PASSWORD_REF_PREFIX);
    if !is_ref {
        return None;
    }
    document
        .get(reference)
        .filter(|value| !value.expose_secret().is_empty())
}

/// The names a ProxOps SOPS document offers, read without decrypting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyNames {
    /// `cloud-init.ssh-keys.<name>` with a non-empty value.
    pub ssh_keys: BTreeSet<String>,
    /// `cloud-init.passwords.<name>` with a non-empty value.
    pub passwords: BTreeSet<String>,
    /// `secrets.<name>` with a non-empty value.
    pub secrets: BTreeSet<String>,
    /// Full paths (`cloud-init.passwords.x`) of keys present with an empty or null value.
    pub empty: BTreeSet<String>,
}

/// Whether a reference names a usable value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefStatus {
    /// The key exists with a non-empty value.
    Present,
    /// The key exists but its value is empty.
    Empty,
    /// No such key.
    Missing,
}

impl KeyNames {
    /// How a manifest reference (`cloud-init.ssh-keys.admin`) fares against these names.
    pub fn status(&self, reference: &str) -> RefStatus {
        let present = if let Some(name) = reference.strip_prefix(SSH_KEY_REF_PREFIX) {
            self.ssh_keys.contains(name)
        } else if let Some(name) = reference.strip_prefix(PASSWORD_REF_PREFIX) {
            self.passwords.contains(name)
        } else if let Some(name) = reference.strip_prefix("secrets.") {
            self.secrets.contains(name)
        } else {
            false
        };
        if present {
            RefStatus::Present
        } else if self.empty.contains(reference) {
            RefStatus::Empty
        } else {
            RefStatus::Missing
        }
    }
}

/// Lists `cloud-init.ssh-keys.*`, `cloud-init.passwords.*` and `secrets.*` of a SOPS file's
/// text without decrypting (keys are clear text). `path` labels errors.
///
/// # Errors
/// [`SopsError::Unencrypted`] without `sops` metadata, [`SopsError::Malformed`] when the YAML
/// does not parse or a section is not a mapping.
pub fn key_names(path: &Path, text: &str) -> Result<KeyNames, SopsError> {
    let documents = proxops_sops::encrypted_tree(path, text)?;
    let mut names = KeyNames::default();
    let Some(root) = documents.first() else {
        return Ok(names);
    };
    let malformed = |node: &Node, message: String| SopsError::Malformed {
        path: path.to_path_buf(),
        line: node.line,
        column: node.column,
        message,
    };
    let mut section = |node: Option<&Node>, prefix: &str, into: &mut BTreeSet<String>| {
        let Some(node) = node else {
            return Ok(());
        };
        if !matches!(node.value, Value::Map(_) | Value::Null) {
            return Err(malformed(node, format!("`{prefix}` is not a mapping")));
        }
        for (key, value) in node.entries() {
            match &value.value {
                Value::Scalar { text, .. } if !text.is_empty() => {
                    into.insert(key.text.clone());
                }
                Value::Scalar { .. } | Value::Null => {
                    names.empty.insert(format!("{prefix}.{}", key.text));
                }
                _ => {}
            }
        }
        Ok(())
    };
    let cloud_init = root.get(CLOUD_INIT);
    if let Some(ci) = cloud_init
        && !matches!(ci.value, Value::Map(_) | Value::Null)
    {
        return Err(malformed(ci, format!("`{CLOUD_INIT}` is not a mapping")));
    }
    let mut ssh_keys = BTreeSet::new();
    let mut passwords = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    section(
        cloud_init.and_then(|c| c.get(SSH_KEYS)),
        "cloud-init.ssh-keys",
        &mut ssh_keys,
    )?;
    section(
        cloud_init.and_then(|c| c.get(PASSWORDS)),
        "cloud-init.passwords",
        &mut passwords,
    )?;
    section(root.get(SECRETS), SECRETS, &mut secrets)?;
    names.ssh_keys = ssh_keys;
    names.passwords = passwords;
    names.secrets = secrets;
    Ok(names)
}
