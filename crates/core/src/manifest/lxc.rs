//! LXC and TemplateCT: the validated spec and its checks (DESIGN.md §2.5).
//!
//! Mount points and bind mounts share the `mpN` slots (bind mounts continue after the mount
//! points by default); bind mounts of system roots such as `/etc` are refused.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

use super::check::Checker;
use super::choice::{Arch, PowerState};
use super::document::Checked;
use super::guest::{
    Slots, check_extra, check_mac, check_mib, check_node, check_pool, check_size, check_state,
    check_storage, check_tags, check_vlan, check_vmid, is_cidr, parse_slot, placement, reference,
    slot_ranges,
};
use super::ids::{NodeName, StorageId, VmId};
use super::quantity::{ByteSize, Mebibytes};
use super::raw::{RawLxcNic, RawLxcOptions, RawLxcSpec};
use super::vm::nic_slot;
use super::{Reference, Spec};
use crate::resource::Kind;

/// Mount point slots `mp0`..`mp255`.
const MP_SLOTS: [(&str, u32); 1] = [("mp", 255)];
/// `spec.extra` keys ProxOps sets itself (the Go program's list).
const RESERVED_EXTRA: [&str; 24] = [
    "vmid",
    "pool",
    "ctid",
    "name",
    "memory",
    "core_count",
    "cores",
    "rootfs",
    "ostemplate",
    "ostype",
    "arch",
    "hostname",
    "nameserver",
    "searchdomain",
    "unprivileged",
    "onboot",
    "protection",
    "nesting",
    "keyctl",
    "fuse",
    "start",
    "tags",
    "swap",
    "description",
];
/// `spec.extra` key prefixes ProxOps sets itself.
const RESERVED_EXTRA_PREFIXES: [&str; 2] = ["net", "mp"];
/// Host directories that may not be bind-mounted (the Go program's list; `/lib*` included).
const SYSTEM_ROOTS: [&str; 14] = [
    "/", "/etc", "/var", "/usr", "/boot", "/dev", "/root", "/run", "/srv", "/sys", "/bin", "/sbin",
    "/proc", "/lib",
];

/// A validated LXC or TemplateCT spec.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LxcSpec {
    /// The node it lives on.
    pub node: NodeName,
    /// Its id.
    pub vmid: VmId,
    /// Desired power state (always stopped for a TemplateCT).
    pub state: PowerState,
    /// The CTTemplate it is created from.
    pub template: String,
    /// Memory.
    pub memory: Mebibytes,
    /// Swap; `None` = not managed.
    pub swap: Option<Mebibytes>,
    /// CPU.
    pub cpu: LxcCpu,
    /// Root filesystem.
    pub root: RootFs,
    /// Storage-backed mount points.
    pub mount_points: Vec<MountPoint>,
    /// Bind mounts.
    pub bind_mounts: Vec<BindMount>,
    /// NICs.
    pub networks: Vec<LxcNic>,
    /// Hostname and DNS.
    pub dns: Dns,
    /// Architecture.
    pub arch: Option<Arch>,
    /// Options; `None` = not managed.
    pub options: LxcOptions,
    /// PVE `description`.
    pub pve_description: Option<String>,
    /// PVE tags, without the ownership tag.
    pub tags: Vec<String>,
    /// Further PVE keys, verbatim.
    pub extra: BTreeMap<String, String>,
    /// The PVE resource pool it belongs to; `None` = membership not managed.
    pub pool: Option<String>,
}

/// `spec.cpu` of a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LxcCpu {
    /// Cores.
    pub cores: u32,
    /// Accepted, never sent.
    pub units: Option<u32>,
}

/// `spec.root` → `rootfs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RootFs {
    /// Storage.
    pub storage: StorageId,
    /// Size.
    pub size: ByteSize,
}

/// `spec.mount-points[]` → `mpN`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MountPoint {
    /// N of `mpN`.
    pub slot: u32,
    /// Storage.
    pub storage: StorageId,
    /// Size.
    pub size: ByteSize,
    /// Path in the container.
    pub mount_point: String,
    /// `ro=`.
    pub read_only: Option<bool>,
    /// `backup=`.
    pub backup: Option<bool>,
    /// `acl=`.
    pub acl: Option<bool>,
    /// `quota=`.
    pub quota: Option<bool>,
    /// `shared=`.
    pub shared: Option<bool>,
    /// `mountoptions=`.
    pub mount_options: Option<String>,
}

