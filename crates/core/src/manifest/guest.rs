//! Checks shared by the guest kinds (VM, TemplateVM, LXC, TemplateCT): identity, state,
//! quantities, slots, addresses, references, tags and `extra`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::check::Checker;
use super::choice::PowerState;
use super::ids::{NodeName, StorageId, VmId, is_valid_name};
use super::quantity::{ByteSize, Mebibytes};
use super::raw::RawQuantity;
use super::{Placement, Reference};
use crate::resource::{Kind, ResourceId};

/// `spec.node`.
pub(crate) fn check_node(ck: &mut Checker<'_>, raw: Option<&String>) -> Option<NodeName> {
    let name = ck.required_ref(raw, "spec.node")?;
    let node = NodeName::new(name);
    if node.is_none() && !ck.reported("spec.node") {
        ck.error_help(
            "spec.node",
            format!("`{name}` is not a node name"),
            "node names are letters, digits and inner hyphens, as PVE shows them",
        );
    }
    node
}

/// `spec.vmid`.
pub(crate) fn check_vmid(ck: &mut Checker<'_>, raw: Option<i64>) -> Option<VmId> {
    let n = ck.required_ref(raw.as_ref(), "spec.vmid").copied()?;
    if ck.reported("spec.vmid") {
        return None;
    }
    let vmid = VmId::new(n);
    if vmid.is_none() {
        ck.error_help(
            "spec.vmid",
            format!("vmid {n} is outside {}..={}", VmId::MIN, VmId::MAX),
            format!("PVE guest ids run from {} to {}", VmId::MIN, VmId::MAX),
        );
    }
    vmid
}

/// Where a guest lives, from the raw values, so that a guest with other errors still has an
/// identity for cross-resource checks.
pub(crate) fn placement(
    ck: &Checker<'_>,
    node: Option<&String>,
    vmid: Option<i64>,
) -> Option<Placement> {
    Some(Placement::Guest {
        node: node?.clone(),
        vmid: u32::try_from(vmid?).ok()?,
        vmid_location: ck.location("spec.vmid"),
    })
}

/// `spec.state`: started by default; templates are always stopped.
pub(crate) fn check_state(ck: &mut Checker<'_>, kind: Kind, raw: Option<PowerState>) -> PowerState {
    let is_template = matches!(kind, Kind::TemplateVm | Kind::TemplateCt);
    let raw = raw.filter(|_| !ck.reported("spec.state"));
    match raw {
        Some(PowerState::Started) if is_template => {
            ck.error_help(
                "spec.state",
                format!("a {kind} is always stopped"),
                "remove `state`, or write `state: stopped`",
            );
            PowerState::Stopped
        }
        Some(state) => state,
        None if is_template => PowerState::Stopped,
        None => PowerState::Started,
    }
}

/// A quantity, as bytes.
pub(crate) fn check_size(ck: &mut Checker<'_>, field: &str, raw: &RawQuantity) -> Option<ByteSize> {
    if ck.reported(field) {
        return None;
    }
    match ByteSize::parse(&raw.0) {
        Ok(size) if size.bytes() == 0 => {
            ck.error_help(field, "size is zero", "give a size such as `32GiB`");
            None
        }
        Ok(size) => Some(size),
        Err(e) => {
            ck.error_help(field, e.to_string(), e.help());
            None
        }
    }
}

/// A quantity that must be a whole number of MiB (memory, swap).
pub(crate) fn check_mib(
    ck: &mut Checker<'_>,
    field: &str,
    raw: &RawQuantity,
    allow_zero: bool,
) -> Option<Mebibytes> {
    if ck.reported(field) {
        return None;
    }
    let size = match ByteSize::parse(&raw.0) {
        Ok(size) => size,
        Err(e) => {
            ck.error_help(field, e.to_string(), e.help());
            return None;
        }
    };
    if size.bytes() == 0 && !allow_zero {
        ck.error_help(
            field,
            "must be more than zero",
            "give an amount such as `2GiB`",
        );
        return None;
    }
    match Mebibytes::from_quantity(&raw.0, size) {
        Ok(mib) => Some(mib),
        Err(e) => {
            ck.error_help(field, e.message, e.help);
            None
        }
    }
}

