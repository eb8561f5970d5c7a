//! Issue 17, items 1 and 2, end to end: a commit with a typo in a listed manifest, served by
//! a real git server, leaves the last applied revision in force. The real agent observes PVE
//! (the simulator) against that revision, corrects a VM's memory changed meanwhile (apply
//! mode) or reports it (report mode, after a restart: the revision is read back from the
//! mirror), and every view shows HEAD's diagnostics and what is enforced instead:
//! `/api/v1/status`, `/api/v1/revisions/{id}`, `/status`, the page and `proxops status`
//! (human and `--json`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::git_server::{GitDaemon, TestRepo};
use crate::pve_api::Api;
use crate::sim::World;
use crate::support::agent::{AgentProcess, AgentToml};

const SECRET: &str = "invalid-head-webhook-secret";

/// A stopped VM on pve1 with `memory` MiB; `spec` lines replace the memory line when given.
pub(crate) fn vm(name: &str, vmid: u32, memory: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata: {{name: {name}}}\nspec:\n  node: pve1\n  \
         vmid: {vmid}\n  state: stopped\n  {memory}\n  cpu: {{type: host, cores: 1}}\n  \
         disks: [{{storage: local-lvm, size: 1GiB}}]\n  networks: [{{bridge: vmbr0}}]\n"
    )
}

/// An agent following `repo` over git:// (served while the daemon lives), with `policy`
/// lines; its config can be written again with other lines ([`Setup::rewrite`]).
pub(crate) struct Setup {
    pub(crate) agent: AgentProcess,
    pub(crate) _daemon: GitDaemon,
    toml: AgentToml,
    config: PathBuf,
}

impl Setup {
    pub(crate) async fn start(world: &World, repo: &TestRepo, name: &str, policy: &str) -> Setup {
        let daemon = repo.serve();
        let dir = world.dir.path();
        let toml = world
            .agent_toml()
            .source(&daemon.url("origin.git"))
            .webhook_secret(SECRET)
            .state_dir(dir.join(format!("state-{name}")));
        let config = dir.join(format!("agent-{name}.toml"));
        let agent = AgentProcess::spawn(&toml.clone().policy(policy), &config, "info");
        agent.wait_for(|s| s["last_attempted"].is_object()).await;
        Setup {
            agent,
            _daemon: daemon,
            toml,
            config,
        }
    }

    /// Writes the config again with `policy` lines instead.
    pub(crate) fn rewrite(&self, policy: &str) {
        self.toml.clone().policy(policy).write(&self.config);
    }
}

