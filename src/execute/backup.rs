//! Backup before delete (issue 19, item 3): under `[policy] backup_before_delete`, a prune's
//! delete is preceded by a `vzdump` of the guest to that storage, and the delete is sent
//! only after the backup task ended OK. A failed backup fails the delete action (the guest
//! stays); the backup's volume id is returned so it is recorded with the delete.
//!
//! The storage is checked on every delete, against what PVE reports for the node
//! (`GET /nodes/{node}/storage`: it must be listed, enabled and have content `backup`), so a
//! storage removed or reconfigured after the agent started fails the action with a message
//! naming it, before vzdump or the delete is sent. The prune's shutdown runs before (its
//! own action), so the backup is of the stopped guest. The volume id comes from the task log's `creating
//! vzdump archive '<path>'` line ([`proxops_pve::backup::archive_volid`]); when the log has
//! none (a Proxmox Backup Server target names its snapshot differently), from the
//! storage's newest backup of the guest (`GET .../content?content=backup`, vmid, ctime at or
//! after the task started).
//!
//! The backup's UPID is not reported as the action's task: a restarted agent re-attaches to
//! an action's UPID and records its end as the action's, which for a vzdump would record a
//! delete that never ran.

use proxops_core::guest::GuestType;
use proxops_core::plan::{Action, GuestRef};
use proxops_pve::backup::{self, BackupMode, Vzdump};
use proxops_pve::{ContentType, PveClient, TaskError, Upid, wait_for_task};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::error_chain::error_text;
use crate::execute::{FailureClass, Options, Outcome, SnapshotRecorder};

/// `[policy] backup_before_delete` and `backup_mode`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupPolicy {
    /// The storage backups go to (content `backup` on every node the agent deletes on).
    pub storage: String,
    /// vzdump's mode.
    pub mode: BackupMode,
}

/// The backup taken before a delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Backup {
    /// The backup's volume id (`local:backup/vzdump-qemu-100-2026_12_01-15_00_00.vma.zst`);
    /// `None` when the task ended OK but neither its log nor the storage named it.
    pub volid: Option<String>,
    /// The vzdump task.
    pub upid: Upid,
}

/// The notes of the backup: who took it, why, and, in the agent, at which commit and in
/// which pass (from the pass's snapshot recorder, [`crate::execute::snapshot_context`]; the
/// CLI has none). PVE fills in `{{guestname}}`, `{{vmid}}` and `{{node}}`.
///
/// vzdump's template rules (pve-manager @ 14a22df3, `PVE/VZDump.pm` `$verify_notes_template`
/// and `$generate_notes`): no line feed; a backslash starts an escape (`\\`, `\n`; any
/// other dies); `{{cluster}}`, `{{guestname}}`, `{{node}}` and `{{vmid}}` are expanded and
/// any other `{{` is kept literally. So the resource name is cleaned of line feeds,
/// backslashes and braces, and the commit is used only when it is hexadecimal.
fn notes(action: &Action, recorder: Option<&SnapshotRecorder>) -> String {
    let resource = action
        .resource
        .to_string()
        .replace(['\n', '\r', '\\', '{', '}'], " ");
    let at = recorder
        .map(|r| {
            let commit = r.revision.get(..7).unwrap_or(&r.revision);
            let commit = Some(commit)
                .filter(|c| !c.is_empty() && c.chars().all(|ch| ch.is_ascii_hexdigit()))
                .map(|c| format!(" at {c}"));
            let pass = r.pass.map(|p| format!(" (pass {})", p.0));
            format!("{}{}", commit.unwrap_or_default(), pass.unwrap_or_default())
        })
        .unwrap_or_default();
    format!(
        "proxops: backup before deleting {resource}{at} ({{{{guestname}}}}, {{{{vmid}}}} on {{{{node}}}})"
    )
}

