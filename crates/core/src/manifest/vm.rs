//! VM and TemplateVM: the validated spec and its checks (DESIGN.md §2.4).
//!
//! Slots are resolved here (a disk's default is `scsi<index>`, a NIC's `net<index>`), so two
//! devices on one slot, or a disk on the slot of the CD-ROM or cloud-init drive, are caught
//! before anything reaches PVE.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::Serialize;

use super::check::Checker;
use super::choice::{
    Aio, Bios, Discard, EfiTemplate, Machine, Media, PowerState, SecureBoot, TpmVersion,
};
use super::decode::{did_you_mean, one_of};
use super::document::Checked;
use super::guest::{
    Slots, check_extra, check_mac, check_mib, check_node, check_pool, check_size, check_state,
    check_storage, check_tags, check_vlan, check_vmid, is_cidr, parse_slot, placement, reference,
    slot_ranges,
};
use super::ids::{NodeName, StorageId, VmId};
use super::quantity::{ByteSize, Mebibytes};
use super::raw::{RawCloudInitData, RawDisk, RawHardware, RawVmNic, RawVmOptions, RawVmSpec};
use super::{Reference, Spec};
use crate::resource::Kind;

/// A validated VM or TemplateVM spec.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VmSpec {
    /// The node it lives on.
    pub node: NodeName,
    /// Its id.
    pub vmid: VmId,
    /// Desired power state (always stopped for a TemplateVM).
    pub state: PowerState,
    /// Memory.
    pub memory: Mebibytes,
    /// CPU.
    pub cpu: VmCpu,
    /// Disks, with their slots resolved.
    pub disks: Vec<Disk>,
    /// The VM-wide SCSI controller (`scsihw`), from the first disk that names one.
    pub scsihw: Option<String>,
    /// NICs, with their slots resolved.
    pub networks: Vec<VmNic>,
    /// Hardware.
    pub hardware: Hardware,
    /// Options; `None` = not managed.
    pub options: VmOptions,
    /// Cloud-init data.
    pub cloud_init_data: CloudInitData,
    /// PVE `name` (default `metadata.name`).
    pub pve_name: String,
    /// PVE `description`.
    pub pve_description: Option<String>,
    /// PVE tags, without the ownership tag.
    pub tags: Vec<String>,
    /// Further PVE keys, verbatim.
    pub extra: BTreeMap<String, String>,
    /// The TemplateVM to clone from.
    pub clone: Option<String>,
    /// The PVE resource pool it belongs to; `None` = membership not managed.
    pub pool: Option<String>,
}

/// `spec.cpu`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmCpu {
    /// PVE CPU type.
    pub cpu_type: String,
    /// Cores.
    pub cores: u32,
    /// Accepted, never sent.
    pub flags: Vec<String>,
}

/// A disk bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskBus {
    /// `scsiN`.
    Scsi,
    /// `virtioN`.
    Virtio,
    /// `sataN`.
    Sata,
    /// `ideN`.
    Ide,
    /// `nvmeN`.
    Nvme,
}

/// Disk slot prefixes and their highest index in PVE.
const DISK_SLOTS: [(&str, u32); 5] = [
    ("scsi", 30),
    ("virtio", 15),
    ("sata", 5),
    ("ide", 3),
    ("nvme", 15),
];
/// NIC slots `net0`..`net31`.
const NIC_SLOTS: [(&str, u32); 1] = [("net", 31)];
/// PCI passthrough slots `hostpci0`..`hostpci15`.
const PCI_SLOTS: [(&str, u32); 1] = [("hostpci", 15)];
/// PVE's `scsihw` values (the ones a manifest accepts).
pub const CONTROLLERS: [&str; 6] = [
    "lsi",
    "lsi53c810",
    "virtio-scsi-pci",
    "virtio-scsi-single",
    "megasas",
    "pvscsi",
];
/// PVE's NIC models (the ones a manifest accepts).
pub const NIC_MODELS: [&str; 14] = [
    "virtio",
    "e1000",
    "e1000e",
    "e1000-82540em",
    "e1000-82544gc",
    "e1000-82545em",
    "i82551",
    "i82557b",
    "i82559er",
    "ne2k_isa",
    "ne2k_pci",
    "pcnet",
    "rtl8139",
    "vmxnet3",
];
/// `spec.extra` keys ProxOps sets itself (the Go program's list).
const RESERVED_EXTRA: [&str; 34] = [
    "vmid",
    "pool",
    "name",
    "memory",
    "cpu",
    "cores",
    "machine",
    "bios",
    "vga",
    "cdrom",
    "ide0",
    "ide1",
    "ide2",
    "ide3",
    "efidisk0",
    "tpm0",
    "serial0",
    "onboot",
    "startup",
    "protection",
    "agent",
    "acpi",
    "tablet",
    "hotplug",
    "boot",
    "nestedvirt",
    "hidden",
    "tags",
    "ciuser",
    "sshkeys",
    "nameserver",
    "searchdomain",
    "tpmstate0",
    "description",
];
/// `spec.extra` key prefixes ProxOps sets itself.
const RESERVED_EXTRA_PREFIXES: [&str; 3] = ["scsi", "net", "ipconfig"];

/// A disk slot such as `scsi0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct DiskSlot {
    /// The bus.
    pub bus: DiskBus,
    /// The index on that bus.
    pub index: u32,
}

impl fmt::Display for DiskSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bus = match self.bus {
            DiskBus::Scsi => "scsi",
            DiskBus::Virtio => "virtio",
            DiskBus::Sata => "sata",
            DiskBus::Ide => "ide",
            DiskBus::Nvme => "nvme",
        };
        write!(f, "{bus}{}", self.index)
    }
}

/// `spec.disks[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disk {
    /// The slot.
    pub slot: DiskSlot,
    /// The storage.
    pub storage: StorageId,
    /// Size; with `image`, the size to grow the imported disk to.
    pub size: Option<ByteSize>,
    /// A DiskImage to import.
    pub image: Option<String>,
    /// `iothread`.
    pub iothread: Option<bool>,
    /// `discard`.
    pub discard: Option<Discard>,
    /// `ssd` (never on virtio or nvme).
    pub ssd: Option<bool>,
    /// `aio`.
    pub aio: Option<Aio>,
}

/// `spec.networks[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmNic {
    /// N of `netN`.
    pub slot: u32,
    /// Model (default `virtio`).
    pub model: String,
    /// Bridge.
    pub bridge: String,
    /// Pinned MAC, lowercased.
    pub mac: Option<String>,
    /// VLAN tag.
    pub vlan: Option<u16>,
    /// Rate limit, MB/s.
    pub rate_limit: Option<u32>,
    /// Firewall.
    pub firewall: Option<bool>,
}

/// `spec.hardware`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Hardware {
    /// Machine type.
    pub machine: Option<Machine>,
    /// Firmware.
    pub bios: Option<Bios>,
    /// `vga`.
    pub display: Option<String>,
    /// Sockets.
    pub sockets: Option<u32>,
    /// NUMA.
    pub numa: Option<bool>,
    /// `serial0`.
    pub serial0: Option<String>,
    /// CD-ROM drive; `None` = not managed.
    pub cdrom: Option<Cdrom>,
    /// EFI disk.
    pub efi_disk: Option<EfiDisk>,
    /// Cloud-init drive (only when enabled).
    pub cloud_init: Option<CloudInitDrive>,
    /// TPM state.
    pub tpm: Option<Tpm>,
    /// PCI passthrough.
    pub pci_devices: Vec<PciDevice>,
}

/// The CD-ROM drive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cdrom {
    /// The ISO's `metadata.name`, or `None` for an empty drive (`iso: none`).
    pub iso: Option<String>,
    /// Media type.
    pub media: Media,
    /// `ide2`, or `ide3` when the cloud-init drive takes `ide2`.
    pub slot: DiskSlot,
}

/// `hardware.efi-disk`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EfiDisk {
    /// Storage.
    pub storage: StorageId,
    /// Size (default 4 MiB).
    pub size: ByteSize,
    /// `efitype`.
    pub template: Option<EfiTemplate>,
    /// `pre-enrolled-keys`.
    pub secure_boot: Option<SecureBoot>,
}

