//! `proxops check`: before anything is applied, does PVE have what the manifests need? Reports
//! the PVE version and nodes, every storage (and the content types it must carry) the
//! manifests use, every bridge they name, and the privileges the current plan needs that the
//! API token lacks.
//!
//! The checks are read-only: `GET /version`, `/nodes`, `/nodes/{n}/storage`,
//! `/nodes/{n}/network?type=bridge`, `/access/permissions`, plus the observe GETs of a `plan`.
//! The bridge listing is not among `proxops-pve`'s builders (it is outside the API subset
//! they follow); a PVE answering 501 to it turns the bridge check into a "skipped" item.
//!
//! # Needed privileges
//!
//! Taken from the `permissions` field of `apidoc-full.json` (PVE 9.1) for the endpoints a pass
//! calls, and from PVE's `check_vm_modify_config_perm` / `check_ct_modify_config_perm` for the
//! per-key config privileges that the schema only summarises as "any of VM.Config.*":
//!
//! | plan step (endpoint) | path | privileges |
//! |---|---|---|
//! | observe guests (`GET /cluster/resources`, `.../config`, `.../pending`) | `/vms/<vmid>` | `VM.Audit` |
//! | observe artifacts (`GET /nodes/{n}/storage/{s}/content`) | `/storage/<s>` | `Datastore.Audit` or `Datastore.AllocateSpace` |
//! | download (`POST /nodes/{n}/storage/{s}/download-url`) | `/storage/<s>` | `Datastore.AllocateTemplate` |
//! | | `/` or `/nodes/<n>` | `Sys.Audit` and `Sys.Modify` on `/`, or `Sys.AccessNetwork` on `/nodes/<n>` |
//! | create (`POST /nodes/{n}/qemu`, `/lxc`) | `/vms/<vmid>` | `VM.Allocate`, plus the config privileges of every key below |
//! | a new disk (`<storage>:<size>`), `rootfs`, `mpN`, resize | `/storage/<s>` | `Datastore.AllocateSpace` |
//! | an ISO, import source or CT template used (`<s>:iso/…`, `import-from=`, `ostemplate`) | `/storage/<s>` | `Datastore.Audit` or `Datastore.AllocateSpace` |
//! | a NIC on a bridge (`netN: …,bridge=<b>`) | `/sdn/zones/localnetwork/<b>` | `SDN.Use` |
//! | a privileged container (`unprivileged` absent or `0`: PVE's default is privileged) | `/` | `Sys.Modify` |
//! | (qemu) `startup` (it changes host behaviour) | `/` | `Sys.Modify` |
//! | clone (`POST /nodes/{n}/qemu/{vmid}/clone`) | `/vms/<template>`, `/vms/<newid>` | `VM.Clone`; `VM.Allocate` |
//! | config write (`PUT .../config`): disks, `boot`, resize | `/vms/<vmid>` | `VM.Config.Disk` (`VM.Config.CDROM` for `media=cdrom`) |
//! | `cores`, `cpu`, `sockets`, `numa`, `vcpus`, `cpulimit`, `cpuunits`, `affinity` | `/vms/<vmid>` | `VM.Config.CPU` |
//! | `memory`, `balloon`, `shares`, (lxc) `swap` | `/vms/<vmid>` | `VM.Config.Memory` |
//! | `netN`, `ipconfigN`, (lxc) `nameserver`, `searchdomain`, `hostname` | `/vms/<vmid>` | `VM.Config.Network` |
//! | `machine`, `scsihw`, `vga`, `acpi`, `kvm`, `tablet`, `hotplug`, `smbios1`, `watchdog`, `audio0` | `/vms/<vmid>` | `VM.Config.HWType` |
//! | (qemu) `ciuser`, `cipassword`, `citype`, `cicustom`, `sshkeys`, `nameserver`, `searchdomain`, `ciupgrade` | `/vms/<vmid>` | `VM.Config.Cloudinit` |
//! | every other key (`name`, `tags`, `onboot`, `agent`, `description`, …) | `/vms/<vmid>` | `VM.Config.Options` |
//! | start, shutdown, reboot (`POST .../status/*`) | `/vms/<vmid>` | `VM.PowerMgmt` |
//! | promote to template (`POST .../template`), delete (`DELETE .../{vmid}`) | `/vms/<vmid>` | `VM.Allocate` |
//! | `[policy] snapshot` (`risky`, the default, or `updates`): a snapshot before an update it picks (`POST .../snapshot`, retention `DELETE .../snapshot/{name}`) | `/vms/<vmid>` | `VM.Snapshot` (qemu-server @ e6352be6 `API2/Qemu.pm` `snapshot`, `delsnapshot`; pve-container @ 94f5585 `API2/LXC/Snapshot.pm`) |
//! | the same: `GET .../feature?feature=snapshot`, `GET .../snapshot` | `/vms/<vmid>` | `VM.Audit` (`vm_feature`, `snapshot_list`) |
//! | `proxops rollback` (`POST .../snapshot/{name}/rollback`) | `/vms/<vmid>` | `VM.Snapshot` or `VM.Snapshot.Rollback` (`rollback`, `any => 1`): held with the snapshot's `VM.Snapshot` |
//! | `[policy] backup_before_delete = "<s>"`: vzdump before a delete (`POST /nodes/{n}/vzdump`) | `/vms/<vmid>`, `/storage/<s>` | `VM.Backup` (pve-manager @ 14a22df3 `PVE/VZDump.pm` `exec_backup`); `Datastore.AllocateSpace` (`PVE/API2/VZDump.pm` `vzdump`) |
//! | the HA status each agent pass reads (`GET /cluster/ha/status/current`) | `/` | `Sys.Audit` (pve-ha-manager @ b71218f `src/PVE/API2/HA/Status.pm` `status`); a warning, not a problem: without it the agent goes on and records `ha-status-unknown` |
//! | `[rollout] health = "guest-agent"`: a VM of this node a pass touches, declared `started` (`POST .../agent/ping`) | `/vms/<vmid>` | PVE 9: `VM.GuestAgent.Audit` or `VM.GuestAgent.Unrestricted` (qemu-server @ e6352be6 `API2/Qemu/Agent.pm` `register_command`); PVE 8: `VM.Monitor` |
//!
//! The safety-net rows are asked for only for what agent.toml turns on and the plan would do
//! (the actions [`safety_net::SafetyNet`] picks with the agent's own decisions).
//!
//! Task status polls need nothing: the token owns the tasks it starts. Keys PVE reserves for
//! `root@pam` (bind mounts, `hostpciN` without a resource mapping) are not privileges and are
//! not checked here.
//!
//! Granted privileges come from `GET /access/permissions` (the full map) and
//! `?path=<p>` for each needed path it does not list (PVE computes inheritance and token
//! privilege separation itself). A `?path=` answer without the path means nothing is held
//! there.

use std::collections::{BTreeMap, BTreeSet};

use proxops_core::guest::{Artifacts, RenderedConfig};
use proxops_core::guest::{DiskRole, GuestType, PropertyString, Rule, render};
use proxops_core::manifest::{Placement, Spec, content_type};
use proxops_core::plan::{Action, NodeScope, Plan, Verb};
use proxops_core::repository::DesiredState;
use proxops_core::resource::{Kind, ResourceId};
use proxops_pve::{ContentType, Method, PveClient, PveError, Request};
use serde::Serialize;
use serde_json::Value;

pub mod safety_net;

use safety_net::SafetyNet;

/// The outcome of one check line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// As needed.
    Ok,
    /// Something a pass would trip over.
    Problem,
    /// Could not be checked (and why is in the detail).
    Skipped,
    /// Works, with a feature less (what and why in the detail); not a problem.
    Warning,
}

/// One line of the checklist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    /// What area: `pve`, `node`, `repository`, `storage`, `bridge`, `privilege`.
    pub check: String,
    /// What was checked, e.g. `local on pve1`.
    pub subject: String,
    /// The outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about a problem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Item {
    fn ok(check: &str, subject: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            check: check.to_owned(),
            subject: subject.into(),
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn problem(
        check: &str,
        subject: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            check: check.to_owned(),
            subject: subject.into(),
            status: Status::Problem,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    fn warning(
        check: &str,
        subject: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            status: Status::Warning,
            ..Self::problem(check, subject, detail, fix)
        }
    }

    fn skipped(check: &str, subject: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            check: check.to_owned(),
            subject: subject.into(),
            status: Status::Skipped,
            detail: detail.into(),
            fix: None,
        }
    }
}

/// The whole checklist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// True when no item is a problem.
    pub ok: bool,
    /// Every line, in the order checked.
    pub items: Vec<Item>,
}

impl Report {
    fn new(items: Vec<Item>) -> Self {
        Self {
            ok: !items.iter().any(|i| i.status == Status::Problem),
            items,
        }
    }
}

/// A privilege on an ACL path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PathPrivilege {
    /// The ACL path, e.g. `/storage/local`.
    pub path: String,
    /// The privilege, e.g. `Datastore.AllocateTemplate`.
    pub privilege: String,
}

fn pp(path: impl Into<String>, privilege: &str) -> PathPrivilege {
    PathPrivilege {
        path: path.into(),
        privilege: privilege.to_owned(),
    }
}

