//! Storage artifacts end to end: `proxops plan` and `proxops apply` against the simulator,
//! with the files served on 127.0.0.1 (issue: storage artifacts, DESIGN.md §2.3).

use crate::sim::{World, artifact, assert_all_requests_valid, sha256_hex};
use crate::support::{stderr, stdout};

const ISO: &[u8] = b"not really an installer, but bytes PVE fetches";
const TEMPLATE: &[u8] = b"a container template tarball";
const IMAGE: &[u8] = b"a qcow2 disk image";

fn download_posts(world: &World) -> Vec<(String, String)> {
    world
        .writes()
        .into_iter()
        .filter(|r| r.endpoint.ends_with("/download-url"))
        .map(|r| {
            (
                r.path.clone(),
                r.params.get("filename").cloned().unwrap_or_default(),
            )
        })
        .collect()
}

/// Declares `ISO/netinst` on pve1, downloaded from the world's file server.
fn declare_netinst_on_pve1(world: &World) {
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
}

#[tokio::test(flavor = "multi_thread")]
async fn an_iso_absent_on_two_nodes_is_downloaded_on_both_and_then_nothing_is_planned() {
    let world = World::start(&[("netinst.iso", ISO)]).await;
    let url = format!("{}/netinst.iso", world.files_url);
    world.write(
        "iso/netinst.yaml",
        Some(&artifact(
            "ISO",
            "netinst",
            &["pve1", "pve2"],
            "netinst.iso",
            &url,
            None,
        )),
    );

    let plan = world.proxops(&["plan", "--node", "*"]).await;
    assert_eq!(
        plan.status.code(),
        Some(2),
        "changes pending: {}",
        stderr(&plan)
    );
    assert!(
        stdout(&plan).contains("+ download ISO/netinst on pve1 → local:iso/netinst.iso"),
        "{}",
        stdout(&plan)
    );
    assert!(stdout(&plan).contains("+ download ISO/netinst on pve2 → local:iso/netinst.iso"));
    assert!(world.writes().is_empty(), "plan never writes");

    let apply = world.proxops(&["apply", "--yes", "--node", "*"]).await;
    assert_eq!(
        apply.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&apply),
        stderr(&apply)
    );
    assert!(
        stdout(&apply).contains("apply: 2 succeeded, 0 failed, 0 skipped"),
        "{}",
        stdout(&apply)
    );
    for node in ["pve1", "pve2"] {
        assert!(
            world
                .listing(node, "local", "iso")
                .await
                .contains(&"local:iso/netinst.iso".to_owned())
        );
    }

    world.sim.control().clear_requests();
    let again = world.proxops(&["plan", "--node", "*"]).await;
    assert_eq!(again.status.code(), Some(0), "{}", stdout(&again));
    assert!(stdout(&again).contains("no changes"));
    assert!(
        world.writes().is_empty(),
        "an in-sync plan sends no write: {:?}",
        world.writes()
    );
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_an_artifact_manifest_never_deletes_the_file() {
    let world = World::start(&[("netinst.iso", ISO)]).await;
    declare_netinst_on_pve1(&world);
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(apply.status.code(), Some(0), "{}", stderr(&apply));

    world.write("iso/netinst.yaml", None);
    let url = format!("{}/netinst.iso", world.files_url);
    world.write(
        "iso/other.yaml",
        Some(&artifact(
            "ISO",
            "other",
            &["pve1"],
            "other.iso",
            &url,
            None,
        )),
    );
    world.write("iso/other.yaml", None);
    let plan = world.proxops(&["plan"]).await;
    assert_eq!(
        plan.status.code(),
        Some(0),
        "{}{}",
        stdout(&plan),
        stderr(&plan)
    );
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(apply.status.code(), Some(0));
    assert!(
        world.writes().iter().all(|r| r.method != "DELETE"),
        "{:?}",
        world.writes()
    );
    assert!(
        world
            .listing("pve1", "local", "iso")
            .await
            .contains(&"local:iso/netinst.iso".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_listing_skips_that_node_until_it_recovers() {
    let world = World::start(&[("netinst.iso", ISO)]).await;
    let url = format!("{}/netinst.iso", world.files_url);
    world.write(
        "iso/netinst.yaml",
        Some(&artifact(
            "ISO",
            "netinst",
            &["pve1", "pve2"],
            "netinst.iso",
            &url,
            None,
        )),
    );
    // Offline for the whole pass, retries of the client included.
    world
        .sim
        .control()
        .fail_storage_listing("pve2", "local", 1000, None);

    let apply = world.proxops(&["apply", "--yes", "--node", "*"]).await;
    let out = stdout(&apply);
    assert_eq!(apply.status.code(), Some(0), "{out}{}", stderr(&apply));
    assert!(
        out.contains("! observe-failed ISO/netinst on pve2"),
        "{out}"
    );
    assert!(out.contains("storage 'local' is not online"), "{out}");
    assert_eq!(
        download_posts(&world),
        [(
            "/nodes/pve1/storage/local/download-url".to_owned(),
            "netinst.iso".to_owned()
        )],
        "no download is sent to pve2"
    );

    world.sim.control().clear_faults();
    let apply = world.proxops(&["apply", "--yes", "--node", "*"]).await;
    assert_eq!(apply.status.code(), Some(0), "{}", stdout(&apply));
    assert!(
        world
            .listing("pve2", "local", "iso")
            .await
            .contains(&"local:iso/netinst.iso".to_owned())
    );
    assert_eq!(download_posts(&world).len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_checksum_fails_that_download_with_pves_message_while_others_proceed() {
    let world = World::start(&[("good.iso", ISO), ("bad.iso", ISO)]).await;
    let good = artifact(
        "ISO",
        "good",
        &["pve1"],
        "good.iso",
        &format!("{}/good.iso", world.files_url),
        Some(&sha256_hex(ISO)),
    );
    let bad = artifact(
        "ISO",
        "bad",
        &["pve1"],
        "bad.iso",
        &format!("{}/bad.iso", world.files_url),
        Some(&sha256_hex(b"other")),
    );
    world.write("iso/good.yaml", Some(&good));
    world.write("iso/bad.yaml", Some(&bad));

    let apply = world.proxops(&["apply", "--yes"]).await;
    let out = stdout(&apply);
    assert_eq!(
        apply.status.code(),
        Some(1),
        "a failed action fails the apply: {out}"
    );
    assert!(out.contains("download ISO/good on pve1: ok"), "{out}");
    assert!(
        out.contains("download ISO/bad on pve1: FAILED: checksum mismatch"),
        "{out}"
    );
    assert!(
        out.contains("apply: 1 succeeded, 1 failed, 0 skipped"),
        "{out}"
    );
    let posted = world
        .writes()
        .into_iter()
        .find(|r| r.params.get("filename").is_some_and(|f| f == "good.iso"))
        .unwrap();
    assert_eq!(
        posted.params.get("checksum-algorithm").map(String::as_str),
        Some("sha256")
    );
    let listing = world.listing("pve1", "local", "iso").await;
    assert!(
        listing.contains(&"local:iso/good.iso".to_owned())
            && !listing.contains(&"local:iso/bad.iso".to_owned())
    );
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn disk_images_land_in_import_and_container_templates_in_vztmpl() {
    let world = World::start(&[("ct.tar.zst", TEMPLATE), ("cloud.qcow2", IMAGE)]).await;
    world.write(
        "ctt.yaml",
        Some(&artifact(
            "CTTemplate",
            "debian",
            &["pve1"],
            "ct.tar.zst",
            &format!("{}/ct.tar.zst", world.files_url),
            None,
        )),
    );
    world.write(
        "disk.yaml",
        Some(&artifact(
            "DiskImage",
            "cloud",
            &["pve1"],
            "cloud.qcow2",
            &format!("{}/cloud.qcow2", world.files_url),
            None,
        )),
    );

    let plan = world.proxops(&["plan"]).await;
    let out = stdout(&plan);
    assert!(
        out.contains("+ download CTTemplate/debian on pve1 → local:vztmpl/ct.tar.zst"),
        "{out}"
    );
    assert!(
        out.contains("+ download DiskImage/cloud on pve1 → local:import/cloud.qcow2"),
        "{out}"
    );
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(apply.status.code(), Some(0), "{}", stdout(&apply));
    assert_eq!(
        world.listing("pve1", "local", "vztmpl").await,
        ["local:vztmpl/ct.tar.zst"]
    );
    assert_eq!(
        world.listing("pve1", "local", "import").await,
        ["local:import/cloud.qcow2"]
    );
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_json_lists_actions_and_findings_for_machines() {
    let world = World::start(&[("netinst.iso", ISO)]).await;
    declare_netinst_on_pve1(&world);
    let plan = world.proxops(&["plan", "--json"]).await;
    assert_eq!(plan.status.code(), Some(2));
    let json: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let action = &json["plan"]["levels"][0][0];
    assert_eq!(action["node"], "pve1");
    assert_eq!(action["verb"]["verb"], "download");
    assert_eq!(action["verb"]["volid"], "local:iso/netinst.iso");
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_without_yes_off_a_terminal_refuses_and_writes_nothing() {
    let world = World::start(&[("netinst.iso", ISO)]).await;
    declare_netinst_on_pve1(&world);
    let apply = world.proxops(&["apply"]).await;
    assert_eq!(apply.status.code(), Some(1));
    assert!(
        stderr(&apply).contains("refusing to apply without --yes"),
        "{}",
        stderr(&apply)
    );
    assert!(world.writes().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_in_report_mode_sends_no_write_and_names_the_setting_that_stops_it() {
    let world = World::start(&[("netinst.iso", ISO)]).await;
    world.write_agent_toml(&world.agent_toml().policy("mode = \"report\""));
    declare_netinst_on_pve1(&world);

    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(apply.status.code(), Some(1), "{}", stderr(&apply));
    assert!(
        stdout(&apply).contains("+ download ISO/netinst on pve1"),
        "the plan is shown: {}",
        stdout(&apply)
    );
    assert!(
        stderr(&apply).contains("mode = \"report\""),
        "{}",
        stderr(&apply)
    );
    assert!(world.writes().is_empty(), "report mode never writes");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_iso_on_a_storage_not_available_on_its_node_is_a_finding_not_a_failed_listing() {
    // PVE lists `nfs-iso` on pve1 with `enabled 0` (storage.cfg restricts it to pve2).
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
    let config = proxops_pve_sim::SimConfig {
        seed,
        task_duration: std::time::Duration::from_millis(50),
        ..proxops_pve_sim::SimConfig::default()
    };
    let world = World::start_config(&[("netinst.iso", ISO)], config).await;
    let url = format!("{}/netinst.iso", world.files_url);
    let manifest = artifact("ISO", "netinst", &["pve1"], "netinst.iso", &url, None)
        .replace("storage: local", "storage: nfs-iso");
    world.write("iso/netinst.yaml", Some(&manifest));

    let plan = world.proxops(&["plan"]).await;
    let out = stdout(&plan);
    assert!(
        out.contains("storage nfs-iso was not reported on node pve1"),
        "{out}\n{}",
        stderr(&plan)
    );
    assert!(!out.contains("listing iso content"), "{out}");
    assert!(
        !world
            .requests()
            .iter()
            .any(|r| r.path.contains("/storage/nfs-iso/content")),
        "no content listing of a storage PVE reports unusable on the node"
    );
    assert!(world.writes().is_empty());
}
