//! `ObservedState`: what PVE reported in one pass, as plain data (built by the binary's
//! `observe.rs`, the only place that maps PVE responses into core types).
//!
//! Fail closed: a listing that could not be read is kept as `Listing::Failed`, never as an
//! empty listing, so the planner can tell "absent" from "unknown".

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// A PVE storage content type (`iso`, `vztmpl`, `import`, `images`, `rootdir`, …).
pub type ContentType = String;

/// What PVE reported, per node and storage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedState {
    /// Keyed by (node, storage id).
    pub storages: BTreeMap<(String, String), StorageObservation>,
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

    /// The storage as seen from `node`, if PVE reported it there.
    pub fn storage(&self, node: &str, storage: &str) -> Option<&StorageObservation> {
        self.storages.get(&(node.to_owned(), storage.to_owned()))
    }
}
