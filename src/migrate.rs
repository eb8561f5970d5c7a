//! `proxops migrate-config`: the Go ProxOps's YAML configuration (`proxops.yaml`,
//! `clusters/<c>/config.yaml`, the `PROXOPS_*` environment) → an `agent.toml`, with every
//! secret moved to a file of its own (mode 0600) that the TOML names by path.
//!
//! Pure apart from [`discover`] (which lists a repository's config files) and
//! [`write_secret`]: [`migrate`] takes the file texts and the environment and returns the TOML
//! text, the secrets to write and a summary of what was mapped and what needs attention.
//! Secret values are only ever held in `SecretString`s; nothing here formats one.
//!
//! Mapping (original-proxops.md §4 → DESIGN.md §5):
//!
//! | Go key / variable | agent.toml |
//! |---|---|
//! | `pve.clusters.<c>` (the name) | `cluster` |
//! | `pve.clusters.<c>.base-url` | `[pve] url` |
//! | `pve.clusters.<c>.nodes` | `node` (one node; several → `"*"` with a note) |
//! | `pve.token-value`, `PROXOPS_PVE_TOKEN_VALUE` | `[pve] token_id` + `token_secret_file` |
//! | `pve.user` / `PROXOPS_PVE_USER` + `pve.token-id` | `[pve] token_id` (`user@realm!id`) |
//! | `pve.token`, `PROXOPS_PVE_TOKEN` | `<secrets-dir>/pve-token-secret` |
//! | `pve.ca-file` | `[pve] ca_file` |
//! | `git.url`, `git.branch` | `[source] url`, `branch` |
//! | `git.path` (local mode) | `[source] url = "file://…"` |
//! | `git.token`, `PROXOPS_GIT_TOKEN` | `<secrets-dir>/git-token` → `[source] token_file` |
//! | `reconcile.poll-interval` | `[source] poll` |
//! | `reconcile.task-timeout` | `[policy] task_timeout` |
//! | `reconcile.prune-budget` | `[policy] max_prune` (prune itself is off by default) |
//! | `listen` | `[http] listen` |
//! | `pve.auth: ticket`, `pve.password`, `PROXOPS_PVE_PASSWORD` | error: API tokens only |
//! | `secrets-file`, `secrets.*` (SOPS) | note: `[secrets] age_key_file` comes with SOPS support |
//! | `data-dir`, `log.level` | notes (`state_dir`; `-v`/`RUST_LOG`) |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

/// The file name of the PVE token secret in the secrets directory.
pub const PVE_SECRET_FILE: &str = "pve-token-secret";
/// The file name of the git token in the secrets directory.
pub const GIT_TOKEN_FILE: &str = "git-token";

/// The environment variables of the Go program this reads.
pub const ENV_VARS: &[&str] = &[
    "PROXOPS_PVE_USER",
    "PROXOPS_PVE_TOKEN",
    "PROXOPS_PVE_TOKEN_VALUE",
    "PROXOPS_PVE_PASSWORD",
    "PROXOPS_GIT_TOKEN",
    "PROXOPS_CONFIG",
    "PROXOPS_GIT_PATH",
];

/// Migration failed outright (as opposed to a problem reported in the summary).
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// A file could not be read or written.
    #[error("{}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file is not YAML (the parser's message; it never quotes values).
    #[error("{}: not valid YAML: {message}", .path.display())]
    Yaml {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// No configuration was found.
    #[error("no Go ProxOps configuration found in {} (looked for proxops.yaml and clusters/*/config.yaml)", .0.display())]
    NothingFound(PathBuf),
    /// Several clusters and none chosen.
    #[error("the configuration has several clusters ({}); an agent follows one: choose it with --cluster", .0.join(", "))]
    ClusterNotChosen(Vec<String>),
    /// The chosen cluster is not configured.
    #[error("cluster `{0}` is not in the configuration")]
    NoSuchCluster(String),
}

/// How much a summary line matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// A key mapped one to one.
    Mapped,
    /// Worth knowing; nothing to do.
    Note,
    /// Behaves differently or was not migrated: look at it.
    Warning,
    /// The agent.toml will not work as is.
    Error,
}

/// One line of the summary.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Line {
    /// How much it matters.
    pub level: Level,
    /// What happened, naming the Go key.
    pub text: String,
}

/// A secret to write to `<secrets-dir>/<name>`.
#[derive(Debug, Clone)]
pub struct Secret {
    /// `pve-token-secret` or `git-token`.
    pub name: &'static str,
    /// Where the Go program had it (key or variable), for the summary.
    pub from: String,
    /// The value.
    pub value: SecretString,
}

