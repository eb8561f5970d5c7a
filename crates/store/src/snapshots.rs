//! The guest snapshots ProxOps took before risky updates (issue 19): which guest, the
//! snapshot's name, the revision and pass it was taken for, when, and when retention deleted
//! it. Retention and `proxops rollback` act only on snapshots recorded here, so a snapshot
//! someone else made (even one named `proxops-*`) is never touched.

use std::time::SystemTime;

use proxops_core::resource::{Kind, ResourceId};
use rusqlite::{OptionalExtension, Row, params};

use super::{PassId, Result, Store, from_millis, to_millis};

/// One snapshot ProxOps took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    /// The node the guest was on.
    pub node: String,
    /// The guest's vmid.
    pub vmid: u32,
    /// `qemu` or `lxc`.
    pub guest_type: String,
    /// The resource that declares the guest.
    pub resource: ResourceId,
    /// The snapshot's name on PVE.
    pub name: String,
    /// The revision whose update it was taken before.
    pub revision: String,
    /// The pass that took it (`None` when not taken by a pass).
    pub pass: Option<PassId>,
    /// When it was taken.
    pub taken_at: SystemTime,
    /// When retention deleted it (`None`: still on PVE as far as ProxOps knows).
    pub deleted_at: Option<SystemTime>,
}

const COLUMNS: &str = "node, vmid, guest_type, resource_kind, resource_name, name, revision, \
                       pass_id, taken_at, deleted_at";

fn record(row: &Row<'_>) -> rusqlite::Result<SnapshotRecord> {
    let kind: String = row.get(3)?;
    let kind = kind.parse::<Kind>().map_err(|_| {
        rusqlite::Error::FromSqlConversionFailure(
            3,
            rusqlite::types::Type::Text,
            format!("unknown resource kind `{kind}`").into(),
        )
    })?;
    Ok(SnapshotRecord {
        node: row.get(0)?,
        vmid: row.get(1)?,
        guest_type: row.get(2)?,
        resource: ResourceId::new(kind, row.get::<_, String>(4)?),
        name: row.get(5)?,
        revision: row.get(6)?,
        pass: row.get::<_, Option<i64>>(7)?.map(PassId),
        taken_at: from_millis(row.get(8)?),
        deleted_at: row.get::<_, Option<i64>>(9)?.map(from_millis),
    })
}

