//! Guest snapshots (issue 19, item 7): list, create, delete, rollback and the `feature`
//! check, for qemu and LXC, modelled on PVE's handlers:
//!
//! - list: qemu-server @ e6352be6 `src/PVE/API2/Qemu.pm` `snapshot_list` (every snapshot
//!   with `name`, `snaptime`, `vmstate` 0/1, `description`, `parent`, `snapstate`, then the
//!   `current` pseudo entry: `digest`, `running`, `description => "You are here!"`, its
//!   `parent`); pve-container @ 94f5585 `src/PVE/API2/LXC/Snapshot.pm` `list` is the same
//!   without `vmstate` and `digest`.
//! - create: `snapshot` refuses `current` and `pending` (qemu) / `current` and `vzdump` (LXC)
//!   synchronously, then forks `qmsnapshot`/`vzsnapshot`. The worker is
//!   pve-guest-common @ 4a8f6cb `src/PVE/AbstractConfig.pm` `snapshot_create`:
//!   `__snapshot_prepare` (template → `you can't take a snapshot if it's a template`,
//!   `check_lock` → `VM is locked (...)`, a used name → `snapshot name '...' already used`,
//!   `has_feature('snapshot')` false → `snapshot feature is not available`; then
//!   `lock: snapshot` and the section with `snapstate: prepare`), the volume snapshots, and
//!   `__snapshot_commit` (drops `snapstate` and the lock, sets the config's `parent`). The
//!   checks and the lock happen when the task starts, the commit when it ends, so the lock
//!   is visible while it runs.
//! - delete: `delsnapshot` forks `qmdelsnapshot`/`vzdelsnapshot`; `snapshot_delete` checks
//!   the name exists, takes `lock: snapshot-delete` (`set_lock` → `check_lock`), refuses a
//!   template, marks `snapstate: delete`, and at the end removes the section, re-links the
//!   parents and drops the lock.
//! - rollback: `rollback` forks `qmrollback`/`vzrollback`; `snapshot_rollback` refuses a
//!   template, an unknown or incomplete snapshot and a locked guest, stops a running guest
//!   (qemu-server `QemuConfig::__snapshot_rollback_vm_stop` always calls `vm_stop`;
//!   pve-container `LXC::Config::__snapshot_rollback_vm_stop` when it runs), takes
//!   `lock: rollback`, and at the end applies the snapshot's config
//!   (`__snapshot_apply_config`: the snapshot list, `description` and `unusedN` stay),
//!   adds the current volumes the snapshot does not name as `unusedN`
//!   (`__snapshot_rollback_get_unused`), sets `parent` and drops the lock. Only a snapshot
//!   with RAM state starts the VM again; `start=1` starts it too.
//! - feature: qemu `vm_feature` / LXC `vm_feature` answer `hasFeature` (0/1) from
//!   `has_feature`: every volume but CD-ROMs (qemu) must have the feature on its storage
//!   (`PVE::Storage::volume_has_feature`, a path or bind mount never has it), and `nodes`
//!   from `shared_nodes` (qemu-server `src/PVE/QemuServer.pm`).
//!
//! Each storage type's snapshot capability is its plugin's `volume_has_feature`
//! (pve-storage @ 0c56bad, `src/PVE/Storage/*Plugin.pm`), see [`storage_can_snapshot`].

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::Ctx;
use super::config::wait_config_lock;
use crate::cluster::{Cluster, now_epoch};
use crate::error::{ApiError, ApiResult};
use crate::guest::{self, Guest, Kind, Snapshot};
use crate::property::PropertyString;
use crate::storage;
use crate::task::{self, TaskSpec, Work};

/// Keys `__snapshot_copy_config` leaves out of a snapshot's copy of the config.
fn copied(key: &str) -> bool {
    !matches!(
        key,
        "snapshots" | "snapstate" | "snaptime" | "vmstate" | "lock" | "digest" | "description"
    ) && !guest::is_unused_key(key)
}

