//! ProxOps's layout of the cluster's SOPS document against a file written by a real sops
//! release (tests/fixtures/sops/proxops, see its PROVENANCE.md): key names listed without an
//! identity, references resolved from the decrypted document, and `[secrets]` in agent.toml.
//! Decryption itself is tested in `proxops-sops`.

use std::path::{Path, PathBuf};

use proxops_sops::{AgeIdentity, SopsDocument};
use secrecy::ExposeSecret;

use super::sops::{RefStatus, key_names, resolve};

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sops")
        .join(path)
}

fn text(path: &str) -> String {
    std::fs::read_to_string(fixture(path)).unwrap()
}

fn decrypt(file: &str, key: &str) -> SopsDocument {
    let identity = AgeIdentity::from_file(&fixture(key)).unwrap();
    SopsDocument::load(&fixture(file), &identity).unwrap()
}

#[test]
fn secrets_references_resolve_to_non_empty_values_of_their_section() {
    let doc = decrypt("proxops/proxops.sops.yaml", "getsops-sops/keys.txt");
    let resolved = |reference: &str| resolve(&doc, reference).map(|v| v.expose_secret().to_owned());
    assert_eq!(
        resolved("cloud-init.ssh-keys.admin").as_deref(),
        Some("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHdvAdminKeyForTestsOnly admin@example")
    );
    assert_eq!(
        resolved("cloud-init.ssh-keys.deploy").as_deref(),
        Some("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDeployKeyForTestsOnly deploy@example")
    );
    assert_eq!(
        resolved("cloud-init.passwords.default").as_deref(),
        Some("s3cr3t-Passw0rd")
    );
    assert_eq!(
        resolved("cloud-init.passwords.rescue").as_deref(),
        Some("r3scue: with colon")
    );
    assert_eq!(resolved("cloud-init.ssh-keys.nobody"), None);
    // `secrets.*` exists but is not something a manifest can reference.
    assert_eq!(
        doc.get("secrets.pve-token")
            .map(|v| v.expose_secret().to_owned())
            .as_deref(),
        Some("0b5e6c7d-aaaa-bbbb-cccc-123456789abc")
    );
    assert_eq!(resolved("secrets.pve-token"), None);

    let doc = decrypt("proxops/proxops.sops.json", "getsops-sops/keys.txt");
    assert_eq!(
        resolve(&doc, "cloud-init.passwords.default")
            .map(|v| v.expose_secret().to_owned())
            .as_deref(),
        Some("json-pass")
    );
}

#[test]
fn secrets_an_unencrypted_file_has_no_key_names() {
    let err = key_names(Path::new("plain.yaml"), &text("proxops/plain/proxops.yaml")).unwrap_err();
    assert!(
        matches!(err, proxops_sops::SopsError::Unencrypted { .. }),
        "{err}"
    );
}

#[test]
fn secrets_key_names_are_listed_without_an_identity() {
    let names = key_names(
        Path::new("secrets.sops.yaml"),
        &text("proxops/proxops.sops.yaml"),
    )
    .unwrap();
    assert_eq!(
        names.ssh_keys.iter().collect::<Vec<_>>(),
        ["admin", "deploy"]
    );
    assert_eq!(
        names.passwords.iter().collect::<Vec<_>>(),
        ["default", "rescue"]
    );
    assert!(names.secrets.contains("pve-token"));
    assert_eq!(
        names.status("cloud-init.ssh-keys.admin"),
        RefStatus::Present
    );
    assert_eq!(names.status("cloud-init.ssh-keys.root"), RefStatus::Missing);
    assert_eq!(
        names.status("cloud-init.passwords.default"),
        RefStatus::Present
    );
    assert_eq!(names.status("secrets.empty"), RefStatus::Empty);
}

#[test]
fn secrets_config_names_the_identity_and_document_relative_to_agent_toml() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "t\n").unwrap();
    let path = dir.path().join("agent.toml");
    let text = "node = \"pve1\"\n[pve]\ntoken_id = \"root@pam!x\"\ntoken_secret_file = \"token\"\ninsecure = true\n[secrets]\nage_key_file = \"age.key\"\nfile = \"ops/secrets.sops.yaml\"\n";
    let config = crate::config::AgentConfig::from_toml(&path, text).unwrap();
    assert_eq!(
        config.secrets.age_key_file,
        Some(dir.path().join("age.key"))
    );
    assert_eq!(
        config.secrets.file,
        Some(dir.path().join("ops/secrets.sops.yaml"))
    );
    let err = crate::config::AgentConfig::from_toml(
        &path,
        "[secrets]\nage_key = \"AGE-SECRET-KEY-1X\"\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("unknown field `age_key`"), "{err}");
}