/// The outcome of a migration.
#[derive(Debug, Clone)]
pub struct Migration {
    /// The agent.toml text.
    pub toml: String,
    /// Secrets the TOML names by path; the caller writes them.
    pub secrets: Vec<Secret>,
    /// What was mapped and what needs attention, in order.
    pub summary: Vec<Line>,
}

impl Migration {
    /// True when a line is an error.
    pub fn has_errors(&self) -> bool {
        self.summary.iter().any(|l| l.level == Level::Error)
    }
}

/// One Go config file: where it is and its text.
#[derive(Debug, Clone)]
pub struct Source {
    /// The file (for messages, relative `git.path` and the key == dir rule).
    pub path: PathBuf,
    /// Its YAML text.
    pub text: String,
}

/// What to migrate with.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The directory the secret files go to (as the TOML should name it).
    pub secrets_dir: PathBuf,
    /// The cluster to migrate when several are configured.
    pub cluster: Option<String>,
    /// The repository root, when discovered with `--repo` (local mode source).
    pub repo: Option<PathBuf>,
    /// Name the secret files by bare name (`pve-token-secret`) rather than by path: they sit
    /// beside agent.toml, and the packaged unit passes them as systemd credentials of that
    /// name (`LoadCredential=`), which `AgentConfig` looks up first.
    pub relative: bool,
}

/// The config files of a repository, as the Go program reads them: `proxops.yaml`, then
/// every `clusters/*/config.yaml` in name order.
///
/// # Errors
/// Unreadable directories or files; nothing found.
pub fn discover(repo: &Path) -> Result<Vec<Source>, MigrateError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| MigrateError::Io { path, source }
    };
    let mut paths = Vec::new();
    let top = repo.join("proxops.yaml");
    if top.is_file() {
        paths.push(top);
    }
    let clusters = repo.join("clusters");
    if clusters.is_dir() {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&clusters)
            .map_err(io(&clusters))?
            .filter_map(Result::ok)
            .map(|e| e.path().join("config.yaml"))
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        paths.extend(found);
    }
    if paths.is_empty() {
        return Err(MigrateError::NothingFound(repo.to_path_buf()));
    }
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).map_err(io(&path))?;
            Ok(Source { path, text })
        })
        .collect()
}

/// Writes a secret to `dir/name` with mode 0600 (the directory is created, mode 0700).
///
/// # Errors
/// IO errors, naming the file (never the value).
pub fn write_secret(dir: &Path, secret: &Secret) -> Result<PathBuf, MigrateError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let path = dir.join(secret.name);
    let err = |source| MigrateError::Io {
        path: path.clone(),
        source,
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| MigrateError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(err)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(err)?;
    file.write_all(secret.value.expose_secret().as_bytes())
        .and_then(|()| file.write_all(b"\n"))
        .map_err(err)?;
    Ok(path)
}

/// The Go keys this knows, as dotted paths (`*` = a cluster name).
const KNOWN: &[&str] = &[
    "log",
    "log.level",
    "pve",
    "pve.auth",
    "pve.user",
    "pve.token-id",
    "pve.token",
    "pve.token-value",
    "pve.password",
    "pve.ca-file",
    "pve.clusters",
    "pve.clusters.*",
    "pve.clusters.*.base-url",
    "pve.clusters.*.nodes",
    "pve.clusters.*.secrets-file",
    "pve.clusters.*.secrets",
    "pve.clusters.*.secrets.pve",
    "pve.clusters.*.secrets.pve.user",
    "pve.clusters.*.secrets.pve.token-id",
    "pve.clusters.*.secrets.pve.token",
    "pve.clusters.*.secrets.pve.password",
    "pve.clusters.*.secrets.git",
    "pve.clusters.*.secrets.git.token",
    "git",
    "git.url",
    "git.branch",
    "git.token",
    "git.path",
    "reconcile",
    "reconcile.poll-interval",
    "reconcile.task-timeout",
    "reconcile.prune-budget",
    "listen",
    "data-dir",
];

fn is_known(path: &[String]) -> bool {
    KNOWN.iter().any(|k| {
        let parts: Vec<&str> = k.split('.').collect();
        parts.len() == path.len()
            && parts
                .iter()
                .zip(path)
                .enumerate()
                .all(|(i, (p, q))| *p == q || (*p == "*" && i == 2))
    })
}

/// Deep-merges `from` into `into`: keys already set in `into` win (the operator's file over
/// `proxops.yaml`); clusters are added.
fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (slot @ Value::Null, v) => *slot = v.clone(),
        _ => {}
    }
}

