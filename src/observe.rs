//! Observe: read what PVE has, with GET requests only, into `proxops_core::ObservedState`.
//!
//! This is where a pass maps PVE responses into core types. It never fails a pass:
//! a listing that cannot be read is recorded as `Listing::Failed` for that (node, storage,
//! content type), so the planner skips just that and the next pass retries (fail closed).
//!
//! Guests: one `GET /cluster/resources?type=vm` (a failure is kept as `resources: Err`, and
//! the planner then writes nothing), then one `GET .../pending` per guest the plan may touch
//! (declared guests in scope that ProxOps owns or may adopt, and owned guests in scope that
//! nothing declares, the prune candidates). PVE's pending list carries every config key with
//! its value in effect, its pending value and pending delete, and the `digest`
//! (`config_with_pending_array` walks the loaded config), so that one request gives what
//! `GET .../config` would (pending merged, digest) plus what PVE holds for a restart.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proxops_core::guest::{GuestType, LiveConfig};
use proxops_core::manifest::{ADOPT, Placement, Spec, content_type};
use proxops_core::observed::{Listing, ObservedGuest, ObservedState};
use proxops_core::plan::NodeScope;
use proxops_core::repository::DesiredState;
use proxops_pve::{ContentType, PveClient, ResourceType, request};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::error_chain::error_text;

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
    // Cloud-init snippets: the `snippets` listing of each storage a VM in scope writes
    // them to (what is there, and each file's ctime for the grace period).
    for resource in desired.manifest.resources() {
        let Some(Spec::Vm(vm)) = &resource.spec else {
            continue;
        };
        let Some(resolved) = &vm.cloud_init_data.snippets.resolved else {
            continue;
        };
        if !scope.includes(vm.node.as_str()) {
            continue;
        }
        for s in &resolved.snippets {
            needed
                .entry(vm.node.as_str().to_owned())
                .or_default()
                .entry(s.storage.clone())
                .or_default()
                .insert("snippets");
        }
    }
    needed
}

/// Reads storages and their content listings for everything `desired` places in `scope`:
/// one `GET /nodes/{n}/storage` per node and one content listing per (node, storage,
/// content type), concurrently; and the guests, at most `read_concurrency` config reads in
/// flight (`[pve] read_concurrency`): a pass over `G` guests takes about
/// `(1 + ⌈G / read_concurrency⌉)` round trips.
pub async fn observe(
    pve: &PveClient,
    desired: &DesiredState,
    scope: &NodeScope,
    read_concurrency: usize,
) -> ObservedState {
    let needed = listings_needed(desired, scope);
    let mut observed = ObservedState::default();
    let mut nodes = JoinSet::new();
    for (node, storages) in needed {
        let pve = pve.clone();
        nodes.spawn(async move { observe_node(&pve, node, storages).await });
    }
    let guests = observe_guests(pve, desired, scope, read_concurrency.max(1));
    let (resources, ()) = tokio::join!(guests, async {
        while let Some(joined) = nodes.join_next().await {
            // A panicked task is a bug; its node simply stays unobserved (fail closed).
            let Ok(node_observed) = joined else { continue };
            observed.storages.extend(node_observed.storages);
        }
    });
    observed.resources = resources;
    observed
}

/// The guests of the cluster, with the configs (and pending changes) the planner needs.
async fn observe_guests(
    pve: &PveClient,
    desired: &DesiredState,
    scope: &NodeScope,
    read_concurrency: usize,
) -> Result<BTreeMap<u32, ObservedGuest>, String> {
    let listed = match pve.cluster_resources(Some(ResourceType::Vm)).await {
        Ok(listed) => listed,
        Err(error) => {
            let reason = error_text(&error);
            tracing::warn!(%reason, "listing the cluster's guests failed");
            return Err(reason);
        }
    };
    let mut guests = BTreeMap::new();
    for entry in listed {
        let guest_type = match entry.resource_type.as_str() {
            "qemu" => GuestType::Qemu,
            "lxc" => GuestType::Lxc,
            _ => continue,
        };
        let (Some(vmid), Some(node)) = (entry.vmid, entry.node.as_deref()) else {
            continue;
        };
        let Ok(vmid) = u32::try_from(vmid) else {
            continue;
        };
        let mut guest = ObservedGuest::new(
            vmid,
            node,
            guest_type,
            entry.status.as_deref().unwrap_or("unknown"),
        )
        .with_tags(entry.tags.as_deref().unwrap_or(""));
        guest.template = entry.template.unwrap_or(false);
        guest.lock = entry.lock.filter(|l| !l.is_empty());
        guest.name = entry.name;
        guests.insert(vmid, guest);
    }

    let reads = reads_needed(desired, scope, &guests);
    let limit = Arc::new(Semaphore::new(read_concurrency));
    let mut tasks = JoinSet::new();
    for vmid in reads {
        let Some(guest) = guests.get(&vmid) else {
            continue;
        };
        let (pve, limit) = (pve.clone(), limit.clone());
        let (node, guest_type) = (guest.node.clone(), guest.guest_type);
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await.ok();
            (vmid, read_config(&pve, &node, vmid, guest_type).await)
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let Ok((vmid, config)) = joined else {
            continue;
        };
        if let Some(guest) = guests.get_mut(&vmid) {
            if let Ok(config) = &config {
                fill_from_config(guest, config);
            }
            guest.pending = Some(
                config
                    .as_ref()
                    .map(|c| c.pending_keys().map(str::to_owned).collect())
                    .map_err(Clone::clone),
            );
            guest.config = Some(config);
        }
    }
    Ok(guests)
}

