//! `[forge]` of agent.toml: which forge the followed repository lives on and how the agent
//! writes commit statuses there. Every error names the key (`forge.kind`, …) and what to do;
//! the token read from `token_file` is never echoed.

use std::path::{Path, PathBuf};

use secrecy::SecretString;
use serde::Deserialize;

use crate::config::ConfigError;

/// The default `context`: one status per cluster and node.
pub const DEFAULT_CONTEXT: &str = "proxops/{cluster}/{node}";

/// Which forge API is spoken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForgeKind {
    /// GitHub's REST API (`Authorization: Bearer`).
    GitHub,
    /// Gitea's API v1 (`Authorization: token`).
    Gitea,
    /// Forgejo: Gitea's API v1, same paths and body.
    Forgejo,
}

impl ForgeKind {
    /// The name in agent.toml.
    pub fn as_str(self) -> &'static str {
        match self {
            ForgeKind::GitHub => "github",
            ForgeKind::Gitea => "gitea",
            ForgeKind::Forgejo => "forgejo",
        }
    }
}

/// `[forge]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawForge {
    kind: Option<String>,
    api_url: Option<String>,
    repo: Option<String>,
    token_file: Option<PathBuf>,
    status: Option<bool>,
    preview: Option<bool>,
    public_url: Option<String>,
    context: Option<String>,
    ca_file: Option<PathBuf>,
}

/// `[forge]`, validated.
#[derive(Clone)]
pub struct ForgeConfig {
    /// Which API.
    pub kind: ForgeKind,
    /// The API's base URL (`https://api.github.com`, `https://gitea.example/api/v1`).
    pub api_url: reqwest::Url,
    /// `owner`.
    pub owner: String,
    /// `name`.
    pub name: String,
    /// `token_file`'s content: sent only in the `Authorization` header, only to `api_url`.
    pub token: SecretString,
    /// Whether commit statuses are written.
    pub status: bool,
    /// Whether pull requests into the followed branch get a plan preview (issue 18 item 3).
    pub preview: bool,
    /// The agent UI's base URL, for `target_url`; `None`: statuses carry no link.
    pub public_url: Option<reqwest::Url>,
    /// The status context template (`{cluster}`, `{node}`).
    pub context: String,
    /// Extra CA certificates trusted for `api_url`.
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for ForgeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForgeConfig")
            .field("kind", &self.kind)
            .field("api_url", &self.api_url.as_str())
            .field("repo", &format!("{}/{}", self.owner, self.name))
            .field("token", &"[redacted]")
            .field("status", &self.status)
            .field("preview", &self.preview)
            .field(
                "public_url",
                &self.public_url.as_ref().map(reqwest::Url::as_str),
            )
            .field("context", &self.context)
            .finish()
    }
}

impl ForgeConfig {
    /// The status context of `node` in `cluster`: `{cluster}` is `default` without a
    /// cluster, `{node}` is `all` for a whole-cluster agent (node label `*`).
    pub fn context_for(&self, cluster: Option<&str>, node: &str) -> String {
        let node = if node == "*" { "all" } else { node };
        self.context
            .replace("{cluster}", cluster.unwrap_or("default"))
            .replace("{node}", node)
    }

    /// `{api_url}/repos/{owner}/{name}/statuses/{sha}`.
    pub fn status_url(&self, sha: &str) -> reqwest::Url {
        let mut url = self.api_url.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments
                .pop_if_empty()
                .extend(["repos", &self.owner, &self.name, "statuses", sha]);
        }
        url
    }

    /// `{api_url}/repos/{owner}/{name}/` followed by `segments`.
    pub fn repo_url(&self, segments: &[&str]) -> reqwest::Url {
        let mut url = self.api_url.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty()
                .extend(["repos", &self.owner, &self.name])
                .extend(segments);
        }
        url
    }

    /// `{public_url}/ui/passes/{id}`.
    pub fn pass_url(&self, pass: i64) -> Option<String> {
        let mut url = self.public_url.clone()?;
        if let Ok(mut segments) = url.path_segments_mut() {
            segments
                .pop_if_empty()
                .extend(["ui", "passes", &pass.to_string()]);
        }
        Some(url.to_string())
    }
}

/// What [`parse`] needs from the config loader.
pub struct Loader<'a> {
    /// agent.toml, for messages.
    pub path: &'a Path,
    /// Resolves a `*_file` path (credentials directory, then the config's directory).
    pub resolve: &'a dyn Fn(&Path) -> PathBuf,
    /// Reads a secret file named by `key`.
    pub read_secret: &'a dyn Fn(&str, &Path) -> Result<SecretString, ConfigError>,
}

