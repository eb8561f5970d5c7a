//! Issue 19, item 2, end to end: the real agent against the simulator's `realistic-3node`
//! seed. A risky update of a VM on lvmthin is preceded by a snapshot (its task ends before
//! the config write, in the simulator's request log); four risky updates leave the newest
//! three ProxOps snapshots and never touch one someone else made (even one named
//! `proxops-*`); a raw file on a directory storage gets a `snapshot-skipped` finding saying
//! why, and the update goes on, or is held with `snapshot_required = true`; `proxops
//! rollback` restores the config of the newest snapshot.

use std::time::Duration;

use proxops_pve_sim::{Seed, SimConfig, StorageSeed};

use crate::git_server::{GitDaemon, TestRepo};
use crate::invalid_head::{last_id, memory, nudge, pass_on};
use crate::pve_api::Api;
use crate::sim::World;
use crate::support::agent::AgentProcess;

const SECRET: &str = "snapshot-webhook-secret";

/// The `realistic-3node` seed (lvmthin `local-lvm`) plus `vmfiles`, a directory storage
/// for disk images (raw files).
async fn realistic_world() -> World {
    let mut seed = Seed::builtin(proxops_pve_sim::REALISTIC_3NODE)
        .unwrap()
        .with_task_time_scale(0.25);
    seed.storages.push(StorageSeed {
        storage: "vmfiles".to_owned(),
        kind: "dir".to_owned(),
        content: vec!["images".to_owned()],
        nodes: None,
        shared: false,
        path: Some("/var/lib/vmfiles".to_owned()),
        total: 64 * 1024 * 1024 * 1024,
        enabled: true,
    });
    World::start_config(
        &[],
        SimConfig {
            seed,
            task_duration: Duration::from_millis(50),
            ..SimConfig::default()
        },
    )
    .await
}

fn vm(name: &str, vmid: u32, storage: &str, memory_mib: u32, annotations: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: {name}\n{annotations}spec:\n  node: pve1\n  \
         vmid: {vmid}\n  state: stopped\n  memory: {memory_mib}MiB\n  cpu: {{type: host, cores: 1}}\n  \
         disks: [{{storage: {storage}, size: 1GiB}}]\n  networks: [{{bridge: vmbr0}}]\n"
    )
}

struct Agent {
    agent: AgentProcess,
    _daemon: GitDaemon,
}

async fn agent(world: &World, repo: &TestRepo, name: &str, policy: &str) -> Agent {
    let daemon = repo.serve();
    let dir = world.dir.path();
    let toml = world
        .agent_toml()
        .source(&daemon.url("origin.git"))
        .webhook_secret(SECRET)
        .state_dir(dir.join(format!("state-{name}")))
        .policy(policy);
    let config = dir.join(format!("agent-{name}.toml"));
    let agent = AgentProcess::spawn(&toml, &config, "info");
    agent.wait_for(|s| s["last_attempted"].is_object()).await;
    Agent {
        agent,
        _daemon: daemon,
    }
}

/// The snapshot names PVE lists for VM `vmid` on pve1 (without `current`).
async fn snapshots(world: &World, vmid: u32) -> Vec<String> {
    let list = Api::new(world)
        .get(&format!("/nodes/pve1/qemu/{vmid}/snapshot"))
        .await;
    list.as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .filter(|n| *n != "current")
        .map(str::to_owned)
        .collect()
}

/// Commits memory `mib` for the VM, nudges the agent and waits for the commit to apply.
async fn apply_memory(setup: &Agent, repo: &TestRepo, vmid: u32, mib: u32) -> String {
    let status = setup.agent.wait_for(|_| true).await;
    let before = last_id(&status);
    let commit = repo.commit_files(
        &[("vm/app.yaml", &vm("app", vmid, "local-lvm", mib, ""))],
        &format!("memory {mib}"),
    );
    nudge(&setup.agent).await;
    pass_on(&setup.agent, &commit, before).await;
    let status = setup
        .agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(commit.as_str()))
        .await;
    assert_eq!(status["last_applied"]["commit"], commit.as_str());
    commit
}

