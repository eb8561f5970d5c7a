//! The manifest files as written: serde types mirroring every key, before validation.
//!
//! Keys are exactly the Go program's (original-proxops.md §1) plus DESIGN.md's additions.
//! Every field is optional here, even required ones: the decoder (`decode.rs`) never stops,
//! and validation reports a missing field at its parent mapping. `deny_unknown_fields` states
//! the strictness the decoder enforces (it reports unknown keys itself, with a suggestion) and
//! makes the JSON Schema (`crate::schema`), derived from these same types, say
//! `additionalProperties: false`. `#[schemars(required)]` marks what validation requires, so
//! the schema and the parser cannot drift apart.
//!
//! Nothing here checks values; `vm.rs`, `lxc.rs` and `artifact.rs` turn these into validated
//! types.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

use super::choice::{
    Aio, Arch, Bios, ChecksumAlgorithm, Discard, EfiTemplate, Machine, Media, PowerState,
    SecureBoot, TpmVersion,
};

/// The envelope of every document, generic over its kind's `spec`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDocument<S> {
    /// Always `proxops/v1alpha1`.
    #[serde(rename = "apiVersion")]
    #[expect(
        dead_code,
        reason = "read from the tree before decoding; listed so the key is known"
    )]
    #[schemars(required)]
    pub(crate) api_version: Option<String>,
    /// VM, LXC, ISO, CTTemplate, DiskImage, TemplateVM or TemplateCT (case-insensitive;
    /// aliases CTT, DISK, TVM, TEMPLATE, TCT).
    #[schemars(required)]
    #[expect(
        dead_code,
        reason = "read from the tree before decoding; listed so the key is known"
    )]
    pub(crate) kind: Option<String>,
    /// Name, labels and annotations.
    #[schemars(required)]
    pub(crate) metadata: Option<RawMetadata>,
    /// The kind's desired state.
    #[schemars(required)]
    pub(crate) spec: Option<S>,
}

/// `metadata`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetadata {
    /// Lowercase letters, digits and single hyphens, at most 64; unique per kind.
    #[schemars(
        required,
        regex(pattern = r"^[a-z0-9]((-?[a-z0-9])*)$"),
        length(max = 64)
    )]
    pub(crate) name: Option<String>,
    /// Accepted for compatibility; has no effect.
    #[expect(
        dead_code,
        reason = "accepted for compatibility with the Go program; has no effect"
    )]
    pub(crate) namespace: Option<String>,
    /// Informational labels.
    #[schemars(with = "Option<BTreeMap<String, ScalarText>>")]
    pub(crate) labels: Option<BTreeMap<String, String>>,
    /// `proxops/depends-on`, `proxops/drift`, `proxops/adopt`, `proxops/restart`, and any others.
    #[schemars(with = "Option<BTreeMap<String, ScalarText>>")]
    pub(crate) annotations: Option<BTreeMap<String, String>>,
}

/// A map value as the schema describes it: the parser reads any scalar as its text, so
/// `balloon: 0` and `proxops/adopt: true` are accepted where a string is expected.
pub(crate) struct ScalarText;

impl JsonSchema for ScalarText {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ScalarText".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": ["string", "number", "boolean"] })
    }
}

/// A quantity as written: a bare integer (bytes) or a number with a unit (`8GiB`, `512M`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawQuantity(pub(crate) String);

/// The newtype name by which the decoder recognises a quantity, to say "expected a quantity".
pub(crate) const QUANTITY: &str = "$proxops::Quantity";

impl<'de> Deserialize<'de> for RawQuantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> serde::de::Visitor<'de> for Text {
            type Value = RawQuantity;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a quantity such as `4GiB`")
            }
            fn visit_newtype_struct<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<RawQuantity, D::Error> {
                String::deserialize(d).map(RawQuantity)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_owned()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_string()))
            }
        }
        deserializer.deserialize_newtype_struct(QUANTITY, Text)
    }
}

