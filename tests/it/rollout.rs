//! Issue 22, item 4, end to end: rollout waves with three real agents (pve1, pve2, pve3) on
//! one simulated cluster (`Seed::realistic_3node`), sharing the pmxcfs stand-in
//! (`support::pmxcfs`) as their `/etc/pve`, with `waves = [["pve3"], ["pve1", "pve2"]]`:
//!
//! - pve1 and pve2 send no write to PVE (the simulator's request log, per node) until pve3
//!   has applied the commit and stayed healthy for `bake`; they say why while they wait;
//! - pve3's agent stopped: its status turns stale, and pve1 and pve2 apply the next commit
//!   only once `wave_timeout` has passed since it was first seen, reporting pve3 skipped;
//! - pve3 in PVE's HA maintenance (its agent running and publishing, its writes held): pve1
//!   and pve2 wait for it, then skip it after `wave_timeout` and report it skipped;
//! - a failing action on pve3 (a simulator fault) halts pve1 and pve2, each naming the wave
//!   and node that failed, and they write nothing;
//! - with `health = "guest-agent"`, the QEMU guest agent of the VM pve3 started not
//!   answering (the simulator told so) halts pve1 and pve2, naming the VM.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use proxops_pve_sim::{HttpFault, Seed, SimConfig};

use crate::git_server::TestRepo;
use crate::sim::World;
use crate::support::agent::AgentProcess;
use crate::support::pmxcfs::Pmxcfs;

const NODES: [&str; 3] = ["pve1", "pve2", "pve3"];
const PATIENCE: Duration = Duration::from_secs(90);

/// A stopped VM on `node`.
fn vm(name: &str, node: &str, vmid: u32) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata: {{name: {name}}}\nspec:\n  node: {node}\n  \
         vmid: {vmid}\n  state: stopped\n  memory: 512MiB\n  cpu: {{type: host, cores: 1}}\n  \
         disks: [{{storage: local-lvm, size: 1GiB}}]\n  networks: [{{bridge: vmbr0}}]\n"
    )
}

/// One VM per node: `web-<node>` with vmid `base + n`.
fn one_vm_per_node(base: u32) -> Vec<(String, String)> {
    NODES
        .iter()
        .zip(1..)
        .map(|(node, n)| {
            let name = format!("web{base}-{node}");
            (format!("vm/{name}.yaml"), vm(&name, node, base + n))
        })
        .collect()
}

async fn world() -> World {
    let config = SimConfig {
        seed: Seed::realistic_3node().with_task_time_scale(0.05),
        task_duration: Duration::from_millis(50),
        ..SimConfig::default()
    };
    World::start_config(&[], config).await
}

fn agent(
    world: &World,
    pmxcfs: &Pmxcfs,
    repo: &TestRepo,
    node: &str,
    rollout: &str,
) -> AgentProcess {
    let dir = world.dir.path();
    let toml = world
        .agent_toml()
        .node(node)
        .state_dir(dir.join(format!("state-{node}")))
        .source(&repo.url())
        .poll("1s")
        .raw(&pmxcfs.toml("1s"))
        .raw(rollout);
    AgentProcess::spawn(&toml, &dir.join(format!("agent-{node}.toml")), "info")
}

fn rollout_toml(bake: &str, wave_timeout: &str) -> String {
    format!(
        "[rollout]\nwaves = [[\"pve3\"], [\"pve1\", \"pve2\"]]\nbake = \"{bake}\"\n\
         wave_timeout = \"{wave_timeout}\"\n"
    )
}

/// Writes (anything but GET) the simulator saw under `/nodes/<node>/`, with their sequence
/// numbers.
fn writes_on(world: &World, node: &str) -> Vec<(u64, String)> {
    let prefix = format!("/nodes/{node}/");
    world
        .requests()
        .iter()
        .filter(|r| r.method != "GET" && r.path.starts_with(&prefix))
        .map(|r| (r.seq, format!("{} {}", r.method, r.path)))
        .collect()
}

