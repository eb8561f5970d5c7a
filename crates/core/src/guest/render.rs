//! A validated VM or LXC spec → the PVE config keys ProxOps owns for that guest
//! ([`RenderedConfig`]), each with its create-form value and the rule `compare` uses for it.
//!
//! Wire forms are the ones PVE 9.2 accepts (DESIGN.md §2.4–2.5, pve-api/LIVE-FACTS.md §1.3–1.6):
//! disks `<storage>:<GiB>` with options inside the drive string, image-seeded disks
//! `<storage>:0,import-from=<volid>`, `tag=` not `vlan=`, `sshkeys` percent-encoded, LXC
//! `net<N>=name=...`, `features=nesting=1`, `tpmstate0`. Absent tri-state options are not
//! owned; `false` is owned and written as `0`. Keys with no PVE write form are returned as
//! [`Unsent`] notes, never rendered. Nothing here reads a live config.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::GuestType;
use super::property::{bool_value, percent_encode};
use crate::desired::Manifest;
use crate::manifest::{
    Aio, Bios, ByteSize, CloudInitData, Discard, EfiTemplate, IpAssignment, LxcSpec, Machine,
    Media, Resource, SecureBoot, Spec, SshKeys, TpmVersion, VmSpec,
};
use crate::resource::{Kind, ResourceId};
use crate::secret::{Sealed, is_marker, marker};

/// The tag that marks a guest as created (owned) by ProxOps.
pub const OWNERSHIP_TAG: &str = "proxops";

/// Volume ids of the storage artifacts guests refer to (ISO, CTTemplate, DiskImage).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Artifacts {
    volids: BTreeMap<ResourceId, String>,
}

impl Artifacts {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every artifact of a desired state, with its `<storage>:<content>/<file>` volid.
    pub fn from_manifest(manifest: &Manifest) -> Self {
        let mut artifacts = Self::new();
        for resource in manifest.resources() {
            if let Some(Spec::Artifact(spec)) = &resource.spec {
                artifacts.insert(resource.id.clone(), spec.volid(resource.id.kind));
            }
        }
        artifacts
    }

    /// Records the volid of one artifact.
    pub fn insert(&mut self, id: ResourceId, volid: impl Into<String>) {
        self.volids.insert(id, volid.into());
    }

    /// Adds one artifact (builder form, for tests and small callers).
    #[must_use]
    pub fn with(mut self, kind: Kind, name: &str, volid: &str) -> Self {
        self.insert(ResourceId::new(kind, name), volid);
        self
    }

    /// The volid of the artifact `kind`/`name`.
    pub fn volid(&self, kind: Kind, name: &str) -> Option<&str> {
        self.volids
            .get(&ResourceId::new(kind, name))
            .map(String::as_str)
    }
}

/// How `compare` decides whether a live value matches an owned one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// Trimmed text; two numbers compare by value (`100` = `100.0`).
    Scalar,
    /// `1`/`0`; an absent live key counts as PVE's default when it has one. The first
    /// property-string token is read, so `agent: 1,type=virtio` is true.
    Bool {
        /// PVE's value when the key is absent.
        pve_default: Option<bool>,
    },
    /// A property string: every declared part is compared (a part absent live counts as PVE's
    /// default for it); live parts not declared are ignored when `ignore_extra`.
    Props {
        /// The key of the bare leading part (`file`, `cputype`, ...).
        bare_key: Option<&'static str>,
        /// Whether live parts ProxOps does not declare are left alone.
        ignore_extra: bool,
    },
    /// A qemu `net<N>`: model and declared parts; the MAC only when declared (any case).
    QemuNet,
    /// A qemu `machine`: `q35` is also satisfied by a versioned `pc-q35-<ver>` (PVE pins
    /// versions, e.g. for Windows guests), and `pc` by `pc-i440fx-<ver>` or `pc-<ver>`.
    Machine,
    /// A list compared as a set, split on `;`, `,` and whitespace.
    Set {
        /// Whether case is ignored (tags).
        lowercase: bool,
    },
    /// `sshkeys`: the percent-decoded lines compared as a set.
    SshKeys,
    /// `sshkeys` from `ssh-key-refs`: the owned value is a [`marker`]; these sealed,
    /// percent-encoded keys are compared as a decoded set and sent in its place.
    SealedSshKeys(Sealed),
    /// `cipassword` from `ci-password-ref`: the owned value is a [`marker`]; any live value
    /// satisfies it (PVE reports a fixed mask), so the sealed password is sent only when PVE
    /// has none.
    SealedPassword(Sealed),
    /// Text whose trailing newlines are ignored (`description`); empty matches absent.
    Description,
    /// A volume: compared by pool, size and declared options, never rewritten in create form.
    Disk(DiskRule),
    /// An LXC bind mount: host path (a change is a finding) and declared options.
    BindMount,
}

/// What ProxOps declares about one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskRule {
    /// What the volume is for.
    pub role: DiskRole,
    /// The storage (pool) it must be on.
    pub storage: String,
    /// Its declared size, when sizes are compared (data disks, rootfs, mount points).
    pub size: Option<ByteSize>,
    /// Declared option tokens (`iothread=1`, `mp=/data`, `efitype=4m`, ...), written in the live
    /// form when they differ.
    pub options: Vec<(String, String)>,
    /// The volid imported at create (`import-from`): create-only, PVE never reports it.
    pub import_from: Option<String>,
}

/// The purpose of a volume, which decides what `compare` looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskRole {
    /// A VM data disk (`scsiN`, `virtioN`, ...).
    Data,
    /// `efidisk0` (size set by PVE).
    Efi,
    /// `tpmstate0` (size set by PVE).
    Tpm,
    /// The cloud-init drive (size set by PVE, often not reported).
    CloudInit,
    /// An LXC `rootfs`.
    RootFs,
    /// An LXC `mpN` volume.
    MountPoint,
}

/// One owned key: its create-form value and how it is compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned {
    /// The value sent on create (or into an empty slot).
    pub value: String,
    /// How it is compared with the live value.
    pub rule: Rule,
}

