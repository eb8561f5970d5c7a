//! `PveClient`: sends [`Request`]s to PVE over HTTPS with API-token auth, retries what is safe
//! to retry, and unwraps PVE's `{"data": ...}` envelope.
//!
//! The token secret is turned into a sensitive `Authorization` header value once, in
//! [`PveClient::new`], and is never stored anywhere else; `Debug` of the client shows only the
//! token id. Retries (backon, exponential with jitter, `tokio::time` sleeps) follow
//! `PveError::is_retryable_for`: GETs on transport errors and transient 5xx answers; writes
//! only when PVE cannot have acted (no connection, or a 595 from pveproxy). A 596 or a
//! timeout on a write is handed back as it is ([`PveError::is_unknown_outcome`]): PVE may
//! have acted, and only the caller knows how to find out.
//! Decisions about *what* to send live elsewhere; this file only sends.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use reqwest::header::{AUTHORIZATION, HeaderValue};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::cluster::{ClusterResource, NodeInfo, ResourceType, Version};
use crate::error::{PveError, TransportKind, decode_error_body};
use crate::request::{self, Method, Request};
use crate::storage::{ContentItem, ContentType, DownloadUrl, StorageConfig, StorageInfo};
use crate::task::{TaskDurations, TaskLogLine, TaskStatus};
use crate::trust::{PinMismatch, Trust, tls_config};
use crate::upid::Upid;

/// Default TCP+TLS connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default timeout of one request, answer included.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Connect and per-request timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP connect plus TLS handshake.
    pub connect: Duration,
    /// One request attempt, from sending to the end of the answer.
    pub request: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: DEFAULT_CONNECT_TIMEOUT,
            request: DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

/// How often and how patiently to resend a failed request that is safe to resend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Resends after the first attempt (0 disables retries).
    pub max_retries: usize,
    /// Delay before the first resend; it doubles each time.
    pub min_delay: Duration,
    /// Cap of the delay.
    pub max_delay: Duration,
    /// Add random jitter to each delay, so many agents do not retry in step.
    pub jitter: bool,
}

impl RetryPolicy {
    /// No retries at all.
    pub const NONE: RetryPolicy = RetryPolicy {
        max_retries: 0,
        min_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
        jitter: false,
    };

    fn backoff(&self) -> ExponentialBuilder {
        let builder = ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(self.max_retries);
        if self.jitter {
            builder.with_jitter()
        } else {
            builder
        }
    }
}

impl Default for RetryPolicy {
    /// 3 resends, 200 ms doubling to at most 5 s, with jitter.
    fn default() -> Self {
        Self {
            max_retries: 3,
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            jitter: true,
        }
    }
}

/// What a [`PveClient`] needs; built by the config layer.
#[derive(Debug)]
pub struct ClientConfig {
    /// `https://host:8006` (a trailing `/api2/json` is accepted). No credentials in the URL.
    pub base_url: String,
    /// API token id, `USER@REALM!TOKENID`.
    pub token_id: String,
    /// API token secret (a UUID); only ever exposed to build the header.
    pub token_secret: SecretString,
    /// How to trust the server certificate.
    pub trust: Trust,
    /// Timeouts.
    pub timeout: Timeouts,
    /// Retry policy.
    pub retry: RetryPolicy,
}

/// An async PVE REST client. Cheap to clone; clones share the connection pool and counters.
#[derive(Clone)]
pub struct PveClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// `https://host:8006/api2/json`.
    api_base: String,
    token_id: String,
    /// `PVEAPIToken=<id>=<secret>`, marked sensitive.
    auth: HeaderValue,
    retry: RetryPolicy,
    pin: Option<String>,
    requests_sent: AtomicU64,
    writes_sent: AtomicU64,
    /// How long each task type took: the task waits' poll schedule (`task::next_poll`).
    task_durations: TaskDurations,
}

impl fmt::Debug for PveClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PveClient")
            .field("api_base", &self.inner.api_base)
            .field("token_id", &self.inner.token_id)
            .field("token_secret", &"[redacted]")
            .field("retry", &self.inner.retry)
            .field("writes_sent", &self.writes_sent())
            .finish_non_exhaustive()
    }
}

