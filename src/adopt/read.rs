//! Reading the cluster for adopt, with GET requests only: the nodes in scope, their guests
//! (`GET /nodes/{n}/qemu|lxc`, then each guest's `/config`), their storages and the `iso`,
//! `vztmpl` and `import` content of each. Like `observe.rs` this maps PVE's answers into core
//! types ([`LiveConfig`]); unlike a pass, a read that fails fails adopt: a manifest set made
//! from half a cluster would look complete and not be.

use std::collections::BTreeMap;
use std::sync::Arc;

use proxops_core::guest::{GuestType, LiveConfig, LiveError};
use proxops_core::plan::NodeScope;
use proxops_pve::{ContentType, PveClient, PveError, ResourceType, request};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Guest config reads in flight at once (as `observe.rs`: PVE serves them in parallel, and
/// the agent shares its node with the guests).
const CONFIG_READS: usize = 16;

/// What adopt read from PVE.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// Nodes read, sorted.
    pub(crate) nodes: Vec<String>,
    /// Every guest on those nodes, sorted by vmid.
    pub(crate) guests: Vec<Guest>,
    /// Every ISO, container template and import file on those nodes' storages, sorted.
    pub(crate) files: Vec<StoredFile>,
    /// Storages not read (disabled or inactive), with why.
    pub(crate) skipped: Vec<(String, String)>,
}

/// One guest and its config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Guest {
    /// Its node.
    pub(crate) node: String,
    /// Its vmid.
    pub(crate) vmid: u32,
    /// qemu or lxc.
    pub(crate) guest_type: GuestType,
    /// `running`, `stopped`, ...
    pub(crate) status: String,
    /// Its config (pending values merged, as PVE answers by default).
    pub(crate) config: LiveConfig,
    /// The resource pool `/cluster/resources` reports it in (PVE keeps membership in
    /// `user.cfg`, not in the config).
    pub(crate) pool: Option<String>,
}

/// One file of content `iso`, `vztmpl` or `import` on one node's storage.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct StoredFile {
    /// The content type.
    pub(crate) content: &'static str,
    /// The storage id.
    pub(crate) storage: String,
    /// The file name (the volid after `<content>/`).
    pub(crate) filename: String,
    /// The node it was listed on (a shared storage lists its files on every node).
    pub(crate) node: String,
}

/// Why the cluster could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A GET failed.
    #[error("reading {what}")]
    Request {
        /// What was being read (`GET /nodes/pve1/qemu`).
        what: String,
        /// PVE's answer.
        #[source]
        source: PveError,
    },
    /// A guest config was not an object.
    #[error("reading the config of {guest}")]
    Config {
        /// `qemu 100 on pve1`.
        guest: String,
        /// What was wrong.
        #[source]
        source: LiveError,
    },
    /// A read task panicked (a bug).
    #[error("a guest config read stopped unexpectedly: {0}")]
    Panicked(String),
    /// A listing entry had no usable vmid.
    #[error("GET /nodes/{node}/{guest_type}: an entry has no vmid")]
    NoVmid {
        /// The node.
        node: String,
        /// `qemu` or `lxc`.
        guest_type: &'static str,
    },
}

/// The artifact content types adopt reads, with their PVE spelling.
const ARTIFACT_CONTENT: [(ContentType, &str); 3] = [
    (ContentType::Iso, "iso"),
    (ContentType::Vztmpl, "vztmpl"),
    (ContentType::Import, "import"),
];

/// Reads everything adopt needs on the nodes in `scope`.
///
/// # Errors
/// The first read that fails.
pub(crate) async fn read(pve: &PveClient, scope: &NodeScope) -> Result<Snapshot, ReadError> {
    let mut snapshot = Snapshot::default();
    let mut nodes = match scope {
        NodeScope::Node(node) => vec![node.clone()],
        NodeScope::All => {
            let listed = pve.nodes().await.map_err(|source| ReadError::Request {
                what: "GET /nodes".to_owned(),
                source,
            })?;
            // An offline node cannot be read; it is named as skipped rather than failing the
            // whole run (its guests are then simply not adopted this time).
            let mut online = Vec::new();
            for node in listed {
                if node.status == "online" {
                    online.push(node.node);
                } else {
                    snapshot.skipped.push((
                        format!("node {}", node.node),
                        format!(
                            "status `{}`: its guests and files were not read",
                            node.status
                        ),
                    ));
                }
            }
            online
        }
    };
    nodes.sort();
    nodes.dedup();
    let mut listed = Vec::new();
    for node in &nodes {
        for guest_type in [GuestType::Qemu, GuestType::Lxc] {
            for (vmid, status) in list_guests(pve, node, guest_type).await? {
                listed.push((node.clone(), guest_type, vmid, status));
            }
        }
        let (files, skipped) = read_files(pve, node).await?;
        snapshot.files.extend(files);
        snapshot.skipped.extend(skipped);
    }
    snapshot.guests = read_configs(pve, listed).await?;
    let pools = read_pools(pve).await?;
    for guest in &mut snapshot.guests {
        guest.pool = pools.get(&guest.vmid).cloned();
    }
    snapshot.files.sort();
    snapshot.nodes = nodes;
    Ok(snapshot)
}

