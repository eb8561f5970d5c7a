//! The operator's scope (`[scope]` in agent.toml): what a repository may declare, adopt and
//! create. The repository cannot widen it: a manifest outside the scope makes the revision
//! invalid ([`check`], [`check_hosts`]); a plan never holds an action outside it
//! ([`restrict`]); and the executor refuses one anyway ([`Scope::refusal`]), so a live guest
//! outside the scope is never written (SECURITY-AUDIT H1, M4, L8).
//!
//! Every limit is optional. Without `[scope]`, any node, vmid, pool, storage and bridge is
//! allowed, as before; but no guest is adopted, no dangerous `extra` key, bind mount or PCI
//! passthrough is accepted, an `http://` artifact needs a checksum, an artifact host must
//! resolve to public addresses only, and at most [`DEFAULT_MAX_CREATES`] guests are created
//! per pass.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::ops::RangeInclusive;

use crate::diagnostic::Diagnostic;
use crate::manifest::yaml::{self, Node, RevisionBudget};
use crate::manifest::{ADOPT, Placement, Resource, Spec};
use crate::plan::{Action, Finding, FindingKind, Plan, Verb};
use crate::repository::DesiredState;
use crate::resource::ResourceId;

/// Default `[scope] max_creates`: guests created (or cloned) per pass.
pub const DEFAULT_MAX_CREATES: u32 = 50;

/// `extra` keys that reach outside the guest ProxOps allocated: host devices, host paths,
/// volumes of other guests, QEMU or LXC raw options, host scripts. Refused unless
/// `[scope] extra_keys` lists them. A trailing `*` matches any suffix; `lxc.*` any raw
/// LXC key. The disk and mount point keys name volumes or host paths that ProxOps did not
/// allocate (its own disks come from the structured fields).
pub const DANGEROUS_EXTRA_KEYS: &[&str] = &[
    "args",
    "hookscript",
    "cicustom",
    "hostpci*",
    "usb*",
    "serial*",
    "parallel*",
    "ide*",
    "sata*",
    "scsi*",
    "virtio*",
    "efidisk*",
    "tpmstate*",
    "unused*",
    "vmstate*",
    "rootfs",
    "mp*",
    "dev*",
    "lxc.*",
    "pool",
];

/// A set of vmids, written `"100-199,9000-9099"` (single ids too: `"100,105"`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmidRanges(Vec<RangeInclusive<u32>>);

impl VmidRanges {
    /// The empty set.
    pub fn none() -> Self {
        Self(Vec::new())
    }

    /// Parses `"100-199,9000-9099"`.
    ///
    /// # Errors
    /// A part that is not `N` or `N-M` with `N <= M`, as a lowercase fragment naming it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut ranges = Vec::new();
        for part in text.split(',').map(str::trim) {
            if part.is_empty() {
                continue;
            }
            let number = |s: &str| {
                s.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("`{part}` is not a vmid or a range `first-last` of vmids"))
            };
            let range = match part.split_once('-') {
                Some((first, last)) => number(first)?..=number(last)?,
                None => {
                    let id = number(part)?;
                    id..=id
                }
            };
            if range.start() > range.end() {
                return Err(format!("`{part}`: the first vmid is larger than the last"));
            }
            ranges.push(range);
        }
        Ok(Self(ranges))
    }

    /// Whether `vmid` is in the set.
    pub fn contains(&self, vmid: u32) -> bool {
        self.0.iter().any(|r| r.contains(&vmid))
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for VmidRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if r.start() == r.end() {
                write!(f, "{}", r.start())?;
            } else {
                write!(f, "{}-{}", r.start(), r.end())?;
            }
        }
        Ok(())
    }
}

/// The operator's scope. `None` for a list means "any".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// Nodes guests and artifacts may be placed on.
    pub nodes: Option<Vec<String>>,
    /// Vmids guests may have.
    pub vmids: Option<VmidRanges>,
    /// PVE pools a guest may be declared in (`spec.pool`).
    pub pools: Option<Vec<String>>,
    /// Storages disks, volumes and artifacts may be on.
    pub storages: Option<Vec<String>>,
    /// Bridges NICs may be on.
    pub bridges: Option<Vec<String>>,
    /// Dangerous `spec.extra` keys ([`DANGEROUS_EXTRA_KEYS`]) allowed all the same (patterns
    /// with a trailing `*`); every other key is allowed.
    pub extra_keys: Vec<String>,
    /// Folders under which an LXC bind mount's host path may be (default none: no bind
    /// mounts).
    pub host_paths: Vec<String>,
    /// Artifact download hosts: `None` allows any host that resolves to public addresses
    /// only; a list allows only its hosts, whatever they resolve to.
    pub artifact_hosts: Option<Vec<String>>,
    /// Whether an `http://` artifact may have no checksum (test rigs).
    pub allow_http_without_checksum: bool,
    /// Vmids a manifest may adopt with `proxops/adopt: "true"` (default none).
    pub adopt: VmidRanges,
    /// Guests created or cloned per pass; the rest wait for a later pass.
    pub max_creates: u32,
}

impl Default for Scope {
    /// No `[scope]` table: see the module documentation.
    fn default() -> Self {
        Self {
            nodes: None,
            vmids: None,
            pools: None,
            storages: None,
            bridges: None,
            extra_keys: Vec::new(),
            host_paths: Vec::new(),
            artifact_hosts: None,
            allow_http_without_checksum: false,
            adopt: VmidRanges::none(),
            max_creates: DEFAULT_MAX_CREATES,
        }
    }
}

/// Whether `key` matches `pattern` (exact, or a prefix when the pattern ends in `*`).
fn matches(pattern: &str, key: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => key.starts_with(prefix),
        None => pattern == key,
    }
}

