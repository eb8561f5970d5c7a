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
/// Never through a symbolic link (SECURITY-AUDIT.md M5: adopt runs as root, and a checkout can
/// hold links a contributor committed): every folder between `out` and a file must be a real
/// folder (missing ones are created one at a time), the file itself must not be a link, and
/// the temporary file is created exclusively (`O_CREAT|O_EXCL|O_NOFOLLOW`), then renamed over
/// the file, which replaces a directory entry and writes through nothing. `out` itself is the
/// operator's choice and may be a link.
///
/// # Errors
/// The first file that could not be written, or a link in the way.
pub fn write(out: &Path, adoption: &Adoption) -> Result<usize, AdoptError> {
    let mut changed = 0;
    for (rel, contents) in &adoption.files {
        let path = out.join(rel);
        let io = |source| AdoptError::Write {
            path: path.clone(),
            source,
        };
        let folder = real_folders(out, Path::new(rel)).map_err(io)?;
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => return Err(io(is_a_link(&path))),
            Ok(meta)
                if meta.is_file()
                    && std::fs::read_to_string(&path).is_ok_and(|old| old == *contents) =>
            {
                continue;
            }
            _ => {}
        }
        // Written beside and renamed, so an interrupted run leaves no half file.
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = folder.join(format!("{name}.proxops-tmp"));
        // A leftover of an interrupted run, or a planted link: unlinked, never followed.
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(io(error)),
        }
        write_new(&tmp, contents.as_bytes()).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        changed += 1;
    }
    Ok(changed)
}

/// Checks (and creates) every folder of `rel`'s parent below `out`, one component at a time,
/// refusing a symbolic link or anything that is not a folder; returns the file's folder.
fn real_folders(out: &Path, rel: &Path) -> std::io::Result<std::path::PathBuf> {
    let mut folder = out.to_path_buf();
    let parents = rel.parent().map(Path::components).into_iter().flatten();
    for component in parents {
        let std::path::Component::Normal(part) = component else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} leaves the output folder", rel.display()),
            ));
        };
        folder.push(part);
        match std::fs::symlink_metadata(&folder) {
            Ok(meta) if meta.file_type().is_symlink() => return Err(is_a_link(&folder)),
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{} is not a folder", folder.display()),
                ));
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                // `create_dir` does not follow a link planted since the check: it fails.
                std::fs::create_dir(&folder)?;
            }
            Err(error) => return Err(error),
        }
    }
    Ok(folder)
}

fn is_a_link(path: &Path) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!(
            "{} is a symbolic link; adopt never writes through links: remove it, or choose \
             another --out",
            path.display()
        ),
    )
}

/// Creates `path` exclusively, never through a link, and writes `contents` to it.
fn write_new(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o644)
        .open(path)?;
    file.write_all(contents)?;
    file.sync_all()
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

    fn adoption(files: &[(&str, &str)]) -> Adoption {
        Adoption {
            files: files
                .iter()
                .map(|(path, contents)| ((*path).to_owned(), (*contents).to_owned()))
                .collect(),
            ..Adoption::default()
        }
    }

    #[test]
    fn adopt_never_writes_through_a_symlinked_folder_or_temporary_file() {
        use std::os::unix::fs::symlink;
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("authorized_keys");
        std::fs::write(&victim, "ssh-ed25519 AAAA operator\n").unwrap();

        // A committed `vm/homelab -> <outside>`: nothing is written outside.
        let out = tempfile::tempdir().unwrap();
        std::fs::create_dir(out.path().join("vm")).unwrap();
        symlink(outside.path(), out.path().join("vm/homelab")).unwrap();
        let err = write(
            out.path(),
            &adoption(&[("vm/homelab/web.yaml", "kind: VM\n")]),
        )
        .unwrap_err();
        assert!(
            format!("{err:?}").contains("is a symbolic link; adopt never writes through links"),
            "{err:?}"
        );
        assert!(!outside.path().join("web.yaml").exists());

        // A committed `vm/homelab/web.yaml.proxops-tmp -> <outside>/authorized_keys`: the link
        // is unlinked, the victim untouched, and web.yaml a regular file.
        let out = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(out.path().join("vm/homelab")).unwrap();
        symlink(&victim, out.path().join("vm/homelab/web.yaml.proxops-tmp")).unwrap();
        let written = write(
            out.path(),
            &adoption(&[("vm/homelab/web.yaml", "kind: VM\n")]),
        )
        .unwrap();
        assert_eq!(written, 1);
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "ssh-ed25519 AAAA operator\n"
        );
        let web = out.path().join("vm/homelab/web.yaml");
        assert!(std::fs::symlink_metadata(&web).unwrap().is_file());
        assert_eq!(std::fs::read_to_string(&web).unwrap(), "kind: VM\n");
        assert!(!out.path().join("vm/homelab/web.yaml.proxops-tmp").exists());

        // The file itself a link to the victim: refused, the victim untouched.
        let out = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(out.path().join("vm/homelab")).unwrap();
        symlink(&victim, out.path().join("vm/homelab/db.yaml")).unwrap();
        let err = write(
            out.path(),
            &adoption(&[("vm/homelab/db.yaml", "kind: VM\n")]),
        )
        .unwrap_err();
        assert!(format!("{err:?}").contains("is a symbolic link"), "{err:?}");
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "ssh-ed25519 AAAA operator\n"
        );
    }

    #[test]
    fn write_new_refuses_an_existing_file_or_link() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("link")).unwrap();
        assert!(write_new(&dir.path().join("link"), b"x").is_err());
        assert!(write_new(&target, b"x").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        write_new(&dir.path().join("new"), b"x").unwrap();
    }

    #[test]
    fn a_cluster_name_that_is_not_a_folder_name_is_refused() {
        assert!(check_cluster("lab-1").is_ok());
        assert!(check_cluster("../x").is_err());
        assert!(check_cluster("").is_err());
    }
}
