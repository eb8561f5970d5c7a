//! A verified `pull_request` delivery: which pull request, into which branch, and whether its
//! action asks for a plan preview (issue 18 item 3).
//!
//! Event and action names, as each forge sends them:
//! - GitHub: header `X-GitHub-Event: pull_request`; actions `opened`, `reopened` and
//!   `synchronize` (new commits on the head branch), among `closed`, `edited`, `labeled`…
//!   Verified in octokit/webhooks @ 3a58428a, `payload-examples/api.github.com/pull_request/`
//!   (`opened`, `reopened`, `synchronize`, `closed` payloads, copied to
//!   `tests/fixtures/webhooks/github/octokit-pull_request-*.json`).
//! - Gitea: header `X-Gitea-Event: pull_request` for opened, reopened, closed, edited and for
//!   new commits: `HookEventPullRequestSync` maps to the event name `pull_request`
//!   (go-gitea/gitea `modules/webhook/type.go`, `HookEventType.Event`); the actions are
//!   `HookIssueOpened` `opened`, `HookIssueReOpened` `reopened` and `HookIssueSynchronized`
//!   `synchronized` (go-gitea/gitea @ 040cb8b6, `modules/structs/hook.go`, `HookIssueAction`);
//!   the payload is `PullRequestPayload` (`action`, `number`, `pull_request`). Woodpecker CI's
//!   Gitea test payloads agree (woodpecker-ci/woodpecker, `server/forge/gitea/fixtures/
//!   HookPullRequest{,Updated,Reopened,Closed}.json`: `opened`, `synchronized`, `reopened`,
//!   `closed`, copied to `tests/fixtures/webhooks/gitea/`).
//! - Forgejo: Gitea's payload and action names (a fork of Gitea; its sources were not
//!   fetched), sent with `X-Forgejo-Event` and `X-Gitea-Event` (see [`super::provider`]);
//!   Woodpecker CI's Forgejo test payloads agree (woodpecker-ci/woodpecker @ a4cb541b,
//!   `server/forge/forgejo/fixtures/HookPullRequest*.json`: `opened`, `synchronized`,
//!   `closed`, copied to `tests/fixtures/webhooks/forgejo/`).
//! - Gogs: no preview (Gogs has no commit-status API, so `[forge]` refuses it): its
//!   `pull_request` deliveries are ignored like any other event.
//!
//! Read: `action`, `number` and `pull_request.base.ref`. Never the head commit: the agent
//! plans what `git fetch` of `refs/pull/<n>/head` finds, never what a payload claims.

use serde::Deserialize;

use super::provider::Provider;

/// What the action of a `pull_request` delivery asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Opened, reopened, or new commits: plan the head again.
    Preview,
    /// Anything else (`closed`, `edited`, `labeled`…): acknowledged and ignored.
    Ignored(String),
}

/// A `pull_request` delivery as the agent reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequest {
    /// The pull request's number (`refs/pull/<number>/head`).
    pub number: u64,
    /// The branch it would merge into, without `refs/heads/`.
    pub base: String,
    /// What its action asks for.
    pub action: Action,
}

#[derive(Deserialize)]
struct Payload {
    action: String,
    number: u64,
    pull_request: PullRequestPart,
}

#[derive(Deserialize)]
struct PullRequestPart {
    base: BasePart,
}

#[derive(Deserialize)]
struct BasePart {
    #[serde(rename = "ref")]
    git_ref: String,
}

/// The action names that ask for a preview, per provider.
pub fn preview_actions(provider: Provider) -> &'static [&'static str] {
    match provider {
        Provider::GitHub => &["opened", "reopened", "synchronize"],
        Provider::Gitea | Provider::Forgejo => &["opened", "reopened", "synchronized"],
        Provider::Gogs => &[],
    }
}

