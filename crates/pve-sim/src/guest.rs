//! Guests (qemu VMs and LXC containers): their config with the `[PENDING]` section, the
//! digest over the config text, locks, running state, and the value rules PVE applies when
//! it writes a config (tags, sshkeys, cipassword, MAC addresses, hotplug classes).
//!
//! Pure data and rules; volume allocation and tasks live in `cluster` and the API handlers.

use std::collections::{BTreeMap, BTreeSet};

use sha1::{Digest, Sha1};

use crate::property::PropertyString;

/// Guest type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Qemu,
    Lxc,
}

impl Kind {
    /// `VM` or `CT`, as PVE names guests in messages.
    pub(crate) fn noun(self) -> &'static str {
        match self {
            Kind::Qemu => "VM",
            Kind::Lxc => "CT",
        }
    }

    /// `qemu` or `lxc`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Qemu => "qemu",
            Kind::Lxc => "lxc",
        }
    }

    /// Task type prefix (`qm` or `vz`).
    pub(crate) fn task_prefix(self) -> &'static str {
        match self {
            Kind::Qemu => "qm",
            Kind::Lxc => "vz",
        }
    }
}

/// One guest.
#[derive(Debug, Clone)]
pub(crate) struct Guest {
    pub(crate) vmid: u32,
    pub(crate) kind: Kind,
    pub(crate) node: String,
    pub(crate) config: BTreeMap<String, String>,
    pub(crate) pending: BTreeMap<String, String>,
    pub(crate) pending_delete: BTreeSet<String>,
    /// Pending deletes given with `force=1`: volumes are freed, not kept as `unusedN`.
    pub(crate) pending_force: BTreeSet<String>,
    pub(crate) running: bool,
    pub(crate) started_at: Option<u64>,
    pub(crate) pid: Option<u32>,
    /// The guest OS ignores ACPI power-down requests (a hung guest, or one without ACPI
    /// support): `shutdown` waits its `timeout`, then fails or, with `forceStop`, kills it.
    pub(crate) ignores_shutdown: bool,
    /// The QEMU guest agent inside the VM does not answer (issue 22): `/agent/*` fails with
    /// "QEMU guest agent is not running" (see `api::qemu::agent`).
    pub(crate) agent_stopped: bool,
    /// The config's `[snapname]` sections (issue 19), by name: see [`Snapshot`].
    pub(crate) snapshots: BTreeMap<String, Snapshot>,
}

/// One `[snapname]` section of a guest config: a copy of the config when it was taken
/// (`PVE::AbstractConfig::__snapshot_copy_config`, pve-guest-common @ 4a8f6cb, without
/// `lock`, `digest`, `description`, `unusedN`) plus its own keys.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    pub(crate) config: BTreeMap<String, String>,
    pub(crate) snaptime: u64,
    pub(crate) description: String,
    /// `snapstate` while a create (`prepare`) or delete (`delete`) task runs.
    pub(crate) snapstate: Option<String>,
    /// Taken with the RAM state of a running VM.
    pub(crate) vmstate: bool,
    pub(crate) parent: Option<String>,
}

impl Guest {
    pub(crate) fn new(vmid: u32, kind: Kind, node: &str) -> Self {
        Self {
            vmid,
            kind,
            node: node.to_string(),
            config: BTreeMap::new(),
            pending: BTreeMap::new(),
            pending_delete: BTreeSet::new(),
            pending_force: BTreeSet::new(),
            running: false,
            started_at: None,
            pid: None,
            ignores_shutdown: false,
            agent_stopped: false,
            snapshots: BTreeMap::new(),
        }
    }

    pub(crate) fn lock(&self) -> Option<&str> {
        self.config.get("lock").map(String::as_str)
    }

    pub(crate) fn is_template(&self) -> bool {
        self.config.get("template").is_some_and(|v| v == "1")
    }

    /// `check_lock`: `VM 100 is locked (create)`.
    pub(crate) fn check_lock(&self) -> Result<(), String> {
        match self.lock() {
            Some(lock) => Err(format!(
                "{} {} is locked ({lock})",
                self.kind.noun(),
                self.vmid
            )),
            None => Ok(()),
        }
    }

