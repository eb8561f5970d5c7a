//! The agent as the end-to-end tests run it, in two parts that every suite shares:
//!
//! - [`AgentToml`] writes an agent.toml (for `proxops agent` and for the CLI alike): the
//!   simulator's URL and certificate pin, `node`, `cluster`, `state_dir`, `[source]`,
//!   `[webhook]`, `[http] listen`, `[policy]` and `[secrets]`, with raw TOML for anything else.
//! - [`AgentProcess`] runs the built `proxops agent` on one as a child process: spawn, SIGKILL,
//!   SIGTERM, SIGHUP, respawn; its status API over HTTP (`wait_for` a status predicate), its
//!   log, and its peak RSS.
//!
//! The agent listens on `127.0.0.1:0` and writes the address it bound to
//! `<state_dir>/http.addr`; [`AgentProcess`] reads it there. No test picks a port in advance,
//! so none can be taken by another process between the pick and the bind.
//!
//! ```ignore
//! let toml = world.agent_toml().state_dir(dir.join("state")).source(&daemon.url("origin.git"));
//! let agent = AgentProcess::spawn(&toml, &dir.join("agent.toml"), "info");
//! let status = agent.wait_for(|s| s["last_applied"].is_object()).await;
//! ```

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hmac::{KeyInit, Mac};
use proxops_pve_sim::RunningSim;

/// How long a status, the listener or a stop is waited for before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);
/// How long SIGTERM may take: a pass in flight finishes its current step first.
const STOP_PATIENCE: Duration = Duration::from_secs(60);

/// How the agent trusts PVE's certificate: the trust line of `[pve]`.
#[derive(Debug, Clone)]
pub(crate) enum Trust {
    /// `fingerprint = "..."`.
    Fingerprint(String),
    /// `ca_file = "..."`.
    CaFile(PathBuf),
    /// `insecure = true`.
    Insecure,
    /// No trust line (a plain-http URL takes none).
    None,
}

/// `[source]`.
#[derive(Debug, Clone)]
struct Source {
    url: String,
    branch: String,
    poll: String,
}

/// An agent.toml for the simulator, built by options; [`AgentToml::write`] writes it.
///
/// Defaults: `node = "pve1"`, `listen = "127.0.0.1:0"`, token `root@pam!proxops` read from
/// `token` next to the file, the simulator's fingerprint pinned, `task_timeout = "30s"`,
/// `[scope]` [`SIM_SCOPE`]; no `cluster`, `state_dir`, `[source]`, `[webhook]` or `[secrets]`.
#[derive(Debug, Clone)]
pub(crate) struct AgentToml {
    node: String,
    cluster: Option<String>,
    state_dir: Option<PathBuf>,
    source: Option<Source>,
    webhook_secret: Option<String>,
    listen: String,
    pve_url: String,
    token_id: String,
    token_secret_file: String,
    trust: Trust,
    task_timeout: String,
    policy: Vec<String>,
    age_key_file: Option<PathBuf>,
    raw: Vec<String>,
    http: Vec<String>,
    webhook: Vec<String>,
    pve: Vec<String>,
    scope: Option<Vec<String>>,
}

/// The `[scope]` lines every simulator agent.toml has unless [`AgentToml::scope`] replaces
/// them: the file server on 127.0.0.1 (a loopback host, refused by default) serves over
/// plain http without checksums.
pub(crate) const SIM_SCOPE: &str =
    "artifact_hosts = [\"127.0.0.1\"]\nallow_http_without_checksum = true\n";

impl AgentToml {
    /// The defaults above, for `sim`.
    pub(crate) fn new(sim: &RunningSim) -> AgentToml {
        AgentToml {
            node: "pve1".to_owned(),
            cluster: None,
            state_dir: None,
            source: None,
            webhook_secret: None,
            listen: "127.0.0.1:0".to_owned(),
            pve_url: sim.base_url().trim_end_matches("/api2/json").to_owned(),
            token_id: "root@pam!proxops".to_owned(),
            token_secret_file: "token".to_owned(),
            trust: Trust::Fingerprint(
                sim.fingerprint()
                    .expect("the simulator serves HTTPS")
                    .to_owned(),
            ),
            task_timeout: "30s".to_owned(),
            policy: Vec::new(),
            age_key_file: None,
            raw: Vec::new(),
            http: Vec::new(),
            webhook: Vec::new(),
            pve: Vec::new(),
            scope: None,
        }
    }