/// One thing the plan does and what it needs: held when every privilege of any one option is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Requirement {
    /// The step, e.g. `download ISO/debian on pve1`.
    pub why: String,
    /// Alternatives; the first is the one reported when none is held.
    pub options: Vec<Vec<PathPrivilege>>,
}

fn require(why: &str, all: Vec<PathPrivilege>) -> Requirement {
    Requirement {
        why: why.to_owned(),
        options: vec![all],
    }
}

fn require_any(why: &str, options: Vec<Vec<PathPrivilege>>) -> Requirement {
    Requirement {
        why: why.to_owned(),
        options,
    }
}

/// The privileges PVE reports per path: privilege → whether it propagates to child paths
/// (`GET /access/permissions` answers `{"<path>": {"<privilege>": 0|1}}`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Granted {
    paths: BTreeMap<String, BTreeMap<String, bool>>,
}

impl Granted {
    /// Reads one `/access/permissions` answer (the `data` member); later answers add to
    /// earlier ones.
    pub fn add_answer(&mut self, data: &Value) {
        let Some(map) = data.as_object() else { return };
        for (path, privs) in map {
            let entry = self.paths.entry(path.clone()).or_default();
            if let Some(privs) = privs.as_object() {
                for (privilege, propagate) in privs {
                    let propagate = propagate
                        .as_u64()
                        .map(|n| n != 0)
                        .or_else(|| propagate.as_bool())
                        .or_else(|| propagate.as_str().map(|s| s != "0"))
                        .unwrap_or(true);
                    entry.insert(privilege.clone(), propagate);
                }
            }
        }
    }

    /// Whether PVE listed `path` itself.
    pub fn lists(&self, path: &str) -> bool {
        self.paths.contains_key(path)
    }

    /// Whether `privilege` is held on `path`: as listed for the path, or else propagated from
    /// the nearest listed ancestor.
    pub fn holds(&self, path: &str, privilege: &str) -> bool {
        if let Some(privs) = self.paths.get(path) {
            return privs.contains_key(privilege);
        }
        let mut current = path;
        while let Some((parent, _)) = current.rsplit_once('/') {
            let parent = if parent.is_empty() { "/" } else { parent };
            if let Some(privs) = self.paths.get(parent) {
                return privs.get(privilege).copied().unwrap_or(false);
            }
            if parent == "/" {
                break;
            }
            current = parent;
        }
        false
    }
}

/// A privilege the token lacks, with every step that needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Missing {
    /// The path and privilege.
    #[serde(flatten)]
    pub need: PathPrivilege,
    /// Alternatives that would also do, in words (empty when none).
    pub alternatives: Vec<String>,
    /// The plan steps that need it.
    pub needed_for: Vec<String>,
}

/// Needed versus granted: every requirement none of whose options is fully held, as the
/// missing privileges of its first option, grouped by path and privilege.
pub fn missing_privileges(requirements: &[Requirement], granted: &Granted) -> Vec<Missing> {
    let mut missing: BTreeMap<PathPrivilege, (BTreeSet<String>, BTreeSet<String>)> =
        BTreeMap::new();
    for req in requirements {
        let held = |option: &Vec<PathPrivilege>| {
            option.iter().all(|p| granted.holds(&p.path, &p.privilege))
        };
        if req.options.iter().any(held) {
            continue;
        }
        let Some(first) = req.options.first() else {
            continue;
        };
        // An alternative needing Sys.Modify on `/` is never proposed: docs/operations.md says
        // not to grant it (it would let the token change the cluster's configuration).
        let others: Vec<String> = req
            .options
            .iter()
            .skip(1)
            .filter(|o| {
                !o.iter()
                    .any(|p| p.path == "/" && p.privilege == "Sys.Modify")
            })
            .map(|o| {
                o.iter()
                    .map(|p| format!("{} on {}", p.privilege, p.path))
                    .collect::<Vec<_>>()
                    .join(" and ")
            })
            .collect();
        for p in first {
            if granted.holds(&p.path, &p.privilege) {
                continue;
            }
            let entry = missing.entry(p.clone()).or_default();
            entry.0.insert(req.why.clone());
            entry.1.extend(others.iter().cloned());
        }
    }
    missing
        .into_iter()
        .map(|(need, (why, alternatives))| Missing {
            need,
            alternatives: alternatives.into_iter().collect(),
            needed_for: why.into_iter().collect(),
        })
        .collect()
}

/// The storages and bridges a desired state uses on the nodes in scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uses {
    /// (node, storage) → content type → the resources that need it.
    pub storages: BTreeMap<(String, String), BTreeMap<ContentType, BTreeSet<String>>>,
    /// (node, bridge) → the resources that name it.
    pub bridges: BTreeMap<(String, String), BTreeSet<String>>,
}

/// The storages (with content types) and bridges a desired state uses on the nodes in scope.
pub fn uses(desired: &DesiredState, scope: &NodeScope) -> Uses {
    let mut uses = Uses::default();
    let artifacts = Artifacts::from_manifest(&desired.manifest);
    for resource in desired.manifest.resources() {
        let who = resource.id.to_string();
        match &resource.placement {
            Placement::Artifact { nodes, storage, .. } => {
                let content = content_of(resource.id.kind);
                for node in nodes.iter().filter(|n| scope.includes(n)) {
                    uses.storages
                        .entry((node.clone(), storage.clone()))
                        .or_default()
                        .entry(content)
                        .or_default()
                        .insert(who.clone());
                }
            }
            Placement::Guest { node, .. } => {
                if !scope.includes(node) {
                    continue;
                }
                let Some(rendered) = render(resource, &artifacts) else {
                    continue;
                };
                for (key, owned) in &rendered.owned {
                    if let Rule::Disk(rule) = &owned.rule {
                        let content = match rule.role {
                            DiskRole::RootFs | DiskRole::MountPoint => ContentType::Rootdir,
                            _ => ContentType::Images,
                        };
                        uses.storages
                            .entry((node.clone(), rule.storage.clone()))
                            .or_default()
                            .entry(content)
                            .or_default()
                            .insert(who.clone());
                    }
                    if is_net(key)
                        && let Some(bridge) = bridge_of(&owned.value)
                    {
                        uses.bridges
                            .entry((node.clone(), bridge))
                            .or_default()
                            .insert(who.clone());
                    }
                }
            }
        }
    }
    uses
}

fn content_of(kind: Kind) -> ContentType {
    content_type(kind).parse().unwrap_or(ContentType::Iso)
}

fn is_net(key: &str) -> bool {
    key.strip_prefix("net")
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

fn bridge_of(value: &str) -> Option<String> {
    PropertyString::parse(value, None)
        .get("bridge")
        .map(str::to_owned)
}

fn index_key(key: &str, prefixes: &[&str]) -> bool {
    prefixes.iter().any(|p| {
        key.strip_prefix(p)
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    })
}

fn is_qemu_disk(key: &str) -> bool {
    key == "efidisk0"
        || key == "tpmstate0"
        || index_key(key, &["ide", "sata", "scsi", "virtio", "unused"])
}

/// The storage a volume value names, when it is `<storage>:<...>`.
fn storage_of(value: &str) -> Option<&str> {
    let first = value.split(',').next()?;
    let (storage, rest) = first.split_once(':')?;
    (!storage.is_empty() && !storage.starts_with('/') && !rest.is_empty()).then_some(storage)
}

/// Whether a volume value allocates a new volume (`<storage>:<size>` or `<storage>:cloudinit`).
fn allocates(value: &str) -> bool {
    let first = value.split(',').next().unwrap_or_default();
    first
        .split_once(':')
        .is_some_and(|(_, rest)| rest == "cloudinit" || rest.parse::<f64>().is_ok() || rest == "0")
}

/// pve-storage `check_volume_access` for an ISO, a CT template or an import image:
/// `Datastore.AllocateSpace` or `Datastore.Audit` (`check_any`, in that order).
fn volume_access(storage: &str, why: &str) -> Requirement {
    let path = format!("/storage/{storage}");
    require_any(
        why,
        vec![
            vec![pp(&path, "Datastore.AllocateSpace")],
            vec![pp(&path, "Datastore.Audit")],
        ],
    )
}

/// When a config key is written: at create (`create_vm`, where qemu-server asks no drive
/// privilege) or on an existing guest (`$update_vm_api` / `update_vm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    Create,
    Update,
}

/// Whether a qemu drive value is a cloud-init drive (`<storage>:cloudinit` or an allocated
/// `vm-<id>-cloudinit` volume).
fn is_cloudinit(value: &str) -> bool {
    let first = value.split(',').next().unwrap_or_default();
    first == "cloudinit"
        || first
            .split_once(':')
            .is_some_and(|(_, v)| v == "cloudinit" || v.contains("-cloudinit"))
}

/// A NIC value's `SDN.Use` path (pve-guest-common `check_vnet_access`): the VLAN path
/// `/sdn/zones/localnetwork/<bridge>/<tag>` when the NIC has a `tag`, else the bridge's.
fn vnet_path(value: &str) -> Option<String> {
    let p = PropertyString::parse(value, None);
    let bridge = p.get("bridge")?;
    Some(match p.get("tag").filter(|t| !t.is_empty() && *t != "0") {
        Some(tag) => format!("/sdn/zones/localnetwork/{bridge}/{tag}"),
        None => format!("/sdn/zones/localnetwork/{bridge}"),
    })
}

