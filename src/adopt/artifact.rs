//! Storage files → ISO, CTTemplate and DiskImage manifests (DESIGN.md §2.3): one manifest per
//! (kind, storage, file name), with every node it was found on in `spec.nodes`. PVE does not
//! know where a file was downloaded from, so the URL is a placeholder under `.invalid` (a
//! name that can never resolve, RFC 6761) and is listed for the operator to replace.

use std::collections::{BTreeMap, BTreeSet};

use proxops_core::manifest::extensions;
use proxops_core::resource::Kind;

use super::read::StoredFile;
use super::yaml::{Map, Value};

/// One artifact found on one or more nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) kind: Kind,
    pub(crate) storage: String,
    pub(crate) filename: String,
    pub(crate) nodes: BTreeSet<String>,
}

impl Found {
    /// `<storage>:<content>/<file>`.
    pub(crate) fn volid(&self) -> String {
        format!(
            "{}:{}/{}",
            self.storage,
            proxops_core::manifest::content_type(self.kind),
            self.filename
        )
    }

    /// The placeholder URL written into the manifest.
    pub(crate) fn placeholder_url(&self) -> String {
        format!(
            "https://placeholder.invalid/{}/{}",
            self.storage, self.filename
        )
    }

    /// The manifest `spec`.
    pub(crate) fn spec(&self) -> Map {
        let mut spec = Map::new();
        let nodes = self.nodes.iter().map(|n| Value::Text(n.clone())).collect();
        spec.set("nodes", Value::List(nodes));
        spec.set("storage", self.storage.as_str());
        spec.set("filename", self.filename.as_str());
        spec.set("url", self.placeholder_url());
        spec
    }
}

/// Files grouped into artifacts, and those that cannot be one (with why).
pub(crate) fn group(files: &[StoredFile]) -> (Vec<Found>, Vec<(String, String)>) {
    let mut found: BTreeMap<(Kind, String, String), BTreeSet<String>> = BTreeMap::new();
    let mut skipped = BTreeMap::new();
    for file in files {
        let kind = match file.content {
            "iso" => Kind::Iso,
            "vztmpl" => Kind::CtTemplate,
            _ => Kind::DiskImage,
        };
        let what = format!(
            "{}:{}/{} on {}",
            file.storage, file.content, file.filename, file.node
        );
        if let Err(reason) = check_filename(kind, &file.filename) {
            skipped.insert(what, reason);
            continue;
        }
        found
            .entry((kind, file.storage.clone(), file.filename.clone()))
            .or_default()
            .insert(file.node.clone());
    }
    let found = found
        .into_iter()
        .map(|((kind, storage, filename), nodes)| Found {
            kind,
            storage,
            filename,
            nodes,
        })
        .collect();
    (found, skipped.into_iter().collect())
}

/// Whether the manifest format can declare a file of this name for this kind.
fn check_filename(kind: Kind, filename: &str) -> Result<(), String> {
    let plain = filename
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric())
        && filename
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !plain {
        return Err("the file name has characters a manifest cannot declare".to_owned());
    }
    let lower = filename.to_ascii_lowercase();
    let accepted = extensions(kind);
    if accepted
        .iter()
        .any(|ext| lower.ends_with(ext) && lower.len() > ext.len())
    {
        Ok(())
    } else {
        Err(format!(
            "{kind} manifests declare only {} files",
            accepted.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(content: &'static str, node: &str, filename: &str) -> StoredFile {
        StoredFile {
            content,
            storage: "local".to_owned(),
            filename: filename.to_owned(),
            node: node.to_owned(),
        }
    }

    #[test]
    fn a_file_on_two_nodes_is_one_artifact_and_an_ova_is_skipped() {
        let (found, skipped) = group(&[
            file("iso", "pve2", "netinst.iso"),
            file("iso", "pve1", "netinst.iso"),
            file("import", "pve1", "appliance.ova"),
            file("import", "pve1", "cloud.qcow2"),
        ]);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].kind, Kind::Iso);
        assert_eq!(found[0].nodes.iter().collect::<Vec<_>>(), ["pve1", "pve2"]);
        assert_eq!(found[1].volid(), "local:import/cloud.qcow2");
        assert_eq!(
            found[1].placeholder_url(),
            "https://placeholder.invalid/local/cloud.qcow2"
        );
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].0.starts_with("local:import/appliance.ova"));
    }
}
