//! What is worth telling, derived from what a pass recorded: a pure function of the pass's
//! record ([`PassFacts`], read back from the store) and what a target was told before
//! ([`Memory`]). No clock is read here; the caller passes `now`.
//!
//! The rules, one per event:
//!
//! - `applied`: a pass with outcome `applied` (it wrote to PVE and every action succeeded).
//!   A pass with nothing to do says nothing.
//! - `failed`: a pass with outcome `failed`. The same failure again (same commit, same failed
//!   actions and errors, same note) is not announced again until a pass succeeds or the
//!   failure changes: an agent retrying with backoff does not page anyone each retry.
//! - `invalid`: a pass with outcome `invalid`, once per commit.
//! - `read-only`: the write circuit breaker is read-only after the pass and was not after
//!   the previous one.
//! - `stale`: git could not be fetched and the last good revision stayed in force, once
//!   until a fetch succeeds.
//! - `drift-found`: an open finding (any kind but `observe-failed`) of the store that was not
//!   announced before. The same open finding (node, resource, finding kind, field) is
//!   announced once, however many passes report it.
//! - `drift-resolved`: an announced finding that is no longer open and has stayed so for the
//!   target's `flap_window`; it is announced at the first pass after that. A finding that is
//!   found again within the window was never announced as resolved, so it is not announced as
//!   found again either: a flapping drift (found, resolved, found, …) is announced once, and
//!   its resolution once it really stays resolved. With `flap_window = "0s"` a resolution is
//!   announced by the pass that saw it.
//!
//! - `awaiting-approval`: actions wait for `proxops approve` (`[policy] approve`), once per
//!   held change (its digest): the same change held pass after pass, or rejected, is not
//!   announced again; a changed one (a new digest) is.
//!
//! On start the memory holds the findings already open in the store (they were announced,
//! or are older than the notifier), so a restart announces nothing twice.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::notify::config::EventKind;

/// One action of a pass, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionFact {
    /// `VM/web-1`.
    pub resource: String,
    /// The node it ran on.
    pub node: String,
    /// `create`, `update`, `start`, …
    pub verb: String,
    /// Why the planner chose it.
    pub reason: String,
    /// `succeeded`, `failed`, `skipped`, or `running` when it has no result.
    pub result: String,
    /// The error or skip reason.
    pub error: Option<String>,
    /// The PVE task, when one was started.
    pub upid: Option<String>,
    /// `safe`, `risky` or `destructive` (issue 19); `None` for actions recorded before.
    pub risk: Option<String>,
    /// The volume id of the backup taken before a delete (`[policy] backup_before_delete`).
    pub backup: Option<String>,
}

/// The identity of a finding across passes: (node, resource, finding kind, field).
pub type FindingKey = (String, String, String, String);

/// One finding, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindingFact {
    /// The node.
    pub node: String,
    /// `VM/web-1`.
    pub resource: String,
    /// `drift`, `needs-reboot`, …
    pub kind: String,
    /// The field (empty for the whole resource).
    pub field: String,
    /// What git declares.
    pub desired: String,
    /// What PVE reports.
    pub observed: String,
    /// The explanation.
    pub message: String,
    /// How it was resolved (`corrected`, `gone`), for a resolved one.
    pub resolved_how: Option<String>,
}

impl FindingFact {
    /// Its identity across passes.
    pub fn key(&self) -> FindingKey {
        (
            self.node.clone(),
            self.resource.clone(),
            self.kind.clone(),
            self.field.clone(),
        )
    }
}

/// What one pass recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PassFacts {
    /// The pass's id in the store.
    pub pass: i64,
    /// The node label the pass is recorded under (`*` for a whole-cluster agent).
    pub node: String,
    /// The cluster followed, in composition mode.
    pub cluster: Option<String>,
    /// The commit applied or attempted.
    pub commit: Option<String>,
    /// `applied`, `no-change`, `failed`, `invalid`, `interrupted`.
    pub outcome: String,
    /// What started it: `startup`, `poll`, `webhook`, `signal`.
    pub trigger: String,
    /// Its actions, in the order they started.
    pub actions: Vec<ActionFact>,
    /// An invalid revision's diagnostics, each `path:line:col: error: field: message`.
    pub diagnostics: Vec<String>,
    /// The pass's error note (why it failed, what was held back).
    pub error: Option<String>,
    /// git could not be fetched: the revision is the last good one.
    pub stale: bool,
    /// The git error, when stale.
    pub source_error: Option<String>,
    /// The write circuit breaker is read-only after the pass.
    pub read_only: bool,
    /// The findings open in the store after the pass.
    pub open: Vec<FindingFact>,
    /// Findings resolved recently (most recent first), to say how an announced one went away.
    pub resolved: Vec<FindingFact>,
    /// The change held for approval after the pass, while nobody decided on it.
    pub awaiting: Option<AwaitingFact>,
}

