//! Webhook signature verification: HMAC-SHA256 of the raw request body under the shared secret.
//!
//! Pure: it takes the headers and the body bytes exactly as received (never a re-serialised
//! JSON value, which would not hash the same) and answers yes or no. The comparison is
//! constant-time (`Mac::verify_slice`). Anything that is not exactly the expected digest (bad
//! hex, wrong length, missing `sha256=` prefix, an empty value, a repeated header) is a mismatch.
//! Errors name the header, never the secret or the signature value.

use axum::http::HeaderMap;
use hmac::{Hmac, KeyInit, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

use super::provider::{HeaderLookup, Provider, lookup};

/// Why a delivery's signature was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The request carries none of the provider's signature headers.
    #[error("missing signature header {header}")]
    Missing {
        /// The header the provider signs with.
        header: &'static str,
    },
    /// The signature header is present but is not the body's HMAC-SHA256 under our secret.
    #[error("signature in {header} does not match the body")]
    Mismatch {
        /// The header that was checked.
        header: &'static str,
    },
    /// The configured secret is empty, so any sender could sign: every delivery is refused.
    #[error("no webhook secret configured")]
    NoSecret,
}

/// Checks that `raw_body` is signed with `secret` the way `provider` signs its deliveries.
///
/// GitHub: `X-Hub-Signature-256: sha256=<hex>`; Gitea: `X-Gitea-Signature: <hex>`; Forgejo:
/// `X-Forgejo-Signature: <hex>` (or, when absent, `X-Gitea-Signature`, which Forgejo also
/// sends); Gogs: `X-Gogs-Signature: <hex>`.
///
/// # Errors
///
/// [`SignatureError::Missing`] when no signature header is present, [`SignatureError::Mismatch`]
/// for anything but the exact digest, [`SignatureError::NoSecret`] when `secret` is empty.
pub fn verify(
    provider: Provider,
    secret: &SecretString,
    headers: &HeaderMap,
    raw_body: &[u8],
) -> Result<(), SignatureError> {
    let key = secret.expose_secret().as_bytes();
    if key.is_empty() {
        return Err(SignatureError::NoSecret);
    }
    let (header, value) = match lookup(headers, provider.signature_headers()) {
        HeaderLookup::One { name, value } => (name, value),
        HeaderLookup::Repeated { name } => return Err(SignatureError::Mismatch { header: name }),
        HeaderLookup::Absent => {
            let header = provider.signature_headers()[0];
            return Err(SignatureError::Missing { header });
        }
    };
    let mismatch = SignatureError::Mismatch { header };
    let digest = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix(provider.signature_prefix()))
        .and_then(|hex_digest| hex::decode(hex_digest).ok())
        .ok_or_else(|| mismatch.clone())?;
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(raw_body);
    // verify_slice compares in constant time and rejects a digest of the wrong length.
    mac.verify_slice(&digest).map_err(|_| mismatch)
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderName, HeaderValue};
    use serde::Deserialize;

    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/webhooks");

    #[derive(Deserialize)]
    struct Vectors {
        vectors: Vec<Vector>,
    }

    #[derive(Deserialize)]
    struct Vector {
        name: String,
        provider: String,
        secret: Option<String>,
        body_utf8: Option<String>,
        body_file: Option<String>,
        #[serde(default)]
        headers: std::collections::BTreeMap<String, String>,
        #[serde(default)]
        expect: std::collections::BTreeMap<String, String>,
        expect_valid: Option<bool>,
    }

    impl Vector {
        fn body(&self) -> Vec<u8> {
            match (&self.body_utf8, &self.body_file) {
                (Some(text), _) => text.as_bytes().to_vec(),
                (None, Some(file)) => std::fs::read(format!("{FIXTURES}/{file}")).unwrap(),
                (None, None) => panic!("{}: no body", self.name),
            }
        }

        /// The delivery's headers; the published GitHub vector only gives the expected header.
        fn header_map(&self) -> HeaderMap {
            let mut map = HeaderMap::new();
            for (name, value) in self.headers.iter().chain(&self.expect) {
                if let Ok(name) = HeaderName::try_from(name.as_str()) {
                    map.insert(name, HeaderValue::from_str(value).unwrap());
                }
            }
            map
        }

        fn provider(&self) -> Provider {
            Provider::ALL
                .into_iter()
                .find(|p| p.as_str() == self.provider)
                .unwrap()
        }
    }

    fn vectors() -> Vec<Vector> {
        let text = std::fs::read_to_string(format!("{FIXTURES}/hmac-vectors.json")).unwrap();
        serde_json::from_str::<Vectors>(&text).unwrap().vectors
    }

    fn secret(text: &str) -> SecretString {
        SecretString::from(text.to_owned())
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    const DOCS_SECRET: &str = "It's a Secret to Everybody";
    const DOCS_BODY: &[u8] = b"Hello, World!";
    const DOCS_SIGNATURE: &str =
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    #[test]
    fn github_published_test_vector_verifies() {
        let map = headers(&[("x-hub-signature-256", DOCS_SIGNATURE)]);
        assert_eq!(
            verify(Provider::GitHub, &secret(DOCS_SECRET), &map, DOCS_BODY),
            Ok(())
        );
    }

    #[test]
    fn every_vector_with_a_secret_verifies_or_fails_as_published() {
        let mut checked = 0;
        for vector in vectors() {
            let Some(key) = &vector.secret else { continue };
            let result = verify(
                vector.provider(),
                &secret(key),
                &vector.header_map(),
                &vector.body(),
            );
            let expect_valid = vector.expect_valid.unwrap_or(true);
            assert_eq!(result.is_ok(), expect_valid, "{}: {result:?}", vector.name);
            checked += 1;
        }
        assert_eq!(checked, 7, "vectors with a secret in hmac-vectors.json");
    }

    #[test]
    fn every_vector_fails_under_another_secret() {
        for vector in vectors() {
            let result = verify(
                vector.provider(),
                &secret("not-the-secret"),
                &vector.header_map(),
                &vector.body(),
            );
            assert!(
                matches!(result, Err(SignatureError::Mismatch { .. })),
                "{}: {result:?}",
                vector.name
            );
        }
    }

    #[test]
    fn every_vector_fails_on_a_body_one_byte_longer() {
        for vector in vectors() {
            let Some(key) = &vector.secret else { continue };
            let mut body = vector.body();
            body.push(b'\n');
            let result = verify(vector.provider(), &secret(key), &vector.header_map(), &body);
            assert!(result.is_err(), "{}", vector.name);
        }
    }

    #[test]
    fn gitea_and_forgejo_deliveries_verify_under_every_endpoint_whose_header_they_carry() {
        for vector in vectors() {
            if !vector.name.starts_with("derived-") || vector.secret.is_none() {
                continue;
            }
            let key = secret(vector.secret.as_deref().unwrap());
            let carried: &[Provider] = if vector.provider == "forgejo" {
                &Provider::ALL
            } else {
                &[Provider::GitHub, Provider::Gitea, Provider::Gogs]
            };
            for &provider in carried {
                let result = verify(provider, &key, &vector.header_map(), &vector.body());
                assert_eq!(result, Ok(()), "{} at {provider}", vector.name);
            }
        }
    }

    #[test]
    fn empty_signature_headers_from_a_forge_without_secret_are_rejected() {
        let vector = vectors()
            .into_iter()
            .find(|v| v.name == "derived-gitea-no-secret-configured")
            .unwrap();
        for provider in [
            Provider::GitHub,
            Provider::Gitea,
            Provider::Forgejo,
            Provider::Gogs,
        ] {
            let result = verify(
                provider,
                &secret("gitea-secret"),
                &vector.header_map(),
                &vector.body(),
            );
            assert!(result.is_err(), "{provider}: {result:?}");
        }
    }

    #[test]
    fn missing_signature_header_is_reported_by_name() {
        let sha1_only = headers(&[(
            "x-hub-signature",
            "sha1=d0f0febcb437e9164ab585df30914fd54d5f93cb",
        )]);
        assert_eq!(
            verify(
                Provider::GitHub,
                &secret(DOCS_SECRET),
                &sha1_only,
                DOCS_BODY
            ),
            Err(SignatureError::Missing {
                header: "x-hub-signature-256"
            })
        );
        assert_eq!(
            verify(
                Provider::Gogs,
                &secret(DOCS_SECRET),
                &HeaderMap::new(),
                DOCS_BODY
            ),
            Err(SignatureError::Missing {
                header: "x-gogs-signature"
            })
        );
    }

    #[test]
    fn malformed_signatures_are_mismatches() {
        let digest = DOCS_SIGNATURE.trim_start_matches("sha256=");
        let cases: &[(Provider, &'static str, String)] = &[
            (Provider::GitHub, "x-hub-signature-256", digest.to_owned()),
            (
                Provider::GitHub,
                "x-hub-signature-256",
                "sha256=zzzz".to_owned(),
            ),
            (
                Provider::GitHub,
                "x-hub-signature-256",
                "sha256=".to_owned(),
            ),
            (
                Provider::GitHub,
                "x-hub-signature-256",
                format!("sha1={digest}"),
            ),
            (
                Provider::GitHub,
                "x-hub-signature-256",
                format!("{DOCS_SIGNATURE}00"),
            ),
            (
                Provider::GitHub,
                "x-hub-signature-256",
                DOCS_SIGNATURE[..40].to_owned(),
            ),
            (
                Provider::Gitea,
                "x-gitea-signature",
                DOCS_SIGNATURE.to_owned(),
            ),
            (Provider::Gitea, "x-gitea-signature", format!("{digest}x")),
            (Provider::Gitea, "x-gitea-signature", String::new()),
        ];
        for &(provider, header, ref value) in cases {
            let map = headers(&[(header, value)]);
            assert_eq!(
                verify(provider, &secret(DOCS_SECRET), &map, DOCS_BODY),
                Err(SignatureError::Mismatch { header }),
                "{provider} {value:?}"
            );
        }
    }

    #[test]
    fn uppercase_hex_digest_is_the_same_digest() {
        let upper = DOCS_SIGNATURE
            .trim_start_matches("sha256=")
            .to_ascii_uppercase();
        let map = headers(&[("x-gitea-signature", &upper)]);
        assert_eq!(
            verify(Provider::Gitea, &secret(DOCS_SECRET), &map, DOCS_BODY),
            Ok(())
        );
    }

    #[test]
    fn repeated_signature_header_is_a_mismatch_even_if_one_value_is_right() {
        let map = headers(&[
            ("x-hub-signature-256", "sha256=00"),
            ("x-hub-signature-256", DOCS_SIGNATURE),
        ]);
        assert_eq!(
            verify(Provider::GitHub, &secret(DOCS_SECRET), &map, DOCS_BODY),
            Err(SignatureError::Mismatch {
                header: "x-hub-signature-256"
            })
        );
    }

    #[test]
    fn forgejo_falls_back_to_the_gitea_header_only_when_its_own_is_absent() {
        let digest = DOCS_SIGNATURE.trim_start_matches("sha256=");
        let gitea_only = headers(&[("x-gitea-signature", digest)]);
        assert_eq!(
            verify(
                Provider::Forgejo,
                &secret(DOCS_SECRET),
                &gitea_only,
                DOCS_BODY
            ),
            Ok(())
        );

        let bad_forgejo_good_gitea =
            headers(&[("x-forgejo-signature", "00"), ("x-gitea-signature", digest)]);
        assert_eq!(
            verify(
                Provider::Forgejo,
                &secret(DOCS_SECRET),
                &bad_forgejo_good_gitea,
                DOCS_BODY
            ),
            Err(SignatureError::Mismatch {
                header: "x-forgejo-signature"
            })
        );
    }

    #[test]
    fn empty_secret_refuses_even_a_matching_signature() {
        let empty_key_digest = {
            let mut mac = Hmac::<Sha256>::new_from_slice(b"").unwrap();
            mac.update(DOCS_BODY);
            hex::encode(mac.finalize().into_bytes())
        };
        let map = headers(&[("x-gogs-signature", &empty_key_digest)]);
        assert_eq!(
            verify(Provider::Gogs, &secret(""), &map, DOCS_BODY),
            Err(SignatureError::NoSecret)
        );
    }

    #[test]
    fn signature_errors_never_contain_the_secret_or_the_signature() {
        let map = headers(&[("x-hub-signature-256", "sha256=0123456789abcdef")]);
        let err = verify(Provider::GitHub, &secret(DOCS_SECRET), &map, DOCS_BODY).unwrap_err();
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains(DOCS_SECRET), "{text}");
            assert!(!text.contains("0123456789abcdef"), "{text}");
        }
    }
}
