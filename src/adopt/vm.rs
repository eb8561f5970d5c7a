//! A qemu config → the `spec` of a VM or TemplateVM manifest (DESIGN.md §2.4), the reverse of
//! `proxops_core::guest::render_vm`: each owned key is written so that rendering the manifest
//! gives back what PVE has, which is what makes the first plan after adopt empty except for
//! the ownership tag. Anything the format cannot say is a gap, never guessed.

use proxops_core::guest::{PropertyString, parse_bool, percent_decode};
use proxops_core::manifest::{CONTROLLERS, NIC_MODELS, is_pci_address};
use proxops_core::resource::Kind;

use super::Isos;
use super::guest::{Mapping, mib_quantity, quantity, tags, volume_storage};
use super::read::Guest;
use super::ssh_keys::{Matched, SshKeyRefs};
use super::yaml::{Map, Value};

/// Disk buses in slot order, with their highest index.
const DISK_BUSES: [(&str, u32); 5] = [
    ("ide", 3),
    ("sata", 5),
    ("scsi", 30),
    ("virtio", 15),
    ("nvme", 15),
];

/// PVE's `memory` when the key is absent (MiB).
const PVE_DEFAULT_MEMORY: u64 = 512;

/// The `spec` of one qemu guest; `name` is its `metadata.name`; `isos` finds the ISO in its
/// CD-ROM, `ssh` its SSH keys in the cluster's SOPS document.
pub(crate) fn spec(
    guest: &Guest,
    kind: Kind,
    name: &str,
    (isos, ssh): (&Isos, &SshKeyRefs),
    m: &mut Mapping<'_>,
) -> Map {
    let mut spec = Map::new();
    spec.set("node", guest.node.as_str());
    spec.set("vmid", guest.vmid);
    if kind == Kind::Vm {
        let state = if guest.status == "running" {
            "started"
        } else {
            "stopped"
        };
        spec.set("state", state);
    }
    spec.set("memory", memory(m));
    spec.set("cpu", cpu(m));

    let cloud_init_on_ide2 = is_cloud_init(m.config.get("ide2"));
    let cdrom_slot = if cloud_init_on_ide2 { "ide3" } else { "ide2" };
    let mut hardware = Map::new();
    let disks = disks(m, cdrom_slot);
    spec.set_list("disks", disks);
    spec.set_list("networks", networks(m));

    hardware_settings(m, &mut hardware);
    if let Some(cdrom) = cdrom(guest, m, cdrom_slot, isos) {
        hardware.set("cdrom", cdrom);
    }
    efi_disk(m, &mut hardware);
    if cloud_init_on_ide2 {
        let storage = m
            .take_props("ide2", Some("file"))
            .and_then(|p| p.get("file").and_then(volume_storage).map(str::to_owned));
        let mut ci = Map::new();
        ci.set("enabled", true);
        ci.set_opt("storage", storage);
        hardware.set("cloud-init", ci);
    }
    tpm(m, &mut hardware);
    pci_devices(m, &mut hardware);
    spec.set_map("hardware", hardware);
    spec.set_map("options", options(m));
    spec.set_map("cloud-init-data", cloud_init_data(m, ssh));

    match m.take("name") {
        Some(pve_name) if pve_name != name => spec.set("pve-name", pve_name),
        Some(_) => {}
        // The manifest always names the guest: the first apply will set this name.
        None => m.gap(
            "name",
            "",
            &format!("not set on PVE; the first apply sets it to `{name}`"),
        ),
    }
    if let Some(description) = m.take("description") {
        spec.set("pve-description", description);
    }
    m.mark("tags");
    spec.set_list("tags", tags(m.config));
    spec.set_opt("pool", guest.pool.clone());
    // `ostype` drives PVE's defaults and drivers (`l26`, `win11`); the manifest has no field
    // for it, so it goes to `extra`, which is sent on create and compared.
    if let Some(ostype) = m.take("ostype") {
        let mut extra = Map::new();
        extra.set("ostype", ostype);
        spec.set_map("extra", extra);
    }
    spec
}

