//! `proxops agent --config FILE` (also `run`, the Go program's name): the long-running agent.
//!
//! SIGTERM or SIGINT stops it gracefully: the current pass stops starting actions, stops
//! waiting for PVE tasks (they keep running; the next start re-attaches to them) and is
//! recorded as interrupted. A second signal stops at once. SIGHUP reloads the config.

use std::path::PathBuf;

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::cli::Exit;
use crate::cli::pass::DEFAULT_CONFIG;

/// Arguments of `proxops agent`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent configuration.
    #[arg(long, short = 'c', default_value = DEFAULT_CONFIG, env = "PROXOPS_CONFIG")]
    config: PathBuf,
}

/// Runs the agent until a signal stops it.
pub async fn run(args: &Args) -> anyhow::Result<Exit> {
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let shutdown = CancellationToken::new();
    let (reload_tx, reload_rx) = mpsc::channel(1);

    let agent = crate::serve::run(&args.config, shutdown.clone(), reload_rx);
    tokio::pin!(agent);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = &mut agent => {
                result?;
                return Ok(Exit::Success);
            }
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
            _ = hangup.recv() => {
                let _ = reload_tx.try_send(());
                continue;
            }
        }
        if stopping {
            anyhow::bail!(
                "stopped at once by a second signal; the pass in progress is recorded as interrupted at the next start"
            );
        }
        tracing::info!(
            "signal received: finishing the current step, then stopping (signal again to stop at once)"
        );
        stopping = true;
        shutdown.cancel();
    }
}
