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
        if !policy.scope.includes(node) || plan.blocked.contains(&(id.clone(), node.to_owned()))
        {
            continue;
        }
        let mut writes = Vec::new();
        let mut problems = Vec::new();
        for s in snippets {
            match write_of(observed, id, node, s) {
                Ok(Some(action)) => writes.push(action),
                Ok(None) => {}
                Err(finding) => problems.push(finding),
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
) -> Result<Option<Action>, Finding> {
    let field = format!("spec.cloud-init-data.{}", s.kind.field());
    let finding = |kind: FindingKind, message: String, observed_value: String| Finding {
        resource: id.clone(),
        node: node.to_owned(),
        kind,
        field: field.clone(),
        desired: s.volid(),
        observed: observed_value,
        message,
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
