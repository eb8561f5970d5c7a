//! `proxops adopt` (issue 9) against the simulator: a cluster populated through PVE's API
//! with hand-made guests of varied shape and files on two nodes is adopted read-only; the
//! manifests validate, the first plan only adds the ownership tag, and after apply the next
//! plan is empty. No write reaches PVE during adopt, no secret reaches any output or file, and
//! a second run writes the same bytes.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::pve_api::Api;
use crate::sim::World;
use crate::support::agent::AgentToml;
use crate::support::{proxops, stderr, stdout};

const IMAGE: &[u8] = b"a qcow2 disk image, one GiB once imported";
const TARBALL: &[u8] = b"a container template tarball";
const ISO: &[u8] = b"an installer image";

/// Key material and passwords given to PVE; none may appear in anything adopt writes.
const SSH_KEY_BLOB: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIAdoptSecretKeyMaterialxyz";
const CI_PASSWORD: &str = "ci-Hunter2-never-shown";
const CT_PASSWORD: &str = "ct-Hunter3-never-shown";

impl Api {
    /// POSTs as `root@pam` with a login ticket: PVE lets only root@pam itself (not its API
    /// tokens) pass a host PCI device through (LIVE-FACTS.md, host PCI).
    async fn post_as_root(&self, node: &str, path: &str, form: &[(&str, &str)]) {
        let login: Value = self
            .http
            .post(format!("{}/access/ticket", self.base))
            .form(&[("username", "root@pam"), ("password", "proxops")])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let login = &login["data"];
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .header(
                "Cookie",
                format!("PVEAuthCookie={}", login["ticket"].as_str().unwrap()),
            )
            .header(
                "CSRFPreventionToken",
                login["CSRFPreventionToken"].as_str().unwrap(),
            )
            .form(form)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {body}");
        if let Some(upid) = body["data"].as_str() {
            self.wait(node, upid).await;
        }
    }

    async fn download(&self, world: &World, node: &str, content: &str, file: &str) {
        let url = format!("{}/{file}", world.files_url);
        self.post_and_wait(
            node,
            &format!("/nodes/{node}/storage/local/download-url"),
            &[("content", content), ("filename", file), ("url", &url)],
        )
        .await;
    }
}

