//! `proxops plan` shows the safety net (follow-up of issue 19): under `[policy]
//! backup_before_delete` each delete is marked `backed up to <storage> first`, and an update
//! `[policy] snapshot` picks is marked `snapshot first`, in the text and in `--json`
//! (`safety_net`). The guests are created by `proxops apply` against the simulator, so the
//! prune comes from their ownership tag as in every CLI plan.

use crate::sim::World;
use crate::support::{stderr, stdout};

fn vm(name: &str, vmid: u32, memory: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1
kind: VM
metadata:
  name: {name}
spec:
  node: pve1
  vmid: {vmid}
  memory: {memory}
  cpu: {{type: host, cores: 1}}
  disks:
    - {{storage: local-lvm, size: 8GiB, interface: scsi0}}
"
    )
}

/// `web` (101) and `old` (102) applied; then `old` removed and `web`'s memory raised (a risky
/// update).
async fn world_with_a_prune_and_a_risky_update() -> World {
    let world = World::start(&[]).await;
    world.write("vm/web.yaml", Some(&vm("web", 101, "1GiB")));
    world.write("vm/old.yaml", Some(&vm("old", 102, "1GiB")));
    let out = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    world.write("vm/old.yaml", None);
    world.write("vm/web.yaml", Some(&vm("web", 101, "2GiB")));
    world
}

/// The line after the first line starting with `head` (trimmed).
fn line_after<'a>(text: &'a str, head: &str) -> Option<&'a str> {
    let mut lines = text.lines().map(str::trim);
    lines.find(|l| l.starts_with(head))?;
    lines.next()
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_says_a_delete_is_backed_up_first_and_a_risky_update_is_snapshotted_first() {
    let world = world_with_a_prune_and_a_risky_update().await;
    world.write_agent_toml(&world.agent_toml().policy(
        "prune = true\nbackup_before_delete = \"local\"\nbackup_mode = \"stop\"\nsnapshot = \"risky\"",
    ));

    let out = world.proxops(&["plan"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{text}\n{}", stderr(&out));
    assert_eq!(
        line_after(&text, "- delete VM/old on pve1 (vmid 102)"),
        Some("backed up to local first (vzdump, mode stop)"),
        "{text}"
    );
    assert_eq!(
        line_after(&text, "~ update VM/web on pve1: memory"),
        Some(
            "snapshot first ([policy] snapshot = \"risky\"; the agent takes it, proxops apply \
             does not)"
        ),
        "{text}"
    );
    let writes = world.writes().len();

    let json = world.proxops(&["plan", "--json"]).await;
    assert_eq!(world.writes().len(), writes, "plan writes nothing");
    let plan: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let marks = plan["safety_net"].as_array().expect("safety_net");
    let delete = marks
        .iter()
        .find(|m| m["verb"] == "delete")
        .expect("the delete is marked");
    assert_eq!(delete["resource"], "VM/old");
    assert_eq!(delete["first"], "backup");
    assert_eq!(delete["storage"], "local");
    assert_eq!(delete["mode"], "stop");
    let update = marks
        .iter()
        .find(|m| m["verb"] == "update")
        .expect("the update is marked");
    assert_eq!(update["resource"], "VM/web");
    assert_eq!(update["first"], "snapshot");
    assert_eq!(update["mode"], "risky");
    assert_eq!(update["set_by"], "policy");
    assert!(
        plan["plan"].is_object(),
        "the pass is still all there: {plan:#}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_marks_nothing_when_no_backup_is_configured_and_snapshots_are_off() {
    let world = world_with_a_prune_and_a_risky_update().await;
    world.write_agent_toml(
        &world
            .agent_toml()
            .policy("prune = true\nsnapshot = \"off\""),
    );

    let out = world.proxops(&["plan"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("- delete VM/old on pve1 (vmid 102)"),
        "{text}"
    );
    assert!(!text.contains("backed up"), "{text}");
    assert!(!text.contains("snapshot first"), "{text}");
    let json = world.proxops(&["plan", "--json"]).await;
    let plan: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(plan.get("safety_net").is_none(), "{plan:#}");
}
