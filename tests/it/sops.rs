//! `proxops validate` checks `ssh-key-refs` / `ci-password-ref` against the key names of the
//! cluster's SOPS document (tests/fixtures/sops-repo), without an age identity.

use std::path::Path;

use crate::support::{fixture, proxops, stderr, stdout};

/// A copy of the fixture repository, with `edit` applied to its VM manifest.
fn repo_with(edit: impl Fn(String) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture("sops-repo"), dir.path());
    let vm = dir.path().join("vm/base/web.yaml");
    let text = std::fs::read_to_string(&vm).unwrap();
    std::fs::write(&vm, edit(text)).unwrap();
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn validate_accepts_refs_that_name_keys_of_the_sops_document() {
    let out = proxops(&["validate", "tests/fixtures/sops-repo"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "cluster lab: 1 resources in 1 files, 1 levels\n"
    );
    assert_eq!(stderr(&out), "");
}

#[test]
fn validate_reports_a_ref_missing_from_the_sops_document_at_the_ref() {
    let repo = repo_with(|t| {
        t.replace("cloud-init.ssh-keys.admin", "cloud-init.ssh-keys.ops")
            .replace("cloud-init.passwords.default", "cloud-init.passwords.root")
    });
    let out = proxops(&["validate", repo.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "vm/base/web.yaml:26:9: error: spec.cloud-init-data.ssh-key-refs[0]: `cloud-init.ssh-keys.ops` is not a key of clusters/lab/secrets.sops.yaml\n  \
         help: add it with `sops edit clusters/lab/secrets.sops.yaml` under `cloud-init.ssh-keys`, or use a name it has (admin, deploy)\n\
         vm/base/web.yaml:28:22: error: spec.cloud-init-data.ci-password-ref: `cloud-init.passwords.root` is not a key of clusters/lab/secrets.sops.yaml\n  \
         help: add it with `sops edit clusters/lab/secrets.sops.yaml` under `cloud-init.passwords`, or use a name it has (default, rescue)\n\
         error: 2 problems found; nothing of this revision would be applied\n"
    );
}

#[test]
fn validate_refuses_a_plain_secrets_file_and_a_missing_one() {
    let repo = repo_with(|t| t);
    let secrets = repo.path().join("clusters/lab/secrets.sops.yaml");
    std::fs::write(
        &secrets,
        "cloud-init:\n  ssh-keys:\n    admin: ssh-ed25519 AAAA x\n",
    )
    .unwrap();
    let out = proxops(&["validate", repo.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with(
            "clusters/lab/secrets.sops.yaml:1:1: error: not encrypted by sops (no `sops` metadata)\n"
        ),
        "{}",
        stderr(&out)
    );

    std::fs::remove_file(&secrets).unwrap();
    let out = proxops(&["validate", repo.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(
            "vm/base/web.yaml:26:9: error: spec.cloud-init-data.ssh-key-refs[0]: `cloud-init.ssh-keys.admin` cannot be resolved: cluster `lab` has no SOPS document clusters/lab/secrets.sops.yaml\n"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn validate_follows_the_secrets_file_named_in_the_cluster_config() {
    let repo = repo_with(|t| t);
    let lab = repo.path().join("clusters/lab");
    std::fs::rename(lab.join("secrets.sops.yaml"), lab.join("creds.sops.yaml")).unwrap();
    std::fs::write(
        lab.join("config.yaml"),
        "pve:\n  clusters:\n    lab:\n      base-url: https://10.0.0.1:8006\n      secrets-file: creds.sops.yaml\n",
    )
    .unwrap();
    let out = proxops(&["validate", repo.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
}
