//! Snapshots before risky updates (issue 19, item 2): whether an action gets one, what the
//! snapshot is called, and which of ProxOps's own snapshots retention deletes. Pure; the
//! executor (`src/execute/snapshot.rs`) asks PVE whether the guest can be snapshotted and
//! sends the requests.
//!
//! - [`SnapshotMode`]: `[policy] snapshot` and the per-guest `proxops/snapshot` annotation
//!   (which wins). `risky` snapshots before an update whose [`risk`] is
//!   `risky` or `destructive`; `updates` before every update; `off` never. Creates, clones,
//!   deletes and power actions never get one: only a config write changes a guest that
//!   already exists in a way a rollback can undo.
//! - [`snapshot_name`]: `proxops-<commit 7>-<n>`, the smallest `n` from 1 not yet used on the
//!   guest. PVE takes a snapshot name of format `pve-configid` and at most 40 characters
//!   (verified in PVE's sources: proxmox/pve-common @ f665029, `src/PVE/JSONSchema.pm`,
//!   `pve-snapshot-name` and `$CONFIGID_RE = qr/[a-z][a-z0-9_-]+/i`), and refuses `current`
//!   and `pending` (proxmox/qemu-server @ e6352be6, `src/PVE/API2/Qemu.pm`, `snapshot`).
//! - [`to_delete`]: keep the newest `keep` of the snapshots the store recorded as taken by
//!   ProxOps; never one it does not know, whatever its name.

use std::fmt;

use super::risk::{Risk, risk};
use super::{Action, Verb};

/// The prefix of every snapshot ProxOps takes.
pub const PREFIX: &str = "proxops-";

/// The longest snapshot name PVE accepts (`pve-snapshot-name`, `maxLength => 40`).
pub const MAX_NAME_LEN: usize = 40;

/// The default `[policy] snapshot_keep`.
pub const DEFAULT_KEEP: u32 = 3;

/// When to snapshot a guest before an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SnapshotMode {
    /// Never.
    Off,
    /// Before an update classed `risky` (or `destructive`).
    #[default]
    Risky,
    /// Before every update.
    Updates,
}

impl SnapshotMode {
    /// `off`, `risky` or `updates`.
    pub fn name(self) -> &'static str {
        match self {
            SnapshotMode::Off => "off",
            SnapshotMode::Risky => "risky",
            SnapshotMode::Updates => "updates",
        }
    }

    /// Parses [`SnapshotMode::name`]'s output.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "off" => Some(SnapshotMode::Off),
            "risky" => Some(SnapshotMode::Risky),
            "updates" => Some(SnapshotMode::Updates),
            _ => None,
        }
    }
}

impl fmt::Display for SnapshotMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `[policy] snapshot`, `snapshot_keep` and `snapshot_required`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// When to snapshot (a guest's `proxops/snapshot` annotation overrides it).
    pub mode: SnapshotMode,
    /// How many of its own snapshots ProxOps keeps per guest (at least 1).
    pub keep: u32,
    /// Hold an update that should get a snapshot but cannot.
    pub required: bool,
}

impl Default for SnapshotPolicy {
    /// `risky`, keep 3, not required.
    fn default() -> Self {
        Self {
            mode: SnapshotMode::Risky,
            keep: DEFAULT_KEEP,
            required: false,
        }
    }
}

/// The mode in force for one guest: its `proxops/snapshot` annotation (validated with the
/// manifest, so an unknown value cannot reach here; it is ignored if it does), else the
/// policy's.
pub fn mode_for(policy: SnapshotMode, annotation: Option<&str>) -> SnapshotMode {
    annotation.and_then(SnapshotMode::parse).unwrap_or(policy)
}

/// Whether `action` gets a snapshot first, under `policy` and the guest's annotation.
pub fn wants_snapshot(action: &Action, policy: SnapshotMode, annotation: Option<&str>) -> bool {
    let Verb::Update(_) = action.verb else {
        return false;
    };
    match mode_for(policy, annotation) {
        SnapshotMode::Off => false,
        SnapshotMode::Updates => true,
        SnapshotMode::Risky => risk(action) >= Risk::Risky,
    }
}

/// Whether PVE accepts `name` as a snapshot name (`pve-configid`, at most 40 characters, not
/// a reserved name).
pub fn is_valid_snapshot_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    let first_letter = bytes.next().is_some_and(|b| b.is_ascii_alphabetic());
    first_letter
        && name.len() >= 2
        && name.len() <= MAX_NAME_LEN
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && name != "current"
        && !name.eq_ignore_ascii_case("pending")
        && name != "vzdump"
}

/// The commit's first seven characters, lowercased, keeping only `[a-z0-9]` (a directory
/// checkout has no commit: `local`).
fn short_commit(commit: &str) -> String {
    let short: String = commit
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(7)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if short.is_empty() {
        "local".to_owned()
    } else {
        short
    }
}

/// `proxops-<commit 7>-<n>` with the smallest `n` from 1 that no name in `existing` (every
/// snapshot PVE lists for the guest, ProxOps's or not) uses.
pub fn snapshot_name<'a>(commit: &str, existing: impl IntoIterator<Item = &'a str>) -> String {
    let stem = format!("{PREFIX}{}-", short_commit(commit));
    let taken: std::collections::BTreeSet<&str> = existing.into_iter().collect();
    let mut n: u64 = 1;
    loop {
        let name = format!("{stem}{n}");
        if !taken.contains(name.as_str()) {
            return name;
        }
        n += 1;
    }
}

