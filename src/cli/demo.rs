//! `proxops demo`: with no cluster and no config, runs the agent against an in-process PVE
//! simulator and a git repository made from `examples/`, and shows the plan, the apply, an
//! out-of-band change and its correction (see [`crate::demo`]).
//!
//! Exit codes: 0 when the agent applied the repository and corrected the drift, 1 otherwise.

use crate::cli::Exit;
use crate::demo;

/// Arguments of `proxops demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Leave the temporary directory (repository, agent.toml, state database) and print its
    /// path.
    #[arg(long)]
    keep: bool,
}

/// Runs the demo.
pub async fn run(args: &Args) -> anyhow::Result<Exit> {
    let corrected = demo::run(demo::Options { keep: args.keep }).await?;
    Ok(if corrected {
        Exit::Success
    } else {
        crate::output::note("the demo did not end as expected; see the lines above");
        Exit::Failure
    })
}
