//! Benchmark (not a test) of issue 5's guest figures against the simulator:
//!
//! 1. 1,000 VMs over 10 nodes (half started) created by a first apply, then observe + plan
//!    of those converged guests: the HTTP requests sent, by endpoint (target: one
//!    `/cluster/resources` plus one config read per managed guest, here its `pending` list),
//!    and the wall time;
//! 2. a no-op pass for the same 1,000 guests: `reconcile_once` in apply mode (load and
//!    validate the manifests, observe, plan, nothing to apply), as `proxops apply` and each
//!    agent pass run it (the agent adds its git fetch and store records, not measured here);
//! 3. a no-op recorded agent pass for the same 1,000 guests (`agent::pass::run_pass`: git
//!    fetch of an unchanged `file://` repository, load, observe, plan, SQLite records);
//! 4. applying 200 VM creates (20 per node) with 200 ms simulated task time, at 1 and at 4
//!    concurrent actions per node.
//!
//! Run: `cargo bench --bench guests`, or in the debug profile with
//! `cargo test --bench guests` (the figures then include unoptimised planning).
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proxops::agent::breaker::Breaker;
use proxops::agent::pass::{PassDeps, run_pass};
use proxops::agent::retry::Verdict;
use proxops::agent::status::LiveStatus;
use proxops::config::{NodeScope, Poll, SourceConfig};
use proxops::execute::{self, Progress};
use proxops::metrics::Metrics;
use proxops::reconcile::{self, Context, Mode, NoHooks, PlanOptions};
use proxops::source::git::GitSource;
use proxops_pve::{ClientConfig, PveClient, RetryPolicy, Timeouts, Trust, WaitOptions};
use proxops_pve_sim::{RunningSim, Seed, SimConfig};
use proxops_store::{Store, Trigger};
use tokio_util::sync::CancellationToken;

const NODES: usize = 10;
const GUESTS: usize = 1_000;
const CREATES: usize = 200;
const RUNS: usize = 7;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        converged().await;
        agent_passes().await;
        for concurrency in [1, 4] {
            creates(concurrency).await;
        }
    });
}

fn seed() -> Seed {
    let mut seed = Seed::default();
    let template = seed.nodes[0].clone();
    seed.nodes = (1..=NODES)
        .map(|i| proxops_pve_sim::NodeSeed {
            name: format!("node{i:02}"),
            ..template.clone()
        })
        .collect();
    seed
}

async fn start(seed: Seed, task_duration: Duration) -> RunningSim {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    proxops_pve_sim::start(
        SimConfig {
            seed,
            tls: true,
            task_duration,
            ..SimConfig::default()
        },
        listener,
    )
    .await
    .unwrap()
}

fn context(sim: &RunningSim, concurrency_per_node: usize) -> Context {
    let pve = PveClient::new(ClientConfig {
        base_url: sim.base_url(),
        token_id: "root@pam!proxops".into(),
        token_secret: "proxops-dev-secret".to_owned().into(),
        trust: Trust::Fingerprint(sim.fingerprint().unwrap().to_owned()),
        timeout: Timeouts::default(),
        retry: RetryPolicy::default(),
    })
    .unwrap();
    Context {
        pve,
        scope: NodeScope::All,
        execute: execute::Options {
            concurrency_per_node,
            wait: WaitOptions::default(),
            lock_retry_for: Duration::from_secs(10),
            local_node: None,
            // Every guest in one pass: the bench measures the executor, not the create cap.
            scope: proxops_core::scope::Scope {
                max_creates: u32::MAX,
                ..proxops_core::scope::Scope::default()
            },
            cluster_lock_dir: None,
            snapshots: execute::SnapshotOptions::default(),
            backup: None,
        },
        secrets: proxops::config::SecretsConfig::default(),
        mode: proxops::config::Mode::Apply,
        read_concurrency: proxops::config::DEFAULT_READ_CONCURRENCY,
        snippets: proxops::snippets::SnippetsConfig::default(),
    }
}