/// What `/cluster/resources` may not show yet, taken from the config just read: PVE
/// reports a guest's `name` and `template` there from pvestatd's last run (pve-manager
/// `PVE/API2Tools.pm` `extract_vm_stats` @ 14a22df3: no RRD entry, no `name`/`template`;
/// `PVE/Service/pvestatd.pm`: `my $updatetime = 10;`), so for up to 10 s after a create or a
/// promote the listing lags the config. The config's `template: 1` counts at once, and its
/// `name` (qemu) or `hostname` (lxc) names a guest the listing has no name for.
fn fill_from_config(guest: &mut ObservedGuest, config: &LiveConfig) {
    guest.template |= config.is_template();
    if guest.name.as_deref().is_none_or(str::is_empty) {
        let key = match guest.guest_type {
            GuestType::Qemu => "name",
            GuestType::Lxc => "hostname",
        };
        guest.name = config.get(key).map(str::to_owned);
    }
}

/// Which guests' configs the planner will look at.
fn reads_needed(
    desired: &DesiredState,
    scope: &NodeScope,
    guests: &BTreeMap<u32, ObservedGuest>,
) -> BTreeSet<u32> {
    let mut reads = BTreeSet::new();
    let mut declared = BTreeSet::new();
    for resource in desired.manifest.resources() {
        let Placement::Guest { node, vmid, .. } = &resource.placement else {
            continue;
        };
        declared.insert(*vmid);
        let Some(guest) = guests.get(vmid) else {
            continue;
        };
        let adopt = resource.annotations.get(ADOPT).map(String::as_str) == Some("true");
        if scope.includes(node) && guest.node == *node && (guest.is_owned() || adopt) {
            reads.insert(*vmid);
        }
    }
    for guest in guests.values() {
        if guest.is_owned() && scope.includes(&guest.node) && !declared.contains(&guest.vmid) {
            reads.insert(guest.vmid);
        }
    }
    reads
}

/// One guest's config with what PVE holds for a restart, from `GET .../pending` alone.
/// Should a PVE leave `digest` out of that list (GAPS.md), the digest is read from
/// `GET .../config`: an update is never sent without the digest it was planned against.
async fn read_config(
    pve: &PveClient,
    node: &str,
    vmid: u32,
    guest_type: GuestType,
) -> Result<LiveConfig, String> {
    let req = match guest_type {
        GuestType::Qemu => request::qemu_pending(node, vmid),
        GuestType::Lxc => request::lxc_pending(node, vmid),
    };
    let body = pve.execute(&req).await.map_err(|e| error_text(&e))?;
    let config = LiveConfig::from_pending_json(guest_type, &body).map_err(|e| e.to_string())?;
    if config.digest().is_some() {
        return Ok(config);
    }
    tracing::debug!(%node, vmid, "pending list without a digest; reading the config");
    let req = match guest_type {
        GuestType::Qemu => request::qemu_config(node, vmid, false),
        GuestType::Lxc => request::lxc_config(node, vmid, false),
    };
    let body = pve.execute(&req).await.map_err(|e| error_text(&e))?;
    let full = LiveConfig::from_json(guest_type, &body).map_err(|e| e.to_string())?;
    match full.digest() {
        Some(digest) => Ok(config.with_digest(digest)),
        None => Err(format!("PVE reported no digest for guest {vmid}")),
    }
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
                let (listing, ctimes) = list(&pve, &node, &storage, content).await;
                (storage, content, listing, ctimes)
            });
        }
    }
    while let Some(joined) = listings.join_next().await {
        let Ok((storage, content, listing, ctimes)) = joined else {
            continue;
        };
        observed.add_listing(&node, &storage, content, listing);
        if content == "snippets"
            && let Some(entry) = observed.storages.get_mut(&(node.clone(), storage))
        {
            entry.ctimes.extend(ctimes);
        }
    }
    observed
}

/// One listing, with each volume's `ctime` (kept for snippets only).
async fn list(
    pve: &PveClient,
    node: &str,
    storage: &str,
    content: &str,
) -> (Listing, Vec<(String, u64)>) {
    let Ok(content_type) = content.parse::<ContentType>() else {
        return (
            Listing::Failed(format!("unknown content type {content}")),
            Vec::new(),
        );
    };
    match pve.storage_content(node, storage, Some(content_type)).await {
        Ok(items) => {
            let ctimes = if content == "snippets" {
                items
                    .iter()
                    .filter_map(|i| Some((i.volid.clone(), i.ctime?)))
                    .collect()
            } else {
                Vec::new()
            };
            (
                Listing::Listed(items.into_iter().map(|i| i.volid).collect()),
                ctimes,
            )
        }
        Err(error) => {
            let reason = error_text(&error);
            tracing::warn!(%node, %storage, %content, %reason, "storage listing failed");
            (Listing::Failed(reason), Vec::new())
        }
    }
}
