//! The agent's HTTP surface on `[http] listen`: health, readiness, metrics, the Go program's
//! `/status`, the `/api/v1/*` JSON API, the web UI ([`ui`]), and (sharing the port unless
//! `[webhook] listen` gives them their own) the webhook routes. Read-only: nothing here writes
//! to PVE or git, and nothing reveals a secret (the types it serialises carry none).
//!
//! Who may read it (SECURITY-AUDIT.md L1), in [`access`]: the `Host` header must name one of
//! `[http] allowed_hosts` (DNS rebinding), a bearer token is required when `[http]
//! token_file` is set (not for `/healthz`, `/readyz` or the HMAC-checked webhook routes), and
//! absolute paths of the node (state directory, config directory) are cut out of every
//! answer. How connections are bounded is [`serve`].

pub mod access;
pub mod serve;
pub mod ui;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use proxops_pve::PveClient;
use proxops_store::{
    ActionOutcome, ActionRecord, DriftRecord, PassId, PassOutcome, PassSummary, SharedStore,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::agent::status::{BreakerView, DiagnosticView, InvalidHead, LiveStatus};
use crate::metrics::{Metrics, Scraped};
use crate::timefmt::rfc3339;
use crate::webhook::{WebhookMetrics, WebhookState};

/// What the handlers read.
#[derive(Clone)]
pub struct HttpState {
    /// Live view of the loop.
    pub live: Arc<LiveStatus>,
    /// The state database.
    pub store: SharedStore,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// The PVE client (for its request counters, and `/cluster/status` for the cluster view).
    pub pve: PveClient,
    /// Webhook counters, when webhooks are on.
    pub webhook_metrics: Option<Arc<WebhookMetrics>>,
    /// The node passes are recorded under.
    pub node_label: String,
    /// What the web UI's plan preview needs (the configuration in force).
    pub preview: Arc<std::sync::Mutex<Option<crate::agent::PreviewInputs>>>,
    /// `[http] commit_url`: how the web UI links a commit.
    pub commit_url: Option<String>,
    /// `[pmxcfs]` in force and how publishing goes: the cluster view.
    pub publisher: Arc<crate::cluster::publish::Publisher>,
}

/// The whole router of `[http] listen`: the status API behind `access`, plus the webhook
/// routes when they share this listener.
pub fn router(state: HttpState, webhook: Option<WebhookState>, access: access::Access) -> Router {
    let api = access::guard(api_router(state), access);
    match webhook {
        Some(webhook) => api.merge(crate::webhook::router(webhook)),
        None => api,
    }
}

/// The status API routes alone, unguarded.
fn api_router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/status", get(go_status))
        .route("/api/v1/status", get(api_status))
        .route("/api/v1/revisions", get(api_revisions))
        .route("/api/v1/revisions/{id}", get(api_revision))
        .route("/api/v1/passes/{id}", get(api_pass))
        .route("/api/v1/drift", get(api_drift))
        .route("/api/v1/cluster", get(api_cluster))
        .with_state(state.clone())
        .merge(ui::router(state))
}

/// A pass as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PassJson {
    /// Store id.
    pub id: i64,
    /// Node (or `*`).
    pub node: String,
    /// Commit.
    pub commit: Option<String>,
    /// What started it.
    pub trigger: String,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339, when finished.
    pub ended_at: Option<String>,
    /// Outcome, when finished.
    pub outcome: Option<String>,
    /// Actions that succeeded.
    pub actions_ok: u32,
    /// Actions that failed.
    pub actions_failed: u32,
    /// Actions skipped.
    pub actions_skipped: u32,
    /// Findings.
    pub findings: u32,
    /// The commit the branch pointed to before this pass's fetch.
    #[serde(default)]
    pub previous_commit: Option<String>,
    /// The branch was force-pushed: `commit` does not descend from `previous_commit`.
    #[serde(default)]
    pub force_pushed: bool,
    /// Git could not be fetched; the pass used the last good revision.
    #[serde(default)]
    pub desired_stale: bool,
    /// Why git could not be fetched.
    #[serde(default)]
    pub source_error: Option<String>,
    /// Why the pass failed or held writes back.
    #[serde(default)]
    pub error: Option<String>,
    /// The write circuit breaker when the pass was about to write.
    #[serde(default)]
    pub write_breaker: Option<String>,
    /// The commit whose desired state the pass observed and enforced: `commit` when it
    /// validated, the last valid revision while `commit` was invalid, `None` when nothing
    /// was enforced.
    #[serde(default)]
    pub enforced_commit: Option<String>,
    /// How enforcing `enforced_commit` ended (`applied`, `no-change`, `failed`,
    /// `interrupted`); the pass's `outcome` stays `invalid` when `commit` was.
    #[serde(default)]
    pub enforced_outcome: Option<String>,
    /// The diagnostics that made `commit` invalid.
    #[serde(default)]
    pub diagnostics: Vec<DiagnosticView>,
}