    /// The `[scope]` table's lines, as TOML (`vmids = "100-199"`, `adopt = "140"`, ...),
    /// instead of the simulator's defaults ([`SIM_SCOPE`]: pass it too to keep them); call
    /// it again to add lines.
    pub(crate) fn scope(mut self, lines: &str) -> AgentToml {
        self.scope
            .get_or_insert_with(Vec::new)
            .push(lines.to_owned());
        self
    }

    /// More `[http]` lines, as TOML (`token_file = "..."`, `allowed_hosts = [...]`).
    pub(crate) fn http(mut self, lines: &str) -> AgentToml {
        self.http.push(lines.to_owned());
        self
    }

    /// More `[webhook]` lines, as TOML (`listen = "127.0.0.1:0"`); needs
    /// [`AgentToml::webhook_secret`].
    pub(crate) fn webhook(mut self, lines: &str) -> AgentToml {
        self.webhook.push(lines.to_owned());
        self
    }

    /// `[pve] url` (default: the simulator's).
    pub(crate) fn pve_url(mut self, url: &str) -> AgentToml {
        url.clone_into(&mut self.pve_url);
        self
    }

    /// More `[pve]` lines, as TOML (`allow_plain_http = true`).
    pub(crate) fn pve(mut self, lines: &str) -> AgentToml {
        self.pve.push(lines.to_owned());
        self
    }

    /// `node` (a node name, or `*` for the whole cluster).
    pub(crate) fn node(mut self, node: &str) -> AgentToml {
        node.clone_into(&mut self.node);
        self
    }

    /// `cluster` (composition mode: follow `clusters/<cluster>/resources.yaml`).
    pub(crate) fn cluster(mut self, cluster: &str) -> AgentToml {
        self.cluster = Some(cluster.to_owned());
        self
    }

    /// `state_dir` (the agent's database, git mirror and `http.addr`).
    pub(crate) fn state_dir(mut self, dir: impl Into<PathBuf>) -> AgentToml {
        self.state_dir = Some(dir.into());
        self
    }

    /// `[source] url`, branch `main`, polled every hour unless [`AgentToml::poll`] says else.
    pub(crate) fn source(mut self, url: &str) -> AgentToml {
        self.source = Some(Source {
            url: url.to_owned(),
            branch: "main".to_owned(),
            poll: "1h".to_owned(),
        });
        self
    }

    /// `[source] poll` (needs [`AgentToml::source`] first).
    pub(crate) fn poll(mut self, poll: &str) -> AgentToml {
        let source = self.source.as_mut().expect("poll() after source()");
        poll.clone_into(&mut source.poll);
        self
    }

