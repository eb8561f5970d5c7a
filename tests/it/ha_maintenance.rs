//! Issue 19, item 6, end to end: two real agents (nodes pve1 and pve2) and the simulator.
//! While pve1 is in PVE's HA maintenance (`ha-manager crm-command node-maintenance enable`,
//! seen in `/cluster/ha/status/current`), its agent sends no write to pve1 (the request log
//! says so), records the drift and an `ha-maintenance` finding, and its views say writes
//! are held until the node leaves maintenance (`proxops status` too, from the database,
//! with the agent stopped); pve2's agent corrects its drift meanwhile.
//! Out of maintenance, pve1's drift is corrected.

use std::path::PathBuf;

use crate::git_server::{GitDaemon, TestRepo};
use crate::invalid_head::{last_id, nudge, pass_on};
use crate::pve_api::Api;
use crate::sim::World;
use crate::support::agent::AgentProcess;

const SECRET: &str = "ha-maintenance-webhook-secret";

fn vm_on(name: &str, node: &str, vmid: u32) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata: {{name: {name}}}\nspec:\n  node: {node}\n  \
         vmid: {vmid}\n  state: stopped\n  memory: 512MiB\n  cpu: {{type: host, cores: 1}}\n  \
         disks: [{{storage: local-lvm, size: 1GiB}}]\n  networks: [{{bridge: vmbr0}}]\n"
    )
}

fn agent_for(world: &World, daemon: &GitDaemon, node: &str) -> AgentProcess {
    let dir = world.dir.path();
    let toml = world
        .agent_toml()
        .node(node)
        .source(&daemon.url("origin.git"))
        .webhook_secret(SECRET)
        .state_dir(dir.join(format!("state-ha-{node}")));
    let config: PathBuf = dir.join(format!("agent-ha-{node}.toml"));
    AgentProcess::spawn(&toml, &config, "info")
}

async fn memory(world: &World, node: &str, vmid: u32) -> String {
    let config = Api::new(world).config(node, "qemu", vmid).await;
    match &config["memory"] {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_in_ha_maintenance_gets_no_writes_while_the_other_node_proceeds() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let head = repo.commit_files(
        &[
            ("vm/a.yaml", &vm_on("a", "pve1", 171)),
            ("vm/b.yaml", &vm_on("b", "pve2", 172)),
        ],
        "one VM per node",
    );
    let daemon = repo.serve();
    let mut one = agent_for(&world, &daemon, "pve1");
    let two = agent_for(&world, &daemon, "pve2");
    let applied =
        |s: &serde_json::Value| s["last_applied"]["commit"].as_str() == Some(head.as_str());
    let first_one = one.wait_for(applied).await;
    let first_two = two.wait_for(applied).await;

    // pve1 goes into HA maintenance; both VMs drift.
    assert!(world.sim.control().set_ha_maintenance("pve1", true));
    let api = Api::new(&world);
    api.put("/nodes/pve1/qemu/171/config", &[("memory", "1024")])
        .await;
    api.put("/nodes/pve2/qemu/172/config", &[("memory", "1024")])
        .await;
    let before = world.requests().last().map_or(0, |r| r.seq);
    nudge(&one).await;
    nudge(&two).await;
    let held = pass_on(&one, &head, last_id(&first_one)).await;
    let corrected = pass_on(&two, &head, last_id(&first_two)).await;

    let writes_to_pve1: Vec<String> = world
        .requests()
        .iter()
        .filter(|r| r.seq > before && r.method != "GET" && r.path.starts_with("/nodes/pve1/"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        writes_to_pve1,
        Vec::<String>::new(),
        "pve1 is in maintenance"
    );
    assert_eq!(memory(&world, "pve1", 171).await, "1024");
    assert_eq!(
        corrected["last_attempted"]["outcome"], "applied",
        "{corrected:#}"
    );
    assert_eq!(memory(&world, "pve2", 172).await, "512");

    // The held update is recorded skipped with the reason; a finding says why.
    let detail = one.get(&format!("/api/v1/passes/{}", last_id(&held))).await;
    let update = detail["actions"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["verb"] == "update").cloned())
        .unwrap_or_else(|| panic!("no held update: {detail:#}"));
    assert_eq!(update["result"], "skipped", "{update:#}");
    let error = update["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("node pve1 is in PVE's HA maintenance mode"),
        "{error}"
    );
    let drift = one.get("/api/v1/drift").await;
    let open = drift["open"].as_array().cloned().unwrap_or_default();
    assert!(
        open.iter()
            .any(|d| d["kind"] == "ha-maintenance" && d["resource"] == "VM/a"),
        "{drift:#}"
    );
    assert!(
        open.iter()
            .any(|d| d["kind"] == "drift" && d["field"] == "memory"),
        "drift is still reported: {drift:#}"
    );
    let writes = &one.get("/api/v1/status").await["writes"];
    assert_eq!(writes["allowed"], false, "{writes:#}");
    assert!(
        writes["held"]
            .as_str()
            .is_some_and(|h| h.contains("HA maintenance") && h.contains("when it leaves it")),
        "{writes:#}"
    );
    assert_eq!(two.get("/api/v1/status").await["writes"]["allowed"], true);

    // With the agent stopped, `proxops status` reads the database: the open
    // `ha-maintenance` finding still says writes are held, and since which pass.
    one.kill9();
    let out = one.cli(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("writes: "))
        .unwrap_or_else(|| panic!("no writes line: {text}"));
    assert!(
        line.contains("held: node pve1 is in PVE's HA maintenance mode")
            && line.ends_with(&format!("(reported since pass {})", last_id(&held))),
        "{line}"
    );
    let offline = one.cli_json("status");
    assert_eq!(offline["writes"]["allowed"], false, "{offline:#}");

    // Out of maintenance: the drift on pve1 is corrected.
    assert!(world.sim.control().set_ha_maintenance("pve1", false));
    // The restarted agent's startup pass finds the node out of maintenance.
    one.respawn();
    let after = pass_on(&one, &head, last_id(&held)).await;
    assert_eq!(after["last_attempted"]["outcome"], "applied", "{after:#}");
    assert_eq!(memory(&world, "pve1", 171).await, "512");
    assert_eq!(one.get("/api/v1/status").await["writes"]["allowed"], true);
}
