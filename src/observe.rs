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
use proxops_core::manifest::{ADOPT, Placement, PowerState, Spec, content_type};
use proxops_core::observed::{Listing, ObservedGuest, ObservedState};
use proxops_core::plan::NodeScope;
use proxops_core::repository::DesiredState;
use proxops_core::resource::Kind;
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
    if let Ok(guests) = &resources {
        observed.hidden_vmids = hidden_vmids(pve, desired, scope, guests).await;
    }
    observed.resources = resources;
    observed
}

/// The declared vmids in scope that `/cluster/resources` does not list but a guest of the
/// cluster holds. The listing shows a guest only to a token with VM.Audit on it
/// (pve-manager @ 14a22df3 `PVE/API2/Cluster.pm` `resources`), while a create checks the
/// whole cluster's vmlist (pve-cluster @ 7091d92e `src/PVE/Cluster.pm` `check_vmid_unused`:
/// `CT/VM N already exists on node 'x'`), so a token that lost (or never had) VM.Audit on a
/// guest would plan its create on every pass and be refused every time. `GET
/// /cluster/nextid?vmid=N` asks the same vmlist for any user (`nextid`: `VM N already
/// exists`), one request per declared guest the listing lacks: normally only the guests a
/// pass is about to create.
async fn hidden_vmids(
    pve: &PveClient,
    desired: &DesiredState,
    scope: &NodeScope,
    listed: &BTreeMap<u32, ObservedGuest>,
) -> BTreeSet<u32> {
    let mut probes = JoinSet::new();
    for resource in desired.manifest.resources() {
        let Placement::Guest { node, vmid, .. } = &resource.placement else {
            continue;
        };
        if !scope.includes(node) || listed.contains_key(vmid) {
            continue;
        }
        let (pve, vmid) = (pve.clone(), *vmid);
        probes.spawn(async move { (vmid, pve.execute(&request::cluster_nextid(vmid)).await) });
    }
    let mut hidden = BTreeSet::new();
    while let Some(joined) = probes.join_next().await {
        let Ok((vmid, answer)) = joined else { continue };
        match answer {
            Ok(_) => {}
            Err(error)
                if error.status() == Some(400)
                    && error
                        .errors()
                        .and_then(|e| e.get("vmid"))
                        .is_some_and(|m| m.contains("already exists")) =>
            {
                tracing::warn!(
                    vmid,
                    "vmid is taken in the cluster but /cluster/resources does not list it to this token"
                );
                hidden.insert(vmid);
            }
            // Unknown: the create is planned as before and PVE's answer decides.
            Err(error) => {
                tracing::debug!(vmid, reason = %error_text(&error), "GET /cluster/nextid failed");
            }
        }
    }
    hidden
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
        // Shown only with Pool.Audit on the pool (pve-manager @ 14a22df3
        // `PVE/API2/Cluster.pm` `resources`).
        guest.pool = entry.pool.filter(|p| !p.is_empty());
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
    recheck_power(pve, desired, scope, &mut guests).await;
    Ok(guests)
}

/// The declared power state of each guest in scope that is not a template.
fn declared_power(desired: &DesiredState, scope: &NodeScope) -> BTreeMap<u32, PowerState> {
    let mut declared = BTreeMap::new();
    for resource in desired.manifest.resources() {
        if matches!(resource.id.kind, Kind::TemplateVm | Kind::TemplateCt) {
            continue;
        }
        let (node, vmid, state) = match &resource.spec {
            Some(Spec::Vm(spec)) => (spec.node.as_str(), spec.vmid.get(), spec.state),
            Some(Spec::Lxc(spec)) => (spec.node.as_str(), spec.vmid.get(), spec.state),
            _ => continue,
        };
        if scope.includes(node) {
            declared.insert(vmid, state);
        }
    }
    declared
}

/// The guests whose listed power state the plan would act on: read, not templates, and
/// listed in a state other than the declared one (`unknown` included).
fn power_rechecks(
    declared: &BTreeMap<u32, PowerState>,
    guests: &BTreeMap<u32, ObservedGuest>,
) -> Vec<(u32, String, GuestType)> {
    guests
        .values()
        .filter(|g| matches!(g.config, Some(Ok(_))) && !g.template)
        .filter_map(|g| {
            let wanted = match declared.get(&g.vmid)? {
                PowerState::Started => "running",
                PowerState::Stopped => "stopped",
            };
            (g.status != wanted).then(|| (g.vmid, g.node.clone(), g.guest_type))
        })
        .collect()
}

/// Reads the power state of the guests the plan would start or stop from
/// `GET .../status/current`, which does not lag: `/cluster/resources` reports `status` from
/// pvestatd's last run (every 10 s, pve-manager @ 14a22df3 `PVE/API2Tools.pm`
/// `extract_vm_stats`), while `status/current` asks the node at once, from the live process
/// (qemu-server @ e6352be6 `src/PVE/API2/Qemu.pm` `vm_status` → `src/PVE/QemuServer.pm`
/// `vmstatus`: `$list->{$vmid}->{pid} ? 'running' : 'stopped'` over `vzlist`/
/// `check_running`; pve-container @ 94f55852 `src/PVE/API2/LXC/Status.pm` `vm_status` →
/// `src/PVE/LXC.pm` `vmstatus`: `list_active_containers`). So a pass right after a start or a
/// shutdown plans no second one. Only guests whose listed state differs from the declared
/// one are read (one GET each); a failed read leaves the listed state (the plan then acts
/// on it, as before).
async fn recheck_power(
    pve: &PveClient,
    desired: &DesiredState,
    scope: &NodeScope,
    guests: &mut BTreeMap<u32, ObservedGuest>,
) {
    let declared = declared_power(desired, scope);
    let mut reads = JoinSet::new();
    for (vmid, node, guest_type) in power_rechecks(&declared, guests) {
        let pve = pve.clone();
        reads.spawn(async move {
            let req = match guest_type {
                GuestType::Qemu => request::qemu_status_current(&node, vmid),
                GuestType::Lxc => request::lxc_status_current(&node, vmid),
            };
            (vmid, pve.execute(&req).await)
        });
    }
    while let Some(joined) = reads.join_next().await {
        let Ok((vmid, answer)) = joined else { continue };
        let Some(guest) = guests.get_mut(&vmid) else {
            continue;
        };
        match answer {
            Ok(body) => match body.get("status").and_then(|s| s.as_str()) {
                Some(status @ ("running" | "stopped")) => {
                    if guest.status != status {
                        tracing::debug!(
                            vmid,
                            listed = %guest.status,
                            current = status,
                            "power state from status/current, the listing lags"
                        );
                    }
                    status.clone_into(&mut guest.status);
                }
                _ => tracing::debug!(vmid, "status/current without a known status"),
            },
            Err(error) => {
                tracing::warn!(vmid, reason = %error_text(&error), "reading status/current failed");
            }
        }
    }
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
        // PVE lists every storage of storage.cfg on every node, those disabled or not
        // available on this node with `enabled 0` (pve-storage @ 0c56bad8 `src/PVE/Storage.pm`
        // `storage_info`: `storage_check_enabled($cfg, $storeid, undef, 1)`); listing its
        // content would fail (`storage 'x' is not available on node 'n'`). Not usable here
        // is the same as not configured here: unobserved, and the planner says so.
        if info.enabled == Some(false) {
            tracing::debug!(%node, %storage, "storage listed with enabled 0: not usable on this node");
            continue;
        }
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
