//! Snapshots before risky updates (issue 19, item 2): before an update the policy says to
//! snapshot ([`snapshot_policy::wants_snapshot`]), the executor asks PVE whether the guest
//! can be snapshotted, takes `proxops-<commit 7>-<n>` (no RAM state), waits for the task,
//! records it in the store, deletes its own snapshots beyond `snapshot_keep`, and only then
//! sends the write, with the config's new digest.
//!
//! PVE behaviours relied on (verified in PVE's sources):
//!
//! - whether every volume can be snapshotted is PVE's own `GET .../feature?feature=snapshot`
//!   (proxmox/qemu-server @ e6352be6, `src/PVE/API2/Qemu.pm`, `vm_feature` →
//!   `PVE::QemuConfig::has_feature`, which asks each volume's storage plugin
//!   `volume_has_feature`; proxmox/pve-container @ 94f5585, `src/PVE/API2/LXC.pm`
//!   `vm_feature`). The executor does not keep a second table of storage capabilities to
//!   decide; it only explains PVE's "no" by naming each volume and its storage type.
//! - a snapshot rewrites the config file (the `[snapname]` section, `parent`), and the
//!   digest is the SHA-1 of the whole file (qemu-server `parse_vm_config`), so the planned
//!   digest is stale after it: the digest is checked before the snapshot (a config changed
//!   since the plan gets no snapshot and the write is refused by PVE as planned), and read
//!   again after it for the write.
//! - create, delete and rollback run as tasks (`qmsnapshot`, `qmdelsnapshot`, `qmrollback`
//!   and the `vz` ones), waited for like every other task.
//!
//! Without a store (the CLI's `apply`) no snapshot is taken: retention and rollback must know
//! which snapshots are ProxOps's own, and only the agent records them.

#![allow(
    clippy::result_large_err,
    reason = "the Err is the action's Outcome, built at most once per action"
)]

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use proxops_core::guest::GuestType;
use proxops_core::manifest::SNAPSHOT;
use proxops_core::plan::snapshot_policy::{self, SnapshotPolicy};
use proxops_core::plan::{Action, Finding, FindingKind, Update, Verb};
use proxops_core::repository::DesiredState;
use proxops_pve::request::{self, SnapshotEntry, SnapshotGuest};
use proxops_pve::{PveClient, TaskError, Upid, wait_for_task};
use proxops_store::{PassId, SharedStore, SnapshotRecord};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::error_chain::error_text;
use crate::execute::{FailureClass, Options, Outcome};

/// `[policy] snapshot*` and, in the agent, where to record what is taken.
#[derive(Debug, Clone, Default)]
pub struct SnapshotOptions {
    /// When to snapshot, how many to keep, whether one is required.
    pub policy: SnapshotPolicy,
    /// The agent's store and the pass's revision (`None`: no snapshots, the CLI).
    pub recorder: Option<SnapshotRecorder>,
}

/// Where the snapshots a pass takes are recorded.
#[derive(Debug, Clone)]
pub struct SnapshotRecorder {
    /// The agent's store.
    pub store: SharedStore,
    /// The revision being applied (its first 7 characters name the snapshot).
    pub revision: String,
    /// The pass.
    pub pass: Option<PassId>,
    /// The agent.toml, for the rollback command shown after a failed update.
    pub config_path: Option<PathBuf>,
}

/// `context` with snapshots recorded in `store` for `pass` applying `revision` (the agent).
pub fn snapshot_context(
    context: &crate::reconcile::Context,
    store: &SharedStore,
    revision: &str,
    pass: PassId,
) -> crate::reconcile::Context {
    let mut context = context.clone();
    context.execute.snapshots.recorder = Some(SnapshotRecorder {
        store: store.clone(),
        revision: revision.to_owned(),
        pass: Some(pass),
        config_path: None,
    });
    context
}

/// A snapshot taken before an update.
#[derive(Debug, Clone)]
pub(super) struct Taken {
    /// Its name.
    pub(super) name: String,
    /// The config digest after it, for the write.
    pub(super) digest: Option<String>,
}

/// Findings the executor makes while it runs (`snapshot-skipped`).
pub(super) type Found = Mutex<Vec<Finding>>;

fn guest_of(update: &Update) -> SnapshotGuest {
    match update.guest_type {
        GuestType::Qemu => SnapshotGuest::Qemu,
        GuestType::Lxc => SnapshotGuest::Lxc,
    }
}

