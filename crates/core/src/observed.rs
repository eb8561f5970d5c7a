//! `ObservedState`: what PVE reported in one pass, as plain data (built by the binary's
//! `observe.rs`, the only place that maps PVE responses into core types).
//!
//! Fail closed: a listing that could not be read is kept as `Listing::Failed`, never as an
//! empty listing, so the planner can tell "absent" from "unknown". The same holds for guests:
//! a failed `/cluster/resources` listing is kept as `resources: Err(reason)` (the planner
//! then plans no write at all), and a config that could not be read as `Err(reason)` (that
//! guest is left alone and is never a prune candidate).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::guest::{GuestType, LiveConfig, OWNERSHIP_TAG, split_tags};

/// A PVE storage content type (`iso`, `vztmpl`, `import`, `images`, `rootdir`, …).
pub type ContentType = String;

/// What PVE reported, per node and storage, and the guests of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedState {
    /// Keyed by (node, storage id).
    pub storages: BTreeMap<(String, String), StorageObservation>,
    /// Every guest of `GET /cluster/resources?type=vm`, by vmid; `Err` with the reason when
    /// the listing failed (then nothing is written this pass).
    pub resources: Result<BTreeMap<u32, ObservedGuest>, String>,
    /// Declared vmids `/cluster/resources` did not list although a guest of the cluster has
    /// them (`GET /cluster/nextid?vmid=` answered `already exists`): the token lacks
    /// VM.Audit on them, and a create would be refused.
    pub hidden_vmids: BTreeSet<u32>,
}

impl Default for ObservedState {
    /// Nothing observed: no storages, and a readable, empty guest listing.
    fn default() -> Self {
        Self {
            storages: BTreeMap::new(),
            resources: Ok(BTreeMap::new()),
            hidden_vmids: BTreeSet::new(),
        }
    }
}

/// One guest as PVE reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedGuest {
    /// Its vmid.
    pub vmid: u32,
    /// The node it is on.
    pub node: String,
    /// qemu or lxc.
    pub guest_type: GuestType,
    /// `running`, `stopped` (or `unknown` until PVE's status daemon has published it).
    pub status: String,
    /// Whether it is a template.
    pub template: bool,
    /// Its tags, lowercased (split on `;`, `,` and spaces).
    pub tags: BTreeSet<String>,
    /// Its lock (`create`, `clone`, `backup`, ...), if any.
    pub lock: Option<String>,
    /// Its name, when PVE reported one.
    pub name: Option<String>,
    /// The resource pool `/cluster/resources` reports it in (absent when it is in none, or
    /// the caller lacks `Pool.Audit` on the pool).
    pub pool: Option<String>,
    /// `GET .../config` (pending values merged): `None` when not read, `Err` when it failed.
    pub config: Option<Result<LiveConfig, String>>,
    /// The keys with a pending change or delete (`GET .../pending`): `None` when not read.
    pub pending: Option<Result<BTreeSet<String>, String>>,
}

impl ObservedGuest {
    /// A guest from its `/cluster/resources` fields (config and pending not read yet).
    pub fn new(vmid: u32, node: &str, guest_type: GuestType, status: &str) -> Self {
        Self {
            vmid,
            node: node.to_owned(),
            guest_type,
            status: status.to_owned(),
            template: false,
            tags: BTreeSet::new(),
            lock: None,
            name: None,
            pool: None,
            config: None,
            pending: None,
        }
    }

    /// Sets the tags from PVE's `tags` value.
    #[must_use]
    pub fn with_tags(mut self, tags: &str) -> Self {
        self.tags = split_tags(tags).into_iter().collect();
        self
    }

    /// Whether the guest carries the ownership tag `proxops`.
    pub fn is_owned(&self) -> bool {
        self.tags.contains(OWNERSHIP_TAG)
    }

    /// Whether PVE reports it running.
    pub fn is_running(&self) -> bool {
        self.status == "running"
    }

    /// Whether PVE reports it stopped.
    pub fn is_stopped(&self) -> bool {
        self.status == "stopped"
    }

    /// The config, when it was read.
    pub fn live(&self) -> Option<&LiveConfig> {
        self.config.as_ref().and_then(|c| c.as_ref().ok())
    }
}

/// One storage as seen from one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageObservation {
    /// PVE reports the storage as shared (NFS, CephFS, …): one file serves every node.
    pub shared: bool,
    /// Content types the storage is configured for.
    pub content: BTreeSet<ContentType>,
    /// Listings read this pass, per content type.
    pub listings: BTreeMap<ContentType, Listing>,
    /// `ctime` (epoch seconds) of listed `snippets` volumes, by volid, as PVE lists them: how
    /// long an unreferenced ProxOps snippet has been left (its grace period).
    #[serde(default)]
    pub ctimes: BTreeMap<String, u64>,
}

/// The result of listing one (node, storage, content type).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Listing {
    /// The volids present (`local:iso/debian.iso`).
    Listed(BTreeSet<String>),
    /// The listing could not be read; the reason, already free of secrets.
    Failed(String),
}

impl ObservedState {
    /// Records a storage's configuration as seen from `node`.
    pub fn add_storage(
        &mut self,
        node: &str,
        storage: &str,
        shared: bool,
        content: impl IntoIterator<Item = String>,
    ) {
        let entry = self
            .storages
            .entry((node.to_owned(), storage.to_owned()))
            .or_default();
        entry.shared = shared;
        entry.content = content.into_iter().collect();
    }

    /// Records a listing of (node, storage, content type).
    pub fn add_listing(&mut self, node: &str, storage: &str, content: &str, listing: Listing) {
        self.storages
            .entry((node.to_owned(), storage.to_owned()))
            .or_default()
            .listings
            .insert(content.to_owned(), listing);
    }

    /// Records a guest (replacing one with the same vmid). A failed listing becomes a
    /// readable one holding only this guest; tests and callers build listings this way.
    pub fn add_guest(&mut self, guest: ObservedGuest) {
        if self.resources.is_err() {
            self.resources = Ok(BTreeMap::new());
        }
        if let Ok(guests) = &mut self.resources {
            guests.insert(guest.vmid, guest);
        }
    }

    /// The guest with `vmid`, when the listing was read and holds it.
    pub fn guest(&self, vmid: u32) -> Option<&ObservedGuest> {
        self.resources.as_ref().ok().and_then(|g| g.get(&vmid))
    }

    /// The storage as seen from `node`, if PVE reported it there.
    pub fn storage(&self, node: &str, storage: &str) -> Option<&StorageObservation> {
        self.storages.get(&(node.to_owned(), storage.to_owned()))
    }
}
