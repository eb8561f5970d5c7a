//! Issue 18 items 1, 2 and 5 end to end: the agent binary following a real git repository
//! (git daemon) against the simulator, with `[forge]` pointing at the test forge
//! (tests/it/support/forge.rs), which checks every call against the forge's own published
//! API description (GitHub, Gitea or Forgejo, vendored verbatim in tests/forge/) and records
//! it.

use crate::agent::start_agent;
use crate::git_server::TestRepo;
use crate::sim::World;
use crate::support::forge::{Api, Call, TestForge};
use crate::support::notify::{Receiver, free_port};

const TOKEN: &str = "forge-token-3f9c1e-never-logged";

fn vm(name: &str, vmid: u32, memory_line: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: {name}\nspec:\n  node: pve1\n  vmid: {vmid}\n  state: stopped\n  {memory_line}\n  cpu: {{type: host, cores: 1}}\n  disks: [{{storage: local-lvm, size: 1GiB}}]\n  networks: [{{bridge: vmbr0}}]\n"
    )
}

/// `[forge]` for `forge` (or `api_url`), the token in a file of the world's directory.
fn forge_toml(world: &World, kind: &str, api_url: &str) -> String {
    let token = world.dir.path().join("forge-token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    format!(
        "\n[forge]\nkind = \"{kind}\"\napi_url = \"{api_url}\"\nrepo = \"ops/proxmox\"\ntoken_file = {}\npublic_url = \"https://proxops.example:9494\"\n",
        toml::Value::String(token.display().to_string())
    )
}