impl From<&PassSummary> for PassJson {
    fn from(p: &PassSummary) -> Self {
        Self {
            id: p.id.0,
            node: p.node.clone(),
            commit: p.commit.clone(),
            trigger: p.trigger.as_str().to_owned(),
            started_at: rfc3339(p.started_at),
            ended_at: p.ended_at.map(rfc3339),
            outcome: p.outcome.map(|o| o.as_str().to_owned()),
            actions_ok: p.counts.actions_ok,
            actions_failed: p.counts.actions_failed,
            actions_skipped: p.counts.actions_skipped,
            findings: p.counts.findings,
            previous_commit: p.notes.previous_commit.clone(),
            force_pushed: p.notes.force_pushed,
            desired_stale: p.notes.desired_stale,
            source_error: p.notes.source_error.clone(),
            error: p.notes.error.clone(),
            write_breaker: p.notes.write_breaker.map(|b| b.as_str().to_owned()),
            enforced_commit: p.enforced_commit().map(str::to_owned),
            enforced_outcome: p
                .enforced
                .as_ref()
                .and_then(|e| e.outcome)
                .or(p.outcome.filter(|_| p.enforced_commit().is_some()))
                .map(|o| o.as_str().to_owned()),
            diagnostics: p.diagnostics.iter().map(DiagnosticView::from).collect(),
        }
    }
}

/// An action of a pass as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ActionJson {
    /// Store id.
    pub id: i64,
    /// The pass it belongs to.
    pub pass_id: i64,
    /// `Kind/name`.
    pub resource: String,
    /// Node it ran on.
    pub node: String,
    /// `create`, `update`, …
    pub verb: String,
    /// Why, as the plan said.
    pub reason: String,
    /// The PVE task, when one was started.
    pub upid: Option<String>,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339, when it ended.
    pub ended_at: Option<String>,
    /// Milliseconds from start to end, when it ended.
    pub duration_ms: Option<u64>,
    /// `succeeded`, `failed`, `skipped`; `None` while it runs.
    pub result: Option<String>,
    /// PVE's exit status, when it succeeded.
    pub exitstatus: Option<String>,
    /// The error (failed) or the reason (skipped).
    pub error: Option<String>,
    /// `safe`, `risky` or `destructive`; `None` for actions recorded before risk levels.
    #[serde(default)]
    pub risk: Option<String>,
    /// The volume id of the backup taken before it (`[policy] backup_before_delete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
}

impl From<&ActionRecord> for ActionJson {
    fn from(a: &ActionRecord) -> Self {
        let (exitstatus, error) = match &a.outcome {
            Some(ActionOutcome::Succeeded { exitstatus }) => (Some(exitstatus.clone()), None),
            Some(ActionOutcome::Failed { error }) => (None, Some(error.clone())),
            Some(ActionOutcome::Skipped { reason }) => (None, Some(reason.clone())),
            None => (None, None),
        };
        Self {
            id: a.id.0,
            pass_id: a.pass_id.0,
            resource: a.resource.to_string(),
            node: a.node.clone(),
            verb: a.verb.clone(),
            reason: a.reason.clone(),
            upid: a.upid.clone(),
            started_at: rfc3339(a.started_at),
            ended_at: a.ended_at.map(rfc3339),
            duration_ms: a.ended_at.and_then(|end| {
                end.duration_since(a.started_at)
                    .ok()
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            }),
            result: a.outcome.as_ref().map(|o| o.as_str().to_owned()),
            exitstatus,
            error,
            risk: a.risk.map(|r| r.name().to_owned()),
            backup: a.backup_volid.clone(),
        }
    }
}

/// `/api/v1/passes/{id}`: one pass with what it did and found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PassDetailJson {
    /// The pass (with its diagnostics when its commit was invalid).
    pub pass: PassJson,
    /// Set when the pass's commit was refused: the sentence and what was enforced.
    pub head_invalid: Option<InvalidHead>,
    /// Its actions, in the order they started.
    pub actions: Vec<ActionJson>,
    /// The findings it opened, saw last or resolved.
    pub findings: Vec<DriftJson>,
    /// The change it held for approval (`[policy] approve`), and where that stands.
    #[serde(default)]
    pub approval: Option<crate::agent::approval::ApprovalJson>,
}

/// `/api/v1/revisions/{id}`: one commit (full sha or unique prefix) and its latest pass.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RevisionJson {
    /// The full commit.
    pub commit: String,
    /// Whether the commit validated (`false` when its latest fetch found it invalid).
    pub valid: bool,
    /// Its diagnostics, when it was invalid.
    pub diagnostics: Vec<DiagnosticView>,
    /// The latest pass that fetched or enforced it, in detail.
    pub latest: PassDetailJson,
    /// The latest passes (at most 20) that fetched or enforced it, newest first.
    pub passes: Vec<PassJson>,
}

