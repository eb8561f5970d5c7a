//! One agent per state directory (SECURITY-AUDIT.md M6): an exclusive `flock(2)` on
//! `<state_dir>/lock`, taken before anything else in the state directory is opened.
//!
//! Without it a second `proxops agent` on the same config (an operator debugging by hand)
//! marked the live agent's pass `interrupted`, failed its actions that had no UPID yet and
//! cleared "stale" git lock files in the live mirror, and only then failed on the port. With it
//! the second agent stops at the lock and names the holder: the lock file holds the pid of the
//! agent that took it.
//!
//! The lock is `std::fs::File::try_lock` (stable since Rust 1.89; `flock(LOCK_EX | LOCK_NB)`
//! on Linux). The kernel releases it when the holder exits, however it exits (kill -9
//! included), so a stale lock file is never a reason to refuse: only a live holder is.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

/// Path of the lock file inside `state_dir`.
pub fn lock_path(state_dir: &Path) -> PathBuf {
    state_dir.join("lock")
}

/// The state directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock.
    #[error(
        "another agent ({}) holds {}; stop it first, or give this one another state_dir",
        holder_text(.holder.as_deref()),
        .path.display()
    )]
    Held {
        /// The lock file.
        path: PathBuf,
        /// What the lock file says about its holder (`pid 1234`), when readable.
        holder: Option<String>,
    },
    /// The state directory or the lock file could not be created or locked.
    #[error("locking the state directory with {}", .path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn holder_text(holder: Option<&str>) -> String {
    holder.map_or_else(|| "pid unknown".to_owned(), |h| format!("pid {h}"))
}

/// The held lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct StateLock {
    _file: File,
    path: PathBuf,
}

impl StateLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Takes the exclusive lock on `state_dir` (created when missing) and writes this process's
/// pid into the lock file.
///
/// # Errors
/// [`LockError::Held`] naming the holder's pid when another process holds it; I/O errors
/// otherwise. Neither changes anything in the state directory but the lock file's own
/// creation.
pub fn lock_state_dir(state_dir: &Path) -> Result<StateLock, LockError> {
    let path = lock_path(state_dir);
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(state_dir).map_err(io)?;
    // Not truncated on open: the holder's pid must survive a second agent's attempt.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut text = String::new();
            let holder = file
                .read_to_string(&mut text)
                .ok()
                .map(|_| text.trim().to_owned())
                .filter(|t| {
                    !t.is_empty() && t.len() <= 20 && t.bytes().all(|b| b.is_ascii_digit())
                });
            return Err(LockError::Held { path, holder });
        }
        Err(TryLockError::Error(source)) => return Err(io(source)),
    }
    file.set_len(0)
        .and_then(|()| file.seek(SeekFrom::Start(0)))
        .and_then(|_| writeln!(file, "{}", std::process::id()))
        .and_then(|()| file.flush())
        .map_err(io)?;
    Ok(StateLock { _file: file, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_state_dir_is_refused_naming_the_holders_pid() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock_state_dir(dir.path()).unwrap();
        let pid = std::process::id().to_string();
        assert_eq!(std::fs::read_to_string(first.path()).unwrap().trim(), pid);
        let err = lock_state_dir(dir.path()).unwrap_err();
        assert!(
            matches!(err, LockError::Held { ref holder, .. } if holder.as_deref() == Some(pid.as_str()))
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!("another agent (pid {pid}) holds")),
            "{text}"
        );
        assert!(
            text.contains(&dir.path().join("lock").display().to_string()),
            "{text}"
        );
        // The refused attempt left the holder's pid in place.
        assert_eq!(std::fs::read_to_string(first.path()).unwrap().trim(), pid);
    }

    #[test]
    fn the_lock_is_free_again_once_its_holder_drops_it() {
        let dir = tempfile::tempdir().unwrap();
        drop(lock_state_dir(dir.path()).unwrap());
        let again = lock_state_dir(dir.path()).unwrap();
        assert!(again.path().exists());
    }

    #[test]
    fn a_missing_state_dir_is_created_for_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("a/b");
        let lock = lock_state_dir(&state).unwrap();
        assert_eq!(lock.path(), state.join("lock"));
    }
}
