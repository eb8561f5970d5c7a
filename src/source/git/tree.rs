//! Reads the manifest files of one commit straight from its tree: every `.yaml`/`.yml` blob
//! below the source's sub-path, keyed by its `/`-separated path relative to that sub-path, the
//! same shape `source::directory` gives for a checkout.
//!
//! Nothing is written to disk (there is no work tree). Dot-files and dot-directories are
//! skipped, symlinks and submodules are ignored (a link could point outside the repository).

use std::collections::BTreeMap;

use gix::ObjectId;
use proxops_core::manifest::MAX_FILE_BYTES;
use proxops_core::repository::{MAX_REVISION_BYTES, MAX_REVISION_FILES};

use super::SourceError;

/// The sub-path of the repository that holds the manifests, as validated components
/// (empty: the repository root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubPath(Vec<String>);

impl SubPath {
    /// Parses `[source] path`: relative, `/`-separated; `.` and empty components are dropped,
    /// `..` is refused so the path cannot leave the repository.
    pub(crate) fn parse(path: &str) -> Result<SubPath, SourceError> {
        if path.starts_with('/') || path.contains('\\') {
            return Err(SourceError::InvalidPath {
                path: path.to_owned(),
            });
        }
        let mut components = Vec::new();
        for component in path.split('/') {
            match component {
                "" | "." => {}
                ".." => {
                    return Err(SourceError::InvalidPath {
                        path: path.to_owned(),
                    });
                }
                name => components.push(name.to_owned()),
            }
        }
        Ok(SubPath(components))
    }

    /// The repository-relative form of `key` (a path relative to the sub-path).
    fn join(&self, key: &str) -> String {
        if self.0.is_empty() {
            key.to_owned()
        } else {
            format!("{}/{key}", self.0.join("/"))
        }
    }

    fn display(&self) -> String {
        if self.0.is_empty() {
            ".".to_owned()
        } else {
            self.0.join("/")
        }
    }
}

/// One entry of a tree, detached from the tree's buffer.
struct Entry {
    name: String,
    mode: gix::objs::tree::EntryMode,
    id: ObjectId,
}

fn entries(
    repo: &gix::Repository,
    tree: ObjectId,
    commit: ObjectId,
) -> Result<Vec<Entry>, SourceError> {
    let read = |source| SourceError::ReadCommit { commit, source };
    let tree = repo.find_tree(tree).map_err(read)?;
    let decoded = tree.decode().map_err(read)?;
    Ok(decoded
        .entries
        .iter()
        .map(|entry| Entry {
            name: entry.filename.to_string(),
            mode: entry.mode,
            id: entry.oid.to_owned(),
        })
        .collect())
}

/// Every manifest file below `sub_path` in `commit`. Sizes come from the object headers: a
/// file over [`MAX_FILE_BYTES`], more files than [`MAX_REVISION_FILES`] or more bytes in all
/// than [`MAX_REVISION_BYTES`] are refused before any blob is inflated.
pub(crate) fn read_manifest_files(
    repo: &gix::Repository,
    commit: ObjectId,
    sub_path: &SubPath,
) -> Result<BTreeMap<String, String>, SourceError> {
    let read = |source| SourceError::ReadCommit { commit, source };
    let mut tree = repo
        .find_commit(commit)
        .map_err(read)?
        .tree_id()
        .map_err(read)?
        .detach();
    for (depth, component) in sub_path.0.iter().enumerate() {
        let entry = entries(repo, tree, commit)?
            .into_iter()
            .find(|entry| entry.name == *component);
        let walked = || SubPath(sub_path.0[..=depth].to_vec()).display();
        match entry {
            Some(entry) if entry.mode.is_tree() => tree = entry.id,
            Some(_) => {
                return Err(SourceError::NotADirectory {
                    path: walked(),
                    commit,
                });
            }
            None => {
                return Err(SourceError::PathNotFound {
                    path: walked(),
                    commit,
                });
            }
        }
    }

    // First the tree and the headers: (key, blob, size) of every manifest file.
    let mut blobs: Vec<(String, ObjectId, u64)> = Vec::new();
    let mut total: u64 = 0;
    // Depth-first with an explicit stack: a hostile repository cannot overflow ours.
    let mut pending = vec![(tree, String::new())];
    while let Some((tree, prefix)) = pending.pop() {
        for entry in entries(repo, tree, commit)? {
            if entry.name.starts_with('.') {
                continue;
            }
            let key = if prefix.is_empty() {
                entry.name.clone()
            } else {
                format!("{prefix}/{}", entry.name)
            };
            if entry.mode.is_tree() {
                pending.push((entry.id, key));
            } else if entry.mode.is_blob() && is_manifest_name(&entry.name) {
                // The header gives the size without inflating the blob.
                let bytes = repo.find_header(entry.id).map_err(read)?.size();
                if bytes > MAX_FILE_BYTES as u64 {
                    return Err(SourceError::TooLarge {
                        path: sub_path.join(&key),
                        commit,
                        bytes,
                    });
                }
                total = total.saturating_add(bytes);
                blobs.push((key, entry.id, bytes));
                if blobs.len() > MAX_REVISION_FILES || total > MAX_REVISION_BYTES as u64 {
                    let largest = blobs
                        .iter()
                        .max_by(|a, b| a.2.cmp(&b.2).then_with(|| b.0.cmp(&a.0)))
                        .map(|(key, _, bytes)| (sub_path.join(key), *bytes))
                        .unwrap_or_default();
                    return Err(SourceError::RevisionTooLarge {
                        path: sub_path.display(),
                        commit,
                        files: blobs.len(),
                        bytes: total,
                        largest: largest.0,
                        largest_bytes: largest.1,
                    });
                }
            }
        }
    }

    let mut files = BTreeMap::new();
    for (key, id, _) in blobs {
        let mut blob = repo.find_blob(id).map_err(read)?;
        let contents = String::from_utf8(blob.take_data()).map_err(|err| SourceError::NotUtf8 {
            path: sub_path.join(&key),
            commit,
            source: err.utf8_error(),
        })?;
        files.insert(key, contents);
    }
    Ok(files)
}

fn is_manifest_name(name: &str) -> bool {
    name.ends_with(".yaml") || name.ends_with(".yml")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_paths_drop_dots_and_empty_components() {
        assert_eq!(SubPath::parse(".").unwrap(), SubPath(vec![]));
        assert_eq!(SubPath::parse("").unwrap(), SubPath(vec![]));
        assert_eq!(
            SubPath::parse("./clusters//prod/").unwrap(),
            SubPath(vec!["clusters".into(), "prod".into()])
        );
        assert_eq!(SubPath::parse("a/b").unwrap().join("c.yaml"), "a/b/c.yaml");
        assert_eq!(SubPath::parse(".").unwrap().join("c.yaml"), "c.yaml");
    }

    #[test]
    fn sub_paths_that_leave_the_repository_are_refused() {
        for path in ["/etc", "a/../../b", "..", "a\\b"] {
            let err = SubPath::parse(path).unwrap_err();
            assert!(
                matches!(err, SourceError::InvalidPath { .. }),
                "{path}: {err}"
            );
        }
    }
}