impl Store {
    /// Records a snapshot ProxOps took.
    ///
    /// # Errors
    /// When the row cannot be written (the same name on the same guest twice, too).
    pub fn record_snapshot(&mut self, snapshot: &SnapshotRecord) -> Result<()> {
        self.conn
            .execute(
                &format!("INSERT INTO snapshots ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
                params![
                    snapshot.node,
                    snapshot.vmid,
                    snapshot.guest_type,
                    snapshot.resource.kind.to_string(),
                    snapshot.resource.name,
                    snapshot.name,
                    snapshot.revision,
                    snapshot.pass.map(|p| p.0),
                    to_millis(snapshot.taken_at),
                    snapshot.deleted_at.map(to_millis),
                ],
            )
            .map_err(self.query_error("recording a snapshot"))?;
        Ok(())
    }

    /// The snapshots ProxOps took of guest `vmid` on `node` and has not deleted, oldest
    /// first.
    ///
    /// # Errors
    /// When the rows cannot be read.
    pub fn live_snapshots(&self, node: &str, vmid: u32) -> Result<Vec<SnapshotRecord>> {
        let operation = "reading a guest's snapshots";
        let mut statement = self
            .conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM snapshots WHERE node = ?1 AND vmid = ?2 \
                 AND deleted_at IS NULL ORDER BY taken_at, id"
            ))
            .map_err(self.query_error(operation))?;
        statement
            .query_map(params![node, vmid], record)
            .map_err(self.query_error(operation))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.query_error(operation))
    }

    /// The snapshots ProxOps took of `resource`'s guest and has not deleted, newest first.
    ///
    /// # Errors
    /// When the rows cannot be read.
    pub fn snapshots_of(&self, resource: &ResourceId) -> Result<Vec<SnapshotRecord>> {
        let operation = "reading a resource's snapshots";
        let mut statement = self
            .conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM snapshots WHERE resource_kind = ?1 AND resource_name = ?2 \
                 AND deleted_at IS NULL ORDER BY taken_at DESC, id DESC"
            ))
            .map_err(self.query_error(operation))?;
        statement
            .query_map(params![resource.kind.to_string(), resource.name], record)
            .map_err(self.query_error(operation))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.query_error(operation))
    }

    /// Marks snapshot `name` of guest `vmid` on `node` deleted at `at`; whether a recorded
    /// snapshot was marked.
    ///
    /// # Errors
    /// When the row cannot be written.
    pub fn snapshot_deleted(
        &mut self,
        node: &str,
        vmid: u32,
        name: &str,
        at: SystemTime,
    ) -> Result<bool> {
        let changed = self
            .conn
            .execute(
                "UPDATE snapshots SET deleted_at = ?4 WHERE node = ?1 AND vmid = ?2 AND name = ?3 \
                 AND deleted_at IS NULL",
                params![node, vmid, name, to_millis(at)],
            )
            .map_err(self.query_error("marking a snapshot deleted"))?;
        Ok(changed > 0)
    }

    /// The recorded snapshot `name` of guest `vmid` on `node`, deleted or not.
    ///
    /// # Errors
    /// When the row cannot be read.
    pub fn snapshot(&self, node: &str, vmid: u32, name: &str) -> Result<Option<SnapshotRecord>> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {COLUMNS} FROM snapshots WHERE node = ?1 AND vmid = ?2 AND name = ?3"
                ),
                params![node, vmid, name],
                record,
            )
            .optional()
            .map_err(self.query_error("reading a snapshot"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actions::tests::at;
    use crate::migrations::MIGRATIONS;

    fn snap(name: &str, taken: u64) -> SnapshotRecord {
        SnapshotRecord {
            node: "pve1".to_owned(),
            vmid: 100,
            guest_type: "qemu".to_owned(),
            resource: ResourceId::new(Kind::Vm, "app"),
            name: name.to_owned(),
            revision: "0123abc".to_owned(),
            pass: Some(PassId(7)),
            taken_at: at(taken),
            deleted_at: None,
        }
    }

    #[test]
    fn recorded_snapshots_are_listed_oldest_first_per_guest_and_newest_first_per_resource() {
        let mut store = Store::memory().unwrap();
        store.record_snapshot(&snap("proxops-a-2", 20)).unwrap();
        store.record_snapshot(&snap("proxops-a-1", 10)).unwrap();
        let other = SnapshotRecord {
            vmid: 101,
            resource: ResourceId::new(Kind::Vm, "db"),
            ..snap("proxops-a-1", 5)
        };
        store.record_snapshot(&other).unwrap();
        let live: Vec<String> = store
            .live_snapshots("pve1", 100)
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(live, ["proxops-a-1", "proxops-a-2"]);
        let newest = &store
            .snapshots_of(&ResourceId::new(Kind::Vm, "app"))
            .unwrap()[0];
        assert_eq!(newest, &snap("proxops-a-2", 20));
    }

    #[test]
    fn a_deleted_snapshot_is_no_longer_live_but_stays_on_record() {
        let mut store = Store::memory().unwrap();
        store.record_snapshot(&snap("proxops-a-1", 10)).unwrap();
        assert!(
            store
                .snapshot_deleted("pve1", 100, "proxops-a-1", at(30))
                .unwrap()
        );
        assert!(
            !store
                .snapshot_deleted("pve1", 100, "proxops-a-1", at(31))
                .unwrap()
        );
        assert!(
            !store
                .snapshot_deleted("pve1", 100, "someone-elses", at(31))
                .unwrap()
        );
        assert!(store.live_snapshots("pve1", 100).unwrap().is_empty());
        let kept = store.snapshot("pve1", 100, "proxops-a-1").unwrap().unwrap();
        assert_eq!(kept.deleted_at, Some(at(30)));
        assert_eq!(store.snapshot("pve1", 100, "proxops-x-9").unwrap(), None);
    }

    #[test]
    fn the_snapshots_table_is_added_to_a_database_of_the_previous_version_with_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let previous = &MIGRATIONS[..MIGRATIONS.len() - 1];
        let resource = ResourceId::new(Kind::Vm, "app");
        {
            let mut store = Store::open_with(&path, previous).unwrap();
            store.upsert_owned("pve1", &resource, 100).unwrap();
        }
        let mut store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap() as usize, MIGRATIONS.len());
        assert_eq!(store.owned(None).unwrap().len(), 1);
        store.record_snapshot(&snap("proxops-a-1", 10)).unwrap();
        assert_eq!(store.live_snapshots("pve1", 100).unwrap().len(), 1);
    }
}
