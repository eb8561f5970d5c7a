//! Benchmarks of the agent (not tests), against the simulator and a git daemon on 127.0.0.1:
//!
//! - `webhook`: webhook-to-pass-start latency over 200 deliveries (a new commit is pushed, a
//!   signed GitHub push is delivered, and the time until the agent records a pass for that
//!   commit is measured; it includes the git fetch). Prints p50/p99.
//! - `write`: webhook → first PVE write over 200 deliveries, each a commit that adds one ISO
//!   (the write is its `download-url` POST, seen in the simulator's request log), against the
//!   floor measured in the same iteration: `git fetch` (git's CLI, in a clone of the same
//!   remote) of that change plus one PVE round trip (`GET /version` on a kept-alive TLS
//!   connection). Prints the medians and the ratio.
//! - `fetch`: the agent's fetch (`GitSource::fetch`, in-process: gix, shallow, tree read)
//!   against git's CLI fetch of the same change, 200 commits, each timed in turn. Prints the
//!   medians and the ratio.
//! - `fetch-https`: the same over https: `git http-backend` behind a local TLS server
//!   (`benches/support/git_https.rs`, a certificate from a throwaway CA that both clients
//!   trust); runs in a child process started with `SSL_CERT_FILE` naming that CA.
//! - `idle`: resident memory of the agent after `PROXOPS_BENCH_IDLE_SECS` (default 600) of
//!   1 s polling of an unchanged repository, sampled every 10 s.
//!
//! Run: `cargo bench --bench agent -- webhook`, `-- write`, `-- fetch`, `-- fetch-https` or
//! `-- idle` (all by
//! default). `PROXOPS_BENCH_DELIVERIES` (200) sets the count for `webhook`, `write`, `fetch`;
//! `PROXOPS_BENCH_BIN` runs another agent binary (e.g. `target/release/proxops`) in `webhook`,
//! `write` and `idle`.
//!
//! Benches cannot use `tests/it`'s harness (`tests/it/support/agent.rs`: `AgentToml`,
//! `AgentProcess`), so [`setup`], [`spawn`] and [`bound_address`] are a small local equivalent
//! of it: the agent listens on `127.0.0.1:0` and the bench reads the address it bound from
//! `<state_dir>/http.addr`, as the tests do.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

#[path = "support/git_https.rs"]
mod git_https;
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
    // gix (reqwest, rustls-platform-verifier) reads its roots from `SSL_CERT_FILE`, which must
    // be in the environment before any thread starts: the https fetch runs in a child process
    // of this bench that is started with it.
    if (all || args.iter().any(|a| a == "fetch-https"))
        && std::env::var_os("PROXOPS_BENCH_TLS_DIR").is_none()
    {
        let tls = tempfile::tempdir().unwrap();
        let (ca, cert, key) = git_https::write_ca(tls.path());
        std::fs::write(tls.path().join("cert.pem"), cert).unwrap();
        std::fs::write(tls.path().join("key.pem"), key).unwrap();
        let status = Command::new(std::env::current_exe().unwrap())
            .arg("fetch-https")
            .env("SSL_CERT_FILE", &ca)
            // git's CLI (libcurl with GnuTLS on Debian) through the environment: a `-c
            // http.sslCAInfo=` was not applied to its TLS ("CAfile: /etc/ssl/certs/…").
            .env("GIT_SSL_CAINFO", &ca)
            .env("PROXOPS_BENCH_TLS_DIR", tls.path())
            .status()
            .unwrap();
        assert!(status.success(), "the https fetch bench failed");
        if !all {
            return;
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        if all || args.iter().any(|a| a == "webhook") {
            webhook_latency().await;
        }
        if all || args.iter().any(|a| a == "write") {
            webhook_to_write().await;
        }
        if all || args.iter().any(|a| a == "fetch") {
            fetch_against_git_cli(&Transport::Git);
        }
        if let Some(tls) = std::env::var_os("PROXOPS_BENCH_TLS_DIR")
            && args.iter().any(|a| a == "fetch-https")
        {
            fetch_against_git_cli(&Transport::Https(PathBuf::from(tls)));
        }
        if all || args.iter().any(|a| a == "idle") {
            idle_rss().await;
        }
    });
}