fn vm(i: usize, state: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: vm-{i:04}\nspec:\n  node: node{:02}\n  vmid: {}\n  state: {state}\n  memory: 1GiB\n  cpu: {{type: host, cores: 1}}\n  disks:\n    - {{storage: local-lvm, size: 1GiB}}\n  networks:\n    - {{bridge: vmbr0}}\n",
        i % NODES + 1,
        1000 + i
    )
}

/// Min, median and max of `timings` (sorted in place).
fn spread(timings: &mut [Duration]) -> String {
    timings.sort();
    format!(
        "min {:?}, median {:?}, max {:?} over {} runs",
        timings[0],
        timings[timings.len() / 2],
        timings[timings.len() - 1],
        timings.len()
    )
}

fn print_counters(counters: &BTreeMap<String, u64>) {
    for (endpoint, count) in counters {
        println!("  {count:>5}  {endpoint}");
    }
}

/// 1,000 guests created by ProxOps itself (so PVE holds exactly what the manifests say),
/// then observe + plan and whole no-op passes measured against them.
async fn converged() {
    let sim = start(seed(), Duration::ZERO).await;
    let ctx = context(&sim, 4);
    let files: BTreeMap<String, String> = (0..GUESTS)
        .map(|i| {
            let state = if i % 2 == 0 { "started" } else { "stopped" };
            (format!("vm/vm-{i:04}.yaml"), vm(i, state))
        })
        .collect();
    let progress: Progress = Arc::new(|_| {});
    let cancel = CancellationToken::new();
    let options = PlanOptions::default();
    let (ctx, files, options, progress, cancel) = (&ctx, &files, &options, &progress, &cancel);
    let pass = |mode| async move {
        reconcile::reconcile_once(
            ctx,
            files,
            None,
            mode,
            options,
            &mut NoHooks,
            progress,
            cancel,
        )
        .await
    };

    let start = Instant::now();
    let first = pass(Mode::Apply).await.unwrap();
    let (ok, failed, skipped) = first.report.as_ref().map_or((0, 0, 0), |r| r.counts());
    println!(
        "setup: first apply of {GUESTS} VMs over {NODES} nodes (half started), tasks of 0 ms: \
         {:?} ({ok} ok, {failed} failed, {skipped} skipped)",
        start.elapsed()
    );

    let desired = reconcile::desired_state(files, None).unwrap();
    let mut timings = Vec::new();
    let mut counters = BTreeMap::new();
    let mut summary = (0, 0);
    for _ in 0..RUNS {
        sim.control().clear_requests();
        let start = Instant::now();
        let plan = reconcile::observe_and_plan(ctx, &desired).await;
        timings.push(start.elapsed());
        counters = sim.control().requests().counters;
        summary = (plan.actions().count(), plan.findings.len());
    }
    let total: u64 = counters.values().sum();
    println!(
        "observe+plan, {GUESTS} converged guests over {NODES} nodes (half running; TLS, loopback): \
         {total} HTTP requests, {} actions, {} findings; {}",
        summary.0,
        summary.1,
        spread(&mut timings)
    );
    print_counters(&counters);

    let mut timings = Vec::new();
    for _ in 0..RUNS {
        sim.control().clear_requests();
        let start = Instant::now();
        let done = pass(Mode::Apply).await.unwrap();
        timings.push(start.elapsed());
        counters = sim.control().requests().counters;
        assert!(done.report.is_none(), "a converged pass applies nothing");
        assert!(!done.plan.has_changes());
    }
    let total: u64 = counters.values().sum();
    println!(
        "no-op pass (reconcile_once, apply mode: load + validate + observe + plan, nothing to \
         apply), {GUESTS} converged guests: {total} HTTP requests, {} writes; {}",
        counters
            .iter()
            .filter(|(k, _)| !k.starts_with("GET "))
            .map(|(_, n)| n)
            .sum::<u64>(),
        spread(&mut timings)
    );
    sim.shutdown().await;
}

/// Runs `git args` in `dir` with a fixed identity (no host configuration needed).
fn git(dir: &std::path::Path, args: &[&str]) {
    let status = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.invalid",
        ])
        .args(args)
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

