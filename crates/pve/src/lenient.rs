//! Lenient decoding of PVE's loosely typed JSON (BEHAVIOUR.md §11).
//!
//! PVE's values come from Perl scalars: the same field can be a number in one version and a
//! numeric string in another, and booleans are often `0`/`1`. These serde helpers accept every
//! spelling seen in the wild and are used with `#[serde(deserialize_with = ...)]` on the
//! response types. They never fail on an unexpected *shape* of an optional field: an
//! unreadable optional value becomes `None`, because observing must not break on a cosmetic
//! change in a field ProxOps does not decide on.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// `u64` from a JSON number or numeric string; `None` when absent, null or unreadable.
pub(crate) fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(Option::<Value>::deserialize(d)?
        .as_ref()
        .and_then(value_to_u64))
}

/// `u64` that must be present and readable (e.g. a vmid).
pub(crate) fn u64_required<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let v = Value::deserialize(d)?;
    value_to_u64(&v)
        .ok_or_else(|| serde::de::Error::custom(format!("expected an integer, got {v}")))
}

/// `f64` from a JSON number or numeric string.
pub(crate) fn opt_f64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Ok(match Option::<Value>::deserialize(d)? {
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    })
}

/// `bool` from `true`/`false`, `0`/`1` or `"0"`/`"1"`; `None` when absent or unreadable.
pub(crate) fn opt_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    Ok(match Option::<Value>::deserialize(d)? {
        Some(Value::Bool(b)) => Some(b),
        Some(Value::Number(n)) => n.as_i64().map(|i| i != 0),
        Some(Value::String(s)) => match s.as_str() {
            "1" | "true" | "yes" | "on" => Some(true),
            "0" | "false" | "no" | "off" => Some(false),
            _ => None,
        },
        _ => None,
    })
}

/// A string from a JSON string or number (PVE sends some ids either way).
pub(crate) fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Option::<Value>::deserialize(d)? {
        Some(Value::String(s)) => Some(s),
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(Value::Bool(b)) => Some(if b { "1" } else { "0" }.to_owned()),
        _ => None,
    })
}

fn value_to_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64().or_else(|| {
            // A float with no fraction (some PVE versions emit sizes as 1.0e9).
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Probe {
        #[serde(default, deserialize_with = "super::opt_u64")]
        n: Option<u64>,
        #[serde(default, deserialize_with = "super::opt_bool")]
        b: Option<bool>,
        #[serde(default, deserialize_with = "super::opt_string")]
        s: Option<String>,
    }

    fn probe(json: &str) -> Probe {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn lenient_numbers_accept_numbers_and_numeric_strings() {
        assert_eq!(probe(r#"{"n": 103}"#).n, Some(103));
        assert_eq!(probe(r#"{"n": "103"}"#).n, Some(103));
        assert_eq!(probe(r#"{"n": 1.0e3}"#).n, Some(1000));
        assert_eq!(probe(r#"{"n": "x"}"#).n, None);
        assert_eq!(probe("{}").n, None);
    }

    #[test]
    fn lenient_bools_accept_zero_one_and_json_bools() {
        assert_eq!(probe(r#"{"b": 1}"#).b, Some(true));
        assert_eq!(probe(r#"{"b": "0"}"#).b, Some(false));
        assert_eq!(probe(r#"{"b": true}"#).b, Some(true));
        assert_eq!(probe(r#"{"b": null}"#).b, None);
    }

    #[test]
    fn lenient_strings_accept_numbers() {
        assert_eq!(probe(r#"{"s": 103}"#).s.as_deref(), Some("103"));
        assert_eq!(probe(r#"{"s": "103"}"#).s.as_deref(), Some("103"));
    }
}
