//! Privileges as pve-access-control computes them: roles (sets of privileges), ACL entries
//! (path, role, propagate; for a user, a group or an API token), and token privilege
//! separation. [`Acl::permissions`] is `RPCEnvironment::permissions` (what
//! `GET /access/permissions` reports and every check reads); [`Acl::check`] is
//! `RPCEnvironment::check_full` with PVE's 403 text. Which checks an endpoint makes lives with
//! the dispatcher and the handlers (`api/permission.rs`), not here.
//!
//! What `permissions` computes for an auth id and a path is kept ([`PermCache`]) until the
//! ACL changes: every check of a request reads it instead of walking the entries again. Every
//! method taking `&mut self` empties the cache.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use crate::error::ApiError;
use crate::seed::Seed;

/// privilege -> propagate flag (1 when a grant reaching the path propagates), as
/// `GET /access/permissions` answers it.
pub(crate) type Privs = BTreeMap<String, bool>;

/// The privilege groups of pve-access-control 9.x `AccessControl.pm` (`$privgroups`):
/// category, then its root-only, admin, user and audit privileges. Built-in roles are derived
/// from it as `create_roles` does.
const PRIVGROUPS: &[(&str, [&[&str]; 4])] = &[
    (
        "VM",
        [
            &[],
            &[
                "VM.Config.Disk",
                "VM.Config.CPU",
                "VM.Config.Memory",
                "VM.Config.Network",
                "VM.Config.HWType",
                "VM.Config.Options",
                "VM.Allocate",
                "VM.Clone",
                "VM.Migrate",
                "VM.Snapshot.Rollback",
                "VM.Replicate",
                "VM.GuestAgent.Unrestricted",
            ],
            &[
                "VM.Config.CDROM",
                "VM.Config.Cloudinit",
                "VM.Console",
                "VM.Backup",
                "VM.PowerMgmt",
                "VM.Snapshot",
                "VM.GuestAgent.Audit",
                "VM.GuestAgent.FileRead",
                "VM.GuestAgent.FileWrite",
                "VM.GuestAgent.FileSystemMgmt",
            ],
            &["VM.Audit"],
        ],
    ),
    (
        "Sys",
        [
            &[
                "Sys.PowerMgmt",
                "Sys.Modify",
                "Sys.Incoming",
                "Sys.AccessNetwork",
            ],
            &["Sys.Console", "Sys.Syslog"],
            &[],
            &["Sys.Audit"],
        ],
    ),
    (
        "Datastore",
        [
            &[],
            &["Datastore.Allocate", "Datastore.AllocateTemplate"],
            &["Datastore.AllocateSpace"],
            &["Datastore.Audit"],
        ],
    ),
    (
        "SDN",
        [&[], &["SDN.Allocate"], &["SDN.Use"], &["SDN.Audit"]],
    ),
    (
        "User",
        [
            &["Realm.Allocate"],
            &["User.Modify", "Group.Allocate", "Realm.AllocateUser"],
            &[],
            &[],
        ],
    ),
    ("Pool", [&[], &["Pool.Allocate"], &[], &["Pool.Audit"]]),
    (
        "Mapping",
        [
            &[],
            &["Mapping.Modify"],
            &["Mapping.Use"],
            &["Mapping.Audit"],
        ],
    ),
];

/// The privilege in no group (`$valid_privs` starts with it).
const UNGROUPED: &[&str] = &["Permissions.Modify"];

/// Paths `get_effective_permissions` always considers, besides every ACL path and pool.
const TOP_LEVEL_PATHS: &[&str] = &[
    "/",
    "/access",
    "/access/groups",
    "/nodes",
    "/pool",
    "/sdn",
    "/storage",
    "/vms",
];

/// Every privilege PVE knows.
pub(crate) fn all_privileges() -> BTreeSet<String> {
    PRIVGROUPS
        .iter()
        .flat_map(|(_, levels)| levels.iter().flat_map(|l| l.iter()))
        .chain(UNGROUPED)
        .map(|p| (*p).to_string())
        .collect()
}

/// Whether `name` is a privilege PVE knows.
pub(crate) fn is_privilege(name: &str) -> bool {
    all_privileges().contains(name)
}

