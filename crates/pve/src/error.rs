//! `PveError`: what went wrong talking to PVE, classified for the caller's retry policy.
//!
//! An API error keeps PVE's status, message (first line) and per-parameter `errors` map, so a
//! caller can report PVE's own words. The classification helpers (`is_transient`,
//! `is_lock_timeout`, `is_not_found`, `is_unknown_outcome`) encode PVE's habits: a missing
//! object is a 500 with "no such ..." or "does not exist" (LIVE-FACTS.md §1.1); 595 and 596
//! are AnyEvent::HTTP's codes for pveproxy's proxied request (to another node, and for every
//! `protected` call, i.e. every write, to the local pvedaemon): 595 "errors during connection
//! establishment" (PVE never saw the request), 596 "errors during TLS negotiation, request
//! sending and header processing", which includes pveproxy's 30 s proxy timeout while the
//! handler goes on (pve-http-server 5c9e4ea `src/PVE/APIServer/AnyEvent.pm` `proxy_request`:
//! `timeout => 30`; pve-manager 14a22df3 `PVE/HTTPServer.pm` `rest_handler`: `protected` →
//! `proxy => 'localhost'`).
//!
//! No variant ever holds the API token: the client keeps it in a header value only, and error
//! text names the request as `METHOD /path` without the host's credentials.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::request::Method;

/// Markers of PVE 500 messages that repeating the same request cannot fix.
const PERMANENT_MARKERS: &[&str] = &[
    "no such ",
    "does not exist",
    "already exists",
    "not implemented",
    "permission check failed",
    "parameter verification failed",
    "hostname lookup",
];

/// How a request failed below HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// The connection could not be established; the request was never sent.
    Connect,
    /// The TLS handshake failed (untrusted certificate, protocol error).
    Tls,
    /// No answer within the timeout; the request may have been acted on.
    Timeout,
    /// The request or response failed after the connection was up.
    Other,
}

impl TransportKind {
    fn describe(self) -> &'static str {
        match self {
            Self::Connect => "connection failed",
            Self::Tls => "tls handshake failed",
            Self::Timeout => "timed out",
            Self::Other => "request failed",
        }
    }
}

/// An error from the PVE client.
#[derive(Debug, thiserror::Error)]
pub enum PveError {
    /// PVE (or its proxy) answered with a non-success status.
    #[error("{method} {path}: {status} {}", api_text(message, errors, *status))]
    Api {
        /// Request method.
        method: Method,
        /// Request path below `/api2/json`.
        path: String,
        /// HTTP status (PVE also uses 595/596 for node-to-node proxy failures).
        status: u16,
        /// PVE's message, first line, trailing newline trimmed; empty when PVE sent none.
        message: String,
        /// Per-parameter errors (`{"filename": "wrong file extension"}`).
        errors: BTreeMap<String, String>,
    },
    /// The request did not get an HTTP answer.
    #[error("{method} {path}: {}", kind.describe())]
    Transport {
        /// Request method.
        method: Method,
        /// Request path below `/api2/json`.
        path: String,
        /// What failed.
        kind: TransportKind,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
    /// The server's certificate does not match the pinned fingerprint.
    #[error(
        "{method} {path}: server certificate fingerprint {actual} does not match the pinned fingerprint {expected}"
    )]
    FingerprintMismatch {
        /// Request method.
        method: Method,
        /// Request path below `/api2/json`.
        path: String,
        /// The pinned fingerprint.
        expected: String,
        /// The fingerprint the server presented.
        actual: String,
    },
    /// The answer was not the JSON shape expected.
    #[error("{method} {path}: unexpected response")]
    Decode {
        /// Request method.
        method: Method,
        /// Request path below `/api2/json`.
        path: String,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
    /// The CA file could not be read.
    #[error("reading CA file {path}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The CA file holds no usable certificate.
    #[error("CA file {path} contains no usable PEM certificate")]
    NoCaCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The fingerprint pin is not a SHA-256 fingerprint.
    #[error("invalid certificate fingerprint {value:?}: expected 32 colon-separated hex bytes")]
    InvalidFingerprint {
        /// The configured value (a fingerprint is public).
        value: String,
    },
    /// The base URL is unusable.
    #[error("invalid PVE url {url:?}: {reason}")]
    InvalidUrl {
        /// The configured URL.
        url: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The token id does not look like `USER@REALM!TOKENID`.
    #[error("invalid API token id {token_id:?}: expected USER@REALM!TOKENID")]
    InvalidTokenId {
        /// The configured token id (not secret).
        token_id: String,
    },
    /// The token secret cannot be sent in an HTTP header (the value itself is never shown).
    #[error("invalid API token secret: it must be printable ASCII without spaces")]
    InvalidTokenSecret,
    /// The TLS configuration could not be built.
    #[error("setting up TLS")]
    TlsSetup {
        /// The rustls error.
        #[source]
        source: rustls::Error,
    },
    /// The HTTP client could not be built.
    #[error("building the HTTP client")]
    ClientBuild {
        /// The reqwest error.
        #[source]
        source: reqwest::Error,
    },
}

fn api_text(message: &str, errors: &BTreeMap<String, String>, status: u16) -> String {
    let mut text = if message.is_empty() {
        fallback_message(status).to_owned()
    } else {
        message.to_owned()
    };
    if !errors.is_empty() {
        let list: Vec<String> = errors.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        text.push_str(&format!(" ({})", list.join("; ")));
    }
    text
}

/// Text for answers without a body (PVE sends 401 and 59x with an empty one).
fn fallback_message(status: u16) -> &'static str {
    match status {
        401 => "authentication failed (check the API token id and secret)",
        403 => "permission denied",
        595 => "pve could not reach the node (connection error)",
        596 => "pve's proxy got no answer in time (tls, request or timeout error)",
        597 => "pve's proxy lost the answer (error receiving the body)",
        501 => "not implemented",
        _ => "no message",
    }
}

