//! Issue 17, item 3, end to end: drift has a history in `/api/v1/drift`. Drift a pass
//! corrects is first seen and resolved by that pass (`corrected by pass N`); drift found in
//! report mode stays open, pass after pass, until it is resolved, here by the manifest
//! changing to what PVE has.

use crate::git_server::TestRepo;
use crate::invalid_head::{Setup, last_id, memory, nudge, pass_on, vm};
use crate::pve_api::Api;
use crate::sim::World;

fn memory_drift(list: &serde_json::Value, name: &str) -> Option<serde_json::Value> {
    list.as_array()?
        .iter()
        .find(|d| d["resource"] == format!("VM/{name}").as_str() && d["field"] == "memory")
        .cloned()
}

#[tokio::test(flavor = "multi_thread")]
async fn drift_a_pass_corrects_is_recorded_as_first_seen_and_resolved_by_that_pass() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let head = repo.commit_files(&[("vm/app.yaml", &vm("app", 140, "memory: 512MiB"))], "app");
    let setup = Setup::start(&world, &repo, "corrected", "").await;
    let agent = &setup.agent;
    let applied = agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(head.as_str()))
        .await;
    let drift = agent.get("/api/v1/drift").await;
    assert!(
        memory_drift(&drift["resolved"], "app").is_none(),
        "creating the VM is no drift: {drift:#}"
    );

    Api::new(&world)
        .put("/nodes/pve1/qemu/140/config", &[("memory", "1024")])
        .await;
    nudge(agent).await;
    let status = pass_on(agent, &head, last_id(&applied)).await;
    let pass = last_id(&status);
    assert_eq!(status["last_attempted"]["outcome"], "applied", "{status:#}");
    assert_eq!(memory(&world, 140).await, "512");

    let drift = agent.get("/api/v1/drift").await;
    assert!(memory_drift(&drift["open"], "app").is_none(), "{drift:#}");
    let corrected = memory_drift(&drift["resolved"], "app")
        .unwrap_or_else(|| panic!("the correction is not in the history: {drift:#}"));
    assert_eq!(
        corrected["resolved_how"],
        format!("corrected by pass {pass}")
    );
    assert_eq!(corrected["first_seen_pass"], pass);
    assert_eq!(corrected["last_seen_pass"], pass);
    assert_eq!(corrected["resolved_pass"], pass);
    assert_eq!(
        (
            corrected["desired"].as_str(),
            corrected["observed"].as_str()
        ),
        (Some("512"), Some("1024"))
    );
    assert!(corrected["first_seen_at"].is_string() && corrected["resolved_at"].is_string());

    // The pass's own detail lists the finding next to the update that corrected it.
    let detail = agent.get(&format!("/api/v1/passes/{pass}")).await;
    assert!(
        memory_drift(&detail["findings"], "app").is_some(),
        "{detail:#}"
    );
    let update = detail["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["verb"] == "update")
        .cloned()
        .unwrap_or_else(|| panic!("{detail:#}"));
    assert_eq!(update["result"], "succeeded");
    assert!(update["duration_ms"].is_u64(), "{update:#}");
    let (code, _) = agent.get_text("/api/v1/passes/999999").await;
    assert_eq!(code, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn drift_found_in_report_mode_stays_open_until_the_manifest_changes_to_match() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let first = repo.commit_files(
        &[("vm/cache.yaml", &vm("cache", 150, "memory: 512MiB"))],
        "cache",
    );
    let mut setup = Setup::start(&world, &repo, "reported", "").await;
    let applied = setup
        .agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(first.as_str()))
        .await;
    assert!(setup.agent.terminate().success());
    setup.rewrite("mode = \"report\"");
    Api::new(&world)
        .put("/nodes/pve1/qemu/150/config", &[("memory", "1024")])
        .await;
    setup.agent.respawn();
    let status = pass_on(&setup.agent, &first, last_id(&applied)).await;
    let opened = memory_drift(&setup.agent.get("/api/v1/drift").await["open"], "cache")
        .unwrap_or_else(|| panic!("not reported: {status:#}"));
    assert_eq!(opened["first_seen_pass"], last_id(&status));

    // Another pass: still open, the same record, seen again.
    nudge(&setup.agent).await;
    let again = pass_on(&setup.agent, &first, last_id(&status)).await;
    let still = memory_drift(&setup.agent.get("/api/v1/drift").await["open"], "cache")
        .unwrap_or_else(|| panic!("resolved without a change: {again:#}"));
    assert_eq!(still["first_seen_pass"], opened["first_seen_pass"]);
    assert_eq!(still["last_seen_pass"], last_id(&again));
    assert_eq!(
        memory(&world, 150).await,
        "1024",
        "report mode corrects nothing"
    );

    // The manifest is changed to what PVE has: resolved as such.
    let second = repo.commit_files(
        &[("vm/cache.yaml", &vm("cache", 150, "memory: 1GiB"))],
        "1 GiB",
    );
    nudge(&setup.agent).await;
    let changed = pass_on(&setup.agent, &second, last_id(&again)).await;
    let drift = setup.agent.get("/api/v1/drift").await;
    assert!(memory_drift(&drift["open"], "cache").is_none(), "{drift:#}");
    let resolved = memory_drift(&drift["resolved"], "cache").unwrap();
    assert_eq!(resolved["resolved_how"], "manifest changed", "{drift:#}");
    assert_eq!(resolved["resolution"], "manifest-changed");
    assert_eq!(resolved["resolved_pass"], last_id(&changed));
}
