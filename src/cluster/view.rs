//! The cluster view: every node PVE lists in `/cluster/status` with the status file its agent
//! published, as `/api/v1/cluster`, the UI's cluster page and `proxops status --cluster`
//! show it. A node is `ok`, `stale` (its heartbeat is older than three of its heartbeat
//! intervals), or `missing` (PVE lists it, it has no file). The whole view is `unknown`
//! when the files cannot be trusted: the directory cannot be read, `/etc/pve` takes no
//! writes (no quorum: the files are frozen at what this node last received), PVE says the
//! cluster is not quorate, or this node's own publish was refused for lack of quorum.
//!
//! [`ClusterView::build`] is pure; [`read_files`] and [`members`] do the IO.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use proxops_pve::PveClient;
use serde::{Deserialize, Serialize};

use super::status_file::NodeStatus;
use crate::error_chain::error_text;
use crate::timefmt::rfc3339;

/// A node is stale when its heartbeat is older than this many intervals.
pub const STALE_AFTER_INTERVALS: u32 = 3;

/// The whole cluster as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// `ok` or `unknown` (see `reason`).
    pub state: String,
    /// Why the view is `unknown`, when it is.
    pub reason: Option<String>,
    /// RFC 3339: when the view was made.
    pub generated_at: String,
    /// PVE's `quorate` of `/cluster/status`, when PVE was asked.
    pub quorate: Option<bool>,
    /// Why PVE's member list is not in the view, when it is not.
    pub members_error: Option<String>,
    /// Every node, by name.
    pub nodes: Vec<NodeView>,
}

/// One node of the view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    /// The node.
    pub node: String,
    /// `ok`, `stale`, `missing`, or `unreadable` (the file is not a status document).
    pub state: String,
    /// PVE lists it in `/cluster/status`.
    pub member: bool,
    /// PVE's `online` for it, when listed.
    pub online: Option<bool>,
    /// Seconds since its heartbeat.
    pub heartbeat_age_secs: Option<u64>,
    /// The document it published.
    pub status: Option<NodeStatus>,
    /// Why its file could not be read, if it could not.
    pub error: Option<String>,
}

/// One node of `/cluster/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// `name`.
    pub name: String,
    /// `online`.
    pub online: bool,
}

/// PVE's answer to `/cluster/status`: its members and `quorate`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Members {
    /// The `node` entries.
    pub nodes: Vec<Member>,
    /// The `cluster` entry's `quorate` (a standalone node has no such entry).
    pub quorate: Option<bool>,
}

/// What the view is made from.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// `/cluster/status`, or why it could not be read; `None` when PVE was not asked.
    pub members: Option<Result<Members, String>>,
    /// The files under `<dir>/status`, by node, or why the directory could not be read.
    pub files: Result<BTreeMap<String, Result<NodeStatus, String>>, String>,
    /// Why `/etc/pve` takes no writes, if it does not.
    pub read_only: Option<String>,
    /// The reader's heartbeat, for files that do not say theirs.
    pub heartbeat: Duration,
}

impl Default for Inputs {
    fn default() -> Self {
        Self {
            members: None,
            files: Ok(BTreeMap::new()),
            read_only: None,
            heartbeat: Duration::from_secs(30),
        }
    }
}

impl Default for ClusterView {
    fn default() -> Self {
        Self {
            state: "unknown".to_owned(),
            reason: None,
            generated_at: String::new(),
            quorate: None,
            members_error: None,
            nodes: Vec::new(),
        }
    }
}

