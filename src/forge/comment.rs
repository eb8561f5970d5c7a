//! The forge calls of a plan preview (issue 18 item 3): find this node's comment on a pull
//! request by its hidden marker, create it or update it in place, and set the `…/plan`
//! commit status on the pull request's head.
//!
//! Operations (vendored in tests/forge/, see PROVENANCE.md there):
//! - GitHub: `GET /repos/{owner}/{repo}/issues/{issue_number}/comments` (`per_page` up to 100,
//!   `page`; the `Link` header's `rel="next"` names the next page), `POST` on the same path
//!   with `{"body"}`, `PATCH /repos/{owner}/{repo}/issues/comments/{comment_id}` with
//!   `{"body"}`; `POST /repos/{owner}/{repo}/statuses/{sha}`.
//! - Gitea and Forgejo: `GET /repos/{owner}/{repo}/issues/{index}/comments` (every comment
//!   in one answer), `POST` on the same path with `CreateIssueCommentOption` `{"body"}`, `PATCH
//!   /repos/{owner}/{repo}/issues/comments/{id}` with `EditIssueCommentOption` `{"body"}`;
//!   statuses as for commit statuses.
//!
//! Every call carries the token in `Authorization` only, to `api_url`'s scheme, host and
//! port only, with redirects never followed (the client of
//! [`crate::notify::deliver::http_client_trusting`]); a connection error, a timeout, 408,
//! 429 or a 5xx is retried by the caller with the loop's backoff, another 4xx is given up.

use secrecy::ExposeSecret;
use serde_json::{Value, json};

use super::config::{ForgeConfig, ForgeKind};
use crate::error_chain::error_text;

/// Comments asked for per page of GitHub's list (its maximum `per_page`).
pub const PAGE_SIZE: usize = 100;
/// Pages read at most when looking for our comment (10,000 comments with GitHub's pages).
pub const MAX_PAGES: usize = 100;

/// The hidden marker that finds this node's comment again.
pub fn marker(cluster: Option<&str>, node: &str) -> String {
    let node = if node == "*" { "all" } else { node };
    format!(
        "<!-- proxops:plan:{}/{node} -->",
        cluster.unwrap_or("default")
    )
}

/// A forge call that did not succeed.
#[derive(Debug)]
pub struct CallError {
    /// Worth trying again (connection error, timeout, 408, 429, 5xx).
    pub retry: bool,
    /// What happened, without the token or the URL's query.
    pub text: String,
    /// The HTTP status, when there was an answer.
    pub status: Option<u16>,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// The forge API of one `[forge]`, for previews.
pub struct ForgeApi {
    config: ForgeConfig,
    http: reqwest::Client,
}

impl ForgeApi {
    /// The API of `config`.
    ///
    /// # Errors
    /// The HTTP client cannot be built (a bad `ca_file`).
    pub fn new(config: &ForgeConfig) -> Result<Self, String> {
        let http = crate::notify::deliver::http_client_trusting(config.ca_file.as_deref())?;
        Ok(Self {
            config: config.clone(),
            http,
        })
    }

    async fn call(
        &self,
        method: reqwest::Method,
        url: reqwest::Url,
        body: Option<&Value>,
    ) -> Result<reqwest::Response, CallError> {
        // The token goes to api_url's host only (every URL is built from it; checked anyway).
        if url.scheme() != self.config.api_url.scheme()
            || url.host_str() != self.config.api_url.host_str()
            || url.port_or_known_default() != self.config.api_url.port_or_known_default()
        {
            return Err(CallError {
                retry: false,
                text: "internal: a forge URL outside api_url".to_owned(),
                status: None,
            });
        }
        let token = self.config.token.expose_secret();
        let mut request = self.http.request(method, url);
        if let Some(body) = body {
            request = request.json(body);
        }
        let request = match self.config.kind {
            ForgeKind::GitHub => request
                .bearer_auth(token)
                .header("Accept", "application/vnd.github+json")
                .header("X-GitHub-Api-Version", "2022-11-28"),
            ForgeKind::Gitea | ForgeKind::Forgejo => request
                .header("Authorization", format!("token {token}"))
                .header("Accept", "application/json"),
        };
        match request.send().await {
            Ok(response) if response.status().is_success() => Ok(response),
            Ok(response) => {
                let code = response.status();
                let (retry, text) = super::refused(code);
                Err(CallError {
                    retry,
                    text,
                    status: Some(code.as_u16()),
                })
            }
            Err(error) => Err(CallError {
                retry: true,
                text: error_text(&error.without_url()),
                status: None,
            }),
        }
    }

