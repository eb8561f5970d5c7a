//! Benchmark (not a test) of issue 20's figures, each as a ratio to its floor measured in the
//! same run, against the simulator over TLS on loopback:
//!
//! 1. `waits`: N VM creates (default 50) spread over the simulator's three nodes at
//!    `concurrency_per_node` 4, with 1 s and with 5 s tasks. Floor: the longest node's
//!    `⌈creates on it / 4⌉ × task time` (PVE's own time; nothing can be faster). Reported:
//!    the apply's time over the floor, and status GETs per task. The first run of each task
//!    time uses a fresh client (no task durations learnt yet); later runs reuse it, as a
//!    long-running agent does.
//! 2. `noop`: a no-op `reconcile_once` (apply mode: load and validate the manifests, observe,
//!    plan, nothing to apply) over 1,000 converged VMs with the simulator's latency fault
//!    adding 5 ms and 20 ms to every request. Floor: `(1 + ⌈G / C⌉) × RTT`, one
//!    `/cluster/resources` round trip then `G` pending-list reads `C` at a time
//!    (`[pve] read_concurrency`, default `DEFAULT_READ_CONCURRENCY`). A second floor is
//!    measured: the same `1 + G` GETs sent bare through `PveClient::execute`, `C` at a time,
//!    nothing decoded, validated or planned: the round trips plus the simulator's own work
//!    per request (it shares the two cores with the pass).
//!
//! Run: `cargo bench --bench floors` (both), `cargo bench --bench floors -- waits` or
//! `-- noop`. Knobs: `PROXOPS_BENCH_CREATES` (50), `PROXOPS_BENCH_RUNS` (4 for waits: the first is reported apart; 5 for noop),
//! `PROXOPS_BENCH_READ_CONCURRENCY` (the default).
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxops::config::{DEFAULT_READ_CONCURRENCY, NodeScope};
use proxops::execute::{self, Progress};
use proxops::reconcile::{self, Context, Mode, NoHooks, PlanOptions};
use proxops_pve::{ClientConfig, PveClient, RetryPolicy, Timeouts, Trust, WaitOptions};
use proxops_pve_sim::{RunningSim, Seed, SimConfig};
use tokio_util::sync::CancellationToken;

const NODES: usize = 3;
const CONCURRENCY: usize = 4;
const GUESTS: usize = 1_000;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let part = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wants = |name: &str| part.as_deref().is_none_or(|p| p == name);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("load: {}", load_average());
    runtime.block_on(async {
        if wants("waits") {
            for secs in [1, 5] {
                waits(Duration::from_secs(secs)).await;
            }
        }
        if wants("noop") {
            for ms in [5, 20] {
                noop(Duration::from_millis(ms)).await;
            }
        }
    });
    println!("load: {}", load_average());
}

/// `/proc/loadavg`'s three averages.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

async fn start(task_duration: Duration) -> RunningSim {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    proxops_pve_sim::start(
        SimConfig {
            seed: Seed::default(),
            tls: true,
            task_duration,
            ..SimConfig::default()
        },
        listener,
    )
    .await
    .unwrap()
}

fn context(sim: &RunningSim, read_concurrency: usize) -> Context {
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
            concurrency_per_node: CONCURRENCY,
            wait: WaitOptions::default(),
            lock_retry_for: Duration::from_secs(10),
            local_node: None,
            // Every create in one pass: the bench measures the waits, not the create cap.
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
        read_concurrency,
        snippets: proxops::snippets::SnippetsConfig::default(),
    }
}

/// VM `vmid`, on node `pve{vmid % 3 + 1}`.
fn vm(vmid: usize, state: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: vm-{vmid}\nspec:\n  node: pve{}\n  vmid: {vmid}\n  state: {state}\n  memory: 1GiB\n  cpu: {{type: host, cores: 1}}\n  disks:\n    - {{storage: local-lvm, size: 1GiB}}\n  networks:\n    - {{bridge: vmbr0}}\n",
        vmid % NODES + 1,
    )
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The creates with `task` long tasks, several runs on one simulator through one client
/// (each run creates new VMs; the first has no task durations learnt yet).
async fn waits(task: Duration) {
    let creates = env_usize("PROXOPS_BENCH_CREATES", 50);
    let runs = env_usize("PROXOPS_BENCH_RUNS", 4);
    let per_node = creates.div_ceil(NODES);
    let floor = task * u32::try_from(per_node.div_ceil(CONCURRENCY)).unwrap();
    let sim = start(task).await;
    let ctx = context(&sim, DEFAULT_READ_CONCURRENCY);
    let mut ratios = Vec::new();
    for run in 1..=runs {
        let files: BTreeMap<String, String> = (0..creates)
            .map(|i| {
                let vmid = 1000 * run + i;
                (format!("vm/vm-{vmid}.yaml"), vm(vmid, "stopped"))
            })
            .collect();
        let desired = reconcile::desired_state(&files, None).unwrap();
        let plan = reconcile::observe_and_plan(&ctx, &desired).await;
        sim.control().clear_requests();
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
        let counters = sim.control().requests().counters;
        let polls = counters
            .get("GET /nodes/{node}/tasks/{upid}/status")
            .copied()
            .unwrap_or(0);
        let writes: u64 = counters
            .iter()
            .filter(|(k, _)| !k.starts_with("GET "))
            .map(|(_, n)| n)
            .sum();
        let ratio = elapsed.as_secs_f64() / floor.as_secs_f64();
        if run > 1 {
            ratios.push(ratio);
        }
        println!(
            "waits: run {run} ({}), {creates} creates over {NODES} nodes at {CONCURRENCY}/node, \
             {task:?} tasks: {elapsed:.3?}, floor {floor:?} ({} rounds), ratio {ratio:.3}; \
             {writes} writes, {polls} status GETs = {:.2} per task ({ok} ok, {failed} failed, \
             {skipped} skipped)",
            if run == 1 {
                "fresh client"
            } else {
                "learnt durations"
            },
            per_node.div_ceil(CONCURRENCY),
            polls as f64 / writes.max(1) as f64,
        );
    }
    if !ratios.is_empty() {
        println!(
            "waits: {task:?} tasks: median ratio {:.3} over runs 2..={runs} (target <= 1.15)",
            median(&mut ratios)
        );
    }
    sim.shutdown().await;
}

