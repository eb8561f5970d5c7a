//! The agent's records in SQLite: passes, the actions they ran (with the UPIDs of their PVE
//! tasks), drift findings, and the inventory of guests ProxOps owns, all per node.
//!
//! The API is synchronous; a [`Store`] owns one `rusqlite::Connection`. The store decides
//! nothing: it records what the caller did and answers questions about it ("what did pve1
//! last apply?", "which tasks were running when the agent died?"). Time is always passed in by
//! the caller, so tests control it; it is stored as milliseconds since the epoch and returned
//! as `SystemTime` (formatting it for people is the caller's business).
//!
//! The agent shares one store between its loop and its HTTP API as a [`SharedStore`] (a std
//! mutex). The loop's writes run on the runtime's threads, not in `spawn_blocking`, including
//! from the executor's progress callback. That blocks a runtime thread briefly: an action makes
//! about three writes (started, task started, result), each one short transaction in WAL mode
//! with `synchronous=NORMAL` (a commit does not wait for an fsync), measured at tens of
//! microseconds and up to a few milliseconds when a commit runs a WAL checkpoint, against
//! actions that wait seconds to minutes for PVE tasks. That is simpler than a writer task and
//! keeps each write in order with the event that caused it. The lock is never held across an
//! `.await`. The HTTP reads take the lock in `spawn_blocking`; a write may wait for one of
//! them to finish.
//!
//! Secrets never reach the database. The store only accepts core types (`Action`, `Finding`,
//! `Diagnostic`), names, commits and PVE's words (UPIDs, exit statuses, error text), none of
//! which carries a credential; as a second line of defence, every free-text value is passed
//! through [`redact`] so a URL with a password in it (`https://user:pw@host/…`) is stored as
//! `https://user:***@host/…`. There is deliberately no API that takes a `SecretString`.
//!
//! Layout: [`migrations`] (versioned schema), [`passes`] (one row per pass, its counts and
//! diagnostics), [`pass_notes`] (what a pass noted: git errors, breaker marks), [`actions`]
//! (with the UPIDs of their PVE tasks, stored as text, and their risk level), [`drift`],
//! [`inventory`], [`freeze`] (the operator's `proxops freeze`), [`snapshots`] (the guest
//! snapshots ProxOps took before risky updates).
//!
//! Boundary: this crate knows SQLite and `proxops-core`'s types, nothing of the executor, the
//! agent or PVE's client; the `proxops` package converts its executor's results into the row
//! types here ([`ActionOutcome`], [`PassCounts`]).
//!
//! Node convention: records carry the node they concern. A cluster-wide agent (`node = "*"`)
//! records its passes under the node `"*"`; queries for one node also see those passes, and
//! `"*"` as a node filter means every node.

#![warn(missing_docs)]

pub mod actions;
pub mod approvals;
pub mod drift;
pub mod freeze;
pub mod inventory;
pub mod migrations;
pub mod pass_notes;
pub mod passes;
pub mod snapshots;
pub mod views;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags};

pub use actions::{ActionId, ActionOutcome, ActionRecord, RunningTask};
pub use approvals::{ApprovalRecord, ApprovalState, Held};
pub use drift::{DriftRecord, DriftUpdate, Resolution};
pub use freeze::Freeze;
pub use inventory::OwnedGuest;
pub use pass_notes::{BreakerMark, PassNotes};
pub use passes::{Enforced, PassCounts, PassId, PassOutcome, PassSummary, Trigger};
pub use snapshots::SnapshotRecord;

/// The store, shared between the agent's loop (writes) and its HTTP API (reads).
pub type SharedStore = Arc<Mutex<Store>>;

/// The node name a cluster-wide agent records its passes under.
pub const ALL_NODES: &str = "*";

/// How long a connection waits for another one's lock before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// SQLite's page cache per connection, in KiB (`PRAGMA cache_size` takes it negated). SQLite's
/// default is 2,000 KiB, which a long-running agent fills as the history grows, though every
/// query reads a few recent pages of a small local file that the kernel caches anyway
/// (issue 20: idle RSS under 20 MiB).
const CACHE_KIB: i64 = 512;

/// What `Store::memory` reports as its path in error messages.
const MEMORY_PATH: &str = ":memory:";

/// The agent's state database.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

