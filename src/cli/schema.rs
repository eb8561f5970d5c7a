//! `proxops schema`: the JSON Schema of the manifest format, for editors.

use crate::cli::Exit;
use crate::output;

/// Arguments of `proxops schema`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Prints the schema as pretty JSON on stdout.
pub fn run(_args: &Args) -> anyhow::Result<Exit> {
    output::print_json(&proxops_core::schema::manifest_json_schema())?;
    Ok(Exit::Success)
}
