//! The human view of a plan, in the style operators know from `terraform plan`:
//! `+` create or download, `~` update, `-` delete, `!` finding. No timestamps, no hash-map
//! order: the same plan always renders to the same text.

use std::fmt::Write;

use crate::plan::risk::{Risk, risk};
use crate::plan::{Action, Plan, Update, Verb};

/// The longest value shown in a change line; longer ones are cut with `…`.
const MAX_VALUE: usize = 72;

fn shown(value: &str) -> String {
    if value.is_empty() {
        return "(none)".to_owned();
    }
    if value.chars().count() > MAX_VALUE {
        let cut: String = value.chars().take(MAX_VALUE).collect();
        return format!("{cut}…");
    }
    value.to_owned()
}

fn render_update(out: &mut String, action: &Action, update: &Update) {
    let head = format!("  ~ update {} on {}", action.resource, action.node);
    let line = |c: &crate::plan::Change| {
        if c.desired.is_empty() && !c.field.ends_with(".size") {
            format!("{}: {} → (deleted)", c.field, shown(&c.observed))
        } else {
            format!(
                "{}: {} → {}",
                c.field,
                shown(&c.observed),
                shown(&c.desired)
            )
        }
    };
    match update.changes.as_slice() {
        [one] => {
            let _ = writeln!(out, "{head}: {}", line(one));
        }
        many => {
            let _ = writeln!(out, "{head} (vmid {}):", update.vmid);
            for change in many {
                let _ = writeln!(out, "      {}", line(change));
            }
        }
    }
}

/// Renders one action, then appends the `[risky]`/`[destructive]` marker to its first line
/// (safe actions carry none, so the eye finds the others).
fn render_action(out: &mut String, action: &Action, notes: &dyn Fn(&Action) -> Vec<String>) {
    let start = out.len();
    render_action_lines(out, action, notes);
    let level = risk(action);
    if level != Risk::Safe
        && let Some(end) = out[start..].find('\n')
    {
        // Before a trailing `:` (a multi-line update's head), so the colon still leads on.
        let at = if out[start..start + end].ends_with(':') {
            start + end - 1
        } else {
            start + end
        };
        out.insert_str(at, &format!(" [{level}]"));
    }
}

fn render_action_lines(out: &mut String, action: &Action, notes: &dyn Fn(&Action) -> Vec<String>) {
    let (resource, node) = (&action.resource, &action.node);
    match &action.verb {
        Verb::Download(d) => {
            let _ = writeln!(out, "  + download {resource} on {node} → {}", d.volid);
            let _ = writeln!(out, "      from {}", d.url);
            if let Some(c) = &d.checksum {
                let _ = writeln!(out, "      {} {}", c.algorithm, c.value);
            }
        }
        Verb::Create(c) => {
            let _ = writeln!(out, "  + create {resource} on {node} (vmid {})", c.vmid);
            for g in &c.grow {
                let _ = writeln!(out, "      then grow {} to {}", g.slot, g.size);
            }
        }
        Verb::Clone(c) => {
            let _ = writeln!(
                out,
                "  + clone {resource} on {node} (vmid {}) from TemplateVM/{} (vmid {})",
                c.vmid, c.source, c.source_vmid
            );
        }
        Verb::Update(u) => {
            render_update(out, action, u);
            if u.regenerate_cloudinit {
                let _ = writeln!(
                    out,
                    "      then regenerate the cloud-init drive (risky: new cloud-init data)"
                );
            }
        }
        Verb::WriteSnippet(s) => {
            let _ = writeln!(
                out,
                "  + write snippet {} for {resource} on {node}",
                s.volid()
            );
            if !s.secret {
                let _ = writeln!(out, "      sha256 {}", s.sha256);
            }
        }
        Verb::RemoveSnippet(s) => {
            let _ = writeln!(out, "  - remove snippet {} on {node}", s.volid());
        }
        Verb::Pool(p) => {
            let _ = writeln!(
                out,
                "  ~ update {resource} on {node}: pool: {} → {}",
                shown(p.from.as_deref().unwrap_or("")),
                p.pool
            );
        }
        Verb::Delete(g) => {
            let _ = writeln!(out, "  - delete {resource} on {node} (vmid {})", g.vmid);
        }
        verb => {
            let vmid = verb.guest().map_or(0, |g| g.vmid);
            let _ = writeln!(
                out,
                "  ~ {} {resource} on {node} (vmid {vmid})",
                verb.name()
            );
        }
    }
    for note in notes(action) {
        let _ = writeln!(out, "      {note}");
    }
    let _ = writeln!(out, "      because {}", action.reason);
}

/// Renders a plan for people. `title` names the desired state (e.g. `cluster homelab`).
pub fn render_human(plan: &Plan, title: &str) -> String {
    render_human_noted(plan, title, &|_| Vec::new())
}

/// [`render_human`] with the lines `notes` gives for an action (what the caller's settings
/// add to it, e.g. a snapshot first) shown under it, before its `because` line.
pub fn render_human_noted(
    plan: &Plan,
    title: &str,
    notes: &dyn Fn(&Action) -> Vec<String>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{title}:");
    if let Some(reason) = &plan.aborted {
        let _ = writeln!(out, "  ! aborted: {reason}");
    }
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
            render_action(&mut out, action, notes);
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
    let count = |f: fn(&Verb) -> bool| plan.actions().filter(|a| f(&a.verb)).count();
    let downloads = count(|v| matches!(v, Verb::Download(_)));
    let creates = count(|v| matches!(v, Verb::Create(_) | Verb::Clone(_)));
    let updates = count(|v| matches!(v, Verb::Update(_) | Verb::Pool(_)));
    let deletes = count(|v| matches!(v, Verb::Delete(_)));
    let power = count(|v| {
        matches!(
            v,
            Verb::Start(_) | Verb::Shutdown(_) | Verb::Reboot(_) | Verb::Promote(_)
        )
    });
    let snippets = count(|v| matches!(v, Verb::WriteSnippet(_) | Verb::RemoveSnippet(_)));
    let mut parts = vec![format!("{downloads} to download")];
    for (n, what) in [
        (snippets, "snippet files to write or remove"),
        (creates, "to create"),
        (updates, "to update"),
        (power, "power/template changes"),
        (deletes, "to delete"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    }
    let _ = writeln!(
        out,
        "  plan: {}, {} {}",
        parts.join(", "),
        plan.findings.len(),
        if plan.findings.len() == 1 {
            "finding"
        } else {
            "findings"
        }
    );
    if plan.has_changes() {
        let _ = writeln!(out, "  risk: {}", plan.risk_summary());
    }
    out
}
