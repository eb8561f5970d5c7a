//! Plan previews on pull requests (`[forge] preview = true`, issue 18 item 3).
//!
//! A verified `pull_request` webhook into the followed branch (opened, reopened, new commits;
//! `crate::webhook::pull_request`) calls [`Requests::request`] with the pull request's number
//! and returns. One worker per configuration ([`PreviewWorker`]) takes the numbers one at a
//! time, off the pass loop:
//!
//! 1. fetches `refs/pull/<n>/head` into a private ref of a mirror of its own
//!    ([`crate::source::pull`]), under the revision budget;
//! 2. validates it and applies `[scope]` as a pass does (`reconcile::desired_state`,
//!    `scope::check_revision`), then observes PVE (GETs only) and plans
//!    ([`plan_read_only`]). Nothing here can write: the executor is never called. SOPS
//!    documents are never opened: `resolve_secrets` is skipped, so cloud-init references stay
//!    the planner's markers and are compared by reference name only; snippets that use
//!    `${secret:…}` are not resolved and so not compared (the comment says both);
//! 3. creates or updates this node's one comment on the pull request, found again by
//!    [`super::comment::marker`], and sets the `{context}/plan` status on the head:
//!    `success` when a plan was made, `error` when the head is invalid, with a description.
//!
//! Coalesced per pull request: a request for a number already waiting adds nothing, and the
//! head is fetched when its turn comes, so only the newest head is planned. A request that
//! arrives while the same pull request is being planned plans it once more afterwards. Forge
//! calls are retried with the loop's [`Backoff`] (connection error, timeout, 408, 429, 5xx)
//! for at most [`MAX_RETRY`], and given up early when a newer request for the same pull
//! request is waiting (its comment will say more).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proxops_core::diagnostic::Diagnostic;
use proxops_core::plan::Plan;
use proxops_core::plan::render::render_human;
use proxops_store::SharedStore;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::State;
use super::comment::{CallError, ForgeApi, marker};
use super::config::ForgeConfig;
use crate::agent::retry::{Backoff, MIN_BACKOFF, Verdict};
use crate::config::SourceConfig;
use crate::error_chain::error_text;
use crate::reconcile::{self, Context, PlanOptions, ReconcileError};
use crate::source::git::GitSource;

/// How long the forge calls of one preview are retried.
pub const MAX_RETRY: Duration = Duration::from_secs(30 * 60);

/// What the comment says about secrets.
pub const SOPS_NOTE: &str = "SOPS values are never decrypted for a preview: secret \
     references are compared by reference name only.";

/// The pull requests waiting for a preview, shared by the webhook handler and the worker
/// (it survives a reload).
#[derive(Debug, Default)]
pub struct Requests {
    waiting: Mutex<BTreeSet<u64>>,
    ready: Notify,
}

impl Requests {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks for a preview of pull request `number`; `false` when one is already waiting
    /// (coalesced).
    pub fn request(&self, number: u64) -> bool {
        let added = self.lock().insert(number);
        self.ready.notify_one();
        added
    }

    /// Whether a preview of `number` is waiting.
    pub fn waiting(&self, number: u64) -> bool {
        self.lock().contains(&number)
    }

    async fn next(&self) -> u64 {
        loop {
            let ready = self.ready.notified();
            if let Some(number) = self.lock().pop_first() {
                return number;
            }
            ready.await;
        }
    }
}

/// What a worker needs: the configuration in force.
#[derive(Clone)]
pub struct PreviewSetup {
    /// `[forge]`.
    pub forge: ForgeConfig,
    /// PVE client, scope, `[scope]` (read-only use).
    pub context: Context,
    /// `[source]`, for the previews' own mirror.
    pub source: SourceConfig,
    /// The agent's state directory.
    pub state_dir: PathBuf,
    /// The cluster followed.
    pub cluster: Option<String>,
    /// The node label (`*`: the whole cluster).
    pub node_label: String,
    /// Prune and restart policy, as a pass plans with it.
    pub plan_options: PlanOptions,
    /// For the creation facts a pass plans with.
    pub store: SharedStore,
}

/// A running preview worker; stops when dropped (a reload builds a new one).
pub struct PreviewWorker {
    stop: CancellationToken,
}

