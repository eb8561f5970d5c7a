//! Passes: one row per reconcile attempt on a node, with its revision, trigger, times,
//! outcome and counts. This is where "what did this node last apply, and what did it last
//! try?" is answered (STYLE.md H6: last attempted vs last applied revision).
//!
//! A pass is begun before anything is done and finished with its outcome; one left
//! unfinished by a crash is marked interrupted by [`Store::recover_unfinished`] when the
//! agent starts again. Nothing here decides an outcome.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use proxops_core::diagnostic::Diagnostic;
use rusqlite::{OptionalExtension, Row, params};

use super::pass_notes::{BreakerMark, PassNotes, raw_notes};
use super::{ALL_NODES, Result, Store, from_millis, redact, to_millis};

/// The id of a recorded pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PassId(pub i64);

impl fmt::Display for PassId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pass {}", self.0)
    }
}

/// What started a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The poll interval or cron schedule.
    Poll,
    /// A signed push webhook.
    Webhook,
    /// The pass the agent runs as soon as it starts.
    Startup,
    /// `proxops apply`.
    Cli,
    /// SIGHUP (configuration reloaded).
    Signal,
}

impl Trigger {
    /// The stored and displayed name.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Poll => "poll",
            Trigger::Webhook => "webhook",
            Trigger::Startup => "startup",
            Trigger::Cli => "cli",
            Trigger::Signal => "signal",
        }
    }
}

impl FromStr for Trigger {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "poll" => Trigger::Poll,
            "webhook" => Trigger::Webhook,
            "startup" => Trigger::Startup,
            "cli" => Trigger::Cli,
            "signal" => Trigger::Signal,
            _ => return Err(s.to_owned()),
        })
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassOutcome {
    /// Actions ran and all succeeded: PVE now matches the revision.
    Applied,
    /// PVE already matched the revision; nothing was written.
    NoChange,
    /// Fetching, observing or an action failed.
    Failed,
    /// The revision did not validate; nothing was applied (see its diagnostics).
    Invalid,
    /// The agent stopped (SIGTERM, crash) before the pass ended.
    Interrupted,
    /// `[source] verify` refused the revision: a commit without a good signature by an
    /// allowed key (the pass's error note names it and why); nothing of it was applied.
    /// Stored as `invalid` with the `unverified` flag (schema `V_UNVERIFIED`): SQLite cannot
    /// widen the `outcome` CHECK without rebuilding the table.
    Unverified,
}

impl PassOutcome {
    /// The stored and displayed name.
    pub fn as_str(self) -> &'static str {
        match self {
            PassOutcome::Applied => "applied",
            PassOutcome::NoChange => "no-change",
            PassOutcome::Failed => "failed",
            PassOutcome::Invalid => "invalid",
            PassOutcome::Interrupted => "interrupted",
            PassOutcome::Unverified => "unverified",
        }
    }

    /// Whether PVE matched the pass's revision when it ended.
    pub fn is_applied(self) -> bool {
        matches!(self, PassOutcome::Applied | PassOutcome::NoChange)
    }
}

impl FromStr for PassOutcome {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "applied" => PassOutcome::Applied,
            "no-change" => PassOutcome::NoChange,
            "failed" => PassOutcome::Failed,
            "invalid" => PassOutcome::Invalid,
            "interrupted" => PassOutcome::Interrupted,
            "unverified" => PassOutcome::Unverified,
            _ => return Err(s.to_owned()),
        })
    }
}

impl fmt::Display for PassOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a pass did, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassCounts {
    /// Actions that succeeded.
    pub actions_ok: u32,
    /// Actions that failed.
    pub actions_failed: u32,
    /// Actions not attempted.
    pub actions_skipped: u32,
    /// Findings reported.
    pub findings: u32,
}

