//! Test helpers: small manifests parsed through the real parser, and the transform that turns
//! a rendered config into what PVE would store and report for it (volume names, `size=`,
//! generated MACs, `smbios1`, `vmgenid`, normalised tags, a trailing newline on descriptions).

use serde_json::{Map, Value};

use super::property::{PropertyString, format_pve_size};
use super::render::{Artifacts, DiskRole, RenderedConfig, Rule, render};
use super::{GuestType, LiveConfig};
use crate::desired::Manifest;
use crate::manifest::{Resource, parse_file};
use crate::resource::Kind;

// The manifest tests' fixtures: one full VM and LXC, and the document builder.
pub(crate) use crate::manifest::testing::{FULL_LXC, FULL_VM, doc};

/// The size PVE gives an imported image in these tests (the Debian 13 genericcloud image gave
/// 3G on a live PVE; any value works as long as it is stated).
pub(crate) const IMPORTED_IMAGE_SIZE: u64 = 2 << 30;

/// Every resource of `docs` checked together as one desired state.
pub(crate) fn manifest(docs: &[String]) -> Manifest {
    let mut resources = Vec::new();
    for (i, text) in docs.iter().enumerate() {
        let file = parse_file(&format!("doc{i}.yaml"), text);
        let problems: Vec<String> = file.diagnostics.iter().map(ToString::to_string).collect();
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        resources.extend(file.resources);
    }
    match Manifest::from_parsed(resources) {
        Ok(m) => m,
        Err(e) => panic!(
            "{}",
            e.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
}

/// The one valid resource of a single document (references not checked).
pub(crate) fn resource(text: &str) -> Resource {
    let file = parse_file("test.yaml", text);
    let problems: Vec<String> = file.diagnostics.iter().map(ToString::to_string).collect();
    assert!(problems.is_empty(), "{}\n---\n{text}", problems.join("\n"));
    file.resources.into_iter().next().expect("one resource")
}

/// Renders the guest of one document against `artifacts`.
pub(crate) fn rendered(text: &str, artifacts: &Artifacts) -> RenderedConfig {
    render(&resource(text), artifacts).expect("a guest")
}

/// The artifacts the test manifests refer to.
pub(crate) fn artifacts() -> Artifacts {
    Artifacts::new()
        .with(
            Kind::DiskImage,
            "debian-cloud",
            "local:import/debian-13-genericcloud.qcow2",
        )
        .with(Kind::DiskImage, "img", "local:import/img.qcow2")
        .with(Kind::Iso, "netinst", "local:iso/debian-13-netinst.iso")
        .with(
            Kind::CtTemplate,
            "debian-13",
            "local:vztmpl/debian-13-standard.tar.zst",
        )
}

/// The live config PVE would report after creating `rendered` as guest `vmid` (and growing
/// imported disks as `grow_after_create` says).
pub(crate) fn as_pve_would_store(rendered: &RenderedConfig, vmid: u32) -> LiveConfig {
    let qemu = rendered.guest_type == GuestType::Qemu;
    let mut disk_number = 0;
    let mut mac_number = 0;
    let mut out = Map::new();
    for (key, owned) in &rendered.owned {
        let value = match &owned.rule {
            Rule::Disk(rule) if rule.role == DiskRole::CloudInit => {
                format!("{}:vm-{vmid}-cloudinit,media=cdrom", rule.storage)
            }
            Rule::Disk(rule) => {
                let bytes = match rule.role {
                    DiskRole::Efi | DiskRole::Tpm => 4 << 20,
                    _ if rule.import_from.is_some() => rendered
                        .grow_after_create
                        .iter()
                        .find(|r| &r.slot == key)
                        .map_or(IMPORTED_IMAGE_SIZE, |r| {
                            r.size.bytes().max(IMPORTED_IMAGE_SIZE)
                        }),
                    // PVE allocates whole KiB.
                    _ => rule.size.map_or(0, |s| s.bytes() & !1023),
                };
                let mut options: Vec<(String, String)> = rule
                    .options
                    .iter()
                    // PVE leaves out options equal to their defaults, but keeps `ssd=0`.
                    .filter(|(k, v)| {
                        !matches!(
                            (k.as_str(), v.as_str()),
                            ("iothread", "0") | ("discard", "ignore")
                        )
                    })
                    .cloned()
                    .collect();
                if rule
                    .options
                    .iter()
                    .any(|(k, v)| k == "pre-enrolled-keys" && v == "1")
                {
                    options.push(("ms-cert".to_owned(), "2023".to_owned()));
                }
                options.push(("size".to_owned(), format_pve_size(bytes)));
                options.sort();
                let mut value = format!("{}:vm-{vmid}-disk-{disk_number}", rule.storage);
                disk_number += 1;
                for (k, v) in options {
                    value.push_str(&format!(",{k}={v}"));
                }
                value
            }
            Rule::QemuNet => {
                let p = PropertyString::parse(&owned.value, Some("model"));
                let mut items = p.items().to_vec();
                let (first_key, first_value) = items.remove(0);
                let (model, mac) = if first_key == "model" {
                    mac_number += 1;
                    (first_value, format!("BC:24:11:00:00:{mac_number:02X}"))
                } else {
                    (first_key, first_value.to_uppercase())
                };
                items.sort();
                let mut value = format!("{model}={mac}");
                for (k, v) in items {
                    value.push_str(&format!(",{k}={v}"));
                }
                value
            }
            _ if !qemu && key.starts_with("net") => {
                let mut p = PropertyString::parse(&owned.value, None);
                if p.get("hwaddr").is_none() {
                    mac_number += 1;
                    p.set("hwaddr", &format!("BC:24:11:00:01:{mac_number:02X}"));
                }
                if p.get("type").is_none() {
                    p.set("type", "veth");
                }
                let mut items = p.items().to_vec();
                items.sort();
                let name = items
                    .iter()
                    .position(|(k, _)| k == "name")
                    .map(|i| items.remove(i));
                name.into_iter()
                    .chain(items)
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            }
            Rule::Description => format!("{}\n", owned.value),
            _ => owned.value.clone(),
        };
        out.insert(key.clone(), json_value(&value));
    }
    if let Some(unprivileged) = rendered.create_only.get("unprivileged") {
        out.insert("unprivileged".to_owned(), json_value(unprivileged));
    }
    out.insert(
        "digest".to_owned(),
        Value::from("0123456789abcdef0123456789abcdef01234567"),
    );
    if qemu {
        out.insert(
            "smbios1".to_owned(),
            Value::from("uuid=6f1c2a9e-0000-4000-8000-000000000001"),
        );
        out.insert(
            "vmgenid".to_owned(),
            Value::from("6f1c2a9e-0000-4000-8000-000000000002"),
        );
        out.insert(
            "meta".to_owned(),
            Value::from("creation-qemu=9.2.0,ctime=1764400000"),
        );
        out.entry("boot".to_owned())
            .or_insert_with(|| Value::from("order=scsi0;net0"));
    } else {
        out.insert("ostype".to_owned(), Value::from("debian"));
    }
    if rendered.template {
        out.insert("template".to_owned(), Value::from(1));
    }
    let body = Value::Object(Map::from_iter([("data".to_owned(), Value::Object(out))]));
    let guest_type = rendered.guest_type;
    LiveConfig::from_json(guest_type, &body).expect("a config object")
}

/// Integers as JSON numbers, as PVE returns them; everything else as strings.
fn json_value(text: &str) -> Value {
    text.parse::<u64>()
        .map_or_else(|_| Value::from(text), Value::from)
}
