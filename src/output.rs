//! The output sink: the only module that writes to stdout or stderr (commands return data).
//!
//! Human text for people, `--json` for machines. Errors are printed once, with their whole
//! cause chain, as `error: <what>: <cause>: ...`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write;

use serde::Serialize;

use crate::cli::validate::Report;

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, value)?;
    writeln!(stdout)?;
    Ok(())
}

/// Diagnostics on stderr; the summary on stdout.
pub fn print_validation(report: &Report) {
    for diagnostic in &report.diagnostics {
        eprintln!("{diagnostic}");
    }
    let errors = report.diagnostics.iter().filter(|d| d.is_error()).count();
    let warnings = report.diagnostics.len() - errors;
    for state in &report.states {
        let prefix = state
            .cluster
            .as_ref()
            .map(|c| format!("cluster {c}: "))
            .unwrap_or_default();
        println!(
            "{prefix}{} resources in {} files, {} levels",
            state.resources, state.files, state.levels
        );
    }
    if !report.valid {
        eprintln!(
            "error: {errors} {} found; nothing of this revision would be applied",
            plural(errors, "problem", "problems")
        );
    } else if warnings > 0 {
        eprintln!("{warnings} {}", plural(warnings, "warning", "warnings"));
    }
}

/// Prints an operational error with its cause chain on stderr.
pub fn print_error(error: &anyhow::Error) {
    eprintln!("error: {error:#}");
}

fn plural<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}