/// The privileges of writing `key = value` (or deleting it, `value` None) on guest `vmid`, as
/// PVE 9's handlers check them:
///
/// * qemu (qemu-server src/PVE/API2/Qemu.pm @ e6352be): `$check_vm_modify_config_perm`'s
///   option tables for non-drive keys (cloud-init keys and `ipconfigN` any of
///   `VM.Config.Cloudinit` or `VM.Config.Network`; `startup` also `Sys.Modify` on `/`);
///   drives at create only their storage (`$check_storage_access`), on an existing VM also
///   `$check_drive_perms` of the old and the new value (a cloud-init drive
///   `VM.Config.Cloudinit` and `VM.Config.CDROM`, a CD-ROM `VM.Config.CDROM`, else
///   `VM.Config.Disk`); `tags` `VM.Config.Options` (`assert_tag_permissions`);
/// * lxc (pve-container src/PVE/LXC.pm @ 94f5585, `check_ct_modify_config_perm`), the same
///   at create and on update; `features` with only `nesting` needs `VM.Allocate`;
/// * a NIC `SDN.Use` on its bridge, or its VLAN when tagged (`check_vnet_access`).
fn config_requirements(
    guest_type: GuestType,
    vmid: u32,
    key: &str,
    value: Option<&str>,
    old: Option<&str>,
    write: Write,
    why: &str,
) -> Vec<Requirement> {
    let vm = format!("/vms/{vmid}");
    let mut out = Vec::new();
    let value = value.unwrap_or_default();
    let on_vm = |privilege: &str| require(why, vec![pp(&vm, privilege)]);
    let disk = match guest_type {
        GuestType::Qemu => is_qemu_disk(key),
        GuestType::Lxc => key == "rootfs" || index_key(key, &["mp", "unused"]),
    };
    if disk {
        let drive_privs = |v: &str| -> Vec<&'static str> {
            if guest_type == GuestType::Lxc {
                vec!["VM.Config.Disk"]
            } else if is_cloudinit(v) {
                vec!["VM.Config.Cloudinit", "VM.Config.CDROM"]
            } else if v.contains("media=cdrom") {
                vec!["VM.Config.CDROM"]
            } else {
                vec!["VM.Config.Disk"]
            }
        };
        if guest_type == GuestType::Lxc || write == Write::Update {
            let mut privs = drive_privs(value);
            if guest_type == GuestType::Qemu
                && let Some(old) = old.filter(|o| !o.is_empty())
            {
                privs.extend(drive_privs(old));
            }
            privs.sort_unstable();
            privs.dedup();
            out.push(require(
                why,
                privs.into_iter().map(|p| pp(&vm, p)).collect(),
            ));
        }
        if let Some(storage) = storage_of(value)
            && !is_cloudinit(value)
        {
            if allocates(value) || guest_type == GuestType::Lxc {
                out.push(require(
                    why,
                    vec![pp(format!("/storage/{storage}"), "Datastore.AllocateSpace")],
                ));
            } else {
                out.push(volume_access(storage, why));
            }
        }
        if let Some(src) = value
            .split(',')
            .find_map(|p| p.strip_prefix("import-from="))
            && let Some(storage) = storage_of(src)
        {
            out.push(volume_access(storage, why));
        }
        return out;
    }
    if key == "tags" {
        out.push(on_vm("VM.Config.Options"));
        return out;
    }
    match guest_type {
        GuestType::Qemu => match key {
            k if is_net(k) => out.push(on_vm("VM.Config.Network")),
            "cores" | "cpu" | "cpulimit" | "cpuunits" | "numa" | "sockets" | "vcpus" | "smp" => {
                out.push(on_vm("VM.Config.CPU"));
            }
            "memory" | "balloon" | "shares" | "allow-ksm" => out.push(on_vm("VM.Config.Memory")),
            "acpi" | "hotplug" | "kvm" | "machine" | "scsihw" | "smbios1" | "tablet" | "vga"
            | "watchdog" | "audio0" | "rng0" => out.push(on_vm("VM.Config.HWType")),
            k if index_key(k, &["serial", "usb"]) => out.push(on_vm("VM.Config.HWType")),
            "boot" | "bootdisk" | "vmstatestorage" => out.push(on_vm("VM.Config.Disk")),
            "freeze" => out.push(on_vm("VM.PowerMgmt")),
            "ciuser" | "cipassword" | "citype" | "cicustom" | "sshkeys" | "nameserver"
            | "searchdomain" | "ciupgrade" => out.push(require_any(
                why,
                vec![
                    vec![pp(&vm, "VM.Config.Cloudinit")],
                    vec![pp(&vm, "VM.Config.Network")],
                ],
            )),
            k if index_key(k, &["ipconfig"]) => out.push(require_any(
                why,
                vec![
                    vec![pp(&vm, "VM.Config.Cloudinit")],
                    vec![pp(&vm, "VM.Config.Network")],
                ],
            )),
            k if k.starts_with("numa") => out.push(on_vm("VM.Config.CPU")),
            "startup" => {
                out.push(on_vm("VM.Config.Options"));
                out.push(require(why, vec![pp("/", "Sys.Modify")]));
            }
            _ => out.push(on_vm("VM.Config.Options")),
        },
        GuestType::Lxc => match key {
            k if is_net(k) => out.push(on_vm("VM.Config.Network")),
            "cores" | "cpulimit" | "cpuunits" => out.push(on_vm("VM.Config.CPU")),
            "memory" | "swap" => out.push(on_vm("VM.Config.Memory")),
            "nameserver" | "searchdomain" | "hostname" => out.push(on_vm("VM.Config.Network")),
            "features" => {
                let nesting_only = PropertyString::parse(value, None)
                    .items()
                    .iter()
                    .all(|(k, _)| k == "nesting");
                if nesting_only {
                    out.push(on_vm("VM.Allocate"));
                }
            }
            _ => out.push(on_vm("VM.Config.Options")),
        },
    }
    if is_net(key) {
        for v in [Some(value), old].into_iter().flatten() {
            if let Some(path) = vnet_path(v) {
                out.push(require(why, vec![pp(path, "SDN.Use")]));
            }
        }
    }
    out
}

/// The privileges reading the desired state's guests and artifacts needs (what `plan`
/// observes), for the nodes in scope.
pub fn read_requirements(desired: &DesiredState, scope: &NodeScope) -> Vec<Requirement> {
    let mut out = Vec::new();
    let mut storages = BTreeSet::new();
    for resource in desired.manifest.resources() {
        match &resource.placement {
            Placement::Guest { node, vmid, .. } if scope.includes(node) => {
                let why = format!("observe {} on {node}", resource.id);
                let audit = vec![pp(format!("/vms/{vmid}"), "VM.Audit")];
                match declared_pool(resource) {
                    // A guest of the pool inherits `/pool/<pool>` (RPCEnvironment
                    // `compile_acl_path`); `/cluster/resources` shows its `pool` only with
                    // Pool.Audit there (pve-manager `API2/Cluster.pm` `resources`), and
                    // without it every pass would see the guest out of its pool.
                    Some(pool) => {
                        out.push(require_any(
                            &why,
                            vec![vec![pp(format!("/pool/{pool}"), "VM.Audit")], audit],
                        ));
                        out.push(require(
                            &format!("observe the pool of {} on {node}", resource.id),
                            vec![pp(format!("/pool/{pool}"), "Pool.Audit")],
                        ));
                    }
                    None => out.push(require(&why, audit)),
                }
            }
            Placement::Artifact { nodes, storage, .. } => {
                if nodes.iter().any(|n| scope.includes(n)) && storages.insert(storage.clone()) {
                    out.push(volume_access(storage, &format!("list storage {storage}")));
                }
            }
            Placement::Guest { .. } => {}
        }
    }
    out
}

/// The privileges the plan's actions need without the safety net (see the module table).
pub fn plan_requirements(plan: &Plan, desired: &DesiredState) -> Vec<Requirement> {
    plan_requirements_with(plan, desired, &SafetyNet::off(), None)
}

/// The privileges the plan's actions need, with what `net` adds for them (snapshots before
/// updates, backups before deletes, guest agent pings) on PVE `pve_major`.
pub fn plan_requirements_with(
    plan: &Plan,
    desired: &DesiredState,
    net: &SafetyNet,
    pve_major: Option<u32>,
) -> Vec<Requirement> {
    let artifacts = Artifacts::from_manifest(&desired.manifest);
    let rendered = |id: &ResourceId| -> Option<RenderedConfig> {
        desired.manifest.get(id).and_then(|r| render(r, &artifacts))
    };
    // `/vms/<vmid>` → the pool of each guest this plan creates or clones into one.
    let created_in_pool: BTreeMap<String, String> = plan
        .actions()
        .filter_map(|a| match &a.verb {
            Verb::Create(c) => Some((c.vmid, c.params.get("pool")?.clone())),
            Verb::Clone(c) => Some((c.vmid, c.pool.clone()?)),
            _ => None,
        })
        .map(|(vmid, pool)| (format!("/vms/{vmid}"), pool))
        .collect();
    let mut requirements: Vec<Requirement> = plan
        .actions()
        .flat_map(|action| action_requirements(action, &rendered))
        .collect();
    requirements.extend(net.requirements(plan, desired, pve_major));
    or_on_pool(requirements, &created_in_pool)
}

