//! One manifest file → typed, validated resources, with every problem found in it.
//!
//! INTERFACE STUB: the types below are the contract between per-document parsing (this
//! module) and the cross-resource checks, layout and graph (`desired`, `repository`,
//! `graph`). Fields may be added; the names below stay.

use std::collections::BTreeMap;

use crate::diagnostic::Diagnostic;
use crate::resource::ResourceId;

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
pub fn parse_file(path: &str, contents: &str) -> ParsedFile {
    let _ = (path, contents);
    ParsedFile::default()
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
