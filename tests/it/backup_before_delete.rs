//! Issue 19, item 3, end to end: the real agent and the simulator. With `[policy]
//! backup_before_delete`, a prune first backs the guest up with `vzdump` (the request log
//! shows the vzdump before the delete), the delete goes only after the backup task ended
//! OK, and the backup's volume id is recorded with the delete and shown in
//! `/api/v1/passes/{id}` and on the UI's pass page. A failed backup fails the delete and
//! the guest stays; a storage without content `backup` fails it before vzdump is sent.

use crate::git_server::TestRepo;
use crate::invalid_head::{Setup, last_id, nudge, pass_on, vm};
use crate::pve_api::Api;
use crate::sim::World;

/// The actions of pass `id`, from `/api/v1/passes/{id}`.
async fn actions_of(setup: &Setup, id: i64) -> Vec<serde_json::Value> {
    let detail = setup.agent.get(&format!("/api/v1/passes/{id}")).await;
    detail["actions"].as_array().cloned().unwrap_or_default()
}

/// `METHOD path` of every request after `before`, in the order the simulator saw them.
fn requests_since(world: &World, before: u64) -> Vec<String> {
    world
        .requests()
        .iter()
        .filter(|r| r.seq > before)
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

fn last_seq(world: &World) -> u64 {
    world.requests().last().map_or(0, |r| r.seq)
}

/// Two stopped VMs applied, prune on; then `old` is removed from the repository and one
/// pass runs on that commit. Returns the setup, the pass status and the seq before it.
async fn prune_old(world: &World, name: &str, policy: &str) -> (Setup, serde_json::Value, u64) {
    let repo = TestRepo::new();
    let head = repo.commit_files(
        &[
            ("vm/old.yaml", &vm("old", 151, "memory: 512MiB")),
            ("vm/keep.yaml", &vm("keep", 152, "memory: 512MiB")),
        ],
        "two VMs",
    );
    let setup = Setup::start(world, &repo, name, policy).await;
    let applied = setup
        .agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(head.as_str()))
        .await;
    repo.remove("vm/old.yaml");
    let pruned = repo.commit("old is gone");
    repo.push();
    let before = last_seq(world);
    nudge(&setup.agent).await;
    let status = pass_on(&setup.agent, &pruned, last_id(&applied)).await;
    (setup, status, before)
}