/// Whether storage type `kind` can snapshot a volume of `format` (`snap`: a volume
/// snapshot of a snapshot, the `feature?snapname=` case), per the plugins'
/// `volume_has_feature` tables (pve-storage @ 0c56bad):
///
/// - `lvmthin` (`LvmThinPlugin.pm`): `snapshot => { current => 1 }`;
/// - `zfspool`, `zfs` (`ZFSPoolPlugin.pm`, `ZFSPlugin.pm` inherits it) and `rbd`
///   (`RBDPlugin.pm`): `current` and `snap`;
/// - `btrfs` (`BTRFSPlugin.pm`): `qcow2`, `raw` and `subvol`;
/// - `lvm` (`LVMPlugin.pm`): `qcow2` only, so PVE's plain raw LVs never;
/// - `dir`, `nfs`, `cifs`, `glusterfs`, `cephfs` (`Plugin.pm`'s default): `qcow2` only;
/// - anything else (`iscsi`, `iscsidirect`, `pbs`, ...): no.
pub(crate) fn storage_can_snapshot(kind: &str, format: &str, snap: bool) -> bool {
    match kind {
        "lvmthin" => !snap,
        "zfspool" | "zfs" | "rbd" => true,
        "btrfs" => matches!(format, "qcow2" | "raw" | "subvol"),
        "lvm" | "dir" | "nfs" | "cifs" | "glusterfs" | "cephfs" => format == "qcow2",
        _ => false,
    }
}

/// The volumes `has_feature` looks at in `config`: (key, volume value's file or volume).
fn feature_volumes(kind: Kind, config: &BTreeMap<String, String>) -> Vec<(String, String)> {
    config
        .iter()
        .filter(|(k, v)| match kind {
            Kind::Qemu => guest::is_qemu_disk_key(k) && !guest::is_cdrom(v),
            Kind::Lxc => guest::is_lxc_volume_key(k),
        })
        .map(|(k, v)| {
            let key = if kind == Kind::Qemu { "file" } else { "volume" };
            let file = PropertyString::parse(v, Some(key))
                .get(key)
                .unwrap_or_default()
                .to_string();
            (k.clone(), file)
        })
        .collect()
}

/// Whether every volume of `config` can be snapshotted on `node`.
fn has_snapshot_feature(
    c: &Cluster,
    node: &str,
    kind: Kind,
    config: &BTreeMap<String, String>,
    snap: bool,
) -> bool {
    feature_volumes(kind, config).iter().all(|(_, volid)| {
        let Some((sid, volname)) = storage::split_volid(volid) else {
            return false; // a device path or bind mount
        };
        let Some(def) = c.storages.iter().find(|s| s.id == sid) else {
            return false;
        };
        let format = c
            .volume(node, volid)
            .map(|v| v.format)
            .or_else(|| storage::parse_volname(volname).ok().map(|p| p.format))
            .unwrap_or_default();
        let format = if format.is_empty() {
            "raw".to_string()
        } else {
            format
        };
        storage_can_snapshot(&def.kind, &format, snap)
    })
}

/// `shared_nodes`: the nodes where every volume's storage is available.
fn shared_nodes(
    c: &Cluster,
    node: &str,
    kind: Kind,
    config: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut nodes: Vec<String> = c.nodes.keys().cloned().collect();
    for (_, volid) in feature_volumes(kind, config) {
        let Some((sid, _)) = storage::split_volid(&volid) else {
            continue;
        };
        let Some(def) = c.storages.iter().find(|s| s.id == sid) else {
            continue;
        };
        if !def.enabled {
            nodes.clear();
        } else if let Some(avail) = &def.nodes {
            nodes.retain(|n| avail.contains(n));
        } else if !def.shared {
            nodes.retain(|n| n == node);
        }
    }
    nodes
}

fn ids(ctx: &Ctx) -> ApiResult<(String, u32)> {
    Ok((ctx.node().to_string(), ctx.params.vmid("vmid")?))
}

/// `AbstractConfig::check_lock`: `VM is locked (snapshot)` (the guest type, no vmid).
fn check_lock(g: &Guest) -> Result<(), String> {
    match g.lock() {
        Some(lock) => Err(format!("{} is locked ({lock})", g.kind.noun())),
        None => Ok(()),
    }
}

