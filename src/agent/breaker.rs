//! The write circuit breaker (a guard rail the Go ProxOps has): after `threshold`
//! consecutive failed PVE writes the agent goes read-only for `cool_down`: it still observes,
//! plans and records drift, but issues no write. Then it is half-open: the next pass that
//! needs writes issues exactly one, as a probe. A successful probe closes the breaker; a
//! failed one opens it for another cool-down.
//!
//! The Go program counts inside its PVE client (20 failures, 10 minutes). Here a "write" is
//! one executed action (a create, a config update, a download...), counted as its result
//! arrives; the breaker is consulted when a pass starts writing, so the pass during which
//! the threshold is reached still finishes the actions it had (each failure already skips
//! its dependants). Pure: time is passed in.

use std::time::{Duration, Instant};

use proxops_store::BreakerMark;

use crate::config::{DEFAULT_WRITE_BREAKER_COOL_DOWN, DEFAULT_WRITE_BREAKER_THRESHOLD};

/// What a pass may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Everything the plan needs.
    All,
    /// One write, as a probe.
    Probe,
    /// Nothing: read-only until `until`.
    None {
        /// When a probe will be allowed.
        until: Instant,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen,
}

/// The breaker. `threshold = 0` turns it off.
#[derive(Debug, Clone)]
pub struct Breaker {
    threshold: u32,
    cool_down: Duration,
    state: State,
}

impl Default for Breaker {
    fn default() -> Self {
        Self::new(
            DEFAULT_WRITE_BREAKER_THRESHOLD,
            DEFAULT_WRITE_BREAKER_COOL_DOWN,
        )
    }
}

