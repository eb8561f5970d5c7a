//! Guest snapshots (issue 19, item 7): list with `current`, create under a `snapshot` lock,
//! PVE's refusal on a storage without the feature, delete, rollback, and `feature`.

use proxops_pve_sim::{Seed, SimConfig, StorageSeed};

use crate::{Sim, TASK, sim, sim_with};

/// The default seed plus `vmfiles`, a directory storage for disk images.
async fn sim_with_dir_images() -> Sim {
    let mut seed = Seed::default();
    seed.storages.push(StorageSeed {
        storage: "vmfiles".to_string(),
        kind: "dir".to_string(),
        content: vec!["images".to_string(), "rootdir".to_string()],
        nodes: None,
        shared: false,
        path: Some("/var/lib/vmfiles".to_string()),
        total: 64 * 1024 * 1024 * 1024,
        enabled: true,
    });
    sim_with(SimConfig {
        seed,
        tls: false,
        task_duration: TASK,
        ..SimConfig::default()
    })
    .await
}

fn names(list: &serde_json::Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_snapshot_locks_the_vm_while_it_runs_and_is_listed_before_current() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let list = s.get("/nodes/pve1/qemu/100/snapshot").await;
    assert_eq!(names(list.data()), vec!["current"]);
    assert_eq!(list.data()[0]["description"], "You are here!");
    let before = s.config("100").await["digest"].clone();

    let upid = s
        .post(
            "/nodes/pve1/qemu/100/snapshot",
            &[("snapname", "before-upgrade"), ("description", "why")],
        )
        .await
        .upid();
    assert!(upid.contains(":qmsnapshot:100:"), "{upid}");
    assert_eq!(s.config("100").await["lock"], "snapshot");
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("memory", "2048")])
        .await;
    assert_eq!(r.status, 500, "{r:?}");
    s.wait_ok(&upid).await;

    let cfg = s.config("100").await;
    assert!(cfg.get("lock").is_none(), "{cfg}");
    assert_eq!(cfg["parent"], "before-upgrade");
    assert_ne!(
        cfg["digest"], before,
        "the digest covers the snapshot sections"
    );
    let list = s.get("/nodes/pve1/qemu/100/snapshot").await;
    assert_eq!(names(list.data()), vec!["before-upgrade", "current"]);
    assert_eq!(list.data()[0]["description"], "why");
    assert_eq!(list.data()[0]["vmstate"], 0);
    assert!(list.data()[0]["snaptime"].as_u64().unwrap() > 0);
    assert_eq!(list.data()[1]["parent"], "before-upgrade");

    let again = s
        .post(
            "/nodes/pve1/qemu/100/snapshot",
            &[("snapname", "before-upgrade")],
        )
        .await
        .upid();
    let status = s.wait(&again).await;
    assert_eq!(
        status["exitstatus"],
        "snapshot name 'before-upgrade' already used"
    );
}

#[tokio::test]
async fn reserved_snapshot_names_are_refused_before_any_task() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s
        .post("/nodes/pve1/qemu/100/snapshot", &[("snapname", "current")])
        .await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.message(),
        "unable to use snapshot name 'current' (reserved name)\n"
    );
    let r = s
        .post("/nodes/pve1/qemu/100/snapshot", &[("snapname", "9lives")])
        .await;
    assert_eq!(r.status, 400, "pve-configid starts with a letter: {r:?}");
}

#[tokio::test]
async fn a_raw_file_on_a_directory_storage_cannot_be_snapshotted_but_qcow2_can() {
    let s = sim_with_dir_images().await;
    s.create_vm("100", &[("scsi1", "vmfiles:1,format=raw")])
        .await;
    let feature = s
        .get_q("/nodes/pve1/qemu/100/feature", &[("feature", "snapshot")])
        .await;
    assert_eq!(feature.data()["hasFeature"], 0, "{feature:?}");
    assert_eq!(feature.data()["nodes"], serde_json::json!(["pve1"]));
    let upid = s
        .post("/nodes/pve1/qemu/100/snapshot", &[("snapname", "s1")])
        .await
        .upid();
    let status = s.wait(&upid).await;
    assert_eq!(status["exitstatus"], "snapshot feature is not available");
    let cfg = s.config("100").await;
    assert!(cfg.get("lock").is_none(), "{cfg}");
    assert_eq!(
        names(s.get("/nodes/pve1/qemu/100/snapshot").await.data()),
        vec!["current"]
    );

    s.create_vm("101", &[("scsi1", "vmfiles:1,format=qcow2")])
        .await;
    let feature = s
        .get_q("/nodes/pve1/qemu/101/feature", &[("feature", "snapshot")])
        .await;
    assert_eq!(feature.data()["hasFeature"], 1, "{feature:?}");
}