fn memory(m: &mut Mapping<'_>) -> String {
    let Some(props) = m.take_props("memory", Some("current")) else {
        m.defaulted("memory");
        return mib_quantity(PVE_DEFAULT_MEMORY);
    };
    m.extra_parts("memory", &props, &["current"]);
    match props.get("current").and_then(|c| c.parse::<u64>().ok()) {
        Some(mib) => mib_quantity(mib),
        None => {
            m.gap(
                "memory",
                props.get("current").unwrap_or(""),
                "not a number of MiB; PVE's default written",
            );
            mib_quantity(PVE_DEFAULT_MEMORY)
        }
    }
}

fn cpu(m: &mut Mapping<'_>) -> Map {
    let mut cpu = Map::new();
    let props = m.take_props("cpu", Some("cputype"));
    let cpu_type = props
        .as_ref()
        .and_then(|p| p.get("cputype"))
        .map(str::to_owned);
    match cpu_type {
        Some(t) => cpu.set("type", t),
        None => {
            m.defaulted("cpu");
            cpu.set("type", "kvm64");
        }
    }
    if let Some(props) = &props {
        m.extra_parts("cpu", props, &["cputype", "hidden"]);
    }
    match m.take("cores").and_then(|c| c.parse::<u32>().ok()) {
        Some(cores) => cpu.set("cores", cores),
        None => {
            m.defaulted("cores");
            cpu.set("cores", 1u32);
        }
    }
    cpu
}

/// Whether a drive value is a cloud-init volume (`<storage>:vm-<id>-cloudinit`).
fn is_cloud_init(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        PropertyString::parse(v, Some("file"))
            .get("file")
            .is_some_and(|f| f.contains("-cloudinit"))
    })
}

fn disks(m: &mut Mapping<'_>, cdrom_slot: &str) -> Vec<Value> {
    let controller = m.config.get("scsihw").map(str::to_owned);
    let mut controller_written = false;
    let mut out = Vec::new();
    for (bus, max) in DISK_BUSES {
        for index in 0..=max {
            let slot = format!("{bus}{index}");
            let Some(raw) = m.config.get(&slot) else {
                continue;
            };
            let props = PropertyString::parse(raw, Some("file"));
            let file = props.get("file").unwrap_or("");
            if is_cloud_init(Some(raw)) {
                if slot != "ide2" {
                    m.take(&slot);
                    m.gap(
                        &slot,
                        raw,
                        "a cloud-init drive on a slot other than ide2 is not modelled; left as PVE has it",
                    );
                }
                continue;
            }
            if props.get("media") == Some("cdrom") || file == "none" || file.contains(":iso/") {
                if slot != cdrom_slot {
                    m.take(&slot);
                    m.gap(
                        &slot,
                        raw,
                        "a CD-ROM drive on a slot other than ide2 (ide3 with cloud-init) is not modelled; left as PVE has it",
                    );
                }
                continue;
            }
            m.take(&slot);
            let Some(storage) = volume_storage(file) else {
                m.gap(
                    &slot,
                    raw,
                    "not a volume on a PVE storage; not adopted (a live-only slot for the plan)",
                );
                continue;
            };
            let Some(size) = props.get("size").and_then(quantity) else {
                m.gap(
                    &slot,
                    raw,
                    "PVE reports no size; not adopted (a live-only slot for the plan)",
                );
                continue;
            };
            let mut disk = Map::new();
            disk.set("storage", storage);
            disk.set("size", size);
            disk.set("interface", slot.as_str());
            if bus == "scsi"
                && !controller_written
                && let Some(c) = &controller
            {
                if CONTROLLERS.contains(&c.as_str()) {
                    disk.set("controller", c.as_str());
                    m.mark("scsihw");
                }
                controller_written = true;
            }
            for (key, value) in props.items() {
                match key.as_str() {
                    "file" | "size" | "media" => {}
                    "iothread" | "ssd" => match parse_bool(value) {
                        Some(b) if !(key == "ssd" && matches!(bus, "virtio" | "nvme")) => {
                            disk.set(key, b);
                        }
                        _ => m.gap(&format!("{slot}.{key}"), value, "not adopted"),
                    },
                    "discard" if matches!(value.as_str(), "ignore" | "on") => {
                        disk.set("discard", value.as_str());
                    }
                    "aio" if matches!(value.as_str(), "native" | "threads" | "io_uring") => {
                        disk.set("aio", value.as_str());
                    }
                    _ => m.gap(
                        &format!("{slot}.{key}"),
                        value,
                        "not modelled by ProxOps; left as PVE has it",
                    ),
                }
            }
            out.push(Value::Map(disk));
        }
    }
    out
}