/// `hardware.cloud-init` when enabled; it takes `ide2`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CloudInitDrive {
    /// Storage.
    pub storage: StorageId,
    /// Size (default 4 MiB).
    pub size: ByteSize,
}

/// `hardware.tpm` → `tpmstate0`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tpm {
    /// Storage.
    pub storage: StorageId,
    /// Version (default v2.0).
    pub version: TpmVersion,
}

/// `hardware.pci-devices[]` → `hostpciN`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PciDevice {
    /// N of `hostpciN`.
    pub slot: u32,
    /// PCI address, lowercased.
    pub device: String,
    /// `pcie`.
    pub pcie: Option<bool>,
}

/// `spec.options`; every `None` is left as PVE has it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct VmOptions {
    /// `onboot`.
    pub onboot: Option<bool>,
    /// `startup`.
    pub startup: Option<String>,
    /// `protection`.
    pub protection: Option<bool>,
    /// `agent`.
    pub agent: Option<bool>,
    /// `acpi`.
    pub acpi: Option<bool>,
    /// `tablet`.
    pub tablet: Option<bool>,
    /// `hotplug`.
    pub hotplug: Option<Vec<String>>,
    /// `boot=order=`.
    pub boot_order: Option<Vec<String>>,
    /// `cpu: hidden=`.
    pub hidden: Option<bool>,
    /// Accepted, never sent.
    pub nested_virt: Option<bool>,
}

/// `spec.cloud-init-data`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct CloudInitData {
    /// `ciuser`.
    pub ci_user: Option<String>,
    /// `sshkeys`.
    pub ssh_keys: SshKeys,
    /// Names in the cluster's SOPS document (`cloud-init.ssh-keys.<name>`).
    pub ssh_key_refs: Vec<String>,
    /// `cloud-init.passwords.<name>`.
    pub ci_password_ref: Option<String>,
    /// `nameserver`.
    pub nameservers: Vec<String>,
    /// `searchdomain`.
    pub search_domains: Vec<String>,
    /// `ipconfigN`.
    pub ipconfigs: Vec<IpConfig>,
    /// The values of `ssh-key-refs` and `ci-password-ref`, filled in by the binary from the
    /// cluster's SOPS document before planning (never from YAML); `None` until then.
    #[serde(skip)]
    pub resolved: Option<crate::secret::ResolvedCloudInit>,
    /// `spec.cloud-init`'s `user-data`, `vendor-data`, `network-data`: snippets ProxOps
    /// writes on the node (kept here, beside the other cloud-init settings it joins).
    pub snippets: Snippets,
}

/// A VM's cloud-init snippets (`spec.cloud-init.{user,vendor,network}-data`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Snippets {
    /// `snippets-storage`; `None`: `[snippets] storage` of agent.toml.
    pub storage: Option<StorageId>,
    /// The declared snippets, in [`SnippetKind`] order.
    pub declared: Vec<(SnippetKind, SnippetSource)>,
    /// Filled in by the binary before planning (the text read, secrets replaced, named by
    /// its hash); `None` until then. Never from YAML, never serialised.
    #[serde(skip)]
    pub resolved: Option<crate::snippet::ResolvedSnippets>,
}

impl Snippets {
    /// Whether the manifest declares any snippet.
    pub fn is_empty(&self) -> bool {
        self.declared.is_empty()
    }
}

/// Which cloud-init file a snippet replaces (a key of PVE's `cicustom`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnippetKind {
    /// `user=`.
    User,
    /// `vendor=`.
    Vendor,
    /// `network=`.
    Network,
}

impl SnippetKind {
    /// The `cicustom` key, which is also the kind's part of the file name.
    pub fn key(self) -> &'static str {
        match self {
            SnippetKind::User => "user",
            SnippetKind::Vendor => "vendor",
            SnippetKind::Network => "network",
        }
    }

    /// The manifest field (`user-data`, ...).
    pub fn field(self) -> &'static str {
        match self {
            SnippetKind::User => "user-data",
            SnippetKind::Vendor => "vendor-data",
            SnippetKind::Network => "network-data",
        }
    }
}

/// Where a snippet's text comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnippetSource {
    /// Written in the manifest.
    Inline(String),
    /// A repository file under `snippets/`.
    File {
        /// Its repository-relative path.
        path: String,
        /// Where `file:` is written in the manifest (for an error about the file).
        #[serde(skip)]
        location: super::Location,
    },
}

/// Who owns a VM's SSH keys.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub enum SshKeys {
    /// Not set: ProxOps neither writes nor compares them.
    #[default]
    Unmanaged,
    /// `["*"]`: PVE owns them.
    Pve,
    /// These keys, deduplicated in order.
    Keys(Vec<String>),
}

/// `cloud-init-data.ipconfigs[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IpConfig {
    /// N of `ipconfigN`.
    pub nic: u32,
    /// Address.
    pub ip: Option<IpAssignment>,
    /// Gateway (only with a static address).
    pub gateway: Option<IpAddr>,
}

/// How an interface gets its address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum IpAssignment {
    /// DHCP.
    Dhcp,
    /// A static address in CIDR notation.
    Static(String),
}

/// Checks a VM or TemplateVM spec.
pub(crate) fn check_vm(ck: &mut Checker<'_>, kind: Kind, name: &str, raw: &RawVmSpec) -> Checked {
    let mut references = Vec::new();
    let node = check_node(ck, raw.node.as_ref());
    let vmid = check_vmid(ck, raw.vmid);
    let state = check_state(ck, kind, raw.state);
    let memory = ck
        .required(&raw.memory, "spec.memory")
        .and_then(|m| check_mib(ck, "spec.memory", m, false));
    let cpu = check_cpu(ck, raw);

    let no_hardware = RawHardware::default();
    let hardware_raw = raw.hardware.as_ref().unwrap_or(&no_hardware);
    let cloud_init_enabled = hardware_raw
        .cloud_init
        .as_ref()
        .and_then(|c| c.enabled)
        .unwrap_or(false);
    let mut slots = Slots::default();
    if cloud_init_enabled {
        slots.claim(
            ck,
            "ide2",
            "spec.hardware.cloud-init",
            "spec.hardware.cloud-init",
            "drive",
        );
    }
    let cdrom_slot = DiskSlot {
        bus: DiskBus::Ide,
        index: if cloud_init_enabled { 3 } else { 2 },
    };
    if hardware_raw.cdrom.is_some() {
        slots.claim(
            ck,
            &cdrom_slot.to_string(),
            "spec.hardware.cdrom",
            "spec.hardware.cdrom",
            "drive",
        );
    }
    let (disks, scsihw) = check_disks(ck, raw, &mut slots, &mut references);
    let networks = check_nics(ck, raw.networks.as_deref().unwrap_or_default());
    let hardware = check_hardware(ck, hardware_raw, cdrom_slot, &mut references);
    let options = check_options(ck, raw.options.as_ref());
    let mut cloud_init_data = check_cloud_init_data(ck, raw.cloud_init_data.as_ref());
    match (
        check_snippets(ck, raw.cloud_init.as_ref()),
        cloud_init_data.as_mut(),
    ) {
        (Some(snippets), Some(c)) => c.snippets = snippets,
        (None, _) => cloud_init_data = None,
        (Some(_), None) => {}
    }

    let pve_name = match &raw.pve_name {
        Some(n) if is_dns_name(n) => Some(n.clone()),
        Some(n) => {
            if !ck.reported("spec.pve-name") {
                ck.error_help(
                    "spec.pve-name",
                    format!("`{n}` is not a valid PVE guest name"),
                    "PVE names are DNS names: letters, digits, `-` and `.`",
                );
            }
            None
        }
        None => Some(name.to_owned()),
    };
    let tags = check_tags(ck, raw.tags.as_ref());
    let extra = check_extra(
        ck,
        raw.extra.as_ref(),
        &RESERVED_EXTRA,
        &RESERVED_EXTRA_PREFIXES,
    );
    if let Some(c) = cloud_init_data.as_mut()
        && !c.snippets.is_empty()
        && raw
            .extra
            .as_ref()
            .is_some_and(|e| e.contains_key("cicustom"))
    {
        ck.error_at_key(
            "spec.extra.cicustom",
            "`cicustom` is set in `extra` next to `spec.cloud-init` snippets",
            "ProxOps sets `cicustom` from `user-data`, `vendor-data` and `network-data`: remove \
             `cicustom` from `extra`, or remove the snippets and keep your own `cicustom`",
        );
        cloud_init_data = None;
    }
    let clone = raw.clone.as_ref().map(|c| {
        references.extend(reference(ck, "spec.clone", c, Kind::TemplateVm));
        c.clone()
    });
    let pool = check_pool(ck, raw.pool.as_ref());

    references.sort_by_key(|r: &Reference| r.location);
    let spec = (|| {
        Some(Spec::Vm(Box::new(VmSpec {
            node: node?,
            vmid: vmid?,
            state,
            memory: memory?,
            cpu: cpu?,
            disks: disks?,
            scsihw,
            networks: networks?,
            hardware: hardware?,
            options: options?,
            cloud_init_data: cloud_init_data?,
            pve_name: pve_name?,
            pve_description: raw.pve_description.clone(),
            tags: tags?,
            extra: extra?,
            clone,
            pool: pool?,
        })))
    })();
    Checked {
        spec,
        placement: placement(ck, raw.node.as_ref(), raw.vmid),
        references,
    }
}

