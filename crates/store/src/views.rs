//! Read-only queries for the web UI: the pass timeline with its filters, and the findings a
//! pass saw. Nothing here writes.

use std::time::SystemTime;

use rusqlite::params;

use super::drift::DRIFT_COLUMNS;
use super::passes::PASS_COLUMNS;
use super::{DriftRecord, PassOutcome, PassSummary, Result, Store, to_millis};

/// Which passes the timeline lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassFilter {
    /// Only passes recorded under this node (exactly; `"*"` is the whole-cluster label).
    pub node: Option<String>,
    /// Only passes that ended with this outcome.
    pub outcome: Option<PassOutcome>,
    /// Only passes that started at or after this time.
    pub since: Option<SystemTime>,
}

impl Store {
    /// The latest `limit` passes matching `filter`, newest first.
    ///
    /// # Errors
    /// When the query fails.
    pub fn passes_matching(&self, filter: &PassFilter, limit: usize) -> Result<Vec<PassSummary>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT {PASS_COLUMNS} FROM passes \
             WHERE (?1 IS NULL OR node = ?1) AND (?2 IS NULL OR (outcome = ?2 AND unverified = ?5)) \
             AND (?3 IS NULL OR started_at >= ?3) ORDER BY id DESC LIMIT ?4"
        );
        self.query_passes(
            "listing passes for the timeline",
            &sql,
            params![
                filter.node.as_deref(),
                filter.outcome.map(super::passes::stored_outcome),
                filter.since.map(to_millis),
                limit,
                filter.outcome == Some(PassOutcome::Unverified)
            ],
        )
    }

    /// The nodes passes were recorded under, sorted (for the timeline's node filter).
    ///
    /// # Errors
    /// When the query fails.
    pub fn pass_nodes(&self) -> Result<Vec<String>> {
        let operation = "listing the nodes of recorded passes";
        let query_error = self.query_error(operation);
        let mut statement = self
            .conn
            .prepare_cached("SELECT DISTINCT node FROM passes ORDER BY node")
            .map_err(&query_error)?;
        statement
            .query_map([], |row| row.get(0))
            .map_err(&query_error)?
            .collect::<rusqlite::Result<Vec<String>>>()
            .map_err(&query_error)
    }

    /// The findings open at some moment between `from` and `to` (a pass's start and end): first
    /// seen by then and last seen since, so the ones that pass reported.
    ///
    /// # Errors
    /// When the query fails.
    pub fn findings_seen_between(
        &self,
        from: SystemTime,
        to: SystemTime,
    ) -> Result<Vec<DriftRecord>> {
        let sql = format!(
            "SELECT {DRIFT_COLUMNS} FROM drift_findings \
             WHERE first_seen_at <= ?2 AND last_seen_at >= ?1 \
             ORDER BY node, resource_kind, resource_name, kind, field"
        );
        self.query_drift(
            "listing the findings of a pass",
            &sql,
            params![to_millis(from), to_millis(to)],
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use proxops_core::plan::{Finding, FindingKind};
    use proxops_core::resource::{Kind, ResourceId};

    use super::*;
    use crate::{PassCounts, Trigger};

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
    }

    fn pass(store: &mut Store, node: &str, start: u64, outcome: PassOutcome) -> i64 {
        let id = store
            .begin_pass(node, Some("abc"), Trigger::Poll, at(start))
            .unwrap();
        store
            .finish_pass(id, outcome, PassCounts::default(), at(start + 1))
            .unwrap();
        id.0
    }

    #[test]
    fn the_timeline_filters_by_node_outcome_and_start_time_newest_first() {
        let mut store = Store::memory().unwrap();
        let a = pass(&mut store, "pve1", 0, PassOutcome::Applied);
        let b = pass(&mut store, "pve2", 10, PassOutcome::Invalid);
        let c = pass(&mut store, "pve1", 20, PassOutcome::Invalid);
        let ids = |filter: PassFilter| {
            store
                .passes_matching(&filter, 10)
                .unwrap()
                .iter()
                .map(|p| p.id.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(PassFilter::default()), [c, b, a]);
        let pve1 = PassFilter {
            node: Some("pve1".to_owned()),
            ..PassFilter::default()
        };
        assert_eq!(ids(pve1.clone()), [c, a]);
        let invalid = PassFilter {
            outcome: Some(PassOutcome::Invalid),
            ..PassFilter::default()
        };
        assert_eq!(ids(invalid), [c, b]);
        let since = PassFilter {
            since: Some(at(10)),
            ..pve1
        };
        assert_eq!(ids(since), [c]);
        assert_eq!(
            store
                .passes_matching(&PassFilter::default(), 1)
                .unwrap()
                .len(),
            1
        );
        assert_eq!(store.pass_nodes().unwrap(), ["pve1", "pve2"]);
    }

    #[test]
    fn a_pass_sees_the_findings_open_during_it_and_not_those_resolved_before() {
        let mut store = Store::memory().unwrap();
        let finding = |name: &str| Finding {
            resource: ResourceId::new(Kind::Vm, name),
            node: "pve1".to_owned(),
            kind: FindingKind::Drift,
            field: "memory".to_owned(),
            desired: "512".to_owned(),
            observed: "1024".to_owned(),
            message: "memory differs".to_owned(),
        };
        store
            .record_findings("pve1", Some("abc"), at(0), &[finding("old")])
            .unwrap();
        store
            .record_findings("pve1", Some("abc"), at(100), &[finding("new")])
            .unwrap();
        let names = |from, to| {
            store
                .findings_seen_between(at(from), at(to))
                .unwrap()
                .iter()
                .map(|d| d.resource.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(99, 101), ["new"]);
        assert_eq!(names(0, 1), ["old"]);
        assert!(names(200, 201).is_empty());
    }
}