fn start_task(
    ctx: &Ctx,
    c: &mut Cluster,
    node: &str,
    kind: Kind,
    what: &str,
    vmid: u32,
    work: Work,
) -> Value {
    let spec = TaskSpec {
        node,
        kind: &format!("{}{what}", kind.task_prefix()),
        id: vmid.to_string(),
        user: ctx.authid(),
    };
    Value::String(task::start(&ctx.shared, c, &spec, work))
}

/// A task that fails with `message` when it ends (a check PVE makes inside the worker).
fn failing(message: String) -> Work {
    Box::new(move |_c, _log, _injected| Err(message))
}

/// `GET .../snapshot`.
pub(super) fn list(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = ids(ctx)?;
    let cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    let g = cluster.guest(&node, vmid, kind)?;
    let mut out: Vec<Value> = g
        .snapshots
        .iter()
        .map(|(name, s)| {
            let mut item = json!({
                "name": name,
                "snaptime": s.snaptime,
                "description": s.description,
            });
            if kind == Kind::Qemu {
                item["vmstate"] = json!(u8::from(s.vmstate));
            }
            if let Some(parent) = &s.parent {
                item["parent"] = json!(parent);
            }
            if let Some(state) = &s.snapstate {
                item["snapstate"] = json!(state);
            }
            item
        })
        .collect();
    let mut current = json!({
        "name": "current",
        "running": u8::from(g.running),
        "description": "You are here!",
    });
    if kind == Kind::Qemu {
        current["digest"] = json!(g.digest());
    }
    if let Some(parent) = g.config.get("parent") {
        current["parent"] = json!(parent);
    }
    out.push(current);
    Ok(Value::Array(out))
}

/// `POST .../snapshot`.
pub(super) async fn create(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = ids(ctx)?;
    let snapname = ctx.params.required("snapname")?.to_string();
    let reserved = match kind {
        Kind::Qemu => snapname == "current" || snapname.eq_ignore_ascii_case("pending"),
        Kind::Lxc => snapname == "current" || snapname == "vzdump",
    };
    if reserved {
        let shown = if kind == Kind::Qemu && snapname.eq_ignore_ascii_case("pending") {
            "pending".to_string()
        } else {
            snapname.clone()
        };
        return Err(ApiError::die(format!(
            "unable to use snapshot name '{shown}' (reserved name)"
        )));
    }
    {
        let cluster = ctx.shared.cluster();
        cluster.node(&node)?;
        cluster.guest(&node, vmid, kind)?;
    }
    wait_config_lock(ctx, kind, vmid).await?;
    let want_vmstate = ctx.params.flag("vmstate").unwrap_or(false);
    let description = ctx
        .params
        .get("description")
        .unwrap_or_default()
        .to_string();
    let mut cluster = ctx.shared.cluster();
    let g = cluster.guest(&node, vmid, kind)?.clone();
    let problem = if g.is_template() {
        Some("you can't take a snapshot if it's a template".to_string())
    } else if let Err(locked) = check_lock(&g) {
        Some(locked)
    } else if g.snapshots.contains_key(&snapname) {
        Some(format!("snapshot name '{snapname}' already used"))
    } else if !has_snapshot_feature(&cluster, &node, kind, &g.config, false) {
        Some("snapshot feature is not available".to_string())
    } else {
        None
    };
    if let Some(problem) = problem {
        return Ok(start_task(
            ctx,
            &mut cluster,
            &node,
            kind,
            "snapshot",
            vmid,
            failing(problem),
        ));
    }
    // `__snapshot_prepare`: the lock and the section in state `prepare`, at once.
    let snapshot = Snapshot {
        config: g
            .config
            .iter()
            .filter(|(k, _)| copied(k) && k.as_str() != "parent")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        snaptime: now_epoch(),
        description,
        snapstate: Some("prepare".to_string()),
        vmstate: kind == Kind::Qemu && want_vmstate && g.running,
        parent: g.config.get("parent").cloned(),
    };
    if let Some(live) = cluster.guests.get_mut(&vmid) {
        live.config
            .insert("lock".to_string(), "snapshot".to_string());
        live.snapshots.insert(snapname.clone(), snapshot);
    }
    let name = snapname.clone();
    let work: Work = Box::new(move |c, log, injected| {
        let Some(g) = c.guests.get_mut(&vmid) else {
            return Err(format!("guest {vmid} vanished"));
        };
        if let Some(m) = injected {
            // `snapshot_create` cleans up with `snapshot_delete(..., force)`.
            g.snapshots.remove(&name);
            g.config.remove("lock");
            return Err(m);
        }
        if let Some(s) = g.snapshots.get_mut(&name) {
            s.snapstate = None;
        }
        g.config.remove("lock");
        g.config.insert("parent".to_string(), name.clone());
        log.push(format!("snapshot '{name}' created"));
        Ok(())
    });
    Ok(start_task(
        ctx,
        &mut cluster,
        &node,
        kind,
        "snapshot",
        vmid,
        work,
    ))
}

