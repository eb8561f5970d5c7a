//! What adopt did, for the operator: the files written, the `resources.yaml` lines to add, the
//! manifests that need filling in, what was skipped, the placeholder URLs and every gap.
//! Rendered the same on every run (sorted lists, no timestamps); secret values never appear
//! (gaps carry `<redacted>`).

use std::fmt::Write as _;

use serde::Serialize;

pub use super::guest::Gap;

/// One manifest file adopt wrote.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Written {
    /// Repository-relative path (`vm/<cluster>/web-1.yaml`).
    pub path: String,
    /// `VM/web-1`.
    pub resource: String,
    /// What it was made from (`qemu 100 on pve1`, `local:iso/x.iso on pve1, pve2`).
    pub source: String,
}

/// A manifest that does not validate until the operator fills something in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Incomplete {
    /// Repository-relative path.
    pub path: String,
    /// What to fill in, one field per entry.
    pub fill: Vec<String>,
}

/// Something adopt did not turn into a manifest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Skipped {
    /// What (`qemu 105 on pve1`, `local:import/x.ova on pve1`).
    pub what: String,
    /// Why.
    pub reason: String,
}

/// A placeholder URL the operator should replace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Placeholder {
    /// `ISO/debian-13`.
    pub resource: String,
    /// The placeholder written.
    pub url: String,
}

/// The whole outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The cluster the composition paths are for.
    pub cluster: String,
    /// The nodes read.
    pub nodes: Vec<String>,
    /// Files written (complete and incomplete).
    pub written: Vec<Written>,
    /// The lines to add under `resources:` in `clusters/<cluster>/resources.yaml`; incomplete
    /// manifests are given commented out.
    pub resources_lines: Vec<String>,
    /// Manifests to finish before listing them.
    pub incomplete: Vec<Incomplete>,
    /// What was not adopted.
    pub skipped: Vec<Skipped>,
    /// Placeholder URLs.
    pub placeholders: Vec<Placeholder>,
    /// What PVE has that the manifests do not say.
    pub gaps: Vec<Gap>,
    /// Remarks on the run as a whole (e.g. how SSH keys were matched).
    pub notes: Vec<String>,
    /// GET requests sent.
    pub requests: u64,
    /// Non-GET requests sent (always 0 in a report: adopt fails otherwise).
    pub writes: u64,
    /// The vmids of the guests written with `proxops/adopt: "true"`: the agent adopts them
    /// only once `[scope] adopt` in agent.toml lists them (a manifest alone cannot).
    pub adopt_vmids: Vec<u32>,
}

impl Report {
    /// The `[scope] adopt` value that lists [`Report::adopt_vmids`], consecutive vmids as
    /// ranges (`"100-102,200"`); `None` when no guest was written.
    pub fn adopt_ranges(&self) -> Option<String> {
        let mut vmids = self.adopt_vmids.clone();
        vmids.sort_unstable();
        vmids.dedup();
        let mut parts: Vec<String> = Vec::new();
        let mut iter = vmids.into_iter().peekable();
        while let Some(first) = iter.next() {
            let mut last = first;
            while iter.peek() == Some(&(last + 1)) {
                last += 1;
                iter.next();
            }
            parts.push(if first == last {
                first.to_string()
            } else {
                format!("{first}-{last}")
            });
        }
        (!parts.is_empty()).then(|| parts.join(","))
    }
}

impl Report {
    /// The report as text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let complete = self.written.len() - self.incomplete.len();
        let _ = writeln!(
            out,
            "adopt: cluster {}, nodes {}: {} manifests written ({complete} complete, {} incomplete), {} skipped, {} gaps; {} GET requests, {} writes",
            self.cluster,
            self.nodes.join(", "),
            self.written.len(),
            self.incomplete.len(),
            self.skipped.len(),
            self.gaps.len(),
            self.requests,
            self.writes,
        );
        for note in &self.notes {
            let _ = writeln!(out, "note: {note}");
        }
        section(&mut out, "WRITTEN", &self.written, |w| {
            format!("{}  {}  (from {})", w.path, w.resource, w.source)
        });
        if !self.resources_lines.is_empty() {
            let _ = writeln!(
                out,
                "\nRESOURCES: add under `resources:` in clusters/{}/resources.yaml (this file is never edited):",
                self.cluster
            );
            for line in &self.resources_lines {
                let _ = writeln!(out, "{line}");
            }
        }
        if let Some(ranges) = self.adopt_ranges() {
            let _ = writeln!(
                out,
                "\nSCOPE: the agent takes these guests over only when agent.toml allows it; add under [scope]:\n  adopt = \"{ranges}\""
            );
        }
        section(&mut out, "INCOMPLETE", &self.incomplete, |i| {
            let mut text = format!("{}: fill in", i.path);
            for field in &i.fill {
                let _ = write!(text, "\n    - {field}");
            }
            text
        });
        section(
            &mut out,
            "PLACEHOLDER URLS (replace with where the file comes from)",
            &self.placeholders,
            |p| format!("{}  {}", p.resource, p.url),
        );
        section(&mut out, "SKIPPED", &self.skipped, |s| {
            format!("{}: {}", printable(&s.what), s.reason)
        });
        section(
            &mut out,
            "GAPS (on PVE, not in the manifests)",
            &self.gaps,
            |g| {
                format!(
                    "{}  {} = {}: {}",
                    g.resource,
                    printable(&g.key),
                    printable(&g.value),
                    g.note
                )
            },
        );
        out
    }
}

/// Text from PVE as one terminal-safe line: control characters (line breaks, escape
/// sequences) are shown escaped, so a config value can neither break the report's lines nor
/// drive the terminal.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn section<T>(out: &mut String, title: &str, items: &[T], line: impl Fn(&T) -> String) {
    if items.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n{title}:");
    for item in items {
        let _ = writeln!(out, "  {}", line(item));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_adopted_vmids_are_given_as_the_scope_adopt_line_to_add() {
        let report = Report {
            adopt_vmids: vec![102, 100, 101, 200],
            ..Report::default()
        };
        assert_eq!(report.adopt_ranges().as_deref(), Some("100-102,200"));
        let text = report.render();
        assert!(
            text.contains("add under [scope]:\n  adopt = \"100-102,200\"\n"),
            "{text}"
        );
        assert_eq!(Report::default().adopt_ranges(), None);
        assert!(!Report::default().render().contains("SCOPE"));
    }

    #[test]
    fn gap_values_from_pve_are_shown_on_one_line_without_control_characters() {
        let report = Report {
            gaps: vec![Gap {
                resource: "VM/x".to_owned(),
                key: "args".to_owned(),
                value: "a\nb\u{1b}[31m".to_owned(),
                note: "not modelled".to_owned(),
            }],
            ..Report::default()
        };
        let text = report.render();
        assert!(
            text.contains("VM/x  args = a\\nb\\u{1b}[31m: not modelled"),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'));
    }
}