/// A drift finding as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DriftJson {
    /// Node.
    pub node: String,
    /// `Kind/name`.
    pub resource: String,
    /// Finding kind.
    pub kind: String,
    /// Field.
    pub field: String,
    /// Declared value.
    pub desired: String,
    /// Observed value.
    pub observed: String,
    /// Explanation.
    pub message: String,
    /// First seen (commit, time).
    pub first_seen_commit: Option<String>,
    /// RFC 3339.
    pub first_seen_at: String,
    /// RFC 3339.
    pub last_seen_at: String,
    /// RFC 3339, when resolved.
    pub resolved_at: Option<String>,
    /// How it was resolved, for people: `corrected by pass 12`, `manifest changed`,
    /// `fixed in PVE`, `gone`, `no longer reported`.
    pub resolved_how: Option<String>,
    /// The same as one word: `corrected-by-pass`, `manifest-changed`, `fixed-in-pve`,
    /// `gone`, `corrected` (who corrected it is not known).
    #[serde(default)]
    pub resolution: Option<String>,
    /// Last seen commit.
    #[serde(default)]
    pub last_seen_commit: Option<String>,
    /// The pass that first reported it.
    #[serde(default)]
    pub first_seen_pass: Option<i64>,
    /// The pass that last reported it.
    #[serde(default)]
    pub last_seen_pass: Option<i64>,
    /// The pass that resolved it (corrected it, or no longer found it).
    #[serde(default)]
    pub resolved_pass: Option<i64>,
}

impl From<&DriftRecord> for DriftJson {
    fn from(d: &DriftRecord) -> Self {
        Self {
            node: d.node.clone(),
            resource: d.resource.to_string(),
            kind: d.kind.clone(),
            field: d.field.clone(),
            desired: d.desired.clone(),
            observed: d.observed.clone(),
            message: d.message.clone(),
            first_seen_commit: d.first_seen_commit.clone(),
            first_seen_at: rfc3339(d.first_seen_at),
            last_seen_at: rfc3339(d.last_seen_at),
            resolved_at: d.resolved_at.map(rfc3339),
            resolved_how: d.resolved_how.map(|h| h.to_string()),
            resolution: d.resolved_how.map(|h| h.word().to_owned()),
            last_seen_commit: d.last_seen_commit.clone(),
            first_seen_pass: d.first_seen_pass.map(|p| p.0),
            last_seen_pass: d.last_seen_pass.map(|p| p.0),
            resolved_pass: d.resolved_pass.map(|p| p.0),
        }
    }
}

/// `/api/v1/status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusJson {
    /// Node (or `*`).
    pub node: String,
    /// RFC 3339.
    pub process_start: Option<String>,
    /// Git could not be fetched; the last good revision is in force.
    pub desired_stale: bool,
    /// The last git error.
    pub last_error: Option<String>,
    /// The last pass whose revision was applied (or found in sync).
    pub last_applied: Option<PassJson>,
    /// The last pass attempted.
    pub last_attempted: Option<PassJson>,
    /// Open drift findings.
    pub open_findings: usize,
    /// The write circuit breaker holds writes back (open or half-open).
    #[serde(default)]
    pub read_only: bool,
    /// The write circuit breaker (live; from the last pass when read from the database).
    #[serde(default)]
    pub write_breaker: Option<BreakerView>,
    /// The last pass that found the branch force-pushed.
    #[serde(default)]
    pub last_force_push: Option<PassJson>,
    /// The commit whose desired state is in force: HEAD when it is valid, the last valid
    /// revision while HEAD is invalid.
    #[serde(default)]
    pub enforced_commit: Option<String>,
    /// Set while HEAD is refused: its diagnostics, the revision enforced instead, and the
    /// sentence every view shows.
    #[serde(default)]
    pub head_invalid: Option<InvalidHead>,
    /// Whether writes are allowed now: the freeze (`proxops freeze`) and `[[policy.window]]`,
    /// and when the next write is allowed.
    #[serde(default)]
    pub writes: crate::agent::window::WritesView,
    /// `[pmxcfs]`: how publishing this node's status file goes (`None`: cluster mode off,
    /// or read from the database without an agent).
    #[serde(default)]
    pub pmxcfs: Option<crate::cluster::publish::PublishState>,
    /// `[policy] approve`: what waits for `proxops approve`, and the latest held changes.
    #[serde(default)]
    pub approval: crate::agent::approval::ApprovalView,
    /// `[rollout]`: this node's wave and whether the rollout holds its writes (live agent
    /// only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::agent::rollout::RolloutView>,
}

/// `/api/v1/drift`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DriftListJson {
    /// Open findings.
    pub open: Vec<DriftJson>,
    /// Recently resolved findings.
    pub resolved: Vec<DriftJson>,
}

async fn read_store<T: Send + 'static>(
    store: &SharedStore,
    f: impl FnOnce(&proxops_store::Store) -> Result<T, proxops_store::StoreError> + Send + 'static,
) -> Result<T, Response> {
    let store = store.clone();
    let joined = tokio::task::spawn_blocking(move || {
        let guard = store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&guard)
    })
    .await;
    match joined {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => {
            tracing::error!(error = %crate::error_chain::error_text(&error), "reading the state database");
            Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                "state database unavailable",
            )
                .into_response())
        }
        Err(_) => Err((StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()),
    }
}

