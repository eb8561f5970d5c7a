//! The decryptor against files written by real sops releases (`tests/data`, see its
//! PROVENANCE.md): every documented plaintext, every value type, the encryption selectors, and
//! each way a file is refused (tampered value, tampered MAC, wrong identity, unencrypted).

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a panic is the failure report"
)]

use std::path::{Path, PathBuf};

use proxops_sops::{AgeIdentity, SopsDocument, SopsError, ValueType, encrypted_tree};
use secrecy::ExposeSecret;

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(path)
}

fn text(path: &str) -> String {
    std::fs::read_to_string(fixture(path)).unwrap()
}

fn identity(path: &str) -> AgeIdentity {
    AgeIdentity::from_file(&fixture(path)).unwrap()
}

fn decrypt(file: &str, key: &str) -> SopsDocument {
    SopsDocument::load(&fixture(file), &identity(key)).unwrap()
}

fn decrypt_text(text: &str, key: &str) -> Result<SopsDocument, SopsError> {
    SopsDocument::decrypt(Path::new("edited.yaml"), text, &identity(key))
}

fn value<'a>(doc: &'a SopsDocument, path: &str) -> &'a str {
    doc.get(path)
        .unwrap_or_else(|| panic!("no {path}"))
        .expose_secret()
}

/// Replaces one character of the first `data:` (or the MAC's `data:`) after `anchor`.
fn flip_data_byte(text: &str, anchor: &str) -> String {
    let start = text.find(anchor).unwrap();
    let data = start + text[start..].find("data:").unwrap() + "data:".len();
    let mut bytes = text.as_bytes().to_vec();
    bytes[data] = if bytes[data] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).unwrap()
}

#[test]
fn getsops_example_decrypts_to_its_documented_plaintext() {
    let doc = decrypt("getsops-sops/example.yaml", "getsops-sops/keys.txt");
    assert_eq!(value(&doc, "myapp1"), "t00m4nys3cr3tzupdated");
    assert_eq!(value(&doc, "app2.db.user"), "eve");
    assert_eq!(value(&doc, "app2.db.password"), "c4r1b0u");
    let key = value(&doc, "app2.key");
    assert!(
        key.starts_with("-----BEGIN RSA PRIVATE KEY-----\nMIIBPAIBAAJBAPTMNIy"),
        "{key}"
    );
    assert!(key.ends_with('\n'));
    assert_eq!(value(&doc, "number"), "1234568000");
    assert_eq!(value(&doc, "an_array[0]"), "secretuser1");
    assert_eq!(value(&doc, "an_array[1]"), "secretuser2");
    assert_eq!(
        value(&doc, "an_array[2]"),
        format!("somelongvalue{}", "A".repeat(45))
    );
    assert_eq!(value(&doc, "an_array[3]"), "some other value");
    assert_eq!(value(&doc, "somebooleans[0]"), "True");
    assert_eq!(value(&doc, "somebooleans[1]"), "False");
    assert_eq!(
        value(&doc, "this.is.a.nested.value"),
        "with something secret in it"
    );
    assert_eq!(
        value(&doc, "nested_unencrypted.this.is.all"),
        "going to remain in clear text"
    );
    assert_eq!(
        value(&doc, "somelist_unencrypted[2]"),
        "because of the _encrypted suffix in the key"
    );

    let types: Vec<(&str, ValueType, bool)> = doc
        .leaves()
        .iter()
        .map(|l| (l.path.as_str(), l.value_type, l.encrypted))
        .collect();
    assert!(types.contains(&("number", ValueType::Float, true)));
    assert!(types.contains(&("somebooleans[0]", ValueType::Bool, true)));
    assert!(types.contains(&("somelist_unencrypted[0]", ValueType::Str, false)));

    let comments: Vec<(&str, &str)> = doc
        .comments()
        .iter()
        .map(|(aad, c)| (aad.as_str(), c.expose_secret()))
        .collect();
    assert_eq!(
        comments,
        [
            ("app2:db:", " private key for secret operations in app2"),
            ("this:is:a:nested:", " sops supports unencrypted fields"),
            ("this:is:a:nested:", " by adding the `_unencrypted` suffix"),
            ("this:is:a:nested:", " to any key"),
        ]
    );
}

