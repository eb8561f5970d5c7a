//! Storage endpoints: `/nodes/{node}/storage` (list), `{storage}/status`, `{storage}/content`
//! (list, one volume, delete) and `{storage}/download-url`. Listings show only what the
//! caller may see; reads and deletes of one volume make pve-storage's volume checks.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Ctx;
use super::permission::volume_access;
use crate::cluster::{Cluster, now_epoch};
use crate::download;
use crate::error::{ApiError, ApiResult};
use crate::storage::{self, StorageDef, Volume};
use crate::task::{self, Prepare, TaskSpec, Work};

fn storage_entry(cluster: &Cluster, node: &str, s: &StorageDef, with_id: bool) -> Value {
    let used = cluster.used_bytes(node, &s.id);
    let mut v = json!({
        "type": s.kind,
        "content": s.content_list(),
        "enabled": u8::from(s.enabled),
        "active": u8::from(s.enabled),
        "shared": u8::from(s.shared),
        "total": s.total,
        "used": used,
        "avail": s.total.saturating_sub(used),
    });
    if with_id {
        v["storage"] = s.id.clone().into();
        v["used_fraction"] = (used as f64 / s.total.max(1) as f64).into();
    }
    v
}

pub(super) fn index(ctx: &Ctx) -> ApiResult {
    let cluster = ctx.shared.cluster();
    let node = ctx.node();
    cluster.node(node)?;
    let content = ctx.params.get("content");
    let only = ctx.params.get("storage");
    let enabled_only = ctx.params.flag("enabled").unwrap_or(false);
    let authid = ctx.authid();
    // "Only list entries where you have 'Datastore.Audit' or 'Datastore.AllocateSpace'".
    let visible = |s: &&StorageDef| {
        cluster.acl.holds(
            authid,
            &format!("/storage/{}", s.id),
            &["Datastore.Audit", "Datastore.AllocateSpace"],
            true,
        )
    };
    Ok(Value::Array(
        cluster
            .storages
            .iter()
            .filter(|s| s.is_on_node(node))
            .filter(|s| only.is_none_or(|o| o == s.id))
            .filter(|s| !enabled_only || s.enabled)
            .filter(visible)
            .filter(|s| content.is_none_or(|c| c.split(',').any(|c| s.has_content(c))))
            .map(|s| storage_entry(&cluster, node, s, true))
            .collect(),
    ))
}

pub(super) fn status(ctx: &Ctx) -> ApiResult {
    let cluster = ctx.shared.cluster();
    let node = ctx.node();
    cluster.node(node)?;
    let s = cluster.storage(node, ctx.params.required("storage")?)?;
    Ok(storage_entry(&cluster, node, s, false))
}

fn content_entry(sid: &str, volname: &str, v: &Volume) -> Value {
    let mut e = json!({
        "volid": format!("{sid}:{volname}"),
        "content": v.content,
        "format": v.format,
        "size": v.size,
        "ctime": v.ctime,
    });
    if let Some(vmid) = v.vmid {
        e["vmid"] = vmid.into();
        e["used"] = v.size.into();
    }
    e
}

pub(super) fn content(ctx: &Ctx) -> ApiResult {
    let node = ctx.node().to_string();
    let sid = ctx.params.required("storage")?.to_string();
    let cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    let def = cluster.storage(&node, &sid)?;
    if let Some(message) = ctx.shared.faults().take_storage_listing(&node, &sid) {
        return Err(ApiError::die(message));
    }
    if !def.enabled {
        return Err(ApiError::die(format!("storage '{sid}' is disabled")));
    }
    let filter = ctx.params.get("content");
    let vmid = ctx.params.get("vmid").and_then(|v| v.parse::<u32>().ok());
    let authid = ctx.authid();
    let mut volumes = cluster.volumes(&node, &sid);
    // A storage mapped to a directory lists the snippets that are there, whoever wrote them
    // (pve-storage `volume_list`: only the content types the storage is configured for).
    if cluster.storage_dirs && def.is_file_based() && def.has_content("snippets") {
        volumes.retain(|(_, v)| v.content != "snippets");
        volumes.extend(storage::snippet_files(def));
    }
    Ok(Value::Array(
        volumes
            .iter()
            .filter(|(_, v)| filter.is_none_or(|f| v.content == f))
            .filter(|(_, v)| vmid.is_none_or(|id| v.vmid == Some(id)))
            // Entries the caller may not access are left out, not refused.
            .filter(|(name, _)| {
                volume_access(&cluster.acl, authid, &format!("{sid}:{name}"), None).is_ok()
            })
            .map(|(name, v)| content_entry(&sid, name, v))
            .collect(),
    ))
}

