//! `[source] allowed_signers_file`: git's `gpg.ssh.allowedSignersFile`, the format of
//! `ssh-keygen -Y verify`'s allowed signers file (ssh-keygen(1), "ALLOWED SIGNERS"):
//!
//! ```text
//! principals [options] keytype base64-key [comment]
//! ```
//!
//! One signer per line; empty lines and lines starting with `#` are ignored. `principals` is
//! a comma-separated list of patterns (quoted if it holds spaces); they name the signer and are
//! reported, never matched against the commit's author (git does not either). Options
//! (comma-separated): `namespaces="git,..."` (patterns, `!` negates), `valid-after=` and
//! `valid-before=` (`YYYYMMDD[HHMM[SS]]Z`, compared with the commit's committer time as git
//! does with `-Overify-time`). Refused, with the line: `cert-authority` (certificate signers
//! are not verified), times without `Z` (ssh-keygen reads them as the host's local time),
//! and any other option.

use ssh_key::PublicKey;

/// One line of the file: a signer's key and where it may be used.
#[derive(Debug, Clone)]
pub struct Entry {
    /// 1-based line in the file.
    pub line: usize,
    /// The principals, as written.
    pub principals: String,
    /// `namespaces=` patterns; `None` allows every namespace.
    pub namespaces: Option<Vec<String>>,
    /// `valid-after=`, seconds since the Unix epoch.
    pub valid_after: Option<i64>,
    /// `valid-before=`, seconds since the Unix epoch.
    pub valid_before: Option<i64>,
    /// The signer's public key.
    pub key: PublicKey,
}

impl Entry {
    /// Whether `namespace` is allowed by the entry's `namespaces=` (every one without it).
    pub fn allows_namespace(&self, namespace: &str) -> bool {
        match &self.namespaces {
            None => true,
            Some(patterns) => pattern_list_matches(patterns, namespace),
        }
    }

    /// Whether the entry is valid at `time` (seconds since the epoch).
    pub fn valid_at(&self, time: i64) -> bool {
        self.valid_after.is_none_or(|after| time >= after)
            && self.valid_before.is_none_or(|before| time < before)
    }
}

/// A bad line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong and what to do.
    pub message: String,
}

/// The key types a line may name (ssh-keygen(1), sshd(8) AUTHORIZED_KEYS FILE FORMAT).
const KEY_TYPES: &[&str] = &[
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-dss",
];

/// Parses the whole file; every bad line is reported.
///
/// # Errors
/// One [`LineError`] per bad line, in order.
pub fn parse(text: &str) -> Result<Vec<Entry>, Vec<LineError>> {
    let mut entries = Vec::new();
    let mut errors = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        match parse_line(line, trimmed) {
            Ok(entry) => entries.push(entry),
            Err(message) => errors.push(LineError { line, message }),
        }
    }
    if errors.is_empty() {
        Ok(entries)
    } else {
        Err(errors)
    }
}

fn parse_line(line: usize, text: &str) -> Result<Entry, String> {
    let mut rest = text;
    let principals = next_field(&mut rest).ok_or("no principals")?;
    let principals = unquote(&principals).to_owned();
    if principals.is_empty() {
        return Err("empty principals".to_owned());
    }
    let mut field = next_field(&mut rest)
        .ok_or("no key: expected `principals [options] keytype base64-key`")?;
    let mut entry_options = Options::default();
    if !KEY_TYPES.contains(&field.as_str()) {
        entry_options = parse_options(&field)?;
        field = next_field(&mut rest).ok_or("no key type after the options")?;
    }
    let key_type = field;
    if !KEY_TYPES.contains(&key_type.as_str()) {
        return Err(format!(
            "unknown key type `{key_type}` (expected one of {})",
            KEY_TYPES.join(", ")
        ));
    }
    let blob = next_field(&mut rest).ok_or("no base64 key after the key type")?;
    let key = PublicKey::from_openssh(&format!("{key_type} {blob}"))
        .map_err(|error| format!("the {key_type} key does not decode: {error}"))?;
    if key.algorithm().as_str() != key_type {
        return Err(format!(
            "the key is {}, not {key_type}",
            key.algorithm().as_str()
        ));
    }
    Ok(Entry {
        line,
        principals,
        namespaces: entry_options.namespaces,
        valid_after: entry_options.valid_after,
        valid_before: entry_options.valid_before,
        key,
    })
}

#[derive(Default)]
struct Options {
    namespaces: Option<Vec<String>>,
    valid_after: Option<i64>,
    valid_before: Option<i64>,
}

fn parse_options(field: &str) -> Result<Options, String> {
    let mut options = Options::default();
    for option in split_outside_quotes(field, ',') {
        let (name, value) = match option.split_once('=') {
            Some((name, value)) => (name, Some(unquote(value))),
            None => (option, None),
        };
        match (name.to_ascii_lowercase().as_str(), value) {
            ("namespaces", Some(list)) => {
                options.namespaces = Some(
                    list.split(',')
                        .map(|n| n.trim().to_owned())
                        .filter(|n| !n.is_empty())
                        .collect(),
                );
            }
            ("valid-after", Some(time)) => options.valid_after = Some(parse_time(time)?),
            ("valid-before", Some(time)) => options.valid_before = Some(parse_time(time)?),
            ("cert-authority", None) => {
                return Err(
                    "cert-authority is not supported: ProxOps verifies signatures by \
                     listed keys only; list each signer's own public key instead"
                        .to_owned(),
                );
            }
            ("namespaces" | "valid-after" | "valid-before", None) => {
                return Err(format!("option {name} needs a value ({name}=\"...\")"));
            }
            _ => {
                return Err(format!(
                    "unsupported option `{name}` (supported: namespaces, valid-after, \
                     valid-before); if `{name}` is meant as a key type, it is not one"
                ));
            }
        }
    }
    Ok(options)
}

