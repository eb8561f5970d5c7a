//! Endpoints common to qemu and lxc: listing, `status/current`, power actions, delete,
//! template conversion and resize. The differences PVE has between the two (lxc checks
//! power state synchronously, qemu inside the task; lxc `template` returns null) are kept.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::config::{check_digest, wait_config_lock};
use super::{Ctx, disks};
use crate::cluster::{Cluster, now_epoch};
use crate::error::{ApiError, ApiResult};
use crate::guest::{self, Guest, Kind};
use crate::property::PropertyString;
use crate::state::Shared;
use crate::storage::{self, format_size, parse_size};
use crate::task::{self, Prepare, TaskSpec, Work};

/// A power action under `status/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Power {
    Start,
    Stop,
    Shutdown,
    Reboot,
    Reset,
    Suspend,
    Resume,
}

impl Power {
    pub(crate) fn parse(action: &str) -> Option<Self> {
        Some(match action {
            "start" => Power::Start,
            "stop" => Power::Stop,
            "shutdown" => Power::Shutdown,
            "reboot" => Power::Reboot,
            "reset" => Power::Reset,
            "suspend" => Power::Suspend,
            "resume" => Power::Resume,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Power::Start => "start",
            Power::Stop => "stop",
            Power::Shutdown => "shutdown",
            Power::Reboot => "reboot",
            Power::Reset => "reset",
            Power::Suspend => "suspend",
            Power::Resume => "resume",
        }
    }
}

/// `skiplock=1`, which only `root@pam` may pass.
fn skiplock(ctx: &Ctx) -> ApiResult<bool> {
    let skiplock = ctx.params.flag("skiplock").unwrap_or(false);
    if skiplock && !ctx.is_root_pam() {
        return Err(ApiError::param(
            "skiplock",
            "Only root may use this option.",
        ));
    }
    Ok(skiplock)
}

fn ids(ctx: &Ctx) -> ApiResult<(String, u32)> {
    Ok((ctx.node().to_string(), ctx.params.vmid("vmid")?))
}

fn list_entry(g: &Guest, now: u64) -> Value {
    let mem = g.memory_mib() * 1024 * 1024;
    let mut v = json!({
        "vmid": g.vmid,
        "name": g.name(),
        "status": if g.running { "running" } else { "stopped" },
        "cpus": g.cpus(),
        "maxmem": mem,
        "mem": if g.running { mem / 4 } else { 0 },
        "maxdisk": g.maxdisk(),
        "disk": 0,
        "cpu": 0,
        "netin": 0,
        "netout": 0,
        "diskread": 0,
        "diskwrite": 0,
        "uptime": g.uptime(now),
    });
    if g.kind == Kind::Lxc {
        let swap = g
            .config
            .get("swap")
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(512);
        v["type"] = "lxc".into();
        v["maxswap"] = (swap * 1024 * 1024).into();
        v["swap"] = 0.into();
    }
    if let Some(pid) = g.pid.filter(|_| g.running) {
        v["pid"] = pid.into();
    }
    if let Some(lock) = g.lock() {
        v["lock"] = lock.into();
    }
    if let Some(tags) = g.config.get("tags") {
        v["tags"] = tags.clone().into();
    }
    if g.is_template() {
        v["template"] = 1.into();
    }
    v
}

pub(super) fn list(ctx: &Ctx, kind: Kind) -> ApiResult {
    let cluster = ctx.shared.cluster();
    let node = ctx.node();
    cluster.node(node)?;
    let now = now_epoch();
    Ok(Value::Array(
        cluster
            .guests
            .values()
            .filter(|g| g.kind == kind && g.node == node)
            .map(|g| list_entry(g, now))
            .collect(),
    ))
}

pub(super) fn index(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = ids(ctx)?;
    let cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    cluster.guest(&node, vmid, kind)?;
    let subdirs: &[&str] = match kind {
        Kind::Qemu => &[
            "config",
            "pending",
            "status",
            "agent",
            "clone",
            "resize",
            "template",
            "cloudinit",
        ],
        Kind::Lxc => &["config", "pending", "status", "clone", "resize", "template"],
    };
    Ok(Value::Array(
        subdirs.iter().map(|s| json!({ "subdir": s })).collect(),
    ))
}

pub(super) fn status_index(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = ids(ctx)?;
    let cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    cluster.guest(&node, vmid, kind)?;
    Ok(json!([
        {"subdir": "current"}, {"subdir": "start"}, {"subdir": "stop"}, {"subdir": "reset"},
        {"subdir": "shutdown"}, {"subdir": "suspend"}, {"subdir": "reboot"}, {"subdir": "resume"}
    ]))
}

/// `GET .../status/current`: the live power state, not pvestatd's snapshot: qemu-server
/// @ e6352be6 `src/PVE/API2/Qemu.pm` `vm_status` → `src/PVE/QemuServer.pm` `vmstatus`
/// (`running` when `check_running` finds the QEMU pid); pve-container @ 94f55852
/// `src/PVE/API2/LXC/Status.pm` `vm_status` → `src/PVE/LXC.pm` `vmstatus`
/// (`list_active_containers`). Both need VM.Audit on the guest.
pub(super) fn status_current(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = ids(ctx)?;
    let cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    let g = cluster.guest(&node, vmid, kind)?;
    let mut v = list_entry(g, now_epoch());
    v["ha"] = json!({ "managed": 0 });
    if kind == Kind::Qemu {
        v["qmpstatus"] = (if g.running { "running" } else { "stopped" }).into();
        if let Some(agent) = g.config.get("agent") {
            let enabled = PropertyString::parse(agent, Some("enabled")).get("enabled") == Some("1");
            v["agent"] = u8::from(enabled).into();
        }
    }
    Ok(v)
}

/// Storages of the guest's disks that lack the content type a start needs.
fn start_problem(cluster: &Cluster, g: &Guest) -> Option<String> {
    // `vm_start` regenerates the cloud-init drive, which reads the `cicustom` snippets.
    if g.kind == Kind::Qemu
        && let Some(problem) = super::qemu::cicustom_problem(cluster, g)
    {
        return Some(problem);
    }
    for (k, v) in &g.config {
        if g.kind == Kind::Qemu && guest::is_qemu_disk_key(k) {
            let file = PropertyString::parse(v, Some("file"));
            if let Some(volid) = file.get("file")
                && volid.contains(":iso/")
                && cluster.volume(&g.node, volid).is_none()
            {
                return Some(format!("volume '{volid}' does not exist"));
            }
            if let Some((sid, volname)) = file.get("file").and_then(storage::split_volid)
                && !volname.starts_with("iso/")
                && let Ok(def) = cluster.storage(&g.node, sid)
                && !def.has_content("images")
            {
                return Some(format!(
                    "storage '{sid}' does not support content-type 'images'"
                ));
            }
        }
    }
    None
}

fn start_guest(cluster: &mut Cluster, vmid: u32) -> Result<(), String> {
    let Some(mut g) = cluster.guests.remove(&vmid) else {
        return Err(format!("guest {vmid} vanished"));
    };
    disks::apply_pending(cluster, &mut g, &|_| true);
    let problem = start_problem(cluster, &g);
    if problem.is_none() {
        g.running = true;
        g.started_at = Some(now_epoch());
        g.pid = Some(cluster.next_pid().0);
    }
    cluster.guests.insert(vmid, g);
    problem.map_or(Ok(()), Err)
}

/// `start=1` on create: the create worker calls the start API, which forks its own
/// `qmstart`/`vzstart` task; the create task does not wait for it.
pub(super) fn autostart(
    shared: &Arc<Shared>,
    c: &mut Cluster,
    kind: Kind,
    vmid: u32,
    user: &str,
    log: &mut Vec<String>,
) {
    let Some(node) = c.guests.get(&vmid).map(|g| g.node.clone()) else {
        return;
    };
    log.push("Execute autostart".to_string());
    let work: Work = Box::new(move |c, _log, injected| {
        if let Some(m) = injected {
            return Err(m);
        }
        start_guest(c, vmid)
    });
    let spec = TaskSpec {
        node: &node,
        kind: &format!("{}start", kind.task_prefix()),
        id: vmid.to_string(),
        user,
    };
    task::start(shared, c, &spec, work);
}

fn stop_guest(cluster: &mut Cluster, vmid: u32) {
    if let Some(g) = cluster.guests.get_mut(&vmid) {
        g.running = false;
        g.started_at = None;
        g.pid = None;
    }
}

pub(super) async fn power(ctx: &Ctx, kind: Kind, action: Power) -> ApiResult {
    let (node, vmid) = ids(ctx)?;
    {
        let cluster = ctx.shared.cluster();
        cluster.node(&node)?;
        cluster.guest(&node, vmid, kind)?;
    }
    if matches!(action, Power::Start | Power::Reboot) {
        wait_config_lock(ctx, kind, vmid).await?;
    }
    let mut cluster = ctx.shared.cluster();
    let g = cluster.guest(&node, vmid, kind)?.clone();
    let skiplock = skiplock(ctx)?;
    if !skiplock && action != Power::Stop {
        g.check_lock().map_err(ApiError::die)?;
    }
    let noun = kind.noun();
    // lxc checks the power state before forking (pve-container src/PVE/API2/LXC/Status.pm
    // @ 94f5585: `CT N already running` / `CT N not running`); qemu fails inside the task for
    // start.
    match (kind, action) {
        (Kind::Lxc, Power::Start) if g.running => {
            return Err(ApiError::die(format!("CT {vmid} already running")));
        }
        (Kind::Lxc, Power::Stop | Power::Shutdown | Power::Suspend) if !g.running => {
            return Err(ApiError::die(format!("CT {vmid} not running")));
        }
        // pve-container's `vm_reboot` says VM (src/PVE/API2/LXC/Status.pm @ 94f5585).
        (Kind::Lxc, Power::Reboot) if !g.running => {
            return Err(ApiError::die(format!("VM {vmid} not running")));
        }
        (Kind::Qemu, Power::Reboot | Power::Reset | Power::Suspend) if !g.running => {
            return Err(ApiError::die(format!("VM {vmid} not running")));
        }
        _ => {}
    }
    let task_kind = format!("{}{}", kind.task_prefix(), action.name());
    let spec = TaskSpec {
        node: &node,
        kind: &task_kind,
        id: vmid.to_string(),
        user: ctx.authid(),
    };
    if g.running && g.ignores_shutdown && matches!(action, Power::Shutdown | Power::Reboot) {
        let ignored = IgnoredShutdown::of(ctx, &g, action);
        let upid = task::start_prepared(&ctx.shared, &mut cluster, &spec, ignored.prepare());
        return Ok(Value::String(upid));
    }
    let work: Work = Box::new(move |c, _log, injected| {
        if let Some(m) = injected {
            return Err(m);
        }
        let Some(g) = c.guests.get(&vmid) else {
            return Err(format!("{noun} {vmid} vanished"));
        };
        match action {
            Power::Start => {
                // Both fail in the worker: qemu-server `vm_start`, pve-container `vm_start`'s
                // `$realcmd` (src/PVE/API2/LXC/Status.pm @ 94f5585).
                if g.is_template() {
                    return Err(match g.kind {
                        Kind::Qemu => "you can't start a vm if it's a template",
                        Kind::Lxc => "you can't start a CT if it's a template",
                    }
                    .to_string());
                }
                if g.running {
                    return Err(format!("{noun} {vmid} already running"));
                }
                start_guest(c, vmid)
            }
            Power::Stop | Power::Shutdown => {
                stop_guest(c, vmid);
                Ok(())
            }
            Power::Reboot => {
                stop_guest(c, vmid);
                start_guest(c, vmid)
            }
            Power::Reset | Power::Suspend | Power::Resume => Ok(()),
        }
    });
    Ok(Value::String(task::start(
        &ctx.shared,
        &mut cluster,
        &spec,
        work,
    )))
}

/// A shutdown or reboot of a guest that ignores ACPI: PVE waits `timeout` seconds (qemu:
/// `startup` `down=` or 60; lxc: 60), then either kills it (`forceStop`; lxc reboots always
/// do) or fails: qemu `VM quit/powerdown failed - got timeout` (`vm_stop`), lxc `container
/// did not stop` (`lxc-stop --nokill`, `PVE::LXC::vm_stop`).
struct IgnoredShutdown {
    kind: Kind,
    vmid: u32,
    action: Power,
    timeout: Duration,
    force: bool,
}

impl IgnoredShutdown {
    fn of(ctx: &Ctx, g: &Guest, action: Power) -> Self {
        let startup_down = || {
            g.config
                .get("startup")
                .map(|s| PropertyString::parse(s, None))
                .and_then(|p| p.get("down").and_then(|d| d.parse::<u64>().ok()))
        };
        let secs = ctx
            .params
            .get("timeout")
            .and_then(|t| t.parse::<u64>().ok())
            .or_else(|| (g.kind == Kind::Qemu).then(startup_down).flatten())
            .unwrap_or(60);
        let force = match (g.kind, action) {
            (Kind::Lxc, Power::Reboot) => true,
            (_, Power::Shutdown) => ctx.params.flag("forceStop").unwrap_or(false),
            _ => false,
        };
        Self {
            kind: g.kind,
            vmid: g.vmid,
            action,
            timeout: Duration::from_secs(secs),
            force,
        }
    }

