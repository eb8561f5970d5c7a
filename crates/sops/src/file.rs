//! A SOPS file parsed but not yet decrypted, and the protocol that decrypts it: the metadata,
//! the data key opened with age, every leaf opened with AES-256-GCM, and the MAC check.

use std::io::Read;
use std::path::{Path, PathBuf};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::aes::Aes256;
use aes_gcm::{AesGcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use secrecy::{ExposeSecret, ExposeSecretMut, SecretBox, SecretString};
use sha2::{Digest, Sha512};

use crate::scalar::{canonical_bytes, clear_bytes, go_parse_bool, go_rfc3339};
use crate::tree::{self, Node, Value};
use crate::{AgeIdentity, Leaf, SopsDocument, SopsError, ValueType};

/// The top-level key that holds SOPS's metadata.
const METADATA_KEY: &str = "sops";
/// What SOPS assumes when a file names no encryption selector.
const DEFAULT_UNENCRYPTED_SUFFIX: &str = "_unencrypted";
/// Fed to the MAC first when `mac_only_encrypted` is set (`MACOnlyEncryptedInitialization`).
const MAC_ONLY_ENCRYPTED_INIT: [u8; 32] = [
    0x8a, 0x3f, 0xd2, 0xad, 0x54, 0xce, 0x66, 0x52, 0x7b, 0x10, 0x34, 0xf3, 0xd1, 0x47, 0xbe, 0x0b,
    0x0b, 0x97, 0x5b, 0x3b, 0xf4, 0x4f, 0x72, 0xc6, 0xfd, 0xad, 0xec, 0x81, 0x76, 0xf2, 0x7d, 0x69,
];

/// AES-256-GCM with SOPS's 32-byte nonce.
type SopsCipher = AesGcm<Aes256, aes_gcm::aead::consts::U32>;

/// The documents of a SOPS file's text as stored, nothing decrypted and no identity needed: keys
/// are clear text (SOPS never encrypts them), an encrypted leaf is its `ENC[...]` text, and the
/// `sops` metadata is checked and removed. `path` labels errors.
///
/// # Errors
/// [`SopsError::Unencrypted`] without `sops` metadata, [`SopsError::Malformed`] when the YAML
/// does not parse, a document is not a mapping or the metadata is not SOPS's.
pub fn encrypted_tree(path: &Path, text: &str) -> Result<Vec<Node>, SopsError> {
    SopsFile::parse(path, text).map(|file| file.documents)
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
pub(crate) struct SopsFile {
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
    pub(crate) fn parse(path: &Path, text: &str) -> Result<Self, SopsError> {
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
    /// Opens the data key with `identity`, decrypts every leaf and checks the MAC.
    pub(crate) fn decrypt(&self, identity: &AgeIdentity) -> Result<SopsDocument, SopsError> {
        let key = self.data_key(identity)?;
        self.decrypt_with(&key)
    }

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