    /// `[source] branch` (needs [`AgentToml::source`] first).
    #[allow(
        dead_code,
        reason = "every suite follows main today; the option is the builder's"
    )]
    pub(crate) fn branch(mut self, branch: &str) -> AgentToml {
        let source = self.source.as_mut().expect("branch() after source()");
        branch.clone_into(&mut source.branch);
        self
    }

    /// `[webhook]` with `secret`: [`AgentToml::write`] puts it in `<config>.hook-secret`.
    pub(crate) fn webhook_secret(mut self, secret: &str) -> AgentToml {
        self.webhook_secret = Some(secret.to_owned());
        self
    }

    /// `[http] listen` (default `127.0.0.1:0`, any free port).
    #[allow(
        dead_code,
        reason = "every suite listens on port 0 today; the option is the builder's"
    )]
    pub(crate) fn listen(mut self, listen: &str) -> AgentToml {
        listen.clone_into(&mut self.listen);
        self
    }

    /// `[pve] token_id`.
    pub(crate) fn token_id(mut self, token_id: &str) -> AgentToml {
        token_id.clone_into(&mut self.token_id);
        self
    }

    /// `[pve] token_secret_file` (default `token`, relative to the config file).
    #[allow(
        dead_code,
        reason = "every suite uses `token` today; the option is the builder's"
    )]
    pub(crate) fn token_secret_file(mut self, file: &str) -> AgentToml {
        file.clone_into(&mut self.token_secret_file);
        self
    }

    /// How `[pve]` trusts the certificate (default: the simulator's fingerprint).
    pub(crate) fn trust(mut self, trust: Trust) -> AgentToml {
        self.trust = trust;
        self
    }

    /// `[policy] task_timeout` (default `30s`).
    pub(crate) fn task_timeout(mut self, timeout: &str) -> AgentToml {
        timeout.clone_into(&mut self.task_timeout);
        self
    }

    /// More `[policy]` lines, as TOML (`mode = "report"`, `prune = true`, ...).
    pub(crate) fn policy(mut self, lines: &str) -> AgentToml {
        self.policy.push(lines.to_owned());
        self
    }

    /// `[secrets] age_key_file`.
    pub(crate) fn age_key_file(mut self, path: &Path) -> AgentToml {
        self.age_key_file = Some(path.to_owned());
        self
    }

    /// Raw TOML appended at the end (after a table header of its own), for keys without an
    /// option here.
    #[allow(dead_code, reason = "the escape hatch; no suite needs it today")]
    pub(crate) fn raw(mut self, toml: &str) -> AgentToml {
        self.raw.push(toml.to_owned());
        self
    }

    /// The `state_dir`, when set.
    pub(crate) fn state_dir_path(&self) -> Option<&Path> {
        self.state_dir.as_deref()
    }

    /// The node (`*` for the whole cluster).
    pub(crate) fn node_name(&self) -> &str {
        &self.node
    }

    /// The file's text; `hook_secret_file` is what `[webhook] secret_file` names.
    fn to_toml(&self, hook_secret_file: &str) -> String {
        let mut text = String::new();
        let t = &mut text;
        entry(t, "node", &self.node);
        if let Some(cluster) = &self.cluster {
            entry(t, "cluster", cluster);
        }
        if let Some(dir) = &self.state_dir {
            entry(t, "state_dir", &dir.display().to_string());
        }
        if let Some(source) = &self.source {
            t.push_str("[source]\n");
            entry(t, "url", &source.url);
            entry(t, "branch", &source.branch);
            entry(t, "poll", &source.poll);
        }
        if self.webhook_secret.is_some() {
            t.push_str("[webhook]\n");
            entry(t, "secret_file", hook_secret_file);
            for lines in &self.webhook {
                t.push_str(lines.trim_end());
                t.push('\n');
            }
        }
        t.push_str("[http]\n");
        entry(t, "listen", &self.listen);
        for lines in &self.http {
            t.push_str(lines.trim_end());
            t.push('\n');
        }
        t.push_str("[pve]\n");
        entry(t, "url", &self.pve_url);
        entry(t, "token_id", &self.token_id);
        entry(t, "token_secret_file", &self.token_secret_file);
        match &self.trust {
            Trust::Fingerprint(fingerprint) => entry(t, "fingerprint", fingerprint),
            Trust::CaFile(path) => entry(t, "ca_file", &path.display().to_string()),
            Trust::Insecure => t.push_str("insecure = true\n"),
            Trust::None => {}
        }
        for lines in &self.pve {
            t.push_str(lines.trim_end());
            t.push('\n');
        }
        // Before `[policy]`: suites append `[policy]` keys at the end of the file.
        let sim_scope = [SIM_SCOPE.to_owned()];
        let scope = self.scope.as_deref().unwrap_or(&sim_scope);
        if !scope.is_empty() {
            t.push_str("[scope]\n");
            for lines in scope {
                t.push_str(lines.trim_end());
                t.push('\n');
            }
        }
        t.push_str("[policy]\n");
        entry(t, "task_timeout", &self.task_timeout);
        for lines in &self.policy {
            t.push_str(lines.trim_end());
            t.push('\n');
        }
        if let Some(path) = &self.age_key_file {
            t.push_str("[secrets]\n");
            entry(t, "age_key_file", &path.display().to_string());
        }
        for raw in &self.raw {
            t.push_str(raw.trim_end());
            t.push('\n');
        }
        text
    }

    /// Writes the file at `path` (and the webhook secret next to it); returns `path`.
    pub(crate) fn write(&self, path: &Path) -> PathBuf {
        let hook_secret = path.with_extension("hook-secret");
        if let Some(secret) = &self.webhook_secret {
            std::fs::write(&hook_secret, secret).unwrap();
        }
        let name = hook_secret.file_name().unwrap().to_str().unwrap();
        std::fs::write(path, self.to_toml(name)).unwrap();
        path.to_owned()
    }
}

/// `key = "value"` and a newline, the value quoted as a TOML string.
fn entry(text: &mut String, key: &str, value: &str) {
    let value = toml::Value::String(value.to_owned());
    writeln!(text, "{key} = {value}").unwrap();
}

