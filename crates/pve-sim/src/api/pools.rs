//! Resource pools: `GET /pools` (all, or one with `?poolid=`), `GET /pools/{poolid}`,
//! `POST /pools`, `PUT /pools` (and the older `PUT /pools/{poolid}`), `DELETE /pools/{poolid}`.
//!
//! PVE: pve-manager @ 14a22df3 `PVE/API2/Pool.pm` (`index`, `read_pool`, `create_pool`,
//! `update_pool`, `update_pool_deprecated`, `delete_pool_deprecated`). The schema's checks
//! (`Pool.Allocate` on `/pool/{poolid}` for writes, `Pool.Audit` for `GET /pools/{poolid}`)
//! run in the dispatcher; the checks made inside the handlers are here. Pool membership is
//! `user.cfg`'s (`$usercfg->{vms}->{$vmid}`), which is what makes a pool's guests inherit the
//! roles granted on `/pool/<pool>` (`acl.rs`, `with_pool_roles`).

use serde_json::{Value, json};

use super::Ctx;
use super::cluster::guest_resource;
use crate::cluster::{Cluster, Pool, now_epoch};
use crate::error::{ApiError, ApiResult};

/// The guests of a pool as `index` lists them: `sort keys %{ $pool_config->{vms} }` (vmids
/// as text), guests that no longer exist left out, optionally only of one `type`.
fn pool_members(cluster: &Cluster, pool: &Pool, only_type: Option<&str>) -> Vec<Value> {
    let now = now_epoch();
    let mut ids: Vec<String> = pool.vms.iter().map(u32::to_string).collect();
    ids.sort();
    ids.iter()
        .filter_map(|id| id.parse::<u32>().ok())
        .filter_map(|id| cluster.guests.get(&id))
        .filter(|g| only_type.is_none_or(|t| t == g.kind.as_str()))
        .map(|g| guest_resource(cluster, g, now))
        .collect()
}

/// `GET /pools`: every pool the caller holds `Pool.Audit` on, or with `poolid` that one
/// pool and its members. `index` checks `Pool.Audit` on `/pool/<poolid>` with `$noerr` and
/// ignores the answer, so naming a pool reads it whatever the caller holds.
pub(super) fn pools(ctx: &Ctx) -> ApiResult {
    let cluster = ctx.shared.cluster();
    let authid = ctx.authid();
    if let Some(id) = ctx.params.get("poolid") {
        let pool = cluster
            .pools
            .get(id)
            .ok_or_else(|| ApiError::die(format!("pool '{id}' does not exist")))?;
        let mut v = json!({
            "poolid": id,
            "members": pool_members(&cluster, pool, ctx.params.get("type")),
        });
        if let Some(c) = &pool.comment {
            v["comment"] = c.clone().into();
        }
        return Ok(Value::Array(vec![v]));
    }
    Ok(Value::Array(
        cluster
            .pools
            .iter()
            .filter(|(id, _)| {
                cluster
                    .acl
                    .holds(authid, &format!("/pool/{id}"), &["Pool.Audit"], false)
            })
            .map(|(id, p)| {
                let mut v = json!({ "poolid": id });
                if let Some(c) = &p.comment {
                    v["comment"] = c.clone().into();
                }
                v
            })
            .collect(),
    ))
}

/// `POST /pools` (`create_pool`): a new, empty pool; a nested one needs its parent, and
/// every level starts with a letter.
pub(super) fn pool_create(ctx: &Ctx) -> ApiResult {
    let id = ctx.params.required("poolid")?.to_string();
    let mut cluster = ctx.shared.cluster();
    let fail = |m: String| ApiError::die(format!("create pool failed: {m}\n"));
    if cluster.pools.contains_key(&id) {
        return Err(fail(format!("pool '{id}' already exists")));
    }
    let leaf = match id.rsplit_once('/') {
        Some((parent, leaf)) => {
            if !cluster.pools.contains_key(parent) {
                return Err(fail(format!(
                    "parent '{parent}' of pool '{id}' does not exist"
                )));
            }
            leaf
        }
        None => id.as_str(),
    };
    if !leaf.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(fail("pool name must start with a letter".to_string()));
    }
    cluster.pools.insert(
        id,
        Pool {
            comment: ctx
                .params
                .get("comment")
                .filter(|c| !c.is_empty())
                .map(str::to_string),
            ..Pool::default()
        },
    );
    Ok(Value::Null)
}

