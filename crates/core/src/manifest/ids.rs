//! Identifiers with rules: vmid, node name, storage id, and the shape of `metadata.name`.
//!
//! A value of these types has passed its check, so code past validation never re-checks.

use std::fmt;

use serde::Serialize;

/// A guest id, 100..=999999999 (PVE's range).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct VmId(u32);

impl VmId {
    /// The smallest vmid PVE accepts.
    pub const MIN: u32 = 100;
    /// The largest vmid PVE accepts.
    pub const MAX: u32 = 999_999_999;

    /// A vmid, if `n` is in PVE's range.
    pub fn new(n: i64) -> Option<Self> {
        u32::try_from(n)
            .ok()
            .filter(|n| (Self::MIN..=Self::MAX).contains(n))
            .map(Self)
    }

    /// The number.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A PVE node name: letters, digits and inner hyphens, at most 63 (a DNS label).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct NodeName(String);

impl NodeName {
    /// A node name, if `s` is one.
    pub fn new(s: &str) -> Option<Self> {
        let ok = !s.is_empty()
            && s.len() <= 63
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-');
        ok.then(|| Self(s.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A PVE storage id (`local`, `local-lvm`, `nfs_iso`): letters, digits, `-`, `_`, `.`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct StorageId(String);

impl StorageId {
    /// A storage id, if `s` is one.
    pub fn new(s: &str) -> Option<Self> {
        let ok = !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        ok.then(|| Self(s.to_owned()))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StorageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Longest `metadata.name`.
pub const MAX_NAME_LEN: usize = 64;

/// Whether `s` is a valid `metadata.name`: `^[a-z0-9]((-?[a-z0-9])*)$`, at most 64.
pub fn is_valid_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= MAX_NAME_LEN
        && alnum(&bytes[0])
        && bytes.last().is_some_and(alnum)
        && bytes.iter().all(|b| alnum(b) || *b == b'-')
        && !s.contains("--")
}

/// A valid name close to `s` (lowercased, other characters turned into single hyphens).
pub(crate) fn suggest_name(s: &str) -> Option<String> {
    let mut out = String::new();
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out: String = out.trim_matches('-').chars().take(MAX_NAME_LEN).collect();
    let out = out.trim_end_matches('-').to_owned();
    is_valid_name(&out).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmids_outside_pves_range_are_refused() {
        assert!(VmId::new(99).is_none());
        assert!(VmId::new(1_000_000_000).is_none());
        assert!(VmId::new(-5).is_none());
        assert_eq!(VmId::new(100).map(VmId::get), Some(100));
        assert_eq!(VmId::new(999_999_999).map(VmId::get), Some(999_999_999));
    }

    #[test]
    fn names_follow_the_go_pattern() {
        assert!(is_valid_name("web-1"));
        assert!(is_valid_name("a"));
        assert!(!is_valid_name("Web"));
        assert!(!is_valid_name("web--1"));
        assert!(!is_valid_name("-web"));
        assert!(!is_valid_name("web-"));
        assert!(!is_valid_name(&"a".repeat(65)));
        assert!(is_valid_name(&"a".repeat(64)));
        assert_eq!(
            suggest_name("Web_Server 1").as_deref(),
            Some("web-server-1")
        );
    }

    #[test]
    fn node_and_storage_names_are_checked() {
        assert!(NodeName::new("pve-1").is_some());
        assert!(NodeName::new("pve_1").is_none());
        assert!(StorageId::new("local-lvm").is_some());
        assert!(StorageId::new("local lvm").is_none());
    }
}
