//! What a running guest takes at once (issue 15, SOURCE-AUDIT.md M20): pve-container applies
//! `cores` at once and hot-plugs `memory`, `swap`, `cpulimit`, `cpuunits` and NICs
//! (`src/PVE/LXC/Config.pm` `$LXC_FASTPLUG_OPTIONS`, `vmconfig_hotplug_pending`), so such a
//! change is neither a `needs-reboot` finding nor, with `restart_on_change`, a reboot.

use crate::sim::{World, artifact, assert_all_requests_valid};
use crate::support::{stderr, stdout};

const TARBALL: &[u8] = b"a container template tarball";

fn assert_ok(output: &std::process::Output) {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(output),
        stderr(output)
    );
}

fn ct(memory: &str, cores: u32) -> String {
    format!(
        "apiVersion: proxops/v1alpha1
kind: LXC
metadata:
  name: web-ct
  annotations: {{proxops/restart: on-change}}
spec:
  node: pve1
  vmid: 210
  state: started
  template: debian-13
  memory: {memory}
  cpu: {{cores: {cores}}}
  root: {{storage: local-lvm, size: 4GiB}}
  networks:
    - {{bridge: vmbr0, ip: dhcp}}
  options: {{unprivileged: true}}
"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_running_containers_memory_and_cores_change_live_without_needs_reboot_or_a_reboot() {
    let world = World::start(&[("ct.tar.zst", TARBALL)]).await;
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
    world.write("lxc/web-ct.yaml", Some(&ct("512MiB", 1)));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    // pvestatd publishes the start (PVE: within 10 s).
    world.sim.control().refresh_stats();

    world.write("lxc/web-ct.yaml", Some(&ct("1GiB", 2)));
    world.sim.control().clear_requests();
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&apply);
    let out = stdout(&apply);
    assert!(out.contains("update LXC/web-ct on pve1: ok"), "{out}");
    assert!(!out.contains("needs-reboot"), "{out}");
    assert!(!out.contains("reboot LXC/web-ct"), "{out}");
    let writes: Vec<String> = world.writes().iter().map(|r| r.path.clone()).collect();
    assert!(
        writes.iter().all(|p| !p.contains("/status/")),
        "no power change: {writes:?}"
    );
    let plan = world.proxops(&["plan"]).await;
    assert_ok(&plan);
    assert!(stdout(&plan).contains("no changes"), "{}", stdout(&plan));
    assert_all_requests_valid(&world);
}
