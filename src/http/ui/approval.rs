//! What waits for approval (`[policy] approve`, issue 19 item 4), on the overview (a banner
//! with the command to run) and on a pass's page (the change it held and where it stands).

use std::fmt::Write as _;

use crate::agent::approval::{ApprovalJson, ApprovalView};
use crate::html::escape;

/// The held actions as a list: `delete VM/old on pve1 (destructive)`.
fn actions_list(approval: &ApprovalJson) -> String {
    let mut out = String::from("<ul>");
    for action in approval.actions.as_array().into_iter().flatten() {
        let text = |key: &str| action[key].as_str().unwrap_or_default().to_owned();
        let _ = write!(
            out,
            "<li><code>{} {}</code> on {} ({})</li>",
            escape(action["verb"]["verb"].as_str().unwrap_or_default()),
            escape(&crate::agent::approval::resource_text(action)),
            escape(&text("node")),
            escape(&text("risk"))
        );
    }
    out.push_str("</ul>");
    out
}

fn sentence(approval: &ApprovalJson) -> String {
    let count = approval.actions.as_array().map_or(0, Vec::len);
    format!(
        "pass <a href=\"/ui/passes/{}\">#{}</a> holds {count} action{} ({}, digest <code>{}</code>) since {}",
        approval.pass,
        approval.pass,
        if count == 1 { "" } else { "s" },
        escape(&approval.why),
        escape(proxops_core::plan::digest::short(&approval.digest)),
        escape(&approval.since)
    )
}

/// The overview's banner while a change waits (or was approved and waits for its pass).
pub fn banner(view: &ApprovalView, out: &mut String) {
    let Some(open) = &view.open else {
        return;
    };
    let decided = match (open.state.as_str(), &open.decided_by) {
        ("rejected", Some(who)) => format!(" Rejected by {}.", escape(who)),
        ("approved", Some(who)) => {
            format!(" Approved by {}: the next pass runs them.", escape(who))
        }
        _ => String::new(),
    };
    let _ = write!(
        out,
        "<div class=\"banner warn\" id=\"flag-approval\"><p><b>Awaiting approval:</b> {}.{decided} \
         Run <code>proxops approve {}</code> (or <code>proxops reject {}</code>) as the agent's \
         user.</p>{}</div>",
        sentence(open),
        open.pass,
        open.pass,
        actions_list(open)
    );
}

/// A pass's page: the change it held, and what became of it.
pub fn section(approval: Option<&ApprovalJson>, out: &mut String) {
    let Some(approval) = approval else {
        return;
    };
    let state = match approval.state.as_str() {
        "awaiting" => format!(
            "awaiting approval: run <code>proxops approve {}</code>",
            approval.pass
        ),
        "approved" => format!(
            "approved by {}",
            escape(approval.decided_by.as_deref().unwrap_or("?"))
        ),
        "rejected" => format!(
            "rejected by {}; <code>proxops approve {}</code> lets it run",
            escape(approval.decided_by.as_deref().unwrap_or("?")),
            approval.pass
        ),
        "lapsed" => format!(
            "lapsed: pass #{} planned another change, which needs its own approval",
            approval.closed_by_pass.unwrap_or_default()
        ),
        _ => format!(
            "cleared: pass #{} held nothing any more",
            approval.closed_by_pass.unwrap_or_default()
        ),
    };
    let _ = write!(
        out,
        "<section id=\"approval\"><h2>Held for approval</h2><p>{}; {state}.</p>{}</section>",
        sentence(approval),
        actions_list(approval)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(state: &str) -> ApprovalJson {
        ApprovalJson {
            pass: 12,
            last_pass: 13,
            state: state.to_owned(),
            digest: "sha256:0123456789abcdef".to_owned(),
            why: "destructive".to_owned(),
            actions: serde_json::json!([
                {"verb": {"verb": "delete", "vmid": 101}, "resource": {"kind": "VM", "name": "<old>"}, "node": "pve1", "risk": "destructive"}
            ]),
            since: "2027-01-01T00:00:00Z".to_owned(),
            command: Some("proxops approve 12".to_owned()),
            decided_by: (state != "awaiting").then(|| "alice".to_owned()),
            decided_at: None,
            decision_reason: None,
            closed_by_pass: (state == "lapsed").then_some(14),
        }
    }

    #[test]
    fn the_banner_names_the_pass_the_command_and_each_held_action_escaped() {
        let mut out = String::new();
        banner(&ApprovalView::default(), &mut out);
        assert!(out.is_empty());
        banner(
            &ApprovalView {
                open: Some(held("rejected")),
                recent: Vec::new(),
            },
            &mut out,
        );
        assert!(out.contains("id=\"flag-approval\""), "{out}");
        assert!(out.contains("<code>proxops approve 12</code>"), "{out}");
        assert!(out.contains("Rejected by alice"), "{out}");
        assert!(out.contains("VM/&lt;old&gt;"), "{out}");
        assert!(out.contains("<code>0123456789ab</code>"), "{out}");
    }

    #[test]
    fn a_pass_page_says_what_became_of_the_change_it_held() {
        let mut out = String::new();
        section(Some(&held("lapsed")), &mut out);
        assert!(
            out.contains("lapsed: pass #14 planned another change"),
            "{out}"
        );
        let mut out = String::new();
        section(Some(&held("awaiting")), &mut out);
        assert!(
            out.contains("awaiting approval: run <code>proxops approve 12</code>"),
            "{out}"
        );
    }
}
