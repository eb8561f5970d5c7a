//! The built `proxops agent` as a child process for the reliability suites: whole-cluster
//! scope (`node = "*"`), pruning on, polling every second, the write breaker's cool-down cut to
//! 3 s (a fault storm may open it; it must close again once PVE recovers), its state database
//! and log in the world's temp dir. It can be killed with SIGKILL, stopped with SIGTERM, nudged with SIGHUP
//! (a reload runs a pass at once, also during a backoff), and its peak RSS read first.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::sim::World;
use crate::support::{signal, terminate};

pub(crate) struct AgentProcess {
    child: Option<Child>,
    pub(crate) config: PathBuf,
    pub(crate) database: PathBuf,
    pub(crate) log: PathBuf,
    listen: String,
    http: reqwest::Client,
}

impl AgentProcess {
    /// Writes the agent's config for `git_url` (not started yet).
    pub(crate) fn configure(world: &World, git_url: &str) -> AgentProcess {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let dir = world.dir.path();
        let state = dir.join("state-reliability");
        let config = format!(
            "node = \"*\"\nstate_dir = \"{state}\"\n\
             [source]\nurl = \"{git_url}\"\nbranch = \"main\"\npoll = \"1s\"\n\
             [http]\nlisten = \"{listen}\"\n\
             [pve]\nurl = \"{pve}\"\ntoken_id = \"root@pam!proxops\"\ntoken_secret_file = \"token\"\nfingerprint = \"{fp}\"\n\
             [policy]\nprune = true\nmax_prune = 50\nconcurrency_per_node = 4\ntask_timeout = \"60s\"\n\
             write_breaker_cool_down = \"3s\"\n",
            state = state.display(),
            pve = world.sim.base_url().trim_end_matches("/api2/json"),
            fp = world.sim.fingerprint().unwrap(),
        );
        let config_path = dir.join("agent-reliability.toml");
        std::fs::write(&config_path, config).unwrap();
        AgentProcess {
            child: None,
            config: config_path,
            database: state.join("state.db"),
            log: dir.join("agent-reliability.log"),
            listen,
            http: reqwest::Client::new(),
        }
    }

    /// Starts the agent (its first pass begins at once).
    pub(crate) fn spawn(&mut self) {
        assert!(self.child.is_none(), "the agent is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_proxops"))
            .args(["agent", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("the agent runs").id()
    }

    /// Peak resident set (VmHWM) of the running agent, in KiB.
    pub(crate) fn peak_rss_kib(&self) -> u64 {
        crate::support::peak_rss_kib(self.pid())
    }

    /// kill -9 (no chance to record anything); returns the peak RSS read just before.
    pub(crate) fn kill9(&mut self) -> u64 {
        let peak = self.peak_rss_kib();
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        peak
    }

    /// SIGTERM and wait for a clean exit; returns the peak RSS read just before.
    pub(crate) fn terminate(&mut self) -> u64 {
        let peak = self.peak_rss_kib();
        let mut child = self.child.take().unwrap();
        let status = terminate(&mut child, Duration::from_secs(60));
        assert!(status.success(), "SIGTERM is a clean exit: {status:?}");
        peak
    }

    /// SIGHUP: the agent reloads its config and runs a pass now.
    pub(crate) fn nudge(&self) {
        signal(self.pid(), "-HUP");
    }

    /// `/api/v1/status`, when the agent answers.
    pub(crate) async fn status(&self) -> Option<serde_json::Value> {
        let url = format!("http://{}/api/v1/status", self.listen);
        let response = self.http.get(url).send().await.ok()?;
        response.json().await.ok()
    }

    /// The agent's log so far (for failure messages).
    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `proxops plan <checkout> --json`-free check with this agent's config: exit code 0
    /// means no changes.
    pub(crate) fn plan(&self, checkout: &Path) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_proxops"))
            .arg("plan")
            .arg(checkout)
            .arg("--config")
            .arg(&self.config)
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
