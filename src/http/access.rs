//! Who may read the status API, page and metrics (SECURITY-AUDIT.md L1).
//!
//! The audit found the API unauthenticated, answering any `Host` (so a web page a node
//! operator opens could read it through DNS rebinding), and carrying absolute paths of the node
//! in `last_error`. One middleware in front of the status routes:
//!
//! 1. **Host.** The request's host (the absolute-form URI's, else the `Host` header's, without
//!    port) must be one of `[http] allowed_hosts` (default: `localhost`, `127.0.0.1`, `[::1]`
//!    and the IP `[http] listen` is bound to), else 421 Misdirected Request naming the key.
//! 2. **Token.** With `[http] token_file` set, every route but `/healthz` and `/readyz` needs
//!    `Authorization: Bearer <token>` (or HTTP Basic with the token as password, any user, so
//!    a browser can open the page), else 401 with a `WWW-Authenticate` challenge. The
//!    comparison is over SHA-256 digests in constant time; the token is never logged.
//! 3. **Paths.** Absolute paths of the state directory, the config directory and systemd's
//!    credentials directory are replaced by `<state_dir>`, `<config_dir>` and
//!    `<credentials>` in every answer's body, so an error such as "opening the git mirror
//!    /var/lib/proxops/git: ..." reads "opening the git mirror <state_dir>/git: ...".
//!
//! The webhook routes are not behind this: forges name whatever host their URL has, and every
//! delivery is checked by its HMAC signature instead.

use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

/// Routes that answer without a token: liveness and readiness carry nothing to protect, and
/// probes (systemd, a load balancer) rarely carry credentials.
const OPEN_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// The largest answer whose paths are redacted; larger ones are refused rather than sent
/// unredacted (the largest real answer, 1,000 revisions, is well below).
const MAX_REDACTED_BYTES: usize = 16 * 1024 * 1024;

/// What the middleware enforces; built once from the config.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// `[http] token_file`'s token.
    pub token: Option<SecretString>,
    /// `[http] allowed_hosts`, lower case, without ports (`*`: any).
    pub allowed_hosts: Vec<String>,
    /// (absolute path prefix, what replaces it), longest first.
    pub redactions: Vec<(String, &'static str)>,
}

impl Access {
    /// From the config: its token and hosts, and the paths to keep out of answers.
    pub fn from_config(config: &crate::config::AgentConfig, config_path: &Path) -> Self {
        let mut redactions = Vec::new();
        let mut add = |path: &Path, label: &'static str| {
            for candidate in [Some(path.to_path_buf()), std::fs::canonicalize(path).ok()]
                .into_iter()
                .flatten()
            {
                let text = candidate.display().to_string();
                let text = text.trim_end_matches('/').to_owned();
                if candidate.is_absolute()
                    && text.len() > 1
                    && !redactions.iter().any(|(p, _)| *p == text)
                {
                    redactions.push((text, label));
                }
            }
        };
        add(&config.state_dir, "<state_dir>");
        if let Some(dir) = config_path.parent().filter(|d| !d.as_os_str().is_empty()) {
            add(dir, "<config_dir>");
            if let Ok(absolute) = std::path::absolute(dir) {
                add(&absolute, "<config_dir>");
            }
        }
        if let Some(dir) =
            std::env::var_os(crate::config::CREDENTIALS_DIRECTORY).filter(|d| !d.is_empty())
        {
            add(Path::new(&dir), "<credentials>");
        }
        redactions.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
        Self {
            token: config.http.token.clone(),
            allowed_hosts: config.http.allowed_hosts.clone(),
            redactions,
        }
    }

    /// Whether `host` (as a `Host` header or URI authority carries it) is allowed.
    fn host_allowed(&self, host: &str) -> bool {
        let name = host_without_port(host).to_ascii_lowercase();
        self.allowed_hosts
            .iter()
            .any(|allowed| allowed == "*" || *allowed == name)
    }

    /// `text` with every configured path prefix replaced.
    fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (path, label) in &self.redactions {
            if text.contains(path.as_str()) {
                text = text.replace(path.as_str(), label);
            }
        }
        text
    }
}

/// `router` behind the access checks of `access`.
pub fn guard(router: Router, access: Access) -> Router {
    router.layer(from_fn_with_state(Arc::new(access), check))
}

async fn check(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    let host = request
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| {
            request
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
        });
    match host {
        None => {
            return (StatusCode::BAD_REQUEST, "missing Host header\n").into_response();
        }
        Some(host) if !access.host_allowed(&host) => {
            tracing::debug!(host = %host.chars().take(100).collect::<String>(), "status API request for a host not in [http] allowed_hosts");
            return (
                StatusCode::MISDIRECTED_REQUEST,
                "this host name is not in the agent's [http] allowed_hosts\n",
            )
                .into_response();
        }
        Some(_) => {}
    }
    if let Some(token) = &access.token
        && !OPEN_PATHS.contains(&request.uri().path())
        && !authorized(request.headers(), token)
    {
        return (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"proxops\", Basic realm=\"proxops\""),
            )],
            "a token is required: Authorization: Bearer <the token in [http] token_file>\n",
        )
            .into_response();
    }
    let response = next.run(request).await;
    if access.redactions.is_empty() {
        return response;
    }
    let (parts, body) = response.into_parts();
    match to_bytes(body, MAX_REDACTED_BYTES).await {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let redacted = access.redact(&text);
            let mut response = Response::from_parts(parts, Body::from(redacted));
            response.headers_mut().remove(header::CONTENT_LENGTH);
            response
        }
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "answer too large\n").into_response(),
    }
}

