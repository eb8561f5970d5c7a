//! `agent.toml`: the raw file shape (serde) and the validated `AgentConfig` the code uses.
//!
//! Key names are fixed by DESIGN.md §5 and documented in `agent.toml.example`. Secrets are
//! never inline: the file names paths, and the secrets are read from them into
//! `SecretString`s that never print (not in `Debug`, logs or error text).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use proxops_core::plan::NodeScope;
pub use proxops_pve::Trust;
use secrecy::SecretString;
use serde::Deserialize;

mod scope;

/// Default `[pve] url`: the local node's API.
pub const DEFAULT_PVE_URL: &str = "https://127.0.0.1:8006";
/// Default `[pve] ca_file`: the cluster CA present on every PVE node.
pub const DEFAULT_CA_FILE: &str = "/etc/pve/pve-root-ca.pem";
/// The credential id under which the packaged unit hands over [`DEFAULT_CA_FILE`]; without
/// `ca_file`, `fingerprint` or `insecure`, a non-blank credential of that name is the CA.
pub const CA_CREDENTIAL: &str = "pve-root-ca";
/// Default `state_dir`.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/proxops";
/// Default `[http] listen` (the Go ProxOps port).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9494";
/// Default `[source] branch`.
pub const DEFAULT_BRANCH: &str = "main";
/// Default `[source] poll`.
pub const DEFAULT_POLL: &str = "60s";
/// Default `[policy] max_prune`.
pub const DEFAULT_MAX_PRUNE: u32 = 3;
/// Default `[pve] read_concurrency`: GETs in flight at once while observing. pveproxy runs
/// three worker processes (pve-manager `PVE/Service/pveproxy.pm` @ 14a22df3: `max_workers =>
/// 3`), and each runs one API handler at a time, synchronously in its event loop
/// (pve-http-server `src/PVE/APIServer/AnyEvent.pm` `handle_api2_request` @ 5c9e4ea calls
/// `rest_handler` inline). Four requests per worker keep every worker busy while the others'
/// answers cross the network, without a long queue in front of them.
pub const DEFAULT_READ_CONCURRENCY: usize = 12;
/// Largest `[pve] read_concurrency`.
pub const MAX_READ_CONCURRENCY: usize = 256;
/// Default `[policy] concurrency_per_node`.
pub const DEFAULT_CONCURRENCY_PER_NODE: usize = 4;
/// Default `[policy] task_timeout`.
pub const DEFAULT_TASK_TIMEOUT: &str = "30m";
/// `[policy] write_breaker_threshold` (the Go program's: 20 consecutive failed writes).
pub const DEFAULT_WRITE_BREAKER_THRESHOLD: u32 = 20;
/// `[policy] write_breaker_cool_down` (the Go program's: 10 minutes read-only before a probe).
pub const DEFAULT_WRITE_BREAKER_COOL_DOWN: Duration = Duration::from_secs(600);

/// The validated agent configuration.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The node this agent speaks for.
    pub node: NodeScope,
    /// Which `clusters/<cluster>/resources.yaml` to follow (composition mode).
    pub cluster: Option<String>,
    /// Where the state database and git mirror live.
    pub state_dir: PathBuf,
    /// The git repository to follow (absent: the CLI reads a local checkout).
    pub source: Option<SourceConfig>,
    /// The webhook receiver (absent: no webhooks).
    pub webhook: Option<WebhookConfig>,
    /// Where the status API listens.
    pub listen: SocketAddr,
    /// Who may read the status API and page (`[http] token_file`, `allowed_hosts`).
    pub http: HttpConfig,
    /// How to reach PVE.
    pub pve: PveConfig,
    /// What the agent may do.
    pub policy: Policy,
    /// Where the cluster's SOPS document and its age identity are.
    pub secrets: SecretsConfig,
    /// `[[notify]]`: where pass results are announced (`crate::notify`).
    pub notify: Vec<crate::notify::config::NotifyTarget>,
    /// `[forge]`: where commit statuses are written (`crate::forge`).
    pub forge: Option<crate::forge::config::ForgeConfig>,
    /// `[snippets]`: the default storage of cloud-init snippets and their grace period.
    pub snippets: crate::snippets::SnippetsConfig,
    /// `[scope]`: what the repository may declare, adopt and create.
    pub scope: proxops_core::scope::Scope,
    /// `[pmxcfs]`: cluster mode (status files, cluster view, cluster-wide locks); `None`
    /// without the table: cluster mode is off.
    pub pmxcfs: Option<crate::cluster::config::PmxcfsConfig>,
    /// `[rollout]`: the waves a new commit goes through (needs `[pmxcfs]`); `None`: every
    /// node writes a new commit at once.
    pub rollout: Option<crate::cluster::rollout_config::RolloutConfig>,
}

/// `[secrets]`: the SOPS document of cloud-init keys and passwords (issue 10).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretsConfig {
    /// The age identity file (`age_key_file`, else `$SOPS_AGE_KEY_FILE`).
    pub age_key_file: Option<PathBuf>,
    /// The SOPS document (`file`), instead of `clusters/<cluster>/secrets.sops.yaml`.
    pub file: Option<PathBuf>,
}

/// `[source]`.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// https, ssh or file URL.
    pub url: String,
    /// Branch to follow.
    pub branch: String,
    /// Sub-folder of the repository that holds the manifests.
    pub path: String,
    /// When to look again.
    pub poll: Poll,
    /// HTTPS token, read from `token_file`.
    pub token: Option<SecretString>,
    /// SSH private key file (passed to ssh, never read into memory).
    pub ssh_key_file: Option<PathBuf>,
    /// The forge's host keys (`known_hosts_file`): the only keys ssh accepts. Required for an
    /// ssh source, so no host key is trusted on first use.
    pub known_hosts_file: Option<PathBuf>,
    /// `verify` with its key files (`allowed_signers_file`, `gpg_keyring_file`); `None` for
    /// `verify = "off"`, the default.
    pub verify: Option<crate::source::verify::Policy>,
}

/// `[source] poll`: an interval or a cron expression.
#[derive(Debug, Clone)]
pub enum Poll {
    /// Every so often (with jitter).
    Every(Duration),
    /// A 5-field cron expression.
    Cron(String),
}

/// `[webhook]`.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The HMAC secret shared with the forge, read from `secret_file`.
    pub secret: SecretString,
    /// A listener of the webhook routes' own (`[webhook] listen`), so they can face the forge
    /// while `[http] listen` stays on loopback. Absent: the webhook routes share `[http] listen`.
    pub listen: Option<SocketAddr>,
}

/// `[http]` beyond `listen`: who may read the status API.
#[derive(Debug, Clone, Default)]
pub struct HttpConfig {
    /// The bearer token the status API, page and metrics require (`token_file`); `/healthz`,
    /// `/readyz` and the webhook routes (HMAC-checked) do not.
    pub token: Option<SecretString>,
    /// Host names (without port) the `Host` header of a status API request may carry, in
    /// lower case; `*` admits any. Default: `localhost`, `127.0.0.1`, `[::1]` and the IP of
    /// `[http] listen`. A request naming another host is refused (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// `[http] commit_url`: where the web UI links a commit, with `{sha}` standing for the
    /// full commit id (e.g. `https://forge.example.org/owner/repo/commit/{sha}`). Unset: the
    /// UI shows commits without links.
    pub commit_url: Option<String>,
}

/// `[pve]`.
#[derive(Debug, Clone)]
pub struct PveConfig {
    /// API base, e.g. `https://127.0.0.1:8006`.
    pub url: String,
    /// `user@realm!tokenid`.
    pub token_id: String,
    /// The token's secret, read from `token_secret_file`.
    pub token_secret: SecretString,
    /// How the server certificate is trusted.
    pub trust: Trust,
    /// `url` is `http://` (allowed by `allow_plain_http = true`): the token crosses the wire
    /// in clear. The agent warns at every start and `proxops check` reports it.
    pub plain_http: bool,
    /// GETs in flight at once while observing (`read_concurrency`).
    pub read_concurrency: usize,
}