/// `spec.bind-mounts[]` → `mpN` with a host path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BindMount {
    /// N of `mpN`.
    pub slot: u32,
    /// Host directory.
    pub host_path: String,
    /// Path in the container.
    pub mount_point: String,
    /// `ro=`.
    pub read_only: Option<bool>,
}

/// `spec.networks[]` of a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LxcNic {
    /// N of `netN`.
    pub slot: u32,
    /// Bridge.
    pub bridge: String,
    /// Interface name in the container (default the slot name).
    pub iface: String,
    /// Type (`veth`).
    pub nic_type: Option<String>,
    /// VLAN tag.
    pub tag: Option<u16>,
    /// Pinned MAC, lowercased.
    pub hwaddr: Option<String>,
    /// Rate limit, MB/s.
    pub rate_limit: Option<u32>,
    /// Firewall.
    pub firewall: Option<bool>,
    /// Address: CIDR, `dhcp` or `manual`.
    pub ip: Option<String>,
    /// Gateway (only with a static address).
    pub gw: Option<IpAddr>,
}

/// `spec.dns`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Dns {
    /// Hostname (default `metadata.name`).
    pub hostname: String,
    /// `nameserver`.
    pub nameservers: Vec<String>,
    /// `searchdomain`.
    pub domain: Option<String>,
}

/// `spec.options` of a container; every `None` is left as PVE has it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct LxcOptions {
    /// `unprivileged` (create-only).
    pub unprivileged: Option<bool>,
    /// `protection`.
    pub protection: Option<bool>,
    /// `onboot`.
    pub onboot: Option<bool>,
    /// `console`.
    pub console: Option<bool>,
    /// `features: nesting=`.
    pub nesting: Option<bool>,
    /// No PVE 9 write form.
    pub keyctl: Option<bool>,
    /// No PVE 9 write form.
    pub fuse: Option<bool>,
    /// `startup`.
    pub startup: Option<String>,
    /// Never sent.
    pub ttys: Option<u32>,
}

/// Checks an LXC or TemplateCT spec.
pub(crate) fn check_lxc(ck: &mut Checker<'_>, kind: Kind, name: &str, raw: &RawLxcSpec) -> Checked {
    let mut references: Vec<Reference> = Vec::new();
    let node = check_node(ck, raw.node.as_ref());
    let vmid = check_vmid(ck, raw.vmid);
    let state = check_state(ck, kind, raw.state);
    let template = ck.required(&raw.template, "spec.template").and_then(|t| {
        let r = reference(ck, "spec.template", t, Kind::CtTemplate);
        let ok = r.is_some();
        references.extend(r);
        ok.then(|| t.clone())
    });
    let memory = ck
        .required(&raw.memory, "spec.memory")
        .and_then(|m| check_mib(ck, "spec.memory", m, false));
    let swap = match &raw.swap {
        None => Some(None),
        Some(s) => check_mib(ck, "spec.swap", s, true).map(Some),
    };
    let cpu = ck.required(&raw.cpu, "spec.cpu").and_then(|c| {
        let cores = ck.required(&c.cores, "spec.cpu.cores").copied()?;
        if cores == 0 && !ck.reported("spec.cpu.cores") {
            ck.error_help(
                "spec.cpu.cores",
                "cores must be at least 1",
                "give the number of cores, e.g. `cores: 2`",
            );
            return None;
        }
        Some(LxcCpu {
            cores,
            units: c.units,
        })
    });
    let root = ck.required(&raw.root, "spec.root").and_then(|r| {
        let storage = check_storage(ck, "spec.root.storage", r.storage.as_ref());
        let size = ck
            .required(&r.size, "spec.root.size")
            .and_then(|s| check_size(ck, "spec.root.size", s));
        Some(RootFs {
            storage: storage?,
            size: size?,
        })
    });
    let mut slots = Slots::default();
    let mount_points = check_mount_points(ck, raw, &mut slots);
    let bind_mounts = check_bind_mounts(ck, raw, &mut slots);
    let networks = check_nics(ck, raw.networks.as_deref().unwrap_or_default());
    let dns = raw.dns.clone().unwrap_or_default();
    let dns = Dns {
        hostname: dns.hostname.unwrap_or_else(|| name.to_owned()),
        nameservers: dns.nameservers.unwrap_or_default(),
        domain: dns.domain,
    };
    let options = raw
        .options
        .as_ref()
        .map_or_else(LxcOptions::default, options);
    let tags = check_tags(ck, raw.tags.as_ref());
    let extra = check_extra(
        ck,
        raw.extra.as_ref(),
        &RESERVED_EXTRA,
        &RESERVED_EXTRA_PREFIXES,
    );
    let pool = check_pool(ck, raw.pool.as_ref());

    references.sort_by_key(|r| r.location);
    let spec = (|| {
        Some(Spec::Lxc(Box::new(LxcSpec {
            node: node?,
            vmid: vmid?,
            state,
            template: template?,
            memory: memory?,
            swap: swap?,
            cpu: cpu?,
            root: root?,
            mount_points: mount_points?,
            bind_mounts: bind_mounts?,
            networks: networks?,
            dns,
            arch: raw.arch,
            options,
            pve_description: raw.pve_description.clone(),
            tags: tags?,
            extra: extra?,
            pool: pool?,
        })))
    })();
    Checked {
        spec,
        placement: placement(ck, raw.node.as_ref(), raw.vmid),
        references,
    }
}