/// Before `action` runs: `Ok(Some(taken))` when a snapshot was taken, `Ok(None)` when none
/// is due (or none can be and none is required), `Err(outcome)` when the update must not be
/// written (the snapshot failed, or none could be taken and `snapshot_required` holds it).
pub(super) async fn before(
    pve: &PveClient,
    desired: &DesiredState,
    action: &Action,
    options: &Options,
    cancel: &CancellationToken,
    found: &Found,
) -> Result<Option<Taken>, Outcome> {
    let Verb::Update(update) = &action.verb else {
        return Ok(None);
    };
    let settings = &options.snapshots;
    let Some(recorder) = &settings.recorder else {
        return Ok(None);
    };
    let annotation = desired
        .manifest
        .get(&action.resource)
        .and_then(|r| r.annotations.get(SNAPSHOT))
        .map(String::as_str);
    if !snapshot_policy::wants_snapshot(action, settings.policy.mode, annotation) {
        return Ok(None);
    }
    let run = Run {
        pve,
        action,
        update,
        guest: guest_of(update),
        options,
        cancel,
        recorder,
    };
    // The config must still be the planned one, or the snapshot would not be of it.
    let digest = match run.digest().await {
        Ok(digest) => digest,
        Err(error) => return run.cannot(found, &format!("reading its config failed ({error})")),
    };
    if update.digest.is_some() && digest != update.digest {
        return Ok(None);
    }
    match run.can_snapshot().await {
        Ok(true) => {}
        Ok(false) => {
            let why = run.why_not().await;
            return run.cannot(found, &why);
        }
        Err(error) => {
            return run.cannot(
                found,
                &format!("asking PVE whether it can be snapshotted failed ({error})"),
            );
        }
    }
    let name = run.take().await?;
    run.retain(&name).await;
    // Taking and deleting snapshots rewrote the config file: the write carries its digest now.
    let digest = run.digest().await.map_err(|e| {
        Run::refused(format!(
            "reading the config after snapshot {name} failed: {e}; the update was not written"
        ))
    })?;
    Ok(Some(Taken { name, digest }))
}

/// `action` with the digest read after the snapshot, when one was taken.
pub(super) fn with_digest(action: &Action, taken: Option<&Taken>) -> Action {
    let mut action = action.clone();
    if let (Some(taken), Verb::Update(update)) = (taken, &mut action.verb)
        && update.digest.is_some()
    {
        update.digest.clone_from(&taken.digest);
    }
    action
}

/// A failed update names the snapshot taken before it and the command that rolls back.
pub(super) fn after(
    outcome: Outcome,
    taken: Option<&Taken>,
    action: &Action,
    options: &Options,
) -> Outcome {
    match (outcome, taken) {
        (Outcome::Failed { class, upid, error }, Some(taken)) => {
            let config = options
                .snapshots
                .recorder
                .as_ref()
                .and_then(|r| r.config_path.as_ref())
                .map_or_else(
                    || " --config <agent.toml>".to_owned(),
                    |p| format!(" --config {}", p.display()),
                );
            Outcome::Failed {
                class,
                upid,
                error: format!(
                    "{error}; snapshot {} was taken before this update: to roll back, run \
                     `proxops rollback {} --snapshot {}{config}`",
                    taken.name, action.resource, taken.name
                ),
            }
        }
        (outcome, _) => outcome,
    }
}

struct Run<'a> {
    pve: &'a PveClient,
    action: &'a Action,
    update: &'a Update,
    guest: SnapshotGuest,
    options: &'a Options,
    cancel: &'a CancellationToken,
    recorder: &'a SnapshotRecorder,
}