impl Drop for PreviewWorker {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl PreviewWorker {
    /// Starts the worker when `preview = true`; `None` otherwise, or when the previews'
    /// mirror or the HTTP client cannot be set up (logged). Within the tokio runtime.
    pub fn start(setup: PreviewSetup, requests: Arc<Requests>) -> Option<Self> {
        if !setup.forge.preview {
            return None;
        }
        let api = match ForgeApi::new(&setup.forge) {
            Ok(api) => api,
            Err(error) => {
                tracing::error!(%error, "plan previews disabled");
                return None;
            }
        };
        let state_dir = crate::source::pull::preview_state_dir(&setup.state_dir);
        let source = match GitSource::open(&setup.source, &state_dir) {
            Ok(source) => Arc::new(source),
            Err(error) => {
                tracing::error!(error = %error_text(&error), "plan previews disabled");
                return None;
            }
        };
        let stop = CancellationToken::new();
        let worker = Worker {
            status_context: format!(
                "{}/plan",
                setup
                    .forge
                    .context_for(setup.cluster.as_deref(), &setup.node_label)
            ),
            marker: marker(setup.cluster.as_deref(), &setup.node_label),
            setup,
            api,
            source,
            requests,
        };
        tokio::spawn(worker.run(stop.clone()));
        Some(Self { stop })
    }
}

struct Worker {
    setup: PreviewSetup,
    api: ForgeApi,
    source: Arc<GitSource>,
    requests: Arc<Requests>,
    status_context: String,
    marker: String,
}

/// What a preview found.
#[derive(Debug)]
pub enum Outcome {
    /// A plan was made.
    Planned {
        /// The plan.
        plan: Plan,
        /// Notes on what was not compared.
        notes: Vec<String>,
    },
    /// The head is refused: its diagnostics (or why its tree was refused).
    Invalid(Vec<String>),
    /// No plan could be made (PVE or git unreachable…).
    Failed(String),
}

impl Worker {
    async fn run(self, stop: CancellationToken) {
        loop {
            let number = tokio::select! {
                () = stop.cancelled() => return,
                number = self.requests.next() => number,
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.preview(number) => {}
            }
        }
    }

    async fn preview(&self, number: u64) {
        let source = self.source.clone();
        let fetched =
            tokio::task::spawn_blocking(move || source.fetch_pull(number, &AtomicBool::new(false)))
                .await;
        let head = match fetched {
            Ok(Ok(head)) => head,
            Ok(Err(error)) => {
                tracing::warn!(pull_request = number, error = %error_text(&error), "plan preview: fetching the pull request's head failed");
                return;
            }
            Err(_) => return,
        };
        let outcome = match head.files {
            Err(error) => Outcome::Invalid(vec![error_text(&error)]),
            Ok(files) => {
                let store = self.setup.store.clone();
                let created = tokio::task::spawn_blocking(move || {
                    store
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .creations(None)
                        .unwrap_or_default()
                })
                .await
                .unwrap_or_default();
                let mut options = self.setup.plan_options.clone();
                options.created = created;
                match plan_read_only(
                    &self.setup.context,
                    &files,
                    self.setup.cluster.as_deref(),
                    &options,
                )
                .await
                {
                    Ok((plan, notes)) => Outcome::Planned { plan, notes },
                    Err(ReconcileError::Invalid(diagnostics)) => Outcome::Invalid(
                        diagnostics
                            .iter()
                            .filter(|d| d.is_error())
                            .map(Diagnostic::headline)
                            .collect(),
                    ),
                    Err(error) => Outcome::Invalid(vec![error_text(&error)]),
                }
            }
        };
        let title = reconcile::title(self.setup.cluster.as_deref());
        let body = render_comment(&self.marker, &head.commit, &title, &outcome);
        let (state, description) = status_of(&outcome);
        tracing::info!(
            pull_request = number,
            commit = %head.commit,
            state = state.as_str(),
            "plan preview made"
        );
        self.deliver(number, &head.commit, &body, state, &description)
            .await;
    }