/// What `root@pam` holds everywhere: every privilege, propagating.
static ROOT_PRIVS: LazyLock<Arc<Privs>> =
    LazyLock::new(|| Arc::new(all_privileges().into_iter().map(|p| (p, true)).collect()));

/// More (auth id, path) pairs than this and the cache starts over, so a simulator that runs
/// for long, over ever new guests, does not grow without bound.
const PERM_CACHE_LIMIT: usize = 100_000;

/// [`Acl::permissions`] results by auth id, then normalised path. A clone starts empty: it
/// is filled again from the clone's own entries.
#[derive(Debug, Default)]
struct PermCache {
    by_authid: Mutex<HashMap<String, HashMap<String, Arc<Privs>>>>,
}

impl Clone for PermCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PermCache {
    fn get(&self, authid: &str, path: &str) -> Option<Arc<Privs>> {
        let map = self
            .by_authid
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.get(authid)?.get(path).cloned()
    }

    fn put(&self, authid: &str, path: &str, privs: Arc<Privs>) {
        let mut map = self
            .by_authid
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if map.values().map(HashMap::len).sum::<usize>() >= PERM_CACHE_LIMIT {
            map.clear();
        }
        map.entry(authid.to_string())
            .or_default()
            .insert(path.to_string(), privs);
    }

    fn clear(&mut self) {
        self.by_authid
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// PVE's built-in roles, as `create_roles` derives them.
fn builtin_roles() -> BTreeMap<String, BTreeSet<String>> {
    let mut roles: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    roles.insert("NoAccess".into(), BTreeSet::new());
    roles.insert("Administrator".into(), all_privileges());
    let set = |ps: &[&[&str]]| -> BTreeSet<String> {
        ps.iter()
            .flat_map(|l| l.iter())
            .map(|p| (*p).to_string())
            .collect()
    };
    for (cat, [_, admin, user, audit]) in PRIVGROUPS {
        let admin_set = set(&[admin, user, audit]);
        roles
            .entry("PVEAdmin".into())
            .or_default()
            .extend(admin_set.iter().cloned());
        roles.insert(format!("PVE{cat}Admin"), admin_set);
        if !user.is_empty() {
            roles.insert(format!("PVE{cat}User"), set(&[user, audit]));
        }
        roles
            .entry("PVEAuditor".into())
            .or_default()
            .extend(set(&[audit]));
    }
    roles.insert("PVETemplateUser".into(), set(&[&["VM.Clone", "VM.Audit"]]));
    roles
}

/// Whether `roleid` is one of PVE's built-in roles.
pub(crate) fn is_builtin_role(roleid: &str) -> bool {
    builtin_roles().contains_key(roleid)
}

/// Who an ACL entry is for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Subject {
    User(String),
    Group(String),
    Token(String),
}

#[derive(Debug, Clone)]
struct Entry {
    path: String,
    subject: Subject,
    roleid: String,
    propagate: bool,
}

/// The tag settings of `datacenter.cfg` that `get_allowed_tags` reads (pve-guest-common
/// `src/PVE/GuestHelpers.pm` @ 4a8f6cb): `user-tag-access` (`user-allow`, default `free`;
/// `user-allow-list`) and `registered-tags`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TagAccess {
    /// `free`, `existing`, `list` or `none`.
    pub(crate) user_allow: String,
    pub(crate) allow_list: BTreeSet<String>,
    pub(crate) registered: BTreeSet<String>,
}

impl TagAccess {
    fn from_seed(seed: &Seed) -> Self {
        let dc = &seed.datacenter;
        Self {
            user_allow: dc.user_allow.clone().unwrap_or_else(|| "free".to_string()),
            allow_list: dc.user_allow_list.iter().cloned().collect(),
            registered: dc.registered_tags.iter().cloned().collect(),
        }
    }
}

