//! Guard rails (issue 8 item 4) end to end, with the built agent as a child process, a real
//! git daemon and the simulator's fault injection: a git remote that cannot be fetched leaves
//! the last good revision in force and marks the desired state stale; a force-push is
//! recorded; a failing `/cluster/resources` aborts the pass before any write; the write
//! circuit breaker goes read-only, probes, and closes; SIGHUP reloads the configuration.

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use proxops_pve_sim::HttpFault;

use crate::agent::{commit_of, start_agent};
use crate::git_server::{TestRepo, git};
use crate::sim::{World, artifact};
use crate::support::agent::AgentProcess;

const ISO: &[u8] = b"installer bytes";

fn iso(world: &World, name: &str) -> String {
    artifact(
        "ISO",
        name,
        &["pve1"],
        &format!("{name}.iso"),
        &format!("{}/{name}.iso", world.files_url),
        None,
    )
}

async fn text(agent: &AgentProcess, path: &str) -> String {
    agent.get_text(path).await.1
}

/// Waits (at most 20 s) until `/api/v1/revisions` holds a pass for which `found` holds.
async fn wait_for_pass(
    agent: &AgentProcess,
    what: &str,
    found: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // A restarted agent may not listen yet.
        let passes = agent
            .try_get("/api/v1/revisions?limit=1000")
            .await
            .unwrap_or_else(|| serde_json::Value::Array(Vec::new()));
        if let Some(pass) = passes.as_array().unwrap().iter().find(|p| found(p)) {
            return pass.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no pass {what}: {passes:#}\nagent log:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `git daemon` serving `base` on `port` again (the fixture picks a new port each start).
fn git_daemon_on(base: &std::path::Path, port: u16) -> Child {
    let exec_path = git(base, &["--exec-path"]);
    let child = Command::new(std::path::Path::new(&exec_path).join("git-daemon"))
        .current_dir(base)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args(["--reuseaddr", "--export-all", "--listen=127.0.0.1"])
        .arg(format!("--port={port}"))
        .arg(format!("--base-path={}", base.display()))
        .arg(base)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
        assert!(Instant::now() < deadline, "git daemon did not come back");
        #[allow(
            clippy::disallowed_methods,
            reason = "a synchronous helper; a 50 ms nap of one test thread is harmless"
        )]
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn cli_text(agent: &AgentProcess, command: &str) -> String {
    let out = agent.cli(&[command]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_remote_or_deleted_branch_keeps_the_last_good_revision_and_marks_it_stale_until_a_good_fetch()
 {
    let world = World::start(&[("a.iso", ISO), ("b.iso", ISO)]).await;
    let repo = TestRepo::new();
    let good = repo.commit_files(&[("iso/a.yaml", &iso(&world, "a"))], "one ISO");
    let (mut agent, daemon) = start_agent(&world, &repo, |t| t.poll("1s")).await;
    agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(good.as_str()))
        .await;
    let port = daemon.port();

    // The git server stops: the agent keeps the last good revision in force, stale.
    drop(daemon);
    let status = agent.wait_for(|s| s["desired_stale"] == true).await;
    assert!(
        status["last_error"].as_str().unwrap().contains("127.0.0.1"),
        "{status}"
    );
    assert_eq!(
        commit_of(&status, "last_applied").as_deref(),
        Some(good.as_str())
    );
    let stale = wait_for_pass(&agent, "recorded stale", |p| {
        p["desired_stale"] == true && p["outcome"].is_string()
    })
    .await;
    assert_eq!(stale["commit"].as_str(), Some(good.as_str()), "{stale}");
    assert!(stale["source_error"].is_string(), "{stale}");
    assert_eq!(
        stale["outcome"], "no-change",
        "PVE still matches the last good revision"
    );
    assert!(
        text(&agent, "/metrics")
            .await
            .contains("proxops_desired_stale 1")
    );
    assert_eq!(
        agent.get("/status").await["last_cycle"]["desired_stale"],
        true
    );
    assert!(cli_text(&agent, "status").contains("DESIRED STATE IS STALE"));

    // Restarted while the remote is still down: the mirror's last good revision stays in
    // force (nothing rolled back, nothing failed).
    let before = agent.get("/api/v1/revisions?limit=1").await[0]["id"]
        .as_i64()
        .unwrap();
    assert!(agent.terminate().success());
    agent.respawn();
    let after = wait_for_pass(&agent, "stale after a restart", |p| {
        p["id"].as_i64().unwrap() > before && p["outcome"].is_string()
    })
    .await;
    assert_eq!(after["commit"].as_str(), Some(good.as_str()), "{after}");
    assert_eq!(after["desired_stale"], true, "{after}");
    assert_eq!(after["outcome"], "no-change", "{after}");

    // It comes back: the next fetch clears the mark.
    let mut daemon = git_daemon_on(repo.root(), port);
    let status = agent.wait_for(|s| s["desired_stale"] == false).await;
    assert!(status["last_error"].is_null(), "{status}");
    assert!(
        text(&agent, "/metrics")
            .await
            .contains("proxops_desired_stale 0")
    );

    // The branch is deleted: the same guard rail, then a push restores it.
    repo.delete_remote_branch("main");
    let status = agent.wait_for(|s| s["desired_stale"] == true).await;
    assert!(
        status["last_error"].as_str().unwrap().contains("main"),
        "{status}"
    );
    let newer = repo.commit_files(&[("iso/b.yaml", &iso(&world, "b"))], "another ISO");
    let status = agent
        .wait_for(|s| {
            s["desired_stale"] == false
                && commit_of(s, "last_applied").as_deref() == Some(newer.as_str())
        })
        .await;
    assert!(status["last_error"].is_null());

    // Without the agent, `proxops status` reads the same from the database.
    assert!(agent.terminate().success());
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let status = agent.cli_json("status");
    assert_eq!(status["desired_stale"], false, "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_force_pushed_branch_is_followed_and_recorded_on_the_pass_the_api_and_status() {
    let world = World::start(&[("a.iso", ISO), ("b.iso", ISO)]).await;
    let repo = TestRepo::new();
    let base = repo.commit_files(&[("iso/a.yaml", &iso(&world, "a"))], "one ISO");
    let abandoned = repo.commit_files(&[("iso/b.yaml", &iso(&world, "b"))], "to be rewritten");
    let (mut agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s")).await;
    agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(abandoned.as_str()))
        .await;

    repo.reset_hard(&base);
    repo.write("iso/b.yaml", iso(&world, "b"));
    let rewritten = repo.commit("rewritten history");
    repo.force_push();
    let pass = wait_for_pass(&agent, "force-pushed", |p| p["force_pushed"] == true).await;
    assert_eq!(pass["commit"].as_str(), Some(rewritten.as_str()), "{pass}");
    assert_eq!(pass["previous_commit"].as_str(), Some(abandoned.as_str()));
    let status = agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(rewritten.as_str()))
        .await;
    assert_eq!(
        status["last_force_push"]["commit"].as_str(),
        Some(rewritten.as_str()),
        "{status}"
    );
    let human = cli_text(&agent, "status");
    assert!(
        human.contains(&format!(
            "last force-push: {rewritten} replaced {abandoned}"
        )),
        "{human}"
    );
    // Later passes on the same commit are not force-pushes.
    let later = wait_for_pass(&agent, "after the force-push", |p| {
        p["commit"].as_str() == Some(rewritten.as_str())
            && p["force_pushed"] == false
            && p["outcome"].is_string()
    })
    .await;
    assert_eq!(later["previous_commit"].as_str(), Some(rewritten.as_str()));
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_cluster_resources_listing_aborts_the_pass_before_any_write() {
    let world = World::start(&[("a.iso", ISO)]).await;
    world
        .sim
        .control()
        .fail_requests(HttpFault {
            pattern: "^/cluster/resources$".into(),
            method: Some("GET".into()),
            status: 500,
            message: Some("cluster filesystem not ready".into()),
            times: None,
            probability: None,
        })
        .unwrap();
    let repo = TestRepo::new();
    let vm = "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata: {name: web-1}\nspec:\n  node: pve1\n  vmid: 101\n  state: stopped\n  memory: 512MiB\n  cpu: {type: host, cores: 1}\n  disks: [{storage: local-lvm, size: 1GiB}]\n  networks: [{bridge: vmbr0}]\n";
    let commit = repo.commit_files(
        &[("iso/a.yaml", &iso(&world, "a")), ("vm/web-1.yaml", vm)],
        "an ISO and a VM",
    );
    let (mut agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s")).await;
    let failed = wait_for_pass(&agent, "failed", |p| p["outcome"] == "failed").await;
    assert_eq!(failed["commit"].as_str(), Some(commit.as_str()));
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("listing the cluster's guests failed"),
        "{error}"
    );
    assert!(error.contains("cluster filesystem not ready"), "{error}");
    assert_eq!(failed["actions_ok"], 0);
    assert!(
        world.writes().is_empty(),
        "not even the ISO download, which does not need the listing: {:?}",
        world.writes()
    );
    let go = agent.get("/status").await;
    assert_eq!(go["last_cycle"]["aborted"], true, "{go}");
    assert!(cli_text(&agent, "status").contains("listing the cluster's guests failed"));

    // The listing recovers: the next pass applies.
    world.sim.control().clear_faults();
    agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(commit.as_str()))
        .await;
    assert!(!world.writes().is_empty());
    assert!(agent.terminate().success());
}

fn download_posts(world: &World) -> u64 {
    world
        .writes()
        .iter()
        .filter(|r| r.endpoint.ends_with("/download-url"))
        .count() as u64
}

fn passes(agent_revisions: &serde_json::Value) -> Vec<serde_json::Value> {
    agent_revisions.as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn consecutive_failed_writes_open_the_breaker_read_only_then_a_probe_closes_it() {
    let world = World::start(&[("a.iso", ISO), ("b.iso", ISO), ("c.iso", ISO)]).await;
    let control = world.sim.control();
    control
        .fail_requests(HttpFault {
            pattern: "/download-url$".into(),
            method: Some("POST".into()),
            status: 500,
            message: Some("storage write refused".into()),
            times: None,
            probability: None,
        })
        .unwrap();
    let repo = TestRepo::new();
    let commit = repo.commit_files(
        &[
            ("iso/a.yaml", &iso(&world, "a")),
            ("iso/b.yaml", &iso(&world, "b")),
            ("iso/c.yaml", &iso(&world, "c")),
        ],
        "three ISOs",
    );
    let (mut agent, _daemon) = start_agent(&world, &repo, |t| {
        t.poll("1s")
            .policy("write_breaker_threshold = 2\nwrite_breaker_cool_down = \"4s\"\n")
    })
    .await;

    // Three failed downloads in the first pass open it (threshold 2).
    let status = agent
        .wait_for(|s| s["write_breaker"]["state"] == "open")
        .await;
    assert_eq!(status["read_only"], true, "{status}");
    assert!(status["write_breaker"]["open_until"].is_string());
    assert!(
        text(&agent, "/metrics")
            .await
            .contains("proxops_read_only 1")
    );
    assert_eq!(agent.get("/status").await["last_cycle"]["read_only"], true);
    // Read-only passes still observe, plan and record; they write nothing.
    let open = wait_for_pass(&agent, "read-only", |p| {
        p["write_breaker"] == "open" && p["outcome"].is_string()
    })
    .await;
    assert_eq!(open["actions_skipped"], 3, "{open}");
    assert_eq!(
        open["actions_ok"].as_u64().unwrap() + open["actions_failed"].as_u64().unwrap(),
        0
    );
    assert!(
        open["error"].as_str().unwrap().contains("read-only until"),
        "{open}"
    );
    assert!(cli_text(&agent, "status").contains("READ-ONLY: write circuit breaker"));

    // After the cool-down one probe write; it fails while PVE still refuses.
    let probe = wait_for_pass(&agent, "probing", |p| {
        p["write_breaker"] == "half-open" && p["outcome"].is_string()
    })
    .await;
    assert_eq!(probe["actions_failed"], 1, "{probe}");
    assert_eq!(probe["actions_skipped"], 2, "{probe}");

    // PVE recovers: the next probe succeeds, closes the breaker, and the rest follows.
    control.clear_faults();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status = agent.get("/api/v1/status").await;
        if commit_of(&status, "last_applied").as_deref() == Some(commit.as_str()) {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "never applied after recovery: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status["write_breaker"]["state"], "closed", "{status}");
    assert_eq!(status["read_only"], false);
    assert!(
        text(&agent, "/metrics")
            .await
            .contains("proxops_read_only 0")
    );
    let revisions = agent.get("/api/v1/revisions?limit=1000").await;
    assert!(agent.terminate().success());

    // The records match the simulator's log: every download POST is an action that
    // succeeded or failed, none in a read-only pass, at most one in a probing pass.
    let all = passes(&revisions);
    let mut recorded = 0;
    for pass in &all {
        let written =
            pass["actions_ok"].as_u64().unwrap() + pass["actions_failed"].as_u64().unwrap();
        match pass["write_breaker"].as_str() {
            Some("open") => assert_eq!(written, 0, "{pass}"),
            Some("half-open") => assert!(written <= 1, "{pass}"),
            _ => {}
        }
        recorded += written;
    }
    assert_eq!(recorded, download_posts(&world), "{all:#?}");
    assert!(
        all.iter()
            .any(|p| p["write_breaker"] == "half-open" && p["actions_ok"] == 1)
    );
}

fn vm(name: &str, vmid: u32, extra: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata: {{name: {name}}}\nspec:\n  node: pve1\n  \
         vmid: {vmid}\n  state: stopped\n  memory: 512MiB\n  cpu: {{type: host, cores: 1}}\n  \
         disks: [{{storage: local-lvm, size: 1GiB}}]\n  networks: [{{bridge: vmbr0}}]\n{extra}"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_breaker_that_opens_during_a_pass_holds_back_the_later_levels() {
    let world = World::start(&[("a.iso", ISO)]).await;
    world
        .sim
        .control()
        .fail_requests(HttpFault {
            pattern: "^/nodes/pve1/qemu$".into(),
            method: Some("POST".into()),
            status: 500,
            message: Some("storage 'local-lvm' is not online".into()),
            times: None,
            probability: None,
        })
        .unwrap();
    let repo = TestRepo::new();
    // Level 0: the ISO (its download succeeds) and three VMs whose creates fail; level 1: a
    // VM that boots the ISO, so it waits for level 0.
    let files = [
        ("iso/a.yaml".to_owned(), iso(&world, "a")),
        ("vm/v1.yaml".to_owned(), vm("v1", 101, "")),
        ("vm/v2.yaml".to_owned(), vm("v2", 102, "")),
        ("vm/v3.yaml".to_owned(), vm("v3", 103, "")),
        (
            "vm/v4.yaml".to_owned(),
            vm("v4", 104, "  hardware:\n    cdrom: {iso: a}\n"),
        ),
    ];
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    repo.commit_files(&files, "an ISO and four VMs");
    let (mut agent, _daemon) = start_agent(&world, &repo, |t| {
        t.policy("write_breaker_threshold = 2\nwrite_breaker_cool_down = \"1h\"\n")
    })
    .await;
    let first = wait_for_pass(&agent, "finished", |p| p["outcome"].is_string()).await;
    assert_eq!(first["outcome"], "failed", "{first}");
    assert_eq!(first["actions_ok"], 1, "the ISO download: {first}");
    assert_eq!(first["actions_failed"], 3, "the level-0 creates: {first}");
    assert_eq!(first["actions_skipped"], 1, "v4, in level 1: {first}");
    assert!(
        first["error"]
            .as_str()
            .unwrap()
            .contains("opened during the pass"),
        "{first}"
    );
    let creates: Vec<String> = world
        .writes()
        .into_iter()
        .filter(|r| r.path == "/nodes/pve1/qemu")
        .map(|r| r.params.get("vmid").cloned().unwrap_or_default())
        .collect();
    assert_eq!(creates.len(), 3, "v4 was never sent: {creates:?}");
    assert!(!creates.contains(&"104".to_owned()), "{creates:?}");
    assert_eq!(agent.get("/api/v1/status").await["read_only"], true);
    let go = agent.get("/status").await["last_cycle"].clone();
    assert_eq!(go["aborted"], false, "held back is not aborted: {go}");
    assert!(
        go["writes_held_back"]
            .as_str()
            .unwrap()
            .contains("opened during the pass"),
        "{go}"
    );
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_the_config_and_a_config_that_does_not_parse_keeps_the_old_one() {
    let world = World::start(&[("a.iso", ISO)]).await;
    let repo = TestRepo::new();
    let commit = repo.commit_files(&[("iso/a.yaml", &iso(&world, "a"))], "one ISO");
    let (mut agent, _daemon) = start_agent(&world, &repo, |t| t).await;
    agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(commit.as_str()))
        .await;

    // Poll every hour → every second, by SIGHUP.
    let original = std::fs::read_to_string(&agent.config).unwrap();
    assert!(original.contains("poll = \"1h\""));
    std::fs::write(
        &agent.config,
        original.replace("poll = \"1h\"", "poll = \"1s\""),
    )
    .unwrap();
    agent.hup();
    wait_for_pass(&agent, "triggered by the signal", |p| {
        p["trigger"] == "signal"
    })
    .await;
    // A pass is listed from its start: wait for one that has ended.
    let polls = wait_for_pass(&agent, "polled after the reload", |p| {
        p["trigger"] == "poll" && !p["outcome"].is_null()
    })
    .await;
    assert!(polls["outcome"].is_string());

    // A broken config is refused on reload, with the reason logged; the 1 s poll goes on.
    std::fs::write(&agent.config, "node = \"pve1\"\n[source\n").unwrap();
    agent.hup();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = agent.log_text();
        if log.contains("reload failed; keeping the previous configuration") {
            assert!(log.contains(&agent.config.display().to_string()), "{log}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no reload failure logged:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let count = agent
        .get("/api/v1/revisions?limit=1000")
        .await
        .as_array()
        .unwrap()
        .len();
    let deadline = Instant::now() + Duration::from_secs(20);
    while agent
        .get("/api/v1/revisions?limit=1000")
        .await
        .as_array()
        .unwrap()
        .len()
        < count + 2
    {
        assert!(
            Instant::now() < deadline,
            "polling stopped after a bad reload"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(agent.terminate().success());
}
