//! The safety net as `proxops check` and `proxops plan` see it (follow-ups of issues 19 and
//! 22): which planned action gets a snapshot first (`[policy] snapshot`), which delete a
//! backup first (`[policy] backup_before_delete`), which VM the rollout's `guest-agent`
//! health pings after the pass, and the privileges PVE checks for each. Pure: it decides with
//! the functions the agent decides with ([`snapshot_policy::wants_snapshot`] and the
//! `proxops/snapshot` annotation as `execute/snapshot.rs` `before` reads them; every delete
//! when a backup policy is set, as `execute/mod.rs` `apply` does; [`ping_target`]), so
//! `check`, `plan` and the agent never disagree.
//!
//! Privileges, verified in PVE's sources:
//!
//! - snapshot: `VM.Snapshot` on `/vms/<vmid>` (proxmox/qemu-server @ e6352be6,
//!   `src/PVE/API2/Qemu.pm`, `snapshot` and `delsnapshot` (retention); proxmox/pve-container
//!   @ 94f5585, `src/PVE/API2/LXC/Snapshot.pm`, the same), and `VM.Audit` for the
//!   `GET …/feature?feature=snapshot` question and the snapshot list (`vm_feature`,
//!   `snapshot_list`; pve-container `API2/LXC.pm` `vm_feature`, `API2/LXC/Snapshot.pm`
//!   `list`). `proxops rollback` needs `VM.Snapshot` or `VM.Snapshot.Rollback` (`rollback`:
//!   `['VM.Snapshot', 'VM.Snapshot.Rollback'], any => 1`), so a token that may snapshot may
//!   roll back and no separate line is asked for;
//! - backup before delete: `VM.Backup` on `/vms/<vmid>` (proxmox/pve-manager @ 14a22df3,
//!   `PVE/VZDump.pm`, `exec_backup`: `$rpcenv->check($authuser, "/vms/$vmid", ['VM.Backup'])`)
//!   and `Datastore.AllocateSpace` on `/storage/<s>` (`PVE/API2/VZDump.pm`, `vzdump`, for the
//!   `storage` parameter). ProxOps sends neither `prune-backups`, `bwlimit`, `ionice`,
//!   `performance`, `fleecing` nor `stop`, the parameters that would need more
//!   (`assert_param_permission_vzdump`, `PVE/API2/Backup.pm` `assert_param_permission_common`);
//! - guest agent ping: PVE 9 `VM.GuestAgent.Audit` or `VM.GuestAgent.Unrestricted` on
//!   `/vms/<vmid>` (qemu-server @ e6352be6, `src/PVE/API2/Qemu/Agent.pm`,
//!   `$guest_agent_commands->{ping}` and `register_command`'s `any => 1`; since b92a40ce,
//!   "api: agent: use more specific guest agent privileges"); before it, `VM.Monitor`.

use proxops_core::manifest::SNAPSHOT;
use proxops_core::plan::snapshot_policy::{self, SnapshotMode};
use proxops_core::plan::{Action, Plan, Verb};
use proxops_core::repository::DesiredState;
use serde::Serialize;

use super::{Requirement, pp, require, require_any};
use crate::agent::rollout::ping_target;
use crate::cluster::rollout_config::Health;
use crate::config::AgentConfig;
use crate::execute::BackupPolicy;

/// The safety-net settings of one agent.toml.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetyNet {
    /// `[policy] snapshot` (a guest's `proxops/snapshot` annotation overrides it).
    pub snapshot: SnapshotMode,
    /// `[policy] backup_before_delete` and `backup_mode`.
    pub backup: Option<BackupPolicy>,
    /// The node whose VMs `[rollout] health = "guest-agent"` pings (`None`: no such health,
    /// or no rollout: it needs `[pmxcfs]` and one node, as `agent::rollout::Rollout::new`).
    pub ping_node: Option<String>,
}

impl SafetyNet {
    /// None of it: no snapshot, no backup, no ping.
    pub fn off() -> Self {
        Self {
            snapshot: SnapshotMode::Off,
            backup: None,
            ping_node: None,
        }
    }

    /// What `config` turns on.
    pub fn from_config(config: &AgentConfig) -> Self {
        let ping_node = match (&config.rollout, &config.pmxcfs, &config.node) {
            (Some(rollout), Some(_), proxops_core::plan::NodeScope::Node(node))
                if rollout.health == Health::GuestAgent =>
            {
                Some(node.clone())
            }
            _ => None,
        };
        Self {
            snapshot: config.policy.snapshots.mode,
            backup: config.policy.backup.clone(),
            ping_node,
        }
    }