/// Roles, groups, ACL entries and the privilege separation of every token.
#[derive(Debug, Clone, Default)]
pub(crate) struct Acl {
    roles: BTreeMap<String, BTreeSet<String>>,
    groups: BTreeMap<String, BTreeSet<String>>,
    entries: Vec<Entry>,
    /// tokenid -> privilege separation.
    privsep: BTreeMap<String, bool>,
    /// Who may set which guest tags.
    pub(crate) tags: TagAccess,
    /// pool -> its guests (`user.cfg` `pool:` lines), which inherit the pool's roles; kept in
    /// step with the cluster's pools by [`Acl::set_pool_members`].
    pool_members: BTreeMap<String, BTreeSet<u32>>,
    /// What [`Acl::permissions`] answered, until the next change.
    cache: PermCache,
}

impl Acl {
    /// Built from a checked seed; `root@pam!proxops` has no privilege separation.
    pub(crate) fn from_seed(seed: &Seed) -> Self {
        let mut roles = builtin_roles();
        for r in &seed.roles {
            roles.insert(r.roleid.clone(), r.privs.iter().cloned().collect());
        }
        let mut privsep = BTreeMap::from([("root@pam!proxops".to_string(), false)]);
        for u in &seed.users {
            for t in &u.tokens {
                privsep.insert(format!("{}!{}", u.userid, t.id), t.privsep);
            }
        }
        let entries = seed
            .acl
            .iter()
            .map(|a| Entry {
                path: normalize_path(&a.path),
                subject: match a.kind.as_str() {
                    "group" => Subject::Group(a.ugid.clone()),
                    "token" => Subject::Token(a.ugid.clone()),
                    _ => Subject::User(a.ugid.clone()),
                },
                roleid: a.roleid.clone(),
                propagate: a.propagate,
            })
            .collect();
        Self {
            roles,
            groups: seed
                .groups
                .iter()
                .map(|g| (g.groupid.clone(), g.members.iter().cloned().collect()))
                .collect(),
            entries,
            privsep,
            tags: TagAccess::from_seed(seed),
            pool_members: BTreeMap::new(),
            cache: PermCache::default(),
        }
    }

    /// The guests of each pool, as `user.cfg` holds them (what `compile_acl_path` reads).
    pub(crate) fn set_pool_members(&mut self, members: BTreeMap<String, BTreeSet<u32>>) {
        if self.pool_members != members {
            self.pool_members = members;
            // A guest joining or leaving a pool gains or loses the pool's roles.
            self.cache.clear();
        }
    }

    /// pve-access-control @ 5ccd07d `src/PVE/RPCEnvironment.pm` `compile_acl_path`: a guest
    /// in a pool gets the roles held on `/pool/<pool>` as roles on `/vms/<vmid>`, never
    /// propagating, and only those its own path does not already set; `NoAccess` on the path
    /// keeps everything out, `NoAccess` on the pool replaces what the path grants.
    fn with_pool_roles(
        &self,
        authid: &str,
        path: &str,
        mut roles: BTreeMap<String, bool>,
    ) -> BTreeMap<String, bool> {
        let Some(vmid) = path
            .strip_prefix("/vms/")
            .and_then(|v| v.parse::<u32>().ok())
        else {
            return roles;
        };
        let mut from_pools: BTreeSet<String> = BTreeSet::new();
        for (pool, members) in &self.pool_members {
            if members.contains(&vmid) {
                from_pools.extend(self.roles(authid, &format!("/pool/{pool}")).into_keys());
            }
        }
        if from_pools.is_empty() || roles.contains_key("NoAccess") {
            return roles;
        }
        if from_pools.contains("NoAccess") {
            return BTreeMap::from([("NoAccess".to_string(), false)]);
        }
        for role in from_pools {
            roles.entry(role).or_insert(false);
        }
        roles
    }

    /// Whether an ACL entry sits exactly on `path` (`find_acl_tree_node`), and the paths of
    /// entries directly below it (its `children`).
    pub(crate) fn children_of(&self, path: &str) -> Vec<String> {
        let path = normalize_path(path);
        let prefix = format!("{path}/");
        let mut out: BTreeSet<String> = BTreeSet::new();
        for e in &self.entries {
            if let Some(rest) = e.path.strip_prefix(&prefix) {
                let child = rest.split('/').next().unwrap_or(rest);
                out.insert(format!("{prefix}{child}"));
            }
        }
        out.into_iter().collect()
    }