/// `GET /storage/{storage}`: the storage's `storage.cfg` section as pve-storage's
/// `api_storage_config` answers it (pve-storage 0c56bad `src/PVE/API2/Storage/Config.pm`):
/// the section's keys, `content` and `nodes` as comma lists, `shared` as `parse_config`
/// sets it (1 for the shared plugin types, absent otherwise), `path` for file based
/// storages, and the config's `digest`. The schema's `Datastore.Allocate` check runs before.
pub(super) fn config(ctx: &Ctx) -> ApiResult {
    let cluster = ctx.shared.cluster();
    let sid = ctx.params.required("storage")?;
    let def = cluster
        .storages
        .iter()
        .find(|s| s.id == sid)
        .ok_or_else(|| ApiError::die(format!("storage '{sid}' does not exist")))?;
    let mut v = json!({
        "storage": def.id,
        "type": def.kind,
        "content": def.content_list(),
        "digest": "0000000000000000000000000000000000000000",
    });
    if def.is_file_based() {
        v["path"] = def.path.clone().into();
    }
    if def.shared {
        v["shared"] = 1.into();
    }
    if !def.enabled {
        v["disable"] = 1.into();
    }
    if let Some(nodes) = &def.nodes {
        v["nodes"] = nodes.join(",").into();
    }
    Ok(v)
}

/// The full volume id for the `{volume}` path parameter (a volid or a name relative to the
/// storage), checked to parse.
fn resolve_volume(cluster: &Cluster, node: &str, sid: &str, volume: &str) -> ApiResult<String> {
    let def = cluster.storage(node, sid)?;
    let volid = if storage::split_volid(volume).is_some() {
        volume.to_string()
    } else {
        format!("{sid}:{volume}")
    };
    let volname = storage::split_volid(&volid).map_or("", |(_, n)| n);
    if let Err(e) = storage::parse_volname(volname) {
        return Err(ApiError::die(if def.is_file_based() {
            e
        } else {
            format!("unable to parse lvm volume name '{volname}'")
        }));
    }
    Ok(volid)
}

pub(super) fn volume_get(ctx: &Ctx) -> ApiResult {
    let node = ctx.node();
    let sid = ctx.params.required("storage")?;
    let cluster = ctx.shared.cluster();
    cluster.node(node)?;
    let volid = resolve_volume(&cluster, node, sid, ctx.params.required("volume")?)?;
    volume_access(&cluster.acl, ctx.authid(), &volid, None)?;
    let vol = cluster.volume(node, &volid).ok_or_else(|| {
        ApiError::die(format!("volume_size_info on '{volid}' failed - no format"))
    })?;
    let def = cluster.storage(node, sid)?;
    let volname = storage::split_volid(&volid).map_or("", |(_, n)| n);
    let path = if def.is_file_based() {
        let file = volname.split_once('/').map_or(volname, |(_, f)| f);
        match vol.content.as_str() {
            "images" | "rootdir" => format!("{}/images/{volname}", def.path),
            c => format!("{}/{file}", def.content_dir(c)),
        }
    } else {
        format!("/dev/pve/{volname}")
    };
    Ok(json!({
        "path": path,
        "size": vol.size,
        "used": vol.size,
        "format": vol.format,
    }))
}

pub(super) async fn volume_delete(ctx: &Ctx) -> ApiResult {
    let node = ctx.node().to_string();
    let sid = ctx.params.required("storage")?.to_string();
    let delay = ctx.params.u64("delay")?;
    let upid = {
        let mut cluster = ctx.shared.cluster();
        cluster.node(&node)?;
        let volid = resolve_volume(&cluster, &node, &sid, ctx.params.required("volume")?)?;
        let owner = cluster.volume(&node, &volid).and_then(|v| v.vmid);
        delete_access(&cluster, ctx.authid(), &sid, &volid, owner)?;
        let id = owner.map_or_else(|| sid.clone(), |o| format!("{o}@{sid}"));
        let node2 = node.clone();
        let work: Work = Box::new(move |c, log, injected| {
            if let Some(m) = injected {
                return Err(m);
            }
            if !c.free_volume(&node2, &volid) {
                return Err(format!("volume '{volid}' does not exist"));
            }
            log.push(format!("Removed volume '{volid}'"));
            Ok(())
        });
        let spec = TaskSpec {
            node: &node,
            kind: "imgdel",
            id,
            user: ctx.authid(),
        };
        task::start(&ctx.shared, &mut cluster, &spec, work)
    };
    if let Some(secs) = delay
        && task::wait_for(&ctx.shared, &upid, Duration::from_secs(secs)).await == Some(true)
    {
        return Ok(Value::Null);
    }
    Ok(Value::String(upid))
}

