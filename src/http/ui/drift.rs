//! The drift history at `/ui/drift`: open findings, then the recently resolved ones with
//! when and how (`resolved_how`).

use std::fmt::Write;

use super::html::{self, Nav, badge, commit, escape, time};
use crate::http::DriftJson;

/// What the drift page shows.
#[derive(Debug, Clone)]
pub struct DriftPage {
    /// The agent's node label.
    pub node: String,
    /// Open findings.
    pub open: Vec<DriftJson>,
    /// Recently resolved findings, newest first.
    pub resolved: Vec<DriftJson>,
    /// `[http] commit_url`.
    pub commit_url: Option<String>,
}

/// How a finding was resolved: `corrected by pass 12` (linked), `fixed in PVE`, …
fn resolution(d: &DriftJson) -> String {
    let Some(how) = d.resolved_how.as_deref() else {
        return String::new();
    };
    let class = match d.resolution.as_deref() {
        Some("corrected-by-pass" | "corrected" | "fixed-in-pve") => "ok",
        _ => "neutral",
    };
    let text = format!("<span class=\"badge {class}\">{}</span>", escape(how));
    match d.resolved_pass {
        Some(id) => format!("<a href=\"/ui/passes/{id}\">{text}</a>"),
        None => text,
    }
}

fn table(rows: &[DriftJson], resolved: bool, commit_url: Option<&str>) -> String {
    let mut out = String::from(
        "<div class=\"scroll\"><table class=\"drift\"><thead><tr><th>resource</th><th>node</th>\
         <th>kind</th><th>field</th><th>git</th><th>PVE</th><th>message</th><th>first seen</th>\
         <th>last seen</th>",
    );
    if resolved {
        out.push_str("<th>resolved</th><th>how</th>");
    }
    out.push_str("</tr></thead><tbody>");
    for d in rows {
        let _ = write!(
            out,
            "<tr class=\"finding\"><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td>\
             <td data-label=\"git\"><code>{}</code></td><td data-label=\"PVE\"><code>{}</code></td><td>{}</td>\
             <td data-label=\"first seen\">{} {}</td><td data-label=\"last seen\">{}</td>",
            escape(&d.resource),
            escape(&d.node),
            badge(&d.kind),
            escape(&d.field),
            escape(&d.desired),
            escape(&d.observed),
            escape(&d.message),
            time(Some(&d.first_seen_at)),
            commit(d.first_seen_commit.as_deref(), commit_url),
            time(Some(&d.last_seen_at)),
        );
        if resolved {
            let _ = write!(
                out,
                "<td data-label=\"resolved\">{}</td><td>{}</td>",
                time(d.resolved_at.as_deref()),
                resolution(d)
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    out
}

/// The drift page.
pub fn render(d: &DriftPage) -> String {
    let url = d.commit_url.as_deref();
    let mut body = String::from("<h1>Drift</h1>");
    let _ = write!(
        body,
        "<section id=\"open\"><h2>Open ({})</h2>",
        d.open.len()
    );
    if d.open.is_empty() {
        body.push_str("<p class=\"muted\">No open drift: PVE matches what is declared.</p>");
    } else {
        body.push_str(&table(&d.open, false, url));
    }
    let _ = write!(
        body,
        "</section><section id=\"resolved\"><h2>Resolved ({})</h2>",
        d.resolved.len()
    );
    if d.resolved.is_empty() {
        body.push_str("<p class=\"muted\">Nothing resolved yet.</p>");
    } else {
        body.push_str(&table(&d.resolved, true, url));
    }
    body.push_str("</section>");
    html::page("Drift", &d.node, Nav::Drift, Some(10), &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ui::testing::drift;

    #[test]
    fn open_and_resolved_findings_are_listed_apart_with_how_they_were_resolved() {
        let html = render(&DriftPage {
            node: "pve1".to_owned(),
            open: vec![drift("VM/a", "memory", None)],
            resolved: vec![drift("VM/b", "cores", Some("corrected"))],
            commit_url: None,
        });
        let open = html.find("<section id=\"open\"><h2>Open (1)</h2>").unwrap();
        let resolved = html
            .find("<section id=\"resolved\"><h2>Resolved (1)</h2>")
            .unwrap();
        let a = html.find("<td>VM/a</td>").unwrap();
        let b = html.find("<td>VM/b</td>").unwrap();
        assert!(open < a && a < resolved && resolved < b, "{html}");
        assert!(
            html.contains(
                "<a href=\"/ui/passes/3\"><span class=\"badge ok\">corrected by pass 3</span></a>"
            ),
            "{html}"
        );
    }

    #[test]
    fn values_from_pve_are_escaped() {
        let mut finding = drift("VM/a", "description", None);
        finding.observed = "<img src=x onerror=alert(1)>".to_owned();
        let html = render(&DriftPage {
            node: "pve1".to_owned(),
            open: vec![finding],
            resolved: Vec::new(),
            commit_url: None,
        });
        assert!(
            html.contains("<code>&lt;img src=x onerror=alert(1)&gt;</code>"),
            "{html}"
        );
        assert!(html.contains("Nothing resolved yet."));
    }
}
