//! The plan: `plan(desired, observed, inventory, policy) -> Plan`, pure and deterministic.
//!
//! A Plan is a list of levels of actions (level 0 holds downloads, later levels the guests at
//! their dependency level, prunes in a last level of their own) plus findings. Actions say
//! what to do, where and why; findings change nothing and are only reported. The executor
//! (in the binary) runs the plan and never decides anything itself: the one thing it cannot
//! know at plan time, the config write after a full clone, it asks [`clone_update`] for.

mod artifacts;
pub mod digest;
mod guests;
pub mod render;
pub mod risk;
pub mod snapshot_policy;
mod snippets;

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::guest::GuestType;
use crate::observed::ObservedState;
use crate::repository::DesiredState;
use crate::resource::ResourceId;

pub use guests::{Creation, clone_update};

/// What a pass would do. Serialized with a `risk` summary ([`risk`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Actions by dependency level; within a level, ordered by (kind rank, id, node).
    pub levels: Vec<Vec<Action>>,
    /// Observations that change nothing (drift under `report`, unreadable listings, …).
    pub findings: Vec<Finding>,
    /// (resource, node) pairs not planned because something they depend on could not be
    /// observed or will not be ready on that node this pass.
    pub blocked: BTreeSet<(ResourceId, String)>,
    /// Why nothing at all is written this pass (the guest listing failed), when so.
    pub aborted: Option<String>,
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

/// One change to make on one node. Serialized with its `risk` ([`risk::risk`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
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

/// What an action does. The order of the variants is the order in which the actions of one
/// guest run (create before start, update before reboot, shutdown before delete).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "verb", rename_all = "kebab-case")]
pub enum Verb {
    /// `POST /nodes/{node}/storage/{storage}/download-url`, then wait for the task.
    Download(Download),
    /// Write a cloud-init snippet into a storage's `snippets/` directory on the node (the
    /// agent writes the file itself: PVE's API cannot upload snippets). Before the guest's
    /// other actions, which may set a `cicustom` naming it.
    WriteSnippet(Snippet),
    /// `POST /nodes/{node}/qemu|lxc` (stopped), wait, then grow imported disks.
    Create(Create),
    /// `POST /nodes/{node}/qemu/{source}/clone` (full), wait, then write the VM's own config.
    Clone(CloneFrom),
    /// `PUT .../config` with only the changed keys, `delete=` and the observed `digest`.
    Update(Update),
    /// `PUT /pools` `poolid`, `vms`, `allow-move=1`: put the guest in its declared pool.
    Pool(PoolMove),
    /// `POST .../status/shutdown`, wait.
    Shutdown(GuestRef),
    /// `POST .../template`: mark a (stopped) guest as a template.
    Promote(GuestRef),
    /// `POST .../status/start`, wait.
    Start(GuestRef),
    /// `POST .../status/reboot`, wait: applies pending changes.
    Reboot(GuestRef),
    /// `DELETE /nodes/{node}/qemu|lxc/{vmid}` (a prune), wait.
    Delete(GuestRef),
    /// Remove a ProxOps snippet no guest's `cicustom` names any more, after the grace period
    /// (in the last level, after every `cicustom` of the pass was written).
    RemoveSnippet(Snippet),
}

impl Verb {
    /// The verb's name as shown in plans (`download`, `create`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Verb::Download(_) => "download",
            Verb::WriteSnippet(_) => "write-snippet",
            Verb::RemoveSnippet(_) => "remove-snippet",
            Verb::Create(_) => "create",
            Verb::Clone(_) => "clone",
            Verb::Update(_) => "update",
            Verb::Pool(_) => "pool",
            Verb::Shutdown(_) => "shutdown",
            Verb::Promote(_) => "promote",
            Verb::Start(_) => "start",
            Verb::Reboot(_) => "reboot",
            Verb::Delete(_) => "delete",
        }
    }

    /// The guest an action acts on (`None` for downloads).
    pub fn guest(&self) -> Option<GuestRef> {
        match self {
            Verb::Download(_) | Verb::WriteSnippet(_) | Verb::RemoveSnippet(_) => None,
            Verb::Create(c) => Some(GuestRef {
                vmid: c.vmid,
                guest_type: c.guest_type,
            }),
            Verb::Clone(c) => Some(GuestRef {
                vmid: c.vmid,
                guest_type: GuestType::Qemu,
            }),
            Verb::Update(u) => Some(GuestRef {
                vmid: u.vmid,
                guest_type: u.guest_type,
            }),
            Verb::Pool(p) => Some(GuestRef {
                vmid: p.vmid,
                guest_type: p.guest_type,
            }),
            Verb::Shutdown(g)
            | Verb::Promote(g)
            | Verb::Start(g)
            | Verb::Reboot(g)
            | Verb::Delete(g) => Some(*g),
        }
    }
}

