//! Issue 19, item 4, end to end: approvals. The real agent follows a real git server and
//! writes to the simulator; the real CLI (`proxops approve` / `proxops reject`) talks to it
//! over `<state_dir>/control.sock`. With `approve = ["destructive"]` a prune waits (no
//! DELETE in the simulator's request log, the pass records it awaiting approval) until it
//! is approved; a rejection keeps it held; a new commit that changes what is held makes an
//! approval lapse; `bulk` holds a pass with more than `max_changes` actions; the socket is
//! 0600 and refuses another uid.

use std::os::unix::fs::PermissionsExt as _;

use crate::git_server::TestRepo;
use crate::invalid_head::{Setup, last_id, nudge, pass_on, vm};
use crate::pve_api::Api;
use crate::sim::World;
use crate::support::agent::AgentProcess;
use crate::support::notify::{Receiver, assert_valid, notify_python};

const DESTRUCTIVE: &str = "prune = true\napprove = [\"destructive\"]";

/// Write requests (method and path) the simulator saw.
fn writes(world: &World) -> Vec<String> {
    world
        .writes()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

fn deletes(world: &World) -> Vec<String> {
    writes(world)
        .into_iter()
        .filter(|w| w.starts_with("DELETE "))
        .collect()
}

/// `proxops <verb> <pass> [--reason]` against the agent: (success, stdout, stderr).
fn decide(agent: &AgentProcess, verb: &str, pass: i64, reason: &str) -> (bool, String, String) {
    let out = agent
        .cli(&[verb, &pass.to_string(), "--reason", reason])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The actions of pass `id`, from `/api/v1/passes/{id}`.
async fn actions_of(agent: &AgentProcess, id: i64) -> Vec<serde_json::Value> {
    let detail = agent.get(&format!("/api/v1/passes/{id}")).await;
    detail["actions"].as_array().cloned().unwrap_or_default()
}

/// Waits for a pass after `after` on `commit` whose status shows an open approval.
async fn held_on(agent: &AgentProcess, commit: &str, after: i64) -> serde_json::Value {
    agent
        .wait_for(|s| {
            let last = &s["last_attempted"];
            last["commit"].as_str() == Some(commit)
                && last["outcome"].is_string()
                && last["id"].as_i64() > Some(after)
                && s["approval"]["open"].is_object()
        })
        .await
}

/// Waits (with a deadline) until the simulator saw `count` DELETEs, then for a finished pass
/// after pass `after`; that status.
async fn deleted(
    world: &World,
    agent: &AgentProcess,
    count: usize,
    after: i64,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while deletes(world).len() < count {
        assert!(
            std::time::Instant::now() < deadline,
            "fewer than {count} DELETEs: {:#?}\nlog:\n{}",
            writes(world),
            agent.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    agent
        .wait_for(|s| {
            s["last_attempted"]["id"].as_i64() >= Some(after)
                && s["last_attempted"]["outcome"].is_string()
                && s["approval"]["recent"][0]["state"] != "awaiting"
        })
        .await
}

/// The held actions of an approval view, as `verb VM/name`, sorted.
fn held_actions(approval: &serde_json::Value) -> Vec<String> {
    let mut actions: Vec<String> = approval["actions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            format!(
                "{} {}/{}",
                a["verb"]["verb"].as_str().unwrap_or_default(),
                a["resource"]["kind"].as_str().unwrap_or_default(),
                a["resource"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    actions.sort();
    actions
}

/// Two stopped VMs applied, then a commit that drops `old`: the agent holds its delete.
async fn prune_held(world: &World, repo: &TestRepo, name: &str) -> (Setup, String, i64) {
    let first = repo.commit_files(
        &[
            ("vm/keep.yaml", &vm("keep", 160, "memory: 512MiB")),
            ("vm/old.yaml", &vm("old", 161, "memory: 512MiB")),
        ],
        "two VMs",
    );
    let setup = Setup::start(world, repo, name, DESTRUCTIVE).await;
    let applied = setup
        .agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(first.as_str()))
        .await;
    repo.remove("vm/old.yaml");
    let second = repo.commit("drop old");
    repo.push();
    nudge(&setup.agent).await;
    let status = held_on(&setup.agent, &second, last_id(&applied)).await;
    (setup, second, last_id(&status))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prune_waits_for_approval_a_rejection_keeps_it_held_and_an_approval_runs_it() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let (mut setup, head, held) = prune_held(&world, &repo, "approve").await;
    let state_dir = world.dir.path().join("state-approve");
    assert_eq!(
        deletes(&world),
        Vec::<String>::new(),
        "a held delete reached PVE"
    );

    // The pass records the delete as held, awaiting approval, and every view shows it.
    let actions = actions_of(&setup.agent, held).await;
    let delete = actions
        .iter()
        .find(|a| a["verb"] == "delete")
        .unwrap_or_else(|| panic!("no held delete recorded: {actions:#?}"));
    assert_eq!(delete["result"], "skipped", "{delete:#}");
    let error = delete["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("awaiting approval (destructive")
            && error.contains(&format!("proxops approve {held}")),
        "{error}"
    );
    let status = setup.agent.get("/api/v1/status").await;
    let open = &status["approval"]["open"];
    assert_eq!(open["pass"], held, "{status:#}");
    assert_eq!(open["state"], "awaiting");
    assert_eq!(open["command"], format!("proxops approve {held}"));
    assert!(open["digest"].as_str().unwrap().starts_with("sha256:"));
    // The delete, and the shutdown that precedes it (the same guest's actions wait together).
    assert_eq!(
        held_actions(open),
        ["delete VM/old", "shutdown VM/old"],
        "{open:#}"
    );
    let cli = setup.agent.cli(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&cli.stdout);
    assert!(
        text.contains(&format!("AWAITING APPROVAL: pass {held}")),
        "{text}"
    );
    assert!(text.contains(&format!("proxops approve {held}")), "{text}");
    let (code, page) = setup.agent.get_text("/ui").await;
    assert_eq!(code, 200);
    assert!(page.contains("id=\"flag-approval\""), "{page}");
    assert!(page.contains(&format!("proxops approve {held}")), "{page}");

    // Rejected: it stays held, pass after pass.
    let (ok, out, err) = decide(&setup.agent, "reject", held, "not before the backup");
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("rejected pass {held} (2 actions,")),
        "{out}"
    );
    nudge(&setup.agent).await;
    let status = pass_on(&setup.agent, &head, held).await;
    assert_eq!(
        status["approval"]["open"]["state"], "rejected",
        "{status:#}"
    );
    assert_eq!(status["approval"]["open"]["pass"], held, "{status:#}");
    assert_eq!(
        status["approval"]["open"]["decision_reason"],
        "not before the backup"
    );
    assert_eq!(
        deletes(&world),
        Vec::<String>::new(),
        "a rejected delete reached PVE"
    );

    // The approval is in the store: it survives a restart of the agent.
    setup.agent.terminate();
    assert!(!state_dir.join("control.sock").exists());
    let (ok, _, err) = decide(&setup.agent, "approve", held, "");
    assert!(!ok);
    assert!(err.contains("no agent is running for"), "{err}");
    setup.agent.respawn();
    let restarted = setup
        .agent
        .wait_for(|s| s["last_attempted"]["id"].as_i64() > Some(last_id(&status)))
        .await;
    assert_eq!(deletes(&world), Vec::<String>::new());

    // Approved: the agent wakes at once and deletes.
    let (ok, out, err) = decide(&setup.agent, "approve", held, "backup checked");
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("approved pass {held} (2 actions,")),
        "{out}"
    );
    // The pass running when the approval lands may be the one that deletes, or the one it
    // wakes: either way the DELETE reaches PVE, once.
    let status = deleted(&world, &setup.agent, 1, last_id(&restarted)).await;
    assert_eq!(
        deletes(&world),
        ["DELETE /nodes/pve1/qemu/161"],
        "{status:#}"
    );
    assert_eq!(vmids(&world).await, [160]);
    let recent = &status["approval"]["recent"][0];
    assert_eq!(recent["pass"], held, "{status:#}");
    assert_eq!(recent["decision_reason"], "backup checked");
    assert!(recent["decided_by"].is_string(), "{recent:#}");

    // Nothing is held any more: approving again says so.
    nudge(&setup.agent).await;
    pass_on(&setup.agent, &head, last_id(&status)).await;
    let (ok, _, err) = decide(&setup.agent, "approve", held, "");
    assert!(!ok);
    assert!(
        err.contains(&format!("pass {held} has nothing awaiting approval")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_commit_that_changes_the_held_plan_makes_the_approval_lapse() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let (setup, _, held) = prune_held(&world, &repo, "lapse").await;
    let agent = &setup.agent;

    // Before the approval is acted on, a commit changes what is held: keep goes too.
    repo.remove("vm/keep.yaml");
    repo.write("vm/new.yaml", vm("new", 162, "memory: 512MiB"));
    let third = repo.commit("drop keep too");
    repo.push();
    let (ok, _, err) = decide(agent, "approve", held, "");
    assert!(ok, "{err}");
    // The pass the approval wakes plans another change: it holds it under a new digest.
    let status = held_on(agent, &third, held).await;
    let open = &status["approval"]["open"];
    let newer = open["pass"].as_i64().unwrap();
    assert!(newer > held, "{status:#}");
    assert_eq!(open["state"], "awaiting", "{status:#}");
    assert_eq!(
        held_actions(open),
        [
            "delete VM/keep",
            "delete VM/old",
            "shutdown VM/keep",
            "shutdown VM/old"
        ],
        "{open:#}"
    );
    let lapsed = &status["approval"]["recent"][1];
    assert_eq!(lapsed["pass"], held, "{status:#}");
    assert_eq!(lapsed["state"], "lapsed");
    assert_ne!(lapsed["digest"], open["digest"]);
    assert_eq!(
        deletes(&world),
        Vec::<String>::new(),
        "a lapsed approval deleted"
    );
    // The create of `new` is not held.
    assert!(
        writes(&world).iter().any(|w| w == "POST /nodes/pve1/qemu"),
        "{:#?}",
        writes(&world)
    );

    let (ok, _, err) = decide(agent, "approve", held, "");
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "pass {held}'s approval lapsed: a newer plan differs"
        )),
        "{err}"
    );
    assert!(err.contains(&format!("approve {newer}")), "{err}");

    let (ok, _, err) = decide(agent, "approve", newer, "");
    assert!(ok, "{err}");
    deleted(&world, agent, 2, newer).await;
    let mut deleted = deletes(&world);
    deleted.sort();
    assert_eq!(
        deleted,
        ["DELETE /nodes/pve1/qemu/160", "DELETE /nodes/pve1/qemu/161"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bulk_holds_a_pass_with_more_than_max_changes_actions_until_approved() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let head = repo.commit_files(
        &[
            ("vm/a.yaml", &vm("a", 170, "memory: 512MiB")),
            ("vm/b.yaml", &vm("b", 171, "memory: 512MiB")),
            ("vm/c.yaml", &vm("c", 172, "memory: 512MiB")),
        ],
        "three VMs",
    );
    let setup = Setup::start(
        &world,
        &repo,
        "bulk",
        "approve = [\"bulk\"]\nmax_changes = 2",
    )
    .await;
    let agent = &setup.agent;
    let status = held_on(agent, &head, 0).await;
    let open = &status["approval"]["open"];
    assert_eq!(
        open["actions"].as_array().map(Vec::len),
        Some(3),
        "{open:#}"
    );
    assert!(
        open["why"]
            .as_str()
            .unwrap()
            .starts_with("bulk: 3 actions, more than [policy] max_changes = 2"),
        "{open:#}"
    );
    assert_eq!(
        writes(&world),
        Vec::<String>::new(),
        "a held bulk pass wrote"
    );
    let held = open["pass"].as_i64().unwrap();
    let (ok, _, err) = decide(agent, "approve", held, "");
    assert!(ok, "{err}");
    agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(head.as_str()))
        .await;
    assert_eq!(vmids(&world).await, [170, 171, 172]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_control_socket_is_private_to_the_agents_user_and_refuses_another_uid() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    repo.commit_files(&[("vm/a.yaml", &vm("a", 180, "memory: 512MiB"))], "one VM");
    let setup = Setup::start(&world, &repo, "socket", DESTRUCTIVE).await;
    let state_dir = world.dir.path().join("state-socket");
    let socket = state_dir.join("control.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "control.sock is not private");

    // Another uid, for real when the tests run as root: the file mode is opened up so only
    // the agent's peer check stands in the way.
    let me = std::fs::metadata("/proc/self").map(|m| {
        use std::os::unix::fs::MetadataExt as _;
        m.uid()
    });
    if me.ok() != Some(0) {
        eprintln!("not root: another uid cannot be tried; the mode is checked");
        return;
    }
    // A python the other uid can run (not a shim in root's home).
    let Some(python) = ["/usr/bin/python3", "/bin/python3"]
        .into_iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.is_file())
    else {
        eprintln!("no python3 to connect as another uid; the mode is checked");
        return;
    };
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut dir = state_dir;
    while let Some(parent) = dir.parent().map(std::path::Path::to_path_buf) {
        // The state directory and its parents must be searchable by `nobody`.
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711));
        if parent == std::path::Path::new("/tmp") || parent.as_os_str().is_empty() {
            break;
        }
        dir = parent;
    }
    let script = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({:?})\n\
         try:\n    s.sendall(b'{{\"v\":1,\"op\":\"approve\",\"pass\":1}}\\n')\n\
         except BrokenPipeError:\n    pass\nprint(s.recv(4096).decode())\n",
        socket.display().to_string()
    );
    let out = {
        use std::os::unix::process::CommandExt as _;
        std::process::Command::new(python)
            .args(["-c", &script])
            .current_dir("/")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        answer.contains("\"ok\":false") && answer.contains("only the agent's user"),
        "{answer}"
    );
    assert!(
        setup
            .agent
            .log_text()
            .contains("a connection from another user was refused"),
        "{}",
        setup.agent.log_text()
    );
}

