//! What a verified delivery is about: a ping, a push to a branch, or something we ignore.
//!
//! Pure: it reads the provider's event header and, for pushes only, the payload's `ref`. It
//! deliberately does not read the commit SHA (`after`, `head_commit`): the agent applies what
//! `git fetch` finds, never what a payload claims, so the SHA is not even returned. Call it only
//! after `signature::verify` succeeded; it does not authenticate anything.
//!
//! Two body encodings (SECURITY-AUDIT.md L6): JSON (`application/json`), and a form
//! (`application/x-www-form-urlencoded`) whose `payload` field holds the same JSON. The form is
//! GitHub's default content type: "The application/x-www-form-urlencoded content type will send
//! the JSON payload as a form parameter called payload" (docs.github.com, "Creating webhooks",
//! content type); Gitea, Forgejo and Gogs offer it too. The signature is over the raw form body,
//! so it is checked before this runs, exactly as for JSON.

use axum::http::HeaderMap;
use serde::Deserialize;

use super::provider::{HeaderLookup, Provider, lookup};

/// The part of a delivery that decides what the agent does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The forge checks that the hook works.
    Ping,
    /// Commits were pushed to (or a branch was created or deleted at) `refs/heads/<branch>`.
    Push {
        /// The branch name without `refs/heads/`.
        branch: String,
    },
    /// A push to a ref that is not a branch (a tag, a note, ...): never a reason for a pass.
    NonBranchPush {
        /// The full ref, e.g. `refs/tags/v1`.
        git_ref: String,
    },
    /// A `pull_request` delivery ([`super::pull_request`]).
    PullRequest(super::pull_request::PullRequest),
    /// Any other event kind, as the forge names it (`issues`, `release`, ...).
    Other(String),
}

/// A verified delivery could not be understood.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// None of the provider's event headers is present.
    #[error("missing event header {header}")]
    MissingHeader {
        /// The header the provider names its events in.
        header: &'static str,
    },
    /// The event header is repeated or not printable ASCII.
    #[error("malformed event header {header}")]
    MalformedHeader {
        /// The header that was read.
        header: &'static str,
    },
    /// A form-encoded delivery has no `payload` field.
    #[error("form-encoded delivery without a payload field")]
    NoFormPayload,
    /// A `pull_request` payload is not JSON or lacks `action`, `number` or the base ref.
    #[error("reading the pull_request payload")]
    PullRequestPayload {
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
    },
    /// A push payload is not JSON or has no string `ref`.
    #[error("reading the push payload's ref")]
    PushPayload {
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
    },
}

/// The only field of a push payload we read.
#[derive(Deserialize)]
struct PushPayload {
    #[serde(rename = "ref")]
    git_ref: String,
}

/// Reads the event kind from `provider`'s event header and, for a push, the pushed ref.
///
/// # Errors
///
/// A missing or malformed event header, or a push whose body has no string `ref`.
pub fn parse(
    provider: Provider,
    headers: &HeaderMap,
    raw_body: &[u8],
) -> Result<Event, EventError> {
    let kind = match lookup(headers, provider.event_headers()) {
        HeaderLookup::One { name, value } => value
            .to_str()
            .map_err(|_| EventError::MalformedHeader { header: name })?,
        HeaderLookup::Repeated { name } => {
            return Err(EventError::MalformedHeader { header: name });
        }
        HeaderLookup::Absent => {
            let header = provider.event_headers()[0];
            return Err(EventError::MissingHeader { header });
        }
    };
    match kind {
        "ping" => Ok(Event::Ping),
        "push" => {
            let payload: PushPayload = if is_form(headers) {
                let json = form_payload(raw_body).ok_or(EventError::NoFormPayload)?;
                serde_json::from_str(&json)
            } else {
                serde_json::from_slice(raw_body)
            }
            .map_err(|source| EventError::PushPayload { source })?;
            Ok(from_ref(payload.git_ref))
        }
        "pull_request" => {
            let json = if is_form(headers) {
                form_payload(raw_body)
                    .ok_or(EventError::NoFormPayload)?
                    .into_bytes()
            } else {
                raw_body.to_vec()
            };
            super::pull_request::parse(provider, &json)
                .map(Event::PullRequest)
                .map_err(|source| EventError::PullRequestPayload { source })
        }
        other => Ok(Event::Other(other.to_owned())),
    }
}

