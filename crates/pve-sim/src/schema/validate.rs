//! Parameter validation, rule for rule after pve-common `JSONSchema.pm` (`check_object`,
//! `check_prop`, `check_type`, `check_format`).
//!
//! Errors are keyed by parameter path (`vmid`, or `net0.model` inside a property string) and
//! carry PVE's exact texts, including the trailing newline PVE keeps on messages that come from
//! a `die` (`invalid format - ...\n`). Where Perl would iterate a hash in random order, this
//! iterates in sorted order, so the output is deterministic. The parameters arrive as strings,
//! as they do from a query string or form body.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::LazyLock;

use regex::Regex;

use super::formats;
use super::model::{Format, Loaded, Property, Props, compile_anchored};
use super::property_string::{self, perl_true};

const NOT_DEFINED: &str =
    "property is not defined in schema and the schema does not allow additional properties";
const MISSING: &str = "property is missing and it is not optional";

/// Errors by parameter path; a second error on the same path is appended after a literal
/// backslash-n, as `add_error` does with its single-quoted `'\n'`.
#[derive(Debug, Default)]
pub(crate) struct Errors(BTreeMap<String, String>);

impl Errors {
    fn add(&mut self, path: &str, message: &str) {
        let key = if path.is_empty() { "_root" } else { path };
        match self.0.entry(key.to_string()) {
            Entry::Occupied(mut e) => {
                let joined = e.get_mut();
                joined.push_str("\\n");
                joined.push_str(message);
            }
            Entry::Vacant(e) => {
                e.insert(message.to_string());
            }
        }
    }

    pub(crate) fn into_map(self) -> BTreeMap<String, String> {
        self.0
    }
}

/// Why a `format` check failed: a validator's `die` text, or the per-key errors of a property
/// string (raised by PVE as `format error` with an `errors` hash).
enum FormatError {
    Die(String),
    Nested(BTreeMap<String, String>),
}

impl FormatError {
    /// The text PVE's exception stringifies to: the message, then one `key: error` line each.
    fn render(&self) -> String {
        match self {
            FormatError::Die(message) => format!("{message}\n"),
            FormatError::Nested(errors) => {
                let mut text = String::from("format error\n");
                for (path, message) in errors {
                    text.push_str(&format!("{path}: {message}\n"));
                }
                text
            }
        }
    }
}

/// Validation over one loaded schema.
pub(crate) struct Validator<'a> {
    pub(crate) loaded: &'a Loaded,
}

