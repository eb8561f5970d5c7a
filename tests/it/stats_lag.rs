//! `/cluster/resources` lags behind the guests' configs (issue 15, SOURCE-AUDIT.md M4): PVE
//! reports a guest's `status`, `name` and `template` from pvestatd's last run, every 10 s
//! (pve-manager `PVE/API2Tools.pm` `extract_vm_stats`, `PVE/Service/pvestatd.pm`), while
//! the config read shows a promote at once. A pass right after a promote (a webhook burst,
//! a restart) must not promote again.

use std::time::Duration;

use proxops_pve_sim::SimConfig;
use serde_json::Value;

use crate::pve_api::Api;
use crate::sim::{World, artifact, assert_all_requests_valid};
use crate::support::{stderr, stdout};

const TARBALL: &[u8] = b"a container template tarball";

/// A world whose pvestatd does not run again during the test (its first run was at start),
/// so every guest created by the test stays `unknown` in `/cluster/resources` until the
/// test calls `refresh_stats`, a pvestatd tick.
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

fn assert_ok(output: &std::process::Output) {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(output),
        stderr(output)
    );
}

/// The `/cluster/resources` entry of guest `vmid`.
async fn resource(api: &Api, vmid: u32) -> Value {
    let data = api.get("/cluster/resources?type=vm").await;
    data.as_array()
        .unwrap()
        .iter()
        .find(|g| g["vmid"].as_u64() == Some(u64::from(vmid)))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Promote requests the simulator saw.
fn promotes(world: &World) -> usize {
    world
        .writes()
        .iter()
        .filter(|r| r.path.ends_with("/template"))
        .count()
}

/// Applies `repo` twice in a row and checks that the second pass promotes nothing although
/// `/cluster/resources` still does not call `vmid` a template; then, after pvestatd's tick,
/// that a plan is empty.
async fn second_pass_promotes_nothing(world: &World, vmid: u32, kind: &str) {
    let api = Api::new(world);
    let first = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&first);
    assert_eq!(promotes(world), 1, "{}", stdout(&first));
    // The config says template (the LXC worker writes it a moment after its null answer).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let marked = |config: &serde_json::Map<String, Value>| matches!(config.get("template"), Some(v) if v == 1 || v == "1");
    while !marked(&api.config("pve1", kind, vmid).await) {
        assert!(std::time::Instant::now() < deadline, "never marked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let listed = resource(&api, vmid).await;
    assert_eq!(listed["status"], "unknown", "{listed}");
    assert!(listed.get("template").is_none(), "{listed}");

    world.sim.control().clear_requests();
    let burst = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&burst);
    assert_eq!(promotes(world), 0, "{}", stdout(&burst));
    assert!(world.writes().is_empty(), "{:?}", world.writes());
    assert!(stdout(&burst).contains("no changes"), "{}", stdout(&burst));

    world.sim.control().refresh_stats();
    let listed = resource(&api, vmid).await;
    assert_eq!(listed["template"], 1, "{listed}");
    assert_eq!(listed["status"], "stopped", "{listed}");
    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    assert!(stdout(&plan).contains("no changes"), "{}", stdout(&plan));
    assert_all_requests_valid(world);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pass_right_after_a_template_vm_promote_plans_no_second_promote_despite_the_stats_lag() {
    let world = lagging_world(&[]).await;
    world.write(
        "templatevm/golden.yaml",
        Some(
            "apiVersion: proxops/v1alpha1
kind: TemplateVM
metadata: {name: golden}
spec:
  node: pve1
  vmid: 9000
  memory: 1GiB
  cpu: {type: host, cores: 1}
  disks:
    - {storage: local-lvm, size: 4GiB}
  networks:
    - {bridge: vmbr0}
",
        ),
    );
    second_pass_promotes_nothing(&world, 9000, "qemu").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pass_right_after_a_template_ct_promote_plans_no_second_promote_despite_the_stats_lag() {
    let world = lagging_world(&[("ct.tar.zst", TARBALL)]).await;
    world.write(
        "ctt/debian-13.yaml",
        Some(&artifact(
            "CTTemplate",
            "debian-13",
            &["pve1"],
            "debian-13-standard_13.1-2_amd64.tar.zst",
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
  template: debian-13
  memory: 512MiB
  cpu: {cores: 1}
  root: {storage: local-lvm, size: 4GiB}
  options: {unprivileged: true}
",
        ),
    );
    second_pass_promotes_nothing(&world, 8000, "lxc").await;
}
