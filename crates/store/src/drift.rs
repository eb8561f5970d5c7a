//! Drift findings over time: each finding of a pass is matched to an open record by (node,
//! resource, kind, field); new ones are opened with their first-seen commit and time, ones
//! still reported get their last-seen updated, and open ones no longer reported are resolved
//! ("corrected" when ProxOps or someone fixed them, "gone" when the resource went away).
//!
//! Fail closed: while a resource cannot be observed on a node (an `observe-failed` finding
//! in the same list), its other open findings are neither confirmed nor resolved — nobody
//! looked, so nothing is known to have changed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::SystemTime;

use proxops_core::plan::{Finding, FindingKind};
use proxops_core::resource::ResourceId;
use rusqlite::{Row, params};

use super::{ALL_NODES, PassId, Result, Store, from_millis, redact, to_millis};

/// How an open finding came to be resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// PVE no longer reports it, and who changed what is not known (findings other than
    /// drift, and every resolution recorded before schema version 3).
    Corrected,
    /// That pass wrote the correction to PVE and it succeeded.
    CorrectedByPass(PassId),
    /// The enforced revision changed and no longer asks for what differed.
    ManifestChanged,
    /// PVE matches the unchanged revision again without a write of this agent: someone
    /// fixed it in PVE.
    FixedInPve,
    /// The resource is no longer declared or no longer exists.
    Gone,
}

impl Resolution {
    /// The version 1 word stored in `resolved_how`: `corrected` (PVE matches) or `gone`.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Corrected | Resolution::CorrectedByPass(_) | Resolution::FixedInPve => {
                "corrected"
            }
            Resolution::ManifestChanged | Resolution::Gone => "gone",
        }
    }

    /// The machine word of the API (`resolution`), also stored since schema version 3:
    /// `corrected-by-pass`, `manifest-changed`, `fixed-in-pve`, `gone`, or `corrected` when
    /// who corrected it is not known.
    pub fn word(self) -> &'static str {
        match self {
            Resolution::Corrected => "corrected",
            Resolution::CorrectedByPass(_) => "corrected-by-pass",
            Resolution::ManifestChanged => "manifest-changed",
            Resolution::FixedInPve => "fixed-in-pve",
            Resolution::Gone => "gone",
        }
    }

    /// The pass that wrote the correction, for [`Resolution::CorrectedByPass`].
    pub fn pass(self) -> Option<PassId> {
        match self {
            Resolution::CorrectedByPass(pass) => Some(pass),
            _ => None,
        }
    }

    /// The `resolution` column's value (`NULL` for [`Resolution::Corrected`]).
    fn stored_word(self) -> Option<&'static str> {
        match self {
            Resolution::Corrected => None,
            other => Some(other.word()),
        }
    }

    /// Reads the stored columns back: the version 3 `resolution` word (with the pass that
    /// resolved the finding) when present, else the version 1 `resolved_how`.
    fn from_stored(
        resolved_how: &str,
        resolution: Option<&str>,
        resolved_pass: Option<PassId>,
    ) -> Result<Self, String> {
        match (resolution, resolved_pass) {
            (Some("corrected-by-pass"), Some(pass)) => Ok(Resolution::CorrectedByPass(pass)),
            (Some("manifest-changed"), _) => Ok(Resolution::ManifestChanged),
            (Some("fixed-in-pve"), _) => Ok(Resolution::FixedInPve),
            (Some("gone"), _) => Ok(Resolution::Gone),
            (Some(other), _) => Err(other.to_owned()),
            (None, _) => match resolved_how {
                "corrected" => Ok(Resolution::Corrected),
                "gone" => Ok(Resolution::Gone),
                other => Err(other.to_owned()),
            },
        }
    }
}

impl fmt::Display for Resolution {
    /// For people: `corrected by pass 12`, `manifest changed`, `fixed in PVE`, `gone`, or
    /// `no longer reported`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resolution::Corrected => f.write_str("no longer reported"),
            Resolution::CorrectedByPass(pass) => write!(f, "corrected by pass {}", pass.0),
            Resolution::ManifestChanged => f.write_str("manifest changed"),
            Resolution::FixedInPve => f.write_str("fixed in PVE"),
            Resolution::Gone => f.write_str("gone"),
        }
    }
}

