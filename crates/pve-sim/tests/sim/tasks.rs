//! UPIDs, task status, task log, task lists.

use std::time::Duration;

use proxops_pve_sim::SimConfig;

use crate::{encode, sim, sim_with};

#[tokio::test]
async fn upids_follow_pves_format_with_the_token_as_user() {
    let s = sim().await;
    let upid = s.post("/nodes/pve1/qemu", &[("vmid", "100")]).await.upid();
    let re = regex::Regex::new(
        r"^UPID:pve1:[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:qmcreate:100:root@pam!proxops:$",
    )
    .unwrap();
    assert!(re.is_match(&upid), "{upid}");
}

#[tokio::test]
async fn tasks_run_for_the_configured_time_then_stop_with_ok() {
    let s = sim().await;
    let upid = s.post("/nodes/pve1/qemu", &[("vmid", "100")]).await.upid();
    let path = format!("/nodes/pve1/tasks/{}/status", encode(&upid));
    let first = s.get(&path).await;
    assert_eq!(first.data()["status"], "running");
    assert!(first.data().get("exitstatus").is_none());
    assert_eq!(first.data()["user"], "root@pam");
    assert_eq!(first.data()["tokenid"], "proxops");
    assert_eq!(first.data()["type"], "qmcreate");
    assert_eq!(first.data()["id"], "100");
    let done = s.wait(&upid).await;
    assert_eq!(done["exitstatus"], "OK");
}

#[tokio::test]
async fn a_zero_task_duration_finishes_tasks_inside_the_request() {
    let s = sim_with(SimConfig {
        tls: false,
        task_duration: Duration::ZERO,
        ..SimConfig::default()
    })
    .await;
    let upid = s.post("/nodes/pve1/qemu", &[("vmid", "100")]).await.upid();
    let r = s
        .get(&format!("/nodes/pve1/tasks/{}/status", encode(&upid)))
        .await;
    assert_eq!(r.data()["status"], "stopped");
}

#[tokio::test]
async fn the_task_log_ends_with_task_ok_and_counts_lines() {
    let s = sim().await;
    let upid = s.post("/nodes/pve1/qemu", &[("vmid", "100")]).await.upid();
    s.wait_ok(&upid).await;
    let r = s
        .get(&format!("/nodes/pve1/tasks/{}/log", encode(&upid)))
        .await;
    let lines = r.data().as_array().unwrap();
    assert_eq!(lines.last().unwrap()["t"], "TASK OK");
    assert_eq!(lines[0]["n"], 1);
    assert_eq!(r.body["total"], lines.len());
}

#[tokio::test]
async fn unknown_and_malformed_upids_are_400s() {
    let s = sim().await;
    let r = s.get("/nodes/pve1/tasks/nonsense/status").await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error("upid"), "unable to parse worker upid");
    let fake = "UPID:pve1:00001234:00001234:6650A1B2:qmcreate:100:root@pam:";
    let r = s
        .get(&format!("/nodes/pve1/tasks/{}/status", encode(fake)))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error("upid"), "no such task");
}

#[tokio::test]
async fn the_task_list_shows_finished_tasks_by_default_and_running_ones_on_request() {
    let s = sim().await;
    let upid = s.post("/nodes/pve1/qemu", &[("vmid", "100")]).await.upid();
    let archive = s.get("/nodes/pve1/tasks").await;
    assert_eq!(archive.body["total"], 0);
    let active = s.get_q("/nodes/pve1/tasks", &[("source", "active")]).await;
    assert_eq!(active.data()[0]["status"], "RUNNING");
    s.wait_ok(&upid).await;
    let archive = s.get("/nodes/pve1/tasks").await;
    assert_eq!(archive.data()[0]["upid"], upid.as_str());
    assert_eq!(archive.data()[0]["status"], "OK");
    assert!(archive.data()[0]["endtime"].is_u64());
    let cluster = s.get("/cluster/tasks").await;
    assert_eq!(cluster.data()[0]["upid"], upid.as_str());
}

#[tokio::test]
async fn a_token_id_as_userfilter_matches_running_tasks_but_no_finished_one_as_pve_splits_archived_tasks()
 {
    let s = sim().await;
    let upid = s.post("/nodes/pve1/qemu", &[("vmid", "100")]).await.upid();
    let by = |filter: &'static str| {
        let s = &s;
        async move {
            s.get_q(
                "/nodes/pve1/tasks",
                &[("source", "all"), ("userfilter", filter)],
            )
            .await
            .body["total"]
                .clone()
        }
    };
    // Running: the `active` file's entry is not split, the token id matches.
    assert_eq!(by("root@pam!proxops").await, 1);
    assert_eq!(by("ROOT@pam").await, 1, "case-insensitive substring");
    s.wait_ok(&upid).await;
    // Finished: `user` is `root@pam` and `tokenid` is `proxops`, so only the user matches.
    assert_eq!(by("root@pam!proxops").await, 0);
    assert_eq!(by("root@pam").await, 1);
    let list = s
        .get_q("/nodes/pve1/tasks", &[("userfilter", "root@pam")])
        .await;
    assert_eq!(list.data()[0]["user"], "root@pam");
    assert_eq!(list.data()[0]["tokenid"], "proxops");
}

#[tokio::test]
async fn each_task_type_runs_for_its_own_duration_and_others_for_the_common_one() {
    let s = sim_with(SimConfig {
        tls: false,
        task_duration: Duration::from_millis(20),
        task_durations: [("qmstart".to_owned(), Duration::from_millis(600))].into(),
        ..SimConfig::default()
    })
    .await;
    s.create_vm("100", &[]).await;
    // A 600 ms start and a 20 ms create begun together: the create ends while the start
    // still runs (an order, not a wall-clock bound).
    let start = s
        .post("/nodes/pve1/qemu/100/status/start", &[])
        .await
        .upid();
    let create = s.post("/nodes/pve1/qemu", &[("vmid", "101")]).await.upid();
    s.wait_ok(&create).await;
    let path = format!("/nodes/pve1/tasks/{}/status", encode(&start));
    let running = s.get(&path).await;
    assert_eq!(running.data()["status"], "running", "qmstart: {running:?}");
    s.wait_ok(&start).await;
}