/// A change held for approval (`[policy] approve`).
#[derive(Debug, Clone, PartialEq)]
pub struct AwaitingFact {
    /// The first pass that held it (the one `proxops approve` names).
    pub pass: i64,
    /// The digest of the held actions.
    pub digest: String,
    /// Why they are held (`destructive`, `bulk: …`).
    pub why: String,
    /// The held actions.
    pub actions: Vec<ActionFact>,
}

/// One thing to tell a target.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The pass that saw it.
    pub pass: i64,
    /// The node label.
    pub node: String,
    /// The cluster, in composition mode.
    pub cluster: Option<String>,
    /// The commit of the pass.
    pub commit: Option<String>,
    /// The pass's outcome.
    pub outcome: String,
    /// `applied`: every action; `failed`: every action, failed ones first.
    pub actions: Vec<ActionFact>,
    /// `drift-found`, `drift-resolved`: the findings concerned.
    pub findings: Vec<FindingFact>,
    /// `invalid`: the diagnostics.
    pub diagnostics: Vec<String>,
    /// `failed`, `stale`, `read-only`: why.
    pub error: Option<String>,
    /// `awaiting-approval`: the held change.
    pub approval: Option<AwaitingFact>,
}

/// What an announced finding is doing now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tracked {
    /// Open: announced as found.
    Open,
    /// Gone from the open findings since this time; announced as resolved once the flap
    /// window has passed.
    ResolvedSince(SystemTime, Box<FindingFact>),
}

/// What one target has been told; the state the rules above compare a pass with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    findings: BTreeMap<FindingKey, Tracked>,
    invalid_commit: Option<String>,
    failure: Option<String>,
    read_only: bool,
    stale: bool,
    /// The digest of the held change last announced.
    awaiting: Option<String>,
}

impl Memory {
    /// The memory of a notifier starting while `open` findings are already recorded: they
    /// count as announced.
    pub fn starting_with(open: &[FindingFact]) -> Self {
        Self {
            findings: open
                .iter()
                .filter(|f| counts_as_drift(f))
                .map(|f| (f.key(), Tracked::Open))
                .collect(),
            ..Self::default()
        }
    }

    /// The same memory, with the change held for approval under `digest` (already open in
    /// the store when the notifier starts) counted as announced.
    pub fn awaiting(mut self, digest: Option<String>) -> Self {
        self.awaiting = digest;
        self
    }
}

/// `observe-failed` says nobody could look, not that something differs.
fn counts_as_drift(finding: &FindingFact) -> bool {
    finding.kind != "observe-failed"
}