impl Run<'_> {
    fn node(&self) -> &str {
        &self.action.node
    }

    async fn digest(&self) -> Result<Option<String>, String> {
        let req = match self.update.guest_type {
            GuestType::Qemu => request::qemu_config(self.node(), self.update.vmid, false),
            GuestType::Lxc => request::lxc_config(self.node(), self.update.vmid, false),
        };
        let config = self.pve.execute(&req).await.map_err(|e| error_text(&e))?;
        Ok(config
            .get("digest")
            .and_then(Value::as_str)
            .map(str::to_owned))
    }

    async fn can_snapshot(&self) -> Result<bool, String> {
        let req = request::snapshot_feature(self.guest, self.node(), self.update.vmid);
        let answer = self.pve.execute(&req).await.map_err(|e| error_text(&e))?;
        Ok(match answer.get("hasFeature") {
            Some(Value::Bool(b)) => *b,
            Some(Value::Number(n)) => n.as_u64().is_some_and(|n| n != 0),
            Some(Value::String(s)) => s == "1",
            _ => false,
        })
    }

    /// Why PVE says no: each volume on a storage whose type cannot snapshot it, by the
    /// storage plugins' rules (pve-storage @ 0c56bad, `volume_has_feature` of
    /// `Plugin.pm` (files: qcow2 only), `LVMPlugin.pm` (qcow2 only), `LvmThinPlugin.pm`,
    /// `ZFSPoolPlugin.pm`, `RBDPlugin.pm`, `BTRFSPlugin.pm`). Only an explanation: PVE's
    /// answer decided.
    async fn why_not(&self) -> String {
        let fallback = "PVE reports that not every volume's storage can snapshot it".to_owned();
        let req = match self.update.guest_type {
            GuestType::Qemu => request::qemu_config(self.node(), self.update.vmid, true),
            GuestType::Lxc => request::lxc_config(self.node(), self.update.vmid, true),
        };
        let (Ok(config), Ok(storages)) = (
            self.pve.execute(&req).await,
            self.pve.storages(self.node()).await,
        ) else {
            return fallback;
        };
        let Some(config) = config.as_object() else {
            return fallback;
        };
        let mut reasons = Vec::new();
        for (key, value) in config {
            let Some(value) = value.as_str() else {
                continue;
            };
            let Some(volume) = volume_of(self.update.guest_type, key, value) else {
                continue;
            };
            let Some((sid, volname)) = volume.split_once(':') else {
                reasons.push(format!("{key} is {volume}, not a storage volume"));
                continue;
            };
            let kind = storages
                .iter()
                .find(|s| s.storage == sid)
                .map_or("unknown", |s| s.storage_type.as_str());
            let format = format_of(volname);
            if !type_can_snapshot(kind, format) {
                reasons.push(format!(
                    "{key} is {volume}, a {format} volume on {kind} storage {sid}, which cannot \
                     snapshot it{}",
                    hint(kind)
                ));
            }
        }
        if reasons.is_empty() {
            fallback
        } else {
            reasons.join("; ")
        }
    }

    /// A snapshot was due and cannot be taken: a finding; the update is held when
    /// `snapshot_required`, else it goes on.
    fn cannot(&self, found: &Found, why: &str) -> Result<Option<Taken>, Outcome> {
        let required = self.options.snapshots.policy.required;
        let next = if required {
            "the update is held until a snapshot can be taken ([policy] snapshot_required = true)"
        } else {
            "the update went on without one (set [policy] snapshot_required = true to hold it)"
        };
        let message = format!(
            "no snapshot was taken before the risky update of {}: {why}; {next}",
            self.action.resource
        );
        if let Ok(mut found) = found.lock() {
            found.push(Finding {
                resource: self.action.resource.clone(),
                node: self.action.node.clone(),
                kind: FindingKind::SnapshotSkipped,
                field: String::new(),
                desired: String::new(),
                observed: String::new(),
                message: message.clone(),
            });
        }
        tracing::warn!(resource = %self.action.resource, node = %self.action.node, %message, "no snapshot before a risky update");
        if required {
            Err(Outcome::Skipped {
                reason: format!("held: {message}"),
            })
        } else {
            Ok(None)
        }
    }

    async fn list(&self) -> Result<Vec<SnapshotEntry>, String> {
        let req = request::snapshot_list(self.guest, self.node(), self.update.vmid);
        self.pve
            .execute_as::<Vec<SnapshotEntry>>(&req)
            .await
            .map_err(|e| error_text(&e))
    }

    fn refused(error: String) -> Outcome {
        Outcome::Failed {
            class: FailureClass::Refused,
            upid: None,
            error,
        }
    }

    /// Takes the snapshot and waits for its task; the update is not written if it fails.
    async fn take(&self) -> Result<String, Outcome> {
        let not_written = "the update was not written";
        let existing = self.list().await.map_err(|e| {
            Self::refused(format!("listing the snapshots failed: {e}; {not_written}"))
        })?;
        let name = snapshot_policy::snapshot_name(
            &self.recorder.revision,
            existing.iter().map(|s| s.name.as_str()),
        );
        let description = format!(
            "ProxOps, before the update of {} to revision {}",
            self.action.resource,
            short(&self.recorder.revision)
        );
        let req = request::snapshot_create(
            self.guest,
            self.node(),
            self.update.vmid,
            &name,
            &description,
        );
        let answer = self.pve.execute(&req).await.map_err(|e| Outcome::Failed {
            class: FailureClass::of_pve(&e),
            upid: None,
            error: format!("taking snapshot {name}: {}; {not_written}", error_text(&e)),
        })?;
        self.wait(&answer, &format!("snapshot {name}"))
            .await
            .map_err(|outcome| match outcome {
                Outcome::Failed { class, upid, error } => Outcome::Failed {
                    class,
                    upid,
                    error: format!("{error}; {not_written}"),
                },
                other => other,
            })?;
        let record = SnapshotRecord {
            node: self.node().to_owned(),
            vmid: self.update.vmid,
            guest_type: self.update.guest_type.as_str().to_owned(),
            resource: self.action.resource.clone(),
            name: name.clone(),
            revision: self.recorder.revision.clone(),
            pass: self.recorder.pass,
            taken_at: SystemTime::now(),
            deleted_at: None,
        };
        if let Ok(mut store) = self.recorder.store.lock()
            && let Err(error) = store.record_snapshot(&record)
        {
            tracing::warn!(error = %error_text(&error), snapshot = %name, "recording a snapshot failed; retention will not delete it");
        }
        tracing::info!(resource = %self.action.resource, node = %self.action.node, snapshot = %name, "snapshot taken before a risky update");
        Ok(name)
    }

    /// Waits for a snapshot task (`null`: PVE answered without one).
    async fn wait(&self, answer: &Value, what: &str) -> Result<Option<Upid>, Outcome> {
        let Some(text) = answer.as_str() else {
            return Ok(None);
        };
        let upid: Upid = text
            .parse()
            .map_err(|_| Self::refused(format!("{what}: PVE answered `{text}`, not a task id")))?;
        match wait_for_task(self.pve, &upid, &self.options.wait, self.cancel).await {
            Ok(_) => Ok(Some(upid)),
            Err(TaskError::Cancelled { .. }) => Err(Outcome::Skipped {
                reason: "interrupted".to_owned(),
            }),
            Err(error) => {
                let class = FailureClass::of_task(&error);
                let text = match error {
                    TaskError::Failed { exitstatus, .. } => exitstatus,
                    other => error_text(&other),
                };
                Err(Outcome::Failed {
                    class,
                    upid: Some(upid),
                    error: format!("{what}: {text}"),
                })
            }
        }
    }

    /// Deletes ProxOps's own snapshots of the guest beyond `snapshot_keep`, oldest first:
    /// only names the store recorded (so never a snapshot someone else made, whatever its
    /// name) and PVE still lists. A failed delete is logged and retried after the next
    /// snapshot.
    async fn retain(&self, newest: &str) {
        let Ok(on_pve) = self.list().await else {
            return;
        };
        let recorded = match self.recorder.store.lock() {
            Ok(store) => store.live_snapshots(self.node(), self.update.vmid),
            Err(_) => return,
        };
        let Ok(recorded) = recorded else {
            return;
        };
        let now = SystemTime::now();
        let mut ours = Vec::new();
        for record in recorded {
            if on_pve.iter().any(|s| s.name == record.name) || record.name == newest {
                ours.push(record.name);
            } else if let Ok(mut store) = self.recorder.store.lock() {
                // Deleted by someone else: no longer ours to count.
                let _ = store.snapshot_deleted(self.node(), self.update.vmid, &record.name, now);
            }
        }
        let keep = self.options.snapshots.policy.keep;
        for name in snapshot_policy::to_delete(&ours, keep) {
            if name == newest {
                continue;
            }
            let req = request::snapshot_delete(self.guest, self.node(), self.update.vmid, name);
            let result = match self.pve.execute(&req).await {
                Ok(answer) => self
                    .wait(&answer, &format!("deleting snapshot {name}"))
                    .await
                    .map(|_| ())
                    .map_err(|o| match o {
                        Outcome::Failed { error, .. } => error,
                        Outcome::Skipped { reason } => reason,
                        Outcome::Succeeded { .. } => String::new(),
                    }),
                Err(e) => Err(error_text(&e)),
            };
            match result {
                Ok(()) => {
                    tracing::info!(resource = %self.action.resource, snapshot = %name, keep, "deleted an old ProxOps snapshot");
                    if let Ok(mut store) = self.recorder.store.lock() {
                        let _ = store.snapshot_deleted(
                            self.node(),
                            self.update.vmid,
                            name,
                            SystemTime::now(),
                        );
                    }
                }
                Err(error) => {
                    tracing::warn!(resource = %self.action.resource, snapshot = %name, %error, "deleting an old ProxOps snapshot failed; it is retried after the next snapshot");
                }
            }
        }
    }
}

