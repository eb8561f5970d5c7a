//! The demo's printer: every line `proxops demo` writes goes through here (plans through
//! `crate::output::print_plan`), in the style of `crate::output`. Nothing printed here ever
//! holds a secret: the values come from the store, the status API and PVE's answers, none of
//! which carry one.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;

use proxops_store::{ActionId, ActionOutcome, ActionRecord, PassSummary};

use crate::http::{PassJson, StatusJson};

/// A step heading: `== [i/n] title`.
pub(crate) fn step(i: usize, n: usize, title: &str) {
    println!();
    println!("== [{i}/{n}] {title}");
}

/// An indented line of information.
pub(crate) fn info(text: &str) {
    println!("   {text}");
}

/// A plain line.
pub(crate) fn line(text: &str) {
    println!("{text}");
}

/// What has been printed of each action so far (0 nothing, 1 started, 2 task, 3 result).
#[derive(Debug, Default)]
pub(crate) struct Progress {
    shown: BTreeMap<ActionId, (usize, u8)>,
    total: usize,
}

impl Progress {
    /// A progress printer for a pass expected to run `total` actions.
    pub(crate) fn new(total: usize) -> Self {
        Self {
            shown: BTreeMap::new(),
            total,
        }
    }

    /// Prints what is new in `actions` since the last call, as `proxops apply` does:
    /// `[i/n] verb resource on node: started`, then its task, then its result.
    pub(crate) fn update(&mut self, actions: &[ActionRecord]) {
        for action in actions {
            let next = self.shown.len() + 1;
            let (index, stage) = *self.shown.entry(action.id).or_insert((next, 0));
            let what = format!("{} {} on {}", action.verb, action.resource, action.node);
            let total = self.total.max(index);
            let mut reached = stage;
            if reached < 1 {
                println!("   [{index}/{total}] {what}: started");
                reached = 1;
            }
            if reached < 2
                && let Some(upid) = &action.upid
            {
                println!("         {what}: running {upid}");
                reached = 2;
            }
            if reached < 3
                && let Some(outcome) = &action.outcome
            {
                match outcome {
                    ActionOutcome::Succeeded { exitstatus } if exitstatus.is_empty() => {
                        println!("         {what}: ok");
                    }
                    ActionOutcome::Succeeded { exitstatus } => {
                        println!("         {what}: ok ({exitstatus})");
                    }
                    ActionOutcome::Failed { error } => println!("         {what}: FAILED: {error}"),
                    ActionOutcome::Skipped { reason } => {
                        println!("         {what}: skipped: {reason}");
                    }
                }
                reached = 3;
            }
            self.shown.insert(action.id, (index, reached));
        }
    }
}

/// The record of a finished pass, as the store holds it.
pub(crate) fn pass_record(pass: &PassSummary) {
    let c = pass.counts;
    println!(
        "   recorded: pass {} ({} trigger) on commit {}: {}: {} succeeded, {} failed, {} skipped, {} findings",
        pass.id.0,
        pass.trigger.as_str(),
        short(pass.commit.as_deref().unwrap_or("-")),
        pass.outcome.map_or("running", |o| o.as_str()),
        c.actions_ok,
        c.actions_failed,
        c.actions_skipped,
        c.findings,
    );
}

/// What the agent found and did about it, action by action, with the reason it planned each.
pub(crate) fn corrections(actions: &[ActionRecord]) {
    for action in actions {
        let result = action.outcome.as_ref().map_or("unfinished", |o| o.as_str());
        println!(
            "   drift found: {} {} on {}, because {}: {result}",
            action.verb, action.resource, action.node, action.reason
        );
    }
}

/// `/api/v1/revisions` and `/api/v1/status` as the agent answers them.
pub(crate) fn records(passes: &[PassJson], status: &StatusJson) {
    for p in passes.iter().rev() {
        println!(
            "   pass {}  {:<8} {}  {:<9} {} ok, {} failed, {} skipped, {} findings  ({} .. {})",
            p.id,
            p.trigger,
            short(p.commit.as_deref().unwrap_or("-")),
            p.outcome.as_deref().unwrap_or("running"),
            p.actions_ok,
            p.actions_failed,
            p.actions_skipped,
            p.findings,
            p.started_at,
            p.ended_at.as_deref().unwrap_or("-"),
        );
    }
    let applied = status.last_applied.as_ref().map_or_else(
        || "none".to_owned(),
        |p| {
            format!(
                "{} (pass {})",
                short(p.commit.as_deref().unwrap_or("-")),
                p.id
            )
        },
    );
    println!(
        "   status: node {}, last applied {applied}, open drift findings {}",
        status.node, status.open_findings
    );
}

/// The first 12 characters of a commit id.
pub(crate) fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}
