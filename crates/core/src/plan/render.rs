//! The human view of a plan, in the style operators know from `terraform plan`:
//! `+` create or download, `~` update, `-` delete, `!` finding. No timestamps, no hash-map
//! order: the same plan always renders to the same text.

use std::fmt::Write;

use crate::plan::{Plan, Verb};

/// Renders a plan for people. `title` names the desired state (e.g. `cluster homelab`).
pub fn render_human(plan: &Plan, title: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{title}:");
    if !plan.has_changes() && plan.findings.is_empty() {
        let _ = writeln!(out, "  no changes: PVE matches the desired state");
        return out;
    }
    for (level, actions) in plan.levels.iter().enumerate() {
        if actions.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  level {level}:");
        for action in actions {
            match &action.verb {
                Verb::Download(d) => {
                    let _ = writeln!(
                        out,
                        "  + download {} on {} → {}",
                        action.resource, action.node, d.volid
                    );
                    let _ = writeln!(out, "      from {}", d.url);
                    if let Some(c) = &d.checksum {
                        let _ = writeln!(out, "      {} {}", c.algorithm, c.value);
                    }
                }
            }
            let _ = writeln!(out, "      because {}", action.reason);
        }
    }
    for finding in &plan.findings {
        let _ = writeln!(
            out,
            "  ! {} {} on {}: {}",
            finding.kind.name(),
            finding.resource,
            finding.node,
            finding.message
        );
    }
    let downloads = plan
        .actions()
        .filter(|a| matches!(a.verb, Verb::Download(_)))
        .count();
    let _ = writeln!(
        out,
        "  plan: {downloads} to download, {} {}",
        plan.findings.len(),
        if plan.findings.len() == 1 {
            "finding"
        } else {
            "findings"
        }
    );
    out
}