/// A signed push webhook: the agent runs a pass at once. Each body differs (the replay
/// guard keys on it).
pub(crate) async fn nudge(agent: &AgentProcess) {
    static DELIVERY: AtomicU64 = AtomicU64::new(1);
    let after = format!("{:040x}", DELIVERY.fetch_add(1, Ordering::SeqCst));
    let body = format!(r#"{{"ref":"refs/heads/main","after":"{after}","commits":[]}}"#);
    let status = agent
        .http
        .post(agent.url("/hooks/github"))
        .header("content-type", "application/json")
        .header("X-GitHub-Event", "push")
        .header(
            "X-Hub-Signature-256",
            agent.github_signature(body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 202);
}

/// Waits for a pass after `after` (a pass id) that finished on `commit`; that status.
pub(crate) async fn pass_on(agent: &AgentProcess, commit: &str, after: i64) -> serde_json::Value {
    agent
        .wait_for(|s| {
            let last = &s["last_attempted"];
            last["commit"].as_str() == Some(commit)
                && last["outcome"].is_string()
                && last["id"].as_i64() > Some(after)
        })
        .await
}

pub(crate) fn last_id(status: &serde_json::Value) -> i64 {
    status["last_attempted"]["id"].as_i64().unwrap_or(0)
}

/// The VM's memory as PVE reports it.
pub(crate) async fn memory(world: &World, vmid: u32) -> String {
    let config = Api::new(world).config("pve1", "qemu", vmid).await;
    match &config["memory"] {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_typo_commit_leaves_the_last_applied_revision_in_force_and_every_view_shows_why() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let good = repo.commit_files(&[("vm/web.yaml", &vm("web", 120, "memory: 512MiB"))], "web");
    let setup = Setup::start(&world, &repo, "typo", "").await;
    let agent = &setup.agent;
    let applied = agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(good.as_str()))
        .await;
    assert_eq!(memory(&world, 120).await, "512");

    // A typo in the listed manifest, and meanwhile someone raises the VM's memory in PVE.
    let bad = repo.commit_files(
        &[("vm/web.yaml", &vm("web", 120, "memroy: 512MiB"))],
        "typo",
    );
    Api::new(&world)
        .put("/nodes/pve1/qemu/120/config", &[("memory", "2048")])
        .await;
    nudge(agent).await;
    let status = pass_on(agent, &bad, last_id(&applied)).await;

    // The memory was corrected against the last applied revision.
    assert_eq!(memory(&world, 120).await, "512", "{status:#}");
    let last = &status["last_attempted"];
    assert_eq!(last["outcome"], "invalid", "{status:#}");
    assert_eq!(last["enforced_commit"], good.as_str(), "{status:#}");
    assert_eq!(last["enforced_outcome"], "applied", "{status:#}");
    assert_eq!(last["actions_ok"], 1, "{status:#}");
    assert_eq!(status["last_applied"]["commit"], good.as_str());
    assert_eq!(status["enforced_commit"], good.as_str());

    // `/api/v1/status`: the sentence and HEAD's located diagnostics.
    let invalid = &status["head_invalid"];
    let errors = invalid["diagnostics"].as_array().unwrap().len();
    assert!(errors >= 1, "{status:#}");
    let sentence = format!(
        "HEAD {} is invalid ({errors} {}); enforcing {}, last applied",
        &bad[..7],
        if errors == 1 { "error" } else { "errors" },
        &good[..7]
    );
    assert_eq!(invalid["summary"], sentence.as_str(), "{status:#}");
    assert_eq!(invalid["commit"], bad.as_str());
    let rendered: Vec<String> = invalid["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["rendered"].as_str().unwrap().to_owned())
        .collect();
    let typo = rendered
        .iter()
        .find(|line| line.contains("memroy"))
        .unwrap_or_else(|| panic!("no diagnostic names the typo: {rendered:?}"));
    assert!(typo.starts_with("vm/web.yaml:"), "{typo}");
    assert!(typo.contains(": error: "), "{typo}");
    assert_eq!(last["diagnostics"], invalid["diagnostics"]);

    // `/api/v1/revisions/{prefix}`: the commit, its diagnostics, the pass and its action.
    let revision = agent
        .get(&format!("/api/v1/revisions/{}", &bad[..10]))
        .await;
    assert_eq!(revision["commit"], bad.as_str(), "{revision:#}");
    assert_eq!(revision["valid"], false);
    assert_eq!(revision["diagnostics"], invalid["diagnostics"]);
    assert_eq!(
        revision["latest"]["head_invalid"]["summary"],
        sentence.as_str()
    );
    let actions = revision["latest"]["actions"].as_array().unwrap();
    assert!(
        actions.iter().any(|a| a["verb"] == "update"
            && a["resource"] == "VM/web"
            && a["result"] == "succeeded"),
        "{revision:#}"
    );
    let listed = agent.get("/api/v1/revisions").await;
    assert_eq!(listed[0]["diagnostics"], invalid["diagnostics"]);
    let good_revision = agent.get(&format!("/api/v1/revisions/{good}")).await;
    assert_eq!(good_revision["valid"], true, "{good_revision:#}");
    let (code, _) = agent.get_text("/api/v1/revisions/ffffffffff").await;
    assert_eq!(code, 404);

    // `/status` keeps the Go shape, with the objects of the enforced revision and the
    // diagnostics as extra fields.
    let go = agent.get("/status").await;
    assert!(go["process_start"].is_string());
    let objects = go["objects"].as_array().unwrap();
    assert!(
        objects
            .iter()
            .any(|o| o["name"] == "web" && o["kind"] == "VM"),
        "objects stay listed while HEAD is invalid: {go:#}"
    );
    assert_eq!(go["last_cycle"]["commit"], bad.as_str());
    assert_eq!(go["last_cycle"]["enforced_commit"], good.as_str());
    assert_eq!(
        go["last_cycle"]["head_invalid"]["summary"],
        sentence.as_str()
    );
    assert_eq!(
        go["last_cycle"]["head_invalid"]["diagnostics"],
        invalid["diagnostics"]
    );

    // The page says it in one line and lists the diagnostics.
    let (code, page) = agent.get_text("/").await;
    assert_eq!(code, 200);
    assert!(page.contains(&sentence), "{page}");
    assert!(page.contains("vm/web.yaml:"), "{page}");

    // `proxops status`, human and JSON.
    let out = agent.cli(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&sentence), "{text}");
    assert!(text.contains(&format!("  {typo}")), "{text}");
    let json = agent.cli_json("status");
    assert_eq!(json["head_invalid"], status["head_invalid"]);

    // The corrected drift is history: first seen and resolved by that pass.
    let pass = last["id"].as_i64().unwrap();
    let drift = agent.get("/api/v1/drift").await;
    let corrected = drift["resolved"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["resource"] == "VM/web" && d["field"] == "memory")
        .unwrap_or_else(|| panic!("the corrected memory is not in the history: {drift:#}"));
    assert_eq!(
        corrected["resolved_how"],
        format!("corrected by pass {pass}")
    );
    assert_eq!(corrected["resolution"], "corrected-by-pass");
    assert_eq!(corrected["first_seen_pass"], pass);
    assert_eq!(corrected["resolved_pass"], pass);
    assert_eq!(corrected["first_seen_commit"], good.as_str());
    assert_eq!(corrected["observed"], "2048");
    assert!(drift["open"].as_array().unwrap().is_empty(), "{drift:#}");

    // Fixing the typo applies HEAD again and clears the state everywhere.
    let fixed = repo.commit_files(&[("vm/web.yaml", &vm("web", 120, "memory: 512MiB"))], "fix");
    nudge(agent).await;
    let status = pass_on(agent, &fixed, pass).await;
    assert!(status["head_invalid"].is_null(), "{status:#}");
    assert_eq!(status["enforced_commit"], fixed.as_str());
    assert!(agent.get("/status").await["last_cycle"]["head_invalid"].is_null());
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_restart_in_report_mode_drift_under_an_invalid_head_is_reported_against_the_last_applied_revision()
 {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let good = repo.commit_files(&[("vm/db.yaml", &vm("db", 130, "memory: 512MiB"))], "db");
    let mut setup = Setup::start(&world, &repo, "report", "").await;
    let applied = setup
        .agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(good.as_str()))
        .await;

    // Stopped, reconfigured to report mode; meanwhile a typo lands and PVE changes.
    assert!(setup.agent.terminate().success());
    setup.rewrite("mode = \"report\"");
    let bad = repo.commit_files(&[("vm/db.yaml", &vm("db", 130, "memroy: 1GiB"))], "typo");
    Api::new(&world)
        .put("/nodes/pve1/qemu/130/config", &[("memory", "2048")])
        .await;
    world.sim.control().clear_requests();
    setup.agent.respawn();
    let status = pass_on(&setup.agent, &bad, last_id(&applied)).await;

    // Read back from the mirror after the restart, enforced in report mode: reported only.
    assert_eq!(status["enforced_commit"], good.as_str(), "{status:#}");
    let summary = status["head_invalid"]["summary"].as_str().unwrap();
    assert!(
        summary.ends_with(&format!("enforcing {}, last applied", &good[..7])),
        "{summary}"
    );
    assert!(
        world.writes().is_empty(),
        "report mode writes nothing: {:?}",
        world.writes()
    );
    assert_eq!(memory(&world, 130).await, "2048");
    let drift = setup.agent.get("/api/v1/drift").await;
    let open = drift["open"].as_array().unwrap();
    let reported = open
        .iter()
        .find(|d| d["resource"] == "VM/db" && d["field"] == "memory")
        .unwrap_or_else(|| panic!("the memory drift is not reported: {drift:#}"));
    assert_eq!(reported["desired"], "512");
    assert_eq!(reported["observed"], "2048");
    assert_eq!(reported["first_seen_commit"], good.as_str());
    assert!(reported["resolved_at"].is_null());
    let go = setup.agent.get("/status").await;
    let db = go["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "db")
        .cloned()
        .unwrap_or_else(|| panic!("objects stay listed: {go:#}"));
    assert_eq!(db["state"], "drift", "{go:#}");

    // Someone puts the memory back in PVE: the drift is resolved as fixed there.
    Api::new(&world)
        .put("/nodes/pve1/qemu/130/config", &[("memory", "512")])
        .await;
    let before = last_id(&status);
    nudge(&setup.agent).await;
    let status = pass_on(&setup.agent, &bad, before).await;
    let drift = setup.agent.get("/api/v1/drift").await;
    let resolved = drift["resolved"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["resource"] == "VM/db" && d["field"] == "memory")
        .cloned()
        .unwrap_or_else(|| panic!("not resolved: {drift:#}"));
    assert_eq!(resolved["resolved_how"], "fixed in PVE", "{drift:#}");
    assert_eq!(resolved["resolved_pass"], last_id(&status));
    assert!(drift["open"].as_array().unwrap().is_empty(), "{drift:#}");
}
