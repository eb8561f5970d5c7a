//! The web UI: server-rendered HTML pages behind the same access guard as the status API
//! ([`crate::http::access`]), readable without JavaScript, with its stylesheet and a small
//! refresh script embedded in the binary (no CDN, no web fonts: it works offline).
//!
//! - `/`: the overview ([`overview`]);
//! - `/ui/passes`: the pass timeline with its filters ([`passes`]);
//! - `/ui/passes/{id}`: one pass ([`pass`]);
//! - `/ui/resources`: the objects per node ([`resources`]);
//! - `/ui/drift`: open and resolved drift ([`drift`]);
//! - `/ui/plan`: the plan the next pass would run, read-only, and its levels as SVG ([`plan`]);
//! - `/ui/cluster`: every node of the cluster and the commit it applied ([`cluster`]);
//! - `/ui/assets/*`: the stylesheet and the script.
//!
//! Each page is a pure function from its data to HTML; [`html`] holds the one escaping rule.
//! Every page answer carries a Content-Security-Policy that allows only this origin's
//! stylesheet and script, so even a value that escaped escaping could not run.

pub mod approval;
pub mod cluster;
pub mod drift;
pub mod html;
pub mod overview;
pub mod pass;
pub mod passes;
pub mod plan;
pub mod resources;

use std::fmt::Write;
use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use proxops_store::PassId;

use super::{
    DriftJson, HttpState, PassJson, StatusJson, drift_from_store, read_store, status_from_store,
};

const STYLE: &str = include_str!("assets/style.css");
const SCRIPT: &str = include_str!("assets/refresh.js");

/// Only this origin's stylesheet and script; no inline script, no frames, no other origin.
const CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub use crate::agent::status::DiagnosticView;

/// The diagnostics as a list, one `path:line:col: …` line each, with its help below.
pub fn diagnostics_list(diagnostics: &[DiagnosticView]) -> String {
    let mut out = String::from("<ul class=\"diagnostics\">");
    for d in diagnostics {
        let _ = write!(
            out,
            "<li class=\"{}\"><code>{}</code>",
            if d.severity == "error" {
                "error"
            } else {
                "warning"
            },
            html::escape(&d.rendered)
        );
        if let Some(help) = &d.help {
            let _ = write!(
                out,
                "<br><span class=\"help\">help: {}</span>",
                html::escape(help)
            );
        }
        out.push_str("</li>");
    }
    out.push_str("</ul>");
    out
}

/// What the UI's handlers read.
#[derive(Clone)]
struct Ui {
    http: HttpState,
    /// One plan preview at a time.
    preview_turn: Arc<tokio::sync::Mutex<()>>,
}

/// The UI's routes, with `state`; merged into the status API's router (behind its guard).
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/", get(overview_page))
        .route("/ui", get(overview_page))
        .route("/ui/passes", get(passes_page))
        .route("/ui/passes/{id}", get(pass_page))
        .route("/ui/resources", get(resources_page))
        .route("/ui/drift", get(drift_page))
        .route("/ui/plan", get(plan_page))
        .route("/ui/cluster", get(cluster_page))
        .route("/ui/assets/style.css", get(style))
        .route("/ui/assets/refresh.js", get(script))
        .with_state(Ui {
            http: state,
            preview_turn: Arc::new(tokio::sync::Mutex::new(())),
        })
}

