//! Issue 18, item 4, end to end: `[source] verify` with real signatures made by
//! `git commit -S` (an SSH key from `ssh-keygen`, an OpenPGP key from GnuPG), a real git
//! server, the real agent and the simulator. An unverified revision is recorded
//! `unverified` naming the commit and why, nothing of it reaches PVE, and the revision in
//! force stays enforced.

use std::path::Path;

use crate::git_server::{GitDaemon, TestRepo};
use crate::invalid_head::{last_id, memory, nudge, pass_on, vm};
use crate::sim::World;
use crate::support::agent::AgentProcess;
use crate::support::signing::Signer;

const SECRET: &str = "verify-webhook-secret";

/// The agent following `repo` with `[source]` `verify` and the key file lines given.
struct Verifying {
    agent: AgentProcess,
    _daemon: GitDaemon,
}

async fn start(world: &World, repo: &TestRepo, name: &str, source_lines: &str) -> Verifying {
    let daemon = repo.serve();
    let dir = world.dir.path();
    let toml = world
        .agent_toml()
        .webhook_secret(SECRET)
        .state_dir(dir.join(format!("state-{name}")))
        .raw(&format!(
            "[source]\nurl = \"{}\"\nbranch = \"main\"\npoll = \"1h\"\n{source_lines}\n",
            daemon.url("origin.git")
        ));
    let config = dir.join(format!("agent-{name}.toml"));
    let agent = AgentProcess::spawn(&toml, &config, "info");
    agent
        .wait_for(|s| s["last_attempted"]["outcome"].is_string())
        .await;
    Verifying {
        agent,
        _daemon: daemon,
    }
}

fn ssh_keys(dir: &Path, signer: &Signer, mode: &str) -> String {
    let file = Signer::write_to(
        dir,
        "allowed_signers",
        &format!("# the ops team\n{}\n", signer.allowed_signers_line()),
    );
    format!(
        "verify = \"{mode}\"\nallowed_signers_file = \"{}\"\n",
        file.display()
    )
}

fn web(memory: &str) -> String {
    vm("web", 120, &format!("memory: {memory}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn range_mode_refuses_an_unsigned_commit_between_two_signed_ones_and_writes_nothing_of_them()
{
    let world = World::start(&[]).await;
    let signer = Signer::ssh();
    let repo = TestRepo::new();
    let first = signer.commit_files(&repo, &[("vm/web.yaml", &web("512MiB"))], "web");
    let keys = ssh_keys(world.dir.path(), &signer, "range");
    let setup = start(&world, &repo, "range", &keys).await;
    let agent = &setup.agent;
    let applied = agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(first.as_str()))
        .await;
    assert_eq!(memory(&world, 120).await, "512");

    // An unsigned commit, then a signed one on top, pushed together.
    repo.write("vm/web.yaml", web("1GiB"));
    let unsigned = repo.commit("unsigned");
    let head = signer.commit_files(&repo, &[("vm/web.yaml", &web("2GiB"))], "signed on top");
    let writes_before = world.writes().len();
    nudge(agent).await;
    let status = pass_on(agent, &head, last_id(&applied)).await;

    let last = &status["last_attempted"];
    assert_eq!(last["outcome"], "unverified", "{status:#}");
    let why = format!("unverified: {}: no signature", &unsigned[..12]);
    assert!(
        last["error"].as_str().is_some_and(|e| e.starts_with(&why)),
        "{status:#}"
    );
    assert_eq!(
        status["last_applied"]["commit"],
        first.as_str(),
        "{status:#}"
    );
    assert_eq!(last["enforced_commit"], first.as_str(), "{status:#}");
    assert_eq!(world.writes().len(), writes_before, "{:#?}", world.writes());
    assert_eq!(memory(&world, 120).await, "512");
    let summary = status["head_invalid"]["summary"]
        .as_str()
        .unwrap_or_default();
    assert!(summary.contains(&why), "{status:#}");

    // Every view says so: the passes API, the timeline's filter, the page, `proxops status`.
    let pass = agent
        .get(&format!("/api/v1/passes/{}", last_id(&status)))
        .await;
    assert_eq!(pass["pass"]["outcome"], "unverified", "{pass:#}");
    let (code, timeline) = agent.get_text("/ui/passes?outcome=unverified").await;
    assert_eq!(code, 200);
    assert!(timeline.contains(&head[..8]), "{timeline}");
    assert!(!timeline.contains(&first[..8]), "{timeline}");
    let (code, page) = agent.get_text("/").await;
    assert_eq!(code, 200);
    assert!(page.contains(&why), "{page}");
    let (code, page) = agent
        .get_text(&format!("/ui/passes/{}", last_id(&status)))
        .await;
    assert_eq!(code, 200);
    assert!(page.contains(&why), "{page}");
    assert!(page.contains("unverified"), "{page}");
    let out = agent.cli(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&why), "{text}");

    // Signing more commits on top does not launder the unsigned one: it is still in range.
    let later = signer.commit_files(&repo, &[("vm/web.yaml", &web("3GiB"))], "more");
    nudge(agent).await;
    let status = pass_on(agent, &later, last_id(&status)).await;
    assert_eq!(
        status["last_attempted"]["outcome"], "unverified",
        "{status:#}"
    );
    assert_eq!(memory(&world, 120).await, "512");
}

#[tokio::test(flavor = "multi_thread")]
async fn range_mode_applies_commits_all_signed_by_an_allowed_ssh_key() {
    let world = World::start(&[]).await;
    let signer = Signer::ssh();
    let repo = TestRepo::new();
    let first = signer.commit_files(&repo, &[("vm/web.yaml", &web("512MiB"))], "web");
    let keys = ssh_keys(world.dir.path(), &signer, "range");
    let setup = start(&world, &repo, "ssh", &keys).await;
    let agent = &setup.agent;
    let applied = agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(first.as_str()))
        .await;

    signer.commit_files(&repo, &[("vm/web.yaml", &web("1GiB"))], "more memory");
    let head = signer.commit_files(&repo, &[("vm/web.yaml", &web("2GiB"))], "even more");
    nudge(agent).await;
    let status = pass_on(agent, &head, last_id(&applied)).await;
    assert_eq!(status["last_attempted"]["outcome"], "applied", "{status:#}");
    assert_eq!(status["last_applied"]["commit"], head.as_str());
    assert_eq!(memory(&world, 120).await, "2048");
}

