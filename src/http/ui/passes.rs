//! The pass timeline at `/ui/passes`, filtered by outcome, node and start time through query
//! parameters, so the filters work as a plain HTML form without JavaScript.

use std::fmt::Write;
use std::time::{Duration, SystemTime};

use proxops_store::PassOutcome;
use proxops_store::views::PassFilter;

use super::html::{self, Nav, badge, commit, escape, pass_link, time};
use crate::http::PassJson;

/// The outcomes the filter offers.
const OUTCOMES: [&str; 6] = [
    "applied",
    "no-change",
    "failed",
    "invalid",
    "unverified",
    "interrupted",
];

/// The timeline's query parameters, as the form sends them (empty means unset).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct Query {
    /// `applied`, `no-change`, `failed`, `invalid` or `interrupted`.
    #[serde(default)]
    pub outcome: Option<String>,
    /// A node label as recorded.
    #[serde(default)]
    pub node: Option<String>,
    /// `1h`, `24h`, `7d` (ago), a date `2027-01-31` or an RFC 3339 time.
    #[serde(default)]
    pub since: Option<String>,
    /// How many passes (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

fn given(value: Option<&String>) -> Option<&str> {
    value.map(|v| v.trim()).filter(|v| !v.is_empty())
}

/// A `since` value: a duration ago (`90m`, `24h`, `7d`), a date (midnight UTC) or an RFC 3339
/// time.
///
/// # Errors
/// What was wrong, naming the parameter and the accepted forms.
pub fn parse_since(text: &str, now: SystemTime) -> Result<SystemTime, String> {
    let text = text.trim();
    let ago = |n: &str, unit: u64| {
        n.parse::<u64>()
            .ok()
            .map(|n| now - Duration::from_secs(n.saturating_mul(unit)))
    };
    let relative = match text.char_indices().last() {
        Some((i, 'm')) => ago(&text[..i], 60),
        Some((i, 'h')) => ago(&text[..i], 3600),
        Some((i, 'd')) => ago(&text[..i], 86_400),
        _ => None,
    };
    if let Some(at) = relative {
        return Ok(at);
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(SystemTime::from(t));
    }
    if let Ok(date) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
        && let Some(midnight) = date.and_hms_opt(0, 0, 0)
    {
        return Ok(SystemTime::from(midnight.and_utc()));
    }
    Err(format!(
        "since: `{text}` is not a time; write a duration ago (90m, 24h, 7d), a date \
         (2027-01-31) or an RFC 3339 time (2027-01-31T12:00:00Z)"
    ))
}

/// The store filter the query asks for, or what is wrong with it.
///
/// # Errors
/// An unknown outcome or an unreadable `since`, as a located message.
pub fn filter(query: &Query, now: SystemTime) -> Result<PassFilter, String> {
    let outcome = given(query.outcome.as_ref())
        .map(|o| {
            o.parse::<PassOutcome>().map_err(|_| {
                format!(
                    "outcome: `{o}` is not an outcome; choose one of {}",
                    OUTCOMES.join(", ")
                )
            })
        })
        .transpose()?;
    let since = given(query.since.as_ref())
        .map(|s| parse_since(s, now))
        .transpose()?;
    Ok(PassFilter {
        node: given(query.node.as_ref()).map(str::to_owned),
        outcome,
        since,
    })
}

/// The table of passes, shared with the overview.
pub fn table(passes: &[PassJson], commit_url: Option<&str>) -> String {
    if passes.is_empty() {
        return "<p class=\"muted\">No passes.</p>".to_owned();
    }
    let mut out = String::from(
        "<div class=\"scroll\"><table class=\"passes\"><thead><tr><th>pass</th><th>started</th>\
         <th>node</th><th>trigger</th><th>commit</th><th>outcome</th><th title=\"succeeded / \
         failed / skipped actions\">actions</th><th>findings</th><th>took</th></tr></thead><tbody>",
    );
    for p in passes {
        let flags = [(p.desired_stale, "stale"), (p.force_pushed, "force-pushed")]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, what)| format!(" <span class=\"badge warn\">{what}</span>"))
            .collect::<String>();
        let _ = write!(
            out,
            "<tr class=\"outcome-{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}{flags}</td>\
             <td>{}</td><td class=\"num\" data-label=\"actions ok/failed/skipped\">{} / {} / {}</td>\
             <td class=\"num\" data-label=\"findings\">{}</td><td class=\"num\" data-label=\"took\">{}</td></tr>",
            escape(html::outcome(p)),
            pass_link(p.id),
            time(Some(&p.started_at)),
            escape(&p.node),
            escape(&p.trigger),
            commit(p.commit.as_deref(), commit_url),
            badge(html::outcome(p)),
            p.actions_ok,
            p.actions_failed,
            p.actions_skipped,
            p.findings,
            html::duration(Some(&p.started_at), p.ended_at.as_deref())
                .unwrap_or_else(|| "–".to_owned()),
        );
    }
    out.push_str("</tbody></table></div>");
    out
}