#[test]
fn sops_nix_file_decrypts_skipping_the_recipient_without_an_identity() {
    let doc = decrypt("sops-nix/secrets.yaml", "getsops-sops/keys.txt");
    assert_eq!(value(&doc, "test_key"), "test_value");
    assert_eq!(value(&doc, "a_list[0]"), "e1");
    assert_eq!(value(&doc, "a_list[1]"), "e3");
    assert_eq!(value(&doc, "nested.test.file"), "another value");
}

#[test]
fn recipients_are_tried_in_turn_until_one_matches() {
    // Put the entry without an identity here first: the next one must still open the key.
    let original = text("sops-nix/secrets.yaml");
    let first = original.find("        - recipient: age1yt3tf").unwrap();
    let second = original.find("        - recipient: age1a8pk").unwrap();
    let end = original.find("    lastmodified:").unwrap();
    let swapped = format!(
        "{}{}{}{}",
        &original[..first],
        &original[second..end],
        &original[first..second],
        &original[end..]
    );
    let doc = decrypt_text(&swapped, "getsops-sops/keys.txt").unwrap();
    assert_eq!(value(&doc, "test_key"), "test_value");
}

#[test]
fn flux_files_with_encrypted_regex_decrypt_and_keep_clear_fields_in_the_mac() {
    let doc = decrypt("fluxcd/algorithms-age.yaml", "fluxcd/age.txt");
    assert_eq!(value(&doc, "stringData.key"), "value");
    assert_eq!(value(&doc, "metadata.name"), "age");
    assert!(!doc.leaves().iter().any(|l| l.path == "kind" && l.encrypted));

    let doc = decrypt("fluxcd/global-secret.yaml", "fluxcd/age-global.txt");
    assert_eq!(value(&doc, "stringData.key"), "global-value");
    assert_eq!(value(&doc, "metadata.namespace"), "default");
    assert_eq!(value(&doc, "type"), "Opaque");
}

#[test]
fn proxops_document_decrypts_keys_passwords_and_every_value_type() {
    let doc = decrypt("proxops/proxops.sops.yaml", "getsops-sops/keys.txt");
    assert_eq!(
        value(&doc, "cloud-init.ssh-keys.admin"),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHdvAdminKeyForTestsOnly admin@example"
    );
    assert_eq!(
        value(&doc, "cloud-init.ssh-keys.deploy"),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDeployKeyForTestsOnly deploy@example"
    );
    assert_eq!(
        value(&doc, "cloud-init.passwords.default"),
        "s3cr3t-Passw0rd"
    );
    assert_eq!(
        value(&doc, "cloud-init.passwords.rescue"),
        "r3scue: with colon"
    );
    assert_eq!(
        value(&doc, "secrets.pve-token"),
        "0b5e6c7d-aaaa-bbbb-cccc-123456789abc"
    );
    assert_eq!(value(&doc, "secrets.port"), "8006");
    assert_eq!(value(&doc, "secrets.ratio"), "1.5");
    assert_eq!(value(&doc, "secrets.enabled"), "True");
    let typed: Vec<(&str, ValueType)> = doc
        .leaves()
        .iter()
        .map(|l| (l.path.as_str(), l.value_type))
        .collect();
    assert!(typed.contains(&("secrets.port", ValueType::Int)));
    assert!(typed.contains(&("secrets.ratio", ValueType::Float)));
    assert!(typed.contains(&("secrets.enabled", ValueType::Bool)));
    // An empty value is never encrypted.
    assert_eq!(value(&doc, "secrets.empty"), "");
    assert!(
        doc.leaves()
            .iter()
            .any(|l| l.path == "secrets.empty" && !l.encrypted)
    );
    assert!(doc.get("cloud-init.ssh-keys.nobody").is_none());
    // A top-level comment is encrypted with the additional data `:`.
    let comments: Vec<(&str, &str)> = doc
        .comments()
        .iter()
        .map(|(aad, c)| (aad.as_str(), c.expose_secret()))
        .collect();
    assert_eq!(
        comments,
        [
            (
                ":",
                " ProxOps cluster secrets (test data; the identity is the public SOPS test key)"
            ),
            ("cloud-init:passwords:", " the console password for rescue"),
        ]
    );
}

