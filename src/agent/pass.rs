//! One recorded pass of the agent, in named phases: fetch the revision, then validate,
//! observe and plan, gate and execute through the one pipeline (`reconcile_once`, with the
//! agent's hooks), then record. Actions are written to the store as they happen (each UPID
//! before its wait), so a crash leaves an honest record and a restarted agent can re-attach
//! to the PVE tasks it started; the end of a pass is written in one place, `record`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use proxops_core::diagnostic::Diagnostic;
use proxops_core::manifest::{Placement, Spec};
use proxops_core::plan::{Action, Finding, FindingKind, NodeScope, Plan, Verb};
use proxops_core::repository::DesiredState;
use proxops_core::resource::ResourceId;
use proxops_store::{
    ActionId, ActionOutcome, DriftRecord, PassCounts, PassId, PassOutcome, Resolution, SharedStore,
    Store, StoreError, Trigger,
};
use tokio_util::sync::CancellationToken;

use crate::agent::approval;
use crate::agent::breaker::{Breaker, Permit};
use crate::agent::gate;
use crate::agent::retry::{PassEnd, Verdict};
use crate::agent::status::{self, BreakerView, LastPass, LiveStatus};
use crate::agent::window;
use crate::error_chain::error_text;
use crate::execute::{ApplyReport, Event, LevelGate, Outcome, Progress};
use crate::metrics::Metrics;
use crate::reconcile::{self, Approval, Context, Hooks, Mode, PlanOptions, ReconcileError};
use crate::source::git::{GitSource, Revision};
use crate::timefmt::rfc3339;

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
    /// The node name passes are recorded under (`*` for a whole-cluster agent).
    pub node_label: String,
    /// Set on shutdown: aborts a running git fetch.
    pub interrupt: Arc<AtomicBool>,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// The write circuit breaker; it outlives configuration reloads.
    pub breaker: Arc<Mutex<Breaker>>,
    /// Prune and restart policy. Prune candidates are the guests carrying the ownership tag,
    /// so guests the Go program created are recognised; each pass adds how the store says
    /// this agent created its guests.
    pub plan_options: PlanOptions,
    /// The last revision that validated: enforced while HEAD is invalid. Empty after a
    /// start or reload until a pass needs it; it is then read from the mirror at the commit
    /// the store recorded as last enforced.
    pub enforced: Mutex<Option<Revision>>,
    /// `[forge]`: commit statuses (`None` without one, or with `status = false`).
    pub forge: Option<Arc<crate::forge::Forge>>,
    /// `[policy] approve`: what waits for `proxops approve` (`agent::approval`).
    pub approve: crate::agent::approval::ApprovePolicy,
    /// `[rollout]`: waves that hold a new commit's writes (`None` without the table).
    pub rollout: Option<Arc<crate::agent::rollout::Rollout>>,
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

/// Git failed and no revision was fetched before: what to say, and whether it may heal.
struct FetchFailure {
    text: String,
    transient: bool,
}