/// Whether the request carries the token, as a bearer token or as a Basic password.
fn authorized(headers: &HeaderMap, token: &SecretString) -> bool {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return false;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let Some((scheme, credentials)) = value.trim().split_once(' ') else {
        return false;
    };
    let credentials = credentials.trim();
    let presented = if scheme.eq_ignore_ascii_case("bearer") {
        credentials.as_bytes().to_vec()
    } else if scheme.eq_ignore_ascii_case("basic") {
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(credentials) else {
            return false;
        };
        match decoded.iter().position(|&b| b == b':') {
            Some(colon) => decoded[colon + 1..].to_vec(),
            None => return false,
        }
    } else {
        return false;
    };
    same_secret(&presented, token.expose_secret().as_bytes())
}

/// Equality of two secrets in time independent of where they differ: the SHA-256 digests
/// are compared byte by byte without an early exit.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |diff, (x, y)| diff | (x ^ y))
        == 0
}

/// `example.org:9494` → `example.org`, `[::1]:9494` → `[::1]`, `10.0.0.1` → `10.0.0.1`.
fn host_without_port(host: &str) -> &str {
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    host.split_once(':').map_or(host, |(name, _)| name)
}

#[cfg(test)]
mod tests {
    use axum::routing::get;
    use tower::ServiceExt as _;

    use super::*;

    fn access(token: Option<&str>) -> Access {
        Access {
            token: token.map(|t| SecretString::from(t.to_owned())),
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into()],
            redactions: vec![("/var/lib/proxops".into(), "<state_dir>")],
        }
    }

    fn app(access: Access) -> Router {
        guard(
            Router::new()
                .route("/healthz", get(|| async { "ok" }))
                .route(
                    "/api/v1/status",
                    get(|| async {
                        "opening the git mirror /var/lib/proxops/git: Too many open files"
                    }),
                ),
            access,
        )
    }

    async fn call(app: Router, path: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
        let mut request = Request::get(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = app
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn a_rebinding_host_is_refused_and_the_loopback_names_are_served() {
        let (status, body) = call(
            app(access(None)),
            "/api/v1/status",
            &[("host", "evil.example")],
        )
        .await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST);
        assert!(body.contains("[http] allowed_hosts"), "{body}");
        for host in [
            "localhost:9494",
            "127.0.0.1:9494",
            "[::1]:9494",
            "LOCALHOST",
        ] {
            let (status, _) = call(app(access(None)), "/api/v1/status", &[("host", host)]).await;
            assert_eq!(status, StatusCode::OK, "{host}");
        }
        let (status, _) = call(app(access(None)), "/api/v1/status", &[]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) = call(
            app(access(None)),
            "http://evil.example/api/v1/status",
            &[("host", "localhost")],
        )
        .await;
        assert_eq!(
            status,
            StatusCode::MISDIRECTED_REQUEST,
            "the absolute-form URI's host counts"
        );
    }

    #[tokio::test]
    async fn with_a_token_file_the_api_needs_the_token_and_healthz_does_not() {
        let host = ("host", "127.0.0.1");
        let (status, _) = call(app(access(Some("t0ken"))), "/api/v1/status", &[host]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _) = call(
            app(access(Some("t0ken"))),
            "/api/v1/status",
            &[host, ("authorization", "Bearer wrong")],
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _) = call(
            app(access(Some("t0ken"))),
            "/api/v1/status",
            &[host, ("authorization", "Bearer t0ken")],
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("anyone:t0ken")
        );
        let (status, _) = call(
            app(access(Some("t0ken"))),
            "/api/v1/status",
            &[host, ("authorization", &basic)],
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = call(app(access(Some("t0ken"))), "/healthz", &[host]).await;
        assert_eq!(status, StatusCode::OK);
    }

    #[tokio::test]
    async fn absolute_state_paths_are_cut_out_of_answers() {
        let (status, body) = call(
            app(access(None)),
            "/api/v1/status",
            &[("host", "localhost")],
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body,
            "opening the git mirror <state_dir>/git: Too many open files"
        );
    }

    #[test]
    fn ports_and_brackets_are_taken_off_hosts() {
        assert_eq!(host_without_port("example.org:9494"), "example.org");
        assert_eq!(host_without_port("[fd00::5]:9494"), "[fd00::5]");
        assert_eq!(host_without_port("10.0.0.1"), "10.0.0.1");
        assert_eq!(host_without_port("user@10.0.0.1:1"), "10.0.0.1");
    }
}
