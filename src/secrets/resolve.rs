//! The pass's side of references: which SOPS document a cluster uses, and every VM's
//! `ssh-key-refs` / `ci-password-ref` resolved from it, failing closed before any PVE write.
//!
//! [`resolve_desired`] runs once per pass, after validation and before PVE is observed: it
//! decrypts the cluster's document once (from the revision's files, so the agent reads the
//! commit's tree and the CLI the checkout) and hands each VM its values as core `Sealed`s.
//! Any error refuses the whole pass. Values never leave memory and never print.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proxops_core::manifest::CloudInitData;
use proxops_core::repository::DesiredState;
use proxops_core::secret::{ResolvedCloudInit, Sealed};
use proxops_sops::{SopsDocument, SopsError};
use secrecy::{ExposeSecret, SecretString};

use super::refs::cluster_secrets_file;
use super::sops;
use crate::config::SecretsConfig;

/// A VM's cloud-init values that came from references.
#[derive(Debug, Default)]
pub struct CloudInitSecrets {
    /// `ssh-key-refs`, resolved in list order.
    pub ssh_keys: Vec<SecretString>,
    /// `ci-password-ref`, resolved.
    pub password: Option<SecretString>,
}

impl CloudInitSecrets {
    /// The keys as PVE's `sshkeys` wants them before encoding: one OpenSSH line each.
    pub fn ssh_keys_text(&self) -> Option<SecretString> {
        if self.ssh_keys.is_empty() {
            return None;
        }
        let lines: Vec<&str> = self
            .ssh_keys
            .iter()
            .map(|k| k.expose_secret().trim())
            .collect();
        Some(SecretString::from(lines.join("\n")))
    }
}

/// A reference names no usable value. Holds names, never values.
#[derive(Debug, thiserror::Error)]
#[error("{}: {field}: `{reference}` is {} in the SOPS document", .document.display(), if *.empty { "empty" } else { "missing" })]
pub struct UnresolvedRef {
    /// The SOPS document.
    pub document: PathBuf,
    /// `spec.cloud-init-data.ssh-key-refs[0]` or `spec.cloud-init-data.ci-password-ref`.
    pub field: String,
    /// The reference as written.
    pub reference: String,
    /// The key exists but its value is empty.
    pub empty: bool,
}

/// Resolving a desired state's references failed. Names files and references, never values.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The document could not be read or decrypted (identity, MAC, format).
    #[error("cloud-init references cannot be resolved")]
    Document(#[source] SopsError),
    /// A reference names no value of the document.
    #[error("cloud-init references cannot be resolved")]
    Unresolved(#[source] UnresolvedRef),
    /// The revision has no such document.
    #[error(
        "{document}: the SOPS document holding the cloud-init references of cluster `{cluster}` is not in the revision"
    )]
    Missing {
        /// Its repository-relative path.
        document: String,
        /// The cluster.
        cluster: String,
    },
    /// Plain layout (no cluster folder) and no `[secrets] file`.
    #[error(
        "manifests use cloud-init references but the repository has no cluster folder for a SOPS document: name it with [secrets] file in agent.toml"
    )]
    NoDocument,
}

/// Resolves the references of every VM in `desired` from its cluster's SOPS document: the
/// `[secrets] file` when set (read from disk), else the document the cluster's folder names
/// in `files` (the revision). A desired state without references needs no document.
///
/// # Errors
/// The first problem: no document, a missing or wrong identity, an unencrypted, tampered or
/// malformed document, a reference that is missing or empty. Nothing is resolved then.
pub fn resolve_desired(
    desired: &mut DesiredState,
    files: &BTreeMap<String, String>,
    config: &SecretsConfig,
) -> Result<(), ResolveError> {
    let wanting: Vec<_> = desired
        .manifest
        .cloud_init_refs()
        .map(|(id, data)| (id.clone(), data.clone()))
        .collect();
    if wanting.is_empty() {
        return Ok(());
    }
    let document = open_revision_document(desired.cluster.as_deref(), files, config)?;
    let mut resolved = Vec::with_capacity(wanting.len());
    for (id, data) in &wanting {
        let secrets = resolve_cloud_init(&document, data).map_err(ResolveError::Unresolved)?;
        resolved.push((id, secrets));
    }
    for (id, secrets) in resolved {
        let sealed = ResolvedCloudInit {
            ssh_keys: secrets
                .ssh_keys
                .iter()
                .map(|k| Sealed::new(k.expose_secret()))
                .collect(),
            password: secrets.password.map(|p| Sealed::new(p.expose_secret())),
        };
        desired.manifest.set_resolved_cloud_init(id, sealed);
    }
    tracing::debug!(
        document = %document.path().display(),
        guests = wanting.len(),
        "cloud-init references resolved"
    );
    Ok(())
}

