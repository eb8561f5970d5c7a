//! Observe: read what PVE has, with GET requests only, into `proxops_core::ObservedState`.
//!
//! This is the only place that maps PVE responses into core types. It never fails a pass:
//! a listing that cannot be read is recorded as `Listing::Failed` for that (node, storage,
//! content type), so the planner skips just that and the next pass retries (fail closed).

use std::collections::{BTreeMap, BTreeSet};

use proxops_core::manifest::{Spec, content_type};
use proxops_core::observed::{Listing, ObservedState};
use proxops_core::plan::NodeScope;
use proxops_core::repository::DesiredState;
use proxops_pve::{ContentType, PveClient};
use tokio::task::JoinSet;

/// The (storage → content types) to list on each node for the artifacts in scope.
fn listings_needed(
    desired: &DesiredState,
    scope: &NodeScope,
) -> BTreeMap<String, BTreeMap<String, BTreeSet<&'static str>>> {
    let mut needed: BTreeMap<String, BTreeMap<String, BTreeSet<&'static str>>> = BTreeMap::new();
    for resource in desired.manifest.resources() {
        let Some(Spec::Artifact(spec)) = &resource.spec else {
            continue;
        };
        let content = content_type(resource.id.kind);
        for node in spec.nodes.iter().filter(|n| scope.includes(n.as_str())) {
            needed
                .entry(node.as_str().to_owned())
                .or_default()
                .entry(spec.storage.as_str().to_owned())
                .or_default()
                .insert(content);
        }
    }
    needed
}

/// Reads storages and their content listings for everything `desired` places in `scope`:
/// one `GET /nodes/{n}/storage` per node and one content listing per (node, storage,
/// content type), concurrently.
pub async fn observe(pve: &PveClient, desired: &DesiredState, scope: &NodeScope) -> ObservedState {
    let needed = listings_needed(desired, scope);
    let mut observed = ObservedState::default();
    let mut nodes = JoinSet::new();
    for (node, storages) in needed {
        let pve = pve.clone();
        nodes.spawn(async move { observe_node(&pve, node, storages).await });
    }
    while let Some(joined) = nodes.join_next().await {
        // A panicked task is a bug; its node simply stays unobserved (fail closed).
        let Ok(node_observed) = joined else { continue };
        observed.storages.extend(node_observed.storages);
    }
    observed
}

async fn observe_node(
    pve: &PveClient,
    node: String,
    storages: BTreeMap<String, BTreeSet<&'static str>>,
) -> ObservedState {
    let mut observed = ObservedState::default();
    let configured = match pve.storages(&node).await {
        Ok(list) => list,
        Err(error) => {
            let reason = format!("listing storages of node {node}: {}", error_text(&error));
            tracing::warn!(%node, %reason, "observe failed");
            for (storage, contents) in &storages {
                for content in contents {
                    observed.add_listing(&node, storage, content, Listing::Failed(reason.clone()));
                }
            }
            return observed;
        }
    };
    let mut listings = JoinSet::new();
    for (storage, contents) in storages {
        let Some(info) = configured.iter().find(|s| s.storage == storage) else {
            // Not configured on this node: leave it unobserved; the planner says so.
            continue;
        };
        let content_list: Vec<String> = info
            .content
            .split(',')
            .map(|c| c.trim().to_owned())
            .filter(|c| !c.is_empty())
            .collect();
        observed.add_storage(&node, &storage, info.shared.unwrap_or(false), content_list);
        for content in contents {
            let pve = pve.clone();
            let (node, storage) = (node.clone(), storage.clone());
            listings.spawn(async move {
                let listing = list(&pve, &node, &storage, content).await;
                (storage, content, listing)
            });
        }
    }
    while let Some(joined) = listings.join_next().await {
        let Ok((storage, content, listing)) = joined else {
            continue;
        };
        observed.add_listing(&node, &storage, content, listing);
    }
    observed
}

async fn list(pve: &PveClient, node: &str, storage: &str, content: &str) -> Listing {
    let Ok(content_type) = content.parse::<ContentType>() else {
        return Listing::Failed(format!("unknown content type {content}"));
    };
    match pve.storage_content(node, storage, Some(content_type)).await {
        Ok(items) => Listing::Listed(items.into_iter().map(|i| i.volid).collect()),
        Err(error) => {
            let reason = error_text(&error);
            tracing::warn!(%node, %storage, %content, %reason, "storage listing failed");
            Listing::Failed(reason)
        }
    }
}

/// An error with its causes on one line (the client's errors never contain the token).
pub fn error_text(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
