//! The snippet actions: `write-snippet` and `remove-snippet`, and what follows a `cicustom`
//! change (the cloud-init drive regenerated, the superseded files' grace period started).
//!
//! The directory is the storage's own: `path` of `GET /storage/{storage}` joined with its
//! snippets subdirectory (pve-storage 0c56bad `src/PVE/Storage/Plugin.pm`, `get_subdir`:
//! `content-dirs` or `$vtype_subdirs->{snippets}` = `snippets`). A storage without
//! `snippets` content fails the write with what to change: qemu-server would not read the
//! file (`Cloudinit.pm`, `read_cloudinit_snippets_file` needs a `snippets` volume).
//!
//! The agent writes on its own node only. A file on a storage that is not shared, for a
//! guest on another node, is refused: that node's agent writes it. A shared storage is the
//! same directory on every node, so the node that runs the action writes it.
//!
//! The text comes from the desired state (sealed there); the action carries only the name
//! and the hash, so neither plans nor records nor errors ever hold it.

use std::path::PathBuf;

use proxops_core::manifest::Spec;
use proxops_core::plan::{Action, Snippet, Update};
use proxops_core::repository::DesiredState;
use proxops_core::snippet::{self, ResolvedSnippet};
use proxops_pve::{PveClient, request};

use crate::error_chain::error_text;
use crate::execute::{FailureClass, Options, Outcome};
use crate::snippets::file::{self, PUBLIC_MODE, SECRET_MODE};

/// The PVE content type of snippets.
const SNIPPETS: &str = "snippets";

fn failed(class: FailureClass, error: String) -> Outcome {
    Outcome::Failed {
        class,
        upid: None,
        error,
    }
}

fn ok() -> Outcome {
    Outcome::Succeeded {
        upid: None,
        exitstatus: "OK".to_owned(),
    }
}

/// The node this process runs on: the agent's `node`, else the host name PVE names the node
/// by (`/proc/sys/kernel/hostname`, up to the first dot).
fn local_node(options: &Options) -> Option<String> {
    options.local_node.clone().or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .and_then(|h| h.trim().split('.').next().map(str::to_owned))
            .filter(|h| !h.is_empty())
    })
}

/// The snippets directory of `storage` on this node, from its configuration.
async fn snippets_dir(pve: &PveClient, storage: &str) -> Result<PathBuf, Outcome> {
    let config = pve.storage_config(storage).await.map_err(|e| {
        failed(
            FailureClass::of_pve(&e),
            format!(
                "reading the configuration of storage {storage}: {}",
                error_text(&e)
            ),
        )
    })?;
    if !config.has_content(SNIPPETS) {
        let mut content: Vec<&str> = config
            .content
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        content.push(SNIPPETS);
        return Err(failed(
            FailureClass::Refused,
            format!(
                "storage {storage} has no `snippets` content, so PVE would not read the snippet: \
                 run `pvesm set {storage} --content {}`, or set \
                 `spec.cloud-init-data.snippets-storage` to a storage with `snippets` content",
                content.join(",")
            ),
        ));
    }
    let Some(path) = config.path.clone().filter(|p| !p.is_empty()) else {
        return Err(failed(
            FailureClass::Refused,
            format!(
                "storage {storage} ({}) has no directory: snippets need a file based storage \
                 (dir, nfs, cifs, cephfs) with `snippets` content",
                config.storage_type
            ),
        ));
    };
    Ok(PathBuf::from(path).join(config.content_subdir(SNIPPETS)))
}

fn resolved<'a>(
    desired: &'a DesiredState,
    action: &Action,
    s: &Snippet,
) -> Option<&'a ResolvedSnippet> {
    match &desired.manifest.get(&action.resource)?.spec {
        Some(Spec::Vm(vm)) => vm
            .cloud_init_data
            .snippets
            .resolved
            .as_ref()?
            .snippets
            .iter()
            .find(|r| r.file == s.file && r.storage == s.storage),
        _ => None,
    }
}

fn on_other_node(options: &Options, action: &Action, s: &Snippet) -> Option<Outcome> {
    let here = local_node(options);
    (!s.shared && here.as_deref() != Some(action.node.as_str())).then(|| {
        failed(
            FailureClass::Refused,
            format!(
                "{} is on storage {} of node {}, which is not shared: the agent on {} writes it \
                 (this is {})",
                s.file,
                s.storage,
                action.node,
                action.node,
                here.as_deref().unwrap_or("an unknown node")
            ),
        )
    })
}

