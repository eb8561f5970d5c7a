//! Disk and mount point values of guest configs: the synchronous checks PVE makes before it
//! forks a worker (allocation syntax, `import-from` rules, bind mounts), allocation of the
//! create form (`local-lvm:8` becomes `local-lvm:vm-100-disk-0,size=8G`), and the volume
//! bookkeeping of template conversion, unused disks and destruction.

use crate::cluster::Cluster;
use crate::error::{ApiError, ApiResult};
use crate::guest::{self, Guest, Kind};
use crate::property::PropertyString;
use crate::storage::{self, format_size, gib_to_bytes, parse_allocation};

/// The volume id in a drive or mount point value, if it names a storage volume (not `none`,
/// not a bind mount, not a create form).
pub(super) fn volid_of(value: &str) -> Option<String> {
    let p = PropertyString::parse(value, Some("file"));
    let file = p.get("file")?;
    if parse_allocation(file).is_some() || file.ends_with(":cloudinit") {
        return None;
    }
    storage::split_volid(file).map(|_| file.to_string())
}

/// Whether `value` is the create form (`<storage>:<GiB>` or `<storage>:cloudinit`).
pub(super) fn is_create_form(value: &str) -> bool {
    let p = PropertyString::parse(value, Some("file"));
    p.get("file")
        .is_some_and(|f| parse_allocation(f).is_some() || f.ends_with(":cloudinit"))
}

/// Synchronous checks of a qemu drive value.
pub(super) fn check_qemu_drive(
    cluster: &Cluster,
    node: &str,
    key: &str,
    value: &str,
    is_root: bool,
) -> ApiResult<()> {
    let p = PropertyString::parse(value, Some("file"));
    let file = p.get("file").unwrap_or("");
    if let Some(src) = p.get("import-from") {
        if !matches!(parse_allocation(file), Some((_, size)) if size == 0.0) {
            return Err(ApiError::param(
                key,
                "'import-from' requires special syntax - use <storage ID>:0,import-from=<source>",
            ));
        }
        if src.starts_with('/') {
            if !is_root {
                return Err(ApiError::forbidden(
                    "Only root can pass arbitrary filesystem paths.",
                ));
            }
        } else {
            let (ssid, sname) = storage::split_volid(src).ok_or_else(|| {
                ApiError::param(key, format!("unable to parse volume ID '{src}'"))
            })?;
            cluster.storage(node, ssid)?;
            let parsed = storage::parse_volname(sname).map_err(|e| ApiError::param(key, e))?;
            if sname.contains("cloudinit") {
                return Err(ApiError::param(
                    key,
                    format!("{src} is a cloud-init volume and cannot be imported"),
                ));
            }
            if parsed.content != "images" && parsed.content != "import" {
                return Err(ApiError::param(
                    key,
                    format!(
                        "{src} has wrong type '{}' - needs to be 'images' or 'import'",
                        parsed.content
                    ),
                ));
            }
            // Whether the source exists is not checked here: `check_volume_access` does not
            // test it; the worker's `create_disks` finds out (see `alloc_qemu_drive`).
        }
    }
    if let Some((sid, _)) = parse_allocation(file) {
        // qemu-server @ e6352be6 `src/PVE/API2/Qemu.pm` `$check_storage_access`: a new disk's
        // storage from `storage_config` (no node check; allocation in the worker finds out)
        // and 400 `raise_param_exc({ storage => "storage 'x' does not support vm images" })`.
        let def = cluster
            .storages
            .iter()
            .find(|s| s.id == sid)
            .ok_or_else(|| ApiError::die(format!("storage '{sid}' does not exist")))?;
        if !def.has_content("images") {
            return Err(ApiError::param(
                "storage",
                format!("storage '{sid}' does not support vm images"),
            ));
        }
    } else if let Some(sid) = file.strip_suffix(":cloudinit") {
        cluster.storage(node, sid)?;
    }
    Ok(())
}

