//! Cluster-wide and node endpoints: `/version`, `/cluster/{resources,status,nextid}`,
//! `/nodes`, `/nodes/{node}/status` and `/pools`.

use serde_json::{Value, json};

use super::Ctx;
use crate::cluster::{Cluster, now_epoch};
use crate::error::{ApiError, ApiResult};
use crate::guest::Guest;

pub(super) fn version() -> Value {
    json!({ "version": "9.1.1", "release": "9.1", "repoid": "a2c3c8f1" })
}

/// The entry of a guest in `/cluster/resources` (and a pool's member list).
///
/// PVE: pve-manager `PVE/API2/Cluster.pm` `resources` @ 14a22df3 builds it with
/// `PVE::API2Tools::extract_vm_stats`: `id`, `vmid`, `node`, `type` from the vmlist (at
/// once), everything else from pvestatd's RRD entry — `uptime`, `name`, `status`,
/// `template`, `maxcpu`, `maxmem`, `maxdisk` and the counters — or, with no entry yet,
/// `status => 'unknown'` and nothing more; then `lock` and `tags` raw from the config's
/// main section (`get_guest_config_properties`) and `pool` from the pool config, at once.
pub(super) fn guest_resource(cluster: &Cluster, g: &Guest, now: u64) -> Value {
    let mut v = json!({
        "id": format!("{}/{}", g.kind.as_str(), g.vmid),
        "type": g.kind.as_str(),
        "vmid": g.vmid,
        "node": g.node,
        "status": "unknown",
    });
    if let Some(stats) = cluster.guest_stats(g) {
        let uptime = stats
            .started_at
            .filter(|_| stats.running)
            .map_or(0, |s| now.saturating_sub(s));
        let extra = json!({
            "status": if stats.running { "running" } else { "stopped" },
            "name": stats.name,
            "template": u8::from(stats.template),
            "maxcpu": stats.maxcpu,
            "cpu": 0,
            "maxmem": stats.maxmem,
            "mem": if stats.running { stats.maxmem / 4 } else { 0 },
            "maxdisk": stats.maxdisk,
            "disk": 0,
            "netin": 0,
            "netout": 0,
            "diskread": 0,
            "diskwrite": 0,
            "uptime": uptime,
        });
        if let (Value::Object(out), Value::Object(extra)) = (&mut v, extra) {
            out.extend(extra);
        }
    }
    if let Some(tags) = g.config.get("tags") {
        v["tags"] = tags.clone().into();
    }
    if let Some(lock) = g.lock() {
        v["lock"] = lock.into();
    }
    if let Some(pool) = cluster.pool_of(g.vmid) {
        v["pool"] = pool.into();
    }
    v
}

fn node_resource(cluster: &Cluster, name: &str, now: u64) -> Value {
    let Some(n) = cluster.nodes.get(name) else {
        return Value::Null;
    };
    json!({
        "id": format!("node/{name}"),
        "type": "node",
        "node": name,
        "status": if n.online { "online" } else { "offline" },
        "level": "",
        "cgroup-mode": 2,
        "maxcpu": n.maxcpu,
        "cpu": 0.02,
        "maxmem": n.maxmem,
        "mem": n.maxmem / 8,
        "maxdisk": 100u64 << 30,
        "disk": 8u64 << 30,
        "uptime": now.saturating_sub(cluster.boot_time),
    })
}

