//! One pass at `/ui/passes/{id}`: its revision and notes, each action (verb, risk, resource, reason,
//! UPID, duration, result, error), the findings open while it ran, and the diagnostics of an
//! invalid revision (`path:line:col: error: field: message`).

use std::fmt::Write;

use proxops_store::{ActionOutcome, ActionRecord};

use super::diagnostics_list;
use super::html::{self, Nav, badge, commit, escape, time};
use crate::http::{DriftJson, PassJson};
use crate::timefmt::rfc3339;

/// One action of the pass, as shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionView {
    /// The verb (`create`, `update`, …).
    pub verb: String,
    /// `Kind/name`.
    pub resource: String,
    /// Node.
    pub node: String,
    /// Why it was planned.
    pub reason: String,
    /// PVE's task id, once PVE started one.
    pub upid: Option<String>,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339, once it ended.
    pub ended_at: Option<String>,
    /// `succeeded`, `failed`, `skipped`, or `running`.
    pub result: String,
    /// PVE's error, the skip reason, or a task's exit status other than `OK`.
    pub detail: Option<String>,
    /// `safe`, `risky` or `destructive`; `None` for actions recorded before risk levels.
    pub risk: Option<String>,
    /// The volume id of the backup taken before it (`[policy] backup_before_delete`).
    pub backup: Option<String>,
}

impl From<&ActionRecord> for ActionView {
    fn from(a: &ActionRecord) -> Self {
        let (result, detail) = match &a.outcome {
            None => ("running".to_owned(), None),
            Some(ActionOutcome::Succeeded { exitstatus }) => (
                "succeeded".to_owned(),
                Some(exitstatus.clone()).filter(|s| !s.is_empty() && s != "OK"),
            ),
            Some(ActionOutcome::Failed { error }) => ("failed".to_owned(), Some(error.clone())),
            Some(ActionOutcome::Skipped { reason }) => ("skipped".to_owned(), Some(reason.clone())),
        };
        Self {
            verb: a.verb.clone(),
            resource: a.resource.to_string(),
            node: a.node.clone(),
            reason: a.reason.clone(),
            upid: a.upid.clone(),
            started_at: rfc3339(a.started_at),
            ended_at: a.ended_at.map(rfc3339),
            result,
            detail,
            risk: a.risk.map(|r| r.name().to_owned()),
            backup: a.backup_volid.clone(),
        }
    }
}

/// What the pass page shows.
#[derive(Debug, Clone)]
pub struct PassPage {
    /// The agent's node label.
    pub node: String,
    /// The pass.
    pub pass: PassJson,
    /// Its actions, in the order they were sent.
    pub actions: Vec<ActionView>,
    /// The findings open while it ran.
    pub findings: Vec<DriftJson>,
    /// `[http] commit_url`.
    pub commit_url: Option<String>,
    /// The change it held for approval (`[policy] approve`).
    pub approval: Option<crate::agent::approval::ApprovalJson>,
}

/// The findings table (shared with the drift page's layout).
pub fn findings_table(findings: &[DriftJson]) -> String {
    if findings.is_empty() {
        return "<p class=\"muted\">No findings.</p>".to_owned();
    }
    let mut out = String::from(
        "<div class=\"scroll\"><table class=\"findings\"><thead><tr><th>resource</th><th>node</th>\
         <th>kind</th><th>field</th><th>git</th><th>PVE</th><th>message</th></tr></thead><tbody>",
    );
    for f in findings {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td><code>{}</code></td>\
             <td><code>{}</code></td><td>{}</td></tr>",
            escape(&f.resource),
            escape(&f.node),
            badge(&f.kind),
            escape(&f.field),
            escape(&f.desired),
            escape(&f.observed),
            escape(&f.message)
        );
    }
    out.push_str("</tbody></table></div>");
    out
}

