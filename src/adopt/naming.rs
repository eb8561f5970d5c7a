//! Names for adopted resources: `metadata.name` made from what PVE calls the object (a
//! guest's `name`/`hostname`, an artifact's file name), safe for the manifest format
//! (`^[a-z0-9]((-?[a-z0-9])*)$`, at most 64) and unique per kind. The file is
//! `<name>.yaml`, so a safe, unique name is also a safe, unique file name.

use std::collections::BTreeSet;

/// Longest `metadata.name` the manifest format accepts.
const MAX_NAME: usize = 64;

/// Artifact file extensions dropped from the name, longest first.
const EXTENSIONS: [&str; 11] = [
    ".tar.gz", ".tar.xz", ".tar.zst", ".tar.bz2", ".tar", ".iso", ".img", ".qcow2", ".vmdk",
    ".raw", ".tgz",
];

/// `text` lower-cased, with every run of other characters turned into one `-`, trimmed of
/// `-`, cut to `max` characters; `None` when nothing usable is left.
pub(crate) fn safe_name(text: &str, max: usize) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.truncate(max);
    let trimmed = out.trim_end_matches('-');
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}

/// The name of a file on a storage, without its artifact extension.
pub(crate) fn artifact_stem(filename: &str) -> &str {
    let lower = filename.to_ascii_lowercase();
    EXTENSIONS
        .iter()
        .find(|ext| lower.ends_with(*ext) && lower.len() > ext.len())
        .map_or(filename, |ext| &filename[..filename.len() - ext.len()])
}

/// Hands out unique names within one kind, in the order asked (the caller asks in a fixed
/// order, so the result is the same on every run).
#[derive(Debug, Default)]
pub(crate) struct Names {
    taken: BTreeSet<String>,
}

impl Names {
    /// Marks a name as taken (a resource the repository already declares).
    pub(crate) fn reserve(&mut self, name: &str) {
        self.taken.insert(name.to_owned());
    }

    /// A unique name from `wanted` (already safe), else from `wanted-<suffix>`, else
    /// `wanted-<suffix>-<n>`; `fallback` when `wanted` is `None`. A candidate `usable` refuses
    /// (its file holds something else) is passed over too.
    pub(crate) fn claim(
        &mut self,
        wanted: Option<&str>,
        suffix: &str,
        fallback: &str,
        usable: impl Fn(&str) -> bool,
    ) -> String {
        let base = wanted.unwrap_or(fallback);
        let free = |taken: &BTreeSet<String>, c: &str| !taken.contains(c) && usable(c);
        let mut name = None;
        for candidate in [base.to_owned(), with_suffix(base, suffix)] {
            if free(&self.taken, &candidate) {
                name = Some(candidate);
                break;
            }
        }
        let name = name.unwrap_or_else(|| {
            (2u32..)
                .map(|n| with_suffix(base, &format!("{suffix}-{n}")))
                .find(|c| free(&self.taken, c))
                .unwrap_or_else(|| fallback.to_owned())
        });
        self.taken.insert(name.clone());
        name
    }
}

/// `base-suffix`, with `base` shortened so the whole stays within the limit.
fn with_suffix(base: &str, suffix: &str) -> String {
    let room = MAX_NAME.saturating_sub(suffix.len() + 1);
    let head = safe_name(base, room).unwrap_or_default();
    if head.is_empty() {
        suffix.to_owned()
    } else {
        format!("{head}-{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pve_names_become_lowercase_hyphenated_names() {
        assert_eq!(
            safe_name("Web_Server.01", 64).as_deref(),
            Some("web-server-01")
        );
        assert_eq!(safe_name("--db--", 64).as_deref(), Some("db"));
        assert_eq!(safe_name("ÜÖ", 64), None);
        assert_eq!(safe_name(&"a".repeat(80), 64).map(|s| s.len()), Some(64));
        assert_eq!(safe_name("abc-def", 4).as_deref(), Some("abc"));
    }

    #[test]
    fn artifact_extensions_are_dropped_from_the_name() {
        assert_eq!(
            artifact_stem("debian-12-standard_12.7-1_amd64.tar.zst"),
            "debian-12-standard_12.7-1_amd64"
        );
        assert_eq!(artifact_stem("netinst.ISO"), "netinst");
        assert_eq!(artifact_stem(".iso"), ".iso");
    }

    #[test]
    fn a_taken_name_gets_the_suffix_then_a_counter() {
        let mut names = Names::default();
        let any = |_: &str| true;
        assert_eq!(names.claim(Some("web"), "101", "vm-101", any), "web");
        assert_eq!(names.claim(Some("web"), "102", "vm-102", any), "web-102");
        assert_eq!(names.claim(Some("web"), "102", "vm-102", any), "web-102-2");
        assert_eq!(names.claim(None, "103", "vm-103", any), "vm-103");
        names.reserve("db");
        let not_db_104 = |n: &str| n != "db-104";
        assert_eq!(
            names.claim(Some("db"), "104", "vm-104", not_db_104),
            "db-104-2"
        );
    }
}
