//! Delivery, off the pass: one task per target takes messages from its bounded queue and
//! sends them, in order.
//!
//! - **Queue.** [`QUEUE_CAPACITY`] messages; a full queue drops its oldest message (counted
//!   as `dropped`, logged). Pushing never waits, so a pass never waits for a target.
//! - **Retry.** A connection error, a timeout, 408, 429 or a 5xx is retried with the loop's
//!   own [`Backoff`] (5 s doubling to 5 min, with jitter) until it is delivered or has been
//!   queued for [`MAX_AGE`]; then it is given up (`failed`). Other 4xx answers are the
//!   configuration's fault (a wrong token, a wrong room) and are given up at once, with a log
//!   line naming the status.
//! - **Rate limit.** At most `max_per_minute` messages in any minute; the rest are counted
//!   (`rate-limited`) and, once the minute allows, one summary says how many were not sent.
//! - **Secrets.** The token goes only in the `Authorization` header of requests to the
//!   configured URL; redirects are never followed (reqwest's `Policy::none`), so it cannot
//!   be carried to another host. Error texts are built from the status code or reqwest's
//!   error without its URL (a Slack webhook's URL is a secret), never from a response body.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use secrecy::ExposeSecret;
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::agent::retry::{Backoff, Verdict};
use crate::error_chain::error_text;
use crate::metrics::Metrics;
use crate::notify::config::{EmailTarget, Endpoint, HttpTarget, Kind, NotifyTarget};

/// Messages one target's queue holds.
pub const QUEUE_CAPACITY: usize = 64;
/// How long a message is retried before it is given up.
pub const MAX_AGE: Duration = Duration::from_secs(3600);
/// One request's (or one SMTP session's) time limit.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// The rate limit's window.
pub const RATE_WINDOW: Duration = Duration::from_secs(60);

/// What is sent: a JSON body for HTTP targets, the three parts of an email.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// webhook, ntfy, matrix, slack.
    Json(Value),
    /// email.
    Email {
        /// Subject.
        subject: String,
        /// text/plain part.
        text: String,
        /// text/html part.
        html: String,
    },
}

/// One message waiting in a queue.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// What it says (`drift-found`, …, `rate-limited` for a summary).
    pub event: &'static str,
    /// The body.
    pub body: Body,
    /// A unique id: Matrix's transaction id, stable across retries, so a retry after a
    /// lost answer is not posted twice.
    pub id: String,
    /// When it was queued.
    pub queued_at: Instant,
}

/// A bounded queue that drops its oldest message when full.
#[derive(Debug, Default)]
pub struct Queue {
    messages: Mutex<VecDeque<Outgoing>>,
    ready: Notify,
}

impl Queue {
    /// Adds `message`; returns the message dropped to make room, if any. Never waits.
    pub fn push(&self, message: Outgoing) -> Option<Outgoing> {
        let dropped = {
            let mut messages = self
                .messages
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let dropped = if messages.len() >= QUEUE_CAPACITY {
                messages.pop_front()
            } else {
                None
            };
            messages.push_back(message);
            dropped
        };
        self.ready.notify_one();
        dropped
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.messages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether no message waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn front(&self) -> Option<Outgoing> {
        self.messages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .front()
            .cloned()
    }

    /// Removes the front message if it is still `id` (the queue may have dropped it).
    fn done(&self, id: &str) {
        let mut messages = self
            .messages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if messages.front().is_some_and(|m| m.id == id) {
            messages.pop_front();
        }
    }

    async fn next(&self) -> Outgoing {
        loop {
            let ready = self.ready.notified();
            if let Some(message) = self.front() {
                return message;
            }
            ready.await;
        }
    }
}

/// At most `limit` sends in any [`RATE_WINDOW`]; counts what it refused.
#[derive(Debug)]
pub struct RateLimit {
    limit: usize,
    sent: VecDeque<Instant>,
    /// Messages refused since the last summary.
    pub suppressed: u64,
}

impl RateLimit {
    /// A limit of `per_minute`.
    pub fn new(per_minute: u32) -> Self {
        Self {
            limit: usize::try_from(per_minute).unwrap_or(usize::MAX).max(1),
            sent: VecDeque::new(),
            suppressed: 0,
        }
    }

