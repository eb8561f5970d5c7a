//! lxc-only endpoints: create (`vzcreate`, from an `ostemplate` volume, `lock: create`
//! until the task ends) and clone (`vzclone`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::config::normalise_value;
use super::qemu::{CloneOptions, clone_config, release_file_lock};
use super::{Ctx, disks, permission};
use crate::cluster::Cluster;
use crate::error::{ApiError, ApiResult};
use crate::guest::{self, Guest, Kind};
use crate::property::PropertyString;
use crate::storage;
use crate::task::{self, TaskSpec, Work};

/// Create parameters that are not stored in the config.
const CREATE_CONTROL: &[&str] = &[
    "node",
    "vmid",
    "start",
    "pool",
    "ostemplate",
    "storage",
    "password",
    "ssh-public-keys",
    "restore",
    "force",
    "unique",
    "ignore-unpack-errors",
    "bwlimit",
];

/// `ostype` as PVE detects it from the template's name.
fn ostype_of(template: &str) -> &'static str {
    let name = template.rsplit('/').next().unwrap_or(template);
    for os in [
        "debian",
        "ubuntu",
        "centos",
        "fedora",
        "opensuse",
        "archlinux",
        "alpine",
        "gentoo",
        "nixos",
        "devuan",
    ] {
        if name.starts_with(os) {
            return os;
        }
    }
    "unmanaged"
}

