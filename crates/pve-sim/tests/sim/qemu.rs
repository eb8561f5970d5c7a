//! qemu guests: create, config, pending, digest, lifecycle, template, clone, resize, agent.

use crate::{Sim, sim, sim_with_slow};

#[tokio::test]
async fn create_locks_the_guest_until_the_task_ends() {
    let s = sim_with_slow("qmcreate").await;
    let upid = s
        .post(
            "/nodes/pve1/qemu",
            &[("vmid", "100"), ("scsi0", "local-lvm:8")],
        )
        .await
        .upid();
    let cfg = s.config("100").await;
    assert_eq!(cfg["lock"], "create");
    assert!(cfg["digest"].is_string());
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("memory", "2048")])
        .await;
    assert_eq!(r.status, 500);
    assert_eq!(r.message(), "VM 100 is locked (create)\n");
    let r = s.post("/nodes/pve1/qemu/100/status/start", &[]).await;
    assert_eq!(r.message(), "VM 100 is locked (create)\n");
    let r = s.delete("/nodes/pve1/qemu/100", &[]).await;
    assert_eq!(r.message(), "VM 100 is locked (create)\n");
    let resources = s.get_q("/cluster/resources", &[("type", "vm")]).await;
    assert_eq!(resources.data()[0]["lock"], "create");
    s.wait_ok(&upid).await;
    let cfg = s.config("100").await;
    assert!(cfg.get("lock").is_none());
    assert_eq!(cfg["scsi0"], "local-lvm:vm-100-disk-0,size=8G");
}

#[tokio::test]
async fn a_duplicate_vmid_is_refused_naming_the_existing_guest() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s.post("/nodes/pve2/qemu", &[("vmid", "100")]).await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.message(),
        "unable to create VM 100 - VM 100 already exists on node 'pve1'\n"
    );
    let r = s
        .post(
            "/nodes/pve1/lxc",
            &[("vmid", "100"), ("ostemplate", "local:vztmpl/x.tar.zst")],
        )
        .await;
    // pve-container's early `check_vmid_unused` has no `unable to create CT` prefix.
    assert_eq!(r.message(), "VM 100 already exists on node 'pve1'\n");
}

#[tokio::test]
async fn create_fills_in_a_random_mac_smbios_vmgenid_and_boot_order() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let cfg = s.config("100").await;
    let net0 = cfg["net0"].as_str().unwrap();
    let re =
        regex::Regex::new(r"^virtio=BC:24:11:[0-9A-F]{2}:[0-9A-F]{2}:[0-9A-F]{2},bridge=vmbr0$")
            .unwrap();
    assert!(re.is_match(net0), "{net0}");
    assert!(cfg["smbios1"].as_str().unwrap().starts_with("uuid="));
    assert_eq!(cfg["vmgenid"].as_str().unwrap().len(), 36);
    assert_eq!(cfg["boot"], "order=scsi0;net0");
    assert!(cfg["meta"].as_str().unwrap().starts_with("creation-qemu="));
}

#[tokio::test]
async fn digest_is_the_sha1_of_the_config_and_a_stale_one_is_refused() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let digest = s.config("100").await["digest"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(digest.len(), 40);
    let ok = s
        .put(
            "/nodes/pve1/qemu/100/config",
            &[("cores", "2"), ("digest", &digest)],
        )
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    let new_digest = s.config("100").await["digest"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(digest, new_digest);
    let stale = s
        .put(
            "/nodes/pve1/qemu/100/config",
            &[("cores", "4"), ("digest", &digest)],
        )
        .await;
    assert_eq!(stale.status, 500);
    assert_eq!(
        stale.message(),
        "checksum mismatch (file change by other user?)\n"
    );
}

#[tokio::test]
async fn put_config_is_synchronous_and_post_config_returns_a_qmconfig_task() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let put = s
        .put("/nodes/pve1/qemu/100/config", &[("cores", "2")])
        .await;
    assert_eq!(put.body, serde_json::json!({"data": null}));
    assert_eq!(s.config("100").await["cores"], 2);
    let upid = s
        .post("/nodes/pve1/qemu/100/config", &[("cores", "4")])
        .await
        .upid();
    assert!(upid.contains(":qmconfig:100:"));
    s.wait_ok(&upid).await;
    assert_eq!(s.config("100").await["cores"], 4);
}

