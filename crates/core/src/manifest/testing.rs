//! Test helpers: parse a small YAML string and look at the rendered diagnostics.

use super::{ParsedFile, Resource, Spec, parse_file};

/// The envelope of a document of `kind` named `name`, to prepend to a `spec:` block.
pub(crate) fn doc(kind: &str, name: &str, spec: &str) -> String {
    format!("apiVersion: proxops/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}\nspec:\n{spec}")
}

/// Parses `yaml` as `test.yaml`.
pub(crate) fn parse(yaml: &str) -> ParsedFile {
    parse_file("test.yaml", yaml)
}

/// The rendered diagnostics of `yaml`, one string each.
pub(crate) fn errors(yaml: &str) -> Vec<String> {
    parse(yaml)
        .diagnostics
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The one resource of a valid `yaml`, failing with the diagnostics otherwise.
pub(crate) fn valid(yaml: &str) -> Resource {
    let file = parse(yaml);
    assert!(
        file.diagnostics.is_empty(),
        "unexpected diagnostics:\n{}",
        errors(yaml).join("\n")
    );
    assert_eq!(file.resources.len(), 1);
    let resource = file.resources.into_iter().next().unwrap();
    assert!(resource.spec.is_some());
    resource
}

/// Asserts that `yaml` has exactly these diagnostics.
#[track_caller]
pub(crate) fn assert_errors(yaml: &str, expected: &[&str]) {
    let actual = errors(yaml);
    assert_eq!(actual, expected, "\nactual:\n{}\n", actual.join("\n"));
}

/// The validated spec of a valid `yaml`.
pub(crate) fn spec(yaml: &str) -> Spec {
    valid(yaml).spec.unwrap()
}