impl PveConfig {
    /// The client settings for `proxops-pve`, with the default timeouts and retries.
    pub fn client_config(&self) -> proxops_pve::ClientConfig {
        proxops_pve::ClientConfig {
            base_url: self.url.clone(),
            token_id: self.token_id.clone(),
            token_secret: self.token_secret.clone(),
            trust: self.trust.clone(),
            timeout: proxops_pve::Timeouts::default(),
            retry: proxops_pve::RetryPolicy::default(),
        }
    }
}

/// `[policy]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Apply changes, or only report them.
    pub mode: Mode,
    /// Delete tagged guests no manifest declares.
    pub prune: bool,
    /// At most this many prunes per pass.
    pub max_prune: u32,
    /// Restart guests whose changes PVE left pending.
    pub restart_on_change: bool,
    /// Concurrent actions per node within a level.
    pub concurrency_per_node: usize,
    /// How long to wait for one PVE task.
    pub task_timeout: Duration,
    /// Consecutive failed writes that make the agent read-only (0: never).
    pub write_breaker_threshold: u32,
    /// How long the agent stays read-only before probing with one write.
    pub write_breaker_cool_down: Duration,
    /// `[[policy.window]]`: when writes may happen (UTC); empty: always.
    pub windows: Vec<crate::agent::window::Window>,
    /// `[policy] approve` and `max_changes`: what waits for `proxops approve`.
    pub approve: crate::agent::approval::ApprovePolicy,
    /// `snapshot`, `snapshot_keep`, `snapshot_required`: snapshots before risky updates.
    pub snapshots: proxops_core::plan::snapshot_policy::SnapshotPolicy,
    /// `backup_before_delete` and `backup_mode`: a vzdump before each prune delete.
    pub backup: Option<crate::execute::BackupPolicy>,
}

/// `[policy] mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Write to PVE.
    Apply,
    /// Plan and record drift; never write.
    Report,
}

