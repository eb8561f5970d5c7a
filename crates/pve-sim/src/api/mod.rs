//! Request handling under `/api2/json`: the dispatcher (faults, authentication, parameter
//! extraction, schema check, routing) and PVE's response envelope. The handlers live in the
//! submodules, one per API area.
//!
//! Order follows pveproxy and `rest_handler`: authentication first (401 with an empty body),
//! then the handler lookup (501), path parameters given again with other values (400), API
//! tokens on endpoints without `allowtoken` (403, also on `/access/ticket`, which needs no
//! login), the method's schema permission check (403), proxying to the node (500/595),
//! parameter validation (400), then the handler (whose own permission checks are in
//! `permission.rs`).
//!
//! A `protected` call (every write the simulator implements) runs as pveproxy runs it: proxied
//! to pvedaemon with a 30 s timeout ([`proxied`]); a handler silent for longer is answered
//! 596 while it goes on.

mod access;
mod cluster;
mod config;
mod control;
mod disks;
mod guests;
mod ha;
mod lxc;
mod network;
mod permission;
mod pools;
mod qemu;
mod snapshot;
mod storage;
mod tasks;
mod vzdump;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::faults::Injected;
use crate::guest::Kind;
use crate::request_log::{RequestRecord, endpoint_template};
use crate::schema::{Route, Schema, SchemaError};
use crate::state::Shared;

/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Request parameters (query, body and path), as strings.
#[derive(Debug, Clone, Default)]
pub(crate) struct Params(pub(crate) BTreeMap<String, String>);

impl Params {
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// A boolean parameter (`1`) .
    pub(crate) fn flag(&self, key: &str) -> Option<bool> {
        self.get(key).map(|v| v == "1" || v == "true")
    }

    pub(crate) fn u64(&self, key: &str) -> ApiResult<Option<u64>> {
        self.get(key)
            .map(|v| {
                v.trim_start_matches('+').parse::<u64>().map_err(|_| {
                    ApiError::param(key, format!("type check ('integer') failed - got '{v}'"))
                })
            })
            .transpose()
    }

    pub(crate) fn required(&self, key: &str) -> ApiResult<&str> {
        self.get(key)
            .ok_or_else(|| ApiError::param(key, "property is missing and it is not optional"))
    }

    pub(crate) fn vmid(&self, key: &str) -> ApiResult<u32> {
        let v = self.required(key)?;
        v.parse::<u32>()
            .map_err(|_| ApiError::param(key, format!("type check ('integer') failed - got '{v}'")))
    }
}

/// One request as handlers see it.
pub(crate) struct Ctx {
    pub(crate) shared: Arc<Shared>,
    pub(crate) params: Params,
    pub(crate) caller: Option<Caller>,
}

impl Ctx {
    /// The authenticated caller's auth id (`root@pam` or `root@pam!proxops`).
    pub(crate) fn authid(&self) -> &str {
        self.caller
            .as_ref()
            .map_or("root@pam", |c| c.authid.as_str())
    }

    pub(crate) fn is_root_pam(&self) -> bool {
        self.caller.as_ref().is_some_and(Caller::is_root_pam)
    }

    pub(crate) fn node(&self) -> &str {
        self.params.get("node").unwrap_or_default()
    }
}

/// A successful answer: `data` plus the optional `total`.
pub(crate) struct Reply {
    data: Value,
    total: Option<usize>,
}

impl From<Value> for Reply {
    fn from(data: Value) -> Self {
        Self { data, total: None }
    }
}

impl Reply {
    pub(crate) fn with_total(data: Value, total: usize) -> Self {
        Self {
            data,
            total: Some(total),
        }
    }
}

/// Every endpoint the simulator implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Version,
    ClusterResources,
    ClusterStatus,
    ClusterNextid,
    ClusterTasks,
    ClusterOptions,
    Nodes,
    NodeStatus,
    Network,
    StorageIndex,
    StorageConfig,
    StorageStatus,
    StorageContent,
    VolumeGet,
    VolumeDelete,
    DownloadUrl,
    GuestList(Kind),
    GuestCreate(Kind),
    GuestIndex(Kind),
    GuestDelete(Kind),
    ConfigGet(Kind),
    ConfigPut(Kind),
    ConfigPost,
    Pending(Kind),
    StatusIndex(Kind),
    StatusCurrent(Kind),
    Power(Kind, guests::Power),
    Template(Kind),
    Clone(Kind),
    Resize(Kind),
    CloudinitUpdate,
    AgentPing,
    AgentNetwork,
    Agent,
    TaskList,
    TaskIndex,
    TaskStatus,
    TaskLog,
    TaskStop,
    PoolList,
    PoolCreate,
    PoolGet,
    PoolDelete,
    PoolUpdate,
    Permissions,
    TicketGet,
    TicketPost,
    Vzdump,
    HaStatusCurrent,
    Snapshot(Kind, SnapshotOp),
}

