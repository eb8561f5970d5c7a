//! The agent end to end: a real git server (git daemon on 127.0.0.1), the simulator, the
//! built `proxops agent` as a child process, webhooks signed as the forges sign them, and the
//! status API read over HTTP.

use std::time::{Duration, Instant};

use crate::git_server::{GitDaemon, TestRepo};
use crate::sim::{World, artifact};
use crate::support::agent::{AgentProcess, AgentToml, webhook_signature};

const SECRET: &str = "webhook-secret-for-tests";
const ISO: &[u8] = b"installer bytes";

/// An agent of `world` following `repo` over git:// (served while the returned daemon lives),
/// with webhooks signed with [`SECRET`]: `configure` adjusts the defaults (node `pve1`, poll
/// every hour); config, state directory and log are named after the node. Returns once the
/// first pass is recorded.
pub(crate) async fn start_agent(
    world: &World,
    repo: &TestRepo,
    configure: impl FnOnce(AgentToml) -> AgentToml,
) -> (AgentProcess, GitDaemon) {
    let daemon = repo.serve();
    let dir = world.dir.path();
    let toml = configure(
        world
            .agent_toml()
            .source(&daemon.url("origin.git"))
            .webhook_secret(SECRET),
    );
    let node = toml.node_name().to_owned();
    let toml = toml.state_dir(dir.join(format!("state-{node}")));
    let agent = AgentProcess::spawn(&toml, &dir.join(format!("agent-{node}.toml")), "info");
    agent.wait_for(|s| s["last_attempted"].is_object()).await;
    (agent, daemon)
}

/// Delivers a push webhook as `provider` sends it; the answer's status code.
async fn deliver(
    agent: &AgentProcess,
    provider: &str,
    body: &str,
    signature: Option<String>,
) -> u16 {
    let mut request = agent
        .http
        .post(agent.url(&format!("/hooks/{provider}")))
        .header("content-type", "application/json")
        .body(body.to_owned());
    let (event, sig) = match provider {
        "github" => ("X-GitHub-Event", "X-Hub-Signature-256"),
        "gitea" => ("X-Gitea-Event", "X-Gitea-Signature"),
        _ => ("X-Forgejo-Event", "X-Forgejo-Signature"),
    };
    request = request.header(event, "push");
    if let Some(signature) = signature {
        request = request.header(sig, signature);
    }
    request.send().await.unwrap().status().as_u16()
}

fn sign(body: &str) -> String {
    webhook_signature(SECRET, body.as_bytes())
}

fn push_body(branch: &str) -> String {
    // The commit ids in a payload are never used: the agent applies what git fetch finds.
    format!(
        r#"{{"ref":"refs/heads/{branch}","after":"0000000000000000000000000000000000000000","commits":[]}}"#
    )
}