/// Loading the configuration failed. Messages name the file and key, never a secret value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("reading {}", .path.display())]
    Read {
        /// The config file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The TOML does not parse or has unknown keys or wrong types.
    #[error("{}:{line}:{column}: {message}", .path.display())]
    Syntax {
        /// The config file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What the TOML parser said.
        message: String,
    },
    /// A key has a value that is not allowed.
    #[error("{}: {key}: {message}", .path.display())]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// The key, e.g. `pve.token_id`.
        key: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// A secret file named by a key could not be read.
    #[error("{}: {key}: reading secret file {}", .path.display(), .file.display())]
    SecretFile {
        /// The config file.
        path: PathBuf,
        /// The key that names the file.
        key: String,
        /// The secret file.
        file: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    node: Option<String>,
    cluster: Option<String>,
    state_dir: Option<PathBuf>,
    source: Option<RawSource>,
    webhook: Option<RawWebhook>,
    http: Option<RawHttp>,
    pve: Option<RawPve>,
    policy: Option<RawPolicy>,
    secrets: Option<RawSecrets>,
    #[serde(default)]
    notify: Vec<toml::Table>,
    forge: Option<crate::forge::config::RawForge>,
    snippets: Option<crate::snippets::config::RawSnippets>,
    scope: Option<scope::RawScope>,
    pmxcfs: Option<crate::cluster::config::RawPmxcfs>,
    rollout: Option<crate::cluster::rollout_config::RawRollout>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecrets {
    age_key_file: Option<PathBuf>,
    file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    url: String,
    branch: Option<String>,
    path: Option<String>,
    poll: Option<String>,
    token_file: Option<PathBuf>,
    ssh_key_file: Option<PathBuf>,
    known_hosts_file: Option<PathBuf>,
    verify: Option<String>,
    allowed_signers_file: Option<PathBuf>,
    gpg_keyring_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWebhook {
    secret_file: PathBuf,
    listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    listen: Option<String>,
    token_file: Option<PathBuf>,
    allowed_hosts: Option<Vec<String>>,
    commit_url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPve {
    url: Option<String>,
    token_id: Option<String>,
    token_secret_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    fingerprint: Option<String>,
    insecure: Option<bool>,
    allow_plain_http: Option<bool>,
    read_concurrency: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    mode: Option<Mode>,
    prune: Option<bool>,
    max_prune: Option<u32>,
    restart_on_change: Option<bool>,
    concurrency_per_node: Option<usize>,
    task_timeout: Option<String>,
    write_breaker_threshold: Option<u32>,
    write_breaker_cool_down: Option<String>,
    window: Option<Vec<crate::agent::window::RawWindow>>,
    approve: Option<Vec<crate::agent::approval::ApproveWhen>>,
    max_changes: Option<u32>,
    snapshot: Option<String>,
    snapshot_keep: Option<u32>,
    snapshot_required: Option<bool>,
    backup_before_delete: Option<String>,
    backup_mode: Option<String>,
}

/// `[policy] snapshot` (`off`, `risky`, `updates`; default `risky`), `snapshot_keep` (at
/// least 1; default 3) and `snapshot_required` (default false).
fn snapshot_policy(
    p: &RawPolicy,
) -> Result<proxops_core::plan::snapshot_policy::SnapshotPolicy, (&'static str, String)> {
    use proxops_core::plan::snapshot_policy::{DEFAULT_KEEP, SnapshotMode, SnapshotPolicy};
    let mode = match p.snapshot.as_deref() {
        None => SnapshotMode::Risky,
        Some(text) => SnapshotMode::parse(text).ok_or_else(|| {
            (
                "policy.snapshot",
                format!("`{text}` is not one of `off`, `risky`, `updates`"),
            )
        })?,
    };
    let keep = p.snapshot_keep.unwrap_or(DEFAULT_KEEP);
    if keep == 0 {
        return Err((
            "policy.snapshot_keep",
            "must be at least 1 (the snapshot just taken is always kept); set snapshot = \"off\" to take none".to_owned(),
        ));
    }
    Ok(SnapshotPolicy {
        mode,
        keep,
        required: p.snapshot_required.unwrap_or(false),
    })
}

/// `[policy] backup_before_delete` (a PVE storage id, `pve-storage-id`: a letter, then
/// letters, digits, `-`, `_`, `.`, ending in a letter or digit) and `backup_mode` (vzdump's
/// `snapshot`, `suspend` or `stop`; default `snapshot`). `backup_mode` alone is an error:
/// it would do nothing.
fn backup_policy(
    storage: Option<&str>,
    mode: Option<&str>,
) -> Result<Option<crate::execute::BackupPolicy>, (&'static str, String)> {
    let Some(storage) = storage else {
        return match mode {
            None => Ok(None),
            Some(_) => Err((
                "policy.backup_mode",
                "is set but policy.backup_before_delete is not: name the backup storage \
                 (e.g. backup_before_delete = \"local\") or remove backup_mode"
                    .to_owned(),
            )),
        };
    };
    let mode = match mode {
        None => proxops_pve::backup::BackupMode::default(),
        Some(text) => proxops_pve::backup::BackupMode::parse(text).ok_or_else(|| {
            (
                "policy.backup_mode",
                format!("`{text}`: write \"snapshot\", \"suspend\" or \"stop\" (vzdump's modes)"),
            )
        })?,
    };
    let bytes = storage.as_bytes();
    let valid = bytes.len() >= 2
        && bytes[0].is_ascii_alphabetic()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !valid {
        return Err((
            "policy.backup_before_delete",
            format!(
                "`{storage}` is not a PVE storage id (a letter, then letters, digits, `-`, `_` or \
                 `.`); write the id `pvesm status` lists, e.g. \"local\""
            ),
        ));
    }
    Ok(Some(crate::execute::BackupPolicy {
        storage: storage.to_owned(),
        mode,
    }))
}

impl AgentConfig {
    /// Reads and validates `path`; secret files named in it are read too.
    ///
    /// # Errors
    /// Unreadable files, TOML errors (with line and column), invalid values.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(path, &text)
    }

    /// Validates the text of a config file; `path` is used for messages and to resolve
    /// relative file paths (see [`resolve_file`]), with systemd's `$CREDENTIALS_DIRECTORY`
    /// when it is set.
    ///
    /// # Errors
    /// As [`AgentConfig::load`].
    pub fn from_toml(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let credentials = std::env::var_os(CREDENTIALS_DIRECTORY)
            .filter(|dir| !dir.is_empty())
            .map(PathBuf::from);
        Self::from_toml_with_credentials(path, text, credentials.as_deref())
    }

    /// [`AgentConfig::from_toml`] with the credentials directory given rather than read
    /// from the environment.
    ///
    /// # Errors
    /// As [`AgentConfig::load`].
    pub fn from_toml_with_credentials(
        path: &Path,
        text: &str,
        credentials: Option<&Path>,
    ) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| syntax_error(path, text, &e))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |file: &Path| resolve_file(base, credentials, file);
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key: key.to_owned(),
            message,
        };
        let read_secret = |key: &str, file: &Path| -> Result<SecretString, ConfigError> {
            let file = resolve(file);
            let text =
                std::fs::read_to_string(&file).map_err(|source| ConfigError::SecretFile {
                    path: path.to_path_buf(),
                    key: key.to_owned(),
                    file: file.clone(),
                    source,
                })?;
            warn_if_readable_by_others(key, &file);
            let secret = text.trim_end_matches(['\n', '\r']).to_owned();
            if secret.is_empty() {
                return Err(invalid(
                    key,
                    format!("secret file {} is empty", file.display()),
                ));
            }
            Ok(SecretString::from(secret))
        };

        let node = match raw.node.as_deref() {
            Some("*") => NodeScope::All,
            Some(node) if is_node_name(node) => NodeScope::Node(node.to_owned()),
            Some(node) => {
                return Err(invalid(
                    "node",
                    format!("`{node}` is not a PVE node name (or \"*\")"),
                ));
            }
            None => NodeScope::Node(local_hostname().ok_or_else(|| {
                invalid(
                    "node",
                    "not set and this host's name is unknown; set `node`".to_owned(),
                )
            })?),
        };

        let source = match raw.source {
            None => None,
            Some(s) => {
                let poll_text = s.poll.as_deref().unwrap_or(DEFAULT_POLL);
                let poll = parse_poll(poll_text).map_err(|m| invalid("source.poll", m))?;
                let token = s
                    .token_file
                    .as_deref()
                    .map(|f| read_secret("source.token_file", f))
                    .transpose()?;
                if !(s.url.starts_with("https://")
                    || s.url.starts_with("http://")
                    || s.url.starts_with("ssh://")
                    || s.url.starts_with("git://")
                    || s.url.starts_with("file://")
                    || s.url.contains('@'))
                {
                    return Err(invalid(
                        "source.url",
                        "must be an https, http, ssh (or user@host:path), git or file URL"
                            .to_owned(),
                    ));
                }
                let known_hosts_file = s.known_hosts_file.as_deref().map(resolve);
                match (is_ssh_url(&s.url), &known_hosts_file) {
                    (true, None) => {
                        return Err(invalid(
                            "source.known_hosts_file",
                            missing_known_hosts(&s.url),
                        ));
                    }
                    (true, Some(file)) if !file.is_file() => {
                        return Err(invalid(
                            "source.known_hosts_file",
                            format!(
                                "{} is not a file; {}",
                                file.display(),
                                missing_known_hosts(&s.url)
                            ),
                        ));
                    }
                    (false, Some(_)) => {
                        return Err(invalid(
                            "source.known_hosts_file",
                            "only an ssh source uses it; remove it, or use an ssh:// URL"
                                .to_owned(),
                        ));
                    }
                    _ => {}
                }
                let verify = source_verify(
                    s.verify.as_deref(),
                    s.allowed_signers_file.as_deref().map(resolve).as_deref(),
                    s.gpg_keyring_file.as_deref().map(resolve).as_deref(),
                    &invalid,
                )?;
                Some(SourceConfig {
                    verify,
                    url: s.url,
                    branch: s.branch.unwrap_or_else(|| DEFAULT_BRANCH.to_owned()),
                    path: s.path.unwrap_or_else(|| ".".to_owned()),
                    poll,
                    token,
                    ssh_key_file: s.ssh_key_file.map(|f| {
                        let file = resolve(&f);
                        warn_if_readable_by_others("source.ssh_key_file", &file);
                        file
                    }),
                    known_hosts_file,
                })
            }
        };

        let parse_listen = |key: &str, text: &str| -> Result<SocketAddr, ConfigError> {
            text.parse().map_err(|_| {
                invalid(
                    key,
                    format!("`{text}` is not an address like 127.0.0.1:9494"),
                )
            })
        };
        let webhook = match raw.webhook {
            None => None,
            Some(w) => Some(WebhookConfig {
                secret: read_secret("webhook.secret_file", &w.secret_file)?,
                listen: w
                    .listen
                    .as_deref()
                    .map(|text| parse_listen("webhook.listen", text))
                    .transpose()?,
            }),
        };

        let raw_http = raw.http.unwrap_or_default();
        let listen_text = raw_http.listen.unwrap_or_else(|| DEFAULT_LISTEN.into());
        let listen = parse_listen("http.listen", &listen_text)?;
        if let Some(webhook_listen) = webhook.as_ref().and_then(|w| w.listen)
            && webhook_listen == listen
            && listen.port() != 0
        {
            return Err(invalid(
                "webhook.listen",
                format!(
                    "`{webhook_listen}` is [http] listen too; give the webhooks another port, \
                     or remove webhook.listen to share [http] listen"
                ),
            ));
        }
        let token = raw_http
            .token_file
            .as_deref()
            .map(|f| read_secret("http.token_file", f))
            .transpose()?;
        let allowed_hosts = match raw_http.allowed_hosts {
            Some(hosts) => {
                let mut names = Vec::with_capacity(hosts.len());
                for host in hosts {
                    let name = host.trim().to_ascii_lowercase();
                    if !is_host_name(&name) {
                        return Err(invalid(
                            "http.allowed_hosts",
                            format!(
                                "`{host}` is not a host name or address without a port \
                                 (e.g. pve1.example.org, 10.0.0.5, [fd00::5], or \"*\")"
                            ),
                        ));
                    }
                    names.push(name);
                }
                names
            }
            None => default_allowed_hosts(listen),
        };
        let commit_url = raw_http
            .commit_url
            .map(|url| {
                let url = url.trim().to_owned();
                let scheme_ok = url.starts_with("https://") || url.starts_with("http://");
                if scheme_ok && url.contains("{sha}") && !url.contains(char::is_whitespace) {
                    Ok(url)
                } else {
                    Err(invalid(
                        "http.commit_url",
                        format!(
                            "`{url}` is not an http(s) URL with `{{sha}}` in it \
                             (e.g. https://forge.example.org/owner/repo/commit/{{sha}})"
                        ),
                    ))
                }
            })
            .transpose()?;
        let http = HttpConfig {
            token,
            allowed_hosts,
            commit_url,
        };

        let raw_pve = raw.pve.ok_or_else(|| {
            invalid(
                "pve",
                "missing: set [pve] token_id and token_secret_file".to_owned(),
            )
        })?;
        let token_id = raw_pve.token_id.ok_or_else(|| {
            invalid(
                "pve.token_id",
                "missing: the API token id, e.g. proxops@pve!agent".to_owned(),
            )
        })?;
        if !is_token_id(&token_id) {
            return Err(invalid(
                "pve.token_id",
                format!("`{token_id}` is not a token id of the form user@realm!tokenid"),
            ));
        }
        let secret_file = raw_pve.token_secret_file.ok_or_else(|| {
            invalid(
                "pve.token_secret_file",
                "missing: a file holding the token secret".to_owned(),
            )
        })?;
        let token_secret = read_secret("pve.token_secret_file", &secret_file)?;
        let url = raw_pve.url.unwrap_or_else(|| DEFAULT_PVE_URL.to_owned());
        let plain_http = url
            .get(..7)
            .is_some_and(|s| s.eq_ignore_ascii_case("http://"));
        if plain_http && !raw_pve.allow_plain_http.unwrap_or(false) {
            return Err(invalid(
                "pve.url",
                format!(
                    "`{url}` is plain http: the API token would cross the network in clear; \
                     use https:// (PVE's API listens on https://<node>:8006), or for a test rig \
                     only set [pve] allow_plain_http = true"
                ),
            ));
        }
        if plain_http && (raw_pve.ca_file.is_some() || raw_pve.fingerprint.is_some()) {
            return Err(invalid(
                "pve",
                format!(
                    "`{url}` is plain http, so ca_file and fingerprint would check nothing; \
                     use https:// or remove them"
                ),
            ));
        }
        let trust = if plain_http {
            // Nothing to verify over http; the client never uses this.
            Trust::Insecure
        } else {
            trust_setting(
                raw_pve.ca_file,
                raw_pve.fingerprint,
                raw_pve.insecure.unwrap_or(false),
                credentials,
                &resolve,
                &invalid,
            )?
        };
        let read_concurrency = raw_pve.read_concurrency.unwrap_or(DEFAULT_READ_CONCURRENCY);
        if !(1..=MAX_READ_CONCURRENCY).contains(&read_concurrency) {
            return Err(invalid(
                "pve.read_concurrency",
                format!("{read_concurrency}: must be between 1 and {MAX_READ_CONCURRENCY}"),
            ));
        }
        let pve = PveConfig {
            url,
            token_id,
            token_secret,
            trust,
            plain_http,
            read_concurrency,
        };

        let raw_secrets = raw.secrets.unwrap_or_default();
        let secrets = SecretsConfig {
            age_key_file: raw_secrets
                .age_key_file
                .map(|f| resolve(&f))
                .or_else(|| proxops_sops::identity_file(None)),
            file: raw_secrets.file.map(|f| base.join(f)),
        };

        let snippets = raw
            .snippets
            .unwrap_or_default()
            .validate()
            .map_err(|(key, message)| invalid(key, message))?;

        let p = raw.policy.unwrap_or_default();
        let snapshots = snapshot_policy(&p).map_err(|(key, message)| invalid(key, message))?;
        let task_timeout_text = p
            .task_timeout
            .unwrap_or_else(|| DEFAULT_TASK_TIMEOUT.to_owned());
        let task_timeout = humantime::parse_duration(&task_timeout_text)
            .map_err(|e| invalid("policy.task_timeout", format!("`{task_timeout_text}`: {e}")))?;
        let concurrency_per_node = p
            .concurrency_per_node
            .unwrap_or(DEFAULT_CONCURRENCY_PER_NODE);
        if concurrency_per_node == 0 {
            return Err(invalid(
                "policy.concurrency_per_node",
                "must be at least 1".to_owned(),
            ));
        }
        let write_breaker_cool_down = match &p.write_breaker_cool_down {
            Some(text) => humantime::parse_duration(text)
                .map_err(|e| invalid("policy.write_breaker_cool_down", format!("`{text}`: {e}")))?,
            None => DEFAULT_WRITE_BREAKER_COOL_DOWN,
        };
        let windows = crate::agent::window::parse(p.window.as_deref().unwrap_or_default())
            .map_err(|(key, message)| invalid(&key, message))?;
        let backup = backup_policy(p.backup_before_delete.as_deref(), p.backup_mode.as_deref())
            .map_err(|(key, message)| invalid(key, message))?;
        let policy = Policy {
            snapshots,
            backup,
            windows,
            approve: crate::agent::approval::ApprovePolicy {
                when: p.approve.unwrap_or_default().into_iter().collect(),
                max_changes: p
                    .max_changes
                    .unwrap_or(crate::agent::approval::DEFAULT_MAX_CHANGES),
            },
            write_breaker_threshold: p
                .write_breaker_threshold
                .unwrap_or(DEFAULT_WRITE_BREAKER_THRESHOLD),
            write_breaker_cool_down,
            mode: p.mode.unwrap_or(Mode::Apply),
            prune: p.prune.unwrap_or(false),
            max_prune: p.max_prune.unwrap_or(DEFAULT_MAX_PRUNE),
            restart_on_change: p.restart_on_change.unwrap_or(false),
            concurrency_per_node,
            task_timeout,
        };

        let notify = crate::notify::config::parse(
            raw.notify,
            &crate::notify::config::Loader {
                path,
                resolve: &resolve,
                read_secret: &read_secret,
            },
        )?;
        let forge = crate::forge::config::parse(
            raw.forge,
            &crate::forge::config::Loader {
                path,
                resolve: &resolve,
                read_secret: &read_secret,
            },
        )?;
        let scope = raw
            .scope
            .unwrap_or_default()
            .validate()
            .map_err(|bad| invalid(bad.key, bad.message))?;
        let pmxcfs = raw
            .pmxcfs
            .map(crate::cluster::config::RawPmxcfs::validate)
            .transpose()
            .map_err(|(key, message)| invalid(key, message))?;
        let rollout = crate::cluster::rollout_config::parse(
            raw.rollout,
            path,
            text,
            &node,
            pmxcfs.is_some(),
        )?;

        Ok(AgentConfig {
            node,
            cluster: raw.cluster,
            state_dir: raw
                .state_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
            source,
            webhook,
            listen,
            http,
            pve,
            policy,
            secrets,
            notify,
            forge,
            snippets,
            scope,
            pmxcfs,
            rollout,
        })
    }
}