/// The events of one pass for a target with `flap_window`, and what the target will have
/// been told after them.
pub fn derive(
    memory: &Memory,
    facts: &PassFacts,
    now: SystemTime,
    flap_window: Duration,
) -> (Vec<Event>, Memory) {
    let mut next = memory.clone();
    let mut events = Vec::new();
    let event = |kind: EventKind| Event {
        kind,
        pass: facts.pass,
        node: facts.node.clone(),
        cluster: facts.cluster.clone(),
        commit: facts.commit.clone(),
        outcome: facts.outcome.clone(),
        actions: Vec::new(),
        findings: Vec::new(),
        diagnostics: Vec::new(),
        error: None,
        approval: None,
    };

    if let Some(held) = &facts.awaiting
        && memory.awaiting.as_deref() != Some(held.digest.as_str())
    {
        let mut e = event(EventKind::AwaitingApproval);
        e.actions.clone_from(&held.actions);
        e.approval = Some(held.clone());
        events.push(e);
    }
    next.awaiting = facts.awaiting.as_ref().map(|a| a.digest.clone());

    if facts.stale && !memory.stale {
        let mut e = event(EventKind::Stale);
        e.error.clone_from(&facts.source_error);
        events.push(e);
    }
    next.stale = facts.stale;

    match facts.outcome.as_str() {
        "applied" => {
            let mut e = event(EventKind::Applied);
            e.actions.clone_from(&facts.actions);
            events.push(e);
            next.failure = None;
            next.invalid_commit = None;
        }
        "no-change" => {
            next.failure = None;
            next.invalid_commit = None;
        }
        "failed" => {
            let signature = failure_signature(facts);
            if memory.failure.as_deref() != Some(signature.as_str()) {
                let mut e = event(EventKind::Failed);
                let (failed, rest): (Vec<_>, Vec<_>) = facts
                    .actions
                    .iter()
                    .cloned()
                    .partition(|a| a.result == "failed");
                e.actions = failed.into_iter().chain(rest).collect();
                e.error.clone_from(&facts.error);
                events.push(e);
            }
            next.failure = Some(signature);
            next.invalid_commit = None;
        }
        // An unverified revision (`[source] verify`) is refused like an invalid one; its
        // error says `unverified: <commit>: <why>`.
        "invalid" | "unverified" => {
            if memory.invalid_commit != facts.commit || memory.invalid_commit.is_none() {
                let mut e = event(EventKind::Invalid);
                e.diagnostics.clone_from(&facts.diagnostics);
                e.error.clone_from(&facts.error);
                events.push(e);
            }
            next.invalid_commit.clone_from(&facts.commit);
        }
        _ => {}
    }

    if facts.read_only && !memory.read_only {
        let mut e = event(EventKind::ReadOnly);
        e.error.clone_from(&facts.error);
        events.push(e);
    }
    next.read_only = facts.read_only;

    let open: BTreeMap<FindingKey, &FindingFact> = facts
        .open
        .iter()
        .filter(|f| counts_as_drift(f))
        .map(|f| (f.key(), f))
        .collect();
    let mut found = Vec::new();
    for (key, finding) in &open {
        match next.findings.get(key) {
            None => {
                found.push((*finding).clone());
                next.findings.insert(key.clone(), Tracked::Open);
            }
            // Flapping: found again within the window; it was never announced resolved.
            Some(Tracked::ResolvedSince(..)) => {
                next.findings.insert(key.clone(), Tracked::Open);
            }
            Some(Tracked::Open) => {}
        }
    }
    let mut resolved = Vec::new();
    let keys: Vec<FindingKey> = next.findings.keys().cloned().collect();
    for key in keys {
        if open.contains_key(&key) {
            continue;
        }
        let since = match next.findings.get(&key) {
            Some(Tracked::ResolvedSince(since, _)) => *since,
            _ => {
                let how = facts.resolved.iter().find(|r| r.key() == key).cloned();
                let fact = how.unwrap_or_else(|| FindingFact {
                    node: key.0.clone(),
                    resource: key.1.clone(),
                    kind: key.2.clone(),
                    field: key.3.clone(),
                    desired: String::new(),
                    observed: String::new(),
                    message: String::new(),
                    resolved_how: None,
                });
                next.findings
                    .insert(key.clone(), Tracked::ResolvedSince(now, Box::new(fact)));
                now
            }
        };
        if now.duration_since(since).unwrap_or_default() >= flap_window
            && let Some(Tracked::ResolvedSince(_, fact)) = next.findings.remove(&key)
        {
            resolved.push(*fact);
        }
    }
    if !found.is_empty() {
        let mut e = event(EventKind::DriftFound);
        e.findings = found;
        events.push(e);
    }
    if !resolved.is_empty() {
        let mut e = event(EventKind::DriftResolved);
        e.findings = resolved;
        events.push(e);
    }
    (events, next)
}

