//! `proxops drift`: open drift findings (and recently resolved ones), from the running agent
//! or, when none answers, from the state database read-only.

use std::path::PathBuf;

use crate::cli::Exit;
use crate::cli::pass::DEFAULT_CONFIG;
use crate::cli::status::ask_agent_or_store;
use crate::http::{DriftListJson, drift_from_store};
use crate::output;

/// Arguments of `proxops drift`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent configuration (for its listen address and state directory).
    #[arg(long, short = 'c', default_value = DEFAULT_CONFIG, env = "PROXOPS_CONFIG")]
    pub config: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Prints the drift findings.
pub async fn run(args: &Args) -> anyhow::Result<Exit> {
    let drift: DriftListJson = ask_agent_or_store(&args.config, "/api/v1/drift", |store, _| {
        drift_from_store(store)
    })
    .await?;
    if args.json {
        output::print_json(&drift)?;
    } else {
        output::print_drift(&drift);
    }
    Ok(Exit::Success)
}
