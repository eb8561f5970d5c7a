//! The listener and the state directory against a network caller and a second agent
//! (SECURITY-AUDIT.md H2, L1, M6): the built agent, the simulator, a git daemon, and raw TCP
//! sockets playing the attacker.
//!
//! The idle-connection attack is the audit's: 1,100 half-sent requests held open. Before the
//! listener had a cap and a header timeout, they pinned the agent at its 1,024 descriptors,
//! `/healthz` stopped answering and 19 passes in a row could not open the git mirror. The
//! agent here runs with systemd's default soft limit (1,024, set with `prlimit`).
//!
//! Figures for RELIABILITY.md (peak RSS, `/healthz` p99, descriptors) go to stderr; the 40 s
//! run of the audit is ignored by default:
//! `PROXOPS_IDLE_SECS=40 cargo nextest run -p proxops --test it idle_connection_figures --run-ignored only --no-capture`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::git_server::{GitDaemon, TestRepo};
use crate::sim::{World, artifact};
use crate::support::agent::{AgentProcess, AgentToml, database_values};

const HOOK_SECRET: &str = "listener-test-hook-secret";

/// The world, a repository with one ISO served over `git://`, and the commit.
struct Rig {
    world: World,
    repo: TestRepo,
    daemon: GitDaemon,
    commit: String,
}

impl Rig {
    async fn start() -> Rig {
        let world = World::start(&[
            ("a.iso", b"installer a".as_slice()),
            ("b.iso", b"installer b".as_slice()),
        ])
        .await;
        let repo = TestRepo::new();
        let commit = repo.commit_files(&[("iso/a.yaml", &iso(&world, "a"))], "one ISO");
        let daemon = repo.serve();
        Rig {
            world,
            repo,
            daemon,
            commit,
        }
    }

    fn dir(&self) -> &Path {
        self.world.dir.path()
    }

    /// An agent.toml following the repository with its own state directory `name`.
    fn toml(&self, name: &str) -> AgentToml {
        self.world
            .agent_toml()
            .state_dir(self.dir().join(format!("state-{name}")))
            .source(&self.daemon.url("origin.git"))
            .webhook_secret(HOOK_SECRET)
    }

    fn config(&self, name: &str) -> PathBuf {
        self.dir().join(format!("agent-{name}.toml"))
    }
}

fn iso(world: &World, name: &str) -> String {
    artifact(
        "ISO",
        name,
        &["pve1"],
        &format!("{name}.iso"),
        &format!("{}/{name}.iso", world.files_url),
        None,
    )
}

async fn applied(agent: &AgentProcess, commit: &str) -> serde_json::Value {
    agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(commit))
        .await
}