/// Status from the store (shared with `proxops status` when no agent answers), judging
/// writes by the freeze alone ([`status_from_store_with`] adds the windows).
pub fn status_from_store(
    store: &proxops_store::Store,
    node: &str,
) -> Result<StatusJson, proxops_store::StoreError> {
    status_from_store_with(store, node, &[])
}

/// Status from the store, with whether `windows` and the recorded freeze allow a write now.
pub fn status_from_store_with(
    store: &proxops_store::Store,
    node: &str,
    windows: &[crate::agent::window::Window],
) -> Result<StatusJson, proxops_store::StoreError> {
    let writes =
        crate::agent::window::writes_view(chrono::Utc::now(), windows, store.freeze()?.as_ref());
    let last_attempted = store.last_attempted(node)?;
    // Without a running agent, the last pass's notes are the best account of staleness and
    // of the breaker (its cool-down is not persisted: a restarted agent starts closed).
    let notes = last_attempted.as_ref().map(|p| p.notes.clone());
    let breaker = notes
        .as_ref()
        .and_then(|n| n.write_breaker)
        .map(|mark| BreakerView {
            state: mark.as_str().to_owned(),
            read_only: mark != proxops_store::BreakerMark::Closed,
            consecutive_failures: 0,
            open_until: None,
        });
    let last_applied = store.last_applied(node)?;
    let enforced = store.last_enforced(node)?;
    let enforced_commit = enforced
        .as_ref()
        .and_then(|p| p.enforced_commit())
        .map(str::to_owned);
    let head_invalid = last_attempted
        .as_ref()
        .and_then(|p| head_invalid(p, last_applied.as_ref(), enforced.as_ref()));
    Ok(StatusJson {
        node: node.to_owned(),
        process_start: None,
        desired_stale: notes.as_ref().is_some_and(|n| n.desired_stale),
        last_error: notes.and_then(|n| n.source_error),
        last_applied: last_applied.as_ref().map(PassJson::from),
        last_attempted: last_attempted.as_ref().map(PassJson::from),
        open_findings: store.open_findings(None)?.len(),
        read_only: breaker.as_ref().is_some_and(|b| b.read_only),
        write_breaker: breaker,
        last_force_push: store.last_force_pushed(node)?.as_ref().map(PassJson::from),
        enforced_commit,
        head_invalid,
        writes,
        pmxcfs: None,
        approval: crate::agent::approval::ApprovalView::of(store, node)?,
        rollout: None,
    })
}

/// Status from the store as `proxops status` shows it when no agent answers:
/// [`status_from_store_with`] plus the hold of PVE's HA maintenance as the store last saw it
/// ([`ha_hold_from_store`]). A running agent's views take that hold from the live pass
/// instead (`LiveStatus::ha_held`), so they do not call this.
pub fn status_offline(
    store: &proxops_store::Store,
    node: &str,
    windows: &[crate::agent::window::Window],
) -> Result<StatusJson, proxops_store::StoreError> {
    let mut status = status_from_store_with(store, node, windows)?;
    status.writes =
        crate::agent::window::with_hold(status.writes, ha_hold_from_store(store, node)?.as_ref());
    Ok(status)
}

/// The hold of PVE's HA maintenance derived from the open `ha-maintenance` findings of
/// `node` (every node for `*`): a pass that holds actions for a node in maintenance records
/// one per held resource (`agent::ha::findings`), and the first pass that no longer finds
/// the node in maintenance resolves them. The reason names the nodes, how writes resume and
/// the pass that first reported the hold. `None` without such a finding.
///
/// # Errors
/// When the findings cannot be read.
pub fn ha_hold_from_store(
    store: &proxops_store::Store,
    node: &str,
) -> Result<Option<crate::agent::window::Held>, proxops_store::StoreError> {
    let kind = proxops_core::plan::FindingKind::HaMaintenance.name();
    let open = store.open_findings(Some(node))?;
    let held: Vec<&DriftRecord> = open.iter().filter(|f| f.kind == kind).collect();
    let nodes: std::collections::BTreeSet<String> = held.iter().map(|f| f.node.clone()).collect();
    let Some(mut hold) = crate::agent::ha::HaStatus::held(&nodes) else {
        return Ok(None);
    };
    if let Some(since) = held.iter().filter_map(|f| f.first_seen_pass).min() {
        hold.reason = format!("{} (reported since pass {})", hold.reason, since.0);
    }
    Ok(Some(hold))
}

