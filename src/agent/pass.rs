//! One recorded pass of the agent: fetch the revision, validate, observe, plan, apply, and
//! write what happened to the store as it happens (so a crash leaves an honest record and a
//! restarted agent can re-attach to the PVE tasks it started).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use proxops_core::manifest::{Placement, Spec};
use proxops_core::plan::{Action, FindingKind, NodeScope, Plan};
use proxops_core::repository::DesiredState;
use proxops_core::resource::ResourceId;
use proxops_store::{
    ActionId, ActionOutcome, PassCounts, PassId, PassOutcome, SharedStore, Store, StoreError,
    Trigger,
};
use tokio_util::sync::CancellationToken;

use crate::agent::breaker::Breaker;
use crate::agent::gate;
use crate::agent::retry::Verdict;
use crate::agent::status::{self, BreakerView, LastPass, LiveStatus};
use crate::config::Mode;
use crate::execute::{ApplyReport, Event, Outcome, Progress};
use crate::http::metrics::Metrics;
use crate::observe::error_text;
use crate::reconcile::{self, Context, PlanOptions, ReconcileError};
use crate::source::git::{GitSource, Revision};

/// Everything a pass needs.
pub struct PassDeps {
    /// PVE client, node scope, executor options.
    pub context: Context,
    /// The git repository followed.
    pub source: Arc<GitSource>,
    /// The state database.
    pub store: SharedStore,
    /// The live status for HTTP.
    pub live: Arc<LiveStatus>,
    /// The cluster to follow (composition mode).
    pub cluster: Option<String>,
    /// Apply or only report.
    pub mode: Mode,
    /// The node name passes are recorded under (`*` for a whole-cluster agent).
    pub node_label: String,
    /// Set on shutdown: aborts a running git fetch.
    pub interrupt: Arc<AtomicBool>,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// The write circuit breaker; it outlives configuration reloads.
    pub breaker: Arc<Mutex<Breaker>>,
    /// Prune and restart policy. Prune candidates are the guests carrying the ownership tag
    /// (DESIGN.md §3), so guests the Go program created are recognised; the store's inventory
    /// records what this agent created and deleted.
    pub plan_options: PlanOptions,
}

impl PassDeps {
    /// Publishes the breaker's state to the live status.
    pub fn publish_breaker(&self) {
        let breaker = self
            .breaker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.live
            .set_breaker(BreakerView::of(&breaker, std::time::Instant::now()));
    }

    /// Whether the breaker lets every write through.
    pub(crate) fn writes_allowed(&self) -> bool {
        !self
            .breaker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_read_only()
    }
}

fn with_store<T>(store: &SharedStore, f: impl FnOnce(&mut Store) -> T) -> T {
    let mut guard = store
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    f(&mut guard)
}

fn log_store_error<T>(result: Result<T, StoreError>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(error) => {
            tracing::error!(error = %error_text(&error), "writing the state database failed");
            None
        }
    }
}

/// A revision to work on and, when git could not be fetched, why: the revision is then the
/// last good one and the desired state is stale.
struct Fetched {
    revision: Revision,
    source_error: Option<String>,
}

/// Fetches the revision: the new one, or the last good one (marked stale) when git fails.
async fn fetch(deps: &PassDeps) -> Result<Fetched, String> {
    let source = deps.source.clone();
    let interrupt = deps.interrupt.clone();
    // On failure the last good revision is looked up in the same blocking task: it may
    // have to be read from the mirror (after a restart).
    let fetched = tokio::task::spawn_blocking(move || {
        source
            .fetch(&interrupt)
            .map_err(|error| (error_text(&error), source.last_good()))
    })
    .await;
    match fetched {
        Ok(Ok(revision)) => {
            deps.live.set_source_error(None, false);
            if revision.force_pushed {
                tracing::warn!(
                    commit = %revision.commit,
                    previous = revision.previous.as_deref().unwrap_or(""),
                    "branch was force-pushed; following it"
                );
            }
            Ok(Fetched {
                revision,
                source_error: None,
            })
        }
        Ok(Err((text, last_good))) => {
            deps.live
                .set_source_error(Some(text.clone()), last_good.is_some());
            match last_good {
                Some(revision) => {
                    tracing::warn!(
                        error = %text,
                        commit = %revision.commit,
                        "git fetch failed; the last good revision stays in force (desired state stale)"
                    );
                    Ok(Fetched {
                        revision,
                        source_error: Some(text),
                    })
                }
                None => {
                    tracing::warn!(error = %text, "git fetch failed and no revision was fetched before");
                    Err(text)
                }
            }
        }
        Err(join) => Err(format!("git fetch task failed: {join}")),
    }
}

