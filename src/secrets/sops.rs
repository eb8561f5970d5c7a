//! SOPS files (age backend) decrypted in-process: no `sops` binary on the PVE node.
//!
//! A SOPS file is the plaintext document with each leaf replaced by
//! `ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]`, plus a top-level `sops:` mapping of metadata
//! (see `shared/testdata/sops/FORMAT.md`). Decrypting is, in order: parse the YAML keeping key
//! order (`super::tree`); read the metadata; open the 32-byte data key from any
//! `sops.age[].enc` with the age identity; decrypt every leaf that the metadata says is
//! encrypted (AES-256-GCM with SOPS's 32-byte nonce, additional data = the keys on the path,
//! each followed by `:`; list indices do not count); recompute the MAC (SHA-512 over every
//! leaf's plaintext in document order) and compare it with `sops.mac`, which is itself
//! encrypted with `lastmodified` as additional data. A file whose MAC does not match is refused.
//!
//! Decrypted values only ever live in [`SecretString`]s; [`SopsDocument`]'s `Debug` shows key
//! paths, never values, and no error text holds a value. [`key_names`] lists the names a
//! ProxOps document offers without decrypting anything (SOPS keeps keys in clear text).

use std::collections::BTreeSet;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::aes::Aes256;
use aes_gcm::{AesGcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use secrecy::{ExposeSecret, ExposeSecretMut, SecretBox, SecretString};
use sha2::{Digest, Sha512};

use super::tree::{self, Node, Value};

/// The environment variable SOPS reads the age identity file from.
pub const SOPS_AGE_KEY_FILE: &str = "SOPS_AGE_KEY_FILE";
/// The top-level key that holds SOPS's metadata.
const METADATA_KEY: &str = "sops";
/// What SOPS assumes when a file names no encryption selector.
const DEFAULT_UNENCRYPTED_SUFFIX: &str = "_unencrypted";
/// Fed to the MAC first when `mac_only_encrypted` is set (`MACOnlyEncryptedInitialization`).
const MAC_ONLY_ENCRYPTED_INIT: [u8; 32] = [
    0x8a, 0x3f, 0xd2, 0xad, 0x54, 0xce, 0x66, 0x52, 0x7b, 0x10, 0x34, 0xf3, 0xd1, 0x47, 0xbe, 0x0b,
    0x0b, 0x97, 0x5b, 0x3b, 0xf4, 0x4f, 0x72, 0xc6, 0xfd, 0xad, 0xec, 0x81, 0x76, 0xf2, 0x7d, 0x69,
];
/// The SOPS document's section of ProxOps's own secrets.
pub const SECRETS: &str = "secrets";
/// The SOPS document's section of cloud-init data.
pub const CLOUD_INIT: &str = "cloud-init";
/// `cloud-init.ssh-keys`: OpenSSH public key lines.
pub const SSH_KEYS: &str = "ssh-keys";
/// `cloud-init.passwords`: cloud-init user passwords.
pub const PASSWORDS: &str = "passwords";
/// Prefix of an `ssh-key-refs` entry.
pub const SSH_KEY_REF_PREFIX: &str = "cloud-init.ssh-keys.";
/// Prefix of a `ci-password-ref`.
pub const PASSWORD_REF_PREFIX: &str = "cloud-init.passwords.";

/// AES-256-GCM with SOPS's 32-byte nonce.
type SopsCipher = AesGcm<Aes256, aes_gcm::aead::consts::U32>;

/// Reading or decrypting a SOPS file failed. Messages name the file; none holds a secret.
#[derive(Debug, thiserror::Error)]
pub enum SopsError {
    /// The SOPS file could not be read.
    #[error("reading SOPS file {}", .path.display())]
    Read {
        /// The SOPS file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No age identity file is configured.
    #[error(
        "no age identity to decrypt {}: set [secrets] age_key_file in agent.toml or SOPS_AGE_KEY_FILE",
        .path.display()
    )]
    MissingIdentity {
        /// The SOPS file that needed it.
        path: PathBuf,
    },
    /// The age identity file could not be read.
    #[error("reading age identity file {}", .path.display())]
    IdentityRead {
        /// The identity file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The age identity file holds no usable identity.
    #[error("age identity file {}: {reason}", .path.display())]
    IdentityInvalid {
        /// The identity file.
        path: PathBuf,
        /// What is wrong (a line number at most, never the line).
        reason: String,
    },
    /// The file has no `sops` metadata: it was never encrypted.
    #[error("{}: not encrypted by sops (no `sops` metadata); encrypt it with `sops encrypt --age ...`", .path.display())]
    Unencrypted {
        /// The SOPS file.
        path: PathBuf,
    },
    /// None of the file's age recipients matches the identity.
    #[error(
        "{}: wrong age identity: no identity in {} matches a recipient of the file ({})",
        .path.display(), .identity.display(), .recipients.join(", ")
    )]
    WrongIdentity {
        /// The SOPS file.
        path: PathBuf,
        /// The identity file used.
        identity: PathBuf,
        /// The file's age recipients.
        recipients: Vec<String>,
    },
    /// The file names no age recipient (e.g. PGP or KMS only).
    #[error("{}: no age recipient in the `sops` metadata; only the age backend is supported", .path.display())]
    NoAgeRecipient {
        /// The SOPS file.
        path: PathBuf,
    },
    /// The recomputed MAC differs from `sops.mac`, or `sops.mac` does not decrypt.
    #[error("{}: MAC mismatch: the file was changed without sops", .path.display())]
    MacMismatch {
        /// The SOPS file.
        path: PathBuf,
    },
    /// An encrypted value fails AES-GCM authentication.
    #[error("{}: {key}: the encrypted value does not authenticate: the file was changed without sops", .path.display())]
    Tampered {
        /// The SOPS file.
        path: PathBuf,
        /// The key path, e.g. `cloud-init.passwords.default`.
        key: String,
    },
    /// The file is not a SOPS document this reader understands.
    #[error("{}:{line}:{column}: malformed SOPS file: {message}", .path.display())]
    Malformed {
        /// The SOPS file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong (never a value).
        message: String,
    },
}