pub(super) fn resources(ctx: &Ctx) -> ApiResult {
    let filter = ctx.params.get("type");
    let cluster = ctx.shared.cluster();
    let now = now_epoch();
    let mut out = Vec::new();
    let authid = ctx.authid();
    // Guests need VM.Audit, storages Datastore.Audit or AllocateSpace, pools Pool.Audit;
    // nodes are always listed.
    let may = |path: String, privs: &[&str]| cluster.acl.holds(authid, &path, privs, true);
    if filter.is_none() || filter == Some("vm") {
        out.extend(
            cluster
                .guests
                .values()
                .filter(|g| may(format!("/vms/{}", g.vmid), &["VM.Audit"]))
                .map(|g| {
                    // The pool only with Pool.Audit on it (`resources`: `delete
                    // $entry->{pool}` when `check(..., "/pool/$entry->{pool}", ['Pool.Audit'])`
                    // fails).
                    let mut entry = guest_resource(&cluster, g, now);
                    if let Some(pool) = cluster.pool_of(g.vmid)
                        && !may(format!("/pool/{pool}"), &["Pool.Audit"])
                        && let Value::Object(map) = &mut entry
                    {
                        map.remove("pool");
                    }
                    entry
                }),
        );
    }
    if filter.is_none() || filter == Some("node") {
        out.extend(
            cluster
                .nodes
                .keys()
                .map(|n| node_resource(&cluster, n, now)),
        );
    }
    if filter.is_none() || filter == Some("storage") {
        for node in cluster.nodes.keys() {
            for s in cluster.storages.iter().filter(|s| {
                s.is_on_node(node)
                    && may(
                        format!("/storage/{}", s.id),
                        &["Datastore.Audit", "Datastore.AllocateSpace"],
                    )
            }) {
                out.push(json!({
                    "id": format!("storage/{node}/{}", s.id),
                    "type": "storage",
                    "storage": s.id,
                    "node": node,
                    "plugintype": s.kind,
                    "status": if s.enabled { "available" } else { "unknown" },
                    "shared": u8::from(s.shared),
                    "content": s.content_list(),
                    "disk": cluster.used_bytes(node, &s.id),
                    "maxdisk": s.total,
                }));
            }
        }
    }
    if filter.is_none() {
        out.extend(
            cluster
                .pools
                .keys()
                .filter(|p| may(format!("/pool/{p}"), &["Pool.Audit"]))
                .map(|p| json!({ "id": format!("/pool/{p}"), "type": "pool", "pool": p })),
        );
    }
    if let Some(f) = filter
        && !matches!(f, "vm" | "node" | "storage" | "sdn")
    {
        return Err(ApiError::param(
            "type",
            format!(
                "value '{f}' does not have a value in the enumeration 'vm, storage, node, sdn'"
            ),
        ));
    }
    Ok(Value::Array(out))
}

/// `GET /cluster/status`: one `cluster` entry and one `node` entry per member, `local: 1` on
/// the node answering (pve-manager @ 14a22df3 `PVE/API2/Cluster.pm` `get_status`, from
/// pve-cluster's `get_clinfo`/`get_members`).
pub(super) fn status(ctx: &Ctx) -> Value {
    let cluster = ctx.shared.cluster();
    let mut out = vec![json!({
        "id": "cluster",
        "type": "cluster",
        "name": cluster.name,
        "nodes": cluster.nodes.len(),
        "quorate": 1,
        "version": 3,
    })];
    let local = local_node(&cluster);
    for (i, n) in cluster.nodes.values().enumerate() {
        out.push(json!({
            "id": format!("node/{}", n.name),
            "type": "node",
            "name": n.name,
            "nodeid": i + 1,
            "ip": format!("192.0.2.{}", 11 + i),
            "level": "",
            "local": u8::from(Some(n.name.as_str()) == local),
            "online": u8::from(n.online),
        }));
    }
    Value::Array(out)
}

/// `GET /cluster/nextid`: any user may ask (`user => 'all'`); the cluster's whole vmlist
/// decides, whatever the caller may audit: with `vmid`, that id or 400 `{"vmid": "VM N
/// already exists"}`; without, the lowest free id from 100 (pve-manager @ 14a22df3
/// `PVE/API2/Cluster.pm` `nextid`).
pub(super) fn nextid(ctx: &Ctx) -> ApiResult {
    let cluster = ctx.shared.cluster();
    match ctx.params.get("vmid") {
        Some(v) => {
            let id: u32 = v.parse().map_err(|_| {
                ApiError::param("vmid", format!("type check ('integer') failed - got '{v}'"))
            })?;
            if cluster.guests.contains_key(&id) {
                return Err(ApiError::param("vmid", format!("VM {id} already exists")));
            }
            // PVE returns the id as a string here.
            Ok(Value::String(id.to_string()))
        }
        None => Ok(Value::String(cluster.next_free_vmid().to_string())),
    }
}

