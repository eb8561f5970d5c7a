//! Guest config endpoints: `GET config` (pending merged, digest, masked cipassword),
//! `GET pending`, `PUT config` (synchronous, both types) and qemu's `POST config` (a
//! `qmconfig` task). qemu writes check the digest before the lock, container writes the lock
//! before the digest (see [`precheck`]); values go to `[PENDING]` first and are applied at
//! once when the guest is stopped or hot-pluggable.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{Ctx, disks, permission};
use crate::cluster::Cluster;
use crate::error::{ApiError, ApiResult};
use crate::guest::{self, Guest, Kind};
use crate::property::PropertyString;
use crate::task::{self, TaskSpec, Work};

const MASK: &str = "**********";

/// Parameters of config writes that are not config keys.
const CONTROL_KEYS: &[&str] = &[
    "node",
    "vmid",
    "digest",
    "delete",
    "revert",
    "skiplock",
    "force",
    "background_delay",
];

/// A parsed config write.
#[derive(Debug, Clone)]
pub(super) struct Update {
    pub(super) set: BTreeMap<String, String>,
    delete: Vec<String>,
    revert: Vec<String>,
    digest: Option<String>,
    skiplock: bool,
    force: bool,
}

fn split_list(v: Option<&str>) -> Vec<String> {
    v.map(|s| {
        s.split([',', ';', ' ', '\0'])
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect()
    })
    .unwrap_or_default()
}