/// One recorded pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassSummary {
    /// Its id.
    pub id: PassId,
    /// The node it was for (`*` for a cluster-wide agent).
    pub node: String,
    /// The revision (git commit) it worked on, when one was fetched.
    pub commit: Option<String>,
    /// What started it.
    pub trigger: Trigger,
    /// When it started.
    pub started_at: SystemTime,
    /// When it ended; `None` while it runs.
    pub ended_at: Option<SystemTime>,
    /// How it ended; `None` while it runs.
    pub outcome: Option<PassOutcome>,
    /// What it did.
    pub counts: PassCounts,
    /// What it noticed: force-push, stale desired state, why it failed, the write breaker.
    pub notes: PassNotes,
    /// The revision whose desired state the pass observed and enforced, when it got that
    /// far: `commit` itself when it validated, the last valid revision when `commit` was
    /// invalid (`outcome` is then `invalid`). `None` for passes recorded before schema
    /// version 3, and for passes that enforced nothing.
    pub enforced: Option<Enforced>,
    /// The diagnostics that made `commit` invalid (empty otherwise).
    pub diagnostics: Vec<Diagnostic>,
}

/// What a pass enforced and how that ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enforced {
    /// The commit whose desired state was enforced.
    pub commit: String,
    /// How enforcing it ended (`applied`, `no-change`, `failed`, `interrupted`).
    pub outcome: Option<PassOutcome>,
}

impl PassSummary {
    /// The commit whose desired state the pass enforced: the recorded one, or, for passes
    /// recorded before schema version 3, the pass's own commit when PVE was reconciled to it
    /// (outcome `applied`, `no-change` or `failed`).
    pub fn enforced_commit(&self) -> Option<&str> {
        match &self.enforced {
            Some(enforced) => Some(&enforced.commit),
            None => match self.outcome {
                Some(PassOutcome::Applied | PassOutcome::NoChange | PassOutcome::Failed) => {
                    self.commit.as_deref()
                }
                _ => None,
            },
        }
    }

    /// Whether the pass's own commit was invalid while another revision was enforced.
    pub fn enforced_other(&self) -> bool {
        self.enforced
            .as_ref()
            .is_some_and(|e| Some(e.commit.as_str()) != self.commit.as_deref())
    }
}

/// The word `passes.outcome` holds: `unverified` is stored as `invalid` with the
/// `unverified` flag set (the CHECK of version 1 does not know the word).
pub(crate) fn stored_outcome(outcome: PassOutcome) -> &'static str {
    match outcome {
        PassOutcome::Unverified => PassOutcome::Invalid.as_str(),
        other => other.as_str(),
    }
}

pub(crate) const PASS_COLUMNS: &str = "id, node, revision, trigger_kind, started_at, ended_at, outcome, \
     actions_ok, actions_failed, actions_skipped, findings, previous_revision, force_pushed, \
     desired_stale, source_error, error, write_breaker, enforced_revision, enforced_outcome, \
     diagnostics, unverified";

/// A pass row as read, before its names are parsed.
struct RawPass {
    summary: PassSummary,
    trigger: String,
    outcome: Option<String>,
    write_breaker: Option<String>,
    enforced_revision: Option<String>,
    enforced_outcome: Option<String>,
    diagnostics: Option<String>,
    unverified: bool,
}

fn raw_pass(row: &Row<'_>) -> rusqlite::Result<RawPass> {
    let count = |i| row.get::<_, u32>(i);
    let (notes, write_breaker) = raw_notes(row, 11)?;
    Ok(RawPass {
        summary: PassSummary {
            id: PassId(row.get(0)?),
            node: row.get(1)?,
            commit: row.get(2)?,
            trigger: Trigger::Poll,
            started_at: from_millis(row.get(4)?),
            ended_at: row.get::<_, Option<i64>>(5)?.map(from_millis),
            outcome: None,
            counts: PassCounts {
                actions_ok: count(7)?,
                actions_failed: count(8)?,
                actions_skipped: count(9)?,
                findings: count(10)?,
            },
            notes,
            enforced: None,
            diagnostics: Vec::new(),
        },
        trigger: row.get(3)?,
        outcome: row.get(6)?,
        write_breaker,
        enforced_revision: row.get(17)?,
        enforced_outcome: row.get(18)?,
        diagnostics: row.get(19)?,
        unverified: row.get(20)?,
    })
}

