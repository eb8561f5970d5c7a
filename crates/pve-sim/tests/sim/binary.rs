//! The `proxops-pvesim` binary: banner, flags, HTTPS by default.

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{TOKEN, install_provider};

#[tokio::test]
async fn the_binary_prints_its_url_fingerprint_and_credentials_and_serves_https() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxops-pvesim"))
        .args(["--listen", "127.0.0.1:0", "--task-duration", "50ms"])
        .args(["--token-secret", "proxops-dev-secret"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut banner = Vec::new();
    for _ in 0..5 {
        banner.push(lines.next_line().await.unwrap().unwrap());
    }
    let url = banner[0]
        .strip_prefix("proxops-pvesim listening on ")
        .unwrap()
        .to_string();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    assert!(banner[1].starts_with("certificate fingerprint (SHA-256): "));
    assert_eq!(banner[2], "user root@pam, password: proxops");
    assert_eq!(
        banner[3],
        "API token: PVEAPIToken=root@pam!proxops=proxops-dev-secret"
    );
    install_provider();
    let client = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let resp = client
        .get(format!("{url}/version"))
        .header("Authorization", TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    child.kill().await.unwrap();
}
