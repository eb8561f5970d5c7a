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
/// The tree is walked in one thread, in file-name order; the sizes of the files found are then
/// taken on up to `MAX_READ_THREADS` (4) threads and checked in walk order (each file's size, the
/// revision's count and bytes) before anything is read; the files accepted are then read on
/// those threads (issue 20: walking and reading 9,063 files one after another was a sixth of
/// `proxops validate`'s time). The outcome is the one of reading them one after another: the
/// same map, and the same error (the first problem in walk order).
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
    if !root.is_dir() {
        return Err(DirectoryError::NotADirectory(root.to_path_buf()));
    }
    let (found, walk_error) = walk(root);
    let sizes = map_on(&found, threads, |entry| {
        entry.metadata().map(|metadata| metadata.len())
    });
    // Sizes in walk order: the first file over a limit stops the listing, as it stopped a
    // sequential reader; the files before it are still read, and a read error among them is
    // the one reported.
    let mut accepted = Vec::with_capacity(found.len());
    let mut stopped = None;
    let mut total: u64 = 0;
    for (entry, size) in found.iter().zip(sizes) {
        let path = entry.path();
        let bytes = match size {
            Ok(bytes) => bytes,
            Err(source) => {
                stopped = Some(DirectoryError::Walk {
                    path: path.to_path_buf(),
                    source,
                });
                break;
            }
        };
        if bytes > MAX_FILE_BYTES as u64 {
            stopped = Some(DirectoryError::TooLarge {
                path: path.to_path_buf(),
                bytes,
            });
            break;
        }
        total = total.saturating_add(bytes);
        if accepted.len() >= MAX_REVISION_FILES || total > MAX_REVISION_BYTES as u64 {
            stopped = Some(DirectoryError::RevisionTooLarge {
                root: root.to_path_buf(),
                files: accepted.len() + 1,
                bytes: total,
            });
            break;
        }
        accepted.push((path, bytes));
    }
    let contents = map_on(&accepted, threads, |&(path, bytes)| read_file(path, bytes));
    let mut files = BTreeMap::new();
    for ((path, _), contents) in accepted.iter().zip(contents) {
        files.insert(relative_key(root, path), contents?);
    }
    match stopped.or(walk_error) {
        Some(error) => Err(error),
        None => Ok(files),
    }
}

/// The manifest files below `root` in file-name order (symlinks and dot-entries skipped), and
/// the error that ended the walk early, if one did.
fn walk(root: &Path) -> (Vec<walkdir::DirEntry>, Option<DirectoryError>) {
    let mut found = Vec::new();
    let walker = walkdir::WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|entry| entry.depth() == 0 || !is_hidden(entry.file_name()));
    for entry in walker {
        match entry {
            Ok(entry) => {
                if entry.file_type().is_file() && is_manifest_name(entry.file_name()) {
                    found.push(entry);
                }
            }
            Err(source) => {
                let error = DirectoryError::Walk {
                    path: root.to_path_buf(),
                    source,
                };
                return (found, Some(error));
            }
        }
    }
    (found, None)
}

/// Reads one manifest file of `bytes` bytes (its size when listed) as UTF-8, never more than
/// [`MAX_FILE_BYTES`] of it (a file that grew past the limit since is refused).
///
/// Open and read only: `std::fs::read_to_string` would ask the size again (one `statx` per
/// file, 4 % of `proxops validate`'s samples on the 10,000-resource repository).
fn read_file(path: &Path, bytes: u64) -> Result<String, DirectoryError> {
    use std::io::Read as _;
    let read_error = |source| DirectoryError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let limit = MAX_FILE_BYTES as u64;
    // Room for the end-of-file read as well, so the buffer is not grown for it.
    let capacity = usize::try_from(bytes.min(limit)).unwrap_or(MAX_FILE_BYTES) + 64;
    let mut contents = Vec::with_capacity(capacity);
    file.take(limit + 1)
        .read_to_end(&mut contents)
        .map_err(read_error)?;
    if contents.len() as u64 > limit {
        return Err(DirectoryError::TooLarge {
            path: path.to_path_buf(),
            bytes: contents.len() as u64,
        });
    }
    String::from_utf8(contents).map_err(|_| {
        read_error(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        ))
    })
}

/// `f` of every item, in order, computed on up to `threads` threads, each taking one
/// contiguous run of `items` (the files are of similar size).
fn map_on<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = threads.min(items.len() / MIN_FILES_PER_THREAD);
    if threads < 2 {
        return items.iter().map(&f).collect();
    }
    let run = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|scope| {
        let mut runs = items.chunks(run);
        let first = runs.next().unwrap_or_default();
        let helpers: Vec<_> = runs
            .map(|run| scope.spawn(move || run.iter().map(f).collect::<Vec<_>>()))
            .collect();
        let mut results: Vec<R> = Vec::with_capacity(items.len());
        results.extend(first.iter().map(f));
        for helper in helpers {
            // A panic while reading is a bug: let it reach the caller as it would unthreaded.
            results.extend(
                helper
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            );
        }
        results
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
    fn a_file_that_grew_past_the_size_limit_after_it_was_listed_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("grown.yaml");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_FILE_BYTES as u64 + 1).unwrap();
        // Listed at 10 bytes; reading stops one byte past the limit.
        let err = read_file(&path, 10).unwrap_err();
        assert!(
            matches!(&err, DirectoryError::TooLarge { bytes, .. } if *bytes == MAX_FILE_BYTES as u64 + 1),
            "{err}"
        );
        std::fs::write(&path, "a: 1\n").unwrap();
        assert_eq!(read_file(&path, 10).unwrap(), "a: 1\n");
    }

    #[test]
    fn reading_a_missing_directory_names_it() {
        let err = read_manifest_files(Path::new("/nonexistent/repo")).unwrap_err();
        assert_eq!(err.to_string(), "/nonexistent/repo is not a directory");
    }
}
