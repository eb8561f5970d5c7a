//! Notifications (`[[notify]]`): after each pass, what the pass recorded is read back from
//! the store, turned into events ([`events::derive`], pure: the pass's record and what each
//! target was told before), rendered in each target's own format ([`format`](mod@format)) and queued for
//! that target's delivery task ([`deliver`]). Nothing here can block or fail a pass: the
//! store is read once after the pass is recorded, queueing never waits, and every delivery
//! happens in its own task.
//!
//! - [`config`]: the `[[notify]]` tables.
//! - [`events`]: which events a pass makes, with the de-duplication and flap rules.
//! - [`format`](mod@format): webhook, ntfy, Matrix, Slack and email payloads.
//! - [`deliver`]: bounded queues (oldest dropped), retry with backoff, rate limit, sending.

pub mod config;
pub mod deliver;
pub mod events;
pub mod format;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use proxops_store::{ActionOutcome, DriftRecord, SharedStore, Store};
use tokio_util::sync::CancellationToken;

use crate::error_chain::error_text;
use crate::metrics::Metrics;
use config::{Endpoint, Kind, NotifyTarget, topic_of};
use deliver::{Body, Deliverer, Outgoing, Queue};
use events::{ActionFact, Event, FindingFact, Memory, PassFacts};

/// How many resolved findings are read to say how an announced one went away.
const RESOLVED_LOOKBACK: usize = 200;

/// One target with its queue and memory.
struct Target {
    config: NotifyTarget,
    queue: Arc<Queue>,
    memory: Mutex<Memory>,
}

/// The notifier of one configuration: its targets' queues and memories, and their delivery
/// tasks (stopped when it is dropped, e.g. by a reload that builds a new one).
pub struct Notifier {
    targets: Vec<Target>,
    cluster: Option<String>,
    metrics: Arc<Metrics>,
    last_pass: Mutex<Option<i64>>,
    stop: CancellationToken,
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("targets", &self.targets.len())
            .finish_non_exhaustive()
    }
}

impl Notifier {
    /// Starts one delivery task per target (none without targets). The findings already open
    /// in `store` count as announced. Must be called within the tokio runtime.
    pub fn start(
        targets: &[NotifyTarget],
        store: &SharedStore,
        node_label: &str,
        cluster: Option<String>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let stop = CancellationToken::new();
        let open = if targets.is_empty() {
            Vec::new()
        } else {
            let store = store
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match store.open_findings(Some(node_label)) {
                Ok(open) => open.iter().map(finding_fact).collect(),
                Err(error) => {
                    tracing::error!(error = %error_text(&error), "reading open findings for notifications");
                    Vec::new()
                }
            }
        };
        let awaiting = if targets.is_empty() {
            None
        } else {
            awaiting_fact(
                &store
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
                node_label,
            )
            .ok()
            .flatten()
            .map(|a| a.digest)
        };
        let mut started = Vec::new();
        for target in targets {
            let http = match deliver::http_client(target) {
                Ok(http) => http,
                Err(error) => {
                    tracing::error!(notify = %target.label(), %error, "notification target disabled");
                    continue;
                }
            };
            let queue = Arc::new(Queue::default());
            let deliverer = Deliverer {
                node: node_label.to_owned(),
                target: target.clone(),
                queue: queue.clone(),
                metrics: metrics.clone(),
                http,
            };
            tokio::spawn(deliverer.run(stop.clone()));
            started.push(Target {
                config: target.clone(),
                queue,
                memory: Mutex::new(Memory::starting_with(&open).awaiting(awaiting.clone())),
            });
        }
        Self {
            targets: started,
            cluster,
            metrics,
            last_pass: Mutex::new(None),
            stop,
        }
    }

    /// Hands the pass just recorded on `node_label` to the targets: reads it back from the
    /// store, derives each target's events, and queues their messages. Never waits for a
    /// target; a pass already handed over (the store could not record a new one) is skipped.
    pub fn pass_finished(&self, store: &SharedStore, node_label: &str, read_only: bool) {
        if self.targets.is_empty() {
            return;
        }
        let facts = {
            let store = store
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            read_facts(&store, node_label, self.cluster.clone(), read_only)
        };
        let facts = match facts {
            Ok(Some(facts)) => facts,
            Ok(None) => return,
            Err(error) => {
                tracing::error!(error = %error_text(&error), "reading the pass for notifications");
                return;
            }
        };
        {
            let mut last = self
                .last_pass
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *last == Some(facts.pass) {
                return;
            }
            *last = Some(facts.pass);
        }
        let now = SystemTime::now();
        for target in &self.targets {
            let events = {
                let mut memory = target
                    .memory
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let (events, next) =
                    events::derive(&memory, &facts, now, target.config.flap_window);
                *memory = next;
                events
            };
            for event in events.iter().filter(|e| target.config.wants(e.kind)) {
                let message = Outgoing {
                    event: event.kind.as_str(),
                    body: body(&target.config, event),
                    id: next_id(),
                    queued_at: Instant::now(),
                };
                if let Some(dropped) = target.queue.push(message) {
                    self.metrics.notification(
                        target.config.index,
                        target.config.kind.as_str(),
                        "dropped",
                    );
                    tracing::warn!(
                        notify = %target.config.label(),
                        event = dropped.event,
                        capacity = deliver::QUEUE_CAPACITY,
                        "notification queue full; the oldest message was dropped"
                    );
                }
            }
        }
    }
}