/// Each guest's pool, from `GET /cluster/resources?type=vm` (the per-node guest lists do not
/// carry it; pve-manager @ 14a22df3 `PVE/API2/Cluster.pm` `resources` sets `pool` from
/// `user.cfg` when the caller has Pool.Audit on it).
async fn read_pools(pve: &PveClient) -> Result<BTreeMap<u32, String>, ReadError> {
    let listed = pve
        .cluster_resources(Some(ResourceType::Vm))
        .await
        .map_err(|source| ReadError::Request {
            what: "GET /cluster/resources".to_owned(),
            source,
        })?;
    Ok(listed
        .into_iter()
        .filter_map(|entry| {
            let vmid = u32::try_from(entry.vmid?).ok()?;
            Some((vmid, entry.pool.filter(|p| !p.is_empty())?))
        })
        .collect())
}

/// The vmids and statuses `GET /nodes/{node}/qemu|lxc` lists.
async fn list_guests(
    pve: &PveClient,
    node: &str,
    guest_type: GuestType,
) -> Result<BTreeMap<u32, String>, ReadError> {
    let list_req = match guest_type {
        GuestType::Qemu => request::qemu_list(node),
        GuestType::Lxc => request::lxc_list(node),
    };
    let list = pve
        .execute(&list_req)
        .await
        .map_err(|source| ReadError::Request {
            what: format!("GET /nodes/{node}/{}", guest_type.as_str()),
            source,
        })?;
    let mut entries: BTreeMap<u32, String> = BTreeMap::new();
    for entry in list.as_array().into_iter().flatten() {
        // PVE's typing is loose: vmids come as numbers or strings (BEHAVIOUR.md §11).
        let vmid = match &entry["vmid"] {
            Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            Value::String(s) => s.parse().ok(),
            _ => None,
        };
        let Some(vmid) = vmid else {
            return Err(ReadError::NoVmid {
                node: node.to_owned(),
                guest_type: guest_type.as_str(),
            });
        };
        let status = entry["status"].as_str().unwrap_or("unknown").to_owned();
        entries.insert(vmid, status);
    }
    Ok(entries)
}

/// Every listed guest's config, [`CONFIG_READS`] at a time; sorted by vmid. When reads fail,
/// the error of the lowest vmid is returned, so the same cluster always gives the same error.
async fn read_configs(
    pve: &PveClient,
    listed: Vec<(String, GuestType, u32, String)>,
) -> Result<Vec<Guest>, ReadError> {
    let permits = Arc::new(Semaphore::new(CONFIG_READS));
    let mut reads = JoinSet::new();
    for (node, guest_type, vmid, status) in listed {
        let pve = pve.clone();
        let permits = Arc::clone(&permits);
        reads.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let result = read_config(&pve, &node, guest_type, vmid).await;
            (
                vmid,
                result.map(|config| Guest {
                    node,
                    vmid,
                    guest_type,
                    status,
                    config,
                    pool: None,
                }),
            )
        });
    }
    let mut results = BTreeMap::new();
    while let Some(joined) = reads.join_next().await {
        match joined {
            Ok((vmid, result)) => {
                results.insert(vmid, result);
            }
            Err(error) => return Err(ReadError::Panicked(error.to_string())),
        }
    }
    results.into_values().collect()
}

async fn read_config(
    pve: &PveClient,
    node: &str,
    guest_type: GuestType,
    vmid: u32,
) -> Result<LiveConfig, ReadError> {
    let config_req = match guest_type {
        GuestType::Qemu => request::qemu_config(node, vmid, false),
        GuestType::Lxc => request::lxc_config(node, vmid, false),
    };
    let what = format!("{} {vmid} on {node}", guest_type.as_str());
    let body = pve
        .execute(&config_req)
        .await
        .map_err(|source| ReadError::Request {
            what: format!("the config of {what}"),
            source,
        })?;
    LiveConfig::from_json(guest_type, &body).map_err(|source| ReadError::Config {
        guest: what,
        source,
    })
}

/// The artifact files on one node, and the storages that could not be listed.
async fn read_files(
    pve: &PveClient,
    node: &str,
) -> Result<(Vec<StoredFile>, Vec<(String, String)>), ReadError> {
    let storages = pve
        .storages(node)
        .await
        .map_err(|source| ReadError::Request {
            what: format!("GET /nodes/{node}/storage"),
            source,
        })?;
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    for storage in storages {
        if storage.enabled == Some(false) || storage.active == Some(false) {
            skipped.push((
                format!("storage {} on {node}", storage.storage),
                "disabled or inactive: its files were not listed".to_owned(),
            ));
            continue;
        }
        let configured: Vec<&str> = storage.content.split(',').map(str::trim).collect();
        for (content_type, content) in ARTIFACT_CONTENT {
            if !configured.contains(&content) {
                continue;
            }
            let items = pve
                .storage_content(node, &storage.storage, Some(content_type))
                .await
                .map_err(|source| ReadError::Request {
                    what: format!(
                        "GET /nodes/{node}/storage/{}/content?content={content}",
                        storage.storage
                    ),
                    source,
                })?;
            let prefix = format!("{}:{content}/", storage.storage);
            for item in items {
                let Some(filename) = item.volid.strip_prefix(&prefix) else {
                    continue;
                };
                files.push(StoredFile {
                    content,
                    storage: storage.storage.clone(),
                    filename: filename.to_owned(),
                    node: node.to_owned(),
                });
            }
        }
    }
    Ok((files, skipped))
}
