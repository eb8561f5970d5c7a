//! Task endpoints: `/nodes/{node}/tasks` (list), `/tasks/{upid}/status`, `/tasks/{upid}/log`,
//! `DELETE /tasks/{upid}`, and `/cluster/tasks`.
//!
//! The list follows pve-manager 14a22df3 `PVE/API2/Tasks.pm` `node_tasks`: tasks from the
//! archive (finished) have their UPID's `user@realm!token` split into `user` and `tokenid`
//! (`$parse_line` → `$convert_token_task`) *before* `$filter_task` matches `userfilter` as a
//! case-insensitive substring of `user`; tasks from the `active` file (running) are not
//! split, so their `user` is the whole token id.

use serde_json::{Value, json};

use super::{Ctx, Reply};
use crate::error::{ApiError, ApiResult};
use crate::task::{Task, Upid};

pub(super) fn cluster_tasks(ctx: &Ctx) -> Reply {
    let cluster = ctx.shared.cluster();
    let items: Vec<Value> = cluster.tasks.iter().rev().map(Task::to_list_item).collect();
    Value::Array(items).into()
}

pub(super) fn node_tasks(ctx: &Ctx) -> ApiResult<Reply> {
    let p = &ctx.params;
    let start = p.u64("start")?.unwrap_or(0) as usize;
    let limit = p.u64("limit")?.unwrap_or(50) as usize;
    let source = p.get("source").unwrap_or("archive");
    let errors_only = p.flag("errors").unwrap_or(false);
    let vmid = p.get("vmid");
    let typefilter = p.get("typefilter");
    let userfilter = p.get("userfilter");
    let statusfilter: Option<Vec<String>> = p
        .get("statusfilter")
        .map(|s| s.split([',', ';']).map(str::to_lowercase).collect());
    let since = p.u64("since")?;
    let until = p.u64("until")?;
    let cluster = ctx.shared.cluster();
    cluster.node(ctx.node())?;
    let matching: Vec<&Task> = cluster
        .tasks
        .iter()
        .rev()
        .filter(|t| t.upid.node == ctx.node())
        .filter(|t| match source {
            "active" => t.is_running(),
            "all" => true,
            _ => !t.is_running(),
        })
        .filter(|t| !errors_only || (!t.is_running() && !t.is_ok()))
        .filter(|t| vmid.is_none_or(|v| t.upid.id == v))
        .filter(|t| typefilter.is_none_or(|f| t.upid.kind == f))
        .filter(|t| userfilter.is_none_or(|u| matches_user(t, u)))
        .filter(|t| since.is_none_or(|s| t.upid.starttime >= s))
        .filter(|t| until.is_none_or(|u| t.upid.starttime <= u))
        .filter(|t| {
            statusfilter.as_ref().is_none_or(|f| {
                let class = match t.exitstatus.as_deref() {
                    None => "running",
                    Some("OK") => "ok",
                    Some(s) if s.starts_with("WARNINGS: ") => "warning",
                    Some("unexpected status") => "unknown",
                    Some(_) => "error",
                };
                f.iter().any(|x| x == class)
            })
        })
        .collect();
    let total = matching.len();
    let items: Vec<Value> = matching
        .into_iter()
        .skip(start)
        .take(limit)
        .map(Task::to_list_item)
        .collect();
    Ok(Reply::with_total(Value::Array(items), total))
}

/// `$task->{user} !~ m/\Q$userfilter\E/i`, with `user` as the list shows it: the user
/// part only for a finished (archived) task, the whole token id for a running one.
fn matches_user(task: &Task, filter: &str) -> bool {
    let user = if task.is_running() {
        task.upid.user.as_str()
    } else {
        task.upid.userid()
    };
    user.to_lowercase().contains(&filter.to_lowercase())
}

fn find<'a>(tasks: &'a [Task], upid: &str) -> ApiResult<&'a Task> {
    if Upid::parse(upid).is_none() {
        return Err(ApiError::param("upid", "unable to parse worker upid"));
    }
    tasks
        .iter()
        .find(|t| t.upid_text == upid)
        .ok_or_else(|| ApiError::param("upid", "no such task"))
}

/// `GET /nodes/{node}/tasks/{upid}/status`: `running`/`stopped` and, once stopped, the
/// `exitstatus` (`OK`, `WARNINGS: N`, or the last log line's error); an unknown UPID is 400
/// `{"upid": "no such task"}` (pve-manager @ 14a22df3 `PVE/API2/Tasks.pm`
/// `read_task_status`; pve-common @ f665029e `src/PVE/UPID.pm` `read_status`).
pub(super) fn status(ctx: &Ctx) -> ApiResult {
    let upid = ctx.params.required("upid")?;
    let cluster = ctx.shared.cluster();
    Ok(find(&cluster.tasks, upid)?.to_status())
}

/// `GET /nodes/{node}/tasks/{upid}/log`: lines `{n, t}` from 1 with `start`/`limit`
/// (default 50) and a `total`, `no content` for an empty log (pve-manager @ 14a22df3
/// `PVE/API2/Tasks.pm` `read_task_log`).
pub(super) fn log(ctx: &Ctx) -> ApiResult<Reply> {
    let upid = ctx.params.required("upid")?;
    let start = ctx.params.u64("start")?.unwrap_or(0) as usize;
    let limit = ctx.params.u64("limit")?.unwrap_or(50) as usize;
    let cluster = ctx.shared.cluster();
    let mut lines = find(&cluster.tasks, upid)?.log_lines();
    if lines.is_empty() {
        lines.push("no content".to_string());
    }
    let total = lines.len();
    let items: Vec<Value> = lines
        .into_iter()
        .enumerate()
        .skip(start)
        .take(limit)
        .map(|(i, t)| json!({ "n": i + 1, "t": t }))
        .collect();
    Ok(Reply::with_total(Value::Array(items), total))
}

/// `DELETE /nodes/{node}/tasks/{upid}`: stops a running task (pve-manager @ 14a22df3
/// `PVE/API2/Tasks.pm` `stop_task`).
pub(super) fn stop(ctx: &Ctx) -> ApiResult {
    let upid = ctx.params.required("upid")?.to_string();
    let mut cluster = ctx.shared.cluster();
    find(&cluster.tasks, &upid)?;
    if let Some(t) = cluster.tasks.iter_mut().find(|t| t.upid_text == upid)
        && t.is_running()
    {
        t.exitstatus = Some("interrupted by signal".to_string());
        t.endtime = Some(crate::cluster::now_epoch());
    }
    Ok(Value::Null)
}
