//! `proxops validate`, `proxops schema` and `--version` as a user runs them.
//!
//! The diagnostic text of every invalid fixture is part of the contract: file, line, column,
//! field path and message are snapshotted (`cargo insta review` to accept a change).

use crate::support::{fixture, proxops, repo_root, stderr, stdout};

#[test]
fn validate_accepts_the_example_repository() {
    let out = proxops(&["validate", "examples"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "cluster homelab: 8 resources in 8 files, 3 levels\n"
    );
    assert_eq!(stderr(&out), "");
}

#[test]
fn validate_json_reports_layout_states_and_no_diagnostics() {
    let out = proxops(&["validate", "examples", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["valid"], true);
    assert_eq!(report["layout"], "composition");
    assert_eq!(report["states"][0]["cluster"], "homelab");
    assert_eq!(report["states"][0]["resources"], 8);
    assert_eq!(report["diagnostics"].as_array().unwrap().len(), 0);
}

#[test]
fn validate_of_a_missing_directory_is_an_error_that_names_it() {
    let out = proxops(&["validate", "no/such/repo"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: reading manifests from no/such/repo: no/such/repo is not a directory\n"
    );
}

#[test]
fn every_valid_fixture_validates() {
    let dir = fixture("valid");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let out = proxops(&["validate", path.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            path.display(),
            stderr(&out)
        );
    }
}

#[test]
fn every_invalid_fixture_fails_with_its_snapshotted_diagnostics() {
    let dir = fixture("invalid");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(
        names.len() >= 30,
        "one fixture per validation rule, found {}",
        names.len()
    );
    for name in names {
        let rel = format!("tests/fixtures/invalid/{name}");
        let out = proxops(&["validate", &rel]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{name} should be invalid: {}",
            stderr(&out)
        );
        insta::with_settings!({ snapshot_path => repo_root().join("tests/snapshots"), prepend_module_to_snapshot => false }, {
            insta::assert_snapshot!(format!("invalid__{name}"), stderr(&out));
        });
    }
}

#[test]
fn schema_is_a_json_schema_document() {
    let out = proxops(&["schema"]);
    assert_eq!(out.status.code(), Some(0));
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        schema["$schema"]
            .as_str()
            .unwrap()
            .contains("json-schema.org")
    );
}

#[test]
fn version_prints_the_package_version() {
    let out = proxops(&["--version"]);
    assert_eq!(
        stdout(&out),
        format!("proxops {}\n", env!("CARGO_PKG_VERSION"))
    );
}