/// Polls `agent`'s `/api/v1/status` until `done`; panics with `what`, the last status and
/// the status files of the stand-in.
async fn until(
    agent: &AgentProcess,
    pmxcfs: &Pmxcfs,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + PATIENCE;
    let mut last = None;
    loop {
        if let Some(status) = agent.status().await {
            if done(&status) {
                return status;
            }
            last = Some(status);
        }
        assert!(
            Instant::now() < deadline,
            "{what}; the last status: {last:#?}\npublished: {:#?}",
            NODES.map(|n| pmxcfs.status_file(n))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn held(status: &serde_json::Value) -> &str {
    status["writes"]["held"].as_str().unwrap_or_default()
}

fn applied(status: &serde_json::Value) -> Option<&str> {
    status["last_applied"]["commit"].as_str()
}

fn time(value: &serde_json::Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(value.as_str().unwrap_or_else(|| panic!("no time: {value}")))
        .unwrap()
        .with_timezone(&Utc)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_second_wave_writes_nothing_until_the_first_baked_and_skips_it_once_its_agent_is_down()
{
    let world = world().await;
    let pmxcfs = Pmxcfs::new(Duration::from_secs(120));
    let repo = TestRepo::new();
    let files = one_vm_per_node(300);
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    let first = repo.commit_files(&refs, "one VM per node");
    let rollout = rollout_toml("3s", "8s");
    let mut agents: Vec<AgentProcess> = NODES
        .iter()
        .map(|node| agent(&world, &pmxcfs, &repo, node, &rollout))
        .collect();
    let [pve1, pve2, pve3] = [0, 1, 2];

    // pve3 (wave 1) applies at once; while it bakes, pve1 and pve2 say so and write nothing.
    let baking = until(&agents[pve1], &pmxcfs, "pve1 waits for pve3's bake", |s| {
        held(s).starts_with("wave 2 waits for pve3 (wave 1) (bake until ")
    })
    .await;
    assert_eq!(baking["rollout"]["decision"], "wait", "{baking:#}");
    assert_eq!(baking["rollout"]["wave"], 2, "{baking:#}");
    assert!(baking["writes"]["next_allowed"].is_string(), "{baking:#}");
    assert!(!writes_on(&world, "pve3").is_empty(), "pve3 applied first");
    for node in ["pve1", "pve2"] {
        assert_eq!(
            writes_on(&world, node),
            Vec::new(),
            "{node} wrote before pve3 baked"
        );
    }
    let pve3_status = until(&agents[pve3], &pmxcfs, "pve3 applied", |s| {
        applied(s) == Some(&first)
    })
    .await;
    assert!(
        pve3_status["rollout"]["healthy_since"].is_string(),
        "{pve3_status:#}"
    );

    // Once pve3 has baked, both apply; their first write comes after pve3's last, and their
    // applying pass began after pve3's healthy_since + bake (the agents' own records).
    let mut statuses = Vec::new();
    for index in [pve1, pve2] {
        statuses.push(
            until(&agents[index], &pmxcfs, "the second wave applies", |s| {
                applied(s) == Some(&first)
            })
            .await,
        );
    }
    let pve3_last = writes_on(&world, "pve3").last().unwrap().0;
    let published = pmxcfs.status_file("pve3").unwrap();
    let baked = time(&published["rollout"]["healthy_since"]) + chrono::Duration::seconds(3);
    for (node, status) in ["pve1", "pve2"].iter().zip(&statuses) {
        let writes = writes_on(&world, node);
        assert!(!writes.is_empty(), "{node} applied without writing?");
        assert!(
            writes[0].0 > pve3_last,
            "{node}: {writes:?} before pve3's #{pve3_last}"
        );
        assert!(
            time(&status["rollout"]["proceeded_at"]) >= baked,
            "{node} proceeded before pve3 baked: {status:#}\npve3: {published:#}"
        );
        assert_eq!(status["rollout"]["decision"], "proceed", "{status:#}");
        assert_eq!(status["writes"]["allowed"], true, "{status:#}");
    }

    // pve3's agent stops: a new commit waits for it, then skips it after wave_timeout.
    agents[pve3].terminate();
    let before = world.requests().last().map_or(0, |r| r.seq);
    let mut files = one_vm_per_node(300);
    files.extend(one_vm_per_node(310));
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    let second = repo.commit_files(&refs, "a second VM per node");
    let waiting = until(
        &agents[pve1],
        &pmxcfs,
        "pve1 waits for the stopped pve3",
        |s| {
            s["rollout"]["commit"].as_str() == Some(second.as_str())
                && held(s).contains("waits for pve3")
        },
    )
    .await;
    assert!(
        writes_on(&world, "pve1")
            .iter()
            .all(|(seq, _)| *seq <= before),
        "pve1 wrote the second commit at once: {waiting:#}"
    );
    for index in [pve1, pve2] {
        let status = until(&agents[index], &pmxcfs, "the second wave skips pve3", |s| {
            applied(s) == Some(&second)
        })
        .await;
        let skipped = status["rollout"]["skipped"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            skipped,
            [serde_json::json!(
                "wave 1 node pve3 skipped: stale (no recent heartbeat) past wave_timeout 8s"
            )],
            "{status:#}"
        );
        let first_seen = time(&status["rollout"]["first_seen"]);
        assert!(
            time(&status["rollout"]["proceeded_at"]) >= first_seen + chrono::Duration::seconds(8),
            "proceeded before wave_timeout: {status:#}"
        );
        let log = agents[index].log_text();
        assert!(log.contains("wave 1 node pve3 skipped"), "{log}");
    }
    assert!(
        writes_on(&world, "pve3")
            .iter()
            .all(|(seq, _)| *seq <= before),
        "nobody wrote for the stopped pve3"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_action_on_the_first_wave_halts_the_second_with_the_wave_and_node_named() {
    let world = world().await;
    world
        .sim
        .control()
        .fail_requests(HttpFault {
            pattern: "^/nodes/pve3/qemu$".into(),
            method: Some("POST".into()),
            status: 500,
            message: Some("injected: storage local-lvm offline".into()),
            times: None,
            probability: None,
        })
        .unwrap();
    let pmxcfs = Pmxcfs::new(Duration::from_secs(120));
    let repo = TestRepo::new();
    let files = one_vm_per_node(400);
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    let commit = repo.commit_files(&refs, "one VM per node");
    let rollout = rollout_toml("2s", "10m");
    let agents: Vec<AgentProcess> = NODES
        .iter()
        .map(|node| agent(&world, &pmxcfs, &repo, node, &rollout))
        .collect();
    let expected = format!(
        "rollout halted: wave 1 node pve3 failed: 1 action(s) failed applying {}",
        &commit[..12]
    );
    for (index, node) in [(0, "pve1"), (1, "pve2")] {
        let status = until(&agents[index], &pmxcfs, "halted by pve3", |s| {
            held(s) == expected
        })
        .await;
        assert_eq!(status["rollout"]["decision"], "halt", "{status:#}");
        assert_eq!(status["rollout"]["halted"], expected.as_str(), "{status:#}");
        // A finished held pass records its create skipped with the halt as the reason (the
        // last attempted pass may still be running: poll for one that ended).
        let deadline = Instant::now() + PATIENCE;
        loop {
            let status = agents[index].status().await.unwrap_or_default();
            let id = status["last_attempted"]["id"].as_i64().unwrap_or_default();
            let detail = agents[index].get(&format!("/api/v1/passes/{id}")).await;
            let actions = detail["actions"].as_array().cloned().unwrap_or_default();
            let halted = actions.iter().any(|a| {
                a["verb"] == "create"
                    && a["result"] == "skipped"
                    && a["error"].as_str().is_some_and(|e| e.contains(&expected))
            });
            if halted {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{node}: no create held by the halt: {detail:#}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Its published status says so to the rest of the cluster (by the next heartbeat).
        let deadline = Instant::now() + PATIENCE;
        loop {
            let published = pmxcfs.status_file(node);
            let said = published.as_ref().and_then(|p| p["held"].as_str());
            if said == Some(expected.as_str()) {
                assert_eq!(published.unwrap()["rollout"]["decision"], "halt");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{node} never published the halt: {published:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(
        world
            .requests()
            .iter()
            .any(|r| r.method == "POST" && r.path == "/nodes/pve3/qemu" && r.status == 500),
        "pve3 tried and failed"
    );
    for node in ["pve1", "pve2"] {
        assert_eq!(
            writes_on(&world, node),
            Vec::new(),
            "{node} wrote despite the halt"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_first_wave_node_in_ha_maintenance_is_waited_for_then_skipped_after_wave_timeout() {
    let world = world().await;
    assert!(world.sim.control().set_ha_maintenance("pve3", true));
    let pmxcfs = Pmxcfs::new(Duration::from_secs(120));
    let repo = TestRepo::new();
    let files = one_vm_per_node(500);
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    let commit = repo.commit_files(&refs, "one VM per node");
    let rollout = rollout_toml("2s", "6s");
    let agents: Vec<AgentProcess> = NODES
        .iter()
        .map(|node| agent(&world, &pmxcfs, &repo, node, &rollout))
        .collect();

    // pve1 waits for pve3, saying it is in HA maintenance, and writes nothing meanwhile.
    let waiting = until(
        &agents[0],
        &pmxcfs,
        "pve1 waits for pve3 in maintenance",
        |s| held(s).starts_with("wave 2 waits for pve3 (wave 1): in HA maintenance; skipped at "),
    )
    .await;
    assert_eq!(waiting["rollout"]["decision"], "wait", "{waiting:#}");
    assert_eq!(writes_on(&world, "pve1"), Vec::new(), "{waiting:#}");

    for index in [0, 1] {
        let status = until(&agents[index], &pmxcfs, "the second wave skips pve3", |s| {
            applied(s) == Some(&commit)
        })
        .await;
        assert_eq!(
            status["rollout"]["skipped"],
            serde_json::json!(["wave 1 node pve3 skipped: in HA maintenance past wave_timeout 6s"]),
            "{status:#}"
        );
        let first_seen = time(&status["rollout"]["first_seen"]);
        assert!(
            time(&status["rollout"]["proceeded_at"]) >= first_seen + chrono::Duration::seconds(6),
            "proceeded before wave_timeout: {status:#}"
        );
        let log = agents[index].log_text();
        assert!(log.contains("wave 1 node pve3 skipped"), "{log}");
    }
    // pve3's own agent kept running and publishing, and held its writes for the maintenance.
    let published = pmxcfs.status_file("pve3").expect("pve3 publishes");
    assert_ne!(
        published["applied_revision"],
        commit.as_str(),
        "{published:#}"
    );
    assert_eq!(
        writes_on(&world, "pve3"),
        Vec::new(),
        "pve3 wrote in maintenance"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_first_wave_vm_whose_guest_agent_does_not_answer_halts_the_second_wave_naming_it() {
    let world = world().await;
    let pmxcfs = Pmxcfs::new(Duration::from_secs(120));
    let repo = TestRepo::new();
    let mut files = one_vm_per_node(500);
    // pve3's VM is declared running, with the QEMU guest agent on.
    let app = vm("app-pve3", "pve3", 510).replace("state: stopped", "state: started")
        + "  options: {agent: true}\n";
    files.push(("vm/app-pve3.yaml".to_owned(), app));
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    let commit = repo.commit_files(&refs, "one VM per node and a running app on pve3");
    // A long bake: pve3's first pass may ping before the agent is stopped below; the pings of
    // its later passes on the same revision must then turn it unhealthy before the bake ends.
    let rollout = rollout_toml("10m", "10m") + "health = \"guest-agent\"\n";
    let agents: Vec<AgentProcess> = NODES
        .iter()
        .map(|node| agent(&world, &pmxcfs, &repo, node, &rollout))
        .collect();
    // Stop the guest agent inside VM 510 as soon as pve3 has created it.
    let deadline = Instant::now() + PATIENCE;
    while !world.sim.control().set_guest_agent_running(510, false) {
        assert!(Instant::now() < deadline, "pve3 never created VM 510");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let why = "guest agent of VM/app-pve3 (vmid 510) did not answer";
    let prefix = format!(
        "rollout halted: wave 1 node pve3 failed: unhealthy on {}: {why}",
        &commit[..12]
    );
    for (index, node) in [(0, "pve1"), (1, "pve2")] {
        let status = until(
            &agents[index],
            &pmxcfs,
            "halted by pve3's guest agent",
            |s| held(s).starts_with(&prefix),
        )
        .await;
        assert_eq!(status["rollout"]["decision"], "halt", "{node}: {status:#}");
        assert!(
            held(&status).contains("QEMU guest agent is not running"),
            "{node}: PVE's reason is kept: {status:#}"
        );
    }
    assert!(
        world.requests().iter().any(|r| r.method == "POST"
            && r.path == "/nodes/pve3/qemu/510/agent/ping"
            && r.status == 500),
        "pve3 pinged the guest agent of the VM it started"
    );
    for node in ["pve1", "pve2"] {
        assert_eq!(
            writes_on(&world, node),
            Vec::new(),
            "{node} wrote despite the halt"
        );
    }
}
