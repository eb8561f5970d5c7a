//! The overview at `/`: HEAD against the revision applied, the flags that change what a pass
//! does (stale, read-only, report mode), each node's objects by state and its open drift, and
//! the latest passes.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::diagnostics_list;
use super::html::{self, Nav, badge, commit, escape, pass_link, time};
use crate::agent::status::LastPass;
use crate::http::{DriftJson, PassJson, StatusJson};

/// What the overview shows.
#[derive(Debug, Clone)]
pub struct Overview {
    /// The node passes are recorded under.
    pub node: String,
    /// The status the API reports.
    pub status: StatusJson,
    /// The last finished pass in memory (its objects).
    pub last: Option<LastPass>,
    /// `[policy] mode = "report"`: no pass writes.
    pub report_mode: bool,
    /// Open drift findings.
    pub open_drift: Vec<DriftJson>,
    /// The latest passes, newest first.
    pub recent: Vec<PassJson>,
    /// `[http] commit_url`.
    pub commit_url: Option<String>,
}

/// The states an object can be in, in the order the overview counts them.
const STATES: [&str; 5] = ["converged", "drift", "anomalous", "failed", "skipped"];

/// The banner lines: what is in force and why.
fn banners(o: &Overview, out: &mut String) {
    let url = o.commit_url.as_deref();
    let attempted = o.status.last_attempted.as_ref();
    let applied = o.status.last_applied.as_ref();
    let head = attempted.and_then(|p| p.commit.as_deref());
    let applied_commit = applied.and_then(|p| p.commit.as_deref());
    let enforcing = match applied_commit {
        Some(sha) => format!("enforcing {}, last applied", commit(Some(sha), url)),
        None => "no revision was applied yet, so nothing is enforced".to_owned(),
    };
    match attempted {
        None => out.push_str("<p class=\"banner neutral\">No pass has run yet.</p>"),
        Some(p) if o.status.head_invalid.is_some() => {
            let invalid = o
                .status
                .head_invalid
                .as_ref()
                .map_or("", |i| i.summary.as_str());
            let _ = write!(
                out,
                "<p class=\"banner bad\" id=\"head-invalid\"><b>{}</b>. \
                 <a href=\"/ui/passes/{}\">Pass #{}</a> lists the problems; passes keep \
                 observing and enforcing the revision in force.</p>",
                escape(invalid),
                p.id,
                p.id
            );
        }
        Some(p)
            if head == applied_commit
                && p.outcome
                    .as_deref()
                    .is_some_and(|x| x == "applied" || x == "no-change") =>
        {
            let _ = write!(
                out,
                "<p class=\"banner ok\">HEAD {} is applied: PVE matched it after pass {}.</p>",
                commit(head, url),
                pass_link(p.id)
            );
        }
        Some(p) => {
            let _ = write!(
                out,
                "<p class=\"banner warn\">HEAD {} was last attempted in pass {} ({}); {enforcing}.</p>",
                commit(head, url),
                pass_link(p.id),
                escape(html::outcome(p))
            );
        }
    }
    if o.status.desired_stale {
        let _ = write!(
            out,
            "<p class=\"banner warn\" id=\"flag-stale\"><b>Stale:</b> git could not be fetched{}; \
             the last fetched revision stays in force.</p>",
            o.status
                .last_error
                .as_deref()
                .map(|e| format!(" ({})", escape(e)))
                .unwrap_or_default()
        );
    }
    if o.status.read_only {
        let breaker = o.status.write_breaker.as_ref();
        let _ = write!(
            out,
            "<p class=\"banner bad\" id=\"flag-read-only\"><b>Read-only:</b> the write circuit \
             breaker is {}{}; writes are held back.</p>",
            escape(breaker.map_or("open", |b| b.state.as_str())),
            breaker
                .and_then(|b| b.open_until.as_deref())
                .map(|t| format!(" until {}", time(Some(t))))
                .unwrap_or_default()
        );
    }
    let writes = &o.status.writes;
    if let Some(held) = &writes.held {
        let (id, title) = if writes.frozen.is_some() {
            ("flag-frozen", "Frozen")
        } else {
            ("flag-window", "Outside the write windows")
        };
        let _ = write!(
            out,
            "<p class=\"banner bad\" id=\"{id}\"><b>{title}:</b> {}; writes are held, drift is \
             still observed and reported. Next write allowed: {}.</p>",
            escape(held),
            match (&writes.next_allowed, &writes.frozen) {
                (Some(t), _) => time(Some(t)),
                (None, Some(_)) => "after <code>proxops unfreeze</code>".to_owned(),
                (None, None) => "unknown (no allow window opens again)".to_owned(),
            }
        );
    }
    super::approval::banner(&o.status.approval, out);
    if o.report_mode {
        out.push_str(
            "<p class=\"banner neutral\" id=\"flag-report\"><b>Report mode:</b> \
             <code>[policy] mode = \"report\"</code>: passes observe and record drift, and \
             write nothing.</p>",
        );
    }
}