/// A DNS name as PVE's `name` wants it.
fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn check_cpu(ck: &mut Checker<'_>, raw: &RawVmSpec) -> Option<VmCpu> {
    let cpu = ck.required(&raw.cpu, "spec.cpu")?;
    let cpu_type = ck.required(&cpu.cpu_type, "spec.cpu.type").cloned();
    let cores = ck.required(&cpu.cores, "spec.cpu.cores").copied();
    if cores == Some(0) && !ck.reported("spec.cpu.cores") {
        ck.error_help(
            "spec.cpu.cores",
            "cores must be at least 1",
            "give the number of cores, e.g. `cores: 2`",
        );
        return None;
    }
    Some(VmCpu {
        cpu_type: cpu_type?,
        cores: cores?,
        flags: cpu.flags.clone().unwrap_or_default(),
    })
}

fn check_disks(
    ck: &mut Checker<'_>,
    raw: &RawVmSpec,
    slots: &mut Slots,
    references: &mut Vec<Reference>,
) -> (Option<Vec<Disk>>, Option<String>) {
    let list: &[RawDisk] = raw.disks.as_deref().unwrap_or_default();
    if raw.clone.is_some() && !list.is_empty() {
        ck.error_help(
            "spec.disks",
            "`clone` and `disks` are both set",
            "a clone takes its disks from the template; remove `disks`",
        );
        return (None, None);
    }
    if raw.clone.is_none() && list.is_empty() && !ck.reported("spec.disks") {
        if raw.disks.is_none() {
            ck.missing(
                "spec.disks",
                Some("add at least one disk, or `clone` a TemplateVM".to_owned()),
            );
        } else {
            ck.error_help(
                "spec.disks",
                "no disks",
                "add at least one disk, or `clone` a TemplateVM",
            );
        }
        return (None, None);
    }
    let mut disks = Vec::with_capacity(list.len());
    let mut ok = true;
    let mut scsihw: Option<(String, String)> = None;
    for (i, d) in list.iter().enumerate() {
        let at = format!("spec.disks[{i}]");
        let storage = check_storage(ck, &format!("{at}.storage"), d.storage.as_ref());
        let size = match (&d.size, &d.image) {
            (None, None) => {
                ck.missing(
                    &format!("{at}.size"),
                    Some("give a `size`, or an `image` to import".to_owned()),
                );
                None
            }
            (None, Some(_)) => Some(None),
            (Some(s), _) => check_size(ck, &format!("{at}.size"), s).map(Some),
        };
        if let Some(image) = &d.image {
            references.extend(reference(
                ck,
                &format!("{at}.image"),
                image,
                Kind::DiskImage,
            ));
        }
        let slot_field = format!("{at}.interface");
        let slot_text = d.interface.clone().unwrap_or_else(|| format!("scsi{i}"));
        let slot = match parse_slot(&slot_text, &DISK_SLOTS) {
            _ if ck.reported(&slot_field) => None,
            Some((prefix, index)) => {
                let bus = match prefix {
                    "scsi" => DiskBus::Scsi,
                    "virtio" => DiskBus::Virtio,
                    "sata" => DiskBus::Sata,
                    "ide" => DiskBus::Ide,
                    _ => DiskBus::Nvme,
                };
                let field = if d.interface.is_some() {
                    slot_field.clone()
                } else {
                    at.clone()
                };
                let slot = DiskSlot { bus, index };
                slots
                    .claim(ck, &slot.to_string(), &at, &field, "disk")
                    .then_some(slot)
            }
            None => {
                ck.error_help(
                    &slot_field,
                    format!("`{slot_text}` is not a disk slot"),
                    format!("disk slots are {}", slot_ranges(&DISK_SLOTS)),
                );
                None
            }
        };
        if let (Some(slot), Some(_)) = (slot, d.ssd)
            && matches!(slot.bus, DiskBus::Virtio | DiskBus::Nvme)
            && !ck.reported(&format!("{at}.ssd"))
        {
            ck.error_help(
                &format!("{at}.ssd"),
                format!(
                    "`ssd` is not available on {} disks",
                    slot.to_string().trim_end_matches(char::is_numeric)
                ),
                "remove `ssd`, or use a scsi or sata slot",
            );
            ok = false;
        }
        if let Some(controller) = &d.controller {
            let field = format!("{at}.controller");
            if !CONTROLLERS.contains(&controller.as_str()) {
                let help = match did_you_mean(controller, &CONTROLLERS) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => format!("expected one of {}", one_of(&CONTROLLERS)),
                };
                ck.error_help(
                    &field,
                    format!("unknown SCSI controller `{controller}`"),
                    help,
                );
                ok = false;
            } else if let Some((first, first_field)) = &scsihw {
                if first != controller {
                    ck.error_help(&field, format!("controller `{controller}` conflicts with `{first}` set by `{first_field}`"), "the controller is VM-wide; set it on one disk only");
                    ok = false;
                }
            } else {
                scsihw = Some((controller.clone(), field));
            }
        }
        match (storage, size, slot) {
            (Some(storage), Some(size), Some(slot)) => disks.push(Disk {
                slot,
                storage,
                size,
                image: d.image.clone(),
                iothread: d.iothread,
                discard: d.discard,
                ssd: d.ssd,
                aio: d.aio,
            }),
            _ => ok = false,
        }
    }
    (ok.then_some(disks), scsihw.map(|(c, _)| c))
}

fn check_nics(ck: &mut Checker<'_>, list: &[RawVmNic]) -> Option<Vec<VmNic>> {
    let mut nics = Vec::with_capacity(list.len());
    let mut slots = Slots::default();
    let mut ok = true;
    for (i, n) in list.iter().enumerate() {
        let at = format!("spec.networks[{i}]");
        let bridge = ck.required(&n.bridge, &format!("{at}.bridge")).cloned();
        let model = n.model.clone().unwrap_or_else(|| "virtio".to_owned());
        let model_ok = NIC_MODELS.contains(&model.as_str()) || ck.reported(&format!("{at}.model"));
        if !model_ok {
            let help = match did_you_mean(&model, &NIC_MODELS) {
                Some(s) => format!("did you mean `{s}`?"),
                None => format!("expected one of {}", one_of(&NIC_MODELS)),
            };
            ck.error_help(
                &format!("{at}.model"),
                format!("unknown NIC model `{model}`"),
                help,
            );
        }
        let mac = match &n.mac {
            None => Some(None),
            Some(m) => check_mac(ck, &format!("{at}.mac"), m).map(Some),
        };
        let vlan = check_vlan(ck, &format!("{at}.vlan"), n.vlan);
        let slot = nic_slot(ck, &mut slots, &at, n.slot.as_deref(), i);
        match (bridge, mac, vlan, slot) {
            (Some(bridge), Some(mac), Some(vlan), Some(slot)) if model_ok => nics.push(VmNic {
                slot,
                model,
                bridge,
                mac,
                vlan,
                rate_limit: n.rate_limit,
                firewall: n.firewall,
            }),
            _ => ok = false,
        }
    }
    ok.then_some(nics)
}