/// One finding's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriftRecord {
    /// Row id.
    pub id: i64,
    /// The node concerned.
    pub node: String,
    /// The resource concerned.
    pub resource: ResourceId,
    /// The finding kind's name (`drift`, `needs-reboot`, `observe-failed`, …).
    pub kind: String,
    /// The field concerned (empty for the whole resource).
    pub field: String,
    /// What git declares, as last reported.
    pub desired: String,
    /// What PVE reports, as last reported.
    pub observed: String,
    /// The explanation, as last reported.
    pub message: String,
    /// The revision of the pass that first reported it.
    pub first_seen_commit: Option<String>,
    /// When it was first reported.
    pub first_seen_at: SystemTime,
    /// The revision of the pass that last reported it.
    pub last_seen_commit: Option<String>,
    /// When it was last reported.
    pub last_seen_at: SystemTime,
    /// When it stopped being reported; `None` while open.
    pub resolved_at: Option<SystemTime>,
    /// How it was resolved; `None` while open.
    pub resolved_how: Option<Resolution>,
    /// The pass that first reported it (`None` before schema version 3).
    pub first_seen_pass: Option<PassId>,
    /// The pass that last reported it (`None` before schema version 3).
    pub last_seen_pass: Option<PassId>,
    /// The pass that resolved it: the one that corrected it, or the one that no longer
    /// found it (`None` while open, and before schema version 3).
    pub resolved_pass: Option<PassId>,
}

/// What one call of [`Store::record_findings`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriftUpdate {
    /// Findings seen for the first time.
    pub opened: usize,
    /// Open findings reported again.
    pub still_open: usize,
    /// Open findings no longer reported.
    pub resolved: usize,
}

pub(crate) const DRIFT_COLUMNS: &str = "id, node, resource_kind, resource_name, kind, field, desired, \
     observed, message, first_seen_commit, first_seen_at, last_seen_commit, last_seen_at, \
     resolved_at, resolved_how, first_seen_pass, last_seen_pass, resolved_pass, resolution";

/// (node, resource kind, resource name, finding kind, field).
type Key = (String, String, String, String, String);

/// A drift row as read, before its names are parsed.
struct RawDrift {
    record: DriftRecord,
    resource_kind: String,
    resolved_how: Option<String>,
    resolution: Option<String>,
}

fn raw_drift(row: &Row<'_>) -> rusqlite::Result<RawDrift> {
    let resource_kind: String = row.get(2)?;
    Ok(RawDrift {
        record: DriftRecord {
            id: row.get(0)?,
            node: row.get(1)?,
            // Replaced by the parsed kind in `query_drift`.
            resource: ResourceId::new(proxops_core::resource::Kind::Vm, row.get::<_, String>(3)?),
            kind: row.get(4)?,
            field: row.get(5)?,
            desired: row.get(6)?,
            observed: row.get(7)?,
            message: row.get(8)?,
            first_seen_commit: row.get(9)?,
            first_seen_at: from_millis(row.get(10)?),
            last_seen_commit: row.get(11)?,
            last_seen_at: from_millis(row.get(12)?),
            resolved_at: row.get::<_, Option<i64>>(13)?.map(from_millis),
            resolved_how: None,
            first_seen_pass: row.get::<_, Option<i64>>(15)?.map(PassId),
            last_seen_pass: row.get::<_, Option<i64>>(16)?.map(PassId),
            resolved_pass: row.get::<_, Option<i64>>(17)?.map(PassId),
        },
        resource_kind,
        resolved_how: row.get(14)?,
        resolution: row.get(18)?,
    })
}

fn key_of(finding: &Finding) -> Key {
    (
        finding.node.clone(),
        finding.resource.kind.as_str().to_owned(),
        finding.resource.name.clone(),
        finding.kind.name().to_owned(),
        finding.field.clone(),
    )
}

fn record_key(record: &DriftRecord) -> Key {
    (
        record.node.clone(),
        record.resource.kind.as_str().to_owned(),
        record.resource.name.clone(),
        record.kind.clone(),
        record.field.clone(),
    )
}

