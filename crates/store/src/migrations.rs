//! The schema, as an ordered list of SQL scripts. Script `i` (0-based) takes the database
//! from version `i` to `i + 1`; `PRAGMA user_version` holds the version reached. Each script
//! runs in its own transaction together with the version bump, so a failed script leaves the
//! database exactly as it was.
//!
//! Scripts are append-only: once released, a script is never edited; a change is a new
//! script. A database newer than this binary is refused rather than guessed at.
//!
//! Times are INTEGER milliseconds since the Unix epoch; resources are stored as
//! (`resource_kind`, `resource_name`), the parts of a `ResourceId`.

use std::path::Path;

use rusqlite::Connection;

use super::{Result, StoreError};

/// Every migration, oldest first.
pub const MIGRATIONS: &[&str] = &[
    V1_INITIAL,
    V2_PASS_NOTES,
    V3_ENFORCED_AND_DRIFT_PASSES,
    V4_RISK_AND_FREEZE,
    V_SNAPSHOTS,
    V_APPROVALS,
    V_UNVERIFIED,
    V_BACKUP_BEFORE_DELETE,
];

/// Version 1: passes, actions, drift findings, inventory.
const V1_INITIAL: &str = r"
CREATE TABLE passes (
    id              INTEGER PRIMARY KEY,
    node            TEXT    NOT NULL,
    revision        TEXT,               -- the git commit; NULL when none could be fetched
    trigger_kind    TEXT    NOT NULL CHECK (trigger_kind IN
                        ('poll', 'webhook', 'startup', 'cli', 'signal')),
    started_at      INTEGER NOT NULL,
    ended_at        INTEGER,
    outcome         TEXT CHECK (outcome IN
                        ('applied', 'no-change', 'failed', 'invalid', 'interrupted')),
    actions_ok      INTEGER NOT NULL DEFAULT 0,
    actions_failed  INTEGER NOT NULL DEFAULT 0,
    actions_skipped INTEGER NOT NULL DEFAULT 0,
    findings        INTEGER NOT NULL DEFAULT 0,
    diagnostics     TEXT,               -- JSON array of core Diagnostics, for invalid passes
    CHECK ((outcome IS NULL) = (ended_at IS NULL))
) STRICT;
CREATE INDEX passes_by_node ON passes (node, id);
CREATE INDEX passes_unfinished ON passes (id) WHERE outcome IS NULL;

CREATE TABLE actions (
    id              INTEGER PRIMARY KEY,
    pass_id         INTEGER NOT NULL REFERENCES passes (id) ON DELETE CASCADE,
    resource_kind   TEXT    NOT NULL,
    resource_name   TEXT    NOT NULL,
    node            TEXT    NOT NULL,
    verb            TEXT    NOT NULL,   -- `download`, `create`, …
    detail          TEXT    NOT NULL,   -- JSON of the verb and its parameters
    reason          TEXT    NOT NULL,
    started_at      INTEGER NOT NULL,
    upid            TEXT,               -- written before waiting for the task
    task_started_at INTEGER,
    ended_at        INTEGER,
    result          TEXT CHECK (result IN ('succeeded', 'failed', 'skipped')),
    exitstatus      TEXT,               -- PVE's, when succeeded
    error           TEXT,               -- the error when failed, the reason when skipped
    CHECK ((result IS NULL) = (ended_at IS NULL))
) STRICT;
CREATE INDEX actions_by_pass ON actions (pass_id, id);
CREATE INDEX actions_running ON actions (node, id) WHERE upid IS NOT NULL AND result IS NULL;

CREATE TABLE drift_findings (
    id                INTEGER PRIMARY KEY,
    node              TEXT    NOT NULL,
    resource_kind     TEXT    NOT NULL,
    resource_name     TEXT    NOT NULL,
    kind              TEXT    NOT NULL, -- the finding kind (`drift`, `observe-failed`, …)
    field             TEXT    NOT NULL,
    desired           TEXT    NOT NULL,
    observed          TEXT    NOT NULL,
    message           TEXT    NOT NULL,
    first_seen_commit TEXT,
    first_seen_at     INTEGER NOT NULL,
    last_seen_commit  TEXT,
    last_seen_at      INTEGER NOT NULL,
    resolved_at       INTEGER,
    resolved_how      TEXT CHECK (resolved_how IN ('corrected', 'gone')),
    CHECK ((resolved_at IS NULL) = (resolved_how IS NULL))
) STRICT;
-- At most one open finding per (node, resource, kind, field); resolved ones are history.
CREATE UNIQUE INDEX drift_findings_open
    ON drift_findings (node, resource_kind, resource_name, kind, field)
    WHERE resolved_at IS NULL;
