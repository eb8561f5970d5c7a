//! One reconcile pass: [`reconcile_once`] is the one composition of the phases, called by
//! `proxops plan`, `proxops apply`, `proxops check`, the demo and the agent's pass, so what
//! the CLI shows is what the agent does.
//!
//! Phases, each named: `desired_state` (validate, pick the cluster) → `resolve_secrets` (the
//! cluster's SOPS document, for cloud-init references) → `observe_and_plan` (PVE GETs, then
//! the pure planner) → gate and execute (PVE writes). A revision with any validation error,
//! or a reference that does not resolve, is never applied: both fail before PVE is even read.
//!
//! What differs between callers is a [`Hooks`] value: the agent records findings and asks its
//! write circuit breaker, `apply` prints the plan and asks for confirmation, `check` goes on
//! without secrets. The policy's [`Mode`] is honoured here, so no caller can write in report
//! mode.

use std::collections::BTreeMap;
use std::time::Duration;

use proxops_core::diagnostic::Diagnostic;
use proxops_core::plan::{
    self, Action, Creation, DEFAULT_MAX_PRUNE, Inventory, NodeScope, Plan, Policy,
};
use proxops_core::repository::{DesiredState, Layout};
use proxops_pve::{PveClient, WaitOptions};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

pub use crate::config::Mode;
use crate::config::{AgentConfig, SecretsConfig};
use crate::execute::{self, ApplyReport, LevelGate, Progress};
use crate::observe;
use crate::secrets::resolve::{
    ResolveError, UnresolvedRef, open_revision_document, resolve_desired,
};
use crate::secrets::sops::resolve_snippet_ref;
use crate::snippets::SnippetsConfig;
use crate::snippets::resolve as snippet_resolve;

/// What a pass needs from the world.
#[derive(Clone)]
pub struct Context {
    /// The PVE API.
    pub pve: PveClient,
    /// The nodes this pass plans for.
    pub scope: NodeScope,
    /// How actions are run.
    pub execute: execute::Options,
    /// Where the cluster's SOPS document and its age identity are (`[secrets]`).
    pub secrets: SecretsConfig,
    /// `[policy] mode`: in report mode no pass writes, whoever asks.
    pub mode: Mode,
    /// `[pve] read_concurrency`: GETs in flight at once while observing.
    pub read_concurrency: usize,
    /// `[snippets]`: the default storage of cloud-init snippets and their grace period.
    pub snippets: SnippetsConfig,
}

impl Context {
    /// The context `config` describes, planning for `scope` (the agent's node, or a CLI
    /// override) through `pve`.
    pub fn from_config(pve: PveClient, scope: NodeScope, config: &AgentConfig) -> Self {
        Self {
            pve,
            scope,
            execute: execute::Options {
                concurrency_per_node: config.policy.concurrency_per_node,
                wait: WaitOptions {
                    timeout: config.policy.task_timeout,
                    ..WaitOptions::default()
                },
                lock_retry_for: Duration::from_secs(60),
                local_node: match &config.node {
                    NodeScope::Node(node) => Some(node.clone()),
                    NodeScope::All => None,
                },
                scope: config.scope.clone(),
                cluster_lock_dir: config.pmxcfs.as_ref().map(|p| p.lock_dir.clone()),
            },
            secrets: config.secrets.clone(),
            mode: config.policy.mode,
            read_concurrency: config.pve.read_concurrency,
            snippets: config.snippets.clone(),
        }
    }
}

/// The planner's policy beyond the node scope. The owned guests the planner may prune are
/// the observed ones with the ownership tag (so guests the Go program created count), with
/// `created` adding how the agent created them.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// Delete owned guests no manifest declares (`[policy] prune`).
    pub prune: bool,
    /// At most this many prunes per pass (`[policy] max_prune`).
    pub max_prune: u32,
    /// Restart running guests to apply pending changes (`[policy] restart_on_change`).
    pub restart_on_change: bool,
    /// How owned guests were created (node, vmid, facts), as the agent's store recorded
    /// it: a changed clone source, CT template or disk image is then a requires-recreate
    /// finding. Empty for the CLI, which has no store.
    pub created: Vec<(String, u32, Creation)>,
}