impl JsonSchema for RawQuantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "bytes as a bare integer, or an integer with a unit: K M G T P (decimal, also KB...) or Ki Mi Gi Ti Pi (binary, also KiB...), case-insensitive",
            "type": ["integer", "string"],
            "minimum": 0,
            "pattern": "^\\s*[0-9]+\\s*([kKmMgGtTpP][iI]?[bB]?)?\\s*$"
        })
    }
}

// ----------------------------------------------------------------------------------------
// VM and TemplateVM

/// `spec` of a VM or TemplateVM.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawVmSpec {
    /// The PVE node the guest lives on.
    #[schemars(required)]
    pub(crate) node: Option<String>,
    /// The guest id, 100..=999999999, unique in the cluster.
    #[schemars(required, range(min = 100, max = 999_999_999))]
    pub(crate) vmid: Option<i64>,
    /// `started` (default) or `stopped`; a TemplateVM is always stopped.
    pub(crate) state: Option<PowerState>,
    /// Memory, a whole number of MiB (`4GiB`, `2048MiB`).
    #[schemars(required)]
    pub(crate) memory: Option<RawQuantity>,
    /// CPU type, cores and flags.
    #[schemars(required)]
    pub(crate) cpu: Option<RawVmCpu>,
    /// Disks; at least one unless `clone` is set.
    pub(crate) disks: Option<Vec<RawDisk>>,
    /// Network interfaces.
    pub(crate) networks: Option<Vec<RawVmNic>>,
    /// Machine, firmware, CD-ROM, EFI disk, cloud-init drive, TPM, PCI passthrough.
    pub(crate) hardware: Option<RawHardware>,
    /// Guest options; booleans are tri-state (absent = not managed).
    pub(crate) options: Option<RawVmOptions>,
    /// Cloud-init user, keys, DNS and IP configuration.
    pub(crate) cloud_init_data: Option<RawCloudInitData>,
    /// Cloud-init user-, vendor- and network-data written as snippets on the node.
    pub(crate) cloud_init: Option<RawCloudInitSnippets>,
    /// The PVE guest name (default `metadata.name`).
    pub(crate) pve_name: Option<String>,
    /// The PVE description.
    pub(crate) pve_description: Option<String>,
    /// PVE tags; `proxops` is added.
    pub(crate) tags: Option<Vec<String>>,
    /// Further PVE config keys, sent verbatim.
    #[schemars(with = "Option<BTreeMap<String, ScalarText>>")]
    pub(crate) extra: Option<BTreeMap<String, String>>,
    /// A TemplateVM on the same node to full-clone from.
    pub(crate) clone: Option<String>,
    /// The PVE resource pool the guest belongs to (absent: membership not managed).
    #[schemars(regex(pattern = r"^[A-Za-z][A-Za-z0-9.\-_]*(/[A-Za-z][A-Za-z0-9.\-_]*){0,2}$"))]
    pub(crate) pool: Option<String>,
}

/// `spec.cpu` of a VM.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawVmCpu {
    /// PVE CPU type (`host`, `x86-64-v2-AES`, ...).
    #[serde(rename = "type")]
    #[schemars(required)]
    pub(crate) cpu_type: Option<String>,
    /// Cores per socket.
    #[schemars(required, range(min = 1))]
    pub(crate) cores: Option<u32>,
    /// Accepted and never sent (as in the Go program).
    pub(crate) flags: Option<Vec<String>>,
}

/// `spec.disks[]`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawDisk {
    /// Storage the volume is allocated on.
    #[schemars(required)]
    pub(crate) storage: Option<String>,
    /// Size; required unless `image` is set (with `image`, the imported disk is grown to it).
    pub(crate) size: Option<RawQuantity>,
    /// A DiskImage name to import.
    pub(crate) image: Option<String>,
    /// Slot: scsiN (default `scsi<index>`), virtioN, sataN, ideN or nvmeN.
    pub(crate) interface: Option<String>,
    /// SCSI controller (`scsihw`) for the whole VM.
    pub(crate) controller: Option<String>,
    /// `iothread=1`.
    pub(crate) iothread: Option<bool>,
    /// `discard=`.
    pub(crate) discard: Option<Discard>,
    /// `ssd=`; not on virtio or nvme.
    pub(crate) ssd: Option<bool>,
    /// `aio=`.
    pub(crate) aio: Option<Aio>,
}