/// A storage id at `field`.
pub(crate) fn check_storage(
    ck: &mut Checker<'_>,
    field: &str,
    raw: Option<&String>,
) -> Option<StorageId> {
    let s = ck.required_ref(raw, field)?;
    let id = StorageId::new(s);
    if id.is_none() && !ck.reported(field) {
        ck.error_help(
            field,
            format!("`{s}` is not a storage id"),
            "storage ids are letters, digits, `-`, `_` and `.`",
        );
    }
    id
}

/// A structured reference to a resource of `kind` named at `field`.
pub(crate) fn reference(
    ck: &mut Checker<'_>,
    field: &str,
    name: &str,
    kind: Kind,
) -> Option<Reference> {
    if ck.reported(field) {
        return None;
    }
    if !is_valid_name(name) {
        ck.error_help(
            field,
            format!("`{name}` is not a {kind} name"),
            format!("write the `metadata.name` of a {kind}"),
        );
        return None;
    }
    Some(Reference {
        target: ResourceId::new(kind, name),
        field: field.to_owned(),
        location: ck.location(field),
        explicit: false,
    })
}

/// A slot name such as `scsi3` or `net0`: one of `prefixes` with an index in its range.
pub(crate) fn parse_slot<'p>(text: &str, prefixes: &[(&'p str, u32)]) -> Option<(&'p str, u32)> {
    prefixes.iter().find_map(|(prefix, max)| {
        let digits = text.strip_prefix(prefix)?;
        let ok = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        let n = digits.parse::<u32>().ok().filter(|n| ok && n <= max)?;
        Some((*prefix, n))
    })
}