/// A declared field that is not sent to PVE, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsent {
    /// The manifest field, e.g. `spec.cpu.flags`.
    pub field: String,
    /// Why it is not sent.
    pub reason: String,
}

/// Grow a volume to `size` (PVE's `PUT .../resize` with an absolute size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resize {
    /// The config key of the volume (`scsi0`, `rootfs`, `mp1`).
    pub slot: String,
    /// The size to grow it to.
    pub size: ByteSize,
}

/// Everything ProxOps owns in one guest's PVE config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedConfig {
    /// qemu or lxc.
    pub guest_type: GuestType,
    /// Whether the guest is declared as a template (TemplateVM, TemplateCT).
    pub template: bool,
    /// Drift-compared keys.
    pub owned: BTreeMap<String, Owned>,
    /// Keys sent only on create and never compared (`ostemplate`, `unprivileged`);
    /// `unprivileged` is checked for a "requires recreate" finding.
    pub create_only: BTreeMap<String, String>,
    /// The TemplateVM (`metadata.name`) to full-clone from instead of creating.
    pub clone: Option<String>,
    /// Volumes to grow after create (an imported image smaller than the declared size).
    pub grow_after_create: Vec<Resize>,
    /// Keys ProxOps does not write but must not delete either (`sshkeys` under `["*"]` or
    /// `ssh-key-refs`, `cipassword` under `ci-password-ref`).
    pub kept: BTreeSet<String>,
    /// Declared fields with no PVE write form.
    pub unsent: Vec<Unsent>,
    /// Values compared but never written (`features.keyctl`, `features.fuse`: `<key>.<part>`
    /// → value); a difference is a [`Drift`](super::FindingKind::Drift) finding.
    pub report_only: BTreeMap<String, String>,
    /// `spec.pool`: the resource pool, sent as `pool` on create and clone and compared with
    /// the pool `/cluster/resources` reports (`compare_pool`), never written to the config
    /// (PVE keeps membership in `user.cfg`, not in the guest config). `None` = not managed.
    pub pool: Option<String>,
}

impl RenderedConfig {
    fn new(guest_type: GuestType, template: bool) -> Self {
        Self {
            guest_type,
            template,
            owned: BTreeMap::new(),
            create_only: BTreeMap::new(),
            clone: None,
            grow_after_create: Vec::new(),
            kept: BTreeSet::new(),
            unsent: Vec::new(),
            report_only: BTreeMap::new(),
            pool: None,
        }
    }

    /// The parameters of `POST /nodes/{n}/qemu|lxc` (without `vmid` and `start`): every owned
    /// key in create form plus the create-only keys, and `pool` when one is declared
    /// (qemu-server `create_vm` and pve-container `create_vm` take it and call
    /// `add_vm_to_pool`).
    pub fn create_params(&self) -> BTreeMap<String, String> {
        let mut params: BTreeMap<String, String> = self
            .owned
            .iter()
            .map(|(k, o)| (k.clone(), o.value.clone()))
            .collect();
        params.extend(self.create_only.clone());
        if let Some(pool) = &self.pool {
            params.insert("pool".to_owned(), pool.clone());
        }
        params
    }

    /// The create-form value of an owned key.
    pub fn value(&self, key: &str) -> Option<&str> {
        self.owned.get(key).map(|o| o.value.as_str())
    }

    /// The sealed value behind `planned` when `planned` is the marker this config owns for
    /// `key`.
    pub fn unsealed(&self, key: &str, planned: &str) -> Option<&Sealed> {
        let owned = self.owned.get(key).filter(|o| o.value == planned)?;
        match &owned.rule {
            Rule::SealedSshKeys(sealed) | Rule::SealedPassword(sealed) => Some(sealed),
            _ => None,
        }
    }

    fn own(&mut self, key: impl Into<String>, value: impl Into<String>, rule: Rule) {
        self.owned.insert(
            key.into(),
            Owned {
                value: value.into(),
                rule,
            },
        );
    }

    fn own_bool(&mut self, key: &str, value: Option<bool>, pve_default: Option<bool>) {
        if let Some(b) = value {
            self.own(key, bool_value(b), Rule::Bool { pve_default });
        }
    }

    fn unsent(&mut self, field: &str, reason: &str) {
        self.unsent.push(Unsent {
            field: field.to_owned(),
            reason: reason.to_owned(),
        });
    }

    fn own_disk(&mut self, key: &str, rule: DiskRule, create_size: &str) {
        let mut value = format!("{}:{create_size}", rule.storage);
        if let Some(src) = &rule.import_from {
            value.push_str(&format!(",import-from={src}"));
        }
        for (k, v) in &rule.options {
            value.push_str(&format!(",{k}={v}"));
        }
        self.own(key, value, Rule::Disk(rule));
    }

    fn own_tags(&mut self, tags: &[String]) {
        let mut set: BTreeSet<String> = tags.iter().map(|t| t.to_lowercase()).collect();
        set.insert(OWNERSHIP_TAG.to_owned());
        let value = set.into_iter().collect::<Vec<_>>().join(";");
        self.own("tags", value, Rule::Set { lowercase: true });
    }

    fn own_extra(&mut self, extra: &BTreeMap<String, String>) {
        for (key, value) in extra {
            if self.owned.contains_key(key) || self.create_only.contains_key(key) {
                self.unsent(
                    &format!("spec.extra.{key}"),
                    "the key is already set from a structured field, which wins",
                );
            } else {
                self.own(key.clone(), value.clone(), Rule::Scalar);
            }
        }
    }
}

/// Renders any guest resource; `None` for artifacts and invalid resources.
pub fn render(resource: &Resource, artifacts: &Artifacts) -> Option<RenderedConfig> {
    match resource.spec.as_ref()? {
        Spec::Vm(spec) => Some(render_vm(
            spec,
            resource.id.kind,
            &resource.id.name,
            artifacts,
        )),
        Spec::Lxc(spec) => Some(render_lxc(
            spec,
            resource.id.kind,
            &resource.id.name,
            artifacts,
        )),
        Spec::Artifact(_) => None,
    }
}

