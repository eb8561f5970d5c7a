//! PVE tasks: the status and log types, and `wait_for_task`, which polls a UPID to its end.
//!
//! Polling starts at `WaitOptions::poll_interval`, doubles up to `max_poll_interval`, and stops
//! at `timeout`. All waiting uses `tokio::time`, so tests pause and advance the clock. A
//! cancelled or timed-out wait only stops *polling*: the task keeps running in PVE, and the
//! caller records that fact. Transient errors while polling (network, 5xx, already retried by
//! the client) are logged and polling goes on until the timeout; the task is not affected by
//! our connection trouble.

use std::future::Future;
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::PveClient;
use crate::error::PveError;
use crate::lenient;
use crate::upid::Upid;

/// Whether a task is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// The worker is still running.
    Running,
    /// The worker has ended; `exitstatus` says how.
    Stopped,
}

/// `GET /nodes/{node}/tasks/{upid}/status`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TaskStatus {
    /// The task's UPID as PVE reports it.
    #[serde(default)]
    pub upid: String,
    /// The node running the task.
    #[serde(default)]
    pub node: String,
    /// Running or stopped.
    pub status: TaskState,
    /// `OK`, `WARNINGS: <n>` or the error text; present once stopped.
    #[serde(default)]
    pub exitstatus: Option<String>,
    /// Task type (`download`, `qmcreate`, ...).
    #[serde(rename = "type", default)]
    pub task_type: String,
    /// The task's object id.
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub id: Option<String>,
    /// The user who started it (without the token part).
    #[serde(default)]
    pub user: String,
    /// The API token that started it, if any.
    #[serde(default)]
    pub tokenid: Option<String>,
    /// Start time, seconds since the Unix epoch.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub starttime: Option<u64>,
}

impl TaskStatus {
    /// Whether the task is still running.
    pub fn is_running(&self) -> bool {
        self.status == TaskState::Running
    }

    /// Whether the task ended successfully: `OK`, or `WARNINGS: <n>` (pve-common `UPID.pm`
    /// status_is_error).
    pub fn is_success(&self) -> bool {
        self.status == TaskState::Stopped
            && self
                .exitstatus
                .as_deref()
                .is_some_and(|s| s == "OK" || s.starts_with("WARNINGS: "))
    }
}

/// One line of `GET /nodes/{node}/tasks/{upid}/log`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TaskLogLine {
    /// 1-based line number.
    #[serde(deserialize_with = "lenient::u64_required")]
    pub n: u64,
    /// The text.
    #[serde(default)]
    pub t: String,
}

/// How long and how often `wait_for_task` polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitOptions {
    /// First delay between polls.
    pub poll_interval: Duration,
    /// Cap of the doubling delay.
    pub max_poll_interval: Duration,
    /// Give up waiting after this long (the task keeps running).
    pub timeout: Duration,
}

/// Default first poll delay.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Default cap of the poll delay.
pub const DEFAULT_MAX_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// Default overall wait: downloads of large images can take long.
pub const DEFAULT_TASK_TIMEOUT: Duration = Duration::from_secs(60 * 60);

impl Default for WaitOptions {
    fn default() -> Self {
        Self {
            poll_interval: DEFAULT_POLL_INTERVAL,
            max_poll_interval: DEFAULT_MAX_POLL_INTERVAL,
            timeout: DEFAULT_TASK_TIMEOUT,
        }
    }
}

/// Why waiting for a task did not end in success.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The task ended with an error; `exitstatus` is PVE's text.
    #[error("task {upid} failed: {exitstatus}")]
    Failed {
        /// The task.
        upid: Upid,
        /// PVE's exit status, e.g. `checksum mismatch: got 'x' != expect 'y'`.
        exitstatus: String,
    },
    /// The task was still running at the timeout; it keeps running in PVE.
    #[error("task {upid} still running after {}s; stopped waiting (the task continues)", waited.as_secs())]
    Timeout {
        /// The task.
        upid: Upid,
        /// How long we waited.
        waited: Duration,
    },
    /// Waiting was cancelled; the task keeps running in PVE.
    #[error("stopped waiting for task {upid}: cancelled (the task continues)")]
    Cancelled {
        /// The task.
        upid: Upid,
    },
    /// Reading the task's status failed with a non-transient error.
    #[error("reading the status of task {upid}")]
    Status {
        /// The task.
        upid: Upid,
        /// The client error.
        #[source]
        source: PveError,
    },
}