/// Builds the hand-made cluster of issue 9 through PVE's API.
async fn populate(world: &World, api: &Api) {
    for node in ["pve1", "pve2"] {
        api.download(world, node, "iso", "netinst.iso").await;
        api.download(world, node, "import", "cloud.qcow2").await;
        api.download(world, node, "vztmpl", "debian-12.tar.zst")
            .await;
    }
    let ssh_key = format!("ssh-ed25519 {SSH_KEY_BLOB} admin@example");
    let sshkeys = percent_encode(&ssh_key);
    // A cloud-init VM with an imported disk, mixed-case tags and a password.
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/qemu",
        &[
            ("vmid", "100"),
            ("name", "Cloud-Init-VM"),
            ("memory", "2048"),
            ("cores", "2"),
            ("cpu", "host"),
            ("scsihw", "virtio-scsi-single"),
            (
                "scsi0",
                "local-lvm:0,import-from=local:import/cloud.qcow2,iothread=1,discard=on",
            ),
            ("ide2", "local-lvm:cloudinit"),
            ("net0", "virtio,bridge=vmbr0"),
            ("ciuser", "debian"),
            ("sshkeys", &sshkeys),
            ("cipassword", CI_PASSWORD),
            ("ipconfig0", "ip=dhcp"),
            ("nameserver", "10.0.0.53"),
            ("agent", "1"),
            ("boot", "order=scsi0"),
            ("tags", "Web;Prod"),
            ("description", "hand-made\nsecond line"),
        ],
    )
    .await;
    // UEFI with secure boot, a TPM and the installer ISO in the CD-ROM.
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/qemu",
        &[
            ("vmid", "101"),
            ("name", "uefi-vm"),
            ("memory", "4096"),
            ("cores", "4"),
            ("cpu", "x86-64-v2-AES"),
            ("bios", "ovmf"),
            ("machine", "q35"),
            ("efidisk0", "local-lvm:1,efitype=4m,pre-enrolled-keys=1"),
            ("tpmstate0", "local-lvm:1,version=v2.0"),
            ("scsi0", "local-lvm:8"),
            ("ide2", "local:iso/netinst.iso,media=cdrom"),
            ("net0", "e1000,bridge=vmbr0,tag=20,firewall=1"),
            ("onboot", "1"),
            ("start", "1"),
        ],
    )
    .await;
    // PCI passthrough on the other node, and a key ProxOps does not model (a gap).
    api.post_as_root(
        "pve2",
        "/nodes/pve2/qemu",
        &[
            ("vmid", "102"),
            ("name", "gpu-vm"),
            ("memory", "8192"),
            ("cores", "8"),
            ("cpu", "host"),
            ("machine", "q35"),
            ("scsi0", "local-lvm:16"),
            ("hostpci0", "0000:01:00.0,pcie=1"),
            ("net0", "virtio,bridge=vmbr0"),
            ("balloon", "2048"),
        ],
    )
    .await;
    // A template VM.
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/qemu",
        &[
            ("vmid", "103"),
            ("name", "golden-vm"),
            ("memory", "1024"),
            ("cores", "1"),
            ("cpu", "host"),
            ("scsi0", "local-lvm:4"),
            ("net0", "virtio,bridge=vmbr0"),
        ],
    )
    .await;
    api.post_and_wait("pve1", "/nodes/pve1/qemu/103/template", &[])
        .await;
    // A container with a mount point, and a template container.
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/lxc",
        &[
            ("vmid", "200"),
            ("hostname", "data-ct"),
            ("ostemplate", "local:vztmpl/debian-12.tar.zst"),
            ("memory", "1024"),
            ("swap", "512"),
            ("cores", "2"),
            ("rootfs", "local-lvm:4"),
            ("mp0", "local-lvm:2,mp=/srv/data,backup=1"),
            ("net0", "name=eth0,bridge=vmbr0,ip=dhcp,type=veth"),
            ("unprivileged", "1"),
            ("features", "nesting=1"),
            ("password", CT_PASSWORD),
            ("tags", "DB"),
        ],
    )
    .await;
    api.post_and_wait(
        "pve2",
        "/nodes/pve2/lxc",
        &[
            ("vmid", "201"),
            ("hostname", "golden-ct"),
            ("ostemplate", "local:vztmpl/debian-12.tar.zst"),
            ("memory", "512"),
            ("cores", "1"),
            ("rootfs", "local-lvm:2"),
            ("net0", "name=eth0,bridge=vmbr0,ip=dhcp"),
        ],
    )
    .await;
    // PVE answers the lxc template call with null and converts in a worker (BEHAVIOUR.md §6).
    api.post_and_wait("pve2", "/nodes/pve2/lxc/201/template", &[])
        .await;
    for _ in 0..200 {
        let config = api
            .call(reqwest::Method::GET, "/nodes/pve2/lxc/201/config", &[])
            .await;
        if config["template"].to_string().trim_matches('"') == "1" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("CT 201 did not become a template");
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Points the world's agent.toml at every node and names the cluster.
fn every_node(world: &World) {
    world.write_agent_toml(&world.agent_toml().node("*").cluster("lab"));
}

/// What the operator writes after reading adopt's report: `toml` with the simulator's
/// `[scope]`, the `adopt = "…"` line the report gives (a manifest alone adopts nothing) and
/// `more` scope lines.
fn allow_adoption(world: &World, toml: AgentToml, report: &str, more: &str) {
    let line = report
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("adopt = \""))
        .unwrap_or_else(|| panic!("no [scope] adopt line in the report:\n{report}"));
    // The simulator's file server, and the placeholder URLs adopt writes (PVE does not
    // record where a file came from; these tests never download them again).
    let hosts = "artifact_hosts = [\"127.0.0.1\", \"placeholder.invalid\"]\nallow_http_without_checksum = true";
    world.write_agent_toml(&toml.scope(hosts).scope(line).scope(more));
}

/// `proxops validate <repo> --config <agent.toml>`: against the operator's `[scope]`.
fn validate_in_scope(world: &World) -> std::process::Output {
    let repo = world.repo().display().to_string();
    let config = world.dir.path().join("agent.toml").display().to_string();
    proxops(&["validate", &repo, "--config", &config])
}

/// Runs `proxops adopt --config <agent.toml> --out <repo>`.
async fn adopt(world: &World) -> std::process::Output {
    adopt_with(world, &[]).await
}

