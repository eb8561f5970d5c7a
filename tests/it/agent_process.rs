//! A running `proxops agent` for the reliability and security tests (flood, TLS, secrets): the
//! simulator with a chosen token secret, a file server, a git daemon serving a repository with
//! one ISO, an agent.toml with a chosen `[pve]` trust line, and the child process with its
//! stdout and stderr captured to files so tests can scan them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{KeyInit, Mac};
use proxops_pve_sim::{RunningSim, SimConfig};

use crate::git_server::{GitDaemon, TestRepo};
use crate::sim::artifact;

/// The simulator, a repository served over `git://` and a temp dir for configs and state.
pub(crate) struct Setup {
    pub(crate) sim: RunningSim,
    pub(crate) repo: TestRepo,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) webhook_secret: String,
    pub(crate) commit: String,
    daemon: GitDaemon,
}

/// How the agent is told to trust PVE's certificate (one `[pve]` line, or none).
pub(crate) enum TrustLine {
    /// The simulator's own fingerprint.
    Pin,
    /// A fingerprint that is not the simulator's.
    WrongPin,
    /// A CA file that did not sign the simulator's certificate.
    UntrustedCa,
    /// `insecure = true`.
    Insecure,
}

impl Setup {
    /// Starts everything; the repository holds one ISO served by a local file server.
    pub(crate) async fn start(token_secret: &str, webhook_secret: &str) -> Setup {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = SimConfig {
            task_duration: Duration::from_millis(20),
            // The agent's token must be the one the simulator accepts: before a failed
            // `/cluster/resources` failed the pass, a 401 on every request passed as no-change.
            token_secret: token_secret.to_owned(),
            ..SimConfig::default()
        };
        let sim = proxops_pve_sim::start(config, listener).await.unwrap();
        let files_url = serve_file("a.iso", b"installer bytes").await;
        let repo = TestRepo::new();
        let manifest = artifact(
            "ISO",
            "a",
            &["pve1"],
            "a.iso",
            &format!("{files_url}/a.iso"),
            None,
        );
        let commit = repo.commit_files(&[("iso/a.yaml", &manifest)], "one ISO");
        let daemon = repo.serve();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), format!("{token_secret}\n")).unwrap();
        std::fs::write(dir.path().join("hook-secret"), webhook_secret).unwrap();
        Setup {
            sim,
            repo,
            dir,
            webhook_secret: webhook_secret.to_owned(),
            commit,
            daemon,
        }
    }

    /// Writes `agent-<name>.toml` (state in `state-<name>`) listening on a free port.
    pub(crate) fn config(&self, name: &str, trust: &TrustLine) -> (PathBuf, String) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let trust = match trust {
            TrustLine::Pin => format!("fingerprint = \"{}\"", self.sim.fingerprint().unwrap()),
            TrustLine::WrongPin => format!("fingerprint = \"{}\"", ["AB"; 32].join(":")),
            TrustLine::UntrustedCa => {
                let other = untrusted_ca();
                let path = self.dir.path().join("other-ca.pem");
                std::fs::write(&path, other).unwrap();
                format!("ca_file = \"{}\"", path.display())
            }
            TrustLine::Insecure => "insecure = true".to_owned(),
        };
        let config = format!(
            "node = \"pve1\"\nstate_dir = \"{state}\"\n\
             [source]\nurl = \"{url}\"\nbranch = \"main\"\npoll = \"1h\"\n\
             [webhook]\nsecret_file = \"hook-secret\"\n\
             [http]\nlisten = \"{listen}\"\n\
             [pve]\nurl = \"{pve}\"\ntoken_id = \"root@pam!proxops\"\n\
             token_secret_file = \"token\"\n{trust}\n\
             [policy]\ntask_timeout = \"30s\"\n",
            state = self.state_dir(name).display(),
            url = self.daemon.url("origin.git"),
            pve = self.sim.base_url().trim_end_matches("/api2/json"),
        );
        let path = self.dir.path().join(format!("agent-{name}.toml"));
        std::fs::write(&path, config).unwrap();
        (path, listen)
    }

    /// The state directory of agent `name`.
    pub(crate) fn state_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("state-{name}"))
    }

    /// Spawns `proxops agent` on config `name` with `RUST_LOG=<log>`.
    pub(crate) fn spawn(&self, name: &str, trust: &TrustLine, log: &str) -> RunningAgent {
        let (config, listen) = self.config(name, trust);
        let stdout = self.dir.path().join(format!("agent-{name}.stdout"));
        let stderr = self.dir.path().join(format!("agent-{name}.stderr"));
        let child = Command::new(env!("CARGO_BIN_EXE_proxops"))
            .args(["agent", "--config"])
            .arg(&config)
            .env("RUST_LOG", log)
            .env_remove("PROXOPS_CONFIG")
            .stdout(append(&stdout))
            .stderr(append(&stderr))
            .spawn()
            .unwrap();
        RunningAgent {
            child,
            listen,
            http: reqwest::Client::new(),
            stdout,
            stderr,
            state_dir: self.state_dir(name),
            webhook_secret: self.webhook_secret.clone(),
        }
    }
}