/// The cluster's document, decrypted: `[secrets] file` from disk, else from the revision.
/// Snippets' `${secret:...}` are resolved from it too (`snippets::resolve`).
///
/// # Errors
/// As [`resolve_desired`]: no document, no identity, a bad document.
pub fn open_revision_document(
    cluster: Option<&str>,
    files: &BTreeMap<String, String>,
    config: &SecretsConfig,
) -> Result<SopsDocument, ResolveError> {
    let (path, text) = match (&config.file, cluster) {
        (Some(file), _) => {
            let text = std::fs::read_to_string(file).map_err(|source| {
                ResolveError::Document(SopsError::Read {
                    path: file.clone(),
                    source,
                })
            })?;
            (file.clone(), text)
        }
        (None, Some(cluster)) => {
            let config_yaml = files
                .get(&format!("clusters/{cluster}/config.yaml"))
                .map(String::as_str);
            let document = cluster_secrets_file(cluster, config_yaml);
            let Some(text) = files.get(&document) else {
                return Err(ResolveError::Missing {
                    document,
                    cluster: cluster.to_owned(),
                });
            };
            (PathBuf::from(document), text.clone())
        }
        (None, None) => return Err(ResolveError::NoDocument),
    };
    let identity = proxops_sops::load_identity(config.age_key_file.as_deref(), &path)
        .map_err(ResolveError::Document)?;
    SopsDocument::decrypt(&path, &text, &identity).map_err(ResolveError::Document)
}

/// The SOPS document of `cluster` in the checkout at `repo_root`: `[secrets] file` when set,
/// else the `secrets-file` of `clusters/<cluster>/config.yaml`, else
/// `clusters/<cluster>/secrets.sops.yaml`.
pub fn cluster_document_path(repo_root: &Path, cluster: &str, config: &SecretsConfig) -> PathBuf {
    if let Some(file) = &config.file {
        return file.clone();
    }
    let config_yaml =
        std::fs::read_to_string(repo_root.join("clusters").join(cluster).join("config.yaml")).ok();
    repo_root.join(cluster_secrets_file(cluster, config_yaml.as_deref()))
}

/// Reads the age identity (`[secrets] age_key_file`, else `SOPS_AGE_KEY_FILE`) and decrypts
/// the cluster's SOPS document.
///
/// # Errors
/// Every [`SopsError`]: a missing or wrong identity, an unencrypted, tampered or malformed file.
pub fn open_cluster_document(
    repo_root: &Path,
    cluster: &str,
    config: &SecretsConfig,
) -> Result<SopsDocument, SopsError> {
    let path = cluster_document_path(repo_root, cluster, config);
    let identity = proxops_sops::load_identity(config.age_key_file.as_deref(), &path)?;
    SopsDocument::load(&path, &identity)
}

