//! The initial cluster: nodes (with their bridges), storages (as in `storage.cfg`), extra
//! users and API tokens, groups, roles and ACL entries (as in `user.cfg`), pools, files
//! already present on storages, and guests. Read from JSON or TOML
//! (`--seed FILE`) or taken from [`Seed::default`]. This module only describes the data;
//! `cluster` turns it into live state.

use std::path::Path;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Errors reading a seed file.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// The file could not be read.
    #[error("reading seed file {path}")]
    Read {
        /// The file.
        path: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The JSON did not match the seed format.
    #[error("parsing seed file {path} as JSON")]
    Json {
        /// The file.
        path: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The TOML did not match the seed format.
    #[error("parsing seed file {path} as TOML")]
    Toml {
        /// The file.
        path: String,
        /// The parse error.
        #[source]
        source: toml::de::Error,
    },
    /// The seed is well-formed but inconsistent.
    #[error("invalid seed: {0}")]
    Invalid(String),
}

/// The whole seed document.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Seed {
    /// Cluster name reported by `/cluster/status` and `/access/ticket`.
    #[serde(default = "default_cluster_name")]
    pub cluster_name: String,
    /// Cluster members.
    pub nodes: Vec<NodeSeed>,
    /// Storage definitions; each applies to every node unless `nodes` limits it.
    pub storages: Vec<StorageSeed>,
    /// Users besides `root@pam` (which always exists).
    #[serde(default)]
    pub users: Vec<UserSeed>,
    /// Groups of users (ACL entries may name a group).
    #[serde(default)]
    pub groups: Vec<GroupSeed>,
    /// Roles besides PVE's built-in ones (`Administrator`, `PVEVMAdmin`, ...).
    #[serde(default)]
    pub roles: Vec<RoleSeed>,
    /// ACL entries. `root@pam` and its `proxops` token (no privilege separation) hold every
    /// privilege without any; every other user and token holds only what these grant.
    #[serde(default)]
    pub acl: Vec<AclSeed>,
    /// Resource pools.
    #[serde(default)]
    pub pools: Vec<String>,
    /// Files already present on storages (ISOs, templates, import images).
    #[serde(default)]
    pub volumes: Vec<VolumeSeed>,
    /// Guests that exist at start.
    #[serde(default)]
    pub guests: Vec<GuestSeed>,
    /// The tag settings of `datacenter.cfg` (`user-tag-access`, `registered-tags`).
    #[serde(default)]
    pub datacenter: DatacenterSeed,
    /// PVE's HA stack: whether it is in use, and the nodes in maintenance mode.
    #[serde(default)]
    pub ha: HaSeed,
    /// How long tasks of one type run, in milliseconds, by PVE task type (`download`,
    /// `qmcreate`, `vzcreate`, `qmclone`, `qmstart`, ...). `SimConfig::task_durations` wins
    /// over these; types listed in neither take `SimConfig::task_duration`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub task_durations_ms: BTreeMap<String, u64>,
}

/// The name of the built-in seed shaped like a real 3-node PVE 9 cluster
/// ([`Seed::realistic_3node`]), for `proxops-pvesim --seed realistic-3node`.
pub const REALISTIC_3NODE: &str = "realistic-3node";

/// Task durations with a real cluster's ratios, in milliseconds at scale 1 (a demo pace:
/// real PVE runs each of these several times longer, in about these proportions). A
/// download of a cloud image or an ISO takes far longer than any create; a clone copies a
/// whole disk; a container create unpacks its template; a start or a config task is short.
/// *Assumed* (no live PVE measured): the ratios, not PVE's code, set these.
const REALISTIC_TASK_MS: &[(&str, u64)] = &[
    ("download", 4000),
    ("qmclone", 1600),
    ("vzcreate", 1200),
    ("qmcreate", 600),
    ("qmtemplate", 500),
    ("vztemplate", 500),
    ("qmdestroy", 400),
    ("vzdestroy", 400),
    ("qmshutdown", 400),
    ("vzshutdown", 400),
    ("qmreboot", 400),
    ("vzreboot", 400),
    ("resize", 300),
    ("qmconfig", 200),
    ("qmstart", 200),
    ("vzstart", 200),
    ("imgdel", 100),
];