/// The overview page.
pub fn render(o: &Overview) -> String {
    let mut body = String::from("<h1>Overview</h1>");
    banners(o, &mut body);
    if let Some(invalid) = o
        .status
        .head_invalid
        .as_ref()
        .filter(|i| !i.diagnostics.is_empty())
    {
        body.push_str("<section><h2>Why HEAD is invalid</h2>");
        body.push_str(&diagnostics_list(&invalid.diagnostics));
        body.push_str("</section>");
    }

    let url = o.commit_url.as_deref();
    body.push_str("<section class=\"cards\">");
    let attempted = o.status.last_attempted.as_ref();
    let applied = o.status.last_applied.as_ref();
    let _ = write!(
        body,
        "<div class=\"card\"><h3>HEAD</h3><p>{}</p><p>{}</p></div>\
         <div class=\"card\"><h3>Applied</h3><p>{}</p><p>{}</p></div>\
         <div class=\"card\"><h3>In force</h3><p>{}</p></div>\
         <div class=\"card\"><h3>Open drift</h3><p class=\"big\"><a href=\"/ui/drift\">{}</a></p></div>\
         <div class=\"card\"><h3>Write breaker</h3><p>{}</p></div>",
        commit(attempted.and_then(|p| p.commit.as_deref()), url),
        attempted.map_or_else(
            || "–".to_owned(),
            |p| format!(
                "{} {}",
                badge(html::outcome(p)),
                time(p.ended_at.as_deref().or(Some(&p.started_at)))
            )
        ),
        commit(applied.and_then(|p| p.commit.as_deref()), url),
        applied.map_or_else(|| "–".to_owned(), |p| time(p.ended_at.as_deref())),
        commit(o.status.enforced_commit.as_deref(), url),
        o.status.open_findings,
        badge(
            o.status
                .write_breaker
                .as_ref()
                .map_or("closed", |b| b.state.as_str())
        ),
    );
    body.push_str("</section>");

    // Per node: the objects of the last pass by state, and the open drift.
    let mut nodes: BTreeMap<&str, (BTreeMap<&str, usize>, usize, usize)> = BTreeMap::new();
    if let Some(last) = &o.last {
        for object in &last.objects {
            let entry = nodes.entry(object.node.as_str()).or_default();
            *entry.0.entry(object.state.as_str()).or_default() += 1;
            entry.1 += 1;
        }
    }
    for d in &o.open_drift {
        nodes.entry(d.node.as_str()).or_default().2 += 1;
    }
    body.push_str("<section><h2>Nodes</h2>");
    if nodes.is_empty() {
        body.push_str("<p class=\"muted\">No objects yet.</p>");
    } else {
        body.push_str(
            "<div class=\"scroll\"><table id=\"nodes\"><thead><tr><th>node</th><th class=\"num\">objects</th>",
        );
        for state in STATES {
            let _ = write!(body, "<th class=\"num\">{state}</th>");
        }
        body.push_str("<th class=\"num\">open drift</th></tr></thead><tbody>");
        for (node, (states, total, drift)) in &nodes {
            let _ = write!(
                body,
                "<tr><td><a href=\"/ui/resources#node-{}\">{}</a></td><td class=\"num\">{total}</td>",
                escape(node),
                escape(node)
            );
            for state in STATES {
                let n = states.get(state).copied().unwrap_or(0);
                let cell = if n == 0 || state == "converged" {
                    n.to_string()
                } else {
                    format!("<span class=\"badge {}\">{n}</span>", html::class_of(state))
                };
                let _ = write!(body, "<td class=\"num state-{state}\">{cell}</td>");
            }
            let _ = write!(body, "<td class=\"num\">{drift}</td></tr>");
        }
        body.push_str("</tbody></table></div>");
    }
    body.push_str("</section>");

    if let Some(last) = o.last.as_ref().filter(|l| l.head_invalid.is_none()) {
        for reason in last.abort_reason.iter().chain(&last.writes_held_back) {
            let _ = write!(body, "<p class=\"note\">{}</p>", escape(reason));
        }
    }

    body.push_str("<section><h2>Latest passes</h2>");
    body.push_str(&super::passes::table(&o.recent, url));
    body.push_str("<p><a href=\"/ui/passes\">All passes…</a></p></section>");
    html::page("Overview", &o.node, Nav::Overview, Some(10), &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::status::InvalidHead;
    use crate::http::ui::testing::{object, pass, status};

    fn overview() -> Overview {
        let mut status = status(
            Some(pass(2, "bbbbbbbb", "invalid")),
            Some(pass(1, "aaaaaaaa", "applied")),
        );
        let typo = proxops_core::diagnostic::Diagnostic::error(
            "vm/web.yaml",
            7,
            3,
            "spec.memroy",
            "unknown key `memroy`",
        );
        status.head_invalid = Some(InvalidHead::new(
            "bbbbbbbb",
            "invalid",
            &[typo],
            Some(("aaaaaaaa", true)),
        ));
        Overview {
            node: "pve1".to_owned(),
            status,
            last: Some(LastPass {
                commit: Some("bbbbbbbb".to_owned()),
                started_at: "2027-01-01T00:00:00Z".to_owned(),
                finished_at: "2027-01-01T00:00:01Z".to_owned(),
                outcome: "invalid".to_owned(),
                objects: vec![
                    object("VM", "web-<b>", "pve1", "converged"),
                    object("VM", "db", "pve2", "drift"),
                ],
                abort_reason: None,
                writes_held_back: None,
                enforced_commit: Some("aaaaaaaa".to_owned()),
                head_invalid: None,
            }),
            report_mode: false,
            open_drift: Vec::new(),
            recent: vec![
                pass(2, "bbbbbbbb", "invalid"),
                pass(1, "aaaaaaaa", "applied"),
            ],
            commit_url: Some("https://forge.example/o/r/commit/{sha}".to_owned()),
        }
    }

    #[test]
    fn an_invalid_head_says_which_revision_is_enforced_and_lists_its_diagnostics() {
        let html = render(&overview());
        assert!(html.contains("id=\"head-invalid\"><b>HEAD bbbbbbb is invalid (1 error); enforcing aaaaaaa, last applied</b>"), "{html}");
        assert!(html.contains("<h3>In force</h3><p><a class=\"commit\" href=\"https://forge.example/o/r/commit/aaaaaaaa\""), "{html}");
        assert!(html.contains("<h3>HEAD</h3><p><a class=\"commit\" href=\"https://forge.example/o/r/commit/bbbbbbbb\""), "{html}");
        assert!(
            html.contains("vm/web.yaml:7:3: error: spec.memroy: unknown key `memroy`"),
            "{html}"
        );
    }

    #[test]
    fn each_node_gets_a_row_with_its_objects_counted_by_state() {
        let html = render(&overview());
        assert!(
            html.contains(
                "<a href=\"/ui/resources#node-pve1\">pve1</a></td><td class=\"num\">1</td>"
            ),
            "{html}"
        );
        assert!(
            html.contains(
                "<a href=\"/ui/resources#node-pve2\">pve2</a></td><td class=\"num\">1</td>"
            ),
            "{html}"
        );
        assert!(
            html.contains("state-drift\"><span class=\"badge warn\">1</span>"),
            "{html}"
        );
    }

    #[test]
    fn the_stale_read_only_and_report_flags_are_shown_only_when_set() {
        let mut o = overview();
        let html = render(&o);
        assert!(
            !html.contains("flag-stale")
                && !html.contains("flag-read-only")
                && !html.contains("flag-report")
        );
        o.status.desired_stale = true;
        o.status.last_error = Some("remote <unreachable>".to_owned());
        o.status.read_only = true;
        o.report_mode = true;
        let html = render(&o);
        assert!(
            html.contains("id=\"flag-stale\"") && html.contains("remote &lt;unreachable&gt;"),
            "{html}"
        );
        assert!(
            html.contains("id=\"flag-read-only\"") && html.contains("id=\"flag-report\""),
            "{html}"
        );
    }

    #[test]
    fn an_applied_head_reads_as_in_sync() {
        let mut o = overview();
        o.status = status(
            Some(pass(3, "cccccccc", "no-change")),
            Some(pass(3, "cccccccc", "no-change")),
        );
        let html = render(&o);
        assert!(html.contains("class=\"banner ok\">HEAD"), "{html}");
        assert!(!html.contains("head-invalid"));
    }
}