    /// The config file text, as `write_vm_config` lays it out.
    pub(crate) fn config_text(&self) -> String {
        let mut text = String::new();
        if let Some(d) = self.config.get("description") {
            for line in d.lines() {
                text.push_str(&format!("#{line}\n"));
            }
        }
        for (k, v) in &self.config {
            if k != "description" {
                text.push_str(&format!("{k}: {v}\n"));
            }
        }
        if !self.pending.is_empty() || !self.pending_delete.is_empty() {
            text.push_str("\n[PENDING]\n");
            if !self.pending_delete.is_empty() {
                let keys: Vec<String> = self
                    .pending_delete
                    .iter()
                    .map(|k| {
                        if self.pending_force.contains(k) {
                            format!("!{k}")
                        } else {
                            k.clone()
                        }
                    })
                    .collect();
                text.push_str(&format!("delete: {}\n", keys.join(",")));
            }
            for (k, v) in &self.pending {
                text.push_str(&format!("{k}: {v}\n"));
            }
        }
        // The digest covers the whole file, snapshot sections too (qemu-server
        // `parse_vm_config`: `sha1_hex($raw)`), so taking a snapshot changes it.
        for (name, snap) in &self.snapshots {
            text.push_str(&format!("\n[{name}]\n"));
            if !snap.description.is_empty() {
                text.push_str(&format!("description: {}\n", snap.description));
            }
            if let Some(parent) = &snap.parent {
                text.push_str(&format!("parent: {parent}\n"));
            }
            if let Some(state) = &snap.snapstate {
                text.push_str(&format!("snapstate: {state}\n"));
            }
            text.push_str(&format!("snaptime: {}\n", snap.snaptime));
            for (k, v) in &snap.config {
                text.push_str(&format!("{k}: {v}\n"));
            }
        }
        text
    }

    /// SHA-1 of the config text.
    pub(crate) fn digest(&self) -> String {
        hex::encode(Sha1::digest(self.config_text().as_bytes()))
    }

    /// Config with pending values applied (what `GET config` shows by default).
    pub(crate) fn merged_config(&self) -> BTreeMap<String, String> {
        let mut merged = self.config.clone();
        for (k, v) in &self.pending {
            merged.insert(k.clone(), v.clone());
        }
        for k in &self.pending_delete {
            merged.remove(k);
        }
        merged
    }

    /// Memory in MiB (`memory` may be `2048` or `current=2048`).
    pub(crate) fn memory_mib(&self) -> u64 {
        let default = 512;
        self.config
            .get("memory")
            .map(|m| PropertyString::parse(m, Some("current")))
            .and_then(|p| p.get("current").and_then(|v| v.parse().ok()))
            .unwrap_or(default)
    }

    pub(crate) fn cpus(&self) -> u64 {
        let get = |k: &str| self.config.get(k).and_then(|v| v.parse::<u64>().ok());
        match self.kind {
            Kind::Qemu => get("sockets").unwrap_or(1) * get("cores").unwrap_or(1),
            Kind::Lxc => get("cores").unwrap_or(1),
        }
    }

    /// Size of the boot disk (qemu) or rootfs (lxc), from the `size=` option.
    pub(crate) fn maxdisk(&self) -> u64 {
        let size_of = |v: &String| {
            PropertyString::parse(v, Some("file"))
                .get("size")
                .and_then(crate::storage::parse_size)
        };
        match self.kind {
            Kind::Lxc => self.config.get("rootfs").and_then(size_of).unwrap_or(0),
            Kind::Qemu => self
                .config
                .iter()
                .filter(|(k, v)| is_qemu_disk_key(k) && !is_cdrom(v))
                .find_map(|(_, v)| size_of(v))
                .unwrap_or(0),
        }
    }

    pub(crate) fn name(&self) -> String {
        match self.kind {
            Kind::Qemu => self
                .config
                .get("name")
                .cloned()
                .unwrap_or_else(|| format!("VM {}", self.vmid)),
            Kind::Lxc => self
                .config
                .get("hostname")
                .cloned()
                .unwrap_or_else(|| format!("CT{}", self.vmid)),
        }
    }

    pub(crate) fn uptime(&self, now: u64) -> u64 {
        self.started_at.map_or(0, |s| now.saturating_sub(s))
    }
}