    /// `AccessControl.pm` `roles`: walking from `/` to `path`, the most specific level with
    /// an applicable entry wins (token entries for a token; for a user its own entries, else
    /// its groups'); an entry on an ancestor applies only when it propagates. `NoAccess`
    /// overrides everything granted at the same level.
    fn roles(&self, authid: &str, path: &str) -> BTreeMap<String, bool> {
        let is_token = authid.contains('!');
        let mut roles: BTreeMap<String, bool> = BTreeMap::new();
        let levels = path_levels(path);
        let last = levels.len().saturating_sub(1);
        for (i, level) in levels.iter().enumerate() {
            let applies = |e: &&Entry| e.path == *level && (i == last || e.propagate);
            let collect = |pred: &dyn Fn(&Subject) -> bool| -> BTreeMap<String, bool> {
                self.entries
                    .iter()
                    .filter(applies)
                    .filter(|e| pred(&e.subject))
                    .map(|e| (e.roleid.clone(), e.propagate))
                    .collect()
            };
            if is_token {
                let found = collect(&|s| *s == Subject::Token(authid.to_string()));
                if !found.is_empty() {
                    roles = found;
                }
                continue;
            }
            let own = collect(&|s| *s == Subject::User(authid.to_string()));
            if !own.is_empty() {
                roles = own;
                continue;
            }
            let via_groups = collect(&|s| match s {
                Subject::Group(g) => self.groups.get(g).is_some_and(|m| m.contains(authid)),
                _ => false,
            });
            if !via_groups.is_empty() {
                roles = via_groups;
            }
        }
        if let Some(p) = roles.get("NoAccess") {
            return BTreeMap::from([("NoAccess".to_string(), *p)]);
        }
        roles
    }

    /// `AccessControl.pm` `permission`: the union of the roles' privileges, each flagged as
    /// propagating when any role granting it propagates.
    fn permission(&self, authid: &str, path: &str) -> Privs {
        let mut privs = Privs::new();
        let roles = self.with_pool_roles(authid, path, self.roles(authid, path));
        for (role, propagate) in roles {
            for p in self.roles.get(&role).into_iter().flatten() {
                let flag = privs.entry(p.clone()).or_insert(false);
                *flag |= propagate;
            }
        }
        privs
    }

    /// `RPCEnvironment::permissions`: everything for `root@pam`; a token without privilege
    /// separation holds its user's privileges, one with it the intersection of its own and
    /// its user's.
    pub(crate) fn permissions(&self, authid: &str, path: &str) -> Privs {
        Privs::clone(&self.permissions_shared(authid, path))
    }

    /// [`Acl::permissions`] from the cache, computed on the first ask after a change.
    fn permissions_shared(&self, authid: &str, path: &str) -> Arc<Privs> {
        if authid == "root@pam" {
            return Arc::clone(&ROOT_PRIVS);
        }
        let path = normalized(path);
        if let Some(privs) = self.cache.get(authid, &path) {
            return privs;
        }
        let privs = Arc::new(self.compute_permissions(authid, &path));
        self.cache.put(authid, &path, Arc::clone(&privs));
        privs
    }

    /// `RPCEnvironment::permissions` for a normalised path, without the cache.
    fn compute_permissions(&self, authid: &str, path: &str) -> Privs {
        if let Some((user, _)) = authid.split_once('!') {
            let Some(&privsep) = self.privsep.get(authid) else {
                return Privs::new();
            };
            let of_user = self.permissions_shared(user, path);
            if !privsep {
                return Privs::clone(&of_user);
            }
            let mut own = self.permission(authid, path);
            own.retain(|p, _| of_user.contains_key(p));
            return own;
        }
        self.permission(authid, path)
    }

