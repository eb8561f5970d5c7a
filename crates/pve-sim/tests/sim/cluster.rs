//! /version, /cluster/resources, /cluster/nextid, /nodes, /pools.

use crate::sim;

#[tokio::test]
async fn version_reports_pve_9() {
    let s = sim().await;
    let r = s.get("/version").await;
    assert_eq!(r.data()["release"], "9.1");
    assert!(r.data()["version"].as_str().unwrap().starts_with("9."));
}

#[tokio::test]
async fn the_default_seed_has_three_nodes_with_local_and_local_lvm() {
    let s = sim().await;
    let nodes = s.get("/nodes").await;
    let names: Vec<&str> = nodes
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["pve1", "pve2", "pve3"]);
    let storages = s.get("/nodes/pve2/storage").await;
    let list = storages.data().as_array().unwrap();
    let local = list.iter().find(|s| s["storage"] == "local").unwrap();
    assert_eq!(local["type"], "dir");
    assert_eq!(local["content"], "backup,import,iso,snippets,vztmpl");
    let lvm = list.iter().find(|s| s["storage"] == "local-lvm").unwrap();
    assert_eq!(lvm["type"], "lvmthin");
    assert_eq!(lvm["content"], "images,rootdir");
}

#[tokio::test]
async fn cluster_resources_filter_by_type_and_use_qemu_as_the_type() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    // Sizes come from pvestatd's next run (see the test below).
    s.sim.control().refresh_stats();
    let vms = s.get_q("/cluster/resources", &[("type", "vm")]).await;
    let list = vms.data().as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["id"], "qemu/100");
    assert_eq!(list[0]["type"], "qemu");
    assert_eq!(list[0]["node"], "pve1");
    assert_eq!(list[0]["maxmem"], 1024u64 * 1024 * 1024);
    let nodes = s.get_q("/cluster/resources", &[("type", "node")]).await;
    assert!(
        nodes
            .data()
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["type"] == "node")
    );
    let all = s.get("/cluster/resources").await;
    assert!(
        all.data()
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["type"] == "storage")
    );
}

/// The `/cluster/resources` entry of guest `vmid`.
async fn resource(s: &crate::Sim, vmid: u64) -> serde_json::Value {
    let r = s.get_q("/cluster/resources", &[("type", "vm")]).await;
    r.data()
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["vmid"].as_u64() == Some(vmid))
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_guest_created_since_pvestatds_last_run_is_listed_with_status_unknown_and_no_name() {
    let s = sim().await;
    s.create_vm("120", &[("name", "fresh")]).await;
    let listed = resource(&s, 120).await;
    assert_eq!(listed["status"], "unknown", "{listed}");
    assert_eq!(listed["type"], "qemu");
    assert_eq!(listed["node"], "pve1");
    for absent in ["name", "template", "maxmem", "uptime"] {
        assert!(listed.get(absent).is_none(), "{absent}: {listed}");
    }
    s.sim.control().refresh_stats();
    let listed = resource(&s, 120).await;
    assert_eq!(listed["status"], "stopped", "{listed}");
    assert_eq!(listed["name"], "fresh");
    assert_eq!(listed["template"], 0);
    assert_eq!(listed["maxmem"], 1024u64 << 20);
}

#[tokio::test]
async fn lock_and_tags_in_cluster_resources_follow_the_config_at_once_but_status_waits_for_pvestatd()
 {
    let s = sim().await;
    s.create_vm("121", &[("tags", "web")]).await;
    s.sim.control().refresh_stats();
    let upid = s
        .post("/nodes/pve1/qemu/121/status/start", &[])
        .await
        .upid();
    s.wait_ok(&upid).await;
    let r = s
        .put("/nodes/pve1/qemu/121/config", &[("tags", "db;web")])
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let listed = resource(&s, 121).await;
    assert_eq!(listed["tags"], "db;web", "{listed}");
    assert_eq!(
        listed["status"], "stopped",
        "the start is not published yet: {listed}"
    );
    s.sim.control().refresh_stats();
    assert_eq!(resource(&s, 121).await["status"], "running");
}