pub(crate) fn config_path(kind: Kind, node: &str, vmid: u32) -> String {
    match kind {
        Kind::Qemu => format!("nodes/{node}/qemu-server/{vmid}.conf"),
        Kind::Lxc => format!("nodes/{node}/lxc/{vmid}.conf"),
    }
}

pub(crate) fn lock_file(kind: Kind, vmid: u32) -> String {
    match kind {
        Kind::Qemu => format!("/var/lock/qemu-server/lock-{vmid}.conf"),
        Kind::Lxc => format!("/run/lock/lxc/pve-config-{vmid}.lock"),
    }
}

/// `ide0`..`ide3`, `sata0`..`sata5`, `scsi0`..`scsi30`, `virtio0`..`virtio15`, `efidisk0`,
/// `tpmstate0`.
pub(crate) fn is_qemu_disk_key(key: &str) -> bool {
    let indexed = |prefix: &str, max: u32| {
        key.strip_prefix(prefix)
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n <= max)
    };
    indexed("ide", 3)
        || indexed("sata", 5)
        || indexed("scsi", 30)
        || indexed("virtio", 15)
        || key == "efidisk0"
        || key == "tpmstate0"
}

/// `rootfs` and `mp0`..`mp255`.
pub(crate) fn is_lxc_volume_key(key: &str) -> bool {
    key == "rootfs"
        || key
            .strip_prefix("mp")
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n <= 255)
}

pub(crate) fn is_unused_key(key: &str) -> bool {
    key.strip_prefix("unused")
        .is_some_and(|n| n.parse::<u32>().is_ok())
}

pub(crate) fn is_net_key(key: &str) -> bool {
    key.strip_prefix("net")
        .is_some_and(|n| n.parse::<u32>().is_ok())
}

pub(crate) fn is_cdrom(value: &str) -> bool {
    let p = PropertyString::parse(value, Some("file"));
    p.get("media") == Some("cdrom") || p.get("file").is_some_and(|f| f.contains(":iso/"))
}

/// The pending changes (sets and deletes) a running guest takes at once: the keys PVE's
/// `vmconfig_hotplug_pending` applies; everything else stays pending until the next start.
///
/// LXC: pve-container `src/PVE/LXC/Config.pm` @ 94f55852 `vmconfig_hotplug_pending`:
/// `$LXC_FASTPLUG_OPTIONS` (description, onboot, startup, protection, hostname, hookscript,
/// cores, tags, lock) set or deleted at once; sets of `cpulimit`, `cpuunits`, `memory`,
/// `swap`, `netN`, and `mpN`/`devN` into an empty slot (`die "skip\n"` over an existing
/// one); deletes of `unusedN`, `swap`, `cpulimit`, `cpuunits`, `netN`.
///
/// qemu: qemu-server `src/PVE/QemuServer.pm` @ e6352be6 `vmconfig_hotplug_pending` with
/// `parse_hotplug_features` (absent or `1` = `network,disk,usb`, `0` = none):
/// `$fast_plug_option` plus the cloud-init keys at once; `cpuunits`/`cpulimit`; `memory`
/// with `memory` (and NUMA, `qemu_memory_hotplug`); `vcpus` with `cpu`; `balloon` unless
/// it switches the device on or off; `agent` only for `fstrim_cloned_disks`
/// (`vmconfig_update_agent`); `netN` per `vmconfig_update_net`; drives per
/// `vmconfig_update_disk` (never `efidisk0`/`tpmstate0`; a new drive needs `disk` and not
/// ide/sata); `usbN`/`tablet` with `usb` (`usbN` also ostype `l26` or Windows > 7). Hotplug
/// errors (PVE's 400 `errors` from a PUT) are not modelled: a change PVE would fail to
/// hot-plug simply stays pending.
pub(crate) fn hotplugged(g: &Guest) -> BTreeSet<String> {
    let mut live = BTreeSet::new();
    for (key, value) in &g.pending {
        let old = g.config.get(key).map(String::as_str);
        let takes = match g.kind {
            Kind::Lxc => lxc_set_live(key, old),
            Kind::Qemu => qemu_set_live(g, key, value, old),
        };
        if takes {
            live.insert(key.clone());
        }
    }
    for key in &g.pending_delete {
        let takes = match g.kind {
            Kind::Lxc => lxc_delete_live(key),
            Kind::Qemu => qemu_delete_live(g, key),
        };
        if takes {
            live.insert(key.clone());
        }
    }
    live
}

