//! Issue 15 (fidelity), the scenario half: ProxOps against a simulator that imitates PVE 9's
//! sources where they matter to a pass: the power state read from a source that does not
//! lag (`status/current`), the LXC template worker that outlives its `null` answer, a vmid
//! the token cannot see (SOURCE-AUDIT.md M25).

use std::time::Duration;

use proxops_pve_sim::{AclSeed, Seed, SimConfig, TokenSeed, UserSeed};
use serde_json::Value;

use crate::pve_api::Api;
use crate::sim::{World, artifact, assert_all_requests_valid};
use crate::support::{stderr, stdout};

const TARBALL: &[u8] = b"a container template tarball";
const CT_TEMPLATE: &str = "debian-12-standard_12.12-1_amd64.tar.zst";

fn assert_ok(output: &std::process::Output) {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(output),
        stderr(output)
    );
}

fn text(config: &serde_json::Map<String, Value>, key: &str) -> String {
    match config.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// A world whose pvestatd runs only when the test ticks it (`refresh_stats`), so
/// `/cluster/resources` keeps the power state of the last tick.
async fn lagging_world(files: &[(&str, &[u8])]) -> World {
    World::start_config(
        files,
        SimConfig {
            task_duration: Duration::from_millis(50),
            stats_interval: Duration::from_secs(3600),
            ..SimConfig::default()
        },
    )
    .await
}

fn vm(vmid: u32, state: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1
kind: VM
metadata: {{name: web}}
spec:
  node: pve1
  vmid: {vmid}
  state: {state}
  memory: 1GiB
  cpu: {{type: host, cores: 1}}
  disks:
    - {{storage: local-lvm, size: 1GiB}}
  networks:
    - {{bridge: vmbr0}}
"
    )
}

fn power_writes(world: &World, verb: &str) -> usize {
    world
        .writes()
        .iter()
        .filter(|r| r.path.ends_with(&format!("/status/{verb}")))
        .count()
}

/// The `/cluster/resources` status of `vmid`.
async fn listed_status(api: &Api, vmid: u32) -> String {
    let data = api.get("/cluster/resources?type=vm").await;
    data.as_array()
        .unwrap()
        .iter()
        .find(|g| g["vmid"].as_u64() == Some(u64::from(vmid)))
        .map(|g| g["status"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_start_followed_at_once_by_a_second_pass_plans_no_second_start_despite_the_stats_lag() {
    let world = lagging_world(&[]).await;
    let api = Api::new(&world);
    world.write("vm/web.yaml", Some(&vm(150, "stopped")));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    world.sim.control().refresh_stats();
    assert_eq!(listed_status(&api, 150).await, "stopped");

    world.write("vm/web.yaml", Some(&vm(150, "started")));
    let first = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&first);
    assert_eq!(power_writes(&world, "start"), 1, "{}", stdout(&first));
    // pvestatd has not run since: the listing still says stopped.
    assert_eq!(listed_status(&api, 150).await, "stopped");

    let second = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&second);
    assert_eq!(
        power_writes(&world, "start"),
        1,
        "a second start was sent: {}",
        stdout(&second)
    );
    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    assert!(stdout(&plan).contains("no changes"), "{}", stdout(&plan));
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shutdown_followed_at_once_by_a_second_pass_plans_no_second_shutdown() {
    let world = lagging_world(&[]).await;
    let api = Api::new(&world);
    world.write("vm/web.yaml", Some(&vm(151, "started")));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    world.sim.control().refresh_stats();
    assert_eq!(listed_status(&api, 151).await, "running");

    world.write("vm/web.yaml", Some(&vm(151, "stopped")));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    assert_eq!(power_writes(&world, "shutdown"), 1);
    assert_eq!(listed_status(&api, 151).await, "running");

    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    assert!(stdout(&plan).contains("no changes"), "{}", stdout(&plan));
    // Only the guest whose listed state disagreed was read from status/current.
    let reads: Vec<String> = world
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/status/current"))
        .map(|r| r.path)
        .collect();
    assert!(
        reads
            .iter()
            .all(|p| p == "/nodes/pve1/qemu/151/status/current"),
        "{reads:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_ct_promote_waits_for_the_vztemplate_worker_so_no_pass_sends_it_twice() {
    // The worker runs long after PVE's `null` answer.
    let world = World::start_config(
        &[("ct.tar.zst", TARBALL)],
        SimConfig {
            task_duration: Duration::from_millis(50),
            task_durations: [("vztemplate".to_owned(), Duration::from_secs(2))].into(),
            stats_interval: Duration::from_secs(3600),
            ..SimConfig::default()
        },
    )
    .await;
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
",
        ),
    );
    let first = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&first);
    assert!(
        stdout(&first).contains("promote TemplateCT/base-ct on pve1: ok"),
        "{}",
        stdout(&first)
    );
    // The apply ended after the worker: the CT is a template already.
    assert_eq!(
        text(&api.config("pve1", "lxc", 8000).await, "template"),
        "1"
    );
    let second = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&second);
    let promotes = world
        .writes()
        .iter()
        .filter(|r| r.path.ends_with("/template"))
        .count();
    assert_eq!(promotes, 1, "{}", stdout(&second));
    assert_all_requests_valid(&world);
}

