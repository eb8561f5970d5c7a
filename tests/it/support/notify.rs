//! What the notification tests talk to: an HTTP server that records every request (standing
//! in for a webhook receiver, ntfy, a Matrix homeserver or Slack, each checked against that
//! service's documented format by the test), a real SMTP server (aiosmtpd from PyPI, with
//! STARTTLS and AUTH) and a JSON Schema validator (python-jsonschema), both from the Python
//! venv `.ci/test` makes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};

/// How long a test waits for a notification.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// One request a [`Receiver`] got.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: serde_json::Value,
    /// The status the receiver answered.
    pub(crate) status: u16,
}

impl Received {
    /// A header's value as text ("" when absent).
    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

#[derive(Default)]
struct Shared {
    requests: Mutex<Vec<Received>>,
    status: AtomicU16,
    location: Mutex<Option<String>>,
}

/// An HTTP server on 127.0.0.1 that records every request and answers with the status set
/// (200 at first) and `{"event_id": "$1"}` (what a Matrix homeserver answers a send).
pub(crate) struct Receiver {
    pub(crate) addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn record(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let status = shared.status.load(Ordering::SeqCst);
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&body).into()));
    shared.requests.lock().unwrap().push(Received {
        method: method.to_string(),
        path: uri.path().to_owned(),
        headers,
        body,
        status,
    });
    let mut response = (
        StatusCode::from_u16(status).unwrap(),
        r#"{"event_id":"$1"}"#.to_owned(),
    )
        .into_response();
    if let Some(location) = shared.location.lock().unwrap().clone() {
        response
            .headers_mut()
            .insert("location", location.parse().unwrap());
    }
    response
}

