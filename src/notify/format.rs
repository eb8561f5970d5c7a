//! Each service's own format, built from an [`Event`] (pure; the payloads are unit-tested
//! and, end to end, checked by the servers of `tests/it/notify.rs`):
//!
//! - **webhook**: our JSON document, `version` 1, described by
//!   `docs/notify-webhook.schema.json` (draft 2020-12). A change that removes or retypes a
//!   field bumps `version`; new optional fields do not.
//! - **ntfy**: JSON published to the server's root URL (ntfy docs, "Publish as JSON":
//!   `topic` required; `title`, `message`, `priority` 1–5, `tags`), with `markdown: false`.
//! - **Matrix**: the content of an `m.room.message` (client-server API v3,
//!   `PUT /_matrix/client/v3/rooms/{roomId}/send/m.room.message/{txnId}`): `msgtype`
//!   `m.notice` (what bots send: clients never answer it), `body` in plain text, and
//!   `format: org.matrix.custom.html` with `formatted_body`.
//! - **Slack**: an incoming webhook's `text` (the notification's fallback) and Block Kit
//!   `blocks`: a `header` (plain text, at most 150 characters), `section`s of `mrkdwn`
//!   (at most 3000 characters each) and a `context`; at most 50 blocks.
//! - **email**: a subject, a plain-text part and an HTML part (multipart/alternative).
//!
//! Everything that came from PVE or the repository is escaped for the format that carries
//! it (HTML for Matrix and email, Slack's `&`, `<`, `>` for mrkdwn) and passed through the
//! store's `redact` (user:password@ in URLs) once more.

use serde_json::{Value, json};

use crate::notify::config::EventKind;
use crate::notify::events::{ActionFact, Event, FindingFact};

/// The webhook document's version.
pub const WEBHOOK_VERSION: u32 = 1;
/// How many actions, findings or diagnostics a message lists; the rest are counted.
pub const MAX_ITEMS: usize = 20;
/// Slack's limit on a header block's text.
const SLACK_HEADER_MAX: usize = 150;
/// Slack's limit on a section's text.
const SLACK_SECTION_MAX: usize = 3000;

/// An event said in words: what every format is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// One line: `pve1: drift found on VM/web-1 (memory)`.
    pub title: String,
    /// The lines under the title (plain text, not escaped).
    pub lines: Vec<String>,
    /// Context: node, cluster, commit, pass.
    pub context: String,
    /// ntfy's priority: 1 (min) … 5 (max).
    pub priority: u8,
    /// ntfy tags (emoji short codes): the first shows as the title's icon.
    pub tags: Vec<&'static str>,
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

fn redact(text: &str) -> String {
    proxops_store::redact(text)
}

fn action_line(a: &ActionFact) -> String {
    let marker = match a.risk.as_deref() {
        Some(risk @ ("risky" | "destructive")) => format!(" [{risk}]"),
        _ => String::new(),
    };
    let mut line = format!(
        "{}{marker} {} on {}: {}",
        a.verb, a.resource, a.node, a.result
    );
    if let Some(error) = &a.error {
        line.push_str(&format!(" ({error})"));
    }
    if !a.reason.is_empty() {
        line.push_str(&format!(" — {}", a.reason));
    }
    if let Some(volid) = &a.backup {
        line.push_str(&format!(" (backed up first to {volid})"));
    }
    if let Some(upid) = &a.upid {
        line.push_str(&format!(" [{upid}]"));
    }
    redact(&line)
}

fn finding_line(f: &FindingFact) -> String {
    let mut line = format!("{} on {}", f.resource, f.node);
    if !f.field.is_empty() {
        line.push_str(&format!(" {}", f.field));
    }
    if f.kind != "drift" {
        line.push_str(&format!(" [{}]", f.kind));
    }
    if !f.desired.is_empty() || !f.observed.is_empty() {
        line.push_str(&format!(
            ": git says {}, PVE has {}",
            display_value(&f.desired),
            display_value(&f.observed)
        ));
    } else if !f.message.is_empty() {
        line.push_str(&format!(": {}", f.message));
    }
    if let Some(how) = &f.resolved_how {
        line.push_str(&format!(" ({how})"));
    }
    redact(&line)
}

fn display_value(v: &str) -> &str {
    if v.is_empty() { "nothing" } else { v }
}

/// Up to [`MAX_ITEMS`] lines, then how many more.
fn capped(lines: impl ExactSizeIterator<Item = String>) -> Vec<String> {
    let total = lines.len();
    let mut out: Vec<String> = lines.take(MAX_ITEMS).collect();
    if total > MAX_ITEMS {
        out.push(format!("… and {} more", total - MAX_ITEMS));
    }
    out
}