CREATE INDEX drift_findings_resolved ON drift_findings (resolved_at) WHERE resolved_at IS NOT NULL;

-- The guests ProxOps owns, keyed by their PVE identity (vmids are unique in a cluster).
CREATE TABLE inventory (
    node          TEXT    NOT NULL,
    vmid          INTEGER NOT NULL,
    resource_kind TEXT    NOT NULL,
    resource_name TEXT    NOT NULL,
    PRIMARY KEY (node, vmid)
) STRICT;
";

/// Version 2: what a pass noticed about its source and its writes (guard rails): the commit
/// the branch pointed to before, whether it was force-pushed, whether the desired state was
/// the last good one because git failed (and why), why the pass failed, and the write
/// circuit breaker's state when the pass started.
const V2_PASS_NOTES: &str = r"
ALTER TABLE passes ADD COLUMN previous_revision TEXT;
ALTER TABLE passes ADD COLUMN force_pushed INTEGER NOT NULL DEFAULT 0 CHECK (force_pushed IN (0, 1));
ALTER TABLE passes ADD COLUMN desired_stale INTEGER NOT NULL DEFAULT 0 CHECK (desired_stale IN (0, 1));
ALTER TABLE passes ADD COLUMN source_error TEXT;
ALTER TABLE passes ADD COLUMN error TEXT;
ALTER TABLE passes ADD COLUMN write_breaker TEXT CHECK (write_breaker IN ('closed', 'open', 'half-open'));
";

/// Version 3 (issue 17): the revision a pass enforced and how that went (the fetched one,
/// or the last valid one while HEAD is invalid), and drift history by pass: the passes that
/// first and last saw a finding and the one that resolved it, with how (corrected by that
/// pass, the manifest changed, fixed in PVE by someone else, or gone). `resolved_how` keeps
/// its version 1 words (`corrected`, `gone`) so older readers still understand the rows.
const V3_ENFORCED_AND_DRIFT_PASSES: &str = r"
ALTER TABLE passes ADD COLUMN enforced_revision TEXT;
ALTER TABLE passes ADD COLUMN enforced_outcome TEXT CHECK (enforced_outcome IN
    ('applied', 'no-change', 'failed', 'invalid', 'interrupted'));
ALTER TABLE drift_findings ADD COLUMN first_seen_pass INTEGER;
ALTER TABLE drift_findings ADD COLUMN last_seen_pass INTEGER;
ALTER TABLE drift_findings ADD COLUMN resolved_pass INTEGER;
ALTER TABLE drift_findings ADD COLUMN resolution TEXT CHECK (resolution IN
    ('corrected-by-pass', 'manifest-changed', 'fixed-in-pve', 'gone'));
CREATE INDEX passes_enforced ON passes (node, id) WHERE enforced_revision IS NOT NULL;
";

/// Version 4 (issue 19): each action's risk level (`NULL` for actions recorded before), and
/// the operator's freeze (`proxops freeze`): at most one row, `until_at` `NULL` for a freeze
/// without end.
const V4_RISK_AND_FREEZE: &str = r"
ALTER TABLE actions ADD COLUMN risk TEXT CHECK (risk IN ('safe', 'risky', 'destructive'));
CREATE TABLE freeze (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    until_at  INTEGER,
    reason    TEXT    NOT NULL,
    who       TEXT    NOT NULL,
    since_at  INTEGER NOT NULL
) STRICT;
";