/// PVE's HA stack (pve-ha-manager): `enabled` when the cluster uses HA (its CRM wrote a
/// manager status with a `node_status` for every node, so `/cluster/ha/status/current` has
/// an `lrm:<node>` entry each), and the nodes whose LRM is in maintenance mode
/// (`ha-manager crm-command node-maintenance enable <node>`). Nodes in `maintenance` turn
/// HA on.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HaSeed {
    /// The cluster uses HA.
    #[serde(default)]
    pub enabled: bool,
    /// Nodes in HA maintenance mode.
    #[serde(default)]
    pub maintenance: Vec<String>,
}

/// The `datacenter.cfg` settings the permission checks read: who may set which guest tags
/// (pve-guest-common `src/PVE/GuestHelpers.pm` `get_allowed_tags`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct DatacenterSeed {
    /// `user-tag-access: user-allow=<free|existing|list|none>` (PVE's default `free`).
    #[serde(default)]
    pub user_allow: Option<String>,
    /// `user-tag-access: user-allow-list=<tag;...>`.
    #[serde(default)]
    pub user_allow_list: Vec<String>,
    /// `registered-tags`: tags only users with `Sys.Modify` on `/` may set or remove.
    #[serde(default)]
    pub registered_tags: Vec<String>,
}

/// One node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeSeed {
    /// Node name (`pve1`).
    pub name: String,
    /// Number of CPUs.
    #[serde(default = "default_cpus")]
    pub maxcpu: u32,
    /// Memory in bytes.
    #[serde(default = "default_node_mem")]
    pub maxmem: u64,
    /// `false` makes the node `offline` in listings.
    #[serde(default = "default_true")]
    pub online: bool,
    /// Linux bridges of the node (`GET /nodes/{node}/network`).
    #[serde(default = "default_bridges")]
    pub bridges: Vec<String>,
}

/// One storage definition.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StorageSeed {
    /// Storage id (`local`).
    pub storage: String,
    /// Plugin type: `dir`, `nfs`, `cifs`, `cephfs` (file based) or `lvmthin`, `lvm`,
    /// `zfspool`, `rbd` (block based).
    #[serde(rename = "type")]
    pub kind: String,
    /// Content types, e.g. `["iso", "vztmpl"]`.
    pub content: Vec<String>,
    /// Limit to these nodes; all nodes when absent.
    #[serde(default)]
    pub nodes: Option<Vec<String>>,
    /// Shared storages hold one set of volumes for all nodes.
    #[serde(default)]
    pub shared: bool,
    /// Mount path of file based storages (default `/var/lib/vz` for `local`,
    /// `/mnt/pve/<storage>` otherwise).
    #[serde(default)]
    pub path: Option<String>,
    /// Capacity in bytes.
    #[serde(default = "default_storage_size")]
    pub total: u64,
    /// `false` disables the storage (`storage.cfg` `disable`).
    #[serde(default = "default_true")]
    pub enabled: bool,
}

/// One user with optional API tokens.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserSeed {
    /// `name@realm`.
    pub userid: String,
    /// Password for `/access/ticket`; no ticket login when absent.
    #[serde(default)]
    pub password: Option<String>,
    /// API tokens of this user.
    #[serde(default)]
    pub tokens: Vec<TokenSeed>,
}

/// One API token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TokenSeed {
    /// Token id (the part after `!`).
    pub id: String,
    /// Secret sent in the `PVEAPIToken` header.
    pub secret: String,
    /// Privilege separation (PVE's default): the token holds what ACL entries grant the
    /// token itself, limited to what its user holds. `false`: exactly its user's privileges.
    #[serde(default = "default_true")]
    pub privsep: bool,
}

/// A group of users.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GroupSeed {
    /// Group id.
    pub groupid: String,
    /// Member user ids (`name@realm`).
    #[serde(default)]
    pub members: Vec<String>,
}

/// A custom role.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RoleSeed {
    /// Role id.
    pub roleid: String,
    /// Its privileges, e.g. `["VM.Audit", "Datastore.Audit"]`.
    pub privs: Vec<String>,
}