/// The invalid-HEAD state a pass recorded: `pass`'s commit was refused (outcome `invalid`),
/// and the revision it enforced (or, when it enforced none, the last one enforced before:
/// `enforced`) stayed in force. `None` when `pass` was not refused.
fn head_invalid(
    pass: &PassSummary,
    last_applied: Option<&PassSummary>,
    enforced: Option<&PassSummary>,
) -> Option<InvalidHead> {
    if !matches!(
        pass.outcome,
        Some(PassOutcome::Invalid | PassOutcome::Unverified)
    ) {
        return None;
    }
    let commit = pass.commit.as_deref()?;
    let in_force = pass
        .enforced
        .as_ref()
        .map(|e| e.commit.as_str())
        .or_else(|| enforced.and_then(PassSummary::enforced_commit));
    let applied = last_applied.and_then(|p| p.commit.as_deref());
    let reason = pass
        .notes
        .error
        .as_deref()
        .unwrap_or("the revision is invalid");
    Some(InvalidHead::new(
        commit,
        reason,
        &pass.diagnostics,
        in_force.map(|c| (c, applied == Some(c))),
    ))
}

/// One pass in detail, from the store.
///
/// # Errors
/// When the store cannot be read.
pub fn pass_detail(
    store: &proxops_store::Store,
    pass: &PassSummary,
) -> Result<PassDetailJson, proxops_store::StoreError> {
    let last_applied = store.last_applied(&pass.node)?;
    Ok(PassDetailJson {
        pass: PassJson::from(pass),
        head_invalid: head_invalid(pass, last_applied.as_ref(), None),
        actions: store
            .actions_of(pass.id)?
            .iter()
            .map(ActionJson::from)
            .collect(),
        findings: store
            .findings_of_pass(pass.id)?
            .iter()
            .map(DriftJson::from)
            .collect(),
        approval: store
            .approval_of_pass(pass.id)?
            .as_ref()
            .map(crate::agent::approval::ApprovalJson::from),
    })
}

/// What looking a revision up by commit found.
#[derive(Debug)]
pub enum RevisionLookup {
    /// The commit and its latest passes.
    Found(Box<RevisionJson>),
    /// No recorded pass fetched or enforced a commit with that prefix.
    NotFound,
    /// Several commits start with the prefix.
    Ambiguous(Vec<String>),
}

/// Looks a revision up by full commit or unique prefix, among `node`'s passes.
///
/// # Errors
/// When the store cannot be read.
pub fn revision_from_store(
    store: &proxops_store::Store,
    node: &str,
    id: &str,
) -> Result<RevisionLookup, proxops_store::StoreError> {
    let commits = store.commits_with_prefix(Some(node), id)?;
    let commit = match commits.as_slice() {
        [] => return Ok(RevisionLookup::NotFound),
        [one] => one.clone(),
        _ => match commits.iter().find(|c| c.eq_ignore_ascii_case(id)) {
            Some(exact) => exact.clone(),
            None => return Ok(RevisionLookup::Ambiguous(commits)),
        },
    };
    let passes = store.passes_of_commit(Some(node), &commit, 20)?;
    let Some(latest) = passes.first() else {
        return Ok(RevisionLookup::NotFound);
    };
    // Its own diagnostics: from the latest pass that fetched it (not one that enforced it).
    let fetched = passes
        .iter()
        .find(|p| p.commit.as_deref() == Some(commit.as_str()));
    let invalid = fetched.filter(|p| {
        matches!(
            p.outcome,
            Some(PassOutcome::Invalid | PassOutcome::Unverified)
        )
    });
    Ok(RevisionLookup::Found(Box::new(RevisionJson {
        valid: invalid.is_none(),
        diagnostics: invalid
            .map(|p| p.diagnostics.iter().map(DiagnosticView::from).collect())
            .unwrap_or_default(),
        latest: pass_detail(store, latest)?,
        passes: passes.iter().map(PassJson::from).collect(),
        commit,
    })))
}

/// Drift from the store (shared with `proxops drift` when no agent answers).
pub fn drift_from_store(
    store: &proxops_store::Store,
) -> Result<DriftListJson, proxops_store::StoreError> {
    Ok(DriftListJson {
        open: store
            .open_findings(None)?
            .iter()
            .map(DriftJson::from)
            .collect(),
        resolved: store
            .recent_resolved(None, 50)?
            .iter()
            .map(DriftJson::from)
            .collect(),
    })
}

async fn healthz(State(state): State<HttpState>) -> Json<serde_json::Value> {
    Json(json!({ "ok": true, "since": rfc3339(state.live.process_start) }))
}

async fn readyz(State(state): State<HttpState>) -> Response {
    if state.live.is_ready() {
        Json(json!({ "ok": true })).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "ok": false, "reason": "not_ready" })),
        )
            .into_response()
    }
}