#[tokio::test]
async fn post_config_with_background_delay_returns_null_when_done_in_time() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s
        .post(
            "/nodes/pve1/qemu/100/config",
            &[("cores", "2"), ("background_delay", "5")],
        )
        .await;
    assert_eq!(r.body, serde_json::json!({"data": null}));
}

#[tokio::test]
async fn an_empty_config_write_is_refused() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s.put("/nodes/pve1/qemu/100/config", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.message(), "no options specified\n");
}

#[tokio::test]
async fn setting_and_deleting_one_key_in_the_same_request_is_a_400() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s
        .put(
            "/nodes/pve1/qemu/100/config",
            &[("ciuser", "admin"), ("delete", "ciuser")],
        )
        .await;
    assert_eq!(r.status, 400);
    // qemu-server's wording, one quote short (LIVE-FACTS quotes it with both).
    assert_eq!(
        r.error("delete"),
        "you can't use '-ciuser' and -delete ciuser' at the same time"
    );
}

#[tokio::test]
async fn deleting_an_unset_key_is_accepted() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("delete", "ciuser")])
        .await;
    assert_eq!(r.status, 200, "{r:?}");
}

/// The keys PVE holds pending for VM `vmid`.
async fn pending_keys(s: &Sim, vmid: &str) -> Vec<String> {
    let pending = s.get(&format!("/nodes/pve1/qemu/{vmid}/pending")).await;
    pending
        .data()
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e.get("pending").is_some() || e.get("delete").is_some())
        .map(|e| e["key"].as_str().unwrap().to_owned())
        .collect()
}