/// A NIC's `netN` slot (default `net<index>`), unique in the guest.
pub(crate) fn nic_slot(
    ck: &mut Checker<'_>,
    slots: &mut Slots,
    at: &str,
    raw: Option<&str>,
    i: usize,
) -> Option<u32> {
    let field = format!("{at}.slot");
    if ck.reported(&field) {
        return None;
    }
    let text = raw.map_or_else(|| format!("net{i}"), str::to_owned);
    match parse_slot(&text, &NIC_SLOTS) {
        Some((_, n)) => {
            let value_field = if raw.is_some() { field } else { at.to_owned() };
            slots
                .claim(ck, &text, at, &value_field, "network interface")
                .then_some(n)
        }
        None => {
            ck.error_help(
                &field,
                format!("`{text}` is not a network slot"),
                format!("network slots are {}", slot_ranges(&NIC_SLOTS)),
            );
            None
        }
    }
}

fn check_hardware(
    ck: &mut Checker<'_>,
    raw: &RawHardware,
    cdrom_slot: DiskSlot,
    references: &mut Vec<Reference>,
) -> Option<Hardware> {
    let mut ok = true;
    if raw.sockets == Some(0) && !ck.reported("spec.hardware.sockets") {
        ck.error_help(
            "spec.hardware.sockets",
            "sockets must be at least 1",
            "leave `sockets` out for PVE's default of 1",
        );
        ok = false;
    }
    let cdrom = match &raw.cdrom {
        None => Some(None),
        Some(c) => match ck.required(&c.iso, "spec.hardware.cdrom.iso") {
            None => None,
            Some(iso) if iso == "none" => Some(Some(Cdrom {
                iso: None,
                media: c.media.unwrap_or(Media::Cdrom),
                slot: cdrom_slot,
            })),
            Some(iso) => {
                let r = reference(ck, "spec.hardware.cdrom.iso", iso, Kind::Iso);
                let ok = r.is_some();
                references.extend(r);
                ok.then(|| {
                    Some(Cdrom {
                        iso: Some(iso.clone()),
                        media: c.media.unwrap_or(Media::Cdrom),
                        slot: cdrom_slot,
                    })
                })
            }
        },
    };
    let efi_disk = match &raw.efi_disk {
        None => Some(None),
        Some(e) => {
            let storage = check_storage(ck, "spec.hardware.efi-disk.storage", e.storage.as_ref());
            let size = match &e.size {
                None => Some(ByteSize::from_mib(4)),
                Some(s) => check_size(ck, "spec.hardware.efi-disk.size", s),
            };
            (|| {
                Some(Some(EfiDisk {
                    storage: storage?,
                    size: size?,
                    template: e.template,
                    secure_boot: e.secure_boot,
                }))
            })()
        }
    };
    let cloud_init = match &raw.cloud_init {
        Some(c) if c.enabled == Some(true) => {
            let storage = match &c.storage {
                None => {
                    ck.missing(
                        "spec.hardware.cloud-init.storage",
                        Some("a cloud-init drive needs a storage with `images` content".to_owned()),
                    );
                    None
                }
                Some(_) => {
                    check_storage(ck, "spec.hardware.cloud-init.storage", c.storage.as_ref())
                }
            };
            let size = match &c.size {
                // PVE reads its own `4M` as 4 MiB.
                None => Some(ByteSize::from_mib(4)),
                Some(s) => check_size(ck, "spec.hardware.cloud-init.size", s),
            };
            (|| {
                Some(Some(CloudInitDrive {
                    storage: storage?,
                    size: size?,
                }))
            })()
        }
        _ => Some(None),
    };
    let tpm = match &raw.tpm {
        None => Some(None),
        Some(t) => {
            check_storage(ck, "spec.hardware.tpm.storage", t.storage.as_ref()).map(|storage| {
                Some(Tpm {
                    storage,
                    version: t.version.unwrap_or(TpmVersion::V20),
                })
            })
        }
    };
    let mut pci_devices = Vec::new();
    let mut slots = Slots::default();
    for (i, p) in raw.pci_devices.iter().flatten().enumerate() {
        let at = format!("spec.hardware.pci-devices[{i}]");
        let slot = ck.required(&p.slot, &format!("{at}.slot")).and_then(|s| {
            let field = format!("{at}.slot");
            if ck.reported(&field) {
                return None;
            }
            match parse_slot(s, &PCI_SLOTS) {
                Some((_, n)) => slots.claim(ck, s, &at, &field, "PCI device").then_some(n),
                None => {
                    ck.error_help(
                        &field,
                        format!("`{s}` is not a PCI passthrough slot"),
                        format!("PCI slots are {}", slot_ranges(&PCI_SLOTS)),
                    );
                    None
                }
            }
        });
        let device = ck
            .required(&p.device, &format!("{at}.device"))
            .and_then(|d| {
                let field = format!("{at}.device");
                if is_pci_address(d) {
                    Some(d.to_ascii_lowercase())
                } else {
                    if !ck.reported(&field) {
                        ck.error_help(
                            &field,
                            format!("`{d}` is not a PCI address"),
                            "write `[domain:]bus:device[.function]` in hex, e.g. `0000:01:00.0`",
                        );
                    }
                    None
                }
            });
        match (slot, device) {
            (Some(slot), Some(device)) => pci_devices.push(PciDevice {
                slot,
                device,
                pcie: p.pcie,
            }),
            _ => ok = false,
        }
    }
    let hardware = Hardware {
        machine: raw.machine,
        bios: raw.bios,
        display: raw.display.clone(),
        sockets: raw.sockets,
        numa: raw.numa,
        serial0: raw.serial0.clone(),
        cdrom: cdrom?,
        efi_disk: efi_disk?,
        cloud_init: cloud_init?,
        tpm: tpm?,
        pci_devices,
    };
    ok.then_some(hardware)
}

/// A PCI address as a manifest accepts it: `[dddd:]bb:dd[.f]` in hex.
pub fn is_pci_address(s: &str) -> bool {
    let hex = |p: &str, min: usize, max: usize| {
        (min..=max).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_hexdigit())
    };
    let (main, function) = match s.split_once('.') {
        Some((m, f)) => (m, Some(f)),
        None => (s, None),
    };
    if function.is_some_and(|f| !(f.len() == 1 && matches!(f.as_bytes()[0], b'0'..=b'7'))) {
        return false;
    }
    match main.split(':').collect::<Vec<_>>().as_slice() {
        [bus, dev] => hex(bus, 2, 2) && hex(dev, 2, 2),
        [domain, bus, dev] => hex(domain, 2, 5) && hex(bus, 2, 2) && hex(dev, 2, 2),
        _ => false,
    }
}

fn check_options(ck: &mut Checker<'_>, raw: Option<&RawVmOptions>) -> Option<VmOptions> {
    let Some(o) = raw else {
        return Some(VmOptions::default());
    };
    let mut ok = true;
    if let Some(order) = &o.boot_order {
        for (i, entry) in order.iter().enumerate() {
            if order[..i].contains(entry) {
                ck.error_help(
                    &format!("spec.options.boot-order[{i}]"),
                    format!("`{entry}` appears twice in the boot order"),
                    "list each device once",
                );
                ok = false;
            }
        }
    }
    ok.then(|| VmOptions {
        onboot: o.onboot,
        startup: o.startup.clone(),
        protection: o.protection,
        agent: o.agent,
        acpi: o.acpi,
        tablet: o.tablet,
        hotplug: o.hotplug.clone(),
        boot_order: o.boot_order.clone(),
        hidden: o.hidden,
        nested_virt: o.nested_virt,
    })
}

/// A SOPS reference `<prefix><name>` with a name of `[a-z0-9-]`, at most 64, no leading `-`.
pub(crate) fn is_secret_ref(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix).is_some_and(|name| {
        !name.is_empty()
            && name.len() <= 64
            && !name.starts_with('-')
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    })
}