/// A guest by its PVE identity on the action's node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct GuestRef {
    /// Its vmid.
    pub vmid: u32,
    /// qemu or lxc.
    pub guest_type: GuestType,
}

/// A guest to create.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Create {
    /// Its vmid.
    pub vmid: u32,
    /// qemu or lxc.
    pub guest_type: GuestType,
    /// The create parameters (without `vmid`), e.g. `memory`, `scsi0`, `tags`, `start=0`.
    pub params: BTreeMap<String, String>,
    /// Disks to grow after the create (an imported image smaller than declared).
    pub grow: Vec<Grow>,
    /// Keys written with `PUT .../config` once the create's task has ended: the `tags` of a
    /// guest created into a pool, which PVE would refuse at the create to a token that holds
    /// its privileges on the pool (see `plan_absent`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub after: BTreeMap<String, String>,
}

/// Grow a volume to an absolute size (`PUT .../resize`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Grow {
    /// The config key (`scsi0`, `rootfs`, `mp1`).
    pub slot: String,
    /// The size as PVE takes it (`32G`).
    pub size: String,
}

/// Moving a guest into its declared pool (`spec.pool`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PoolMove {
    /// The guest's vmid.
    pub vmid: u32,
    /// qemu or lxc.
    pub guest_type: GuestType,
    /// The pool it goes to.
    pub pool: String,
    /// The pool `/cluster/resources` reports it in (`None`: none the token may audit).
    pub from: Option<String>,
}

/// A full clone of a TemplateVM.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct CloneFrom {
    /// The new VM's vmid.
    pub vmid: u32,
    /// The TemplateVM (`metadata.name`).
    pub source: String,
    /// The template's vmid (clones from one source run one at a time).
    pub source_vmid: u32,
    /// The new VM's PVE `name`.
    pub name: String,
    /// `spec.pool`, sent as the clone's `pool` (`None`: not managed).
    pub pool: Option<String>,
}

/// A config write.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Update {
    /// The guest's vmid.
    pub vmid: u32,
    /// qemu or lxc.
    pub guest_type: GuestType,
    /// Keys to write, only the changed ones.
    pub set: BTreeMap<String, String>,
    /// Keys to delete; never also in `set`.
    pub delete: BTreeSet<String>,
    /// The digest of the config the change was computed from; PVE refuses the write when
    /// the config changed since (the next pass converges).
    pub digest: Option<String>,
    /// Volumes to grow after the write.
    pub grow: Vec<Grow>,
    /// What changes, for people: field, observed and desired values.
    pub changes: Vec<Change>,
    /// `cicustom` changes: after the write, regenerate the cloud-init drive
    /// (`PUT .../cloudinit`), so the guest sees the new snippets (a running one gets the new
    /// medium at once). Risk: the guest's cloud-init runs again with new data at its next
    /// boot; the safety net classes such an update `risky`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub regenerate_cloudinit: bool,
}

/// A cloud-init snippet file on one storage of the action's node. Names and hashes only:
/// a plan never holds a snippet's text (the executor takes it from the desired state).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Snippet {
    /// The storage.
    pub storage: String,
    /// The file name in its `snippets/` directory (`proxops-<guest>-<kind>-<hash>.yaml`).
    pub file: String,
    /// The SHA-256 of the text, lowercase hex (empty for a removal).
    pub sha256: String,
    /// The text holds SOPS values: written mode 0600, and shown as "content changed" only.
    pub secret: bool,
    /// The storage is shared: one file serves every node.
    pub shared: bool,
}