/// The snapshot endpoints of a guest (`snapshot.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SnapshotOp {
    List,
    Create,
    Delete,
    Rollback,
    Feature,
}

/// Finds the endpoint and the path parameters; `None` answers 501.
fn resolve(method: &str, segs: &[String]) -> Option<(Endpoint, BTreeMap<String, String>)> {
    use Endpoint as E;
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let mut p = BTreeMap::new();
    let mut put = |k: &str, v: &str| {
        p.insert(k.to_string(), v.to_string());
    };
    let kind_of = |k: &str| match k {
        "qemu" => Some(Kind::Qemu),
        "lxc" => Some(Kind::Lxc),
        _ => None,
    };
    let e = match (method, s.as_slice()) {
        ("GET", ["version"]) => E::Version,
        ("GET", ["cluster", "resources"]) => E::ClusterResources,
        ("GET", ["cluster", "status"]) => E::ClusterStatus,
        ("GET", ["cluster", "nextid"]) => E::ClusterNextid,
        ("GET", ["cluster", "tasks"]) => E::ClusterTasks,
        ("GET", ["cluster", "options"]) => E::ClusterOptions,
        ("GET", ["cluster", "ha", "status", "current"]) => E::HaStatusCurrent,
        ("GET", ["nodes"]) => E::Nodes,
        ("GET", ["pools"]) => E::PoolList,
        ("POST", ["pools"]) => E::PoolCreate,
        ("PUT", ["pools"]) => E::PoolUpdate,
        ("PUT", ["pools", id]) => {
            put("poolid", id);
            E::PoolUpdate
        }
        ("GET", ["pools", id]) => {
            put("poolid", id);
            E::PoolGet
        }
        ("DELETE", ["pools", id]) => {
            put("poolid", id);
            E::PoolDelete
        }
        ("GET", ["storage", sid]) => {
            put("storage", sid);
            E::StorageConfig
        }
        ("GET", ["access", "permissions"]) => E::Permissions,
        ("GET", ["access", "ticket"]) => E::TicketGet,
        ("POST", ["access", "ticket"]) => E::TicketPost,
        (m, ["nodes", node, rest @ ..]) => {
            put("node", node);
            match (m, rest) {
                ("GET", ["status"]) => E::NodeStatus,
                ("GET", ["network"]) => E::Network,
                ("POST", ["vzdump"]) => E::Vzdump,
                ("GET", ["storage"]) => E::StorageIndex,
                (m, ["storage", sid, rest @ ..]) => {
                    put("storage", sid);
                    match (m, rest) {
                        ("GET", ["status"]) => E::StorageStatus,
                        ("GET", ["content"]) => E::StorageContent,
                        // Volume ids contain `/`; the parameter takes the rest of the path.
                        ("GET", ["content", vol @ ..]) if !vol.is_empty() => {
                            put("volume", &vol.join("/"));
                            E::VolumeGet
                        }
                        ("DELETE", ["content", vol @ ..]) if !vol.is_empty() => {
                            put("volume", &vol.join("/"));
                            E::VolumeDelete
                        }
                        ("POST", ["download-url"]) => E::DownloadUrl,
                        _ => return None,
                    }
                }
                ("GET", ["tasks"]) => E::TaskList,
                (m, ["tasks", upid, rest @ ..]) => {
                    put("upid", upid);
                    match (m, rest) {
                        ("GET", []) => E::TaskIndex,
                        ("DELETE", []) => E::TaskStop,
                        ("GET", ["status"]) => E::TaskStatus,
                        ("GET", ["log"]) => E::TaskLog,
                        _ => return None,
                    }
                }
                ("GET", [k]) => E::GuestList(kind_of(k)?),
                ("POST", [k]) => E::GuestCreate(kind_of(k)?),
                (m, [k, vmid, rest @ ..]) => {
                    let kind = kind_of(k)?;
                    put("vmid", vmid);
                    match (m, rest) {
                        ("GET", []) => E::GuestIndex(kind),
                        ("DELETE", []) => E::GuestDelete(kind),
                        ("GET", ["config"]) => E::ConfigGet(kind),
                        ("PUT", ["config"]) => E::ConfigPut(kind),
                        ("POST", ["config"]) if kind == Kind::Qemu => E::ConfigPost,
                        ("GET", ["pending"]) => E::Pending(kind),
                        ("GET", ["status"]) => E::StatusIndex(kind),
                        ("GET", ["status", "current"]) => E::StatusCurrent(kind),
                        ("POST", ["status", action]) => {
                            E::Power(kind, guests::Power::parse(action)?)
                        }
                        ("POST", ["template"]) => E::Template(kind),
                        ("POST", ["clone"]) => E::Clone(kind),
                        ("PUT", ["resize"]) => E::Resize(kind),
                        ("PUT", ["cloudinit"]) if kind == Kind::Qemu => E::CloudinitUpdate,
                        ("POST", ["agent", "ping"]) if kind == Kind::Qemu => E::AgentPing,
                        ("GET", ["agent", "network-get-interfaces"]) if kind == Kind::Qemu => {
                            E::AgentNetwork
                        }
                        ("POST", ["agent"]) if kind == Kind::Qemu => E::Agent,
                        ("GET", ["snapshot"]) => E::Snapshot(kind, SnapshotOp::List),
                        ("POST", ["snapshot"]) => E::Snapshot(kind, SnapshotOp::Create),
                        ("GET", ["feature"]) => E::Snapshot(kind, SnapshotOp::Feature),
                        (m, ["snapshot", snap, rest @ ..]) => {
                            put("snapname", snap);
                            match (m, rest) {
                                ("DELETE", []) => E::Snapshot(kind, SnapshotOp::Delete),
                                ("POST", ["rollback"]) => E::Snapshot(kind, SnapshotOp::Rollback),
                                _ => return None,
                            }
                        }
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
        _ => return None,
    };
    Some((e, p))
}

async fn call(endpoint: Endpoint, ctx: &Ctx) -> ApiResult<Reply> {
    use Endpoint as E;
    // qemu create's own permission checks come first in its handler (`create_vm`); the
    // container create and config writes make theirs inside the handlers, in PVE's order.
    if endpoint == E::GuestCreate(Kind::Qemu) {
        permission::qemu_create(ctx)?;
    }
    match endpoint {
        E::Version => Ok(cluster::version().into()),
        E::ClusterResources => cluster::resources(ctx).map(Into::into),
        E::ClusterStatus => Ok(cluster::status(ctx).into()),
        E::ClusterNextid => cluster::nextid(ctx).map(Into::into),
        E::ClusterTasks => Ok(tasks::cluster_tasks(ctx)),
        E::ClusterOptions => Ok(permission::cluster_options(ctx).into()),
        E::Nodes => Ok(cluster::nodes(ctx).into()),
        E::NodeStatus => cluster::node_status(ctx).map(Into::into),
        E::Network => network::index(ctx).map(Into::into),
        E::PoolList => pools::pools(ctx).map(Into::into),
        E::PoolCreate => pools::pool_create(ctx).map(Into::into),
        E::PoolGet => pools::pool_get(ctx).map(Into::into),
        E::PoolDelete => pools::pool_delete(ctx).map(Into::into),
        E::PoolUpdate => pools::pool_update(ctx).map(Into::into),
        E::Permissions => access::permissions(ctx).map(Into::into),
        E::TicketGet => Ok(Value::Null.into()),
        E::TicketPost => access::ticket(ctx).await.map(Into::into),
        E::Vzdump => vzdump::vzdump(ctx).map(Into::into),
        E::HaStatusCurrent => ha::current(ctx).map(Into::into),
        E::StorageIndex => storage::index(ctx).map(Into::into),
        E::StorageConfig => storage::config(ctx).map(Into::into),
        E::StorageStatus => storage::status(ctx).map(Into::into),
        E::StorageContent => storage::content(ctx).map(Into::into),
        E::VolumeGet => storage::volume_get(ctx).map(Into::into),
        E::VolumeDelete => storage::volume_delete(ctx).await.map(Into::into),
        E::DownloadUrl => storage::download_url(ctx).map(Into::into),
        E::TaskList => tasks::node_tasks(ctx),
        E::TaskIndex => Ok(json!([{"name": "log"}, {"name": "status"}]).into()),
        E::TaskStatus => tasks::status(ctx).map(Into::into),
        E::TaskLog => tasks::log(ctx),
        E::TaskStop => tasks::stop(ctx).map(Into::into),
        E::GuestList(kind) => guests::list(ctx, kind).map(Into::into),
        E::GuestCreate(Kind::Qemu) => qemu::create(ctx).map(Into::into),
        E::GuestCreate(Kind::Lxc) => lxc::create(ctx).map(Into::into),
        E::GuestIndex(kind) => guests::index(ctx, kind).map(Into::into),
        E::GuestDelete(kind) => guests::delete(ctx, kind).await.map(Into::into),
        E::ConfigGet(kind) => config::get(ctx, kind).map(Into::into),
        E::ConfigPut(kind) => config::put(ctx, kind).await.map(Into::into),
        E::ConfigPost => config::post(ctx).await.map(Into::into),
        E::Pending(kind) => config::pending(ctx, kind).map(Into::into),
        E::StatusIndex(kind) => guests::status_index(ctx, kind).map(Into::into),
        E::StatusCurrent(kind) => guests::status_current(ctx, kind).map(Into::into),
        E::Power(kind, action) => guests::power(ctx, kind, action).await.map(Into::into),
        E::Template(kind) => guests::template(ctx, kind).await.map(Into::into),
        E::Clone(Kind::Qemu) => qemu::clone(ctx).map(Into::into),
        E::Clone(Kind::Lxc) => lxc::clone(ctx).map(Into::into),
        E::Resize(kind) => guests::resize(ctx, kind).map(Into::into),
        E::CloudinitUpdate => qemu::cloudinit_update(ctx).await.map(Into::into),
        E::AgentPing => qemu::agent(ctx, "ping").map(Into::into),
        E::AgentNetwork => qemu::agent(ctx, "network-get-interfaces").map(Into::into),
        E::Snapshot(kind, op) => match op {
            SnapshotOp::List => snapshot::list(ctx, kind).map(Into::into),
            SnapshotOp::Create => snapshot::create(ctx, kind).await.map(Into::into),
            SnapshotOp::Delete => snapshot::delete(ctx, kind).await.map(Into::into),
            SnapshotOp::Rollback => snapshot::rollback(ctx, kind).await.map(Into::into),
            SnapshotOp::Feature => snapshot::feature(ctx, kind).map(Into::into),
        },
        E::Agent => {
            let command = ctx.params.required("command")?.to_string();
            qemu::agent(ctx, &command).map(Into::into)
        }
    }
}

fn decode(segment: &str) -> String {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8_lossy()
        .into_owned()
}

fn json_to_param(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::Bool(b) => Some(if *b { "1" } else { "0" }.to_string()),
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        other => Some(other.to_string()),
    }
}

/// Query, then body (form or JSON); query values win, as `extract_params` merges them.
fn extract_params(
    query: &str,
    content_type: &str,
    body: &[u8],
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut params = BTreeMap::new();
    if !body.is_empty() {
        if content_type.starts_with("application/json") {
            let v: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::die(format!("unable to parse JSON body - {e}")))?;
            if let Value::Object(map) = v {
                for (k, v) in &map {
                    if let Some(s) = json_to_param(v) {
                        params.insert(k.clone(), s);
                    }
                }
            }
        } else {
            for (k, v) in form_urlencoded::parse(body) {
                params.insert(k.into_owned(), v.into_owned());
            }
        }
    }
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        params.insert(k.into_owned(), v.into_owned());
    }
    Ok(params)
}

fn header<'a>(req: &'a hyper::http::request::Parts, name: &str) -> Option<&'a str> {
    req.headers.get(name).and_then(|v| v.to_str().ok())
}

