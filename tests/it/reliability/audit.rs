//! What the reliability suites check after a run, from three independent records: the
//! simulator's request log (collected in pieces, so its 10,000-entry window never drops
//! anything), the simulator's task list (every task PVE started) and the agent's SQLite
//! store.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proxops_pve_sim::{RequestRecord, SimControl};
use serde_json::Value;

use crate::sim::World;

/// Every request the simulator answered since [`RequestLog::collect`], drained every 200 ms.
pub(crate) struct RequestLog {
    records: Arc<Mutex<Vec<RequestRecord>>>,
    control: SimControl,
    collector: tokio::task::JoinHandle<()>,
}

impl RequestLog {
    pub(crate) fn collect(world: &World) -> RequestLog {
        let control = world.sim.control().clone();
        control.clear_requests();
        let records: Arc<Mutex<Vec<RequestRecord>>> = Arc::default();
        let (sink, source) = (records.clone(), control.clone());
        let collector = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let taken = source.take_requests().requests;
                sink.lock().unwrap().extend(taken);
            }
        });
        RequestLog {
            records,
            control,
            collector,
        }
    }

    /// Everything so far.
    pub(crate) fn snapshot(&self) -> Vec<RequestRecord> {
        let taken = self.control.take_requests().requests;
        let mut records = self.records.lock().unwrap();
        records.extend(taken);
        records.clone()
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        self.collector.abort();
    }
}

/// The status the suites give lost answers (PVE acted, the caller saw an error), and only
/// them, so the request log tells them from errors answered before PVE acted.
pub(crate) const LOST_ANSWER: u16 = 596;

/// The vmid a write acts on, and whether it creates or deletes a guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GuestWrite {
    Create(u32),
    Delete(u32),
    Other(u32),
}

pub(crate) fn guest_write(r: &RequestRecord) -> Option<GuestWrite> {
    if r.method == "GET" {
        return None;
    }
    let param = |key: &str| r.params.get(key).and_then(|v| v.parse::<u32>().ok());
    let vmid_in_path = || {
        let segs: Vec<&str> = r.path.split('/').collect();
        segs.iter()
            .position(|s| *s == "qemu" || *s == "lxc")
            .and_then(|i| segs.get(i + 1))
            .and_then(|v| v.parse::<u32>().ok())
    };
    match (r.method.as_str(), r.endpoint.as_str()) {
        ("POST", "/nodes/{node}/qemu" | "/nodes/{node}/lxc") => {
            param("vmid").map(GuestWrite::Create)
        }
        ("POST", "/nodes/{node}/qemu/{vmid}/clone") => param("newid").map(GuestWrite::Create),
        ("DELETE", "/nodes/{node}/qemu/{vmid}" | "/nodes/{node}/lxc/{vmid}") => {
            vmid_in_path().map(GuestWrite::Delete)
        }
        _ => vmid_in_path().map(GuestWrite::Other),
    }
}

/// What the request log says about guests.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    /// Create (or clone) requests PVE accepted, per new vmid.
    pub(crate) accepted_creates: BTreeMap<u32, usize>,
    /// Create requests in all, accepted or not.
    pub(crate) create_requests: usize,
    /// Delete requests PVE accepted, per vmid.
    pub(crate) accepted_deletes: BTreeMap<u32, usize>,
    /// Every write per vmid (the clone's source counts for the template).
    pub(crate) touched: BTreeSet<u32>,
    /// Requests answered with 5xx.
    pub(crate) server_errors: usize,
    /// Requests PVE handled whose answer was lost (the suites inject these as 596 only).
    pub(crate) lost_answers: usize,
    /// vmids whose last create (or clone) PVE acted on was answered 596 (lost).
    pub(crate) created_unseen: BTreeSet<u32>,
}

pub(crate) fn writes(log: &[RequestRecord]) -> Writes {
    let mut out = Writes::default();
    for r in log {
        if r.status >= 500 {
            out.server_errors += 1;
        }
        if r.status == LOST_ANSWER {
            out.lost_answers += 1;
        }
        let Some(write) = guest_write(r) else {
            continue;
        };
        let accepted = r.status == 200;
        match write {
            GuestWrite::Create(vmid) => {
                out.create_requests += 1;
                out.touched.insert(vmid);
                if accepted {
                    *out.accepted_creates.entry(vmid).or_default() += 1;
                }
                // The last create PVE acted on decides: answered (seen) or lost (unseen).
                if r.status == LOST_ANSWER {
                    out.created_unseen.insert(vmid);
                } else if accepted {
                    out.created_unseen.remove(&vmid);
                }
            }
            GuestWrite::Delete(vmid) => {
                out.touched.insert(vmid);
                if accepted {
                    *out.accepted_deletes.entry(vmid).or_default() += 1;
                }
            }
            GuestWrite::Other(vmid) => {
                out.touched.insert(vmid);
            }
        }
    }
    out
}

