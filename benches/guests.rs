//! Benchmark (not a test) of issue 5's guest figures against the simulator:
//!
//! 1. observe + plan for 1,000 owned guests over 10 nodes: the HTTP requests sent, by
//!    endpoint (target: one `/cluster/resources` plus one config GET per managed guest), and
//!    the wall time; half the guests run, and a running guest also gets its `pending` read;
//! 2. applying 200 VM creates (20 per node) with 200 ms simulated task time, at 1 and at 4
//!    concurrent actions per node.
//!
//! Run: `cargo bench --bench guests`, or in the debug profile with
//! `cargo test --bench guests` (the figures then include unoptimised planning).
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxops::config::NodeScope;
use proxops::execute::{self, Progress};
use proxops::reconcile::{self, Context};
use proxops_pve::{ClientConfig, PveClient, RetryPolicy, Timeouts, Trust, WaitOptions};
use proxops_pve_sim::{GuestSeed, RunningSim, Seed, SimConfig};
use tokio_util::sync::CancellationToken;

const NODES: usize = 10;
const GUESTS: usize = 1_000;
const CREATES: usize = 200;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        observe_and_plan().await;
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
        },
        secrets: proxops::config::SecretsConfig::default(),
    }
}

fn vm(i: usize, state: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: vm-{i:04}\nspec:\n  node: node{:02}\n  vmid: {}\n  state: {state}\n  memory: 1GiB\n  cpu: {{type: host, cores: 1}}\n  disks:\n    - {{storage: local-lvm, size: 1GiB}}\n  networks:\n    - {{bridge: vmbr0}}\n",
        i % NODES + 1,
        1000 + i
    )
}

async fn observe_and_plan() {
    let mut seed = seed();
    let mut files = BTreeMap::new();
    for i in 0..GUESTS {
        let running = i % 2 == 0;
        seed.guests.push(GuestSeed {
            vmid: u32::try_from(1000 + i).unwrap(),
            kind: "qemu".into(),
            node: format!("node{:02}", i % NODES + 1),
            config: BTreeMap::from([
                ("name".to_owned(), format!("vm-{i:04}")),
                ("memory".to_owned(), "1024".to_owned()),
                ("cores".to_owned(), "1".to_owned()),
                ("tags".to_owned(), "proxops".to_owned()),
            ]),
            running,
        });
        files.insert(
            format!("vm/vm-{i:04}.yaml"),
            vm(i, if running { "started" } else { "stopped" }),
        );
    }
    let sim = start(seed, Duration::ZERO).await;
    let ctx = context(&sim, 4);
    let desired = reconcile::desired_state(&files, None).unwrap();
    let mut timings = Vec::new();
    let mut counters = BTreeMap::new();
    let mut actions = 0;
    for _ in 0..5 {
        sim.control().clear_requests();
        let start = Instant::now();
        let plan = reconcile::observe_and_plan(&ctx, &desired).await;
        timings.push(start.elapsed());
        counters = sim.control().requests().counters;
        actions = plan.actions().count();
    }
    timings.sort();
    let total: u64 = counters.values().sum();
    println!(
        "observe+plan, {GUESTS} owned guests over {NODES} nodes (half running; TLS, loopback): \
         {total} HTTP requests, {actions} actions planned; min {:?}, median {:?}, max {:?} over {} runs",
        timings[0],
        timings[timings.len() / 2],
        timings[timings.len() - 1],
        timings.len()
    );
    for (endpoint, count) in &counters {
        println!("  {count:>5}  {endpoint}");
    }
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
