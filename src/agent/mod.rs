//! The agent: follows the repository and keeps PVE in the declared state, one pass at a
//! time, triggered by its schedule, webhooks and signals.
//!
//! - [`schedule`]: when to look again (interval or cron, with jitter).
//! - [`retry`]: the one place that turns a pass's verdict into the next delay.
//! - [`pass`]: one recorded pass (fetch → validate → observe and plan → gate and execute →
//!   record).
//! - [`breaker`], [`gate`]: the write circuit breaker and what it lets a pass write.
//! - [`status`]: the live view shared with the HTTP API.
//! - [`notify`]: readiness, reload and stop notifications to systemd (`Type=notify`).
//! - [`lock`]: one agent per state directory.
//!
//! Start-up order (SECURITY-AUDIT.md M6): the config is read, then the state directory's
//! lock is the first thing taken, then the listeners are bound, and only then are the state
//! database (and its unfinished passes) and the git mirror (and its stale lock files) touched.
//! A second agent on the same state directory, or on a taken port, thus stops before it can
//! change anything the running agent owns.
//!
//! The loop starts with a pass at once (the Go program waited one interval), re-attaches
//! first to PVE tasks a previous run started but never saw finish, and then waits for the
//! next trigger. Webhook nudges go through a channel of capacity one: while a pass runs,
//! any number of deliveries coalesce into exactly one more pass.

pub mod breaker;
pub mod gate;
pub mod lock;
pub mod notify;
pub mod pass;
pub mod retry;
pub mod schedule;
pub mod status;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use proxops_pve::{PveClient, Upid, wait_for_task};
use proxops_store::{ActionOutcome, SharedStore, Store, Trigger};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{AgentConfig, NodeScope};
use crate::http::metrics::Metrics;
use crate::http::serve::{Limits, ListenerCounts};
use crate::http::{self, HttpState};
use crate::observe::error_text;
use crate::reconcile::{Context, PlanOptions};
use crate::source::git::GitSource;
use crate::webhook::{Nudge, WebhookState};
use pass::PassDeps;
use retry::Backoff;
use schedule::Schedule;