/// The pass's GETs alone: `/cluster/resources`, then every guest's pending list,
/// `concurrency` at a time, answers not decoded.
async fn bare_reads(pve: &PveClient, concurrency: usize) {
    pve.execute(&proxops_pve::request::cluster_resources(Some(
        proxops_pve::ResourceType::Vm,
    )))
    .await
    .unwrap();
    let limit = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut reads = tokio::task::JoinSet::new();
    for i in 0..GUESTS {
        let (pve, limit) = (pve.clone(), limit.clone());
        reads.spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            let vmid = u32::try_from(1000 + i).unwrap();
            let node = format!("pve{}", vmid as usize % NODES + 1);
            pve.execute(&proxops_pve::request::qemu_pending(&node, vmid))
                .await
                .unwrap();
        });
    }
    while let Some(done) = reads.join_next().await {
        done.unwrap();
    }
}

/// No-op passes over 1,000 converged guests with `rtt` added to every request.
async fn noop(rtt: Duration) {
    let runs = env_usize("PROXOPS_BENCH_RUNS", 5);
    let read_concurrency = env_usize("PROXOPS_BENCH_READ_CONCURRENCY", DEFAULT_READ_CONCURRENCY);
    let sim = start(Duration::ZERO).await;
    let ctx = context(&sim, read_concurrency);
    let files: BTreeMap<String, String> = (0..GUESTS)
        .map(|i| {
            let state = if i % 2 == 0 { "started" } else { "stopped" };
            (format!("vm/vm-{i:04}.yaml"), vm(1000 + i, state))
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
        .unwrap()
    };
    let first = pass(Mode::Apply).await;
    assert!(first.report.is_some_and(|r| r.counts().1 == 0));
    // pvestatd's next run: until then `/cluster/resources` lags the guests just created and
    // started, and each pass would re-read their power state (`observe::recheck_power`).
    sim.control().refresh_stats();
    sim.control().add_latency(None, rtt).unwrap();
    let rounds = GUESTS.div_ceil(read_concurrency);
    let floor = rtt * u32::try_from(1 + rounds).unwrap();
    let mut ratios = Vec::new();
    let mut times = Vec::new();
    let mut bare = Vec::new();
    let mut sleeps = Vec::new();
    for _ in 0..runs {
        // The floor as the runtime's timer gives it: the same rounds as sleeps, one after
        // the other (tokio's timer has a 1 ms grain, so a sleep ends after its deadline).
        let start = Instant::now();
        for _ in 0..=rounds {
            tokio::time::sleep(rtt).await;
        }
        sleeps.push(start.elapsed().as_secs_f64() * 1e3);
        let start = Instant::now();
        bare_reads(&ctx.pve, read_concurrency).await;
        bare.push(start.elapsed().as_secs_f64() * 1e3);
        sim.control().clear_requests();
        let start = Instant::now();
        let done = pass(Mode::Apply).await;
        let elapsed = start.elapsed();
        assert!(done.report.is_none() && !done.plan.has_changes());
        let counters = sim.control().requests().counters;
        let requests: u64 = counters.values().sum();
        assert_eq!(
            requests,
            1 + GUESTS as u64,
            "one listing + one read per guest; sent: {counters:?}"
        );
        ratios.push(elapsed.as_secs_f64() / floor.as_secs_f64());
        times.push(elapsed.as_secs_f64() * 1e3);
    }
    let pass_ms = median(&mut times);
    let bare_ms = median(&mut bare);
    let sleeps_ms = median(&mut sleeps);
    println!(
        "noop: {GUESTS} converged guests, {rtt:?} round trip, read_concurrency \
         {read_concurrency}, load {}: median {pass_ms:.1} ms (min {:.1} ms), floor {floor:?} \
         (1 + {rounds} rounds), median ratio {:.3} over {runs} runs (target <= 1.2); the same \
         GETs bare: median {bare_ms:.1} ms, pass / bare {:.3}; the rounds as bare sleeps: \
         median {sleeps_ms:.1} ms ({:.3} of the floor)",
        load_average(),
        times.iter().copied().fold(f64::INFINITY, f64::min),
        median(&mut ratios),
        pass_ms / bare_ms,
        sleeps_ms / (floor.as_secs_f64() * 1e3),
    );
    sim.shutdown().await;
}
