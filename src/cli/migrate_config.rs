//! `proxops migrate-config`: reads the Go ProxOps's `proxops.yaml` and/or
//! `clusters/<c>/config.yaml` (`--from FILE`, repeatable, or `--repo PATH` to discover them as
//! the Go program does; `PROXOPS_CONFIG` / `PROXOPS_GIT_PATH` are the defaults), honours its
//! `PROXOPS_*` credential variables, and writes an agent.toml (`--out FILE`, default stdout)
//! with the secrets moved to files in `--secrets-dir` (mode 0600). Logic in
//! [`crate::migrate`].
//!
//! The summary (mapped keys, notes, warnings, errors) goes to stderr; no secret value is ever
//! printed. Exit 0 when the agent.toml is complete, 1 when a line is an error.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context as _;

use crate::cli::Exit;
use crate::migrate::{self, ENV_VARS, Level, Options, Source};

/// Default secrets directory, as packaged.
const DEFAULT_SECRETS_DIR: &str = "/etc/proxops";

/// Arguments of `proxops migrate-config`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A Go config file (`proxops.yaml` or `clusters/<c>/config.yaml`); repeatable, later
    /// files win. Default: $PROXOPS_CONFIG.
    #[arg(long = "from", value_name = "FILE", conflicts_with = "repo")]
    from: Vec<PathBuf>,
    /// A Go ProxOps repository: reads its `proxops.yaml` and every `clusters/*/config.yaml`.
    /// Default: $PROXOPS_GIT_PATH, else the current directory.
    #[arg(long, value_name = "PATH")]
    repo: Option<PathBuf>,
    /// Where to write agent.toml (default: stdout).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Where to write the secret files (`pve-token-secret`, `git-token`, mode 0600); the
    /// agent.toml names them there.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_SECRETS_DIR)]
    secrets_dir: PathBuf,
    /// The cluster to migrate when the config has several.
    #[arg(long)]
    cluster: Option<String>,
    /// Print the summary as JSON on stderr.
    #[arg(long)]
    json: bool,
}

/// Migrates and writes.
pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let env: BTreeMap<String, String> = ENV_VARS
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
        .collect();
    let (sources, repo) = if args.from.is_empty() {
        match env.get("PROXOPS_CONFIG").filter(|_| args.repo.is_none()) {
            Some(config) => (vec![read(&PathBuf::from(config))?], None),
            None => {
                let repo = args
                    .repo
                    .clone()
                    .or_else(|| env.get("PROXOPS_GIT_PATH").map(PathBuf::from))
                    .unwrap_or_else(|| PathBuf::from("."));
                let repo = std::fs::canonicalize(&repo)
                    .with_context(|| format!("reading {}", repo.display()))?;
                (migrate::discover(&repo)?, Some(repo))
            }
        }
    } else {
        let sources = args.from.iter().map(read).collect::<anyhow::Result<_>>()?;
        (sources, None)
    };
    let secrets_dir = std::path::absolute(&args.secrets_dir)
        .with_context(|| format!("resolving {}", args.secrets_dir.display()))?;
    // The secrets sit beside agent.toml (with stdout: the packaged /etc/proxops/agent.toml).
    let toml_dir = match &args.out {
        Some(out) => std::path::absolute(out)?.parent().map(PathBuf::from),
        None => Some(PathBuf::from(DEFAULT_SECRETS_DIR)),
    };
    let migration = migrate::migrate(
        &sources,
        &env,
        &Options {
            secrets_dir: secrets_dir.clone(),
            cluster: args.cluster.clone(),
            repo,
            relative: toml_dir.as_deref() == Some(secrets_dir.as_path()),
        },
    )?;
    let mut written = Vec::new();
    for secret in &migration.secrets {
        let path = migrate::write_secret(&secrets_dir, secret)?;
        written.push((path, secret.from.clone()));
    }
    match &args.out {
        Some(out) => std::fs::write(out, &migration.toml)
            .with_context(|| format!("writing {}", out.display()))?,
        None => std::io::stdout()
            .lock()
            .write_all(migration.toml.as_bytes())?,
    }
    let mut err = std::io::stderr().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut err, &migration.summary)?;
        writeln!(err)?;
    } else {
        for line in &migration.summary {
            let tag = match line.level {
                Level::Mapped => "mapped",
                Level::Note => "note",
                Level::Warning => "warning",
                Level::Error => "error",
            };
            writeln!(err, "{tag}: {}", line.text)?;
        }
        for (path, from) in &written {
            writeln!(err, "wrote {} (mode 0600, from {from})", path.display())?;
        }
        if let Some(out) = &args.out {
            writeln!(err, "wrote {}", out.display())?;
        }
        let count = |l: Level| migration.summary.iter().filter(|s| s.level == l).count();
        writeln!(
            err,
            "summary: {} mapped, {} notes, {} warnings, {} errors",
            count(Level::Mapped),
            count(Level::Note),
            count(Level::Warning),
            count(Level::Error)
        )?;
    }
    Ok(if migration.has_errors() {
        Exit::Failure
    } else {
        Exit::Success
    })
}

fn read(path: &PathBuf) -> anyhow::Result<Source> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Source {
        path: path.clone(),
        text,
    })
}