    fn expire(&mut self, now: Instant) {
        while self
            .sent
            .front()
            .is_some_and(|at| now.duration_since(*at) >= RATE_WINDOW)
        {
            self.sent.pop_front();
        }
    }

    /// Whether a message may be sent at `now`; when it may, it is counted as sent.
    pub fn allow(&mut self, now: Instant) -> bool {
        self.expire(now);
        if self.sent.len() < self.limit {
            self.sent.push_back(now);
            true
        } else {
            self.suppressed += 1;
            false
        }
    }

    /// When the next send will be allowed (`now` when it already is).
    pub fn next_free(&mut self, now: Instant) -> Instant {
        self.expire(now);
        if self.sent.len() < self.limit {
            now
        } else {
            self.sent.front().map_or(now, |at| *at + RATE_WINDOW)
        }
    }
}

/// Why a send failed, and whether trying again may help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendError {
    /// Retry with backoff.
    pub retry: bool,
    /// What went wrong, without URL, token or response body.
    pub text: String,
}

/// What a delivery task needs.
pub struct Deliverer {
    /// The node label, for the rate limit's summary.
    pub node: String,
    /// The target.
    pub target: NotifyTarget,
    /// Its queue.
    pub queue: Arc<Queue>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// The HTTP client (no redirects; the target's trust).
    pub http: reqwest::Client,
}

/// Builds the HTTP client of `target`: system roots (the platform verifier, as reqwest's own
/// default) plus `ca_file`; no redirects; [`SEND_TIMEOUT`].
///
/// # Errors
/// `ca_file` unreadable or holding no certificate; the TLS setup failing.
pub fn http_client(target: &NotifyTarget) -> Result<reqwest::Client, String> {
    http_client_trusting(target.ca_file.as_deref())
}

