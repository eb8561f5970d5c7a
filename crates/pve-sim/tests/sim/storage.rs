//! Storage listings, status and single-volume endpoints.

use crate::sim;

#[tokio::test]
async fn content_lists_guest_volumes_with_vmid_and_filters_by_content() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s.get("/nodes/pve1/storage/local-lvm/content").await;
    let vol = &r.data()[0];
    assert_eq!(vol["volid"], "local-lvm:vm-100-disk-0");
    assert_eq!(vol["content"], "images");
    assert_eq!(vol["format"], "raw");
    assert_eq!(vol["size"], 8u64 << 30);
    assert_eq!(vol["vmid"], 100);
    let iso = s
        .get_q(
            "/nodes/pve1/storage/local-lvm/content",
            &[("content", "iso")],
        )
        .await;
    assert_eq!(iso.data().as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn storage_status_reports_usage() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let r = s.get("/nodes/pve1/storage/local-lvm/status").await;
    assert_eq!(r.data()["type"], "lvmthin");
    assert_eq!(r.data()["used"], 8u64 << 30);
    assert_eq!(r.data()["active"], 1);
}

#[tokio::test]
async fn the_content_path_names_one_volume_not_a_content_type() {
    let s = sim().await;
    let r = s.get("/nodes/pve1/storage/local/content/iso").await;
    assert_eq!(r.status, 500);
    assert_eq!(r.message(), "unable to parse directory volume name 'iso'\n");
}

#[tokio::test]
async fn one_volume_can_be_read_and_deleted() {
    let s = sim().await;
    crate::download::place_file(&s, "local", "iso", "boot.iso", vec![0u8; 1000]).await;
    let r = s
        .get("/nodes/pve1/storage/local/content/local%3Aiso%2Fboot.iso")
        .await;
    assert_eq!(r.data()["size"], 1000);
    assert_eq!(r.data()["path"], "/var/lib/vz/template/iso/boot.iso");
    let upid = s
        .delete(
            "/nodes/pve1/storage/local/content/local%3Aiso%2Fboot.iso",
            &[],
        )
        .await
        .upid();
    assert!(upid.contains(":imgdel:local:"), "{upid}");
    s.wait_ok(&upid).await;
    let list = s.get("/nodes/pve1/storage/local/content").await;
    assert_eq!(list.data().as_array().unwrap().len(), 0);
}

/// A seed with `nfs-iso` only on pve2 and `old-lvm` disabled, besides the defaults.
async fn sim_with_restricted_storages() -> crate::Sim {
    let mut seed = proxops_pve_sim::Seed::default();
    seed.storages.push(proxops_pve_sim::StorageSeed {
        storage: "nfs-iso".into(),
        kind: "nfs".into(),
        content: vec!["iso".into()],
        nodes: Some(vec!["pve2".into()]),
        shared: true,
        path: None,
        total: 1 << 40,
        enabled: true,
    });
    seed.storages.push(proxops_pve_sim::StorageSeed {
        storage: "old-lvm".into(),
        kind: "lvmthin".into(),
        content: vec!["images".into()],
        nodes: None,
        shared: false,
        path: None,
        total: 1 << 40,
        enabled: false,
    });
    crate::sim_with(proxops_pve_sim::SimConfig {
        seed,
        tls: false,
        task_duration: crate::TASK,
        ..proxops_pve_sim::SimConfig::default()
    })
    .await
}

fn entry<'a>(list: &'a serde_json::Value, storage: &str) -> Option<&'a serde_json::Value> {
    list.as_array()
        .unwrap()
        .iter()
        .find(|s| s["storage"] == storage)
}

#[tokio::test]
async fn the_storage_list_shows_every_configured_storage_with_enabled_and_active_as_storage_info_does()
 {
    let s = sim_with_restricted_storages().await;
    let r = s.get("/nodes/pve1/storage").await;
    let list = r.data();
    let local = entry(list, "local").unwrap();
    assert_eq!(
        (local["enabled"].as_u64(), local["active"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(local["total"].as_u64().unwrap() > 0);
    // Not available on pve1: listed, enabled 0, active 0, zero sizes.
    let nfs = entry(list, "nfs-iso").expect("a node-restricted storage is listed");
    assert_eq!(
        (nfs["enabled"].as_u64(), nfs["active"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(
        (
            nfs["total"].as_u64(),
            nfs["used"].as_u64(),
            nfs["avail"].as_u64()
        ),
        (Some(0), Some(0), Some(0))
    );
    assert!(nfs.get("used_fraction").is_none(), "{nfs}");
    // Disabled: listed with zero sizes as well.
    let old = entry(list, "old-lvm").expect("a disabled storage is listed");
    assert_eq!(
        (old["enabled"].as_u64(), old["total"].as_u64()),
        (Some(0), Some(0))
    );
    // On pve2 the NFS storage is usable.
    let r = s.get("/nodes/pve2/storage").await;
    let nfs = entry(r.data(), "nfs-iso").unwrap();
    assert_eq!(
        (nfs["enabled"].as_u64(), nfs["active"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(nfs["total"].as_u64(), Some(1 << 40));
}

#[tokio::test]
async fn a_content_filter_drops_storages_that_are_disabled_or_not_on_the_node() {
    let s = sim_with_restricted_storages().await;
    let r = s.get_q("/nodes/pve1/storage", &[("content", "iso")]).await;
    let ids: Vec<&str> = r
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["storage"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["local"]);
    let r = s
        .get_q("/nodes/pve1/storage", &[("content", "images")])
        .await;
    assert!(entry(r.data(), "old-lvm").is_none(), "{:?}", r.data());
    // `enabled=1` drops only what the config disables; a node restriction stays listed.
    let r = s.get_q("/nodes/pve1/storage", &[("enabled", "1")]).await;
    assert!(entry(r.data(), "old-lvm").is_none());
    assert!(entry(r.data(), "nfs-iso").is_some());
}

#[tokio::test]
async fn naming_a_storage_the_listing_does_not_report_is_no_such_storage() {
    let s = sim_with_restricted_storages().await;
    let r = s
        .get_q(
            "/nodes/pve1/storage",
            &[("storage", "nfs-iso"), ("content", "iso")],
        )
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.error("storage"), "No such storage.");
    let r = s.get("/nodes/pve1/storage/nfs-iso/status").await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.data()["enabled"], 0);
    let r = s.get("/nodes/pve1/storage/nowhere/status").await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error("storage"), "No such storage.");
}