fn short(revision: &str) -> &str {
    revision.get(..7).unwrap_or(revision)
}

/// The volume a config key holds, for the keys PVE's `has_feature` looks at: qemu disks
/// that are not CD-ROMs, LXC `rootfs` and `mpN`.
fn volume_of(guest_type: GuestType, key: &str, value: &str) -> Option<String> {
    let first = value.split(',').next()?.trim();
    let first = first
        .strip_prefix("file=")
        .or_else(|| first.strip_prefix("volume="))
        .unwrap_or(first);
    match guest_type {
        GuestType::Qemu => {
            let disk = ["ide", "sata", "scsi", "virtio"].iter().any(|p| {
                key.strip_prefix(p)
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            }) || key == "efidisk0"
                || key == "tpmstate0";
            let cdrom = value.split(',').any(|p| p == "media=cdrom") || first.contains(":iso/");
            (disk && !cdrom).then(|| first.to_owned())
        }
        GuestType::Lxc => {
            let volume = key == "rootfs"
                || key
                    .strip_prefix("mp")
                    .is_some_and(|n| n.parse::<u32>().is_ok());
            volume.then(|| first.to_owned())
        }
    }
}

/// A volume name's format as the plugins read it: its file extension, `subvol` for
/// `subvol-` names, else `raw` (block storages).
fn format_of(volname: &str) -> &str {
    let file = volname.rsplit('/').next().unwrap_or(volname);
    if file.starts_with("subvol-") || file.starts_with("basevol-") {
        return "subvol";
    }
    match file.rsplit_once('.') {
        Some((_, ext)) if matches!(ext, "qcow2" | "raw" | "vmdk") => ext,
        _ => "raw",
    }
}