fn append(path: &Path) -> Stdio {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
        .into()
}

/// A freshly made self-signed certificate (PEM) that signed nothing the simulator presents.
fn untrusted_ca() -> String {
    rcgen::generate_simple_self_signed(vec!["pve1".to_owned()])
        .unwrap()
        .cert
        .pem()
}

/// The `proxops agent` child; killed on drop.
pub(crate) struct RunningAgent {
    pub(crate) child: Child,
    pub(crate) listen: String,
    pub(crate) http: reqwest::Client,
    pub(crate) stdout: PathBuf,
    pub(crate) stderr: PathBuf,
    pub(crate) state_dir: PathBuf,
    webhook_secret: String,
}

impl RunningAgent {
    /// `http://<listen><path>`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    /// GET `path` as text (status, body).
    pub(crate) async fn get_text(&self, path: &str) -> (u16, String) {
        let response = self.http.get(self.url(path)).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// Polls /api/v1/status until `done` holds (at most 30 s).
    pub(crate) async fn wait_for(
        &self,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(response) = self.http.get(self.url("/api/v1/status")).send().await
                && let Ok(status) = response.json::<serde_json::Value>().await
                && done(&status)
            {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "agent did not reach the expected status in time; its stderr:\n{}",
                self.stderr_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The recorded passes, newest first.
    pub(crate) async fn passes(&self) -> Vec<serde_json::Value> {
        let (_, body) = self.get_text("/api/v1/revisions?limit=1000").await;
        serde_json::from_str::<Vec<serde_json::Value>>(&body).unwrap()
    }

    /// What the agent wrote to stderr so far.
    pub(crate) fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// What the agent wrote to stdout so far.
    pub(crate) fn stdout_text(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// The process's peak resident set size so far (`VmHWM`), in KiB.
    pub(crate) fn peak_rss_kib(&self) -> u64 {
        crate::support::peak_rss_kib(self.child.id())
    }

    /// The HMAC-SHA256 of `body` with the webhook secret, in GitHub's header format.
    pub(crate) fn github_signature(&self, body: &[u8]) -> String {
        let mut mac =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(self.webhook_secret.as_bytes()).unwrap();
        mac.update(body);
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    }

    /// SIGTERM, then waits for the exit (at most 20 s).
    pub(crate) fn terminate(&mut self) -> std::process::ExitStatus {
        crate::support::terminate(&mut self.child, Duration::from_secs(20))
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A push to `main` as GitHub sends it (the commit ids in it are never used).
pub(crate) fn push_body() -> &'static str {
    r#"{"ref":"refs/heads/main","after":"0000000000000000000000000000000000000000","commits":[]}"#
}

/// Serves one file over plain HTTP on 127.0.0.1, as the mirror PVE downloads from.
async fn serve_file(name: &str, bytes: &[u8]) -> String {
    let files: Arc<BTreeMap<String, Vec<u8>>> =
        Arc::new(BTreeMap::from([(name.to_owned(), bytes.to_vec())]));
    let app = axum::Router::new().route(
        "/{name}",
        axum::routing::get(
            move |axum::extract::Path(name): axum::extract::Path<String>| {
                let files = files.clone();
                async move {
                    files
                        .get(&name)
                        .cloned()
                        .ok_or(axum::http::StatusCode::NOT_FOUND)
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}
