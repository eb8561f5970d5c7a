//! Approvals (issue 19, item 4): the actions a pass held for an operator's approval, with
//! their digest (`proxops_core::plan::digest`), and what became of them.
//!
//! One row per held change. A row is *open* while it is `awaiting`, `approved` or
//! `rejected`; at most one row per node is open. A pass that holds actions with the digest
//! of the open row extends it (`last_pass_id`); one that holds another digest closes it as
//! `lapsed` and opens a new one, so an approval never applies to a change it was not given
//! for; one that holds nothing closes it as `cleared` (the change was made, or the plan no
//! longer has it). The store decides nothing else: the agent asks [`Store::hold`] and runs
//! the held actions only when the open row is `approved`.

use std::fmt;
use std::time::SystemTime;

use rusqlite::{Row, params};

use super::{PassId, Result, Store, StoreError, from_millis, redact, to_millis};

/// The table (see `migrations.rs`, `V_APPROVALS`).
pub(crate) const SCHEMA: &str = r"
CREATE TABLE approvals (
    id              INTEGER PRIMARY KEY,
    node            TEXT    NOT NULL,
    pass_id         INTEGER NOT NULL,   -- the first pass that held this change
    last_pass_id    INTEGER NOT NULL,   -- the latest pass that held it
    digest          TEXT    NOT NULL,   -- `sha256:…` of the held actions
    actions         TEXT    NOT NULL,   -- JSON array of the held actions
    why             TEXT    NOT NULL,   -- which `[policy] approve` words held them
    since_at        INTEGER NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN
                        ('awaiting', 'approved', 'rejected', 'lapsed', 'cleared')),
    decided_by      TEXT,               -- the Unix user who approved or rejected
    decided_at      INTEGER,
    decision_reason TEXT,
    closed_at       INTEGER,
    closed_pass_id  INTEGER,
    CHECK ((decided_at IS NULL) = (decided_by IS NULL)),
    CHECK ((closed_at IS NULL) = (state IN ('awaiting', 'approved', 'rejected')))
) STRICT;
CREATE UNIQUE INDEX approvals_open ON approvals (node)
    WHERE state IN ('awaiting', 'approved', 'rejected');
CREATE INDEX approvals_by_pass ON approvals (pass_id, last_pass_id);
";

/// Where a held change stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalState {
    /// Held; nobody decided yet.
    Awaiting,
    /// An operator approved it: the next pass that holds the same digest runs it.
    Approved,
    /// An operator rejected it: it stays held until the plan changes.
    Rejected,
    /// A later pass held a different change: this one's decision no longer applies.
    Lapsed,
    /// A later pass held nothing: the change was made, or the plan no longer has it.
    Cleared,
}

impl ApprovalState {
    /// `awaiting`, `approved`, `rejected`, `lapsed` or `cleared`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Awaiting => "awaiting",
            ApprovalState::Approved => "approved",
            ApprovalState::Rejected => "rejected",
            ApprovalState::Lapsed => "lapsed",
            ApprovalState::Cleared => "cleared",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "awaiting" => ApprovalState::Awaiting,
            "approved" => ApprovalState::Approved,
            "rejected" => ApprovalState::Rejected,
            "lapsed" => ApprovalState::Lapsed,
            "cleared" => ApprovalState::Cleared,
            _ => return None,
        })
    }

    /// Whether the change is still held and may be decided on.
    pub fn is_open(self) -> bool {
        matches!(
            self,
            ApprovalState::Awaiting | ApprovalState::Approved | ApprovalState::Rejected
        )
    }
}

impl fmt::Display for ApprovalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One held change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRecord {
    /// Its row.
    pub id: i64,
    /// The node label of the passes that held it.
    pub node: String,
    /// The first pass that held it: the pass `proxops approve` names.
    pub pass: PassId,
    /// The latest pass that held it.
    pub last_pass: PassId,
    /// The digest of the held actions.
    pub digest: String,
    /// The held actions, as JSON (an array of actions with their risk).
    pub actions: String,
    /// Why they were held (`destructive`, `bulk: 25 actions, more than max_changes 20`, …).
    pub why: String,
    /// When the first pass held it.
    pub since: SystemTime,
    /// Where it stands.
    pub state: ApprovalState,
    /// Who approved or rejected it (a Unix user), and when, and why.
    pub decided: Option<(String, SystemTime)>,
    /// The operator's reason for the decision (may be empty).
    pub decision_reason: Option<String>,
    /// When and by which pass it lapsed or cleared.
    pub closed: Option<(SystemTime, PassId)>,
}