impl Breaker {
    /// A closed breaker.
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            threshold,
            cool_down,
            state: State::Closed { failures: 0 },
        }
    }

    /// Takes new settings (config reload) and keeps the state; a run of failures already at
    /// a lowered threshold opens the breaker on its next failure, not retroactively.
    pub fn reconfigure(&mut self, threshold: u32, cool_down: Duration) {
        self.threshold = threshold;
        self.cool_down = cool_down;
        if threshold == 0 {
            self.state = State::Closed { failures: 0 };
        }
    }

    /// What the pass starting at `now` may write. An open breaker whose cool-down is over
    /// becomes half-open here.
    pub fn permit(&mut self, now: Instant) -> Permit {
        match self.state {
            State::Closed { .. } => Permit::All,
            State::Open { until } if now < until => Permit::None { until },
            State::Open { .. } | State::HalfOpen => {
                self.state = State::HalfOpen;
                Permit::Probe
            }
        }
    }

    /// Records the result of one write at `now`.
    pub fn record(&mut self, succeeded: bool, now: Instant) {
        self.state = match (self.state, succeeded) {
            (_, _) if self.threshold == 0 => State::Closed { failures: 0 },
            (State::Closed { .. } | State::HalfOpen, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) => {
                let failures = failures.saturating_add(1);
                if failures >= self.threshold {
                    State::Open {
                        until: now + self.cool_down,
                    }
                } else {
                    State::Closed { failures }
                }
            }
            (State::HalfOpen, false) => State::Open {
                until: now + self.cool_down,
            },
            // A write finishing after the breaker opened (it was already in flight) changes
            // nothing: the cool-down runs from the failure that opened it.
            (open @ State::Open { .. }, _) => open,
        };
    }

    /// The state as recorded and reported.
    pub fn mark(&self) -> BreakerMark {
        match self.state {
            State::Closed { .. } => BreakerMark::Closed,
            State::Open { .. } => BreakerMark::Open,
            State::HalfOpen => BreakerMark::HalfOpen,
        }
    }

    /// Consecutive failed writes counted while closed.
    pub fn consecutive_failures(&self) -> u32 {
        match self.state {
            State::Closed { failures } => failures,
            State::Open { .. } | State::HalfOpen => self.threshold,
        }
    }

    /// When an open breaker allows a probe.
    pub fn open_until(&self) -> Option<Instant> {
        match self.state {
            State::Open { until } => Some(until),
            State::Closed { .. } | State::HalfOpen => None,
        }
    }

    /// Whether writes are restricted (open or half-open): the Go program's `read_only`.
    pub fn is_read_only(&self) -> bool {
        !matches!(self.state, State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOL: Duration = Duration::from_secs(60);

    fn failing(breaker: &mut Breaker, times: u32, now: Instant) {
        for _ in 0..times {
            breaker.record(false, now);
        }
    }

    #[test]
    fn the_defaults_are_the_go_programs_twenty_failures_and_ten_minutes() {
        let mut breaker = Breaker::default();
        let now = Instant::now();
        failing(&mut breaker, 19, now);
        assert_eq!(breaker.permit(now), Permit::All);
        failing(&mut breaker, 1, now);
        assert_eq!(
            breaker.permit(now),
            Permit::None {
                until: now + Duration::from_secs(600)
            }
        );
    }

    #[test]
    fn it_opens_after_the_threshold_of_consecutive_failures() {
        let mut breaker = Breaker::new(3, COOL);
        let now = Instant::now();
        failing(&mut breaker, 2, now);
        assert_eq!(breaker.mark(), BreakerMark::Closed);
        assert_eq!(breaker.consecutive_failures(), 2);
        assert!(!breaker.is_read_only());
        failing(&mut breaker, 1, now);
        assert_eq!(breaker.mark(), BreakerMark::Open);
        assert!(breaker.is_read_only());
        assert_eq!(breaker.open_until(), Some(now + COOL));
        assert_eq!(
            breaker.permit(now + COOL / 2),
            Permit::None { until: now + COOL }
        );
    }

    #[test]
    fn a_success_resets_the_count_of_consecutive_failures() {
        let mut breaker = Breaker::new(3, COOL);
        let now = Instant::now();
        failing(&mut breaker, 2, now);
        breaker.record(true, now);
        failing(&mut breaker, 2, now);
        assert_eq!(breaker.mark(), BreakerMark::Closed);
        assert_eq!(breaker.consecutive_failures(), 2);
    }

    #[test]
    fn after_the_cool_down_one_probe_is_allowed_and_its_success_closes_the_breaker() {
        let mut breaker = Breaker::new(1, COOL);
        let now = Instant::now();
        breaker.record(false, now);
        assert_eq!(breaker.permit(now + COOL), Permit::Probe);
        assert_eq!(breaker.mark(), BreakerMark::HalfOpen);
        assert!(breaker.is_read_only());
        // A pass with nothing to write leaves it half-open for the next one.
        assert_eq!(breaker.permit(now + COOL * 2), Permit::Probe);
        breaker.record(true, now + COOL * 2);
        assert_eq!(breaker.mark(), BreakerMark::Closed);
        assert_eq!(breaker.permit(now + COOL * 2), Permit::All);
    }

    #[test]
    fn a_failed_probe_opens_the_breaker_for_another_cool_down() {
        let mut breaker = Breaker::new(5, COOL);
        let start = Instant::now();
        failing(&mut breaker, 5, start);
        let later = start + COOL;
        assert_eq!(breaker.permit(later), Permit::Probe);
        breaker.record(false, later);
        assert_eq!(breaker.mark(), BreakerMark::Open);
        assert_eq!(
            breaker.permit(later),
            Permit::None {
                until: later + COOL
            }
        );
    }

    #[test]
    fn results_arriving_while_open_do_not_move_the_cool_down() {
        let mut breaker = Breaker::new(1, COOL);
        let now = Instant::now();
        breaker.record(false, now);
        breaker.record(false, now + COOL / 2);
        breaker.record(true, now + COOL / 2);
        assert_eq!(breaker.open_until(), Some(now + COOL));
    }

    #[test]
    fn a_threshold_of_zero_turns_the_breaker_off() {
        let mut breaker = Breaker::new(0, COOL);
        let now = Instant::now();
        failing(&mut breaker, 100, now);
        assert_eq!(breaker.permit(now), Permit::All);
        assert!(!breaker.is_read_only());
    }

    #[test]
    fn a_reload_keeps_an_open_breaker_open_with_the_new_settings_for_the_next_time() {
        let mut breaker = Breaker::new(1, COOL);
        let now = Instant::now();
        breaker.record(false, now);
        breaker.reconfigure(2, COOL * 2);
        assert_eq!(breaker.mark(), BreakerMark::Open);
        assert_eq!(breaker.permit(now + COOL), Permit::Probe);
        breaker.record(false, now + COOL);
        assert_eq!(breaker.open_until(), Some(now + COOL * 3));
    }
}
