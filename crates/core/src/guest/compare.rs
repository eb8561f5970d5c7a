//! A rendered guest config against the live one → [`GuestDiff`]: the keys to write (only the
//! changed ones), the keys to delete, the volumes to grow, and findings for what must not be
//! written.
//!
//! Semantic, and only over the keys ProxOps owns: PVE-filled values (generated MACs,
//! `smbios1`, `vmgenid`, volume names, `size=`) are ignored unless declared; `sshkeys` compare
//! as a decoded set, tags and nameservers as sets, descriptions without their trailing
//! newline, booleans as `1`/`0` with PVE's default for an absent key. A live volume is never
//! given a create-form value: option changes are written in its live form (its own volid),
//! and a pool change or a shrink is a finding. Live-only disk, NIC, mount point and PCI slots
//! are findings, never removed. This module decides nothing about power or ordering.

use std::collections::{BTreeMap, BTreeSet};

use super::GuestType;
use super::live::{LiveConfig, is_disk_key, numbered};
use super::property::{PropertyString, parse_bool, parse_pve_size, percent_decode};
use super::render::{DiskRole, DiskRule, RenderedConfig, Resize, Rule};

/// A size PVE may round a volume up to (an LVM extent); a live volume at most this much
/// larger than declared is not a shrink.
const EXTENT: u64 = 4 << 20;

/// Cloud-init identity keys a full clone inherits from its template.
const CLONE_IDENTITY_KEYS: [&str; 6] = [
    "ciuser",
    "sshkeys",
    "cipassword",
    "cicustom",
    "nameserver",
    "searchdomain",
];

/// What the caller knows beyond the two configs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompareContext {
    /// The guest came from a full clone (also implied by a rendered `clone`): its disks come
    /// from the template, and inherited cloud-init identity keys are deleted.
    pub clone_backed: bool,
}

/// What a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FindingKind {
    /// A disk, NIC, mount point or PCI slot that exists live and is not declared.
    LiveOnlySlot,
    /// A change that would lose data or cannot be made in place (pool change, shrink,
    /// volume over a non-empty slot, bind mount ↔ volume).
    UnsafeVolumeChange,
    /// A create-only field differs (e.g. `unprivileged`): only a recreate would apply it.
    RequiresRecreate,
    /// An owned value differs and cannot be written (kept for the planner's report mode).
    Drift,
}

/// One thing the diff will not change, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The config key (or `key.part`, e.g. `scsi0.size`).
    pub field: String,
    /// What the manifest wants.
    pub desired: String,
    /// What PVE has (empty when absent).
    pub observed: String,
    /// The kind of finding.
    pub kind: FindingKind,
}

/// What to do to bring one guest's config to the manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestDiff {
    /// Keys to write, only the changed ones (`PUT .../config`).
    pub set: BTreeMap<String, String>,
    /// Owned optional keys to remove (`delete=`); never also in `set`.
    pub delete: BTreeSet<String>,
    /// Volumes to grow, after `set` is written.
    pub resize: Vec<Resize>,
    /// What is not changed, and why.
    pub findings: Vec<Finding>,
    /// Whether any change in `set` is one PVE applies only to a stopped guest (the Go
    /// program's stop-required markers).
    pub needs_stop: bool,
    /// The keys in `set` that make `needs_stop` true.
    pub stop_keys: BTreeSet<String>,
}

impl GuestDiff {
    /// Whether there is nothing to write, delete, grow or report.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
            && self.delete.is_empty()
            && self.resize.is_empty()
            && self.findings.is_empty()
    }

    /// Whether there is anything to write, delete or grow (findings aside).
    pub fn has_changes(&self) -> bool {
        !(self.set.is_empty() && self.delete.is_empty() && self.resize.is_empty())
    }

    fn write(&mut self, guest_type: GuestType, key: &str, value: String, in_effect: &LiveConfig) {
        if held_until_restart(guest_type, key, &value, in_effect) {
            self.needs_stop = true;
            self.stop_keys.insert(key.to_owned());
        }
        self.set.insert(key.to_owned(), value);
    }

    fn finding(&mut self, field: String, desired: &str, observed: &str, kind: FindingKind) {
        self.findings.push(Finding {
            field,
            desired: desired.to_owned(),
            observed: observed.to_owned(),
            kind,
        });
    }
}

/// Compares what ProxOps owns in `rendered` with the `live` config.
pub fn compare(
    rendered: &RenderedConfig,
    live: &LiveConfig,
    context: &CompareContext,
) -> GuestDiff {
    let guest_type = rendered.guest_type;
    let clone_backed = context.clone_backed || rendered.clone.is_some();
    let mut diff = GuestDiff::default();
    // What PVE hot-plugs is decided against the values in effect, not pending ones.
    let in_effect = live.current();
    let in_effect = &in_effect;

    for (key, owned) in &rendered.owned {
        let observed = live.get(key);
        match &owned.rule {
            Rule::Disk(rule) => compare_disk(
                guest_type,
                key,
                &owned.value,
                rule,
                observed,
                in_effect,
                &mut diff,
            ),
            Rule::BindMount => {
                compare_bind(
                    guest_type,
                    key,
                    &owned.value,
                    observed,
                    in_effect,
                    &mut diff,
                );
            }
            // Right after a full clone the mask PVE shows is the template's password: the
            // manifest's is written once, as on create (later passes see it as satisfied).
            Rule::SealedPassword(_) if context.clone_backed => {
                diff.write(guest_type, key, owned.value.clone(), in_effect);
            }
            // A key PVE leaves out of the config is in effect at its documented default.
            rule if matches(
                rule,
                &owned.value,
                observed.or_else(|| absent_default(guest_type, key)),
            ) => {}
            // A CD-ROM written over a live disk would detach the disk.
            _ if guest_type == GuestType::Qemu
                && is_disk_key(key)
                && observed.is_some_and(holds_volume) =>
            {
                diff.finding(
                    key.clone(),
                    &owned.value,
                    observed.unwrap_or(""),
                    FindingKind::UnsafeVolumeChange,
                );
            }
            rule => {
                let value = written_value(rule, &owned.value, observed);
                diff.write(guest_type, key, value, in_effect);
            }
        }
    }

    for (path, desired) in &rendered.report_only {
        let Some((key, part)) = path.split_once('.') else {
            continue;
        };
        let live_parts = PropertyString::parse(live.get(key).unwrap_or(""), None);
        let observed = live_parts
            .get(part)
            .or_else(|| part_default(part))
            .unwrap_or("");
        if !part_eq(part, desired, observed) {
            diff.finding(path.clone(), desired, observed, FindingKind::Drift);
        }
    }

    if let Some(desired) = rendered.create_only.get("unprivileged") {
        let observed = live.get("unprivileged");
        let live_value = observed.and_then(parse_bool).unwrap_or(false);
        if parse_bool(desired) != Some(live_value) {
            diff.finding(
                "unprivileged".to_owned(),
                desired,
                observed.unwrap_or(""),
                FindingKind::RequiresRecreate,
            );
        }
    }

    for (key, entry) in live.entries() {
        if rendered.owned.contains_key(key) || entry.pve_filled {
            continue;
        }
        let live_only = match guest_type {
            GuestType::Qemu => {
                (is_disk_key(key) && !clone_backed && holds_volume(&entry.raw))
                    || numbered(key, "net")
                    || numbered(key, "hostpci")
            }
            GuestType::Lxc => numbered(key, "mp") || numbered(key, "net"),
        };
        if live_only {
            diff.finding(key.to_owned(), "", &entry.raw, FindingKind::LiveOnlySlot);
        }
        let inherited = CLONE_IDENTITY_KEYS.contains(&key) || numbered(key, "ipconfig");
        if clone_backed
            && guest_type == GuestType::Qemu
            && inherited
            && !rendered.kept.contains(key)
        {
            diff.delete.insert(key.to_owned());
        }
    }
    // PVE refuses a request that sets and deletes one key (LIVE-FACTS §1.4).
    let set = &diff.set;
    diff.delete.retain(|k| !set.contains_key(k));
    diff
}

/// Whether a live drive value holds a volume (not empty, not a CD-ROM, not cloud-init).
fn holds_volume(raw: &str) -> bool {
    let p = PropertyString::parse(raw, Some("file"));
    let file = p.get("file").unwrap_or("");
    !(file.is_empty()
        || file == "none"
        || p.get("media") == Some("cdrom")
        || file.contains(":iso/"))
}

/// The value PVE runs a guest with when its config has no `key` (the schema's `default`),
/// for the keys `qm create`/`pct create` leave out when not given: qemu `memory` 512
/// (qemu-server `src/PVE/QemuServer/Memory.pm` `current`, `default => 512` in the 9.1 API
/// schema), `cores` and `sockets` 1, `cpu` `kvm64` (`src/PVE/QemuServer/CPUConfig.pm`
/// `cputype`, `default => 'kvm64'`); LXC `memory` and `swap` 512 (pve-container
/// `src/PVE/LXC/Config.pm` `$confdesc`). An LXC without `cores` may use every host core:
/// no default to compare with.
fn absent_default(guest_type: GuestType, key: &str) -> Option<&'static str> {
    match (guest_type, key) {
        (GuestType::Qemu, "memory") | (GuestType::Lxc, "memory" | "swap") => Some("512"),
        (GuestType::Qemu, "cores" | "sockets") => Some("1"),
        (GuestType::Qemu, "cpu") => Some("kvm64"),
        _ => None,
    }
}

