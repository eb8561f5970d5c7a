//! Resource identity: the seven manifest kinds and `ResourceId` (kind + metadata.name).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A manifest kind.
///
/// The order of the variants is the kind rank used to order plans (artifacts first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Kind {
    /// A bootable ISO image on a storage (`iso` content).
    #[serde(rename = "ISO")]
    Iso,
    /// An LXC template tarball on a storage (`vztmpl` content).
    #[serde(rename = "CTTemplate")]
    CtTemplate,
    /// A disk image to import into VMs (`import` content).
    #[serde(rename = "DiskImage")]
    DiskImage,
    /// A QEMU template guest.
    #[serde(rename = "TemplateVM")]
    TemplateVm,
    /// An LXC template guest.
    #[serde(rename = "TemplateCT")]
    TemplateCt,
    /// A QEMU virtual machine.
    #[serde(rename = "VM")]
    Vm,
    /// An LXC container.
    #[serde(rename = "LXC")]
    Lxc,
}

impl Kind {
    /// Every kind, in rank order.
    pub const ALL: [Kind; 7] = [
        Kind::Iso,
        Kind::CtTemplate,
        Kind::DiskImage,
        Kind::TemplateVm,
        Kind::TemplateCt,
        Kind::Vm,
        Kind::Lxc,
    ];

    /// The canonical spelling, as written in manifests and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Iso => "ISO",
            Kind::CtTemplate => "CTTemplate",
            Kind::DiskImage => "DiskImage",
            Kind::TemplateVm => "TemplateVM",
            Kind::TemplateCt => "TemplateCT",
            Kind::Vm => "VM",
            Kind::Lxc => "LXC",
        }
    }

    /// The folder that holds this kind's manifests in composition mode.
    pub fn root(self) -> &'static str {
        match self {
            Kind::Iso => "iso",
            Kind::CtTemplate => "ctt",
            Kind::DiskImage => "diskimage",
            Kind::TemplateVm => "templatevm",
            Kind::TemplateCt => "templatect",
            Kind::Vm => "vm",
            Kind::Lxc => "lxc",
        }
    }

    /// Storage artifacts (downloaded files) as opposed to guests.
    pub fn is_artifact(self) -> bool {
        matches!(self, Kind::Iso | Kind::CtTemplate | Kind::DiskImage)
    }

    /// Guests: VM, LXC, TemplateVM, TemplateCT (they share one vmid pool).
    pub fn is_guest(self) -> bool {
        !self.is_artifact()
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `kind:` value that names no kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown kind `{0}`")]
pub struct UnknownKind(pub String);

impl FromStr for Kind {
    type Err = UnknownKind;

    /// Case-insensitive, with the Go program's aliases (CTT, DISK, TVM, TEMPLATE, TCT).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "vm" => Kind::Vm,
            "lxc" => Kind::Lxc,
            "iso" => Kind::Iso,
            "cttemplate" | "ctt" => Kind::CtTemplate,
            "diskimage" | "disk" => Kind::DiskImage,
            "templatevm" | "tvm" | "template" => Kind::TemplateVm,
            "templatect" | "tct" => Kind::TemplateCt,
            _ => return Err(UnknownKind(s.to_owned())),
        })
    }
}

/// The identity of a resource within one desired state: kind and `metadata.name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ResourceId {
    /// The kind.
    pub kind: Kind,
    /// `metadata.name`.
    pub name: String,
}

impl ResourceId {
    /// A resource id.
    pub fn new(kind: Kind, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
        }
    }
}

impl fmt::Display for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_parses_case_insensitively_with_go_aliases() {
        assert_eq!("vm".parse::<Kind>(), Ok(Kind::Vm));
        assert_eq!("CTT".parse::<Kind>(), Ok(Kind::CtTemplate));
        assert_eq!("Disk".parse::<Kind>(), Ok(Kind::DiskImage));
        assert_eq!("TEMPLATE".parse::<Kind>(), Ok(Kind::TemplateVm));
        assert_eq!("tct".parse::<Kind>(), Ok(Kind::TemplateCt));
        assert!("vms".parse::<Kind>().is_err());
    }

    #[test]
    fn artifacts_rank_before_guests() {
        assert!(Kind::Iso < Kind::Vm && Kind::DiskImage < Kind::TemplateVm);
    }
}