/// [`http_client`] for any sender (the forge's commit statuses too): system roots plus
/// `ca_file`, no redirects, [`SEND_TIMEOUT`].
///
/// # Errors
/// `ca_file` unreadable or holding no certificate; the TLS setup failing.
pub fn http_client_trusting(ca_file: Option<&std::path::Path>) -> Result<reqwest::Client, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut extra = Vec::new();
    if let Some(file) = ca_file {
        let pem =
            std::fs::read(file).map_err(|e| format!("reading ca_file {}: {e}", file.display()))?;
        extra = CertificateDer::pem_slice_iter(&pem)
            .filter_map(Result::ok)
            .collect();
        if extra.is_empty() {
            return Err(format!(
                "ca_file {} holds no PEM certificate",
                file.display()
            ));
        }
    }
    let verifier =
        rustls_platform_verifier::Verifier::new_with_extra_roots(extra, provider.clone())
            .map_err(|e| format!("setting up TLS: {e}"))?;
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("setting up TLS: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(SEND_TIMEOUT)
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("proxops/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("building the HTTP client: {}", error_text(&e.without_url())))
}

impl Deliverer {
    /// Sends the queue's messages until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let label = self.target.label();
        let mut limit = RateLimit::new(self.target.max_per_minute);
        loop {
            // A summary is due once the minute allows, even if nothing else comes.
            let summary_at = (limit.suppressed > 0).then(|| limit.next_free(Instant::now()));
            let message = tokio::select! {
                () = shutdown.cancelled() => return,
                message = self.queue.next() => Some(message),
                () = sleep_until(summary_at) => None,
            };
            if limit.suppressed > 0 && limit.next_free(Instant::now()) <= Instant::now() {
                let count = limit.suppressed;
                limit.suppressed = 0;
                let _ = limit.allow(Instant::now());
                let summary = summary_message(&self.target, &self.node, count);
                self.deliver(&summary, &label, &shutdown).await;
            }
            let Some(message) = message else { continue };
            if !limit.allow(Instant::now()) {
                self.queue.done(&message.id);
                self.metrics.notification(
                    self.target.index,
                    self.target.kind.as_str(),
                    "rate-limited",
                );
                tracing::warn!(
                    notify = %label,
                    event = message.event,
                    limit = self.target.max_per_minute,
                    "notification not sent: rate limit reached; a summary follows"
                );
                continue;
            }
            self.deliver(&message, &label, &shutdown).await;
            self.queue.done(&message.id);
        }
    }

    /// Sends one message, retrying with backoff.
    async fn deliver(&self, message: &Outgoing, label: &str, shutdown: &CancellationToken) {
        let mut backoff = Backoff::default();
        loop {
            let result = tokio::select! {
                () = shutdown.cancelled() => return,
                result = self.send(message) => result,
            };
            let kind = self.target.kind.as_str();
            match result {
                Ok(()) => {
                    self.metrics.notification(self.target.index, kind, "sent");
                    tracing::info!(notify = %label, event = message.event, "notification sent");
                    return;
                }
                Err(error) if error.retry && message.queued_at.elapsed() < MAX_AGE => {
                    let delay = backoff
                        .after(Verdict::Transient, rand::random::<f64>())
                        .unwrap_or(crate::agent::retry::MIN_BACKOFF);
                    tracing::warn!(
                        notify = %label,
                        event = message.event,
                        error = %error.text,
                        retry_in = ?delay,
                        "notification not delivered; retrying"
                    );
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                Err(error) => {
                    self.metrics.notification(self.target.index, kind, "failed");
                    tracing::error!(
                        notify = %label,
                        event = message.event,
                        error = %error.text,
                        "notification given up"
                    );
                    return;
                }
            }
        }
    }

    async fn send(&self, message: &Outgoing) -> Result<(), SendError> {
        match (&self.target.endpoint, &message.body) {
            (Endpoint::Http(http), Body::Json(body)) => self.send_http(http, body, message).await,
            (
                Endpoint::Email(email),
                Body::Email {
                    subject,
                    text,
                    html,
                },
            ) => send_email(email, self.target.ca_file.as_deref(), subject, text, html).await,
            _ => Err(SendError {
                retry: false,
                text: "internal: a message of the wrong shape for its target".to_owned(),
            }),
        }
    }

    async fn send_http(
        &self,
        http: &HttpTarget,
        body: &Value,
        message: &Outgoing,
    ) -> Result<(), SendError> {
        let request = match self.target.kind {
            Kind::Ntfy => self.http.post(ntfy_root(&http.url)),
            Kind::Matrix => self.http.put(matrix_send_url(
                &http.url,
                http.room.as_deref().unwrap_or_default(),
                &message.id,
            )),
            _ => self.http.post(http.url.clone()),
        };
        let mut request = request.header("X-ProxOps-Event", message.event).json(body);
        if let Some(token) = &http.token {
            request = request.bearer_auth(token.expose_secret());
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => Ok(()),
            Ok(response) => {
                let status = response.status();
                Err(SendError {
                    retry: status.is_server_error()
                        || status == reqwest::StatusCode::TOO_MANY_REQUESTS
                        || status == reqwest::StatusCode::REQUEST_TIMEOUT,
                    text: format!("the target answered HTTP {status}"),
                })
            }
            Err(error) => Err(SendError {
                retry: true,
                text: error_text(&error.without_url()),
            }),
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// ntfy's root URL, where JSON is published: `url` without its last path segment (the
/// topic), so a server behind a path prefix keeps it.
pub fn ntfy_root(url: &reqwest::Url) -> reqwest::Url {
    let mut root = url.clone();
    if let Ok(mut segments) = root.path_segments_mut() {
        segments.pop_if_empty().pop().push("");
    }
    root.set_query(None);
    root
}

/// `PUT {homeserver}/_matrix/client/v3/rooms/{roomId}/send/m.room.message/{txnId}`, the room
/// id and transaction id percent-encoded as path segments.
pub fn matrix_send_url(homeserver: &reqwest::Url, room: &str, txn: &str) -> reqwest::Url {
    let mut url = homeserver.clone();
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty().extend([
            "_matrix",
            "client",
            "v3",
            "rooms",
            room,
            "send",
            "m.room.message",
            txn,
        ]);
    }
    url.set_query(None);
    url
}

/// The summary a rate-limited target gets once the minute allows.
fn summary_message(target: &NotifyTarget, node: &str, count: u64) -> Outgoing {
    Outgoing {
        event: "rate-limited",
        body: crate::notify::summary_body(target, node, count),
        id: crate::notify::next_id(),
        queued_at: Instant::now(),
    }
}

async fn send_email(
    email: &EmailTarget,
    ca_file: Option<&std::path::Path>,
    subject: &str,
    text: &str,
    html: &str,
) -> Result<(), SendError> {
    use lettre::message::{Message, MultiPart};
    use lettre::transport::smtp::authentication::Credentials;
    use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
    use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

    let permanent = |text: String| SendError { retry: false, text };
    let mut builder = Message::builder().from(email.from.clone()).subject(subject);
    for to in &email.to {
        builder = builder.to(to.clone());
    }
    let message = builder
        .multipart(MultiPart::alternative_plain_html(
            text.to_owned(),
            html.to_owned(),
        ))
        .map_err(|e| permanent(format!("building the email: {e}")))?;
    let mut transport = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&email.smtp_host)
        .port(email.smtp_port)
        .timeout(Some(SEND_TIMEOUT));
    if email.starttls {
        let mut tls = TlsParameters::builder(email.smtp_host.clone());
        if let Some(file) = ca_file {
            let pem = std::fs::read(file)
                .map_err(|e| permanent(format!("reading ca_file {}: {e}", file.display())))?;
            let cert = Certificate::from_pem(&pem)
                .map_err(|e| permanent(format!("ca_file {}: {e}", file.display())))?;
            tls = tls.add_root_certificate(cert);
        }
        let tls = tls
            .build_rustls()
            .map_err(|e| permanent(format!("setting up TLS: {e}")))?;
        transport = transport.tls(Tls::Required(tls));
    }
    if let Some((user, password)) = &email.credentials {
        transport = transport.credentials(Credentials::new(
            user.clone(),
            password.expose_secret().to_owned(),
        ));
    }
    transport
        .build()
        .send(message)
        .await
        .map(|_| ())
        .map_err(|e| SendError {
            // A permanent SMTP answer (5xx) will not change on retry; the rest may.
            retry: !e.is_permanent(),
            text: format!(
                "SMTP {}:{}: {}",
                email.smtp_host,
                email.smtp_port,
                error_text(&e)
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::config::topic_of;

    fn message(id: &str) -> Outgoing {
        Outgoing {
            event: "applied",
            body: Body::Json(Value::Null),
            id: id.to_owned(),
            queued_at: Instant::now(),
        }
    }

    #[test]
    fn a_full_queue_drops_its_oldest_message() {
        let queue = Queue::default();
        for i in 0..QUEUE_CAPACITY {
            assert!(queue.push(message(&i.to_string())).is_none());
        }
        let dropped = queue.push(message("new")).unwrap();
        assert_eq!(dropped.id, "0");
        assert_eq!(queue.len(), QUEUE_CAPACITY);
        assert_eq!(queue.front().unwrap().id, "1");
    }

    #[test]
    fn the_rate_limit_refuses_beyond_the_limit_and_frees_a_minute_later() {
        let start = Instant::now();
        let mut limit = RateLimit::new(2);
        assert!(limit.allow(start));
        assert!(limit.allow(start + Duration::from_secs(1)));
        assert!(!limit.allow(start + Duration::from_secs(2)));
        assert_eq!(limit.suppressed, 1);
        assert_eq!(
            limit.next_free(start + Duration::from_secs(2)),
            start + RATE_WINDOW
        );
        assert!(limit.allow(start + RATE_WINDOW));
    }

    #[test]
    fn ntfy_publishes_to_the_root_of_the_topic_url() {
        let url = reqwest::Url::parse("https://ntfy.example.org/prefix/proxops?x=1").unwrap();
        assert_eq!(ntfy_root(&url).as_str(), "https://ntfy.example.org/prefix/");
        let url = reqwest::Url::parse("https://ntfy.example.org/proxops").unwrap();
        assert_eq!(ntfy_root(&url).as_str(), "https://ntfy.example.org/");
        assert_eq!(topic_of(&url).as_deref(), Some("proxops"));
    }

    #[test]
    fn the_matrix_room_id_is_percent_encoded_into_the_send_path() {
        let url = reqwest::Url::parse("https://matrix.example.org/").unwrap();
        assert_eq!(
            matrix_send_url(&url, "!abc:example.org", "proxops-1").as_str(),
            "https://matrix.example.org/_matrix/client/v3/rooms/!abc:example.org/send/m.room.message/proxops-1"
        );
        let url = reqwest::Url::parse("https://example.org/matrix").unwrap();
        assert_eq!(
            matrix_send_url(&url, "#ops/x:example.org", "t").as_str(),
            "https://example.org/matrix/_matrix/client/v3/rooms/%23ops%2Fx:example.org/send/m.room.message/t"
        );
    }
}