/// Whether PVE holds a write of `key` = `value` in `[PENDING]` on a running guest, to apply
/// it only at the next start, given the config in effect (`in_effect`: current values, no
/// pending ones). Everything else PVE applies at once or hot-plugs.
///
/// LXC: pve-container `src/PVE/LXC/Config.pm` @ 94f55852 `vmconfig_hotplug_pending`:
/// `$LXC_FASTPLUG_OPTIONS` (description, onboot, startup, protection, hostname, hookscript,
/// cores, tags, lock) are applied at once; `cpulimit`, `cpuunits`, `memory`, `swap` (cgroup
/// limits) and `netN` are hot-plugged; `mpN` and `devN` only into a slot that is empty in
/// effect (`die "skip\n"; # don't try to hotplug over existing mp`); everything else stays
/// pending.
///
/// qemu: qemu-server `src/PVE/QemuServer.pm` @ e6352be6 `vmconfig_hotplug_pending`, with the
/// guest's `hotplug` features (`parse_hotplug_features`: absent or `1` = the schema default
/// `network,disk,usb`, `0` = none): `$fast_plug_option` and the cloud-init keys at once;
/// `cpuunits`, `cpulimit` live; `memory` only with the `memory` feature (and NUMA, which
/// `qemu_memory_hotplug` needs for DIMMs); `vcpus` only with `cpu` (`cores`, `sockets`,
/// `cpu`, `numa`, `machine`, ... never); `balloon` unless it switches the balloon device on
/// or off; `agent` only for `fstrim_cloned_disks`; `netN` per `vmconfig_update_net` and
/// drives per `vmconfig_update_disk` (see [`qemu_net_held`], [`qemu_drive_held`]); `usbN`
/// and `tablet` only with `usb` (`usbN` also needs ostype `l26` or Windows newer than 7).
pub(crate) fn held_until_restart(
    guest_type: GuestType,
    key: &str,
    value: &str,
    in_effect: &LiveConfig,
) -> bool {
    match guest_type {
        GuestType::Lxc => lxc_held(key, in_effect),
        GuestType::Qemu => qemu_held(key, value, in_effect),
    }
}

fn lxc_held(key: &str, in_effect: &LiveConfig) -> bool {
    const FASTPLUG: [&str; 9] = [
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
    if FASTPLUG.contains(&key)
        || matches!(key, "cpulimit" | "cpuunits" | "memory" | "swap")
        || numbered(key, "net")
    {
        return false;
    }
    if numbered(key, "mp") || numbered(key, "dev") {
        return in_effect.get(key).is_some();
    }
    true
}

/// qemu-server's hotplug features of a guest (`parse_hotplug_features`).
#[derive(Debug, Clone, Copy, Default)]
struct Hotplug {
    network: bool,
    disk: bool,
    cpu: bool,
    memory: bool,
    usb: bool,
}

impl Hotplug {
    fn of(in_effect: &LiveConfig) -> Self {
        let value = match in_effect.get("hotplug").map(str::trim) {
            None | Some("1") => "network,disk,usb",
            Some(v) => v,
        };
        let mut features = Self::default();
        for feature in value.split([',', ';', ' ']).map(str::trim) {
            match feature {
                "network" => features.network = true,
                "disk" => features.disk = true,
                "cpu" => features.cpu = true,
                "memory" => features.memory = true,
                "usb" => features.usb = true,
                _ => {}
            }
        }
        features
    }
}

/// The config keys qemu-server writes at once even on a running VM (`$fast_plug_option`,
/// proxmox/qemu-server @ e6352be6, `src/PVE/QemuServer.pm`): never held as pending. The
/// planner's hotplug rules and the risk levels (`plan::risk`) both read this one list.
pub(crate) const QEMU_FAST_PLUG: [&str; 12] = [
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
];

fn qemu_held(key: &str, value: &str, in_effect: &LiveConfig) -> bool {
    const CLOUD_INIT: [&str; 8] = [
        "citype",
        "ciuser",
        "cipassword",
        "ciupgrade",
        "cicustom",
        "searchdomain",
        "nameserver",
        "sshkeys",
    ];
    if QEMU_FAST_PLUG.contains(&key) || CLOUD_INIT.contains(&key) || numbered(key, "ipconfig") {
        return false;
    }
    let hot = Hotplug::of(in_effect);
    let old = in_effect.get(key);
    match key {
        "cpuunits" | "cpulimit" => false,
        "hotplug" => {
            let cpu_or_memory = |v: &str| v.contains("memory") || v.contains("cpu");
            cpu_or_memory(value) || old.is_some_and(cpu_or_memory)
        }
        "tablet" => !hot.usb,
        "vcpus" => !hot.cpu,
        "memory" => !(hot.memory && in_effect.get("numa").and_then(parse_bool) == Some(true)),
        "balloon" => {
            let enabled = |v: Option<&str>| v.is_none_or(|v| v.trim() != "0");
            enabled(old) != enabled(Some(value))
        }
        "agent" => agent_held(value, old),
        _ if numbered(key, "usb") => {
            let ostype = in_effect.get("ostype").unwrap_or("");
            let windows = ostype
                .strip_prefix("win")
                .and_then(|n| n.parse::<u32>().ok())
                .unwrap_or(0);
            !(hot.usb && (ostype == "l26" || windows > 7))
        }
        _ if numbered(key, "net") => qemu_net_held(value, old, hot),
        _ if is_disk_key(key) => qemu_drive_held(key, value, old, hot),
        _ => true,
    }
}

/// `vmconfig_update_agent`: only `fstrim_cloned_disks` changes live, and only when an
/// `agent` value is in effect.
fn agent_held(value: &str, old: Option<&str>) -> bool {
    let Some(old) = old else {
        return true;
    };
    let parts = |v: &str| {
        PropertyString::parse(v, Some("enabled"))
            .items()
            .iter()
            .filter(|(k, _)| k != "fstrim_cloned_disks")
            .cloned()
            .collect::<BTreeMap<_, _>>()
    };
    parts(value) != parts(old)
}

/// `vmconfig_update_net`: a NIC in effect takes a new bridge, VLAN tag, trunks, firewall,
/// rate or link state at once; a new model, MAC, queue count or MTU (or a NIC without
/// bridge) means unplug and replug, which needs the `network` feature, as does a new NIC.
fn qemu_net_held(value: &str, old: Option<&str>, hot: Hotplug) -> bool {
    let Some(old) = old else {
        return !hot.network;
    };
    let (new_nic, old_nic) = (
        PropertyString::parse(value, None),
        PropertyString::parse(old, None),
    );
    // `virtio=<MAC>` (or `model=virtio,macaddr=<MAC>`) comes first.
    let model = |p: &PropertyString| p.items().first().cloned().unwrap_or_default();
    let replug = model(&new_nic) != model(&old_nic)
        || ["queues", "mtu"]
            .iter()
            .any(|k| new_nic.get(k) != old_nic.get(k))
        || new_nic.get("bridge").is_none()
        || old_nic.get("bridge").is_none();
    replug && !hot.network
}

/// `vmconfig_update_disk`: `efidisk0` and `tpmstate0` are never hot-plugged; a CD-ROM in
/// effect takes a new medium at once; a disk in effect takes throttle limits, size, backup
/// and the like at once, but not a new `aio`, `discard`, `iothread`, `queues`, `product`,
/// `cache`, `ssd`, `vendor` or `ro` (held), and a different volume needs the `disk`
/// feature; a new drive needs `disk` and a slot other than ide or sata.
fn qemu_drive_held(key: &str, value: &str, old: Option<&str>, hot: Hotplug) -> bool {
    if key == "efidisk0" || key == "tpmstate0" {
        return true;
    }
    let new = PropertyString::parse(value, Some("file"));
    let old = old
        .map(|o| PropertyString::parse(o, Some("file")))
        .filter(|o| o.get("file").is_some());
    let Some(old) = old else {
        return !hot.disk || key.starts_with("ide") || key.starts_with("sata");
    };
    // A cloud-init drive is allocated (`create_disks`) before it goes pending, as a CD-ROM.
    let media = |p: &PropertyString| {
        if p.get("file").is_some_and(|f| f.contains("cloudinit")) {
            "cdrom".to_owned()
        } else {
            p.get("media").unwrap_or("disk").to_owned()
        }
    };
    if media(&new) != media(&old) {
        // "unable to change media type": PVE leaves it pending with an error.
        return true;
    }
    let old_file = old.get("file").unwrap_or("");
    if old.get("media") == Some("cdrom") || old_file.contains(":iso/") || old_file == "none" {
        return false;
    }
    if new.get("file") != old.get("file") {
        return !hot.disk;
    }
    [
        "aio", "discard", "iothread", "queues", "product", "cache", "ssd", "vendor", "ro",
    ]
    .iter()
    .any(|k| new.get(k) != old.get(k))
}

/// Whether the live value satisfies an owned value under a (non-volume) rule.
fn matches(rule: &Rule, desired: &str, observed: Option<&str>) -> bool {
    match rule {
        Rule::Scalar => observed.is_some_and(|o| part_eq("", desired, o)),
        Rule::Bool { pve_default } => {
            let live = observed.and_then(first_bool).or(*pve_default);
            parse_bool(desired).is_some() && live == parse_bool(desired)
        }
        Rule::Props {
            bare_key,
            ignore_extra,
        } => props_match(desired, observed.unwrap_or(""), *bare_key, *ignore_extra),
        Rule::QemuNet => observed.is_some_and(|o| qemu_net_matches(desired, o)),
        Rule::Set { lowercase } => {
            set_of(desired, *lowercase) == set_of(observed.unwrap_or(""), *lowercase)
        }
        Rule::SshKeys => ssh_key_set(desired) == ssh_key_set(observed.unwrap_or("")),
        // `desired` is only a marker: the sealed keys are what is compared.
        Rule::SealedSshKeys(keys) => {
            ssh_key_set(keys.expose()) == ssh_key_set(observed.unwrap_or(""))
        }
        // PVE reports a set password as a fixed mask: present is all that can be checked.
        Rule::SealedPassword(_) => observed.is_some(),
        Rule::Description => {
            observed.unwrap_or("").trim_end_matches(['\n', '\r'])
                == desired.trim_end_matches(['\n', '\r'])
        }
        Rule::Machine => observed.is_some_and(|o| machine_matches(desired, o)),
        // Volumes are compared by `compare_disk` and `compare_bind`.
        Rule::Disk(_) | Rule::BindMount => observed == Some(desired),
    }
}

/// The value to write for a key that differs. Where ProxOps owns only some parts of a
/// property string, the live parts it does not declare are kept: a NIC keeps its MAC (PVE
/// would generate a new one), `features` keeps flags only root@pam may change, `cpu` keeps
/// its flags.
fn written_value(rule: &Rule, desired: &str, observed: Option<&str>) -> String {
    let Some(observed) = observed.filter(|o| !o.trim().is_empty()) else {
        return desired.to_owned();
    };
    let merge = |bare_key: Option<&str>| {
        let mut merged = PropertyString::parse(observed, bare_key);
        let declared = PropertyString::parse(desired, bare_key);
        for (k, v) in declared.items() {
            merged.set(k, v);
        }
        // An address and its gateway go together: a declared address owns the gateway.
        for (ip, gw) in [("ip", "gw"), ("ip6", "gw6")] {
            if declared.get(ip).is_some() && declared.get(gw).is_none() {
                merged.remove(gw);
            }
        }
        merged.to_value(bare_key)
    };
    match rule {
        Rule::Props {
            bare_key,
            ignore_extra: true,
        } => merge(*bare_key),
        Rule::Machine => merge(Some("type")),
        // `agent: 0,type=virtio` keeps its type when switched on.
        Rule::Bool { .. } => merge(Some("enabled")),
        Rule::QemuNet => {
            let (model, d_mac, d_rest) = split_qemu_net(desired);
            let (_, o_mac, mut merged) = split_qemu_net(observed);
            for (k, v) in d_rest.items() {
                merged.set(k, v);
            }
            let head = match d_mac.or(o_mac) {
                Some(mac) => format!("{model}={}", mac.to_uppercase()),
                None => model,
            };
            let rest = merged.to_value(None);
            if rest.is_empty() {
                head
            } else {
                format!("{head},{rest}")
            }
        }
        _ => desired.to_owned(),
    }
}

/// Whether a live `machine` is the declared machine type, possibly with a pinned version.
fn machine_matches(desired: &str, observed: &str) -> bool {
    let live = PropertyString::parse(observed, Some("type"));
    let Some(live) = live.get("type") else {
        return false;
    };
    let versioned = |prefix: &str| {
        live.strip_prefix(prefix)
            .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
    };
    match desired {
        "q35" => live == "q35" || versioned("pc-q35-"),
        "pc" => live == "pc" || versioned("pc-i440fx-") || versioned("pc-"),
        _ => live == desired,
    }
}

/// The boolean of a value such as `1`, `0` or `1,type=virtio`.
fn first_bool(raw: &str) -> Option<bool> {
    PropertyString::parse(raw, Some("enabled"))
        .get("enabled")
        .and_then(parse_bool)
}

/// PVE's value for a property-string part that is absent.
fn part_default(key: &str) -> Option<&'static str> {
    Some(match key {
        "iothread" | "ssd" | "firewall" | "ro" | "quota" | "shared" | "backup" | "nesting"
        | "hidden" | "pcie" | "keyctl" | "fuse" | "pre-enrolled-keys" => "0",
        "discard" => "ignore",
        "media" => "disk",
        "type" => "veth",
        "efitype" => "2m",
        _ => return None,
    })
}

