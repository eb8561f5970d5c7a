//! Write windows and the freeze: whether the agent may write to PVE now, and if not, why and
//! when it next may (issue 19, item 5). Pure: the caller passes the clock, the windows of
//! `[[policy.window]]` and the freeze recorded in the store.
//!
//! A window is a 5-field cron `schedule` (evaluated in UTC, never the node's local time, so
//! there is no DST gap or repeat) and a `duration`: each time the schedule matches, the
//! window is open for `duration`, `[start, start + duration)`. With at least one `allow`
//! window, writes happen only while one is open; writes never happen while a `deny` window
//! is open; a freeze holds every write until it ends. Observation and drift reporting never
//! stop: only writes are held.

use std::fmt;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use proxops_store::Freeze;
use serde::{Deserialize, Serialize};

use crate::timefmt::rfc3339;

/// `kind` of a `[[policy.window]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WindowKind {
    /// Writes may happen while it is open.
    Allow,
    /// Writes never happen while it is open.
    Deny,
}

impl WindowKind {
    /// `allow` or `deny`.
    pub fn name(self) -> &'static str {
        match self {
            WindowKind::Allow => "allow",
            WindowKind::Deny => "deny",
        }
    }
}

/// One `[[policy.window]]` as written in agent.toml.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWindow {
    kind: WindowKind,
    schedule: String,
    duration: String,
}

/// A validated write window.
#[derive(Debug, Clone)]
pub struct Window {
    /// Allow or deny.
    pub kind: WindowKind,
    /// The 5-field cron expression, as written.
    pub schedule: String,
    /// How long the window stays open after each match.
    pub duration: Duration,
    cron: Box<croner::Cron>,
}

impl PartialEq for Window {
    fn eq(&self, other: &Self) -> bool {
        (self.kind, &self.schedule, self.duration) == (other.kind, &other.schedule, other.duration)
    }
}

impl Eq for Window {}

impl fmt::Display for Window {
    /// `deny window "0 22 * * 1-5" for 2h`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} window \"{}\" for {}",
            self.kind.name(),
            self.schedule,
            humantime::format_duration(self.duration)
        )
    }
}

impl Window {
    /// Validates one window.
    ///
    /// # Errors
    /// `(field, message)`: a schedule that is not a 5-field cron expression, or a duration
    /// that does not parse or is zero.
    pub fn new(kind: WindowKind, schedule: &str, duration: &str) -> Result<Self, (String, String)> {
        let fields = schedule.split_whitespace().count();
        if fields != 5 {
            return Err((
                "schedule".to_owned(),
                format!(
                    "`{schedule}` has {fields} fields; write a 5-field cron expression \
                     (minute hour day-of-month month day-of-week, in UTC), e.g. \"0 22 * * 1-5\""
                ),
            ));
        }
        let cron = schedule.parse::<croner::Cron>().map_err(|e| {
            (
                "schedule".to_owned(),
                format!("`{schedule}` is not a cron expression: {e}"),
            )
        })?;
        let parsed = humantime::parse_duration(duration).map_err(|e| {
            (
                "duration".to_owned(),
                format!("`{duration}`: {e}; write e.g. \"2h\" or \"30m\""),
            )
        })?;
        if parsed.is_zero() {
            return Err((
                "duration".to_owned(),
                "must be longer than 0 (a window of no time never opens)".to_owned(),
            ));
        }
        Ok(Self {
            kind,
            schedule: schedule.to_owned(),
            duration: parsed,
            cron: Box::new(cron),
        })
    }

    fn span(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.duration).unwrap_or(chrono::Duration::MAX)
    }

    /// When the occurrence open at `at` closes, if one is (the latest start at or before
    /// `at` decides: every occurrence lasts as long).
    fn open_until(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let start = self.cron.find_previous_occurrence(&at, true).ok()?;
        let end = start.checked_add_signed(self.span())?;
        (at < end).then_some(end)
    }

    /// The first start at or after `at`.
    fn next_start(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.find_next_occurrence(&at, true).ok()
    }
}

/// Parses `[[policy.window]]`; errors name the window (`policy.window[1].schedule`).
///
/// # Errors
/// `(key, message)` for the first invalid window.
pub fn parse(raw: &[RawWindow]) -> Result<Vec<Window>, (String, String)> {
    raw.iter()
        .enumerate()
        .map(|(index, w)| {
            Window::new(w.kind, &w.schedule, &w.duration)
                .map_err(|(field, message)| (format!("policy.window[{index}].{field}"), message))
        })
        .collect()
}

/// Why writes are held now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// What holds them, in words for operators.
    pub reason: String,
    /// When the next write is allowed, if known (`None`: frozen without end, or no allow
    /// window ever opens again).
    pub next_allowed: Option<DateTime<Utc>>,
}