fn for_commit<'a>(calls: &'a [Call], sha: &str) -> Vec<&'a Call> {
    calls.iter().filter(|c| c.sha() == sha).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_push_is_pending_then_success_a_typo_is_error_and_a_failed_action_is_failure_on_gitea() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let first = repo.commit_files(
        &[("vm/web-1.yaml", &vm("web-1", 101, "memory: 512MiB"))],
        "web-1",
    );
    let forge = TestForge::start(Api::Gitea, TOKEN).await;
    let section = forge_toml(&world, "gitea", &forge.api_url());
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s").raw(&section)).await;
    let log = || agent.log_text();

    let success = forge
        .wait_for(
            "success",
            |c| c.sha() == first && c.state() == "success",
            log,
        )
        .await;
    let calls = forge.accepted();
    let states: Vec<&str> = for_commit(&calls, &first)
        .iter()
        .map(|c| c.state())
        .collect();
    assert_eq!(
        states,
        ["pending", "success"],
        "one pending, then success, nothing repeated"
    );
    assert_eq!(success.method, "POST");
    assert_eq!(
        success.operation, "repoCreateStatus",
        "Gitea's operation, from its description"
    );
    assert_eq!(
        success.path,
        format!("/api/v1/repos/ops/proxmox/statuses/{first}")
    );
    assert_eq!(success.authorization, format!("token {TOKEN}"));
    assert_eq!(
        success.body["context"], "proxops/default/pve1",
        "the context names the node"
    );
    let target = success.body["target_url"].as_str().unwrap();
    let pass_id = target
        .strip_prefix("https://proxops.example:9494/ui/passes/")
        .unwrap_or_else(|| panic!("target_url {target}"));
    let passes = agent.get("/api/v1/revisions?limit=1000").await;
    let pass = passes
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"].as_i64().map(|id| id.to_string()).as_deref() == Some(pass_id))
        .unwrap_or_else(|| panic!("no pass {pass_id} in {passes}"));
    assert_eq!(
        pass["commit"],
        first.as_str(),
        "target_url names the pass that applied it"
    );

    // A typo: `error` with the first diagnostic, at most 140 characters.
    let bad = repo.commit_files(
        &[("vm/web-1.yaml", &vm("web-1", 101, "memroy: 512MiB"))],
        "typo",
    );
    let error = forge
        .wait_for("error", |c| c.sha() == bad && c.state() == "error", log)
        .await;
    assert!(
        error.description().contains("vm/web-1.yaml"),
        "{}",
        error.description()
    );
    assert!(
        error
            .description()
            .contains("spec.memory: missing required field"),
        "{}",
        error.description()
    );
    assert!(error.description().chars().count() <= 140);

    // A failed action: `failure`, naming how many and the first.
    world
        .sim
        .control()
        .fail_next_task("qmcreate", "injected: no space left");
    let broken = repo.commit_files(
        &[
            ("vm/web-1.yaml", &vm("web-1", 101, "memory: 512MiB")),
            ("vm/web-2.yaml", &vm("web-2", 102, "memory: 512MiB")),
        ],
        "web-2",
    );
    let failure = forge
        .wait_for(
            "failure",
            |c| c.sha() == broken && c.state() == "failure",
            log,
        )
        .await;
    assert!(
        failure.description().starts_with("1 action failed"),
        "{}",
        failure.description()
    );
    assert!(
        failure.description().contains("web-2"),
        "{}",
        failure.description()
    );
    let calls = forge.accepted();
    assert_eq!(for_commit(&calls, &broken)[0].state(), "pending");

    forge.assert_all_valid();
    assert!(
        !agent.log_text().contains(TOKEN),
        "the token is in the agent's log"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forge_that_is_down_or_answers_5xx_leaves_passes_alone_and_gets_every_status_later() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let first = repo.commit_files(
        &[("vm/web-1.yaml", &vm("web-1", 101, "memory: 512MiB"))],
        "web-1",
    );
    let addr = free_port();
    let section = forge_toml(&world, "github", &format!("http://{addr}"));
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s").raw(&section)).await;
    // The forge is down: the pass applies all the same.
    agent
        .wait_for(|s| s["last_applied"]["commit"] == first.as_str())
        .await;
    // It comes back answering 503, then recovers: the statuses arrive, in order.
    let forge = TestForge::start_on(Api::GitHub, TOKEN, addr).await;
    forge.answer(503);
    let log = || agent.log_text();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while forge.calls().iter().all(|c| c.answered != 503) {
        assert!(
            std::time::Instant::now() < deadline,
            "no retry reached the forge:\n{}",
            log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    forge.answer(201);
    forge
        .wait_for(
            "success",
            |c| c.sha() == first && c.state() == "success",
            log,
        )
        .await;
    let calls = forge.accepted();
    let states: Vec<&str> = for_commit(&calls, &first)
        .iter()
        .map(|c| c.state())
        .collect();
    assert_eq!(
        states,
        ["pending", "success"],
        "nothing lost, the newer sent last"
    );
    let success = calls.last().unwrap();
    assert_eq!(success.authorization, format!("Bearer {TOKEN}"));
    assert_eq!(success.path, format!("/repos/ops/proxmox/statuses/{first}"));
    forge.assert_all_valid();
    assert!(
        log().contains("commit status not delivered; retrying"),
        "{}",
        log()
    );
    assert!(!log().contains(TOKEN), "the token is in the agent's log");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redirect_from_the_forge_is_not_followed_so_the_token_stays_with_api_url() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    repo.commit_files(
        &[("vm/web-1.yaml", &vm("web-1", 101, "memory: 512MiB"))],
        "web-1",
    );
    let elsewhere = Receiver::start().await;
    let forge = TestForge::start(Api::GitHub, TOKEN).await;
    forge.redirect(307, &elsewhere.url("/steal"));
    let section = forge_toml(&world, "github", &forge.api_url());
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s").raw(&section)).await;
    let log = || agent.log_text();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while !log().contains("redirects are not followed") {
        assert!(
            std::time::Instant::now() < deadline,
            "no redirect given up:\n{}",
            log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!forge.calls().is_empty());
    assert!(elsewhere.requests().is_empty(), "the redirect was followed");
    assert!(!log().contains(TOKEN));
}

#[tokio::test(flavor = "multi_thread")]
async fn two_nodes_each_write_pending_then_success_under_their_own_context() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let head = repo.commit_files(
        &[("vm/web-1.yaml", &vm("web-1", 101, "memory: 512MiB"))],
        "web-1",
    );
    let forge = TestForge::start(Api::GitHub, TOKEN).await;
    let section = forge_toml(&world, "github", &forge.api_url());
    let (first, _d1) = start_agent(&world, &repo, |t| t.poll("1s").raw(&section)).await;
    let (second, _d2) =
        start_agent(&world, &repo, |t| t.node("pve2").poll("1s").raw(&section)).await;
    let log = || format!("{}\n--- pve2 ---\n{}", first.log_text(), second.log_text());
    for node in ["pve1", "pve2"] {
        let context = format!("proxops/default/{node}");
        forge
            .wait_for(
                &format!("{node} success"),
                |c| c.sha() == head && c.state() == "success" && c.body["context"] == context,
                log,
            )
            .await;
        let calls = forge.accepted();
        let states: Vec<&str> = for_commit(&calls, &head)
            .into_iter()
            .filter(|c| c.body["context"] == context)
            .map(Call::state)
            .collect();
        assert_eq!(states, ["pending", "success"], "{context}");
    }
    forge.assert_all_valid();
}

#[tokio::test(flavor = "multi_thread")]
async fn kind_forgejo_writes_pending_then_success_as_forgejos_own_description_has_it() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let head = repo.commit_files(
        &[("vm/web-1.yaml", &vm("web-1", 101, "memory: 512MiB"))],
        "web-1",
    );
    let forge = TestForge::start(Api::Forgejo, TOKEN).await;
    let section = forge_toml(&world, "forgejo", &forge.api_url());
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.poll("1s").raw(&section)).await;
    let log = || agent.log_text();
    let success = forge
        .wait_for(
            "success",
            |c| c.sha() == head && c.state() == "success",
            log,
        )
        .await;
    let calls = forge.accepted();
    let states: Vec<&str> = for_commit(&calls, &head)
        .iter()
        .map(|c| c.state())
        .collect();
    assert_eq!(states, ["pending", "success"]);
    assert_eq!(success.operation, "repoCreateStatus");
    assert_eq!(
        success.path,
        format!("/api/v1/repos/ops/proxmox/statuses/{head}")
    );
    assert_eq!(success.authorization, format!("token {TOKEN}"));
    forge.assert_all_valid();
    assert!(!log().contains(TOKEN), "the token is in the agent's log");
}
