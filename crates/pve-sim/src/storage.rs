//! Storages and their volumes: what `storage.cfg` defines, which volumes exist where, how
//! PVE names new volumes (`vm-<vmid>-disk-<n>` on LVM, `<vmid>/vm-<vmid>-disk-<n>.raw` in a
//! directory), how volume ids parse into a content type, and PVE's size notation.
//!
//! Pure data and rules; no HTTP and no task handling.

use std::collections::BTreeMap;

/// One storage definition (cluster wide, as in `storage.cfg`).
#[derive(Debug, Clone)]
pub(crate) struct StorageDef {
    pub(crate) id: String,
    pub(crate) kind: String,
    pub(crate) content: Vec<String>,
    pub(crate) nodes: Option<Vec<String>>,
    pub(crate) shared: bool,
    pub(crate) path: String,
    pub(crate) total: u64,
    pub(crate) enabled: bool,
}

impl StorageDef {
    /// Directory-like plugins accept uploads and downloads.
    pub(crate) fn is_file_based(&self) -> bool {
        matches!(
            self.kind.as_str(),
            "dir" | "nfs" | "cifs" | "cephfs" | "glusterfs" | "btrfs"
        )
    }

    pub(crate) fn has_content(&self, content: &str) -> bool {
        self.content.iter().any(|c| c == content)
    }

    pub(crate) fn is_on_node(&self, node: &str) -> bool {
        self.nodes
            .as_ref()
            .is_none_or(|nodes| nodes.iter().any(|n| n == node))
    }

    /// Sorted, comma-joined content list as PVE prints it.
    pub(crate) fn content_list(&self) -> String {
        let mut c = self.content.clone();
        c.sort();
        c.join(",")
    }

    /// The directory holding files of `content` on a file based storage.
    pub(crate) fn content_dir(&self, content: &str) -> String {
        let sub = match content {
            "iso" => "template/iso",
            "vztmpl" => "template/cache",
            "backup" => "dump",
            "snippets" => "snippets",
            "import" => "import",
            _ => "images",
        };
        format!("{}/{sub}", self.path)
    }
}

/// A volume on a storage.
#[derive(Debug, Clone)]
pub(crate) struct Volume {
    pub(crate) content: String,
    pub(crate) format: String,
    pub(crate) size: u64,
    pub(crate) ctime: u64,
    pub(crate) vmid: Option<u32>,
    /// Checksums by algorithm name (`sha256`, ...) of downloaded files.
    pub(crate) checksums: BTreeMap<String, String>,
    /// The `notes` attribute of a backup (vzdump's `notes-template`).
    pub(crate) notes: Option<String>,
}

/// What a volume name says about the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParsedVolname {
    pub(crate) content: String,
    pub(crate) format: String,
    pub(crate) vmid: Option<u32>,
}

/// Splits `storage:volname`.
pub(crate) fn split_volid(volid: &str) -> Option<(&str, &str)> {
    let (storage, name) = volid.split_once(':')?;
    let valid_storage = storage.len() >= 2
        && storage.starts_with(|c: char| c.is_ascii_alphabetic())
        && storage
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    (valid_storage && !name.is_empty()).then_some((storage, name))
}

/// Parses a volume name the way the storage plugins do (pve-storage @ 0c56bad8
/// `src/PVE/Storage/Plugin.pm` `parse_volname`, `parse_name_dir`; vztmpl formats `t$2`
/// from `$get_subdir_files`).
pub(crate) fn parse_volname(volname: &str) -> Result<ParsedVolname, String> {
    let ext_format = |f: &str| -> String {
        f.rsplit_once('.')
            .map(|(_, e)| e.to_ascii_lowercase())
            .unwrap_or_default()
    };
    if volname.starts_with("iso/") {
        return Ok(ParsedVolname {
            content: "iso".into(),
            format: "iso".into(),
            vmid: None,
        });
    }
    if let Some(f) = volname.strip_prefix("vztmpl/") {
        let format = if f.ends_with(".tar") {
            "tar".to_string()
        } else {
            let ext = ext_format(f);
            match ext.as_str() {
                "gz" => "tgz".into(),
                "xz" => "txz".into(),
                "zst" => "tzst".into(),
                "bz2" => "tbz2".into(),
                _ => ext,
            }
        };
        return Ok(ParsedVolname {
            content: "vztmpl".into(),
            format,
            vmid: None,
        });
    }
    if let Some(f) = volname.strip_prefix("import/") {
        return Ok(ParsedVolname {
            content: "import".into(),
            format: ext_format(f),
            vmid: None,
        });
    }
    if volname.starts_with("snippets/") {
        return Ok(ParsedVolname {
            content: "snippets".into(),
            format: "snippet".into(),
            vmid: None,
        });
    }
    if let Some(f) = volname.strip_prefix("backup/") {
        return Ok(ParsedVolname {
            content: "backup".into(),
            format: ext_format(f),
            vmid: None,
        });
    }
    // Images: `vm-100-disk-0`, `base-100-disk-0/vm-101-disk-0`, `100/vm-100-disk-0.raw`.
    let file = volname.rsplit('/').next().unwrap_or(volname);
    let stem = file.split('.').next().unwrap_or(file);
    let mut parts = stem.splitn(3, '-');
    let prefix = parts.next().unwrap_or("");
    let vmid = parts.next().and_then(|v| v.parse::<u32>().ok());
    if matches!(prefix, "vm" | "base" | "subvol" | "basevol") && vmid.is_some() {
        let format = if file.contains('.') {
            ext_format(file)
        } else if prefix.starts_with("subvol") || prefix == "basevol" {
            "subvol".to_string()
        } else {
            "raw".to_string()
        };
        return Ok(ParsedVolname {
            content: "images".into(),
            format,
            vmid,
        });
    }
    Err(format!("unable to parse directory volume name '{volname}'"))
}