impl Writes {
    /// vmids PVE accepted a create for more than once (legitimate when the first create's
    /// task failed: PVE then frees the vmid).
    pub(crate) fn recreated(&self) -> usize {
        self.accepted_creates.values().filter(|n| **n > 1).count()
    }
}

/// Guests created more than once: a vmid with more than one successful `qmcreate` or
/// `vzcreate` task, or more successful `qmclone` tasks than clones (a clone task is named
/// after its source, so clones are counted in all).
pub(crate) fn duplicate_creates(
    tasks: &[SimTask],
    before: &BTreeSet<String>,
    clones: usize,
) -> Vec<String> {
    let mut per_guest: BTreeMap<String, usize> = BTreeMap::new();
    let mut cloned = 0;
    for task in tasks
        .iter()
        .filter(|t| !before.contains(&t.upid) && t.status == "OK")
    {
        match task.kind.as_str() {
            "qmcreate" | "vzcreate" => *per_guest.entry(task.id.clone()).or_default() += 1,
            "qmclone" => cloned += 1,
            _ => {}
        }
    }
    let mut out: Vec<String> = per_guest
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(vmid, n)| format!("{vmid} created {n} times"))
        .collect();
    if cloned != clones {
        out.push(format!(
            "{cloned} successful clone tasks for {clones} clones"
        ));
    }
    out
}

/// One PVE task, from `/cluster/tasks`.
#[derive(Debug, Clone)]
pub(crate) struct SimTask {
    pub(crate) upid: String,
    pub(crate) node: String,
    pub(crate) kind: String,
    pub(crate) id: String,
    pub(crate) starttime: u64,
    /// The exit status (`OK`, an error) or `RUNNING`.
    pub(crate) status: String,
}

/// One recorded action, from the store.
#[derive(Debug, Clone)]
pub(crate) struct ActionRow {
    pub(crate) id: i64,
    pub(crate) resource: String,
    pub(crate) node: String,
    pub(crate) verb: String,
    pub(crate) upid: Option<String>,
    pub(crate) result: Option<String>,
}