/// An age identity (one or more `AGE-SECRET-KEY-1…` lines) read from a file.
pub struct AgeIdentity {
    path: PathBuf,
    identities: Vec<Box<dyn age::Identity + Send + Sync>>,
}

impl fmt::Debug for AgeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgeIdentity")
            .field("path", &self.path)
            .field("identities", &self.identities.len())
            .finish()
    }
}

impl AgeIdentity {
    /// Reads an age identity file (`#` comments and `AGE-SECRET-KEY-1…` lines).
    ///
    /// # Errors
    /// [`SopsError::IdentityRead`] or [`SopsError::IdentityInvalid`].
    pub fn from_file(path: &Path) -> Result<Self, SopsError> {
        warn_if_readable_by_others(path);
        let text = std::fs::read_to_string(path)
            .map(SecretString::from)
            .map_err(|source| SopsError::IdentityRead {
                path: path.to_path_buf(),
                source,
            })?;
        let invalid = |reason: String| SopsError::IdentityInvalid {
            path: path.to_path_buf(),
            reason,
        };
        let file = age::IdentityFile::from_buffer(text.expose_secret().as_bytes())
            .map_err(|e| invalid(e.to_string()))?;
        let identities = file
            .into_identities()
            .map_err(|_| invalid("holds an identity this build cannot use".to_owned()))?;
        if identities.is_empty() {
            return Err(invalid(
                "holds no identity (expected an `AGE-SECRET-KEY-1...` line)".to_owned(),
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            identities,
        })
    }

    /// The file the identity was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Reads the age identity that decrypts `sops_path`: `configured` (`[secrets] age_key_file`),
/// else the file named by `SOPS_AGE_KEY_FILE`.
///
/// # Errors
/// [`SopsError::MissingIdentity`] when neither names a file; else as
/// [`AgeIdentity::from_file`].
pub fn load_identity(
    configured: Option<&Path>,
    sops_path: &Path,
) -> Result<AgeIdentity, SopsError> {
    identity_from(identity_file(configured), sops_path)
}

fn identity_from(file: Option<PathBuf>, sops_path: &Path) -> Result<AgeIdentity, SopsError> {
    let file = file.ok_or_else(|| SopsError::MissingIdentity {
        path: sops_path.to_path_buf(),
    })?;
    AgeIdentity::from_file(&file)
}

/// Which identity file to use: the configured one, else `SOPS_AGE_KEY_FILE`.
pub fn identity_file(configured: Option<&Path>) -> Option<PathBuf> {
    configured.map(Path::to_path_buf).or_else(|| {
        std::env::var_os(SOPS_AGE_KEY_FILE)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

/// The identity file should be readable only by the agent (mode 0600 or 0400).
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            file = %path.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "age identity file is readable by other users; chmod 600 it"
        );
    }
}

/// How SOPS typed a value (`type:` in `ENC[...]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// A string.
    Str,
    /// An integer.
    Int,
    /// A float.
    Float,
    /// A boolean (`True`/`False`).
    Bool,
    /// Raw bytes.
    Bytes,
    /// An RFC 3339 time.
    Time,
}

/// One decrypted (or clear-text) leaf of a SOPS document.
#[derive(Debug, Clone)]
pub struct Leaf {
    /// The key path, e.g. `app2.db.user` or `an_array[2]`.
    pub path: String,
    /// The value as SOPS serialises it (`True`, `1234568000`, the string itself).
    pub value: SecretString,
    /// Its type.
    pub value_type: ValueType,
    /// Whether it was encrypted in the file.
    pub encrypted: bool,
}

/// A decrypted SOPS document. `Debug` shows paths and types, never values.
#[derive(Debug)]
pub struct SopsDocument {
    path: PathBuf,
    leaves: Vec<Leaf>,
    comments: Vec<(String, SecretString)>,
}

impl SopsDocument {
    /// Reads and decrypts `path` with `identity`.
    ///
    /// # Errors
    /// Every [`SopsError`] variant except `MissingIdentity`.
    pub fn load(path: &Path, identity: &AgeIdentity) -> Result<Self, SopsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SopsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::decrypt(path, &text, identity)
    }

