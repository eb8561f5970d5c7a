//! Issue 22, end to end: cluster mode on pmxcfs with the real agent binary, three agents
//! (pve1, pve2, pve3) on one simulated cluster (`Seed::realistic_3node`, whose NFS storage
//! `nas` PVE reports as shared), sharing the pmxcfs stand-in (`support::pmxcfs`) as their
//! `/etc/pve`.
//!
//! - every node's cluster page, `/api/v1/cluster` and `proxops status --cluster` show all
//!   three with the same commit; a stopped agent is shown stale after three heartbeats;
//! - a new ISO on `nas` declared on all three nodes reaches PVE as exactly one
//!   download-url request (the simulator's request log), and all three record it present;
//! - the stand-in read-only (no quorum): passes go on, the cluster view says unknown, and
//!   says ok again once quorum is back;
//! - a lock left by a holder that died is taken over once pmxcfs expires it.

use std::path::Path;
use std::time::{Duration, Instant};

use proxops_pve_sim::{Seed, SimConfig};

use crate::git_server::TestRepo;
use crate::sim::World;
use crate::support::agent::AgentProcess;
use crate::support::pmxcfs::Pmxcfs;

const NODES: [&str; 3] = ["pve1", "pve2", "pve3"];
const PATIENCE: Duration = Duration::from_secs(60);

/// An ISO on the shared storage `nas`, declared on `nodes`.
fn shared_iso(name: &str, nodes: &[&str], url: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: ISO\nmetadata:\n  name: {name}\nspec:\n  nodes: [{}]\n  storage: nas\n  filename: {name}.iso\n  url: {url}\n",
        nodes.join(", ")
    )
}

/// The realistic three-node cluster; a download takes `download` so that every agent plans
/// its own before the first one ends.
async fn world(download: Duration) -> World {
    let mut config = SimConfig {
        seed: Seed::realistic_3node(),
        task_duration: Duration::from_millis(50),
        ..SimConfig::default()
    };
    config
        .task_durations
        .insert("download".to_owned(), download);
    World::start_config(
        &[
            ("installer.iso", b"installer bytes".as_slice()),
            ("rescue.iso", b"rescue bytes".as_slice()),
        ],
        config,
    )
    .await
}

fn agent(world: &World, pmxcfs: &Pmxcfs, repo: &TestRepo, node: &str, poll: &str) -> AgentProcess {
    let dir = world.dir.path();
    let toml = world
        .agent_toml()
        .node(node)
        .state_dir(dir.join(format!("state-{node}")))
        .source(&repo.url())
        .poll(poll)
        .raw(&pmxcfs.toml("1s"));
    AgentProcess::spawn(&toml, &dir.join(format!("agent-{node}.toml")), "info")
}