/// Polls `upid` on its node until it stops, the timeout passes, or `cancel` fires.
///
/// # Errors
/// [`TaskError::Failed`] with PVE's exit status when the task failed; `Timeout` and
/// `Cancelled` leave the task running; `Status` when its status cannot be read.
pub async fn wait_for_task(
    client: &PveClient,
    upid: &Upid,
    opts: &WaitOptions,
    cancel: &CancellationToken,
) -> Result<TaskStatus, TaskError> {
    poll_until_stopped(upid, opts, cancel, || client.task_status(upid.node(), upid)).await
}

/// The polling loop of [`wait_for_task`], over any status source (tests pass a script).
async fn poll_until_stopped<F, Fut>(
    upid: &Upid,
    opts: &WaitOptions,
    cancel: &CancellationToken,
    mut fetch: F,
) -> Result<TaskStatus, TaskError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<TaskStatus, PveError>>,
{
    let start = Instant::now();
    let deadline = start + opts.timeout;
    let timeout = || TaskError::Timeout {
        upid: upid.clone(),
        waited: Instant::now() - start,
    };
    let cancelled = || TaskError::Cancelled { upid: upid.clone() };
    let mut delay = opts.poll_interval;
    loop {
        let polled = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(cancelled()),
            polled = tokio::time::timeout_at(deadline, fetch()) => polled,
        };
        match polled {
            Err(_elapsed) => return Err(timeout()),
            Ok(Ok(status)) if !status.is_running() => {
                return if status.is_success() {
                    Ok(status)
                } else {
                    Err(TaskError::Failed {
                        upid: upid.clone(),
                        exitstatus: status
                            .exitstatus
                            .unwrap_or_else(|| "stopped without an exit status".to_owned()),
                    })
                };
            }
            Ok(Ok(_running)) => {}
            Ok(Err(e)) if e.is_transient() => {
                tracing::warn!(upid = %upid, error = %e, "task status not readable; polling on");
            }
            Ok(Err(source)) => {
                return Err(TaskError::Status {
                    upid: upid.clone(),
                    source,
                });
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(timeout());
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(cancelled()),
            () = tokio::time::sleep_until((now + delay).min(deadline)) => {}
        }
        delay = (delay * 2).min(opts.max_poll_interval);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::request::Method;

    fn upid() -> Upid {
        "UPID:pve1:0003A1F2:01B2C3D4:6650A1B2:download:d.iso:root@pam:"
            .parse()
            .unwrap()
    }

    fn status(json: &str) -> TaskStatus {
        serde_json::from_str(json).unwrap()
    }

    fn running() -> Result<TaskStatus, PveError> {
        Ok(status(r#"{"status":"running","type":"download"}"#))
    }

    fn stopped(exit: &str) -> Result<TaskStatus, PveError> {
        Ok(status(&format!(
            r#"{{"status":"stopped","exitstatus":"{exit}","type":"download"}}"#
        )))
    }

    fn server_error(status: u16, message: &str) -> Result<TaskStatus, PveError> {
        Err(PveError::Api {
            method: Method::Get,
            path: "/nodes/pve1/tasks/x/status".into(),
            status,
            message: message.into(),
            errors: Default::default(),
        })
    }

    /// A scripted status source that records when it was asked.
    struct Script {
        answers: Mutex<VecDeque<Result<TaskStatus, PveError>>>,
        polled_at: Mutex<Vec<Duration>>,
        start: Instant,
    }

    impl Script {
        fn new(answers: Vec<Result<TaskStatus, PveError>>) -> Arc<Self> {
            Arc::new(Self {
                answers: Mutex::new(answers.into()),
                polled_at: Mutex::new(Vec::new()),
                start: Instant::now(),
            })
        }

        fn fetch(self: &Arc<Self>) -> impl Future<Output = Result<TaskStatus, PveError>> + use<> {
            let this = Arc::clone(self);
            async move {
                this.polled_at.lock().unwrap().push(this.start.elapsed());
                this.answers
                    .lock()
                    .unwrap()
                    .pop_front()
                    .unwrap_or_else(running)
            }
        }

        fn polled_at_ms(&self) -> Vec<u128> {
            self.polled_at
                .lock()
                .unwrap()
                .iter()
                .map(Duration::as_millis)
                .collect()
        }
    }

    fn opts(timeout_secs: u64) -> WaitOptions {
        WaitOptions {
            poll_interval: Duration::from_millis(100),
            max_poll_interval: Duration::from_millis(400),
            timeout: Duration::from_secs(timeout_secs),
        }
    }

    #[test]
    fn task_success_is_ok_or_warnings() {
        assert!(stopped("OK").unwrap().is_success());
        assert!(stopped("WARNINGS: 2").unwrap().is_success());
        assert!(!stopped("WARNINGS").unwrap().is_success());
        assert!(
            !stopped("download failed: exit code 8")
                .unwrap()
                .is_success()
        );
        assert!(!running().unwrap().is_success());
    }

    #[test]
    fn task_status_decodes_recorded_answer() {
        let json = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/task-status-vzdump-ok.cpx-backup.json"
        ));
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        let s: TaskStatus = serde_json::from_value(v["data"].clone()).unwrap();
        assert!(s.is_success());
        assert_eq!(s.id.as_deref(), Some("100"));
        assert_eq!(s.upid.parse::<Upid>().unwrap().task_type(), "vzdump");
    }

    #[test]
    fn task_log_decodes_recorded_answer() {
        let json = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/task-log-vzdump.cpx-backup.json"
        ));
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        let lines: Vec<TaskLogLine> = serde_json::from_value(v["data"].clone()).unwrap();
        assert_eq!(lines.last().unwrap().t, "TASK OK");
        assert_eq!(lines.last().unwrap().n, 27);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_polls_with_capped_doubling_until_stopped() {
        let script = Script::new(vec![
            running(),
            running(),
            running(),
            running(),
            stopped("OK"),
        ]);
        let cancel = CancellationToken::new();
        let s = script.clone();
        let result = poll_until_stopped(&upid(), &opts(60), &cancel, || s.fetch()).await;
        assert!(result.unwrap().is_success());
        assert_eq!(script.polled_at_ms(), [0, 100, 300, 700, 1100]);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_reports_pve_exit_status_on_failure() {
        let script = Script::new(vec![
            running(),
            stopped("checksum mismatch: got 'a' != expect 'b'"),
        ]);
        let s = script.clone();
        let err = poll_until_stopped(&upid(), &opts(60), &CancellationToken::new(), || s.fetch())
            .await
            .unwrap_err();
        match &err {
            TaskError::Failed { exitstatus, .. } => {
                assert_eq!(exitstatus, "checksum mismatch: got 'a' != expect 'b'");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            err.to_string()
                .ends_with("failed: checksum mismatch: got 'a' != expect 'b'")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn wait_times_out_while_task_keeps_running() {
        let script = Script::new(vec![]);
        let s = script.clone();
        let err = poll_until_stopped(&upid(), &opts(2), &CancellationToken::new(), || s.fetch())
            .await
            .unwrap_err();
        assert!(
            matches!(err, TaskError::Timeout { waited, .. } if waited == Duration::from_secs(2))
        );
        // last poll happens at the deadline, not after it
        assert_eq!(script.polled_at_ms().last(), Some(&2000));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_stops_polling_when_cancelled() {
        let script = Script::new(vec![]);
        let cancel = CancellationToken::new();
        let trigger = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(250)).await;
            trigger.cancel();
        });
        let s = script.clone();
        let err = poll_until_stopped(&upid(), &opts(60), &cancel, || s.fetch())
            .await
            .unwrap_err();
        assert!(matches!(err, TaskError::Cancelled { .. }));
        assert_eq!(script.polled_at_ms(), [0, 100]);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_polls_on_through_transient_errors_but_not_permanent_ones() {
        let script = Script::new(vec![server_error(595, ""), running(), stopped("OK")]);
        let s = script.clone();
        assert!(
            poll_until_stopped(&upid(), &opts(60), &CancellationToken::new(), || s.fetch())
                .await
                .is_ok()
        );
        let script = Script::new(vec![server_error(400, "no such task")]);
        let s = script.clone();
        let err = poll_until_stopped(&upid(), &opts(60), &CancellationToken::new(), || s.fetch())
            .await
            .unwrap_err();
        assert!(matches!(err, TaskError::Status { ref source, .. } if source.is_not_found()));
    }
}
