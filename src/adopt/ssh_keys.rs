//! Matching a guest's SSH keys with the cluster's SOPS document (original-proxops.md §5.4): when
//! every key line PVE holds is, verbatim, a `cloud-init.ssh-keys.<name>` entry, the manifest
//! gets `ssh-key-refs` to those entries; otherwise `ssh-keys: ["*"]` (PVE keeps the keys).
//! All or nothing, so a manifest never manages half of a guest's keys. Only SHA-256 digests
//! of the key lines are held here, never the lines themselves.

use std::collections::BTreeMap;

use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};

use crate::secrets::SopsDocument;
use crate::secrets::sops::SSH_KEY_REF_PREFIX;

/// `cloud-init.ssh-keys.<name>` references by the digest of their key line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SshKeyRefs {
    by_digest: BTreeMap<[u8; 32], String>,
}

/// How a guest's keys are adopted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Matched {
    /// Every key is in the document: these references, in PVE's order.
    Refs(Vec<String>),
    /// Not every key is: `matched` of `total` were.
    Partial {
        /// Keys found in the document.
        matched: usize,
        /// Keys PVE holds.
        total: usize,
    },
}

impl SshKeyRefs {
    /// The SSH key entries of a decrypted SOPS document (the first name wins for a key that
    /// appears twice, names being sorted).
    pub fn from_document(document: &SopsDocument) -> Self {
        let mut refs = Self::default();
        let mut leaves: Vec<_> = document
            .leaves()
            .iter()
            .filter(|leaf| {
                leaf.path
                    .strip_prefix(SSH_KEY_REF_PREFIX)
                    .is_some_and(|name| !name.is_empty() && !name.contains('.'))
            })
            .collect();
        leaves.sort_by(|a, b| a.path.cmp(&b.path));
        for leaf in leaves {
            let line = leaf.value.expose_secret().trim();
            if !line.is_empty() {
                refs.by_digest
                    .entry(digest(line))
                    .or_insert_with(|| leaf.path.clone());
            }
        }
        refs
    }

    /// Whether the document had any SSH key.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// Matches the key lines PVE holds (already decoded) with the document.
    pub(crate) fn match_keys(&self, decoded: &str) -> Matched {
        let lines: Vec<&str> = decoded
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let mut refs: Vec<String> = Vec::new();
        for line in &lines {
            if let Some(reference) = self.by_digest.get(&digest(line))
                && !refs.contains(reference)
            {
                refs.push(reference.clone());
            }
        }
        let matched = lines
            .iter()
            .filter(|l| self.by_digest.contains_key(&digest(l)))
            .count();
        if matched == lines.len() && !lines.is_empty() {
            Matched::Refs(refs)
        } else {
            Matched::Partial {
                matched,
                total: lines.len(),
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn from_lines(entries: &[(&str, &str)]) -> Self {
        let mut refs = Self::default();
        for (name, line) in entries {
            refs.by_digest
                .insert(digest(line), format!("{SSH_KEY_REF_PREFIX}{name}"));
        }
        refs
    }
}

fn digest(line: &str) -> [u8; 32] {
    Sha256::digest(line.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_all_or_nothing_in_pves_order() {
        let refs = SshKeyRefs::from_lines(&[
            ("admin", "ssh-ed25519 AAAA admin"),
            ("ci", "ssh-rsa BBBB ci"),
        ]);
        assert_eq!(
            refs.match_keys("ssh-rsa BBBB ci\nssh-ed25519 AAAA admin\n"),
            Matched::Refs(vec![
                "cloud-init.ssh-keys.ci".to_owned(),
                "cloud-init.ssh-keys.admin".to_owned()
            ])
        );
        assert_eq!(
            refs.match_keys("ssh-ed25519 AAAA admin\nssh-ed25519 CCCC other"),
            Matched::Partial {
                matched: 1,
                total: 2
            }
        );
    }
}