/// The `[scope]` of the agent config at `path`, reading nothing else of it (no secret file):
/// what `proxops validate --config` checks a repository against.
///
/// # Errors
/// The file cannot be read, is not TOML of the config's shape, or `[scope]` is invalid.
pub fn scope_of(path: &Path) -> Result<proxops_core::scope::Scope, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let raw: RawConfig = toml::from_str(&text).map_err(|e| syntax_error(path, &text, &e))?;
    raw.scope
        .unwrap_or_default()
        .validate()
        .map_err(|bad| ConfigError::Invalid {
            path: path.to_path_buf(),
            key: bad.key.to_owned(),
            message: bad.message,
        })
}

/// Whether `[source] url` is fetched over ssh: `ssh://` (and git's `git+ssh://`, `ssh+git://`)
/// or the scp-like `user@host:path`.
fn is_ssh_url(url: &str) -> bool {
    ["ssh://", "git+ssh://", "ssh+git://"]
        .iter()
        .any(|scheme| url.starts_with(scheme))
        || (!url.contains("://") && url.contains(':'))
}

/// `[source] verify` and its key files, read and checked now so a bad line stops the start
/// (or the reload) with its file and line.
fn source_verify(
    mode: Option<&str>,
    allowed_signers_file: Option<&Path>,
    gpg_keyring_file: Option<&Path>,
    invalid: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Option<crate::source::verify::Policy>, ConfigError> {
    use crate::source::verify::{Mode, Policy};
    let mode = match mode.unwrap_or("off") {
        "off" => None,
        "head" => Some(Mode::Head),
        "range" => Some(Mode::Range),
        other => {
            return Err(invalid(
                "source.verify",
                format!("`{other}` is not one of \"off\", \"head\", \"range\""),
            ));
        }
    };
    let Some(mode) = mode else {
        if allowed_signers_file.is_some() || gpg_keyring_file.is_some() {
            return Err(invalid(
                "source.verify",
                "is off, so allowed_signers_file and gpg_keyring_file would be ignored; set \
                 verify = \"head\" or \"range\", or remove them"
                    .to_owned(),
            ));
        }
        return Ok(None);
    };
    if allowed_signers_file.is_none() && gpg_keyring_file.is_none() {
        return Err(invalid(
            "source.verify",
            format!(
                "\"{}\" needs the keys to trust: set allowed_signers_file (git's \
                 gpg.ssh.allowedSignersFile format) or gpg_keyring_file (armored OpenPGP \
                 public keys), or both",
                mode.as_str()
            ),
        ));
    }
    Policy::load(mode, allowed_signers_file, gpg_keyring_file)
        .map(Some)
        .map_err(|errors| {
            let ssh = allowed_signers_file.is_some_and(|f| errors.iter().any(|e| e.file == f));
            let key = if ssh {
                "source.allowed_signers_file"
            } else {
                "source.gpg_keyring_file"
            };
            let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
            invalid(key, text.join("; "))
        })
}

/// What to do when an ssh source has no `known_hosts_file`, naming the forge's host.
fn missing_known_hosts(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/']).next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match url.contains("://") {
        true => match host_port.rsplit_once(':') {
            Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => (host, Some(port)),
            _ => (host_port, None),
        },
        false => (host_port.split(':').next().unwrap_or(host_port), None),
    };
    let port_flag = port.map_or_else(String::new, |p| format!("-p {p} "));
    format!(
        "an ssh source needs the forge's host keys, so that no key is trusted on first use: \
         run `ssh-keyscan {port_flag}{host} > /etc/proxops/known_hosts`, compare \
         `ssh-keygen -lf /etc/proxops/known_hosts` with the fingerprints {host} publishes, \
         and set known_hosts_file = \"/etc/proxops/known_hosts\""
    )
}

