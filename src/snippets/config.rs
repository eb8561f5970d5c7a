//! `[snippets]` of agent.toml: the default storage of cloud-init snippets and how long a
//! snippet no guest names any more is kept.

use std::time::Duration;

use serde::Deserialize;

/// The storage snippets go to when a manifest names none: PVE's default directory storage.
pub const DEFAULT_STORAGE: &str = "local";
/// How long an unreferenced ProxOps snippet is kept before it is removed.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

/// The validated `[snippets]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnippetsConfig {
    /// `storage`: the default `spec.cloud-init-data.snippets-storage`.
    pub storage: String,
    /// `grace`: how long a file no guest's `cicustom` names is kept (counted from its
    /// `ctime`, which the agent refreshes while a guest still names it).
    pub grace: Duration,
}

impl Default for SnippetsConfig {
    fn default() -> Self {
        Self {
            storage: DEFAULT_STORAGE.to_owned(),
            grace: DEFAULT_GRACE,
        }
    }
}

/// `[snippets]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSnippets {
    storage: Option<String>,
    grace: Option<String>,
}

impl RawSnippets {
    /// Validates the section: `Err((key, message))` names the key and what to write.
    pub(crate) fn validate(self) -> Result<SnippetsConfig, (&'static str, String)> {
        let storage = self.storage.unwrap_or_else(|| DEFAULT_STORAGE.to_owned());
        let is_storage_id = !storage.is_empty()
            && storage
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !is_storage_id {
            return Err((
                "snippets.storage",
                format!(
                    "`{storage}` is not a storage id: letters, digits, `-`, `_` and `.`, e.g. \
                     `local`"
                ),
            ));
        }
        let grace = match &self.grace {
            None => DEFAULT_GRACE,
            Some(text) => humantime::parse_duration(text).map_err(|e| {
                (
                    "snippets.grace",
                    format!("`{text}` is not a duration like `1h` or `30m`: {e}"),
                )
            })?,
        };
        Ok(SnippetsConfig { storage, grace })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<SnippetsConfig, (&'static str, String)> {
        let raw: RawSnippets = toml::from_str(toml_text).expect("parses");
        raw.validate()
    }

    #[test]
    fn defaults_are_local_and_an_hour() {
        assert_eq!(parse("").ok(), Some(SnippetsConfig::default()));
        assert_eq!(
            parse("storage = \"nfs-ci\"\ngrace = \"2s\"").ok(),
            Some(SnippetsConfig {
                storage: "nfs-ci".into(),
                grace: Duration::from_secs(2),
            })
        );
    }

    #[test]
    fn a_bad_storage_or_grace_names_its_key() {
        assert_eq!(
            parse("storage = \"a b\"").err().map(|e| e.0),
            Some("snippets.storage")
        );
        assert_eq!(
            parse("grace = \"soon\"").err().map(|e| e.0),
            Some("snippets.grace")
        );
    }
}