impl PveError {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// PVE's message of an API error (first line, may be empty).
    pub fn message(&self) -> Option<&str> {
        match self {
            Self::Api { message, .. } => Some(message),
            _ => None,
        }
    }

    /// PVE's per-parameter errors of an API error (empty for other errors).
    pub fn errors(&self) -> Option<&BTreeMap<String, String>> {
        match self {
            Self::Api { errors, .. } => Some(errors),
            _ => None,
        }
    }

    /// Whether the object addressed does not exist (`no such vm`, `does not exist`, 404).
    pub fn is_not_found(&self) -> bool {
        match self {
            Self::Api {
                status,
                message,
                errors,
                ..
            } => {
                *status == 404
                    || std::iter::once(message)
                        .chain(errors.values())
                        .any(|m| is_not_found_text(m))
            }
            _ => false,
        }
    }

    /// Whether PVE refused the credentials or the token's privileges (401, 403): retrying
    /// cannot help until the configuration changes.
    pub fn is_auth_failure(&self) -> bool {
        matches!(self.status(), Some(401 | 403))
    }

    /// Whether a guest or config lock was busy (`can't lock file ... got timeout`, `is locked`).
    pub fn is_lock_timeout(&self) -> bool {
        self.message().is_some_and(|m| {
            let m = m.to_ascii_lowercase();
            (m.contains("can't lock file") && m.contains("got timeout")) || m.contains("is locked")
        })
    }