/// PVE's token id syntax (BEHAVIOUR.md §2).
fn is_valid_token_id(id: &str) -> bool {
    let Some((user, token)) = id.split_once('!') else {
        return false;
    };
    let Some((name, realm)) = user.rsplit_once('@') else {
        return false;
    };
    let ident = |s: &str, min: usize| {
        s.len() >= min
            && s.starts_with(|c: char| c.is_ascii_alphabetic())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    };
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c == ':' || c == '/')
        && ident(realm, 2)
        && ident(token, 2)
}

/// `url` with any `user:password@` replaced, so an error never repeats a credential.
fn redact_userinfo(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://[redacted]@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

fn api_base(url: &str) -> Result<String, PveError> {
    let invalid = |reason| PveError::InvalidUrl {
        url: redact_userinfo(url),
        reason,
    };
    let parsed = reqwest::Url::parse(url).map_err(|_| invalid("not an absolute URL"))?;
    if !matches!(parsed.scheme(), "https" | "http") {
        return Err(invalid("the scheme must be https"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(invalid(
            "credentials belong in the token settings, not the URL",
        ));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid("no query or fragment allowed"));
    }
    let trimmed = url.trim_end_matches('/');
    let trimmed = trimmed.strip_suffix("/api2/json").unwrap_or(trimmed);
    Ok(format!("{trimmed}/api2/json"))
}

impl PveClient {
    /// Builds a client. Does not contact PVE.
    ///
    /// # Errors
    /// Invalid URL, token id or secret; unreadable CA file; malformed fingerprint.
    pub fn new(config: ClientConfig) -> Result<Self, PveError> {
        let api_base = api_base(&config.base_url)?;
        if !is_valid_token_id(&config.token_id) {
            return Err(PveError::InvalidTokenId {
                token_id: config.token_id,
            });
        }
        let auth = auth_header(&config.token_id, &config.token_secret)?;
        let pin = match &config.trust {
            Trust::Fingerprint(f) => Some(f.clone()),
            _ => None,
        };
        let tls = tls_config(&config.trust)?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .connect_timeout(config.timeout.connect)
            .timeout(config.timeout.request)
            .user_agent(concat!("proxops/", env!("CARGO_PKG_VERSION")))
            // PVE never redirects; not following keeps the token on the configured host.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|source| PveError::ClientBuild { source })?;
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                api_base,
                token_id: config.token_id,
                auth,
                retry: config.retry,
                pin,
                requests_sent: AtomicU64::new(0),
                writes_sent: AtomicU64::new(0),
                task_durations: TaskDurations::default(),
            }),
        })
    }

    /// How long the task types this client waited for took (the poll schedule's expectation).
    pub fn task_durations(&self) -> &TaskDurations {
        &self.inner.task_durations
    }

    /// The API token's id (`user@realm!name`): the user PVE writes into the tasks it starts.
    pub fn token_id(&self) -> &str {
        &self.inner.token_id
    }

    /// Number of non-GET requests sent so far (each attempt counts). `adopt` asserts it stays 0.
    pub fn writes_sent(&self) -> u64 {
        self.inner.writes_sent.load(Ordering::Relaxed)
    }

    /// Number of HTTP requests sent so far (each attempt counts).
    pub fn requests_sent(&self) -> u64 {
        self.inner.requests_sent.load(Ordering::Relaxed)
    }

    /// Sends `req` (with retries where safe) and returns the answer's `data`.
    ///
    /// # Errors
    /// The last attempt's [`PveError`].
    pub async fn execute(&self, req: &Request) -> Result<Value, PveError> {
        let retry = self.inner.retry;
        (|| self.send_once(req))
            .retry(retry.backoff())
            .sleep(tokio::time::sleep)
            .when(|e: &PveError| e.is_retryable_for(req.method))
            .notify(|e: &PveError, delay: Duration| {
                tracing::debug!(error = %e, ?delay, "retrying PVE request");
            })
            .await
    }

    /// Sends `req` and decodes `data` as `T`.
    ///
    /// # Errors
    /// As [`execute`](Self::execute), plus [`PveError::Decode`] for an unexpected shape.
    pub async fn execute_as<T: DeserializeOwned>(&self, req: &Request) -> Result<T, PveError> {
        let data = self.execute(req).await?;
        serde_json::from_value(data).map_err(|source| PveError::Decode {
            method: req.method,
            path: req.path.clone(),
            source,
        })
    }

    async fn send_once(&self, req: &Request) -> Result<Value, PveError> {
        let inner = &*self.inner;
        let method = match req.method {
            Method::Get => reqwest::Method::GET,
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
            Method::Delete => reqwest::Method::DELETE,
        };
        let mut builder = inner
            .http
            .request(method, format!("{}{}", inner.api_base, req.path))
            .header(AUTHORIZATION, inner.auth.clone());
        if !req.query.is_empty() {
            builder = builder.query(&req.query);
        }
        if !req.form.is_empty() {
            builder = builder.form(&req.form);
        }
        inner.requests_sent.fetch_add(1, Ordering::Relaxed);
        if req.method.is_write() {
            inner.writes_sent.fetch_add(1, Ordering::Relaxed);
        }
        let response = builder
            .send()
            .await
            .map_err(|e| self.transport_error(req, e))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(req, e))?;
        tracing::debug!(request = %req, status = status.as_u16(), "pve answered");
        if !status.is_success() {
            let (message, errors) = decode_error_body(&body);
            return Err(PveError::Api {
                method: req.method,
                path: req.path.clone(),
                status: status.as_u16(),
                message,
                errors,
            });
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        let decode = |source| PveError::Decode {
            method: req.method,
            path: req.path.clone(),
            source,
        };
        match serde_json::from_slice::<Value>(&body).map_err(decode)? {
            Value::Object(mut envelope) => Ok(envelope.remove("data").unwrap_or(Value::Null)),
            other => Ok(other),
        }
    }

    fn transport_error(&self, req: &Request, source: reqwest::Error) -> PveError {
        if let Some(mismatch) = find_pin_mismatch(&source) {
            return PveError::FingerprintMismatch {
                method: req.method,
                path: req.path.clone(),
                expected: self
                    .inner
                    .pin
                    .clone()
                    .unwrap_or_else(|| mismatch.expected.to_string()),
                actual: mismatch.actual.to_string(),
            };
        }
        let kind = if has_rustls_error(&source) {
            TransportKind::Tls
        } else if source.is_connect() {
            TransportKind::Connect
        } else if source.is_timeout() {
            TransportKind::Timeout
        } else {
            TransportKind::Other
        };
        PveError::Transport {
            method: req.method,
            path: req.path.clone(),
            kind,
            source,
        }
    }

    // ---- typed calls ---------------------------------------------------------------------

    /// `GET /version`.
    ///
    /// # Errors
    /// See [`execute`](Self::execute).
    pub async fn version(&self) -> Result<Version, PveError> {
        self.execute_as(&request::version()).await
    }

    /// `GET /cluster/resources[?type=...]`.
    ///
    /// # Errors
    /// See [`execute`](Self::execute).
    pub async fn cluster_resources(
        &self,
        resource_type: Option<ResourceType>,
    ) -> Result<Vec<ClusterResource>, PveError> {
        self.execute_as(&request::cluster_resources(resource_type))
            .await
    }

    /// `POST /nodes/{node}/qemu/{vmid}/agent/ping`: `Ok` when the VM's QEMU guest agent
    /// answers.
    ///
    /// # Errors
    /// See [`execute`](Self::execute); PVE's 500 message says why the agent did not answer.
    pub async fn qemu_agent_ping(&self, node: &str, vmid: u32) -> Result<(), PveError> {
        self.execute(&request::qemu_agent_ping(node, vmid))
            .await
            .map(drop)
    }

    /// `GET /nodes`.
    ///
    /// # Errors
    /// See [`execute`](Self::execute).
    pub async fn nodes(&self) -> Result<Vec<NodeInfo>, PveError> {
        self.execute_as(&request::nodes()).await
    }

    /// `GET /nodes/{node}/storage`.
    ///
    /// # Errors
    /// See [`execute`](Self::execute).
    pub async fn storages(&self, node: &str) -> Result<Vec<StorageInfo>, PveError> {
        self.execute_as(&request::storages(node)).await
    }

    /// `GET /nodes/{node}/storage/{storage}/content?content=<type>`.
    ///
    /// # Errors
    /// See [`execute`](Self::execute).
    pub async fn storage_content(
        &self,
        node: &str,
        storage: &str,
        content: Option<ContentType>,
    ) -> Result<Vec<ContentItem>, PveError> {
        self.execute_as(&request::storage_content(node, storage, content))
            .await
    }

    /// `GET /storage/{storage}`: the storage's configuration (needs `Datastore.Allocate`).
    ///
    /// # Errors
    /// As [`PveClient::execute`], or the answer does not decode.
    pub async fn storage_config(&self, storage: &str) -> Result<StorageConfig, PveError> {
        self.execute_as(&request::storage_config(storage)).await
    }

    /// `POST /nodes/{node}/storage/{storage}/download-url`; returns the `download` task.
    ///
    /// # Errors
    /// See [`execute`](Self::execute); `Decode` when PVE does not answer with a UPID.
    pub async fn download_url(
        &self,
        node: &str,
        storage: &str,
        download: &DownloadUrl,
    ) -> Result<Upid, PveError> {
        self.execute_as(&request::download_url(node, storage, download))
            .await
    }

    /// `GET /nodes/{node}/tasks/{upid}/status`.
    ///
    /// # Errors
    /// See [`execute`](Self::execute).
    pub async fn task_status(&self, node: &str, upid: &Upid) -> Result<TaskStatus, PveError> {
        self.execute_as(&request::task_status(node, upid)).await
    }

    /// `GET /nodes/{node}/tasks/{upid}/log`, lines `start..start+limit` (0-based start).
    ///
    /// # Errors
    /// See [`execute`](Self::execute).
    pub async fn task_log(
        &self,
        node: &str,
        upid: &Upid,
        start: u64,
        limit: u64,
    ) -> Result<Vec<TaskLogLine>, PveError> {
        self.execute_as(&request::task_log(node, upid, start, limit))
            .await
    }
}

