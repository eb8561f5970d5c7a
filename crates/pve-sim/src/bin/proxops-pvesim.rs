//! `proxops-pvesim`: runs the PVE simulator until Ctrl-C or SIGTERM and prints where it
//! listens, the certificate fingerprint and the default credentials.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use proxops_pve_sim::{Seed, SimConfig};

/// An in-memory Proxmox VE 9 cluster over HTTPS, for trying ProxOps without a cluster.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8006")]
    listen: SocketAddr,
    /// Serve plain HTTP instead of HTTPS.
    #[arg(long)]
    http: bool,
    /// Seed file (JSON, or TOML when it ends in .toml), or a built-in seed: `default`
    /// (pve1..pve3 with local and local-lvm) or `realistic-3node` (a real 3-node PVE 9
    /// cluster's shape with a shared NFS storage and per-type task durations).
    #[arg(long)]
    seed: Option<PathBuf>,
    /// Password of root@pam.
    #[arg(long, default_value = "proxops")]
    root_password: String,
    /// Secret of the API token root@pam!proxops.
    #[arg(long, default_value = "proxops-dev-secret")]
    token_secret: String,
    /// How long each task runs: `1s`, `250ms`, `0` (finish inside the request).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    task_duration: Duration,
    /// Delay before answering failed authentications (PVE waits about 3 s).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    auth_failure_delay: Duration,
    /// Skip parameter validation against the PVE schema (debugging only).
    #[arg(long)]
    no_validate: bool,
    /// How often guest status, names and template flags in /cluster/resources are
    /// refreshed, as pvestatd does every 10 s; `0` reports the live state.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    stats_interval: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (num, unit) = match text.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration '{text}'"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => {
            return Err(format!(
                "invalid duration unit in '{text}' (use ms, s or m)"
            ));
        }
    };
    Ok(Duration::from_secs_f64(secs))
}

// The binary's banner and fatal errors are its only output.
#[allow(clippy::print_stderr)]
#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[allow(clippy::print_stdout)]
async fn run(args: Args) -> anyhow::Result<()> {
    let seed = match &args.seed {
        Some(path) => match path.to_str().and_then(Seed::builtin) {
            Some(seed) if !path.exists() => seed,
            _ => Seed::from_file(path)?,
        },
        None => Seed::default(),
    };
    let config = SimConfig {
        seed,
        tls: !args.http,
        root_password: args.root_password.clone(),
        token_secret: args.token_secret.clone(),
        task_duration: args.task_duration,
        auth_failure_delay: args.auth_failure_delay,
        validate: !args.no_validate,
        stats_interval: args.stats_interval,
        ..SimConfig::default()
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let sim = proxops_pve_sim::start(config, listener).await?;
    println!("proxops-pvesim listening on {}", sim.base_url());
    if let Some(fp) = sim.fingerprint() {
        println!("certificate fingerprint (SHA-256): {fp}");
    }
    println!("user root@pam, password: {}", args.root_password);
    println!(
        "API token: PVEAPIToken=root@pam!proxops={}",
        args.token_secret
    );
    println!(
        "control API: {}/_sim/requests",
        sim.base_url().trim_end_matches("/api2/json")
    );
    shutdown_signal().await;
    println!("shutting down");
    sim.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