#[tokio::test]
async fn rollback_stops_the_vm_and_restores_the_config_of_the_snapshot() {
    let s = sim().await;
    s.create_vm("100", &[("start", "1")]).await;
    let upid = s
        .post("/nodes/pve1/qemu/100/snapshot", &[("snapname", "good")])
        .await
        .upid();
    s.wait_ok(&upid).await;
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("name", "changed")])
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let upid = s
        .post("/nodes/pve1/qemu/100/snapshot/good/rollback", &[])
        .await
        .upid();
    assert!(upid.contains(":qmrollback:100:"), "{upid}");
    assert_eq!(s.config("100").await["lock"], "rollback");
    s.wait_ok(&upid).await;
    let cfg = s.config("100").await;
    assert_eq!(cfg["name"], "web");
    assert_eq!(cfg["parent"], "good");
    assert!(cfg.get("lock").is_none(), "{cfg}");
    let status = s.get("/nodes/pve1/qemu/100/status/current").await;
    assert_eq!(
        status.data()["status"],
        "stopped",
        "no RAM state: stays stopped"
    );
}

#[tokio::test]
async fn deleting_a_snapshot_relinks_the_parent_and_an_unknown_one_fails_the_task() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    for name in ["one", "two"] {
        let upid = s
            .post("/nodes/pve1/qemu/100/snapshot", &[("snapname", name)])
            .await
            .upid();
        s.wait_ok(&upid).await;
    }
    let upid = s
        .delete("/nodes/pve1/qemu/100/snapshot/two", &[])
        .await
        .upid();
    assert!(upid.contains(":qmdelsnapshot:100:"), "{upid}");
    assert_eq!(s.config("100").await["lock"], "snapshot-delete");
    s.wait_ok(&upid).await;
    let cfg = s.config("100").await;
    assert_eq!(cfg["parent"], "one");
    let upid = s
        .delete("/nodes/pve1/qemu/100/snapshot/nope", &[])
        .await
        .upid();
    assert_eq!(
        s.wait(&upid).await["exitstatus"],
        "snapshot 'nope' does not exist"
    );
}

#[tokio::test]
async fn containers_snapshot_and_roll_back_with_vz_tasks() {
    let s = sim().await;
    let template = "debian-13-standard_13.1-2_amd64.tar.zst";
    crate::download::place_file(&s, "local", "vztmpl", template, vec![1u8; 2048]).await;
    let ostemplate = format!("local:vztmpl/{template}");
    let upid = s
        .post(
            "/nodes/pve1/lxc",
            &[
                ("vmid", "200"),
                ("hostname", "ct"),
                ("ostemplate", ostemplate.as_str()),
                ("rootfs", "local-lvm:4"),
            ],
        )
        .await
        .upid();
    s.wait_ok(&upid).await;
    s.wait_idle("pve1").await;
    let feature = s
        .get_q("/nodes/pve1/lxc/200/feature", &[("feature", "snapshot")])
        .await;
    assert_eq!(feature.data()["hasFeature"], 1, "{feature:?}");
    let upid = s
        .post("/nodes/pve1/lxc/200/snapshot", &[("snapname", "ct-1")])
        .await
        .upid();
    assert!(upid.contains(":vzsnapshot:200:"), "{upid}");
    s.wait_ok(&upid).await;
    let r = s
        .put("/nodes/pve1/lxc/200/config", &[("hostname", "other")])
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let upid = s
        .post("/nodes/pve1/lxc/200/snapshot/ct-1/rollback", &[])
        .await
        .upid();
    assert!(upid.contains(":vzrollback:200:"), "{upid}");
    s.wait_ok(&upid).await;
    let cfg = s.get("/nodes/pve1/lxc/200/config").await;
    assert_eq!(cfg.data()["hostname"], "ct");
    let list = s.get("/nodes/pve1/lxc/200/snapshot").await;
    assert!(list.data()[0].get("vmstate").is_none(), "{list:?}");
}
