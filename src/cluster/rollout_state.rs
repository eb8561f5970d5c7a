//! The rollout bookkeeping file `<dir>/rollout/<commit>.json` (issue 22, item 4): when a
//! commit was first seen in the cluster, so that every node of a later wave counts
//! `wave_timeout` from the same instant. The first agent to see a commit writes it, under the
//! cluster-wide lock `proxops-rollout` ([`crate::cluster::lock`]); the others read it. The
//! file is replaced atomically ([`crate::cluster::fs::write_atomic`]) and only the newest
//! [`KEEP`] files are kept (pmxcfs keeps every file in RAM on every node).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::cluster::config::PmxcfsConfig;
use crate::cluster::lock::{Acquire, ClusterLock};
use crate::timefmt::rfc3339;

/// How many bookkeeping files are kept (the newest by first sight).
pub const KEEP: usize = 20;
/// The cluster lock's name (`<lock_dir>/proxops-rollout`).
pub const LOCK: &str = "rollout";

/// `<dir>/rollout/<commit>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bookkeeping {
    /// The commit.
    pub commit: String,
    /// RFC 3339: when the first agent saw it.
    pub first_seen: String,
    /// The node whose agent saw it first.
    pub by: String,
}

/// `<dir>/rollout`.
pub fn rollout_dir(pmxcfs: &PmxcfsConfig) -> PathBuf {
    pmxcfs.dir.join("rollout")
}

fn is_commit(commit: &str) -> bool {
    (7..=64).contains(&commit.len()) && commit.chars().all(|c| c.is_ascii_hexdigit())
}

fn read(path: &Path) -> Option<DateTime<Utc>> {
    let bytes = std::fs::read(path).ok()?;
    let doc: Bookkeeping = serde_json::from_slice(&bytes).ok()?;
    DateTime::parse_from_rfc3339(&doc.first_seen)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// When `commit` was first seen in the cluster: read from its file, or (first sight) written
/// there as `now` by `node` under the cluster lock.
///
/// # Errors
/// Why it could not be read or recorded (no quorum, the lock not taken, a write error);
/// the caller then counts from its own first sight.
pub async fn first_seen(
    pmxcfs: &PmxcfsConfig,
    commit: &str,
    node: &str,
    now: SystemTime,
    cancel: &CancellationToken,
) -> Result<DateTime<Utc>, String> {
    if !is_commit(commit) {
        return Err(format!("`{commit}` is not a commit id"));
    }
    let dir = rollout_dir(pmxcfs);
    let path = dir.join(format!("{commit}.json"));
    if let Some(at) = read(&path) {
        return Ok(at);
    }
    let lock = ClusterLock::acquire(&pmxcfs.lock_dir, LOCK, Acquire::default(), cancel)
        .await
        .map_err(|e| crate::error_chain::error_text(&e))?;
    // Another node may have written it while we waited for the lock.
    let result = match read(&path) {
        Some(at) => Ok(at),
        None => {
            let doc = Bookkeeping {
                commit: commit.to_owned(),
                first_seen: rfc3339(now),
                by: node.to_owned(),
            };
            let bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
            let written = std::fs::create_dir_all(&dir)
                .and_then(|()| crate::cluster::fs::write_atomic(&path, &bytes));
            match written {
                Ok(()) => {
                    prune(&dir);
                    Ok(DateTime::<Utc>::from(now))
                }
                Err(error) => Err(format!("writing {}: {error}", path.display())),
            }
        }
    };
    if let Err(error) = lock.release().await {
        tracing::warn!(error = %crate::error_chain::error_text(&error), "releasing the rollout lock");
    }
    result
}

/// Removes all but the newest [`KEEP`] bookkeeping files (by first sight).
fn prune(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(DateTime<Utc>, PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter_map(|p| read(&p).map(|at| (at, p)))
        .collect();
    files.sort();
    let excess = files.len().saturating_sub(KEEP);
    for (_, path) in files.into_iter().take(excess) {
        if let Err(error) = std::fs::remove_file(&path) {
            tracing::warn!(file = %path.display(), %error, "removing an old rollout file");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// `root` as pmxcfs has it: `priv/` exists (`lock_dir`'s parent).
    fn config(root: &Path) -> PmxcfsConfig {
        std::fs::create_dir_all(root.join("priv")).unwrap();
        PmxcfsConfig {
            dir: root.join("proxops"),
            lock_dir: root.join("priv/lock"),
            publish: true,
            heartbeat: Duration::from_secs(30),
        }
    }

    #[tokio::test]
    async fn the_first_sight_of_a_commit_is_recorded_once_and_read_by_every_later_agent() {
        let root = tempfile::tempdir().unwrap();
        let pmxcfs = config(root.path());
        let commit = "c".repeat(40);
        let cancel = CancellationToken::new();
        let early = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let first = first_seen(&pmxcfs, &commit, "pve3", early, &cancel)
            .await
            .unwrap();
        assert_eq!(first, DateTime::<Utc>::from(early));
        let later = early + Duration::from_secs(600);
        let again = first_seen(&pmxcfs, &commit, "pve1", later, &cancel)
            .await
            .unwrap();
        assert_eq!(again, first, "a later agent counts from the first sight");
        let doc: Bookkeeping = serde_json::from_slice(
            &std::fs::read(rollout_dir(&pmxcfs).join(format!("{commit}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(doc.by, "pve3");
        assert!(
            !pmxcfs.lock_dir.join("proxops-rollout").exists(),
            "the lock is released"
        );
    }

    #[tokio::test]
    async fn only_the_newest_bookkeeping_files_are_kept_and_odd_names_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let pmxcfs = config(root.path());
        let cancel = CancellationToken::new();
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        for i in 0..(KEEP + 3) {
            let commit = format!("{i:040x}");
            let at = base + Duration::from_secs(u64::try_from(i).unwrap());
            first_seen(&pmxcfs, &commit, "pve3", at, &cancel)
                .await
                .unwrap();
        }
        let left = std::fs::read_dir(rollout_dir(&pmxcfs)).unwrap().count();
        assert_eq!(left, KEEP);
        assert!(
            !rollout_dir(&pmxcfs)
                .join(format!("{:040x}.json", 0))
                .exists()
        );
        let err = first_seen(&pmxcfs, "../../etc/passwd", "pve3", base, &cancel)
            .await
            .unwrap_err();
        assert!(err.contains("is not a commit id"), "{err}");
    }
}
