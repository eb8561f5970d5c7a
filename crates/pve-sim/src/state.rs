//! The state shared by the server, the handlers and the task runner: settings, the cluster
//! behind one mutex, faults, the request log, and the task tracker and cancellation token
//! used for graceful shutdown.
//!
//! Locks are plain `std::sync::Mutex`es held only for short synchronous sections, never
//! across an `.await`.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cluster::Cluster;
use crate::faults::Faults;
use crate::request_log::RequestLog;

/// Settings fixed at start.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) task_duration: Duration,
    pub(crate) task_durations: BTreeMap<String, Duration>,
    pub(crate) proxy_timeout: Duration,
    pub(crate) disk_import_duration: Duration,
    pub(crate) lock_timeout: Duration,
    pub(crate) auth_failure_delay: Duration,
    pub(crate) validate: bool,
    pub(crate) fingerprint: Option<String>,
}

/// Shared state.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) settings: Settings,
    cluster: Mutex<Cluster>,
    faults: Mutex<Faults>,
    log: Mutex<RequestLog>,
    pub(crate) tracker: TaskTracker,
    pub(crate) cancel: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Settings {
    /// How long a task of `kind` runs: its own duration, else the common one.
    pub(crate) fn task_duration_of(&self, kind: &str) -> Duration {
        self.task_durations
            .get(kind)
            .copied()
            .unwrap_or(self.task_duration)
    }
}

impl Shared {
    pub(crate) fn new(settings: Settings, cluster: Cluster) -> Self {
        Self {
            settings,
            cluster: Mutex::new(cluster),
            faults: Mutex::new(Faults::default()),
            log: Mutex::new(RequestLog::default()),
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
        }
    }

    /// The cluster, with the ACL seeing the pools' members as they are now (PVE reads
    /// `user.cfg`, pools and ACL together, at the start of each request).
    pub(crate) fn cluster(&self) -> MutexGuard<'_, Cluster> {
        let mut cluster = lock(&self.cluster);
        cluster.sync_pool_acl();
        cluster
    }

    pub(crate) fn faults(&self) -> MutexGuard<'_, Faults> {
        lock(&self.faults)
    }

    pub(crate) fn log(&self) -> MutexGuard<'_, RequestLog> {
        lock(&self.log)
    }
}
