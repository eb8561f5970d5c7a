//! `proxops adopt`: bring an existing cluster under ProxOps, read-only (issue 9,
//! original-proxops.md §5.4). Reads the guests and storage files of the nodes in scope with
//! GET requests only (`read`), turns them into manifests in the composition layout
//! (`<kind-root>/<cluster>/<name>.yaml`; assembled by `build` from `vm`, `lxc`, `artifact`,
//! named by `naming`, written by `yaml`), minding what the repository already has
//! (`existing`) and the cluster's SOPS keys (`ssh_keys`), and reports what to add to
//! `resources.yaml`, what is incomplete, skipped, a placeholder, or a gap (`report`). The same
//! cluster gives the same bytes on every run.
//!
//! Every guest manifest carries `proxops/adopt: "true"`, so the first apply takes the guest
//! over (adding the ownership tag) instead of reporting an unmanaged vmid. What PVE cannot
//! tell is never invented: artifact URLs are placeholders, an LXC has no `spec.template`
//! (PVE does not keep `ostemplate`), unmodelled keys are gaps; SSH keys stay PVE's (`["*"]`)
//! unless the SOPS document holds them all, and `cipassword` is never written out.

mod artifact;
mod build;
mod existing;
mod guest;
mod lxc;
mod naming;
pub mod read;
pub mod report;
mod ssh_keys;
mod vm;
mod yaml;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proxops_core::manifest::MAX_NAME_LEN;
use proxops_core::plan::NodeScope;
use proxops_pve::PveClient;

use self::build::build;
pub use self::existing::Existing;
use self::read::ReadError;
use self::report::Report;
pub use self::ssh_keys::SshKeyRefs;

/// ISO manifests by (node, volid): how a VM's CD-ROM finds the ISO it refers to.
pub(crate) type Isos = BTreeMap<(String, String), String>;

/// Manifest files (repository-relative path → contents) and the report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Adoption {
    /// The files to write.
    pub files: BTreeMap<String, String>,
    /// What was done.
    pub report: Report,
}

/// Why adopt failed.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// The cluster could not be read.
    #[error("reading the cluster")]
    Read(#[from] ReadError),
    /// The client sent a request other than GET (a bug: adopt only reads).
    #[error(
        "the PVE client sent {count} write request(s) during adopt; refusing to report success"
    )]
    WritesSent {
        /// How many.
        count: u64,
    },
    /// The cluster name cannot be a folder name.
    #[error("cluster name `{0}` cannot be used as a folder name")]
    BadCluster(String),
    /// A file could not be written.
    #[error("writing {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
}

/// Reads the cluster and builds the manifests; fails if any write was sent. `ssh_keys` are
/// the cluster's SOPS key entries (empty when it has none); `existing` is what the repository
/// already declares and holds (guests and files declared there are skipped, files adopt did
/// not write are never overwritten).
///
/// # Errors
/// An unreadable cluster, a bad cluster name, or a write counted by the client.
pub async fn adopt(
    pve: &PveClient,
    scope: &NodeScope,
    cluster: &str,
    ssh_keys: &SshKeyRefs,
    existing: &Existing,
) -> Result<Adoption, AdoptError> {
    check_cluster(cluster)?;
    let snapshot = read::read(pve, scope).await?;
    let mut adoption = build(&snapshot, cluster, ssh_keys, existing);
    adoption.report.requests = pve.requests_sent();
    adoption.report.writes = pve.writes_sent();
    if adoption.report.writes != 0 {
        return Err(AdoptError::WritesSent {
            count: adoption.report.writes,
        });
    }
    Ok(adoption)
}

/// Writes the files under `out`, replacing files of the same name; returns how many changed.
///
/// # Errors
/// The first file that could not be written.
pub fn write(out: &Path, adoption: &Adoption) -> Result<usize, AdoptError> {
    let mut changed = 0;
    for (rel, contents) in &adoption.files {
        let path = out.join(rel);
        if std::fs::read_to_string(&path).is_ok_and(|old| old == *contents) {
            continue;
        }
        let io = |source| AdoptError::Write {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        // Written beside and renamed, so an interrupted run leaves no half file.
        let tmp = path.with_extension("yaml.proxops-tmp");
        std::fs::write(&tmp, contents).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        changed += 1;
    }
    Ok(changed)
}

/// Refuses a cluster name that cannot be a folder name (it becomes part of every path).
///
/// # Errors
/// [`AdoptError::BadCluster`].
pub fn check_cluster(cluster: &str) -> Result<(), AdoptError> {
    let ok = cluster
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric())
        && cluster
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && cluster.len() <= MAX_NAME_LEN;
    if ok {
        Ok(())
    } else {
        Err(AdoptError::BadCluster(cluster.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_name_that_is_not_a_folder_name_is_refused() {
        assert!(check_cluster("lab-1").is_ok());
        assert!(check_cluster("../x").is_err());
        assert!(check_cluster("").is_err());
    }
}