fn action_requirements(
    action: &Action,
    rendered: &dyn Fn(&ResourceId) -> Option<RenderedConfig>,
) -> Vec<Requirement> {
    let why = format!(
        "{} {} on {}",
        action.verb.name(),
        action.resource,
        action.node
    );
    let node = &action.node;
    let mut out = Vec::new();
    match &action.verb {
        Verb::Download(d) => {
            out.push(require(
                &why,
                vec![pp(
                    format!("/storage/{}", d.storage),
                    "Datastore.AllocateTemplate",
                )],
            ));
            // The schema's `or`: Sys.AccessNetwork on the node, or Sys.Audit and Sys.Modify
            // on `/` (which `missing_privileges` never proposes).
            out.push(require_any(
                &why,
                vec![
                    vec![pp(format!("/nodes/{node}"), "Sys.AccessNetwork")],
                    vec![pp("/", "Sys.Audit"), pp("/", "Sys.Modify")],
                ],
            ));
        }
        Verb::WriteSnippet(s) | Verb::RemoveSnippet(s) => {
            // The storage's path comes from `GET /storage/{storage}`, which pve-storage
            // guards with Datastore.Allocate (`PVE/API2/Storage/Config.pm`, `read`).
            out.push(require(
                &why,
                vec![pp(format!("/storage/{}", s.storage), "Datastore.Allocate")],
            ));
        }
        Verb::Create(c) => {
            let vm = format!("/vms/{}", c.vmid);
            out.push(require(&why, vec![pp(&vm, "VM.Allocate")]));
            if c.params.get("start").map(String::as_str) == Some("1") {
                out.push(require(&why, vec![pp(&vm, "VM.PowerMgmt")]));
            }
            // PVE 9 creates an unprivileged container unless `unprivileged=0` is sent
            // (pve-container create_vm: `$unprivileged = 1 if !defined($unprivileged)`).
            if c.guest_type == GuestType::Lxc
                && c.params.get("unprivileged").map(String::as_str) == Some("0")
            {
                out.push(require(&why, vec![pp("/", "Sys.Modify")]));
            }
            for (key, value) in &c.params {
                match (c.guest_type, key.as_str()) {
                    (_, "start" | "pool" | "vmid") => {}
                    (_, "storage") => out.push(require(
                        &why,
                        vec![pp(format!("/storage/{value}"), "Datastore.AllocateSpace")],
                    )),
                    (GuestType::Lxc, "ostemplate") => {
                        if let Some(storage) = storage_of(value) {
                            out.push(volume_access(storage, &why));
                        }
                    }
                    (GuestType::Lxc, "password" | "ssh-public-keys" | "unprivileged") => {}
                    _ => out.extend(config_requirements(
                        c.guest_type,
                        c.vmid,
                        key,
                        Some(value),
                        None,
                        Write::Create,
                        &why,
                    )),
                }
            }
            // Written once the guest is in its pool (`tags`).
            for (key, value) in &c.after {
                out.extend(config_requirements(
                    c.guest_type,
                    c.vmid,
                    key,
                    Some(value),
                    None,
                    Write::Update,
                    &why,
                ));
            }
        }
        Verb::Clone(c) => {
            out.push(require(
                &why,
                vec![
                    pp(format!("/vms/{}", c.source_vmid), "VM.Clone"),
                    pp(format!("/vms/{}", c.vmid), "VM.Allocate"),
                ],
            ));
            let source = ResourceId::new(Kind::TemplateVm, c.source.clone());
            if let Some(template) = rendered(&source) {
                for owned in template.owned.values() {
                    if let Rule::Disk(rule) = &owned.rule {
                        out.push(require(
                            &why,
                            vec![pp(
                                format!("/storage/{}", rule.storage),
                                "Datastore.AllocateSpace",
                            )],
                        ));
                    }
                }
            }
            if let Some(own) = rendered(&action.resource) {
                for (key, owned) in &own.owned {
                    out.extend(config_requirements(
                        GuestType::Qemu,
                        c.vmid,
                        key,
                        Some(&owned.value),
                        None,
                        Write::Update,
                        &why,
                    ));
                }
            }
        }
        Verb::Update(u) => {
            let observed = |key: &str| {
                u.changes
                    .iter()
                    .find(|c| c.field == key)
                    .map(|c| c.observed.as_str())
            };
            for (key, value) in &u.set {
                out.extend(config_requirements(
                    u.guest_type,
                    u.vmid,
                    key,
                    Some(value),
                    observed(key),
                    Write::Update,
                    &why,
                ));
            }
            for key in &u.delete {
                out.extend(config_requirements(
                    u.guest_type,
                    u.vmid,
                    key,
                    None,
                    observed(key),
                    Write::Update,
                    &why,
                ));
            }
            if u.regenerate_cloudinit {
                // qemu-server `cloudinit_update` (PUT .../cloudinit): VM.Config.Cloudinit.
                let vm = format!("/vms/{}", u.vmid);
                out.push(require(&why, vec![pp(&vm, "VM.Config.Cloudinit")]));
            }
            if !u.grow.is_empty() {
                let vm = format!("/vms/{}", u.vmid);
                out.push(require(&why, vec![pp(&vm, "VM.Config.Disk")]));
                // pve-container's `resize_vm` runs check_ct_modify_config_perm over its
                // remaining `disk` parameter: VM.Config.Options.
                if u.guest_type == GuestType::Lxc {
                    out.push(require(&why, vec![pp(&vm, "VM.Config.Options")]));
                }
            }
        }
        Verb::Shutdown(g) | Verb::Start(g) | Verb::Reboot(g) => {
            out.push(require(
                &why,
                vec![pp(format!("/vms/{}", g.vmid), "VM.PowerMgmt")],
            ));
        }
        Verb::Promote(g) | Verb::Delete(g) => {
            out.push(require(
                &why,
                vec![pp(format!("/vms/{}", g.vmid), "VM.Allocate")],
            ));
        }
        Verb::Pool(p) => {
            // pve-manager @ 14a22df3 `PVE/API2/Pool.pm` `update_pool`: the schema's
            // `Pool.Allocate` on `/pool/<pool>`, `check_perm_modify` on `/vms/<vmid>`
            // (`check_any` of Permissions.Modify and VM.Allocate), and with `allow-move`
            // `Pool.Allocate` on the pool the guest leaves.
            out.push(require(
                &why,
                vec![pp(format!("/pool/{}", p.pool), "Pool.Allocate")],
            ));
            let vm = format!("/vms/{}", p.vmid);
            out.push(require_any(
                &why,
                vec![
                    vec![pp(&vm, "VM.Allocate")],
                    vec![pp(&vm, "Permissions.Modify")],
                ],
            ));
            if let Some(from) = &p.from {
                out.push(require(
                    &why,
                    vec![pp(format!("/pool/{from}"), "Pool.Allocate")],
                ));
            }
        }
    }
    out
}

/// Each requirement on `/vms/<vmid>` of a guest this plan creates or clones into a pool
/// with, first, the same privileges on `/pool/<pool>` as an alternative. PVE checks a new
/// guest's privileges on its pool as well as on `/vms/<vmid>` (qemu-server @ e6352be6
/// `API2/Qemu.pm` `create_vm`: `VM.Allocate` on `/vms/<vmid>` or `/pool/<pool>`, the config
/// keys through `check_vm_perm($vmid, $pool)`; `clone_vm`: `'or', ['perm', '/vms/{newid}',
/// ...], ['perm', '/pool/{pool}', ...]`; pve-container @ 94f5585 `API2/LXC.pm` likewise), and
/// once created the guest is a member and `/vms/<vmid>` inherits what the pool grants
/// (pve-access-control @ 5ccd07d `RPCEnvironment.pm` `compile_acl_path`), so its start or
/// promote later in the pass is allowed by the pool too. Before the create PVE lists nothing
/// for `/vms/<vmid>`.
fn or_on_pool(
    requirements: Vec<Requirement>,
    pools: &BTreeMap<String, String>,
) -> Vec<Requirement> {
    let on_pool = |p: &PathPrivilege| {
        pools
            .get(&p.path)
            .map(|pool| pp(format!("/pool/{pool}"), &p.privilege))
    };
    requirements
        .into_iter()
        .map(|mut req| {
            let mut options: Vec<Vec<PathPrivilege>> = req
                .options
                .iter()
                .filter(|o| o.iter().any(|p| on_pool(p).is_some()))
                .map(|o| {
                    o.iter()
                        .map(|p| on_pool(p).unwrap_or_else(|| p.clone()))
                        .collect()
                })
                .collect();
            if !options.is_empty() {
                options.append(&mut req.options);
                req.options = options;
            }
            req
        })
        .collect()
}

/// `spec.pool` of a guest resource.
fn declared_pool(resource: &proxops_core::manifest::Resource) -> Option<&str> {
    match resource.spec.as_ref()? {
        Spec::Vm(spec) => spec.pool.as_deref(),
        Spec::Lxc(spec) => spec.pool.as_deref(),
        Spec::Artifact(_) => None,
    }
}

