//! Pure request builders: one function per PVE endpoint ProxOps calls (STYLE H1).
//!
//! Each function returns a [`Request`] value (method, percent-encoded path under
//! `/api2/json`, query and form parameters) and never touches a socket; `client.rs` sends it.
//! Parameters go where PVE reads them (BEHAVIOUR.md §1): the query string for GET and DELETE,
//! an `application/x-www-form-urlencoded` body for POST and PUT. Booleans are sent as `1`/`0`,
//! the only top-level spelling PVE accepts (LIVE-FACTS.md §1.1).
//!
//! Every builder is also called by [`all_endpoints_for_contract`], which the contract test
//! checks against PVE's API schema: a new builder must be added there.

use std::fmt;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::cluster::ResourceType;
use crate::storage::{ContentType, DownloadUrl};
use crate::upid::Upid;

mod snapshot;
pub use snapshot::{
    SnapshotEntry, SnapshotGuest, snapshot_create, snapshot_delete, snapshot_feature,
    snapshot_list, snapshot_rollback,
};

/// Characters escaped in a path segment: everything but `encodeURIComponent`'s unreserved set,
/// which is what PVE's own web UI and most PVE clients use (a UPID's `:` becomes `%3A`).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

/// An HTTP method PVE's API uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Read.
    Get,
    /// Create or start an action.
    Post,
    /// Update.
    Put,
    /// Delete.
    Delete,
}

impl Method {
    /// The method's name as sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Delete => "DELETE",
        }
    }

    /// Whether the method can change PVE state (everything but GET).
    pub fn is_write(self) -> bool {
        self != Self::Get
    }

    /// Whether PVE reads parameters from the body (POST, PUT) rather than the query string.
    fn has_body(self) -> bool {
        matches!(self, Self::Post | Self::Put)
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A PVE API request, ready to send, built without IO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// HTTP method.
    pub method: Method,
    /// Path below `/api2/json`, segments percent-encoded, e.g. `/nodes/pve1/qemu/100/config`.
    pub path: String,
    /// The schema path this request instantiates, e.g. `/nodes/{node}/qemu/{vmid}/config`.
    pub template: &'static str,
    /// Query-string parameters (GET and DELETE).
    pub query: Vec<(String, String)>,
    /// Form body parameters (POST and PUT).
    pub form: Vec<(String, String)>,
}

impl Request {
    /// A request for `template` with its `{placeholders}` replaced, in order, by `segments`.
    pub(crate) fn new(method: Method, template: &'static str, segments: &[&str]) -> Self {
        let mut path = String::with_capacity(template.len() + 16);
        let mut values = segments.iter();
        for part in template.split('/').skip(1) {
            path.push('/');
            if part.starts_with('{') {
                // A missing value is a bug in this file; the unit tests cover every template.
                let value = values.next().copied().unwrap_or_default();
                path.extend(utf8_percent_encode(value, SEGMENT));
            } else {
                path.push_str(part);
            }
        }
        debug_assert!(values.next().is_none(), "too many segments for {template}");
        Self {
            method,
            path,
            template,
            query: Vec::new(),
            form: Vec::new(),
        }
    }

    /// Adds a parameter where PVE reads it for this method.
    pub(crate) fn param(mut self, key: &str, value: impl Into<String>) -> Self {
        let pair = (key.to_owned(), value.into());
        if self.method.has_body() {
            self.form.push(pair);
        } else {
            self.query.push(pair);
        }
        self
    }

    fn param_opt(self, key: &str, value: Option<impl Into<String>>) -> Self {
        match value {
            Some(v) => self.param(key, v),
            None => self,
        }
    }

    fn param_bool(self, key: &str, value: Option<bool>) -> Self {
        self.param_opt(key, value.map(bool_str))
    }

    fn params(mut self, params: &Params) -> Self {
        for (k, v) in &params.0 {
            self = self.param(k, v.clone());
        }
        self
    }

