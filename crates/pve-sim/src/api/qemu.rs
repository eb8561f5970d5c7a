//! qemu-only endpoints: create (`qmcreate`, `lock: create` until the task ends), clone
//! (`qmclone`, the source's config lock held while it runs) and the guest agent commands.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::config::normalise_value;
use super::{Ctx, disks};
use crate::cluster::{Cluster, now_epoch};
use crate::error::{ApiError, ApiResult};
use crate::guest::{self, Guest, Kind};
use crate::property::PropertyString;
use crate::storage;
use crate::task::{self, TaskSpec, Work};

/// Create parameters that are not config keys.
const CREATE_CONTROL: &[&str] = &[
    "node",
    "vmid",
    "start",
    "pool",
    "archive",
    "force",
    "unique",
    "storage",
    "live-restore",
    "bwlimit",
];

/// The default `boot` order: first disk, first cdrom, first NIC.
fn default_boot(config: &BTreeMap<String, String>) -> Option<String> {
    let buses = ["ide", "sata", "scsi", "virtio"];
    let drive_keys = |cdrom: bool| {
        buses.iter().find_map(|bus| {
            config
                .iter()
                .filter(|(k, v)| {
                    k.starts_with(bus)
                        && guest::is_qemu_disk_key(k)
                        && guest::is_cdrom(v) == cdrom
                        && !v.contains("cloudinit")
                        && !v.starts_with("none")
                })
                .map(|(k, _)| k.clone())
                .next()
        })
    };
    let mut order = Vec::new();
    order.extend(drive_keys(false));
    order.extend(drive_keys(true));
    order.extend(config.keys().find(|k| guest::is_net_key(k)).cloned());
    (!order.is_empty()).then(|| format!("order={}", order.join(";")))
}

/// The worker's tag check (qemu-server src/PVE/API2/Qemu.pm @ e6352be, `create_vm`: after
/// the disks are allocated, `assert_tag_permissions`); on a refusal the new volumes are
/// freed and the task fails `unable to create VM N - Permission check failed (...)`.
fn create_tags(
    c: &mut Cluster,
    node: &str,
    vmid: u32,
    user: &str,
    config: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    let Some(tags) = config.get("tags") else {
        return Ok(config);
    };
    if let Err(e) = super::permission::qemu_create_tags(c, user, vmid, tags) {
        let mut g = Guest::new(vmid, Kind::Qemu, node);
        g.config = config;
        for volid in disks::owned_volumes(&g) {
            c.free_volume(node, &volid);
        }
        return Err(format!("unable to create VM {vmid} - {e}"));
    }
    Ok(config)
}