pub(crate) fn commit_of(status: &serde_json::Value, which: &str) -> Option<String> {
    status[which]["commit"].as_str().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signed_push_webhook_gets_the_new_commit_applied_and_a_bad_signature_does_nothing() {
    let world = World::start(&[("a.iso", ISO), ("b.iso", ISO)]).await;
    let repo = TestRepo::new();
    let a = artifact(
        "ISO",
        "a",
        &["pve1"],
        "a.iso",
        &format!("{}/a.iso", world.files_url),
        None,
    );
    let first = repo.commit_files(&[("iso/a.yaml", &a)], "first ISO");
    let (agent, _daemon) = start_agent(&world, &repo, |t| t).await;
    let status = agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(first.as_str()))
        .await;
    assert_eq!(status["last_attempted"]["outcome"], "applied");
    assert!(
        world
            .listing("pve1", "local", "iso")
            .await
            .contains(&"local:iso/a.iso".to_owned())
    );

    for (provider, file) in [("github", "b"), ("gitea", "c"), ("forgejo", "d")] {
        let manifest = artifact(
            "ISO",
            file,
            &["pve1"],
            "b.iso",
            &format!("{}/b.iso", world.files_url),
            None,
        )
        .replace("filename: b.iso", &format!("filename: {file}.iso"));
        let manifest = manifest.replace(
            &format!("{}/{file}.iso", world.files_url),
            &format!("{}/b.iso", world.files_url),
        );
        let commit = repo.commit_files(&[(&format!("iso/{file}.yaml"), &manifest)], "another ISO");
        // Each push has a body of its own, as forges send (`after` differs): the same body on
        // another endpoint is a replay since the replay guard keys on the body alone.
        let body = push_body("main").replace(&"0".repeat(40), &commit);
        let signature = if provider == "github" {
            format!("sha256={}", sign(&body))
        } else {
            sign(&body)
        };
        assert_eq!(
            deliver(&agent, provider, &body, Some(signature)).await,
            202,
            "{provider}"
        );
        let status = agent
            .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(commit.as_str()))
            .await;
        assert_eq!(status["last_applied"]["trigger"], "webhook", "{provider}");
    }

    let passes_before = agent
        .get("/api/v1/revisions")
        .await
        .as_array()
        .unwrap()
        .len();
    let body = push_body("main");
    assert_eq!(
        deliver(&agent, "github", &body, Some("sha256=00".into())).await,
        401
    );
    assert_eq!(deliver(&agent, "github", &body, None).await, 401);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        agent
            .get("/api/v1/revisions")
            .await
            .as_array()
            .unwrap()
            .len(),
        passes_before
    );

    let metrics = agent
        .http
        .get(agent.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("proxops_passes_total{outcome=\"applied\"}"),
        "{metrics}"
    );
    assert!(!metrics.contains(SECRET) && !metrics.contains("proxops-dev-secret"));
    let go_status = agent.get("/status").await;
    assert!(go_status["last_cycle"]["commit"].is_string());
    assert!(!go_status.to_string().contains(SECRET));

    let mut agent = agent;
    let exit = agent.terminate();
    assert!(exit.success(), "SIGTERM is a clean exit: {exit:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_commit_is_recorded_with_its_diagnostics_and_the_last_applied_revision_stays() {
    let world = World::start(&[("a.iso", ISO)]).await;
    let repo = TestRepo::new();
    let a = artifact(
        "ISO",
        "a",
        &["pve1"],
        "a.iso",
        &format!("{}/a.iso", world.files_url),
        None,
    );
    let good = repo.commit_files(&[("iso/a.yaml", &a)], "good");
    let (agent, _daemon) = start_agent(&world, &repo, |t| t).await;
    agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(good.as_str()))
        .await;

    let bad = repo.commit_files(&[("iso/b.yaml", "apiVersion: proxops/v1alpha1\nkind: ISO\nmetadata: {name: b}\nspec: {nodes: [pve1], storage: local, filename: b.iso, url: ftp://x/b.iso}\n")], "bad");
    world.sim.control().clear_requests();
    let body = push_body("main");
    assert_eq!(
        deliver(
            &agent,
            "github",
            &body,
            Some(format!("sha256={}", sign(&body)))
        )
        .await,
        202
    );
    let status = agent
        .wait_for(|s| {
            // The attempt is listed when the pass starts; its outcome when it ends.
            commit_of(s, "last_attempted").as_deref() == Some(bad.as_str())
                && s["last_attempted"]["outcome"].is_string()
        })
        .await;
    assert_eq!(status["last_attempted"]["outcome"], "invalid");
    assert_eq!(
        commit_of(&status, "last_applied").as_deref(),
        Some(good.as_str())
    );
    assert!(
        world.writes().is_empty(),
        "an invalid revision writes nothing: {:?}",
        world.writes()
    );
    let mut agent = agent;
    assert!(agent.terminate().success());
}

fn download_posts(world: &World) -> usize {
    world
        .writes()
        .iter()
        .filter(|r| r.endpoint.ends_with("/download-url"))
        .count()
}

