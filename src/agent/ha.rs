//! PVE's own HA maintenance (issue 19, item 6): a node PVE reports in HA maintenance mode
//! (`ha-manager crm-command node-maintenance enable <node>`) gets no writes until it leaves
//! it. Each pass reads `GET /cluster/ha/status/current` ([`observe`]); the actions on such a
//! node are held like a freeze holds them (recorded skipped, with the reason), a finding on
//! each resource held says so, observation and drift reporting go on, and the views say
//! writes are held until the node leaves maintenance. Actions on other nodes proceed.
//!
//! A cluster without HA lists no `lrm` entries (pve-ha-manager @ b71218f
//! `src/PVE/API2/HA/Status.pm` `status`: only `quorum` and `fencing` without a manager
//! status), so nothing is held. A token without `Sys.Audit` on `/` (the endpoint's
//! permission) cannot tell: writes go on and a finding on each resource with actions says
//! what to grant. Any other failure to read the status is treated the same way (writes go
//! on, a finding says so): *assumed* the safer trade for clusters without HA, where holding
//! every write on a flaky read would stop the agent.

use std::borrow::Cow;
use std::collections::BTreeSet;

use proxops_core::plan::{Action, Finding, FindingKind, NodeScope, Plan};
use proxops_pve::PveClient;
use proxops_pve::backup::{self, HaStatusEntry};

use crate::agent::window::Held;
use crate::error_chain::error_text;
use crate::reconcile::Approval;

/// What one pass learnt of PVE's HA status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HaStatus {
    /// Read: these nodes are in maintenance (empty: none, or no HA).
    Read(BTreeSet<String>),
    /// Not read; writes go on and this is said in a finding.
    Unknown(String),
}

/// Reads `/cluster/ha/status/current`.
pub async fn observe(pve: &PveClient) -> HaStatus {
    match pve
        .execute_as::<Vec<HaStatusEntry>>(&backup::ha_status_current())
        .await
    {
        Ok(entries) => HaStatus::Read(backup::nodes_in_maintenance(&entries)),
        Err(error) if error.status() == Some(403) => HaStatus::Unknown(format!(
            "PVE's HA status could not be read ({}): a node in HA maintenance would not be \
             noticed; grant the token Sys.Audit on / (pveum acl modify / --roles PVEAuditor ...)",
            error_text(&error)
        )),
        Err(error) => HaStatus::Unknown(format!(
            "PVE's HA status could not be read ({}): a node in HA maintenance would not be noticed \
             this pass",
            error_text(&error)
        )),
    }
}

impl HaStatus {
    /// The nodes of `scope` in maintenance.
    pub fn held_nodes(&self, scope: &NodeScope) -> BTreeSet<String> {
        match self {
            HaStatus::Read(nodes) => nodes
                .iter()
                .filter(|n| match scope {
                    NodeScope::Node(own) => own == *n,
                    NodeScope::All => true,
                })
                .cloned()
                .collect(),
            HaStatus::Unknown(_) => BTreeSet::new(),
        }
    }

    /// Why writes to `nodes` are held, as the views say it (`None` for no node).
    pub fn held(nodes: &BTreeSet<String>) -> Option<Held> {
        if nodes.is_empty() {
            return None;
        }
        let list: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let (noun, verb) = if list.len() == 1 {
            ("node", "is")
        } else {
            ("nodes", "are")
        };
        Some(Held {
            reason: format!(
                "{noun} {} {verb} in PVE's HA maintenance mode (ha-manager crm-command \
                 node-maintenance enable); writes there resume when {} leave{} it",
                list.join(", "),
                if list.len() == 1 { "it" } else { "they" },
                if list.len() == 1 { "s" } else { "" },
            ),
            next_allowed: None,
        })
    }
}

/// The actions a pass holds for PVE's HA maintenance.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    /// The plan without them.
    pub rest: Plan,
    /// The actions on nodes in maintenance.
    pub held: Vec<Action>,
    /// Why, as the views say it (`writes held: node pve1 is in PVE's HA maintenance ...`).
    pub reason: String,
}

