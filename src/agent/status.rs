//! What the agent knows about itself right now, shared with the HTTP status API: process
//! start, the last pass in memory (for the Go program's `/status` shape), staleness, the
//! last error, and whether HEAD is invalid with another revision in force
//! ([`InvalidHead`]). Durable history lives in the store; this is only the live view.
//!
//! [`DiagnosticView`] and [`InvalidHead`] are the one JSON shape of a diagnostic and of the
//! invalid-HEAD state, used by `/status`, `/api/v1/*`, `proxops status` and the page.

use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use proxops_core::diagnostic::Diagnostic;
use proxops_core::plan::{FindingKind, Plan};
use proxops_core::resource::ResourceId;
use serde::{Deserialize, Serialize};

use crate::agent::breaker::Breaker;
use crate::execute::{ApplyReport, Outcome};
use crate::timefmt::rfc3339;

/// Live state shared between the loop and the HTTP handlers.
#[derive(Debug)]
pub struct LiveStatus {
    /// When the process started.
    pub process_start: SystemTime,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    last: Option<LastPass>,
    head_invalid: Option<InvalidHead>,
    desired_stale: bool,
    last_error: Option<String>,
    passes_completed: u64,
    breaker: BreakerView,
    windows: Vec<crate::agent::window::Window>,
    /// Writes held because nodes of the agent are in PVE's HA maintenance (the last pass).
    ha_held: Option<crate::agent::window::Held>,
    rollout: Option<Arc<crate::agent::rollout::Rollout>>,
}

/// The write circuit breaker as reported on `/status`, `/api/v1/status` and `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct BreakerView {
    /// `closed`, `open` or `half-open`.
    pub state: String,
    /// Open or half-open: writes are held back (the Go program's `read_only`).
    pub read_only: bool,
    /// Consecutive failed writes counted while closed.
    pub consecutive_failures: u32,
    /// RFC 3339: when an open breaker allows a probe write.
    pub open_until: Option<String>,
}

impl Default for BreakerView {
    fn default() -> Self {
        Self {
            state: "closed".to_owned(),
            read_only: false,
            consecutive_failures: 0,
            open_until: None,
        }
    }
}

impl BreakerView {
    /// The view of `breaker` at `now`.
    pub fn of(breaker: &Breaker, now: Instant) -> Self {
        Self {
            state: breaker.mark().as_str().to_owned(),
            read_only: breaker.is_read_only(),
            consecutive_failures: breaker.consecutive_failures(),
            open_until: breaker
                .open_until()
                .map(|until| rfc3339(SystemTime::now() + until.saturating_duration_since(now))),
        }
    }
}

/// One diagnostic as every JSON view shows it: its parts, and `rendered`, the one line
/// `path:line:col: error: field: message` ([`Diagnostic::headline`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiagnosticView {
    /// Repository-relative path.
    pub path: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// `error` or `warning`.
    pub severity: String,
    /// Field path inside the document (empty for whole-file problems).
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it, when known.
    #[serde(default)]
    pub help: Option<String>,
    /// `path:line:col: error: field: message`.
    pub rendered: String,
}

impl From<&Diagnostic> for DiagnosticView {
    fn from(d: &Diagnostic) -> Self {
        Self {
            path: d.path.clone(),
            line: d.line,
            column: d.column,
            severity: d.severity.as_str().to_owned(),
            field: d.field.clone(),
            message: d.message.clone(),
            help: d.help.clone(),
            rendered: d.headline(),
        }
    }
}

/// HEAD was refused (invalid, or a reference that does not resolve) and the last valid
/// revision stays in force, as the views say it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvalidHead {
    /// The commit fetched and refused.
    pub commit: String,
    /// Why it was refused, as one sentence.
    pub reason: String,
    /// Its errors (empty when it was refused for another reason than validation, e.g. a
    /// secret reference that does not resolve: `reason` says which).
    pub diagnostics: Vec<DiagnosticView>,
    /// The commit whose desired state passes observe and enforce meanwhile; `None` when no
    /// revision was valid before (nothing is enforced then).
    pub enforced_commit: Option<String>,
    /// Whether `enforced_commit` is the last applied revision (`false`: the last valid one,
    /// whose last pass did not apply everything).
    pub enforced_is_last_applied: bool,
    /// `HEAD 1a2b3c4 is invalid (2 errors); enforcing 4d5e6f7, last applied`.
    pub summary: String,
}

impl InvalidHead {
    /// The state for HEAD `commit` refused for `reason` with `diagnostics`, with `enforced`
    /// (commit, whether it is the last applied one) in force.
    pub fn new(
        commit: &str,
        reason: &str,
        diagnostics: &[Diagnostic],
        enforced: Option<(&str, bool)>,
    ) -> Self {
        Self {
            commit: commit.to_owned(),
            reason: reason.to_owned(),
            diagnostics: diagnostics.iter().map(DiagnosticView::from).collect(),
            enforced_commit: enforced.map(|(c, _)| c.to_owned()),
            enforced_is_last_applied: enforced.is_some_and(|(_, applied)| applied),
            summary: invalid_head_summary(commit, reason, diagnostics, enforced),
        }
    }
}