/// Recorded agent passes (`agent::pass::run_pass`: git fetch of an unchanged branch, load,
/// observe, plan, nothing to apply, every record written to a real SQLite store) over
/// 1,000 converged guests, after a first pass that created them.
async fn agent_passes() {
    let sim = start(seed(), Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    for i in 0..GUESTS {
        let state = if i % 2 == 0 { "started" } else { "stopped" };
        let path = work.join(format!("vm/vm-{i:04}.yaml"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, vm(i, state)).unwrap();
    }
    git(&work, &["init", "--quiet", "--initial-branch=main"]);
    git(&work, &["add", "--all"]);
    git(&work, &["commit", "--quiet", "-m", "1,000 VMs"]);
    git(
        dir.path(),
        &["clone", "--quiet", "--bare", "work", "repo.git"],
    );
    let source = SourceConfig {
        url: format!("file://{}", dir.path().join("repo.git").display()),
        branch: "main".into(),
        path: String::new(),
        poll: Poll::Every(Duration::from_secs(60)),
        token: None,
        ssh_key_file: None,
        known_hosts_file: None,
        verify: None,
    };
    let state_dir = dir.path().join("state");
    std::fs::create_dir_all(&state_dir).unwrap();
    let deps = PassDeps {
        context: context(&sim, 4),
        source: Arc::new(GitSource::open(&source, &state_dir).unwrap()),
        store: Arc::new(Mutex::new(
            Store::open(&state_dir.join("state.db")).unwrap(),
        )),
        live: Arc::new(LiveStatus::default()),
        cluster: None,
        node_label: "*".into(),
        interrupt: Arc::new(AtomicBool::new(false)),
        metrics: Arc::new(Metrics::default()),
        breaker: Arc::new(Mutex::new(Breaker::new(5, Duration::from_secs(60)))),
        plan_options: PlanOptions::default(),
        enforced: Mutex::new(None),
        forge: None,
        approve: proxops::agent::approval::ApprovePolicy::default(),
        rollout: None,
    };
    let cancel = CancellationToken::new();
    let start = Instant::now();
    let verdict = run_pass(&deps, Trigger::Startup, &cancel).await;
    println!(
        "setup: first recorded agent pass creating {GUESTS} VMs: {:?} ({verdict:?})",
        start.elapsed()
    );
    let mut timings = Vec::new();
    let mut counters = BTreeMap::new();
    for _ in 0..RUNS {
        sim.control().clear_requests();
        let start = Instant::now();
        let verdict = run_pass(&deps, Trigger::Poll, &cancel).await;
        timings.push(start.elapsed());
        counters = sim.control().requests().counters;
        assert!(matches!(verdict, Verdict::Ok), "{verdict:?}");
    }
    let total: u64 = counters.values().sum();
    let writes: u64 = counters
        .iter()
        .filter(|(k, _)| !k.starts_with("GET "))
        .map(|(_, n)| n)
        .sum();
    println!(
        "no-op recorded agent pass (run_pass: git fetch, load, observe, plan, store records), \
         {GUESTS} converged guests: {total} HTTP requests, {writes} writes; {}",
        spread(&mut timings)
    );
    sim.shutdown().await;
}

async fn creates(concurrency: usize) {
    let sim = start(seed(), Duration::from_millis(200)).await;
    let ctx = context(&sim, concurrency);
    let files: BTreeMap<String, String> = (0..CREATES)
        .map(|i| (format!("vm/vm-{i:04}.yaml"), vm(i, "stopped")))
        .collect();
    let desired = reconcile::desired_state(&files, None).unwrap();
    let plan = reconcile::observe_and_plan(&ctx, &desired).await;
    let progress: Progress = Arc::new(|_| {});
    let start = Instant::now();
    let report = execute::apply(
        &ctx.pve,
        &desired,
        &plan,
        &ctx.execute,
        &progress,
        &mut execute::open_gate(),
        &CancellationToken::new(),
    )
    .await;
    let elapsed = start.elapsed();
    let (ok, failed, skipped) = report.counts();
    println!(
        "apply {CREATES} VM creates over {NODES} nodes, 200 ms tasks, concurrency {concurrency}/node: \
         {elapsed:?} ({ok} ok, {failed} failed, {skipped} skipped)"
    );
    sim.shutdown().await;
}