/// What makes two failed passes "the same failure".
fn failure_signature(facts: &PassFacts) -> String {
    let mut failed: Vec<String> = facts
        .actions
        .iter()
        .filter(|a| a.result == "failed")
        .map(|a| {
            format!(
                "{} {} {} {}",
                a.node,
                a.resource,
                a.verb,
                a.error.as_deref().unwrap_or("")
            )
        })
        .collect();
    failed.sort();
    format!(
        "{}\n{}\n{}",
        facts.commit.as_deref().unwrap_or(""),
        facts.error.as_deref().unwrap_or(""),
        failed.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(600);

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + seconds)
    }

    fn memory_drift() -> FindingFact {
        FindingFact {
            node: "pve1".into(),
            resource: "VM/web-1".into(),
            kind: "drift".into(),
            field: "memory".into(),
            desired: "512".into(),
            observed: "1024".into(),
            message: "memory differs".into(),
            resolved_how: None,
        }
    }

    fn facts(pass: i64, outcome: &str, open: Vec<FindingFact>) -> PassFacts {
        PassFacts {
            pass,
            node: "pve1".into(),
            commit: Some("c1".into()),
            outcome: outcome.into(),
            open,
            ..PassFacts::default()
        }
    }

    fn held(pass: i64, digest: &str) -> PassFacts {
        PassFacts {
            awaiting: Some(AwaitingFact {
                pass,
                digest: digest.into(),
                why: "destructive".into(),
                actions: Vec::new(),
            }),
            ..facts(pass, "no-change", Vec::new())
        }
    }

    #[test]
    fn a_held_change_is_announced_once_per_digest_and_again_when_it_changes() {
        let passes = [
            (1, held(1, "sha256:aa")),
            (2, held(2, "sha256:aa")),
            (3, held(3, "sha256:bb")),
            (4, facts(4, "applied", Vec::new())),
            (5, held(5, "sha256:bb")),
        ];
        let awaiting: Vec<bool> = run(&passes, Duration::ZERO)
            .iter()
            .map(|kinds| kinds.contains(&EventKind::AwaitingApproval))
            .collect();
        assert_eq!(awaiting, [true, false, true, false, true]);
        let seeded = Memory::default().awaiting(Some("sha256:aa".into()));
        let (events, _) = derive(&seeded, &held(6, "sha256:aa"), at(6), Duration::ZERO);
        assert!(events.is_empty(), "{events:?}");
    }

    fn kinds(events: &[Event]) -> Vec<EventKind> {
        events.iter().map(|e| e.kind).collect()
    }

    /// Runs passes in order, each at its time; the events of each.
    fn run(passes: &[(u64, PassFacts)], window: Duration) -> Vec<Vec<EventKind>> {
        let mut memory = Memory::default();
        passes
            .iter()
            .map(|(t, f)| {
                let (events, next) = derive(&memory, f, at(*t), window);
                memory = next;
                kinds(&events)
            })
            .collect()
    }

    #[test]
    fn an_open_drift_is_announced_once_however_many_passes_report_it() {
        let d = memory_drift();
        let got = run(
            &[
                (0, facts(1, "no-change", vec![d.clone()])),
                (60, facts(2, "no-change", vec![d.clone()])),
                (120, facts(3, "no-change", vec![d])),
            ],
            WINDOW,
        );
        assert_eq!(got, [vec![EventKind::DriftFound], vec![], vec![]]);
    }

    #[test]
    fn a_flapping_drift_is_announced_once_and_resolved_once_it_stays_resolved() {
        let d = memory_drift();
        let got = run(
            &[
                (0, facts(1, "no-change", vec![d.clone()])),
                (60, facts(2, "no-change", vec![])),
                (120, facts(3, "no-change", vec![d.clone()])),
                (180, facts(4, "no-change", vec![])),
                (240, facts(5, "no-change", vec![d])),
                (300, facts(6, "no-change", vec![])),
                // Still resolved, but not for the whole window yet.
                (899, facts(7, "no-change", vec![])),
                (900, facts(8, "no-change", vec![])),
                (960, facts(9, "no-change", vec![])),
            ],
            WINDOW,
        );
        let found: usize = got
            .iter()
            .flatten()
            .filter(|k| **k == EventKind::DriftFound)
            .count();
        assert_eq!(found, 1, "{got:?}");
        assert_eq!(got[7], [EventKind::DriftResolved], "{got:?}");
        assert!(got[8].is_empty() && got[6].is_empty(), "{got:?}");
    }

    #[test]
    fn with_a_zero_window_a_resolution_is_announced_by_the_pass_that_saw_it() {
        let d = memory_drift();
        let mut memory = Memory::default();
        let (_, next) = derive(
            &memory,
            &facts(1, "no-change", vec![d.clone()]),
            at(0),
            Duration::ZERO,
        );
        memory = next;
        let mut pass = facts(2, "applied", vec![]);
        pass.resolved = vec![FindingFact {
            resolved_how: Some("corrected".into()),
            ..d
        }];
        let (events, _) = derive(&memory, &pass, at(1), Duration::ZERO);
        assert_eq!(
            kinds(&events),
            [EventKind::Applied, EventKind::DriftResolved]
        );
        assert_eq!(
            events[1].findings[0].resolved_how.as_deref(),
            Some("corrected")
        );
    }

    #[test]
    fn findings_open_when_the_notifier_starts_are_not_announced_again() {
        let d = memory_drift();
        let memory = Memory::starting_with(std::slice::from_ref(&d));
        let (events, _) = derive(&memory, &facts(1, "no-change", vec![d]), at(0), WINDOW);
        assert!(events.is_empty(), "{events:?}");
    }

    #[test]
    fn observe_failed_is_not_drift() {
        let mut d = memory_drift();
        d.kind = "observe-failed".into();
        let got = run(&[(0, facts(1, "no-change", vec![d]))], WINDOW);
        assert_eq!(got, [Vec::<EventKind>::new()]);
    }

    #[test]
    fn the_same_failure_is_announced_once_and_again_after_a_success() {
        let mut failed = facts(1, "failed", vec![]);
        failed.actions = vec![ActionFact {
            resource: "VM/web-1".into(),
            node: "pve1".into(),
            verb: "update".into(),
            reason: "memory differs".into(),
            result: "failed".into(),
            error: Some("500 no space".into()),
            upid: None,
            risk: None,
            backup: None,
        }];
        let mut other = failed.clone();
        other.actions[0].error = Some("500 locked".into());
        let got = run(
            &[
                (0, failed.clone()),
                (5, failed.clone()),
                (10, other),
                (20, facts(4, "no-change", vec![])),
                (30, failed),
            ],
            WINDOW,
        );
        assert_eq!(
            got,
            [
                vec![EventKind::Failed],
                vec![],
                vec![EventKind::Failed],
                vec![],
                vec![EventKind::Failed]
            ]
        );
    }

    #[test]
    fn an_invalid_commit_is_announced_once_and_a_new_invalid_commit_again() {
        let mut a = facts(1, "invalid", vec![]);
        a.diagnostics = vec!["vm/a.yaml:3:1: error: spec.memory: not a size".into()];
        let mut b = a.clone();
        b.commit = Some("c2".into());
        let got = run(&[(0, a.clone()), (60, a), (120, b)], WINDOW);
        assert_eq!(
            got,
            [vec![EventKind::Invalid], vec![], vec![EventKind::Invalid]]
        );
    }

    #[test]
    fn an_unverified_commit_is_announced_once_like_an_invalid_one() {
        let mut a = facts(1, "unverified", vec![]);
        a.error = Some("unverified: c1: no signature".into());
        let mut b = a.clone();
        b.commit = Some("c2".into());
        let got = run(&[(0, a.clone()), (60, a), (120, b)], WINDOW);
        assert_eq!(
            got,
            [vec![EventKind::Invalid], vec![], vec![EventKind::Invalid]]
        );
    }

    #[test]
    fn read_only_and_stale_are_announced_when_they_begin() {
        let mut ro = facts(1, "failed", vec![]);
        ro.read_only = true;
        ro.error = Some("write circuit breaker opened".into());
        let mut stale = facts(2, "no-change", vec![]);
        stale.read_only = true;
        stale.stale = true;
        stale.source_error = Some("connection refused".into());
        let mut again = stale.clone();
        again.pass = 3;
        let got = run(&[(0, ro), (60, stale), (120, again)], WINDOW);
        assert_eq!(
            got,
            [
                vec![EventKind::Failed, EventKind::ReadOnly],
                vec![EventKind::Stale],
                vec![]
            ]
        );
    }

    #[test]
    fn a_pass_with_nothing_to_do_says_nothing() {
        assert_eq!(run(&[(0, facts(1, "no-change", vec![]))], WINDOW), [vec![]]);
    }
}