    /// The comment, then the status, each retried while it is worth it.
    async fn deliver(&self, number: u64, sha: &str, body: &str, state: State, description: &str) {
        let started = Instant::now();
        let comment = self
            .retrying(number, started, "comment", || async {
                match self.api.find_comment(number, &self.marker).await? {
                    Some(id) => match self.api.update_comment(id, body).await {
                        // Not ours to edit after all (a marker copied into someone else's
                        // comment): post our own.
                        Err(CallError {
                            status: Some(403 | 404),
                            ..
                        }) => self.api.create_comment(number, body).await.map(drop),
                        other => other,
                    },
                    None => self.api.create_comment(number, body).await.map(drop),
                }
            })
            .await;
        if comment.is_some() {
            tracing::info!(pull_request = number, "plan preview comment written");
        }
        let status = self
            .retrying(number, started, "status", || {
                self.api
                    .set_status(sha, state, &self.status_context, description)
            })
            .await;
        if status.is_some() {
            tracing::info!(pull_request = number, context = %self.status_context, state = state.as_str(), "plan preview status sent");
        }
    }

    async fn retrying<F, Fut>(
        &self,
        number: u64,
        started: Instant,
        what: &str,
        call: F,
    ) -> Option<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), CallError>>,
    {
        let mut backoff = Backoff::default();
        loop {
            match call().await {
                Ok(()) => return Some(()),
                Err(error)
                    if error.retry
                        && started.elapsed() < MAX_RETRY
                        && !self.requests.waiting(number) =>
                {
                    let delay = backoff
                        .after(Verdict::Transient, rand::random::<f64>())
                        .unwrap_or(MIN_BACKOFF);
                    tracing::warn!(pull_request = number, error = %error, retry_in = ?delay, "plan preview {what} not delivered; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(error) => {
                    tracing::error!(pull_request = number, error = %error, "plan preview {what} given up");
                    return None;
                }
            }
        }
    }
}

/// Validates `files`, applies `[scope]`, observes PVE and plans: never a write, never a
/// SOPS document opened. The notes say what was not compared.
///
/// # Errors
/// [`ReconcileError::Invalid`] for validation or `[scope]` errors (and a missing snippet
/// file), or no unambiguous cluster.
pub async fn plan_read_only(
    ctx: &Context,
    files: &BTreeMap<String, String>,
    cluster: Option<&str>,
    options: &PlanOptions,
) -> Result<(Plan, Vec<String>), ReconcileError> {
    let mut desired = reconcile::desired_state(files, cluster)?;
    let outside = crate::scope::check_revision(&ctx.execute.scope, &desired, files).await;
    if outside.iter().any(Diagnostic::is_error) {
        return Err(ReconcileError::Invalid(outside));
    }
    let mut notes = Vec::new();
    let guests_with_refs = desired.manifest.cloud_init_refs().count();
    if guests_with_refs > 0 {
        notes.push(format!(
            "{guests_with_refs} guest{} with cloud-init secret references: compared by reference name only",
            if guests_with_refs == 1 { "" } else { "s" }
        ));
    }
    // Snippets without `${secret:…}` need no document: resolved as a pass resolves them.
    // Those with one are left unresolved, so they are not compared.
    if crate::snippets::resolve::references(&desired, files).is_empty() {
        reconcile::resolve_snippets(&mut desired, files, &ctx.secrets, &ctx.snippets)?;
    } else {
        notes.push(
            "cloud-init snippets use ${secret:…} references: snippets are not compared in a preview"
                .to_owned(),
        );
    }
    let plan = reconcile::observe_and_plan_with(ctx, &desired, options).await;
    Ok((plan, notes))
}

/// The status of a preview: `success` with the counts, or `error` with the first problem.
pub fn status_of(outcome: &Outcome) -> (State, String) {
    match outcome {
        Outcome::Planned { plan, .. } => {
            let text = render_human(plan, "plan");
            let counts = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("plan: "))
                .map_or_else(|| "no changes".to_owned(), str::to_owned);
            match &plan.aborted {
                Some(reason) => (State::Error, format!("plan aborted: {reason}")),
                None => (State::Success, format!("plan: {counts}")),
            }
        }
        Outcome::Invalid(problems) => (
            State::Error,
            problems
                .first()
                .cloned()
                .unwrap_or_else(|| "the revision is invalid".to_owned()),
        ),
        Outcome::Failed(error) => (State::Error, format!("no plan: {error}")),
    }
}

/// Text from the repository inside a fenced block: a fence in it would end the block.
fn fenced(text: &str) -> String {
    text.replace("```", "'''")
}