/// qemu-server `vmconfig_hotplug_pending` with `parse_hotplug_features`: `cores` is never
/// hot-plugged, memory only with the `memory` feature and NUMA, `vcpus` with `cpu`, a new
/// sata disk never, a new scsi disk with `disk`; cpuunits at once.
#[tokio::test]
async fn a_running_vm_hot_plugs_memory_and_vcpus_only_with_their_hotplug_features_and_numa() {
    let s = sim().await;
    s.create_vm("100", &[("start", "1"), ("cores", "2")]).await;
    let r = s
        .put(
            "/nodes/pve1/qemu/100/config",
            &[
                ("cores", "4"),
                ("memory", "2048"),
                ("vcpus", "1"),
                ("cpuunits", "200"),
                ("scsi1", "local-lvm:1"),
                ("sata1", "local-lvm:1"),
            ],
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        pending_keys(&s, "100").await,
        ["cores", "memory", "sata1", "vcpus"]
    );

    s.create_vm(
        "101",
        &[
            ("start", "1"),
            ("cores", "2"),
            ("numa", "1"),
            ("hotplug", "network,disk,cpu,memory"),
        ],
    )
    .await;
    let r = s
        .put(
            "/nodes/pve1/qemu/101/config",
            &[("cores", "4"), ("memory", "2048"), ("vcpus", "1")],
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(pending_keys(&s, "101").await, ["cores"]);
}

#[tokio::test]
async fn running_guests_hotplug_nics_and_keep_memory_pending_until_restart() {
    let s = sim().await;
    s.create_vm("100", &[("start", "1")]).await;
    let r = s
        .put(
            "/nodes/pve1/qemu/100/config",
            &[
                ("memory", "4096"),
                ("net1", "virtio,bridge=vmbr1"),
                ("name", "db"),
            ],
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let pending = s.get("/nodes/pve1/qemu/100/pending").await;
    let mem = pending
        .data()
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == "memory")
        .unwrap()
        .clone();
    assert_eq!(mem["value"], "1024");
    assert_eq!(mem["pending"], "4096");
    let current = s
        .get_q("/nodes/pve1/qemu/100/config", &[("current", "1")])
        .await;
    assert_eq!(current.data()["memory"], "1024");
    assert!(current.data()["net1"].is_string());
    assert_eq!(current.data()["name"], "db");
    assert_eq!(s.config("100").await["memory"], "4096");
    let upid = s
        .post("/nodes/pve1/qemu/100/status/reboot", &[])
        .await
        .upid();
    s.wait_ok(&upid).await;
    let current = s
        .get_q("/nodes/pve1/qemu/100/config", &[("current", "1")])
        .await;
    assert_eq!(current.data()["memory"], "4096");
}

#[tokio::test]
async fn tags_are_normalised() {
    let s = sim().await;
    s.create_vm("100", &[("tags", "Web;db,web")]).await;
    assert_eq!(s.config("100").await["tags"], "db;web");
}

#[tokio::test]
async fn sshkeys_come_back_url_encoded_and_cipassword_masked() {
    let s = sim().await;
    let keys = "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIGk0o5x4Hh9mqvN8v8b6r8w2Xn2h2f2q1s0t9u8v7w6x%20me%40host";
    s.create_vm("100", &[("sshkeys", keys), ("cipassword", "secret")])
        .await;
    let cfg = s.config("100").await;
    assert_eq!(cfg["sshkeys"], keys);
    assert_eq!(cfg["cipassword"], "**********");
}

#[tokio::test]
async fn import_from_needs_the_zero_size_syntax() {
    let s = sim().await;
    let r = s
        .post(
            "/nodes/pve1/qemu",
            &[
                ("vmid", "100"),
                ("scsi0", "local-lvm:8,import-from=local:import/a.qcow2"),
            ],
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error("scsi0"),
        "'import-from' requires special syntax - use <storage ID>:0,import-from=<source>"
    );
}

#[tokio::test]
async fn import_from_refuses_sources_that_are_not_images_or_import() {
    let s = sim().await;
    let r = s
        .post(
            "/nodes/pve1/qemu",
            &[
                ("vmid", "100"),
                ("scsi0", "local-lvm:0,import-from=local:iso/a.iso"),
            ],
        )
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(
        r.error("scsi0"),
        "local:iso/a.iso has wrong type 'iso' - needs to be 'images' or 'import'"
    );
}

#[tokio::test]
async fn import_from_copies_an_import_volume_and_is_never_stored() {
    let s = sim().await;
    crate::download::place_file(&s, "local", "import", "debian.qcow2", vec![7u8; 4096]).await;
    s.create_vm(
        "100",
        &[("scsi0", "local-lvm:0,import-from=local:import/debian.qcow2")],
    )
    .await;
    let cfg = s.config("100").await;
    assert_eq!(cfg["scsi0"], "local-lvm:vm-100-disk-0,size=1G");
    assert!(!cfg.to_string().contains("import-from"));
}

#[tokio::test]
async fn a_create_form_disk_over_an_existing_volume_replaces_it() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("scsi0", "local-lvm:16")])
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let cfg = s.config("100").await;
    assert_eq!(cfg["scsi0"], "local-lvm:vm-100-disk-1,size=16G");
    // The old volume is detached as unused0: its data is gone from the guest's view.
    assert_eq!(cfg["unused0"], "local-lvm:vm-100-disk-0");
}

#[tokio::test]
async fn a_cloudinit_create_form_over_an_existing_cloudinit_volume_fails() {
    let s = sim().await;
    s.create_vm("100", &[("ide2", "local-lvm:cloudinit")]).await;
    assert_eq!(
        s.config("100").await["ide2"],
        "local-lvm:vm-100-cloudinit,media=cdrom"
    );
    let upid = s
        .post(
            "/nodes/pve1/qemu/100/config",
            &[("ide2", "local-lvm:cloudinit")],
        )
        .await
        .upid();
    let status = s.wait(&upid).await;
    assert!(
        status["exitstatus"]
            .as_str()
            .unwrap()
            .contains("already exists"),
        "{status}"
    );
}

#[tokio::test]
async fn starting_a_running_vm_fails_in_the_task() {
    let s = sim().await;
    s.create_vm("100", &[("start", "1")]).await;
    let upid = s
        .post("/nodes/pve1/qemu/100/status/start", &[])
        .await
        .upid();
    let status = s.wait(&upid).await;
    assert_eq!(status["exitstatus"], "VM 100 already running");
}

