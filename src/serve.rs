//! `proxops agent` as a process: the agent's loop ([`crate::agent::Agent`]) and its HTTP
//! surface ([`crate::http`]: status API, metrics, status page, webhooks) on `[http] listen`,
//! joined here so that neither module knows the other's wiring (the agent never depends on
//! `http`).

use std::net::SocketAddr;
use std::path::Path;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, AgentError, http_addr_path, notify};
use crate::config::AgentConfig;
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
    };
    // `listen` may have port 0: what counts from here on is the address actually bound.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| AgentError::Listen(config.listen, e))?;
    let listen = listener
        .local_addr()
        .map_err(|e| AgentError::Listen(config.listen, e))?;
    write_http_addr(&config.state_dir, listen)?;
    tracing::info!(%listen, node = %shared.node_label, "agent started");
    let server_shutdown = shutdown.clone();
    let server = tokio::spawn(async move {
        let app = http::router(http_state, webhook);
        if let Err(error) = axum::serve(listener, app)
            .with_graceful_shutdown(async move { server_shutdown.cancelled().await })
            .await
        {
            tracing::error!(%error, "HTTP server stopped");
        }
    });

    // Ready before re-attaching: waiting for a previous run's tasks may outlast systemd's
    // start timeout, and the status API already answers.
    notify::ready(listen);
    agent.run(shutdown, reload).await;
    tracing::info!("agent stopping");
    let _ = server.await;
    Ok(())
}

/// Writes `addr` to [`http_addr_path`] atomically (a temporary file renamed over it), so a
/// reader sees the previous address or the new one, never a partial line.
fn write_http_addr(state_dir: &Path, addr: SocketAddr) -> Result<(), AgentError> {
    let path = http_addr_path(state_dir);
    let temporary = state_dir.join("http.addr.tmp");
    std::fs::write(&temporary, format!("{addr}\n"))
        .and_then(|()| std::fs::rename(&temporary, &path))
        .map_err(|e| AgentError::HttpAddr(path, e))
}