/// The dangerous pattern `key` matches, if any.
pub fn dangerous(key: &str) -> Option<&'static str> {
    DANGEROUS_EXTRA_KEYS
        .iter()
        .copied()
        .find(|pattern| matches(pattern, key))
}

fn listed(list: Option<&Vec<String>>, value: &str) -> bool {
    list.is_none_or(|list| list.iter().any(|v| v == value))
}

fn shown(list: &[String]) -> String {
    if list.is_empty() {
        "[]".to_owned()
    } else {
        format!(
            "[{}]",
            list.iter()
                .map(|v| format!("\"{v}\""))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// Whether `path` is `folder` or below it, component-wise (`/srv/a` is not under `/srv/ab`).
fn under(path: &str, folder: &str) -> bool {
    let folder = folder.trim_end_matches('/');
    if folder.is_empty() {
        return path.starts_with('/');
    }
    path == folder
        || path
            .strip_prefix(folder)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// One problem before it is located.
struct Violation<'r> {
    resource: &'r Resource,
    field: String,
    message: String,
    help: String,
}

impl Scope {
    /// Whether `vmid` is in `vmids`.
    pub fn allows_vmid(&self, vmid: u32) -> bool {
        self.vmids.as_ref().is_none_or(|v| v.contains(vmid))
    }

    /// Whether `node` is in `nodes`.
    pub fn allows_node(&self, node: &str) -> bool {
        listed(self.nodes.as_ref(), node)
    }

    /// Whether `key` may pass through `spec.extra`.
    pub fn allows_extra(&self, key: &str) -> bool {
        dangerous(key).is_none() || self.extra_keys.iter().any(|p| matches(p, key))
    }

    /// Why the executor refuses `action`, if it is outside the scope: a guest on a node or
    /// with a vmid the scope does not include, or a download to such a node or storage.
    /// Defence in depth: [`check`] and [`restrict`] keep such actions out of plans.
    pub fn refusal(&self, action: &Action) -> Option<String> {
        if !self.allows_node(&action.node) {
            return Some(format!(
                "refused: node {} is outside [scope] nodes in the agent config",
                action.node
            ));
        }
        let vmid = match &action.verb {
            Verb::Download(d) => {
                if !listed(self.storages.as_ref(), &d.storage) {
                    return Some(format!(
                        "refused: storage {} is outside [scope] storages in the agent config",
                        d.storage
                    ));
                }
                if d.url.starts_with("http://")
                    && d.checksum.is_none()
                    && !self.allow_http_without_checksum
                {
                    return Some(
                        "refused: an http:// download without a checksum ([scope] allow_http_without_checksum is off)".to_owned(),
                    );
                }
                return url_host(&d.url)
                    .and_then(|host| self.host_problem(host, None))
                    .map(|(message, _)| format!("refused: {message}"));
            }
            // Cloud-init snippet files (issue 21): their storage must be in scope too.
            Verb::WriteSnippet(s) | Verb::RemoveSnippet(s) => {
                return (!listed(self.storages.as_ref(), &s.storage)).then(|| {
                    format!(
                        "refused: storage {} is outside [scope] storages in the agent config",
                        s.storage
                    )
                });
            }
            Verb::Create(c) => c.vmid,
            Verb::Clone(c) => c.vmid,
            Verb::Update(u) => u.vmid,
            Verb::Pool(p) => {
                if !listed(self.pools.as_ref(), &p.pool) {
                    return Some(format!(
                        "refused: pool {} is outside [scope] pools in the agent config",
                        p.pool
                    ));
                }
                p.vmid
            }
            Verb::Shutdown(g)
            | Verb::Promote(g)
            | Verb::Start(g)
            | Verb::Reboot(g)
            | Verb::Delete(g) => g.vmid,
        };
        (!self.allows_vmid(vmid))
            .then(|| format!("refused: vmid {vmid} is outside [scope] vmids in the agent config"))
    }

    fn violations<'r>(&self, resource: &'r Resource, out: &mut Vec<Violation<'r>>) {
        let mut push = |field: String, message: String, help: String| {
            out.push(Violation {
                resource,
                field,
                message,
                help,
            });
        };
        let node = |field: String, node: &str, push: &mut dyn FnMut(String, String, String)| {
            if !self.allows_node(node) {
                let nodes = self.nodes.as_deref().unwrap_or_default();
                push(
                    field,
                    format!(
                        "node `{node}` is outside the operator's scope: [scope] nodes = {} in the agent config",
                        shown(nodes)
                    ),
                    format!(
                        "add \"{node}\" to [scope] nodes in agent.toml, or place the resource on one of those nodes"
                    ),
                );
            }
        };
        let storage = |field: String,
                       storage: &str,
                       push: &mut dyn FnMut(String, String, String)| {
            if !listed(self.storages.as_ref(), storage) {
                let storages = self.storages.as_deref().unwrap_or_default();
                push(
                    field,
                    format!(
                        "storage `{storage}` is outside the operator's scope: [scope] storages = {} in the agent config",
                        shown(storages)
                    ),
                    format!(
                        "add \"{storage}\" to [scope] storages in agent.toml, or use one of those storages"
                    ),
                );
            }
        };
        let bridge = |field: String, bridge: &str, push: &mut dyn FnMut(String, String, String)| {
            if !listed(self.bridges.as_ref(), bridge) {
                let bridges = self.bridges.as_deref().unwrap_or_default();
                push(
                    field,
                    format!(
                        "bridge `{bridge}` is outside the operator's scope: [scope] bridges = {} in the agent config",
                        shown(bridges)
                    ),
                    format!(
                        "add \"{bridge}\" to [scope] bridges in agent.toml, or use one of those bridges"
                    ),
                );
            }
        };
        let extra = |extra: &BTreeMap<String, String>,
                     push: &mut dyn FnMut(String, String, String)| {
            for key in extra.keys() {
                if self.allows_extra(key) {
                    continue;
                }
                let field = format!("spec.extra.{key}");
                let pattern = dangerous(key).unwrap_or(key);
                push(
                    field,
                    format!(
                        "`{key}` is a dangerous PVE key (`{pattern}`: it reaches host devices, host paths, other guests' volumes or raw options) and [scope] extra_keys = {} in the agent config does not list it",
                        shown(&self.extra_keys)
                    ),
                    format!(
                        "remove it, or have the operator add \"{key}\" (or \"{pattern}\") to [scope] extra_keys in agent.toml"
                    ),
                );
            }
        };
        match &resource.placement {
            Placement::Guest { node: n, vmid, .. } => {
                node("spec.node".to_owned(), n, &mut push);
                if !self.allows_vmid(*vmid) {
                    let vmids = self.vmids.clone().unwrap_or_default();
                    push(
                        "spec.vmid".to_owned(),
                        format!(
                            "vmid {vmid} is outside the operator's scope: [scope] vmids = \"{vmids}\" in the agent config"
                        ),
                        format!(
                            "use a vmid in \"{vmids}\", or add {vmid} to [scope] vmids in agent.toml"
                        ),
                    );
                }
                if resource.annotations.get(ADOPT).map(String::as_str) == Some("true")
                    && !self.adopt.contains(*vmid)
                {
                    push(
                        format!("metadata.annotations.{ADOPT}"),
                        format!(
                            "adopting vmid {vmid} is outside the operator's scope: [scope] adopt = \"{}\" in the agent config, and a manifest alone cannot take over a guest",
                            self.adopt
                        ),
                        format!(
                            "have the operator add {vmid} to [scope] adopt in agent.toml, or remove the annotation"
                        ),
                    );
                }
            }
            Placement::Artifact {
                nodes, storage: s, ..
            } => {
                for (i, n) in nodes.iter().enumerate() {
                    node(format!("spec.nodes[{i}]"), n, &mut push);
                }
                storage("spec.storage".to_owned(), s, &mut push);
            }
        }
        match &resource.spec {
            Some(Spec::Vm(vm)) => {
                for (i, disk) in vm.disks.iter().enumerate() {
                    storage(
                        format!("spec.disks[{i}].storage"),
                        disk.storage.as_str(),
                        &mut push,
                    );
                }
                let hw = &vm.hardware;
                if let Some(efi) = &hw.efi_disk {
                    storage(
                        "spec.hardware.efi-disk.storage".to_owned(),
                        efi.storage.as_str(),
                        &mut push,
                    );
                }
                if let Some(tpm) = &hw.tpm {
                    storage(
                        "spec.hardware.tpm.storage".to_owned(),
                        tpm.storage.as_str(),
                        &mut push,
                    );
                }
                if let Some(ci) = &hw.cloud_init {
                    storage(
                        "spec.hardware.cloud-init.storage".to_owned(),
                        ci.storage.as_str(),
                        &mut push,
                    );
                }
                if !hw.pci_devices.is_empty() && !self.allows_extra("hostpci0") {
                    push(
                        "spec.hardware.pci-devices".to_owned(),
                        "PCI passthrough hands a host device to the guest, and [scope] extra_keys in the agent config does not list `hostpci*`".to_owned(),
                        "remove it, or have the operator add \"hostpci*\" to [scope] extra_keys in agent.toml".to_owned(),
                    );
                }
                for (i, nic) in vm.networks.iter().enumerate() {
                    bridge(format!("spec.networks[{i}].bridge"), &nic.bridge, &mut push);
                }
                extra(&vm.extra, &mut push);
            }
            Some(Spec::Lxc(ct)) => {
                storage(
                    "spec.root.storage".to_owned(),
                    ct.root.storage.as_str(),
                    &mut push,
                );
                for (i, mp) in ct.mount_points.iter().enumerate() {
                    storage(
                        format!("spec.mount-points[{i}].storage"),
                        mp.storage.as_str(),
                        &mut push,
                    );
                }
                for (i, bind) in ct.bind_mounts.iter().enumerate() {
                    if !self.host_paths.iter().any(|f| under(&bind.host_path, f)) {
                        push(
                            format!("spec.bind-mounts[{i}].host-path"),
                            format!(
                                "host path `{}` is outside the operator's scope: [scope] host_paths = {} in the agent config",
                                bind.host_path,
                                shown(&self.host_paths)
                            ),
                            "remove the bind mount, or have the operator add its folder to [scope] host_paths in agent.toml".to_owned(),
                        );
                    }
                }
                for (i, nic) in ct.networks.iter().enumerate() {
                    bridge(format!("spec.networks[{i}].bridge"), &nic.bridge, &mut push);
                }
                extra(&ct.extra, &mut push);
            }
            Some(Spec::Artifact(a)) => {
                if a.url.starts_with("http://")
                    && a.checksum.is_none()
                    && !self.allow_http_without_checksum
                {
                    push(
                        "spec.url".to_owned(),
                        "an `http://` download has no checksum, so anyone on the path can replace the file".to_owned(),
                        "add `checksum: {algorithm: sha256, value: …}` (the published digest), or use an `https://` URL".to_owned(),
                    );
                }
                if let Some(host) = url_host(&a.url)
                    && let Some(problem) = self.host_problem(host, None)
                {
                    push("spec.url".to_owned(), problem.0, problem.1);
                }
            }
            None => {}
        }
    }

    /// Why downloads from `host` are refused, when its addresses (`resolved`, or the host
    /// itself when it is an IP literal) are not all public and the host is not listed, or
    /// when `artifact_hosts` lists other hosts only: (message, help).
    fn host_problem(&self, host: &str, resolved: Option<&[IpAddr]>) -> Option<(String, String)> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Some(list) = &self.artifact_hosts {
            if list.iter().any(|h| h.eq_ignore_ascii_case(bare)) {
                return None;
            }
            return Some((
                format!(
                    "download host `{bare}` is not in [scope] artifact_hosts = {} in the agent config",
                    shown(list)
                ),
                format!(
                    "download from a listed host, or add \"{bare}\" to [scope] artifact_hosts in agent.toml"
                ),
            ));
        }
        let literal: Vec<IpAddr> = bare.parse::<IpAddr>().into_iter().collect();
        let addresses = resolved.unwrap_or(&literal);
        let internal = addresses.iter().find(|a| !is_public(**a))?;
        Some((
            format!(
                "download host `{bare}` resolves to {internal}, an internal address (loopback, private, link-local or this node's), and [scope] artifact_hosts in the agent config does not list it"
            ),
            format!(
                "download from a public host, or have the operator add \"{bare}\" to [scope] artifact_hosts in agent.toml"
            ),
        ))
    }
}

/// The host of an `http(s)://` URL (without port and user info).
pub fn url_host(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if authority.starts_with('[') {
        authority
            .split_once(']')
            .map_or(authority, |(h, _)| h)
            .trim_start_matches('[')
    } else {
        authority.split(':').next().unwrap_or(authority)
    };
    (!host.is_empty()).then_some(host)
}

/// Whether `address` is a public unicast address: not loopback, private, link-local,
/// unique-local, CGNAT, unspecified, multicast, broadcast or documentation.
pub fn is_public(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b)))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80)
        }
    }
}

