//! What the loop does after a pass: the one place that maps how a pass ended to the next
//! delay (STYLE H5). [`Verdict::of`] reads a [`PassEnd`], built from classes set where each
//! failure happened (`FailureClass`, `SourceError::is_transient`), never from error text.
//! Transient failures back off exponentially with jitter and reset after a success; an
//! invalid revision or a refusal stalls until a new commit or the next scheduled poll.

use std::time::Duration;

use crate::execute::FailureClass;

/// First delay after a transient failure.
pub const MIN_BACKOFF: Duration = Duration::from_secs(5);
/// Cap of the backoff.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How a pass ended, as far as scheduling is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Applied, or nothing to do: next poll as scheduled.
    Ok,
    /// Network, PVE 5xx, git fetch failure, lock contention: retry sooner, backing off.
    Transient,
    /// Invalid manifests, auth refused, an action failed for a config reason: no hot loop;
    /// wait for a new commit (webhook) or the next scheduled poll.
    Stalled,
    /// A probe write closed the write circuit breaker: the writes it held back are due, so
    /// the next pass starts at once.
    Again,
}

/// How a pass ended, as far as scheduling is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassEnd {
    /// No revision to work on: git failed and none was fetched before; `transient` is the
    /// source error's own class (network trouble, or settings and credentials).
    NoRevision {
        /// Whether retrying soon may help.
        transient: bool,
    },
    /// The state database could not record the pass.
    StoreFailed,
    /// The revision is not applied: a validation error, a reference that does not resolve,
    /// no cluster chosen.
    Invalid,
    /// The guest listing failed, so nothing was written.
    ObserveAborted,
    /// Shutdown cut the pass short.
    Interrupted,
    /// The pass planned and ran what it could.
    Ran {
        /// The class of each failed action.
        failures: Vec<FailureClass>,
        /// Some resource could not be observed, so none of its actions was planned.
        observe_failed: bool,
        /// A half-open breaker's probe write succeeded while other writes were held back.
        probe_closed: bool,
    },
}

impl Verdict {
    /// The one table from a pass's end to what the loop does next.
    pub fn of(end: &PassEnd) -> Self {
        match end {
            PassEnd::NoRevision { transient: true }
            | PassEnd::StoreFailed
            | PassEnd::ObserveAborted => Self::Transient,
            PassEnd::NoRevision { transient: false } | PassEnd::Invalid => Self::Stalled,
            PassEnd::Interrupted => Self::Ok,
            PassEnd::Ran {
                probe_closed: true, ..
            } => Self::Again,
            PassEnd::Ran { failures, .. } if failures.iter().any(|c| !c.may_heal()) => {
                Self::Stalled
            }
            PassEnd::Ran {
                failures,
                observe_failed,
                ..
            } if !failures.is_empty() || *observe_failed => Self::Transient,
            PassEnd::Ran { .. } => Self::Ok,
        }
    }
}

