//! lxc guests: create, config rules, power state checks, template, clone.

use crate::{Sim, sim, sim_with_slow};

const TEMPLATE: &str = "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst";

async fn with_template() -> Sim {
    place_template(sim().await).await
}

async fn place_template(s: Sim) -> Sim {
    crate::download::place_file(
        &s,
        "local",
        "vztmpl",
        "debian-13-standard_13.1-2_amd64.tar.zst",
        vec![1u8; 2048],
    )
    .await;
    s
}

async fn create_ct(s: &Sim, vmid: &str, extra: &[(&str, &str)]) {
    let mut form = vec![
        ("vmid", vmid),
        ("ostemplate", TEMPLATE),
        ("rootfs", "local-lvm:8"),
        ("net0", "name=eth0,bridge=vmbr0,ip=dhcp"),
        ("unprivileged", "1"),
    ];
    form.extend_from_slice(extra);
    let upid = s.post("/nodes/pve1/lxc", &form).await.upid();
    assert!(upid.contains(":vzcreate:"), "{upid}");
    s.wait_ok(&upid).await;
    s.wait_idle("pve1").await;
}

async fn ct_config(s: &Sim, vmid: &str) -> serde_json::Value {
    s.get(&format!("/nodes/pve1/lxc/{vmid}/config"))
        .await
        .data()
        .clone()
}

#[tokio::test]
async fn lxc_create_fills_defaults_and_a_hwaddr() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    let cfg = ct_config(&s, "200").await;
    assert_eq!(cfg["hostname"], "CT200");
    assert_eq!(cfg["memory"], 512);
    assert_eq!(cfg["swap"], 512);
    assert_eq!(cfg["ostype"], "debian");
    assert_eq!(cfg["rootfs"], "local-lvm:vm-200-disk-0,size=8G");
    let net0 = cfg["net0"].as_str().unwrap();
    assert!(
        net0.starts_with("name=eth0,bridge=vmbr0,hwaddr=BC:24:11:"),
        "{net0}"
    );
    assert!(net0.ends_with(",ip=dhcp,type=veth"), "{net0}");
    assert!(cfg.get("ostemplate").is_none());
}

#[tokio::test]
async fn lxc_create_locks_the_container_until_the_task_ends() {
    let s = place_template(sim_with_slow("vzcreate").await).await;
    let upid = s
        .post(
            "/nodes/pve1/lxc",
            &[
                ("vmid", "200"),
                ("ostemplate", TEMPLATE),
                ("rootfs", "local-lvm:4"),
            ],
        )
        .await
        .upid();
    let r = s
        .put("/nodes/pve1/lxc/200/config", &[("memory", "1024")])
        .await;
    assert_eq!(r.message(), "CT 200 is locked (create)\n");
    s.wait_ok(&upid).await;
}

#[tokio::test]
async fn lxc_nesting_is_only_accepted_as_a_feature() {
    let s = with_template().await;
    let r = s
        .post(
            "/nodes/pve1/lxc",
            &[("vmid", "200"), ("ostemplate", TEMPLATE), ("nesting", "1")],
        )
        .await;
    assert_eq!(r.status, 400);
    create_ct(&s, "201", &[("features", "nesting=1")]).await;
    assert_eq!(ct_config(&s, "201").await["features"], "nesting=1");
}

#[tokio::test]
async fn lxc_net_values_need_a_name() {
    let s = with_template().await;
    let r = s
        .post(
            "/nodes/pve1/lxc",
            &[
                ("vmid", "200"),
                ("ostemplate", TEMPLATE),
                ("net0", "bridge=vmbr0"),
            ],
        )
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.error("net0").contains("name"), "{r:?}");
}

#[tokio::test]
async fn lxc_unprivileged_is_create_only() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    let r = s
        .put("/nodes/pve1/lxc/200/config", &[("unprivileged", "0")])
        .await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.message(),
        "unable to modify read-only option: 'unprivileged'\n"
    );
}

#[tokio::test]
async fn lxc_bind_mounts_are_refused_to_api_tokens() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    let r = s
        .put(
            "/nodes/pve1/lxc/200/config",
            &[("mp0", "/srv/data,mp=/data")],
        )
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.message(),
        "Permission check failed (mount point type bind is only allowed for root@pam)\n"
    );
}

#[tokio::test]
async fn lxc_features_other_than_nesting_are_root_only() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    let r = s
        .put("/nodes/pve1/lxc/200/config", &[("features", "keyctl=1")])
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.message(),
        "Permission check failed (changing feature flags (except nesting) is only allowed \
         for root@pam)\n"
    );
}

#[tokio::test]
async fn lxc_digest_mismatch_has_its_own_message() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    let r = s
        .put(
            "/nodes/pve1/lxc/200/config",
            &[
                ("memory", "1024"),
                ("digest", "0000000000000000000000000000000000000000"),
            ],
        )
        .await;
    assert_eq!(
        r.message(),
        "detected modified configuration - file changed by other user? Try again.\n"
    );
}

