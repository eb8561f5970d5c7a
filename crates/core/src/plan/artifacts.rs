//! Planning storage artifacts (ISO, CTTemplate, DiskImage) exactly as DESIGN.md §2.3.
//!
//! Per declared node in scope: absent from a readable listing → one download on that node;
//! present → nothing; unreadable listing → a finding, the (artifact, node) pair is blocked so
//! its dependants there wait, and the next pass retries. Nodes are independent. Artifacts
//! are never pruned. A storage PVE reports as shared holds one file for every node: one
//! download at most, on the first declared node in scope whose listing could be read.

use crate::manifest::{Resource, Spec, content_type};
use crate::observed::{Listing, ObservedState};
use crate::plan::{Action, Checksum, Download, Finding, FindingKind, Plan, Policy, Verb};
use crate::repository::DesiredState;

enum Presence {
    Present,
    Absent,
    Unknown(String),
}

fn presence(
    observed: &ObservedState,
    node: &str,
    storage: &str,
    content: &str,
    volid: &str,
) -> Presence {
    let Some(obs) = observed.storage(node, storage) else {
        return Presence::Unknown(format!("storage {storage} was not reported on node {node}"));
    };
    match obs.listings.get(content) {
        Some(Listing::Listed(volids)) if volids.contains(volid) => Presence::Present,
        Some(Listing::Listed(_)) => Presence::Absent,
        Some(Listing::Failed(reason)) => Presence::Unknown(format!(
            "listing {content} content of {storage} failed: {reason}"
        )),
        None => Presence::Unknown(format!("{content} content of {storage} was not listed")),
    }
}

