//! `proxops check --config FILE [PATH]`: connect to PVE and check, before anything is applied,
//! that the node, storages (with their content types), bridges and token privileges the
//! manifests and the current plan need are there. Logic in [`crate::check`].
//!
//! Output: a checklist (`ok` / `PROBLEM` with what to do / `skipped` / `warning`), or `--json`.
//! A warning (the agent works with a feature less) does not fail the check. Exit codes:
//! 0 when every check passes, 1 otherwise.

use std::io::Write;

use std::sync::Arc;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::check::{self, Inputs, Report, Status};
use crate::cli::Exit;
use crate::cli::pass::PassArgs;
use crate::config::AgentConfig;
use crate::output;
use crate::reconcile::{self, Hooks, Mode};
use crate::secrets::resolve::ResolveError;

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
    // Secrets are resolved like a pass would (so the plan compares the real keys), but a
    // failure is a checklist problem rather than the end of the check.
    let mut hooks = CheckHooks::default();
    let no_progress: crate::execute::Progress = Arc::new(|_| {});
    let planned = reconcile::reconcile_once(
        &prepared.context,
        &prepared.files,
        prepared.cluster.as_deref(),
        Mode::Report,
        &prepared.plan,
        &mut hooks,
        &no_progress,
        &CancellationToken::new(),
    )
    .await
    .map_err(output::reconcile_error)?;
    let guests = planned.desired.manifest.cloud_init_refs().count();
    let secrets = (guests > 0).then(|| hooks.secrets_error.map_or(Ok(guests), Err));
    Ok(check::run(Inputs {
        pve: &prepared.context.pve,
        token_id: &config.pve.token_id,
        pve_url: &config.pve.url,
        scope: &prepared.context.scope,
        desired: Some(&planned.desired),
        plan: Some(&planned.plan),
        secrets,
        safety_net: &check::safety_net::SafetyNet::from_config(&config),
    })
    .await)
}

/// `check` goes on when a secret reference does not resolve, and reports it.
#[derive(Default)]
struct CheckHooks {
    secrets_error: Option<String>,
}

impl Hooks for CheckHooks {
    fn secrets_failed(&mut self, error: &ResolveError) -> bool {
        self.secrets_error = Some(crate::error_chain::error_text(error));
        true
    }
}

fn print_report(report: &Report) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    for item in &report.items {
        let mark = match item.status {
            Status::Ok => "ok     ",
            Status::Problem => "PROBLEM",
            Status::Skipped => "skipped",
            Status::Warning => "warning",
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
    let warnings = report
        .items
        .iter()
        .filter(|i| i.status == Status::Warning)
        .count();
    if problems == 0 && warnings > 0 {
        writeln!(
            out,
            "all checks passed ({warnings} {})",
            if warnings == 1 { "warning" } else { "warnings" }
        )?;
    } else if problems == 0 {
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