/// Allocates the create form of a qemu drive and returns the value PVE stores.
pub(super) fn alloc_qemu_drive(
    cluster: &mut Cluster,
    node: &str,
    vmid: u32,
    key: &str,
    value: &str,
) -> Result<String, String> {
    let mut p = PropertyString::parse(value, Some("file"));
    let file = p.get("file").unwrap_or("").to_string();
    if let Some(sid) = file.strip_suffix(":cloudinit") {
        let volid = cluster.alloc_cloudinit(node, sid, vmid)?;
        p.set("file", &volid);
        p.set("media", "cdrom");
        return Ok(p.print(Some("file"), true));
    }
    let Some((sid, gib)) = parse_allocation(&file) else {
        // An existing volume: it must exist and hold images or an ISO; its size is
        // re-read (create_disks sets `size` even for ISO images).
        if file != "none" && file != "cdrom" && !file.starts_with('/') {
            let (_, volname) = storage::split_volid(&file)
                .ok_or_else(|| format!("unable to parse volume ID '{file}'"))?;
            let content = storage::parse_volname(volname)?.content;
            if content != "images" && content != "iso" {
                return Err(format!(
                    "cannot use volume {file} - content type needs to be 'images' or 'iso'"
                ));
            }
            let vol = cluster
                .volume(node, &file)
                .ok_or_else(|| format!("volume {file} does not exist"))?;
            p.set("size", &format_size(vol.size));
        }
        return Ok(p.print(Some("file"), true));
    };
    let sid = sid.to_string();
    let size = if let Some(src) = p.remove("import-from") {
        // The image's virtual size is not known without reading it; round the file up to
        // whole GiB as a stand-in.
        // A missing source fails here, in the worker (the `qmcreate` task, or the handler
        // of a synchronous config write): qemu-server e6352be6 `src/PVE/API2/Qemu.pm`
        // `create_disks` → `$import_from_volid`: `could not get size of <src>`, wrapped as
        // `cannot import from '<src>' - ...`.
        let bytes = if src.starts_with('/') {
            1 << 30
        } else {
            cluster
                .volume(node, &src)
                .ok_or_else(|| format!("cannot import from '{src}' - could not get size of {src}"))?
                .size
        };
        bytes.div_ceil(1 << 30).max(1) << 30
    } else if key == "efidisk0" {
        // New EFI disks with enrolled keys get the 2023 Microsoft certificates (LIVE-FACTS
        // §1.3: PVE adds `ms-cert`, and a write without it removes it again).
        if p.get("pre-enrolled-keys") == Some("1") && p.get("ms-cert").is_none() {
            p.set("ms-cert", "2023");
        }
        if p.get("efitype") == Some("4m") {
            4 << 20
        } else {
            528 << 10
        }
    } else if key == "tpmstate0" {
        4 << 20
    } else {
        gib_to_bytes(gib)
    };
    let volid = cluster.alloc_disk(node, &sid, vmid, "images", size, p.get("format"))?;
    p.set("file", &volid);
    p.set("size", &format_size(size));
    Ok(p.print(Some("file"), true))
}

/// `<ds> - cloud-init drive is already attached at '<key>'`: one cloud-init drive per VM.
pub(super) fn check_single_cloudinit<'a>(
    ds: &str,
    value: &str,
    others: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), String> {
    let is_cloudinit = |v: &str| {
        PropertyString::parse(v, Some("file"))
            .get("file")
            .is_some_and(|f| f.ends_with(":cloudinit") || f.contains("-cloudinit"))
    };
    if !is_cloudinit(value) {
        return Ok(());
    }
    for (k, v) in others {
        if k != ds && guest::is_qemu_disk_key(k) && is_cloudinit(v) {
            return Err(format!(
                "{ds} - cloud-init drive is already attached at '{k}'"
            ));
        }
    }
    Ok(())
}

/// Synchronous checks of an lxc `rootfs`/`mpN` value: bind mounts need `root@pam` and
/// allocations need a storage with `rootdir` content.
pub(super) fn check_lxc_volume(
    cluster: &Cluster,
    node: &str,
    value: &str,
    is_root: bool,
) -> ApiResult<()> {
    let p = PropertyString::parse(value, Some("volume"));
    let volume = p.get("volume").unwrap_or("");
    if volume.starts_with('/') {
        if !is_root {
            let kind = if volume.starts_with("/dev/") {
                "device"
            } else {
                "bind"
            };
            return Err(ApiError::forbidden(format!(
                "mount point type {kind} is only allowed for root@pam"
            )));
        }
        return Ok(());
    }
    if let Some((sid, _)) = parse_allocation(volume) {
        let def = cluster.storage(node, sid)?;
        if !def.has_content("rootdir") {
            return Err(ApiError::die(format!(
                "storage '{sid}' does not support container directories"
            )));
        }
    }
    Ok(())
}

/// Allocates the create form of an lxc volume.
pub(super) fn alloc_lxc_volume(
    cluster: &mut Cluster,
    node: &str,
    vmid: u32,
    value: &str,
) -> Result<String, String> {
    let mut p = PropertyString::parse(value, Some("volume"));
    let volume = p.get("volume").unwrap_or("").to_string();
    let Some((sid, gib)) = parse_allocation(&volume) else {
        return Ok(p.print(Some("volume"), true));
    };
    let size = gib_to_bytes(gib);
    let volid = cluster.alloc_disk(node, sid, vmid, "rootdir", size, None)?;
    p.set("volume", &volid);
    p.set("size", &format_size(size));
    Ok(p.print(Some("volume"), true))
}

/// Keys of `g`'s config that hold volumes (drives, mount points, unused disks).
pub(super) fn is_volume_key(kind: Kind, key: &str) -> bool {
    guest::is_unused_key(key)
        || match kind {
            Kind::Qemu => guest::is_qemu_disk_key(key),
            Kind::Lxc => guest::is_lxc_volume_key(key),
        }
}

fn default_key(kind: Kind) -> &'static str {
    match kind {
        Kind::Qemu => "file",
        Kind::Lxc => "volume",
    }
}

