//! Approvals (issue 19, item 4): `[policy] approve` holds the actions an operator must
//! approve, and `proxops approve <pass>` (through the control socket, `crate::control`) lets
//! the next pass run them if it plans the same change.
//!
//! - [`to_hold`] (pure): which actions of a plan wait. `destructive` and `risky` hold the
//!   actions of that risk level (`proxops_core::plan::risk`); `bulk` holds the whole plan
//!   when it has more than `[policy] max_changes` actions. Every other action of a guest
//!   (resource and node) with a held action waits with it, so a held update is not followed
//!   by its reboot, nor a held shutdown by nothing.
//! - [`split`]: what the agent's pass runs. The held actions are recorded in the store with
//!   their digest (`proxops_core::plan::digest`) and the pass id; they run only when the
//!   store's open row has the same digest and was approved. A different digest lapses the
//!   old row (its approval no longer applies) and opens a new one.

use std::collections::BTreeSet;
use std::time::SystemTime;

use proxops_core::plan::digest::{digest, short};
use proxops_core::plan::risk::{Risk, risk};
use proxops_core::plan::{Action, Plan};
use proxops_store::{ApprovalRecord, ApprovalState, PassId, SharedStore};
use serde::{Deserialize, Serialize};

use crate::error_chain::error_text;
use crate::reconcile::Approval;
use crate::timefmt::rfc3339;

/// Default `[policy] max_changes`: a pass with more actions is `bulk`. Twenty is more than
/// the ordinary pass of a small cluster (a few guests changed by a commit) and less than a
/// whole-cluster change (a template bump touching every guest), which is what an operator
/// wants to look at first.
pub const DEFAULT_MAX_CHANGES: u32 = 20;

/// One word of `[policy] approve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApproveWhen {
    /// Actions of risk `destructive` (a prune's delete).
    Destructive,
    /// Actions of risk `risky`.
    Risky,
    /// Every action of a pass with more than `max_changes` actions.
    Bulk,
}

/// `[policy] approve` and `max_changes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovePolicy {
    /// What needs an operator's approval; empty: nothing.
    pub when: BTreeSet<ApproveWhen>,
    /// More actions than this in one pass is `bulk`.
    pub max_changes: u32,
}

impl Default for ApprovePolicy {
    fn default() -> Self {
        Self {
            when: BTreeSet::new(),
            max_changes: DEFAULT_MAX_CHANGES,
        }
    }
}

/// What of a plan waits for approval, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToHold {
    /// The held actions, in plan order.
    pub held: Vec<Action>,
    /// Why, in words: `destructive`, `risky`, or `bulk: 25 actions, more than max_changes 20`.
    pub why: String,
}

/// Which actions of `plan` wait for an operator under `policy` (pure). `None`: nothing.
pub fn to_hold(plan: &Plan, policy: &ApprovePolicy) -> Option<ToHold> {
    let count = plan.actions().count();
    if policy.when.contains(&ApproveWhen::Bulk) && count > policy.max_changes as usize {
        return Some(ToHold {
            held: plan.actions().cloned().collect(),
            why: format!(
                "bulk: {count} actions, more than [policy] max_changes = {}",
                policy.max_changes
            ),
        });
    }
    let listed = |level: Risk| match level {
        Risk::Destructive => policy.when.contains(&ApproveWhen::Destructive),
        Risk::Risky => policy.when.contains(&ApproveWhen::Risky),
        Risk::Safe => false,
    };
    let levels: BTreeSet<Risk> = plan
        .actions()
        .map(risk)
        .filter(|level| listed(*level))
        .collect();
    if levels.is_empty() {
        return None;
    }
    let guests: BTreeSet<(&_, &str)> = plan
        .actions()
        .filter(|a| listed(risk(a)))
        .map(|a| (&a.resource, a.node.as_str()))
        .collect();
    let held = plan
        .actions()
        .filter(|a| guests.contains(&(&a.resource, a.node.as_str())))
        .cloned()
        .collect();
    let why = levels
        .iter()
        .rev()
        .map(|level| level.name())
        .collect::<Vec<_>>()
        .join(", ");
    Some(ToHold { held, why })
}

