//! `proxops check --config FILE [PATH]`: connect to PVE and check, before anything is applied,
//! that the node, storages (with their content types), bridges and token privileges the
//! manifests and the current plan need are there. Logic in [`crate::check`].
//!
//! Output: a checklist (`ok` / `PROBLEM` with what to do / `skipped`), or `--json`. Exit codes:
//! 0 when every check passes, 1 otherwise.

use std::io::Write;

use anyhow::Context as _;

use crate::check::{self, Inputs, Report, Status};
use crate::cli::Exit;
use crate::cli::pass::PassArgs;
use crate::config::AgentConfig;
use crate::output;
use crate::reconcile;

/// Arguments of `proxops check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pass: PassArgs,
}

/// Runs the checks and prints the checklist.
pub async fn run(args: &Args) -> anyhow::Result<Exit> {
    let report = report(&args.pass).await?;
    if args.pass.json {
        output::print_json(&report)?;
    } else {
        print_report(&report)?;
    }
    Ok(if report.ok {
        Exit::Success
    } else {
        Exit::Failure
    })
}

/// Loads the config and repository like `plan`, plans (no writes) and checks.
pub async fn report(pass: &PassArgs) -> anyhow::Result<Report> {
    let config = AgentConfig::load(&pass.config)
        .with_context(|| format!("loading {}", pass.config.display()))?;
    let prepared = pass.prepare()?;
    let mut desired = match reconcile::desired_state(&prepared.files, prepared.cluster.as_deref()) {
        Ok(desired) => Some(desired),
        Err(error) => return Err(output::reconcile_error(error)),
    };
    // Resolved like a pass would (so the plan compares the real keys), but a failure is a
    // checklist problem rather than the end of the check.
    let secrets = desired.as_mut().and_then(|desired| {
        let guests = desired.manifest.cloud_init_refs().count();
        if guests == 0 {
            return None;
        }
        Some(
            reconcile::resolve_secrets(desired, &prepared.files, &prepared.context.secrets)
                .map(|()| guests)
                .map_err(|e| crate::observe::error_text(&e)),
        )
    });
    let plan = match &desired {
        Some(desired) => {
            Some(reconcile::observe_and_plan_with(&prepared.context, desired, &prepared.plan).await)
        }
        None => None,
    };
    Ok(check::run(Inputs {
        pve: &prepared.context.pve,
        token_id: &config.pve.token_id,
        scope: &prepared.context.scope,
        desired: desired.as_ref(),
        plan: plan.as_ref(),
        secrets,
    })
    .await)
}

fn print_report(report: &Report) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    for item in &report.items {
        let mark = match item.status {
            Status::Ok => "ok     ",
            Status::Problem => "PROBLEM",
            Status::Skipped => "skipped",
        };
        writeln!(
            out,
            "[{mark}] {} {}: {}",
            item.check, item.subject, item.detail
        )?;
        if let Some(fix) = &item.fix {
            writeln!(out, "          fix: {fix}")?;
        }
    }
    let problems = report
        .items
        .iter()
        .filter(|i| i.status == Status::Problem)
        .count();
    if problems == 0 {
        writeln!(out, "all checks passed")?;
    } else {
        writeln!(
            out,
            "{problems} {} found",
            if problems == 1 { "problem" } else { "problems" }
        )?;
    }
    Ok(())
}