/// Volume ids a guest owns (not ISO images it merely uses).
pub(super) fn owned_volumes(g: &Guest) -> Vec<String> {
    g.config
        .iter()
        .chain(g.pending.iter())
        .filter(|(k, v)| {
            is_volume_key(g.kind, k)
                && !(g.kind == Kind::Qemu && guest::is_cdrom(v) && !v.contains("cloudinit"))
        })
        .filter_map(|(_, v)| {
            PropertyString::parse(v, Some(default_key(g.kind)))
                .get(default_key(g.kind))
                .filter(|f| storage::split_volid(f).is_some() && !f.starts_with('/'))
                .map(str::to_string)
        })
        .collect()
}

/// Moves a replaced or deleted disk to the first free `unusedN`, or frees it when it is
/// a cloud-init drive or already unused.
pub(super) fn retire_volume(cluster: &mut Cluster, g: &mut Guest, key: &str, old: &str) {
    let Some(volid) = PropertyString::parse(old, Some(default_key(g.kind)))
        .get(default_key(g.kind))
        .map(str::to_string)
    else {
        return;
    };
    if storage::split_volid(&volid).is_none() || volid.starts_with('/') {
        return;
    }
    if g.kind == Kind::Qemu && guest::is_cdrom(old) && !volid.contains("cloudinit") {
        return;
    }
    if guest::is_unused_key(key) || volid.contains("cloudinit") {
        cluster.free_volume(&g.node, &volid);
        return;
    }
    let n = (0..)
        .find(|n| !g.config.contains_key(&format!("unused{n}")))
        .unwrap_or(0);
    g.config.insert(format!("unused{n}"), volid);
}

/// Renames a guest's `vm-<vmid>-disk-N` volumes to `base-<vmid>-disk-N` (template
/// conversion; cloud-init volumes keep their name).
pub(super) fn rename_to_base(cluster: &mut Cluster, g: &mut Guest) {
    let keys: Vec<String> = g
        .config
        .keys()
        .filter(|k| is_volume_key(g.kind, k) && !guest::is_unused_key(k))
        .cloned()
        .collect();
    let dk = default_key(g.kind);
    for key in keys {
        let Some(value) = g.config.get(&key).cloned() else {
            continue;
        };
        let mut p = PropertyString::parse(&value, Some(dk));
        let Some(volid) = p.get(dk).map(str::to_string) else {
            continue;
        };
        let needle = format!("vm-{}-disk-", g.vmid);
        let Some((_, volname)) = storage::split_volid(&volid) else {
            continue;
        };
        if !volname.contains(&needle) {
            continue;
        }
        let new_name = volname.replace(&needle, &format!("base-{}-disk-", g.vmid));
        let new_volid = cluster.rename_volume(&g.node, &volid, &new_name);
        p.set(dk, &new_volid);
        g.config.insert(key, p.print(Some(dk), true));
    }
}

/// Applies pending changes (all, or only the keys `select` accepts) to the config.
pub(super) fn apply_pending(cluster: &mut Cluster, g: &mut Guest, select: &dyn Fn(&str) -> bool) {
    let sets: Vec<(String, String)> = g
        .pending
        .iter()
        .filter(|(k, _)| select(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in sets {
        g.pending.remove(&k);
        if let Some(old) = g.config.get(&k).cloned()
            && is_volume_key(g.kind, &k)
            && volid_of(&old) != volid_of(&v)
        {
            retire_volume(cluster, g, &k, &old);
        }
        g.config.insert(k, v);
    }
    let deletes: Vec<String> = g
        .pending_delete
        .iter()
        .filter(|k| select(k))
        .cloned()
        .collect();
    for k in deletes {
        g.pending_delete.remove(&k);
        let forced = g.pending_force.remove(&k);
        if let Some(old) = g.config.remove(&k)
            && is_volume_key(g.kind, &k)
        {
            match volid_of(&old) {
                Some(volid) if forced => {
                    cluster.free_volume(&g.node, &volid);
                }
                _ => retire_volume(cluster, g, &k, &old),
            }
        }
    }
}

/// Where a key sorts when PVE walks a config's volumes: qemu `ide`, `sata`, `scsi`,
/// `virtio` (by number), then `efidisk0`, `tpmstate0`; lxc `rootfs`, then `mpN`. Other keys
/// come after all volumes.
fn volume_rank(kind: Kind, key: &str) -> (u8, u32) {
    let num = |prefix: &str| {
        key.strip_prefix(prefix)
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0)
    };
    match kind {
        Kind::Qemu if guest::is_qemu_disk_key(key) => {
            for (rank, bus) in ["ide", "sata", "scsi", "virtio"].iter().enumerate() {
                if key.starts_with(bus) {
                    return (rank as u8, num(bus));
                }
            }
            (if key == "efidisk0" { 4 } else { 5 }, 0)
        }
        Kind::Lxc if key == "rootfs" => (0, 0),
        Kind::Lxc if guest::is_lxc_volume_key(key) => (1, num("mp")),
        _ => (9, 0),
    }
}

/// The parameters in the order PVE allocates them (volumes first, in PVE's order).
pub(super) fn allocation_order(
    kind: Kind,
    params: &std::collections::BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut items: Vec<(String, String)> =
        params.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    items.sort_by_key(|(k, _)| volume_rank(kind, k));
    items
}
