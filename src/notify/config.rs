//! `[[notify]]` tables of agent.toml: the raw shape of one table and the validated
//! [`NotifyTarget`] the notifier uses. Every error names the table by its position
//! (`notify[1]`, counting from 0 as TOML arrays do), the key, and what to do; a secret read
//! from `token_file`, `url_file` or `password_file` is never echoed.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::config::ConfigError;

/// Default `max_per_minute`: messages one target gets per minute before the rest are
/// counted into one summary.
pub const DEFAULT_MAX_PER_MINUTE: u32 = 10;
/// Default `flap_window`: how long a resolved drift must stay resolved before
/// `drift-resolved` is announced (and within which a drift found again is not announced
/// again).
pub const DEFAULT_FLAP_WINDOW: Duration = Duration::from_secs(600);
/// Default `smtp_port` with `starttls = true` (submission, RFC 6409).
pub const DEFAULT_SUBMISSION_PORT: u16 = 587;
/// Default `smtp_port` with `starttls = false`.
pub const DEFAULT_SMTP_PORT: u16 = 25;

/// Which service a target is, and so which format its messages take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A JSON document of our own (docs/notify-webhook.schema.json), POSTed to `url`.
    Webhook,
    /// ntfy: JSON published to the server's root URL, the topic from `url`'s path.
    Ntfy,
    /// Matrix: an `m.room.message` sent to `room` on the homeserver at `url`.
    Matrix,
    /// A Slack incoming webhook: `text` and Block Kit `blocks`.
    Slack,
    /// Email over SMTP: plain text and HTML, multipart/alternative.
    Email,
}

impl Kind {
    /// The name in agent.toml.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Webhook => "webhook",
            Kind::Ntfy => "ntfy",
            Kind::Matrix => "matrix",
            Kind::Slack => "slack",
            Kind::Email => "email",
        }
    }
}

/// What a target can be told about. The approval events will join this list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// A pass wrote to PVE and every action succeeded.
    Applied,
    /// A pass failed: an action failed, or there was no revision to work on.
    Failed,
    /// The revision at HEAD does not validate.
    Invalid,
    /// Drift (or another finding) appeared.
    DriftFound,
    /// Drift went away and stayed away for the flap window.
    DriftResolved,
    /// The write circuit breaker opened: the agent writes nothing until its cool-down ends.
    ReadOnly,
    /// git cannot be fetched: the last good revision stays in force.
    Stale,
    /// Actions wait for `proxops approve` (`[policy] approve`), once per held change.
    AwaitingApproval,
}

impl EventKind {
    /// Every kind, in the documented order.
    pub const ALL: [EventKind; 8] = [
        EventKind::Applied,
        EventKind::Failed,
        EventKind::Invalid,
        EventKind::DriftFound,
        EventKind::DriftResolved,
        EventKind::ReadOnly,
        EventKind::Stale,
        EventKind::AwaitingApproval,
    ];

    /// The name in agent.toml and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Applied => "applied",
            EventKind::Failed => "failed",
            EventKind::Invalid => "invalid",
            EventKind::DriftFound => "drift-found",
            EventKind::DriftResolved => "drift-resolved",
            EventKind::ReadOnly => "read-only",
            EventKind::Stale => "stale",
            EventKind::AwaitingApproval => "awaiting-approval",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an HTTP target's messages go.
#[derive(Clone)]
pub struct HttpTarget {
    /// `url` (or the content of `url_file`): a Slack webhook's URL is itself a secret, so
    /// it is never logged; logs name the target by [`NotifyTarget::label`].
    pub url: reqwest::Url,
    /// `token_file`'s content: sent only as the `Authorization: Bearer` header, only to
    /// `url`'s host (redirects are not followed).
    pub token: Option<SecretString>,
    /// Matrix only: the room id (`!abc:example.org`) or alias.
    pub room: Option<String>,
}

impl fmt::Debug for HttpTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpTarget")
            .field("host", &self.url.host_str())
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("room", &self.room)
            .finish()
    }
}

