//! Request validation against the vendored PVE 9.1 parameter schema.
//!
//! Interface contract (filled in by the schema work):
//! `Schema::vendored().check(method, path, &params)` returns the matched path template and
//! path parameters, or `SchemaError::NotImplemented` (answered 501) or
//! `SchemaError::Invalid(errors)` (answered 400 with PVE's per-parameter messages).

use std::collections::BTreeMap;

/// A request that matched an endpoint of the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    /// The schema's path template, e.g. `/nodes/{node}/qemu/{vmid}/config`.
    pub template: String,
    /// Values of the path parameters, e.g. `node -> pve1`.
    pub path_params: BTreeMap<String, String>,
}

/// Why a request does not pass the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaError {
    /// No such path or no such method on it (PVE answers 501).
    NotImplemented,
    /// Per-parameter errors, with PVE's messages (PVE answers 400).
    Invalid(BTreeMap<String, String>),
}

/// The vendored parameter schema.
#[derive(Debug)]
pub struct Schema {}

impl Schema {
    /// The schema vendored into this crate.
    pub fn vendored() -> &'static Schema {
        static SCHEMA: Schema = Schema {};
        &SCHEMA
    }

    /// Validates one request. `path` is below `/api2/json` (e.g. `/nodes/pve1/qemu`);
    /// `params` are query and body parameters, as strings.
    pub fn check(
        &self,
        _method: &str,
        _path: &str,
        _params: &BTreeMap<String, String>,
    ) -> Result<Matched, SchemaError> {
        Err(SchemaError::NotImplemented)
    }
}
