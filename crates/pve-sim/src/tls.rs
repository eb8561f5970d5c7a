//! The self-signed certificate made at start (as a fresh PVE node has one) and the rustls
//! server configuration; the fingerprint is printed the way PVE shows it (SHA-256,
//! colon-separated upper-case hex).

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};

use crate::error::SimError;

/// A certificate with its server configuration.
pub(crate) struct Certificate {
    pub(crate) config: Arc<rustls::ServerConfig>,
    pub(crate) fingerprint: String,
}

/// Installs the ring provider as the process default; a provider already installed (by us
/// or the embedding program) is fine.
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Makes a self-signed certificate for `localhost`, `127.0.0.1` and `::1` (plus `extra`).
pub(crate) fn self_signed(extra_names: &[String]) -> Result<Certificate, SimError> {
    install_crypto_provider();
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    names.extend(extra_names.iter().cloned());
    let certified =
        rcgen::generate_simple_self_signed(names).map_err(|e| SimError::Tls(e.to_string()))?;
    let cert_der: CertificateDer<'static> = certified.cert.der().clone();
    let fingerprint = fingerprint(cert_der.as_ref());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| SimError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(vec![cert_der], key)
        .map_err(|e| SimError::Tls(e.to_string()))?;
    // pveproxy speaks HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Certificate {
        config: Arc::new(config),
        fingerprint,
    })
}

/// `AB:CD:...` SHA-256 of the DER certificate.
pub(crate) fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}
