//! What the agent knows about itself right now, shared with the HTTP status API: process
//! start, the last pass in memory (for the Go program's `/status` shape), staleness and the
//! last error. Durable history lives in the store; this is only the live view.

use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use proxops_core::plan::{FindingKind, Plan};
use proxops_core::resource::ResourceId;
use serde::Serialize;

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
    desired_stale: bool,
    last_error: Option<String>,
    passes_completed: u64,
    breaker: BreakerView,
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

    /// Records a finished pass.
    pub fn finish(&self, last: LastPass) {
        let mut inner = self.lock();
        inner.last = Some(last);
        inner.passes_completed += 1;
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

    /// Publishes the write circuit breaker's state.
    pub fn set_breaker(&self, view: BreakerView) {
        self.lock().breaker = view;
    }

    /// The write circuit breaker's state.
    pub fn breaker(&self) -> BreakerView {
        self.lock().breaker.clone()
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