impl Snippet {
    /// `<storage>:snippets/<file>`.
    pub fn volid(&self) -> String {
        format!("{}:snippets/{}", self.storage, self.file)
    }
}

/// One field change of an update.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Change {
    /// The PVE key (or `scsi0.size`).
    pub field: String,
    /// What PVE has (empty when absent).
    pub observed: String,
    /// What the manifest wants (empty for a delete).
    pub desired: String,
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
    /// An owned value differs and is not corrected (`proxops/drift: report`).
    Drift,
    /// PVE holds changes pending until the running guest restarts.
    NeedsReboot,
    /// A create-only field differs; only a recreate would apply it (never done).
    RequiresRecreate,
    /// The declared vmid is held by a guest ProxOps does not own.
    UnmanagedVmid,
    /// A disk, NIC, mount point or PCI slot exists live and is not declared (never removed).
    LiveOnlySlot,
    /// A pool change, a shrink, or a write that would replace a live volume (never done).
    UnsafeVolumeChange,
    /// A live template where a VM or LXC is declared (PVE cannot untemplate).
    TemplateMismatch,
    /// The guest is on another node than declared (e.g. moved by HA); never a second guest.
    Moved,
    /// A guest ProxOps owns that no manifest declares any more (not deleted).
    Orphaned,
    /// A declared field ProxOps accepts but never sends to PVE (no PVE write form, e.g.
    /// `spec.cpu.flags`, `spec.options.nested-virt`): reported so it is not silently lost.
    NotSent,
    /// A VM's snippets cannot be written to the storage named (no `snippets` content, or not
    /// on the node): the guest is not planned until the storage is fixed.
    SnippetsStorage,
    /// An action the operator's `[scope]` does not allow (a prune of an owned guest outside
    /// `nodes` or `vmids`): never done.
    OutOfScope,
    /// A create or clone beyond `[scope] max_creates` this pass (or an action waiting for
    /// one): a later pass does it.
    Deferred,
    /// No snapshot was taken before a risky update (a volume's storage cannot snapshot, or
    /// the snapshot failed): the finding says which volume on which storage, and whether the
    /// update went on or was held (`[policy] snapshot_required`). Issue 19.
    SnapshotSkipped,
    /// The node is in PVE's HA maintenance mode: no write is sent to it until it leaves it
    /// (issue 19, item 6).
    HaMaintenance,
    /// PVE's HA status could not be read (e.g. no `Sys.Audit` on `/`): a node in HA
    /// maintenance would not be noticed; writes go on.
    HaStatusUnknown,
}

impl FindingKind {
    /// The kind's name as shown in plans.
    pub fn name(self) -> &'static str {
        match self {
            FindingKind::ObserveFailed => "observe-failed",
            FindingKind::Drift => "drift",
            FindingKind::NeedsReboot => "needs-reboot",
            FindingKind::RequiresRecreate => "requires-recreate",
            FindingKind::UnmanagedVmid => "unmanaged-vmid",
            FindingKind::LiveOnlySlot => "live-only-slot",
            FindingKind::UnsafeVolumeChange => "unsafe-volume-change",
            FindingKind::TemplateMismatch => "template-mismatch",
            FindingKind::Moved => "moved",
            FindingKind::Orphaned => "orphaned",
            FindingKind::NotSent => "not-sent",
            FindingKind::SnippetsStorage => "snippets-storage",
            FindingKind::OutOfScope => "out-of-scope",
            FindingKind::Deferred => "deferred",
            FindingKind::SnapshotSkipped => "snapshot-skipped",
            FindingKind::HaMaintenance => "ha-maintenance",
            FindingKind::HaStatusUnknown => "ha-status-unknown",
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

/// The default `max_prune` (DESIGN.md §3).
pub const DEFAULT_MAX_PRUNE: u32 = 3;

/// What the planner may plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The nodes planned.
    pub scope: NodeScope,
    /// Delete owned guests no manifest declares (otherwise they are `orphaned` findings).
    pub prune: bool,
    /// At most this many prunes per pass; the rest are deferred and reported.
    pub max_prune: u32,
    /// Restart a running guest to apply changes PVE left pending (otherwise `needs-reboot`).
    pub restart_on_change: bool,
    /// ProxOps snippet files no guest names whose `ctime` (epoch seconds, as PVE lists it) is
    /// before this are removed; `None` removes none (the grace period is the binary's: it
    /// passes `now - grace`).
    pub snippets_removable_before: Option<u64>,
}

impl Policy {
    /// The defaults for `scope`: no prune, `max_prune` 3, no restarts.
    pub fn new(scope: NodeScope) -> Self {
        Self {
            scope,
            prune: false,
            max_prune: DEFAULT_MAX_PRUNE,
            restart_on_change: false,
            snippets_removable_before: None,
        }
    }
}

/// The guests ProxOps owns: prune is `inventory − desired`, never `observed − desired`.
///
/// The agent passes what its store recorded; the CLI, which has no store, passes the guests
/// observed with the ownership tag ([`Inventory::from_tags`]). Either way a guest is only
/// pruned while it still carries the tag.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// (node, vmid) → the resource that declared it.
    pub guests: BTreeMap<(String, u32), ResourceId>,
    /// (node, vmid) → how ProxOps created the guest, where recorded (the agent's store):
    /// the create-only fields PVE does not keep (clone source, CT template, imported
    /// images), so a changed one can be reported as requires-recreate.
    pub created: BTreeMap<(String, u32), Creation>,
}