    /// Whether the same request may succeed later: network trouble, 5xx from PVE or its proxy
    /// (except answers that say the object is missing or the request is wrong), lock contention.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Transport { kind, .. } => *kind != TransportKind::Tls,
            Self::Api { status, .. } => match status {
                502..=504 | 595..=597 => true,
                500 => self.is_lock_timeout() || !self.is_permanent_failure(),
                _ => false,
            },
            _ => false,
        }
    }

    /// Whether the client may resend the request that produced this error.
    ///
    /// GETs are retried on any transport error and on transient 5xx answers. Writes are
    /// retried only where PVE cannot have acted: our connection never came up, or pveproxy
    /// could not connect to the daemon that runs the handler (595, "errors during connection
    /// establishment"). A 596 or 597 (the request was being sent, or pveproxy's 30 s proxy
    /// timeout ran out while the handler goes on) and a timeout are
    /// [unknown outcomes](Self::is_unknown_outcome), never resent.
    pub(crate) fn is_retryable_for(&self, method: Method) -> bool {
        match self {
            Self::Transport { kind, .. } => match kind {
                TransportKind::Connect => true,
                TransportKind::Timeout | TransportKind::Other => method == Method::Get,
                TransportKind::Tls => false,
            },
            Self::Api { status, .. } => match status {
                595 => true,
                596 | 597 => method == Method::Get,
                500 | 502..=504 => method == Method::Get && !self.is_permanent_failure(),
                _ => false,
            },
            _ => false,
        }
    }

    /// Whether this error on a write leaves unknown whether PVE acted: a 596/597 from
    /// pveproxy (AnyEvent::HTTP sets 596 before it writes the request and keeps it while it
    /// waits for the answer, so pveproxy's 30 s proxy timeout answers 596 while pvedaemon's
    /// handler goes on; 597 is an error while the answer's body was received), or a timeout
    /// or broken connection after the request went out. The caller must find out from PVE
    /// (task list, config digest, volume listing) what happened before it does anything else;
    /// sending the write again could do it twice or fail against PVE's own lock.
    ///
    /// Always false for a GET and for errors that prove PVE did not act (595, a refused
    /// connection, a TLS handshake failure).
    pub fn is_unknown_outcome(&self) -> bool {
        match self {
            Self::Transport { method, kind, .. } => {
                method.is_write() && matches!(kind, TransportKind::Timeout | TransportKind::Other)
            }
            Self::Api { method, status, .. } => method.is_write() && matches!(status, 596 | 597),
            _ => false,
        }
    }

    fn is_permanent_failure(&self) -> bool {
        self.is_not_found()
            || self.message().is_some_and(|m| {
                let m = m.to_ascii_lowercase();
                PERMANENT_MARKERS.iter().any(|p| m.contains(p))
            })
    }
}

fn is_not_found_text(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    t.contains("no such ") || t.contains("does not exist")
}

/// PVE's error body decoded into (first line of `message`, `errors`).
pub(crate) fn decode_error_body(body: &[u8]) -> (String, BTreeMap<String, String>) {
    let mut errors = BTreeMap::new();
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        // Non-JSON bodies happen behind proxies and in some PVE paths: keep the first line.
        return (first_line(&String::from_utf8_lossy(body)), errors);
    };
    let message = value
        .get("message")
        .and_then(serde_json::Value::as_str)
        .map(first_line)
        .unwrap_or_default();
    match value.get("errors") {
        Some(serde_json::Value::Object(map)) => {
            for (k, v) in map {
                let text = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                errors.insert(k.clone(), text.trim_end().to_owned());
            }
        }
        // Not PVE's shape, but some mocks send a string; keep it rather than lose it.
        Some(serde_json::Value::String(s)) if !s.is_empty() => {
            errors.insert(String::new(), s.trim_end().to_owned());
        }
        _ => {}
    }
    (message, errors)
}

