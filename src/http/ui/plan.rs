//! The plan the next pass would run, at `/ui/plan`: a read-only preview (the last fetched
//! revision planned against live PVE in [`Mode::Report`], the pipeline `proxops plan` runs,
//! so PVE is only read), rendered by the same renderer as `proxops plan`
//! ([`render_human`]), and its dependency levels drawn as an inline SVG graph: one box per
//! planned action, one column per level, one arrow per dependency between two actions.

use std::fmt::Write;
use std::sync::Arc;

use proxops_core::graph::DependencyGraph;
use proxops_core::plan::{Plan, Verb, render::render_human};
use proxops_store::SharedStore;
use tokio_util::sync::CancellationToken;

use super::html::{self, Nav, commit, escape};
use super::{DiagnosticView, diagnostics_list};
use crate::agent::PreviewInputs;
use crate::error_chain::error_text;
use crate::reconcile::{self, Mode, NoHooks, ReconcileError};

/// One box of the graph: one planned action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphNode {
    /// `+`, `~` or `-`, as in the plan's text.
    pub symbol: char,
    /// The verb.
    pub verb: String,
    /// `Kind/name`.
    pub resource: String,
    /// PVE node.
    pub node: String,
}

/// The plan's levels as a graph: boxes per level and arrows (from, to) between their
/// indices in reading order (level by level).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Graph {
    /// Non-empty levels, in order: (level number, its boxes).
    pub levels: Vec<(usize, Vec<GraphNode>)>,
    /// (prerequisite, dependant), as indices into the boxes in reading order.
    pub edges: Vec<(usize, usize)>,
}

fn symbol(verb: &Verb) -> char {
    match verb {
        Verb::Download(_) | Verb::Create(_) | Verb::Clone(_) => '+',
        Verb::Delete(_) => '-',
        _ => '~',
    }
}

/// The graph of `plan`, with the dependencies of `deps`: an action depends on the actions of
/// its resource's prerequisites in earlier levels (those on its own node when there are any).
pub fn graph_of(plan: &Plan, deps: &DependencyGraph) -> Graph {
    let mut graph = Graph::default();
    // (index, level, action) in reading order.
    let mut placed = Vec::new();
    for (level, actions) in plan.levels.iter().enumerate() {
        if actions.is_empty() {
            continue;
        }
        let mut boxes = Vec::new();
        for action in actions {
            placed.push((placed.len(), level, action));
            boxes.push(GraphNode {
                symbol: symbol(&action.verb),
                verb: action.verb.name().to_owned(),
                resource: action.resource.to_string(),
                node: action.node.clone(),
            });
        }
        graph.levels.push((level, boxes));
    }
    for &(to, level, action) in &placed {
        for prerequisite in deps.prerequisites(&action.resource) {
            let earlier: Vec<_> = placed
                .iter()
                .filter(|(_, l, a)| *l < level && a.resource == *prerequisite)
                .collect();
            let same_node: Vec<_> = earlier
                .iter()
                .filter(|(_, _, a)| a.node == action.node)
                .collect();
            let from: Vec<usize> = if same_node.is_empty() {
                earlier.iter().map(|(i, _, _)| *i).collect()
            } else {
                same_node.iter().map(|(i, _, _)| *i).collect()
            };
            for from in from {
                graph.edges.push((from, to));
            }
        }
    }
    graph.edges.sort_unstable();
    graph.edges.dedup();
    graph
}

const BOX_W: usize = 220;
const BOX_H: usize = 46;
const GAP_X: usize = 56;
const GAP_Y: usize = 14;
const PAD: usize = 10;
const HEAD: usize = 26;

fn cut(text: &str, max: usize) -> String {
    if text.chars().count() > max {
        let mut s: String = text.chars().take(max - 1).collect();
        s.push('…');
        s
    } else {
        text.to_owned()
    }
}

