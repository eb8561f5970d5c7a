//! The forges that can deliver webhooks, and the one table of which headers each of them uses.
//!
//! Signature checking (`signature.rs`) and event parsing (`event.rs`) both read their header
//! names from here, so adding a forge is one enum variant and one row per table, never a copy of
//! a handler. This module only names things; it reads no request.

use std::fmt;

use axum::http::{HeaderMap, HeaderValue};

/// A forge that sends webhooks to `/hooks/<provider>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// GitHub (also any forge that signs with `X-Hub-Signature-256`).
    GitHub,
    /// Gitea.
    Gitea,
    /// Forgejo.
    Forgejo,
    /// Gogs.
    Gogs,
}

impl Provider {
    /// Every provider, in route order.
    pub const ALL: [Provider; 4] = [
        Provider::GitHub,
        Provider::Gitea,
        Provider::Forgejo,
        Provider::Gogs,
    ];

    /// The lowercase name used in routes, logs and metrics (`github`, `gitea`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            Provider::GitHub => "github",
            Provider::Gitea => "gitea",
            Provider::Forgejo => "forgejo",
            Provider::Gogs => "gogs",
        }
    }

    /// The route this provider's deliveries are posted to.
    pub const fn path(self) -> &'static str {
        match self {
            Provider::GitHub => "/hooks/github",
            Provider::Gitea => "/hooks/gitea",
            Provider::Forgejo => "/hooks/forgejo",
            Provider::Gogs => "/hooks/gogs",
        }
    }

    /// Headers that may carry the signature, in order of preference: the first one *present*
    /// is the one checked (a later one is never consulted because an earlier one failed).
    ///
    /// Forgejo sends `X-Forgejo-Signature` and, with the same value, `X-Gitea-Signature`
    /// (`AddDefaultHeaders` in Forgejo's `services/webhook/shared/payloader.go`); the Gitea name
    /// is accepted when the Forgejo one is absent, for senders that only speak Gitea's headers.
    pub const fn signature_headers(self) -> &'static [&'static str] {
        match self {
            Provider::GitHub => &["x-hub-signature-256"],
            Provider::Gitea => &["x-gitea-signature"],
            Provider::Forgejo => &["x-forgejo-signature", "x-gitea-signature"],
            Provider::Gogs => &["x-gogs-signature"],
        }
    }

    /// What precedes the hex digest in the signature header (`sha256=` for GitHub only).
    pub const fn signature_prefix(self) -> &'static str {
        match self {
            Provider::GitHub => "sha256=",
            Provider::Gitea | Provider::Forgejo | Provider::Gogs => "",
        }
    }

    /// Headers that name the event (`push`, `ping`, ...), in order of preference.
    pub const fn event_headers(self) -> &'static [&'static str] {
        match self {
            Provider::GitHub => &["x-github-event"],
            Provider::Gitea => &["x-gitea-event"],
            Provider::Forgejo => &["x-forgejo-event", "x-gitea-event"],
            Provider::Gogs => &["x-gogs-event"],
        }
    }

    /// Headers that carry the forge's delivery id (only logged, to correlate with the forge's
    /// delivery history).
    pub const fn delivery_headers(self) -> &'static [&'static str] {
        match self {
            Provider::GitHub => &["x-github-delivery"],
            Provider::Gitea => &["x-gitea-delivery"],
            Provider::Forgejo => &["x-forgejo-delivery", "x-gitea-delivery"],
            Provider::Gogs => &["x-gogs-delivery"],
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a request holds under the first of several header names that is present.
#[derive(Debug)]
pub(crate) enum HeaderLookup<'h> {
    /// None of the names is present.
    Absent,
    /// The name is present exactly once.
    One {
        /// The name found.
        name: &'static str,
        /// Its value.
        value: &'h HeaderValue,
    },
    /// The name is present more than once: ambiguous, never trusted.
    Repeated {
        /// The name found.
        name: &'static str,
    },
}

/// Looks `names` up in order and reports the first one present.
pub(crate) fn lookup<'h>(headers: &'h HeaderMap, names: &[&'static str]) -> HeaderLookup<'h> {
    for &name in names {
        let mut values = headers.get_all(name).iter();
        if let Some(value) = values.next() {
            return match values.next() {
                None => HeaderLookup::One { name, value },
                Some(_) => HeaderLookup::Repeated { name },
            };
        }
    }
    HeaderLookup::Absent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_paths_end_with_the_provider_name() {
        for provider in Provider::ALL {
            assert_eq!(provider.path(), format!("/hooks/{provider}"));
        }
    }

    #[test]
    fn provider_header_names_are_lowercase_so_header_map_lookups_match() {
        for provider in Provider::ALL {
            let names = provider
                .signature_headers()
                .iter()
                .chain(provider.event_headers())
                .chain(provider.delivery_headers());
            for name in names {
                assert_eq!(*name, name.to_ascii_lowercase(), "{provider}: {name}");
            }
        }
    }
}