/// Bounds the search for the next allowed instant (each step passes one window boundary).
const MAX_STEPS: usize = 10_000;

/// Where windows alone hold writes at `at`: `Some((why, from when they would allow))`.
fn window_hold(at: DateTime<Utc>, windows: &[Window]) -> Option<(String, Option<DateTime<Utc>>)> {
    let blocked_at = |t: DateTime<Utc>| -> Option<(String, Option<DateTime<Utc>>)> {
        let deny = windows
            .iter()
            .filter(|w| w.kind == WindowKind::Deny)
            .filter_map(|w| w.open_until(t).map(|end| (w, end)))
            .max_by_key(|(_, end)| *end);
        if let Some((w, end)) = deny {
            return Some((format!("inside the {w}"), Some(end)));
        }
        let allows: Vec<&Window> = windows
            .iter()
            .filter(|w| w.kind == WindowKind::Allow)
            .collect();
        if allows.is_empty() || allows.iter().any(|w| w.open_until(t).is_some()) {
            return None;
        }
        let next = allows.iter().filter_map(|w| w.next_start(t)).min();
        Some(("outside every allow window".to_owned(), next))
    };
    let (reason, mut next) = blocked_at(at)?;
    for _ in 0..MAX_STEPS {
        let candidate = next?;
        match blocked_at(candidate) {
            None => return Some((reason, Some(candidate))),
            Some((_, later)) => next = later.filter(|l| *l > candidate),
        }
    }
    Some((reason, None))
}

/// Whether a pass may write at `now`, given the windows and the freeze recorded (if any).
///
/// # Errors
/// [`Held`]: why not, and when the next write is allowed.
pub fn write_allowed(
    now: DateTime<Utc>,
    windows: &[Window],
    freeze: Option<&Freeze>,
) -> Result<(), Held> {
    if let Some(freeze) = freeze.filter(|f| f.in_force_at(now.into())) {
        let since = rfc3339(freeze.since);
        let why = if freeze.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", freeze.reason)
        };
        let Some(until) = freeze.until else {
            return Err(Held {
                reason: format!(
                    "frozen by {} since {since}{why}; writes resume after proxops unfreeze",
                    freeze.who
                ),
                next_allowed: None,
            });
        };
        let until: DateTime<Utc> = until.into();
        let next_allowed = match window_hold(until, windows) {
            None => Some(until),
            Some((_, next)) => next,
        };
        return Err(Held {
            reason: format!(
                "frozen by {} since {since} until {}{why}",
                freeze.who,
                rfc3339(until.into())
            ),
            next_allowed,
        });
    }
    match window_hold(now, windows) {
        None => Ok(()),
        Some((reason, next_allowed)) => Err(Held {
            reason: format!("{reason} of [[policy.window]] (UTC)"),
            next_allowed,
        }),
    }
}

impl Held {
    /// The reason and when writes resume, in one sentence.
    pub fn sentence(&self) -> String {
        match self.next_allowed {
            Some(at) => format!(
                "writes held: {}; next write allowed at {}",
                self.reason,
                rfc3339(SystemTime::from(at))
            ),
            None => format!("writes held: {}", self.reason),
        }
    }
}

/// `view` with a further hold from another source (a node in PVE's HA maintenance,
/// `agent::ha`): writes are not allowed while it holds, and the reasons are joined.
pub fn with_hold(mut view: WritesView, hold: Option<&Held>) -> WritesView {
    let Some(hold) = hold else {
        return view;
    };
    view.allowed = false;
    view.held = Some(match view.held.take() {
        Some(first) => format!("{first}; {}", hold.reason),
        None => hold.reason.clone(),
    });
    view
}

/// The freeze as the views show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreezeView {
    /// RFC 3339; `None`: until `proxops unfreeze`.
    pub until: Option<String>,
    /// The operator's reason.
    pub reason: String,
    /// The Unix user who froze.
    pub who: String,
    /// RFC 3339.
    pub since: String,
}

/// Whether writes are allowed now, as `/api/v1/status`, `proxops status` and the UI say it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WritesView {
    /// No freeze in force and the windows allow a write now.
    pub allowed: bool,
    /// The freeze in force, if any.
    pub frozen: Option<FreezeView>,
    /// Why writes are held, when they are.
    pub held: Option<String>,
    /// RFC 3339: when the next write is allowed, when held and known.
    pub next_allowed: Option<String>,
    /// `[[policy.window]]`, as `allow window "0 22 * * 1-5" for 2h`.
    pub windows: Vec<String>,
}

