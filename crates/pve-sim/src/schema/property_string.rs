//! PVE property strings: `virtio,bridge=vmbr0,firewall=1`, `local-lvm:32,discard=on`.
//!
//! A property string is split on `,`; each part is `key=value`, or a bare value that belongs to
//! the format's default key. This mirrors pve-common `JSONSchema.pm` `parse_property_string`,
//! including its error texts. [`parse`] is the schema-free splitter the simulator's handlers can
//! reuse (e.g. to read `net0` back); the schema-aware variant, which also resolves aliases
//! (`virtio=<mac>` means `model=virtio,macaddr=<mac>`) and normalises booleans, is used by the
//! validator and by [`Schema::parse_property_string`](super::Schema::parse_property_string).
//! Nothing here checks values against their types; `validate.rs` does.

use std::collections::BTreeMap;

use super::model::Props;

const DUPLICATE: &str = "duplicate key in comma-separated list property";
const MISSING_KEY: &str = "missing key in comma-separated list property";
const NO_DEFAULT_KEY: &str = "value without key, but schema does not define a default key";

/// Splits a property string into `(key, value)` pairs, in the order given.
///
/// A part without `=` is assigned to `default_key`. Parts that are empty or only whitespace
/// are skipped, as in PVE. Values are returned verbatim: no alias resolution and no boolean
/// normalisation (use [`parse_boolean`] for that).
///
/// ```
/// use proxops_pve_sim::schema::property_string::parse;
///
/// let pairs = parse("virtio,bridge=vmbr0", Some("model")).unwrap();
/// assert_eq!(pairs[0], ("model".to_string(), "virtio".to_string()));
/// assert_eq!(pairs[1], ("bridge".to_string(), "vmbr0".to_string()));
/// ```
///
/// # Errors
/// PVE's message (without its trailing newline) for a repeated key
/// (`duplicate key in comma-separated list property: <k>`), a part like `=x` or `k=`
/// (`missing key in comma-separated list property`), or a bare value when `default_key` is
/// `None` (`value without key, but schema does not define a default key`).
pub fn parse(value: &str, default_key: Option<&str>) -> Result<Vec<(String, String)>, String> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut seen_bare = false;
    for part in value.split(',') {
        if part.trim().is_empty() {
            continue;
        }
        match split_key_value(part) {
            Some((key, val)) => {
                if pairs.iter().any(|(k, _)| k == key) {
                    return Err(format!("{DUPLICATE}: {key}"));
                }
                pairs.push((key.to_string(), val.to_string()));
            }
            None if !part.contains('=') => {
                let Some(key) = default_key else {
                    return Err(NO_DEFAULT_KEY.to_string());
                };
                let taken = pairs.iter().any(|(k, v)| k == key && perl_true(v));
                if seen_bare || taken {
                    return Err(format!("{DUPLICATE}: {key}"));
                }
                seen_bare = true;
                pairs.retain(|(k, _)| k != key);
                pairs.push((key.to_string(), part.to_string()));
            }
            None => return Err(MISSING_KEY.to_string()),
        }
    }
    Ok(pairs)
}

/// PVE's boolean spelling inside property strings: `1|on|yes|true` and `0|off|no|false`,
/// case-insensitive. Anything else is `None`.
pub fn parse_boolean(value: &str) -> Option<bool> {
    const TRUE: [&str; 4] = ["1", "on", "yes", "true"];
    const FALSE: [&str; 4] = ["0", "off", "no", "false"];
    if TRUE.iter().any(|t| value.eq_ignore_ascii_case(t)) {
        Some(true)
    } else if FALSE.iter().any(|f| value.eq_ignore_ascii_case(f)) {
        Some(false)
    } else {
        None
    }
}

/// Parses `data` against a property-string format, as `parse_property_string` does before it
/// checks the values: aliases are resolved (`keyAlias` records the alias key, e.g.
/// `model=virtio`), recognised booleans become `1`/`0`, unknown keys are rejected.
///
/// # Errors
/// PVE's `die` text without the trailing newline.
pub(crate) fn parse_with_format(
    format: &Props,
    data: &str,
) -> Result<BTreeMap<String, String>, String> {
    let mut res: BTreeMap<String, String> = BTreeMap::new();
    let mut default_key: Option<&str> = None;
    for part in data.split(',') {
        if part.trim().is_empty() {
            continue;
        }
        if let Some((key, value)) = split_key_value(part) {
            // The duplicate check uses the key as written, before alias resolution.
            if res.contains_key(key) {
                return Err(format!("{DUPLICATE}: {key}"));
            }
            let mut key = key;
            let mut schema = format.get(key);
            if let Some(alias) = schema.and_then(|s| s.alias.as_deref()) {
                if let Some(key_alias) = schema.and_then(|s| s.key_alias.as_deref()) {
                    if res.contains_key(key_alias) {
                        return Err(format!("key alias '{key_alias}' is already defined"));
                    }
                    res.insert(key_alias.to_string(), key.to_string());
                }
                key = alias;
                schema = format.get(alias);
            }
            let Some(schema) = schema else {
                return Err(format!(
                    "invalid key in comma-separated list property: {key}"
                ));
            };
            let value = match (schema.kind.as_deref(), parse_boolean(value)) {
                (Some("boolean"), Some(b)) => if b { "1" } else { "0" }.to_string(),
                _ => value.to_string(),
            };
            res.insert(key.to_string(), value);
        } else if !part.contains('=') {
            if let Some(key) = default_key {
                return Err(format!("{DUPLICATE}: {key}"));
            }
            let Some((key, _)) = format.iter().find(|(_, p)| p.default_key) else {
                return Err(NO_DEFAULT_KEY.to_string());
            };
            default_key = Some(key);
            if res.get(key).is_some_and(|v| perl_true(v)) {
                return Err(format!("{DUPLICATE}: {key}"));
            }
            res.insert(key.clone(), part.to_string());
        } else {
            return Err(MISSING_KEY.to_string());
        }
    }
    Ok(res)
}

