//! The command line: one module per subcommand, each with a `run` function that returns
//! data or an exit code; exit codes are defined here and nowhere else.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod adopt;
pub mod agent;
pub mod apply;
pub mod approve;
pub mod check;
pub mod completions;
pub mod demo;
pub mod drift;
pub mod freeze;
pub mod migrate_config;
pub mod pass;
pub mod plan;
pub mod rollback;
pub mod schema;
pub mod status;
pub mod validate;

/// ProxOps: GitOps for Proxmox VE. Manifests in git, applied by an agent on each node.
#[derive(Debug, Parser)]
#[command(name = "proxops", version, about, propagate_version = true)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG wins when set.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

impl Cli {
    /// How chatty logging should be.
    pub fn verbosity(&self) -> u8 {
        self.verbose
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent against a simulated PVE cluster and the example repository (no setup needed).
    Demo(demo::Args),
    /// Check a manifest repository and report every problem in it.
    Validate(validate::Args),
    /// Show what a pass would change on PVE, without changing anything.
    #[command(alias = "diff")]
    Plan(plan::Args),
    /// Plan, confirm, and apply the plan to PVE.
    Apply(apply::Args),
    /// Run the agent: follow the repository and keep PVE in the declared state.
    #[command(alias = "run")]
    Agent(agent::Args),
    /// Show the last applied and attempted revision (asks the running agent).
    Status(status::Args),
    /// Show open drift findings (asks the running agent).
    Drift(drift::Args),
    /// Hold every write of the agent (drift is still observed and reported).
    Freeze(freeze::Args),
    /// Lift a freeze: the agent's next pass may write again.
    Unfreeze(freeze::UnfreezeArgs),
    /// Roll a guest back to a snapshot ProxOps took before a risky update.
    Rollback(rollback::Args),
    /// Let the actions a pass held for approval run (asks the running agent).
    Approve(approve::Args),
    /// Keep the actions a pass held for approval held (asks the running agent).
    Reject(approve::Args),
    /// Print the JSON Schema of the manifest format (for editors and the YAML language server).
    Schema(schema::Args),
    /// Write manifests for the guests and files already on PVE (reads only; never writes to PVE).
    Adopt(adopt::Args),
    /// Check PVE against what the manifests and the current plan need (storages, bridges, privileges).
    Check(check::Args),
    /// Turn the Go ProxOps's `proxops.yaml` / `clusters/<c>/config.yaml` into an agent.toml.
    MigrateConfig(migrate_config::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(hide = true)]
    Completions(completions::Args),
    /// Print the manual page, or write one per subcommand with --dir.
    #[command(hide = true)]
    Man(completions::ManArgs),
}

/// The process exit codes ProxOps documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Everything succeeded (validate: the repository is valid).
    Success,
    /// An error, or invalid input (validate: at least one error found).
    Failure,
    /// `plan`: the plan has changes.
    ChangesPending,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        match exit {
            Exit::Success => ExitCode::SUCCESS,
            Exit::Failure => ExitCode::from(1),
            Exit::ChangesPending => ExitCode::from(2),
        }
    }
}

/// Runs the parsed command line.
///
/// # Errors
/// Operational failures (unreadable paths, …); invalid manifests are an [`Exit`], not an error.
pub fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Validate(args) => validate::run(&args),
        Command::Schema(args) => schema::run(&args),
        Command::Check(args) => runtime()?.block_on(check::run(&args)),
        Command::Adopt(args) => runtime()?.block_on(adopt::run(&args)),
        Command::MigrateConfig(args) => migrate_config::run(&args),
        Command::Completions(args) => completions::run(&args),
        Command::Man(args) => completions::man(&args),
        Command::Plan(args) => runtime()?.block_on(plan::run(&args)),
        Command::Apply(args) => runtime()?.block_on(apply::run(&args)),
        Command::Agent(args) => runtime()?.block_on(agent::run(&args)),
        Command::Status(args) => runtime()?.block_on(status::run(&args)),
        Command::Drift(args) => runtime()?.block_on(drift::run(&args)),
        Command::Freeze(args) => freeze::run(&args),
        Command::Unfreeze(args) => freeze::unfreeze(&args),
        Command::Rollback(args) => runtime()?.block_on(rollback::run(&args)),
        Command::Approve(args) => approve::run(&args, true),
        Command::Reject(args) => approve::run(&args, false),
        Command::Demo(args) => runtime()?.block_on(demo::run(&args)),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}
