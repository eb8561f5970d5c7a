//! The operator's freeze (schema version 4): `proxops freeze` writes it, `proxops unfreeze`
//! clears it, the agent reads it before every write. At most one freeze is recorded; a new
//! one replaces it. The store decides nothing: whether a freeze is still in force at some
//! instant is [`Freeze::in_force_at`], asked by the caller with its own clock.

use std::time::SystemTime;

use rusqlite::{OptionalExtension, params};

use super::{Result, Store, from_millis, redact, to_millis};

/// A recorded freeze.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freeze {
    /// When it ends by itself; `None` until `proxops unfreeze`.
    pub until: Option<SystemTime>,
    /// Why, in the operator's words (may be empty).
    pub reason: String,
    /// The Unix user who froze.
    pub who: String,
    /// When it was set.
    pub since: SystemTime,
}

impl Freeze {
    /// Whether the freeze holds writes at `now`.
    pub fn in_force_at(&self, now: SystemTime) -> bool {
        self.until.is_none_or(|until| now < until)
    }
}

impl Store {
    /// Records `freeze`, replacing any earlier one.
    ///
    /// # Errors
    /// When the row cannot be written.
    pub fn set_freeze(&mut self, freeze: &Freeze) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO freeze (id, until_at, reason, who, since_at) \
                 VALUES (1, ?1, ?2, ?3, ?4) ON CONFLICT (id) DO UPDATE SET \
                 until_at = excluded.until_at, reason = excluded.reason, \
                 who = excluded.who, since_at = excluded.since_at",
                params![
                    freeze.until.map(to_millis),
                    redact(&freeze.reason),
                    freeze.who,
                    to_millis(freeze.since)
                ],
            )
            .map_err(self.query_error("recording a freeze"))?;
        Ok(())
    }

    /// Removes the freeze; returns the one removed, if any.
    ///
    /// # Errors
    /// When the row cannot be read or deleted.
    pub fn clear_freeze(&mut self) -> Result<Option<Freeze>> {
        let removed = self.freeze()?;
        self.conn
            .execute("DELETE FROM freeze", [])
            .map_err(self.query_error("removing the freeze"))?;
        Ok(removed)
    }

    /// The recorded freeze, whether or not it has ended.
    ///
    /// # Errors
    /// When the row cannot be read.
    pub fn freeze(&self) -> Result<Option<Freeze>> {
        self.conn
            .query_row(
                "SELECT until_at, reason, who, since_at FROM freeze WHERE id = 1",
                [],
                |row| {
                    Ok(Freeze {
                        until: row.get::<_, Option<i64>>(0)?.map(from_millis),
                        reason: row.get(1)?,
                        who: row.get(2)?,
                        since: from_millis(row.get(3)?),
                    })
                },
            )
            .optional()
            .map_err(self.query_error("reading the freeze"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actions::tests::at;

    fn freeze(until: Option<u64>, reason: &str) -> Freeze {
        Freeze {
            until: until.map(at),
            reason: reason.to_owned(),
            who: "alice".to_owned(),
            since: at(0),
        }
    }

    #[test]
    fn a_freeze_is_read_back_replaced_by_a_newer_one_and_cleared() {
        let mut store = Store::memory().unwrap();
        assert_eq!(store.freeze().unwrap(), None);
        store.set_freeze(&freeze(Some(3600), "upgrade")).unwrap();
        assert_eq!(store.freeze().unwrap(), Some(freeze(Some(3600), "upgrade")));
        store.set_freeze(&freeze(None, "incident")).unwrap();
        assert_eq!(store.freeze().unwrap(), Some(freeze(None, "incident")));
        assert_eq!(
            store.clear_freeze().unwrap(),
            Some(freeze(None, "incident"))
        );
        assert_eq!(store.freeze().unwrap(), None);
        assert_eq!(store.clear_freeze().unwrap(), None);
    }

    #[test]
    fn a_freeze_holds_until_its_end_and_one_without_end_holds_forever() {
        let timed = freeze(Some(3600), "");
        assert!(timed.in_force_at(at(3599)));
        assert!(!timed.in_force_at(at(3600)));
        assert!(freeze(None, "").in_force_at(at(u64::from(u32::MAX))));
    }

    #[test]
    fn a_password_in_a_freeze_reason_is_not_stored() {
        let mut store = Store::memory().unwrap();
        store
            .set_freeze(&freeze(None, "see https://bob:hunter2@wiki.example.org/x"))
            .unwrap();
        let stored = store.freeze().unwrap().unwrap().reason;
        assert!(!stored.contains("hunter2"), "{stored}");
    }
}
