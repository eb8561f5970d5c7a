//! PVE tasks: the status and log types, and `wait_for_task`, which polls a UPID to its end.
//!
//! When to poll is the pure [`next_poll`]: the first poll goes out at once (or, once this
//! client has seen tasks of the same type end, just before that type's usual duration), then
//! the gaps grow with the time waited, from `WaitOptions::poll_interval` up to
//! `max_poll_interval`, so a task's end is seen within a quarter of its run time (and never
//! later than the cap), and a long task costs about one GET per cap. Each client remembers the
//! duration of every task type it waited for ([`TaskDurations`], in memory only): a second
//! `qmcreate` that takes a second is polled just before and just after one second, not a dozen
//! times. At most one status GET per task is in flight, and none is sent after one has
//! reported the task stopped. Polling stops at `timeout`. All waiting uses `tokio::time`, so
//! tests pause and advance the clock. A cancelled or timed-out wait only stops *polling*: the
//! task keeps running in PVE, and the caller records that fact. Transient errors while polling
//! (network, 5xx, already retried by the client) are logged and polling goes on until the
//! timeout; the task is not affected by our connection trouble.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
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

/// How long and how often `wait_for_task` polls (the schedule is [`next_poll`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitOptions {
    /// Shortest gap between two polls of one task.
    pub poll_interval: Duration,
    /// Longest gap between two polls of one task: a task's end is seen at most this late.
    pub max_poll_interval: Duration,
    /// Give up waiting after this long (the task keeps running).
    pub timeout: Duration,
}

/// Default shortest gap between polls (the first 250 ms of a task with no learnt duration, and
/// the polls around a learnt one).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Default longest gap between polls: a task's end is seen at most a second late, and a long
/// task (a download of minutes) costs one status GET per second.
pub const DEFAULT_MAX_POLL_INTERVAL: Duration = Duration::from_secs(1);
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

/// When to send the next status poll of a task, as time since the wait began.
///
/// `last` is when the previous poll went out (`None` before the first); `expected` is how
/// long tasks of this type usually take ([`TaskDurations`]). Without an expectation the first
/// poll goes out at once and each gap is a quarter of the time waited so far, clamped to
/// `[poll_interval, max_poll_interval]`: the end is seen within 25 % of the task's run time
/// (and at most `max_poll_interval` late), and a task of length `T` costs about
/// `4 ln(T / poll_interval)` polls before the cap and one per cap after it. With an
/// expectation `E` the polls aim at `E - grain`, with `grain = E / 32` clamped the same way,
/// no gap longer than the cap; from there the gaps are `grain` until a quarter of the time
/// past the aim is longer. A task that takes its usual time is then seen within `grain` of
/// its end with two or three polls.
pub fn next_poll(
    last: Option<Duration>,
    expected: Option<Duration>,
    opts: &WaitOptions,
) -> Duration {
    let fine = opts.poll_interval;
    let cap = opts.max_poll_interval.max(fine);
    let clamp = |d: Duration| d.clamp(fine, cap);
    match (last, expected) {
        (None, None) => Duration::ZERO,
        (None, Some(e)) => aim(e, fine, cap).min(cap),
        (Some(t), None) => t + clamp(t / 4),
        (Some(t), Some(e)) => {
            let aim = aim(e, fine, cap);
            if t + fine <= aim {
                aim.min(t + cap)
            } else {
                let grain = clamp(e / 32);
                t + clamp(grain.max(t.saturating_sub(aim) / 4))
            }
        }
    }
}

/// Just before the expected end: `E - clamp(E / 32)`.
fn aim(expected: Duration, fine: Duration, cap: Duration) -> Duration {
    expected.saturating_sub((expected / 32).clamp(fine, cap))
}

/// How long each task type took, as seen by one client's waits: the poll schedule's
/// expectation ([`next_poll`]). Kept in memory only, per client (a restarted agent learns
/// again within one task of each type). An estimate is the middle of the last gap, between
/// the last poll that saw the task running and the first that saw it stopped; the expectation
/// moves halfway to each new estimate, so one unusually slow task does not stretch the next
/// waits by much. Only tasks that ended successfully count: a failing task often ends early.
#[derive(Debug, Default)]
pub struct TaskDurations {
    by_type: Mutex<HashMap<String, Duration>>,
}

