//! GET throughput of the PVE simulator on loopback (a benchmark, not a test).
//!
//! Starts the simulator in-process, over plain HTTP and over HTTPS, and sends a fixed number
//! of authenticated GETs from N concurrent reqwest clients, each with its own HTTP/1.1
//! keep-alive connection (as pveproxy speaks HTTP/1.1). Prints requests/s and p50/p99
//! latency per (transport, path). The load generator shares the machine's cores with the
//! simulator, so the figures are a lower bound for the simulator alone.
//!
//! `cargo bench -p proxops-pve-sim --bench get_throughput`
//!
//! Knobs (environment): `PVESIM_BENCH_CLIENTS` (default 8), `PVESIM_BENCH_REQUESTS` per
//! scenario (default 20000), `PVESIM_BENCH_WARMUP` requests per client before timing
//! (default 50).

#![allow(
    clippy::print_stdout,
    reason = "a benchmark reports its figures on stdout"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use proxops_pve_sim::{SimConfig, start};

const TOKEN: &str = "PVEAPIToken=root@pam!proxops=proxops-dev-secret";
const PATHS: [&str; 2] = ["/version", "/nodes/pve1/storage/local/content"];

struct Scenario {
    transport: &'static str,
    path: &'static str,
    requests: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Scenario {
    fn per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile(&self, p: f64) -> Duration {
        // `latencies` is sorted; nearest-rank percentile.
        let rank = ((p / 100.0) * self.latencies.len() as f64).ceil() as usize;
        self.latencies[rank.clamp(1, self.latencies.len()) - 1]
    }
}

fn env_usize(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v} is not a number")),
        Err(_) => Ok(default),
    }
}

fn client(tls: bool) -> Result<reqwest::Client> {
    let builder = reqwest::Client::builder()
        .http1_only()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1)
        .timeout(Duration::from_secs(30));
    let builder = if tls {
        builder.tls_danger_accept_invalid_certs(true)
    } else {
        builder
    };
    builder.build().context("building a reqwest client")
}

async fn get(client: &reqwest::Client, url: &str) -> Result<()> {
    let resp = client
        .get(url)
        .header("Authorization", TOKEN)
        .send()
        .await?;
    let status = resp.status();
    let body = resp.bytes().await?;
    if !status.is_success() {
        bail!("GET {url}: {status} {}", String::from_utf8_lossy(&body));
    }
    Ok(())
}

async fn run_scenario(
    transport: &'static str,
    base: &str,
    path: &'static str,
    clients: usize,
    requests: usize,
    warmup: usize,
) -> Result<Scenario> {
    let url: Arc<str> = Arc::from(format!("{base}{path}"));
    let tls = transport == "https";
    // Connect and warm up every client before the clock starts (TLS handshakes excluded).
    let mut pool = Vec::with_capacity(clients);
    for _ in 0..clients {
        let c = client(tls)?;
        for _ in 0..warmup {
            get(&c, &url).await?;
        }
        pool.push(c);
    }
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut handles = Vec::with_capacity(clients);
    for c in pool {
        let next = Arc::clone(&next);
        let url = Arc::clone(&url);
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(requests / clients + 1);
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                let t = Instant::now();
                get(&c, &url).await?;
                lat.push(t.elapsed());
            }
            anyhow::Ok(lat)
        }));
    }
    let mut latencies = Vec::with_capacity(requests);
    for h in handles {
        latencies.extend(h.await.context("client task panicked")??);
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Ok(Scenario {
        transport,
        path,
        requests: latencies.len(),
        elapsed,
        latencies,
    })
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

async fn bench() -> Result<()> {
    let clients = env_usize("PVESIM_BENCH_CLIENTS", 8)?.max(1);
    let requests = env_usize("PVESIM_BENCH_REQUESTS", 20_000)?.max(1);
    let warmup = env_usize("PVESIM_BENCH_WARMUP", 50)?;
    println!(
        "PVE simulator GET throughput: {clients} keep-alive clients (HTTP/1.1), \
         {requests} requests per scenario, {warmup} warm-up requests per client, \
         {} CPUs",
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    let mut results = Vec::new();
    for tls in [false, true] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let sim = start(
            SimConfig {
                tls,
                ..SimConfig::default()
            },
            listener,
        )
        .await?;
        let base = sim.base_url();
        let transport = if tls { "https" } else { "http" };
        for path in PATHS {
            results.push(run_scenario(transport, &base, path, clients, requests, warmup).await?);
        }
        sim.shutdown().await;
    }
    println!();
    println!("| transport | path | requests | clients | seconds | requests/s | p50 ms | p99 ms |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for s in &results {
        println!(
            "| {} | {} | {} | {clients} | {:.2} | {:.0} | {} | {} |",
            s.transport,
            s.path,
            s.requests,
            s.elapsed.as_secs_f64(),
            s.per_second(),
            ms(s.percentile(50.0)),
            ms(s.percentile(99.0)),
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; a harness=false bench must not treat `cargo test
    // --benches` (which passes no `--bench`) as a request to run the full measurement.
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench())
}
