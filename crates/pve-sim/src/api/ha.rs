//! `GET /cluster/ha/status/current`: PVE's HA status, with nodes in maintenance mode (issue
//! 19, item 7).
//!
//! Modelled from pve-ha-manager @ b71218f `src/PVE/API2/HA/Status.pm` `status` (the handler
//! of `current`; the schema's `Sys.Audit` on `/` is checked by the dispatcher): always a
//! `quorum` entry (`status` `OK`, `quorate` 1) and a `fencing` entry; with HA in use
//! (a manager status with a master and a `node_status`) also a `master` entry and one
//! `lrm:<node>` entry per node, whose `status` is `<node> (<state>, <watchdog>, <time>)`. A
//! node whose LRM is in maintenance mode (`src/PVE/HA/LRM.pm` `update_service_status`: a
//! `node_request` with `maintenance` set by `ha-manager crm-command node-maintenance enable`
//! turns `mode` to `maintenance`) shows `<node> (maintenance mode, watchdog active, ...)`;
//! an active one `<node> (active, watchdog active, ...)` (with services; `idle` without:
//! the simulator has no HA services, so its LRMs are `idle`). Without HA only `quorum` and
//! `fencing` (`standby`) are listed. The time is `localtime()`'s text (UTC here).

use serde_json::{Value, json};

use super::Ctx;
use crate::cluster::now_epoch;
use crate::error::ApiResult;

/// `localtime`'s scalar form, `Tue Dec  1 15:24:59 2026`.
fn ctime_text(epoch: u64) -> String {
    let (y, mo, d, h, mi, s) = super::vzdump::civil(epoch);
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let weekday = DAYS[usize::try_from((epoch / 86_400) % 7).unwrap_or(0)];
    let month = MONTHS[usize::try_from(mo.saturating_sub(1)).unwrap_or(0) % 12];
    format!("{weekday} {month} {d:>2} {h:02}:{mi:02}:{s:02} {y}")
}

pub(super) fn current(ctx: &Ctx) -> ApiResult<Value> {
    let cluster = ctx.shared.cluster();
    let now = now_epoch();
    let first = cluster.nodes.keys().next().cloned().unwrap_or_default();
    let mut entries = vec![json!({
        "id": "quorum",
        "type": "quorum",
        "node": first,
        "status": "OK",
        "quorate": 1,
    })];
    let Some(maintenance) = &cluster.ha else {
        entries.push(json!({
            "id": "fencing",
            "type": "fencing",
            "node": first,
            "status": "standby (CRM watchdog standby)",
            "armed-state": "standby",
        }));
        return Ok(Value::Array(entries));
    };
    let time = ctime_text(now);
    entries.push(json!({
        "id": "master",
        "type": "master",
        "node": first,
        "status": format!("{first} (active, {time})"),
        "timestamp": now,
    }));
    entries.push(json!({
        "id": "fencing",
        "type": "fencing",
        "node": first,
        "status": "armed (CRM watchdog active)",
        "armed-state": "armed",
    }));
    for name in cluster.nodes.keys() {
        let (state, watchdog) = if maintenance.contains(name) {
            ("maintenance mode", "watchdog active")
        } else {
            ("idle", "watchdog standby")
        };
        entries.push(json!({
            "id": format!("lrm:{name}"),
            "type": "lrm",
            "node": name,
            "status": format!("{name} ({state}, {watchdog}, {time})"),
            "timestamp": now,
        }));
    }
    Ok(Value::Array(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lrm_times_print_as_perls_localtime() {
        assert_eq!(ctime_text(1_796_138_699), "Tue Dec  1 15:24:59 2026");
        assert_eq!(ctime_text(0), "Thu Jan  1 00:00:00 1970");
    }
}