/// Whether two part values are the same: MACs and PCI addresses in any case, numbers by
/// value, booleans by meaning, everything else exactly (trimmed).
fn part_eq(key: &str, desired: &str, observed: &str) -> bool {
    let (d, o) = (desired.trim(), observed.trim());
    if d == o {
        return true;
    }
    if matches!(key, "hwaddr" | "macaddr" | "host") {
        return d.eq_ignore_ascii_case(o);
    }
    if let (Ok(a), Ok(b)) = (d.parse::<f64>(), o.parse::<f64>()) {
        return a == b;
    }
    matches!((parse_bool(d), parse_bool(o)), (Some(a), Some(b)) if a == b)
}

/// Every declared part matches (absent live parts count as PVE's default); with
/// `ignore_extra` false, the live value has no other parts either.
fn props_match(desired: &str, observed: &str, bare_key: Option<&str>, ignore_extra: bool) -> bool {
    let d = PropertyString::parse(desired, bare_key);
    let o = PropertyString::parse(observed, bare_key);
    parts_match(&d, &o) && (ignore_extra || o.items().iter().all(|(k, _)| d.get(k).is_some()))
}

fn parts_match(desired: &PropertyString, observed: &PropertyString) -> bool {
    desired.items().iter().all(|(k, v)| {
        observed
            .get(k)
            .or_else(|| part_default(k))
            .is_some_and(|o| part_eq(k, v, o))
    })
}

/// A qemu NIC value as (model, MAC, other parts).
fn split_qemu_net(value: &str) -> (String, Option<String>, PropertyString) {
    let p = PropertyString::parse(value, Some("model"));
    let mut model = String::new();
    let mut mac = None;
    let mut rest = PropertyString::default();
    for (i, (k, v)) in p.items().iter().enumerate() {
        match (i, k.as_str()) {
            (0, "model") => model.clone_from(v),
            (0, _) => {
                model.clone_from(k);
                mac = Some(v.clone());
            }
            (_, "macaddr") => mac = Some(v.clone()),
            _ => rest.set(k, v),
        }
    }
    (model, mac, rest)
}

fn qemu_net_matches(desired: &str, observed: &str) -> bool {
    let (d_model, d_mac, d_rest) = split_qemu_net(desired);
    let (o_model, o_mac, o_rest) = split_qemu_net(observed);
    let mac_ok = match (&d_mac, &o_mac) {
        (None, _) => true,
        (Some(d), Some(o)) => d.eq_ignore_ascii_case(o),
        (Some(_), None) => false,
    };
    d_model == o_model && mac_ok && parts_match(&d_rest, &o_rest)
}

fn set_of(value: &str, lowercase: bool) -> BTreeSet<String> {
    value
        .split(|c: char| c == ';' || c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(|t| {
            if lowercase {
                t.to_lowercase()
            } else {
                t.to_owned()
            }
        })
        .collect()
}

fn ssh_key_set(encoded: &str) -> BTreeSet<String> {
    percent_decode(encoded)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A pool membership to correct: the guest is in `observed` (`None`: in no pool, or in one
/// the token may not audit) and `spec.pool` says `desired`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolDrift {
    /// `spec.pool`.
    pub desired: String,
    /// What `/cluster/resources` reports as the guest's `pool`.
    pub observed: Option<String>,
}

/// Compares `spec.pool` with the guest's `pool` in `/cluster/resources`. PVE keeps pool
/// membership in `user.cfg` (`$usercfg->{vms}->{$vmid}`), not in the guest config, and
/// `/cluster/resources` reports it per guest (pve-manager @ 14a22df3
/// `PVE/API2/Cluster.pm` `resources`: `$entry->{pool} = $pool`, removed again when the caller
/// lacks `Pool.Audit` on `/pool/<pool>`). No declared pool is no drift: membership is then not
/// managed.
pub fn compare_pool(desired: Option<&str>, observed: Option<&str>) -> Option<PoolDrift> {
    let desired = desired?;
    if observed == Some(desired) {
        return None;
    }
    Some(PoolDrift {
        desired: desired.to_owned(),
        observed: observed.map(str::to_owned),
    })
}

/// Whether writing `value` to `key` makes PVE allocate a volume (`<storage>:<size>`,
/// `<storage>:cloudinit`) or import one (`import-from=`): the create forms the planner puts
/// into empty slots. A qemu config write holding one is sent as `POST .../config`, a
/// `qmconfig` task, not the synchronous `PUT`, whose handler copies a whole image before it
/// answers and outlasts pveproxy's 30 s proxy timeout (qemu-server e6352be6
/// `src/PVE/API2/Qemu.pm` `update_vm`: "You should consider using the POST method instead
/// for any actions involving hotplug or storage allocation"). LXC has no `POST config`.
pub fn allocates_volume(guest_type: GuestType, key: &str, value: &str) -> bool {
    let is_volume_slot = match guest_type {
        GuestType::Qemu => is_disk_key(key) || matches!(key, "efidisk0" | "tpmstate0"),
        GuestType::Lxc => key == "rootfs" || numbered(key, "mp"),
    };
    if !is_volume_slot {
        return false;
    }
    let props = PropertyString::parse(value, Some(volume_key(guest_type, key)));
    if props.get("import-from").is_some() {
        return true;
    }
    let bare = props.get(volume_key(guest_type, key)).unwrap_or("");
    bare.split_once(':').is_some_and(|(storage, rest)| {
        !storage.is_empty()
            && (rest == "cloudinit"
                || (!rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit() || b == b'.')))
    })
}

/// The key of a volume's bare part.
fn volume_key(guest_type: GuestType, key: &str) -> &'static str {
    if guest_type == GuestType::Lxc && (key == "rootfs" || numbered(key, "mp")) {
        "volume"
    } else {
        "file"
    }
}

