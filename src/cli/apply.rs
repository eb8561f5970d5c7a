//! `proxops apply`: plan, confirm, apply, report. `-n`/`--dry-run` is `plan`.
//!
//! The pass is the one pipeline (`reconcile_once`); this command's hooks print the plan
//! and ask before the first write. In report mode (`[policy] mode = "report"`) nothing is
//! written and the command says which setting stops it.
//!
//! Exit codes: 0 when every action succeeded (or nothing was to do, or the operator
//! declined), 1 when any failed or could not be attempted, when report mode withheld the
//! writes, or on error.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use proxops_core::plan::Plan;
use proxops_core::repository::DesiredState;
use tokio_util::sync::CancellationToken;

use crate::cli::Exit;
use crate::cli::pass::PassArgs;
use crate::execute::{self, Progress};
use crate::output;
use crate::reconcile::{self, Approval, Hooks, Mode};

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
    let json = args.pass.json;
    let total = Arc::new(AtomicUsize::new(0));
    let progress: Progress = if json {
        Arc::new(|_| {})
    } else {
        let counter = Arc::new(AtomicUsize::new(0));
        let total = total.clone();
        Arc::new(move |event: &execute::Event| {
            output::print_progress(event, &counter, total.load(Ordering::SeqCst));
        })
    };
    let mut hooks = ApplyHooks {
        json,
        yes: args.yes,
        total,
        declined: false,
        error: None,
    };
    let result = reconcile::reconcile_once(
        &prepared.context,
        &prepared.files,
        prepared.cluster.as_deref(),
        Mode::Apply,
        &prepared.plan,
        &mut hooks,
        &progress,
        &CancellationToken::new(),
    )
    .await;
    if let Some(error) = hooks.error {
        return Err(error);
    }
    let pass = result.map_err(output::reconcile_error)?;
    if json {
        output::print_json(&pass)?;
    }
    if hooks.declined {
        output::note("nothing applied");
        return Ok(Exit::Success);
    }
    if let Some(reason) = &pass.withheld {
        output::note(reason);
        return Ok(Exit::Failure);
    }
    let Some(report) = &pass.report else {
        // Nothing could be written because PVE's guest listing failed: not a success.
        return Ok(if pass.plan.aborted.is_some() {
            Exit::Failure
        } else {
            Exit::Success
        });
    };
    if !json {
        output::print_apply_summary(report);
    }
    Ok(if report.is_success() {
        Exit::Success
    } else {
        Exit::Failure
    })
}

/// Prints the plan as soon as it is made and asks before the first write.
struct ApplyHooks {
    json: bool,
    yes: bool,
    /// Actions in the plan, for the progress lines.
    total: Arc<AtomicUsize>,
    declined: bool,
    /// Asking failed: no terminal to ask on, or reading the answer failed.
    error: Option<anyhow::Error>,
}

impl Hooks for ApplyHooks {
    fn planned(&mut self, desired: &DesiredState, plan: &Plan) {
        self.total.store(plan.actions().count(), Ordering::SeqCst);
        if !self.json {
            output::print_planned(plan, desired.cluster.as_deref());
        }
    }

    fn approve(&mut self, _plan: &Plan) -> Approval {
        if self.yes {
            return Approval::All;
        }
        let answer = if std::io::stdin().is_terminal() {
            output::confirm("apply this plan?")
        } else {
            Err(anyhow::anyhow!(
                "refusing to apply without --yes: stdin is not a terminal to confirm on"
            ))
        };
        match answer {
            Ok(true) => Approval::All,
            Ok(false) => {
                self.declined = true;
                Approval::Declined("the operator declined".to_owned())
            }
            Err(error) => {
                self.error = Some(error);
                Approval::Declined("not confirmed".to_owned())
            }
        }
    }
}
