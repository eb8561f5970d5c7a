//! The UI's one templating rule: markup is written here and in the page modules as literal
//! text, and every value from elsewhere (PVE, the repository, the store, the request) goes
//! through [`escape`] or a helper built on it. No value is ever pasted into markup raw.

use std::fmt::Write;

use crate::http::{PassJson, now_secs};

pub use crate::html::escape;

/// A query-string value, percent-encoded (for links that carry a filter).
pub fn query_value(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// The pages, in the order of the navigation bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    /// `/`.
    Overview,
    /// `/ui/passes`.
    Passes,
    /// `/ui/resources`.
    Resources,
    /// `/ui/drift`.
    Drift,
    /// `/ui/plan`.
    Plan,
    /// `/ui/cluster`.
    Cluster,
}

const NAV: [(Nav, &str, &str); 6] = [
    (Nav::Overview, "/", "Overview"),
    (Nav::Passes, "/ui/passes", "Passes"),
    (Nav::Resources, "/ui/resources", "Resources"),
    (Nav::Drift, "/ui/drift", "Drift"),
    (Nav::Plan, "/ui/plan", "Plan"),
    (Nav::Cluster, "/ui/cluster", "Cluster"),
];

/// How often (seconds) a page's script reloads its content; `None`: never (the plan
/// preview reads PVE, so it is refreshed only on request).
pub fn page(title: &str, node: &str, current: Nav, refresh: Option<u32>, body: &str) -> String {
    let mut html = String::with_capacity(body.len() + 2048);
    let _ = write!(
        html,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"color-scheme\" content=\"light dark\">\
         <title>{} · ProxOps {}</title>\
         <link rel=\"stylesheet\" href=\"/ui/assets/style.css\">\
         <script src=\"/ui/assets/refresh.js\" defer></script></head>",
        escape(title),
        escape(node)
    );
    match refresh {
        Some(seconds) => {
            let _ = write!(html, "<body data-refresh=\"{seconds}\">");
        }
        None => html.push_str("<body>"),
    }
    html.push_str("<header class=\"top\"><a class=\"brand\" href=\"/\">ProxOps</a><nav>");
    for (nav, href, label) in NAV {
        let mark = if nav == current {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(html, "<a href=\"{href}\"{mark}>{label}</a>");
    }
    let _ = write!(
        html,
        "</nav><span class=\"agent-node\">node <b>{}</b></span></header><main id=\"content\">",
        escape(node)
    );
    html.push_str(body);
    let _ = writeln!(
        html,
        "</main><footer><span>JSON: <a href=\"/api/v1/status\">status</a> · \
         <a href=\"/api/v1/revisions\">revisions</a> · <a href=\"/api/v1/drift\">drift</a> · \
         <a href=\"/metrics\">metrics</a></span><span id=\"refresh-state\" \
         data-rendered=\"{}\"></span></footer></body></html>",
        now_secs()
    );
    html
}

/// A commit id, shortened to 7 characters as every view shows it, linked through
/// `[http] commit_url` when that is set and the id looks like one (hex only, so nothing but a
/// commit id is ever put into the URL).
pub fn commit(sha: Option<&str>, commit_url: Option<&str>) -> String {
    let Some(sha) = sha.filter(|s| !s.is_empty()) else {
        return "<span class=\"muted\">none</span>".to_owned();
    };
    let short = crate::agent::status::short(sha);
    let hex = sha.len() >= 7 && sha.chars().all(|c| c.is_ascii_hexdigit());
    match commit_url {
        Some(template) if hex => format!(
            "<a class=\"commit\" href=\"{}\" title=\"{}\"><code>{}</code></a>",
            escape(&template.replace("{sha}", sha)),
            escape(sha),
            escape(short)
        ),
        _ => format!(
            "<code class=\"commit\" title=\"{}\">{}</code>",
            escape(sha),
            escape(short)
        ),
    }
}

/// An outcome (or action result, or object state) as a coloured badge.
pub fn badge(word: &str) -> String {
    format!(
        "<span class=\"badge {}\">{}</span>",
        class_of(word),
        escape(word)
    )
}

/// The badge colour of an outcome, result or state: `ok`, `bad`, `warn` or `neutral`.
pub fn class_of(word: &str) -> &'static str {
    match word {
        "applied" | "no-change" | "converged" | "succeeded" | "corrected" | "closed" | "ok" => "ok",
        "failed" | "invalid" | "open" | "destructive" | "frozen" => "bad",
        "drift" | "anomalous" | "skipped" | "interrupted" | "half-open" | "running" | "risky"
        | "held" | "stale" | "missing" | "unreadable" => "warn",
        _ => "neutral",
    }
}