/// The graph as an inline SVG (`<svg>`), sized to its content; an empty plan draws nothing.
pub fn svg(graph: &Graph) -> String {
    if graph.levels.is_empty() {
        return String::new();
    }
    let tallest = graph.levels.iter().map(|(_, b)| b.len()).max().unwrap_or(0);
    let width = PAD * 2 + graph.levels.len() * BOX_W + (graph.levels.len() - 1) * GAP_X;
    let height = PAD * 2 + HEAD + tallest * BOX_H + tallest.saturating_sub(1) * GAP_Y;
    let mut positions = Vec::new();
    for (column, (_, boxes)) in graph.levels.iter().enumerate() {
        for row in 0..boxes.len() {
            positions.push((
                PAD + column * (BOX_W + GAP_X),
                PAD + HEAD + row * (BOX_H + GAP_Y),
            ));
        }
    }
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg class=\"plan-graph\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" \
         aria-label=\"dependency levels of the plan\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\"><defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" \
         refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">\
         <path d=\"M0,0 L10,5 L0,10 z\" class=\"arrow-head\"/></marker></defs>"
    );
    for (column, (level, _)) in graph.levels.iter().enumerate() {
        let _ = write!(
            out,
            "<text class=\"level-label\" x=\"{}\" y=\"{}\">level {level}</text>",
            PAD + column * (BOX_W + GAP_X),
            PAD + 14
        );
    }
    for &(from, to) in &graph.edges {
        let (Some(&(fx, fy)), Some(&(tx, ty))) = (positions.get(from), positions.get(to)) else {
            continue;
        };
        let (x1, y1, x2, y2) = (fx + BOX_W, fy + BOX_H / 2, tx, ty + BOX_H / 2);
        let mid = (x1 + x2) / 2;
        let _ = write!(
            out,
            "<path class=\"plan-edge\" data-from=\"{from}\" data-to=\"{to}\" \
             d=\"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}\" marker-end=\"url(#arrow)\"/>"
        );
    }
    let boxes = graph.levels.iter().flat_map(|(_, b)| b);
    for (index, (b, &(x, y))) in boxes.zip(&positions).enumerate() {
        let kind = match b.symbol {
            '+' => "add",
            '-' => "del",
            _ => "change",
        };
        let _ = write!(
            out,
            "<g class=\"plan-node {kind}\" data-index=\"{index}\"><title>{} {} {} on {}</title>\
             <rect x=\"{x}\" y=\"{y}\" width=\"{BOX_W}\" height=\"{BOX_H}\" rx=\"6\"/>\
             <text x=\"{}\" y=\"{}\" class=\"verb\">{} {}</text>\
             <text x=\"{}\" y=\"{}\" class=\"what\">{}</text></g>",
            b.symbol,
            escape(&b.verb),
            escape(&b.resource),
            escape(&b.node),
            x + 10,
            y + 18,
            b.symbol,
            escape(&b.verb),
            x + 10,
            y + 36,
            escape(&cut(&format!("{} on {}", b.resource, b.node), 30)),
        );
    }
    out.push_str("</svg>");
    out
}

/// The plan's text with each line marked by its symbol (`+ ~ - !`), for colour.
pub fn plan_text(text: &str) -> String {
    let mut out = String::from("<pre class=\"plan\">");
    for line in text.lines() {
        let class = match line.trim_start().chars().next() {
            Some('+') => "add",
            Some('~') => "change",
            Some('-') => "del",
            Some('!') => "finding",
            _ => "plain",
        };
        let _ = writeln!(out, "<span class=\"{class}\">{}</span>", escape(line));
    }
    out.push_str("</pre>");
    out
}

/// What the preview planned.
#[derive(Debug, Clone)]
pub enum Planned {
    /// No revision was fetched yet, or none is valid: nothing would be planned.
    Nothing,
    /// The preview could not be made (PVE unreachable, a secret that does not resolve…).
    Failed(String),
    /// The plan, as `proxops plan` prints it, and its graph.
    Plan {
        /// [`render_human`]'s text.
        text: String,
        /// The dependency levels.
        graph: Graph,
        /// How many actions.
        actions: usize,
    },
}

/// What the preview found: HEAD (the last fetched revision), why it is refused if it is,
/// the revision planned (HEAD, or the one in force while HEAD is invalid) and its plan.
#[derive(Debug, Clone)]
pub struct Preview {
    /// The last fetched revision.
    pub head: Option<String>,
    /// Its diagnostics when it is invalid (or the one reason it was refused).
    pub head_refused: Option<Refusal>,
    /// The revision planned.
    pub planned_commit: Option<String>,
    /// Its plan.
    pub planned: Planned,
}

/// Why HEAD is not what a pass would plan.
#[derive(Debug, Clone)]
pub enum Refusal {
    /// Its diagnostics.
    Invalid(Vec<DiagnosticView>),
}

/// What the plan page shows.
#[derive(Debug, Clone)]
pub struct PlanPage {
    /// The agent's node label.
    pub node: String,
    /// The preview.
    pub preview: Preview,
    /// `[http] commit_url`.
    pub commit_url: Option<String>,
}