    /// Decrypts the text of a SOPS file; `path` labels errors.
    ///
    /// # Errors
    /// As [`SopsDocument::load`].
    pub fn decrypt(path: &Path, text: &str, identity: &AgeIdentity) -> Result<Self, SopsError> {
        let file = SopsFile::parse(path, text)?;
        let key = file.data_key(identity)?;
        file.decrypt_with(&key)
    }

    /// The file this document was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every leaf in document order (clear-text ones too).
    pub fn leaves(&self) -> &[Leaf] {
        &self.leaves
    }

    /// Decrypted comments with the additional data they were encrypted under, in file order.
    pub fn comments(&self) -> &[(String, SecretString)] {
        &self.comments
    }

    /// The value at a key path such as `app2.db.user` or `an_array[0]`.
    pub fn get(&self, path: &str) -> Option<&SecretString> {
        self.leaves
            .iter()
            .find(|leaf| leaf.path == path)
            .map(|leaf| &leaf.value)
    }

    /// `cloud-init.ssh-keys.<name>`; `None` when missing or empty.
    pub fn ssh_key(&self, name: &str) -> Option<&SecretString> {
        self.non_empty(&format!("{SSH_KEY_REF_PREFIX}{name}"))
    }

    /// `cloud-init.passwords.<name>`; `None` when missing or empty.
    pub fn password(&self, name: &str) -> Option<&SecretString> {
        self.non_empty(&format!("{PASSWORD_REF_PREFIX}{name}"))
    }

    /// `secrets.<name>`; `None` when missing or empty.
    pub fn secret(&self, name: &str) -> Option<&SecretString> {
        self.non_empty(&format!("{SECRETS}.{name}"))
    }

    /// A manifest reference as written (`cloud-init.ssh-keys.admin`,
    /// `cloud-init.passwords.default`); `None` when missing, empty or not a reference.
    pub fn resolve(&self, reference: &str) -> Option<&SecretString> {
        if let Some(name) = reference.strip_prefix(SSH_KEY_REF_PREFIX) {
            self.ssh_key(name)
        } else if let Some(name) = reference.strip_prefix(PASSWORD_REF_PREFIX) {
            self.password(name)
        } else {
            None
        }
    }

    fn non_empty(&self, path: &str) -> Option<&SecretString> {
        self.get(path).filter(|v| !v.expose_secret().is_empty())
    }
}

/// The names a ProxOps SOPS document offers, read without decrypting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyNames {
    /// `cloud-init.ssh-keys.<name>` with a non-empty value.
    pub ssh_keys: BTreeSet<String>,
    /// `cloud-init.passwords.<name>` with a non-empty value.
    pub passwords: BTreeSet<String>,
    /// `secrets.<name>` with a non-empty value.
    pub secrets: BTreeSet<String>,
    /// Full paths (`cloud-init.passwords.x`) of keys present with an empty or null value.
    pub empty: BTreeSet<String>,
}

/// Whether a reference names a usable value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefStatus {
    /// The key exists with a non-empty value.
    Present,
    /// The key exists but its value is empty.
    Empty,
    /// No such key.
    Missing,
}

impl KeyNames {
    /// How a manifest reference (`cloud-init.ssh-keys.admin`) fares against these names.
    pub fn status(&self, reference: &str) -> RefStatus {
        let present = if let Some(name) = reference.strip_prefix(SSH_KEY_REF_PREFIX) {
            self.ssh_keys.contains(name)
        } else if let Some(name) = reference.strip_prefix(PASSWORD_REF_PREFIX) {
            self.passwords.contains(name)
        } else if let Some(name) = reference.strip_prefix("secrets.") {
            self.secrets.contains(name)
        } else {
            false
        };
        if present {
            RefStatus::Present
        } else if self.empty.contains(reference) {
            RefStatus::Empty
        } else {
            RefStatus::Missing
        }
    }
}

