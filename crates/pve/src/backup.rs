//! Backups (`POST /nodes/{node}/vzdump`) and PVE's HA status (`GET
//! /cluster/ha/status/current`): the request builders, and what their answers say (the
//! backup's volume id from the task log; which nodes are in HA maintenance).

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::request::{Method, Request};
use crate::task::TaskLogLine;

/// vzdump's `mode` (pve-manager `PVE/VZDump/Common.pm`, `mode` enum `snapshot`, `suspend`,
/// `stop`; default `snapshot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackupMode {
    /// A live backup (qemu: its own snapshot mechanism; lxc: a storage snapshot when the
    /// storage can, else suspend).
    #[default]
    Snapshot,
    /// Suspend the guest while it is backed up.
    Suspend,
    /// Stop the guest for the backup, start it again after.
    Stop,
}

impl BackupMode {
    /// PVE's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Snapshot => "snapshot",
            Self::Suspend => "suspend",
            Self::Stop => "stop",
        }
    }

    /// Parses PVE's spelling.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "snapshot" => Some(Self::Snapshot),
            "suspend" => Some(Self::Suspend),
            "stop" => Some(Self::Stop),
            _ => None,
        }
    }
}

/// One guest's backup to a storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vzdump {
    /// The guest.
    pub vmid: u32,
    /// The backup storage (content `backup`).
    pub storage: String,
    /// How the guest is backed up.
    pub mode: BackupMode,
    /// `notes-template`: the backup's notes (`{{guestname}}`, `{{vmid}}`, `{{node}}`,
    /// `{{cluster}}` are filled in by PVE; no line feed).
    pub notes: Option<String>,
}

/// `POST /nodes/{node}/vzdump` for one guest, zstd-compressed, `remove=0` (the schema's
/// default is 1: vzdump would prune older backups by the storage's `prune-backups`; a
/// backup taken before a delete must not remove the operator's others). PVE answers with
/// a `vzdump` UPID, or `OK` without a task when the guest is on another node (pve-manager
/// @ 14a22df3 `PVE/API2/VZDump.pm` `vzdump`).
pub fn vzdump(node: &str, backup: &Vzdump) -> Request {
    let req = Request::new(Method::Post, "/nodes/{node}/vzdump", &[node])
        .param("vmid", backup.vmid.to_string())
        .param("storage", backup.storage.as_str())
        .param("mode", backup.mode.as_str())
        .param("compress", "zstd")
        .param("remove", "0");
    match &backup.notes {
        Some(notes) => req.param("notes-template", notes.as_str()),
        None => req,
    }
}

/// `GET /cluster/ha/status/current` (needs `Sys.Audit` on `/`).
pub fn ha_status_current() -> Request {
    Request::new(Method::Get, "/cluster/ha/status/current", &[])
}

/// The volume id of the archive a successful `vzdump` task to `storage` wrote, from its
/// log: `INFO: creating vzdump archive '<dumpdir>/<file>'` names the file, and the volume is
/// `<storage>:backup/<file>` (pve-manager @ 14a22df3 `PVE/VZDump.pm` `exec_backup_task`:
/// `debugmsg('info', "creating $archive_txt archive '$task->{target}'")`, then `$volid =
/// "${storeid}:backup/${volname}"` with `$volname = basename($task->{target})` for
/// directory storages). A Proxmox Backup Server target logs `creating Proxmox Backup
/// Server archive '<snapshot>'`, whose volume id PVE builds another way: `None`, and the
/// caller lists the storage instead.
pub fn archive_volid(storage: &str, log: &[TaskLogLine]) -> Option<String> {
    log.iter().rev().find_map(|line| {
        let text = line.t.strip_prefix("INFO: ").unwrap_or(&line.t);
        let target = text
            .strip_prefix("creating vzdump archive '")?
            .strip_suffix('\'')?;
        let file = target.rsplit('/').next().filter(|f| !f.is_empty())?;
        Some(format!("{storage}:backup/{file}"))
    })
}

/// One entry of `GET /cluster/ha/status/current`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct HaStatusEntry {
    /// `quorum`, `master`, `lrm:<node>`, `service:<sid>`, `fencing`.
    #[serde(default)]
    pub id: String,
    /// `quorum`, `master`, `lrm`, `service`, `fencing`.
    #[serde(rename = "type", default)]
    pub entry_type: String,
    /// The node the entry is about.
    #[serde(default)]
    pub node: String,
    /// PVE's status text, e.g. `pve1 (maintenance mode, watchdog active, Tue Dec  1 ...)`.
    #[serde(default)]
    pub status: String,
}