/// `POST /nodes/{node}/qemu` (qemu-server @ e6352be6 `src/PVE/API2/Qemu.pm` `create_vm`):
/// the synchronous checks (pool, permissions, drives through `$check_storage_access`, MACs
/// by `add_random_macs`), then the `qmcreate` worker (`create_disks`, the defaults it fills
/// in, tags checked there), the config locked `create` meanwhile
/// (pve-guest-common @ 4a8f6cb `src/PVE/AbstractConfig.pm` `create_and_lock_config`). The
/// duplicate vmid is tested first here, inside `create_and_lock_config` on PVE
/// (SOURCE-AUDIT.md §3: only the order differs when several errors coincide).
pub(super) fn create(ctx: &Ctx) -> ApiResult {
    let node = ctx.node().to_string();
    let vmid = ctx.params.vmid("vmid")?;
    let mut cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    if let Some(existing) = cluster.guests.get(&vmid) {
        return Err(ApiError::die(format!(
            "unable to create VM {vmid} - {} {vmid} already exists on node '{}'",
            existing.kind.noun(),
            existing.node
        )));
    }
    if ctx.params.get("archive").is_some() {
        return Err(ApiError::die(
            "restore from backup archives is not supported by the simulator",
        ));
    }
    let pool = ctx.params.get("pool").map(str::to_string);
    if let Some(p) = &pool
        && !cluster.pools.contains_key(p)
    {
        return Err(ApiError::die(format!("pool '{p}' does not exist")));
    }
    let params: BTreeMap<String, String> = ctx
        .params
        .0
        .iter()
        .filter(|(k, _)| !CREATE_CONTROL.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in &params {
        if guest::is_qemu_disk_key(k) {
            disks::check_qemu_drive(&cluster, &node, k, v, ctx.is_root_pam())?;
        }
        super::config::check_hostpci(ctx, k, v)?;
    }
    let start = ctx.params.flag("start").unwrap_or(false);
    let mut placeholder = Guest::new(vmid, Kind::Qemu, &node);
    placeholder
        .config
        .insert("lock".to_string(), "create".to_string());
    cluster.guests.insert(vmid, placeholder);
    let work_node = node.clone();
    let shared = std::sync::Arc::clone(&ctx.shared);
    let user = ctx.authid().to_string();
    let work: Work = Box::new(move |c, log, injected| {
        let result = injected
            .map_or_else(|| build_vm(c, &work_node, vmid, &params), Err)
            .and_then(|config| create_tags(c, &work_node, vmid, &user, config));
        match result {
            Ok(config) => {
                if let Some(g) = c.guests.get_mut(&vmid) {
                    g.config = config;
                }
                if let Some(p) = pool.and_then(|p| c.pools.get_mut(&p)) {
                    p.vms.insert(vmid);
                }
                if start {
                    super::guests::autostart(&shared, c, Kind::Qemu, vmid, &user, log);
                }
                Ok(())
            }
            Err(e) => {
                // qemu-server removes the config, so the vmid is free again.
                c.guests.remove(&vmid);
                Err(e)
            }
        }
    });
    let spec = TaskSpec {
        node: &node,
        kind: "qmcreate",
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

/// The worker side of create: allocate disks and fill in PVE's generated values.
fn build_vm(
    c: &mut Cluster,
    node: &str,
    vmid: u32,
    params: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    let mut config = BTreeMap::new();
    let mut allocated = Vec::new();
    for (k, v) in disks::allocation_order(Kind::Qemu, params) {
        let value = disks::check_single_cloudinit(&k, &v, config.iter())
            .and_then(|()| normalise_value(c, Kind::Qemu, node, vmid, &k, &v));
        match value {
            Ok(value) => {
                if guest::is_qemu_disk_key(&k) && disks::is_create_form(&v) {
                    allocated.extend(disks::volid_of(&value));
                }
                config.insert(k, value);
            }
            Err(e) => {
                for volid in allocated {
                    c.free_volume(node, &volid);
                }
                return Err(format!("unable to create VM {vmid} - {e}"));
            }
        }
    }
    config
        .entry("smbios1".to_string())
        .or_insert_with(|| format!("uuid={}", guest::random_uuid()));
    config
        .entry("vmgenid".to_string())
        .or_insert_with(guest::random_uuid);
    config.insert(
        "meta".to_string(),
        format!("creation-qemu=9.2.0,ctime={}", now_epoch()),
    );
    if !config.contains_key("boot")
        && let Some(boot) = default_boot(&config)
    {
        config.insert("boot".to_string(), boot);
    }
    Ok(config)
}

/// `POST /nodes/{node}/qemu/{vmid}/clone` (qemu-server @ e6352be6 `src/PVE/API2/Qemu.pm`
/// `clone_vm`): the source must exist on the node (`check_running` →
/// `assert_config_exists_on_node`: `unable to find configuration file for VM N on node
/// 'X'`), the new config is locked `clone` while the `qmclone` worker (id = source) copies
/// the disks, holding the source's config lock.
pub(super) fn clone(ctx: &Ctx) -> ApiResult {
    let node = ctx.node().to_string();
    let vmid = ctx.params.vmid("vmid")?;
    let newid = ctx.params.vmid("newid")?;
    let mut cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    let src = match cluster.guests.get(&vmid) {
        Some(g) if g.node == node && g.kind == Kind::Qemu => g.clone(),
        _ => {
            return Err(ApiError::die(format!(
                "unable to find configuration file for VM {vmid} on node '{node}'"
            )));
        }
    };
    if cluster.guests.contains_key(&newid) {
        return Err(ApiError::die(format!(
            "unable to create VM {newid}: config file already exists"
        )));
    }
    src.check_lock().map_err(ApiError::die)?;
    let full = ctx.params.flag("full").unwrap_or(!src.is_template());
    let storage_param = ctx.params.get("storage").map(str::to_string);
    let format = ctx.params.get("format").map(str::to_string);
    if !full && storage_param.is_some() {
        return Err(ApiError::die(
            "parameter 'storage' not allowed for linked clones",
        ));
    }
    if !full && !src.is_template() {
        let disk = src
            .config
            .keys()
            .find(|k| guest::is_qemu_disk_key(k))
            .cloned()
            .unwrap_or_default();
        return Err(ApiError::die(format!(
            "Linked clone feature is not supported for drive '{disk}'"
        )));
    }
    let target = ctx.params.get("target").unwrap_or(&node).to_string();
    cluster.node(&target)?;
    if let Some(sid) = &storage_param {
        cluster.storage(&target, sid)?;
    }
    let pool = ctx.params.get("pool").map(str::to_string);
    if let Some(p) = &pool
        && !cluster.pools.contains_key(p)
    {
        return Err(ApiError::die(format!("pool '{p}' does not exist")));
    }
    let mut placeholder = Guest::new(newid, Kind::Qemu, &target);
    placeholder
        .config
        .insert("lock".to_string(), "clone".to_string());
    cluster.guests.insert(newid, placeholder);
    *cluster.file_locks.entry(vmid).or_default() += 1;
    let name = ctx.params.get("name").map(str::to_string);
    let description = ctx.params.get("description").map(str::to_string);
    let work: Work = Box::new(move |c, _log, injected| {
        release_file_lock(c, vmid);
        let result = injected.map_or_else(
            || {
                let options = CloneOptions {
                    full,
                    storage: storage_param,
                    format,
                };
                clone_config(c, vmid, newid, &target, &options)
            },
            Err,
        );
        match result {
            Ok(mut config) => {
                match name {
                    Some(n) => {
                        config.insert("name".to_string(), n);
                    }
                    None => {
                        if let Some(n) = c.guests.get(&vmid).and_then(|g| g.config.get("name")) {
                            config.insert("name".to_string(), format!("Copy-of-VM-{n}"));
                        }
                    }
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
        kind: "qmclone",
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

pub(super) fn release_file_lock(c: &mut Cluster, vmid: u32) {
    if let Some(n) = c.file_locks.get_mut(&vmid) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            c.file_locks.remove(&vmid);
        }
    }
}

pub(super) struct CloneOptions {
    pub(super) full: bool,
    pub(super) storage: Option<String>,
    pub(super) format: Option<String>,
}

/// The clone's config: the source's current config without name, template flag, lock,
/// unused disks and pending changes; new volumes, MACs, vmgenid and smbios1 uuid.
pub(super) fn clone_config(
    c: &mut Cluster,
    vmid: u32,
    newid: u32,
    target: &str,
    options: &CloneOptions,
) -> Result<BTreeMap<String, String>, String> {
    let src = c
        .guests
        .get(&vmid)
        .cloned()
        .ok_or_else(|| format!("unable to find configuration file for VM {vmid}"))?;
    let kind = src.kind;
    let dk = if kind == Kind::Qemu { "file" } else { "volume" };
    let mut out = BTreeMap::new();
    for (k, v) in &src.config {
        let skip = match kind {
            Kind::Qemu => matches!(k.as_str(), "name" | "template" | "lock"),
            Kind::Lxc => matches!(k.as_str(), "template" | "lock"),
        };
        if skip || guest::is_unused_key(k) {
            continue;
        }
        let is_volume = disks::is_volume_key(kind, k)
            && !(kind == Kind::Qemu && guest::is_cdrom(v) && !v.contains("cloudinit"));
        let value = if is_volume {
            let mut p = PropertyString::parse(v, Some(dk));
            let Some(volid) = p.get(dk).map(str::to_string) else {
                out.insert(k.clone(), v.clone());
                continue;
            };
            let Some((sid, volname)) = storage::split_volid(&volid) else {
                out.insert(k.clone(), v.clone());
                continue;
            };
            let (sid, volname) = (sid.to_string(), volname.to_string());
            if volid.contains("cloudinit") {
                let new = c.alloc_cloudinit(target, &sid, newid)?;
                p.set(dk, &new);
            } else {
                let size = c.volume(&src.node, &volid).map_or(0, |v| v.size);
                let target_sid = options.storage.clone().unwrap_or(sid.clone());
                let content = if kind == Kind::Qemu {
                    "images"
                } else {
                    "rootdir"
                };
                let new = c.alloc_disk(
                    target,
                    &target_sid,
                    newid,
                    content,
                    size,
                    options.format.as_deref(),
                )?;
                let new = match c.storage(target, &target_sid) {
                    Ok(def) if !options.full && !def.is_file_based() => {
                        let new_name = storage::split_volid(&new).map_or("", |(_, n)| n);
                        c.rename_volume(target, &new, &format!("{volname}/{new_name}"))
                    }
                    _ => new,
                };
                p.set(dk, &new);
            }
            p.print(Some(dk), true)
        } else if guest::is_net_key(k) {
            match kind {
                Kind::Qemu => guest::normalise_qemu_net(v, true),
                Kind::Lxc => guest::normalise_lxc_net(v, true),
            }
        } else if k == "smbios1" {
            let mut p = PropertyString::parse(v, None);
            p.set("uuid", &guest::random_uuid());
            p.print(Some("uuid"), false)
        } else if k == "vmgenid" {
            guest::random_uuid()
        } else {
            v.clone()
        };
        out.insert(k.clone(), value);
    }
    Ok(out)
}

/// `/agent/<command>` (qemu-server @ e6352be6 `src/PVE/API2/Qemu/Agent.pm`,
/// `register_command`: `{ result => mon_cmd("guest-$cmd") }`, guarded by
/// `src/PVE/QemuServer/Agent.pm` `assert_agent_available`: not configured, VM not running,
/// agent not answering — in that order).
pub(super) fn agent(ctx: &Ctx, command: &str) -> ApiResult {
    let node = ctx.node().to_string();
    let vmid = ctx.params.vmid("vmid")?;
    let cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    let g = cluster.guest(&node, vmid, Kind::Qemu)?;
    let enabled = g
        .config
        .get("agent")
        .map(|a| PropertyString::parse(a, Some("enabled")))
        .is_some_and(|p| p.get("enabled") == Some("1"));
    if !enabled {
        return Err(ApiError::die("No QEMU guest agent configured"));
    }
    if !g.running {
        return Err(ApiError::die(format!("VM {vmid} is not running")));
    }
    if g.agent_stopped {
        return Err(ApiError::die("QEMU guest agent is not running"));
    }
    let result = match command {
        "ping" => json!({}),
        "network-get-interfaces" => {
            let mut ifaces = vec![json!({
                "name": "lo",
                "hardware-address": "00:00:00:00:00:00",
                "ip-addresses": [
                    {"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8},
                    {"ip-address": "::1", "ip-address-type": "ipv6", "prefix": 128}
                ],
            })];
            let nets = g.config.iter().filter(|(k, _)| guest::is_net_key(k));
            for (i, (_, v)) in nets.enumerate() {
                let mac = v
                    .split(',')
                    .next()
                    .and_then(|m| m.split_once('='))
                    .map_or("", |(_, mac)| mac)
                    .to_lowercase();
                ifaces.push(json!({
                    "name": format!("eth{i}"),
                    "hardware-address": mac,
                    "ip-addresses": [{
                        "ip-address": format!("10.{}.{}.{}", i, (vmid / 250) % 250, vmid % 250 + 2),
                        "ip-address-type": "ipv4",
                        "prefix": 24
                    }],
                }));
            }
            Value::Array(ifaces)
        }
        "get-host-name" => json!({ "host-name": g.name() }),
        other => {
            return Err(ApiError::die(format!(
                "unsupported guest agent command '{other}' in the simulator"
            )));
        }
    };
    Ok(json!({ "result": result }))
}

/// What qemu-server says when a VM's cloud-init drive is generated and its `cicustom` names
/// a snippet it cannot read (qemu-server @ e6352be6 `src/PVE/QemuServer/Cloudinit.pm`,
/// `get_custom_cloudinit_files` → `read_cloudinit_snippets_file`, in the order network,
/// user, meta, vendor): a storage that does not exist (`parse_volname`), a volume that is not
/// a snippet (`$volid is not in the snippets directory`), or a missing file
/// (pve-storage 0c56bad `src/PVE/Storage.pm`, `abs_filesystem_path`: `can't find file
/// '$volid'`). Only a VM with a cloud-init drive generates one (`generate_cloudinit_config`
/// visits the `vm-<vmid>-cloudinit` volumes). `None` when every file is there.
pub(super) fn cicustom_problem(cluster: &Cluster, g: &Guest) -> Option<String> {
    let has_drive = g.config.iter().any(|(k, v)| {
        guest::is_qemu_disk_key(k)
            && PropertyString::parse(v, Some("file"))
                .get("file")
                .is_some_and(|f| f.contains(&format!("vm-{}-cloudinit", g.vmid)))
    });
    let cicustom = g.config.get("cicustom")?;
    if !has_drive {
        return None;
    }
    let files = PropertyString::parse(cicustom, None);
    for key in ["network", "user", "meta", "vendor"] {
        let Some(volid) = files.get(key) else {
            continue;
        };
        let Some((sid, volname)) = storage::split_volid(volid) else {
            return Some(format!("unable to parse volume ID '{volid}'"));
        };
        let Some(def) = cluster.storages.iter().find(|s| s.id == sid) else {
            return Some(format!("storage '{sid}' does not exist"));
        };
        if !volname.starts_with("snippets/") {
            return Some(format!("{volid} is not in the snippets directory"));
        }
        let present = if cluster.storage_dirs {
            storage::snippet_exists(def, volname)
        } else {
            cluster.volume(&g.node, volid).is_some()
        };
        if !present {
            return Some(format!("can't find file '{volid}'"));
        }
    }
    None
}

/// `PUT /nodes/{node}/qemu/{vmid}/cloudinit` (qemu-server @ e6352be6 `src/PVE/API2/Qemu.pm`,
/// `cloudinit_update`): under the config lock, `check_lock`, then
/// `vmconfig_update_cloudinit_drive`: nothing without a cloud-init drive, else the drive is
/// generated from the config, which reads the `cicustom` snippets (a missing one dies:
/// [`cicustom_problem`]). Synchronous; answers `null`.
pub(super) async fn cloudinit_update(ctx: &Ctx) -> ApiResult {
    let node = ctx.node().to_string();
    let vmid = ctx.params.vmid("vmid")?;
    {
        let cluster = ctx.shared.cluster();
        cluster.node(&node)?;
        cluster.guest(&node, vmid, Kind::Qemu)?;
    }
    super::config::wait_config_lock(ctx, Kind::Qemu, vmid).await?;
    let cluster = ctx.shared.cluster();
    let g = cluster.guest(&node, vmid, Kind::Qemu)?;
    g.check_lock().map_err(ApiError::die)?;
    if let Some(problem) = cicustom_problem(&cluster, g) {
        return Err(ApiError::die(problem));
    }
    Ok(Value::Null)
}
