//! Cloud-init snippets as the pure core holds them: their file names, the `cicustom` value
//! that points PVE at them, and the text the binary resolved for them.
//!
//! PVE's API cannot upload snippets, so the agent, which runs on the node, writes each one
//! into the `snippets/` directory of a storage itself. A snippet is content-addressed:
//! `proxops-<guest>-<kind>-<first 12 hex digits of the SHA-256 of its text>.yaml`, so a
//! changed text is a new file and a new `cicustom` value (and cloud-init, which keys its
//! first-boot run on the instance data, sees the change), while an unchanged text names the
//! file already there. The binary reads the text (inline or a repository file), replaces
//! `${secret:<ref>}` from the cluster's SOPS document and hashes it; the planner only
//! compares names, and plans never carry the text, only names and hashes.
//!
//! `cicustom` is qemu-server's `pve-qm-cicustom` property string (keys `meta`, `network`,
//! `user`, `vendor`, each a `pve-volume-id`: qemu-server @ e6352be6,
//! `src/PVE/QemuServer.pm`, `$cicustom_fmt`); a snippet's volume id is
//! `<storage>:snippets/<file>`, the form pve-storage lists (`Plugin.pm`,
//! `$get_subdir_files`, `snippets`: `"$sid:snippets/" . basename($fn)`).

use std::fmt;

use serde::Serialize;

use crate::manifest::SnippetKind;
use crate::secret::Sealed;

/// The prefix of every snippet file ProxOps writes; files without it are never removed.
pub const PREFIX: &str = "proxops-";
/// The suffix of every snippet file ProxOps writes.
pub const SUFFIX: &str = ".yaml";
/// Hex digits of the SHA-256 a file name carries.
pub const HASH_DIGITS: usize = 12;
/// The repository folder `file:` snippets are read from (plain mode never parses it as
/// manifests).
pub const REPOSITORY_FOLDER: &str = "snippets/";
/// The largest snippet text: qemu-server reads a snippet with a 1 MiB limit
/// (`Cloudinit.pm`, `read_cloudinit_snippets_file`: `file_get_contents($full_path, 1 * 1024 *
/// 1024)`).
pub const MAX_BYTES: usize = 1024 * 1024;

/// The file name of a snippet of `guest` (its `metadata.name`) of `kind` whose text has the
/// SHA-256 `sha256_hex` (lowercase hex; its first [`HASH_DIGITS`] digits are used).
pub fn file_name(guest: &str, kind: SnippetKind, sha256_hex: &str) -> String {
    let short: String = sha256_hex.chars().take(HASH_DIGITS).collect();
    format!("{PREFIX}{guest}-{}-{short}{SUFFIX}", kind.key())
}

/// What a ProxOps snippet file name says: the guest, the kind and the short hash. `None` for
/// a name ProxOps did not give (another prefix, kind or hash form).
pub fn parse_file_name(name: &str) -> Option<(&str, SnippetKind, &str)> {
    let stem = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    let (rest, hash) = stem.rsplit_once('-')?;
    if hash.len() != HASH_DIGITS || !hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let (guest, kind) = rest.rsplit_once('-')?;
    let kind = match kind {
        "user" => SnippetKind::User,
        "vendor" => SnippetKind::Vendor,
        "network" => SnippetKind::Network,
        _ => return None,
    };
    (!guest.is_empty()).then_some((guest, kind, hash))
}

/// One snippet, resolved: where it goes, its name, and its text (sealed: it may hold
/// secrets, and plans never show it either way).
#[derive(Clone, PartialEq, Eq, Serialize)]
pub struct ResolvedSnippet {
    /// Which cloud-init file it replaces.
    pub kind: SnippetKind,
    /// The storage whose `snippets/` directory holds it.
    pub storage: String,
    /// The file name ([`file_name`]).
    pub file: String,
    /// The full SHA-256 of the text, lowercase hex.
    pub sha256: String,
    /// The text, after `${secret:...}` was replaced.
    pub content: Sealed,
    /// The text holds a value from the SOPS document: the file is written mode 0600.
    pub has_secrets: bool,
}

impl ResolvedSnippet {
    /// The volume id PVE names it by: `<storage>:snippets/<file>`.
    pub fn volid(&self) -> String {
        format!("{}:snippets/{}", self.storage, self.file)
    }
}

impl fmt::Debug for ResolvedSnippet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResolvedSnippet")
            .field("kind", &self.kind)
            .field("file", &self.volid())
            .field("has_secrets", &self.has_secrets)
            .finish_non_exhaustive()
    }
}

/// A VM's resolved snippets, in [`SnippetKind`] order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ResolvedSnippets {
    /// One per declared kind.
    pub snippets: Vec<ResolvedSnippet>,
}

