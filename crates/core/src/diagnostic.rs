//! Diagnostics: one problem found in a manifest repository, located by file, line and column.
//!
//! Rendered as `path:line:col: error: <field path>: <message>` plus an optional `help:` line;
//! that text is part of ProxOps's contract (tests snapshot it). Nothing here reads files.
//!
//! [`Diagnostic::headline`] is the one-line form every view shows (`proxops validate`, the
//! agent's API and page, `proxops status`); `Display` adds the `help:` line. Diagnostics are
//! stored as JSON by the agent's state database and read back with `Deserialize`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How serious a diagnostic is. Only errors stop a revision from being applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The revision is invalid and is not applied.
    Error,
    /// Worth a look; the revision is still applied.
    Warning,
}

/// One problem, with where it is and, when we know one, how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Diagnostic {
    /// Repository-relative path with `/` separators.
    pub path: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// Error or warning.
    pub severity: Severity,
    /// Field path inside the document, e.g. `spec.disks[1].size`; empty for whole-file problems.
    pub field: String,
    /// What is wrong, as a lowercase fragment.
    pub message: String,
    /// How to fix it, when we know.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub help: Option<String>,
}

impl Diagnostic {
    /// An error at `path:line:column` on `field`.
    pub fn error(
        path: impl Into<String>,
        line: usize,
        column: usize,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            path: path.into(),
            line,
            column,
            severity: Severity::Error,
            field: field.into(),
            message: message.into(),
            help: None,
        }
    }

    /// The same diagnostic as a warning.
    #[must_use]
    pub fn into_warning(mut self) -> Self {
        self.severity = Severity::Warning;
        self
    }

    /// Adds a `help:` line.
    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Whether this diagnostic stops the revision from being applied.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The one-line form every view shows: `path:line:col: error: field: message` (no
    /// field part for whole-file problems, no `help:` line).
    pub fn headline(&self) -> String {
        Headline(self).to_string()
    }
}

impl Severity {
    /// `error` or `warning`, as rendered.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// [`Diagnostic::headline`] without allocating.
struct Headline<'a>(&'a Diagnostic);

impl fmt::Display for Headline<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        write!(
            f,
            "{}:{}:{}: {}: ",
            d.path,
            d.line,
            d.column,
            d.severity.as_str()
        )?;
        if !d.field.is_empty() {
            write!(f, "{}: ", d.field)?;
        }
        f.write_str(&d.message)
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Headline(self).fmt(f)?;
        if let Some(help) = &self.help {
            write!(f, "\n  help: {help}")?;
        }
        Ok(())
    }
}

/// Sorts diagnostics into their reporting order (path, line, column, then text) and drops
/// exact duplicates, so output is deterministic whatever order checks ran in.
pub fn sort_diagnostics(diagnostics: &mut Vec<Diagnostic>) {
    diagnostics.sort();
    diagnostics.dedup();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnostic_renders_location_field_message_and_help() {
        let d = Diagnostic::error(
            "vm/base/web.yaml",
            7,
            5,
            "spec.memory",
            "not a whole number of MiB",
        )
        .with_help("write `8GiB`");
        assert_eq!(
            d.to_string(),
            "vm/base/web.yaml:7:5: error: spec.memory: not a whole number of MiB\n  help: write `8GiB`"
        );
    }

    #[test]
    fn the_headline_is_the_first_line_without_help_and_round_trips_through_json() {
        let d = Diagnostic::error("vm/web.yaml", 4, 3, "spec.memroy", "unknown field")
            .with_help("did you mean `memory`?");
        assert_eq!(
            d.headline(),
            "vm/web.yaml:4:3: error: spec.memroy: unknown field"
        );
        assert_eq!(d.to_string().lines().next(), Some(d.headline().as_str()));
        let warning = Diagnostic::error("a.yaml", 1, 2, "", "odd").into_warning();
        assert_eq!(warning.headline(), "a.yaml:1:2: warning: odd");
        let json = serde_json::to_string(&[&d, &warning]).unwrap();
        let back: Vec<Diagnostic> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [d, warning]);
    }

    #[test]
    fn diagnostic_without_field_omits_the_field_part() {
        let d = Diagnostic::error(
            "vm/web.yaml",
            1,
            1,
            "",
            "manifest directly under a kind root",
        );
        assert_eq!(
            d.to_string(),
            "vm/web.yaml:1:1: error: manifest directly under a kind root"
        );
    }
}