/// The PVE config a VM or TemplateVM owns. `name` is `metadata.name`.
pub fn render_vm(spec: &VmSpec, kind: Kind, name: &str, artifacts: &Artifacts) -> RenderedConfig {
    let mut out = RenderedConfig::new(GuestType::Qemu, kind == Kind::TemplateVm);
    out.clone.clone_from(&spec.clone);
    out.pool.clone_from(&spec.pool);

    // PVE 9's `memory` is a property string (`[current=]<MiB>`).
    out.own(
        "memory",
        spec.memory.get().to_string(),
        Rule::Props {
            bare_key: Some("current"),
            ignore_extra: true,
        },
    );
    out.own("cores", spec.cpu.cores.to_string(), Rule::Scalar);
    let mut cpu = spec.cpu.cpu_type.clone();
    if let Some(hidden) = spec.options.hidden {
        cpu.push_str(&format!(",hidden={}", bool_value(hidden)));
    }
    out.own(
        "cpu",
        cpu,
        Rule::Props {
            bare_key: Some("cputype"),
            ignore_extra: true,
        },
    );
    if !spec.cpu.flags.is_empty() {
        out.unsent(
            "spec.cpu.flags",
            "accepted and never sent (as in the Go program); put QEMU arguments in extra.args",
        );
    }
    if spec.options.nested_virt.is_some() {
        out.unsent(
            "spec.options.nested-virt",
            "PVE has no key for nested virtualisation; use cpu type `host`",
        );
    }
    if let Some(scsihw) = &spec.scsihw {
        out.own("scsihw", scsihw.clone(), Rule::Scalar);
    }

    render_vm_hardware(spec, artifacts, &mut out);
    render_vm_disks(spec, artifacts, &mut out);
    for nic in &spec.networks {
        let mut value = nic.model.clone();
        if let Some(mac) = &nic.mac {
            value.push_str(&format!("={}", mac.to_uppercase()));
        }
        value.push_str(&format!(",bridge={}", nic.bridge));
        if let Some(tag) = nic.vlan {
            value.push_str(&format!(",tag={tag}"));
        }
        if let Some(rate) = nic.rate_limit {
            value.push_str(&format!(",rate={rate}"));
        }
        if let Some(firewall) = nic.firewall {
            value.push_str(&format!(",firewall={}", bool_value(firewall)));
        }
        out.own(format!("net{}", nic.slot), value, Rule::QemuNet);
    }
    render_vm_options(spec, &mut out);
    render_cloud_init_data(spec, &mut out);

    let pve_name = if spec.pve_name.is_empty() {
        name
    } else {
        &spec.pve_name
    };
    out.own("name", pve_name, Rule::Scalar);
    if let Some(description) = &spec.pve_description {
        out.own("description", description.clone(), Rule::Description);
    }
    out.own_tags(&spec.tags);
    out.own_extra(&spec.extra);
    out
}

fn render_vm_hardware(spec: &VmSpec, artifacts: &Artifacts, out: &mut RenderedConfig) {
    let hw = &spec.hardware;
    if let Some(machine) = hw.machine {
        // PVE has no machine type `i440fx`: its i440fx machine is `pc`.
        let value = match machine {
            Machine::I440fx => "pc",
            Machine::Q35 => "q35",
        };
        out.own("machine", value, Rule::Machine);
    }
    if let Some(bios) = hw.bios {
        let value = match bios {
            Bios::Seabios => "seabios",
            Bios::Ovmf => "ovmf",
        };
        out.own("bios", value, Rule::Scalar);
    }
    if let Some(display) = &hw.display {
        let rule = Rule::Props {
            bare_key: Some("type"),
            ignore_extra: true,
        };
        out.own("vga", display.clone(), rule);
    }
    if let Some(sockets) = hw.sockets {
        out.own("sockets", sockets.to_string(), Rule::Scalar);
    }
    out.own_bool("numa", hw.numa, Some(false));
    if let Some(serial0) = &hw.serial0 {
        out.own("serial0", serial0.clone(), Rule::Scalar);
    }
    if let Some(cdrom) = &hw.cdrom {
        let media = match cdrom.media {
            Media::Cdrom => "cdrom",
            Media::Disk => "disk",
        };
        let file = match &cdrom.iso {
            None => Some("none".to_owned()),
            Some(iso) => artifacts.volid(Kind::Iso, iso).map(str::to_owned),
        };
        match file {
            Some(file) => out.own(
                cdrom.slot.to_string(),
                format!("{file},media={media}"),
                Rule::Props {
                    bare_key: Some("file"),
                    ignore_extra: true,
                },
            ),
            None => out.unsent("spec.hardware.cdrom.iso", "the ISO is not declared"),
        }
    }
    if let Some(ci) = &hw.cloud_init {
        // Created as `<storage>:cloudinit`; PVE picks the size (LIVE-FACTS §1.4).
        let rule = DiskRule {
            role: DiskRole::CloudInit,
            storage: ci.storage.to_string(),
            size: None,
            options: Vec::new(),
            import_from: None,
        };
        out.own_disk("ide2", rule, "cloudinit");
    }
    if let Some(efi) = &hw.efi_disk {
        let mut options = Vec::new();
        if let Some(template) = efi.template {
            let efitype = match template {
                EfiTemplate::Byos => "byos",
                EfiTemplate::TwoM => "2m",
                EfiTemplate::FourM => "4m",
                EfiTemplate::EightM => "8m",
            };
            options.push(("efitype".to_owned(), efitype.to_owned()));
        }
        if let Some(secure_boot) = efi.secure_boot {
            let enrolled = secure_boot == SecureBoot::Enabled;
            options.push((
                "pre-enrolled-keys".to_owned(),
                bool_value(enrolled).to_owned(),
            ));
        }
        let rule = DiskRule {
            role: DiskRole::Efi,
            storage: efi.storage.to_string(),
            size: None,
            options,
            import_from: None,
        };
        // The schema: "SIZE_IN_GiB is ignored here"; PVE sizes the vars from the template.
        out.own_disk("efidisk0", rule, "1");
    }
    if let Some(tpm) = &hw.tpm {
        let version = match tpm.version {
            TpmVersion::V12 => "v1.2",
            TpmVersion::V20 => "v2.0",
        };
        let rule = DiskRule {
            role: DiskRole::Tpm,
            storage: tpm.storage.to_string(),
            size: None,
            options: vec![("version".to_owned(), version.to_owned())],
            import_from: None,
        };
        out.own_disk("tpmstate0", rule, "1");
    }
    for pci in &hw.pci_devices {
        let mut value = pci.device.clone();
        if let Some(pcie) = pci.pcie {
            value.push_str(&format!(",pcie={}", bool_value(pcie)));
        }
        let rule = Rule::Props {
            bare_key: Some("host"),
            ignore_extra: true,
        };
        out.own(format!("hostpci{}", pci.slot), value, rule);
    }
}