/// Size in bytes of `<n>[KMGT]` (bytes without a suffix).
pub(crate) fn parse_size(text: &str) -> Option<u64> {
    let (num, mult) = match text.chars().last()? {
        'K' => (&text[..text.len() - 1], 1u64 << 10),
        'M' => (&text[..text.len() - 1], 1 << 20),
        'G' => (&text[..text.len() - 1], 1 << 30),
        'T' => (&text[..text.len() - 1], 1 << 40),
        _ => (text, 1),
    };
    let n: f64 = num.parse().ok()?;
    (n >= 0.0).then(|| (n * mult as f64).round() as u64)
}

/// PVE's `format_size`: the largest binary unit that divides the size exactly.
pub(crate) fn format_size(bytes: u64) -> String {
    if !bytes.is_multiple_of(1024) || bytes == 0 {
        return bytes.to_string();
    }
    let kb = bytes / 1024;
    if !kb.is_multiple_of(1024) {
        return format!("{kb}K");
    }
    let mb = kb / 1024;
    if !mb.is_multiple_of(1024) {
        return format!("{mb}M");
    }
    let gb = mb / 1024;
    if !gb.is_multiple_of(1024) {
        return format!("{gb}G");
    }
    format!("{}T", gb / 1024)
}

/// Bytes of an allocation size given in GiB (`0.5` is 512 MiB), rounded down to KiB as
/// qemu-server does.
pub(crate) fn gib_to_bytes(gib: f64) -> u64 {
    ((gib * 1024.0 * 1024.0).floor() as u64) * 1024
}

/// `<storage>:<size in GiB>` allocation syntax: returns (storage, GiB).
pub(crate) fn parse_allocation(file: &str) -> Option<(&str, f64)> {
    let (storage, size) = file.split_once(':')?;
    if storage.is_empty() || storage.contains(['/', ' ']) {
        return None;
    }
    if !size.chars().all(|c| c.is_ascii_digit() || c == '.') || size.is_empty() {
        return None;
    }
    size.parse::<f64>().ok().map(|s| (storage, s))
}

/// The files of `def`'s snippets directory as pve-storage lists them (`Plugin.pm`
/// `$get_subdir_files`, `snippets`: every non-directory entry of `<$path/*>`, which skips
/// dot-files, as volume `snippets/<name>` with format `snippet`, its size and `ctime`). Only
/// for storages mapped to a directory (`SimConfig::storage_root`); unreadable entries are
/// skipped as `File::stat` failing is.
pub(crate) fn snippet_files(def: &StorageDef) -> Vec<(String, Volume)> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(def.content_dir("snippets")) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Volume)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_str()?.to_owned();
            // `stat` follows links, as Perl's `File::stat::stat` does.
            let meta = std::fs::metadata(entry.path()).ok()?;
            (!name.starts_with('.') && !meta.is_dir()).then(|| {
                (
                    format!("snippets/{name}"),
                    Volume {
                        content: "snippets".to_string(),
                        format: "snippet".to_string(),
                        size: meta.len(),
                        ctime: u64::try_from(meta.ctime()).unwrap_or_default(),
                        vmid: None,
                        checksums: BTreeMap::new(),
                        notes: None,
                    },
                )
            })
        })
        .collect();
    out.sort_by_key(|a| a.0.to_lowercase());
    out
}

/// Whether the snippet `volname` (`snippets/<name>`) of `def` is a file (`-f`, following
/// links as Perl's does).
pub(crate) fn snippet_exists(def: &StorageDef, volname: &str) -> bool {
    volname
        .strip_prefix("snippets/")
        .filter(|name| !name.contains('/'))
        .is_some_and(|name| {
            std::path::Path::new(&def.content_dir("snippets"))
                .join(name)
                .is_file()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_in_the_largest_exact_unit() {
        assert_eq!(format_size(8 << 30), "8G");
        assert_eq!(format_size(512 << 20), "512M");
        assert_eq!(format_size(4096), "4K");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(gib_to_bytes(0.5), 512 << 20);
    }

    #[test]
    fn volume_names_parse_into_content_types() {
        assert_eq!(parse_volname("iso/a.iso").unwrap().content, "iso");
        assert_eq!(parse_volname("vztmpl/d.tar.zst").unwrap().format, "tzst");
        let img = parse_volname("base-100-disk-0/vm-101-disk-0").unwrap();
        assert_eq!((img.content.as_str(), img.vmid), ("images", Some(101)));
        assert_eq!(
            parse_volname("100/vm-100-disk-1.qcow2").unwrap().format,
            "qcow2"
        );
        assert!(parse_volname("iso").is_err());
        assert_eq!(parse_allocation("local-lvm:0.5"), Some(("local-lvm", 0.5)));
        assert_eq!(parse_allocation("local-lvm:vm-100-disk-0"), None);
    }
}
