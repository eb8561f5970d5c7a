//! Rollout waves in the agent (issue 22, item 4): before a pass writes, ask
//! [`crate::cluster::rollout::decide`] whether this node may write the commit now, from
//! what the nodes of the earlier waves published in `<dir>/status/<node>.json` and when the
//! commit was first seen in the cluster (`<dir>/rollout/<commit>.json`). A `Wait` or a `Halt`
//! holds writes the way a write window does ([`crate::agent::window::Held`]): the pass still
//! observes, records drift and reports; every action is recorded skipped with the reason.
//! Earlier-wave nodes PVE lists offline (`/cluster/status`) or in HA maintenance (the HA
//! status the pass read, [`crate::agent::ha::observe`]) count as unavailable: waited for,
//! then skipped after `wave_timeout`.
//!
//! After every pass this node's health on the revision it enforced is updated and published
//! with its status (`health_revision`, `healthy_since`, `unhealthy`): healthy means no failed
//! action and every guest in its declared power state (no `spec.state` drift left). Health is
//! kept in memory: a restarted agent bakes again from its first healthy pass. With
//! `health = "guest-agent"` also the QEMU guest agent of every VM of this node a pass of the
//! revision touched (a succeeded action, declared `started`) must answer
//! `POST .../agent/ping`, after every pass of that revision ([`guests_to_ping`]).
//!
//! A waiting agent re-checks on its poll interval: there is no separate timer, so
//! `[source] poll` bounds how late after the bake a later wave starts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use chrono::{DateTime, Utc};
use proxops_core::plan::{FindingKind, Plan};
use proxops_store::{PassOutcome, SharedStore};
use tokio_util::sync::CancellationToken;

use crate::cluster::config::PmxcfsConfig;
use crate::cluster::rollout::{self, Decision, Peer, Unavailable};
use crate::cluster::rollout_config::RolloutConfig;
use crate::cluster::status_file::NodeStatus;
use crate::timefmt::rfc3339;

pub use crate::cluster::status_file::RolloutView;

/// This node's health on the revision it last enforced.
#[derive(Debug, Clone, Default)]
struct Health {
    revision: Option<String>,
    since: Option<SystemTime>,
    unhealthy: Option<String>,
    /// The last finished pass with failed actions: its revision and how many failed.
    failed: Option<(String, u32)>,
}

#[derive(Debug, Default)]
struct Inner {
    health: Health,
    /// The VMs passes of this revision touched that `health = "guest-agent"` pings after
    /// every pass of it: (revision, VMs). Reset when the revision changes.
    touched: Option<(String, BTreeMap<u32, String>)>,
    /// Commits whose first sight could not be read or recorded in the cluster: our own.
    local_first_seen: BTreeMap<String, DateTime<Utc>>,
    view: RolloutView,
}

/// `[rollout]` of the agent in force.
#[derive(Debug)]
pub struct Rollout {
    config: RolloutConfig,
    pmxcfs: PmxcfsConfig,
    node: String,
    inner: Mutex<Inner>,
}

