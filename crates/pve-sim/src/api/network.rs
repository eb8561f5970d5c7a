//! `GET /nodes/{node}/network`: the node's interfaces from the seed: each seeded Linux bridge,
//! plus one physical port (`eno1`) that the first bridge uses. Only what `proxops check`
//! reads is modelled (names and types); addresses are placeholders from 192.0.2.0/24
//! (documentation range) and nothing can be changed.

use serde_json::{Value, json};

use super::Ctx;
use crate::error::ApiResult;

/// The `type` filter as pve-manager's `Network.pm` index applies it: an exact type, or
/// `any_bridge` / `any_local_bridge` for Linux and OVS bridges.
fn matches(filter: Option<&str>, kind: &str) -> bool {
    match filter {
        None => true,
        Some("any_bridge" | "any_local_bridge") => kind == "bridge" || kind == "OVSBridge",
        Some(f) => f == kind,
    }
}

pub(super) fn index(ctx: &Ctx) -> ApiResult {
    let cluster = ctx.shared.cluster();
    let node = cluster.node(ctx.node())?;
    let index = cluster
        .nodes
        .keys()
        .position(|n| n == &node.name)
        .unwrap_or(0);
    let authid = ctx.authid();
    // Without Sys.Audit or Sys.Modify on the node the simulator hides the physical port (an
    // assumption: the filtering of other interface types was not read).
    let sees_all = cluster.acl.holds(
        authid,
        &format!("/nodes/{}", node.name),
        &["Sys.Audit", "Sys.Modify"],
        true,
    );
    let filter = ctx.params.get("type");
    let mut out = Vec::new();
    if sees_all && matches(filter, "eth") {
        out.push(json!({
            "iface": "eno1",
            "type": "eth",
            "method": "manual",
            "method6": "manual",
            "families": ["inet"],
            "active": 1,
            "exists": 1,
            "priority": 3,
        }));
    }
    for (i, bridge) in node.bridges.iter().enumerate() {
        // "always check bridge access": a bridge is listed only to callers holding SDN.Audit
        // or SDN.Use on it or on one of its VLANs, whatever they hold on the node
        // (pve-manager PVE/API2/Network.pm @ 14a22df, `index`'s `$can_access_vnet`;
        // pve-access-control src/PVE/RPCEnvironment.pm @ 5ccd07d, `check_sdn_bridge`).
        let path = format!("/sdn/zones/localnetwork/{bridge}");
        let privs = ["SDN.Audit", "SDN.Use"];
        let usable = authid == "root@pam"
            || cluster.acl.holds(authid, &path, &privs, true)
            || cluster
                .acl
                .children_of(&path)
                .iter()
                .any(|vlan| cluster.acl.holds(authid, vlan, &privs, true));
        if !usable || !matches(filter, "bridge") {
            continue;
        }
        let mut item = json!({
            "iface": bridge,
            "type": "bridge",
            "method": "manual",
            "method6": "manual",
            "families": ["inet"],
            "active": 1,
            "autostart": 1,
            "bridge_stp": "off",
            "bridge_fd": "0",
            "priority": 4 + i,
        });
        if i == 0 {
            let address = format!("192.0.2.{}", 11 + index);
            item["method"] = Value::from("static");
            item["bridge_ports"] = Value::from("eno1");
            item["cidr"] = Value::from(format!("{address}/24"));
            item["address"] = Value::from(address);
            item["netmask"] = Value::from("24");
            item["gateway"] = Value::from("192.0.2.1");
        } else {
            item["bridge_ports"] = Value::from("");
        }
        out.push(item);
    }
    Ok(Value::Array(out))
}