#[tokio::test]
async fn stopping_a_stopped_vm_is_ok() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let upid = s.post("/nodes/pve1/qemu/100/status/stop", &[]).await.upid();
    s.wait_ok(&upid).await;
}

#[tokio::test]
async fn start_and_shutdown_change_the_status() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let upid = s
        .post("/nodes/pve1/qemu/100/status/start", &[])
        .await
        .upid();
    assert!(upid.contains(":qmstart:100:"));
    s.wait_ok(&upid).await;
    let cur = s.get("/nodes/pve1/qemu/100/status/current").await;
    assert_eq!(cur.data()["status"], "running");
    assert_eq!(cur.data()["qmpstatus"], "running");
    let upid = s
        .post("/nodes/pve1/qemu/100/status/shutdown", &[])
        .await
        .upid();
    s.wait_ok(&upid).await;
    let cur = s.get("/nodes/pve1/qemu/100/status/current").await;
    assert_eq!(cur.data()["status"], "stopped");
}

#[tokio::test]
async fn delete_is_refused_while_running_or_protected() {
    let s = sim().await;
    s.create_vm("100", &[("start", "1")]).await;
    let r = s.delete("/nodes/pve1/qemu/100", &[]).await;
    assert_eq!(r.message(), "VM 100 is running - destroy failed\n");
    s.create_vm("101", &[("protection", "1")]).await;
    let r = s.delete("/nodes/pve1/qemu/101", &[]).await;
    assert_eq!(
        r.message(),
        "can't remove VM 101 - protection mode enabled\n"
    );
}

#[tokio::test]
async fn delete_removes_the_guest_and_its_volumes() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let upid = s.delete("/nodes/pve1/qemu/100", &[]).await.upid();
    assert!(upid.contains(":qmdestroy:100:"));
    s.wait_ok(&upid).await;
    let r = s.get("/nodes/pve1/qemu/100/config").await;
    assert_eq!(r.status, 500);
    let content = s.get("/nodes/pve1/storage/local-lvm/content").await;
    assert_eq!(content.data().as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn a_missing_guest_answers_500_never_404() {
    let s = sim().await;
    let r = s.get("/nodes/pve1/qemu/404/status/current").await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.message(),
        "Configuration file 'nodes/pve1/qemu-server/404.conf' does not exist\n"
    );
}

#[tokio::test]
async fn template_conversion_renames_disks_to_base_and_keeps_the_cloudinit_name() {
    let s = sim().await;
    s.create_vm("100", &[("ide2", "local-lvm:cloudinit")]).await;
    let upid = s.post("/nodes/pve1/qemu/100/template", &[]).await.upid();
    assert!(upid.contains(":qmtemplate:100:"));
    s.wait_ok(&upid).await;
    let cfg = s.config("100").await;
    assert_eq!(cfg["template"], 1);
    assert_eq!(cfg["scsi0"], "local-lvm:base-100-disk-0,size=8G");
    assert_eq!(cfg["ide2"], "local-lvm:vm-100-cloudinit,media=cdrom");
    let again = s.post("/nodes/pve1/qemu/100/template", &[]).await;
    assert_eq!(
        again.message(),
        "you can't convert a template to a template\n"
    );
    let upid = s
        .post("/nodes/pve1/qemu/100/status/start", &[])
        .await
        .upid();
    let status = s.wait(&upid).await;
    assert_eq!(
        status["exitstatus"],
        "you can't start a vm if it's a template"
    );
}

#[tokio::test]
async fn a_full_clone_copies_the_config_except_name_and_template_with_new_identity() {
    let s = sim().await;
    s.create_vm("100", &[("ciuser", "admin"), ("tags", "proxops")])
        .await;
    let upid = s.post("/nodes/pve1/qemu/100/template", &[]).await.upid();
    s.wait_ok(&upid).await;
    let src = s.config("100").await;
    let upid = s
        .post(
            "/nodes/pve1/qemu/100/clone",
            &[("newid", "101"), ("full", "1"), ("name", "clone")],
        )
        .await
        .upid();
    assert!(upid.contains(":qmclone:100:"), "{upid}");
    let during = s.config("101").await;
    assert_eq!(during["lock"], "clone");
    s.wait_ok(&upid).await;
    let cfg = s.config("101").await;
    assert_eq!(cfg["name"], "clone");
    assert!(cfg.get("template").is_none());
    assert_eq!(cfg["ciuser"], "admin");
    assert_eq!(cfg["tags"], "proxops");
    assert_eq!(cfg["scsi0"], "local-lvm:vm-101-disk-0,size=8G");
    assert_ne!(cfg["net0"], src["net0"]);
    assert_ne!(cfg["vmgenid"], src["vmgenid"]);
    assert_ne!(cfg["smbios1"], src["smbios1"]);
    let cur = s.get("/nodes/pve1/qemu/101/status/current").await;
    assert_eq!(cur.data()["status"], "stopped");
}