/// The event in words.
pub fn render(event: &Event) -> Rendered {
    let node = &event.node;
    let commit = event.commit.as_deref().map_or("-", short);
    let (title, lines, priority, tags) = match event.kind {
        EventKind::Applied => {
            let n = event.actions.len();
            (
                format!(
                    "{node}: applied {commit} ({})",
                    plural(n, "action", "actions")
                ),
                capped(event.actions.iter().map(action_line)),
                3,
                vec!["white_check_mark"],
            )
        }
        EventKind::Failed => {
            let failed = event
                .actions
                .iter()
                .filter(|a| a.result == "failed")
                .count();
            let what = if event.actions.is_empty() {
                "pass failed".to_owned()
            } else {
                format!(
                    "{failed} of {} failed",
                    plural(event.actions.len(), "action", "actions")
                )
            };
            let mut lines = Vec::new();
            if let Some(error) = &event.error {
                lines.push(redact(error));
            }
            lines.extend(capped(event.actions.iter().map(action_line)));
            (format!("{node}: {what} at {commit}"), lines, 4, vec!["x"])
        }
        EventKind::Invalid => {
            let n = event.diagnostics.len();
            let mut lines = capped(event.diagnostics.iter().map(|d| redact(d)));
            if lines.is_empty()
                && let Some(error) = &event.error
            {
                lines.push(redact(error));
            }
            let unverified = n == 0
                && event
                    .error
                    .as_deref()
                    .is_some_and(|e| e.starts_with("unverified: "));
            lines.push(if unverified {
                "the last applied revision stays in force; sign the commits with an allowed key \
                 and push"
                    .to_owned()
            } else {
                "the last applied revision stays in force; fix the files and push".to_owned()
            });
            (
                if unverified {
                    format!("{node}: revision {commit} is unverified")
                } else {
                    format!(
                        "{node}: revision {commit} is invalid ({})",
                        plural(n, "error", "errors")
                    )
                },
                lines,
                4,
                vec!["warning"],
            )
        }
        EventKind::DriftFound => {
            let subject = match event.findings.as_slice() {
                [one] => format!(
                    "on {}{}",
                    one.resource,
                    if one.field.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", one.field)
                    }
                ),
                many => format!("({})", plural(many.len(), "finding", "findings")),
            };
            (
                format!("{node}: drift found {subject}"),
                capped(event.findings.iter().map(finding_line)),
                4,
                vec!["mag"],
            )
        }
        EventKind::DriftResolved => {
            let subject = match event.findings.as_slice() {
                [one] => format!("on {}", one.resource),
                many => format!("({})", plural(many.len(), "finding", "findings")),
            };
            (
                format!("{node}: drift resolved {subject}"),
                capped(event.findings.iter().map(finding_line)),
                2,
                vec!["heavy_check_mark"],
            )
        }
        EventKind::ReadOnly => (
            format!("{node}: write circuit breaker open; the agent is read-only"),
            event
                .error
                .iter()
                .map(|e| redact(e))
                .chain(["writes resume after the cool-down, with one probe write".to_owned()])
                .collect(),
            5,
            vec!["rotating_light"],
        ),
        EventKind::Stale => (
            format!("{node}: git unreachable; enforcing {commit}, the last good revision"),
            event.error.iter().map(|e| redact(e)).collect(),
            3,
            vec!["hourglass"],
        ),
        EventKind::AwaitingApproval => {
            let held = event.approval.as_ref();
            let pass = held.map_or(event.pass, |a| a.pass);
            let mut lines = capped(event.actions.iter().map(action_line));
            lines.push(format!(
                "held ({}, digest {}); approve with `proxops approve {pass}` on the node, as the                  agent's user, or keep them held with `proxops reject {pass}`",
                held.map_or("", |a| a.why.as_str()),
                held.map_or("", |a| proxops_core::plan::digest::short(&a.digest))
            ));
            (
                format!(
                    "{node}: {} await approval (pass {pass})",
                    plural(event.actions.len(), "action", "actions")
                ),
                lines,
                4,
                vec!["raised_hand"],
            )
        }
    };
    let mut context = format!("node {node}");
    if let Some(cluster) = &event.cluster {
        context.push_str(&format!(" · cluster {cluster}"));
    }
    if let Some(commit) = &event.commit {
        context.push_str(&format!(" · commit {}", short(commit)));
    }
    context.push_str(&format!(" · pass {} ({})", event.pass, event.outcome));
    Rendered {
        title: redact(&title),
        lines,
        context,
        priority,
        tags,
    }
}

