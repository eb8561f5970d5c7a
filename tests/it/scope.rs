//! The operator's `[scope]` against a repository writer (SECURITY-AUDIT H1, M4, L8): the
//! built binary and the agent against the simulator. A revision outside the scope is invalid
//! with a located error naming the scope key, and nothing is written; the executor refuses an
//! action outside the scope even when a plan holds it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proxops::execute::{self, FailureClass, Outcome, Progress};
use proxops_core::guest::GuestType;
use proxops_core::plan::{Action, GuestRef, Plan, Verb};
use proxops_core::resource::{Kind, ResourceId};
use proxops_core::scope::Scope;
use proxops_pve::{ClientConfig, PveClient, RetryPolicy, Timeouts, Trust, WaitOptions};
use tokio_util::sync::CancellationToken;

use crate::agent::{commit_of, start_agent};
use crate::git_server::TestRepo;
use crate::pve_api::Api;
use crate::sim::{World, artifact, sha256_hex};
use crate::support::agent::{SIM_SCOPE, recorded_diagnostics};
use crate::support::{stderr, stdout};

fn vm(name: &str, node: &str, vmid: u32, annotations: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1
kind: VM
metadata:
  name: {name}
{annotations}spec:
  node: {node}
  vmid: {vmid}
  memory: 1GiB
  cpu: {{type: host, cores: 1}}
  disks:
    - {{storage: local-lvm, size: 1GiB}}
  networks:
    - {{bridge: vmbr0}}
"
    )
}

const ADOPT: &str = "  annotations:\n    proxops/adopt: \"true\"\n";