/// The view of [`write_allowed`] at `now`.
pub fn writes_view(now: DateTime<Utc>, windows: &[Window], freeze: Option<&Freeze>) -> WritesView {
    let frozen = freeze
        .filter(|f| f.in_force_at(now.into()))
        .map(|f| FreezeView {
            until: f.until.map(rfc3339),
            reason: f.reason.clone(),
            who: f.who.clone(),
            since: rfc3339(f.since),
        });
    let (allowed, held, next_allowed) = match write_allowed(now, windows, freeze) {
        Ok(()) => (true, None, None),
        Err(held) => (
            false,
            Some(held.reason),
            held.next_allowed.map(|t| rfc3339(t.into())),
        ),
    };
    WritesView {
        allowed,
        frozen,
        held,
        next_allowed,
        windows: windows.iter().map(ToString::to_string).collect(),
    }
}

impl WritesView {
    /// The view with the rollout's hold (`[rollout]`, issue 22): when the windows and the
    /// freeze allow writes but the rollout holds them, it says why and until when.
    #[must_use]
    pub fn with_rollout(mut self, rollout: Option<&crate::agent::rollout::RolloutView>) -> Self {
        if let Some(held) = rollout.and_then(|r| r.held.as_ref())
            && self.held.is_none()
        {
            self.allowed = false;
            self.held = Some(held.clone());
            self.next_allowed = rollout.and_then(|r| r.until.clone());
        }
        self
    }