const LXC_FASTPLUG: &[&str] = &[
    "description",
    "onboot",
    "startup",
    "protection",
    "hostname",
    "hookscript",
    "cores",
    "tags",
    "lock",
];

fn lxc_set_live(key: &str, old: Option<&str>) -> bool {
    LXC_FASTPLUG.contains(&key)
        || matches!(key, "cpulimit" | "cpuunits" | "memory" | "swap")
        || is_net_key(key)
        || ((numbered(key, "mp") || numbered(key, "dev")) && old.is_none())
}

fn lxc_delete_live(key: &str) -> bool {
    LXC_FASTPLUG.contains(&key)
        || is_unused_key(key)
        || matches!(key, "swap" | "cpulimit" | "cpuunits")
        || is_net_key(key)
}

/// `key` is `<prefix><digits>`.
fn numbered(key: &str, prefix: &str) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// qemu-server's `$fast_plug_option` and the cloud-init options (`$confdesc_cloudinit`).
fn qemu_fastplug(key: &str) -> bool {
    const FAST: &[&str] = &[
        "description",
        "hookscript",
        "lock",
        "migrate_downtime",
        "migrate_speed",
        "name",
        "onboot",
        "protection",
        "shares",
        "startup",
        "tags",
        "vmstatestorage",
        "citype",
        "ciuser",
        "cipassword",
        "ciupgrade",
        "cicustom",
        "searchdomain",
        "nameserver",
        "sshkeys",
    ];
    FAST.contains(&key) || numbered(key, "ipconfig")
}

/// `parse_hotplug_features` of the value in effect.
fn hotplug_feature(g: &Guest, feature: &str) -> bool {
    let value = match g.config.get("hotplug").map(|v| v.trim()) {
        None | Some("1") => "network,disk,usb",
        Some(v) => v,
    };
    value.split(',').any(|f| f.trim() == feature)
}

fn usb_hotplug(g: &Guest) -> bool {
    let ostype = g.config.get("ostype").map_or("", String::as_str);
    let windows = ostype
        .strip_prefix("win")
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    hotplug_feature(g, "usb") && (ostype == "l26" || windows > 7)
}

fn qemu_set_live(g: &Guest, key: &str, value: &str, old: Option<&str>) -> bool {
    if qemu_fastplug(key) {
        return true;
    }
    match key {
        "cpuunits" | "cpulimit" => true,
        "hotplug" => {
            let cpu_or_memory = |v: &str| v.contains("memory") || v.contains("cpu");
            !(cpu_or_memory(value) || old.is_some_and(cpu_or_memory))
        }
        "tablet" => hotplug_feature(g, "usb"),
        "vcpus" => hotplug_feature(g, "cpu"),
        "memory" => hotplug_feature(g, "memory") && g.config.get("numa").is_some_and(|n| n == "1"),
        "balloon" => {
            let enabled = |v: Option<&str>| v.is_none_or(|v| v.trim() != "0");
            enabled(old) == enabled(Some(value))
        }
        "agent" => {
            let Some(old) = old else { return false };
            let parts = |v: &str| {
                let p = PropertyString::parse(v, Some("enabled"));
                p.items()
                    .iter()
                    .filter(|(k, _)| k.as_str() != "fstrim_cloned_disks")
                    .cloned()
                    .collect::<BTreeMap<_, _>>()
            };
            parts(value) == parts(old)
        }
        _ if numbered(key, "usb") => usb_hotplug(g),
        _ if is_net_key(key) => qemu_net_live(g, value, old),
        _ if is_qemu_disk_key(key) => qemu_drive_live(g, key, value, old),
        _ => false,
    }
}

/// `vmconfig_update_net`.
fn qemu_net_live(g: &Guest, value: &str, old: Option<&str>) -> bool {
    let network = hotplug_feature(g, "network");
    let Some(old) = old else {
        return network;
    };
    let (new, old) = (
        PropertyString::parse(value, None),
        PropertyString::parse(old, None),
    );
    let model = |p: &PropertyString| p.items().first().cloned();
    let replug = model(&new) != model(&old)
        || new.get("queues") != old.get("queues")
        || new.get("mtu") != old.get("mtu")
        || new.get("bridge").is_none()
        || old.get("bridge").is_none();
    !replug || network
}

