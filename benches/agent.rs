//! Benchmarks of the agent (not tests), against the simulator and a git daemon on 127.0.0.1:
//!
//! - `webhook`: webhook-to-pass-start latency over 200 deliveries (a new commit is pushed, a
//!   signed GitHub push is delivered, and the time until the agent records a pass for that
//!   commit is measured; it includes the git fetch). Prints p50/p99.
//! - `idle`: resident memory of the agent after `PROXOPS_BENCH_IDLE_SECS` (default 600) of
//!   1 s polling of an unchanged repository.
//!
//! Run: `cargo bench --bench agent -- webhook` or `-- idle` (both by default).
//!
//! Benches cannot use `tests/it`'s harness (`tests/it/support/agent.rs`: `AgentToml`,
//! `AgentProcess`), so [`setup`], [`spawn`] and [`bound_address`] are a small local equivalent
//! of it: the agent listens on `127.0.0.1:0` and the bench reads the address it bound from
//! `<state_dir>/http.addr`, as the tests do.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

#[path = "../src/source/test_repo.rs"]
mod test_repo;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hmac::{KeyInit, Mac};
use proxops_pve_sim::SimConfig;
use test_repo::TestRepo;

const SECRET: &str = "bench-webhook-secret";

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let all = args.is_empty();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        if all || args.iter().any(|a| a == "webhook") {
            webhook_latency().await;
        }
        if all || args.iter().any(|a| a == "idle") {
            idle_rss().await;
        }
    });
}

struct Setup {
    _sim: proxops_pve_sim::RunningSim,
    repo: TestRepo,
    _daemon: test_repo::GitDaemon,
    dir: tempfile::TempDir,
    state_dir: PathBuf,
}

async fn setup(poll: &str) -> Setup {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = proxops_pve_sim::start(SimConfig::default(), listener)
        .await
        .unwrap();
    let repo = TestRepo::new();
    repo.commit_files(&[("README.md", "no manifests yet\n")], "empty");
    let daemon = repo.serve();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "proxops-dev-secret").unwrap();
    std::fs::write(dir.path().join("hook"), SECRET).unwrap();
    let state_dir = dir.path().join("state");
    std::fs::write(
        dir.path().join("agent.toml"),
        format!(
            "node = \"pve1\"\nstate_dir = \"{}\"\n[source]\nurl = \"{}\"\npoll = \"{poll}\"\n\
             [webhook]\nsecret_file = \"hook\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
             [pve]\nurl = \"{}\"\ntoken_id = \"root@pam!proxops\"\ntoken_secret_file = \"token\"\nfingerprint = \"{}\"\n",
            state_dir.display(),
            daemon.url("origin.git"),
            sim.base_url().trim_end_matches("/api2/json"),
            sim.fingerprint().unwrap(),
        ),
    )
    .unwrap();
    Setup {
        _sim: sim,
        repo,
        _daemon: daemon,
        dir,
        state_dir,
    }
}

fn spawn(setup: &Setup) -> Child {
    Command::new(env!("CARGO_BIN_EXE_proxops"))
        .args(["agent", "--config"])
        .arg(setup.dir.path().join("agent.toml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The address the agent bound, once it has written it to `<state_dir>/http.addr`.
async fn bound_address(setup: &Setup) -> String {
    let file = proxops::agent::http_addr_path(&setup.state_dir);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(&file)
            && let Ok(addr) = text.trim().parse::<SocketAddr>()
        {
            return addr.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the agent wrote no address to {}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn attempted(http: &reqwest::Client, listen: &str) -> Option<String> {
    let status: serde_json::Value = http
        .get(format!("http://{listen}/api/v1/status"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    status["last_attempted"]["commit"]
        .as_str()
        .map(str::to_owned)
}

async fn wait_for_commit(http: &reqwest::Client, listen: &str, commit: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while attempted(http, listen).await.as_deref() != Some(commit) {
        assert!(Instant::now() < deadline, "no pass for {commit}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn webhook_latency() {
    let setup = setup("1h").await;
    let mut agent = spawn(&setup);
    let listen = bound_address(&setup).await;
    let http = reqwest::Client::new();
    let head = setup.repo.head();
    wait_for_commit(&http, &listen, &head).await;
    let mut latencies = Vec::new();
    for i in 0..200 {
        let commit = setup
            .repo
            .commit_files(&[("README.md", &format!("change {i}\n"))], "change");
        // Each push names its commit, as forges' do: identical bodies are coalesced as
        // replays (`webhook::replay`) and would start no pass.
        let body = format!(r#"{{"ref":"refs/heads/main","after":"{commit}"}}"#);
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(body.as_bytes());
        let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        let start = Instant::now();
        let response = http
            .post(format!("http://{listen}/hooks/github"))
            .header("X-GitHub-Event", "push")
            .header("X-Hub-Signature-256", &signature)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
        wait_for_commit(&http, &listen, &commit).await;
        latencies.push(start.elapsed());
        // Let the pass finish before the next delivery, so each delivery starts one pass.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    latencies.sort();
    println!(
        "webhook → pass recorded for the new commit (git fetch included), 200 deliveries: \
         p50 {:?}, p99 {:?}, max {:?}",
        latencies[latencies.len() / 2],
        latencies[latencies.len() * 99 / 100],
        latencies[latencies.len() - 1]
    );
    agent.kill().unwrap();
    agent.wait().unwrap();
}

async fn idle_rss() {
    let secs: u64 = std::env::var("PROXOPS_BENCH_IDLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let setup = setup("1s").await;
    let mut agent = spawn(&setup);
    let listen = bound_address(&setup).await;
    let http = reqwest::Client::new();
    let head = setup.repo.head();
    wait_for_commit(&http, &listen, &head).await;
    let rss = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    let first = rss(agent.id());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let revisions: serde_json::Value = http
        .get(format!("http://{listen}/api/v1/revisions?limit=1000"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    println!(
        "idle agent, 1 s polling of an unchanged repository for {secs} s ({} passes): \
         RSS {} KiB after the first pass, {} KiB at the end",
        revisions.as_array().map_or(0, Vec::len),
        first,
        rss(agent.id())
    );
    agent.kill().unwrap();
    agent.wait().unwrap();
}
