//! The per-node status document `<dir>/status/<node>.json` that every agent publishes in
//! the replicated `/etc/pve` and every node reads for the cluster view (and, in rollout
//! waves, to decide whether an earlier wave has applied and baked a commit).
//!
//! Small by construction: pmxcfs keeps every file in RAM on every node and refuses writes
//! past 1 MiB per file (pve-cluster 7091d92 `src/pmxcfs/memdb.h` `MEMDB_MAX_FILE_SIZE`,
//! checked in `src/pmxcfs/memdb.c` `memdb_pwrite`: `EFBIG`), and the whole database is replicated, so a
//! document stays below [`MAX_BYTES`]: lists are cut and strings shortened, never an error.
//! Readers are forward compatible (`#[serde(default)]`, unknown fields ignored), so agents
//! of different versions can share a cluster. Nothing here touches the filesystem.

use serde::{Deserialize, Serialize};

/// The document's `format`; a reader shows a newer format's known fields.
pub const FORMAT: u32 = 1;
/// Upper bound of one encoded document: far below pmxcfs's 1 MiB file limit and the 64 KiB
/// the issue asks to stay under.
pub const MAX_BYTES: usize = 16 * 1024;
/// At most this many failed actions are listed.
pub const MAX_FAILED: usize = 20;
/// Longest string kept in a list entry or in `held`.
pub const MAX_TEXT: usize = 240;

/// One node's status as published.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeStatus {
    /// [`FORMAT`].
    pub format: u32,
    /// The node this agent speaks for.
    pub node: String,
    /// The composition cluster followed (top-level `cluster`), if any.
    pub cluster: Option<String>,
    /// The agent's version (`CARGO_PKG_VERSION`).
    pub agent_version: String,
    /// RFC 3339: when this document was written.
    pub heartbeat_at: String,
    /// The writer's `[pmxcfs] heartbeat` in seconds: a reader shows the file stale when it
    /// is older than three of these.
    pub heartbeat_secs: u64,
    /// The commit of the last pass that applied everything.
    pub applied_revision: Option<String>,
    /// The commit of the last pass.
    pub attempted_revision: Option<String>,
    /// The last pass's outcome (`applied`, `no-change`, `failed`, `invalid`, `interrupted`).
    pub outcome: Option<String>,
    /// The last pass's id in this node's store.
    pub pass_id: Option<i64>,
    /// The last pass's action and finding counts.
    pub counts: Counts,
    /// Findings open on this node.
    pub open_findings: usize,
    /// The last pass's failed actions, one line each (at most [`MAX_FAILED`]).
    pub failed: Vec<String>,
    /// Whether lists or strings were cut to keep the document small.
    pub truncated: bool,
    /// The write circuit breaker holds writes back.
    pub read_only: bool,
    /// An operator froze writes (`proxops freeze`).
    pub frozen: bool,
    /// Git could not be fetched; the agent enforces the last good revision.
    pub stale: bool,
    /// Why writes are held (freeze, window), if they are.
    pub held: Option<String>,
    /// RFC 3339: when writes are allowed again, when held and known.
    pub next_write_allowed: Option<String>,
    /// `[rollout]`: this node's wave, decision and health on its applied revision (issue 22,
    /// item 4); read by the later waves.
    pub rollout: Option<RolloutView>,
}

/// What `/api/v1/status` shows of the rollout, and what the status file publishes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RolloutView {
    /// This node's wave, 1-based.
    pub wave: usize,
    /// How many waves there are.
    pub waves: usize,
    /// The commit the last decision was about.
    pub commit: Option<String>,
    /// `proceed`, `wait` or `halt`.
    pub decision: Option<String>,
    /// Why writes are held by the rollout, when they are.
    pub held: Option<String>,
    /// RFC 3339: when waiting ends at the latest, when known.
    pub until: Option<String>,
    /// The halt: the wave and node that failed, and what failed.
    pub halted: Option<String>,
    /// Earlier-wave nodes skipped for this commit, one sentence each.
    pub skipped: Vec<String>,
    /// RFC 3339: when the commit was first seen in the cluster.
    pub first_seen: Option<String>,
    /// RFC 3339 with milliseconds: when the rollout first let this node write `commit`.
    pub proceeded_at: Option<String>,
    /// The revision [`RolloutView::healthy_since`] and [`RolloutView::unhealthy`] are about.
    pub health_revision: Option<String>,
    /// RFC 3339: since when this node has been healthy on `health_revision`.
    pub healthy_since: Option<String>,
    /// Why this node is not healthy on `health_revision`.
    pub unhealthy: Option<String>,
    /// The revision of the last finished pass that had failed actions, until a pass applies
    /// it (the status's own counts are those of a pass still running, while one runs).
    pub failed_revision: Option<String>,
    /// How many actions failed in that pass.
    pub failed_actions: u32,
}

