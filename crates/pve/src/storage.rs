//! Storage vocabulary: content types, download-url parameters, and the storage responses.
//!
//! These are `proxops-pve`'s own serde types for `/nodes/{node}/storage...` answers
//! (BEHAVIOUR.md §7). They are decoded leniently (`lenient.rs`) and know nothing of manifests;
//! mapping them into the planner's observed state is the binary's `observe.rs`.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

use crate::lenient;

/// A PVE storage content type (`pve-storage-content`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ContentType {
    /// ISO images, `<sid>:iso/<file>`.
    Iso,
    /// Container templates, `<sid>:vztmpl/<file>`.
    Vztmpl,
    /// Import sources (disk images, OVAs), `<sid>:import/<file>`.
    Import,
    /// Guest disk images.
    Images,
    /// Container root and mount point volumes.
    Rootdir,
    /// Backups.
    Backup,
    /// Snippets (hook scripts, cloud-init user data).
    Snippets,
}

impl ContentType {
    /// Every content type, in PVE's documentation order.
    pub const ALL: [ContentType; 7] = [
        Self::Iso,
        Self::Vztmpl,
        Self::Import,
        Self::Images,
        Self::Rootdir,
        Self::Backup,
        Self::Snippets,
    ];

    /// PVE's spelling (`iso`, `vztmpl`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Iso => "iso",
            Self::Vztmpl => "vztmpl",
            Self::Import => "import",
            Self::Images => "images",
            Self::Rootdir => "rootdir",
            Self::Backup => "backup",
            Self::Snippets => "snippets",
        }
    }
}

impl fmt::Display for ContentType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not a PVE content type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown storage content type {0:?}")]
pub struct UnknownContentType(pub String);

impl FromStr for ContentType {
    type Err = UnknownContentType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownContentType(s.to_owned()))
    }
}

/// A checksum algorithm download-url accepts (`checksum-algorithm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChecksumAlgorithm {
    /// MD5.
    Md5,
    /// SHA-1.
    Sha1,
    /// SHA-224.
    Sha224,
    /// SHA-256.
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
}

impl ChecksumAlgorithm {
    /// PVE's spelling (`sha256`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Md5 => "md5",
            Self::Sha1 => "sha1",
            Self::Sha224 => "sha224",
            Self::Sha256 => "sha256",
            Self::Sha384 => "sha384",
            Self::Sha512 => "sha512",
        }
    }
}

/// An expected checksum; always sent as the `checksum` + `checksum-algorithm` pair, which PVE
/// requires together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksum {
    /// The algorithm.
    pub algorithm: ChecksumAlgorithm,
    /// The expected digest, hex as published by the vendor.
    pub value: String,
}

/// Parameters of `POST /nodes/{node}/storage/{storage}/download-url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadUrl {
    /// What the file is: PVE accepts `iso`, `vztmpl` and `import` here.
    pub content: ContentType,
    /// `http(s)://` URL the node fetches from (the node, not ProxOps, connects to it).
    pub url: String,
    /// Target file name; PVE normalises it (BEHAVIOUR.md §7).
    pub filename: String,
    /// Expected checksum, verified by PVE after the download.
    pub checksum: Option<Checksum>,
    /// `verify-certificates`; PVE's default is true.
    pub verify_certificates: Option<bool>,
    /// Decompression algorithm (`compression`, iso only).
    pub compression: Option<String>,
}

impl DownloadUrl {
    /// A download of `url` into `filename` as `content`, without checksum or options.
    pub fn new(content: ContentType, url: impl Into<String>, filename: impl Into<String>) -> Self {
        Self {
            content,
            url: url.into(),
            filename: filename.into(),
            checksum: None,
            verify_certificates: None,
            compression: None,
        }
    }

    /// Adds the expected checksum.
    pub fn with_checksum(mut self, algorithm: ChecksumAlgorithm, value: impl Into<String>) -> Self {
        self.checksum = Some(Checksum {
            algorithm,
            value: value.into(),
        });
        self
    }
}

/// One entry of `GET /nodes/{node}/storage`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StorageInfo {
    /// Storage id.
    pub storage: String,
    /// Storage plugin type (`dir`, `lvmthin`, `zfspool`, ...).
    #[serde(rename = "type", default)]
    pub storage_type: String,
    /// Comma-separated content types the storage is configured for.
    #[serde(default)]
    pub content: String,
    /// Whether the storage is enabled.
    #[serde(default, deserialize_with = "lenient::opt_bool")]
    pub enabled: Option<bool>,
    /// Whether the storage is active (reachable) on this node.
    #[serde(default, deserialize_with = "lenient::opt_bool")]
    pub active: Option<bool>,
    /// Whether the storage is shared between nodes.
    #[serde(default, deserialize_with = "lenient::opt_bool")]
    pub shared: Option<bool>,
    /// Total bytes.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub total: Option<u64>,
    /// Used bytes.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub used: Option<u64>,
    /// Available bytes.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub avail: Option<u64>,
}

impl StorageInfo {
    /// Whether the storage is configured for `content`.
    pub fn has_content(&self, content: ContentType) -> bool {
        self.content
            .split(',')
            .any(|c| c.trim() == content.as_str())
    }
}