/// "scsi0–scsi30, virtio0–virtio15" for help texts.
pub(crate) fn slot_ranges(prefixes: &[(&str, u32)]) -> String {
    prefixes
        .iter()
        .map(|(p, max)| format!("`{p}0`–`{p}{max}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Remembers which field took which slot, to report a second use.
#[derive(Default)]
pub(crate) struct Slots(Vec<(String, String)>);

impl Slots {
    /// Claims `slot` for `field`; reports it when another field has it.
    pub(crate) fn claim(
        &mut self,
        ck: &mut Checker<'_>,
        slot: &str,
        field: &str,
        value_field: &str,
        what: &str,
    ) -> bool {
        if let Some((_, first)) = self.0.iter().find(|(s, _)| s == slot) {
            ck.error_help(
                value_field,
                format!("slot `{slot}` is already used by `{first}`"),
                format!("give each {what} its own slot"),
            );
            return false;
        }
        self.0.push((slot.to_owned(), field.to_owned()));
        true
    }
}

/// A MAC address `aa:bb:cc:dd:ee:ff`, lowercased.
pub(crate) fn check_mac(ck: &mut Checker<'_>, field: &str, raw: &str) -> Option<String> {
    let parts: Vec<&str> = raw.split(':').collect();
    let ok = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        return Some(raw.to_ascii_lowercase());
    }
    if !ck.reported(field) {
        ck.error_help(
            field,
            format!("`{raw}` is not a MAC address"),
            "write six hex pairs separated by colons, e.g. `bc:24:11:00:00:01`",
        );
    }
    None
}

/// An address with a prefix length, e.g. `10.0.0.5/24`.
pub(crate) fn is_cidr(text: &str) -> bool {
    let Some((addr, prefix)) = text.split_once('/') else {
        return false;
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return false;
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    prefix.parse::<u8>().is_ok_and(|p| p <= max) && !prefix.starts_with('+')
}

/// A VLAN tag; `0` means none, as in the Go program.
pub(crate) fn check_vlan(
    ck: &mut Checker<'_>,
    field: &str,
    raw: Option<u32>,
) -> Option<Option<u16>> {
    match raw {
        None | Some(0) => Some(None),
        Some(n) if n <= 4094 => Some(u16::try_from(n).ok()),
        Some(n) => {
            if !ck.reported(field) {
                ck.error_help(
                    field,
                    format!("VLAN tag {n} is outside 1..=4094"),
                    "use a tag from 1 to 4094, or leave it out",
                );
            }
            None
        }
    }
}

/// PVE tags: letters, digits, `_`, `-`, `+`, `.`; not starting with `-`, `+` or `.`.
pub(crate) fn check_tags(ck: &mut Checker<'_>, raw: Option<&Vec<String>>) -> Option<Vec<String>> {
    let mut tags: Vec<String> = Vec::new();
    let mut ok = true;
    for (i, tag) in raw.into_iter().flatten().enumerate() {
        let field = format!("spec.tags[{i}]");
        let valid = tag
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            && tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'+' | b'.'));
        if !valid {
            ok = false;
            if !ck.reported(&field) {
                ck.error_help(&field, format!("`{tag}` is not a PVE tag"), "tags are letters, digits, `_`, `-`, `+` and `.`, starting with a letter, digit or `_`");
            }
        } else if !tags.iter().any(|t| t.eq_ignore_ascii_case(tag)) {
            tags.push(tag.clone());
        }
    }
    ok.then_some(tags)
}

/// `spec.pool`: a PVE resource pool id as PVE accepts one. pve-access-control @ 5ccd07d
/// `src/PVE/AccessControl.pm` `verify_poolname` (the `pve-poolid` format): at most three
/// `/`-separated levels of letters, digits, `.`, `-` and `_`; and pve-manager @ 14a22df3
/// `PVE/API2/Pool.pm` `create_pool` refuses a level that does not start with a letter
/// (`pool name must start with a letter`), so no pool PVE holds has one. Whether the pool
/// exists is PVE's to say: the create answers `Permission check failed (pool 'x' does not
/// exist)` (`check_pool_exist`).
pub(crate) fn check_pool(ck: &mut Checker<'_>, raw: Option<&String>) -> Option<Option<String>> {
    let Some(pool) = raw else {
        return Some(None);
    };
    if ck.reported("spec.pool") {
        return None;
    }
    let levels: Vec<&str> = pool.split('/').collect();
    let problem = if levels.len() > 3 {
        Some(format!(
            "pool `{pool}` is nested too deeply (at most 3 levels)"
        ))
    } else if levels.iter().any(|l| {
        l.is_empty()
            || !l
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    }) {
        Some(format!("`{pool}` is not a PVE pool id"))
    } else if levels
        .iter()
        .any(|l| !l.bytes().next().is_some_and(|b| b.is_ascii_alphabetic()))
    {
        Some(format!(
            "pool `{pool}`: each level must start with a letter"
        ))
    } else {
        None
    };
    match problem {
        Some(message) => {
            ck.error_help(
                "spec.pool",
                message,
                "pool ids are letters, digits, `.`, `-` and `_`, each level starting with a letter, at most 3 levels separated by `/` (`pveum pool list` shows them)",
            );
            None
        }
        None => Some(Some(pool.clone())),
    }
}

/// `spec.extra`: PVE keys passed verbatim, except those ProxOps manages itself.
pub(crate) fn check_extra(
    ck: &mut Checker<'_>,
    raw: Option<&BTreeMap<String, String>>,
    reserved: &[&str],
    prefixes: &[&str],
) -> Option<BTreeMap<String, String>> {
    let Some(raw) = raw else {
        return Some(BTreeMap::new());
    };
    let mut ok = true;
    for key in raw.keys() {
        let field = format!("spec.extra.{key}");
        let is_reserved = reserved.contains(&key.as_str())
            || prefixes.iter().any(|p| {
                key.strip_prefix(p)
                    .is_some_and(|rest| rest.is_empty() || rest.bytes().all(|b| b.is_ascii_digit()))
            });
        if is_reserved {
            ok = false;
            ck.error_at_key(
                &field,
                format!("`{key}` is managed by ProxOps and cannot be set in `extra`"),
                "set it through its manifest field instead",
            );
        } else if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
        {
            ok = false;
            ck.error_at_key(
                &field,
                format!("`{key}` is not a PVE config key"),
                "PVE keys are letters, digits, `-` and `_`",
            );
        }
    }
    ok.then(|| raw.clone())
}

impl Checker<'_> {
    /// Like [`Checker::required`], for an already borrowed option.
    pub(crate) fn required_ref<'v, T>(
        &mut self,
        value: Option<&'v T>,
        field: &str,
    ) -> Option<&'v T> {
        if value.is_none() {
            self.missing(field, None);
        }
        value
    }
}
