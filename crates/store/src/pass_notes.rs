//! What a pass noticed beyond its outcome and counts (schema version 2): the guard rails'
//! evidence. A force-pushed branch, a git fetch that failed (and whether the last good
//! revision was used, which makes the desired state stale), why the pass failed, and the
//! write circuit breaker's state when it started. Notes are written while the pass runs,
//! so a crash leaves what was known.

use std::fmt;
use std::str::FromStr;

use rusqlite::params;

use super::{PassId, Result, Store, redact};

/// The write circuit breaker's state as recorded on a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerMark {
    /// Writes allowed.
    Closed,
    /// Read-only: no write issued.
    Open,
    /// At most one probe write issued.
    HalfOpen,
}

impl BreakerMark {
    /// The stored and displayed name.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerMark::Closed => "closed",
            BreakerMark::Open => "open",
            BreakerMark::HalfOpen => "half-open",
        }
    }
}

impl FromStr for BreakerMark {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "closed" => BreakerMark::Closed,
            "open" => BreakerMark::Open,
            "half-open" => BreakerMark::HalfOpen,
            _ => return Err(s.to_owned()),
        })
    }
}

impl fmt::Display for BreakerMark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The notes of one pass; the default is "nothing noticed".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassNotes {
    /// The commit the branch pointed to before this pass's fetch.
    pub previous_commit: Option<String>,
    /// The branch was rewritten: the commit does not descend from `previous_commit`.
    pub force_pushed: bool,
    /// Git could not be fetched and the last good revision was used instead.
    pub desired_stale: bool,
    /// Why git could not be fetched.
    pub source_error: Option<String>,
    /// Why the pass failed or held its writes back.
    pub error: Option<String>,
    /// The write circuit breaker when the pass started (`None` before the breaker existed or
    /// when the pass never got as far as writing).
    pub write_breaker: Option<BreakerMark>,
}

/// Reads the notes from `row` (columns `previous_revision, force_pushed, desired_stale,
/// source_error, error, write_breaker` from `first` on); the breaker's name is returned
/// unparsed so the caller can report a corrupt value with its operation.
pub(super) fn raw_notes(
    row: &rusqlite::Row<'_>,
    first: usize,
) -> rusqlite::Result<(PassNotes, Option<String>)> {
    Ok((
        PassNotes {
            previous_commit: row.get(first)?,
            force_pushed: row.get::<_, i64>(first + 1)? != 0,
            desired_stale: row.get::<_, i64>(first + 2)? != 0,
            source_error: row.get(first + 3)?,
            error: row.get(first + 4)?,
            write_breaker: None,
        },
        row.get(first + 5)?,
    ))
}

impl Store {
    /// Records what the pass's fetch found: the previous commit, a force-push, and a git
    /// error with whether the last good revision was used in its place (stale).
    ///
    /// # Errors
    /// When the pass does not exist or the row cannot be written.
    pub fn note_source(
        &mut self,
        id: PassId,
        previous_commit: Option<&str>,
        force_pushed: bool,
        source_error: Option<&str>,
        desired_stale: bool,
    ) -> Result<()> {
        let operation = "recording what the git fetch of a pass found";
        let changed = self
            .conn
            .execute(
                "UPDATE passes SET previous_revision = ?2, force_pushed = ?3, \
                 source_error = ?4, desired_stale = ?5 WHERE id = ?1",
                params![
                    id.0,
                    previous_commit,
                    force_pushed,
                    source_error.map(redact),
                    desired_stale
                ],
            )
            .map_err(self.query_error(operation))?;
        if changed == 0 {
            return Err(self.not_found(operation, id.to_string()));
        }
        Ok(())
    }

    /// Records why a pass failed or held its writes back.
    ///
    /// # Errors
    /// When the pass does not exist or the row cannot be written.
    pub fn note_error(&mut self, id: PassId, error: &str) -> Result<()> {
        let operation = "recording why a pass failed";
        let changed = self
            .conn
            .execute(
                "UPDATE passes SET error = ?2 WHERE id = ?1",
                params![id.0, redact(error)],
            )
            .map_err(self.query_error(operation))?;
        if changed == 0 {
            return Err(self.not_found(operation, id.to_string()));
        }
        Ok(())
    }

    /// Records the write circuit breaker's state the pass ran under.
    ///
    /// # Errors
    /// When the pass does not exist or the row cannot be written.
    pub fn note_write_breaker(&mut self, id: PassId, mark: BreakerMark) -> Result<()> {
        let operation = "recording the write circuit breaker of a pass";
        let changed = self
            .conn
            .execute(
                "UPDATE passes SET write_breaker = ?2 WHERE id = ?1",
                params![id.0, mark.as_str()],
            )
            .map_err(self.query_error(operation))?;
        if changed == 0 {
            return Err(self.not_found(operation, id.to_string()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::{PassCounts, PassOutcome, StoreError, Trigger};

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
    }

    #[test]
    fn a_force_push_is_recorded_on_the_pass_with_the_commit_it_replaced() {
        let mut store = Store::memory().unwrap();
        let id = store
            .begin_pass("pve1", Some("bbb"), Trigger::Poll, at(0))
            .unwrap();
        store
            .note_source(id, Some("aaa"), true, None, false)
            .unwrap();
        store
            .begin_pass("pve1", Some("ccc"), Trigger::Poll, at(5))
            .unwrap();
        let notes = store.pass(id).unwrap().unwrap().notes;
        assert!(notes.force_pushed);
        let last = store.last_force_pushed("pve1").unwrap().unwrap();
        assert_eq!((last.id, last.commit.as_deref()), (id, Some("bbb")));
        assert_eq!(store.last_force_pushed("pve2").unwrap(), None);
        assert_eq!(notes.previous_commit.as_deref(), Some("aaa"));
        assert!(!notes.desired_stale);
    }

    #[test]
    fn a_git_error_is_recorded_redacted_and_marks_the_pass_stale() {
        let mut store = Store::memory().unwrap();
        let id = store
            .begin_pass("pve1", Some("aaa"), Trigger::Poll, at(0))
            .unwrap();
        store
            .note_source(
                id,
                None,
                false,
                Some("fetching https://git:hunter2@example.org/r.git: refused"),
                true,
            )
            .unwrap();
        store.note_error(id, "listing failed").unwrap();
        store.note_write_breaker(id, BreakerMark::Open).unwrap();
        store
            .finish_pass(id, PassOutcome::Failed, PassCounts::default(), at(1))
            .unwrap();
        let notes = store.pass(id).unwrap().unwrap().notes;
        assert!(notes.desired_stale);
        let error = notes.source_error.unwrap();
        assert!(!error.contains("hunter2"), "{error}");
        assert!(error.contains("refused"));
        assert_eq!(notes.error.as_deref(), Some("listing failed"));
        assert_eq!(notes.write_breaker, Some(BreakerMark::Open));
    }

    #[test]
    fn notes_on_a_missing_pass_are_refused() {
        let mut store = Store::memory().unwrap();
        let error = store.note_error(PassId(7), "x").unwrap_err();
        assert!(matches!(error, StoreError::NotFound { .. }), "{error:?}");
    }

    #[test]
    fn a_pass_without_notes_reads_as_nothing_noticed() {
        let mut store = Store::memory().unwrap();
        let id = store
            .begin_pass("pve1", None, Trigger::Startup, at(0))
            .unwrap();
        assert_eq!(store.pass(id).unwrap().unwrap().notes, PassNotes::default());
    }
}