/// "You need 'Datastore.Allocate' privilege on the storage (or 'Datastore.AllocateSpace' for
/// backup volumes if you have VM.Backup privilege on the VM)."
fn delete_access(
    cluster: &Cluster,
    authid: &str,
    sid: &str,
    volid: &str,
    owner: Option<u32>,
) -> ApiResult<()> {
    let path = format!("/storage/{sid}");
    let backup = storage::split_volid(volid)
        .and_then(|(_, name)| storage::parse_volname(name).ok())
        .is_some_and(|p| p.content == "backup");
    if authid == "root@pam"
        || cluster
            .acl
            .holds(authid, &path, &["Datastore.Allocate"], false)
    {
        return Ok(());
    }
    if backup && let Some(vmid) = owner {
        cluster
            .acl
            .check(authid, &path, &["Datastore.AllocateSpace"], false)?;
        return cluster
            .acl
            .check(authid, &format!("/vms/{vmid}"), &["VM.Backup"], false);
    }
    cluster
        .acl
        .check(authid, &path, &["Datastore.Allocate"], false)
}

pub(super) fn download_url(ctx: &Ctx) -> ApiResult {
    let p = &ctx.params;
    let node = ctx.node().to_string();
    let sid = p.required("storage")?.to_string();
    let url = p.required("url")?.to_string();
    let content = p.required("content")?.to_string();
    let filename = download::normalise_filename(p.required("filename")?);
    let checksum = p.get("checksum").map(str::to_lowercase);
    let algorithm = p.get("checksum-algorithm").map(str::to_lowercase);
    let verify = p.flag("verify-certificates").unwrap_or(true);
    let mut cluster = ctx.shared.cluster();
    cluster.node(&node)?;
    let def = cluster.storage(&node, &sid)?.clone();
    if !def.enabled {
        return Err(ApiError::die(format!("storage '{sid}' is disabled")));
    }
    if !def.is_file_based() {
        return Err(ApiError::die(format!(
            "can't upload to storage type '{}', not a file based storage!",
            def.kind
        )));
    }
    if !def.has_content(&content) {
        return Err(ApiError::die(format!(
            "storage '{sid}' is not configured for content-type '{content}'"
        )));
    }
    download::check_extension(&content, &filename).map_err(|m| ApiError::param("filename", m))?;
    if let Some(c) = p.get("compression") {
        if content != "iso" {
            return Err(ApiError::die(format!(
                "decompression not supported for {content}"
            )));
        }
        if !matches!(c, "gz" | "lzo" | "zst" | "bz2") {
            return Err(ApiError::die("no decompression method found"));
        }
    }
    let dir = def.content_dir(&content);
    let path = format!("{dir}/{filename}");
    let volname = format!("{content}/{filename}");
    let compressed = p.get("compression").is_some();
    let shared = Arc::clone(&ctx.shared);
    let prepare_node = node.clone();
    let prepare: Prepare = Box::pin(async move {
        let existing = shared
            .cluster()
            .volume(&prepare_node, &format!("{sid}:{volname}"));
        let pair = checksum.zip(algorithm);
        if let Some(existing) = existing {
            let work: Work = Box::new(move |_, log, injected| {
                if let Some(m) = injected {
                    return Err(m);
                }
                let Some((expected, algo)) = pair else {
                    return Err(format!("refusing to override existing file '{path}'"));
                };
                let got = existing.checksums.get(&algo).cloned().unwrap_or_default();
                if got == expected {
                    log.push("OK, got correct file already, no need to download".to_string());
                    Ok(())
                } else {
                    Err(format!(
                        "checksum mismatch: got '{got}' != expect '{expected}', aborting"
                    ))
                }
            });
            return work;
        }
        let fetched = if compressed {
            Err("decompression is not supported by the simulator".to_string())
        } else {
            download::fetch(&url, verify).await
        };
        let work: Work = Box::new(move |c, log, injected| {
            if let Some(m) = injected {
                return Err(m);
            }
            log.push(format!("downloading {url} to {path}"));
            let fetched = fetched?;
            log.push(format!("download of '{url}' to '{path}' finished"));
            if let Some((expected, algo)) = pair {
                log.push("calculating checksum...".to_string());
                let got = fetched.checksums.get(&algo).cloned().unwrap_or_default();
                if got != expected {
                    return Err(format!(
                        "checksum mismatch: got '{got}' != expect '{expected}'"
                    ));
                }
                log.push("checksum verified".to_string());
            }
            let parsed = storage::parse_volname(&volname)?;
            if c.volume(&prepare_node, &format!("{sid}:{volname}"))
                .is_some()
            {
                return Err(format!("refusing to override existing file '{path}'"));
            }
            c.put_volume(
                &prepare_node,
                &sid,
                &volname,
                Volume {
                    content: parsed.content,
                    format: parsed.format,
                    size: fetched.size,
                    ctime: now_epoch(),
                    vmid: None,
                    checksums: fetched.checksums,
                },
            )
            .map_err(|e| e.text())?;
            Ok(())
        });
        work
    });
    let spec = TaskSpec {
        node: &node,
        kind: "download",
        id: filename,
        user: ctx.authid(),
    };
    Ok(Value::String(task::start_prepared(
        &ctx.shared,
        &mut cluster,
        &spec,
        prepare,
    )))
}
