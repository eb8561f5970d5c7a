//! Values from the cluster's SOPS document (cloud-init SSH keys and passwords) as the pure core
//! holds them.
//!
//! The binary resolves a VM's `ssh-key-refs` / `ci-password-ref` before planning and puts the
//! values into [`CloudInitData::resolved`](crate::manifest::CloudInitData) as [`Sealed`]s. The
//! planner compares with them (an SSH key set must match the live one) but never copies them
//! into a plan: a planned value is a [`marker`] naming the references
//! (`(secret: cloud-init.passwords.default)`), and the executor swaps the marker for the
//! sealed value when it builds the PVE request (`guest::sealed_value`). Plans, records, logs
//! and errors therefore hold names, never values.

use std::fmt;

use serde::{Serialize, Serializer};

/// What a sealed value prints as, wherever it is printed by accident.
pub const REDACTED: &str = "(secret)";

/// A secret value. `Debug` and `Serialize` print [`REDACTED`]; there is no `Display`; only
/// [`Sealed::expose`] gives the text, for the one place that sends it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Sealed(String);

impl Sealed {
    /// Seals `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself: only for comparing with PVE's value and for the request that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Drop for Sealed {
    /// Best effort without `unsafe` or a dependency: the bytes are overwritten before the
    /// memory is freed (`black_box` keeps the writes from being optimised away). Copies the
    /// allocator or `String` growth left behind are not reached.
    fn drop(&mut self) {
        let mut bytes = std::mem::take(&mut self.0).into_bytes();
        bytes.fill(0);
        std::hint::black_box(&bytes);
    }
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Sealed {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

/// A VM's cloud-init values that came from the cluster's SOPS document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ResolvedCloudInit {
    /// `ssh-key-refs`, resolved in list order: one OpenSSH public-key line each.
    pub ssh_keys: Vec<Sealed>,
    /// `ci-password-ref`, resolved.
    pub password: Option<Sealed>,
}

/// The value a plan carries for a key whose real value is sealed: the references it comes
/// from, e.g. `(secret: cloud-init.ssh-keys.admin, cloud-init.ssh-keys.deploy)`.
pub fn marker<S: AsRef<str>>(references: &[S]) -> String {
    let names: Vec<&str> = references.iter().map(AsRef::as_ref).collect();
    format!("(secret: {})", names.join(", "))
}

/// Whether a planned value is a [`marker`] (or [`REDACTED`]), which must never be sent as is.
pub fn is_marker(value: &str) -> bool {
    value == REDACTED || (value.starts_with("(secret: ") && value.ends_with(')'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_never_prints_in_debug_or_json() {
        let sealed = Sealed::new("s3cr3t-Passw0rd");
        let resolved = ResolvedCloudInit {
            ssh_keys: vec![Sealed::new("ssh-ed25519 AAAA admin@example")],
            password: Some(sealed.clone()),
        };
        let debug = format!("{resolved:?}");
        let json = serde_json::to_string(&resolved).unwrap_or_default();
        for text in [&debug, &json] {
            assert!(!text.contains("s3cr3t"), "{text}");
            assert!(!text.contains("AAAA"), "{text}");
            assert!(text.contains(REDACTED), "{text}");
        }
        assert_eq!(sealed.expose(), "s3cr3t-Passw0rd");
    }

    #[test]
    fn a_marker_names_the_references_and_is_recognised() {
        let m = marker(&["cloud-init.ssh-keys.admin", "cloud-init.ssh-keys.deploy"]);
        assert_eq!(
            m,
            "(secret: cloud-init.ssh-keys.admin, cloud-init.ssh-keys.deploy)"
        );
        assert!(is_marker(&m));
        assert!(is_marker(REDACTED));
        assert!(!is_marker("ssh-ed25519%20AAAA"));
    }
}
