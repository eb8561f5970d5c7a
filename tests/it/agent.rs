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

struct Agent {
    child: Child,
    listen: String,
    http: reqwest::Client,
    _daemon: GitDaemon,
    log: std::path::PathBuf,
}

impl Agent {
    async fn start(world: &World, repo: &TestRepo) -> Agent {
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
            "node = \"pve1\"\nstate_dir = \"{state}\"\n\
             [source]\nurl = \"{url}\"\nbranch = \"main\"\npoll = \"1h\"\n\
             [webhook]\nsecret_file = \"hook-secret\"\n\
             [http]\nlisten = \"{listen}\"\n\
             [pve]\nurl = \"{pve}\"\ntoken_id = \"root@pam!proxops\"\ntoken_secret_file = \"token\"\nfingerprint = \"{fp}\"\n\
             [policy]\ntask_timeout = \"30s\"\n",
            state = dir.join("state").display(),
            url = daemon.url("origin.git"),
            pve = base.trim_end_matches("/api2/json"),
            fp = world.sim.fingerprint().unwrap(),
        );
        std::fs::write(dir.join("agent-daemon.toml"), config).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_proxops"))
            .args(["agent", "--config"])
            .arg(dir.join("agent-daemon.toml"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("agent.log")).unwrap())
            .spawn()
            .unwrap();
        let log = dir.join("agent.log");
        let agent = Agent {
            child,
            listen,
            http: reqwest::Client::new(),
            _daemon: daemon,
            log,
        };
        agent.wait_for(|s| s["last_attempted"].is_object()).await;
        agent
    }

    async fn get(&self, path: &str) -> serde_json::Value {
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
    async fn wait_for(&self, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
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

    fn terminate(mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "agent did not stop on SIGTERM");
            std::thread::park_timeout(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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

fn commit_of(status: &serde_json::Value, which: &str) -> Option<String> {
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
    assert!(agent.terminate().success());
}