impl Store {
    /// Records the start of a pass and returns its id.
    ///
    /// # Errors
    /// When the row cannot be written.
    pub fn begin_pass(
        &mut self,
        node: &str,
        commit: Option<&str>,
        trigger: Trigger,
        started_at: SystemTime,
    ) -> Result<PassId> {
        self.conn
            .execute(
                "INSERT INTO passes (node, revision, trigger_kind, started_at) \
                 VALUES (?1, ?2, ?3, ?4)",
                params![node, commit, trigger.as_str(), to_millis(started_at)],
            )
            .map_err(self.query_error("recording the start of a pass"))?;
        Ok(PassId(self.conn.last_insert_rowid()))
    }

    /// Records how a pass ended.
    ///
    /// # Errors
    /// When the pass does not exist or already ended.
    pub fn finish_pass(
        &mut self,
        id: PassId,
        outcome: PassOutcome,
        counts: PassCounts,
        ended_at: SystemTime,
    ) -> Result<()> {
        let operation = "recording the end of a pass";
        let query_error = self.query_error(operation);
        let finish = |conn: &rusqlite::Connection| {
            conn.execute(
                "UPDATE passes SET outcome = ?2, ended_at = ?3, actions_ok = ?4, \
                 actions_failed = ?5, actions_skipped = ?6, findings = ?7 \
                 WHERE id = ?1 AND outcome IS NULL",
                params![
                    id.0,
                    stored_outcome(outcome),
                    to_millis(ended_at),
                    counts.actions_ok,
                    counts.actions_failed,
                    counts.actions_skipped,
                    counts.findings
                ],
            )
        };
        // Only an unverified pass names the flag (with the outcome, in one transaction), so
        // older schemas (tests) still record the others.
        let changed = if outcome == PassOutcome::Unverified {
            let tx = self.conn.transaction().map_err(&query_error)?;
            let changed = finish(&tx).map_err(&query_error)?;
            if changed == 1 {
                tx.execute("UPDATE passes SET unverified = 1 WHERE id = ?1", [id.0])
                    .map_err(&query_error)?;
            }
            tx.commit().map_err(&query_error)?;
            changed
        } else {
            finish(&self.conn).map_err(&query_error)?
        };
        if changed == 1 {
            return Ok(());
        }
        match self.pass(id)? {
            Some(_) => Err(self.already_finished(operation, id.to_string())),
            None => Err(self.not_found(operation, id.to_string())),
        }
    }

    /// Keeps the diagnostics that made a revision invalid (as JSON), for `status`.
    ///
    /// # Errors
    /// When the pass does not exist or the row cannot be written.
    pub fn record_invalid(&mut self, id: PassId, diagnostics: &[Diagnostic]) -> Result<()> {
        let operation = "recording the diagnostics of an invalid revision";
        let json = serde_json::to_string(diagnostics).map_err(self.encode_error(operation))?;
        let changed = self
            .conn
            .execute(
                "UPDATE passes SET diagnostics = ?2 WHERE id = ?1",
                params![id.0, redact(&json)],
            )
            .map_err(self.query_error(operation))?;
        if changed == 0 {
            return Err(self.not_found(operation, id.to_string()));
        }
        Ok(())
    }

    /// Records the revision whose desired state the pass enforced and how that ended: the
    /// pass's own commit when it validated, the last valid one when it did not.
    ///
    /// # Errors
    /// When the pass does not exist or the row cannot be written.
    pub fn note_enforced(
        &mut self,
        id: PassId,
        commit: &str,
        outcome: Option<PassOutcome>,
    ) -> Result<()> {
        let operation = "recording the revision a pass enforced";
        let changed = self
            .conn
            .execute(
                "UPDATE passes SET enforced_revision = ?2, enforced_outcome = ?3 WHERE id = ?1",
                params![id.0, commit, outcome.map(stored_outcome)],
            )
            .map_err(self.query_error(operation))?;
        if changed == 0 {
            return Err(self.not_found(operation, id.to_string()));
        }
        Ok(())
    }