/// The body of `event` in `target`'s format.
fn body(target: &NotifyTarget, event: &Event) -> Body {
    match (&target.endpoint, target.kind) {
        (Endpoint::Email(_), _) | (_, Kind::Email) => {
            let (subject, text, html) = format::email(event);
            Body::Email {
                subject,
                text,
                html,
            }
        }
        (Endpoint::Http(http), Kind::Ntfy) => Body::Json(format::ntfy(
            event,
            &topic_of(&http.url).unwrap_or_default(),
        )),
        (_, Kind::Matrix) => Body::Json(format::matrix(event)),
        (_, Kind::Slack) => Body::Json(format::slack(event)),
        (_, Kind::Webhook) => Body::Json(format::webhook(event)),
    }
}

/// The rate limit's summary in `target`'s format: `count` messages to `node`'s target were
/// not sent.
pub(crate) fn summary_body(target: &NotifyTarget, node: &str, count: u64) -> Body {
    let title = format!(
        "{node}: {count} notification(s) not sent: at most {} per minute (max_per_minute); \
         the agent's status page and /api/v1/drift keep what happened",
        target.max_per_minute
    );
    match (&target.endpoint, target.kind) {
        (Endpoint::Email(_), _) | (_, Kind::Email) => Body::Email {
            subject: format!("[proxops] {title}"),
            text: format!("{title}\n"),
            html: format!(
                "<!DOCTYPE html><html><body><p>{}</p></body></html>",
                format::escape_html(&title)
            ),
        },
        (Endpoint::Http(http), Kind::Ntfy) => Body::Json(serde_json::json!({
            "topic": topic_of(&http.url).unwrap_or_default(),
            "title": "proxops: notifications rate-limited",
            "message": title,
            "priority": 3,
            "tags": ["warning", "rate-limited"],
            "markdown": false,
        })),
        (_, Kind::Matrix) => Body::Json(serde_json::json!({
            "msgtype": "m.notice",
            "body": title,
            "format": "org.matrix.custom.html",
            "formatted_body": format::escape_html(&title),
        })),
        (_, Kind::Slack) => Body::Json(serde_json::json!({
            "text": format::escape_slack(&title),
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": format::escape_slack(&title)}}],
        })),
        (_, Kind::Webhook) => Body::Json(serde_json::json!({
            "version": format::WEBHOOK_VERSION,
            "event": "rate-limited",
            "title": title,
            "text": title,
            "node": node,
            "cluster": null,
            "suppressed": count,
            "pass": {"id": 0, "commit": null, "outcome": ""},
            "actions": [],
            "findings": [],
            "diagnostics": [],
            "error": null,
        })),
    }
}