impl ApprovalRecord {
    /// Whether `pass` held this change.
    pub fn covers(&self, pass: PassId) -> bool {
        self.pass.0 <= pass.0 && pass.0 <= self.last_pass.0
    }
}

/// What [`Store::hold`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The open row for the held change (new, or the one extended).
    pub current: ApprovalRecord,
    /// The open row with another digest that this pass closed as lapsed.
    pub lapsed: Option<ApprovalRecord>,
}

const COLUMNS: &str = "id, node, pass_id, last_pass_id, digest, actions, why, since_at, state, \
     decided_by, decided_at, decision_reason, closed_at, closed_pass_id";

fn read_row(row: &Row<'_>) -> rusqlite::Result<(ApprovalRecord, String)> {
    let state: String = row.get(8)?;
    let decided_by: Option<String> = row.get(9)?;
    let decided_at: Option<i64> = row.get(10)?;
    let closed_at: Option<i64> = row.get(12)?;
    let closed_pass: Option<i64> = row.get(13)?;
    Ok((
        ApprovalRecord {
            id: row.get(0)?,
            node: row.get(1)?,
            pass: PassId(row.get(2)?),
            last_pass: PassId(row.get(3)?),
            digest: row.get(4)?,
            actions: row.get(5)?,
            why: row.get(6)?,
            since: from_millis(row.get(7)?),
            state: ApprovalState::Awaiting,
            decided: decided_by.zip(decided_at.map(from_millis)),
            decision_reason: row.get(11)?,
            closed: closed_at.map(from_millis).zip(closed_pass.map(PassId)),
        },
        state,
    ))
}

impl Store {
    fn approvals_where(
        &self,
        operation: &'static str,
        condition: &str,
        args: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<ApprovalRecord>> {
        let sql = format!("SELECT {COLUMNS} FROM approvals WHERE {condition} ORDER BY id DESC");
        let mut statement = self
            .conn
            .prepare(&sql)
            .map_err(self.query_error(operation))?;
        let rows = statement
            .query_map(args, read_row)
            .map_err(self.query_error(operation))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.query_error(operation))?;
        rows.into_iter()
            .map(|(mut record, state)| {
                record.state = ApprovalState::parse(&state).ok_or_else(|| StoreError::Corrupt {
                    path: self.path.clone(),
                    operation,
                    value: state,
                })?;
                Ok(record)
            })
            .collect()
    }

    /// The open held change of `node` (awaiting, approved or rejected), if any.
    ///
    /// # Errors
    /// When the rows cannot be read.
    pub fn open_approval(&self, node: &str) -> Result<Option<ApprovalRecord>> {
        Ok(self
            .approvals_where(
                "reading the open approval",
                "node = ?1 AND state IN ('awaiting', 'approved', 'rejected')",
                &[&node],
            )?
            .into_iter()
            .next())
    }

    /// The held change that `pass` held (the newest, if several), whatever became of it.
    ///
    /// # Errors
    /// When the rows cannot be read.
    pub fn approval_of_pass(&self, pass: PassId) -> Result<Option<ApprovalRecord>> {
        Ok(self
            .approvals_where(
                "reading a pass's approval",
                "pass_id <= ?1 AND last_pass_id >= ?1",
                &[&pass.0],
            )?
            .into_iter()
            .next())
    }

    /// The newest `limit` held changes of `node`, newest first: what every view shows of
    /// approvals that lapsed or cleared.
    ///
    /// # Errors
    /// When the rows cannot be read.
    pub fn recent_approvals(&self, node: &str, limit: u32) -> Result<Vec<ApprovalRecord>> {
        let mut all = self.approvals_where("reading recent approvals", "node = ?1", &[&node])?;
        all.truncate(limit as usize);
        Ok(all)
    }

