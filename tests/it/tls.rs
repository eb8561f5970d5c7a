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