/// Every resource of `state` outside `scope`, as errors located at the field in the
/// revision's `files` (the same files `state` was loaded from), naming the scope key and
/// what to change. Artifact hosts given as IP literals are checked here; host names are
/// resolved by the caller ([`check_hosts`]).
pub fn check(
    scope: &Scope,
    state: &DesiredState,
    files: &BTreeMap<String, String>,
) -> Vec<Diagnostic> {
    let mut violations = Vec::new();
    for resource in state.manifest.resources() {
        scope.violations(resource, &mut violations);
    }
    if let Some(pools) = &scope.pools {
        pool_violations(pools, state, files, &mut violations);
    }
    locate(violations, files)
}

/// Every artifact host of `state` that is not listed in `artifact_hosts` and resolves (by
/// `resolve`) to an internal address or to one of `own` (this node's addresses), or does
/// not resolve at all, as errors located at `spec.url`. IP literals are left to [`check`].
pub fn check_hosts(
    scope: &Scope,
    state: &DesiredState,
    files: &BTreeMap<String, String>,
    own: &[IpAddr],
    mut resolve: impl FnMut(&str) -> Result<Vec<IpAddr>, String>,
) -> Vec<Diagnostic> {
    if scope.artifact_hosts.is_some() {
        // A list is an allow-list: `check` already refused every other host.
        return Vec::new();
    }
    let mut answers: BTreeMap<String, Result<Vec<IpAddr>, String>> = BTreeMap::new();
    let mut violations = Vec::new();
    for resource in state.manifest.resources() {
        let Some(Spec::Artifact(a)) = &resource.spec else {
            continue;
        };
        let Some(host) = url_host(&a.url) else {
            continue;
        };
        if host.parse::<IpAddr>().is_ok() {
            continue;
        }
        let answer = answers
            .entry(host.to_ascii_lowercase())
            .or_insert_with(|| resolve(host));
        let (message, help) = match answer {
            Err(error) => (
                format!(
                    "download host `{host}` does not resolve ({error}), so it cannot be checked against [scope] artifact_hosts in the agent config"
                ),
                format!(
                    "check the URL, or have the operator list \"{host}\" in [scope] artifact_hosts in agent.toml"
                ),
            ),
            Ok(addresses) => {
                if let Some(problem) = scope.host_problem(host, Some(addresses)) {
                    problem
                } else if let Some(mine) = addresses.iter().find(|a| own.contains(a)) {
                    (
                        format!(
                            "download host `{host}` resolves to {mine}, an address of this node, and [scope] artifact_hosts in the agent config does not list it"
                        ),
                        format!(
                            "download from a public host, or have the operator add \"{host}\" to [scope] artifact_hosts in agent.toml"
                        ),
                    )
                } else {
                    continue;
                }
            }
        };
        violations.push(Violation {
            resource,
            field: "spec.url".to_owned(),
            message,
            help,
        });
    }
    locate(violations, files)
}