pub(crate) fn actions(database: &Path) -> Vec<ActionRow> {
    let conn =
        rusqlite::Connection::open_with_flags(database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut statement = conn
        .prepare(
            "SELECT id, resource_kind || '/' || resource_name, node, verb, upid, result \
             FROM actions ORDER BY id",
        )
        .unwrap();
    statement
        .query_map([], |row| {
            Ok(ActionRow {
                id: row.get(0)?,
                resource: row.get(1)?,
                node: row.get(2)?,
                verb: row.get(3)?,
                upid: row.get(4)?,
                result: row.get(5)?,
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The highest action id recorded (0 before the database exists or has an action).
pub(crate) fn last_action_id(database: &Path) -> i64 {
    if !database.exists() {
        return 0;
    }
    let Ok(conn) =
        rusqlite::Connection::open_with_flags(database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
    else {
        return 0;
    };
    // Before the agent's migration has run there is no table yet.
    conn.query_row("SELECT COALESCE(MAX(id), 0) FROM actions", [], |row| {
        row.get(0)
    })
    .unwrap_or(0)
}

/// From the first action's start to the last action's end, of the pass that recorded the
/// first action above `after`, when all of its actions have ended.
pub(crate) fn apply_span(database: &Path, after: i64) -> Option<Duration> {
    let conn =
        rusqlite::Connection::open_with_flags(database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let (first, last, open): (Option<i64>, Option<i64>, i64) = conn
        .query_row(
            "SELECT MIN(started_at), MAX(ended_at), SUM(ended_at IS NULL) FROM actions \
             WHERE pass_id = (SELECT pass_id FROM actions WHERE id > ?1 ORDER BY id LIMIT 1)",
            [after],
            |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get::<_, Option<i64>>(2)?.unwrap_or(0),
                ))
            },
        )
        .ok()?;
    let span = u64::try_from(last? - first?).ok()?;
    (open == 0).then(|| Duration::from_millis(span))
}

/// The store's inventory of owned guests: (node, vmid).
pub(crate) fn inventory(database: &Path) -> BTreeSet<(String, u32)> {
    let conn =
        rusqlite::Connection::open_with_flags(database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut statement = conn.prepare("SELECT node, vmid FROM inventory").unwrap();
    statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Pass outcomes recorded, oldest first.
pub(crate) fn pass_outcomes(database: &Path) -> Vec<Option<String>> {
    let conn =
        rusqlite::Connection::open_with_flags(database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut statement = conn
        .prepare("SELECT outcome FROM passes ORDER BY id")
        .unwrap();
    statement
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// `PRAGMA integrity_check` of the agent's database, as SQLite answers it (`ok` when sound).
/// Opens it read-write, as the restarted agent will (a hot WAL is recovered first).
pub(crate) fn integrity_check(database: &Path) -> String {
    let conn = rusqlite::Connection::open(database).unwrap();
    let rows: Vec<String> = conn
        .prepare("PRAGMA integrity_check")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows.join("; ")
}

/// How the store's actions and PVE's tasks match.
#[derive(Debug, Default)]
pub(crate) struct Reconciliation {
    /// Tasks whose UPID the store recorded.
    pub(crate) recorded: usize,
    /// Tasks whose UPID a later step of the same action replaced (an action keeps one UPID:
    /// a create's resize, a clone's config update).
    pub(crate) replaced_by_later_step: usize,
    /// Tasks the store has no trace of.
    pub(crate) unrecorded: Vec<String>,
    /// Recorded UPIDs PVE never started.
    pub(crate) phantom: Vec<String>,
    /// Actions recorded as succeeded creates/clones/deletes without an accepted request
    /// for their vmid in the request log.
    pub(crate) succeeded_without_request: Vec<String>,
}

/// Matches every task PVE started after `since_upids` with the store's actions.
pub(crate) fn reconcile(
    tasks: &[SimTask],
    before: &BTreeSet<String>,
    rows: &[ActionRow],
    writes: &Writes,
    vmid_of: &BTreeMap<String, u32>,
) -> Reconciliation {
    let mut out = Reconciliation::default();
    let recorded: BTreeSet<&str> = rows.iter().filter_map(|r| r.upid.as_deref()).collect();
    let by_upid: BTreeMap<&str, &SimTask> = tasks.iter().map(|t| (t.upid.as_str(), t)).collect();
    for task in tasks.iter().filter(|t| !before.contains(&t.upid)) {
        if recorded.contains(task.upid.as_str()) {
            out.recorded += 1;
            continue;
        }
        // A later task on the same node and guest, recorded for one action (downloads have
        // one task per action, so they must be recorded exactly).
        let guest_task = task.kind != "download" && task.id.parse::<u32>().is_ok();
        // Only actions of several steps (a create's resize, a clone's or update's config
        // write and resize) replace their UPID.
        let replaced = guest_task
            && rows
                .iter()
                .filter(|r| matches!(r.verb.as_str(), "create" | "clone" | "update"))
                .filter_map(|r| r.upid.as_deref())
                .any(|u| {
                    by_upid.get(u).is_some_and(|later| {
                        later.node == task.node
                            && later.id == task.id
                            && later.starttime >= task.starttime
                            && later.upid != task.upid
                    })
                });
        if replaced {
            out.replaced_by_later_step += 1;
        } else {
            out.unrecorded.push(task.upid.clone());
        }
    }
    for upid in recorded {
        if !by_upid.contains_key(upid) {
            out.phantom.push(upid.to_owned());
        }
    }
    for row in rows {
        if row.result.as_deref() != Some("succeeded") {
            continue;
        }
        let Some(vmid) = vmid_of.get(&row.resource) else {
            continue;
        };
        // A create whose answer was lost (PVE acted, then answered 595/596) has no accepted
        // request; the executor follows the task PVE started for it instead: a create task
        // for this vmid started during the run is the proof.
        let created_by_task = tasks.iter().any(|t| {
            !before.contains(&t.upid)
                && matches!(t.kind.as_str(), "qmcreate" | "vzcreate")
                && t.id == vmid.to_string()
        });
        let seen = match row.verb.as_str() {
            "create" | "clone" => writes.accepted_creates.contains_key(vmid) || created_by_task,
            "delete" => writes.accepted_deletes.contains_key(vmid),
            _ => true,
        };
        if !seen {
            out.succeeded_without_request
                .push(format!("{} {} on {}", row.verb, row.resource, row.node));
        }
    }
    out
}

/// Every task PVE knows, newest first.
pub(crate) async fn sim_tasks(api: &super::Api) -> Vec<SimTask> {
    let data = api.get("/cluster/tasks").await;
    data.as_array()
        .unwrap()
        .iter()
        .map(|t| SimTask {
            upid: text(t, "upid"),
            node: text(t, "node"),
            kind: text(t, "type"),
            id: text(t, "id"),
            starttime: t["starttime"].as_u64().unwrap_or_default(),
            status: text(t, "status"),
        })
        .collect()
}

fn text(value: &Value, key: &str) -> String {
    value[key].as_str().unwrap_or_default().to_owned()
}
