//! Fault injection through the library handle and the `/_sim/` control API, and the
//! request log.

use std::time::{Duration, Instant};

use proxops_pve_sim::HttpFault;

use crate::sim;

#[tokio::test]
async fn a_storage_listing_fails_the_given_number_of_times() {
    let s = sim().await;
    s.sim
        .control()
        .fail_storage_listing("pve1", "local", 2, None);
    for _ in 0..2 {
        let r = s.get("/nodes/pve1/storage/local/content").await;
        assert_eq!(r.status, 500);
        assert_eq!(r.message(), "storage 'local' is not online\n");
    }
    assert_eq!(s.get("/nodes/pve1/storage/local/content").await.status, 200);
}

#[tokio::test]
async fn a_path_pattern_can_answer_595_a_number_of_times() {
    let s = sim().await;
    s.sim
        .control()
        .fail_requests(HttpFault {
            pattern: "^/nodes/pve2/".to_string(),
            method: None,
            status: 595,
            message: None,
            times: Some(1),
            probability: None,
        })
        .unwrap();
    let r = s.get("/nodes/pve2/qemu").await;
    assert_eq!(r.status, 595);
    assert_eq!(r.text, "");
    assert_eq!(s.get("/nodes/pve2/qemu").await.status, 200);
    assert_eq!(s.get("/nodes/pve1/qemu").await.status, 200);
}

