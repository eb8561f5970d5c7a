//! Authentication as pveproxy does it: API token headers (`PVEAPIToken=user@realm!id=secret`,
//! no CSRF check) and tickets from `POST /access/ticket` sent as the `PVEAuthCookie` cookie,
//! with a `CSRFPreventionToken` header required on every non-GET request.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use regex::Regex;

/// Ticket lifetime (`$ticket_lifetime = 3600 * 2`).
const TICKET_LIFETIME: Duration = Duration::from_secs(2 * 3600);

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    /// `root@pam`, or `root@pam!proxops` for a token.
    pub(crate) authid: String,
    pub(crate) is_token: bool,
}

impl Caller {
    /// The `root@pam` checks of PVE compare the auth id, so tokens of root never pass them.
    pub(crate) fn is_root_pam(&self) -> bool {
        self.authid == "root@pam"
    }
}

#[derive(Debug, Clone)]
struct Ticket {
    user: String,
    csrf: String,
    expires: SystemTime,
}

/// Users, tokens and issued tickets.
#[derive(Debug, Default)]
pub(crate) struct Auth {
    /// userid -> password (None: no password login).
    users: BTreeMap<String, Option<String>>,
    /// `user@realm!id` -> secret.
    tokens: BTreeMap<String, String>,
    tickets: BTreeMap<String, Ticket>,
}

static TOKEN_ID_RE: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::unwrap_used)] // a literal pattern
    Regex::new(r"^[^\s:/]+@[A-Za-z][A-Za-z0-9.\-_]+![A-Za-z][A-Za-z0-9.\-_]+$").unwrap()
});

/// Why a request is not authenticated (the 401 reason phrase).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AuthFailure {
    NoTicket,
    Failed,
    Csrf,
}

impl AuthFailure {
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            AuthFailure::NoTicket => "No ticket",
            AuthFailure::Failed => "Authentication failed!",
            AuthFailure::Csrf => "Permission denied - invalid csrf token",
        }
    }
}

impl Auth {
    pub(crate) fn add_user(&mut self, userid: &str, password: Option<&str>) {
        self.users
            .insert(userid.to_string(), password.map(str::to_string));
    }

    pub(crate) fn add_token(&mut self, tokenid: &str, secret: &str) {
        self.tokens.insert(tokenid.to_string(), secret.to_string());
    }