async fn wait_for_download_post(world: &World) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while download_posts(world) == 0 {
        assert!(
            Instant::now() < deadline,
            "the agent never started the download"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An agent whose first pass is waiting for a 4 s download of one ISO (simulated task time).
async fn agent_mid_download() -> (World, TestRepo, AgentProcess, GitDaemon, String) {
    let world = World::start_with(&[("a.iso", ISO)], Duration::from_secs(4)).await;
    let repo = TestRepo::new();
    let a = artifact(
        "ISO",
        "a",
        &["pve1"],
        "a.iso",
        &format!("{}/a.iso", world.files_url),
        None,
    );
    let commit = repo.commit_files(&[("iso/a.yaml", &a)], "one ISO");
    let (agent, daemon) = start_agent(&world, &repo, |t| t).await;
    wait_for_download_post(&world).await;
    wait_for_recorded_task(&world).await;
    (world, repo, agent, daemon, commit)
}

/// Waits until the store holds the UPID of a running action: PVE has answered and the agent
/// has written the answer down, so a kill from now on leaves a task to re-attach to (a kill
/// between the two is the window RELIABILITY.md names; this test is about re-attaching).
async fn wait_for_recorded_task(world: &World) {
    let database = world.dir.path().join("state-pve1/state.db");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let running: i64 = rusqlite::Connection::open_with_flags(
            &database,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .and_then(|db| {
            db.query_row(
                "SELECT count(*) FROM actions WHERE upid IS NOT NULL AND result IS NULL",
                [],
                |row| row.get(0),
            )
        })
        .unwrap_or(0);
        if running > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the agent never recorded the download's task"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn after_kill_9_during_a_download_the_agent_reattaches_and_never_downloads_twice() {
    let (world, _repo, mut agent, _daemon, commit) = agent_mid_download().await;
    agent.kill9();

    agent.respawn();
    let status = agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(commit.as_str()))
        .await;
    assert_eq!(
        download_posts(&world),
        1,
        "the restarted agent re-attached instead of re-issuing"
    );
    assert!(
        world
            .listing("pve1", "local", "iso")
            .await
            .contains(&"local:iso/a.iso".to_owned())
    );
    let revisions = agent.get("/api/v1/revisions").await;
    let outcomes: Vec<&str> = revisions
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["outcome"].as_str())
        .collect();
    assert!(
        outcomes.contains(&"interrupted"),
        "the killed pass is recorded as interrupted: {outcomes:?}"
    );
    assert!(status["last_applied"]["outcome"].is_string());
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_mid_pass_exits_cleanly_and_records_the_pass_as_interrupted() {
    let (_world, _repo, mut agent, _daemon, commit) = agent_mid_download().await;
    let exit = agent.terminate();
    assert!(exit.success(), "{exit:?}");

    // No agent answers now: `proxops status` reads the database read-only.
    let status = agent.cli_json("status");
    assert_eq!(
        status["last_attempted"]["outcome"], "interrupted",
        "{status}"
    );
    assert_eq!(
        status["last_attempted"]["commit"].as_str(),
        Some(commit.as_str())
    );
    assert!(status["last_applied"].is_null());
}

#[tokio::test(flavor = "multi_thread")]
async fn two_agents_scoped_to_two_nodes_each_apply_only_their_own_node() {
    let world = World::start(&[("a.iso", ISO)]).await;
    let repo = TestRepo::new();
    let a = artifact(
        "ISO",
        "a",
        &["pve1", "pve2"],
        "a.iso",
        &format!("{}/a.iso", world.files_url),
        None,
    );
    let commit = repo.commit_files(&[("iso/a.yaml", &a)], "on both nodes");
    let (mut first, _first_daemon) = start_agent(&world, &repo, |t| t).await;
    let (mut second, _second_daemon) = start_agent(&world, &repo, |t| t.node("pve2")).await;
    for agent in [&first, &second] {
        agent
            .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(commit.as_str()))
            .await;
    }
    let posts: Vec<String> = world
        .writes()
        .into_iter()
        .filter(|r| r.endpoint.ends_with("/download-url"))
        .map(|r| r.path)
        .collect();
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert!(posts.contains(&"/nodes/pve1/storage/local/download-url".to_owned()));
    assert!(posts.contains(&"/nodes/pve2/storage/local/download-url".to_owned()));
    assert_eq!(first.get("/api/v1/status").await["node"], "pve1");
    assert_eq!(second.get("/api/v1/status").await["node"], "pve2");
    assert!(first.terminate().success() && second.terminate().success());
}

/// Changes a guest's config through PVE's API, as an operator with a shell would.
async fn pve_put(world: &World, path: &str, form: &[(&str, &str)]) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let response = http
        .put(format!("{}{path}", world.sim.base_url()))
        .header(
            "Authorization",
            "PVEAPIToken=root@pam!proxops=proxops-dev-secret",
        )
        .form(form)
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn drift_found_on_a_poll_without_a_new_commit_is_recorded_then_resolved_after_correction() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let vm = "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: web-1\n  annotations:\n    proxops/drift: report\nspec:\n  node: pve1\n  vmid: 101\n  state: stopped\n  memory: 512MiB\n  cpu: {type: host, cores: 1}\n  disks: [{storage: local-lvm, size: 1GiB}]\n  networks: [{bridge: vmbr0}]\n";
    let commit = repo.commit_files(&[("vm/web-1.yaml", vm)], "one VM, drift reported only");
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s")).await;
    agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(commit.as_str()))
        .await;
    assert!(
        agent.get("/api/v1/drift").await["open"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Out of band, no new commit: the next poll finds it and records it (report only).
    pve_put(&world, "/nodes/pve1/qemu/101/config", &[("memory", "1024")]).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let finding = loop {
        let drift = agent.get("/api/v1/drift").await;
        if let Some(f) = drift["open"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["resource"] == "VM/web-1")
        {
            break f.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no drift finding recorded: {drift}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(finding["first_seen_commit"].as_str(), Some(commit.as_str()));
    assert!(finding.to_string().contains("memory"), "{finding}");

    // The operator puts it back: the finding is resolved on a later poll.
    pve_put(&world, "/nodes/pve1/qemu/101/config", &[("memory", "512")]).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let drift = agent.get("/api/v1/drift").await;
        let open = drift["open"].as_array().unwrap();
        let resolved = drift["resolved"].as_array().unwrap();
        if open.is_empty()
            && resolved
                .iter()
                .any(|f| f["resource"] == "VM/web-1" && f["resolved_at"].is_string())
        {
            break;
        }
        assert!(Instant::now() < deadline, "finding not resolved: {drift}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut agent = agent;
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_on_port_0_writes_the_address_it_bound_logs_it_and_status_reaches_it() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    repo.commit_files(&[("README.md", "no manifests yet\n")], "empty");
    let (mut agent, _daemon) = start_agent(&world, &repo, |t| t).await;
    let live = agent
        .wait_for(|s| s["last_attempted"]["outcome"].is_string())
        .await;

    let text = std::fs::read_to_string(agent.state_dir.join("http.addr")).unwrap();
    let addr: std::net::SocketAddr = text.strip_suffix('\n').expect("one line").parse().unwrap();
    assert_eq!(addr.ip().to_string(), "127.0.0.1", "{text}");
    assert_ne!(addr.port(), 0, "{text}");
    assert_eq!(agent.listening().await, addr);
    let started = agent
        .log_text()
        .lines()
        .find(|l| l.contains("agent started"))
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(started.contains(&format!("listen={addr}")), "{started}");

    // `proxops status` on the same config finds the agent through http.addr.
    let out = agent
        .cli(&["status", "--json"])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("reading the database"), "{stderr}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Only the running agent knows when it started; the database does not.
    assert!(status["process_start"].is_string(), "{status}");
    assert_eq!(status, live);
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn status_of_a_port_0_agent_that_never_started_names_the_address_file_it_lacks() {
    let world = World::start(&[]).await;
    let state = world.dir.path().join("state-never");
    let config = world
        .agent_toml()
        .state_dir(&state)
        .write(&world.dir.path().join("agent-never.toml"));
    let out = crate::support::proxops(&["status", "--config", config.to_str().unwrap()]);
    let stderr = crate::support::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "[http] listen has port 0 and {} cannot be read",
            state.join("http.addr").display()
        )),
        "{stderr}"
    );
}