/// How `[pve]` says PVE's certificate is trusted (https only).
fn trust_setting(
    ca_file: Option<PathBuf>,
    fingerprint: Option<String>,
    insecure: bool,
    credentials: Option<&Path>,
    resolve: &dyn Fn(&Path) -> PathBuf,
    invalid: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Trust, ConfigError> {
    Ok(match (ca_file, fingerprint, insecure) {
        (Some(ca), None, false) => Trust::CaFile(resolve(&ca)),
        (None, Some(fp), false) => {
            if !is_sha256_fingerprint(&fp) {
                return Err(invalid(
                    "pve.fingerprint",
                    "not a SHA-256 fingerprint (32 hex bytes, colon-separated)".to_owned(),
                ));
            }
            Trust::Fingerprint(fp.to_ascii_uppercase())
        }
        (None, None, true) => Trust::Insecure,
        // The packaged unit hands the CA over as a credential (LoadCredential=), so the
        // agent needs no www-data group to read /etc/pve; a blank one is its fallback.
        (None, None, false)
            if let Some(credential) = credentials.map(|dir| dir.join(CA_CREDENTIAL))
                && std::fs::read_to_string(&credential).is_ok_and(|pem| !pem.trim().is_empty()) =>
        {
            Trust::CaFile(credential)
        }
        (None, None, false) if Path::new(DEFAULT_CA_FILE).exists() => {
            Trust::CaFile(PathBuf::from(DEFAULT_CA_FILE))
        }
        (None, None, false) => {
            return Err(invalid(
                "pve",
                format!(
                    "no way to trust PVE's certificate: {DEFAULT_CA_FILE} does not exist here; \
                     set ca_file, fingerprint (as `pvenode cert info` shows it) or insecure = true"
                ),
            ));
        }
        _ => {
            return Err(invalid(
                "pve",
                "set only one of ca_file, fingerprint and insecure".to_owned(),
            ));
        }
    })
}

/// The environment variable systemd sets for a unit with `LoadCredential=`.
pub const CREDENTIALS_DIRECTORY: &str = "CREDENTIALS_DIRECTORY";

/// Where a file named in the config (`*_file` keys) is. An absolute path is taken as written.
/// A relative one is first looked up in the credentials directory (`$CREDENTIALS_DIRECTORY`,
/// set by systemd's `LoadCredential=`), so `token_secret_file = "pve-token-secret"` finds
/// the credential of that name under the packaged unit, and otherwise is relative to the
/// directory of the config file (`/etc/proxops/pve-token-secret` when run by hand).
pub fn resolve_file(config_dir: &Path, credentials: Option<&Path>, file: &Path) -> PathBuf {
    if file.is_relative()
        && let Some(credential) = credentials.map(|dir| dir.join(file))
        && credential.is_file()
    {
        return credential;
    }
    config_dir.join(file)
}

fn syntax_error(path: &Path, text: &str, error: &toml::de::Error) -> ConfigError {
    let (line, column) = error
        .span()
        .map_or((1, 1), |span| line_column(text, span.start));
    ConfigError::Syntax {
        path: path.to_path_buf(),
        line,
        column,
        message: error.message().trim_end().to_owned(),
    }
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

fn parse_poll(text: &str) -> Result<Poll, String> {
    if text.split_whitespace().count() == 5 {
        return text
            .parse::<croner::Cron>()
            .map(|_| Poll::Cron(text.to_owned()))
            .map_err(|e| format!("`{text}` is not a valid cron expression: {e}"));
    }
    match humantime::parse_duration(text) {
        Ok(d) if d >= Duration::from_secs(1) => Ok(Poll::Every(d)),
        Ok(_) => Err(format!("`{text}` is shorter than one second")),
        Err(e) => Err(format!(
            "`{text}` is neither an interval like 60s nor a 5-field cron expression: {e}"
        )),
    }
}

pub(crate) fn is_node_name(s: &str) -> bool {
    // PVE's pve-node format: a DNS label.
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_token_id(s: &str) -> bool {
    let Some((user, token)) = s.split_once('!') else {
        return false;
    };
    let Some((name, realm)) = user.split_once('@') else {
        return false;
    };
    let ident = |t: &str| {
        t.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    };
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c == ':' || c == '/')
        && ident(realm)
        && ident(token)
}

fn is_sha256_fingerprint(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 32
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

fn local_hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim().split('.').next()?.to_owned();
    is_node_name(&name).then_some(name)
}

/// A secret file should be readable by the agent's user only (mode 0600 or 0400), as the
/// age identity must be (`proxops_sops`): a warning names the key, the file and its mode, never
/// its content. Under the packaged unit `LoadCredential=` hands the files over 0400, so this
/// matters when the agent runs by hand or from files with a loose mode.
fn warn_if_readable_by_others(key: &str, file: &Path) {
    if let Some(mode) = readable_by_others(file) {
        tracing::warn!(
            key,
            file = %file.display(),
            mode = format!("{mode:o}"),
            "secret file is readable by other users; chmod 600 it"
        );
    }
}

/// The permission bits of `file` when group or others may read or write it.
fn readable_by_others(file: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(file).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then_some(mode)
}

/// `[http] allowed_hosts` when not set: the loopback names and the IP `[http] listen` is
/// bound to (an unspecified address such as 0.0.0.0 names no host).
fn default_allowed_hosts(listen: SocketAddr) -> Vec<String> {
    let mut hosts = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "[::1]".to_owned(),
    ];
    let ip = listen.ip();
    if !ip.is_unspecified() {
        let name = match ip {
            std::net::IpAddr::V4(v4) => v4.to_string(),
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        };
        if !hosts.contains(&name) {
            hosts.push(name);
        }
    }
    hosts
}

/// A host as a `Host` header names it, without the port: a DNS name, an IPv4 address, an
/// IPv6 address in brackets, or `*`.
fn is_host_name(s: &str) -> bool {
    if s == "*" {
        return true;
    }
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return inner.parse::<std::net::Ipv6Addr>().is_ok();
    }
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0b5e6c7d-aaaa-bbbb-cccc-123456789abc";
    const HOOK_SECRET: &str = "webhook-hmac-secret-value";

    fn write_config(body: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), format!("{SECRET}\n")).unwrap();
        std::fs::write(dir.path().join("hook"), HOOK_SECRET).unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, body).unwrap();
        (dir, path)
    }

    const FULL: &str = r#"
node = "pve1"
cluster = "homelab"
state_dir = "/tmp/proxops"

[source]
url = "https://git.example.org/ops/pve.git"
branch = "prod"
poll = "*/5 * * * *"

[webhook]
secret_file = "hook"

[http]
listen = "127.0.0.1:9595"

[pve]
url = "https://10.0.0.1:8006"
token_id = "proxops@pve!agent"
token_secret_file = "token"
insecure = true