impl PlanOptions {
    /// `[policy]`'s prune and restart settings; nothing known of how guests were created.
    pub fn from_config(config: &AgentConfig) -> Self {
        Self {
            prune: config.policy.prune,
            max_prune: config.policy.max_prune,
            restart_on_change: config.policy.restart_on_change,
            created: Vec::new(),
        }
    }
}

impl Default for PlanOptions {
    /// Prune off, `max_prune` 3, no restarts.
    fn default() -> Self {
        Self {
            prune: false,
            max_prune: DEFAULT_MAX_PRUNE,
            restart_on_change: false,
            created: Vec::new(),
        }
    }
}

/// What one pass found and did.
#[derive(Debug, Clone, Serialize)]
pub struct Pass {
    /// The cluster (composition mode) or `None` (plain mode).
    pub cluster: Option<String>,
    /// The plan computed.
    pub plan: Plan,
    /// What applying it did (`None` in plan mode or when nothing was to be done).
    pub report: Option<ApplyReport>,
    /// Why nothing of a plan with changes was written, when a pass asked to apply: report
    /// mode, or the operator declined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub withheld: Option<String>,
    /// The desired state the plan was made for (its secrets resolved: never serialised).
    #[serde(skip)]
    pub desired: DesiredState,
}

impl Pass {
    /// How the desired state is named in output.
    pub fn title(&self) -> String {
        title(self.cluster.as_deref())
    }
}

/// How the desired state of `cluster` (`None`: plain mode) is named in output.
pub fn title(cluster: Option<&str>) -> String {
    cluster.map_or_else(|| "repository".to_owned(), |c| format!("cluster {c}"))
}

/// Why a pass could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The revision has validation errors; nothing of it is applied.
    #[error("the revision is invalid ({} {}); nothing of it is applied", .0.len(), if .0.len() == 1 { "error" } else { "errors" })]
    Invalid(Vec<Diagnostic>),
    /// Composition mode with several clusters and none chosen.
    #[error("the repository has several clusters ({}); choose one with --cluster or `cluster` in agent.toml", .0.join(", "))]
    ClusterNotChosen(Vec<String>),
    /// The chosen cluster has no `clusters/<name>/resources.yaml`.
    #[error("cluster `{name}` is not in the repository (clusters found: {})", .found.join(", "))]
    NoSuchCluster {
        /// The cluster asked for.
        name: String,
        /// The clusters present.
        found: Vec<String>,
    },
    /// A cloud-init reference cannot be resolved from the cluster's SOPS document (or the
    /// document cannot be read); nothing of the revision is applied.
    #[error(transparent)]
    Secrets(#[from] ResolveError),
}

/// Validates the revision's files and picks the desired state to reconcile.
///
/// # Errors
/// Validation errors, or no unambiguous cluster.
pub fn desired_state(
    files: &BTreeMap<String, String>,
    cluster: Option<&str>,
) -> Result<DesiredState, ReconcileError> {
    let loaded = proxops_core::repository::load(files);
    if loaded.has_errors() {
        return Err(ReconcileError::Invalid(loaded.diagnostics));
    }
    let wanted = match (loaded.layout, cluster) {
        (Layout::Plain, _) => None,
        (Layout::Composition, Some(name)) => {
            if !loaded.clusters.iter().any(|c| c == name) {
                return Err(ReconcileError::NoSuchCluster {
                    name: name.to_owned(),
                    found: loaded.clusters.clone(),
                });
            }
            Some(name)
        }
        (Layout::Composition, None) => match loaded.clusters.as_slice() {
            [only] => Some(only.as_str()),
            _ => return Err(ReconcileError::ClusterNotChosen(loaded.clusters.clone())),
        },
    };
    loaded
        .states
        .iter()
        .find(|s| s.cluster.as_deref() == wanted)
        .cloned()
        .ok_or_else(|| ReconcileError::Invalid(loaded.diagnostics.clone()))
}