/// `DELETE .../snapshot/{snapname}`.
pub(super) async fn delete(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = ids(ctx)?;
    let snapname = ctx.params.required("snapname")?.to_string();
    {
        let cluster = ctx.shared.cluster();
        cluster.node(&node)?;
        cluster.guest(&node, vmid, kind)?;
    }
    wait_config_lock(ctx, kind, vmid).await?;
    let mut cluster = ctx.shared.cluster();
    let g = cluster.guest(&node, vmid, kind)?.clone();
    let problem = if !g.snapshots.contains_key(&snapname) {
        Some(format!("snapshot '{snapname}' does not exist"))
    } else if let Err(locked) = check_lock(&g) {
        Some(locked)
    } else if g.is_template() {
        Some("you can't delete a snapshot if vm is a template".to_string())
    } else {
        None
    };
    if let Some(problem) = problem {
        return Ok(start_task(
            ctx,
            &mut cluster,
            &node,
            kind,
            "delsnapshot",
            vmid,
            failing(problem),
        ));
    }
    if let Some(live) = cluster.guests.get_mut(&vmid) {
        live.config
            .insert("lock".to_string(), "snapshot-delete".to_string());
        if let Some(s) = live.snapshots.get_mut(&snapname) {
            s.snapstate = Some("delete".to_string());
        }
    }
    let name = snapname.clone();
    let work: Work = Box::new(move |c, _log, injected| {
        let Some(g) = c.guests.get_mut(&vmid) else {
            return Err(format!("guest {vmid} vanished"));
        };
        if let Some(m) = injected {
            // The lock stays, as PVE leaves it after a failed delete.
            return Err(m);
        }
        let parent = g.snapshots.remove(&name).and_then(|s| s.parent);
        let relink = |slot: &mut Option<String>| {
            if slot.as_deref() == Some(name.as_str()) {
                slot.clone_from(&parent);
            }
        };
        for s in g.snapshots.values_mut() {
            relink(&mut s.parent);
        }
        let mut current = g.config.get("parent").cloned();
        relink(&mut current);
        match current {
            Some(p) => g.config.insert("parent".to_string(), p),
            None => g.config.remove("parent"),
        };
        g.config.remove("lock");
        Ok(())
    });
    Ok(start_task(
        ctx,
        &mut cluster,
        &node,
        kind,
        "delsnapshot",
        vmid,
        work,
    ))
}

