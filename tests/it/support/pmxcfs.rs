//! A stand-in for the replicated `/etc/pve` (pmxcfs) that the agents of one test share: a
//! temporary directory with `proxops/` and `priv/lock/`, plus the pmxcfs semantics ProxOps
//! relies on (pve-cluster 7091d92), so the agents exercise their real code on real paths:
//!
//! - **atomic rename** within the directory: the host filesystem's own `rename(2)`, as
//!   pmxcfs's `memdb_rename` replaces the target in one locked step.
//! - **the lock directory and its expiry**: a lock is a directory made with `mkdir` under
//!   `priv/lock/`. A thread does what pmxcfs does for an unlock request, `utime(path, 0, 0)`
//!   (`src/pmxcfs/cfs-plug-memdb.c` `cfs_plug_memdb_utimens`, `src/pmxcfs/memdb.c`
//!   `memdb_lock_expired`): when the lock has not changed for longer than the expiry (pmxcfs:
//!   `CFS_LOCK_TIMEOUT`, 120 s; shorter here so tests stay short), it is deleted; otherwise
//!   its mtime is put back, as `memdb_mtime` refuses to move a lock's mtime backwards. A
//!   holder that sets a newer mtime changes the lock and so restarts its expiry.
//! - **read-only without quorum**: [`Pmxcfs::lose_quorum`] bind-mounts the directory onto
//!   itself read-only, so every write the agents make fails (`EROFS`; pmxcfs answers
//!   `EACCES`, `src/pmxcfs/dcdb.c` `dcdb_send_fuse_message`), whatever user they run as —
//!   tests run as root, for whom permission bits are no obstacle. [`Pmxcfs::regain_quorum`]
//!   unmounts it. The agent has no way to tell this from the real thing, and needs none.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// How often the expiry thread looks at the lock directory.
const EXPIRY_TICK: Duration = Duration::from_millis(50);

pub(crate) struct Pmxcfs {
    root: tempfile::TempDir,
    expiry: Duration,
    read_only: bool,
    stop: Arc<AtomicBool>,
    expirer: Option<std::thread::JoinHandle<()>>,
}

impl Pmxcfs {
    /// A stand-in whose locks expire after `expiry` without a change.
    pub(crate) fn new(expiry: Duration) -> Pmxcfs {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("proxops")).unwrap();
        std::fs::create_dir_all(root.path().join("priv/lock")).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let expirer = {
            let lock_dir = root.path().join("priv/lock");
            let stop = stop.clone();
            std::thread::spawn(move || expire_locks(&lock_dir, expiry, &stop))
        };
        Pmxcfs {
            root,
            expiry,
            read_only: false,
            stop,
            expirer: Some(expirer),
        }
    }

    /// The mount point (`/etc/pve` on a node).
    pub(crate) fn root(&self) -> &Path {
        self.root.path()
    }

    /// `[pmxcfs] dir`.
    pub(crate) fn dir(&self) -> PathBuf {
        self.root().join("proxops")
    }

    /// `[pmxcfs] lock_dir`.
    pub(crate) fn lock_dir(&self) -> PathBuf {
        self.root().join("priv/lock")
    }

    /// How long a lock lives here without a change.
    #[allow(dead_code, reason = "not every suite asks")]
    pub(crate) fn lock_expiry(&self) -> Duration {
        self.expiry
    }

    /// The `[pmxcfs]` table for an agent on this stand-in.
    pub(crate) fn toml(&self, heartbeat: &str) -> String {
        format!(
            "[pmxcfs]\ndir = {}\nlock_dir = {}\nheartbeat = \"{heartbeat}\"\n",
            toml::Value::String(self.dir().display().to_string()),
            toml::Value::String(self.lock_dir().display().to_string()),
        )
    }

    /// `<dir>/status/<node>.json`, parsed, if it is there.
    pub(crate) fn status_file(&self, node: &str) -> Option<serde_json::Value> {
        let text = std::fs::read(self.dir().join("status").join(format!("{node}.json"))).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// The names under `lock_dir` right now.
    #[allow(dead_code, reason = "not every suite asks")]
    pub(crate) fn locks(&self) -> Vec<String> {
        let mut names: Vec<_> = std::fs::read_dir(self.lock_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Quorum lost: every write under the mount point fails from now on.
    pub(crate) fn lose_quorum(&mut self) {
        let root = self.root().display().to_string();
        run(&["mount", "--bind", &root, &root]);
        self.read_only = true;
        run(&["mount", "-o", "remount,bind,ro", &root]);
    }

    /// Quorum back: writes work again.
    #[allow(dead_code, reason = "not every suite asks")]
    pub(crate) fn regain_quorum(&mut self) {
        if std::mem::take(&mut self.read_only) {
            run(&["umount", &self.root().display().to_string()]);
        }
    }
}

impl Drop for Pmxcfs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(expirer) = self.expirer.take() {
            let _ = expirer.join();
        }
        if self.read_only {
            let _ = Command::new("umount").arg(self.root.path()).status();
        }
    }
}

fn run(args: &[&str]) {
    let output = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        output.status.success(),
        "{} failed ({}): the pmxcfs stand-in needs root to bind-mount read-only: {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// What the thread remembers of one lock: the identity pmxcfs's checksum covers (inode and
/// mtime), the last mtime a holder set, and since when it has not changed.
struct Seen {
    inode: u64,
    mtime: SystemTime,
    since: Instant,
}

#[allow(
    clippy::disallowed_methods,
    reason = "a plain thread of its own, not the runtime: it ticks as pmxcfs's timer would"
)]
fn expire_locks(lock_dir: &Path, expiry: Duration, stop: &AtomicBool) {
    let mut seen: HashMap<PathBuf, Seen> = HashMap::new();
    while !stop.load(Ordering::SeqCst) {
        let Ok(entries) = std::fs::read_dir(lock_dir) else {
            std::thread::sleep(EXPIRY_TICK);
            continue;
        };
        let mut present = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !meta.is_dir() {
                continue;
            }
            present.push(path.clone());
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let unlock_request = mtime == SystemTime::UNIX_EPOCH;
            let now = Instant::now();
            let known = seen.entry(path.clone()).or_insert(Seen {
                inode: meta.ino(),
                mtime,
                since: now,
            });
            if known.inode != meta.ino() {
                *known = Seen {
                    inode: meta.ino(),
                    mtime,
                    since: now,
                };
            }
            if unlock_request {
                if now.duration_since(known.since) > expiry {
                    if std::fs::remove_dir(&path).is_ok() {
                        seen.remove(&path);
                    }
                } else if let Ok(dir) = std::fs::File::open(&path) {
                    // memdb_mtime: a lock's mtime never goes backwards.
                    let _ = dir.set_modified(known.mtime);
                }
            } else if mtime != known.mtime {
                known.mtime = mtime;
                known.since = now;
            }
        }
        seen.retain(|path, _| present.contains(path));
        std::thread::sleep(EXPIRY_TICK);
    }
}