/// Gives every VM of `desired` the values of its `ssh-key-refs` / `ci-password-ref`, read
/// from the cluster's SOPS document in the revision's `files` (or `[secrets] file`). Plans
/// hold only markers naming the references; the executor sends the values.
///
/// # Errors
/// [`ReconcileError::Secrets`], before any PVE request: the pass fails closed.
pub fn resolve_secrets(
    desired: &mut DesiredState,
    files: &BTreeMap<String, String>,
    secrets: &SecretsConfig,
) -> Result<(), ReconcileError> {
    resolve_desired(desired, files, secrets).map_err(ReconcileError::from)
}

/// Gives every VM of `desired` its cloud-init snippets: the text (inline or the revision's
/// file), each `${secret:<ref>}` replaced from the cluster's SOPS document (opened only when
/// a snippet names one), hashed and named. Plans hold the names and hashes; the executor
/// writes the text.
///
/// # Errors
/// A missing snippet file ([`ReconcileError::Invalid`], located), or a reference that does
/// not resolve ([`ReconcileError::Secrets`]), before any PVE request.
pub fn resolve_snippets(
    desired: &mut DesiredState,
    files: &BTreeMap<String, String>,
    secrets: &SecretsConfig,
    snippets: &SnippetsConfig,
) -> Result<(), ReconcileError> {
    let references = snippet_resolve::references(desired, files);
    let document = if references.is_empty() {
        None
    } else {
        Some(open_revision_document(
            desired.cluster.as_deref(),
            files,
            secrets,
        )?)
    };
    let lookup = |reference: &str| {
        document
            .as_ref()
            .and_then(|d| resolve_snippet_ref(d, reference))
            .cloned()
    };
    snippet_resolve::resolve(desired, files, &snippets.storage, &lookup).map_err(
        |error| match error {
            snippet_resolve::ResolveError::Invalid(diagnostics) => {
                ReconcileError::Invalid(diagnostics)
            }
            snippet_resolve::ResolveError::Unresolved(r) => {
                ReconcileError::Secrets(ResolveError::Unresolved(UnresolvedRef {
                    document: document
                        .as_ref()
                        .map(|d| d.path().to_path_buf())
                        .unwrap_or_default(),
                    field: format!("{}: {}", r.path, r.field),
                    reference: r.reference,
                    empty: false,
                }))
            }
        },
    )
}

/// Observes PVE and plans with the default policy (no prune, no restarts): no writes.
pub async fn observe_and_plan(ctx: &Context, desired: &DesiredState) -> Plan {
    observe_and_plan_with(ctx, desired, &PlanOptions::default()).await
}

/// Observes PVE and plans under `options`: no writes.
pub async fn observe_and_plan_with(
    ctx: &Context,
    desired: &DesiredState,
    options: &PlanOptions,
) -> Plan {
    let observed = observe::observe(&ctx.pve, desired, &ctx.scope, ctx.read_concurrency).await;
    let inventory = Inventory::from_tags(&observed).with_created(options.created.iter().cloned());
    let policy = Policy {
        scope: ctx.scope.clone(),
        prune: options.prune,
        max_prune: options.max_prune,
        restart_on_change: options.restart_on_change,
        snippets_removable_before: removable_before(ctx.snippets.grace),
    };
    let plan = plan::plan(desired, &observed, &inventory, &policy);
    // `[scope]`: no prune outside it, at most `max_creates` creates this pass.
    proxops_core::scope::restrict(&ctx.execute.scope, desired, plan)
}

/// The `ctime` before which an unreferenced snippet has been left longer than `grace`.
fn removable_before(grace: Duration) -> Option<u64> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    now.checked_sub(grace).map(|t| t.as_secs())
}

/// Why a pass that asked to apply wrote nothing although the plan has changes, in report mode.
pub const REPORT_MODE: &str = "not applied: [policy] mode = \"report\" in the agent config, and report \
     mode never writes to PVE (set mode = \"apply\" to let passes write)";

/// What differs between the callers of [`reconcile_once`]. Every method has a default that
/// does nothing special, so [`NoHooks`] is the plain pass.
pub trait Hooks: Send {
    /// A reference could not be resolved from the SOPS document: `true` goes on with the
    /// references unresolved (`check`, which reports it), `false` refuses the revision.
    fn secrets_failed(&mut self, _error: &ResolveError) -> bool {
        false
    }

    /// The plan is made and nothing is written yet (also when it is aborted because the
    /// guest listing failed).
    fn planned(&mut self, _desired: &DesiredState, _plan: &Plan) {}