fn page_response(status: StatusCode, html: String) -> Response {
    let mut response = (status, Html(html)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "max-age=300"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// The status as `/api/v1/status` reports it: the store's, with the live flags.
fn with_live(mut status: StatusJson, state: &HttpState) -> StatusJson {
    status.desired_stale = state.live.desired_stale();
    status.last_error = state.live.last_error();
    let breaker = state.live.breaker();
    status.read_only = breaker.read_only;
    status.write_breaker = Some(breaker);
    status.rollout = state.live.rollout();
    status.writes = status.writes.with_rollout(status.rollout.as_ref());
    status
}

fn report_mode(state: &HttpState) -> bool {
    state
        .preview
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .is_some_and(|p| p.context.mode == crate::reconcile::Mode::Report)
}

async fn overview_page(State(ui): State<Ui>) -> Response {
    let state = &ui.http;
    let node = state.node_label.clone();
    let windows = state.live.windows();
    let ha_held = state.live.ha_held();
    let read = read_store(&state.store, move |s| {
        let mut status = crate::http::status_from_store_with(s, &node, &windows)?;
        status.writes = crate::agent::window::with_hold(status.writes, ha_held.as_ref());
        let open: Vec<DriftJson> = s.open_findings(None)?.iter().map(DriftJson::from).collect();
        let recent: Vec<PassJson> = s
            .recent_passes(Some(&node), 8)?
            .iter()
            .map(PassJson::from)
            .collect();
        Ok((status, open, recent))
    })
    .await;
    let (status, open_drift, recent) = match read {
        Ok(values) => values,
        Err(response) => return response,
    };
    let data = overview::Overview {
        node: state.node_label.clone(),
        status: with_live(status, state),
        last: state.live.last(),
        report_mode: report_mode(state),
        open_drift,
        recent,
        commit_url: state.commit_url.clone(),
    };
    page_response(StatusCode::OK, overview::render(&data))
}

async fn cluster_page(State(ui): State<Ui>) -> Response {
    let state = &ui.http;
    let data = cluster::ClusterPage {
        node: state.node_label.clone(),
        view: crate::http::cluster_view(state).await,
        commit_url: state.commit_url.clone(),
    };
    page_response(StatusCode::OK, cluster::render(&data))
}

async fn passes_page(State(ui): State<Ui>, Query(query): Query<passes::Query>) -> Response {
    let state = &ui.http;
    let filter = passes::filter(&query, SystemTime::now());
    let limit = query.limit.unwrap_or(100).clamp(1, 1000);
    let wanted = filter.clone().ok();
    let read = read_store(&state.store, move |s| {
        let nodes = s.pass_nodes()?;
        let passes = match wanted {
            Some(filter) => s
                .passes_matching(&filter, limit)?
                .iter()
                .map(PassJson::from)
                .collect(),
            None => Vec::new(),
        };
        Ok((nodes, passes))
    })
    .await;
    let (nodes, passes) = match read {
        Ok(values) => values,
        Err(response) => return response,
    };
    let status = if filter.is_err() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    let data = passes::Timeline {
        node: state.node_label.clone(),
        query,
        error: filter.err(),
        nodes,
        passes,
        commit_url: state.commit_url.clone(),
    };
    page_response(status, passes::render(&data))
}

async fn pass_page(State(ui): State<Ui>, Path(id): Path<String>) -> Response {
    let state = &ui.http;
    let Ok(id) = id.parse::<i64>() else {
        return not_found(state, &format!("`{id}` is not a pass number"));
    };
    let read = read_store(&state.store, move |s| {
        let Some(summary) = s.pass(PassId(id))? else {
            return Ok(None);
        };
        let actions = s
            .actions_of(PassId(id))?
            .iter()
            .map(pass::ActionView::from)
            .collect();
        let findings = s
            .findings_seen_between(
                summary.started_at,
                summary.ended_at.unwrap_or_else(SystemTime::now),
            )?
            .iter()
            .map(DriftJson::from)
            .collect();
        let approval = s
            .approval_of_pass(summary.id)?
            .as_ref()
            .map(crate::agent::approval::ApprovalJson::from);
        Ok(Some((
            PassJson::from(&summary),
            actions,
            findings,
            approval,
        )))
    })
    .await;
    match read {
        Ok(Some((pass, actions, findings, approval))) => {
            let data = pass::PassPage {
                node: state.node_label.clone(),
                pass,
                actions,
                findings,
                commit_url: state.commit_url.clone(),
                approval,
            };
            page_response(StatusCode::OK, pass::render(&data))
        }
        Ok(None) => not_found(state, &format!("there is no pass #{id}")),
        Err(response) => response,
    }
}

fn not_found(state: &HttpState, what: &str) -> Response {
    let body = format!(
        "<h1>Not found</h1><p>{}; see <a href=\"/ui/passes\">the passes</a>.</p>",
        html::escape(what)
    );
    page_response(
        StatusCode::NOT_FOUND,
        html::page(
            "Not found",
            &state.node_label,
            html::Nav::Passes,
            None,
            &body,
        ),
    )
}

async fn resources_page(State(ui): State<Ui>) -> Response {
    let state = &ui.http;
    let data = resources::Resources {
        node: state.node_label.clone(),
        last: state.live.last(),
        commit_url: state.commit_url.clone(),
    };
    page_response(StatusCode::OK, resources::render(&data))
}

async fn drift_page(State(ui): State<Ui>) -> Response {
    let state = &ui.http;
    let drift = match read_store(&state.store, drift_from_store).await {
        Ok(drift) => drift,
        Err(response) => return response,
    };
    let data = drift::DriftPage {
        node: state.node_label.clone(),
        open: drift.open,
        resolved: drift.resolved,
        commit_url: state.commit_url.clone(),
    };
    page_response(StatusCode::OK, drift::render(&data))
}

async fn plan_page(State(ui): State<Ui>) -> Response {
    let state = &ui.http;
    let inputs = state
        .preview
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let node = state.node_label.clone();
    let enforced = match read_store(&state.store, move |s| status_from_store(s, &node)).await {
        Ok(status) => status.enforced_commit,
        Err(response) => return response,
    };
    let preview = plan::preview(
        inputs,
        enforced,
        state.store.clone(),
        ui.preview_turn.clone(),
    )
    .await;
    let data = plan::PlanPage {
        node: state.node_label.clone(),
        preview,
        commit_url: state.commit_url.clone(),
    };
    page_response(StatusCode::OK, plan::render(&data))
}

/// Fixed data for the pages' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::agent::status::ObjectStatus;

    pub(crate) fn pass(id: i64, commit: &str, outcome: &str) -> PassJson {
        PassJson {
            id,
            node: "pve1".to_owned(),
            commit: Some(commit.to_owned()),
            trigger: "poll".to_owned(),
            started_at: "2027-01-01T00:00:00Z".to_owned(),
            ended_at: Some("2027-01-01T00:00:02Z".to_owned()),
            outcome: Some(outcome.to_owned()),
            actions_ok: 1,
            actions_failed: 0,
            actions_skipped: 0,
            findings: 0,
            previous_commit: None,
            force_pushed: false,
            desired_stale: false,
            source_error: None,
            error: None,
            write_breaker: None,
            enforced_commit: Some(commit.to_owned())
                .filter(|_| !matches!(outcome, "invalid" | "unverified")),
            enforced_outcome: None,
            diagnostics: Vec::new(),
        }
    }

    pub(crate) fn status(attempted: Option<PassJson>, applied: Option<PassJson>) -> StatusJson {
        let applied_commit = applied.as_ref().and_then(|p| p.commit.clone());
        StatusJson {
            node: "pve1".to_owned(),
            process_start: None,
            desired_stale: false,
            last_error: None,
            last_applied: applied,
            last_attempted: attempted,
            open_findings: 0,
            read_only: false,
            write_breaker: None,
            last_force_push: None,
            enforced_commit: applied_commit,
            head_invalid: None,
            writes: crate::agent::window::WritesView {
                allowed: true,
                ..Default::default()
            },
            approval: crate::agent::approval::ApprovalView::default(),
            pmxcfs: None,
            rollout: None,
        }
    }

    pub(crate) fn object(kind: &str, name: &str, node: &str, state: &str) -> ObjectStatus {
        ObjectStatus {
            kind: kind.to_owned(),
            name: name.to_owned(),
            cluster: None,
            node: node.to_owned(),
            id: Some(101),
            state: state.to_owned(),
            last_action: None,
            last_error: None,
        }
    }

    pub(crate) fn diagnostic(
        path: &str,
        line: usize,
        column: usize,
        field: &str,
        message: &str,
    ) -> DiagnosticView {
        let core = proxops_core::diagnostic::Diagnostic::error(path, line, column, field, message);
        DiagnosticView::from(&core)
    }

    pub(crate) fn drift(resource: &str, field: &str, resolved_how: Option<&str>) -> DriftJson {
        DriftJson {
            node: "pve1".to_owned(),
            resource: resource.to_owned(),
            kind: "drift".to_owned(),
            field: field.to_owned(),
            desired: "512".to_owned(),
            observed: "1024".to_owned(),
            message: format!("{field} differs"),
            first_seen_commit: Some("abcdef12".to_owned()),
            first_seen_at: "2027-01-01T00:00:00Z".to_owned(),
            last_seen_at: "2027-01-01T00:01:00Z".to_owned(),
            resolved_at: resolved_how.map(|_| "2027-01-01T00:02:00Z".to_owned()),
            resolved_how: resolved_how.map(|how| format!("{how} by pass 3")),
            resolution: resolved_how.map(|how| format!("{how}-by-pass")),
            last_seen_commit: Some("abcdef12".to_owned()),
            first_seen_pass: Some(1),
            last_seen_pass: Some(2),
            resolved_pass: resolved_how.map(|_| 3),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnostics_are_listed_as_validate_prints_them_with_their_help_escaped() {
        let mut with_help = proxops_core::diagnostic::Diagnostic::error(
            "vm/web.yaml",
            3,
            5,
            "spec.memroy",
            "unknown key `memroy`",
        );
        with_help.help = Some("did you mean `memory`?".to_owned());
        let markup = proxops_core::diagnostic::Diagnostic::error("a.yaml", 1, 1, "", "<not yaml>");
        let html = diagnostics_list(&[
            DiagnosticView::from(&with_help),
            DiagnosticView::from(&markup),
        ]);
        assert!(
            html.contains("<code>vm/web.yaml:3:5: error: spec.memroy: unknown key `memroy`</code>"),
            "{html}"
        );
        assert!(
            html.contains("<br><span class=\"help\">help: did you mean `memory`?</span>"),
            "{html}"
        );
        assert!(
            html.contains("a.yaml:1:1: error: &lt;not yaml&gt;"),
            "{html}"
        );
    }

    mod served {
        use std::time::{Duration, UNIX_EPOCH};

        use axum::body::{Body, to_bytes};
        use axum::extract::Request;
        use base64::Engine as _;
        use proxops_store::{PassCounts, PassOutcome, Store, Trigger};
        use secrecy::SecretString;
        use tower::ServiceExt as _;

        use super::*;
        use crate::http::access::Access;

        fn state(store: Store) -> HttpState {
            let pve = proxops_pve::PveClient::new(proxops_pve::ClientConfig {
                base_url: "https://pve1.example.invalid:8006".into(),
                token_id: "proxops@pve!agent".into(),
                token_secret: SecretString::from("not-used"),
                trust: proxops_pve::Trust::Insecure,
                timeout: proxops_pve::Timeouts::default(),
                retry: proxops_pve::RetryPolicy::default(),
            })
            .unwrap();
            HttpState {
                live: Arc::new(crate::agent::status::LiveStatus::default()),
                store: Arc::new(std::sync::Mutex::new(store)),
                metrics: Arc::new(crate::metrics::Metrics::default()),
                pve,
                webhook_metrics: None,
                node_label: "pve1".to_owned(),
                preview: Arc::new(std::sync::Mutex::new(None)),
                commit_url: None,
                publisher: Arc::default(),
            }
        }

        async fn get(app: Router, path: &str, auth: Option<&str>) -> (StatusCode, String, String) {
            let mut request = Request::get(path).header("host", "127.0.0.1:9494");
            if let Some(token) = auth {
                let basic =
                    base64::engine::general_purpose::STANDARD.encode(format!("anyone:{token}"));
                request = request.header("authorization", format!("Basic {basic}"));
            }
            let response = app
                .oneshot(request.body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = response.status();
            let csp = response
                .headers()
                .get(header::CONTENT_SECURITY_POLICY)
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let body = to_bytes(response.into_body(), 1 << 22).await.unwrap();
            (status, String::from_utf8_lossy(&body).into_owned(), csp)
        }

        fn app(store: Store, token: Option<&str>) -> Router {
            let access = Access {
                token: token.map(|t| SecretString::from(t.to_owned())),
                allowed_hosts: vec!["127.0.0.1".into()],
                redactions: Vec::new(),
            };
            crate::http::router(state(store), None, access)
        }

        #[tokio::test]
        async fn with_a_token_every_page_needs_it_as_the_basic_password_and_carries_the_csp() {
            for path in [
                "/",
                "/ui/passes",
                "/ui/passes/1",
                "/ui/resources",
                "/ui/drift",
                "/ui/plan",
                "/ui/assets/style.css",
            ] {
                let (status, body, _) =
                    get(app(Store::memory().unwrap(), Some("s3cret")), path, None).await;
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {body}");
                let (status, _, _) = get(
                    app(Store::memory().unwrap(), Some("s3cret")),
                    path,
                    Some("guess"),
                )
                .await;
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
            }
            let (status, body, csp) = get(
                app(Store::memory().unwrap(), Some("s3cret")),
                "/",
                Some("s3cret"),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert!(
                body.contains("<h1>Overview</h1>") && body.contains("No pass has run yet."),
                "{body}"
            );
            assert!(
                csp.starts_with("default-src 'none'; style-src 'self'; script-src 'self'"),
                "{csp}"
            );
            assert!(!body.contains("s3cret"));
        }

        #[tokio::test]
        async fn a_recorded_invalid_pass_is_shown_with_its_diagnostics_and_an_unknown_one_is_404() {
            let mut store = Store::memory().unwrap();
            let at = |s: u64| UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s);
            let id = store
                .begin_pass(
                    "pve1",
                    Some("0123456789abcdef0123456789abcdef01234567"),
                    Trigger::Poll,
                    at(0),
                )
                .unwrap();
            let typo = proxops_core::diagnostic::Diagnostic::error(
                "vm/<b>.yaml",
                4,
                3,
                "spec.memroy",
                "unknown key `memroy`",
            );
            store.record_invalid(id, &[typo]).unwrap();
            store
                .finish_pass(id, PassOutcome::Invalid, PassCounts::default(), at(1))
                .unwrap();
            let (status, body, _) =
                get(app(store, None), &format!("/ui/passes/{}", id.0), None).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert!(
                body.contains(
                    "<code>vm/&lt;b&gt;.yaml:4:3: error: spec.memroy: unknown key `memroy`</code>"
                ),
                "{body}"
            );
            let (status, body, _) =
                get(app(Store::memory().unwrap(), None), "/ui/passes/77", None).await;
            assert_eq!(status, StatusCode::NOT_FOUND);
            assert!(body.contains("there is no pass #77"), "{body}");
            let (status, body, _) = get(
                app(Store::memory().unwrap(), None),
                "/ui/passes/%3Cx%3E",
                None,
            )
            .await;
            assert_eq!(status, StatusCode::NOT_FOUND);
            assert!(body.contains("`&lt;x&gt;` is not a pass number"), "{body}");
        }

        #[tokio::test]
        async fn the_timeline_refuses_a_bad_filter_with_400_and_says_why() {
            let (status, body, _) = get(
                app(Store::memory().unwrap(), None),
                "/ui/passes?outcome=exploded",
                None,
            )
            .await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert!(
                body.contains("outcome: `exploded` is not an outcome"),
                "{body}"
            );
        }

        #[tokio::test]
        async fn without_a_configuration_the_plan_page_says_nothing_was_fetched() {
            let (status, body, _) =
                get(app(Store::memory().unwrap(), None), "/ui/plan", None).await;
            assert_eq!(status, StatusCode::OK);
            assert!(body.contains("No revision was fetched yet."), "{body}");
        }
    }

    #[test]
    fn the_embedded_assets_need_nothing_from_another_origin() {
        for asset in [STYLE, SCRIPT] {
            assert!(
                !asset.contains("http://")
                    && !asset.contains("https://")
                    && !asset.contains("@import")
            );
        }
        assert!(STYLE.contains("prefers-color-scheme: dark"));
        assert!(STYLE.contains("@media (max-width"));
    }
}