fn options(o: &RawLxcOptions) -> LxcOptions {
    LxcOptions {
        unprivileged: o.unprivileged,
        protection: o.protection,
        onboot: o.onboot,
        console: o.console,
        nesting: o.nesting,
        keyctl: o.keyctl,
        fuse: o.fuse,
        startup: o.startup.clone(),
        ttys: o.ttys,
    }
}

/// An `mpN` slot at `at` (default `mp<index>`), unique across mount points and bind mounts.
fn mp_slot(
    ck: &mut Checker<'_>,
    slots: &mut Slots,
    at: &str,
    raw: Option<&String>,
    default: usize,
) -> Option<u32> {
    let field = format!("{at}.slot");
    if ck.reported(&field) {
        return None;
    }
    let text = raw.cloned().unwrap_or_else(|| format!("mp{default}"));
    match parse_slot(&text, &MP_SLOTS) {
        Some((_, n)) => {
            let value_field = if raw.is_some() { field } else { at.to_owned() };
            slots
                .claim(ck, &text, at, &value_field, "mount")
                .then_some(n)
        }
        None => {
            ck.error_help(
                &field,
                format!("`{text}` is not a mount point slot"),
                format!("mount point slots are {}", slot_ranges(&MP_SLOTS)),
            );
            None
        }
    }
}

/// An absolute path inside the container.
fn check_container_path(ck: &mut Checker<'_>, field: &str, raw: Option<&String>) -> Option<String> {
    let path = ck.required_ref(raw, field)?;
    if !path.starts_with('/') {
        if !ck.reported(field) {
            ck.error_help(
                field,
                format!("`{path}` is not an absolute path"),
                "write the path inside the container, e.g. `/srv/data`",
            );
        }
        return None;
    }
    Some(path.clone())
}

fn check_mount_points(
    ck: &mut Checker<'_>,
    raw: &RawLxcSpec,
    slots: &mut Slots,
) -> Option<Vec<MountPoint>> {
    let mut ok = true;
    let mut out = Vec::new();
    for (i, m) in raw.mount_points.iter().flatten().enumerate() {
        let at = format!("spec.mount-points[{i}]");
        let storage = check_storage(ck, &format!("{at}.storage"), m.storage.as_ref());
        let size = ck
            .required(&m.size, &format!("{at}.size"))
            .and_then(|s| check_size(ck, &format!("{at}.size"), s));
        let path = check_container_path(ck, &format!("{at}.mount-point"), m.mount_point.as_ref());
        let slot = mp_slot(ck, slots, &at, m.slot.as_ref(), i);
        let o = m.options.clone().unwrap_or_default();
        match (storage, size, path, slot) {
            (Some(storage), Some(size), Some(mount_point), Some(slot)) => out.push(MountPoint {
                slot,
                storage,
                size,
                mount_point,
                read_only: o.read_only,
                backup: o.backup,
                acl: o.acl,
                quota: o.quota,
                shared: o.shared,
                mount_options: o.mount_options,
            }),
            _ => ok = false,
        }
    }
    ok.then_some(out)
}

