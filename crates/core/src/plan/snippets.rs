//! Cloud-init snippets: which files to write before a VM's actions, and which ProxOps files
//! to remove once no guest names them and their grace period is over.
//!
//! A VM's snippets are written in the VM's own level, ahead of its other actions (the verb
//! order puts `write-snippet` first), so a failed write stops the update that would point
//! `cicustom` at a missing file. A file already listed on the storage is not written again:
//! names are content-addressed ([`crate::snippet`]), so a listed name is the same text.
//!
//! A VM whose snippets cannot be written (the storage lacks `snippets` content, is not on
//! the node, or could not be listed) gets a finding and no action at all this pass, as
//! qemu-server would refuse its start or `PUT .../cloudinit` otherwise (`Cloudinit.pm`,
//! `read_cloudinit_snippets_file`: `$volid is not in the snippets directory`;
//! `PVE/Storage.pm`, `abs_filesystem_path`: `can't find file '$volid'`).
//!
//! Removal is fail-closed: only names ProxOps gives ([`snippet::parse_file_name`]), never a
//! file any desired VM resolves to, never a file an observed config (current or pending)
//! names, nothing on a node where a guest config could not be read, and only once the
//! file's `ctime` is before [`Policy::snippets_removable_before`]. On a shared storage a file
//! is removed only by a pass whose scope holds the node of the VM it belongs to, so two
//! nodes never both judge it.

use std::collections::BTreeSet;

use super::{Action, Finding, FindingKind, Plan, Policy, Snippet, Verb};
use crate::manifest::Spec;
use crate::observed::{Listing, ObservedState};
use crate::repository::DesiredState;
use crate::resource::{Kind, ResourceId};
use crate::snippet::{self, ResolvedSnippet};

/// The PVE content type of snippets.
const SNIPPETS: &str = "snippets";

/// A VM with resolved snippets: its id, node and snippets.
fn vms_with_snippets(
    desired: &DesiredState,
) -> impl Iterator<Item = (&ResourceId, &str, &[ResolvedSnippet])> {
    desired.manifest.resources().filter_map(|r| match &r.spec {
        Some(Spec::Vm(vm)) => {
            let resolved = vm.cloud_init_data.snippets.resolved.as_ref()?;
            (!resolved.snippets.is_empty()).then_some((
                &r.id,
                vm.node.as_str(),
                resolved.snippets.as_slice(),
            ))
        }
        _ => None,
    })
}

/// Adds the snippet writes of every VM in scope to its level, or blocks the VM when its
/// snippets cannot be written.
pub(super) fn plan_writes(
    desired: &DesiredState,
    observed: &ObservedState,
    policy: &Policy,
    levels: &mut [Vec<Action>],
    plan: &mut Plan,
) {
    let level_of = super::guests::level_index(desired);
    for (id, node, snippets) in vms_with_snippets(desired) {
        if !policy.scope.includes(node) || plan.blocked.contains(&(id.clone(), node.to_owned())) {
            continue;
        }
        let mut writes = Vec::new();
        let mut problems = Vec::new();
        for s in snippets {
            match write_of(observed, id, node, s) {
                Ok(Some(action)) => writes.push(action),
                Ok(None) => {}
                Err(finding) => problems.push(*finding),
            }
        }
        let level = level_of.get(id).copied().unwrap_or(0).min(levels.len() - 1);
        if problems.is_empty() {
            levels[level].extend(writes);
        } else {
            // Nothing of this VM runs: its cicustom would name a file that is not there.
            for level in levels.iter_mut() {
                level.retain(|a| !(a.resource == *id && a.node == node));
            }
            plan.findings.extend(problems);
            plan.blocked.insert((id.clone(), node.to_owned()));
        }
    }
}