impl HaStatusEntry {
    /// Whether this is a node's LRM in maintenance: pve-ha-manager @ b71218f
    /// `src/PVE/API2/HA/Status.pm` `status` prints an LRM as `"$node ($status_str,
    /// $lrm_wd, $time_str)"`, `$status_str` being `"$lrm_mode mode"` when its mode is not
    /// `active` (`maintenance mode` after `ha-manager crm-command node-maintenance enable`:
    /// `src/PVE/HA/LRM.pm` `update_service_status` sets `mode` to `maintenance`), or its
    /// state when the mode is active (`maintenance` while it still moves services away).
    pub fn is_node_maintenance(&self) -> bool {
        if self.entry_type != "lrm" {
            return false;
        }
        let inner = self
            .status
            .strip_prefix(self.node.as_str())
            .and_then(|rest| rest.trim_start().strip_prefix('('))
            .unwrap_or_default();
        let state = inner.split(',').next().unwrap_or_default().trim();
        matches!(state, "maintenance mode" | "maintenance")
    }
}

/// The nodes PVE reports in HA maintenance. A cluster without HA lists no `lrm` entries:
/// none.
pub fn nodes_in_maintenance(entries: &[HaStatusEntry]) -> BTreeSet<String> {
    entries
        .iter()
        .filter(|e| e.is_node_maintenance())
        .map(|e| e.node.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(n: u64, t: &str) -> TaskLogLine {
        TaskLogLine { n, t: t.to_owned() }
    }

    #[test]
    fn the_archive_line_of_a_vzdump_log_names_the_backup_volume() {
        let log = [
            line(
                1,
                "INFO: starting new backup job: vzdump 100 --storage backup",
            ),
            line(2, "INFO: Starting Backup of VM 100 (lxc)"),
            line(
                9,
                "INFO: creating vzdump archive '/mnt/pve/backup/dump/vzdump-lxc-100-2024_11_25-16_28_00.tar.zst'",
            ),
            line(27, "TASK OK"),
        ];
        assert_eq!(
            archive_volid("backup", &log).as_deref(),
            Some("backup:backup/vzdump-lxc-100-2024_11_25-16_28_00.tar.zst")
        );
    }

    #[test]
    fn a_log_without_a_vzdump_archive_line_names_no_volume() {
        let log = [
            line(
                5,
                "INFO: creating Proxmox Backup Server archive 'vm/100/2024-11-25T16:28:00Z'",
            ),
            line(6, "TASK OK"),
        ];
        assert_eq!(archive_volid("pbs", &log), None);
        assert_eq!(
            archive_volid("local", &[line(1, "INFO: creating vzdump archive ''")]),
            None
        );
    }

    fn entry(entry_type: &str, node: &str, status: &str) -> HaStatusEntry {
        HaStatusEntry {
            id: format!("{entry_type}:{node}"),
            entry_type: entry_type.to_owned(),
            node: node.to_owned(),
            status: status.to_owned(),
        }
    }

    #[test]
    fn only_lrms_in_maintenance_mode_or_state_count_as_nodes_in_maintenance() {
        let entries = [
            entry("quorum", "pve1", "OK"),
            entry(
                "lrm",
                "pve1",
                "pve1 (active, watchdog active, Tue Dec  1 15:00:00 2026)",
            ),
            entry(
                "lrm",
                "pve2",
                "pve2 (maintenance mode, watchdog active, Tue Dec  1 15:00:00 2026)",
            ),
            entry(
                "lrm",
                "pve3",
                "pve3 (maintenance, watchdog active, Tue Dec  1 15:00:00 2026)",
            ),
            entry("lrm", "pve4", "pve4 (unable to read lrm status)"),
            entry("service", "pve1", "maintenance mode"),
        ];
        let nodes: Vec<String> = nodes_in_maintenance(&entries).into_iter().collect();
        assert_eq!(nodes, ["pve2", "pve3"]);
    }

    #[test]
    fn a_cluster_without_ha_has_no_node_in_maintenance() {
        let entries = [
            entry("quorum", "pve1", "OK"),
            entry("fencing", "pve1", "standby (CRM watchdog standby)"),
        ];
        assert!(nodes_in_maintenance(&entries).is_empty());
    }

    #[test]
    fn vzdump_never_removes_older_backups_and_compresses_with_zstd() {
        let req = vzdump(
            "pve1",
            &Vzdump {
                vmid: 100,
                storage: "local".into(),
                mode: BackupMode::Stop,
                notes: None,
            },
        );
        let params: Vec<(&str, &str)> = req.parameters().collect();
        assert!(params.contains(&("remove", "0")), "{params:?}");
        assert!(params.contains(&("compress", "zstd")), "{params:?}");
        assert!(params.contains(&("mode", "stop")), "{params:?}");
    }
}
