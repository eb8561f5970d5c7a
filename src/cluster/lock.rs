//! Cluster-wide locks, made the way pve-cluster makes its own (pve-cluster 7091d92
//! `src/PVE/Cluster.pm` `$cfs_lock`): a directory `<lock_dir>/proxops-<name>` made with
//! `mkdir`, which pmxcfs makes once for the whole cluster (`src/pmxcfs/memdb.c`
//! `memdb_mkdir`: `EEXIST` when it is there). What is relied on:
//!
//! - **Waiting**: a waiter retries `mkdir` with sleeps of at most a second and, after each
//!   failure, sends pmxcfs an *unlock request*, `utime(path, 0, 0)`, as `$cfs_lock` does
//!   (`# cfs unlock request`). It gives up after a bounded wait with `got lock request
//!   timeout`, the error `$cfs_lock` raises.
//! - **Expiry**: pmxcfs deletes a lock on an unlock request when the lock has not changed
//!   for `CFS_LOCK_TIMEOUT`, 120 s (`src/pmxcfs/memdb.c` `memdb_lock_expired`, called from
//!   `src/pmxcfs/cfs-plug-memdb.c` `cfs_plug_memdb_utimens`, and in a cluster by the node
//!   with the lowest id, `src/pmxcfs/dcdb.c` `dcdb_deliver`). The takeover of a stale lock
//!   is therefore pmxcfs's own, atomic: the waiter's next `mkdir` succeeds. ProxOps never
//!   removes a lock it does not hold.
//! - **Keeping it**: a lock's identity includes its mtime (`src/pmxcfs/memdb.c`
//!   `memdb_tree_entry_csum`), and a changed lock restarts its expiry (`memdb_lock_expired`:
//!   `wrong lock csum - reset timeout`). `$cfs_lock` holds a lock for at most 60 s instead;
//!   ProxOps holds one for a whole download, so the holder sets a newer mtime every
//!   [`Acquire::refresh`] (pmxcfs lets a lock's mtime move forward only, `memdb_mtime`).
//! - **Release**: `rmdir`, also when the work failed (`$cfs_lock`: `rmdir $filename if
//!   $got_lock`), and on drop.
//! - **No quorum**: `mkdir` fails with `EACCES` (`src/pmxcfs/dcdb.c`
//!   `dcdb_send_fuse_message`); [`LockError::NoQuorum`] says so at once, without waiting.
//!
//! On a directory that is not pmxcfs nothing answers unlock requests: a lock left behind by a
//! crashed holder stays until an operator removes it (the timeout error says which one).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

/// pmxcfs's lock expiry (`CFS_LOCK_TIMEOUT`).
pub const PMXCFS_LOCK_EXPIRY: Duration = Duration::from_secs(120);
/// Default [`Acquire::wait`]: long enough for another node's download of an ISO to a shared
/// storage, which the waiter would otherwise repeat.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30 * 60);
/// Default [`Acquire::refresh`]: well inside [`PMXCFS_LOCK_EXPIRY`].
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(10);
/// Longest sleep between two `mkdir` attempts (`$cfs_lock`: at most a second).
const MAX_RETRY_SLEEP: Duration = Duration::from_secs(1);
/// Prefix of every lock ProxOps makes, so operators can tell them from PVE's.
pub const PREFIX: &str = "proxops-";

/// How to take a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquire {
    /// Give up after this long.
    pub wait: Duration,
    /// Set a newer mtime this often while held.
    pub refresh: Duration,
}

impl Default for Acquire {
    fn default() -> Self {
        Self {
            wait: DEFAULT_WAIT,
            refresh: DEFAULT_REFRESH,
        }
    }
}