fn render_vm_disks(spec: &VmSpec, artifacts: &Artifacts, out: &mut RenderedConfig) {
    for (i, disk) in spec.disks.iter().enumerate() {
        let slot = disk.slot.to_string();
        let mut options = Vec::new();
        if let Some(iothread) = disk.iothread {
            options.push(("iothread".to_owned(), bool_value(iothread).to_owned()));
        }
        if let Some(discard) = disk.discard {
            let v = match discard {
                Discard::Ignore => "ignore",
                Discard::On => "on",
            };
            options.push(("discard".to_owned(), v.to_owned()));
        }
        if let Some(ssd) = disk.ssd {
            options.push(("ssd".to_owned(), bool_value(ssd).to_owned()));
        }
        if let Some(aio) = disk.aio {
            let v = match aio {
                Aio::Native => "native",
                Aio::Threads => "threads",
                Aio::IoUring => "io_uring",
            };
            options.push(("aio".to_owned(), v.to_owned()));
        }
        let import_from = match &disk.image {
            None => None,
            Some(image) => match artifacts.volid(Kind::DiskImage, image) {
                Some(volid) => Some(volid.to_owned()),
                None => {
                    out.unsent(
                        &format!("spec.disks[{i}].image"),
                        "the DiskImage is not declared",
                    );
                    continue;
                }
            },
        };
        let create_size = match (&import_from, disk.size) {
            // `import-from` requires the size 0 (LIVE-FACTS §1.3); the image decides.
            (Some(_), size) => {
                if let Some(size) = size {
                    out.grow_after_create.push(Resize {
                        slot: slot.clone(),
                        size,
                    });
                }
                "0".to_owned()
            }
            (None, Some(size)) => size.to_gib_string(),
            (None, None) => {
                out.unsent(&format!("spec.disks[{i}].size"), "a disk needs a size");
                continue;
            }
        };
        let rule = DiskRule {
            role: DiskRole::Data,
            storage: disk.storage.to_string(),
            size: disk.size,
            options,
            import_from,
        };
        out.own_disk(&slot, rule, &create_size);
    }
}

fn render_vm_options(spec: &VmSpec, out: &mut RenderedConfig) {
    let o = &spec.options;
    out.own_bool("onboot", o.onboot, Some(false));
    if let Some(startup) = &o.startup {
        let rule = Rule::Props {
            bare_key: None,
            ignore_extra: false,
        };
        out.own("startup", startup.clone(), rule);
    }
    out.own_bool("protection", o.protection, Some(false));
    out.own_bool("agent", o.agent, Some(false));
    out.own_bool("acpi", o.acpi, Some(true));
    out.own_bool("tablet", o.tablet, Some(true));
    if let Some(hotplug) = &o.hotplug {
        // `0` disables hotplug entirely; an empty list means exactly that.
        let value = if hotplug.is_empty() {
            "0".to_owned()
        } else {
            hotplug.join(",")
        };
        out.own("hotplug", value, Rule::Set { lowercase: true });
    }
    if let Some(order) = &o.boot_order {
        if order.is_empty() {
            out.unsent("spec.options.boot-order", "an empty boot order is not sent");
        } else {
            let rule = Rule::Props {
                bare_key: None,
                ignore_extra: false,
            };
            out.own("boot", format!("order={}", order.join(";")), rule);
        }
    }
}

fn render_cloud_init_data(spec: &VmSpec, out: &mut RenderedConfig) {
    let ci = &spec.cloud_init_data;
    if let Some(user) = &ci.ci_user {
        out.own("ciuser", user.clone(), Rule::Scalar);
    }
    match &ci.ssh_keys {
        SshKeys::Keys(keys) => {
            let mut seen = BTreeSet::new();
            let lines: Vec<&str> = keys
                .iter()
                .map(|k| k.trim())
                .filter(|k| !k.is_empty() && seen.insert(*k))
                .collect();
            out.own("sshkeys", percent_encode(&lines.join("\n")), Rule::SshKeys);
        }
        SshKeys::Pve => {
            out.kept.insert("sshkeys".to_owned());
        }
        SshKeys::Unmanaged => {}
    }
    render_secret_refs(ci, out);
    render_snippets(ci, out);
    if !ci.nameservers.is_empty() {
        let rule = Rule::Set { lowercase: false };
        out.own("nameserver", ci.nameservers.join(" "), rule);
    }
    if !ci.search_domains.is_empty() {
        let rule = Rule::Set { lowercase: true };
        out.own("searchdomain", ci.search_domains.join(" "), rule);
    }
    for ipc in &ci.ipconfigs {
        let mut parts = Vec::new();
        match &ipc.ip {
            Some(IpAssignment::Dhcp) => parts.push("ip=dhcp".to_owned()),
            Some(IpAssignment::Static(cidr)) if cidr.contains(':') => {
                parts.push(format!("ip6={cidr}"));
            }
            Some(IpAssignment::Static(cidr)) => parts.push(format!("ip={cidr}")),
            None => {}
        }
        match ipc.gateway {
            Some(IpAddr::V6(gw)) => parts.push(format!("gw6={gw}")),
            Some(IpAddr::V4(gw)) => parts.push(format!("gw={gw}")),
            None => {}
        }
        if !parts.is_empty() {
            let rule = Rule::Props {
                bare_key: Some("ip"),
                ignore_extra: false,
            };
            out.own(format!("ipconfig{}", ipc.nic), parts.join(","), rule);
        }
    }
}