/// One volume of `GET /nodes/{node}/storage/{storage}/content`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ContentItem {
    /// Volume id, e.g. `local:iso/debian-13.1.0-amd64-netinst.iso`.
    pub volid: String,
    /// Volume format (`iso`, `tzst`, `qcow2`, ...).
    #[serde(default)]
    pub format: String,
    /// Size in bytes.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub size: Option<u64>,
    /// Creation time, seconds since the Unix epoch.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub ctime: Option<u64>,
    /// Content type as PVE spells it (kept as text: PVE may add types).
    #[serde(default)]
    pub content: String,
    /// Owning guest, for guest volumes and backups.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub vmid: Option<u64>,
}

impl ContentItem {
    /// The volume's file name: the part after `<storage>:<type>/` (or after the last `/`).
    pub fn file_name(&self) -> &str {
        let rest = self
            .volid
            .split_once(':')
            .map_or(self.volid.as_str(), |(_, r)| r);
        rest.rsplit_once('/').map_or(rest, |(_, f)| f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/storage-content-local.json"
    ));

    #[test]
    fn content_items_decode_recorded_listing() {
        let v: serde_json::Value = serde_json::from_str(LOCAL).unwrap();
        let items: Vec<ContentItem> = serde_json::from_value(v["data"].clone()).unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].volid, "local:iso/debian-12.0.0-amd64-netinst.iso");
        assert_eq!(items[0].size, Some(654_311_424));
        assert_eq!(items[0].file_name(), "debian-12.0.0-amd64-netinst.iso");
        assert_eq!(items[1].content, "vztmpl");
        assert_eq!(items[1].format, "tzst");
    }

    #[test]
    fn content_type_round_trips_pve_spelling() {
        for c in ContentType::ALL {
            assert_eq!(c.as_str().parse::<ContentType>().unwrap(), c);
        }
        assert!("template".parse::<ContentType>().is_err());
    }

    #[test]
    fn storage_info_reads_content_list() {
        let s: StorageInfo = serde_json::from_str(
            r#"{"storage":"local","type":"dir","content":"iso,vztmpl,import","active":1,"shared":0}"#,
        )
        .unwrap();
        assert!(s.has_content(ContentType::Import));
        assert!(!s.has_content(ContentType::Images));
        assert_eq!(s.active, Some(true));
        assert_eq!(s.shared, Some(false));
    }
}

/// `GET /storage/{storage}`: one storage's configuration, as pve-storage's
/// `api_storage_config` answers it (`PVE/API2/Storage/Config.pm`): the `storage.cfg` section
/// with `content` (and `nodes`) encoded as comma lists.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StorageConfig {
    /// Storage id.
    pub storage: String,
    /// Storage plugin type (`dir`, `nfs`, `lvmthin`, ...).
    #[serde(rename = "type", default)]
    pub storage_type: String,
    /// The directory of a file based storage (absent for block storages).
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub path: Option<String>,
    /// Comma-separated content types.
    #[serde(default)]
    pub content: String,
    /// Whether the storage is shared between nodes.
    #[serde(default, deserialize_with = "lenient::opt_bool")]
    pub shared: Option<bool>,
    /// `content-dirs`: per content type, a directory relative to `path` overriding the
    /// default subdirectory (`snippets` for snippets). pve-storage keeps it as a hash; it
    /// is read as an object or as its `type=dir,...` text.
    #[serde(default, rename = "content-dirs")]
    pub content_dirs: Option<serde_json::Value>,
}

impl StorageConfig {
    /// Whether `content` is one of the storage's content types.
    pub fn has_content(&self, content: &str) -> bool {
        self.content.split(',').any(|c| c.trim() == content)
    }

    /// The subdirectory (relative to `path`) that holds `content`: `content-dirs` when it
    /// names one, else pve-storage's default (`Plugin.pm`, `$vtype_subdirs`, `get_subdir`).
    pub fn content_subdir(&self, content: &str) -> String {
        let overridden = match &self.content_dirs {
            Some(serde_json::Value::Object(map)) => {
                map.get(content).and_then(|v| v.as_str()).map(str::to_owned)
            }
            Some(serde_json::Value::String(text)) => text.split(',').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                (k.trim() == content).then(|| v.trim().to_owned())
            }),
            _ => None,
        };
        overridden.unwrap_or_else(|| match content {
            "iso" => "template/iso".to_owned(),
            "vztmpl" => "template/cache".to_owned(),
            "backup" => "dump".to_owned(),
            "rootdir" => "private".to_owned(),
            other => other.to_owned(),
        })
    }
}

#[cfg(test)]
mod storage_config_tests {
    use super::*;

    #[test]
    fn the_snippets_directory_is_the_default_subdir_or_the_content_dirs_override() {
        let mut cfg: StorageConfig = serde_json::from_value(serde_json::json!({
            "storage": "local", "type": "dir", "path": "/var/lib/vz",
            "content": "iso,vztmpl,snippets", "digest": "x"
        }))
        .expect("decodes");
        assert!(cfg.has_content("snippets"));
        assert!(!cfg.has_content("images"));
        assert_eq!(cfg.content_subdir("snippets"), "snippets");
        cfg.content_dirs = Some(serde_json::json!({"snippets": "ci"}));
        assert_eq!(cfg.content_subdir("snippets"), "ci");
        cfg.content_dirs = Some(serde_json::json!("iso=isos,snippets=my/snips"));
        assert_eq!(cfg.content_subdir("snippets"), "my/snips");
    }
}