/// Issue 19 (snapshots before risky updates): every snapshot ProxOps took, so retention
/// and `proxops rollback` touch only its own. `pass_id` is not a foreign key: passes are
/// pruned, and a snapshot outlives the pass that took it. `deleted_at` is set when
/// retention deleted it.
const V_SNAPSHOTS: &str = r"
CREATE TABLE snapshots (
    id              INTEGER PRIMARY KEY,
    node            TEXT    NOT NULL,
    vmid            INTEGER NOT NULL,
    guest_type      TEXT    NOT NULL CHECK (guest_type IN ('qemu', 'lxc')),
    resource_kind   TEXT    NOT NULL,
    resource_name   TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    revision        TEXT    NOT NULL,
    pass_id         INTEGER,
    taken_at        INTEGER NOT NULL,
    deleted_at      INTEGER,
    UNIQUE (node, vmid, name)
) STRICT;
CREATE INDEX snapshots_by_resource ON snapshots (resource_kind, resource_name, id);
";

/// Issue 19 (approvals): the actions a pass held for an operator's approval, with their
/// digest, and what became of them: see `approvals.rs`.
pub(crate) const V_APPROVALS: &str = crate::approvals::SCHEMA;

/// Issue 18 (signed commits): a pass refused by `[source] verify` is outcome `unverified`.
/// The version 1 CHECK on `outcome` cannot be widened in place (SQLite has no ALTER for a
/// CHECK, and rebuilding `passes` with foreign keys on would cascade-delete its actions), so
/// the outcome is stored as `invalid` with this flag set; readers map the pair back.
const V_UNVERIFIED: &str = r"
ALTER TABLE passes ADD COLUMN unverified INTEGER NOT NULL DEFAULT 0 CHECK (unverified IN (0, 1));
";

/// Issue 19, item 3 (backup before delete): the volume id of the backup `vzdump` wrote
/// before a delete action (`NULL`: no backup was taken, or the action is older).
const V_BACKUP_BEFORE_DELETE: &str = r"
ALTER TABLE actions ADD COLUMN backup_volid TEXT;
";

/// The schema version this binary writes.
pub fn latest() -> u32 {
    u32::try_from(MIGRATIONS.len()).unwrap_or(u32::MAX)
}

/// `PRAGMA user_version` of an open database.
pub(super) fn version(conn: &Connection) -> rusqlite::Result<u32> {
    conn.query_row("PRAGMA user_version", [], |row| row.get(0))
}

