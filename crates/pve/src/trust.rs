//! `Trust`: how the client decides to trust PVE's TLS certificate, and the rustls config for it.
//!
//! Three modes, chosen by the config layer (this crate reads no config file and picks no
//! default path): a CA file in PEM (PVE's `/etc/pve/pve-root-ca.pem` is the usual one), a
//! SHA-256 fingerprint pin of the node's certificate as PVE shows it
//! (`AB:CD:...`, compared case-insensitively), or `Insecure`, which accepts any certificate
//! and logs a warning every time a client is built. The pin and insecure modes still verify
//! the handshake signatures with the ring provider's algorithms, so the peer must hold the
//! private key of the certificate it presents.
//!
//! The ring provider is passed explicitly: reqwest is built with `rustls-no-provider`.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::{CertificateError, DigitallySignedStruct, OtherError, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use sha2::{Digest, Sha256};

use crate::error::PveError;

/// How to trust the PVE server's certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// Verify the chain and host name against the CA certificates in this PEM file.
    CaFile(PathBuf),
    /// Accept exactly the end-entity certificate with this SHA-256 fingerprint
    /// (colon-separated hex as PVE shows it; case-insensitive).
    Fingerprint(String),
    /// Accept any certificate. For labs only; a warning is logged for every client built.
    Insecure,
}

/// A SHA-256 certificate fingerprint.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Parses `AB:CD:...` (32 bytes, any case); plain 64-digit hex is accepted too.
    ///
    /// # Errors
    /// [`PveError::InvalidFingerprint`] when the text is not 32 hex bytes.
    pub fn parse(text: &str) -> Result<Self, PveError> {
        let invalid = || PveError::InvalidFingerprint {
            value: text.to_owned(),
        };
        let compact: String = text.trim().split(':').collect();
        let has_colons = text.contains(':');
        if has_colons && text.trim().split(':').any(|b| b.len() != 2) {
            return Err(invalid());
        }
        let bytes = hex::decode(compact).map_err(|_| invalid())?;
        let array: [u8; 32] = bytes.try_into().map_err(|_| invalid())?;
        Ok(Self(array))
    }

    /// The fingerprint of a DER certificate.
    pub fn of_certificate(der: &[u8]) -> Self {
        let digest = Sha256::digest(der);
        let mut out = [0u8; 32];
        out.copy_from_slice(digest.as_slice());
        Self(out)
    }
}