struct Setup {
    sim: proxops_pve_sim::RunningSim,
    repo: TestRepo,
    daemon: test_repo::GitDaemon,
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
    // `[scope]`: the ISO mirror is on 127.0.0.1, an internal address the scope refuses
    // unless `artifact_hosts` lists it (without it `-- write` never saw a download-url).
    std::fs::write(
        dir.path().join("agent.toml"),
        format!(
            "node = \"pve1\"\nstate_dir = \"{}\"\n[source]\nurl = \"{}\"\npoll = \"{poll}\"\n\
             [webhook]\nsecret_file = \"hook\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
             [scope]\nartifact_hosts = [\"127.0.0.1\"]\nallow_http_without_checksum = true\n\
             [pve]\nurl = \"{}\"\ntoken_id = \"root@pam!proxops\"\ntoken_secret_file = \"token\"\nfingerprint = \"{}\"\n",
            state_dir.display(),
            daemon.url("origin.git"),
            sim.base_url().trim_end_matches("/api2/json"),
            sim.fingerprint().unwrap(),
        ),
    )
    .unwrap();
    Setup {
        sim,
        repo,
        daemon,
        dir,
        state_dir,
    }
}

/// The agent binary: `PROXOPS_BENCH_BIN` (e.g. a `release` build, to measure the shipped
/// binary's footprint), else the one cargo built with this bench.
fn agent_binary() -> PathBuf {
    std::env::var_os("PROXOPS_BENCH_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_proxops")),
        PathBuf::from,
    )
}

