//! Tasks: UPIDs in PVE's format, the task table entries (status, exit status, log), and the
//! runner that finishes a task after the configured duration.
//!
//! Each task type may have its own duration (`SimConfig::task_durations`: downloads,
//! creates, clones, starts), else the common `task_duration`.
//!
//! A handler registers a task while it holds the cluster lock and hands over the work that
//! finishes it. The work runs later, again under the cluster lock, after `task_duration`
//! (or right away, inside the request, when the duration is zero). Work that has to wait on
//! the outside world (download-url) first runs an async preparation without the lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use regex::Regex;

use crate::cluster::Cluster;
use crate::state::Shared;

/// Work that finishes a task: changes the cluster, appends log lines, and returns the error
/// text on failure. The `Option<String>` is a failure injected through the fault API; work
/// that created placeholders (a `lock: create` config) must remove them and return it.
pub(crate) type Work =
    Box<dyn FnOnce(&mut Cluster, &mut Vec<String>, Option<String>) -> Result<(), String> + Send>;

/// Async preparation (outside the cluster lock) that yields the finishing work.
pub(crate) type Prepare = Pin<Box<dyn Future<Output = Work> + Send>>;

/// A parsed UPID: `UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:`, printed and
/// parsed with PVE's format and regex (pve-common @ f665029e `src/PVE/UPID.pm` `encode`,
/// `decode`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Upid {
    pub(crate) node: String,
    pub(crate) pid: u32,
    pub(crate) pstart: u64,
    pub(crate) starttime: u64,
    pub(crate) kind: String,
    pub(crate) id: String,
    pub(crate) user: String,
}

static UPID_RE: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::unwrap_used)] // a literal pattern
    Regex::new(
        r"^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):([^:\s/]+):([^:\s/]*):([^:\s/]+):$",
    )
    .unwrap()
});

impl Upid {
    /// Parses a UPID with PVE's regex.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let c = UPID_RE.captures(text)?;
        Some(Self {
            node: c[1].to_string(),
            pid: u32::from_str_radix(&c[3], 16).ok()?,
            pstart: u64::from_str_radix(&c[4], 16).ok()?,
            starttime: u64::from_str_radix(&c[5], 16).ok()?,
            kind: c[6].to_string(),
            id: c[7].to_string(),
            user: c[8].to_string(),
        })
    }

    /// `user` without the token part.
    pub(crate) fn userid(&self) -> &str {
        self.user.split('!').next().unwrap_or(&self.user)
    }

    /// The token id when the task was started with an API token.
    pub(crate) fn tokenid(&self) -> Option<&str> {
        self.user.split_once('!').map(|(_, t)| t)
    }
}

impl std::fmt::Display for Upid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "UPID:{}:{:08X}:{:08X}:{:08X}:{}:{}:{}:",
            self.node, self.pid, self.pstart, self.starttime, self.kind, self.id, self.user
        )
    }
}

/// One entry of the task table.
#[derive(Debug, Clone)]
pub(crate) struct Task {
    pub(crate) upid: Upid,
    pub(crate) upid_text: String,
    pub(crate) log: Vec<String>,
    /// `None` while running; the exit status once stopped.
    pub(crate) exitstatus: Option<String>,
    pub(crate) endtime: Option<u64>,
}

impl Task {
    pub(crate) fn is_running(&self) -> bool {
        self.exitstatus.is_none()
    }

    /// Success as PVE's `status_is_error` sees it.
    pub(crate) fn is_ok(&self) -> bool {
        self.exitstatus
            .as_deref()
            .is_some_and(|s| s == "OK" || s.starts_with("WARNINGS: "))
    }

    /// The log as the log endpoint numbers it, including the final `TASK ...` line.
    pub(crate) fn log_lines(&self) -> Vec<String> {
        let mut lines = self.log.clone();
        match self.exitstatus.as_deref() {
            None => {}
            Some("OK") => lines.push("TASK OK".to_string()),
            Some(s) if s.starts_with("WARNINGS: ") => lines.push(format!("TASK {s}")),
            Some(s) => lines.push(format!("TASK ERROR: {s}")),
        }
        lines
    }

    /// The item shape of `/nodes/{node}/tasks` and `/cluster/tasks`. A finished task comes
    /// from the archive, whose lines `node_tasks` splits into `user` and `tokenid`; a running
    /// one comes from the `active` file unsplit, `user` being the whole token id (pve-manager
    /// 14a22df3 `PVE/API2/Tasks.pm` `node_tasks`, `$parse_line`, `$convert_token_task`).
    pub(crate) fn to_list_item(&self) -> serde_json::Value {
        let running = self.is_running();
        let mut v = serde_json::json!({
            "upid": self.upid_text,
            "node": self.upid.node,
            "pid": self.upid.pid,
            "pstart": self.upid.pstart,
            "starttime": self.upid.starttime,
            "type": self.upid.kind,
            "id": self.upid.id,
            "user": if running { self.upid.user.as_str() } else { self.upid.userid() },
        });
        if let Some(t) = self.upid.tokenid()
            && !running
        {
            v["tokenid"] = t.into();
        }
        match (&self.exitstatus, self.endtime) {
            (Some(s), Some(end)) => {
                v["status"] = s.clone().into();
                v["endtime"] = end.into();
            }
            _ => v["status"] = "RUNNING".into(),
        }
        v
    }