    /// One line for people: `allowed` or why not and until when.
    pub fn line(&self) -> String {
        match (&self.held, &self.next_allowed) {
            (None, _) => "allowed".to_owned(),
            (Some(why), Some(next)) => format!("held: {why}; next write allowed at {next}"),
            (Some(why), None) => format!("held: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    fn allow(schedule: &str, duration: &str) -> Window {
        Window::new(WindowKind::Allow, schedule, duration).unwrap()
    }

    fn deny(schedule: &str, duration: &str) -> Window {
        Window::new(WindowKind::Deny, schedule, duration).unwrap()
    }

    fn frozen(until: Option<DateTime<Utc>>) -> Freeze {
        Freeze {
            until: until.map(SystemTime::from),
            reason: "kernel upgrade".to_owned(),
            who: "alice".to_owned(),
            since: SystemTime::from(utc(2027, 3, 1, 8, 0)),
        }
    }

    #[test]
    fn without_windows_or_freeze_writes_are_always_allowed() {
        assert_eq!(write_allowed(utc(2027, 3, 1, 12, 0), &[], None), Ok(()));
    }

    #[test]
    fn an_allow_window_lets_writes_through_only_while_open_and_names_the_next_opening() {
        // Weekdays 22:00–00:00 UTC; 2027-03-01 is a Monday.
        let windows = [allow("0 22 * * 1-5", "2h")];
        assert_eq!(
            write_allowed(utc(2027, 3, 1, 22, 0), &windows, None),
            Ok(())
        );
        assert_eq!(
            write_allowed(utc(2027, 3, 1, 23, 59), &windows, None),
            Ok(())
        );
        let held = write_allowed(utc(2027, 3, 2, 0, 0), &windows, None).unwrap_err();
        assert_eq!(held.next_allowed, Some(utc(2027, 3, 2, 22, 0)));
        assert!(
            held.reason.contains("outside every allow window"),
            "{held:?}"
        );
        // Friday night's window is the last of the week: next Monday.
        let held = write_allowed(utc(2027, 3, 6, 12, 0), &windows, None).unwrap_err();
        assert_eq!(held.next_allowed, Some(utc(2027, 3, 8, 22, 0)));
    }

    #[test]
    fn a_window_open_across_midnight_holds_into_the_next_day() {
        let windows = [deny("0 23 * * *", "3h")];
        assert!(write_allowed(utc(2027, 3, 1, 22, 59), &windows, None).is_ok());
        let held = write_allowed(utc(2027, 3, 2, 1, 30), &windows, None).unwrap_err();
        assert_eq!(held.next_allowed, Some(utc(2027, 3, 2, 2, 0)));
        assert!(
            held.reason
                .contains("inside the deny window \"0 23 * * *\" for 3h"),
            "{held:?}"
        );
        assert!(write_allowed(utc(2027, 3, 2, 2, 0), &windows, None).is_ok());
    }

    #[test]
    fn a_deny_window_wins_over_an_allow_window_and_the_next_write_is_after_both_agree() {
        // Allowed 20:00–24:00, denied 21:00–23:00: writes 20:00–21:00 and 23:00–24:00.
        let windows = [allow("0 20 * * *", "4h"), deny("0 21 * * *", "2h")];
        assert!(write_allowed(utc(2027, 3, 1, 20, 30), &windows, None).is_ok());
        let held = write_allowed(utc(2027, 3, 1, 21, 30), &windows, None).unwrap_err();
        assert_eq!(held.next_allowed, Some(utc(2027, 3, 1, 23, 0)));
        // Outside the allow window: the next opening, 20:00, is before the deny window.
        let held = write_allowed(utc(2027, 3, 2, 10, 0), &windows, None).unwrap_err();
        assert_eq!(held.next_allowed, Some(utc(2027, 3, 2, 20, 0)));
    }

    #[test]
    fn an_allow_window_opening_inside_a_deny_window_counts_from_when_the_deny_closes() {
        let windows = [allow("0 1 * * *", "2h"), deny("0 0 * * *", "90m")];
        let held = write_allowed(utc(2027, 3, 1, 12, 0), &windows, None).unwrap_err();
        assert_eq!(held.next_allowed, Some(utc(2027, 3, 2, 1, 30)));
    }

    #[test]
    fn a_freeze_without_end_holds_every_write_even_inside_an_allow_window() {
        let windows = [allow("* * * * *", "1h")];
        let held =
            write_allowed(utc(2027, 3, 1, 12, 0), &windows, Some(&frozen(None))).unwrap_err();
        assert_eq!(held.next_allowed, None);
        assert_eq!(
            held.reason,
            "frozen by alice since 2027-03-01T08:00:00Z: kernel upgrade; writes resume after \
             proxops unfreeze"
        );
    }

    #[test]
    fn a_timed_freeze_ends_by_itself_and_the_windows_then_decide() {
        let freeze = frozen(Some(utc(2027, 3, 1, 14, 0)));
        let held = write_allowed(utc(2027, 3, 1, 12, 0), &[], Some(&freeze)).unwrap_err();
        assert_eq!(held.next_allowed, Some(utc(2027, 3, 1, 14, 0)));
        assert!(
            held.reason.contains("until 2027-03-01T14:00:00Z"),
            "{held:?}"
        );
        assert_eq!(
            write_allowed(utc(2027, 3, 1, 14, 0), &[], Some(&freeze)),
            Ok(())
        );
        // The freeze ends at 14:00, but the allow window opens only at 22:00.
        let windows = [allow("0 22 * * *", "1h")];
        let held = write_allowed(utc(2027, 3, 1, 12, 0), &windows, Some(&freeze)).unwrap_err();
        assert_eq!(held.next_allowed, Some(utc(2027, 3, 1, 22, 0)));
    }

    #[test]
    fn invalid_windows_say_which_field_is_wrong_and_how_to_write_it() {
        let raw = |schedule: &str, duration: &str| RawWindow {
            kind: WindowKind::Allow,
            schedule: schedule.to_owned(),
            duration: duration.to_owned(),
        };
        let (key, message) =
            parse(&[raw("0 22 * * *", "2h"), raw("0 0 22 * * *", "2h")]).unwrap_err();
        assert_eq!(key, "policy.window[1].schedule");
        assert!(message.contains("has 6 fields"), "{message}");
        let (key, message) = parse(&[raw("0 61 * * *", "2h")]).unwrap_err();
        assert_eq!(key, "policy.window[0].schedule");
        assert!(message.contains("not a cron expression"), "{message}");
        let (key, _) = parse(&[raw("0 22 * * *", "two hours")]).unwrap_err();
        assert_eq!(key, "policy.window[0].duration");
        let (key, message) = parse(&[raw("0 22 * * *", "0s")]).unwrap_err();
        assert_eq!(key, "policy.window[0].duration");
        assert!(message.contains("longer than 0"), "{message}");
    }

    #[test]
    fn the_view_of_a_timed_freeze_names_who_until_when_and_the_next_write() {
        let freeze = frozen(Some(utc(2027, 3, 1, 14, 0)));
        let view = writes_view(utc(2027, 3, 1, 12, 0), &[], Some(&freeze));
        assert!(!view.allowed);
        let shown = view.frozen.as_ref().unwrap();
        assert_eq!(
            (shown.who.as_str(), shown.until.as_deref()),
            ("alice", Some("2027-03-01T14:00:00Z"))
        );
        assert_eq!(view.next_allowed.as_deref(), Some("2027-03-01T14:00:00Z"));
        assert!(
            view.line()
                .ends_with("next write allowed at 2027-03-01T14:00:00Z")
        );
        // Once it ended, it is not shown and writes are allowed.
        let after = writes_view(utc(2027, 3, 1, 15, 0), &[], Some(&freeze));
        assert_eq!(after.line(), "allowed");
        assert_eq!((after.allowed, after.frozen), (true, None));
    }

    #[test]
    fn the_sentence_says_why_and_when_the_next_write_is_allowed() {
        let held = Held {
            reason: "outside every allow window".to_owned(),
            next_allowed: Some(utc(2027, 3, 1, 22, 0)),
        };
        assert_eq!(
            held.sentence(),
            "writes held: outside every allow window; next write allowed at 2027-03-01T22:00:00Z"
        );
    }
}