/// The plan page.
pub fn render(p: &PlanPage) -> String {
    let url = p.commit_url.as_deref();
    let preview = &p.preview;
    let mut body = String::from("<h1>Next plan</h1>");
    if let Some(Refusal::Invalid(diagnostics)) = &preview.head_refused {
        let _ = write!(
            body,
            "<p class=\"banner bad\">HEAD {} is invalid, so no pass plans from it; {}.</p>{}",
            commit(preview.head.as_deref(), url),
            match &preview.planned_commit {
                Some(sha) => format!(
                    "the next pass enforces {}, the revision in force, as planned below",
                    commit(Some(sha), url)
                ),
                None => "no valid revision is in force, so nothing would be done".to_owned(),
            },
            diagnostics_list(diagnostics)
        );
    }
    let _ = write!(
        body,
        "<p class=\"muted\">What a pass would do now: revision {} planned against live PVE. \
         This preview only reads PVE; <a href=\"/ui/plan\">plan again</a>.</p>",
        commit(preview.planned_commit.as_deref(), url)
    );
    match &preview.planned {
        Planned::Nothing => {
            if preview.head.is_none() {
                body.push_str("<p class=\"banner neutral\">No revision was fetched yet.</p>");
            }
        }
        Planned::Failed(error) => {
            let _ = write!(
                body,
                "<p class=\"banner bad\">The preview failed: {}</p>",
                escape(error)
            );
        }
        Planned::Plan {
            text,
            graph,
            actions,
        } => {
            body.push_str(&plan_text(text));
            let _ = write!(
                body,
                "<section><h2>Dependency levels ({actions} actions)</h2>"
            );
            if graph.levels.is_empty() {
                body.push_str("<p class=\"muted\">Nothing to do.</p>");
            } else {
                let _ = write!(body, "<div class=\"scroll graph\">{}</div>", svg(graph));
            }
            body.push_str("</section>");
        }
    }
    html::page("Next plan", &p.node, Nav::Plan, None, &body)
}

/// Plans `revision` against live PVE in [`Mode::Report`] with no hooks.
async fn plan_revision(
    inputs: &PreviewInputs,
    files: &std::collections::BTreeMap<String, String>,
    created: Vec<(String, u32, proxops_core::plan::Creation)>,
) -> Result<Planned, ReconcileError> {
    let mut options = inputs.plan_options.clone();
    options.created = created;
    let no_progress: crate::execute::Progress = Arc::new(|_| {});
    let pass = reconcile::reconcile_once(
        &inputs.context,
        files,
        inputs.cluster.as_deref(),
        Mode::Report,
        &options,
        &mut NoHooks,
        &no_progress,
        &CancellationToken::new(),
    )
    .await?;
    let deps = DependencyGraph::from_manifest(&pass.desired.manifest);
    Ok(Planned::Plan {
        text: render_human(&pass.plan, &pass.title()),
        actions: pass.plan.actions().count(),
        graph: graph_of(&pass.plan, &deps),
    })
}

