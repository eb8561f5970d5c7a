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

/// Most threads that read files at once, as for parsing (`proxops_core::repository`).
const MAX_READ_THREADS: usize = 4;
/// Below this many files per thread, starting threads costs more than it saves.
const MIN_FILES_PER_THREAD: usize = 64;

/// Every manifest file below `root`, by repository-relative path.
///
/// The tree is walked in one thread, in file-name order, checking each file's size and the
/// revision's budget from metadata before anything is read; the files the walk accepted are
/// then read on up to [`MAX_READ_THREADS`] threads (issue 20: reading 9,063 files one after
/// another was a sixth of `proxops validate`'s time). The outcome is the one of reading them
/// one after another: the same map, and the same error (a file that cannot be read is reported
/// before a later file over a limit).
pub fn read_manifest_files(root: &Path) -> Result<BTreeMap<String, String>, DirectoryError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(MAX_READ_THREADS);
    read_manifest_files_on(root, threads)
}

/// [`read_manifest_files`] on at most `threads` threads (1: the calling thread only).
fn read_manifest_files_on(
    root: &Path,
    threads: usize,
) -> Result<BTreeMap<String, String>, DirectoryError> {
    let (listed, stopped) = list_manifest_files(root)?;
    let contents = read_all(&listed, threads);
    let mut files = BTreeMap::new();
    for ((key, _), contents) in listed.into_iter().zip(contents) {
        files.insert(key, contents?);
    }
    match stopped {
        Some(error) => Err(error),
        None => Ok(files),
    }
}

/// The manifest files below `root` in walk order, as (key, path), each within
/// [`MAX_FILE_BYTES`] and all within the revision's budget; with the error that stopped the
/// walk, if one did (the files before it are still to be read, as a sequential reader would
/// have read them before meeting it).
type Listing = (Vec<(String, PathBuf)>, Option<DirectoryError>);

fn list_manifest_files(root: &Path) -> Result<Listing, DirectoryError> {
    if !root.is_dir() {
        return Err(DirectoryError::NotADirectory(root.to_path_buf()));
    }
    let mut listed = Vec::new();
    let mut total: u64 = 0;
    let walker = walkdir::WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|entry| entry.depth() == 0 || !is_hidden(entry.file_name()));
    for entry in walker {
        let entry = match entry {
            Ok(entry) => entry,
            Err(source) => {
                let error = DirectoryError::Walk {
                    path: root.to_path_buf(),
                    source,
                };
                return Ok((listed, Some(error)));
            }
        };
        if !entry.file_type().is_file() || !is_manifest_name(entry.file_name()) {
            continue;
        }
        let path = entry.path();
        let bytes = match entry.metadata() {
            Ok(metadata) => metadata.len(),
            Err(source) => {
                let error = DirectoryError::Walk {
                    path: path.to_path_buf(),
                    source,
                };
                return Ok((listed, Some(error)));
            }
        };
        if bytes > MAX_FILE_BYTES as u64 {
            let error = DirectoryError::TooLarge {
                path: path.to_path_buf(),
                bytes,
            };
            return Ok((listed, Some(error)));
        }
        total = total.saturating_add(bytes);
        if listed.len() >= MAX_REVISION_FILES || total > MAX_REVISION_BYTES as u64 {
            let error = DirectoryError::RevisionTooLarge {
                root: root.to_path_buf(),
                files: listed.len() + 1,
                bytes: total,
            };
            return Ok((listed, Some(error)));
        }
        listed.push((relative_key(root, path), path.to_path_buf()));
    }
    Ok((listed, None))
}