    /// All parameters, query then form (only one of them is non-empty).
    pub fn parameters(&self) -> impl Iterator<Item = (&str, &str)> {
        self.query
            .iter()
            .chain(&self.form)
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl fmt::Display for Request {
    /// `METHOD /path`, the form used in error messages and logs (no parameter values).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

fn bool_str(b: bool) -> &'static str {
    if b { "1" } else { "0" }
}

/// An ordered list of free-form guest parameters (`name`, `memory`, `scsi0`, ...), for the
/// create and config endpoints whose schemas have dozens of keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params(Vec<(String, String)>);

impl Params {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`, replacing an earlier value of the same key.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        let key = key.into();
        let value = value.into();
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
        self
    }

    /// Sets a boolean as `1`/`0` (PVE rejects `true`/`false` at top level).
    pub fn set_bool(self, key: impl Into<String>, value: bool) -> Self {
        self.set(key, bool_str(value))
    }

    /// Sets an integer.
    pub fn set_int(self, key: impl Into<String>, value: i64) -> Self {
        self.set(key, value.to_string())
    }

    /// The parameters in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Whether no parameter is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A guest config change for `PUT`/`POST .../config`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigUpdate {
    /// Keys to set.
    pub set: Params,
    /// Keys to remove (`delete=k1,k2`).
    pub delete: Vec<String>,
    /// Pending changes to drop (`revert=k1,k2`).
    pub revert: Vec<String>,
    /// Only apply if the config's digest is still this (optimistic locking).
    pub digest: Option<String>,
}

/// Options of a guest delete.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    /// Also remove the guest from backup jobs, replication and HA (`purge`).
    pub purge: bool,
    /// Also destroy disks not referenced by the config (`destroy-unreferenced-disks`).
    pub destroy_unreferenced_disks: bool,
}

/// Options of a guest clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloneOptions {
    /// The new guest's id (`newid`).
    pub newid: u32,
    /// The new guest's name (`name` for qemu, `hostname` for lxc).
    pub name: Option<String>,
    /// Full clone instead of a linked clone (`full`).
    pub full: Option<bool>,
    /// Target node (`target`).
    pub target: Option<String>,
    /// Target storage for full clones (`storage`).
    pub storage: Option<String>,
    /// Pool to add the clone to (`pool`).
    pub pool: Option<String>,
    /// Description (`description`).
    pub description: Option<String>,
}

/// Options of `PUT /pools` (update a pool's membership).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolUpdate {
    /// Pool id.
    pub poolid: String,
    /// Guests to add (or remove with `delete`).
    pub vms: Vec<u32>,
    /// Storages to add (or remove with `delete`).
    pub storage: Vec<String>,
    /// Remove the listed members instead of adding them.
    pub delete: bool,
    /// Move guests that are already in another pool (`allow-move`).
    pub allow_move: bool,
    /// Pool comment.
    pub comment: Option<String>,
}

#[derive(Clone, Copy)]
enum Guest {
    Qemu,
    Lxc,
}

macro_rules! guest_template {
    ($guest:expr, $suffix:literal) => {
        match $guest {
            Guest::Qemu => concat!("/nodes/{node}/qemu", $suffix),
            Guest::Lxc => concat!("/nodes/{node}/lxc", $suffix),
        }
    };
}

// ---- cluster and nodes -------------------------------------------------------------------

/// `GET /version`.
pub fn version() -> Request {
    Request::new(Method::Get, "/version", &[])
}

/// `GET /cluster/resources[?type=...]`.
pub fn cluster_resources(resource_type: Option<ResourceType>) -> Request {
    Request::new(Method::Get, "/cluster/resources", &[])
        .param_opt("type", resource_type.map(ResourceType::as_str))
}

/// `GET /cluster/nextid?vmid=<vmid>`: answers the vmid when no guest of the cluster has it,
/// else 400 `{"vmid": "VM <vmid> already exists"}`. Any user may ask (`user => 'all'`), and
/// the answer comes from the cluster's vmlist unfiltered by privileges, so it tells a token
/// about a guest `/cluster/resources` hides from it (pve-manager @ 14a22df3
/// `PVE/API2/Cluster.pm` `nextid`).
pub fn cluster_nextid(vmid: u32) -> Request {
    Request::new(Method::Get, "/cluster/nextid", &[]).param("vmid", vmid.to_string())
}

/// `GET /cluster/status`.
pub fn cluster_status() -> Request {
    Request::new(Method::Get, "/cluster/status", &[])
}

/// `GET /nodes`.
pub fn nodes() -> Request {
    Request::new(Method::Get, "/nodes", &[])
}

/// `GET /nodes/{node}/status`.
pub fn node_status(node: &str) -> Request {
    Request::new(Method::Get, "/nodes/{node}/status", &[node])
}

// ---- storage -----------------------------------------------------------------------------

/// `GET /nodes/{node}/storage`: the storages available on a node.
pub fn storages(node: &str) -> Request {
    Request::new(Method::Get, "/nodes/{node}/storage", &[node])
}

/// `GET /nodes/{node}/storage/{storage}/status`.
pub fn storage_status(node: &str, storage: &str) -> Request {
    Request::new(
        Method::Get,
        "/nodes/{node}/storage/{storage}/status",
        &[node, storage],
    )
}

/// `GET /nodes/{node}/storage/{storage}/content[?content=<type>]`.
///
/// The type is a query parameter; `/content/<type>` would name a *volume*.
pub fn storage_content(node: &str, storage: &str, content: Option<ContentType>) -> Request {
    Request::new(
        Method::Get,
        "/nodes/{node}/storage/{storage}/content",
        &[node, storage],
    )
    .param_opt("content", content.map(ContentType::as_str))
}

/// `GET /storage/{storage}`: the storage's configuration (`type`, `path`, `content`,
/// `shared`, `content-dirs`, ...) from `storage.cfg`. pve-storage guards it with
/// `Datastore.Allocate` on `/storage/{storage}` (`PVE/API2/Storage/Config.pm`, `read`).
pub fn storage_config(storage: &str) -> Request {
    Request::new(Method::Get, "/storage/{storage}", &[storage])
}

/// `PUT /nodes/{node}/qemu/{vmid}/cloudinit`: regenerate the cloud-init drive from the
/// config (and change the medium of a running VM); synchronous, answers `null`
/// (qemu-server `PVE/API2/Qemu.pm`, `cloudinit_update`, needs `VM.Config.Cloudinit`).
pub fn qemu_cloudinit_update(node: &str, vmid: u32) -> Request {
    Request::new(
        Method::Put,
        "/nodes/{node}/qemu/{vmid}/cloudinit",
        &[node, &vmid.to_string()],
    )
}

/// `GET /nodes/{node}/storage/{storage}/content/{volume}`: one volume's attributes.
pub fn storage_volume(node: &str, storage: &str, volume: &str) -> Request {
    Request::new(
        Method::Get,
        "/nodes/{node}/storage/{storage}/content/{volume}",
        &[node, storage, volume],
    )
}

/// `DELETE /nodes/{node}/storage/{storage}/content/{volume}[?delay=N]`.
pub fn storage_volume_delete(
    node: &str,
    storage: &str,
    volume: &str,
    delay: Option<u32>,
) -> Request {
    Request::new(
        Method::Delete,
        "/nodes/{node}/storage/{storage}/content/{volume}",
        &[node, storage, volume],
    )
    .param_opt("delay", delay.map(|d| d.to_string()))
}

/// `POST /nodes/{node}/storage/{storage}/download-url`; PVE answers with a `download` UPID.
pub fn download_url(node: &str, storage: &str, download: &DownloadUrl) -> Request {
    let mut req = Request::new(
        Method::Post,
        "/nodes/{node}/storage/{storage}/download-url",
        &[node, storage],
    )
    .param("content", download.content.as_str())
    .param("url", download.url.as_str())
    .param("filename", download.filename.as_str());
    // PVE requires the two together (`requires` in the schema), so they are only ever a pair.
    if let Some(checksum) = &download.checksum {
        req = req
            .param("checksum", checksum.value.as_str())
            .param("checksum-algorithm", checksum.algorithm.as_str());
    }
    req.param_bool("verify-certificates", download.verify_certificates)
        .param_opt("compression", download.compression.as_deref())
}

// ---- guests (shared shapes) --------------------------------------------------------------

fn guest_list(guest: Guest, node: &str) -> Request {
    Request::new(Method::Get, guest_template!(guest, ""), &[node])
}

fn guest_create(guest: Guest, node: &str, vmid: u32, params: &Params) -> Request {
    Request::new(Method::Post, guest_template!(guest, ""), &[node])
        .param("vmid", vmid.to_string())
        .params(params)
}

fn guest_delete(guest: Guest, node: &str, vmid: u32, opts: DeleteOptions) -> Request {
    let vmid = vmid.to_string();
    Request::new(
        Method::Delete,
        guest_template!(guest, "/{vmid}"),
        &[node, &vmid],
    )
    .param_bool("purge", opts.purge.then_some(true))
    .param_bool(
        "destroy-unreferenced-disks",
        opts.destroy_unreferenced_disks.then_some(true),
    )
}

fn guest_config_get(guest: Guest, node: &str, vmid: u32, current: bool) -> Request {
    let vmid = vmid.to_string();
    Request::new(
        Method::Get,
        guest_template!(guest, "/{vmid}/config"),
        &[node, &vmid],
    )
    .param_bool("current", current.then_some(true))
}

fn guest_config_write(
    guest: Guest,
    method: Method,
    node: &str,
    vmid: u32,
    update: &ConfigUpdate,
) -> Request {
    let vmid = vmid.to_string();
    let join = |keys: &[String]| (!keys.is_empty()).then(|| keys.join(","));
    Request::new(
        method,
        guest_template!(guest, "/{vmid}/config"),
        &[node, &vmid],
    )
    .params(&update.set)
    .param_opt("delete", join(&update.delete))
    .param_opt("revert", join(&update.revert))
    .param_opt("digest", update.digest.as_deref())
}

fn guest_get(guest: Guest, node: &str, vmid: u32, which: GuestGet) -> Request {
    let vmid = vmid.to_string();
    let template = match which {
        GuestGet::Pending => guest_template!(guest, "/{vmid}/pending"),
        GuestGet::StatusCurrent => guest_template!(guest, "/{vmid}/status/current"),
    };
    Request::new(Method::Get, template, &[node, &vmid])
}

#[derive(Clone, Copy)]
enum GuestGet {
    Pending,
    StatusCurrent,
}

#[derive(Clone, Copy)]
enum Power {
    Start,
    Stop,
    Shutdown {
        timeout: Option<u32>,
        force_stop: bool,
    },
    Reboot {
        timeout: Option<u32>,
    },
}

fn guest_power(guest: Guest, node: &str, vmid: u32, power: Power) -> Request {
    let vmid = vmid.to_string();
    let (template, timeout, force_stop) = match power {
        Power::Start => (guest_template!(guest, "/{vmid}/status/start"), None, false),
        Power::Stop => (guest_template!(guest, "/{vmid}/status/stop"), None, false),
        Power::Shutdown {
            timeout,
            force_stop,
        } => (
            guest_template!(guest, "/{vmid}/status/shutdown"),
            timeout,
            force_stop,
        ),
        Power::Reboot { timeout } => (
            guest_template!(guest, "/{vmid}/status/reboot"),
            timeout,
            false,
        ),
    };
    Request::new(Method::Post, template, &[node, &vmid])
        .param_opt("timeout", timeout.map(|t| t.to_string()))
        .param_opt("forceStop", force_stop.then(|| "1".to_owned()))
}

fn guest_template_mark(guest: Guest, node: &str, vmid: u32) -> Request {
    let vmid = vmid.to_string();
    Request::new(
        Method::Post,
        guest_template!(guest, "/{vmid}/template"),
        &[node, &vmid],
    )
}

fn guest_clone(guest: Guest, node: &str, vmid: u32, opts: &CloneOptions) -> Request {
    let vmid = vmid.to_string();
    let name_key = match guest {
        Guest::Qemu => "name",
        Guest::Lxc => "hostname",
    };
    Request::new(
        Method::Post,
        guest_template!(guest, "/{vmid}/clone"),
        &[node, &vmid],
    )
    .param("newid", opts.newid.to_string())
    .param_opt(name_key, opts.name.as_deref())
    .param_bool("full", opts.full)
    .param_opt("target", opts.target.as_deref())
    .param_opt("storage", opts.storage.as_deref())
    .param_opt("pool", opts.pool.as_deref())
    .param_opt("description", opts.description.as_deref())
}

fn guest_resize(guest: Guest, node: &str, vmid: u32, disk: &str, size: &str) -> Request {
    let vmid = vmid.to_string();
    // PUT: `POST .../resize` answers 501 (LIVE-FACTS.md §1.1).
    Request::new(
        Method::Put,
        guest_template!(guest, "/{vmid}/resize"),
        &[node, &vmid],
    )
    .param("disk", disk)
    .param("size", size)
}

// ---- qemu --------------------------------------------------------------------------------

/// `GET /nodes/{node}/qemu`.
pub fn qemu_list(node: &str) -> Request {
    guest_list(Guest::Qemu, node)
}

/// `POST /nodes/{node}/qemu` with `vmid` and `params`; answers a `qmcreate` UPID.
pub fn qemu_create(node: &str, vmid: u32, params: &Params) -> Request {
    guest_create(Guest::Qemu, node, vmid, params)
}

/// `DELETE /nodes/{node}/qemu/{vmid}`; answers a `qmdestroy` UPID.
pub fn qemu_delete(node: &str, vmid: u32, opts: DeleteOptions) -> Request {
    guest_delete(Guest::Qemu, node, vmid, opts)
}

/// `GET /nodes/{node}/qemu/{vmid}/config[?current=1]` (pending values merged unless `current`).
pub fn qemu_config(node: &str, vmid: u32, current: bool) -> Request {
    guest_config_get(Guest::Qemu, node, vmid, current)
}

/// `POST /nodes/{node}/qemu/{vmid}/config`: asynchronous, answers a `qmconfig` UPID.
pub fn qemu_config_post(node: &str, vmid: u32, update: &ConfigUpdate) -> Request {
    guest_config_write(Guest::Qemu, Method::Post, node, vmid, update)
}

/// `PUT /nodes/{node}/qemu/{vmid}/config`: synchronous, answers `null`.
pub fn qemu_config_put(node: &str, vmid: u32, update: &ConfigUpdate) -> Request {
    guest_config_write(Guest::Qemu, Method::Put, node, vmid, update)
}

/// `GET /nodes/{node}/qemu/{vmid}/pending`.
pub fn qemu_pending(node: &str, vmid: u32) -> Request {
    guest_get(Guest::Qemu, node, vmid, GuestGet::Pending)
}

/// `GET /nodes/{node}/qemu/{vmid}/status/current`.
pub fn qemu_status_current(node: &str, vmid: u32) -> Request {
    guest_get(Guest::Qemu, node, vmid, GuestGet::StatusCurrent)
}

/// `POST /nodes/{node}/qemu/{vmid}/status/start`.
pub fn qemu_start(node: &str, vmid: u32) -> Request {
    guest_power(Guest::Qemu, node, vmid, Power::Start)
}

/// `POST /nodes/{node}/qemu/{vmid}/status/stop` (hard stop).
pub fn qemu_stop(node: &str, vmid: u32) -> Request {
    guest_power(Guest::Qemu, node, vmid, Power::Stop)
}

/// `POST /nodes/{node}/qemu/{vmid}/status/shutdown[timeout=N]` (ACPI shutdown).
pub fn qemu_shutdown(node: &str, vmid: u32, timeout_secs: Option<u32>) -> Request {
    guest_power(
        Guest::Qemu,
        node,
        vmid,
        Power::Shutdown {
            timeout: timeout_secs,
            force_stop: false,
        },
    )
}

/// `POST /nodes/{node}/qemu/{vmid}/status/shutdown` with `timeout=N` and `forceStop=1`:
/// a clean shutdown, and a hard stop when the VM is still running after `N` seconds.
pub fn qemu_shutdown_or_stop(node: &str, vmid: u32, timeout_secs: u32) -> Request {
    guest_power(
        Guest::Qemu,
        node,
        vmid,
        Power::Shutdown {
            timeout: Some(timeout_secs),
            force_stop: true,
        },
    )
}

/// `POST /nodes/{node}/qemu/{vmid}/status/reboot[timeout=N]`; applies pending changes.
pub fn qemu_reboot(node: &str, vmid: u32, timeout_secs: Option<u32>) -> Request {
    guest_power(
        Guest::Qemu,
        node,
        vmid,
        Power::Reboot {
            timeout: timeout_secs,
        },
    )
}

/// `POST /nodes/{node}/qemu/{vmid}/template`; answers a `qmtemplate` UPID.
pub fn qemu_template(node: &str, vmid: u32) -> Request {
    guest_template_mark(Guest::Qemu, node, vmid)
}

/// `POST /nodes/{node}/qemu/{vmid}/clone`; answers a `qmclone` UPID (id = source vmid).
pub fn qemu_clone(node: &str, vmid: u32, opts: &CloneOptions) -> Request {
    guest_clone(Guest::Qemu, node, vmid, opts)
}

/// `PUT /nodes/{node}/qemu/{vmid}/resize` (`size` like `+2G` or `32G`; grow only).
pub fn qemu_resize(node: &str, vmid: u32, disk: &str, size: &str) -> Request {
    guest_resize(Guest::Qemu, node, vmid, disk, size)
}

/// `POST /nodes/{node}/qemu/{vmid}/agent/ping`: answers `{"result": {}}` when the VM's QEMU
/// guest agent answers; 500 "No QEMU guest agent configured", "VM N is not running" or
/// "QEMU guest agent is not running" otherwise (qemu-server @ e6352be6
/// `src/PVE/API2/Qemu/Agent.pm` `register_command`, `src/PVE/QemuServer/Agent.pm`
/// `assert_agent_available`; needs `VM.GuestAgent.Audit` or `VM.GuestAgent.Unrestricted`
/// on `/vms/{vmid}`).
pub fn qemu_agent_ping(node: &str, vmid: u32) -> Request {
    Request::new(
        Method::Post,
        "/nodes/{node}/qemu/{vmid}/agent/ping",
        &[node, &vmid.to_string()],
    )
}

// ---- lxc ---------------------------------------------------------------------------------

/// `GET /nodes/{node}/lxc`.
pub fn lxc_list(node: &str) -> Request {
    guest_list(Guest::Lxc, node)
}

/// `POST /nodes/{node}/lxc` with `vmid` and `params` (`ostemplate` is required by PVE).
pub fn lxc_create(node: &str, vmid: u32, params: &Params) -> Request {
    guest_create(Guest::Lxc, node, vmid, params)
}

/// `DELETE /nodes/{node}/lxc/{vmid}`; answers a `vzdestroy` UPID.
pub fn lxc_delete(node: &str, vmid: u32, opts: DeleteOptions) -> Request {
    guest_delete(Guest::Lxc, node, vmid, opts)
}

/// `GET /nodes/{node}/lxc/{vmid}/config[?current=1]`.
pub fn lxc_config(node: &str, vmid: u32, current: bool) -> Request {
    guest_config_get(Guest::Lxc, node, vmid, current)
}

/// `PUT /nodes/{node}/lxc/{vmid}/config`: synchronous (lxc has no POST config; it is 501).
pub fn lxc_config_put(node: &str, vmid: u32, update: &ConfigUpdate) -> Request {
    guest_config_write(Guest::Lxc, Method::Put, node, vmid, update)
}

/// `GET /nodes/{node}/lxc/{vmid}/pending`.
pub fn lxc_pending(node: &str, vmid: u32) -> Request {
    guest_get(Guest::Lxc, node, vmid, GuestGet::Pending)
}

/// `GET /nodes/{node}/lxc/{vmid}/status/current`.
pub fn lxc_status_current(node: &str, vmid: u32) -> Request {
    guest_get(Guest::Lxc, node, vmid, GuestGet::StatusCurrent)
}

/// `POST /nodes/{node}/lxc/{vmid}/status/start`.
pub fn lxc_start(node: &str, vmid: u32) -> Request {
    guest_power(Guest::Lxc, node, vmid, Power::Start)
}

/// `POST /nodes/{node}/lxc/{vmid}/status/stop`.
pub fn lxc_stop(node: &str, vmid: u32) -> Request {
    guest_power(Guest::Lxc, node, vmid, Power::Stop)
}

/// `POST /nodes/{node}/lxc/{vmid}/status/shutdown[timeout=N]`.
pub fn lxc_shutdown(node: &str, vmid: u32, timeout_secs: Option<u32>) -> Request {
    guest_power(
        Guest::Lxc,
        node,
        vmid,
        Power::Shutdown {
            timeout: timeout_secs,
            force_stop: false,
        },
    )
}

/// `POST /nodes/{node}/lxc/{vmid}/status/shutdown` with `timeout=N` and `forceStop=1`:
/// a clean shutdown, and a hard stop when the container is still running after `N` seconds.
pub fn lxc_shutdown_or_stop(node: &str, vmid: u32, timeout_secs: u32) -> Request {
    guest_power(
        Guest::Lxc,
        node,
        vmid,
        Power::Shutdown {
            timeout: Some(timeout_secs),
            force_stop: true,
        },
    )
}

/// `POST /nodes/{node}/lxc/{vmid}/status/reboot[timeout=N]`.
pub fn lxc_reboot(node: &str, vmid: u32, timeout_secs: Option<u32>) -> Request {
    guest_power(
        Guest::Lxc,
        node,
        vmid,
        Power::Reboot {
            timeout: timeout_secs,
        },
    )
}

/// `POST /nodes/{node}/lxc/{vmid}/template`; answers `null` although a worker runs.
pub fn lxc_template(node: &str, vmid: u32) -> Request {
    guest_template_mark(Guest::Lxc, node, vmid)
}

/// `POST /nodes/{node}/lxc/{vmid}/clone` (`name` is sent as `hostname`).
pub fn lxc_clone(node: &str, vmid: u32, opts: &CloneOptions) -> Request {
    guest_clone(Guest::Lxc, node, vmid, opts)
}

/// `PUT /nodes/{node}/lxc/{vmid}/resize`.
pub fn lxc_resize(node: &str, vmid: u32, disk: &str, size: &str) -> Request {
    guest_resize(Guest::Lxc, node, vmid, disk, size)
}

// ---- tasks -------------------------------------------------------------------------------

/// `GET /nodes/{node}/tasks/{upid}/status`.
pub fn task_status(node: &str, upid: &Upid) -> Request {
    Request::new(
        Method::Get,
        "/nodes/{node}/tasks/{upid}/status",
        &[node, upid.as_str()],
    )
}

/// `GET /nodes/{node}/tasks/{upid}/log?start=N&limit=M` (`start` is 0-based).
pub fn task_log(node: &str, upid: &Upid, start: u64, limit: u64) -> Request {
    Request::new(
        Method::Get,
        "/nodes/{node}/tasks/{upid}/log",
        &[node, upid.as_str()],
    )
    .param("start", start.to_string())
    .param("limit", limit.to_string())
}

/// Which tasks [`node_tasks`] asks for: running and finished ones of one type, started by
/// one API token's user at or after `since`, optionally for one guest (`vmid`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFilter<'a> {
    /// The task type (`qmcreate`, `qmconfig`, `download`, ...).
    pub task_type: &'a str,
    /// The guest the task is for (PVE matches it exactly against the UPID's id).
    pub vmid: Option<u32>,
    /// The token id (`user@realm!token`) or user that started the task.
    pub user: &'a str,
    /// Only tasks started at or after this time (seconds since the epoch).
    pub since: u64,
}

/// The user part of a token id (`proxops@pve` of `proxops@pve!agent`).
pub fn user_of_token(token_id: &str) -> &str {
    token_id.split_once('!').map_or(token_id, |(user, _)| user)
}

/// `GET /nodes/{node}/tasks?source=all&typefilter=T&userfilter=U&since=S[&vmid=V]&limit=50`:
/// the newest tasks (running or ended) of one type started by a user since a time.
///
/// `userfilter` is the *user* part of the token id only: for finished tasks PVE splits the
/// UPID's `user@realm!token` into `user` and `tokenid` before it matches the filter as a
/// case-insensitive substring of `user` (pve-manager 14a22df3 `PVE/API2/Tasks.pm`
/// `node_tasks`, `$parse_line` → `convert_token_task`), so a token id matches no finished
/// task. Tasks of other tokens of the same user also match: the caller checks the UPID
/// itself (token, type, id, start time).
pub fn node_tasks(node: &str, filter: &TaskFilter<'_>) -> Request {
    Request::new(Method::Get, "/nodes/{node}/tasks", &[node])
        .param("source", "all")
        .param_opt("vmid", filter.vmid.map(|v| v.to_string()))
        .param("typefilter", filter.task_type)
        .param("userfilter", user_of_token(filter.user))
        .param("since", filter.since.to_string())
        .param("limit", "50")
}

// ---- access and pools --------------------------------------------------------------------

/// `GET /access/permissions[?path=...&userid=...]`: the caller's (or `userid`'s) privileges.
pub fn access_permissions(path: Option<&str>, userid: Option<&str>) -> Request {
    Request::new(Method::Get, "/access/permissions", &[])
        .param_opt("path", path)
        .param_opt("userid", userid)
}

/// `GET /pools[?poolid=...]`: all pools, or one pool with its members.
pub fn pools(poolid: Option<&str>) -> Request {
    Request::new(Method::Get, "/pools", &[]).param_opt("poolid", poolid)
}

/// `POST /pools`: create a pool.
pub fn pool_create(poolid: &str, comment: Option<&str>) -> Request {
    Request::new(Method::Post, "/pools", &[])
        .param("poolid", poolid)
        .param_opt("comment", comment)
}

/// `PUT /pools`: add or remove members, or change the comment.
pub fn pool_update(update: &PoolUpdate) -> Request {
    let vms = (!update.vms.is_empty()).then(|| {
        let ids: Vec<String> = update.vms.iter().map(u32::to_string).collect();
        ids.join(",")
    });
    let storage = (!update.storage.is_empty()).then(|| update.storage.join(","));
    Request::new(Method::Put, "/pools", &[])
        .param("poolid", update.poolid.as_str())
        .param_opt("vms", vms)
        .param_opt("storage", storage)
        .param_bool("delete", update.delete.then_some(true))
        .param_bool("allow-move", update.allow_move.then_some(true))
        .param_opt("comment", update.comment.as_deref())
}

/// `DELETE /pools?poolid=...`: delete an empty pool.
pub fn pool_delete(poolid: &str) -> Request {
    Request::new(Method::Delete, "/pools", &[]).param("poolid", poolid)
}

// ---- contract ----------------------------------------------------------------------------

/// One request from every builder above, with every optional parameter set, for the contract
/// test against PVE's API schema (`tests/contract.rs`). Free-form guest parameters are
/// represented by a few typical keys, including indexed ones (`scsi0`, `net0`).
pub fn all_endpoints_for_contract() -> Vec<Request> {
    let upid: Upid =
        match "UPID:pve1:0003A1F2:01B2C3D4:6650A1B2:download:debian.iso:root@pam:".parse() {
            Ok(upid) => upid,
            Err(_) => return Vec::new(), // unreachable: a constant, covered by upid.rs tests
        };
    let download = DownloadUrl {
        compression: Some("zstd".into()),
        verify_certificates: Some(true),
        ..DownloadUrl::new(ContentType::Iso, "https://example.invalid/d.iso", "d.iso")
            .with_checksum(crate::storage::ChecksumAlgorithm::Sha256, "00")
    };
    let qemu = Params::new()
        .set("name", "web")
        .set_int("memory", 2048)
        .set("scsi0", "local-lvm:8")
        .set("net0", "virtio,bridge=vmbr0")
        .set("tags", "a;b");
    let lxc = Params::new()
        .set("ostemplate", "local:vztmpl/debian.tar.zst")
        .set("hostname", "ct")
        .set("rootfs", "local-lvm:8")
        .set("net0", "name=eth0,bridge=vmbr0");
    let update = |set: Params| ConfigUpdate {
        set,
        delete: vec!["description".into()],
        revert: vec!["cores".into()],
        digest: Some("0".repeat(40)),
    };
    let clone = CloneOptions {
        newid: 200,
        name: Some("copy".into()),
        full: Some(true),
        target: Some("pve2".into()),
        storage: Some("local-lvm".into()),
        pool: Some("prod".into()),
        description: Some("d".into()),
    };
    let delete = DeleteOptions {
        purge: true,
        destroy_unreferenced_disks: true,
    };
    vec![
        version(),
        cluster_resources(Some(ResourceType::Vm)),
        cluster_status(),
        nodes(),
        node_status("pve1"),
        storages("pve1"),
        storage_status("pve1", "local"),
        storage_content("pve1", "local", Some(ContentType::Iso)),
        storage_volume("pve1", "local", "local:iso/d.iso"),
        storage_volume_delete("pve1", "local", "local:iso/d.iso", Some(5)),
        download_url("pve1", "local", &download),
        qemu_list("pve1"),
        qemu_create("pve1", 100, &qemu),
        qemu_delete("pve1", 100, delete),
        qemu_config("pve1", 100, true),
        qemu_config_post("pve1", 100, &update(qemu.clone())),
        qemu_config_put("pve1", 100, &update(qemu)),
        qemu_pending("pve1", 100),
        qemu_status_current("pve1", 100),
        qemu_start("pve1", 100),
        qemu_agent_ping("pve1", 100),
        qemu_stop("pve1", 100),
        qemu_shutdown_or_stop("pve1", 100, 120),
        qemu_reboot("pve1", 100, Some(60)),
        qemu_template("pve1", 100),
        qemu_clone("pve1", 100, &clone),
        qemu_resize("pve1", 100, "scsi0", "+1G"),
        lxc_list("pve1"),
        lxc_create("pve1", 101, &lxc),
        lxc_delete("pve1", 101, delete),
        lxc_config("pve1", 101, true),
        lxc_config_put(
            "pve1",
            101,
            &update(
                Params::new()
                    .set("hostname", "ct")
                    .set("mp0", "local-lvm:4,mp=/srv"),
            ),
        ),
        lxc_pending("pve1", 101),
        lxc_status_current("pve1", 101),
        lxc_start("pve1", 101),
        lxc_stop("pve1", 101),
        lxc_shutdown_or_stop("pve1", 101, 120),
        lxc_reboot("pve1", 101, Some(60)),
        lxc_template("pve1", 101),
        lxc_clone("pve1", 101, &clone),
        lxc_resize("pve1", 101, "rootfs", "+1G"),
        task_status("pve1", &upid),
        task_log("pve1", &upid, 0, 50),
        crate::backup::vzdump(
            "pve1",
            &crate::backup::Vzdump {
                vmid: 100,
                storage: "local".into(),
                mode: crate::backup::BackupMode::Snapshot,
                notes: Some("proxops {{guestname}}".into()),
            },
        ),
        crate::backup::ha_status_current(),
        node_tasks(
            "pve1",
            &TaskFilter {
                task_type: "qmcreate",
                vmid: Some(100),
                user: "proxops@pve!agent",
                since: 1_700_000_000,
            },
        ),
        access_permissions(Some("/vms/100"), Some("root@pam!ci")),
        pools(Some("prod")),
        pool_create("prod", Some("c")),
        pool_update(&PoolUpdate {
            poolid: "prod".into(),
            vms: vec![100, 101],
            storage: vec!["local".into()],
            delete: true,
            allow_move: true,
            comment: Some("c".into()),
        }),
        pool_delete("prod"),
    ]
    .into_iter()
    .chain(snapshot::contract_requests())
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::ChecksumAlgorithm;

    fn pairs(v: &[(String, String)]) -> Vec<(&str, &str)> {
        v.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    #[test]
    fn storage_content_filters_by_query_not_path() {
        let req = storage_content("pve1", "local", Some(ContentType::Iso));
        assert_eq!(req.method, Method::Get);
        assert_eq!(req.path, "/nodes/pve1/storage/local/content");
        assert_eq!(pairs(&req.query), [("content", "iso")]);
        assert!(req.form.is_empty());
        assert_eq!(req.to_string(), "GET /nodes/pve1/storage/local/content");
    }

    #[test]
    fn storage_config_and_cloudinit_update_name_their_paths_and_send_nothing_else() {
        let read = storage_config("local");
        assert_eq!(read.to_string(), "GET /storage/local");
        assert!(read.query.is_empty() && read.form.is_empty());
        let regenerate = qemu_cloudinit_update("pve1", 101);
        assert_eq!(regenerate.method, Method::Put);
        assert_eq!(regenerate.path, "/nodes/pve1/qemu/101/cloudinit");
        assert!(regenerate.form.is_empty());
    }

    #[test]
    fn task_status_percent_encodes_the_upid_segment() {
        let upid: Upid = "UPID:pve1:0003A1F2:01B2C3D4:6650A1B2:download:d.iso:root@pam!ci:"
            .parse()
            .unwrap();
        let req = task_status(upid.node(), &upid);
        assert_eq!(
            req.path,
            "/nodes/pve1/tasks/UPID%3Apve1%3A0003A1F2%3A01B2C3D4%3A6650A1B2%3Adownload%3Ad.iso%3Aroot%40pam!ci%3A/status"
        );
        assert_eq!(req.template, "/nodes/{node}/tasks/{upid}/status");
        let log = task_log("pve1", &upid, 0, 500);
        assert!(log.path.ends_with("%3A/log"));
        assert_eq!(pairs(&log.query), [("start", "0"), ("limit", "500")]);
    }

    #[test]
    fn volume_segment_keeps_colon_and_slash_inside_one_segment() {
        let req = storage_volume_delete("pve1", "local", "local:iso/a b.iso", None);
        assert_eq!(req.method, Method::Delete);
        assert_eq!(
            req.path,
            "/nodes/pve1/storage/local/content/local%3Aiso%2Fa%20b.iso"
        );
        assert!(req.query.is_empty());
    }

    #[test]
    fn download_url_sends_checksum_as_a_pair_in_the_form() {
        let d = DownloadUrl::new(
            ContentType::Import,
            "http://127.0.0.1:8080/debian.qcow2",
            "debian.qcow2",
        )
        .with_checksum(ChecksumAlgorithm::Sha512, "abc");
        let req = download_url("pve2", "local", &d);
        assert_eq!(req.method, Method::Post);
        assert_eq!(req.path, "/nodes/pve2/storage/local/download-url");
        assert!(req.query.is_empty());
        assert_eq!(
            pairs(&req.form),
            [
                ("content", "import"),
                ("url", "http://127.0.0.1:8080/debian.qcow2"),
                ("filename", "debian.qcow2"),
                ("checksum", "abc"),
                ("checksum-algorithm", "sha512"),
            ]
        );
    }

    #[test]
    fn download_url_without_checksum_sends_neither_half() {
        let d = DownloadUrl::new(ContentType::Iso, "https://x.invalid/a.iso", "a.iso");
        let req = download_url("pve1", "local", &d);
        assert!(req.parameters().all(|(k, _)| !k.starts_with("checksum")));
    }

    #[test]
    fn booleans_are_sent_as_one_and_zero() {
        let req = qemu_clone(
            "pve1",
            9000,
            &CloneOptions {
                newid: 9100,
                full: Some(true),
                name: Some("web".into()),
                ..CloneOptions::default()
            },
        );
        assert_eq!(req.path, "/nodes/pve1/qemu/9000/clone");
        assert_eq!(
            pairs(&req.form),
            [("newid", "9100"), ("name", "web"), ("full", "1")]
        );
        let p = Params::new()
            .set_bool("onboot", false)
            .set_bool("onboot", true);
        assert_eq!(p.iter().collect::<Vec<_>>(), [("onboot", "1")]);
    }

    #[test]
    fn a_shutdown_or_stop_sends_the_timeout_and_force_stop() {
        let qemu = qemu_shutdown_or_stop("pve1", 100, 90);
        assert_eq!(qemu.path, "/nodes/pve1/qemu/100/status/shutdown");
        assert_eq!(pairs(&qemu.form), [("timeout", "90"), ("forceStop", "1")]);
        let lxc = lxc_shutdown_or_stop("pve1", 101, 30);
        assert_eq!(lxc.path, "/nodes/pve1/lxc/101/status/shutdown");
        assert_eq!(pairs(&lxc.form), [("timeout", "30"), ("forceStop", "1")]);
        assert_eq!(pairs(&qemu_shutdown("pve1", 100, None).form), []);
    }

    #[test]
    fn lxc_clone_names_the_clone_by_hostname() {
        let req = lxc_clone(
            "pve1",
            101,
            &CloneOptions {
                newid: 102,
                name: Some("ct2".into()),
                ..CloneOptions::default()
            },
        );
        assert_eq!(pairs(&req.form), [("newid", "102"), ("hostname", "ct2")]);
    }

    #[test]
    fn the_task_list_is_filtered_by_the_tokens_user_because_pve_matches_finished_tasks_so() {
        let req = node_tasks(
            "pve1",
            &TaskFilter {
                task_type: "qmcreate",
                vmid: Some(110),
                user: "proxops@pve!agent",
                since: 1_700_000_000,
            },
        );
        assert_eq!(req.path, "/nodes/pve1/tasks");
        assert_eq!(
            pairs(&req.query),
            [
                ("source", "all"),
                ("vmid", "110"),
                ("typefilter", "qmcreate"),
                ("userfilter", "proxops@pve"),
                ("since", "1700000000"),
                ("limit", "50"),
            ]
        );
        let download = node_tasks(
            "pve1",
            &TaskFilter {
                task_type: "download",
                vmid: None,
                user: "root@pam",
                since: 0,
            },
        );
        assert!(!pairs(&download.query).iter().any(|(k, _)| *k == "vmid"));
        assert_eq!(user_of_token("a.b@ldap.corp!t_1"), "a.b@ldap.corp");
    }

    #[test]
    fn config_writes_join_delete_and_revert_lists() {
        let update = ConfigUpdate {
            set: Params::new().set_int("memory", 4096),
            delete: vec!["ide2".into(), "tags".into()],
            revert: vec![],
            digest: Some("d1".into()),
        };
        let put = qemu_config_put("pve1", 100, &update);
        assert_eq!(put.method, Method::Put);
        assert_eq!(put.path, "/nodes/pve1/qemu/100/config");
        assert_eq!(
            pairs(&put.form),
            [
                ("memory", "4096"),
                ("delete", "ide2,tags"),
                ("digest", "d1")
            ]
        );
        let post = qemu_config_post("pve1", 100, &update);
        assert_eq!(post.method, Method::Post);
        let lxc = lxc_config_put("pve1", 101, &update);
        assert_eq!(lxc.path, "/nodes/pve1/lxc/101/config");
        assert_eq!(lxc.method, Method::Put);
    }

    #[test]
    fn guest_lifecycle_paths_and_methods() {
        let cases = [
            (
                qemu_start("n", 100),
                Method::Post,
                "/nodes/n/qemu/100/status/start",
            ),
            (
                qemu_stop("n", 100),
                Method::Post,
                "/nodes/n/qemu/100/status/stop",
            ),
            (
                qemu_shutdown("n", 100, None),
                Method::Post,
                "/nodes/n/qemu/100/status/shutdown",
            ),
            (
                qemu_reboot("n", 100, None),
                Method::Post,
                "/nodes/n/qemu/100/status/reboot",
            ),
            (
                qemu_template("n", 100),
                Method::Post,
                "/nodes/n/qemu/100/template",
            ),
            (
                qemu_resize("n", 100, "scsi0", "+1G"),
                Method::Put,
                "/nodes/n/qemu/100/resize",
            ),
            (
                qemu_pending("n", 100),
                Method::Get,
                "/nodes/n/qemu/100/pending",
            ),
            (
                qemu_status_current("n", 100),
                Method::Get,
                "/nodes/n/qemu/100/status/current",
            ),
            (qemu_list("n"), Method::Get, "/nodes/n/qemu"),
            (
                lxc_start("n", 101),
                Method::Post,
                "/nodes/n/lxc/101/status/start",
            ),
            (
                lxc_template("n", 101),
                Method::Post,
                "/nodes/n/lxc/101/template",
            ),
            (
                lxc_resize("n", 101, "rootfs", "9G"),
                Method::Put,
                "/nodes/n/lxc/101/resize",
            ),
            (lxc_list("n"), Method::Get, "/nodes/n/lxc"),
        ];
        for (req, method, path) in cases {
            assert_eq!((req.method, req.path.as_str()), (method, path));
        }
    }

    #[test]
    fn guest_create_and_delete_carry_vmid_and_flags() {
        let create = qemu_create("pve1", 100, &Params::new().set("name", "web"));
        assert_eq!(create.path, "/nodes/pve1/qemu");
        assert_eq!(pairs(&create.form), [("vmid", "100"), ("name", "web")]);
        let delete = lxc_delete(
            "pve1",
            101,
            DeleteOptions {
                purge: true,
                destroy_unreferenced_disks: false,
            },
        );
        assert_eq!(delete.method, Method::Delete);
        assert_eq!(delete.path, "/nodes/pve1/lxc/101");
        assert_eq!(pairs(&delete.query), [("purge", "1")]);
        assert!(delete.form.is_empty());
    }

    #[test]
    fn cluster_and_pool_builders() {
        let r = cluster_resources(Some(ResourceType::Storage));
        assert_eq!(
            (r.path.as_str(), pairs(&r.query)),
            ("/cluster/resources", vec![("type", "storage")])
        );
        assert!(cluster_resources(None).query.is_empty());
        let del = pool_delete("prod");
        assert_eq!(
            (del.method, pairs(&del.query)),
            (Method::Delete, vec![("poolid", "prod")])
        );
        let upd = pool_update(&PoolUpdate {
            poolid: "prod".into(),
            vms: vec![100, 101],
            ..PoolUpdate::default()
        });
        assert_eq!(pairs(&upd.form), [("poolid", "prod"), ("vms", "100,101")]);
    }

    #[test]
    fn contract_list_covers_every_builder_once_with_consistent_paths() {
        let all = all_endpoints_for_contract();
        let distinct: std::collections::HashSet<_> =
            all.iter().map(|r| (r.method, r.template)).collect();
        assert_eq!(distinct.len(), all.len(), "one request per builder");
        assert_eq!(all.len(), 48 + 10 + 2 + 1);
        for req in &all {
            // the concrete path has as many segments as its template
            assert_eq!(
                req.path.split('/').count(),
                req.template.split('/').count(),
                "{req}"
            );
            assert!(req.method.has_body() || req.form.is_empty(), "{req}");
            assert!(!req.method.has_body() || req.query.is_empty(), "{req}");
        }
    }
}