#[tokio::test]
async fn with_a_stats_interval_pvestatd_publishes_new_guests_by_itself() {
    let s = crate::sim_with(proxops_pve_sim::SimConfig {
        tls: false,
        task_duration: std::time::Duration::ZERO,
        stats_interval: std::time::Duration::from_millis(200),
        ..proxops_pve_sim::SimConfig::default()
    })
    .await;
    s.create_vm("122", &[]).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while resource(&s, 122).await["status"] == "unknown" {
        assert!(std::time::Instant::now() < deadline, "never published");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(resource(&s, 122).await["status"], "stopped");
}

#[tokio::test]
async fn nextid_returns_the_lowest_free_id_and_rejects_taken_ones() {
    let s = sim().await;
    assert_eq!(s.get("/cluster/nextid").await.data(), "100");
    s.create_vm("100", &[]).await;
    assert_eq!(s.get("/cluster/nextid").await.data(), "101");
    let r = s.get_q("/cluster/nextid", &[("vmid", "100")]).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error("vmid"), "VM 100 already exists");
}

#[tokio::test]
async fn an_unknown_node_fails_the_hostname_lookup() {
    let s = sim().await;
    let r = s.get("/nodes/nope/qemu").await;
    assert_eq!(r.status, 500);
    assert!(
        r.message().starts_with("hostname lookup 'nope' failed"),
        "{r:?}"
    );
}

#[tokio::test]
async fn pools_are_created_listed_and_hold_guests() {
    let s = sim().await;
    assert_eq!(s.post("/pools", &[("poolid", "lab")]).await.status, 200);
    let dup = s.post("/pools", &[("poolid", "lab")]).await;
    assert_eq!(
        dup.message(),
        "create pool failed: pool 'lab' already exists\n"
    );
    s.create_vm("100", &[("pool", "lab")]).await;
    let r = s.get("/pools/lab").await;
    assert_eq!(r.data()["members"][0]["vmid"], 100);
    let del = s.delete("/pools/lab", &[]).await;
    assert_eq!(
        del.message(),
        "delete pool failed: pool 'lab' is not empty (contains VM 100)\n"
    );
}

#[tokio::test]
async fn an_offline_node_answers_595_with_an_empty_body() {
    let mut seed = proxops_pve_sim::Seed::default();
    seed.nodes[2].online = false;
    let s = crate::sim_with(proxops_pve_sim::SimConfig {
        seed,
        tls: false,
        ..proxops_pve_sim::SimConfig::default()
    })
    .await;
    let r = s.get("/nodes/pve3/qemu").await;
    assert_eq!(r.status, 595);
    assert_eq!(r.text, "");
    let nodes = s.get("/nodes").await;
    assert_eq!(nodes.data()[2]["status"], "offline");
}

#[tokio::test]
async fn a_toml_seed_file_defines_storages_users_files_and_guests() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seed.toml");
    std::fs::write(
        &path,
        r#"
cluster_name = "lab"
pools = ["lab"]

[[nodes]]
name = "alpha"

[[storages]]
storage = "local"
type = "dir"
content = ["iso", "vztmpl", "import"]

[[storages]]
storage = "tank"
type = "zfspool"
content = ["images", "rootdir"]

[[users]]
userid = "ci@pve"
tokens = [{ id = "deploy", secret = "s3cret", privsep = false }]

[[acl]]
path = "/"
roleid = "PVEAdmin"
type = "user"
ugid = "ci@pve"

[[volumes]]
node = "alpha"
volid = "local:iso/debian-13.iso"
size = 4096

[[guests]]
vmid = 100
type = "qemu"
node = "alpha"
running = true
config = { name = "web", memory = "2048", scsi0 = "tank:vm-100-disk-0,size=8G" }
"#,
    )
    .unwrap();
    let seed = proxops_pve_sim::Seed::from_file(&path).unwrap();
    let mut s = crate::sim_with(proxops_pve_sim::SimConfig {
        seed,
        tls: false,
        ..proxops_pve_sim::SimConfig::default()
    })
    .await;
    s.auth = Some("PVEAPIToken=ci@pve!deploy=s3cret".to_string());
    let iso = s.get("/nodes/alpha/storage/local/content").await;
    assert_eq!(iso.data()[0]["volid"], "local:iso/debian-13.iso");
    let vm = s.get("/nodes/alpha/qemu/100/status/current").await;
    assert_eq!(vm.data()["status"], "running");
    assert_eq!(vm.data()["maxdisk"], 8u64 << 30);
    let tank = s.get("/nodes/alpha/storage/tank/content").await;
    assert_eq!(tank.data()[0]["volid"], "tank:vm-100-disk-0");
    assert_eq!(s.get("/pools").await.data()[0]["poolid"], "lab");
}