/// Sets the agent's open-file limit to systemd's default soft limit, as under the unit before
/// `LimitNOFILE=` (SECURITY-AUDIT.md L5).
fn limit_open_files(pid: u32, limit: u32) {
    let status = std::process::Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={limit}:{limit}"))
        .status()
        .unwrap();
    assert!(status.success(), "prlimit --pid {pid}");
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// What one idle-connection attack did.
#[derive(Debug)]
struct IdleFigures {
    connected: usize,
    connect_errors: usize,
    closed_by_agent: usize,
    healthz_ms: Vec<f64>,
    healthz_failures: usize,
    max_open_files: usize,
    peak_rss_kib: u64,
    applied_after: Option<Duration>,
}

/// Holds `connections` half-sent requests against the status listener for `hold`, probing
/// `/healthz` (a new connection each time) every 100 ms, and pushes a commit at the start:
/// when did a pass apply it.
async fn idle_connection_attack(connections: usize, hold: Duration) -> IdleFigures {
    let rig = Rig::start().await;
    let toml = rig.toml("idle").poll("1s");
    let agent = AgentProcess::spawn(&toml, &rig.config("idle"), "info");
    applied(&agent, &rig.commit).await;
    limit_open_files(agent.pid(), 1024);
    let addr = agent.listening().await;

    let mut held = Vec::with_capacity(connections);
    let mut connect_errors = 0;
    for _ in 0..connections {
        match tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await {
            Ok(Ok(mut stream)) => {
                // A request head that never ends.
                let _ = stream
                    .write_all(b"GET /api/v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                    .await;
                held.push(stream);
            }
            _ => connect_errors += 1,
        }
    }
    let attack_start = Instant::now();
    let next = rig
        .repo
        .commit_files(&[("iso/b.yaml", &iso(&rig.world, "b"))], "a second ISO");

    let probe = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let (mut healthz_ms, mut healthz_failures, mut max_open_files) = (Vec::new(), 0, 0);
    let mut applied_after = None;
    while attack_start.elapsed() < hold {
        let start = Instant::now();
        let answered = tokio::time::timeout(
            Duration::from_secs(2),
            probe.get(format!("http://{addr}/healthz")).send(),
        )
        .await
        .is_ok_and(|r| r.is_ok_and(|r| r.status().is_success()));
        if answered {
            healthz_ms.push(start.elapsed().as_secs_f64() * 1000.0);
        } else {
            healthz_failures += 1;
        }
        max_open_files = max_open_files.max(open_files(agent.pid()));
        if applied_after.is_none()
            && let Some(status) = agent.status().await
            && status["last_applied"]["commit"].as_str() == Some(next.as_str())
        {
            applied_after = Some(attack_start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Which of the held connections did the agent close (evicted or timed out)?
    let mut closed_by_agent = 0;
    for stream in &mut held {
        let mut byte = [0u8; 512];
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(5), stream.read(&mut byte)).await
        {
            // EOF, or the 408 hyper sends before closing on a header timeout.
            let _ = n;
            closed_by_agent += 1;
        }
    }
    let peak_rss_kib = agent.peak_rss_kib();
    let log = agent.log_text();
    assert!(
        log.contains("connection cap reached"),
        "the cap is logged:\n{log}"
    );
    assert!(
        !log.contains("Too many open files"),
        "the agent ran out of descriptors:\n{log}"
    );
    healthz_ms.sort_by(f64::total_cmp);
    IdleFigures {
        connected: held.len(),
        connect_errors,
        closed_by_agent,
        healthz_ms,
        healthz_failures,
        max_open_files,
        peak_rss_kib,
        applied_after,
    }
}

#[allow(clippy::print_stderr, reason = "the figures RELIABILITY.md reports")]
fn print_figures(figures: &IdleFigures, hold: Duration) {
    let ms = &figures.healthz_ms;
    eprintln!(
        "idle-connection attack: {} half-sent requests held {} s ({} connect errors), {} closed \
         by the agent; /healthz {} answered, {} failed, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; \
         agent descriptors at most {} (limit 1024); peak RSS {} KiB; pushed commit applied after \
         {:?}",
        figures.connected,
        hold.as_secs(),
        figures.connect_errors,
        figures.closed_by_agent,
        ms.len(),
        figures.healthz_failures,
        percentile(ms, 50.0),
        percentile(ms, 99.0),
        ms.last().copied().unwrap_or(f64::NAN),
        figures.max_open_files,
        figures.peak_rss_kib,
        figures.applied_after,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_connections_do_not_stop_healthz_or_passes() {
    let hold = Duration::from_secs(12);
    let figures = idle_connection_attack(1_100, hold).await;
    print_figures(&figures, hold);
    assert!(figures.connected >= 1_000, "{figures:?}");
    assert_eq!(figures.healthz_failures, 0, "{figures:?}");
    assert!(
        figures.max_open_files < 700,
        "the cap keeps descriptors for git and PVE: {figures:?}"
    );
    let applied = figures
        .applied_after
        .expect("a commit pushed during the attack is applied during it");
    assert!(applied < hold, "{figures:?}");
    assert!(
        figures.closed_by_agent >= figures.connected - 512,
        "beyond the cap, held connections are closed: {figures:?}"
    );
}

/// The audit's 40 s hold, for RELIABILITY.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "40 s; run by hand for RELIABILITY.md figures"]
async fn idle_connection_figures() {
    let secs = std::env::var("PROXOPS_IDLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let hold = Duration::from_secs(secs);
    let figures = idle_connection_attack(1_100, hold).await;
    print_figures(&figures, hold);
    assert_eq!(figures.healthz_failures, 0, "{figures:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stderr, reason = "the figures RELIABILITY.md reports")]
async fn two_hundred_large_webhook_bodies_at_once_do_not_grow_the_agent_beyond_a_few() {
    let rig = Rig::start().await;
    let agent = AgentProcess::spawn(&rig.toml("bodies"), &rig.config("bodies"), "info");
    applied(&agent, &rig.commit).await;
    let addr = agent.listening().await;
    let before = agent.peak_rss_kib();
    // The audit's attack: 200 connections, each sending 5 MiB − 1 byte with a signature header
    // (a wrong one: the attacker does not know the secret).
    let length = 5 * 1024 * 1024 - 1;
    let body = std::sync::Arc::new(vec![b' '; length]);
    let mut senders = Vec::new();
    for _ in 0..200 {
        let body = body.clone();
        senders.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.ok()?;
            let head = format!(
                "POST /hooks/github HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                 X-GitHub-Event: push\r\nX-Hub-Signature-256: sha256=00\r\nContent-Length: {length}\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await.ok()?;
            let _ = tokio::time::timeout(Duration::from_secs(20), stream.write_all(&body)).await;
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer))
                .await;
            let answer = String::from_utf8_lossy(&answer).into_owned();
            answer.split(' ').nth(1).map(str::to_owned)
        }));
    }
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    for sender in senders {
        let status = sender.await.unwrap().unwrap_or_else(|| "none".to_owned());
        *statuses.entry(status).or_default() += 1;
    }
    let peak = agent.peak_rss_kib();
    eprintln!(
        "200 × 5 MiB webhook bodies: answers {statuses:?}; peak RSS {before} KiB before, {peak} KiB after"
    );
    assert!(
        !statuses.contains_key("202"),
        "no wrongly signed body asks for a pass: {statuses:?}"
    );
    // 1.06 GB before the body slots; now a few bodies (4 × 5 MiB) on top of the agent.
    assert!(
        peak < before + 100 * 1024,
        "peak RSS grew from {before} KiB to {peak} KiB"
    );
    // The agent still answers.
    assert!(agent.try_get("/healthz").await.is_some());
}

/// Every file under `dir` with its size and modification time.
fn tree(dir: &Path) -> Vec<(PathBuf, u64, SystemTime)> {
    let mut files: Vec<_> = walk(dir)
        .into_iter()
        .map(|path| {
            let meta = std::fs::symlink_metadata(&path).unwrap();
            (path, meta.len(), meta.modified().unwrap())
        })
        .collect();
    files.sort();
    files
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_on_the_same_state_dir_exits_without_touching_it() {
    let rig = Rig::start().await;
    let agent = AgentProcess::spawn(&rig.toml("first"), &rig.config("first"), "info");
    applied(&agent, &rig.commit).await;
    // A git lock file as a fetch in flight holds it: the second agent used to remove it as
    // "stale" from under the first.
    let mirror = std::fs::read_dir(agent.state_dir.join("git"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(mirror.join("packed-refs.lock"), "in flight").unwrap();
    // The first agent is idle (poll 1h): nothing changes under it but what the second does.
    let files = tree(&agent.state_dir);
    let values = database_values(&agent.database);

    let started = Instant::now();
    let second = agent
        .cli(&["agent"])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "{stderr}");
    let lock = agent.state_dir.join("lock");
    assert!(
        stderr.contains(&format!(
            "another agent (pid {}) holds {}",
            agent.pid(),
            lock.display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("interrupted"), "{stderr}");
    assert!(!stderr.contains("stale git lock"), "{stderr}");

    assert_eq!(tree(&agent.state_dir), files, "the state directory changed");
    assert_eq!(database_values(&agent.database), values);
    assert!(mirror.join("packed-refs.lock").exists());
    // The first agent carries on: its pass is still the last applied, nothing interrupted.
    std::fs::remove_file(mirror.join("packed-refs.lock")).unwrap();
    let status = agent.status().await.unwrap();
    assert_eq!(status["last_applied"]["commit"], rig.commit.as_str());
    assert_eq!(status["last_attempted"]["outcome"], "applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_host_or_a_missing_token_cannot_read_the_status_api() {
    let rig = Rig::start().await;
    let token = "listener-test-api-token-5e2b";
    std::fs::write(rig.dir().join("api-token"), format!("{token}\n")).unwrap();
    let toml = rig.toml("token").http("token_file = \"api-token\"");
    let agent = AgentProcess::spawn(&toml, &rig.config("token"), "info");
    let addr = agent.listening().await;
    let http = reqwest::Client::new();
    let get = |path: &str, host: Option<&str>, bearer: Option<&str>| {
        let mut request = http.get(format!("http://{addr}{path}"));
        if let Some(host) = host {
            request = request.header("host", host);
        }
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        async move {
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    // The pass finishes before the API is read with the token.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = get("/api/v1/status", None, Some(token)).await;
        assert_eq!(status, 200, "{body}");
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        if status["last_applied"]["commit"].as_str() == Some(rig.commit.as_str()) {
            break;
        }
        assert!(Instant::now() < deadline, "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for path in [
        "/",
        "/api/v1/status",
        "/api/v1/drift",
        "/api/v1/revisions",
        "/metrics",
        "/status",
    ] {
        let (status, body) = get(path, None, None).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert!(!body.contains(&rig.commit), "{path}: {body}");
        let (status, _) = get(path, None, Some("guess")).await;
        assert_eq!(status, 401, "{path}");
        let (status, body) = get(path, Some("evil.example:9494"), Some(token)).await;
        assert_eq!(status, 421, "{path}: {body}");
    }
    assert_eq!(get("/healthz", None, None).await.0, 200);
    // Ready or not yet (the live view may trail the database by a moment), never 401.
    assert!(
        [200, 503].contains(&get("/readyz", None, None).await.0),
        "/readyz needs no token"
    );
    // `proxops status` sends the token: the agent answers it, no fallback to the database.
    let out = agent
        .cli(&["status", "--json"])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("reading the database"), "{stderr}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["last_applied"]["commit"], rig.commit.as_str());
    assert!(
        status["process_start"].is_string(),
        "answered by the agent: {status}"
    );
    let log = agent.log_text();
    assert!(!log.contains(token), "the token is never logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_on_their_own_listener_leave_the_status_api_off_it() {
    let rig = Rig::start().await;
    let toml = rig.toml("hooks").webhook("listen = \"127.0.0.1:0\"");
    let agent = AgentProcess::spawn(&toml, &rig.config("hooks"), "info");
    applied(&agent, &rig.commit).await;
    let hooks = agent.webhook_addr().expect("webhook.addr written");
    let status = agent.listening().await;
    assert_ne!(hooks, status);
    let next = rig
        .repo
        .commit_files(&[("iso/b.yaml", &iso(&rig.world, "b"))], "a second ISO");
    let body = r#"{"ref":"refs/heads/main","after":"0000000000000000000000000000000000000000"}"#;
    let push = |addr| {
        agent
            .http
            .post(format!("http://{addr}/hooks/github"))
            .header("content-type", "application/json")
            .header("X-GitHub-Event", "push")
            .header(
                "X-Hub-Signature-256",
                agent.github_signature(body.as_bytes()),
            )
            .body(body)
            .send()
    };
    assert_eq!(push(status).await.unwrap().status().as_u16(), 404);
    assert_eq!(push(hooks).await.unwrap().status().as_u16(), 202);
    applied(&agent, &next).await;
    for path in ["/api/v1/status", "/", "/metrics", "/healthz"] {
        let response = agent
            .http
            .get(format!("http://{hooks}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status().as_u16(),
            404,
            "{path} on the webhook listener"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_never_shows_the_nodes_absolute_paths_in_errors() {
    let rig = Rig::start().await;
    // A source inside the state directory that does not exist: its error names that path.
    let state = rig.dir().join("state-paths");
    let missing = state.join("no-such-repo.git");
    let toml = rig
        .world
        .agent_toml()
        .state_dir(&state)
        .source(&format!("file://{}", missing.display()));
    let agent = AgentProcess::spawn(&toml, &rig.config("paths"), "info");
    let status = agent.wait_for(|s| s["last_error"].is_string()).await;
    let error = status["last_error"].as_str().unwrap();
    assert!(error.contains("<state_dir>"), "{error}");
    let absolute = state.display().to_string();
    for path in ["/api/v1/status", "/api/v1/revisions", "/", "/status"] {
        let (code, body) = agent.get_text(path).await;
        assert_eq!(code, 200, "{path}");
        assert!(!body.contains(&absolute), "{path} shows {absolute}: {body}");
    }
    // The log, read by the operator only, keeps the full path.
    assert!(agent.log_text().contains(&absolute));
}
