//! HTTPS, the response envelope, 501 for unknown paths and methods, 400 bodies.

use proxops_pve_sim::SimConfig;

use crate::{TOKEN, install_provider, sim, sim_with};

#[tokio::test]
async fn https_serves_a_self_signed_certificate_with_the_printed_fingerprint() {
    let s = sim_with(SimConfig {
        tls: true,
        ..SimConfig::default()
    })
    .await;
    let fp = s.sim.fingerprint().unwrap().to_string();
    assert_eq!(fp.len(), 32 * 3 - 1);
    assert!(
        fp.chars()
            .all(|c| c == ':' || c.is_ascii_hexdigit() && !c.is_ascii_lowercase())
    );
    assert!(s.base.starts_with("https://127.0.0.1:"));
    install_provider();
    let client = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .tls_info(true)
        .build()
        .unwrap();
    let resp = client
        .get(format!("{}/version", s.base))
        .header("Authorization", TOKEN)
        .send()
        .await
        .unwrap();
    let info = resp.extensions().get::<reqwest::tls::TlsInfo>().unwrap();
    let der = info.peer_certificate().unwrap();
    let got = proxops_fingerprint(der);
    assert_eq!(got, fp);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["data"]["release"], "9.1");
}

fn proxops_fingerprint(der: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[tokio::test]
async fn unknown_paths_and_methods_answer_501_not_implemented() {
    let s = sim().await;
    let r = s
        .post("/nodes/pve1/lxc/100/config", &[("memory", "512")])
        .await;
    assert_eq!(r.status, 501);
    assert_eq!(
        r.message(),
        "Method 'POST /nodes/pve1/lxc/100/config' not implemented\n"
    );
    let r = s.post("/nodes/pve1/qemu/100/resize", &[]).await;
    assert_eq!(r.status, 501);
    assert_eq!(
        s.get("/nodes/pve1/storage/local/download-url").await.status,
        501
    );
}

#[tokio::test]
async fn invalid_parameters_answer_400_with_errors_keyed_by_parameter() {
    let s = sim().await;
    let r = s
        .post("/nodes/pve1/qemu", &[("vmid", "100"), ("start", "true")])
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.message(), "Parameter verification failed.\n");
    assert_eq!(r.body["data"], serde_json::Value::Null);
    assert_eq!(
        r.error("start"),
        "type check ('boolean') failed - got 'true'"
    );
}

#[tokio::test]
async fn json_bodies_are_accepted_like_form_bodies() {
    let s = sim().await;
    let resp = s
        .client
        .post(s.url("/nodes/pve1/qemu"))
        .header("Authorization", TOKEN)
        .json(&serde_json::json!({"vmid": 120, "memory": "512", "start": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    s.wait_ok(body["data"].as_str().unwrap()).await;
}

#[tokio::test]
async fn errors_carry_the_first_message_line_as_the_reason_phrase() {
    let s = sim().await;
    let resp = s
        .client
        .get(s.url("/nodes/pve1/qemu/999/config"))
        .header("Authorization", TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 500);
    // reqwest hides custom reasons; the body holds PVE's message with its newline.
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        body["message"],
        "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist\n"
    );
}

#[tokio::test]
async fn shutdown_stops_the_listener() {
    let s = sim().await;
    let addr = s.sim.addr();
    s.sim.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
