//! Behaviour of the webhook router, driven with `router(state).oneshot(request)`: no socket, no
//! agent; the test holds the receiving end of the nudge channel and nobody consumes it unless a
//! test says so. Payloads and signatures come from `tests/fixtures/webhooks` (see PROVENANCE.md).

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use hmac::{Hmac, KeyInit, Mac};
use secrecy::SecretString;
use serde::Deserialize;
use sha2::Sha256;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;
use tower::ServiceExt;

use super::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/webhooks");
const SECRET: &str = "s3cr3t-webhook-key-4711";

fn fixture(file: &str) -> Vec<u8> {
    std::fs::read(format!("{FIXTURES}/{file}")).unwrap()
}

fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// A receiver following `branch` with `secret`, and the agent's end of the channel.
fn receiver(secret: &str, branch: &str) -> (WebhookState, mpsc::Receiver<Nudge>) {
    let (tx, rx) = mpsc::channel(1);
    (
        WebhookState::new(SecretString::from(secret.to_owned()), branch, tx),
        rx,
    )
}

/// A delivery built the way `provider` sends it: its event header and its signature header.
fn signed(provider: Provider, secret: &str, event: &str, body: Vec<u8>) -> Request<Body> {
    let digest = sign(secret, &body);
    let (event_header, signature) = match provider {
        Provider::GitHub => ("x-github-event", format!("sha256={digest}")),
        Provider::Gitea => ("x-gitea-event", digest),
        Provider::Forgejo => ("x-forgejo-event", digest),
        Provider::Gogs => ("x-gogs-event", digest),
    };
    Request::post(provider.path())
        .header("content-type", "application/json")
        .header(event_header, event)
        .header(provider.signature_headers()[0], signature)
        .body(Body::from(body))
        .unwrap()
}

fn push_body(branch: &str) -> Vec<u8> {
    serde_json::json!({ "ref": format!("refs/heads/{branch}"), "after": "0".repeat(40) })
        .to_string()
        .into_bytes()
}

#[derive(Deserialize)]
struct Vectors {
    vectors: Vec<Vector>,
}

#[derive(Deserialize)]
struct Vector {
    name: String,
    secret: Option<String>,
    body_file: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// A delivery from `hmac-vectors.json` with exactly the headers the forge sent, and its secret.
fn vector_delivery(name: &str, path: &str) -> (Option<String>, Request<Body>) {
    let text = std::fs::read_to_string(format!("{FIXTURES}/hmac-vectors.json")).unwrap();
    let vectors: Vectors = serde_json::from_str(&text).unwrap();
    let vector = vectors
        .vectors
        .into_iter()
        .find(|v| v.name == name)
        .unwrap();
    let mut request = Request::post(path);
    for (header, value) in &vector.headers {
        request = request.header(header.as_str(), value.as_str());
    }
    let body = fixture(vector.body_file.as_deref().unwrap());
    (vector.secret, request.body(Body::from(body)).unwrap())
}

async fn send(state: &WebhookState, request: Request<Body>) -> (StatusCode, String) {
    let response: Response<Body> = router(state.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn assert_no_nudge(rx: &mut mpsc::Receiver<Nudge>) {
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

#[tokio::test]
async fn each_providers_signed_push_to_the_branch_nudges_once() {
    // GitHub, Gitea and Forgejo with the exact headers of their vectors; Gogs signed here.
    let deliveries = [
        (
            Provider::GitHub,
            vector_delivery("goscm-github-push", "/hooks/github"),
        ),
        (
            Provider::Gitea,
            vector_delivery("derived-gitea-push-all-headers", "/hooks/gitea"),
        ),
        (
            Provider::Forgejo,
            vector_delivery("derived-forgejo-push-all-headers", "/hooks/forgejo"),
        ),
        (
            Provider::Gogs,
            (
                Some(SECRET.to_owned()),
                signed(
                    Provider::Gogs,
                    SECRET,
                    "push",
                    fixture("gogs/goscm-push.json"),
                ),
            ),
        ),
    ];
    for (provider, (secret, request)) in deliveries {
        let (state, mut rx) = receiver(&secret.unwrap(), "master");
        let (status, body) = send(&state, request).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::ACCEPTED, "accepted\n"),
            "{provider}"
        );
        assert_eq!(rx.try_recv(), Ok(Nudge { provider }));
        assert_no_nudge(&mut rx);
        assert_eq!(
            state.metrics.snapshot(),
            WebhookCounts {
                accepted: 1,
                ..WebhookCounts::default()
            }
        );
    }
}

#[tokio::test]
async fn a_gitea_delivery_pointed_at_the_github_route_is_accepted_by_its_hub_signature() {
    let (secret, request) = vector_delivery("derived-gitea-push-all-headers", "/hooks/github");
    let (state, mut rx) = receiver(&secret.unwrap(), "master");
    assert_eq!(send(&state, request).await.0, StatusCode::ACCEPTED);
    assert_eq!(
        rx.try_recv(),
        Ok(Nudge {
            provider: Provider::GitHub
        })
    );
}

#[tokio::test]
async fn bad_signature_is_rejected_with_401_and_no_nudge() {
    for provider in Provider::ALL {
        let (state, mut rx) = receiver(SECRET, "main");
        let request = signed(provider, "another-secret", "push", push_body("main"));
        let (status, body) = send(&state, request).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::UNAUTHORIZED, "invalid signature\n")
        );
        assert_no_nudge(&mut rx);
        assert_eq!(state.metrics.snapshot().rejected, 1);
    }
}