/// Resolves a VM's `ssh-key-refs` (in order) and `ci-password-ref` from `document`.
///
/// # Errors
/// The first reference that is missing or empty.
pub fn resolve_cloud_init(
    document: &SopsDocument,
    data: &CloudInitData,
) -> Result<CloudInitSecrets, UnresolvedRef> {
    let unresolved = |field: String, reference: &str| UnresolvedRef {
        document: document.path().to_path_buf(),
        field,
        reference: reference.to_owned(),
        empty: document
            .get(reference)
            .is_some_and(|v| v.expose_secret().is_empty()),
    };
    let mut secrets = CloudInitSecrets::default();
    for (i, reference) in data.ssh_key_refs.iter().enumerate() {
        let key = sops::resolve(document, reference).ok_or_else(|| {
            unresolved(format!("spec.cloud-init-data.ssh-key-refs[{i}]"), reference)
        })?;
        secrets.ssh_keys.push(key.clone());
    }
    if let Some(reference) = &data.ci_password_ref {
        let password = sops::resolve(document, reference).ok_or_else(|| {
            unresolved("spec.cloud-init-data.ci-password-ref".to_owned(), reference)
        })?;
        secrets.password = Some(password.clone());
    }
    Ok(secrets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
    }

    fn config() -> SecretsConfig {
        SecretsConfig {
            age_key_file: Some(fixtures().join("sops/getsops-sops/keys.txt")),
            file: None,
        }
    }

    #[test]
    fn secrets_cluster_document_resolves_a_vms_refs_in_order() {
        let repo = fixtures().join("sops-repo");
        let doc = open_cluster_document(&repo, "lab", &config()).unwrap();
        let data = CloudInitData {
            ssh_key_refs: vec![
                "cloud-init.ssh-keys.deploy".to_owned(),
                "cloud-init.ssh-keys.admin".to_owned(),
            ],
            ci_password_ref: Some("cloud-init.passwords.default".to_owned()),
            ..CloudInitData::default()
        };
        let secrets = resolve_cloud_init(&doc, &data).unwrap();
        let keys = secrets.ssh_keys_text().unwrap();
        let lines: Vec<&str> = keys.expose_secret().lines().collect();
        assert!(lines[0].ends_with("deploy@example"), "{lines:?}");
        assert!(lines[1].ends_with("admin@example"), "{lines:?}");
        assert_eq!(secrets.password.unwrap().expose_secret(), "s3cr3t-Passw0rd");
    }

    #[test]
    fn secrets_a_missing_ref_fails_closed_naming_the_field_not_a_value() {
        let repo = fixtures().join("sops-repo");
        let doc = open_cluster_document(&repo, "lab", &config()).unwrap();
        let data = CloudInitData {
            ssh_key_refs: vec![
                "cloud-init.ssh-keys.admin".to_owned(),
                "cloud-init.ssh-keys.ops".to_owned(),
            ],
            ..CloudInitData::default()
        };
        let err = resolve_cloud_init(&doc, &data).unwrap_err();
        let text = err.to_string();
        assert!(
            text.ends_with(
                "secrets.sops.yaml: spec.cloud-init-data.ssh-key-refs[1]: `cloud-init.ssh-keys.ops` is missing in the SOPS document"
            ),
            "{text}"
        );
        assert!(!text.contains("AdminKeyForTestsOnly"), "{text}");
    }

    /// The fixture repository's files, as a revision holds them.
    fn revision() -> BTreeMap<String, String> {
        let repo = fixtures().join("sops-repo");
        crate::source::directory::read_manifest_files(&repo).unwrap()
    }

    fn desired(files: &BTreeMap<String, String>) -> DesiredState {
        let loaded = proxops_core::repository::load(files);
        assert!(!loaded.has_errors(), "{:?}", loaded.diagnostics);
        loaded.states.into_iter().next().unwrap()
    }

    fn resolved(desired: &DesiredState) -> Option<&ResolvedCloudInit> {
        let id = proxops_core::resource::ResourceId::new(proxops_core::resource::Kind::Vm, "web");
        match &desired.manifest.get(&id)?.spec {
            Some(proxops_core::manifest::Spec::Vm(vm)) => vm.cloud_init_data.resolved.as_ref(),
            _ => None,
        }
    }

    #[test]
    fn secrets_a_desired_state_gets_its_refs_from_the_document_in_the_revision() {
        let files = revision();
        let mut state = desired(&files);
        resolve_desired(&mut state, &files, &config()).unwrap();
        let values = resolved(&state).expect("resolved");
        assert_eq!(values.ssh_keys.len(), 2);
        assert!(values.ssh_keys[0].expose().ends_with("admin@example"));
        assert_eq!(
            values.password.as_ref().map(Sealed::expose),
            Some("s3cr3t-Passw0rd")
        );
    }

    #[test]
    fn secrets_the_agent_config_can_name_a_document_outside_the_revision() {
        let mut files = revision();
        files.remove("clusters/lab/secrets.sops.yaml");
        let mut state = desired(&files);
        let err = resolve_desired(&mut state, &files, &config()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "clusters/lab/secrets.sops.yaml: the SOPS document holding the cloud-init references of cluster `lab` is not in the revision"
        );
        assert!(resolved(&state).is_none());
        let outside = SecretsConfig {
            file: Some(fixtures().join("sops/proxops/proxops.sops.yaml")),
            ..config()
        };
        resolve_desired(&mut state, &files, &outside).unwrap();
        assert!(resolved(&state).is_some());
    }

    #[test]
    fn secrets_a_desired_state_without_refs_needs_no_document_or_identity() {
        let mut files = revision();
        files.remove("clusters/lab/secrets.sops.yaml");
        let vm = files.get_mut("vm/base/web.yaml").unwrap();
        *vm = vm
            .lines()
            .filter(|l| !l.contains("-ref") && !l.contains("- cloud-init."))
            .collect::<Vec<_>>()
            .join("\n");
        let mut state = desired(&files);
        resolve_desired(&mut state, &files, &SecretsConfig::default()).unwrap();
    }

    #[test]
    fn secrets_document_path_prefers_the_agent_config_then_config_yaml() {
        let repo = fixtures().join("sops-repo");
        assert_eq!(
            cluster_document_path(&repo, "lab", &SecretsConfig::default()),
            repo.join("clusters/lab/secrets.sops.yaml")
        );
        let config = SecretsConfig {
            age_key_file: None,
            file: Some(PathBuf::from("/srv/other.sops.yaml")),
        };
        assert_eq!(
            cluster_document_path(&repo, "lab", &config),
            PathBuf::from("/srv/other.sops.yaml")
        );
        let err = open_cluster_document(
            &repo,
            "lab",
            &SecretsConfig {
                age_key_file: Some(fixtures().join("sops/fluxcd/age.txt")),
                file: None,
            },
        )
        .unwrap_err();
        assert!(matches!(err, SopsError::WrongIdentity { .. }), "{err}");
    }
}