/// Lists `cloud-init.ssh-keys.*`, `cloud-init.passwords.*` and `secrets.*` of a SOPS file's
/// text without decrypting (keys are clear text). `path` labels errors.
///
/// # Errors
/// [`SopsError::Unencrypted`] without `sops` metadata, [`SopsError::Malformed`] when the YAML
/// does not parse or a section is not a mapping.
pub fn key_names(path: &Path, text: &str) -> Result<KeyNames, SopsError> {
    let file = SopsFile::parse(path, text)?;
    let mut names = KeyNames::default();
    let Some(root) = file.documents.first() else {
        return Ok(names);
    };
    let mut section = |node: Option<&Node>, prefix: &str, into: &mut BTreeSet<String>| {
        let Some(node) = node else {
            return Ok(());
        };
        if !matches!(node.value, Value::Map(_) | Value::Null) {
            return Err(file.malformed(node, format!("`{prefix}` is not a mapping")));
        }
        for (key, value) in node.entries() {
            match &value.value {
                Value::Scalar { text, .. } if !text.is_empty() => {
                    into.insert(key.text.clone());
                }
                Value::Scalar { .. } | Value::Null => {
                    names.empty.insert(format!("{prefix}.{}", key.text));
                }
                _ => {}
            }
        }
        Ok(())
    };
    let cloud_init = root.get(CLOUD_INIT);
    if let Some(ci) = cloud_init
        && !matches!(ci.value, Value::Map(_) | Value::Null)
    {
        return Err(file.malformed(ci, format!("`{CLOUD_INIT}` is not a mapping")));
    }
    let mut ssh_keys = BTreeSet::new();
    let mut passwords = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    section(
        cloud_init.and_then(|c| c.get(SSH_KEYS)),
        "cloud-init.ssh-keys",
        &mut ssh_keys,
    )?;
    section(
        cloud_init.and_then(|c| c.get(PASSWORDS)),
        "cloud-init.passwords",
        &mut passwords,
    )?;
    section(root.get(SECRETS), SECRETS, &mut secrets)?;
    names.ssh_keys = ssh_keys;
    names.passwords = passwords;
    names.secrets = secrets;
    Ok(names)
}

/// Which leaves the metadata says are encrypted.
enum Selector {
    UnencryptedSuffix(String),
    EncryptedSuffix(String),
    UnencryptedRegex(regex::Regex),
    EncryptedRegex(regex::Regex),
}

impl Selector {
    /// SOPS's `shouldBeEncrypted`: every key on the path counts, not only the leaf's own.
    fn is_encrypted(&self, keys: &[&str]) -> bool {
        match self {
            Selector::UnencryptedSuffix(s) => !keys.iter().any(|k| k.ends_with(s.as_str())),
            Selector::EncryptedSuffix(s) => keys.iter().any(|k| k.ends_with(s.as_str())),
            Selector::UnencryptedRegex(r) => !keys.iter().any(|k| r.is_match(k)),
            Selector::EncryptedRegex(r) => keys.iter().any(|k| r.is_match(k)),
        }
    }
}

/// A parsed, not yet decrypted SOPS file.
struct SopsFile {
    path: PathBuf,
    text_lines: Vec<String>,
    parsed_anchors: Vec<tree::Anchor>,
    multiline: Vec<(usize, usize)>,
    /// The documents without their `sops` key.
    documents: Vec<Node>,
    metadata: Metadata,
}

struct Metadata {
    node: Node,
    age: Vec<(String, String)>,
    last_modified: String,
    mac: String,
    selector: Selector,
    mac_only_encrypted: bool,
}

/// A 32-byte SOPS data key, wiped on drop.
struct DataKey(SecretBox<[u8; 32]>);

/// An `ENC[AES256_GCM,...]` value, decoded.
struct Encrypted {
    data: Vec<u8>,
    iv: Vec<u8>,
    tag: Vec<u8>,
    value_type: String,
}

impl SopsFile {
    fn parse(path: &Path, text: &str) -> Result<Self, SopsError> {
        let path = path.to_path_buf();
        let parsed = tree::parse(text).map_err(|e| SopsError::Malformed {
            path: path.clone(),
            line: e.line,
            column: e.column,
            message: e.message,
        })?;
        let mut documents = parsed.documents;
        let mut metadata_node = None;
        for (i, doc) in documents.iter_mut().enumerate() {
            let Value::Map(entries) = &mut doc.value else {
                return Err(SopsError::Malformed {
                    path,
                    line: doc.line,
                    column: doc.column,
                    message: "the document is not a mapping".to_owned(),
                });
            };
            if let Some(at) = entries.iter().position(|(k, _)| k.text == METADATA_KEY) {
                let (_, node) = entries.remove(at);
                if i == 0 {
                    metadata_node = Some(node);
                }
            }
        }
        let Some(node) = metadata_node else {
            return Err(SopsError::Unencrypted { path });
        };
        let metadata = Metadata::read(&path, node)?;
        Ok(Self {
            path,
            text_lines: text.lines().map(str::to_owned).collect(),
            parsed_anchors: parsed.anchors,
            multiline: parsed.multiline,
            documents,
            metadata,
        })
    }

    fn malformed(&self, node: &Node, message: String) -> SopsError {
        SopsError::Malformed {
            path: self.path.clone(),
            line: node.line,
            column: node.column,
            message,
        }
    }