#[tokio::test]
async fn published_invalid_gitea_signature_is_rejected_with_401() {
    let (secret, request) = vector_delivery("goscm-gitea-invalid", "/hooks/gitea");
    let (state, mut rx) = receiver(&secret.unwrap(), "master");
    assert_eq!(send(&state, request).await.0, StatusCode::UNAUTHORIZED);
    assert_no_nudge(&mut rx);
}

#[tokio::test]
async fn missing_signature_is_rejected_with_401() {
    for provider in Provider::ALL {
        let (state, mut rx) = receiver(SECRET, "main");
        let mut request = signed(provider, SECRET, "push", push_body("main"));
        request
            .headers_mut()
            .remove(provider.signature_headers()[0]);
        let (status, body) = send(&state, request).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::UNAUTHORIZED, "missing signature\n")
        );
        assert_no_nudge(&mut rx);
    }
}

#[tokio::test]
async fn empty_signatures_from_a_forge_without_a_secret_are_rejected_with_401() {
    for provider in [
        Provider::GitHub,
        Provider::Gitea,
        Provider::Forgejo,
        Provider::Gogs,
    ] {
        let (_, request) = vector_delivery("derived-gitea-no-secret-configured", provider.path());
        let (state, mut rx) = receiver(SECRET, "master");
        assert_eq!(
            send(&state, request).await.0,
            StatusCode::UNAUTHORIZED,
            "{provider}"
        );
        assert_no_nudge(&mut rx);
    }
}

#[tokio::test]
async fn signed_ping_is_answered_200_without_nudge() {
    let (state, mut rx) = receiver(SECRET, "master");
    let request = signed(
        Provider::GitHub,
        SECRET,
        "ping",
        fixture("github/octokit-ping.json"),
    );
    assert_eq!(
        send(&state, request).await,
        (StatusCode::OK, "pong\n".to_owned())
    );
    assert_no_nudge(&mut rx);
    assert_eq!(state.metrics.snapshot().ignored, 1);
}

