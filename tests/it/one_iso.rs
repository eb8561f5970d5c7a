//! The world of the reliability and security tests (flood, TLS, secrets, hostile input): the
//! simulator accepting a chosen token secret, a file server, a git daemon serving a repository
//! with one ISO, and agents on it with a chosen `[pve]` trust line and webhook secret, run by
//! [`AgentProcess`] (stdout and stderr captured to files so tests can scan them).

use std::path::PathBuf;
use std::time::Duration;

use proxops_pve_sim::{RunningSim, SimConfig};

use crate::git_server::{GitDaemon, TestRepo};
use crate::sim::{artifact, serve_files};
use crate::support::agent::{AgentProcess, AgentToml, Trust};

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
        let files_url = serve_files(&[("a.iso", b"installer bytes".as_slice())]).await;
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
        Setup {
            sim,
            repo,
            dir,
            webhook_secret: webhook_secret.to_owned(),
            commit,
            daemon,
        }
    }

    /// The agent.toml of agent `name` (state in `state-<name>`), trusting PVE by `trust`.
    fn toml(&self, name: &str, trust: &TrustLine) -> AgentToml {
        let toml = AgentToml::new(&self.sim)
            .state_dir(self.state_dir(name))
            .source(&self.daemon.url("origin.git"))
            .webhook_secret(&self.webhook_secret);
        match trust {
            TrustLine::Pin => toml,
            TrustLine::WrongPin => toml.trust(Trust::Fingerprint(["AB"; 32].join(":"))),
            TrustLine::UntrustedCa => {
                let path = self.dir.path().join("other-ca.pem");
                std::fs::write(&path, untrusted_ca()).unwrap();
                toml.trust(Trust::CaFile(path))
            }
            TrustLine::Insecure => toml.trust(Trust::Insecure),
        }
    }

    /// Writes `agent-<name>.toml` (for the CLI); its path.
    pub(crate) fn config(&self, name: &str, trust: &TrustLine) -> PathBuf {
        let path = self.dir.path().join(format!("agent-{name}.toml"));
        self.toml(name, trust).write(&path)
    }

    /// The state directory of agent `name`.
    pub(crate) fn state_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("state-{name}"))
    }

    /// Spawns `proxops agent` on config `name` with `RUST_LOG=<log>`.
    pub(crate) fn spawn(&self, name: &str, trust: &TrustLine, log: &str) -> AgentProcess {
        let path = self.dir.path().join(format!("agent-{name}.toml"));
        AgentProcess::spawn(&self.toml(name, trust), &path, log)
    }
}

/// A freshly made self-signed certificate (PEM) that signed nothing the simulator presents.
fn untrusted_ca() -> String {
    rcgen::generate_simple_self_signed(vec!["pve1".to_owned()])
        .unwrap()
        .cert
        .pem()
}

/// A push to `main` as GitHub sends it (the commit ids in it are never used).
pub(crate) fn push_body() -> &'static str {
    r#"{"ref":"refs/heads/main","after":"0000000000000000000000000000000000000000","commits":[]}"#
}
