//! OpenPGP signatures on commits (`gpg.format = openpgp`, git's default): an armored
//! detached signature over the commit without its signature header, checked against the
//! armored public keys of `[source] gpg_keyring_file` with rPGP. A signature counts when a
//! key of the file (its primary key or a subkey bound to it, issuer matched by key id or
//! fingerprint) verifies it, that key is not revoked, and it had not expired when the
//! signature was made. Algorithms: those rPGP verifies (RSA, DSA, ECDSA, EdDSA/Ed25519,
//! Ed448). Web-of-trust levels are not modelled: a key in the file is trusted.

use pgp::composed::{Deserializable, DetachedSignature, SignedPublicKey};
use pgp::packet::Signature;
use pgp::types::{KeyDetails, VerifyingKey};

use super::Why;

/// The keys of the keyring file.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    keys: Vec<SignedPublicKey>,
}

impl Keyring {
    /// Parses armored public keys (one or more blocks).
    ///
    /// # Errors
    /// The text holds no key, or a key does not parse or its self-signatures do not verify.
    pub fn parse(text: &str) -> Result<Keyring, String> {
        let (keys, _) = SignedPublicKey::from_string_many(text)
            .map_err(|error| format!("not armored OpenPGP public keys: {error}"))?;
        let mut parsed = Vec::new();
        for (index, key) in keys.enumerate() {
            let key = key.map_err(|error| format!("key {} does not parse: {error}", index + 1))?;
            key.verify_bindings().map_err(|error| {
                format!(
                    "key {} ({}) has a self-signature that does not verify: {error}",
                    index + 1,
                    key.fingerprint()
                )
            })?;
            parsed.push(key);
        }
        if parsed.is_empty() {
            return Err(
                "no OpenPGP public key in the file (export one with `gpg --armor --export KEYID`)"
                    .to_owned(),
            );
        }
        Ok(Keyring { keys: parsed })
    }

    /// How many keys the file holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the file holds no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Verifies `armored` over `payload`; returns the fingerprint of the primary key.
    ///
    /// # Errors
    /// Why the signature is not good by a key of the file.
    pub fn verify(&self, armored: &str, payload: &[u8]) -> Result<String, Why> {
        let (signature, _) = DetachedSignature::from_string(armored.trim()).map_err(|error| {
            Why::BadSignature(format!("the OpenPGP signature does not parse: {error}"))
        })?;
        let sig = &signature.signature;
        let issuer = issuer_text(sig);
        let mut matched = false;
        for key in &self.keys {
            let primary_expiry = key
                .details
                .users
                .iter()
                .flat_map(|u| u.signatures.iter())
                .chain(key.details.direct_signatures.iter())
                .filter_map(|s| s.key_expiration_time().map(|d| u64::from(d.as_secs())))
                .filter(|secs| *secs > 0)
                .max();
            let mut found = check(&signature, payload, key, primary_expiry);
            for subkey in &key.public_subkeys {
                if found.is_some() {
                    break;
                }
                let expiry = subkey
                    .signatures
                    .iter()
                    .filter_map(|s| s.key_expiration_time().map(|d| u64::from(d.as_secs())))
                    .filter(|secs| *secs > 0)
                    .max();
                found = check(&signature, payload, subkey, expiry);
            }
            let Some(good) = found else { continue };
            matched = true;
            let fingerprint = key.fingerprint().to_string();
            match good {
                Checked::Bad => continue,
                _ if !key.details.revocation_signatures.is_empty() => {
                    return Err(Why::KeyNotAllowed(format!(
                        "OpenPGP key {fingerprint} is revoked"
                    )));
                }
                Checked::Expired => {
                    return Err(Why::Expired(format!(
                        "OpenPGP key {fingerprint} had expired when the commit was signed"
                    )));
                }
                Checked::Good => return Ok(fingerprint),
            }
        }
        if matched {
            Err(Why::BadSignature(format!(
                "OpenPGP key {issuer}: the signature does not match the commit"
            )))
        } else {
            Err(Why::KeyNotAllowed(format!(
                "OpenPGP key {issuer} is not in gpg_keyring_file"
            )))
        }
    }
}

/// What one key of the file made of a signature it issued.
enum Checked {
    Good,
    Bad,
    Expired,
}

/// `None` when `key` did not issue the signature.
fn check<K: VerifyingKey + KeyDetails>(
    signature: &DetachedSignature,
    payload: &[u8],
    key: &K,
    expiry: Option<u64>,
) -> Option<Checked> {
    let sig = &signature.signature;
    if !issued_by(sig, key) {
        return None;
    }
    if signature.verify(key, payload).is_err() {
        return Some(Checked::Bad);
    }
    if let (Some(expiry), Some(made)) = (expiry, sig.created())
        && u64::from(made.as_secs()) >= u64::from(key.created_at().as_secs()) + expiry
    {
        return Some(Checked::Expired);
    }
    Some(Checked::Good)
}

fn issued_by<K: KeyDetails>(sig: &Signature, key: &K) -> bool {
    let id = key.legacy_key_id();
    let fingerprint = key.fingerprint();
    sig.issuer_key_id().into_iter().any(|i| *i == id)
        || sig
            .issuer_fingerprint()
            .into_iter()
            .any(|f| *f == fingerprint)
}

fn issuer_text(sig: &Signature) -> String {
    if let Some(fingerprint) = sig.issuer_fingerprint().first() {
        return fingerprint.to_string();
    }
    sig.issuer_key_id()
        .first()
        .map_or_else(|| "(no issuer)".to_owned(), |id| format!("{id:?}"))
}