/// The only place the secret is exposed: building the header value, marked sensitive so
/// reqwest and `http` never print it.
fn auth_header(token_id: &str, secret: &SecretString) -> Result<HeaderValue, PveError> {
    let secret = secret.expose_secret();
    if secret.is_empty() || !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(PveError::InvalidTokenSecret);
    }
    let text = secrecy::zeroize::Zeroizing::new(format!("PVEAPIToken={token_id}={secret}"));
    let mut value = HeaderValue::from_str(&text).map_err(|_| PveError::InvalidTokenSecret)?;
    value.set_sensitive(true);
    Ok(value)
}

/// Walks an error chain and returns the first `rustls::Error`. An `io::Error`'s `source()`
/// skips the error it wraps (and hyper nests io errors), so those are stepped into explicitly.
fn find_rustls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut current: Option<&'a (dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        current = match e.downcast_ref::<std::io::Error>() {
            Some(io) => match io.get_ref() {
                Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
                None => e.source(),
            },
            None => e.source(),
        };
    }
    None
}

fn has_rustls_error(err: &reqwest::Error) -> bool {
    find_rustls_error(err).is_some()
}

fn find_pin_mismatch(err: &reqwest::Error) -> Option<&PinMismatch> {
    match find_rustls_error(err)? {
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)) => {
            other.0.downcast_ref::<PinMismatch>()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "5f0c2a7e-1b7d-4b8e-9a43-d1f0c1e2a3b4";

    fn config(trust: Trust) -> ClientConfig {
        ClientConfig {
            base_url: "https://pve1.example.invalid:8006".into(),
            token_id: "proxops@pve!agent".into(),
            token_secret: SecretString::from(SECRET),
            trust,
            timeout: Timeouts::default(),
            retry: RetryPolicy::default(),
        }
    }

    #[test]
    fn client_debug_never_shows_the_secret() {
        let cfg = config(Trust::Insecure);
        assert!(!format!("{cfg:?}").contains(SECRET));
        let client = PveClient::new(cfg).unwrap();
        let debug = format!("{client:?}");
        assert!(!debug.contains(SECRET), "{debug}");
        assert!(debug.contains("proxops@pve!agent"));
        assert!(!format!("{:?}", client.inner.auth).contains(SECRET));
    }

    #[test]
    fn construction_errors_never_show_the_secret() {
        let mut bad = config(Trust::Fingerprint("nope".into()));
        bad.token_id = "no-realm".into();
        let errors = [
            PveClient::new(bad).unwrap_err(),
            PveClient::new(ClientConfig {
                token_secret: SecretString::from(format!("{SECRET} x")),
                ..config(Trust::Insecure)
            })
            .unwrap_err(),
            PveClient::new(config(Trust::Fingerprint("nope".into()))).unwrap_err(),
            PveClient::new(ClientConfig {
                base_url: format!("https://root:{SECRET}@pve1:8006"),
                ..config(Trust::Insecure)
            })
            .unwrap_err(),
        ];
        for e in &errors {
            assert!(!format!("{e:?}").contains(SECRET), "{e:?}");
            assert!(!e.to_string().contains(SECRET), "{e}");
        }
        assert!(matches!(errors[0], PveError::InvalidTokenId { .. }));
        assert!(matches!(errors[1], PveError::InvalidTokenSecret));
        assert!(matches!(errors[2], PveError::InvalidFingerprint { .. }));
        assert!(matches!(errors[3], PveError::InvalidUrl { .. }));
    }

    #[test]
    fn base_url_is_normalised_to_api2_json() {
        for url in [
            "https://pve1:8006",
            "https://pve1:8006/",
            "https://pve1:8006/api2/json",
            "https://pve1:8006/api2/json/",
        ] {
            assert_eq!(api_base(url).unwrap(), "https://pve1:8006/api2/json");
        }
        assert!(api_base("pve1:8006").is_err());
        assert_eq!(
            redact_userinfo("https://root:pw@pve1:8006/x@y"),
            "https://[redacted]@pve1:8006/x@y"
        );
        assert!(api_base("ftp://pve1").is_err());
    }

    #[test]
    fn token_ids_follow_pve_syntax() {
        for ok in ["root@pam!ci", "proxops@pve!agent-1", "a.b@ldap.corp!t_1"] {
            assert!(is_valid_token_id(ok), "{ok}");
        }
        for bad in [
            "root@pam",
            "root!ci",
            "@pam!ci",
            "root@pam!",
            "ro ot@pam!ci",
            "r@1x!ci",
        ] {
            assert!(!is_valid_token_id(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn connection_refused_is_a_transient_transport_error_without_the_secret() {
        // Bind then drop a listener to get a port nobody listens on.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let client = PveClient::new(ClientConfig {
            base_url: format!("https://127.0.0.1:{port}"),
            retry: RetryPolicy {
                max_retries: 2,
                min_delay: Duration::from_millis(1),
                max_delay: Duration::from_millis(2),
                jitter: false,
            },
            ..config(Trust::Insecure)
        })
        .unwrap();
        let err = client.version().await.unwrap_err();
        assert!(
            matches!(
                err,
                PveError::Transport {
                    kind: TransportKind::Connect,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.is_transient());
        assert_eq!(err.to_string(), "GET /version: connection failed");
        assert!(!format!("{err:?}").contains(SECRET));
        assert_eq!(client.requests_sent(), 3, "connect errors are retried");
        assert_eq!(client.writes_sent(), 0);

        // A write is retried too when the connection never came up (PVE cannot have acted).
        let d = DownloadUrl::new(ContentType::Iso, "http://127.0.0.1/a.iso", "a.iso");
        assert!(client.download_url("pve1", "local", &d).await.is_err());
        assert_eq!(client.writes_sent(), 3);
    }
}
