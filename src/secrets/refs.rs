//! `proxops validate`: every `ssh-key-refs` / `ci-password-ref` must name a key of its cluster's
//! SOPS document, checked against the key names only (nothing is decrypted, no identity needed).
//!
//! The document of cluster `<c>` is `clusters/<c>/secrets.sops.yaml`, or the `secrets-file`
//! that `clusters/<c>/config.yaml` names under `pve.clusters.<c>` (relative to that folder), as
//! in the Go program. A cluster whose manifests use no reference needs no document. Problems are
//! reported as diagnostics at the reference itself (`spec.cloud-init-data.ssh-key-refs[0]`), or
//! at the SOPS file when that file is unusable.

use std::collections::BTreeMap;
use std::path::Path;

use proxops_core::diagnostic::Diagnostic;
use proxops_core::manifest::Spec;
use proxops_core::repository::Loaded;
use proxops_core::resource::ResourceId;

use proxops_sops::SopsError;
use proxops_sops::tree::{self, Node, Value};

use super::sops::{KeyNames, RefStatus, key_names};

/// The default SOPS document inside `clusters/<cluster>/`.
pub const DEFAULT_SECRETS_FILE: &str = "secrets.sops.yaml";

/// One reference in a manifest.
struct Ref<'a> {
    /// The resource's file, repository-relative.
    path: &'a str,
    /// `spec.cloud-init-data.ssh-key-refs[0]` or `spec.cloud-init-data.ci-password-ref`.
    field: String,
    /// `cloud-init.ssh-keys.admin`.
    reference: &'a str,
    /// The resource, to find the reference's line in its file.
    id: &'a ResourceId,
    /// Where `metadata.name` is: the fallback location.
    fallback: (usize, usize),
}

/// Diagnostics for references that name no key of their cluster's SOPS document.
///
/// `root` is the repository folder and `files` its YAML files by repository-relative path (as
/// `proxops validate` read them); a secrets file outside `files` is read from `root`. Only
/// clusters that validated (`loaded.states`) are checked.
pub fn check(root: &Path, files: &BTreeMap<String, String>, loaded: &Loaded) -> Vec<Diagnostic> {
    let mut diagnostics = Vec::new();
    for state in &loaded.states {
        let Some(cluster) = state.cluster.as_deref() else {
            continue;
        };
        let refs = references(state.manifest.resources());
        if refs.is_empty() {
            continue;
        }
        let secrets_path = secrets_file(cluster, files);
        let text = match files.get(&secrets_path) {
            Some(text) => Ok(text.clone()),
            None => std::fs::read_to_string(root.join(&secrets_path)),
        };
        let names = match text {
            Ok(text) => match key_names(Path::new(&secrets_path), &text) {
                Ok(names) => names,
                Err(error) => {
                    diagnostics.push(document_problem(&secrets_path, &error));
                    continue;
                }
            },
            Err(_) => {
                for r in &refs {
                    let (line, column) = locate(files, r);
                    diagnostics.push(
                        Diagnostic::error(
                            r.path,
                            line,
                            column,
                            r.field.clone(),
                            format!(
                                "`{}` cannot be resolved: cluster `{cluster}` has no SOPS document {secrets_path}",
                                r.reference
                            ),
                        )
                        .with_help(format!(
                            "create {secrets_path} with `sops encrypt --age <recipient>`, or name the file with `secrets-file` in clusters/{cluster}/config.yaml"
                        )),
                    );
                }
                continue;
            }
        };
        for r in &refs {
            let status = names.status(r.reference);
            if status == RefStatus::Present {
                continue;
            }
            let (line, column) = locate(files, r);
            let message = match status {
                RefStatus::Empty => format!("`{}` is empty in {secrets_path}", r.reference),
                _ => format!("`{}` is not a key of {secrets_path}", r.reference),
            };
            diagnostics.push(
                Diagnostic::error(r.path, line, column, r.field.clone(), message).with_help(help(
                    &names,
                    r.reference,
                    &secrets_path,
                )),
            );
        }
    }
    diagnostics
}

fn references<'a>(
    resources: impl Iterator<Item = &'a proxops_core::manifest::Resource>,
) -> Vec<Ref<'a>> {
    let mut refs = Vec::new();
    for resource in resources {
        let Some(Spec::Vm(vm)) = &resource.spec else {
            continue;
        };
        let fallback = (resource.location.line, resource.location.column);
        let ci = &vm.cloud_init_data;
        for (i, reference) in ci.ssh_key_refs.iter().enumerate() {
            refs.push(Ref {
                path: &resource.path,
                field: format!("spec.cloud-init-data.ssh-key-refs[{i}]"),
                reference,
                id: &resource.id,
                fallback,
            });
        }
        if let Some(reference) = &ci.ci_password_ref {
            refs.push(Ref {
                path: &resource.path,
                field: "spec.cloud-init-data.ci-password-ref".to_owned(),
                reference,
                id: &resource.id,
                fallback,
            });
        }
    }
    refs
}

