//! The output sink: the only module that writes to stdout or stderr (commands return data).
//!
//! Human text for people, `--json` for machines. Errors are printed once, with their whole
//! cause chain, as `error: <what>: <cause>: ...`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write;

use serde::Serialize;

use std::sync::atomic::{AtomicUsize, Ordering};

use proxops_core::plan::Plan;
use proxops_core::plan::render::render_human;

use crate::execute::{ApplyReport, Event, Outcome};
use crate::reconcile::{Pass, ReconcileError};
use crate::validate::Report;

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, value)?;
    writeln!(stdout)?;
    Ok(())
}

/// Diagnostics on stderr; the summary on stdout.
pub fn print_validation(report: &Report) {
    for diagnostic in &report.diagnostics {
        eprintln!("{diagnostic}");
    }
    let errors = report.diagnostics.iter().filter(|d| d.is_error()).count();
    let warnings = report.diagnostics.len() - errors;
    for state in &report.states {
        let prefix = state
            .cluster
            .as_ref()
            .map(|c| format!("cluster {c}: "))
            .unwrap_or_default();
        println!(
            "{prefix}{} resources in {} files, {} levels",
            state.resources, state.files, state.levels
        );
    }
    if !report.valid {
        eprintln!(
            "error: {errors} {} found; nothing of this revision would be applied",
            plural(errors, "problem", "problems")
        );
    } else if warnings > 0 {
        eprintln!("{warnings} {}", plural(warnings, "warning", "warnings"));
    }
}

/// Prints an operational error with its cause chain on stderr.
pub fn print_error(error: &anyhow::Error) {
    eprintln!("error: {error:#}");
}

fn plural<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}

/// Prints a pass's plan (human view).
pub fn print_plan(pass: &Pass) {
    print_planned(&pass.plan, pass.cluster.as_deref());
}

/// Prints a pass's plan (human view) with what `net` runs before each action (`proxops
/// plan`: `snapshot first`, `backed up to <storage> first`).
pub fn print_plan_with_safety_net(pass: &Pass, net: &crate::check::safety_net::SafetyNet) {
    let notes = |action: &proxops_core::plan::Action| {
        net.first(action, &pass.desired)
            .map(|first| first.describe())
            .into_iter()
            .collect()
    };
    print!(
        "{}",
        proxops_core::plan::render::render_human_noted(&pass.plan, &pass.title(), &notes)
    );
}

/// Prints a plan made for `cluster` (human view).
pub fn print_planned(plan: &Plan, cluster: Option<&str>) {
    print!("{}", render_human(plan, &crate::reconcile::title(cluster)));
}

/// Prints one line per progress event: `[i/n] verb resource on node: state`.
pub fn print_progress(event: &Event, counter: &AtomicUsize, total: usize) {
    match event {
        Event::Started { action } => {
            let i = counter.fetch_add(1, Ordering::SeqCst) + 1;
            println!(
                "[{i}/{total}] {} {} on {}: started",
                action.verb.name(),
                action.resource,
                action.node
            );
        }
        Event::TaskStarted { action, upid } => {
            println!(
                "      {} {} on {}: running {upid}",
                action.verb.name(),
                action.resource,
                action.node
            );
        }
        Event::Finished { result } => {
            let a = &result.action;
            let what = format!("{} {} on {}", a.verb.name(), a.resource, a.node);
            match &result.outcome {
                Outcome::Succeeded { exitstatus, .. } => {
                    println!("      {what}: ok ({exitstatus})")
                }
                Outcome::Failed { error, .. } => println!("      {what}: FAILED: {error}"),
                Outcome::Skipped { reason } => println!("      {what}: skipped: {reason}"),
            }
            if let Some(backup) = &result.backup {
                match &backup.volid {
                    Some(volid) => println!("      {what}: backed up first to {volid}"),
                    None => println!("      {what}: backed up first ({})", backup.upid),
                }
            }
        }
    }
}

/// Prints the closing line of an apply.
pub fn print_apply_summary(report: &ApplyReport) {
    let (ok, failed, skipped) = report.counts();
    println!("apply: {ok} succeeded, {failed} failed, {skipped} skipped");
}