async fn guest_exists(world: &World, vmid: u32) -> bool {
    let guests = Api::new(world).get("/nodes/pve1/qemu").await;
    guests
        .as_array()
        .is_some_and(|list| list.iter().any(|g| g["vmid"] == vmid))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prune_backs_the_guest_up_first_and_records_the_backup_volume_with_the_delete() {
    let world = World::start(&[]).await;
    let (setup, status, before) = prune_old(
        &world,
        "backup",
        "prune = true\nbackup_before_delete = \"local\"\nbackup_mode = \"stop\"",
    )
    .await;
    assert_eq!(status["last_attempted"]["outcome"], "applied", "{status:#}");

    // The vzdump, then (after its task ended) the delete.
    let requests = requests_since(&world, before);
    let vzdump = requests
        .iter()
        .position(|r| r == "POST /nodes/pve1/vzdump")
        .unwrap_or_else(|| panic!("no vzdump: {requests:#?}"));
    let delete = requests
        .iter()
        .position(|r| r == "DELETE /nodes/pve1/qemu/151")
        .unwrap_or_else(|| panic!("no delete: {requests:#?}"));
    assert!(vzdump < delete, "{requests:#?}");
    assert!(
        requests[vzdump..delete]
            .iter()
            .any(|r| r.starts_with("GET /nodes/pve1/tasks/") && r.contains(":vzdump:151:")),
        "the delete did not wait for the backup task: {requests:#?}"
    );
    let sent = world
        .requests()
        .into_iter()
        .find(|r| r.seq > before && r.path == "/nodes/pve1/vzdump")
        .unwrap();
    assert_eq!(sent.params.get("vmid").map(String::as_str), Some("151"));
    assert_eq!(
        sent.params.get("storage").map(String::as_str),
        Some("local")
    );
    assert_eq!(sent.params.get("mode").map(String::as_str), Some("stop"));
    assert_eq!(sent.params.get("remove").map(String::as_str), Some("0"));
    assert!(
        !guest_exists(&world, 151).await,
        "the guest was not deleted"
    );

    // The backup is on the storage, with notes naming ProxOps, the commit and the pass.
    let content = Api::new(&world)
        .get("/nodes/pve1/storage/local/content?content=backup&vmid=151")
        .await;
    let items = content.as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1, "{content:#}");
    let volid = items[0]["volid"].as_str().unwrap().to_owned();
    assert!(
        volid.starts_with("local:backup/vzdump-qemu-151-"),
        "{volid}"
    );
    assert!(volid.ends_with(".vma.zst"), "{volid}");
    let notes = items[0]["notes"].as_str().unwrap_or_default();
    let commit = status["last_attempted"]["commit"].as_str().unwrap();
    let named = format!(
        "proxops: backup before deleting VM/old at {} (pass {}) (",
        &commit[..7],
        last_id(&status)
    );
    assert!(
        notes.starts_with(&named) && notes.ends_with(", 151 on pve1)") && !notes.contains("{{"),
        "the notes name the pass's short commit, and PVE filled in the template: {notes}"
    );

    // Recorded with the delete, and shown.
    let actions = actions_of(&setup, last_id(&status)).await;
    let delete = actions
        .iter()
        .find(|a| a["verb"] == "delete")
        .unwrap_or_else(|| panic!("no delete recorded: {actions:#?}"));
    assert_eq!(delete["result"], "succeeded", "{delete:#}");
    assert_eq!(delete["backup"], volid.as_str(), "{delete:#}");
    let (code, page) = setup
        .agent
        .get_text(&format!("/ui/passes/{}", last_id(&status)))
        .await;
    assert_eq!(code, 200);
    assert!(page.contains(&volid), "{page}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_backup_sends_no_delete_and_the_guest_stays() {
    let world = World::start(&[]).await;
    world
        .sim
        .control()
        .fail_next_task("vzdump", "got timeout writing to the backup storage");
    let (setup, status, before) = prune_old(
        &world,
        "failed-backup",
        "prune = true\nbackup_before_delete = \"local\"",
    )
    .await;
    let requests = requests_since(&world, before);
    assert!(
        requests.iter().any(|r| r == "POST /nodes/pve1/vzdump"),
        "{requests:#?}"
    );
    assert!(
        !requests
            .iter()
            .any(|r| r.starts_with("DELETE /nodes/pve1/qemu/151")),
        "a delete was sent after a failed backup: {requests:#?}"
    );
    assert!(guest_exists(&world, 151).await, "the guest was deleted");
    let actions = actions_of(&setup, last_id(&status)).await;
    let delete = actions
        .iter()
        .find(|a| a["verb"] == "delete")
        .unwrap_or_else(|| panic!("no delete recorded: {actions:#?}"));
    assert_eq!(delete["result"], "failed", "{delete:#}");
    let error = delete["error"].as_str().unwrap_or_default();
    assert!(error.contains("ended `job errors`"), "{error}");
    assert!(
        error
            .contains("ERROR: Backup of VM 151 failed - got timeout writing to the backup storage"),
        "{error}"
    );
    assert!(error.contains("the guest was not deleted"), "{error}");
    assert!(delete.get("backup").is_none(), "{delete:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backup_storage_without_backup_content_fails_the_delete_before_vzdump_is_sent() {
    let world = World::start(&[]).await;
    let (setup, status, before) = prune_old(
        &world,
        "no-backup-content",
        "prune = true\nbackup_before_delete = \"local-lvm\"",
    )
    .await;
    // Only the prune's shutdown (a no-op on the stopped guest) precedes the delete.
    let writes: Vec<String> = requests_since(&world, before)
        .into_iter()
        .filter(|r| !r.starts_with("GET "))
        .collect();
    assert_eq!(writes, ["POST /nodes/pve1/qemu/151/status/shutdown"]);
    assert!(guest_exists(&world, 151).await);
    let actions = actions_of(&setup, last_id(&status)).await;
    let delete = actions.iter().find(|a| a["verb"] == "delete").unwrap();
    assert_eq!(delete["result"], "failed", "{delete:#}");
    let error = delete["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("storage `local-lvm` ([policy] backup_before_delete) on node pve1 does not allow content `backup`"),
        "{error}"
    );
}
