//! Scalars as SOPS (Go, yaml.v3) writes them before hashing them into the MAC: `True`/`False`,
//! integers in decimal, floats in Go's shortest form, `lastmodified` in Go's RFC 3339.

use secrecy::{ExposeSecret, SecretBox};

use crate::ValueType;

/// Decrypted bytes as SOPS's `ToBytes` would write the typed value back.
pub(crate) fn canonical_bytes(
    plain: SecretBox<Vec<u8>>,
    value_type: ValueType,
) -> Option<SecretBox<Vec<u8>>> {
    let reformat = |text: &str| -> Option<String> {
        match value_type {
            ValueType::Int => text.parse::<i64>().ok().map(|n| n.to_string()),
            ValueType::Float => text.parse::<f64>().ok().map(go_format_float),
            ValueType::Bool => go_parse_bool(text).map(go_bool),
            ValueType::Str | ValueType::Bytes | ValueType::Time => None,
        }
    };
    match value_type {
        ValueType::Str | ValueType::Bytes | ValueType::Time => Some(plain),
        _ => {
            let text = std::str::from_utf8(plain.expose_secret()).ok()?;
            reformat(text).map(|s| SecretBox::new(Box::new(s.into_bytes())))
        }
    }
}

/// A clear-text YAML scalar as SOPS's `ToBytes` writes it after yaml.v3 resolved its type.
pub(crate) fn clear_bytes(text: &str, quoted: bool) -> (Vec<u8>, ValueType) {
    if quoted {
        return (text.as_bytes().to_vec(), ValueType::Str);
    }
    match text {
        "true" | "True" | "TRUE" => return (b"True".to_vec(), ValueType::Bool),
        "false" | "False" | "FALSE" => return (b"False".to_vec(), ValueType::Bool),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return (b"+Inf".to_vec(), ValueType::Float);
        }
        "-.inf" | "-.Inf" | "-.INF" => return (b"-Inf".to_vec(), ValueType::Float),
        ".nan" | ".NaN" | ".NAN" => return (b"NaN".to_vec(), ValueType::Float),
        _ => {}
    }
    if let Some(n) = parse_yaml_int(text) {
        return (n.into_bytes(), ValueType::Int);
    }
    if is_yaml_float(text)
        && let Ok(f) = text.replace('_', "").parse::<f64>()
    {
        return (go_format_float(f).into_bytes(), ValueType::Float);
    }
    (text.as_bytes().to_vec(), ValueType::Str)
}

/// yaml.v3's integer forms (decimal, `0x`, `0o`, `0b`, with `_`), written back in decimal.
fn parse_yaml_int(text: &str) -> Option<String> {
    let plain = text.replace('_', "");
    let (negative, digits) = match plain.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, plain.strip_prefix('+').unwrap_or(&plain)),
    };
    if digits.is_empty() {
        return None;
    }
    let (radix, digits) = if let Some(d) = digits.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = digits.strip_prefix("0o") {
        (8, d)
    } else if let Some(d) = digits.strip_prefix("0b") {
        (2, d)
    } else {
        (10, digits)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u128::from_str_radix(digits, radix).ok()?;
    if negative {
        let n = i128::try_from(magnitude).ok()?.checked_neg()?;
        i64::try_from(n).ok().map(|n| n.to_string())
    } else {
        u64::try_from(magnitude).ok().map(|n| n.to_string())
    }
}

fn is_yaml_float(text: &str) -> bool {
    let t = text
        .strip_prefix(['-', '+'])
        .unwrap_or(text)
        .replace('_', "");
    let (mantissa, exponent) = match t.split_once(['e', 'E']) {
        Some((m, e)) => (m.to_owned(), Some(e.to_owned())),
        None => (t.clone(), None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((a, b)) => {
            (!a.is_empty() || !b.is_empty())
                && a.chars().all(|c| c.is_ascii_digit())
                && b.chars().all(|c| c.is_ascii_digit())
        }
        None => !mantissa.is_empty() && mantissa.chars().all(|c| c.is_ascii_digit()),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(&e);
        !e.is_empty() && e.chars().all(|c| c.is_ascii_digit())
    });
    mantissa_ok && exponent_ok
}

/// Go's `strconv.FormatFloat(f, 'f', -1, 64)`: shortest round-trip form, never an exponent.
fn go_format_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".to_owned()
    } else if f.is_infinite() {
        if f > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        // Rust's `Display` for f64 is the shortest round-trip form and never uses an exponent.
        f.to_string()
    }
}

/// Go's `strconv.ParseBool`.
pub(crate) fn go_parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn go_bool(b: bool) -> String {
    if b { "True" } else { "False" }.to_owned()
}

/// `lastmodified` re-serialised with Go's `time.RFC3339`: no fractional seconds, `Z` for UTC.
pub(crate) fn go_rfc3339(text: &str) -> String {
    match chrono::DateTime::parse_from_rfc3339(text) {
        Ok(t) if t.offset().local_minus_utc() == 0 => t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Ok(t) => t.format("%Y-%m-%dT%H:%M:%S%:z").to_string(),
        Err(_) => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clear_scalars_are_written_as_go_would() {
        assert_eq!(clear_bytes("true", false).0, b"True");
        assert_eq!(clear_bytes("true", true).0, b"true");
        assert_eq!(clear_bytes("0x1F", false).0, b"31");
        assert_eq!(clear_bytes("1e3", false).0, b"1000");
        assert_eq!(clear_bytes("1.50", false).0, b"1.5");
        assert_eq!(clear_bytes("v1", false).0, b"v1");
        assert_eq!(clear_bytes("yes", false).0, b"yes");
    }

    #[test]
    fn lastmodified_is_reserialised_like_go_rfc3339() {
        assert_eq!(go_rfc3339("2022-03-15T22:11:15Z"), "2022-03-15T22:11:15Z");
        assert_eq!(
            go_rfc3339("2022-03-15T22:11:15.123Z"),
            "2022-03-15T22:11:15Z"
        );
        assert_eq!(
            go_rfc3339("2022-03-15T23:11:15+01:00"),
            "2022-03-15T23:11:15+01:00"
        );
    }
}
