//! Execute: run a `Plan` against PVE and report what happened. It never decides what to
//! change (the planner did); it only orders, limits and waits.
//!
//! Levels run in order. Within a level the actions of one guest (create then start, update
//! then reboot, shutdown then delete) run in plan order, one after the other, and stop at the
//! first failure; different guests run concurrently, at most `concurrency_per_node` at a time
//! per node. Downloads to the same (node, storage) run one after the other, and so do clones
//! from the same source template. Every PVE task is waited for. A failed action skips only
//! the actions that depend on it on the same node; independent actions continue.
//!
//! Between levels the executor asks the caller's [`Gate`] whether to go on: the agent's
//! write circuit breaker holds the later levels back when it opened during the pass.
//! A failed action carries its [`FailureClass`], set where the failure is known.

mod download;
mod failure;
mod guest;
mod snippets;

pub use failure::FailureClass;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use proxops_core::plan::{Action, Plan, Verb};
use proxops_core::repository::DesiredState;
use proxops_core::resource::Kind;
use proxops_core::resource::ResourceId;
use proxops_pve::{PveClient, Upid, WaitOptions};
use serde::Serialize;
use tokio::sync::{Mutex, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How the executor runs a plan.
#[derive(Debug, Clone)]
pub struct Options {
    /// Concurrent actions per node within a level.
    pub concurrency_per_node: usize,
    /// How to wait for PVE tasks.
    pub wait: WaitOptions,
    /// How long to keep retrying a write PVE refused because of a lock.
    pub lock_retry_for: Duration,
    /// The node this process runs on, which snippet files are written on (`None`: the
    /// host name).
    pub local_node: Option<String>,
    /// `[scope]`: an action outside it is refused, never sent (defence in depth: the
    /// pipeline keeps such actions out of plans).
    pub scope: proxops_core::scope::Scope,
    /// `[pmxcfs] lock_dir`: a download to a shared storage runs under a cluster-wide lock
    /// there (`crate::cluster::lock`); `None` without `[pmxcfs]`.
    pub cluster_lock_dir: Option<std::path::PathBuf>,
}

/// Progress of an apply, for people watching it.
#[derive(Debug, Clone)]
pub enum Event {
    /// An action is about to be sent.
    Started {
        /// The action.
        action: Action,
    },
    /// PVE accepted the action and runs it as a task.
    TaskStarted {
        /// The action.
        action: Action,
        /// The task's UPID.
        upid: Upid,
    },
    /// The action ended.
    Finished {
        /// What happened.
        result: ActionResult,
    },
}

/// Receives progress events; called from the executor's tasks.
pub type Progress = Arc<dyn Fn(&Event) + Send + Sync>;

/// Asked before each level runs: whether the executor may go on writing.
pub trait Gate: Send {
    /// Before level `index` (0 is the first) starts.
    fn before_level(&mut self, index: usize) -> LevelGate;
}

/// A gate's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LevelGate {
    /// Run the level.
    Continue,
    /// Run neither this level nor any later one: their actions are reported skipped as
    /// `held back: <reason>`.
    HoldBack(String),
}

impl<F: FnMut(usize) -> LevelGate + Send> Gate for F {
    fn before_level(&mut self, index: usize) -> LevelGate {
        self(index)
    }
}

/// The gate that lets every level run.
pub fn open_gate() -> impl Gate {
    |_: usize| LevelGate::Continue
}

/// What happened to each action of a plan, in plan order.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ApplyReport {
    /// One result per action.
    pub results: Vec<ActionResult>,
    /// The levels a gate held back, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_back: Option<HeldBack>,
}

/// Levels a gate held back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldBack {
    /// The gate's reason.
    pub reason: String,
    /// The level the gate stopped before.
    pub level: usize,
    /// How many actions were held back.
    pub actions: usize,
}

impl ApplyReport {
    /// True when every action succeeded.
    pub fn is_success(&self) -> bool {
        self.results
            .iter()
            .all(|r| matches!(r.outcome, Outcome::Succeeded { .. }))
    }

    /// How many actions ended each way: (succeeded, failed, skipped).
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for result in &self.results {
            match result.outcome {
                Outcome::Succeeded { .. } => counts.0 += 1,
                Outcome::Failed { .. } => counts.1 += 1,
                Outcome::Skipped { .. } => counts.2 += 1,
            }
        }
        counts
    }

    /// The class of every failed action, in plan order.
    pub fn failure_classes(&self) -> impl Iterator<Item = FailureClass> + '_ {
        self.results.iter().filter_map(|r| match r.outcome {
            Outcome::Failed { class, .. } => Some(class),
            _ => None,
        })
    }
}

/// What happened to one action.
#[derive(Debug, Clone, Serialize)]
pub struct ActionResult {
    /// The action.
    pub action: Action,
    /// How it ended.
    pub outcome: Outcome,
}