async fn metrics_text(State(state): State<HttpState>) -> Response {
    let node = state.node_label.clone();
    let read = read_store(&state.store, move |s| {
        let last = s.last_applied(&node)?;
        Ok((last, s.open_findings(None)?.len()))
    })
    .await;
    let (last, open) = match read {
        Ok(values) => values,
        Err(response) => return response,
    };
    let webhooks = state.webhook_metrics.as_ref().map(|m| m.snapshot());
    let breaker = state.live.breaker();
    let scraped = Scraped {
        last_applied: last
            .and_then(|p| p.ended_at)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| {
                vec![(
                    state.node_label.clone(),
                    i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                )]
            })
            .unwrap_or_default(),
        drift_open: i64::try_from(open).unwrap_or(i64::MAX),
        desired_stale: state.live.desired_stale(),
        read_only: breaker.read_only,
        write_failures: i64::from(breaker.consecutive_failures),
        pve_requests: state.pve.requests_sent(),
        pve_writes: state.pve.writes_sent(),
        webhooks: [
            ("accepted", webhooks.as_ref().map_or(0, |w| w.accepted)),
            ("rejected", webhooks.as_ref().map_or(0, |w| w.rejected)),
            ("ignored", webhooks.as_ref().map_or(0, |w| w.ignored)),
            ("coalesced", webhooks.as_ref().map_or(0, |w| w.coalesced)),
        ],
    };
    state.metrics.set_scraped(&scraped);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// The Go ProxOps `/status` shape: `{process_start, last_cycle, objects}`.
async fn go_status(State(state): State<HttpState>) -> Json<serde_json::Value> {
    let last = state.live.last();
    let objects = last.as_ref().map(|l| l.objects.clone()).unwrap_or_default();
    let count = |s: &str| objects.iter().filter(|o| o.state == s).count();
    let last_cycle = last.as_ref().map(|l| {
        json!({
            "commit": l.commit,
            "started_at": l.started_at,
            "finished_at": l.finished_at,
            "objects": objects.len(),
            "actions_ok": count("converged"),
            "actions_error": count("failed"),
            "pruned": 0,
            "prune_deferred": 0,
            "skipped": count("skipped"),
            "anomalies": count("anomalous"),
            "desired_stale": state.live.desired_stale(),
            "read_only": state.live.breaker().read_only,
            "write_breaker": state.live.breaker(),
            "aborted": l.abort_reason.is_some(),
            "abort_reason": l.abort_reason,
            "writes_held_back": l.writes_held_back,
            "outcome": l.outcome,
            "enforced_commit": l.enforced_commit,
            "head_invalid": l.head_invalid,
        })
    });
    // Whether writes are allowed now (freeze and windows): read per request, so a freeze
    // the CLI just wrote shows before the next pass.
    let windows = state.live.windows();
    let ha_held = state.live.ha_held();
    let writes = read_store(&state.store, move |s| {
        Ok(crate::agent::window::with_hold(
            crate::agent::window::writes_view(chrono::Utc::now(), &windows, s.freeze()?.as_ref()),
            ha_held.as_ref(),
        ))
    })
    .await
    .ok();
    Json(json!({
        "process_start": rfc3339(state.live.process_start),
        "last_cycle": last_cycle,
        "objects": objects,
        "writes": writes,
    }))
}

async fn api_status(State(state): State<HttpState>) -> Response {
    let node = state.node_label.clone();
    let windows = state.live.windows();
    match read_store(&state.store, move |s| {
        status_from_store_with(s, &node, &windows)
    })
    .await
    {
        Ok(mut status) => {
            status.writes =
                crate::agent::window::with_hold(status.writes, state.live.ha_held().as_ref());
            status.process_start = Some(rfc3339(state.live.process_start));
            status.desired_stale = state.live.desired_stale();
            status.last_error = state.live.last_error();
            let breaker = state.live.breaker();
            status.read_only = breaker.read_only;
            status.write_breaker = Some(breaker);
            status.pmxcfs = state.publisher.settings().map(|_| state.publisher.state());
            status.rollout = state.live.rollout();
            status.writes = status.writes.with_rollout(status.rollout.as_ref());
            Json(status).into_response()
        }
        Err(response) => response,
    }
}

/// The cluster view (`None`: no `[pmxcfs]`, cluster mode off), with PVE's member list.
pub async fn cluster_view(state: &HttpState) -> Option<crate::cluster::view::ClusterView> {
    let settings = state.publisher.settings()?;
    let publish = state.publisher.state();
    let refused = publish.error.filter(|_| publish.read_only);
    Some(crate::cluster::view::gather(&settings.pmxcfs, Some(&state.pve), refused).await)
}

