//! TLS trust end to end (issue 8): the built agent and CLI against the simulator's HTTPS with
//! its self-signed certificate. A wrong fingerprint pin and a CA that did not sign the node's
//! certificate are refused before any API request, with an error that says which; `insecure`
//! logs its warning at every start.

use std::time::Duration;

use crate::one_iso::{Setup, TrustLine};

const TOKEN: &str = "tls-token-secret-0b9c";
const HOOK: &str = "tls-webhook-secret-51f0";

/// `proxops plan <checkout> --config <agent.toml>`: stderr and whether it succeeded.
fn plan(setup: &Setup, name: &str, trust: &TrustLine) -> (bool, String) {
    let config = setup.config(name, trust);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_proxops"))
        .arg("plan")
        .arg(setup.repo.work_path())
        .arg("--config")
        .arg(config)
        .env_remove("RUST_LOG")
        .env_remove("PROXOPS_CONFIG")
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn api_requests(setup: &Setup) -> usize {
    setup.sim.control().requests().requests.len()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_fingerprint_pin_is_refused_before_any_request_naming_both_fingerprints() {
    let setup = Setup::start(TOKEN, HOOK).await;
    let actual = setup.sim.fingerprint().unwrap().to_owned();
    let wrong = ["AB"; 32].join(":");

    let (ok, stderr) = plan(&setup, "cli", &TrustLine::WrongPin);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "server certificate fingerprint {actual} does not match the pinned fingerprint {wrong}"
        )),
        "{stderr}"
    );

    let agent = setup.spawn("agent", &TrustLine::WrongPin, "info");
    let status = agent
        .wait_for(|s| s["last_attempted"]["outcome"].is_string())
        .await;
    assert_ne!(status["last_attempted"]["outcome"], "applied", "{status}");
    let logs = agent.log_text();
    assert!(
        logs.contains("does not match the pinned fingerprint"),
        "{logs}"
    );
    assert_eq!(api_requests(&setup), 0, "no request reached the API");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ca_that_did_not_sign_the_node_certificate_is_refused_before_any_request() {
    let setup = Setup::start(TOKEN, HOOK).await;

    let (ok, stderr) = plan(&setup, "cli", &TrustLine::UntrustedCa);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("tls handshake failed"), "{stderr}");
    assert!(
        // rustls' reason: UnknownIssuer, or BadSignature when the CA's name matches the
        // issuer's (both certificates here are rcgen's, with the same distinguished name).
        stderr.contains("invalid peer certificate: "),
        "the cause names the refusal: {stderr}"
    );

    let agent = setup.spawn("agent", &TrustLine::UntrustedCa, "info");
    let status = agent
        .wait_for(|s| s["last_attempted"]["outcome"].is_string())
        .await;
    assert_ne!(status["last_attempted"]["outcome"], "applied", "{status}");
    assert!(
        agent.log_text().contains("tls handshake failed"),
        "{}",
        agent.log_text()
    );
    assert_eq!(api_requests(&setup), 0, "no request reached the API");
}

#[tokio::test(flavor = "multi_thread")]
async fn insecure_mode_logs_its_warning_at_every_start() {
    let setup = Setup::start(TOKEN, HOOK).await;
    let warning = "TLS certificate verification is disabled (insecure)";
    let mut seen = 0;
    for start in 1..=2 {
        let mut agent = setup.spawn("insecure", &TrustLine::Insecure, "info");
        // The second start finds the ISO the first downloaded: "no-change".
        agent
            .wait_for(|s| {
                matches!(
                    s["last_attempted"]["outcome"].as_str(),
                    Some("applied" | "no-change")
                )
            })
            .await;
        assert!(agent.terminate().success());
        // The stderr file is appended to by both starts.
        let count = agent.log_text().matches(warning).count();
        assert!(
            count > seen,
            "start {start} logged no warning:\n{}",
            agent.log_text()
        );
        let line = agent
            .log_text()
            .lines()
            .find(|l| l.contains(warning))
            .unwrap()
            .to_owned();
        assert!(line.contains("WARN"), "{line}");
        seen = count;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(api_requests(&setup) > 0, "insecure mode reached the API");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plain_http_pve_url_is_refused_unless_allowed_and_then_warned_about_at_every_start() {
    use crate::support::agent::{AgentProcess, Trust};
    // SECURITY-AUDIT.md M3: `http://` was accepted and the token crossed the wire in clear.
    let world = crate::sim::World::start(&[("a.iso", b"installer".as_slice())]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain = proxops_pve_sim::start(
        proxops_pve_sim::SimConfig {
            tls: false,
            task_duration: Duration::from_millis(20),
            ..proxops_pve_sim::SimConfig::default()
        },
        listener,
    )
    .await
    .unwrap();
    let url = plain.base_url().trim_end_matches("/api2/json").to_owned();
    assert!(url.starts_with("http://"), "{url}");
    let repo = crate::git_server::TestRepo::new();
    let commit = repo.commit_files(
        &[(
            "iso/a.yaml",
            &crate::sim::artifact(
                "ISO",
                "a",
                &["pve1"],
                "a.iso",
                &format!("{}/a.iso", world.files_url),
                None,
            ),
        )],
        "one ISO",
    );
    let dir = world.dir.path();
    let toml = world
        .agent_toml()
        .state_dir(dir.join("state-plain"))
        .source(&repo.url())
        .pve_url(&url)
        .trust(Trust::None);

    let refused = toml.write(&dir.join("agent-refused.toml"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_proxops"))
        .args(["agent", "--config"])
        .arg(&refused)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("pve.url: `{url}` is plain http"))
            && stderr.contains("allow_plain_http = true"),
        "{stderr}"
    );
    assert_eq!(
        plain.control().requests().requests.len(),
        0,
        "no request was sent"
    );
    assert!(!dir.join("state-plain").exists(), "nothing was created");

    let allowed = toml.pve("allow_plain_http = true");
    let mut agent = AgentProcess::spawn(&allowed, &dir.join("agent-plain.toml"), "info");
    agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(commit.as_str()))
        .await;
    agent.terminate();
    agent.respawn();
    agent.listening().await;
    let warnings = agent
        .log_text()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("[pve] url is plain http"))
        .count();
    assert_eq!(warnings, 2, "one warning per start:\n{}", agent.log_text());

    let out = agent
        .cli(&["check", "--json"])
        .arg(repo.work_path())
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let item = report["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["check"] == "pve" && i["subject"] == "url")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(item["status"], "problem", "{item}");
    assert!(
        item["detail"].as_str().unwrap().contains("plain http"),
        "{item}"
    );
    assert_eq!(report["ok"], false);
}
