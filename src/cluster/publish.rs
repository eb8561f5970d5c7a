//! The task that publishes this node's [`NodeStatus`] to `<dir>/status/<node>.json`: after
//! every pass ([`Publisher::pass_finished`] wakes it) and every `heartbeat` otherwise.
//!
//! It never blocks or fails a pass: it runs beside the loop, every filesystem call runs on
//! the blocking pool (a FUSE call on pmxcfs waits for the cluster), and a failed write is a
//! log line at most once a minute plus [`PublishState`] for the views. Without quorum the
//! write fails with `EACCES` (see [`super::fs`]); the state says `read_only` and the next
//! heartbeat simply tries again.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use proxops_store::{ActionOutcome, SharedStore};
use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::config::PmxcfsConfig;
use super::status_file::{Counts, FORMAT, MAX_FAILED, NodeStatus};
use crate::agent::status::LiveStatus;
use crate::error_chain::error_text;
use crate::timefmt::rfc3339;

/// How often a failing publish is logged.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// What the publisher needs from the configuration in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `[pmxcfs]`.
    pub pmxcfs: PmxcfsConfig,
    /// This agent's node (`None` for an agent of every node: it publishes nothing).
    pub node: Option<String>,
    /// The composition cluster followed.
    pub cluster: Option<String>,
}

/// How the last publish went, for the local views.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct PublishState {
    /// RFC 3339: the last successful write.
    pub published_at: Option<String>,
    /// Why the last write failed, if it did.
    pub error: Option<String>,
    /// The last write failed because `/etc/pve` takes no writes (no quorum).
    pub read_only: bool,
}

#[derive(Debug, Default)]
struct Inner {
    settings: Option<Settings>,
    state: PublishState,
    logged_at: Option<Instant>,
}

/// The publisher: configured at start and on every reload, woken after each pass.
#[derive(Debug, Default)]
pub struct Publisher {
    inner: Mutex<Inner>,
    wake: Notify,
}

impl Publisher {
    /// Sets the configuration in force (`None`: cluster mode off, or no single node).
    pub fn configure(&self, settings: Option<Settings>) {
        self.lock().settings = settings;
        self.wake.notify_one();
    }

    /// A pass ended: publish now.
    pub fn pass_finished(&self) {
        self.wake.notify_one();
    }

    /// The configuration in force.
    pub fn settings(&self) -> Option<Settings> {
        self.lock().settings.clone()
    }

    /// How the last publish went.
    pub fn state(&self) -> PublishState {
        self.lock().state.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Publishes after each pass and every heartbeat until `shutdown`.
    pub async fn run(
        self: Arc<Self>,
        store: SharedStore,
        live: Arc<LiveStatus>,
        shutdown: CancellationToken,
    ) {
        loop {
            let settings = self.lock().settings.clone();
            let heartbeat = settings
                .as_ref()
                .map_or(Duration::from_secs(30), |s| s.pmxcfs.heartbeat);
            if let Some((settings, node)) = settings
                .filter(|s| s.pmxcfs.publish)
                .and_then(|s| s.node.clone().map(|n| (s, n)))
            {
                self.publish(&settings, &node, &store, &live).await;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(heartbeat) => {}
            }
        }
    }

    async fn publish(
        &self,
        settings: &Settings,
        node: &str,
        store: &SharedStore,
        live: &Arc<LiveStatus>,
    ) {
        let settings = settings.clone();
        let node = node.to_owned();
        let store = store.clone();
        let live = live.clone();
        let path = settings.pmxcfs.status_file(&node);
        let written = tokio::task::spawn_blocking(move || {
            let doc = document(&settings, &node, &store, &live).map_err(|e| (false, e))?;
            super::fs::write_atomic(&path, &doc.encode()).map_err(|e| {
                let read_only = super::fs::is_read_only(&e);
                (read_only, format!("writing {}: {}", path.display(), e))
            })
        })
        .await
        .unwrap_or_else(|e| Err((false, format!("the publish task failed: {e}"))));
        let mut inner = self.lock();
        match written {
            Ok(()) => {
                if inner.state.error.is_some() {
                    tracing::info!("publishing the cluster status file works again");
                }
                inner.state = PublishState {
                    published_at: Some(rfc3339(SystemTime::now())),
                    error: None,
                    read_only: false,
                };
                inner.logged_at = None;
            }
            Err((read_only, error)) => {
                if inner.logged_at.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                    let hint = if read_only {
                        "; /etc/pve takes no writes (no quorum?): passes go on, the cluster view says unknown"
                    } else {
                        ""
                    };
                    tracing::warn!(error = %error, "cluster status file not published{hint}");
                    inner.logged_at = Some(Instant::now());
                }
                inner.state.error = Some(error);
                inner.state.read_only = read_only;
            }
        }
    }
}

