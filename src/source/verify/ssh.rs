//! SSH signatures on commits (`gpg.format = ssh`): an armored SSHSIG
//! (OpenSSH `PROTOCOL.sshsig`) over the commit without its signature header, checked as
//! `ssh-keygen -Y verify -n git -Overify-time=<committer time>` checks it against the
//! allowed signers file (git/git @ 1a3e64c6c4, `gpg-interface.c`, `verify_ssh_signed_buffer`;
//! the time is the `committer` line's, `parse_payload_metadata`). Algorithms:
//! ssh-ed25519, ssh-rsa (rsa-sha2-256/512 signatures), ecdsa-sha2-nistp256/384/521 and the
//! security-key variants `ssh-key` verifies (sk-ssh-ed25519, sk-ecdsa-sha2-nistp256).

use ssh_key::{HashAlg, SshSig};

use super::Why;
use super::allowed_signers::Entry;

/// The namespace git signs commits in.
pub const NAMESPACE: &str = "git";

/// Verifies `armored` over `payload` made at `time` (committer time, seconds since the epoch)
/// against `signers`; returns the principals of the line that allowed it.
///
/// # Errors
/// Why the signature is not good by an allowed key.
pub fn verify(signers: &[Entry], armored: &str, payload: &[u8], time: i64) -> Result<String, Why> {
    let signature = SshSig::from_pem(armored.trim())
        .map_err(|error| Why::BadSignature(format!("the SSH signature does not parse: {error}")))?;
    if signature.namespace() != NAMESPACE {
        return Err(Why::WrongNamespace(format!(
            "signed in namespace `{}`, not `{NAMESPACE}`",
            signature.namespace()
        )));
    }
    let key = signature.public_key();
    let fingerprint = ssh_key::PublicKey::from(key.clone()).fingerprint(HashAlg::Sha256);
    let listed: Vec<&Entry> = signers.iter().filter(|e| e.key.key_data() == key).collect();
    if listed.is_empty() {
        return Err(Why::KeyNotAllowed(format!(
            "SSH key {fingerprint} is not in allowed_signers_file"
        )));
    }
    let for_git: Vec<&Entry> = listed
        .iter()
        .copied()
        .filter(|e| e.allows_namespace(NAMESPACE))
        .collect();
    let Some(first) = for_git.first() else {
        return Err(Why::WrongNamespace(format!(
            "SSH key {fingerprint} is not allowed for namespace `{NAMESPACE}` (allowed_signers_file line {})",
            listed[0].line
        )));
    };
    let Some(valid) = for_git.iter().find(|e| e.valid_at(time)) else {
        return Err(Why::Expired(format!(
            "SSH key {fingerprint} is not valid at the commit's time (allowed_signers_file line {})",
            first.line
        )));
    };
    valid
        .key
        .verify(NAMESPACE, payload, &signature)
        .map_err(|_| {
            Why::BadSignature(format!(
                "SSH key {fingerprint}: the signature does not match the commit"
            ))
        })?;
    Ok(valid.principals.clone())
}
