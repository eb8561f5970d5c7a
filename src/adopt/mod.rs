//! `proxops adopt`: bring an existing cluster under ProxOps, read-only (issue 9,
//! original-proxops.md §5.4). Reads the guests and storage files of the nodes in scope with
//! GET requests only (`read`), turns them into manifests in the composition layout
//! (`<kind-root>/<cluster>/<name>.yaml`: `vm`, `lxc`, `artifact`, named by `naming`, written by
//! `yaml`), and reports what to add to `resources.yaml`, what is incomplete, skipped, a
//! placeholder, or a gap (`report`). The same cluster gives the same bytes on every run.
//!
//! Every guest manifest carries `proxops/adopt: "true"`, so the first apply takes the guest
//! over (adding the ownership tag) instead of reporting an unmanaged vmid. What PVE cannot
//! tell is never invented: artifact URLs are placeholders, an LXC has no `spec.template`
//! (PVE does not keep `ostemplate`), unmodelled keys are gaps; SSH keys stay PVE's (`["*"]`)
//! and `cipassword` is never written out.

mod artifact;
mod guest;
mod lxc;
mod naming;
pub mod read;
pub mod report;
mod vm;
mod yaml;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proxops_core::guest::GuestType;
use proxops_core::manifest::{ADOPT, MAX_NAME_LEN};
use proxops_core::plan::NodeScope;
use proxops_core::resource::Kind;
use proxops_pve::PveClient;

use self::guest::Mapping;
use self::naming::{Names, artifact_stem, safe_name};
use self::read::{ReadError, Snapshot};
use self::report::{Incomplete, Placeholder, Report, Skipped, Written};
use self::yaml::{Map, Value};

/// ISO manifests by (node, volid): how a VM's CD-ROM finds the ISO it refers to.
pub(crate) type Isos = BTreeMap<(String, String), String>;

/// The manifests' `apiVersion`.
const API_VERSION: &str = "proxops/v1alpha1";

/// Guest locks that mean the guest is being created or removed: not adopted.
const TRANSIENT_LOCKS: [&str; 3] = ["create", "clone", "destroyed"];

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

