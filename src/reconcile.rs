//! One reconcile pass: the function `proxops plan`, `proxops apply` and (later) the agent all
//! call, so what the CLI shows is what the agent does.
//!
//! Phases, each named: `desired_state` (validate, pick the cluster) → `resolve_secrets` (the
//! cluster's SOPS document, for cloud-init references) → `observe` (PVE GETs) → `plan`
//! (pure) → `execute` (PVE writes). A revision with any validation error, or a reference that
//! does not resolve, is never applied: both fail before PVE is even read.

use std::collections::BTreeMap;
use std::time::Duration;

use proxops_core::diagnostic::Diagnostic;
use proxops_core::plan::{self, Creation, DEFAULT_MAX_PRUNE, Inventory, NodeScope, Plan, Policy};
use proxops_core::repository::{DesiredState, Layout};
use proxops_pve::{PveClient, WaitOptions};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::{AgentConfig, SecretsConfig};
use crate::execute::{self, ApplyReport, Progress};
use crate::observe;
use crate::secrets::resolve::{ResolveError, resolve_desired};

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
            },
            secrets: config.secrets.clone(),
        }
    }
}

/// The planner's policy and the inventory of owned guests, beyond the node scope.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// Delete owned guests no manifest declares (`[policy] prune`).
    pub prune: bool,
    /// At most this many prunes per pass (`[policy] max_prune`).
    pub max_prune: u32,
    /// Restart running guests to apply pending changes (`[policy] restart_on_change`).
    pub restart_on_change: bool,
    /// The owned guests as recorded by the agent's store; `None` (the CLI, which has no
    /// store) counts every observed guest with the ownership tag.
    pub inventory: Option<Inventory>,
    /// How owned guests were created (node, vmid, facts), as the agent's store recorded
    /// it: a changed clone source, CT template or disk image is then a requires-recreate
    /// finding. Empty for the CLI, which has no store.
    pub created: Vec<(String, u32, Creation)>,
}

impl Default for PlanOptions {
    /// Prune off, `max_prune` 3, no restarts, inventory from tags.
    fn default() -> Self {
        Self {
            prune: false,
            max_prune: DEFAULT_MAX_PRUNE,
            restart_on_change: false,
            inventory: None,
            created: Vec::new(),
        }
    }
}

/// Plan only, or plan and apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Observe and plan; never write.
    Plan,
    /// Observe, plan and apply the plan.
    Apply,
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
}

impl Pass {
    /// How the desired state is named in output.
    pub fn title(&self) -> String {
        self.cluster
            .as_ref()
            .map_or_else(|| "repository".to_owned(), |c| format!("cluster {c}"))
    }
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
    let observed = observe::observe(&ctx.pve, desired, &ctx.scope).await;
    let inventory = match &options.inventory {
        Some(inventory) => inventory.clone(),
        None => Inventory::from_tags(&observed),
    }
    .with_created(options.created.iter().cloned());
    let policy = Policy {
        scope: ctx.scope.clone(),
        prune: options.prune,
        max_prune: options.max_prune,
        restart_on_change: options.restart_on_change,
    };
    plan::plan(desired, &observed, &inventory, &policy)
}

/// One whole pass over a revision's files.
///
/// # Errors
/// See [`desired_state`] and [`resolve_secrets`]; PVE failures are recorded in the plan and
/// report, not returned.
pub async fn reconcile_once(
    ctx: &Context,
    files: &BTreeMap<String, String>,
    cluster: Option<&str>,
    mode: Mode,
    options: &PlanOptions,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<Pass, ReconcileError> {
    let mut desired = desired_state(files, cluster)?;
    resolve_secrets(&mut desired, files, &ctx.secrets)?;
    let plan = observe_and_plan_with(ctx, &desired, options).await;
    let report = match mode {
        Mode::Apply if plan.has_changes() => {
            Some(execute::apply(&ctx.pve, &desired, &plan, &ctx.execute, progress, cancel).await)
        }
        _ => None,
    };
    Ok(Pass {
        cluster: desired.cluster.clone(),
        plan,
        report,
    })
}