fn write_of(
    observed: &ObservedState,
    id: &ResourceId,
    node: &str,
    s: &ResolvedSnippet,
) -> Result<Option<Action>, Box<Finding>> {
    let field = format!("spec.cloud-init-data.{}", s.kind.field());
    let finding = |kind: FindingKind, message: String, observed_value: String| {
        Box::new(Finding {
            resource: id.clone(),
            node: node.to_owned(),
            kind,
            field: field.clone(),
            desired: s.volid(),
            observed: observed_value,
            message,
        })
    };
    let Some(storage) = observed.storage(node, &s.storage) else {
        return Err(finding(
            FindingKind::SnippetsStorage,
            format!(
                "storage {} is not available on node {node}, so the snippet cannot be written; \
                 set `spec.cloud-init-data.snippets-storage` (or `[snippets] storage` in \
                 agent.toml) to a storage of {node} with `snippets` content; the VM is not \
                 changed until then",
                s.storage
            ),
            String::new(),
        ));
    };
    if !storage.content.contains(SNIPPETS) {
        let mut content: Vec<&str> = storage.content.iter().map(String::as_str).collect();
        let has = if content.is_empty() {
            "none".to_owned()
        } else {
            content.join(",")
        };
        content.push(SNIPPETS);
        return Err(finding(
            FindingKind::SnippetsStorage,
            format!(
                "storage {} has no `snippets` content (it has: {has}), so PVE would not read \
                 the snippet; allow it with `pvesm set {} --content {}`, or choose another \
                 storage with `spec.cloud-init-data.snippets-storage`; the VM is not changed \
                 until then",
                s.storage,
                s.storage,
                content.join(",")
            ),
            has,
        ));
    }
    let volid = s.volid();
    match storage.listings.get(SNIPPETS) {
        Some(Listing::Listed(present)) if present.contains(&volid) => Ok(None),
        Some(Listing::Listed(_)) => {
            let what = if s.has_secrets {
                "content changed (it holds SOPS values, not shown)".to_owned()
            } else {
                format!(
                    "content changed: sha256 {}",
                    &s.sha256[..s.sha256.len().min(snippet::HASH_DIGITS)]
                )
            };
            Ok(Some(Action {
                resource: id.clone(),
                node: node.to_owned(),
                verb: Verb::WriteSnippet(Snippet {
                    storage: s.storage.clone(),
                    file: s.file.clone(),
                    sha256: s.sha256.clone(),
                    secret: s.has_secrets,
                    shared: storage.shared,
                }),
                reason: format!("{} {volid} is absent: {what}", s.kind.field()),
            }))
        }
        Some(Listing::Failed(reason)) => Err(finding(
            FindingKind::ObserveFailed,
            format!(
                "the snippets of storage {} could not be listed ({reason}); the VM is not \
                 changed this pass",
                s.storage
            ),
            String::new(),
        )),
        None => Err(finding(
            FindingKind::ObserveFailed,
            format!(
                "the snippets of storage {} were not listed; the VM is not changed this pass",
                s.storage
            ),
            String::new(),
        )),
    }
}

/// Adds the removal of every ProxOps snippet in scope that nothing names and whose grace
/// period is over.
pub(super) fn plan_removals(
    desired: &DesiredState,
    observed: &ObservedState,
    policy: &Policy,
    actions: &mut Vec<Action>,
) {
    let Some(before) = policy.snippets_removable_before else {
        return;
    };
    let Ok(guests) = &observed.resources else {
        return;
    };
    let desired_files: BTreeSet<String> = vms_with_snippets(desired)
        .flat_map(|(_, _, snippets)| snippets.iter().map(ResolvedSnippet::volid))
        .collect();
    let mut named: BTreeSet<String> = BTreeSet::new();
    let mut unreadable: BTreeSet<&str> = BTreeSet::new();
    for guest in guests.values() {
        match &guest.config {
            Some(Ok(config)) => {
                for value in [config.get("cicustom"), config.current().get("cicustom")]
                    .into_iter()
                    .flatten()
                {
                    named.extend(snippet::cicustom_volids(value));
                }
            }
            Some(Err(_)) => {
                unreadable.insert(guest.node.as_str());
            }
            None => {}
        }
    }
    for ((node, storage), obs) in &observed.storages {
        if !policy.scope.includes(node) || unreadable.contains(node.as_str()) {
            continue;
        }
        let Some(Listing::Listed(present)) = obs.listings.get(SNIPPETS) else {
            continue;
        };
        for volid in present {
            let Some(file) = volid.strip_prefix(&format!("{storage}:snippets/")) else {
                continue;
            };
            let Some((guest, _, _)) = snippet::parse_file_name(file) else {
                continue;
            };
            if desired_files.contains(volid) || named.contains(volid) {
                continue;
            }
            let declared = declared_vm(desired, guest);
            if obs.shared && declared.as_ref().is_none_or(|(_, n)| n != node) {
                continue;
            }
            if obs.ctimes.get(volid).is_none_or(|ctime| *ctime >= before) {
                continue;
            }
            let resource = declared
                .map(|(id, _)| id)
                .unwrap_or_else(|| ResourceId::new(Kind::Vm, guest));
            actions.push(Action {
                resource,
                node: node.clone(),
                verb: Verb::RemoveSnippet(Snippet {
                    storage: storage.clone(),
                    file: file.to_owned(),
                    sha256: String::new(),
                    secret: false,
                    shared: obs.shared,
                }),
                reason: format!(
                    "{volid} is named by no guest's cicustom and its grace period is over"
                ),
            });
        }
    }
}

