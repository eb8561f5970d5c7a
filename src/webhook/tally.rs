//! Aggregated warnings for events an outsider can cause at will (SECURITY-AUDIT.md L2): a
//! flood of unsigned webhook deliveries wrote one WARN line each, 5,000 in 0.07 s, enough to
//! push the agent's own messages past journald's per-unit rate limit.
//!
//! A [`Tally`] lets the first event of a quiet period be logged in full and counts the rest;
//! [`Tally::flush`] hands back the count once the interval is over (or at shutdown), for one
//! summary line. So a flood costs at most two lines per interval, however fast it comes.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a tally window lasts: at most two lines per minute per kind of event.
pub const TALLY_INTERVAL: Duration = Duration::from_secs(60);

/// Counts events by reason within a window.
#[derive(Debug)]
pub struct Tally {
    interval: Duration,
    state: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    /// When the window opened (the event logged in full); `None`: quiet.
    opened: Option<Instant>,
    /// Events after the first, by reason.
    counted: BTreeMap<&'static str, u64>,
}

/// What a window counted after its first event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Events counted (not logged one by one).
    pub total: u64,
    /// The same by reason, as `reason=count` joined with spaces.
    pub by_reason: String,
    /// How long the window was open.
    pub over: Duration,
}

impl Default for Tally {
    fn default() -> Self {
        Self::new(TALLY_INTERVAL)
    }
}

impl Tally {
    /// A tally whose windows last `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            state: Mutex::new(Window::default()),
        }
    }

    /// Records one event. `true`: it opens a window, so the caller logs it in full; `false`:
    /// it was counted for the window's summary.
    pub fn note(&self, reason: &'static str, now: Instant) -> bool {
        let mut window = self.lock();
        match window.opened {
            Some(opened) if now.saturating_duration_since(opened) < self.interval => {
                *window.counted.entry(reason).or_default() += 1;
                false
            }
            _ => {
                // A window left open past its interval (no flush came) is simply restarted:
                // its count is lost only if nobody flushed for a whole interval, and the
                // agent flushes every few seconds.
                window.opened = Some(now);
                window.counted.clear();
                true
            }
        }
    }

    /// The summary of a window that is over at `now` (or of any open window when `force`),
    /// closing it; `None` when nothing was counted beyond the first event or the window is
    /// still running.
    pub fn flush(&self, now: Instant, force: bool) -> Option<Summary> {
        let mut window = self.lock();
        let opened = window.opened?;
        let over = now.saturating_duration_since(opened);
        if !force && over < self.interval {
            return None;
        }
        window.opened = None;
        let counted = std::mem::take(&mut window.counted);
        let total: u64 = counted.values().sum();
        (total > 0).then(|| Summary {
            total,
            by_reason: counted
                .iter()
                .map(|(reason, n)| format!("{reason}={n}"))
                .collect::<Vec<_>>()
                .join(" "),
            over,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        // Nothing panics while the lock is held; a poisoned window is still a valid window.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_one_full_line_and_one_count_per_interval() {
        let tally = Tally::new(Duration::from_secs(60));
        let start = Instant::now();
        let mut full = 0;
        for i in 0..5_000u64 {
            let reason = if i % 2 == 0 {
                "unsigned"
            } else {
                "bad_signature"
            };
            if tally.note(reason, start + Duration::from_millis(i)) {
                full += 1;
            }
        }
        assert_eq!(full, 1);
        assert_eq!(tally.flush(start + Duration::from_secs(10), false), None);
        let summary = tally.flush(start + Duration::from_secs(60), false).unwrap();
        assert_eq!(summary.total, 4_999);
        assert_eq!(summary.by_reason, "bad_signature=2500 unsigned=2499");
        // The window is closed: the next event is logged in full again.
        assert!(tally.note("unsigned", start + Duration::from_secs(61)));
    }

    #[test]
    fn a_single_event_needs_no_summary_and_a_forced_flush_reports_an_open_window() {
        let tally = Tally::new(Duration::from_secs(60));
        let start = Instant::now();
        assert!(tally.note("unsigned", start));
        assert_eq!(tally.flush(start + Duration::from_secs(61), false), None);
        assert!(tally.note("unsigned", start + Duration::from_secs(62)));
        assert!(!tally.note("unsigned", start + Duration::from_secs(63)));
        let summary = tally.flush(start + Duration::from_secs(64), true).unwrap();
        assert_eq!((summary.total, summary.over), (1, Duration::from_secs(2)));
    }
}
