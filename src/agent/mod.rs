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
//! - [`lock`]: one agent per state directory (the first thing `crate::serve` takes, before
//!   the listeners are bound and before [`Agent::start`] opens the database and the mirror).
//!
//! The agent as a process, with its HTTP surface, is `crate::serve`; this module knows
//! nothing of HTTP. The loop starts with a pass at once (the Go program waited one interval), re-attaches
//! first to PVE tasks a previous run started but never saw finish, and then waits for the
//! next trigger. Webhook nudges go through a channel of capacity one: while a pass runs,
//! any number of deliveries coalesce into exactly one more pass.

pub mod approval;
pub mod breaker;
pub mod gate;
pub mod ha;
pub mod lock;
pub mod notify;
pub mod pass;
pub mod retry;
pub mod rollout;
pub mod schedule;
pub mod status;
pub mod window;

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
use crate::error_chain::error_text;
use crate::metrics::Metrics;
use crate::reconcile::{Context, PlanOptions};
use crate::source::git::GitSource;
use crate::webhook::Nudge;
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
    /// The control socket (`<state_dir>/control.sock`) could not be created.
    #[error(transparent)]
    Control(#[from] crate::control::ControlError),
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
    /// `[[notify]]`: rebuilt with the configuration (a reload drops what was still queued).
    notifier: crate::notify::Notifier,
    /// `[forge] preview = true`: the pull request preview worker (stopped when dropped).
    _previews: Option<crate::forge::preview::PreviewWorker>,
}

/// What survives a configuration reload.
#[derive(Clone)]
struct Kept {
    store: SharedStore,
    live: Arc<status::LiveStatus>,
    interrupt: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    breaker: Arc<Mutex<breaker::Breaker>>,
    preview: Arc<Mutex<Option<PreviewInputs>>>,
    /// Pull requests waiting for a plan preview (issue 18 item 3).
    pull_previews: Arc<crate::forge::preview::Requests>,
    /// `[pmxcfs]`: publishes this node's status file (issue 22).
    publisher: Arc<crate::cluster::publish::Publisher>,
}

/// What a read-only plan preview needs (the web UI's plan page): the PVE client, scope,
/// source, cluster and policy of the configuration in force, republished on every reload.
#[derive(Clone)]
pub struct PreviewInputs {
    /// PVE client and node scope (the preview runs in `Mode::Report`: it never writes).
    pub context: Context,
    /// The git repository followed (the preview reads its last fetched revision).
    pub source: Arc<GitSource>,
    /// The cluster followed (composition mode).
    pub cluster: Option<String>,
    /// Prune and restart policy, as a pass plans with it.
    pub plan_options: PlanOptions,
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
    kept.live.set_windows(config.policy.windows.clone());
    let rollout = rollout::Rollout::new(config);
    kept.live.set_rollout(rollout.clone());
    kept.publisher
        .configure(
            config
                .pmxcfs
                .clone()
                .map(|pmxcfs| crate::cluster::publish::Settings {
                    pmxcfs,
                    node: match &config.node {
                        NodeScope::Node(node) => Some(node.clone()),
                        NodeScope::All => None,
                    },
                    cluster: config.cluster.clone(),
                }),
        );
    let notifier = crate::notify::Notifier::start(
        &config.notify,
        &kept.store,
        &node_label(&config.node),
        config.cluster.clone(),
        kept.metrics.clone(),
    );
    let source = Arc::new(source);
    *kept
        .preview
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(PreviewInputs {
        context: context.clone(),
        source: source.clone(),
        cluster: config.cluster.clone(),
        plan_options: PlanOptions::from_config(config),
    });
    if config.forge.as_ref().is_some_and(|f| f.preview) && config.webhook.is_none() {
        tracing::warn!(
            "[forge] preview = true, but without [webhook] no pull_request delivery can ask for a preview"
        );
    }
    let previews = config.forge.as_ref().and_then(|forge| {
        crate::forge::preview::PreviewWorker::start(
            crate::forge::preview::PreviewSetup {
                forge: forge.clone(),
                context: context.clone(),
                source: source_config.clone(),
                state_dir: config.state_dir.clone(),
                cluster: config.cluster.clone(),
                node_label: node_label(&config.node),
                plan_options: PlanOptions::from_config(config),
                store: kept.store.clone(),
            },
            kept.pull_previews.clone(),
        )
    });
    Ok(Running {
        notifier,
        _previews: previews,
        deps: PassDeps {
            context,
            source,
            store: kept.store,
            live: kept.live,
            cluster: config.cluster.clone(),
            node_label: node_label(&config.node),
            interrupt: kept.interrupt,
            metrics: kept.metrics,
            breaker: kept.breaker,
            plan_options: PlanOptions::from_config(config),
            enforced: Mutex::new(None),
            approve: config.policy.approve.clone(),
            rollout,
            forge: config.forge.as_ref().and_then(|forge| {
                crate::forge::Forge::start(
                    forge,
                    config.cluster.as_deref(),
                    &node_label(&config.node),
                )
            }),
        },
        schedule,
    })
}

