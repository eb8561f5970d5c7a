//! `[pmxcfs]` of agent.toml: where the cluster's replicated `/etc/pve` holds the status files
//! and the cluster-wide locks, whether this agent publishes, and how often. Without the table
//! cluster mode is off: nothing is published, no lock is taken, there is no cluster view.
//! Every error names the key (`pmxcfs.dir`, …) and what to do.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Default `dir`: a directory of ProxOps's own in the replicated `/etc/pve`.
pub const DEFAULT_DIR: &str = "/etc/pve/proxops";
/// Default `lock_dir`: pmxcfs's own lock directory, where `cfs_lock` makes its locks
/// (pve-cluster 7091d92 `src/PVE/Cluster.pm`, `$lockdir = "/etc/pve/priv/lock"`).
pub const DEFAULT_LOCK_DIR: &str = "/etc/pve/priv/lock";
/// Default `heartbeat`.
pub const DEFAULT_HEARTBEAT: &str = "30s";
/// Shortest `heartbeat`: every write is replicated to every node by corosync.
pub const MIN_HEARTBEAT: Duration = Duration::from_secs(1);
/// Longest `heartbeat`.
pub const MAX_HEARTBEAT: Duration = Duration::from_secs(3600);

/// `[pmxcfs]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPmxcfs {
    dir: Option<PathBuf>,
    lock_dir: Option<PathBuf>,
    publish: Option<bool>,
    heartbeat: Option<String>,
}

/// `[pmxcfs]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmxcfsConfig {
    /// Where `status/<node>.json` files are written and read.
    pub dir: PathBuf,
    /// Where cluster-wide locks are made (`proxops-<name>` directories).
    pub lock_dir: PathBuf,
    /// Whether this agent writes its status file (`true` when the table is present).
    pub publish: bool,
    /// How often the status file is written when no pass ends; a file older than three
    /// intervals is shown stale.
    pub heartbeat: Duration,
}

impl PmxcfsConfig {
    /// `<dir>/status`.
    pub fn status_dir(&self) -> PathBuf {
        self.dir.join("status")
    }

    /// `<dir>/status/<node>.json`.
    pub fn status_file(&self, node: &str) -> PathBuf {
        self.status_dir().join(format!("{node}.json"))
    }
}

impl RawPmxcfs {
    /// Validates the table; the error is (key, what is wrong and what to do).
    ///
    /// # Errors
    /// A path that is not absolute, or a heartbeat that is not a duration in range.
    pub fn validate(self) -> Result<PmxcfsConfig, (&'static str, String)> {
        let dir = absolute("pmxcfs.dir", self.dir, DEFAULT_DIR)?;
        let lock_dir = absolute("pmxcfs.lock_dir", self.lock_dir, DEFAULT_LOCK_DIR)?;
        let text = self
            .heartbeat
            .unwrap_or_else(|| DEFAULT_HEARTBEAT.to_owned());
        let heartbeat = humantime::parse_duration(&text).map_err(|e| {
            (
                "pmxcfs.heartbeat",
                format!("`{text}`: {e}; write a duration such as \"30s\""),
            )
        })?;
        if !(MIN_HEARTBEAT..=MAX_HEARTBEAT).contains(&heartbeat) {
            return Err((
                "pmxcfs.heartbeat",
                format!(
                    "`{text}`: must be between {} and {}",
                    humantime::format_duration(MIN_HEARTBEAT),
                    humantime::format_duration(MAX_HEARTBEAT)
                ),
            ));
        }
        Ok(PmxcfsConfig {
            dir,
            lock_dir,
            publish: self.publish.unwrap_or(true),
            heartbeat,
        })
    }
}

fn absolute(
    key: &'static str,
    path: Option<PathBuf>,
    default: &str,
) -> Result<PathBuf, (&'static str, String)> {
    let path = path.unwrap_or_else(|| PathBuf::from(default));
    if path.is_absolute() {
        Ok(path)
    } else {
        Err((
            key,
            format!(
                "`{}` is not an absolute path; pmxcfs is mounted at /etc/pve (default `{default}`)",
                path.display()
            ),
        ))
    }
}

/// Whether `path` is where pmxcfs is mounted (`/etc/pve` or below): only there do other
/// nodes see what this agent writes.
pub fn is_under_etc_pve(path: &Path) -> bool {
    path.starts_with("/etc/pve")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PmxcfsConfig, (&'static str, String)> {
        toml::from_str::<RawPmxcfs>(text).unwrap().validate()
    }

    #[test]
    fn an_empty_pmxcfs_table_publishes_to_etc_pve_every_thirty_seconds() {
        let config = parse("").unwrap();
        assert_eq!(config.dir, PathBuf::from("/etc/pve/proxops"));
        assert_eq!(config.lock_dir, PathBuf::from("/etc/pve/priv/lock"));
        assert!(config.publish);
        assert_eq!(config.heartbeat, Duration::from_secs(30));
        assert_eq!(
            config.status_file("pve2"),
            PathBuf::from("/etc/pve/proxops/status/pve2.json")
        );
        assert!(is_under_etc_pve(&config.dir));
    }

    #[test]
    fn a_relative_dir_or_a_bad_heartbeat_is_refused_naming_the_key() {
        let (key, message) = parse("dir = \"proxops\"").unwrap_err();
        assert_eq!(key, "pmxcfs.dir");
        assert!(message.contains("not an absolute path"), "{message}");
        let (key, message) = parse("heartbeat = \"often\"").unwrap_err();
        assert_eq!(key, "pmxcfs.heartbeat");
        assert!(message.contains("`often`"), "{message}");
        let (key, message) = parse("heartbeat = \"10ms\"").unwrap_err();
        assert_eq!(key, "pmxcfs.heartbeat");
        assert!(message.contains("between 1s and 1h"), "{message}");
    }

    #[test]
    fn publish_can_be_turned_off_while_the_view_and_locks_stay_on() {
        let config = parse("publish = false\nheartbeat = \"1s\"").unwrap();
        assert!(!config.publish);
        assert_eq!(config.heartbeat, Duration::from_secs(1));
    }

    #[test]
    fn an_unknown_key_is_a_toml_error() {
        assert!(toml::from_str::<RawPmxcfs>("dirr = \"/x\"").is_err());
    }
}