/// Backs up `g` before its delete. `Err` is how the delete action ends instead (the guest
/// is not deleted).
pub(super) async fn before_delete(
    pve: &PveClient,
    action: &Action,
    g: GuestRef,
    policy: &BackupPolicy,
    options: &Options,
    cancel: &CancellationToken,
) -> Result<Backup, Outcome> {
    let node = action.node.as_str();
    let storage = policy.storage.as_str();
    let not_deleted = "; the guest was not deleted";
    let refused = |class: FailureClass, error: String| Outcome::Failed {
        class,
        upid: None,
        error,
    };
    let storages = pve.storages(node).await.map_err(|e| {
        refused(
            FailureClass::of_pve(&e),
            format!(
                "backup before delete: listing the storages of node {node} failed: {}{not_deleted}",
                error_text(&e)
            ),
        )
    })?;
    let Some(info) = storages.iter().find(|s| s.storage == storage) else {
        return Err(refused(
            FailureClass::Refused,
            format!(
                "backup before delete: storage `{storage}` ([policy] backup_before_delete) does not exist on node {node} or this token cannot see it (Datastore.Audit); name a storage of {node} with content `backup`{not_deleted}"
            ),
        ));
    };
    if info.enabled == Some(false) {
        return Err(refused(
            FailureClass::Refused,
            format!(
                "backup before delete: storage `{storage}` ([policy] backup_before_delete) is disabled on node {node}; enable it or name another storage{not_deleted}"
            ),
        ));
    }
    if !info.has_content(ContentType::Backup) {
        return Err(refused(
            FailureClass::Refused,
            format!(
                "backup before delete: storage `{storage}` ([policy] backup_before_delete) on node {node} does not allow content `backup` (it has `{}`); add `backup` to its content or name another storage{not_deleted}",
                info.content
            ),
        ));
    }
    let request = backup::vzdump(
        node,
        &Vzdump {
            vmid: g.vmid,
            storage: storage.to_owned(),
            mode: policy.mode,
            notes: Some(notes(action, options.snapshots.recorder.as_ref())),
        },
    );
    let answer = pve.execute(&request).await.map_err(|e| {
        let class = if e.is_unknown_outcome() {
            FailureClass::Unknown
        } else {
            FailureClass::of_pve(&e)
        };
        refused(
            class,
            format!(
                "backup before delete: vzdump of {} to `{storage}` was refused: {}{not_deleted}",
                g.vmid,
                error_text(&e)
            ),
        )
    })?;
    let text = answer.as_str().unwrap_or_default();
    let upid: Upid = text.parse().map_err(|_| {
        // `OK` without a task: vzdump skips guests that are not on the node it runs on.
        refused(
            FailureClass::Refused,
            format!(
                "backup before delete: vzdump on {node} answered `{text}` without a task (is guest {} on {node}?){not_deleted}",
                g.vmid
            ),
        )
    })?;
    tracing::info!(
        node,
        resource = %action.resource,
        %upid,
        storage,
        "backing up the guest before deleting it"
    );
    match wait_for_task(pve, &upid, &options.wait, cancel).await {
        Ok(_) => {}
        Err(TaskError::Cancelled { .. }) => {
            return Err(Outcome::Skipped {
                reason: format!("interrupted while backing up (task {upid}); not deleted"),
            });
        }
        Err(error) => {
            let class = FailureClass::of_task(&error);
            let status = match &error {
                TaskError::Failed { exitstatus, .. } => format!("ended `{exitstatus}`"),
                other => error_text(other),
            };
            let detail = task_error_line(pve, node, &upid).await;
            return Err(Outcome::Failed {
                class,
                upid: Some(upid.clone()),
                error: format!(
                    "backup before delete: vzdump task {upid} {status}{detail}{not_deleted}"
                ),
            });
        }
    }
    let volid = backup_volid(pve, node, storage, g, &upid).await;
    if volid.is_none() {
        tracing::warn!(
            node,
            resource = %action.resource,
            %upid,
            "the backup task ended OK but named no volume; deleting anyway"
        );
    }
    Ok(Backup { volid, upid })
}