/// `POST /nodes/{node}/lxc`, with pve-container's checks in its order (src/PVE/API2/LXC.pm
/// @ 94f5585, `create_vm`):
///
/// 1. `unprivileged` defaults to 1 on a create (`$unprivileged = 1 if
///    !defined($unprivileged)`, commit 103068a, PVE 9.0); only a privileged result needs
///    `Sys.Modify` on `/`;
/// 2. `check_vmid_unused`: `CT/VM N already exists on node 'x'`, without the `unable to
///    create CT N -` prefix (pve-cluster `check_vmid_unused`);
/// 3. `check_pool_exist`: 403 `Permission check failed (pool 'x' does not exist)`;
/// 4. `VM.Allocate` on the CT or its pool, else a bare `Permission check failed`;
/// 5. `check_ct_modify_config_perm` of every config key;
/// 6. `check_volume_access` of the template (`unable to use volume <v> - content type needs
///    to be 'vztmpl'`);
/// 7. per mount point (the default `<storage>:4` root disk too) the storage is enabled on the
///    node, carries `rootdir` (400 `storage`: `storage 'x' does not support container
///    directories`) and `Datastore.AllocateSpace` is held;
///
/// then `create_and_lock_config` and the `vzcreate` worker, which writes `unprivileged: 1`.
pub(super) fn create(ctx: &Ctx) -> ApiResult {
    let node = ctx.node().to_string();
    let vmid = ctx.params.vmid("vmid")?;
    let ostemplate = ctx.params.required("ostemplate")?.to_string();
    let authid = ctx.authid().to_string();
    let mut cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    let restore = ctx.params.flag("restore").unwrap_or(false);
    let unprivileged = match ctx.params.flag("unprivileged") {
        Some(u) => u,
        None => !restore,
    };
    if !restore && !unprivileged {
        cluster.acl.check(&authid, "/", &["Sys.Modify"], false)?;
    }
    if let Some(existing) = cluster.guests.get(&vmid) {
        return Err(ApiError::die(format!(
            "{} {vmid} already exists on node '{}'",
            existing.kind.noun(),
            existing.node
        )));
    }
    let pool = ctx.params.get("pool").map(str::to_string);
    if let Some(p) = &pool {
        permission::check_pool_exist(&cluster, p)?;
    }
    permission::vm_allocate(&cluster.acl, &authid, vmid, pool.as_deref())?;
    let storage_id = ctx.params.get("storage").unwrap_or("local").to_string();
    let mut params: BTreeMap<String, String> = ctx
        .params
        .0
        .iter()
        .filter(|(k, _)| !CREATE_CONTROL.contains(&k.as_str()) && k.as_str() != "unprivileged")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    permission::ct_modify_config_perm(
        &cluster,
        &authid,
        &permission::CtWrite {
            vmid,
            pool: pool.as_deref(),
            old: None,
            new: &params,
            delete: &[],
            unprivileged,
        },
    )?;
    let Some((tsid, _)) = storage::split_volid(&ostemplate) else {
        return Err(ApiError::param(
            "ostemplate",
            format!("unable to parse volume ID '{ostemplate}'"),
        ));
    };
    cluster.storage(&node, tsid)?;
    let wanted = if restore { "backup" } else { "vztmpl" };
    permission::volume_access_typed(&cluster.acl, &authid, &ostemplate, Some(vmid), wanted)?;
    params
        .entry("rootfs".to_string())
        .or_insert_with(|| format!("{storage_id}:4"));
    for (key, value) in params.iter().filter(|(k, _)| guest::is_lxc_volume_key(k)) {
        if key.starts_with("unused") {
            continue;
        }
        let volume = PropertyString::parse(value, Some("volume"));
        let volume = volume.get("volume").unwrap_or_default();
        if volume.starts_with('/') {
            if authid != "root@pam" {
                return Err(ApiError::die(
                    "Only root can pass arbitrary filesystem paths.",
                ));
            }
            continue;
        }
        // A bare size takes the `storage` parameter (`"$storage:$value"`).
        let sid = storage::split_volid(volume).map_or(storage_id.as_str(), |(s, _)| s);
        let def = cluster.storage(&node, sid)?;
        if !def.has_content("rootdir") {
            return Err(ApiError::param(
                "storage",
                format!("storage '{sid}' does not support container directories"),
            ));
        }
        cluster.acl.check(
            &authid,
            &format!("/storage/{sid}"),
            &["Datastore.AllocateSpace"],
            false,
        )?;
    }
    if unprivileged {
        params.insert("unprivileged".to_string(), "1".to_string());
    }
    let start = ctx.params.flag("start").unwrap_or(false);
    let mut placeholder = Guest::new(vmid, Kind::Lxc, &node);
    placeholder
        .config
        .insert("lock".to_string(), "create".to_string());
    cluster.guests.insert(vmid, placeholder);
    let work_node = node.clone();
    let shared = std::sync::Arc::clone(&ctx.shared);
    let user = ctx.authid().to_string();
    let work: Work = Box::new(move |c, log, injected| {
        let result =
            injected.map_or_else(|| build_ct(c, &work_node, vmid, &ostemplate, &params), Err);
        match result {
            Ok(config) => {
                if let Some(g) = c.guests.get_mut(&vmid) {
                    g.config = config;
                }
                if let Some(p) = pool.and_then(|p| c.pools.get_mut(&p)) {
                    p.vms.insert(vmid);
                }
                if start {
                    super::guests::autostart(&shared, c, Kind::Lxc, vmid, &user, log);
                }
                Ok(())
            }
            Err(e) => {
                c.guests.remove(&vmid);
                Err(e)
            }
        }
    });
    let spec = TaskSpec {
        node: &node,
        kind: if restore { "vzrestore" } else { "vzcreate" },
        id: vmid.to_string(),
        user: ctx.authid(),
    };
    Ok(Value::String(task::start(
        &ctx.shared,
        &mut cluster,
        &spec,
        work,
    )))
}