impl Rollout {
    /// The rollout of `config`, if it has `[rollout]` (which needs `[pmxcfs]` and a node).
    pub fn new(config: &crate::config::AgentConfig) -> Option<Arc<Rollout>> {
        let rollout = config.rollout.clone()?;
        let pmxcfs = config.pmxcfs.clone()?;
        let proxops_core::plan::NodeScope::Node(node) = &config.node else {
            return None;
        };
        let view = RolloutView {
            wave: rollout.wave_of(node).map_or(0, |w| w + 1),
            waves: rollout.waves.len(),
            ..RolloutView::default()
        };
        Some(Arc::new(Rollout {
            config: rollout,
            pmxcfs,
            node: node.clone(),
            inner: Mutex::new(Inner {
                view,
                ..Inner::default()
            }),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The view, for `/api/v1/status` and the status file.
    pub fn view(&self) -> RolloutView {
        let inner = self.lock();
        let mut view = inner.view.clone();
        view.health_revision.clone_from(&inner.health.revision);
        view.healthy_since = inner.health.since.map(millis);
        view.unhealthy.clone_from(&inner.health.unhealthy);
        view.failed_revision = inner.health.failed.as_ref().map(|(c, _)| c.clone());
        view.failed_actions = inner.health.failed.as_ref().map_or(0, |(_, n)| *n);
        view
    }

    /// Why the rollout holds writes of `commit` now, if it does: decides from the status
    /// files of the earlier waves, PVE's member list and HA status (`ha`, as the pass read
    /// it) and the commit's first sight (recorded if this is it).
    pub async fn hold(
        &self,
        store: &SharedStore,
        pve: &proxops_pve::PveClient,
        ha: &crate::agent::ha::HaStatus,
        commit: &str,
        cancel: &CancellationToken,
    ) -> Option<crate::agent::window::Held> {
        let now = SystemTime::now();
        let applied_before = applied_before(store, &self.node, commit);
        let first_seen = match crate::cluster::rollout_state::first_seen(
            &self.pmxcfs,
            commit,
            &self.node,
            now,
            cancel,
        )
        .await
        {
            Ok(at) => at,
            Err(error) => {
                let mut inner = self.lock();
                let at = *inner
                    .local_first_seen
                    .entry(commit.to_owned())
                    .or_insert_with(|| now.into());
                tracing::warn!(%error, "the rollout bookkeeping could not be read or written; wave_timeout counts from this node's first sight");
                at
            }
        };
        let mut peers = self.peers(now);
        mark_maintenance(&mut peers, ha);
        // PVE's own word on which members are offline (`/cluster/status` `online`); when it
        // cannot be asked, the status files alone decide.
        match crate::cluster::view::members(pve).await {
            Ok(members) => mark_offline(&mut peers, &members),
            Err(error) => tracing::debug!(%error, "cluster members not read for the rollout"),
        }
        let decision = rollout::decide(&rollout::Input {
            config: &self.config,
            node: &self.node,
            commit,
            applied_before,
            first_seen,
            peers: &peers,
            now: now.into(),
        });
        let timeout = self.config.wave_timeout;
        let (name, held, until, halted, skipped) = match &decision {
            Decision::Proceed { skipped } => ("proceed", None, None, None, skipped.clone()),
            Decision::Wait {
                reason,
                until,
                skipped,
                ..
            } => ("wait", Some(reason.clone()), *until, None, skipped.clone()),
            Decision::Halt { wave, node, why } => {
                let halted = format!("rollout halted: wave {wave} node {node} failed: {why}");
                ("halt", Some(halted.clone()), None, Some(halted), Vec::new())
            }
        };
        let skipped: Vec<String> = skipped.iter().map(|s| s.sentence(timeout)).collect();
        for line in &skipped {
            tracing::warn!(skipped = %line, "rollout");
        }
        {
            let mut inner = self.lock();
            let view = &mut inner.view;
            let same = view.commit.as_deref() == Some(commit);
            if name != "proceed" || !same {
                view.proceeded_at = None;
            }
            if name == "proceed" && view.proceeded_at.is_none() {
                view.proceeded_at = Some(millis(now));
            }
            view.commit = Some(commit.to_owned());
            view.decision = Some(name.to_owned());
            view.held.clone_from(&held);
            view.until = until.map(|t| rfc3339(t.into()));
            view.halted = halted;
            view.skipped = skipped;
            view.first_seen = Some(rfc3339(first_seen.into()));
        }
        held.map(|reason| crate::agent::window::Held {
            reason,
            next_allowed: until,
        })
    }

    /// What the nodes of the earlier waves published, as the decision reads it.
    fn peers(&self, now: SystemTime) -> Vec<Peer> {
        let Some(mine) = self.config.wave_of(&self.node) else {
            return Vec::new();
        };
        self.config.waves[..mine]
            .iter()
            .flatten()
            .filter_map(|node| {
                let bytes = std::fs::read(self.pmxcfs.status_file(node)).ok()?;
                let status = NodeStatus::decode(&bytes)?;
                Some(peer_of(node, &status, now))
            })
            .collect()
    }

    /// Adds the VMs a pass of `commit` touched to those touched by earlier passes of it and
    /// returns them all (vmid → how to name it) when `health = "guest-agent"`; empty
    /// otherwise.
    fn touch(&self, commit: &str, vms: BTreeMap<u32, String>) -> BTreeMap<u32, String> {
        if self.config.health != crate::cluster::rollout_config::Health::GuestAgent {
            return BTreeMap::new();
        }
        let mut inner = self.lock();
        let touched = match &mut inner.touched {
            Some((c, touched)) if c == commit => touched,
            other => &mut other.insert((commit.to_owned(), BTreeMap::new())).1,
        };
        touched.extend(vms);
        touched.clone()
    }

    /// Updates this node's health after a pass that enforced `commit`: a failed action, a
    /// guest left out of its declared power state or a guest agent that did not answer
    /// (`agent`: one reason per VM) makes it unhealthy; a pass after which PVE matches the
    /// revision makes it healthy (since the first such pass in a row).
    pub fn after_pass(
        &self,
        commit: &str,
        outcome: PassOutcome,
        failed: u32,
        plan: &Plan,
        agent: &[String],
    ) {
        let power: Vec<String> = plan
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::Drift && f.field == "spec.state")
            .map(|f| {
                format!(
                    "{} on {} is {}, declared {}",
                    f.resource, f.node, f.observed, f.desired
                )
            })
            .collect();
        let mut inner = self.lock();
        let health = &mut inner.health;
        if failed > 0 {
            health.failed = Some((commit.to_owned(), failed));
        } else if outcome.is_applied() {
            health.failed = None;
        }
        let unhealthy = if failed > 0 {
            Some(format!("{failed} action(s) failed"))
        } else if !power.is_empty() {
            Some(power.join("; "))
        } else if !agent.is_empty() {
            Some(agent.join("; "))
        } else if outcome.is_applied() {
            None
        } else {
            // Held, interrupted: says nothing new about health.
            return;
        };
        let same = health.revision.as_deref() == Some(commit);
        match unhealthy {
            Some(why) => {
                health.revision = Some(commit.to_owned());
                health.since = None;
                health.unhealthy = Some(why);
            }
            None if same && health.unhealthy.is_none() && health.since.is_some() => {}
            None => {
                health.revision = Some(commit.to_owned());
                health.since = Some(SystemTime::now());
                health.unhealthy = None;
            }
        }
    }
}

/// RFC 3339 with milliseconds: bake and decision times are a few seconds apart in tests.
fn millis(at: SystemTime) -> String {
    DateTime::<Utc>::from(at).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Marks the peers PVE reports in HA maintenance (`ha`, read from
/// `/cluster/ha/status/current` by [`crate::agent::ha::observe`]) as in maintenance: their
/// own agent holds its writes there ([`crate::agent::ha`]), so they are waited for and
/// skipped after `wave_timeout` like a down node. A node in maintenance counts so even if it
/// applied the commit before it entered maintenance: its guests are being moved away, so
/// its health says nothing about the commit any more (*assumed*, GAPS 187). An unread HA
/// status marks nothing (the pass's findings say it was not read). Run before
/// [`mark_offline`]: a node that is also offline is reported down.
fn mark_maintenance(peers: &mut [Peer], ha: &crate::agent::ha::HaStatus) {
    let crate::agent::ha::HaStatus::Read(nodes) = ha else {
        return;
    };
    for peer in peers {
        if nodes.contains(&peer.node) {
            peer.unavailable = Some(Unavailable::Maintenance);
        }
    }
}

/// Marks the peers PVE lists offline in `/cluster/status` as down.
fn mark_offline(peers: &mut [Peer], members: &crate::cluster::view::Members) {
    for peer in peers {
        if members
            .nodes
            .iter()
            .any(|m| m.name == peer.node && !m.online)
        {
            peer.unavailable = Some(Unavailable::Down);
        }
    }
}

/// Whether this node applied `commit` before (then waves never hold it).
fn applied_before(store: &SharedStore, node: &str, commit: &str) -> bool {
    let store = store
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match store.passes_of_commit(Some(node), commit, 200) {
        Ok(passes) => passes.iter().any(|p| match &p.enforced {
            Some(e) => e.commit == commit && e.outcome.is_some_and(PassOutcome::is_applied),
            None => {
                p.commit.as_deref() == Some(commit)
                    && p.outcome.is_some_and(PassOutcome::is_applied)
            }
        }),
        Err(error) => {
            tracing::warn!(error = %crate::error_chain::error_text(&error), "reading the passes of a commit; treating it as new for the rollout");
            false
        }
    }
}

/// The decision's view of `node`'s published status at `now`.
pub fn peer_of(node: &str, status: &NodeStatus, now: SystemTime) -> Peer {
    let heartbeat = DateTime::parse_from_rfc3339(&status.heartbeat_at)
        .ok()
        .map(|t| SystemTime::from(t.with_timezone(&Utc)));
    let interval = std::time::Duration::from_secs(status.heartbeat_secs.max(1));
    let stale =
        heartbeat.is_none_or(|at| now.duration_since(at).unwrap_or_default() > interval * 3);
    let rollout = status.rollout.clone().unwrap_or_default();
    let on_applied =
        rollout.health_revision.is_some() && rollout.health_revision == status.applied_revision;
    let parse = |t: &Option<String>| {
        t.as_deref()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc))
    };
    Peer {
        node: node.to_owned(),
        applied: status.applied_revision.clone(),
        healthy_since: on_applied.then(|| parse(&rollout.healthy_since)).flatten(),
        unhealthy: on_applied.then(|| rollout.unhealthy.clone()).flatten(),
        // The status's counts are a running pass's while one runs (no outcome yet): then the
        // last finished pass with failures, as the rollout view keeps it, decides.
        attempted: match (&status.outcome, &rollout.failed_revision) {
            (Some(_), _) => status
                .attempted_revision
                .clone()
                .map(|c| (c, u64::from(status.counts.failed))),
            (None, Some(failed)) => Some((failed.clone(), u64::from(rollout.failed_actions))),
            (None, None) => None,
        },
        unavailable: stale.then_some(Unavailable::Stale),
    }
}

/// The VMs of `node` a pass touched that should answer a guest agent ping: those with a
/// succeeded action whose manifest declares them `started` (vmid → `VM/name`). Containers
/// have no QEMU guest agent; a stopped VM's agent cannot answer (qemu-server @ e6352be6
/// `src/PVE/QemuServer/Agent.pm`, `assert_agent_available`: "VM N is not running").
pub fn guests_to_ping(
    node: &str,
    report: &crate::execute::ApplyReport,
    desired: &proxops_core::repository::DesiredState,
) -> BTreeMap<u32, String> {
    report
        .results
        .iter()
        .filter(|r| matches!(r.outcome, crate::execute::Outcome::Succeeded { .. }))
        .filter_map(|r| ping_target(node, &r.action, desired))
        .collect()
}

/// Whether a succeeded `action` makes its guest one that health `guest-agent` pings on
/// `node` (vmid, `VM/name`): a VM of `node` whose manifest declares it `started`. Also what
/// `proxops check` asks the ping's privilege for, so both decide alike.
pub fn ping_target(
    node: &str,
    action: &proxops_core::plan::Action,
    desired: &proxops_core::repository::DesiredState,
) -> Option<(u32, String)> {
    use proxops_core::manifest::{PowerState, Spec};
    if action.node != node || action.resource.kind != proxops_core::resource::Kind::Vm {
        return None;
    }
    match &desired.manifest.get(&action.resource)?.spec {
        Some(Spec::Vm(vm)) if vm.state == PowerState::Started && vm.node.as_str() == node => {
            Some((vm.vmid.get(), action.resource.to_string()))
        }
        _ => None,
    }
}

/// Updates `rollout`'s health from a pass that enforced `commit` and planned `done`; with
/// `health = "guest-agent"` it first pings, through `pve`, the guest agent of every VM the
/// passes of `commit` touched ([`guests_to_ping`]).
pub async fn after_pass(
    rollout: &Rollout,
    pve: &proxops_pve::PveClient,
    commit: &str,
    done: &crate::reconcile::Pass,
    cancel: &CancellationToken,
) {
    if cancel.is_cancelled() || done.plan.aborted.is_some() {
        return;
    }
    let (outcome, failed) = match &done.report {
        Some(report) if report.is_success() => (PassOutcome::Applied, 0),
        Some(report) => (PassOutcome::Failed, report.counts().1),
        None => (PassOutcome::NoChange, 0),
    };
    let touched = done
        .report
        .as_ref()
        .map(|report| guests_to_ping(&rollout.node, report, &done.desired))
        .unwrap_or_default();
    let mut agent = Vec::new();
    for (vmid, name) in rollout.touch(commit, touched) {
        if let Err(e) = pve.qemu_agent_ping(&rollout.node, vmid).await {
            agent.push(format!(
                "guest agent of {name} (vmid {vmid}) did not answer: {}",
                e.to_string().trim_end()
            ));
        }
        if cancel.is_cancelled() {
            return;
        }
    }
    rollout.after_pass(
        commit,
        outcome,
        u32::try_from(failed).unwrap_or(u32::MAX),
        &done.plan,
        &agent,
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proxops_core::plan::Finding;
    use proxops_core::resource::ResourceId;

    use super::*;
    use crate::cluster::rollout_config::Health as HealthKind;

    fn rollout() -> Rollout {
        Rollout {
            config: RolloutConfig {
                waves: vec![vec!["pve3".to_owned()], vec!["pve1".to_owned()]],
                bake: Duration::from_secs(5),
                wave_timeout: Duration::from_secs(60),
                health: HealthKind::Power,
            },
            pmxcfs: PmxcfsConfig {
                dir: "/nonexistent/proxops".into(),
                lock_dir: "/nonexistent/lock".into(),
                publish: true,
                heartbeat: Duration::from_secs(30),
            },
            node: "pve3".to_owned(),
            inner: Mutex::default(),
        }
    }

    fn power_drift() -> Plan {
        let mut plan = Plan::default();
        plan.findings.push(Finding {
            resource: ResourceId::new(proxops_core::resource::Kind::Vm, "web"),
            node: "pve3".to_owned(),
            kind: FindingKind::Drift,
            field: "spec.state".to_owned(),
            desired: "started".to_owned(),
            observed: "stopped".to_owned(),
            message: String::new(),
        });
        plan
    }

    #[test]
    fn health_holds_its_since_across_healthy_passes_and_resets_on_a_failure_or_power_drift() {
        let r = rollout();
        let commit = "c".repeat(40);
        r.after_pass(&commit, PassOutcome::Applied, 0, &Plan::default(), &[]);
        let first = r.view();
        assert_eq!(first.health_revision.as_deref(), Some(commit.as_str()));
        assert!(first.healthy_since.is_some() && first.unhealthy.is_none());
        r.after_pass(&commit, PassOutcome::NoChange, 0, &Plan::default(), &[]);
        assert_eq!(r.view().healthy_since, first.healthy_since, "still baking");
        // A held pass says nothing new.
        r.after_pass(&commit, PassOutcome::Failed, 0, &Plan::default(), &[]);
        assert_eq!(r.view().healthy_since, first.healthy_since);
        r.after_pass(&commit, PassOutcome::NoChange, 0, &power_drift(), &[]);
        let view = r.view();
        assert_eq!(view.healthy_since, None);
        assert_eq!(
            view.unhealthy.as_deref(),
            Some("VM/web on pve3 is stopped, declared started")
        );
        r.after_pass(&commit, PassOutcome::Failed, 2, &Plan::default(), &[]);
        assert_eq!(r.view().unhealthy.as_deref(), Some("2 action(s) failed"));
    }

    fn vm(name: &str, node: &str, vmid: u32, state: &str) -> String {
        format!(
            "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata: {{name: {name}}}\nspec:\n  \
             node: {node}\n  vmid: {vmid}\n  state: {state}\n  memory: 1GiB\n  \
             cpu: {{type: host, cores: 1}}\n  disks: [{{storage: local-lvm, size: 8GiB}}]\n"
        )
    }

    fn started(
        name: &str,
        node: &str,
        vmid: u32,
        outcome: crate::execute::Outcome,
    ) -> crate::execute::ActionResult {
        crate::execute::ActionResult {
            action: proxops_core::plan::Action {
                resource: ResourceId::new(proxops_core::resource::Kind::Vm, name),
                node: node.to_owned(),
                verb: proxops_core::plan::Verb::Start(proxops_core::plan::GuestRef {
                    vmid,
                    guest_type: proxops_core::guest::GuestType::Qemu,
                }),
                reason: String::new(),
            },
            outcome,
            backup: None,
        }
    }

    #[test]
    fn the_guests_to_ping_are_the_started_vms_of_this_node_a_succeeded_action_touched() {
        let files: BTreeMap<String, String> = [
            ("app.yaml", vm("app", "pve3", 105, "started")),
            ("cold.yaml", vm("cold", "pve3", 106, "stopped")),
            ("broken.yaml", vm("broken", "pve3", 107, "started")),
            ("other.yaml", vm("other", "pve1", 108, "started")),
            ("idle.yaml", vm("idle", "pve3", 109, "started")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let loaded = proxops_core::repository::load(&files);
        assert!(!loaded.has_errors(), "{:?}", loaded.diagnostics);
        let desired = loaded.states.into_iter().next().unwrap();
        let ok = || crate::execute::Outcome::Succeeded {
            upid: None,
            exitstatus: "OK".to_owned(),
        };
        let report = crate::execute::ApplyReport {
            results: vec![
                started("app", "pve3", 105, ok()),
                started("cold", "pve3", 106, ok()),
                started(
                    "broken",
                    "pve3",
                    107,
                    crate::execute::Outcome::Skipped {
                        reason: "held".to_owned(),
                    },
                ),
                started("other", "pve1", 108, ok()),
            ],
            held_back: None,
            findings: Vec::new(),
        };
        let ping = guests_to_ping("pve3", &report, &desired);
        assert_eq!(ping, BTreeMap::from([(105, "VM/app".to_owned())]));
    }

    #[test]
    fn guest_agent_health_pings_every_vm_the_revision_touched_until_the_revision_changes() {
        let mut r = rollout();
        let commit = "c".repeat(40);
        let touched = |vmid: u32| BTreeMap::from([(vmid, format!("VM/{vmid}"))]);
        assert!(
            r.touch(&commit, touched(105)).is_empty(),
            "power health pings nothing"
        );
        r.config.health = HealthKind::GuestAgent;
        assert_eq!(r.touch(&commit, touched(105)).len(), 1);
        assert_eq!(
            r.touch(&commit, BTreeMap::new()).keys().collect::<Vec<_>>(),
            [&105],
            "a later pass with nothing to do still pings what the revision touched"
        );
        let next = "d".repeat(40);
        assert_eq!(
            r.touch(&next, touched(110)).keys().collect::<Vec<_>>(),
            [&110]
        );
        r.after_pass(
            &next,
            PassOutcome::NoChange,
            0,
            &Plan::default(),
            &[
                "guest agent of VM/x (vmid 110) did not answer: QEMU guest agent is not running"
                    .to_owned(),
            ],
        );
        let view = r.view();
        assert_eq!(view.healthy_since, None);
        assert!(view.unhealthy.unwrap().contains("vmid 110"));
    }

    fn published(heartbeat_at: SystemTime) -> NodeStatus {
        NodeStatus {
            node: "pve3".to_owned(),
            heartbeat_at: rfc3339(heartbeat_at),
            heartbeat_secs: 10,
            applied_revision: Some("a".repeat(40)),
            attempted_revision: Some("b".repeat(40)),
            outcome: Some("failed".to_owned()),
            counts: crate::cluster::status_file::Counts {
                failed: 3,
                ..Default::default()
            },
            rollout: Some(RolloutView {
                health_revision: Some("a".repeat(40)),
                healthy_since: Some("2026-12-01T10:00:00Z".to_owned()),
                ..RolloutView::default()
            }),
            ..NodeStatus::default()
        }
    }

    #[test]
    fn a_node_pve_lists_offline_counts_as_down_whatever_its_file_says() {
        let now = SystemTime::now();
        let mut peers = vec![
            peer_of("pve3", &published(now), now),
            peer_of("pve2", &published(now), now),
        ];
        let members = crate::cluster::view::Members {
            nodes: vec![
                crate::cluster::view::Member {
                    name: "pve3".to_owned(),
                    online: false,
                },
                crate::cluster::view::Member {
                    name: "pve2".to_owned(),
                    online: true,
                },
            ],
            quorate: Some(true),
        };
        mark_offline(&mut peers, &members);
        assert_eq!(peers[0].unavailable, Some(Unavailable::Down));
        assert_eq!(peers[1].unavailable, None);
    }

    #[test]
    fn a_node_pve_reports_in_ha_maintenance_counts_as_in_maintenance_and_offline_wins() {
        use crate::agent::ha::HaStatus;
        let now = SystemTime::now();
        let fresh = || {
            vec![
                peer_of("pve3", &published(now), now),
                peer_of("pve2", &published(now - Duration::from_secs(60)), now),
                peer_of("pve4", &published(now), now),
            ]
        };
        let ha = HaStatus::Read(["pve3".to_owned(), "pve2".to_owned()].into());
        let mut peers = fresh();
        mark_maintenance(&mut peers, &ha);
        let marks: Vec<_> = peers.iter().map(|p| p.unavailable).collect();
        assert_eq!(
            marks,
            [
                Some(Unavailable::Maintenance),
                // Stale and in maintenance: maintenance is the operator's word, say that.
                Some(Unavailable::Maintenance),
                None
            ]
        );
        let members = crate::cluster::view::Members {
            nodes: vec![crate::cluster::view::Member {
                name: "pve3".to_owned(),
                online: false,
            }],
            quorate: Some(true),
        };
        mark_offline(&mut peers, &members);
        assert_eq!(peers[0].unavailable, Some(Unavailable::Down));
        // An unread HA status marks nobody.
        let mut peers = fresh();
        mark_maintenance(&mut peers, &HaStatus::Unknown("403".to_owned()));
        assert_eq!(peers[0].unavailable, None);
        assert_eq!(peers[1].unavailable, Some(Unavailable::Stale));
    }

    #[test]
    fn a_published_status_reads_as_applied_attempted_health_and_stale_after_three_heartbeats() {
        let now = SystemTime::now();
        let peer = peer_of("pve3", &published(now - Duration::from_secs(29)), now);
        assert_eq!(peer.applied.as_deref(), Some("a".repeat(40).as_str()));
        assert_eq!(peer.attempted, Some(("b".repeat(40), 3)));
        assert_eq!(
            peer.healthy_since.map(|t| t.to_rfc3339()),
            Some("2026-12-01T10:00:00+00:00".to_owned())
        );
        assert_eq!(peer.unavailable, None);
        // While a pass runs its counts are zero: the last finished failure still counts.
        let mut running = published(now);
        running.outcome = None;
        running.counts = crate::cluster::status_file::Counts::default();
        assert_eq!(peer_of("pve3", &running, now).attempted, None);
        running.rollout.as_mut().unwrap().failed_revision = Some("b".repeat(40));
        running.rollout.as_mut().unwrap().failed_actions = 2;
        assert_eq!(
            peer_of("pve3", &running, now).attempted,
            Some(("b".repeat(40), 2))
        );
        let stale = peer_of("pve3", &published(now - Duration::from_secs(31)), now);
        assert_eq!(stale.unavailable, Some(Unavailable::Stale));
        // Health about another revision than the applied one is not health.
        let mut other = published(now);
        other.applied_revision = Some("d".repeat(40));
        assert_eq!(peer_of("pve3", &other, now).healthy_since, None);
    }
}
