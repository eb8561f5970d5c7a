//! Secrets never leak (issue 8): the PVE token secret and the webhook secret, both distinctive
//! canaries, must appear nowhere the agent writes or answers: its stdout and stderr at
//! `RUST_LOG=trace` (every crate's traces: hyper, reqwest, rustls, gix, axum), the error of a
//! refused token, the HTTP API (`/`, `/healthz`, `/readyz`, `/status`, `/api/v1/*`, `/metrics`,
//! webhook answers), the CLI views, and the SQLite database: its raw files (WAL included) and
//! every text or blob value of every table.

use std::path::Path;
use std::time::Duration;

use crate::one_iso::{Setup, TrustLine, push_body};
use crate::support::agent::{AgentProcess, database_values};

const TOKEN: &str = "leak-canary-pve-token-6f1d2a";
const HOOK: &str = "leak-canary-webhook-93be47";
const WRONG_TOKEN: &str = "leak-canary-wrong-token-c0ffee";

fn assert_clean(what: &str, text: &str) {
    for secret in [TOKEN, HOOK, WRONG_TOKEN] {
        assert!(
            !text.contains(secret),
            "{what} contains the secret {secret}"
        );
    }
}

/// Every path the agent's HTTP listener serves for reading, and one it does not.
const PATHS: &[&str] = &[
    "/",
    "/healthz",
    "/readyz",
    "/status",
    "/metrics",
    "/api/v1/status",
    "/api/v1/revisions",
    "/api/v1/revisions?limit=1000",
    "/api/v1/drift",
    "/api/v1/passes/1",
    "/api/v1/nothing-here",
    "/ui/passes",
    "/ui/passes/1",
    "/ui/resources",
    "/ui/drift",
    "/ui/plan",
];

/// Signed, unsigned, wrongly signed and signed-with-the-wrong-secret deliveries; their answers.
async fn deliveries(agent: &AgentProcess) -> Vec<String> {
    let body = push_body();
    let right = agent.github_signature(body.as_bytes());
    let mut answers = Vec::new();
    for signature in [Some(right.as_str()), None, Some("sha256=00"), Some(HOOK)] {
        let mut request = agent
            .http
            .post(agent.url("/hooks/github"))
            .header("content-type", "application/json")
            .header("X-GitHub-Event", "push")
            .header("X-GitHub-Delivery", "leak-test")
            .body(body);
        if let Some(signature) = signature {
            request = request.header("X-Hub-Signature-256", signature);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        answers.push(format!("{status} {}", response.text().await.unwrap()));
    }
    assert!(answers[0].starts_with("202"), "{answers:?}");
    assert!(
        answers[1..].iter().all(|a| a.starts_with("401")),
        "{answers:?}"
    );
    answers
}

/// Every text or blob value of every table, and the raw bytes of the database files.
fn scan_database(state_dir: &Path) -> usize {
    let mut values = 0;
    for entry in std::fs::read_dir(state_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            assert_clean(
                &path.display().to_string(),
                &String::from_utf8_lossy(&bytes),
            );
        }
    }
    let tables = database_values(&state_dir.join("state.db"));
    assert!(tables.len() >= 3, "{:?}", tables.keys());
    for (table, texts) in tables {
        for (column, text) in texts {
            values += 1;
            assert_clean(&format!("table {table} column {column}"), &text);
        }
    }
    values
}