fn build_ct(
    c: &mut Cluster,
    node: &str,
    vmid: u32,
    ostemplate: &str,
    params: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    if c.volume(node, ostemplate).is_none() {
        return Err(format!(
            "unable to create CT {vmid} - volume '{ostemplate}' does not exist"
        ));
    }
    let mut config = BTreeMap::new();
    let mut allocated = Vec::new();
    for (k, v) in disks::allocation_order(Kind::Lxc, params) {
        match normalise_value(c, Kind::Lxc, node, vmid, &k, &v) {
            Ok(value) => {
                if guest::is_lxc_volume_key(&k) && disks::is_create_form(&v) {
                    allocated.extend(disks::volid_of(&value));
                }
                config.insert(k, value);
            }
            Err(e) => {
                for volid in allocated {
                    c.free_volume(node, &volid);
                }
                return Err(format!("unable to create CT {vmid} - {e}"));
            }
        }
    }
    config
        .entry("hostname".to_string())
        .or_insert_with(|| format!("CT{vmid}"));
    config
        .entry("memory".to_string())
        .or_insert_with(|| "512".to_string());
    config
        .entry("swap".to_string())
        .or_insert_with(|| "512".to_string());
    config
        .entry("arch".to_string())
        .or_insert_with(|| "amd64".to_string());
    config
        .entry("ostype".to_string())
        .or_insert_with(|| ostype_of(ostemplate).to_string());
    Ok(config)
}

pub(super) fn clone(ctx: &Ctx) -> ApiResult {
    let node = ctx.node().to_string();
    let vmid = ctx.params.vmid("vmid")?;
    let newid = ctx.params.vmid("newid")?;
    let mut cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    let src = cluster.guest(&node, vmid, Kind::Lxc)?.clone();
    if let Some(existing) = cluster.guests.get(&newid) {
        return Err(ApiError::die(format!(
            "{} {newid} already exists on node '{}'",
            existing.kind.noun(),
            existing.node
        )));
    }
    src.check_lock().map_err(ApiError::die)?;
    let full = ctx.params.flag("full").unwrap_or(!src.is_template());
    if !full && !src.is_template() {
        return Err(ApiError::die(
            "parameter 'full' must be set when cloning a non-template container",
        ));
    }
    let target = ctx.params.get("target").unwrap_or(&node).to_string();
    cluster.node(&target)?;
    let storage_param = ctx.params.get("storage").map(str::to_string);
    if let Some(sid) = &storage_param {
        cluster.storage(&target, sid)?;
    }
    let pool = ctx.params.get("pool").map(str::to_string);
    if let Some(p) = &pool
        && !cluster.pools.contains_key(p)
    {
        return Err(ApiError::die(format!("pool '{p}' does not exist")));
    }
    let mut placeholder = Guest::new(newid, Kind::Lxc, &target);
    placeholder
        .config
        .insert("lock".to_string(), "create".to_string());
    cluster.guests.insert(newid, placeholder);
    *cluster.file_locks.entry(vmid).or_default() += 1;
    let hostname = ctx.params.get("hostname").map(str::to_string);
    let description = ctx.params.get("description").map(str::to_string);
    let work: Work = Box::new(move |c, _log, injected| {
        release_file_lock(c, vmid);
        let options = CloneOptions {
            full,
            storage: storage_param,
            format: None,
        };
        let result = injected.map_or_else(|| clone_config(c, vmid, newid, &target, &options), Err);
        match result {
            Ok(mut config) => {
                if let Some(h) = hostname {
                    config.insert("hostname".to_string(), h);
                }
                if let Some(d) = description {
                    config.insert("description".to_string(), d);
                }
                if let Some(g) = c.guests.get_mut(&newid) {
                    g.config = config;
                }
                if let Some(p) = pool.and_then(|p| c.pools.get_mut(&p)) {
                    p.vms.insert(newid);
                }
                Ok(())
            }
            Err(e) => {
                c.guests.remove(&newid);
                Err(e)
            }
        }
    });
    let spec = TaskSpec {
        node: &node,
        kind: "vzclone",
        id: vmid.to_string(),
        user: ctx.authid(),
    };
    Ok(Value::String(task::start(
        &ctx.shared,
        &mut cluster,
        &spec,
        work,
    )))
}