impl ClusterView {
    /// The view of `inputs` at `now`.
    pub fn build(inputs: Inputs, now: SystemTime) -> Self {
        let (members, members_error, quorate) = match inputs.members {
            Some(Ok(m)) => (Some(m.nodes), None, m.quorate),
            Some(Err(e)) => (None, Some(e), None),
            None => (None, None, None),
        };
        let (files, files_error) = match inputs.files {
            Ok(files) => (files, None),
            Err(e) => (BTreeMap::new(), Some(e)),
        };
        let reason = files_error.or(inputs.read_only).or_else(|| {
            (quorate == Some(false)).then(|| "PVE reports the cluster is not quorate".to_owned())
        });
        let mut names: Vec<String> = files.keys().cloned().collect();
        for m in members.iter().flatten() {
            if !names.contains(&m.name) {
                names.push(m.name.clone());
            }
        }
        names.sort();
        let nodes = names
            .into_iter()
            .map(|node| {
                let member = members
                    .as_ref()
                    .and_then(|ms| ms.iter().find(|m| m.name == node));
                let mut view = NodeView {
                    member: member.is_some(),
                    online: member.map(|m| m.online),
                    node: node.clone(),
                    state: "missing".to_owned(),
                    heartbeat_age_secs: None,
                    status: None,
                    error: None,
                };
                match files.get(&node) {
                    None => {}
                    Some(Err(e)) => {
                        "unreadable".clone_into(&mut view.state);
                        view.error = Some(e.clone());
                    }
                    Some(Ok(doc)) => {
                        let age = heartbeat_age(&doc.heartbeat_at, now);
                        let interval = match doc.heartbeat_secs {
                            0 => inputs.heartbeat,
                            secs => Duration::from_secs(secs),
                        };
                        let stale = age.is_none_or(|age| age > interval * STALE_AFTER_INTERVALS);
                        view.state = if stale { "stale" } else { "ok" }.to_owned();
                        view.heartbeat_age_secs = age.map(|a| a.as_secs());
                        view.status = Some(doc.clone());
                    }
                }
                view
            })
            .collect();
        Self {
            state: if reason.is_some() { "unknown" } else { "ok" }.to_owned(),
            reason,
            generated_at: rfc3339(now),
            quorate,
            members_error,
            nodes,
        }
    }
}

/// The view now: the files under `config.dir`, `/cluster/status` from `pve` when given,
/// and whether `/etc/pve` takes writes (its mount and modes, and `refused`: why this agent's
/// last publish was refused for lack of quorum, if it was).
pub async fn gather(
    config: &super::config::PmxcfsConfig,
    pve: Option<&PveClient>,
    refused: Option<String>,
) -> ClusterView {
    let members = match pve {
        Some(pve) => Some(members(pve).await),
        None => None,
    };
    let status_dir = config.status_dir();
    let dir = config.dir.clone();
    let (files, read_only) = tokio::task::spawn_blocking(move || {
        (read_files(&status_dir), super::fs::read_only_reason(&dir))
    })
    .await
    .unwrap_or_else(|e| (Err(format!("reading the status files: {e}")), None));
    let read_only =
        read_only.or_else(|| refused.map(|e| format!("this node's status file was refused: {e}")));
    ClusterView::build(
        Inputs {
            members,
            files,
            read_only,
            heartbeat: config.heartbeat,
        },
        SystemTime::now(),
    )
}

impl ClusterView {
    /// The view for people: one line for the cluster, then one row per node.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut out = match &self.reason {
            Some(reason) => format!("cluster view unknown: {reason}\n"),
            None => "cluster view ok\n".to_owned(),
        };
        if let Some(error) = &self.members_error {
            let _ = writeln!(out, "PVE's member list not shown: {error}");
        }
        let rows: Vec<[String; 7]> = self
            .nodes
            .iter()
            .map(|n| {
                let s = n.status.as_ref();
                let commit = |c: Option<&String>| {
                    c.map_or_else(|| "-".to_owned(), |c| c.get(..7).unwrap_or(c).to_owned())
                };
                let mut flags = Vec::new();
                if let Some(s) = s {
                    for (on, word) in [
                        (s.frozen, "frozen"),
                        (s.read_only, "read-only"),
                        (s.stale, "git-stale"),
                    ] {
                        if on {
                            flags.push(word);
                        }
                    }
                }
                if !n.member {
                    flags.push("not-in-cluster-status");
                }
                [
                    n.node.clone(),
                    n.state.clone(),
                    commit(s.and_then(|s| s.applied_revision.as_ref())),
                    commit(s.and_then(|s| s.attempted_revision.as_ref())),
                    s.and_then(|s| s.outcome.clone())
                        .unwrap_or_else(|| "-".to_owned()),
                    n.heartbeat_age_secs
                        .map_or_else(|| "-".to_owned(), |a| format!("{a}s")),
                    if flags.is_empty() {
                        "-".to_owned()
                    } else {
                        flags.join(",")
                    },
                ]
            })
            .collect();
        let header = [
            "NODE",
            "STATE",
            "APPLIED",
            "ATTEMPTED",
            "OUTCOME",
            "HEARTBEAT",
            "FLAGS",
        ]
        .map(str::to_owned);
        let mut widths = header.clone().map(|h| h.len());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in std::iter::once(&header).chain(&rows) {
            let line: Vec<String> = row
                .iter()
                .zip(widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            let _ = writeln!(out, "{}", line.join("  ").trim_end());
        }
        out
    }
}