/// `plan` without the `held` actions (levels left empty are dropped).
pub fn without(plan: &Plan, held: &[Action]) -> Plan {
    let levels = plan
        .levels
        .iter()
        .map(|level| {
            level
                .iter()
                .filter(|a| !held.contains(a))
                .cloned()
                .collect::<Vec<_>>()
        })
        .filter(|level| !level.is_empty())
        .collect();
    Plan {
        levels,
        ..plan.clone()
    }
}

/// What a pass runs after the approval gate.
#[derive(Debug, Clone)]
pub struct Split {
    /// The plan to run (all of it when nothing waits).
    pub run: Plan,
    /// What waits for approval.
    pub held: Vec<Action>,
    /// Why they wait, for their skipped records.
    pub reason: String,
}

/// The approval gate of one pass: decides with [`to_hold`], records what is held in the
/// store (`pass`, digest) and returns what runs. An approved row with the same digest lets
/// everything run; a store that cannot be read or written holds (fail closed).
pub fn split(
    store: &SharedStore,
    node: &str,
    pass: PassId,
    plan: &Plan,
    policy: &ApprovePolicy,
) -> Split {
    let all = Split {
        run: plan.clone(),
        held: Vec::new(),
        reason: String::new(),
    };
    let store_handle = store;
    let mut store = store
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let now = SystemTime::now();
    let Some(hold) = to_hold(plan, policy) else {
        drop(store);
        nothing_held(store_handle, node, pass);
        return all;
    };
    let digest = digest(&hold.held);
    let actions = serde_json::to_string(&hold.held).unwrap_or_else(|_| "[]".to_owned());
    let held = match store.hold(node, pass, &digest, &actions, &hold.why, now) {
        Ok(held) => held,
        Err(error) => {
            let text = error_text(&error);
            tracing::error!(error = %text, "recording actions held for approval failed; they stay held");
            return Split {
                run: without(plan, &hold.held),
                reason: format!(
                    "awaiting approval ({}), but the state database could not record it: {text}",
                    hold.why
                ),
                held: hold.held,
            };
        }
    };
    if let Some(lapsed) = &held.lapsed {
        tracing::warn!(
            pass = lapsed.pass.0,
            digest = short(&lapsed.digest),
            state = lapsed.state.as_str(),
            "the held change of pass {} lapsed: this pass plans a different one (digest {})",
            lapsed.pass.0,
            short(&digest)
        );
    }
    let current = &held.current;
    if current.state == ApprovalState::Approved {
        let who = current.decided.as_ref().map_or("", |(who, _)| who.as_str());
        tracing::info!(
            pass = current.pass.0,
            digest = short(&digest),
            approved_by = who,
            "running the approved actions"
        );
        return all;
    }
    let first = current.pass.0;
    let reason = match current.state {
        ApprovalState::Rejected => format!(
            "awaiting approval ({}): rejected by {} (digest {}); it stays held until the plan \
             changes or `proxops approve {first}`",
            hold.why,
            current
                .decided
                .as_ref()
                .map_or("?", |(who, _)| who.as_str()),
            short(&digest)
        ),
        _ => format!(
            "awaiting approval ({}, digest {}): run `proxops approve {first}`",
            hold.why,
            short(&digest)
        ),
    };
    tracing::info!(
        pass = first,
        digest = short(&digest),
        actions = hold.held.len(),
        "actions held for approval"
    );
    Split {
        run: without(plan, &hold.held),
        held: hold.held,
        reason,
    }
}

