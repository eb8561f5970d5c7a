//! The listener: accepts TCP connections (TCP_NODELAY set, so keep-alive clients are not
//! slowed by Nagle), wraps them in TLS unless plain HTTP was asked for, and serves each
//! connection with hyper, handing every request to `api::dispatch`. Also the library entry
//! point [`start`] and the [`RunningSim`] handle.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::cluster::Cluster;
use crate::control::SimControl;
use crate::error::SimError;
use crate::seed::Seed;
use crate::state::{Settings, Shared};

/// Default task duration of the library (the binary's `--task-duration` default is 1s).
pub const DEFAULT_TASK_DURATION: Duration = Duration::from_millis(200);
/// How long a write waits for a config file lock held by another task (PVE: 10 s).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// How often pvestatd publishes guest status (pve-manager `PVE/Service/pvestatd.pm`
/// @ 14a22df3: `my $updatetime = 10;`).
pub const DEFAULT_STATS_INTERVAL: Duration = Duration::from_secs(10);
/// How long pveproxy waits for the daemon's answer to a proxied call before it answers 596
/// (pve-http-server 5c9e4ea `src/PVE/APIServer/AnyEvent.pm` `proxy_request`: `timeout => 30`).
pub const DEFAULT_PROXY_TIMEOUT: Duration = Duration::from_secs(30);

/// How to run the simulator.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The initial cluster.
    pub seed: Seed,
    /// Serve HTTPS with a self-signed certificate (`false`: plain HTTP).
    pub tls: bool,
    /// Password of `root@pam`.
    pub root_password: String,
    /// Secret of the API token `root@pam!proxops`.
    pub token_secret: String,
    /// How long every task runs. Zero finishes tasks inside the request that starts them,
    /// so the first status poll already sees `stopped` (download-url still waits for its
    /// fetch).
    pub task_duration: Duration,
    /// How long tasks of one type run, by PVE task type (`download`, `qmcreate`, `vzcreate`,
    /// `qmclone`, `qmstart`, `qmconfig`, ...), so a scenario can run with realistic ratios
    /// (a download far longer than a create); types not listed take `task_duration`.
    pub task_durations: BTreeMap<String, Duration>,
    /// How long pveproxy waits for the answer of a `protected` call (every write), which it
    /// proxies to pvedaemon on the same node, before it answers 596 while the handler goes
    /// on. PVE's is 30 s ([`DEFAULT_PROXY_TIMEOUT`]); tests set e.g. 200 ms.
    pub proxy_timeout: Duration,
    /// How long the copy of a disk image (`import-from=`) takes in a qemu config write. The
    /// synchronous `PUT config` holds the request that long (qemu-server's `update_vm_api`
    /// runs `create_disks` inside the handler); `POST config`'s `qmconfig` task runs at
    /// least that long. Zero by default.
    pub disk_import_duration: Duration,
    /// How long a write waits for a config file lock before `can't lock file ... got timeout`.
    pub lock_timeout: Duration,
    /// Delay before answering an authentication failure (PVE waits about 3 s).
    pub auth_failure_delay: Duration,
    /// Validate every request against the vendored PVE schema (answers 400/501 like PVE).
    pub validate: bool,
    /// How often pvestatd's stand-in publishes what `/cluster/resources` reports of guests
    /// (`status`, `name`, `template`, sizes); a guest created since the last run is
    /// `status: unknown`. Zero reports the live state on every read (no lag).
    pub stats_interval: Duration,
    /// Map file based storages to real directories: each storage's `path` becomes
    /// `<root>/<storage>` (created), `GET /storage/{storage}` reports it, `snippets`
    /// listings show the files in its `snippets/` directory, and a `cicustom` naming a
    /// missing file fails as PVE does. `None` keeps every storage in memory (its seeded path).
    pub storage_root: Option<std::path::PathBuf>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            seed: Seed::default(),
            tls: true,
            root_password: "proxops".to_string(),
            token_secret: "proxops-dev-secret".to_string(),
            task_duration: DEFAULT_TASK_DURATION,
            task_durations: BTreeMap::new(),
            proxy_timeout: DEFAULT_PROXY_TIMEOUT,
            disk_import_duration: Duration::ZERO,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            auth_failure_delay: Duration::ZERO,
            validate: true,
            stats_interval: DEFAULT_STATS_INTERVAL,
            storage_root: None,
        }
    }
}

/// A running simulator.
#[derive(Debug)]
pub struct RunningSim {
    addr: SocketAddr,
    tls: bool,
    fingerprint: Option<String>,
    control: SimControl,
    accept: Option<JoinHandle<()>>,
}

