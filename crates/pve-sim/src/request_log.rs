//! The request log and per-endpoint counters that tests read through
//! [`crate::SimControl::requests`] or `GET /_sim/requests`, e.g. to prove that a pass sent
//! no writes.

use std::collections::BTreeMap;

use serde::Serialize;

/// Most entries kept; older ones are dropped (counters keep counting).
const MAX_ENTRIES: usize = 10_000;

/// One handled request.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RequestRecord {
    /// Sequence number from 1.
    pub seq: u64,
    /// HTTP method.
    pub method: String,
    /// Path below `/api2/json`, e.g. `/nodes/pve1/qemu/100/config`.
    pub path: String,
    /// Endpoint template, e.g. `/nodes/{node}/qemu/{vmid}/config`.
    pub endpoint: String,
    /// Query and body parameters (secrets masked).
    pub params: BTreeMap<String, String>,
    /// The authenticated user or token (`root@pam!proxops`), if any.
    pub user: Option<String>,
    /// HTTP status answered.
    pub status: u16,
}

/// Log plus counters keyed by `METHOD /endpoint/template`.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RequestLog {
    /// Recent requests, oldest first.
    pub requests: Vec<RequestRecord>,
    /// Request count per `METHOD /endpoint/template`.
    pub counters: BTreeMap<String, u64>,
    #[serde(skip)]
    next_seq: u64,
}

impl RequestLog {
    pub(crate) fn record(&mut self, mut record: RequestRecord) {
        self.next_seq += 1;
        record.seq = self.next_seq;
        *self
            .counters
            .entry(format!("{} {}", record.method, record.endpoint))
            .or_default() += 1;
        self.requests.push(record);
        if self.requests.len() > MAX_ENTRIES {
            let excess = self.requests.len() - MAX_ENTRIES;
            self.requests.drain(..excess);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.requests.clear();
        self.counters.clear();
    }
}

/// The endpoint template of a concrete path: `/nodes/pve1/qemu/100` becomes
/// `/nodes/{node}/qemu/{vmid}`.
pub(crate) fn endpoint_template(path: &str) -> String {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut out = Vec::with_capacity(segs.len());
    for (i, seg) in segs.iter().enumerate() {
        let prev = if i > 0 { segs[i - 1] } else { "" };
        let nested = i > 1;
        let t = match prev {
            "nodes" if i == 1 => "{node}",
            "qemu" | "lxc" if nested => "{vmid}",
            "storage" if nested => "{storage}",
            "tasks" if nested => "{upid}",
            "pools" if i == 1 => "{poolid}",
            // Volume ids may contain `/`: the parameter takes the rest of the path.
            "content" if nested => {
                out.push("{volume}");
                break;
            }
            _ => seg,
        };
        out.push(t);
    }
    format!("/{}", out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concrete_paths_map_to_endpoint_templates() {
        assert_eq!(
            endpoint_template("/nodes/pve1/qemu/100/config"),
            "/nodes/{node}/qemu/{vmid}/config"
        );
        assert_eq!(
            endpoint_template("/nodes/pve1/storage/local/content/local:iso/a.iso"),
            "/nodes/{node}/storage/{storage}/content/{volume}"
        );
        assert_eq!(endpoint_template("/cluster/tasks"), "/cluster/tasks");
        assert_eq!(endpoint_template("/nodes"), "/nodes");
    }
}