    /// `get_effective_permissions`: every top-level path, every path of the ACL tree and
    /// every pool, and the guest of every pool (`paths referenced by pool definitions`), with
    /// the privileges held there; paths holding none are left out.
    pub(crate) fn effective(
        &self,
        authid: &str,
        pools: impl Iterator<Item = String>,
    ) -> BTreeMap<String, Privs> {
        let mut paths: BTreeSet<String> =
            TOP_LEVEL_PATHS.iter().map(|p| (*p).to_string()).collect();
        for e in &self.entries {
            paths.extend(path_levels(&e.path));
        }
        paths.extend(pools.map(|p| format!("/pool/{p}")));
        paths.extend(
            self.pool_members
                .values()
                .flatten()
                .map(|vmid| format!("/vms/{vmid}")),
        );
        paths
            .into_iter()
            .map(|p| {
                let privs = self.permissions(authid, &p);
                (p, privs)
            })
            .filter(|(_, privs)| !privs.is_empty())
            .collect()
    }

    /// `check_full`: all of `privs` on `path` (one of them with `any`), else PVE's 403
    /// `Permission check failed (<path>, <priv>)` naming the first missing privilege (with
    /// `any`, all of them joined by `|`).
    pub(crate) fn check(
        &self,
        authid: &str,
        path: &str,
        privs: &[&str],
        any: bool,
    ) -> Result<(), ApiError> {
        let path = normalized(path);
        let held = self.permissions_shared(authid, &path);
        if any {
            if privs.iter().any(|p| held.contains_key(*p)) {
                return Ok(());
            }
            return Err(perm_failure(Some(&format!("{path}, {}", privs.join("|")))));
        }
        match privs.iter().find(|p| !held.contains_key(**p)) {
            None => Ok(()),
            Some(p) => Err(perm_failure(Some(&format!("{path}, {p}")))),
        }
    }

    /// Whether the check passes (`check_full` with `$noerr`).
    pub(crate) fn holds(&self, authid: &str, path: &str, privs: &[&str], any: bool) -> bool {
        self.check(authid, path, privs, any).is_ok()
    }
}

/// `PVE::Exception` `raise_perm_exc`: 403 `Permission check failed[ (<what>)]\n`.
pub(crate) fn perm_failure(what: Option<&str>) -> ApiError {
    match what {
        Some(w) => ApiError::forbidden(format!("Permission check failed ({w})\n")),
        None => ApiError::forbidden("Permission check failed\n".to_string()),
    }
}

/// `AccessControl.pm` `normalize_path`: one leading slash, no doubled or trailing ones.
pub(crate) fn normalize_path(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    format!("/{}", parts.join("/"))
}

/// [`normalize_path`], without allocating when `path` is normalised already.
fn normalized(path: &str) -> Cow<'_, str> {
    let clean =
        path.starts_with('/') && (path == "/" || !path.ends_with('/')) && !path.contains("//");
    if clean {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(normalize_path(path))
    }
}

