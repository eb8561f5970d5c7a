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

use crate::http::StatusJson;

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
    pub rollout: Option<crate::agent::rollout::RolloutView>,
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
    /// The document for `node` from its status (as `/api/v1/status` shows it) and the
    /// failed actions of its last pass.
    pub fn from_status(
        status: &StatusJson,
        cluster: Option<&str>,
        heartbeat_secs: u64,
        heartbeat_at: String,
        failed: Vec<String>,
    ) -> Self {
        let last = status.last_attempted.as_ref();
        Self {
            format: FORMAT,
            node: status.node.clone(),
            cluster: cluster.map(str::to_owned),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            heartbeat_at,
            heartbeat_secs,
            applied_revision: status.last_applied.as_ref().and_then(|p| p.commit.clone()),
            attempted_revision: last.and_then(|p| p.commit.clone()),
            outcome: last.and_then(|p| p.outcome.clone()),
            pass_id: last.map(|p| p.id),
            counts: last.map_or_else(Counts::default, |p| Counts {
                ok: p.actions_ok,
                failed: p.actions_failed,
                skipped: p.actions_skipped,
                findings: p.findings,
            }),
            open_findings: status.open_findings,
            failed,
            truncated: false,
            read_only: status.read_only,
            frozen: status.writes.frozen.is_some(),
            stale: status.desired_stale,
            held: status.writes.held.clone(),
            next_write_allowed: status.writes.next_allowed.clone(),
            rollout: status.rollout.clone(),
        }
    }

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
