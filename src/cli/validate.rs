//! `proxops validate [PATH]`: load a manifest repository, report every problem, summarise.
//!
//! Diagnostics go to stderr, the summary to stdout; `--json` puts one JSON report on stdout.
//! In composition mode every cluster is validated.

use std::path::PathBuf;

use anyhow::Context;
use proxops_core::diagnostic::Diagnostic;
use serde::Serialize;

use crate::cli::Exit;
use crate::output;
use crate::source::directory::read_manifest_files;

/// Arguments of `proxops validate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Root of the manifest repository (the folder holding `clusters/` or the manifests).
    #[arg(default_value = ".")]
    path: PathBuf,
    /// Print one JSON report on stdout instead of text.
    #[arg(long)]
    json: bool,
}

/// What `validate` found: the data behind both renderings.
#[derive(Debug, Serialize)]
pub struct Report {
    /// True when no error was found.
    pub valid: bool,
    /// `composition` or `plain`.
    pub layout: String,
    /// Manifest files read.
    pub files: usize,
    /// One entry per cluster (composition mode) or one for the repository (plain mode).
    pub states: Vec<StateSummary>,
    /// Every problem, in file order.
    pub diagnostics: Vec<Diagnostic>,
}

/// The size of one valid desired state.
#[derive(Debug, Serialize)]
pub struct StateSummary {
    /// The cluster, in composition mode.
    pub cluster: Option<String>,
    /// Resources in the desired state.
    pub resources: usize,
    /// Manifest files that make it up.
    pub files: usize,
    /// Dependency levels.
    pub levels: usize,
}

/// Validates the repository at `args.path`.
pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let report = validate(args)?;
    if args.json {
        output::print_json(&report)?;
    } else {
        output::print_validation(&report);
    }
    Ok(if report.valid {
        Exit::Success
    } else {
        Exit::Failure
    })
}

fn validate(args: &Args) -> anyhow::Result<Report> {
    let files = read_manifest_files(&args.path)
        .with_context(|| format!("reading manifests from {}", args.path.display()))?;
    let mut loaded = proxops_core::repository::load(&files);
    // `ssh-key-refs` / `ci-password-ref` against the cluster's SOPS key names (issue 10).
    let refs = crate::secrets::refs::check(&args.path, &files, &loaded);
    loaded.diagnostics.extend(refs);
    proxops_core::diagnostic::sort_diagnostics(&mut loaded.diagnostics);
    let states = loaded
        .states
        .iter()
        .map(|state| StateSummary {
            cluster: state.cluster.clone(),
            resources: state.manifest.len(),
            files: state.files.len(),
            levels: state.levels.len(),
        })
        .collect();
    Ok(Report {
        valid: !loaded.diagnostics.iter().any(Diagnostic::is_error),
        layout: loaded.layout.to_string(),
        files: files.len(),
        states,
        diagnostics: loaded.diagnostics,
    })
}