/// Handles one HTTP request.
pub(crate) async fn dispatch(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return plain(StatusCode::PAYLOAD_TOO_LARGE, "request body too large"),
    };
    let method = parts.method.as_str().to_string();
    let raw_path = parts.uri.path().to_string();
    if raw_path == "/_sim" || raw_path.starts_with("/_sim/") {
        return control::handle(&shared, &method, &raw_path, &body);
    }
    let Some(rel_raw) = raw_path.strip_prefix("/api2/json") else {
        return plain(StatusCode::NOT_FOUND, "Not Found");
    };
    let rel_raw = if rel_raw.is_empty() { "/" } else { rel_raw };
    let segs: Vec<String> = rel_raw
        .split('/')
        .filter(|s| !s.is_empty())
        .map(decode)
        .collect();
    let rel = format!("/{}", segs.join("/"));

    let delay = shared.faults().latency_for(&rel);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }

    let query = parts.uri.query().unwrap_or("");
    let content_type = header(&parts, "content-type").unwrap_or("");
    // GET and DELETE take parameters from the query string only.
    let body_params: &[u8] = if matches!(method.as_str(), "POST" | "PUT") {
        &body
    } else {
        &[]
    };
    let params = extract_params(query, content_type, body_params);
    let mut record = RequestRecord {
        seq: 0,
        method: method.clone(),
        path: rel.clone(),
        endpoint: endpoint_template(rel_raw),
        params: params
            .as_ref()
            .map(|p| mask_secrets(p.clone()))
            .unwrap_or_default(),
        user: None,
        status: 0,
    };

    let mut result = handle(&shared, &parts, &method, &rel, &segs, params).await;
    // PVE acted, but the answer is lost (a proxy dropping the connection): the caller sees
    // only the injected error.
    if let Ok((caller, _)) = &result
        && let Some(injected) = shared.faults().take_lost_answer(&method, &rel)
    {
        result = Err((caller.clone(), injected_error(injected)));
    }
    let response = match result {
        Ok((caller, reply)) => {
            record.user = caller.map(|c| c.authid);
            success(reply)
        }
        Err((caller, err)) => {
            record.user = caller.map(|c| c.authid);
            if let ApiError::Unauthorized(_) = &err {
                let delay = shared.settings.auth_failure_delay;
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
            }
            failure(&err)
        }
    };
    record.status = response.status().as_u16();
    tracing::debug!(method = %record.method, path = %record.path, status = record.status, "request");
    shared.log().record(record);
    response
}

