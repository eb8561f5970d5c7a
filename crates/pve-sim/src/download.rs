//! download-url's worker side: fetches a URL for real (reqwest with the ring provider),
//! computing every checksum PVE supports while streaming, without keeping the bytes, plus
//! PVE's filename normalisation and extension rules.

use sha1::Sha1;
use sha2::{Digest, Sha224, Sha256, Sha384, Sha512};

/// What a finished download produced.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    pub(crate) size: u64,
    /// Hex digests by algorithm (`md5`, `sha1`, `sha224`, `sha256`, `sha384`, `sha512`).
    pub(crate) checksums: std::collections::BTreeMap<String, String>,
}

/// Normalises a filename as download-url does: everything up to the last `/` or `\` is
/// stripped and characters outside `[a-zA-Z0-9_.-]` become `_`.
pub(crate) fn normalise_filename(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    base.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Checks the extension for the content type; the error is the `filename` parameter error.
pub(crate) fn check_extension(content: &str, filename: &str) -> Result<(), &'static str> {
    let lower = filename.to_ascii_lowercase();
    let ok = match content {
        "iso" => lower.ends_with(".iso") || lower.ends_with(".img"),
        "vztmpl" => [".tar", ".tar.gz", ".tar.xz", ".tar.zst", ".tar.bz2"]
            .iter()
            .any(|e| lower.ends_with(e) && lower.len() > e.len()),
        // Case-sensitive, and no `.ovf`: `$UPLOAD_IMPORT_EXT_RE_1 = qr/\.(ova|qcow2|raw|vmdk)/`
        // after `SAFE_CHAR_CLASS_RE+` (pve-storage `src/PVE/Storage.pm` @ 0c56bad8, used in
        // `API2/Storage/Status.pm` `download_url`); iso and vztmpl patterns carry `/i`.
        "import" => [".ova", ".qcow2", ".raw", ".vmdk"].iter().any(|e| {
            filename
                .strip_suffix(e)
                .is_some_and(|stem| !stem.is_empty() && stem.bytes().all(is_safe_char))
        }),
        _ => true,
    };
    match (ok, content) {
        (true, _) => Ok(()),
        (false, "import") => Err("invalid filename or wrong extension"),
        (false, _) => Err("wrong file extension"),
    }
}

/// pve-storage `$SAFE_CHAR_CLASS_RE = qr/[a-zA-Z0-9\-\.\+\=\_]/`.
fn is_safe_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'+' | b'=' | b'_')
}

/// Fetches `url`; errors read like the wget failures PVE reports.
pub(crate) async fn fetch(url: &str, verify_certificates: bool) -> Result<Fetched, String> {
    crate::tls::install_crypto_provider();
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(!verify_certificates)
        .build()
        .map_err(|e| format!("download failed: {e}"))?;
    let mut response = client.get(url).send().await.map_err(|e| {
        // wget: 4 = network failure, 5 = TLS verification failure.
        let code = if e.is_connect() && e.to_string().contains("certificate") {
            5
        } else {
            4
        };
        format!("download failed: exit code {code}")
    })?;
    if !response.status().is_success() {
        // wget: 8 = the server issued an error response.
        return Err("download failed: exit code 8".to_string());
    }
    let mut md5 = md5::Md5::new();
    let mut sha1 = Sha1::new();
    let mut sha224 = Sha224::new();
    let mut sha256 = Sha256::new();
    let mut sha384 = Sha384::new();
    let mut sha512 = Sha512::new();
    let mut size = 0u64;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|_| "download failed: exit code 4".to_string())?
    {
        size += chunk.len() as u64;
        md5.update(&chunk);
        sha1.update(&chunk);
        sha224.update(&chunk);
        sha256.update(&chunk);
        sha384.update(&chunk);
        sha512.update(&chunk);
    }
    let checksums = [
        ("md5", hex::encode(md5.finalize())),
        ("sha1", hex::encode(sha1.finalize())),
        ("sha224", hex::encode(sha224.finalize())),
        ("sha256", hex::encode(sha256.finalize())),
        ("sha384", hex::encode(sha384.finalize())),
        ("sha512", hex::encode(sha512.finalize())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Ok(Fetched { size, checksums })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filenames_are_stripped_of_directories_and_odd_characters() {
        assert_eq!(normalise_filename("../a b/deb ian+1.iso"), "deb_ian_1.iso");
        assert_eq!(normalise_filename("c:\\x\\y.iso"), "y.iso");
    }

    #[test]
    fn extensions_follow_the_content_type() {
        assert!(check_extension("iso", "a.ISO").is_ok());
        assert_eq!(
            check_extension("iso", "a.qcow2"),
            Err("wrong file extension")
        );
        assert!(check_extension("vztmpl", "d.tar.zst").is_ok());
        assert_eq!(
            check_extension("import", "a.img"),
            Err("invalid filename or wrong extension")
        );
        assert!(check_extension("import", "a.qcow2").is_ok());
    }

    #[test]
    fn import_extensions_are_case_sensitive_and_ovf_is_not_one_as_in_pve_storage() {
        for name in ["disk.QCOW2", "disk.Raw", "disk.ovf", ".qcow2"] {
            assert_eq!(
                check_extension("import", name),
                Err("invalid filename or wrong extension"),
                "{name}"
            );
        }
        for name in ["disk.qcow2", "disk.raw", "disk.vmdk", "appliance.ova"] {
            assert!(check_extension("import", name).is_ok(), "{name}");
        }
        assert!(
            check_extension("vztmpl", "d.TAR.ZST").is_ok(),
            "vztmpl is /i"
        );
    }
}
