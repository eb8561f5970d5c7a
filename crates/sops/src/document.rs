//! A decrypted SOPS document: its leaves (key path, value, type) and decrypted comments.

use std::path::{Path, PathBuf};

use secrecy::SecretString;

use crate::file::SopsFile;
use crate::{AgeIdentity, SopsError};

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
    pub(crate) path: PathBuf,
    pub(crate) leaves: Vec<Leaf>,
    pub(crate) comments: Vec<(String, SecretString)>,
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
        SopsFile::parse(path, text)?.decrypt(identity)
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
}