/// `/`, then each ancestor of `path` down to the path itself.
fn path_levels(path: &str) -> Vec<String> {
    let mut out = vec!["/".to_string()];
    let mut current = String::new();
    for part in path.split('/').filter(|s| !s.is_empty()) {
        current.push('/');
        current.push_str(part);
        out.push(current.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seed::{AclSeed, RoleSeed, TokenSeed, UserSeed};

    fn acl(path: &str, roleid: &str, kind: &str, ugid: &str, propagate: bool) -> AclSeed {
        AclSeed {
            path: path.into(),
            roleid: roleid.into(),
            kind: kind.into(),
            ugid: ugid.into(),
            propagate,
        }
    }

    /// `proxops@pve` with PVEVMAdmin on /vms and PVEDatastoreUser on /storage; its token
    /// `agent` (privilege separation) with a custom role on / and NoAccess on /storage/nas.
    fn seeded() -> Acl {
        let mut seed = Seed::default();
        seed.users.push(UserSeed {
            userid: "proxops@pve".into(),
            password: None,
            tokens: vec![TokenSeed {
                id: "agent".into(),
                secret: "s".into(),
                privsep: true,
            }],
        });
        seed.roles.push(RoleSeed {
            roleid: "Deploy".into(),
            privs: vec![
                "VM.Allocate".into(),
                "VM.Audit".into(),
                "Datastore.AllocateSpace".into(),
                "Datastore.AllocateTemplate".into(),
            ],
        });
        seed.acl = vec![
            acl("/vms", "PVEVMAdmin", "user", "proxops@pve", true),
            acl("/storage", "PVEDatastoreUser", "user", "proxops@pve", true),
            acl("/", "Deploy", "token", "proxops@pve!agent", true),
            acl(
                "/storage/nas",
                "NoAccess",
                "token",
                "proxops@pve!agent",
                true,
            ),
            acl("/nodes/pve1", "PVEAuditor", "user", "proxops@pve", false),
        ];
        seed.check().unwrap();
        Acl::from_seed(&seed)
    }

    #[test]
    fn root_and_its_unseparated_token_hold_every_privilege() {
        let a = seeded();
        for who in ["root@pam", "root@pam!proxops"] {
            let p = a.permissions(who, "/storage/local");
            assert_eq!(p.len(), all_privileges().len(), "{who}");
            assert!(p.values().all(|v| *v));
        }
    }

    #[test]
    fn a_separated_token_holds_the_intersection_with_its_user() {
        let a = seeded();
        let p = a.permissions("proxops@pve!agent", "/storage/local");
        // The token's role grants AllocateTemplate, its user's PVEDatastoreUser does not.
        assert_eq!(
            p.keys().collect::<Vec<_>>(),
            vec!["Datastore.AllocateSpace"]
        );
        assert_eq!(
            a.check(
                "proxops@pve!agent",
                "/storage/local",
                &["Datastore.AllocateTemplate"],
                false
            )
            .unwrap_err(),
            ApiError::Forbidden(
                "Permission check failed (/storage/local, Datastore.AllocateTemplate)\n".into()
            )
        );
        let vm = a.permissions("proxops@pve!agent", "/vms/100");
        assert_eq!(
            vm.keys().collect::<Vec<_>>(),
            vec!["VM.Allocate", "VM.Audit"]
        );
        assert!(
            a.permissions("proxops@pve!agent", "/storage/nas")
                .is_empty()
        );
    }

    #[test]
    fn grants_that_do_not_propagate_apply_to_their_path_only() {
        let a = seeded();
        // Held there, flagged as not propagating.
        assert!(!a.permissions("proxops@pve", "/nodes/pve1")["Sys.Audit"]);
        assert!(a.permissions("proxops@pve", "/nodes/pve1/x").is_empty());
        assert!(a.permissions("proxops@pve", "/nodes/pve2").is_empty());
    }

    #[test]
    fn effective_permissions_list_top_level_and_acl_paths_that_hold_something() {
        let a = seeded();
        let eff = a.effective("proxops@pve!agent", std::iter::empty());
        let paths: Vec<&String> = eff.keys().collect();
        // ACL paths: /, /nodes/pve1, /storage, /storage/nas (NoAccess), /vms. On / and
        // /nodes the token's role meets nothing its user holds; on /nodes/pve1 they share
        // VM.Audit.
        assert_eq!(paths, vec!["/nodes/pve1", "/storage", "/vms"]);
        assert_eq!(
            eff["/nodes/pve1"].keys().collect::<Vec<_>>(),
            vec!["VM.Audit"]
        );
        let user = a.effective("proxops@pve", std::iter::once("lab".to_string()));
        assert!(user.contains_key("/nodes/pve1"));
        assert!(!user.contains_key("/"));
    }

    #[test]
    fn any_checks_name_every_privilege() {
        let a = seeded();
        let e = a
            .check("proxops@pve", "/", &["Sys.Audit", "Sys.Modify"], true)
            .unwrap_err();
        assert_eq!(
            e.text(),
            "Permission check failed (/, Sys.Audit|Sys.Modify)"
        );
    }

    #[test]
    fn builtin_roles_follow_the_privilege_groups() {
        let roles = builtin_roles();
        assert!(roles["PVEDatastoreAdmin"].contains("Datastore.AllocateTemplate"));
        assert!(!roles["PVEDatastoreUser"].contains("Datastore.AllocateTemplate"));
        assert!(roles["PVEAuditor"].contains("Sys.Audit"));
        assert!(!roles["PVEAdmin"].contains("Sys.Modify"));
        assert!(roles["Administrator"].contains("Permissions.Modify"));
    }

    /// `ops@pve` with PVEVMUser on `/pool/lab` only, and NoAccess on `/vms/102`.
    fn pooled() -> Acl {
        let mut seed = Seed::default();
        seed.users.push(UserSeed {
            userid: "ops@pve".into(),
            password: None,
            tokens: Vec::new(),
        });
        seed.acl = vec![
            acl("/pool/lab", "PVEVMUser", "user", "ops@pve", true),
            acl("/vms/102", "NoAccess", "user", "ops@pve", false),
        ];
        seed.check().unwrap();
        let mut a = Acl::from_seed(&seed);
        a.set_pool_members(BTreeMap::from([(
            "lab".to_string(),
            BTreeSet::from([100, 102]),
        )]));
        a
    }

    #[test]
    fn a_guest_in_a_pool_holds_the_pools_roles_without_propagation() {
        let a = pooled();
        let p = a.permissions("ops@pve", "/vms/100");
        assert!(p.contains_key("VM.PowerMgmt"), "{p:?}");
        assert!(p.values().all(|propagate| !propagate), "{p:?}");
        // A guest outside the pool gets nothing from it.
        assert!(a.permissions("ops@pve", "/vms/101").is_empty());
        assert_eq!(
            a.check("ops@pve", "/vms/101", &["VM.PowerMgmt"], false)
                .unwrap_err()
                .text(),
            "Permission check failed (/vms/101, VM.PowerMgmt)"
        );
    }

    #[test]
    fn no_access_on_the_guest_keeps_the_pools_roles_out() {
        let a = pooled();
        assert!(a.permissions("ops@pve", "/vms/102").is_empty());
    }

    #[test]
    fn effective_permissions_list_the_guests_of_every_pool() {
        let a = pooled();
        let eff = a.effective("ops@pve", std::iter::once("lab".to_string()));
        assert!(eff.contains_key("/vms/100"), "{eff:?}");
        assert!(eff.contains_key("/pool/lab"), "{eff:?}");
        // Listed as a pool member, but NoAccess leaves it nothing: left out.
        assert!(!eff.contains_key("/vms/102"), "{eff:?}");
    }
    #[test]
    fn a_guest_joining_a_pool_after_a_first_check_holds_its_roles_on_the_next() {
        let mut a = pooled();
        let power = |a: &Acl| a.holds("ops@pve", "/vms/101", &["VM.PowerMgmt"], false);
        assert!(!power(&a));
        a.set_pool_members(BTreeMap::from([(
            "lab".to_string(),
            BTreeSet::from([100, 101, 102]),
        )]));
        assert!(power(&a));
        assert!(
            a.permissions("ops@pve", "/vms/101")
                .contains_key("VM.PowerMgmt")
        );
        a.set_pool_members(BTreeMap::from([(
            "lab".to_string(),
            BTreeSet::from([100, 102]),
        )]));
        assert!(!power(&a));
        assert!(a.permissions("ops@pve", "/vms/101").is_empty());
    }

    #[test]
    fn a_cloned_acl_answers_from_its_own_entries() {
        let a = pooled();
        assert!(a.holds("ops@pve", "/vms/100", &["VM.PowerMgmt"], false));
        let mut b = a.clone();
        b.set_pool_members(BTreeMap::new());
        assert!(!b.holds("ops@pve", "/vms/100", &["VM.PowerMgmt"], false));
        assert!(a.holds("ops@pve", "/vms/100", &["VM.PowerMgmt"], false));
    }

    #[test]
    fn paths_are_normalised_before_the_cache_is_asked() {
        for path in ["/", "", "vms/100", "/vms//100/", "//vms/100", "/vms/100"] {
            assert_eq!(normalized(path), normalize_path(path), "{path:?}");
        }
        let a = seeded();
        assert_eq!(
            a.permissions("proxops@pve", "vms//100/"),
            a.permissions("proxops@pve", "/vms/100")
        );
        assert_eq!(
            a.check("proxops@pve", "/nodes/pve2/", &["Sys.Audit"], false)
                .unwrap_err()
                .text(),
            "Permission check failed (/nodes/pve2, Sys.Audit)"
        );
    }
}