/// Validates `[forge]`; `None` when the table is absent.
///
/// # Errors
/// A missing or bad key, named `forge.<key>` with what to do.
pub fn parse(
    raw: Option<RawForge>,
    loader: &Loader<'_>,
) -> Result<Option<ForgeConfig>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let invalid = |key: &str, message: String| ConfigError::Invalid {
        path: loader.path.to_path_buf(),
        key: format!("forge.{key}"),
        message,
    };
    let kind = match raw.kind.as_deref() {
        Some("github") => ForgeKind::GitHub,
        Some("gitea") => ForgeKind::Gitea,
        Some("forgejo") => ForgeKind::Forgejo,
        // Verified in Gogs' sources: gogs/gogs @ cf3d55fa, internal/route/api/v1/api.go,
        // RegisterRoutes: the `/repos/:username/:reponame` group has hooks, collaborators,
        // raw, archive, git/trees, forks, branches, commits, keys, issues, labels,
        // milestones, issue-tracker, mirror-sync and editorconfig, and no `statuses`.
        Some("gogs") => {
            return Err(invalid(
                "kind",
                "Gogs has no commit-status API, so the agent cannot report to it; remove \
                 [forge] or move the repository to Gitea or Forgejo"
                    .to_owned(),
            ));
        }
        Some(other) => {
            return Err(invalid(
                "kind",
                format!("`{other}` is not a forge kind; use one of github, gitea, forgejo"),
            ));
        }
        None => {
            return Err(invalid(
                "kind",
                "is missing; set kind = \"github\", \"gitea\" or \"forgejo\"".to_owned(),
            ));
        }
    };
    let api_url = match raw.api_url.as_deref() {
        None => {
            return Err(invalid(
                "api_url",
                format!(
                    "is missing; set the API's base URL, e.g. {}",
                    match kind {
                        ForgeKind::GitHub => "\"https://api.github.com\"",
                        _ => "\"https://gitea.example/api/v1\"",
                    }
                ),
            ));
        }
        Some(text) => http_url(text).map_err(|m| invalid("api_url", m))?,
    };
    let (owner, name) = match raw.repo.as_deref().map(|r| r.split_once('/')) {
        Some(Some((owner, name)))
            if !owner.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            (owner.to_owned(), name.to_owned())
        }
        Some(_) => {
            return Err(invalid(
                "repo",
                "must be \"owner/name\", e.g. \"ops/proxmox\"".to_owned(),
            ));
        }
        None => {
            return Err(invalid(
                "repo",
                "is missing; set repo = \"owner/name\"".to_owned(),
            ));
        }
    };
    let token = match &raw.token_file {
        Some(file) => (loader.read_secret)("forge.token_file", file)?,
        None => {
            return Err(invalid(
                "token_file",
                "is missing; name a file holding a token allowed to write commit statuses"
                    .to_owned(),
            ));
        }
    };
    let public_url = raw
        .public_url
        .as_deref()
        .map(|text| http_url(text).map_err(|m| invalid("public_url", m)))
        .transpose()?;
    let context = raw.context.unwrap_or_else(|| DEFAULT_CONTEXT.to_owned());
    if context.trim().is_empty() {
        return Err(invalid(
            "context",
            format!("must not be empty; leave it out for the default \"{DEFAULT_CONTEXT}\""),
        ));
    }
    Ok(Some(ForgeConfig {
        kind,
        api_url,
        owner,
        name,
        token,
        status: raw.status.unwrap_or(true),
        preview: raw.preview.unwrap_or(false),
        public_url,
        context,
        ca_file: raw.ca_file.as_deref().map(loader.resolve),
    }))
}

fn http_url(text: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(text).map_err(|e| format!("`{text}` is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!(
            "`{text}` must be an http:// or https:// URL with a host"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "must not carry credentials (user:password@); put a token in token_file".to_owned(),
        );
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("`{text}` must have no query or fragment"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(toml_text: &str) -> Result<Option<ForgeConfig>, ConfigError> {
        #[derive(Deserialize)]
        struct Doc {
            forge: Option<RawForge>,
        }
        let doc: Doc = toml::from_str(toml_text).unwrap();
        let path = Path::new("/etc/proxops/agent.toml");
        parse(
            doc.forge,
            &Loader {
                path,
                resolve: &|p: &Path| p.to_path_buf(),
                read_secret: &|_, _| Ok(SecretString::from("s3cr3t-token")),
            },
        )
    }

    fn error_of(toml_text: &str) -> String {
        load(toml_text).unwrap_err().to_string()
    }

    const GOOD: &str = r#"
[forge]
kind = "gitea"
api_url = "https://gitea.example/api/v1"
repo = "ops/proxmox"
token_file = "forge-token"
public_url = "https://proxops.example:9494/"
"#;

    #[test]
    fn a_complete_forge_table_builds_status_and_pass_urls() {
        let forge = load(GOOD).unwrap().unwrap();
        assert_eq!(forge.kind, ForgeKind::Gitea);
        assert!(forge.status);
        assert_eq!(
            forge.status_url("abc123").as_str(),
            "https://gitea.example/api/v1/repos/ops/proxmox/statuses/abc123"
        );
        assert_eq!(
            forge.pass_url(7).as_deref(),
            Some("https://proxops.example:9494/ui/passes/7")
        );
        assert_eq!(forge.context_for(None, "pve1"), "proxops/default/pve1");
        assert_eq!(forge.context_for(Some("lab"), "*"), "proxops/lab/all");
        assert!(!format!("{forge:?}").contains("s3cr3t"));
    }

    #[test]
    fn gogs_is_refused_because_it_has_no_commit_status_api() {
        let error = error_of(&GOOD.replace("\"gitea\"", "\"gogs\""));
        assert!(error.contains("forge.kind"), "{error}");
        assert!(error.contains("Gogs has no commit-status API"), "{error}");
    }

    #[test]
    fn preview_is_off_by_default_and_preview_true_turns_it_on() {
        assert!(!load(GOOD).unwrap().unwrap().preview);
        assert!(
            load(&format!("{GOOD}preview = true\n"))
                .unwrap()
                .unwrap()
                .preview
        );
        assert!(
            !load(&format!("{GOOD}preview = false\n"))
                .unwrap()
                .unwrap()
                .preview
        );
    }

    #[test]
    fn a_repo_without_owner_and_a_missing_token_file_are_located() {
        let error = error_of(&GOOD.replace("ops/proxmox", "proxmox"));
        assert!(
            error.contains("forge.repo") && error.contains("owner/name"),
            "{error}"
        );
        let error = error_of(&GOOD.replace("token_file = \"forge-token\"\n", ""));
        assert!(error.contains("forge.token_file"), "{error}");
        let error = error_of(&GOOD.replace("https://gitea.example/api/v1", "ftp://x"));
        assert!(error.contains("forge.api_url"), "{error}");
    }
}