/// `spec.pool` of every guest, read from its document, against `pools`.
fn pool_violations<'r>(
    pools: &[String],
    state: &'r DesiredState,
    files: &BTreeMap<String, String>,
    out: &mut Vec<Violation<'r>>,
) {
    for_each_root(state, files, |resource, root| {
        let pool = root
            .get("spec")
            .and_then(|spec| spec.get("pool"))
            .and_then(Node::as_str);
        if let (Placement::Guest { .. }, Some(pool)) = (&resource.placement, pool)
            && !pools.iter().any(|p| p == pool)
        {
            out.push(Violation {
                resource,
                field: "spec.pool".to_owned(),
                message: format!(
                    "pool `{pool}` is outside the operator's scope: [scope] pools = {} in the agent config",
                    shown(pools)
                ),
                help: format!("add \"{pool}\" to [scope] pools in agent.toml, or use one of those pools"),
            });
        }
    });
}

/// Calls `each` with every resource of `state` and its document's tree, reading only the
/// files that hold them. A document is matched to its resource by where `metadata.name` is.
fn for_each_root<'r>(
    state: &'r DesiredState,
    files: &BTreeMap<String, String>,
    mut each: impl FnMut(&'r Resource, &Node),
) {
    let mut by_file: BTreeMap<&str, Vec<&'r Resource>> = BTreeMap::new();
    for resource in state.manifest.resources() {
        by_file
            .entry(resource.path.as_str())
            .or_default()
            .push(resource);
    }
    for (path, resources) in by_file {
        let Some(text) = files.get(path) else {
            continue;
        };
        yaml::for_each_document(path, text, &RevisionBudget::default(), |doc| {
            let Some(root) = doc.root else {
                return;
            };
            let at = root.locate("metadata.name").location;
            if let Some(resource) = resources.iter().find(|r| r.location == at) {
                each(resource, &root);
            }
        });
    }
}

