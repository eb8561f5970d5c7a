//! Actions: what each pass asked PVE to do, the UPID of the task PVE started for it, and how
//! it ended.
//!
//! The UPID is recorded as soon as PVE returns it and before the wait starts, so an agent
//! killed mid-wait finds the task in [`Store::running_tasks`] when it starts again and
//! re-attaches to it instead of issuing the action a second time (a second download of the
//! same file would race the first and fail).

use std::fmt;
use std::time::SystemTime;

use proxops_core::plan::Action;
use proxops_core::plan::risk::{Risk, risk};
use proxops_core::resource::ResourceId;
use rusqlite::{OptionalExtension, Row, params};

use super::{ALL_NODES, PassId, Result, Store, from_millis, redact, to_millis};

/// The id of a recorded action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ActionId(pub i64);

impl fmt::Display for ActionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "action {}", self.0)
    }
}

/// How an action ended, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionOutcome {
    /// PVE did it.
    Succeeded {
        /// PVE's exit status (`OK`, `WARNINGS: n`); empty when no task was involved.
        exitstatus: String,
    },
    /// PVE refused it or its task failed.
    Failed {
        /// PVE's message or exit status.
        error: String,
    },
    /// Not attempted.
    Skipped {
        /// Why.
        reason: String,
    },
}

impl ActionOutcome {
    /// The stored name of the result.
    pub fn as_str(&self) -> &'static str {
        match self {
            ActionOutcome::Succeeded { .. } => "succeeded",
            ActionOutcome::Failed { .. } => "failed",
            ActionOutcome::Skipped { .. } => "skipped",
        }
    }
}

/// Keeps the inventory in step with a succeeded guest action, in the transaction that
/// records the result: an agent killed mid-pass (or a re-attached task ending after a
/// restart) must not leave a guest it created out of the inventory, or a deleted one in it.
/// Create, clone, update (an adopted guest is claimed by its first update) and promote own
/// the guest; delete releases it; a failed delete keeps it, so the next pass retries. This
/// is the only place the agent's inventory changes.
fn update_inventory(tx: &rusqlite::Transaction<'_>, action: ActionId) -> rusqlite::Result<()> {
    let (kind, name, node, verb, detail): (String, String, String, String, String) = tx.query_row(
        "SELECT resource_kind, resource_name, node, verb, detail FROM actions WHERE id = ?1",
        [action.0],
        |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        },
    )?;
    let vmid = serde_json::from_str::<serde_json::Value>(&detail)
        .ok()
        .and_then(|d| d["vmid"].as_i64());
    let Some(vmid) = vmid else {
        return Ok(());
    };
    match verb.as_str() {
        "create" | "clone" | "update" | "promote" => {
            tx.execute(
                "INSERT INTO inventory (node, vmid, resource_kind, resource_name) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (node, vmid) DO UPDATE SET \
                 resource_kind = excluded.resource_kind, resource_name = excluded.resource_name",
                params![node, vmid, kind, name],
            )?;
        }
        "delete" => {
            tx.execute(
                "DELETE FROM inventory WHERE node = ?1 AND vmid = ?2",
                params![node, vmid],
            )?;
        }
        _ => {}
    }
    Ok(())
}

/// A PVE task that was started and whose result was never recorded: after a crash, the
/// agent waits for it again instead of re-issuing its action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningTask {
    /// The action the task serves.
    pub action_id: ActionId,
    /// The pass that started it.
    pub pass_id: PassId,
    /// The resource concerned.
    pub resource: ResourceId,
    /// The node the task runs on.
    pub node: String,
    /// The verb's name (`download`, …).
    pub verb: String,
    /// PVE's task id.
    pub upid: String,
}

/// One recorded action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionRecord {
    /// Its id.
    pub id: ActionId,
    /// The pass it belongs to.
    pub pass_id: PassId,
    /// The resource concerned.
    pub resource: ResourceId,
    /// The node it ran on.
    pub node: String,
    /// The verb's name (`download`, …).
    pub verb: String,
    /// The verb with its parameters, as JSON (the plan's `--json` shape).
    pub detail: serde_json::Value,
    /// Why it was planned.
    pub reason: String,
    /// When it was sent.
    pub started_at: SystemTime,
    /// PVE's task id, once PVE started one.
    pub upid: Option<String>,
    /// When it ended; `None` while it runs.
    pub ended_at: Option<SystemTime>,
    /// How it ended; `None` while it runs.
    pub outcome: Option<ActionOutcome>,
    /// Its risk level; `None` for actions recorded before schema version 4.
    pub risk: Option<Risk>,
    /// The backup taken before it (a delete under `[policy] backup_before_delete`).
    pub backup_volid: Option<String>,
}

