//! Guests end to end (issue 5, DESIGN.md §2.4–2.6, §3, §4): `proxops plan` and `proxops
//! apply` against the simulator create, converge, report and prune VMs, LXCs and templates,
//! and every request they send passes PVE's schema.

use std::time::Duration;

use serde_json::Value;

use crate::pve_api::Api;
use crate::sim::{World, artifact, assert_all_requests_valid};
use crate::support::{repo_root, stderr, stdout};

const IMAGE: &[u8] = b"a qcow2 disk image, one GiB once imported";
const TARBALL: &[u8] = b"a container template tarball";
const ISO: &[u8] = b"an installer image";

impl Api {
    async fn status(&self, node: &str, kind: &str, vmid: u32) -> String {
        let data = self
            .get(&format!("/nodes/{node}/{kind}/{vmid}/status/current"))
            .await;
        data["status"].as_str().unwrap_or_default().to_owned()
    }

    /// vmids of every guest in the cluster.
    async fn vmids(&self) -> Vec<u64> {
        let data = self.get("/cluster/resources?type=vm").await;
        let mut ids: Vec<u64> = data
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|g| g["vmid"].as_u64())
            .collect();
        ids.sort_unstable();
        ids
    }
}

fn text(config: &serde_json::Map<String, Value>, key: &str) -> String {
    match config.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// Exit code 0, or the output in the panic message.
fn assert_ok(output: &std::process::Output) {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(output),
        stderr(output)
    );
}

const REFERENCE_VM: &str = "apiVersion: proxops/v1alpha1
kind: VM
metadata:
  name: ci-vm
spec:
  node: pve1
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

