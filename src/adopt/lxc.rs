//! An lxc config → the `spec` of an LXC or TemplateCT manifest (DESIGN.md §2.5), the reverse
//! of `proxops_core::guest::render_lxc`. PVE does not keep the template a container was made
//! from (`ostemplate` is create-only), so `spec.template` is never written: the manifest is
//! incomplete until the operator names the CTTemplate.

use proxops_core::guest::parse_bool;
use proxops_core::resource::Kind;

use super::guest::{Mapping, mib_quantity, quantity, tags, volume_storage};
use super::read::Guest;
use super::yaml::{Map, Value};

/// Architectures the manifest accepts.
const ARCHES: [&str; 6] = ["amd64", "i386", "arm64", "armhf", "riscv32", "riscv64"];

/// PVE's `memory` and `swap` for a container when the keys are absent (MiB).
const PVE_DEFAULT_MIB: u64 = 512;

/// The highest `mpN` and `netN` index.
const MAX_SLOT: u32 = 255;

/// What the operator must add before the manifest validates.
const FILL_TEMPLATE: &str = "spec.template: the CTTemplate this container was created from (PVE does not keep `ostemplate`)";

/// The `spec` of one lxc guest; `name` is its `metadata.name`.
/// `ctts` are the CTTemplate names on the guest's node, offered as candidates.
pub(crate) fn spec(
    guest: &Guest,
    kind: Kind,
    name: &str,
    ctts: &[String],
    m: &mut Mapping<'_>,
) -> Map {
    let mut spec = Map::new();
    spec.set("node", guest.node.as_str());
    spec.set("vmid", guest.vmid);
    if kind == Kind::Lxc {
        let state = if guest.status == "running" {
            "started"
        } else {
            "stopped"
        };
        spec.set("state", state);
    }
    let candidates = if ctts.is_empty() {
        format!(
            "; no CTTemplate file was found on {}: adopt or declare one there first",
            guest.node
        )
    } else {
        format!("; CTTemplates on {}: {}", guest.node, ctts.join(", "))
    };
    m.fill.push(format!("{FILL_TEMPLATE}{candidates}"));
    spec.set("memory", mib(m, "memory"));
    if m.config.get("swap").is_some() {
        spec.set("swap", mib(m, "swap"));
    }
    let mut cpu = Map::new();
    match m.take("cores").and_then(|c| c.parse::<u32>().ok()) {
        Some(cores) if cores > 0 => cpu.set("cores", cores),
        _ => m.fill.push(
            "spec.cpu.cores: PVE sets no core limit on this container; choose one".to_owned(),
        ),
    }
    spec.set_map("cpu", cpu);
    if let Some(root) = rootfs(m) {
        spec.set("root", root);
    }
    let (mount_points, bind_mounts) = mounts(m);
    spec.set_list("mount-points", mount_points);
    spec.set_list("bind-mounts", bind_mounts);
    spec.set_list("networks", networks(m));
    spec.set_map("dns", dns(m, name));
    if let Some(arch) = m.take("arch") {
        if ARCHES.contains(&arch) {
            spec.set("arch", arch);
        } else {
            m.gap("arch", arch, "architecture not modelled by ProxOps");
        }
    }
    spec.set_map("options", options(m));
    if let Some(description) = m.take("description") {
        spec.set("pve-description", description);
    }
    m.mark("tags");
    spec.set_list("tags", tags(m.config));
    spec.set_opt("pool", guest.pool.clone());
    spec
}

fn mib(m: &mut Mapping<'_>, key: &str) -> String {
    match m.take(key).map(|v| v.parse::<u64>()) {
        Some(Ok(n)) => mib_quantity(n),
        Some(Err(_)) | None => {
            m.gap(
                key,
                m.config.get(key).unwrap_or(""),
                "not set or not a number; PVE's default of 512 MiB written",
            );
            mib_quantity(PVE_DEFAULT_MIB)
        }
    }
}

fn rootfs(m: &mut Mapping<'_>) -> Option<Map> {
    let Some(props) = m.take_props("rootfs", Some("volume")) else {
        m.fill.push("spec.root: PVE reports no rootfs".to_owned());
        return None;
    };
    let storage = props.get("volume").and_then(volume_storage);
    let size = props.get("size").and_then(quantity);
    let (Some(storage), Some(size)) = (storage, size) else {
        m.fill
            .push("spec.root: PVE reports no storage or size for the rootfs".to_owned());
        return None;
    };
    let mut root = Map::new();
    root.set("storage", storage);
    root.set("size", size);
    m.extra_parts("rootfs", &props, &["volume", "size"]);
    Some(root)
}

