//! The revisions the reliability suites apply: a fleet of guests over the simulator's three
//! nodes made of every kind the agent creates (VMs from a DiskImage, VMs booting an ISO,
//! plain VMs, LXCs from a CTTemplate, a TemplateVM and its clones), plus the artifacts they
//! use, as manifest files keyed by repository path.

use std::collections::BTreeMap;

/// The simulator's nodes (its default seed).
pub(crate) const NODES: [&str; 3] = ["pve1", "pve2", "pve3"];

/// Files the test file server offers, by the name in the artifact URLs.
pub(crate) const FILES: [(&str, &[u8]); 3] = [
    (
        "debian.qcow2",
        b"a qcow2 disk image for the reliability suites",
    ),
    (
        "installer.iso",
        b"an installer image for the reliability suites",
    ),
    (
        "ct.tar.zst",
        b"a container template tarball for the reliability suites",
    ),
];

/// The node of the template and of its clones (a clone is made on the template's node).
const TEMPLATE_NODE: &str = "pve1";
const TEMPLATE_VMID: u32 = 9000;

/// What a guest of the fleet is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavour {
    ImageVm,
    IsoVm,
    PlainVm,
    Lxc,
    Template,
    Clone,
}

/// One guest of a revision.
#[derive(Debug, Clone)]
pub(crate) struct Guest {
    pub(crate) name: String,
    pub(crate) vmid: u32,
    pub(crate) node: &'static str,
    pub(crate) flavour: Flavour,
}

/// `count` guests (at least 10): one template, about 5% clones, 30% LXCs, the rest VMs split
/// between disk-image, ISO and plain ones, spread round-robin over the nodes. vmids start at
/// 1000 and are the same for the same `count`.
pub(crate) fn guests(count: usize) -> Vec<Guest> {
    assert!(count >= 10, "a fleet has at least 10 guests");
    let clones = (count / 20).max(2);
    let lxcs = count * 3 / 10;
    let mut out = vec![Guest {
        name: "golden".into(),
        vmid: TEMPLATE_VMID,
        node: TEMPLATE_NODE,
        flavour: Flavour::Template,
    }];
    for i in 0..count - 1 {
        let flavour = if i < clones {
            Flavour::Clone
        } else if i < clones + lxcs {
            Flavour::Lxc
        } else {
            [Flavour::ImageVm, Flavour::IsoVm, Flavour::PlainVm][i % 3]
        };
        let node = if flavour == Flavour::Clone {
            TEMPLATE_NODE
        } else {
            NODES[i % NODES.len()]
        };
        out.push(Guest {
            name: format!("g-{i:04}"),
            vmid: 1000 + u32::try_from(i).unwrap(),
            node,
            flavour,
        });
    }
    out
}

/// `count` plain VMs named `extra-<generation>-<i>` with vmids of their own per generation:
/// what a crash-suite revision adds (and the next one drops, so it is pruned).
pub(crate) fn extras(generation: usize, count: usize) -> Vec<Guest> {
    (0..count)
        .map(|i| Guest {
            name: format!("extra-{generation}-{i}"),
            vmid: 5000 + u32::try_from(generation * 10 + i).unwrap(),
            node: NODES[(generation + i) % NODES.len()],
            flavour: Flavour::PlainVm,
        })
        .collect()
}

/// The manifest files of a revision: the artifacts on every node and `guests`. Guests whose
/// index is a multiple of 4 get `generation`-dependent memory (so a new generation updates
/// them); even indexes are started, odd ones stopped.
pub(crate) fn revision(
    files_url: &str,
    guests: &[Guest],
    generation: usize,
) -> BTreeMap<String, String> {
    let nodes = NODES.join(", ");
    let artifact = |kind: &str, name: &str, filename: &str, file: &str| {
        format!(
            "apiVersion: proxops/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}\nspec:\n  nodes: [{nodes}]\n  storage: local\n  filename: {filename}\n  url: {files_url}/{file}\n"
        )
    };
    let mut files = BTreeMap::from([
        (
            "diskimage/debian-cloud.yaml".to_owned(),
            artifact(
                "DiskImage",
                "debian-cloud",
                "debian-13-genericcloud.qcow2",
                "debian.qcow2",
            ),
        ),
        (
            "iso/installer.yaml".to_owned(),
            artifact("ISO", "installer", "installer.iso", "installer.iso"),
        ),
        (
            "ctt/debian-12.yaml".to_owned(),
            artifact(
                "CTTemplate",
                "debian-12",
                "debian-12-standard_12.12-1_amd64.tar.zst",
                "ct.tar.zst",
            ),
        ),
    ]);
    for (index, guest) in guests.iter().enumerate() {
        let memory = if index % 4 == 0 {
            256 + 64 * (generation % 2)
        } else {
            256
        };
        let state = if index % 2 == 0 { "started" } else { "stopped" };
        let (dir, text) = manifest(guest, memory, state);
        files.insert(format!("{dir}/{}.yaml", guest.name), text);
    }
    files
}

fn manifest(guest: &Guest, memory: usize, state: &str) -> (&'static str, String) {
    let Guest {
        name, vmid, node, ..
    } = guest;
    let head = |kind: &str| {
        format!(
            "apiVersion: proxops/v1alpha1\nkind: {kind}\nmetadata: {{name: {name}}}\nspec:\n  node: {node}\n  vmid: {vmid}\n"
        )
    };
    let vm_tail = "  cpu: {type: host, cores: 1}\n  networks:\n    - {bridge: vmbr0}\n";
    match guest.flavour {
        Flavour::Template => (
            "templatevm",
            format!(
                "{}  memory: 256MiB\n{vm_tail}  disks:\n    - {{storage: local-lvm, image: debian-cloud, size: 2GiB}}\n",
                head("TemplateVM")
            ),
        ),
        Flavour::Clone => (
            "vm",
            format!(
                "{}  state: {state}\n  clone: golden\n  memory: {memory}MiB\n{vm_tail}",
                head("VM")
            ),
        ),
        Flavour::ImageVm => (
            "vm",
            format!(
                "{}  state: {state}\n  memory: {memory}MiB\n{vm_tail}  disks:\n    - {{storage: local-lvm, image: debian-cloud, size: 2GiB}}\n",
                head("VM")
            ),
        ),
        Flavour::IsoVm => (
            "vm",
            format!(
                "{}  state: {state}\n  memory: {memory}MiB\n{vm_tail}  disks:\n    - {{storage: local-lvm, size: 1GiB}}\n  hardware:\n    cdrom: {{iso: installer}}\n",
                head("VM")
            ),
        ),
        Flavour::PlainVm => (
            "vm",
            format!(
                "{}  state: {state}\n  memory: {memory}MiB\n{vm_tail}  disks:\n    - {{storage: local-lvm, size: 1GiB}}\n",
                head("VM")
            ),
        ),
        Flavour::Lxc => (
            "lxc",
            format!(
                "{}  state: {state}\n  template: debian-12\n  memory: {memory}MiB\n  cpu: {{cores: 1}}\n  root: {{storage: local-lvm, size: 1GiB}}\n  networks:\n    - {{bridge: vmbr0}}\n",
                head("LXC")
            ),
        ),
    }
}