/// Polls `done` until it holds; panics with `what` and the last value after [`PATIENCE`].
async fn eventually<T: std::fmt::Debug>(
    what: &str,
    mut probe: impl AsyncFnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let value = probe().await;
        if done(&value) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{what}; the last value: {value:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn node_states(view: &serde_json::Value) -> Vec<(String, String, String)> {
    view["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            (
                n["node"].as_str().unwrap_or_default().to_owned(),
                n["state"].as_str().unwrap_or_default().to_owned(),
                n["status"]["applied_revision"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

fn all_applied(view: &serde_json::Value, commit: &str) -> bool {
    view["state"] == "ok"
        && node_states(view)
            == NODES
                .iter()
                .map(|n| ((*n).to_owned(), "ok".to_owned(), commit.to_owned()))
                .collect::<Vec<_>>()
}

/// `proxops status --cluster [--json]`: its stdout, after checking it succeeded.
fn cli_cluster(agent: &AgentProcess, json: bool) -> (bool, String) {
    let mut args = vec!["status", "--cluster"];
    if json {
        args.push("--json");
    }
    let out = agent.cli(&args).output().unwrap();
    assert!(
        out.status.success(),
        "proxops status --cluster failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn download_requests(world: &World) -> Vec<String> {
    world
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/download-url"))
        .map(|r| r.path.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn three_agents_show_one_cluster_download_a_shared_iso_once_and_a_stopped_one_turns_stale() {
    let world = world(Duration::from_secs(3)).await;
    let pmxcfs = Pmxcfs::new(Duration::from_secs(120));
    let repo = TestRepo::new();
    let url = format!("{}/installer.iso", world.files_url);
    let head = repo.commit_files(
        &[("iso/installer.yaml", &shared_iso("installer", &NODES, &url))],
        "installer ISO on the shared NFS storage",
    );
    let mut agents: Vec<AgentProcess> = NODES
        .iter()
        .map(|node| agent(&world, &pmxcfs, &repo, node, "1h"))
        .collect();

    // Every agent applies the commit: the one that took the lock downloads, the others wait
    // for it and then find the file on the shared storage.
    for agent in &agents {
        agent
            .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(head.as_str()))
            .await;
    }
    assert_eq!(
        download_requests(&world).len(),
        1,
        "exactly one download-url reaches PVE: {:?}",
        download_requests(&world)
    );
    assert!(
        world
            .listing("pve2", "nas", "iso")
            .await
            .contains(&"nas:iso/installer.iso".to_owned())
    );
    let mut found_present = 0;
    for agent in &agents {
        let status = agent.status().await.unwrap();
        let id = status["last_applied"]["id"].as_i64().unwrap();
        let detail = agent.get(&format!("/api/v1/passes/{id}")).await;
        let actions = detail["actions"].as_array().unwrap();
        let download: Vec<_> = actions.iter().filter(|a| a["verb"] == "download").collect();
        assert_eq!(download.len(), 1, "{actions:#?}");
        assert_eq!(download[0]["result"], "succeeded", "{actions:#?}");
        if download[0]["upid"].is_null() {
            assert!(
                download[0]["exitstatus"]
                    .as_str()
                    .unwrap()
                    .contains("another node downloaded it"),
                "{actions:#?}"
            );
            found_present += 1;
        }
    }
    assert_eq!(
        found_present, 2,
        "two agents recorded the file present without a request"
    );
    assert!(
        pmxcfs.locks().is_empty(),
        "every lock is released: {:?}",
        pmxcfs.locks()
    );

    // Each node's page, API and CLI show all three with the same commit.
    for agent in &agents {
        eventually(
            "every node's /api/v1/cluster shows all three with the commit",
            async || agent.get("/api/v1/cluster").await,
            |view| all_applied(view, &head),
        )
        .await;
        let (code, page) = agent.get_text("/ui/cluster").await;
        assert_eq!(code, 200);
        for node in NODES {
            assert!(
                page.contains(&format!("<tr data-node=\"{node}\">")),
                "{page}"
            );
        }
        assert_eq!(
            page.matches(&format!("title=\"{head}\">{}</code>", &head[..7]))
                .count(),
            6,
            "applied and attempted of three nodes: {page}"
        );
        let (overview_code, overview) = agent.get_text("/").await;
        assert_eq!(overview_code, 200);
        assert!(overview.contains("href=\"/ui/cluster\""));
        let (ok, json) = cli_cluster(agent, true);
        assert!(ok, "{json}");
        let view: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert!(all_applied(&view, &head), "{view:#}");
        let (ok, table) = cli_cluster(agent, false);
        assert!(ok, "{table}");
        assert!(table.starts_with("cluster view ok\n"), "{table}");
        for node in NODES {
            let row = table
                .lines()
                .find(|l| l.starts_with(node))
                .unwrap_or_else(|| panic!("no row for {node}: {table}"));
            assert!(row.contains(" ok ") && row.contains(&head[..7]), "{table}");
        }
    }
    // The page in a real browser (skipped without chromium, as tests/it/ui.rs does).
    if let Some(browser) = crate::ui::chromium() {
        let profile = tempfile::tempdir().unwrap();
        let url = agents[1].url("/ui/cluster");
        let dom = crate::ui::dump_dom(&browser, profile.path(), &url, "cluster").await;
        for node in NODES {
            assert!(dom.contains(&format!("<tr data-node=\"{node}\">")), "{dom}");
        }
        assert!(dom.contains(&head[..7]), "{dom}");
        crate::ui::screenshots(&browser, profile.path(), &url, "cluster", false).await;
    }
    let file = pmxcfs.status_file("pve2").unwrap();
    assert_eq!(file["format"], 1);
    assert_eq!(file["applied_revision"], head.as_str());
    assert_eq!(file["outcome"], "applied");

    // pve3's agent stops: after three heartbeats (1 s each) the others show it stale.
    agents[2].terminate();
    for agent in &agents[..2] {
        let view = eventually(
            "pve3 is shown stale once its heartbeat is older than three intervals",
            async || agent.get("/api/v1/cluster").await,
            |view| {
                node_states(view)
                    .iter()
                    .map(|(n, s, _)| (n.as_str(), s.as_str()))
                    .collect::<Vec<_>>()
                    == [("pve1", "ok"), ("pve2", "ok"), ("pve3", "stale")]
            },
        )
        .await;
        assert!(
            view["nodes"][2]["heartbeat_age_secs"].as_u64().unwrap() >= 3,
            "{view:#}"
        );
    }
    let (_, table) = cli_cluster(&agents[0], false);
    let row = table.lines().find(|l| l.starts_with("pve3")).unwrap();
    assert!(row.contains(" stale "), "{table}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_quorum_passes_go_on_and_the_cluster_view_says_unknown() {
    let world = world(Duration::from_millis(200)).await;
    let mut pmxcfs = Pmxcfs::new(Duration::from_secs(120));
    let repo = TestRepo::new();
    let installer = shared_iso(
        "installer",
        &["pve1"],
        &format!("{}/installer.iso", world.files_url),
    );
    let first = repo.commit_files(&[("iso/installer.yaml", &installer)], "installer ISO");
    let agent = agent(&world, &pmxcfs, &repo, "pve1", "1s");
    eventually(
        "pve1 publishes the first commit",
        async || pmxcfs.status_file("pve1"),
        |f| {
            f.as_ref()
                .is_some_and(|f| f["applied_revision"] == first.as_str())
        },
    )
    .await;

    pmxcfs.lose_quorum();
    let rescue = shared_iso(
        "rescue",
        &["pve1"],
        &format!("{}/rescue.iso", world.files_url),
    );
    let second = repo.commit_files(&[("iso/rescue.yaml", &rescue)], "rescue ISO");
    // The pass is not blocked: the ISO is downloaded (without the cluster lock, after
    // looking at the storage again) and the commit applied.
    agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(second.as_str()))
        .await;
    assert!(
        world
            .listing("pve1", "nas", "iso")
            .await
            .contains(&"nas:iso/rescue.iso".to_owned())
    );
    let view = eventually(
        "the agent's cluster view says unknown without quorum",
        async || agent.get("/api/v1/cluster").await,
        |v| v["state"] == "unknown",
    )
    .await;
    assert!(
        view["reason"].as_str().unwrap().contains("read-only"),
        "{view:#}"
    );
    let (ok, json) = cli_cluster(&agent, true);
    assert!(ok, "{json}");
    let cli: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(cli["state"], "unknown", "{cli:#}");
    let (_, page) = agent.get_text("/ui/cluster").await;
    assert!(
        page.contains("<span class=\"badge neutral\">unknown</span>"),
        "{page}"
    );
    // The file still says what was published before quorum was lost.
    assert_eq!(
        pmxcfs.status_file("pve1").unwrap()["applied_revision"],
        first.as_str()
    );
    assert!(
        agent
            .log_text()
            .contains("cluster status file not published")
    );

    pmxcfs.regain_quorum();
    eventually(
        "with quorum back the view is ok and the file says the second commit",
        async || {
            (
                agent.get("/api/v1/cluster").await,
                pmxcfs.status_file("pve1"),
            )
        },
        |(v, f)| {
            v["state"] == "ok"
                && f.as_ref()
                    .is_some_and(|f| f["applied_revision"] == second.as_str())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_download_lock_left_by_a_dead_holder_is_taken_over_once_pmxcfs_expires_it() {
    let world = world(Duration::from_millis(200)).await;
    let pmxcfs = Pmxcfs::new(Duration::from_secs(2));
    let repo = TestRepo::new();
    let url = format!("{}/installer.iso", world.files_url);
    let head = repo.commit_files(
        &[(
            "iso/installer.yaml",
            &shared_iso("installer", &["pve2"], &url),
        )],
        "installer ISO",
    );
    // A holder made every download lock it could and died; nobody refreshes them.
    let names = stale_locks(&pmxcfs.lock_dir(), "nas", "nas:iso/installer.iso");
    let agent = agent(&world, &pmxcfs, &repo, "pve2", "1h");
    agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(head.as_str()))
        .await;
    assert_eq!(download_requests(&world).len(), 1);
    assert!(
        agent
            .log_text()
            .contains("waiting for a cluster lock another node holds")
    );
    assert!(
        pmxcfs.locks().iter().all(|l| !names.contains(l)),
        "{:?}",
        pmxcfs.locks()
    );
}

/// Makes the lock directory the agent will ask for (`proxops-download-<storage>-<hash>`).
fn stale_locks(lock_dir: &Path, storage: &str, volid: &str) -> Vec<String> {
    use sha2::Digest as _;
    let hash = hex::encode(sha2::Sha256::digest(volid.as_bytes()));
    let name = format!("proxops-download-{storage}-{}", &hash[..16]);
    std::fs::create_dir(lock_dir.join(&name)).unwrap();
    vec![name]
}