#[tokio::test]
async fn clone_rejects_missing_sources_and_taken_ids() {
    let s = sim().await;
    let r = s
        .post("/nodes/pve1/qemu/100/clone", &[("newid", "101")])
        .await;
    assert_eq!(
        r.message(),
        "unable to find configuration file for VM 100 on node 'pve1'\n"
    );
    s.create_vm("100", &[]).await;
    s.create_vm("101", &[]).await;
    let r = s
        .post("/nodes/pve1/qemu/100/clone", &[("newid", "101")])
        .await;
    assert_eq!(
        r.message(),
        "unable to create VM 101: config file already exists\n"
    );
}

#[tokio::test]
async fn the_clone_source_is_locked_while_cloning() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let _upid = s
        .post(
            "/nodes/pve1/qemu/100/clone",
            &[("newid", "101"), ("full", "1")],
        )
        .await
        .upid();
    // The test lock timeout (300 ms) is longer than the task (40 ms): the write waits.
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("cores", "2")])
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let reqs = s.sim.control().requests();
    assert!(reqs.counters["PUT /nodes/{node}/qemu/{vmid}/config"] >= 1);
}

#[tokio::test]
async fn resize_grows_and_refuses_to_shrink() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let upid = s
        .put(
            "/nodes/pve1/qemu/100/resize",
            &[("disk", "scsi0"), ("size", "+2G")],
        )
        .await
        .upid();
    assert!(upid.contains(":resize:100:"));
    s.wait_ok(&upid).await;
    assert_eq!(
        s.config("100").await["scsi0"],
        "local-lvm:vm-100-disk-0,size=10G"
    );
    let upid = s
        .put(
            "/nodes/pve1/qemu/100/resize",
            &[("disk", "scsi0"), ("size", "4G")],
        )
        .await
        .upid();
    let status = s.wait(&upid).await;
    assert_eq!(status["exitstatus"], "shrinking disks is not supported");
}

#[tokio::test]
async fn the_guest_agent_answers_when_configured_and_running() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s.post("/nodes/pve1/qemu/100/agent/ping", &[]).await;
    assert_eq!(r.message(), "No QEMU guest agent configured\n");
    s.create_vm("101", &[("agent", "1")]).await;
    let r = s.post("/nodes/pve1/qemu/101/agent/ping", &[]).await;
    assert_eq!(r.message(), "VM 101 is not running\n");
    let upid = s
        .post("/nodes/pve1/qemu/101/status/start", &[])
        .await
        .upid();
    s.wait_ok(&upid).await;
    let r = s.post("/nodes/pve1/qemu/101/agent/ping", &[]).await;
    assert_eq!(r.body, serde_json::json!({"data": {"result": {}}}));
    let r = s
        .get("/nodes/pve1/qemu/101/agent/network-get-interfaces")
        .await;
    let ifaces = r.data()["result"].as_array().unwrap();
    assert_eq!(ifaces[1]["ip-addresses"][0]["ip-address-type"], "ipv4");
}

#[tokio::test]
async fn a_guest_agent_that_does_not_answer_fails_the_ping_until_it_runs_again() {
    let s = sim().await;
    s.create_vm("101", &[("agent", "1")]).await;
    let upid = s
        .post("/nodes/pve1/qemu/101/status/start", &[])
        .await
        .upid();
    s.wait_ok(&upid).await;
    assert!(s.sim.control().set_guest_agent_running(101, false));
    assert!(!s.sim.control().set_guest_agent_running(999, false));
    let r = s.post("/nodes/pve1/qemu/101/agent/ping", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.message(), "QEMU guest agent is not running\n");
    assert!(s.sim.control().set_guest_agent_running(101, true));
    let r = s.post("/nodes/pve1/qemu/101/agent/ping", &[]).await;
    assert_eq!(r.body, serde_json::json!({"data": {"result": {}}}));
}

