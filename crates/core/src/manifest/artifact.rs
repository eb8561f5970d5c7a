//! Storage artifacts (ISO, CTTemplate, DiskImage): files PVE downloads onto a storage.
//!
//! Rules from DESIGN.md §2.3: `nodes` (or legacy `node`, never both), a storage id, a file
//! name PVE will not rewrite with the right extension for the kind, an http(s) URL, and an
//! optional checksum whose value has the algorithm's length.

use serde::Serialize;

use super::check::Checker;
use super::choice::ChecksumAlgorithm;
use super::ids::{NodeName, StorageId};
use super::raw::RawArtifactSpec;
use super::{Placement, Spec};
use crate::resource::Kind;

/// A validated artifact spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArtifactSpec {
    /// Nodes the file must exist on, deduplicated in order.
    pub nodes: Vec<NodeName>,
    /// The storage it is downloaded to.
    pub storage: StorageId,
    /// The on-storage file name.
    pub filename: String,
    /// Where PVE downloads it from.
    pub url: String,
    /// What PVE verifies after the download.
    pub checksum: Option<Checksum>,
}

/// A checksum PVE verifies after a download.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Checksum {
    /// The algorithm.
    pub algorithm: ChecksumAlgorithm,
    /// The digest in lowercase hex, of the algorithm's length.
    pub value: String,
}

impl ChecksumAlgorithm {
    /// PVE's spelling (`sha256`).
    pub fn as_str(self) -> &'static str {
        match self {
            ChecksumAlgorithm::Md5 => "md5",
            ChecksumAlgorithm::Sha1 => "sha1",
            ChecksumAlgorithm::Sha224 => "sha224",
            ChecksumAlgorithm::Sha256 => "sha256",
            ChecksumAlgorithm::Sha384 => "sha384",
            ChecksumAlgorithm::Sha512 => "sha512",
        }
    }

    /// How many hex digits a digest has.
    pub fn hex_len(self) -> usize {
        match self {
            ChecksumAlgorithm::Md5 => 32,
            ChecksumAlgorithm::Sha1 => 40,
            ChecksumAlgorithm::Sha224 => 56,
            ChecksumAlgorithm::Sha256 => 64,
            ChecksumAlgorithm::Sha384 => 96,
            ChecksumAlgorithm::Sha512 => 128,
        }
    }
}

/// PVE's content type for an artifact kind (`iso`, `vztmpl`, `import`).
pub fn content_type(kind: Kind) -> &'static str {
    match kind {
        Kind::CtTemplate => "vztmpl",
        Kind::DiskImage => "import",
        _ => "iso",
    }
}

impl ArtifactSpec {
    /// The PVE volume id, e.g. `local:iso/debian.iso`.
    pub fn volid(&self, kind: Kind) -> String {
        format!("{}:{}/{}", self.storage, content_type(kind), self.filename)
    }
}

/// The file extensions PVE accepts for each artifact kind, as pve-storage's `download_url`
/// checks them (`src/PVE/API2/Storage/Status.pm` @ 0c56bad8, with the patterns of
/// `src/PVE/Storage.pm`): ISO `$ISO_EXT_RE_0 = qr/\.(?:iso|img)/i` and CTTemplate
/// `$VZTMPL_EXT_RE_1` (`/i`) in any case; DiskImage `$UPLOAD_IMPORT_EXT_RE_1 =
/// qr/\.(ova|qcow2|raw|vmdk)/`, case-sensitive. `.ova` is
/// not offered: an OVA is an archive a disk must be picked from (`import-from=...ova/<disk>`),
/// which the DiskImage model does not do; `.ovf` is no extension PVE downloads at all.
pub fn extensions(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Iso => &[".iso", ".img"],
        Kind::CtTemplate => &[".tar", ".tar.gz", ".tar.xz", ".tar.zst", ".tar.bz2"],
        Kind::DiskImage => &[".qcow2", ".vmdk", ".raw"],
        _ => &[],
    }
}