/// The pass page.
pub fn render(p: &PassPage) -> String {
    let pass = &p.pass;
    let url = p.commit_url.as_deref();
    let mut body = String::new();
    let _ = write!(
        body,
        "<h1>Pass #{} {}</h1><dl class=\"facts\"><dt>commit</dt><dd>{}</dd><dt>node</dt><dd>{}</dd>\
         <dt>trigger</dt><dd>{}</dd><dt>started</dt><dd>{}</dd><dt>ended</dt><dd>{}</dd>\
         <dt>took</dt><dd>{}</dd><dt>actions</dt><dd>{} succeeded, {} failed, {} skipped</dd>\
         <dt>findings</dt><dd>{}</dd></dl>",
        pass.id,
        badge(html::outcome(pass)),
        commit(pass.commit.as_deref(), url),
        escape(&pass.node),
        escape(&pass.trigger),
        time(Some(&pass.started_at)),
        time(pass.ended_at.as_deref()),
        html::duration(Some(&pass.started_at), pass.ended_at.as_deref())
            .unwrap_or_else(|| "–".to_owned()),
        pass.actions_ok,
        pass.actions_failed,
        pass.actions_skipped,
        pass.findings,
    );
    if pass.force_pushed {
        let _ = write!(
            body,
            "<p class=\"banner warn\">The branch was force-pushed: {} does not descend from {}.</p>",
            commit(pass.commit.as_deref(), url),
            commit(pass.previous_commit.as_deref(), url)
        );
    }
    if pass.desired_stale {
        let _ = write!(
            body,
            "<p class=\"banner warn\">Git could not be fetched{}; the pass used the last fetched revision.</p>",
            pass.source_error
                .as_deref()
                .map(|e| format!(" ({})", escape(e)))
                .unwrap_or_default()
        );
    }
    if let Some(error) = &pass.error {
        let _ = write!(body, "<p class=\"banner bad\">{}</p>", escape(error));
    }
    if let Some(breaker) = &pass.write_breaker {
        let _ = write!(
            body,
            "<p class=\"note\">Write circuit breaker: {}</p>",
            badge(breaker)
        );
    }
    if pass.enforced_commit.is_some() && pass.enforced_commit != pass.commit {
        let _ = write!(
            body,
            "<p class=\"banner warn\">HEAD {} was refused; the pass enforced {} instead ({}).</p>",
            commit(pass.commit.as_deref(), url),
            commit(pass.enforced_commit.as_deref(), url),
            badge(pass.enforced_outcome.as_deref().unwrap_or("running"))
        );
    }
    if !pass.diagnostics.is_empty() {
        let _ = write!(
            body,
            "<section><h2>Diagnostics ({})</h2>{}</section>",
            pass.diagnostics.len(),
            diagnostics_list(&pass.diagnostics)
        );
    }
    super::approval::section(p.approval.as_ref(), &mut body);
    body.push_str("<section><h2>Actions</h2>");
    if p.actions.is_empty() {
        body.push_str("<p class=\"muted\">No actions.</p>");
    } else {
        body.push_str(
            "<div class=\"scroll\"><table class=\"actions\"><thead><tr><th>verb</th><th>risk</th><th>resource</th>\
             <th>node</th><th>reason</th><th>UPID</th><th>took</th><th>result</th><th>error</th>\
             </tr></thead><tbody>",
        );
        for a in &p.actions {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"upid\" data-label=\"UPID\">{}</td>\
                 <td class=\"num\" data-label=\"took\">{}</td><td>{}</td><td class=\"error\">{}</td></tr>",
                escape(&a.verb),
                a.risk.as_deref().map_or_else(|| "–".to_owned(), badge),
                escape(&a.resource),
                escape(&a.node),
                match &a.backup {
                    Some(volid) => format!(
                        "{}<br><span class=\"backup\">backup: <code>{}</code></span>",
                        escape(&a.reason),
                        escape(volid)
                    ),
                    None => escape(&a.reason),
                },
                a.upid
                    .as_deref()
                    .map(|u| format!("<code>{}</code>", escape(u)))
                    .unwrap_or_else(|| "–".to_owned()),
                html::duration(Some(&a.started_at), a.ended_at.as_deref())
                    .unwrap_or_else(|| "–".to_owned()),
                badge(&a.result),
                escape(a.detail.as_deref().unwrap_or("")),
            );
        }
        body.push_str("</tbody></table></div>");
    }
    body.push_str("</section><section><h2>Findings</h2>");
    body.push_str(&findings_table(&p.findings));
    body.push_str("</section>");
    html::page(
        &format!("Pass #{}", pass.id),
        &p.node,
        Nav::Passes,
        None,
        &body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ui::testing::{diagnostic, drift, pass};

    fn page() -> PassPage {
        let mut failed = pass(4, "abcdef12", "invalid");
        failed.enforced_commit = Some("99999999".to_owned());
        failed.enforced_outcome = Some("applied".to_owned());
        failed.diagnostics = vec![diagnostic(
            "vm/db.yaml",
            4,
            9,
            "spec.memory",
            "`12 GB` is not a size",
        )];
        PassPage {
            approval: None,
            node: "pve1".to_owned(),
            pass: failed,
            actions: vec![
                ActionView {
                    verb: "update".to_owned(),
                    resource: "VM/web-1".to_owned(),
                    node: "pve1".to_owned(),
                    reason: "memory differs".to_owned(),
                    upid: Some("UPID:pve1:0001:0002:00000003:qmconfig:101:root@pam:".to_owned()),
                    started_at: "2027-01-01T00:00:00Z".to_owned(),
                    ended_at: Some("2027-01-01T00:00:03Z".to_owned()),
                    result: "succeeded".to_owned(),
                    detail: None,
                    risk: Some("risky".to_owned()),
                    backup: None,
                },
                ActionView {
                    verb: "create".to_owned(),
                    resource: "VM/db".to_owned(),
                    node: "pve1".to_owned(),
                    reason: "absent".to_owned(),
                    upid: None,
                    started_at: "2027-01-01T00:00:03Z".to_owned(),
                    ended_at: Some("2027-01-01T00:00:04Z".to_owned()),
                    result: "failed".to_owned(),
                    detail: Some(
                        "400 Parameter verification failed: <script>alert(1)</script>".to_owned(),
                    ),
                    risk: None,
                    backup: None,
                },
            ],
            findings: vec![drift("VM/web-1", "memory", None)],
            commit_url: None,
        }
    }

    #[test]
    fn each_action_shows_its_verb_reason_upid_duration_result_and_error() {
        let html = render(&page());
        assert!(html.contains("<td>update</td><td><span class=\"badge warn\">risky</span></td><td>VM/web-1</td><td>pve1</td><td>memory differs</td>\
             <td class=\"upid\" data-label=\"UPID\"><code>UPID:pve1:0001:0002:00000003:qmconfig:101:root@pam:</code></td>\
             <td class=\"num\" data-label=\"took\">3.0 s</td><td><span class=\"badge ok\">succeeded</span></td>"), "{html}");
        assert!(html.contains("<span class=\"badge bad\">failed</span></td><td class=\"error\">400 Parameter verification failed: &lt;script&gt;alert(1)&lt;/script&gt;</td>"), "{html}");
        assert!(!html.contains("<script>alert"), "{html}");
    }

    #[test]
    fn diagnostics_and_findings_are_listed() {
        let html = render(&page());
        assert!(html.contains("<h2>Diagnostics (1)</h2>"));
        assert!(html.contains("the pass enforced <code class=\"commit\" title=\"99999999\">9999999</code> instead (<span class=\"badge ok\">applied</span>)"), "{html}");
        assert!(
            html.contains("vm/db.yaml:4:9: error: spec.memory: `12 GB` is not a size"),
            "{html}"
        );
        assert!(html.contains("<td>VM/web-1</td><td>pve1</td>"), "{html}");
    }

    #[test]
    fn a_task_that_ended_with_warnings_shows_its_exit_status() {
        let record = ActionRecord {
            id: proxops_store::ActionId(1),
            pass_id: proxops_store::PassId(1),
            resource: proxops_core::resource::ResourceId::new(
                proxops_core::resource::Kind::Vm,
                "a",
            ),
            node: "pve1".to_owned(),
            verb: "start".to_owned(),
            detail: serde_json::Value::Null,
            reason: "declared running".to_owned(),
            started_at: std::time::UNIX_EPOCH,
            upid: None,
            ended_at: None,
            outcome: Some(ActionOutcome::Succeeded {
                exitstatus: "WARNINGS: 1".to_owned(),
            }),
            risk: Some(proxops_core::plan::risk::Risk::Safe),
            backup_volid: None,
        };
        let view = ActionView::from(&record);
        assert_eq!(
            (view.result.as_str(), view.detail.as_deref()),
            ("succeeded", Some("WARNINGS: 1"))
        );
        assert_eq!(view.risk.as_deref(), Some("safe"));
        let running = ActionView::from(&ActionRecord {
            outcome: None,
            ..record
        });
        assert_eq!((running.result.as_str(), running.detail), ("running", None));
    }
}
