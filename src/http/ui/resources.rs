//! The resources at `/ui/resources`: per node, each object of the last pass with its state,
//! last action and error. While HEAD is invalid, these are the objects of the revision in
//! force, and the page says so.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::html::{self, Nav, badge, commit, escape};
use crate::agent::status::{LastPass, ObjectStatus};

/// What the resources page shows.
#[derive(Debug, Clone)]
pub struct Resources {
    /// The agent's node label.
    pub node: String,
    /// The last finished pass.
    pub last: Option<LastPass>,
    /// `[http] commit_url`.
    pub commit_url: Option<String>,
}

/// The resources page.
pub fn render(r: &Resources) -> String {
    let mut body = String::from("<h1>Resources</h1>");
    let Some(last) = &r.last else {
        body.push_str("<p class=\"muted\">No pass has finished yet.</p>");
        return html::page("Resources", &r.node, Nav::Resources, Some(10), &body);
    };
    let url = r.commit_url.as_deref();
    if let Some(invalid) = &last.head_invalid {
        let _ = write!(
            body,
            "<p class=\"banner bad\"><b>{}</b>; {}.</p>",
            escape(&invalid.summary),
            match &last.enforced_commit {
                Some(sha) => format!(
                    "these are the objects of {}, the revision in force",
                    commit(Some(sha), url)
                ),
                None => "no valid revision is in force".to_owned(),
            }
        );
    } else {
        let _ = write!(
            body,
            "<p class=\"muted\">As of the pass that ended {} on {}.</p>",
            html::time(Some(&last.finished_at)),
            commit(last.commit.as_deref(), url)
        );
    }
    let mut by_node: BTreeMap<&str, Vec<&ObjectStatus>> = BTreeMap::new();
    for object in &last.objects {
        by_node
            .entry(object.node.as_str())
            .or_default()
            .push(object);
    }
    if by_node.is_empty() {
        body.push_str("<p class=\"muted\">No objects.</p>");
    }
    for (node, objects) in by_node {
        let _ = write!(
            body,
            "<section id=\"node-{}\"><h2>{} <span class=\"muted\">({} objects)</span></h2>\
             <div class=\"scroll\"><table class=\"objects\"><thead><tr><th>kind</th><th>name</th>\
             <th class=\"num\">vmid</th><th>cluster</th><th>state</th><th>last action</th><th>error or finding</th></tr>\
             </thead><tbody>",
            escape(node),
            escape(node),
            objects.len()
        );
        for o in objects {
            let _ = write!(
                body,
                "<tr class=\"object\"><td>{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td class=\"{}\">{}</td></tr>",
                escape(&o.kind),
                escape(&o.name),
                o.id.map(|v| v.to_string()).unwrap_or_default(),
                escape(o.cluster.as_deref().unwrap_or("")),
                badge(&o.state),
                escape(o.last_action.as_deref().unwrap_or("")),
                // A failure in red; a finding or a skip reason is a note.
                if o.state == "failed" { "error" } else { "note" },
                escape(o.last_error.as_deref().unwrap_or("")),
            );
        }
        body.push_str("</tbody></table></div></section>");
    }
    html::page("Resources", &r.node, Nav::Resources, Some(10), &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ui::testing::object;

    fn last(outcome: &str) -> LastPass {
        LastPass {
            commit: Some("bbbbbbbb".to_owned()),
            started_at: "2027-01-01T00:00:00Z".to_owned(),
            finished_at: "2027-01-01T00:00:01Z".to_owned(),
            outcome: outcome.to_owned(),
            objects: vec![
                object("VM", "<script>x</script>", "pve1", "drift"),
                object("ISO", "debian", "pve2", "converged"),
            ],
            abort_reason: None,
            writes_held_back: None,
            enforced_commit: Some("aaaaaaaa".to_owned()),
            head_invalid: matches!(outcome, "invalid" | "unverified").then(|| {
                crate::agent::status::InvalidHead::new(
                    "bbbbbbbb",
                    "invalid",
                    &[],
                    Some(("aaaaaaaa", true)),
                )
            }),
        }
    }

    #[test]
    fn objects_are_grouped_per_node_with_their_state_and_names_escaped() {
        let html = render(&Resources {
            node: "*".to_owned(),
            last: Some(last("applied")),
            commit_url: None,
        });
        let pve1 = html.find("<section id=\"node-pve1\">").unwrap();
        let pve2 = html.find("<section id=\"node-pve2\">").unwrap();
        assert!(pve1 < pve2);
        assert!(
            html.contains("<td>VM</td><td>&lt;script&gt;x&lt;/script&gt;</td>"),
            "{html}"
        );
        assert!(html.contains("<span class=\"badge warn\">drift</span>"));
        assert!(!html.contains("<script>x"));
    }

    #[test]
    fn a_failure_reads_as_an_error_and_a_finding_as_a_note() {
        let mut l = last("failed");
        l.objects[0].last_error = Some("PVE said no".to_owned());
        l.objects[0].state = "failed".to_owned();
        l.objects[1].last_error = Some("cores differs".to_owned());
        l.objects[1].state = "anomalous".to_owned();
        let html = render(&Resources {
            node: "*".to_owned(),
            last: Some(l),
            commit_url: None,
        });
        assert!(
            html.contains("<td class=\"error\">PVE said no</td>"),
            "{html}"
        );
        assert!(
            html.contains("<td class=\"note\">cores differs</td>"),
            "{html}"
        );
    }

    #[test]
    fn while_head_is_invalid_the_objects_of_the_applied_revision_are_listed_and_named() {
        let html = render(&Resources {
            node: "pve1".to_owned(),
            last: Some(last("invalid")),
            commit_url: None,
        });
        assert!(html.contains("; these are the objects of <code class=\"commit\" title=\"aaaaaaaa\">aaaaaaa</code>, the revision in force"), "{html}");
        assert_eq!(html.matches("<tr class=\"object\">").count(), 2);
    }
}