/// Fetches the revision: the new one, or the last good one (marked stale) when git fails.
async fn fetch(deps: &PassDeps) -> Result<Fetched, FetchFailure> {
    let source = deps.source.clone();
    let interrupt = deps.interrupt.clone();
    // On failure the last good revision is looked up in the same blocking task: it may
    // have to be read from the mirror (after a restart).
    let fetched = tokio::task::spawn_blocking(move || {
        source
            .fetch(&interrupt)
            .map_err(|error| (error_text(&error), error.is_transient(), source.last_good()))
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
        Ok(Err((text, transient, last_good))) => {
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
                    Err(FetchFailure { text, transient })
                }
            }
        }
        Err(join) => Err(FetchFailure {
            text: format!("git fetch task failed: {join}"),
            transient: true,
        }),
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

/// How a pass ended, with everything its record needs: the store's row, the live view and
/// the loop's [`PassEnd`]. Built by the phases, written by [`record`] alone.
struct Ended {
    end: PassEnd,
    outcome: PassOutcome,
    commit: Option<String>,
    counts: PassCounts,
    /// Written to the pass's record as its error note.
    note: Option<String>,
    /// Why nothing was applied, for the live view.
    abort_reason: Option<String>,
    /// Why writes were held back, for the live view.
    writes_held_back: Option<String>,
    /// The invalid revision's diagnostics.
    diagnostics: Vec<Diagnostic>,
    objects: Vec<status::ObjectStatus>,
    /// The revision whose desired state the pass enforced, and how that ended.
    enforced: Option<(String, PassOutcome)>,
    /// HEAD was refused: what every view says about it.
    head_invalid: Option<status::InvalidHead>,
}

impl Ended {
    /// A pass that failed before it wrote anything, for `reason`.
    fn failed(end: PassEnd, commit: Option<String>, counts: PassCounts, reason: String) -> Self {
        Self {
            end,
            outcome: PassOutcome::Failed,
            commit,
            counts,
            note: Some(reason.clone()),
            abort_reason: Some(reason),
            writes_held_back: None,
            diagnostics: Vec::new(),
            objects: Vec::new(),
            enforced: None,
            head_invalid: None,
        }
    }
}

/// Runs one pass and records it: fetch → validate → observe and plan → gate and execute
/// (the last three are [`reconcile::reconcile_once`] with the agent's `AgentHooks`) →
/// record. Returns how the loop should carry on.
pub async fn run_pass(deps: &PassDeps, trigger: Trigger, cancel: &CancellationToken) -> Verdict {
    let started = SystemTime::now();
    let fetched = fetch(deps).await;
    let commit = fetched.as_ref().ok().map(|f| f.revision.commit.clone());
    let span = tracing::info_span!(
        "pass",
        revision = %short(commit.as_deref().unwrap_or("-")),
        trigger = trigger.as_str()
    );
    let _entered = span.enter();
    let Some(pass) = with_store(&deps.store, |s| {
        log_store_error(s.begin_pass(&deps.node_label, commit.as_deref(), trigger, started))
    }) else {
        // Nothing can be recorded; the live view still says why when git failed too.
        if let Err(failure) = fetched {
            deps.live.finish(last_pass(
                None,
                started,
                PassOutcome::Failed.as_str(),
                Vec::new(),
                Some(failure.text),
            ));
        }
        return Verdict::of(&PassEnd::StoreFailed);
    };
    if let (Some(forge), Some(commit)) = (&deps.forge, &commit) {
        forge.pass_started(pass, commit);
    }
    let ended = match fetched {
        Err(failure) => {
            with_store(&deps.store, |s| {
                log_store_error(s.note_source(pass, None, false, Some(&failure.text), false))
            });
            Ended::failed(
                PassEnd::NoRevision {
                    transient: failure.transient,
                },
                None,
                PassCounts::default(),
                failure.text,
            )
        }
        Ok(fetched) => {
            note_source(deps, pass, &fetched);
            reconcile(deps, pass, &fetched.revision, cancel).await
        }
    };
    record(deps, pass, started, ended)
}

/// The phases after the fetch: validate, observe and plan, gate and execute, through the one
/// pipeline, with the agent's hooks. When the revision is refused (invalid, or a secret
/// reference that does not resolve), the last valid revision stays in force: the same
/// pipeline runs on its files, so drift is observed, recorded and (per policy) corrected
/// against it, and the pass is recorded as what it was (outcome `invalid`, with HEAD's
/// diagnostics, the revision it enforced and that revision's actions and findings).
async fn reconcile(
    deps: &PassDeps,
    pass: PassId,
    revision: &Revision,
    cancel: &CancellationToken,
) -> Ended {
    let commit = revision.commit.clone();
    // `[source] verify` first: an unverified HEAD is refused like an invalid one.
    let unverified = unverified(deps, &commit).await;
    let (text, diagnostics) = match unverified.clone() {
        Some(refusal) => (refusal, Vec::new()),
        None => {
            let (result, gated) = enforce(deps, pass, revision, cancel).await;
            let error = match result {
                Ok(done) => {
                    *lock(&deps.enforced) = Some(revision.clone());
                    let mut ended = ran(deps, commit.clone(), &done, gated, cancel);
                    ended.enforced = Some((commit, ended.outcome));
                    return ended;
                }
                Err(error) => error,
            };
            let text = error_text(&error);
            match error {
                ReconcileError::Invalid(diagnostics) => (text, diagnostics),
                _ => (text, Vec::new()),
            }
        }
    };
    let in_force = match last_valid(deps, &commit).await {
        Some(valid) => {
            tracing::warn!(
                error = %text,
                enforced = %short(&valid.commit),
                "revision not applied; the last valid revision stays in force"
            );
            let (result, gated) = enforce(deps, pass, &valid, cancel).await;
            match result {
                Ok(done) => Some((valid.commit.clone(), done, gated)),
                Err(again) => {
                    tracing::warn!(error = %error_text(&again), enforced = %short(&valid.commit), "the last valid revision is refused too; nothing is enforced");
                    None
                }
            }
        }
        None => {
            tracing::warn!(error = %text, "revision not applied; no earlier valid revision to enforce");
            None
        }
    };
    let mut ended = match in_force {
        Some((valid, done, gated)) => {
            let mut ended = ran(deps, valid.clone(), &done, gated, cancel);
            ended.enforced = Some((valid, ended.outcome));
            ended
        }
        None => Ended {
            end: PassEnd::Invalid,
            outcome: PassOutcome::Invalid,
            commit: None,
            counts: PassCounts::default(),
            note: None,
            abort_reason: None,
            writes_held_back: None,
            diagnostics: Vec::new(),
            objects: Vec::new(),
            enforced: None,
            head_invalid: None,
        },
    };
    let last_applied = with_store(&deps.store, |s| {
        log_store_error(s.last_applied(&deps.node_label))
    })
    .flatten()
    .and_then(|p| p.commit);
    let enforced = ended.enforced.as_ref().map(|(c, _)| c.as_str());
    ended.head_invalid = Some(status::InvalidHead::new(
        &commit,
        &text,
        &diagnostics,
        enforced.map(|c| (c, last_applied.as_deref() == Some(c))),
    ));
    // The pass is what it was: HEAD refused. Its actions and findings are the enforced
    // revision's; a failure of those is the note, else the refusal.
    ended.outcome = if unverified.is_some() {
        PassOutcome::Unverified
    } else {
        PassOutcome::Invalid
    };
    ended.commit = Some(commit);
    ended.note = Some(match (ended.note.take(), &ended.enforced) {
        (Some(note), Some((valid, _))) => format!("{text}; enforcing {}: {note}", short(valid)),
        _ => text.clone(),
    });
    ended.abort_reason = ended.abort_reason.take().or(Some(text));
    ended.diagnostics = diagnostics;
    ended
}

/// `[source] verify` of `head` (`range`: since the revision in force, the enforced one in
/// memory or recorded); `None` when it passes or is off, else the refusal's text
/// (`unverified: <commit>: <why>`).
async fn unverified(deps: &PassDeps, head: &str) -> Option<String> {
    if !deps.source.verifies() {
        return None;
    }
    let base = match lock(&deps.enforced).as_ref() {
        Some(enforced) => Some(enforced.commit.clone()),
        None => with_store(&deps.store, |s| {
            log_store_error(s.last_enforced(&deps.node_label))
        })
        .flatten()
        .and_then(|p| p.enforced_commit().map(str::to_owned)),
    };
    let source = deps.source.clone();
    let head = head.to_owned();
    let checked = tokio::task::spawn_blocking(move || source.verify(&head, base.as_deref())).await;
    let text = match checked {
        Ok(Ok(verified)) => {
            if let Some(verified) = verified {
                tracing::debug!(commits = verified.commits.len(), "signatures verified");
            }
            return None;
        }
        Ok(Err(refusal)) => refusal.to_string(),
        Err(join) => format!("unverified: the verification task failed: {join}"),
    };
    tracing::warn!(reason = %text, "revision not applied: [source] verify refused it");
    Some(text)
}

/// Runs the one pipeline on `revision`: validate, observe and plan, gate and execute, with
/// the agent's hooks recording the findings against `revision`; corrected drift is resolved
/// as corrected by `pass`.
async fn enforce(
    deps: &PassDeps,
    pass: PassId,
    revision: &Revision,
    cancel: &CancellationToken,
) -> (Result<reconcile::Pass, ReconcileError>, Option<GateSummary>) {
    // How the owned guests were created, for requires-recreate findings (PVE keeps no
    // clone source, CT template or imported image); unreadable → nothing compared.
    let mut options = deps.plan_options.clone();
    options.created =
        with_store(&deps.store, |s| log_store_error(s.creations(None))).unwrap_or_default();
    // PVE's HA maintenance (issue 19, item 6): read before the pass, so the hooks hold the
    // writes to a node in maintenance.
    let ha = crate::agent::ha::observe(&deps.context.pve).await;
    deps.live.set_ha_held(crate::agent::ha::HaStatus::held(
        &ha.held_nodes(&deps.context.scope),
    ));
    let rollout_held = match &deps.rollout {
        Some(rollout) => {
            rollout
                .hold(
                    &deps.store,
                    &deps.context.pve,
                    &ha,
                    &revision.commit,
                    cancel,
                )
                .await
        }
        None => None,
    };
    let mut hooks = AgentHooks {
        deps,
        pass,
        commit: &revision.commit,
        gated: None,
        ha,
        rollout_held,
    };
    let progress = recording_progress(deps, pass, cancel.clone());
    let context =
        crate::execute::snapshot_context(&deps.context, &deps.store, &revision.commit, pass);
    let result = reconcile::reconcile_once(
        &context,
        &revision.files,
        deps.cluster.as_deref(),
        Mode::Apply,
        &options,
        &mut hooks,
        &progress,
        cancel,
    )
    .await;
    if let Ok(done) = &result
        && let Some(report) = &done.report
    {
        record_corrected(deps, pass, report);
        // What the executor found (no snapshot before a risky update), with the plan's.
        if !report.findings.is_empty() {
            let mut plan = done.plan.clone();
            plan.findings.extend(report.findings.iter().cloned());
            record_findings(deps, pass, &done.desired, &plan, &revision.commit);
        }
    }
    if let (Some(rollout), Ok(done)) = (&deps.rollout, &result) {
        let pve = &deps.context.pve;
        crate::agent::rollout::after_pass(rollout, pve, &revision.commit, done, cancel).await;
    }
    (result, hooks.gated)
}

/// The last valid revision other than `head`, to enforce while `head` is refused: the one
/// in memory, or (after a start or reload) the commit the store recorded as last enforced,
/// read again from the mirror.
async fn last_valid(deps: &PassDeps, head: &str) -> Option<Revision> {
    if let Some(valid) = lock(&deps.enforced).clone() {
        return (valid.commit != head).then_some(valid);
    }
    let recorded = with_store(&deps.store, |s| {
        log_store_error(s.last_enforced(&deps.node_label))
    })
    .flatten()?;
    let commit = recorded.enforced_commit()?.to_owned();
    if commit == head {
        return None;
    }
    let source = deps.source.clone();
    let read = tokio::task::spawn_blocking(move || source.revision_at(&commit)).await;
    match read {
        Ok(Ok(Some(revision))) => {
            *lock(&deps.enforced) = Some(revision.clone());
            Some(revision)
        }
        Ok(Ok(None)) => {
            tracing::warn!(
                commit = recorded.enforced_commit().unwrap_or_default(),
                "the last enforced revision is not in the git mirror; nothing is enforced"
            );
            None
        }
        Ok(Err(error)) => {
            tracing::warn!(error = %error_text(&error), "reading the last enforced revision from the git mirror failed");
            None
        }
        Err(join) => {
            tracing::warn!(error = %join, "reading the last enforced revision failed");
            None
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How a pass that planned ended: aborted before any write, interrupted, or ran (what
/// failed, in which classes, and what the breaker held back).
fn ran(
    deps: &PassDeps,
    commit: String,
    done: &reconcile::Pass,
    gated: Option<GateSummary>,
    cancel: &CancellationToken,
) -> Ended {
    let plan = &done.plan;
    let findings = plan.findings.len();
    if let Some(reason) = &plan.aborted {
        // Fail closed: without the guest listing nothing is written, and the findings of
        // this pass say nothing about drift (recording them would resolve every open one).
        let reason = format!("listing the cluster's guests failed: {reason}");
        tracing::warn!(%reason, "pass aborted before any write");
        let counts = ApplyReport::default().pass_counts(findings);
        return Ended::failed(PassEnd::ObserveAborted, Some(commit), counts, reason);
    }
    deps.publish_breaker();
    let report = done.report.as_ref();
    let outcome = match report {
        _ if cancel.is_cancelled() => PassOutcome::Interrupted,
        Some(r) if r.is_success() => PassOutcome::Applied,
        Some(_) => PassOutcome::Failed,
        None => PassOutcome::NoChange,
    };
    let counts = match report {
        Some(r) => r.pass_counts(findings),
        None if outcome == PassOutcome::Interrupted => PassCounts::default(),
        None => ApplyReport::default().pass_counts(findings),
    };
    let tripped = report.and_then(|r| r.held_back.as_ref());
    let held_reason = match tripped {
        Some(held) => Some(format!(
            "write circuit breaker opened during the pass: {} action(s) of later levels held \
             back",
            held.actions
        )),
        None => gated.as_ref().and_then(|g| g.reason.clone()),
    };
    let end = if outcome == PassOutcome::Interrupted {
        PassEnd::Interrupted
    } else {
        PassEnd::Ran {
            failures: report
                .map(|r| r.failure_classes().collect())
                .unwrap_or_default(),
            observe_failed: plan
                .findings
                .iter()
                .any(|f| f.kind == FindingKind::ObserveFailed),
            probe_closed: outcome == PassOutcome::Failed
                && gated.is_some_and(|g| g.probed && g.held > 0)
                && deps.writes_allowed(),
        }
    };
    let objects = status::objects(
        done.desired.cluster.as_deref(),
        placements(&done.desired, &deps.context.scope).into_iter(),
        plan,
        report,
    );
    Ended {
        end,
        outcome,
        commit: Some(commit),
        counts,
        note: held_reason.clone(),
        abort_reason: None,
        writes_held_back: held_reason,
        diagnostics: Vec::new(),
        objects,
        enforced: None,
        head_invalid: None,
    }
}

/// The one place a pass's end is written: the store's record, the live view, the log.
fn record(deps: &PassDeps, pass: PassId, started: SystemTime, ended: Ended) -> Verdict {
    with_store(&deps.store, |s| {
        if !ended.diagnostics.is_empty() {
            log_store_error(s.record_invalid(pass, &ended.diagnostics));
        }
        if let Some(note) = &ended.note {
            log_store_error(s.note_error(pass, note));
        }
        if let Some((commit, outcome)) = &ended.enforced {
            log_store_error(s.note_enforced(pass, commit, Some(*outcome)));
        }
        log_store_error(s.finish_pass(pass, ended.outcome, ended.counts, SystemTime::now()))
    });
    if let Some(forge) = &deps.forge {
        forge.pass_ended(
            &deps.store,
            &crate::forge::PassFacts {
                pass,
                commit: ended.commit.as_deref(),
                outcome: ended.outcome,
                counts: ended.counts,
                first_diagnostic: ended.diagnostics.first().map(|d| {
                    let at = format!("{}:{}:{}", d.path, d.line, d.column);
                    if d.field.is_empty() {
                        format!("{at}: {}", d.message)
                    } else {
                        format!("{at}: {}: {}", d.field, d.message)
                    }
                }),
                note: ended.note.as_deref(),
            },
        );
    }
    if let Some(invalid) = &ended.head_invalid {
        tracing::warn!(summary = %invalid.summary, "HEAD is not applied");
    }
    let mut last = last_pass(
        ended.commit,
        started,
        ended.outcome.as_str(),
        ended.objects,
        ended.abort_reason,
    );
    // Writes held back by the breaker are not an abort: the pass observed and recorded.
    last.writes_held_back = ended.writes_held_back;
    last.enforced_commit = ended.enforced.map(|(commit, _)| commit);
    last.head_invalid = ended.head_invalid;
    deps.live.finish(last);
    tracing::info!(outcome = ended.outcome.as_str(), "pass finished");
    Verdict::of(&ended.end)
}

/// What the breaker let a pass write.
#[derive(Debug, Clone)]
struct GateSummary {
    probed: bool,
    held: usize,
    reason: Option<String>,
}

/// What the agent adds to the pipeline: it records the findings of every plan that was
/// not aborted, asks the write circuit breaker before the first write and between levels,
/// and notes the breaker's state on the pass.
struct AgentHooks<'a> {
    deps: &'a PassDeps,
    pass: PassId,
    commit: &'a str,
    gated: Option<GateSummary>,
    /// PVE's HA status, read at the start of the pass.
    ha: crate::agent::ha::HaStatus,
    /// Why `[rollout]` holds this commit's writes, decided before the pass.
    rollout_held: Option<window::Held>,
}

impl Hooks for AgentHooks<'_> {
    fn planned(&mut self, desired: &DesiredState, plan: &Plan) {
        if plan.aborted.is_none() {
            let plan = crate::agent::ha::with_findings(plan, &self.ha, &self.deps.context.scope);
            record_findings(self.deps, self.pass, desired, &plan, self.commit);
            if !plan.has_changes() {
                // Nothing to hold: a held change (approved, or not) is cleared.
                approval::nothing_held(&self.deps.store, &self.deps.node_label, self.pass);
            }
        }
    }

    fn approve(&mut self, plan: &Plan) -> Approval {
        // The freeze and the write windows first: while they hold writes, nothing is sent
        // (the breaker is not asked, so no probe is spent); the pass observed and recorded
        // its findings already, and every action is recorded skipped with the reason.
        if let Err(held) = self.writes_held() {
            let reason = held.sentence();
            tracing::info!(%reason, "writes held");
            self.gated = Some(GateSummary {
                probed: false,
                held: plan.actions().count(),
                reason: Some(reason.clone()),
            });
            return Approval::Part {
                run: Plan {
                    levels: Vec::new(),
                    ..plan.clone()
                },
                held: plan.actions().cloned().collect(),
                reason,
            };
        }
        // Nodes in PVE's HA maintenance: their actions are held, the others' go on.
        if let Some(approval) = self.ha_hold(plan) {
            return approval;
        }
        // `[policy] approve`: what waits for an operator is taken out first; the breaker
        // decides on the rest.
        let approvals = approval::split(
            &self.deps.store,
            &self.deps.node_label,
            self.pass,
            plan,
            &self.deps.approve,
        );
        approval::combine(&approvals, self.ask_breaker(&approvals.run))
    }

    fn before_level(&mut self, index: usize) -> LevelGate {
        // A freeze set, or a window closed, while the pass runs holds the later levels.
        if index > 0
            && let Err(held) = self.writes_held()
        {
            return LevelGate::HoldBack(held.sentence());
        }
        gate::between_levels(&self.deps.breaker, index)
    }
}

impl AgentHooks<'_> {
    /// PVE's HA maintenance: `None` when no action is on a node in maintenance; else the
    /// approval of the other actions (asked of this hook again, so the breaker decides on
    /// them) with the maintenance nodes' actions held.
    fn ha_hold(&mut self, plan: &Plan) -> Option<Approval> {
        let hold = crate::agent::ha::Hold::of(plan, &self.ha, &self.deps.context.scope)?;
        tracing::info!(reason = %hold.reason, "writes held");
        let others = hold.has_others().then(|| Hooks::approve(self, &hold.rest));
        let held = hold.held.len();
        let summary = self.gated.get_or_insert(GateSummary {
            probed: false,
            held: 0,
            reason: None,
        });
        summary.held += held;
        summary.reason = Some(match summary.reason.take() {
            Some(why) => format!("{}; {why}", hold.reason),
            None => hold.reason.clone(),
        });
        Some(hold.merge(others))
    }

    /// What the write circuit breaker lets run of `plan`.
    fn ask_breaker(&mut self, plan: &Plan) -> Approval {
        let permit = gate::permit(&self.deps.breaker);
        with_store(&self.deps.store, |s| {
            log_store_error(s.note_write_breaker(self.pass, permit.mark))
        });
        if let Permit::All = permit.permit {
            self.gated = Some(GateSummary {
                probed: false,
                held: 0,
                reason: None,
            });
            return Approval::All;
        }
        let gated = gate::split(plan, permit);
        self.gated = Some(GateSummary {
            probed: gated.probed,
            held: gated.held.len(),
            reason: gated.reason,
        });
        Approval::Part {
            run: gated.run,
            held: gated.held,
            reason: gate::HELD_BACK.to_owned(),
        }
    }

    /// Whether the freeze recorded in the store and `[[policy.window]]` allow a write now.
    /// An unreadable freeze holds writes (fail closed: the operator may have frozen).
    fn writes_held(&self) -> Result<(), window::Held> {
        let freeze = with_store(&self.deps.store, |s| s.freeze());
        let freeze = match freeze {
            Ok(freeze) => freeze,
            Err(error) => {
                let text = error_text(&error);
                tracing::warn!(error = %text, "reading the freeze failed; writes are held");
                return Err(window::Held {
                    reason: format!(
                        "the freeze could not be read from the state database ({text})"
                    ),
                    next_allowed: None,
                });
            }
        };
        window::write_allowed(
            chrono::Utc::now(),
            &self.deps.live.windows(),
            freeze.as_ref(),
        )?;
        self.rollout_held.clone().map_or(Ok(()), Err)
    }
}

/// Records findings for every node the pass covers, so findings that went away resolve:
/// the plan's findings and its drift (each changed field of an update, [`drift_of`]),
/// against `commit`, the revision enforced.
fn record_findings(
    deps: &PassDeps,
    pass: PassId,
    desired: &DesiredState,
    plan: &Plan,
    commit: &str,
) {
    let mut nodes: BTreeSet<String> = match &deps.context.scope {
        NodeScope::Node(node) => [node.clone()].into(),
        NodeScope::All => placements(desired, &NodeScope::All)
            .into_iter()
            .flat_map(|(_, n, _)| n)
            .collect(),
    };
    let mut all = plan.findings.clone();
    all.extend(drift_of(plan));
    nodes.extend(all.iter().map(|f| f.node.clone()));
    let declared: BTreeSet<&ResourceId> = desired.manifest.resources().map(|r| &r.id).collect();
    let now = SystemTime::now();
    with_store(&deps.store, |s| {
        if let NodeScope::All = deps.context.scope {
            // Nodes that had open findings but no longer appear still get resolved.
            if let Some(open) = log_store_error(s.open_findings(None)) {
                nodes.extend(open.into_iter().map(|r| r.node));
            }
        }
        for node in &nodes {
            let findings: Vec<_> = all.iter().filter(|f| &f.node == node).cloned().collect();
            let how = |record: &DriftRecord| resolution(record, &declared, commit);
            log_store_error(s.record_pass_findings(pass, node, Some(commit), now, &findings, how));
        }
    });
}

/// How an open finding that a pass no longer reports was resolved: its resource is no
/// longer declared (gone); a finding other than drift simply is not reported any more;
/// drift last seen against another revision was resolved by the manifest changing; drift
/// under the same revision, with no write of ours in between, was fixed in PVE by someone
/// else (a correction by this agent is resolved by the pass that wrote it,
/// [`record_corrected`], before any later pass looks).
fn resolution(record: &DriftRecord, declared: &BTreeSet<&ResourceId>, commit: &str) -> Resolution {
    if !declared.contains(&record.resource) {
        Resolution::Gone
    } else if record.kind != FindingKind::Drift.name() {
        Resolution::Corrected
    } else if record.last_seen_commit.as_deref() != Some(commit) {
        Resolution::ManifestChanged
    } else {
        Resolution::FixedInPve
    }
}

/// The drift a plan would correct, as findings: one `drift` finding per changed field of
/// each update (what PVE has, what the revision wants), so drift has a history whether it
/// is corrected at once (apply mode) or only reported (report mode, a declined write).
pub(crate) fn drift_of(plan: &Plan) -> Vec<Finding> {
    plan.actions()
        .filter_map(|action| match &action.verb {
            Verb::Update(update) => Some((action, update)),
            _ => None,
        })
        .flat_map(|(action, update)| {
            update.changes.iter().map(move |change| Finding {
                resource: action.resource.clone(),
                node: action.node.clone(),
                kind: FindingKind::Drift,
                field: change.field.clone(),
                desired: change.desired.clone(),
                observed: change.observed.clone(),
                message: format!(
                    "{} is {} in PVE, {} in the revision",
                    change.field,
                    or_absent(&change.observed),
                    or_absent(&change.desired)
                ),
            })
        })
        .collect()
}

fn or_absent(value: &str) -> &str {
    if value.is_empty() { "absent" } else { value }
}

/// Resolves the drift each succeeded update of `report` wrote as corrected by `pass`.
fn record_corrected(deps: &PassDeps, pass: PassId, report: &ApplyReport) {
    let now = SystemTime::now();
    with_store(&deps.store, |s| {
        for result in &report.results {
            let (Outcome::Succeeded { .. }, Verb::Update(update)) =
                (&result.outcome, &result.action.verb)
            else {
                continue;
            };
            let fields = update.changes.iter().map(|c| c.field.as_str());
            log_store_error(s.resolve_corrected(
                pass,
                &result.action.node,
                &result.action.resource,
                fields,
                now,
            ));
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
                        log_store_error(s.record_task_started(*id, upid.as_str(), now))
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
                    crate::execute::record_backup(&store, id, result);
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
        enforced_commit: None,
        head_invalid: None,
    }
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}