/// The contents of every listed file, in listed order, read on up to `threads` threads, each
/// taking one contiguous run of the list.
fn read_all(listed: &[(String, PathBuf)], threads: usize) -> Vec<Result<String, DirectoryError>> {
    let read = |(_, path): &(String, PathBuf)| {
        std::fs::read_to_string(path).map_err(|source| DirectoryError::Read {
            path: path.clone(),
            source,
        })
    };
    let threads = threads.min(listed.len() / MIN_FILES_PER_THREAD);
    if threads < 2 {
        return listed.iter().map(read).collect();
    }
    let run = listed.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let mut runs = listed.chunks(run);
        let first = runs.next().unwrap_or_default();
        let helpers: Vec<_> = runs
            .map(|chunk| scope.spawn(move || chunk.iter().map(read).collect::<Vec<_>>()))
            .collect();
        let mut contents: Vec<_> = first.iter().map(read).collect();
        for helper in helpers {
            // A panic while reading is a bug: let it reach the caller as it would unthreaded.
            contents.extend(
                helper
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            );
        }
        contents
    })
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

    /// A tree of `count` small manifests in nested folders, with notes and a dot-folder.
    fn many_files(root: &Path, count: usize) {
        for i in 0..count {
            let dir = root.join(format!("vm/{}", ["base", "prod", "lab"][i % 3]));
            std::fs::create_dir_all(&dir).unwrap();
            let ext = if i % 5 == 0 { "yml" } else { "yaml" };
            std::fs::write(dir.join(format!("f{i:04}.{ext}")), format!("n: {i}\n")).unwrap();
        }
        std::fs::write(root.join("vm/notes.txt"), "x").unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/x.yaml"), "x").unwrap();
    }

    #[test]
    fn reading_on_several_threads_gives_the_same_files_in_the_same_order_as_one() {
        let dir = tempfile::tempdir().unwrap();
        many_files(dir.path(), 700);
        let one = read_manifest_files_on(dir.path(), 1).unwrap();
        for threads in [2, 3, 4] {
            let several = read_manifest_files_on(dir.path(), threads).unwrap();
            assert!(
                one.iter().eq(several.iter()),
                "{threads} threads read something else"
            );
        }
        assert_eq!(one.len(), 700);
        assert_eq!(one["vm/base/f0000.yml"], "n: 0\n");
        assert_eq!(one["vm/lab/f0698.yaml"], "n: 698\n");
    }

    #[test]
    fn a_file_that_cannot_be_read_is_named_when_files_are_read_on_several_threads() {
        let dir = tempfile::tempdir().unwrap();
        many_files(dir.path(), 700);
        // Not UTF-8: `read_to_string` fails on these two; the first in walk order is reported.
        std::fs::write(dir.path().join("vm/prod/f0400.yaml"), b"\xff\xfe").unwrap();
        std::fs::write(dir.path().join("vm/prod/f0601.yaml"), b"\xff\xfe").unwrap();
        for threads in [1, 4] {
            let err = read_manifest_files_on(dir.path(), threads).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("reading {}/vm/prod/f0400.yaml", dir.path().display()),
                "{threads} threads"
            );
        }
    }

    #[test]
    fn an_unreadable_file_before_one_over_the_size_limit_is_the_error_reported() {
        let dir = tempfile::tempdir().unwrap();
        many_files(dir.path(), 300);
        std::fs::write(dir.path().join("vm/base/f0003.yaml"), b"\xff").unwrap();
        let huge = std::fs::File::create(dir.path().join("vm/prod/huge.yaml")).unwrap();
        huge.set_len(MAX_FILE_BYTES as u64 + 1).unwrap();
        let err = read_manifest_files_on(dir.path(), 4).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("reading {}/vm/base/f0003.yaml", dir.path().display())
        );
        std::fs::write(dir.path().join("vm/base/f0003.yaml"), "ok").unwrap();
        let err = read_manifest_files_on(dir.path(), 4).unwrap_err();
        assert!(
            matches!(&err, DirectoryError::TooLarge { path, .. } if path.ends_with("vm/prod/huge.yaml")),
            "{err}"
        );
    }

    #[test]
    fn reading_a_missing_directory_names_it() {
        let err = read_manifest_files(Path::new("/nonexistent/repo")).unwrap_err();
        assert_eq!(err.to_string(), "/nonexistent/repo is not a directory");
    }
}