fn check_cloud_init_data(
    ck: &mut Checker<'_>,
    raw: Option<&RawCloudInitData>,
) -> Option<CloudInitData> {
    let Some(c) = raw else {
        return Some(CloudInitData::default());
    };
    let mut ok = true;
    let keys = c.ssh_keys.clone().unwrap_or_default();
    let refs = c.ssh_key_refs.clone().unwrap_or_default();
    let ssh_keys = if keys.is_empty() {
        SshKeys::Unmanaged
    } else if keys.iter().any(|k| k == "*") {
        if keys.iter().any(|k| k != "*") {
            ck.error_help(
                "spec.cloud-init-data.ssh-keys",
                "`*` is mixed with keys",
                "`[\"*\"]` alone leaves the keys to PVE; otherwise list only keys",
            );
            ok = false;
        }
        SshKeys::Pve
    } else {
        let mut unique: Vec<String> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let key = key.trim();
            if key.split_whitespace().count() < 2 {
                ck.error_help(&format!("spec.cloud-init-data.ssh-keys[{i}]"), "not an OpenSSH public key", "write a key line as in `authorized_keys`, e.g. `ssh-ed25519 AAAA... user@host`");
                ok = false;
            } else if !unique.iter().any(|k| k == key) {
                unique.push(key.to_owned());
            }
        }
        SshKeys::Keys(unique)
    };
    if !keys.is_empty() && !refs.is_empty() {
        ck.error_at_key(
            "spec.cloud-init-data.ssh-key-refs",
            "`ssh-keys` and `ssh-key-refs` are both set",
            "use one of them: inline keys or references to the cluster's SOPS document",
        );
        ok = false;
    }
    for (i, r) in refs.iter().enumerate() {
        if !is_secret_ref(r, "cloud-init.ssh-keys.") {
            ck.error_help(&format!("spec.cloud-init-data.ssh-key-refs[{i}]"), format!("`{r}` is not an SSH key reference"), "write `cloud-init.ssh-keys.<name>`, the name being lowercase letters, digits and `-`");
            ok = false;
        }
    }
    if let Some(r) = &c.ci_password_ref
        && !is_secret_ref(r, "cloud-init.passwords.")
    {
        ck.error_help(
            "spec.cloud-init-data.ci-password-ref",
            format!("`{r}` is not a password reference"),
            "write `cloud-init.passwords.<name>`, the name being lowercase letters, digits and `-`",
        );
        ok = false;
    }
    let mut ipconfigs: Vec<IpConfig> = Vec::new();
    for (i, ipc) in c.ipconfigs.iter().flatten().enumerate() {
        let at = format!("spec.cloud-init-data.ipconfigs[{i}]");
        let nic = ipc.nic.unwrap_or(0);
        if nic > 31 {
            ck.error_help(
                &format!("{at}.nic"),
                format!("nic {nic} is outside 0..=31"),
                "`nic` is the N of `netN`",
            );
            ok = false;
            continue;
        }
        if ipconfigs.iter().any(|c| c.nic == nic) {
            ck.error_help(
                &format!("{at}.nic"),
                format!("nic {nic} already has an ipconfig"),
                "give each NIC one entry",
            );
            ok = false;
            continue;
        }
        let ip = match ipc.ip.as_deref() {
            None => None,
            Some("dhcp") => Some(IpAssignment::Dhcp),
            Some(cidr) if is_cidr(cidr) => Some(IpAssignment::Static(cidr.to_owned())),
            Some(other) => {
                ck.error_help(
                    &format!("{at}.ip"),
                    format!("`{other}` is not an address with a prefix length, nor `dhcp`"),
                    "write e.g. `10.0.0.5/24`, or `dhcp`",
                );
                ok = false;
                continue;
            }
        };
        let gateway = match (&ipc.gateway, &ip) {
            (None, _) => None,
            (Some(_), None) => {
                ck.error_help(
                    &format!("{at}.gateway"),
                    "gateway without ip",
                    "add a static `ip` for this NIC, or remove `gateway`",
                );
                ok = false;
                continue;
            }
            (Some(_), Some(IpAssignment::Dhcp)) => {
                ck.error_help(
                    &format!("{at}.gateway"),
                    "gateway with `ip: dhcp`",
                    "DHCP provides the gateway; remove `gateway`",
                );
                ok = false;
                continue;
            }
            (Some(g), Some(IpAssignment::Static(_))) => match g.parse::<IpAddr>() {
                Ok(g) => Some(g),
                Err(_) => {
                    ck.error_help(
                        &format!("{at}.gateway"),
                        format!("`{g}` is not an IP address"),
                        "write e.g. `10.0.0.1`",
                    );
                    ok = false;
                    continue;
                }
            },
        };
        ipconfigs.push(IpConfig { nic, ip, gateway });
    }
    ok.then(|| CloudInitData {
        ci_user: c.ci_user.clone(),
        ssh_keys,
        ssh_key_refs: refs,
        ci_password_ref: c.ci_password_ref.clone(),
        nameservers: c.nameservers.clone().unwrap_or_default(),
        search_domains: c.search_domains.clone().unwrap_or_default(),
        ipconfigs,
        resolved: None,
        snippets: Snippets::default(),
    })
}

/// The prefixes a snippet's `${secret:<ref>}` may name in the cluster's SOPS document.
pub const SNIPPET_SECRET_PREFIXES: [&str; 3] =
    ["secrets.", "cloud-init.passwords.", "cloud-init.ssh-keys."];

/// `spec.cloud-init`: `user-data`, `vendor-data`, `network-data` and `snippets-storage`.
fn check_snippets(
    ck: &mut Checker<'_>,
    raw: Option<&super::raw::RawCloudInitSnippets>,
) -> Option<Snippets> {
    use super::raw::RawSnippet;
    let Some(c) = raw else {
        return Some(Snippets::default());
    };
    let mut ok = true;
    let storage = match &c.snippets_storage {
        None => None,
        Some(s) => {
            let id = check_storage(ck, "spec.cloud-init.snippets-storage", Some(s));
            ok &= id.is_some();
            id
        }
    };
    let mut declared = Vec::new();
    for (kind, raw) in [
        (SnippetKind::User, &c.user_data),
        (SnippetKind::Vendor, &c.vendor_data),
        (SnippetKind::Network, &c.network_data),
    ] {
        let Some(raw) = raw else { continue };
        let field = format!("spec.cloud-init.{}", kind.field());
        let source = match raw {
            RawSnippet::Inline(text) => {
                if text.len() > crate::snippet::MAX_BYTES {
                    ck.error_help(
                        &field,
                        format!(
                            "{} bytes, more than the 1 MiB PVE reads of a snippet",
                            text.len()
                        ),
                        "shorten it; PVE refuses larger snippets",
                    );
                    ok = false;
                    continue;
                }
                ok &= check_snippet_refs(ck, &field, text);
                SnippetSource::Inline(text.clone())
            }
            RawSnippet::File(f) => {
                let path = f.file.strip_prefix("./").unwrap_or(&f.file);
                let inside = path.starts_with(crate::snippet::REPOSITORY_FOLDER)
                    && !path
                        .split('/')
                        .any(|c| c == ".." || c.is_empty() || c.starts_with('.'))
                    && (path.ends_with(".yaml") || path.ends_with(".yml"));
                if !inside {
                    ck.error_help(
                        &format!("{field}.file"),
                        format!("`{}` is not a snippet file of the repository", f.file),
                        "name a `.yaml` or `.yml` file under the repository's `snippets/` \
                         folder, e.g. `snippets/web-user.yaml` (the agent reads only YAML \
                         files, and never manifests from `snippets/`)",
                    );
                    ok = false;
                    continue;
                }
                SnippetSource::File {
                    path: path.to_owned(),
                    location: ck.location(&format!("{field}.file")),
                }
            }
        };
        declared.push((kind, source));
    }
    ok.then_some(Snippets {
        storage,
        declared,
        resolved: None,
    })
}

