//! The filesystem operations cluster mode relies on, and how their errors are read: an atomic
//! replace (temporary file in the same directory, then rename), and whether the replicated
//! `/etc/pve` takes writes at all. Plain `std::fs` on the real path: no test hook.
//!
//! What pmxcfs does with them (pve-cluster 7091d92):
//! - rename within the filesystem replaces the target in one step under the memdb mutex
//!   (`src/pmxcfs/memdb.c` `memdb_rename`: the target entry is unlinked and the source
//!   renamed in the same locked section), so a reader sees the old or the new document.
//! - without quorum every write is refused with `EACCES` (`src/pmxcfs/dcdb.c`
//!   `dcdb_send_fuse_message`: `if (!cfs_is_quorate()) return -EACCES`), and `stat` shows
//!   directories `0555` and files `0444` (`src/pmxcfs/cfs-plug-memdb.c` `tree_entry_stat`).
//! - pmxcfs has no `fsync` handler (`src/pmxcfs/pmxcfs.c` `fuse_ops`): a write is replicated
//!   when `write(2)` returns; `fsync` is still called for filesystems that need it.

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` so that a reader sees the old content or the new, never a part:
/// `<path>.tmp.<pid>` in the same directory (as PVE's own `PVE::Tools::file_set_contents`
/// names it), flushed, then renamed over `path`. The directory is created when missing. A
/// failed write removes the temporary file.
///
/// # Errors
/// The directory cannot be made or the file cannot be written or renamed (see
/// [`is_read_only`] for a filesystem that refuses writes).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no parent directory"))?;
    std::fs::create_dir_all(dir)?;
    let tmp = temporary(path);
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp.{}", std::process::id()));
    path.with_file_name(name)
}

/// Whether `error` says the filesystem takes no writes: pmxcfs without quorum (`EACCES`), a
/// read-only mount (`EROFS`), or `EPERM`.
pub fn is_read_only(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EACCES | libc::EROFS | libc::EPERM)
    )
}

/// Why `dir` cannot take writes now, if it cannot: mounted read-only (`statvfs` `ST_RDONLY`),
/// or shown without write permission as pmxcfs shows every directory without quorum
/// (`0555`). `None` when it looks writable or does not exist yet (its parent is checked).
pub fn read_only_reason(dir: &Path) -> Option<String> {
    let existing = dir.ancestors().find(|p| p.exists())?;
    if let Ok(vfs) = rustix::fs::statvfs(existing)
        && vfs.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY)
    {
        return Some(format!("{} is mounted read-only", existing.display()));
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(&existing.metadata().ok()?.permissions());
    if mode & 0o222 == 0 {
        return Some(format!(
            "{} is read-only (mode {:o}): pmxcfs shows /etc/pve so without quorum",
            existing.display(),
            mode & 0o777
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_replaces_the_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status/pve1.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("status"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["pve1.json"]);
        assert_eq!(read_only_reason(&path), None);
    }

    #[test]
    fn eacces_and_erofs_read_as_no_writes_but_enoent_does_not() {
        assert!(is_read_only(&io::Error::from_raw_os_error(libc::EACCES)));
        assert!(is_read_only(&io::Error::from_raw_os_error(libc::EROFS)));
        assert!(!is_read_only(&io::Error::from_raw_os_error(libc::ENOENT)));
    }

    #[test]
    fn a_directory_without_write_bits_is_read_only_as_pmxcfs_shows_it_without_quorum() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("proxops");
        std::fs::create_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, std::os::unix::fs::PermissionsExt::from_mode(0o555))
            .unwrap();
        let reason = read_only_reason(&sub.join("status")).unwrap();
        assert!(reason.contains("mode 555"), "{reason}");
    }
}