impl Hold {
    /// What `status` holds of `plan` for an agent of `scope`: `None` when no action is on a
    /// node in maintenance.
    pub fn of(plan: &Plan, status: &HaStatus, scope: &NodeScope) -> Option<Hold> {
        let nodes = status.held_nodes(scope);
        let (rest, held) = split(plan, &nodes)?;
        let reason = HaStatus::held(&nodes)?.sentence();
        Some(Hold { rest, held, reason })
    }

    /// Whether actions on other nodes remain.
    pub fn has_others(&self) -> bool {
        self.rest.actions().next().is_some()
    }

    /// The approval of the pass: `others` (what was approved of [`Hold::rest`], `None`
    /// when it has no action) with the held actions added.
    pub fn merge(self, others: Option<Approval>) -> Approval {
        let Hold {
            rest,
            mut held,
            reason,
        } = self;
        match others {
            None | Some(Approval::All) => Approval::Part {
                run: rest,
                held,
                reason,
            },
            Some(Approval::Part {
                run,
                held: more,
                reason: why,
            }) => {
                held.extend(more);
                Approval::Part {
                    run,
                    held,
                    reason: format!("{reason}; {why}"),
                }
            }
            Some(Approval::Declined(why)) => Approval::Declined(why),
        }
    }
}

/// `plan` with the findings the HA status adds ([`findings`]).
pub fn with_findings<'p>(plan: &'p Plan, status: &HaStatus, scope: &NodeScope) -> Cow<'p, Plan> {
    let found = findings(plan, status, scope);
    if found.is_empty() {
        return Cow::Borrowed(plan);
    }
    let mut with = plan.clone();
    with.findings.extend(found);
    Cow::Owned(with)
}

/// Splits `plan` into the actions on nodes in `held` and the rest: `None` when nothing is
/// held, else (the plan without them, them).
fn split(plan: &Plan, held: &BTreeSet<String>) -> Option<(Plan, Vec<Action>)> {
    let on_held = |a: &Action| held.contains(&a.node);
    let kept: Vec<Action> = plan.actions().filter(|a| on_held(a)).cloned().collect();
    if kept.is_empty() {
        return None;
    }
    let levels = plan
        .levels
        .iter()
        .map(|level| {
            level
                .iter()
                .filter(|a| !on_held(a))
                .cloned()
                .collect::<Vec<_>>()
        })
        .filter(|level| !level.is_empty())
        .collect();
    Some((
        Plan {
            levels,
            ..plan.clone()
        },
        kept,
    ))
}

