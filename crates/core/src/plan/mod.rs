//! The plan: `plan(desired, observed, policy) -> Plan`, pure and deterministic.
//!
//! A Plan is a list of levels of actions (level 0 holds downloads) plus findings. Actions
//! say what to do, where and why; findings change nothing and are only reported. The
//! executor (in the binary) runs the plan and never decides anything itself.

mod artifacts;
pub mod render;

use std::collections::BTreeSet;

use serde::Serialize;

use crate::observed::ObservedState;
use crate::repository::DesiredState;
use crate::resource::ResourceId;

/// What a pass would do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Actions by dependency level; within a level, ordered by (kind rank, id, node).
    pub levels: Vec<Vec<Action>>,
    /// Observations that change nothing (drift under `report`, unreadable listings, …).
    pub findings: Vec<Finding>,
    /// (resource, node) pairs not planned because something they depend on could not be
    /// observed or will not be ready on that node this pass.
    pub blocked: BTreeSet<(ResourceId, String)>,
}

impl Plan {
    /// All actions, level by level.
    pub fn actions(&self) -> impl Iterator<Item = &Action> {
        self.levels.iter().flatten()
    }

    /// True when the plan would not change anything on PVE.
    pub fn has_changes(&self) -> bool {
        self.actions().next().is_some()
    }
}

/// One change to make on one node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Action {
    /// The resource it serves.
    pub resource: ResourceId,
    /// The node it runs on.
    pub node: String,
    /// What to do.
    pub verb: Verb,
    /// Why, in words an operator reads in the plan.
    pub reason: String,
}

/// What an action does.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "verb", rename_all = "kebab-case")]
pub enum Verb {
    /// `POST /nodes/{node}/storage/{storage}/download-url`, then wait for the task.
    Download(Download),
}

impl Verb {
    /// The verb's name as shown in plans (`download`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Verb::Download(_) => "download",
        }
    }
}

/// A file PVE should fetch onto a storage.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Download {
    /// Storage id.
    pub storage: String,
    /// PVE content type: `iso`, `vztmpl` or `import`.
    pub content: String,
    /// On-storage file name.
    pub filename: String,
    /// The URL PVE fetches.
    pub url: String,
    /// Sent as `checksum` + `checksum-algorithm` when set.
    pub checksum: Option<Checksum>,
    /// The volume id the file will have (`local:iso/x.iso`).
    pub volid: String,
}

/// An expected checksum.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Checksum {
    /// `md5`, `sha1`, `sha224`, `sha256`, `sha384` or `sha512`.
    pub algorithm: String,
    /// Lowercase hex.
    pub value: String,
}

/// Something worth reporting that the plan does not change.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Finding {
    /// The resource concerned.
    pub resource: ResourceId,
    /// The node concerned.
    pub node: String,
    /// What kind of finding.
    pub kind: FindingKind,
    /// The field concerned (empty when the whole resource is).
    pub field: String,
    /// What git declares, when relevant.
    pub desired: String,
    /// What PVE reports, when relevant.
    pub observed: String,
    /// Why it matters and what happens next.
    pub message: String,
}

/// The kinds of finding (DESIGN.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    /// PVE could not be read for this resource on this node; nothing is changed there.
    ObserveFailed,
}

impl FindingKind {
    /// The kind's name as shown in plans.
    pub fn name(self) -> &'static str {
        match self {
            FindingKind::ObserveFailed => "observe-failed",
        }
    }
}

/// Which nodes a pass plans for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeScope {
    /// Only resources placed on this node.
    Node(String),
    /// The whole cluster.
    All,
}

impl NodeScope {
    /// Whether `node` is in scope.
    pub fn includes(&self, node: &str) -> bool {
        match self {
            NodeScope::Node(own) => own == node,
            NodeScope::All => true,
        }
    }
}

/// What the planner may plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The nodes planned.
    pub scope: NodeScope,
}

/// Computes the plan for one desired state against what PVE reported.
///
/// Pure and deterministic: the same inputs give a byte-identical plan.
pub fn plan(desired: &DesiredState, observed: &ObservedState, policy: &Policy) -> Plan {
    let mut plan = Plan::default();
    let mut level0 = Vec::new();
    artifacts::plan_artifacts(desired, observed, policy, &mut level0, &mut plan);
    level0.sort();
    if !level0.is_empty() {
        plan.levels.push(level0);
    }
    plan.findings.sort();
    plan
}