/// Plans the last fetched revision against live PVE, writing nothing: the pipeline runs in
/// [`Mode::Report`] with no hooks, as `proxops plan` runs it. While that revision is invalid,
/// the next pass enforces `enforced` (the revision in force, read from the mirror), so that
/// is planned instead. One preview at a time (`one_at_a_time`), so reloading the page cannot
/// pile PVE reads up.
pub async fn preview(
    inputs: Option<PreviewInputs>,
    enforced: Option<String>,
    store: SharedStore,
    one_at_a_time: Arc<tokio::sync::Mutex<()>>,
) -> Preview {
    let mut preview = Preview {
        head: None,
        head_refused: None,
        planned_commit: None,
        planned: Planned::Nothing,
    };
    let Some(inputs) = inputs else {
        return preview;
    };
    let _turn = one_at_a_time.lock().await;
    let source = inputs.source.clone();
    let read = tokio::task::spawn_blocking(move || {
        let created = store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .creations(None)
            .unwrap_or_default();
        (source.last_good(), created)
    })
    .await;
    let Ok((revision, created)) = read else {
        preview.planned = Planned::Failed("reading the last fetched revision".to_owned());
        return preview;
    };
    let Some(revision) = revision else {
        return preview;
    };
    preview.head = Some(revision.commit.clone());
    preview.planned_commit = Some(revision.commit.clone());
    match plan_revision(&inputs, &revision.files, created.clone()).await {
        Ok(planned) => preview.planned = planned,
        Err(ReconcileError::Invalid(diagnostics)) => {
            preview.head_refused = Some(Refusal::Invalid(
                diagnostics.iter().map(DiagnosticView::from).collect(),
            ));
            preview.planned_commit = None;
            let Some(enforced) = enforced.filter(|c| *c != revision.commit) else {
                return preview;
            };
            let source = inputs.source.clone();
            let wanted = enforced.clone();
            let read = tokio::task::spawn_blocking(move || source.revision_at(&wanted)).await;
            match read {
                Ok(Ok(Some(in_force))) => {
                    preview.planned_commit = Some(enforced);
                    preview.planned = match plan_revision(&inputs, &in_force.files, created).await {
                        Ok(planned) => planned,
                        Err(error) => Planned::Failed(error_text(&error)),
                    };
                }
                Ok(Ok(None)) => {
                    preview.planned = Planned::Failed(format!(
                        "the revision in force {enforced} is not in the git mirror"
                    ));
                }
                Ok(Err(error)) => preview.planned = Planned::Failed(error_text(&error)),
                Err(_) => {
                    preview.planned = Planned::Failed("reading the revision in force".to_owned());
                }
            }
        }
        Err(error) => preview.planned = Planned::Failed(error_text(&error)),
    }
    preview
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(symbol: char, verb: &str, resource: &str) -> GraphNode {
        GraphNode {
            symbol,
            verb: verb.to_owned(),
            resource: resource.to_owned(),
            node: "pve1".to_owned(),
        }
    }

    fn two_levels() -> Graph {
        Graph {
            levels: vec![
                (0, vec![node('+', "download", "ISO/debian")]),
                (
                    2,
                    vec![
                        node('+', "create", "VM/<web>"),
                        node('~', "update", "VM/db"),
                    ],
                ),
            ],
            edges: vec![(0, 1)],
        }
    }

    #[test]
    fn the_svg_draws_one_box_per_action_one_column_per_level_and_one_arrow_per_dependency() {
        let svg = svg(&two_levels());
        assert_eq!(svg.matches("<g class=\"plan-node").count(), 3);
        assert_eq!(svg.matches("<path class=\"plan-edge\"").count(), 1);
        assert!(
            svg.contains(">level 0</text>") && svg.contains(">level 2</text>"),
            "{svg}"
        );
        assert!(svg.contains("data-from=\"0\" data-to=\"1\""));
        assert!(svg.contains("VM/&lt;web&gt; on pve1"), "{svg}");
        assert!(!svg.contains("<web>"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    }

    #[test]
    fn an_empty_plan_draws_no_graph() {
        assert_eq!(svg(&Graph::default()), "");
    }

    #[test]
    fn plan_lines_are_marked_by_their_symbol_and_escaped() {
        let html = plan_text(
            "repository:\n  level 0:\n  + download ISO/a on pve1\n  ~ update VM/<b> on pve1: memory: 1 → 2\n  - delete VM/c on pve1 (vmid 3)\n  ! drift VM/d on pve1: x\n",
        );
        assert!(html.contains("<span class=\"add\">  + download ISO/a on pve1</span>"));
        assert!(html.contains(
            "<span class=\"change\">  ~ update VM/&lt;b&gt; on pve1: memory: 1 → 2</span>"
        ));
        assert!(html.contains("<span class=\"del\">  - delete VM/c on pve1 (vmid 3)</span>"));
        assert!(html.contains("<span class=\"finding\">  ! drift VM/d on pve1: x</span>"));
    }

    #[test]
    fn an_invalid_revision_shows_its_diagnostics_and_the_revision_in_force() {
        let html = render(&PlanPage {
            node: "pve1".to_owned(),
            preview: Preview {
                head: Some("bbbbbbbb".to_owned()),
                head_refused: Some(Refusal::Invalid(vec![
                    crate::http::ui::testing::diagnostic(
                        "a.yaml",
                        1,
                        2,
                        "kind",
                        "unknown kind `VN`",
                    ),
                ])),
                planned_commit: Some("aaaaaaaa".to_owned()),
                planned: Planned::Plan {
                    text: "repository:\n  no changes: PVE matches the desired state\n".to_owned(),
                    graph: Graph::default(),
                    actions: 0,
                },
            },
            commit_url: None,
        });
        assert!(html.contains("is invalid, so no pass plans from it; the next pass enforces <code class=\"commit\" title=\"aaaaaaaa\">aaaaaaa</code>, the revision in force"), "{html}");
        assert!(
            html.contains("no changes: PVE matches the desired state"),
            "{html}"
        );
        assert!(
            html.contains("a.yaml:1:2: error: kind: unknown kind `VN`"),
            "{html}"
        );
    }

    #[test]
    fn a_planned_preview_shows_the_text_and_the_graph() {
        let html = render(&PlanPage {
            node: "pve1".to_owned(),
            preview: Preview {
                head: Some("bbbbbbbb".to_owned()),
                head_refused: None,
                planned_commit: Some("bbbbbbbb".to_owned()),
                planned: Planned::Plan {
                    text: "repository:\n  + create VM/a on pve1 (vmid 1)\n".to_owned(),
                    graph: two_levels(),
                    actions: 3,
                },
            },
            commit_url: None,
        });
        assert!(html.contains("<pre class=\"plan\">"));
        assert!(html.contains("<h2>Dependency levels (3 actions)</h2>"));
        assert!(html.contains("<svg class=\"plan-graph\""));
    }
}