/// `spec.networks[]` of a VM.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawVmNic {
    /// NIC model (default `virtio`).
    pub(crate) model: Option<String>,
    /// Bridge.
    #[schemars(required)]
    pub(crate) bridge: Option<String>,
    /// Fixed MAC address.
    pub(crate) mac: Option<String>,
    /// VLAN tag 1..4094 (sent as `tag=`).
    #[schemars(range(min = 0, max = 4094))]
    pub(crate) vlan: Option<u32>,
    /// Rate limit in MB/s.
    pub(crate) rate_limit: Option<u32>,
    /// PVE firewall on this NIC.
    pub(crate) firewall: Option<bool>,
    /// `netN` (default `net<index>`).
    pub(crate) slot: Option<String>,
}

/// `spec.hardware`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawHardware {
    /// `i440fx` or `q35`.
    pub(crate) machine: Option<Machine>,
    /// `seabios` or `ovmf`.
    pub(crate) bios: Option<Bios>,
    /// `vga`.
    pub(crate) display: Option<String>,
    /// Sockets.
    pub(crate) sockets: Option<u32>,
    /// NUMA.
    pub(crate) numa: Option<bool>,
    /// `serial0` (e.g. `socket`).
    pub(crate) serial0: Option<String>,
    /// The CD-ROM drive.
    pub(crate) cdrom: Option<RawCdrom>,
    /// The EFI vars disk.
    pub(crate) efi_disk: Option<RawEfiDisk>,
    /// The cloud-init drive.
    pub(crate) cloud_init: Option<RawCloudInitDrive>,
    /// The TPM state volume.
    pub(crate) tpm: Option<RawTpm>,
    /// PCI passthrough.
    pub(crate) pci_devices: Option<Vec<RawPciDevice>>,
}

/// `hardware.cdrom`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawCdrom {
    /// An ISO name, or `none` for an empty drive.
    #[schemars(required)]
    pub(crate) iso: Option<String>,
    /// `cdrom` (default) or `disk`.
    pub(crate) media: Option<Media>,
}

/// `hardware.efi-disk`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawEfiDisk {
    /// Storage.
    #[schemars(required)]
    pub(crate) storage: Option<String>,
    /// Size (default 4MiB).
    pub(crate) size: Option<RawQuantity>,
    /// `efitype`: `byos`, `2m`, `4m` or `8m`.
    pub(crate) template: Option<EfiTemplate>,
    /// `pre-enrolled-keys`: `enabled` or `disabled`.
    pub(crate) secure_boot: Option<SecureBoot>,
}

/// `hardware.cloud-init`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawCloudInitDrive {
    /// Whether the VM gets a cloud-init drive.
    pub(crate) enabled: Option<bool>,
    /// Storage (with `images` content); required when enabled.
    pub(crate) storage: Option<String>,
    /// Size (default 4MiB).
    pub(crate) size: Option<RawQuantity>,
}

/// `hardware.tpm`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawTpm {
    /// Storage for `tpmstate0`.
    #[schemars(required)]
    pub(crate) storage: Option<String>,
    /// `v1.2` or `v2.0` (default).
    pub(crate) version: Option<TpmVersion>,
}

/// `hardware.pci-devices[]`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawPciDevice {
    /// `hostpciN`.
    #[schemars(required)]
    pub(crate) slot: Option<String>,
    /// PCI address `[domain:]bus:device[.function]`.
    #[schemars(required)]
    pub(crate) device: Option<String>,
    /// `pcie=`.
    pub(crate) pcie: Option<bool>,
}