    /// `pass` holds the actions `actions` (JSON) with `digest`, for `why`: extends the open
    /// row of `node` when it has the same digest; otherwise closes it as lapsed and opens a
    /// new one (`awaiting`).
    ///
    /// # Errors
    /// When the rows cannot be read or written.
    pub fn hold(
        &mut self,
        node: &str,
        pass: PassId,
        digest: &str,
        actions: &str,
        why: &str,
        now: SystemTime,
    ) -> Result<Held> {
        let operation = "recording actions held for approval";
        let open = self.open_approval(node)?;
        let query_error = self.query_error(operation);
        let tx = self.conn.transaction().map_err(&query_error)?;
        let mut lapsed = None;
        if let Some(open) = open {
            if open.digest == digest {
                tx.execute(
                    "UPDATE approvals SET last_pass_id = ?2 WHERE id = ?1",
                    params![open.id, pass.0.max(open.last_pass.0)],
                )
                .map_err(&query_error)?;
                tx.commit().map_err(&query_error)?;
                let current = ApprovalRecord {
                    last_pass: PassId(pass.0.max(open.last_pass.0)),
                    ..open
                };
                return Ok(Held {
                    current,
                    lapsed: None,
                });
            }
            tx.execute(
                "UPDATE approvals SET state = 'lapsed', closed_at = ?2, closed_pass_id = ?3 \
                 WHERE id = ?1",
                params![open.id, to_millis(now), pass.0],
            )
            .map_err(&query_error)?;
            lapsed = Some(ApprovalRecord {
                state: ApprovalState::Lapsed,
                closed: Some((now, pass)),
                ..open
            });
        }
        tx.execute(
            "INSERT INTO approvals (node, pass_id, last_pass_id, digest, actions, why, since_at, \
             state) VALUES (?1, ?2, ?2, ?3, ?4, ?5, ?6, 'awaiting')",
            params![node, pass.0, digest, actions, why, to_millis(now)],
        )
        .map_err(&query_error)?;
        let id = tx.last_insert_rowid();
        tx.commit().map_err(&query_error)?;
        let current = ApprovalRecord {
            id,
            node: node.to_owned(),
            pass,
            last_pass: pass,
            digest: digest.to_owned(),
            actions: actions.to_owned(),
            why: why.to_owned(),
            since: now,
            state: ApprovalState::Awaiting,
            decided: None,
            decision_reason: None,
            closed: None,
        };
        Ok(Held { current, lapsed })
    }

    /// `pass` holds nothing: the open row of `node`, if any, is closed as cleared.
    ///
    /// # Errors
    /// When the row cannot be written.
    pub fn clear_held(&mut self, node: &str, pass: PassId, now: SystemTime) -> Result<()> {
        self.conn
            .execute(
                "UPDATE approvals SET state = 'cleared', closed_at = ?2, closed_pass_id = ?3 \
                 WHERE node = ?1 AND state IN ('awaiting', 'approved', 'rejected')",
                params![node, to_millis(now), pass.0],
            )
            .map_err(self.query_error("clearing the approval of a pass that held nothing"))?;
        Ok(())
    }