const ACTION_COLUMNS: &str = "id, pass_id, resource_kind, resource_name, node, verb, detail, \
     reason, started_at, upid, ended_at, result, exitstatus, error, risk, backup_volid";

/// An action row as read, before its names and JSON are parsed.
struct RawAction {
    id: i64,
    pass_id: i64,
    kind: String,
    name: String,
    node: String,
    verb: String,
    detail: String,
    reason: String,
    started_at: i64,
    upid: Option<String>,
    ended_at: Option<i64>,
    result: Option<String>,
    exitstatus: Option<String>,
    error: Option<String>,
    risk: Option<String>,
    backup_volid: Option<String>,
}

fn raw_action(row: &Row<'_>) -> rusqlite::Result<RawAction> {
    Ok(RawAction {
        id: row.get(0)?,
        pass_id: row.get(1)?,
        kind: row.get(2)?,
        name: row.get(3)?,
        node: row.get(4)?,
        verb: row.get(5)?,
        detail: row.get(6)?,
        reason: row.get(7)?,
        started_at: row.get(8)?,
        upid: row.get(9)?,
        ended_at: row.get(10)?,
        result: row.get(11)?,
        exitstatus: row.get(12)?,
        error: row.get(13)?,
        risk: row.get(14)?,
        backup_volid: row.get(15)?,
    })
}

