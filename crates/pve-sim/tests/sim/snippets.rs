//! Storages mapped to directories (`SimConfig::storage_root`): `GET /storage/{storage}`,
//! snippets listings of the files there, and a `cicustom` naming a missing snippet failing
//! where qemu-server reads it (`PUT .../cloudinit`, start).

use std::time::Duration;

use proxops_pve_sim::SimConfig;

use crate::{Sim, TASK, sim_with};

async fn dir_sim(root: &std::path::Path) -> Sim {
    sim_with(SimConfig {
        tls: false,
        task_duration: TASK,
        lock_timeout: Duration::from_millis(300),
        storage_root: Some(root.to_path_buf()),
        ..SimConfig::default()
    })
    .await
}

#[tokio::test]
async fn storage_config_reports_the_directory_and_content_of_a_mapped_storage() {
    let root = tempfile::tempdir().unwrap();
    let s = dir_sim(root.path()).await;
    let r = s.get("/storage/local").await;
    assert_eq!(r.status, 200);
    let dir = root.path().join("local");
    assert_eq!(r.data()["path"], dir.to_string_lossy().as_ref());
    assert_eq!(r.data()["type"], "dir");
    assert!(
        r.data()["content"]
            .as_str()
            .unwrap()
            .split(',')
            .any(|c| c == "snippets"),
        "{:?}",
        r.data()
    );
    assert!(
        r.data().get("shared").is_none(),
        "a dir storage is not shared"
    );
    assert!(dir.join("snippets").is_dir());
    let lvm = s.get("/storage/local-lvm").await;
    assert!(lvm.data().get("path").is_none(), "{:?}", lvm.data());
    let missing = s.get("/storage/nope").await;
    assert_eq!(missing.status, 500);
    assert_eq!(missing.message(), "storage 'nope' does not exist\n");
}

#[tokio::test]
async fn a_snippets_listing_shows_the_files_in_the_directory_but_not_dot_files() {
    let root = tempfile::tempdir().unwrap();
    let s = dir_sim(root.path()).await;
    let dir = root.path().join("local").join("snippets");
    std::fs::write(dir.join("user.yaml"), b"#cloud-config\n").unwrap();
    std::fs::write(dir.join(".half-written"), b"x").unwrap();
    let r = s
        .get_q(
            "/nodes/pve1/storage/local/content",
            &[("content", "snippets")],
        )
        .await;
    let list = r.data().as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["volid"], "local:snippets/user.yaml");
    assert_eq!(list[0]["format"], "snippet");
    assert_eq!(list[0]["size"], 14);
    assert!(list[0]["ctime"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn regenerating_the_drive_fails_while_a_cicustom_snippet_is_missing_and_works_once_it_is_there()
 {
    let root = tempfile::tempdir().unwrap();
    let s = dir_sim(root.path()).await;
    s.create_vm(
        "100",
        &[
            ("ide2", "local-lvm:cloudinit"),
            ("cicustom", "user=local:snippets/u.yaml"),
        ],
    )
    .await;
    let r = s.put("/nodes/pve1/qemu/100/cloudinit", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.message(), "can't find file 'local:snippets/u.yaml'\n");
    let start = s
        .post("/nodes/pve1/qemu/100/status/start", &[])
        .await
        .upid();
    let task = s.wait(&start).await;
    assert_eq!(
        task["exitstatus"],
        "can't find file 'local:snippets/u.yaml'"
    );
    std::fs::write(
        root.path().join("local/snippets/u.yaml"),
        b"#cloud-config\n",
    )
    .unwrap();
    let r = s.put("/nodes/pve1/qemu/100/cloudinit", &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.data());
}

#[tokio::test]
async fn a_cicustom_volume_outside_snippets_is_refused_as_qemu_server_does() {
    let root = tempfile::tempdir().unwrap();
    let s = dir_sim(root.path()).await;
    s.create_vm(
        "100",
        &[
            ("ide2", "local-lvm:cloudinit"),
            ("cicustom", "user=local:iso/u.yaml"),
        ],
    )
    .await;
    let r = s.put("/nodes/pve1/qemu/100/cloudinit", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.message(),
        "local:iso/u.yaml is not in the snippets directory\n"
    );
}