#[tokio::test(flavor = "multi_thread")]
async fn range_mode_applies_commits_all_signed_by_an_allowed_gnupg_key() {
    let world = World::start(&[]).await;
    let signer = Signer::gpg();
    let repo = TestRepo::new();
    let first = signer.commit_files(&repo, &[("vm/web.yaml", &web("512MiB"))], "web");
    let keyring = Signer::write_to(
        world.dir.path(),
        "keyring.asc",
        &signer.armored_public_key(),
    );
    let keys = format!(
        "verify = \"range\"\ngpg_keyring_file = \"{}\"\n",
        keyring.display()
    );
    let setup = start(&world, &repo, "gpg", &keys).await;
    let agent = &setup.agent;
    let applied = agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(first.as_str()))
        .await;
    assert_eq!(memory(&world, 120).await, "512");

    signer.commit_files(&repo, &[("vm/web.yaml", &web("1GiB"))], "more memory");
    let head = signer.commit_files(&repo, &[("vm/web.yaml", &web("2GiB"))], "even more");
    nudge(agent).await;
    let status = pass_on(agent, &head, last_id(&applied)).await;
    assert_eq!(status["last_attempted"]["outcome"], "applied", "{status:#}");
    assert_eq!(memory(&world, 120).await, "2048");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signature_by_a_key_not_in_the_allowed_list_is_refused_before_anything_is_written() {
    let world = World::start(&[]).await;
    let allowed = Signer::ssh();
    let stranger = Signer::ssh();
    let repo = TestRepo::new();
    let head = stranger.commit_files(&repo, &[("vm/web.yaml", &web("512MiB"))], "web");
    let keys = ssh_keys(world.dir.path(), &allowed, "range");
    let setup = start(&world, &repo, "stranger", &keys).await;
    let status = pass_on(&setup.agent, &head, 0).await;

    let last = &status["last_attempted"];
    assert_eq!(last["outcome"], "unverified", "{status:#}");
    let why = format!(
        "unverified: {}: key not allowed: SSH key SHA256:",
        &head[..12]
    );
    assert!(
        last["error"].as_str().is_some_and(|e| e.starts_with(&why)),
        "{status:#}"
    );
    assert!(world.writes().is_empty(), "{:#?}", world.writes());
    assert!(status["last_applied"].is_null(), "{status:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn head_mode_ignores_an_unsigned_commit_below_a_signed_head() {
    let world = World::start(&[]).await;
    let signer = Signer::ssh();
    let repo = TestRepo::new();
    let first = signer.commit_files(&repo, &[("vm/web.yaml", &web("512MiB"))], "web");
    let keys = ssh_keys(world.dir.path(), &signer, "head");
    let setup = start(&world, &repo, "head", &keys).await;
    let agent = &setup.agent;
    let applied = agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(first.as_str()))
        .await;

    repo.write("vm/web.yaml", web("1GiB"));
    repo.commit("unsigned");
    let head = signer.commit_files(&repo, &[("vm/web.yaml", &web("2GiB"))], "signed head");
    nudge(agent).await;
    let status = pass_on(agent, &head, last_id(&applied)).await;
    assert_eq!(status["last_attempted"]["outcome"], "applied", "{status:#}");
    assert_eq!(memory(&world, 120).await, "2048");

    // An unsigned HEAD is refused.
    let unsigned = repo.commit_files(&[("vm/web.yaml", &web("3GiB"))], "unsigned head");
    nudge(agent).await;
    let status = pass_on(agent, &unsigned, last_id(&status)).await;
    assert_eq!(
        status["last_attempted"]["outcome"], "unverified",
        "{status:#}"
    );
    assert_eq!(memory(&world, 120).await, "2048");
}