/// The node the client talks to: the simulator serves every node from one address, and
/// models that address as the first node by name (`local: 1` in `/cluster/status`).
fn local_node(cluster: &Cluster) -> Option<&str> {
    cluster.nodes.keys().next().map(String::as_str)
}

/// A node's `ssl_fingerprint`. Every PVE node has its own certificate (`pve-ssl.pem`). The
/// local node reports the certificate the simulator really serves, so a client that pins the
/// fingerprint it finds there connects; the other nodes, whose certificates nobody can fetch,
/// report a SHA-256 derived from the node name (stable across runs). Over plain HTTP no
/// certificate is served and every node gets the derived one.
fn ssl_fingerprint(ctx: &Ctx, cluster: &Cluster, node: &str) -> String {
    match &ctx.shared.settings.fingerprint {
        Some(served) if Some(node) == local_node(cluster) => served.clone(),
        _ => {
            crate::tls::fingerprint(format!("proxops-pvesim certificate of node {node}").as_bytes())
        }
    }
}

pub(super) fn nodes(ctx: &Ctx) -> Value {
    let cluster = ctx.shared.cluster();
    let now = now_epoch();
    Value::Array(
        cluster
            .nodes
            .values()
            .map(|n| {
                json!({
                    "node": n.name,
                    "id": format!("node/{}", n.name),
                    "type": "node",
                    "status": if n.online { "online" } else { "offline" },
                    "cpu": 0.02,
                    "maxcpu": n.maxcpu,
                    "mem": n.maxmem / 8,
                    "maxmem": n.maxmem,
                    "disk": 8u64 << 30,
                    "maxdisk": 100u64 << 30,
                    "uptime": now.saturating_sub(cluster.boot_time),
                    "level": "",
                    "ssl_fingerprint": ssl_fingerprint(ctx, &cluster, &n.name),
                })
            })
            .collect(),
    )
}

pub(super) fn node_status(ctx: &Ctx) -> ApiResult {
    let cluster = ctx.shared.cluster();
    let n = cluster.node(ctx.node())?;
    let now = now_epoch();
    Ok(json!({
        "cpu": 0.02,
        "wait": 0,
        "uptime": now.saturating_sub(cluster.boot_time),
        "loadavg": ["0.10", "0.08", "0.05"],
        "kversion": "Linux 6.14.8-2-pve #1 SMP PREEMPT_DYNAMIC PMX 6.14.8-2 (2025-07-22T10:04Z)",
        "pveversion": "pve-manager/9.1.1/a2c3c8f1",
        "current-kernel": {
            "sysname": "Linux",
            "release": "6.14.8-2-pve",
            "version": "#1 SMP PREEMPT_DYNAMIC PMX 6.14.8-2 (2025-07-22T10:04Z)",
            "machine": "x86_64"
        },
        "boot-info": { "mode": "efi", "secureboot": 0 },
        "cpuinfo": {
            "cpus": n.maxcpu, "sockets": 1, "cores": n.maxcpu, "model": "Simulated CPU",
            "mhz": "2400.000", "hvm": "1", "flags": "", "user_hz": 100
        },
        "memory": { "total": n.maxmem, "used": n.maxmem / 8, "free": n.maxmem - n.maxmem / 8, "available": n.maxmem - n.maxmem / 8 },
        "swap": { "total": 8u64 << 30, "used": 0, "free": 8u64 << 30 },
        "rootfs": { "total": 100u64 << 30, "used": 8u64 << 30, "free": 92u64 << 30, "avail": 92u64 << 30 },
        "ksm": { "shared": 0 },
    }))
}
