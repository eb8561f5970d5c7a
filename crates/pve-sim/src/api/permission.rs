//! The permission checks PVE makes around a request, on top of the ACL model in `crate::acl`:
//!
//! * [`check_api2`]: the method's schema `permissions` (`check_api2_permissions`), run by the
//!   dispatcher after the API-token check and before proxying, as pve-manager's `rest_handler`
//!   does;
//! * the checks handlers make for `user: all` methods or per key, each after the PVE
//!   function it imitates: qemu create ([`qemu_create`], qemu-server `create_vm`) and its
//!   worker's tag check ([`qemu_create_tags`]); qemu config writes ([`qemu_config_early`],
//!   [`qemu_config_late`], `$update_vm_api`); container create and config writes
//!   ([`ct_modify_config_perm`], pve-container `check_ct_modify_config_perm`); tags
//!   ([`assert_tag_permissions`], pve-guest-common); volume access ([`volume_access`],
//!   pve-storage `check_volume_access`); bridges (`check_vnet_access`).
//!
//! Sources: qemu-server src/PVE/API2/Qemu.pm @ e6352be, pve-container src/PVE/LXC.pm and
//! src/PVE/API2/LXC.pm @ 94f5585, pve-guest-common src/PVE/GuestHelpers.pm @ 4a8f6cb,
//! pve-access-control src/PVE/RPCEnvironment.pm @ 5ccd07d, pve-storage src/PVE/Storage.pm
//! @ 0c56bad. Where Perl walks a hash (keys in random order) the simulator takes them sorted,
//! so which of several refusals comes first may differ from PVE's.
//!
//! `root@pam` passes everything (PVE returns early for it); its `proxops` token has no
//! privilege separation, so it holds every privilege too.

use std::collections::{BTreeMap, BTreeSet};

use super::Ctx;
use crate::acl::{Acl, perm_failure};
use crate::cluster::Cluster;
use crate::error::{ApiError, ApiResult};
use crate::guest::Kind;
use crate::property::PropertyString;
use crate::schema::{PermCheck, Permissions};
use crate::storage;

/// `check_api2_permissions`: `world` needs nothing; `root@pam` passes; no `permissions` at all
/// means root only; `user: all` leaves it to the handler; otherwise the `check` expression,
/// its `{param}`s filled from the request's parameters (path ones included).
pub(crate) fn check_api2(
    acl: &Acl,
    authid: &str,
    permissions: Option<&Permissions>,
    params: &BTreeMap<String, String>,
) -> ApiResult<()> {
    if authid == "root@pam" {
        return Ok(());
    }
    let Some(perms) = permissions else {
        return Err(perm_failure(Some("user != root@pam")));
    };
    if matches!(perms.user.as_deref(), Some("all" | "world")) {
        return Ok(());
    }
    match &perms.check {
        Some(check) => eval(acl, authid, check, params, false).map(|_| ()),
        None => Err(perm_failure(None)),
    }
}

