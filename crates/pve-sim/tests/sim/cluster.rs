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
    assert_eq!(dup.message(), "pool 'lab' already exists\n");
    s.create_vm("100", &[("pool", "lab")]).await;
    let r = s.get("/pools/lab").await;
    assert_eq!(r.data()["members"][0]["vmid"], 100);
    let del = s.delete("/pools/lab", &[]).await;
    assert_eq!(del.message(), "pool 'lab' is not empty (contains VM 100)\n");
}