#[tokio::test]
async fn lxc_power_state_errors_are_synchronous() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    let r = s.post("/nodes/pve1/lxc/200/status/stop", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.message(), "CT 200 not running\n");
    let upid = s.post("/nodes/pve1/lxc/200/status/start", &[]).await.upid();
    assert!(upid.contains(":vzstart:200:"));
    s.wait_ok(&upid).await;
    let r = s.post("/nodes/pve1/lxc/200/status/start", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.message(), "CT 200 already running\n");
    let r = s.delete("/nodes/pve1/lxc/200", &[]).await;
    assert_eq!(
        r.message(),
        "unable to destroy CT 200 - container is running\n"
    );
}

#[tokio::test]
async fn lxc_template_answers_null_and_renames_the_rootfs() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    let r = s.post("/nodes/pve1/lxc/200/template", &[]).await;
    assert_eq!(r.body, serde_json::json!({"data": null}));
    let tasks = s.get_q("/nodes/pve1/tasks", &[("source", "all")]).await;
    let upid = tasks.data()[0]["upid"].as_str().unwrap().to_string();
    assert!(upid.contains(":vztemplate:200:"));
    s.wait_ok(&upid).await;
    let cfg = ct_config(&s, "200").await;
    assert_eq!(cfg["template"], 1);
    assert_eq!(cfg["rootfs"], "local-lvm:base-200-disk-0,size=8G");
}

#[tokio::test]
async fn lxc_clone_copies_the_container_with_a_new_hwaddr() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    let upid = s
        .post(
            "/nodes/pve1/lxc/200/clone",
            &[("newid", "201"), ("hostname", "copy")],
        )
        .await
        .upid();
    assert!(upid.contains(":vzclone:200:"));
    s.wait_ok(&upid).await;
    let src = ct_config(&s, "200").await;
    let cfg = ct_config(&s, "201").await;
    assert_eq!(cfg["hostname"], "copy");
    assert_eq!(cfg["rootfs"], "local-lvm:vm-201-disk-0,size=8G");
    assert_ne!(cfg["net0"], src["net0"]);
}

/// The pending list's entry of `key`.
async fn pending_entry(s: &Sim, vmid: &str, key: &str) -> serde_json::Value {
    let pending = s.get(&format!("/nodes/pve1/lxc/{vmid}/pending")).await;
    pending
        .data()
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == key)
        .cloned()
        .unwrap_or_default()
}

/// pve-container `src/PVE/LXC/Config.pm` `vmconfig_hotplug_pending`: `$LXC_FASTPLUG_OPTIONS`
/// (hostname, cores, ...) at once; memory, swap, cpulimit, cpuunits, NICs and a new mount
/// point hot-plugged; anything else (features, an existing mount point) pending.
#[tokio::test]
async fn a_running_container_takes_hostname_cores_memory_nics_and_new_mount_points_at_once() {
    let s = with_template().await;
    create_ct(&s, "200", &[("start", "1")]).await;
    let r = s
        .put(
            "/nodes/pve1/lxc/200/config",
            &[
                ("hostname", "renamed"),
                ("cores", "2"),
                ("memory", "1024"),
                ("swap", "256"),
                ("cpulimit", "1.5"),
                ("net1", "name=eth1,bridge=vmbr0"),
                ("mp0", "local-lvm:1,mp=/srv"),
            ],
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    for key in [
        "hostname", "cores", "memory", "swap", "cpulimit", "net1", "mp0",
    ] {
        let entry = pending_entry(&s, "200", key).await;
        assert!(entry.get("value").is_some(), "{key}: {entry}");
        assert!(entry.get("pending").is_none(), "{key}: {entry}");
    }
    let r = s
        .put(
            "/nodes/pve1/lxc/200/config",
            &[
                ("features", "nesting=1"),
                ("mp0", "local-lvm:vm-200-disk-1,mp=/data"),
            ],
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        pending_entry(&s, "200", "features").await["pending"],
        "nesting=1"
    );
    let mp0 = pending_entry(&s, "200", "mp0").await;
    assert!(mp0["value"].as_str().unwrap().contains("mp=/srv"), "{mp0}");
    assert!(
        mp0["pending"].as_str().unwrap().contains("mp=/data"),
        "{mp0}"
    );
}

#[tokio::test]
async fn lxc_resize_grows_the_rootfs() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    let upid = s
        .put(
            "/nodes/pve1/lxc/200/resize",
            &[("disk", "rootfs"), ("size", "+1G")],
        )
        .await
        .upid();
    s.wait_ok(&upid).await;
    assert_eq!(
        ct_config(&s, "200").await["rootfs"],
        "local-lvm:vm-200-disk-0,size=9G"
    );
}

#[tokio::test]
async fn lxc_mount_points_share_the_disk_counter() {
    let s = with_template().await;
    create_ct(&s, "200", &[("mp0", "local-lvm:2,mp=/data")]).await;
    assert_eq!(
        ct_config(&s, "200").await["mp0"],
        "local-lvm:vm-200-disk-1,mp=/data,size=2G"
    );
}