#[test]
fn json_document_decrypts() {
    let doc = decrypt("proxops/proxops.sops.json", "getsops-sops/keys.txt");
    assert_eq!(value(&doc, "secrets.pve-token"), "json-token-value");
    assert_eq!(value(&doc, "secrets.port"), "8006");
    assert_eq!(value(&doc, "secrets.ratio"), "0.25");
    assert_eq!(value(&doc, "secrets.on"), "True");
    assert_eq!(
        value(&doc, "cloud-init.ssh-keys.admin"),
        "ssh-ed25519 AAAAjson admin@json"
    );
    assert_eq!(value(&doc, "cloud-init.passwords.default"), "json-pass");
}

#[test]
fn suffix_and_regex_selectors_follow_the_metadata() {
    let doc = decrypt(
        "proxops/encrypted-suffix.sops.yaml",
        "getsops-sops/keys.txt",
    );
    assert_eq!(value(&doc, "db.password_secret"), "hunter2");
    assert_eq!(value(&doc, "db.user"), "admin");
    assert_eq!(value(&doc, "replicas"), "3");
    let encrypted: Vec<&str> = doc
        .leaves()
        .iter()
        .filter(|l| l.encrypted)
        .map(|l| l.path.as_str())
        .collect();
    assert_eq!(encrypted, ["db.password_secret"]);

    let doc = decrypt(
        "proxops/unencrypted-regex.sops.yaml",
        "getsops-sops/keys.txt",
    );
    assert_eq!(value(&doc, "public.url"), "https://example.org");
    assert_eq!(value(&doc, "token"), "abc123");
    assert_eq!(value(&doc, "count"), "42");
    assert_eq!(value(&doc, "flag"), "False");

    let doc = decrypt(
        "proxops/mac-only-encrypted.sops.yaml",
        "getsops-sops/keys.txt",
    );
    assert_eq!(value(&doc, "token"), "abc123");
    assert_eq!(value(&doc, "count"), "42");
}

