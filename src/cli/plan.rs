//! `proxops plan` (also `diff`): what a pass would change, without writing to PVE.
//!
//! Exit codes: 0 no changes, 2 changes pending, 1 error (including an invalid revision).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cli::Exit;
use crate::cli::pass::PassArgs;
use crate::output;
use crate::reconcile::{self, Mode, NoHooks};

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
        output::print_json(&pass_result)?;
    } else {
        output::print_plan(&pass_result);
    }
    Ok(if pass_result.plan.aborted.is_some() {
        Exit::Failure
    } else if pass_result.plan.has_changes() {
        Exit::ChangesPending
    } else {
        Exit::Success
    })
}