impl Store {
    /// Records the findings of a pass on `node` (every node for `"*"`) at revision `commit`;
    /// open findings of that scope no longer reported are resolved as corrected.
    ///
    /// # Errors
    /// When the rows cannot be read or written; nothing is changed then.
    pub fn record_findings(
        &mut self,
        node: &str,
        commit: Option<&str>,
        now: SystemTime,
        findings: &[Finding],
    ) -> Result<DriftUpdate> {
        self.record_findings_with(node, commit, now, findings, |_| Resolution::Corrected)
    }

    /// [`Store::record_findings`], with `how` saying how each open finding that is no
    /// longer reported was resolved (e.g. `Gone` when its resource is no longer declared).
    ///
    /// # Errors
    /// When the rows cannot be read or written; nothing is changed then.
    pub fn record_findings_with(
        &mut self,
        node: &str,
        commit: Option<&str>,
        now: SystemTime,
        findings: &[Finding],
        how: impl Fn(&DriftRecord) -> Resolution,
    ) -> Result<DriftUpdate> {
        self.record_seen(None, node, commit, now, findings, how)
    }

    /// [`Store::record_findings_with`] for the findings of pass `pass`, which is kept as the
    /// pass that first saw a new finding, last saw an open one, and resolved one no longer
    /// reported. `commit` is the revision whose desired state the findings were made against
    /// (the enforced one).
    ///
    /// # Errors
    /// When the rows cannot be read or written; nothing is changed then.
    pub fn record_pass_findings(
        &mut self,
        pass: PassId,
        node: &str,
        commit: Option<&str>,
        now: SystemTime,
        findings: &[Finding],
        how: impl Fn(&DriftRecord) -> Resolution,
    ) -> Result<DriftUpdate> {
        self.record_seen(Some(pass), node, commit, now, findings, how)
    }