#[tokio::test(flavor = "multi_thread")]
async fn the_token_and_webhook_secrets_appear_in_no_log_answer_error_or_database_value() {
    let setup = Setup::start(TOKEN, HOOK).await;
    let mut agent = setup.spawn("leak", &TrustLine::Pin, "trace");
    agent
        .wait_for(|s| s["last_attempted"]["outcome"] == "applied")
        .await;

    let mut answers = deliveries(&agent).await;
    agent
        .wait_for(|s| s["last_attempted"]["trigger"] == "webhook")
        .await;
    for path in PATHS {
        let (status, body) = agent.get_text(path).await;
        answers.push(format!("GET {path} -> {status}\n{body}"));
    }
    for answer in &answers {
        assert_clean("an HTTP answer", answer);
    }
    let metrics = answers
        .iter()
        .find(|a| a.starts_with("GET /metrics -> 200"))
        .unwrap();
    assert!(metrics.contains("proxops_passes_total"), "{metrics}");

    // The CLI views, asking the running agent.
    for command in ["status", "drift"] {
        let output = agent
            .cli(&[command, "--json"])
            .env("RUST_LOG", "trace")
            .output()
            .unwrap();
        assert_clean(command, &String::from_utf8_lossy(&output.stdout));
        assert_clean(command, &String::from_utf8_lossy(&output.stderr));
    }

    assert!(agent.terminate().success());
    let logs = agent.log_text();
    assert!(
        logs.contains("TRACE") && logs.contains("verifying webhook signature"),
        "trace logging was on: {} lines, {} TRACE",
        logs.lines().count(),
        logs.matches("TRACE").count()
    );
    assert!(
        logs.contains("/hooks/github") || logs.contains("webhook"),
        "{logs}"
    );
    assert_clean("the agent's stderr", &logs);
    assert_clean("the agent's stdout", &agent.stdout_text());
    let values = scan_database(&agent.state_dir);
    assert!(values > 10, "the database holds records ({values} values)");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_token_is_reported_without_the_secret_sent_or_the_right_one() {
    let setup = Setup::start(TOKEN, HOOK).await;
    let config = setup.config("wrong", &TrustLine::Pin);
    std::fs::write(setup.dir.path().join("token"), WRONG_TOKEN).unwrap();
    let checkout = setup.repo.work_path();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_proxops"))
            .arg("plan")
            .arg(checkout)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "trace")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("401"), "the refusal is reported: {stderr}");
    assert_clean("the refused plan's stderr", &stderr);
    assert_clean(
        "the refused plan's stdout",
        &String::from_utf8_lossy(&output.stdout),
    );

    // The agent: the same refusal recorded, logged at trace, and served.
    let agent = setup.spawn("wrong", &TrustLine::Pin, "trace");
    let status = agent
        .wait_for(|s| s["last_attempted"]["outcome"].is_string())
        .await;
    assert_ne!(status["last_attempted"]["outcome"], "applied", "{status}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    for path in PATHS {
        let (_, body) = agent.get_text(path).await;
        assert_clean(path, &body);
    }
    assert_clean("the agent's stderr", &agent.log_text());
    drop(agent);
    scan_database(&setup.state_dir("wrong"));
}

#[tokio::test(flavor = "multi_thread")]
async fn secret_files_readable_by_other_users_are_warned_about_at_start_without_their_content() {
    use std::os::unix::fs::PermissionsExt;
    // SECURITY-AUDIT.md L7: only the age identity's mode was checked.
    let setup = Setup::start(TOKEN, HOOK).await;
    let token = setup.dir.path().join("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut agent = setup.spawn("modes", &TrustLine::Pin, "info");
    let hook = agent.config.with_extension("hook-secret");
    agent.listening().await;
    agent.terminate();
    let warned = |log: &str, key: &str, file: &Path| {
        log.lines().any(|l| {
            l.contains("WARN")
                && l.contains("secret file is readable by other users")
                && l.contains(key)
                && l.contains(&file.display().to_string())
        })
    };
    let log = agent.log_text();
    assert!(warned(&log, "pve.token_secret_file", &token), "{log}");
    assert_eq!(
        std::fs::metadata(&hook).unwrap().permissions().mode() & 0o077 != 0,
        warned(&log, "webhook.secret_file", &hook),
        "the webhook secret is warned about exactly when its mode is loose:\n{log}"
    );
    assert_clean("the log", &log);

    // Mode 0600: no warning at the next start.
    for file in [&token, &hook] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let before = log.len();
    agent.respawn();
    agent.listening().await;
    agent.terminate();
    let log = agent.log_text();
    assert!(
        !log[before..].contains("secret file is readable by other users"),
        "{}",
        &log[before..]
    );
}
