//! The simulated cluster's state: nodes (with their bridges), storage definitions and
//! volumes, guests, the task table, pools, users and the ACL. Built from a [`Seed`]; changed only by API handlers and task
//! work while they hold the cluster lock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::acl::Acl;
use crate::auth::Auth;
use crate::error::ApiError;
use crate::guest::{Guest, Kind};
use crate::property::PropertyString;
use crate::seed::{Seed, SeedError};
use crate::storage::{self, StorageDef, Volume};
use crate::task::Task;

/// Seconds since the epoch.
pub(crate) fn now_epoch() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A cluster member.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) maxcpu: u32,
    pub(crate) maxmem: u64,
    pub(crate) online: bool,
    /// Linux bridges (`vmbr0`, ...).
    pub(crate) bridges: Vec<String>,
}

/// A resource pool.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pool {
    pub(crate) comment: Option<String>,
    pub(crate) vms: BTreeSet<u32>,
}

/// Everything the simulator knows.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) name: String,
    pub(crate) nodes: BTreeMap<String, Node>,
    pub(crate) storages: Vec<StorageDef>,
    /// (scope, storage) -> volname -> volume; scope is the node, or "" for shared storages.
    volumes: BTreeMap<(String, String), BTreeMap<String, Volume>>,
    pub(crate) guests: BTreeMap<u32, Guest>,
    pub(crate) tasks: Vec<Task>,
    pub(crate) pools: BTreeMap<String, Pool>,
    pub(crate) auth: Auth,
    /// Roles, groups and ACL entries: what each caller may do.
    pub(crate) acl: Acl,
    /// Config file locks held by running tasks (clone sources), by vmid.
    pub(crate) file_locks: BTreeMap<u32, u32>,
    pub(crate) boot_time: u64,
    next_pid: u32,
    /// What pvestatd last published for each guest; `None` when the simulator reports the
    /// live state on every read (a stats interval of zero).
    pub(crate) stats: Option<BTreeMap<u32, GuestStats>>,
    /// File based storages are real directories (`SimConfig::storage_root`).
    pub(crate) storage_dirs: bool,
    /// PVE's HA stack (`crate::api::ha`): `None` without HA; the nodes in maintenance.
    pub(crate) ha: Option<std::collections::BTreeSet<String>>,
}

/// One guest's entry in pvestatd's last published status (its RRD update): what
/// `/cluster/resources` and the pool member lists report as `name`, `status`, `template`
/// and the sizes.
///
/// PVE: pve-manager `PVE/Service/pvestatd.pm` (`update_qemu_status`/`update_lxc_status`
/// publish uptime, name, status, template, cpus, maxmem, ... for every guest of the node,
/// `my $updatetime = 10;` between runs) and `PVE/API2Tools.pm` `extract_vm_stats` (a guest
/// without an RRD entry is `status => 'unknown'` with no name, template or sizes), both
/// @ 14a22df3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GuestStats {
    pub(crate) name: String,
    pub(crate) running: bool,
    pub(crate) template: bool,
    pub(crate) maxcpu: u64,
    pub(crate) maxmem: u64,
    pub(crate) maxdisk: u64,
    pub(crate) started_at: Option<u64>,
}

impl GuestStats {
    /// What pvestatd reads for `g` now.
    pub(crate) fn of(g: &Guest) -> Self {
        Self {
            name: g.name(),
            running: g.running,
            template: g.is_template(),
            maxcpu: g.cpus(),
            maxmem: g.memory_mib() * 1024 * 1024,
            maxdisk: g.maxdisk(),
            started_at: g.started_at,
        }
    }
}

