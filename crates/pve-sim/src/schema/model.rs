//! The shape of the vendored `schema/pve-params.json`, deserialised once.
//!
//! These are plain data types mirroring what `tools/vendor_schema.py` writes: endpoints by path
//! template and method, each with its parameter schemas in PVE's JSON-Schema dialect. Loading
//! also compiles every `pattern` once, so validation never builds a regex. Nothing here
//! validates requests; that is `validate.rs`.

use std::collections::{BTreeMap, HashMap};

use regex::Regex;
use serde::Deserialize;

/// The whole vendored file.
#[derive(Debug, Deserialize)]
pub(crate) struct VendoredSchema {
    /// Path template -> HTTP method -> endpoint.
    pub(crate) endpoints: BTreeMap<String, BTreeMap<String, Endpoint>>,
    /// Hash (property-string) formats that the dump only names, e.g. `pve-qm-ipconfig`.
    pub(crate) property_string_formats: BTreeMap<String, Props>,
}

/// Parameter schemas by name; indexed options keep their `name[n]` spelling.
pub(crate) type Props = BTreeMap<String, Property>;

/// One method on one path.
#[derive(Debug, Deserialize)]
pub(crate) struct Endpoint {
    /// `false` rejects parameters the schema does not define.
    #[serde(rename = "additionalProperties")]
    pub(crate) additional_properties: bool,
    /// Whether API-token callers may use the method.
    pub(crate) allowtoken: bool,
    /// Whether PVE runs the method in the privileged daemon.
    pub(crate) protected: bool,
    /// Parameter naming the node the call is proxied to.
    #[serde(default)]
    pub(crate) proxyto: Option<String>,
    pub(crate) parameters: Props,
    /// The method's `permissions`: the `check` expression and `user` (`all`, `world`).
    #[serde(default)]
    pub(crate) permissions: Option<super::Permissions>,
}

/// `permissions` as vendored: `check` is PVE's nested array form
/// (`["perm", "/vms/{vmid}", ["VM.Audit"], "any", 1]`), parsed by `permissions.rs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPermissions {
    #[serde(default)]
    pub(crate) check: Option<serde_json::Value>,
    #[serde(default)]
    pub(crate) user: Option<String>,
}

/// One parameter, or one key of a property string.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Property {
    #[serde(rename = "type", default)]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    pub(crate) optional: bool,
    #[serde(default)]
    pub(crate) format: Option<Format>,
    #[serde(default)]
    pub(crate) default: Option<serde_json::Value>,
    #[serde(rename = "enum", default)]
    pub(crate) enumeration: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) pattern: Option<String>,
    #[serde(default)]
    pub(crate) minimum: Option<serde_json::Number>,
    #[serde(default)]
    pub(crate) maximum: Option<serde_json::Number>,
    #[serde(rename = "minLength", default)]
    pub(crate) min_length: Option<usize>,
    #[serde(rename = "maxLength", default)]
    pub(crate) max_length: Option<usize>,
    #[serde(default)]
    pub(crate) requires: Option<String>,
    #[serde(default)]
    pub(crate) alias: Option<String>,
    #[serde(rename = "keyAlias", default)]
    pub(crate) key_alias: Option<String>,
    #[serde(default)]
    pub(crate) default_key: bool,
    #[serde(default)]
    pub(crate) items: Option<Box<Property>>,
    /// Inclusive index range of an indexed option such as `scsi[n]`.
    #[serde(default)]
    pub(crate) index_range: Option<(u32, u32)>,
}

/// A `format`: a registered name (`pve-vmid`, `pve-tag-list`) or an inline property string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Format {
    Named(String),
    Inline(Props),
}

/// The vendored schema plus the compiled form of every `pattern` in it.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) schema: VendoredSchema,
    /// Raw pattern text -> anchored regex.
    pub(crate) patterns: HashMap<String, Regex>,
}

impl Loaded {
    /// Parses the vendored JSON and compiles its patterns.
    ///
    /// # Errors
    /// A message naming what is malformed; the vendored file is part of the crate, so callers
    /// treat this as a build defect.
    pub(crate) fn from_json(text: &str) -> Result<Loaded, String> {
        let schema: VendoredSchema =
            serde_json::from_str(text).map_err(|e| format!("parsing vendored schema: {e}"))?;
        let mut patterns = HashMap::new();
        let mut raw = Vec::new();
        for methods in schema.endpoints.values() {
            for endpoint in methods.values() {
                collect_patterns(&endpoint.parameters, &mut raw);
            }
        }
        for props in schema.property_string_formats.values() {
            collect_patterns(props, &mut raw);
        }
        for pattern in raw {
            if patterns.contains_key(&pattern) {
                continue;
            }
            let regex = compile_anchored(&pattern)
                .map_err(|e| format!("compiling pattern {pattern:?}: {e}"))?;
            patterns.insert(pattern, regex);
        }
        Ok(Loaded { schema, patterns })
    }
}

fn collect_patterns(props: &Props, out: &mut Vec<String>) {
    for prop in props.values() {
        collect_property_patterns(prop, out);
    }
}

fn collect_property_patterns(prop: &Property, out: &mut Vec<String>) {
    if let Some(pattern) = &prop.pattern {
        out.push(pattern.clone());
    }
    if let Some(Format::Inline(inner)) = &prop.format {
        collect_patterns(inner, out);
    }
    if let Some(items) = &prop.items {
        collect_property_patterns(items, out);
    }
}

/// Compiles a PVE schema pattern the way JSONSchema.pm applies it: `m/^$pattern$/`.
///
/// The pattern is interpolated as is, not wrapped in a group, so a top-level alternation
/// (`/dev/parport\d+|/dev/usb/lp\d+`) is anchored on its outer ends only, exactly as in Perl.
/// Perl-only spellings in the dump are translated: `(?^:` (a stringified `qr//`) becomes
/// `(?:`, `{,n}` becomes `{0,n}` and `\0` becomes `\x00`.
pub(crate) fn compile_anchored(pattern: &str) -> Result<Regex, regex::Error> {
    let translated = pattern
        .replace("(?^:", "(?:")
        .replace("{,", "{0,")
        .replace("\\0", "\\x00");
    Regex::new(&format!("^{translated}$"))
}
