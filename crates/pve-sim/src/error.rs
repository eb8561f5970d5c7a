//! Errors: [`SimError`] for the library's callers (starting the simulator) and `ApiError`,
//! a failure answered to an HTTP client the way pveproxy answers it (status, reason phrase,
//! body).

use std::collections::BTreeMap;

/// Why the simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The seed is inconsistent.
    #[error("loading the seed")]
    Seed(#[from] crate::seed::SeedError),
    /// The self-signed certificate could not be made or loaded.
    #[error("making the TLS certificate: {0}")]
    Tls(String),
    /// The listener has no local address.
    #[error("reading the listener address")]
    Listener(#[source] std::io::Error),
    /// A storage directory under `SimConfig::storage_root` could not be created.
    #[error("creating the storage directories")]
    StorageRoot(#[source] std::io::Error),
}

/// A failed API request, answered as PVE answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// A handler `die`: status (usually 500) and the message with its trailing newline.
    Die { status: u16, message: String },
    /// Parameter errors (400), keyed by parameter.
    Params(BTreeMap<String, String>),
    /// Authentication failed (401, empty body); the text is the reason phrase.
    Unauthorized(String),
    /// Permission check failed (403).
    Forbidden(String),
    /// No such method or path (501).
    NotImplemented { method: String, path: String },
    /// Node-to-node proxy failure (595/596), empty body.
    Proxy { status: u16, reason: String },
}

impl ApiError {
    /// A plain `die "<message>\n"` in a handler: 500.
    pub(crate) fn die(message: impl Into<String>) -> Self {
        let mut message = message.into();
        if !message.ends_with('\n') {
            message.push('\n');
        }
        Self::Die {
            status: 500,
            message,
        }
    }

    /// `raise_param_exc({ <param> => <message> })`: 400.
    pub(crate) fn param(param: &str, message: impl Into<String>) -> Self {
        Self::Params(BTreeMap::from([(param.to_string(), message.into())]))
    }

    /// `raise_perm_exc`: 403.
    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        let mut message = message.into();
        if !message.ends_with('\n') {
            message.push('\n');
        }
        Self::Forbidden(message)
    }
}

impl ApiError {
    /// The message text without its trailing newline (for task failures built from API
    /// errors).
    pub(crate) fn text(&self) -> String {
        match self {
            ApiError::Die { message, .. } | ApiError::Forbidden(message) => {
                message.trim_end().to_string()
            }
            ApiError::Params(errors) => errors
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join("; "),
            ApiError::Unauthorized(r) => r.clone(),
            ApiError::NotImplemented { method, path } => {
                format!("Method '{method} {path}' not implemented")
            }
            ApiError::Proxy { reason, .. } => reason.clone(),
        }
    }
}

/// Result of an API handler.
pub(crate) type ApiResult<T = serde_json::Value> = Result<T, ApiError>;
