//! When the agent looks again: `[source] poll` as an interval or a 5-field cron expression,
//! plus jitter so that agents on every node of a cluster do not fetch and read PVE in step.
//!
//! Pure apart from the random jitter, which the caller passes in as a fraction in `[0, 1)`.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::Poll;

/// At most this much jitter is added to any poll.
pub const MAX_JITTER: Duration = Duration::from_secs(30);

/// The poll schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Every(Duration),
    Cron(Box<croner::Cron>),
}

/// A cron expression that does not parse (the config layer checks it first, so this is a
/// bug or a race with a config reload).
#[derive(Debug, thiserror::Error)]
#[error("invalid cron expression `{0}`")]
pub struct ScheduleError(String);

impl Schedule {
    /// The schedule for a `poll` setting.
    ///
    /// # Errors
    /// A cron expression that does not parse.
    pub fn new(poll: &Poll) -> Result<Self, ScheduleError> {
        let kind = match poll {
            Poll::Every(every) => Kind::Every(*every),
            Poll::Cron(text) => Kind::Cron(Box::new(
                text.parse::<croner::Cron>()
                    .map_err(|_| ScheduleError(text.clone()))?,
            )),
        };
        Ok(Self { kind })
    }

    /// How long to wait from `now` until the next poll. `jitter` in `[0, 1)` adds up to a
    /// tenth of the interval (at most [`MAX_JITTER`]).
    pub fn next_delay(&self, now: DateTime<Utc>, jitter: f64) -> Duration {
        let jitter = jitter.clamp(0.0, 1.0);
        let base = match &self.kind {
            Kind::Every(every) => *every,
            Kind::Cron(cron) => cron
                .find_next_occurrence(&now, false)
                .ok()
                .and_then(|next| (next - now).to_std().ok())
                // An expression with no future match (e.g. Feb 30): fall back to hourly.
                .unwrap_or(Duration::from_secs(3600)),
        };
        let spread = (base / 10).min(MAX_JITTER);
        base + spread.mul_f64(jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn an_interval_waits_that_long_plus_at_most_a_tenth_as_jitter() {
        let schedule = Schedule::new(&Poll::Every(Duration::from_secs(60))).unwrap();
        let now = at("2026-11-29T10:00:00Z");
        assert_eq!(schedule.next_delay(now, 0.0), Duration::from_secs(60));
        assert_eq!(schedule.next_delay(now, 0.5), Duration::from_secs(63));
        assert!(schedule.next_delay(now, 0.999_999) < Duration::from_secs(66));
    }

    #[test]
    fn jitter_is_capped_for_long_intervals() {
        let schedule = Schedule::new(&Poll::Every(Duration::from_secs(3600))).unwrap();
        let delay = schedule.next_delay(at("2026-11-29T10:00:00Z"), 0.999_999);
        assert!(delay < Duration::from_secs(3600) + MAX_JITTER);
    }

    #[test]
    fn a_cron_expression_waits_until_its_next_match() {
        let schedule = Schedule::new(&Poll::Cron("*/5 * * * *".into())).unwrap();
        let delay = schedule.next_delay(at("2026-11-29T10:02:30Z"), 0.0);
        assert_eq!(delay, Duration::from_secs(150));
    }

    #[test]
    fn a_cron_match_exactly_now_waits_for_the_following_one() {
        let schedule = Schedule::new(&Poll::Cron("0 * * * *".into())).unwrap();
        assert_eq!(
            schedule.next_delay(at("2026-11-29T10:00:00Z"), 0.0),
            Duration::from_secs(3600)
        );
    }
}