/// Exponential backoff with jitter, reset by a success.
#[derive(Debug, Clone, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// Records a verdict; returns the delay to use instead of the scheduled one, if any.
    /// `jitter` in `[0, 1)` spreads the delay by up to a quarter.
    pub fn after(&mut self, verdict: Verdict, jitter: f64) -> Option<Duration> {
        match verdict {
            Verdict::Ok | Verdict::Stalled => {
                self.failures = 0;
                None
            }
            Verdict::Again => {
                self.failures = 0;
                Some(Duration::ZERO)
            }
            Verdict::Transient => {
                let exponent = self.failures.min(16);
                self.failures = self.failures.saturating_add(1);
                let base = MIN_BACKOFF.saturating_mul(1 << exponent).min(MAX_BACKOFF);
                Some(base + (base / 4).mul_f64(jitter.clamp(0.0, 1.0)))
            }
        }
    }

    /// Records a verdict; returns the delay until the next pass, given the `scheduled` one:
    /// a transient failure retries sooner, never later than the schedule would.
    pub fn next_delay(&mut self, verdict: Verdict, jitter: f64, scheduled: Duration) -> Duration {
        self.after(verdict, jitter)
            .map_or(scheduled, |delay| delay.min(scheduled))
    }

    /// Consecutive transient failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(failures: &[FailureClass]) -> PassEnd {
        PassEnd::Ran {
            failures: failures.to_vec(),
            observe_failed: false,
            probe_closed: false,
        }
    }

    #[test]
    fn each_way_a_pass_ends_has_one_verdict() {
        use FailureClass::{Lock, Refused, TaskFailed, Transient as Net, Unknown};
        let table: &[(&str, PassEnd, Verdict)] = &[
            ("applied, or nothing to do", ran(&[]), Verdict::Ok),
            ("a 503 on a write", ran(&[Net]), Verdict::Transient),
            ("a lock that stayed busy", ran(&[Lock]), Verdict::Transient),
            (
                "a write whose answer was lost and whose outcome is unknown",
                ran(&[Unknown]),
                Verdict::Transient,
            ),
            ("a 403 on a write", ran(&[Refused]), Verdict::Stalled),
            ("a task that failed", ran(&[TaskFailed]), Verdict::Stalled),
            (
                "a refusal beside a transient failure",
                ran(&[Net, Refused]),
                Verdict::Stalled,
            ),
            (
                "a resource that could not be observed",
                PassEnd::Ran {
                    failures: Vec::new(),
                    observe_failed: true,
                    probe_closed: false,
                },
                Verdict::Transient,
            ),
            (
                "a probe write that closed the breaker",
                PassEnd::Ran {
                    failures: Vec::new(),
                    observe_failed: false,
                    probe_closed: true,
                },
                Verdict::Again,
            ),
            ("an invalid revision", PassEnd::Invalid, Verdict::Stalled),
            (
                "git unreachable, no revision yet",
                PassEnd::NoRevision { transient: true },
                Verdict::Transient,
            ),
            (
                "git refused the credentials, no revision yet",
                PassEnd::NoRevision { transient: false },
                Verdict::Stalled,
            ),
            (
                "the guest listing failed",
                PassEnd::ObserveAborted,
                Verdict::Transient,
            ),
            (
                "the state database failed",
                PassEnd::StoreFailed,
                Verdict::Transient,
            ),
            ("shutdown", PassEnd::Interrupted, Verdict::Ok),
        ];
        for (case, end, verdict) in table {
            assert_eq!(Verdict::of(end), *verdict, "{case}");
        }
    }

    #[test]
    fn transient_failures_back_off_exponentially_up_to_the_cap() {
        let mut backoff = Backoff::default();
        let delays: Vec<_> = (0..9)
            .map(|_| backoff.after(Verdict::Transient, 0.0).unwrap())
            .collect();
        assert_eq!(delays[0], MIN_BACKOFF);
        assert_eq!(delays[1], MIN_BACKOFF * 2);
        assert_eq!(delays[2], MIN_BACKOFF * 4);
        assert_eq!(*delays.last().unwrap(), MAX_BACKOFF);
    }

    #[test]
    fn a_transient_failure_never_waits_longer_than_the_next_scheduled_pass() {
        let mut backoff = Backoff::default();
        let every_second = Duration::from_secs(1);
        assert_eq!(
            backoff.next_delay(Verdict::Transient, 0.0, every_second),
            every_second
        );
        let hourly = Duration::from_secs(3600);
        assert_eq!(
            backoff.next_delay(Verdict::Transient, 0.0, hourly),
            MIN_BACKOFF * 2
        );
        assert_eq!(backoff.next_delay(Verdict::Ok, 0.0, hourly), hourly);
    }

    #[test]
    fn a_success_resets_the_backoff() {
        let mut backoff = Backoff::default();
        backoff.after(Verdict::Transient, 0.0);
        backoff.after(Verdict::Transient, 0.0);
        assert_eq!(backoff.after(Verdict::Ok, 0.0), None);
        assert_eq!(backoff.after(Verdict::Transient, 0.0), Some(MIN_BACKOFF));
    }

    #[test]
    fn a_stalled_pass_waits_for_the_schedule_instead_of_retrying() {
        let mut backoff = Backoff::default();
        assert_eq!(backoff.after(Verdict::Stalled, 0.5), None);
    }

    #[test]
    fn a_closed_breaker_runs_the_held_back_writes_at_once() {
        let mut backoff = Backoff::default();
        backoff.after(Verdict::Transient, 0.0);
        assert_eq!(backoff.after(Verdict::Again, 0.9), Some(Duration::ZERO));
        assert_eq!(backoff.failures(), 0);
    }

    #[test]
    fn jitter_adds_at_most_a_quarter() {
        let mut backoff = Backoff::default();
        let delay = backoff.after(Verdict::Transient, 0.999).unwrap();
        assert!(delay >= MIN_BACKOFF && delay < MIN_BACKOFF + MIN_BACKOFF / 4);
    }
}
