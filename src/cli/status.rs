//! `proxops status`: the last applied and last attempted revision of this node. Asks the
//! running agent (`GET /api/v1/status` on its loopback listener) and, when none answers,
//! reads the state database read-only, so it never writes under the agent's feet.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use proxops_store::{Store, StoreError};
use serde::de::DeserializeOwned;

use crate::agent::{database_path, node_label};
use crate::cli::Exit;
use crate::cli::pass::DEFAULT_CONFIG;
use crate::config::AgentConfig;
use crate::http::{StatusJson, status_from_store};
use crate::output;

/// Arguments of `proxops status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent configuration (for its listen address and state directory).
    #[arg(long, short = 'c', default_value = DEFAULT_CONFIG, env = "PROXOPS_CONFIG")]
    pub config: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Prints the status.
pub async fn run(args: &Args) -> anyhow::Result<Exit> {
    let status: StatusJson =
        ask_agent_or_store(&args.config, "/api/v1/status", status_from_store).await?;
    if args.json {
        output::print_json(&status)?;
    } else {
        output::print_status(&status);
    }
    Ok(Exit::Success)
}

/// Reads `path` from the running agent, or computes the same answer from the database.
pub(crate) async fn ask_agent_or_store<T: DeserializeOwned>(
    config_path: &std::path::Path,
    path: &str,
    from_store: impl FnOnce(&Store, &str) -> Result<T, StoreError>,
) -> anyhow::Result<T> {
    let config = AgentConfig::load(config_path)?;
    let url = format!("http://{}{path}", config.listen);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .context("building the HTTP client")?;
    match client.get(&url).send().await {
        Ok(response) if response.status().is_success() => {
            return response
                .json()
                .await
                .with_context(|| format!("reading {url}"));
        }
        Ok(response) => {
            tracing::info!(status = %response.status(), "agent answered with an error; reading the database")
        }
        Err(error) => tracing::info!(%error, "no agent answers; reading the database"),
    }
    let db = database_path(&config.state_dir);
    let store = Store::open_read_only(&db)
        .with_context(|| format!("no agent answers on {}", config.listen))?;
    Ok(from_store(&store, &node_label(&config.node))?)
}