    /// The id of the first comment of pull request `number` whose body starts with
    /// `marker`, reading every page.
    ///
    /// GitHub pages the list (`per_page` at most 100, `page`; the `Link` header's
    /// `rel="next"` says whether there is more). Gitea's `issueGetComments` takes no `page`
    /// or `limit` and answers every comment at once: verified in go-gitea/gitea
    /// `routers/api/v1/repo/issue_comment.go`, `ListIssueComments` (its swagger block lists
    /// only `since` and `before`, and its `FindCommentsOptions` has no `ListOptions`), so one
    /// request reads them all (Forgejo: the same handler, assumed).
    ///
    /// # Errors
    /// A call failed or a page is not a JSON list of comments.
    pub async fn find_comment(&self, number: u64, marker: &str) -> Result<Option<u64>, CallError> {
        let issue = number.to_string();
        for page in 1..=MAX_PAGES {
            let mut url = self.config.repo_url(&["issues", &issue, "comments"]);
            if self.config.kind == ForgeKind::GitHub {
                url.query_pairs_mut()
                    .append_pair("per_page", &PAGE_SIZE.to_string())
                    .append_pair("page", &page.to_string());
            }
            let response = self.call(reqwest::Method::GET, url, None).await?;
            let next = response
                .headers()
                .get_all(reqwest::header::LINK)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(has_next);
            let comments: Vec<Value> = response.json().await.map_err(|e| CallError {
                retry: true,
                text: format!("the comments page is not a JSON list: {}", error_text(&e)),
                status: None,
            })?;
            if let Some(id) = comments.iter().find_map(|c| {
                c["body"]
                    .as_str()
                    .filter(|b| b.starts_with(marker))
                    .and(c["id"].as_u64())
            }) {
                return Ok(Some(id));
            }
            if self.config.kind != ForgeKind::GitHub || !next || comments.is_empty() {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// Creates a comment on pull request `number`; its id.
    ///
    /// # Errors
    /// The call failed.
    pub async fn create_comment(&self, number: u64, body: &str) -> Result<Option<u64>, CallError> {
        let url = self
            .config
            .repo_url(&["issues", &number.to_string(), "comments"]);
        let response = self
            .call(reqwest::Method::POST, url, Some(&json!({ "body": body })))
            .await?;
        let created: Value = response.json().await.unwrap_or(Value::Null);
        Ok(created["id"].as_u64())
    }

    /// Replaces the body of comment `id`.
    ///
    /// # Errors
    /// The call failed.
    pub async fn update_comment(&self, id: u64, body: &str) -> Result<(), CallError> {
        let url = self
            .config
            .repo_url(&["issues", "comments", &id.to_string()]);
        self.call(reqwest::Method::PATCH, url, Some(&json!({ "body": body })))
            .await
            .map(drop)
    }

    /// Sets a commit status on `sha`.
    ///
    /// # Errors
    /// The call failed.
    pub async fn set_status(
        &self,
        sha: &str,
        state: super::State,
        context: &str,
        description: &str,
    ) -> Result<(), CallError> {
        let url = self.config.status_url(sha);
        let body = json!({
            "state": state.as_str(),
            "description": super::truncate(description, super::MAX_DESCRIPTION),
            "context": context,
        });
        self.call(reqwest::Method::POST, url, Some(&body))
            .await
            .map(drop)
    }
}

/// Whether one `Link` header value names a `rel="next"` page (RFC 8288).
fn has_next(link: &str) -> bool {
    link.split(',').any(|part| {
        part.split(';').skip(1).any(|param| {
            let param = param.trim();
            param == "rel=\"next\"" || param == "rel=next"
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_names_cluster_and_node_and_a_whole_cluster_agent_is_all() {
        assert_eq!(
            marker(Some("lab"), "pve1"),
            "<!-- proxops:plan:lab/pve1 -->"
        );
        assert_eq!(marker(None, "*"), "<!-- proxops:plan:default/all -->");
    }

    #[test]
    fn a_link_header_with_rel_next_has_a_next_page_and_one_with_only_prev_has_not() {
        let github = "<https://api.github.com/repositories/1/issues/2/comments?page=2>; rel=\"next\", <https://api.github.com/repositories/1/issues/2/comments?page=5>; rel=\"last\"";
        assert!(has_next(github));
        assert!(!has_next(
            "<https://api.github.com/x?page=1>; rel=\"prev\", <https://api.github.com/x?page=1>; rel=\"first\""
        ));
        assert!(!has_next(""));
    }
}