/// An RFC 3339 time, as a `<time>` element (`YYYY-MM-DD HH:MM:SS` shown, UTC).
pub fn time(rfc3339: Option<&str>) -> String {
    match rfc3339 {
        Some(t) => format!(
            "<time datetime=\"{}\">{}</time>",
            escape(t),
            escape(&t.replace('T', " ").replace('Z', " UTC"))
        ),
        None => "<span class=\"muted\">–</span>".to_owned(),
    }
}

/// The outcome of a pass, or `running` while it has none.
pub fn outcome(pass: &PassJson) -> &str {
    pass.outcome.as_deref().unwrap_or("running")
}

/// A link to a pass's page.
pub fn pass_link(id: i64) -> String {
    format!("<a href=\"/ui/passes/{id}\">#{id}</a>")
}

/// Seconds between two RFC 3339 times, as `1.2 s`, `3 min 4 s`; `None` when either is
/// missing or unreadable.
pub fn duration(from: Option<&str>, to: Option<&str>) -> Option<String> {
    let parse = |t: &str| chrono::DateTime::parse_from_rfc3339(t).ok();
    let (from, to) = (parse(from?)?, parse(to?)?);
    let millis = (to - from).num_milliseconds().max(0);
    Some(duration_text(u64::try_from(millis).unwrap_or(0)))
}

/// Milliseconds as people read them.
pub fn duration_text(millis: u64) -> String {
    if millis < 60_000 {
        let tenths = millis / 100;
        format!("{}.{} s", tenths / 10, tenths % 10)
    } else {
        let secs = millis / 1000;
        format!("{} min {} s", secs / 60, secs % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_turns_markup_and_quotes_into_text() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
    }

    #[test]
    fn a_commit_is_linked_only_when_a_template_is_set_and_the_id_is_hex() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            commit(Some(sha), Some("https://forge/o/r/commit/{sha}")),
            format!(
                "<a class=\"commit\" href=\"https://forge/o/r/commit/{sha}\" title=\"{sha}\"><code>0123456</code></a>"
            )
        );
        assert!(!commit(Some(sha), None).contains("<a "));
        let hostile = commit(Some("\"><script>"), Some("https://forge/{sha}"));
        assert!(
            !hostile.contains("<a ") && !hostile.contains("<script>"),
            "{hostile}"
        );
        assert!(commit(None, None).contains("none"));
    }

    #[test]
    fn durations_read_as_seconds_or_minutes() {
        assert_eq!(duration_text(1234), "1.2 s");
        assert_eq!(duration_text(185_000), "3 min 5 s");
        assert_eq!(
            duration(Some("2027-01-01T00:00:00Z"), Some("2027-01-01T00:00:02Z")).as_deref(),
            Some("2.0 s")
        );
        assert_eq!(duration(Some("2027-01-01T00:00:00Z"), None), None);
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(query_value("a b&c=<d>"), "a%20b%26c%3D%3Cd%3E");
    }

    #[test]
    fn the_page_shell_escapes_the_node_and_marks_the_current_page() {
        let html = page("Drift", "<pve1>", Nav::Drift, Some(10), "<p>x</p>");
        assert!(html.contains("node <b>&lt;pve1&gt;</b>"));
        assert!(html.contains("<a href=\"/ui/drift\" aria-current=\"page\">Drift</a>"));
        assert!(html.contains("data-refresh=\"10\""));
        assert!(!html.contains("<pve1>"));
    }
}
