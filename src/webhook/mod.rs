//! The webhook receiver: `POST /hooks/{github,gitea,forgejo,gogs}` → at most one pending nudge.
//!
//! A delivery is a hint, not an instruction (STYLE.md H4): the handler verifies the signature
//! over the raw body ([`signature`]), reads what kind of event it is ([`event`]) and, for a push
//! to the followed branch, does a non-blocking `try_send` on the agent's capacity-1 channel. A
//! full channel means a pass is already pending, so the delivery is coalesced into it. The
//! handler never fetches git, never touches PVE and never uses the commit SHA in the payload:
//! the pass applies whatever `git fetch` finds. Every provider goes through the same handler;
//! only the header table in [`provider`] differs. A push identical to one accepted in the last
//! ten minutes is a replay and is coalesced ([`replay`]), so a flood of one captured delivery
//! cannot run pass after pass.
//!
//! Answers: body over [`MAX_BODY_BYTES`] → 413; bad or missing signature → 401 (logged at warn,
//! without the secret or the signature); signed ping → 200; push to the followed branch → 202
//! (nudged, coalesced, or a replay); anything else signed → 202 ignored; a signed push without
//! a readable `ref` → 400; the agent no longer listening → 503.

pub mod event;
pub mod provider;
pub mod replay;
pub mod signature;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::error_chain::error_text;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use secrecy::SecretString;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tracing::{debug, info, trace, warn};

pub use event::{Event, EventError};
pub use provider::Provider;
pub use signature::{SignatureError, verify};

use provider::{HeaderLookup, lookup};

/// The largest request body accepted (5 MiB); larger ones get 413 before any check.
pub const MAX_BODY_BYTES: usize = 5 * 1024 * 1024;

/// Delivery ids longer than this are cut in logs (they come from outside, unauthenticated).
const MAX_LOGGED_DELIVERY_ID: usize = 64;

/// A request for one more pass, sent by a verified push to the followed branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nudge {
    /// Which forge's delivery asked for it.
    pub provider: Provider,
}

/// What the webhook handler needs; cloned into the router once.
#[derive(Debug, Clone)]
pub struct WebhookState {
    /// The HMAC secret shared with the forge (`[webhook] secret_file`).
    pub secret: SecretString,
    /// The followed branch (`[source] branch`); pushes to other branches are ignored.
    pub branch: String,
    /// The agent's trigger channel, created by the agent with capacity 1.
    pub nudge: mpsc::Sender<Nudge>,
    /// Delivery counters, shared with whoever renders `/metrics`.
    pub metrics: Arc<WebhookMetrics>,
    /// The pushes accepted recently, to recognise replays.
    pub replays: Arc<replay::Replays>,
}

impl WebhookState {
    /// State with fresh counters.
    pub fn new(
        secret: SecretString,
        branch: impl Into<String>,
        nudge: mpsc::Sender<Nudge>,
    ) -> Self {
        Self {
            secret,
            branch: branch.into(),
            nudge,
            metrics: Arc::default(),
            replays: Arc::default(),
        }
    }
}

/// Counters of deliveries by what became of them; every delivery counts exactly once.
#[derive(Debug, Default)]
pub struct WebhookMetrics {
    accepted: AtomicU64,
    rejected: AtomicU64,
    ignored: AtomicU64,
    coalesced: AtomicU64,
}

/// A copy of [`WebhookMetrics`] at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WebhookCounts {
    /// Pushes to the followed branch that queued a pass.
    pub accepted: u64,
    /// Deliveries answered with an error status (413, 401, 400, 503).
    pub rejected: u64,
    /// Verified deliveries that ask for nothing: pings, other branches, tags, other events.
    pub ignored: u64,
    /// Pushes to the followed branch while a pass was already pending, or identical to one
    /// accepted in the last ten minutes (a replay).
    pub coalesced: u64,
}