/// vmids of every guest in the cluster.
async fn vmids(world: &World) -> Vec<u64> {
    let data = Api::new(world).get("/cluster/resources?type=vm").await;
    let mut ids: Vec<u64> = data
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["vmid"].as_u64())
        .collect();
    ids.sort_unstable();
    ids
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_change_is_notified_once_per_digest_in_the_documented_webhook_format() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let webhook = Receiver::start().await;
    let first = repo.commit_files(
        &[
            ("vm/keep.yaml", &vm("keep", 190, "memory: 512MiB")),
            ("vm/old.yaml", &vm("old", 191, "memory: 512MiB")),
        ],
        "two VMs",
    );
    let daemon = repo.serve();
    let toml = world
        .agent_toml()
        .source(&daemon.url("origin.git"))
        .webhook_secret("approvals-notify-secret")
        .state_dir(world.dir.path().join("state-notify"))
        .policy(DESTRUCTIVE)
        .raw(&format!(
            "[[notify]]\nkind = \"webhook\"\nurl = \"{}\"\nevents = [\"awaiting-approval\"]\n",
            webhook.url("/hooks/proxops")
        ));
    let agent = AgentProcess::spawn(&toml, &world.dir.path().join("agent-notify.toml"), "info");
    let applied = agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(first.as_str()))
        .await;
    repo.remove("vm/old.yaml");
    let second = repo.commit("drop old");
    repo.push();
    nudge(&agent).await;
    let status = held_on(&agent, &second, last_id(&applied)).await;
    let held = status["approval"]["open"]["pass"].as_i64().unwrap();
    let received = webhook
        .wait_for("awaiting-approval", || agent.log_text())
        .await;
    let document = &received.body;
    assert_eq!(document["approval"]["pass"], held, "{document:#}");
    assert_eq!(
        document["approval"]["command"],
        format!("proxops approve {held}")
    );
    assert_eq!(
        document["approval"]["digest"],
        status["approval"]["open"]["digest"]
    );
    let delete = document["actions"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["verb"] == "delete"))
        .unwrap_or_else(|| panic!("no held delete: {document:#}"));
    assert_eq!(delete["resource"], "VM/old", "{document:#}");
    assert_eq!(delete["risk"], "destructive", "{document:#}");
    assert_eq!(delete["result"], "skipped", "{document:#}");
    if let Ok(python) = notify_python() {
        let schema = crate::support::repo_root().join("docs/notify-webhook.schema.json");
        assert_valid(&python, &schema, std::slice::from_ref(document));
    }

    // The same change held by the next pass is not announced again.
    nudge(&agent).await;
    let again = pass_on(&agent, &second, last_id(&status)).await;
    assert_eq!(again["approval"]["open"]["pass"], held, "{again:#}");
    assert_eq!(webhook.delivered("awaiting-approval").len(), 1);
    drop(daemon);
}
