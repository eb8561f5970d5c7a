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
//! Answers: no signature header at all → 401 before the body is read; more than
//! [`MAX_BODIES_IN_FLIGHT`] bodies being read already → 503 after a short wait; body over
//! [`MAX_BODY_BYTES`] → 413; bad signature → 401; signed ping → 200; push to the followed
//! branch → 202 (nudged, coalesced, or a replay); anything else signed → 202 ignored; a signed
//! push without a readable `ref` → 400; the agent no longer listening → 503. A signed
//! `pull_request` into the followed branch that is opened, reopened or has new commits
//! ([`pull_request`]) asks for a plan preview when `[forge] preview = true` (202, coalesced
//! per pull request); other actions, other bases, or previews off → 202 ignored.
//!
//! Bounded against a network caller (SECURITY-AUDIT.md H2, L2, L3): an unsigned request is
//! refused from its headers, so it never gets a body buffered; at most
//! [`MAX_BODIES_IN_FLIGHT`] bodies (of at most 5 MiB each) are in memory at once, where 200
//! connections each sending 5 MiB − 1 byte took the agent from 24 MB to 1.06 GB. Rejections are
//! logged aggregated ([`tally`]): the first of a quiet minute in full, the rest as
//! one count per minute, without the secret or the signature. The replay guard keys on the
//! body alone, so one captured delivery cannot start a pass on each of the four endpoints.
//! Form-encoded deliveries (`application/x-www-form-urlencoded`, GitHub's default, with the
//! JSON in the `payload` field) are read too; their signature is over the raw form body.

pub mod event;
pub mod provider;
pub mod pull_request;
pub mod replay;
pub mod signature;
pub mod tally;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error_chain::error_text;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use secrecy::SecretString;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, trace, warn};

use tally::Tally;

pub use event::{Event, EventError};
pub use provider::Provider;
pub use signature::{SignatureError, verify};

use provider::{HeaderLookup, lookup};

/// The largest request body accepted (5 MiB); larger ones get 413 before any check.
pub const MAX_BODY_BYTES: usize = 5 * 1024 * 1024;

/// Webhook bodies read into memory at once, across all four endpoints.
pub const MAX_BODIES_IN_FLIGHT: usize = 4;

/// How long a delivery waits for one of the [`MAX_BODIES_IN_FLIGHT`] slots before a 503.
const BODY_SLOT_WAIT: Duration = Duration::from_secs(2);

/// How often the count of rejected deliveries is looked at for its summary line.
const REPORT_EVERY: Duration = Duration::from_secs(5);

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
    /// Rejected deliveries, for aggregated warnings.
    pub rejections: Arc<Tally>,
    /// Slots for bodies being read ([`MAX_BODIES_IN_FLIGHT`]).
    pub bodies: Arc<Semaphore>,
    /// Plan previews of pull requests (`[forge] preview = true`); `None`: `pull_request`
    /// deliveries are ignored.
    pub previews: Option<Arc<crate::forge::preview::Requests>>,
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
            rejections: Arc::default(),
            bodies: Arc::new(Semaphore::new(MAX_BODIES_IN_FLIGHT)),
            previews: None,
        }
    }

    /// The same state, asking `previews` for a plan preview of each pull request into the
    /// followed branch that is opened, reopened or gets new commits.
    #[must_use]
    pub fn with_previews(mut self, previews: Option<Arc<crate::forge::preview::Requests>>) -> Self {
        self.previews = previews;
        self
    }

    /// Counts a rejected delivery; `true` when it is the first of a quiet interval and is to be
    /// logged in full.
    fn rejected(&self, reason: &'static str) -> bool {
        WebhookMetrics::count(&self.metrics.rejected);
        self.rejections.note(reason, Instant::now())
    }
}

