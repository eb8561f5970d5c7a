//! What `proxops validate` reports about a repository: every diagnostic of the loader and
//! of the secret references, and the size of each desired state. The data behind both
//! renderings (text and JSON, in `output.rs`).

use std::collections::BTreeMap;
use std::path::Path;

use proxops_core::diagnostic::Diagnostic;
use proxops_core::repository::Loaded;
use proxops_core::scope::Scope;
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

/// What [`validate`] read and built besides its [`Report`]: the files' contents and the valid
/// desired states. Held only so that a caller about to exit may leak it instead of freeing its
/// hundreds of thousands of small allocations one by one (see `cli/validate.rs`).
#[derive(Debug)]
pub struct Inputs {
    /// Every manifest file read, by path.
    pub files: BTreeMap<String, String>,
    /// The loaded repository (its diagnostics moved into the report).
    pub loaded: Loaded,
}

/// Loads the repository at `path` and checks every manifest and every secret reference,
/// and every valid desired state against the operator's `scope` (`[scope]` of the agent
/// config, or the defaults without one). Artifact host names are not resolved here: plan,
/// apply and the agent do that.
///
/// # Errors
/// The repository's files cannot be read.
pub fn validate(path: &Path, scope: &Scope) -> Result<(Report, Inputs), DirectoryError> {
    let files = read_manifest_files(path)?;
    let mut loaded = proxops_core::repository::load(&files);
    // `ssh-key-refs` / `ci-password-ref` against the cluster's SOPS key names (issue 10).
    let refs = crate::secrets::refs::check(path, &files, &loaded);
    loaded.diagnostics.extend(refs);
    // `[scope]`: what the operator allows (issue 16), for each state that is valid so far.
    let mut outside = Vec::new();
    loaded.states.retain(|state| {
        let problems = proxops_core::scope::check(scope, state, &files);
        let in_scope = problems.is_empty();
        outside.extend(problems);
        in_scope
    });
    loaded.diagnostics.extend(outside);
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
    let report = Report {
        valid: !loaded.diagnostics.iter().any(Diagnostic::is_error),
        layout: loaded.layout.to_string(),
        files: files.len(),
        states,
        diagnostics: std::mem::take(&mut loaded.diagnostics),
    };
    Ok((report, Inputs { files, loaded }))
}