/// Why a store operation failed. Messages name the database and the operation.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The state directory could not be created or its file could not be prepared.
    #[error("preparing {path} for the state database")]
    Prepare {
        /// The path concerned (directory or file).
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// SQLite could not open the file.
    #[error("opening the state database {path}")]
    Open {
        /// The database file.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// The database was written by a newer ProxOps.
    #[error(
        "the state database {path} has schema version {found}, newer than this binary \
         understands (at most {supported}); upgrade proxops or point state_dir elsewhere"
    )]
    TooNew {
        /// The database file.
        path: PathBuf,
        /// `PRAGMA user_version` of the file.
        found: u32,
        /// The newest version this binary knows.
        supported: u32,
    },
    /// A read-only open found a database that still needs migrating.
    #[error(
        "the state database {path} has schema version {found}, older than this binary's \
         {supported}; it is migrated when the agent starts, not by a read-only open"
    )]
    NeedsMigration {
        /// The database file.
        path: PathBuf,
        /// `PRAGMA user_version` of the file.
        found: u32,
        /// The version this binary expects.
        supported: u32,
    },
    /// A migration script failed; the database was left at the version before it.
    #[error("migrating the state database {path} to schema version {version}")]
    Migrate {
        /// The database file.
        path: PathBuf,
        /// The version the failed script would have produced.
        version: u32,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// A query failed.
    #[error("{operation} in the state database {path}")]
    Query {
        /// The database file.
        path: PathBuf,
        /// What was being done, as a lowercase fragment (`recording the start of a pass`).
        operation: &'static str,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// A value could not be turned into JSON for storage.
    #[error("{operation} in the state database {path}: encoding JSON")]
    Encode {
        /// The database file.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// What serde_json said.
        #[source]
        source: serde_json::Error,
    },
    /// A row referred to does not exist.
    #[error("{operation} in the state database {path}: {what} does not exist")]
    NotFound {
        /// The database file.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// The missing row (`pass 12`).
        what: String,
    },
    /// A pass or action was finished twice.
    #[error("{operation} in the state database {path}: {what} already has a result")]
    AlreadyFinished {
        /// The database file.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// The row concerned (`action 7`).
        what: String,
    },
    /// A stored value is not one this binary writes (hand-edited or corrupted file).
    #[error("{operation} in the state database {path}: unexpected stored value {value:?}")]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// The offending value.
        value: String,
    },
}