/// `YYYYMMDD[HHMM[SS]]Z` as seconds since the epoch.
fn parse_time(text: &str) -> Result<i64, String> {
    let Some(digits) = text.strip_suffix(['Z', 'z']) else {
        return Err(format!(
            "time `{text}` has no `Z`: ssh-keygen reads it as the host's local time; write \
             it in UTC ending in Z, e.g. 20260101Z or 202601011200Z"
        ));
    };
    let padded = match digits.len() {
        8 => format!("{digits}000000"),
        12 => format!("{digits}00"),
        14 => digits.to_owned(),
        _ => String::new(),
    };
    if padded.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "time `{text}` is not YYYYMMDD[HHMM[SS]]Z, e.g. 20260101Z or 202601011200Z"
        ));
    }
    chrono::NaiveDateTime::parse_from_str(&padded, "%Y%m%d%H%M%S")
        .map(|t| t.and_utc().timestamp())
        .map_err(|_| format!("time `{text}` is not a valid date and time"))
}

/// The next whitespace-separated field of `rest` (quotes keep spaces), advancing `rest`.
fn next_field(rest: &mut &str) -> Option<String> {
    let text = rest.trim_start();
    if text.is_empty() {
        return None;
    }
    let mut quoted = false;
    let mut end = text.len();
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    *rest = &text[end..];
    Some(text[..end].to_owned())
}

fn split_outside_quotes(text: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        if c == '"' {
            quoted = !quoted;
        } else if c == separator && !quoted {
            parts.push(&text[start..i]);
            start = i + 1;
        }
    }
    parts.push(&text[start..]);
    parts
}

fn unquote(text: &str) -> &str {
    text.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text)
}

/// OpenSSH's `match_pattern_list`: true when a pattern matches and no negated one does.
fn pattern_list_matches(patterns: &[String], name: &str) -> bool {
    let mut matched = false;
    for pattern in patterns {
        match pattern.strip_prefix('!') {
            Some(negated) if glob(negated.as_bytes(), name.as_bytes()) => return false,
            Some(_) => {}
            None => matched |= glob(pattern.as_bytes(), name.as_bytes()),
        }
    }
    matched
}

/// `*` and `?` wildcards, as OpenSSH's `match_pattern`.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob(&pattern[1..], name) || (!name.is_empty() && glob(pattern, &name[1..]))
        }
        (Some(b'?'), Some(_)) => glob(&pattern[1..], &name[1..]),
        (Some(p), Some(n)) if p == n => glob(&pattern[1..], &name[1..]),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ed25519 public key (its private half was thrown away).
    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPnLkIiXB2SbIkQAq1SB38edwYQ0uBAbvTUSF2srvQaM";

    #[test]
    fn a_plain_line_names_its_principals_and_key_and_allows_every_namespace() {
        let entries = parse(&format!("# ops team\n\nops@example.org {KEY} laptop\n")).unwrap();
        assert_eq!(entries.len(), 1);
        let entry = &entries[0];
        assert_eq!(entry.line, 3);
        assert_eq!(entry.principals, "ops@example.org");
        assert!(entry.allows_namespace("git"));
        assert!(entry.valid_at(0));
        assert_eq!(entry.key.to_openssh().unwrap(), KEY);
    }

    #[test]
    fn options_limit_the_namespaces_and_the_validity_window() {
        let text = format!(
            "\"a@example.org,b@example.org\" namespaces=\"file,git\",valid-after=20260101Z,valid-before=\"202601020000Z\" {KEY}\n\
             c@example.org namespaces=\"*,!git\" {KEY}\n"
        );
        let entries = parse(&text).unwrap();
        assert_eq!(entries[0].principals, "a@example.org,b@example.org");
        assert!(entries[0].allows_namespace("git"));
        assert!(!entries[0].allows_namespace("email"));
        let jan1 = 1_767_225_600;
        assert!(!entries[0].valid_at(jan1 - 1));
        assert!(entries[0].valid_at(jan1));
        assert!(!entries[0].valid_at(jan1 + 86_400));
        assert!(!entries[1].allows_namespace("git"));
        assert!(entries[1].allows_namespace("file"));
    }

    #[test]
    fn every_bad_line_is_reported_with_its_number_and_what_to_do() {
        let text = format!(
            "ok@example.org {KEY}\n\
             ca@example.org cert-authority {KEY}\n\
             local@example.org valid-after=20260101 {KEY}\n\
             who@example.org restrict {KEY}\n\
             broken@example.org ssh-ed25519 AAAAnotbase64!!\n\
             lonely@example.org\n"
        );
        let errors = parse(&text).unwrap_err();
        let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, [2, 3, 4, 5, 6]);
        assert!(
            errors[0]
                .message
                .contains("cert-authority is not supported"),
            "{errors:?}"
        );
        assert!(errors[1].message.contains("ending in Z"), "{errors:?}");
        assert!(
            errors[2].message.contains("unsupported option `restrict`"),
            "{errors:?}"
        );
        assert!(errors[3].message.contains("does not decode"), "{errors:?}");
        assert!(errors[4].message.contains("no key"), "{errors:?}");
    }

    #[test]
    fn a_key_type_that_does_not_match_the_key_is_refused() {
        let blob = KEY.split_once(' ').unwrap().1;
        let errors = parse(&format!("x@example.org ssh-rsa {blob}\n")).unwrap_err();
        assert_eq!(errors[0].line, 1);
    }

    #[test]
    fn wildcards_match_as_in_openssh() {
        assert!(glob(b"g*", b"git"));
        assert!(glob(b"g?t", b"git"));
        assert!(!glob(b"g?t", b"gt"));
        assert!(!glob(b"file", b"git"));
    }
}