#[tokio::test]
async fn create_with_start_forks_a_separate_start_task() {
    let s = sim().await;
    let upid = s
        .post("/nodes/pve1/qemu", &[("vmid", "100"), ("start", "1")])
        .await
        .upid();
    s.wait_ok(&upid).await;
    let log = s
        .get(&format!("/nodes/pve1/tasks/{}/log", crate::encode(&upid)))
        .await;
    assert_eq!(log.data()[0]["t"], "Execute autostart");
    let tasks = s.get_q("/nodes/pve1/tasks", &[("source", "all")]).await;
    let start = tasks.data()[0]["upid"].as_str().unwrap().to_string();
    assert!(start.contains(":qmstart:100:"), "{start}");
    s.wait_ok(&start).await;
    let cur = s.get("/nodes/pve1/qemu/100/status/current").await;
    assert_eq!(cur.data()["status"], "running");
}

#[tokio::test]
async fn import_from_refuses_cloudinit_sources() {
    let s = sim().await;
    s.create_vm("100", &[("ide2", "local-lvm:cloudinit")]).await;
    let r = s
        .post(
            "/nodes/pve1/qemu",
            &[
                ("vmid", "101"),
                (
                    "scsi0",
                    "local-lvm:0,import-from=local-lvm:vm-100-cloudinit",
                ),
            ],
        )
        .await;
    assert_eq!(r.status, 400, "{r:?}");
}

#[tokio::test]
async fn revert_drops_pending_changes() {
    let s = sim().await;
    s.create_vm("100", &[("start", "1")]).await;
    s.put("/nodes/pve1/qemu/100/config", &[("memory", "4096")])
        .await;
    assert_eq!(s.config("100").await["memory"], "4096");
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("revert", "memory")])
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(s.config("100").await["memory"], "1024");
}

#[tokio::test]
async fn a_body_parameter_conflicting_with_the_path_is_a_400() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s
        .put(
            "/nodes/pve1/qemu/100/config",
            &[("vmid", "101"), ("cores", "2")],
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error("vmid"),
        "duplicate parameter (already defined in URI) with conflicting values!"
    );
}

#[tokio::test]
async fn a_linked_clone_of_a_template_builds_on_the_base_volume() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let upid = s.post("/nodes/pve1/qemu/100/template", &[]).await.upid();
    s.wait_ok(&upid).await;
    let upid = s
        .post("/nodes/pve1/qemu/100/clone", &[("newid", "101")])
        .await
        .upid();
    s.wait_ok(&upid).await;
    let cfg = s.config("101").await;
    assert_eq!(
        cfg["scsi0"],
        "local-lvm:base-100-disk-0/vm-101-disk-0,size=8G"
    );
    assert_eq!(cfg["name"], "Copy-of-VM-web");
}

#[tokio::test]
async fn a_linked_clone_of_a_plain_vm_is_refused() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s
        .post(
            "/nodes/pve1/qemu/100/clone",
            &[("newid", "101"), ("full", "0")],
        )
        .await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.message(),
        "Linked clone feature is not supported for drive 'scsi0'\n"
    );
}

