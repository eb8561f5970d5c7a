//! The control socket's protocol: one line of JSON per request, one per response, both
//! small (at most [`MAX_LINE`] bytes) and versioned (`v`). A request names an operation
//! (`op`); a response says whether it was done (`ok`) and, in words, what happened or what
//! is wrong (`message`).
//!
//! ```text
//! → {"v":1,"op":"approve","pass":12,"reason":"checked the prune list"}
//! ← {"v":1,"ok":true,"message":"approved pass 12 (1 action, digest 3f2a…): …"}
//! → {"v":1,"op":"reject","pass":12,"reason":"keep old-web"}
//! ← {"v":1,"ok":false,"message":"pass 12's approval lapsed: a newer plan differs …"}
//! ```

use serde::{Deserialize, Serialize};

/// The protocol version this binary speaks.
pub const VERSION: u32 = 1;

/// The longest request or response line, newline included.
pub const MAX_LINE: usize = 4096;

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Op {
    /// Let the actions `pass` held run, if the next pass plans the same change.
    Approve {
        /// The pass that held them (any pass that held the same change).
        pass: i64,
        /// Why, for the record (may be empty).
        #[serde(default)]
        reason: String,
    },
    /// Keep holding them (until the plan changes).
    Reject {
        /// The pass that held them.
        pass: i64,
        /// Why, for the record (may be empty).
        #[serde(default)]
        reason: String,
    },
}

/// One request line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// [`VERSION`].
    pub v: u32,
    /// The operation.
    #[serde(flatten)]
    pub op: Op,
    /// `$SUDO_USER` of the client, when it runs through sudo: recorded beside the socket
    /// peer's user as the client's claim (the peer's uid is what is checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sudo_user: Option<String>,
}

/// One response line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// [`VERSION`].
    pub v: u32,
    /// Whether the operation was done.
    pub ok: bool,
    /// What happened, or what is wrong and what to do.
    pub message: String,
}

impl Response {
    /// A done operation.
    pub fn done(message: impl Into<String>) -> Self {
        Self {
            v: VERSION,
            ok: true,
            message: message.into(),
        }
    }

    /// A refused or failed one.
    pub fn refused(message: impl Into<String>) -> Self {
        Self {
            v: VERSION,
            ok: false,
            message: message.into(),
        }
    }

    /// The response as one line, newline included.
    pub fn line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"v":1,"ok":false,"message":"the response could not be encoded"}"#.to_owned()
        });
        line.push('\n');
        line
    }
}

/// Reads a request line: a located, actionable message when it is not one.
///
/// # Errors
/// Not JSON, an unknown operation, or another protocol version.
pub fn parse_request(line: &str) -> Result<Request, String> {
    let value: serde_json::Value = serde_json::from_str(line.trim_end())
        .map_err(|e| format!("the request is not one line of JSON: {e}"))?;
    let version = value.get("v").and_then(serde_json::Value::as_u64);
    if version != Some(u64::from(VERSION)) {
        return Err(format!(
            "the request speaks control protocol version {}, the agent speaks {VERSION}: use \
             the proxops binary of the running agent",
            version.map_or_else(|| "(none)".to_owned(), |v| v.to_string())
        ));
    }
    serde_json::from_value(value)
        .map_err(|e| format!("the request is not understood: {e} (operations: approve, reject)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_as_one_line() {
        let request = Request {
            v: VERSION,
            op: Op::Approve {
                pass: 12,
                reason: "checked".into(),
            },
            sudo_user: None,
        };
        let line = serde_json::to_string(&request).unwrap();
        assert_eq!(
            line,
            r#"{"v":1,"op":"approve","pass":12,"reason":"checked"}"#
        );
        assert_eq!(parse_request(&format!("{line}\n")).unwrap(), request);
    }

    #[test]
    fn another_version_an_unknown_operation_and_garbage_are_named() {
        let other = parse_request(r#"{"v":2,"op":"approve","pass":1}"#).unwrap_err();
        assert!(other.contains("version 2"), "{other}");
        let unknown = parse_request(r#"{"v":1,"op":"delete-everything"}"#).unwrap_err();
        assert!(unknown.contains("operations: approve, reject"), "{unknown}");
        let garbage = parse_request("approve 12").unwrap_err();
        assert!(garbage.contains("not one line of JSON"), "{garbage}");
    }

    #[test]
    fn a_response_is_one_line_with_its_newline() {
        let line = Response::refused("pass 3 has nothing awaiting approval").line();
        assert!(line.ends_with('\n') && !line.trim_end().contains('\n'));
        assert!(line.len() < MAX_LINE);
    }
}