#[tokio::test]
async fn lxc_delete_of_a_protected_container_is_refused() {
    let s = with_template().await;
    create_ct(&s, "200", &[("protection", "1")]).await;
    let r = s.delete("/nodes/pve1/lxc/200", &[]).await;
    assert_eq!(
        r.message(),
        "can't remove CT 200 - protection mode enabled\n"
    );
}

#[tokio::test]
async fn lxc_lock_timeouts_name_the_container_lock_file() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    s.sim.control().time_out_lock(200, 1);
    let r = s
        .put("/nodes/pve1/lxc/200/config", &[("memory", "1024")])
        .await;
    assert_eq!(
        r.message(),
        "can't lock file '/run/lock/lxc/pve-config-200.lock' - got timeout\n"
    );
}

#[tokio::test]
async fn lxc_descriptions_come_back_with_a_trailing_newline() {
    let s = with_template().await;
    create_ct(&s, "200", &[("description", "web server")]).await;
    assert_eq!(ct_config(&s, "200").await["description"], "web server\n");
}

#[tokio::test]
async fn an_lxc_created_without_unprivileged_is_unprivileged_as_on_pve_9() {
    use crate::permission::{TEMPLATE, all_but, token_sim};
    // A token without Sys.Modify on `/` creates a container without `unprivileged`.
    let s = token_sim(&all_but(&[]), &[], Default::default()).await;
    let r = s
        .post(
            "/nodes/pve1/lxc",
            &[
                ("vmid", "200"),
                ("ostemplate", TEMPLATE),
                ("rootfs", "local-lvm:8"),
                ("features", "nesting=1"),
            ],
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    s.wait_ok(&r.upid()).await;
    let cfg = s.get("/nodes/pve1/lxc/200/config").await;
    assert_eq!(cfg.data()["unprivileged"], 1, "{cfg:?}");
    assert_eq!(cfg.data()["features"], "nesting=1");
    // Only an explicitly privileged container needs Sys.Modify on `/`, checked first.
    let r = s
        .post(
            "/nodes/pve1/lxc",
            &[
                ("vmid", "200"),
                ("ostemplate", TEMPLATE),
                ("unprivileged", "0"),
            ],
        )
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(r.message(), "Permission check failed (/, Sys.Modify)\n");
}

#[tokio::test]
async fn a_locked_container_with_a_stale_digest_answers_locked_not_modified() {
    let mut seed = proxops_pve_sim::Seed::default();
    seed.guests.push(proxops_pve_sim::GuestSeed {
        vmid: 300,
        kind: "lxc".into(),
        node: "pve1".into(),
        config: [
            ("hostname", "ct300"),
            ("lock", "backup"),
            ("unprivileged", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
        running: false,
    });
    let s = crate::sim_with(proxops_pve_sim::SimConfig {
        seed,
        tls: false,
        task_duration: crate::TASK,
        ..Default::default()
    })
    .await;
    let r = s
        .put(
            "/nodes/pve1/lxc/300/config",
            &[
                ("memory", "1024"),
                ("digest", "0000000000000000000000000000000000000000"),
            ],
        )
        .await;
    assert_eq!(r.status, 500);
    // pve-container's `update_vm`: check_lock, then assert_if_modified.
    assert_eq!(r.message(), "CT 300 is locked (backup)\n");
}

#[tokio::test]
async fn lxc_resize_refuses_shrinking_and_an_unchanged_size_before_forking() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    for (size, text) in [
        ("8G", "disk is already at specified size\n"),
        ("4G", "unable to shrink disk size\n"),
    ] {
        let r = s
            .put(
                "/nodes/pve1/lxc/200/resize",
                &[("disk", "rootfs"), ("size", size)],
            )
            .await;
        assert_eq!(r.status, 500, "{size}: {r:?}");
        assert_eq!(r.message(), text);
    }
    assert!(
        s.get("/nodes/pve1/tasks")
            .await
            .data()
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["type"] != "resize"),
        "no resize task was started"
    );
}

#[tokio::test]
async fn lxc_duplicate_vmid_is_refused_without_the_create_prefix() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    let r = s
        .post(
            "/nodes/pve2/lxc",
            &[("vmid", "200"), ("ostemplate", TEMPLATE)],
        )
        .await;
    assert_eq!(r.status, 500);
    assert_eq!(r.message(), "CT 200 already exists on node 'pve1'\n");
}

#[tokio::test]
async fn starting_a_ct_template_fails_in_the_task_and_rebooting_a_stopped_ct_says_vm() {
    let s = with_template().await;
    create_ct(&s, "200", &[]).await;
    let r = s.post("/nodes/pve1/lxc/200/status/reboot", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.message(), "VM 200 not running\n");
    let r = s.post("/nodes/pve1/lxc/200/template", &[]).await;
    assert_eq!(r.status, 200, "{r:?}");
    s.wait_idle("pve1").await;
    let upid = s.post("/nodes/pve1/lxc/200/status/start", &[]).await.upid();
    let status = s.wait(&upid).await;
    assert_eq!(
        status["exitstatus"],
        "you can't start a CT if it's a template"
    );
}
