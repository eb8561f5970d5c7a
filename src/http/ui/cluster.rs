//! `/ui/cluster`: every node of the cluster with the commit its agent applied, its last
//! outcome and how old its heartbeat is ([`crate::cluster::view`]). Says `unknown` for the
//! whole cluster when the status files cannot be trusted (no quorum), and how to turn
//! cluster mode on when `[pmxcfs]` is absent.

use std::fmt::Write;

use super::html::{self, Nav, escape};
use crate::cluster::view::ClusterView;

/// What the page shows.
#[derive(Debug)]
pub struct ClusterPage {
    /// The node this agent speaks for.
    pub node: String,
    /// The view; `None` when cluster mode is off.
    pub view: Option<ClusterView>,
    /// `[http] commit_url`.
    pub commit_url: Option<String>,
}

/// The page.
pub fn render(p: &ClusterPage) -> String {
    let mut body = String::from("<h1>Cluster</h1>");
    let Some(view) = &p.view else {
        body.push_str(
            "<p class=\"muted\">Cluster mode is off: add a <code>[pmxcfs]</code> table to \
             agent.toml on every node, and each agent publishes its status under \
             <code>/etc/pve/proxops</code> for the others to show here.</p>",
        );
        return html::page("Cluster", &p.node, Nav::Cluster, Some(10), &body);
    };
    let _ = write!(
        body,
        "<p id=\"cluster-state\">Cluster view {}",
        html::badge(&view.state)
    );
    if let Some(reason) = &view.reason {
        let _ = write!(
            body,
            " <span class=\"reason\">{}: the files show what this node last received; this \
             agent keeps serving its own node</span>",
            escape(reason)
        );
    }
    body.push_str("</p>");
    if let Some(error) = &view.members_error {
        let _ = write!(
            body,
            "<p class=\"muted\">PVE's member list is not shown: {}</p>",
            escape(error)
        );
    }
    body.push_str(
        "<table id=\"nodes\"><thead><tr><th>Node</th><th>State</th><th>Applied</th>\
         <th>Attempted</th><th>Outcome</th><th>Heartbeat</th><th>Findings</th>\
         <th>Writes</th><th>Agent</th></tr></thead><tbody>",
    );
    let url = p.commit_url.as_deref();
    for n in &view.nodes {
        let status = n.status.as_ref();
        let age = n
            .heartbeat_age_secs
            .map_or_else(|| "–".to_owned(), |a| format!("{a} s ago"));
        let mut writes = Vec::new();
        if let Some(s) = status {
            if s.frozen {
                writes.push("frozen".to_owned());
            }
            if s.read_only {
                writes.push("read-only (write breaker)".to_owned());
            }
            if s.stale {
                writes.push("git stale".to_owned());
            }
            if let Some(held) = &s.held {
                writes.push(format!("held: {held}"));
            }
        }
        let _ = write!(
            body,
            "<tr data-node=\"{node}\"><td>{node}{member}</td><td>{state}</td><td>{applied}</td>\
             <td>{attempted}</td><td>{outcome}</td><td>{age}</td><td>{findings}</td>\
             <td>{writes}</td><td>{version}</td></tr>",
            node = escape(&n.node),
            member = if n.member {
                ""
            } else {
                " <span class=\"muted\">(not in /cluster/status)</span>"
            },
            state = html::badge(&n.state),
            applied = html::commit(status.and_then(|s| s.applied_revision.as_deref()), url),
            attempted = html::commit(status.and_then(|s| s.attempted_revision.as_deref()), url),
            outcome = status
                .and_then(|s| s.outcome.as_deref())
                .map_or_else(|| "–".to_owned(), html::badge),
            age = escape(&age),
            findings = status.map_or(0, |s| s.open_findings),
            writes = escape(&writes.join("; ")),
            version = escape(status.map_or("", |s| s.agent_version.as_str())),
        );
        if let Some(error) = &n.error {
            let _ = write!(
                body,
                "<tr class=\"error\"><td colspan=\"9\">{}</td></tr>",
                escape(error)
            );
        }
    }
    body.push_str("</tbody></table>");
    html::page("Cluster", &p.node, Nav::Cluster, Some(10), &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::status_file::NodeStatus;
    use crate::cluster::view::NodeView;

    fn node(name: &str, state: &str, applied: Option<&str>) -> NodeView {
        NodeView {
            node: name.to_owned(),
            state: state.to_owned(),
            member: true,
            online: Some(true),
            heartbeat_age_secs: applied.map(|_| 2),
            status: applied.map(|c| NodeStatus {
                node: name.to_owned(),
                applied_revision: Some(c.to_owned()),
                outcome: Some("applied".to_owned()),
                held: Some("<script>alert(1)</script>".to_owned()),
                ..NodeStatus::default()
            }),
            error: None,
        }
    }

    #[test]
    fn every_node_is_a_row_with_its_commit_and_values_are_escaped() {
        let html = render(&ClusterPage {
            node: "pve1".into(),
            view: Some(ClusterView {
                state: "ok".into(),
                nodes: vec![
                    node("pve1", "ok", Some("0123456789abcdef")),
                    node("pve3", "missing", None),
                ],
                ..ClusterView::default()
            }),
            commit_url: None,
        });
        assert!(html.contains("<tr data-node=\"pve1\">"), "{html}");
        assert!(html.contains("<code class=\"commit\" title=\"0123456789abcdef\">0123456</code>"));
        assert!(html.contains("<tr data-node=\"pve3\">"));
        assert!(html.contains("&lt;script&gt;"));
        assert!(!html.contains("<script>alert"));
    }

    #[test]
    fn an_unknown_view_says_why_and_cluster_mode_off_says_how_to_turn_it_on() {
        let html = render(&ClusterPage {
            node: "pve1".into(),
            view: Some(ClusterView {
                state: "unknown".into(),
                reason: Some("/etc/pve is mounted read-only".into()),
                ..ClusterView::default()
            }),
            commit_url: None,
        });
        assert!(
            html.contains("<span class=\"badge neutral\">unknown</span>"),
            "{html}"
        );
        assert!(html.contains("/etc/pve is mounted read-only"));
        let off = render(&ClusterPage {
            node: "pve1".into(),
            view: None,
            commit_url: None,
        });
        assert!(off.contains("Cluster mode is off"));
    }
}
