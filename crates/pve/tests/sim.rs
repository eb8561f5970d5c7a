//! The client against `proxops-pve-sim` over HTTPS: token auth, the fingerprint pin, a real
//! download-url task waited for to its end, retries on injected faults, and PVE's exit status
//! text on task failure. What the client sent is checked through the simulator's request log.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use proxops_pve::request;
use proxops_pve::{
    ChecksumAlgorithm, ClientConfig, ContentType, DownloadUrl, PveClient, PveError, RetryPolicy,
    SecretString, TaskError, Timeouts, TransportKind, Trust, WaitOptions, wait_for_task,
};
use proxops_pve_sim::{HttpFault, RunningSim, SimConfig};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const SECRET: &str = "b1946ac9-2a4e-4d5c-9f7e-0c1d2e3f4a5b";
const TOKEN_ID: &str = "root@pam!proxops";
const ISO: &[u8] = b"not really an iso, but the simulator does not look inside";

async fn sim() -> RunningSim {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let config = SimConfig {
        token_secret: SECRET.into(),
        task_duration: Duration::from_millis(50),
        ..SimConfig::default()
    };
    proxops_pve_sim::start(config, listener)
        .await
        .expect("simulator starts")
}

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        min_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        jitter: true,
    }
}

fn client_with(sim: &RunningSim, secret: &str, trust: Trust) -> Result<PveClient, PveError> {
    PveClient::new(ClientConfig {
        base_url: sim.base_url(),
        token_id: TOKEN_ID.into(),
        token_secret: SecretString::from(secret),
        trust,
        timeout: Timeouts {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(10),
        },
        retry: fast_retries(),
    })
}

fn pinned(sim: &RunningSim) -> PveClient {
    let pin = sim.fingerprint().expect("simulator serves TLS").to_owned();
    client_with(sim, SECRET, Trust::Fingerprint(pin)).expect("client builds")
}

/// Serves `files` over plain HTTP on 127.0.0.1, as a mirror the node downloads from.
async fn serve_files(files: &[(&'static str, &'static [u8])]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("bound address");
    let mut router = Router::new();
    for (path, body) in files {
        let body: &'static [u8] = body;
        router = router.route(path, get(move || async move { body }));
    }
    tokio::spawn(async move {
        axum::serve(listener, router)
            .await
            .expect("file server runs")
    });
    addr
}

fn count(sim: &RunningSim, method: &str, endpoint: &str) -> u64 {
    let log = sim.control().requests();
    log.counters
        .get(&format!("{method} {endpoint}"))
        .copied()
        .unwrap_or(0)
}

fn wait_opts() -> WaitOptions {
    WaitOptions {
        poll_interval: Duration::from_millis(10),
        max_poll_interval: Duration::from_millis(100),
        timeout: Duration::from_secs(20),
    }
}

#[tokio::test]
async fn token_auth_works_and_a_wrong_secret_is_a_401_without_the_secret() {
    let sim = sim().await;
    let client = pinned(&sim);
    let version = client.version().await.unwrap();
    assert!(version.release.starts_with('9'), "{version:?}");
    let nodes = client.nodes().await.unwrap();
    assert_eq!(nodes.len(), 3);
    assert!(nodes.iter().all(|n| n.is_online()));
    assert_eq!(client.writes_sent(), 0);

    let wrong = "00000000-0000-0000-0000-000000000000";
    let bad = client_with(
        &sim,
        wrong,
        Trust::Fingerprint(sim.fingerprint().unwrap().into()),
    )
    .unwrap();
    let err = bad.version().await.unwrap_err();
    assert_eq!(err.status(), Some(401), "{err:?}");
    assert!(!err.is_transient());
    assert_eq!(bad.requests_sent(), 1, "a 401 is never retried");
    let text = format!("{err} {err:?} {bad:?} {client:?}");
    assert!(!text.contains(SECRET) && !text.contains(wrong), "{text}");
    assert!(err.to_string().starts_with("GET /version: 401 "), "{err}");
    sim.shutdown().await;
}