impl TaskDurations {
    /// The expected duration of tasks of `task_type`, once one has been seen to end.
    pub fn expected(&self, task_type: &str) -> Option<Duration> {
        self.lock().get(task_type).copied()
    }

    /// Adds one observed duration of `task_type`.
    pub fn record(&self, task_type: &str, took: Duration) {
        let mut by_type = self.lock();
        match by_type.get_mut(task_type) {
            Some(expected) => *expected = (*expected + took) / 2,
            None => {
                by_type.insert(task_type.to_owned(), took);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Duration>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.by_type
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Polls `upid` on its node until it stops, the timeout passes, or `cancel` fires.
///
/// The schedule is [`next_poll`], with the expectation the client's [`TaskDurations`] hold for
/// the UPID's task type; a successful end updates it.
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
    let durations = client.task_durations();
    let expected = durations.expected(upid.task_type());
    let (result, took) = poll_until_stopped(upid, opts, expected, cancel, || {
        client.task_status(upid.node(), upid)
    })
    .await;
    if let (Ok(_), Some(took)) = (&result, took) {
        durations.record(upid.task_type(), took);
    }
    result
}

/// The polling loop of [`wait_for_task`], over any status source (tests pass a script).
/// Returns the result and, when the task was seen stopped, the estimate of how long it ran
/// (the middle of the gap in which it ended).
async fn poll_until_stopped<F, Fut>(
    upid: &Upid,
    opts: &WaitOptions,
    expected: Option<Duration>,
    cancel: &CancellationToken,
    mut fetch: F,
) -> (Result<TaskStatus, TaskError>, Option<Duration>)
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
    // When the last poll that saw the task running went out.
    let mut seen_running = Duration::ZERO;
    let mut last = None;
    loop {
        let at = (start + next_poll(last, expected, opts)).min(deadline);
        tokio::select! {
            biased;
            () = cancel.cancelled() => return (Err(cancelled()), None),
            () = tokio::time::sleep_until(at) => {}
        }
        let sent = Instant::now() - start;
        last = Some(sent);
        let polled = tokio::select! {
            biased;
            () = cancel.cancelled() => return (Err(cancelled()), None),
            polled = tokio::time::timeout_at(deadline, fetch()) => polled,
        };
        match polled {
            Err(_elapsed) => return (Err(timeout()), None),
            Ok(Ok(status)) if !status.is_running() => {
                let took = seen_running + (sent - seen_running) / 2;
                let result = if status.is_success() {
                    Ok(status)
                } else {
                    Err(TaskError::Failed {
                        upid: upid.clone(),
                        exitstatus: status
                            .exitstatus
                            .unwrap_or_else(|| "stopped without an exit status".to_owned()),
                    })
                };
                return (result, Some(took));
            }
            Ok(Ok(_running)) => seen_running = sent,
            Ok(Err(e)) if e.is_transient() => {
                tracing::warn!(upid = %upid, error = %e, "task status not readable; polling on");
            }
            Ok(Err(source)) => {
                return (
                    Err(TaskError::Status {
                        upid: upid.clone(),
                        source,
                    }),
                    None,
                );
            }
        }
        if Instant::now() >= deadline {
            return (Err(timeout()), None);
        }
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

    /// The schedule from the first poll on, in milliseconds since the wait began.
    fn schedule_ms(expected: Option<Duration>, opts: &WaitOptions, polls: usize) -> Vec<u128> {
        let mut last = None;
        (0..polls)
            .map(|_| {
                let at = next_poll(last, expected, opts);
                last = Some(at);
                at.as_millis()
            })
            .collect()
    }

    #[test]
    fn without_an_expectation_the_first_poll_is_immediate_and_gaps_grow_to_the_cap() {
        let defaults = WaitOptions::default();
        assert_eq!(
            schedule_ms(None, &defaults, 14),
            [
                0, 50, 100, 150, 200, 250, 312, 390, 488, 610, 762, 953, 1192, 1490
            ]
        );
        // far into a long task the gap is the cap: one GET per second
        let late = Duration::from_secs(600);
        assert_eq!(
            next_poll(Some(late), None, &defaults) - late,
            Duration::from_secs(1)
        );
        // the end is seen within a quarter of the time waited, whenever it falls
        let mut last = Duration::ZERO;
        for _ in 0..40 {
            let next = next_poll(Some(last), None, &defaults);
            assert!(
                next - last <= (last / 4).max(defaults.poll_interval),
                "{last:?}"
            );
            last = next;
        }
    }

    #[test]
    fn with_an_expectation_the_polls_land_just_before_and_after_the_usual_end() {
        let defaults = WaitOptions::default();
        let second = Some(Duration::from_secs(1));
        assert_eq!(schedule_ms(second, &defaults, 4), [950, 1000, 1050, 1100]);
        // a 5 s task type: one poll per second until just before its end, then 156 ms gaps
        let five = Some(Duration::from_secs(5));
        assert_eq!(
            schedule_ms(five, &defaults, 8),
            [1000, 2000, 3000, 4000, 4843, 5000, 5156, 5312]
        );
        // a task much slower than usual falls back to gaps growing to the cap
        let late = Duration::from_secs(60);
        assert_eq!(
            next_poll(Some(late), second, &defaults) - late,
            Duration::from_secs(1)
        );
        // an expectation shorter than the shortest gap polls at once
        assert_eq!(
            next_poll(None, Some(Duration::ZERO), &defaults),
            Duration::ZERO
        );
    }

    #[test]
    fn task_durations_move_halfway_to_each_new_observation_per_type() {
        let durations = TaskDurations::default();
        assert_eq!(durations.expected("qmcreate"), None);
        durations.record("qmcreate", Duration::from_millis(1000));
        durations.record("qmcreate", Duration::from_millis(2000));
        durations.record("download", Duration::from_secs(30));
        assert_eq!(
            durations.expected("qmcreate"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            durations.expected("download"),
            Some(Duration::from_secs(30))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn wait_polls_on_the_schedule_until_stopped_and_estimates_the_run_time() {
        let script = Script::new(vec![
            running(),
            running(),
            running(),
            running(),
            stopped("OK"),
        ]);
        let cancel = CancellationToken::new();
        let s = script.clone();
        let (result, took) =
            poll_until_stopped(&upid(), &opts(60), None, &cancel, || s.fetch()).await;
        assert!(result.unwrap().is_success());
        assert_eq!(script.polled_at_ms(), [0, 100, 200, 300, 400]);
        // it ended between the poll at 300 ms (running) and the one at 400 ms (stopped)
        assert_eq!(took, Some(Duration::from_millis(350)));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_with_an_expectation_sends_its_first_poll_near_the_expected_end() {
        let script = Script::new(vec![running(), stopped("OK")]);
        let s = script.clone();
        let expected = Some(Duration::from_secs(2));
        let (result, took) = poll_until_stopped(
            &upid(),
            &opts(60),
            expected,
            &CancellationToken::new(),
            || s.fetch(),
        )
        .await;
        assert!(result.is_ok());
        // the cap (400 ms) bounds the gaps before the aim at 2000 - 100 ms
        assert_eq!(script.polled_at_ms(), [400, 800]);
        assert_eq!(took, Some(Duration::from_millis(600)));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_reports_pve_exit_status_on_failure() {
        let script = Script::new(vec![
            running(),
            stopped("checksum mismatch: got 'a' != expect 'b'"),
        ]);
        let s = script.clone();
        let err = poll_until_stopped(&upid(), &opts(60), None, &CancellationToken::new(), || {
            s.fetch()
        })
        .await
        .0
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
        let err = poll_until_stopped(&upid(), &opts(2), None, &CancellationToken::new(), || {
            s.fetch()
        })
        .await
        .0
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
        let err = poll_until_stopped(&upid(), &opts(60), None, &cancel, || s.fetch())
            .await
            .0
            .unwrap_err();
        assert!(matches!(err, TaskError::Cancelled { .. }));
        assert_eq!(script.polled_at_ms(), [0, 100, 200]);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_polls_on_through_transient_errors_but_not_permanent_ones() {
        let script = Script::new(vec![server_error(595, ""), running(), stopped("OK")]);
        let s = script.clone();
        assert!(
            poll_until_stopped(&upid(), &opts(60), None, &CancellationToken::new(), || s
                .fetch())
            .await
            .0
            .is_ok()
        );
        let script = Script::new(vec![server_error(400, "no such task")]);
        let s = script.clone();
        let err = poll_until_stopped(&upid(), &opts(60), None, &CancellationToken::new(), || {
            s.fetch()
        })
        .await
        .0
        .unwrap_err();
        assert!(matches!(err, TaskError::Status { ref source, .. } if source.is_not_found()));
    }
}