    /// The latest pass on `node` that enforced a revision (see [`PassSummary::enforced_commit`]):
    /// the revision that stays in force while HEAD is invalid, after a restart too.
    ///
    /// # Errors
    /// When the query fails.
    pub fn last_enforced(&self, node: &str) -> Result<Option<PassSummary>> {
        let sql = format!(
            "SELECT {PASS_COLUMNS} FROM passes WHERE node IN (?1, ?2) AND (\
             enforced_revision IS NOT NULL OR (enforced_revision IS NULL AND revision IS NOT NULL \
             AND outcome IN ('applied', 'no-change', 'failed'))) ORDER BY id DESC LIMIT 1"
        );
        Ok(self
            .query_passes(
                "reading the last enforced revision",
                &sql,
                params![node, ALL_NODES],
            )?
            .pop())
    }

    /// The commits of `node`'s passes (fetched or enforced) that start with `prefix`
    /// (case-insensitive hex), newest first, each once: one is a match, several are an
    /// ambiguous prefix.
    ///
    /// # Errors
    /// When the query fails.
    pub fn commits_with_prefix(&self, node: Option<&str>, prefix: &str) -> Result<Vec<String>> {
        let operation = "looking up a revision";
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(Vec::new());
        }
        let pattern = format!("{}%", prefix.to_ascii_lowercase());
        let node = node.unwrap_or(ALL_NODES);
        let query_error = self.query_error(operation);
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT c FROM (SELECT revision AS c, id FROM passes WHERE (?2 = ?3 OR node IN (?2, ?3)) \
                 UNION ALL SELECT enforced_revision AS c, id FROM passes WHERE (?2 = ?3 OR node IN (?2, ?3))) \
                 WHERE c LIKE ?1 GROUP BY c ORDER BY max(id) DESC, c",
            )
            .map_err(&query_error)?;
        statement
            .query_map(params![pattern, node, ALL_NODES], |row| row.get(0))
            .map_err(&query_error)?
            .collect::<rusqlite::Result<Vec<String>>>()
            .map_err(&query_error)
    }

    /// The latest `limit` passes of `node` (or every node) that fetched or enforced
    /// `commit`, newest first.
    ///
    /// # Errors
    /// When the query fails.
    pub fn passes_of_commit(
        &self,
        node: Option<&str>,
        commit: &str,
        limit: usize,
    ) -> Result<Vec<PassSummary>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let node = node.unwrap_or(ALL_NODES);
        let sql = format!(
            "SELECT {PASS_COLUMNS} FROM passes WHERE (?2 = ?3 OR node IN (?2, ?3)) \
             AND (revision = ?1 OR enforced_revision = ?1) ORDER BY id DESC LIMIT ?4"
        );
        self.query_passes(
            "listing the passes of a revision",
            &sql,
            params![commit, node, ALL_NODES, limit],
        )
    }

    /// The diagnostics recorded for an invalid pass; `None` when none were recorded.
    ///
    /// # Errors
    /// When the pass does not exist or its stored JSON is unreadable.
    pub fn pass_diagnostics(&self, id: PassId) -> Result<Option<Vec<Diagnostic>>> {
        let operation = "reading the diagnostics of a pass";
        let stored: Option<Option<String>> = self
            .conn
            .query_row(
                "SELECT diagnostics FROM passes WHERE id = ?1",
                [id.0],
                |row| row.get(0),
            )
            .optional()
            .map_err(self.query_error(operation))?;
        let Some(stored) = stored else {
            return Err(self.not_found(operation, id.to_string()));
        };
        stored
            .map(|json| serde_json::from_str(&json).map_err(|_| self.corrupt(operation, json)))
            .transpose()
    }

    /// One pass by id.
    ///
    /// # Errors
    /// When the query fails or the row holds values this binary does not write.
    pub fn pass(&self, id: PassId) -> Result<Option<PassSummary>> {
        let sql = format!("SELECT {PASS_COLUMNS} FROM passes WHERE id = ?1");
        Ok(self
            .query_passes("reading a pass", &sql, params![id.0])?
            .pop())
    }

    /// The latest pass on `node` after which PVE matched its revision (outcome `applied` or
    /// `no-change`): the node's last applied revision. Invalid, failed and interrupted
    /// passes never replace it.
    ///
    /// # Errors
    /// When the query fails.
    pub fn last_applied(&self, node: &str) -> Result<Option<PassSummary>> {
        let sql = format!(
            "SELECT {PASS_COLUMNS} FROM passes WHERE node IN (?1, ?2) \
             AND outcome IN ('applied', 'no-change') ORDER BY id DESC LIMIT 1"
        );
        Ok(self
            .query_passes(
                "reading the last applied pass",
                &sql,
                params![node, ALL_NODES],
            )?
            .pop())
    }

    /// The latest pass on `node`, whatever its outcome, including one still running: the
    /// node's last attempted revision.
    ///
    /// # Errors
    /// When the query fails.
    pub fn last_attempted(&self, node: &str) -> Result<Option<PassSummary>> {
        let sql = format!(
            "SELECT {PASS_COLUMNS} FROM passes WHERE node IN (?1, ?2) ORDER BY id DESC LIMIT 1"
        );
        Ok(self
            .query_passes(
                "reading the last attempted pass",
                &sql,
                params![node, ALL_NODES],
            )?
            .pop())
    }

    /// The latest pass on `node` whose fetch found the branch force-pushed.
    ///
    /// # Errors
    /// When the query fails.
    pub fn last_force_pushed(&self, node: &str) -> Result<Option<PassSummary>> {
        let sql = format!(
            "SELECT {PASS_COLUMNS} FROM passes WHERE node IN (?1, ?2) AND force_pushed = 1 \
             ORDER BY id DESC LIMIT 1"
        );
        Ok(self
            .query_passes(
                "reading the last force-pushed pass",
                &sql,
                params![node, ALL_NODES],
            )?
            .pop())
    }

    /// The latest `limit` passes, newest first, on `node` or on every node.
    ///
    /// # Errors
    /// When the query fails.
    pub fn recent_passes(&self, node: Option<&str>, limit: usize) -> Result<Vec<PassSummary>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let operation = "listing recent passes";
        match node.filter(|n| *n != ALL_NODES) {
            Some(node) => {
                let sql = format!(
                    "SELECT {PASS_COLUMNS} FROM passes WHERE node IN (?1, ?2) \
                     ORDER BY id DESC LIMIT ?3"
                );
                self.query_passes(operation, &sql, params![node, ALL_NODES, limit])
            }
            None => {
                let sql = format!("SELECT {PASS_COLUMNS} FROM passes ORDER BY id DESC LIMIT ?1");
                self.query_passes(operation, &sql, params![limit])
            }
        }
    }

    /// Marks every pass left unfinished (the agent crashed or was killed) as interrupted at
    /// `now`, and gives their actions that never reached PVE's task stage a failed result.
    /// Actions with a recorded UPID are left open: [`Store::running_tasks`] lists them so
    /// the agent re-attaches instead of re-issuing them. Returns the passes recovered.
    ///
    /// # Errors
    /// When the rows cannot be written.
    pub fn recover_unfinished(&mut self, now: SystemTime) -> Result<Vec<PassId>> {
        let operation = "marking unfinished passes as interrupted";
        let query_error = self.query_error(operation);
        let tx = self.conn.transaction().map_err(&query_error)?;
        let ids = {
            let mut statement = tx
                .prepare("SELECT id FROM passes WHERE outcome IS NULL ORDER BY id")
                .map_err(&query_error)?;
            statement
                .query_map([], |row| row.get::<_, i64>(0))
                .map_err(&query_error)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(&query_error)?
        };
        let now = to_millis(now);
        for id in &ids {
            tx.execute(
                "UPDATE passes SET outcome = 'interrupted', ended_at = ?2 WHERE id = ?1",
                params![id, now],
            )
            .map_err(&query_error)?;
            // Sent or about to be sent when the agent stopped: whether PVE received it is
            // unknown, and the next pass observes PVE afresh anyway.
            tx.execute(
                "UPDATE actions SET result = 'failed', ended_at = ?2, \
                 error = 'the agent stopped before PVE answered' \
                 WHERE pass_id = ?1 AND result IS NULL AND upid IS NULL",
                params![id, now],
            )
            .map_err(&query_error)?;
        }
        tx.commit().map_err(&query_error)?;
        Ok(ids.into_iter().map(PassId).collect())
    }

    pub(crate) fn query_passes(
        &self,
        operation: &'static str,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<PassSummary>> {
        let query_error = self.query_error(operation);
        let mut statement = self.conn.prepare_cached(sql).map_err(&query_error)?;
        let raws = statement
            .query_map(params, raw_pass)
            .map_err(&query_error)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(&query_error)?;
        raws.into_iter()
            .map(|raw| {
                let mut summary = raw.summary;
                summary.trigger = raw
                    .trigger
                    .parse()
                    .map_err(|value: String| self.corrupt(operation, value))?;
                summary.outcome = raw
                    .outcome
                    .map(|o| {
                        o.parse()
                            .map_err(|value: String| self.corrupt(operation, value))
                    })
                    .transpose()?;
                if raw.unverified && summary.outcome == Some(PassOutcome::Invalid) {
                    summary.outcome = Some(PassOutcome::Unverified);
                }
                summary.notes.write_breaker = raw
                    .write_breaker
                    .map(|b| {
                        b.parse::<BreakerMark>()
                            .map_err(|value: String| self.corrupt(operation, value))
                    })
                    .transpose()?;
                if let Some(commit) = raw.enforced_revision {
                    let outcome = raw
                        .enforced_outcome
                        .map(|o| {
                            o.parse()
                                .map_err(|value: String| self.corrupt(operation, value))
                        })
                        .transpose()?;
                    summary.enforced = Some(Enforced { commit, outcome });
                }
                if let Some(json) = raw.diagnostics {
                    summary.diagnostics =
                        serde_json::from_str(&json).map_err(|_| self.corrupt(operation, json))?;
                }
                Ok(summary)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use proxops_core::diagnostic::Diagnostic;

    use super::*;
    use crate::StoreError;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
    }

    fn pass(store: &mut Store, node: &str, commit: &str, outcome: PassOutcome, t: u64) -> PassId {
        let id = store
            .begin_pass(node, Some(commit), Trigger::Poll, at(t))
            .unwrap();
        store
            .finish_pass(id, outcome, PassCounts::default(), at(t + 1))
            .unwrap();
        id
    }

    fn commit_of(summary: Option<PassSummary>) -> Option<String> {
        summary.and_then(|s| s.commit)
    }

    #[test]
    fn last_applied_and_last_attempted_are_answerable_per_node_after_mixed_outcomes() {
        let mut store = Store::memory().unwrap();
        pass(&mut store, "pve1", "aaa", PassOutcome::Applied, 0);
        pass(&mut store, "pve2", "aaa", PassOutcome::Failed, 1);
        pass(&mut store, "pve1", "bbb", PassOutcome::NoChange, 2);
        pass(&mut store, "pve1", "ccc", PassOutcome::Failed, 3);
        pass(&mut store, "pve2", "ccc", PassOutcome::Applied, 4);
        pass(&mut store, "pve1", "ddd", PassOutcome::Interrupted, 5);

        assert_eq!(
            commit_of(store.last_applied("pve1").unwrap()).as_deref(),
            Some("bbb")
        );
        assert_eq!(
            commit_of(store.last_attempted("pve1").unwrap()).as_deref(),
            Some("ddd")
        );
        assert_eq!(
            commit_of(store.last_applied("pve2").unwrap()).as_deref(),
            Some("ccc")
        );
        assert_eq!(
            commit_of(store.last_attempted("pve2").unwrap()).as_deref(),
            Some("ccc")
        );
        assert_eq!(store.last_applied("pve3").unwrap(), None);
        assert_eq!(store.last_attempted("pve3").unwrap(), None);

        let attempted = store.last_attempted("pve1").unwrap().unwrap();
        assert_eq!(attempted.outcome, Some(PassOutcome::Interrupted));
        assert_eq!(attempted.started_at, at(5));
        assert_eq!(attempted.ended_at, Some(at(6)));
    }

    #[test]
    fn an_invalid_pass_keeps_the_previous_applied_revision_as_last_applied() {
        let mut store = Store::memory().unwrap();
        pass(&mut store, "pve1", "good", PassOutcome::Applied, 0);
        let bad = store
            .begin_pass("pve1", Some("bad"), Trigger::Webhook, at(10))
            .unwrap();
        let diagnostics = [
            Diagnostic::error("vm/base/web.yaml", 3, 5, "spec.memory", "required")
                .with_help("add `memory: 2GiB`"),
        ];
        store.record_invalid(bad, &diagnostics).unwrap();
        store
            .finish_pass(bad, PassOutcome::Invalid, PassCounts::default(), at(11))
            .unwrap();

        assert_eq!(
            commit_of(store.last_applied("pve1").unwrap()).as_deref(),
            Some("good")
        );
        let attempted = store.last_attempted("pve1").unwrap().unwrap();
        assert_eq!(attempted.commit.as_deref(), Some("bad"));
        assert_eq!(attempted.outcome, Some(PassOutcome::Invalid));
        assert_eq!(attempted.trigger, Trigger::Webhook);
        let kept = store.pass_diagnostics(bad).unwrap().unwrap();
        assert_eq!(kept, diagnostics);
        assert_eq!(attempted.diagnostics, diagnostics);
        assert_eq!(
            kept[0].headline(),
            "vm/base/web.yaml:3:5: error: spec.memory: required"
        );
    }

    #[test]
    fn an_invalid_head_records_the_last_valid_revision_it_enforced_and_stays_last_enforced() {
        let mut store = Store::memory().unwrap();
        let good = pass(&mut store, "pve1", "aaa111", PassOutcome::Applied, 0);
        store
            .note_enforced(good, "aaa111", Some(PassOutcome::Applied))
            .unwrap();
        let bad = store
            .begin_pass("pve1", Some("bbb222"), Trigger::Poll, at(10))
            .unwrap();
        store
            .note_enforced(bad, "aaa111", Some(PassOutcome::Applied))
            .unwrap();
        store
            .finish_pass(bad, PassOutcome::Invalid, PassCounts::default(), at(11))
            .unwrap();

        let last = store.last_enforced("pve1").unwrap().unwrap();
        assert_eq!(last.id, bad);
        assert_eq!(last.enforced_commit(), Some("aaa111"));
        assert!(last.enforced_other());
        assert_eq!(
            last.enforced.as_ref().and_then(|e| e.outcome),
            Some(PassOutcome::Applied)
        );
        // The invalid HEAD is not the last applied revision; the enforced one still is.
        assert_eq!(
            commit_of(store.last_applied("pve1").unwrap()).as_deref(),
            Some("aaa111")
        );
        // A pass that enforced nothing (git failed, no revision) does not move it.
        let none = store
            .begin_pass("pve1", None, Trigger::Poll, at(20))
            .unwrap();
        store
            .finish_pass(none, PassOutcome::Failed, PassCounts::default(), at(21))
            .unwrap();
        assert_eq!(store.last_enforced("pve1").unwrap().unwrap().id, bad);
        assert_eq!(store.last_enforced("pve2").unwrap(), None);
    }

    #[test]
    fn a_revision_is_found_by_a_unique_prefix_of_its_fetched_or_enforced_commit() {
        let mut store = Store::memory().unwrap();
        let a = pass(&mut store, "pve1", "aaa111", PassOutcome::Applied, 0);
        store.note_enforced(a, "aaa111", None).unwrap();
        let b = pass(&mut store, "pve1", "aab222", PassOutcome::Invalid, 10);
        store.note_enforced(b, "aaa111", None).unwrap();
        assert_eq!(store.commits_with_prefix(None, "AAA").unwrap(), ["aaa111"]);
        assert_eq!(
            store.commits_with_prefix(Some("pve1"), "aa").unwrap(),
            ["aaa111", "aab222"]
        );
        assert!(store.commits_with_prefix(None, "zz'").unwrap().is_empty());
        assert!(store.commits_with_prefix(None, "").unwrap().is_empty());
        assert!(
            store
                .commits_with_prefix(Some("pve2"), "aa")
                .unwrap()
                .is_empty()
        );
        let ids: Vec<_> = store
            .passes_of_commit(None, "aaa111", 10)
            .unwrap()
            .iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(ids, [b, a]);
    }

    #[test]
    fn a_running_pass_is_the_last_attempted_but_not_the_last_applied() {
        let mut store = Store::memory().unwrap();
        pass(&mut store, "pve1", "aaa", PassOutcome::Applied, 0);
        store
            .begin_pass("pve1", Some("bbb"), Trigger::Poll, at(5))
            .unwrap();
        let attempted = store.last_attempted("pve1").unwrap().unwrap();
        assert_eq!(
            (attempted.commit.as_deref(), attempted.outcome),
            (Some("bbb"), None)
        );
        assert_eq!(
            commit_of(store.last_applied("pve1").unwrap()).as_deref(),
            Some("aaa")
        );
    }

    #[test]
    fn passes_of_a_cluster_wide_agent_count_for_every_node() {
        let mut store = Store::memory().unwrap();
        pass(&mut store, ALL_NODES, "aaa", PassOutcome::Applied, 0);
        assert_eq!(
            commit_of(store.last_applied("pve7").unwrap()).as_deref(),
            Some("aaa")
        );
        assert_eq!(store.recent_passes(Some("pve7"), 10).unwrap().len(), 1);
    }

    #[test]
    fn recent_passes_are_newest_first_filtered_by_node_and_limited() {
        let mut store = Store::memory().unwrap();
        for t in 0..5 {
            pass(
                &mut store,
                "pve1",
                &format!("c{t}"),
                PassOutcome::NoChange,
                t * 10,
            );
            pass(
                &mut store,
                "pve2",
                &format!("c{t}"),
                PassOutcome::NoChange,
                t * 10 + 1,
            );
        }
        let pve1: Vec<_> = store.recent_passes(Some("pve1"), 3).unwrap();
        let commits: Vec<_> = pve1.iter().filter_map(|p| p.commit.as_deref()).collect();
        assert_eq!(commits, ["c4", "c3", "c2"]);
        assert!(pve1.iter().all(|p| p.node == "pve1"));
        assert_eq!(store.recent_passes(None, 100).unwrap().len(), 10);
    }

    #[test]
    fn finishing_a_pass_records_its_counts_once() {
        let mut store = Store::memory().unwrap();
        let id = store
            .begin_pass("pve1", None, Trigger::Startup, at(0))
            .unwrap();
        let counts = PassCounts {
            actions_ok: 3,
            actions_failed: 1,
            actions_skipped: 2,
            findings: 4,
        };
        store
            .finish_pass(id, PassOutcome::Failed, counts, at(1))
            .unwrap();
        let summary = store.pass(id).unwrap().unwrap();
        assert_eq!(summary.counts, counts);
        assert_eq!(summary.commit, None);
        let again = store
            .finish_pass(id, PassOutcome::Applied, counts, at(2))
            .unwrap_err();
        assert!(
            matches!(again, StoreError::AlreadyFinished { .. }),
            "{again:?}"
        );
        let missing = store.finish_pass(PassId(99), PassOutcome::Applied, counts, at(2));
        assert!(matches!(missing, Err(StoreError::NotFound { .. })));
    }

    #[test]
    fn unfinished_passes_become_interrupted_at_startup() {
        let mut store = Store::memory().unwrap();
        let done = pass(&mut store, "pve1", "aaa", PassOutcome::Applied, 0);
        let crashed = store
            .begin_pass("pve1", Some("bbb"), Trigger::Poll, at(10))
            .unwrap();
        let recovered = store.recover_unfinished(at(100)).unwrap();
        assert_eq!(recovered, [crashed]);
        let summary = store.pass(crashed).unwrap().unwrap();
        assert_eq!(summary.outcome, Some(PassOutcome::Interrupted));
        assert_eq!(summary.ended_at, Some(at(100)));
        assert_eq!(
            store.pass(done).unwrap().unwrap().outcome,
            Some(PassOutcome::Applied)
        );
        assert!(store.recover_unfinished(at(200)).unwrap().is_empty());
        assert_eq!(
            commit_of(store.last_applied("pve1").unwrap()).as_deref(),
            Some("aaa")
        );
    }
}