fn unknown_keys(value: &Value, path: &mut Vec<String>, out: &mut Vec<String>) {
    let Value::Object(map) = value else { return };
    for (k, v) in map {
        path.push(k.clone());
        if is_known(path) {
            // `secrets` maps and node lists hold data, not keys.
            unknown_keys(v, path, out);
        } else {
            out.push(path.join("."));
        }
        path.pop();
    }
}

fn get<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, k| v.get(k))
}

fn text(value: &Value, path: &str) -> Option<String> {
    match get(value, path)? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn quote(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// Migrates the Go configuration in `sources` (later files are the operator's: their keys win
/// over earlier ones, as a cluster-local config wins over `proxops.yaml`) with the `PROXOPS_*`
/// variables in `env`.
///
/// # Errors
/// YAML that does not parse; several clusters and none chosen; an unknown chosen cluster.
pub fn migrate(
    sources: &[Source],
    env: &BTreeMap<String, String>,
    options: &Options,
) -> Result<Migration, MigrateError> {
    let mut summary = Vec::new();
    let mut say = |level: Level, text: String| summary.push(Line { level, text });
    let mut merged = Value::Null;
    let mut config_dir: Option<PathBuf> = None;
    for source in sources.iter().rev() {
        let value: Value = if source.text.trim().is_empty() {
            Value::Object(serde_json::Map::new())
        } else {
            serde_saphyr::from_str(&source.text).map_err(|e| MigrateError::Yaml {
                path: source.path.clone(),
                message: e.to_string().lines().next().unwrap_or_default().to_owned(),
            })?
        };
        let mut unknown = Vec::new();
        unknown_keys(&value, &mut Vec::new(), &mut unknown);
        for key in unknown {
            say(
                Level::Warning,
                format!(
                    "{}: unknown key `{key}` is not migrated (the Go program ignored it too)",
                    source.path.display()
                ),
            );
        }
        // clusters/<dir>/config.yaml must name pve.clusters.<dir>.
        if source.path.file_name().is_some_and(|n| n == "config.yaml")
            && let Some(dir) = source
                .path
                .parent()
                .and_then(Path::file_name)
                .and_then(|d| d.to_str())
            && source
                .path
                .parent()
                .and_then(Path::parent)
                .and_then(Path::file_name)
                .is_some_and(|d| d == "clusters")
            && get(&value, &format!("pve.clusters.{dir}")).is_none()
        {
            say(
                Level::Warning,
                format!(
                    "{}: does not name pve.clusters.{dir} (the Go program refused this file: key == dir)",
                    source.path.display()
                ),
            );
        }
        if config_dir.is_none() {
            config_dir = source.path.parent().map(Path::to_path_buf);
        }
        merge(&mut merged, &value);
    }
    let root = merged;
    let env_get = |name: &str| env.get(name).filter(|v| !v.is_empty()).cloned();

    // Cluster.
    let clusters: Vec<String> = get(&root, "pve.clusters")
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let cluster = match (&options.cluster, clusters.as_slice()) {
        (Some(c), _) if clusters.contains(c) => Some(c.clone()),
        (Some(c), _) => return Err(MigrateError::NoSuchCluster(c.clone())),
        (None, []) => None,
        (None, [only]) => Some(only.clone()),
        (None, _) => return Err(MigrateError::ClusterNotChosen(clusters)),
    };
    if clusters.len() > 1
        && let Some(c) = &cluster
    {
        say(
            Level::Note,
            format!(
                "migrated cluster `{c}` only; an agent follows one cluster: run migrate-config \
                 again with --cluster for each of {}",
                clusters.join(", ")
            ),
        );
    }
    let cl = |key: &str| {
        cluster
            .as_ref()
            .and_then(|c| get(&root, &format!("pve.clusters.{c}.{key}")))
    };

    let mut top = Vec::new();
    let mut pve = Vec::new();
    let mut source = Vec::new();
    let mut http = Vec::new();
    let mut policy = Vec::new();
    let mut secrets = Vec::new();

    // node / cluster
    let nodes: Vec<String> = cl("nodes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    match nodes.as_slice() {
        [] => say(
            Level::Note,
            "no `nodes` allowlist: `node` is left out, so the agent speaks for the host it runs \
             on (set `node = \"*\"` for one agent for the whole cluster)"
                .to_owned(),
        ),
        [one] => {
            top.push(format!("node = {}", quote(one)));
            say(
                Level::Mapped,
                format!("pve.clusters.*.nodes [{one}] → node = \"{one}\""),
            );
        }
        many => {
            top.push("node = \"*\"".to_owned());
            say(
                Level::Warning,
                format!(
                    "pve.clusters.*.nodes [{}] → node = \"*\": one agent for the whole cluster, \
                     which plans for every node, not only these; alternatively run one agent \
                     per node with node = \"<name>\"",
                    many.join(", ")
                ),
            );
        }
    }
    if let Some(c) = &cluster {
        top.push(format!("cluster = {}", quote(c)));
        say(
            Level::Mapped,
            format!("pve.clusters.{c} → cluster = \"{c}\""),
        );
    }
    if let Some(dir) = text(&root, "data-dir") {
        say(
            Level::Note,
            format!(
                "data-dir `{dir}` held only the Go git cache; ProxOps keeps its state database \
                 and git mirror in state_dir (default /var/lib/proxops), nothing to move"
            ),
        );
    }
    if let Some(level) = text(&root, "log.level") {
        say(
            Level::Note,
            format!(
                "log.level `{level}` has no agent.toml key: use -v/-vv or RUST_LOG=proxops={level}"
            ),
        );
    }

    // [pve]
    if let Some(url) = cl("base-url").and_then(Value::as_str) {
        pve.push(format!("url = {}", quote(url)));
        say(
            Level::Mapped,
            format!("pve.clusters.*.base-url → [pve] url = \"{url}\""),
        );
    } else if cluster.is_some() {
        say(
            Level::Warning,
            "no base-url: [pve] url defaults to https://127.0.0.1:8006 (the local node)".to_owned(),
        );
    }
    let auth = text(&root, "pve.auth").unwrap_or_else(|| "token".to_owned());
    let password =
        text(&root, "pve.password").is_some() || env_get("PROXOPS_PVE_PASSWORD").is_some();
    if auth == "ticket" || password {
        say(
            Level::Error,
            format!(
                "{}: ProxOps authenticates with API tokens only (no tickets, no passwords); \
                 create one with `pveum user token add <user@realm> proxops --privsep 0` and put \
                 its secret in {}/{PVE_SECRET_FILE}; the password is not migrated",
                if auth == "ticket" {
                    "pve.auth: ticket"
                } else {
                    "pve.password / PROXOPS_PVE_PASSWORD"
                },
                options.secrets_dir.display()
            ),
        );
    }
    let token_value = env_get("PROXOPS_PVE_TOKEN_VALUE")
        .map(|v| (v, "PROXOPS_PVE_TOKEN_VALUE"))
        .or_else(|| text(&root, "pve.token-value").map(|v| (v, "pve.token-value")));
    let (token_id, token_secret) = match token_value {
        Some((value, from)) => match value.split_once('=') {
            Some((id, secret)) if !secret.is_empty() => {
                say(
                    Level::Mapped,
                    format!("{from} → [pve] token_id = \"{id}\" and token_secret_file"),
                );
                let pair: Vec<&str> = ["PROXOPS_PVE_USER", "PROXOPS_PVE_TOKEN"]
                    .into_iter()
                    .filter(|v| env_get(v).is_some())
                    .collect();
                if !pair.is_empty() {
                    say(
                        Level::Note,
                        format!(
                            "{} ignored: {from} is set and beats the user/token pair, as in \
                             the Go program",
                            pair.join(" and ")
                        ),
                    );
                }
                (
                    Some(id.to_owned()),
                    Some((secret.to_owned(), from.to_owned())),
                )
            }
            _ => {
                say(
                    Level::Error,
                    format!("{from} is not of the form user@realm!tokenid=secret; ignored"),
                );
                (None, None)
            }
        },
        None => {
            let user = env_get("PROXOPS_PVE_USER")
                .map(|u| (u, "PROXOPS_PVE_USER"))
                .or_else(|| text(&root, "pve.user").map(|u| (u, "pve.user")));
            let id = text(&root, "pve.token-id");
            let id = match (user, id) {
                (_, Some(id)) if id.contains('!') => {
                    say(
                        Level::Mapped,
                        format!("pve.token-id → [pve] token_id = \"{id}\""),
                    );
                    Some(id)
                }
                (Some((user, from)), Some(id)) => {
                    let full = format!("{user}!{id}");
                    say(
                        Level::Mapped,
                        format!("{from} + pve.token-id → [pve] token_id = \"{full}\""),
                    );
                    Some(full)
                }
                (None, Some(id)) => {
                    say(
                        Level::Error,
                        format!(
                            "pve.token-id `{id}` without pve.user / PROXOPS_PVE_USER: set \
                             [pve] token_id = \"<user@realm>!{id}\" by hand"
                        ),
                    );
                    None
                }
                (Some((user, _)), None) => {
                    if auth != "ticket" {
                        say(
                            Level::Error,
                            format!(
                                "pve.user `{user}` but no token id: set [pve] token_id = \
                                 \"{user}!<tokenid>\" by hand"
                            ),
                        );
                    }
                    None
                }
                (None, None) => None,
            };
            let secret = env_get("PROXOPS_PVE_TOKEN")
                .map(|s| (s, "PROXOPS_PVE_TOKEN".to_owned()))
                .or_else(|| text(&root, "pve.token").map(|s| (s, "pve.token".to_owned())));
            (id, secret)
        }
    };
    let sops = cl("secrets-file")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let sops_refs = cl("secrets").is_some();
    if let Some(id) = &token_id {
        pve.push(format!("token_id = {}", quote(id)));
    } else if !sops_refs {
        say(
            Level::Error,
            "no API token id found (pve.token-value, PROXOPS_PVE_TOKEN_VALUE, pve.user + \
             pve.token-id): set [pve] token_id by hand"
                .to_owned(),
        );
    }
    let pve_secret_path = options.secrets_dir.join(PVE_SECRET_FILE);
    let named = |name: &str| {
        if options.relative {
            name.to_owned()
        } else {
            options
                .secrets_dir
                .join(name)
                .to_string_lossy()
                .into_owned()
        }
    };
    pve.push(format!(
        "token_secret_file = {}",
        quote(&named(PVE_SECRET_FILE))
    ));
    match token_secret {
        Some((value, from)) => {
            say(
                Level::Mapped,
                format!("{from} → {} (mode 0600)", pve_secret_path.display()),
            );
            secrets.push(Secret {
                name: PVE_SECRET_FILE,
                from,
                value: SecretString::from(value),
            });
        }
        None if !sops_refs => say(
            Level::Error,
            format!(
                "no token secret found (pve.token, PROXOPS_PVE_TOKEN, PROXOPS_PVE_TOKEN_VALUE): \
                 write it to {} (mode 0600)",
                pve_secret_path.display()
            ),
        ),
        None => {}
    }
    if let Some(file) = &sops {
        say(
            Level::Warning,
            format!(
                "pve.clusters.*.secrets-file `{file}` (SOPS/age): not decrypted here; `[secrets] \
                 age_key_file` arrives with SOPS support. Until then write the token secret to \
                 {} (e.g. `sops -d --extract '[\"secrets\"][\"<key>\"]' {file}`){}",
                pve_secret_path.display(),
                if sops_refs {
                    " and set [pve] token_id from the secrets.pve.user/token-id values"
                } else {
                    ""
                }
            ),
        );
    } else if sops_refs {
        say(
            Level::Warning,
            "pve.clusters.*.secrets references without secrets-file: nothing to resolve them \
             from; set [pve] token_id and the secret file by hand"
                .to_owned(),
        );
    }
    match text(&root, "pve.ca-file") {
        Some(ca) => {
            pve.push(format!("ca_file = {}", quote(&ca)));
            say(
                Level::Mapped,
                format!("pve.ca-file → [pve] ca_file = \"{ca}\""),
            );
        }
        None => say(
            Level::Note,
            "no pve.ca-file: the Go program used the system trust store; ProxOps trusts \
             /etc/pve/pve-root-ca.pem (present on every PVE node) by default; off a PVE node set \
             [pve] ca_file or fingerprint"
                .to_owned(),
        ),
    }

    // [source]
    let git_url = text(&root, "git.url");
    let git_path = text(&root, "git.path");
    let source_url = match (&git_url, &git_path) {
        (Some(url), path) => {
            say(Level::Mapped, format!("git.url → [source] url = \"{url}\""));
            if path.is_some() {
                say(
                    Level::Warning,
                    "git.path is ignored next to git.url (the Go program refused both)".to_owned(),
                );
            }
            Some(url.clone())
        }
        (None, Some(path)) => {
            let resolved = resolve_local(path, config_dir.as_deref());
            let url = format!("file://{}", resolved.display());
            say(
                Level::Mapped,
                format!("git.path `{path}` → [source] url = \"{url}\""),
            );
            say(
                Level::Warning,
                "local mode: ProxOps reads committed revisions of the branch, not the work tree; \
                 uncommitted edits are no longer applied, and the work tree is never reset"
                    .to_owned(),
            );
            Some(url)
        }
        (None, None) => options.repo.as_ref().map(|repo| {
            let url = format!("file://{}", repo.display());
            say(
                Level::Mapped,
                format!("the discovered repository → [source] url = \"{url}\""),
            );
            url
        }),
    };
    if let Some(url) = &source_url {
        source.push(format!("url = {}", quote(url)));
    }
    if let Some(branch) = text(&root, "git.branch")
        && source_url.is_some()
    {
        source.push(format!("branch = {}", quote(&branch)));
        say(
            Level::Mapped,
            format!("git.branch → [source] branch = \"{branch}\""),
        );
    }
    if let Some(poll) = text(&root, "reconcile.poll-interval") {
        match humantime::parse_duration(&poll) {
            Ok(d) if d.as_secs() >= 1 && source_url.is_some() => {
                source.push(format!("poll = {}", quote(&poll)));
                say(
                    Level::Mapped,
                    format!("reconcile.poll-interval → [source] poll = \"{poll}\""),
                );
            }
            Ok(_) if source_url.is_none() => say(
                Level::Warning,
                format!("reconcile.poll-interval `{poll}` not migrated: no git source"),
            ),
            _ => say(
                Level::Warning,
                format!(
                    "reconcile.poll-interval `{poll}` is not an interval of 1s or more; the \
                     default 60s applies"
                ),
            ),
        }
    }
    let git_token = env_get("PROXOPS_GIT_TOKEN")
        .map(|t| (t, "PROXOPS_GIT_TOKEN"))
        .or_else(|| text(&root, "git.token").map(|t| (t, "git.token")));
    if let Some((value, from)) = git_token {
        let path = options.secrets_dir.join(GIT_TOKEN_FILE);
        if source_url.is_some() {
            source.push(format!("token_file = {}", quote(&named(GIT_TOKEN_FILE))));
        }
        if options.relative {
            say(
                Level::Warning,
                format!(
                    "the packaged proxops-agent.service passes only pve-token-secret, \
                     webhook-secret and age-identity as credentials: add `LoadCredential={GIT_TOKEN_FILE}:{}` \
                     with `systemctl edit proxops-agent`",
                    path.display()
                ),
            );
        }
        say(
            Level::Mapped,
            format!(
                "{from} → {} (mode 0600) → [source] token_file",
                path.display()
            ),
        );
        secrets.push(Secret {
            name: GIT_TOKEN_FILE,
            from: from.to_owned(),
            value: SecretString::from(value),
        });
    }
    if cl("secrets.git.token").is_some() {
        say(
            Level::Warning,
            format!(
                "pve.clusters.*.secrets.git.token (SOPS): write the git token to {} by hand",
                options.secrets_dir.join(GIT_TOKEN_FILE).display()
            ),
        );
    }

    // [http]
    if let Some(listen) = text(&root, "listen") {
        http.push(format!("listen = {}", quote(&listen)));
        say(
            Level::Mapped,
            format!("listen → [http] listen = \"{listen}\""),
        );
        if !is_loopback_listen(&listen) {
            say(
                Level::Warning,
                format!(
                    "listen `{listen}` is not a loopback address: the status API (guest names, \
                     config values, errors) would answer the network; keep [http] listen on \
                     127.0.0.1:9494 and give webhooks [webhook] listen, or set [http] token_file \
                     and allowed_hosts (docs/operations.md, the listener)"
                ),
            );
        }
    }

    // [policy]
    if let Some(timeout) = text(&root, "reconcile.task-timeout") {
        if humantime::parse_duration(&timeout).is_ok() {
            policy.push(format!("task_timeout = {}", quote(&timeout)));
            say(
                Level::Mapped,
                format!("reconcile.task-timeout → [policy] task_timeout = \"{timeout}\""),
            );
        } else {
            say(
                Level::Warning,
                format!(
                    "reconcile.task-timeout `{timeout}` is not a duration; default 30m applies"
                ),
            );
        }
    }
    let budget = get(&root, "reconcile.prune-budget").and_then(|v| {
        v.as_i64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    });
    policy.push("prune = false".to_owned());
    match budget {
        Some(b) if b > 0 => {
            policy.push(format!("max_prune = {b}"));
            say(
                Level::Mapped,
                format!("reconcile.prune-budget → [policy] max_prune = {b}"),
            );
        }
        Some(b) => {
            policy.push("max_prune = 3".to_owned());
            say(
                Level::Mapped,
                format!(
                    "reconcile.prune-budget {b} → [policy] max_prune = 3 (the Go program reset \
                     values ≤ 0 to 3; ProxOps takes 0 literally)"
                ),
            );
        }
        None => {}
    }
    say(
        Level::Warning,
        "prune is OFF by default in ProxOps; the Go program pruned (deleted tagged guests no \
         manifest declares) by default: if you relied on that, set `prune = true` in [policy]"
            .to_owned(),
    );

    if options.relative {
        say(
            Level::Note,
            format!(
                "secret files are named without a directory: they resolve beside agent.toml \
                 ({}), and under proxops-agent.service from its systemd credentials",
                options.secrets_dir.display()
            ),
        );
    }
    let mut out = String::new();
    out.push_str("# agent.toml written by `proxops migrate-config` from:\n");
    for s in sources {
        out.push_str(&format!("#   {}\n", s.path.display()));
    }
    out.push_str("# Secrets are not in this file: it names the files that hold them.\n");
    for line in &top {
        out.push_str(line);
        out.push('\n');
    }
    for (name, lines) in [
        ("source", &source),
        ("http", &http),
        ("pve", &pve),
        ("policy", &policy),
    ] {
        if lines.is_empty() {
            continue;
        }
        out.push_str(&format!("\n[{name}]\n"));
        for line in lines {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(Migration {
        toml: out,
        secrets,
        summary,
    })
}

/// `git.path` as the Go program resolves it: relative to the config file's directory, and
/// `"."` meaning the nearest ancestor holding `.git`.
fn resolve_local(path: &str, config_dir: Option<&Path>) -> PathBuf {
    let base = config_dir.unwrap_or(Path::new("."));
    let base = std::fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf());
    if path == "." {
        let mut dir = Some(base.as_path());
        while let Some(d) = dir {
            if d.join(".git").exists() {
                return d.to_path_buf();
            }
            dir = d.parent();
        }
        return base;
    }
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// Whether a Go `listen` value (`host:port`, `:port` for every address) stays on loopback.
fn is_loopback_listen(listen: &str) -> bool {
    if let Ok(address) = listen.parse::<std::net::SocketAddr>() {
        return address.ip().is_loopback();
    }
    listen
        .rsplit_once(':')
        .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "6f1e2d3c-0000-4444-8888-abcdefabcdef";
    const GIT_SECRET: &str = "ghp_gitTokenValue123";

    fn fixture(name: &str) -> Source {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/migrate")
            .join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        Source {
            path: PathBuf::from("fixtures").join(name),
            text,
        }
    }

    fn options() -> Options {
        Options {
            secrets_dir: PathBuf::from("/etc/proxops"),
            ..Options::default()
        }
    }

    fn lines(m: &Migration, level: Level) -> Vec<&str> {
        m.summary
            .iter()
            .filter(|l| l.level == level)
            .map(|l| l.text.as_str())
            .collect()
    }

    #[test]
    fn a_full_go_config_becomes_this_agent_toml() {
        let m = migrate(&[fixture("full.yaml")], &BTreeMap::new(), &options()).unwrap();
        insta::assert_snapshot!("full_agent_toml", m.toml);
        assert!(!m.has_errors(), "{:?}", m.summary);
        assert!(!m.toml.contains(SECRET));
        assert!(!m.toml.contains(GIT_SECRET));
        let names: Vec<&str> = m.secrets.iter().map(|s| s.name).collect();
        assert_eq!(names, vec![PVE_SECRET_FILE, GIT_TOKEN_FILE]);
        assert_eq!(m.secrets[0].value.expose_secret(), SECRET);
        let debug = format!("{m:?}");
        assert!(
            !debug.contains(SECRET) && !debug.contains(GIT_SECRET),
            "{debug}"
        );
        let warnings = lines(&m, Level::Warning);
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("unknown key `reconcile.jitter`")),
            "{warnings:?}"
        );
        assert!(warnings.iter().any(|w| w.contains("set `prune = true`")));
        assert!(warnings.iter().any(|w| w.contains("node = \"*\"")));
        let summary = format!("{:?}", m.summary);
        assert!(!summary.contains(SECRET), "{summary}");
    }

    #[test]
    fn environment_variables_win_over_yaml_credentials() {
        let env = BTreeMap::from([
            (
                "PROXOPS_PVE_TOKEN_VALUE".to_owned(),
                "ops@pve!ci=from-env-secret".to_owned(),
            ),
            ("PROXOPS_GIT_TOKEN".to_owned(), "env-git-token".to_owned()),
        ]);
        let m = migrate(&[fixture("full.yaml")], &env, &options()).unwrap();
        assert!(m.toml.contains("token_id = \"ops@pve!ci\""), "{}", m.toml);
        assert_eq!(m.secrets[0].value.expose_secret(), "from-env-secret");
        assert_eq!(m.secrets[0].from, "PROXOPS_PVE_TOKEN_VALUE");
        assert_eq!(m.secrets[1].value.expose_secret(), "env-git-token");

        let env = BTreeMap::from([
            ("PROXOPS_PVE_USER".to_owned(), "auto@pve".to_owned()),
            ("PROXOPS_PVE_TOKEN".to_owned(), "pair-secret".to_owned()),
        ]);
        let m = migrate(&[fixture("pair.yaml")], &env, &options()).unwrap();
        assert!(
            m.toml.contains("token_id = \"auto@pve!agent\""),
            "{}",
            m.toml
        );
        assert_eq!(m.secrets[0].value.expose_secret(), "pair-secret");
        assert!(!m.has_errors(), "{:?}", m.summary);
    }

    #[test]
    fn ticket_auth_is_an_error_and_the_password_is_not_migrated() {
        let m = migrate(&[fixture("ticket.yaml")], &BTreeMap::new(), &options()).unwrap();
        assert!(m.has_errors());
        let errors = lines(&m, Level::Error);
        assert!(errors[0].contains("API tokens only"), "{errors:?}");
        assert!(!m.toml.contains("hunter2"));
        assert!(!format!("{:?}", m.summary).contains("hunter2"));
        assert!(m.secrets.is_empty());
    }

    #[test]
    fn process_and_cluster_files_merge_with_the_cluster_file_winning() {
        let m = migrate(
            &[fixture("proxops.yaml"), fixture("clusters/lab/config.yaml")],
            &BTreeMap::new(),
            &Options {
                repo: Some(PathBuf::from("/srv/ops")),
                ..options()
            },
        )
        .unwrap();
        assert!(m.toml.contains("cluster = \"lab\""), "{}", m.toml);
        assert!(m.toml.contains("node = \"pve2\""), "{}", m.toml);
        // listen from proxops.yaml, poll from the cluster file (it wins).
        assert!(m.toml.contains("listen = \"0.0.0.0:9494\""), "{}", m.toml);
        assert!(m.toml.contains("poll = \"2m\""), "{}", m.toml);
        assert!(m.toml.contains("url = \"file:///srv/ops\""), "{}", m.toml);
        let warnings = lines(&m, Level::Warning);
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("secrets-file `secrets.sops.yaml`")
                    && w.contains("age_key_file")),
            "{warnings:?}"
        );
    }

    #[test]
    fn a_listen_on_every_address_is_mapped_with_a_warning_and_loopback_without() {
        let m = migrate(&[fixture("proxops.yaml")], &BTreeMap::new(), &options()).unwrap();
        assert!(m.toml.contains("listen = \"0.0.0.0:9494\""), "{}", m.toml);
        let warnings = lines(&m, Level::Warning);
        assert!(
            warnings.iter().any(
                |w| w.contains("listen `0.0.0.0:9494` is not a loopback address")
                    && w.contains("[webhook] listen")
            ),
            "{warnings:?}"
        );
        for (listen, loopback) in [
            ("127.0.0.1:9494", true),
            ("[::1]:9494", true),
            ("localhost:9494", true),
            (":9494", false),
            ("10.0.0.5:9494", false),
            ("pve1.example.org:9494", false),
        ] {
            assert_eq!(is_loopback_listen(listen), loopback, "{listen}");
        }
    }

    #[test]
    fn secrets_beside_agent_toml_are_named_by_credential_name() {
        let m = migrate(
            &[fixture("full.yaml")],
            &BTreeMap::new(),
            &Options {
                relative: true,
                ..options()
            },
        )
        .unwrap();
        assert!(
            m.toml
                .contains("token_secret_file = \"pve-token-secret\"\n"),
            "{}",
            m.toml
        );
        assert!(
            m.toml.contains("token_file = \"git-token\"\n"),
            "{}",
            m.toml
        );
        assert!(
            lines(&m, Level::Warning)
                .iter()
                .any(|w| w.contains("LoadCredential=git-token:/etc/proxops/git-token")),
            "{:?}",
            m.summary
        );
    }

    #[test]
    fn several_clusters_need_a_choice() {
        let err = migrate(
            &[fixture("two-clusters.yaml")],
            &BTreeMap::new(),
            &options(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("several clusters (a, b)"), "{err}");
        let m = migrate(
            &[fixture("two-clusters.yaml")],
            &BTreeMap::new(),
            &Options {
                cluster: Some("b".into()),
                ..options()
            },
        )
        .unwrap();
        assert!(
            m.toml.contains("url = \"https://b.example:8006\""),
            "{}",
            m.toml
        );
    }
}