    /// The shape of `/nodes/{node}/tasks/{upid}/status`.
    pub(crate) fn to_status(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "upid": self.upid_text,
            "node": self.upid.node,
            "pid": self.upid.pid,
            "pstart": self.upid.pstart,
            "starttime": self.upid.starttime,
            "type": self.upid.kind,
            "id": self.upid.id,
            "user": self.upid.userid(),
            "status": if self.is_running() { "running" } else { "stopped" },
        });
        if let Some(t) = self.upid.tokenid() {
            v["tokenid"] = t.into();
        }
        if let Some(s) = &self.exitstatus {
            v["exitstatus"] = s.clone().into();
        }
        v
    }
}

/// What a handler asks for when it starts a task.
pub(crate) struct TaskSpec<'a> {
    pub(crate) node: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) id: String,
    pub(crate) user: &'a str,
}

/// Registers a running task and schedules `work`. Returns the UPID text.
pub(crate) fn start(
    shared: &Arc<Shared>,
    cluster: &mut Cluster,
    spec: &TaskSpec<'_>,
    work: Work,
) -> String {
    start_at_least(shared, cluster, spec, Duration::ZERO, work)
}

/// Like [`start`], but the task runs at least `min` (a disk import inside a config write).
pub(crate) fn start_at_least(
    shared: &Arc<Shared>,
    cluster: &mut Cluster,
    spec: &TaskSpec<'_>,
    min: Duration,
    work: Work,
) -> String {
    let duration = shared.settings.task_duration_of(spec.kind).max(min);
    let (index, upid, injected) = register(shared, cluster, spec);
    if duration.is_zero() {
        finish(cluster, index, work, injected);
        return upid;
    }
    let prepare: Prepare = Box::pin(async move { work });
    schedule(shared, index, injected, prepare, Instant::now() + duration);
    upid
}

/// Like [`start`], but first runs `prepare` outside the cluster lock (it may take longer
/// than the task duration; the task ends when both are done).
pub(crate) fn start_prepared(
    shared: &Arc<Shared>,
    cluster: &mut Cluster,
    spec: &TaskSpec<'_>,
    prepare: Prepare,
) -> String {
    let deadline = Instant::now() + shared.settings.task_duration_of(spec.kind);
    let (index, upid, injected) = register(shared, cluster, spec);
    schedule(shared, index, injected, prepare, deadline);
    upid
}

fn register(
    shared: &Arc<Shared>,
    cluster: &mut Cluster,
    spec: &TaskSpec<'_>,
) -> (usize, String, Option<String>) {
    let injected = shared.faults().take_task_failure(spec.kind);
    let (pid, pstart) = cluster.next_pid();
    let upid = Upid {
        node: spec.node.to_string(),
        pid,
        pstart,
        starttime: crate::cluster::now_epoch(),
        kind: spec.kind.to_string(),
        id: spec.id.clone(),
        user: spec.user.to_string(),
    };
    let upid_text = upid.to_string();
    cluster.tasks.push(Task {
        upid,
        upid_text: upid_text.clone(),
        log: Vec::new(),
        exitstatus: None,
        endtime: None,
    });
    (cluster.tasks.len() - 1, upid_text, injected)
}

fn schedule(
    shared: &Arc<Shared>,
    index: usize,
    injected: Option<String>,
    prepare: Prepare,
    deadline: Instant,
) {
    let shared2 = Arc::clone(shared);
    shared.tracker.spawn(async move {
        let cancel = shared2.cancel.clone();
        let work = tokio::select! {
            w = prepare => w,
            () = cancel.cancelled() => return,
        };
        tokio::select! {
            () = tokio::time::sleep_until(deadline.into()) => {}
            () = cancel.cancelled() => return,
        }
        let mut cluster = shared2.cluster();
        finish(&mut cluster, index, work, injected);
    });
}

fn finish(cluster: &mut Cluster, index: usize, work: Work, injected: Option<String>) {
    // Stopped early through `DELETE /tasks/{upid}`: the work never runs.
    if cluster.tasks.get(index).is_none_or(|t| !t.is_running()) {
        return;
    }
    let mut log = Vec::new();
    // An injected `WARNINGS: N` is not a failure: the work runs and the task ends with it.
    let (injected, warnings) = match injected {
        Some(w) if w.starts_with("WARNINGS: ") => (None, Some(w)),
        other => (other, None),
    };
    let result = work(cluster, &mut log, injected);
    let Some(task) = cluster.tasks.get_mut(index) else {
        return;
    };
    task.log.extend(log);
    if warnings.is_some() {
        task.log.push("WARN: injected warning".to_string());
    }
    task.exitstatus = Some(match result {
        Ok(()) => warnings.unwrap_or_else(|| "OK".to_string()),
        // PVE folds the last log line's newlines into spaces.
        Err(e) => e.trim_end().replace('\n', " "),
    });
    task.endtime = Some(crate::cluster::now_epoch());
}

/// Waits up to `limit` for the task to stop; returns whether it stopped with success.
pub(crate) async fn wait_for(shared: &Arc<Shared>, upid: &str, limit: Duration) -> Option<bool> {
    let deadline = Instant::now() + limit;
    loop {
        {
            let cluster = shared.cluster();
            let task = cluster.tasks.iter().find(|t| t.upid_text == upid)?;
            if !task.is_running() {
                return Some(task.is_ok());
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upids_print_and_parse_in_pves_format() {
        let text = "UPID:pve1:0003A1F2:01B2C3D4:6650A1B2:qmcreate:100:root@pam!proxops:";
        let upid = Upid::parse(text).unwrap();
        assert_eq!(upid.pid, 0x3A1F2);
        assert_eq!(upid.userid(), "root@pam");
        assert_eq!(upid.tokenid(), Some("proxops"));
        assert_eq!(upid.to_string(), text);
        assert!(Upid::parse("UPID:pve1:1:2:3:qmcreate:100:root@pam:").is_none());
    }
}