/// A message id unique in this process and across restarts: `proxops-<start ms>-<n>`.
pub(crate) fn next_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let start = START.get_or_init(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    });
    format!(
        "proxops-{start}-{}",
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn finding_fact(record: &DriftRecord) -> FindingFact {
    FindingFact {
        node: record.node.clone(),
        resource: record.resource.to_string(),
        kind: record.kind.clone(),
        field: record.field.clone(),
        desired: record.desired.clone(),
        observed: record.observed.clone(),
        message: record.message.clone(),
        resolved_how: record.resolved_how.map(|h| h.as_str().to_owned()),
    }
}

/// One diagnostic of the stored JSON as `path:line:col: error: field: message`.
fn diagnostic_line(value: &serde_json::Value) -> String {
    let text = |key: &str| value[key].as_str().unwrap_or_default().to_owned();
    let number = |key: &str| value[key].as_u64().unwrap_or(0);
    let mut line = format!(
        "{}:{}:{}: {}: ",
        text("path"),
        number("line"),
        number("column"),
        value["severity"].as_str().unwrap_or("error").to_lowercase()
    );
    let field = text("field");
    if !field.is_empty() {
        line.push_str(&field);
        line.push_str(": ");
    }
    line.push_str(&text("message"));
    line
}

/// The latest finished pass on `node_label` with its actions, diagnostics and the store's
/// findings; `None` when the latest pass is still running (or there is none).
fn read_facts(
    store: &Store,
    node_label: &str,
    cluster: Option<String>,
    read_only: bool,
) -> Result<Option<PassFacts>, proxops_store::StoreError> {
    let Some(pass) = store.recent_passes(Some(node_label), 1)?.pop() else {
        return Ok(None);
    };
    let Some(outcome) = pass.outcome else {
        return Ok(None);
    };
    let actions = store
        .actions_of(pass.id)?
        .into_iter()
        .map(|a| {
            let (result, error) = match &a.outcome {
                Some(ActionOutcome::Succeeded { .. }) => ("succeeded", None),
                Some(ActionOutcome::Failed { error }) => ("failed", Some(error.clone())),
                Some(ActionOutcome::Skipped { reason }) => ("skipped", Some(reason.clone())),
                None => ("running", None),
            };
            ActionFact {
                resource: a.resource.to_string(),
                node: a.node,
                verb: a.verb,
                reason: a.reason,
                result: result.to_owned(),
                error,
                upid: a.upid,
                risk: a.risk.map(|r| r.name().to_owned()),
                backup: a.backup_volid,
            }
        })
        .collect();
    // Through JSON: the stored diagnostics read back as `Diagnostic`s serialise to the
    // fields `diagnostic_line` reads, whichever form the store hands them in.
    let diagnostics = serde_json::to_value(store.pass_diagnostics(pass.id)?)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(diagnostic_line)
        .collect();
    let open = store
        .open_findings(Some(node_label))?
        .iter()
        .map(finding_fact)
        .collect();
    let resolved = store
        .recent_resolved(Some(node_label), RESOLVED_LOOKBACK)?
        .iter()
        .map(finding_fact)
        .collect();
    Ok(Some(PassFacts {
        pass: pass.id.0,
        node: pass.node,
        cluster,
        commit: pass.commit,
        outcome: outcome.as_str().to_owned(),
        trigger: pass.trigger.as_str().to_owned(),
        actions,
        diagnostics,
        error: pass.notes.error,
        stale: pass.notes.desired_stale,
        source_error: pass.notes.source_error,
        read_only,
        open,
        resolved,
        awaiting: awaiting_fact(store, node_label)?,
    }))
}

/// The change held for approval on `node_label` that nobody decided on yet.
fn awaiting_fact(
    store: &proxops_store::Store,
    node_label: &str,
) -> Result<Option<events::AwaitingFact>, proxops_store::StoreError> {
    let Some(open) = store
        .open_approval(node_label)?
        .filter(|a| a.state == proxops_store::ApprovalState::Awaiting)
    else {
        return Ok(None);
    };
    let actions: Vec<serde_json::Value> = serde_json::from_str(&open.actions).unwrap_or_default();
    let text = |a: &serde_json::Value, key: &str| a[key].as_str().unwrap_or_default().to_owned();
    Ok(Some(events::AwaitingFact {
        pass: open.pass.0,
        digest: open.digest.clone(),
        why: open.why.clone(),
        actions: actions
            .iter()
            .map(|a| ActionFact {
                resource: crate::agent::approval::resource_text(a),
                node: text(a, "node"),
                verb: a["verb"]["verb"].as_str().unwrap_or_default().to_owned(),
                reason: text(a, "reason"),
                result: "skipped".to_owned(),
                error: Some(format!("awaiting approval ({})", open.why)),
                upid: None,
                risk: a["risk"].as_str().map(str::to_owned),
                backup: None,
            })
            .collect(),
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::notify::config::{EventKind, HttpTarget};
    use crate::notify::events::Event;

    fn target(kind: Kind, url: &str) -> NotifyTarget {
        NotifyTarget {
            index: 0,
            kind,
            events: EventKind::ALL.into_iter().collect(),
            endpoint: Endpoint::Http(HttpTarget {
                url: reqwest::Url::parse(url).unwrap(),
                token: None,
                room: Some("!r:example.org".into()),
            }),
            ca_file: None,
            max_per_minute: 3,
            flap_window: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn the_rate_limit_summary_to_a_webhook_has_every_field_of_the_document() {
        let event = Event {
            kind: EventKind::Applied,
            pass: 1,
            node: "pve1".into(),
            cluster: None,
            commit: None,
            outcome: "applied".into(),
            actions: Vec::new(),
            findings: Vec::new(),
            diagnostics: Vec::new(),
            error: None,
            approval: None,
        };
        let keys = |v: &serde_json::Value| -> BTreeSet<String> {
            v.as_object().unwrap().keys().cloned().collect()
        };
        let document = format::webhook(&event);
        let Body::Json(summary) = summary_body(&target(Kind::Webhook, "http://h/x"), "pve1", 7)
        else {
            panic!("json");
        };
        assert!(keys(&summary).is_superset(&keys(&document)), "{summary}");
        assert_eq!(summary["suppressed"], 7);
        assert_eq!(summary["event"], "rate-limited");
        assert!(
            summary["title"]
                .as_str()
                .unwrap()
                .starts_with("pve1: 7 notification(s) not sent")
        );
    }

    #[test]
    fn the_rate_limit_summary_to_ntfy_names_the_topic() {
        let Body::Json(summary) = summary_body(&target(Kind::Ntfy, "http://h/alerts"), "pve1", 2)
        else {
            panic!("json");
        };
        assert_eq!(summary["topic"], "alerts");
        assert!(
            summary["message"]
                .as_str()
                .unwrap()
                .contains("at most 3 per minute")
        );
    }

    #[test]
    fn stored_diagnostics_read_back_as_located_lines() {
        let value = serde_json::json!({"path": "vm/a.yaml", "line": 3, "column": 9,
            "severity": "Error", "field": "spec.memory", "message": "not a size", "help": null});
        assert_eq!(
            diagnostic_line(&value),
            "vm/a.yaml:3:9: error: spec.memory: not a size"
        );
    }
}
