//! Why an action failed, classified where the failure is known (the client's `PveError`,
//! a task's end), so the loop decides what to do next from the class and never from the
//! error's text.

use proxops_pve::{PveError, TaskError};
use serde::Serialize;

/// The class of a failed action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureClass {
    /// PVE or the network may heal: a transport error, a 5xx from PVE or its proxy, a task
    /// still running when the wait gave up.
    Transient,
    /// PVE said no (a 4xx: permission, validation, a missing object) or the request could
    /// not be built; sending it again changes nothing until the manifests or the config do.
    Refused,
    /// PVE accepted the request and its task ended with an error.
    TaskFailed,
    /// A guest or storage lock stayed busy for longer than the executor retries.
    Lock,
    /// PVE's answer to a write was lost (a 596 from pveproxy, a timeout) and what PVE did
    /// could not be established from its task list, config or volume listing: it may have
    /// acted, may still be acting, or may not have acted. Never resent; the next pass
    /// observes what PVE did and plans from that.
    Unknown,
}

impl FailureClass {
    /// The class of a refused or failed request.
    pub fn of_pve(error: &PveError) -> Self {
        // A lock timeout is also `is_transient` (a 500): the more precise class wins.
        if error.is_lock_timeout() {
            Self::Lock
        } else if error.is_transient() {
            Self::Transient
        } else {
            Self::Refused
        }
    }

    /// The class of a task that did not end in success (`Cancelled` is an interruption,
    /// not a failure; callers handle it before asking).
    pub fn of_task(error: &TaskError) -> Self {
        match error {
            TaskError::Failed { .. } => Self::TaskFailed,
            TaskError::Timeout { .. } | TaskError::Cancelled { .. } => Self::Transient,
            TaskError::Status { source, .. } => Self::of_pve(source),
        }
    }

    /// Whether a later attempt of the same action may succeed without any change by the
    /// operator.
    pub fn may_heal(self) -> bool {
        matches!(self, Self::Transient | Self::Lock | Self::Unknown)
    }

    /// `transient`, `refused`, `task-failed`, `lock` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Refused => "refused",
            Self::TaskFailed => "task-failed",
            Self::Lock => "lock",
            Self::Unknown => "unknown",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use proxops_pve::Upid;

    use super::*;

    fn api(status: u16, message: &str) -> PveError {
        PveError::Api {
            method: proxops_pve::Method::Post,
            path: "/nodes/pve1/qemu".into(),
            status,
            message: message.into(),
            errors: BTreeMap::new(),
        }
    }

    fn upid() -> Upid {
        "UPID:pve1:0003A1F2:01B2C3D4:6650A1B2:qmcreate:100:root@pam:"
            .parse()
            .expect("a valid UPID")
    }

    #[test]
    fn a_503_from_pve_is_transient() {
        assert_eq!(
            FailureClass::of_pve(&api(503, "service unavailable")),
            FailureClass::Transient
        );
    }

    #[test]
    fn a_403_or_a_400_is_refused() {
        assert_eq!(
            FailureClass::of_pve(&api(403, "Permission check failed")),
            FailureClass::Refused
        );
        assert_eq!(
            FailureClass::of_pve(&api(400, "Parameter verification failed.")),
            FailureClass::Refused
        );
    }

    #[test]
    fn a_busy_config_lock_is_a_lock_failure_not_merely_transient() {
        let error = api(
            500,
            "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout",
        );
        assert_eq!(FailureClass::of_pve(&error), FailureClass::Lock);
    }

    #[test]
    fn a_task_that_ended_with_an_error_is_task_failed_and_a_wait_that_gave_up_is_transient() {
        let failed = TaskError::Failed {
            upid: upid(),
            exitstatus: "storage 'local-lvm' does not exist".into(),
        };
        assert_eq!(FailureClass::of_task(&failed), FailureClass::TaskFailed);
        let timeout = TaskError::Timeout {
            upid: upid(),
            waited: Duration::from_secs(600),
        };
        assert_eq!(FailureClass::of_task(&timeout), FailureClass::Transient);
        let status = TaskError::Status {
            upid: upid(),
            source: api(403, "Permission check failed"),
        };
        assert_eq!(FailureClass::of_task(&status), FailureClass::Refused);
    }

    #[test]
    fn only_transient_lock_and_unknown_outcome_failures_may_heal_by_themselves() {
        assert!(FailureClass::Transient.may_heal() && FailureClass::Lock.may_heal());
        assert!(
            FailureClass::Unknown.may_heal(),
            "the next pass observes what PVE did"
        );
        assert!(!FailureClass::Refused.may_heal() && !FailureClass::TaskFailed.may_heal());
    }
}