fn injected_error(injected: Injected) -> ApiError {
    match injected {
        Injected::Die(m) => ApiError::die(m),
        Injected::Forbidden(m) => ApiError::forbidden(m),
        Injected::Proxy(status) => ApiError::Proxy {
            status,
            reason: "Errors during connection establishment, proxy handshake: Connection refused"
                .to_string(),
        },
    }
}

type Handled = Result<(Option<Caller>, Reply), (Option<Caller>, ApiError)>;

async fn handle(
    shared: &Arc<Shared>,
    parts: &hyper::http::request::Parts,
    method: &str,
    rel: &str,
    segs: &[String],
    params: Result<BTreeMap<String, String>, ApiError>,
) -> Handled {
    if let Some(injected) = shared.faults().take_http(method, rel) {
        return Err((None, injected_error(injected)));
    }

    // pveproxy extracts the token header whenever no ticket cookie is sent, also on the paths
    // that need no login (`auth_handler` returns it for them too).
    let cookie = header(parts, "cookie").and_then(crate::auth::cookie_ticket);
    let authorization = header(parts, "authorization");
    let public = rel == "/access/ticket" || rel == "/access/domains";
    let caller = if public {
        None
    } else {
        let result = shared.cluster().auth.authenticate(
            method,
            cookie.as_deref(),
            authorization,
            header(parts, "csrfpreventiontoken"),
        );
        match result {
            Ok(c) => Some(c),
            Err(f) => return Err((None, ApiError::Unauthorized(f.reason().to_string()))),
        }
    };
    let api_token = match &caller {
        Some(c) => c.is_token,
        None => {
            cookie.as_deref().is_none_or(str::is_empty)
                && crate::auth::api_token_sent(authorization)
        }
    };
    let fail = |e: ApiError| (caller.clone(), e);

    let mut params = params.map_err(fail)?;
    let Some((endpoint, path_params)) = resolve(method, segs) else {
        return Err(fail(ApiError::NotImplemented {
            method: method.to_string(),
            path: rel.to_string(),
        }));
    };
    for (k, v) in &path_params {
        if let Some(given) = params.get(k) {
            if given != v {
                return Err(fail(ApiError::param(
                    k,
                    "duplicate parameter (already defined in URI) with conflicting values!",
                )));
            }
            params.remove(k);
        }
    }
    // The schema's endpoint, looked up once for the token, permission, protection and
    // parameter checks below.
    let route = Schema::vendored().lookup(method, rel).ok();
    // `rest_handler` refuses tokens on endpoints without `allowtoken` right after the handler
    // lookup, before permissions, proxying and parameter validation.
    if api_token && !allows_token(route.as_ref()) {
        return Err(fail(ApiError::forbidden(format!(
            "Permission check failed (URI '{rel}' not available with API token, need proper ticket.\n)"
        ))));
    }
    if let Some(caller) = &caller {
        let mut all = params.clone();
        all.extend(path_params.clone());
        api2_permissions(shared, &caller.authid, route.as_ref(), &all).map_err(fail)?;
    }
    // pveproxy forwards `proxyto: node` calls before the handler validates anything: an
    // unknown node fails the DNS lookup, an offline one the connection (595).
    if let Some(node) = path_params.get("node") {
        proxy_check(shared, node).map_err(fail)?;
    }
    if shared.settings.validate {
        check_schema(method, rel, route.as_ref(), &params).map_err(fail)?;
    }
    params.extend(path_params);
    let ctx = Ctx {
        shared: Arc::clone(shared),
        params: Params(params),
        caller: caller.clone(),
    };
    let result = if route.as_ref().is_some_and(|r| r.protected) {
        proxied(shared, endpoint, ctx).await
    } else {
        call(endpoint, &ctx).await
    };
    match result {
        Ok(reply) => Ok((caller, reply)),
        Err(e) => Err((caller, e)),
    }
}