/// Result of store operations.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl Store {
    /// Opens (creating if needed) the database at `path` for the agent: the parent directory
    /// is created 0700, the file 0600; WAL journal, `synchronous=NORMAL`, foreign keys on,
    /// a busy timeout, and every pending migration applied.
    ///
    /// # Errors
    /// When the file cannot be created or opened, or is newer than this binary
    /// ([`StoreError::TooNew`]), or a migration fails.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, migrations::MIGRATIONS)
    }

    /// [`Store::open`] with a given list of migrations (tests of the migration mechanism).
    fn open_with(path: &Path, scripts: &[&str]) -> Result<Self> {
        prepare_file(path)?;
        let open_error = |source| StoreError::Open {
            path: path.to_owned(),
            source,
        };
        let conn = Connection::open(path).map_err(open_error)?;
        configure(&conn, true).map_err(open_error)?;
        let mut store = Self {
            conn,
            path: path.to_owned(),
        };
        migrations::migrate(&mut store.conn, &store.path, scripts)?;
        Ok(store)
    }

    /// Opens an existing database read-only, for `proxops status` while an agent runs. It
    /// sees everything the writer has committed and never blocks it (WAL).
    ///
    /// # Errors
    /// When the file does not exist or cannot be read, is newer than this binary, or has not
    /// been migrated to this binary's schema yet ([`StoreError::NeedsMigration`]).
    pub fn open_read_only(path: &Path) -> Result<Self> {
        let open_error = |source| StoreError::Open {
            path: path.to_owned(),
            source,
        };
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        let conn = Connection::open_with_flags(path, flags).map_err(open_error)?;
        configure(&conn, false).map_err(open_error)?;
        let found = migrations::version(&conn).map_err(open_error)?;
        let supported = migrations::latest();
        if found > supported {
            return Err(StoreError::TooNew {
                path: path.to_owned(),
                found,
                supported,
            });
        }
        if found < supported {
            return Err(StoreError::NeedsMigration {
                path: path.to_owned(),
                found,
                supported,
            });
        }
        Ok(Self {
            conn,
            path: path.to_owned(),
        })
    }

    /// A fresh in-memory database with the current schema, for tests.
    ///
    /// # Errors
    /// Only if SQLite itself fails.
    pub fn memory() -> Result<Self> {
        let path = PathBuf::from(MEMORY_PATH);
        let conn = Connection::open_in_memory().map_err(|source| StoreError::Open {
            path: path.clone(),
            source,
        })?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(|source| StoreError::Open {
                path: path.clone(),
                source,
            })?;
        let mut store = Self { conn, path };
        migrations::migrate(&mut store.conn, &store.path, migrations::MIGRATIONS)?;
        Ok(store)
    }

    /// The database file (`:memory:` for [`Store::memory`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version of the open database.
    ///
    /// # Errors
    /// When the version cannot be read.
    pub fn schema_version(&self) -> Result<u32> {
        migrations::version(&self.conn).map_err(self.query_error("reading the schema version"))
    }

    /// Whether `PRAGMA integrity_check` finds the database sound.
    ///
    /// # Errors
    /// When the check itself cannot run.
    pub fn integrity_ok(&self) -> Result<bool> {
        let operation = "checking integrity";
        let mut statement = self
            .conn
            .prepare("PRAGMA integrity_check")
            .map_err(self.query_error(operation))?;
        let rows = statement
            .query_map([], |row| row.get::<_, String>(0))
            .map_err(self.query_error(operation))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.query_error(operation))?;
        Ok(rows == ["ok"])
    }

    /// A closure that wraps a SQLite error with this store's path and `operation`.
    fn query_error(
        &self,
        operation: &'static str,
    ) -> impl Fn(rusqlite::Error) -> StoreError + use<> {
        let path = self.path.clone();
        move |source| StoreError::Query {
            path: path.clone(),
            operation,
            source,
        }
    }

    fn not_found(&self, operation: &'static str, what: String) -> StoreError {
        StoreError::NotFound {
            path: self.path.clone(),
            operation,
            what,
        }
    }

    fn already_finished(&self, operation: &'static str, what: String) -> StoreError {
        StoreError::AlreadyFinished {
            path: self.path.clone(),
            operation,
            what,
        }
    }

    fn corrupt(&self, operation: &'static str, value: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            operation,
            value: value.into(),
        }
    }

    fn encode_error(
        &self,
        operation: &'static str,
    ) -> impl Fn(serde_json::Error) -> StoreError + use<> {
        let path = self.path.clone();
        move |source| StoreError::Encode {
            path: path.clone(),
            operation,
            source,
        }
    }
}

/// Creates the parent directory (0700) and the file (0600) before SQLite opens it, so the
/// database is never readable by other users, not even for a moment. SQLite gives the `-wal`
/// and `-shm` files the main file's permissions.
fn prepare_file(path: &Path) -> Result<()> {
    let prepare_error = |path: &Path| {
        let path = path.to_owned();
        move |source| StoreError::Prepare { path, source }
    };
    if let Some(parent) = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty() && !p.exists())
    {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(parent).map_err(prepare_error(parent))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(path).map_err(prepare_error(path))?;
    // A file created earlier (by hand, or by an older build) may be wider than 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(prepare_error(path))?;
    }
    drop(file);
    Ok(())
}

/// Per-connection settings. The journal mode is persistent in the file, so only the writer
/// sets it.
fn configure(conn: &Connection, writer: bool) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "cache_size", -CACHE_KIB)?;
    if writer {
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(%mode, "SQLite refused WAL journal mode");
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
    }
    Ok(())
}

/// Milliseconds since the Unix epoch, as stored (negative before 1970).
fn to_millis(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
    }
}