#[tokio::test]
async fn a_json_seed_with_an_unknown_node_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seed.json");
    std::fs::write(
        &path,
        r#"{"nodes":[{"name":"a"}],"storages":[],"volumes":[{"node":"b","volid":"local:iso/x.iso"}]}"#,
    )
    .unwrap();
    let err = proxops_pve_sim::Seed::from_file(&path).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid seed: volume 'local:iso/x.iso' names unknown node 'b'"
    );
}

#[tokio::test]
async fn guests_are_added_to_and_removed_from_pools() {
    let s = sim().await;
    s.post("/pools", &[("poolid", "lab")]).await;
    s.create_vm("100", &[]).await;
    let r = s.put("/pools", &[("poolid", "lab"), ("vms", "100")]).await;
    assert_eq!(r.status, 200, "{r:?}");
    let res = s.get_q("/cluster/resources", &[("type", "vm")]).await;
    assert_eq!(res.data()[0]["pool"], "lab");
    s.put(
        "/pools",
        &[("poolid", "lab"), ("vms", "100"), ("delete", "1")],
    )
    .await;
    let r = s.get("/pools/lab").await;
    assert_eq!(r.data()["members"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn cluster_status_lists_the_cluster_and_its_nodes() {
    let s = sim().await;
    let r = s.get("/cluster/status").await;
    let list = r.data().as_array().unwrap();
    assert_eq!(list[0]["type"], "cluster");
    assert_eq!(list[0]["nodes"], 3);
    assert_eq!(list[1]["type"], "node");
    assert_eq!(list[1]["name"], "pve1");
    assert_eq!(s.get_q("/cluster/status", &[("x", "1")]).await.status, 400);
}

#[tokio::test]
async fn cluster_status_parameters_are_validated_by_the_vendored_schema() {
    let s = sim().await;
    let r = s.get_q("/cluster/status", &[("x", "1")]).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.message(), "Parameter verification failed.\n");
    assert_eq!(
        r.error("x"),
        "property is not defined in schema and the schema does not allow additional properties"
    );
}

fn fingerprints(nodes: &crate::Resp) -> Vec<(String, String)> {
    nodes
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node"].as_str().unwrap().to_string(),
                n["ssl_fingerprint"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn is_pve_fingerprint(fp: &str) -> bool {
    fp.len() == 32 * 3 - 1
        && fp.split(':').all(|b| {
            b.len() == 2
                && b.chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_lowercase())
        })
}

#[tokio::test]
async fn every_node_reports_its_own_ssl_fingerprint() {
    let s = sim().await;
    let fps = fingerprints(&s.get("/nodes").await);
    assert_eq!(fps.len(), 3);
    for (node, fp) in &fps {
        assert!(is_pve_fingerprint(fp), "{node}: {fp}");
    }
    let distinct: std::collections::BTreeSet<&str> = fps.iter().map(|(_, f)| f.as_str()).collect();
    assert_eq!(distinct.len(), 3, "{fps:?}");
    // Derived from the node name, so another simulator reports the same ones.
    let other = sim().await;
    assert_eq!(fingerprints(&other.get("/nodes").await), fps);
}

#[tokio::test]
async fn the_local_node_reports_the_fingerprint_of_the_served_certificate() {
    let s = crate::sim_with(proxops_pve_sim::SimConfig {
        tls: true,
        ..proxops_pve_sim::SimConfig::default()
    })
    .await;
    let client = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let get = |path: &'static str| {
        client
            .get(s.url(path))
            .header("Authorization", crate::TOKEN)
            .send()
    };
    let nodes: serde_json::Value = get("/nodes").await.unwrap().json().await.unwrap();
    let status: serde_json::Value = get("/cluster/status").await.unwrap().json().await.unwrap();
    let local = status["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["local"] == 1)
        .unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(local, "pve1");
    let served = s.sim.fingerprint().unwrap();
    for n in nodes["data"].as_array().unwrap() {
        let fp = n["ssl_fingerprint"].as_str().unwrap();
        if n["node"] == local.as_str() {
            assert_eq!(fp, served);
        } else {
            assert_ne!(fp, served, "{n}");
            assert!(is_pve_fingerprint(fp), "{n}");
        }
    }
}