    /// Opens the data key from the first age recipient the identity matches.
    fn data_key(&self, identity: &AgeIdentity) -> Result<DataKey, SopsError> {
        if self.metadata.age.is_empty() {
            return Err(SopsError::NoAgeRecipient {
                path: self.path.clone(),
            });
        }
        for (_, enc) in &self.metadata.age {
            let armored = age::armor::ArmoredReader::new(enc.as_bytes());
            let Ok(decryptor) = age::Decryptor::new(armored) else {
                continue;
            };
            let Ok(mut reader) = decryptor.decrypt(
                identity
                    .identities
                    .iter()
                    .map(|i| i.as_ref() as &dyn age::Identity),
            ) else {
                continue;
            };
            let mut key = SecretBox::new(Box::new([0u8; 32]));
            let mut extra = [0u8; 1];
            let complete = reader.read_exact(&mut key.expose_secret_mut()[..]).is_ok()
                && matches!(reader.read(&mut extra), Ok(0));
            if complete {
                return Ok(DataKey(key));
            }
            return Err(self.malformed(
                &self.metadata.node,
                "the age-encrypted data key is not 32 bytes".to_owned(),
            ));
        }
        Err(SopsError::WrongIdentity {
            path: self.path.clone(),
            identity: identity.path.clone(),
            recipients: self.metadata.age.iter().map(|(r, _)| r.clone()).collect(),
        })
    }

    fn decrypt_with(&self, key: &DataKey) -> Result<SopsDocument, SopsError> {
        let cipher = SopsCipher::new_from_slice(key.0.expose_secret())
            .map_err(|_| self.malformed(&self.metadata.node, "bad data key".to_owned()))?;
        let mut walk = Walk {
            file: self,
            cipher: &cipher,
            hasher: Sha512::new(),
            leaves: Vec::new(),
        };
        if self.metadata.mac_only_encrypted {
            walk.hasher.update(MAC_ONLY_ENCRYPTED_INIT);
        }
        for doc in &self.documents {
            walk.node(doc, &mut Vec::new(), &mut String::new())?;
        }
        let Walk { hasher, leaves, .. } = walk;
        let computed = hex::encode_upper(hasher.finalize());
        let mac_aad = go_rfc3339(&self.metadata.last_modified);
        let stored = parse_enc(&self.metadata.mac)
            .and_then(|enc| open(&cipher, &enc, mac_aad.as_bytes()))
            .ok_or_else(|| SopsError::MacMismatch {
                path: self.path.clone(),
            })?;
        if stored.expose_secret().as_slice() != computed.as_bytes() {
            return Err(SopsError::MacMismatch {
                path: self.path.clone(),
            });
        }
        Ok(SopsDocument {
            path: self.path.clone(),
            leaves,
            comments: self.comments(&cipher),
        })
    }

    /// Encrypted comment lines (`#ENC[...,type:comment]`), decrypted. Their additional data is
    /// the path of the enclosing mapping; a comment that does not decrypt is skipped, as SOPS
    /// keeps such comments as plain text. Comments are not part of the MAC.
    fn comments(&self, cipher: &SopsCipher) -> Vec<(String, SecretString)> {
        let mut out = Vec::new();
        for (i, line) in self.text_lines.iter().enumerate() {
            let number = i + 1;
            let trimmed = line.trim_start();
            let Some(body) = trimmed.strip_prefix('#') else {
                continue;
            };
            if !body.starts_with("ENC[AES256_GCM,")
                || self
                    .multiline
                    .iter()
                    .any(|(first, last)| *first < number && number <= *last)
            {
                continue;
            }
            let column = line.len() - trimmed.len() + 1;
            let parent = self.enclosing(number, column);
            let aad = format!("{}:", parent.join(":"));
            if let Some(enc) = parse_enc(body.trim_end())
                && enc.value_type == "comment"
                && let Some(plain) = open(cipher, &enc, aad.as_bytes())
                && let Ok(text) = String::from_utf8(plain.expose_secret().clone())
            {
                out.push((aad, SecretString::from(text)));
            }
        }
        out
    }

    /// The keys of the collection a comment line at (`line`, `column`) belongs to: the next
    /// item at the same indentation, else the previous one, else the item it is nested in.
    fn enclosing(&self, line: usize, column: usize) -> Vec<String> {
        let mut after: Vec<&tree::Anchor> = self
            .parsed_anchors
            .iter()
            .filter(|a| a.line > line)
            .collect();
        after.sort_by_key(|a| (a.line, a.column));
        if let Some(next) = after.iter().find(|a| a.column <= column)
            && next.column == column
        {
            return next.parent.clone();
        }
        let mut before: Vec<&tree::Anchor> = self
            .parsed_anchors
            .iter()
            .filter(|a| a.line < line)
            .collect();
        before.sort_by_key(|a| (std::cmp::Reverse(a.line), a.column));
        match before.iter().find(|a| a.column <= column) {
            Some(prev) if prev.column == column => prev.parent.clone(),
            Some(prev) => prev.own.clone(),
            None => Vec::new(),
        }
    }
}