fn spawn(setup: &Setup) -> Child {
    Command::new(agent_binary())
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

fn deliveries() -> usize {
    std::env::var("PROXOPS_BENCH_DELIVERIES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

/// Delivers a signed GitHub push of `commit` and checks that the agent accepted it.
async fn deliver(http: &reqwest::Client, listen: &str, commit: &str) {
    // Each push names its commit, as forges' do: identical bodies are coalesced as
    // replays (`webhook::replay`) and would start no pass.
    let body = format!(r#"{{"ref":"refs/heads/main","after":"{commit}"}}"#);
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    let response = http
        .post(format!("http://{listen}/hooks/github"))
        .header("X-GitHub-Event", "push")
        .header("X-Hub-Signature-256", &signature)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// `/proc/loadavg`'s three averages.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Serves any `/<name>` as a few bytes over plain HTTP on 127.0.0.1: the ISO mirror the
/// simulated node downloads from.
async fn serve_isos() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = axum::Router::new().route(
        "/{name}",
        axum::routing::get(|| async { &b"not really an iso"[..] }),
    );
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// Times `git fetch` (git's CLI) in `clone`.
fn git_cli_fetch(clone: &std::path::Path) -> Duration {
    let start = Instant::now();
    test_repo::git(clone, &["fetch", "--quiet", "origin"]);
    start.elapsed()
}

/// Webhook → first PVE write for commits that each add one ISO, against git's CLI fetch of
/// the same change plus one PVE round trip.
async fn webhook_to_write() {
    let setup = setup("1h").await;
    let mirror = serve_isos().await;
    let mut agent = spawn(&setup);
    let listen = bound_address(&setup).await;
    let http = reqwest::Client::new();
    wait_for_commit(&http, &listen, &setup.repo.head()).await;
    let cli = tempfile::tempdir().unwrap();
    test_repo::git(
        cli.path(),
        &["clone", "--quiet", &setup.daemon.url("origin.git"), "clone"],
    );
    let clone = cli.path().join("clone");
    let pve = proxops_pve::PveClient::new(proxops_pve::ClientConfig {
        base_url: setup.sim.base_url(),
        token_id: "root@pam!proxops".into(),
        token_secret: "proxops-dev-secret".to_owned().into(),
        trust: proxops_pve::Trust::Fingerprint(setup.sim.fingerprint().unwrap().to_owned()),
        timeout: proxops_pve::Timeouts::default(),
        retry: proxops_pve::RetryPolicy::default(),
    })
    .unwrap();
    pve.version().await.unwrap();
    let load_before = load_average();
    let (mut to_write, mut fetches, mut rtts, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..deliveries() {
        let name = format!("iso-{i:04}");
        let manifest = format!(
            "apiVersion: proxops/v1alpha1\nkind: ISO\nmetadata:\n  name: {name}\nspec:\n  \
             nodes: [pve1]\n  storage: local\n  filename: {name}.iso\n  \
             url: http://{mirror}/{name}.iso\n"
        );
        let commit = setup
            .repo
            .commit_files(&[(&format!("iso/{name}.yaml"), &manifest)], "add an ISO");
        setup.sim.control().clear_requests();
        let start = Instant::now();
        deliver(&http, &listen, &commit).await;
        let deadline = start + Duration::from_secs(30);
        loop {
            let log = setup.sim.control().requests();
            if log.requests.iter().any(|r| {
                r.method == "POST"
                    && r.endpoint.ends_with("/download-url")
                    && r.params.get("filename").map(String::as_str) == Some(&format!("{name}.iso"))
            }) {
                break;
            }
            assert!(Instant::now() < deadline, "no download-url for {name}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let took = start.elapsed();
        wait_for_commit(&http, &listen, &commit).await;
        // The floor, measured right after, with the agent idle again.
        let fetch = git_cli_fetch(&clone);
        let rtt_start = Instant::now();
        pve.version().await.unwrap();
        let rtt = rtt_start.elapsed();
        ratios.push(took.as_secs_f64() / (fetch + rtt).as_secs_f64());
        to_write.push(took);
        fetches.push(fetch);
        rtts.push(rtt);
    }
    ratios.sort_by(f64::total_cmp);
    let p99 = {
        let mut sorted = to_write.clone();
        sorted.sort();
        sorted[sorted.len() * 99 / 100]
    };
    let (write, fetch, rtt) = (
        median(&mut to_write),
        median(&mut fetches),
        median(&mut rtts),
    );
    println!(
        "webhook → first PVE write (a commit adding one ISO), {} deliveries, load {load_before} \
         → {}: median {} (p99 {}); floor: git CLI fetch median {} + PVE round trip median {}; \
         ratio of medians {:.3}, median of per-delivery ratios {:.3} (target <= 1.2)",
        ratios.len(),
        load_average(),
        ms(write),
        ms(p99),
        ms(fetch),
        ms(rtt),
        write.as_secs_f64() / (fetch + rtt).as_secs_f64(),
        ratios[ratios.len() / 2],
    );
    agent.kill().unwrap();
    agent.wait().unwrap();
}

/// How the bench's remote is served.
enum Transport {
    /// `git daemon`, `git://127.0.0.1`.
    Git,
    /// `git http-backend` behind TLS ([`git_https`]); the CA, certificate and key in the dir.
    Https(PathBuf),
}

/// The agent's fetch (`GitSource::fetch`, in-process) against git's CLI, change by change.
fn fetch_against_git_cli(transport: &Transport) {
    use proxops::config::{Poll, SourceConfig};
    use proxops::source::git::GitSource;
    use std::sync::atomic::AtomicBool;

    let repo = TestRepo::new();
    repo.commit_files(&[("vm/a.yaml", "first\n")], "first");
    let (_daemon, url, scheme) = match transport {
        Transport::Git => {
            let daemon = repo.serve();
            let url = daemon.url("origin.git");
            (Some(daemon), url, "git://127.0.0.1")
        }
        Transport::Https(tls) => {
            let port = git_https::serve(
                repo.root(),
                &std::fs::read_to_string(tls.join("cert.pem")).unwrap(),
                &std::fs::read_to_string(tls.join("key.pem")).unwrap(),
            );
            let url = format!("https://127.0.0.1:{port}/origin.git");
            (None, url, "https://127.0.0.1 (git http-backend)")
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let source = GitSource::open(
        &SourceConfig {
            url: url.clone(),
            branch: "main".into(),
            path: String::new(),
            poll: Poll::Every(Duration::from_secs(60)),
            token: None,
            ssh_key_file: None,
            known_hosts_file: None,
            verify: None,
        },
        dir.path(),
    )
    .unwrap();
    let interrupt = AtomicBool::new(false);
    source.fetch(&interrupt).unwrap();
    // Over https git's CLI trusts the bench CA through `GIT_SSL_CAINFO`, set by `main`.
    test_repo::git(dir.path(), &["clone", "--quiet", url.as_str(), "clone"]);
    let clone = dir.path().join("clone");
    let load_before = load_average();
    let (mut agent, mut cli, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..deliveries() {
        let commit = repo.commit_files(&[("vm/a.yaml", &format!("change {i}\n"))], "change");
        // Alternate who fetches first, so neither always meets a cold server.
        let (a, c) = if i % 2 == 0 {
            let start = Instant::now();
            let revision = source.fetch(&interrupt).unwrap();
            let a = start.elapsed();
            assert_eq!(revision.commit, commit);
            (a, git_cli_fetch(&clone))
        } else {
            let c = git_cli_fetch(&clone);
            let start = Instant::now();
            let revision = source.fetch(&interrupt).unwrap();
            assert_eq!(revision.commit, commit);
            (start.elapsed(), c)
        };
        ratios.push(a.as_secs_f64() / c.as_secs_f64());
        agent.push(a);
        cli.push(c);
    }
    ratios.sort_by(f64::total_cmp);
    // The mirror gains one pack per fetched change (gix never repacks): does that show?
    let tenth = (agent.len() / 10).max(1);
    let first = median(&mut agent[..tenth].to_vec());
    let last = median(&mut agent[agent.len() - tenth..].to_vec());
    let packs = std::fs::read_dir(source.mirror_path().join("objects/pack"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "pack"))
                .count()
        })
        .unwrap_or(0);
    println!(
        "fetch: agent median of the first {tenth} changes {}, of the last {tenth} {}; the \
         mirror holds {packs} packs",
        ms(first),
        ms(last)
    );
    let (a, c) = (median(&mut agent), median(&mut cli));
    println!(
        "fetch of one change over {scheme}, {} changes, load {load_before} → {}: agent \
         (GitSource::fetch) median {}, git CLI `git fetch` median {}; ratio of medians {:.3}, \
         median of per-change ratios {:.3} (target <= 1.1)",
        ratios.len(),
        load_average(),
        ms(a),
        ms(c),
        a.as_secs_f64() / c.as_secs_f64(),
        ratios[ratios.len() / 2],
    );
}

async fn webhook_latency() {
    let setup = setup("1h").await;
    let mut agent = spawn(&setup);
    let listen = bound_address(&setup).await;
    let http = reqwest::Client::new();
    let head = setup.repo.head();
    wait_for_commit(&http, &listen, &head).await;
    let mut latencies = Vec::new();
    for i in 0..deliveries() {
        let commit = setup
            .repo
            .commit_files(&[("README.md", &format!("change {i}\n"))], "change");
        let start = Instant::now();
        deliver(&http, &listen, &commit).await;
        wait_for_commit(&http, &listen, &commit).await;
        latencies.push(start.elapsed());
        // Let the pass finish before the next delivery, so each delivery starts one pass.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    latencies.sort();
    println!(
        "webhook → pass recorded for the new commit (git fetch included), {} deliveries: \
         p50 {:?}, p99 {:?}, max {:?}",
        latencies.len(),
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
    let field = |pid: u32, name: &str| -> String {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|t| t.trim().to_owned())
            .unwrap_or_default()
    };
    let threads = |pid: u32| -> String {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .map(|t| t.trim().to_owned())
            .unwrap_or_default()
    };
    let end = Instant::now() + Duration::from_secs(secs);
    let mut peak = first;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(10).min(end - Instant::now())).await;
        peak = peak.max(rss(agent.id()));
    }
    let revisions: serde_json::Value = http
        .get(format!("http://{listen}/api/v1/revisions?limit=1000"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // How much of the resident memory is the executable's own mapped pages.
    let binary = agent_binary();
    let binary = binary.canonicalize().unwrap_or(binary);
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", agent.id())).unwrap_or_default();
    let (mut in_binary, mut binary_rss_kib) = (false, 0u64);
    for line in smaps.lines() {
        if let Some(kib) = line.strip_prefix("Rss:") {
            if in_binary {
                binary_rss_kib += kib
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        } else if line.split_whitespace().next().is_some_and(|range| {
            range.contains('-') && range.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        }) {
            in_binary = line.ends_with(&*binary.to_string_lossy());
        }
    }
    println!(
        "idle agent ({}, {} bytes), 1 s polling of an unchanged repository for {secs} s ({} \
         passes): RSS {} KiB after the first pass, {} KiB at the end, peak {peak} KiB (sampled \
         every 10 s; of it RssAnon {}, RssFile {}, the executable's own pages {binary_rss_kib} \
         KiB); {} threads; load {}",
        binary.display(),
        std::fs::metadata(&binary).map_or(0, |m| m.len()),
        revisions.as_array().map_or(0, Vec::len),
        first,
        rss(agent.id()),
        field(agent.id(), "RssAnon:"),
        field(agent.id(), "RssFile:"),
        threads(agent.id()),
        load_average(),
    );
    agent.kill().unwrap();
    agent.wait().unwrap();
}