/// One ACL entry, in the shape `GET /access/acl` answers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AclSeed {
    /// ACL path, e.g. `/storage/local` or `/vms`.
    pub path: String,
    /// A built-in or seeded role.
    pub roleid: String,
    /// `user`, `group` or `token`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The user id, group id or full token id (`user@realm!id`).
    pub ugid: String,
    /// Whether the grant is inherited by paths below (PVE's default).
    #[serde(default = "default_true")]
    pub propagate: bool,
}

/// A file present on a storage at start.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VolumeSeed {
    /// Node holding it (ignored for shared storages).
    pub node: String,
    /// Full volume id, e.g. `local:iso/debian-13.iso`.
    pub volid: String,
    /// Size in bytes.
    #[serde(default = "default_file_size")]
    pub size: u64,
}

/// A guest present at start.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GuestSeed {
    /// Guest id.
    pub vmid: u32,
    /// `qemu` or `lxc`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Node holding it.
    pub node: String,
    /// Config keys as PVE stores them (volumes are created for allocated disks).
    #[serde(default)]
    pub config: std::collections::BTreeMap<String, String>,
    /// Whether it runs.
    #[serde(default)]
    pub running: bool,
}

fn default_cluster_name() -> String {
    "proxops-sim".to_string()
}
fn default_cpus() -> u32 {
    8
}
fn default_node_mem() -> u64 {
    32 * 1024 * 1024 * 1024
}
fn default_true() -> bool {
    true
}
fn default_bridges() -> Vec<String> {
    vec!["vmbr0".to_string()]
}
fn default_storage_size() -> u64 {
    512 * 1024 * 1024 * 1024
}
fn default_file_size() -> u64 {
    1024 * 1024
}

impl Default for Seed {
    /// Nodes `pve1`..`pve3`, each with `local` (dir: iso, vztmpl, import, backup, snippets)
    /// and `local-lvm` (lvmthin: images, rootdir); no extra users, pools, files or guests.
    fn default() -> Self {
        let node = |name: &str| NodeSeed {
            name: name.to_string(),
            maxcpu: default_cpus(),
            maxmem: default_node_mem(),
            online: true,
            bridges: default_bridges(),
        };
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect();
        Self {
            cluster_name: default_cluster_name(),
            nodes: vec![node("pve1"), node("pve2"), node("pve3")],
            storages: vec![
                StorageSeed {
                    storage: "local".to_string(),
                    kind: "dir".to_string(),
                    content: strings(&["iso", "vztmpl", "import", "backup", "snippets"]),
                    nodes: None,
                    shared: false,
                    path: Some("/var/lib/vz".to_string()),
                    total: 100 * 1024 * 1024 * 1024,
                    enabled: true,
                },
                StorageSeed {
                    storage: "local-lvm".to_string(),
                    kind: "lvmthin".to_string(),
                    content: strings(&["images", "rootdir"]),
                    nodes: None,
                    shared: false,
                    path: None,
                    total: default_storage_size(),
                    enabled: true,
                },
            ],
            users: Vec::new(),
            groups: Vec::new(),
            roles: Vec::new(),
            acl: Vec::new(),
            pools: Vec::new(),
            volumes: Vec::new(),
            guests: Vec::new(),
            datacenter: DatacenterSeed::default(),
            ha: HaSeed::default(),
            task_durations_ms: BTreeMap::new(),
        }
    }
}

