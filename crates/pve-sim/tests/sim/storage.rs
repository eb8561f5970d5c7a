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