/// `/etc/`, `//etc` and `/etc/.` are all `/etc`.
fn normalise(path: &str) -> String {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    format!("/{}", parts.join("/"))
}

fn is_system_root(path: &str) -> bool {
    let path = normalise(path);
    SYSTEM_ROOTS.contains(&path.as_str())
        || path
            .strip_prefix("/lib")
            .is_some_and(|rest| !rest.contains('/'))
}

fn check_bind_mounts(
    ck: &mut Checker<'_>,
    raw: &RawLxcSpec,
    slots: &mut Slots,
) -> Option<Vec<BindMount>> {
    let mut ok = true;
    let mut out = Vec::new();
    let first = raw.mount_points.as_ref().map_or(0, Vec::len);
    for (i, b) in raw.bind_mounts.iter().flatten().enumerate() {
        let at = format!("spec.bind-mounts[{i}]");
        let field = format!("{at}.host-path");
        let host = ck.required(&b.host_path, &field).and_then(|h| {
            if ck.reported(&field) {
                None
            } else if !h.starts_with('/') {
                ck.error_help(
                    &field,
                    format!("`{h}` is not an absolute path"),
                    "write the directory on the PVE host, e.g. `/tank/media`",
                );
                None
            } else if is_system_root(h)
                || normalise(h).contains("/../")
                || normalise(h).ends_with("/..")
            {
                ck.error_help(
                    &field,
                    format!("`{h}` is a system directory and cannot be bind-mounted"),
                    "bind-mount a data directory below it instead, e.g. `/srv/media`",
                );
                None
            } else {
                Some(h.clone())
            }
        });
        let path = check_container_path(ck, &format!("{at}.mount-point"), b.mount_point.as_ref());
        let slot = mp_slot(ck, slots, &at, b.slot.as_ref(), first + i);
        match (host, path, slot) {
            (Some(host_path), Some(mount_point), Some(slot)) => {
                out.push(BindMount {
                    slot,
                    host_path,
                    mount_point,
                    read_only: b.read_only,
                });
            }
            _ => ok = false,
        }
    }
    ok.then_some(out)
}