impl Metadata {
    fn read(path: &Path, node: Node) -> Result<Self, SopsError> {
        let malformed = |at: &Node, message: String| SopsError::Malformed {
            path: path.to_path_buf(),
            line: at.line,
            column: at.column,
            message,
        };
        if !matches!(node.value, Value::Map(_)) {
            return Err(malformed(&node, "`sops` is not a mapping".to_owned()));
        }
        let text = |key: &str| -> Result<Option<String>, SopsError> {
            match node.get(key) {
                None => Ok(None),
                Some(v) if v.value == Value::Null => Ok(None),
                Some(v) => v
                    .as_str()
                    .map(|s| Some(s.to_owned()))
                    .ok_or_else(|| malformed(v, format!("`sops.{key}` is not a string"))),
            }
        };
        if let Some(groups) = node.get("key_groups")
            && matches!(&groups.value, Value::Seq(items) if !items.is_empty())
        {
            return Err(malformed(
                groups,
                "`sops.key_groups` (Shamir secret sharing) is not supported; use a single key group".to_owned(),
            ));
        }
        let mut age = Vec::new();
        if let Some(list) = node.get("age") {
            match &list.value {
                Value::Seq(items) => {
                    for item in items {
                        let recipient = item.get("recipient").and_then(Node::as_str);
                        let enc = item.get("enc").and_then(Node::as_str);
                        match (recipient, enc) {
                            (Some(r), Some(e)) => age.push((r.to_owned(), e.to_owned())),
                            _ => {
                                return Err(malformed(
                                    item,
                                    "a `sops.age` entry needs `recipient` and `enc`".to_owned(),
                                ));
                            }
                        }
                    }
                }
                Value::Null => {}
                _ => return Err(malformed(list, "`sops.age` is not a list".to_owned())),
            }
        }
        let last_modified = text("lastmodified")?
            .ok_or_else(|| malformed(&node, "`sops.lastmodified` is missing".to_owned()))?;
        let mac =
            text("mac")?.ok_or_else(|| malformed(&node, "`sops.mac` is missing".to_owned()))?;
        let regex = |key: &str, pattern: String| {
            regex::Regex::new(&pattern)
                .map_err(|_| malformed(&node, format!("`sops.{key}` is not a valid regex")))
        };
        let mut selectors = Vec::new();
        if let Some(s) = text("unencrypted_suffix")?.filter(|s| !s.is_empty()) {
            selectors.push(Selector::UnencryptedSuffix(s));
        }
        if let Some(s) = text("encrypted_suffix")?.filter(|s| !s.is_empty()) {
            selectors.push(Selector::EncryptedSuffix(s));
        }
        if let Some(s) = text("unencrypted_regex")?.filter(|s| !s.is_empty()) {
            selectors.push(Selector::UnencryptedRegex(regex("unencrypted_regex", s)?));
        }
        if let Some(s) = text("encrypted_regex")?.filter(|s| !s.is_empty()) {
            selectors.push(Selector::EncryptedRegex(regex("encrypted_regex", s)?));
        }
        if selectors.len() > 1 {
            return Err(malformed(
                &node,
                "more than one of unencrypted_suffix, encrypted_suffix, unencrypted_regex and encrypted_regex is set".to_owned(),
            ));
        }
        let selector = selectors
            .pop()
            .unwrap_or_else(|| Selector::UnencryptedSuffix(DEFAULT_UNENCRYPTED_SUFFIX.to_owned()));
        let mac_only_encrypted = match node.get("mac_only_encrypted") {
            None => false,
            Some(v) => match v.as_str().and_then(go_parse_bool) {
                Some(b) => b,
                None if v.value == Value::Null => false,
                None => {
                    return Err(malformed(
                        v,
                        "`sops.mac_only_encrypted` is not a boolean".to_owned(),
                    ));
                }
            },
        };
        Ok(Self {
            node,
            age,
            last_modified,
            mac,
            selector,
            mac_only_encrypted,
        })
    }
}

/// The depth-first walk that decrypts leaves and feeds the MAC.
struct Walk<'a> {
    file: &'a SopsFile,
    cipher: &'a SopsCipher,
    hasher: Sha512,
    leaves: Vec<Leaf>,
}

