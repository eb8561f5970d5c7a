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

/// The size PVE gives an imported image in these tests (the Debian 13 genericcloud image gave
/// 3G on a live PVE; any value works as long as it is stated).
pub(crate) const IMPORTED_IMAGE_SIZE: u64 = 2 << 30;

/// The envelope of a document.
pub(crate) fn doc(kind: &str, name: &str, spec: &str) -> String {
    format!("apiVersion: proxops/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}\nspec:\n{spec}")
}

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

/// A VM using every key of the format (a copy of the manifest tests' fixture, so that
/// changes there do not silently change what these tests pin).
pub(crate) const FULL_VM: &str = r#"apiVersion: proxops/v1alpha1
kind: VM
metadata:
  name: web-1
  namespace: default
  labels: {team: web}
  annotations:
    proxops/depends-on: "LXC:db-1, iso:netinst"
    proxops/drift: report
    proxops/adopt: "true"
    proxops/restart: on-change
spec:
  node: pve1
  vmid: 101
  state: started
  memory: 4GiB
  cpu: {type: host, cores: 2, flags: [+aes]}
  disks:
    - {storage: local-lvm, size: 32GiB, interface: scsi0, controller: virtio-scsi-single, iothread: true, discard: on, ssd: true, aio: io_uring}
    - {storage: local-lvm, image: debian-cloud, size: 40GiB, interface: virtio1}
  networks:
    - {model: virtio, bridge: vmbr0, mac: "BC:24:11:00:00:01", vlan: 20, rate-limit: 100, firewall: true, slot: net0}
    - {bridge: vmbr1}
  hardware:
    machine: q35
    bios: ovmf
    display: std
    sockets: 1
    numa: false
    serial0: socket
    cdrom: {iso: netinst, media: cdrom}
    efi-disk: {storage: local-lvm, size: 4MiB, template: 4m, secure-boot: enabled}
    cloud-init: {enabled: true, storage: local-lvm, size: 4M}
    tpm: {storage: local-lvm, version: v2.0}
    pci-devices:
      - {slot: hostpci0, device: "0000:01:00.0", pcie: true}
  options:
    onboot: true
    startup: order=1
    protection: false
    agent: true
    acpi: true
    tablet: false
    hotplug: [disk, network]
    boot-order: [scsi0, ide3, net0]
    hidden: false
    nested-virt: true
  cloud-init-data:
    ci-user: debian
    ssh-keys: ["ssh-ed25519 AAAAC3Nza user@host"]
    ci-password-ref: cloud-init.passwords.default
    nameservers: [10.0.0.1]
    search-domains: [lab.example]
    ipconfigs:
      - {nic: 0, ip: 10.0.0.10/24, gateway: 10.0.0.1}
      - {nic: 1, ip: dhcp}
  pve-name: web-1.lab
  pve-description: the web server
  tags: [web, prod]
  extra: {args: "-cpu host", balloon: 0}
"#;

/// An LXC using every key of the format (copied likewise).
pub(crate) const FULL_LXC: &str = r#"apiVersion: proxops/v1alpha1
kind: LXC
metadata:
  name: db-1
  labels: {team: data}
spec:
  node: pve2
  vmid: 201
  state: stopped
  template: debian-13
  memory: 1GiB
  swap: 512MiB
  cpu: {cores: 2, units: 1024}
  root: {storage: local-lvm, size: 8GiB}
  mount-points:
    - storage: local-lvm
      size: 16GiB
      mount-point: /var/lib/postgresql
      slot: mp0
      options: {read-only: false, backup: true, acl: true, quota: false, shared: false, mount-options: noatime}
  bind-mounts:
    - {host-path: /tank/backups, mount-point: /backups, read-only: true}
  networks:
    - {bridge: vmbr0, iface: eth0, type: veth, tag: 20, hwaddr: "BC:24:11:00:00:02", rate-limit: 50, firewall: true, ip: 10.0.0.20/24, gw: 10.0.0.1, slot: net0}
    - {bridge: vmbr1, ip: dhcp}
  dns: {hostname: db-1.lab, nameservers: [10.0.0.1], domain: lab.example}
  arch: amd64
  options: {unprivileged: true, protection: false, onboot: true, console: true, nesting: true, keyctl: false, fuse: false, startup: "order=2", ttys: 2}
  pve-description: database
  tags: [db]
  extra: {cmode: tty}
"#;
