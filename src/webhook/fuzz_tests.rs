//! Property-based fuzzing of the webhook router (issue 8, hostile input): arbitrary methods,
//! paths, headers and bodies, signed or not, through `router(state).oneshot(request)`. The
//! router must never panic, must answer 2xx or 4xx (the nudge channel stays open, so never
//! 503), and every delivery to a hook route must count exactly once in the metrics.
//!
//! CI runs 256 cases; `PROPTEST_CASES=100000` runs a long campaign (RELIABILITY.md).

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request};
use hmac::{Hmac, KeyInit, Mac};
use proptest::prelude::*;
use proptest::test_runner::Config;
use secrecy::SecretString;
use sha2::Sha256;
use tokio::sync::mpsc;
use tower::ServiceExt;

use super::*;

const SECRET: &str = "fuzz-webhook-secret";

/// Header names the handler reads, plus a few it does not.
const HEADERS: &[&str] = &[
    "x-github-event",
    "x-gitea-event",
    "x-forgejo-event",
    "x-gogs-event",
    "x-hub-signature-256",
    "x-hub-signature",
    "x-gitea-signature",
    "x-forgejo-signature",
    "x-gogs-signature",
    "x-github-delivery",
    "x-gitea-delivery",
    "content-type",
    "content-length",
    "transfer-encoding",
    "x-unrelated",
];

/// Event names the forges send, and nonsense.
const EVENTS: &[&str] = &[
    "push",
    "ping",
    "create",
    "delete",
    "release",
    "Push",
    "",
    "push,ping",
    "\t",
];

fn sign(body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).expect("any key length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// How the body is made.
#[derive(Debug, Clone)]
enum BodyShape {
    /// Arbitrary bytes.
    Bytes(Vec<u8>),
    /// A JSON object with a `ref` (any text) and maybe `zen` (a ping).
    Json { reference: String, ping: bool },
    /// A push to the followed branch, the one delivery that nudges.
    Push,
}

fn body_shape() -> impl Strategy<Value = BodyShape> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512).prop_map(BodyShape::Bytes),
        (
            "(refs/heads/|refs/tags/|)[a-z/]{0,12}|.{0,30}",
            any::<bool>()
        )
            .prop_map(|(reference, ping)| BodyShape::Json { reference, ping }),
        Just(BodyShape::Push),
    ]
}

impl BodyShape {
    fn bytes(&self) -> Vec<u8> {
        match self {
            BodyShape::Bytes(bytes) => bytes.clone(),
            BodyShape::Json { reference, ping } => {
                let mut value = serde_json::json!({ "ref": reference });
                if *ping {
                    value["zen"] = "Keep it logically awesome.".into();
                    value["hook_id"] = 1.into();
                }
                value.to_string().into_bytes()
            }
            BodyShape::Push => br#"{"ref":"refs/heads/main","after":"00"}"#.to_vec(),
        }
    }
}

/// How the signature header is filled.
#[derive(Debug, Clone)]
enum Signing {
    /// No signature header.
    None,
    /// The right HMAC, in the provider's format.
    Valid,
    /// The right HMAC under the other providers' format (prefix or no prefix).
    OtherFormat,
    /// Arbitrary header bytes.
    Garbage(Vec<u8>),
    /// Two signature headers, one valid.
    Repeated,
}

fn signing() -> impl Strategy<Value = Signing> {
    prop_oneof![
        Just(Signing::None),
        Just(Signing::Valid),
        Just(Signing::OtherFormat),
        proptest::collection::vec(any::<u8>(), 0..100).prop_map(Signing::Garbage),
        Just(Signing::Repeated),
    ]
}

#[derive(Debug, Clone)]
struct Delivery {
    method: Method,
    path: String,
    headers: Vec<(usize, Vec<u8>)>,
    event: Option<usize>,
    body: BodyShape,
    signing: Signing,
    /// Whether the path is one of the hook routes (a provider's index otherwise random).
    provider: usize,
}

fn delivery() -> impl Strategy<Value = Delivery> {
    (
        prop_oneof![
            6 => Just(Method::POST),
            1 => Just(Method::GET),
            1 => Just(Method::PUT),
        ],
        prop_oneof![
            8 => Just(None),
            1 => "/[a-z/.]{0,20}".prop_map(Some),
        ],
        0..Provider::ALL.len(),
        proptest::collection::vec(
            (
                0..HEADERS.len(),
                proptest::collection::vec(any::<u8>(), 0..80),
            ),
            0..6,
        ),
        proptest::option::of(0..EVENTS.len()),
        body_shape(),
        signing(),
    )
        .prop_map(
            |(method, path, provider, headers, event, body, signing)| Delivery {
                method,
                path: path.unwrap_or_else(|| Provider::ALL[provider].path().to_owned()),
                headers,
                event,
                body,
                signing,
                provider,
            },
        )
}

impl Delivery {
    fn request(&self) -> Request<Body> {
        let provider = Provider::ALL[self.provider];
        let body = self.body.bytes();
        let mut builder = Request::builder()
            .method(self.method.clone())
            .uri(&self.path);
        if let Some(event) = self.event {
            builder = builder.header(provider.event_headers()[0], EVENTS[event]);
        }
        let digest = sign(&body);
        let prefixed = format!("sha256={digest}");
        let (valid, other) = match provider {
            Provider::GitHub => (prefixed, digest),
            _ => (digest, prefixed),
        };
        let name = provider.signature_headers()[0];
        builder = match &self.signing {
            Signing::None => builder,
            Signing::Valid => builder.header(name, valid),
            Signing::OtherFormat => builder.header(name, other),
            Signing::Garbage(bytes) => match HeaderValue::from_bytes(bytes) {
                Ok(value) => builder.header(name, value),
                Err(_) => builder,
            },
            Signing::Repeated => builder.header(name, valid).header(name, "sha256=00"),
        };
        for (header, value) in &self.headers {
            // Values HTTP cannot carry (control characters) never reach a handler.
            if let Ok(value) = HeaderValue::from_bytes(value) {
                builder = builder.header(HeaderName::from_static(HEADERS[*header]), value);
            }
        }
        builder.body(Body::from(body)).expect("a valid request")
    }

    fn is_hook_route(&self) -> bool {
        self.method == Method::POST && Provider::ALL.iter().any(|p| p.path() == self.path)
    }
}

fn config(ci_cases: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = ci_cases;
    }
    config
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn the_router_never_panics_and_answers_2xx_or_4xx_to_any_delivery(
        deliveries in proptest::collection::vec(delivery(), 1..8),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let (tx, mut rx) = mpsc::channel(1);
            let state = WebhookState::new(SecretString::from(SECRET), "main", tx);
            let metrics = Arc::clone(&state.metrics);
            let router = router(state);
            let mut routed = 0u64;
            for delivery in &deliveries {
                let response = router
                    .clone()
                    .oneshot(delivery.request())
                    .await
                    .expect("the router is infallible");
                let status = response.status();
                prop_assert!(
                    status.is_success() || status.is_client_error(),
                    "{status} for {delivery:?}"
                );
                if delivery.is_hook_route() {
                    routed += 1;
                }
                // Drain sometimes, so both "accepted" and "coalesced" happen.
                if routed.is_multiple_of(3) {
                    let _ = rx.try_recv();
                }
            }
            let counts = metrics.snapshot();
            prop_assert_eq!(
                counts.accepted + counts.rejected + counts.ignored + counts.coalesced,
                routed,
                "every delivery to a hook route counts once: {:?}",
                counts
            );
            Ok(())
        })?;
    }
}