    /// What runs before `action`, in the order the executor runs it.
    pub fn first(&self, action: &Action, desired: &DesiredState) -> Option<First> {
        if let (Verb::Delete(_), Some(policy)) = (&action.verb, &self.backup) {
            return Some(First::Backup {
                storage: policy.storage.clone(),
                mode: policy.mode.as_str().to_owned(),
            });
        }
        let annotation = desired
            .manifest
            .get(&action.resource)
            .and_then(|r| r.annotations.get(SNAPSHOT))
            .map(String::as_str);
        snapshot_policy::wants_snapshot(action, self.snapshot, annotation).then(|| {
            First::Snapshot {
                mode: snapshot_policy::mode_for(self.snapshot, annotation)
                    .name()
                    .to_owned(),
                set_by: if annotation.is_some() {
                    SetBy::Annotation
                } else {
                    SetBy::Policy
                },
            }
        })
    }

    /// The safety-net steps of `plan`, one per action that has one, in plan order.
    pub fn marks(&self, plan: &Plan, desired: &DesiredState) -> Vec<Mark> {
        plan.actions()
            .filter_map(|action| {
                Some(Mark {
                    resource: action.resource.to_string(),
                    node: action.node.clone(),
                    verb: action.verb.name().to_owned(),
                    first: self.first(action, desired)?,
                })
            })
            .collect()
    }

    /// The privileges the safety net needs for `plan` on a PVE of major version
    /// `pve_major` (`None`: unknown, taken as 9).
    pub fn requirements(
        &self,
        plan: &Plan,
        desired: &DesiredState,
        pve_major: Option<u32>,
    ) -> Vec<Requirement> {
        let mut out = Vec::new();
        for action in plan.actions() {
            let Some(guest) = action.verb.guest() else {
                continue;
            };
            let vm = format!("/vms/{}", guest.vmid);
            let what = format!("{} on {}", action.resource, action.node);
            match self.first(action, desired) {
                Some(First::Snapshot { mode, set_by }) => {
                    let setting = set_by.setting(&mode);
                    out.push(require(
                        &format!(
                            "snapshot {what} before its update ({setting}; proxops rollback \
                             needs it too)"
                        ),
                        vec![pp(&vm, "VM.Snapshot")],
                    ));
                    out.push(require(
                        &format!("ask PVE whether {what} can be snapshotted ({setting})"),
                        vec![pp(&vm, "VM.Audit")],
                    ));
                }
                Some(First::Backup { storage, .. }) => {
                    let why = format!(
                        "back up {what} before its delete ([policy] backup_before_delete = \
                         \"{storage}\")"
                    );
                    out.push(require(
                        &why,
                        vec![
                            pp(&vm, "VM.Backup"),
                            pp(format!("/storage/{storage}"), "Datastore.AllocateSpace"),
                        ],
                    ));
                }
                None => {}
            }
        }
        if let Some(node) = &self.ping_node {
            let mut pinged = std::collections::BTreeSet::new();
            for action in plan.actions() {
                let Some((vmid, name)) = ping_target(node, action, desired) else {
                    continue;
                };
                if !pinged.insert(vmid) {
                    continue;
                }
                let vm = format!("/vms/{vmid}");
                let why = format!(
                    "ping the guest agent of {name} on {node} after the pass ([rollout] health \
                     = \"guest-agent\")"
                );
                out.push(if pve_major.is_some_and(|m| m < 9) {
                    require(&why, vec![pp(&vm, "VM.Monitor")])
                } else {
                    require_any(
                        &why,
                        vec![
                            vec![pp(&vm, "VM.GuestAgent.Audit")],
                            vec![pp(&vm, "VM.GuestAgent.Unrestricted")],
                        ],
                    )
                });
            }
        }
        out
    }
}

/// Where the snapshot mode of a guest comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SetBy {
    /// `[policy] snapshot` in agent.toml.
    Policy,
    /// The guest's `proxops/snapshot` annotation.
    Annotation,
}

impl SetBy {
    /// `[policy] snapshot = "risky"` or `proxops/snapshot: "updates"`.
    fn setting(self, mode: &str) -> String {
        match self {
            SetBy::Policy => format!("[policy] snapshot = \"{mode}\""),
            SetBy::Annotation => format!("{SNAPSHOT}: \"{mode}\""),
        }
    }
}

/// What runs before an action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "first", rename_all = "kebab-case")]
pub enum First {
    /// A snapshot of the guest (taken by the agent, which records it; `proxops apply`
    /// takes none).
    Snapshot {
        /// `risky` or `updates`.
        mode: String,
        /// The policy or the guest's annotation.
        set_by: SetBy,
    },
    /// A vzdump of the guest to `storage`.
    Backup {
        /// The backup storage.
        storage: String,
        /// vzdump's mode.
        mode: String,
    },
}

impl First {
    /// The line `proxops plan` shows under the action.
    pub fn describe(&self) -> String {
        match self {
            First::Snapshot { mode, set_by } => format!(
                "snapshot first ({}; the agent takes it, proxops apply does not)",
                set_by.setting(mode)
            ),
            First::Backup { storage, mode } => {
                format!("backed up to {storage} first (vzdump, mode {mode})")
            }
        }
    }
}

