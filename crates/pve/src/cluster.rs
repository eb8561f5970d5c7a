//! Cluster-wide responses: `/version`, `/cluster/resources` and `/nodes`.
//!
//! `proxops-pve`'s own serde types, decoded leniently (BEHAVIOUR.md §8, §11). Unknown fields
//! are ignored; fields ProxOps may decide on are typed, everything else stays out.

use std::fmt;

use serde::Deserialize;

use crate::lenient;

/// `GET /version`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Version {
    /// Full version, e.g. `9.1-1`.
    pub version: String,
    /// Release, e.g. `9.1`.
    pub release: String,
    /// Git commit of pve-manager.
    #[serde(default)]
    pub repoid: String,
}

/// The `type` filter of `GET /cluster/resources`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceType {
    /// Guests (qemu and lxc).
    Vm,
    /// Storages, one entry per (node, storage).
    Storage,
    /// Nodes.
    Node,
    /// SDN zones.
    Sdn,
}

impl ResourceType {
    /// PVE's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vm => "vm",
            Self::Storage => "storage",
            Self::Node => "node",
            Self::Sdn => "sdn",
        }
    }
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of `GET /cluster/resources`; which fields are set depends on `resource_type`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ClusterResource {
    /// `qemu/100`, `lxc/101`, `node/pve1`, `storage/pve1/local`, `/pool/p`.
    pub id: String,
    /// `qemu`, `lxc`, `node`, `storage`, `pool`, `sdn`, ...
    #[serde(rename = "type")]
    pub resource_type: String,
    /// Node the resource is on (absent for pools).
    #[serde(default)]
    pub node: Option<String>,
    /// Guest id.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub vmid: Option<u64>,
    /// Guest name (missing until the status daemon has published stats).
    #[serde(default)]
    pub name: Option<String>,
    /// `running`/`stopped` for guests, `online`/`offline` for nodes, `available` for storage.
    #[serde(default)]
    pub status: Option<String>,
    /// Whether a guest is a template.
    #[serde(default, deserialize_with = "lenient::opt_bool")]
    pub template: Option<bool>,
    /// Guest tags, `;`-separated.
    #[serde(default)]
    pub tags: Option<String>,
    /// Guest lock (`create`, `clone`, `backup`, ...).
    #[serde(default)]
    pub lock: Option<String>,
    /// Pool the guest belongs to, or the pool's id for pool entries.
    #[serde(default)]
    pub pool: Option<String>,
    /// Storage id, for storage entries.
    #[serde(default)]
    pub storage: Option<String>,
    /// Storage plugin type, for storage entries.
    #[serde(default)]
    pub plugintype: Option<String>,
    /// Comma-separated content types, for storage entries.
    #[serde(default)]
    pub content: Option<String>,
    /// Whether a storage is shared.
    #[serde(default, deserialize_with = "lenient::opt_bool")]
    pub shared: Option<bool>,
    /// Maximum memory in bytes.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub maxmem: Option<u64>,
    /// Maximum disk (or storage size) in bytes.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub maxdisk: Option<u64>,
    /// CPU count.
    #[serde(default, deserialize_with = "lenient::opt_f64")]
    pub maxcpu: Option<f64>,
}

/// One entry of `GET /nodes`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct NodeInfo {
    /// Node name.
    pub node: String,
    /// `online`, `offline` or `unknown`.
    #[serde(default)]
    pub status: String,
    /// SHA-256 fingerprint of the node's certificate, colon-separated hex.
    #[serde(default)]
    pub ssl_fingerprint: Option<String>,
    /// Uptime in seconds.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub uptime: Option<u64>,
    /// CPU count.
    #[serde(default, deserialize_with = "lenient::opt_f64")]
    pub maxcpu: Option<f64>,
    /// Memory in bytes.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub maxmem: Option<u64>,
}

impl NodeInfo {
    /// Whether PVE reports the node online.
    pub fn is_online(&self) -> bool {
        self.status == "online"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(json: &str) -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        v["data"].clone()
    }

    #[test]
    fn cluster_resources_decode_recorded_guest_listing() {
        let json = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/cluster-resources-vm.cpx-vm_info.json"
        ));
        let items: Vec<ClusterResource> = serde_json::from_value(data(json)).unwrap();
        let vm = items.iter().find(|r| r.id == "qemu/101").unwrap();
        assert_eq!(vm.vmid, Some(101));
        assert_eq!(vm.node.as_deref(), Some("pve2"));
        assert_eq!(vm.pool.as_deref(), Some("pool1"));
        assert_eq!(vm.template, Some(false));
        assert!(items.iter().any(|r| r.resource_type == "lxc"));
    }

    #[test]
    fn version_decodes_recorded_answer() {
        let json = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/version.go-proxmox-pve9x.json"
        ));
        let v: Version = serde_json::from_value(data(json)).unwrap();
        assert_eq!(v.release, "9.1");
    }

    #[test]
    fn nodes_accept_string_or_number_fields() {
        let n: NodeInfo =
            serde_json::from_str(r#"{"node":"pve1","status":"online","uptime":"12","maxcpu":4}"#)
                .unwrap();
        assert!(n.is_online());
        assert_eq!(n.uptime, Some(12));
    }
}