/// Records what the fetch found on the pass: a force-push, or the git error that made the
/// desired state stale. A stale revision's own force-push was recorded when it was fetched.
fn note_source(deps: &PassDeps, pass: PassId, fetched: &Fetched) {
    let revision = &fetched.revision;
    let stale = fetched.source_error.is_some();
    let (previous, force_pushed) = if stale {
        (None, false)
    } else {
        (revision.previous.as_deref(), revision.force_pushed)
    };
    if previous.is_none() && !force_pushed && !stale {
        return;
    }
    with_store(&deps.store, |s| {
        log_store_error(s.note_source(
            pass,
            previous,
            force_pushed,
            fetched.source_error.as_deref(),
            stale,
        ))
    });
}

/// Ends a pass that failed before it could write anything, with the reason.
fn fail_early(
    deps: &PassDeps,
    pass: PassId,
    commit: Option<String>,
    started: SystemTime,
    counts: PassCounts,
    reason: String,
) -> Verdict {
    with_store(&deps.store, |s| {
        log_store_error(s.note_error(pass, &reason))
    });
    finish(deps, pass, PassOutcome::Failed, counts);
    deps.live.finish(last_pass(
        commit,
        started,
        "failed",
        Vec::new(),
        Some(reason),
    ));
    Verdict::Transient
}

/// Runs one pass and records it. Returns how the loop should carry on.
pub async fn run_pass(deps: &PassDeps, trigger: Trigger, cancel: &CancellationToken) -> Verdict {
    let started = SystemTime::now();
    let fetched = match fetch(deps).await {
        Ok(fetched) => fetched,
        Err(error) => {
            let id = with_store(&deps.store, |s| {
                log_store_error(s.begin_pass(&deps.node_label, None, trigger, started))
            });
            if let Some(id) = id {
                with_store(&deps.store, |s| {
                    log_store_error(s.note_source(id, None, false, Some(&error), false))
                });
                return fail_early(deps, id, None, started, PassCounts::default(), error);
            }
            deps.live
                .finish(last_pass(None, started, "failed", Vec::new(), Some(error)));
            return Verdict::Transient;
        }
    };
    let commit = fetched.revision.commit.clone();
    let span = tracing::info_span!("pass", revision = %short(&commit), trigger = trigger.as_str());
    let _entered = span.enter();
    let Some(pass) = with_store(&deps.store, |s| {
        log_store_error(s.begin_pass(&deps.node_label, Some(&commit), trigger, started))
    }) else {
        return Verdict::Transient;
    };
    note_source(deps, pass, &fetched);
    let stale = fetched.source_error.is_some();
    let revision = fetched.revision;

    // An unresolvable cloud-init reference refuses the revision like a validation error.
    let desired = match reconcile::desired_state(&revision.files, deps.cluster.as_deref()).and_then(
        |mut desired| {
            reconcile::resolve_secrets(&mut desired, &revision.files, &deps.context.secrets)
                .map(|()| desired)
        },
    ) {
        Ok(desired) => desired,
        Err(error) => {
            if let ReconcileError::Invalid(diagnostics) = &error {
                with_store(&deps.store, |s| {
                    log_store_error(s.record_invalid(pass, diagnostics))
                });
            }
            let text = error_text(&error);
            tracing::warn!(error = %text, "revision not applied");
            finish(deps, pass, PassOutcome::Invalid, PassCounts::default());
            deps.live.finish(last_pass(
                Some(commit),
                started,
                "invalid",
                Vec::new(),
                Some(text),
            ));
            return Verdict::Stalled;
        }
    };

    // How the owned guests were created, for requires-recreate findings (PVE keeps no
    // clone source, CT template or imported image); unreadable → nothing compared.
    let mut options = deps.plan_options.clone();
    options.created =
        with_store(&deps.store, |s| log_store_error(s.creations(None))).unwrap_or_default();
    let plan = reconcile::observe_and_plan_with(&deps.context, &desired, &options).await;
    if let Some(reason) = &plan.aborted {
        // Fail closed: without the guest listing nothing is written, and the findings of
        // this pass say nothing about drift (recording them would resolve every open one).
        let reason = format!("listing the cluster's guests failed: {reason}");
        tracing::warn!(%reason, "pass aborted before any write");
        let counts = ApplyReport::default().pass_counts(plan.findings.len());
        return fail_early(deps, pass, Some(commit), started, counts, reason);
    }
    record_findings(deps, &desired, &plan, &commit);
    let observe_failed = plan
        .findings
        .iter()
        .any(|f| f.kind == FindingKind::ObserveFailed);

    let gated = if deps.mode == Mode::Apply && plan.has_changes() {
        let permit = gate::permit(deps);
        with_store(&deps.store, |s| {
            log_store_error(s.note_write_breaker(pass, permit.mark))
        });
        Some(gate::split(&plan, permit))
    } else {
        None
    };
    let mut held_reason = gated.as_ref().and_then(|g| g.reason.clone());
    let report = match &gated {
        Some(gated) => {
            let progress = recording_progress(deps, pass, cancel.clone());
            let (mut report, tripped) =
                gate::apply_levels(deps, &desired, &gated.run, &progress, cancel).await;
            if tripped > 0 {
                held_reason = Some(format!(
                    "write circuit breaker opened during the pass: {tripped} action(s) of later \
                     levels held back"
                ));
            }
            report
                .results
                .extend(gate::hold_back(&gated.held, &progress));
            Some(report)
        }
        None => None,
    };
    deps.publish_breaker();

    let (outcome, counts) = match &report {
        _ if cancel.is_cancelled() => (
            PassOutcome::Interrupted,
            report
                .as_ref()
                .map_or_else(PassCounts::default, |r| r.pass_counts(plan.findings.len())),
        ),
        Some(r) if r.is_success() => (PassOutcome::Applied, r.pass_counts(plan.findings.len())),
        Some(r) => (PassOutcome::Failed, r.pass_counts(plan.findings.len())),
        None => (
            PassOutcome::NoChange,
            ApplyReport::default().pass_counts(plan.findings.len()),
        ),
    };
    if let Some(reason) = &held_reason {
        with_store(&deps.store, |s| log_store_error(s.note_error(pass, reason)));
    }
    finish(deps, pass, outcome, counts);
    let objects = status::objects(
        desired.cluster.as_deref(),
        placements(&desired, &deps.context.scope).into_iter(),
        &plan,
        report.as_ref(),
    );
    let mut last = last_pass(Some(commit), started, outcome.as_str(), objects, None);
    // Writes held back by the breaker are not an abort: the pass observed and recorded.
    last.writes_held_back = held_reason;
    deps.live.finish(last);
    tracing::info!(outcome = outcome.as_str(), stale, "pass finished");
    match outcome {
        // The probe write succeeded: the writes it held back are due now.
        PassOutcome::Failed
            if gated.as_ref().is_some_and(|g| g.probed) && deps.writes_allowed() =>
        {
            Verdict::Again
        }
        PassOutcome::Applied | PassOutcome::NoChange if observe_failed => Verdict::Transient,
        PassOutcome::Applied | PassOutcome::NoChange | PassOutcome::Interrupted => Verdict::Ok,
        PassOutcome::Failed | PassOutcome::Invalid => Verdict::Stalled,
    }
}