/// Asks a yes/no question on the terminal; only `y`/`yes` is yes.
pub fn confirm(question: &str) -> anyhow::Result<bool> {
    print!("{question} [y/N] ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

/// One line of a command's answer on stdout (`proxops freeze`).
pub fn print_line(text: &str) {
    println!("{text}");
}

/// A short note on stderr.
pub fn note(text: &str) {
    eprintln!("note: {text}");
}

/// Turns a reconcile error into the error `main` prints; an invalid revision's diagnostics
/// are printed first, in full.
pub fn reconcile_error(error: ReconcileError) -> anyhow::Error {
    if let ReconcileError::Invalid(diagnostics) = &error {
        for diagnostic in diagnostics {
            eprintln!("{diagnostic}");
        }
    }
    anyhow::Error::new(error)
}

/// Prints `proxops status`.
pub fn print_status(status: &crate::http::StatusJson) {
    println!("node {}", status.node);
    let pass = |p: &Option<crate::http::PassJson>| match p {
        Some(p) => format!(
            "{} ({}, {} trigger, {})",
            p.commit.as_deref().unwrap_or("-"),
            p.outcome.as_deref().unwrap_or("running"),
            p.trigger,
            p.ended_at.as_deref().unwrap_or(&p.started_at)
        ),
        None => "none".to_owned(),
    };
    println!("last applied:   {}", pass(&status.last_applied));
    println!("last attempted: {}", pass(&status.last_attempted));
    if let Some(enforced) = &status.enforced_commit {
        println!("in force:       {enforced}");
    }
    if let Some(invalid) = &status.head_invalid {
        print!("{}", invalid_head_text(invalid));
    }
    if status.desired_stale {
        println!(
            "DESIRED STATE IS STALE: {}",
            status.last_error.as_deref().unwrap_or("git fetch failing")
        );
    }
    if let Some(error) = status
        .last_attempted
        .as_ref()
        .and_then(|p| p.error.as_deref())
        .filter(|_| status.head_invalid.is_none())
    {
        println!("last attempt failed: {error}");
    }
    if let Some(breaker) = status.write_breaker.as_ref().filter(|b| b.read_only) {
        println!(
            "READ-ONLY: write circuit breaker {}{}",
            breaker.state,
            breaker
                .open_until
                .as_deref()
                .map(|t| format!(" until {t}"))
                .unwrap_or_default()
        );
    }
    let writes = &status.writes;
    if let Some(f) = &writes.frozen {
        println!(
            "FROZEN by {} since {}{}{}",
            f.who,
            f.since,
            f.until.as_deref().map_or_else(
                || " until proxops unfreeze".to_owned(),
                |t| format!(" until {t}")
            ),
            if f.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", f.reason)
            }
        );
    }
    println!("writes: {}", writes.line());
    if let Some(open) = &status.approval.open {
        println!("{}", open.headline());
    }
    for window in &writes.windows {
        println!("  {window} (UTC)");
    }
    if let Some(p) = &status.last_force_push {
        println!(
            "last force-push: {} replaced {} (seen {})",
            p.commit.as_deref().unwrap_or("-"),
            p.previous_commit.as_deref().unwrap_or("-"),
            p.started_at
        );
    }
    println!("open drift findings: {}", status.open_findings);
}

/// The invalid-HEAD state for people: the sentence, then each diagnostic on its own line
/// (`path:line:col: error: field: message`, with its `help:` below). A HEAD refused without
/// diagnostics has its reason in the sentence.
pub fn invalid_head_text(invalid: &crate::agent::status::InvalidHead) -> String {
    let mut text = format!("{}\n", invalid.summary);
    for d in &invalid.diagnostics {
        text.push_str(&format!("  {}\n", d.rendered));
        if let Some(help) = &d.help {
            text.push_str(&format!("    help: {help}\n"));
        }
    }
    text
}

/// Prints `proxops drift`.
pub fn print_drift(drift: &crate::http::DriftListJson) {
    if drift.open.is_empty() {
        println!("no open drift findings");
    }
    for d in &drift.open {
        println!(
            "! {} {} on {}: {} (since {})",
            d.kind, d.resource, d.node, d.message, d.first_seen_at
        );
    }
    for d in &drift.resolved {
        println!(
            "  resolved {} {} {} on {} at {} ({})",
            d.kind,
            d.resource,
            d.field,
            d.node,
            d.resolved_at.as_deref().unwrap_or("-"),
            d.resolved_how.as_deref().unwrap_or("-")
        );
    }
}

#[cfg(test)]
mod tests {
    use proxops_core::diagnostic::Diagnostic;

    use super::*;
    use crate::agent::status::InvalidHead;

    #[test]
    fn an_invalid_head_reads_as_its_sentence_then_one_line_per_diagnostic_with_help() {
        let diagnostics = [
            Diagnostic::error("vm/web.yaml", 4, 3, "spec.memroy", "unknown field")
                .with_help("did you mean `memory`?"),
            Diagnostic::error("vm/web.yaml", 9, 1, "", "not a mapping"),
        ];
        let invalid = InvalidHead::new(
            "1a2b3c4d5e",
            "the revision is invalid",
            &diagnostics,
            Some(("4d5e6f7a8b", true)),
        );
        assert_eq!(
            invalid_head_text(&invalid),
            "HEAD 1a2b3c4 is invalid (2 errors); enforcing 4d5e6f7, last applied\n\
             \x20 vm/web.yaml:4:3: error: spec.memroy: unknown field\n\
             \x20   help: did you mean `memory`?\n\
             \x20 vm/web.yaml:9:1: error: not a mapping\n"
        );
    }
}