fn compare_disk(
    guest_type: GuestType,
    key: &str,
    create_form: &str,
    rule: &DiskRule,
    observed: Option<&str>,
    in_effect: &LiveConfig,
    diff: &mut GuestDiff,
) {
    let bare = volume_key(guest_type, key);
    let live = PropertyString::parse(observed.unwrap_or(""), Some(bare));
    let file = live.get(bare).unwrap_or("");
    let is_cloudinit_volume = file.contains("cloudinit");
    let is_cdrom = live.get("media") == Some("cdrom") || file.contains(":iso/");
    let empty = file.is_empty() || file == "none";

    // A create form goes only into an empty slot (the Go program's data-loss guard); the
    // cloud-init drive may also replace a CD-ROM, which holds no data.
    let replaceable =
        empty || (rule.role == DiskRole::CloudInit && is_cdrom && !is_cloudinit_volume);
    if replaceable {
        diff.write(guest_type, key, create_form.to_owned(), in_effect);
        if let (Some(_), Some(size)) = (&rule.import_from, rule.size) {
            diff.resize.push(Resize {
                slot: key.to_owned(),
                size,
            });
        }
        return;
    }
    let observed = observed.unwrap_or("");
    let wrong_content = match rule.role {
        DiskRole::CloudInit => !is_cloudinit_volume,
        DiskRole::MountPoint | DiskRole::RootFs => file.starts_with('/'),
        DiskRole::Data | DiskRole::Efi | DiskRole::Tpm => is_cdrom || is_cloudinit_volume,
    };
    if wrong_content {
        diff.finding(
            key.to_owned(),
            create_form,
            observed,
            FindingKind::UnsafeVolumeChange,
        );
        return;
    }
    let pool = file.split_once(':').map_or(file, |(pool, _)| pool);
    if pool != rule.storage {
        diff.finding(
            format!("{key}.storage"),
            &rule.storage,
            pool,
            FindingKind::UnsafeVolumeChange,
        );
        return;
    }
    let sized = matches!(
        rule.role,
        DiskRole::Data | DiskRole::RootFs | DiskRole::MountPoint
    );
    if let (true, Some(size), Some(live_bytes)) =
        (sized, rule.size, live.get("size").and_then(parse_pve_size))
    {
        let declared = size.bytes();
        // PVE rounds an allocation down to KiB, and storages round up to their extents.
        if live_bytes < declared & !1023 {
            diff.resize.push(Resize {
                slot: key.to_owned(),
                size,
            });
        } else if live_bytes > declared.div_ceil(EXTENT).saturating_mul(EXTENT) {
            diff.finding(
                format!("{key}.size"),
                &size.to_string(),
                live.get("size").unwrap_or(""),
                FindingKind::UnsafeVolumeChange,
            );
        }
    }
    let changed: Vec<&(String, String)> = rule
        .options
        .iter()
        .filter(|(k, v)| {
            !live
                .get(k)
                .or_else(|| part_default(k))
                .is_some_and(|o| part_eq(k, v, o))
        })
        .collect();
    if changed.is_empty() {
        return;
    }
    // An EFI vars or TPM state volume gets its type, keys and version when it is allocated
    // (the schema: the TPM version "cannot be changed later on"; the EFI vars are copied
    // from the template `efitype`/`pre-enrolled-keys` name): rewriting the option would
    // only make the config lie about the volume.
    if matches!(rule.role, DiskRole::Efi | DiskRole::Tpm) {
        for (k, v) in changed {
            let observed = live.get(k).or_else(|| part_default(k)).unwrap_or("");
            diff.finding(
                format!("{key}.{k}"),
                v,
                observed,
                FindingKind::RequiresRecreate,
            );
        }
        return;
    }
    // The live form: the volume's own volid and every live part, with the declared options.
    let mut rewritten = live.clone();
    for (k, v) in &changed {
        rewritten.set(k, v);
    }
    diff.write(guest_type, key, rewritten.to_value(Some(bare)), in_effect);
}