/// `ssh-key-refs` and `ci-password-ref`: owned with a [`marker`] as their value once the
/// binary has resolved them (`ci.resolved`), so no plan ever holds a key or a password; left
/// alone (kept, noted as unsent) when nothing resolved them, as in a plan made without the
/// SOPS document.
fn render_secret_refs(ci: &CloudInitData, out: &mut RenderedConfig) {
    let resolved = ci.resolved.as_ref();
    if !ci.ssh_key_refs.is_empty() {
        let keys = resolved.map(|r| r.ssh_keys.as_slice()).unwrap_or_default();
        if keys.len() == ci.ssh_key_refs.len() {
            // Deduplicated in order, trimmed and encoded like plain `ssh-keys`.
            let mut seen = BTreeSet::new();
            let lines: Vec<&str> = keys
                .iter()
                .map(|k| k.expose().trim())
                .filter(|k| !k.is_empty() && seen.insert(*k))
                .collect();
            let sealed = Sealed::new(percent_encode(&lines.join("\n")));
            out.own(
                "sshkeys",
                marker(&ci.ssh_key_refs),
                Rule::SealedSshKeys(sealed),
            );
        } else {
            out.kept.insert("sshkeys".to_owned());
            out.unsent(
                "spec.cloud-init-data.ssh-key-refs",
                "not resolved: only a pass that reads the cluster's SOPS document writes them",
            );
        }
    }
    if let Some(reference) = &ci.ci_password_ref {
        match resolved.and_then(|r| r.password.as_ref()) {
            Some(password) => out.own(
                "cipassword",
                marker(std::slice::from_ref(reference)),
                Rule::SealedPassword(password.clone()),
            ),
            None => {
                out.kept.insert("cipassword".to_owned());
                out.unsent(
                    "spec.cloud-init-data.ci-password-ref",
                    "not resolved: only a pass that reads the cluster's SOPS document writes it",
                );
            }
        }
    }
}

/// `user-data`, `vendor-data`, `network-data`: `cicustom` names the resolved snippet files
/// (`user=<storage>:snippets/<file>,...`, see [`crate::snippet`]), compared as written (PVE
/// stores the string it was given). Unresolved (a plan made without the binary's snippet
/// step), `cicustom` is left alone.
fn render_snippets(ci: &CloudInitData, out: &mut RenderedConfig) {
    if ci.snippets.is_empty() {
        return;
    }
    match ci.snippets.resolved.as_ref().and_then(|r| r.cicustom()) {
        Some(cicustom) => out.own("cicustom", cicustom, Rule::Scalar),
        None => {
            out.kept.insert("cicustom".to_owned());
            out.unsent(
                "spec.cloud-init.user-data",
                "not resolved: only a pass that writes the snippets sets `cicustom`",
            );
        }
    }
}

/// What to send for `key` of guest `resource` when a plan carries `planned` for it: the
/// planned value itself, or the sealed value behind a [`marker`] (the executor calls this as
/// it builds the request, so the plan never holds the secret).
///
/// # Errors
/// A marker that nothing resolved (never sent: PVE would take it as the password).
pub fn sealed_value<'a>(
    resource: Option<&Resource>,
    key: &str,
    planned: &'a str,
) -> Result<std::borrow::Cow<'a, str>, String> {
    if !is_marker(planned) {
        return Ok(std::borrow::Cow::Borrowed(planned));
    }
    resource
        .and_then(|r| render(r, &Artifacts::new()))
        .and_then(|rendered| rendered.unsealed(key, planned).cloned())
        .map(|sealed| std::borrow::Cow::Owned(sealed.expose().to_owned()))
        .ok_or_else(|| {
            format!("{key}: {planned} was not resolved from the cluster's SOPS document; not sent")
        })
}

