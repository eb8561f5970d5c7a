//! `proxops plan` (also `diff`): what a pass would change, without writing to PVE.
//!
//! Exit codes: 0 no changes, 2 changes pending, 1 error (including an invalid revision).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use anyhow::Context as _;
use serde::Serialize;

use crate::check::safety_net::{Mark, SafetyNet};
use crate::cli::Exit;
use crate::cli::pass::PassArgs;
use crate::config::AgentConfig;
use crate::output;
use crate::reconcile::{self, Mode, NoHooks, Pass};

/// Arguments of `proxops plan`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pass: PassArgs,
}

/// Plans and prints.
pub async fn run(args: &Args) -> anyhow::Result<Exit> {
    run_pass(&args.pass).await
}

/// The plan pass itself, shared with `apply --dry-run`.
pub(crate) async fn run_pass(pass: &PassArgs) -> anyhow::Result<Exit> {
    let prepared = pass.prepare()?;
    let config = AgentConfig::load(&pass.config)
        .with_context(|| format!("loading {}", pass.config.display()))?;
    let net = SafetyNet::from_config(&config);
    let no_progress: crate::execute::Progress = Arc::new(|_| {});
    let result = reconcile::reconcile_once(
        &prepared.context,
        &prepared.files,
        prepared.cluster.as_deref(),
        Mode::Report,
        &prepared.plan,
        &mut NoHooks,
        &no_progress,
        &CancellationToken::new(),
    )
    .await;
    let pass_result = match result {
        Ok(pass_result) => pass_result,
        Err(error) => return Err(output::reconcile_error(error)),
    };
    if pass.json {
        output::print_json(&PlanJson {
            safety_net: net.marks(&pass_result.plan, &pass_result.desired),
            pass: &pass_result,
        })?;
    } else {
        output::print_plan_with_safety_net(&pass_result, &net);
    }
    Ok(if pass_result.plan.aborted.is_some() {
        Exit::Failure
    } else if pass_result.plan.has_changes() {
        Exit::ChangesPending
    } else {
        Exit::Success
    })
}

/// `plan --json`: the pass, plus what runs before its actions (`safety_net`: each action
/// that gets a snapshot or a backup first; absent when none does).
#[derive(Serialize)]
struct PlanJson<'a> {
    #[serde(flatten)]
    pass: &'a Pass,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    safety_net: Vec<Mark>,
}