/// An email target's SMTP settings.
#[derive(Clone)]
pub struct EmailTarget {
    /// `smtp_host`.
    pub smtp_host: String,
    /// `smtp_port` (587 with STARTTLS, 25 without, unless set).
    pub smtp_port: u16,
    /// `starttls` (default true): STARTTLS is required, never skipped.
    pub starttls: bool,
    /// `username` and `password_file`'s content, both or neither.
    pub credentials: Option<(String, SecretString)>,
    /// `from`, as an RFC 5322 mailbox.
    pub from: lettre::message::Mailbox,
    /// `to`: one or more mailboxes.
    pub to: Vec<lettre::message::Mailbox>,
}

impl fmt::Debug for EmailTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmailTarget")
            .field("smtp_host", &self.smtp_host)
            .field("smtp_port", &self.smtp_port)
            .field("starttls", &self.starttls)
            .field("username", &self.credentials.as_ref().map(|(u, _)| u))
            .field("from", &self.from.to_string())
            .field("to", &self.to.len())
            .finish()
    }
}

/// How a target is reached.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// webhook, ntfy, matrix, slack.
    Http(HttpTarget),
    /// email.
    Email(EmailTarget),
}

/// One validated `[[notify]]` table.
#[derive(Debug, Clone)]
pub struct NotifyTarget {
    /// Its position among the `[[notify]]` tables (from 0).
    pub index: usize,
    /// The service.
    pub kind: Kind,
    /// The events it wants (all when `events` is not set).
    pub events: BTreeSet<EventKind>,
    /// How it is reached.
    pub endpoint: Endpoint,
    /// `ca_file`: a PEM bundle trusted besides the system's roots (a private CA).
    pub ca_file: Option<PathBuf>,
    /// `max_per_minute`.
    pub max_per_minute: u32,
    /// `flap_window`.
    pub flap_window: Duration,
}

impl NotifyTarget {
    /// How logs and metrics name the target: `notify[0] ntfy ntfy.example.org`, never its
    /// URL's path or a token.
    pub fn label(&self) -> String {
        let host = match &self.endpoint {
            Endpoint::Http(http) => http.url.host_str().unwrap_or("").to_owned(),
            Endpoint::Email(email) => email.smtp_host.clone(),
        };
        format!("notify[{}] {} {host}", self.index, self.kind.as_str())
    }

    /// Whether the target wants `event`.
    pub fn wants(&self, event: EventKind) -> bool {
        self.events.contains(&event)
    }
}

/// One `[[notify]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNotify {
    kind: String,
    url: Option<String>,
    url_file: Option<PathBuf>,
    token_file: Option<PathBuf>,
    room: Option<String>,
    events: Option<Vec<String>>,
    ca_file: Option<PathBuf>,
    max_per_minute: Option<u32>,
    flap_window: Option<String>,
    smtp_host: Option<String>,
    smtp_port: Option<u16>,
    starttls: Option<bool>,
    username: Option<String>,
    password_file: Option<PathBuf>,
    from: Option<String>,
    to: Option<Vec<String>>,
}

/// What [`parse`] needs from the config loader: where agent.toml is, how a `*_file` path
/// resolves, and how a secret file is read (mode check, trailing newline, empty refused).
pub struct Loader<'a> {
    /// agent.toml, for messages.
    pub path: &'a Path,
    /// Resolves a `*_file` path (credentials directory, then the config's directory).
    pub resolve: &'a dyn Fn(&Path) -> PathBuf,
    /// Reads a secret file named by `key`.
    pub read_secret: &'a dyn Fn(&str, &Path) -> Result<SecretString, ConfigError>,
}

impl Loader<'_> {
    fn invalid(&self, index: usize, key: &str, message: impl Into<String>) -> ConfigError {
        let key = if key.is_empty() {
            format!("notify[{index}]")
        } else {
            format!("notify[{index}].{key}")
        };
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            key,
            message: message.into(),
        }
    }
}

/// Validates the `[[notify]]` tables (each a TOML table as the file has it).
///
/// # Errors
/// The first table that is wrong, named `notify[i].key`, with what to do.
pub fn parse(
    tables: Vec<toml::Table>,
    loader: &Loader<'_>,
) -> Result<Vec<NotifyTarget>, ConfigError> {
    tables
        .into_iter()
        .enumerate()
        .map(|(index, table)| parse_one(index, table, loader))
        .collect()
}