/// `/api/v1/cluster`: the view, or `{"state": "off"}` without `[pmxcfs]`.
async fn api_cluster(State(state): State<HttpState>) -> Response {
    match cluster_view(&state).await {
        Some(view) => Json(view).into_response(),
        None => Json(json!({
            "state": "off",
            "reason": "no [pmxcfs] table in agent.toml: cluster mode is off",
            "nodes": [],
        }))
        .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct Limit {
    limit: Option<usize>,
}

async fn api_revisions(State(state): State<HttpState>, Query(q): Query<Limit>) -> Response {
    let limit = q.limit.unwrap_or(50).min(1000);
    let node = state.node_label.clone();
    match read_store(&state.store, move |s| s.recent_passes(Some(&node), limit)).await {
        Ok(passes) => Json(passes.iter().map(PassJson::from).collect::<Vec<_>>()).into_response(),
        Err(response) => response,
    }
}

async fn api_revision(State(state): State<HttpState>, Path(id): Path<String>) -> Response {
    let node = state.node_label.clone();
    let wanted = id.clone();
    match read_store(&state.store, move |s| revision_from_store(s, &node, &wanted)).await {
        Ok(RevisionLookup::Found(revision)) => Json(revision).into_response(),
        Ok(RevisionLookup::NotFound) => not_found(&format!(
            "no recorded pass fetched or enforced a commit starting with `{id}`; \
             GET /api/v1/revisions lists them"
        )),
        Ok(RevisionLookup::Ambiguous(commits)) => (
            StatusCode::CONFLICT,
            Json(json!({
                "error": format!("`{id}` is the start of {} commits; give more of it", commits.len()),
                "commits": commits,
            })),
        )
            .into_response(),
        Err(response) => response,
    }
}

async fn api_pass(State(state): State<HttpState>, Path(id): Path<String>) -> Response {
    let Ok(number) = id.parse::<i64>() else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": format!("`{id}` is not a pass id (a number, as in /api/v1/revisions)") })),
        )
            .into_response();
    };
    let node = state.node_label.clone();
    let read = read_store(&state.store, move |s| {
        let pass = s.pass(PassId(number))?.filter(|p| {
            node == proxops_store::ALL_NODES || p.node == node || p.node == proxops_store::ALL_NODES
        });
        pass.map(|p| pass_detail(s, &p)).transpose()
    })
    .await;
    match read {
        Ok(Some(detail)) => Json(detail).into_response(),
        Ok(None) => not_found(&format!("no pass {number} on this node")),
        Err(response) => response,
    }
}

fn not_found(message: &str) -> Response {
    (StatusCode::NOT_FOUND, Json(json!({ "error": message }))).into_response()
}

async fn api_drift(State(state): State<HttpState>) -> Response {
    match read_store(&state.store, drift_from_store).await {
        Ok(drift) => Json(drift).into_response(),
        Err(response) => response,
    }
}