/// `exec_api2_perm_check`: with `noerr` a failure is `Ok(false)`, otherwise the 403.
fn eval(
    acl: &Acl,
    authid: &str,
    check: &PermCheck,
    params: &BTreeMap<String, String>,
    noerr: bool,
) -> ApiResult<bool> {
    match check {
        PermCheck::And(subs) => {
            for sub in subs {
                if !eval(acl, authid, sub, params, noerr)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        PermCheck::Or(subs) => {
            for sub in subs {
                if eval(acl, authid, sub, params, true)? {
                    return Ok(true);
                }
            }
            if noerr {
                Ok(false)
            } else {
                Err(perm_failure(None))
            }
        }
        PermCheck::Perm {
            path,
            privs,
            any,
            require_param,
        } => {
            if let Some(p) = require_param
                && !params.contains_key(p)
            {
                return if noerr {
                    Ok(false)
                } else {
                    Err(perm_failure(None))
                };
            }
            let path = fill_template(path, params);
            let privs: Vec<&str> = privs.iter().map(String::as_str).collect();
            match acl.check(authid, &path, &privs, *any) {
                Ok(()) => Ok(true),
                Err(_) if noerr => Ok(false),
                Err(e) => Err(e),
            }
        }
        PermCheck::Unsupported(_) => {
            if noerr {
                Ok(false)
            } else {
                Err(perm_failure(None))
            }
        }
    }
}

/// `PVE::Tools::template_replace`: `{name}` becomes the parameter's value (empty if absent).
fn fill_template(template: &str, params: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        match rest[start..].find('}') {
            Some(end) => {
                let name = &rest[start + 1..start + end];
                out.push_str(params.get(name).map_or("", String::as_str));
                rest = &rest[start + end + 1..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// `RPCEnvironment::check_vm_perm`: the privileges on the pool when one is given and they are
/// held there, else on `/vms/<vmid>` (which names the failure).
fn check_vm_perm(
    acl: &Acl,
    authid: &str,
    vmid: u32,
    pool: Option<&str>,
    privs: &[&str],
    any: bool,
) -> ApiResult<()> {
    if let Some(pool) = pool
        && acl.holds(authid, &format!("/pool/{pool}"), privs, any)
    {
        return Ok(());
    }
    acl.check(authid, &format!("/vms/{vmid}"), privs, any)
}

/// pve-storage `check_volume_access` (src/PVE/Storage.pm @ 0c56bad) for a `storage:volname`
/// volume id used by guest `vmid`: `Datastore.Allocate` passes all; ISOs, templates and
/// import images need `Datastore.AllocateSpace` or `Datastore.Audit`; the guest's own
/// volumes nothing; a backup `AllocateSpace` plus `VM.Backup` on its owner; another guest's
/// disk `Datastore.Audit` plus `VM.Config.Disk` on its owner; anything else dies `missing
/// privileges to access <volid>`.
pub(crate) fn volume_access(
    acl: &Acl,
    authid: &str,
    volid: &str,
    vmid: Option<u32>,
) -> ApiResult<()> {
    if authid == "root@pam" {
        return Ok(());
    }
    let Some((sid, volname)) = storage::split_volid(volid) else {
        // An absolute path: `die "Only root can pass arbitrary filesystem paths."`.
        return Err(ApiError::die(
            "Only root can pass arbitrary filesystem paths.",
        ));
    };
    let path = format!("/storage/{sid}");
    if acl.holds(authid, &path, &["Datastore.Allocate"], false) {
        return Ok(());
    }
    let Ok(parsed) = storage::parse_volname(volname) else {
        return acl.check(authid, &path, &["Datastore.Allocate"], false);
    };
    match (parsed.content.as_str(), parsed.vmid) {
        ("iso" | "vztmpl" | "import", _) => acl.check(
            authid,
            &path,
            &["Datastore.AllocateSpace", "Datastore.Audit"],
            true,
        ),
        (_, Some(owner)) if Some(owner) == vmid => Ok(()),
        ("backup", Some(owner)) => {
            acl.check(authid, &path, &["Datastore.AllocateSpace"], false)?;
            acl.check(authid, &format!("/vms/{owner}"), &["VM.Backup"], false)
        }
        ("images" | "rootdir", Some(owner)) => {
            acl.check(authid, &path, &["Datastore.Audit"], false)?;
            acl.check(authid, &format!("/vms/{owner}"), &["VM.Config.Disk"], false)
        }
        _ => Err(ApiError::die(format!(
            "missing privileges to access {volid}"
        ))),
    }
}

/// Whether `key` is a disk of a guest of `kind` (qemu-server `is_valid_drivename`, plus
/// `unusedN`; pve-container's `rootfs`/`mpN`).
fn is_drive(kind: Kind, key: &str) -> bool {
    match kind {
        Kind::Qemu => {
            key == "efidisk0"
                || key == "tpmstate0"
                || ["ide", "sata", "scsi", "virtio", "unused"]
                    .iter()
                    .any(|p| indexed(key, p))
        }
        Kind::Lxc => key == "rootfs" || indexed(key, "mp") || indexed(key, "unused"),
    }
}

fn indexed(key: &str, prefix: &str) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// What qemu-server's `$check_vm_modify_config_perm` (src/PVE/API2/Qemu.pm @ e6352be) asks
/// for a key: `Ok(None)` for the keys it leaves to other checks (drives, `cdrom`,
/// `unusedN`, `serialN`, `usbN`, `hostpciN`, `virtiofsN`, `tags`), `Ok(Some((privs, any)))`
/// from its option tables (`$cpuoptions`, `$memoryoptions`, `$hwtypeoptions`,
/// `$generaloptions`, `$vmpoweroptions`, `$diskoptions`, `$cloudinitoptions`), and the
/// `die "only root can set '<key>' config"` of every other key.
fn qemu_key_privileges(key: &str) -> Result<Option<(&'static [&'static str], bool)>, String> {
    const CPU: &[&str] = &[
        "cores",
        "cpu",
        "runningcpu",
        "cpulimit",
        "cpuunits",
        "numa",
        "smp",
        "sockets",
        "vcpus",
    ];
    const MEMORY: &[&str] = &["memory", "balloon", "shares", "allow-ksm"];
    const HWTYPE: &[&str] = &[
        "acpi",
        "hotplug",
        "kvm",
        "machine",
        "runningmachine",
        "scsihw",
        "smbios1",
        "tablet",
        "vga",
        "watchdog",
        "audio0",
        "rng0",
    ];
    const GENERAL: &[&str] = &[
        "agent",
        "autostart",
        "bios",
        "description",
        "keyboard",
        "localtime",
        "migrate_downtime",
        "migrate_speed",
        "name",
        "onboot",
        "ostype",
        "protection",
        "reboot",
        "startdate",
        "startup",
        "tdf",
        "template",
    ];
    const DISK: &[&str] = &["boot", "bootdisk", "vmstatestorage"];
    const CLOUDINIT: &[&str] = &[
        "cicustom",
        "cipassword",
        "citype",
        "ciuser",
        "ciupgrade",
        "nameserver",
        "searchdomain",
        "sshkeys",
    ];
    if is_drive(Kind::Qemu, key)
        || key == "cdrom"
        || key == "tags"
        || ["serial", "usb", "hostpci", "virtiofs"]
            .iter()
            .any(|p| indexed(key, p))
    {
        return Ok(None);
    }
    let privs: (&'static [&'static str], bool) = if CPU.contains(&key) || indexed(key, "numa") {
        (&["VM.Config.CPU"], false)
    } else if MEMORY.contains(&key) {
        (&["VM.Config.Memory"], false)
    } else if HWTYPE.contains(&key) {
        (&["VM.Config.HWType"], false)
    } else if GENERAL.contains(&key) {
        (&["VM.Config.Options"], false)
    } else if key == "freeze" {
        (&["VM.PowerMgmt"], false)
    } else if DISK.contains(&key) {
        (&["VM.Config.Disk"], false)
    } else if indexed(key, "net") || key == "running-nets-host-mtu" {
        (&["VM.Config.Network"], false)
    } else if CLOUDINIT.contains(&key) || indexed(key, "ipconfig") {
        (&["VM.Config.Cloudinit", "VM.Config.Network"], true)
    } else if key == "vmstate" {
        (&["VM.Config.Disk", "VM.PowerMgmt"], false)
    } else {
        return Err(format!("only root can set '{key}' config"));
    };
    Ok(Some(privs))
}

/// `$check_vm_modify_config_perm` over `keys`.
fn qemu_modify_config_perm<'a>(
    acl: &Acl,
    authid: &str,
    vmid: u32,
    pool: Option<&str>,
    keys: impl Iterator<Item = &'a str>,
) -> ApiResult<()> {
    for key in keys {
        match qemu_key_privileges(key).map_err(ApiError::die)? {
            None => {}
            Some((privs, any)) => {
                check_vm_perm(acl, authid, vmid, pool, privs, any)?;
                if key == "startup" {
                    // "special case for startup since it changes host behaviour"
                    acl.check(authid, "/", &["Sys.Modify"], false)?;
                }
            }
        }
    }
    Ok(())
}

/// Parameters of a create call that are not config keys (extracted before the key checks).
const CREATE_ONLY: &[&str] = &[
    "node",
    "vmid",
    "pool",
    "storage",
    "start",
    "force",
    "unique",
    "archive",
    "live-restore",
    "bwlimit",
    "ha-managed",
    "import-working-storage",
    "restore",
    "ostemplate",
    "password",
    "ssh-public-keys",
    "ignore-unpack-errors",
    "unprivileged",
];

/// The value's volume part: the first property (or `file=`/`volume=`).
fn volume_of(value: &str) -> Option<&str> {
    value
        .split(',')
        .find_map(|part| match part.split_once('=') {
            Some(("file" | "volume", v)) => Some(v),
            Some(_) => None,
            None => Some(part),
        })
}

fn option_of<'a>(value: &'a str, key: &str) -> Option<&'a str> {
    value.split(',').find_map(|part| {
        part.split_once('=')
            .and_then(|(k, v)| (k == key).then_some(v))
    })
}

/// qemu-server `$PVE::QemuServer::Drive::NEW_DISK_RE` (`^(([^/:\s]+):)?(\d+(\.\d+)?)$`): the
/// storage of a new-disk value (`None` inside for a bare size).
fn qemu_new_disk(volume: &str) -> Option<Option<&str>> {
    let (storage, size) = match volume.split_once(':') {
        Some((s, size)) => (Some(s), size),
        None => (None, volume),
    };
    if storage.is_some_and(|s| s.is_empty() || s.contains(['/', ' '])) {
        return None;
    }
    let number = size.split_once('.').map_or(size, |(i, _)| i);
    let fraction = size.split_once('.').map_or("0", |(_, f)| f);
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    (digits(number) && digits(fraction)).then_some(storage)
}

/// qemu-server `$check_storage_access` (src/PVE/API2/Qemu.pm @ e6352be) for one drive
/// value: nothing for `none` and cloud-init; `Sys.Console` on `/` for a host CD-ROM;
/// `Datastore.AllocateSpace` for a new disk; else `check_volume_access`; an `import-from`
/// source that is a guest's disk needs `VM.Clone` on its owner, any other volume access.
fn qemu_drive_storage_access(
    acl: &Acl,
    authid: &str,
    vmid: u32,
    value: &str,
    default_storage: Option<&str>,
) -> ApiResult<()> {
    let volume = volume_of(value).unwrap_or_default();
    let cdrom = option_of(value, "media") == Some("cdrom");
    let cloudinit = volume == "cloudinit"
        || storage::split_volid(volume).is_some_and(|(_, name)| name == "cloudinit");
    if volume.is_empty() || volume == "none" || cloudinit {
        // nothing to check
    } else if cdrom && volume == "cdrom" {
        acl.check(authid, "/", &["Sys.Console"], false)?;
    } else if !cdrom && let Some(storage) = qemu_new_disk(volume) {
        let Some(sid) = storage.or(default_storage) else {
            return Err(ApiError::die(
                "no storage ID specified (and no default storage)",
            ));
        };
        acl.check(
            authid,
            &format!("/storage/{sid}"),
            &["Datastore.AllocateSpace"],
            false,
        )?;
    } else {
        volume_access(acl, authid, volume, Some(vmid))?;
    }
    if let Some(src) = option_of(value, "import-from") {
        let owner = storage::split_volid(src)
            .and_then(|(_, name)| storage::parse_volname(name).ok())
            .and_then(|p| p.vmid);
        match owner {
            Some(owner) => acl.check(authid, &format!("/vms/{owner}"), &["VM.Clone"], false)?,
            None => volume_access(acl, authid, src, Some(vmid))?,
        }
    }
    Ok(())
}

/// pve-guest-common `check_vnet_access` (src/PVE/GuestHelpers.pm @ 4a8f6cb) for a NIC value:
/// with a VLAN `tag`, `SDN.Use` on `/sdn/zones/localnetwork/<bridge>/<tag>` (held there by
/// propagation from the bridge); for each trunk VLAN the same; without either, on the bridge.
/// Plain Linux bridges are in the `localnetwork` zone.
fn bridge_access(acl: &Acl, authid: &str, value: &str) -> ApiResult<()> {
    if authid == "root@pam" {
        return Ok(());
    }
    let Some(bridge) = option_of(value, "bridge") else {
        return Ok(());
    };
    let path = format!("/sdn/zones/localnetwork/{bridge}");
    let tag = option_of(value, "tag").filter(|t| !t.is_empty() && *t != "0");
    let trunks = option_of(value, "trunks").filter(|t| !t.is_empty());
    if let Some(tag) = tag {
        acl.check(authid, &format!("{path}/{tag}"), &["SDN.Use"], false)?;
    }
    if let Some(trunks) = trunks {
        let mut vlans = BTreeSet::new();
        for range in trunks.split(';') {
            let (from, to) = range.split_once('-').unwrap_or((range, range));
            match (from.parse::<u32>(), to.parse::<u32>()) {
                (Ok(a), Ok(b)) if b > a => vlans.extend((a..=b).map(|v| v.to_string())),
                _ => {
                    vlans.insert(from.to_string());
                }
            }
        }
        // `sort keys`: string order, as Perl sorts them.
        for vlan in vlans {
            acl.check(authid, &format!("{path}/{vlan}"), &["SDN.Use"], false)?;
        }
    }
    if tag.is_none() && trunks.is_none() {
        acl.check(authid, &path, &["SDN.Use"], false)?;
    }
    Ok(())
}

/// pve-common `split_list`: on `\0` if the text has one, else on `,`, `;` and whitespace.
fn split_list(text: &str) -> Vec<&str> {
    if text.contains('\0') {
        return text.split('\0').collect();
    }
    text.split([',', ';', ' ', '\t', '\n'])
        .filter(|t| !t.is_empty())
        .collect()
}

/// pve-guest-common `get_allowed_tags` (src/PVE/GuestHelpers.pm @ 4a8f6cb): the tags `authid`
/// may set without `Sys.Modify` on `/`, and whether any tag is (`user-allow=free`).
/// `user-allow-list` unless the mode is `none`; with `free` or `existing` also every tag of
/// a guest the caller may audit; registered tags never.
pub(crate) fn allowed_tags(cluster: &Cluster, authid: &str) -> (BTreeSet<String>, bool) {
    let acl = &cluster.acl;
    let privileged = acl.holds(authid, "/", &["Sys.Modify"], false);
    let tags = &acl.tags;
    let mut allowed = BTreeSet::new();
    if tags.user_allow != "none" || privileged {
        allowed.extend(tags.allow_list.iter().cloned());
    }
    if matches!(tags.user_allow.as_str(), "free" | "existing") || privileged {
        for g in cluster.guests.values() {
            if !privileged && !acl.holds(authid, &format!("/vms/{}", g.vmid), &["VM.Audit"], false)
            {
                continue;
            }
            if let Some(t) = g.config.get("tags") {
                allowed.extend(split_list(t).into_iter().map(str::to_string));
            }
        }
    }
    if privileged {
        allowed.extend(tags.registered.iter().cloned());
    } else {
        allowed.retain(|t| !tags.registered.contains(t));
    }
    (allowed, tags.user_allow == "free")
}

/// `GET /cluster/options` (pve-manager PVE/API2/Cluster.pm @ 14a22df, `get_options`): the
/// whole `datacenter.cfg` for callers with `Sys.Audit` on `/` (here only its tag settings:
/// `user-tag-access`, `registered-tags`), nothing of it for others; for everyone
/// `allowed-tags`, the sorted tags `get_allowed_tags` returns in scalar context. It lives
/// here because its answer is the tag permission model.
pub(crate) fn cluster_options(ctx: &Ctx) -> serde_json::Value {
    let cluster = ctx.shared.cluster();
    let authid = ctx.authid();
    let mut out = serde_json::Map::new();
    let tags = &cluster.acl.tags;
    let configured = tags.user_allow != "free" || !tags.allow_list.is_empty();
    if configured && cluster.acl.holds(authid, "/", &["Sys.Audit"], false) {
        let mut access = serde_json::Map::new();
        access.insert("user-allow".into(), tags.user_allow.clone().into());
        if !tags.allow_list.is_empty() {
            access.insert(
                "user-allow-list".into(),
                tags.allow_list.iter().cloned().collect::<Vec<_>>().into(),
            );
        }
        out.insert("user-tag-access".into(), access.into());
    }
    if cluster.acl.holds(authid, "/", &["Sys.Audit"], false) && !tags.registered.is_empty() {
        {
            out.insert(
                "registered-tags".into(),
                tags.registered.iter().cloned().collect::<Vec<_>>().into(),
            );
        }
    }
    let (allowed, _) = allowed_tags(&cluster, authid);
    out.insert(
        "allowed-tags".into(),
        allowed.into_iter().collect::<Vec<_>>().into(),
    );
    serde_json::Value::Object(out)
}

/// pve-guest-common `assert_tag_permissions` (src/PVE/GuestHelpers.pm @ 4a8f6cb): setting,
/// changing or removing `tags` needs `VM.Config.Options` on the guest (never its pool); every
/// tag added or removed that is registered, or (unless `user-allow=free`) not among the
/// allowed ones, needs `Sys.Modify` on `/`: 403 `Permission check failed (/, Sys.Modify for
/// modifying tag '<t>')`. Perl walks the tags in hash order; this takes them sorted.
pub(crate) fn assert_tag_permissions(
    cluster: &Cluster,
    authid: &str,
    vmid: u32,
    old: &str,
    new: &str,
) -> ApiResult<()> {
    if authid == "root@pam" {
        return Ok(());
    }
    let acl = &cluster.acl;
    check_vm_perm(acl, authid, vmid, None, &["VM.Config.Options"], false)?;
    if acl.holds(authid, "/", &["Sys.Modify"], false) {
        return Ok(());
    }
    let count = |text: &str| {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for t in split_list(text) {
            *counts.entry(t.to_string()).or_default() += 1;
        }
        counts
    };
    let (old, new) = (count(old), count(new));
    let all: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    let mut cache: Option<(BTreeSet<String>, bool)> = None;
    for tag in all {
        if old.get(tag) == new.get(tag) {
            continue;
        }
        let (allowed, freeform) = cache.get_or_insert_with(|| allowed_tags(cluster, authid));
        if (!allowed.contains(tag) && !*freeform) || acl.tags.registered.contains(tag) {
            return Err(perm_failure(Some(&format!(
                "/, Sys.Modify for modifying tag '{tag}'"
            ))));
        }
    }
    Ok(())
}

/// The "old tags" qemu-server's `create_vm` worker passes to `assert_tag_permissions`: it
/// passes `{}` (a hash reference), which `split_list` stringifies to one tag
/// `HASH(0x<address>)` (src/PVE/API2/Qemu.pm @ e6352be, `assert_tag_permissions($vmid, {},
/// $conf->{tags}, ...)`). That made-up tag is "removed" by every create with tags, so unless
/// `user-allow` is `free` (or the caller holds `Sys.Modify` on `/`) every such create fails
/// in its task. The address is the simulator's choice.
pub(crate) const QEMU_CREATE_OLD_TAGS: &str = "HASH(0x5a1e0c0ffee0)";

/// qemu-server `create_vm` (src/PVE/API2/Qemu.pm @ e6352be), its checks before
/// `create_and_lock_config`, in its order: the pool exists (403 `Permission check failed
/// (pool 'x' does not exist)`, `check_pool_exist`, for `root@pam` too); `Datastore.AllocateSpace`
/// on the `storage` parameter; `VM.PowerMgmt` for `start`; `VM.Allocate` on the guest or its
/// pool (a bare `Permission check failed` otherwise, `raise_perm_exc()`); the storage access
/// of every drive (`$check_storage_access`); the config privileges of every other key
/// (`$check_vm_modify_config_perm`: no `VM.Config.Disk`/`CDROM` for drives at create, no
/// tag check: `tags` are checked by the worker, see [`QEMU_CREATE_OLD_TAGS`]); `SDN.Use` for
/// every NIC (`check_bridge_access`, sorted keys).
pub(crate) fn qemu_create(ctx: &Ctx) -> ApiResult<()> {
    let authid = ctx.authid().to_string();
    let pool = ctx.params.get("pool");
    let cluster = ctx.shared.cluster();
    if let Some(p) = pool {
        check_pool_exist(&cluster, p)?;
    }
    if authid == "root@pam" {
        return Ok(());
    }
    let vmid = ctx.params.vmid("vmid")?;
    let acl = &cluster.acl;
    let storage = ctx.params.get("storage");
    if let Some(sid) = storage {
        acl.check(
            &authid,
            &format!("/storage/{sid}"),
            &["Datastore.AllocateSpace"],
            false,
        )?;
    }
    if ctx.params.flag("ha-managed") == Some(true) {
        acl.check(&authid, "/", &["Sys.Console"], false)?;
    }
    if ctx.params.flag("start") == Some(true) {
        check_vm_perm(acl, &authid, vmid, pool, &["VM.PowerMgmt"], false)?;
    }
    vm_allocate(acl, &authid, vmid, pool)?;
    let keys: Vec<(&String, &String)> = ctx
        .params
        .0
        .iter()
        .filter(|(k, _)| !CREATE_ONLY.contains(&k.as_str()))
        .collect();
    for (key, value) in &keys {
        if is_drive(Kind::Qemu, key) && !indexed(key, "unused") {
            qemu_drive_storage_access(acl, &authid, vmid, value, storage)?;
        }
    }
    for (key, value) in &keys {
        if indexed(key, "unused")
            && let Some(volume) = volume_of(value)
        {
            volume_access(acl, &authid, volume, Some(vmid))?;
        }
    }
    if let Some((_, sid)) = keys.iter().find(|(k, _)| *k == "vmstatestorage") {
        acl.check(
            &authid,
            &format!("/storage/{sid}"),
            &["Datastore.AllocateSpace"],
            false,
        )?;
    }
    qemu_modify_config_perm(
        acl,
        &authid,
        vmid,
        pool,
        keys.iter().map(|(k, _)| k.as_str()),
    )?;
    for (key, value) in &keys {
        if indexed(key, "serial") && value.as_str() != "socket" {
            return Err(ApiError::die(format!(
                "only root can set '{key}' config for real devices"
            )));
        }
        if indexed(key, "serial") {
            check_vm_perm(acl, &authid, vmid, pool, &["VM.Config.HWType"], false)?;
        }
    }
    for (key, value) in &keys {
        if indexed(key, "net") {
            bridge_access(acl, &authid, value)?;
        }
    }
    Ok(())
}

/// The tag check of qemu-server's `create_vm` worker (inside the `qmcreate` task, after the
/// disks are allocated): [`assert_tag_permissions`] from [`QEMU_CREATE_OLD_TAGS`].
pub(crate) fn qemu_create_tags(
    cluster: &Cluster,
    authid: &str,
    vmid: u32,
    tags: &str,
) -> Result<(), String> {
    assert_tag_permissions(cluster, authid, vmid, QEMU_CREATE_OLD_TAGS, tags).map_err(|e| e.text())
}

/// `check_pool_exist`: 403 `Permission check failed (pool '<p>' does not exist)`.
pub(crate) fn check_pool_exist(cluster: &Cluster, pool: &str) -> ApiResult<()> {
    if cluster.pools.contains_key(pool) {
        Ok(())
    } else {
        Err(perm_failure(Some(&format!("pool '{pool}' does not exist"))))
    }
}

/// `VM.Allocate` on `/vms/<vmid>`, else on `/pool/<pool>`, else `raise_perm_exc()` (a bare
/// `Permission check failed`), as both create handlers check it.
pub(crate) fn vm_allocate(acl: &Acl, authid: &str, vmid: u32, pool: Option<&str>) -> ApiResult<()> {
    if authid == "root@pam"
        || acl.holds(authid, &format!("/vms/{vmid}"), &["VM.Allocate"], false)
        || pool.is_some_and(|p| acl.holds(authid, &format!("/pool/{p}"), &["VM.Allocate"], false))
    {
        return Ok(());
    }
    Err(perm_failure(None))
}

/// pve-container's `$NEW_DISK_RE` (`^([^:\s]+):(\d+(\.\d+)?)$`): the storage of a new volume.
fn lxc_new_disk(volume: &str) -> Option<&str> {
    let (sid, size) = volume.split_once(':')?;
    if sid.is_empty() || sid.contains(char::is_whitespace) {
        return None;
    }
    qemu_new_disk(size).map(|_| sid)
}

/// One container config change, as `check_ct_modify_config_perm` takes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CtWrite<'a> {
    pub(crate) vmid: u32,
    pub(crate) pool: Option<&'a str>,
    /// The current config (None at create).
    pub(crate) old: Option<&'a BTreeMap<String, String>>,
    pub(crate) new: &'a BTreeMap<String, String>,
    pub(crate) delete: &'a [String],
    pub(crate) unprivileged: bool,
}

