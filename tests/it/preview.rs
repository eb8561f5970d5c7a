//! Issue 18 item 3 end to end: plan previews on pull requests. The agent binary follows a
//! real git repository (git daemon; pull request heads pushed to `refs/pull/<n>/head` as the
//! forges publish them) against the simulator, with `[forge] preview = true` pointing at the
//! test forge (tests/it/support/forge.rs), which checks every call against the vendored
//! GitHub and Gitea API descriptions (tests/forge/) and serves the pull request's comments.
//! The `pull_request` webhooks are signed as the forges sign them.

use std::time::{Duration, Instant};

use crate::agent::start_agent;
use crate::git_server::{GitDaemon, TestRepo};
use crate::sim::World;
use crate::support::agent::AgentProcess;
use crate::support::forge::{Api, Call, TestForge};

const TOKEN: &str = "forge-token-preview-7d1e-never-logged";

fn vm(name: &str, vmid: u32, memory_line: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: {name}\nspec:\n  node: pve1\n  vmid: {vmid}\n  state: stopped\n  {memory_line}\n  cpu: {{type: host, cores: 1}}\n  disks: [{{storage: local-lvm, size: 1GiB}}]\n  networks: [{{bridge: vmbr0}}]\n"
    )
}

/// `[forge]` with previews on, the token in a file of the world's directory.
fn forge_toml(world: &World, kind: &str, forge: &TestForge) -> String {
    let token = world.dir.path().join("forge-token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    format!(
        "\n[forge]\nkind = \"{kind}\"\napi_url = \"{}\"\nrepo = \"ops/proxmox\"\ntoken_file = {}\npreview = true\n",
        forge.api_url(),
        toml::Value::String(token.display().to_string())
    )
}

/// Publishes the work repository's HEAD as pull request `number`'s head, as a forge does.
fn publish_pull(repo: &TestRepo, number: u64) -> String {
    repo.git(&[
        "push",
        "--quiet",
        "--force",
        "origin",
        &format!("HEAD:refs/pull/{number}/head"),
    ]);
    repo.head()
}

/// Delivers a signed `pull_request` webhook as `provider` sends it; status and answer.
async fn deliver_pull_request(
    agent: &AgentProcess,
    provider: &str,
    action: &str,
    number: u64,
    base: &str,
    nonce: &str,
) -> (u16, String) {
    // `nonce` keeps two deliveries for the same action from looking like a replay.
    let body = serde_json::json!({
        "action": action,
        "number": number,
        "pull_request": {"number": number, "base": {"ref": base}, "head": {"ref": nonce}},
    })
    .to_string();
    let signature = agent.github_signature(body.as_bytes());
    let request = agent
        .http
        .post(agent.url(&format!("/hooks/{provider}")))
        .header("content-type", "application/json");
    let request = match provider {
        "github" => request
            .header("X-GitHub-Event", "pull_request")
            .header("X-Hub-Signature-256", signature),
        "gitea" => request
            .header("X-Gitea-Event", "pull_request")
            .header("X-Gitea-Signature", signature.trim_start_matches("sha256=")),
        _ => request
            .header("X-Forgejo-Event", "pull_request")
            .header("X-Gitea-Event", "pull_request")
            .header(
                "X-Forgejo-Signature",
                signature.trim_start_matches("sha256="),
            ),
    };
    let response = request.body(body).send().await.unwrap();
    (
        response.status().as_u16(),
        response.text().await.unwrap_or_default(),
    )
}

