//! The agent end to end: a real git server (git daemon on 127.0.0.1), the simulator, the
//! built `proxops agent` as a child process, webhooks signed as the forges sign them, and the
//! status API read over HTTP.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hmac::{KeyInit, Mac};

use crate::git_server::{GitDaemon, TestRepo};
use crate::sim::{World, artifact};

const SECRET: &str = "webhook-secret-for-tests";
const ISO: &[u8] = b"installer bytes";

pub(crate) struct Agent {
    child: Child,
    pub(crate) config: std::path::PathBuf,
    pub(crate) listen: String,
    pub(crate) http: reqwest::Client,
    /// The git server; `None` once a test stopped it.
    pub(crate) daemon: Option<GitDaemon>,
    pub(crate) log: std::path::PathBuf,
}

impl Agent {
    async fn start(world: &World, repo: &TestRepo) -> Agent {
        Agent::start_on(world, repo, "pve1").await
    }

    /// An agent for `node`, with its own config, state directory, port and log.
    async fn start_on(world: &World, repo: &TestRepo, node: &str) -> Agent {
        Agent::start_polling(world, repo, node, "1h").await
    }

    /// As [`Agent::start_on`], polling every `poll`.
    pub(crate) async fn start_polling(
        world: &World,
        repo: &TestRepo,
        node: &str,
        poll: &str,
    ) -> Agent {
        Agent::start_with_policy(world, repo, node, poll, "").await
    }

    /// As [`Agent::start_polling`], with `policy` (TOML lines) added under `[policy]`.
    pub(crate) async fn start_with_policy(
        world: &World,
        repo: &TestRepo,
        node: &str,
        poll: &str,
        policy: &str,
    ) -> Agent {
        let daemon = repo.serve();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let dir = world.dir.path();
        std::fs::write(dir.join("hook-secret"), SECRET).unwrap();
        let base = world.sim.base_url();
        let config = format!(
            "node = \"{node}\"\nstate_dir = \"{state}\"\n\
             [source]\nurl = \"{url}\"\nbranch = \"main\"\npoll = \"{poll}\"\n\
             [webhook]\nsecret_file = \"hook-secret\"\n\
             [http]\nlisten = \"{listen}\"\n\
             [pve]\nurl = \"{pve}\"\ntoken_id = \"root@pam!proxops\"\ntoken_secret_file = \"token\"\nfingerprint = \"{fp}\"\n\
             [policy]\ntask_timeout = \"30s\"\n{policy}",
            state = dir.join(format!("state-{node}")).display(),
            url = daemon.url("origin.git"),
            pve = base.trim_end_matches("/api2/json"),
            fp = world.sim.fingerprint().unwrap(),
        );
        let config_path = dir.join(format!("agent-{node}.toml"));
        std::fs::write(&config_path, config).unwrap();
        let config = config_path;
        let log = dir.join(format!("agent-{node}.log"));
        let child = spawn_agent(&config, &log);
        let agent = Agent {
            child,
            config,
            listen,
            http: reqwest::Client::new(),
            daemon: Some(daemon),
            log,
        };
        agent.wait_for(|s| s["last_attempted"].is_object()).await;
        agent
    }

    /// kill -9: no chance to record anything.
    fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Starts the agent again on the same config and state directory.
    pub(crate) fn respawn(&mut self) {
        self.child = spawn_agent(&self.config, &self.log);
    }

    /// `proxops <command> --json --config <agent config>` (reads the DB when no agent runs).
    pub(crate) fn cli_json(&self, command: &str) -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_proxops"))
            .args([command, "--json", "--config"])
            .arg(&self.config)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub(crate) async fn get(&self, path: &str) -> serde_json::Value {
        let url = format!("http://{}{path}", self.listen);
        self.http
            .get(url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Polls /api/v1/status until `done` holds (at most 20 s).
    pub(crate) async fn wait_for(
        &self,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let url = format!("http://{}/api/v1/status", self.listen);
            if let Ok(response) = self.http.get(url).send().await
                && let Ok(status) = response.json::<serde_json::Value>().await
                && done(&status)
            {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "agent did not reach the expected status in time; its log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn deliver(&self, provider: &str, body: &str, signature: Option<String>) -> u16 {
        let mut request = self
            .http
            .post(format!("http://{}/hooks/{provider}", self.listen))
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

    /// The process id, for signals.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn terminate(&mut self) -> std::process::ExitStatus {
        crate::support::terminate(&mut self.child, Duration::from_secs(20))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_agent(config: &std::path::Path, log: &std::path::Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(env!("CARGO_BIN_EXE_proxops"))
        .args(["agent", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn sign(body: &str) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    hex::encode(mac.finalize().into_bytes())
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
    let agent = Agent::start(&world, &repo).await;
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
        let body = push_body("main");
        let signature = if provider == "github" {
            format!("sha256={}", sign(&body))
        } else {
            sign(&body)
        };
        assert_eq!(
            agent.deliver(provider, &body, Some(signature)).await,
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
        agent
            .deliver("github", &body, Some("sha256=00".into()))
            .await,
        401
    );
    assert_eq!(agent.deliver("github", &body, None).await, 401);
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
        .get(format!("http://{}/metrics", agent.listen))
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
    let agent = Agent::start(&world, &repo).await;
    agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(good.as_str()))
        .await;

    let bad = repo.commit_files(&[("iso/b.yaml", "apiVersion: proxops/v1alpha1\nkind: ISO\nmetadata: {name: b}\nspec: {nodes: [pve1], storage: local, filename: b.iso, url: ftp://x/b.iso}\n")], "bad");
    world.sim.control().clear_requests();
    let body = push_body("main");
    assert_eq!(
        agent
            .deliver("github", &body, Some(format!("sha256={}", sign(&body))))
            .await,
        202
    );
    let status = agent
        .wait_for(|s| commit_of(s, "last_attempted").as_deref() == Some(bad.as_str()))
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
async fn agent_mid_download() -> (World, TestRepo, Agent, String) {
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
    let agent = Agent::start(&world, &repo).await;
    wait_for_download_post(&world).await;
    wait_for_recorded_task(&world).await;
    (world, repo, agent, commit)
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
    let (world, _repo, mut agent, commit) = agent_mid_download().await;
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
    let (_world, _repo, mut agent, commit) = agent_mid_download().await;
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
    let mut first = Agent::start_on(&world, &repo, "pve1").await;
    let mut second = Agent::start_on(&world, &repo, "pve2").await;
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
    let agent = Agent::start_polling(&world, &repo, "pve1", "1s").await;
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