/// Runs a `write-snippet` action.
pub(super) async fn write(
    pve: &PveClient,
    desired: &DesiredState,
    action: &Action,
    s: &Snippet,
    options: &Options,
) -> Outcome {
    if let Some(refused) = on_other_node(options, action, s) {
        return refused;
    }
    let Some(resolved) = resolved(desired, action, s) else {
        return failed(
            FailureClass::Refused,
            format!("{} is not a snippet of {}", s.file, action.resource),
        );
    };
    let dir = match snippets_dir(pve, &s.storage).await {
        Ok(dir) => dir,
        Err(outcome) => return outcome,
    };
    let mode = if resolved.has_secrets {
        SECRET_MODE
    } else {
        PUBLIC_MODE
    };
    let name = s.file.clone();
    let content = resolved.content.clone();
    let written = tokio::task::spawn_blocking(move || {
        file::write(&dir, &name, content.expose().as_bytes(), mode)
    })
    .await;
    match written {
        Ok(Ok(true)) => {
            tracing::info!(snippet = %s.volid(), resource = %action.resource, "snippet written");
            ok()
        }
        Ok(Ok(false)) => ok(),
        Ok(Err(error)) => failed(FailureClass::Refused, error_text(&error)),
        Err(error) => failed(
            FailureClass::Transient,
            format!("writing {}: {error}", s.file),
        ),
    }
}

/// Runs a `remove-snippet` action.
pub(super) async fn remove(
    pve: &PveClient,
    action: &Action,
    s: &Snippet,
    options: &Options,
) -> Outcome {
    if let Some(refused) = on_other_node(options, action, s) {
        return refused;
    }
    if snippet::parse_file_name(&s.file).is_none() || s.file.contains('/') {
        return failed(
            FailureClass::Refused,
            format!(
                "{} is not a name ProxOps gives; it is never removed",
                s.file
            ),
        );
    }
    let dir = match snippets_dir(pve, &s.storage).await {
        Ok(dir) => dir,
        Err(outcome) => return outcome,
    };
    let name = s.file.clone();
    match tokio::task::spawn_blocking(move || file::remove(&dir, &name)).await {
        Ok(Ok(_)) => {
            tracing::info!(snippet = %s.volid(), "unreferenced snippet removed");
            ok()
        }
        Ok(Err(error)) => failed(FailureClass::Refused, error_text(&error)),
        Err(error) => failed(
            FailureClass::Transient,
            format!("removing {}: {error}", s.file),
        ),
    }
}

/// After a config write that changed `cicustom`: `PUT .../cloudinit` regenerates the drive
/// (and changes the medium of a running VM: qemu-server `vmconfig_update_cloudinit_drive`),
/// then the files the old value named get a fresh `ctime`, so their grace period starts
/// now. A file that cannot be touched is only logged: it keeps its older `ctime`.
///
/// # Errors
/// The regeneration failed (e.g. PVE cannot find a snippet: `can't find file '<volid>'`).
pub(super) async fn after_cicustom_change(
    pve: &PveClient,
    node: &str,
    update: &Update,
) -> Result<(), proxops_pve::PveError> {
    pve.execute(&request::qemu_cloudinit_update(node, update.vmid))
        .await?;
    let old: Vec<String> = update
        .changes
        .iter()
        .filter(|c| c.field == "cicustom")
        .flat_map(|c| snippet::cicustom_volids(&c.observed))
        .collect();
    for volid in old {
        let Some((storage, file)) = volid
            .split_once(':')
            .and_then(|(s, rest)| Some((s, rest.strip_prefix("snippets/")?)))
        else {
            continue;
        };
        if snippet::parse_file_name(file).is_none() {
            continue;
        }
        let Ok(dir) = snippets_dir(pve, storage).await else {
            continue;
        };
        let name = file.to_owned();
        if let Ok(Err(error)) = tokio::task::spawn_blocking(move || file::touch(&dir, &name)).await
        {
            tracing::warn!(%volid, error = %error_text(&error), "could not start the grace period of a superseded snippet");
        }
    }
    Ok(())
}
