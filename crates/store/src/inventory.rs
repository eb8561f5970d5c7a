//! The inventory: the guests ProxOps owns on each node, keyed by their PVE identity (node,
//! vmid) and remembering the resource that declared them.
//!
//! Prune will be `inventory − desired`, never `observed − desired` (STYLE.md H6): a guest is
//! added here when ProxOps creates or adopts it and removed only once its delete succeeded,
//! so a failed delete stays and is retried by the next pass. Storage artifacts are never
//! pruned and are not recorded here.

use std::collections::BTreeMap;

use proxops_core::plan::Creation;
use proxops_core::resource::ResourceId;
use rusqlite::params;
use serde_json::Value;

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

impl Store {
    /// How each owned guest on `node` (or every node, `None` or `"*"`) was created: from its
    /// last succeeded `create` or `clone` action, whose recorded detail holds the create
    /// parameters or the clone source. PVE keeps neither (the clone source, `ostemplate`,
    /// `import-from`), and the planner needs them to report a changed one as
    /// requires-recreate. Guests without such a record (adopted, created by the Go program)
    /// are left out.
    ///
    /// # Errors
    /// When the query fails or a recorded detail is not the JSON this binary writes.
    pub fn creations(&self, node: Option<&str>) -> Result<Vec<(String, u32, Creation)>> {
        let operation = "reading how owned guests were created";
        let query_error = self.query_error(operation);
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT a.node, i.vmid, a.detail FROM actions a JOIN inventory i \
                 ON i.node = a.node AND i.vmid = json_extract(a.detail, '$.vmid') \
                 WHERE a.verb IN ('create', 'clone') AND a.result = 'succeeded' \
                 AND (?1 = ?2 OR a.node = ?1) ORDER BY a.id",
            )
            .map_err(&query_error)?;
        let rows = statement
            .query_map(params![node.unwrap_or(ALL_NODES), ALL_NODES], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, u32>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })
            .map_err(&query_error)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(&query_error)?;
        // A guest deleted and created again: its last creation counts.
        let mut latest = BTreeMap::new();
        for (node, vmid, detail) in rows {
            let creation = creation_of(&detail).ok_or_else(|| self.corrupt(operation, detail))?;
            latest.insert((node, vmid), creation);
        }
        Ok(latest
            .into_iter()
            .map(|((node, vmid), creation)| (node, vmid, creation))
            .collect())
    }
}

/// The creation facts in a recorded `create` or `clone` detail (`Verb` as JSON).
fn creation_of(detail: &str) -> Option<Creation> {
    let verb: Value = serde_json::from_str(detail).ok()?;
    match verb.get("verb")?.as_str()? {
        "clone" => Some(Creation::cloned_from(verb.get("source")?.as_str()?)),
        "create" => {
            let params: BTreeMap<String, String> = verb
                .get("params")?
                .as_object()?
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect();
            Some(Creation::created_with(&params))
        }
        _ => None,
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
    fn how_an_owned_guest_was_created_comes_from_its_last_succeeded_create_or_clone() {
        use std::time::{Duration, UNIX_EPOCH};

        use proxops_core::guest::GuestType;
        use proxops_core::plan::{Action, CloneFrom, Create, Verb};

        use crate::{ActionOutcome, Trigger};

        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(1_764_400_000 + s);
        let mut store = Store::memory().unwrap();
        let pass = store
            .begin_pass("pve1", Some("aaa"), Trigger::Poll, at(0))
            .unwrap();
        let ok = ActionOutcome::Succeeded {
            exitstatus: "OK".into(),
        };
        let mut record = |name: &str, verb: Verb, outcome: &ActionOutcome| {
            let action = Action {
                resource: ResourceId::new(Kind::Vm, name),
                node: "pve1".into(),
                verb,
                reason: "no guest has this vmid".into(),
            };
            let id = store.record_action_started(pass, &action, at(1)).unwrap();
            store.record_action_result(id, outcome, at(2)).unwrap();
        };
        let params = [
            ("scsi0", "local-lvm:0,import-from=local:import/deb13.qcow2"),
            ("memory", "2048"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
        let create = Verb::Create(Create {
            vmid: 101,
            guest_type: GuestType::Qemu,
            params,
            grow: Vec::new(),
            after: Default::default(),
        });
        let clone = |source: &str| {
            Verb::Clone(CloneFrom {
                vmid: 103,
                source: source.into(),
                source_vmid: 9000,
                name: "app".into(),
                pool: None,
            })
        };
        record("web", create, &ok);
        record("app", clone("golden"), &ok);
        record("app", clone("golden-v2"), &ok);
        let failed = ActionOutcome::Failed {
            error: "boom".into(),
        };
        record("app", clone("golden-v3"), &failed);
        store
            .upsert_owned("pve1", &ResourceId::new(Kind::Vm, "web"), 101)
            .unwrap();
        store
            .upsert_owned("pve1", &ResourceId::new(Kind::Vm, "app"), 103)
            .unwrap();

        let creations = store.creations(None).unwrap();
        assert_eq!(creations.len(), 2);
        assert_eq!(creations[0].1, 101);
        assert_eq!(creations[0].2.imports["scsi0"], "local:import/deb13.qcow2");
        assert_eq!(
            creations[1],
            ("pve1".to_owned(), 103, Creation::cloned_from("golden-v2"))
        );
        // Forgotten once deleted.
        store.remove_owned("pve1", 103).unwrap();
        assert_eq!(store.creations(Some("pve1")).unwrap().len(), 1);
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