/// One action's safety-net step, for `proxops plan --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mark {
    /// `VM/web`.
    pub resource: String,
    /// The node.
    pub node: String,
    /// The action's verb (`update`, `delete`).
    pub verb: String,
    /// What runs first.
    #[serde(flatten)]
    pub first: First,
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proxops_core::guest::GuestType;
    use proxops_core::plan::{GuestRef, Update};
    use proxops_core::resource::{Kind, ResourceId};
    use proxops_pve::backup::BackupMode;

    use super::*;

    fn desired(annotations: &str) -> DesiredState {
        let vm = format!(
            "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: web\n{annotations}\
             spec:\n  node: pve1\n  vmid: 120\n  state: started\n  memory: 1GiB\n  cpu: {{type: host, cores: 1}}\n  \
             disks:\n    - {{storage: local-lvm, size: 8GiB, interface: scsi0}}\n"
        );
        let loaded =
            proxops_core::repository::load(&BTreeMap::from([("vm/web.yaml".to_owned(), vm)]));
        assert!(!loaded.has_errors(), "{:?}", loaded.diagnostics);
        loaded.state(None).unwrap().clone()
    }

    fn action(verb: Verb) -> Action {
        Action {
            resource: ResourceId::new(Kind::Vm, "web"),
            node: "pve1".into(),
            verb,
            reason: "test".into(),
        }
    }

    fn memory_update() -> Action {
        action(Verb::Update(Update {
            vmid: 120,
            guest_type: GuestType::Qemu,
            set: BTreeMap::from([("memory".to_owned(), "2048".to_owned())]),
            delete: BTreeSet::new(),
            digest: None,
            grow: Vec::new(),
            changes: Vec::new(),
            regenerate_cloudinit: false,
        }))
    }

    fn delete() -> Action {
        action(Verb::Delete(GuestRef {
            vmid: 120,
            guest_type: GuestType::Qemu,
        }))
    }

    fn plan(actions: Vec<Action>) -> Plan {
        Plan {
            levels: vec![actions],
            ..Plan::default()
        }
    }

    fn net(snapshot: SnapshotMode, backup: bool, ping: bool) -> SafetyNet {
        SafetyNet {
            snapshot,
            backup: backup.then(|| BackupPolicy {
                storage: "nas".into(),
                mode: BackupMode::Stop,
            }),
            ping_node: ping.then(|| "pve1".to_owned()),
        }
    }

    fn asked(reqs: &[Requirement]) -> Vec<String> {
        reqs.iter()
            .map(|r| {
                r.options
                    .iter()
                    .map(|o| {
                        o.iter()
                            .map(|p| format!("{} {}", p.privilege, p.path))
                            .collect::<Vec<_>>()
                            .join(" + ")
                    })
                    .collect::<Vec<_>>()
                    .join(" | ")
            })
            .collect()
    }

    #[test]
    fn a_risky_update_gets_a_snapshot_and_its_annotation_can_turn_it_off() {
        let p = plan(vec![memory_update()]);
        let on = net(SnapshotMode::Risky, false, false);
        assert_eq!(
            asked(&on.requirements(&p, &desired(""), Some(9))),
            vec!["VM.Snapshot /vms/120", "VM.Audit /vms/120"]
        );
        let off = desired("  annotations:\n    proxops/snapshot: \"off\"\n");
        assert!(on.requirements(&p, &off, Some(9)).is_empty());
        assert_eq!(
            on.marks(&p, &desired("")),
            vec![Mark {
                resource: "VM/web".into(),
                node: "pve1".into(),
                verb: "update".into(),
                first: First::Snapshot {
                    mode: "risky".into(),
                    set_by: SetBy::Policy,
                },
            }]
        );
    }

    #[test]
    fn a_delete_is_backed_up_first_only_with_the_policy() {
        let p = plan(vec![delete()]);
        let d = desired("");
        assert!(
            net(SnapshotMode::Updates, false, false)
                .requirements(&p, &d, None)
                .is_empty()
        );
        let with = net(SnapshotMode::Off, true, false);
        assert_eq!(
            asked(&with.requirements(&p, &d, None)),
            vec!["VM.Backup /vms/120 + Datastore.AllocateSpace /storage/nas"]
        );
        assert_eq!(
            with.first(&delete(), &d).unwrap().describe(),
            "backed up to nas first (vzdump, mode stop)"
        );
    }

    #[test]
    fn the_guest_agent_ping_privilege_follows_the_pve_major_version() {
        let p = plan(vec![memory_update(), delete()]);
        let d = desired("");
        let ping = net(SnapshotMode::Off, false, true);
        let agent = "VM.GuestAgent.Audit /vms/120 | VM.GuestAgent.Unrestricted /vms/120";
        assert_eq!(asked(&ping.requirements(&p, &d, Some(9))), vec![agent]);
        assert_eq!(asked(&ping.requirements(&p, &d, None)), vec![agent]);
        assert_eq!(
            asked(&ping.requirements(&p, &d, Some(8))),
            vec!["VM.Monitor /vms/120"]
        );
        assert!(
            net(SnapshotMode::Off, false, false)
                .requirements(&p, &d, Some(9))
                .is_empty()
        );
    }
}