#[tokio::test(flavor = "multi_thread")]
async fn a_manifest_cannot_adopt_a_guest_outside_the_scope() {
    let world = World::start(&[]).await;
    let api = Api::new(&world);
    // Someone else's running VM, which ProxOps never created.
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/qemu",
        &[
            ("vmid", "500"),
            ("memory", "8192"),
            ("name", "prod-firewall"),
        ],
    )
    .await;
    world.write(
        "vm/innocent.yaml",
        Some(&vm("innocent", "pve1", 500, ADOPT)),
    );

    for scope in [None, Some("adopt = \"100-199\"")] {
        let toml = match scope {
            None => world.agent_toml(),
            Some(line) => world.agent_toml().scope(SIM_SCOPE).scope(line),
        };
        world.write_agent_toml(&toml);
        world.sim.control().clear_requests();
        let apply = world.proxops(&["apply", "--yes"]).await;
        assert_eq!(apply.status.code(), Some(1), "{}", stdout(&apply));
        let err = stderr(&apply);
        let shown = scope.map_or("none", |_| "100-199");
        assert!(
            err.contains(&format!("vm/innocent.yaml:6:20: error: metadata.annotations.proxops/adopt: adopting vmid 500 is outside the operator's scope: [scope] adopt = \"{shown}\" in the agent config")),
            "{err}"
        );
        assert!(
            err.contains("help: have the operator add 500 to [scope] adopt in agent.toml"),
            "{err}"
        );
        assert!(world.writes().is_empty(), "{:?}", world.writes());
    }
    let config = api.config("pve1", "qemu", 500).await;
    assert_eq!(config["memory"], "8192");
    assert_eq!(config["name"], "prod-firewall");
    assert!(config.get("tags").is_none(), "{config:?}");

    // Listed by the operator, the same manifest takes the guest over.
    world.write_agent_toml(&world.agent_toml().scope(SIM_SCOPE).scope("adopt = \"500\""));
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(apply.status.code(), Some(0), "{}", stderr(&apply));
    assert_eq!(api.config("pve1", "qemu", 500).await["tags"], "proxops");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_manifest_cannot_write_a_guest_on_a_node_outside_the_scope() {
    let world = World::start(&[]).await;
    let api = Api::new(&world);
    world.write("vm/web.yaml", Some(&vm("web", "pve2", 150, "")));
    world.write_agent_toml(
        &world
            .agent_toml()
            .node("*")
            .scope(SIM_SCOPE)
            .scope("nodes = [\"pve1\"]"),
    );
    let plan = world.proxops(&["plan", "--node", "*"]).await;
    assert_eq!(plan.status.code(), Some(1), "{}", stdout(&plan));
    assert!(
        stderr(&plan).contains("vm/web.yaml:6:9: error: spec.node: node `pve2` is outside the operator's scope: [scope] nodes = [\"pve1\"] in the agent config"),
        "{}",
        stderr(&plan)
    );
    assert!(world.writes().is_empty(), "{:?}", world.writes());

    // Defence in depth: a plan that holds a write to a live guest outside the scope (an owned
    // guest on pve2) is refused by the executor, and nothing reaches PVE.
    api.post_and_wait(
        "pve2",
        "/nodes/pve2/qemu",
        &[
            ("vmid", "141"),
            ("memory", "512"),
            ("name", "moved"),
            ("tags", "proxops"),
        ],
    )
    .await;
    world.sim.control().clear_requests();
    let shutdown = Action {
        resource: ResourceId::new(Kind::Vm, "moved"),
        node: "pve2".to_owned(),
        verb: Verb::Delete(GuestRef {
            vmid: 141,
            guest_type: GuestType::Qemu,
        }),
        reason: "a forged plan".to_owned(),
    };
    let plan = Plan {
        levels: vec![vec![shutdown]],
        ..Plan::default()
    };
    let desired = proxops::reconcile::desired_state(&BTreeMap::new(), None).unwrap();
    let options = execute::Options {
        concurrency_per_node: 1,
        wait: WaitOptions::default(),
        lock_retry_for: Duration::from_secs(1),
        local_node: None,
        scope: Scope {
            nodes: Some(vec!["pve1".to_owned()]),
            ..Scope::default()
        },
        cluster_lock_dir: None,
    };
    let progress: Progress = Arc::new(|_| {});
    let report = execute::apply(
        &client(&world),
        &desired,
        &plan,
        &options,
        &progress,
        &mut execute::open_gate(),
        &CancellationToken::new(),
    )
    .await;
    match &report.results[0].outcome {
        Outcome::Failed { class, error, .. } => {
            assert_eq!(*class, FailureClass::Refused);
            assert_eq!(
                error,
                "refused: node pve2 is outside [scope] nodes in the agent config"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(world.writes().is_empty(), "{:?}", world.writes());
    assert_eq!(api.config("pve2", "qemu", 141).await["name"], "moved");
}

fn client(world: &World) -> PveClient {
    PveClient::new(ClientConfig {
        base_url: world.sim.base_url(),
        token_id: "root@pam!proxops".into(),
        token_secret: "proxops-dev-secret".to_owned().into(),
        trust: Trust::Fingerprint(world.sim.fingerprint().unwrap().to_owned()),
        timeout: Timeouts::default(),
        retry: RetryPolicy::default(),
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_artifact_url_resolving_to_loopback_is_refused_unless_listed() {
    const ISO: &[u8] = b"internal metadata";
    let world = World::start(&[("secret", ISO)]).await;
    // `localhost` is a name: it is resolved at plan time, to 127.0.0.1 (or ::1).
    let url = world.files_url.replace("127.0.0.1", "localhost");
    let iso = artifact(
        "ISO",
        "internal",
        &["pve1"],
        "internal-metadata.iso",
        &format!("{url}/secret"),
        Some(&sha256_hex(ISO)),
    );
    world.write("iso/internal.yaml", Some(&iso));
    world.write_agent_toml(&world.agent_toml().scope(""));
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(apply.status.code(), Some(1), "{}", stdout(&apply));
    let err = stderr(&apply);
    assert!(
        err.contains(
            "iso/internal.yaml:9:8: error: spec.url: download host `localhost` resolves to "
        ),
        "{err}"
    );
    assert!(err.contains("an internal address (loopback, private, link-local or this node's), and [scope] artifact_hosts in the agent config does not list it"), "{err}");
    assert!(world.writes().is_empty(), "{:?}", world.writes());

    world.write_agent_toml(&world.agent_toml().scope("artifact_hosts = [\"localhost\"]"));
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(apply.status.code(), Some(0), "{}", stderr(&apply));
    assert_eq!(
        world.listing("pve1", "local", "iso").await,
        ["local:iso/internal-metadata.iso"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_artifact_url_without_a_checksum_is_refused() {
    let world = World::start(&[("a.iso", b"bytes")]).await;
    let iso = artifact(
        "ISO",
        "a",
        &["pve1"],
        "a.iso",
        &format!("{}/a.iso", world.files_url),
        None,
    );
    world.write("iso/a.yaml", Some(&iso));
    world.write_agent_toml(&world.agent_toml().scope("artifact_hosts = [\"127.0.0.1\"]"));
    let plan = world.proxops(&["plan"]).await;
    assert_eq!(plan.status.code(), Some(1), "{}", stdout(&plan));
    assert!(
        stderr(&plan).contains("iso/a.yaml:9:8: error: spec.url: an `http://` download has no checksum, so anyone on the path can replace the file"),
        "{}",
        stderr(&plan)
    );
    assert!(world.writes().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_does_not_apply_a_revision_outside_the_scope_and_records_the_located_error() {
    let world = World::start(&[]).await;
    let repo = TestRepo::new();
    let good = repo.commit_files(&[("vm/web.yaml", &vm("web", "pve1", 150, ""))], "web");
    let (mut agent, _daemon) = start_agent(&world, &repo, |t| {
        t.scope(SIM_SCOPE).scope("vmids = \"100-199\"")
    })
    .await;
    agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(good.as_str()))
        .await;

    let bad = repo.commit_files(&[("vm/db.yaml", &vm("db", "pve1", 500, ""))], "db");
    world.sim.control().clear_requests();
    agent.hup();
    let status = agent
        .wait_for(|s| commit_of(s, "last_attempted").as_deref() == Some(bad.as_str()))
        .await;
    assert_eq!(status["last_attempted"]["outcome"], "invalid");
    assert_eq!(
        commit_of(&status, "last_applied").as_deref(),
        Some(good.as_str())
    );
    assert!(world.writes().is_empty(), "{:?}", world.writes());
    let state_dir = world.dir.path().join("state-pve1");
    let recorded: serde_json::Value =
        serde_json::from_str(&recorded_diagnostics(&state_dir, &bad)).unwrap();
    let error = &recorded[0];
    assert_eq!(
        (
            &error["path"],
            &error["line"],
            &error["column"],
            &error["field"]
        ),
        (
            &"vm/db.yaml".into(),
            &7.into(),
            &9.into(),
            &"spec.vmid".into()
        ),
        "{recorded:#}"
    );
    assert_eq!(
        error["message"],
        "vmid 500 is outside the operator's scope: [scope] vmids = \"100-199\" in the agent config"
    );
    assert_eq!(
        error["help"],
        "use a vmid in \"100-199\", or add 500 to [scope] vmids in agent.toml"
    );
    assert!(agent.terminate().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn more_creates_than_max_creates_wait_with_a_finding() {
    let world = World::start(&[]).await;
    let api = Api::new(&world);
    for (name, vmid) in [("a", 151), ("b", 152), ("c", 153)] {
        world.write(
            &format!("vm/{name}.yaml"),
            Some(&vm(name, "pve1", vmid, "")),
        );
    }
    world.write_agent_toml(&world.agent_toml().scope(SIM_SCOPE).scope("max_creates = 2"));
    let plan = world.proxops(&["plan", "--json"]).await;
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let deferred: Vec<&serde_json::Value> = plan["plan"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "deferred")
        .collect();
    assert_eq!(deferred.len(), 1, "{plan:#}");
    assert_eq!(deferred[0]["resource"]["name"], "c", "{plan:#}");
    assert!(
        deferred[0]["message"]
            .as_str()
            .unwrap()
            .contains("[scope] max_creates (2) reached; a later pass creates it"),
        "{plan:#}"
    );

    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(apply.status.code(), Some(0), "{}", stderr(&apply));
    assert!(stdout(&apply).contains("max_creates"), "{}", stdout(&apply));
    assert_eq!(vmids(&api).await, [151, 152]);
    // The next pass creates the one that waited.
    let apply = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(apply.status.code(), Some(0), "{}", stderr(&apply));
    assert_eq!(vmids(&api).await, [151, 152, 153]);
}

/// vmids of every guest in the cluster.
async fn vmids(api: &Api) -> Vec<u64> {
    let data = api.get("/cluster/resources?type=vm").await;
    let mut ids: Vec<u64> = data
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["vmid"].as_u64())
        .collect();
    ids.sort_unstable();
    ids
}

#[test]
fn validate_with_a_config_checks_the_checkout_against_its_scope_and_reads_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(repo.join("vm")).unwrap();
    std::fs::write(repo.join("vm/web.yaml"), vm("web", "pve1", 150, "")).unwrap();
    // Only `[scope]` is read: the token file this config names does not exist.
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        "[pve]\ntoken_secret_file = \"missing\"\n[scope]\nvmids = \"100-149\"\n",
    )
    .unwrap();
    let repo = repo.display().to_string();
    let config = config.display().to_string();
    let out = crate::support::proxops(&["validate", &repo, "--config", &config]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("vm/web.yaml:7:9: error: spec.vmid: vmid 150 is outside the operator's scope: [scope] vmids = \"100-149\" in the agent config"),
        "{}",
        stderr(&out)
    );
    let out = crate::support::proxops(&["validate", &repo]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