fn parse_one(
    index: usize,
    table: toml::Table,
    loader: &Loader<'_>,
) -> Result<NotifyTarget, ConfigError> {
    let raw: RawNotify = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| loader.invalid(index, "", e.message().to_owned()))?;
    let invalid = |key: &str, message: String| loader.invalid(index, key, message);
    let kind = match raw.kind.as_str() {
        "webhook" => Kind::Webhook,
        "ntfy" => Kind::Ntfy,
        "matrix" => Kind::Matrix,
        "slack" => Kind::Slack,
        "email" => Kind::Email,
        other => {
            return Err(invalid(
                "kind",
                format!(
                    "`{other}` is not a notification kind; use one of webhook, ntfy, matrix, \
                     slack, email"
                ),
            ));
        }
    };
    let events = match &raw.events {
        None => EventKind::ALL.into_iter().collect(),
        Some(names) if names.is_empty() => {
            return Err(invalid(
                "events",
                "is empty: list the events to send, or leave `events` out for all of them"
                    .to_owned(),
            ));
        }
        Some(names) => {
            let mut events = BTreeSet::new();
            for (i, name) in names.iter().enumerate() {
                let event = EventKind::parse(name).ok_or_else(|| {
                    invalid(
                        &format!("events[{i}]"),
                        format!(
                            "`{name}` is not an event; use some of {}",
                            EventKind::ALL.map(EventKind::as_str).join(", ")
                        ),
                    )
                })?;
                events.insert(event);
            }
            events
        }
    };
    let max_per_minute = raw.max_per_minute.unwrap_or(DEFAULT_MAX_PER_MINUTE);
    if max_per_minute == 0 {
        return Err(invalid(
            "max_per_minute",
            "must be at least 1 (remove the table to send nothing)".to_owned(),
        ));
    }
    let flap_window = match &raw.flap_window {
        None => DEFAULT_FLAP_WINDOW,
        Some(text) => humantime::parse_duration(text).map_err(|e| {
            invalid(
                "flap_window",
                format!("`{text}`: {e}; write a duration such as \"10m\" or \"0s\""),
            )
        })?,
    };
    let ca_file = raw.ca_file.as_deref().map(loader.resolve);
    let endpoint = match kind {
        Kind::Email => Endpoint::Email(email(index, &raw, loader)?),
        _ => Endpoint::Http(http(index, kind, &raw, loader)?),
    };
    Ok(NotifyTarget {
        index,
        kind,
        events,
        endpoint,
        ca_file,
        max_per_minute,
        flap_window,
    })
}

/// Keys only one kind takes, refused on the others so a typo'd kind is not silently ignored.
fn refuse_keys(
    index: usize,
    kind: Kind,
    keys: &[(&str, bool)],
    loader: &Loader<'_>,
) -> Result<(), ConfigError> {
    match keys.iter().find(|(_, set)| *set) {
        Some((key, _)) => Err(loader.invalid(
            index,
            key,
            format!("is not used by kind = \"{}\"; remove it", kind.as_str()),
        )),
        None => Ok(()),
    }
}