/// Of ProxOps's own snapshots of one guest, oldest first, the ones to delete so that the
/// newest `keep` remain (`keep` 0 is taken as 1: the snapshot just taken always stays).
/// Only names with [`PREFIX`] are ever returned.
pub fn to_delete<T: AsRef<str>>(ours_oldest_first: &[T], keep: u32) -> Vec<&str> {
    let keep = usize::try_from(keep.max(1)).unwrap_or(usize::MAX);
    let excess = ours_oldest_first.len().saturating_sub(keep);
    ours_oldest_first[..excess]
        .iter()
        .map(AsRef::as_ref)
        .filter(|name| name.starts_with(PREFIX))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::guest::GuestType;
    use crate::plan::{GuestRef, Update};
    use crate::resource::{Kind, ResourceId};

    fn update(keys: &[&str]) -> Action {
        Action {
            resource: ResourceId::new(Kind::Vm, "app"),
            node: "pve1".to_owned(),
            verb: Verb::Update(Update {
                vmid: 100,
                guest_type: GuestType::Qemu,
                set: keys
                    .iter()
                    .map(|k| ((*k).to_owned(), "1".to_owned()))
                    .collect(),
                delete: BTreeSet::new(),
                digest: None,
                grow: Vec::new(),
                changes: Vec::new(),
                regenerate_cloudinit: false,
            }),
            reason: String::new(),
        }
    }

    fn power(verb: fn(GuestRef) -> Verb) -> Action {
        Action {
            verb: verb(GuestRef {
                vmid: 100,
                guest_type: GuestType::Qemu,
            }),
            ..update(&[])
        }
    }

    #[test]
    fn risky_mode_snapshots_a_risky_update_and_not_a_safe_one() {
        assert!(wants_snapshot(
            &update(&["memory"]),
            SnapshotMode::Risky,
            None
        ));
        assert!(!wants_snapshot(
            &update(&["tags"]),
            SnapshotMode::Risky,
            None
        ));
    }

    #[test]
    fn updates_mode_snapshots_every_update_and_off_none() {
        assert!(wants_snapshot(
            &update(&["tags"]),
            SnapshotMode::Updates,
            None
        ));
        assert!(!wants_snapshot(
            &update(&["memory"]),
            SnapshotMode::Off,
            None
        ));
    }

    #[test]
    fn the_guest_annotation_overrides_the_policy_both_ways() {
        assert!(!wants_snapshot(
            &update(&["memory"]),
            SnapshotMode::Risky,
            Some("off")
        ));
        assert!(wants_snapshot(
            &update(&["tags"]),
            SnapshotMode::Off,
            Some("updates")
        ));
        assert!(wants_snapshot(
            &update(&["memory"]),
            SnapshotMode::Off,
            Some("risky")
        ));
        assert_eq!(
            mode_for(SnapshotMode::Updates, Some("bogus")),
            SnapshotMode::Updates
        );
    }

    #[test]
    fn creates_deletes_and_power_actions_never_get_a_snapshot() {
        for action in [
            power(Verb::Shutdown),
            power(Verb::Reboot),
            power(Verb::Start),
            power(Verb::Delete),
            power(Verb::Promote),
            Action {
                verb: Verb::Create(crate::plan::Create {
                    vmid: 100,
                    guest_type: GuestType::Qemu,
                    params: BTreeMap::new(),
                    grow: Vec::new(),
                    after: BTreeMap::new(),
                }),
                ..update(&[])
            },
        ] {
            assert!(
                !wants_snapshot(&action, SnapshotMode::Updates, Some("updates")),
                "{}",
                action.verb.name()
            );
        }
    }

    #[test]
    fn names_carry_the_short_commit_and_the_first_free_number() {
        let commit = "0123abcDEF4567890123456789abcdef01234567";
        assert_eq!(snapshot_name(commit, []), "proxops-0123abc-1");
        assert_eq!(
            snapshot_name(commit, ["proxops-0123abc-1", "proxops-0123abc-2", "mine"]),
            "proxops-0123abc-3"
        );
        assert_eq!(snapshot_name("", []), "proxops-local-1");
    }

    #[test]
    fn every_generated_name_is_one_pve_accepts() {
        for commit in ["0123456789abcdef", "", "../x y", "ABCDEFGHIJKLMNOP"] {
            let name = snapshot_name(commit, []);
            assert!(is_valid_snapshot_name(&name), "{name}");
        }
        let crowded: Vec<String> = (1..=1000).map(|n| format!("proxops-abcdef0-{n}")).collect();
        let name = snapshot_name("abcdef0", crowded.iter().map(String::as_str));
        assert_eq!(name, "proxops-abcdef0-1001");
        assert!(is_valid_snapshot_name(&name));
    }

    #[test]
    fn pve_refuses_names_that_are_not_config_ids() {
        for bad in [
            "1abc",
            "a",
            "with space",
            "current",
            "PENDING",
            "a.b",
            &"a".repeat(41),
        ] {
            assert!(!is_valid_snapshot_name(bad), "{bad}");
        }
        assert!(is_valid_snapshot_name("before-upgrade_2"));
    }

    #[test]
    fn retention_keeps_the_newest_and_deletes_only_proxops_names() {
        let ours = ["proxops-a-1", "proxops-a-2", "proxops-b-1", "proxops-c-1"];
        assert_eq!(to_delete(&ours, 3), vec!["proxops-a-1"]);
        assert_eq!(
            to_delete(&ours, 1),
            vec!["proxops-a-1", "proxops-a-2", "proxops-b-1"]
        );
        assert!(to_delete(&ours, 4).is_empty());
        assert_eq!(
            to_delete(&ours, 0).len(),
            3,
            "keep 0 still keeps the newest"
        );
        assert!(to_delete(&["someone-else", "proxops-x-1"], 1).is_empty());
    }
}