/// Runs a `protected` handler as pveproxy does: pveproxy (uid www-data) proxies every
/// `protected` call to pvedaemon on `localhost:85`, on a single node too (pve-manager
/// 14a22df3 `PVE/HTTPServer.pm` `rest_handler`: `if ($info->{protected} && ($euid != 0))` →
/// `proxy => 'localhost'`), with `http_request(..., timeout => 30)` (pve-http-server 5c9e4ea
/// `src/PVE/APIServer/AnyEvent.pm` `proxy_request`). AnyEvent::HTTP sets `$ae_error = 596;
/// # request phase` before it writes the request, and its handle's timeout reports that code
/// with `Connection timed out`, which pveproxy passes on as status and reason. pvedaemon is not
/// told: the handler runs to its end, its changes and its task stand.
async fn proxied(shared: &Arc<Shared>, endpoint: Endpoint, ctx: Ctx) -> ApiResult<Reply> {
    let limit = shared.settings.proxy_timeout;
    let handler = shared
        .tracker
        .spawn(async move { call(endpoint, &ctx).await });
    match tokio::time::timeout(limit, handler).await {
        Ok(Ok(result)) => result,
        Ok(Err(join)) => Err(ApiError::die(format!("handler failed: {join}"))),
        Err(_) => Err(ApiError::Proxy {
            status: 596,
            reason: "Connection timed out".to_string(),
        }),
    }
}