/// Records the guests this pass created (now owned) and deleted (released).
fn finish(deps: &PassDeps, pass: PassId, outcome: PassOutcome, counts: PassCounts) {
    with_store(&deps.store, |s| {
        log_store_error(s.finish_pass(pass, outcome, counts, SystemTime::now()))
    });
}

/// Records findings for every node the pass covers, so findings that went away resolve.
fn record_findings(deps: &PassDeps, desired: &DesiredState, plan: &Plan, commit: &str) {
    let mut nodes: BTreeSet<String> = match &deps.context.scope {
        NodeScope::Node(node) => [node.clone()].into(),
        NodeScope::All => placements(desired, &NodeScope::All)
            .into_iter()
            .flat_map(|(_, n, _)| n)
            .collect(),
    };
    nodes.extend(plan.findings.iter().map(|f| f.node.clone()));
    let now = SystemTime::now();
    with_store(&deps.store, |s| {
        if let NodeScope::All = deps.context.scope {
            // Nodes that had open findings but no longer appear still get resolved.
            if let Some(open) = log_store_error(s.open_findings(None)) {
                nodes.extend(open.into_iter().map(|r| r.node));
            }
        }
        for node in &nodes {
            let findings: Vec<_> = plan
                .findings
                .iter()
                .filter(|f| &f.node == node)
                .cloned()
                .collect();
            log_store_error(s.record_findings(node, Some(commit), now, &findings));
        }
    });
}

