//! How the agent writes times: RFC 3339 in UTC, seconds precision, as `/status`, the
//! records and the logs show them.

use std::time::SystemTime;

/// `time` as RFC 3339 in UTC, seconds precision (`2026-12-01T09:30:00Z`).
pub fn rfc3339(time: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(time).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn times_are_written_in_utc_to_the_second() {
        let time = UNIX_EPOCH + Duration::from_millis(1_764_581_400_750);
        assert_eq!(rfc3339(time), "2025-12-01T09:30:00Z");
    }
}