/// The agent could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration could not be loaded (the error names the file).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The agent needs a `[source]`.
    #[error("{}: [source] url is required to run the agent", .0.display())]
    NoSource(PathBuf),
    /// The git source could not be set up.
    #[error("setting up the git source")]
    Source(#[source] crate::source::git::SourceError),
    /// The state database could not be opened.
    #[error("opening the state database")]
    Store(#[source] proxops_store::StoreError),
    /// The PVE client could not be built.
    #[error("setting up the PVE client for {0}")]
    Pve(String, #[source] proxops_pve::PveError),
    /// Another agent holds the state directory, or it could not be locked.
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    /// The HTTP listener could not be bound.
    #[error("listening on {0}")]
    Listen(SocketAddr, #[source] std::io::Error),
    /// The webhook listener (`[webhook] listen`) could not be bound.
    #[error("listening for webhooks on {0}")]
    WebhookListen(SocketAddr, #[source] std::io::Error),
    /// The bound address could not be written to `state_dir`.
    #[error("writing the listener's address to {}", .0.display())]
    HttpAddr(PathBuf, #[source] std::io::Error),
    /// The poll schedule is invalid.
    #[error("the poll schedule")]
    Schedule(#[source] schedule::ScheduleError),
}

/// Path of the state database inside `state_dir`.
pub fn database_path(state_dir: &Path) -> PathBuf {
    state_dir.join("state.db")
}

/// Path of the file inside `state_dir` that holds the address the status API listens on,
/// as `127.0.0.1:PORT` and a newline: how `proxops status` and tests find an agent whose
/// `[http] listen` has port 0 (any free port).
pub fn http_addr_path(state_dir: &Path) -> PathBuf {
    state_dir.join("http.addr")
}

/// Path of the file inside `state_dir` that holds the address the webhook listener (`[webhook]
/// listen`) is bound to, as [`http_addr_path`] does for the status API.
pub fn webhook_addr_path(state_dir: &Path) -> PathBuf {
    state_dir.join("webhook.addr")
}

/// Writes `addr` to `path` in `state_dir` atomically (a temporary file renamed over it), so a
/// reader sees the previous address or the new one, never a partial line.
fn write_addr(state_dir: &Path, path: PathBuf, addr: SocketAddr) -> Result<(), AgentError> {
    let temporary = state_dir.join(format!(
        "{}.tmp",
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    ));
    std::fs::write(&temporary, format!("{addr}\n"))
        .and_then(|()| std::fs::rename(&temporary, &path))
        .map_err(|e| AgentError::HttpAddr(path, e))
}

/// The node label passes are recorded under.
pub fn node_label(scope: &NodeScope) -> String {
    match scope {
        NodeScope::Node(node) => node.clone(),
        NodeScope::All => "*".to_owned(),
    }
}

struct Running {
    deps: PassDeps,
    schedule: Schedule,
}

/// What survives a configuration reload.
#[derive(Clone)]
struct Kept {
    store: SharedStore,
    live: Arc<status::LiveStatus>,
    interrupt: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    breaker: Arc<Mutex<breaker::Breaker>>,
}

fn build(config: &AgentConfig, config_path: &Path, kept: Kept) -> Result<Running, AgentError> {
    let source_config = config
        .source
        .as_ref()
        .ok_or_else(|| AgentError::NoSource(config_path.to_path_buf()))?;
    let source = GitSource::open(source_config, &config.state_dir).map_err(AgentError::Source)?;
    let pve = PveClient::new(config.pve.client_config())
        .map_err(|e| AgentError::Pve(config.pve.url.clone(), e))?;
    let schedule = Schedule::new(&source_config.poll).map_err(AgentError::Schedule)?;
    let context = Context::from_config(pve, config.node.clone(), config);
    kept.breaker
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .reconfigure(
            config.policy.write_breaker_threshold,
            config.policy.write_breaker_cool_down,
        );
    Ok(Running {
        deps: PassDeps {
            context,
            source: Arc::new(source),
            store: kept.store,
            live: kept.live,
            cluster: config.cluster.clone(),
            node_label: node_label(&config.node),
            interrupt: kept.interrupt,
            metrics: kept.metrics,
            breaker: kept.breaker,
            plan_options: PlanOptions::from_config(config),
        },
        schedule,
    })
}

/// Runs the agent until `shutdown` fires (SIGTERM/SIGINT in the binary). `reload` fires on
/// SIGHUP: the config is read again and used from the next pass on.
///
/// # Errors
/// Start-up failures; once running, pass failures are recorded, not returned.
pub async fn run(
    config_path: &Path,
    shutdown: CancellationToken,
    mut reload: mpsc::Receiver<()>,
) -> Result<(), AgentError> {
    let config = AgentConfig::load(config_path)?;
    // First: nothing in the state directory is opened before this agent owns it.
    let state_lock = lock::lock_state_dir(&config.state_dir)?;
    tracing::debug!(lock = %state_lock.path().display(), "state directory locked");
    warn_about_exposure(&config);
    // `listen` may have port 0: what counts from here on is the address actually bound.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| AgentError::Listen(config.listen, e))?;
    let listen = listener
        .local_addr()
        .map_err(|e| AgentError::Listen(config.listen, e))?;
    let webhook_listener = match config.webhook.as_ref().and_then(|w| w.listen) {
        Some(address) => {
            let bound = tokio::net::TcpListener::bind(address)
                .await
                .map_err(|e| AgentError::WebhookListen(address, e))?;
            let local = bound
                .local_addr()
                .map_err(|e| AgentError::WebhookListen(address, e))?;
            Some((bound, local))
        }
        None => None,
    };

    let store = Store::open(&database_path(&config.state_dir)).map_err(AgentError::Store)?;
    let store: SharedStore = Arc::new(Mutex::new(store));
    {
        let mut guard = store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Ok(recovered) = guard.recover_unfinished(SystemTime::now())
            && !recovered.is_empty()
        {
            tracing::warn!(
                passes = recovered.len(),
                "passes left unfinished by the last run are recorded as interrupted"
            );
        }
    }
    let live = Arc::new(status::LiveStatus::default());
    let interrupt = Arc::new(AtomicBool::new(false));
    let metrics = Arc::new(Metrics::default());
    let kept = Kept {
        store: store.clone(),
        live: live.clone(),
        interrupt: interrupt.clone(),
        metrics: metrics.clone(),
        breaker: Arc::new(Mutex::new(breaker::Breaker::new(
            config.policy.write_breaker_threshold,
            config.policy.write_breaker_cool_down,
        ))),
    };
    let mut running = build(&config, config_path, kept.clone())?;

    let (nudge_tx, mut nudge_rx) = mpsc::channel::<Nudge>(1);
    let webhook = config.webhook.as_ref().map(|w| {
        let branch = config
            .source
            .as_ref()
            .map_or_else(|| "main".to_owned(), |s| s.branch.clone());
        WebhookState::new(w.secret.clone(), branch, nudge_tx.clone())
    });
    let http_state = HttpState {
        live: live.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
        pve: running.deps.context.pve.clone(),
        webhook_metrics: webhook.as_ref().map(|w| w.metrics.clone()),
        node_label: running.deps.node_label.clone(),
    };
    write_addr(&config.state_dir, http_addr_path(&config.state_dir), listen)?;
    let access = http::access::Access::from_config(&config, config_path);
    let mut servers = Vec::new();
    if let Some(webhook) = &webhook {
        servers.push(tokio::spawn(crate::webhook::report_rejections(
            webhook.clone(),
            shutdown.clone(),
        )));
    }
    let (shared_webhook, own_webhook) = match webhook_listener {
        Some(bound) => (None, webhook.map(|w| (w, bound))),
        None => (webhook, None),
    };
    if let Some((webhook, (bound, local))) = own_webhook {
        write_addr(
            &config.state_dir,
            webhook_addr_path(&config.state_dir),
            local,
        )?;
        tracing::info!(listen = %local, "webhook listener started");
        servers.push(tokio::spawn(http::serve::serve(
            bound,
            crate::webhook::router(webhook),
            Limits::WEBHOOK,
            Arc::new(ListenerCounts::default()),
            shutdown.clone(),
        )));
    }
    tracing::info!(%listen, node = %running.deps.node_label, "agent started");
    servers.push(tokio::spawn(http::serve::serve(
        listener,
        http::router(http_state, shared_webhook, access),
        Limits::STATUS,
        Arc::new(ListenerCounts::default()),
        shutdown.clone(),
    )));
    let interrupt_on_shutdown = {
        let shutdown = shutdown.clone();
        let interrupt = interrupt.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            notify::stopping();
            interrupt.store(true, Ordering::SeqCst);
        })
    };

    // Ready before re-attaching: waiting for a previous run's tasks may outlast systemd's
    // start timeout, and the status API already answers.
    notify::ready(listen);
    reattach(&running.deps, &shutdown).await;

    let mut backoff = Backoff::default();
    let mut trigger = Trigger::Startup;
    loop {
        let verdict = pass::run_pass(&running.deps, trigger, &shutdown).await;
        if let Some(last) = live.last() {
            metrics.pass(&last.outcome);
        }
        if shutdown.is_cancelled() {
            break;
        }
        let scheduled = running
            .schedule
            .next_delay(chrono::Utc::now(), rand::random::<f64>());
        let delay = backoff.next_delay(verdict, rand::random::<f64>(), scheduled);
        let delay = until_probe(&kept.breaker).map_or(delay, |probe| delay.min(probe));
        trigger = tokio::select! {
            () = shutdown.cancelled() => break,
            nudge = nudge_rx.recv() => match nudge {
                Some(_) => Trigger::Webhook,
                None => Trigger::Poll,
            },
            () = tokio::time::sleep(delay) => Trigger::Poll,
            Some(()) = reload.recv() => {
                notify::reloading();
                match AgentConfig::load(config_path) {
                    Ok(config) => match build(&config, config_path, kept.clone()) {
                        Ok(rebuilt) => {
                            tracing::info!("configuration reloaded");
                            running = rebuilt;
                        }
                        Err(error) => tracing::error!(error = %error_text(&error), "reload failed; keeping the previous configuration"),
                    },
                    Err(error) => tracing::error!(error = %error_text(&error), "reload failed; keeping the previous configuration"),
                }
                notify::reloaded();
                Trigger::Signal
            }
        };
    }
    tracing::info!("agent stopping");
    for server in servers {
        let _ = server.await;
    }
    interrupt_on_shutdown.abort();
    drop(state_lock);
    Ok(())
}

/// Warnings at every start about what the configuration exposes: plain-http PVE (M3), a
/// status API beyond loopback without a token (L1).
fn warn_about_exposure(config: &AgentConfig) {
    if config.pve.plain_http {
        tracing::warn!(
            url = %config.pve.url,
            "[pve] url is plain http (allow_plain_http = true): the API token crosses the \
             network in clear; use https:// outside a test rig"
        );
    }
    if !config.listen.ip().is_loopback() && config.http.token.is_none() {
        tracing::warn!(
            listen = %config.listen,
            "[http] listen is not a loopback address and [http] token_file is not set: anyone \
             who reaches it can read guest names, config values and errors; keep it on \
             127.0.0.1 (webhooks can have their own [webhook] listen) or set token_file"
        );
    }
    if config.listen.ip().is_unspecified()
        && !config.http.allowed_hosts.iter().any(|h| h == "*")
        && config
            .http
            .allowed_hosts
            .iter()
            .all(|h| ["localhost", "127.0.0.1", "[::1]"].contains(&h.as_str()))
    {
        tracing::warn!(
            listen = %config.listen,
            "[http] listen is on every address but [http] allowed_hosts names only loopback: \
             requests naming the node's name or address are refused; list them in allowed_hosts"
        );
    }
}

/// How long until an open write circuit breaker allows its probe: the loop looks again then
/// rather than at the next scheduled poll, which may be hours away.
fn until_probe(breaker: &Mutex<breaker::Breaker>) -> Option<Duration> {
    breaker
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .open_until()
        .map(|until| until.saturating_duration_since(std::time::Instant::now()))
}

/// Waits again for PVE tasks a previous run started and never saw finish, and records their
/// results, so their actions are not issued a second time.
async fn reattach(deps: &PassDeps, shutdown: &CancellationToken) {
    let running = {
        let store = deps
            .store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &deps.context.scope {
            NodeScope::Node(node) => store.running_tasks(node),
            NodeScope::All => store.running_tasks("*"),
        }
    };
    let tasks = match running {
        Ok(tasks) => tasks,
        Err(error) => {
            tracing::error!(error = %error_text(&error), "reading running tasks");
            return;
        }
    };
    for task in tasks {
        let Ok(upid) = task.upid.parse::<Upid>() else {
            tracing::warn!(upid = %task.upid, "recorded task id does not parse; not re-attaching");
            continue;
        };
        tracing::info!(upid = %task.upid, resource = %task.resource, "re-attaching to a task started before a restart");
        let outcome = match wait_for_task(
            &deps.context.pve,
            &upid,
            &deps.context.execute.wait,
            shutdown,
        )
        .await
        {
            Ok(status) => ActionOutcome::Succeeded {
                exitstatus: status.exitstatus.unwrap_or_else(|| "OK".into()),
            },
            Err(proxops_pve::TaskError::Failed { exitstatus, .. }) => {
                ActionOutcome::Failed { error: exitstatus }
            }
            Err(proxops_pve::TaskError::Cancelled { .. }) => return,
            Err(error) => ActionOutcome::Failed {
                error: error_text(&error),
            },
        };
        let mut store = deps
            .store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(error) = store.record_action_result(task.action_id, &outcome, SystemTime::now())
        {
            tracing::error!(error = %error_text(&error), "recording a re-attached task");
        }
    }
}
