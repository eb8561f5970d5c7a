//! Prometheus metrics (`proxops_*`), rendered through our own router (no exporter server).
//!
//! Counters the loop increments (passes, actions, durations) plus values read at scrape time
//! (last applied time per node, open drift findings, PVE requests, webhook deliveries,
//! staleness).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    verb: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabel {
    verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NotificationLabels {
    target: String,
    kind: String,
    result: String,
}

/// The agent's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    passes: Family<OutcomeLabel, Counter>,
    actions: Family<ActionLabels, Counter>,
    action_seconds: Family<VerbLabel, Histogram>,
    last_applied: Family<NodeLabel, Gauge>,
    drift_open: Gauge,
    desired_stale: Gauge,
    read_only: Gauge,
    write_failures: Gauge,
    pve_requests: Counter,
    pve_writes: Counter,
    webhooks: Family<ResultLabel, Counter>,
    notifications: Family<NotificationLabels, Counter>,
    seen_requests: AtomicU64,
    seen_writes: AtomicU64,
    seen_webhooks: Mutex<[u64; 4]>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("proxops");
        let passes = Family::<OutcomeLabel, Counter>::default();
        registry.register("passes", "Reconcile passes by outcome", passes.clone());
        let actions = Family::<ActionLabels, Counter>::default();
        registry.register(
            "actions",
            "Actions run, by verb and result",
            actions.clone(),
        );
        let action_seconds = Family::<VerbLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.05, 2.0, 14))
        });
        registry.register(
            "action_duration_seconds",
            "Action durations, PVE task included",
            action_seconds.clone(),
        );
        let last_applied = Family::<NodeLabel, Gauge>::default();
        registry.register(
            "last_applied_timestamp_seconds",
            "When a revision was last applied (or found in sync), per node",
            last_applied.clone(),
        );
        let drift_open = Gauge::default();
        registry.register(
            "drift_findings_open",
            "Open drift findings",
            drift_open.clone(),
        );
        let desired_stale = Gauge::default();
        registry.register(
            "desired_stale",
            "1 when git could not be fetched and the last good revision is in force",
            desired_stale.clone(),
        );
        let read_only = Gauge::default();
        registry.register(
            "read_only",
            "1 while the write circuit breaker holds writes back (open or half-open)",
            read_only.clone(),
        );
        let write_failures = Gauge::default();
        registry.register(
            "write_breaker_consecutive_failures",
            "Consecutive failed PVE writes counted by the write circuit breaker",
            write_failures.clone(),
        );
        let pve_requests = Counter::default();
        registry.register(
            "pve_requests",
            "HTTP requests sent to PVE (retries included)",
            pve_requests.clone(),
        );
        let pve_writes = Counter::default();
        registry.register(
            "pve_writes",
            "Non-GET requests sent to PVE",
            pve_writes.clone(),
        );
        let webhooks = Family::<ResultLabel, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Webhook deliveries by result",
            webhooks.clone(),
        );
        let notifications = Family::<NotificationLabels, Counter>::default();
        registry.register(
            "notifications",
            "Notifications by target ([[notify]] index), kind and result: sent, failed (given \
             up after retries or refused), dropped (queue full), rate-limited",
            notifications.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            passes,
            actions,
            action_seconds,
            last_applied,
            drift_open,
            desired_stale,
            read_only,
            write_failures,
            pve_requests,
            pve_writes,
            webhooks,
            notifications,
            seen_requests: AtomicU64::new(0),
            seen_writes: AtomicU64::new(0),
            seen_webhooks: Mutex::new([0; 4]),
        }
    }
}