/// Polls until `done` holds for the forge, with a deadline; the log on failure.
async fn until(
    what: &str,
    forge: &TestForge,
    log: impl Fn() -> String,
    done: impl Fn(&TestForge) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !done(forge) {
        assert!(
            Instant::now() < deadline,
            "{what} never happened; calls: {:#?}\nagent log:\n{}",
            forge.calls(),
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn marked<'a>(comments: &'a [(u64, String)], node: &str) -> Vec<&'a (u64, String)> {
    let marker = format!("<!-- proxops:plan:default/{node} -->");
    comments
        .iter()
        .filter(|(_, b)| b.starts_with(&marker))
        .collect()
}

fn plan_status<'a>(calls: &'a [Call], sha: &str, node: &str) -> Option<&'a Call> {
    let context = format!("proxops/default/{node}/plan");
    calls
        .iter()
        .rev()
        .find(|c| c.path.ends_with(&format!("/statuses/{sha}")) && c.body["context"] == context)
}

/// Starts the agents of `nodes` on `repo`, each with `[forge]`, after their first pass.
async fn agents(
    world: &World,
    repo: &TestRepo,
    forge: &TestForge,
    kind: &str,
    nodes: &[&str],
) -> Vec<(AgentProcess, GitDaemon)> {
    let section = forge_toml(world, kind, forge);
    let mut out = Vec::new();
    for node in nodes {
        out.push(start_agent(world, repo, |t| t.node(node).raw(&section)).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pull_request_opened_then_synchronized_gets_one_comment_per_node_updated_in_place_and_pve_is_not_touched()
 {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let main = repo.commit_files(
        &[("vm/web-1.yaml", &vm("web-1", 101, "memory: 512MiB"))],
        "web-1",
    );
    let forge = TestForge::start(Api::GitHub, TOKEN).await;
    let running = agents(&world, &repo, &forge, "github", &["pve1", "pve2"]).await;
    for (agent, _) in &running {
        agent
            .wait_for(|s| s["last_applied"]["commit"] == main.as_str())
            .await;
    }
    // Someone else's comment on the pull request is left alone.
    // Other people's comments fill more than one page (GitHub: 100 at most per page), and
    // are left alone.
    for n in 0..120 {
        forge.add_comment(1, &format!("review remark {n}"));
    }
    let writes_before = world.writes().len();
    let log = || {
        running
            .iter()
            .map(|(a, _)| a.log_text())
            .collect::<Vec<_>>()
            .join("\n--- next agent ---\n")
    };

    // Opened: a second VM and a memory change.
    repo.switch_new("feature");
    repo.commit_files(
        &[
            ("vm/web-1.yaml", &vm("web-1", 101, "memory: 1GiB")),
            ("vm/web-2.yaml", &vm("web-2", 102, "memory: 512MiB")),
        ],
        "web-2",
    );
    let first_head = publish_pull(&repo, 1);
    for (agent, _) in &running {
        let (status, answer) =
            deliver_pull_request(agent, "github", "opened", 1, "main", "a").await;
        assert_eq!((status, answer.as_str()), (202, "preview requested\n"));
    }
    until(
        "a comment of each node on the first head",
        &forge,
        log,
        |f| {
            let comments = f.comments_on(1);
            ["pve1", "pve2"].iter().all(|node| {
                marked(&comments, node)
                    .first()
                    .is_some_and(|(_, body)| body.contains(&first_head))
            }) && ["pve1", "pve2"]
                .iter()
                .all(|node| plan_status(&f.accepted(), &first_head, node).is_some())
        },
    )
    .await;
    let comments = forge.comments_on(1);
    let (first_id, body) = marked(&comments, "pve1")[0].clone();
    assert!(body.contains("```diff"), "{body}");
    assert!(
        body.contains("+ create VM/web-2 on pve1 (vmid 102)"),
        "{body}"
    );
    assert!(body.contains("~ update VM/web-1 on pve1"), "{body}");
    assert!(
        body.contains("**Plan:**") && body.contains("1 to create"),
        "{body}"
    );
    assert!(body.contains("compared by reference name only"), "{body}");
    let status = plan_status(&forge.accepted(), &first_head, "pve1")
        .unwrap()
        .clone();
    assert_eq!(status.state(), "success", "{status:?}");
    assert!(status.description().starts_with("plan: "), "{status:?}");

    // Synchronized: new commits; the same comment is edited, never a second one.
    repo.commit_files(
        &[("vm/web-3.yaml", &vm("web-3", 103, "memory: 512MiB"))],
        "web-3",
    );
    let second_head = publish_pull(&repo, 1);
    for (agent, _) in &running {
        let (status, _) =
            deliver_pull_request(agent, "github", "synchronize", 1, "main", "b").await;
        assert_eq!(status, 202);
    }
    until("each node's comment on the second head", &forge, log, |f| {
        let comments = f.comments_on(1);
        ["pve1", "pve2"].iter().all(|node| {
            marked(&comments, node)
                .first()
                .is_some_and(|(_, body)| body.contains(&second_head))
        }) && ["pve1", "pve2"]
            .iter()
            .all(|node| plan_status(&f.accepted(), &second_head, node).is_some())
    })
    .await;
    let comments = forge.comments_on(1);
    for node in ["pve1", "pve2"] {
        assert_eq!(marked(&comments, node).len(), 1, "{node}: {comments:#?}");
    }
    assert_eq!(comments.len(), 122, "two of ours and the reviewers' 120");
    assert!(
        forge
            .accepted()
            .iter()
            .any(|c| c.method == "GET" && c.query.contains("page=2")),
        "our comment, past the first page, was looked for there"
    );
    let (id, body) = marked(&comments, "pve1")[0].clone();
    assert_eq!(id, first_id, "updated in place");
    assert!(
        body.contains("+ create VM/web-3 on pve1 (vmid 103)"),
        "{body}"
    );
    assert!(
        forge.accepted().iter().any(|c| c.method == "PATCH"
            && c.path == format!("/repos/ops/proxmox/issues/comments/{first_id}")),
        "the update is a PATCH of our comment"
    );

    // PVE unchanged: no write since the PR arrived, the PR's guests do not exist.
    let writes = world.writes();
    assert_eq!(
        writes.len(),
        writes_before,
        "a preview wrote to PVE: {:#?}",
        &writes[writes_before..]
    );
    for (agent, _) in &running {
        let status = agent.status().await.unwrap();
        assert_eq!(
            status["last_applied"]["commit"],
            main.as_str(),
            "the PR head was applied"
        );
    }
    forge.assert_all_valid();
    assert!(!log().contains(TOKEN), "the token is in an agent's log");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_typo_in_a_pull_request_is_a_comment_with_the_diagnostic_and_an_error_plan_status_on_gitea()
 {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    repo.commit_files(
        &[("vm/web-1.yaml", &vm("web-1", 101, "memory: 512MiB"))],
        "web-1",
    );
    let forge = TestForge::start(Api::Gitea, TOKEN).await;
    let running = agents(&world, &repo, &forge, "gitea", &["pve1"]).await;
    let agent = &running[0].0;
    let log = || agent.log_text();

    // A pull request into another branch: ignored.
    let (status, answer) = deliver_pull_request(agent, "gitea", "opened", 9, "develop", "x").await;
    assert_eq!((status, answer.as_str()), (202, "ignored\n"));
    // Other actions: acknowledged and ignored.
    let (status, answer) = deliver_pull_request(agent, "gitea", "closed", 2, "main", "y").await;
    assert_eq!((status, answer.as_str()), (202, "ignored\n"));

    repo.switch_new("typo");
    repo.commit_files(
        &[("vm/web-1.yaml", &vm("web-1", 101, "memroy: 512MiB"))],
        "typo",
    );
    let head = publish_pull(&repo, 2);
    let (status, _) = deliver_pull_request(agent, "gitea", "synchronized", 2, "main", "z").await;
    assert_eq!(status, 202);
    until("the error status of the typo", &forge, log, |f| {
        plan_status(&f.accepted(), &head, "pve1").is_some()
    })
    .await;
    let status = plan_status(&forge.accepted(), &head, "pve1")
        .unwrap()
        .clone();
    assert_eq!(status.state(), "error");
    assert!(
        status.description().contains("vm/web-1.yaml")
            && status.description().contains("spec.memory"),
        "{status:?}"
    );
    assert!(status.description().chars().count() <= 140);
    let comments = forge.comments_on(2);
    let ours = marked(&comments, "pve1");
    assert_eq!(ours.len(), 1, "{comments:#?}");
    assert!(ours[0].1.contains("**Invalid:**"), "{}", ours[0].1);
    assert!(
        ours[0].1.contains("spec.memory: missing required field"),
        "{}",
        ours[0].1
    );
    assert!(
        forge.comments_on(9).is_empty(),
        "a PR into another branch got a comment"
    );
    assert!(
        forge.calls().iter().all(|c| !c.path.contains("/issues/9/")),
        "the forge heard about the PR into another branch"
    );
    assert!(
        world
            .writes()
            .iter()
            .all(|w| !w.path.contains("/qemu/101/config")),
        "the typo head was applied"
    );
    forge.assert_all_valid();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pull_request_head_outside_the_scope_is_an_invalid_preview_and_is_never_applied() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let main = repo.commit_files(
        &[("vm/web-1.yaml", &vm("web-1", 101, "memory: 512MiB"))],
        "web-1",
    );
    let forge = TestForge::start(Api::GitHub, TOKEN).await;
    let section = forge_toml(&world, "github", &forge);
    let (agent, _daemon) = start_agent(&world, &repo, |t| {
        t.scope(crate::support::agent::SIM_SCOPE)
            .scope("vmids = \"100-199\"")
            .raw(&section)
    })
    .await;
    agent
        .wait_for(|s| s["last_applied"]["commit"] == main.as_str())
        .await;
    let writes_before = world.writes().len();
    let log = || agent.log_text();

    repo.switch_new("outside");
    repo.commit_files(
        &[("vm/firewall.yaml", &vm("firewall", 500, "memory: 512MiB"))],
        "firewall",
    );
    let head = publish_pull(&repo, 3);
    let (status, _) = deliver_pull_request(&agent, "github", "opened", 3, "main", "s").await;
    assert_eq!(status, 202);
    until("the scope refusal", &forge, log, |f| {
        plan_status(&f.accepted(), &head, "pve1").is_some()
    })
    .await;
    let status = plan_status(&forge.accepted(), &head, "pve1")
        .unwrap()
        .clone();
    assert_eq!(status.state(), "error", "{status:?}");
    assert!(
        status.description().contains("vm/firewall.yaml"),
        "{status:?}"
    );
    let comments = forge.comments_on(3);
    let body = &marked(&comments, "pve1")[0].1;
    assert!(body.contains("outside the operator's scope"), "{body}");
    assert!(body.contains("vmids = \"100-199\""), "{body}");
    assert_eq!(world.writes().len(), writes_before, "the preview wrote");
    let status = agent.status().await.unwrap();
    assert_eq!(status["last_applied"]["commit"], main.as_str());
    forge.assert_all_valid();
}

/// The SOPS fixture repository's files.
fn sops_files() -> Vec<(String, String)> {
    let root = crate::support::repo_root().join("tests/fixtures/sops-repo");
    [
        "clusters/lab/resources.yaml",
        "clusters/lab/secrets.sops.yaml",
        "vm/base/web.yaml",
    ]
    .iter()
    .map(|p| {
        (
            (*p).to_owned(),
            std::fs::read_to_string(root.join(p)).unwrap(),
        )
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_preview_never_decrypts_sops_so_it_plans_a_repository_whose_key_is_absent() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let files = sops_files();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    repo.commit_files(&refs, "sops");
    // kind = "forgejo": every call is checked against Forgejo's own description.
    let forge = TestForge::start(Api::Forgejo, TOKEN).await;
    let section = forge_toml(&world, "forgejo", &forge);
    // No age identity at all: a pass on main is refused (it would have to decrypt).
    let (agent, _daemon) = start_agent(&world, &repo, |t| t.cluster("lab").raw(&section)).await;
    let log = || agent.log_text();

    repo.switch_new("bigger");
    let web = files
        .iter()
        .find(|(p, _)| p == "vm/base/web.yaml")
        .unwrap()
        .1
        .replace("memory: 2GiB", "memory: 4GiB");
    repo.commit_files(&[("vm/base/web.yaml", &web)], "more memory");
    let head = publish_pull(&repo, 4);
    let (status, _) = deliver_pull_request(&agent, "forgejo", "opened", 4, "main", "k").await;
    assert_eq!(status, 202);
    let marker = "<!-- proxops:plan:lab/pve1 -->";
    until("the plan of the SOPS repository", &forge, log, |f| {
        f.comments_on(4).iter().any(|(_, b)| b.starts_with(marker))
            && f.accepted().iter().any(|c| {
                c.path.ends_with(&format!("/statuses/{head}"))
                    && c.body["context"] == "proxops/lab/pve1/plan"
            })
    })
    .await;
    let comments = forge.comments_on(4);
    let body = &comments
        .iter()
        .find(|(_, b)| b.starts_with(marker))
        .unwrap()
        .1;
    assert!(
        body.contains("+ create VM/web on pve1 (vmid 120)"),
        "{body}"
    );
    assert!(
        body.contains("1 guest with cloud-init secret references: compared by reference name only"),
        "{body}"
    );
    assert!(body.contains("never decrypted"), "{body}");
    let status = forge
        .accepted()
        .into_iter()
        .find(|c| c.path.ends_with(&format!("/statuses/{head}")))
        .unwrap();
    assert_eq!(status.state(), "success", "{status:?}");
    let mut operations: Vec<String> = forge.accepted().into_iter().map(|c| c.operation).collect();
    operations.sort();
    operations.dedup();
    assert_eq!(
        operations,
        ["issueCreateComment", "issueGetComments", "repoCreateStatus"],
        "Forgejo's operations, as its description names them"
    );
    assert!(world.writes().is_empty(), "{:#?}", world.writes());
    assert!(
        !log().contains("cloud-init references resolved"),
        "{}",
        log()
    );
    forge.assert_all_valid();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forge_answering_5xx_to_a_preview_gets_the_comment_and_status_once_it_recovers() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    repo.commit_files(
        &[("vm/web-1.yaml", &vm("web-1", 101, "memory: 512MiB"))],
        "web-1",
    );
    let forge = TestForge::start(Api::GitHub, TOKEN).await;
    let running = agents(&world, &repo, &forge, "github", &["pve1"]).await;
    let agent = &running[0].0;
    let log = || agent.log_text();
    forge.answer(503);
    repo.switch_new("feature");
    repo.commit_files(
        &[("vm/web-2.yaml", &vm("web-2", 102, "memory: 512MiB"))],
        "web-2",
    );
    let head = publish_pull(&repo, 5);
    let (status, _) = deliver_pull_request(agent, "github", "opened", 5, "main", "r").await;
    assert_eq!(status, 202);
    until("a 503 on the comments", &forge, log, |f| {
        f.calls()
            .iter()
            .any(|c| c.answered == 503 && c.path.contains("/issues/5/comments"))
    })
    .await;
    forge.answer(201);
    until(
        "the comment and status after the outage",
        &forge,
        log,
        |f| {
            marked(&f.comments_on(5), "pve1").len() == 1
                && plan_status(&f.accepted(), &head, "pve1").is_some()
        },
    )
    .await;
    assert!(
        log().contains("plan preview comment not delivered; retrying"),
        "{}",
        log()
    );
    assert_eq!(marked(&forge.comments_on(5), "pve1").len(), 1);
    forge.assert_all_valid();
}