impl ResolvedSnippets {
    /// The `cicustom` value: `user=<volid>,vendor=<volid>,network=<volid>` for the kinds
    /// declared, in that order (`None` when there is none).
    pub fn cicustom(&self) -> Option<String> {
        let mut snippets: Vec<&ResolvedSnippet> = self.snippets.iter().collect();
        snippets.sort_by_key(|s| s.kind);
        let parts: Vec<String> = snippets
            .iter()
            .map(|s| format!("{}={}", s.kind.key(), s.volid()))
            .collect();
        (!parts.is_empty()).then(|| parts.join(","))
    }
}

/// The volume ids a `cicustom` value names (any key), as PVE parses the property string:
/// comma-separated `key=value` pairs.
pub fn cicustom_volids(cicustom: &str) -> Vec<String> {
    cicustom
        .split(',')
        .filter_map(|part| part.split_once('='))
        .filter(|(key, _)| matches!(key.trim(), "meta" | "network" | "user" | "vendor"))
        .map(|(_, volid)| volid.trim().to_owned())
        .filter(|volid| !volid.is_empty())
        .collect()
}

/// The `${secret:<ref>}` references of a snippet's text, in order of appearance (repeats
/// kept), with the byte range each one takes. An opening `${secret:` without its `}` is an
/// error: the byte offset where it starts.
///
/// # Errors
/// The byte offset of an unterminated `${secret:`.
pub fn secret_refs(text: &str) -> Result<Vec<(std::ops::Range<usize>, &str)>, usize> {
    const OPEN: &str = "${secret:";
    let mut refs = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find(OPEN) {
        let start = from + found;
        let name_start = start + OPEN.len();
        let Some(len) = text[name_start..].find('}') else {
            return Err(start);
        };
        let end = name_start + len + 1;
        refs.push((start..end, text[name_start..name_start + len].trim()));
        from = end;
    }
    Ok(refs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(kind: SnippetKind, file: &str) -> ResolvedSnippet {
        ResolvedSnippet {
            kind,
            storage: "local".into(),
            file: file.into(),
            sha256: String::new(),
            content: Sealed::new("#cloud-config\npassword: hunter2\n"),
            has_secrets: true,
        }
    }

    #[test]
    fn a_file_name_carries_the_guest_the_kind_and_twelve_hex_digits_of_the_hash() {
        let name = file_name(
            "web-1",
            SnippetKind::User,
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        );
        assert_eq!(name, "proxops-web-1-user-0123456789ab.yaml");
        assert_eq!(
            parse_file_name(&name),
            Some(("web-1", SnippetKind::User, "0123456789ab"))
        );
    }

    #[test]
    fn names_proxops_did_not_give_do_not_parse() {
        for name in [
            "user-data.yaml",
            "proxops-web-user-0123456789ab.yml",
            "proxops-web-meta-0123456789ab.yaml",
            "proxops-web-user-0123456789AB.yaml",
            "proxops-web-user-0123.yaml",
            "proxops--user-0123456789ab.yaml",
            "other-web-user-0123456789ab.yaml",
        ] {
            assert_eq!(parse_file_name(name), None, "{name}");
        }
    }

    #[test]
    fn cicustom_lists_user_vendor_network_in_that_order_as_volume_ids() {
        let snippets = ResolvedSnippets {
            snippets: vec![
                resolved(SnippetKind::Network, "n.yaml"),
                resolved(SnippetKind::User, "u.yaml"),
            ],
        };
        assert_eq!(
            snippets.cicustom().as_deref(),
            Some("user=local:snippets/u.yaml,network=local:snippets/n.yaml")
        );
        assert_eq!(ResolvedSnippets::default().cicustom(), None);
        assert_eq!(
            cicustom_volids("user=local:snippets/u.yaml,network=nfs:snippets/n.yaml"),
            vec!["local:snippets/u.yaml", "nfs:snippets/n.yaml"]
        );
    }

    #[test]
    fn a_resolved_snippet_never_prints_its_text() {
        let s = resolved(SnippetKind::User, "u.yaml");
        let debug = format!("{s:?}");
        let json = serde_json::to_string(&s).unwrap_or_default();
        for text in [debug, json] {
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn secret_references_are_found_with_their_ranges_and_an_open_one_is_an_error() {
        let text = "a: ${secret:secrets.db}\nb: ${secret: secrets.x }";
        let refs = secret_refs(text).unwrap_or_default();
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[0].1, "secrets.db");
        assert_eq!(&text[refs[0].0.clone()], "${secret:secrets.db}");
        assert_eq!(refs[1].1, "secrets.x");
        assert_eq!(secret_refs("x ${secret:open"), Err(2));
        assert_eq!(secret_refs("no refs").map(|r| r.len()), Ok(0));
    }
}
