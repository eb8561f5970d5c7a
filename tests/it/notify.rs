//! Notifications end to end: the agent binary following a real git repository (git daemon)
//! against the simulator, with `[[notify]]` targets that are local servers started by each
//! test: HTTP receivers standing in for a webhook consumer, ntfy, a Matrix homeserver and a
//! Slack incoming webhook (each payload checked against that service's documented format),
//! and a real SMTP server (aiosmtpd) with STARTTLS and AUTH.
//!
//! The formats checked, from each service's documentation:
//! - ntfy, "Publish as JSON": POST to the server's root URL, `topic` (string, required),
//!   `title`, `message` (strings), `priority` (integer 1–5), `tags` (array of strings);
//!   access tokens as `Authorization: Bearer`.
//! - Matrix client-server API v3: `PUT /_matrix/client/v3/rooms/{roomId}/send/
//!   m.room.message/{txnId}` with `Authorization: Bearer <access token>`; content `msgtype`,
//!   `body`, `format: "org.matrix.custom.html"`, `formatted_body`.
//! - Slack incoming webhooks: POST JSON `text` (string) and `blocks` (Block Kit: each a
//!   `type`; a `header`'s text is `plain_text` of at most 150 characters, a `section`'s
//!   `mrkdwn` at most 3000; at most 50 blocks). The URL is the credential: no header.
//! - webhook: our document, validated against docs/notify-webhook.schema.json.

use std::time::{Duration, Instant};

use crate::agent::start_agent;
use crate::git_server::TestRepo;
use crate::sim::World;
use crate::support::notify::{
    PATIENCE, Receiver, SmtpServer, assert_valid, free_port, notify_python,
};

const TOKEN: &str = "tk_notify-token-for-tests";
const VM: &str = "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: web-1\n  annotations:\n    proxops/drift: report\nspec:\n  node: pve1\n  vmid: 101\n  state: stopped\n  memory: 512MiB\n  cpu: {type: host, cores: 1}\n  disks: [{storage: local-lvm, size: 1GiB}]\n  networks: [{bridge: vmbr0}]\n";

/// Changes a guest's config through PVE's API, as an operator with a shell would.
async fn pve_put(world: &World, path: &str, form: &[(&str, &str)]) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let response = http
        .put(format!("{}{path}", world.sim.base_url()))
        .header(
            "Authorization",
            "PVEAPIToken=root@pam!proxops=proxops-dev-secret",
        )
        .form(form)
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
}

/// Sets VM 101's memory in PVE (MiB).
async fn set_memory(world: &World, mib: &str) {
    pve_put(world, "/nodes/pve1/qemu/101/config", &[("memory", mib)]).await;
}

/// Writes `content` to a file in the world's directory; its absolute path, TOML-quoted.
fn secret_file(world: &World, name: &str, content: &str) -> String {
    let path = world.dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    toml::Value::String(path.display().to_string()).to_string()
}

/// Waits until `/api/v1/drift` satisfies `done`.
async fn wait_for_drift(
    agent: &crate::support::agent::AgentProcess,
    done: impl Fn(&serde_json::Value) -> bool,
) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let drift = agent.get("/api/v1/drift").await;
        if done(&drift) {
            return;
        }
        assert!(Instant::now() < deadline, "drift not as expected: {drift}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn open_on_web_1(drift: &serde_json::Value) -> bool {
    drift["open"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["resource"] == "VM/web-1")
}

/// How many passes the agent has recorded.
async fn passes(agent: &crate::support::agent::AgentProcess) -> usize {
    let passes = agent.get("/api/v1/revisions?limit=1000").await;
    passes.as_array().map_or(0, Vec::len)
}