impl Metrics {
    /// Counts a finished pass.
    pub fn pass(&self, outcome: &str) {
        self.passes
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Counts a finished action and its duration.
    pub fn action(&self, verb: &str, result: &str, seconds: f64) {
        self.actions
            .get_or_create(&ActionLabels {
                verb: verb.to_owned(),
                result: result.to_owned(),
            })
            .inc();
        self.action_seconds
            .get_or_create(&VerbLabel {
                verb: verb.to_owned(),
            })
            .observe(seconds);
    }

    /// Counts a notification for `[[notify]]` table `target` of `kind` by `result` (`sent`,
    /// `failed`, `dropped`, `rate-limited`).
    pub fn notification(&self, target: usize, kind: &str, result: &str) {
        self.notifications
            .get_or_create(&NotificationLabels {
                target: target.to_string(),
                kind: kind.to_owned(),
                result: result.to_owned(),
            })
            .inc();
    }

    /// Values read at scrape time.
    pub fn set_scraped(&self, scraped: &Scraped) {
        for (node, at) in &scraped.last_applied {
            self.last_applied
                .get_or_create(&NodeLabel { node: node.clone() })
                .set(*at);
        }
        self.drift_open.set(scraped.drift_open);
        self.desired_stale.set(i64::from(scraped.desired_stale));
        self.read_only.set(i64::from(scraped.read_only));
        self.write_failures.set(scraped.write_failures);
        let delta =
            |seen: &AtomicU64, now: u64| now.saturating_sub(seen.swap(now, Ordering::SeqCst));
        self.pve_requests
            .inc_by(delta(&self.seen_requests, scraped.pve_requests));
        self.pve_writes
            .inc_by(delta(&self.seen_writes, scraped.pve_writes));
        let mut seen = self
            .seen_webhooks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (i, (name, now)) in scraped.webhooks.iter().enumerate() {
            let d = now.saturating_sub(seen[i]);
            seen[i] = *now;
            self.webhooks
                .get_or_create(&ResultLabel {
                    result: (*name).to_owned(),
                })
                .inc_by(d);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

/// Values gathered when `/metrics` is scraped.
#[derive(Debug, Default)]
pub struct Scraped {
    /// (node, unix seconds) of the last applied pass.
    pub last_applied: Vec<(String, i64)>,
    /// Open drift findings.
    pub drift_open: i64,
    /// Git fetch failing.
    pub desired_stale: bool,
    /// The write circuit breaker holds writes back.
    pub read_only: bool,
    /// Consecutive failed writes the breaker counted.
    pub write_failures: i64,
    /// The PVE client's request counter.
    pub pve_requests: u64,
    /// The PVE client's write counter.
    pub pve_writes: u64,
    /// Webhook counters: accepted, rejected, ignored, coalesced.
    pub webhooks: [(&'static str, u64); 4],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_with_the_proxops_prefix() {
        let metrics = Metrics::default();
        metrics.pass("applied");
        metrics.action("download", "succeeded", 0.3);
        metrics.set_scraped(&Scraped {
            last_applied: vec![("pve1".into(), 1_700_000_000)],
            drift_open: 2,
            desired_stale: true,
            read_only: true,
            write_failures: 20,
            pve_requests: 10,
            ..Scraped::default()
        });
        let text = metrics.render();
        assert!(
            text.contains("proxops_passes_total{outcome=\"applied\"} 1"),
            "{text}"
        );
        assert!(text.contains("proxops_actions_total{verb=\"download\",result=\"succeeded\"} 1"));
        assert!(text.contains("proxops_last_applied_timestamp_seconds{node=\"pve1\"} 1700000000"));
        assert!(text.contains("proxops_drift_findings_open 2"));
        assert!(text.contains("proxops_pve_requests_total 10"));
        assert!(text.contains("proxops_desired_stale 1"), "{text}");
        assert!(text.contains("proxops_read_only 1"), "{text}");
        assert!(text.contains("proxops_write_breaker_consecutive_failures 20"));
    }

    #[test]
    fn counters_read_at_scrape_time_only_grow_by_the_difference() {
        let metrics = Metrics::default();
        for requests in [10, 15] {
            metrics.set_scraped(&Scraped {
                pve_requests: requests,
                ..Scraped::default()
            });
        }
        assert!(metrics.render().contains("proxops_pve_requests_total 15"));
    }
}