fn help(names: &KeyNames, reference: &str, secrets_path: &str) -> String {
    let (section, known) = if reference.starts_with(super::sops::SSH_KEY_REF_PREFIX) {
        ("cloud-init.ssh-keys", &names.ssh_keys)
    } else {
        ("cloud-init.passwords", &names.passwords)
    };
    let known = if known.is_empty() {
        "none".to_owned()
    } else {
        known
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "add it with `sops edit {secrets_path}` under `{section}`, or use a name it has ({known})"
    )
}

fn document_problem(secrets_path: &str, error: &SopsError) -> Diagnostic {
    match error {
        SopsError::Malformed {
            line,
            column,
            message,
            ..
        } => Diagnostic::error(
            secrets_path,
            *line,
            *column,
            "",
            format!("malformed SOPS file: {message}"),
        ),
        SopsError::Unencrypted { .. } => Diagnostic::error(
            secrets_path,
            1,
            1,
            "",
            "not encrypted by sops (no `sops` metadata)",
        )
        .with_help(
            "encrypt it with `sops encrypt --age <recipient>`; ProxOps never reads plain secrets",
        ),
        other => Diagnostic::error(secrets_path, 1, 1, "", other.to_string()),
    }
}

/// The repository-relative path of the cluster's SOPS document.
fn secrets_file(cluster: &str, files: &BTreeMap<String, String>) -> String {
    cluster_secrets_file(
        cluster,
        files
            .get(&format!("clusters/{cluster}/config.yaml"))
            .map(String::as_str),
    )
}

/// The repository-relative path of cluster `cluster`'s SOPS document, given the text of its
/// `clusters/<cluster>/config.yaml` when there is one: its `pve.clusters.<cluster>.secrets-file`
/// (relative to that folder), else `clusters/<cluster>/secrets.sops.yaml`.
pub fn cluster_secrets_file(cluster: &str, config_yaml: Option<&str>) -> String {
    let folder = format!("clusters/{cluster}");
    let named = config_yaml
        .and_then(|text| tree::parse(text).ok())
        .and_then(|parsed| {
            parsed.documents.first().and_then(|doc| {
                doc.get("pve")
                    .and_then(|p| p.get("clusters"))
                    .and_then(|c| c.get(cluster))
                    .and_then(|c| c.get("secrets-file"))
                    .and_then(Node::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
            })
        });
    match named {
        Some(file) => normalise(&format!("{folder}/{file}")),
        None => format!("{folder}/{DEFAULT_SECRETS_FILE}"),
    }
}

/// Resolves `.` and `..` in a `/`-separated relative path.
fn normalise(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    parts.join("/")
}

/// The line and column of a reference's value in its manifest file.
fn locate(files: &BTreeMap<String, String>, r: &Ref<'_>) -> (usize, usize) {
    let found = files
        .get(r.path)
        .and_then(|text| tree::parse(text).ok())
        .and_then(|parsed| {
            let doc = parsed.documents.iter().find(|doc| {
                doc.get("kind").and_then(Node::as_str) == Some(r.id.kind.as_str())
                    && doc
                        .get("metadata")
                        .and_then(|m| m.get("name"))
                        .and_then(Node::as_str)
                        == Some(r.id.name.as_str())
            })?;
            let ci = doc.get("spec")?.get("cloud-init-data")?;
            let node = match r.field.rsplit_once('[') {
                Some((_, index)) => {
                    let i: usize = index.trim_end_matches(']').parse().ok()?;
                    match &ci.get("ssh-key-refs")?.value {
                        Value::Seq(items) => items.get(i)?,
                        _ => return None,
                    }
                }
                None => ci.get("ci-password-ref")?,
            };
            Some((node.line, node.column))
        });
    found.unwrap_or(r.fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_file_defaults_and_follows_config_yaml() {
        let mut files = BTreeMap::new();
        assert_eq!(
            secrets_file("prod", &files),
            "clusters/prod/secrets.sops.yaml"
        );
        files.insert(
            "clusters/prod/config.yaml".to_owned(),
            "pve:\n  clusters:\n    prod:\n      secrets-file: ../../sec/prod.sops.yaml\n"
                .to_owned(),
        );
        assert_eq!(secrets_file("prod", &files), "sec/prod.sops.yaml");
    }
}