/// A pass that plans no change holds nothing: the open held change of `node`, if any, is
/// cleared, so an approval never outlives the change it was given for (a later pass that
/// plans the same change again needs a new one).
pub fn nothing_held(store: &SharedStore, node: &str, pass: PassId) {
    let mut store = store
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Err(error) = store.clear_held(node, pass, SystemTime::now()) {
        tracing::error!(error = %error_text(&error), "recording the approval state failed");
    }
}

/// The approval gate's [`Split`] followed by what the next gate (the breaker) let run of
/// `split.run`: one [`Approval`] for the pipeline. Actions held by both are reported with
/// both reasons.
pub fn combine(split: &Split, next: Approval) -> Approval {
    if split.held.is_empty() {
        return next;
    }
    match next {
        Approval::All => Approval::Part {
            run: split.run.clone(),
            held: split.held.clone(),
            reason: split.reason.clone(),
        },
        Approval::Part { run, held, reason } => Approval::Part {
            run,
            held: split.held.iter().cloned().chain(held).collect(),
            reason: format!("{}; {reason}", split.reason),
        },
        Approval::Declined(reason) => Approval::Declined(format!("{}; {reason}", split.reason)),
    }
}

/// One held change as every view shows it (`/api/v1/status`, `/api/v1/passes/{id}`,
/// `proxops status`, the UI).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalJson {
    /// The first pass that held it: the one to name in `proxops approve`.
    pub pass: i64,
    /// The latest pass that held it.
    pub last_pass: i64,
    /// `awaiting`, `approved`, `rejected`, `lapsed` or `cleared`.
    pub state: String,
    /// The digest of the held actions (`sha256:…`).
    pub digest: String,
    /// Why they are held (`destructive`, `bulk: …`).
    pub why: String,
    /// The held actions, with their risk.
    pub actions: serde_json::Value,
    /// RFC 3339: when the first pass held them.
    pub since: String,
    /// The command that approves it (while it is open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Who approved or rejected it, when, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    /// The operator's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_reason: Option<String>,
    /// The pass that closed it (lapsed: it planned another change; cleared: it held nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_by_pass: Option<i64>,
}

impl From<&ApprovalRecord> for ApprovalJson {
    fn from(r: &ApprovalRecord) -> Self {
        Self {
            pass: r.pass.0,
            last_pass: r.last_pass.0,
            state: r.state.as_str().to_owned(),
            digest: r.digest.clone(),
            why: r.why.clone(),
            actions: serde_json::from_str(&r.actions).unwrap_or(serde_json::Value::Null),
            since: rfc3339(r.since),
            command: r
                .state
                .is_open()
                .then(|| format!("proxops approve {}", r.pass.0)),
            decided_by: r.decided.as_ref().map(|(who, _)| who.clone()),
            decided_at: r.decided.as_ref().map(|(_, at)| rfc3339(*at)),
            decision_reason: r.decision_reason.clone().filter(|s| !s.is_empty()),
            closed_by_pass: r.closed.map(|(_, p)| p.0),
        }
    }
}

impl ApprovalJson {
    /// `AWAITING APPROVAL: pass 12 holds 1 action (destructive, digest 3f2a…) since …; run
    /// proxops approve 12` and the like, for `proxops status`.
    pub fn headline(&self) -> String {
        let count = self.actions.as_array().map_or(0, Vec::len);
        let what = format!(
            "pass {} holds {count} action{} ({}, digest {}) since {}",
            self.pass,
            if count == 1 { "" } else { "s" },
            self.why,
            short(&self.digest),
            self.since
        );
        let by = self.decided_by.as_deref().unwrap_or("?");
        match self.state.as_str() {
            "approved" => format!("APPROVED by {by}: {what}; the next pass runs them"),
            "rejected" => format!(
                "AWAITING APPROVAL: {what}; rejected by {by}; run proxops approve {} to let them run",
                self.pass
            ),
            _ => format!(
                "AWAITING APPROVAL: {what}; run proxops approve {}",
                self.pass
            ),
        }
    }
}