/// `POST .../snapshot/{snapname}/rollback`.
pub(super) async fn rollback(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = ids(ctx)?;
    let snapname = ctx.params.required("snapname")?.to_string();
    let start = ctx.params.flag("start").unwrap_or(false);
    {
        let cluster = ctx.shared.cluster();
        cluster.node(&node)?;
        cluster.guest(&node, vmid, kind)?;
    }
    wait_config_lock(ctx, kind, vmid).await?;
    let mut cluster = ctx.shared.cluster();
    let g = cluster.guest(&node, vmid, kind)?.clone();
    let problem = if g.is_template() {
        Some("you can't rollback if vm is a template".to_string())
    } else {
        match g.snapshots.get(&snapname) {
            None => Some(format!("snapshot '{snapname}' does not exist")),
            Some(s) if s.snapstate.is_some() => Some(format!(
                "unable to rollback to incomplete snapshot (snapstate = {})",
                s.snapstate.as_deref().unwrap_or_default()
            )),
            Some(_) => check_lock(&g).err(),
        }
    };
    if let Some(problem) = problem {
        return Ok(start_task(
            ctx,
            &mut cluster,
            &node,
            kind,
            "rollback",
            vmid,
            failing(problem),
        ));
    }
    // Prepare: stop the guest, take the lock.
    if let Some(live) = cluster.guests.get_mut(&vmid) {
        live.running = false;
        live.started_at = None;
        live.pid = None;
        live.config
            .insert("lock".to_string(), "rollback".to_string());
    }
    let name = snapname.clone();
    let work: Work = Box::new(move |c, log, injected| {
        if let Some(m) = injected {
            return Err(m);
        }
        let Some(g) = c.guests.get_mut(&vmid) else {
            return Err(format!("guest {vmid} vanished"));
        };
        let Some(snap) = g.snapshots.get(&name).cloned() else {
            return Err(format!("snapshot '{name}' does not exist"));
        };
        // `__snapshot_rollback_get_unused`: current volumes the snapshot does not name.
        let kept: Vec<String> = feature_volumes(g.kind, &snap.config)
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        let orphaned: Vec<String> = feature_volumes(g.kind, &g.config)
            .into_iter()
            .map(|(_, v)| v)
            .filter(|v| storage::split_volid(v).is_some() && !kept.contains(v))
            .collect();
        let mut config: BTreeMap<String, String> = g
            .config
            .iter()
            .filter(|(k, _)| guest::is_unused_key(k) || k.as_str() == "description")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        config.extend(snap.config.clone());
        for volid in orphaned {
            if config.values().any(|v| v == &volid) {
                continue;
            }
            let free = (0..256)
                .map(|n| format!("unused{n}"))
                .find(|k| !config.contains_key(k));
            if let Some(key) = free {
                config.insert(key, volid);
            }
        }
        config.insert("parent".to_string(), name.clone());
        g.config = config;
        g.pending.clear();
        g.pending_delete.clear();
        g.pending_force.clear();
        log.push(format!("rolled back to snapshot '{name}'"));
        if snap.vmstate || start {
            g.running = true;
            g.started_at = Some(now_epoch());
        }
        Ok(())
    });
    Ok(start_task(
        ctx,
        &mut cluster,
        &node,
        kind,
        "rollback",
        vmid,
        work,
    ))
}

/// `GET .../feature`.
pub(super) fn feature(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = ids(ctx)?;
    let feature = ctx.params.required("feature")?.to_string();
    let cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    let g = cluster.guest(&node, vmid, kind)?;
    let (config, snap) = match ctx.params.get("snapname") {
        Some(name) => match g.snapshots.get(name) {
            Some(s) => (s.config.clone(), true),
            None => return Err(ApiError::die(format!("snapshot '{name}' does not exist"))),
        },
        None => (g.config.clone(), false),
    };
    let has = match feature.as_str() {
        "snapshot" => has_snapshot_feature(&cluster, &node, kind, &config, snap),
        // `clone` and `copy` are not modelled: the simulator says no rather than guess.
        _ => false,
    };
    Ok(json!({
        "hasFeature": u8::from(has),
        "nodes": shared_nodes(&cluster, &node, kind, &config),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_storage_type_snapshots_what_its_plugin_says() {
        assert!(storage_can_snapshot("lvmthin", "raw", false));
        assert!(!storage_can_snapshot("lvmthin", "raw", true));
        assert!(!storage_can_snapshot("lvm", "raw", false));
        assert!(storage_can_snapshot("dir", "qcow2", false));
        assert!(!storage_can_snapshot("dir", "raw", false));
        assert!(!storage_can_snapshot("nfs", "vmdk", false));
        assert!(storage_can_snapshot("zfspool", "raw", true));
        assert!(storage_can_snapshot("rbd", "raw", false));
        assert!(storage_can_snapshot("btrfs", "raw", false));
        assert!(!storage_can_snapshot("iscsi", "raw", false));
    }

    #[test]
    fn a_snapshot_copy_leaves_out_the_keys_pve_leaves_out() {
        for key in [
            "lock",
            "digest",
            "description",
            "unused0",
            "snaptime",
            "vmstate",
        ] {
            assert!(!copied(key), "{key}");
        }
        for key in ["memory", "scsi0", "net0"] {
            assert!(copied(key), "{key}");
        }
    }
}
