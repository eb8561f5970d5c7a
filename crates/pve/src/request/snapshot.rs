//! Guest snapshots (issue 19): list, create, delete, roll back, and PVE's own answer to
//! "can this guest be snapshotted?". qemu and LXC take the same parameters (verified in
//! PVE's sources: proxmox/qemu-server @ e6352be6, `src/PVE/API2/Qemu.pm`, `snapshot_list`,
//! `snapshot`, `delsnapshot`, `rollback`, `vm_feature`; proxmox/pve-container @ 94f5585,
//! `src/PVE/API2/LXC/Snapshot.pm` and `src/PVE/API2/LXC.pm` `vm_feature`). Create, delete and
//! rollback answer a UPID (`qmsnapshot`/`vzsnapshot`, `qmdelsnapshot`/`vzdelsnapshot`,
//! `qmrollback`/`vzrollback`, id = the vmid).

use serde::Deserialize;

use super::{Method, Request};

/// Which guest API a snapshot request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotGuest {
    /// `/nodes/{node}/qemu/{vmid}/...`
    Qemu,
    /// `/nodes/{node}/lxc/{vmid}/...`
    Lxc,
}

impl SnapshotGuest {
    /// The task type prefix PVE uses for this guest's snapshot tasks (`qm` or `vz`).
    pub fn task_prefix(self) -> &'static str {
        match self {
            Self::Qemu => "qm",
            Self::Lxc => "vz",
        }
    }
}

macro_rules! snap_template {
    ($guest:expr, $suffix:literal) => {
        match $guest {
            SnapshotGuest::Qemu => concat!("/nodes/{node}/qemu/{vmid}", $suffix),
            SnapshotGuest::Lxc => concat!("/nodes/{node}/lxc/{vmid}", $suffix),
        }
    };
}

/// `GET .../{vmid}/snapshot`: every snapshot, plus the `current` pseudo entry.
pub fn snapshot_list(guest: SnapshotGuest, node: &str, vmid: u32) -> Request {
    let vmid = vmid.to_string();
    Request::new(
        Method::Get,
        snap_template!(guest, "/snapshot"),
        &[node, &vmid],
    )
}

/// `POST .../{vmid}/snapshot` with `snapname` and `description`, never `vmstate` (no RAM
/// state: the snapshot is of disks and config only).
pub fn snapshot_create(
    guest: SnapshotGuest,
    node: &str,
    vmid: u32,
    snapname: &str,
    description: &str,
) -> Request {
    let vmid = vmid.to_string();
    Request::new(
        Method::Post,
        snap_template!(guest, "/snapshot"),
        &[node, &vmid],
    )
    .param("snapname", snapname)
    .param("description", description)
}

/// `DELETE .../{vmid}/snapshot/{snapname}`.
pub fn snapshot_delete(guest: SnapshotGuest, node: &str, vmid: u32, snapname: &str) -> Request {
    let vmid = vmid.to_string();
    Request::new(
        Method::Delete,
        snap_template!(guest, "/snapshot/{snapname}"),
        &[node, &vmid, snapname],
    )
}

/// `POST .../{vmid}/snapshot/{snapname}/rollback` (no `start`: a guest PVE stops for the
/// rollback stays stopped; the next pass starts it if its manifest says `running`).
pub fn snapshot_rollback(guest: SnapshotGuest, node: &str, vmid: u32, snapname: &str) -> Request {
    let vmid = vmid.to_string();
    Request::new(
        Method::Post,
        snap_template!(guest, "/snapshot/{snapname}/rollback"),
        &[node, &vmid, snapname],
    )
}

/// `GET .../{vmid}/feature?feature=snapshot`: whether every volume's storage can snapshot.
pub fn snapshot_feature(guest: SnapshotGuest, node: &str, vmid: u32) -> Request {
    let vmid = vmid.to_string();
    Request::new(
        Method::Get,
        snap_template!(guest, "/feature"),
        &[node, &vmid],
    )
    .param("feature", "snapshot")
}

/// One entry of [`snapshot_list`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SnapshotEntry {
    /// The snapshot's name (`current` is the guest itself, not a snapshot).
    pub name: String,
    /// When it was taken (epoch seconds; absent for `current`).
    #[serde(default, deserialize_with = "crate::lenient::opt_u64")]
    pub snaptime: Option<u64>,
    /// Its parent snapshot.
    #[serde(default)]
    pub parent: Option<String>,
    /// Its description.
    #[serde(default)]
    pub description: Option<String>,
}

/// The requests of this file, for the contract test.
pub(super) fn contract_requests() -> Vec<Request> {
    let mut all = Vec::new();
    for guest in [SnapshotGuest::Qemu, SnapshotGuest::Lxc] {
        all.push(snapshot_list(guest, "pve1", 100));
        all.push(snapshot_create(
            guest,
            "pve1",
            100,
            "proxops-abc1234-1",
            "d",
        ));
        all.push(snapshot_delete(guest, "pve1", 100, "proxops-abc1234-1"));
        all.push(snapshot_rollback(guest, "pve1", 100, "proxops-abc1234-1"));
        all.push(snapshot_feature(guest, "pve1", 100));
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_requests_go_to_each_guest_types_paths_with_their_parameters() {
        let create = snapshot_create(SnapshotGuest::Qemu, "pve1", 100, "proxops-a-1", "why");
        assert_eq!(create.method, Method::Post);
        assert_eq!(create.path, "/nodes/pve1/qemu/100/snapshot");
        assert_eq!(
            create.form,
            vec![
                ("snapname".to_owned(), "proxops-a-1".to_owned()),
                ("description".to_owned(), "why".to_owned())
            ]
        );
        let rollback = snapshot_rollback(SnapshotGuest::Lxc, "pve2", 7, "proxops-a-1");
        assert_eq!(
            rollback.path,
            "/nodes/pve2/lxc/7/snapshot/proxops-a-1/rollback"
        );
        assert!(rollback.form.is_empty());
        let feature = snapshot_feature(SnapshotGuest::Lxc, "pve2", 7);
        assert_eq!(
            feature.query,
            vec![("feature".to_owned(), "snapshot".to_owned())]
        );
        let delete = snapshot_delete(SnapshotGuest::Qemu, "pve1", 100, "proxops-a-1");
        assert_eq!(delete.method, Method::Delete);
        assert_eq!(
            delete.template,
            "/nodes/{node}/qemu/{vmid}/snapshot/{snapname}"
        );
    }

    #[test]
    fn a_snapshot_listing_parses_with_the_current_entry() {
        let body = serde_json::json!([
            {"name": "proxops-a-1", "snaptime": 1700000000, "vmstate": 0, "description": ""},
            {"name": "current", "digest": "x", "running": 0, "description": "You are here!",
             "parent": "proxops-a-1"}
        ]);
        let list: Vec<SnapshotEntry> = serde_json::from_value(body).unwrap();
        assert_eq!(list[0].snaptime, Some(1_700_000_000));
        assert_eq!(list[1].name, "current");
        assert_eq!(list[1].parent.as_deref(), Some("proxops-a-1"));
    }
}