/// `spec.options` of a VM.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawVmOptions {
    /// Start at boot.
    pub(crate) onboot: Option<bool>,
    /// Startup order (`order=1,up=30`).
    pub(crate) startup: Option<String>,
    /// PVE protection.
    pub(crate) protection: Option<bool>,
    /// QEMU guest agent.
    pub(crate) agent: Option<bool>,
    /// ACPI.
    pub(crate) acpi: Option<bool>,
    /// USB tablet pointer.
    pub(crate) tablet: Option<bool>,
    /// Hotplug features.
    pub(crate) hotplug: Option<Vec<String>>,
    /// Boot order (`scsi0`, `ide2`, `net0`, ...).
    pub(crate) boot_order: Option<Vec<String>>,
    /// Hide the hypervisor from the guest (`cpu: hidden=1`).
    pub(crate) hidden: Option<bool>,
    /// Accepted, reported, never sent (no PVE key of that name).
    pub(crate) nested_virt: Option<bool>,
}

/// `spec.cloud-init-data`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawCloudInitData {
    /// `ciuser`.
    pub(crate) ci_user: Option<String>,
    /// OpenSSH public keys, or `["*"]` to leave the keys to PVE.
    pub(crate) ssh_keys: Option<Vec<String>>,
    /// `cloud-init.ssh-keys.<name>` entries of the cluster's SOPS document.
    pub(crate) ssh_key_refs: Option<Vec<String>>,
    /// `cloud-init.passwords.<name>` in the cluster's SOPS document.
    pub(crate) ci_password_ref: Option<String>,
    /// `nameserver`.
    pub(crate) nameservers: Option<Vec<String>>,
    /// `searchdomain`.
    pub(crate) search_domains: Option<Vec<String>>,
    /// `ipconfigN`.
    pub(crate) ipconfigs: Option<Vec<RawIpConfig>>,
}

/// `spec.cloud-init`: the cloud-init files ProxOps writes as snippets on the node (DESIGN.md
/// §"Later issues": `spec.cloud-init.user-data`, `vendor-data`, `network-data`). Apart from
/// `spec.cloud-init-data` (PVE's own `ci*` keys) and `spec.hardware.cloud-init` (the drive).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawCloudInitSnippets {
    /// cloud-init user data, written as a snippet on the node (`cicustom` `user=`).
    pub(crate) user_data: Option<RawSnippet>,
    /// cloud-init vendor data, written as a snippet on the node (`cicustom` `vendor=`).
    pub(crate) vendor_data: Option<RawSnippet>,
    /// cloud-init network data, written as a snippet on the node (`cicustom` `network=`).
    pub(crate) network_data: Option<RawSnippet>,
    /// The storage with `snippets` content the snippets are written to (default from
    /// `[snippets] storage` in agent.toml, `local` by default).
    pub(crate) snippets_storage: Option<String>,
}

/// A snippet's text: inline, or `file: <path>` of a file in the repository's `snippets/`
/// folder.
#[derive(Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(untagged)]
pub(crate) enum RawSnippet {
    /// The text itself; `${secret:<ref>}` is replaced from the cluster's SOPS document.
    Inline(String),
    /// A file of the repository.
    File(RawSnippetFile),
}

/// `file: <path>` of a snippet.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSnippetFile {
    /// Repository-relative path under `snippets/`, ending in `.yaml` or `.yml`.
    pub(crate) file: String,
}

impl<'de> Deserialize<'de> for RawSnippet {
    /// A string, or a map with the one key `file`: decoded by hand so an unknown key or a
    /// wrong type gets the decoder's located message, not serde's untagged "did not match".
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SnippetVisitor;
        impl<'de> serde::de::Visitor<'de> for SnippetVisitor {
            type Value = RawSnippet;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, or a map with `file`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawSnippet, E> {
                Ok(RawSnippet::Inline(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<RawSnippet, A::Error> {
                RawSnippetFile::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawSnippet::File)
            }
        }
        deserializer.deserialize_any(SnippetVisitor)
    }
}

/// `cloud-init-data.ipconfigs[]`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawIpConfig {
    /// NIC index (default 0).
    pub(crate) nic: Option<u32>,
    /// Address in CIDR notation, or `dhcp`.
    pub(crate) ip: Option<String>,
    /// Gateway; requires a static `ip`.
    pub(crate) gateway: Option<String>,
}