impl Seed {
    /// A seed shaped like a fresh 3-node PVE 9 cluster on 1 TB system disks with a NAS:
    /// nodes `pve1`..`pve3` (32 threads, 128 GiB each) with `vmbr0`; per node the installer's
    /// `local` (dir `/var/lib/vz`, 94 GiB: the root LV) and `local-lvm` (lvmthin, 832 GiB:
    /// the `data` thin pool), and a shared NFS storage `nas` (4 TiB) for ISOs, templates,
    /// import images and backups; task durations with a real cluster's ratios
    /// (`REALISTIC_TASK_MS` in this module; scale with [`Seed::with_task_time_scale`]).
    ///
    /// PVE's installer gives `local` the content `iso,vztmpl,backup` and `local-lvm`
    /// `rootdir,images` (pve-installer's storage.cfg); this seed adds `import` and `snippets`
    /// to `local`, as an operator enabling DiskImages and cloud-init snippets does. `shared`
    /// is set for `nas` as pve-storage forces it for NFS (`src/PVE/Storage/Plugin.pm`
    /// `parse_config`, `@SHARED_STORAGE`).
    pub fn realistic_3node() -> Self {
        const GIB: u64 = 1024 * 1024 * 1024;
        let node = |name: &str| NodeSeed {
            name: name.to_string(),
            maxcpu: 32,
            maxmem: 128 * GIB,
            online: true,
            bridges: default_bridges(),
        };
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect();
        let storage =
            |id: &str, kind: &str, content: &[&str], path: Option<&str>, total| StorageSeed {
                storage: id.to_string(),
                kind: kind.to_string(),
                content: strings(content),
                nodes: None,
                shared: kind == "nfs",
                path: path.map(str::to_string),
                total,
                enabled: true,
            };
        Self {
            cluster_name: "pve-cluster".to_string(),
            nodes: vec![node("pve1"), node("pve2"), node("pve3")],
            storages: vec![
                storage(
                    "local",
                    "dir",
                    &["iso", "vztmpl", "backup", "import", "snippets"],
                    Some("/var/lib/vz"),
                    94 * GIB,
                ),
                storage(
                    "local-lvm",
                    "lvmthin",
                    &["rootdir", "images"],
                    None,
                    832 * GIB,
                ),
                storage(
                    "nas",
                    "nfs",
                    &["iso", "vztmpl", "import", "backup"],
                    Some("/mnt/pve/nas"),
                    4096 * GIB,
                ),
            ],
            task_durations_ms: REALISTIC_TASK_MS
                .iter()
                .map(|(k, v)| ((*k).to_string(), *v))
                .collect(),
            ..Self::default()
        }
    }

    /// A built-in seed by name: `default` or [`REALISTIC_3NODE`].
    pub fn builtin(name: &str) -> Option<Self> {
        match name {
            "default" => Some(Self::default()),
            REALISTIC_3NODE => Some(Self::realistic_3node()),
            _ => None,
        }
    }

    /// The seed with every task duration multiplied by `factor` (0.25: four times faster,
    /// same ratios).
    #[must_use]
    pub fn with_task_time_scale(mut self, factor: f64) -> Self {
        for ms in self.task_durations_ms.values_mut() {
            // Durations of a few seconds: the cast cannot overflow or lose what matters.
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_precision_loss
            )]
            {
                *ms = ((*ms as f64) * factor.max(0.0)).round() as u64;
            }
        }
        self
    }
}

impl Seed {
    /// Reads a seed file: TOML when the name ends in `.toml`, JSON otherwise.
    pub fn from_file(path: &Path) -> Result<Self, SeedError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SeedError::Read {
            path: shown.clone(),
            source,
        })?;
        let seed: Seed = if path.extension().is_some_and(|e| e == "toml") {
            toml::from_str(&text).map_err(|source| SeedError::Toml {
                path: shown,
                source,
            })?
        } else {
            serde_json::from_str(&text).map_err(|source| SeedError::Json {
                path: shown,
                source,
            })?
        };
        seed.check()?;
        Ok(seed)
    }

    /// Checks references between the parts (nodes of storages, volumes and guests).
    pub fn check(&self) -> Result<(), SeedError> {
        let known_node = |n: &str| self.nodes.iter().any(|node| node.name == n);
        if self.nodes.is_empty() {
            return Err(SeedError::Invalid("no nodes".to_string()));
        }
        for s in &self.storages {
            for n in s.nodes.iter().flatten() {
                if !known_node(n) {
                    return Err(SeedError::Invalid(format!(
                        "storage '{}' names unknown node '{n}'",
                        s.storage
                    )));
                }
            }
        }
        for v in &self.volumes {
            if !known_node(&v.node) {
                return Err(SeedError::Invalid(format!(
                    "volume '{}' names unknown node '{}'",
                    v.volid, v.node
                )));
            }
        }
        self.check_access()?;
        if let Some(mode) = &self.datacenter.user_allow
            && !["free", "existing", "list", "none"].contains(&mode.as_str())
        {
            return Err(SeedError::Invalid(format!(
                "datacenter user-allow '{mode}': expected free, existing, list or none"
            )));
        }
        for g in &self.guests {
            if !known_node(&g.node) {
                return Err(SeedError::Invalid(format!(
                    "guest {} names unknown node '{}'",
                    g.vmid, g.node
                )));
            }
            if g.kind != "qemu" && g.kind != "lxc" {
                return Err(SeedError::Invalid(format!(
                    "guest {} has type '{}', expected qemu or lxc",
                    g.vmid, g.kind
                )));
            }
        }
        Ok(())
    }
}