/// Plain text: the lines, then the context.
pub fn plain_text(rendered: &Rendered) -> String {
    let mut text = String::new();
    for line in &rendered.lines {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str(&rendered.context);
    text
}

/// Escapes text for HTML element content and attribute values (the UI's rule).
pub use crate::html::escape as escape_html;

/// HTML: the title in bold, the lines as a list, the context in small type.
pub fn html(rendered: &Rendered) -> String {
    let mut out = format!("<p><strong>{}</strong></p>", escape_html(&rendered.title));
    if !rendered.lines.is_empty() {
        out.push_str("<ul>");
        for line in &rendered.lines {
            out.push_str(&format!("<li><code>{}</code></li>", escape_html(line)));
        }
        out.push_str("</ul>");
    }
    out.push_str(&format!(
        "<p><small>{}</small></p>",
        escape_html(&rendered.context)
    ));
    out
}

/// The webhook document (`docs/notify-webhook.schema.json`).
pub fn webhook(event: &Event) -> Value {
    let rendered = render(event);
    let mut document = json!({
        "version": WEBHOOK_VERSION,
        "event": event.kind.as_str(),
        "title": rendered.title,
        "text": plain_text(&rendered),
        "node": event.node,
        "cluster": event.cluster,
        "pass": {
            "id": event.pass,
            "commit": event.commit,
            "outcome": event.outcome,
        },
        "actions": event.actions.iter().map(|a| json!({
            "resource": a.resource,
            "node": a.node,
            "verb": a.verb,
            "reason": redact(&a.reason),
            "result": a.result,
            "error": a.error.as_deref().map(redact),
            "upid": a.upid,
            "risk": a.risk,
            "backup": a.backup,
        })).collect::<Vec<_>>(),
        "findings": event.findings.iter().map(|f| json!({
            "resource": f.resource,
            "node": f.node,
            "kind": f.kind,
            "field": f.field,
            "desired": redact(&f.desired),
            "observed": redact(&f.observed),
            "message": redact(&f.message),
            "resolved_how": f.resolved_how,
        })).collect::<Vec<_>>(),
        "diagnostics": event.diagnostics.iter().map(|d| redact(d)).collect::<Vec<_>>(),
        "error": event.error.as_deref().map(redact),
    });
    if let (Some(held), Some(object)) = (&event.approval, document.as_object_mut()) {
        object.insert(
            "approval".to_owned(),
            json!({
                "pass": held.pass,
                "digest": held.digest,
                "why": held.why,
                "command": format!("proxops approve {}", held.pass),
            }),
        );
    }
    document
}

/// ntfy's JSON publish body for `topic`.
pub fn ntfy(event: &Event, topic: &str) -> Value {
    let rendered = render(event);
    json!({
        "topic": topic,
        "title": rendered.title,
        "message": plain_text(&rendered),
        "priority": rendered.priority,
        "tags": rendered.tags.iter().copied().chain([event.kind.as_str()]).collect::<Vec<_>>(),
        "markdown": false,
    })
}

/// The `m.room.message` content.
pub fn matrix(event: &Event) -> Value {
    let rendered = render(event);
    json!({
        "msgtype": "m.notice",
        "body": format!("{}\n{}", rendered.title, plain_text(&rendered)),
        "format": "org.matrix.custom.html",
        "formatted_body": html(&rendered),
    })
}

/// Escapes text for Slack's mrkdwn: `&`, `<` and `>` (Slack's "Formatting text" rules).
pub fn escape_slack(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Cuts `text` to at most `max` characters, ending with `…` when cut.
fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// The incoming webhook's body: `text` and `blocks`.
pub fn slack(event: &Event) -> Value {
    let rendered = render(event);
    let mut blocks = vec![json!({
        "type": "header",
        "text": {"type": "plain_text", "text": clip(&rendered.title, SLACK_HEADER_MAX)},
    })];
    // Lines go into sections of at most 3000 characters; ``` keeps PVE's text verbatim.
    let mut section = String::new();
    let flush = |section: &mut String, blocks: &mut Vec<Value>| {
        if !section.is_empty() {
            blocks.push(json!({
                "type": "section",
                "text": {"type": "mrkdwn", "text": clip(section, SLACK_SECTION_MAX)},
            }));
            section.clear();
        }
    };
    for line in &rendered.lines {
        let item = format!("• `{}`\n", escape_slack(&line.replace('`', "'")));
        if section.chars().count() + item.chars().count() > SLACK_SECTION_MAX {
            flush(&mut section, &mut blocks);
        }
        section.push_str(&item);
    }
    flush(&mut section, &mut blocks);
    blocks.truncate(49);
    blocks.push(json!({
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": escape_slack(&rendered.context)}],
    }));
    json!({
        "text": escape_slack(&rendered.title),
        "blocks": blocks,
    })
}

/// An email's subject, plain-text body and HTML body.
pub fn email(event: &Event) -> (String, String, String) {
    let rendered = render(event);
    let subject = format!("[proxops] {}", rendered.title);
    let text = format!("{}\n\n{}\n", rendered.title, plain_text(&rendered));
    let html = format!(
        "<!DOCTYPE html><html><body>{}</body></html>",
        html(&rendered)
    );
    (subject, text, html)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drift_event() -> Event {
        Event {
            kind: EventKind::DriftFound,
            pass: 7,
            node: "pve1".into(),
            cluster: None,
            commit: Some("0123456789abcdef".into()),
            outcome: "no-change".into(),
            actions: Vec::new(),
            findings: vec![FindingFact {
                node: "pve1".into(),
                resource: "VM/web-1".into(),
                kind: "drift".into(),
                field: "memory".into(),
                desired: "512".into(),
                observed: "<b>1024</b>".into(),
                message: String::new(),
                resolved_how: None,
            }],
            diagnostics: Vec::new(),
            error: None,
            approval: None,
        }
    }

    #[test]
    fn a_held_change_says_what_waits_and_the_command_that_approves_it() {
        let action = ActionFact {
            resource: "VM/old".into(),
            node: "pve1".into(),
            verb: "delete".into(),
            reason: "no manifest declares it".into(),
            result: "skipped".into(),
            error: Some("awaiting approval (destructive)".into()),
            upid: None,
            risk: Some("destructive".into()),
            backup: None,
        };
        let event = Event {
            kind: EventKind::AwaitingApproval,
            actions: vec![action],
            findings: Vec::new(),
            approval: Some(crate::notify::events::AwaitingFact {
                pass: 12,
                digest: "sha256:0123456789abcdef00".into(),
                why: "destructive".into(),
                actions: Vec::new(),
            }),
            ..drift_event()
        };
        let r = render(&event);
        assert_eq!(r.title, "pve1: 1 action await approval (pass 12)");
        assert!(
            r.lines.last().unwrap().contains("`proxops approve 12`")
                && r.lines.last().unwrap().contains("digest 0123456789ab"),
            "{:?}",
            r.lines
        );
        let document = webhook(&event);
        assert_eq!(document["event"], "awaiting-approval");
        assert_eq!(document["approval"]["command"], "proxops approve 12");
        assert_eq!(document["actions"][0]["risk"], "destructive");
        assert!(webhook(&drift_event()).get("approval").is_none());
    }

    #[test]
    fn a_drift_is_said_with_the_resource_field_values_node_and_commit() {
        let r = render(&drift_event());
        assert_eq!(r.title, "pve1: drift found on VM/web-1 (memory)");
        assert_eq!(
            r.lines,
            ["VM/web-1 on pve1 memory: git says 512, PVE has <b>1024</b>"]
        );
        assert_eq!(
            r.context,
            "node pve1 · commit 0123456789ab · pass 7 (no-change)"
        );
    }

    #[test]
    fn html_formats_escape_what_pve_reported() {
        let m = matrix(&drift_event());
        let body = m["formatted_body"].as_str().unwrap();
        assert!(
            body.contains("&lt;b&gt;1024&lt;/b&gt;") && !body.contains("<b>1024"),
            "{body}"
        );
        let s = slack(&drift_event());
        assert!(s.to_string().contains("&lt;b&gt;1024"), "{s}");
        let (_, _, html) = email(&drift_event());
        assert!(!html.contains("<b>1024"), "{html}");
    }

    #[test]
    fn risky_and_destructive_actions_are_marked_and_safe_ones_are_not() {
        let fact = |verb: &str, risk: Option<&str>| ActionFact {
            resource: "VM/web".into(),
            node: "pve1".into(),
            verb: verb.into(),
            reason: String::new(),
            result: "succeeded".into(),
            error: None,
            upid: None,
            risk: risk.map(Into::into),
            backup: None,
        };
        assert_eq!(
            action_line(&fact("delete", Some("destructive"))),
            "delete [destructive] VM/web on pve1: succeeded"
        );
        assert_eq!(
            action_line(&fact("reboot", Some("risky"))),
            "reboot [risky] VM/web on pve1: succeeded"
        );
        assert_eq!(
            action_line(&fact("start", Some("safe"))),
            "start VM/web on pve1: succeeded"
        );
        assert_eq!(
            action_line(&fact("start", None)),
            "start VM/web on pve1: succeeded"
        );
        let mut event = drift_event();
        event.actions = vec![fact("delete", Some("destructive"))];
        assert_eq!(webhook(&event)["actions"][0]["risk"], "destructive");
    }

    #[test]
    fn a_delete_backed_up_first_names_the_backup_volume_in_its_line_and_the_webhook() {
        let volid = "local:backup/vzdump-qemu-151-2026_12_01-15_00_00.vma.zst";
        let mut event = drift_event();
        event.kind = EventKind::Applied;
        event.actions = vec![ActionFact {
            resource: "VM/old".into(),
            node: "pve1".into(),
            verb: "delete".into(),
            reason: String::new(),
            result: "succeeded".into(),
            error: None,
            upid: None,
            risk: Some("destructive".into()),
            backup: Some(volid.into()),
        }];
        assert_eq!(
            action_line(&event.actions[0]),
            format!("delete [destructive] VM/old on pve1: succeeded (backed up first to {volid})")
        );
        assert!(
            render(&event).lines.iter().any(|l| l.contains(volid)),
            "{:?}",
            render(&event).lines
        );
        assert_eq!(webhook(&event)["actions"][0]["backup"], volid);
        event.actions[0].backup = None;
        assert!(webhook(&event)["actions"][0]["backup"].is_null());
    }

    #[test]
    fn credentials_in_an_action_error_are_redacted_in_every_format() {
        let mut event = drift_event();
        event.kind = EventKind::Failed;
        event.actions = vec![ActionFact {
            resource: "ISO/a".into(),
            node: "pve1".into(),
            verb: "download".into(),
            reason: "missing".into(),
            result: "failed".into(),
            error: Some("fetching https://user:hunter2@files.example.org/a.iso: 404".into()),
            upid: None,
            risk: Some("safe".into()),
            backup: None,
        }];
        for payload in [
            webhook(&event),
            ntfy(&event, "t"),
            matrix(&event),
            slack(&event),
        ] {
            let text = payload.to_string();
            assert!(!text.contains("hunter2"), "{text}");
        }
        assert!(!email(&event).1.contains("hunter2"));
    }

    #[test]
    fn an_unverified_revision_is_said_as_such_with_the_commit_and_why() {
        let mut event = drift_event();
        event.kind = EventKind::Invalid;
        event.outcome = "unverified".into();
        event.findings.clear();
        event.error = Some("unverified: 0123456789ab: no signature".into());
        let r = render(&event);
        assert_eq!(r.title, "pve1: revision 0123456789ab is unverified");
        assert_eq!(r.lines[0], "unverified: 0123456789ab: no signature");
        assert!(
            r.lines[1].contains("sign the commits with an allowed key"),
            "{:?}",
            r.lines
        );
        assert_eq!(webhook(&event)["pass"]["outcome"], "unverified");
    }

    #[test]
    fn slack_blocks_keep_to_block_kit_limits() {
        let mut event = drift_event();
        event.kind = EventKind::Invalid;
        event.findings.clear();
        event.diagnostics = (0..200)
            .map(|i| format!("vm/{i}.yaml:1:1: error: spec: {}", "x".repeat(400)))
            .collect();
        let s = slack(&event);
        let blocks = s["blocks"].as_array().unwrap();
        assert!(blocks.len() <= 50);
        assert_eq!(blocks[0]["type"], "header");
        for b in blocks {
            if b["type"] == "section" {
                assert!(b["text"]["text"].as_str().unwrap().chars().count() <= 3000);
            }
        }
        let header = blocks[0]["text"]["text"].as_str().unwrap();
        assert!(header.chars().count() <= 150);
    }

    #[test]
    fn a_long_list_is_capped_and_the_rest_counted() {
        let mut event = drift_event();
        event.findings = (0..25).map(|_| event.findings[0].clone()).collect();
        let r = render(&event);
        assert_eq!(r.lines.len(), MAX_ITEMS + 1);
        assert_eq!(r.lines.last().unwrap(), "… and 5 more");
        assert_eq!(r.title, "pve1: drift found (25 findings)");
    }

    #[test]
    fn ntfy_json_names_the_topic_and_a_priority_in_range() {
        let n = ntfy(&drift_event(), "proxops");
        assert_eq!(n["topic"], "proxops");
        assert_eq!(n["priority"], 4);
        assert_eq!(n["tags"], json!(["mag", "drift-found"]));
    }
}
