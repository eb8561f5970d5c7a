//! `proxops check` against the simulator: version, node, storages with content types, bridges
//! (skipped: the simulator does not serve `/nodes/{n}/network`), and privileges.
//!
//! The simulator gives every token every privilege, so the end-to-end path here is the
//! all-granted case; "a token lacking `Datastore.AllocateTemplate`" is tested in
//! `src/check.rs` on a recorded `/access/permissions` answer.

use crate::sim::{World, artifact};
use crate::support::{stderr, stdout};

const VM: &str = "apiVersion: proxops/v1alpha1
kind: VM
metadata:
  name: web
spec:
  node: pve1
  vmid: 120
  memory: 1GiB
  cpu:
    type: host
    cores: 1
  disks:
    - storage: local-lvm
      size: 8GiB
      interface: scsi0
  networks:
    - bridge: vmbr0
";

#[tokio::test(flavor = "multi_thread")]
async fn a_repository_the_cluster_can_serve_passes_and_nothing_is_written() {
    let world = World::start(&[]).await;
    let url = format!("{}/netinst.iso", world.files_url);
    world.write(
        "iso/netinst.yaml",
        Some(&artifact(
            "ISO",
            "netinst",
            &["pve1"],
            "netinst.iso",
            &url,
            None,
        )),
    );
    world.write("vm/web.yaml", Some(VM));

    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("[ok     ] pve version: Proxmox VE 9."),
        "{text}"
    );
    assert!(
        text.contains("[ok     ] node pve1: exists and is online"),
        "{text}"
    );
    assert!(
        text.contains("[ok     ] storage local on pve1: has content iso"),
        "{text}"
    );
    assert!(
        text.contains("[ok     ] storage local-lvm on pve1: has content images"),
        "{text}"
    );
    assert!(
        text.contains("[skipped] bridge vmbr0 on pve1: not checked"),
        "{text}"
    );
    assert!(
        text.contains("[ok     ] privilege root@pam!proxops: holds every privilege"),
        "{text}"
    );
    assert!(text.ends_with("all checks passed\n"), "{text}");
    assert!(world.writes().is_empty(), "check never writes");
    let perms = world
        .requests()
        .into_iter()
        .filter(|r| r.endpoint == "/access/permissions")
        .count();
    assert!(perms >= 1, "asks PVE for the token's privileges");
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_storages_and_content_types_are_problems_with_a_fix() {
    let world = World::start(&[]).await;
    let url = format!("{}/debian.tar.zst", world.files_url);
    // A container template on local-lvm (images, rootdir: no vztmpl) and an ISO on a storage
    // the cluster does not have.
    world.write(
        "ctt/debian.yaml",
        Some(
            &artifact(
                "CTTemplate",
                "debian",
                &["pve1"],
                "debian.tar.zst",
                &url,
                None,
            )
            .replace("storage: local", "storage: local-lvm"),
        ),
    );
    world.write(
        "iso/netinst.yaml",
        Some(
            &artifact("ISO", "netinst", &["pve1"], "netinst.iso", &url, None)
                .replace("storage: local", "storage: nas"),
        ),
    );

    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(
        text.contains(
            "[PROBLEM] storage local-lvm on pve1: content vztmpl missing (has images,rootdir; \
             needed by CTTemplate/debian)"
        ) || text.contains("[PROBLEM] storage local-lvm on pve1: content vztmpl missing"),
        "{text}"
    );
    assert!(
        text.contains("fix: pvesm set local-lvm --content images,rootdir,vztmpl"),
        "{text}"
    );
    assert!(
        text.contains("[PROBLEM] storage nas on pve1: storage `nas` does not exist on pve1"),
        "{text}"
    );
    assert!(text.ends_with("2 problems found\n"), "{text}");

    let json = world.proxops(&["check", "--json"]).await;
    assert_eq!(json.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["ok"], false);
    let problems: Vec<&str> = report["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["status"] == "problem")
        .map(|i| i["subject"].as_str().unwrap())
        .collect();
    assert_eq!(problems, vec!["local-lvm on pve1", "nas on pve1"]);
    assert!(world.writes().is_empty(), "check never writes");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_the_cluster_does_not_have_is_a_problem() {
    let world = World::start(&[]).await;
    world.write("vm/web.yaml", Some(VM));
    let out = world.proxops(&["check", "--node", "pve9"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("[PROBLEM] node pve9: no such node (the cluster has pve1, pve2, pve3)"),
        "{text}"
    );
}