fn check_nics(ck: &mut Checker<'_>, list: &[RawLxcNic]) -> Option<Vec<LxcNic>> {
    let mut nics = Vec::with_capacity(list.len());
    let mut slots = Slots::default();
    let mut ok = true;
    for (i, n) in list.iter().enumerate() {
        let at = format!("spec.networks[{i}]");
        let bridge = ck.required(&n.bridge, &format!("{at}.bridge")).cloned();
        let hwaddr = match &n.hwaddr {
            None => Some(None),
            Some(m) => check_mac(ck, &format!("{at}.hwaddr"), m).map(Some),
        };
        let tag = check_vlan(ck, &format!("{at}.tag"), n.tag);
        let slot = nic_slot(ck, &mut slots, &at, n.slot.as_deref(), i);
        let ip = match n.ip.as_deref() {
            None => Some(None),
            Some(ip @ ("dhcp" | "manual")) => Some(Some(ip.to_owned())),
            Some(ip) if is_cidr(ip) => Some(Some(ip.to_owned())),
            Some(ip) => {
                ck.error_help(
                    &format!("{at}.ip"),
                    format!("`{ip}` is not an address with a prefix length, `dhcp` or `manual`"),
                    "write e.g. `10.0.0.5/24`, or `dhcp`",
                );
                None
            }
        };
        let gw = match (&n.gw, &ip) {
            (None, _) => Some(None),
            (Some(_), Some(None)) => {
                ck.error_help(
                    &format!("{at}.gw"),
                    "gateway without ip",
                    "add a static `ip` for this interface, or remove `gw`",
                );
                None
            }
            (Some(_), Some(Some(ip))) if ip == "dhcp" || ip == "manual" => {
                ck.error_help(
                    &format!("{at}.gw"),
                    format!("gateway with `ip: {ip}`"),
                    "a gateway needs a static `ip`; remove `gw`",
                );
                None
            }
            (Some(g), _) => match g.parse::<IpAddr>() {
                Ok(g) => Some(Some(g)),
                Err(_) => {
                    ck.error_help(
                        &format!("{at}.gw"),
                        format!("`{g}` is not an IP address"),
                        "write e.g. `10.0.0.1`",
                    );
                    None
                }
            },
        };
        match (bridge, hwaddr, tag, slot, ip, gw) {
            (Some(bridge), Some(hwaddr), Some(tag), Some(slot), Some(ip), Some(gw)) => {
                nics.push(LxcNic {
                    slot,
                    iface: n.iface.clone().unwrap_or_else(|| format!("net{slot}")),
                    bridge,
                    nic_type: n.nic_type.clone(),
                    tag,
                    hwaddr,
                    rate_limit: n.rate_limit,
                    firewall: n.firewall,
                    ip,
                    gw,
                })
            }
            _ => ok = false,
        }
    }
    ok.then_some(nics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::testing::{FULL_LXC, assert_errors, doc, errors, spec, valid};

    fn lxc(spec: &str) -> String {
        doc("LXC", "db-1", spec)
    }

    const BASE: &str = "  node: pve1\n  vmid: 201\n  template: debian-13\n  memory: 1GiB\n  cpu: {cores: 1}\n  root: {storage: local, size: 8G}\n";

    #[test]
    fn a_full_lxc_validates_with_defaults_and_a_template_reference() {
        let r = valid(FULL_LXC);
        assert_eq!(r.references.len(), 1);
        assert_eq!(r.references[0].target.to_string(), "CTTemplate/debian-13");
        assert_eq!(r.references[0].field, "spec.template");
        let Some(Spec::Lxc(c)) = r.spec else { panic!() };
        assert_eq!(c.swap.map(Mebibytes::get), Some(512));
        assert_eq!(
            c.bind_mounts[0].slot, 1,
            "bind mounts continue after mount points"
        );
        assert_eq!(c.networks[1].iface, "net1");
        assert_eq!(c.networks[0].hwaddr.as_deref(), Some("bc:24:11:00:00:02"));
        assert_eq!(c.options.nesting, Some(true));
        assert_eq!(c.options.protection, Some(false));
        assert_eq!(c.root.size.to_gib_string(), "8");
    }

    #[test]
    fn a_minimal_lxc_gets_its_hostname_from_the_name() {
        let Spec::Lxc(c) = spec(&lxc(BASE)) else {
            panic!()
        };
        assert_eq!(c.dns.hostname, "db-1");
        assert_eq!(c.state, PowerState::Started);
        assert_eq!(c.options, LxcOptions::default());
    }

    #[test]
    fn swap_must_be_whole_mib_and_zero_is_allowed() {
        let e = errors(&lxc(&format!("{BASE}  swap: 512M\n")));
        assert_eq!(
            e,
            [
                "test.yaml:12:9: error: spec.swap: `512M` is not a whole number of MiB: `M` is decimal (512000000 bytes)\n  help: write `512MiB` for binary units"
            ]
        );
        valid(&lxc(&format!("{BASE}  swap: 0\n")));
    }

    #[test]
    fn template_and_root_are_required() {
        assert_errors(
            &lxc("  node: pve1\n  vmid: 201\n  memory: 1GiB\n  cpu: {cores: 1}\n"),
            &[
                "test.yaml:5:1: error: spec.root: missing required field",
                "test.yaml:5:1: error: spec.template: missing required field",
            ],
        );
    }

    #[test]
    fn bind_mounts_of_system_roots_are_refused() {
        for root in ["/", "/etc/", "//var", "/lib64", "/proc"] {
            let e = errors(&lxc(&format!(
                "{BASE}  bind-mounts: [{{host-path: '{root}', mount-point: /x}}]\n"
            )));
            assert_eq!(e.len(), 1, "{root}: {e:#?}");
            assert!(e[0].contains(&format!("spec.bind-mounts[0].host-path: `{root}` is a system directory and cannot be bind-mounted")), "{e:#?}");
        }
        valid(&lxc(&format!(
            "{BASE}  bind-mounts: [{{host-path: /etc-data/x, mount-point: /x}}, {{host-path: /var/lib/media, mount-point: /y}}]\n"
        )));
    }

    #[test]
    fn two_mounts_on_one_slot_are_an_error() {
        assert_errors(
            &lxc(&format!(
                "{BASE}  mount-points: [{{storage: local, size: 1G, mount-point: /a}}]\n  bind-mounts: [{{host-path: /srv/b, mount-point: /b, slot: mp0}}]\n"
            )),
            &[
                "test.yaml:13:60: error: spec.bind-mounts[0].slot: slot `mp0` is already used by `spec.mount-points[0]`\n  help: give each mount its own slot",
            ],
        );
    }

    #[test]
    fn two_nics_on_one_slot_and_a_gateway_without_ip_are_errors() {
        let e = errors(&lxc(&format!(
            "{BASE}  networks: [{{bridge: vmbr0, gw: 10.0.0.1}}, {{bridge: vmbr0, slot: net0}}]\n"
        )));
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(
            e[0].contains("spec.networks[0].gw: gateway without ip"),
            "{e:#?}"
        );
        assert!(
            e[1].contains(
                "spec.networks[1].slot: slot `net0` is already used by `spec.networks[0]`"
            ),
            "{e:#?}"
        );
    }

    #[test]
    fn a_template_ct_is_only_stopped() {
        assert_errors(
            &doc("TemplateCT", "tpl", &format!("{BASE}  state: started\n")),
            &[
                "test.yaml:12:10: error: spec.state: a TemplateCT is always stopped\n  help: remove `state`, or write `state: stopped`",
            ],
        );
        let Spec::Lxc(c) = spec(&doc("tct", "tpl", BASE)) else {
            panic!()
        };
        assert_eq!(c.state, PowerState::Stopped);
    }

    #[test]
    fn reserved_extra_keys_are_refused_for_containers() {
        let e = errors(&lxc(&format!(
            "{BASE}  extra: {{hostname: x, mp3: y, net1: z, cmode: ok}}\n"
        )));
        assert_eq!(e.len(), 3, "{e:#?}");
    }

    #[test]
    fn a_container_keeps_its_pool_and_refuses_one_in_extra() {
        let Spec::Lxc(c) = spec(&lxc(&format!("{BASE}  pool: lab\n"))) else {
            panic!()
        };
        assert_eq!(c.pool.as_deref(), Some("lab"));
        let e = errors(&lxc(&format!("{BASE}  extra: {{pool: lab}}\n")));
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(
            e[0].contains("spec.extra.pool: `pool` is managed by ProxOps"),
            "{e:#?}"
        );
    }

    #[test]
    fn vm_only_keys_are_unknown_on_a_container() {
        assert_errors(
            &lxc(&format!("{BASE}  disks: []\n")),
            &[
                "test.yaml:12:3: error: spec.disks: unknown key `disks`\n  help: expected one of `node`, `vmid`, `state`, `template`, `memory`, `swap`, `cpu`, `root`, `mount-points`, `bind-mounts`, `networks`, `dns`, `arch`, `options`, `pve-description`, `tags`, `extra`, `pool`",
            ],
        );
    }

    #[test]
    fn container_paths_addresses_and_sizes_are_checked() {
        let e = errors(&lxc(&format!(
            "{BASE}  mount-points: [{{storage: local, size: 0, mount-point: data}}]\n  bind-mounts: [{{host-path: srv, mount-point: /x}}]\n  networks: [{{bridge: vmbr0, ip: 10.0.0.5, hwaddr: x, tag: 9999}}]\n"
        )));
        assert_eq!(e.len(), 6, "{e:#?}");
        assert!(
            e[0].contains("spec.mount-points[0].size: size is zero"),
            "{e:#?}"
        );
        assert!(
            e[1].contains("spec.mount-points[0].mount-point: `data` is not an absolute path"),
            "{e:#?}"
        );
        assert!(
            e[2].contains("spec.bind-mounts[0].host-path: `srv` is not an absolute path"),
            "{e:#?}"
        );
        assert!(e[3].contains("spec.networks[0].ip: `10.0.0.5` is not an address with a prefix length, `dhcp` or `manual`"), "{e:#?}");
        assert!(
            e[4].contains("spec.networks[0].hwaddr: `x` is not a MAC address"),
            "{e:#?}"
        );
        assert!(
            e[5].contains("spec.networks[0].tag: VLAN tag 9999 is outside 1..=4094"),
            "{e:#?}"
        );
    }
}