/// `^([^=]+)=(.+)$` without `/s`: a non-empty key before the first `=`, and a non-empty value
/// on one line.
fn split_key_value(part: &str) -> Option<(&str, &str)> {
    let (key, value) = part.split_once('=')?;
    let value = value.strip_suffix('\n').unwrap_or(value);
    if key.is_empty() || key.contains('\n') || value.is_empty() || value.contains('\n') {
        return None;
    }
    Some((key, value))
}

/// Perl truthiness of a defined string: everything but `""` and `"0"`.
pub(crate) fn perl_true(value: &str) -> bool {
    !value.is_empty() && value != "0"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(json: &str) -> Props {
        serde_json::from_str(json).unwrap()
    }

    fn net_format() -> Props {
        format(
            r#"{
                "model": {"type": "string", "default_key": true, "enum": ["virtio", "e1000"]},
                "virtio": {"alias": "macaddr", "keyAlias": "model"},
                "macaddr": {"type": "string", "optional": true},
                "bridge": {"type": "string", "optional": true},
                "firewall": {"type": "boolean", "optional": true}
            }"#,
        )
    }

    #[test]
    fn bare_value_goes_to_the_default_key() {
        let pairs = parse("local-lvm:32,discard=on", Some("file")).unwrap();
        assert_eq!(
            pairs,
            vec![
                ("file".to_string(), "local-lvm:32".to_string()),
                ("discard".to_string(), "on".to_string())
            ]
        );
    }

    #[test]
    fn repeated_key_is_a_duplicate() {
        assert_eq!(
            parse("bridge=vmbr0,bridge=vmbr1", None),
            Err("duplicate key in comma-separated list property: bridge".to_string())
        );
    }

    #[test]
    fn second_bare_value_is_a_duplicate_of_the_default_key() {
        assert_eq!(
            parse("virtio,e1000", Some("model")),
            Err("duplicate key in comma-separated list property: model".to_string())
        );
    }

    #[test]
    fn bare_value_without_default_key_is_rejected() {
        assert_eq!(
            parse("dhcp", None),
            Err("value without key, but schema does not define a default key".to_string())
        );
    }

    #[test]
    fn empty_key_or_value_is_a_missing_key() {
        let expected = Err("missing key in comma-separated list property".to_string());
        assert_eq!(parse("=x", None), expected);
        assert_eq!(parse("k=", None), expected);
    }

    #[test]
    fn empty_parts_are_skipped() {
        assert_eq!(
            parse(",, ,a=1,", None).unwrap(),
            vec![("a".into(), "1".into())]
        );
    }

    #[test]
    fn booleans_accept_pves_spellings_in_any_case() {
        for t in ["1", "on", "Yes", "TRUE"] {
            assert_eq!(parse_boolean(t), Some(true), "{t}");
        }
        for f in ["0", "off", "No", "false"] {
            assert_eq!(parse_boolean(f), Some(false), "{f}");
        }
        assert_eq!(parse_boolean("maybe"), None);
    }

    #[test]
    fn key_alias_records_the_model_and_stores_the_mac() {
        let res =
            parse_with_format(&net_format(), "virtio=BC:24:11:00:00:01,bridge=vmbr0").unwrap();
        assert_eq!(res.get("model").map(String::as_str), Some("virtio"));
        assert_eq!(
            res.get("macaddr").map(String::as_str),
            Some("BC:24:11:00:00:01")
        );
    }

    #[test]
    fn key_alias_after_explicit_model_is_rejected() {
        assert_eq!(
            parse_with_format(&net_format(), "model=e1000,virtio=BC:24:11:00:00:01"),
            Err("key alias 'model' is already defined".to_string())
        );
    }

    #[test]
    fn booleans_are_normalised_and_unknown_keys_rejected() {
        let res = parse_with_format(&net_format(), "virtio,firewall=on").unwrap();
        assert_eq!(res.get("firewall").map(String::as_str), Some("1"));
        assert_eq!(
            parse_with_format(&net_format(), "virtio,bogus=1"),
            Err("invalid key in comma-separated list property: bogus".to_string())
        );
    }
}