fn first_line(text: &str) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    // Bound what a misbehaving proxy can put into our logs.
    line.chars().take(500).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(method: Method, status: u16, body: &str) -> PveError {
        let (message, errors) = decode_error_body(body.as_bytes());
        PveError::Api {
            method,
            path: "/nodes/pve1/storage/local/content".into(),
            status,
            message,
            errors,
        }
    }

    #[test]
    fn api_error_names_the_request_and_keeps_pve_first_line() {
        let e = api(
            Method::Get,
            500,
            r#"{"data":null,"message":"storage 'local' is not online\nsecond line\n"}"#,
        );
        assert_eq!(
            e.to_string(),
            "GET /nodes/pve1/storage/local/content: 500 storage 'local' is not online"
        );
        assert_eq!(e.message(), Some("storage 'local' is not online"));
        assert!(e.is_transient());
        assert!(e.is_retryable_for(Method::Get));
        assert!(!e.is_retryable_for(Method::Post));
    }

    #[test]
    fn parameter_errors_are_kept_per_parameter_and_shown() {
        let e = api(
            Method::Post,
            400,
            r#"{"data":null,"message":"Parameter verification failed.\n","errors":{"filename":"wrong file extension\n","url":"value does not match the regex pattern"}}"#,
        );
        let errors = e.errors().unwrap();
        assert_eq!(errors["filename"], "wrong file extension");
        assert_eq!(errors.len(), 2);
        assert!(e.to_string().ends_with(
            "400 Parameter verification failed. (filename: wrong file extension; url: value does not match the regex pattern)"
        ));
        assert!(!e.is_transient());
        assert!(!e.is_retryable_for(Method::Get));
    }

    #[test]
    fn recorded_400_without_message_keeps_its_errors() {
        let body = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/error-400-nextid-exists.go-proxmox-pve8x.json"
        ));
        let e = api(Method::Get, 400, body);
        assert_eq!(e.errors().unwrap()["vmid"], "VM 200 already exists");
    }

    #[test]
    fn missing_objects_are_not_found_and_never_retried() {
        for body in [
            r#"{"data":null,"message":"no such vm 104\n"}"#,
            r#"{"data":null,"message":"Configuration file 'nodes/pve1/qemu-server/104.conf' does not exist\n"}"#,
            r#"{"data":null,"errors":{"upid":"no such task"}}"#,
        ] {
            let status = if body.contains("upid") { 400 } else { 500 };
            let e = api(Method::Get, status, body);
            assert!(e.is_not_found(), "{body}");
            assert!(!e.is_transient(), "{body}");
            assert!(!e.is_retryable_for(Method::Get), "{body}");
        }
    }

    #[test]
    fn lock_contention_is_a_transient_lock_timeout() {
        for msg in [
            "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout",
            "VM 100 is locked (create)",
        ] {
            let e = api(
                Method::Put,
                500,
                &format!(r#"{{"data":null,"message":"{msg}\n"}}"#),
            );
            assert!(e.is_lock_timeout(), "{msg}");
            assert!(e.is_transient(), "{msg}");
            assert!(!e.is_retryable_for(Method::Put), "{msg}");
        }
    }

    #[test]
    fn a_595_is_resent_for_every_method_because_pve_never_saw_the_request() {
        let e = api(Method::Post, 595, "");
        assert_eq!(e.message(), Some(""));
        assert!(e.is_transient());
        assert!(e.is_retryable_for(Method::Post));
        assert!(!e.is_unknown_outcome());
        assert!(e.to_string().contains("595 pve could not reach the node"));
    }

    #[test]
    fn a_596_on_a_write_is_an_unknown_outcome_and_never_resent() {
        for status in [596, 597] {
            for method in [Method::Post, Method::Put, Method::Delete] {
                let e = api(method, status, "");
                assert!(!e.is_retryable_for(method), "{method:?} {status}");
                assert!(e.is_unknown_outcome(), "{method:?} {status}");
                assert!(e.is_transient(), "{method:?} {status}");
            }
            let get = api(Method::Get, status, "");
            assert!(get.is_retryable_for(Method::Get), "{status}");
            assert!(
                !get.is_unknown_outcome(),
                "a read has no outcome to find out"
            );
        }
        assert!(
            api(Method::Put, 596, "")
                .to_string()
                .contains("596 pve's proxy got no answer in time")
        );
    }

    #[test]
    fn refusals_and_server_errors_on_a_write_are_known_outcomes() {
        for status in [400, 403, 500, 503] {
            assert!(
                !api(Method::Post, status, "").is_unknown_outcome(),
                "{status}"
            );
        }
    }

    #[test]
    fn auth_and_permission_failures_are_not_transient() {
        for status in [401, 403] {
            let e = api(Method::Get, status, "");
            assert!(e.is_auth_failure());
            assert!(!e.is_transient());
            assert!(!e.is_retryable_for(Method::Get));
        }
        assert!(
            api(Method::Get, 401, "")
                .to_string()
                .contains("401 authentication failed")
        );
    }

    #[test]
    fn text_bodies_become_the_message() {
        let e = api(Method::Post, 500, "storage 'missing' does not exist");
        assert_eq!(e.message(), Some("storage 'missing' does not exist"));
        assert!(e.is_not_found());
    }

    #[test]
    fn not_implemented_is_permanent() {
        let e = api(
            Method::Get,
            501,
            r#"{"data":null,"message":"Method 'GET /nodes/pve1/storage/local/download-url' not implemented\n"}"#,
        );
        assert!(!e.is_transient());
        assert!(!e.is_retryable_for(Method::Get));
    }
}