/// Records the volume id of the backup taken before `result`'s action, if one was, with
/// the action's row `id`.
pub fn record_backup(
    store: &proxops_store::SharedStore,
    id: proxops_store::ActionId,
    result: &crate::execute::ActionResult,
) {
    let Some(volid) = result.backup.as_ref().and_then(|b| b.volid.as_deref()) else {
        return;
    };
    let mut store = store
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Err(error) = store.record_action_backup(id, volid) {
        tracing::error!(error = %error_text(&error), "recording the backup of a delete failed");
    }
}

/// The first `ERROR:` line of the task's log, as ` (ERROR: ...)`, or nothing.
async fn task_error_line(pve: &PveClient, node: &str, upid: &Upid) -> String {
    match pve.task_log(node, upid, 0, 1000).await {
        Ok(lines) => lines
            .iter()
            .find(|l| l.t.starts_with("ERROR:"))
            .map(|l| format!(" ({})", l.t))
            .unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The volume the backup task wrote: from its log, else the storage's newest backup of the
/// guest since the task started.
async fn backup_volid(
    pve: &PveClient,
    node: &str,
    storage: &str,
    g: GuestRef,
    upid: &Upid,
) -> Option<String> {
    if let Ok(lines) = pve.task_log(node, upid, 0, 5000).await
        && let Some(volid) = backup::archive_volid(storage, &lines)
    {
        return Some(volid);
    }
    let items = pve
        .storage_content(node, storage, Some(ContentType::Backup))
        .await
        .ok()?;
    let subtype = match g.guest_type {
        GuestType::Qemu => "qemu",
        GuestType::Lxc => "lxc",
    };
    items
        .into_iter()
        .filter(|i| i.vmid == Some(u64::from(g.vmid)))
        .filter(|i| i.ctime.is_some_and(|t| t >= u64::from(upid.starttime())))
        .filter(|i| i.volid.contains(&format!("vzdump-{subtype}-")) || !i.volid.contains("vzdump-"))
        .max_by_key(|i| i.ctime)
        .map(|i| i.volid)
}

#[cfg(test)]
mod tests {
    use proxops_core::plan::Verb;
    use proxops_core::resource::{Kind, ResourceId};

    use super::*;

    fn delete_of(name: &str) -> Action {
        Action {
            resource: ResourceId::new(Kind::Vm, name),
            node: "pve1".to_owned(),
            verb: Verb::Delete(GuestRef {
                guest_type: GuestType::Qemu,
                vmid: 100,
            }),
            reason: "owned, no longer declared".to_owned(),
        }
    }

    fn recorder(revision: &str, pass: Option<i64>) -> SnapshotRecorder {
        SnapshotRecorder {
            store: std::sync::Arc::new(std::sync::Mutex::new(
                proxops_store::Store::memory().unwrap(),
            )),
            revision: revision.to_owned(),
            pass: pass.map(proxops_store::PassId),
            config_path: None,
        }
    }

    #[test]
    fn the_notes_template_names_proxops_and_the_resource_on_one_line() {
        let text = notes(&delete_of("web"), None);
        assert_eq!(
            text,
            "proxops: backup before deleting VM/web ({{guestname}}, {{vmid}} on {{node}})"
        );
        assert!(!text.contains('\n'));
    }

    #[test]
    fn the_agents_notes_name_the_short_commit_and_the_pass() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let text = notes(&delete_of("web"), Some(&recorder(sha, Some(42))));
        assert_eq!(
            text,
            "proxops: backup before deleting VM/web at 0123456 (pass 42) ({{guestname}}, \
             {{vmid}} on {{node}})"
        );
    }

    #[test]
    fn the_notes_carry_no_escape_or_brace_vzdump_would_expand_or_refuse() {
        // A backslash would start one of vzdump's escapes, `{{` a template variable.
        let text = notes(
            &delete_of("a\\x{{vmid}}"),
            Some(&recorder("not-a-commit", None)),
        );
        assert_eq!(
            text,
            "proxops: backup before deleting VM/a x  vmid   ({{guestname}}, {{vmid}} on {{node}})"
        );
    }
}
