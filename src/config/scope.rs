//! `[scope]` in agent.toml: the operator's limits on what the repository may declare, adopt
//! and create (`proxops_core::scope::Scope`, which holds the checks). The repository cannot
//! widen them: they are read from agent.toml only.

use proxops_core::scope::{DEFAULT_MAX_CREATES, Scope, VmidRanges};
use serde::Deserialize;

/// The `[scope]` table as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScope {
    nodes: Option<Vec<String>>,
    vmids: Option<String>,
    pools: Option<Vec<String>>,
    storages: Option<Vec<String>>,
    bridges: Option<Vec<String>>,
    extra_keys: Option<Vec<String>>,
    host_paths: Option<Vec<String>>,
    artifact_hosts: Option<Vec<String>>,
    allow_http_without_checksum: Option<bool>,
    adopt: Option<String>,
    max_creates: Option<u32>,
}

/// A bad `[scope]` value: the key (`scope.vmids`) and what is wrong and what to do.
pub(super) struct Invalid {
    pub(super) key: &'static str,
    pub(super) message: String,
}

impl RawScope {
    /// The validated scope.
    pub(super) fn validate(self) -> Result<Scope, Invalid> {
        let ranges = |key: &'static str, text: Option<String>| match text {
            None => Ok(None),
            Some(text) => VmidRanges::parse(&text).map(Some).map_err(|e| Invalid {
                key,
                message: format!("{e}; write vmids and ranges like \"100-199,9000\""),
            }),
        };
        let names = |key: &'static str, list: Option<Vec<String>>| -> Result<_, Invalid> {
            let padded = |v: &&String| v.trim().is_empty() || v.trim() != v.as_str();
            if let Some(bad) = list.iter().flatten().find(padded) {
                return Err(Invalid {
                    key,
                    message: format!("`{bad}` is not a name; remove the blank or padded entry"),
                });
            }
            Ok(list)
        };
        let host_paths = self.host_paths.unwrap_or_default();
        if let Some(bad) = host_paths.iter().find(|p| !p.starts_with('/')) {
            return Err(Invalid {
                key: "scope.host_paths",
                message: format!(
                    "`{bad}` is not an absolute path; write host folders like \"/srv/share\""
                ),
            });
        }
        Ok(Scope {
            nodes: names("scope.nodes", self.nodes)?,
            vmids: ranges("scope.vmids", self.vmids)?,
            pools: names("scope.pools", self.pools)?,
            storages: names("scope.storages", self.storages)?,
            bridges: names("scope.bridges", self.bridges)?,
            extra_keys: names("scope.extra_keys", self.extra_keys)?.unwrap_or_default(),
            host_paths,
            artifact_hosts: names("scope.artifact_hosts", self.artifact_hosts)?,
            allow_http_without_checksum: self.allow_http_without_checksum.unwrap_or(false),
            adopt: ranges("scope.adopt", self.adopt)?.unwrap_or_default(),
            max_creates: self.max_creates.unwrap_or(DEFAULT_MAX_CREATES),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Scope, Invalid> {
        toml::from_str::<RawScope>(text).unwrap().validate()
    }

    #[test]
    fn without_a_scope_table_nothing_is_adopted_and_fifty_guests_are_created_per_pass() {
        let scope = parse("").ok().unwrap();
        assert_eq!(scope, Scope::default());
        assert!(scope.adopt.is_empty());
        assert_eq!(scope.max_creates, 50);
        assert!(scope.allows_vmid(123_456));
    }

    #[test]
    fn vmid_ranges_and_lists_are_read_from_their_keys() {
        let scope = parse(
            "nodes = [\"pve1\"]\nvmids = \"100-199, 9000-9099\"\nadopt = \"150\"\nmax_creates = 2\nextra_keys = [\"hostpci*\"]\n",
        )
        .ok()
        .unwrap();
        assert!(scope.allows_vmid(199) && scope.allows_vmid(9000) && !scope.allows_vmid(200));
        assert!(scope.adopt.contains(150) && !scope.adopt.contains(151));
        assert_eq!(scope.max_creates, 2);
        assert!(scope.allows_extra("hostpci0") && !scope.allows_extra("args"));
        assert!(scope.allows_node("pve1") && !scope.allows_node("pve2"));
    }

    #[test]
    fn a_bad_range_or_a_relative_host_path_names_its_key_and_the_fix() {
        let bad = parse("vmids = \"199-100\"\n").err().unwrap();
        assert_eq!(bad.key, "scope.vmids");
        assert!(
            bad.message
                .contains("`199-100`: the first vmid is larger than the last"),
            "{}",
            bad.message
        );
        let bad = parse("adopt = \"all\"\n").err().unwrap();
        assert_eq!(bad.key, "scope.adopt");
        assert!(
            bad.message.contains("write vmids and ranges like"),
            "{}",
            bad.message
        );
        let bad = parse("host_paths = [\"srv\"]\n").err().unwrap();
        assert_eq!(bad.key, "scope.host_paths");
    }

    #[test]
    fn an_unknown_scope_key_is_refused_by_the_parser() {
        assert!(toml::from_str::<RawScope>("vmid = \"100\"\n").is_err());
    }
}