impl Inventory {
    /// An inventory from recorded (node, vmid, resource) entries.
    pub fn recorded(entries: impl IntoIterator<Item = (String, u32, ResourceId)>) -> Self {
        Self {
            guests: entries
                .into_iter()
                .map(|(node, vmid, id)| ((node, vmid), id))
                .collect(),
            created: BTreeMap::new(),
        }
    }

    /// The same inventory with how guests were created (node, vmid, creation).
    #[must_use]
    pub fn with_created(
        mut self,
        entries: impl IntoIterator<Item = (String, u32, Creation)>,
    ) -> Self {
        self.created = entries
            .into_iter()
            .map(|(node, vmid, creation)| ((node, vmid), creation))
            .collect();
        self
    }

    /// Every guest observed with the ownership tag, named by its PVE name (or `vmid-<id>`).
    pub fn from_tags(observed: &ObservedState) -> Self {
        let Ok(guests) = &observed.resources else {
            return Self::default();
        };
        Self::recorded(guests.values().filter(|g| g.is_owned()).map(|g| {
            let kind = guests::kind_of(g.guest_type, g.template);
            let name = g
                .name
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("vmid-{}", g.vmid));
            (g.node.clone(), g.vmid, ResourceId::new(kind, name))
        }))
    }
}

/// Computes the plan for one desired state against what PVE reported.
///
/// Pure and deterministic: the same inputs give a byte-identical plan. When the guest listing
/// could not be read, the plan holds no action at all, only findings that say why.
pub fn plan(
    desired: &DesiredState,
    observed: &ObservedState,
    inventory: &Inventory,
    policy: &Policy,
) -> Plan {
    let mut plan = Plan::default();
    if let Err(reason) = &observed.resources {
        guests::abort(desired, policy, reason, &mut plan);
        plan.findings.sort();
        return plan;
    }
    let mut levels: Vec<Vec<Action>> = vec![Vec::new(); desired.levels.len().max(1)];
    artifacts::plan_artifacts(desired, observed, policy, &mut levels[0], &mut plan);
    guests::plan_guests(desired, observed, inventory, policy, &mut levels, &mut plan);
    snippets::plan_writes(desired, observed, policy, &mut levels, &mut plan);
    let mut prunes = guests::plan_prune(desired, observed, inventory, policy, &mut plan);
    snippets::plan_removals(desired, observed, policy, &mut prunes);
    levels.push(prunes);
    for level in &mut levels {
        level.sort();
    }
    while levels.last().is_some_and(Vec::is_empty) {
        levels.pop();
    }
    plan.levels = levels;
    plan.findings.sort();
    plan.findings.dedup();
    plan
}