fn networks(m: &mut Mapping<'_>) -> Vec<Value> {
    let mut out = Vec::new();
    for index in 0..=31u32 {
        let slot = format!("net{index}");
        let Some(raw) = m.take(&slot) else { continue };
        let props = PropertyString::parse(raw, Some("model"));
        let mut model = None;
        let mut mac = None;
        for (key, value) in props.items() {
            if key == "model" {
                model = Some(value.clone());
            } else if NIC_MODELS.contains(&key.as_str()) {
                model = Some(key.clone());
                mac = Some(value.clone());
            }
        }
        let (Some(model), Some(bridge)) = (model, props.get("bridge")) else {
            m.gap(
                &slot,
                raw,
                "no model or no bridge; not adopted (a live-only slot for the plan)",
            );
            continue;
        };
        if !NIC_MODELS.contains(&model.as_str()) {
            m.gap(&slot, raw, "NIC model not modelled by ProxOps; not adopted");
            continue;
        }
        let mut nic = Map::new();
        nic.set("slot", slot.as_str());
        nic.set("model", model.as_str());
        nic.set("bridge", bridge);
        nic.set_opt(
            "mac",
            mac.or_else(|| props.get("macaddr").map(str::to_owned)),
        );
        let mut known = vec!["model", "bridge", "macaddr", model.as_str()];
        if let Some(tag) = props.get("tag") {
            match tag.parse::<u32>() {
                Ok(t) if (1..=4094).contains(&t) => {
                    nic.set("vlan", t);
                    known.push("tag");
                }
                _ => {}
            }
        }
        if let Some(rate) = props.get("rate")
            && let Ok(r) = rate.parse::<u32>()
        {
            nic.set("rate-limit", r);
            known.push("rate");
        }
        if let Some(fw) = props.get("firewall").and_then(parse_bool) {
            nic.set("firewall", fw);
            known.push("firewall");
        }
        m.extra_parts(&slot, &props, &known);
        out.push(Value::Map(nic));
    }
    out
}

fn hardware_settings(m: &mut Mapping<'_>, hw: &mut Map) {
    if let Some(props) = m.take_props("machine", Some("type")) {
        let machine_type = props.get("type").unwrap_or("");
        let machine = if machine_type == "q35" || machine_type.starts_with("pc-q35-") {
            Some("q35")
        } else if machine_type == "pc"
            || machine_type.starts_with("pc-i440fx-")
            || machine_type.starts_with("pc-")
        {
            Some("i440fx")
        } else {
            None
        };
        match machine {
            Some(value) => hw.set("machine", value),
            None => m.gap(
                "machine",
                machine_type,
                "machine type not modelled by ProxOps",
            ),
        }
        if machine.is_some() && !matches!(machine_type, "q35" | "pc") {
            m.gap(
                "machine",
                machine_type,
                "the version pin is not kept: the manifest says the machine family only",
            );
        }
        m.extra_parts("machine", &props, &["type"]);
    }
    if let Some(bios) = m.take("bios") {
        match bios {
            "seabios" | "ovmf" => hw.set("bios", bios),
            other => m.gap("bios", other, "not modelled by ProxOps"),
        }
    }
    if let Some(vga) = m.take("vga") {
        hw.set("display", vga);
    }
    if let Some(sockets) = m.take("sockets") {
        match sockets.parse::<u32>() {
            Ok(n) if n > 0 => hw.set("sockets", n),
            _ => m.gap("sockets", sockets, "not a number of sockets"),
        }
    }
    hw.set_opt("numa", m.take_bool("numa"));
    if let Some(serial0) = m.take("serial0") {
        hw.set("serial0", serial0);
    }
}