/// Reads the cluster and builds the manifests; fails if any write was sent.
///
/// # Errors
/// An unreadable cluster, a bad cluster name, or a write counted by the client.
pub async fn adopt(
    pve: &PveClient,
    scope: &NodeScope,
    cluster: &str,
) -> Result<Adoption, AdoptError> {
    check_cluster(cluster)?;
    let snapshot = read::read(pve, scope).await?;
    let mut adoption = build(&snapshot, cluster);
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

fn check_cluster(cluster: &str) -> Result<(), AdoptError> {
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

/// The manifests and report for what was read (pure).
fn build(snapshot: &Snapshot, cluster: &str) -> Adoption {
    let mut adoption = Adoption::default();
    let report = &mut adoption.report;
    report.cluster = cluster.to_owned();
    report.nodes.clone_from(&snapshot.nodes);
    report
        .skipped
        .extend(snapshot.skipped.iter().map(|(what, reason)| Skipped {
            what: what.clone(),
            reason: reason.clone(),
        }));
    let mut names: BTreeMap<Kind, Names> = BTreeMap::new();
    let mut listed: Vec<(Kind, String, String, bool)> = Vec::new();

    let (found, skipped_files) = artifact::group(&snapshot.files);
    report.skipped.extend(
        skipped_files
            .into_iter()
            .map(|(what, reason)| Skipped { what, reason }),
    );
    let mut isos = Isos::new();
    for artifact in &found {
        let wanted = safe_name(artifact_stem(&artifact.filename), MAX_NAME_LEN);
        let suffix = safe_name(&artifact.storage, MAX_NAME_LEN).unwrap_or_default();
        let fallback = format!("{}-{}", artifact.kind.root(), suffix);
        let name =
            names
                .entry(artifact.kind)
                .or_default()
                .claim(wanted.as_deref(), &suffix, &fallback);
        let volid = artifact.volid();
        if artifact.kind == Kind::Iso {
            for node in &artifact.nodes {
                isos.insert((node.clone(), volid.clone()), name.clone());
            }
        }
        let nodes: Vec<&str> = artifact.nodes.iter().map(String::as_str).collect();
        let source = format!("{volid} on {}", nodes.join(", "));
        let comments = vec![
            format!("Adopted by `proxops adopt` from {source}."),
            "The URL is a placeholder: PVE does not record where a file was downloaded from."
                .to_owned(),
        ];
        let path = path_of(artifact.kind, cluster, &name);
        let text = yaml::document(
            &comments,
            &document(artifact.kind, &name, false, artifact.spec()),
        );
        report.placeholders.push(Placeholder {
            resource: format!("{}/{name}", artifact.kind),
            url: artifact.placeholder_url(),
        });
        report.written.push(Written {
            path: path.clone(),
            resource: format!("{}/{name}", artifact.kind),
            source,
        });
        listed.push((artifact.kind, name, path.clone(), true));
        adoption.files.insert(path, text);
    }

    for guest in &snapshot.guests {
        let what = format!(
            "{} {} on {}",
            guest.guest_type.as_str(),
            guest.vmid,
            guest.node
        );
        if let Some(lock) = guest.config.get("lock")
            && TRANSIENT_LOCKS.contains(&lock)
        {
            report.skipped.push(Skipped {
                what,
                reason: format!("locked ({lock}): being created or removed"),
            });
            continue;
        }
        let template = guest.config.is_template();
        let (kind, name_key, prefix) = match (guest.guest_type, template) {
            (GuestType::Qemu, false) => (Kind::Vm, "name", "vm"),
            (GuestType::Qemu, true) => (Kind::TemplateVm, "name", "vm"),
            (GuestType::Lxc, false) => (Kind::Lxc, "hostname", "ct"),
            (GuestType::Lxc, true) => (Kind::TemplateCt, "hostname", "ct"),
        };
        let wanted = guest
            .config
            .get(name_key)
            .and_then(|n| safe_name(n, MAX_NAME_LEN));
        let vmid = guest.vmid.to_string();
        let name = names.entry(kind).or_default().claim(
            wanted.as_deref(),
            &vmid,
            &format!("{prefix}-{vmid}"),
        );
        let resource = format!("{kind}/{name}");
        let mut mapping = Mapping::new(&guest.config, resource.clone());
        let spec = match guest.guest_type {
            GuestType::Qemu => vm::spec(guest, kind, &name, &isos, &mut mapping),
            GuestType::Lxc => lxc::spec(guest, kind, &name, &mut mapping),
        };
        mapping.finish();
        let path = path_of(kind, cluster, &name);
        let mut comments = vec![format!("Adopted by `proxops adopt` from {what}.")];
        if !mapping.fill.is_empty() {
            comments.push(
                "INCOMPLETE: fill in the following, then list this file in resources.yaml:"
                    .to_owned(),
            );
            comments.extend(mapping.fill.iter().map(|f| format!("  {f}")));
        }
        if !mapping.gaps.is_empty() {
            let keys: Vec<&str> = mapping.gaps.iter().map(|g| g.key.as_str()).collect();
            comments.push(format!(
                "Left as PVE has it (not in this manifest): {}.",
                keys.join(", ")
            ));
        }
        let text = yaml::document(&comments, &document(kind, &name, true, spec));
        let complete = mapping.fill.is_empty();
        if !complete {
            report.incomplete.push(Incomplete {
                path: path.clone(),
                fill: mapping.fill.clone(),
            });
        }
        report.gaps.append(&mut mapping.gaps);
        report.written.push(Written {
            path: path.clone(),
            resource,
            source: what,
        });
        listed.push((kind, name, path.clone(), complete));
        adoption.files.insert(path, text);
    }

    listed.sort();
    report.resources_lines = listed
        .iter()
        .map(|(_, _, path, complete)| {
            let line = format!("  - ../../{path}");
            if *complete {
                line
            } else {
                format!("#{line}   (incomplete: fill it in first)")
            }
        })
        .collect();
    report.written.sort();
    report.incomplete.sort();
    report.skipped.sort();
    report.placeholders.sort();
    report.gaps.sort();
    adoption
}

/// `<kind-root>/<cluster>/<name>.yaml`.
fn path_of(kind: Kind, cluster: &str, name: &str) -> String {
    format!("{}/{cluster}/{name}.yaml", kind.root())
}

/// The whole document around a `spec`.
fn document(kind: Kind, name: &str, adopt: bool, spec: Map) -> Map {
    let mut metadata = Map::new();
    metadata.set("name", name);
    if adopt {
        let mut annotations = Map::new();
        annotations.set(ADOPT, "true");
        metadata.set("annotations", annotations);
    }
    let mut doc = Map::new();
    doc.set("apiVersion", API_VERSION);
    doc.set("kind", kind.to_string());
    doc.set("metadata", metadata);
    doc.set("spec", Value::Map(spec));
    doc
}