fn mounts(m: &mut Mapping<'_>) -> (Vec<Value>, Vec<Value>) {
    let mut volumes = Vec::new();
    let mut binds = Vec::new();
    for index in 0..=MAX_SLOT {
        let slot = format!("mp{index}");
        let Some(props) = m.take_props(&slot, Some("volume")) else {
            continue;
        };
        let volume = props.get("volume").unwrap_or("");
        let Some(path) = props.get("mp") else {
            m.gap(
                &slot,
                &props.to_value(Some("volume")),
                "no mount point path; not adopted",
            );
            continue;
        };
        if volume.starts_with('/') {
            let mut bind = Map::new();
            bind.set("host-path", volume);
            bind.set("mount-point", path);
            bind.set("slot", slot.as_str());
            if let Some(ro) = props.get("ro").and_then(parse_bool) {
                bind.set("read-only", ro);
            }
            m.extra_parts(&slot, &props, &["volume", "mp", "ro"]);
            binds.push(Value::Map(bind));
            continue;
        }
        let storage = volume_storage(volume);
        let size = props.get("size").and_then(quantity);
        let (Some(storage), Some(size)) = (storage, size) else {
            m.gap(
                &slot,
                &props.to_value(Some("volume")),
                "no storage or size; not adopted (a live-only slot for the plan)",
            );
            continue;
        };
        let mut mp = Map::new();
        mp.set("storage", storage);
        mp.set("size", size);
        mp.set("mount-point", path);
        mp.set("slot", slot.as_str());
        let mut options = Map::new();
        for (key, field) in [
            ("ro", "read-only"),
            ("backup", "backup"),
            ("acl", "acl"),
            ("quota", "quota"),
            ("shared", "shared"),
        ] {
            if let Some(b) = props.get(key).and_then(parse_bool) {
                options.set(field, b);
            }
        }
        if let Some(mount_options) = props.get("mountoptions") {
            options.set("mount-options", mount_options);
        }
        mp.set_map("options", options);
        m.extra_parts(
            &slot,
            &props,
            &[
                "volume",
                "size",
                "mp",
                "ro",
                "backup",
                "acl",
                "quota",
                "shared",
                "mountoptions",
            ],
        );
        volumes.push(Value::Map(mp));
    }
    (volumes, binds)
}

fn networks(m: &mut Mapping<'_>) -> Vec<Value> {
    let mut out = Vec::new();
    for index in 0..=MAX_SLOT {
        let slot = format!("net{index}");
        let Some(props) = m.take_props(&slot, None) else {
            continue;
        };
        let (Some(iface), Some(bridge)) = (props.get("name"), props.get("bridge")) else {
            m.gap(
                &slot,
                &props.to_value(None),
                "no name or bridge; not adopted (a live-only slot for the plan)",
            );
            continue;
        };
        let mut nic = Map::new();
        nic.set("slot", slot.as_str());
        nic.set("iface", iface);
        nic.set("bridge", bridge);
        let mut known = vec!["name", "bridge"];
        if let Some(t) = props.get("type") {
            nic.set("type", t);
            known.push("type");
        }
        if let Some(tag) = props.get("tag").and_then(|t| t.parse::<u32>().ok())
            && (1..=4094).contains(&tag)
        {
            nic.set("tag", tag);
            known.push("tag");
        }
        if let Some(hwaddr) = props.get("hwaddr") {
            nic.set("hwaddr", hwaddr);
            known.push("hwaddr");
        }
        if let Some(rate) = props.get("rate").and_then(|r| r.parse::<u32>().ok()) {
            nic.set("rate-limit", rate);
            known.push("rate");
        }
        if let Some(fw) = props.get("firewall").and_then(parse_bool) {
            nic.set("firewall", fw);
            known.push("firewall");
        }
        // The manifest has one address per NIC: IPv4 when set, else IPv6.
        let (ip, gw, used) = match (props.get("ip"), props.get("ip6")) {
            (Some(ip), _) => (Some(ip), props.get("gw"), ["ip", "gw"]),
            (None, Some(ip6)) if ip6 != "auto" && ip6 != "dhcp" => {
                (Some(ip6), props.get("gw6"), ["ip6", "gw6"])
            }
            _ => (None, None, ["", ""]),
        };
        nic.set_opt("ip", ip);
        if ip.is_some_and(|i| i != "dhcp" && i != "manual") {
            nic.set_opt("gw", gw);
        }
        known.extend(used);
        m.extra_parts(&slot, &props, &known);
        out.push(Value::Map(nic));
    }
    out
}

fn dns(m: &mut Mapping<'_>, name: &str) -> Map {
    let mut dns = Map::new();
    match m.take("hostname") {
        Some(hostname) if hostname != name => dns.set("hostname", hostname),
        Some(_) => {}
        // The manifest always names the container: the first apply will set this hostname.
        None => m.gap(
            "hostname",
            "",
            &format!("not set on PVE; the first apply sets it to `{name}`"),
        ),
    }
    if let Some(ns) = m.take("nameserver") {
        let list = ns
            .split_whitespace()
            .map(|w| Value::Text(w.to_owned()))
            .collect();
        dns.set("nameservers", Value::List(list));
    }
    if let Some(domain) = m.take("searchdomain") {
        dns.set("domain", domain);
    }
    dns
}

fn options(m: &mut Mapping<'_>) -> Map {
    let mut o = Map::new();
    o.set_opt("unprivileged", m.take_bool("unprivileged"));
    o.set_opt("protection", m.take_bool("protection"));
    o.set_opt("onboot", m.take_bool("onboot"));
    o.set_opt("console", m.take_bool("console"));
    if let Some(features) = m.take_props("features", None) {
        for (key, field) in [
            ("nesting", "nesting"),
            ("keyctl", "keyctl"),
            ("fuse", "fuse"),
        ] {
            if let Some(b) = features.get(key).and_then(parse_bool) {
                o.set(field, b);
            }
        }
        m.extra_parts("features", &features, &["nesting", "keyctl", "fuse"]);
    }
    if let Some(startup) = m.take("startup") {
        o.set("startup", startup);
    }
    o
}