#[tokio::test]
async fn deleting_a_disk_detaches_it_as_unused_and_deleting_unused_frees_it() {
    let s = sim().await;
    s.create_vm("100", &[("scsi1", "local-lvm:2")]).await;
    s.put("/nodes/pve1/qemu/100/config", &[("delete", "scsi1")])
        .await;
    let cfg = s.config("100").await;
    assert_eq!(cfg["unused0"], "local-lvm:vm-100-disk-1");
    s.put("/nodes/pve1/qemu/100/config", &[("delete", "unused0")])
        .await;
    let content = s.get("/nodes/pve1/storage/local-lvm/content").await;
    assert_eq!(content.data().as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn a_running_task_can_be_stopped() {
    let s = sim().await;
    let upid = s.post("/nodes/pve1/qemu", &[("vmid", "100")]).await.upid();
    let r = s
        .delete(&format!("/nodes/pve1/tasks/{}", crate::encode(&upid)), &[])
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let status = s.wait(&upid).await;
    assert_eq!(status["exitstatus"], "interrupted by signal");
}

#[tokio::test]
async fn creating_with_a_missing_iso_fails_in_the_task() {
    let s = sim().await;
    let upid = s
        .post(
            "/nodes/pve1/qemu",
            &[
                ("vmid", "100"),
                ("ide2", "local:iso/missing.iso,media=cdrom"),
            ],
        )
        .await
        .upid();
    let status = s.wait(&upid).await;
    assert_eq!(
        status["exitstatus"],
        "unable to create VM 100 - volume local:iso/missing.iso does not exist"
    );
}

#[tokio::test]
async fn an_attached_iso_is_reported_with_its_size() {
    let s = sim().await;
    crate::download::place_file(&s, "local", "iso", "boot.iso", vec![0; 4096]).await;
    s.create_vm("100", &[("ide2", "local:iso/boot.iso,media=cdrom")])
        .await;
    assert_eq!(
        s.config("100").await["ide2"],
        "local:iso/boot.iso,media=cdrom,size=4K"
    );
}

#[tokio::test]
async fn a_second_cloudinit_drive_is_refused() {
    let s = sim().await;
    s.create_vm("100", &[("ide2", "local-lvm:cloudinit")]).await;
    let r = s
        .put(
            "/nodes/pve1/qemu/100/config",
            &[("ide3", "local-lvm:cloudinit")],
        )
        .await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.message(),
        "ide3 - cloud-init drive is already attached at 'ide2'\n"
    );
}

#[tokio::test]
async fn a_cloudinit_drive_on_a_storage_without_images_fails_at_start() {
    let s = sim().await;
    s.create_vm("100", &[("ide2", "local:cloudinit")]).await;
    let upid = s
        .post("/nodes/pve1/qemu/100/status/start", &[])
        .await
        .upid();
    let status = s.wait(&upid).await;
    assert_eq!(
        status["exitstatus"],
        "storage 'local' does not support content-type 'images'"
    );
}

#[tokio::test]
async fn an_efi_disk_with_enrolled_keys_gets_4m_and_the_2023_certificates() {
    let s = sim().await;
    s.create_vm(
        "100",
        &[
            ("efidisk0", "local-lvm:1,efitype=4m,pre-enrolled-keys=1"),
            ("bios", "ovmf"),
        ],
    )
    .await;
    let cfg = s.config("100").await;
    assert_eq!(
        cfg["efidisk0"],
        "local-lvm:vm-100-disk-1,efitype=4m,ms-cert=2023,pre-enrolled-keys=1,size=4M"
    );
    assert_eq!(cfg["scsi0"], "local-lvm:vm-100-disk-0,size=8G");
}

#[tokio::test]
async fn deleting_an_unknown_option_is_a_400() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("delete", "nestedvirt")])
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.error("delete"), "unknown option 'nestedvirt'");
}

#[tokio::test]
async fn a_forced_delete_frees_the_disk_instead_of_keeping_it_unused() {
    let s = sim().await;
    s.create_vm("100", &[("scsi1", "local-lvm:2")]).await;
    s.put(
        "/nodes/pve1/qemu/100/config",
        &[("delete", "scsi1"), ("force", "1")],
    )
    .await;
    let cfg = s.config("100").await;
    assert!(cfg.get("unused0").is_none(), "{cfg}");
    let content = s.get("/nodes/pve1/storage/local-lvm/content").await;
    assert_eq!(content.data().as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn skiplock_is_for_root_only() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s
        .put(
            "/nodes/pve1/qemu/100/config",
            &[("cores", "2"), ("skiplock", "1")],
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error("skiplock"), "Only root may use this option.");
}

#[tokio::test]
async fn an_unmapped_host_pci_device_is_refused_to_api_tokens() {
    let s = sim().await;
    let r = s
        .post(
            "/nodes/pve1/qemu",
            &[("vmid", "100"), ("hostpci0", "0000:01:00.0,pcie=1")],
        )
        .await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.message(),
        "only root can set 'hostpci0' config for non-mapped devices\n"
    );
    s.create_vm("100", &[]).await;
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("hostpci1", "01:00.0")])
        .await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.message(),
        "only root can set 'hostpci1' config for non-mapped devices\n"
    );
}