/// The HMAC-SHA256 of `body` under `secret`, in hex: what forges put in their signature header
/// (GitHub prefixes `sha256=`).
pub(crate) fn webhook_signature(secret: &str, body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// The built `proxops agent` as a child process on one agent.toml, killed on drop. Its stderr
/// (the log) goes to `<config>.log`, its stdout to `<config>.stdout`, both appended to across
/// restarts.
pub(crate) struct AgentProcess {
    child: Option<Child>,
    /// The agent.toml.
    pub(crate) config: PathBuf,
    /// Its `state_dir`.
    pub(crate) state_dir: PathBuf,
    /// The state database in it.
    pub(crate) database: PathBuf,
    /// A client for the status API and webhooks.
    pub(crate) http: reqwest::Client,
    log: PathBuf,
    stdout: PathBuf,
    log_level: String,
    webhook_secret: Option<String>,
    /// The address this run bound, once read from `http.addr`.
    addr: OnceLock<SocketAddr>,
}

impl AgentProcess {
    /// Writes `toml` to `config`, for an agent logging at `log_level` (`RUST_LOG`); not
    /// started yet ([`AgentProcess::respawn`] starts it).
    pub(crate) fn configure(toml: &AgentToml, config: &Path, log_level: &str) -> AgentProcess {
        let state_dir = toml
            .state_dir_path()
            .expect("an agent needs a state_dir of its own")
            .to_owned();
        toml.write(config);
        AgentProcess {
            child: None,
            config: config.to_owned(),
            database: state_dir.join("state.db"),
            state_dir,
            http: reqwest::Client::new(),
            log: config.with_extension("log"),
            stdout: config.with_extension("stdout"),
            log_level: log_level.to_owned(),
            webhook_secret: toml.webhook_secret.clone(),
            addr: OnceLock::new(),
        }
    }

    /// As [`AgentProcess::configure`], and started.
    pub(crate) fn spawn(toml: &AgentToml, config: &Path, log_level: &str) -> AgentProcess {
        let mut agent = AgentProcess::configure(toml, config, log_level);
        agent.respawn();
        agent
    }

    /// Starts the agent (again, after a stop) on the same config and state directory. The
    /// last run's `http.addr` is removed first, so the address read later is this run's.
    pub(crate) fn respawn(&mut self) {
        assert!(self.child.is_none(), "the agent is already running");
        match std::fs::remove_file(proxops::agent::http_addr_path(&self.state_dir)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => panic!("{error}"),
            _ => {}
        }
        self.addr = OnceLock::new();
        let child = Command::new(env!("CARGO_BIN_EXE_proxops"))
            .args(["agent", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", &self.log_level)
            .env_remove("PROXOPS_CONFIG")
            .env_remove("SOPS_AGE_KEY_FILE")
            .stdout(append(&self.stdout))
            .stderr(append(&self.log))
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().expect("the agent runs").id()
    }

    /// kill -9: no chance to record anything.
    pub(crate) fn kill9(&mut self) {
        let mut child = self.child.take().expect("the agent runs");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGTERM, then waits for the exit (a graceful stop finishes the current step first).
    pub(crate) fn terminate(&mut self) -> ExitStatus {
        signal(self.pid(), "-TERM");
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + STOP_PATIENCE;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not stop on SIGTERM; its log:\n{}",
                self.log_text()
            );
            #[allow(
                clippy::disallowed_methods,
                reason = "callers are synchronous; a 50 ms nap of one test thread is harmless"
            )]
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGHUP: the agent reloads its config and runs a pass at once.
    pub(crate) fn hup(&self) {
        signal(self.pid(), "-HUP");
    }

    /// Peak resident set size so far (`VmHWM` of `/proc/<pid>/status`), in KiB.
    pub(crate) fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/<pid>/status")
    }

    /// The address this run listens on, once it has written `http.addr`.
    pub(crate) fn addr(&self) -> Option<SocketAddr> {
        if let Some(addr) = self.addr.get() {
            return Some(*addr);
        }
        let text = std::fs::read_to_string(proxops::agent::http_addr_path(&self.state_dir)).ok()?;
        let addr = text.trim().parse().ok()?;
        Some(*self.addr.get_or_init(|| addr))
    }

    /// The address this run's webhook listener (`[webhook] listen`) is bound to, once it has
    /// written `webhook.addr`.
    pub(crate) fn webhook_addr(&self) -> Option<SocketAddr> {
        let text =
            std::fs::read_to_string(proxops::agent::webhook_addr_path(&self.state_dir)).ok()?;
        text.trim().parse().ok()
    }

    /// Waits until the agent listens; its address.
    pub(crate) async fn listening(&self) -> SocketAddr {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(addr) = self.addr() {
                return addr;
            }
            assert!(
                Instant::now() < deadline,
                "the agent wrote no http.addr; its log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `http://<bound address><path>` (the agent must have started listening: see
    /// [`AgentProcess::listening`] and [`AgentProcess::wait_for`]).
    pub(crate) fn url(&self, path: &str) -> String {
        let addr = self.addr().expect("the agent listens (wait_for it first)");
        format!("http://{addr}{path}")
    }

    /// GET `path` as JSON, or `None` while the agent does not listen or answer.
    pub(crate) async fn try_get(&self, path: &str) -> Option<serde_json::Value> {
        let url = format!("http://{}{path}", self.addr()?);
        self.http.get(url).send().await.ok()?.json().await.ok()
    }

    /// `/api/v1/status`, when the agent answers.
    pub(crate) async fn status(&self) -> Option<serde_json::Value> {
        self.try_get("/api/v1/status").await
    }

    /// GET `path` as JSON.
    pub(crate) async fn get(&self, path: &str) -> serde_json::Value {
        let response = self.http.get(self.url(path)).send().await.unwrap();
        response.json().await.unwrap()
    }

    /// GET `path` as text: (status code, body).
    pub(crate) async fn get_text(&self, path: &str) -> (u16, String) {
        let response = self.http.get(self.url(path)).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// Polls `/api/v1/status` until `done` holds; that status.
    pub(crate) async fn wait_for(
        &self,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + PATIENCE;
        let mut last = None;
        loop {
            if let Some(status) = self.status().await {
                if done(&status) {
                    return status;
                }
                last = Some(status);
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not reach the expected status in time; the last one: {last:?}\n\
                 its log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What the agent logged (stderr) so far, all runs.
    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What the agent wrote to stdout so far, all runs.
    pub(crate) fn stdout_text(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// `sha256=<hex>`: `body` signed with the agent's webhook secret as GitHub signs it.
    pub(crate) fn github_signature(&self, body: &[u8]) -> String {
        let secret = self.webhook_secret.as_deref().expect("a [webhook] secret");
        format!("sha256={}", webhook_signature(secret, body))
    }

    /// `proxops <args> --config <this agent's config>`, with no `RUST_LOG` or
    /// `PROXOPS_CONFIG` from the environment (callers add to it).
    pub(crate) fn cli<S: AsRef<OsStr>>(&self, args: &[S]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_proxops"));
        command
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env_remove("RUST_LOG")
            .env_remove("PROXOPS_CONFIG");
        command
    }

    /// `proxops <command> --json --config <config>`, asserted to succeed, as JSON (`status`
    /// and `drift` ask this agent, or read its database when it does not run).
    pub(crate) fn cli_json(&self, command: &str) -> serde_json::Value {
        let out = self.cli(&[command, "--json"]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
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

/// The located diagnostics the agent whose state is in `state_dir` recorded for `commit`'s
/// pass (the API shows only the outcome).
pub(crate) fn recorded_diagnostics(state_dir: &Path, commit: &str) -> String {
    let db = rusqlite::Connection::open_with_flags(
        state_dir.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    db.query_row(
        "SELECT diagnostics FROM passes WHERE revision = ?1",
        [commit],
        |row| row.get(0),
    )
    .unwrap()
}

/// Every text or blob value of every table of the SQLite database at `path` (an agent's state
/// database), as (column, text) by table; tables without such values are listed empty. For
/// the scans that show a secret is stored nowhere.
pub(crate) fn database_values(path: &Path) -> BTreeMap<String, Vec<(usize, String)>> {
    let db =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let tables: Vec<String> = db
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut values = BTreeMap::new();
    for table in tables {
        let mut texts = Vec::new();
        let mut statement = db.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        let columns = statement.column_count();
        let mut rows = statement.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            for i in 0..columns {
                if let rusqlite::types::ValueRef::Text(t) | rusqlite::types::ValueRef::Blob(t) =
                    row.get_ref(i).unwrap()
                {
                    texts.push((i, String::from_utf8_lossy(t).into_owned()));
                }
            }
        }
        values.insert(table, texts);
    }
    values
}

fn append(path: &Path) -> Stdio {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
        .into()
}

/// `kill <which> <pid>` (`-TERM`, `-HUP`), asserting it was delivered.
fn signal(pid: u32, which: &str) {
    let status = Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {which} {pid}");
}
