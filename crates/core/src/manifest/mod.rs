//! One manifest file → typed, validated resources, with every problem found in it.
//!
//! The types here are the contract between per-document parsing (this module) and the
//! cross-resource checks, layout and graph (`desired`, `repository`, `graph`).
//!
//! How a file is read, in order:
//! - `yaml`: text → a tree of located nodes per document (bounded against YAML bombs);
//! - `document`: `apiVersion` and `kind` first, then the whole document is decoded into that
//!   kind's raw type (`raw`) by `decode`, which reports unknown keys and wrong types and keeps
//!   going;
//! - `metadata`, `artifact`, `vm`, `lxc`: raw → validated types, one check per rule, each
//!   reporting with the field path; `check` locates a field path in the tree.
//!
//! Nothing here looks across documents: duplicate names or vmids, missing reference targets
//! and cycles are found by the callers.

use std::collections::BTreeMap;

use crate::diagnostic::{Diagnostic, sort_diagnostics};
use crate::resource::ResourceId;

mod artifact;
mod check;
mod choice;
mod decode;
mod document;
#[cfg(test)]
mod fuzz_tests;
mod guest;
mod ids;
mod lxc;
mod metadata;
mod quantity;
pub(crate) mod raw;
mod vm;
pub(crate) mod yaml;

pub use yaml::{
    MAX_DOCUMENTS_PER_FILE, MAX_FILE_NODES, MAX_FILE_TEXT_BYTES, MAX_REVISION_DOCUMENTS,
    MAX_REVISION_NODES, MAX_REVISION_TEXT_BYTES, RevisionBudget, RevisionLimits,
};

pub use artifact::{ArtifactSpec, Checksum, content_type, extensions};
pub use choice::{
    Aio, Arch, Bios, ChecksumAlgorithm, Discard, EfiTemplate, Machine, Media, PowerState,
    SecureBoot, TpmVersion,
};
pub use ids::{MAX_NAME_LEN, NodeName, StorageId, VmId, is_valid_name};
pub use lxc::*;
pub use metadata::{ADOPT, DEPENDS_ON, DRIFT, RESTART, SNAPSHOT};
pub use quantity::{ByteSize, Mebibytes, NotWholeMib, QuantityError};
pub use vm::*;

/// The largest manifest file read (8 MiB): the file readers refuse bigger files before reading
/// them, and [`parse_file`] refuses them unparsed. The 10,000-resource benchmark repository
/// holds 5.9 MiB in all; one file of a real repository holds a few KiB.
pub const MAX_FILE_BYTES: usize = 8 * 1024 * 1024;

/// The only `apiVersion` ProxOps reads.
pub const API_VERSION: &str = "proxops/v1alpha1";

/// A 1-based line and column in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Location {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

/// The resources of one file and the problems found in it.
#[derive(Debug, Clone, Default)]
pub struct ParsedFile {
    /// Resources that parsed well enough to have an identity.
    pub resources: Vec<Resource>,
    /// Every problem found in the file.
    pub diagnostics: Vec<Diagnostic>,
}

/// Parses and validates every document of one file. `path` is repository-relative.
///
/// Documents separated by `---` are independent: a syntax error abandons only its own
/// document. Every problem of every document is reported, in file order.
///
/// ```
/// let file = proxops_core::manifest::parse_file(
///     "iso/base/netinst.yaml",
///     "apiVersion: proxops/v1alpha1\nkind: ISO\nmetadata: {name: netinst}\n\
///      spec: {nodes: [pve1], storage: local, filename: netinst.iso, url: 'https://x.org/n.iso'}\n",
/// );
/// assert!(file.diagnostics.is_empty());
/// assert_eq!(file.resources[0].id.to_string(), "ISO/netinst");
/// ```
pub fn parse_file(path: &str, contents: &str) -> ParsedFile {
    parse_file_within(path, contents, &RevisionBudget::default())
}

/// [`parse_file`] drawing on a revision's budget, shared with the other files of the revision
/// (`repository::load`). When the budget runs out in this file, its last diagnostic says so and
/// the rest of the file is not read; when it ran out in another file, nothing is read.
pub fn parse_file_within(path: &str, contents: &str, budget: &RevisionBudget) -> ParsedFile {
    let mut file = ParsedFile::default();
    if contents.len() > MAX_FILE_BYTES {
        let problem = Diagnostic::error(
            path,
            1,
            1,
            "",
            format!(
                "file too large: {} bytes, more than the {} MiB a manifest file may hold",
                contents.len(),
                MAX_FILE_BYTES / (1024 * 1024)
            ),
        )
        .with_help("split the manifests into several files");
        file.diagnostics.push(problem);
        return file;
    }
    // Each document is checked and its tree dropped before the next one is read.
    yaml::for_each_document(path, contents, budget, |doc| {
        file.diagnostics.extend(doc.problems);
        if let Some(root) = doc.root {
            document::check_document(path, &root, &mut file);
        }
    });
    sort_diagnostics(&mut file.diagnostics);
    file
}

/// A resource's validated desired state.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// A VM or TemplateVM (the kind is in the resource id).
    Vm(Box<VmSpec>),
    /// An LXC or TemplateCT.
    Lxc(Box<LxcSpec>),
    /// An ISO, CTTemplate or DiskImage.
    Artifact(ArtifactSpec),
}

/// One validated manifest document.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// Kind and name.
    pub id: ResourceId,
    /// Repository-relative path of the file it came from.
    pub path: String,
    /// Where `metadata.name` is.
    pub location: Location,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// Where it lives on PVE.
    pub placement: Placement,
    /// Structured references and `proxops/depends-on` edges, in document order.
    pub references: Vec<Reference>,
    /// The validated spec; `None` when the document has errors (its diagnostics say why).
    /// A revision with any error is never planned, so planning can rely on `Some`.
    pub spec: Option<Spec>,
}

impl Resource {
    /// Whether the whole document validated.
    pub fn is_valid(&self) -> bool {
        self.spec.is_some()
    }
}

/// Where a resource lives on PVE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// A guest at (node, vmid).
    Guest {
        /// `spec.node`.
        node: String,
        /// `spec.vmid`.
        vmid: u32,
        /// Where `spec.vmid` is.
        vmid_location: Location,
    },
    /// A file on (each of the nodes, storage, filename).
    Artifact {
        /// `spec.nodes` (or legacy `spec.node`), deduplicated in order.
        nodes: Vec<String>,
        /// `spec.storage`.
        storage: String,
        /// `spec.filename`.
        filename: String,
    },
}

/// An edge from a resource to one it depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The resource depended on.
    pub target: ResourceId,
    /// The field that makes the reference, e.g. `spec.hardware.cdrom.iso`.
    pub field: String,
    /// Where that field's value is.
    pub location: Location,
    /// True for `proxops/depends-on` edges, false for structured references.
    pub explicit: bool,
}

#[cfg(test)]
pub(crate) mod testing;