/// `GET /pools/{poolid}` (`read_pool`): the pool's members and comment.
pub(super) fn pool_get(ctx: &Ctx) -> ApiResult {
    let id = ctx.params.required("poolid")?;
    let cluster = ctx.shared.cluster();
    let pool = cluster
        .pools
        .get(id)
        .ok_or_else(|| ApiError::die(format!("pool '{id}' does not exist")))?;
    let mut v = json!({ "members": pool_members(&cluster, pool, ctx.params.get("type")) });
    if let Some(c) = &pool.comment {
        v["comment"] = c.clone().into();
    }
    Ok(v)
}

/// `DELETE /pools/{poolid}`: only an empty pool (destroyed guests do not count).
pub(super) fn pool_delete(ctx: &Ctx) -> ApiResult {
    let id = ctx.params.required("poolid")?.to_string();
    let mut cluster = ctx.shared.cluster();
    let fail = |m: String| ApiError::die(format!("delete pool failed: {m}\n"));
    let pool = cluster
        .pools
        .get(&id)
        .ok_or_else(|| fail(format!("pool '{id}' does not exist")))?;
    if let Some(vmid) = pool.vms.iter().find(|v| cluster.guests.contains_key(v)) {
        return Err(fail(format!(
            "pool '{id}' is not empty (contains VM {vmid})"
        )));
    }
    cluster.pools.remove(&id);
    Ok(Value::Null)
}

/// `PUT /pools` (`update_pool`): the comment, and guests added or (`delete`) removed, in the
/// order listed, each after `check_perm_modify` on `/vms/<vmid>` (any of
/// `Permissions.Modify`, `VM.Allocate`: what the guest's pool grants counts). A guest in
/// another pool moves only with `allow-move`, and then needs `Pool.Allocate` on the pool it
/// leaves. Guest ids are not checked against existing guests. Every refusal is raised inside
/// `lock_user_config(..., "update pools failed")`, which dies with the text: a plain 500
/// `update pools failed: <error>`, a permission error included (as `403 Permission check
/// failed (...)`, `PVE::Exception` `stringify`). Nothing is written when any guest fails
/// (`cfs_write_file` comes last).
pub(super) fn pool_update(ctx: &Ctx) -> ApiResult {
    let id = ctx.params.required("poolid")?.to_string();
    let remove = ctx.params.flag("delete").unwrap_or(false);
    let allow_move = ctx.params.flag("allow-move").unwrap_or(false);
    let authid = ctx.authid().to_string();
    let fail = |m: String| ApiError::die(format!("update pools failed: {m}"));
    let vms: Vec<u32> = ctx
        .params
        .get("vms")
        .map(|v| {
            v.split([',', ';', ' ', '\0'])
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse::<u32>().map_err(|_| {
                        ApiError::param(
                            "vms",
                            format!("value '{s}' does not look like a valid VM ID"),
                        )
                    })
                })
                .collect::<Result<_, _>>()
        })
        .transpose()?
        .unwrap_or_default();
    let mut cluster = ctx.shared.cluster();
    let Some(mut pool) = cluster.pools.get(&id).cloned() else {
        return Err(fail(format!("pool '{id}' does not exist\n")));
    };
    let mut leaving: Vec<(String, u32)> = Vec::new();
    for vmid in vms {
        cluster
            .acl
            .check(
                &authid,
                &format!("/vms/{vmid}"),
                &["Permissions.Modify", "VM.Allocate"],
                true,
            )
            .map_err(|e| fail(format!("403 {}", e.text())))?;
        if remove {
            if !pool.vms.remove(&vmid) {
                return Err(fail(format!("VM {vmid} is not a pool member\n")));
            }
            continue;
        }
        if pool.vms.contains(&vmid) {
            return Err(fail(format!("VM {vmid} is already a pool member\n")));
        }
        let existing = cluster
            .pools
            .iter()
            .find(|(other, p)| **other != id && p.vms.contains(&vmid))
            .map(|(other, _)| other.clone());
        if let Some(existing) = existing {
            if !allow_move {
                return Err(fail(format!(
                    "VM {vmid} belongs already to pool '{existing}' and 'allow-move' is not set\n"
                )));
            }
            cluster
                .acl
                .check(
                    &authid,
                    &format!("/pool/{existing}"),
                    &["Pool.Allocate"],
                    false,
                )
                .map_err(|e| fail(format!("403 {}", e.text())))?;
            leaving.push((existing, vmid));
        }
        pool.vms.insert(vmid);
    }
    if let Some(c) = ctx.params.get("comment") {
        pool.comment = Some(c.to_string());
    }
    for (other, vmid) in leaving {
        if let Some(p) = cluster.pools.get_mut(&other) {
            p.vms.remove(&vmid);
        }
    }
    cluster.pools.insert(id, pool);
    Ok(Value::Null)
}