/// A started agent: its store open (passes a previous run left unfinished recorded as
/// interrupted) and its first configuration built; [`Agent::run`] runs the loop.
pub struct Agent {
    config_path: PathBuf,
    kept: Kept,
    running: Running,
    nudges: mpsc::Receiver<Nudge>,
    /// `<state_dir>/control.sock` and what its approvals wake (`crate::control`).
    control: crate::control::ControlSocket,
}

/// What the agent shares with its HTTP surface (status API, metrics, webhooks).
pub struct Shared {
    /// The state database.
    pub store: SharedStore,
    /// The live status.
    pub live: Arc<status::LiveStatus>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// The PVE client of the first configuration (its request counters).
    pub pve: PveClient,
    /// The node label passes are recorded under.
    pub node_label: String,
    /// Where webhook deliveries nudge the loop (capacity one: deliveries during a pass
    /// coalesce into one more pass).
    pub nudges: mpsc::Sender<Nudge>,
    /// What a plan preview needs, as of the last (re)load of the configuration.
    pub preview: Arc<Mutex<Option<PreviewInputs>>>,
    /// Where `pull_request` webhooks ask for plan previews; `None` unless `[forge] preview`.
    pub pull_previews: Option<Arc<crate::forge::preview::Requests>>,
    /// `[pmxcfs]` in force and how publishing goes (the cluster view).
    pub publisher: Arc<crate::cluster::publish::Publisher>,
}

impl Agent {
    /// Opens the store and builds what the first pass needs from `config` (read from
    /// `config_path`, which a reload reads again).
    ///
    /// # Errors
    /// The store cannot be opened, or the configuration cannot be built (no source, a bad
    /// schedule, no PVE client).
    pub fn start(config_path: &Path, config: &AgentConfig) -> Result<(Self, Shared), AgentError> {
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
        let kept = Kept {
            store: store.clone(),
            live: Arc::new(status::LiveStatus::default()),
            interrupt: Arc::new(AtomicBool::new(false)),
            metrics: Arc::new(Metrics::default()),
            breaker: Arc::new(Mutex::new(breaker::Breaker::new(
                config.policy.write_breaker_threshold,
                config.policy.write_breaker_cool_down,
            ))),
            preview: Arc::new(Mutex::new(None)),
            pull_previews: Arc::default(),
            publisher: Arc::default(),
        };
        let running = build(config, config_path, kept.clone())?;
        let control = crate::control::ControlSocket::bind(&config.state_dir)?;
        let (nudge_tx, nudges) = mpsc::channel::<Nudge>(1);
        let shared = Shared {
            store,
            live: kept.live.clone(),
            metrics: kept.metrics.clone(),
            pve: running.deps.context.pve.clone(),
            node_label: running.deps.node_label.clone(),
            nudges: nudge_tx,
            preview: kept.preview.clone(),
            pull_previews: config
                .forge
                .as_ref()
                .is_some_and(|f| f.preview)
                .then(|| kept.pull_previews.clone()),
            publisher: kept.publisher.clone(),
        };
        let agent = Self {
            control,
            config_path: config_path.to_path_buf(),
            kept,
            running,
            nudges,
        };
        Ok((agent, shared))
    }

    /// Runs the loop until `shutdown` fires (SIGTERM/SIGINT in the binary): re-attaches to
    /// the tasks a previous run left running, then one pass per trigger. `reload` fires on
    /// SIGHUP: the config is read again and used from the next pass on.
    pub async fn run(self, shutdown: CancellationToken, mut reload: mpsc::Receiver<()>) {
        let Self {
            config_path,
            kept,
            mut running,
            mut nudges,
            control,
        } = self;
        // `proxops approve`: the control socket, removed when the loop stops.
        let (wake, mut approved) = mpsc::channel::<()>(1);
        let control = control.serve(
            crate::control::ControlContext {
                store: kept.store.clone(),
                node: running.deps.node_label.clone(),
                wake,
            },
            shutdown.clone(),
        );
        let interrupt_on_shutdown = {
            let shutdown = shutdown.clone();
            let interrupt = kept.interrupt.clone();
            tokio::spawn(async move {
                shutdown.cancelled().await;
                notify::stopping();
                interrupt.store(true, Ordering::SeqCst);
            })
        };
        let publishing = tokio::spawn(kept.publisher.clone().run(
            kept.store.clone(),
            kept.live.clone(),
            shutdown.clone(),
        ));
        reattach(&running.deps, &shutdown).await;

        let mut backoff = Backoff::default();
        let mut trigger = Trigger::Startup;
        loop {
            let verdict = pass::run_pass(&running.deps, trigger, &shutdown).await;
            kept.publisher.pass_finished();
            running.notifier.pass_finished(
                &kept.store,
                &running.deps.node_label,
                !running.deps.writes_allowed(),
            );
            if let Some(last) = kept.live.last() {
                kept.metrics.pass(&last.outcome);
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
                nudge = nudges.recv() => match nudge {
                    Some(_) => Trigger::Webhook,
                    None => Trigger::Poll,
                },
                () = tokio::time::sleep(delay) => Trigger::Poll,
                Some(()) = approved.recv() => Trigger::Cli,
                Some(()) = reload.recv() => {
                    notify::reloading();
                    match AgentConfig::load(&config_path) {
                        Ok(config) => match build(&config, &config_path, kept.clone()) {
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
        interrupt_on_shutdown.abort();
        publishing.abort();
        let _ = control.await;
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
