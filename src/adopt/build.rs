//! The pure half of adopt: what was read ([`Snapshot`]) plus what the repository already has
//! → the manifest files and the [`Report`](super::report::Report). Names are handed out in a
//! fixed order (artifacts by kind, storage and file name, then guests by vmid), so the same
//! inputs give the same bytes.

use std::collections::{BTreeMap, BTreeSet};

use proxops_core::guest::GuestType;
use proxops_core::manifest::{ADOPT, MAX_NAME_LEN};
use proxops_core::resource::Kind;

use super::existing::Existing;
use super::guest::Mapping;
use super::naming::{Names, artifact_stem, safe_name};
use super::read::Snapshot;
use super::report::{Incomplete, Placeholder, Skipped, Written};
use super::ssh_keys::SshKeyRefs;
use super::yaml::{self, Map, Value};
use super::{Adoption, Isos, artifact, lxc, vm};

/// The manifests' `apiVersion`.
const API_VERSION: &str = "proxops/v1alpha1";

/// Guest locks that mean the guest is being created or removed: not adopted.
const TRANSIENT_LOCKS: [&str; 3] = ["create", "clone", "destroyed"];

/// The manifests and report for what was read (pure).
pub(crate) fn build(
    snapshot: &Snapshot,
    cluster: &str,
    ssh_keys: &SshKeyRefs,
    existing: &Existing,
) -> Adoption {
    let mut adoption = Adoption::default();
    let report = &mut adoption.report;
    report.cluster = cluster.to_owned();
    report.nodes.clone_from(&snapshot.nodes);
    report
        .skipped
        .extend(snapshot.skipped.iter().map(|(what, reason)| Skipped {
            what: what.clone(),
            reason: reason.clone(),
        }));
    let mut names: BTreeMap<Kind, Names> = BTreeMap::new();
    for (kind, name) in &existing.names {
        names.entry(*kind).or_default().reserve(name);
    }
    let mut listed: Vec<(Kind, String, String, bool)> = Vec::new();

    let (found, skipped_files) = artifact::group(&snapshot.files);
    report.skipped.extend(
        skipped_files
            .into_iter()
            .map(|(what, reason)| Skipped { what, reason }),
    );
    let mut isos = Isos::new();
    // CTTemplate names per node: the candidates for an adopted container's `template`.
    let mut ctts: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for artifact in &found {
        let volid = artifact.volid();
        let nodes: Vec<&str> = artifact.nodes.iter().map(String::as_str).collect();
        let source = format!("{volid} on {}", nodes.join(", "));
        let key = (
            artifact.kind,
            artifact.storage.clone(),
            artifact.filename.clone(),
        );
        if let Some(declared) = existing.artifacts.get(&key) {
            if artifact.kind == Kind::CtTemplate {
                for node in &artifact.nodes {
                    ctts.entry(node.clone())
                        .or_default()
                        .insert(declared.clone());
                }
            }
            if artifact.kind == Kind::Iso {
                for node in &artifact.nodes {
                    isos.insert((node.clone(), volid.clone()), declared.clone());
                }
            }
            report.skipped.push(Skipped {
                what: source,
                reason: format!("already declared as {}/{declared}", artifact.kind),
            });
            continue;
        }
        let header = format!("Adopted by `proxops adopt` from {source}.");
        let wanted = safe_name(artifact_stem(&artifact.filename), MAX_NAME_LEN);
        let suffix = safe_name(&artifact.storage, MAX_NAME_LEN).unwrap_or_default();
        let fallback = format!("{}-{}", artifact.kind.root(), suffix);
        let name = names.entry(artifact.kind).or_default().claim(
            wanted.as_deref(),
            &suffix,
            &fallback,
            |n| existing.may_write(&path_of(artifact.kind, cluster, n), &format!("# {header}")),
        );
        if artifact.kind == Kind::Iso {
            for node in &artifact.nodes {
                isos.insert((node.clone(), volid.clone()), name.clone());
            }
        }
        if artifact.kind == Kind::CtTemplate {
            for node in &artifact.nodes {
                ctts.entry(node.clone()).or_default().insert(name.clone());
            }
        }
        let comments = vec![
            header,
            "The URL is a placeholder: PVE does not record where a file was downloaded from."
                .to_owned(),
        ];
        let path = path_of(artifact.kind, cluster, &name);
        let text = yaml::document(
            &comments,
            &document(artifact.kind, &name, false, artifact.spec()),
        );
        if existing.differs(&path, &text) {
            report.skipped.push(kept(&path));
            continue;
        }
        report.placeholders.push(Placeholder {
            resource: format!("{}/{name}", artifact.kind),
            url: artifact.placeholder_url(),
        });
        report.written.push(Written {
            path: path.clone(),
            resource: format!("{}/{name}", artifact.kind),
            source,
        });
        listed.push((artifact.kind, name, path.clone(), true));
        adoption.files.insert(path, text);
    }

    for guest in &snapshot.guests {
        let what = format!(
            "{} {} on {}",
            guest.guest_type.as_str(),
            guest.vmid,
            guest.node
        );
        if let Some(lock) = guest.config.get("lock")
            && TRANSIENT_LOCKS.contains(&lock)
        {
            report.skipped.push(Skipped {
                what,
                reason: format!("locked ({lock}): being created or removed"),
            });
            continue;
        }
        if let Some(declared) = existing.guests.get(&guest.vmid) {
            report.skipped.push(Skipped {
                what,
                reason: format!("already declared as {declared}"),
            });
            continue;
        }
        let header = format!("Adopted by `proxops adopt` from {what}.");
        let template = guest.config.is_template();
        let (kind, name_key, prefix) = match (guest.guest_type, template) {
            (GuestType::Qemu, false) => (Kind::Vm, "name", "vm"),
            (GuestType::Qemu, true) => (Kind::TemplateVm, "name", "vm"),
            (GuestType::Lxc, false) => (Kind::Lxc, "hostname", "ct"),
            (GuestType::Lxc, true) => (Kind::TemplateCt, "hostname", "ct"),
        };
        let wanted = guest
            .config
            .get(name_key)
            .and_then(|n| safe_name(n, MAX_NAME_LEN));
        let vmid = guest.vmid.to_string();
        let name = names.entry(kind).or_default().claim(
            wanted.as_deref(),
            &vmid,
            &format!("{prefix}-{vmid}"),
            |n| existing.may_write(&path_of(kind, cluster, n), &format!("# {header}")),
        );
        let resource = format!("{kind}/{name}");
        let mut mapping = Mapping::new(&guest.config, resource.clone());
        let spec = match guest.guest_type {
            GuestType::Qemu => vm::spec(guest, kind, &name, (&isos, ssh_keys), &mut mapping),
            GuestType::Lxc => {
                let candidates: Vec<String> = ctts
                    .get(&guest.node)
                    .map(|names| names.iter().cloned().collect())
                    .unwrap_or_default();
                lxc::spec(guest, kind, &name, &candidates, &mut mapping)
            }
        };
        mapping.finish();
        let path = path_of(kind, cluster, &name);
        let mut comments = vec![header];
        if !mapping.fill.is_empty() {
            comments.push(
                "INCOMPLETE: fill in the following, then list this file in resources.yaml:"
                    .to_owned(),
            );
            comments.extend(mapping.fill.iter().map(|f| format!("  {f}")));
        }
        if !mapping.defaults.is_empty() {
            comments.push(format!(
                "Not set on PVE, written as PVE's default: {}.",
                mapping.defaults.join(", ")
            ));
        }
        if !mapping.gaps.is_empty() {
            let keys: Vec<&str> = mapping.gaps.iter().map(|g| g.key.as_str()).collect();
            comments.push(format!(
                "Left as PVE has it (not in this manifest): {}.",
                keys.join(", ")
            ));
        }
        let text = yaml::document(&comments, &document(kind, &name, true, spec));
        if existing.differs(&path, &text) {
            report.skipped.push(kept(&path));
            continue;
        }
        let complete = mapping.fill.is_empty();
        if !complete {
            report.incomplete.push(Incomplete {
                path: path.clone(),
                fill: mapping.fill.clone(),
            });
        }
        report.gaps.append(&mut mapping.gaps);
        report.adopt_vmids.push(guest.vmid);
        report.written.push(Written {
            path: path.clone(),
            resource,
            source: what,
        });
        listed.push((kind, name, path.clone(), complete));
        adoption.files.insert(path, text);
    }

    listed.sort();
    report.resources_lines = listed
        .iter()
        .map(|(_, _, path, complete)| {
            let line = format!("  - ../../{path}");
            if *complete {
                line
            } else {
                format!("#{line}   (incomplete: fill it in first)")
            }
        })
        .collect();
    report.written.sort();
    report.incomplete.sort();
    report.skipped.sort();
    report.placeholders.sort();
    report.gaps.sort();
    adoption
}