impl Walk<'_> {
    fn node(
        &mut self,
        node: &Node,
        keys: &mut Vec<String>,
        display: &mut String,
    ) -> Result<(), SopsError> {
        match &node.value {
            Value::Null => Ok(()),
            Value::Map(entries) => {
                for (key, value) in entries {
                    keys.push(key.text.clone());
                    let before = display.len();
                    if !display.is_empty() {
                        display.push('.');
                    }
                    display.push_str(&key.text);
                    self.node(value, keys, display)?;
                    display.truncate(before);
                    keys.pop();
                }
                Ok(())
            }
            Value::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    let before = display.len();
                    display.push_str(&format!("[{i}]"));
                    self.node(item, keys, display)?;
                    display.truncate(before);
                }
                Ok(())
            }
            Value::Scalar { text, quoted } => self.leaf(node, text, *quoted, keys, display),
        }
    }

    fn leaf(
        &mut self,
        node: &Node,
        text: &str,
        quoted: bool,
        keys: &[String],
        display: &str,
    ) -> Result<(), SopsError> {
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let encrypted = self.file.metadata.selector.is_encrypted(&key_refs);
        let (bytes, value_type) = if encrypted && !text.is_empty() {
            let enc = parse_enc(text).ok_or_else(|| {
                self.file.malformed(
                    node,
                    format!("{display}: expected an `ENC[AES256_GCM,...]` value"),
                )
            })?;
            let aad = format!("{}:", keys.join(":"));
            let plain =
                open(self.cipher, &enc, aad.as_bytes()).ok_or_else(|| SopsError::Tampered {
                    path: self.file.path.clone(),
                    key: display.to_owned(),
                })?;
            let value_type = match enc.value_type.as_str() {
                "str" => ValueType::Str,
                "int" => ValueType::Int,
                "float" => ValueType::Float,
                "bool" => ValueType::Bool,
                "bytes" => ValueType::Bytes,
                "time" => ValueType::Time,
                _ => {
                    return Err(self.file.malformed(
                        node,
                        format!("{display}: unknown value type `{}`", enc.value_type),
                    ));
                }
            };
            let canonical = canonical_bytes(plain, value_type).ok_or_else(|| {
                self.file.malformed(
                    node,
                    format!(
                        "{display}: the decrypted value is not a valid {}",
                        enc.value_type
                    ),
                )
            })?;
            (canonical, value_type)
        } else {
            let (bytes, value_type) = clear_bytes(text, quoted);
            (SecretBox::new(Box::new(bytes)), value_type)
        };
        if !self.file.metadata.mac_only_encrypted || encrypted {
            self.hasher.update(bytes.expose_secret());
        }
        let value = String::from_utf8(bytes.expose_secret().clone()).map_err(|_| {
            self.file
                .malformed(node, format!("{display}: the value is not UTF-8"))
        })?;
        self.leaves.push(Leaf {
            path: display.to_owned(),
            value: SecretString::from(value),
            value_type,
            encrypted: encrypted && !text.is_empty(),
        });
        Ok(())
    }
}

/// Decrypted bytes as SOPS's `ToBytes` would write the typed value back.
fn canonical_bytes(plain: SecretBox<Vec<u8>>, value_type: ValueType) -> Option<SecretBox<Vec<u8>>> {
    let reformat = |text: &str| -> Option<String> {
        match value_type {
            ValueType::Int => text.parse::<i64>().ok().map(|n| n.to_string()),
            ValueType::Float => text.parse::<f64>().ok().map(go_format_float),
            ValueType::Bool => go_parse_bool(text).map(go_bool),
            ValueType::Str | ValueType::Bytes | ValueType::Time => None,
        }
    };
    match value_type {
        ValueType::Str | ValueType::Bytes | ValueType::Time => Some(plain),
        _ => {
            let text = std::str::from_utf8(plain.expose_secret()).ok()?;
            reformat(text).map(|s| SecretBox::new(Box::new(s.into_bytes())))
        }
    }
}

/// A clear-text YAML scalar as SOPS's `ToBytes` writes it after yaml.v3 resolved its type.
fn clear_bytes(text: &str, quoted: bool) -> (Vec<u8>, ValueType) {
    if quoted {
        return (text.as_bytes().to_vec(), ValueType::Str);
    }
    match text {
        "true" | "True" | "TRUE" => return (b"True".to_vec(), ValueType::Bool),
        "false" | "False" | "FALSE" => return (b"False".to_vec(), ValueType::Bool),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return (b"+Inf".to_vec(), ValueType::Float);
        }
        "-.inf" | "-.Inf" | "-.INF" => return (b"-Inf".to_vec(), ValueType::Float),
        ".nan" | ".NaN" | ".NAN" => return (b"NaN".to_vec(), ValueType::Float),
        _ => {}
    }
    if let Some(n) = parse_yaml_int(text) {
        return (n.into_bytes(), ValueType::Int);
    }
    if is_yaml_float(text)
        && let Ok(f) = text.replace('_', "").parse::<f64>()
    {
        return (go_format_float(f).into_bytes(), ValueType::Float);
    }
    (text.as_bytes().to_vec(), ValueType::Str)
}

/// yaml.v3's integer forms (decimal, `0x`, `0o`, `0b`, with `_`), written back in decimal.
fn parse_yaml_int(text: &str) -> Option<String> {
    let plain = text.replace('_', "");
    let (negative, digits) = match plain.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, plain.strip_prefix('+').unwrap_or(&plain)),
    };
    if digits.is_empty() {
        return None;
    }
    let (radix, digits) = if let Some(d) = digits.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = digits.strip_prefix("0o") {
        (8, d)
    } else if let Some(d) = digits.strip_prefix("0b") {
        (2, d)
    } else {
        (10, digits)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u128::from_str_radix(digits, radix).ok()?;
    if negative {
        let n = i128::try_from(magnitude).ok()?.checked_neg()?;
        i64::try_from(n).ok().map(|n| n.to_string())
    } else {
        u64::try_from(magnitude).ok().map(|n| n.to_string())
    }
}

fn is_yaml_float(text: &str) -> bool {
    let t = text
        .strip_prefix(['-', '+'])
        .unwrap_or(text)
        .replace('_', "");
    let (mantissa, exponent) = match t.split_once(['e', 'E']) {
        Some((m, e)) => (m.to_owned(), Some(e.to_owned())),
        None => (t.clone(), None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((a, b)) => {
            (!a.is_empty() || !b.is_empty())
                && a.chars().all(|c| c.is_ascii_digit())
                && b.chars().all(|c| c.is_ascii_digit())
        }
        None => !mantissa.is_empty() && mantissa.chars().all(|c| c.is_ascii_digit()),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(&e);
        !e.is_empty() && e.chars().all(|c| c.is_ascii_digit())
    });
    mantissa_ok && exponent_ok
}

