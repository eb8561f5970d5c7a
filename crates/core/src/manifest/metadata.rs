//! `metadata`: the name, labels, and the `proxops/*` annotations with their values checked.
//!
//! `proxops/depends-on` (`Kind:name,Kind:name`, kinds case-insensitive with the Go aliases)
//! becomes explicit [`Reference`]s; whether their targets exist is a cross-resource check
//! made elsewhere.

use std::collections::BTreeMap;

use super::check::Checker;
use super::decode::{did_you_mean, one_of};
use super::ids::{MAX_NAME_LEN, is_valid_name, suggest_name};
use super::raw::RawMetadata;
use super::{Location, Reference};
use crate::resource::{Kind, ResourceId};

/// The annotation holding explicit dependencies.
pub const DEPENDS_ON: &str = "proxops/depends-on";
/// The annotation that makes drift report-only (`report`).
pub const DRIFT: &str = "proxops/drift";
/// The annotation that lets ProxOps adopt an untagged guest (`"true"`).
pub const ADOPT: &str = "proxops/adopt";
/// The annotation that allows restarts to apply pending changes (`on-change`).
pub const RESTART: &str = "proxops/restart";
/// The annotation that overrides `[policy] snapshot` for one guest (issue 19).
pub const SNAPSHOT: &str = "proxops/snapshot";

/// The `proxops/` annotations ProxOps reads, with the values each accepts.
const KNOWN: [(&str, &[&str]); 5] = [
    (DEPENDS_ON, &[]),
    (DRIFT, &["report", "correct"]),
    (ADOPT, &["true", "false"]),
    (RESTART, &["on-change", "never"]),
    (SNAPSHOT, &["off", "risky", "updates"]),
];

/// The help text listing every kind spelling.
pub(crate) const KINDS_HELP: &str = "expected one of VM, LXC, ISO, CTTemplate, DiskImage, TemplateVM, TemplateCT \
     (case-insensitive; aliases CTT, DISK, TVM, TEMPLATE, TCT)";

/// Checked metadata.
#[derive(Debug, Default)]
pub(crate) struct Metadata {
    /// `metadata.name`, when valid.
    pub(crate) name: Option<String>,
    /// Where `metadata.name` is.
    pub(crate) name_location: Location,
    /// `metadata.labels`.
    pub(crate) labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub(crate) annotations: BTreeMap<String, String>,
    /// `proxops/depends-on` edges.
    pub(crate) depends_on: Vec<Reference>,
}

/// Checks `metadata`.
pub(crate) fn check_metadata(ck: &mut Checker<'_>, raw: Option<&RawMetadata>) -> Metadata {
    let Some(raw) = raw else {
        ck.missing(
            "metadata",
            Some("add `metadata:` with a `name:`".to_owned()),
        );
        return Metadata::default();
    };
    let mut meta = Metadata {
        name_location: ck.location("metadata.name"),
        labels: raw.labels.clone().unwrap_or_default(),
        annotations: raw.annotations.clone().unwrap_or_default(),
        ..Metadata::default()
    };
    match &raw.name {
        None => ck.missing("metadata.name", None),
        Some(name) if is_valid_name(name) => meta.name = Some(name.clone()),
        Some(name) if ck.reported("metadata.name") => {}
        Some(name) => {
            let message = if name.len() > MAX_NAME_LEN {
                format!("`{name}` is longer than {MAX_NAME_LEN} characters")
            } else {
                format!("`{name}` is not a valid name")
            };
            let rule = "names are lowercase letters, digits and single hyphens, starting and ending with a letter or digit";
            match suggest_name(name).filter(|s| s != name) {
                Some(s) => ck.error_help("metadata.name", message, format!("{rule}, e.g. `{s}`")),
                None => ck.error_help("metadata.name", message, rule),
            }
        }
    }
    for (key, value) in &meta.annotations {
        let field = format!("metadata.annotations.{key}");
        if ck.reported(&field) {
            continue;
        }
        let Some(unprefixed) = key.strip_prefix("proxops/") else {
            continue;
        };
        let Some((_, accepted)) = KNOWN.iter().find(|(k, _)| *k == key) else {
            let names: Vec<&str> = KNOWN
                .iter()
                .map(|(k, _)| k.trim_start_matches("proxops/"))
                .collect();
            let help = match did_you_mean(unprefixed, &names) {
                Some(s) => format!("did you mean `proxops/{s}`?"),
                None => format!("ProxOps reads {}", one_of(&KNOWN.map(|(k, _)| k))),
            };
            ck.error_at_key(&field, format!("unknown annotation `{key}`"), help);
            continue;
        };
        if key == DEPENDS_ON {
            meta.depends_on = depends_on(ck, &field, value);
        } else if !accepted.contains(&value.as_str()) {
            ck.error_help(
                &field,
                format!("`{value}` is not a value of `{key}`"),
                format!("expected one of {}", one_of(accepted)),
            );
        }
    }
    meta
}

/// Parses `Kind:name,Kind:name`.
fn depends_on(ck: &mut Checker<'_>, field: &str, value: &str) -> Vec<Reference> {
    let location = ck.location(field);
    let mut references: Vec<Reference> = Vec::new();
    for entry in value.split(',').map(str::trim) {
        let syntax = "write `Kind:name` entries separated by commas, e.g. `ISO:netinst,LXC:db-1`";
        if entry.is_empty() {
            ck.error_help(field, "empty entry", syntax);
            continue;
        }
        let Some((kind, name)) = entry.split_once(':').map(|(k, n)| (k.trim(), n.trim())) else {
            ck.error_help(field, format!("`{entry}` is not `Kind:name`"), syntax);
            continue;
        };
        let Ok(kind) = kind.parse::<Kind>() else {
            ck.error_help(
                field,
                format!("unknown kind `{kind}` in `{entry}`"),
                KINDS_HELP,
            );
            continue;
        };
        if name.is_empty() {
            ck.error_help(field, format!("`{entry}` has no name"), syntax);
            continue;
        }
        let name_ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !name_ok {
            ck.error_help(
                field,
                format!("`{name}` in `{entry}` is not a resource name"),
                syntax,
            );
            continue;
        }
        let target = ResourceId::new(kind, name);
        if references.iter().any(|r| r.target == target) {
            continue;
        }
        references.push(Reference {
            target,
            field: field.to_owned(),
            location,
            explicit: true,
        });
    }
    references
}