/// How an action ended.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    /// PVE did it.
    Succeeded {
        /// The task that did it.
        upid: Option<Upid>,
        /// PVE's exit status (`OK` or `WARNINGS: n`).
        exitstatus: String,
    },
    /// PVE refused it or its task failed.
    Failed {
        /// What kind of failure: whether it may heal by itself.
        class: FailureClass,
        /// The task, when PVE started one.
        upid: Option<Upid>,
        /// PVE's message or exit status.
        error: String,
    },
    /// Not attempted.
    Skipped {
        /// Why.
        reason: String,
    },
}

/// Runs `plan` (computed from `desired`) against PVE, asking `gate` before each level.
pub async fn apply(
    pve: &PveClient,
    desired: &DesiredState,
    plan: &Plan,
    options: &Options,
    progress: &Progress,
    gate: &mut dyn Gate,
    cancel: &CancellationToken,
) -> ApplyReport {
    let mut report = ApplyReport::default();
    // (resource, node) pairs that failed or could not be observed: their dependants wait.
    let mut not_ready: BTreeSet<(ResourceId, String)> = plan.blocked.clone();
    let node_limits: BTreeMap<String, Arc<Semaphore>> = plan
        .actions()
        .map(|a| {
            (
                a.node.clone(),
                Arc::new(Semaphore::new(options.concurrency_per_node.max(1))),
            )
        })
        .collect();
    let storage_locks: BTreeMap<(String, String), Arc<Mutex<()>>> = plan
        .actions()
        .filter_map(serialised_on)
        .map(|key| (key, Arc::default()))
        .collect();

    let shared_desired = Arc::new(desired.clone());
    for (level_index, level) in plan.levels.iter().enumerate() {
        if let LevelGate::HoldBack(reason) = gate.before_level(level_index) {
            let held: Vec<Action> = plan.levels[level_index..]
                .iter()
                .flatten()
                .cloned()
                .collect();
            report.held_back = Some(HeldBack {
                reason: reason.clone(),
                level: level_index,
                actions: held.len(),
            });
            report
                .results
                .extend(skip_all(&held, &format!("held back: {reason}"), progress));
            break;
        }
        // The actions of one guest (or one download) on one node, in plan order.
        let mut groups: BTreeMap<(ResourceId, String), Vec<(usize, &Action)>> = BTreeMap::new();
        for (index, action) in level.iter().enumerate() {
            groups
                .entry((action.resource.clone(), action.node.clone()))
                .or_default()
                .push((index, action));
        }
        let mut running = JoinSet::new();
        let mut level_results = Vec::new();
        for (_, group) in groups {
            let first = group[0].1;
            if let Some(reason) = waiting_on(desired, first, &not_ready) {
                for (index, action) in group {
                    level_results.push((index, skipped(action, reason.clone(), progress)));
                }
                continue;
            }
            if cancel.is_cancelled() {
                for (index, action) in group {
                    level_results
                        .push((index, skipped(action, "interrupted".to_owned(), progress)));
                }
                continue;
            }
            let group: Vec<(usize, Action)> =
                group.into_iter().map(|(i, a)| (i, a.clone())).collect();
            let pve = pve.clone();
            let desired = shared_desired.clone();
            let options = options.clone();
            let progress = progress.clone();
            let cancel = cancel.clone();
            let node_limit = node_limits.get(&first.node).cloned();
            let locks: Vec<Option<Arc<Mutex<()>>>> = group
                .iter()
                .map(|(_, a)| serialised_on(a).and_then(|key| storage_locks.get(&key).cloned()))
                .collect();
            running.spawn(async move {
                let _permit = match &node_limit {
                    Some(limit) => limit.acquire().await.ok(),
                    None => None,
                };
                let mut results = Vec::new();
                let mut failed: Option<String> = None;
                for ((index, action), lock) in group.into_iter().zip(locks) {
                    if let Some(verb) = &failed {
                        results.push((
                            index,
                            skipped(
                                &action,
                                format!("{verb} of {} did not succeed", action.resource),
                                &progress,
                            ),
                        ));
                        continue;
                    }
                    if cancel.is_cancelled() {
                        results
                            .push((index, skipped(&action, "interrupted".to_owned(), &progress)));
                        continue;
                    }
                    let _serialised = match &lock {
                        Some(lock) => Some(lock.lock().await),
                        None => None,
                    };
                    progress(&Event::Started {
                        action: action.clone(),
                    });
                    let outcome = if let Some(error) = options.scope.refusal(&action) {
                        Outcome::Failed {
                            class: FailureClass::Refused,
                            upid: None,
                            error,
                        }
                    } else {
                        match &action.verb {
                            Verb::Download(d) => {
                                download::run(&pve, &action, d, &options, &progress, &cancel).await
                            }
                            Verb::WriteSnippet(s) => {
                                snippets::write(&pve, &desired, &action, s, &options).await
                            }
                            Verb::RemoveSnippet(s) => {
                                snippets::remove(&pve, &action, s, &options).await
                            }
                            _ => {
                                guest::GuestRun {
                                    pve: &pve,
                                    desired: &desired,
                                    action: &action,
                                    options: &options,
                                    progress: &progress,
                                    cancel: &cancel,
                                }
                                .run()
                                .await
                            }
                        }
                    };
                    if !matches!(outcome, Outcome::Succeeded { .. }) {
                        failed = Some(action.verb.name().to_owned());
                    }
                    let result = ActionResult { action, outcome };
                    progress(&Event::Finished {
                        result: result.clone(),
                    });
                    results.push((index, result));
                }
                results
            });
        }
        while let Some(joined) = running.join_next().await {
            match joined {
                Ok(done) => level_results.extend(done),
                Err(error) => tracing::error!(%error, "an action task panicked"),
            }
        }
        level_results.sort_by_key(|(index, _)| *index);
        for (_, result) in level_results {
            if !matches!(result.outcome, Outcome::Succeeded { .. }) {
                not_ready.insert((result.action.resource.clone(), result.action.node.clone()));
            }
            report.results.push(result);
        }
    }
    report
}