/// A seed whose token `proxops@pve!agent` (no privilege separation) holds PVEAdmin on `/`
/// but nothing on `/vms/160`, where root has a VM.
fn hidden_guest_seed() -> Seed {
    let mut seed = Seed::default();
    seed.users.push(UserSeed {
        userid: "proxops@pve".into(),
        password: None,
        tokens: vec![TokenSeed {
            id: "agent".into(),
            secret: "proxops-dev-secret".into(),
            privsep: false,
        }],
    });
    let acl = |path: &str, roleid: &str| AclSeed {
        path: path.into(),
        roleid: roleid.into(),
        kind: "user".into(),
        ugid: "proxops@pve".into(),
        propagate: true,
    };
    seed.acl = vec![acl("/", "PVEAdmin"), acl("/vms/160", "NoAccess")];
    seed.guests.push(proxops_pve_sim::GuestSeed {
        vmid: 160,
        kind: "qemu".into(),
        node: "pve2".into(),
        config: [("name".to_owned(), "someone-elses".to_owned())].into(),
        running: false,
    });
    seed
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_for_a_vmid_the_token_cannot_see_is_a_finding_and_never_sent() {
    let world = World::start_config(
        &[],
        SimConfig {
            seed: hidden_guest_seed(),
            task_duration: Duration::from_millis(50),
            ..SimConfig::default()
        },
    )
    .await;
    world.write_agent_toml(&world.agent_toml().token_id("proxops@pve!agent"));
    world.write("vm/web.yaml", Some(&vm(160, "stopped")));

    for _pass in 0..2 {
        let apply = world.proxops(&["apply", "--yes"]).await;
        let out = stdout(&apply);
        assert!(
            out.contains("vmid 160 exists in the cluster but is not visible to this token"),
            "{out}\n{}",
            stderr(&apply)
        );
        assert!(out.contains("VM.Audit on /vms/160"), "{out}");
    }
    let creates = world
        .writes()
        .iter()
        .filter(|r| r.endpoint == "/nodes/{node}/qemu")
        .count();
    assert_eq!(creates, 0, "no create is sent for a vmid PVE would refuse");
    assert_all_requests_valid(&world);
}

/// The built-in `realistic-3node` seed (a 3-node PVE 9 cluster with a shared NFS `nas`),
/// its task durations at a quarter of its demo pace (downloads still outlast creates and
/// clones, starts are short), and pvestatd's default 10 s lag.
async fn realistic_world(files: &[(&str, &[u8])]) -> World {
    let seed = Seed::builtin(proxops_pve_sim::REALISTIC_3NODE)
        .unwrap()
        .with_task_time_scale(0.25);
    World::start_config(
        files,
        SimConfig {
            seed,
            task_duration: Duration::from_millis(50),
            ..SimConfig::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_realistic_3_node_cluster_an_iso_on_the_shared_nas_is_downloaded_once_for_all_nodes() {
    let world = realistic_world(&[("netinst.iso", b"an installer image")]).await;
    world.write_agent_toml(&world.agent_toml().node("*"));
    let url = format!("{}/netinst.iso", world.files_url);
    world.write(
        "iso/netinst.yaml",
        Some(
            &artifact(
                "ISO",
                "netinst",
                &["pve1", "pve2", "pve3"],
                "netinst.iso",
                &url,
                None,
            )
            .replace("storage: local", "storage: nas"),
        ),
    );
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    let downloads = world
        .writes()
        .into_iter()
        .filter(|r| r.endpoint.ends_with("/download-url"))
        .count();
    assert_eq!(downloads, 1, "{}", stdout(&apply));
    for node in ["pve1", "pve2", "pve3"] {
        assert_eq!(
            world.listing(node, "nas", "iso").await,
            ["nas:iso/netinst.iso"]
        );
    }
    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    assert!(stdout(&plan).contains("no changes"), "{}", stdout(&plan));
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_realistic_3_node_cluster_a_container_from_the_nas_and_a_vm_converge_in_one_pass() {
    let world = realistic_world(&[("ct.tar.zst", TARBALL)]).await;
    world.write_agent_toml(&world.agent_toml().node("*"));
    let api = Api::new(&world);
    world.write(
        "ctt/debian-12.yaml",
        Some(
            &artifact(
                "CTTemplate",
                "debian-12",
                &["pve2"],
                CT_TEMPLATE,
                &format!("{}/ct.tar.zst", world.files_url),
                None,
            )
            .replace("storage: local", "storage: nas"),
        ),
    );
    world.write(
        "lxc/cache.yaml",
        Some(
            "apiVersion: proxops/v1alpha1
kind: LXC
metadata: {name: cache}
spec:
  node: pve2
  vmid: 210
  template: debian-12
  state: started
  memory: 1GiB
  cpu: {cores: 2}
  root: {storage: local-lvm, size: 8GiB}
  networks:
    - {bridge: vmbr0, ip: 192.0.2.54/24, gw: 192.0.2.1}
",
        ),
    );
    world.write(
        "vm/web.yaml",
        Some(&vm(310, "started").replace("node: pve1", "node: pve3")),
    );
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    for path in ["/nodes/pve2/lxc/210", "/nodes/pve3/qemu/310"] {
        let status = api.get(&format!("{path}/status/current")).await;
        assert_eq!(status["status"], "running", "{path}: {status}");
    }
    // Right after the pass pvestatd has not published the new guests yet (`unknown`):
    // the plan reads their power state from status/current and finds nothing to do.
    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    assert!(stdout(&plan).contains("no changes"), "{}", stdout(&plan));
    let starts = world
        .writes()
        .iter()
        .filter(|r| r.path.ends_with("/status/start"))
        .count();
    assert_eq!(starts, 2);
    assert_all_requests_valid(&world);
}