/// `VM/web` for an action's `resource` as the JSON of actions holds it (`{kind, name}`).
pub fn resource_text(action: &serde_json::Value) -> String {
    let resource = &action["resource"];
    match (resource["kind"].as_str(), resource["name"].as_str()) {
        (Some(kind), Some(name)) => format!("{kind}/{name}"),
        _ => resource.as_str().unwrap_or_default().to_owned(),
    }
}

/// What waits for approval on a node, and what became of the latest held changes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApprovalView {
    /// The open held change (awaiting, approved or rejected), if any.
    pub open: Option<ApprovalJson>,
    /// The newest held changes (the open one included), newest first: lapsed and cleared
    /// ones with who decided.
    pub recent: Vec<ApprovalJson>,
}

impl ApprovalView {
    /// Read from the store for `node`.
    ///
    /// # Errors
    /// When the rows cannot be read.
    pub fn of(store: &proxops_store::Store, node: &str) -> Result<Self, proxops_store::StoreError> {
        Ok(Self {
            open: store.open_approval(node)?.as_ref().map(ApprovalJson::from),
            recent: store
                .recent_approvals(node, 5)?
                .iter()
                .map(ApprovalJson::from)
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proxops_core::guest::GuestType;
    use proxops_core::plan::{GuestRef, Update, Verb};
    use proxops_core::resource::{Kind, ResourceId};

    use super::*;

    fn guest(vmid: u32) -> GuestRef {
        GuestRef {
            vmid,
            guest_type: GuestType::Qemu,
        }
    }

    fn action(name: &str, verb: Verb) -> Action {
        Action {
            resource: ResourceId::new(Kind::Vm, name),
            node: "pve1".into(),
            verb,
            reason: String::new(),
        }
    }

    fn cores(vmid: u32) -> Verb {
        Verb::Update(Update {
            vmid,
            guest_type: GuestType::Qemu,
            set: BTreeMap::from([("cores".to_owned(), "4".to_owned())]),
            delete: BTreeSet::new(),
            digest: None,
            grow: Vec::new(),
            changes: Vec::new(),
            regenerate_cloudinit: false,
        })
    }

    fn plan() -> Plan {
        Plan {
            levels: vec![
                vec![
                    action("web", cores(100)),
                    action("web", Verb::Reboot(guest(100))),
                    action("db", Verb::Start(guest(101))),
                ],
                vec![
                    action("old", Verb::Shutdown(guest(102))),
                    action("old", Verb::Delete(guest(102))),
                ],
            ],
            ..Plan::default()
        }
    }

    fn policy(when: &[ApproveWhen], max_changes: u32) -> ApprovePolicy {
        ApprovePolicy {
            when: when.iter().copied().collect(),
            max_changes,
        }
    }

    fn names(held: &[Action]) -> Vec<String> {
        held.iter()
            .map(|a| format!("{} {}", a.resource.name, a.verb.name()))
            .collect()
    }

    #[test]
    fn nothing_is_held_without_approve_words_or_when_no_action_has_a_listed_risk() {
        assert_eq!(to_hold(&plan(), &policy(&[], 1)), None);
        let safe = Plan {
            levels: vec![vec![action("db", Verb::Start(guest(101)))]],
            ..Plan::default()
        };
        assert_eq!(
            to_hold(
                &safe,
                &policy(&[ApproveWhen::Destructive, ApproveWhen::Risky], 20)
            ),
            None
        );
    }

    #[test]
    fn destructive_holds_the_delete_and_the_other_actions_of_that_guest() {
        let hold = to_hold(&plan(), &policy(&[ApproveWhen::Destructive], 20)).unwrap();
        assert_eq!(names(&hold.held), ["old shutdown", "old delete"]);
        assert_eq!(hold.why, "destructive");
        let run = without(&plan(), &hold.held);
        assert_eq!(run.levels.len(), 1);
        assert_eq!(
            names(&run.levels[0]),
            ["web update", "web reboot", "db start"]
        );
    }

    #[test]
    fn risky_holds_the_risky_actions_of_each_guest_and_names_both_levels_when_both_are_listed() {
        let risky = to_hold(&plan(), &policy(&[ApproveWhen::Risky], 20)).unwrap();
        assert_eq!(
            names(&risky.held),
            ["web update", "web reboot", "old shutdown", "old delete"]
        );
        let both = to_hold(
            &plan(),
            &policy(&[ApproveWhen::Risky, ApproveWhen::Destructive], 20),
        )
        .unwrap();
        assert_eq!(both.why, "destructive, risky");
    }

    #[test]
    fn bulk_holds_the_whole_plan_only_above_max_changes() {
        assert_eq!(to_hold(&plan(), &policy(&[ApproveWhen::Bulk], 5)), None);
        let hold = to_hold(&plan(), &policy(&[ApproveWhen::Bulk], 4)).unwrap();
        assert_eq!(hold.held.len(), 5);
        assert_eq!(
            hold.why,
            "bulk: 5 actions, more than [policy] max_changes = 4"
        );
        assert!(!without(&plan(), &hold.held).has_changes());
    }

    #[test]
    fn the_gate_holds_until_approved_then_runs_and_a_changed_plan_lapses_the_approval() {
        let store: SharedStore = std::sync::Arc::new(std::sync::Mutex::new(
            proxops_store::Store::memory().unwrap(),
        ));
        let destructive = policy(&[ApproveWhen::Destructive], 20);
        let first = split(&store, "pve1", PassId(1), &plan(), &destructive);
        assert_eq!(first.held.len(), 2);
        assert!(
            first.reason.contains("proxops approve 1"),
            "{}",
            first.reason
        );
        let id = {
            let mut s = store.lock().unwrap();
            let open = s.open_approval("pve1").unwrap().unwrap();
            s.decide_approval(open.id, true, "alice", "", SystemTime::now())
                .unwrap();
            open.id
        };
        let approved = split(&store, "pve1", PassId(2), &plan(), &destructive);
        assert!(approved.held.is_empty());
        assert_eq!(approved.run, plan());

        let mut changed = plan();
        changed.levels[1][1].verb = Verb::Delete(guest(103));
        let lapsed = split(&store, "pve1", PassId(3), &changed, &destructive);
        assert_eq!(lapsed.held.len(), 2);
        assert!(
            lapsed.reason.contains("proxops approve 3"),
            "{}",
            lapsed.reason
        );
        {
            let s = store.lock().unwrap();
            let old = s.approval_of_pass(PassId(1)).unwrap().unwrap();
            assert_eq!((old.id, old.state), (id, ApprovalState::Lapsed));
        }
    }

    #[test]
    fn an_approval_ends_with_the_first_pass_that_holds_nothing() {
        let store: SharedStore = std::sync::Arc::new(std::sync::Mutex::new(
            proxops_store::Store::memory().unwrap(),
        ));
        let destructive = policy(&[ApproveWhen::Destructive], 20);
        split(&store, "pve1", PassId(1), &plan(), &destructive);
        {
            let mut s = store.lock().unwrap();
            let open = s.open_approval("pve1").unwrap().unwrap();
            s.decide_approval(open.id, true, "alice", "", SystemTime::now())
                .unwrap();
        }
        assert!(
            split(&store, "pve1", PassId(2), &plan(), &destructive)
                .held
                .is_empty()
        );
        // The approved change was made: the next pass plans nothing.
        nothing_held(&store, "pve1", PassId(3));
        // The same change planned again later waits for a new approval.
        let again = split(&store, "pve1", PassId(4), &plan(), &destructive);
        assert_eq!(again.held.len(), 2);
        assert!(
            again.reason.contains("proxops approve 4"),
            "{}",
            again.reason
        );
    }
}
