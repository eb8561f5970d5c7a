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

/// One storage as `storage_info` reports it on `node` (pve-storage @ 0c56bad8
/// `src/PVE/Storage.pm` `storage_info`): `enabled` is `storage_check_enabled($cfg, $storeid,
/// undef, 1)` on the answering node, so a storage that is disabled or whose `nodes` list
/// leaves the node out is `enabled 0`; only an enabled one is activated and gets
/// `active 1` and its sizes, the others keep `total/used/avail 0`. `used_fraction` only when
/// `total` is not zero (`Status.pm` `index`).
fn storage_entry(cluster: &Cluster, node: &str, s: &StorageDef, with_id: bool) -> Value {
    let usable = s.enabled && s.is_on_node(node);
    let (total, used) = if usable {
        (s.total, cluster.used_bytes(node, &s.id))
    } else {
        (0, 0)
    };
    let mut v = json!({
        "type": s.kind,
        "content": s.content_list(),
        "enabled": u8::from(usable),
        "active": u8::from(usable),
        "shared": u8::from(s.shared),
        "total": total,
        "used": used,
        "avail": total.saturating_sub(used),
    });
    if with_id {
        v["storage"] = s.id.clone().into();
        if total > 0 {
            v["used_fraction"] = (used as f64 / total as f64).into();
        }
    }
    v
}

/// `GET /nodes/{node}/storage` (pve-storage @ 0c56bad8 `src/PVE/API2/Storage/Status.pm`
/// `index` over `storage_info`): every storage of storage.cfg, those not usable on the node
/// with `enabled 0, active 0` and zero sizes; `content=` keeps only enabled storages with
/// one of the types; `enabled=1` drops only storages disabled in the config (`$scfg->{disable}`);
/// `storage=` naming one `storage_info` did not report is 400 `No such storage.`; entries
/// the caller holds neither Datastore.Audit nor Datastore.AllocateSpace on are left out.
pub(super) fn index(ctx: &Ctx) -> ApiResult {
    let cluster = ctx.shared.cluster();
    let node = ctx.node();
    cluster.node(node)?;
    let content = ctx.params.get("content");
    let only = ctx.params.get("storage");
    let enabled_only = ctx.params.flag("enabled").unwrap_or(false);
    let authid = ctx.authid();
    let reported = |s: &&StorageDef| {
        content.is_none_or(|c| {
            s.enabled && s.is_on_node(node) && c.split(',').any(|c| s.has_content(c))
        })
    };
    if let Some(only) = only
        && !cluster
            .storages
            .iter()
            .filter(reported)
            .any(|s| s.id == only)
    {
        return Err(ApiError::param("storage", "No such storage."));
    }
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
            .filter(reported)
            .filter(visible)
            .filter(|s| only.is_none_or(|o| o == s.id))
            .filter(|s| !enabled_only || s.enabled)
            .map(|s| storage_entry(&cluster, node, s, true))
            .collect(),
    ))
}