impl Seed {
    /// Users, groups, roles and ACL entries refer to each other consistently.
    fn check_access(&self) -> Result<(), SeedError> {
        let invalid = |m: String| Err(SeedError::Invalid(m));
        let known_user =
            |u: &str| u == "root@pam" || self.users.iter().any(|user| user.userid == u);
        let known_token = |t: &str| {
            t == "root@pam!proxops"
                || t.split_once('!').is_some_and(|(u, id)| {
                    self.users
                        .iter()
                        .any(|user| user.userid == u && user.tokens.iter().any(|k| k.id == id))
                })
        };
        for g in &self.groups {
            for m in &g.members {
                if !known_user(m) {
                    return invalid(format!("group '{}' names unknown user '{m}'", g.groupid));
                }
            }
        }
        for r in &self.roles {
            if crate::acl::is_builtin_role(&r.roleid) {
                return invalid(format!("role '{}' is built in", r.roleid));
            }
            if let Some(p) = r.privs.iter().find(|p| !crate::acl::is_privilege(p)) {
                return invalid(format!("role '{}' names unknown privilege '{p}'", r.roleid));
            }
        }
        for (i, a) in self.acl.iter().enumerate() {
            let at = format!("acl[{i}] ({} {})", a.path, a.ugid);
            if !a.path.starts_with('/') {
                return invalid(format!("{at}: path must start with '/'"));
            }
            if !crate::acl::is_builtin_role(&a.roleid)
                && !self.roles.iter().any(|r| r.roleid == a.roleid)
            {
                return invalid(format!("{at}: unknown role '{}'", a.roleid));
            }
            let known = match a.kind.as_str() {
                "user" => known_user(&a.ugid),
                "token" => known_token(&a.ugid),
                "group" => self.groups.iter().any(|g| g.groupid == a.ugid),
                other => {
                    return invalid(format!(
                        "{at}: type '{other}', expected user, group or token"
                    ));
                }
            };
            if !known {
                return invalid(format!("{at}: unknown {} '{}'", a.kind, a.ugid));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_realistic_seed_round_trips_and_its_downloads_outlast_its_creates_and_starts() {
        let seed = Seed::builtin(REALISTIC_3NODE).unwrap();
        seed.check().unwrap();
        let toml_text = toml::to_string(&seed).unwrap();
        assert_eq!(toml::from_str::<Seed>(&toml_text).unwrap(), seed);
        let d = &seed.task_durations_ms;
        assert!(d["download"] > d["qmcreate"] && d["download"] > d["vzcreate"]);
        assert!(d["qmclone"] > d["qmcreate"] && d["qmcreate"] > d["qmstart"]);
        let fast = seed.clone().with_task_time_scale(0.25);
        assert_eq!(fast.task_durations_ms["download"], d["download"] / 4);
        assert!(seed.storages.iter().any(|s| s.storage == "nas" && s.shared));
    }

    #[test]
    fn the_default_seed_round_trips_through_toml_and_json() {
        let seed = Seed::default();
        let toml_text = toml::to_string(&seed).unwrap();
        assert_eq!(toml::from_str::<Seed>(&toml_text).unwrap(), seed);
        let json = serde_json::to_string(&seed).unwrap();
        assert_eq!(serde_json::from_str::<Seed>(&json).unwrap(), seed);
    }
}
