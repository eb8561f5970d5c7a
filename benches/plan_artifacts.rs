//! Benchmark (not a test): observe + plan for 2,000 artifacts over 20 nodes against the
//! simulator, counting the HTTP requests sent and timing the pass.
//!
//! Run: `cargo bench --bench plan_artifacts` (release). Each artifact is placed on two nodes
//! and every other one already exists on its first node, so 3,000 of the 4,000 placements
//! are planned as downloads.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proxops::config::NodeScope;
use proxops::execute;
use proxops::reconcile::{self, Context};
use proxops_pve::{ClientConfig, PveClient, RetryPolicy, Timeouts, Trust, WaitOptions};
use proxops_pve_sim::{SimConfig, VolumeSeed};

const NODES: usize = 20;
const ARTIFACTS: usize = 2_000;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}

async fn run() {
    let kinds = [
        ("ISO", "iso", "iso"),
        ("CTTemplate", "vztmpl", "tar.zst"),
        ("DiskImage", "import", "qcow2"),
    ];
    let mut seed = proxops_pve_sim::Seed::default();
    let template = seed.nodes[0].clone();
    seed.nodes = (1..=NODES)
        .map(|i| proxops_pve_sim::NodeSeed {
            name: format!("node{i:02}"),
            ..template.clone()
        })
        .collect();
    let mut files = BTreeMap::new();
    for i in 0..ARTIFACTS {
        let (kind, content, ext) = kinds[i % kinds.len()];
        let nodes = [
            format!("node{:02}", i % NODES + 1),
            format!("node{:02}", (i + 7) % NODES + 1),
        ];
        let filename = format!("file-{i:04}.{ext}");
        // The first node of every other artifact already has it.
        if i % 2 == 0 {
            seed.volumes.push(VolumeSeed {
                node: nodes[0].clone(),
                volid: format!("local:{content}/{filename}"),
                size: 1024,
            });
        }
        files.insert(
            format!("artifacts/a{i:04}.yaml"),
            format!(
                "apiVersion: proxops/v1alpha1\nkind: {kind}\nmetadata:\n  name: a{i:04}\nspec:\n  nodes: [{}, {}]\n  storage: local\n  filename: {filename}\n  url: http://127.0.0.1:9/{filename}\n",
                nodes[0], nodes[1]
            ),
        );
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = proxops_pve_sim::start(
        SimConfig {
            seed,
            tls: true,
            ..SimConfig::default()
        },
        listener,
    )
    .await
    .unwrap();
    let pve = PveClient::new(ClientConfig {
        base_url: sim.base_url(),
        token_id: "root@pam!proxops".into(),
        token_secret: "proxops-dev-secret".to_owned().into(),
        trust: Trust::Fingerprint(sim.fingerprint().unwrap().to_owned()),
        timeout: Timeouts::default(),
        retry: RetryPolicy::default(),
    })
    .unwrap();
    let ctx = Context {
        pve,
        scope: NodeScope::All,
        execute: execute::Options {
            concurrency_per_node: 4,
            wait: WaitOptions::default(),
            lock_retry_for: Duration::from_secs(1),
            local_node: None,
            scope: proxops_core::scope::Scope::default(),
            cluster_lock_dir: None,
        },
        secrets: proxops::config::SecretsConfig::default(),
        mode: proxops::config::Mode::Apply,
        read_concurrency: proxops::config::DEFAULT_READ_CONCURRENCY,
        snippets: proxops::snippets::SnippetsConfig::default(),
    };
    let desired = reconcile::desired_state(&files, None).unwrap();
    let mut timings = Vec::new();
    let mut requests = 0;
    let mut downloads = 0;
    for _ in 0..5 {
        sim.control().clear_requests();
        let start = Instant::now();
        let plan = reconcile::observe_and_plan(&ctx, &desired).await;
        timings.push(start.elapsed());
        requests = sim.control().requests().requests.len();
        downloads = plan.actions().count();
    }
    timings.sort();
    println!(
        "observe+plan, {ARTIFACTS} artifacts over {NODES} nodes (TLS, loopback): {requests} HTTP requests \
         ({} per node), {downloads} downloads planned; min {:?}, median {:?}, max {:?} over {} runs",
        requests / NODES,
        timings[0],
        timings[timings.len() / 2],
        timings[timings.len() - 1],
        timings.len()
    );
    sim.shutdown().await;
}
