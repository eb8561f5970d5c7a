//! What the repository adopt writes into already has, so that adopting twice, or adopting
//! into a repository that already manages part of the cluster, never declares a guest or a
//! file twice and never overwrites a file: the resources the cluster's composition declares
//! (by vmid and by (kind, storage, file name)), their names, and every file already in the
//! cluster's kind folders.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use proxops_core::manifest::Placement;
use proxops_core::repository::load;
use proxops_core::resource::Kind;

use crate::source::directory::read_manifest_files;

/// What the repository already declares or holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Existing {
    /// Declared guests by vmid → `VM/web (vm/base/web.yaml)`.
    pub(crate) guests: BTreeMap<u32, String>,
    /// Declared artifacts by (kind, storage, file name) → their `metadata.name`.
    pub(crate) artifacts: BTreeMap<(Kind, String, String), String>,
    /// Every declared `metadata.name`, per kind.
    pub(crate) names: BTreeSet<(Kind, String)>,
    /// Files already present under the cluster's kind folders → their contents.
    pub(crate) files: BTreeMap<String, String>,
}

impl Existing {
    /// Reads the repository at `root` for `cluster`; a missing folder is an empty repository.
    /// Returns a note when the cluster's composition could not be read (then nothing counts
    /// as declared, but existing files are still never overwritten).
    pub fn read(root: &Path, cluster: &str) -> (Self, Option<String>) {
        let mut existing = Self::default();
        let Ok(files) = read_manifest_files(root) else {
            return (existing, None);
        };
        for kind in Kind::ALL {
            let folder = format!("{}/{cluster}/", kind.root());
            for (path, text) in files.range(folder.clone()..) {
                if !path.starts_with(&folder) {
                    break;
                }
                existing.files.insert(path.clone(), text.clone());
            }
        }
        // Without the cluster's composition nothing is declared, and loading would only
        // parse every file (adopt's own earlier output, for one) for nothing.
        if !files.contains_key(&format!("clusters/{cluster}/resources.yaml")) {
            return (existing, None);
        }
        let loaded = load(&files);
        let Some(state) = loaded.state(Some(cluster)) else {
            let note = format!(
                "the repository's cluster {cluster} does not validate (run `proxops validate`): \
                 guests and files it declares are not recognised, so they may be adopted again"
            );
            return (existing, Some(note));
        };
        for resource in state.manifest.resources() {
            let id = &resource.id;
            existing.names.insert((id.kind, id.name.clone()));
            match &resource.placement {
                Placement::Guest { vmid, .. } => {
                    existing
                        .guests
                        .insert(*vmid, format!("{id} ({})", resource.path));
                }
                Placement::Artifact {
                    storage, filename, ..
                } => {
                    existing.artifacts.insert(
                        (id.kind, storage.clone(), filename.clone()),
                        id.name.clone(),
                    );
                }
            }
        }
        (existing, None)
    }

    /// Whether `path` is free for the object whose header line is `first_line`: no file is
    /// there, or adopt wrote it from the same object.
    pub(crate) fn may_write(&self, path: &str, first_line: &str) -> bool {
        self.files
            .get(path)
            .is_none_or(|text| text.lines().next() == Some(first_line))
    }

    /// Whether `path` holds something other than `contents` (edited by hand, or PVE changed).
    pub(crate) fn differs(&self, path: &str, contents: &str) -> bool {
        self.files.get(path).is_some_and(|text| text != contents)
    }
}