impl Drop for RunningSim {
    /// Dropping the handle stops the simulator too (without waiting for it).
    fn drop(&mut self) {
        self.control.shared().cancel.cancel();
    }
}

impl RunningSim {
    /// The API base URL, e.g. `https://127.0.0.1:8006/api2/json`.
    pub fn base_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}/api2/json", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// SHA-256 fingerprint of the certificate (`AB:CD:...`), `None` for plain HTTP.
    pub fn fingerprint(&self) -> Option<&str> {
        self.fingerprint.as_deref()
    }

    /// Handle for faults and the request log.
    pub fn control(&self) -> &SimControl {
        &self.control
    }

    /// Stops accepting, lets open requests finish, and cancels running tasks.
    pub async fn shutdown(mut self) {
        let shared = Arc::clone(self.control.shared());
        shared.cancel.cancel();
        if let Some(accept) = self.accept.take() {
            let _ = accept.await;
        }
        shared.tracker.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), shared.tracker.wait()).await;
    }
}

/// Starts the simulator on `listener` (bind `127.0.0.1:0` in tests).
///
/// # Errors
/// An inconsistent seed, a certificate that cannot be made, or a listener without address.
pub async fn start(config: SimConfig, listener: TcpListener) -> Result<RunningSim, SimError> {
    let addr = listener.local_addr().map_err(SimError::Listener)?;
    crate::tls::install_crypto_provider();
    let cert = if config.tls {
        // Key generation is CPU work; keep it off the runtime's worker.
        let made = tokio::task::spawn_blocking(|| crate::tls::self_signed(&[]))
            .await
            .map_err(|e| SimError::Tls(e.to_string()))??;
        Some(made)
    } else {
        None
    };
    let mut cluster =
        Cluster::from_seed(&config.seed, &config.root_password, &config.token_secret)?;
    if !config.stats_interval.is_zero() {
        cluster.use_stats_snapshots();
    }
    if let Some(root) = &config.storage_root {
        cluster
            .map_storages_to(root)
            .map_err(SimError::StorageRoot)?;
    }
    let settings = Settings {
        task_duration: config.task_duration,
        task_durations: config
            .seed
            .task_durations_ms
            .iter()
            .map(|(k, ms)| (k.clone(), Duration::from_millis(*ms)))
            .chain(config.task_durations.clone())
            .collect(),
        proxy_timeout: config.proxy_timeout,
        disk_import_duration: config.disk_import_duration,
        lock_timeout: config.lock_timeout,
        auth_failure_delay: config.auth_failure_delay,
        validate: config.validate,
        fingerprint: cert.as_ref().map(|c| c.fingerprint.clone()),
    };
    let shared = Arc::new(Shared::new(settings, cluster));
    let fingerprint = cert.as_ref().map(|c| c.fingerprint.clone());
    let acceptor = cert.map(|c| tokio_rustls::TlsAcceptor::from(c.config));
    if !config.stats_interval.is_zero() {
        shared
            .tracker
            .spawn(stats_loop(Arc::clone(&shared), config.stats_interval));
    }
    let accept = tokio::spawn(accept_loop(Arc::clone(&shared), listener, acceptor));
    Ok(RunningSim {
        addr,
        tls: config.tls,
        fingerprint,
        control: SimControl::new(shared),
        accept: Some(accept),
    })
}

/// pvestatd's stand-in: publishes every guest's state each `interval` (pve-manager
/// `PVE/Service/pvestatd.pm` `run` @ 14a22df3: `$next_update = time() + $updatetime`).
async fn stats_loop(shared: Arc<Shared>, interval: Duration) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => shared.cluster().refresh_stats(),
            () = shared.cancel.cancelled() => break,
        }
    }
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = shared.cancel.cancelled() => break,
        };
        let Ok((stream, _peer)) = accepted else {
            // Out of file descriptors and similar: back off briefly and keep serving.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let shared2 = Arc::clone(&shared);
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let shared = Arc::clone(&shared2);
            async move {
                Ok::<hyper::Response<Full<Bytes>>, std::convert::Infallible>(
                    crate::api::dispatch(shared, req).await,
                )
            }
        });
        let acceptor = acceptor.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            match acceptor {
                None => {
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    let _ = watcher.watch(conn).await;
                }
                Some(acceptor) => {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let conn = builder.serve_connection(TokioIo::new(tls), service);
                    let _ = watcher.watch(conn).await;
                }
            }
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
}