fn cdrom(guest: &Guest, m: &mut Mapping<'_>, slot: &str, isos: &Isos) -> Option<Map> {
    let raw = m.config.get(slot)?;
    let props = PropertyString::parse(raw, Some("file"));
    let file = props.get("file").unwrap_or("");
    let is_cdrom = props.get("media") == Some("cdrom") || file == "none" || file.contains(":iso/");
    if !is_cdrom {
        return None;
    }
    m.take(slot);
    let iso = if file == "none" || file.is_empty() {
        "none".to_owned()
    } else if let Some(name) = isos.get(&(guest.node.clone(), file.to_owned())) {
        name.clone()
    } else {
        m.gap(
            slot,
            raw,
            "the ISO is not among the adopted ISOs; the CD-ROM is not adopted",
        );
        return None;
    };
    let mut cdrom = Map::new();
    cdrom.set("iso", iso);
    if props.get("media") == Some("disk") {
        cdrom.set("media", "disk");
    }
    m.extra_parts(slot, &props, &["file", "media", "size"]);
    Some(cdrom)
}

fn efi_disk(m: &mut Mapping<'_>, hw: &mut Map) {
    let Some(props) = m.take_props("efidisk0", Some("file")) else {
        return;
    };
    let Some(storage) = props.get("file").and_then(volume_storage) else {
        m.gap(
            "efidisk0",
            &props.to_value(Some("file")),
            "not a volume; not adopted",
        );
        return;
    };
    let mut efi = Map::new();
    efi.set("storage", storage);
    if let Some(t) = props.get("efitype")
        && matches!(t, "byos" | "2m" | "4m" | "8m")
    {
        efi.set("template", t);
    }
    if let Some(keys) = props.get("pre-enrolled-keys").and_then(parse_bool) {
        efi.set("secure-boot", if keys { "enabled" } else { "disabled" });
    }
    m.extra_parts(
        "efidisk0",
        &props,
        &["file", "size", "efitype", "pre-enrolled-keys"],
    );
    hw.set("efi-disk", efi);
}

fn tpm(m: &mut Mapping<'_>, hw: &mut Map) {
    let Some(props) = m.take_props("tpmstate0", Some("file")) else {
        return;
    };
    let Some(storage) = props.get("file").and_then(volume_storage) else {
        m.gap(
            "tpmstate0",
            &props.to_value(Some("file")),
            "not a volume; not adopted",
        );
        return;
    };
    let mut tpm = Map::new();
    tpm.set("storage", storage);
    let version = props.get("version").unwrap_or("v1.2");
    if matches!(version, "v1.2" | "v2.0") {
        tpm.set("version", version);
    }
    m.extra_parts("tpmstate0", &props, &["file", "size", "version"]);
    hw.set("tpm", tpm);
}

fn pci_devices(m: &mut Mapping<'_>, hw: &mut Map) {
    let mut devices = Vec::new();
    for index in 0..=15u32 {
        let slot = format!("hostpci{index}");
        let Some(props) = m.take_props(&slot, Some("host")) else {
            continue;
        };
        let Some(host) = props.get("host").filter(|h| is_pci_address(h)) else {
            m.gap(
                &slot,
                &props.to_value(Some("host")),
                "a mapped or multi-function device is not modelled; not adopted",
            );
            continue;
        };
        let mut device = Map::new();
        device.set("slot", slot.as_str());
        device.set("device", host.to_ascii_lowercase());
        if let Some(pcie) = props.get("pcie").and_then(parse_bool) {
            device.set("pcie", pcie);
        }
        m.extra_parts(&slot, &props, &["host", "pcie"]);
        devices.push(Value::Map(device));
    }
    hw.set_list("pci-devices", devices);
}