fn compare_bind(
    guest_type: GuestType,
    key: &str,
    desired: &str,
    observed: Option<&str>,
    in_effect: &LiveConfig,
    diff: &mut GuestDiff,
) {
    let Some(observed) = observed else {
        diff.write(guest_type, key, desired.to_owned(), in_effect);
        return;
    };
    let d = PropertyString::parse(desired, Some("volume"));
    let o = PropertyString::parse(observed, Some("volume"));
    let (d_path, o_path) = (d.get("volume").unwrap_or(""), o.get("volume").unwrap_or(""));
    if d_path != o_path {
        diff.finding(
            format!("{key}.host-path"),
            d_path,
            o_path,
            FindingKind::UnsafeVolumeChange,
        );
        return;
    }
    let mut options = d.clone();
    options.remove("volume");
    if !parts_match(&options, &o) {
        diff.write(guest_type, key, desired.to_owned(), in_effect);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::guest::render::{Artifacts, render};
    use crate::guest::testing::{
        FULL_LXC, FULL_VM, artifacts, as_pve_would_store, doc, manifest, rendered,
    };
    use crate::manifest::ByteSize;
    use crate::resource::{Kind, ResourceId};

    fn reference() -> RenderedConfig {
        let docs = crate::guest::render::tests::reference_docs();
        let manifest = manifest(&docs);
        let vm = manifest
            .get(&ResourceId::new(Kind::Vm, "ci-vm"))
            .expect("declared");
        render(vm, &Artifacts::from_manifest(&manifest)).expect("a guest")
    }

    /// The reference VM as a live PVE 9.2 reports it after create, import and resize.
    fn reference_live() -> serde_json::Value {
        json!({"data": {
            "agent": "1", "boot": "order=scsi0;ide2;net0", "ciuser": "debian", "cores": 2,
            "cpu": "host", "digest": "5e1f0000000000000000000000000000000000aa",
            "ide2": "local-lvm:vm-9100-cloudinit,media=cdrom",
            "ipconfig0": "ip=10.0.0.50/24,gw=10.0.0.1", "memory": 2048,
            "meta": "creation-qemu=9.2.0,ctime=1764400000", "name": "ci-vm",
            "nameserver": "10.0.0.1 10.0.0.2", "net0": "virtio=BC:24:11:3A:5F:01,bridge=vmbr0",
            "scsi0": "local-lvm:vm-9100-disk-0,size=8G", "scsihw": "virtio-scsi-single",
            "searchdomain": "lab.example example",
            "smbios1": "uuid=0b6f3c2e-1111-4222-8333-944455556666",
            "sshkeys": "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIKey1%20ops%40example%0Assh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIKey2%20ci%2Bbot%40example",
            "tags": "proxops", "vmgenid": "7d1c0000-2222-4333-8444-955566667777"
        }})
    }

    fn live_with(
        guest_type: GuestType,
        base: serde_json::Value,
        changes: &[(&str, Option<&str>)],
    ) -> LiveConfig {
        let mut base = base;
        let data = base["data"].as_object_mut().expect("object");
        for (k, v) in changes {
            match v {
                Some(v) => data.insert((*k).to_owned(), json!(v)),
                None => data.remove(*k),
            };
        }
        LiveConfig::from_json(guest_type, &base).expect("object")
    }

    fn diff_against(r: &RenderedConfig, changes: &[(&str, Option<&str>)]) -> GuestDiff {
        let live = live_with(GuestType::Qemu, reference_live(), changes);
        compare(r, &live, &CompareContext::default())
    }

    /// A VM with `spec_tail`, and an 8 GiB `scsi0` unless it declares disks or a clone.
    fn vm(spec_tail: &str) -> RenderedConfig {
        let disk = if spec_tail.contains("disks:") || spec_tail.contains("clone:") {
            ""
        } else {
            "  disks: [{storage: local-lvm, size: 8GiB}]\n"
        };
        let spec = format!(
            "  node: pve1\n  vmid: 100\n  memory: 1GiB\n  cpu: {{type: host, cores: 1}}\n{disk}{spec_tail}"
        );
        rendered(&doc("VM", "web", &spec), &artifacts())
    }

    fn compare_qemu(r: &RenderedConfig, live: &[(&str, &str)]) -> GuestDiff {
        let live = LiveConfig::from_pairs(GuestType::Qemu, live.iter().copied());
        compare(r, &live, &CompareContext::default())
    }

    fn set(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn only_create_forms_allocate_a_volume() {
        let q = GuestType::Qemu;
        assert!(allocates_volume(
            q,
            "scsi1",
            "local-lvm:0,import-from=local:import/a.qcow2"
        ));
        assert!(allocates_volume(q, "scsi1", "local-lvm:32,discard=on"));
        assert!(allocates_volume(q, "ide2", "local-lvm:cloudinit"));
        assert!(allocates_volume(q, "efidisk0", "local-lvm:1,efitype=4m"));
        assert!(!allocates_volume(
            q,
            "scsi0",
            "local-lvm:vm-100-disk-0,size=32G"
        ));
        assert!(!allocates_volume(
            q,
            "ide2",
            "local:iso/debian.iso,media=cdrom"
        ));
        assert!(!allocates_volume(q, "ide2", "none,media=cdrom"));
        assert!(!allocates_volume(q, "memory", "4096"));
        assert!(allocates_volume(
            GuestType::Lxc,
            "mp0",
            "local-lvm:8,mp=/srv"
        ));
        assert!(!allocates_volume(
            GuestType::Lxc,
            "mp0",
            "/mnt/data,mp=/srv"
        ));
    }
    #[test]
    fn a_live_config_identical_to_the_render_with_pve_extras_is_no_change() {
        let diff = diff_against(&reference(), &[]);
        assert!(diff.is_empty(), "{diff:#?}");
        assert!(!diff.needs_stop);
    }

    #[test]
    fn the_reference_vm_right_after_import_only_needs_its_disk_grown() {
        let diff = diff_against(
            &reference(),
            &[("scsi0", Some("local-lvm:vm-9100-disk-0,size=3G"))],
        );
        assert!(diff.set.is_empty() && diff.findings.is_empty(), "{diff:#?}");
        assert_eq!(
            diff.resize,
            [Resize {
                slot: "scsi0".into(),
                size: ByteSize::from_mib(8192)
            }]
        );
    }

    #[test]
    fn reordered_and_re_encoded_ssh_keys_are_not_drift() {
        let reordered = "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIKey2%20ci%2bbot%40example%0A\
                         ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey1 ops%40example%0A";
        let diff = diff_against(&reference(), &[("sshkeys", Some(reordered))]);
        assert!(diff.is_empty(), "{diff:#?}");
    }

    #[test]
    fn an_out_of_band_ciuser_and_ssh_key_change_is_corrected_with_only_those_keys() {
        let diff = diff_against(
            &reference(),
            &[
                ("ciuser", Some("root")),
                ("sshkeys", Some("ssh-rsa%20AAAAB3%20intruder")),
            ],
        );
        let r = reference();
        assert_eq!(
            diff.set,
            set(&[
                ("ciuser", "debian"),
                ("sshkeys", r.value("sshkeys").expect("owned")),
            ])
        );
        assert!(diff.delete.is_empty() && diff.findings.is_empty());
        assert!(!diff.needs_stop, "cloud-init data is not stop-required");
    }

    #[test]
    fn a_changed_efi_type_secure_boot_or_tpm_version_requires_a_recreate_not_a_write() {
        let r = vm(
            "  hardware:\n    bios: ovmf\n    efi-disk: {storage: local-lvm, template: 4m, secure-boot: enabled}\n    tpm: {storage: local-lvm, version: v2.0}\n",
        );
        let base = [
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("name", "web"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("bios", "ovmf"),
            ("tags", "proxops"),
        ];
        let matching = [
            (
                "efidisk0",
                "local-lvm:vm-100-disk-1,efitype=4m,pre-enrolled-keys=1,size=528K",
            ),
            ("tpmstate0", "local-lvm:vm-100-disk-2,size=4M,version=v2.0"),
        ];
        let live: Vec<_> = base.iter().chain(matching.iter()).copied().collect();
        assert!(
            compare_qemu(&r, &live).is_empty(),
            "{:#?}",
            compare_qemu(&r, &live)
        );

        let stale = [
            ("efidisk0", "local-lvm:vm-100-disk-1,efitype=2m,size=128K"),
            ("tpmstate0", "local-lvm:vm-100-disk-2,size=4M,version=v1.2"),
        ];
        let live: Vec<_> = base.iter().chain(stale.iter()).copied().collect();
        let diff = compare_qemu(&r, &live);
        assert!(!diff.has_changes(), "{diff:#?}");
        let found: Vec<_> = diff
            .findings
            .iter()
            .map(|f| {
                (
                    f.field.as_str(),
                    f.desired.as_str(),
                    f.observed.as_str(),
                    f.kind,
                )
            })
            .collect();
        assert_eq!(
            found,
            [
                (
                    "efidisk0.efitype",
                    "4m",
                    "2m",
                    FindingKind::RequiresRecreate
                ),
                (
                    "efidisk0.pre-enrolled-keys",
                    "1",
                    "0",
                    FindingKind::RequiresRecreate
                ),
                (
                    "tpmstate0.version",
                    "v2.0",
                    "v1.2",
                    FindingKind::RequiresRecreate
                ),
            ]
        );
    }

    #[test]
    fn tags_compare_as_a_set_whatever_the_separator_or_case() {
        let r = vm("  disks: [{storage: local-lvm, size: 8GiB}]\n  tags: [a, b]\n");
        let live = [
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("name", "web"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
        ];
        for tags in ["a;b;proxops", "proxops,b,a", "B a PROXOPS"] {
            let mut l = live.to_vec();
            l.push(("tags", tags));
            assert!(compare_qemu(&r, &l).is_empty(), "{tags}");
        }
        let mut l = live.to_vec();
        l.push(("tags", "a;b"));
        assert_eq!(compare_qemu(&r, &l).set, set(&[("tags", "a;b;proxops")]));
    }

    #[test]
    fn nameservers_compare_as_sets_and_a_description_ignores_its_trailing_newline() {
        let r = vm(
            "  pve-description: \"web server\"\n  cloud-init-data: {nameservers: [10.0.0.1, 10.0.0.2], search-domains: [a.example]}\n",
        );
        let base = [
            ("name", "web"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("tags", "proxops"),
        ];
        let mut l = base.to_vec();
        l.extend([
            ("nameserver", "10.0.0.2 10.0.0.1"),
            ("searchdomain", "a.example"),
            ("description", "web server\n"),
        ]);
        assert!(compare_qemu(&r, &l).is_empty());
        let mut l = base.to_vec();
        l.extend([
            ("nameserver", "10.0.0.2"),
            ("searchdomain", "a.example"),
            ("description", "web server"),
        ]);
        assert_eq!(
            compare_qemu(&r, &l).set,
            set(&[("nameserver", "10.0.0.1 10.0.0.2")])
        );
    }

    #[test]
    fn a_false_option_is_enforced_and_an_absent_one_is_left_alone() {
        let r = vm("  options: {protection: false, acpi: false}\n");
        let base = [
            ("name", "web"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("tags", "proxops"),
        ];
        // protection defaults to 0 in PVE, acpi to 1.
        let diff = compare_qemu(&r, &base);
        assert_eq!(diff.set, set(&[("acpi", "0")]));
        let mut l = base.to_vec();
        l.extend([
            ("protection", "1"),
            ("acpi", "0"),
            ("onboot", "1"),
            ("agent", "1,type=virtio"),
        ]);
        let diff = compare_qemu(&r, &l);
        assert_eq!(diff.set, set(&[("protection", "0")]));
        assert!(diff.delete.is_empty());
    }

    #[test]
    fn the_guest_agent_reads_its_enabled_flag_from_a_property_string() {
        let r = vm("  options: {agent: true}\n");
        let base = [
            ("name", "web"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("tags", "proxops"),
        ];
        for agent in ["1", "1,type=virtio", "enabled=1,fstrim_cloned_disks=1"] {
            let mut l = base.to_vec();
            l.push(("agent", agent));
            assert!(compare_qemu(&r, &l).is_empty(), "{agent}");
        }
    }

    #[test]
    fn a_pool_change_on_a_live_disk_is_a_finding_and_nothing_is_set() {
        let r = vm("  disks: [{storage: ceph, size: 64GiB, iothread: true}]\n");
        let diff = compare_qemu(
            &r,
            &[
                ("scsi0", "local-lvm:vm-100-disk-0,size=32G"),
                ("name", "web"),
                ("memory", "1024"),
                ("cores", "1"),
                ("cpu", "host"),
                ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
                ("tags", "proxops"),
            ],
        );
        assert!(diff.set.is_empty() && diff.resize.is_empty(), "{diff:#?}");
        assert_eq!(
            diff.findings,
            [Finding {
                field: "scsi0.storage".into(),
                desired: "ceph".into(),
                observed: "local-lvm".into(),
                kind: FindingKind::UnsafeVolumeChange,
            }]
        );
    }

    #[test]
    fn a_larger_declared_size_grows_the_disk_and_a_smaller_one_is_a_finding() {
        let base = [
            ("name", "web"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("tags", "proxops"),
        ];
        let r = vm("  disks: [{storage: local-lvm, size: 64GiB}]\n");
        let mut l = base.to_vec();
        l.push(("scsi0", "local-lvm:vm-100-disk-0,size=32G"));
        let diff = compare_qemu(&r, &l);
        assert_eq!(
            diff.resize,
            [Resize {
                slot: "scsi0".into(),
                size: ByteSize::from_mib(65536)
            }]
        );
        assert!(diff.set.is_empty() && diff.findings.is_empty());

        let r = vm("  disks: [{storage: local-lvm, size: 16GiB}]\n");
        let diff = compare_qemu(&r, &l);
        assert!(diff.set.is_empty() && diff.resize.is_empty());
        assert_eq!(diff.findings[0].field, "scsi0.size");
        assert_eq!(diff.findings[0].kind, FindingKind::UnsafeVolumeChange);
        assert_eq!(
            (
                diff.findings[0].desired.as_str(),
                diff.findings[0].observed.as_str()
            ),
            ("16GiB", "32G")
        );
    }

    #[test]
    fn changed_disk_options_are_written_in_the_live_form_keeping_the_volid_and_size() {
        let r = vm(
            "  disks: [{storage: local-lvm, size: 32GiB, discard: on, iothread: false, ssd: true}]\n",
        );
        let base = [
            ("name", "web"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("tags", "proxops"),
        ];
        let mut l = base.to_vec();
        l.push(("scsi0", "local-lvm:vm-100-disk-0,backup=0,size=32G"));
        let diff = compare_qemu(&r, &l);
        assert_eq!(
            diff.set,
            set(&[(
                "scsi0",
                "local-lvm:vm-100-disk-0,backup=0,size=32G,discard=on,ssd=1"
            )])
        );
        // qemu-server `vmconfig_update_disk` skips (holds) a discard or ssd change.
        assert_eq!(diff.stop_keys.iter().collect::<Vec<_>>(), ["scsi0"]);

        // iothread=0 is PVE's default and left out of its report: no drift.
        let mut l = base.to_vec();
        l.push(("scsi0", "local-lvm:vm-100-disk-0,discard=on,size=32G,ssd=1"));
        assert!(compare_qemu(&r, &l).is_empty());

        let r = vm("  disks: [{storage: local-lvm, size: 32GiB, iothread: true}]\n");
        let diff = compare_qemu(&r, &l);
        assert_eq!(
            diff.set["scsi0"],
            "local-lvm:vm-100-disk-0,discard=on,size=32G,ssd=1,iothread=1"
        );
        assert!(diff.needs_stop);
        assert_eq!(diff.stop_keys.iter().collect::<Vec<_>>(), ["scsi0"]);
    }

    #[test]
    fn a_declared_disk_on_an_empty_slot_is_created_and_an_image_is_grown_after_import() {
        let r = vm(
            "  disks:\n    - {storage: local-lvm, size: 8GiB}\n    - {storage: local-lvm, image: img, size: 20GiB}\n",
        );
        let base = [
            ("name", "web"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("tags", "proxops"),
            ("scsi0", "none,media=cdrom"),
        ];
        let diff = compare_qemu(&r, &base);
        assert_eq!(
            diff.set,
            set(&[
                ("scsi0", "local-lvm:8"),
                ("scsi1", "local-lvm:0,import-from=local:import/img.qcow2")
            ])
        );
        assert_eq!(
            diff.resize,
            [Resize {
                slot: "scsi1".into(),
                size: ByteSize::from_mib(20480)
            }]
        );
    }

    #[test]
    fn pve_filled_keys_and_generated_macs_are_ignored_but_a_pinned_mac_is_compared() {
        let r = vm("  networks: [{bridge: vmbr0}, {bridge: vmbr1, mac: 'bc:24:11:aa:bb:cc'}]\n");
        let base = [
            ("name", "web"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("tags", "proxops"),
            ("smbios1", "uuid=1"),
            ("vmgenid", "x"),
            ("meta", "creation-qemu=9.2.0"),
            ("digest", "d"),
            ("ostype", "l26"),
        ];
        let mut l = base.to_vec();
        l.extend([
            ("net0", "virtio=BC:24:11:12:34:56,bridge=vmbr0,tag=5"),
            ("net1", "virtio=BC:24:11:AA:BB:CC,bridge=vmbr1"),
        ]);
        assert!(
            compare_qemu(&r, &l).is_empty(),
            "an undeclared tag= is not owned"
        );
        let mut l = base.to_vec();
        l.extend([
            ("net0", "virtio=BC:24:11:12:34:56,bridge=vmbr0"),
            ("net1", "virtio=BC:24:11:00:00:01,bridge=vmbr1"),
        ]);
        let diff = compare_qemu(&r, &l);
        assert_eq!(
            diff.set,
            set(&[("net1", "virtio=BC:24:11:AA:BB:CC,bridge=vmbr1")])
        );
        // A new MAC means unplug and replug: PVE does it live with the default `network`
        // hotplug feature (qemu-server `vmconfig_update_net`), not with `hotplug: 0`.
        assert!(!diff.needs_stop, "{diff:?}");
        l.push(("hotplug", "0"));
        let diff = compare_qemu(&r, &l);
        assert_eq!(diff.stop_keys.iter().collect::<Vec<_>>(), ["net1"]);
    }

    #[test]
    fn a_switched_option_keeps_its_other_parts_and_a_new_address_drops_the_old_gateway() {
        let r = vm("  options: {agent: true}\n");
        let mut l = vec![
            ("name", "web"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("tags", "proxops"),
        ];
        l.push(("agent", "0,type=isa"));
        assert_eq!(compare_qemu(&r, &l).set, set(&[("agent", "1,type=isa")]));

        let yaml = FULL_LXC.replace(
            "ip: 10.0.0.20/24, gw: 10.0.0.1, slot: net0",
            "ip: dhcp, slot: net0",
        );
        let r = rendered(&yaml, &artifacts());
        let live = LiveConfig::from_pairs(
            GuestType::Lxc,
            [(
                "net0",
                "name=eth0,bridge=vmbr0,firewall=1,gw=10.0.0.1,hwaddr=BC:24:11:00:00:02,\
                 ip=10.0.0.20/24,rate=50,tag=20,type=veth",
            )],
        );
        let diff = compare(&r, &live, &CompareContext::default());
        assert_eq!(
            diff.set["net0"],
            "name=eth0,bridge=vmbr0,firewall=1,hwaddr=BC:24:11:00:00:02,ip=dhcp,rate=50,tag=20,\
             type=veth"
        );
    }

    #[test]
    fn a_cloud_init_drive_added_to_a_running_vm_needs_a_stop_but_a_scsi_disk_does_not() {
        let r =
            vm("  disks: [{storage: local-lvm, size: 8GiB}, {storage: local-lvm, size: 4GiB}]\n");
        let l = [
            ("name", "web"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("tags", "proxops"),
        ];
        let diff = compare_qemu(&r, &l);
        assert_eq!(diff.set, set(&[("scsi1", "local-lvm:4")]));
        assert!(!diff.needs_stop);
        let r = vm("  hardware: {cloud-init: {enabled: true, storage: local-lvm}}\n");
        let diff = compare_qemu(&r, &l);
        assert_eq!(diff.set, set(&[("ide2", "local-lvm:cloudinit")]));
        assert!(diff.needs_stop);
    }

    #[test]
    fn a_changed_nic_keeps_its_generated_mac_and_undeclared_parts() {
        let r = vm("  networks: [{bridge: vmbr1, firewall: true}]\n");
        let diff = compare_qemu(
            &r,
            &[
                ("name", "web"),
                ("memory", "1024"),
                ("cores", "1"),
                ("cpu", "host"),
                ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
                ("tags", "proxops"),
                ("net0", "virtio=BC:24:11:12:34:56,bridge=vmbr0,queues=4"),
            ],
        );
        assert_eq!(
            diff.set,
            set(&[(
                "net0",
                "virtio=BC:24:11:12:34:56,bridge=vmbr1,queues=4,firewall=1"
            )])
        );
    }

    #[test]
    fn live_only_disk_nic_and_pci_slots_are_findings_never_deletions() {
        let r = vm("  disks: [{storage: local-lvm, size: 8GiB}]\n");
        let diff = compare_qemu(
            &r,
            &[
                ("name", "web"),
                ("memory", "1024"),
                ("cores", "1"),
                ("cpu", "host"),
                ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
                ("tags", "proxops"),
                ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
                ("scsi1", "local-lvm:vm-100-disk-1,size=4G"),
                ("ide2", "none,media=cdrom"),
                ("ide0", "local-lvm:vm-100-cloudinit,media=cdrom"),
                ("net0", "virtio=BC:24:11:00:00:01,bridge=vmbr0"),
                ("hostpci0", "0000:01:00.0"),
                ("unused0", "local-lvm:vm-100-disk-9"),
            ],
        );
        let fields: Vec<(&str, FindingKind)> = diff
            .findings
            .iter()
            .map(|f| (f.field.as_str(), f.kind))
            .collect();
        assert_eq!(
            fields,
            [
                ("hostpci0", FindingKind::LiveOnlySlot),
                ("net0", FindingKind::LiveOnlySlot),
                ("scsi1", FindingKind::LiveOnlySlot)
            ]
        );
        assert!(diff.set.is_empty() && diff.delete.is_empty());
    }

    #[test]
    fn a_clone_deletes_inherited_cloud_init_identity_it_does_not_own_and_has_no_live_only_disks() {
        let r = vm(
            "  clone: golden\n  networks: [{bridge: vmbr0}]\n  cloud-init-data:\n    ci-user: ops\n    ssh-keys: ['*']\n    ipconfigs: [{nic: 0, ip: dhcp}]\n",
        );
        let live = LiveConfig::from_pairs(
            GuestType::Qemu,
            [
                ("name", "web"),
                ("memory", "1024"),
                ("cores", "1"),
                ("cpu", "host"),
                ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
                ("tags", "proxops"),
                ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
                ("net0", "virtio=BC:24:11:00:00:07,bridge=vmbr0"),
                ("ide2", "local-lvm:vm-100-cloudinit,media=cdrom"),
                ("ciuser", "template-user"),
                ("sshkeys", "ssh-rsa%20AAAA"),
                ("cipassword", "**********"),
                ("nameserver", "1.1.1.1"),
                ("searchdomain", "t.example"),
                ("cicustom", "user=local:snippets/u.yaml"),
                ("ipconfig0", "ip=192.0.2.9/24,gw=192.0.2.1"),
                ("ipconfig1", "ip=dhcp"),
            ],
        );
        let diff = compare(&r, &live, &CompareContext::default());
        assert_eq!(
            diff.set,
            set(&[("ciuser", "ops"), ("ipconfig0", "ip=dhcp")])
        );
        assert_eq!(
            diff.delete.iter().map(String::as_str).collect::<Vec<_>>(),
            [
                "cicustom",
                "cipassword",
                "ipconfig1",
                "nameserver",
                "searchdomain"
            ]
        );
        assert!(diff.findings.is_empty(), "{:#?}", diff.findings);
        assert!(diff.set.keys().all(|k| !diff.delete.contains(k)));
    }

    #[test]
    fn set_and_delete_never_share_a_key() {
        let r = vm("  clone: golden\n  cloud-init-data: {ci-user: ops, nameservers: [10.0.0.1]}\n");
        let live = LiveConfig::from_pairs(
            GuestType::Qemu,
            [("ciuser", "x"), ("nameserver", "9.9.9.9"), ("sshkeys", "a")],
        );
        let diff = compare(&r, &live, &CompareContext::default());
        assert!(diff.set.contains_key("ciuser") && diff.set.contains_key("nameserver"));
        assert_eq!(diff.delete.iter().collect::<Vec<_>>(), ["sshkeys"]);
        assert!(diff.set.keys().all(|k| !diff.delete.contains(k)));
    }

    #[test]
    fn an_lxc_as_pve_reports_it_is_no_change_and_unprivileged_requires_a_recreate() {
        let r = rendered(FULL_LXC, &artifacts());
        let live = LiveConfig::from_json(GuestType::Lxc, &json!({"data": {
            "arch": "amd64", "cmode": "tty", "console": 1, "cores": 2, "description": "database\n",
            "digest": "ab", "features": "nesting=1", "hostname": "db-1.lab", "memory": 1024,
            "mp0": "local-lvm:vm-201-disk-1,acl=1,backup=1,mountoptions=noatime,mp=/var/lib/postgresql,quota=0,ro=0,shared=0,size=16G",
            "mp1": "/tank/backups,mp=/backups,ro=1",
            "net0": "name=eth0,bridge=vmbr0,firewall=1,gw=10.0.0.1,hwaddr=bc:24:11:00:00:02,ip=10.0.0.20/24,rate=50,tag=20,type=veth",
            "net1": "name=net1,bridge=vmbr1,hwaddr=BC:24:11:7F:00:01,ip=dhcp,type=veth",
            "nameserver": "10.0.0.1", "onboot": 1, "ostype": "debian", "protection": 0,
            "rootfs": "local-lvm:vm-201-disk-0,size=8G", "searchdomain": "lab.example",
            "startup": "order=2", "swap": 512, "tags": "db;proxops", "unprivileged": 1
        }}))
        .expect("object");
        let diff = compare(&r, &live, &CompareContext::default());
        assert!(diff.is_empty(), "{diff:#?}");

        let live = live_with(
            GuestType::Lxc,
            json!({"data": {"unprivileged": 0, "features": "keyctl=1",
            "net0": "name=eth1,bridge=vmbr0,hwaddr=BC:24:11:00:00:02,type=veth"}}),
            &[],
        );
        let diff = compare(&r, &live, &CompareContext::default());
        assert_eq!(
            diff.set["features"], "keyctl=1,nesting=1",
            "flags it does not own are kept"
        );
        assert!(diff.findings.iter().any(|f| f.field == "features.keyctl"
            && (f.desired.as_str(), f.observed.as_str()) == ("0", "1")
            && f.kind == FindingKind::Drift));
        assert!(diff.set["net0"].starts_with("name=eth0,"));
        assert!(diff.needs_stop);
        assert!(
            diff.findings
                .iter()
                .any(|f| f.field == "unprivileged" && f.kind == FindingKind::RequiresRecreate)
        );
        assert!(!diff.set.contains_key("unprivileged"));
    }

    #[test]
    fn a_bind_mount_whose_host_path_changed_is_a_finding() {
        let r = rendered(FULL_LXC, &artifacts());
        let live = LiveConfig::from_pairs(
            GuestType::Lxc,
            [
                ("mp1", "/srv/other,mp=/backups,ro=1"),
                ("mp5", "local-lvm:vm-201-disk-5,mp=/x,size=1G"),
            ],
        );
        let diff = compare(&r, &live, &CompareContext::default());
        assert!(!diff.set.contains_key("mp1"));
        assert!(
            diff.findings
                .iter()
                .any(|f| f.field == "mp1.host-path" && f.kind == FindingKind::UnsafeVolumeChange)
        );
        assert!(
            diff.findings
                .iter()
                .any(|f| f.field == "mp5" && f.kind == FindingKind::LiveOnlySlot)
        );
    }

    #[test]
    fn a_versioned_machine_satisfies_its_type_and_a_cdrom_never_replaces_a_disk() {
        let r = vm("  hardware: {machine: q35, cdrom: {iso: netinst}}\n");
        let base = [
            ("name", "web"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("tags", "proxops"),
        ];
        let mut l = base.to_vec();
        l.extend([
            ("machine", "pc-q35-9.2+pve1,viommu=virtio"),
            (
                "ide2",
                "local:iso/debian-13-netinst.iso,media=cdrom,size=600M",
            ),
        ]);
        assert!(compare_qemu(&r, &l).is_empty());
        let mut l = base.to_vec();
        l.extend([
            ("machine", "pc-i440fx-9.2"),
            ("ide2", "local-lvm:vm-100-disk-3,size=2G"),
        ]);
        let diff = compare_qemu(&r, &l);
        assert_eq!(diff.set, set(&[("machine", "q35")]));
        assert_eq!(diff.findings.len(), 1);
        assert_eq!(
            (diff.findings[0].field.as_str(), diff.findings[0].kind),
            ("ide2", FindingKind::UnsafeVolumeChange)
        );
    }

    #[test]
    fn a_bare_dhcp_ipconfig_and_an_empty_description_match_what_pve_reports() {
        let r = vm("  pve-description: ''\n  cloud-init-data: {ipconfigs: [{nic: 0, ip: dhcp}]}\n");
        let diff = compare_qemu(
            &r,
            &[
                ("name", "web"),
                ("memory", "1024"),
                ("cores", "1"),
                ("cpu", "host"),
                ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
                ("tags", "proxops"),
                ("ipconfig0", "dhcp"),
            ],
        );
        assert!(diff.is_empty(), "{diff:#?}");
    }

    #[test]
    fn a_cpu_change_needs_a_stop_but_a_tag_change_does_not() {
        let r = vm("  tags: [web]\n");
        let diff = compare_qemu(
            &r,
            &[
                ("name", "web"),
                ("memory", "1024"),
                ("cores", "1"),
                ("cpu", "host"),
                ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
                ("tags", "proxops"),
            ],
        );
        assert_eq!(diff.set, set(&[("tags", "proxops;web")]));
        assert!(!diff.needs_stop);
        let diff = compare_qemu(
            &r,
            &[
                ("name", "web"),
                ("memory", "1024"),
                ("cores", "1"),
                ("cpu", "kvm64,flags=+aes"),
                ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
                ("tags", "proxops;web"),
            ],
        );
        assert_eq!(diff.set, set(&[("cpu", "host,flags=+aes")]));
        assert!(diff.needs_stop);
    }

    fn in_effect(guest_type: GuestType, pairs: &[(&str, &str)]) -> LiveConfig {
        LiveConfig::from_pairs(guest_type, pairs.iter().copied())
    }

    #[test]
    fn a_running_container_takes_cores_memory_swap_cpu_limits_nics_and_new_mount_points_live() {
        let ct = in_effect(
            GuestType::Lxc,
            &[
                ("memory", "512"),
                ("cores", "1"),
                ("rootfs", "local-lvm:vm-200-disk-0,size=4G"),
                ("mp0", "local-lvm:vm-200-disk-1,mp=/srv,size=1G"),
                ("net0", "name=eth0,bridge=vmbr0,ip=dhcp"),
            ],
        );
        for (key, value) in [
            ("cores", "2"),
            ("memory", "1024"),
            ("swap", "512"),
            ("cpulimit", "2"),
            ("cpuunits", "200"),
            ("net0", "name=eth0,bridge=vmbr1,ip=dhcp"),
            ("net1", "name=eth1,bridge=vmbr0"),
            ("mp1", "local-lvm:2,mp=/data"),
            ("dev0", "/dev/ttyUSB0"),
            ("hostname", "ct"),
            ("onboot", "1"),
            ("tags", "proxops"),
        ] {
            assert!(
                !held_until_restart(GuestType::Lxc, key, value, &ct),
                "{key}"
            );
        }
        for (key, value) in [
            ("mp0", "local-lvm:vm-200-disk-1,mp=/srv,backup=0,size=1G"),
            (
                "rootfs",
                "local-lvm:vm-200-disk-0,size=4G,mountoptions=noatime",
            ),
            ("features", "nesting=1"),
            ("arch", "arm64"),
            ("console", "0"),
            ("nameserver", "10.0.0.1"),
        ] {
            assert!(held_until_restart(GuestType::Lxc, key, value, &ct), "{key}");
        }
    }

    #[test]
    fn a_running_vm_holds_cores_and_memory_unless_its_hotplug_features_and_numa_allow_them() {
        let base = [
            ("memory", "2048"),
            ("cores", "2"),
            ("ostype", "l26"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ("ide0", "local-lvm:vm-100-disk-1,size=1G"),
            ("ide2", "local:iso/d.iso,media=cdrom"),
            ("net0", "virtio=BC:24:11:00:00:01,bridge=vmbr0"),
        ];
        let default = in_effect(GuestType::Qemu, &base);
        let held = |vm: &LiveConfig, key: &str, value: &str| {
            held_until_restart(GuestType::Qemu, key, value, vm)
        };
        // Never live: CPU topology and type, machine, BIOS, hostpci, EFI/TPM state.
        for (key, value) in [
            ("cores", "4"),
            ("sockets", "2"),
            ("cpu", "host"),
            ("machine", "q35"),
            ("bios", "ovmf"),
            ("hostpci0", "0000:01:00.0"),
            ("efidisk0", "local-lvm:1,efitype=4m"),
            ("scsihw", "virtio-scsi-single"),
        ] {
            assert!(held(&default, key, value), "{key}");
        }
        // The default `network,disk,usb`: memory and vcpus are held, NICs and scsi disks not.
        assert!(held(&default, "memory", "4096"));
        assert!(held(&default, "vcpus", "1"));
        assert!(!held(
            &default,
            "net0",
            "virtio=BC:24:11:00:00:01,bridge=vmbr1,tag=5"
        ));
        assert!(!held(
            &default,
            "net0",
            "e1000=BC:24:11:00:00:01,bridge=vmbr0"
        ));
        assert!(!held(&default, "net1", "virtio,bridge=vmbr0"));
        assert!(!held(&default, "scsi1", "local-lvm:4"));
        assert!(held(&default, "sata1", "local-lvm:4"), "no sata hotplug");
        assert!(!held(&default, "ide2", "local:iso/other.iso,media=cdrom"));
        assert!(!held(
            &default,
            "scsi0",
            "local-lvm:vm-100-disk-0,size=8G,mbps_rd=100"
        ));
        assert!(held(
            &default,
            "scsi0",
            "local-lvm:vm-100-disk-0,size=8G,iothread=1"
        ));
        assert!(!held(&default, "usb0", "host=spice"));
        assert!(!held(&default, "cpuunits", "200"));
        assert!(!held(&default, "ciuser", "ops"));
        assert!(!held(&default, "ipconfig0", "ip=dhcp"));
        assert!(!held(&default, "balloon", "1024"));
        assert!(
            held(&default, "balloon", "0"),
            "switching the balloon device off"
        );
        // memory needs the feature and NUMA; cpu makes vcpus live.
        let mut with = base.to_vec();
        with.push(("hotplug", "network,disk,memory,cpu"));
        assert!(
            held(&in_effect(GuestType::Qemu, &with), "memory", "4096"),
            "no numa"
        );
        with.push(("numa", "1"));
        let hot = in_effect(GuestType::Qemu, &with);
        assert!(!held(&hot, "memory", "4096"));
        assert!(!held(&hot, "vcpus", "1"));
        assert!(held(&hot, "cores", "4"), "cores are never hot-plugged");
        assert!(held(&hot, "usb0", "host=spice"), "usb is not in this list");
        // hotplug 0: a new NIC or disk waits for a restart too.
        let mut off = base.to_vec();
        off.push(("hotplug", "0"));
        let off = in_effect(GuestType::Qemu, &off);
        assert!(held(&off, "net1", "virtio,bridge=vmbr0"));
        assert!(held(&off, "scsi1", "local-lvm:4"));
        assert!(
            !held(&off, "net0", "virtio=BC:24:11:00:00:01,bridge=vmbr1"),
            "a bridge change is live"
        );
    }

    #[test]
    fn a_vm_pve_created_without_memory_cores_or_cpu_matches_a_manifest_of_pves_defaults() {
        let r = rendered(
            &doc(
                "VM",
                "web",
                "  node: pve1\n  vmid: 100\n  memory: 512MiB\n  cpu: {type: kvm64, cores: 1}\n  disks: [{storage: local-lvm, size: 8GiB}]\n",
            ),
            &artifacts(),
        );
        let live = [
            ("name", "web"),
            ("tags", "proxops"),
            ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
        ];
        let diff = compare_qemu(&r, &live);
        assert!(diff.set.is_empty(), "{diff:#?}");
        // Any other value is still written.
        let r = rendered(
            &doc(
                "VM",
                "web",
                "  node: pve1\n  vmid: 100\n  memory: 1GiB\n  cpu: {type: host, cores: 2}\n  disks: [{storage: local-lvm, size: 8GiB}]\n",
            ),
            &artifacts(),
        );
        let diff = compare_qemu(&r, &live);
        assert_eq!(
            diff.set.keys().collect::<Vec<_>>(),
            ["cores", "cpu", "memory"]
        );
    }

    #[test]
    fn the_full_vm_as_pve_would_store_it_is_no_change() {
        let r = rendered(FULL_VM, &artifacts());
        let diff = compare(&r, &as_pve_would_store(&r, 101), &CompareContext::default());
        assert!(diff.is_empty(), "{diff:#?}");
        let r = rendered(FULL_LXC, &artifacts());
        let diff = compare(&r, &as_pve_would_store(&r, 201), &CompareContext::default());
        assert!(diff.is_empty(), "{diff:#?}");
    }

    /// A random valid VM manifest, built from choices so that it always validates.
    fn vm_yaml() -> impl Strategy<Value = String> {
        let tri = || prop::option::of(any::<bool>());
        let disk = (
            prop::sample::select(vec!["local-lvm", "ceph_pool"]),
            prop::sample::select(vec!["512MiB", "1GiB", "1536MiB", "32GiB", "100G"]),
            tri(),
            prop::option::of(prop::sample::select(vec!["on", "ignore"])),
            tri(),
            prop::option::of(prop::sample::select(vec!["native", "threads", "io_uring"])),
            prop::option::of(prop::sample::select(vec!["", "8GiB", "40GiB"])),
        );
        let nic = (
            prop::sample::select(vec!["virtio", "e1000"]),
            prop::sample::select(vec!["vmbr0", "vmbr1"]),
            any::<bool>(),
            prop::option::of(1u16..4095),
            prop::option::of(1u32..1000),
            tri(),
        );
        let keys = prop::sample::subsequence(
            vec![
                "ssh-ed25519 AAAAC3Nza1 a@b",
                "ssh-rsa AAAAB3+/= c@d",
                "ecdsa-sha2-nistp256 AAAAE2V e@f",
            ],
            0..=3,
        );
        (
            (prop::sample::select(vec![512u32, 1024, 2048, 8192]), 1u32..9, prop::sample::select(vec!["host", "kvm64", "x86-64-v2-AES"]), tri()),
            prop::collection::vec(disk, 1..4),
            prop::collection::vec(nic, 0..3),
            (tri(), tri(), tri(), tri(), tri(), prop::option::of(1u32..3), any::<bool>(), any::<bool>(), any::<bool>()),
            (prop::option::of("[a-z]{1,8}"), keys, prop::sample::subsequence(vec!["10.0.0.1", "10.0.0.2", "2001:db8::1"], 0..=3), any::<bool>()),
            (prop::sample::subsequence(vec!["web", "prod", "db"], 0..=3), prop::option::of("[a-z ]{1,12}"), any::<bool>()),
        )
            .prop_map(|((mem, cores, cpu, hidden), disks, nics, (onboot, protection, agent, acpi, numa, sockets, ci, efi, tpm), (user, keys, ns, dhcp), (tags, description, extra))| {
                let b = |v: Option<bool>| v.map(|b| b.to_string());
                let mut s = format!("  node: pve1\n  vmid: 100\n  memory: {mem}MiB\n  cpu: {{type: {cpu}, cores: {cores}}}\n  disks:\n");
                for (i, (storage, size, iothread, discard, ssd, aio, image)) in disks.iter().enumerate() {
                    let mut d = format!("storage: {storage}, interface: scsi{i}");
                    match image {
                        Some("") => d.push_str(", image: img"),
                        Some(grow) => d.push_str(&format!(", image: img, size: {grow}")),
                        None => d.push_str(&format!(", size: {size}")),
                    }
                    if let Some(v) = b(*iothread) { d.push_str(&format!(", iothread: {v}")); }
                    if let Some(v) = discard { d.push_str(&format!(", discard: {v}")); }
                    if let Some(v) = b(*ssd) { d.push_str(&format!(", ssd: {v}")); }
                    if let Some(v) = aio { d.push_str(&format!(", aio: {v}")); }
                    s.push_str(&format!("    - {{{d}}}\n"));
                }
                if !nics.is_empty() {
                    s.push_str("  networks:\n");
                    for (i, (model, bridge, mac, vlan, rate, firewall)) in nics.iter().enumerate() {
                        let mut n = format!("model: {model}, bridge: {bridge}");
                        if *mac { n.push_str(&format!(", mac: 'bc:24:11:0a:0b:{i:02x}'")); }
                        if let Some(v) = vlan { n.push_str(&format!(", vlan: {v}")); }
                        if let Some(v) = rate { n.push_str(&format!(", rate-limit: {v}")); }
                        if let Some(v) = b(*firewall) { n.push_str(&format!(", firewall: {v}")); }
                        s.push_str(&format!("    - {{{n}}}\n"));
                    }
                }
                s.push_str("  hardware:\n    machine: q35\n");
                if let Some(v) = sockets { s.push_str(&format!("    sockets: {v}\n")); }
                if let Some(v) = b(numa) { s.push_str(&format!("    numa: {v}\n")); }
                if ci { s.push_str("    cloud-init: {enabled: true, storage: local-lvm}\n"); }
                if efi { s.push_str("    bios: ovmf\n    efi-disk: {storage: local-lvm, template: 4m, secure-boot: enabled}\n"); }
                if tpm { s.push_str("    tpm: {storage: local-lvm}\n"); }
                s.push_str("  options:\n    startup: order=3\n");
                for (k, v) in [("onboot", onboot), ("protection", protection), ("agent", agent), ("acpi", acpi), ("hidden", hidden)] {
                    if let Some(v) = b(v) { s.push_str(&format!("    {k}: {v}\n")); }
                }
                s.push_str("  cloud-init-data:\n");
                if let Some(u) = user { s.push_str(&format!("    ci-user: {u}\n")); }
                if !keys.is_empty() { s.push_str(&format!("    ssh-keys: [{}]\n", keys.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", "))); }
                if !ns.is_empty() { s.push_str(&format!("    nameservers: [{}]\n", ns.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", "))); }
                if dhcp { s.push_str("    ipconfigs: [{nic: 0, ip: dhcp}]\n"); } else { s.push_str("    ipconfigs: [{nic: 0, ip: 10.1.0.5/24, gateway: 10.1.0.1}]\n"); }
                s.push_str(&format!("  tags: [{}]\n", tags.join(", ")));
                if let Some(d) = description { s.push_str(&format!("  pve-description: '{d}'\n")); }
                if extra { s.push_str("  extra: {balloon: 0, args: '-no-hpet'}\n"); }
                doc("VM", "random", &s)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn a_rendered_vm_as_pve_would_store_it_compares_as_no_change(yaml in vm_yaml()) {
            let r = rendered(&yaml, &artifacts());
            let live = as_pve_would_store(&r, 100);
            let diff = compare(&r, &live, &CompareContext::default());
            prop_assert!(diff.is_empty(), "{yaml}\n{diff:#?}\n{live:#?}");
        }

        #[test]
        fn an_out_of_band_change_to_one_owned_key_writes_only_that_key(
            yaml in vm_yaml(),
            pick in any::<prop::sample::Index>(),
        ) {
            let r = rendered(&yaml, &artifacts());
            let stored = as_pve_would_store(&r, 100);
            // Keys whose value is plain text or a set; volumes and NICs have their own tests.
            let plain: Vec<&String> = r.owned.iter()
                .filter(|(_, o)| matches!(o.rule, Rule::Scalar | Rule::Set { .. } | Rule::Description))
                .map(|(k, _)| k)
                .collect();
            let key = plain[pick.index(plain.len())];
            let changed = stored.entries().map(|(k, e)| {
                let raw = if k == key { format!("{}x", e.raw.trim_end()) } else { e.raw.clone() };
                (k.to_owned(), raw)
            });
            let live = LiveConfig::from_pairs(GuestType::Qemu, changed);
            let diff = compare(&r, &live, &CompareContext::default());
            prop_assert_eq!(diff.set.keys().collect::<Vec<_>>(), [key]);
            prop_assert!(diff.delete.is_empty() && diff.findings.is_empty());
        }
    }

    #[test]
    fn an_undeclared_pool_is_never_drift() {
        assert_eq!(compare_pool(None, None), None);
        assert_eq!(compare_pool(None, Some("prod")), None);
    }

    #[test]
    fn a_guest_in_its_declared_pool_is_no_drift() {
        assert_eq!(compare_pool(Some("prod"), Some("prod")), None);
    }

    #[test]
    fn a_guest_in_another_pool_or_in_none_is_pool_drift() {
        assert_eq!(
            compare_pool(Some("prod"), Some("lab")),
            Some(PoolDrift {
                desired: "prod".to_owned(),
                observed: Some("lab".to_owned())
            })
        );
        assert_eq!(
            compare_pool(Some("prod"), None),
            Some(PoolDrift {
                desired: "prod".to_owned(),
                observed: None
            })
        );
        // Pool ids are case-sensitive in user.cfg.
        assert!(compare_pool(Some("prod"), Some("Prod")).is_some());
    }
}