/// Turns violations into diagnostics located at their field (or its nearest parent).
fn locate(violations: Vec<Violation<'_>>, files: &BTreeMap<String, String>) -> Vec<Diagnostic> {
    if violations.is_empty() {
        return Vec::new();
    }
    let wanted: BTreeSet<&str> = violations
        .iter()
        .map(|v| v.resource.path.as_str())
        .collect();
    let mut roots: BTreeMap<(String, usize, usize), Node> = BTreeMap::new();
    for path in wanted {
        let Some(text) = files.get(path) else {
            continue;
        };
        yaml::for_each_document(path, text, &RevisionBudget::default(), |doc| {
            if let Some(root) = doc.root {
                let at = root.locate("metadata.name").location;
                roots.insert((path.to_owned(), at.line, at.column), root);
            }
        });
    }
    let mut out: Vec<Diagnostic> = violations
        .into_iter()
        .map(|v| {
            let r = v.resource;
            let key = (r.path.clone(), r.location.line, r.location.column);
            let at = roots
                .get(&key)
                .map_or(r.location, |root| locate_field(root, &v.field));
            Diagnostic::error(&r.path, at.line, at.column, &v.field, v.message).with_help(v.help)
        })
        .collect();
    crate::diagnostic::sort_diagnostics(&mut out);
    out
}

/// Where `field` is in `root`: its value, or for an annotation (a key with `/`), the value
/// under `metadata.annotations`.
fn locate_field(root: &Node, field: &str) -> crate::manifest::Location {
    if let Some(key) = field.strip_prefix("metadata.annotations.")
        && let Some(node) = root
            .get("metadata")
            .and_then(|m| m.get("annotations"))
            .and_then(|a| a.get(key))
    {
        return node.location;
    }
    if let Some(key) = field.strip_prefix("spec.extra.")
        && let Some(node) = root
            .get("spec")
            .and_then(|s| s.get("extra"))
            .and_then(|e| e.key_node(key))
    {
        return node.location;
    }
    root.locate(field).location
}

/// The plan without what the scope does not allow: actions on a guest outside `nodes` or
/// `vmids` (a prune of an owned guest there) become `out-of-scope` findings, and creates and
/// clones beyond `max_creates` wait for a later pass as `deferred` findings, with every
/// action of the same resource and of the resources that depend on it.
pub fn restrict(scope: &Scope, desired: &DesiredState, plan: Plan) -> Plan {
    let Plan {
        levels,
        mut findings,
        mut blocked,
        aborted,
    } = plan;
    let max = usize::try_from(scope.max_creates).unwrap_or(usize::MAX);
    let mut creates = 0usize;
    let mut waiting: BTreeSet<(ResourceId, String)> = BTreeSet::new();
    let mut kept_levels = Vec::with_capacity(levels.len());
    for level in levels {
        let mut kept = Vec::with_capacity(level.len());
        for action in level {
            let key = (action.resource.clone(), action.node.clone());
            if let Some(reason) = scope.refusal(&action) {
                findings.push(finding(
                    &action,
                    FindingKind::OutOfScope,
                    format!(
                        "{} {} is not done: {}",
                        action.verb.name(),
                        action.resource,
                        reason.trim_start_matches("refused: ")
                    ),
                ));
                continue;
            }
            if waiting.contains(&key) {
                continue;
            }
            if let Some(on) = depends_on_waiting(desired, &action, &waiting) {
                findings.push(finding(
                    &action,
                    FindingKind::Deferred,
                    format!(
                        "{} of {} waits for {on}, deferred by [scope] max_creates this pass",
                        action.verb.name(),
                        action.resource
                    ),
                ));
                waiting.insert(key.clone());
                blocked.insert(key);
                continue;
            }
            if matches!(action.verb, Verb::Create(_) | Verb::Clone(_)) {
                creates += 1;
                if creates > max {
                    findings.push(finding(&action, FindingKind::Deferred, format!("{} is not created this pass: [scope] max_creates ({max}) reached; a later pass creates it", action.resource)));
                    waiting.insert(key.clone());
                    blocked.insert(key);
                    continue;
                }
            }
            kept.push(action);
        }
        kept_levels.push(kept);
    }
    Plan {
        levels: kept_levels,
        findings,
        blocked,
        aborted,
    }
}

fn depends_on_waiting(
    desired: &DesiredState,
    action: &Action,
    waiting: &BTreeSet<(ResourceId, String)>,
) -> Option<ResourceId> {
    let resource = desired.manifest.get(&action.resource)?;
    resource
        .references
        .iter()
        .find(|r| waiting.contains(&(r.target.clone(), action.node.clone())))
        .map(|r| r.target.clone())
}

