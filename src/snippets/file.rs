//! Snippet files on the node: hashing, and the atomic, link-refusing writes and removals in
//! a storage's snippets directory.
//!
//! A file is written beside its final name as a dot-file (pve-storage lists a directory with
//! `<$path/*>`, which skips dot-files: `Plugin.pm`, `$get_subdir_files`), created exclusively
//! and never through a link (`O_CREAT|O_EXCL|O_NOFOLLOW`), given its mode on the open handle
//! (so the umask does not decide), written, `fsync`ed, renamed over the name (which replaces
//! a directory entry and follows nothing), and the directory is `fsync`ed. A reader, PVE
//! generating a cloud-init drive, sees the old file or the new one, never half of one.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

/// Mode of a snippet without secrets: PVE (root) and anyone on the node may read it.
pub const PUBLIC_MODE: u32 = 0o644;
/// Mode of a snippet that holds SOPS values: its owner (root) only.
pub const SECRET_MODE: u32 = 0o600;

/// The SHA-256 of `text`, lowercase hex.
pub fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Why a snippet file could not be written, touched or removed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// A file system call failed.
    #[error("{what} {}", .path.display())]
    Io {
        /// What was being done (`writing`, `removing`, ...).
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A symbolic link where a real directory or file must be.
    #[error(
        "{} is a symbolic link; ProxOps never writes snippets through links: replace it with a \
         directory (or remove it)",
        .0.display()
    )]
    Link(PathBuf),
}

fn io_error<'p>(what: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> FileError + 'p {
    move |source| FileError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// The snippets directory `dir`, created when missing (only its last component: the
/// storage's own path must exist); a link there is refused.
fn real_dir(dir: &Path) -> Result<(), FileError> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => Err(FileError::Link(dir.to_path_buf())),
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(FileError::Io {
            what: "using as the snippets directory",
            path: dir.to_path_buf(),
            source: io::Error::new(io::ErrorKind::AlreadyExists, "not a directory"),
        }),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            // `create_dir` fails rather than follow a link planted since the check.
            fs::create_dir(dir).map_err(io_error("creating", dir))?;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
                .map_err(io_error("setting the mode of", dir))
        }
        Err(error) => Err(io_error("reading", dir)(error)),
    }
}

/// Writes `contents` as `dir/name` with `mode`, atomically; `false` when a regular file of
/// that name already holds exactly these bytes with that mode (nothing is written then).
///
/// # Errors
/// A link in the way, or the first file system call that failed.
pub fn write(dir: &Path, name: &str, contents: &[u8], mode: u32) -> Result<bool, FileError> {
    real_dir(dir)?;
    let path = dir.join(name);
    if let Ok(meta) = fs::symlink_metadata(&path)
        && meta.is_file()
        && meta.permissions().mode() & 0o777 == mode
        && read_no_follow(&path).is_ok_and(|old| old == contents)
    {
        return Ok(false);
    }
    let tmp = dir.join(format!(".{name}.proxops-tmp"));
    // A leftover of an interrupted write, or a planted link: unlinked, never followed.
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(io_error("removing", &tmp)(error)),
    }
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(mode)
            .open(&tmp)?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(contents)?;
        file.sync_all()
    })();
    if let Err(error) = written {
        let _ = fs::remove_file(&tmp);
        return Err(io_error("writing", &tmp)(error));
    }
    fs::rename(&tmp, &path).map_err(io_error("renaming into place", &path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("syncing", dir))?;
    Ok(true)
}

fn read_no_follow(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let mut out = Vec::new();
    file.read_to_end(&mut out)?;
    Ok(out)
}

/// Sets `dir/name`'s modification time (and so its `ctime`, which PVE lists) to now: the
/// grace period of a file a guest is about to stop naming starts now. A missing file is
/// not an error (`false`); a link is never followed.
///
/// # Errors
/// The file system call that failed.
pub fn touch(dir: &Path, name: &str) -> Result<bool, FileError> {
    let path = dir.join(name);
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(io_error("opening", &path)(error)),
    };
    file.set_modified(SystemTime::now())
        .map_err(io_error("touching", &path))?;
    Ok(true)
}

/// Removes `dir/name` (a link is removed itself, never followed); `false` when it is gone
/// already.
///
/// # Errors
/// The file system call that failed.
pub fn remove(dir: &Path, name: &str) -> Result<bool, FileError> {
    let path = dir.join(name);
    match fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(io_error("removing", &path)(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_the_sha256_of_the_text() {
        // `printf 'abc' | sha256sum`
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_write_is_atomic_with_its_mode_and_a_second_identical_write_changes_nothing() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("snippets");
        assert!(write(&dir, "a.yaml", b"#cloud-config\n", SECRET_MODE).expect("written"));
        let meta = fs::metadata(dir.join("a.yaml")).expect("exists");
        assert_eq!(meta.permissions().mode() & 0o777, SECRET_MODE);
        assert_eq!(
            fs::read(dir.join("a.yaml")).expect("reads"),
            b"#cloud-config\n"
        );
        assert!(!write(&dir, "a.yaml", b"#cloud-config\n", SECRET_MODE).expect("no-op"));
        // A different mode is a rewrite, not a no-op.
        assert!(write(&dir, "a.yaml", b"#cloud-config\n", PUBLIC_MODE).expect("rewritten"));
        let names: Vec<String> = fs::read_dir(&dir)
            .expect("lists")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.yaml"], "no temporary file is left");
    }

    #[test]
    fn a_link_as_the_snippets_directory_is_refused_and_a_planted_link_is_replaced() {
        let root = tempfile::tempdir().expect("tempdir");
        let elsewhere = root.path().join("elsewhere");
        fs::create_dir(&elsewhere).expect("dir");
        let link = root.path().join("snippets");
        std::os::unix::fs::symlink(&elsewhere, &link).expect("link");
        assert!(matches!(
            write(&link, "a.yaml", b"x", PUBLIC_MODE),
            Err(FileError::Link(_))
        ));
        let dir = root.path().join("real");
        fs::create_dir(&dir).expect("dir");
        let target = root.path().join("target");
        fs::write(&target, b"keep").expect("target");
        std::os::unix::fs::symlink(&target, dir.join("a.yaml")).expect("link");
        assert!(write(&dir, "a.yaml", b"new", PUBLIC_MODE).expect("written"));
        assert_eq!(
            fs::read(&target).expect("reads"),
            b"keep",
            "the link's target is untouched"
        );
        assert!(
            !fs::symlink_metadata(dir.join("a.yaml"))
                .expect("meta")
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn touch_and_remove_say_whether_the_file_was_there() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path();
        assert!(!touch(dir, "gone.yaml").expect("missing is fine"));
        assert!(!remove(dir, "gone.yaml").expect("missing is fine"));
        fs::write(dir.join("a.yaml"), b"x").expect("written");
        assert!(touch(dir, "a.yaml").expect("touched"));
        assert!(remove(dir, "a.yaml").expect("removed"));
        assert!(!dir.join("a.yaml").exists());
    }
}