fn heartbeat_age(at: &str, now: SystemTime) -> Option<Duration> {
    let at: SystemTime = chrono::DateTime::parse_from_rfc3339(at).ok()?.into();
    // Clocks of cluster nodes are kept in step (corosync needs it); a heartbeat from a
    // little in the future is fresh.
    Some(now.duration_since(at).unwrap_or_default())
}

/// The status files under `<dir>/status`: `<node>.json` only (temporary files are skipped).
///
/// # Errors
/// The directory exists but cannot be read. A missing directory is no file yet.
pub fn read_files(
    status_dir: &Path,
) -> Result<BTreeMap<String, Result<NodeStatus, String>>, String> {
    let entries = match std::fs::read_dir(status_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(format!("reading {}: {e}", status_dir.display())),
    };
    let mut files = BTreeMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(node) = name.strip_suffix(".json") else {
            continue;
        };
        let read = std::fs::read(entry.path())
            .map_err(|e| format!("reading {}: {e}", entry.path().display()))
            .and_then(|bytes| {
                NodeStatus::decode(&bytes).ok_or_else(|| {
                    format!(
                        "{} is not a ProxOps status document",
                        entry.path().display()
                    )
                })
            });
        files.insert(node.to_owned(), read);
    }
    Ok(files)
}

/// `/cluster/status` from PVE.
///
/// # Errors
/// PVE could not be asked, or answered something else than a list.
pub async fn members(pve: &PveClient) -> Result<Members, String> {
    let answer = pve
        .execute(&proxops_pve::request::cluster_status())
        .await
        .map_err(|e| format!("GET /cluster/status: {}", error_text(&e)))?;
    parse_members(&answer)
}

