//! The inventory: the guests ProxOps owns on each node, keyed by their PVE identity (node,
//! vmid) and remembering the resource that declared them.
//!
//! Prune will be `inventory − desired`, never `observed − desired` (STYLE.md H6): a guest is
//! added here when ProxOps creates or adopts it and removed only once its delete succeeded,
//! so a failed delete stays and is retried by the next pass. Storage artifacts are never
//! pruned and are not recorded here.

use proxops_core::resource::ResourceId;
use rusqlite::params;

use super::{ALL_NODES, Result, Store};

/// A guest ProxOps owns.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct OwnedGuest {
    /// The node it lives on.
    pub node: String,
    /// Its vmid.
    pub vmid: u32,
    /// The resource that declared it (its kind says qemu or lxc).
    pub resource: ResourceId,
}

impl Store {
    /// Records that ProxOps owns the guest `vmid` on `node`, declared as `resource`. A guest
    /// already recorded at that (node, vmid) takes the new resource (a rename in git).
    ///
    /// # Errors
    /// When the row cannot be written.
    pub fn upsert_owned(&mut self, node: &str, resource: &ResourceId, vmid: u32) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO inventory (node, vmid, resource_kind, resource_name) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (node, vmid) DO UPDATE SET \
                 resource_kind = excluded.resource_kind, resource_name = excluded.resource_name",
                params![node, vmid, resource.kind.as_str(), resource.name],
            )
            .map_err(self.query_error("recording an owned guest"))?;
        Ok(())
    }

    /// Forgets the guest `vmid` on `node` (after its delete succeeded). Returns whether it
    /// was recorded.
    ///
    /// # Errors
    /// When the row cannot be written.
    pub fn remove_owned(&mut self, node: &str, vmid: u32) -> Result<bool> {
        let removed = self
            .conn
            .execute(
                "DELETE FROM inventory WHERE node = ?1 AND vmid = ?2",
                params![node, vmid],
            )
            .map_err(self.query_error("forgetting an owned guest"))?;
        Ok(removed > 0)
    }

    /// The guests owned on `node`, or on every node (`None` or `"*"`), by node and vmid.
    ///
    /// # Errors
    /// When the query fails or a row holds a kind this binary does not write.
    pub fn owned(&self, node: Option<&str>) -> Result<Vec<OwnedGuest>> {
        let operation = "listing owned guests";
        let query_error = self.query_error(operation);
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT node, vmid, resource_kind, resource_name FROM inventory \
                 WHERE ?1 = ?2 OR node = ?1 ORDER BY node, vmid",
            )
            .map_err(&query_error)?;
        let rows = statement
            .query_map(params![node.unwrap_or(ALL_NODES), ALL_NODES], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, u32>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, String>(3)?,
                ))
            })
            .map_err(&query_error)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(&query_error)?;
        rows.into_iter()
            .map(|(node, vmid, kind, name)| {
                let kind = kind
                    .parse()
                    .map_err(|_| self.corrupt(operation, kind.clone()))?;
                Ok(OwnedGuest {
                    node,
                    vmid,
                    resource: ResourceId::new(kind, name),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use proxops_core::resource::Kind;

    use super::*;

    #[test]
    fn owned_guests_are_listed_per_node_until_removed() {
        let mut store = Store::memory().unwrap();
        let web = ResourceId::new(Kind::Vm, "web-1");
        let db = ResourceId::new(Kind::Lxc, "db-1");
        store.upsert_owned("pve1", &web, 101).unwrap();
        store.upsert_owned("pve1", &db, 100).unwrap();
        store
            .upsert_owned("pve2", &ResourceId::new(Kind::Vm, "web-2"), 200)
            .unwrap();

        let pve1 = store.owned(Some("pve1")).unwrap();
        let vmids: Vec<_> = pve1.iter().map(|g| (g.vmid, g.resource.clone())).collect();
        assert_eq!(vmids, [(100, db.clone()), (101, web.clone())]);
        assert_eq!(store.owned(None).unwrap().len(), 3);

        assert!(store.remove_owned("pve1", 101).unwrap());
        assert!(!store.remove_owned("pve1", 101).unwrap(), "already gone");
        assert_eq!(store.owned(Some("pve1")).unwrap().len(), 1);
    }

    #[test]
    fn recording_an_owned_guest_again_is_idempotent_and_follows_a_rename() {
        let mut store = Store::memory().unwrap();
        store
            .upsert_owned("pve1", &ResourceId::new(Kind::Vm, "web"), 101)
            .unwrap();
        store
            .upsert_owned("pve1", &ResourceId::new(Kind::Vm, "web"), 101)
            .unwrap();
        store
            .upsert_owned("pve1", &ResourceId::new(Kind::Vm, "frontend"), 101)
            .unwrap();
        let owned = store.owned(Some("pve1")).unwrap();
        assert_eq!(owned.len(), 1);
        assert_eq!(owned[0].resource.name, "frontend");
    }
}