#[tokio::test]
async fn import_from_a_missing_source_fails_in_the_qmcreate_task_not_synchronously() {
    let s = sim().await;
    let upid = s
        .post(
            "/nodes/pve1/qemu",
            &[
                ("vmid", "100"),
                (
                    "scsi0",
                    "local-lvm:0,import-from=local:import/missing.qcow2",
                ),
            ],
        )
        .await
        .upid();
    let status = s.wait(&upid).await;
    assert_eq!(
        status["exitstatus"],
        "unable to create VM 100 - cannot import from 'local:import/missing.qcow2' - could not get size of local:import/missing.qcow2"
    );
    let gone = s.get("/nodes/pve1/qemu/100/config").await;
    assert_eq!(gone.status, 500, "the config is removed: {gone:?}");
}

/// A simulator whose pveproxy gives up after 200 ms and whose disk imports take 600 ms.
async fn slow_imports() -> crate::Sim {
    crate::sim_with(proxops_pve_sim::SimConfig {
        tls: false,
        task_duration: crate::TASK,
        proxy_timeout: std::time::Duration::from_millis(200),
        disk_import_duration: std::time::Duration::from_millis(600),
        ..proxops_pve_sim::SimConfig::default()
    })
    .await
}

#[tokio::test]
async fn a_synchronous_config_write_that_outlasts_the_proxy_timeout_answers_596_and_still_imports()
{
    let s = slow_imports().await;
    crate::download::place_file(&s, "local", "import", "debian.qcow2", vec![7u8; 4096]).await;
    s.create_vm("100", &[]).await;
    let r = s
        .put(
            "/nodes/pve1/qemu/100/config",
            &[("scsi1", "local-lvm:0,import-from=local:import/debian.qcow2")],
        )
        .await;
    assert_eq!(r.status, 596, "{r:?}");
    assert!(r.text.is_empty(), "pveproxy passes no body: {r:?}");
    // Answered while the import still runs; pvedaemon's handler goes on and writes the disk
    // once the copy is done.
    assert!(
        s.config("100").await.get("scsi1").is_none(),
        "still importing"
    );
    let mut scsi1 = None;
    for _ in 0..200 {
        scsi1 = s.config("100").await.get("scsi1").cloned();
        if scsi1.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        scsi1.expect("the import ends"),
        "local-lvm:vm-100-disk-1,size=1G"
    );
}

#[tokio::test]
async fn a_config_post_that_imports_a_disk_answers_a_qmconfig_task_that_lasts_the_import() {
    let s = slow_imports().await;
    crate::download::place_file(&s, "local", "import", "debian.qcow2", vec![7u8; 4096]).await;
    s.create_vm("100", &[]).await;
    let upid = s
        .post(
            "/nodes/pve1/qemu/100/config",
            &[("scsi1", "local-lvm:0,import-from=local:import/debian.qcow2")],
        )
        .await
        .upid();
    assert!(upid.contains(":qmconfig:100:"), "{upid}");
    let started = std::time::Instant::now();
    s.wait_ok(&upid).await;
    assert!(started.elapsed() >= std::time::Duration::from_millis(400));
    assert_eq!(
        s.config("100").await["scsi1"],
        "local-lvm:vm-100-disk-1,size=1G"
    );
}

#[tokio::test]
async fn a_new_disk_on_a_storage_without_images_is_refused_400_on_the_storage_key() {
    let s = sim().await;
    let r = s
        .post("/nodes/pve1/qemu", &[("vmid", "100"), ("scsi0", "local:8")])
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(
        r.error("storage"),
        "storage 'local' does not support vm images"
    );
    // Nothing was created: the vmid is free.
    let r = s.get("/nodes/pve1/qemu/100/config").await;
    assert_eq!(r.status, 500);
}
