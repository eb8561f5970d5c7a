//! The read-only status page at `/`: the last pass, its objects and open drift, as plain
//! HTML with no scripts. Every value is escaped.

use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};

use super::{HttpState, drift_from_store, now_secs, read_store};

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub(super) async fn status_page(State(state): State<HttpState>) -> Response {
    let drift = match read_store(&state.store, drift_from_store).await {
        Ok(drift) => drift,
        Err(response) => return response,
    };
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>ProxOps</title>\
         <style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:left}</style>\
         </head><body><h1>ProxOps agent</h1>",
    );
    html.push_str(&format!("<p>node <b>{}</b>", escape(&state.node_label)));
    if state.live.desired_stale() {
        html.push_str(" — <b>desired state is stale</b>: git could not be fetched");
    }
    let breaker = state.live.breaker();
    if breaker.read_only {
        html.push_str(&format!(
            " — <b>read-only</b>: write circuit breaker {}{}",
            escape(&breaker.state),
            breaker
                .open_until
                .map(|t| format!(" until {}", escape(&t)))
                .unwrap_or_default()
        ));
    }
    html.push_str(&format!("<!-- rendered at {} --></p>", now_secs()));
    if let Some(invalid) = state.live.head_invalid() {
        let lines: Vec<String> = invalid
            .diagnostics
            .iter()
            .map(|d| format!("<li><code>{}</code></li>", escape(&d.rendered)))
            .collect();
        html.push_str(&format!(
            "<p><b>{}</b></p><ul>{}</ul>",
            escape(&invalid.summary),
            lines.concat()
        ));
    }
    match state.live.last() {
        Some(last) => {
            html.push_str(&format!(
                "<h2>Last pass: {}</h2><p>commit {} · {} → {}</p>",
                escape(&last.outcome),
                escape(last.commit.as_deref().unwrap_or("-")),
                escape(&last.started_at),
                escape(&last.finished_at)
            ));
            for reason in last.abort_reason.iter().chain(&last.writes_held_back) {
                html.push_str(&format!("<p>{}</p>", escape(reason)));
            }
            html.push_str("<table><tr><th>kind</th><th>name</th><th>node</th><th>state</th><th>last action</th><th>error</th></tr>");
            for o in &last.objects {
                html.push_str(&format!(
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    escape(&o.kind),
                    escape(&o.name),
                    escape(&o.node),
                    escape(&o.state),
                    escape(o.last_action.as_deref().unwrap_or("")),
                    escape(o.last_error.as_deref().unwrap_or(""))
                ));
            }
            html.push_str("</table>");
        }
        None => html.push_str("<p>No pass has finished yet.</p>"),
    }
    html.push_str(&format!(
        "<h2>Open drift ({})</h2><table>",
        drift.open.len()
    ));
    for d in &drift.open {
        html.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>since {}</td></tr>",
            escape(&d.resource),
            escape(&d.node),
            escape(&d.kind),
            escape(&d.message),
            escape(&d.first_seen_at)
        ));
    }
    html.push_str("</table><p><a href=\"/api/v1/status\">/api/v1/status</a> · <a href=\"/api/v1/revisions\">/api/v1/revisions</a> · <a href=\"/api/v1/drift\">/api/v1/drift</a> · <a href=\"/metrics\">/metrics</a></p></body></html>");
    Html(html).into_response()
}
