//! The digest of a set of actions (issue 19, item 4: approvals): a stable SHA-256 over what
//! the actions would do, so an operator's approval of the actions a pass held applies to the
//! next pass only if it holds the same change.
//!
//! What counts: each action's resource, node and verb with its parameters (for an update,
//! the keys to set and delete, the volumes to grow and the field changes). What does not:
//! the action's `reason` (words for people) and an update's `digest` (PVE's config digest,
//! which moves with any write to the guest's config, also to keys ProxOps does not own).
//! The actions are hashed as a set: sorted by their canonical form, so the order in which a
//! plan lists them does not matter. The canonical form is JSON with every object's keys
//! sorted, written by this module (not by `serde_json`'s map, whose order depends on its
//! `preserve_order` feature), so the digest does not change with a dependency's features.

use std::fmt::Write as _;

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::{Action, Verb};

/// The digest of `actions`: `sha256:` and 64 lowercase hex digits. The same set of actions
/// gives the same digest in every process and on every run.
pub fn digest<'a>(actions: impl IntoIterator<Item = &'a Action>) -> String {
    let mut forms: Vec<String> = actions.into_iter().map(canonical).collect();
    forms.sort();
    forms.dedup();
    let mut hasher = Sha256::new();
    for form in &forms {
        hasher.update(form.as_bytes());
        hasher.update(b"\n");
    }
    let mut out = String::from("sha256:");
    for byte in hasher.finalize() {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// The first 12 hex digits of a digest, for people (`sha256:` dropped).
pub fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    hex.get(..12).unwrap_or(hex)
}

/// One action's canonical form: what it does, without its reason or PVE's config digest.
fn canonical(action: &Action) -> String {
    let mut verb = match &action.verb {
        Verb::Update(update) => {
            let mut update = update.clone();
            update.digest = None;
            serde_json::to_value(Verb::Update(update))
        }
        other => serde_json::to_value(other),
    }
    .unwrap_or(Value::Null);
    if let Value::Object(map) = &mut verb {
        map.remove("digest");
    }
    let value = serde_json::json!({
        "kind": action.resource.kind.as_str(),
        "name": action.resource.name,
        "node": action.node,
        "verb": verb,
    });
    let mut out = String::new();
    write_sorted(&value, &mut out);
    out
}

/// JSON with the keys of every object sorted.
fn write_sorted(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_sorted(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_sorted(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::guest::GuestType;
    use crate::plan::{Change, GuestRef, Update};
    use crate::resource::{Kind, ResourceId};

    fn delete(name: &str, vmid: u32) -> Action {
        Action {
            resource: ResourceId::new(Kind::Vm, name),
            node: "pve1".into(),
            verb: Verb::Delete(GuestRef {
                vmid,
                guest_type: GuestType::Qemu,
            }),
            reason: "no manifest declares it".into(),
        }
    }

    fn update(memory: &str, pve_digest: &str) -> Action {
        Action {
            resource: ResourceId::new(Kind::Vm, "web"),
            node: "pve1".into(),
            verb: Verb::Update(Update {
                vmid: 100,
                guest_type: GuestType::Qemu,
                set: BTreeMap::from([("memory".to_owned(), memory.to_owned())]),
                delete: BTreeSet::new(),
                digest: Some(pve_digest.to_owned()),
                grow: Vec::new(),
                changes: vec![Change {
                    field: "memory".into(),
                    observed: "2048".into(),
                    desired: memory.into(),
                }],
                regenerate_cloudinit: false,
            }),
            reason: "memory differs".into(),
        }
    }

    #[test]
    fn the_same_actions_give_the_same_digest_whatever_their_order() {
        let a = [
            delete("old", 101),
            delete("older", 102),
            update("4096", "d1"),
        ];
        let b = [
            update("4096", "d1"),
            delete("older", 102),
            delete("old", 101),
        ];
        assert_eq!(digest(&a), digest(&b));
        assert!(digest(&a).starts_with("sha256:"));
        assert_eq!(digest(&a).len(), "sha256:".len() + 64);
    }

    #[test]
    fn the_reason_and_pves_config_digest_do_not_change_the_digest() {
        let mut reworded = update("4096", "d1");
        reworded.reason = "memory is 2048 in PVE".into();
        assert_eq!(digest([&update("4096", "d1")]), digest([&reworded]));
        assert_eq!(
            digest([&update("4096", "d1")]),
            digest([&update("4096", "another config digest")])
        );
    }

    #[test]
    fn a_changed_parameter_or_another_action_gives_another_digest() {
        assert_ne!(
            digest([&update("4096", "d1")]),
            digest([&update("8192", "d1")])
        );
        assert_ne!(digest([&delete("old", 101)]), digest([&delete("old", 103)]));
        assert_ne!(
            digest([&delete("old", 101)]),
            digest([&delete("old", 101), &delete("older", 102)])
        );
        let mut elsewhere = delete("old", 101);
        elsewhere.node = "pve2".into();
        assert_ne!(digest([&delete("old", 101)]), digest([&elsewhere]));
    }

    #[test]
    fn the_digest_of_a_known_action_is_fixed_across_releases() {
        // Approvals survive restarts and upgrades: a changed canonical form would lapse
        // every recorded approval. This pins it.
        assert_eq!(
            canonical(&delete("old", 101)),
            r#"{"kind":"VM","name":"old","node":"pve1","verb":{"guest_type":"qemu","verb":"delete","vmid":101}}"#
        );
    }

    #[test]
    fn nested_objects_are_written_with_sorted_keys() {
        let value = serde_json::json!({"b": {"z": 1, "a": [ {"y": 2, "x": 3} ]}, "a": null});
        let mut out = String::new();
        write_sorted(&value, &mut out);
        assert_eq!(out, r#"{"a":null,"b":{"a":[{"x":3,"y":2}],"z":1}}"#);
    }
}