/// `vmconfig_update_disk` (`efidisk0`/`tpmstate0` are skipped before it).
fn qemu_drive_live(g: &Guest, key: &str, value: &str, old: Option<&str>) -> bool {
    if key == "efidisk0" || key == "tpmstate0" {
        return false;
    }
    let disk = hotplug_feature(g, "disk");
    let new = PropertyString::parse(value, Some("file"));
    let Some(old) = old.map(|o| PropertyString::parse(o, Some("file"))) else {
        return disk && !key.starts_with("ide") && !key.starts_with("sata");
    };
    let media = |p: &PropertyString| p.get("media").unwrap_or("disk").to_string();
    if media(&new) != media(&old) {
        return false; // "unable to change media type"
    }
    if old.get("media") == Some("cdrom")
        || old
            .get("file")
            .is_some_and(|f| f == "none" || f.contains(":iso/"))
    {
        return true; // change_medium
    }
    if new.get("file") != old.get("file") {
        return disk;
    }
    ![
        "aio", "discard", "iothread", "queues", "product", "cache", "ssd", "vendor", "ro",
    ]
    .iter()
    .any(|k| new.get(k) != old.get(k))
}

fn qemu_delete_live(g: &Guest, key: &str) -> bool {
    if qemu_fastplug(key) {
        return true;
    }
    match key {
        "cpuunits" | "cpulimit" => true,
        "hotplug" => !g
            .config
            .get("hotplug")
            .is_some_and(|v| v.contains("cpu") || v.contains("memory")),
        "tablet" => hotplug_feature(g, "usb"),
        "vcpus" => hotplug_feature(g, "cpu"),
        "balloon" => g.config.get("balloon").is_none_or(|b| b != "0"),
        "memory" => hotplug_feature(g, "memory"),
        _ if numbered(key, "usb") => usb_hotplug(g),
        _ if is_net_key(key) => hotplug_feature(g, "network"),
        _ if is_qemu_disk_key(key) => {
            hotplug_feature(g, "disk")
                && !["efidisk", "ide", "sata", "tpmstate"]
                    .iter()
                    .any(|p| key.starts_with(p))
        }
        _ => false,
    }
}

/// `pve-tag-list` normalisation: split on `;`, `,` and spaces, lower-case, de-duplicate,
/// sort, join with `;`.
pub(crate) fn normalise_tags(value: &str) -> String {
    let tags: BTreeSet<String> = value
        .split([';', ',', ' '])
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .collect();
    tags.into_iter().collect::<Vec<_>>().join(";")
}

/// A password hash in the shape PVE stores (`$5$salt$hash`); never shown to clients.
pub(crate) fn hash_password(plain: &str) -> String {
    use sha2::Sha256;
    let salt: String = (0..8)
        .map(|_| char::from(b'a' + rand::random_range(0..26u8)))
        .collect();
    let hash = hex::encode(Sha256::digest(format!("{salt}{plain}").as_bytes()));
    format!("$5${salt}${hash}")
}

/// A random MAC with the Proxmox prefix `BC:24:11`, upper case as PVE prints it.
pub(crate) fn random_mac() -> String {
    let b: [u8; 3] = rand::random();
    format!("BC:24:11:{:02X}:{:02X}:{:02X}", b[0], b[1], b[2])
}

/// A random RFC 4122 version 4 UUID.
pub(crate) fn random_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// qemu NIC models that may carry the MAC as `<model>=<mac>`.
const NIC_MODELS: &[&str] = &[
    "virtio",
    "e1000",
    "e1000e",
    "e1000-82540em",
    "e1000-82544gc",
    "e1000-82545em",
    "rtl8139",
    "vmxnet3",
    "i82551",
    "i82557b",
    "i82559er",
    "ne2k_isa",
    "ne2k_pci",
    "pcnet",
];