    /// Records an operator's decision on the open row `id`: `approve` (the next pass with
    /// the same digest runs the actions) or not (rejected: they stay held). A later
    /// decision replaces an earlier one while the row is open.
    ///
    /// # Errors
    /// When the row is not open any more (`NotFound`), or cannot be written.
    pub fn decide_approval(
        &mut self,
        id: i64,
        approve: bool,
        who: &str,
        reason: &str,
        at: SystemTime,
    ) -> Result<()> {
        let operation = "recording an approval decision";
        let changed = self
            .conn
            .execute(
                "UPDATE approvals SET state = ?2, decided_by = ?3, decided_at = ?4, \
                 decision_reason = ?5 \
                 WHERE id = ?1 AND state IN ('awaiting', 'approved', 'rejected')",
                params![
                    id,
                    if approve { "approved" } else { "rejected" },
                    who,
                    to_millis(at),
                    redact(reason)
                ],
            )
            .map_err(self.query_error(operation))?;
        if changed == 0 {
            return Err(self.not_found(operation, format!("open approval {id}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actions::tests::at;
    use crate::migrations::{MIGRATIONS, V_APPROVALS};

    #[test]
    fn the_same_digest_extends_the_open_row_and_another_one_lapses_it() {
        let mut store = Store::memory().unwrap();
        let first = store
            .hold("pve1", PassId(3), "sha256:aa", "[]", "destructive", at(10))
            .unwrap();
        assert_eq!(first.lapsed, None);
        assert_eq!(first.current.state, ApprovalState::Awaiting);
        let again = store
            .hold("pve1", PassId(4), "sha256:aa", "[]", "destructive", at(20))
            .unwrap();
        assert_eq!(again.current.id, first.current.id);
        assert_eq!(again.current.last_pass, PassId(4));
        assert_eq!(again.current.since, at(10));
        assert!(
            store
                .approval_of_pass(PassId(4))
                .unwrap()
                .unwrap()
                .covers(PassId(3))
        );

        store
            .decide_approval(first.current.id, true, "alice", "ok", at(25))
            .unwrap();
        let changed = store
            .hold("pve1", PassId(5), "sha256:bb", "[]", "destructive", at(30))
            .unwrap();
        let lapsed = changed.lapsed.unwrap();
        assert_eq!(lapsed.id, first.current.id);
        assert_eq!(lapsed.state, ApprovalState::Lapsed);
        assert_eq!(changed.current.state, ApprovalState::Awaiting);
        let old = store.approval_of_pass(PassId(3)).unwrap().unwrap();
        assert_eq!(old.state, ApprovalState::Lapsed);
        assert_eq!(old.decided, Some(("alice".to_owned(), at(25))));
        assert_eq!(old.closed, Some((at(30), PassId(5))));
        assert_eq!(
            store.open_approval("pve1").unwrap().unwrap().digest,
            "sha256:bb"
        );
    }

    #[test]
    fn a_decision_is_recorded_and_a_closed_row_cannot_be_decided() {
        let mut store = Store::memory().unwrap();
        let held = store
            .hold("pve1", PassId(1), "sha256:aa", "[]", "risky", at(1))
            .unwrap();
        store
            .decide_approval(held.current.id, false, "bob", "not today", at(2))
            .unwrap();
        let open = store.open_approval("pve1").unwrap().unwrap();
        assert_eq!(open.state, ApprovalState::Rejected);
        assert_eq!(open.decision_reason.as_deref(), Some("not today"));
        store.clear_held("pve1", PassId(2), at(3)).unwrap();
        assert_eq!(store.open_approval("pve1").unwrap(), None);
        assert_eq!(
            store.approval_of_pass(PassId(1)).unwrap().unwrap().state,
            ApprovalState::Cleared
        );
        let error = store
            .decide_approval(held.current.id, true, "bob", "", at(4))
            .unwrap_err();
        assert!(matches!(error, StoreError::NotFound { .. }), "{error}");
    }

    #[test]
    fn nodes_have_their_own_open_row_and_recent_rows_come_newest_first() {
        let mut store = Store::memory().unwrap();
        store
            .hold("pve1", PassId(1), "sha256:aa", "[]", "bulk", at(1))
            .unwrap();
        store
            .hold("pve2", PassId(2), "sha256:aa", "[]", "bulk", at(1))
            .unwrap();
        store
            .hold("pve1", PassId(3), "sha256:cc", "[]", "bulk", at(2))
            .unwrap();
        let recent = store.recent_approvals("pve1", 5).unwrap();
        assert_eq!(
            recent.iter().map(|r| r.state).collect::<Vec<_>>(),
            [ApprovalState::Awaiting, ApprovalState::Lapsed]
        );
        assert!(store.open_approval("pve2").unwrap().is_some());
    }

    #[test]
    fn a_database_from_before_approvals_upgrades_with_its_passes_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let mine = MIGRATIONS
            .iter()
            .position(|script| *script == V_APPROVALS)
            .unwrap();
        let pass = {
            let mut store = Store::open_with(&path, &MIGRATIONS[..mine]).unwrap();
            store
                .begin_pass("pve1", Some("aaa"), crate::Trigger::Poll, at(1))
                .unwrap()
        };
        let mut store = Store::open(&path).unwrap();
        assert_eq!(
            store.schema_version().unwrap(),
            u32::try_from(MIGRATIONS.len()).unwrap()
        );
        assert_eq!(store.open_approval("pve1").unwrap(), None);
        store
            .hold("pve1", pass, "sha256:aa", "[]", "destructive", at(2))
            .unwrap();
        assert_eq!(store.approval_of_pass(pass).unwrap().unwrap().pass, pass);
    }
}