/// The one sentence every view shows for an invalid HEAD:
/// `HEAD 1a2b3c4 is invalid (2 errors); enforcing 4d5e6f7, last applied`. A HEAD refused
/// without diagnostics (a secret reference, no cluster chosen) names its reason instead of
/// the error count; without an enforced revision the sentence says nothing is enforced.
pub fn invalid_head_summary(
    commit: &str,
    reason: &str,
    diagnostics: &[Diagnostic],
    enforced: Option<(&str, bool)>,
) -> String {
    let errors = diagnostics.iter().filter(|d| d.is_error()).count();
    let why = if errors > 0 {
        format!(
            "is invalid ({errors} {})",
            if errors == 1 { "error" } else { "errors" }
        )
    } else {
        format!("is not applied ({reason})")
    };
    let rest = match enforced {
        Some((enforced, true)) => format!("enforcing {}, last applied", short(enforced)),
        Some((enforced, false)) => format!("enforcing {}, last valid", short(enforced)),
        None => "nothing is enforced: no earlier revision was valid".to_owned(),
    };
    format!("HEAD {} {why}; {rest}", short(commit))
}

/// The 7-character abbreviation views use for a commit.
pub fn short(commit: &str) -> &str {
    commit.get(..7).unwrap_or(commit)
}

/// The last finished pass, summarised for `/status`.
#[derive(Debug, Clone, Serialize)]
pub struct LastPass {
    /// The commit applied or attempted.
    pub commit: Option<String>,
    /// Start and end, RFC 3339.
    pub started_at: String,
    /// End, RFC 3339.
    pub finished_at: String,
    /// `applied`, `no-change`, `failed`, `invalid`, `interrupted`.
    pub outcome: String,
    /// Per resource and node: what the pass saw and did.
    pub objects: Vec<ObjectStatus>,
    /// Why the pass was aborted, if it was.
    pub abort_reason: Option<String>,
    /// Why the write circuit breaker held some of the pass's writes back, if it did.
    pub writes_held_back: Option<String>,
    /// The commit whose desired state the pass enforced (`commit`, or the last valid one
    /// while `commit` is invalid); `None` when it enforced nothing.
    pub enforced_commit: Option<String>,
    /// Set when `commit` was refused: its diagnostics and what was enforced instead.
    pub head_invalid: Option<InvalidHead>,
}

/// One object of the Go program's `/status` shape.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectStatus {
    /// Kind.
    pub kind: String,
    /// `metadata.name`.
    pub name: String,
    /// Cluster, in composition mode.
    pub cluster: Option<String>,
    /// Node.
    pub node: String,
    /// vmid for guests.
    pub id: Option<u32>,
    /// `converged`, `drift`, `anomalous`, `failed`, `skipped`.
    pub state: String,
    /// The last action's verb.
    pub last_action: Option<String>,
    /// The last action's error.
    pub last_error: Option<String>,
}

impl Default for LiveStatus {
    fn default() -> Self {
        Self {
            process_start: SystemTime::now(),
            inner: Mutex::default(),
        }
    }
}

impl LiveStatus {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock only means a panic elsewhere; the data is plain values.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a finished pass (and with it whether HEAD is invalid now).
    pub fn finish(&self, last: LastPass) {
        let mut inner = self.lock();
        inner.head_invalid = last.head_invalid.clone();
        inner.last = Some(last);
        inner.passes_completed += 1;
    }

    /// HEAD's refusal and the revision in force instead, when the last pass refused HEAD.
    pub fn head_invalid(&self) -> Option<InvalidHead> {
        self.lock().head_invalid.clone()
    }

    /// Records the last git error (`None` after a good fetch) and whether the desired state
    /// in force is the last good revision because of it (stale).
    pub fn set_source_error(&self, error: Option<String>, stale: bool) {
        let mut inner = self.lock();
        inner.desired_stale = stale;
        inner.last_error = error;
    }

    /// The last pass, if any.
    pub fn last(&self) -> Option<LastPass> {
        self.lock().last.clone()
    }

    /// Whether the desired state is the last good one because git could not be fetched.
    pub fn desired_stale(&self) -> bool {
        self.lock().desired_stale
    }

    /// The last source error.
    pub fn last_error(&self) -> Option<String> {
        self.lock().last_error.clone()
    }

    /// Sets `[[policy.window]]` of the configuration in force (at start and reload).
    pub fn set_windows(&self, windows: Vec<crate::agent::window::Window>) {
        self.lock().windows = windows;
    }

    /// Sets what PVE's HA maintenance holds, as the last pass found it.
    pub fn set_ha_held(&self, held: Option<crate::agent::window::Held>) {
        self.lock().ha_held = held;
    }

    /// What PVE's HA maintenance holds, as the last pass found it.
    pub fn ha_held(&self) -> Option<crate::agent::window::Held> {
        self.lock().ha_held.clone()
    }