async fn reference_world() -> World {
    let world = World::start(&[("debian.qcow2", IMAGE)]).await;
    world.write(
        "diskimage/debian-cloud.yaml",
        Some(&artifact(
            "DiskImage",
            "debian-cloud",
            &["pve1"],
            "debian-13-genericcloud.qcow2",
            &format!("{}/debian.qcow2", world.files_url),
            None,
        )),
    );
    world.write("vm/ci-vm.yaml", Some(REFERENCE_VM));
    world
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reference_cloud_init_vm_is_created_started_and_matches_its_manifest_key_by_key() {
    let world = reference_world().await;
    let api = Api::new(&world);

    let plan = world.proxops(&["plan"]).await;
    assert_eq!(plan.status.code(), Some(2), "{}", stdout(&plan));
    let out = stdout(&plan);
    assert!(
        out.contains("+ create VM/ci-vm on pve1 (vmid 9100)"),
        "{out}"
    );
    assert!(out.contains("then grow scsi0 to 8G"), "{out}");

    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    let config = api.config("pve1", "qemu", 9100).await;
    let expect = [
        ("ciuser", "debian"),
        (
            "sshkeys",
            "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIKey1%20ops%40example%0Assh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIKey2%20ci%2Bbot%40example",
        ),
        ("nameserver", "10.0.0.1 10.0.0.2"),
        ("searchdomain", "lab.example example"),
        ("ipconfig0", "ip=10.0.0.50/24,gw=10.0.0.1"),
        ("agent", "1"),
        ("memory", "2048"),
        ("cores", "2"),
        ("cpu", "host"),
        ("scsihw", "virtio-scsi-single"),
        ("name", "ci-vm"),
        ("tags", "proxops"),
    ];
    for (key, value) in expect {
        assert_eq!(text(&config, key), value, "{key} in {config:?}");
    }
    let ide2 = text(&config, "ide2");
    assert!(
        ide2.starts_with("local-lvm:vm-9100-cloudinit") && ide2.contains("media=cdrom"),
        "{ide2}"
    );
    let scsi0 = text(&config, "scsi0");
    assert!(
        scsi0.starts_with("local-lvm:vm-9100-disk-") && scsi0.contains("size=8G"),
        "{scsi0}"
    );
    assert!(text(&config, "net0").contains("bridge=vmbr0"));
    assert_eq!(api.status("pve1", "qemu", 9100).await, "running");

    world.sim.control().clear_requests();
    let again = world.proxops(&["plan"]).await;
    assert_ok(&again);
    assert!(stdout(&again).contains("no changes"), "{}", stdout(&again));
    assert!(world.writes().is_empty(), "{:?}", world.writes());
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn out_of_band_changes_to_ciuser_and_sshkeys_are_corrected_or_only_reported() {
    let world = reference_world().await;
    let api = Api::new(&world);
    assert_ok(&world.proxops(&["apply", "--yes"]).await);

    let tamper = || async {
        api.put(
            "/nodes/pve1/qemu/9100/config",
            &[
                ("ciuser", "intruder"),
                (
                    "sshkeys",
                    "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIEvil%20x%40y",
                ),
            ],
        )
        .await;
    };
    tamper().await;
    let plan = world.proxops(&["plan"]).await;
    assert_eq!(plan.status.code(), Some(2), "{}", stdout(&plan));
    let out = stdout(&plan);
    assert!(out.contains("~ update VM/ci-vm on pve1"), "{out}");
    assert!(out.contains("ciuser: intruder → debian"), "{out}");
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    let config = api.config("pve1", "qemu", 9100).await;
    assert_eq!(text(&config, "ciuser"), "debian");
    assert!(text(&config, "sshkeys").contains("Key1"));
    assert!(!text(&config, "sshkeys").contains("Evil"));

    // Report-only: recorded as drift, never written.
    world.write(
        "vm/ci-vm.yaml",
        Some(&REFERENCE_VM.replace(
            "  name: ci-vm\n",
            "  name: ci-vm\n  annotations:\n    proxops/drift: report\n",
        )),
    );
    tamper().await;
    world.sim.control().clear_requests();
    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    let out = stdout(&plan);
    assert!(out.contains("! drift VM/ci-vm on pve1"), "{out}");
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    assert!(world.writes().is_empty(), "{:?}", world.writes());
    let config = api.config("pve1", "qemu", 9100).await;
    assert_eq!(text(&config, "ciuser"), "intruder");
    assert_all_requests_valid(&world);
}

const CT_TEMPLATE: &str = "debian-12-standard_12.12-1_amd64.tar.zst";

#[tokio::test(flavor = "multi_thread")]
async fn an_lxc_from_a_ct_template_is_created_and_running() {
    let world = World::start(&[("ct.tar.zst", TARBALL)]).await;
    let api = Api::new(&world);
    world.write(
        "ctt/debian-12.yaml",
        Some(&artifact(
            "CTTemplate",
            "debian-12",
            &["pve1"],
            CT_TEMPLATE,
            &format!("{}/ct.tar.zst", world.files_url),
            None,
        )),
    );
    world.write(
        "lxc/dns-1.yaml",
        Some(
            "apiVersion: proxops/v1alpha1
kind: LXC
metadata: {name: dns-1}
spec:
  node: pve1
  vmid: 201
  template: debian-12
  memory: 512MiB
  swap: 512MiB
  cpu: {cores: 1}
  root: {storage: local-lvm, size: 8GiB}
  networks:
    - {bridge: vmbr0, ip: 192.0.2.53/24, gw: 192.0.2.1}
  dns: {hostname: dns-1, nameservers: [1.1.1.1], domain: lab.example.org}
  options: {unprivileged: true, nesting: true, onboot: true}
  tags: [dns]
",
        ),
    );
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    assert!(
        stdout(&apply).contains("apply: 3 succeeded"),
        "{}",
        stdout(&apply)
    );
    assert_eq!(api.status("pve1", "lxc", 201).await, "running");
    let config = api.config("pve1", "lxc", 201).await;
    assert_eq!(text(&config, "hostname"), "dns-1");
    assert_eq!(text(&config, "tags"), "dns;proxops");
    assert!(text(&config, "features").contains("nesting=1"));
    assert!(text(&config, "net0").contains("ip=192.0.2.53/24"));

    world.sim.control().clear_requests();
    let again = world.proxops(&["plan"]).await;
    assert_ok(&again);
    assert!(stdout(&again).contains("no changes"), "{}", stdout(&again));
    assert_all_requests_valid(&world);
}

fn template_vm(vmid: u32) -> String {
    format!(
        "apiVersion: proxops/v1alpha1
kind: TemplateVM
metadata: {{name: golden}}
spec:
  node: pve1
  vmid: {vmid}
  memory: 1GiB
  cpu: {{type: host, cores: 1}}
  disks:
    - {{storage: local-lvm, image: debian-cloud, size: 4GiB}}
  networks:
    - {{bridge: vmbr0}}
  hardware:
    cloud-init: {{enabled: true, storage: local-lvm}}
  cloud-init-data:
    ci-user: template-user
    nameservers: [10.0.0.1]
"
    )
}

fn clone_vm(name: &str, vmid: u32) -> String {
    format!(
        "apiVersion: proxops/v1alpha1
kind: VM
metadata: {{name: {name}}}
spec:
  node: pve1
  vmid: {vmid}
  clone: golden
  memory: 2GiB
  cpu: {{type: host, cores: 2}}
  networks:
    - {{bridge: vmbr0}}
  cloud-init-data:
    ci-user: {name}-user
  tags: [app]
"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_vm_is_promoted_and_two_vms_are_cloned_from_it_without_lock_errors() {
    let world = World::start(&[("debian.qcow2", IMAGE)]).await;
    let api = Api::new(&world);
    world.write(
        "diskimage/debian-cloud.yaml",
        Some(&artifact(
            "DiskImage",
            "debian-cloud",
            &["pve1"],
            "debian-13-genericcloud.qcow2",
            &format!("{}/debian.qcow2", world.files_url),
            None,
        )),
    );
    world.write("templatevm/golden.yaml", Some(&template_vm(9000)));
    world.write("vm/app-1.yaml", Some(&clone_vm("app-1", 301)));
    world.write("vm/app-2.yaml", Some(&clone_vm("app-2", 302)));

    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    let template = api.config("pve1", "qemu", 9000).await;
    assert_eq!(text(&template, "template"), "1");
    for (vmid, user) in [(301, "app-1-user"), (302, "app-2-user")] {
        let config = api.config("pve1", "qemu", vmid).await;
        assert_eq!(text(&config, "ciuser"), user);
        assert_eq!(text(&config, "memory"), "2048");
        assert_eq!(text(&config, "tags"), "app;proxops");
        // Inherited identity the manifest does not own is removed.
        assert_eq!(text(&config, "nameserver"), "", "{config:?}");
        assert_eq!(api.status("pve1", "qemu", vmid).await, "running");
    }
    let locked: Vec<_> = world
        .requests()
        .into_iter()
        .filter(|r| r.status >= 400)
        .collect();
    assert!(locked.is_empty(), "no request was refused: {locked:?}");

    world.sim.control().clear_requests();
    let again = world.proxops(&["plan"]).await;
    assert_ok(&again);
    assert!(stdout(&again).contains("no changes"), "{}", stdout(&again));
    assert_all_requests_valid(&world);
}

fn small_vm(name: &str, vmid: u32, extra: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1
kind: VM
metadata: {{name: {name}}}
spec:
  node: pve1
  vmid: {vmid}
  memory: 1GiB
  cpu: {{type: host, cores: 1}}
  disks:
    - {{storage: local-lvm, size: 1GiB}}
  networks:
    - {{bridge: vmbr0}}
{extra}"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_concurrent_edit_between_observe_and_update_overwrites_nothing_and_converges_next_pass() {
    let world = World::start(&[]).await;
    let api = Api::new(&world);
    world.write("vm/db.yaml", Some(&small_vm("db", 110, "")));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);

    world.write(
        "vm/db.yaml",
        Some(&small_vm("db", 110, "").replace("memory: 1GiB", "memory: 2GiB")),
    );
    // The first write proxops sends finds the config locked; while it waits to retry,
    // someone else edits the config.
    world.sim.control().time_out_lock(110, 1);
    let apply = {
        let run = world.proxops(&["apply", "--yes"]);
        let edit = async {
            loop {
                let refused = world.requests().iter().any(|r| {
                    r.method == "PUT" && r.path == "/nodes/pve1/qemu/110/config" && r.status == 500
                });
                if refused {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            api.put("/nodes/pve1/qemu/110/config", &[("onboot", "1")])
                .await;
        };
        let (apply, ()) = tokio::join!(run, edit);
        apply
    };
    assert_eq!(apply.status.code(), Some(1), "{}", stdout(&apply));
    assert!(
        stdout(&apply).contains("checksum mismatch"),
        "{}",
        stdout(&apply)
    );
    let config = api.config("pve1", "qemu", 110).await;
    assert_eq!(text(&config, "memory"), "1024", "nothing overwritten");
    assert_eq!(text(&config, "onboot"), "1");

    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    let config = api.config("pve1", "qemu", 110).await;
    assert_eq!(text(&config, "memory"), "2048");
    assert_eq!(text(&config, "onboot"), "1", "the other edit is kept");
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn prune_is_a_finding_until_enabled_then_deletes_only_owned_unprotected_guests() {
    let world = World::start(&[]).await;
    let api = Api::new(&world);
    world.write("vm/keep.yaml", Some(&small_vm("keep", 120, "")));
    world.write("vm/old.yaml", Some(&small_vm("old", 121, "")));
    world.write(
        "vm/guarded.yaml",
        Some(&small_vm("guarded", 122, "  options: {protection: true}\n")),
    );
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    // A guest ProxOps never created.
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/qemu",
        &[("vmid", "150"), ("memory", "512"), ("name", "handmade")],
    )
    .await;

    world.write("vm/old.yaml", None);
    world.write("vm/guarded.yaml", None);
    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    let out = stdout(&plan);
    assert!(out.contains("! orphaned VM/old on pve1"), "{out}");
    assert!(out.contains("prune is off"), "{out}");
    assert!(!out.contains("handmade"), "{out}");

    let config = world.dir.path().join("agent.toml");
    let mut toml = std::fs::read_to_string(&config).unwrap();
    toml.push_str("prune = true\n");
    std::fs::write(&config, toml).unwrap();
    let plan = world.proxops(&["plan"]).await;
    let out = stdout(&plan);
    assert_eq!(plan.status.code(), Some(2), "{out}");
    assert!(out.contains("- delete VM/old on pve1 (vmid 121)"), "{out}");
    assert!(out.contains("protection is set"), "{out}");
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    assert_eq!(api.vmids().await, [120, 122, 150]);

    // An empty revision deletes nothing.
    world.write("vm/keep.yaml", None);
    world.write("README.yaml", Some("# nothing declared\n"));
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    assert!(
        stdout(&apply).contains("probable bad push"),
        "{}",
        stdout(&apply)
    );
    assert_eq!(api.vmids().await, [120, 122, 150]);
    assert_all_requests_valid(&world);
}

/// Copies `examples/` into the world's repository with every download URL pointing at the
/// world's file server.
fn copy_examples(world: &World) {
    let root = repo_root().join("examples");
    for entry in walkdir::WalkDir::new(&root) {
        let entry = entry.unwrap();
        if !entry.file_type().is_file() {
            continue;
        }
        let rel = entry.path().strip_prefix(&root).unwrap();
        let mut text = std::fs::read_to_string(entry.path()).unwrap();
        let rewritten: Vec<String> = text
            .lines()
            .map(|line| match line.trim_start().strip_prefix("url: ") {
                Some(url) => {
                    let file = url.rsplit('/').next().unwrap_or(url);
                    format!("  url: {}/{file}", world.files_url)
                }
                None => line.to_owned(),
            })
            .collect();
        text = rewritten.join("\n");
        text.push('\n');
        world.write(&rel.display().to_string(), Some(&text));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_manifests_in_the_go_programs_format_plan_and_apply_unchanged() {
    let world = World::start(&[
        ("debian-13.2.0-amd64-netinst.iso", ISO),
        ("debian-12-standard_12.12-1_amd64.tar.zst", TARBALL),
        ("debian-12-genericcloud-amd64.qcow2", IMAGE),
    ])
    .await;
    let api = Api::new(&world);
    copy_examples(&world);

    let plan = world.proxops(&["plan", "--node", "*"]).await;
    assert_eq!(
        plan.status.code(),
        Some(2),
        "{}{}",
        stdout(&plan),
        stderr(&plan)
    );
    let apply = world.proxops(&["apply", "--yes", "--node", "*"]).await;
    assert_ok(&apply);
    assert_eq!(api.vmids().await, [101, 102, 103, 201, 9000]);
    assert_eq!(api.status("pve1", "qemu", 101).await, "running");
    assert_eq!(api.status("pve2", "qemu", 102).await, "stopped");
    assert_eq!(api.status("pve1", "lxc", 201).await, "running");
    assert_eq!(
        text(&api.config("pve2", "qemu", 9000).await, "template"),
        "1"
    );

    world.sim.control().clear_requests();
    let again = world.proxops(&["plan", "--node", "*"]).await;
    assert_ok(&again);
    assert!(stdout(&again).contains("no changes"), "{}", stdout(&again));
    assert!(world.writes().is_empty());
    assert_all_requests_valid(&world);
}

/// A small deterministic generator (xorshift64*), so every case can be replayed by its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[usize::try_from(self.below(items.len() as u64)).unwrap()]
    }

    fn chance(&mut self) -> bool {
        self.below(2) == 0
    }

    /// `Some(bool)` or `None`: a tri-state option.
    fn tri(&mut self) -> Option<bool> {
        match self.below(3) {
            0 => None,
            1 => Some(true),
            _ => Some(false),
        }
    }
}

fn tri_line(out: &mut String, key: &str, value: Option<bool>) {
    if let Some(v) = value {
        out.push_str(&format!("    {key}: {v}\n"));
    }
}

/// A random valid VM (no artifacts needed).
fn random_vm(rng: &mut Rng, name: &str, vmid: u32) -> String {
    let mut s = format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata: {{name: {name}}}\nspec:\n  node: pve1\n  vmid: {vmid}\n  state: {}\n  memory: {}MiB\n  cpu: {{type: {}, cores: {}}}\n  disks:\n",
        rng.pick(&["started", "stopped"]),
        512 * (1 + rng.below(6)),
        rng.pick(&["host", "kvm64", "x86-64-v2-AES"]),
        1 + rng.below(4)
    );
    let disks = 1 + rng.below(2);
    for i in 0..disks {
        let bus = rng.pick(&["scsi", "virtio", "sata"]);
        s.push_str(&format!(
            "    - storage: local-lvm\n      size: {}GiB\n      interface: {bus}{i}\n",
            1 + rng.below(4)
        ));
        if rng.chance() {
            s.push_str(&format!(
                "      discard: \"{}\"\n",
                rng.pick(&["on", "ignore"])
            ));
        }
        if bus != "virtio" && rng.chance() {
            s.push_str(&format!("      ssd: {}\n", rng.chance()));
        }
        if bus != "sata" && rng.chance() {
            s.push_str("      iothread: true\n");
        }
    }
    let nics = rng.below(3);
    if nics > 0 {
        s.push_str("  networks:\n");
        for _ in 0..nics {
            s.push_str(&format!("    - bridge: vmbr{}\n", rng.below(2)));
            if rng.chance() {
                s.push_str(&format!("      vlan: {}\n", 1 + rng.below(4000)));
            }
            if rng.chance() {
                s.push_str(&format!("      firewall: {}\n", rng.chance()));
            }
        }
    }
    if rng.chance() {
        s.push_str(&format!(
            "  hardware:\n    machine: {}\n",
            rng.pick(&["q35", "i440fx"])
        ));
    }
    let mut options = String::new();
    for key in ["onboot", "agent", "acpi", "tablet"] {
        let value = rng.tri();
        tri_line(&mut options, key, value);
    }
    if !options.is_empty() {
        s.push_str("  options:\n");
        s.push_str(&options);
    }
    if nics > 0 && rng.chance() {
        s = s.replace(
            "  hardware:\n",
            "  hardware:\n    cloud-init: {enabled: true, storage: local-lvm}\n",
        );
        if !s.contains("cloud-init:") {
            s.push_str("  hardware:\n    cloud-init: {enabled: true, storage: local-lvm}\n");
        }
        s.push_str(&format!(
            "  cloud-init-data:\n    ci-user: {}\n    nameservers: [10.0.0.{}]\n    ipconfigs:\n      - {{nic: 0, ip: {}}}\n",
            rng.pick(&["debian", "ops", "root"]),
            1 + rng.below(9),
            rng.pick(&["dhcp", "10.1.0.5/24"])
        ));
    }
    if rng.chance() {
        s.push_str(&format!(
            "  pve-description: {}\n",
            rng.pick(&["web tier", "db, primary", "scratch"])
        ));
    }
    if rng.chance() {
        s.push_str(&format!(
            "  tags: [{}]\n",
            rng.pick(&["web", "db, prod", "Blue, green"])
        ));
    }
    s
}

/// A random valid LXC from the CTTemplate `debian-12`.
fn random_lxc(rng: &mut Rng, name: &str, vmid: u32) -> String {
    let mut s = format!(
        "apiVersion: proxops/v1alpha1\nkind: LXC\nmetadata: {{name: {name}}}\nspec:\n  node: pve1\n  vmid: {vmid}\n  state: {}\n  template: debian-12\n  memory: {}MiB\n  cpu: {{cores: {}}}\n  root: {{storage: local-lvm, size: {}GiB}}\n",
        rng.pick(&["started", "stopped"]),
        256 * (1 + rng.below(4)),
        1 + rng.below(3),
        1 + rng.below(8)
    );
    if rng.chance() {
        s.push_str(&format!("  swap: {}MiB\n", 256 * rng.below(3)));
    }
    if rng.chance() {
        s.push_str(&format!(
            "  networks:\n    - {{bridge: vmbr0, ip: {}}}\n",
            rng.pick(&["dhcp", "192.0.2.9/24"])
        ));
    }
    if rng.chance() {
        s.push_str(&format!(
            "  dns: {{hostname: {name}-host, nameservers: [1.1.1.1, 9.9.9.9], domain: lab.example}}\n"
        ));
    }
    let mut options = String::new();
    // Feature flags on a privileged container are root@pam-only (LIVE-FACTS §1.6): nesting
    // is only declared for unprivileged ones.
    let unprivileged = rng.tri();
    tri_line(&mut options, "unprivileged", unprivileged);
    if unprivileged == Some(true) {
        let nesting = rng.tri();
        tri_line(&mut options, "nesting", nesting);
    }
    let onboot = rng.tri();
    tri_line(&mut options, "onboot", onboot);
    let protection = rng.tri().map(|_| false);
    tri_line(&mut options, "protection", protection);
    if !options.is_empty() {
        s.push_str("  options:\n");
        s.push_str(&options);
    }
    if rng.chance() {
        s.push_str("  pve-description: a container\n");
    }
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn random_valid_manifests_applied_once_leave_nothing_to_plan() {
    for seed in (1..=8_u64).map(|i| 0x5EED_0000 + i) {
        let mut rng = Rng(seed);
        let world = World::start(&[("ct.tar.zst", TARBALL)]).await;
        world.write(
            "ctt/debian-12.yaml",
            Some(&artifact(
                "CTTemplate",
                "debian-12",
                &["pve1"],
                CT_TEMPLATE,
                &format!("{}/ct.tar.zst", world.files_url),
                None,
            )),
        );
        let mut docs = Vec::new();
        for i in 0..4 {
            let vmid = 400 + i;
            let doc = if rng.chance() {
                random_vm(&mut rng, &format!("g{i}"), vmid)
            } else {
                random_lxc(&mut rng, &format!("g{i}"), vmid)
            };
            world.write(&format!("guests/g{i}.yaml"), Some(&doc));
            docs.push(doc);
        }
        let apply = world.proxops(&["apply", "--yes"]).await;
        assert_eq!(
            apply.status.code(),
            Some(0),
            "seed {seed:#x}\n{}\n{}{}",
            docs.join("---\n"),
            stdout(&apply),
            stderr(&apply)
        );
        world.sim.control().clear_requests();
        let plan = world.proxops(&["plan"]).await;
        assert!(
            plan.status.code() == Some(0) && stdout(&plan).contains("no changes"),
            "seed {seed:#x}: the next plan is not empty\n{}\n{}",
            docs.join("---\n"),
            stdout(&plan)
        );
        assert!(world.writes().is_empty());
        assert_all_requests_valid(&world);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_change_pending_on_a_running_guest_needs_a_reboot_until_restarts_are_allowed() {
    let world = World::start(&[]).await;
    let api = Api::new(&world);
    world.write("vm/app.yaml", Some(&small_vm("app", 130, "")));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    // PVE reports the start in /cluster/resources after pvestatd's next run (10 s).
    world.sim.control().refresh_stats();
    assert_eq!(api.status("pve1", "qemu", 130).await, "running");

    world.write(
        "vm/app.yaml",
        Some(&small_vm("app", 130, "").replace("cores: 1", "cores: 2")),
    );
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    assert!(
        stdout(&apply).contains("! needs-reboot VM/app on pve1"),
        "{}",
        stdout(&apply)
    );
    let current = api.get("/nodes/pve1/qemu/130/config?current=1").await;
    assert_eq!(current["cores"].to_string(), "1", "held as pending");
    assert_eq!(api.status("pve1", "qemu", 130).await, "running");

    // Later passes keep saying so, and change nothing.
    world.sim.control().clear_requests();
    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    assert!(stdout(&plan).contains("! needs-reboot VM/app on pve1"));
    assert!(world.writes().is_empty());

    world.write(
        "vm/app.yaml",
        Some(
            &small_vm("app", 130, "")
                .replace("cores: 1", "cores: 2")
                .replace(
                    "metadata: {name: app}",
                    "metadata:\n  name: app\n  annotations: {proxops/restart: on-change}",
                ),
        ),
    );
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    assert!(
        stdout(&apply).contains("reboot VM/app on pve1: ok"),
        "{}",
        stdout(&apply)
    );
    let current = api.get("/nodes/pve1/qemu/130/config?current=1").await;
    assert_eq!(current["cores"].to_string(), "2");
    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    assert!(stdout(&plan).contains("no changes"), "{}", stdout(&plan));
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unmanaged_guest_at_the_vmid_and_a_guest_on_another_node_are_left_untouched() {
    let world = World::start(&[]).await;
    let api = Api::new(&world);
    // Someone else's VM holds 140; ProxOps's own VM 141 was moved to pve2.
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/qemu",
        &[("vmid", "140"), ("memory", "512"), ("name", "theirs")],
    )
    .await;
    api.post_and_wait(
        "pve2",
        "/nodes/pve2/qemu",
        &[
            ("vmid", "141"),
            ("memory", "512"),
            ("name", "moved"),
            ("tags", "proxops"),
        ],
    )
    .await;
    world.write("vm/theirs.yaml", Some(&small_vm("theirs", 140, "")));
    world.write("vm/moved.yaml", Some(&small_vm("moved", 141, "")));

    world.sim.control().clear_requests();
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    let out = stdout(&apply);
    assert!(out.contains("! unmanaged-vmid VM/theirs on pve1"), "{out}");
    assert!(out.contains("! moved VM/moved on pve1"), "{out}");
    assert!(world.writes().is_empty(), "{:?}", world.writes());
    assert_eq!(api.vmids().await, [140, 141]);

    // Adopting takes the guest over once the operator's `[scope] adopt` allows it: its first
    // write claims it with the tag.
    world.write(
        "vm/theirs.yaml",
        Some(&small_vm("theirs", 140, "").replace(
            "metadata: {name: theirs}",
            "metadata:\n  name: theirs\n  annotations: {proxops/adopt: \"true\"}",
        )),
    );
    world.write_agent_toml(
        &world
            .agent_toml()
            .scope(crate::support::agent::SIM_SCOPE)
            .scope("adopt = \"140\""),
    );
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    let config = api.config("pve1", "qemu", 140).await;
    assert_eq!(text(&config, "tags"), "proxops");
    assert_eq!(text(&config, "memory"), "1024");
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_ct_is_created_stopped_and_marked_although_pve_answers_null() {
    let world = World::start(&[("ct.tar.zst", TARBALL)]).await;
    let api = Api::new(&world);
    world.write(
        "ctt/debian-12.yaml",
        Some(&artifact(
            "CTTemplate",
            "debian-12",
            &["pve1"],
            CT_TEMPLATE,
            &format!("{}/ct.tar.zst", world.files_url),
            None,
        )),
    );
    world.write(
        "templatect/base-ct.yaml",
        Some(
            "apiVersion: proxops/v1alpha1
kind: TemplateCT
metadata: {name: base-ct}
spec:
  node: pve1
  vmid: 8000
  template: debian-12
  memory: 512MiB
  cpu: {cores: 1}
  root: {storage: local-lvm, size: 4GiB}
  options: {unprivileged: true}
",
        ),
    );
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    assert!(
        stdout(&apply).contains("promote TemplateCT/base-ct on pve1: ok"),
        "{}",
        stdout(&apply)
    );
    // PVE answered null and runs the vztemplate worker on: wait for it to mark the CT.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while text(&api.config("pve1", "lxc", 8000).await, "template") != "1" {
        assert!(
            std::time::Instant::now() < deadline,
            "the CT was never marked a template"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(api.status("pve1", "lxc", 8000).await, "stopped");
    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    assert!(stdout(&plan).contains("no changes"), "{}", stdout(&plan));
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_out_of_band_pending_change_on_a_running_vm_is_drift_on_every_pass_then_corrected() {
    let world = World::start(&[]).await;
    let api = Api::new(&world);
    let report = small_vm("app", 131, "").replace(
        "metadata: {name: app}",
        "metadata:\n  name: app\n  annotations: {proxops/drift: report}",
    );
    world.write("vm/app.yaml", Some(&report));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    assert_eq!(api.status("pve1", "qemu", 131).await, "running");

    // The operator raises the memory through the API; PVE holds it for a restart.
    api.put("/nodes/pve1/qemu/131/config", &[("memory", "2048")])
        .await;
    let current = api.get("/nodes/pve1/qemu/131/config?current=1").await;
    assert_eq!(text(current.as_object().unwrap(), "memory"), "1024");

    // Reported as drift, the same on every pass: never needs-reboot, nothing written.
    world.sim.control().clear_requests();
    for _ in 0..2 {
        let plan = world.proxops(&["plan"]).await;
        let out = stdout(&plan);
        assert!(out.contains("! drift VM/app on pve1"), "{out}");
        assert!(out.contains("memory"), "{out}");
        assert!(!out.contains("needs-reboot"), "{out}");
    }
    assert!(world.writes().is_empty());

    // Without the annotation it is corrected: the manifest's value, which is the one in
    // effect, clears what PVE held, so no restart is needed and the next plan is empty.
    world.write("vm/app.yaml", Some(&small_vm("app", 131, "")));
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    let out = stdout(&apply);
    assert!(out.contains("update VM/app on pve1: ok"), "{out}");
    assert!(!out.contains("needs-reboot"), "{out}");
    let pending = api.get("/nodes/pve1/qemu/131/pending").await;
    let memory = pending
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == "memory")
        .unwrap()
        .clone();
    assert!(memory.get("pending").is_none(), "{memory}");
    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    assert!(stdout(&plan).contains("no changes"), "{}", stdout(&plan));
    assert_eq!(api.status("pve1", "qemu", 131).await, "running");
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plan_reads_each_managed_guest_once_from_its_pending_list() {
    let world = World::start(&[]).await;
    for (name, vmid) in [("a", 140), ("b", 141), ("c", 142)] {
        world.write(&format!("vm/{name}.yaml"), Some(&small_vm(name, vmid, "")));
    }
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    // pvestatd's tick: `/cluster/resources` reports the guests' state, so no power state is
    // read from `status/current` (that read is only for a listing that disagrees).
    world.sim.control().refresh_stats();

    world.sim.control().clear_requests();
    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    assert!(stdout(&plan).contains("no changes"), "{}", stdout(&plan));
    let mut endpoints: Vec<String> = world
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .filter(|r| !r.contains("/version"))
        .collect();
    endpoints.sort();
    assert_eq!(
        endpoints,
        [
            "GET /cluster/resources",
            "GET /nodes/pve1/qemu/140/pending",
            "GET /nodes/pve1/qemu/141/pending",
            "GET /nodes/pve1/qemu/142/pending",
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_that_ignores_acpi_is_stopped_hard_after_the_shutdown_timeout() {
    let world = World::start(&[]).await;
    let api = Api::new(&world);
    // A 4 s task wait gives the guest 2 s to shut down cleanly.
    let config = world.dir.path().join("agent.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("\"30s\"", "\"4s\"")).unwrap();
    world.write("vm/hung.yaml", Some(&small_vm("hung", 150, "")));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    // PVE reports the start in /cluster/resources after pvestatd's next run (10 s).
    world.sim.control().refresh_stats();
    assert_eq!(api.status("pve1", "qemu", 150).await, "running");
    assert!(world.sim.control().ignore_shutdown(150, true));

    world.write(
        "vm/hung.yaml",
        Some(&small_vm("hung", 150, "").replace("  memory:", "  state: stopped\n  memory:")),
    );
    world.sim.control().clear_requests();
    let started = std::time::Instant::now();
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(api.status("pve1", "qemu", 150).await, "stopped");
    let shutdown = world
        .writes()
        .into_iter()
        .find(|r| r.path.ends_with("/status/shutdown"))
        .expect("a shutdown request");
    assert_eq!(shutdown.params["timeout"], "2");
    assert_eq!(shutdown.params["forceStop"], "1");

    // Without forceStop, PVE gives up after the timeout and the guest keeps running.
    api.post_and_wait("pve1", "/nodes/pve1/qemu/150/status/start", &[])
        .await;
    let upid = api
        .post("/nodes/pve1/qemu/150/status/shutdown", &[("timeout", "1")])
        .await;
    assert_eq!(
        task_exitstatus(&api, &upid).await,
        "VM quit/powerdown failed - got timeout"
    );
    assert_eq!(api.status("pve1", "qemu", 150).await, "running");
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_reports_a_changed_clone_source_as_requires_recreate_and_keeps_the_vm() {
    use crate::agent::{commit_of, start_agent};
    use crate::git_server::TestRepo;

    let world = World::start(&[("debian.qcow2", IMAGE)]).await;
    let api = Api::new(&world);
    let repo = TestRepo::new();
    let image = artifact(
        "DiskImage",
        "debian-cloud",
        &["pve1"],
        "debian-13-genericcloud.qcow2",
        &format!("{}/debian.qcow2", world.files_url),
        None,
    );
    let golden_v2 = template_vm(9001).replace("name: golden", "name: golden-v2");
    let app = clone_vm("app", 103).replace("  memory:", "  state: stopped\n  memory:");
    let first = repo.commit_files(
        &[
            ("diskimage/debian-cloud.yaml", image.as_str()),
            ("templatevm/golden.yaml", template_vm(9000).as_str()),
            ("templatevm/golden-v2.yaml", golden_v2.as_str()),
            ("vm/app.yaml", app.as_str()),
        ],
        "two templates, one clone",
    );
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s")).await;
    agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(first.as_str()))
        .await;
    assert_eq!(api.status("pve1", "qemu", 103).await, "stopped");

    let moved = app.replace("clone: golden", "clone: golden-v2");
    repo.commit_files(
        &[("vm/app.yaml", moved.as_str())],
        "clone app from golden-v2",
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let finding = loop {
        let drift = agent.get("/api/v1/drift").await;
        if let Some(f) = drift["open"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["resource"] == "VM/app" && f.to_string().contains("spec.clone"))
        {
            break f.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no requires-recreate finding: {drift}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let text = finding.to_string();
    assert!(text.contains("requires-recreate"), "{text}");
    assert!(text.contains("golden-v2"), "{text}");
    // Never destroyed, never cloned a second time.
    assert!(api.vmids().await.contains(&103));
    assert!(
        world
            .writes()
            .iter()
            .all(|r| r.method != "DELETE" && !r.path.ends_with("/103/clone")),
        "{:?}",
        world.writes()
    );
    let mut agent = agent;
    assert!(agent.terminate().success());
}

/// The exit status of task `upid` on pve1 once it stopped (polled for up to 5 s).
async fn task_exitstatus(api: &Api, upid: &Value) -> String {
    let path = format!(
        "/nodes/pve1/tasks/{}/status",
        upid.as_str().unwrap().replace(':', "%3A")
    );
    for _ in 0..50 {
        let status = api.get(&path).await;
        if status["status"] == "stopped" {
            return status["exitstatus"].as_str().unwrap_or_default().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("task {upid} still running");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_that_ignores_shutdown_is_stopped_hard_and_an_unforced_shutdown_fails() {
    let world = World::start(&[("ct.tar.zst", TARBALL)]).await;
    let api = Api::new(&world);
    let config = world.dir.path().join("agent.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("\"30s\"", "\"4s\"")).unwrap();
    world.write(
        "ctt/debian-12.yaml",
        Some(&artifact(
            "CTTemplate",
            "debian-12",
            &["pve1"],
            CT_TEMPLATE,
            &format!("{}/ct.tar.zst", world.files_url),
            None,
        )),
    );
    let ct = |state: &str| {
        format!(
            "apiVersion: proxops/v1alpha1\nkind: LXC\nmetadata: {{name: hung-ct}}\nspec:\n  node: pve1\n  vmid: 202\n  state: {state}\n  template: debian-12\n  memory: 512MiB\n  cpu: {{cores: 1}}\n  root: {{storage: local-lvm, size: 4GiB}}\n  options: {{unprivileged: true}}\n"
        )
    };
    world.write("lxc/hung-ct.yaml", Some(&ct("started")));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    // PVE reports the start in /cluster/resources after pvestatd's next run (10 s).
    world.sim.control().refresh_stats();
    assert_eq!(api.status("pve1", "lxc", 202).await, "running");
    assert!(world.sim.control().ignore_shutdown(202, true));

    // PVE's own default: no forceStop, the container stays up and the task fails.
    let upid = api
        .post("/nodes/pve1/lxc/202/status/shutdown", &[("timeout", "1")])
        .await;
    assert_eq!(task_exitstatus(&api, &upid).await, "container did not stop");
    assert_eq!(api.status("pve1", "lxc", 202).await, "running");

    world.write("lxc/hung-ct.yaml", Some(&ct("stopped")));
    world.sim.control().clear_requests();
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    assert_eq!(api.status("pve1", "lxc", 202).await, "stopped");
    let shutdown = world
        .writes()
        .into_iter()
        .find(|r| r.path.ends_with("/status/shutdown"))
        .expect("a shutdown request");
    assert_eq!(
        (
            shutdown.params["timeout"].as_str(),
            shutdown.params["forceStop"].as_str()
        ),
        ("2", "1")
    );
    assert_all_requests_valid(&world);
}

/// A lost answer on `method path` (PVE acts, pveproxy answers `status`), once.
fn lose_answer(world: &World, method: &str, pattern: &str, status: u16) {
    world
        .sim
        .control()
        .lose_answers(proxops_pve_sim::HttpFault {
            pattern: pattern.into(),
            method: Some(method.into()),
            status,
            message: None,
            times: Some(1),
            probability: None,
        })
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_whose_answer_was_lost_and_whose_task_has_finished_is_found_and_recorded_with_its_upid()
 {
    let world = World::start(&[]).await;
    let api = Api::new(&world);
    world.write("vm/db.yaml", Some(&small_vm("db", 110, "")));
    // PVE creates the VM, but pveproxy answers 596; the task list answers only after the
    // 50 ms qmcreate task has ended, so PVE lists it from its archive, where it matches the
    // token's user (`root@pam`) and never the token id (`root@pam!proxops`).
    lose_answer(&world, "POST", "^/nodes/pve1/qemu$", 596);
    world
        .sim
        .control()
        .add_latency(Some("^/nodes/pve1/tasks$"), Duration::from_millis(400))
        .unwrap();
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    let requests = world.requests();
    let creates: Vec<u16> = requests
        .iter()
        .filter(|r| r.method == "POST" && r.path == "/nodes/pve1/qemu")
        .map(|r| r.status)
        .collect();
    assert_eq!(creates, [596], "the lost answer, and no second create");
    let listing = requests
        .iter()
        .find(|r| r.path == "/nodes/pve1/tasks")
        .expect("the executor asked PVE for the create's task");
    assert_eq!(listing.params["userfilter"], "root@pam");
    assert_eq!(listing.params["typefilter"], "qmcreate");
    assert!(
        stdout(&apply).contains(":qmcreate:110:root@pam!proxops:"),
        "the create is recorded with the UPID PVE listed:\n{}",
        stdout(&apply)
    );
    assert_eq!(api.vmids().await, [110], "one guest, created once");
    let config = api.config("pve1", "qemu", 110).await;
    assert_eq!(text(&config, "name"), "db");
    assert_eq!(world.proxops(&["plan"]).await.status.code(), Some(0));
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_config_write_that_allocates_a_disk_answered_596_after_pve_acted_is_recorded_from_its_task_and_not_sent_again()
 {
    let world = World::start(&[("debian.qcow2", IMAGE)]).await;
    world.write(
        "diskimage/debian-cloud.yaml",
        Some(&artifact(
            "DiskImage",
            "debian-cloud",
            &["pve1"],
            "debian-13-genericcloud.qcow2",
            &format!("{}/debian.qcow2", world.files_url),
            None,
        )),
    );
    world.write("vm/db.yaml", Some(&small_vm("db", 110, "")));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    // A second disk imported from the image: a volume allocation, so a `qmconfig` task.
    let with_image = small_vm("db", 110, "").replace(
        "    - {storage: local-lvm, size: 1GiB}\n",
        "    - {storage: local-lvm, size: 1GiB}\n    - {storage: local-lvm, image: debian-cloud, size: 2GiB}\n",
    );
    world.write("vm/db.yaml", Some(&with_image));
    world.sim.control().clear_requests();
    lose_answer(&world, "POST", "^/nodes/pve1/qemu/110/config$", 596);
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    let config_writes: Vec<(String, u16)> = world
        .writes()
        .into_iter()
        .filter(|r| r.path == "/nodes/pve1/qemu/110/config")
        .map(|r| (r.method, r.status))
        .collect();
    assert_eq!(
        config_writes,
        [("POST".to_owned(), 596)],
        "one config write, as a task, never sent again"
    );
    assert!(
        stdout(&apply).contains(":qmconfig:110:root@pam!proxops:"),
        "the update is recorded with the qmconfig task PVE listed:\n{}",
        stdout(&apply)
    );
    let api = Api::new(&world);
    let config = api.config("pve1", "qemu", 110).await;
    assert!(
        text(&config, "scsi1").starts_with("local-lvm:vm-110-disk-"),
        "{config:?}"
    );
    assert!(text(&config, "scsi1").contains("size=2G"), "{config:?}");
    let plan = world.proxops(&["plan"]).await;
    assert_eq!(plan.status.code(), Some(0), "{}", stdout(&plan));
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_synchronous_config_write_answered_596_is_settled_from_the_digest_and_not_sent_again() {
    let world = World::start(&[]).await;
    world.write("vm/db.yaml", Some(&small_vm("db", 110, "")));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    world.write(
        "vm/db.yaml",
        Some(&small_vm("db", 110, "").replace("memory: 1GiB", "memory: 2GiB")),
    );
    world.sim.control().clear_requests();
    lose_answer(&world, "PUT", "^/nodes/pve1/qemu/110/config$", 596);
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    let puts = world
        .writes()
        .into_iter()
        .filter(|r| r.path == "/nodes/pve1/qemu/110/config")
        .count();
    assert_eq!(puts, 1, "the PUT PVE made is not sent again");
    let config = Api::new(&world).config("pve1", "qemu", 110).await;
    assert_eq!(text(&config, "memory"), "2048");
    assert_eq!(world.proxops(&["plan"]).await.status.code(), Some(0));
}