/// The comment's markdown: the marker first (how it is found again), the head commit, the
/// counts, the `+ ~ -` lines in a ```diff block with risk markers, findings, diagnostics of an
/// invalid head, and the note on SOPS.
pub fn render_comment(marker: &str, commit: &str, title: &str, outcome: &Outcome) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{marker}");
    let who = marker
        .trim_start_matches("<!-- proxops:plan:")
        .trim_end_matches(" -->");
    let _ = writeln!(out, "### ProxOps plan preview for `{who}`\n");
    let _ = writeln!(
        out,
        "Head commit `{commit}`, planned read-only against live PVE ({title}). Nothing of \
         it is applied before it is merged into the followed branch.\n"
    );
    match outcome {
        Outcome::Planned { plan, notes } => {
            let text = render_human(plan, title);
            let mut counts = None;
            let mut risk = None;
            let mut lines = Vec::new();
            for line in text.lines().skip(1) {
                let trimmed = line.trim_start();
                if let Some(c) = trimmed.strip_prefix("plan: ") {
                    counts = Some(c.to_owned());
                } else if let Some(r) = trimmed.strip_prefix("risk: ") {
                    risk = Some(r.to_owned());
                } else if trimmed.starts_with(['+', '-', '~', '!']) {
                    // The symbol in the first column, as a diff shows it.
                    lines.push(trimmed.to_owned());
                } else {
                    lines.push(line.strip_prefix("  ").unwrap_or(line).to_owned());
                }
            }
            match counts {
                Some(counts) => {
                    let _ = writeln!(out, "**Plan:** {counts}");
                }
                None => {
                    let _ = writeln!(out, "**Plan:** no changes: PVE matches the desired state");
                }
            }
            if let Some(risk) = risk {
                let _ = writeln!(out, "\n**Risk:** {risk}");
            }
            if !plan.findings.is_empty() {
                let _ = writeln!(
                    out,
                    "\n**Findings:** {} (the `!` lines)",
                    plan.findings.len()
                );
            }
            let _ = writeln!(out, "\n```diff\n{}\n```", fenced(&lines.join("\n")));
            for note in notes {
                let _ = writeln!(out, "\n- {note}");
            }
        }
        Outcome::Invalid(problems) => {
            let _ = writeln!(
                out,
                "**Invalid:** {} problem{}; this head would not be applied.\n",
                problems.len(),
                if problems.len() == 1 { "" } else { "s" }
            );
            let _ = writeln!(out, "```text\n{}\n```", fenced(&problems.join("\n")));
        }
        Outcome::Failed(error) => {
            let _ = writeln!(out, "**No plan:** {}", fenced(error));
        }
    }
    let _ = writeln!(out, "\n_{SOPS_NOTE}_");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_waiting_already_is_coalesced_and_taken_once() {
        let requests = Requests::default();
        assert!(requests.request(7));
        assert!(!requests.request(7), "the second request is coalesced");
        assert!(requests.request(3));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(runtime.block_on(requests.next()), 3);
        assert_eq!(runtime.block_on(requests.next()), 7);
        assert!(!requests.waiting(7));
    }

    #[test]
    fn an_invalid_head_shows_its_diagnostics_in_a_block_and_an_error_status() {
        let outcome = Outcome::Invalid(vec![
            "vm/web.yaml:6:3: error: spec.memory: missing required field ```x".to_owned(),
        ]);
        let body = render_comment(
            "<!-- proxops:plan:default/pve1 -->",
            "abc",
            "repository",
            &outcome,
        );
        assert!(body.starts_with("<!-- proxops:plan:default/pve1 -->\n"));
        assert!(body.contains("**Invalid:** 1 problem"), "{body}");
        assert!(
            body.contains("vm/web.yaml:6:3: error: spec.memory"),
            "{body}"
        );
        assert_eq!(
            body.matches("```").count(),
            2,
            "a fence in a message is defused: {body}"
        );
        assert!(body.contains(SOPS_NOTE));
        let (state, description) = status_of(&outcome);
        assert_eq!(state, State::Error);
        assert!(description.starts_with("vm/web.yaml:6:3"));
    }

    #[test]
    fn an_empty_plan_says_no_changes_and_succeeds() {
        let outcome = Outcome::Planned {
            plan: Plan::default(),
            notes: vec![
                "1 guest with cloud-init secret references: compared by reference name only"
                    .to_owned(),
            ],
        };
        let body = render_comment("<!-- m -->", "abc", "repository", &outcome);
        assert!(body.contains("no changes"), "{body}");
        assert!(body.contains("```diff"), "{body}");
        assert!(body.contains("compared by reference name only"), "{body}");
        assert_eq!(status_of(&outcome).0, State::Success);
    }
}