fn http(
    index: usize,
    kind: Kind,
    raw: &RawNotify,
    loader: &Loader<'_>,
) -> Result<HttpTarget, ConfigError> {
    let invalid = |key: &str, message: String| loader.invalid(index, key, message);
    refuse_keys(
        index,
        kind,
        &[
            ("smtp_host", raw.smtp_host.is_some()),
            ("smtp_port", raw.smtp_port.is_some()),
            ("starttls", raw.starttls.is_some()),
            ("username", raw.username.is_some()),
            ("password_file", raw.password_file.is_some()),
            ("from", raw.from.is_some()),
            ("to", raw.to.is_some()),
            ("room", raw.room.is_some() && kind != Kind::Matrix),
        ],
        loader,
    )?;
    let (text, key) = match (&raw.url, &raw.url_file) {
        (Some(url), None) => (SecretString::from(url.clone()), "url"),
        (None, Some(file)) => (
            (loader.read_secret)(&format!("notify[{index}].url_file"), file)?,
            "url_file",
        ),
        (None, None) => {
            return Err(invalid(
                "url",
                format!(
                    "missing: set url (or url_file, a file holding it, for a URL that is itself \
                     a secret such as a Slack webhook's){}",
                    match kind {
                        Kind::Ntfy => ", e.g. \"https://ntfy.example.org/proxops\"",
                        Kind::Matrix => ", the homeserver, e.g. \"https://matrix.example.org\"",
                        Kind::Slack => ", e.g. url_file = \"slack-webhook-url\"",
                        _ => "",
                    }
                ),
            ));
        }
        (Some(_), Some(_)) => {
            return Err(invalid("url", "set url or url_file, not both".to_owned()));
        }
    };
    // The URL text may be a secret (url_file): errors name the key, never the value.
    let url = reqwest::Url::parse(text.expose_secret().trim()).map_err(|e| {
        invalid(
            key,
            format!("not a URL ({e}); write it as https://host/path"),
        )
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(invalid(
            key,
            "must be an http:// or https:// URL with a host".to_owned(),
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(
            key,
            "must not carry credentials (user:password@); put a token in token_file".to_owned(),
        ));
    }
    if kind == Kind::Ntfy && topic_of(&url).is_none() {
        return Err(invalid(
            key,
            "names no topic: end the URL with the topic, e.g. \"https://ntfy.example.org/proxops\""
                .to_owned(),
        ));
    }
    let room = match (kind, &raw.room) {
        (Kind::Matrix, None) => {
            return Err(invalid(
                "room",
                "missing: the room id to post to, e.g. \"!AbCdEf:example.org\" (Room settings → \
                 Advanced)"
                    .to_owned(),
            ));
        }
        (Kind::Matrix, Some(room)) if !room.starts_with(['!', '#']) || !room.contains(':') => {
            return Err(invalid(
                "room",
                format!("`{room}` is not a room id (`!id:server`) or alias (`#name:server`)"),
            ));
        }
        (_, room) => room.clone(),
    };
    let token = raw
        .token_file
        .as_deref()
        .map(|f| (loader.read_secret)(&format!("notify[{index}].token_file"), f))
        .transpose()?;
    if kind == Kind::Matrix && token.is_none() {
        return Err(invalid(
            "token_file",
            "missing: Matrix needs the bot account's access token, in a file".to_owned(),
        ));
    }
    Ok(HttpTarget { url, token, room })
}

/// ntfy's topic: the last segment of the URL's path.
pub fn topic_of(url: &reqwest::Url) -> Option<String> {
    url.path_segments()?
        .rfind(|s| !s.is_empty())
        .map(str::to_owned)
}

fn email(index: usize, raw: &RawNotify, loader: &Loader<'_>) -> Result<EmailTarget, ConfigError> {
    let invalid = |key: &str, message: String| loader.invalid(index, key, message);
    refuse_keys(
        index,
        Kind::Email,
        &[
            ("url", raw.url.is_some()),
            ("url_file", raw.url_file.is_some()),
            ("token_file", raw.token_file.is_some()),
            ("room", raw.room.is_some()),
        ],
        loader,
    )?;
    let smtp_host = raw
        .smtp_host
        .clone()
        .filter(|h| !h.trim().is_empty())
        .ok_or_else(|| {
            invalid(
                "smtp_host",
                "missing: the SMTP server to submit to, e.g. \"smtp.example.org\"".to_owned(),
            )
        })?;
    let starttls = raw.starttls.unwrap_or(true);
    let smtp_port = raw.smtp_port.unwrap_or(if starttls {
        DEFAULT_SUBMISSION_PORT
    } else {
        DEFAULT_SMTP_PORT
    });
    let credentials = match (&raw.username, &raw.password_file) {
        (Some(user), Some(file)) => Some((
            user.clone(),
            (loader.read_secret)(&format!("notify[{index}].password_file"), file)?,
        )),
        (None, None) => None,
        (Some(_), None) => {
            return Err(invalid(
                "password_file",
                "missing: username is set, so name the file holding its password".to_owned(),
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                "username",
                "missing: password_file is set, so set the user it belongs to".to_owned(),
            ));
        }
    };
    if credentials.is_some() && !starttls {
        return Err(invalid(
            "starttls",
            "is false while a password is set: the password would cross the network in clear; \
             use starttls = true"
                .to_owned(),
        ));
    }
    let mailbox = |key: &str, text: &str| {
        text.parse::<lettre::message::Mailbox>().map_err(|e| {
            invalid(
                key,
                format!("`{text}` is not an email address ({e}); write \"ProxOps <proxops@example.org>\" or \"ops@example.org\""),
            )
        })
    };
    let from = mailbox(
        "from",
        raw.from.as_deref().ok_or_else(|| {
            invalid(
                "from",
                "missing: the sender address, e.g. \"ProxOps <proxops@example.org>\"".to_owned(),
            )
        })?,
    )?;
    let to_texts = raw.to.as_deref().unwrap_or_default();
    if to_texts.is_empty() {
        return Err(invalid(
            "to",
            "missing: a list of recipients, e.g. [\"ops@example.org\"]".to_owned(),
        ));
    }
    let to = to_texts
        .iter()
        .enumerate()
        .map(|(i, t)| mailbox(&format!("to[{i}]"), t))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(EmailTarget {
        smtp_host,
        smtp_port,
        starttls,
        credentials,
        from,
        to,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(toml_text: &str) -> Result<Vec<NotifyTarget>, String> {
        #[derive(Deserialize)]
        struct Doc {
            #[serde(default)]
            notify: Vec<toml::Table>,
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "tk_secret-token-value\n").unwrap();
        std::fs::write(dir.path().join("empty"), "").unwrap();
        let doc: Doc = toml::from_str(toml_text).unwrap();
        let base = dir.path().to_path_buf();
        let resolve = |f: &Path| base.join(f);
        let read_secret = |key: &str, f: &Path| -> Result<SecretString, ConfigError> {
            let text = std::fs::read_to_string(base.join(f)).map_err(|source| {
                ConfigError::SecretFile {
                    path: PathBuf::from("agent.toml"),
                    key: key.to_owned(),
                    file: f.to_path_buf(),
                    source,
                }
            })?;
            Ok(SecretString::from(text.trim_end().to_owned()))
        };
        let loader = Loader {
            path: Path::new("agent.toml"),
            resolve: &resolve,
            read_secret: &read_secret,
        };
        parse(doc.notify, &loader).map_err(|e| crate::error_chain::error_text(&e))
    }

    #[test]
    fn every_kind_loads_with_its_keys_and_all_events_by_default() {
        let targets = load(
            r#"
[[notify]]
kind = "webhook"
url = "https://hooks.example.org/proxops"
token_file = "token"
[[notify]]
kind = "ntfy"
url = "https://ntfy.example.org/proxops"
events = ["failed", "drift-found"]
[[notify]]
kind = "matrix"
url = "https://matrix.example.org"
room = "!abc:example.org"
token_file = "token"
[[notify]]
kind = "slack"
url_file = "token"
[[notify]]
kind = "email"
smtp_host = "smtp.example.org"
username = "proxops"
password_file = "token"
from = "ProxOps <proxops@example.org>"
to = ["ops@example.org"]
"#
            .replace(
                "url_file = \"token\"",
                "url = \"https://hooks.slack.com/services/T/B/X\"",
            )
            .as_str(),
        )
        .unwrap();
        assert_eq!(targets.len(), 5);
        assert_eq!(targets[0].events.len(), EventKind::ALL.len());
        assert_eq!(
            targets[1].events.iter().copied().collect::<Vec<_>>(),
            [EventKind::Failed, EventKind::DriftFound]
        );
        let Endpoint::Email(email) = &targets[4].endpoint else {
            panic!("email");
        };
        assert_eq!((email.smtp_port, email.starttls), (587, true));
        assert_eq!(targets[2].label(), "notify[2] matrix matrix.example.org");
    }

    #[test]
    fn an_unknown_kind_names_the_table_index_key_and_the_kinds_to_use() {
        let err = load(
            "[[notify]]\nkind = \"webhook\"\nurl = \"http://a/b\"\n[[notify]]\nkind = \"ntfi\"\n",
        )
        .unwrap_err();
        assert!(
            err.contains(
                "agent.toml: notify[1].kind: `ntfi` is not a notification kind; use one of webhook"
            ),
            "{err}"
        );
    }

    #[test]
    fn an_unknown_event_is_located_in_the_events_list() {
        let err = load("[[notify]]\nkind = \"webhook\"\nurl = \"http://a/b\"\nevents = [\"applied\", \"drift\"]\n")
            .unwrap_err();
        assert!(err.contains("notify[0].events[1]: `drift` is not an event; use some of applied, failed, invalid, drift-found"), "{err}");
    }

    #[test]
    fn an_unknown_key_in_a_table_is_named() {
        let err = load("[[notify]]\nkind = \"webhook\"\nurl = \"http://a/b\"\ntokn_file = \"x\"\n")
            .unwrap_err();
        assert!(
            err.contains("notify[0]: unknown field `tokn_file`"),
            "{err}"
        );
    }

    #[test]
    fn a_key_of_another_kind_is_refused() {
        let err = load("[[notify]]\nkind = \"slack\"\nurl = \"http://a/b\"\nsmtp_host = \"x\"\n")
            .unwrap_err();
        assert!(
            err.contains("notify[0].smtp_host: is not used by kind = \"slack\""),
            "{err}"
        );
    }

    #[test]
    fn a_url_read_from_a_file_is_never_echoed_in_an_error() {
        let dir_err = load("[[notify]]\nkind = \"slack\"\nurl_file = \"token\"\n").unwrap_err();
        assert!(
            dir_err.contains("notify[0].url_file: not a URL"),
            "{dir_err}"
        );
        assert!(!dir_err.contains("tk_secret"), "{dir_err}");
    }

    #[test]
    fn ntfy_without_a_topic_and_matrix_without_a_room_say_what_to_write() {
        let err = load("[[notify]]\nkind = \"ntfy\"\nurl = \"https://ntfy.sh/\"\n").unwrap_err();
        assert!(err.contains("notify[0].url: names no topic"), "{err}");
        let err = load(
            "[[notify]]\nkind = \"matrix\"\nurl = \"https://m.org\"\ntoken_file = \"token\"\n",
        )
        .unwrap_err();
        assert!(err.contains("notify[0].room: missing"), "{err}");
    }

    #[test]
    fn email_needs_recipients_and_refuses_a_password_without_starttls() {
        let base = "[[notify]]\nkind = \"email\"\nsmtp_host = \"s\"\nfrom = \"a@example.org\"\n";
        let err = load(base).unwrap_err();
        assert!(err.contains("notify[0].to: missing"), "{err}");
        let err = load(&format!("{base}to = [\"not an address\"]\n")).unwrap_err();
        assert!(
            err.contains("notify[0].to[0]: `not an address` is not an email address"),
            "{err}"
        );
        let err = load(&format!(
            "{base}to = [\"b@example.org\"]\nstarttls = false\nusername = \"u\"\npassword_file = \"token\"\n"
        ))
        .unwrap_err();
        assert!(
            err.contains("notify[0].starttls: is false while a password is set"),
            "{err}"
        );
        let ok = load(&format!(
            "{base}to = [\"b@example.org\"]\nstarttls = false\n"
        ))
        .unwrap();
        let Endpoint::Email(email) = &ok[0].endpoint else {
            panic!("email");
        };
        assert_eq!(email.smtp_port, 25);
    }

    #[test]
    fn a_url_with_credentials_is_refused() {
        let err = load("[[notify]]\nkind = \"webhook\"\nurl = \"https://u:p@h/x\"\n").unwrap_err();
        assert!(
            err.contains("notify[0].url: must not carry credentials"),
            "{err}"
        );
    }

    #[test]
    fn debug_output_of_a_target_carries_no_token_or_url_path() {
        let targets = load(
            "[[notify]]\nkind = \"webhook\"\nurl = \"https://h.example.org/secret-path\"\ntoken_file = \"token\"\n",
        )
        .unwrap();
        let text = format!("{:?}", targets[0]);
        assert!(
            !text.contains("tk_secret") && !text.contains("secret-path"),
            "{text}"
        );
    }
}