pub(crate) fn plan_artifacts(
    desired: &DesiredState,
    observed: &ObservedState,
    policy: &Policy,
    actions: &mut Vec<Action>,
    plan: &mut Plan,
) {
    for resource in desired.manifest.resources() {
        let Some(Spec::Artifact(spec)) = &resource.spec else {
            continue;
        };
        let content = content_type(resource.id.kind);
        let storage = spec.storage.as_str();
        let volid = spec.volid(resource.id.kind);
        let nodes: Vec<&str> = spec.nodes.iter().map(|n| n.as_str()).collect();
        let in_scope: Vec<&str> = nodes
            .iter()
            .copied()
            .filter(|n| policy.scope.includes(n))
            .collect();
        let shared = nodes
            .iter()
            .any(|n| observed.storage(n, storage).is_some_and(|s| s.shared));
        let download = |node: &str, reason: String| Action {
            resource: resource.id.clone(),
            node: node.to_owned(),
            verb: Verb::Download(Download {
                storage: storage.to_owned(),
                content: content.to_owned(),
                filename: spec.filename.clone(),
                url: spec.url.clone(),
                checksum: spec.checksum.as_ref().map(|c| Checksum {
                    algorithm: c.algorithm.as_str().to_owned(),
                    value: c.value.clone(),
                }),
                volid: volid.clone(),
            }),
            reason,
        };

        if shared {
            plan_shared(
                resource, observed, &in_scope, storage, content, &volid, plan, actions, download,
            );
            continue;
        }
        for node in in_scope {
            match presence(observed, node, storage, content, &volid) {
                Presence::Present => {}
                Presence::Absent => {
                    actions.push(download(node, format!("{volid} is absent on {node}")));
                }
                Presence::Unknown(reason) => blocked(plan, resource, node, &volid, &reason),
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn plan_shared(
    resource: &Resource,
    observed: &ObservedState,
    in_scope: &[&str],
    storage: &str,
    content: &str,
    volid: &str,
    plan: &mut Plan,
    actions: &mut Vec<Action>,
    download: impl Fn(&str, String) -> Action,
) {
    let mut first_absent = None;
    let mut unknown = Vec::new();
    for node in in_scope {
        match presence(observed, node, storage, content, volid) {
            Presence::Present => return,
            Presence::Absent => {
                first_absent.get_or_insert(*node);
            }
            Presence::Unknown(reason) => unknown.push((*node, reason)),
        }
    }
    match first_absent {
        Some(node) => actions.push(download(
            node,
            format!(
                "{volid} is absent from shared storage {storage} (one download serves every node)"
            ),
        )),
        None => {
            for (node, reason) in unknown {
                blocked(plan, resource, node, volid, &reason);
            }
        }
    }
}

fn blocked(plan: &mut Plan, resource: &Resource, node: &str, volid: &str, reason: &str) {
    plan.findings.push(Finding {
        resource: resource.id.clone(),
        node: node.to_owned(),
        kind: FindingKind::ObserveFailed,
        field: String::new(),
        desired: volid.to_owned(),
        observed: String::new(),
        message: format!(
            "{reason}; nothing is changed for it on {node} this pass, the next pass retries"
        ),
    });
    plan.blocked.insert((resource.id.clone(), node.to_owned()));
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use crate::observed::{Listing, ObservedState};
    use crate::plan::{FindingKind, Inventory, NodeScope, Plan, Policy, Verb, plan};
    use crate::repository::{DesiredState, load};

    fn desired(docs: &[(&str, &str)]) -> DesiredState {
        let files: BTreeMap<String, String> = docs
            .iter()
            .map(|(p, c)| ((*p).to_owned(), (*c).to_owned()))
            .collect();
        let loaded = load(&files);
        assert!(loaded.diagnostics.is_empty(), "{:?}", loaded.diagnostics);
        loaded.states.into_iter().next().expect("one desired state")
    }

    const ISO: &str = "apiVersion: proxops/v1alpha1
kind: ISO
metadata: {name: netinst}
spec:
  nodes: [pve1, pve2]
  storage: local
  filename: netinst.iso
  url: http://127.0.0.1:9/netinst.iso
  checksum: {algorithm: sha256, value: 0000000000000000000000000000000000000000000000000000000000000000}
";

    const DISK: &str = "apiVersion: proxops/v1alpha1
kind: DiskImage
metadata: {name: cloud}
spec: {node: pve1, storage: local, filename: cloud.qcow2, url: 'https://x.org/cloud.qcow2'}
";

    fn listed(
        observed: &mut ObservedState,
        node: &str,
        storage: &str,
        content: &str,
        volids: &[&str],
    ) {
        observed.add_storage(node, storage, false, [content.to_owned()]);
        let set: BTreeSet<String> = volids.iter().map(|v| (*v).to_owned()).collect();
        observed.add_listing(node, storage, content, Listing::Listed(set));
    }

    fn all() -> Policy {
        Policy::new(NodeScope::All)
    }

    fn downloads(plan: &Plan) -> Vec<(String, String)> {
        plan.actions()
            .filter_map(|a| match &a.verb {
                Verb::Download(d) => Some((a.node.clone(), d.volid.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_artifact_absent_on_two_nodes_is_downloaded_once_per_node() {
        let state = desired(&[("iso.yaml", ISO)]);
        let mut observed = ObservedState::default();
        listed(&mut observed, "pve1", "local", "iso", &[]);
        listed(
            &mut observed,
            "pve2",
            "local",
            "iso",
            &["local:iso/other.iso"],
        );
        let plan = plan(&state, &observed, &Inventory::default(), &all());
        assert_eq!(
            downloads(&plan),
            [
                ("pve1".to_owned(), "local:iso/netinst.iso".to_owned()),
                ("pve2".to_owned(), "local:iso/netinst.iso".to_owned())
            ]
        );
        let Verb::Download(d) = &plan.levels[0][0].verb else {
            panic!("a download")
        };
        let checksum = d.checksum.as_ref().unwrap();
        assert_eq!(
            (checksum.algorithm.as_str(), d.content.as_str()),
            ("sha256", "iso")
        );
    }

    #[test]
    fn an_artifact_present_everywhere_plans_nothing() {
        let state = desired(&[("iso.yaml", ISO)]);
        let mut observed = ObservedState::default();
        listed(
            &mut observed,
            "pve1",
            "local",
            "iso",
            &["local:iso/netinst.iso"],
        );
        listed(
            &mut observed,
            "pve2",
            "local",
            "iso",
            &["local:iso/netinst.iso"],
        );
        let plan = plan(&state, &observed, &Inventory::default(), &all());
        assert!(!plan.has_changes() && plan.findings.is_empty());
    }

    #[test]
    fn an_unreadable_listing_skips_only_that_node_with_a_finding() {
        let state = desired(&[("iso.yaml", ISO)]);
        let mut observed = ObservedState::default();
        listed(&mut observed, "pve1", "local", "iso", &[]);
        observed.add_storage("pve2", "local", false, ["iso".to_owned()]);
        observed.add_listing(
            "pve2",
            "local",
            "iso",
            Listing::Failed("500 storage offline".into()),
        );
        let plan = plan(&state, &observed, &Inventory::default(), &all());
        assert_eq!(
            downloads(&plan),
            [("pve1".to_owned(), "local:iso/netinst.iso".to_owned())]
        );
        assert_eq!(plan.findings.len(), 1);
        assert_eq!(plan.findings[0].kind, FindingKind::ObserveFailed);
        assert_eq!(plan.findings[0].node, "pve2");
        assert!(plan.findings[0].message.contains("500 storage offline"));
        assert!(
            plan.blocked
                .iter()
                .any(|(id, node)| id.name == "netinst" && node == "pve2")
        );
    }

    #[test]
    fn only_nodes_in_scope_are_planned() {
        let state = desired(&[("iso.yaml", ISO)]);
        let mut observed = ObservedState::default();
        listed(&mut observed, "pve2", "local", "iso", &[]);
        let policy = Policy::new(NodeScope::Node("pve2".into()));
        assert_eq!(
            downloads(&plan(&state, &observed, &Inventory::default(), &policy)).len(),
            1
        );
    }

    #[test]
    fn a_shared_storage_gets_one_download_for_all_nodes() {
        let state = desired(&[("iso.yaml", ISO)]);
        let mut observed = ObservedState::default();
        for node in ["pve1", "pve2"] {
            observed.add_storage(node, "local", true, ["iso".to_owned()]);
            observed.add_listing(node, "local", "iso", Listing::Listed(BTreeSet::new()));
        }
        assert_eq!(
            downloads(&plan(&state, &observed, &Inventory::default(), &all())),
            [("pve1".to_owned(), "local:iso/netinst.iso".to_owned())]
        );
    }

    #[test]
    fn a_disk_image_lives_in_import_content() {
        let state = desired(&[("disk.yaml", DISK)]);
        let mut observed = ObservedState::default();
        listed(&mut observed, "pve1", "local", "import", &[]);
        assert_eq!(
            downloads(&plan(&state, &observed, &Inventory::default(), &all())),
            [("pve1".to_owned(), "local:import/cloud.qcow2".to_owned())]
        );
    }

    #[test]
    fn the_same_inputs_render_the_same_plan() {
        let state = desired(&[("iso.yaml", ISO), ("disk.yaml", DISK)]);
        let observed = ObservedState::default();
        let a = crate::plan::render::render_human(
            &plan(&state, &observed, &Inventory::default(), &all()),
            "x",
        );
        let b = crate::plan::render::render_human(
            &plan(&state, &observed, &Inventory::default(), &all()),
            "x",
        );
        assert_eq!(a, b);
    }
}