/// The inverse of [`to_millis`].
fn from_millis(millis: i64) -> SystemTime {
    let magnitude = Duration::from_millis(millis.unsigned_abs());
    if millis >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// Hides the password of every `scheme://user:password@host` in `text`.
///
/// A second line of defence: nothing the store is given should carry a credential, but a
/// download URL written with one in a manifest, or echoed back in PVE's error text, would.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace() || c == '"')
            .unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match authority.rfind('@') {
            Some(at_sign) => {
                let userinfo = &authority[..at_sign];
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(&userinfo[..colon]);
                        out.push_str(":***");
                    }
                    None => out.push_str("***"),
                }
                out.push_str(&authority[at_sign..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[authority_end..];
    }
    out.push_str(rest);
    out
}

/// Every stored row of every table, rendered as text, for tests that look for leaks.
#[cfg(test)]
fn dump(store: &Store) -> String {
    let tables: Vec<String> = store
        .conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let mut text = String::new();
    for table in tables {
        let mut statement = store
            .conn
            .prepare(&format!("SELECT * FROM \"{table}\""))
            .unwrap();
        let columns = statement.column_count();
        let mut rows = statement.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            text.push_str(&table);
            for i in 0..columns {
                let value = match row.get::<_, rusqlite::types::Value>(i).unwrap() {
                    rusqlite::types::Value::Blob(bytes) => String::from_utf8_lossy(&bytes).into(),
                    other => format!("{other:?}"),
                };
                text.push_str(" | ");
                text.push_str(&value);
            }
            text.push('\n');
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use proxops_core::diagnostic::Diagnostic;
    use proxops_core::plan::FindingKind;
    use proxops_core::resource::{Kind, ResourceId};
    use secrecy::{ExposeSecret, SecretString};

    use super::actions::tests::{at, download};
    use super::drift::tests::finding;
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn open_creates_a_private_directory_and_file_in_wal_mode() {
        let dir = tempfile::tempdir().unwrap();
        let state_dir = dir.path().join("var/lib/proxops");
        let path = state_dir.join("state.db");
        let mut store = Store::open(&path).unwrap();
        store
            .begin_pass("pve1", Some("aaa"), Trigger::Startup, at(0))
            .unwrap();

        assert_eq!(mode(&state_dir), 0o700);
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&path.with_extension("db-wal")), 0o600);
        let journal: String = store
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(journal, "wal");
        let foreign_keys: i64 = store
            .conn
            .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
            .unwrap();
        assert_eq!(foreign_keys, 1);
        let synchronous: i64 = store
            .conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(synchronous, 1, "NORMAL");
        let cache: i64 = store
            .conn
            .query_row("PRAGMA cache_size", [], |r| r.get(0))
            .unwrap();
        assert_eq!(cache, -CACHE_KIB, "a bounded page cache, in KiB");
        assert!(store.integrity_ok().unwrap());
    }

    #[test]
    fn open_tightens_the_permissions_of_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        std::fs::write(&path, b"").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(Store::open(&path).unwrap());
        assert_eq!(mode(&path), 0o600);
    }

    #[test]
    fn the_file_is_a_real_sqlite_database_readable_read_only_while_the_writer_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let mut writer = Store::open(&path).unwrap();
        let applied = writer
            .begin_pass("pve1", Some("aaa"), Trigger::Poll, at(0))
            .unwrap();
        writer
            .finish_pass(applied, PassOutcome::Applied, PassCounts::default(), at(1))
            .unwrap();

        // The writer is in the middle of a write transaction when `proxops status` looks.
        writer
            .conn
            .execute_batch(
                "BEGIN IMMEDIATE; INSERT INTO passes (node, revision, trigger_kind, started_at) \
                 VALUES ('pve1', 'bbb', 'poll', 0);",
            )
            .unwrap();
        let reader = Store::open_read_only(&path).unwrap();
        let last = reader.last_applied("pve1").unwrap().unwrap();
        assert_eq!(last.commit.as_deref(), Some("aaa"));
        assert_eq!(
            reader.last_attempted("pve1").unwrap().unwrap().id,
            applied,
            "uncommitted"
        );
        assert!(reader.integrity_ok().unwrap());
        let mut reader = reader;
        let refused = reader
            .begin_pass("pve1", None, Trigger::Cli, at(2))
            .unwrap_err();
        assert!(matches!(refused, StoreError::Query { .. }), "{refused:?}");

        writer.conn.execute_batch("COMMIT;").unwrap();
        let last = reader.last_attempted("pve1").unwrap().unwrap();
        assert_eq!(
            last.commit.as_deref(),
            Some("bbb"),
            "sees the commit once made"
        );

        let header = std::fs::read(&path).unwrap();
        assert!(header.starts_with(b"SQLite format 3\0"));
    }

    #[test]
    fn a_read_only_open_works_when_no_agent_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let mut writer = Store::open(&path).unwrap();
            let id = writer
                .begin_pass("pve1", Some("aaa"), Trigger::Poll, at(0))
                .unwrap();
            writer
                .finish_pass(id, PassOutcome::NoChange, PassCounts::default(), at(1))
                .unwrap();
        }
        let reader = Store::open_read_only(&path).unwrap();
        let last = reader.last_applied("pve1").unwrap().unwrap();
        assert_eq!(last.commit.as_deref(), Some("aaa"));
    }

    #[test]
    fn a_read_only_open_of_a_missing_file_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.db");
        let error = Store::open_read_only(&path).unwrap_err();
        assert!(matches!(error, StoreError::Open { .. }), "{error:?}");
        assert!(error.to_string().contains("absent.db"), "{error}");
        assert!(!path.exists(), "a read-only open never creates the file");
    }

    #[test]
    fn errors_name_the_database_and_operation_without_repeating_their_source() {
        let store = Store::memory().unwrap();
        let error = store.query_error("listing recent passes")(rusqlite::Error::InvalidQuery);
        let message = error.to_string();
        assert_eq!(
            message,
            "listing recent passes in the state database :memory:"
        );
        let source = std::error::Error::source(&error).unwrap().to_string();
        assert!(!message.contains(&source));
    }

    #[test]
    fn redact_hides_url_passwords_and_nothing_else() {
        assert_eq!(
            redact("fetching https://mirror:hunter2@example.org/a.iso failed"),
            "fetching https://mirror:***@example.org/a.iso failed"
        );
        assert_eq!(
            redact("https://token@example.org/x"),
            "https://***@example.org/x"
        );
        assert_eq!(
            redact("https://example.org/a@b.iso"),
            "https://example.org/a@b.iso"
        );
        assert_eq!(redact("no url: at all @ here"), "no url: at all @ here");
        assert_eq!(redact("a://u:p@h b://h2"), "a://u:***@h b://h2");
    }

    /// The store takes no secret type; this checks that a realistic pass, including a
    /// download URL and a PVE error that carry a password, leaves no secret in any table.
    #[test]
    fn a_realistic_pass_leaves_no_secret_in_any_table() {
        let api_token = SecretString::from("pve-token-9f1c2b7e-0d4a-4c55-b1e3");
        let url_password = "mirror-pass-71d0c3";
        let url = format!("https://mirror:{url_password}@example.org/debian.iso");
        let mut store = Store::memory().unwrap();

        let pass = store
            .begin_pass("pve1", Some("c0ffee"), Trigger::Webhook, at(0))
            .unwrap();
        let action = download("debian", "pve1", &url);
        let id = store.record_action_started(pass, &action, at(1)).unwrap();
        store
            .record_task_started(
                id,
                "UPID:pve1:00000001:00000002:00000003:download:debian.iso:root@pam!proxops:",
                at(2),
            )
            .unwrap();
        let error = format!("download of {url} failed: 401 Unauthorized");
        store
            .record_action_result(id, &ActionOutcome::Failed { error }, at(3))
            .unwrap();
        let mut drifted = finding("debian", "pve1", FindingKind::ObserveFailed);
        drifted.desired = url.clone();
        store
            .record_findings("pve1", Some("c0ffee"), at(4), &[drifted])
            .unwrap();
        store
            .upsert_owned("pve1", &ResourceId::new(Kind::Vm, "web-1"), 100)
            .unwrap();
        store
            .finish_pass(
                pass,
                PassOutcome::Failed,
                PassCounts {
                    actions_failed: 1,
                    findings: 1,
                    ..PassCounts::default()
                },
                at(5),
            )
            .unwrap();
        let invalid = store
            .begin_pass("pve1", Some("badbad"), Trigger::Poll, at(6))
            .unwrap();
        let diagnostic = Diagnostic::error(
            "iso/base/debian.yaml",
            4,
            8,
            "spec.url",
            format!("`{url}` is not reachable"),
        );
        store.record_invalid(invalid, &[diagnostic]).unwrap();
        store
            .finish_pass(invalid, PassOutcome::Invalid, PassCounts::default(), at(7))
            .unwrap();

        let dump = dump(&store);
        assert!(
            dump.contains("c0ffee") && dump.contains("example.org/debian.iso"),
            "{dump}"
        );
        assert!(!dump.contains(api_token.expose_secret()), "{dump}");
        assert!(!dump.contains(url_password), "{dump}");
    }
}