/// Applies every script of `scripts` the database has not seen yet; returns the version
/// reached.
pub(super) fn migrate(conn: &mut Connection, path: &Path, scripts: &[&str]) -> Result<u32> {
    let query_error = |source| StoreError::Query {
        path: path.to_owned(),
        operation: "reading the schema version",
        source,
    };
    let found = version(conn).map_err(query_error)?;
    let supported = u32::try_from(scripts.len()).unwrap_or(u32::MAX);
    if found > supported {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found,
            supported,
        });
    }
    for (index, script) in scripts.iter().enumerate().skip(found as usize) {
        let target = u32::try_from(index + 1).unwrap_or(u32::MAX);
        let migrate_error = |source| StoreError::Migrate {
            path: path.to_owned(),
            version: target,
            source,
        };
        let tx = conn.transaction().map_err(migrate_error)?;
        tx.execute_batch(script).map_err(migrate_error)?;
        tx.pragma_update(None, "user_version", target)
            .map_err(migrate_error)?;
        tx.commit().map_err(migrate_error)?;
        tracing::info!(path = %path.display(), version = target, "migrated the state database");
    }
    Ok(found.max(supported))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    const V2_TEST: &str = "ALTER TABLE inventory ADD COLUMN note TEXT NOT NULL DEFAULT 'old';";

    fn db_path() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        (dir, path)
    }

    #[test]
    fn a_new_database_is_at_the_latest_version() {
        let store = Store::memory().unwrap();
        assert_eq!(store.schema_version().unwrap(), latest());
        assert_eq!(latest(), MIGRATIONS.len() as u32);
    }

    #[test]
    fn opening_an_older_database_migrates_it_and_keeps_its_rows() {
        let (_dir, path) = db_path();
        {
            let mut store = Store::open_with(&path, &[V1_INITIAL]).unwrap();
            let resource =
                proxops_core::resource::ResourceId::new(proxops_core::resource::Kind::Vm, "web-1");
            store.upsert_owned("pve1", &resource, 100).unwrap();
        }
        let store = Store::open_with(&path, &[V1_INITIAL, V2_TEST]).unwrap();
        assert_eq!(store.schema_version().unwrap(), 2);
        let note: String = store
            .conn
            .query_row("SELECT note FROM inventory WHERE vmid = 100", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(note, "old");
    }

    #[test]
    fn a_version_1_database_gets_the_pass_notes_and_its_passes_read_as_nothing_noticed() {
        let (_dir, path) = db_path();
        let id = {
            let mut store = Store::open_with(&path, &[V1_INITIAL]).unwrap();
            store
                .begin_pass(
                    "pve1",
                    Some("aaa"),
                    crate::Trigger::Poll,
                    std::time::SystemTime::now(),
                )
                .unwrap()
        };
        let mut store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), latest());
        let old = store.pass(id).unwrap().unwrap();
        assert_eq!(old.notes, crate::PassNotes::default());
        store
            .note_source(id, Some("000"), true, None, false)
            .unwrap();
        assert!(store.pass(id).unwrap().unwrap().notes.force_pushed);
    }

    #[test]
    fn a_version_2_database_keeps_its_passes_and_drift_and_reads_them_without_pass_ids() {
        use proxops_core::plan::{Finding, FindingKind};
        use proxops_core::resource::{Kind, ResourceId};
        let (_dir, path) = db_path();
        let t = |s: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000 + s);
        let finding = |field: &str| Finding {
            resource: ResourceId::new(Kind::Vm, "web"),
            node: "pve1".to_owned(),
            kind: FindingKind::Drift,
            field: field.to_owned(),
            desired: "2048".to_owned(),
            observed: "4096".to_owned(),
            message: "memory differs".to_owned(),
        };
        let applied = {
            let mut store = Store::open_with(&path, &[V1_INITIAL, V2_PASS_NOTES]).unwrap();
            let id = store
                .begin_pass("pve1", Some("aaa"), crate::Trigger::Poll, t(0))
                .unwrap();
            store
                .finish_pass(
                    id,
                    crate::PassOutcome::Applied,
                    crate::PassCounts::default(),
                    t(1),
                )
                .unwrap();
            // Written as version 2 did: no pass ids.
            store
                .conn
                .execute_batch(
                    "INSERT INTO drift_findings (node, resource_kind, resource_name, kind, \
                     field, desired, observed, message, first_seen_at, last_seen_at, \
                     resolved_at, resolved_how) VALUES \
                     ('pve1', 'VM', 'web', 'drift', 'cores', '2', '4', 'm', 0, 0, 5, 'corrected'), \
                     ('pve1', 'VM', 'web', 'drift', 'memory', '2048', '4096', 'm', 0, 0, NULL, NULL);",
                )
                .unwrap();
            id
        };
        let mut store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), latest());
        let resolved = store.recent_resolved(None, 10).unwrap();
        assert_eq!(resolved.len(), 1);
        assert_eq!(resolved[0].resolved_how, Some(crate::Resolution::Corrected));
        assert_eq!(resolved[0].resolved_pass, None);
        assert_eq!(resolved[0].first_seen_pass, None);
        // The last applied pass stands for the enforced revision of a version 2 database.
        let enforced = store.last_enforced("pve1").unwrap().unwrap();
        assert_eq!(enforced.id, applied);
        assert_eq!(enforced.enforced_commit(), Some("aaa"));
        // The open version 2 finding is matched and resolved by a version 3 pass.
        let pass = store
            .begin_pass("pve1", Some("bbb"), crate::Trigger::Poll, t(10))
            .unwrap();
        store
            .record_pass_findings(
                pass,
                "pve1",
                Some("bbb"),
                t(10),
                &[finding("memory")],
                |_| crate::Resolution::Gone,
            )
            .unwrap();
        let open = store.open_findings(None).unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(
            (open[0].first_seen_pass, open[0].last_seen_pass),
            (None, Some(pass))
        );
        assert_eq!(
            store
                .resolve_corrected(pass, "pve1", &open[0].resource, ["memory"], t(11))
                .unwrap(),
            1
        );
        let resolved = store.recent_resolved(None, 1).unwrap();
        assert_eq!(
            resolved[0].resolved_how,
            Some(crate::Resolution::CorrectedByPass(pass))
        );
    }

    #[test]
    fn a_version_3_database_keeps_its_actions_without_a_risk_and_records_new_ones_with_it() {
        use crate::actions::tests::{at, download};
        let (_dir, path) = db_path();
        let (pass, old) = {
            let mut store = Store::open_with(
                &path,
                &[V1_INITIAL, V2_PASS_NOTES, V3_ENFORCED_AND_DRIFT_PASSES],
            )
            .unwrap();
            let pass = store
                .begin_pass("pve1", Some("aaa"), crate::Trigger::Poll, at(0))
                .unwrap();
            // Written as version 3 did: no risk column.
            store
                .conn
                .execute(
                    "INSERT INTO actions (pass_id, resource_kind, resource_name, node, verb, \
                     detail, reason, started_at) VALUES (?1, 'ISO', 'old', 'pve1', \
                     'download', '{}', 'r', 0)",
                    [pass.0],
                )
                .unwrap();
            (pass, store.conn.last_insert_rowid())
        };
        let mut store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), latest());
        assert_eq!(store.freeze().unwrap(), None);
        let iso = download("debian", "pve1", "https://example.org/debian.iso");
        let new = store.record_action_started(pass, &iso, at(1)).unwrap();
        let actions = store.actions_of(pass).unwrap();
        assert_eq!(actions.len(), 2);
        assert_eq!((actions[0].id.0, actions[0].risk), (old, None));
        assert_eq!(
            (actions[1].id, actions[1].risk),
            (new, Some(proxops_core::plan::risk::Risk::Safe))
        );
    }

    #[test]
    fn the_unverified_flag_is_added_keeping_passes_actions_and_drift_and_reads_back() {
        use crate::actions::tests::{at, download};
        use crate::views::PassFilter;
        use crate::{PassCounts, PassOutcome};
        let (_dir, path) = db_path();
        let before = MIGRATIONS
            .iter()
            .position(|script| *script == V_UNVERIFIED)
            .unwrap();
        let (invalid, action) = {
            let mut store = Store::open_with(&path, &MIGRATIONS[..before]).unwrap();
            let applied = store
                .begin_pass("pve1", Some("aaa"), crate::Trigger::Poll, at(0))
                .unwrap();
            let iso = download("debian", "pve1", "https://example.org/debian.iso");
            let action = store.record_action_started(applied, &iso, at(1)).unwrap();
            store
                .finish_pass(applied, PassOutcome::Applied, PassCounts::default(), at(2))
                .unwrap();
            let invalid = store
                .begin_pass("pve1", Some("bbb"), crate::Trigger::Poll, at(3))
                .unwrap();
            store
                .finish_pass(invalid, PassOutcome::Invalid, PassCounts::default(), at(4))
                .unwrap();
            store
                .conn
                .execute(
                    "INSERT INTO drift_findings (node, resource_kind, resource_name, kind, \
                     field, desired, observed, message, first_seen_at, last_seen_at, \
                     first_seen_pass, last_seen_pass) VALUES ('pve1', 'VM', 'web', 'drift', \
                     'memory', '512', '2048', 'm', 0, 0, ?1, ?1)",
                    [applied.0],
                )
                .unwrap();
            (invalid, action)
        };
        let mut store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), latest());
        assert_eq!(
            store.pass(invalid).unwrap().unwrap().outcome,
            Some(PassOutcome::Invalid)
        );
        assert_eq!(store.actions_of(crate::PassId(1)).unwrap()[0].id, action);
        let drift: i64 = store
            .conn
            .query_row(
                "SELECT count(*) FROM drift_findings WHERE first_seen_pass = 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(drift, 1);

        let unverified = store
            .begin_pass("pve1", Some("ccc"), crate::Trigger::Webhook, at(5))
            .unwrap();
        store
            .note_enforced(unverified, "aaa", Some(PassOutcome::NoChange))
            .unwrap();
        store
            .finish_pass(
                unverified,
                PassOutcome::Unverified,
                PassCounts::default(),
                at(6),
            )
            .unwrap();
        let read = store.pass(unverified).unwrap().unwrap();
        assert_eq!(read.outcome, Some(PassOutcome::Unverified));
        assert_eq!(read.enforced_commit(), Some("aaa"));
        assert_eq!(
            store
                .last_applied("pve1")
                .unwrap()
                .unwrap()
                .commit
                .as_deref(),
            Some("aaa")
        );
        let only = |outcome| {
            store
                .passes_matching(
                    &PassFilter {
                        node: None,
                        outcome: Some(outcome),
                        since: None,
                    },
                    10,
                )
                .unwrap()
                .into_iter()
                .map(|p| p.id)
                .collect::<Vec<_>>()
        };
        assert_eq!(only(PassOutcome::Unverified), [unverified]);
        assert_eq!(only(PassOutcome::Invalid), [invalid]);
    }

    #[test]
    fn a_failing_migration_leaves_the_database_at_its_previous_version() {
        let (_dir, path) = db_path();
        drop(Store::open_with(&path, &[V1_INITIAL]).unwrap());
        let broken = "ALTER TABLE inventory ADD COLUMN note TEXT; SELECT * FROM no_such_table;";
        let error = Store::open_with(&path, &[V1_INITIAL, broken]).unwrap_err();
        assert!(
            matches!(error, StoreError::Migrate { version: 2, .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains(&path.display().to_string()));
        let store = Store::open_with(&path, &[V1_INITIAL]).unwrap();
        assert_eq!(store.schema_version().unwrap(), 1);
        let columns: i64 = store
            .conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('inventory') WHERE name = 'note'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(columns, 0, "the half-applied script was rolled back");
    }

    #[test]
    fn a_database_from_before_backup_volids_keeps_its_actions_and_records_backups_after() {
        let (_dir, path) = db_path();
        let before = MIGRATIONS
            .iter()
            .position(|script| *script == V_BACKUP_BEFORE_DELETE)
            .unwrap();
        let (pass, action) = {
            let mut store = Store::open_with(&path, &MIGRATIONS[..before]).unwrap();
            let pass = store
                .begin_pass(
                    "pve1",
                    Some("aaa"),
                    crate::Trigger::Poll,
                    std::time::SystemTime::now(),
                )
                .unwrap();
            let iso =
                crate::actions::tests::download("debian", "pve1", "https://example.org/d.iso");
            let action = store
                .record_action_started(pass, &iso, std::time::SystemTime::now())
                .unwrap();
            (pass, action)
        };
        let mut store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), latest());
        let old = store.actions_of(pass).unwrap();
        assert_eq!(old.len(), 1);
        assert_eq!(old[0].backup_volid, None);
        store
            .record_action_backup(
                action,
                "local:backup/vzdump-qemu-100-2026_12_01-15_00_00.vma.zst",
            )
            .unwrap();
        assert_eq!(
            store.actions_of(pass).unwrap()[0].backup_volid.as_deref(),
            Some("local:backup/vzdump-qemu-100-2026_12_01-15_00_00.vma.zst")
        );
        assert!(matches!(
            store.record_action_backup(crate::ActionId(action.0 + 1), "local:backup/x"),
            Err(StoreError::NotFound { .. })
        ));
    }

    #[test]
    fn a_database_newer_than_the_binary_is_refused_with_a_clear_error() {
        let (_dir, path) = db_path();
        drop(Store::open(&path).unwrap());
        {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "user_version", latest() + 1)
                .unwrap();
        }
        let error = Store::open(&path).unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, StoreError::TooNew { .. }), "{error:?}");
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("newer than this binary"), "{message}");
        assert!(matches!(
            Store::open_read_only(&path).unwrap_err(),
            StoreError::TooNew { .. }
        ));
    }

    #[test]
    fn a_read_only_open_refuses_a_database_that_needs_migrating() {
        let (_dir, path) = db_path();
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch("CREATE TABLE unrelated (x INTEGER);")
                .unwrap();
        }
        let error = Store::open_read_only(&path).unwrap_err();
        assert!(
            matches!(error, StoreError::NeedsMigration { found: 0, .. }),
            "{error:?}"
        );
    }
}