fn finding(action: &Action, kind: FindingKind, message: String) -> Finding {
    Finding {
        resource: action.resource.clone(),
        node: action.node.clone(),
        kind,
        field: String::new(),
        desired: String::new(),
        observed: String::new(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::GuestType;
    use crate::plan::{Create, GuestRef};

    const VM: &str = "apiVersion: proxops/v1alpha1
kind: VM
metadata:
  name: web
spec:
  node: pve1
  vmid: 150
  memory: 1GiB
  cpu: {type: host, cores: 1}
  disks:
    - {storage: local-lvm, size: 8GiB}
  networks:
    - bridge: vmbr0
";

    fn files(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect()
    }

    fn state(files: &BTreeMap<String, String>) -> DesiredState {
        let loaded = crate::repository::load(files);
        assert!(!loaded.has_errors(), "{:?}", loaded.diagnostics);
        loaded.states[0].clone()
    }

    fn problems(scope: &Scope, entries: &[(&str, &str)]) -> Vec<String> {
        let files = files(entries);
        check(scope, &state(&files), &files)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_vmid_outside_the_scope_makes_the_revision_invalid_naming_the_scope_key() {
        let scope = Scope {
            vmids: Some(VmidRanges::parse("100-149,9000-9099").unwrap()),
            ..Scope::default()
        };
        let found = problems(&scope, &[("vm/web.yaml", VM)]);
        assert_eq!(
            found,
            [
                "vm/web.yaml:7:9: error: spec.vmid: vmid 150 is outside the operator's scope: [scope] vmids = \"100-149,9000-9099\" in the agent config\n  help: use a vmid in \"100-149,9000-9099\", or add 150 to [scope] vmids in agent.toml"
            ]
        );
        let wider = Scope {
            vmids: Some(VmidRanges::parse("100-199").unwrap()),
            ..Scope::default()
        };
        assert!(problems(&wider, &[("vm/web.yaml", VM)]).is_empty());
    }

    #[test]
    fn a_node_outside_the_scope_is_refused_at_spec_node() {
        let scope = Scope {
            nodes: Some(vec!["pve2".to_owned()]),
            ..Scope::default()
        };
        let found = problems(&scope, &[("vm/web.yaml", VM)]);
        assert_eq!(found.len(), 1);
        assert!(found[0].starts_with("vm/web.yaml:6:9: error: spec.node: node `pve1` is outside the operator's scope: [scope] nodes = [\"pve2\"]"), "{found:?}");
    }

    #[test]
    fn a_storage_outside_the_scope_is_refused() {
        let scope = Scope {
            storages: Some(vec!["local".to_owned()]),
            ..Scope::default()
        };
        let found = problems(&scope, &[("vm/web.yaml", VM)]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("vm/web.yaml:11:17: error: spec.disks[0].storage: storage `local-lvm` is outside the operator's scope: [scope] storages = [\"local\"] in the agent config"), "{found:?}");
        assert!(
            found[0].contains("help: add \"local-lvm\" to [scope] storages in agent.toml"),
            "{found:?}"
        );
    }

    #[test]
    fn a_bridge_outside_the_scope_is_refused() {
        let scope = Scope {
            bridges: Some(vec!["vmbr1".to_owned()]),
            ..Scope::default()
        };
        let found = problems(&scope, &[("vm/web.yaml", VM)]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("vm/web.yaml:13:15: error: spec.networks[0].bridge: bridge `vmbr0` is outside the operator's scope: [scope] bridges = [\"vmbr1\"]"), "{found:?}");
    }

    #[test]
    fn a_dangerous_extra_key_is_refused_unless_listed() {
        for key in [
            "args",
            "hookscript",
            "hostpci0",
            "usb1",
            "virtio3",
            "cicustom",
        ] {
            let vm = format!("{VM}  extra:\n    {key}: x\n");
            let found = problems(&Scope::default(), &[("vm/web.yaml", &vm)]);
            assert_eq!(found.len(), 1, "{key}: {found:?}");
            assert!(
                found[0].starts_with(&format!(
                    "vm/web.yaml:15:5: error: spec.extra.{key}: `{key}` is a dangerous PVE key"
                )),
                "{found:?}"
            );
            assert!(found[0].contains("[scope] extra_keys"), "{found:?}");
        }
        let vm =
            format!("{VM}  extra:\n    hostpci0: 0000:01:00.0\n    args: -x\n    balloon: \"0\"\n");
        let listed = Scope {
            extra_keys: vec!["hostpci*".to_owned()],
            ..Scope::default()
        };
        let found = problems(&listed, &[("vm/web.yaml", &vm)]);
        assert_eq!(found.len(), 1, "only the unlisted dangerous key: {found:?}");
        assert!(found[0].contains("spec.extra.args: `args` is a dangerous PVE key (`args`: it reaches host devices, host paths, other guests' volumes or raw options) and [scope] extra_keys = [\"hostpci*\"]"), "{found:?}");
        // A harmless key passes as before.
        let harmless = format!("{VM}  extra:\n    balloon: \"0\"\n");
        assert!(problems(&Scope::default(), &[("vm/web.yaml", &harmless)]).is_empty());
    }

    #[test]
    fn a_bind_mount_outside_host_paths_is_refused() {
        let ct = "apiVersion: proxops/v1alpha1
kind: LXC
metadata: {name: ct}
spec:
  node: pve1
  vmid: 200
  template: deb
  memory: 512MiB
  cpu: {cores: 1}
  root: {storage: local-lvm, size: 4GiB}
  bind-mounts:
    - {host-path: /etc/pve/priv, mount-point: /mnt/x}
";
        let tmpl = "apiVersion: proxops/v1alpha1\nkind: CTTemplate\nmetadata: {name: deb}\nspec: {nodes: [pve1], storage: local, filename: d.tar.zst, url: 'https://x.org/d.tar.zst'}\n";
        let found = problems(
            &Scope::default(),
            &[("lxc/ct.yaml", ct), ("ctt/deb.yaml", tmpl)],
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("lxc/ct.yaml:12:19: error: spec.bind-mounts[0].host-path: host path `/etc/pve/priv` is outside the operator's scope: [scope] host_paths = []"), "{found:?}");
        let allowed = Scope {
            host_paths: vec!["/etc/pve".to_owned()],
            ..Scope::default()
        };
        assert!(problems(&allowed, &[("lxc/ct.yaml", ct), ("ctt/deb.yaml", tmpl)]).is_empty());
        assert!(under("/srv/a/b", "/srv/a") && !under("/srv/ab", "/srv/a"));
    }

    #[test]
    fn an_adopt_annotation_outside_the_adopt_ranges_is_refused_at_the_annotation() {
        let vm = VM.replace(
            "  name: web\n",
            "  name: web\n  annotations:\n    proxops/adopt: \"true\"\n",
        );
        let found = problems(&Scope::default(), &[("vm/web.yaml", &vm)]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("vm/web.yaml:6:20: error: metadata.annotations.proxops/adopt: adopting vmid 150 is outside the operator's scope: [scope] adopt = \"none\""), "{found:?}");
        let adopt = Scope {
            adopt: VmidRanges::parse("150").unwrap(),
            ..Scope::default()
        };
        assert!(problems(&adopt, &[("vm/web.yaml", &vm)]).is_empty());
    }

    const ISO_HTTP: &str = "apiVersion: proxops/v1alpha1
kind: ISO
metadata: {name: netinst}
spec:
  nodes: [pve1]
  storage: local
  filename: n.iso
  url: http://mirror.example.org/n.iso
";

    #[test]
    fn an_http_artifact_url_without_a_checksum_is_refused() {
        let found = problems(&Scope::default(), &[("iso/n.yaml", ISO_HTTP)]);
        assert_eq!(
            found,
            [
                "iso/n.yaml:8:8: error: spec.url: an `http://` download has no checksum, so anyone on the path can replace the file\n  help: add `checksum: {algorithm: sha256, value: …}` (the published digest), or use an `https://` URL"
            ]
        );
        let summed = format!(
            "{ISO_HTTP}  checksum: {{algorithm: sha256, value: {}}}\n",
            "a".repeat(64)
        );
        assert!(problems(&Scope::default(), &[("iso/n.yaml", &summed)]).is_empty());
        let https = ISO_HTTP.replace("http://", "https://");
        assert!(problems(&Scope::default(), &[("iso/n.yaml", &https)]).is_empty());
        let rig = Scope {
            allow_http_without_checksum: true,
            ..Scope::default()
        };
        assert!(problems(&rig, &[("iso/n.yaml", ISO_HTTP)]).is_empty());
    }

    #[test]
    fn an_artifact_url_resolving_to_loopback_is_refused_unless_listed() {
        let iso = ISO_HTTP.replace("http://mirror.example.org", "https://internal.example");
        let files = files(&[("iso/n.yaml", &iso)]);
        let desired = state(&files);
        let resolve = |_: &str| Ok(vec!["127.0.0.1".parse().unwrap()]);
        let found = check_hosts(&Scope::default(), &desired, &files, &[], resolve);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            found[0].to_string(),
            "iso/n.yaml:8:8: error: spec.url: download host `internal.example` resolves to 127.0.0.1, an internal address (loopback, private, link-local or this node's), and [scope] artifact_hosts in the agent config does not list it\n  help: download from a public host, or have the operator add \"internal.example\" to [scope] artifact_hosts in agent.toml"
        );
        // Private, link-local and the node's own (public) address are refused alike.
        for address in [
            "10.1.2.3",
            "169.254.169.254",
            "fe80::1",
            "fd00::1",
            "100.64.0.1",
        ] {
            let found = check_hosts(&Scope::default(), &desired, &files, &[], |_| {
                Ok(vec![address.parse().unwrap()])
            });
            assert_eq!(found.len(), 1, "{address}");
        }
        let own: IpAddr = "91.198.174.192".parse().unwrap();
        let found = check_hosts(&Scope::default(), &desired, &files, &[own], |_| {
            Ok(vec![own])
        });
        assert!(
            found[0].message.contains("an address of this node"),
            "{found:?}"
        );
        // A public address passes; a host that does not resolve is refused.
        let public = |_: &str| Ok(vec!["151.101.2.132".parse().unwrap()]);
        assert!(check_hosts(&Scope::default(), &desired, &files, &[], public).is_empty());
        let nx = |_: &str| Err("no such host".to_owned());
        assert!(
            check_hosts(&Scope::default(), &desired, &files, &[], nx)[0]
                .message
                .contains("does not resolve (no such host)")
        );
        // Listed, it is allowed whatever it resolves to; unlisted hosts are then refused.
        let listed = Scope {
            artifact_hosts: Some(vec!["internal.example".to_owned()]),
            ..Scope::default()
        };
        assert!(check(&listed, &desired, &files).is_empty());
        let other = Scope {
            artifact_hosts: Some(vec!["mirror.example.org".to_owned()]),
            ..Scope::default()
        };
        assert!(
            check(&other, &desired, &files)[0]
                .message
                .contains("is not in [scope] artifact_hosts = [\"mirror.example.org\"]")
        );
        // An IP literal is checked without resolving.
        let literal = ISO_HTTP.replace("http://mirror.example.org", "https://127.0.0.1:8080");
        let found = problems(&Scope::default(), &[("iso/n.yaml", &literal)]);
        assert!(
            found[0]
                .contains("download host `127.0.0.1` resolves to 127.0.0.1, an internal address"),
            "{found:?}"
        );
    }

    fn create(name: &str, vmid: u32) -> Action {
        Action {
            resource: ResourceId::new(crate::resource::Kind::Vm, name),
            node: "pve1".to_owned(),
            verb: Verb::Create(Create {
                vmid,
                guest_type: GuestType::Qemu,
                params: BTreeMap::new(),
                grow: Vec::new(),
                after: BTreeMap::new(),
            }),
            reason: "declared".to_owned(),
        }
    }

    fn start(name: &str, vmid: u32) -> Action {
        Action {
            verb: Verb::Start(GuestRef {
                vmid,
                guest_type: GuestType::Qemu,
            }),
            ..create(name, vmid)
        }
    }

    #[test]
    fn a_pool_move_into_a_pool_outside_the_scope_is_refused_by_the_executor() {
        let move_to = |pool: &str| Action {
            resource: ResourceId::new(crate::resource::Kind::Vm, "web"),
            node: "pve1".to_owned(),
            verb: Verb::Pool(crate::plan::PoolMove {
                vmid: 101,
                guest_type: GuestType::Qemu,
                pool: pool.to_owned(),
                from: None,
            }),
            reason: "drift".to_owned(),
        };
        let scope = Scope {
            pools: Some(vec!["prod".to_owned()]),
            ..Scope::default()
        };
        assert_eq!(scope.refusal(&move_to("prod")), None);
        assert_eq!(
            scope.refusal(&move_to("lab")).as_deref(),
            Some("refused: pool lab is outside [scope] pools in the agent config")
        );
    }

    #[test]
    fn more_creates_than_max_creates_wait_with_a_finding() {
        let files = files(&[("vm/web.yaml", VM)]);
        let desired = state(&files);
        let plan = Plan {
            levels: vec![vec![
                create("a", 101),
                start("a", 101),
                create("b", 102),
                start("b", 102),
                create("c", 103),
            ]],
            ..Plan::default()
        };
        let scope = Scope {
            max_creates: 1,
            ..Scope::default()
        };
        let restricted = restrict(&scope, &desired, plan);
        let kept: Vec<String> = restricted
            .actions()
            .map(|a| format!("{} {}", a.verb.name(), a.resource))
            .collect();
        assert_eq!(kept, ["create VM/a", "start VM/a"]);
        let deferred: Vec<&str> = restricted
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::Deferred)
            .map(|f| f.resource.name.as_str())
            .collect();
        assert_eq!(deferred, ["b", "c"]);
        assert!(
            restricted.findings[0]
                .message
                .contains("[scope] max_creates (1) reached; a later pass creates it")
        );
        assert!(restricted.blocked.contains(&(
            ResourceId::new(crate::resource::Kind::Vm, "b"),
            "pve1".to_owned()
        )));
    }

    #[test]
    fn a_prune_outside_the_scope_becomes_a_finding_and_the_executor_refuses_it() {
        let files = files(&[("vm/web.yaml", VM)]);
        let desired = state(&files);
        let delete = Action {
            verb: Verb::Delete(GuestRef {
                vmid: 500,
                guest_type: GuestType::Qemu,
            }),
            ..create("old", 500)
        };
        let scope = Scope {
            vmids: Some(VmidRanges::parse("100-199").unwrap()),
            ..Scope::default()
        };
        assert_eq!(
            scope.refusal(&delete).as_deref(),
            Some("refused: vmid 500 is outside [scope] vmids in the agent config")
        );
        let plan = Plan {
            levels: vec![vec![delete]],
            ..Plan::default()
        };
        let restricted = restrict(&scope, &desired, plan);
        assert!(!restricted.has_changes());
        assert_eq!(restricted.findings[0].kind, FindingKind::OutOfScope);
        assert_eq!(
            restricted.findings[0].message,
            "delete VM/old is not done: vmid 500 is outside [scope] vmids in the agent config"
        );
    }

    #[test]
    fn the_executor_refuses_a_download_from_an_unlisted_or_internal_host_or_storage() {
        let download = |url: &str, storage: &str| Action {
            resource: ResourceId::new(crate::resource::Kind::Iso, "n"),
            node: "pve1".to_owned(),
            verb: Verb::Download(crate::plan::Download {
                storage: storage.to_owned(),
                content: "iso".to_owned(),
                filename: "n.iso".to_owned(),
                url: url.to_owned(),
                checksum: None,
                volid: format!("{storage}:iso/n.iso"),
            }),
            reason: "missing".to_owned(),
        };
        let scope = Scope {
            storages: Some(vec!["local".to_owned()]),
            ..Scope::default()
        };
        assert_eq!(
            scope.refusal(&download("https://mirror.org/n.iso", "local")),
            None
        );
        assert!(
            scope
                .refusal(&download("https://mirror.org/n.iso", "nfs"))
                .unwrap()
                .contains("storage nfs is outside [scope] storages")
        );
        assert!(
            scope
                .refusal(&download("http://mirror.org/n.iso", "local"))
                .unwrap()
                .contains("without a checksum")
        );
        assert!(
            scope
                .refusal(&download("https://10.0.0.1/n.iso", "local"))
                .unwrap()
                .contains("an internal address")
        );
        let listed = Scope {
            artifact_hosts: Some(vec!["mirror.org".to_owned()]),
            ..Scope::default()
        };
        assert!(
            listed
                .refusal(&download("https://other.org/n.iso", "local"))
                .unwrap()
                .contains("is not in [scope] artifact_hosts")
        );
    }

    #[test]
    fn vmid_ranges_parse_and_print_back() {
        let ranges = VmidRanges::parse("100-199, 9000,9001-9099").unwrap();
        assert_eq!(ranges.to_string(), "100-199,9000,9001-9099");
        assert!(ranges.contains(9050) && !ranges.contains(200));
        assert!(VmidRanges::parse("1-x").is_err());
        assert_eq!(VmidRanges::none().to_string(), "none");
    }

    #[test]
    fn url_hosts_drop_the_port_user_and_brackets() {
        assert_eq!(
            url_host("https://u:p@mirror.org:8443/a"),
            Some("mirror.org")
        );
        assert_eq!(url_host("http://[::1]:80/a"), Some("::1"));
        assert_eq!(url_host("ftp://x"), None);
        assert!(!is_public("::ffff:10.0.0.1".parse().unwrap()));
        assert!(is_public("2a00:1450::1".parse().unwrap()));
    }
}