    /// `[[policy.window]]` of the configuration in force.
    pub fn windows(&self) -> Vec<crate::agent::window::Window> {
        self.lock().windows.clone()
    }

    /// Publishes the write circuit breaker's state.
    pub fn set_breaker(&self, view: BreakerView) {
        self.lock().breaker = view;
    }

    /// The write circuit breaker's state.
    pub fn breaker(&self) -> BreakerView {
        self.lock().breaker.clone()
    }

    /// Sets `[rollout]` of the configuration in force (at start and reload).
    pub fn set_rollout(&self, rollout: Option<Arc<crate::agent::rollout::Rollout>>) {
        self.lock().rollout = rollout;
    }

    /// The rollout's view, with `[rollout]`.
    pub fn rollout(&self) -> Option<crate::agent::rollout::RolloutView> {
        let rollout = self.lock().rollout.clone();
        rollout.map(|r| r.view())
    }

    /// Whether at least one pass has finished (readiness).
    pub fn is_ready(&self) -> bool {
        self.lock().passes_completed > 0
    }
}

/// Builds the per-object view of a pass from its plan and report.
pub fn objects(
    cluster: Option<&str>,
    resources: impl Iterator<Item = (ResourceId, Vec<String>, Option<u32>)>,
    plan: &Plan,
    report: Option<&ApplyReport>,
) -> Vec<ObjectStatus> {
    let mut out = Vec::new();
    for (id, nodes, vmid) in resources {
        for node in nodes {
            let finding = plan
                .findings
                .iter()
                .find(|f| f.resource == id && f.node == node);
            let planned = plan.actions().find(|a| a.resource == id && a.node == node);
            let result = report.and_then(|r| {
                r.results
                    .iter()
                    .find(|x| x.action.resource == id && x.action.node == node)
            });
            let (state, last_action, last_error) = match (result, planned, finding) {
                (Some(r), _, _) => match &r.outcome {
                    Outcome::Succeeded { .. } => ("converged", Some(r.action.verb.name()), None),
                    Outcome::Failed { error, .. } => {
                        ("failed", Some(r.action.verb.name()), Some(error.clone()))
                    }
                    Outcome::Skipped { reason } => {
                        ("skipped", Some(r.action.verb.name()), Some(reason.clone()))
                    }
                },
                (None, Some(a), _) => ("drift", Some(a.verb.name()), None),
                (None, None, Some(f)) if f.kind == FindingKind::ObserveFailed => {
                    ("skipped", None, Some(f.message.clone()))
                }
                (None, None, Some(f)) => ("anomalous", None, Some(f.message.clone())),
                (None, None, None) => ("converged", None, None),
            };
            out.push(ObjectStatus {
                kind: id.kind.to_string(),
                name: id.name.clone(),
                cluster: cluster.map(str::to_owned),
                node,
                id: vmid,
                state: state.to_owned(),
                last_action: last_action.map(str::to_owned),
                last_error,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_errors() -> Vec<Diagnostic> {
        vec![
            Diagnostic::error("vm/web.yaml", 4, 3, "spec.memroy", "unknown field"),
            Diagnostic::error("vm/web.yaml", 9, 1, "spec.cores", "not a number"),
        ]
    }

    #[test]
    fn the_invalid_head_sentence_names_head_its_errors_and_the_revision_in_force() {
        let head = "1a2b3c4d5e6f";
        let enforced = "4d5e6f7a8b9c";
        assert_eq!(
            invalid_head_summary(head, "x", &two_errors(), Some((enforced, true))),
            "HEAD 1a2b3c4 is invalid (2 errors); enforcing 4d5e6f7, last applied"
        );
        assert_eq!(
            invalid_head_summary(head, "x", &two_errors()[..1], Some((enforced, false))),
            "HEAD 1a2b3c4 is invalid (1 error); enforcing 4d5e6f7, last valid"
        );
        assert_eq!(
            invalid_head_summary(head, "secret ref `a` is not in the SOPS file", &[], None),
            "HEAD 1a2b3c4 is not applied (secret ref `a` is not in the SOPS file); nothing is \
             enforced: no earlier revision was valid"
        );
    }

    #[test]
    fn an_invalid_head_lists_each_diagnostic_rendered_on_one_line() {
        let state = InvalidHead::new(
            "1a2b3c4d",
            "invalid",
            &two_errors(),
            Some(("4d5e6f7a", true)),
        );
        let rendered: Vec<_> = state
            .diagnostics
            .iter()
            .map(|d| d.rendered.as_str())
            .collect();
        assert_eq!(
            rendered,
            [
                "vm/web.yaml:4:3: error: spec.memroy: unknown field",
                "vm/web.yaml:9:1: error: spec.cores: not a number"
            ]
        );
        assert_eq!(state.enforced_commit.as_deref(), Some("4d5e6f7a"));
        assert!(state.enforced_is_last_applied);
    }
}
