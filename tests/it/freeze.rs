//! Issue 19, item 5, end to end: the real agent and CLI against the simulator. Frozen
//! (`proxops freeze`), or outside every allow window of `[[policy.window]]`, a pass sends
//! no write to PVE (the simulator's request log says so), still records the drift and
//! records the held action as skipped with the reason; every view says when the next write
//! is allowed. Unfrozen, or inside the window, the same drift is corrected.

use chrono::{Duration as Span, Timelike as _, Utc};

use crate::git_server::TestRepo;
use crate::invalid_head::{Setup, last_id, memory, nudge, pass_on, vm};
use crate::pve_api::Api;
use crate::sim::World;

fn memory_drift_open(drift: &serde_json::Value, name: &str) -> bool {
    drift["open"].as_array().is_some_and(|open| {
        open.iter()
            .any(|d| d["resource"] == format!("VM/{name}").as_str() && d["field"] == "memory")
    })
}

/// The actions of pass `id`, from `/api/v1/passes/{id}`.
async fn actions_of(setup: &Setup, id: i64) -> Vec<serde_json::Value> {
    let detail = setup.agent.get(&format!("/api/v1/passes/{id}")).await;
    detail["actions"].as_array().cloned().unwrap_or_default()
}

/// The sequence number of the last request the simulator logged.
fn last_seq(world: &World) -> u64 {
    world.requests().last().map_or(0, |r| r.seq)
}

/// Write requests the simulator saw after request `before`.
fn writes_since(world: &World, before: u64) -> Vec<String> {
    world
        .requests()
        .iter()
        .filter(|r| r.seq > before && r.method != "GET")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn frozen_no_write_reaches_pve_and_drift_is_reported_then_unfrozen_it_is_corrected() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let head = repo.commit_files(&[("vm/app.yaml", &vm("app", 141, "memory: 512MiB"))], "app");
    let setup = Setup::start(&world, &repo, "frozen", "").await;
    let agent = &setup.agent;
    let applied = agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(head.as_str()))
        .await;

    let out = agent
        .cli(&["freeze", "--for", "4h", "--reason", "storage migration"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("frozen until "),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Someone changes the VM behind ProxOps's back.
    Api::new(&world)
        .put("/nodes/pve1/qemu/141/config", &[("memory", "1024")])
        .await;
    let before = last_seq(&world);
    nudge(agent).await;
    let status = pass_on(agent, &head, last_id(&applied)).await;
    assert_eq!(
        writes_since(&world, before),
        Vec::<String>::new(),
        "a frozen agent wrote to PVE"
    );
    assert_eq!(memory(&world, 141).await, "1024");
    let drift = agent.get("/api/v1/drift").await;
    assert!(memory_drift_open(&drift, "app"), "{drift:#}");

    // The held update is recorded, with its risk and why it was not sent.
    let actions = actions_of(&setup, last_id(&status)).await;
    let update = actions
        .iter()
        .find(|a| a["verb"] == "update")
        .unwrap_or_else(|| panic!("no held update recorded: {actions:#?}"));
    assert_eq!(update["result"], "skipped", "{update:#}");
    assert_eq!(update["risk"], "risky", "{update:#}");
    let error = update["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("frozen by") && error.contains("storage migration"),
        "{error}"
    );

    // Every view says so, and when the next write is allowed.
    let writes = &status["writes"];
    assert_eq!(writes["allowed"], false, "{status:#}");
    assert_eq!(writes["frozen"]["reason"], "storage migration");
    assert!(writes["next_allowed"].is_string(), "{writes:#}");
    let go = agent.get("/status").await;
    assert_eq!(go["writes"]["allowed"], false, "{go:#}");
    let cli = agent.cli(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&cli.stdout);
    assert!(text.contains("FROZEN by "), "{text}");
    assert!(text.contains("next write allowed at "), "{text}");
    let (code, page) = agent.get_text("/ui").await;
    assert_eq!(code, 200);
    assert!(page.contains("id=\"flag-frozen\""), "{page}");

    let out = agent.cli(&["unfreeze"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = last_id(&status);
    nudge(agent).await;
    let status = pass_on(agent, &head, after).await;
    assert_eq!(status["last_attempted"]["outcome"], "applied", "{status:#}");
    assert_eq!(status["writes"]["allowed"], true, "{status:#}");
    assert_eq!(memory(&world, 141).await, "512");
}

#[tokio::test(flavor = "multi_thread")]
async fn outside_every_allow_window_no_write_reaches_pve_and_inside_one_the_drift_is_corrected() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let head = repo.commit_files(&[("vm/app.yaml", &vm("app", 142, "memory: 512MiB"))], "app");
    let mut setup = Setup::start(&world, &repo, "window", "").await;
    let applied = setup
        .agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(head.as_str()))
        .await;

    // An allow window that opens in two hours (UTC) for one hour: writes are held now. The
    // VM drifts while the agent is stopped, so its first pass after the restart sees it.
    setup.agent.terminate();
    Api::new(&world)
        .put("/nodes/pve1/qemu/142/config", &[("memory", "1024")])
        .await;
    let later = Utc::now() + Span::hours(2);
    setup.rewrite(&format!(
        "[[policy.window]]\nkind = \"allow\"\nschedule = \"{} {} * * *\"\nduration = \"1h\"\n",
        later.minute(),
        later.hour()
    ));
    let before = last_seq(&world);
    setup.agent.respawn();
    let agent = &setup.agent;
    let status = agent
        .wait_for(|s| {
            s["last_attempted"]["id"].as_i64() > Some(last_id(&applied))
                && s["last_attempted"]["outcome"].is_string()
        })
        .await;
    assert_eq!(
        writes_since(&world, before),
        Vec::<String>::new(),
        "an agent outside its allow window wrote to PVE"
    );
    assert_eq!(memory(&world, 142).await, "1024");
    assert!(memory_drift_open(&agent.get("/api/v1/drift").await, "app"));
    let writes = &status["writes"];
    assert_eq!(writes["allowed"], false, "{status:#}");
    assert!(
        writes["held"]
            .as_str()
            .is_some_and(|h| h.contains("outside every allow window")),
        "{writes:#}"
    );
    let next = writes["next_allowed"].as_str().unwrap_or_default();
    assert!(
        next.contains(&format!("T{:02}:{:02}:00Z", later.hour(), later.minute())),
        "{writes:#}"
    );
    let actions = actions_of(&setup, last_id(&status)).await;
    assert!(
        actions
            .iter()
            .any(|a| a["verb"] == "update" && a["result"] == "skipped"),
        "{actions:#?}"
    );

    // An allow window that opened a minute ago for an hour: the drift is corrected.
    let earlier = Utc::now() - Span::minutes(1);
    setup.rewrite(&format!(
        "[[policy.window]]\nkind = \"allow\"\nschedule = \"{} {} * * *\"\nduration = \"1h\"\n",
        earlier.minute(),
        earlier.hour()
    ));
    let after = last_id(&status);
    setup.agent.terminate();
    setup.agent.respawn();
    let status = setup
        .agent
        .wait_for(|s| {
            s["last_attempted"]["id"].as_i64() > Some(after)
                && s["last_attempted"]["outcome"].is_string()
        })
        .await;
    assert_eq!(status["last_attempted"]["outcome"], "applied", "{status:#}");
    assert_eq!(status["writes"]["allowed"], true, "{status:#}");
    assert_eq!(memory(&world, 142).await, "512");
}
