//! A pass's snippets resolved: each declared snippet's text (inline, or the repository file
//! it names, read from the revision's files, which the source read under the revision's
//! budget), its `${secret:<ref>}` replaced, hashed and named. The result goes into the
//! desired state as core `ResolvedSnippet`s before planning; the text is sealed there.
//!
//! A snippet whose file is not in the revision is a located error (the manifest's file,
//! the line and column of `file:`), and the pass refuses the revision before PVE is read.
//! A reference that does not resolve is an error naming the reference, never a value.

use std::collections::BTreeMap;

use proxops_core::diagnostic::Diagnostic;
use proxops_core::manifest::{SnippetKind, SnippetSource};
use proxops_core::repository::DesiredState;
use proxops_core::resource::ResourceId;
use proxops_core::secret::Sealed;
use proxops_core::snippet::{self, ResolvedSnippet, ResolvedSnippets};
use secrecy::{ExposeSecret, SecretString};

use super::file::sha256_hex;

/// A `${secret:<ref>}` of a snippet that named no usable value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnresolvedRef {
    /// The manifest file.
    pub path: String,
    /// `spec.cloud-init-data.user-data` (or the `file:` it names).
    pub field: String,
    /// The reference as written.
    pub reference: String,
}

/// Why the snippets could not be resolved.
#[derive(Debug)]
pub enum ResolveError {
    /// Located problems in the repository (a missing file, a bad reference in a file).
    Invalid(Vec<Diagnostic>),
    /// A reference names nothing in the SOPS document.
    Unresolved(UnresolvedRef),
}

/// The `${secret:<ref>}` references the desired state's snippets use, as
/// (manifest file, field, reference); read from the text the snippets will have, so a
/// document is opened only when one is needed.
pub fn references(
    desired: &DesiredState,
    files: &BTreeMap<String, String>,
) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (resource, snippets) in desired.manifest.snippet_vms() {
        for (kind, source) in &snippets.declared {
            let Some(text) = text_of(source, files) else {
                continue;
            };
            for (_, r) in snippet::secret_refs(text).unwrap_or_default() {
                out.push((resource.path.clone(), field(*kind), r.to_owned()));
            }
        }
    }
    out
}

fn field(kind: SnippetKind) -> String {
    format!("spec.cloud-init-data.{}", kind.field())
}

fn text_of<'a>(source: &'a SnippetSource, files: &'a BTreeMap<String, String>) -> Option<&'a str> {
    match source {
        SnippetSource::Inline(text) => Some(text),
        SnippetSource::File { path, .. } => files.get(path).map(String::as_str),
    }
}

/// Resolves every declared snippet of `desired`: `default_storage` where a manifest names
/// none, `lookup` for each `${secret:<ref>}` (only called when the text has one).
///
/// # Errors
/// Every missing or oversized file and every unterminated reference of a file, located; or
/// the first reference `lookup` cannot resolve. Nothing is resolved then.
pub fn resolve(
    desired: &mut DesiredState,
    files: &BTreeMap<String, String>,
    default_storage: &str,
    lookup: &dyn Fn(&str) -> Option<SecretString>,
) -> Result<(), ResolveError> {
    let mut diagnostics = Vec::new();
    let mut resolved: Vec<(ResourceId, ResolvedSnippets)> = Vec::new();
    for (resource, snippets) in desired.manifest.snippet_vms() {
        let storage = snippets
            .storage
            .as_ref()
            .map_or(default_storage, |s| s.as_str())
            .to_owned();
        let mut out = ResolvedSnippets::default();
        for (kind, source) in &snippets.declared {
            let at = field(*kind);
            let Some(text) = text_of(source, files) else {
                if let SnippetSource::File { path, location } = source {
                    diagnostics.push(
                        Diagnostic::error(
                            &resource.path,
                            location.line,
                            location.column,
                            format!("{at}.file"),
                            format!("`{path}` is not in the revision"),
                        )
                        .with_help(
                            "commit the file (a `.yaml` or `.yml` under `snippets/`), or fix the \
                             path; paths are relative to the repository (or `[source] path`)",
                        ),
                    );
                }
                continue;
            };
            let (line, column) = match source {
                SnippetSource::File { location, .. } => (location.line, location.column),
                SnippetSource::Inline(_) => (resource.location.line, resource.location.column),
            };
            if text.len() > snippet::MAX_BYTES {
                diagnostics.push(
                    Diagnostic::error(
                        &resource.path,
                        line,
                        column,
                        at.clone(),
                        format!(
                            "{} bytes, more than the 1 MiB PVE reads of a snippet",
                            text.len()
                        ),
                    )
                    .with_help("shorten the snippet; PVE refuses larger ones"),
                );
                continue;
            }
            let refs = match snippet::secret_refs(text) {
                Ok(refs) => refs,
                Err(byte) => {
                    diagnostics.push(
                        Diagnostic::error(
                            &resource.path,
                            line,
                            column,
                            at.clone(),
                            format!(
                                "`${{secret:` at byte {byte} of the snippet has no closing `}}`"
                            ),
                        )
                        .with_help("write `${secret:secrets.<name>}`"),
                    );
                    continue;
                }
            };
            let mut content = String::with_capacity(text.len());
            let mut from = 0;
            for (range, reference) in &refs {
                let Some(value) = lookup(reference) else {
                    return Err(ResolveError::Unresolved(UnresolvedRef {
                        path: resource.path.clone(),
                        field: at,
                        reference: (*reference).to_owned(),
                    }));
                };
                content.push_str(&text[from..range.start]);
                content.push_str(value.expose_secret());
                from = range.end;
            }
            content.push_str(&text[from..]);
            let sha256 = sha256_hex(&content);
            out.snippets.push(ResolvedSnippet {
                kind: *kind,
                storage: storage.clone(),
                file: snippet::file_name(&resource.id.name, *kind, &sha256),
                sha256,
                content: Sealed::new(std::mem::take(&mut content)),
                has_secrets: !refs.is_empty(),
            });
        }
        resolved.push((resource.id.clone(), out));
    }
    if !diagnostics.is_empty() {
        return Err(ResolveError::Invalid(diagnostics));
    }
    for (id, snippets) in resolved {
        desired.manifest.set_resolved_snippets(&id, snippets);
    }
    Ok(())
}