/// Reads a `pull_request` payload (JSON text).
///
/// # Errors
/// The payload is not JSON or lacks `action`, `number` or `pull_request.base.ref`.
pub fn parse(provider: Provider, json: &[u8]) -> Result<PullRequest, serde_json::Error> {
    let payload: Payload = serde_json::from_slice(json)?;
    let base = payload
        .pull_request
        .base
        .git_ref
        .strip_prefix("refs/heads/")
        .map_or_else(|| payload.pull_request.base.git_ref.clone(), str::to_owned);
    let action = if preview_actions(provider).contains(&payload.action.as_str()) {
        Action::Preview
    } else {
        Action::Ignored(payload.action)
    };
    Ok(PullRequest {
        number: payload.number,
        base,
        action,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/webhooks");

    fn fixture(file: &str) -> Vec<u8> {
        std::fs::read(format!("{FIXTURES}/{file}")).unwrap()
    }

    #[test]
    fn github_opened_reopened_and_synchronize_ask_for_a_preview_and_closed_does_not() {
        for action in ["opened", "reopened", "synchronize"] {
            let body = fixture(&format!("github/octokit-pull_request-{action}.json"));
            assert_eq!(
                parse(Provider::GitHub, &body).unwrap(),
                PullRequest {
                    number: 2,
                    base: "master".to_owned(),
                    action: Action::Preview,
                },
                "{action}"
            );
        }
        let closed = fixture("github/octokit-pull_request-closed.json");
        assert_eq!(
            parse(Provider::GitHub, &closed).unwrap().action,
            Action::Ignored("closed".to_owned())
        );
    }

    #[test]
    fn gitea_opened_reopened_and_synchronized_ask_for_a_preview_and_closed_and_edited_do_not() {
        // Woodpecker CI's Gitea test payloads (tests/fixtures/webhooks/PROVENANCE.md).
        let read = |name: &str| fixture(&format!("gitea/woodpecker-{name}.json"));
        let edited = fixture("gitea/goscm-pull_request_edited.json");
        for provider in [Provider::Gitea, Provider::Forgejo] {
            let opened = parse(provider, &read("HookPullRequest")).unwrap();
            assert_eq!((opened.number, opened.base.as_str()), (1, "main"));
            assert_eq!(opened.action, Action::Preview);
            let reopened = parse(provider, &read("HookPullRequestReopened")).unwrap();
            assert_eq!((reopened.number, reopened.action), (1, Action::Preview));
            let synced = parse(provider, &read("HookPullRequestUpdated")).unwrap();
            assert_eq!((synced.number, synced.base.as_str()), (2, "main"));
            assert_eq!(synced.action, Action::Preview);
            assert_eq!(
                parse(provider, &read("HookPullRequestClosed"))
                    .unwrap()
                    .action,
                Action::Ignored("closed".to_owned())
            );
            assert_eq!(
                parse(provider, &edited).unwrap().action,
                Action::Ignored("edited".to_owned())
            );
        }
    }

    #[test]
    fn forgejo_opened_and_synchronized_ask_for_a_preview_and_closed_does_not() {
        let read = |name: &str| fixture(&format!("forgejo/woodpecker-{name}.json"));
        let opened = parse(Provider::Forgejo, &read("HookPullRequest")).unwrap();
        assert_eq!((opened.number, opened.base.as_str()), (1, "main"));
        assert_eq!(opened.action, Action::Preview);
        let synced = parse(Provider::Forgejo, &read("HookPullRequestUpdated")).unwrap();
        assert_eq!((synced.number, synced.action), (2, Action::Preview));
        let closed = parse(Provider::Forgejo, &read("HookPullRequestClosed")).unwrap();
        assert_eq!(closed.action, Action::Ignored("closed".to_owned()));
    }

    #[test]
    fn each_forge_spells_new_commits_its_own_way() {
        let body = |action: &str| {
            serde_json::json!({"action": action, "number": 7, "pull_request": {"base": {"ref": "main"}}})
                .to_string()
        };
        let github_on_gitea = parse(Provider::Gitea, body("synchronize").as_bytes()).unwrap();
        assert!(matches!(github_on_gitea.action, Action::Ignored(_)));
        let gitea_on_github = parse(Provider::GitHub, body("synchronized").as_bytes()).unwrap();
        assert!(matches!(gitea_on_github.action, Action::Ignored(_)));
        let gogs = parse(Provider::Gogs, body("opened").as_bytes()).unwrap();
        assert!(matches!(gogs.action, Action::Ignored(_)));
    }

    #[test]
    fn a_payload_without_number_or_base_is_an_error() {
        for body in [
            &br#"{"action":"opened","pull_request":{"base":{"ref":"main"}}}"#[..],
            br#"{"action":"opened","number":1,"pull_request":{}}"#,
            b"not json",
        ] {
            assert!(parse(Provider::GitHub, body).is_err());
        }
    }
}