/// What the timeline shows.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// The agent's node label.
    pub node: String,
    /// The filter as given (echoed into the form).
    pub query: Query,
    /// What is wrong with the filter, if anything (nothing is listed then).
    pub error: Option<String>,
    /// The nodes passes were recorded under.
    pub nodes: Vec<String>,
    /// The passes matching, newest first.
    pub passes: Vec<PassJson>,
    /// `[http] commit_url`.
    pub commit_url: Option<String>,
}

/// The timeline page.
pub fn render(t: &Timeline) -> String {
    let mut body = String::from(
        "<h1>Passes</h1><form class=\"filters\" method=\"get\" action=\"/ui/passes\">\
         <label>outcome <select name=\"outcome\"><option value=\"\">any</option>",
    );
    let chosen_outcome = given(t.query.outcome.as_ref());
    for o in OUTCOMES {
        let selected = if chosen_outcome == Some(o) {
            " selected"
        } else {
            ""
        };
        let _ = write!(body, "<option{selected}>{o}</option>");
    }
    body.push_str(
        "</select></label><label>node <select name=\"node\"><option value=\"\">any</option>",
    );
    let chosen_node = given(t.query.node.as_ref());
    for n in &t.nodes {
        let selected = if chosen_node == Some(n.as_str()) {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            body,
            "<option value=\"{}\"{selected}>{}</option>",
            escape(n),
            escape(n)
        );
    }
    let _ = write!(
        body,
        "</select></label><label>since <input name=\"since\" value=\"{}\" placeholder=\"24h, 7d, 2027-01-31\" size=\"14\"></label>\
         <button type=\"submit\">Filter</button> <a href=\"/ui/passes\">clear</a></form>",
        escape(t.query.since.as_deref().unwrap_or(""))
    );
    match &t.error {
        Some(error) => {
            let _ = write!(
                body,
                "<p class=\"banner bad\" role=\"alert\">{}</p>",
                escape(error)
            );
        }
        None => {
            let _ = write!(body, "<p class=\"muted\">{} passes</p>", t.passes.len());
            body.push_str(&table(&t.passes, t.commit_url.as_deref()));
        }
    }
    html::page("Passes", &t.node, Nav::Passes, Some(10), &body)
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;
    use crate::http::ui::testing::pass;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn since_reads_durations_ago_dates_and_rfc3339_times() {
        let now = at(1_800_000_000);
        assert_eq!(parse_since("24h", now).unwrap(), at(1_800_000_000 - 86_400));
        assert_eq!(parse_since("90m", now).unwrap(), at(1_800_000_000 - 5400));
        assert_eq!(parse_since("2027-01-31", now).unwrap(), at(1_801_353_600));
        assert_eq!(
            parse_since("2027-01-31T00:00:10Z", now).unwrap(),
            at(1_801_353_610)
        );
        let err = parse_since("yesterday", now).unwrap_err();
        assert!(
            err.starts_with("since: `yesterday` is not a time; write"),
            "{err}"
        );
    }

    #[test]
    fn the_filter_names_a_bad_outcome_and_ignores_empty_fields() {
        let query = Query {
            outcome: Some("exploded".to_owned()),
            ..Query::default()
        };
        let err = filter(&query, at(0)).unwrap_err();
        assert!(
            err.starts_with("outcome: `exploded` is not an outcome; choose one of applied"),
            "{err}"
        );
        let empty = Query {
            outcome: Some(String::new()),
            node: Some(" ".to_owned()),
            since: Some(String::new()),
            limit: None,
        };
        assert_eq!(filter(&empty, at(0)).unwrap(), PassFilter::default());
    }

    #[test]
    fn the_timeline_keeps_the_chosen_filters_in_its_form_and_links_each_pass() {
        let t = Timeline {
            node: "pve1".to_owned(),
            query: Query {
                outcome: Some("invalid".to_owned()),
                node: Some("pve1".to_owned()),
                since: Some("\"><script>".to_owned()),
                limit: None,
            },
            error: None,
            nodes: vec!["pve1".to_owned(), "pve2".to_owned()],
            passes: vec![pass(7, "abcdef12", "invalid")],
            commit_url: None,
        };
        let html = render(&t);
        assert!(html.contains("<option selected>invalid</option>"), "{html}");
        assert!(
            html.contains("<option value=\"pve1\" selected>pve1</option>"),
            "{html}"
        );
        assert!(
            html.contains("value=\"&quot;&gt;&lt;script&gt;\""),
            "{html}"
        );
        assert!(html.contains("<a href=\"/ui/passes/7\">#7</a>"), "{html}");
        assert!(
            html.contains("<span class=\"badge bad\">invalid</span>"),
            "{html}"
        );
    }

    #[test]
    fn a_bad_filter_is_shown_instead_of_the_list() {
        let t = Timeline {
            node: "pve1".to_owned(),
            query: Query::default(),
            error: Some("since: `x` is not a time".to_owned()),
            nodes: Vec::new(),
            passes: vec![pass(7, "abcdef12", "invalid")],
            commit_url: None,
        };
        let html = render(&t);
        assert!(html.contains("role=\"alert\">since: `x` is not a time</p>"));
        assert!(!html.contains("/ui/passes/7"));
    }
}