/// A lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The name has characters other than ASCII letters, digits, `.`, `_` and `-`.
    #[error("cluster lock name `{0}`: use ASCII letters, digits, `.`, `_` and `-` only")]
    BadName(String),
    /// `lock_dir` is not there and could not be made: pmxcfs is not mounted.
    #[error(
        "cluster lock directory {}: pve cluster filesystem not online (is pve-cluster running and [pmxcfs] lock_dir right?)",
        .0.display()
    )]
    NotOnline(PathBuf, #[source] io::Error),
    /// The filesystem refuses writes: pmxcfs without quorum.
    #[error(
        "cluster lock {}: no quorum: /etc/pve takes no writes, so no node can lock",
        .0.display()
    )]
    NoQuorum(PathBuf, #[source] io::Error),
    /// Another holder kept the lock for the whole wait.
    #[error(
        "cluster lock {}: got lock request timeout after {}: another node holds it; pmxcfs removes it 120 s after its holder stops refreshing it (outside pmxcfs, remove the directory once no agent holds it)",
        .path.display(),
        humantime::format_duration(*.waited)
    )]
    Timeout {
        /// The lock directory.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// The wait was cancelled (shutdown).
    #[error("cluster lock {}: cancelled while waiting", .0.display())]
    Cancelled(PathBuf),
    /// Another filesystem error.
    #[error("cluster lock {}", .0.display())]
    Io(PathBuf, #[source] io::Error),
}

/// A held cluster-wide lock: kept alive while held, released by [`ClusterLock::release`]
/// or on drop.
#[derive(Debug)]
pub struct ClusterLock {
    path: PathBuf,
    keeper: CancellationToken,
    released: bool,
}

impl ClusterLock {
    /// Takes `<lock_dir>/proxops-<name>`, waiting as pve-cluster's `cfs_lock` waits.
    ///
    /// # Errors
    /// A bad name, no pmxcfs, no quorum, the wait ran out, or `cancel` fired.
    pub async fn acquire(
        lock_dir: &Path,
        name: &str,
        how: Acquire,
        cancel: &CancellationToken,
    ) -> Result<ClusterLock, LockError> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(LockError::BadName(name.to_owned()));
        }
        let path = lock_dir.join(format!("{PREFIX}{name}"));
        // `$cfs_lock`: `mkdir $lockdir; die "pve cluster filesystem not online" if !-d`.
        let _ = std::fs::create_dir(lock_dir);
        if let Err(error) = std::fs::metadata(lock_dir) {
            return Err(LockError::NotOnline(lock_dir.to_path_buf(), error));
        }
        let started = tokio::time::Instant::now();
        let mut logged = false;
        loop {
            match blocking(path.clone(), |p| std::fs::create_dir(p)).await {
                Ok(()) => break,
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
                Err(error) if super::fs::is_read_only(&error) => {
                    return Err(LockError::NoQuorum(path, error));
                }
                Err(error) => return Err(LockError::Io(path, error)),
            }
            let waited = started.elapsed();
            if waited >= how.wait {
                return Err(LockError::Timeout { path, waited });
            }
            if !logged {
                tracing::info!(lock = %path.display(), "waiting for a cluster lock another node holds");
                logged = true;
            }
            // The unlock request; its answer does not matter (pmxcfs refuses the mtime).
            let _ = blocking(path.clone(), |p| set_mtime(p, SystemTime::UNIX_EPOCH)).await;
            let nap = MAX_RETRY_SLEEP.min(how.wait.saturating_sub(waited));
            tokio::select! {
                () = cancel.cancelled() => return Err(LockError::Cancelled(path)),
                () = tokio::time::sleep(nap) => {}
            }
        }
        let keeper = CancellationToken::new();
        tokio::spawn(keep(path.clone(), how.refresh, keeper.clone()));
        Ok(ClusterLock {
            path,
            keeper,
            released: false,
        })
    }

    /// The lock directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Releases the lock (`rmdir`).
    ///
    /// # Errors
    /// The directory could not be removed (it expires in pmxcfs then).
    pub async fn release(mut self) -> Result<(), LockError> {
        self.keeper.cancel();
        self.released = true;
        blocking(self.path.clone(), |p| std::fs::remove_dir(p))
            .await
            .map_err(|e| LockError::Io(self.path.clone(), e))
    }
}