fn proxy_check(shared: &Shared, node: &str) -> ApiResult<()> {
    let cluster = shared.cluster();
    if !cluster.node(node)?.online {
        return Err(ApiError::Proxy {
            status: 595,
            reason: "Errors during connection establishment, proxy handshake: No route to host"
                .to_string(),
        });
    }
    Ok(())
}

/// The method's schema `permissions` for this caller (`check_api2_permissions`). An endpoint
/// the schema does not know is not refused here: validation answers it with 501.
fn api2_permissions(
    shared: &Shared,
    authid: &str,
    route: Option<&Route<'_>>,
    params: &BTreeMap<String, String>,
) -> ApiResult<()> {
    let Some(route) = route else {
        return Ok(());
    };
    let cluster = shared.cluster();
    permission::check_api2(&cluster.acl, authid, route.permissions, params)
}

/// Whether the schema lets API tokens call this endpoint (`allowtoken`). An endpoint the
/// schema does not know is not refused here: validation answers it with 501.
fn allows_token(route: Option<&Route<'_>>) -> bool {
    route.is_none_or(|r| r.allowtoken)
}

/// The one place requests meet the vendored schema's parameter rules (`Schema::check`, with
/// the route the dispatcher looked up already).
fn check_schema(
    method: &str,
    path: &str,
    route: Option<&Route<'_>>,
    params: &BTreeMap<String, String>,
) -> ApiResult<()> {
    let checked = match route {
        Some(route) => Schema::vendored().validate(method, route.matched.clone(), params),
        None => Err(SchemaError::NotImplemented),
    };
    match checked {
        Ok(_) => Ok(()),
        Err(SchemaError::NotImplemented) => Err(ApiError::NotImplemented {
            method: method.to_string(),
            path: path.to_string(),
        }),
        Err(SchemaError::Invalid(errors)) => Err(ApiError::Params(errors)),
    }
}