/// Fills in a MAC (random, or a fresh one when `regenerate`) and prints a qemu `netN` value
/// as `<model>=<MAC>,<rest sorted>`.
pub(crate) fn normalise_qemu_net(value: &str, regenerate: bool) -> String {
    let p = PropertyString::parse(value, Some("model"));
    let mut model = None;
    let mut mac = None;
    let mut rest = Vec::new();
    for (k, v) in p.items() {
        if k == "model" {
            model = Some(v.clone());
        } else if k == "macaddr" {
            mac = Some(v.clone());
        } else if NIC_MODELS.contains(&k.as_str()) && model.is_none() {
            model = Some(k.clone());
            if !v.is_empty() {
                mac = Some(v.clone());
            }
        } else {
            rest.push((k.clone(), v.clone()));
        }
    }
    let model = model.unwrap_or_else(|| "virtio".to_string());
    let mac = match mac {
        Some(m) if !regenerate => m.to_uppercase(),
        _ => random_mac(),
    };
    rest.sort();
    let mut out = format!("{model}={mac}");
    for (k, v) in rest {
        out.push_str(&format!(",{k}={v}"));
    }
    out
}

/// Fills in `hwaddr` and `type=veth` and prints an lxc `netN` value as
/// `name=<name>,<rest sorted>`.
pub(crate) fn normalise_lxc_net(value: &str, regenerate: bool) -> String {
    let mut p = PropertyString::parse(value, None);
    if regenerate || p.get("hwaddr").is_none() {
        p.set("hwaddr", &random_mac());
    }
    if p.get("type").is_none() {
        p.set("type", "veth");
    }
    p.print(Some("name"), false)
}

/// Keys whose config values PVE returns as JSON numbers (integer, number and boolean in
/// the GET config return schema).
pub(crate) fn is_numeric_key(kind: Kind, key: &str) -> bool {
    const QEMU: &[&str] = &[
        "acpi",
        "allow-ksm",
        "autostart",
        "balloon",
        "ciupgrade",
        "cores",
        "cpulimit",
        "cpuunits",
        "freeze",
        "keephugepages",
        "kvm",
        "localtime",
        "migrate_downtime",
        "migrate_speed",
        "numa",
        "onboot",
        "protection",
        "reboot",
        "shares",
        "smp",
        "snaptime",
        "sockets",
        "tablet",
        "tdf",
        "template",
        "vcpus",
    ];
    const LXC: &[&str] = &[
        "console",
        "cores",
        "cpulimit",
        "cpuunits",
        "debug",
        "memory",
        "onboot",
        "protection",
        "swap",
        "template",
        "tty",
        "unprivileged",
    ];
    match kind {
        Kind::Qemu => QEMU.contains(&key),
        Kind::Lxc => LXC.contains(&key),
    }
}

/// A config value as JSON: a number for numeric keys, else the string.
pub(crate) fn json_value(kind: Kind, key: &str, value: &str) -> serde_json::Value {
    if is_numeric_key(kind, key) {
        if let Ok(i) = value.parse::<i64>() {
            return i.into();
        }
        if let Ok(f) = value.parse::<f64>() {
            return f.into();
        }
    }
    value.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_lowercased_sorted_deduplicated_and_joined_with_semicolons() {
        assert_eq!(normalise_tags("Web;db,web prod"), "db;prod;web");
    }

    #[test]
    fn qemu_nets_get_a_mac_and_print_model_first() {
        let v = normalise_qemu_net("virtio,bridge=vmbr0,firewall=1", false);
        assert!(v.starts_with("virtio=BC:24:11:"), "{v}");
        assert!(v.ends_with(",bridge=vmbr0,firewall=1"), "{v}");
        let pinned = normalise_qemu_net("bridge=vmbr0,virtio=aa:bb:cc:dd:ee:ff", false);
        assert_eq!(pinned, "virtio=AA:BB:CC:DD:EE:FF,bridge=vmbr0");
    }

    #[test]
    fn the_digest_changes_with_pending_changes() {
        let mut g = Guest::new(100, Kind::Qemu, "pve1");
        g.config.insert("memory".into(), "512".into());
        let before = g.digest();
        g.pending.insert("memory".into(), "1024".into());
        assert_ne!(before, g.digest());
        assert_eq!(g.merged_config()["memory"], "1024");
    }
}