/// The last pass's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counts {
    /// Actions that succeeded.
    pub ok: u32,
    /// Actions that failed.
    pub failed: u32,
    /// Actions skipped.
    pub skipped: u32,
    /// Findings.
    pub findings: u32,
}

impl NodeStatus {
    /// The JSON document, cut to at most [`MAX_BYTES`]: long strings are shortened to
    /// [`MAX_TEXT`] and the failed list to [`MAX_FAILED`] entries, then emptied if still too
    /// big; `truncated` says so. Never fails on content.
    pub fn encode(&self) -> Vec<u8> {
        let mut doc = self.clone();
        let before = (doc.failed.len(), doc.held.clone());
        doc.failed.truncate(MAX_FAILED);
        for line in &mut doc.failed {
            shorten(line);
        }
        if let Some(held) = &mut doc.held {
            shorten(held);
        }
        doc.truncated |= before != (doc.failed.len(), doc.held.clone())
            || self.failed.iter().any(|l| l.chars().count() > MAX_TEXT);
        let mut bytes = to_json(&doc);
        while bytes.len() > MAX_BYTES && !doc.failed.is_empty() {
            doc.failed.pop();
            doc.truncated = true;
            bytes = to_json(&doc);
        }
        bytes
    }

    /// Reads a document; `None` when it is not JSON of this shape.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

fn to_json(doc: &NodeStatus) -> Vec<u8> {
    // Plain data of strings and numbers: serialising cannot fail.
    let mut bytes = serde_json::to_vec_pretty(doc).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

fn shorten(text: &mut String) {
    if text.chars().count() > MAX_TEXT {
        let cut: String = text.chars().take(MAX_TEXT - 1).collect();
        *text = format!("{cut}…");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> NodeStatus {
        NodeStatus {
            format: FORMAT,
            node: "pve2".into(),
            heartbeat_at: "2026-12-01T15:00:00Z".into(),
            heartbeat_secs: 30,
            applied_revision: Some("a".repeat(40)),
            ..NodeStatus::default()
        }
    }

    #[test]
    fn a_status_document_round_trips_and_ignores_fields_it_does_not_know() {
        let doc = status();
        assert_eq!(NodeStatus::decode(&doc.encode()), Some(doc));
        let newer =
            br#"{"format": 2, "node": "pve3", "rollout": {"wave": 1}, "counts": {"ok": 2}}"#;
        let read = NodeStatus::decode(newer).unwrap();
        assert_eq!(read.node, "pve3");
        assert_eq!(read.counts.ok, 2);
        assert_eq!(read.applied_revision, None);
    }

    #[test]
    fn a_huge_failure_list_is_cut_to_stay_small_and_says_so() {
        let mut doc = status();
        doc.failed = (0..5000)
            .map(|i| format!("vm/web{i} on pve2: {}", "x".repeat(900)))
            .collect();
        doc.held = Some("y".repeat(10_000));
        let bytes = doc.encode();
        assert!(bytes.len() <= MAX_BYTES, "{} bytes", bytes.len());
        let read = NodeStatus::decode(&bytes).unwrap();
        assert!(read.truncated);
        assert!(read.failed.len() <= MAX_FAILED);
        assert!(read.failed[0].starts_with("vm/web0 on pve2: xxx"));
        assert_eq!(read.held.unwrap().chars().count(), MAX_TEXT);
    }

    #[test]
    fn a_small_document_is_not_marked_truncated() {
        let mut doc = status();
        doc.failed = vec!["vm/web on pve2: refused".into()];
        assert!(!NodeStatus::decode(&doc.encode()).unwrap().truncated);
    }
}