/// Whether PVE matches `kind`'s extensions in any case (ISO and CTTemplate) or exactly as
/// written (DiskImage: `disk.QCOW2` is refused with `invalid filename or wrong extension`).
pub(crate) fn extensions_ignore_case(kind: Kind) -> bool {
    kind != Kind::DiskImage
}

/// Whether PVE keeps `name` as is: `^[A-Za-z0-9][A-Za-z0-9._-]*$`.
fn is_plain_filename(name: &str) -> bool {
    name.bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The host part of an http(s) URL, when it is one. The scheme must be lower case, as
/// download-url's `url` pattern `https?://.*` is matched case-sensitively (pve-storage
/// `src/PVE/API2/Storage/Status.pm` @ 0c56bad8 `download_url`; pve-common
/// `JSONSchema.pm` anchors `pattern` as `^(?^:...)$` without `/i`).
fn http_host(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    (!host.is_empty() && !url.chars().any(char::is_whitespace)).then_some(host)
}

/// Checks an artifact spec; the spec is `None` if anything in it is wrong.
pub(crate) fn check_artifact(
    ck: &mut Checker<'_>,
    kind: Kind,
    raw: &RawArtifactSpec,
) -> (Option<Spec>, Option<Placement>) {
    let nodes = check_nodes(ck, raw);

    let storage = ck.required(&raw.storage, "spec.storage").and_then(|s| {
        let id = StorageId::new(s);
        if id.is_none() && !ck.reported("spec.storage") {
            ck.error_help(
                "spec.storage",
                format!("`{s}` is not a storage id"),
                "storage ids are letters, digits, `-`, `_` and `.`",
            );
        }
        id
    });

    let filename = ck.required(&raw.filename, "spec.filename").and_then(|f| {
        if ck.reported("spec.filename") {
            return None;
        }
        if !is_plain_filename(f) {
            ck.error_help(
                "spec.filename",
                format!("`{f}` has characters PVE would rewrite"),
                "use only letters, digits, `.`, `_` and `-`, starting with a letter or digit; PVE renames other files, so ProxOps would never see this one as present",
            );
            return None;
        }
        let accepted = extensions(kind);
        let name = if extensions_ignore_case(kind) { f.to_ascii_lowercase() } else { f.clone() };
        if !accepted.iter().any(|ext| name.ends_with(ext) && name.len() > ext.len()) {
            let list = accepted.iter().map(|e| format!("`{e}`")).collect::<Vec<_>>().join(", ");
            let help = if extensions_ignore_case(kind) {
                format!("{kind} file names end in one of {list}")
            } else {
                format!("{kind} file names end in one of {list}, in lower case: PVE checks the extension of import files case-sensitively and refuses others (`invalid filename or wrong extension`)")
            };
            ck.error_help("spec.filename", format!("`{f}` does not have the extension of {kind} files"), help);
            return None;
        }
        Some(f.clone())
    });

    let url = ck.required(&raw.url, "spec.url").and_then(|u| {
        if ck.reported("spec.url") {
            return None;
        }
        if http_host(u).is_none() {
            ck.error_help(
                "spec.url",
                format!("`{u}` is not an http(s) URL"),
                "PVE downloads only from `http://` or `https://` URLs, the scheme in lower case",
            );
            return None;
        }
        Some(u.clone())
    });

    let checksum = match &raw.checksum {
        None => Some(None),
        Some(c) => {
            let algorithm = ck
                .required(&c.algorithm, "spec.checksum.algorithm")
                .copied();
            let value = ck.required(&c.value, "spec.checksum.value");
            match (algorithm, value) {
                (Some(algorithm), Some(value))
                    if !ck.reported("spec.checksum.algorithm")
                        && !ck.reported("spec.checksum.value") =>
                {
                    let value = value.trim().to_ascii_lowercase();
                    if !value.bytes().all(|b| b.is_ascii_hexdigit()) || value.is_empty() {
                        ck.error_help(
                            "spec.checksum.value",
                            "checksum value is not hexadecimal",
                            format!(
                                "a {} digest is {} hex digits",
                                algorithm.as_str(),
                                algorithm.hex_len()
                            ),
                        );
                        None
                    } else if value.len() != algorithm.hex_len() {
                        ck.error_help(
                            "spec.checksum.value",
                            format!(
                                "checksum value has {} hex digits, but {} has {}",
                                value.len(),
                                algorithm.as_str(),
                                algorithm.hex_len()
                            ),
                            "check that `algorithm` matches the published digest",
                        );
                        None
                    } else {
                        Some(Some(Checksum { algorithm, value }))
                    }
                }
                _ => None,
            }
        }
    };

    let placement = match (&nodes, &raw.storage, &raw.filename) {
        (Some(nodes), Some(storage), Some(filename)) => Some(Placement::Artifact {
            nodes: nodes.iter().map(|n| n.as_str().to_owned()).collect(),
            storage: storage.clone(),
            filename: filename.clone(),
        }),
        _ => None,
    };
    let spec = (|| {
        Some(Spec::Artifact(ArtifactSpec {
            nodes: nodes?,
            storage: storage?,
            filename: filename?,
            url: url?,
            checksum: checksum?,
        }))
    })();
    (spec, placement)
}

/// `nodes`, or the legacy `node`, never both; deduplicated in order.
fn check_nodes(ck: &mut Checker<'_>, raw: &RawArtifactSpec) -> Option<Vec<NodeName>> {
    let (list, field): (Vec<(String, String)>, &str) = match (&raw.nodes, &raw.node) {
        (Some(_), Some(_)) => {
            ck.error_at_key(
                "spec.node",
                "both `node` and `nodes` are set",
                "remove `node`; `nodes` is a list and `node: X` is the legacy spelling of `nodes: [X]`",
            );
            return None;
        }
        (None, None) => {
            if !ck.reported("spec.node") && !ck.reported("spec.nodes") {
                ck.missing(
                    "spec.nodes",
                    Some("add `nodes: [<node>, ...]`: the nodes the file must exist on".to_owned()),
                );
            }
            return None;
        }
        (Some(nodes), None) => (
            nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (format!("spec.nodes[{i}]"), n.clone()))
                .collect(),
            "spec.nodes",
        ),
        (None, Some(node)) => (vec![("spec.node".to_owned(), node.clone())], "spec.node"),
    };
    if ck.reported(field) {
        return None;
    }
    if list.is_empty() {
        ck.error_help(
            field,
            "no nodes listed",
            "list at least one node the file must exist on",
        );
        return None;
    }
    let mut nodes: Vec<NodeName> = Vec::with_capacity(list.len());
    let mut ok = true;
    for (field, name) in &list {
        match NodeName::new(name) {
            Some(n) if nodes.contains(&n) => {}
            Some(n) => nodes.push(n),
            None => {
                ok = false;
                if !ck.reported(field) {
                    ck.error_help(
                        field,
                        format!("`{name}` is not a node name"),
                        "node names are letters, digits and inner hyphens, as PVE shows them",
                    );
                }
            }
        }
    }
    ok.then_some(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::testing::{assert_errors, doc, errors, parse, spec, valid};

    const ISO: &str = "  nodes: [pve1, pve2]\n  storage: local\n  filename: debian-13.iso\n  url: https://cdimage.debian.org/debian-13.iso\n";

    fn iso(spec: &str) -> String {
        doc("ISO", "netinst", spec)
    }

    #[test]
    fn a_full_iso_validates_with_placement_and_volid() {
        let yaml = iso(&format!(
            "{ISO}  checksum:\n    algorithm: sha256\n    value: {}\n",
            "AB".repeat(32)
        ));
        let r = valid(&yaml);
        assert_eq!(r.id.to_string(), "ISO/netinst");
        assert_eq!(r.location, crate::manifest::Location { line: 4, column: 9 });
        assert_eq!(
            r.placement,
            Placement::Artifact {
                nodes: vec!["pve1".into(), "pve2".into()],
                storage: "local".into(),
                filename: "debian-13.iso".into()
            }
        );
        let Some(Spec::Artifact(a)) = r.spec else {
            panic!()
        };
        assert_eq!(a.volid(Kind::Iso), "local:iso/debian-13.iso");
        assert_eq!(a.checksum.unwrap().value, "ab".repeat(32));
    }

    #[test]
    fn full_cttemplate_and_diskimage_validate() {
        let ctt = doc(
            "CTT",
            "debian",
            "  node: pve1\n  storage: local\n  filename: debian-13-standard_13.1-1_amd64.tar.zst\n  url: http://download.proxmox.com/images/system/debian-13-standard_13.1-1_amd64.tar.zst\n",
        );
        let Spec::Artifact(a) = spec(&ctt) else {
            panic!()
        };
        assert_eq!(a.nodes, vec![NodeName::new("pve1").unwrap()]);
        assert_eq!(
            a.volid(Kind::CtTemplate),
            "local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst"
        );
        let disk = doc("DiskImage", "debian-cloud", "  nodes: [pve1, pve1]\n  storage: local\n  filename: debian-13-genericcloud-amd64.qcow2\n  url: https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2\n  checksum: {algorithm: sha512, value: '%'}\n".replace('%', &"0".repeat(128)).as_str());
        let Spec::Artifact(a) = spec(&disk) else {
            panic!()
        };
        assert_eq!(a.nodes.len(), 1, "duplicate nodes are dropped");
        assert_eq!(
            a.volid(Kind::DiskImage),
            "local:import/debian-13-genericcloud-amd64.qcow2"
        );
    }

    #[test]
    fn both_node_and_nodes_is_an_error_at_node() {
        assert_errors(
            &iso(&format!("  node: pve1\n{ISO}")),
            &[
                "test.yaml:6:3: error: spec.node: both `node` and `nodes` are set\n  help: remove `node`; `nodes` is a list and `node: X` is the legacy spelling of `nodes: [X]`",
            ],
        );
    }

    #[test]
    fn neither_node_nor_nodes_is_a_missing_field() {
        assert_errors(
            &iso("  storage: local\n  filename: a.iso\n  url: https://x.org/a.iso\n"),
            &[
                "test.yaml:5:1: error: spec.nodes: missing required field\n  help: add `nodes: [<node>, ...]`: the nodes the file must exist on",
            ],
        );
    }

    #[test]
    fn filenames_pve_would_rewrite_are_refused() {
        let e = errors(&iso(
            "  nodes: [pve1]\n  storage: local\n  filename: 'my disk.iso'\n  url: https://x.org/a.iso\n",
        ));
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("test.yaml:8:13: error: spec.filename: `my disk.iso` has characters PVE would rewrite\n  help: use only letters"), "{e:?}");
    }

    #[test]
    fn each_kind_requires_its_extensions() {
        assert_errors(
            &iso(
                "  nodes: [pve1]\n  storage: local\n  filename: a.qcow2\n  url: https://x.org/a\n",
            ),
            &[
                "test.yaml:8:13: error: spec.filename: `a.qcow2` does not have the extension of ISO files\n  help: ISO file names end in one of `.iso`, `.img`",
            ],
        );
        let ctt = doc(
            "CTTemplate",
            "t",
            "  nodes: [pve1]\n  storage: local\n  filename: a.tar.lz\n  url: https://x.org/a\n",
        );
        assert_eq!(
            errors(&ctt)[0],
            "test.yaml:8:13: error: spec.filename: `a.tar.lz` does not have the extension of CTTemplate files\n  help: CTTemplate file names end in one of `.tar`, `.tar.gz`, `.tar.xz`, `.tar.zst`, `.tar.bz2`"
        );
        let img = doc(
            "DiskImage",
            "t",
            "  nodes: [pve1]\n  storage: local\n  filename: a.img\n  url: https://x.org/a\n",
        );
        assert_eq!(errors(&img).len(), 1);
        let ok = doc(
            "CTTemplate",
            "t",
            "  nodes: [pve1]\n  storage: local\n  filename: a.tar.bz2\n  url: https://x.org/a\n",
        );
        valid(&ok);
    }

    #[test]
    fn urls_must_be_http_or_https() {
        assert_errors(
            &iso(
                "  nodes: [pve1]\n  storage: local\n  filename: a.iso\n  url: ftp://x.org/a.iso\n",
            ),
            &[
                "test.yaml:9:8: error: spec.url: `ftp://x.org/a.iso` is not an http(s) URL\n  help: PVE downloads only from `http://` or `https://` URLs, the scheme in lower case",
            ],
        );
        // download-url's `^https?://.*$` is case-sensitive: PVE answers 400 for `HTTPS://`.
        assert_errors(
            &iso(
                "  nodes: [pve1]\n  storage: local\n  filename: a.iso\n  url: HTTPS://x.org/a.iso\n",
            ),
            &[
                "test.yaml:9:8: error: spec.url: `HTTPS://x.org/a.iso` is not an http(s) URL\n  help: PVE downloads only from `http://` or `https://` URLs, the scheme in lower case",
            ],
        );
    }

    #[test]
    fn checksum_algorithms_are_a_closed_list() {
        assert_errors(
            &iso(&format!(
                "{ISO}  checksum: {{algorithm: sha3, value: abc}}\n"
            )),
            &[
                "test.yaml:10:25: error: spec.checksum.algorithm: expected one of `md5`, `sha1`, `sha224`, `sha256`, `sha384`, `sha512`, found `sha3`\n  help: did you mean `sha1`?",
            ],
        );
    }

    #[test]
    fn checksum_values_must_be_hex_of_the_algorithms_length() {
        assert_errors(
            &iso(&format!(
                "{ISO}  checksum: {{algorithm: sha256, value: {}}}\n",
                "a".repeat(63)
            )),
            &[
                "test.yaml:10:40: error: spec.checksum.value: checksum value has 63 hex digits, but sha256 has 64\n  help: check that `algorithm` matches the published digest",
            ],
        );
        assert_errors(
            &iso(&format!(
                "{ISO}  checksum: {{algorithm: md5, value: {}}}\n",
                "g".repeat(32)
            )),
            &[
                "test.yaml:10:37: error: spec.checksum.value: checksum value is not hexadecimal\n  help: a md5 digest is 32 hex digits",
            ],
        );
    }

    #[test]
    fn a_checksum_needs_both_algorithm_and_value() {
        assert_errors(
            &iso(&format!("{ISO}  checksum:\n    value: abc\n")),
            &["test.yaml:10:3: error: spec.checksum.algorithm: missing required field"],
        );
    }

    #[test]
    fn every_problem_of_an_artifact_is_reported_at_once() {
        let yaml = iso(
            "  nodes: [pve_1]\n  storage: 'local disk'\n  filename: a.exe\n  url: file:///a.iso\n  checksum: {algorithm: sha256, value: zz}\n  color: blue\n",
        );
        let e = errors(&yaml);
        assert_eq!(e.len(), 6, "{e:#?}");
        assert!(e[5].contains("spec.color: unknown key `color`"), "{e:#?}");
        let file = parse(&yaml);
        assert!(file.resources.is_empty() || file.resources[0].spec.is_none());
    }

    #[test]
    fn an_invalid_artifact_keeps_its_identity_for_cross_checks() {
        let file = parse(&iso(
            "  nodes: [pve1]\n  storage: local\n  filename: a.iso\n  url: ftp://x\n",
        ));
        assert_eq!(file.resources.len(), 1);
        assert!(!file.resources[0].is_valid());
    }
}