/// Checks storages against what the manifests use, given each node's storage listing
/// (`Err` when the listing failed).
pub fn check_storages(
    uses: &Uses,
    listings: &BTreeMap<String, Result<Vec<proxops_pve::StorageInfo>, String>>,
) -> Vec<Item> {
    let mut items = Vec::new();
    for ((node, storage), contents) in &uses.storages {
        let subject = format!("{storage} on {node}");
        let users: BTreeSet<&String> = contents.values().flatten().collect();
        let users = users
            .into_iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        let listing = match listings.get(node) {
            Some(Ok(listing)) => listing,
            Some(Err(e)) => {
                items.push(Item::problem(
                    "storage",
                    subject,
                    format!("the storage listing of {node} failed: {e}"),
                    "check that the node is online and the token has Datastore.Audit on /storage",
                ));
                continue;
            }
            None => continue,
        };
        let Some(info) = listing.iter().find(|s| &s.storage == storage) else {
            items.push(Item::problem(
                "storage",
                subject,
                format!("storage `{storage}` does not exist on {node} (used by {users})"),
                format!(
                    "add the storage in Datacenter → Storage (and allow node {node}), or fix \
                     `storage` in the manifests; PVE also hides storages the token lacks \
                     Datastore.Audit on (/storage/{storage})"
                ),
            ));
            continue;
        };
        let lacking: Vec<&str> = contents
            .keys()
            .filter(|c| !info.has_content(**c))
            .map(|c| c.as_str())
            .collect();
        let needed: Vec<&str> = contents.keys().map(|c| c.as_str()).collect();
        if info.enabled == Some(false) || info.active == Some(false) {
            items.push(Item::problem(
                "storage",
                subject.clone(),
                format!("storage `{storage}` is disabled or not active on {node}"),
                "enable the storage, or check why it is not reachable from this node",
            ));
        }
        if lacking.is_empty() {
            items.push(Item::ok(
                "storage",
                subject,
                format!("has content {}", needed.join(", ")),
            ));
        } else {
            items.push(Item::problem(
                "storage",
                subject,
                format!(
                    "content {} missing (has {}; needed by {users})",
                    lacking.join(", "),
                    if info.content.is_empty() {
                        "none"
                    } else {
                        &info.content
                    }
                ),
                format!(
                    "pvesm set {storage} --content {}",
                    merged_content(&info.content, &lacking)
                ),
            ));
        }
    }
    items
}

fn merged_content(have: &str, add: &[&str]) -> String {
    let mut all: Vec<String> = have
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    for a in add {
        if !all.iter().any(|h| h == a) {
            all.push((*a).to_owned());
        }
    }
    all.join(",")
}

/// The command that grants `need` to the token: for the documented `--privsep 0` token an
/// ACL entry for its **user** (such a token has exactly its user's privileges and ignores
/// entries for the token itself, pve-access-control `RPCEnvironment::permissions`); a token
/// with privilege separation needs it on both.
fn grant_hint(token_id: &str, need: &PathPrivilege) -> String {
    let user = token_id.split_once('!').map_or(token_id, |(u, _)| u);
    let grant = |flag: &str, who: &str| {
        format!(
            "pveum acl modify {} {flag} '{who}' --roles <a role with {}>",
            need.path, need.privilege
        )
    };
    if user == token_id {
        return grant("--users", user);
    }
    format!(
        "{} (with privilege separation also {})",
        grant("--users", user),
        grant("--tokens", token_id)
    )
}

/// Turns the missing privileges into checklist items (one ok item when nothing is missing).
pub fn privilege_items(token_id: &str, requirements: usize, missing: &[Missing]) -> Vec<Item> {
    if missing.is_empty() {
        return vec![Item::ok(
            "privilege",
            token_id,
            format!("holds every privilege the plan and its reads need ({requirements} checks)"),
        )];
    }
    missing
        .iter()
        .map(|m| {
            let mut detail = format!(
                "{token_id} lacks {} on {} (needed for {})",
                m.need.privilege,
                m.need.path,
                m.needed_for.join("; ")
            );
            if !m.alternatives.is_empty() {
                detail.push_str(&format!("; or grant {}", m.alternatives.join(", or ")));
            }
            Item::problem(
                "privilege",
                format!("{} on {}", m.need.privilege, m.need.path),
                detail,
                grant_hint(token_id, &m.need),
            )
        })
        .collect()
}

/// The major version of a PVE `release` (`9.1`) or `version` (`9.1.1`).
fn major_version(text: &str) -> Option<u32> {
    text.split(['.', '-']).next()?.trim().parse().ok()
}

/// Reading `GET /cluster/ha/status/current`, which every agent pass does (`agent::ha`):
/// `Sys.Audit` on `/` (pve-ha-manager @ b71218f, `src/PVE/API2/HA/Status.pm`, `status`).
fn ha_requirement() -> Requirement {
    require(
        "read PVE's HA status each agent pass",
        vec![pp("/", "Sys.Audit")],
    )
}

/// The HA line: without `Sys.Audit` on `/` the agent goes on (a node in HA maintenance is
/// not noticed and each pass records `ha-status-unknown`), so it is a warning.
fn ha_item(token_id: &str, ha: &Requirement, granted: &Granted) -> Item {
    if missing_privileges(std::slice::from_ref(ha), granted).is_empty() {
        return Item::ok(
            "ha",
            "status",
            format!("{token_id} may read PVE's HA status (Sys.Audit on /)"),
        );
    }
    Item::warning(
        "ha",
        "status",
        format!(
            "{token_id} lacks Sys.Audit on / (needed to read PVE's HA status each agent pass,              GET /cluster/ha/status/current): a node in HA maintenance would not be noticed,              writes to it go on and each pass records an ha-status-unknown finding"
        ),
        format!(
            "if you use HA: {}",
            grant_hint(token_id, &pp("/", "Sys.Audit"))
                .replace("<a role with Sys.Audit>", "PVEAuditor")
        ),
    )
}

/// Adds the backup storage, with content `backup`, on each node the plan deletes a guest
/// on, when `net` backs deletes up (`execute/backup.rs` checks the same before vzdump).
fn backup_storage_uses(used: &mut Uses, plan: &Plan, desired: &DesiredState, net: &SafetyNet) {
    for action in plan.actions() {
        if let Some(safety_net::First::Backup { storage, .. }) = net.first(action, desired) {
            used.storages
                .entry((action.node.clone(), storage))
                .or_default()
                .entry(ContentType::Backup)
                .or_default()
                .insert(format!("backup before deleting {}", action.resource));
        }
    }
}

/// The SOPS line: the references resolved, or why they cannot be (the agent would refuse
/// every pass of the cluster then, before writing anything).
fn secrets_item(outcome: Option<&Result<usize, String>>) -> Option<Item> {
    Some(match outcome? {
        Ok(guests) => Item::ok(
            "secrets",
            "SOPS",
            format!(
                "the cloud-init references of {guests} guest(s) resolve from the cluster's document"
            ),
        ),
        Err(why) => Item::problem(
            "secrets",
            "SOPS",
            why.clone(),
            "fix the reference or the document, or give the agent its age identity \
             ([secrets] age_key_file, SOPS_AGE_KEY_FILE or the age-identity credential)",
        ),
    })
}

/// What `check` needs from the caller.
pub struct Inputs<'a> {
    /// The PVE API.
    pub pve: &'a PveClient,
    /// The token id, for messages.
    pub token_id: &'a str,
    /// `[pve] url`: plain `http://` (allowed by `allow_plain_http`) is reported.
    pub pve_url: &'a str,
    /// The configured node scope.
    pub scope: &'a NodeScope,
    /// The desired state (None when the repository did not load; the item says why).
    pub desired: Option<&'a DesiredState>,
    /// The plan computed for it, when it loaded.
    pub plan: Option<&'a Plan>,
    /// Resolving the cloud-init references from the cluster's SOPS document: `None` when no
    /// manifest uses one, else how many guests were resolved or why none could be.
    pub secrets: Option<Result<usize, String>>,
    /// What agent.toml's safety net turns on (snapshots, backups, guest agent health).
    pub safety_net: &'a SafetyNet,
}

