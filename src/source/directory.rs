//! Reads the manifest files of a repository checkout: every `.yaml`/`.yml` file below a
//! directory, keyed by its `/`-separated path relative to that directory.
//!
//! Dot-files and dot-directories (`.git`, `.github`, editor files) are skipped. Symlinks are
//! not followed, so a link cannot pull files from outside the repository into a revision.
//! A file over [`MAX_FILE_BYTES`] is refused from its size, before it is read, and so are more
//! files than [`MAX_REVISION_FILES`] or more bytes in all than [`MAX_REVISION_BYTES`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proxops_core::manifest::MAX_FILE_BYTES;
use proxops_core::repository::{MAX_REVISION_BYTES, MAX_REVISION_FILES};

/// Reading a checkout failed.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// The path does not exist or is not a directory.
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// Walking the tree failed.
    #[error("reading {}", .path.display())]
    Walk {
        /// Where it failed.
        path: PathBuf,
        /// The cause.
        #[source]
        source: walkdir::Error,
    },
    /// A manifest file is larger than any manifest needs to be (a hostile or mistaken file).
    #[error(
        "{} is {bytes} bytes, more than the {} MiB a manifest file may hold",
        .path.display(),
        MAX_FILE_BYTES / (1024 * 1024)
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
    },
    /// The manifest files hold more than a revision may (count or bytes in all).
    #[error(
        "the manifest files below {} are too many or too large: {files} or more files of \
         {bytes} or more bytes, more than the {} files or {} MiB a revision may hold; remove \
         large or generated .yaml files, or split the repository",
        .root.display(),
        MAX_REVISION_FILES,
        MAX_REVISION_BYTES / (1024 * 1024)
    )]
    RevisionTooLarge {
        /// The directory read.
        root: PathBuf,
        /// Files counted when a limit was passed.
        files: usize,
        /// Bytes counted when a limit was passed.
        bytes: u64,
    },
    /// A file could not be read (or is not UTF-8).
    #[error("reading {}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Every manifest file below `root`, by repository-relative path.
pub fn read_manifest_files(root: &Path) -> Result<BTreeMap<String, String>, DirectoryError> {
    if !root.is_dir() {
        return Err(DirectoryError::NotADirectory(root.to_path_buf()));
    }
    let mut files = BTreeMap::new();
    let mut total: u64 = 0;
    let walker = walkdir::WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|entry| entry.depth() == 0 || !is_hidden(entry.file_name()));
    for entry in walker {
        let entry = entry.map_err(|source| DirectoryError::Walk {
            path: root.to_path_buf(),
            source,
        })?;
        if !entry.file_type().is_file() || !is_manifest_name(entry.file_name()) {
            continue;
        }
        let path = entry.path();
        let bytes = entry
            .metadata()
            .map_err(|source| DirectoryError::Walk {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        if bytes > MAX_FILE_BYTES as u64 {
            return Err(DirectoryError::TooLarge {
                path: path.to_path_buf(),
                bytes,
            });
        }
        total = total.saturating_add(bytes);
        if files.len() >= MAX_REVISION_FILES || total > MAX_REVISION_BYTES as u64 {
            return Err(DirectoryError::RevisionTooLarge {
                root: root.to_path_buf(),
                files: files.len() + 1,
                bytes: total,
            });
        }
        let contents = std::fs::read_to_string(path).map_err(|source| DirectoryError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        files.insert(relative_key(root, path), contents);
    }
    Ok(files)
}

fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.to_string_lossy().starts_with('.')
}

fn is_manifest_name(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    name.ends_with(".yaml") || name.ends_with(".yml")
}

fn relative_key(root: &Path, path: &Path) -> String {
    let relative = path.strip_prefix(root).unwrap_or(path);
    relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_a_checkout_keeps_yaml_files_and_skips_dot_directories() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("vm/base")).unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join("vm/base/a.yaml"), "a").unwrap();
        std::fs::write(root.join("vm/base/b.yml"), "b").unwrap();
        std::fs::write(root.join("vm/base/notes.txt"), "x").unwrap();
        std::fs::write(root.join(".git/config.yaml"), "x").unwrap();
        std::fs::write(root.join("vm/.draft.yaml"), "x").unwrap();
        let files = read_manifest_files(root).unwrap();
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            ["vm/base/a.yaml", "vm/base/b.yml"]
        );
    }

    #[test]
    fn a_file_over_the_size_limit_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("huge.yaml")).unwrap();
        // Sparse: the size is what is refused, nothing is written or read.
        file.set_len(MAX_FILE_BYTES as u64 + 1).unwrap();
        let err = read_manifest_files(dir.path()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}/huge.yaml is 8388609 bytes, more than the 8 MiB a manifest file may hold",
                dir.path().display()
            )
        );
    }

    #[test]
    fn files_over_the_revision_byte_budget_are_refused_before_they_are_read() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..5 {
            let file = std::fs::File::create(dir.path().join(format!("f{i}.yaml"))).unwrap();
            file.set_len(7 * 1024 * 1024).unwrap();
        }
        let err = read_manifest_files(dir.path()).unwrap_err();
        assert!(
            err.to_string().contains(
                "too many or too large: 5 or more files of 36700160 or more bytes, more than \
                 the 20000 files or 32 MiB a revision may hold"
            ),
            "{err}"
        );
    }

    #[test]
    fn reading_a_missing_directory_names_it() {
        let err = read_manifest_files(Path::new("/nonexistent/repo")).unwrap_err();
        assert_eq!(err.to_string(), "/nonexistent/repo is not a directory");
    }
}
