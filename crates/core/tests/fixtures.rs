//! The fixture repositories under `tests/fixtures/` as [`proxops_core::load`] sees them.
//!
//! Each `invalid/<rule>/` repository breaks exactly one validation rule and must yield exactly
//! one error; each `valid/<name>/` repository must yield none. The CLI's snapshot tests pin the
//! full diagnostic text; these tests pin which rule fires, without the binary. Reading the
//! fixtures from disk is the test's job: the library itself never touches the filesystem.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use proxops_core::diagnostic::Diagnostic;
use proxops_core::repository::{Layout, Loaded};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// Every `.yaml`/`.yml` file below `root`, keyed by `/`-separated relative path, skipping
/// dot-entries as the CLI does.
fn read_repository(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, files: &mut BTreeMap<String, String>) {
        for entry in fs::read_dir(dir).expect("fixture folder is readable") {
            let path = entry.expect("fixture entry is readable").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.starts_with('.') {
                continue;
            }
            if path.is_dir() {
                walk(root, &path, files);
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                let relative = path.strip_prefix(root).expect("below the root");
                let key = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                files.insert(key, fs::read_to_string(&path).expect("fixture is UTF-8"));
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(root, root, &mut files);
    files
}

fn load_fixture(group: &str, name: &str) -> Loaded {
    let root = fixtures().join(group).join(name);
    assert!(root.is_dir(), "missing fixture {}", root.display());
    proxops_core::load(&read_repository(&root))
}

fn fixture_names(group: &str) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(fixtures().join(group))
        .expect("fixture group exists")
        .map(|e| {
            e.expect("readable")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| !name.starts_with('.'))
        .collect();
    names.sort();
    names
}

fn errors(loaded: &Loaded) -> Vec<&Diagnostic> {
    loaded.diagnostics.iter().filter(|d| d.is_error()).collect()
}

fn rendered(diagnostics: &[&Diagnostic]) -> String {
    diagnostics.iter().map(|d| format!("{d}\n")).collect()
}

/// Rule fixtures whose error comes from the repository layout: they need no manifest parsing.
const COMPOSITION_RULES: [(&str, &str); 4] = [
    (
        "composition-missing-path",
        "`../../vm/lab/db-1.yaml` does not exist",
    ),
    (
        "composition-outside-repo",
        "`../../../shared/vm/db-1.yaml` is outside the repository",
    ),
    (
        "composition-listed-twice",
        "`../../vm/lab/../base/web-1.yaml` is listed twice",
    ),
    (
        "legacy-layout",
        "manifest directly under the kind root `vm/` (legacy layout)",
    ),
];

/// Rule fixtures whose error comes from checking resources against each other, with the
/// message fragment that names the rule.
const CROSS_RESOURCE_RULES: [(&str, &str); 9] = [
    ("duplicate-name", "duplicate VM `web-1`"),
    ("vmid-declared-twice", "vmid 101 is already used by"),
    ("missing-iso", "ISO `debian-netinst` is not declared"),
    (
        "missing-diskimage",
        "DiskImage `debian-12-genericcloud` is not declared",
    ),
    (
        "missing-cttemplate",
        "CTTemplate `debian-12-standard` is not declared",
    ),
    (
        "missing-templatevm",
        "TemplateVM `debian-12-template` is not declared",
    ),
    (
        "artifact-not-on-node",
        "ISO `debian-netinst` is not on node `pve2`, where VM `installer` runs",
    ),
    (
        "depends-on-missing",
        "depends-on target `LXC/db-1` does not exist",
    ),
    ("cycle", "cycle: VM/app-1 -> VM/app-2 -> VM/app-1"),
];

/// Every rule of issue 2 item 5 that has a fixture.
const ALL_RULES: [&str; 33] = [
    "unknown-key",
    "wrong-type",
    "missing-required",
    "bad-api-version",
    "bad-name",
    "duplicate-name",
    "vmid-out-of-range",
    "vmid-declared-twice",
    "artifact-node-and-nodes",
    "filename-rewritten",
    "wrong-extension",
    "diskimage-extension-case",
    "diskimage-ovf",
    "url-not-http",
    "url-scheme-uppercase",
    "checksum-algorithm",
    "checksum-length",
    "quantity-malformed",
    "memory-not-whole-mib",
    "slot-twice-disk",
    "slot-twice-nic",
    "ssd-on-virtio",
    "missing-iso",
    "missing-diskimage",
    "missing-cttemplate",
    "missing-templatevm",
    "artifact-not-on-node",
    "depends-on-missing",
    "cycle",
    "composition-missing-path",
    "composition-outside-repo",
    "composition-listed-twice",
    "legacy-layout",
];

#[test]
fn there_is_one_invalid_fixture_per_rule_and_no_other() {
    let mut expected: Vec<&str> = ALL_RULES.to_vec();
    expected.sort_unstable();
    assert_eq!(fixture_names("invalid"), expected);
}

#[test]
fn composition_fixtures_fail_with_exactly_their_rule() {
    for (name, fragment) in COMPOSITION_RULES {
        let loaded = load_fixture("invalid", name);
        assert_eq!(loaded.layout, Layout::Composition, "{name}");
        let errors = errors(&loaded);
        assert_eq!(errors.len(), 1, "{name}:\n{}", rendered(&errors));
        assert!(
            errors[0].message.contains(fragment),
            "{name}:\n{}",
            rendered(&errors)
        );
        assert!(
            loaded.states.is_empty(),
            "{name} must yield no desired state"
        );
    }
}

#[test]
fn cross_resource_fixtures_fail_with_their_rule() {
    for (name, fragment) in CROSS_RESOURCE_RULES {
        let loaded = load_fixture("invalid", name);
        assert_eq!(loaded.layout, Layout::Plain, "{name}");
        let errors = errors(&loaded);
        assert!(
            errors.iter().any(|d| d.message.contains(fragment)),
            "{name}: expected `{fragment}` in:\n{}",
            rendered(&errors)
        );
    }
}

#[test]
fn every_invalid_fixture_yields_exactly_one_error_and_no_state() {
    let mut failures = String::new();
    for name in fixture_names("invalid") {
        let loaded = load_fixture("invalid", &name);
        let errors = errors(&loaded);
        if errors.len() != 1 || !loaded.states.is_empty() {
            failures.push_str(&format!(
                "{name}: {} errors\n{}",
                errors.len(),
                rendered(&errors)
            ));
        }
    }
    assert!(failures.is_empty(), "{failures}");
}

#[test]
fn every_valid_fixture_yields_no_diagnostic_and_a_state_per_cluster() {
    for name in fixture_names("valid") {
        let loaded = load_fixture("valid", &name);
        let all: Vec<&Diagnostic> = loaded.diagnostics.iter().collect();
        assert!(all.is_empty(), "{name}:\n{}", rendered(&all));
        let expected_states = loaded.clusters.len().max(1);
        assert_eq!(loaded.states.len(), expected_states, "{name}");
    }
}

#[test]
fn valid_composition_shares_base_files_between_two_clusters() {
    let loaded = load_fixture("valid", "composition");
    assert_eq!(loaded.clusters, ["lab", "prod"]);
    let lab = loaded.state(Some("lab")).expect("lab is valid");
    let prod = loaded.state(Some("prod")).expect("prod is valid");
    assert!(lab.files.contains(&"lxc/base/dns-1.yaml".to_owned()));
    assert!(prod.files.contains(&"lxc/base/dns-1.yaml".to_owned()));
    assert!(!lab.files.contains(&"vm/prod/web-1.yaml".to_owned()));
}

#[test]
fn valid_fixtures_hold_the_resources_and_levels_they_declare() {
    let plain = load_fixture("valid", "plain");
    let state = plain.state(None).expect("valid");
    assert_eq!(state.manifest.len(), 9);
    let levels: Vec<Vec<String>> = state
        .levels
        .iter()
        .map(|level| level.iter().map(ToString::to_string).collect())
        .collect();
    assert_eq!(
        levels,
        [
            vec![
                "ISO/debian-netinst",
                "CTTemplate/debian-12-standard",
                "DiskImage/debian-12-genericcloud"
            ],
            vec!["TemplateVM/golden", "VM/installer", "VM/web-1", "LXC/dns-1"],
            vec!["VM/app-1", "LXC/dns-2"],
        ]
    );

    let composition = load_fixture("valid", "composition");
    let prod = composition.state(Some("prod")).expect("prod is valid");
    assert_eq!(prod.manifest.len(), 4);
    assert_eq!(
        prod.levels.len(),
        3,
        "ISO/CTTemplate, then LXC/dns-1, then VM/web-1"
    );
}

#[test]
fn example_repository_is_one_valid_cluster() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let loaded = proxops_core::load(&read_repository(&root));
    let all: Vec<&Diagnostic> = loaded.diagnostics.iter().collect();
    assert!(all.is_empty(), "{}", rendered(&all));
    assert_eq!(loaded.layout, Layout::Composition);
    let state = loaded.state(Some("homelab")).expect("homelab is valid");
    assert_eq!(
        (state.manifest.len(), state.files.len(), state.levels.len()),
        (8, 8, 3)
    );
}