#[tokio::test(flavor = "multi_thread")]
async fn a_risky_update_on_lvmthin_is_snapshotted_first_three_are_kept_and_others_are_never_touched()
 {
    let world = realistic_world().await;
    let repo = TestRepo::new();
    let vmid = 150;
    let first = repo.commit_files(
        &[("vm/app.yaml", &vm("app", vmid, "local-lvm", 512, ""))],
        "app",
    );
    let setup = agent(&world, &repo, "lvmthin", "").await;
    setup
        .agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(first.as_str()))
        .await;
    assert!(
        snapshots(&world, vmid).await.is_empty(),
        "a create takes no snapshot"
    );

    // Someone else's snapshot, named like ProxOps's: never ProxOps's to delete.
    Api::new(&world)
        .post_and_wait(
            "pve1",
            &format!("/nodes/pve1/qemu/{vmid}/snapshot"),
            &[
                ("snapname", "proxops-0000000-1"),
                ("description", "by hand"),
            ],
        )
        .await;

    let before = world.requests().last().map_or(0, |r| r.seq);
    let second = apply_memory(&setup, &repo, vmid, 640).await;
    assert_eq!(memory(&world, vmid).await, "640");

    // The snapshot task precedes the config write: POST snapshot, its task status polled to
    // the end, then the write.
    let log: Vec<_> = world
        .requests()
        .into_iter()
        .filter(|r| r.seq > before)
        .collect();
    let snapshot_post = log
        .iter()
        .find(|r| r.method == "POST" && r.path == format!("/nodes/pve1/qemu/{vmid}/snapshot"))
        .unwrap_or_else(|| panic!("no snapshot was taken: {log:#?}"));
    let snapname = snapshot_post.params["snapname"].clone();
    assert_eq!(snapname, format!("proxops-{}-1", &second[..7]));
    assert!(
        !snapshot_post.params.contains_key("vmstate"),
        "no RAM state"
    );
    let write = log
        .iter()
        .find(|r| r.method != "GET" && r.path == format!("/nodes/pve1/qemu/{vmid}/config"))
        .unwrap_or_else(|| panic!("no config write: {log:#?}"));
    let task_polled = log.iter().any(|r| {
        r.method == "GET"
            && r.path.contains("qmsnapshot")
            && r.seq > snapshot_post.seq
            && r.seq < write.seq
    });
    assert!(snapshot_post.seq < write.seq, "{log:#?}");
    assert!(
        task_polled,
        "the snapshot task was not waited for: {log:#?}"
    );

    // Three more risky updates: the oldest ProxOps snapshot goes, the other one stays.
    let mut ours = vec![snapname];
    for mib in [768, 896, 1024] {
        let commit = apply_memory(&setup, &repo, vmid, mib).await;
        ours.push(format!("proxops-{}-1", &commit[..7]));
    }
    assert_eq!(memory(&world, vmid).await, "1024");
    let listed = snapshots(&world, vmid).await;
    let mut expected: Vec<String> = ours[1..].to_vec();
    expected.push("proxops-0000000-1".to_owned());
    expected.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(sorted, expected, "listed: {listed:?}");
    let deletes: Vec<String> = world
        .writes()
        .into_iter()
        .filter(|r| r.method == "DELETE" && r.path.contains("/snapshot/"))
        .map(|r| r.path)
        .collect();
    assert_eq!(
        deletes,
        vec![format!("/nodes/pve1/qemu/{vmid}/snapshot/{}", ours[0])],
        "only ProxOps's oldest snapshot is deleted"
    );

    // `proxops rollback` to the newest (taken before 1024 MiB was written): 896 MiB again.
    // The agent is frozen first so that no pass corrects the rollback before it is read.
    let out = setup.agent.cli(&["freeze"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = setup
        .agent
        .cli(&["rollback", "VM/app", "--yes"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("back to snapshot {}", ours[3])),
        "{stdout}"
    );
    assert_eq!(memory(&world, vmid).await, "896");
    assert!(
        world.writes().iter().any(|r| r.method == "POST"
            && r.path == format!("/nodes/pve1/qemu/{vmid}/snapshot/{}/rollback", ours[3])),
        "no rollback request"
    );

    // Someone else's snapshot is refused unless named with --yes.
    let out = setup
        .agent
        .cli(&["rollback", "VM/app", "--snapshot", "proxops-0000000-1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not one ProxOps took"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_raw_file_the_finding_says_why_no_snapshot_was_taken_and_the_update_goes_on() {
    let world = realistic_world().await;
    let repo = TestRepo::new();
    let vmid = 151;
    let first = repo.commit_files(
        &[("vm/files.yaml", &vm("files", vmid, "vmfiles", 512, ""))],
        "files",
    );
    let setup = agent(&world, &repo, "rawfile", "").await;
    let applied = setup
        .agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(first.as_str()))
        .await;
    let disk = Api::new(&world).config("pve1", "qemu", vmid).await["scsi0"].clone();
    assert!(disk.as_str().unwrap().contains(".raw"), "{disk}");

    let second = repo.commit_files(
        &[("vm/files.yaml", &vm("files", vmid, "vmfiles", 768, ""))],
        "more memory",
    );
    nudge(&setup.agent).await;
    pass_on(&setup.agent, &second, last_id(&applied)).await;
    assert_eq!(memory(&world, vmid).await, "768", "the update went on");
    assert!(snapshots(&world, vmid).await.is_empty());
    assert!(
        !world.writes().iter().any(|r| r.path.ends_with("/snapshot")),
        "no snapshot was attempted"
    );
    let drift = setup.agent.get("/api/v1/drift").await;
    let finding = drift["open"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == "snapshot-skipped")
        .unwrap_or_else(|| panic!("no snapshot-skipped finding: {drift:#}"))
        .clone();
    let message = finding["message"].as_str().unwrap();
    assert_eq!(finding["resource"], "VM/files");
    assert!(
        message.contains("a raw volume on dir storage vmfiles, which cannot snapshot it"),
        "{message}"
    );
    assert!(message.contains("the update went on"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_snapshot_required_an_update_that_cannot_be_snapshotted_is_held() {
    let world = realistic_world().await;
    let repo = TestRepo::new();
    let vmid = 152;
    let first = repo.commit_files(
        &[("vm/files.yaml", &vm("files", vmid, "vmfiles", 512, ""))],
        "files",
    );
    let setup = agent(&world, &repo, "required", "snapshot_required = true").await;
    let applied = setup
        .agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(first.as_str()))
        .await;
    let second = repo.commit_files(
        &[("vm/files.yaml", &vm("files", vmid, "vmfiles", 768, ""))],
        "more memory",
    );
    nudge(&setup.agent).await;
    let status = pass_on(&setup.agent, &second, last_id(&applied)).await;
    assert_eq!(memory(&world, vmid).await, "512", "the update is held");
    let detail = setup
        .agent
        .get(&format!("/api/v1/passes/{}", last_id(&status)))
        .await;
    let update = detail["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["verb"] == "update")
        .unwrap_or_else(|| panic!("no update recorded: {detail:#}"))
        .clone();
    assert_eq!(update["result"], "skipped", "{update:#}");
    let error = update["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("held") && error.contains("snapshot_required = true"),
        "{error}"
    );

    // The annotation turns snapshots off for this guest: the update goes on.
    let third = repo.commit_files(
        &[(
            "vm/files.yaml",
            &vm(
                "files",
                vmid,
                "vmfiles",
                768,
                "  annotations:\n    proxops/snapshot: \"off\"\n",
            ),
        )],
        "no snapshots for files",
    );
    nudge(&setup.agent).await;
    pass_on(&setup.agent, &third, last_id(&status)).await;
    assert_eq!(memory(&world, vmid).await, "768");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_risky_update_names_the_snapshot_to_roll_back_to_and_the_command() {
    let world = realistic_world().await;
    let repo = TestRepo::new();
    let vmid = 153;
    let first = repo.commit_files(
        &[("vm/app.yaml", &vm("app", vmid, "local-lvm", 512, ""))],
        "app",
    );
    let setup = agent(&world, &repo, "failed", "").await;
    let applied = setup
        .agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(first.as_str()))
        .await;
    world
        .sim
        .control()
        .fail_requests(proxops_pve_sim::HttpFault {
            pattern: format!("/qemu/{vmid}/config$"),
            method: Some("PUT".to_owned()),
            status: 500,
            message: Some("unable to write the config".to_owned()),
            times: Some(1),
            probability: None,
        })
        .unwrap();
    let second = repo.commit_files(
        &[("vm/app.yaml", &vm("app", vmid, "local-lvm", 640, ""))],
        "more memory",
    );
    nudge(&setup.agent).await;
    let status = pass_on(&setup.agent, &second, last_id(&applied)).await;
    let detail = setup
        .agent
        .get(&format!("/api/v1/passes/{}", last_id(&status)))
        .await;
    let update = detail["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["verb"] == "update")
        .unwrap_or_else(|| panic!("no update recorded: {detail:#}"))
        .clone();
    assert_eq!(update["result"], "failed", "{update:#}");
    let snapshot = format!("proxops-{}-1", &second[..7]);
    let error = update["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("unable to write the config")
            && error.contains(&format!("snapshot {snapshot} was taken before this update"))
            && error.contains(&format!("proxops rollback VM/app --snapshot {snapshot}")),
        "{error}"
    );
    assert_eq!(snapshots(&world, vmid).await, vec![snapshot]);
}
