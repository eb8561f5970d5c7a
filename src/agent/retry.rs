//! What the loop does after a pass: the one place that maps an outcome or error to the next
//! delay (STYLE H5). Transient failures back off exponentially with jitter and reset after a
//! success; an invalid revision stalls until a new commit or the next scheduled poll.

use std::time::Duration;

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

    /// Consecutive transient failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