impl WebhookMetrics {
    /// The current counts.
    pub fn snapshot(&self) -> WebhookCounts {
        WebhookCounts {
            accepted: self.accepted.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            ignored: self.ignored.load(Ordering::Relaxed),
            coalesced: self.coalesced.load(Ordering::Relaxed),
        }
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The webhook routes, one per [`Provider`], all served by the same handler.
pub fn router(state: WebhookState) -> Router {
    let state = Arc::new(state);
    let mut router = Router::new();
    for provider in Provider::ALL {
        let handler = move |State(state): State<Arc<WebhookState>>,
                            headers: HeaderMap,
                            body: Result<Bytes, BytesRejection>| async move {
            deliver(provider, &state, &headers, body)
        };
        router = router.route(provider.path(), post(handler));
    }
    router
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Handles one delivery; synchronous because nothing in it may wait.
fn deliver(
    provider: Provider,
    state: &WebhookState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> (StatusCode, &'static str) {
    let metrics = &state.metrics;
    let delivery = delivery_id(provider, headers);
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            WebhookMetrics::count(&metrics.rejected);
            let status = rejection.status();
            warn!(%provider, ?delivery, %status, "webhook delivery refused: {}", rejection.body_text());
            return if status == StatusCode::PAYLOAD_TOO_LARGE {
                (status, "payload too large (limit 5 MiB)\n")
            } else {
                (status, "unreadable request body\n")
            };
        }
    };

    trace!(%provider, ?delivery, bytes = body.len(), "verifying webhook signature");
    if let Err(error) = signature::verify(provider, &state.secret, headers, &body) {
        WebhookMetrics::count(&metrics.rejected);
        warn!(%provider, ?delivery, %error, "webhook delivery rejected");
        let reply = match error {
            SignatureError::Missing { .. } => "missing signature\n",
            SignatureError::Mismatch { .. } | SignatureError::NoSecret => "invalid signature\n",
        };
        return (StatusCode::UNAUTHORIZED, reply);
    }

    let event = match event::parse(provider, headers, &body) {
        Ok(event) => event,
        Err(error) => {
            WebhookMetrics::count(&metrics.rejected);
            warn!(%provider, ?delivery, error = %error_text(&error), "signed webhook delivery unreadable");
            return (StatusCode::BAD_REQUEST, "unreadable event\n");
        }
    };

    match event {
        Event::Ping => {
            WebhookMetrics::count(&metrics.ignored);
            info!(%provider, ?delivery, "webhook ping");
            (StatusCode::OK, "pong\n")
        }
        Event::Push { branch } if branch == state.branch => {
            let now = Instant::now();
            // Claimed before the nudge: of concurrent copies only the first may nudge.
            if !state.replays.claim(provider, &body, now) {
                WebhookMetrics::count(&metrics.coalesced);
                debug!(%provider, ?delivery, %branch, "webhook push identical to one accepted recently: a replay, nothing new");
                return (
                    StatusCode::ACCEPTED,
                    "coalesced: identical to a delivery already accepted\n",
                );
            }
            match state.nudge.try_send(Nudge { provider }) {
                Ok(()) => {
                    WebhookMetrics::count(&metrics.accepted);
                    info!(%provider, ?delivery, %branch, "webhook push: pass requested");
                    (StatusCode::ACCEPTED, "accepted\n")
                }
                Err(TrySendError::Full(_)) => {
                    WebhookMetrics::count(&metrics.coalesced);
                    debug!(%provider, ?delivery, %branch, "webhook push: a pass is already pending");
                    (StatusCode::ACCEPTED, "coalesced with a pending pass\n")
                }
                Err(TrySendError::Closed(_)) => {
                    WebhookMetrics::count(&metrics.rejected);
                    warn!(%provider, ?delivery, %branch, "webhook push while the agent no longer takes triggers");
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "agent is not accepting triggers\n",
                    )
                }
            }
        }
        ignored => {
            WebhookMetrics::count(&metrics.ignored);
            debug!(%provider, ?delivery, event = ?ignored, following = %state.branch, "webhook delivery ignored");
            (StatusCode::ACCEPTED, "ignored\n")
        }
    }
}

/// The forge's delivery id, for correlating logs with the forge's delivery history.
fn delivery_id(provider: Provider, headers: &HeaderMap) -> Option<&str> {
    match lookup(headers, provider.delivery_headers()) {
        HeaderLookup::One { value, .. } => {
            let id = value.to_str().ok()?;
            Some(id.get(..MAX_LOGGED_DELIVERY_ID).unwrap_or(id))
        }
        HeaderLookup::Absent | HeaderLookup::Repeated { .. } => None,
    }
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;