/// A file adopt wrote before and that has changed since: never overwritten.
fn kept(path: &str) -> Skipped {
    Skipped {
        what: path.to_owned(),
        reason: "exists and differs from what adopt would write now (edited, or PVE changed): \
                 left as is; move it away to adopt again"
            .to_owned(),
    }
}

/// `<kind-root>/<cluster>/<name>.yaml`.
fn path_of(kind: Kind, cluster: &str, name: &str) -> String {
    format!("{}/{cluster}/{name}.yaml", kind.root())
}

/// The whole document around a `spec`.
fn document(kind: Kind, name: &str, adopt: bool, spec: Map) -> Map {
    let mut metadata = Map::new();
    metadata.set("name", name);
    if adopt {
        let mut annotations = Map::new();
        annotations.set(ADOPT, "true");
        metadata.set("annotations", annotations);
    }
    let mut doc = Map::new();
    doc.set("apiVersion", API_VERSION);
    doc.set("kind", kind.to_string());
    doc.set("metadata", metadata);
    doc.set("spec", Value::Map(spec));
    doc
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proxops_core::guest::{Artifacts, CompareContext, LiveConfig, compare, render};
    use proxops_core::repository::load;

    use super::super::read::{Guest, StoredFile};
    use super::*;

    fn qemu(node: &str, vmid: u32, status: &str, pairs: &[(&str, &str)]) -> Guest {
        Guest {
            node: node.to_owned(),
            vmid,
            guest_type: GuestType::Qemu,
            status: status.to_owned(),
            config: LiveConfig::from_pairs(GuestType::Qemu, pairs.iter().copied()),
            pool: None,
        }
    }

    fn lxc(node: &str, vmid: u32, pairs: &[(&str, &str)]) -> Guest {
        Guest {
            node: node.to_owned(),
            vmid,
            guest_type: GuestType::Lxc,
            status: "running".to_owned(),
            config: LiveConfig::from_pairs(GuestType::Lxc, pairs.iter().copied()),
            pool: None,
        }
    }

    fn iso(node: &str) -> StoredFile {
        StoredFile {
            content: "iso",
            storage: "local".to_owned(),
            filename: "netinst.iso".to_owned(),
            node: node.to_owned(),
        }
    }

    /// Loads the adopted files with every complete manifest listed, as the report says.
    fn load_adopted(adoption: &Adoption) -> proxops_core::repository::DesiredState {
        let mut files = adoption.files.clone();
        let listed: Vec<&str> = adoption
            .report
            .resources_lines
            .iter()
            .filter(|l| !l.starts_with('#'))
            .map(String::as_str)
            .collect();
        files.insert(
            "clusters/lab/resources.yaml".to_owned(),
            format!("resources:\n{}\n", listed.join("\n")),
        );
        let loaded = load(&files);
        assert!(!loaded.has_errors(), "{:#?}", loaded.diagnostics);
        loaded.states[0].clone()
    }

    /// Renders each adopted guest and compares it with the config it came from: the only
    /// change is the ownership tag.
    fn assert_round_trip(snapshot: &Snapshot) {
        let adoption = build(
            snapshot,
            "lab",
            &SshKeyRefs::default(),
            &Existing::default(),
        );
        let state = load_adopted(&adoption);
        let artifacts = Artifacts::from_manifest(&state.manifest);
        let mut checked = 0;
        for resource in state.manifest.resources() {
            let Some(rendered) = render(resource, &artifacts) else {
                continue;
            };
            let vmid = match &resource.spec {
                Some(proxops_core::manifest::Spec::Vm(spec)) => spec.vmid.get(),
                Some(proxops_core::manifest::Spec::Lxc(spec)) => spec.vmid.get(),
                _ => continue,
            };
            let guest = snapshot.guests.iter().find(|g| g.vmid == vmid).unwrap();
            let diff = compare(&rendered, &guest.config, &CompareContext::default());
            // A guest already tagged (created by the Go program) needs nothing at all.
            let set: Vec<&String> = diff.set.keys().collect();
            assert!(
                set.is_empty() || set == ["tags"],
                "{}: {diff:#?}",
                resource.id
            );
            assert!(
                diff.delete.is_empty() && diff.resize.is_empty(),
                "{diff:#?}"
            );
            assert!(diff.findings.is_empty(), "{}: {diff:#?}", resource.id);
            checked += 1;
        }
        assert!(checked > 0);
    }

    #[test]
    fn adopted_vms_render_back_to_their_configs_except_the_ownership_tag() {
        let snapshot = Snapshot {
            nodes: vec!["pve1".to_owned(), "pve2".to_owned()],
            guests: vec![
                qemu(
                    "pve1",
                    100,
                    "running",
                    &[
                        ("name", "web.example.org"),
                        ("memory", "4096"),
                        ("cores", "2"),
                        ("sockets", "2"),
                        ("cpu", "x86-64-v2-AES,hidden=1"),
                        ("machine", "pc-q35-8.1"),
                        ("bios", "ovmf"),
                        ("vga", "serial0"),
                        ("serial0", "socket"),
                        ("numa", "1"),
                        ("scsihw", "virtio-scsi-single"),
                        ("scsi0", "local-lvm:vm-100-disk-0,iothread=1,ssd=1,size=32G"),
                        (
                            "virtio1",
                            "local-lvm:vm-100-disk-1,aio=native,discard=on,size=500M",
                        ),
                        ("ide2", "local:iso/netinst.iso,media=cdrom"),
                        (
                            "efidisk0",
                            "local-lvm:vm-100-disk-2,efitype=4m,pre-enrolled-keys=0,size=4M",
                        ),
                        (
                            "net0",
                            "virtio=BC:24:11:00:00:01,bridge=vmbr0,tag=30,rate=100,firewall=0",
                        ),
                        ("net1", "e1000=bc:24:11:00:00:02,bridge=vmbr1"),
                        ("hostpci0", "0000:01:00.0,pcie=1"),
                        ("onboot", "1"),
                        ("startup", "order=2,up=30"),
                        ("protection", "0"),
                        ("agent", "1"),
                        ("acpi", "1"),
                        ("tablet", "0"),
                        ("hotplug", "disk,network"),
                        ("boot", "order=scsi0;ide2;net0"),
                        ("tags", "Web;proxops"),
                        ("description", "line one\nline two\n"),
                        ("digest", "abc"),
                        ("smbios1", "uuid=x"),
                    ],
                ),
                qemu(
                    "pve2",
                    101,
                    "stopped",
                    &[
                        ("name", "ci"),
                        ("memory", "current=2048"),
                        ("cores", "1"),
                        ("cpu", "host"),
                        ("scsi0", "local-lvm:vm-101-disk-0,size=8G"),
                        ("ide2", "local-lvm:vm-101-cloudinit,media=cdrom"),
                        ("ide3", "none,media=cdrom"),
                        ("tpmstate0", "local-lvm:vm-101-disk-1,size=4M,version=v2.0"),
                        ("ciuser", "debian"),
                        ("sshkeys", "ssh-ed25519%20AAAAsecret%20me"),
                        ("nameserver", "10.0.0.53 10.0.0.54"),
                        ("searchdomain", "example.org"),
                        ("ipconfig0", "ip=10.0.0.5/24,gw=10.0.0.1"),
                        ("ipconfig1", "ip6=fd00::5/64,gw6=fd00::1"),
                        ("hotplug", "0"),
                    ],
                ),
                qemu(
                    "pve1",
                    900,
                    "stopped",
                    &[
                        ("name", "golden"),
                        ("memory", "1024"),
                        ("cores", "1"),
                        ("cpu", "kvm64"),
                        ("scsi0", "local-lvm:base-900-disk-0,size=4G"),
                        ("template", "1"),
                    ],
                ),
            ],
            files: vec![iso("pve1"), iso("pve2")],
            skipped: Vec::new(),
        };
        assert_round_trip(&snapshot);
        let adoption = build(
            &snapshot,
            "lab",
            &SshKeyRefs::default(),
            &Existing::default(),
        );
        let web = &adoption.files["vm/lab/web-example-org.yaml"];
        assert!(web.contains("pve-name: web.example.org"), "{web}");
        assert!(web.contains("iso: netinst"), "{web}");
        assert!(adoption.files.contains_key("templatevm/lab/golden.yaml"));
        let ci = &adoption.files["vm/lab/ci.yaml"];
        assert!(!ci.contains("AAAAsecret"), "{ci}");
        assert!(ci.contains("ssh-keys: [\"*\"]"), "{ci}");
        let pin = adoption
            .report
            .gaps
            .iter()
            .find(|g| g.key == "machine")
            .unwrap();
        assert_eq!(pin.value, "pc-q35-8.1");
    }

    #[test]
    fn an_adopted_container_renders_back_once_its_template_is_filled_in() {
        let snapshot = Snapshot {
            nodes: vec!["pve1".to_owned()],
            guests: vec![lxc(
                "pve1",
                200,
                &[
                    ("hostname", "db"),
                    ("memory", "2048"),
                    ("swap", "0"),
                    ("cores", "2"),
                    ("arch", "amd64"),
                    ("rootfs", "local-lvm:vm-200-disk-0,size=8G"),
                    (
                        "mp0",
                        "local-lvm:vm-200-disk-1,mp=/srv,size=16G,backup=0,acl=1,mountoptions=noatime",
                    ),
                    ("mp1", "/mnt/host,mp=/host,ro=1"),
                    (
                        "net0",
                        "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:09,ip=10.0.0.9/24,gw=10.0.0.1,type=veth,tag=5",
                    ),
                    ("nameserver", "1.1.1.1"),
                    ("searchdomain", "example.org"),
                    ("unprivileged", "1"),
                    ("features", "nesting=1"),
                    ("onboot", "1"),
                    ("console", "1"),
                    ("tags", "DB"),
                    ("ostype", "debian"),
                ],
            )],
            files: vec![StoredFile {
                content: "vztmpl",
                storage: "local".to_owned(),
                filename: "debian-12.tar.zst".to_owned(),
                node: "pve1".to_owned(),
            }],
            skipped: Vec::new(),
        };
        let mut adoption = build(
            &snapshot,
            "lab",
            &SshKeyRefs::default(),
            &Existing::default(),
        );
        assert_eq!(adoption.report.incomplete.len(), 1);
        let fill = &adoption.report.incomplete[0].fill[0];
        assert!(fill.starts_with("spec.template"), "{fill}");
        assert!(fill.ends_with("; CTTemplates on pve1: debian-12"), "{fill}");
        assert!(
            adoption.report.resources_lines.contains(
                &"#  - ../../lxc/lab/db.yaml   (incomplete: fill it in first)".to_owned()
            )
        );
        // The operator's part: name the template and list the file.
        let path = "lxc/lab/db.yaml".to_owned();
        let filled =
            adoption.files[&path].replacen("  memory:", "  template: debian-12\n  memory:", 1);
        adoption.files.insert(path, filled);
        adoption
            .report
            .resources_lines
            .push("  - ../../lxc/lab/db.yaml".to_owned());
        let state = load_adopted(&adoption);
        let artifacts = Artifacts::from_manifest(&state.manifest);
        let resource = state
            .manifest
            .resources()
            .find(|r| r.id.kind == Kind::Lxc)
            .unwrap();
        let rendered = render(resource, &artifacts).unwrap();
        let diff = compare(
            &rendered,
            &snapshot.guests[0].config,
            &CompareContext::default(),
        );
        assert_eq!(diff.set.keys().collect::<Vec<_>>(), ["tags"], "{diff:#?}");
        assert!(
            diff.findings.is_empty() && diff.delete.is_empty(),
            "{diff:#?}"
        );
    }

    #[test]
    fn an_adopted_guest_in_a_pool_declares_that_pool_and_one_in_none_declares_none() {
        let mut pooled = qemu(
            "pve1",
            100,
            "running",
            &[
                ("name", "web"),
                ("memory", "1024"),
                ("cores", "1"),
                ("cpu", "host"),
                ("scsi0", "local-lvm:vm-100-disk-0,size=8G"),
            ],
        );
        pooled.pool = Some("prod".to_owned());
        let plain = qemu(
            "pve1",
            101,
            "running",
            &[
                ("name", "db"),
                ("memory", "1024"),
                ("cores", "1"),
                ("cpu", "host"),
                ("scsi0", "local-lvm:vm-101-disk-0,size=8G"),
            ],
        );
        let snapshot = Snapshot {
            nodes: vec!["pve1".to_owned()],
            guests: vec![pooled, plain],
            files: Vec::new(),
            skipped: Vec::new(),
        };
        let adoption = build(
            &snapshot,
            "lab",
            &SshKeyRefs::default(),
            &Existing::default(),
        );
        let state = load_adopted(&adoption);
        let pool_of = |name: &str| {
            let resource = state
                .manifest
                .get(&proxops_core::resource::ResourceId::new(Kind::Vm, name))
                .unwrap_or_else(|| panic!("{name} adopted: {:?}", adoption.files.keys()));
            match &resource.spec {
                Some(proxops_core::manifest::Spec::Vm(spec)) => spec.pool.clone(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(pool_of("web").as_deref(), Some("prod"));
        assert_eq!(pool_of("db"), None);
    }

    #[test]
    fn what_the_format_cannot_say_is_a_gap_and_secrets_are_redacted() {
        let snapshot = Snapshot {
            nodes: vec!["pve1".to_owned()],
            guests: vec![qemu(
                "pve1",
                300,
                "stopped",
                &[
                    ("name", "odd"),
                    ("memory", "1024"),
                    ("cores", "1"),
                    ("cpu", "host,flags=+aes"),
                    ("scsi0", "local-lvm:vm-300-disk-0,size=4G,cache=writeback"),
                    ("scsi1", "local-lvm:vm-300-cloudinit,media=cdrom"),
                    ("cicustom", "user=local:snippets/user.yaml"),
                    ("cipassword", "**********"),
                    ("hostpci0", "mapping=gpu"),
                    ("net0", "virtio=BC:24:11:00:00:01,bridge=vmbr0,mtu=9000"),
                    ("balloon", "0"),
                ],
            )],
            files: Vec::new(),
            skipped: Vec::new(),
        };
        let adoption = build(
            &snapshot,
            "lab",
            &SshKeyRefs::default(),
            &Existing::default(),
        );
        let gaps: BTreeMap<&str, &str> = adoption
            .report
            .gaps
            .iter()
            .map(|g| (g.key.as_str(), g.value.as_str()))
            .collect();
        assert_eq!(
            gaps.keys().copied().collect::<Vec<_>>(),
            [
                "balloon",
                "cicustom",
                "cipassword",
                "cpu.flags",
                "hostpci0",
                "net0.mtu",
                "scsi0.cache",
                "scsi1"
            ]
        );
        assert_eq!(gaps["cipassword"], "<redacted>");
        assert!(!adoption.report.render().contains("**********"));
        assert!(adoption.report.incomplete.is_empty());
    }

    #[test]
    fn clashing_names_get_the_vmid_and_guests_being_created_are_skipped() {
        let vm = |vmid, name: &str| {
            qemu(
                "pve1",
                vmid,
                "stopped",
                &[
                    ("name", name),
                    ("memory", "512"),
                    ("cores", "1"),
                    ("cpu", "host"),
                    ("scsi0", "local-lvm:vm-1-disk-0,size=1G"),
                ],
            )
        };
        let mut creating = vm(503, "new");
        creating.config = LiveConfig::from_pairs(GuestType::Qemu, [("lock", "create")]);
        let snapshot = Snapshot {
            nodes: vec!["pve1".to_owned()],
            guests: vec![vm(500, "Web"), vm(501, "web"), vm(502, "!!!"), creating],
            files: Vec::new(),
            skipped: Vec::new(),
        };
        let adoption = build(
            &snapshot,
            "lab",
            &SshKeyRefs::default(),
            &Existing::default(),
        );
        let paths: Vec<&str> = adoption.files.keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            [
                "vm/lab/vm-502.yaml",
                "vm/lab/web-501.yaml",
                "vm/lab/web.yaml"
            ]
        );
        assert_eq!(adoption.report.skipped.len(), 1);
        assert_eq!(adoption.report.skipped[0].what, "qemu 503 on pve1");
        assert_eq!(
            build(
                &snapshot,
                "lab",
                &SshKeyRefs::default(),
                &Existing::default()
            ),
            adoption
        );
    }

    #[test]
    fn keys_all_in_the_sops_document_become_refs_and_a_partial_match_stays_pves() {
        let keys = SshKeyRefs::from_lines(&[
            ("admin", "ssh-ed25519 AAAAadmin admin@x"),
            ("ci", "ssh-ed25519 AAAAci ci@x"),
        ]);
        let vm = |vmid, name: &str, sshkeys: &str| {
            qemu(
                "pve1",
                vmid,
                "stopped",
                &[
                    ("name", name),
                    ("memory", "512"),
                    ("cores", "1"),
                    ("cpu", "host"),
                    ("scsi0", "local-lvm:vm-1-disk-0,size=1G"),
                    ("sshkeys", sshkeys),
                ],
            )
        };
        let snapshot = Snapshot {
            nodes: vec!["pve1".to_owned()],
            guests: vec![
                vm(
                    600,
                    "all",
                    "ssh-ed25519%20AAAAci%20ci%40x%0Assh-ed25519%20AAAAadmin%20admin%40x",
                ),
                vm(
                    601,
                    "some",
                    "ssh-ed25519%20AAAAadmin%20admin%40x%0Assh-rsa%20BBBBother%20o%40x",
                ),
            ],
            files: Vec::new(),
            skipped: Vec::new(),
        };
        let adoption = build(&snapshot, "lab", &keys, &Existing::default());
        let all = &adoption.files["vm/lab/all.yaml"];
        assert!(
            all.contains("ssh-key-refs: [cloud-init.ssh-keys.ci, cloud-init.ssh-keys.admin]"),
            "{all}"
        );
        let some = &adoption.files["vm/lab/some.yaml"];
        assert!(some.contains("ssh-keys: [\"*\"]"), "{some}");
        assert!(!some.contains("BBBBother") && !all.contains("AAAA"));
        let gap = adoption
            .report
            .gaps
            .iter()
            .find(|g| g.key == "sshkeys")
            .unwrap();
        assert_eq!(gap.resource, "VM/some");
        assert!(gap.note.starts_with("1 of 2 keys"), "{}", gap.note);
        load_adopted(&adoption);
    }

    #[test]
    fn what_the_repository_declares_is_skipped_and_its_files_and_names_are_left_alone() {
        let vm = |vmid, name: &str, extra: &[(&'static str, &'static str)]| {
            let mut pairs = vec![
                ("name", name),
                ("memory", "512"),
                ("cores", "1"),
                ("cpu", "host"),
                ("scsi0", "local-lvm:vm-1-disk-0,size=1G"),
            ];
            pairs.extend_from_slice(extra);
            qemu("pve1", vmid, "stopped", &pairs)
        };
        let snapshot = Snapshot {
            nodes: vec!["pve1".to_owned()],
            guests: vec![
                vm(500, "web", &[]),
                vm(501, "web", &[("ide2", "local:iso/netinst.iso,media=cdrom")]),
                vm(502, "db", &[]),
                vm(503, "cache", &[]),
            ],
            files: vec![iso("pve1")],
            skipped: Vec::new(),
        };
        let fresh = build(
            &snapshot,
            "lab",
            &SshKeyRefs::default(),
            &Existing::default(),
        );
        let mut existing = Existing::default();
        existing
            .guests
            .insert(500, "VM/web (vm/base/web.yaml)".to_owned());
        existing.names.insert((Kind::Vm, "web".to_owned()));
        existing.artifacts.insert(
            (Kind::Iso, "local".to_owned(), "netinst.iso".to_owned()),
            "installer".to_owned(),
        );
        existing.names.insert((Kind::Iso, "installer".to_owned()));
        // Someone else's file where `db` would go, and adopt's own earlier file for `cache`,
        // edited since.
        existing
            .files
            .insert("vm/lab/db.yaml".to_owned(), "# mine\n".to_owned());
        let cache = fresh.files["vm/lab/cache.yaml"].replace("512MiB", "1GiB");
        existing.files.insert("vm/lab/cache.yaml".to_owned(), cache);

        let adoption = build(&snapshot, "lab", &SshKeyRefs::default(), &existing);
        let paths: Vec<&str> = adoption.files.keys().map(String::as_str).collect();
        assert_eq!(paths, ["vm/lab/db-502.yaml", "vm/lab/web-501.yaml"]);
        assert!(adoption.files["vm/lab/web-501.yaml"].contains("iso: installer"));
        let skipped: Vec<(&str, &str)> = adoption
            .report
            .skipped
            .iter()
            .map(|s| (s.what.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(skipped.len(), 3, "{skipped:#?}");
        assert_eq!(
            skipped[0],
            (
                "local:iso/netinst.iso on pve1",
                "already declared as ISO/installer"
            )
        );
        assert_eq!(
            skipped[1],
            (
                "qemu 500 on pve1",
                "already declared as VM/web (vm/base/web.yaml)"
            )
        );
        assert_eq!(skipped[2].0, "vm/lab/cache.yaml");
    }
}