/// Seconds since the Unix epoch, for the web UI.
fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use proxops_store::{BreakerMark, PassCounts, PassOutcome, Store, Trigger};

    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
    }

    #[test]
    fn status_from_the_database_reports_staleness_the_breaker_and_the_last_force_push() {
        let mut store = Store::memory().unwrap();
        let pushed = store
            .begin_pass("pve1", Some("bbb"), Trigger::Poll, at(0))
            .unwrap();
        store
            .note_source(pushed, Some("aaa"), true, None, false)
            .unwrap();
        store
            .finish_pass(pushed, PassOutcome::Applied, PassCounts::default(), at(1))
            .unwrap();
        let stale = store
            .begin_pass("pve1", Some("bbb"), Trigger::Poll, at(10))
            .unwrap();
        store
            .note_source(stale, None, false, Some("remote unreachable"), true)
            .unwrap();
        store.note_write_breaker(stale, BreakerMark::Open).unwrap();
        store
            .note_error(stale, "write circuit breaker open")
            .unwrap();
        store
            .finish_pass(stale, PassOutcome::Failed, PassCounts::default(), at(11))
            .unwrap();

        let status = status_from_store(&store, "pve1").unwrap();
        assert!(status.desired_stale);
        assert_eq!(status.last_error.as_deref(), Some("remote unreachable"));
        assert!(status.read_only);
        assert_eq!(status.write_breaker.unwrap().state, "open");
        let force = status.last_force_push.unwrap();
        assert_eq!(
            (force.commit.as_deref(), force.previous_commit.as_deref()),
            (Some("bbb"), Some("aaa"))
        );
        let attempted = status.last_attempted.unwrap();
        assert_eq!(
            attempted.error.as_deref(),
            Some("write circuit breaker open")
        );
        assert_eq!(attempted.write_breaker.as_deref(), Some("open"));
        assert_eq!(status.last_applied.unwrap().id, pushed.0);
    }

    #[test]
    fn a_revision_is_looked_up_by_unique_prefix_and_an_ambiguous_one_lists_the_candidates() {
        use proxops_core::diagnostic::Diagnostic;
        let mut store = Store::memory().unwrap();
        let good = "abc1230000000000000000000000000000000000";
        let bad = "abc4560000000000000000000000000000000000";
        let applied = store
            .begin_pass("pve1", Some(good), Trigger::Poll, at(0))
            .unwrap();
        store
            .note_enforced(applied, good, Some(PassOutcome::Applied))
            .unwrap();
        store
            .finish_pass(applied, PassOutcome::Applied, PassCounts::default(), at(1))
            .unwrap();
        let refused = store
            .begin_pass("pve1", Some(bad), Trigger::Webhook, at(10))
            .unwrap();
        let typo = Diagnostic::error("vm/web.yaml", 4, 3, "spec.memroy", "unknown field");
        store
            .record_invalid(refused, std::slice::from_ref(&typo))
            .unwrap();
        store
            .note_enforced(refused, good, Some(PassOutcome::NoChange))
            .unwrap();
        store
            .finish_pass(refused, PassOutcome::Invalid, PassCounts::default(), at(11))
            .unwrap();

        let RevisionLookup::Ambiguous(candidates) =
            revision_from_store(&store, "pve1", "abc").unwrap()
        else {
            panic!("`abc` starts both commits");
        };
        // Newest pass first; the refused pass both fetched `bad` and enforced `good`.
        assert_eq!(candidates, [good, bad]);
        let RevisionLookup::Found(revision) =
            revision_from_store(&store, "pve1", "ABC456").unwrap()
        else {
            panic!("a unique prefix, in any case");
        };
        assert_eq!(revision.commit, bad);
        assert!(!revision.valid);
        assert_eq!(revision.diagnostics[0].rendered, typo.headline());
        let invalid = revision.latest.head_invalid.as_ref().unwrap();
        assert_eq!(
            invalid.summary,
            "HEAD abc4560 is invalid (1 error); enforcing abc1230, last applied"
        );
        let RevisionLookup::Found(kept) = revision_from_store(&store, "pve1", good).unwrap() else {
            panic!("the full sha");
        };
        assert!(kept.valid);
        assert_eq!(kept.passes.len(), 2, "fetched once, enforced once");
        assert!(matches!(
            revision_from_store(&store, "pve1", "def").unwrap(),
            RevisionLookup::NotFound
        ));
        assert!(matches!(
            revision_from_store(&store, "pve2", "abc456").unwrap(),
            RevisionLookup::NotFound
        ));

        let status = status_from_store(&store, "pve1").unwrap();
        assert_eq!(status.enforced_commit.as_deref(), Some(good));
        assert_eq!(status.head_invalid.as_ref(), Some(invalid));
        assert_eq!(status.last_applied.unwrap().commit.as_deref(), Some(good));
    }

    #[test]
    fn a_database_without_notes_reports_a_fresh_writable_state() {
        let mut store = Store::memory().unwrap();
        let id = store
            .begin_pass("pve1", Some("aaa"), Trigger::Startup, at(0))
            .unwrap();
        store
            .finish_pass(id, PassOutcome::NoChange, PassCounts::default(), at(1))
            .unwrap();
        let status = status_from_store(&store, "pve1").unwrap();
        assert!(!status.desired_stale && !status.read_only);
        assert!(status.write_breaker.is_none() && status.last_force_push.is_none());
    }
    #[test]
    fn the_offline_status_holds_writes_while_the_store_has_an_open_ha_maintenance_finding() {
        use proxops_core::plan::{Finding, FindingKind};
        use proxops_core::resource::{Kind, ResourceId};
        use proxops_store::Resolution;

        let mut store = Store::memory().unwrap();
        let held = store
            .begin_pass("pve1", Some("aaa"), Trigger::Poll, at(0))
            .unwrap();
        let finding = Finding {
            resource: ResourceId::new(Kind::Vm, "a"),
            node: "pve1".to_owned(),
            kind: FindingKind::HaMaintenance,
            field: String::new(),
            desired: String::new(),
            observed: String::new(),
            message: "node pve1 is in PVE's HA maintenance mode".to_owned(),
        };
        store
            .record_pass_findings(held, "pve1", Some("aaa"), at(1), &[finding], |_| {
                Resolution::Corrected
            })
            .unwrap();
        store
            .finish_pass(held, PassOutcome::Applied, PassCounts::default(), at(2))
            .unwrap();

        let status = status_offline(&store, "pve1", &[]).unwrap();
        assert!(!status.writes.allowed, "{:?}", status.writes);
        let line = status.writes.line();
        assert!(
            line.starts_with("held: node pve1 is in PVE's HA maintenance mode")
                && line.contains("writes there resume when it leaves it")
                && line.ends_with(&format!("(reported since pass {})", held.0)),
            "{line}"
        );
        assert!(
            status_offline(&store, "pve2", &[]).unwrap().writes.allowed,
            "another node's agent is not held"
        );
        assert!(
            status_from_store(&store, "pve1").unwrap().writes.allowed,
            "the live views add the live hold themselves"
        );

        // The next pass finds the node out of maintenance: the finding resolves, writes go.
        let free = store
            .begin_pass("pve1", Some("aaa"), Trigger::Poll, at(10))
            .unwrap();
        store
            .record_pass_findings(free, "pve1", Some("aaa"), at(11), &[], |_| {
                Resolution::Corrected
            })
            .unwrap();
        let status = status_offline(&store, "pve1", &[]).unwrap();
        assert!(status.writes.allowed, "{:?}", status.writes);
    }
}