/// pve-container `check_ct_modify_config_perm` (src/PVE/LXC.pm @ 94f5585) for the keys set
/// (`new`) and deleted (`delete`) on CT `vmid` whose current config is `old` (None at create):
/// CPU, disk (plus storage: `Datastore.AllocateSpace` for a new volume, volume access
/// otherwise; bind/device mounts `root@pam` only), memory, network (plus `SDN.Use` on the old
/// and the new bridge), `devN` root only, `features` (root only on a privileged CT; only
/// `nesting`, which needs `VM.Allocate`), `hookscript` root only, `tags`
/// (`assert_tag_permissions`), `VM.Config.Options` for everything else. Perl walks the keys
/// in hash order; this takes them sorted.
pub(crate) fn ct_modify_config_perm(
    cluster: &Cluster,
    authid: &str,
    w: &CtWrite<'_>,
) -> ApiResult<()> {
    let CtWrite {
        vmid,
        pool,
        old,
        new,
        delete,
        unprivileged,
    } = *w;
    if authid == "root@pam" {
        return Ok(());
    }
    let acl = &cluster.acl;
    let old_value = |k: &str| old.and_then(|o| o.get(k)).map(String::as_str);
    let check = |key: &str, deleting: bool| -> ApiResult<()> {
        let value = if deleting {
            None
        } else {
            new.get(key).map(String::as_str)
        };
        let vm = |privs: &[&str]| check_vm_perm(acl, authid, vmid, pool, privs, false);
        match key {
            "cores" | "cpuunits" | "cpulimit" => vm(&["VM.Config.CPU"]),
            k if k == "rootfs" || indexed(k, "mp") => {
                vm(&["VM.Config.Disk"])?;
                let Some(value) = value else { return Ok(()) };
                let volume = volume_of(value).unwrap_or_default();
                if volume.starts_with('/') {
                    let kind = if volume.starts_with("/dev/") {
                        "device"
                    } else {
                        "bind"
                    };
                    return Err(perm_failure(Some(&format!(
                        "mount point type {kind} is only allowed for root@pam"
                    ))));
                }
                match lxc_new_disk(volume) {
                    Some(sid) => acl.check(
                        authid,
                        &format!("/storage/{sid}"),
                        &["Datastore.AllocateSpace"],
                        false,
                    ),
                    None => volume_access_typed(acl, authid, volume, Some(vmid), "rootdir"),
                }
            }
            "memory" | "swap" => vm(&["VM.Config.Memory"]),
            k if indexed(k, "net") => {
                vm(&["VM.Config.Network"])?;
                if let Some(v) = old_value(k) {
                    bridge_access(acl, authid, v)?;
                }
                if let Some(v) = value {
                    bridge_access(acl, authid, v)?;
                }
                Ok(())
            }
            k if indexed(k, "dev") => Err(perm_failure(Some(
                "configuring device passthrough is only allowed for root@pam",
            ))),
            "nameserver" | "searchdomain" | "hostname" => vm(&["VM.Config.Network"]),
            "features" => {
                if !unprivileged {
                    return Err(perm_failure(Some(
                        "changing feature flags for privileged container is only allowed for root@pam",
                    )));
                }
                let features = |v: Option<&str>| -> BTreeMap<String, String> {
                    v.map(|v| {
                        PropertyString::parse(v, None)
                            .items()
                            .iter()
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect()
                    })
                    .unwrap_or_default()
                };
                let (mut nesting, mut other) = (false, false);
                let only_nesting =
                    |f: &BTreeMap<String, String>| f.len() == 1 && f.contains_key("nesting");
                if deleting {
                    let f = features(old_value(key));
                    nesting = only_nesting(&f);
                    other = !nesting && !f.is_empty();
                } else {
                    let f = features(value);
                    match old_value(key).filter(|v| !v.is_empty()) {
                        Some(o) => {
                            let o = features(Some(o));
                            let names: BTreeSet<&String> = o.keys().chain(f.keys()).collect();
                            for name in names {
                                if o.get(name) != f.get(name) {
                                    if name == "nesting" {
                                        nesting = true;
                                    } else {
                                        other = true;
                                        break;
                                    }
                                }
                            }
                        }
                        None => {
                            nesting = only_nesting(&f);
                            other = !nesting && !f.is_empty();
                        }
                    }
                }
                if other {
                    return Err(perm_failure(Some(
                        "changing feature flags (except nesting) is only allowed for root@pam",
                    )));
                }
                if nesting {
                    vm(&["VM.Allocate"])?;
                }
                Ok(())
            }
            "hookscript" => Err(perm_failure(Some(
                "changing the hookscript is only allowed for root@pam",
            ))),
            "tags" => assert_tag_permissions(
                cluster,
                authid,
                vmid,
                old_value("tags").unwrap_or_default(),
                value.unwrap_or_default(),
            ),
            _ => vm(&["VM.Config.Options"]),
        }
    };
    for key in new.keys() {
        check(key, false)?;
    }
    for key in delete {
        check(key, true)?;
    }
    Ok(())
}

