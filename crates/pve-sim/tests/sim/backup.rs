//! `POST /nodes/{node}/vzdump` (backup volumes in the storage's content list) and
//! `GET /cluster/ha/status/current` (nodes in HA maintenance), issue 19 item 7.

use crate::{encode, sim};

async fn log_of(s: &crate::Sim, upid: &str) -> Vec<String> {
    let r = s
        .get(&format!("/nodes/pve1/tasks/{}/log", encode(upid)))
        .await;
    r.data()
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["t"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn vzdump_writes_a_backup_volume_with_its_notes_and_logs_the_archive() {
    let s = sim().await;
    s.create_vm("100", &[("name", "web")]).await;
    let r = s
        .post(
            "/nodes/pve1/vzdump",
            &[
                ("vmid", "100"),
                ("storage", "local"),
                ("mode", "snapshot"),
                ("compress", "zstd"),
                ("remove", "0"),
                (
                    "notes-template",
                    "before delete of {{guestname}} ({{vmid}})",
                ),
            ],
        )
        .await;
    let upid = r.upid();
    assert!(upid.contains(":vzdump:100:"), "{upid}");
    s.wait_ok(&upid).await;
    let log = log_of(&s, &upid).await;
    let archive = log
        .iter()
        .find_map(|l| l.strip_prefix("INFO: creating vzdump archive '"))
        .unwrap_or_else(|| panic!("no archive line: {log:#?}"));
    assert!(
        archive.starts_with("/var/lib/vz/dump/vzdump-qemu-100-") && archive.ends_with(".vma.zst'"),
        "{archive}"
    );
    assert_eq!(log.last().unwrap(), "TASK OK");
    let content = s
        .get_q(
            "/nodes/pve1/storage/local/content",
            &[("content", "backup"), ("vmid", "100")],
        )
        .await;
    let items = content.data().as_array().unwrap();
    assert_eq!(items.len(), 1, "{items:#?}");
    let volid = items[0]["volid"].as_str().unwrap();
    let file = archive.trim_end_matches('\'').rsplit('/').next().unwrap();
    assert_eq!(volid, format!("local:backup/{file}"));
    assert_eq!(items[0]["notes"], "before delete of web (100)");
    assert_eq!(items[0]["format"], "vma.zst");
}

#[tokio::test]
async fn vzdump_to_a_storage_without_backup_content_fails_its_task_with_pves_message() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    let upid = s
        .post(
            "/nodes/pve1/vzdump",
            &[("vmid", "100"), ("storage", "local-lvm")],
        )
        .await
        .upid();
    let done = s.wait(&upid).await;
    assert_eq!(
        done["exitstatus"],
        "could not get storage information for 'local-lvm': can't use storage 'local-lvm' for backups - wrong content type"
    );
}

#[tokio::test]
async fn an_injected_vzdump_failure_writes_no_volume_and_ends_with_job_errors() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    s.sim.control().fail_next_task("vzdump", "got timeout");
    let upid = s
        .post(
            "/nodes/pve1/vzdump",
            &[("vmid", "100"), ("storage", "local")],
        )
        .await
        .upid();
    let done = s.wait(&upid).await;
    assert_eq!(done["exitstatus"], "job errors");
    let log = log_of(&s, &upid).await;
    assert!(
        log.contains(&"ERROR: Backup of VM 100 failed - got timeout".to_owned()),
        "{log:#?}"
    );
    let content = s
        .get_q(
            "/nodes/pve1/storage/local/content",
            &[("content", "backup")],
        )
        .await;
    assert_eq!(content.data().as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn ha_status_lists_a_node_in_maintenance_mode_and_only_quorum_without_ha() {
    let s = sim().await;
    let entries = s.get("/cluster/ha/status/current").await;
    let types: Vec<&str> = entries
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["quorum", "fencing"]);

    assert!(s.sim.control().set_ha_maintenance("pve2", true));
    let entries = s.get("/cluster/ha/status/current").await;
    let lrm = |node: &str| {
        entries
            .data()
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == format!("lrm:{node}").as_str())
            .unwrap()["status"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(
        lrm("pve2").starts_with("pve2 (maintenance mode, watchdog active, "),
        "{}",
        lrm("pve2")
    );
    assert!(lrm("pve1").starts_with("pve1 (idle, "), "{}", lrm("pve1"));
    assert!(s.sim.control().set_ha_maintenance("pve2", false));
    let entries = s.get("/cluster/ha/status/current").await;
    assert!(
        entries
            .data()
            .as_array()
            .unwrap()
            .iter()
            .all(|e| !e["status"]
                .as_str()
                .unwrap_or_default()
                .contains("maintenance")),
        "{:#?}",
        entries.data()
    );
}
