//! ProxOps pure core: manifests, validation, dependency levels, planning and drift.
//!
//! Pure: no tokio, no HTTP, no git, no filesystem, no logging. It takes file contents, not
//! paths, and returns values; the `proxops` binary does all IO.
//!
//! Layout:
//! - [`diagnostic`]: located problems and their rendering.
//! - [`resource`]: kinds and resource identity.
//! - [`manifest`]: one file → typed, validated resources.
//! - [`desired`]: [`Manifest`], one cluster's resources checked against each other.
//! - [`graph`]: [`DependencyGraph`], dependency levels and cycles.
//! - [`repository`]: [`load`], a repository's files → layout, one desired state per cluster.
//! - [`schema`]: a JSON Schema of the manifest format, derived from the parser's raw types.
//! - [`observed`]: [`observed::ObservedState`], what PVE reported, as plain data.
//! - [`guest`]: a VM or LXC spec ⇄ its PVE config: render, read back, compare semantically.
//! - [`plan`]: [`plan::plan`], desired vs observed → levels of actions and findings.
//! - [`scope`]: the operator's `[scope]`: what a revision may declare, adopt and create.
#![warn(missing_docs)]

pub mod desired;
pub mod diagnostic;
pub mod graph;
pub mod guest;
pub mod manifest;
pub mod observed;
pub mod plan;
pub mod repository;
pub mod resource;
pub mod schema;
pub mod scope;
pub mod secret;
pub mod snippet;

pub use desired::Manifest;
pub use graph::DependencyGraph;
pub use repository::load;