impl Cluster {
    /// Builds the state from a seed plus the root password and the `root@pam!proxops` secret.
    pub(crate) fn from_seed(
        seed: &Seed,
        root_password: &str,
        token_secret: &str,
    ) -> Result<Self, SeedError> {
        seed.check()?;
        let mut auth = Auth::default();
        auth.add_user("root@pam", Some(root_password));
        auth.add_token("root@pam!proxops", token_secret);
        for u in &seed.users {
            if u.userid != "root@pam" {
                auth.add_user(&u.userid, u.password.as_deref());
            }
            for t in &u.tokens {
                auth.add_token(&format!("{}!{}", u.userid, t.id), &t.secret);
            }
        }
        let storages = seed
            .storages
            .iter()
            .map(|s| StorageDef {
                id: s.storage.clone(),
                kind: s.kind.clone(),
                content: s.content.clone(),
                nodes: s.nodes.clone(),
                shared: s.shared,
                path: s.path.clone().unwrap_or_else(|| {
                    if s.storage == "local" {
                        "/var/lib/vz".to_string()
                    } else {
                        format!("/mnt/pve/{}", s.storage)
                    }
                }),
                total: s.total,
                enabled: s.enabled,
            })
            .collect();
        let now = now_epoch();
        let mut cluster = Self {
            name: seed.cluster_name.clone(),
            nodes: seed
                .nodes
                .iter()
                .map(|n| {
                    (
                        n.name.clone(),
                        Node {
                            name: n.name.clone(),
                            maxcpu: n.maxcpu,
                            maxmem: n.maxmem,
                            online: n.online,
                            bridges: n.bridges.clone(),
                        },
                    )
                })
                .collect(),
            storages,
            volumes: BTreeMap::new(),
            guests: BTreeMap::new(),
            tasks: Vec::new(),
            pools: seed
                .pools
                .iter()
                .map(|p| (p.clone(), Pool::default()))
                .collect(),
            auth,
            acl: Acl::from_seed(seed),
            file_locks: BTreeMap::new(),
            boot_time: now.saturating_sub(3600),
            next_pid: 0x1000 + rand::random_range(0..0x1000u32),
            stats: None,
            storage_dirs: false,
            ha: (seed.ha.enabled || !seed.ha.maintenance.is_empty())
                .then(|| seed.ha.maintenance.iter().cloned().collect()),
        };
        for v in &seed.volumes {
            let (sid, volname) = storage::split_volid(&v.volid)
                .ok_or_else(|| SeedError::Invalid(format!("bad volume id '{}'", v.volid)))?;
            let parsed = storage::parse_volname(volname).map_err(SeedError::Invalid)?;
            let scope = cluster
                .scope(&v.node, sid)
                .map_err(|_| SeedError::Invalid(format!("unknown storage in '{}'", v.volid)))?;
            cluster.volumes.entry(scope).or_default().insert(
                volname.to_string(),
                Volume {
                    content: parsed.content,
                    format: parsed.format,
                    size: v.size,
                    ctime: now,
                    vmid: parsed.vmid,
                    checksums: BTreeMap::new(),
                    notes: None,
                },
            );
        }
        for g in &seed.guests {
            let kind = if g.kind == "lxc" {
                Kind::Lxc
            } else {
                Kind::Qemu
            };
            let mut guest = Guest::new(g.vmid, kind, &g.node);
            guest.config = g.config.clone();
            if g.running {
                guest.running = true;
                guest.started_at = Some(now);
                guest.pid = Some(cluster.next_pid().0);
            }
            for value in g.config.values() {
                let file = PropertyString::parse(value, Some("file"));
                if let Some(volid) = file.get("file")
                    && let Some((sid, volname)) = storage::split_volid(volid)
                    && let Ok(parsed) = storage::parse_volname(volname)
                    && parsed.content == "images"
                    && let Ok(scope) = cluster.scope(&g.node, sid)
                {
                    let size = file.get("size").and_then(storage::parse_size).unwrap_or(0);
                    cluster.volumes.entry(scope).or_default().insert(
                        volname.to_string(),
                        Volume {
                            content: if kind == Kind::Lxc {
                                "rootdir".into()
                            } else {
                                "images".into()
                            },
                            format: parsed.format,
                            size,
                            ctime: now,
                            vmid: parsed.vmid,
                            checksums: BTreeMap::new(),
                            notes: None,
                        },
                    );
                }
            }
            cluster.guests.insert(g.vmid, guest);
        }
        Ok(cluster)
    }

    /// Maps every file based storage to the directory `<root>/<storage>` (created, with its
    /// `snippets/` subdirectory): its `path` is that directory from now on.
    pub(crate) fn map_storages_to(&mut self, root: &std::path::Path) -> std::io::Result<()> {
        for def in self.storages.iter_mut().filter(|s| s.is_file_based()) {
            let dir = root.join(&def.id);
            std::fs::create_dir_all(dir.join("snippets"))?;
            def.path = dir.to_string_lossy().into_owned();
        }
        self.storage_dirs = true;
        Ok(())
    }

    /// Switches from live reporting to pvestatd's snapshots, taking the first one now (the
    /// guests of the seed have been running under pvestatd before the simulator started).
    pub(crate) fn use_stats_snapshots(&mut self) {
        self.stats = Some(BTreeMap::new());
        self.refresh_stats();
    }