async fn wait_for_passes(agent: &crate::support::agent::AgentProcess, at_least: usize) {
    let deadline = Instant::now() + PATIENCE;
    while passes(agent).await < at_least {
        assert!(
            Instant::now() < deadline,
            "fewer than {at_least} passes; log:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn webhook_ntfy_matrix_and_slack_each_get_drift_in_their_documented_format() {
    let Ok(python) = notify_python().map_err(|m| eprintln!("skipped: {m}")) else {
        return;
    };
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let commit = repo.commit_files(&[("vm/web-1.yaml", VM)], "one VM, drift reported only");
    let (webhook, ntfy, matrix, slack) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let token = secret_file(&world, "notify-token", &format!("{TOKEN}\n"));
    let slack_url = secret_file(
        &world,
        "slack-url",
        &slack.url("/services/T000/B000/XXXXSECRET"),
    );
    let notify = format!(
        r#"
[[notify]]
kind = "webhook"
url = "{webhook}"
token_file = {token}
flap_window = "0s"
[[notify]]
kind = "ntfy"
url = "{ntfy}"
token_file = {token}
events = ["drift-found"]
[[notify]]
kind = "matrix"
url = "{matrix}"
room = "!ops:example.org"
token_file = {token}
events = ["drift-found"]
[[notify]]
kind = "slack"
url_file = {slack_url}
events = ["drift-found"]
"#,
        webhook = webhook.url("/hooks/proxops"),
        ntfy = ntfy.url("/proxops-alerts"),
        matrix = matrix.url(""),
    );
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s").raw(&notify)).await;
    let log = || agent.log_text();

    // The first pass created the VM: `applied`, to the webhook only (the others want drift).
    let applied = webhook.wait_for("applied", log).await;
    assert_eq!(applied.body["event"], "applied");
    assert_eq!(applied.body["pass"]["commit"], commit.as_str());
    let verbs: Vec<&str> = applied.body["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["verb"].as_str().unwrap())
        .collect();
    assert!(verbs.contains(&"create"), "{verbs:?}");

    set_memory(&world, "1024").await;
    let hook = webhook.wait_for("drift-found", log).await;
    let n = ntfy.wait_for("drift-found", log).await;
    let m = matrix.wait_for("drift-found", log).await;
    let s = slack.wait_for("drift-found", log).await;

    // webhook: POST to the configured path with the bearer token; the document says what
    // changed.
    assert_eq!(
        (hook.method.as_str(), hook.path.as_str()),
        ("POST", "/hooks/proxops")
    );
    assert_eq!(hook.header("authorization"), format!("Bearer {TOKEN}"));
    assert_eq!(hook.header("content-type"), "application/json");
    let finding = &hook.body["findings"][0];
    assert_eq!(finding["resource"], "VM/web-1");
    assert_eq!(finding["node"], "pve1");
    assert_eq!(finding["field"], "memory", "{}", hook.body);
    assert_eq!(hook.body["node"], "pve1");
    assert_eq!(hook.body["pass"]["commit"], commit.as_str());

    // ntfy: JSON to the root URL, the topic from the configured URL.
    assert_eq!((n.method.as_str(), n.path.as_str()), ("POST", "/"));
    assert_eq!(n.header("authorization"), format!("Bearer {TOKEN}"));
    assert_eq!(n.body["topic"], "proxops-alerts");
    assert!(
        n.body["title"].as_str().unwrap().contains("VM/web-1"),
        "{}",
        n.body
    );
    assert!(
        n.body["message"].as_str().unwrap().contains("memory"),
        "{}",
        n.body
    );
    let priority = n.body["priority"].as_u64().unwrap();
    assert!((1..=5).contains(&priority), "{}", n.body);
    assert!(
        n.body["tags"]
            .as_array()
            .unwrap()
            .iter()
            .all(serde_json::Value::is_string),
        "{}",
        n.body
    );

    // Matrix: PUT to the send endpoint with a transaction id, bearer token, m.room.message
    // content with an HTML body.
    assert_eq!(m.method, "PUT");
    let prefix = "/_matrix/client/v3/rooms/!ops:example.org/send/m.room.message/";
    assert!(m.path.starts_with(prefix), "{}", m.path);
    assert!(m.path.len() > prefix.len(), "no txnId: {}", m.path);
    assert_eq!(m.header("authorization"), format!("Bearer {TOKEN}"));
    assert!(["m.text", "m.notice"].contains(&m.body["msgtype"].as_str().unwrap()));
    assert!(
        m.body["body"].as_str().unwrap().contains("VM/web-1"),
        "{}",
        m.body
    );
    assert_eq!(m.body["format"], "org.matrix.custom.html");
    assert!(
        m.body["formatted_body"]
            .as_str()
            .unwrap()
            .contains("<strong>"),
        "{}",
        m.body
    );

    // Slack: POST to the webhook URL (no Authorization header: the URL is the credential),
    // `text` as the fallback and Block Kit blocks within their limits.
    assert_eq!(
        (s.method.as_str(), s.path.as_str()),
        ("POST", "/services/T000/B000/XXXXSECRET")
    );
    assert_eq!(s.header("authorization"), "");
    assert!(
        s.body["text"].as_str().unwrap().contains("VM/web-1"),
        "{}",
        s.body
    );
    let blocks = s.body["blocks"].as_array().unwrap();
    assert!(!blocks.is_empty() && blocks.len() <= 50, "{}", s.body);
    assert_eq!(blocks[0]["type"], "header");
    assert_eq!(blocks[0]["text"]["type"], "plain_text");
    assert!(blocks[0]["text"]["text"].as_str().unwrap().chars().count() <= 150);
    for block in blocks {
        assert!(
            ["header", "section", "context"].contains(&block["type"].as_str().unwrap()),
            "{block}"
        );
        if block["type"] == "section" {
            assert_eq!(block["text"]["type"], "mrkdwn");
            assert!(block["text"]["text"].as_str().unwrap().chars().count() <= 3000);
        }
    }

    // Put back by hand: with flap_window = "0s" the webhook hears of it at once.
    set_memory(&world, "512").await;
    let resolved = webhook.wait_for("drift-resolved", log).await;
    assert_eq!(resolved.body["findings"][0]["resource"], "VM/web-1");

    // Nothing secret left the agent but where it belongs: the token only in the headers
    // above, the Slack URL's secret only as the path it was sent to.
    let log_text = agent.log_text();
    assert!(
        !log_text.contains(TOKEN) && !log_text.contains("XXXXSECRET"),
        "{log_text}"
    );
    for r in [&webhook, &ntfy, &matrix, &slack]
        .iter()
        .flat_map(|r| r.requests())
    {
        let body = r.body.to_string();
        assert!(
            !body.contains(TOKEN) && !body.contains("XXXXSECRET"),
            "{body}"
        );
    }
    // Every webhook document received validates against the committed schema.
    let documents: Vec<serde_json::Value> =
        webhook.requests().into_iter().map(|r| r.body).collect();
    assert!(documents.len() >= 3, "{documents:#?}");
    let schema = crate::support::repo_root().join("docs/notify-webhook.schema.json");
    assert_valid(&python, &schema, &documents);
    // Each drift was announced once, however many passes saw it.
    assert_eq!(webhook.delivered("drift-found").len(), 1);
    assert_eq!(ntfy.delivered("drift-found").len(), 1);
    let mut agent = agent;
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_commit_is_announced_once_with_its_located_diagnostics_then_git_down_as_stale() {
    let Ok(python) = notify_python().map_err(|m| eprintln!("skipped: {m}")) else {
        return;
    };
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let good = repo.commit_files(&[("vm/web-1.yaml", VM)], "one VM");
    let webhook = Receiver::start().await;
    let notify = format!(
        "[[notify]]\nkind = \"webhook\"\nurl = \"{}\"\nevents = [\"invalid\", \"stale\"]\n",
        webhook.url("/hook")
    );
    let (agent, daemon) = start_agent(&world, &repo, |t| t.poll("1s").raw(&notify)).await;
    let log = || agent.log_text();
    agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(good.as_str()))
        .await;

    let typo = repo.commit_files(
        &[(
            "vm/web-1.yaml",
            &VM.replace("memory: 512MiB", "memory: lots"),
        )],
        "a typo",
    );
    let invalid = webhook.wait_for("invalid", log).await;
    assert_eq!(invalid.body["pass"]["commit"], typo.as_str());
    let diagnostics = invalid.body["diagnostics"].as_array().unwrap();
    assert!(
        diagnostics
            .iter()
            .any(|d| d.as_str().unwrap().starts_with("vm/web-1.yaml:")
                && d.as_str().unwrap().contains(": error: ")),
        "{}",
        invalid.body
    );
    assert!(
        invalid.body["title"]
            .as_str()
            .unwrap()
            .contains("is invalid")
    );
    // Later passes at the same commit say nothing new.
    let seen = passes(&agent).await;
    wait_for_passes(&agent, seen + 2).await;
    assert_eq!(webhook.delivered("invalid").len(), 1);

    // git goes away: the last good revision stays in force, and that is announced once.
    drop(daemon);
    let stale = webhook.wait_for("stale", log).await;
    assert!(stale.body["error"].is_string(), "{}", stale.body);
    let seen = passes(&agent).await;
    wait_for_passes(&agent, seen + 2).await;
    assert_eq!(webhook.delivered("stale").len(), 1);

    let documents: Vec<serde_json::Value> =
        webhook.requests().into_iter().map(|r| r.body).collect();
    let schema = crate::support::repo_root().join("docs/notify-webhook.schema.json");
    assert_valid(&python, &schema, &documents);
    let mut agent = agent;
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flapping_drift_is_announced_once() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let commit = repo.commit_files(&[("vm/web-1.yaml", VM)], "one VM, drift reported only");
    let webhook = Receiver::start().await;
    let notify = format!(
        "[[notify]]\nkind = \"webhook\"\nurl = \"{}\"\nevents = [\"drift-found\", \"drift-resolved\"]\nflap_window = \"1h\"\n",
        webhook.url("/hook")
    );
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s").raw(&notify)).await;
    let log = || agent.log_text();
    agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(commit.as_str()))
        .await;

    // Found …
    set_memory(&world, "1024").await;
    webhook.wait_for("drift-found", log).await;
    // … resolved (the store says so) …
    set_memory(&world, "512").await;
    wait_for_drift(&agent, |d| !open_on_web_1(d)).await;
    // … found again, and seen by a few more passes.
    set_memory(&world, "2048").await;
    wait_for_drift(&agent, open_on_web_1).await;
    let seen = passes(&agent).await;
    wait_for_passes(&agent, seen + 3).await;

    assert_eq!(
        webhook.delivered("drift-found").len(),
        1,
        "{:#?}",
        webhook.requests()
    );
    assert!(webhook.delivered("drift-resolved").is_empty());
    let mut agent = agent;
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_target_never_holds_a_pass_back_and_gets_the_message_once_it_is_back() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let commit = repo.commit_files(&[("vm/web-1.yaml", VM)], "one VM");
    // One target refuses connections (nothing listens yet), one answers 500.
    let down = free_port();
    let failing = Receiver::start().await;
    failing.answer(500);
    let notify = format!(
        "[[notify]]\nkind = \"webhook\"\nurl = \"http://{down}/hook\"\nevents = [\"applied\"]\n\
         [[notify]]\nkind = \"webhook\"\nurl = \"{}\"\nevents = [\"applied\"]\n",
        failing.url("/hook")
    );
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s").raw(&notify)).await;
    let log = || agent.log_text();

    // Passes go on and apply while neither target takes the message.
    let status = agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(commit.as_str()))
        .await;
    assert_eq!(status["last_attempted"]["outcome"], "applied", "{status}");
    let seen = passes(&agent).await;
    wait_for_passes(&agent, seen + 2).await;
    let deadline = Instant::now() + PATIENCE;
    while failing.requests().is_empty() {
        assert!(Instant::now() < deadline, "the 500 target was never tried");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(failing.delivered("applied").is_empty());

    // Both come back: the retries deliver the message, once each.
    failing.answer(200);
    let back = Receiver::start_on(down).await;
    let first = back.wait_for("applied", log).await;
    assert_eq!(first.body["pass"]["commit"], commit.as_str());
    failing.wait_for("applied", log).await;
    assert_eq!(back.delivered("applied").len(), 1);
    assert!(
        log().contains("notification not delivered; retrying"),
        "{}",
        log()
    );
    let mut agent = agent;
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn beyond_max_per_minute_messages_are_counted_and_one_summary_follows() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    repo.commit_files(&[("vm/web-1.yaml", VM)], "one VM, drift reported only");
    let webhook = Receiver::start().await;
    let notify = format!(
        "[[notify]]\nkind = \"webhook\"\nurl = \"{}\"\nmax_per_minute = 1\n",
        webhook.url("/hook")
    );
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s").raw(&notify)).await;
    let log = || agent.log_text();
    // The first message of the minute goes out …
    webhook.wait_for("applied", log).await;
    // … the next one, within the same minute, does not.
    set_memory(&world, "1024").await;
    let deadline = Instant::now() + PATIENCE;
    while !log().contains("notification not sent: rate limit reached") {
        assert!(
            Instant::now() < deadline,
            "not rate-limited; log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, metrics) = agent.get_text("/metrics").await;
    assert!(
        metrics.contains(
            r#"proxops_notifications_total{target="0",kind="webhook",result="rate-limited"} 1"#
        ),
        "{metrics}"
    );
    assert!(webhook.delivered("drift-found").is_empty());
    // Once the minute is over, one summary says how many were not sent.
    let summary = webhook
        .wait_for_within("rate-limited", PATIENCE * 2, log)
        .await;
    assert_eq!(summary.body["event"], "rate-limited");
    assert!(
        summary.body["suppressed"].as_u64().unwrap() >= 1,
        "{}",
        summary.body
    );
    assert_eq!(summary.body["node"], "pve1");
    if let Ok(python) = notify_python() {
        let schema = crate::support::repo_root().join("docs/notify-webhook.schema.json");
        assert_valid(&python, &schema, std::slice::from_ref(&summary.body));
    }
    let mut agent = agent;
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redirect_is_not_followed_so_the_token_never_reaches_another_host() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let commit = repo.commit_files(&[("vm/web-1.yaml", VM)], "one VM");
    let elsewhere = Receiver::start().await;
    let redirecting = Receiver::start().await;
    redirecting.redirect(307, &elsewhere.url("/stolen"));
    let token = secret_file(&world, "notify-token", TOKEN);
    let notify = format!(
        "[[notify]]\nkind = \"webhook\"\nurl = \"{}\"\ntoken_file = {token}\nevents = [\"applied\"]\n",
        redirecting.url("/hook")
    );
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s").raw(&notify)).await;
    agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(commit.as_str()))
        .await;
    let deadline = Instant::now() + PATIENCE;
    while !agent.log_text().contains("notification given up") {
        assert!(
            Instant::now() < deadline,
            "the redirect was not given up; log:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent = redirecting.requests();
    assert_eq!(sent.len(), 1, "{sent:#?}");
    assert_eq!(sent[0].header("authorization"), format!("Bearer {TOKEN}"));
    assert!(
        elsewhere.requests().is_empty(),
        "{:#?}",
        elsewhere.requests()
    );
    let log = agent.log_text();
    assert!(log.contains("HTTP 307"), "{log}");
    assert!(!log.contains(TOKEN) && !log.contains("/stolen"), "{log}");
    let mut agent = agent;
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn email_is_delivered_over_starttls_with_auth_as_plain_text_and_html() {
    let Ok(python) = notify_python().map_err(|m| eprintln!("skipped: {m}")) else {
        return;
    };
    let world = World::start(&[]).await;
    let smtp = SmtpServer::start(&python, world.dir.path());
    let repo = TestRepo::new();
    let commit = repo.commit_files(&[("vm/web-1.yaml", VM)], "one VM");
    let password = secret_file(&world, "smtp-password", "password\n");
    let notify = format!(
        r#"
[[notify]]
kind = "email"
smtp_host = "127.0.0.1"
smtp_port = {port}
starttls = true
username = "proxops"
password_file = {password}
ca_file = {ca}
from = "ProxOps <proxops@example.org>"
to = ["ops@example.org", "oncall@example.org"]
events = ["applied"]
"#,
        port = smtp.port,
        ca = toml::Value::String(smtp.cert.display().to_string()),
    );
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.raw(&notify)).await;
    let deadline = Instant::now() + PATIENCE;
    let mail = loop {
        if let Some(mail) = smtp.messages().into_iter().next() {
            break mail;
        }
        assert!(
            Instant::now() < deadline,
            "no email arrived; agent log:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(mail["tls"], true, "{mail}");
    assert_eq!(mail["login"], "proxops");
    assert_eq!(mail["mail_from"], "proxops@example.org");
    assert_eq!(
        mail["rcpt_tos"],
        serde_json::json!(["ops@example.org", "oncall@example.org"])
    );
    let content = mail["content"].as_str().unwrap();
    let short = &commit[..12];
    assert!(
        content.contains(&format!("Subject: [proxops] pve1: applied {short}")),
        "{content}"
    );
    assert!(content.contains("multipart/alternative"), "{content}");
    assert!(content.contains("Content-Type: text/plain"), "{content}");
    assert!(content.contains("Content-Type: text/html"), "{content}");
    assert!(content.contains("create VM/web-1 on pve1"), "{content}");
    assert!(!content.contains("password\n") && !agent.log_text().contains("password\n"));
    let mut agent = agent;
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_notify_table_stops_the_agent_with_its_index_and_key() {
    let world = World::start(&[]).await;
    let dir = world.dir.path();
    let config = world
        .agent_toml()
        .state_dir(dir.join("state"))
        .raw("[[notify]]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:1/x\"\n[[notify]]\nkind = \"ntfy\"\nurl = \"http://127.0.0.1:1/t\"\nevents = [\"drift-fund\"]\n")
        .write(&dir.join("agent-bad.toml"));
    let out = crate::support::proxops(&["agent", "--config", config.to_str().unwrap()]);
    let stderr = crate::support::stderr(&out);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("notify[1].events[0]: `drift-fund` is not an event; use some of applied"),
        "{stderr}"
    );
}
