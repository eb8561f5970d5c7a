//! One YAML document → at most one [`Resource`]: the envelope first, then the kind's spec.
//!
//! `apiVersion` and `kind` are read straight from the tree, then the whole document is decoded
//! into that kind's raw type (never through a tagged enum, which would lose locations and
//! stop at the first error).

use serde::de::IgnoredAny;

use super::check::Checker;
use super::decode::{decode, did_you_mean};
use super::metadata::{KINDS_HELP, check_metadata};
use super::raw::{RawArtifactSpec, RawDocument, RawLxcSpec, RawVmSpec};
use super::yaml::{Node, Value};
use super::{API_VERSION, ParsedFile, Placement, Reference, Resource, Spec, artifact, lxc, vm};
use crate::resource::{Kind, ResourceId};

/// What a kind's spec check found.
pub(crate) struct Checked {
    /// The validated spec, if the spec itself is valid.
    pub(crate) spec: Option<Spec>,
    /// Where the resource lives, if that much could be read.
    pub(crate) placement: Option<Placement>,
    /// Structured references.
    pub(crate) references: Vec<Reference>,
}

/// Checks one document and adds its resource and problems to `file`.
pub(crate) fn check_document(path: &str, root: &Node, file: &mut ParsedFile) {
    let mut ck = Checker::new(path, root);
    if !matches!(root.value, Value::Map(_)) {
        ck.error_help(
            "",
            format!("expected a manifest (a mapping), found {}", root.describe()),
            "a manifest has `apiVersion`, `kind`, `metadata` and `spec`",
        );
        file.diagnostics.append(&mut ck.problems);
        return;
    }
    check_api_version(&mut ck);
    let kind = read_kind(&mut ck);
    let resource = match kind {
        Some(kind @ (Kind::Vm | Kind::TemplateVm)) => {
            with_spec::<RawVmSpec>(&mut ck, kind, |ck, spec, name| {
                vm::check_vm(ck, kind, name, spec)
            })
        }
        Some(kind @ (Kind::Lxc | Kind::TemplateCt)) => {
            with_spec::<RawLxcSpec>(&mut ck, kind, |ck, spec, name| {
                lxc::check_lxc(ck, kind, name, spec)
            })
        }
        Some(kind) => with_spec::<RawArtifactSpec>(&mut ck, kind, |ck, spec, _| {
            let (spec, placement) = artifact::check_artifact(ck, kind, spec);
            Checked {
                spec,
                placement,
                references: Vec::new(),
            }
        }),
        None => {
            // Still report what is wrong with the rest of the envelope.
            if let Some(raw) = decode::<RawDocument<IgnoredAny>>(path, root, &mut ck.problems) {
                check_metadata(&mut ck, raw.metadata.as_ref());
            }
            None
        }
    };
    if let Some(resource) = resource {
        file.resources.push(resource);
    }
    file.diagnostics.append(&mut ck.problems);
}

/// Decodes the document with `S` as its spec, checks it, and builds the resource.
fn with_spec<S>(
    ck: &mut Checker<'_>,
    kind: Kind,
    check: impl FnOnce(&mut Checker<'_>, &S, &str) -> Checked,
) -> Option<Resource>
where
    S: serde::de::DeserializeOwned,
{
    let raw = decode::<RawDocument<S>>(ck.file, ck.root, &mut ck.problems)?;
    let meta = check_metadata(ck, raw.metadata.as_ref());
    let name = meta.name.clone().unwrap_or_default();
    let checked = match &raw.spec {
        Some(spec) => check(ck, spec, &name),
        None => {
            ck.missing("spec", None);
            Checked {
                spec: None,
                placement: None,
                references: Vec::new(),
            }
        }
    };
    let valid = !ck.has_errors();
    let name = meta.name?;
    let mut references = checked.references;
    references.extend(meta.depends_on);
    Some(Resource {
        id: ResourceId::new(kind, name),
        path: ck.file.to_owned(),
        location: meta.name_location,
        labels: meta.labels,
        annotations: meta.annotations,
        placement: checked.placement?,
        references,
        spec: if valid { checked.spec } else { None },
    })
}

fn check_api_version(ck: &mut Checker<'_>) {
    let help = format!("write `apiVersion: {API_VERSION}`");
    match ck.root.get("apiVersion") {
        None => ck.missing("apiVersion", Some(help)),
        Some(node) => match node.as_str() {
            Some(API_VERSION) | None => {}
            Some(other) => ck.error_help(
                "apiVersion",
                format!("unsupported apiVersion `{other}`"),
                help,
            ),
        },
    }
}

fn read_kind(ck: &mut Checker<'_>) -> Option<Kind> {
    let Some(node) = ck.root.get("kind") else {
        ck.missing("kind", Some(KINDS_HELP.to_owned()));
        return None;
    };
    let text = node.as_str()?;
    match text.parse::<Kind>() {
        Ok(kind) => Some(kind),
        Err(_) => {
            let spellings = [
                "VM",
                "LXC",
                "ISO",
                "CTTemplate",
                "DiskImage",
                "TemplateVM",
                "TemplateCT",
            ];
            let help = match did_you_mean(text, &spellings) {
                Some(s) => format!("did you mean `{s}`? {KINDS_HELP}"),
                None => KINDS_HELP.to_owned(),
            };
            ck.error_help("kind", format!("unknown kind `{text}`"), help);
            None
        }
    }
}