/// `GET /nodes/{node}/storage/{storage}/status`: the storage's `storage_info` entry
/// (so `enabled 0` and zero sizes when not usable on the node), 400 `No such storage.` for
/// an id storage.cfg lacks (pve-storage @ 0c56bad8 `src/PVE/API2/Storage/Status.pm`
/// `read_status`).
pub(super) fn status(ctx: &Ctx) -> ApiResult {
    let cluster = ctx.shared.cluster();
    let node = ctx.node();
    cluster.node(node)?;
    let sid = ctx.params.required("storage")?;
    let Some(s) = cluster.storages.iter().find(|s| s.id == sid) else {
        return Err(ApiError::param("storage", "No such storage."));
    };
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
    if let Some(notes) = &v.notes {
        e["notes"] = notes.clone().into();
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

/// `POST /nodes/{node}/storage/{storage}/download-url`, as pve-storage @ 0c56bad8
/// `src/PVE/API2/Storage/Status.pm` `download_url` and pve-common @ f665029e
/// `src/PVE/Tools.pm` `download_file_from_url` do it: synchronously the storage checks
/// (`storage_check_enabled`, file based, content type), the filename normalisation and the
/// extension; then in the `download` worker the `compression` checks, the existing-file test
/// (no checksum: `refusing to override existing file`; the right checksum: OK without a
/// download), the fetch into a temporary file, the checksum, and the rename over the target.
/// The log lines are PVE's, in PVE's order (`print` without a newline joins
/// `calculating checksum...` and `OK, checksum verified` into one line).
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
    // `storage_check_enabled`: disabled before the node restriction.
    if cluster.storages.iter().any(|s| s.id == sid && !s.enabled) {
        return Err(ApiError::die(format!("storage '{sid}' is disabled")));
    }
    let def = cluster.storage(&node, &sid)?.clone();
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
    let dir = def.content_dir(&content);
    let path = format!("{dir}/{filename}");
    let volname = format!("{content}/{filename}");
    let compression = p.get("compression").map(str::to_owned);
    let shared = Arc::clone(&ctx.shared);
    let prepare_node = node.clone();
    let prepare: Prepare = Box::pin(async move {
        let pair = checksum.zip(algorithm);
        // The worker's own checks come first: `compression` has no enum in the schema
        // (`enum => $PVE::Storage::Plugin::KNOWN_COMPRESSION_FORMATS` names a `use
        // constant`, which is a sub, so the hash value is undef), so a wrong one fails here,
        // in the task.
        if let Some(c) = compression {
            let error = if content != "iso" {
                format!("decompression not supported for {content}")
            } else if !matches!(c.as_str(), "gz" | "lzo" | "zst" | "bz2") {
                "no decompression method found".to_string()
            } else {
                "decompression is not modelled by the simulator".to_string()
            };
            let work: Work = Box::new(move |_, _, injected| Err(injected.unwrap_or(error)));
            return work;
        }
        // `-f $dest` is tested once, before the download starts; nothing locks the target.
        let existing = shared
            .cluster()
            .volume(&prepare_node, &format!("{sid}:{volname}"));
        if let Some(existing) = existing {
            let work: Work = Box::new(move |_, log, injected| {
                if let Some(m) = injected {
                    return Err(m);
                }
                log.push(format!("downloading {url} to {path}"));
                let Some((expected, algo)) = pair else {
                    return Err(format!("refusing to override existing file '{path}'"));
                };
                let got = existing.checksums.get(&algo).cloned().unwrap_or_default();
                if got == expected {
                    log.push(
                        "calculating checksum of existing file...OK, got correct file \
                         already, no need to download"
                            .to_string(),
                    );
                    Ok(())
                } else {
                    log.push("calculating checksum of existing file...".to_string());
                    Err(format!(
                        "checksum mismatch: got '{got}' != expect '{expected}', aborting"
                    ))
                }
            });
            return work;
        }
        let fetched = download::fetch(&url, verify).await;
        let work: Work = Box::new(move |c, log, injected| {
            if let Some(m) = injected {
                return Err(m);
            }
            log.push(format!("downloading {url} to {path}"));
            let fetched = fetched?;
            if let Some((expected, algo)) = pair {
                let got = fetched.checksums.get(&algo).cloned().unwrap_or_default();
                if got != expected {
                    log.push("calculating checksum...".to_string());
                    return Err(format!(
                        "checksum mismatch: got '{got}' != expect '{expected}'"
                    ));
                }
                log.push("calculating checksum...OK, checksum verified".to_string());
            }
            let parsed = storage::parse_volname(&volname)?;
            // The temporary file is renamed over the target: a download that started while
            // the file was absent succeeds even if another one finished first.
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
                    notes: None,
                },
            )
            .map_err(|e| e.text())?;
            log.push(format!("download of '{url}' to '{path}' finished"));
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