impl fmt::Display for Fingerprint {
    /// Upper-case colon-separated hex, as PVE's GUI and `pvenode cert info` show it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{b:02X}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// The verifier's refusal, carried inside rustls' error so the client can report it plainly.
#[derive(Debug, thiserror::Error)]
#[error("certificate fingerprint {actual} does not match the pinned fingerprint {expected}")]
pub(crate) struct PinMismatch {
    pub(crate) expected: Fingerprint,
    pub(crate) actual: Fingerprint,
}

/// Accepts the end-entity certificate by fingerprint (or any, when `pin` is `None`), and
/// checks handshake signatures with the provider's algorithms.
#[derive(Debug)]
struct PinnedVerifier {
    pin: Option<Fingerprint>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // PVE's node certificates are self-signed or signed by the cluster CA and usually do
        // not match the name used to reach the node: the pin replaces chain and name checks.
        if let Some(expected) = self.pin {
            let actual = Fingerprint::of_certificate(end_entity.as_ref());
            if actual != expected {
                return Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                    OtherError(Arc::new(PinMismatch { expected, actual })),
                )));
            }
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Builds the rustls client config for `trust` with the ring provider.
///
/// # Errors
/// Unreadable or empty CA file, malformed fingerprint, or a provider/protocol mismatch.
pub(crate) fn tls_config(trust: &Trust) -> Result<rustls::ClientConfig, PveError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| PveError::TlsSetup { source })?;
    let config = match trust {
        Trust::CaFile(path) => {
            let pem = std::fs::read(path).map_err(|source| PveError::CaFile {
                path: path.clone(),
                source,
            })?;
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem).flatten() {
                // A bad entry among good ones is skipped; none usable is an error below.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(PveError::NoCaCertificate { path: path.clone() });
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        Trust::Fingerprint(text) => {
            let pin = Fingerprint::parse(text)?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                    pin: Some(pin),
                    algorithms,
                }))
                .with_no_client_auth()
        }
        Trust::Insecure => {
            tracing::warn!(
                "TLS certificate verification is disabled (insecure): any server can \
                 impersonate PVE; use a CA file or a fingerprint pin"
            );
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                    pin: None,
                    algorithms,
                }))
                .with_no_client_auth()
        }
    };
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIN: &str = "94:fd:ac:e7:d5:36:0e:11:5b:23:05:40:d2:a4:e1:8a:c1:52:41:01:07:28:c0:4d:c5:ee:df:7f:7c:03:ab:41";

    #[test]
    fn fingerprint_parses_pve_notation_case_insensitively() {
        let lower = Fingerprint::parse(PIN).unwrap();
        let upper = Fingerprint::parse(&PIN.to_uppercase()).unwrap();
        assert_eq!(lower, upper);
        assert_eq!(lower.to_string(), PIN.to_uppercase());
        let plain = Fingerprint::parse(&PIN.replace(':', "")).unwrap();
        assert_eq!(plain, lower);
    }

    #[test]
    fn fingerprint_rejects_wrong_lengths_and_grouping() {
        for bad in [
            "",
            "94:fd",
            &PIN[3..],
            &format!("{PIN}:00"),
            "9:4fd:ac",
            "zz",
        ] {
            assert!(
                matches!(
                    Fingerprint::parse(bad),
                    Err(PveError::InvalidFingerprint { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn ca_file_errors_name_the_file() {
        let missing = Trust::CaFile("/nonexistent/pve-root-ca.pem".into());
        let err = tls_config(&missing).unwrap_err();
        assert_eq!(
            err.to_string(),
            "reading CA file /nonexistent/pve-root-ca.pem"
        );
        let dir = std::env::temp_dir().join(format!("proxops-pve-ca-{}", std::process::id()));
        std::fs::write(&dir, "not a certificate\n").unwrap();
        let err = tls_config(&Trust::CaFile(dir.clone())).unwrap_err();
        assert!(matches!(err, PveError::NoCaCertificate { .. }));
        std::fs::remove_file(dir).unwrap();
    }

    #[test]
    fn insecure_mode_warns_every_time_a_config_is_built() {
        use std::sync::{Arc, Mutex};

        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tls_config(&Trust::Insecure).unwrap();
            tls_config(&Trust::Insecure).unwrap();
            tls_config(&Trust::Fingerprint(PIN.into())).unwrap();
        });
        let logs = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(logs.matches("WARN").count(), 2, "{logs}");
        assert!(logs.contains("verification is disabled"));
    }

    #[test]
    fn pin_and_insecure_modes_build() {
        assert!(tls_config(&Trust::Fingerprint(PIN.into())).is_ok());
        assert!(tls_config(&Trust::Insecure).is_ok());
    }

    #[test]
    fn verifier_refuses_a_certificate_with_another_fingerprint() {
        let cert = CertificateDer::from(vec![1u8, 2, 3]);
        let verifier = PinnedVerifier {
            pin: Some(Fingerprint::parse(PIN).unwrap()),
            algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        };
        let name = ServerName::try_from("pve1").unwrap();
        let err = verifier
            .verify_server_cert(&cert, &[], &name, &[], UnixTime::now())
            .unwrap_err();
        let rustls::Error::InvalidCertificate(CertificateError::Other(other)) = &err else {
            panic!("unexpected {err:?}");
        };
        let mismatch = other.0.downcast_ref::<PinMismatch>().unwrap();
        assert_eq!(mismatch.expected.to_string(), PIN.to_uppercase());
        assert!(
            mismatch
                .to_string()
                .contains("does not match the pinned fingerprint")
        );
        let accepting = PinnedVerifier {
            pin: Some(Fingerprint::of_certificate(&[1, 2, 3])),
            algorithms: verifier.algorithms,
        };
        assert!(
            accepting
                .verify_server_cert(&cert, &[], &name, &[], UnixTime::now())
                .is_ok()
        );
    }
}