    /// One pvestatd run: every guest's current state becomes what `/cluster/resources`
    /// reports until the next run. Until then a guest removed since keeps its entry, so a
    /// new guest that takes its vmid shows the old one's (assumed: pmxcfs keeps the RRD
    /// entry of a vanished guest at least until pvestatd's next run).
    pub(crate) fn refresh_stats(&mut self) {
        if self.stats.is_some() {
            let snapshot = self
                .guests
                .iter()
                .map(|(id, g)| (*id, GuestStats::of(g)))
                .collect();
            self.stats = Some(snapshot);
        }
    }

    /// What `/cluster/resources` reports of guest `vmid`: the last snapshot, `None` while
    /// pvestatd has not seen it yet, or the live state when snapshots are off.
    pub(crate) fn guest_stats(&self, g: &Guest) -> Option<GuestStats> {
        match &self.stats {
            None => Some(GuestStats::of(g)),
            Some(stats) => stats.get(&g.vmid).cloned(),
        }
    }

    /// The next (pid, pstart) for a task or a guest process.
    pub(crate) fn next_pid(&mut self) -> (u32, u64) {
        self.next_pid += 1 + rand::random_range(0..16u32);
        let pstart = (now_epoch().saturating_sub(self.boot_time)) * 100;
        (self.next_pid, pstart)
    }

    /// The node, or the DNS failure PVE reports for names that are not cluster members.
    pub(crate) fn node(&self, name: &str) -> Result<&Node, ApiError> {
        self.nodes.get(name).ok_or_else(|| {
            ApiError::die(format!(
                "hostname lookup '{name}' failed - failed to get address info for: {name}: Name or service not known"
            ))
        })
    }

    /// The storage definition, if it exists and applies to `node`.
    pub(crate) fn storage(&self, node: &str, sid: &str) -> Result<&StorageDef, ApiError> {
        let def = self
            .storages
            .iter()
            .find(|s| s.id == sid)
            .ok_or_else(|| ApiError::die(format!("storage '{sid}' does not exist")))?;
        if !def.is_on_node(node) {
            return Err(ApiError::die(format!(
                "storage '{sid}' is not available on node '{node}'"
            )));
        }
        Ok(def)
    }

    fn scope(&self, node: &str, sid: &str) -> Result<(String, String), ApiError> {
        let def = self.storage(node, sid)?;
        let scope = if def.shared {
            String::new()
        } else {
            node.to_string()
        };
        Ok((scope, sid.to_string()))
    }