/// What an action must have to itself: downloads to one (node, storage) run one at a time,
/// so two never race on the same file; clones from one source template run one at a time,
/// because PVE holds the source's config lock while it copies.
fn serialised_on(action: &Action) -> Option<(String, String)> {
    match &action.verb {
        Verb::Download(d) => Some((action.node.clone(), d.storage.clone())),
        Verb::Clone(c) => Some((
            format!("{}/{}", Kind::TemplateVm, c.source),
            c.source_vmid.to_string(),
        )),
        _ => None,
    }
}

/// Why `action` must wait, if a resource it depends on is not ready on its node.
fn waiting_on(
    desired: &DesiredState,
    action: &Action,
    not_ready: &BTreeSet<(ResourceId, String)>,
) -> Option<String> {
    let resource = desired.manifest.get(&action.resource)?;
    resource.references.iter().find_map(|reference| {
        not_ready
            .contains(&(reference.target.clone(), action.node.clone()))
            .then(|| format!("{} is not ready on {}", reference.target, action.node))
    })
}

/// Reports every action of `actions` as skipped for `reason`, through `progress`.
pub fn skip_all(actions: &[Action], reason: &str, progress: &Progress) -> Vec<ActionResult> {
    actions
        .iter()
        .map(|action| skipped(action, reason.to_owned(), progress))
        .collect()
}

fn skipped(action: &Action, reason: String, progress: &Progress) -> ActionResult {
    let result = ActionResult {
        action: action.clone(),
        outcome: Outcome::Skipped { reason },
    };
    progress(&Event::Finished {
        result: result.clone(),
    });
    result
}

// The store's row types know nothing of the executor; these conversions live with the types
// they convert from.

impl From<&Outcome> for proxops_store::ActionOutcome {
    fn from(outcome: &Outcome) -> Self {
        match outcome {
            Outcome::Succeeded { exitstatus, .. } => Self::Succeeded {
                exitstatus: exitstatus.clone(),
            },
            Outcome::Failed { error, .. } => Self::Failed {
                error: error.clone(),
            },
            Outcome::Skipped { reason } => Self::Skipped {
                reason: reason.clone(),
            },
        }
    }
}

impl ApplyReport {
    /// The counts to record for this report's pass, with the plan's number of findings.
    pub fn pass_counts(&self, findings: usize) -> proxops_store::PassCounts {
        let (ok, failed, skipped) = self.counts();
        let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        proxops_store::PassCounts {
            actions_ok: clamp(ok),
            actions_failed: clamp(failed),
            actions_skipped: clamp(skipped),
            findings: clamp(findings),
        }
    }
}

#[cfg(test)]
mod store_conversion_tests {
    use proxops_store::{ActionOutcome, PassCounts};

    use super::*;

    #[test]
    fn executor_outcomes_convert_to_recorded_outcomes() {
        let outcome = Outcome::Succeeded {
            upid: None,
            exitstatus: "WARNINGS: 1".to_owned(),
        };
        assert_eq!(
            ActionOutcome::from(&outcome),
            ActionOutcome::Succeeded {
                exitstatus: "WARNINGS: 1".to_owned()
            }
        );
    }

    #[test]
    fn an_empty_report_counts_only_the_findings() {
        let counts = ApplyReport::default().pass_counts(3);
        assert_eq!(
            counts,
            PassCounts {
                findings: 3,
                ..PassCounts::default()
            }
        );
    }
}