    /// The plan has changes and the pass may write: what to run of it.
    fn approve(&mut self, _plan: &Plan) -> Approval {
        Approval::All
    }

    /// Before each level of the plan runs.
    fn before_level(&mut self, _index: usize) -> LevelGate {
        LevelGate::Continue
    }
}

/// The hooks of a plain pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {}

/// What a [`Hooks::approve`] lets run.
#[derive(Debug, Clone)]
pub enum Approval {
    /// The whole plan.
    All,
    /// Only `run`; the `held` actions are reported skipped as `held back: <reason>`.
    Part {
        /// What runs.
        run: Plan,
        /// What does not.
        held: Vec<Action>,
        /// Why not.
        reason: String,
    },
    /// Nothing, for this reason.
    Declined(String),
}

/// One whole pass over a revision's files: validate, observe and plan, then (when `mode` is
/// [`Mode::Apply`], the policy's mode too, and `hooks` approve) execute.
///
/// # Errors
/// See [`desired_state`] and [`resolve_secrets`]; PVE failures are recorded in the plan and
/// report, not returned.
#[allow(clippy::too_many_arguments, reason = "each is one input of the pass")]
pub async fn reconcile_once(
    ctx: &Context,
    files: &BTreeMap<String, String>,
    cluster: Option<&str>,
    mode: Mode,
    options: &PlanOptions,
    hooks: &mut (dyn Hooks + Send),
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<Pass, ReconcileError> {
    let mut desired = desired_state(files, cluster)?;
    // `[scope]`: a revision outside the operator's scope is invalid, before PVE is read.
    let outside = crate::scope::check_revision(&ctx.execute.scope, &desired, files).await;
    if outside.iter().any(Diagnostic::is_error) {
        return Err(ReconcileError::Invalid(outside));
    }
    if let Err(error) = resolve_secrets(&mut desired, files, &ctx.secrets) {
        let ReconcileError::Secrets(resolve) = &error else {
            return Err(error);
        };
        if !hooks.secrets_failed(resolve) {
            return Err(error);
        }
    }
    match resolve_snippets(&mut desired, files, &ctx.secrets, &ctx.snippets) {
        Err(ReconcileError::Secrets(resolve)) if hooks.secrets_failed(&resolve) => {}
        Err(error) => return Err(error),
        Ok(()) => {}
    }
    let plan = observe_and_plan_with(ctx, &desired, options).await;
    hooks.planned(&desired, &plan);
    let (report, withheld) =
        gate_and_execute(ctx, &desired, &plan, mode, hooks, progress, cancel).await;
    Ok(Pass {
        cluster: desired.cluster.clone(),
        plan,
        report,
        withheld,
        desired,
    })
}

/// The writing phase: nothing for a plan without changes, an aborted plan or a plan-only
/// pass; nothing, with the reason, in report mode or when the hooks decline; else what the
/// hooks approve, gated level by level.
async fn gate_and_execute(
    ctx: &Context,
    desired: &DesiredState,
    plan: &Plan,
    mode: Mode,
    hooks: &mut (dyn Hooks + Send),
    progress: &Progress,
    cancel: &CancellationToken,
) -> (Option<ApplyReport>, Option<String>) {
    if mode == Mode::Report || !plan.has_changes() || plan.aborted.is_some() {
        return (None, None);
    }
    if ctx.mode == Mode::Report {
        return (None, Some(REPORT_MODE.to_owned()));
    }
    let (run, held) = match hooks.approve(plan) {
        Approval::Declined(reason) => return (None, Some(reason)),
        Approval::All => (None, None),
        Approval::Part { run, held, reason } => (Some(run), Some((held, reason))),
    };
    let mut gate = |index: usize| hooks.before_level(index);
    let mut report = execute::apply(
        &ctx.pve,
        desired,
        run.as_ref().unwrap_or(plan),
        &ctx.execute,
        progress,
        &mut gate,
        cancel,
    )
    .await;
    if let Some((held, reason)) = held {
        let reason = format!("held back: {reason}");
        report
            .results
            .extend(execute::skip_all(&held, &reason, progress));
    }
    (Some(report), None)
}