/// The findings the HA status adds to `plan`: one per resource with actions on a node in
/// maintenance (`ha-maintenance`), or, when the status could not be read, one per resource
/// with actions (`ha-status-unknown`).
pub fn findings(plan: &Plan, status: &HaStatus, scope: &NodeScope) -> Vec<Finding> {
    let held = status.held_nodes(scope);
    let mut seen = BTreeSet::new();
    plan.actions()
        .filter(|a| seen.insert((a.resource.clone(), a.node.clone())))
        .filter_map(|a| {
            let (kind, message) = match status {
                HaStatus::Read(_) if held.contains(&a.node) => (
                    FindingKind::HaMaintenance,
                    format!(
                        "node {} is in PVE's HA maintenance mode: no write is sent to it until \
                         it leaves maintenance (ha-manager crm-command node-maintenance disable {})",
                        a.node, a.node
                    ),
                ),
                HaStatus::Unknown(why) => (FindingKind::HaStatusUnknown, why.clone()),
                _ => return None,
            };
            Some(Finding {
                resource: a.resource.clone(),
                node: a.node.clone(),
                kind,
                field: String::new(),
                desired: String::new(),
                observed: String::new(),
                message,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proxops_core::guest::GuestType;
    use proxops_core::plan::{GuestRef, Verb};
    use proxops_core::resource::{Kind, ResourceId};

    use super::*;

    fn start(name: &str, node: &str) -> Action {
        Action {
            resource: ResourceId::new(Kind::Vm, name),
            node: node.to_owned(),
            verb: Verb::Start(GuestRef {
                guest_type: GuestType::Qemu,
                vmid: 100,
            }),
            reason: "declared running".to_owned(),
        }
    }

    fn nodes(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn an_agent_holds_writes_only_for_its_own_node_in_maintenance() {
        let status = HaStatus::Read(nodes(&["pve2"]));
        assert!(
            status
                .held_nodes(&NodeScope::Node("pve1".to_owned()))
                .is_empty()
        );
        assert_eq!(
            status.held_nodes(&NodeScope::Node("pve2".to_owned())),
            nodes(&["pve2"])
        );
        assert_eq!(status.held_nodes(&NodeScope::All), nodes(&["pve2"]));
    }

    #[test]
    fn an_unreadable_or_empty_ha_status_holds_nothing() {
        let scope = NodeScope::Node("pve1".to_owned());
        assert!(
            HaStatus::Read(BTreeSet::new())
                .held_nodes(&scope)
                .is_empty()
        );
        assert!(
            HaStatus::Unknown("403".to_owned())
                .held_nodes(&scope)
                .is_empty()
        );
        assert_eq!(HaStatus::held(&BTreeSet::new()), None);
    }

    #[test]
    fn a_whole_cluster_plan_keeps_the_other_nodes_actions_and_holds_the_maintenance_nodes() {
        let plan = Plan {
            levels: vec![
                vec![start("a", "pve1"), start("b", "pve2")],
                vec![start("c", "pve2")],
            ],
            ..Plan::default()
        };
        let (run, held) = split(&plan, &nodes(&["pve2"])).unwrap();
        assert_eq!(run.levels, vec![vec![start("a", "pve1")]]);
        assert_eq!(held, [start("b", "pve2"), start("c", "pve2")]);
        assert!(split(&plan, &nodes(&["pve3"])).is_none());
    }

    #[test]
    fn held_actions_join_what_the_breaker_held_of_the_other_nodes() {
        let plan = Plan {
            levels: vec![vec![
                start("a", "pve1"),
                start("b", "pve2"),
                start("c", "pve3"),
            ]],
            ..Plan::default()
        };
        let status = HaStatus::Read(nodes(&["pve1"]));
        let hold = Hold::of(&plan, &status, &NodeScope::All).unwrap();
        assert!(hold.has_others());
        assert!(
            hold.reason
                .starts_with("writes held: node pve1 is in PVE's HA maintenance")
        );
        let probe = Plan {
            levels: vec![vec![start("b", "pve2")]],
            ..Plan::default()
        };
        let Approval::Part { run, held, reason } = hold.merge(Some(Approval::Part {
            run: probe.clone(),
            held: vec![start("c", "pve3")],
            reason: "write circuit breaker half-open".to_owned(),
        })) else {
            panic!("not a partial approval");
        };
        assert_eq!(run, probe);
        assert_eq!(held, [start("a", "pve1"), start("c", "pve3")]);
        assert!(
            reason.ends_with("; write circuit breaker half-open"),
            "{reason}"
        );
        assert!(Hold::of(&plan, &HaStatus::Read(BTreeSet::new()), &NodeScope::All).is_none());
    }

    #[test]
    fn each_held_resource_gets_one_finding_naming_the_node_and_how_it_leaves() {
        let plan = Plan {
            levels: vec![vec![
                start("a", "pve1"),
                start("a", "pve1"),
                start("b", "pve2"),
            ]],
            ..Plan::default()
        };
        let found = findings(&plan, &HaStatus::Read(nodes(&["pve1"])), &NodeScope::All);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].kind, FindingKind::HaMaintenance);
        assert!(
            found[0].message.contains("node-maintenance disable pve1"),
            "{}",
            found[0].message
        );
        let unknown = findings(
            &plan,
            &HaStatus::Unknown("grant Sys.Audit".to_owned()),
            &NodeScope::All,
        );
        assert_eq!(unknown.len(), 2);
        assert!(
            unknown
                .iter()
                .all(|f| f.kind == FindingKind::HaStatusUnknown)
        );
        let held = HaStatus::held(&nodes(&["pve1"])).unwrap();
        assert!(
            held.reason
                .starts_with("node pve1 is in PVE's HA maintenance mode")
        );
    }
}