#[tokio::test]
async fn fingerprint_pin_accepts_the_node_certificate_in_any_case() {
    let sim = sim().await;
    let pin = sim.fingerprint().unwrap().to_lowercase();
    let client = client_with(&sim, SECRET, Trust::Fingerprint(pin)).unwrap();
    assert!(client.version().await.is_ok());
    let insecure = client_with(&sim, SECRET, Trust::Insecure).unwrap();
    assert!(insecure.version().await.is_ok());
    sim.shutdown().await;
}

#[tokio::test]
async fn a_wrong_fingerprint_pin_is_refused_with_a_clear_error_and_not_retried() {
    let sim = sim().await;
    let wrong = ["AB"; 32].join(":");
    let client = client_with(&sim, SECRET, Trust::Fingerprint(wrong.clone())).unwrap();
    let err = client.version().await.unwrap_err();
    match &err {
        PveError::FingerprintMismatch {
            expected, actual, ..
        } => {
            assert_eq!(expected, &wrong);
            assert_eq!(actual, sim.fingerprint().unwrap());
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        err.to_string()
            .starts_with("GET /version: server certificate fingerprint "),
        "{err}"
    );
    assert!(!err.is_transient());
    assert_eq!(client.requests_sent(), 1);
    assert_eq!(count(&sim, "GET", "/version"), 0, "nothing reached the API");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_ca_file_that_did_not_sign_the_node_certificate_is_a_tls_error() {
    let sim = sim().await;
    let other_ca = rcgen::generate_simple_self_signed(vec!["pve1".to_owned()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pve-root-ca.pem");
    std::fs::write(&path, other_ca.cert.pem()).unwrap();
    let client = client_with(&sim, SECRET, Trust::CaFile(path)).unwrap();
    let err = client.version().await.unwrap_err();
    assert!(
        matches!(
            err,
            PveError::Transport {
                kind: TransportKind::Tls,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "GET /version: tls handshake failed");
    assert!(!err.is_transient());
    assert_eq!(
        client.requests_sent(),
        1,
        "certificate errors are not retried"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn download_url_is_waited_for_and_the_file_is_listed_afterwards() {
    let sim = sim().await;
    let mirror = serve_files(&[("/debian.iso", ISO)]).await;
    let client = pinned(&sim);
    let sha256 = hex::encode(Sha256::digest(ISO));
    let download = DownloadUrl::new(
        ContentType::Iso,
        format!("http://{mirror}/debian.iso"),
        "debian.iso",
    )
    .with_checksum(ChecksumAlgorithm::Sha256, sha256);

    let before = client
        .storage_content("pve1", "local", Some(ContentType::Iso))
        .await
        .unwrap();
    assert!(before.is_empty());

    let upid = client
        .download_url("pve1", "local", &download)
        .await
        .unwrap();
    assert_eq!(upid.node(), "pve1");
    assert_eq!(upid.task_type(), "download");
    assert_eq!(upid.user(), TOKEN_ID);
    let status = wait_for_task(&client, &upid, &wait_opts(), &CancellationToken::new())
        .await
        .unwrap();
    assert!(status.is_success(), "{status:?}");

    let items = client
        .storage_content("pve1", "local", Some(ContentType::Iso))
        .await
        .unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].volid, "local:iso/debian.iso");
    assert_eq!(items[0].size, Some(ISO.len() as u64));
    // Nodes are independent: pve2 has no copy.
    let pve2 = client
        .storage_content("pve2", "local", Some(ContentType::Iso))
        .await
        .unwrap();
    assert!(pve2.is_empty());

    let log = client.task_log("pve1", &upid, 0, 50).await.unwrap();
    assert_eq!(log.last().map(|l| l.t.as_str()), Some("TASK OK"));

    // What was sent matches the schema's parameter names, with the checksum as a pair.
    let sent = sim.control().requests();
    let post = sent
        .requests
        .iter()
        .find(|r| r.method == "POST")
        .expect("one download-url request");
    assert_eq!(
        post.endpoint,
        "/nodes/{node}/storage/{storage}/download-url"
    );
    assert_eq!(post.params["checksum-algorithm"], "sha256");
    assert_eq!(post.user.as_deref(), Some(TOKEN_ID));
    assert_eq!(client.writes_sent(), 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_failed_download_carries_pve_exit_status_text() {
    let sim = sim().await;
    let mirror = serve_files(&[("/a.iso", ISO)]).await;
    let client = pinned(&sim);
    let wrong = DownloadUrl::new(ContentType::Iso, format!("http://{mirror}/a.iso"), "a.iso")
        .with_checksum(ChecksumAlgorithm::Sha256, "0".repeat(64));
    let upid = client.download_url("pve1", "local", &wrong).await.unwrap();
    let err = wait_for_task(&client, &upid, &wait_opts(), &CancellationToken::new())
        .await
        .unwrap_err();
    let TaskError::Failed { exitstatus, .. } = &err else {
        panic!("unexpected {err:?}");
    };
    assert!(exitstatus.starts_with("checksum mismatch"), "{exitstatus}");
    assert!(
        err.to_string().contains("failed: checksum mismatch"),
        "{err}"
    );

    // A scripted failure comes back word for word.
    sim.control()
        .fail_next_task("download", "download failed: exit code 8");
    let ok = DownloadUrl::new(ContentType::Iso, format!("http://{mirror}/a.iso"), "b.iso");
    let upid = client.download_url("pve2", "local", &ok).await.unwrap();
    match wait_for_task(&client, &upid, &wait_opts(), &CancellationToken::new()).await {
        Err(TaskError::Failed { exitstatus, .. }) => {
            assert_eq!(exitstatus, "download failed: exit code 8");
        }
        other => panic!("unexpected {other:?}"),
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_wait_stops_polling_and_leaves_the_task_running() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = proxops_pve_sim::start(
        SimConfig {
            token_secret: SECRET.into(),
            task_duration: Duration::from_millis(200),
            ..SimConfig::default()
        },
        listener,
    )
    .await
    .unwrap();
    let client = pinned(&sim);
    let create = request::qemu_create(
        "pve1",
        100,
        &request::Params::new()
            .set("name", "web")
            .set_int("memory", 512),
    );
    let upid: proxops_pve::Upid = client.execute_as(&create).await.unwrap();
    let cancel = CancellationToken::new();
    cancel.cancel();
    let err = wait_for_task(&client, &upid, &wait_opts(), &cancel)
        .await
        .unwrap_err();
    assert!(matches!(err, TaskError::Cancelled { .. }), "{err:?}");
    let status = client.task_status("pve1", &upid).await.unwrap();
    assert!(status.is_running(), "the task goes on in PVE: {status:?}");
    sim.shutdown().await;
}

#[tokio::test]
async fn gets_are_retried_on_injected_500_and_595() {
    let sim = sim().await;
    let client = pinned(&sim);
    for status in [500, 595] {
        sim.control().clear_requests();
        sim.control()
            .fail_requests(HttpFault {
                pattern: "^/version$".into(),
                method: Some("GET".into()),
                status,
                message: Some("temporary failure".into()),
                times: Some(2),
                probability: None,
            })
            .unwrap();
        let version = client.version().await;
        assert!(version.is_ok(), "{status}: {version:?}");
        assert_eq!(
            count(&sim, "GET", "/version"),
            3,
            "{status}: two failures, then success"
        );
    }

    // A listing that keeps failing gives up after the policy's retries, with PVE's message.
    sim.control().clear_requests();
    sim.control()
        .fail_storage_listing("pve2", "local", 100, None);
    let before = client.requests_sent();
    let err = client
        .storage_content("pve2", "local", Some(ContentType::Iso))
        .await
        .unwrap_err();
    assert_eq!(client.requests_sent() - before, 4, "1 attempt + 3 retries");
    assert!(err.is_transient());
    assert_eq!(
        err.to_string(),
        "GET /nodes/pve2/storage/local/content: 500 storage 'local' is not online"
    );
    // The other node is unaffected.
    assert!(
        client
            .storage_content("pve1", "local", Some(ContentType::Iso))
            .await
            .is_ok()
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_post_is_not_retried_on_500_but_is_on_595() {
    let sim = sim().await;
    let mirror = serve_files(&[("/c.iso", ISO)]).await;
    let client = pinned(&sim);
    let download = DownloadUrl::new(ContentType::Iso, format!("http://{mirror}/c.iso"), "c.iso");
    let endpoint = "/nodes/{node}/storage/{storage}/download-url";

    sim.control()
        .fail_requests(HttpFault {
            pattern: "/download-url$".into(),
            method: Some("POST".into()),
            status: 500,
            message: Some("got an ambiguous error".into()),
            times: Some(1),
            probability: None,
        })
        .unwrap();
    let err = client
        .download_url("pve1", "local", &download)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(500));
    assert_eq!(err.message(), Some("got an ambiguous error"));
    assert_eq!(
        count(&sim, "POST", endpoint),
        1,
        "a POST answered 500 is not resent"
    );
    assert_eq!(client.writes_sent(), 1);

    // 595: the proxying node never reached pve1, so resending is safe.
    sim.control()
        .fail_requests(HttpFault {
            pattern: "/download-url$".into(),
            method: Some("POST".into()),
            status: 595,
            message: None,
            times: Some(1),
            probability: None,
        })
        .unwrap();
    let upid = client
        .download_url("pve1", "local", &download)
        .await
        .unwrap();
    assert_eq!(count(&sim, "POST", endpoint), 3);
    assert_eq!(client.writes_sent(), 3);
    wait_for_task(&client, &upid, &wait_opts(), &CancellationToken::new())
        .await
        .unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_post_answered_596_after_pve_acted_is_not_resent_and_is_an_unknown_outcome() {
    let sim = sim().await;
    let mirror = serve_files(&[("/d.iso", ISO)]).await;
    let client = pinned(&sim);
    let download = DownloadUrl::new(ContentType::Iso, format!("http://{mirror}/d.iso"), "d.iso");
    sim.control()
        .lose_answers(HttpFault {
            pattern: "/download-url$".into(),
            method: Some("POST".into()),
            status: 596,
            message: None,
            times: Some(1),
            probability: None,
        })
        .unwrap();
    let err = client
        .download_url("pve1", "local", &download)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(596));
    assert!(err.is_unknown_outcome(), "{err:?}");
    assert_eq!(
        count(&sim, "POST", "/nodes/{node}/storage/{storage}/download-url"),
        1,
        "PVE acted: sending it again would download twice"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn missing_objects_are_not_found_and_not_retried() {
    let sim = sim().await;
    let client = pinned(&sim);
    let err = client
        .execute(&request::qemu_config("pve1", 999, false))
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    assert_eq!(err.status(), Some(500));
    assert_eq!(
        count(&sim, "GET", "/nodes/{node}/qemu/{vmid}/config"),
        1,
        "not retried"
    );

    let unknown: proxops_pve::Upid =
        "UPID:pve1:00001234:00005678:6650A1B2:download:x.iso:root@pam:"
            .parse()
            .unwrap();
    let err = client.task_status("pve1", &unknown).await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    sim.shutdown().await;
}

#[tokio::test]
async fn parameter_errors_come_back_per_parameter() {
    let sim = sim().await;
    let client = pinned(&sim);
    let bad = DownloadUrl::new(ContentType::Iso, "http://127.0.0.1:1/x.txt", "x.txt");
    let err = client
        .download_url("pve1", "local", &bad)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(400), "{err:?}");
    assert_eq!(
        err.errors().unwrap().get("filename").map(String::as_str),
        Some("wrong file extension")
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn every_contract_read_the_simulator_implements_answers() {
    let sim = sim().await;
    let client = pinned(&sim);
    for req in [
        request::cluster_resources(Some(proxops_pve::ResourceType::Storage)),
        request::storages("pve1"),
        request::storage_status("pve1", "local"),
        request::node_status("pve1"),
        request::qemu_list("pve1"),
        request::lxc_list("pve1"),
        request::pools(None),
    ] {
        let answer = client.execute(&req).await;
        assert!(answer.is_ok(), "{req}: {answer:?}");
    }
    let storages = client.storages("pve1").await.unwrap();
    assert!(
        storages
            .iter()
            .any(|s| s.storage == "local" && s.has_content(ContentType::Import))
    );
    let resources = client
        .cluster_resources(Some(proxops_pve::ResourceType::Node))
        .await
        .unwrap();
    assert_eq!(resources.len(), 3);
    assert_eq!(client.writes_sent(), 0);
    sim.shutdown().await;
}

/// The simulator validates every request against PVE's schema (values too, not just names);
/// state errors (500, or 400 for the contract list's made-up UPID) are expected here.
#[tokio::test]
async fn no_contract_request_is_refused_by_the_simulator_schema_check() {
    let sim = sim().await;
    let client = pinned(&sim);
    let mut refused = Vec::new();
    for req in request::all_endpoints_for_contract() {
        if let Err(err) = client.execute(&req).await
            && err.status() == Some(400)
            && !err.is_not_found()
        {
            refused.push(err.to_string());
        }
    }
    assert!(refused.is_empty(), "{refused:#?}");
    sim.shutdown().await;
}

/// Whether the simulator logged `record` as a status GET of `upid`.
fn is_status_of(record: &proxops_pve_sim::RequestRecord, upid: &proxops_pve::Upid) -> bool {
    record.method == "GET"
        && record.endpoint == "/nodes/{node}/tasks/{upid}/status"
        && record.path.contains(upid.as_str())
}

/// Status GETs the simulator logged for one task.
fn status_polls(sim: &RunningSim, upid: &proxops_pve::Upid) -> usize {
    let log = sim.control().requests();
    log.requests
        .iter()
        .filter(|r| is_status_of(r, upid))
        .count()
}

#[tokio::test]
async fn a_task_wait_polls_once_per_step_and_never_after_the_task_ended() {
    let sim = sim().await;
    let mirror = serve_files(&[("/a.iso", ISO), ("/b.iso", ISO)]).await;
    let client = pinned(&sim);
    let download = |name: &str| {
        DownloadUrl::new(
            ContentType::Iso,
            format!("http://{mirror}/{name}"),
            name.to_owned(),
        )
    };
    assert_eq!(client.task_durations().expected("download"), None);
    let first = client
        .download_url("pve1", "local", &download("a.iso"))
        .await
        .unwrap();
    let status = wait_for_task(
        &client,
        &first,
        &WaitOptions::default(),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(status.is_success(), "{status:?}");
    let polls = status_polls(&sim, &first);
    assert!(polls >= 1, "{polls} status GETs");
    assert!(client.task_durations().expected("download").is_some());

    // While the client waits for a second task, nothing polls the first one any more.
    let second = client
        .download_url("pve1", "local", &download("b.iso"))
        .await
        .unwrap();
    wait_for_task(
        &client,
        &second,
        &WaitOptions::default(),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(status_polls(&sim, &second) >= 1);
    assert_eq!(status_polls(&sim, &first), polls);
    // Every status GET of the first task went out before the second task was created.
    let log = sim.control().requests();
    let created = log
        .requests
        .iter()
        .filter(|r| r.method == "POST" && r.endpoint.ends_with("/download-url"))
        .map(|r| r.seq)
        .max()
        .unwrap();
    assert!(
        log.requests
            .iter()
            .filter(|r| is_status_of(r, &first))
            .all(|r| r.seq < created)
    );
    sim.shutdown().await;
}