impl Store {
    /// Records that `action` of `pass` is about to be sent to PVE.
    ///
    /// # Errors
    /// When the pass does not exist or the row cannot be written.
    pub fn record_action_started(
        &mut self,
        pass: PassId,
        action: &Action,
        at: SystemTime,
    ) -> Result<ActionId> {
        let operation = "recording the start of an action";
        let detail = serde_json::to_string(&action.verb).map_err(self.encode_error(operation))?;
        let inserted = self.conn.execute(
            "INSERT INTO actions (pass_id, resource_kind, resource_name, node, verb, detail, \
             reason, started_at, risk) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                pass.0,
                action.resource.kind.as_str(),
                action.resource.name,
                action.node,
                action.verb.name(),
                redact(&detail),
                redact(&action.reason),
                to_millis(at),
                risk(action).name()
            ],
        );
        match inserted {
            Ok(_) => Ok(ActionId(self.conn.last_insert_rowid())),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY =>
            {
                Err(self.not_found(operation, pass.to_string()))
            }
            Err(source) => Err(self.query_error(operation)(source)),
        }
    }

    /// Records the UPID of the task PVE started for an action. Call it before waiting for
    /// the task, so a restarted agent can re-attach.
    ///
    /// # Errors
    /// When the action does not exist or already has a result.
    pub fn record_task_started(
        &mut self,
        action: ActionId,
        upid: &str,
        at: SystemTime,
    ) -> Result<()> {
        let operation = "recording the task of an action";
        let changed = self
            .conn
            .execute(
                "UPDATE actions SET upid = ?2, task_started_at = ?3 \
                 WHERE id = ?1 AND result IS NULL",
                params![action.0, upid, to_millis(at)],
            )
            .map_err(self.query_error(operation))?;
        self.expect_one_open(operation, action, changed)
    }

    /// Records the volume id of the backup taken before `action` (a delete under
    /// `[policy] backup_before_delete`); it may already have its result.
    ///
    /// # Errors
    /// When the action does not exist or the row cannot be written.
    pub fn record_action_backup(&mut self, action: ActionId, volid: &str) -> Result<()> {
        let operation = "recording the backup of an action";
        let changed = self
            .conn
            .execute(
                "UPDATE actions SET backup_volid = ?2 WHERE id = ?1",
                params![action.0, redact(volid)],
            )
            .map_err(self.query_error(operation))?;
        if changed == 1 {
            Ok(())
        } else {
            Err(self.not_found(operation, action.to_string()))
        }
    }

    /// Records how an action ended.
    ///
    /// # Errors
    /// When the action does not exist or already has a result.
    pub fn record_action_result(
        &mut self,
        action: ActionId,
        outcome: &ActionOutcome,
        at: SystemTime,
    ) -> Result<()> {
        let operation = "recording the result of an action";
        let (exitstatus, error) = match outcome {
            ActionOutcome::Succeeded { exitstatus } => (Some(redact(exitstatus)), None),
            ActionOutcome::Failed { error } => (None, Some(redact(error))),
            ActionOutcome::Skipped { reason } => (None, Some(redact(reason))),
        };
        let query_error = self.query_error(operation);
        let tx = self.conn.transaction().map_err(&query_error)?;
        let changed = tx
            .execute(
                "UPDATE actions SET result = ?2, exitstatus = ?3, error = ?4, ended_at = ?5 \
                 WHERE id = ?1 AND result IS NULL",
                params![action.0, outcome.as_str(), exitstatus, error, to_millis(at)],
            )
            .map_err(&query_error)?;
        if changed == 1 && matches!(outcome, ActionOutcome::Succeeded { .. }) {
            update_inventory(&tx, action).map_err(&query_error)?;
        }
        tx.commit().map_err(&query_error)?;
        self.expect_one_open(operation, action, changed)
    }

    /// Tasks started on `node` (every node for `"*"`) whose result was never recorded,
    /// oldest first: what to re-attach to after a crash.
    ///
    /// # Errors
    /// When the query fails.
    pub fn running_tasks(&self, node: &str) -> Result<Vec<RunningTask>> {
        let sql = format!(
            "SELECT {ACTION_COLUMNS} FROM actions WHERE upid IS NOT NULL AND result IS NULL \
             AND (?1 = ?2 OR node = ?1) ORDER BY id"
        );
        let records =
            self.query_actions("listing running tasks", &sql, params![node, ALL_NODES])?;
        Ok(records
            .into_iter()
            .filter_map(|record| {
                Some(RunningTask {
                    action_id: record.id,
                    pass_id: record.pass_id,
                    upid: record.upid?,
                    resource: record.resource,
                    node: record.node,
                    verb: record.verb,
                })
            })
            .collect())
    }

    /// The actions of one pass, in the order they were started.
    ///
    /// # Errors
    /// When the query fails.
    pub fn actions_of(&self, pass: PassId) -> Result<Vec<ActionRecord>> {
        let sql = format!("SELECT {ACTION_COLUMNS} FROM actions WHERE pass_id = ?1 ORDER BY id");
        self.query_actions("listing the actions of a pass", &sql, params![pass.0])
    }

    fn expect_one_open(
        &self,
        operation: &'static str,
        action: ActionId,
        changed: usize,
    ) -> Result<()> {
        if changed == 1 {
            return Ok(());
        }
        let exists = self
            .conn
            .query_row(
                "SELECT 1 FROM actions WHERE id = ?1",
                [action.0],
                |_| Ok(()),
            )
            .optional()
            .map_err(self.query_error(operation))?
            .is_some();
        if exists {
            Err(self.already_finished(operation, action.to_string()))
        } else {
            Err(self.not_found(operation, action.to_string()))
        }
    }

    fn query_actions(
        &self,
        operation: &'static str,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<ActionRecord>> {
        let query_error = self.query_error(operation);
        let mut statement = self.conn.prepare_cached(sql).map_err(&query_error)?;
        let raws = statement
            .query_map(params, raw_action)
            .map_err(&query_error)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(&query_error)?;
        raws.into_iter()
            .map(|raw| self.action_record(operation, raw))
            .collect()
    }

    fn action_record(&self, operation: &'static str, raw: RawAction) -> Result<ActionRecord> {
        let kind = raw
            .kind
            .parse()
            .map_err(|_| self.corrupt(operation, raw.kind.clone()))?;
        let detail = serde_json::from_str(&raw.detail)
            .map_err(|_| self.corrupt(operation, raw.detail.clone()))?;
        let outcome = match raw.result.as_deref() {
            None => None,
            Some("succeeded") => Some(ActionOutcome::Succeeded {
                exitstatus: raw.exitstatus.unwrap_or_default(),
            }),
            Some("failed") => Some(ActionOutcome::Failed {
                error: raw.error.unwrap_or_default(),
            }),
            Some("skipped") => Some(ActionOutcome::Skipped {
                reason: raw.error.unwrap_or_default(),
            }),
            Some(other) => return Err(self.corrupt(operation, other)),
        };
        let risk = match raw.risk.as_deref() {
            None => None,
            Some(text) => Some(Risk::parse(text).ok_or_else(|| self.corrupt(operation, text))?),
        };
        Ok(ActionRecord {
            id: ActionId(raw.id),
            pass_id: PassId(raw.pass_id),
            resource: ResourceId::new(kind, raw.name),
            node: raw.node,
            verb: raw.verb,
            detail,
            reason: raw.reason,
            started_at: from_millis(raw.started_at),
            upid: raw.upid,
            ended_at: raw.ended_at.map(from_millis),
            outcome,
            risk,
            backup_volid: raw.backup_volid,
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use proxops_core::plan::{Checksum, Download, Verb};
    use proxops_core::resource::Kind;

    use super::*;
    use crate::{PassCounts, PassOutcome, StoreError, Trigger};

    pub(crate) fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
    }

    /// A download action, as the planner makes them.
    pub(crate) fn download(name: &str, node: &str, url: &str) -> Action {
        let filename = format!("{name}.iso");
        Action {
            resource: ResourceId::new(Kind::Iso, name),
            node: node.to_owned(),
            verb: Verb::Download(Download {
                storage: "local".to_owned(),
                content: "iso".to_owned(),
                volid: format!("local:iso/{filename}"),
                filename,
                url: url.to_owned(),
                checksum: Some(Checksum {
                    algorithm: "sha256".to_owned(),
                    value: "ab".repeat(32),
                }),
            }),
            reason: "absent from local on this node".to_owned(),
        }
    }

    #[test]
    fn running_tasks_are_listed_until_their_result_is_recorded() {
        let mut store = Store::memory().unwrap();
        let pass = store
            .begin_pass("pve1", Some("aaa"), Trigger::Poll, at(0))
            .unwrap();
        let iso = download("debian", "pve1", "https://example.org/debian.iso");
        let other = download("alpine", "pve2", "https://example.org/alpine.iso");
        let a = store.record_action_started(pass, &iso, at(1)).unwrap();
        let b = store.record_action_started(pass, &other, at(1)).unwrap();
        assert!(
            store.running_tasks("pve1").unwrap().is_empty(),
            "no task started yet"
        );

        let upid = "UPID:pve1:00001234:00005678:6553F000:download:debian.iso:root@pam:";
        store.record_task_started(a, upid, at(2)).unwrap();
        store
            .record_task_started(b, "UPID:pve2:1:2:3:download::root@pam:", at(2))
            .unwrap();
        let running = store.running_tasks("pve1").unwrap();
        assert_eq!(
            running,
            [RunningTask {
                action_id: a,
                pass_id: pass,
                resource: ResourceId::new(Kind::Iso, "debian"),
                node: "pve1".to_owned(),
                verb: "download".to_owned(),
                upid: upid.to_owned(),
            }]
        );
        assert_eq!(store.running_tasks(ALL_NODES).unwrap().len(), 2);

        let ok = ActionOutcome::Succeeded {
            exitstatus: "OK".to_owned(),
        };
        store.record_action_result(a, &ok, at(30)).unwrap();
        assert!(store.running_tasks("pve1").unwrap().is_empty());
        assert_eq!(store.running_tasks(ALL_NODES).unwrap().len(), 1);
        let again = store.record_action_result(a, &ok, at(31)).unwrap_err();
        assert!(
            matches!(again, StoreError::AlreadyFinished { .. }),
            "{again:?}"
        );
    }

    fn guest_action(name: &str, verb: Verb) -> Action {
        Action {
            resource: ResourceId::new(Kind::Vm, name),
            node: "pve2".to_owned(),
            verb,
            reason: "test".to_owned(),
        }
    }

    #[test]
    fn a_succeeded_create_enters_the_inventory_with_its_result_and_a_succeeded_delete_leaves_it() {
        let mut store = Store::memory().unwrap();
        let pass = store
            .begin_pass("*", Some("aaa"), Trigger::Poll, at(0))
            .unwrap();
        let create = guest_action(
            "web",
            Verb::Create(proxops_core::plan::Create {
                vmid: 1234,
                guest_type: proxops_core::guest::GuestType::Qemu,
                params: std::collections::BTreeMap::new(),
                grow: Vec::new(),
                after: Default::default(),
            }),
        );
        let failed = store.record_action_started(pass, &create, at(1)).unwrap();
        let refused = ActionOutcome::Failed {
            error: "500 injected".to_owned(),
        };
        store.record_action_result(failed, &refused, at(2)).unwrap();
        assert!(
            store.owned(None).unwrap().is_empty(),
            "a failed create owns nothing"
        );

        // The pass is killed before it ends: the result alone must carry the ownership.
        let created = store.record_action_started(pass, &create, at(3)).unwrap();
        let ok = ActionOutcome::Succeeded {
            exitstatus: "OK".to_owned(),
        };
        store.record_action_result(created, &ok, at(4)).unwrap();
        let owned = store.owned(None).unwrap();
        assert_eq!(owned.len(), 1);
        assert_eq!((owned[0].node.as_str(), owned[0].vmid), ("pve2", 1234));
        assert_eq!(owned[0].resource, ResourceId::new(Kind::Vm, "web"));

        let delete = guest_action(
            "web",
            Verb::Delete(proxops_core::plan::GuestRef {
                vmid: 1234,
                guest_type: proxops_core::guest::GuestType::Qemu,
            }),
        );
        let deleted = store.record_action_started(pass, &delete, at(5)).unwrap();
        store.record_action_result(deleted, &ok, at(6)).unwrap();
        assert!(store.owned(None).unwrap().is_empty());
    }

    #[test]
    fn running_tasks_survive_a_crash_and_recovery_of_their_pass() {
        let mut store = Store::memory().unwrap();
        let pass = store
            .begin_pass("pve1", Some("aaa"), Trigger::Poll, at(0))
            .unwrap();
        let waiting = store
            .record_action_started(pass, &download("a", "pve1", "https://x/a.iso"), at(1))
            .unwrap();
        store
            .record_task_started(waiting, "UPID:pve1:a", at(2))
            .unwrap();
        let unsent = store
            .record_action_started(pass, &download("b", "pve1", "https://x/b.iso"), at(3))
            .unwrap();

        store.recover_unfinished(at(100)).unwrap();

        let running = store.running_tasks("pve1").unwrap();
        assert_eq!(running.len(), 1);
        assert_eq!(running[0].action_id, waiting);
        let actions = store.actions_of(pass).unwrap();
        assert!(matches!(
            actions[1].outcome,
            Some(ActionOutcome::Failed { .. })
        ));
        assert_eq!(actions[1].id, unsent);

        // The re-attached wait ends; its result lands on the old, interrupted pass.
        let ok = ActionOutcome::Succeeded {
            exitstatus: "OK".to_owned(),
        };
        store.record_action_result(waiting, &ok, at(120)).unwrap();
        assert!(store.running_tasks("pve1").unwrap().is_empty());
        let summary = store.pass(pass).unwrap().unwrap();
        assert_eq!(summary.outcome, Some(PassOutcome::Interrupted));
    }

    #[test]
    fn actions_of_a_pass_keep_their_verb_detail_reason_and_result() {
        let mut store = Store::memory().unwrap();
        let pass = store
            .begin_pass("pve1", Some("aaa"), Trigger::Cli, at(0))
            .unwrap();
        let action = download("debian", "pve1", "https://example.org/debian.iso");
        let id = store.record_action_started(pass, &action, at(1)).unwrap();
        let failed = ActionOutcome::Failed {
            error: "task UPID:pve1:x failed: checksum mismatch".to_owned(),
        };
        store.record_action_result(id, &failed, at(5)).unwrap();
        let skipped = store
            .record_action_started(pass, &download("b", "pve1", "https://x/b.iso"), at(6))
            .unwrap();
        let skip = ActionOutcome::Skipped {
            reason: "ISO/debian is not ready on pve1".to_owned(),
        };
        store.record_action_result(skipped, &skip, at(6)).unwrap();
        store
            .finish_pass(pass, PassOutcome::Failed, PassCounts::default(), at(7))
            .unwrap();

        let records = store.actions_of(pass).unwrap();
        assert_eq!(records.len(), 2);
        let first = &records[0];
        assert_eq!(first.resource, action.resource);
        assert_eq!(first.verb, "download");
        assert_eq!(first.detail["verb"], "download");
        assert_eq!(first.detail["volid"], "local:iso/debian.iso");
        assert_eq!(first.reason, action.reason);
        assert_eq!((first.started_at, first.ended_at), (at(1), Some(at(5))));
        assert_eq!(first.outcome, Some(failed));
        assert_eq!(records[1].outcome, Some(skip));
    }

    #[test]
    fn actions_refer_to_an_existing_pass_and_results_to_an_existing_action() {
        let mut store = Store::memory().unwrap();
        let action = download("a", "pve1", "https://x/a.iso");
        let error = store
            .record_action_started(PassId(42), &action, at(0))
            .unwrap_err();
        assert!(matches!(error, StoreError::NotFound { .. }), "{error:?}");
        assert!(error.to_string().contains("pass 42"), "{error}");
        let error = store
            .record_task_started(ActionId(7), "UPID:x", at(0))
            .unwrap_err();
        assert!(matches!(error, StoreError::NotFound { .. }), "{error:?}");
    }
}