impl Update {
    pub(super) fn parse(ctx: &Ctx, kind: Kind) -> ApiResult<Self> {
        let p = &ctx.params;
        let set: BTreeMap<String, String> =
            p.0.iter()
                .filter(|(k, _)| !CONTROL_KEYS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
        let mut delete = split_list(p.get("delete"));
        let revert = split_list(p.get("revert"));
        let skiplock = p.flag("skiplock").unwrap_or(false);
        if skiplock && !ctx.is_root_pam() {
            return Err(ApiError::param(
                "skiplock",
                "Only root may use this option.",
            ));
        }
        if set.is_empty() && delete.is_empty() && revert.is_empty() {
            return Err(ApiError::die("no options specified"));
        }
        if kind == Kind::Qemu {
            for k in &mut delete {
                if k == "cdrom" {
                    *k = "ide2".to_string();
                }
            }
        }
        // pve-container checks these inside the lock, after the permissions (`precheck`).
        if kind == Kind::Qemu {
            check_conflicts(kind, &set, &delete, &revert)?;
        }
        Ok(Self {
            set,
            delete,
            revert,
            digest: p.get("digest").map(str::to_string),
            skiplock,
            force: p.flag("force").unwrap_or(false),
        })
    }
}

/// The checks of `delete=` and `revert=` lists, in the order and with the (slightly uneven)
/// wording of qemu-server's `update_vm_api` and pve-container's `update_vm`.
fn check_conflicts(
    kind: Kind,
    set: &BTreeMap<String, String>,
    delete: &[String],
    revert: &[String],
) -> ApiResult<()> {
    let unknown = |key: &str, k: &str| ApiError::param(key, format!("unknown option '{k}'"));
    for k in revert {
        if !is_known_option(kind, k) {
            return Err(unknown("revert", k));
        }
        if set.contains_key(k) {
            return Err(match kind {
                Kind::Qemu => ApiError::param(
                    "delete",
                    format!("you can't use '-{k}' and -revert {k}' at the same time"),
                ),
                Kind::Lxc => ApiError::param(
                    "revert",
                    format!("you can't use '-{k}' and '-revert {k}' at the same time"),
                ),
            });
        }
    }
    for k in delete {
        if kind == Kind::Lxc && !is_known_option(kind, k) {
            return Err(unknown("delete", k));
        }
        if set.contains_key(k) {
            return Err(ApiError::param(
                "delete",
                format!("you can't use '-{k}' and -delete {k}' at the same time"),
            ));
        }
        if revert.contains(k) {
            return Err(match kind {
                Kind::Qemu => ApiError::param(
                    "revert",
                    format!("you can't use '-delete {k}' and -revert {k}' at the same time"),
                ),
                Kind::Lxc => ApiError::param(
                    "delete",
                    format!("you can't use '-delete {k}' and '-revert {k}' at the same time"),
                ),
            });
        }
        if kind == Kind::Qemu && !is_known_option(kind, k) {
            return Err(unknown("delete", k));
        }
    }
    Ok(())
}

/// Whether `key` is a config option of the guest type (`option_exists`): asks the vendored
/// schema whether the config PUT endpoint defines it.
fn is_known_option(kind: Kind, key: &str) -> bool {
    const UNDEFINED: &str =
        "property is not defined in schema and the schema does not allow additional properties";
    let path = format!("/nodes/pve1/{}/100/config", kind.as_str());
    let probe = BTreeMap::from([(key.to_string(), String::new())]);
    match crate::schema::Schema::vendored().check("PUT", &path, &probe) {
        Ok(_) => true,
        Err(crate::schema::SchemaError::Invalid(errors)) => {
            errors.get(key).is_none_or(|m| m != UNDEFINED)
        }
        Err(crate::schema::SchemaError::NotImplemented) => true,
    }
}

/// `checksum mismatch` / `detected modified configuration` when the digest is stale.
pub(super) fn check_digest(g: &Guest, digest: Option<&str>) -> ApiResult<()> {
    match digest {
        Some(d) if d != g.digest() => Err(ApiError::die(match g.kind {
            Kind::Qemu => "checksum mismatch (file change by other user?)",
            Kind::Lxc => "detected modified configuration - file changed by other user? Try again.",
        })),
        _ => Ok(()),
    }
}

/// Waits for the config file lock (held by a running clone of this guest) as `flock` with
/// PVE's 10 s timeout does; also fires injected lock timeouts.
pub(super) async fn wait_config_lock(ctx: &Ctx, kind: Kind, vmid: u32) -> ApiResult<()> {
    let timeout_error = || {
        ApiError::die(format!(
            "can't lock file '{}' - got timeout",
            guest::lock_file(kind, vmid)
        ))
    };
    if ctx.shared.faults().take_lock_timeout(vmid) {
        return Err(timeout_error());
    }
    let deadline = tokio::time::Instant::now() + ctx.shared.settings.lock_timeout;
    loop {
        if !ctx.shared.cluster().file_locks.contains_key(&vmid) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(timeout_error());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The synchronous checks of a write once the config file is locked, in each handler's order.
///
/// qemu (qemu-server src/PVE/API2/Qemu.pm @ e6352be, `$update_vm_api`'s
/// `$load_and_check_config`, then `$updatefn`): digest (`checksum mismatch`), lock, then the
/// per-key drive and tag privileges ([`permission::qemu_config_late`]) and the drive syntax.
///
/// lxc (pve-container src/PVE/API2/LXC/Config.pm @ 94f5585, `update_vm`, all inside
/// `lock_config`): `check_lock` **then** `assert_if_modified` (digest), then
/// `check_ct_modify_config_perm` of the deleted, reverted and set keys, then the
/// `delete`/`revert` conflicts, then `update_pct_config`'s read-only `unprivileged`.
fn precheck(cluster: &Cluster, ctx: &Ctx, g: &Guest, u: &Update) -> ApiResult<()> {
    let node = g.node.as_str();
    let authid = ctx.authid();
    match g.kind {
        Kind::Qemu => {
            check_digest(g, u.digest.as_deref())?;
            if !u.skiplock {
                g.check_lock().map_err(ApiError::die)?;
            }
            permission::qemu_config_late(cluster, authid, g, &u.set, &u.delete)?;
            for (k, v) in &u.set {
                if guest::is_qemu_disk_key(k) {
                    disks::check_qemu_drive(cluster, node, k, v, ctx.is_root_pam())?;
                }
                check_hostpci(ctx, k, v)?;
            }
        }
        Kind::Lxc => {
            // `update_vm` has no `skiplock`: the lock is always checked.
            g.check_lock().map_err(ApiError::die)?;
            check_digest(g, u.digest.as_deref())?;
            let unprivileged = g.config.get("unprivileged").is_some_and(|v| v == "1");
            let none = BTreeMap::new();
            let perm = |set: &BTreeMap<String, String>, delete: &[String]| {
                permission::ct_modify_config_perm(
                    cluster,
                    authid,
                    &permission::CtWrite {
                        vmid: g.vmid,
                        pool: None,
                        old: Some(&g.config),
                        new: set,
                        delete,
                        unprivileged,
                    },
                )
            };
            perm(&none, &u.delete)?;
            perm(&none, &u.revert)?;
            check_conflicts(Kind::Lxc, &u.set, &u.delete, &u.revert)?;
            perm(&u.set, &[])?;
            if u.delete.iter().any(|k| k == "unprivileged") {
                return Err(ApiError::die(
                    "unable to delete read-only option: 'unprivileged'",
                ));
            }
            if u.set.contains_key("unprivileged") {
                return Err(ApiError::die(
                    "unable to modify read-only option: 'unprivileged'",
                ));
            }
            for v in u
                .set
                .iter()
                .filter(|(k, _)| guest::is_lxc_volume_key(k))
                .map(|(_, v)| v)
            {
                disks::check_lxc_volume(cluster, node, v, ctx.is_root_pam())?;
            }
        }
    }
    Ok(())
}

/// qemu-server's `check_hostpci_perm`: only `root@pam` itself (not its API tokens) may pass an
/// unmapped host PCI device through; others need a resource mapping (LIVE-FACTS.md, host PCI).
pub(super) fn check_hostpci(ctx: &Ctx, key: &str, value: &str) -> ApiResult<()> {
    if !key.starts_with("hostpci") || ctx.is_root_pam() {
        return Ok(());
    }
    let device = PropertyString::parse(value, Some("host"));
    if device.get("host").is_some() && device.get("mapping").is_none() {
        return Err(ApiError::die(format!(
            "only root can set '{key}' config for non-mapped devices"
        )));
    }
    Ok(())
}

/// Normalises one value the way the config writer does (allocating create forms).
pub(super) fn normalise_value(
    cluster: &mut Cluster,
    kind: Kind,
    node: &str,
    vmid: u32,
    key: &str,
    value: &str,
) -> Result<String, String> {
    Ok(match key {
        "tags" => guest::normalise_tags(value),
        "cipassword" => guest::hash_password(value),
        k if guest::is_net_key(k) => match kind {
            Kind::Qemu => guest::normalise_qemu_net(value, false),
            Kind::Lxc => guest::normalise_lxc_net(value, false),
        },
        k if kind == Kind::Qemu && guest::is_qemu_disk_key(k) => {
            disks::alloc_qemu_drive(cluster, node, vmid, k, value)?
        }
        k if kind == Kind::Lxc && guest::is_lxc_volume_key(k) => {
            disks::alloc_lxc_volume(cluster, node, vmid, value)?
        }
        _ => value.to_string(),
    })
}

/// Writes the update: values to `[PENDING]`, then applies what the guest's state allows.
fn apply(cluster: &mut Cluster, vmid: u32, u: &Update) -> Result<(), String> {
    let Some(g) = cluster.guests.get(&vmid) else {
        return Err(format!("guest {vmid} vanished"));
    };
    let (kind, node) = (g.kind, g.node.clone());
    let (config, pending) = (g.config.clone(), g.pending.clone());
    let mut values: Vec<(String, String)> = Vec::new();
    for (k, v) in disks::allocation_order(kind, &u.set) {
        if kind == Kind::Qemu {
            let others = values.iter().map(|(k, v)| (k, v));
            disks::check_single_cloudinit(
                &k,
                &v,
                config.iter().chain(pending.iter()).chain(others),
            )?;
        }
        let value = normalise_value(cluster, kind, &node, vmid, &k, &v)?;
        values.push((k, value));
    }
    let Some(mut g) = cluster.guests.remove(&vmid) else {
        return Err(format!("guest {vmid} vanished"));
    };
    for (k, v) in values {
        g.pending_delete.remove(&k);
        g.pending_force.remove(&k);
        g.pending.insert(k, v);
    }
    for k in &u.delete {
        g.pending.remove(k);
        if g.config.contains_key(k) {
            g.pending_delete.insert(k.clone());
            if u.force {
                g.pending_force.insert(k.clone());
            }
        }
    }
    for k in &u.revert {
        g.pending.remove(k);
        g.pending_delete.remove(k);
        g.pending_force.remove(k);
    }
    cleanup_pending(&mut g);
    if g.running {
        let live = guest::hotplugged(&g);
        disks::apply_pending(cluster, &mut g, &|k| live.contains(k));
    } else {
        disks::apply_pending(cluster, &mut g, &|_| true);
    }
    cluster.guests.insert(vmid, g);
    Ok(())
}

/// `cleanup_pending` (guest `AbstractConfig.pm`), run after every config write: a pending
/// value equal to the current one, and a pending delete of a key that is not set, are
/// dropped. So writing a running guest's current value back clears what was pending there.
fn cleanup_pending(g: &mut Guest) {
    let config = &g.config;
    g.pending.retain(|k, v| config.get(k) != Some(v));
    g.pending_delete.retain(|k| config.contains_key(k));
    let deletes = &g.pending_delete;
    g.pending_force.retain(|k| deletes.contains(k));
}

fn guest_ids(ctx: &Ctx) -> ApiResult<(String, u32)> {
    Ok((ctx.node().to_string(), ctx.params.vmid("vmid")?))
}

pub(super) async fn put(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = guest_ids(ctx)?;
    {
        let cluster = ctx.shared.cluster();
        cluster.node(&node)?;
        cluster.guest(&node, vmid, kind)?;
    }
    let update = Update::parse(ctx, kind)?;
    if kind == Kind::Qemu {
        permission::qemu_config_early(ctx, vmid, &update.set, &update.delete)?;
    }
    wait_config_lock(ctx, kind, vmid).await?;
    let import = {
        let mut cluster = ctx.shared.cluster();
        let g = cluster.guest(&node, vmid, kind)?.clone();
        precheck(&cluster, ctx, &g, &update)?;
        let import = import_duration(ctx, kind, &update);
        if import.is_zero() {
            apply(&mut cluster, vmid, &update).map_err(ApiError::die)?;
            return Ok(Value::Null);
        }
        // qemu-server's synchronous `update_vm_api` runs `create_disks` (the whole
        // `import-from` copy) inside `lock_config`, before it answers (qemu-server e6352be6
        // `src/PVE/API2/Qemu.pm` `$update_vm_api`, `$sync` branch): the config lock is held
        // and the request stays silent meanwhile, so pveproxy may answer 596 first.
        *cluster.file_locks.entry(vmid).or_default() += 1;
        import
    };
    tokio::time::sleep(import).await;
    let mut cluster = ctx.shared.cluster();
    super::qemu::release_file_lock(&mut cluster, vmid);
    apply(&mut cluster, vmid, &update).map_err(ApiError::die)?;
    Ok(Value::Null)
}

/// How long the disk imports (`import-from=`) of a qemu config write take.
fn import_duration(ctx: &Ctx, kind: Kind, update: &Update) -> Duration {
    let imports = kind == Kind::Qemu
        && update
            .set
            .iter()
            .any(|(k, v)| guest::is_qemu_disk_key(k) && v.contains("import-from="));
    if imports {
        ctx.shared.settings.disk_import_duration
    } else {
        Duration::ZERO
    }
}

pub(super) async fn post(ctx: &Ctx) -> ApiResult {
    let (node, vmid) = guest_ids(ctx)?;
    {
        let cluster = ctx.shared.cluster();
        cluster.node(&node)?;
        cluster.guest(&node, vmid, Kind::Qemu)?;
    }
    let update = Update::parse(ctx, Kind::Qemu)?;
    permission::qemu_config_early(ctx, vmid, &update.set, &update.delete)?;
    let background_delay = ctx.params.u64("background_delay")?;
    wait_config_lock(ctx, Kind::Qemu, vmid).await?;
    let upid = {
        let mut cluster = ctx.shared.cluster();
        let g = cluster.guest(&node, vmid, Kind::Qemu)?.clone();
        precheck(&cluster, ctx, &g, &update)?;
        let import = import_duration(ctx, Kind::Qemu, &update);
        let work: Work = Box::new(move |c, _log, injected| {
            if let Some(m) = injected {
                return Err(m);
            }
            apply(c, vmid, &update)
        });
        let spec = TaskSpec {
            node: &node,
            kind: "qmconfig",
            id: vmid.to_string(),
            user: ctx.authid(),
        };
        // The `qmconfig` worker does the same work as the synchronous PUT, imports
        // included (`update_vm_async` → `$update_vm_api` → `fork_worker('qmconfig', ...)`),
        // but the request answers the UPID at once.
        task::start_at_least(&ctx.shared, &mut cluster, &spec, import, work)
    };
    if let Some(secs) = background_delay {
        match task::wait_for(&ctx.shared, &upid, Duration::from_secs(secs)).await {
            Some(true) => return Ok(Value::Null),
            Some(false) => {
                let status = finished_status(&ctx.shared, &upid);
                return Err(ApiError::die(format!(
                    "failed to update VM {vmid}: {status}"
                )));
            }
            None => {}
        }
    }
    Ok(Value::String(upid))
}

fn finished_status(shared: &Arc<crate::state::Shared>, upid: &str) -> String {
    shared
        .cluster()
        .tasks
        .iter()
        .find(|t| t.upid_text == upid)
        .and_then(|t| t.exitstatus.clone())
        .unwrap_or_default()
}

/// `GET config`.
pub(super) fn get(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = guest_ids(ctx)?;
    let cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    let g = cluster.guest(&node, vmid, kind)?;
    let current = ctx.params.flag("current").unwrap_or(false);
    let config = if current {
        g.config.clone()
    } else {
        g.merged_config()
    };
    let mut out = Map::new();
    for (k, v) in &config {
        let value = if k == "cipassword" {
            Value::from(MASK)
        } else if kind == Kind::Lxc && k == "description" && !v.ends_with('\n') {
            // pve-container keeps the newline of the last comment line.
            Value::from(format!("{v}\n"))
        } else {
            guest::json_value(kind, k, v)
        };
        out.insert(k.clone(), value);
    }
    out.insert("digest".to_string(), g.digest().into());
    Ok(Value::Object(out))
}

/// `GET pending`.
pub(super) fn pending(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = guest_ids(ctx)?;
    let cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    let g = cluster.guest(&node, vmid, kind)?;
    let mut keys: Vec<&String> = g
        .config
        .keys()
        .chain(g.pending.keys())
        .chain(g.pending_delete.iter())
        .collect();
    keys.sort();
    keys.dedup();
    let shown = |k: &str, v: &str| {
        if k == "cipassword" {
            Value::from(MASK)
        } else {
            guest::json_value(kind, k, v)
        }
    };
    Ok(Value::Array(
        keys.into_iter()
            .map(|k| {
                // Built as a map, in the order the keys were always inserted, rather than
                // through `json!` and indexing (this list is read once per guest per pass).
                let mut e = Map::new();
                e.insert("key".to_string(), Value::from(k.as_str()));
                if let Some(v) = g.config.get(k) {
                    e.insert("value".to_string(), shown(k, v));
                }
                if let Some(v) = g.pending.get(k) {
                    e.insert("pending".to_string(), shown(k, v));
                }
                if g.pending_delete.contains(k) {
                    let force = if g.pending_force.contains(k) { 2 } else { 1 };
                    e.insert("delete".to_string(), force.into());
                }
                Value::Object(e)
            })
            // `config_with_pending_array` walks the loaded config, which carries the
            // digest `parse_vm_config` computed (guest `GuestHelpers.pm`; `qm pending`
            // skips the key when it prints).
            .chain(std::iter::once(
                json!({ "key": "digest", "value": g.digest() }),
            ))
            .collect(),
    ))
}