/// Runs every check against PVE.
pub async fn run(inputs: Inputs<'_>) -> Report {
    let mut items = Vec::new();
    // SECURITY-AUDIT.md M3: over http:// the token crosses the wire in clear.
    if inputs
        .pve_url
        .get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
    {
        items.push(Item::problem(
            "pve",
            "url",
            format!(
                "{} is plain http: the API token crosses the network in clear",
                inputs.pve_url
            ),
            "use https:// outside a test rig (allow_plain_http = true allows http)",
        ));
    }
    let pve = inputs.pve;
    let pve_major = match pve.version().await {
        Ok(v) => {
            items.push(Item::ok(
                "pve",
                "version",
                format!("Proxmox VE {} (release {})", v.version, v.release),
            ));
            major_version(&v.release).or_else(|| major_version(&v.version))
        }
        Err(e) => {
            let fix = if e.is_auth_failure() {
                "check [pve] token_id and the secret in token_secret_file"
            } else {
                "check [pve] url and the TLS trust settings (ca_file, fingerprint)"
            };
            items.push(Item::problem(
                "pve",
                "connection",
                format!("GET /version failed: {e}"),
                fix,
            ));
            return Report::new(items);
        }
    };
    let nodes = match pve.nodes().await {
        Ok(nodes) => nodes,
        Err(e) => {
            items.push(Item::problem(
                "node",
                "listing",
                format!("GET /nodes failed: {e}"),
                "check that the token may read /nodes",
            ));
            return Report::new(items);
        }
    };
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    match inputs.scope {
        NodeScope::Node(node) => {
            match nodes.iter().find(|n| &n.node == node) {
                Some(info) if info.is_online() => {
                    items.push(Item::ok("node", node.clone(), "exists and is online"));
                }
                Some(info) => items.push(Item::problem(
                    "node",
                    node.clone(),
                    format!("exists but is {}", info.status),
                    "bring the node online before applying",
                )),
                None => items.push(Item::problem(
                    "node",
                    node.clone(),
                    format!(
                        "no such node (the cluster has {})",
                        nodes
                            .iter()
                            .map(|n| n.node.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    "set `node` in agent.toml to one of the cluster's nodes, or \"*\"",
                )),
            }
            wanted.insert(node.clone());
        }
        NodeScope::All => {
            let listed: Vec<String> = nodes
                .iter()
                .map(|n| format!("{} ({})", n.node, n.status))
                .collect();
            items.push(Item::ok(
                "node",
                "*",
                format!("the whole cluster: {}", listed.join(", ")),
            ));
        }
    }
    let (Some(desired), Some(plan)) = (inputs.desired, inputs.plan) else {
        return Report::new(items);
    };
    let title = desired
        .cluster
        .as_ref()
        .map_or_else(|| "manifests".to_owned(), |c| format!("cluster {c}"));
    items.push(Item::ok(
        "repository",
        title,
        format!(
            "{} resources valid; the plan has {} actions",
            desired.manifest.len(),
            plan.actions().count()
        ),
    ));
    items.extend(secrets_item(inputs.secrets.as_ref()));
    if let Some(reason) = &plan.aborted {
        items.push(Item::problem(
            "repository",
            "plan",
            format!("the plan was aborted: {reason}"),
            "fix what PVE reported, then run `proxops check` again",
        ));
    }
    // Nodes the manifests place resources on.
    for resource in desired.manifest.resources() {
        let placed: Vec<&String> = match &resource.placement {
            Placement::Guest { node, .. } => vec![node],
            Placement::Artifact { nodes, .. } => nodes.iter().collect(),
        };
        for node in placed {
            if inputs.scope.includes(node) {
                wanted.insert(node.clone());
            }
        }
    }
    for node in &wanted {
        if !nodes.iter().any(|n| &n.node == node) && inputs.scope == &NodeScope::All {
            items.push(Item::problem(
                "node",
                node.clone(),
                "the manifests place resources on a node the cluster does not have",
                "fix `spec.node` / `spec.nodes` in the manifests",
            ));
        }
    }

    let mut used = uses(desired, inputs.scope);
    backup_storage_uses(&mut used, plan, desired, inputs.safety_net);
    let mut listings = BTreeMap::new();
    for (node, _) in used.storages.keys() {
        if listings.contains_key(node) || !nodes.iter().any(|n| &n.node == node) {
            continue;
        }
        let listing = pve.storages(node).await.map_err(|e| e.to_string());
        listings.insert(node.clone(), listing);
    }
    items.extend(check_storages(&used, &listings));
    items.extend(check_bridges(pve, &used, &nodes).await);

    let mut requirements = read_requirements(desired, inputs.scope);
    requirements.extend(plan_requirements_with(
        plan,
        desired,
        inputs.safety_net,
        pve_major,
    ));
    let ha = ha_requirement();
    let asked: Vec<Requirement> = requirements.iter().chain([&ha]).cloned().collect();
    match granted(pve, &asked).await {
        Ok(granted) => {
            let missing = missing_privileges(&requirements, &granted);
            items.extend(privilege_items(
                inputs.token_id,
                requirements.len(),
                &missing,
            ));
            items.push(ha_item(inputs.token_id, &ha, &granted));
            let changes = tag_changes(plan);
            if !changes.is_empty() {
                let options = pve
                    .execute(&cluster_options())
                    .await
                    .map_err(|e| e.to_string());
                items.extend(check_tags(&changes, &options, &granted));
            }
        }
        Err(e) => items.push(Item::problem(
            "privilege",
            inputs.token_id,
            format!("GET /access/permissions failed: {e}"),
            "check the connection; every token may read its own permissions",
        )),
    }
    Report::new(items)
}

/// The tags a plan adds or removes: tag → the actions doing so, plus whether the action is
/// a VM create (see [`check_tags`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TagChanges {
    /// tag → the plan steps that add or remove it.
    pub tags: BTreeMap<String, BTreeSet<String>>,
    /// The VM creates that set tags.
    pub vm_creates: BTreeSet<String>,
}

impl TagChanges {
    fn is_empty(&self) -> bool {
        self.tags.is_empty() && self.vm_creates.is_empty()
    }
}

fn split_tag_list(text: &str) -> BTreeSet<String> {
    text.split([';', ',', ' '])
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The tags the plan's creates and updates change (pve-guest-common
/// `assert_tag_permissions` checks only tags whose count changes).
pub fn tag_changes(plan: &Plan) -> TagChanges {
    let mut out = TagChanges::default();
    for action in plan.actions() {
        let why = format!(
            "{} {} on {}",
            action.verb.name(),
            action.resource,
            action.node
        );
        let (old, new) = match &action.verb {
            Verb::Create(c) => {
                let Some(tags) = c.params.get("tags") else {
                    continue;
                };
                if c.guest_type == GuestType::Qemu {
                    out.vm_creates.insert(why.clone());
                }
                (BTreeSet::new(), split_tag_list(tags))
            }
            Verb::Update(u) => {
                let Some(tags) = u.set.get("tags") else {
                    continue;
                };
                let old = u
                    .changes
                    .iter()
                    .find(|c| c.field == "tags")
                    .map(|c| split_tag_list(&c.observed))
                    .unwrap_or_default();
                (old, split_tag_list(tags))
            }
            _ => continue,
        };
        for tag in old.symmetric_difference(&new) {
            out.tags.entry(tag.clone()).or_default().insert(why.clone());
        }
    }
    out
}

/// `GET /cluster/options` (pve-manager PVE/API2/Cluster.pm `get_options`; not among
/// `proxops-pve`'s builders): the datacenter options, all of them only with `Sys.Audit` on
/// `/`, and `allowed-tags` for everyone.
fn cluster_options() -> Request {
    Request {
        method: Method::Get,
        path: "/cluster/options".to_owned(),
        template: "/cluster/options",
        query: Vec::new(),
        form: Vec::new(),
    }
}

/// Whether the cluster's tag settings let the token make the plan's tag changes, as
/// pve-guest-common `assert_tag_permissions` / `get_allowed_tags` decide (src/PVE/
/// GuestHelpers.pm @ 4a8f6cb): with `Sys.Modify` on `/` every tag; otherwise never a
/// `registered-tags` one, and, unless `user-tag-access` says `user-allow=free` (PVE's
/// default), only those in `allowed-tags`. PVE 9's VM create also checks a tag of its own
/// making (qemu-server `create_vm` passes `{}` as the old tags, which `split_list` turns into
/// `HASH(0x…)`), so with any mode but `free` every VM create with tags is refused to a token
/// without `Sys.Modify`. Without `Sys.Audit` on `/` PVE hides the settings and only
/// `allowed-tags` is known: a tag outside it is reported as not checkable.
pub fn check_tags(
    changes: &TagChanges,
    options: &Result<Value, String>,
    granted: &Granted,
) -> Vec<Item> {
    let options = match options {
        Ok(v) => v,
        Err(e) => {
            return vec![Item::skipped(
                "tags",
                "datacenter",
                format!("GET /cluster/options failed: {e}"),
            )];
        }
    };
    if granted.holds("/", "Sys.Modify") {
        return vec![Item::ok(
            "tags",
            "datacenter",
            "the token holds Sys.Modify on /, which may set any tag",
        )];
    }
    let list = |v: Option<&Value>| -> BTreeSet<String> {
        match v {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            Some(Value::String(s)) => split_tag_list(s),
            _ => BTreeSet::new(),
        }
    };
    let allowed = list(options.get("allowed-tags"));
    let visible = granted.holds("/", "Sys.Audit");
    // `user-tag-access` is an object (`user-allow`, `user-allow-list`) or, from older
    // servers, its property string.
    let mode = match options.get("user-tag-access") {
        Some(Value::Object(o)) => o
            .get("user-allow")
            .and_then(Value::as_str)
            .map(str::to_owned),
        Some(Value::String(s)) => PropertyString::parse(s, None)
            .get("user-allow")
            .map(str::to_owned),
        _ => None,
    };
    let mode = match (mode, visible) {
        (Some(m), _) => Some(m),
        (None, true) => Some("free".to_owned()),
        (None, false) => None,
    };
    let registered = list(options.get("registered-tags"));
    let fix_tag = |tag: &str| {
        format!(
            "allow `{tag}` for users (Datacenter → Options → User Tag Access: add it to the              allow list, or `user-allow=free`) or drop it from the manifests; do not grant              Sys.Modify on /"
        )
    };
    let mut items = Vec::new();
    let mut unknown = Vec::new();
    for (tag, why) in &changes.tags {
        let needed_for = why.iter().cloned().collect::<Vec<_>>().join("; ");
        let refused = if registered.contains(tag) {
            Some("it is a registered tag".to_owned())
        } else {
            match mode.as_deref() {
                Some("free") => None,
                Some(m) if !allowed.contains(tag) => Some(format!(
                    "user-tag-access is user-allow={m} and it is not allowed"
                )),
                Some(_) => None,
                None if allowed.contains(tag) => None,
                None => {
                    unknown.push(tag.clone());
                    None
                }
            }
        };
        if let Some(reason) = refused {
            items.push(Item::problem(
                "tags",
                format!("tag {tag}"),
                format!(
                    "PVE refuses to set or remove tag `{tag}` without Sys.Modify on / ({reason}; \
                     needed for {needed_for})"
                ),
                fix_tag(tag),
            ));
        }
    }
    if let Some(m) = mode.as_deref()
        && m != "free"
        && !changes.vm_creates.is_empty()
    {
        items.push(Item::problem(
            "tags",
            "VM creates",
            format!(
                "with user-tag-access user-allow={m}, PVE 9 refuses every VM create that sets \
                 tags to a token without Sys.Modify on / (qemu-server create_vm checks an \
                 empty hash as the old tags), and ProxOps always sets `proxops` (needed for {})",
                changes
                    .vm_creates
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            "set user-allow=free (Datacenter → Options → User Tag Access); do not grant \
             Sys.Modify on /",
        ));
    }
    if !unknown.is_empty() {
        items.push(Item::skipped(
            "tags",
            "datacenter",
            format!(
                "not checked for {}: without Sys.Audit on / PVE hides user-tag-access and \
                 registered-tags; PVE's default (user-allow=free) allows them",
                unknown.join(", ")
            ),
        ));
    }
    if items.is_empty() {
        items.push(Item::ok(
            "tags",
            "datacenter",
            format!(
                "the {} tag(s) the plan sets are allowed",
                changes.tags.len()
            ),
        ));
    }
    items
}

async fn check_bridges(pve: &PveClient, used: &Uses, nodes: &[proxops_pve::NodeInfo]) -> Vec<Item> {
    let mut items = Vec::new();
    let mut per_node: BTreeMap<&String, Vec<(&String, &BTreeSet<String>)>> = BTreeMap::new();
    for ((node, bridge), users) in &used.bridges {
        per_node.entry(node).or_default().push((bridge, users));
    }
    for (node, bridges) in per_node {
        if !nodes.iter().any(|n| &n.node == node) {
            continue;
        }
        match pve.execute(&network_bridges(node)).await {
            Ok(list) => {
                let have: BTreeSet<&str> = list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|i| i.get("iface").and_then(Value::as_str))
                    .collect();
                for (bridge, users) in bridges {
                    let subject = format!("{bridge} on {node}");
                    if have.contains(bridge.as_str()) {
                        items.push(Item::ok("bridge", subject, "exists"));
                    } else {
                        let users: Vec<&str> = users.iter().map(String::as_str).collect();
                        items.push(Item::problem(
                            "bridge",
                            subject,
                            format!(
                                "no bridge `{bridge}` on {node} (used by {})",
                                users.join(", ")
                            ),
                            format!(
                                "create it on {node} (System → Network → Create → Linux \
                                 Bridge) or fix `bridge` in the manifests; if it exists, the \
                                 token cannot see it: PVE lists a bridge only to holders of \
                                 SDN.Use or SDN.Audit on /sdn/zones/localnetwork/{bridge} (or \
                                 one of its VLANs)"
                            ),
                        ));
                    }
                }
            }
            Err(e) if not_implemented(&e) => items.push(Item::skipped(
                "bridge",
                format!("{} on {node}", join_names(&bridges)),
                "not checked: PVE answered 501 to GET /nodes/{node}/network",
            )),
            Err(e) => items.push(Item::problem(
                "bridge",
                format!("{} on {node}", join_names(&bridges)),
                format!("GET /nodes/{node}/network failed: {e}"),
                "check that the node is online and reachable",
            )),
        }
    }
    items
}

fn join_names(bridges: &[(&String, &BTreeSet<String>)]) -> String {
    bridges
        .iter()
        .map(|(b, _)| b.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn not_implemented(e: &PveError) -> bool {
    e.status() == Some(501)
}

/// `GET /nodes/{node}/network?type=bridge` (not among `proxops-pve`'s builders, which follow
/// the vendored API subset; this endpoint is only in `apidoc-full.json`).
fn network_bridges(node: &str) -> Request {
    let encoded: String = node
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .collect();
    Request {
        method: Method::Get,
        path: format!("/nodes/{encoded}/network"),
        template: "/nodes/{node}/network",
        query: vec![("type".to_owned(), "bridge".to_owned())],
        form: Vec::new(),
    }
}

/// Asks PVE for the privileges on every path the requirements name: the full map once, then
/// `?path=` for each path the map does not list.
async fn granted(pve: &PveClient, requirements: &[Requirement]) -> Result<Granted, PveError> {
    let mut granted = Granted::default();
    granted.add_answer(
        &pve.execute(&proxops_pve::request::access_permissions(None, None))
            .await?,
    );
    let paths: BTreeSet<&str> = requirements
        .iter()
        .flat_map(|r| r.options.iter().flatten())
        .map(|p| p.path.as_str())
        .collect();
    for path in paths {
        if granted.lists(path) {
            continue;
        }
        let answer = pve
            .execute(&proxops_pve::request::access_permissions(Some(path), None))
            .await?;
        granted.add_answer(&answer);
        // PVE answers `{}` for a path where nothing is held; without this the nearest listed
        // ancestor would answer for it, which is wrong when a more specific ACL entry (or
        // NoAccess) overrides what that ancestor propagates.
        granted.paths.entry(path.to_owned()).or_default();
    }
    Ok(granted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxops_core::plan::Download;

    /// `GET /access/permissions` of a token whose role lacks `Datastore.AllocateTemplate`
    /// (PVEVMAdmin on `/vms`, PVEDatastoreUser on `/storage`, Sys.Audit on `/`), in PVE's
    /// answer shape.
    const RECORDED: &str = r#"{
        "/": {"Sys.Audit": 1},
        "/storage": {"Datastore.AllocateSpace": 1, "Datastore.Audit": 1},
        "/storage/local": {"Datastore.AllocateSpace": 1, "Datastore.Audit": 1},
        "/vms": {"VM.Allocate": 1, "VM.Audit": 1, "VM.Config.Disk": 1, "VM.Config.CPU": 1,
                 "VM.Config.Memory": 1, "VM.Config.Network": 1, "VM.Config.Options": 1,
                 "VM.PowerMgmt": 1, "VM.Clone": 1},
        "/nodes": {"Sys.Audit": 1, "Sys.AccessNetwork": 1}
    }"#;

    fn recorded() -> Granted {
        let mut g = Granted::default();
        g.add_answer(&serde_json::from_str(RECORDED).unwrap());
        g
    }

    fn download_plan() -> Plan {
        Plan {
            levels: vec![vec![Action {
                resource: ResourceId::new(Kind::Iso, "debian-13"),
                node: "pve1".into(),
                verb: Verb::Download(Download {
                    storage: "local".into(),
                    content: "iso".into(),
                    filename: "debian-13.iso".into(),
                    url: "https://example.org/debian-13.iso".into(),
                    checksum: None,
                    volid: "local:iso/debian-13.iso".into(),
                }),
                reason: "missing".into(),
            }]],
            ..Plan::default()
        }
    }

    #[test]
    fn a_token_without_allocate_template_is_told_the_privilege_and_storage_path() {
        let plan = download_plan();
        let reqs: Vec<Requirement> = plan
            .actions()
            .flat_map(|a| action_requirements(a, &|_| None))
            .collect();
        let missing = missing_privileges(&reqs, &recorded());
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert_eq!(
            missing[0].need,
            pp("/storage/local", "Datastore.AllocateTemplate")
        );
        assert_eq!(
            missing[0].needed_for,
            vec!["download ISO/debian-13 on pve1".to_owned()]
        );
        let items = privilege_items("proxops@pve!agent", reqs.len(), &missing);
        assert_eq!(items[0].status, Status::Problem);
        assert!(
            items[0]
                .detail
                .contains("lacks Datastore.AllocateTemplate on /storage/local"),
            "{}",
            items[0].detail
        );
        assert!(
            items[0]
                .fix
                .as_deref()
                .unwrap()
                .contains("pveum acl modify /storage/local")
        );
    }

    #[test]
    fn the_sys_access_network_alternative_satisfies_a_download() {
        let mut g = recorded();
        g.add_answer(&serde_json::json!({"/storage/local": {"Datastore.AllocateTemplate": 1}}));
        let reqs: Vec<Requirement> = download_plan()
            .actions()
            .flat_map(|a| action_requirements(a, &|_| None))
            .collect();
        assert!(missing_privileges(&reqs, &g).is_empty());
        // Without Sys.AccessNetwork on the node, that is what is reported, and the broad
        // alternative (Sys.Audit and Sys.Modify on /) is never proposed.
        let mut g2 = Granted::default();
        g2.add_answer(&serde_json::json!({"/": {"Sys.Audit": 1, "Datastore.AllocateTemplate": 1}}));
        let missing = missing_privileges(&reqs, &g2);
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].need, pp("/nodes/pve1", "Sys.AccessNetwork"));
        assert!(missing[0].alternatives.is_empty(), "{missing:?}");
        let items = privilege_items("proxops@pve!agent", reqs.len(), &missing);
        let fix = items[0].fix.as_deref().unwrap();
        assert!(
            fix.starts_with(
                "pveum acl modify /nodes/pve1 --users 'proxops@pve' --roles <a role with \
                 Sys.AccessNetwork>"
            ),
            "{fix}"
        );
        assert!(!fix.contains("Sys.Modify"), "{fix}");
    }

    #[test]
    fn privileges_propagate_from_the_nearest_listed_ancestor() {
        let g = recorded();
        assert!(g.holds("/vms/123", "VM.Allocate"));
        assert!(g.holds("/nodes/pve1", "Sys.Audit"));
        assert!(!g.holds("/sdn/zones/localnetwork/vmbr0", "SDN.Use"));
        let mut g = Granted::default();
        g.add_answer(&serde_json::json!({"/": {"SDN.Use": 0}, "/vms": {"VM.Audit": 1}}));
        assert!(g.holds("/", "SDN.Use"));
        assert!(!g.holds("/sdn/zones/localnetwork/vmbr0", "SDN.Use"));
        // A listed path answers for itself only: no fall-through to its parents.
        assert!(!g.holds("/vms", "VM.Allocate"));
    }

    #[test]
    fn config_keys_map_to_pve_privileges() {
        let reqs = config_requirements(
            GuestType::Qemu,
            100,
            "scsi0",
            Some("local-lvm:32,iothread=1"),
            None,
            Write::Update,
            "w",
        );
        let flat: Vec<&PathPrivilege> = reqs.iter().flat_map(|r| &r.options[0]).collect();
        assert_eq!(
            flat,
            vec![
                &pp("/vms/100", "VM.Config.Disk"),
                &pp("/storage/local-lvm", "Datastore.AllocateSpace")
            ]
        );
        let reqs = config_requirements(
            GuestType::Qemu,
            100,
            "net0",
            Some("virtio,bridge=vmbr1"),
            None,
            Write::Update,
            "w",
        );
        let flat: Vec<&PathPrivilege> = reqs.iter().flat_map(|r| &r.options[0]).collect();
        assert_eq!(
            flat,
            vec![
                &pp("/vms/100", "VM.Config.Network"),
                &pp("/sdn/zones/localnetwork/vmbr1", "SDN.Use")
            ]
        );
        let req =
            |t, key, value| config_requirements(t, 7, key, Some(value), None, Write::Update, "w");
        for (key, privilege) in [
            ("cores", "VM.Config.CPU"),
            ("memory", "VM.Config.Memory"),
            ("scsihw", "VM.Config.HWType"),
            ("tags", "VM.Config.Options"),
        ] {
            let reqs = req(GuestType::Qemu, key, "x");
            assert_eq!(
                reqs[0].options,
                vec![vec![pp("/vms/7", privilege)]],
                "{key}"
            );
        }
        // The cloud-init keys are any-of Cloudinit or Network (`check_vm_perm(..., 1)`).
        for key in ["sshkeys", "ipconfig0", "ciuser"] {
            assert_eq!(
                req(GuestType::Qemu, key, "x")[0].options,
                vec![
                    vec![pp("/vms/7", "VM.Config.Cloudinit")],
                    vec![pp("/vms/7", "VM.Config.Network")]
                ],
                "{key}"
            );
        }
        let reqs = req(GuestType::Lxc, "swap", "512");
        assert_eq!(reqs[0].options[0], vec![pp("/vms/7", "VM.Config.Memory")]);
    }

    fn lxc_create(params: &[(&str, &str)]) -> Action {
        Action {
            resource: ResourceId::new(Kind::Lxc, "dns"),
            node: "pve1".into(),
            verb: Verb::Create(proxops_core::plan::Create {
                vmid: 200,
                guest_type: GuestType::Lxc,
                params: params
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                grow: Vec::new(),
                after: Default::default(),
            }),
            reason: "missing".into(),
        }
    }

    #[test]
    fn check_does_not_ask_sys_modify_for_a_container_that_is_unprivileged_by_default() {
        let needs_sys_modify = |action: &Action| {
            action_requirements(action, &|_| None)
                .iter()
                .any(|r| r.options == vec![vec![pp("/", "Sys.Modify")]])
        };
        // PVE 9 creates an unprivileged container when `unprivileged` is not sent.
        assert!(!needs_sys_modify(&lxc_create(&[("memory", "512")])));
        assert!(!needs_sys_modify(&lxc_create(&[("unprivileged", "1")])));
        assert!(needs_sys_modify(&lxc_create(&[("unprivileged", "0")])));
    }

    #[test]
    fn a_vm_create_asks_storage_access_for_drives_but_no_drive_privilege() {
        let create = Action {
            resource: ResourceId::new(Kind::Vm, "web"),
            node: "pve1".into(),
            verb: Verb::Create(proxops_core::plan::Create {
                vmid: 100,
                guest_type: GuestType::Qemu,
                params: [
                    ("scsi0", "local-lvm:8"),
                    ("ide2", "local:iso/x.iso,media=cdrom"),
                    ("ide0", "local-lvm:cloudinit"),
                    ("net0", "virtio,bridge=vmbr0,tag=20"),
                    ("tags", "proxops"),
                ]
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
                grow: Vec::new(),
                after: Default::default(),
            }),
            reason: "missing".into(),
        };
        let flat: BTreeSet<PathPrivilege> = action_requirements(&create, &|_| None)
            .into_iter()
            .map(|r| r.options[0][0].clone())
            .collect();
        let expected: BTreeSet<PathPrivilege> = [
            pp("/vms/100", "VM.Allocate"),
            pp("/vms/100", "VM.Config.Options"),
            pp("/vms/100", "VM.Config.Network"),
            pp("/storage/local-lvm", "Datastore.AllocateSpace"),
            pp("/storage/local", "Datastore.AllocateSpace"),
            pp("/sdn/zones/localnetwork/vmbr0/20", "SDN.Use"),
        ]
        .into_iter()
        .collect();
        assert_eq!(flat, expected);
    }

    #[test]
    fn adding_a_cloud_init_drive_to_an_existing_vm_asks_cloudinit_and_cdrom() {
        let reqs = config_requirements(
            GuestType::Qemu,
            100,
            "ide0",
            Some("local-lvm:cloudinit"),
            None,
            Write::Update,
            "w",
        );
        assert_eq!(
            reqs[0].options,
            vec![vec![
                pp("/vms/100", "VM.Config.CDROM"),
                pp("/vms/100", "VM.Config.Cloudinit")
            ]]
        );
    }

    #[test]
    fn check_names_the_tags_the_datacenter_settings_refuse() {
        let changes = TagChanges {
            tags: [
                ("proxops", "create VM/web on pve1"),
                ("prod", "create VM/web on pve1"),
            ]
            .into_iter()
            .map(|(t, w)| (t.to_owned(), BTreeSet::from([w.to_owned()])))
            .collect(),
            vm_creates: BTreeSet::from(["create VM/web on pve1".to_owned()]),
        };
        let mut audit = Granted::default();
        audit.add_answer(&serde_json::json!({"/": {"Sys.Audit": 1}}));
        let options = Ok(serde_json::json!({
            "user-tag-access": {"user-allow": "list", "user-allow-list": ["proxops"]},
            "registered-tags": ["prod"],
            "allowed-tags": ["proxops"],
        }));
        let items = check_tags(&changes, &options, &audit);
        let subjects: Vec<&str> = items.iter().map(|i| i.subject.as_str()).collect();
        assert_eq!(subjects, vec!["tag prod", "VM creates"], "{items:?}");
        assert!(items.iter().all(|i| i.status == Status::Problem));
        // PVE's default (no user-tag-access) allows any unregistered tag.
        let free = Ok(serde_json::json!({"allowed-tags": []}));
        let only_proxops = TagChanges {
            tags: BTreeMap::from([(
                "proxops".to_owned(),
                BTreeSet::from(["create VM/web on pve1".to_owned()]),
            )]),
            vm_creates: changes.vm_creates,
        };
        let items = check_tags(&only_proxops, &free, &audit);
        assert_eq!(items[0].status, Status::Ok, "{items:?}");
        // Without Sys.Audit on / the settings are hidden: a tag outside allowed-tags cannot be
        // checked.
        let items = check_tags(&only_proxops, &free, &Granted::default());
        assert_eq!(items[0].status, Status::Skipped, "{items:?}");
    }

    #[test]
    fn storages_lacking_content_are_problems_with_a_pvesm_fix() {
        let mut uses = Uses::default();
        uses.storages
            .entry(("pve1".into(), "local".into()))
            .or_default()
            .entry(ContentType::Vztmpl)
            .or_default()
            .insert("CTTemplate/debian".into());
        uses.storages
            .entry(("pve1".into(), "nas".into()))
            .or_default()
            .entry(ContentType::Iso)
            .or_default()
            .insert("ISO/x".into());
        let listing: Vec<proxops_pve::StorageInfo> = serde_json::from_value(serde_json::json!([
            {"storage": "local", "type": "dir", "content": "iso,backup", "enabled": 1, "active": 1}
        ]))
        .unwrap();
        let listings = BTreeMap::from([("pve1".to_owned(), Ok(listing))]);
        let items = check_storages(&uses, &listings);
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].status, Status::Problem);
        assert_eq!(
            items[0].fix.as_deref(),
            Some("pvesm set local --content iso,backup,vztmpl")
        );
        assert!(items[1].detail.contains("does not exist on pve1"));
    }
}