#[tokio::test]
async fn the_control_api_injects_500s_with_a_message() {
    let s = sim().await;
    let root = s.base.trim_end_matches("/api2/json").to_string();
    let resp = s
        .client
        .post(format!("{root}/_sim/faults/http"))
        .json(&serde_json::json!({
            "pattern": "/qemu$", "method": "GET", "status": 500,
            "message": "boom", "times": 1
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let r = s.get("/nodes/pve1/qemu").await;
    assert_eq!((r.status, r.message()), (500, "boom\n"));
    assert_eq!(s.get("/nodes/pve1/qemu").await.status, 200);
}

#[tokio::test]
async fn a_probability_of_zero_never_fires() {
    let s = sim().await;
    s.sim
        .control()
        .fail_requests(HttpFault {
            pattern: ".*".to_string(),
            method: None,
            status: 500,
            message: None,
            times: None,
            probability: Some(0.0),
        })
        .unwrap();
    assert_eq!(s.get("/version").await.status, 200);
}

#[tokio::test]
async fn latency_delays_matching_requests() {
    let s = sim().await;
    s.sim
        .control()
        .add_latency(Some("^/version$"), Duration::from_millis(150))
        .unwrap();
    let t = Instant::now();
    s.get("/version").await;
    assert!(t.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn the_next_task_of_a_type_fails_with_the_given_message() {
    let s = sim().await;
    s.sim
        .control()
        .fail_next_task("qmcreate", "unable to create VM 100 - lvcreate failed");
    let upid = s.post("/nodes/pve1/qemu", &[("vmid", "100")]).await.upid();
    let status = s.wait(&upid).await;
    assert_eq!(
        status["exitstatus"],
        "unable to create VM 100 - lvcreate failed"
    );
    // The failed create leaves the vmid free.
    assert_eq!(s.get("/cluster/nextid").await.data(), "100");
    let log = s
        .get(&format!("/nodes/pve1/tasks/{}/log", crate::encode(&upid)))
        .await;
    let last = log.data().as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        last["t"],
        "TASK ERROR: unable to create VM 100 - lvcreate failed"
    );
}

#[tokio::test]
async fn a_lock_timeout_fails_config_writes() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    s.sim.control().time_out_lock(100, 1);
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("cores", "2")])
        .await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.message(),
        "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout\n"
    );
    assert_eq!(
        s.put("/nodes/pve1/qemu/100/config", &[("cores", "2")])
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn the_request_log_counts_requests_per_endpoint() {
    let s = sim().await;
    s.create_vm("100", &[]).await;
    s.config("100").await;
    s.config("100").await;
    let log = s.sim.control().requests();
    assert_eq!(log.counters["GET /nodes/{node}/qemu/{vmid}/config"], 2);
    assert_eq!(log.counters["POST /nodes/{node}/qemu"], 1);
    let root = s.base.trim_end_matches("/api2/json").to_string();
    let body: serde_json::Value = s
        .client
        .get(format!("{root}/_sim/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let first = &body["requests"][0];
    assert_eq!(first["method"], "POST");
    assert_eq!(first["path"], "/nodes/pve1/qemu");
    assert_eq!(first["user"], "root@pam!proxops");
    assert_eq!(body["counters"]["GET /nodes/{node}/qemu/{vmid}/config"], 2);
}

#[tokio::test]
async fn the_control_api_fails_storage_listings_and_clears_faults() {
    let s = sim().await;
    let root = s.base.trim_end_matches("/api2/json").to_string();
    let resp = s
        .client
        .post(format!("{root}/_sim/faults/storage-listing"))
        .json(
            &serde_json::json!({"node": "pve1", "storage": "local", "times": 5,
            "message": "unable to activate storage 'local'"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let r = s.get("/nodes/pve1/storage/local/content").await;
    assert_eq!(r.message(), "unable to activate storage 'local'\n");
    s.client
        .delete(format!("{root}/_sim/faults"))
        .send()
        .await
        .unwrap();
    assert_eq!(s.get("/nodes/pve1/storage/local/content").await.status, 200);
    let bad = s
        .client
        .post(format!("{root}/_sim/faults/http"))
        .json(&serde_json::json!({"pattern": "(", "status": 500}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn a_download_task_can_be_made_to_fail() {
    let s = sim().await;
    s.sim
        .control()
        .fail_next_task("download", "download failed: exit code 4");
    let base = crate::file_server(vec![("/a.iso", vec![1])]).await;
    let url = format!("{base}/a.iso");
    let upid = s
        .post(
            "/nodes/pve1/storage/local/download-url",
            &[("url", &url), ("filename", "a.iso"), ("content", "iso")],
        )
        .await
        .upid();
    let status = s.wait(&upid).await;
    assert_eq!(status["exitstatus"], "download failed: exit code 4");
}

#[tokio::test]
async fn an_injected_warnings_status_still_does_the_work() {
    let s = sim().await;
    s.sim.control().fail_next_task("qmcreate", "WARNINGS: 1");
    let upid = s.post("/nodes/pve1/qemu", &[("vmid", "100")]).await.upid();
    let status = s.wait(&upid).await;
    assert_eq!(status["exitstatus"], "WARNINGS: 1");
    let cfg = s.config("100").await;
    assert!(cfg.get("lock").is_none());
    let log = s
        .get(&format!("/nodes/pve1/tasks/{}/log", crate::encode(&upid)))
        .await;
    let last = log.data().as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["t"], "TASK WARNINGS: 1");
}

#[tokio::test]
async fn a_path_pattern_can_answer_403() {
    let s = sim().await;
    s.sim
        .control()
        .fail_requests(HttpFault {
            pattern: "/config$".to_string(),
            method: Some("PUT".to_string()),
            status: 403,
            message: Some("Permission check failed (/vms/100, VM.Config.Memory)".to_string()),
            times: Some(1),
            probability: None,
        })
        .unwrap();
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("memory", "1")])
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.message(),
        "Permission check failed (/vms/100, VM.Config.Memory)\n"
    );
}

#[tokio::test]
async fn a_lost_answer_lets_pve_act_but_answers_595() {
    let s = sim().await;
    s.sim
        .control()
        .lose_answers(HttpFault {
            pattern: "^/nodes/pve1/qemu$".to_string(),
            method: Some("POST".to_string()),
            status: 595,
            message: None,
            times: Some(1),
            probability: None,
        })
        .unwrap();
    let r = s
        .post("/nodes/pve1/qemu", &[("vmid", "4242"), ("memory", "512")])
        .await;
    assert_eq!(r.status, 595);
    assert_eq!(r.text, "");
    // The create ran: the vmid is taken, and a second create is refused as PVE refuses it.
    assert_eq!(s.get("/nodes/pve1/qemu/4242/config").await.status, 200);
    let again = s
        .post("/nodes/pve1/qemu", &[("vmid", "4242"), ("memory", "512")])
        .await;
    assert_eq!(again.status, 500, "{}", again.text);
}