/// The VM or TemplateVM named `name` and its node.
fn declared_vm(desired: &DesiredState, name: &str) -> Option<(ResourceId, String)> {
    [Kind::Vm, Kind::TemplateVm].into_iter().find_map(|kind| {
        let id = ResourceId::new(kind, name);
        match &desired.manifest.get(&id)?.spec {
            Some(Spec::Vm(vm)) => Some((id, vm.node.as_str().to_owned())),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use crate::guest::{GuestType, LiveConfig};
    use crate::manifest::SnippetKind;
    use crate::observed::{Listing, ObservedGuest, ObservedState};
    use crate::plan::{FindingKind, Inventory, NodeScope, Plan, Policy, Verb, plan};
    use crate::repository::{DesiredState, load};
    use crate::resource::{Kind, ResourceId};
    use crate::secret::Sealed;
    use crate::snippet::{ResolvedSnippet, ResolvedSnippets};

    const FILE: &str = "proxops-web-user-0123456789ab.yaml";
    const OLD: &str = "proxops-web-user-ba9876543210.yaml";

    /// VM `web` with user-data, resolved to [`FILE`] on `local`.
    fn desired() -> DesiredState {
        let doc = "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata: {name: web}\nspec:\n  node: pve1\n  vmid: 130\n  memory: 1GiB\n  cpu: {type: host, cores: 1}\n  disks:\n    - {storage: local-lvm, size: 4GiB}\n  cloud-init-data:\n    user-data: \"#cloud-config\\n\"\n";
        let files = BTreeMap::from([("vm.yaml".to_owned(), doc.to_owned())]);
        let mut state = load(&files).states.into_iter().next().expect("valid");
        let resolved = ResolvedSnippets {
            snippets: vec![ResolvedSnippet {
                kind: SnippetKind::User,
                storage: "local".into(),
                file: FILE.into(),
                sha256: "0123456789abcdef".into(),
                content: Sealed::new("#cloud-config\n"),
                has_secrets: false,
            }],
        };
        assert!(
            state
                .manifest
                .set_resolved_snippets(&ResourceId::new(Kind::Vm, "web"), resolved)
        );
        state
    }

    fn observed(content: &[&str], files: &[(&str, u64)]) -> ObservedState {
        let mut o = ObservedState::default();
        o.add_storage(
            "pve1",
            "local",
            false,
            content.iter().map(|c| (*c).to_owned()),
        );
        let listed: BTreeSet<String> = files
            .iter()
            .map(|(f, _)| format!("local:snippets/{f}"))
            .collect();
        o.add_listing("pve1", "local", "snippets", Listing::Listed(listed));
        if let Some(s) = o.storages.get_mut(&("pve1".to_owned(), "local".to_owned())) {
            s.ctimes = files
                .iter()
                .map(|(f, t)| (format!("local:snippets/{f}"), *t))
                .collect();
        }
        o
    }

    fn with_cicustom(mut o: ObservedState, cicustom: &str) -> ObservedState {
        let config = LiveConfig::from_pairs(
            GuestType::Qemu,
            [("cicustom", cicustom), ("tags", "proxops"), ("name", "web")],
        );
        let mut g =
            ObservedGuest::new(130, "pve1", GuestType::Qemu, "stopped").with_tags("proxops");
        g.config = Some(Ok(config));
        g.pending = Some(Ok(Default::default()));
        o.add_guest(g);
        o
    }

    fn policy(removable_before: Option<u64>) -> Policy {
        Policy {
            snippets_removable_before: removable_before,
            ..Policy::new(NodeScope::Node("pve1".into()))
        }
    }

    fn run(o: &ObservedState, p: &Policy) -> Plan {
        plan(&desired(), o, &Inventory::from_tags(o), p)
    }

    fn verbs(p: &Plan) -> Vec<&'static str> {
        p.actions().map(|a| a.verb.name()).collect()
    }

    #[test]
    fn an_absent_snippet_is_written_before_the_vm_is_created_and_a_listed_one_is_not() {
        let p = run(&observed(&["snippets"], &[]), &policy(None));
        assert_eq!(verbs(&p)[..2], ["write-snippet", "create"]);
        let Verb::WriteSnippet(s) = &p.levels[0][0].verb else {
            panic!("{p:?}");
        };
        assert_eq!(s.volid(), format!("local:snippets/{FILE}"));
        let Verb::Create(c) = &p.levels[0][1].verb else {
            panic!("{p:?}");
        };
        assert_eq!(c.params["cicustom"], format!("user=local:snippets/{FILE}"));
        let p = run(&observed(&["snippets"], &[(FILE, 1)]), &policy(None));
        assert_eq!(verbs(&p), ["create", "start"]);
    }

    #[test]
    fn a_storage_without_snippets_content_blocks_the_vm_with_what_to_run() {
        let p = run(&observed(&["iso", "vztmpl"], &[]), &policy(None));
        assert!(!p.has_changes(), "{p:?}");
        assert_eq!(p.findings.len(), 1, "{:?}", p.findings);
        let f = &p.findings[0];
        assert_eq!(f.kind, FindingKind::SnippetsStorage);
        assert_eq!(f.field, "spec.cloud-init-data.user-data");
        assert!(
            f.message
                .contains("`pvesm set local --content iso,vztmpl,snippets`"),
            "{}",
            f.message
        );
        assert!(
            p.blocked
                .contains(&(ResourceId::new(Kind::Vm, "web"), "pve1".to_owned()))
        );
    }

    #[test]
    fn a_changed_cicustom_regenerates_the_drive() {
        let o = with_cicustom(
            observed(&["snippets"], &[(FILE, 1), (OLD, 1)]),
            &format!("user=local:snippets/{OLD}"),
        );
        let p = run(&o, &policy(None));
        let update = p
            .actions()
            .find_map(|a| match &a.verb {
                Verb::Update(u) => Some(u),
                _ => None,
            })
            .expect("an update");
        assert_eq!(
            update.set["cicustom"],
            format!("user=local:snippets/{FILE}")
        );
        assert!(update.regenerate_cloudinit);
    }

    #[test]
    fn only_unreferenced_proxops_files_past_the_grace_are_removed() {
        let files = [
            (FILE, 10),
            (OLD, 10),
            ("proxops-gone-user-aaaaaaaaaaaa.yaml", 10),
            ("proxops-young-user-bbbbbbbbbbbb.yaml", 500),
            ("hand-made.yaml", 10),
        ];
        // The old file is still named by the live cicustom: kept.
        let o = with_cicustom(
            observed(&["snippets"], &files),
            &format!("user=local:snippets/{OLD}"),
        );
        let removed: Vec<String> = run(&o, &policy(Some(100)))
            .actions()
            .filter_map(|a| match &a.verb {
                Verb::RemoveSnippet(s) => Some(s.file.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(removed, ["proxops-gone-user-aaaaaaaaaaaa.yaml"]);
        // Without a cutoff nothing is removed.
        assert!(
            !run(&o, &policy(None))
                .actions()
                .any(|a| matches!(a.verb, Verb::RemoveSnippet(_)))
        );
        // Once nothing names it, the old file goes too.
        let o = with_cicustom(
            observed(&["snippets"], &files),
            &format!("user=local:snippets/{FILE}"),
        );
        let removed: BTreeSet<String> = run(&o, &policy(Some(100)))
            .actions()
            .filter_map(|a| match &a.verb {
                Verb::RemoveSnippet(s) => Some(s.file.clone()),
                _ => None,
            })
            .collect();
        assert!(
            removed.contains(OLD) && !removed.contains(FILE),
            "{removed:?}"
        );
    }
}
