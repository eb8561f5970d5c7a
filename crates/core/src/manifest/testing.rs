//! Test helpers: parse a small YAML string and look at the rendered diagnostics.

use super::{ParsedFile, Resource, Spec, parse_file};

/// The envelope of a document of `kind` named `name`, to prepend to a `spec:` block.
pub(crate) fn doc(kind: &str, name: &str, spec: &str) -> String {
    format!("apiVersion: proxops/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}\nspec:\n{spec}")
}

/// Parses `yaml` as `test.yaml`.
pub(crate) fn parse(yaml: &str) -> ParsedFile {
    parse_file("test.yaml", yaml)
}

/// The rendered diagnostics of `yaml`, one string each.
pub(crate) fn errors(yaml: &str) -> Vec<String> {
    parse(yaml)
        .diagnostics
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The one resource of a valid `yaml`, failing with the diagnostics otherwise.
pub(crate) fn valid(yaml: &str) -> Resource {
    let file = parse(yaml);
    assert!(
        file.diagnostics.is_empty(),
        "unexpected diagnostics:\n{}",
        errors(yaml).join("\n")
    );
    assert_eq!(file.resources.len(), 1);
    let resource = file.resources.into_iter().next().unwrap();
    assert!(resource.spec.is_some());
    resource
}

/// Asserts that `yaml` has exactly these diagnostics.
#[track_caller]
pub(crate) fn assert_errors(yaml: &str, expected: &[&str]) {
    let actual = errors(yaml);
    assert_eq!(actual, expected, "\nactual:\n{}\n", actual.join("\n"));
}

/// The validated spec of a valid `yaml`.
pub(crate) fn spec(yaml: &str) -> Spec {
    valid(yaml).spec.unwrap()
}

/// A VM using every key of the format.
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

/// An LXC using every key of the format.
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

/// An ISO using every key of the format.
pub(crate) const FULL_ISO: &str = r#"apiVersion: proxops/v1alpha1
kind: ISO
metadata:
  name: netinst
  labels: {os: debian}
  annotations: {note: shared}
spec:
  nodes: [pve1, pve2]
  storage: local
  filename: debian-13.2.0-amd64-netinst.iso
  url: https://cdimage.debian.org/debian-cd/current/amd64/iso-cd/debian-13.2.0-amd64-netinst.iso
  checksum:
    algorithm: sha256
    value: 0000000000000000000000000000000000000000000000000000000000000000
"#;