impl Drop for ClusterLock {
    fn drop(&mut self) {
        self.keeper.cancel();
        if !self.released
            && let Err(error) = std::fs::remove_dir(&self.path)
        {
            tracing::warn!(lock = %self.path.display(), error = %error, "releasing a cluster lock");
        }
    }
}

/// Sets a newer mtime every `refresh` until `stop`: pmxcfs restarts the lock's expiry.
async fn keep(path: PathBuf, refresh: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(refresh) => {}
        }
        if let Err(error) = blocking(path.clone(), |p| set_mtime(p, SystemTime::now())).await {
            tracing::warn!(lock = %path.display(), error = %error, "refreshing a cluster lock");
        }
    }
}

fn set_mtime(path: &Path, mtime: SystemTime) -> io::Result<()> {
    let times = std::fs::FileTimes::new()
        .set_accessed(mtime)
        .set_modified(mtime);
    std::fs::File::open(path)?.set_times(times)
}

/// Runs a filesystem call off the runtime: a FUSE call on pmxcfs waits for the cluster.
async fn blocking(
    path: PathBuf,
    f: impl FnOnce(&Path) -> io::Result<()> + Send + 'static,
) -> io::Result<()> {
    tokio::task::spawn_blocking(move || f(&path))
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick(wait: Duration) -> Acquire {
        Acquire {
            wait,
            refresh: Duration::from_millis(20),
        }
    }

    #[tokio::test]
    async fn a_second_holder_waits_until_the_first_releases() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        let first =
            ClusterLock::acquire(dir.path(), "download-nas-1", quick(Duration::ZERO), &cancel)
                .await
                .unwrap();
        assert!(dir.path().join("proxops-download-nas-1").is_dir());
        let err =
            ClusterLock::acquire(dir.path(), "download-nas-1", quick(Duration::ZERO), &cancel)
                .await
                .unwrap_err();
        assert!(
            err.to_string().contains("got lock request timeout"),
            "{err}"
        );
        let waiter = {
            let dir = dir.path().to_path_buf();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                ClusterLock::acquire(
                    &dir,
                    "download-nas-1",
                    quick(Duration::from_secs(30)),
                    &cancel,
                )
                .await
            })
        };
        first.release().await.unwrap();
        let second = waiter.await.unwrap().unwrap();
        assert_eq!(second.path(), dir.path().join("proxops-download-nas-1"));
        drop(second);
        assert!(!dir.path().join("proxops-download-nas-1").exists());
    }

    #[tokio::test]
    async fn a_holder_moves_the_mtime_forward_while_it_holds_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let lock = ClusterLock::acquire(
            dir.path(),
            "rollout",
            quick(Duration::ZERO),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        set_mtime(lock.path(), SystemTime::UNIX_EPOCH).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::metadata(lock.path()).unwrap().modified().unwrap() == SystemTime::UNIX_EPOCH
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the holder never refreshed the lock"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_bad_name_or_a_missing_lock_dir_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        let err = ClusterLock::acquire(dir.path(), "../etc", Acquire::default(), &cancel)
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::BadName(_)), "{err}");
        let err = ClusterLock::acquire(
            &dir.path().join("no/such"),
            "x",
            Acquire::default(),
            &cancel,
        )
        .await
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("pve cluster filesystem not online"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_wait_ends_when_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        let _held = ClusterLock::acquire(dir.path(), "x", quick(Duration::ZERO), &cancel)
            .await
            .unwrap();
        let other = CancellationToken::new();
        other.cancel();
        let err = ClusterLock::acquire(dir.path(), "x", quick(Duration::from_secs(60)), &other)
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Cancelled(_)), "{err}");
    }
}