/// [`adopt`] with more arguments first (e.g. `-vvv`).
async fn adopt_with(world: &World, args: &[&str]) -> std::process::Output {
    let config = world.dir.path().join("agent.toml");
    let out = world.repo();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_proxops"))
            .args(args)
            .arg("adopt")
            .arg("--config")
            .arg(config)
            .arg("--out")
            .arg(out)
            .env_remove("RUST_LOG")
            .env_remove("PROXOPS_CONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// Every file under `dir`, relative path → contents.
fn tree(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = walkdir::WalkDir::new(dir)
        .into_iter()
        .map(Result::unwrap)
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
            (rel, std::fs::read_to_string(e.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

fn assert_ok(output: &std::process::Output) {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(output),
        stderr(output)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adopted_cluster_validates_plans_only_the_ownership_tag_and_converges() {
    let world = World::start(&[
        ("netinst.iso", ISO),
        ("cloud.qcow2", IMAGE),
        ("debian-12.tar.zst", TARBALL),
    ])
    .await;
    let api = Api::new(&world);
    populate(&world, &api).await;
    every_node(&world);

    world.sim.control().clear_requests();
    // With trace logging: no log line may carry a secret either.
    let first = adopt_with(&world, &["-vvv"]).await;
    assert_ok(&first);
    assert!(!stderr(&first).is_empty(), "trace logging is on");
    assert!(
        world.writes().is_empty(),
        "adopt wrote: {:?}",
        world.writes()
    );
    let report = stdout(&first);
    let files = tree(&world.repo());

    // Nothing secret in the report, the log or any file.
    for secret in [SSH_KEY_BLOB, CI_PASSWORD, CT_PASSWORD] {
        assert!(!report.contains(secret) && !stderr(&first).contains(secret));
        for (path, text) in &files {
            assert!(!text.contains(secret), "{path} holds a secret");
        }
    }
    assert!(report.contains("cipassword = <redacted>"), "{report}");
    assert!(report.contains("0 writes"), "{report}");

    // Every kind, in the composition layout, artifacts on two nodes as one manifest.
    let paths: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "ctt/lab/debian-12.yaml",
            "diskimage/lab/cloud.yaml",
            "iso/lab/netinst.yaml",
            "lxc/lab/data-ct.yaml",
            "templatect/lab/golden-ct.yaml",
            "templatevm/lab/golden-vm.yaml",
            "vm/lab/cloud-init-vm.yaml",
            "vm/lab/gpu-vm.yaml",
            "vm/lab/uefi-vm.yaml",
        ],
        "{report}"
    );
    let file = |p: &str| files.iter().find(|(path, _)| path == p).unwrap().1.clone();
    let iso = file("iso/lab/netinst.yaml");
    assert!(iso.contains("nodes: [pve1, pve2]"), "{iso}");
    assert!(
        iso.contains("url: \"https://placeholder.invalid/local/netinst.iso\""),
        "{iso}"
    );
    assert!(
        report.contains("https://placeholder.invalid/local/cloud.qcow2"),
        "{report}"
    );
    let ci_vm = file("vm/lab/cloud-init-vm.yaml");
    assert!(ci_vm.contains("proxops/adopt: \"true\""), "{ci_vm}");
    assert!(ci_vm.contains("ssh-keys: [\"*\"]"), "{ci_vm}");
    assert!(ci_vm.contains("tags: [prod, web]"), "{ci_vm}");
    assert!(!ci_vm.contains("cipassword:"), "{ci_vm}");
    let gpu = file("vm/lab/gpu-vm.yaml");
    assert!(gpu.contains("device: \"0000:01:00.0\""), "{gpu}");
    assert!(report.contains("VM/gpu-vm  balloon = 2048"), "{report}");
    assert!(
        report.contains("(PVE does not keep `ostemplate`); CTTemplates on pve1: debian-12"),
        "{report}"
    );
    let ct = file("lxc/lab/data-ct.yaml");
    assert!(ct.contains("INCOMPLETE"), "{ct}");
    assert!(ct.contains("mount-point: /srv/data"), "{ct}");
    assert!(
        report.contains("INCOMPLETE:\n  lxc/lab/data-ct.yaml: fill in\n    - spec.template"),
        "{report}"
    );

    // A second run writes the same bytes and prints the same report.
    let second = adopt(&world).await;
    assert_ok(&second);
    assert_eq!(stdout(&second), report);
    assert_eq!(tree(&world.repo()), files);
    assert!(
        world.writes().is_empty(),
        "adopt wrote: {:?}",
        world.writes()
    );

    // The operator lists the complete manifests, as printed.
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("  - ../../"))
        .collect();
    assert_eq!(lines.len(), 7, "{report}");
    let mut composition = format!("resources:\n{}\n", lines.join("\n"));
    world.write("clusters/lab/resources.yaml", Some(&composition));
    let repo = world.repo().display().to_string();
    // A manifest alone adopts nothing: without `[scope] adopt` the revision is invalid.
    let refused = proxops(&["validate", &repo]);
    assert_eq!(refused.status.code(), Some(1), "{}", stdout(&refused));
    assert!(
        stderr(&refused).contains("is outside the operator's scope: [scope] adopt = \"none\""),
        "{}",
        stderr(&refused)
    );
    // The operator adds the line the report gives (and lets the GPU VM pass its device).
    allow_adoption(
        &world,
        world.agent_toml().node("*").cluster("lab"),
        &report,
        "extra_keys = [\"hostpci*\"]",
    );
    assert_ok(&validate_in_scope(&world));

    // ... then fills in the containers' templates and lists them too.
    for path in ["lxc/lab/data-ct.yaml", "templatect/lab/golden-ct.yaml"] {
        let text = file(path).replacen("  memory:", "  template: debian-12\n  memory:", 1);
        world.write(path, Some(&text));
        composition.push_str(&format!("  - ../../{path}\n"));
    }
    world.write("clusters/lab/resources.yaml", Some(&composition));
    assert_ok(&validate_in_scope(&world));

    // The first plan only claims each guest with the ownership tag: no other key, no delete,
    // no resize, no finding, no download.
    let plan = world.proxops(&["plan", "--node", "*", "--json"]).await;
    assert_eq!(plan.status.code(), Some(2), "{}", stderr(&plan));
    let plan: Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert_eq!(plan["plan"]["findings"], serde_json::json!([]), "{plan:#}");
    assert_eq!(plan["plan"]["blocked"], serde_json::json!([]), "{plan:#}");
    let mut claimed = Vec::new();
    for action in plan["plan"]["levels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l.as_array().unwrap())
    {
        let verb = &action["verb"];
        assert_eq!(verb["verb"], "update", "{action:#}");
        let set = verb["set"].as_object().unwrap();
        assert_eq!(set.keys().collect::<Vec<_>>(), ["tags"], "{action:#}");
        assert!(
            set["tags"]
                .as_str()
                .unwrap()
                .split(';')
                .any(|t| t == "proxops")
        );
        assert_eq!(verb["delete"], serde_json::json!([]), "{action:#}");
        assert_eq!(verb["grow"], serde_json::json!([]), "{action:#}");
        claimed.push(verb["vmid"].as_u64().unwrap());
    }
    claimed.sort_unstable();
    assert_eq!(claimed, [100, 101, 102, 103, 200, 201]);

    let apply = world.proxops(&["apply", "--yes", "--node", "*"]).await;
    assert_ok(&apply);
    let again = world.proxops(&["plan", "--node", "*"]).await;
    assert_ok(&again);
    assert!(stdout(&again).contains("no changes"), "{}", stdout(&again));

    // Adopting again finds everything declared: nothing is written, no file changes (the
    // operator's filled-in templates stay).
    let before = tree(&world.repo());
    let third = adopt(&world).await;
    assert_ok(&third);
    let report = stdout(&third);
    assert!(report.contains(": 0 manifests written"), "{report}");
    assert!(
        report.contains("lxc 200 on pve1: already declared as LXC/data-ct (lxc/lab/data-ct.yaml)"),
        "{report}"
    );
    assert_eq!(tree(&world.repo()), before);
    crate::sim::assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn adopt_reads_only_the_agents_node_and_needs_a_cluster_name() {
    let world = World::start(&[("netinst.iso", ISO)]).await;
    let api = Api::new(&world);
    for node in ["pve1", "pve2"] {
        api.download(&world, node, "iso", "netinst.iso").await;
    }
    for (node, vmid, name) in [("pve1", "110", "here"), ("pve2", "111", "there")] {
        api.post_and_wait(
            node,
            &format!("/nodes/{node}/qemu"),
            &[
                ("vmid", vmid),
                ("name", name),
                ("memory", "512"),
                ("cores", "1"),
                ("cpu", "host"),
                ("scsi0", "local-lvm:1"),
            ],
        )
        .await;
    }

    // agent.toml says `node = "pve1"` and names no cluster.
    let missing = adopt(&world).await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("give --cluster"),
        "{}",
        stderr(&missing)
    );

    world.sim.control().clear_requests();
    let config = world.dir.path().join("agent.toml");
    let out = world.repo();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_proxops"))
            .args(["adopt", "--cluster", "lab", "--json", "--config"])
            .arg(config)
            .arg("--out")
            .arg(out)
            .env_remove("RUST_LOG")
            .env_remove("PROXOPS_CONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_ok(&output);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["nodes"], serde_json::json!(["pve1"]));
    assert_eq!(report["writes"], 0);
    let paths: Vec<String> = tree(&world.repo()).into_iter().map(|(p, _)| p).collect();
    assert_eq!(paths, ["iso/lab/netinst.yaml", "vm/lab/here.yaml"]);
    assert!(
        world
            .requests()
            .iter()
            .all(|r| r.method == "GET" && !r.path.contains("/nodes/pve2/")),
        "{:?}",
        world.requests()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn adopt_fails_when_its_client_has_counted_a_write() {
    let world = World::start(&[]).await;
    let toml = world.dir.path().join("agent.toml");
    let config = proxops::config::AgentConfig::load(&toml).unwrap();
    let pve = proxops_pve::PveClient::new(config.pve.client_config()).unwrap();
    let scope = proxops::config::NodeScope::Node("pve1".to_owned());
    let no_keys = proxops::adopt::SshKeyRefs::default();
    let empty = proxops::adopt::Existing::default();
    assert!(
        proxops::adopt::adopt(&pve, &scope, "lab", &no_keys, &empty)
            .await
            .is_ok()
    );

    // A write through the same client (clones share the counter) makes adopt refuse.
    let create = proxops_pve::request::qemu_create(
        "pve1",
        120,
        &proxops_pve::request::Params::new().set("memory", "512"),
    );
    pve.execute(&create).await.unwrap();
    let error = proxops::adopt::adopt(&pve, &scope, "lab", &no_keys, &empty)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("sent 1 write request"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ssh_keys_all_found_in_the_clusters_sops_document_are_adopted_as_references() {
    // The public keys of tests/fixtures/sops/proxops/plain/proxops.yaml, which the encrypted
    // fixture repository's document holds under cloud-init.ssh-keys.admin and .deploy.
    let admin = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHdvAdminKeyForTestsOnly admin@example";
    let deploy = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDeployKeyForTestsOnly deploy@example";
    let other = format!("ssh-ed25519 {SSH_KEY_BLOB} other@example");
    let world = World::start(&[]).await;
    let api = Api::new(&world);
    for (vmid, name, keys) in [
        ("130", "keyed", format!("{deploy}\n{admin}")),
        ("131", "mixed", format!("{admin}\n{other}")),
    ] {
        api.post_and_wait(
            "pve1",
            "/nodes/pve1/qemu",
            &[
                ("vmid", vmid),
                ("name", name),
                ("memory", "512"),
                ("cores", "1"),
                ("cpu", "host"),
                ("scsi0", "local-lvm:1"),
                ("sshkeys", &percent_encode(&keys)),
            ],
        )
        .await;
    }
    let document = crate::support::fixture("sops-repo/clusters/lab/secrets.sops.yaml");
    world.write(
        "clusters/lab/secrets.sops.yaml",
        Some(&std::fs::read_to_string(document).unwrap()),
    );
    let identity = crate::support::fixture("sops/getsops-sops/keys.txt");
    world.write_agent_toml(&world.agent_toml().cluster("lab").age_key_file(&identity));

    let output = adopt(&world).await;
    assert_ok(&output);
    let report = stdout(&output);
    assert!(
        report.contains("note: SSH keys matched against"),
        "{report}"
    );
    let keyed = std::fs::read_to_string(world.repo().join("vm/lab/keyed.yaml")).unwrap();
    assert!(
        keyed.contains("ssh-key-refs: [cloud-init.ssh-keys.deploy, cloud-init.ssh-keys.admin]"),
        "{keyed}"
    );
    let mixed = std::fs::read_to_string(world.repo().join("vm/lab/mixed.yaml")).unwrap();
    assert!(mixed.contains("ssh-keys: [\"*\"]"), "{mixed}");
    assert!(
        report.contains("VM/mixed  sshkeys = <redacted>: 1 of 2 keys"),
        "{report}"
    );
    for text in [&report, &keyed, &mixed, &stderr(&output)] {
        assert!(!text.contains("KeyForTestsOnly") && !text.contains(SSH_KEY_BLOB));
    }

    // `validate` checks the references against the document's key names.
    world.write(
        "clusters/lab/resources.yaml",
        Some("resources:\n  - ../../vm/lab/keyed.yaml\n  - ../../vm/lab/mixed.yaml\n"),
    );
    allow_adoption(
        &world,
        world.agent_toml().cluster("lab").age_key_file(&identity),
        &report,
        "",
    );
    assert_ok(&validate_in_scope(&world));
    // The keys resolved from the document are the ones PVE has: only the tags change.
    let plan = world.proxops(&["plan", "--json"]).await;
    assert_eq!(plan.status.code(), Some(2), "{}", stderr(&plan));
    let plan: Value = serde_json::from_slice(&plan.stdout).unwrap();
    for action in plan["plan"]["levels"][0].as_array().unwrap() {
        let set = action["verb"]["set"].as_object().unwrap();
        assert_eq!(set.keys().collect::<Vec<_>>(), ["tags"], "{action:#}");
    }
    assert_eq!(plan["plan"]["findings"], serde_json::json!([]), "{plan:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listing_pve_cannot_answer_fails_adopt_and_writes_nothing() {
    let world = World::start(&[("netinst.iso", ISO)]).await;
    let api = Api::new(&world);
    api.download(&world, "pve1", "iso", "netinst.iso").await;
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/qemu",
        &[("vmid", "140"), ("name", "solo"), ("memory", "512")],
    )
    .await;
    let cluster_args = |world: &World| {
        let config = world.dir.path().join("agent.toml");
        let out = world.repo();
        move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_proxops"))
                .args(["adopt", "--cluster", "lab", "--config"])
                .arg(config)
                .arg("--out")
                .arg(out)
                .env_remove("RUST_LOG")
                .env_remove("PROXOPS_CONFIG")
                .output()
                .unwrap()
        }
    };

    // Half a cluster would look like a whole one: a listing that keeps failing fails adopt.
    world
        .sim
        .control()
        .fail_storage_listing("pve1", "local", 100, None);
    let failed = tokio::task::spawn_blocking(cluster_args(&world))
        .await
        .unwrap();
    assert_eq!(failed.status.code(), Some(1));
    let error = stderr(&failed);
    assert!(
        error.contains("reading GET /nodes/pve1/storage/local/content?content=iso"),
        "{error}"
    );
    assert!(tree(&world.repo()).is_empty());

    // One transient error on a config read is retried like any GET.
    world.sim.control().clear_faults();
    world
        .sim
        .control()
        .fail_requests(proxops_pve_sim::HttpFault {
            pattern: "/qemu/140/config$".to_owned(),
            method: Some("GET".to_owned()),
            status: 500,
            message: Some("got timeout".to_owned()),
            times: Some(1),
            probability: None,
        })
        .unwrap();
    let output = tokio::task::spawn_blocking(cluster_args(&world))
        .await
        .unwrap();
    assert_ok(&output);
    assert!(world.repo().join("vm/lab/solo.yaml").is_file());
}

#[tokio::test(flavor = "multi_thread")]
async fn adopting_every_node_names_an_offline_node_as_skipped() {
    let mut config = proxops_pve_sim::SimConfig {
        task_duration: Duration::from_millis(20),
        ..proxops_pve_sim::SimConfig::default()
    };
    config.seed.nodes[2].online = false;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = proxops_pve_sim::start(config, listener).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("repo")).unwrap();
    std::fs::write(dir.path().join("token"), "proxops-dev-secret\n").unwrap();
    AgentToml::new(&sim)
        .node("*")
        .cluster("lab")
        .write(&dir.path().join("agent.toml"));
    let world = World {
        sim,
        files_url: String::new(),
        dir,
    };
    let api = Api::new(&world);
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/qemu",
        &[("vmid", "150"), ("name", "up"), ("memory", "512")],
    )
    .await;

    let output = adopt_with(&world, &[]).await;
    assert_ok(&output);
    let report = stdout(&output);
    assert!(
        report.starts_with("adopt: cluster lab, nodes pve1, pve2: "),
        "{report}"
    );
    assert!(
        report.contains("node pve3: status `offline`: its guests and files were not read"),
        "{report}"
    );
    assert!(world.repo().join("vm/lab/up.yaml").is_file());
}

/// The actions of a `proxops plan --json` output.
fn plan_actions(plan: &Value) -> Vec<Value> {
    plan["plan"]["levels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l.as_array().unwrap().iter().cloned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn after_adopting_guests_pve_created_with_its_defaults_the_first_plan_only_adds_the_tag() {
    let world = World::start(&[]).await;
    let api = Api::new(&world);
    // `qm create` with PVE's defaults: no memory, cpu or cores key in the config.
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/qemu",
        &[("vmid", "110"), ("name", "plain"), ("scsi0", "local-lvm:4")],
    )
    .await;
    // A Windows guest: ostype drives PVE's defaults and must survive a rebuild.
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/qemu",
        &[
            ("vmid", "111"),
            ("name", "win"),
            ("ostype", "win11"),
            ("memory", "4096"),
            ("scsi0", "local-lvm:8"),
        ],
    )
    .await;
    // A template made from a defaults-only VM.
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/qemu",
        &[("vmid", "112"), ("name", "base"), ("scsi0", "local-lvm:4")],
    )
    .await;
    api.post_and_wait("pve1", "/nodes/pve1/qemu/112/template", &[])
        .await;
    let raw = api.config("pve1", "qemu", 110).await;
    for key in ["memory", "cpu", "cores"] {
        assert!(!raw.contains_key(key), "{key} in {raw:?}");
    }
    every_node(&world);

    let adopted = adopt(&world).await;
    assert_ok(&adopted);
    let report = stdout(&adopted);
    let files = tree(&world.repo());
    let file = |p: &str| files.iter().find(|(path, _)| path == p).unwrap().1.clone();
    let plain = file("vm/lab/plain.yaml");
    assert!(
        plain.contains("# Not set on PVE, written as PVE's default: memory, cpu, cores."),
        "{plain}"
    );
    assert!(!plain.contains("Left as PVE has it"), "{plain}");
    assert!(!report.contains("VM/plain  memory"), "{report}");
    let win = file("vm/lab/win.yaml");
    assert!(win.contains("ostype: win11"), "{win}");

    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("  - ../../"))
        .collect();
    assert_eq!(lines.len(), 3, "{report}");
    world.write(
        "clusters/lab/resources.yaml",
        Some(&format!("resources:\n{}\n", lines.join("\n"))),
    );
    allow_adoption(
        &world,
        world.agent_toml().node("*").cluster("lab"),
        &report,
        "",
    );
    let plan = world.proxops(&["plan", "--node", "*", "--json"]).await;
    assert_eq!(plan.status.code(), Some(2), "{}", stderr(&plan));
    let plan: Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert_eq!(plan["plan"]["findings"], serde_json::json!([]), "{plan:#}");
    let mut claimed = Vec::new();
    for action in plan_actions(&plan) {
        let verb = &action["verb"];
        assert_eq!(verb["verb"], "update", "{action:#}");
        let set = verb["set"].as_object().unwrap();
        assert_eq!(set.keys().collect::<Vec<_>>(), ["tags"], "{action:#}");
        assert_eq!(verb["delete"], serde_json::json!([]), "{action:#}");
        claimed.push(verb["vmid"].as_u64().unwrap());
    }
    claimed.sort_unstable();
    assert_eq!(claimed, [110, 111, 112]);

    assert_ok(&world.proxops(&["apply", "--yes", "--node", "*"]).await);
    let again = world.proxops(&["plan", "--node", "*"]).await;
    assert_ok(&again);
    assert!(stdout(&again).contains("no changes"), "{}", stdout(&again));
    let raw = api.config("pve1", "qemu", 110).await;
    assert!(
        !raw.contains_key("memory"),
        "nothing but the tag was written: {raw:?}"
    );
    crate::sim::assert_all_requests_valid(&world);
}
