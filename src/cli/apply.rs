//! `proxops apply`: plan, confirm, apply, report. `-n`/`--dry-run` is `plan`.
//!
//! Exit codes: 0 when every action succeeded (or nothing was to do), 1 when any failed or
//! could not be attempted, or on error.

use std::io::IsTerminal;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cli::Exit;
use crate::cli::pass::PassArgs;
use crate::execute::{self, Progress};
use crate::output;
use crate::reconcile::{self, Pass};

/// Arguments of `proxops apply`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pass: PassArgs,
    /// Apply without asking (required when stdin is not a terminal).
    #[arg(long, short = 'y')]
    yes: bool,
    /// Only show the plan (the Go ProxOps spelling of `plan`).
    #[arg(long, short = 'n')]
    dry_run: bool,
}

/// Plans, asks, applies.
pub async fn run(args: &Args) -> anyhow::Result<Exit> {
    if args.dry_run {
        return crate::cli::plan::run_pass(&args.pass).await;
    }
    let prepared = args.pass.prepare()?;
    let ctx = &prepared.context;
    let mut desired = reconcile::desired_state(&prepared.files, prepared.cluster.as_deref())
        .map_err(output::reconcile_error)?;
    reconcile::resolve_secrets(&mut desired, &prepared.files, &ctx.secrets)
        .map_err(output::reconcile_error)?;
    let plan = reconcile::observe_and_plan_with(ctx, &desired, &prepared.plan).await;
    let mut pass = Pass {
        cluster: desired.cluster.clone(),
        plan,
        report: None,
    };
    if !args.pass.json {
        output::print_plan(&pass);
    }
    if !pass.plan.has_changes() {
        if args.pass.json {
            output::print_json(&pass)?;
        }
        // Nothing could be written because PVE's guest listing failed: not a success.
        return Ok(if pass.plan.aborted.is_some() {
            Exit::Failure
        } else {
            Exit::Success
        });
    }
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            anyhow::bail!("refusing to apply without --yes: stdin is not a terminal to confirm on");
        }
        if !output::confirm("apply this plan?")? {
            output::note("nothing applied");
            return Ok(Exit::Success);
        }
    }
    let progress: Progress = if args.pass.json {
        Arc::new(|_| {})
    } else {
        let total = pass.plan.actions().count();
        let counter = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        Arc::new(move |event: &execute::Event| output::print_progress(event, &counter, total))
    };
    let cancel = CancellationToken::new();
    let report = execute::apply(
        &ctx.pve,
        &desired,
        &pass.plan,
        &ctx.execute,
        &progress,
        &cancel,
    )
    .await;
    let success = report.is_success();
    pass.report = Some(report);
    if args.pass.json {
        output::print_json(&pass)?;
    } else if let Some(report) = &pass.report {
        output::print_apply_summary(report);
    }
    Ok(if success {
        Exit::Success
    } else {
        Exit::Failure
    })
}
