//! `/access/ticket` (login) and `/access/permissions` (the caller's effective privileges,
//! from `crate::acl`). PVE's hard-wired `root@pam` checks live with the handlers that make
//! them; the ACL checks live in `permission.rs`.

use serde_json::{Map, Value, json};

use super::Ctx;
use crate::acl::Privs;
use crate::error::{ApiError, ApiResult};

/// `POST /access/ticket`: a `PVE:<user>:<time>::<sig>` ticket and a `CSRFPreventionToken`
/// for a right password, else 401 `authentication failure` (pve-access-control @ 5ccd07d
/// `src/PVE/API2/AccessControl.pm` `create_ticket`), answered late as pve-http-server
/// @ 5c9e4ea `src/PVE/APIServer/AnyEvent.pm` `handle_api2_request` delays every 401 to 3 s
/// (`auth_failure_delay`).
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

/// `GET /access/permissions`: the effective privileges of the caller (or of `userid`: itself,
/// one of its own tokens, or anyone with `Sys.Audit` on `/access`), per path, each with its
/// propagate flag; with `path`, that path only (`{}` when nothing is held there)
/// (pve-access-control @ 5ccd07d `src/PVE/API2/AccessControl.pm` `permissions`).
pub(super) fn permissions(ctx: &Ctx) -> ApiResult {
    let caller = ctx.authid().to_string();
    let cluster = ctx.shared.cluster();
    let target = ctx.params.get("userid").unwrap_or(&caller).to_string();
    let own_token = target
        .split_once('!')
        .is_some_and(|(user, _)| user == caller);
    if target != caller && !own_token {
        cluster
            .acl
            .check(&caller, "/access", &["Sys.Audit"], false)?;
    }
    let render = |privs: Privs| -> Value {
        Value::Object(
            privs
                .into_iter()
                .map(|(p, propagate)| (p, Value::from(u8::from(propagate))))
                .collect::<Map<String, Value>>(),
        )
    };
    if let Some(path) = ctx.params.get("path") {
        let privs = cluster.acl.permissions(&target, path);
        let mut out = Map::new();
        if !privs.is_empty() {
            out.insert(path.to_string(), render(privs));
        }
        return Ok(Value::Object(out));
    }
    let pools = cluster.pools.keys().cloned().collect::<Vec<_>>();
    Ok(Value::Object(
        cluster
            .acl
            .effective(&target, pools.into_iter())
            .into_iter()
            .map(|(path, privs)| (path, render(privs)))
            .collect(),
    ))
}