    /// Resolves the open `drift` findings of `resource` on `node` for `fields` as corrected
    /// by `pass` (its write of them succeeded). Returns how many were resolved.
    ///
    /// # Errors
    /// When the rows cannot be written; nothing is changed then.
    pub fn resolve_corrected<'f>(
        &mut self,
        pass: PassId,
        node: &str,
        resource: &ResourceId,
        fields: impl IntoIterator<Item = &'f str>,
        now: SystemTime,
    ) -> Result<usize> {
        let operation = "recording drift corrected by a pass";
        let query_error = self.query_error(operation);
        let tx = self.conn.transaction().map_err(&query_error)?;
        let mut resolved = 0;
        let how = Resolution::CorrectedByPass(pass);
        for field in fields {
            resolved += tx
                .execute(
                    "UPDATE drift_findings SET resolved_at = ?1, resolved_how = ?2, \
                     resolution = ?3, resolved_pass = ?4 WHERE resolved_at IS NULL \
                     AND node = ?5 AND resource_kind = ?6 AND resource_name = ?7 \
                     AND kind = ?8 AND field = ?9",
                    params![
                        to_millis(now),
                        how.as_str(),
                        how.stored_word(),
                        pass.0,
                        node,
                        resource.kind.as_str(),
                        resource.name,
                        FindingKind::Drift.name(),
                        field
                    ],
                )
                .map_err(&query_error)?;
        }
        tx.commit().map_err(&query_error)?;
        Ok(resolved)
    }

    /// The findings pass `pass` first saw, last saw or resolved, ordered by node, resource,
    /// kind and field. A finding seen by several passes is listed with the last of them
    /// only (and with the ones that opened and resolved it).
    ///
    /// # Errors
    /// When the query fails.
    pub fn findings_of_pass(&self, pass: PassId) -> Result<Vec<DriftRecord>> {
        let sql = format!(
            "SELECT {DRIFT_COLUMNS} FROM drift_findings WHERE first_seen_pass = ?1 \
             OR last_seen_pass = ?1 OR resolved_pass = ?1 \
             ORDER BY node, resource_kind, resource_name, kind, field, id"
        );
        self.query_drift("listing the findings of a pass", &sql, params![pass.0])
    }

    fn record_seen(
        &mut self,
        pass: Option<PassId>,
        node: &str,
        commit: Option<&str>,
        now: SystemTime,
        findings: &[Finding],
        how: impl Fn(&DriftRecord) -> Resolution,
    ) -> Result<DriftUpdate> {
        let pass = pass.map(|p| p.0);
        let operation = "recording drift findings";
        let open: BTreeMap<Key, DriftRecord> = self
            .open_findings(Some(node))?
            .into_iter()
            .map(|record| (record_key(&record), record))
            .collect();
        let unobserved: BTreeSet<(&str, &ResourceId)> = findings
            .iter()
            .filter(|f| f.kind == FindingKind::ObserveFailed)
            .map(|f| (f.node.as_str(), &f.resource))
            .collect();
        let now = to_millis(now);
        let query_error = self.query_error(operation);
        let tx = self.conn.transaction().map_err(&query_error)?;
        let mut update = DriftUpdate::default();
        let mut seen: BTreeMap<Key, i64> = BTreeMap::new();
        for finding in findings {
            let key = key_of(finding);
            let existing = seen
                .get(&key)
                .copied()
                .or_else(|| open.get(&key).map(|record| record.id));
            let (desired, observed, message) = (
                redact(&finding.desired),
                redact(&finding.observed),
                redact(&finding.message),
            );
            match existing {
                Some(id) => {
                    tx.execute(
                        "UPDATE drift_findings SET last_seen_commit = ?2, last_seen_at = ?3, \
                         desired = ?4, observed = ?5, message = ?6, \
                         last_seen_pass = coalesce(?7, last_seen_pass) WHERE id = ?1",
                        params![id, commit, now, desired, observed, message, pass],
                    )
                    .map_err(&query_error)?;
                    if seen.insert(key, id).is_none() {
                        update.still_open += 1;
                    }
                }
                None => {
                    tx.execute(
                        "INSERT INTO drift_findings (node, resource_kind, resource_name, kind, \
                         field, desired, observed, message, first_seen_commit, first_seen_at, \
                         last_seen_commit, last_seen_at, first_seen_pass, last_seen_pass) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?9, ?10, ?11, ?11)",
                        params![
                            key.0, key.1, key.2, key.3, key.4, desired, observed, message, commit,
                            now, pass
                        ],
                    )
                    .map_err(&query_error)?;
                    seen.insert(key, tx.last_insert_rowid());
                    update.opened += 1;
                }
            }
        }
        for (key, record) in &open {
            if seen.contains_key(key) || unobserved.contains(&(&record.node, &record.resource)) {
                continue;
            }
            let resolution = how(record);
            tx.execute(
                "UPDATE drift_findings SET resolved_at = ?2, resolved_how = ?3, \
                 resolution = ?4, resolved_pass = ?5 WHERE id = ?1",
                params![
                    record.id,
                    now,
                    resolution.as_str(),
                    resolution.stored_word(),
                    resolution.pass().map(|p| p.0).or(pass)
                ],
            )
            .map_err(&query_error)?;
            update.resolved += 1;
        }
        tx.commit().map_err(&query_error)?;
        Ok(update)
    }

    /// Open findings on `node`, or on every node (`None` or `"*"`), ordered by node,
    /// resource, kind and field.
    ///
    /// # Errors
    /// When the query fails.
    pub fn open_findings(&self, node: Option<&str>) -> Result<Vec<DriftRecord>> {
        let node = node.unwrap_or(ALL_NODES);
        let sql = format!(
            "SELECT {DRIFT_COLUMNS} FROM drift_findings WHERE resolved_at IS NULL \
             AND (?1 = ?2 OR node = ?1) \
             ORDER BY node, resource_kind, resource_name, kind, field"
        );
        self.query_drift("listing open findings", &sql, params![node, ALL_NODES])
    }

    /// The latest `limit` resolved findings on `node`, or on every node, newest first.
    ///
    /// # Errors
    /// When the query fails.
    pub fn recent_resolved(&self, node: Option<&str>, limit: usize) -> Result<Vec<DriftRecord>> {
        let node = node.unwrap_or(ALL_NODES);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT {DRIFT_COLUMNS} FROM drift_findings WHERE resolved_at IS NOT NULL \
             AND (?1 = ?2 OR node = ?1) ORDER BY resolved_at DESC, id DESC LIMIT ?3"
        );
        self.query_drift(
            "listing resolved findings",
            &sql,
            params![node, ALL_NODES, limit],
        )
    }

    pub(crate) fn query_drift(
        &self,
        operation: &'static str,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<DriftRecord>> {
        let query_error = self.query_error(operation);
        let mut statement = self.conn.prepare_cached(sql).map_err(&query_error)?;
        let raws = statement
            .query_map(params, raw_drift)
            .map_err(&query_error)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(&query_error)?;
        raws.into_iter()
            .map(|raw| {
                let mut record = raw.record;
                record.resource.kind = raw
                    .resource_kind
                    .parse()
                    .map_err(|_| self.corrupt(operation, raw.resource_kind.clone()))?;
                record.resolved_how = raw
                    .resolved_how
                    .map(|how| {
                        Resolution::from_stored(
                            &how,
                            raw.resolution.as_deref(),
                            record.resolved_pass,
                        )
                        .map_err(|v| self.corrupt(operation, v))
                    })
                    .transpose()?;
                Ok(record)
            })
            .collect()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use proxops_core::resource::Kind;

    use super::*;
    use crate::actions::tests::at;

    /// A finding as the planner makes them.
    pub(crate) fn finding(name: &str, node: &str, kind: FindingKind) -> Finding {
        Finding {
            resource: ResourceId::new(Kind::Iso, name),
            node: node.to_owned(),
            kind,
            field: String::new(),
            desired: "present".to_owned(),
            observed: "unknown".to_owned(),
            message: "storage local could not be listed; retried next pass".to_owned(),
        }
    }

    fn observe_failed(name: &str, node: &str) -> Finding {
        finding(name, node, FindingKind::ObserveFailed)
    }

    #[test]
    fn findings_are_first_seen_then_last_seen_then_resolved() {
        let mut store = Store::memory().unwrap();
        let f = observe_failed("debian", "pve1");

        let update = store
            .record_findings("pve1", Some("c1"), at(0), std::slice::from_ref(&f))
            .unwrap();
        assert_eq!(
            update,
            DriftUpdate {
                opened: 1,
                still_open: 0,
                resolved: 0
            }
        );

        let mut later = f.clone();
        later.observed = "HTTP 500".to_owned();
        let update = store
            .record_findings("pve1", Some("c2"), at(60), &[later])
            .unwrap();
        assert_eq!(
            update,
            DriftUpdate {
                opened: 0,
                still_open: 1,
                resolved: 0
            }
        );
        let open = store.open_findings(Some("pve1")).unwrap();
        assert_eq!(open.len(), 1);
        let record = &open[0];
        assert_eq!(record.resource, f.resource);
        assert_eq!(record.kind, "observe-failed");
        assert_eq!(record.observed, "HTTP 500");
        assert_eq!(
            (record.first_seen_commit.as_deref(), record.first_seen_at),
            (Some("c1"), at(0))
        );
        assert_eq!(
            (record.last_seen_commit.as_deref(), record.last_seen_at),
            (Some("c2"), at(60))
        );
        assert_eq!(record.resolved_at, None);

        let update = store
            .record_findings("pve1", Some("c2"), at(120), &[])
            .unwrap();
        assert_eq!(update.resolved, 1);
        assert!(store.open_findings(Some("pve1")).unwrap().is_empty());
        let resolved = store.recent_resolved(Some("pve1"), 10).unwrap();
        assert_eq!(resolved.len(), 1);
        assert_eq!(resolved[0].resolved_at, Some(at(120)));
        assert_eq!(resolved[0].resolved_how, Some(Resolution::Corrected));
        assert_eq!(resolved[0].first_seen_at, at(0));
    }

    #[test]
    fn a_finding_that_returns_after_resolution_is_a_new_record() {
        let mut store = Store::memory().unwrap();
        let f = observe_failed("debian", "pve1");
        store
            .record_findings("pve1", Some("c1"), at(0), std::slice::from_ref(&f))
            .unwrap();
        store
            .record_findings("pve1", Some("c1"), at(10), &[])
            .unwrap();
        store
            .record_findings("pve1", Some("c3"), at(20), &[f])
            .unwrap();
        let open = store.open_findings(None).unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].first_seen_at, at(20));
        assert_eq!(open[0].first_seen_commit.as_deref(), Some("c3"));
        assert_eq!(store.recent_resolved(None, 10).unwrap().len(), 1);
    }

    #[test]
    fn the_caller_says_how_a_finding_was_resolved() {
        let mut store = Store::memory().unwrap();
        let findings = [
            observe_failed("kept", "pve1"),
            observe_failed("removed", "pve1"),
        ];
        store
            .record_findings("pve1", Some("c1"), at(0), &findings)
            .unwrap();
        store
            .record_findings_with("pve1", Some("c2"), at(10), &[], |record| {
                if record.resource.name == "removed" {
                    Resolution::Gone
                } else {
                    Resolution::Corrected
                }
            })
            .unwrap();
        let resolved = store.recent_resolved(Some("pve1"), 10).unwrap();
        let how: BTreeMap<_, _> = resolved
            .iter()
            .map(|r| (r.resource.name.as_str(), r.resolved_how))
            .collect();
        assert_eq!(how["removed"], Some(Resolution::Gone));
        assert_eq!(how["kept"], Some(Resolution::Corrected));
    }

    fn drift(field: &str) -> Finding {
        Finding {
            resource: ResourceId::new(Kind::Vm, "web"),
            node: "pve1".to_owned(),
            kind: FindingKind::Drift,
            field: field.to_owned(),
            desired: "2048".to_owned(),
            observed: "4096".to_owned(),
            message: "memory differs".to_owned(),
        }
    }

    #[test]
    fn drift_a_pass_corrected_is_first_seen_and_resolved_by_that_pass() {
        let mut store = Store::memory().unwrap();
        let pass = store
            .begin_pass("pve1", Some("c1"), crate::Trigger::Poll, at(0))
            .unwrap();
        let fixed_in_pve = |_: &DriftRecord| Resolution::FixedInPve;
        store
            .record_pass_findings(
                pass,
                "pve1",
                Some("c1"),
                at(0),
                &[drift("memory"), drift("cores")],
                fixed_in_pve,
            )
            .unwrap();
        let web = ResourceId::new(Kind::Vm, "web");
        // Only the field the write carried is corrected; an unrelated resource is not.
        let other = ResourceId::new(Kind::Vm, "db");
        assert_eq!(
            store
                .resolve_corrected(pass, "pve1", &other, ["memory"], at(1))
                .unwrap(),
            0
        );
        assert_eq!(
            store
                .resolve_corrected(pass, "pve1", &web, ["memory"], at(1))
                .unwrap(),
            1
        );
        let resolved = store.recent_resolved(None, 10).unwrap();
        assert_eq!(resolved.len(), 1);
        let memory = &resolved[0];
        assert_eq!(memory.field, "memory");
        assert_eq!(memory.first_seen_pass, Some(pass));
        assert_eq!(memory.resolved_pass, Some(pass));
        assert_eq!(memory.resolved_how, Some(Resolution::CorrectedByPass(pass)));
        assert_eq!(
            memory.resolved_how.unwrap().to_string(),
            format!("corrected by pass {}", pass.0)
        );
        assert_eq!(memory.resolved_at, Some(at(1)));
        let open = store.open_findings(None).unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].field, "cores");
        assert_eq!(store.findings_of_pass(pass).unwrap().len(), 2);
    }

    #[test]
    fn open_drift_no_longer_reported_is_resolved_the_way_the_caller_says_by_the_pass_that_saw_it() {
        let mut store = Store::memory().unwrap();
        let first = store
            .begin_pass("pve1", Some("c1"), crate::Trigger::Poll, at(0))
            .unwrap();
        let then = |_: &DriftRecord| Resolution::Gone;
        store
            .record_pass_findings(
                first,
                "pve1",
                Some("c1"),
                at(0),
                &[drift("memory"), drift("cores")],
                then,
            )
            .unwrap();
        let second = store
            .begin_pass("pve1", Some("c1"), crate::Trigger::Poll, at(10))
            .unwrap();
        store
            .record_pass_findings(second, "pve1", Some("c1"), at(10), &[drift("cores")], then)
            .unwrap();
        let third = store
            .begin_pass("pve1", Some("c2"), crate::Trigger::Poll, at(20))
            .unwrap();
        store
            .record_pass_findings(third, "pve1", Some("c2"), at(20), &[], |r| {
                if r.last_seen_commit.as_deref() == Some("c2") {
                    Resolution::FixedInPve
                } else {
                    Resolution::ManifestChanged
                }
            })
            .unwrap();
        let resolved = store.recent_resolved(None, 10).unwrap();
        let by_field: BTreeMap<_, _> = resolved.iter().map(|r| (r.field.as_str(), r)).collect();
        let memory = by_field["memory"];
        assert_eq!(memory.resolved_how, Some(Resolution::Gone));
        assert_eq!(
            (
                memory.first_seen_pass,
                memory.last_seen_pass,
                memory.resolved_pass
            ),
            (Some(first), Some(first), Some(second))
        );
        let cores = by_field["cores"];
        assert_eq!(cores.resolved_how, Some(Resolution::ManifestChanged));
        assert_eq!(cores.resolved_how.unwrap().to_string(), "manifest changed");
        assert_eq!(
            (
                cores.first_seen_pass,
                cores.last_seen_pass,
                cores.resolved_pass
            ),
            (Some(first), Some(second), Some(third))
        );
        assert_eq!(Resolution::FixedInPve.to_string(), "fixed in PVE");
        assert_eq!(Resolution::FixedInPve.word(), "fixed-in-pve");
    }

    #[test]
    fn findings_of_other_nodes_are_left_alone() {
        let mut store = Store::memory().unwrap();
        store
            .record_findings("pve1", Some("c1"), at(0), &[observe_failed("a", "pve1")])
            .unwrap();
        store
            .record_findings("pve2", Some("c1"), at(0), &[observe_failed("a", "pve2")])
            .unwrap();
        store
            .record_findings("pve2", Some("c2"), at(10), &[])
            .unwrap();
        assert_eq!(store.open_findings(Some("pve1")).unwrap().len(), 1);
        assert!(store.open_findings(Some("pve2")).unwrap().is_empty());
        assert_eq!(store.open_findings(Some(ALL_NODES)).unwrap().len(), 1);
    }

    #[test]
    fn open_findings_of_a_resource_that_could_not_be_observed_stay_open() {
        let mut store = Store::memory().unwrap();
        // An earlier finding on the resource under another field (drift kinds come later;
        // any field other than the observe-failed one stands for them here).
        let mut earlier = observe_failed("debian", "pve1");
        earlier.field = "spec.checksum".to_owned();
        store
            .record_findings("pve1", Some("c1"), at(0), &[earlier])
            .unwrap();

        let update = store
            .record_findings(
                "pve1",
                Some("c2"),
                at(10),
                &[observe_failed("debian", "pve1")],
            )
            .unwrap();
        assert_eq!(
            update,
            DriftUpdate {
                opened: 1,
                still_open: 0,
                resolved: 0
            }
        );
        let open = store.open_findings(Some("pve1")).unwrap();
        assert_eq!(open.len(), 2);
        let kept = open.iter().find(|r| r.field == "spec.checksum").unwrap();
        assert_eq!(
            kept.last_seen_at,
            at(0),
            "not confirmed either: nobody looked"
        );
    }

    #[test]
    fn a_finding_reported_twice_in_one_pass_is_one_record() {
        let mut store = Store::memory().unwrap();
        let f = observe_failed("debian", "pve1");
        let update = store
            .record_findings("pve1", None, at(0), &[f.clone(), f])
            .unwrap();
        assert_eq!(update.opened, 1);
        assert_eq!(store.open_findings(None).unwrap().len(), 1);
    }
}