/// `check_volume_access` with a content type: `unable to use volume <v> - content type
/// needs to be '<type>'` (a plain die; `images` passes for `rootdir`), then the access rules.
pub(crate) fn volume_access_typed(
    acl: &Acl,
    authid: &str,
    volid: &str,
    vmid: Option<u32>,
    content: &str,
) -> ApiResult<()> {
    if let Some((_, volname)) = storage::split_volid(volid)
        && let Ok(parsed) = storage::parse_volname(volname)
        && parsed.content != content
        && !(content == "rootdir" && parsed.content == "images")
    {
        return Err(ApiError::die(format!(
            "unable to use volume {volid} - content type needs to be '{content}'"
        )));
    }
    volume_access(acl, authid, volid, vmid)
}

/// The checks of qemu-server's `$update_vm_api` before the config is loaded, in its order:
/// `$check_vm_modify_config_perm` of the deleted keys, then of the keys set;
/// `$check_storage_access` of every drive set; `check_bridge_access` of every NIC set.
pub(crate) fn qemu_config_early(
    ctx: &Ctx,
    vmid: u32,
    set: &BTreeMap<String, String>,
    delete: &[String],
) -> ApiResult<()> {
    let authid = ctx.authid().to_string();
    if authid == "root@pam" {
        return Ok(());
    }
    let cluster = ctx.shared.cluster();
    let acl = &cluster.acl;
    qemu_modify_config_perm(acl, &authid, vmid, None, delete.iter().map(String::as_str))?;
    qemu_modify_config_perm(acl, &authid, vmid, None, set.keys().map(String::as_str))?;
    for (key, value) in set {
        if is_drive(Kind::Qemu, key) && !indexed(key, "unused") {
            qemu_drive_storage_access(acl, &authid, vmid, value, None)?;
        }
        if indexed(key, "unused")
            && let Some(volume) = volume_of(value)
        {
            volume_access(acl, &authid, volume, Some(vmid))?;
        }
    }
    if let Some(sid) = set.get("vmstatestorage") {
        acl.check(
            &authid,
            &format!("/storage/{sid}"),
            &["Datastore.AllocateSpace"],
            false,
        )?;
    }
    for (key, value) in set {
        if indexed(key, "net") {
            bridge_access(acl, &authid, value)?;
        }
    }
    Ok(())
}