[policy]
mode = "report"
prune = true
max_prune = 5
task_timeout = "10m"
write_breaker_threshold = 7
write_breaker_cool_down = "90s"
"#;

    #[test]
    fn full_config_loads_with_secrets_from_files() {
        let (_dir, path) = write_config(FULL);
        let config = AgentConfig::load(&path).unwrap();
        assert_eq!(config.node, NodeScope::Node("pve1".into()));
        assert_eq!(config.cluster.as_deref(), Some("homelab"));
        assert_eq!(config.pve.trust, Trust::Insecure);
        assert_eq!(config.policy.mode, Mode::Report);
        assert_eq!(config.policy.max_prune, 5);
        assert_eq!(config.policy.task_timeout, Duration::from_secs(600));
        assert_eq!(config.policy.write_breaker_threshold, 7);
        assert_eq!(
            config.policy.write_breaker_cool_down,
            Duration::from_secs(90)
        );
        assert_eq!(config.listen.port(), 9595);
        let source = config.source.unwrap();
        assert!(matches!(source.poll, Poll::Cron(ref c) if c == "*/5 * * * *"));
        use secrecy::ExposeSecret;
        assert_eq!(config.pve.token_secret.expose_secret(), SECRET);
    }

    #[test]
    fn snapshot_policy_defaults_to_risky_keep_three_and_reads_its_keys() {
        use proxops_core::plan::snapshot_policy::{SnapshotMode, SnapshotPolicy};
        let base = "node = \"pve1\"\n[pve]\ntoken_id = \"root@pam!x\"\ntoken_secret_file = \"token\"\ninsecure = true\n";
        let (_dir, path) = write_config(base);
        let config = AgentConfig::load(&path).unwrap();
        assert_eq!(config.policy.snapshots, SnapshotPolicy::default());
        assert_eq!(config.policy.snapshots.mode, SnapshotMode::Risky);
        assert_eq!(config.policy.snapshots.keep, 3);
        let (_dir, path) = write_config(&format!(
            "{base}[policy]\nsnapshot = \"updates\"\nsnapshot_keep = 5\nsnapshot_required = true\n"
        ));
        let config = AgentConfig::load(&path).unwrap();
        assert_eq!(
            config.policy.snapshots,
            SnapshotPolicy {
                mode: SnapshotMode::Updates,
                keep: 5,
                required: true
            }
        );
    }

    #[test]
    fn an_unknown_snapshot_mode_or_a_keep_of_zero_is_refused_naming_the_key() {
        let base = "node = \"pve1\"\n[pve]\ntoken_id = \"root@pam!x\"\ntoken_secret_file = \"token\"\ninsecure = true\n[policy]\n";
        let (_dir, path) = write_config(&format!("{base}snapshot = \"always\"\n"));
        let err = AgentConfig::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("policy.snapshot") && err.contains("`always`"),
            "{err}"
        );
        let (_dir, path) = write_config(&format!("{base}snapshot_keep = 0\n"));
        let err = AgentConfig::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("policy.snapshot_keep") && err.contains("at least 1"),
            "{err}"
        );
    }

    #[test]
    fn defaults_apply_when_keys_are_absent() {
        let (_dir, path) = write_config(
            "node = \"*\"\n[pve]\ntoken_id = \"root@pam!proxops\"\ntoken_secret_file = \"token\"\nfingerprint = \"ab:CD:00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff:00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd\"\n",
        );
        let config = AgentConfig::load(&path).unwrap();
        assert_eq!(config.node, NodeScope::All);
        assert_eq!(config.pve.url, DEFAULT_PVE_URL);
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
        assert!(matches!(config.pve.trust, Trust::Fingerprint(ref f) if f.starts_with("AB:CD")));
        assert_eq!(config.policy.mode, Mode::Apply);
        assert_eq!(config.policy.write_breaker_threshold, 20);
        assert_eq!(
            config.policy.write_breaker_cool_down,
            Duration::from_secs(600)
        );
        assert!(!config.policy.prune);
        assert_eq!(config.policy.max_prune, DEFAULT_MAX_PRUNE);
        assert_eq!(
            config.policy.concurrency_per_node,
            DEFAULT_CONCURRENCY_PER_NODE
        );
        assert_eq!(config.pve.read_concurrency, DEFAULT_READ_CONCURRENCY);
    }

    #[test]
    fn secrets_never_appear_in_debug_output() {
        let (_dir, path) = write_config(FULL);
        let config = AgentConfig::load(&path).unwrap();
        let debug = format!("{config:?}");
        assert!(!debug.contains(SECRET), "{debug}");
        assert!(!debug.contains(HOOK_SECRET), "{debug}");
    }

    #[test]
    fn an_inline_secret_is_an_unknown_key_and_the_error_does_not_echo_it() {
        let (_dir, path) = write_config(&format!(
            "[pve]\ntoken_id = \"root@pam!x\"\ntoken_secret = \"{SECRET}\"\n"
        ));
        let err = AgentConfig::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("agent.toml:3:1: unknown field `token_secret`"),
            "{err}"
        );
        assert!(!err.contains(SECRET), "{err}");
    }

    #[test]
    fn a_missing_secret_file_names_the_key_and_file() {
        let (_dir, path) = write_config(
            "node = \"pve1\"\n[pve]\ntoken_id = \"root@pam!x\"\ntoken_secret_file = \"nope\"\n",
        );
        let err = AgentConfig::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("pve.token_secret_file: reading secret file"),
            "{err}"
        );
        assert!(err.ends_with("/nope"), "{err}");
    }

    #[test]
    fn relative_secret_files_are_read_from_the_credentials_directory_when_systemd_passed_them() {
        let (dir, path) = write_config(
            "node = \"pve1\"\n[webhook]\nsecret_file = \"webhook-secret\"\n[pve]\ntoken_id = \"root@pam!x\"\ntoken_secret_file = \"pve-token-secret\"\nca_file = \"pve-root-ca\"\n[source]\nurl = \"ssh://git@example.org/ops.git\"\nssh_key_file = \"git-ssh-key\"\nknown_hosts_file = \"known_hosts\"\n",
        );
        std::fs::write(
            dir.path().join("known_hosts"),
            "example.org ssh-ed25519 AAAA\n",
        )
        .unwrap();
        let credentials = dir.path().join("credentials");
        std::fs::create_dir(&credentials).unwrap();
        std::fs::write(credentials.join("pve-token-secret"), "from-credentials\n").unwrap();
        std::fs::write(credentials.join("git-ssh-key"), "key").unwrap();
        // Not passed as credentials: these fall back to the config file's directory.
        std::fs::write(dir.path().join("webhook-secret"), HOOK_SECRET).unwrap();
        let config = AgentConfig::from_toml_with_credentials(
            &path,
            &std::fs::read_to_string(&path).unwrap(),
            Some(&credentials),
        )
        .unwrap();
        use secrecy::ExposeSecret;
        assert_eq!(config.pve.token_secret.expose_secret(), "from-credentials");
        assert_eq!(config.webhook.unwrap().secret.expose_secret(), HOOK_SECRET);
        assert_eq!(
            config.source.unwrap().ssh_key_file.unwrap(),
            credentials.join("git-ssh-key")
        );
        assert_eq!(
            config.pve.trust,
            Trust::CaFile(dir.path().join("pve-root-ca"))
        );
    }

    #[test]
    fn an_ssh_source_without_known_hosts_is_refused_with_how_to_get_the_forge_key() {
        for (url, scan) in [
            (
                "ssh://git@git.example.org:2222/ops.git",
                "ssh-keyscan -p 2222 git.example.org",
            ),
            (
                "git@git.example.org:ops/infra.git",
                "ssh-keyscan git.example.org",
            ),
        ] {
            let (_dir, path) = write_config(&format!(
                "node = \"pve1\"\n[pve]\ntoken_id = \"root@pam!x\"\ninsecure = true\n\
                 token_secret_file = \"t\"\n[source]\nurl = \"{url}\"\n"
            ));
            std::fs::write(path.with_file_name("t"), "x").unwrap();
            let err = AgentConfig::load(&path).unwrap_err().to_string();
            assert!(
                err.contains("source.known_hosts_file: an ssh source needs the forge's host keys")
                    && err.contains(scan)
                    && err.contains("ssh-keygen -lf"),
                "{err}"
            );
        }
    }

    #[test]
    fn source_verify_needs_a_key_file_and_names_the_bad_line_of_one() {
        let config = |source: &str| {
            format!(
                "node = \"pve1\"\n[pve]\ntoken_id = \"root@pam!x\"\ninsecure = true\n\
                 token_secret_file = \"t\"\n[source]\nurl = \"https://git.example.org/ops.git\"\n\
                 {source}"
            )
        };
        let load = |source: &str| {
            let (dir, path) = write_config(&config(source));
            std::fs::write(dir.path().join("t"), "x").unwrap();
            std::fs::write(
                dir.path().join("allowed_signers"),
                "# ops\nops@example.org valid-before=2027 ssh-ed25519 AAAA\n",
            )
            .unwrap();
            (AgentConfig::load(&path).map_err(|e| e.to_string()), dir)
        };
        let (off, _dir) = load("");
        assert!(off.unwrap().source.unwrap().verify.is_none());

        let (err, _dir) = load("verify = \"range\"\n");
        let err = err.unwrap_err();
        assert!(
            err.contains(
                "source.verify: \"range\" needs the keys to trust: set allowed_signers_file"
            ),
            "{err}"
        );
        let (err, _dir) = load("verify = \"all\"\n");
        assert!(
            err.unwrap_err()
                .contains("source.verify: `all` is not one of")
        );
        let (err, _dir) = load("allowed_signers_file = \"allowed_signers\"\n");
        assert!(err.unwrap_err().contains("source.verify: is off"));
        let (err, dir) = load("verify = \"head\"\nallowed_signers_file = \"allowed_signers\"\n");
        let err = err.unwrap_err();
        let located = format!(
            "source.allowed_signers_file: {}:2: time `2027` has no `Z`",
            dir.path().join("allowed_signers").display()
        );
        assert!(err.contains(&located), "{err}");
        let (err, dir) = load("verify = \"head\"\ngpg_keyring_file = \"keys.asc\"\n");
        let err = err.unwrap_err();
        assert!(
            err.contains(&format!(
                "source.gpg_keyring_file: {}: cannot be read",
                dir.path().join("keys.asc").display()
            )),
            "{err}"
        );
    }

    #[test]
    fn an_ssh_source_with_known_hosts_gets_strict_host_key_checking_against_that_file() {
        let (dir, path) = write_config(
            "node = \"pve1\"\n[pve]\ntoken_id = \"root@pam!x\"\ninsecure = true\n\
             token_secret_file = \"t\"\n[source]\nurl = \"ssh://git@git.example.org/ops.git\"\n\
             known_hosts_file = \"forge_known_hosts\"\n",
        );
        std::fs::write(dir.path().join("t"), "x").unwrap();
        let err = AgentConfig::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("forge_known_hosts is not a file; an ssh source needs"),
            "{err}"
        );
        std::fs::write(
            dir.path().join("forge_known_hosts"),
            "git.example.org ssh-ed25519 A\n",
        )
        .unwrap();
        let config = AgentConfig::load(&path).unwrap();
        assert_eq!(
            config.source.unwrap().known_hosts_file,
            Some(dir.path().join("forge_known_hosts"))
        );

        let (dir, path) = write_config(
            "node = \"pve1\"\n[pve]\ntoken_id = \"root@pam!x\"\ninsecure = true\n\
             token_secret_file = \"t\"\n[source]\nurl = \"https://git.example.org/ops.git\"\n\
             known_hosts_file = \"forge_known_hosts\"\n",
        );
        std::fs::write(dir.path().join("t"), "x").unwrap();
        let err = AgentConfig::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("source.known_hosts_file: only an ssh source uses it"),
            "{err}"
        );
    }

    #[test]
    fn without_ca_settings_the_cluster_ca_credential_is_trusted_unless_blank() {
        let (dir, path) = write_config(
            "node = \"pve1\"\n[pve]\ntoken_id = \"root@pam!x\"\ntoken_secret_file = \"t\"\n",
        );
        std::fs::write(dir.path().join("t"), "x").unwrap();
        let credentials = dir.path().join("credentials");
        std::fs::create_dir(&credentials).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            credentials.join(CA_CREDENTIAL),
            "-----BEGIN CERTIFICATE-----\n",
        )
        .unwrap();
        let config =
            AgentConfig::from_toml_with_credentials(&path, &text, Some(&credentials)).unwrap();
        assert_eq!(
            config.pve.trust,
            Trust::CaFile(credentials.join(CA_CREDENTIAL))
        );
        // The unit's blank fallback: the default file, or the error that asks for a setting.
        std::fs::write(credentials.join(CA_CREDENTIAL), "\n").unwrap();
        let fallback = AgentConfig::from_toml_with_credentials(&path, &text, Some(&credentials));
        match fallback {
            Ok(config) => assert_eq!(
                config.pve.trust,
                Trust::CaFile(PathBuf::from(DEFAULT_CA_FILE))
            ),
            Err(err) => assert!(
                err.to_string()
                    .contains("no way to trust PVE's certificate"),
                "{err}"
            ),
        }
    }

    #[test]
    fn without_a_credentials_directory_relative_secret_files_are_beside_the_config() {
        let (dir, path) = write_config(
            "node = \"pve1\"\n[pve]\ntoken_id = \"root@pam!x\"\ntoken_secret_file = \"pve-token-secret\"\ninsecure = true\n",
        );
        std::fs::write(dir.path().join("pve-token-secret"), "beside-config").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let config = AgentConfig::from_toml_with_credentials(&path, &text, None).unwrap();
        use secrecy::ExposeSecret;
        assert_eq!(config.pve.token_secret.expose_secret(), "beside-config");
        // A credentials directory without that credential changes nothing.
        let empty = tempfile::tempdir().unwrap();
        let config =
            AgentConfig::from_toml_with_credentials(&path, &text, Some(empty.path())).unwrap();
        assert_eq!(config.pve.token_secret.expose_secret(), "beside-config");
    }

    #[test]
    fn absolute_secret_paths_ignore_the_credentials_directory() {
        let credentials = tempfile::tempdir().unwrap();
        std::fs::write(credentials.path().join("token"), "shadow").unwrap();
        let config_dir = Path::new("/etc/proxops");
        assert_eq!(
            resolve_file(
                config_dir,
                Some(credentials.path()),
                Path::new("/srv/token")
            ),
            PathBuf::from("/srv/token")
        );
        assert_eq!(
            resolve_file(config_dir, Some(credentials.path()), Path::new("token")),
            credentials.path().join("token")
        );
        assert_eq!(
            resolve_file(config_dir, Some(credentials.path()), Path::new("other")),
            PathBuf::from("/etc/proxops/other")
        );
    }

    #[test]
    fn two_trust_settings_are_refused() {
        let (_dir, path) = write_config(
            "node = \"pve1\"\n[pve]\ntoken_id = \"root@pam!x\"\ntoken_secret_file = \"token\"\nca_file = \"/x\"\ninsecure = true\n",
        );
        let err = AgentConfig::load(&path).unwrap_err().to_string();
        assert!(
            err.ends_with("pve: set only one of ca_file, fingerprint and insecure"),
            "{err}"
        );
    }

    #[test]
    fn backup_before_delete_names_a_storage_and_defaults_to_snapshot_mode() {
        let load = |policy: &str| {
            let (_dir, path) = write_config(&format!(
                "node = \"a\"\n[policy]\n{policy}\n[pve]\ntoken_id = \"root@pam!x\"\ntoken_secret_file = \"token\"\ninsecure = true\n"
            ));
            AgentConfig::load(&path).map_err(|e| e.to_string())
        };
        assert_eq!(load("prune = true").unwrap().policy.backup, None);
        let on = load("backup_before_delete = \"nas-backup\"").unwrap();
        assert_eq!(
            on.policy.backup,
            Some(crate::execute::BackupPolicy {
                storage: "nas-backup".to_owned(),
                mode: proxops_pve::backup::BackupMode::Snapshot,
            })
        );
        let stop = load("backup_before_delete = \"local\"\nbackup_mode = \"stop\"").unwrap();
        assert_eq!(
            stop.policy.backup.map(|b| b.mode),
            Some(proxops_pve::backup::BackupMode::Stop)
        );
        for (policy, expected) in [
            (
                "backup_before_delete = \"local\"\nbackup_mode = \"live\"",
                "policy.backup_mode: `live`: write \"snapshot\", \"suspend\" or \"stop\"",
            ),
            (
                "backup_mode = \"stop\"",
                "policy.backup_mode: is set but policy.backup_before_delete is not",
            ),
            (
                "backup_before_delete = \"local backup\"",
                "policy.backup_before_delete: `local backup` is not a PVE storage id",
            ),
        ] {
            let err = load(policy).unwrap_err();
            assert!(err.contains(expected), "{policy}: {err}");
        }
    }

    #[test]
    fn bad_values_are_named_by_key() {
        for (body, expected) in [
            ("node = \"pve_1\"", "node: `pve_1` is not a PVE node name"),
            (
                "node = \"a\"\n[source]\nurl = \"file:///r\"\npoll = \"soon\"",
                "source.poll:",
            ),
            ("node = \"a\"\n[http]\nlisten = \"nowhere\"", "http.listen:"),
            (
                "node = \"a\"\n[policy]\nmode = \"yolo\"",
                "unknown variant `yolo`",
            ),
        ] {
            let (_dir, path) = write_config(&format!(
                "{body}\n[pve]\ntoken_id = \"root@pam!x\"\ntoken_secret_file = \"token\"\n"
            ));
            let err = AgentConfig::load(&path).unwrap_err().to_string();
            assert!(err.contains(expected), "{body}: {err}");
        }
    }

    const PVE: &str = "[pve]\ntoken_id = \"root@pam!x\"\ntoken_secret_file = \"token\"\n";

    #[test]
    fn read_concurrency_is_taken_from_the_pve_section_and_bounded() {
        let config = load_with(&format!("{PVE}insecure = true\nread_concurrency = 3\n")).unwrap();
        assert_eq!(config.pve.read_concurrency, 3);
        for bad in [0, MAX_READ_CONCURRENCY + 1] {
            let err = load_with(&format!("{PVE}insecure = true\nread_concurrency = {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(
                err.ends_with(&format!(
                    "pve.read_concurrency: {bad}: must be between 1 and {MAX_READ_CONCURRENCY}"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn approve_takes_its_three_words_with_max_changes_and_an_unknown_word_is_located() {
        let config = load_with(&format!("{PVE}insecure = true\n")).unwrap();
        assert!(config.policy.approve.when.is_empty());
        assert_eq!(
            config.policy.approve.max_changes,
            crate::agent::approval::DEFAULT_MAX_CHANGES
        );
        let config = load_with(&format!(
            "{PVE}insecure = true\n[policy]\napprove = [\"bulk\", \"destructive\", \"risky\"]\nmax_changes = 5\n"
        ))
        .unwrap();
        use crate::agent::approval::ApproveWhen;
        assert_eq!(
            config.policy.approve.when.into_iter().collect::<Vec<_>>(),
            [
                ApproveWhen::Destructive,
                ApproveWhen::Risky,
                ApproveWhen::Bulk
            ]
        );
        assert_eq!(config.policy.approve.max_changes, 5);
        let err = load_with(&format!(
            "{PVE}insecure = true\n[policy]\napprove = [\"destructve\"]\n"
        ))
        .unwrap_err()
        .to_string();
        // The file, the line and column, the word and the words it may be.
        assert!(err.contains("agent.toml:7:"), "{err}");
        assert!(err.contains("unknown variant `destructve`"), "{err}");
        assert!(err.contains("`destructive`, `risky`, `bulk`"), "{err}");
    }

    fn load_with(body: &str) -> Result<AgentConfig, ConfigError> {
        let (_dir, path) = write_config(&format!("node = \"pve1\"\n{body}"));
        AgentConfig::load(&path)
    }

    #[test]
    fn a_plain_http_pve_url_is_refused_unless_allowed_and_then_takes_no_trust_setting() {
        let err = load_with(&format!(
            "{PVE}url = \"http://10.0.0.1:8006\"\ninsecure = true\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("pve.url: `http://10.0.0.1:8006` is plain http"),
            "{err}"
        );
        assert!(err.contains("allow_plain_http = true"), "{err}");
        let config = load_with(&format!(
            "{PVE}url = \"HTTP://127.0.0.1:8006\"\nallow_plain_http = true\n"
        ))
        .unwrap();
        assert!(config.pve.plain_http);
        let err = load_with(&format!(
            "{PVE}url = \"http://127.0.0.1:8006\"\nallow_plain_http = true\nfingerprint = \"{}\"\n",
            ["AB"; 32].join(":")
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("ca_file and fingerprint would check nothing"),
            "{err}"
        );
        let https = load_with(&format!("{PVE}insecure = true\nallow_plain_http = true\n")).unwrap();
        assert!(!https.pve.plain_http);
    }

    #[test]
    fn allowed_hosts_default_to_loopback_and_the_listen_address() {
        let config = load_with(&format!(
            "[http]\nlisten = \"10.0.0.5:9494\"\n{PVE}insecure = true\n"
        ))
        .unwrap();
        assert_eq!(
            config.http.allowed_hosts,
            ["localhost", "127.0.0.1", "[::1]", "10.0.0.5"]
        );
        let config = load_with(&format!(
            "[http]\nlisten = \"0.0.0.0:9494\"\n{PVE}insecure = true\n"
        ))
        .unwrap();
        assert_eq!(
            config.http.allowed_hosts,
            ["localhost", "127.0.0.1", "[::1]"]
        );
        let config = load_with(&format!(
            "[http]\nallowed_hosts = [\"PVE1.example.org\", \"[fd00::5]\"]\n{PVE}insecure = true\n"
        ))
        .unwrap();
        assert_eq!(config.http.allowed_hosts, ["pve1.example.org", "[fd00::5]"]);
        let err = load_with(&format!(
            "[http]\nallowed_hosts = [\"pve1.example.org:9494\"]\n{PVE}insecure = true\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("http.allowed_hosts: `pve1.example.org:9494` is not a host name"),
            "{err}"
        );
    }

    #[test]
    fn cluster_mode_is_off_without_a_pmxcfs_table_and_a_bad_key_in_it_is_named() {
        let off = load_with(&format!("{PVE}insecure = true\n")).unwrap();
        assert_eq!(off.pmxcfs, None);
        let on = load_with(&format!("{PVE}insecure = true\n[pmxcfs]\n")).unwrap();
        let pmxcfs = on.pmxcfs.unwrap();
        assert!(pmxcfs.publish);
        assert_eq!(pmxcfs.dir, std::path::Path::new("/etc/pve/proxops"));
        let err = load_with(&format!(
            "{PVE}insecure = true\n[pmxcfs]\nheartbeat = \"soon\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("pmxcfs.heartbeat: `soon`"), "{err}");
        let err = load_with(&format!(
            "{PVE}insecure = true\n[pmxcfs]\nlockdir = \"/x\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("lockdir"), "{err}");
    }

    #[test]
    fn a_commit_url_template_needs_an_http_scheme_and_the_sha_placeholder() {
        let config = load_with(&format!(
            "[http]\ncommit_url = \"https://forge.example.org/o/r/commit/{{sha}}\"\n{PVE}insecure = true\n"
        ))
        .unwrap();
        assert_eq!(
            config.http.commit_url.as_deref(),
            Some("https://forge.example.org/o/r/commit/{sha}")
        );
        let err = load_with(&format!(
            "[http]\ncommit_url = \"https://forge.example.org/o/r/commit/\"\n{PVE}insecure = true\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("http.commit_url: `https://forge.example.org/o/r/commit/` is not an http(s) URL with `{sha}`"),
            "{err}"
        );
        let err = load_with(&format!(
            "[http]\ncommit_url = \"javascript:alert({{sha}})\"\n{PVE}insecure = true\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("http.commit_url"), "{err}");
    }

    #[test]
    fn the_webhook_listener_and_the_http_token_are_read() {
        let (dir, path) = write_config(&format!(
            "node = \"pve1\"\n[webhook]\nsecret_file = \"hook\"\nlisten = \"0.0.0.0:9495\"\n[http]\ntoken_file = \"api-token\"\n{PVE}insecure = true\n"
        ));
        std::fs::write(dir.path().join("api-token"), "api-secret-token\n").unwrap();
        let config = AgentConfig::load(&path).unwrap();
        assert_eq!(
            config.webhook.unwrap().listen,
            Some("0.0.0.0:9495".parse().unwrap())
        );
        use secrecy::ExposeSecret;
        assert_eq!(
            config.http.token.unwrap().expose_secret(),
            "api-secret-token"
        );
        let err = load_with(&format!(
            "[webhook]\nsecret_file = \"hook\"\nlisten = \"127.0.0.1:9494\"\n{PVE}insecure = true\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("webhook.listen: `127.0.0.1:9494` is [http] listen too"),
            "{err}"
        );
        let err = load_with(&format!(
            "[webhook]\nsecret_file = \"hook\"\nlisten = \"forge-side\"\n{PVE}insecure = true\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("webhook.listen: `forge-side` is not an address"),
            "{err}"
        );
    }

    #[test]
    fn a_secret_file_readable_by_others_is_recognised_by_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "x").unwrap();
        for (mode, flagged) in [
            (0o600, None),
            (0o400, None),
            (0o640, Some(0o640)),
            (0o644, Some(0o644)),
        ] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(readable_by_others(&file), flagged, "{mode:o}");
        }
    }
}