/// The PVE config an LXC or TemplateCT owns. `name` is `metadata.name`.
pub fn render_lxc(spec: &LxcSpec, kind: Kind, name: &str, artifacts: &Artifacts) -> RenderedConfig {
    let mut out = RenderedConfig::new(GuestType::Lxc, kind == Kind::TemplateCt);
    out.pool.clone_from(&spec.pool);
    match artifacts.volid(Kind::CtTemplate, &spec.template) {
        Some(volid) => {
            out.create_only
                .insert("ostemplate".to_owned(), volid.to_owned());
        }
        None => out.unsent("spec.template", "the CTTemplate is not declared"),
    }
    if let Some(unprivileged) = spec.options.unprivileged {
        out.create_only.insert(
            "unprivileged".to_owned(),
            bool_value(unprivileged).to_owned(),
        );
    }
    out.own("memory", spec.memory.get().to_string(), Rule::Scalar);
    if let Some(swap) = spec.swap {
        out.own("swap", swap.get().to_string(), Rule::Scalar);
    }
    out.own("cores", spec.cpu.cores.to_string(), Rule::Scalar);
    if spec.cpu.units.is_some() {
        out.unsent(
            "spec.cpu.units",
            "accepted and never sent (as in the Go program)",
        );
    }
    let root = DiskRule {
        role: DiskRole::RootFs,
        storage: spec.root.storage.to_string(),
        size: Some(spec.root.size),
        options: Vec::new(),
        import_from: None,
    };
    out.own_disk("rootfs", root, &spec.root.size.to_gib_string());
    for mp in &spec.mount_points {
        let mut options = vec![("mp".to_owned(), mp.mount_point.clone())];
        let flags = [
            ("ro", mp.read_only),
            ("backup", mp.backup),
            ("acl", mp.acl),
            ("quota", mp.quota),
            ("shared", mp.shared),
        ];
        for (key, value) in flags {
            if let Some(b) = value {
                options.push((key.to_owned(), bool_value(b).to_owned()));
            }
        }
        if let Some(mount_options) = &mp.mount_options {
            options.push(("mountoptions".to_owned(), mount_options.clone()));
        }
        let rule = DiskRule {
            role: DiskRole::MountPoint,
            storage: mp.storage.to_string(),
            size: Some(mp.size),
            options,
            import_from: None,
        };
        out.own_disk(&format!("mp{}", mp.slot), rule, &mp.size.to_gib_string());
    }
    for bind in &spec.bind_mounts {
        let mut value = format!("{},mp={}", bind.host_path, bind.mount_point);
        if let Some(ro) = bind.read_only {
            value.push_str(&format!(",ro={}", bool_value(ro)));
        }
        out.own(format!("mp{}", bind.slot), value, Rule::BindMount);
    }
    for nic in &spec.networks {
        let mut value = format!("name={},bridge={}", nic.iface, nic.bridge);
        if let Some(tag) = nic.tag {
            value.push_str(&format!(",tag={tag}"));
        }
        if let Some(hwaddr) = &nic.hwaddr {
            value.push_str(&format!(",hwaddr={}", hwaddr.to_uppercase()));
        }
        if let Some(rate) = nic.rate_limit {
            value.push_str(&format!(",rate={rate}"));
        }
        if let Some(firewall) = nic.firewall {
            value.push_str(&format!(",firewall={}", bool_value(firewall)));
        }
        if let Some(ip) = &nic.ip {
            let key = if ip.contains(':') { "ip6" } else { "ip" };
            value.push_str(&format!(",{key}={ip}"));
        }
        match nic.gw {
            Some(IpAddr::V6(gw)) => value.push_str(&format!(",gw6={gw}")),
            Some(IpAddr::V4(gw)) => value.push_str(&format!(",gw={gw}")),
            None => {}
        }
        if let Some(nic_type) = &nic.nic_type {
            value.push_str(&format!(",type={nic_type}"));
        }
        let rule = Rule::Props {
            bare_key: None,
            ignore_extra: true,
        };
        out.own(format!("net{}", nic.slot), value, rule);
    }
    let hostname = if spec.dns.hostname.is_empty() {
        name
    } else {
        &spec.dns.hostname
    };
    out.own("hostname", hostname, Rule::Scalar);
    if !spec.dns.nameservers.is_empty() {
        let rule = Rule::Set { lowercase: false };
        out.own("nameserver", spec.dns.nameservers.join(" "), rule);
    }
    if let Some(domain) = &spec.dns.domain {
        out.own(
            "searchdomain",
            domain.clone(),
            Rule::Set { lowercase: true },
        );
    }
    if let Some(arch) = spec.arch {
        // serde's spelling of the enum is PVE's.
        let value = serde_json::to_value(arch)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        out.own("arch", value, Rule::Scalar);
    }
    let o = &spec.options;
    out.own_bool("onboot", o.onboot, Some(false));
    out.own_bool("protection", o.protection, Some(false));
    out.own_bool("console", o.console, Some(true));
    if let Some(nesting) = o.nesting {
        let rule = Rule::Props {
            bare_key: None,
            ignore_extra: true,
        };
        out.own("features", format!("nesting={}", bool_value(nesting)), rule);
    }
    for (field, value) in [("keyctl", o.keyctl), ("fuse", o.fuse)] {
        if let Some(b) = value {
            out.report_only
                .insert(format!("features.{field}"), bool_value(b).to_owned());
            out.unsent(
                &format!("spec.options.{field}"),
                "no PVE 9 write form for an API token (features other than nesting are \
                 root@pam-only)",
            );
        }
    }
    if o.ttys.is_some() {
        out.unsent(
            "spec.options.ttys",
            "PVE has no `ttys` key (its key is `tty`)",
        );
    }
    if let Some(startup) = &o.startup {
        let rule = Rule::Props {
            bare_key: None,
            ignore_extra: false,
        };
        out.own("startup", startup.clone(), rule);
    }
    if let Some(description) = &spec.pve_description {
        out.own("description", description.clone(), Rule::Description);
    }
    out.own_tags(&spec.tags);
    out.own_extra(&spec.extra);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::guest::testing::{FULL_LXC, FULL_VM, artifacts, doc, manifest, rendered};

    /// The reference end-to-end case of issue 5: a DiskImage and a cloud-init VM.
    pub(crate) fn reference_docs() -> Vec<String> {
        vec![
            doc(
                "DiskImage",
                "debian-cloud",
                "  nodes: [pve1]\n  storage: local\n  filename: debian-13-genericcloud.qcow2\n  \
                 url: https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2\n",
            ),
            doc("VM", "ci-vm", REFERENCE_VM_SPEC),
        ]
    }

    pub(crate) const REFERENCE_VM_SPEC: &str = "  node: pve1
  vmid: 9100
  memory: 2GiB
  cpu: {type: host, cores: 2}
  disks:
    - {storage: local-lvm, image: debian-cloud, size: 8GiB, controller: virtio-scsi-single}
  networks:
    - {bridge: vmbr0}
  hardware:
    cloud-init: {enabled: true, storage: local-lvm}
  options: {agent: true}
  cloud-init-data:
    ci-user: debian
    ssh-keys:
      - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey1 ops@example
      - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey2 ci+bot@example
    nameservers: [10.0.0.1, 10.0.0.2]
    search-domains: [lab.example, example]
    ipconfigs:
      - {nic: 0, ip: 10.0.0.50/24, gateway: 10.0.0.1}
";

    fn reference() -> RenderedConfig {
        let manifest = manifest(&reference_docs());
        let vm = manifest
            .get(&ResourceId::new(Kind::Vm, "ci-vm"))
            .expect("declared");
        render(vm, &Artifacts::from_manifest(&manifest)).expect("a guest")
    }

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_reference_cloud_init_vm_renders_key_by_key_as_pve_expects() {
        let r = reference();
        assert_eq!(
            r.create_params(),
            params(&[
                ("agent", "1"),
                ("ciuser", "debian"),
                ("cores", "2"),
                ("cpu", "host"),
                ("ide2", "local-lvm:cloudinit"),
                ("ipconfig0", "ip=10.0.0.50/24,gw=10.0.0.1"),
                ("memory", "2048"),
                ("name", "ci-vm"),
                ("nameserver", "10.0.0.1 10.0.0.2"),
                ("net0", "virtio,bridge=vmbr0"),
                (
                    "scsi0",
                    "local-lvm:0,import-from=local:import/debian-13-genericcloud.qcow2"
                ),
                ("scsihw", "virtio-scsi-single"),
                ("searchdomain", "lab.example example"),
                (
                    "sshkeys",
                    "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIKey1%20ops%40example%0A\
                     ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIKey2%20ci%2Bbot%40example"
                ),
                ("tags", "proxops"),
            ])
        );
        assert_eq!(
            r.grow_after_create,
            [Resize {
                slot: "scsi0".into(),
                size: ByteSize::from_mib(8192)
            }]
        );
        assert!(r.create_only.is_empty());
        assert!(r.unsent.is_empty());
        assert_eq!(r.clone, None);
        assert!(!r.template);
    }

    #[test]
    fn every_vm_field_renders_in_pve_form_and_unsendable_fields_are_notes() {
        let r = rendered(FULL_VM, &artifacts());
        let expect = params(&[
            ("acpi", "1"),
            ("agent", "1"),
            ("args", "-cpu host"),
            ("balloon", "0"),
            ("bios", "ovmf"),
            ("boot", "order=scsi0;ide3;net0"),
            ("ciuser", "debian"),
            ("cores", "2"),
            ("cpu", "host,hidden=0"),
            ("description", "the web server"),
            ("efidisk0", "local-lvm:1,efitype=4m,pre-enrolled-keys=1"),
            ("hostpci0", "0000:01:00.0,pcie=1"),
            ("hotplug", "disk,network"),
            ("ide2", "local-lvm:cloudinit"),
            ("ide3", "local:iso/debian-13-netinst.iso,media=cdrom"),
            ("ipconfig0", "ip=10.0.0.10/24,gw=10.0.0.1"),
            ("ipconfig1", "ip=dhcp"),
            ("machine", "q35"),
            ("memory", "4096"),
            ("name", "web-1.lab"),
            ("nameserver", "10.0.0.1"),
            (
                "net0",
                "virtio=BC:24:11:00:00:01,bridge=vmbr0,tag=20,rate=100,firewall=1",
            ),
            ("net1", "virtio,bridge=vmbr1"),
            ("numa", "0"),
            ("onboot", "1"),
            ("protection", "0"),
            (
                "scsi0",
                "local-lvm:32,iothread=1,discard=on,ssd=1,aio=io_uring",
            ),
            ("scsihw", "virtio-scsi-single"),
            ("searchdomain", "lab.example"),
            ("serial0", "socket"),
            ("sockets", "1"),
            ("sshkeys", "ssh-ed25519%20AAAAC3Nza%20user%40host"),
            ("startup", "order=1"),
            ("tablet", "0"),
            ("tags", "prod;proxops;web"),
            ("tpmstate0", "local-lvm:1,version=v2.0"),
            (
                "virtio1",
                "local-lvm:0,import-from=local:import/debian-13-genericcloud.qcow2",
            ),
            ("vga", "std"),
        ]);
        assert_eq!(r.create_params(), expect);
        let unsent: Vec<&str> = r.unsent.iter().map(|u| u.field.as_str()).collect();
        assert_eq!(
            unsent,
            [
                "spec.cpu.flags",
                "spec.options.nested-virt",
                "spec.cloud-init-data.ci-password-ref"
            ]
        );
        assert!(r.kept.contains("cipassword"));
    }

    /// A VM with two key refs and a password ref, resolved as the binary would.
    fn resolved_refs_vm() -> Resource {
        let text = doc(
            "VM",
            "sealed",
            "  node: pve1\n  vmid: 130\n  memory: 1GiB\n  cpu: {type: host, cores: 1}\n  \
             disks: [{storage: local-lvm, size: 8GiB}]\n  cloud-init-data:\n    \
             ssh-key-refs: [cloud-init.ssh-keys.admin, cloud-init.ssh-keys.deploy]\n    \
             ci-password-ref: cloud-init.passwords.default\n",
        );
        let mut vm = crate::guest::testing::resource(&text);
        if let Some(Spec::Vm(spec)) = &mut vm.spec {
            spec.cloud_init_data.resolved = Some(crate::secret::ResolvedCloudInit {
                ssh_keys: vec![
                    Sealed::new("ssh-ed25519 AAAAadmin admin@example"),
                    Sealed::new("ssh-ed25519 AAAAdeploy deploy@example\n"),
                ],
                password: Some(Sealed::new("s3cr3t-Passw0rd")),
            });
        }
        vm
    }

    #[test]
    fn resolved_refs_render_as_markers_and_the_executor_gets_the_sealed_values() {
        let vm = resolved_refs_vm();
        let r = render(&vm, &Artifacts::new()).expect("a guest");
        let keys_marker = "(secret: cloud-init.ssh-keys.admin, cloud-init.ssh-keys.deploy)";
        let password_marker = "(secret: cloud-init.passwords.default)";
        assert_eq!(r.value("sshkeys"), Some(keys_marker));
        assert_eq!(r.value("cipassword"), Some(password_marker));
        assert!(r.unsent.is_empty() && r.kept.is_empty(), "{r:?}");
        let printed = format!("{r:?}{:?}", r.create_params());
        assert!(
            !printed.contains("AAAA") && !printed.contains("s3cr3t"),
            "{printed}"
        );

        assert_eq!(
            sealed_value(Some(&vm), "sshkeys", keys_marker).as_deref(),
            Ok(
                "ssh-ed25519%20AAAAadmin%20admin%40example%0Assh-ed25519%20AAAAdeploy%20deploy%40example"
            )
        );
        assert_eq!(
            sealed_value(Some(&vm), "cipassword", password_marker).as_deref(),
            Ok("s3cr3t-Passw0rd")
        );
        assert_eq!(
            sealed_value(Some(&vm), "memory", "1024").as_deref(),
            Ok("1024")
        );
        let refused = sealed_value(None, "cipassword", password_marker).unwrap_err();
        assert!(refused.contains("not resolved"), "{refused}");
    }

    #[test]
    fn resolved_keys_compare_as_a_set_and_the_password_only_when_pve_has_none() {
        use crate::guest::{CompareContext, GuestType, LiveConfig, compare};
        let r = render(&resolved_refs_vm(), &Artifacts::new()).expect("a guest");
        let live = |sshkeys: &str, password: Option<&str>| {
            let mut config = serde_json::json!({
                "memory": "1024", "cores": 1, "cpu": "host", "name": "sealed", "tags": "proxops",
                "scsi0": "local-lvm:vm-130-disk-0,size=8G", "sshkeys": sshkeys, "digest": "d",
            });
            if let Some(p) = password {
                config["cipassword"] = serde_json::Value::from(p);
            }
            LiveConfig::from_json(GuestType::Qemu, &config).expect("a config")
        };
        let reordered = "ssh-ed25519%20AAAAdeploy%20deploy%40example%0Assh-ed25519%20AAAAadmin%20admin%40example";
        let same = compare(
            &r,
            &live(reordered, Some("**********")),
            &CompareContext::default(),
        );
        assert!(same.set.is_empty(), "{:?}", same.set);

        let drifted = compare(
            &r,
            &live("ssh-rsa%20AAAAintruder%20x", None),
            &CompareContext::default(),
        );
        assert_eq!(
            drifted.set,
            params(&[
                ("cipassword", "(secret: cloud-init.passwords.default)"),
                (
                    "sshkeys",
                    "(secret: cloud-init.ssh-keys.admin, cloud-init.ssh-keys.deploy)"
                ),
            ])
        );
    }

    #[test]
    fn right_after_a_clone_the_template_password_is_replaced_and_keys_compared() {
        use crate::guest::{CompareContext, GuestType, LiveConfig, compare};
        let r = render(&resolved_refs_vm(), &Artifacts::new()).expect("a guest");
        let inherited = serde_json::json!({
            "memory": "1024", "cores": 1, "cpu": "host", "name": "sealed", "tags": "proxops",
            "scsi0": "local-lvm:vm-130-disk-0,size=8G", "digest": "d",
            "sshkeys": "ssh-rsa%20AAAAtemplate%20t", "cipassword": "**********",
        });
        let live = LiveConfig::from_json(GuestType::Qemu, &inherited).expect("a config");
        let after_clone = compare(&r, &live, &CompareContext { clone_backed: true });
        assert_eq!(
            after_clone.set.keys().collect::<Vec<_>>(),
            ["cipassword", "sshkeys"]
        );
        assert!(after_clone.delete.is_empty(), "{:?}", after_clone.delete);
        let later = compare(&r, &live, &CompareContext::default());
        assert_eq!(later.set.keys().collect::<Vec<_>>(), ["sshkeys"]);
    }

    #[test]
    fn an_lxc_renders_named_nics_the_nesting_feature_and_create_only_keys_apart() {
        let r = rendered(FULL_LXC, &artifacts());
        assert_eq!(
            r.create_only,
            params(&[
                ("ostemplate", "local:vztmpl/debian-13-standard.tar.zst"),
                ("unprivileged", "1"),
            ])
        );
        let owned: BTreeMap<String, String> = r
            .owned
            .iter()
            .map(|(k, o)| (k.clone(), o.value.clone()))
            .collect();
        assert_eq!(
            owned,
            params(&[
                ("arch", "amd64"),
                ("cmode", "tty"),
                ("console", "1"),
                ("cores", "2"),
                ("description", "database"),
                ("features", "nesting=1"),
                ("hostname", "db-1.lab"),
                ("memory", "1024"),
                (
                    "mp0",
                    "local-lvm:16,mp=/var/lib/postgresql,ro=0,backup=1,acl=1,quota=0,shared=0,\
                     mountoptions=noatime"
                ),
                ("mp1", "/tank/backups,mp=/backups,ro=1"),
                (
                    "net0",
                    "name=eth0,bridge=vmbr0,tag=20,hwaddr=BC:24:11:00:00:02,rate=50,firewall=1,\
                     ip=10.0.0.20/24,gw=10.0.0.1,type=veth"
                ),
                ("net1", "name=net1,bridge=vmbr1,ip=dhcp"),
                ("nameserver", "10.0.0.1"),
                ("onboot", "1"),
                ("protection", "0"),
                ("rootfs", "local-lvm:8"),
                ("searchdomain", "lab.example"),
                ("startup", "order=2"),
                ("swap", "512"),
                ("tags", "db;proxops"),
            ])
        );
        let unsent: Vec<&str> = r.unsent.iter().map(|u| u.field.as_str()).collect();
        assert_eq!(
            unsent,
            [
                "spec.cpu.units",
                "spec.options.keyctl",
                "spec.options.fuse",
                "spec.options.ttys"
            ]
        );
    }

    #[test]
    fn the_i440fx_machine_is_sent_as_pve_spells_it() {
        let yaml = doc(
            "VM",
            "old",
            "  node: pve1\n  vmid: 100\n  memory: 512MiB\n  cpu: {type: kvm64, cores: 1}\n  \
             disks: [{storage: local-lvm, size: 512MiB, interface: sata0}]\n  \
             hardware: {machine: i440fx, cdrom: {iso: none}}\n",
        );
        let r = rendered(&yaml, &artifacts());
        assert_eq!(r.value("machine"), Some("pc"));
        assert_eq!(r.value("sata0"), Some("local-lvm:0.5"));
        assert_eq!(r.value("ide2"), Some("none,media=cdrom"));
    }

    #[test]
    fn a_clone_backed_vm_names_its_template_and_renders_no_disks() {
        let yaml = doc(
            "VM",
            "clone-1",
            "  node: pve1\n  vmid: 120\n  memory: 1GiB\n  cpu: {type: host, cores: 1}\n  \
             clone: golden\n  cloud-init-data: {ci-user: ops}\n",
        );
        let r = rendered(&yaml, &artifacts());
        assert_eq!(r.clone.as_deref(), Some("golden"));
        assert!(!r.owned.keys().any(|k| k.starts_with("scsi")));
    }
}