/// (resource, nodes in scope, vmid) for every resource of the desired state.
fn placements(
    desired: &DesiredState,
    scope: &NodeScope,
) -> Vec<(ResourceId, Vec<String>, Option<u32>)> {
    desired
        .manifest
        .resources()
        .filter_map(|r| {
            let (nodes, vmid) = match (&r.placement, &r.spec) {
                (_, Some(Spec::Artifact(a))) => (
                    a.nodes
                        .iter()
                        .map(|n| n.as_str().to_owned())
                        .collect::<Vec<_>>(),
                    None,
                ),
                (Placement::Guest { node, vmid, .. }, _) => (vec![node.clone()], Some(*vmid)),
                (Placement::Artifact { nodes, .. }, _) => (nodes.clone(), None),
            };
            let nodes: Vec<String> = nodes.into_iter().filter(|n| scope.includes(n)).collect();
            (!nodes.is_empty()).then(|| (r.id.clone(), nodes, vmid))
        })
        .collect()
}

/// Store ids and start times of the actions of this pass, by (resource, node, verb).
type ActionIds = BTreeMap<(ResourceId, String, String), (ActionId, std::time::Instant)>;

/// A progress sink that writes each action's start, task and result to the store as they
/// happen (the UPID is stored before the wait begins), and counts each write's result for
/// the write circuit breaker.
fn recording_progress(deps: &PassDeps, pass: PassId, cancel: CancellationToken) -> Progress {
    let store = deps.store.clone();
    let metrics = deps.metrics.clone();
    let breaker = deps.breaker.clone();
    let live = deps.live.clone();
    let ids: Arc<Mutex<ActionIds>> = Arc::default();
    let key = |a: &Action| (a.resource.clone(), a.node.clone(), a.verb.name().to_owned());
    Arc::new(move |event: &Event| {
        let now = SystemTime::now();
        let mut ids = ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match event {
            Event::Started { action } => {
                if let Some(id) = with_store(&store, |s| {
                    log_store_error(s.record_action_started(pass, action, now))
                }) {
                    ids.insert(key(action), (id, std::time::Instant::now()));
                }
            }
            Event::TaskStarted { action, upid } => {
                if let Some((id, _)) = ids.get(&key(action)) {
                    with_store(&store, |s| {
                        log_store_error(s.record_task_started(*id, upid, now))
                    });
                }
            }
            Event::Finished { result } => {
                // Shutdown stopped the wait, not the task: leave the action without a result
                // so the next start re-attaches to its UPID instead of issuing it again.
                if cancel.is_cancelled()
                    && matches!(&result.outcome, Outcome::Failed { upid: Some(_), .. })
                {
                    return;
                }
                let succeeded = match &result.outcome {
                    Outcome::Succeeded { .. } => Some(true),
                    // A write cut short by shutdown says nothing about PVE.
                    Outcome::Failed { .. } if !cancel.is_cancelled() => Some(false),
                    Outcome::Failed { .. } | Outcome::Skipped { .. } => None,
                };
                if let Some(succeeded) = succeeded {
                    let mut breaker = breaker
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let at = std::time::Instant::now();
                    let was_open = breaker.open_until().is_some();
                    breaker.record(succeeded, at);
                    if !was_open && breaker.open_until().is_some() {
                        tracing::error!(
                            failures = breaker.consecutive_failures(),
                            "write circuit breaker opened: the agent is read-only until its cool-down ends"
                        );
                    }
                    live.set_breaker(BreakerView::of(&breaker, at));
                }
                let started = ids.get(&key(&result.action)).copied();
                let seconds = started.map_or(0.0, |(_, at)| at.elapsed().as_secs_f64());
                let outcome = ActionOutcome::from(&result.outcome);
                metrics.action(result.action.verb.name(), outcome.as_str(), seconds);
                let id = match started {
                    Some((id, _)) => Some(id),
                    // Skipped before it started: record it so the pass is complete.
                    None => with_store(&store, |s| {
                        log_store_error(s.record_action_started(pass, &result.action, now))
                    }),
                };
                if let Some(id) = id {
                    with_store(&store, |s| {
                        log_store_error(s.record_action_result(id, &outcome, now))
                    });
                }
            }
        }
    })
}

fn last_pass(
    commit: Option<String>,
    started: SystemTime,
    outcome: &str,
    objects: Vec<status::ObjectStatus>,
    abort_reason: Option<String>,
) -> LastPass {
    LastPass {
        commit,
        started_at: rfc3339(started),
        finished_at: rfc3339(SystemTime::now()),
        outcome: outcome.to_owned(),
        objects,
        abort_reason,
        writes_held_back: None,
    }
}

/// RFC 3339 in UTC, seconds precision.
pub fn rfc3339(time: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(time).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}