/// Each `${secret:<ref>}` of an inline snippet names a key of the SOPS document's sections.
fn check_snippet_refs(ck: &mut Checker<'_>, field: &str, text: &str) -> bool {
    match crate::snippet::secret_refs(text) {
        Err(at) => {
            ck.error_help(
                field,
                format!("`${{secret:` at byte {at} has no closing `}}`"),
                "write `${secret:secrets.<name>}`",
            );
            false
        }
        Ok(refs) => {
            let mut ok = true;
            for (_, r) in refs {
                if !SNIPPET_SECRET_PREFIXES.iter().any(|p| is_secret_ref(r, p)) {
                    ck.error_help(
                        field,
                        format!("`${{secret:{r}}}` is not a reference to the SOPS document"),
                        "write `${secret:secrets.<name>}` (or `cloud-init.passwords.<name>`, \
                         `cloud-init.ssh-keys.<name>`), the name being lowercase letters, digits \
                         and `-`",
                    );
                    ok = false;
                }
            }
            ok
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::testing::{FULL_VM, assert_errors, doc, errors, parse, spec, valid};
    use crate::manifest::{Location, Placement};

    fn vm(spec: &str) -> String {
        doc("VM", "web-1", spec)
    }

    const BASE: &str = "  node: pve1\n  vmid: 101\n  memory: 2GiB\n  cpu: {type: host, cores: 2}\n";

    #[test]
    fn a_full_vm_validates_with_slots_defaults_and_references() {
        let r = valid(FULL_VM);
        assert_eq!(
            r.placement,
            Placement::Guest {
                node: "pve1".into(),
                vmid: 101,
                vmid_location: Location {
                    line: 14,
                    column: 9
                }
            }
        );
        let edges: Vec<String> = r
            .references
            .iter()
            .map(|e| format!("{} {} {}", e.field, e.target, e.explicit))
            .collect();
        assert_eq!(
            edges,
            [
                "spec.disks[1].image DiskImage/debian-cloud false",
                "spec.hardware.cdrom.iso ISO/netinst false",
                "metadata.annotations.proxops/depends-on LXC/db-1 true",
                "metadata.annotations.proxops/depends-on ISO/netinst true",
            ]
        );
        let Some(Spec::Vm(v)) = r.spec else { panic!() };
        assert_eq!(v.memory.get(), 4096);
        assert_eq!(v.disks[1].slot.to_string(), "virtio1");
        assert_eq!(v.disks[0].discard, Some(Discard::On));
        assert_eq!(v.scsihw.as_deref(), Some("virtio-scsi-single"));
        assert_eq!(v.networks[1].slot, 1);
        assert_eq!(v.networks[1].model, "virtio");
        assert_eq!(v.networks[0].mac.as_deref(), Some("bc:24:11:00:00:01"));
        assert_eq!(
            v.hardware.cdrom.as_ref().unwrap().slot.to_string(),
            "ide3",
            "cloud-init takes ide2"
        );
        assert_eq!(v.options.protection, Some(false));
        assert_eq!(v.options.onboot, Some(true));
        assert_eq!(v.options.tablet, Some(false));
        assert_eq!(v.extra.get("balloon").map(String::as_str), Some("0"));
        assert_eq!(v.cloud_init_data.ipconfigs[1].ip, Some(IpAssignment::Dhcp));
    }

    #[test]
    fn a_minimal_vm_gets_defaults() {
        let Spec::Vm(v) = spec(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n"
        ))) else {
            panic!()
        };
        assert_eq!(v.state, PowerState::Started);
        assert_eq!(v.pve_name, "web-1");
        assert_eq!(v.disks[0].slot.to_string(), "scsi0");
        assert_eq!(v.options, VmOptions::default());
        assert_eq!(v.cloud_init_data.ssh_keys, SshKeys::Unmanaged);
    }

    #[test]
    fn memory_in_decimal_gigabytes_is_rejected_with_a_gib_hint() {
        assert_errors(
            &vm(
                "  node: pve1\n  vmid: 101\n  memory: 8G\n  cpu: {type: host, cores: 2}\n  disks: [{storage: local, size: 8G}]\n",
            ),
            &[
                "test.yaml:8:11: error: spec.memory: `8G` is not a whole number of MiB: `G` is decimal (8000000000 bytes)\n  help: write `8GiB` for binary units",
            ],
        );
    }

    #[test]
    fn a_malformed_quantity_is_reported_with_the_accepted_units() {
        let e = errors(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 1.5GiB}}, {{storage: local, size: 10 XB}}]\n"
        )));
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(e[0].starts_with("test.yaml:10:34: error: spec.disks[0].size: `1.5GiB` is not a whole number\n  help: quantities are integers; write `1536MiB`"), "{e:#?}");
        assert!(
            e[1].contains("spec.disks[1].size: unknown unit `XB` in `10 XB`"),
            "{e:#?}"
        );
    }

    #[test]
    fn vmid_outside_pves_range_is_an_error() {
        assert_errors(
            &vm(
                "  node: pve1\n  vmid: 99\n  memory: 2GiB\n  cpu: {type: host, cores: 2}\n  disks: [{storage: local, size: 8G}]\n",
            ),
            &[
                "test.yaml:7:9: error: spec.vmid: vmid 99 is outside 100..=999999999\n  help: PVE guest ids run from 100 to 999999999",
            ],
        );
        let e = errors(&vm(
            "  node: pve1\n  vmid: 1000000000\n  memory: 2GiB\n  cpu: {type: host, cores: 2}\n  disks: [{storage: local, size: 8G}]\n",
        ));
        assert_eq!(e.len(), 1, "{e:#?}");
    }

    #[test]
    fn wrong_types_are_reported_without_rust_type_names() {
        assert_errors(
            &vm(
                "  node: pve1\n  vmid: one\n  memory: 2GiB\n  cpu: 4\n  disks: [{storage: local, size: 8G, iothread: maybe}]\n",
            ),
            &[
                "test.yaml:7:9: error: spec.vmid: expected an integer, found a string",
                "test.yaml:9:8: error: spec.cpu: expected a mapping, found an integer",
                "test.yaml:10:48: error: spec.disks[0].iothread: expected `true` or `false`, found a string",
            ],
        );
    }

    #[test]
    fn unknown_keys_get_a_did_you_mean() {
        assert_errors(
            &vm(&format!(
                "{BASE}  disks: [{{storage: local, size: 8G}}]\n  cloud-init-data:\n    ssh_keys: [a]\n  memroy: 1\n"
            )),
            &[
                "test.yaml:12:5: error: spec.cloud-init-data.ssh_keys: unknown key `ssh_keys`\n  help: did you mean `ssh-keys`?",
                "test.yaml:13:3: error: spec.memroy: unknown key `memroy`\n  help: did you mean `memory`?",
            ],
        );
    }

    #[test]
    fn missing_required_fields_are_reported_at_their_parent() {
        assert_errors(
            &vm("  node: pve1\n  cpu: {type: host}\n  disks: [{size: 8G}]\n"),
            &[
                "test.yaml:5:1: error: spec.memory: missing required field",
                "test.yaml:5:1: error: spec.vmid: missing required field",
                "test.yaml:7:3: error: spec.cpu.cores: missing required field",
                "test.yaml:8:11: error: spec.disks[0].storage: missing required field",
            ],
        );
    }

    #[test]
    fn two_disks_on_one_slot_are_an_error() {
        assert_errors(
            &vm(&format!(
                "{BASE}  disks:\n    - {{storage: local, size: 8G, interface: scsi1}}\n    - {{storage: local, size: 8G}}\n"
            )),
            &[
                "test.yaml:12:7: error: spec.disks[1]: slot `scsi1` is already used by `spec.disks[0]`\n  help: give each disk its own slot",
            ],
        );
    }

    #[test]
    fn a_disk_on_the_cdrom_slot_is_an_error() {
        let e = errors(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G, interface: ide2}}]\n  hardware: {{cdrom: {{iso: none}}}}\n"
        )));
        assert_eq!(
            e,
            [
                "test.yaml:10:49: error: spec.disks[0].interface: slot `ide2` is already used by `spec.hardware.cdrom`\n  help: give each disk its own slot"
            ]
        );
    }

    #[test]
    fn bad_slot_names_are_errors() {
        let e = errors(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G, interface: scsi31}}]\n  networks: [{{bridge: vmbr0, slot: eth0}}]\n  hardware:\n    pci-devices: [{{slot: hostpci16, device: '01:00.0'}}]\n"
        )));
        assert_eq!(e.len(), 3, "{e:#?}");
        assert!(e[0].contains("spec.disks[0].interface: `scsi31` is not a disk slot\n  help: disk slots are `scsi0`–`scsi30`, `virtio0`–`virtio15`"), "{e:#?}");
        assert!(
            e[1].contains("spec.networks[0].slot: `eth0` is not a network slot"),
            "{e:#?}"
        );
        assert!(
            e[2].contains(
                "spec.hardware.pci-devices[0].slot: `hostpci16` is not a PCI passthrough slot"
            ),
            "{e:#?}"
        );
    }

    #[test]
    fn two_nics_or_pci_devices_on_one_slot_are_errors() {
        let e = errors(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n  networks: [{{bridge: vmbr0}}, {{bridge: vmbr1, slot: net0}}]\n  hardware:\n    pci-devices: [{{slot: hostpci0, device: '01:00.0'}}, {{slot: hostpci0, device: '02:00.0'}}]\n"
        )));
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(
            e[0].contains(
                "spec.networks[1].slot: slot `net0` is already used by `spec.networks[0]`"
            ),
            "{e:#?}"
        );
        assert!(e[1].contains("spec.hardware.pci-devices[1].slot: slot `hostpci0` is already used by `spec.hardware.pci-devices[0]`"), "{e:#?}");
    }

    #[test]
    fn ssd_on_a_virtio_or_nvme_disk_is_an_error() {
        assert_errors(
            &vm(&format!(
                "{BASE}  disks: [{{storage: local, size: 8G, interface: virtio0, ssd: true}}]\n"
            )),
            &[
                "test.yaml:10:63: error: spec.disks[0].ssd: `ssd` is not available on virtio disks\n  help: remove `ssd`, or use a scsi or sata slot",
            ],
        );
        assert_eq!(
            errors(&vm(&format!(
                "{BASE}  disks: [{{storage: local, size: 8G, interface: nvme0, ssd: false}}]\n"
            )))
            .len(),
            1
        );
    }

    #[test]
    fn a_disk_needs_a_size_unless_it_imports_an_image() {
        assert_errors(
            &vm(&format!("{BASE}  disks: [{{storage: local}}]\n")),
            &[
                "test.yaml:10:11: error: spec.disks[0].size: missing required field\n  help: give a `size`, or an `image` to import",
            ],
        );
        let r = valid(&vm(&format!(
            "{BASE}  disks: [{{storage: local, image: debian-cloud}}]\n"
        )));
        assert_eq!(r.references[0].target.to_string(), "DiskImage/debian-cloud");
    }

    #[test]
    fn clone_with_disks_is_an_error_and_clone_without_is_a_reference() {
        assert_errors(
            &vm(&format!(
                "{BASE}  clone: debian-tpl\n  disks: [{{storage: local, size: 8G}}]\n"
            )),
            &[
                "test.yaml:11:10: error: spec.disks: `clone` and `disks` are both set\n  help: a clone takes its disks from the template; remove `disks`",
            ],
        );
        let r = valid(&vm(&format!("{BASE}  clone: debian-tpl\n")));
        assert_eq!(r.references[0].target.to_string(), "TemplateVM/debian-tpl");
        assert_eq!(r.references[0].field, "spec.clone");
    }

    #[test]
    fn a_vm_without_disks_or_clone_is_an_error() {
        assert_errors(
            &vm(BASE),
            &[
                "test.yaml:5:1: error: spec.disks: missing required field\n  help: add at least one disk, or `clone` a TemplateVM",
            ],
        );
    }

    #[test]
    fn cdrom_none_is_not_a_reference() {
        let r = valid(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n  hardware: {{cdrom: {{iso: none}}}}\n"
        )));
        assert!(r.references.is_empty());
    }

    #[test]
    fn ssh_keys_mixing_star_and_keys_or_with_refs_are_errors() {
        let e = errors(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n  cloud-init-data:\n    ssh-keys: ['*', 'ssh-ed25519 AAAA u@h']\n    ssh-key-refs: [cloud-init.ssh-keys.admin]\n"
        )));
        assert_eq!(
            e,
            [
                "test.yaml:12:15: error: spec.cloud-init-data.ssh-keys: `*` is mixed with keys\n  help: `[\"*\"]` alone leaves the keys to PVE; otherwise list only keys",
                "test.yaml:13:5: error: spec.cloud-init-data.ssh-key-refs: `ssh-keys` and `ssh-key-refs` are both set\n  help: use one of them: inline keys or references to the cluster's SOPS document",
            ]
        );
        let Spec::Vm(v) = spec(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n  cloud-init-data: {{ssh-keys: ['*']}}\n"
        ))) else {
            panic!()
        };
        assert_eq!(v.cloud_init_data.ssh_keys, SshKeys::Pve);
    }

    #[test]
    fn a_gateway_without_an_ip_is_an_error() {
        assert_errors(
            &vm(&format!(
                "{BASE}  disks: [{{storage: local, size: 8G}}]\n  cloud-init-data:\n    ipconfigs: [{{nic: 0, gateway: 10.0.0.1}}]\n"
            )),
            &[
                "test.yaml:12:35: error: spec.cloud-init-data.ipconfigs[0].gateway: gateway without ip\n  help: add a static `ip` for this NIC, or remove `gateway`",
            ],
        );
    }

    #[test]
    fn state_must_be_started_or_stopped_and_a_template_vm_only_stopped() {
        assert_errors(
            &vm(&format!(
                "{BASE}  state: running\n  disks: [{{storage: local, size: 8G}}]\n"
            )),
            &[
                "test.yaml:10:10: error: spec.state: expected one of `started`, `stopped`, found `running`",
            ],
        );
        assert_errors(
            &doc(
                "TemplateVM",
                "tpl",
                &format!("{BASE}  state: started\n  disks: [{{storage: local, size: 8G}}]\n"),
            ),
            &[
                "test.yaml:10:10: error: spec.state: a TemplateVM is always stopped\n  help: remove `state`, or write `state: stopped`",
            ],
        );
        let Spec::Vm(v) = spec(&doc(
            "TVM",
            "tpl",
            &format!("{BASE}  disks: [{{storage: local, size: 8G}}]\n"),
        )) else {
            panic!()
        };
        assert_eq!(v.state, PowerState::Stopped);
    }

    #[test]
    fn a_pool_is_kept_as_declared_and_absent_means_not_managed() {
        let disks = "  disks: [{storage: local, size: 8G}]\n";
        let Spec::Vm(v) = spec(&vm(&format!("{BASE}{disks}  pool: prod/web\n"))) else {
            panic!()
        };
        assert_eq!(v.pool.as_deref(), Some("prod/web"));
        let Spec::Vm(v) = spec(&vm(&format!("{BASE}{disks}"))) else {
            panic!()
        };
        assert_eq!(v.pool, None);
    }

    #[test]
    fn a_pool_id_pve_would_refuse_is_located_with_the_format() {
        let disks = "  disks: [{storage: local, size: 8G}]\n";
        for (pool, message) in [
            (
                "a/b/c/d",
                "pool `a/b/c/d` is nested too deeply (at most 3 levels)",
            ),
            ("prod web", "`prod web` is not a PVE pool id"),
            ("prod//web", "`prod//web` is not a PVE pool id"),
            (
                "prod/9lives",
                "pool `prod/9lives`: each level must start with a letter",
            ),
        ] {
            let e = errors(&vm(&format!("{BASE}{disks}  pool: '{pool}'\n")));
            assert_eq!(e.len(), 1, "{pool}: {e:#?}");
            assert!(
                e[0].starts_with(&format!(
                    "test.yaml:11:9: error: spec.pool: {message}\n  help: pool ids are letters"
                )),
                "{pool}: {e:#?}"
            );
        }
    }

    #[test]
    fn a_pool_in_extra_is_refused_for_the_pool_field() {
        let e = errors(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n  extra: {{pool: prod}}\n"
        )));
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(
            e[0].contains(
                "spec.extra.pool: `pool` is managed by ProxOps and cannot be set in `extra`"
            ),
            "{e:#?}"
        );
    }

    #[test]
    fn reserved_extra_keys_are_refused() {
        let e = errors(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n  extra: {{memory: '4096', scsi1: x, net0: y, ipconfig2: z, virtio3: ok, scsihw: ok}}\n"
        )));
        assert_eq!(e.len(), 4, "{e:#?}");
        assert!(e[0].starts_with("test.yaml:11:11: error: spec.extra.memory: `memory` is managed by ProxOps and cannot be set in `extra`\n  help: set it through its manifest field instead"), "{e:#?}");
    }

    #[test]
    fn conflicting_disk_controllers_and_unknown_ones_are_errors() {
        let e = errors(&vm(&format!(
            "{BASE}  disks:\n    - {{storage: local, size: 8G, controller: virtio-scsi-pci}}\n    - {{storage: local, size: 8G, controller: megasas}}\n    - {{storage: local, size: 8G, controller: virtio-scsi}}\n"
        )));
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(e[0].contains("spec.disks[1].controller: controller `megasas` conflicts with `virtio-scsi-pci` set by `spec.disks[0].controller`"), "{e:#?}");
        assert!(
            e[1].contains("unknown SCSI controller `virtio-scsi`"),
            "{e:#?}"
        );
    }

    #[test]
    fn every_problem_of_a_document_is_reported_at_once() {
        let yaml = vm(
            "  node: pve_1\n  vmid: 5\n  memory: 8G\n  cpu: {type: host, cores: 0}\n  disks: [{storage: local, size: 8G, interface: virtio0, ssd: true}, {storage: local, size: 1, interface: virtio0}]\n  networks: [{bridge: vmbr0, mac: zz, vlan: 5000}]\n  bogus: 1\n",
        );
        let e = errors(&yaml);
        assert_eq!(e.len(), 9, "{e:#?}");
        let file = parse(&yaml);
        // The identity survives for cross-resource checks; the spec does not.
        assert_eq!(file.resources.len(), 1);
        assert!(file.resources[0].spec.is_none());
    }

    #[test]
    fn hardware_blocks_need_their_storage() {
        let e = errors(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n  hardware:\n    efi-disk: {{template: 4m}}\n    tpm: {{version: v2.0}}\n    cloud-init: {{enabled: true}}\n"
        )));
        assert_eq!(e.len(), 3, "{e:#?}");
        assert!(
            e[0].contains("spec.hardware.efi-disk.storage: missing required field"),
            "{e:#?}"
        );
        assert!(
            e[1].contains("spec.hardware.tpm.storage: missing required field"),
            "{e:#?}"
        );
        assert!(e[2].contains("spec.hardware.cloud-init.storage: missing required field\n  help: a cloud-init drive needs a storage with `images` content"), "{e:#?}");
    }

    #[test]
    fn nic_values_are_checked() {
        let e = errors(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n  networks: [{{bridge: vmbr0, model: virtio-net, mac: 'bc:24:11', vlan: 4095}}]\n"
        )));
        assert_eq!(e.len(), 3, "{e:#?}");
        assert!(e[0].contains("spec.networks[0].model: unknown NIC model `virtio-net`\n  help: did you mean `virtio`?"), "{e:#?}");
        assert!(
            e[1].contains("spec.networks[0].mac: `bc:24:11` is not a MAC address"),
            "{e:#?}"
        );
        assert!(
            e[2].contains("spec.networks[0].vlan: VLAN tag 4095 is outside 1..=4094"),
            "{e:#?}"
        );
    }

    #[test]
    fn pci_addresses_boot_order_names_and_tags_are_checked() {
        let e = errors(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n  hardware:\n    pci-devices: [{{slot: hostpci0, device: gpu}}]\n  options: {{boot-order: [scsi0, scsi0]}}\n  pve-name: web_1\n  tags: ['-x']\n"
        )));
        assert_eq!(e.len(), 4, "{e:#?}");
        assert!(
            e[0].contains("spec.hardware.pci-devices[0].device: `gpu` is not a PCI address"),
            "{e:#?}"
        );
        assert!(
            e[1].contains("spec.options.boot-order[1]: `scsi0` appears twice in the boot order"),
            "{e:#?}"
        );
        assert!(
            e[2].contains("spec.pve-name: `web_1` is not a valid PVE guest name"),
            "{e:#?}"
        );
        assert!(
            e[3].contains("spec.tags[0]: `-x` is not a PVE tag"),
            "{e:#?}"
        );
        for ok in ["01:00.0", "0000:01:00.0", "0000:01:00", "01:00"] {
            assert!(is_pci_address(ok), "{ok}");
        }
    }

    #[test]
    fn secret_references_and_ip_configs_are_checked() {
        let e = errors(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n  cloud-init-data:\n    ssh-key-refs: [admin]\n    ci-password-ref: cloud-init.passwords.Root\n    ipconfigs:\n      - {{nic: 0, ip: dhcp, gateway: 10.0.0.1}}\n      - {{nic: 1, ip: 10.0.0.5}}\n      - {{nic: 2, ip: dhcp}}\n      - {{nic: 2, ip: 10.0.0.6/24}}\n"
        )));
        assert_eq!(e.len(), 5, "{e:#?}");
        assert!(e[0].contains("ssh-key-refs[0]: `admin` is not an SSH key reference\n  help: write `cloud-init.ssh-keys.<name>`"), "{e:#?}");
        assert!(
            e[1].contains(
                "ci-password-ref: `cloud-init.passwords.Root` is not a password reference"
            ),
            "{e:#?}"
        );
        assert!(
            e[2].contains("ipconfigs[0].gateway: gateway with `ip: dhcp`"),
            "{e:#?}"
        );
        assert!(
            e[3].contains(
                "ipconfigs[1].ip: `10.0.0.5` is not an address with a prefix length, nor `dhcp`"
            ),
            "{e:#?}"
        );
        assert!(
            e[4].contains("ipconfigs[3].nic: nic 2 already has an ipconfig"),
            "{e:#?}"
        );
    }

    #[test]
    fn a_quoted_number_is_not_an_integer_and_a_list_is_not_a_quantity() {
        assert_errors(
            &vm(
                "  node: pve1\n  vmid: '101'\n  memory: [2GiB]\n  cpu: {type: host, cores: 2}\n  disks: [{storage: local, size: 8G}]\n",
            ),
            &[
                "test.yaml:7:9: error: spec.vmid: expected an integer, found a string",
                "test.yaml:8:11: error: spec.memory: expected a quantity such as `4GiB`, found a list",
            ],
        );
    }

    #[test]
    fn yaml_1_1_words_stay_text_where_text_is_wanted() {
        let Spec::Vm(v) = spec(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G, discard: on, iothread: yes}}]\n  pve-description: no\n"
        ))) else {
            panic!()
        };
        assert_eq!(v.disks[0].discard, Some(Discard::On));
        assert_eq!(v.disks[0].iothread, Some(true));
        assert_eq!(v.pve_description.as_deref(), Some("no"));
    }

    #[test]
    fn out_of_range_integers_say_what_is_allowed() {
        assert_errors(
            &vm(
                "  node: pve1\n  vmid: 101\n  memory: 2GiB\n  cpu: {type: host, cores: -1}\n  disks: [{storage: local, size: 8G}]\n  networks: [{bridge: vmbr0, rate-limit: 99999999999}]\n",
            ),
            &[
                "test.yaml:9:28: error: spec.cpu.cores: expected a whole number, found `-1`",
                "test.yaml:11:42: error: spec.networks[0].rate-limit: `99999999999` is too large (at most 4294967295)",
            ],
        );
    }
    #[test]
    fn snippets_are_inline_or_a_yaml_file_under_snippets_and_name_only_sops_references() {
        let v = valid(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n  cloud-init:\n    user-data: \"#cloud-config\\npassword: ${{secret:secrets.db}}\\n\"\n    network-data: {{file: snippets/net.yaml}}\n    snippets-storage: nfs-ci\n"
        )));
        let Some(Spec::Vm(spec)) = &v.spec else {
            panic!("a VM")
        };
        let snippets = &spec.cloud_init_data.snippets;
        assert_eq!(
            snippets.storage.as_ref().map(|s| s.as_str()),
            Some("nfs-ci")
        );
        assert_eq!(snippets.declared.len(), 2);
        assert_eq!(snippets.declared[0].0, SnippetKind::User);
        assert!(
            matches!(&snippets.declared[1], (SnippetKind::Network, SnippetSource::File { path, .. }) if path == "snippets/net.yaml")
        );

        let e = errors(&vm(&format!(
            "{BASE}  disks: [{{storage: local, size: 8G}}]\n  cloud-init:\n    user-data: {{file: ../etc/shadow}}\n    vendor-data: \"${{secret:admin}}\"\n"
        )));
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(e[0].contains("spec.cloud-init.user-data.file: `../etc/shadow` is not a snippet file of the repository"), "{e:#?}");
        assert!(e[1].contains("spec.cloud-init.vendor-data: `${secret:admin}` is not a reference to the SOPS document"), "{e:#?}");
    }
}