/// Whether the delivery says it is form-encoded.
fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| {
            media
                .trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

/// The `payload` field of a form body (the first, should it be repeated).
fn form_payload(raw_body: &[u8]) -> Option<String> {
    form_urlencoded::parse(raw_body)
        .find(|(name, _)| name == "payload")
        .map(|(_, value)| value.into_owned())
}

fn from_ref(git_ref: String) -> Event {
    match git_ref.strip_prefix("refs/heads/") {
        Some(branch) if !branch.is_empty() => Event::Push {
            branch: branch.to_owned(),
        },
        _ => Event::NonBranchPush { git_ref },
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/webhooks");

    fn fixture(file: &str) -> Vec<u8> {
        std::fs::read(format!("{FIXTURES}/{file}")).unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn push(branch: &str) -> Event {
        Event::Push {
            branch: branch.to_owned(),
        }
    }

    #[test]
    fn github_ping_fixtures_are_pings() {
        let map = headers(&[("x-github-event", "ping")]);
        for file in [
            "github/octokit-ping.json",
            "github/octokit-ping-organization.json",
        ] {
            assert_eq!(
                parse(Provider::GitHub, &map, &fixture(file)).unwrap(),
                Event::Ping,
                "{file}"
            );
        }
    }

    #[test]
    fn push_fixtures_name_their_branch() {
        let cases = [
            (
                Provider::GitHub,
                "x-github-event",
                "github/octokit-push-new-branch.json",
                "master",
            ),
            (
                Provider::GitHub,
                "x-github-event",
                "github/goscm-push.json",
                "master",
            ),
            (
                Provider::Gitea,
                "x-gitea-event",
                "gitea/goscm-push.json",
                "master",
            ),
            (
                Provider::Gitea,
                "x-gitea-event",
                "gitea/docs-push.json",
                "develop",
            ),
            (
                Provider::Forgejo,
                "x-forgejo-event",
                "gitea/goscm-push.json",
                "master",
            ),
            (
                Provider::Gogs,
                "x-gogs-event",
                "gogs/goscm-push.json",
                "master",
            ),
        ];
        for (provider, header, file, branch) in cases {
            let map = headers(&[(header, "push")]);
            assert_eq!(
                parse(provider, &map, &fixture(file)).unwrap(),
                push(branch),
                "{file}"
            );
        }
    }

    #[test]
    fn tag_push_is_not_a_branch_push() {
        let map = headers(&[("x-github-event", "push")]);
        let body = fixture("github/octokit-push-tag-deleted.json");
        assert_eq!(
            parse(Provider::GitHub, &map, &body).unwrap(),
            Event::NonBranchPush {
                git_ref: "refs/tags/simple-tag".to_owned()
            }
        );
    }

    #[test]
    fn branch_names_keep_their_slashes_and_an_empty_branch_is_not_a_branch() {
        let map = headers(&[("x-gogs-event", "push")]);
        let parse_ref = |git_ref: &str| {
            let body = serde_json::json!({ "ref": git_ref }).to_string();
            parse(Provider::Gogs, &map, body.as_bytes()).unwrap()
        };
        assert_eq!(parse_ref("refs/heads/feature/x"), push("feature/x"));
        assert!(matches!(
            parse_ref("refs/heads/"),
            Event::NonBranchPush { .. }
        ));
        assert!(matches!(parse_ref("master"), Event::NonBranchPush { .. }));
    }

    #[test]
    fn other_events_keep_their_name() {
        let map = headers(&[("x-gitea-event", "issues")]);
        assert_eq!(
            parse(Provider::Gitea, &map, b"{}").unwrap(),
            Event::Other("issues".to_owned())
        );
    }

    #[test]
    fn a_pull_request_delivery_names_its_number_and_base_branch() {
        let body = fixture("gitea/goscm-pull_request_edited.json");
        let map = headers(&[("x-gitea-event", "pull_request")]);
        let Event::PullRequest(pr) = parse(Provider::Gitea, &map, &body).unwrap() else {
            panic!("not a pull request");
        };
        assert_eq!((pr.number, pr.base.as_str()), (1, "master"));
        let map = headers(&[("x-github-event", "pull_request")]);
        assert!(matches!(
            parse(Provider::GitHub, &map, b"{}"),
            Err(EventError::PullRequestPayload { .. })
        ));
    }

    #[test]
    fn forgejo_reads_the_gitea_event_header_only_when_its_own_is_absent() {
        let body = fixture("gitea/goscm-push.json");
        let gitea_only = headers(&[("x-gitea-event", "push")]);
        assert_eq!(
            parse(Provider::Forgejo, &gitea_only, &body).unwrap(),
            push("master")
        );
        let both = headers(&[("x-forgejo-event", "ping"), ("x-gitea-event", "push")]);
        assert_eq!(parse(Provider::Forgejo, &both, &body).unwrap(), Event::Ping);
    }

    #[test]
    fn event_header_of_another_provider_is_not_read() {
        let map = headers(&[("x-gitea-event", "push")]);
        assert!(matches!(
            parse(Provider::GitHub, &map, b"{}"),
            Err(EventError::MissingHeader {
                header: "x-github-event"
            })
        ));
    }

    #[test]
    fn repeated_event_header_is_malformed() {
        let map = headers(&[("x-github-event", "ping"), ("x-github-event", "push")]);
        assert!(matches!(
            parse(Provider::GitHub, &map, b"{}"),
            Err(EventError::MalformedHeader { .. })
        ));
    }

    /// A delivery as GitHub sends it with content type `application/x-www-form-urlencoded`:
    /// `payload=` and the JSON payload, form-encoded.
    fn form_encoded(json: &[u8]) -> Vec<u8> {
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("payload", std::str::from_utf8(json).unwrap());
        form.finish().into_bytes()
    }

    #[test]
    fn a_form_encoded_push_names_its_branch_like_the_json_one() {
        let json = fixture("github/goscm-push.json");
        let form = form_encoded(&json);
        assert!(
            form.starts_with(b"payload=%7B"),
            "{}",
            String::from_utf8_lossy(&form[..20])
        );
        for content_type in [
            "application/x-www-form-urlencoded",
            "application/x-www-form-urlencoded; charset=utf-8",
        ] {
            let map = headers(&[("x-github-event", "push"), ("content-type", content_type)]);
            assert_eq!(
                parse(Provider::GitHub, &map, &form).unwrap(),
                push("master")
            );
        }
        // Read as JSON, the same form body is not a push payload.
        let json_type = headers(&[
            ("x-github-event", "push"),
            ("content-type", "application/json"),
        ]);
        assert!(matches!(
            parse(Provider::GitHub, &json_type, &form),
            Err(EventError::PushPayload { .. })
        ));
    }

    #[test]
    fn a_form_without_a_payload_field_is_an_error() {
        let map = headers(&[
            ("x-gitea-event", "push"),
            ("content-type", "application/x-www-form-urlencoded"),
        ]);
        assert!(matches!(
            parse(Provider::Gitea, &map, b"ref=refs%2Fheads%2Fmain"),
            Err(EventError::NoFormPayload)
        ));
    }

    #[test]
    fn push_without_a_string_ref_is_an_error() {
        let map = headers(&[("x-github-event", "push")]);
        for body in [&b"not json"[..], b"{}", br#"{"ref": 7}"#] {
            assert!(matches!(
                parse(Provider::GitHub, &map, body),
                Err(EventError::PushPayload { .. })
            ));
        }
    }
}