    /// Volumes of a storage as seen from `node`.
    pub(crate) fn volumes(&self, node: &str, sid: &str) -> Vec<(String, Volume)> {
        self.scope(node, sid)
            .ok()
            .and_then(|scope| self.volumes.get(&scope))
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    pub(crate) fn volume(&self, node: &str, volid: &str) -> Option<Volume> {
        let (sid, volname) = storage::split_volid(volid)?;
        let scope = self.scope(node, sid).ok()?;
        self.volumes.get(&scope)?.get(volname).cloned()
    }

    pub(crate) fn used_bytes(&self, node: &str, sid: &str) -> u64 {
        self.volumes(node, sid).iter().map(|(_, v)| v.size).sum()
    }

    pub(crate) fn put_volume(
        &mut self,
        node: &str,
        sid: &str,
        volname: &str,
        volume: Volume,
    ) -> Result<(), ApiError> {
        let scope = self.scope(node, sid)?;
        self.volumes
            .entry(scope)
            .or_default()
            .insert(volname.to_string(), volume);
        Ok(())
    }

    /// Removes a volume; returns whether it existed.
    pub(crate) fn free_volume(&mut self, node: &str, volid: &str) -> bool {
        let Some((sid, volname)) = storage::split_volid(volid) else {
            return false;
        };
        let Ok(scope) = self.scope(node, sid) else {
            return false;
        };
        self.volumes
            .get_mut(&scope)
            .is_some_and(|m| m.remove(volname).is_some())
    }

    /// Renames a volume within its storage; returns the new volume id.
    pub(crate) fn rename_volume(&mut self, node: &str, volid: &str, new_volname: &str) -> String {
        let Some((sid, volname)) = storage::split_volid(volid) else {
            return volid.to_string();
        };
        if let Ok(scope) = self.scope(node, sid)
            && let Some(m) = self.volumes.get_mut(&scope)
            && let Some(v) = m.remove(volname)
        {
            m.insert(new_volname.to_string(), v);
        }
        format!("{sid}:{new_volname}")
    }

    /// Allocates a disk for a guest (`vm-<vmid>-disk-<n>`) and returns its volume id.
    pub(crate) fn alloc_disk(
        &mut self,
        node: &str,
        sid: &str,
        vmid: u32,
        content: &str,
        size: u64,
        format: Option<&str>,
    ) -> Result<String, String> {
        let def = self.storage(node, sid).map_err(|e| e.text())?.clone();
        if !def.has_content(content) {
            return Err(match content {
                "images" => format!("storage '{sid}' does not support vm images"),
                _ => format!("storage '{sid}' does not support container directories"),
            });
        }
        let existing: BTreeSet<String> = self
            .volumes(node, sid)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        let file_based = def.is_file_based();
        let format = format.unwrap_or("raw").to_string();
        let name_for = |n: u32| {
            if file_based {
                format!("{vmid}/vm-{vmid}-disk-{n}.{format}")
            } else {
                format!("vm-{vmid}-disk-{n}")
            }
        };
        let taken = |n: u32| {
            existing.iter().any(|e| {
                let file = e.rsplit('/').next().unwrap_or(e);
                let stem = file.split('.').next().unwrap_or(file);
                stem == format!("vm-{vmid}-disk-{n}") || stem == format!("base-{vmid}-disk-{n}")
            })
        };
        let n = (0..).find(|n| !taken(*n)).unwrap_or(0);
        let volname = name_for(n);
        let used = self.used_bytes(node, sid);
        if used.saturating_add(size) > def.total {
            return Err(if file_based {
                format!("unable to create image: not enough space on storage '{sid}'")
            } else {
                format!(
                    "lvcreate 'pve/{volname}' error:   Volume group \"pve\" has insufficient free space"
                )
            });
        }
        self.put_volume(
            node,
            sid,
            &volname,
            Volume {
                content: content.to_string(),
                format: if file_based { format } else { "raw".into() },
                size,
                ctime: now_epoch(),
                vmid: Some(vmid),
                checksums: BTreeMap::new(),
                notes: None,
            },
        )
        .map_err(|e| e.text())?;
        Ok(format!("{sid}:{volname}"))
    }

    /// Allocates the cloud-init drive; fails when it already exists, as lvcreate does.
    pub(crate) fn alloc_cloudinit(
        &mut self,
        node: &str,
        sid: &str,
        vmid: u32,
    ) -> Result<String, String> {
        let def = self.storage(node, sid).map_err(|e| e.text())?.clone();
        let volname = if def.is_file_based() {
            format!("{vmid}/vm-{vmid}-cloudinit.qcow2")
        } else {
            format!("vm-{vmid}-cloudinit")
        };
        if self.volume(node, &format!("{sid}:{volname}")).is_some() {
            return Err(if def.is_file_based() {
                format!("disk image '{}/images/{volname}' already exists", def.path)
            } else {
                format!(
                    "lvcreate 'pve/{volname}' error:   Logical Volume \"{volname}\" already exists in volume group \"pve\""
                )
            });
        }
        self.put_volume(
            node,
            sid,
            &volname,
            Volume {
                content: "images".into(),
                format: if def.is_file_based() { "qcow2" } else { "raw" }.into(),
                size: 4 << 20,
                ctime: now_epoch(),
                vmid: Some(vmid),
                checksums: BTreeMap::new(),
                notes: None,
            },
        )
        .map_err(|e| e.text())?;
        Ok(format!("{sid}:{volname}"))
    }

    /// The missing-guest error of `load_config`.
    pub(crate) fn guest(&self, node: &str, vmid: u32, kind: Kind) -> Result<&Guest, ApiError> {
        match self.guests.get(&vmid) {
            Some(g) if g.node == node && g.kind == kind => Ok(g),
            _ => Err(ApiError::die(format!(
                "Configuration file '{}' does not exist",
                crate::guest::config_path(kind, node, vmid)
            ))),
        }
    }

    /// The lowest free vmid from 100.
    pub(crate) fn next_free_vmid(&self) -> u32 {
        (100..)
            .find(|id| !self.guests.contains_key(id))
            .unwrap_or(100)
    }

    /// Hands the pools' guests to the ACL, which lets them inherit the pools' roles.
    pub(crate) fn sync_pool_acl(&mut self) {
        let members = self
            .pools
            .iter()
            .map(|(id, p)| (id.clone(), p.vms.clone()))
            .collect();
        self.acl.set_pool_members(members);
    }

    pub(crate) fn pool_of(&self, vmid: u32) -> Option<&str> {
        self.pools
            .iter()
            .find(|(_, p)| p.vms.contains(&vmid))
            .map(|(id, _)| id.as_str())
    }
}
