//! `/access/ticket` (login) and `/access/permissions`. Every authenticated caller holds all
//! privileges; the only permission rules modelled are PVE's hard-wired `root@pam` checks,
//! which live with the handlers that make them.

use serde_json::{Map, Value, json};

use super::Ctx;
use crate::error::{ApiError, ApiResult};

/// Privileges reported for every path.
const PRIVILEGES: &[&str] = &[
    "Datastore.Allocate",
    "Datastore.AllocateSpace",
    "Datastore.AllocateTemplate",
    "Datastore.Audit",
    "Pool.Allocate",
    "Pool.Audit",
    "SDN.Audit",
    "SDN.Use",
    "Sys.Audit",
    "Sys.Console",
    "Sys.Modify",
    "Sys.PowerMgmt",
    "VM.Allocate",
    "VM.Audit",
    "VM.Backup",
    "VM.Clone",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Cloudinit",
    "VM.Config.Disk",
    "VM.Config.HWType",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.Console",
    "VM.GuestAgent.Audit",
    "VM.GuestAgent.Unrestricted",
    "VM.Migrate",
    "VM.PowerMgmt",
    "VM.Snapshot",
];

pub(super) async fn ticket(ctx: &Ctx) -> ApiResult {
    let mut username = ctx.params.required("username")?.to_string();
    let password = ctx.params.required("password")?.to_string();
    if let Some(realm) = ctx.params.get("realm")
        && !username.contains('@')
    {
        username = format!("{username}@{realm}");
    }
    let login = {
        let mut cluster = ctx.shared.cluster();
        let name = cluster.name.clone();
        cluster
            .auth
            .login(&username, &password)
            .map(|(t, c)| (t, c, name))
    };
    match login {
        Some((ticket, csrf, clustername)) => Ok(json!({
            "username": username,
            "ticket": ticket,
            "CSRFPreventionToken": csrf,
            "clustername": clustername,
            "cap": {},
        })),
        None => {
            let delay = ctx.shared.settings.auth_failure_delay;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Err(ApiError::Die {
                status: 401,
                message: "authentication failure\n".to_string(),
            })
        }
    }
}

pub(super) fn permissions(ctx: &Ctx) -> Value {
    let cluster = ctx.shared.cluster();
    let mut paths = vec!["/".to_string(), "/access".to_string(), "/nodes".to_string()];
    paths.extend(
        cluster
            .storages
            .iter()
            .map(|s| format!("/storage/{}", s.id)),
    );
    paths.push("/vms".to_string());
    paths.extend(cluster.guests.keys().map(|id| format!("/vms/{id}")));
    paths.extend(cluster.pools.keys().map(|p| format!("/pool/{p}")));
    let privs: Map<String, Value> = PRIVILEGES
        .iter()
        .map(|p| ((*p).to_string(), Value::from(1)))
        .collect();
    let only = ctx.params.get("path");
    Value::Object(
        paths
            .into_iter()
            .filter(|p| only.is_none_or(|o| o == p))
            .map(|p| (p, Value::Object(privs.clone())))
            .collect(),
    )
}