impl Receiver {
    /// Listens on a free port.
    pub(crate) async fn start() -> Receiver {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    /// Listens on `addr` (a port the test reserved, for a target that was down).
    pub(crate) async fn start_on(addr: SocketAddr) -> Receiver {
        let shared = Arc::new(Shared {
            requests: Mutex::default(),
            status: AtomicU16::new(200),
            location: Mutex::default(),
        });
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().fallback(record).with_state(shared.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver { addr, shared, task }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Answers every later request with `status`.
    pub(crate) fn answer(&self, status: u16) {
        self.shared.status.store(status, Ordering::SeqCst);
    }

    /// Answers every later request with a redirect (`status`) to `location`.
    pub(crate) fn redirect(&self, status: u16, location: &str) {
        *self.shared.location.lock().unwrap() = Some(location.to_owned());
        self.answer(status);
    }

    /// Every request so far.
    pub(crate) fn requests(&self) -> Vec<Received> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// The requests answered 2xx whose `X-ProxOps-Event` is `event`.
    pub(crate) fn delivered(&self, event: &str) -> Vec<Received> {
        self.requests()
            .into_iter()
            .filter(|r| (200..300).contains(&r.status) && r.header("x-proxops-event") == event)
            .collect()
    }

    /// Waits until a request for `event` was delivered; the first such.
    pub(crate) async fn wait_for(&self, event: &str, log: impl Fn() -> String) -> Received {
        self.wait_for_within(event, PATIENCE, log).await
    }

    /// [`Receiver::wait_for`] with a patience of its own.
    pub(crate) async fn wait_for_within(
        &self,
        event: &str,
        patience: Duration,
        log: impl Fn() -> String,
    ) -> Received {
        let deadline = Instant::now() + patience;
        loop {
            if let Some(first) = self.delivered(event).into_iter().next() {
                return first;
            }
            assert!(
                Instant::now() < deadline,
                "no {event} notification reached {}; requests: {:#?}\nagent log:\n{}",
                self.addr,
                self.requests(),
                log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A port nothing listens on (bound, then released): a target that is down.
pub(crate) fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// The Python of the notification venv (`aiosmtpd`, `jsonschema`; tests/notify/
/// requirements.txt), made by `.ci/test`: `$PROXOPS_NOTIFY_PYTHON`, else
/// `$CARGO_TARGET_DIR/notify-venv` or `target/notify-venv`. In CI (`CI` set) or when
/// `PROXOPS_NOTIFY_PYTHON` names an unusable Python, a missing venv fails the test; elsewhere
/// the caller skips with the message returned.
pub(crate) fn notify_python() -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = std::env::var_os("PROXOPS_NOTIFY_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            std::env::var_os("CARGO_TARGET_DIR")
                .map(|d| PathBuf::from(d).join("notify-venv/bin/python")),
        )
        .chain([super::repo_root().join("target/notify-venv/bin/python")])
        .collect();
    let found = candidates.iter().find(|p| {
        std::process::Command::new(p)
            .args(["-c", "import aiosmtpd, jsonschema"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    match found {
        Some(python) => Ok(python.clone()),
        None => {
            let message = format!(
                "no Python with aiosmtpd and jsonschema at {candidates:?}: run .ci/test (it \
                 makes the venv from tests/notify/requirements.txt) or set PROXOPS_NOTIFY_PYTHON"
            );
            // .ci/test sets PROXOPS_NOTIFY_PYTHON after making the venv; CI sets CI.
            assert!(
                std::env::var_os("CI").is_none()
                    && std::env::var_os("PROXOPS_NOTIFY_PYTHON").is_none(),
                "{message}"
            );
            Err(message)
        }
    }
}

/// Validates each of `documents` against the JSON Schema at `schema` (draft 2020-12, formats
/// checked); panics with the validator's words on the first that does not validate.
pub(crate) fn assert_valid(python: &Path, schema: &Path, documents: &[serde_json::Value]) {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("documents.json");
    std::fs::write(&docs, serde_json::to_vec(documents).unwrap()).unwrap();
    let script = r#"
import json, sys
import jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
for i, doc in enumerate(json.load(open(sys.argv[2]))):
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    for e in errors:
        print(f"document {i}: {list(e.path)}: {e.message}")
    if errors:
        sys.exit(1)
"#;
    let out = std::process::Command::new(python)
        .args(["-c", script])
        .arg(schema)
        .arg(&docs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "webhook documents do not validate against {}:\n{}{}",
        schema.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A real SMTP server (aiosmtpd) on 127.0.0.1 that requires STARTTLS with a self-signed
/// certificate for `127.0.0.1`, and AUTH (any user, password `password`) once TLS is up;
/// each message it accepts is written to `dir` as JSON: `tls`, `login`, `mail_from`,
/// `rcpt_tos`, `content`.
pub(crate) struct SmtpServer {
    pub(crate) port: u16,
    /// The certificate (PEM), for `ca_file`.
    pub(crate) cert: PathBuf,
    pub(crate) dir: PathBuf,
    child: std::process::Child,
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const SMTP_SERVER: &str = r#"
import json, os, ssl, sys, time
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

cert, key, out, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(cert, key)

class Handler:
    def __init__(self):
        self.n = 0
    async def handle_DATA(self, server, session, envelope):
        self.n += 1
        login = session.auth_data.login.decode() if isinstance(session.auth_data, LoginPassword) else None
        record = {
            "tls": session.ssl is not None,
            "login": login,
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "content": envelope.content.decode("utf-8", "replace"),
        }
        path = os.path.join(out, f"{self.n}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.rename(path + ".tmp", path)
        return "250 OK"

def authenticator(server, session, envelope, mechanism, auth_data):
    ok = isinstance(auth_data, LoginPassword) and auth_data.password == b"password"
    return AuthResult(success=ok, handled=False, auth_data=auth_data)

controller = Controller(
    Handler(), hostname="127.0.0.1", port=port,
    tls_context=context, require_starttls=True,
    authenticator=authenticator, auth_required=True, auth_require_tls=True,
)
controller.start()
print(controller.port, flush=True)
while True:
    time.sleep(3600)
"#;

impl SmtpServer {
    /// Starts it with a fresh certificate; returns once it listens.
    pub(crate) fn start(python: &Path, dir: &Path) -> SmtpServer {
        use std::io::BufRead;
        let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        let cert = dir.join("smtp-cert.pem");
        let key = dir.join("smtp-key.pem");
        std::fs::write(&cert, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
        let out = dir.join("mail");
        std::fs::create_dir_all(&out).unwrap();
        let mut child = std::process::Command::new(python)
            .args(["-c", SMTP_SERVER])
            .arg(&cert)
            .arg(&key)
            .arg(&out)
            .arg(free_port().port().to_string())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("aiosmtpd did not print its port: {line:?}"));
        SmtpServer {
            port,
            cert,
            dir: out,
            child,
        }
    }

    /// The messages received so far, in order.
    pub(crate) fn messages(&self) -> Vec<serde_json::Value> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        files
            .iter()
            .map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap())
            .collect()
    }
}