    fn prepare(self) -> Prepare {
        Box::pin(async move {
            tokio::time::sleep(self.timeout).await;
            let work: Work = Box::new(move |c, log, injected| {
                if let Some(m) = injected {
                    return Err(m);
                }
                if !self.force {
                    return Err(match self.kind {
                        Kind::Qemu => "VM quit/powerdown failed - got timeout".to_string(),
                        Kind::Lxc => "container did not stop".to_string(),
                    });
                }
                if self.kind == Kind::Qemu {
                    log.push("VM still running - terminating now with SIGTERM".to_string());
                }
                stop_guest(c, self.vmid);
                if self.action == Power::Reboot {
                    start_guest(c, self.vmid)?;
                }
                Ok(())
            });
            work
        })
    }
}

pub(super) async fn delete(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = ids(ctx)?;
    {
        let cluster = ctx.shared.cluster();
        cluster.node(&node)?;
        cluster.guest(&node, vmid, kind)?;
    }
    wait_config_lock(ctx, kind, vmid).await?;
    let mut cluster = ctx.shared.cluster();
    let g = cluster.guest(&node, vmid, kind)?.clone();
    let noun = kind.noun();
    if !skiplock(ctx)? {
        g.check_lock().map_err(ApiError::die)?;
    }
    if g.config.get("protection").is_some_and(|v| v == "1") {
        return Err(ApiError::die(format!(
            "can't remove {noun} {vmid} - protection mode enabled"
        )));
    }
    if g.running {
        return Err(ApiError::die(match kind {
            Kind::Qemu => format!("VM {vmid} is running - destroy failed"),
            Kind::Lxc => format!("unable to destroy CT {vmid} - container is running"),
        }));
    }
    let unreferenced = ctx
        .params
        .flag("destroy-unreferenced-disks")
        .unwrap_or(true);
    let work: Work = Box::new(move |c, log, injected| {
        if let Some(m) = injected {
            return Err(m);
        }
        let Some(g) = c.guests.remove(&vmid) else {
            return Err(format!("{noun} {vmid} vanished"));
        };
        for volid in disks::owned_volumes(&g) {
            if c.free_volume(&g.node, &volid) {
                log.push(format!("Removed volume '{volid}'"));
            }
        }
        if unreferenced {
            let sids: Vec<String> = c
                .storages
                .iter()
                .filter(|s| s.is_on_node(&g.node))
                .map(|s| s.id.clone())
                .collect();
            for sid in sids {
                for (name, v) in c.volumes(&g.node, &sid) {
                    if v.vmid == Some(vmid) && matches!(v.content.as_str(), "images" | "rootdir") {
                        c.free_volume(&g.node, &format!("{sid}:{name}"));
                    }
                }
            }
        }
        for pool in c.pools.values_mut() {
            pool.vms.remove(&vmid);
        }
        Ok(())
    });
    let spec = TaskSpec {
        node: &node,
        kind: &format!("{}destroy", kind.task_prefix()),
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

pub(super) async fn template(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = ids(ctx)?;
    {
        let cluster = ctx.shared.cluster();
        cluster.node(&node)?;
        cluster.guest(&node, vmid, kind)?;
    }
    wait_config_lock(ctx, kind, vmid).await?;
    let mut cluster = ctx.shared.cluster();
    let g = cluster.guest(&node, vmid, kind)?.clone();
    g.check_lock().map_err(ApiError::die)?;
    if g.is_template() {
        return Err(ApiError::die("you can't convert a template to a template"));
    }
    if g.running {
        return Err(ApiError::die(match kind {
            Kind::Qemu => "you can't convert a VM to template if VM is running",
            Kind::Lxc => "you can't convert a CT to template if the CT is running",
        }));
    }
    let work: Work = Box::new(move |c, _log, injected| {
        if let Some(m) = injected {
            return Err(m);
        }
        let Some(mut g) = c.guests.remove(&vmid) else {
            return Err(format!("guest {vmid} vanished"));
        };
        disks::rename_to_base(c, &mut g);
        g.config.insert("template".to_string(), "1".to_string());
        c.guests.insert(vmid, g);
        Ok(())
    });
    let spec = TaskSpec {
        node: &node,
        kind: &format!("{}template", kind.task_prefix()),
        id: vmid.to_string(),
        user: ctx.authid(),
    };
    let upid = task::start(&ctx.shared, &mut cluster, &spec, work);
    // pve-container forks the vztemplate worker but returns null.
    Ok(match kind {
        Kind::Qemu => Value::String(upid),
        Kind::Lxc => Value::Null,
    })
}

/// The volume a resize targets, its current and its requested size, and the disk value.
struct ResizeTarget {
    volid: String,
    current: u64,
    new: u64,
    value: PropertyString,
}

fn resize_target(c: &Cluster, g: &Guest, disk: &str, size: &str) -> Result<ResizeTarget, String> {
    let kind = g.kind;
    let dk = if kind == Kind::Qemu { "file" } else { "volume" };
    let Some(value) = g.config.get(disk).cloned() else {
        return Err(format!("disk '{disk}' does not exist"));
    };
    if kind == Kind::Qemu && guest::is_cdrom(&value) {
        return Err("you can't resize a cdrom".to_string());
    }
    let p = PropertyString::parse(&value, Some(dk));
    let volid = p.get(dk).unwrap_or("").to_string();
    let current = c
        .volume(&g.node, &volid)
        .map(|v| v.size)
        .or_else(|| p.get("size").and_then(parse_size))
        .unwrap_or(0);
    let (grow, amount) = match size.strip_prefix('+') {
        Some(rest) => (true, rest),
        None => (false, size),
    };
    let amount = parse_size(amount).ok_or_else(|| format!("invalid size '{size}'"))?;
    let new = if grow { current + amount } else { amount };
    Ok(ResizeTarget {
        volid,
        current,
        new,
        value: p,
    })
}

/// `PUT .../resize`, a `resize` task for both types, with their different checks:
///
/// * qemu (qemu-server src/PVE/API2/Qemu.pm @ e6352be, `resize_vm`): every check inside the
///   task (digest, lock, `shrinking disks is not supported`; an equal size is OK and writes
///   nothing);
/// * lxc (pve-container src/PVE/API2/LXC.pm @ 94f5585, `resize_vm`'s `$load_and_check`, run
///   once before forking): the lock, `check_ct_modify_config_perm` of the remaining `disk`
///   parameter (so `VM.Config.Options`), the digest, `Datastore.AllocateSpace` on the
///   volume's storage, then 500 `unable to shrink disk size` or `disk is already at specified
///   size`.
pub(super) fn resize(ctx: &Ctx, kind: Kind) -> ApiResult {
    let (node, vmid) = ids(ctx)?;
    let disk = ctx.params.required("disk")?.to_string();
    let size = ctx.params.required("size")?.to_string();
    let mut cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    let g = cluster.guest(&node, vmid, kind)?.clone();
    if kind == Kind::Lxc {
        g.check_lock().map_err(ApiError::die)?;
        let param = BTreeMap::from([("disk".to_string(), disk.clone())]);
        let unprivileged = g.config.get("unprivileged").is_some_and(|v| v == "1");
        super::permission::ct_modify_config_perm(
            &cluster,
            ctx.authid(),
            &super::permission::CtWrite {
                vmid,
                pool: None,
                old: Some(&g.config),
                new: &param,
                delete: &[],
                unprivileged,
            },
        )?;
        check_digest(&g, ctx.params.get("digest"))?;
        let target = resize_target(&cluster, &g, &disk, &size).map_err(ApiError::die)?;
        if let Some((sid, _)) = storage::split_volid(&target.volid) {
            cluster.acl.check(
                ctx.authid(),
                &format!("/storage/{sid}"),
                &["Datastore.AllocateSpace"],
                false,
            )?;
        }
        if target.new < target.current {
            return Err(ApiError::die("unable to shrink disk size"));
        }
        if target.new == target.current {
            return Err(ApiError::die("disk is already at specified size"));
        }
    }
    // The qemu worker runs PVE's update function at once: capture its checks now.
    let early = check_digest(&g, ctx.params.get("digest"))
        .and_then(|()| {
            if ctx.params.flag("skiplock").unwrap_or(false) {
                Ok(())
            } else {
                g.check_lock().map_err(ApiError::die)
            }
        })
        .map_err(|e| e.text());
    let work: Work = Box::new(move |c, log, injected| {
        if let Some(m) = injected {
            return Err(m);
        }
        early?;
        let Some(g) = c.guests.get(&vmid) else {
            return Err(format!("guest {vmid} vanished"));
        };
        let dk = if kind == Kind::Qemu { "file" } else { "volume" };
        let ResizeTarget {
            volid,
            current,
            new,
            value: mut p,
        } = resize_target(c, g, &disk, &size)?;
        if new < current {
            return Err(match kind {
                Kind::Qemu => "shrinking disks is not supported",
                Kind::Lxc => "unable to shrink disk size",
            }
            .to_string());
        }
        if kind == Kind::Lxc && new == current {
            return Err("disk is already at specified size".to_string());
        }
        let node = g.node.clone();
        if let Some((sid, volname)) = storage::split_volid(&volid)
            && let Some(mut vol) = c.volume(&node, &volid)
        {
            vol.size = new;
            let (sid, volname) = (sid.to_string(), volname.to_string());
            c.put_volume(&node, &sid, &volname, vol)
                .map_err(|e| e.text())?;
        }
        p.set("size", &format_size(new));
        log.push(format!(
            "  Size of volume {volid} changed from {} to {}.",
            format_size(current),
            format_size(new)
        ));
        if let Some(g) = c.guests.get_mut(&vmid) {
            g.config.insert(disk.clone(), p.print(Some(dk), true));
        }
        Ok(())
    });
    let spec = TaskSpec {
        node: &node,
        kind: "resize",
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
