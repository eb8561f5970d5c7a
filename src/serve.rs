//! `proxops agent` as a process: the agent's loop ([`crate::agent::Agent`]) and its HTTP
//! surface ([`crate::http`]: status API, metrics, status page, webhooks) on `[http] listen`,
//! joined here so that neither module knows the other's wiring (the agent never depends on
//! `http`). Start-up order: the state directory's lock ([`crate::agent::lock`]), then the
//! listeners (`[http] listen`, and `[webhook] listen` when set), then [`Agent::start`] (the
//! database and the mirror); the listeners are served by [`crate::http::serve`] with its
//! connection cap and timeouts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, AgentError, http_addr_path, lock, notify, webhook_addr_path};
use crate::config::AgentConfig;
use crate::http::serve::{Limits, ListenerCounts};
use crate::http::{self, HttpState};
use crate::webhook::WebhookState;

/// Runs the agent and its HTTP surface until `shutdown` fires (SIGTERM/SIGINT in the
/// binary). `reload` fires on SIGHUP: the config is read again and used from the next pass
/// on.
///
/// # Errors
/// Start-up failures; once running, pass failures are recorded, not returned.
pub async fn run(
    config_path: &Path,
    shutdown: CancellationToken,
    reload: mpsc::Receiver<()>,
) -> Result<(), AgentError> {
    let config = AgentConfig::load(config_path)?;
    // First: nothing in the state directory is opened before this agent owns it
    // (SECURITY-AUDIT.md M6). Then the listeners, so a taken port also stops the agent before
    // `Agent::start` records unfinished passes as interrupted or the mirror's stale git locks
    // are removed.
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

    let (agent, shared) = Agent::start(config_path, &config)?;
    let webhook = config.webhook.as_ref().map(|w| {
        let branch = config
            .source
            .as_ref()
            .map_or_else(|| "main".to_owned(), |s| s.branch.clone());
        WebhookState::new(w.secret.clone(), branch, shared.nudges.clone())
    });
    let http_state = HttpState {
        live: shared.live.clone(),
        store: shared.store.clone(),
        metrics: shared.metrics.clone(),
        pve: shared.pve.clone(),
        webhook_metrics: webhook.as_ref().map(|w| w.metrics.clone()),
        node_label: shared.node_label.clone(),
        preview: shared.preview.clone(),
        commit_url: config.http.commit_url.clone(),
        publisher: shared.publisher.clone(),
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
    tracing::info!(%listen, node = %shared.node_label, "agent started");
    servers.push(tokio::spawn(http::serve::serve(
        listener,
        http::router(http_state, shared_webhook, access),
        Limits::STATUS,
        Arc::new(ListenerCounts::default()),
        shutdown.clone(),
    )));

    // Ready before re-attaching: waiting for a previous run's tasks may outlast systemd's
    // start timeout, and the status API already answers.
    notify::ready(listen);
    agent.run(shutdown, reload).await;
    tracing::info!("agent stopping");
    for server in servers {
        let _ = server.await;
    }
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
