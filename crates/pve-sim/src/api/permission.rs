//! The permission checks PVE makes around a request, on top of the ACL model in `crate::acl`:
//!
//! * [`check_api2`]: the method's schema `permissions` (`check_api2_permissions`), run by the
//!   dispatcher after the API-token check and before proxying, as pve-manager's `rest_handler`
//!   does;
//! * the checks handlers make for `user: all` methods or per key: guest create
//!   ([`guest_create`]), config writes ([`guest_config`]), volume access
//!   ([`volume_access`], pve-storage `check_volume_access`), and bridge use (SDN.Use).
//!
//! `root@pam` passes everything (PVE returns early for it); its `proxops` token has no
//! privilege separation, so it holds every privilege too.

use std::collections::BTreeMap;

use super::Ctx;
use crate::acl::{Acl, perm_failure};
use crate::error::{ApiError, ApiResult};
use crate::guest::Kind;
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

/// pve-storage `check_volume_access` for a `storage:volname` volume id used by guest `vmid`.
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
        _ => acl.check(authid, &path, &["Datastore.Allocate"], false),
    }
}

/// Whether `key` is a disk of a guest of `kind`.
fn is_drive(kind: Kind, key: &str) -> bool {
    let indexed = |prefixes: &[&str]| {
        prefixes.iter().any(|p| {
            key.strip_prefix(p)
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
    };
    match kind {
        Kind::Qemu => {
            key == "efidisk0"
                || key == "tpmstate0"
                || indexed(&["ide", "sata", "scsi", "virtio", "unused"])
        }
        Kind::Lxc => key == "rootfs" || indexed(&["mp", "unused"]),
    }
}

fn indexed(key: &str, prefix: &str) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// The privilege (or any-of privileges) qemu-server's `check_vm_modify_config_perm` and
/// pve-container's `check_ct_modify_config_perm` ask for a non-disk key.
fn key_privileges(kind: Kind, key: &str) -> &'static [&'static str] {
    match kind {
        Kind::Qemu => match key {
            "cores" | "cpu" | "cpulimit" | "cpuunits" | "numa" | "smp" | "sockets" | "vcpus"
            | "affinity" => &["VM.Config.CPU"],
            k if indexed(k, "numa") => &["VM.Config.CPU"],
            "memory" | "balloon" | "shares" => &["VM.Config.Memory"],
            "acpi" | "hotplug" | "kvm" | "machine" | "scsihw" | "smbios1" | "tablet" | "vga"
            | "watchdog" | "audio0" => &["VM.Config.HWType"],
            "freeze" => &["VM.PowerMgmt"],
            "boot" | "bootdisk" | "vmstatestorage" => &["VM.Config.Disk"],
            "cicustom" | "cipassword" | "citype" | "ciuser" | "ciupgrade" | "nameserver"
            | "searchdomain" | "sshkeys" => &["VM.Config.Cloudinit", "VM.Config.Network"],
            k if indexed(k, "ipconfig") => &["VM.Config.Cloudinit", "VM.Config.Network"],
            k if indexed(k, "net") => &["VM.Config.Network"],
            _ => &["VM.Config.Options"],
        },
        Kind::Lxc => match key {
            "cores" | "cpulimit" | "cpuunits" => &["VM.Config.CPU"],
            "memory" | "swap" => &["VM.Config.Memory"],
            "nameserver" | "searchdomain" | "hostname" => &["VM.Config.Network"],
            k if indexed(k, "net") => &["VM.Config.Network"],
            _ => &["VM.Config.Options"],
        },
    }
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
    "restore",
    "ostemplate",
    "password",
    "ssh-public-keys",
    "ignore-unpack-errors",
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

/// Storage checks of one disk value: a new volume needs `Datastore.AllocateSpace` on its
/// storage, an existing one volume access, an `import-from` source volume access too.
fn disk_access(acl: &Acl, authid: &str, kind: Kind, vmid: u32, value: &str) -> ApiResult<()> {
    let volume = volume_of(value).unwrap_or_default();
    let cdrom = option_of(value, "media") == Some("cdrom");
    if volume.is_empty() || volume == "none" || volume.ends_with(":cloudinit") {
        // nothing to check
    } else if cdrom && volume == "cdrom" {
        acl.check(authid, "/", &["Sys.Console"], false)?;
    } else if !cdrom && let Some((sid, _)) = storage::parse_allocation(volume) {
        acl.check(
            authid,
            &format!("/storage/{sid}"),
            &["Datastore.AllocateSpace"],
            false,
        )?;
    } else if kind == Kind::Lxc && volume.starts_with('/') {
        // Bind and device mounts are root@pam only; the handler answers that.
    } else {
        volume_access(acl, authid, volume, Some(vmid))?;
    }
    if let Some(src) = option_of(value, "import-from") {
        volume_access(acl, authid, src, Some(vmid))?;
    }
    Ok(())
}

/// SDN.Use on the bridge (and VLAN) of a NIC value: `/sdn/zones/localnetwork/<bridge>[/<tag>]`
/// (`check_vnet_access`; plain Linux bridges are in the `localnetwork` zone).
fn bridge_access(acl: &Acl, authid: &str, value: &str) -> ApiResult<()> {
    let Some(bridge) = option_of(value, "bridge") else {
        return Ok(());
    };
    let mut path = format!("/sdn/zones/localnetwork/{bridge}");
    if let Some(tag) = option_of(value, "tag") {
        path.push('/');
        path.push_str(tag);
    }
    acl.check(authid, &path, &["SDN.Use"], false)
}

/// The checks of one config key written (or, with `value` None, deleted).
fn key_access(
    acl: &Acl,
    authid: &str,
    kind: Kind,
    vmid: u32,
    pool: Option<&str>,
    key: &str,
    value: Option<&str>,
) -> ApiResult<()> {
    if is_drive(kind, key) {
        let cdrom = value.is_some_and(|v| option_of(v, "media") == Some("cdrom"));
        let privilege = if cdrom {
            "VM.Config.CDROM"
        } else {
            "VM.Config.Disk"
        };
        check_vm_perm(acl, authid, vmid, pool, &[privilege], false)?;
        if let Some(v) = value {
            disk_access(acl, authid, kind, vmid, v)?;
        }
        return Ok(());
    }
    let privs = key_privileges(kind, key);
    check_vm_perm(acl, authid, vmid, pool, privs, privs.len() > 1)?;
    if key == "startup" && kind == Kind::Qemu {
        acl.check(authid, "/", &["Sys.Modify"], false)?;
    }
    if indexed(key, "net")
        && let Some(v) = value
    {
        bridge_access(acl, authid, v)?;
    }
    Ok(())
}

/// `POST /nodes/{node}/qemu` and `/lxc`, after parameter validation: `VM.Allocate` on the
/// guest (or its pool), the config privileges of every key, storage access of every disk,
/// SDN.Use on every bridge, volume access to an LXC template, `Sys.Modify` on `/` for a
/// privileged container.
pub(crate) fn guest_create(ctx: &Ctx, kind: Kind) -> ApiResult<()> {
    let authid = ctx.authid().to_string();
    if authid == "root@pam" {
        return Ok(());
    }
    let vmid = ctx.params.vmid("vmid")?;
    let pool = ctx.params.get("pool");
    let cluster = ctx.shared.cluster();
    let acl = &cluster.acl;
    check_vm_perm(acl, &authid, vmid, pool, &["VM.Allocate"], false)?;
    if kind == Kind::Lxc {
        if let Some(template) = ctx.params.get("ostemplate") {
            volume_access(acl, &authid, template, Some(vmid))?;
        }
        if ctx.params.flag("unprivileged") != Some(true) {
            acl.check(&authid, "/", &["Sys.Modify"], false)?;
        }
    }
    for (key, value) in &ctx.params.0 {
        if CREATE_ONLY.contains(&key.as_str()) || (kind == Kind::Lxc && key == "unprivileged") {
            continue;
        }
        key_access(acl, &authid, kind, vmid, pool, key, Some(value))?;
    }
    Ok(())
}

/// `PUT`/`POST .../config`, after the schema's any-of-`VM.Config.*` check: the privileges of
/// every key set or deleted, with their storage and bridge checks.
pub(crate) fn guest_config(ctx: &Ctx, kind: Kind, vmid: u32) -> ApiResult<()> {
    let authid = ctx.authid().to_string();
    if authid == "root@pam" {
        return Ok(());
    }
    let cluster = ctx.shared.cluster();
    let acl = &cluster.acl;
    const NOT_KEYS: &[&str] = &[
        "node",
        "vmid",
        "delete",
        "revert",
        "digest",
        "skiplock",
        "force",
        "background_delay",
    ];
    for (key, value) in &ctx.params.0 {
        if NOT_KEYS.contains(&key.as_str()) {
            continue;
        }
        key_access(acl, &authid, kind, vmid, None, key, Some(value))?;
    }
    for list in ["delete", "revert"] {
        for key in ctx
            .params
            .get(list)
            .into_iter()
            .flat_map(|l| l.split([',', ';', ' ']))
            .filter(|k| !k.is_empty())
        {
            key_access(acl, &authid, kind, vmid, None, key, None)?;
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
    fn config_keys_ask_for_the_privileges_pve_asks_for() {
        assert_eq!(key_privileges(Kind::Qemu, "cores"), &["VM.Config.CPU"]);
        assert_eq!(key_privileges(Kind::Qemu, "net3"), &["VM.Config.Network"]);
        assert_eq!(
            key_privileges(Kind::Qemu, "ipconfig0"),
            &["VM.Config.Cloudinit", "VM.Config.Network"]
        );
        assert_eq!(key_privileges(Kind::Lxc, "swap"), &["VM.Config.Memory"]);
        assert_eq!(key_privileges(Kind::Qemu, "tags"), &["VM.Config.Options"]);
        assert!(is_drive(Kind::Qemu, "scsi0"));
        assert!(is_drive(Kind::Lxc, "mp2"));
        assert!(!is_drive(Kind::Lxc, "scsi0"));
    }
}