/// qemu-server's `$check_drive_perms` (in `$updatefn`): a cloud-init drive needs
/// `VM.Config.Cloudinit` **and** `VM.Config.CDROM`, a CD-ROM `VM.Config.CDROM`, any other
/// drive `VM.Config.Disk`; always on `/vms/<vmid>`.
fn qemu_drive_perms(acl: &Acl, authid: &str, vmid: u32, value: &str) -> ApiResult<()> {
    let volume = volume_of(value).unwrap_or_default();
    let cloudinit = volume == "cloudinit"
        || storage::split_volid(volume).is_some_and(|(_, name)| {
            name == "cloudinit" || name.ends_with("-cloudinit") || name.contains("-cloudinit.")
        });
    let privs: &[&str] = if cloudinit {
        &["VM.Config.Cloudinit", "VM.Config.CDROM"]
    } else if option_of(value, "media") == Some("cdrom") {
        &["VM.Config.CDROM"]
    } else {
        &["VM.Config.Disk"]
    };
    check_vm_perm(acl, authid, vmid, None, privs, false)
}

/// The checks qemu-server's `$updatefn` makes per key once the config is loaded, the digest
/// compared and the lock checked: for each deleted drive its drive privileges (and a deleted
/// `unusedN` `VM.Config.Disk`); deleted `tags`: `assert_tag_permissions`; for each drive set,
/// the privileges of the old and the new value; `tags` set: `assert_tag_permissions` against
/// the current value; a NIC set: `SDN.Use` on the old bridge too. A value equal to the
/// pending one is skipped ("skip if nothing changed").
pub(crate) fn qemu_config_late(
    cluster: &Cluster,
    authid: &str,
    g: &crate::guest::Guest,
    set: &BTreeMap<String, String>,
    delete: &[String],
) -> ApiResult<()> {
    if authid == "root@pam" {
        return Ok(());
    }
    let acl = &cluster.acl;
    let vmid = g.vmid;
    let current = |k: &str| g.config.get(k).or_else(|| g.pending.get(k));
    for key in delete {
        let Some(val) = current(key) else { continue };
        if indexed(key, "unused") {
            check_vm_perm(acl, authid, vmid, None, &["VM.Config.Disk"], false)?;
        } else if is_drive(Kind::Qemu, key) {
            qemu_drive_perms(acl, authid, vmid, val)?;
        } else if key == "tags" {
            assert_tag_permissions(cluster, authid, vmid, val, "")?;
        }
    }
    for (key, value) in set {
        if g.pending.get(key) == Some(value) {
            continue;
        }
        if is_drive(Kind::Qemu, key) && !indexed(key, "unused") {
            if let Some(old) = g.config.get(key) {
                qemu_drive_perms(acl, authid, vmid, old)?;
            }
            qemu_drive_perms(acl, authid, vmid, value)?;
        } else if key == "tags" {
            let old = g.config.get("tags").map_or("", String::as_str);
            assert_tag_permissions(cluster, authid, vmid, old, value)?;
        } else if indexed(key, "net")
            && let Some(old) = g.config.get(key)
        {
            bridge_access(acl, authid, old)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_filled_from_the_parameters() {
        let params = BTreeMap::from([
            ("storage".to_string(), "local".to_string()),
            ("node".to_string(), "pve1".to_string()),
        ]);
        assert_eq!(
            fill_template("/storage/{storage}", &params),
            "/storage/local"
        );
        assert_eq!(fill_template("/nodes/{node}/x", &params), "/nodes/pve1/x");
        assert_eq!(fill_template("/vms/{vmid}", &params), "/vms/");
    }

    #[test]
    fn qemu_config_keys_ask_for_the_privileges_qemu_server_asks_for() {
        let privs = |k: &str| {
            qemu_key_privileges(k)
                .unwrap()
                .map(|(p, any)| (p.to_vec(), any))
        };
        assert_eq!(privs("cores"), Some((vec!["VM.Config.CPU"], false)));
        assert_eq!(privs("net3"), Some((vec!["VM.Config.Network"], false)));
        assert_eq!(
            privs("ipconfig0"),
            Some((vec!["VM.Config.Cloudinit", "VM.Config.Network"], true))
        );
        assert_eq!(privs("name"), Some((vec!["VM.Config.Options"], false)));
        // Drives and tags are checked elsewhere; unknown keys are root's.
        assert_eq!(privs("scsi0"), None);
        assert_eq!(privs("tags"), None);
        assert_eq!(
            qemu_key_privileges("affinity").unwrap_err(),
            "only root can set 'affinity' config"
        );
        assert!(is_drive(Kind::Qemu, "scsi0"));
        assert!(is_drive(Kind::Lxc, "mp2"));
        assert!(!is_drive(Kind::Lxc, "scsi0"));
    }

    #[test]
    fn new_disk_values_follow_the_new_disk_regexes() {
        assert_eq!(qemu_new_disk("local-lvm:32"), Some(Some("local-lvm")));
        assert_eq!(qemu_new_disk("32"), Some(None));
        assert_eq!(qemu_new_disk("local-lvm:0.5"), Some(Some("local-lvm")));
        assert_eq!(qemu_new_disk("local-lvm:vm-100-disk-0"), None);
        assert_eq!(lxc_new_disk("local-lvm:8"), Some("local-lvm"));
        assert_eq!(lxc_new_disk("8"), None);
        assert_eq!(split_list("a;b, c"), vec!["a", "b", "c"]);
        assert_eq!(split_list(QEMU_CREATE_OLD_TAGS), vec![QEMU_CREATE_OLD_TAGS]);
    }
}
