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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crate::manifest::testing::{assert_errors, doc, errors, parse};

    const ISO_SPEC: &str =
        "  nodes: [pve1]\n  storage: local\n  filename: a.iso\n  url: https://x.org/a.iso\n";

    #[test]
    fn an_api_version_other_than_v1alpha1_is_an_error() {
        let yaml = doc("ISO", "a", ISO_SPEC).replace("proxops/v1alpha1", "proxops/v1");
        assert_errors(
            &yaml,
            &[
                "test.yaml:1:13: error: apiVersion: unsupported apiVersion `proxops/v1`\n  help: write `apiVersion: proxops/v1alpha1`",
            ],
        );
    }

    #[test]
    fn an_unknown_kind_lists_the_accepted_ones() {
        assert_errors(
            &doc("Containr", "a", ISO_SPEC),
            &[
                "test.yaml:2:7: error: kind: unknown kind `Containr`\n  help: expected one of VM, LXC, ISO, CTTemplate, DiskImage, TemplateVM, TemplateCT (case-insensitive; aliases CTT, DISK, TVM, TEMPLATE, TCT)",
            ],
        );
    }

    #[test]
    fn kinds_are_case_insensitive_with_aliases() {
        for kind in ["iso", "Iso", "ISO"] {
            assert_eq!(parse(&doc(kind, "a", ISO_SPEC)).resources.len(), 1);
        }
        let disk = doc("disk", "a", &ISO_SPEC.replace("a.iso\n", "a.qcow2\n"));
        assert_eq!(parse(&disk).resources[0].id.to_string(), "DiskImage/a");
    }

    #[test]
    fn invalid_metadata_names_are_errors_with_a_suggestion() {
        assert_errors(
            &doc("ISO", "Web_1", ISO_SPEC),
            &[
                "test.yaml:4:9: error: metadata.name: `Web_1` is not a valid name\n  help: names are lowercase letters, digits and single hyphens, starting and ending with a letter or digit, e.g. `web-1`",
            ],
        );
        let long = "a".repeat(65);
        assert!(errors(&doc("ISO", &long, ISO_SPEC))[0].contains("is longer than 64 characters"));
    }

    #[test]
    fn depends_on_becomes_explicit_references() {
        let yaml = doc("ISO", "a", ISO_SPEC).replace(
            "  name: a\n",
            "  name: a\n  annotations:\n    proxops/depends-on: 'lxc:db-1,TVM:tpl , ctt:debian'\n",
        );
        let file = parse(&yaml);
        assert!(file.diagnostics.is_empty(), "{:?}", file.diagnostics);
        let targets: Vec<String> = file.resources[0]
            .references
            .iter()
            .map(|r| r.target.to_string())
            .collect();
        assert_eq!(targets, ["LXC/db-1", "TemplateVM/tpl", "CTTemplate/debian"]);
        assert!(
            file.resources[0]
                .references
                .iter()
                .all(|r| r.explicit && r.location.line == 6)
        );
    }

    #[test]
    fn depends_on_with_bad_syntax_or_unknown_kinds_is_an_error() {
        let yaml = doc("ISO", "a", ISO_SPEC).replace(
            "  name: a\n",
            "  name: a\n  annotations:\n    proxops/depends-on: 'db-1,Pod:x,,LXC:'\n",
        );
        assert_errors(
            &yaml,
            &[
                "test.yaml:6:25: error: metadata.annotations.proxops/depends-on: `LXC:` has no name\n  help: write `Kind:name` entries separated by commas, e.g. `ISO:netinst,LXC:db-1`",
                "test.yaml:6:25: error: metadata.annotations.proxops/depends-on: `db-1` is not `Kind:name`\n  help: write `Kind:name` entries separated by commas, e.g. `ISO:netinst,LXC:db-1`",
                "test.yaml:6:25: error: metadata.annotations.proxops/depends-on: empty entry\n  help: write `Kind:name` entries separated by commas, e.g. `ISO:netinst,LXC:db-1`",
                "test.yaml:6:25: error: metadata.annotations.proxops/depends-on: unknown kind `Pod` in `Pod:x`\n  help: expected one of VM, LXC, ISO, CTTemplate, DiskImage, TemplateVM, TemplateCT (case-insensitive; aliases CTT, DISK, TVM, TEMPLATE, TCT)",
            ],
        );
    }

    #[test]
    fn unknown_proxops_annotations_and_bad_values_are_errors() {
        let yaml = doc("ISO", "a", ISO_SPEC).replace(
            "  name: a\n",
            "  name: a\n  annotations:\n    proxops/depends_on: x\n    proxops/drift: ignore\n    example.com/owner: me\n",
        );
        assert_errors(
            &yaml,
            &[
                "test.yaml:6:5: error: metadata.annotations.proxops/depends_on: unknown annotation `proxops/depends_on`\n  help: did you mean `proxops/depends-on`?",
                "test.yaml:7:20: error: metadata.annotations.proxops/drift: `ignore` is not a value of `proxops/drift`\n  help: expected one of `report`, `correct`",
            ],
        );
    }

    #[test]
    fn a_snapshot_annotation_with_an_unknown_value_is_a_located_error() {
        let yaml = doc("ISO", "a", ISO_SPEC).replace(
            "  name: a\n",
            "  name: a\n  annotations:\n    proxops/snapshot: always\n",
        );
        assert_errors(
            &yaml,
            &[
                "test.yaml:6:23: error: metadata.annotations.proxops/snapshot: `always` is not a value of `proxops/snapshot`\n  help: expected one of `off`, `risky`, `updates`",
            ],
        );
    }

    #[test]
    fn several_documents_are_read_and_empty_ones_skipped() {
        let yaml = format!(
            "---\n{}\n---\n\n---\n{}",
            doc("ISO", "a", ISO_SPEC),
            doc("ISO", "b", ISO_SPEC)
        );
        let file = parse(&yaml);
        assert!(file.diagnostics.is_empty(), "{:?}", file.diagnostics);
        assert_eq!(file.resources.len(), 2);
        assert_eq!(file.resources[1].location.line, 18);
    }

    #[test]
    fn problems_in_every_document_are_reported() {
        let yaml = format!(
            "{}---\n{}",
            doc("ISO", "A", ISO_SPEC),
            doc("ISO", "b", "  nodes: [pve1]\n")
        );
        let e = errors(&yaml);
        assert_eq!(e.len(), 4, "{e:#?}");
        assert!(e[0].starts_with("test.yaml:4:9: error: metadata.name"));
        assert!(
            e[1].starts_with("test.yaml:15:1: error: spec.filename: missing required field"),
            "{e:#?}"
        );
    }

    #[test]
    fn a_yaml_syntax_error_is_located_and_other_documents_still_parse() {
        let yaml = format!("apiVersion: [\n---\n{}", doc("ISO", "b", ISO_SPEC));
        let file = parse(&yaml);
        assert_eq!(file.resources.len(), 1);
        assert_eq!(file.diagnostics.len(), 1);
        let d = &file.diagnostics[0];
        assert!(d.message.starts_with("invalid YAML: "), "{d}");
        assert!(d.line == 2 || d.line == 1, "{d}");
    }

    #[test]
    fn a_document_that_is_not_a_mapping_is_an_error() {
        assert_errors(
            "- a\n- b\n",
            &[
                "test.yaml:1:1: error: expected a manifest (a mapping), found a list\n  help: a manifest has `apiVersion`, `kind`, `metadata` and `spec`",
            ],
        );
    }

    #[test]
    fn a_billion_laughs_document_is_refused_quickly() {
        let mut yaml = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for (i, prev) in ('b'..='j').zip('a'..='i') {
            yaml.push_str(&format!("{i}: &{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
        }
        let start = Instant::now();
        let e = errors(&yaml);
        assert!(
            start.elapsed().as_millis() < 500,
            "took {:?}",
            start.elapsed()
        );
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(
            e[0].contains(
                "error: document too large: more than 20000 YAML nodes after expanding aliases"
            ),
            "{e:#?}"
        );
    }

    #[test]
    fn deeply_nested_documents_are_refused_quickly() {
        for yaml in [
            "[".repeat(10_000),
            "- ".repeat(10_000) + "x",
            "{a: ".repeat(10_000),
        ] {
            let start = Instant::now();
            let e = errors(&yaml);
            assert!(
                start.elapsed().as_millis() < 1000,
                "took {:?}",
                start.elapsed()
            );
            assert_eq!(e.len(), 1, "{e:#?}");
            assert!(
                e[0].contains("nesting deeper than 32 levels") || e[0].contains("invalid YAML"),
                "{e:#?}"
            );
        }
    }

    #[test]
    fn duplicate_keys_are_reported() {
        let yaml = doc("ISO", "a", &format!("{ISO_SPEC}  storage: other\n"));
        assert_errors(
            &yaml,
            &[
                "test.yaml:10:3: error: duplicate key `storage`\n  help: a key may appear once per mapping; remove one of them",
            ],
        );
    }
}