fn mask_secrets(mut params: BTreeMap<String, String>) -> BTreeMap<String, String> {
    for key in ["password", "cipassword"] {
        if let Some(v) = params.get_mut(key) {
            *v = "**********".to_string();
        }
    }
    params
}

fn with_headers(builder: hyper::http::response::Builder) -> hyper::http::response::Builder {
    builder
        .header("server", "pve-api-daemon/3.0")
        .header("cache-control", "max-age=0")
        .header("pragma", "no-cache")
}

fn json_response(
    status: StatusCode,
    reason: Option<&str>,
    body: &impl serde::Serialize,
) -> Response<Full<Bytes>> {
    let mut bytes = Vec::with_capacity(512);
    if serde_json::to_writer(&mut bytes, body).is_err() {
        bytes.clear();
    }
    let mut builder = with_headers(Response::builder().status(status))
        .header("content-type", "application/json;charset=UTF-8");
    if let Some(reason) = reason
        && let Ok(r) = hyper::ext::ReasonPhrase::try_from(reason.as_bytes().to_vec())
    {
        builder = builder.extension(r);
    }
    builder
        .body(Full::new(Bytes::from(bytes)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn empty_response(status: u16, reason: &str) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut builder = with_headers(Response::builder().status(status));
    if let Ok(r) = hyper::ext::ReasonPhrase::try_from(reason.as_bytes().to_vec()) {
        builder = builder.extension(r);
    }
    builder
        .body(Full::new(Bytes::new()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

pub(crate) fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from(text.to_string())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// PVE's success envelope, `{"data": ..., "total": ...}`, serialised straight from the reply
/// (no envelope `Value` is built around `data`).
#[derive(serde::Serialize)]
struct Envelope<'a> {
    data: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    total: Option<usize>,
}

fn success(reply: Reply) -> Response<Full<Bytes>> {
    let Reply { data, total } = reply;
    json_response(StatusCode::OK, None, &Envelope { data: &data, total })
}

fn first_line(message: &str) -> &str {
    message.lines().next().unwrap_or("")
}

fn failure(err: &ApiError) -> Response<Full<Bytes>> {
    match err {
        ApiError::Die { status, message } => {
            let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_response(
                status,
                Some(first_line(message)),
                &json!({ "data": null, "message": message }),
            )
        }
        ApiError::Params(errors) => json_response(
            StatusCode::BAD_REQUEST,
            Some("Parameter verification failed."),
            &json!({
                "data": null,
                "message": "Parameter verification failed.\n",
                "errors": errors,
            }),
        ),
        ApiError::Unauthorized(reason) => empty_response(401, reason),
        ApiError::Forbidden(message) => json_response(
            StatusCode::FORBIDDEN,
            Some(first_line(message)),
            &json!({ "data": null, "message": message }),
        ),
        ApiError::NotImplemented { method, path } => {
            let message = format!("Method '{method} {path}' not implemented");
            json_response(
                StatusCode::NOT_IMPLEMENTED,
                Some(&message),
                &json!({ "data": null, "message": format!("{message}\n") }),
            )
        }
        ApiError::Proxy { status, reason } => empty_response(*status, reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(path: &str) -> Vec<String> {
        path.split('/')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn lxc_config_has_no_post_and_resize_is_put_only() {
        assert!(resolve("POST", &segs("/nodes/pve1/lxc/100/config")).is_none());
        assert!(resolve("POST", &segs("/nodes/pve1/qemu/100/resize")).is_none());
        assert!(resolve("PUT", &segs("/nodes/pve1/qemu/100/resize")).is_some());
        assert!(resolve("GET", &segs("/nodes/pve1/storage/local/download-url")).is_none());
    }

    #[test]
    fn query_values_win_over_body_values() {
        let p = extract_params("a=2", "application/x-www-form-urlencoded", b"a=1&b=x").unwrap();
        assert_eq!(p["a"], "2");
        let j = extract_params("", "application/json", br#"{"start":true,"n":5}"#).unwrap();
        assert_eq!((j["start"].as_str(), j["n"].as_str()), ("1", "5"));
    }
}