// ----------------------------------------------------------------------------------------
// LXC and TemplateCT

/// `spec` of an LXC or TemplateCT.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawLxcSpec {
    /// The PVE node the container lives on.
    #[schemars(required)]
    pub(crate) node: Option<String>,
    /// The guest id, 100..=999999999, unique in the cluster.
    #[schemars(required, range(min = 100, max = 999_999_999))]
    pub(crate) vmid: Option<i64>,
    /// `started` (default) or `stopped`; a TemplateCT is always stopped.
    pub(crate) state: Option<PowerState>,
    /// A CTTemplate name (create-only).
    #[schemars(required)]
    pub(crate) template: Option<String>,
    /// Memory, a whole number of MiB.
    #[schemars(required)]
    pub(crate) memory: Option<RawQuantity>,
    /// Swap, a whole number of MiB.
    pub(crate) swap: Option<RawQuantity>,
    /// Cores and CPU units.
    #[schemars(required)]
    pub(crate) cpu: Option<RawLxcCpu>,
    /// The root filesystem.
    #[schemars(required)]
    pub(crate) root: Option<RawRootFs>,
    /// Storage-backed mount points.
    pub(crate) mount_points: Option<Vec<RawMountPoint>>,
    /// Host directories bind-mounted into the container.
    pub(crate) bind_mounts: Option<Vec<RawBindMount>>,
    /// Network interfaces.
    pub(crate) networks: Option<Vec<RawLxcNic>>,
    /// Hostname and DNS.
    pub(crate) dns: Option<RawDns>,
    /// Architecture.
    pub(crate) arch: Option<Arch>,
    /// Container options; booleans are tri-state.
    pub(crate) options: Option<RawLxcOptions>,
    /// The PVE description.
    pub(crate) pve_description: Option<String>,
    /// PVE tags; `proxops` is added.
    pub(crate) tags: Option<Vec<String>>,
    /// Further PVE config keys, sent verbatim.
    #[schemars(with = "Option<BTreeMap<String, ScalarText>>")]
    pub(crate) extra: Option<BTreeMap<String, String>>,
    /// The PVE resource pool the container belongs to (absent: membership not managed).
    #[schemars(regex(pattern = r"^[A-Za-z][A-Za-z0-9.\-_]*(/[A-Za-z][A-Za-z0-9.\-_]*){0,2}$"))]
    pub(crate) pool: Option<String>,
}

/// `spec.cpu` of an LXC.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawLxcCpu {
    /// Cores.
    #[schemars(required, range(min = 1))]
    pub(crate) cores: Option<u32>,
    /// Accepted and never sent.
    pub(crate) units: Option<u32>,
}

/// `spec.root`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawRootFs {
    /// Storage.
    #[schemars(required)]
    pub(crate) storage: Option<String>,
    /// Size.
    #[schemars(required)]
    pub(crate) size: Option<RawQuantity>,
}

/// `spec.mount-points[]`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawMountPoint {
    /// Storage.
    #[schemars(required)]
    pub(crate) storage: Option<String>,
    /// Size.
    #[schemars(required)]
    pub(crate) size: Option<RawQuantity>,
    /// Path inside the container.
    #[schemars(required)]
    pub(crate) mount_point: Option<String>,
    /// `mpN` (default `mp<index>`).
    pub(crate) slot: Option<String>,
    /// Mount options.
    pub(crate) options: Option<RawMountOptions>,
}

/// `mount-points[].options`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawMountOptions {
    /// `ro=`.
    pub(crate) read_only: Option<bool>,
    /// `backup=`.
    pub(crate) backup: Option<bool>,
    /// `acl=`.
    pub(crate) acl: Option<bool>,
    /// `quota=`.
    pub(crate) quota: Option<bool>,
    /// `shared=`.
    pub(crate) shared: Option<bool>,
    /// `mountoptions=` (e.g. `noatime;nodev`).
    pub(crate) mount_options: Option<String>,
}