/// This node's document now, from the store and the live status: the same facts
/// `/api/v1/status` shows, read here without the HTTP layer.
fn document(
    settings: &Settings,
    node: &str,
    store: &SharedStore,
    live: &LiveStatus,
) -> Result<NodeStatus, String> {
    let guard = store
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let read = || -> Result<NodeStatus, proxops_store::StoreError> {
        let last = guard.last_attempted(node)?;
        let applied = guard.last_applied(node)?;
        let rollout = live.rollout();
        let writes = crate::agent::window::writes_view(
            chrono::Utc::now(),
            &live.windows(),
            guard.freeze()?.as_ref(),
        )
        .with_rollout(rollout.as_ref());
        let failed = match &last {
            Some(pass) => guard
                .actions_of(pass.id)?
                .iter()
                .filter_map(|a| match &a.outcome {
                    Some(ActionOutcome::Failed { error }) => {
                        Some(format!("{} on {}: {error}", a.resource, a.node))
                    }
                    _ => None,
                })
                .take(MAX_FAILED + 1)
                .collect(),
            None => Vec::new(),
        };
        Ok(NodeStatus {
            format: FORMAT,
            node: node.to_owned(),
            cluster: settings.cluster.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            // Milliseconds: staleness is judged against a heartbeat of a few seconds.
            heartbeat_at: chrono::DateTime::<chrono::Utc>::from(SystemTime::now())
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            heartbeat_secs: settings.pmxcfs.heartbeat.as_secs(),
            applied_revision: applied.and_then(|p| p.commit),
            attempted_revision: last.as_ref().and_then(|p| p.commit.clone()),
            outcome: last
                .as_ref()
                .and_then(|p| p.outcome)
                .map(|o| o.as_str().to_owned()),
            pass_id: last.as_ref().map(|p| p.id.0),
            counts: last.as_ref().map_or_else(Counts::default, |p| Counts {
                ok: p.counts.actions_ok,
                failed: p.counts.actions_failed,
                skipped: p.counts.actions_skipped,
                findings: p.counts.findings,
            }),
            open_findings: guard.open_findings(None)?.len(),
            failed,
            truncated: false,
            read_only: live.breaker().read_only,
            frozen: writes.frozen.is_some(),
            stale: live.desired_stale(),
            held: writes.held,
            next_write_allowed: writes.next_allowed,
            rollout,
        })
    };
    read().map_err(|e| format!("reading the state database: {}", error_text(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxops_store::{PassCounts, PassOutcome, Store, Trigger};

    fn settings(dir: &std::path::Path) -> Settings {
        Settings {
            pmxcfs: PmxcfsConfig {
                dir: dir.join("proxops"),
                lock_dir: dir.join("priv/lock"),
                publish: true,
                heartbeat: Duration::from_secs(30),
            },
            node: Some("pve2".to_owned()),
            cluster: Some("lab".to_owned()),
        }
    }

    #[tokio::test]
    async fn a_finished_pass_is_published_with_its_commit_outcome_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::memory().unwrap();
        let pass = store
            .begin_pass("pve2", Some("c0ffee00"), Trigger::Poll, SystemTime::now())
            .unwrap();
        store
            .finish_pass(
                pass,
                PassOutcome::Applied,
                PassCounts {
                    actions_ok: 2,
                    ..PassCounts::default()
                },
                SystemTime::now(),
            )
            .unwrap();
        let store: SharedStore = Arc::new(Mutex::new(store));
        let live = Arc::new(LiveStatus::default());
        let publisher = Arc::new(Publisher::default());
        publisher.configure(Some(settings(dir.path())));
        let stop = CancellationToken::new();
        let task = tokio::spawn(publisher.clone().run(store, live, stop.clone()));
        let path = dir.path().join("proxops/status/pve2.json");
        let deadline = Instant::now() + Duration::from_secs(10);
        while publisher.state().published_at.is_none() {
            assert!(
                Instant::now() < deadline,
                "nothing published: {:?}",
                publisher.state()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.cancel();
        task.await.unwrap();
        let doc = NodeStatus::decode(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(doc.node, "pve2");
        assert_eq!(doc.cluster.as_deref(), Some("lab"));
        assert_eq!(doc.applied_revision.as_deref(), Some("c0ffee00"));
        assert_eq!(doc.outcome.as_deref(), Some("applied"));
        assert_eq!(doc.counts.ok, 2);
        assert_eq!(doc.heartbeat_secs, 30);
        assert_eq!(publisher.state().error, None);
    }

    #[tokio::test]
    async fn an_agent_of_every_node_or_publish_false_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store: SharedStore = Arc::new(Mutex::new(Store::memory().unwrap()));
        for settings in [
            Settings {
                node: None,
                ..settings(dir.path())
            },
            Settings {
                pmxcfs: PmxcfsConfig {
                    publish: false,
                    ..settings(dir.path()).pmxcfs
                },
                ..settings(dir.path())
            },
        ] {
            let publisher = Arc::new(Publisher::default());
            publisher.configure(Some(settings));
            let stop = CancellationToken::new();
            stop.cancel();
            publisher
                .clone()
                .run(store.clone(), Arc::new(LiveStatus::default()), stop)
                .await;
            assert_eq!(publisher.state(), PublishState::default());
        }
        assert!(!dir.path().join("proxops").exists());
    }
}