#[test]
fn a_flipped_byte_in_a_value_is_refused() {
    let original = text("getsops-sops/example.yaml");
    let edited = flip_data_byte(&original, "password:");
    let err = decrypt_text(&edited, "getsops-sops/keys.txt").unwrap_err();
    assert!(
        matches!(&err, SopsError::Tampered { key, .. } if key == "app2.db.password"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "edited.yaml: app2.db.password: the encrypted value does not authenticate: the file was changed without sops"
    );
}

#[test]
fn a_flipped_byte_in_the_mac_is_refused() {
    let original = text("fluxcd/algorithms-age.yaml");
    let edited = flip_data_byte(&original, "mac:");
    let err = decrypt_text(&edited, "fluxcd/age.txt").unwrap_err();
    assert!(matches!(err, SopsError::MacMismatch { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "edited.yaml: MAC mismatch: the file was changed without sops"
    );
}

#[test]
fn an_edited_clear_text_value_breaks_the_mac() {
    let original = text("getsops-sops/example.yaml");
    let edited = original.replace(
        "all: going to remain in clear text",
        "all: going to remain in clear text!",
    );
    assert_ne!(edited, original);
    let err = decrypt_text(&edited, "getsops-sops/keys.txt").unwrap_err();
    assert!(matches!(err, SopsError::MacMismatch { .. }), "{err}");

    // Under encrypted_regex, `metadata.name` is clear text but part of the MAC.
    let edited = text("fluxcd/algorithms-age.yaml").replace("name: age", "name: other");
    let err = decrypt_text(&edited, "fluxcd/age.txt").unwrap_err();
    assert!(matches!(err, SopsError::MacMismatch { .. }), "{err}");
}

#[test]
fn a_wrong_identity_is_refused_naming_the_identity_and_recipients() {
    let err = SopsDocument::load(
        &fixture("getsops-sops/example.yaml"),
        &identity("fluxcd/age.txt"),
    )
    .unwrap_err();
    assert!(matches!(err, SopsError::WrongIdentity { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("wrong age identity"), "{message}");
    assert!(message.contains("fluxcd/age.txt"), "{message}");
    assert!(
        message.contains("age1yt3tfqlfrwdwx0z0ynwplcr6qxcxfaqycuprpmy89nr83ltx74tqdpszlw"),
        "{message}"
    );
}

#[test]
fn an_unencrypted_file_is_refused() {
    let err =
        decrypt_text(&text("proxops/plain/proxops.yaml"), "getsops-sops/keys.txt").unwrap_err();
    assert!(matches!(err, SopsError::Unencrypted { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("edited.yaml: not encrypted by sops")
    );
    let Err(err) = encrypted_tree(Path::new("plain.yaml"), &text("proxops/plain/proxops.yaml"))
    else {
        panic!("a plain file has no encrypted tree");
    };
    assert!(matches!(err, SopsError::Unencrypted { .. }), "{err}");
}

#[test]
fn malformed_files_and_identities_are_refused_with_their_own_errors() {
    let err = decrypt_text("a: [1\n", "getsops-sops/keys.txt").unwrap_err();
    assert!(matches!(err, SopsError::Malformed { .. }), "{err}");
    let err =
        decrypt_text("a: 1\nsops:\n    version: 3.7.1\n", "getsops-sops/keys.txt").unwrap_err();
    assert_eq!(
        err.to_string(),
        "edited.yaml:3:5: malformed SOPS file: `sops.lastmodified` is missing"
    );
    // A value that should be encrypted but is not.
    let edited = text("sops-nix/secrets.yaml").replace(
        "test_key: ENC[AES256_GCM,data:2mP+IAdczoEr0g==,iv:voX4IQemcgt0O97oLExy5r2V85nn687cIyWmHNDhUag=,tag:R97qy4fKneU7D9UFhXNvgA==,type:str]",
        "test_key: plain",
    );
    let err = decrypt_text(&edited, "getsops-sops/keys.txt").unwrap_err();
    assert!(
        err.to_string()
            .contains("test_key: expected an `ENC[AES256_GCM,...]` value"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("age.key");
    std::fs::write(&bad, "# comment\nAGE-SECRET-KEY-1NOTAKEY-do-not-echo\n").unwrap();
    let err = AgeIdentity::from_file(&bad).unwrap_err();
    assert!(matches!(err, SopsError::IdentityInvalid { .. }), "{err}");
    assert!(!err.to_string().contains("do-not-echo"), "{err}");
    let err = AgeIdentity::from_file(&dir.path().join("missing.key")).unwrap_err();
    assert!(matches!(err, SopsError::IdentityRead { .. }), "{err}");
}

#[test]
fn secrets_never_appear_in_debug_or_error_text() {
    let doc = decrypt("proxops/proxops.sops.yaml", "getsops-sops/keys.txt");
    let debug = format!("{doc:?}");
    for leaf in doc.leaves() {
        let plain = leaf.value.expose_secret();
        if leaf.encrypted && plain.len() > 3 {
            assert!(!debug.contains(plain), "{debug}");
        }
    }
    assert!(!debug.contains("s3cr3t-Passw0rd"), "{debug}");
    assert!(!debug.contains("AdminKeyForTestsOnly"), "{debug}");
    assert!(!debug.contains("console password"), "{debug}");
    let identity = identity("getsops-sops/keys.txt");
    assert!(!format!("{identity:?}").contains("AGE-SECRET-KEY"));
    let edited = flip_data_byte(&text("proxops/proxops.sops.yaml"), "default:");
    let err = decrypt_text(&edited, "getsops-sops/keys.txt").unwrap_err();
    assert!(!format!("{err} {err:?}").contains("s3cr3t"), "{err:?}");
}

#[test]
fn the_encrypted_tree_gives_clear_keys_without_an_identity() {
    let docs = encrypted_tree(
        Path::new("secrets.sops.yaml"),
        &text("proxops/proxops.sops.yaml"),
    )
    .unwrap();
    let [root] = docs.as_slice() else {
        panic!("one document expected, got {}", docs.len());
    };
    assert!(root.get("sops").is_none(), "the metadata is removed");
    let keys = root
        .get("cloud-init")
        .and_then(|c| c.get("ssh-keys"))
        .unwrap();
    let names: Vec<&str> = keys
        .entries()
        .iter()
        .map(|(k, _)| k.text.as_str())
        .collect();
    assert_eq!(names, ["admin", "deploy"]);
    let admin = keys.get("admin").and_then(|n| n.as_str()).unwrap();
    assert!(admin.starts_with("ENC[AES256_GCM,data:"), "not decrypted");
}