/// The plugins' `snapshot` feature of a current volume (see [`Run::why_not`]).
fn type_can_snapshot(kind: &str, format: &str) -> bool {
    match kind {
        "lvmthin" | "zfspool" | "zfs" | "rbd" => true,
        "btrfs" => matches!(format, "qcow2" | "raw" | "subvol"),
        "lvm" | "dir" | "nfs" | "cifs" | "glusterfs" | "cephfs" => format == "qcow2",
        _ => false,
    }
}

/// What an operator can do about a storage type that cannot snapshot.
fn hint(kind: &str) -> &'static str {
    match kind {
        "dir" | "nfs" | "cifs" | "glusterfs" | "cephfs" => {
            " (file storages snapshot only qcow2 files: move the disk to qcow2 or to lvmthin, zfs or ceph)"
        }
        "lvm" => " (plain LVM snapshots only qcow2 volumes: use lvmthin)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_explanation_names_raw_files_and_plain_lvm_but_not_thin_pools() {
        assert_eq!(format_of("100/vm-100-disk-0.raw"), "raw");
        assert_eq!(format_of("100/vm-100-disk-0.qcow2"), "qcow2");
        assert_eq!(format_of("vm-100-disk-0"), "raw");
        assert_eq!(format_of("subvol-100-disk-0"), "subvol");
        assert!(!type_can_snapshot("dir", "raw"));
        assert!(type_can_snapshot("dir", "qcow2"));
        assert!(!type_can_snapshot("lvm", "raw"));
        assert!(type_can_snapshot("lvmthin", "raw"));
    }

    #[test]
    fn only_disks_and_mount_points_are_volumes_to_explain() {
        assert_eq!(
            volume_of(GuestType::Qemu, "scsi0", "local-lvm:vm-100-disk-0,size=8G").as_deref(),
            Some("local-lvm:vm-100-disk-0")
        );
        assert_eq!(
            volume_of(GuestType::Qemu, "ide2", "local:iso/x.iso,media=cdrom"),
            None
        );
        assert_eq!(
            volume_of(GuestType::Qemu, "net0", "virtio,bridge=vmbr0"),
            None
        );
        assert_eq!(
            volume_of(GuestType::Lxc, "mp0", "/srv/data,mp=/data").as_deref(),
            Some("/srv/data")
        );
    }
}