#[tokio::test]
async fn unsigned_ping_is_rejected_with_401() {
    let (state, _rx) = receiver(SECRET, "master");
    let mut request = signed(
        Provider::GitHub,
        SECRET,
        "ping",
        fixture("github/octokit-ping.json"),
    );
    request.headers_mut().remove("x-hub-signature-256");
    assert_eq!(send(&state, request).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn push_to_another_branch_is_ignored_with_202_without_nudge() {
    let (state, mut rx) = receiver(SECRET, "main");
    let request = signed(
        Provider::Gitea,
        SECRET,
        "push",
        fixture("gitea/docs-push.json"),
    );
    assert_eq!(
        send(&state, request).await,
        (StatusCode::ACCEPTED, "ignored\n".to_owned())
    );
    assert_no_nudge(&mut rx);
    assert_eq!(state.metrics.snapshot().ignored, 1);
}

#[tokio::test]
async fn tag_push_and_other_events_are_ignored_with_202_without_nudge() {
    let (state, mut rx) = receiver(SECRET, "master");
    let tag = fixture("github/octokit-push-tag-deleted.json");
    let pull_request = fixture("gitea/goscm-pull_request_edited.json");
    for request in [
        signed(Provider::GitHub, SECRET, "push", tag),
        signed(Provider::Gitea, SECRET, "pull_request", pull_request),
    ] {
        assert_eq!(
            send(&state, request).await,
            (StatusCode::ACCEPTED, "ignored\n".to_owned())
        );
    }
    assert_no_nudge(&mut rx);
    assert_eq!(state.metrics.snapshot().ignored, 2);
}

#[tokio::test]
async fn a_signed_pull_request_into_the_followed_branch_asks_for_one_preview_and_never_a_pass() {
    let (state, mut rx) = receiver(SECRET, "master");
    let previews = Arc::new(crate::forge::preview::Requests::default());
    let state = state.with_previews(Some(previews.clone()));
    let opened = fixture("github/octokit-pull_request-opened.json");
    let synced = fixture("github/octokit-pull_request-synchronize.json");
    let closed = fixture("github/octokit-pull_request-closed.json");
    let cases = [
        (
            signed(Provider::GitHub, SECRET, "pull_request", opened),
            "preview requested\n",
        ),
        // The same pull request again while its preview waits: coalesced.
        (
            signed(Provider::GitHub, SECRET, "pull_request", synced),
            "coalesced with a pending preview\n",
        ),
        (
            signed(Provider::GitHub, SECRET, "pull_request", closed),
            "ignored\n",
        ),
    ];
    for (request, reply) in cases {
        assert_eq!(
            send(&state, request).await,
            (StatusCode::ACCEPTED, reply.to_owned())
        );
    }
    // Woodpecker CI's Gitea `reopened` payload (pull request 1 into `main`), delivered as
    // Forgejo sends it, to an agent following `main`.
    let (on_main, mut main_rx) = receiver(SECRET, "main");
    let on_main = on_main.with_previews(Some(previews.clone()));
    let gitea = fixture("gitea/woodpecker-HookPullRequestReopened.json");
    assert_eq!(
        send(
            &on_main,
            signed(Provider::Forgejo, SECRET, "pull_request", gitea)
        )
        .await,
        (StatusCode::ACCEPTED, "preview requested\n".to_owned())
    );
    assert_no_nudge(&mut main_rx);
    assert!(previews.waiting(2) && previews.waiting(1));
    assert_no_nudge(&mut rx);
    // Unsigned, it is refused like a push.
    let mut unsigned = signed(
        Provider::GitHub,
        "wrong-secret",
        "pull_request",
        fixture("github/octokit-pull_request-opened.json"),
    );
    unsigned.headers_mut().remove("x-hub-signature-256");
    assert_eq!(send(&state, unsigned).await.0, StatusCode::UNAUTHORIZED);
    let forged = signed(
        Provider::GitHub,
        "wrong-secret",
        "pull_request",
        fixture("github/octokit-pull_request-reopened.json"),
    );
    assert_eq!(send(&state, forged).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_pull_request_into_another_branch_or_with_previews_off_is_ignored() {
    let (state, mut rx) = receiver(SECRET, "main");
    let previews = Arc::new(crate::forge::preview::Requests::default());
    let into_master = fixture("github/octokit-pull_request-opened.json");
    let with = state.clone().with_previews(Some(previews.clone()));
    let request = signed(
        Provider::GitHub,
        SECRET,
        "pull_request",
        into_master.clone(),
    );
    assert_eq!(
        send(&with, request).await,
        (StatusCode::ACCEPTED, "ignored\n".to_owned())
    );
    assert!(!previews.waiting(2));
    let (off, _rx) = receiver(SECRET, "master");
    let request = signed(Provider::GitHub, SECRET, "pull_request", into_master);
    assert_eq!(
        send(&off, request).await,
        (StatusCode::ACCEPTED, "ignored\n".to_owned())
    );
    assert_no_nudge(&mut rx);
}

#[tokio::test]
async fn signed_push_without_a_ref_is_a_400_without_nudge() {
    let (state, mut rx) = receiver(SECRET, "main");
    let request = signed(
        Provider::Gogs,
        SECRET,
        "push",
        b"{\"after\":\"abc\"}".to_vec(),
    );
    assert_eq!(send(&state, request).await.0, StatusCode::BAD_REQUEST);
    assert_no_nudge(&mut rx);
}

#[tokio::test]
async fn body_of_6_mib_is_refused_with_413_without_nudge() {
    let (state, mut rx) = receiver(SECRET, "main");
    let mut body = push_body("main");
    body.resize(6 * 1024 * 1024, b' ');
    let with_length = signed(Provider::GitHub, SECRET, "push", body.clone());
    let length = body.len().to_string();
    let (status, reply) = send(&state, with_length).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply, "payload too large (limit 5 MiB)\n");

    // Declared length and actual size both count: the same body with a Content-Length header.
    let mut declared = signed(Provider::GitHub, SECRET, "push", body);
    declared
        .headers_mut()
        .insert("content-length", length.parse().unwrap());
    assert_eq!(
        send(&state, declared).await.0,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert_no_nudge(&mut rx);
    assert_eq!(state.metrics.snapshot().rejected, 2);
}

#[tokio::test]
async fn body_of_exactly_5_mib_is_accepted() {
    let (state, mut rx) = receiver(SECRET, "main");
    let mut body = push_body("main");
    body.resize(MAX_BODY_BYTES, b' ');
    let request = signed(Provider::Forgejo, SECRET, "push", body);
    assert_eq!(send(&state, request).await.0, StatusCode::ACCEPTED);
    assert!(rx.try_recv().is_ok());
}

#[tokio::test]
async fn burst_of_50_valid_deliveries_leaves_exactly_one_nudge_pending() {
    let (state, mut rx) = receiver(SECRET, "main");
    let app = router(state.clone());
    let mut deliveries = tokio::task::JoinSet::new();
    for i in 0..50 {
        let provider = Provider::ALL[i % Provider::ALL.len()];
        let request = signed(provider, SECRET, "push", push_body("main"));
        deliveries.spawn(app.clone().oneshot(request));
    }
    while let Some(response) = deliveries.join_next().await {
        assert_eq!(response.unwrap().unwrap().status(), StatusCode::ACCEPTED);
    }
    assert!(rx.try_recv().is_ok());
    assert_no_nudge(&mut rx);
    assert_eq!(
        state.metrics.snapshot(),
        WebhookCounts {
            accepted: 1,
            coalesced: 49,
            ..WebhookCounts::default()
        }
    );
}

#[tokio::test]
async fn push_after_the_pending_nudge_was_taken_nudges_again() {
    let (state, mut rx) = receiver(SECRET, "main");
    for after in ["1", "2"] {
        let body = serde_json::json!({ "ref": "refs/heads/main", "after": after.repeat(40) });
        let request = signed(
            Provider::GitHub,
            SECRET,
            "push",
            body.to_string().into_bytes(),
        );
        assert_eq!(send(&state, request).await.1, "accepted\n");
        assert!(rx.try_recv().is_ok());
    }
    assert_eq!(state.metrics.snapshot().accepted, 2);
}

#[tokio::test]
async fn a_replayed_push_is_coalesced_on_every_endpoint_even_after_its_pass_was_taken() {
    let (state, mut rx) = receiver(SECRET, "main");
    let request = signed(Provider::GitHub, SECRET, "push", push_body("main"));
    assert_eq!(send(&state, request).await.1, "accepted\n");
    assert!(rx.try_recv().is_ok());
    for _ in 0..3 {
        let replay = signed(Provider::GitHub, SECRET, "push", push_body("main"));
        assert_eq!(
            send(&state, replay).await,
            (
                StatusCode::ACCEPTED,
                "coalesced: identical to a delivery already accepted\n".to_owned()
            )
        );
    }
    assert_no_nudge(&mut rx);
    // The same body sent to the other endpoints is the same delivery (SECURITY-AUDIT.md L3:
    // keyed on the endpoint too, one captured delivery started a pass on each of the four).
    for provider in [Provider::Gitea, Provider::Forgejo, Provider::Gogs] {
        let other = signed(provider, SECRET, "push", push_body("main"));
        assert_eq!(
            send(&state, other).await.1,
            "coalesced: identical to a delivery already accepted\n",
            "{provider}"
        );
    }
    assert_no_nudge(&mut rx);
    // Another body is another delivery.
    let mut body = push_body("main");
    body.push(b' ');
    let different = signed(Provider::Gitea, SECRET, "push", body);
    assert_eq!(send(&state, different).await.1, "accepted\n");
    assert_eq!(
        state.metrics.snapshot(),
        WebhookCounts {
            accepted: 2,
            coalesced: 6,
            ..WebhookCounts::default()
        }
    );
}

#[tokio::test]
async fn push_when_the_agent_has_stopped_listening_is_a_503() {
    let (state, rx) = receiver(SECRET, "main");
    drop(rx);
    let request = signed(Provider::GitHub, SECRET, "push", push_body("main"));
    assert_eq!(
        send(&state, request).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn only_post_to_a_known_provider_is_routed() {
    let (state, _rx) = receiver(SECRET, "main");
    let get = Request::get("/hooks/github").body(Body::empty()).unwrap();
    assert_eq!(send(&state, get).await.0, StatusCode::METHOD_NOT_ALLOWED);
    let unknown = Request::post("/hooks/bitbucket")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&state, unknown).await.0, StatusCode::NOT_FOUND);
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn secret_never_appears_in_responses_or_trace_logs() {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The test runtime is single-threaded, so the handler runs under this thread's default.
    let _guard = tracing::subscriber::set_default(subscriber);

    let (state, _rx) = receiver(SECRET, "main");
    let mut oversized = push_body("main");
    oversized.resize(6 * 1024 * 1024, b' ');
    let good = push_body("main");
    let good_signature = sign(SECRET, &good);
    let wrong_signature = sign("guess", &good);
    let requests = [
        signed(Provider::GitHub, SECRET, "push", good.clone()),
        signed(Provider::GitHub, SECRET, "push", good.clone()),
        signed(Provider::Gitea, "guess", "push", good.clone()),
        signed(Provider::Gogs, SECRET, "ping", b"{}".to_vec()),
        signed(Provider::Forgejo, SECRET, "push", push_body("other")),
        signed(Provider::Gogs, SECRET, "push", b"{}".to_vec()),
        signed(Provider::GitHub, SECRET, "push", oversized),
    ];
    let mut replies = String::new();
    for request in requests {
        replies.push_str(&send(&state, request).await.1);
    }
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();

    assert!(
        logs.contains("WARN"),
        "a rejected delivery is logged at warn:\n{logs}"
    );
    assert!(logs.contains("TRACE"), "trace level was captured:\n{logs}");
    for text in [&replies, &logs, &format!("{state:?}")] {
        assert!(!text.contains(SECRET), "secret leaked:\n{text}");
        assert!(!text.contains(&good_signature), "signature leaked:\n{text}");
        assert!(
            !text.contains(&wrong_signature),
            "signature leaked:\n{text}"
        );
    }
}

/// A request body that never ends: reading it waits forever.
struct EndlessBody;

impl axum::body::HttpBody for EndlessBody {
    type Data = axum::body::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::task::Poll::Pending
    }
}

/// A push to `provider`'s endpoint with a body that never ends, signed as `signature` says.
fn endless(provider: Provider, signature: Option<&str>) -> Request<Body> {
    let mut request = Request::post(provider.path())
        .header("content-type", "application/json")
        .header(provider.event_headers()[0], "push");
    if let Some(signature) = signature {
        request = request.header(provider.signature_headers()[0], signature);
    }
    request.body(Body::new(EndlessBody)).unwrap()
}

#[tokio::test]
async fn an_unsigned_delivery_is_refused_from_its_headers_without_reading_its_body() {
    let (state, mut rx) = receiver(SECRET, "main");
    for provider in Provider::ALL {
        let reply = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            send(&state, endless(provider, None)),
        )
        .await
        .expect("answered without waiting for the body");
        assert_eq!(
            reply,
            (StatusCode::UNAUTHORIZED, "missing signature\n".to_owned())
        );
    }
    assert_no_nudge(&mut rx);
    assert_eq!(state.metrics.snapshot().rejected, 4);
}

#[tokio::test]
async fn bodies_beyond_the_few_in_flight_are_refused_with_503_instead_of_buffered() {
    let (state, mut rx) = receiver(SECRET, "main");
    // MAX_BODIES_IN_FLIGHT deliveries whose bodies never finish hold every slot.
    let mut stalled = Vec::new();
    for _ in 0..MAX_BODIES_IN_FLIGHT {
        let state = state.clone();
        stalled.push(tokio::spawn(async move {
            send(&state, endless(Provider::GitHub, Some("sha256=00"))).await
        }));
    }
    while state.bodies.available_permits() > 0 {
        tokio::task::yield_now().await;
    }
    let started = std::time::Instant::now();
    let request = signed(Provider::GitHub, SECRET, "push", push_body("main"));
    let (status, reply) = send(&state, request).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    assert!(started.elapsed() >= BODY_SLOT_WAIT);
    assert_no_nudge(&mut rx);
    // A slot freed is a slot used again.
    stalled.pop().unwrap().abort();
    while state.bodies.available_permits() == 0 {
        tokio::task::yield_now().await;
    }
    let request = signed(Provider::GitHub, SECRET, "push", push_body("main"));
    assert_eq!(send(&state, request).await.1, "accepted\n");
    for task in stalled {
        task.abort();
    }
}

#[tokio::test]
async fn a_signed_form_encoded_github_push_is_accepted_by_its_signature_over_the_raw_form() {
    let (state, mut rx) = receiver(SECRET, "main");
    let json = push_body("main");
    let mut form = form_urlencoded::Serializer::new(String::new());
    form.append_pair("payload", std::str::from_utf8(&json).unwrap());
    let form = form.finish().into_bytes();
    let mut request = signed(Provider::GitHub, SECRET, "push", form.clone());
    request.headers_mut().insert(
        "content-type",
        "application/x-www-form-urlencoded".parse().unwrap(),
    );
    assert_eq!(
        send(&state, request).await,
        (StatusCode::ACCEPTED, "accepted\n".to_owned())
    );
    assert!(rx.try_recv().is_ok());
    // Signed over the JSON inside rather than the raw form, it is refused.
    let digest = sign(SECRET, &json);
    let forged = Request::post("/hooks/github")
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-github-event", "push")
        .header("x-hub-signature-256", format!("sha256={digest}"))
        .body(Body::from(form))
        .unwrap();
    assert_eq!(send(&state, forged).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_flood_of_rejected_deliveries_logs_one_warning_and_counts_the_rest() {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let (state, _rx) = receiver(SECRET, "main");
    for i in 0..500 {
        let request = if i % 2 == 0 {
            Request::post("/hooks/github")
                .header("x-github-event", "push")
                .body(Body::from(push_body("main")))
                .unwrap()
        } else {
            signed(Provider::Gitea, "guess", "push", push_body("main"))
        };
        assert_eq!(send(&state, request).await.0, StatusCode::UNAUTHORIZED);
    }
    let shutdown = tokio_util::sync::CancellationToken::new();
    shutdown.cancel();
    report_rejections(state.clone(), shutdown).await;
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let warnings: Vec<&str> = logs.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 2, "{logs}");
    assert!(warnings[0].contains("no signature header"), "{logs}");
    assert!(
        warnings[1].contains("more webhook deliveries were rejected")
            && warnings[1].contains("count=499")
            && warnings[1].contains("bad_signature=250 unsigned=249"),
        "{logs}"
    );
    assert_eq!(state.metrics.snapshot().rejected, 500);
}