/// `spec.bind-mounts[]`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawBindMount {
    /// Absolute host directory (system roots are refused).
    #[schemars(required)]
    pub(crate) host_path: Option<String>,
    /// Path inside the container.
    #[schemars(required)]
    pub(crate) mount_point: Option<String>,
    /// `mpN` (default: after the mount points).
    pub(crate) slot: Option<String>,
    /// `ro=`.
    pub(crate) read_only: Option<bool>,
}

/// `spec.networks[]` of an LXC.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawLxcNic {
    /// Bridge.
    #[schemars(required)]
    pub(crate) bridge: Option<String>,
    /// Interface name in the container (default the slot name).
    pub(crate) iface: Option<String>,
    /// Interface type (`veth`).
    #[serde(rename = "type")]
    pub(crate) nic_type: Option<String>,
    /// VLAN tag 1..4094.
    #[schemars(range(min = 0, max = 4094))]
    pub(crate) tag: Option<u32>,
    /// Fixed MAC address.
    pub(crate) hwaddr: Option<String>,
    /// Rate limit in MB/s.
    pub(crate) rate_limit: Option<u32>,
    /// PVE firewall on this NIC.
    pub(crate) firewall: Option<bool>,
    /// CIDR address, `dhcp` or `manual`.
    pub(crate) ip: Option<String>,
    /// Gateway; requires a static `ip`.
    pub(crate) gw: Option<String>,
    /// `netN` (default `net<index>`).
    pub(crate) slot: Option<String>,
}

/// `spec.dns`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawDns {
    /// Hostname (default `metadata.name`).
    pub(crate) hostname: Option<String>,
    /// `nameserver`.
    pub(crate) nameservers: Option<Vec<String>>,
    /// `searchdomain`.
    pub(crate) domain: Option<String>,
}

/// `spec.options` of an LXC.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawLxcOptions {
    /// Unprivileged container (create-only).
    pub(crate) unprivileged: Option<bool>,
    /// PVE protection.
    pub(crate) protection: Option<bool>,
    /// Start at boot.
    pub(crate) onboot: Option<bool>,
    /// Console.
    pub(crate) console: Option<bool>,
    /// `features: nesting=`.
    pub(crate) nesting: Option<bool>,
    /// No PVE 9 write form; reported, never sent.
    pub(crate) keyctl: Option<bool>,
    /// No PVE 9 write form; reported, never sent.
    pub(crate) fuse: Option<bool>,
    /// Startup order.
    pub(crate) startup: Option<String>,
    /// Never sent.
    pub(crate) ttys: Option<u32>,
}

// ----------------------------------------------------------------------------------------
// ISO, CTTemplate, DiskImage

/// `spec` of an ISO, CTTemplate or DiskImage.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawArtifactSpec {
    /// Nodes the file must exist on (or legacy `node`, not both).
    pub(crate) nodes: Option<Vec<String>>,
    /// Legacy single node; means `nodes: [node]`.
    pub(crate) node: Option<String>,
    /// Storage id.
    #[schemars(required)]
    pub(crate) storage: Option<String>,
    /// File name on the storage.
    #[schemars(required, regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"))]
    pub(crate) filename: Option<String>,
    /// http(s) URL PVE downloads from.
    #[schemars(required, regex(pattern = r"^[hH][tT][tT][pP][sS]?://"))]
    pub(crate) url: Option<String>,
    /// Checksum PVE verifies after download.
    pub(crate) checksum: Option<RawChecksum>,
}

/// `spec.checksum`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawChecksum {
    /// md5, sha1, sha224, sha256, sha384 or sha512.
    #[schemars(required)]
    pub(crate) algorithm: Option<ChecksumAlgorithm>,
    /// Hex digest.
    #[schemars(required, regex(pattern = "^[0-9a-fA-F]+$"))]
    pub(crate) value: Option<String>,
}