fn parse_members(answer: &serde_json::Value) -> Result<Members, String> {
    let entries = answer
        .as_array()
        .ok_or_else(|| "GET /cluster/status: not a list".to_owned())?;
    let flag = |v: &serde_json::Value| match v {
        serde_json::Value::Bool(b) => Some(*b),
        serde_json::Value::Number(n) => n.as_u64().map(|n| n != 0),
        serde_json::Value::String(s) => Some(s == "1"),
        _ => None,
    };
    let mut members = Members::default();
    for entry in entries {
        match entry.get("type").and_then(|t| t.as_str()) {
            Some("cluster") => members.quorate = entry.get("quorate").and_then(flag),
            Some("node") => {
                if let Some(name) = entry.get("name").and_then(|n| n.as_str()) {
                    members.nodes.push(Member {
                        name: name.to_owned(),
                        online: entry.get("online").and_then(flag).unwrap_or(false),
                    });
                }
            }
            _ => {}
        }
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(node: &str, at: SystemTime) -> NodeStatus {
        NodeStatus {
            format: 1,
            node: node.into(),
            heartbeat_at: rfc3339(at),
            heartbeat_secs: 1,
            applied_revision: Some("c0ffee".into()),
            ..NodeStatus::default()
        }
    }

    fn members(names: &[&str]) -> Members {
        Members {
            nodes: names
                .iter()
                .map(|n| Member {
                    name: (*n).into(),
                    online: true,
                })
                .collect(),
            quorate: Some(true),
        }
    }

    #[test]
    fn a_node_is_stale_after_three_heartbeats_and_missing_without_a_file() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let files = BTreeMap::from([
            (
                "pve1".to_owned(),
                Ok(doc("pve1", now - Duration::from_secs(2))),
            ),
            (
                "pve2".to_owned(),
                Ok(doc("pve2", now - Duration::from_secs(4))),
            ),
        ]);
        let view = ClusterView::build(
            Inputs {
                members: Some(Ok(members(&["pve1", "pve2", "pve3"]))),
                files: Ok(files),
                read_only: None,
                heartbeat: Duration::from_secs(30),
            },
            now,
        );
        assert_eq!(view.state, "ok");
        let states: Vec<_> = view
            .nodes
            .iter()
            .map(|n| (n.node.as_str(), n.state.as_str()))
            .collect();
        assert_eq!(
            states,
            [("pve1", "ok"), ("pve2", "stale"), ("pve3", "missing")]
        );
        assert_eq!(view.nodes[1].heartbeat_age_secs, Some(4));
    }

    #[test]
    fn the_view_is_unknown_without_quorum_or_when_the_directory_cannot_be_read() {
        let now = SystemTime::now();
        let read_only = ClusterView::build(
            Inputs {
                files: Ok(BTreeMap::new()),
                read_only: Some("/etc/pve is mounted read-only".into()),
                ..Inputs::default()
            },
            now,
        );
        assert_eq!(read_only.state, "unknown");
        assert_eq!(
            read_only.reason.as_deref(),
            Some("/etc/pve is mounted read-only")
        );
        let mut not_quorate = members(&["pve1"]);
        not_quorate.quorate = Some(false);
        let view = ClusterView::build(
            Inputs {
                members: Some(Ok(not_quorate)),
                files: Ok(BTreeMap::new()),
                ..Inputs::default()
            },
            now,
        );
        assert_eq!(view.state, "unknown");
        let unreadable = ClusterView::build(
            Inputs {
                files: Err("reading /etc/pve/proxops/status: permission denied".into()),
                ..Inputs::default()
            },
            now,
        );
        assert_eq!(unreadable.state, "unknown");
    }

    #[test]
    fn cluster_status_members_and_quorum_are_read_from_pves_shape() {
        let answer = serde_json::json!([
            {"id": "cluster", "type": "cluster", "name": "lab", "nodes": 2, "quorate": 1, "version": 3},
            {"id": "node/pve1", "type": "node", "name": "pve1", "nodeid": 1, "online": 1, "local": 1},
            {"id": "node/pve2", "type": "node", "name": "pve2", "nodeid": 2, "online": 0, "local": 0}
        ]);
        let m = parse_members(&answer).unwrap();
        assert_eq!(m.quorate, Some(true));
        assert_eq!(
            m.nodes,
            [
                Member {
                    name: "pve1".into(),
                    online: true
                },
                Member {
                    name: "pve2".into(),
                    online: false
                }
            ]
        );
    }

    #[test]
    fn only_json_files_are_status_files_and_a_broken_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("pve1.json"),
            doc("pve1", SystemTime::now()).encode(),
        )
        .unwrap();
        std::fs::write(dir.path().join("pve2.json"), b"{not json").unwrap();
        std::fs::write(dir.path().join("pve1.json.tmp.42"), b"half").unwrap();
        let files = read_files(dir.path()).unwrap();
        assert_eq!(files.keys().collect::<Vec<_>>(), ["pve1", "pve2"]);
        assert!(files["pve1"].is_ok());
        assert!(
            files["pve2"]
                .as_ref()
                .unwrap_err()
                .contains("pve2.json is not a ProxOps status document")
        );
        assert!(read_files(&dir.path().join("none")).unwrap().is_empty());
    }
}
