//! The age identity that opens a SOPS file's data key, read from a file.

use std::fmt;
use std::path::{Path, PathBuf};

use secrecy::{ExposeSecret, SecretString};

use crate::SopsError;

/// The environment variable SOPS reads the age identity file from.
pub const SOPS_AGE_KEY_FILE: &str = "SOPS_AGE_KEY_FILE";

/// An age identity (one or more `AGE-SECRET-KEY-1…` lines) read from a file.
pub struct AgeIdentity {
    pub(crate) path: PathBuf,
    pub(crate) identities: Vec<Box<dyn age::Identity + Send + Sync>>,
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
}
