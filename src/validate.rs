//! What `proxops validate` reports about a repository: every diagnostic of the loader and
//! of the secret references, and the size of each desired state. The data behind both
//! renderings (text and JSON, in `output.rs`).

use std::path::Path;

use proxops_core::diagnostic::Diagnostic;
use serde::Serialize;

use crate::source::directory::{DirectoryError, read_manifest_files};

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

/// Loads the repository at `path` and checks every manifest and every secret reference.
///
/// # Errors
/// The repository's files cannot be read.
pub fn validate(path: &Path) -> Result<Report, DirectoryError> {
    let files = read_manifest_files(path)?;
    let mut loaded = proxops_core::repository::load(&files);
    // `ssh-key-refs` / `ci-password-ref` against the cluster's SOPS key names (issue 10).
    let refs = crate::secrets::refs::check(path, &files, &loaded);
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