/// Go's `strconv.FormatFloat(f, 'f', -1, 64)`: shortest round-trip form, never an exponent.
fn go_format_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".to_owned()
    } else if f.is_infinite() {
        if f > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        // Rust's `Display` for f64 is the shortest round-trip form and never uses an exponent.
        f.to_string()
    }
}

/// Go's `strconv.ParseBool`.
fn go_parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn go_bool(b: bool) -> String {
    if b { "True" } else { "False" }.to_owned()
}

/// `lastmodified` re-serialised with Go's `time.RFC3339`: no fractional seconds, `Z` for UTC.
fn go_rfc3339(text: &str) -> String {
    match chrono::DateTime::parse_from_rfc3339(text) {
        Ok(t) if t.offset().local_minus_utc() == 0 => t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Ok(t) => t.format("%Y-%m-%dT%H:%M:%S%:z").to_string(),
        Err(_) => text.to_owned(),
    }
}

/// Parses `ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]`.
fn parse_enc(text: &str) -> Option<Encrypted> {
    let inner = text.strip_prefix("ENC[AES256_GCM,")?.strip_suffix(']')?;
    let mut data = None;
    let mut iv = None;
    let mut tag = None;
    let mut value_type = None;
    for part in inner.split(',') {
        let (name, value) = part.split_once(':')?;
        match name {
            "data" => data = Some(BASE64.decode(value).ok()?),
            "iv" => iv = Some(BASE64.decode(value).ok()?),
            "tag" => tag = Some(BASE64.decode(value).ok()?),
            "type" => value_type = Some(value.to_owned()),
            _ => return None,
        }
    }
    let enc = Encrypted {
        data: data?,
        iv: iv?,
        tag: tag?,
        value_type: value_type?,
    };
    (enc.iv.len() == 32 && enc.tag.len() == 16).then_some(enc)
}

/// AES-256-GCM decryption of one value; `None` when it does not authenticate.
fn open(cipher: &SopsCipher, enc: &Encrypted, aad: &[u8]) -> Option<SecretBox<Vec<u8>>> {
    let nonce = Nonce::<aes_gcm::aead::consts::U32>::try_from(enc.iv.as_slice()).ok()?;
    let mut message = enc.data.clone();
    message.extend_from_slice(&enc.tag);
    cipher
        .decrypt(&nonce, Payload { msg: &message, aad })
        .ok()
        .map(|plain| SecretBox::new(Box::new(plain)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_identity_file_is_a_missing_identity_error_naming_the_sops_file() {
        let err = identity_from(None, Path::new("clusters/lab/secrets.sops.yaml")).unwrap_err();
        assert!(matches!(err, SopsError::MissingIdentity { .. }));
        assert_eq!(
            err.to_string(),
            "no age identity to decrypt clusters/lab/secrets.sops.yaml: set [secrets] age_key_file in agent.toml or SOPS_AGE_KEY_FILE"
        );
    }

    #[test]
    fn clear_scalars_are_written_as_go_would() {
        assert_eq!(clear_bytes("true", false).0, b"True");
        assert_eq!(clear_bytes("true", true).0, b"true");
        assert_eq!(clear_bytes("0x1F", false).0, b"31");
        assert_eq!(clear_bytes("1e3", false).0, b"1000");
        assert_eq!(clear_bytes("1.50", false).0, b"1.5");
        assert_eq!(clear_bytes("v1", false).0, b"v1");
        assert_eq!(clear_bytes("yes", false).0, b"yes");
    }

    #[test]
    fn lastmodified_is_reserialised_like_go_rfc3339() {
        assert_eq!(go_rfc3339("2022-03-15T22:11:15Z"), "2022-03-15T22:11:15Z");
        assert_eq!(
            go_rfc3339("2022-03-15T22:11:15.123Z"),
            "2022-03-15T22:11:15Z"
        );
        assert_eq!(
            go_rfc3339("2022-03-15T23:11:15+01:00"),
            "2022-03-15T23:11:15+01:00"
        );
    }

    #[test]
    fn enc_values_need_a_32_byte_iv_and_a_16_byte_tag() {
        let ok = "ENC[AES256_GCM,data:mHeXsmQ=,iv:vUMpILz3xchORqkzDFvgwENY7EqIHHGJdEF6C8xqbFE=,tag:IroV7hykADvD0IUaq6kikA==,type:str]";
        assert!(parse_enc(ok).is_some());
        assert!(
            parse_enc(
                "ENC[AES256_GCM,data:mHeXsmQ=,iv:AAAA,tag:IroV7hykADvD0IUaq6kikA==,type:str]"
            )
            .is_none()
        );
        assert!(parse_enc("plain").is_none());
    }
}