/// Logs the count of rejected deliveries once per interval while any come, and once more at
/// shutdown; runs until `shutdown`.
pub async fn report_rejections(state: WebhookState, shutdown: CancellationToken) {
    let mut every = tokio::time::interval(REPORT_EVERY);
    loop {
        let force = tokio::select! {
            () = shutdown.cancelled() => true,
            _ = every.tick() => false,
        };
        if let Some(summary) = state.rejections.flush(Instant::now(), force) {
            warn!(
                count = summary.total,
                seconds = summary.over.as_secs(),
                reasons = %summary.by_reason,
                "more webhook deliveries were rejected"
            );
        }
        if force {
            return;
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
    /// Pushes to the followed branch that queued a pass, and pull requests that queued a
    /// plan preview.
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
        let handler = move |State(state): State<Arc<WebhookState>>, request: Request| async move {
            receive(provider, &state, request).await
        };
        router = router.route(provider.path(), post(handler));
    }
    router
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Refuses an unsigned delivery from its headers, waits for a body slot, reads the body (within
/// the router's limit) and hands it to [`deliver`].
async fn receive(
    provider: Provider,
    state: &WebhookState,
    request: Request,
) -> (StatusCode, &'static str) {
    let headers = request.headers().clone();
    if matches!(
        lookup(&headers, provider.signature_headers()),
        HeaderLookup::Absent
    ) {
        if state.rejected("unsigned") {
            let delivery = delivery_id(provider, &headers);
            warn!(%provider, ?delivery, header = provider.signature_headers()[0], "webhook delivery rejected: no signature header (body not read)");
        }
        return (StatusCode::UNAUTHORIZED, "missing signature\n");
    }
    let slot = match state.bodies.try_acquire() {
        Ok(slot) => Ok(slot),
        Err(_) => tokio::time::timeout(BODY_SLOT_WAIT, state.bodies.acquire())
            .await
            .map_err(|_| ())
            .and_then(|acquired| acquired.map_err(|_| ())),
    };
    let Ok(_slot) = slot else {
        if state.rejected("busy") {
            warn!(%provider, limit = MAX_BODIES_IN_FLIGHT, "webhook delivery refused: as many bodies as allowed are being read; the forge may redeliver");
        }
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "busy: too many deliveries at once, redeliver later\n",
        );
    };
    let body = Bytes::from_request(request, &()).await;
    deliver(provider, state, &headers, body)
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
            let status = rejection.status();
            let reason = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "too_large"
            } else {
                "unreadable_body"
            };
            if state.rejected(reason) {
                warn!(%provider, ?delivery, %status, "webhook delivery refused: {}", rejection.body_text());
            } else {
                debug!(%provider, ?delivery, %status, "webhook delivery refused: {}", rejection.body_text());
            }
            return if status == StatusCode::PAYLOAD_TOO_LARGE {
                (status, "payload too large (limit 5 MiB)\n")
            } else {
                (status, "unreadable request body\n")
            };
        }
    };

    trace!(%provider, ?delivery, bytes = body.len(), "verifying webhook signature");
    if let Err(error) = signature::verify(provider, &state.secret, headers, &body) {
        let reason = match error {
            SignatureError::Missing { .. } => "unsigned",
            SignatureError::Mismatch { .. } | SignatureError::NoSecret => "bad_signature",
        };
        if state.rejected(reason) {
            warn!(%provider, ?delivery, %error, "webhook delivery rejected");
        } else {
            debug!(%provider, ?delivery, %error, "webhook delivery rejected");
        }
        let reply = match error {
            SignatureError::Missing { .. } => "missing signature\n",
            SignatureError::Mismatch { .. } | SignatureError::NoSecret => "invalid signature\n",
        };
        return (StatusCode::UNAUTHORIZED, reply);
    }

    let event = match event::parse(provider, headers, &body) {
        Ok(event) => event,
        Err(error) => {
            if state.rejected("unreadable_event") {
                warn!(%provider, ?delivery, error = %error_text(&error), "signed webhook delivery unreadable");
            } else {
                debug!(%provider, ?delivery, error = %error_text(&error), "signed webhook delivery unreadable");
            }
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
            if !state.replays.claim(&body, now) {
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
        Event::PullRequest(pr)
            if pr.base == state.branch
                && pr.action == pull_request::Action::Preview
                && state.previews.is_some() =>
        {
            // A replayed delivery is coalesced like a replayed push.
            if !state.replays.claim(&body, Instant::now()) {
                WebhookMetrics::count(&metrics.coalesced);
                return (
                    StatusCode::ACCEPTED,
                    "coalesced: identical to a delivery already accepted\n",
                );
            }
            let previews = state.previews.as_ref().expect("checked above");
            if previews.request(pr.number) {
                WebhookMetrics::count(&metrics.accepted);
                info!(%provider, ?delivery, pull_request = pr.number, "webhook pull_request: plan preview requested");
                (StatusCode::ACCEPTED, "preview requested\n")
            } else {
                WebhookMetrics::count(&metrics.coalesced);
                debug!(%provider, ?delivery, pull_request = pr.number, "webhook pull_request: a preview of it is already pending");
                (StatusCode::ACCEPTED, "coalesced with a pending preview\n")
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