impl Validator<'_> {
    /// `check_object` over a parameter hash (or a parsed property string, with `path` set to the
    /// parameter it came from).
    pub(crate) fn check_object(
        &self,
        path: &str,
        props: &Props,
        values: &BTreeMap<String, String>,
        additional_properties: bool,
        errors: &mut Errors,
    ) {
        // First every schema key, present or not (missing-required is found here) ...
        for (name, prop) in props {
            if prop.index_range.is_none() {
                let value = values.get(name).map(String::as_str);
                self.check_prop(value, prop, &join(path, name), errors);
            }
        }
        // ... including the concrete instances of indexed options (`scsi0` for `scsi[n]`), which
        // PVE's schema lists one by one and the dump folds.
        for (name, value) in values {
            if let Some(prop) = resolve(props, name).filter(|p| p.index_range.is_some()) {
                self.check_prop(Some(value), prop, &join(path, name), errors);
            }
        }
        // Then every given key: `requires`, and keys the schema does not know.
        for name in values.keys() {
            match resolve(props, name) {
                Some(prop) => {
                    if let Some(required) = &prop.requires
                        && !values.contains_key(required)
                    {
                        // pve-common `src/PVE/JSONSchema.pm` @ f665029e `check_object`:
                        // "missing property required by '$newpath'" on the missing key (the
                        // older "missing property - '<p>' requires this property" was
                        // replaced in 0f0e791, libpve-common-perl 9.0.8, before PVE 9.0).
                        let message =
                            format!("missing property required by '{}'", join(path, name));
                        errors.add(&join(path, required), &message);
                    }
                }
                None if !additional_properties => errors.add(&join(path, name), NOT_DEFINED),
                None => {}
            }
        }
    }

    /// `check_prop` for one value (`None` when absent).
    fn check_prop(&self, value: Option<&str>, prop: &Property, path: &str, errors: &mut Errors) {
        let Some(value) = value else {
            if !prop.optional && prop.alias.is_none() {
                errors.add(path, MISSING);
            }
            return;
        };
        if prop.kind.as_deref() == Some("array") {
            self.check_array(value, prop, path, errors);
            return;
        }
        if let Err(message) = check_type(prop.kind.as_deref(), value) {
            errors.add(path, &message);
            return;
        }
        if let Some(format) = &prop.format
            && let Err(e) = self.check_format(format, value, path)
        {
            errors.add(path, &format!("invalid format - {}", e.render()));
            return;
        }
        if let Some(pattern) = &prop.pattern
            && !self.pattern_matches(pattern, value)
        {
            errors.add(path, "value does not match the regex pattern");
            return;
        }
        let length = value.chars().count();
        if let Some(max) = prop.max_length
            && length > max
        {
            errors.add(path, &format!("value may only be {max} characters long"));
            return;
        }
        if let Some(min) = prop.min_length
            && length < min
        {
            errors.add(
                path,
                &format!("value must be at least {min} characters long"),
            );
            return;
        }
        if is_number(value)
            && let Ok(number) = value.parse::<f64>()
        {
            if let Some(max) = &prop.maximum
                && max.as_f64().is_some_and(|m| number > m)
            {
                errors.add(path, &format!("value must have a maximum value of {max}"));
                return;
            }
            if let Some(min) = &prop.minimum
                && min.as_f64().is_some_and(|m| number < m)
            {
                errors.add(path, &format!("value must have a minimum value of {min}"));
                return;
            }
        }
        if let Some(values) = &prop.enumeration
            && !values.iter().any(|v| v == value)
        {
            let message = format!(
                "value '{value}' does not have a value in the enumeration '{}'",
                values.join(", ")
            );
            errors.add(path, &message);
        }
    }

    /// Array parameters arrive as one string. pve-common `RESTHandler.pm`
    /// (`normalize_legacy_param_formats`) wraps a Perl-true scalar into a one-element array
    /// before validation; a false one (`""`, `"0"`) stays a scalar and fails the type check.
    fn check_array(&self, value: &str, prop: &Property, path: &str, errors: &mut Errors) {
        if !perl_true(value) {
            errors.add(path, "type check ('array') failed");
            return;
        }
        if let Some(items) = &prop.items {
            self.check_prop(Some(value), items, &format!("{path}[0]"), errors);
        }
    }

    fn check_format(&self, format: &Format, value: &str, path: &str) -> Result<(), FormatError> {
        let name = match format {
            Format::Inline(props) => return self.check_property_string(props, value, path),
            Format::Named(name) => name.as_str(),
        };
        if name == "regex" {
            return Ok(());
        }
        if let Some(props) = self.loaded.schema.property_string_formats.get(name) {
            return self.check_property_string(props, value, path);
        }
        // `^(.*?)(?:-(list|opt))?$`
        let (base, kind) = if let Some(base) = name.strip_suffix("-list") {
            (base, "list")
        } else if let Some(base) = name.strip_suffix("-opt") {
            (base, "opt")
        } else {
            (name, "none")
        };
        let check = |v: &str| formats::check(base, v).unwrap_or(Ok(()));
        let verdict = match kind {
            "list" => formats::split_list(value).into_iter().try_for_each(check),
            // `$registered->($value) if $value`: Perl-false values are not checked.
            "opt" if !perl_true(value) => Ok(()),
            _ => check(value),
        };
        verdict.map_err(FormatError::Die)
    }

    /// `parse_property_string` then `check_object` with additional properties forbidden.
    fn check_property_string(
        &self,
        props: &Props,
        value: &str,
        path: &str,
    ) -> Result<(), FormatError> {
        let parsed = property_string::parse_with_format(props, value).map_err(FormatError::Die)?;
        let mut errors = Errors::default();
        self.check_object(path, props, &parsed, false, &mut errors);
        if errors.0.is_empty() {
            Ok(())
        } else {
            Err(FormatError::Nested(errors.0))
        }
    }

    fn pattern_matches(&self, pattern: &str, value: &str) -> bool {
        match self.loaded.patterns.get(pattern) {
            Some(regex) => regex.is_match(value),
            // Every pattern is compiled at load; this only runs for hand-built schemas.
            None => compile_anchored(pattern).is_ok_and(|r| r.is_match(value)),
        }
    }
}

/// Finds the schema of a concrete parameter name: an exact key, or `base[n]` for `baseN` when
/// N is canonical (`scsi5`, not `scsi05`) and inside the option's index range.
pub(crate) fn resolve<'p>(props: &'p Props, name: &str) -> Option<&'p Property> {
    if let Some(prop) = props.get(name).filter(|p| p.index_range.is_none()) {
        return Some(prop);
    }
    let base = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let digits = &name[base.len()..];
    if base.is_empty() || digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    let index: u32 = digits.parse().ok()?;
    let prop = props.get(&format!("{base}[n]"))?;
    let (low, high) = prop.index_range?;
    (low..=high).contains(&index).then_some(prop)
}

/// `check_type` for string values.
fn check_type(kind: Option<&str>, value: &str) -> Result<(), String> {
    let ok = match kind {
        // Only the strings 0 and 1: JSON true/false never reach us as strings here.
        Some("boolean") => value == "0" || value == "1",
        Some("integer") => is_integer(value),
        Some("number") => is_number(value),
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "type check ('{}') failed - got '{value}'",
            kind.unwrap_or_default()
        ))
    }
}

fn is_integer(value: &str) -> bool {
    static INTEGER: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^[+-]?\d+$").expect("integer regex is valid"));
    INTEGER.is_match(value)
}

fn is_number(value: &str) -> bool {
    static NUMBER: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^[+-]?(\d+\.\d+|\d+\.|\.\d+|\d+)([eE][+-]?\d+)?$")
            .expect("number regex is valid")
    });
    NUMBER.is_match(value)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}