fn options(m: &mut Mapping<'_>) -> Map {
    let mut o = Map::new();
    o.set_opt("onboot", m.take_bool("onboot"));
    if let Some(startup) = m.take("startup") {
        o.set("startup", startup);
    }
    o.set_opt("protection", m.take_bool("protection"));
    if let Some(agent) = m.take_props("agent", Some("enabled")) {
        if let Some(enabled) = agent.get("enabled").and_then(parse_bool) {
            o.set("agent", enabled);
        }
        m.extra_parts("agent", &agent, &["enabled"]);
    }
    o.set_opt("acpi", m.take_bool("acpi"));
    o.set_opt("tablet", m.take_bool("tablet"));
    if let Some(hotplug) = m.take("hotplug") {
        let list: Vec<Value> = if hotplug == "0" {
            Vec::new()
        } else {
            hotplug
                .split(',')
                .map(|s| Value::Text(s.trim().to_owned()))
                .collect()
        };
        o.set("hotplug", Value::List(list));
    }
    if let Some(boot) = m.take_props("boot", None) {
        match boot.get("order") {
            Some(order) if !order.is_empty() => {
                let list = order
                    .split(';')
                    .map(|s| Value::Text(s.to_owned()))
                    .collect();
                o.set("boot-order", Value::List(list));
            }
            _ => m.gap(
                "boot",
                &boot.to_value(None),
                "legacy boot syntax not modelled",
            ),
        }
        m.extra_parts("boot", &boot, &["order"]);
    }
    if let Some(props) = m.config.entry("cpu").and_then(|e| e.props.as_ref())
        && let Some(hidden) = props.get("hidden").and_then(parse_bool)
    {
        o.set("hidden", hidden);
    }
    o
}

fn cloud_init_data(m: &mut Mapping<'_>, ssh: &SshKeyRefs) -> Map {
    let mut ci = Map::new();
    if let Some(user) = m.take("ciuser") {
        ci.set("ci-user", user);
    }
    // The keys are never copied out: references when the cluster's SOPS document holds every
    // one of them, else `["*"]`, which leaves them to PVE (issue 9).
    if let Some(keys) = m.take("sshkeys") {
        let decoded = percent_decode(keys);
        let pve_owned = Value::List(vec![Value::Text("*".to_owned())]);
        match ssh.match_keys(&decoded) {
            Matched::Refs(refs) => ci.set("ssh-key-refs", refs),
            Matched::Partial { total: 0, .. } => {}
            Matched::Partial { matched, total } => {
                if !ssh.is_empty() {
                    m.gap(
                        "sshkeys",
                        "",
                        &format!(
                            "{matched} of {total} keys are in the SOPS document (all or nothing): adopted as [\"*\"], PVE keeps them"
                        ),
                    );
                }
                ci.set("ssh-keys", pve_owned);
            }
        }
    }
    if m.take("cipassword").is_some() {
        m.gap(
            "cipassword",
            "",
            "never adopted: PVE keeps the password; reference a SOPS entry with ci-password-ref to manage it",
        );
    }
    if let Some(ns) = m.take("nameserver") {
        ci.set("nameservers", Value::List(words(ns)));
    }
    if let Some(sd) = m.take("searchdomain") {
        ci.set("search-domains", Value::List(words(sd)));
    }
    let mut ipconfigs = Vec::new();
    for nic in 0..=31u32 {
        let key = format!("ipconfig{nic}");
        let Some(props) = m.take_props(&key, Some("ip")) else {
            continue;
        };
        let v4 = props.get("ip");
        let v6 = props.get("ip6");
        let (ip, gw) = match (v4, v6) {
            (Some(ip), None) => (Some(ip), props.get("gw")),
            (None, Some(ip6)) if ip6 != "dhcp" && ip6 != "auto" => (Some(ip6), props.get("gw6")),
            (None, None) => (None, None),
            _ => {
                m.gap(
                    &key,
                    &props.to_value(Some("ip")),
                    "IPv4 and IPv6 together, or IPv6 auto/dhcp, are not modelled; not adopted",
                );
                continue;
            }
        };
        let mut entry = Map::new();
        entry.set("nic", nic);
        entry.set_opt("ip", ip);
        entry.set_opt("gateway", gw);
        m.extra_parts(&key, &props, &["ip", "gw", "ip6", "gw6"]);
        ipconfigs.push(Value::Map(entry));
    }
    ci.set_list("ipconfigs", ipconfigs);
    ci
}

fn words(text: &str) -> Vec<Value> {
    text.split_whitespace()
        .map(|w| Value::Text(w.to_owned()))
        .collect()
}