    /// `POST /access/ticket`: returns (ticket, CSRF token) on a correct password.
    pub(crate) fn login(&mut self, username: &str, password: &str) -> Option<(String, String)> {
        let expected = self.users.get(username)?.as_deref()?;
        // A valid ticket is accepted as the password too (ticket renewal).
        let renewing = self
            .tickets
            .get(password)
            .is_some_and(|t| t.user == username && t.expires > SystemTime::now());
        if !(constant_time_eq(expected.as_bytes(), password.as_bytes()) || renewing) {
            return None;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let sig = || {
            let b: [u8; 24] = rand::random();
            hex::encode(b)
        };
        let ticket = format!("PVE:{username}:{now:08X}::{}", sig());
        let csrf = format!("{now:08X}:{}", sig());
        self.tickets.insert(
            ticket.clone(),
            Ticket {
                user: username.to_string(),
                csrf: csrf.clone(),
                expires: SystemTime::now() + TICKET_LIFETIME,
            },
        );
        Some((ticket, csrf))
    }

    /// Authenticates a request from its cookie, token header and CSRF header.
    pub(crate) fn authenticate(
        &self,
        method: &str,
        cookie_ticket: Option<&str>,
        authorization: Option<&str>,
        csrf: Option<&str>,
    ) -> Result<Caller, AuthFailure> {
        // The cookie wins when both are sent.
        if let Some(ticket) = cookie_ticket {
            let t = self
                .tickets
                .get(ticket)
                .filter(|t| t.expires > SystemTime::now())
                .ok_or(AuthFailure::Failed)?;
            if method != "GET" && csrf != Some(t.csrf.as_str()) {
                return Err(AuthFailure::Csrf);
            }
            return Ok(Caller {
                authid: t.user.clone(),
                is_token: false,
            });
        }
        let Some(header) = authorization else {
            return Err(AuthFailure::NoTicket);
        };
        let value = header
            .strip_prefix("PVEAPIToken=")
            .or_else(|| header.strip_prefix("PVEAPIToken "))
            .ok_or(AuthFailure::NoTicket)?;
        let (tokenid, secret) = value.split_once('=').ok_or(AuthFailure::Failed)?;
        if !TOKEN_ID_RE.is_match(tokenid) {
            return Err(AuthFailure::Failed);
        }
        let expected = self.tokens.get(tokenid).ok_or(AuthFailure::Failed)?;
        if !constant_time_eq(expected.as_bytes(), secret.as_bytes()) {
            return Err(AuthFailure::Failed);
        }
        Ok(Caller {
            authid: tokenid.to_string(),
            is_token: true,
        })
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether an `Authorization` header carries an API token at all, valid or not: http
/// `Formatter.pm` extract_auth_value, `/(?:^|\s)PVEAPIToken(?:=| )([^;]*)/` with a value
/// that Perl finds true (not empty, not `0`). pveproxy takes it from the header only when no
/// ticket cookie is sent, and hands it to the handler lookup even on paths that need no
/// login (`/access/ticket`).
pub(crate) fn api_token_sent(authorization: Option<&str>) -> bool {
    static RE: LazyLock<Regex> = LazyLock::new(|| {
        #[allow(clippy::unwrap_used)] // a literal pattern
        Regex::new(r"(?:^|\s)PVEAPIToken(?:=| )([^;]*)").unwrap()
    });
    authorization
        .and_then(|h| RE.captures(h))
        .and_then(|c| c.get(1))
        .is_some_and(|v| !v.as_str().is_empty() && v.as_str() != "0")
}

/// The `PVEAuthCookie` value from a `Cookie` header.
pub(crate) fn cookie_ticket(cookie_header: &str) -> Option<String> {
    cookie_header.split(';').find_map(|part| {
        let (name, value) = part.trim().split_once('=')?;
        (name == "PVEAuthCookie").then(|| {
            percent_encoding::percent_decode_str(value)
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_header_counts_as_sent_whatever_its_secret() {
        assert!(api_token_sent(Some("PVEAPIToken=root@pam!proxops=wrong")));
        assert!(api_token_sent(Some("PVEAPIToken root@pam!x=y")));
        assert!(!api_token_sent(Some("PVEAPIToken=")));
        assert!(!api_token_sent(Some("Basic cm9vdDpwdw==")));
        assert!(!api_token_sent(None));
    }

    fn auth() -> Auth {
        let mut a = Auth::default();
        a.add_user("root@pam", Some("pw"));
        a.add_token("root@pam!proxops", "s3cret");
        a
    }

    #[test]
    fn tokens_authenticate_without_csrf() {
        let a = auth();
        let caller = a
            .authenticate(
                "POST",
                None,
                Some("PVEAPIToken=root@pam!proxops=s3cret"),
                None,
            )
            .unwrap();
        assert_eq!(caller.authid, "root@pam!proxops");
        assert!(!caller.is_root_pam());
        assert_eq!(
            a.authenticate("GET", None, Some("PVEAPIToken=root@pam!proxops=nope"), None),
            Err(AuthFailure::Failed)
        );
    }

    #[test]
    fn tickets_need_the_csrf_token_on_writes() {
        let mut a = auth();
        let (ticket, csrf) = a.login("root@pam", "pw").unwrap();
        assert!(a.authenticate("GET", Some(&ticket), None, None).is_ok());
        assert_eq!(
            a.authenticate("POST", Some(&ticket), None, None),
            Err(AuthFailure::Csrf)
        );
        assert!(
            a.authenticate("POST", Some(&ticket), None, Some(&csrf))
                .is_ok()
        );
        assert!(a.login("root@pam", "wrong").is_none());
    }
}
