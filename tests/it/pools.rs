//! Resource pools end to end (issue 16, SECURITY-AUDIT.md H1): `spec.pool` creates and clones
//! into the pool, a guest moved out of it is drift and moved back, and the pool-scoped token
//! of docs/operations.md ("Pool-scoped token") manages the guests of its pool and cannot
//! touch any other. The token tests seed the simulator with exactly the user, token, pool,
//! roles and ACL entries that the documented `pveum` commands create.

use std::collections::BTreeSet;
use std::time::Duration;

use proxops_pve_sim::{AclSeed, RoleSeed, Seed, SimConfig, TokenSeed, UserSeed};
use serde_json::Value;

use crate::check::{flag, pveum_commands};
use crate::pve_api::Api;
use crate::sim::{World, artifact, assert_all_requests_valid};
use crate::support::{stderr, stdout};

impl Api {
    /// vmid → the pool `/cluster/resources` reports it in (root sees every pool).
    async fn pools_of_guests(&self) -> Vec<(u64, Option<String>)> {
        let data = self.get("/cluster/resources?type=vm").await;
        let mut out: Vec<(u64, Option<String>)> = data
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g["vmid"].as_u64().unwrap(),
                    g["pool"].as_str().map(str::to_owned),
                )
            })
            .collect();
        out.sort();
        out
    }

    async fn pool_of(&self, vmid: u64) -> Option<String> {
        self.pools_of_guests()
            .await
            .into_iter()
            .find(|(id, _)| *id == vmid)
            .and_then(|(_, pool)| pool)
    }
}

fn vm(name: &str, vmid: u32, pool: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1
kind: VM
metadata: {{name: {name}}}
spec:
  node: pve1
  vmid: {vmid}
  pool: {pool}
  memory: 1GiB
  cpu: {{type: host, cores: 1}}
  disks:
    - {{storage: local-lvm, size: 8GiB}}
  networks:
    - {{bridge: vmbr0}}
"
    )
}

fn template_vm(pool: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1
kind: TemplateVM
metadata: {{name: golden}}
spec:
  node: pve1
  vmid: 9000
  pool: {pool}
  memory: 1GiB
  cpu: {{type: host, cores: 1}}
  disks:
    - {{storage: local-lvm, size: 4GiB}}
  networks:
    - {{bridge: vmbr0}}
"
    )
}

fn clone_vm(pool: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1
kind: VM
metadata: {{name: app}}
spec:
  node: pve1
  vmid: 130
  pool: {pool}
  memory: 1GiB
  cpu: {{type: host, cores: 1}}
  networks:
    - {{bridge: vmbr0}}
  clone: golden
"
    )
}

fn container(pool: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1
kind: LXC
metadata: {{name: dns-1}}
spec:
  node: pve1
  vmid: 201
  pool: {pool}
  template: debian-12
  memory: 512MiB
  cpu: {{cores: 1}}
  root: {{storage: local-lvm, size: 8GiB}}
  networks:
    - {{bridge: vmbr0, ip: 192.0.2.53/24, gw: 192.0.2.1}}
  dns: {{hostname: dns-1}}
  options: {{unprivileged: true}}
"
    )
}

fn ct_template(world: &World) -> String {
    artifact(
        "CTTemplate",
        "debian-12",
        &["pve1"],
        "debian-12-standard_12.12-1_amd64.tar.zst",
        &format!("{}/ct.tar.zst", world.files_url),
        None,
    )
}

fn assert_ok(out: &std::process::Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(out),
        stderr(out)
    );
}

fn all_output(out: &std::process::Output) -> String {
    format!("{}{}", stdout(out), stderr(out))
}

/// The `pool` parameter of each create and clone the simulator saw, by endpoint.
fn pools_sent(world: &World) -> BTreeSet<(String, String)> {
    world
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .filter(|r| {
            r.endpoint == "/nodes/{node}/qemu"
                || r.endpoint == "/nodes/{node}/lxc"
                || r.endpoint.ends_with("/clone")
        })
        .map(|r| {
            let pool = r.params.get("pool").cloned().unwrap_or_default();
            (r.endpoint, pool)
        })
        .collect()
}

/// Pools `prod` and `lab`, the default (root) token.
async fn world_with_pools() -> World {
    let seed = Seed {
        pools: vec!["prod".into(), "lab".into()],
        ..Seed::default()
    };
    World::start_config(
        &[("ct.tar.zst", b"a container template".as_slice())],
        SimConfig {
            seed,
            task_duration: Duration::from_millis(50),
            ..SimConfig::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_is_created_in_its_pool() {
    let world = world_with_pools().await;
    world.write("tvm/golden.yaml", Some(&template_vm("prod")));
    world.write("vm/app.yaml", Some(&clone_vm("prod")));
    world.write("vm/web.yaml", Some(&vm("web", 120, "prod")));
    world.write("ctt/debian-12.yaml", Some(&ct_template(&world)));
    world.write("lxc/dns-1.yaml", Some(&container("lab")));

    let plan = stdout(&world.proxops(&["plan"]).await);
    assert!(
        plan.contains("+ create VM/web on pve1 (vmid 120)"),
        "{plan}"
    );

    let out = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&out);
    let api = Api::new(&world);
    assert_eq!(
        api.pools_of_guests().await,
        vec![
            (120, Some("prod".into())),
            (130, Some("prod".into())),
            (201, Some("lab".into())),
            (9000, Some("prod".into())),
        ]
    );
    // Sent with the create or clone, never written into a guest config afterwards.
    assert_eq!(
        pools_sent(&world),
        BTreeSet::from([
            ("/nodes/{node}/lxc".to_owned(), "lab".to_owned()),
            ("/nodes/{node}/qemu".to_owned(), "prod".to_owned()),
            (
                "/nodes/{node}/qemu/{vmid}/clone".to_owned(),
                "prod".to_owned()
            ),
        ])
    );
    assert!(
        world
            .writes()
            .iter()
            .all(|w| !w.params.contains_key("pool") || w.method == "POST"),
        "{:?}",
        world.writes()
    );
    assert!(!world.writes().iter().any(|w| w.endpoint == "/pools"));
    assert_all_requests_valid(&world);

    // Converged: the next plan has nothing to do.
    let out = world.proxops(&["plan"]).await;
    assert!(
        stdout(&out).contains("no changes: PVE matches the desired state"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_moved_out_of_its_pool_is_reported_as_drift_and_moved_back() {
    let world = world_with_pools().await;
    world.write("vm/web.yaml", Some(&vm("web", 120, "prod")));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    let api = Api::new(&world);
    assert_eq!(api.pool_of(120).await.as_deref(), Some("prod"));

    // An operator moves the guest to another pool.
    api.put(
        "/pools",
        &[("poolid", "lab"), ("vms", "120"), ("allow-move", "1")],
    )
    .await;
    assert_eq!(api.pool_of(120).await.as_deref(), Some("lab"));

    let plan = stdout(&world.proxops(&["plan"]).await);
    assert!(
        plan.contains("~ update VM/web on pve1: pool: lab → prod"),
        "{plan}"
    );
    assert!(
        plan.contains(
            "because drift in spec.pool: the guest is in pool lab, the manifest says pool prod"
        ),
        "{plan}"
    );
    let before = world.writes().len();
    let out = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&out);
    let writes: Vec<_> = world.writes().into_iter().skip(before).collect();
    assert_eq!(writes.len(), 1, "only the move: {writes:?}");
    assert_eq!(writes[0].method, "PUT");
    assert_eq!(writes[0].endpoint, "/pools");
    assert_eq!(writes[0].params["poolid"], "prod");
    assert_eq!(writes[0].params["vms"], "120");
    assert_eq!(writes[0].status, 200);
    assert_eq!(api.pool_of(120).await.as_deref(), Some("prod"));

    // Out of every pool: moved back too.
    api.put(
        "/pools",
        &[("poolid", "prod"), ("vms", "120"), ("delete", "1")],
    )
    .await;
    let plan = stdout(&world.proxops(&["plan"]).await);
    assert!(
        plan.contains("~ update VM/web on pve1: pool: (none) → prod"),
        "{plan}"
    );
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    assert_eq!(api.pool_of(120).await.as_deref(), Some("prod"));
    assert_all_requests_valid(&world);

    // Without `pool` in the manifest, membership is not managed: no drift either way.
    world.write(
        "vm/web.yaml",
        Some(&vm("web", 120, "prod").replace("  pool: prod\n", "")),
    );
    let out = world.proxops(&["plan"]).await;
    assert!(
        stdout(&out).contains("no changes: PVE matches the desired state"),
        "{}",
        stdout(&out)
    );
}

// ---- the pool-scoped token ---------------------------------------------------------------

/// The `pveum` commands of docs/operations.md's "Pool-scoped token" section.
fn pool_recipe() -> Vec<Vec<String>> {
    pveum_commands("docs/operations.md", "### Pool-scoped token")
}

/// The simulator seed those commands produce (token secret `proxops-dev-secret`), with
/// `without` removed from every role, and the token's id.
fn pool_seed(without: Option<&str>) -> (Seed, String) {
    let mut seed = Seed::default();
    let mut token_id = String::new();
    for words in pool_recipe() {
        let args: Vec<&str> = words.iter().map(String::as_str).collect();
        match args.as_slice() {
            ["pveum", "pool", "add", poolid, ..] => seed.pools.push((*poolid).to_owned()),
            ["pveum", "user", "add", userid, ..] => seed.users.push(UserSeed {
                userid: (*userid).to_owned(),
                password: None,
                tokens: Vec::new(),
            }),
            ["pveum", "user", "token", "add", userid, id, ..] => {
                let user = seed
                    .users
                    .iter_mut()
                    .find(|u| u.userid == *userid)
                    .expect("the token's user is added first");
                user.tokens.push(TokenSeed {
                    id: (*id).to_owned(),
                    secret: "proxops-dev-secret".to_owned(),
                    privsep: flag(&words, "--privsep") != Some("0"),
                });
                token_id = format!("{userid}!{id}");
            }
            ["pveum", "role", "add", roleid, ..] => seed.roles.push(RoleSeed {
                roleid: (*roleid).to_owned(),
                privs: flag(&words, "--privs")
                    .expect("a role has --privs")
                    .split_whitespace()
                    .filter(|p| Some(*p) != without)
                    .map(str::to_owned)
                    .collect(),
            }),
            ["pveum", "acl", "modify", path, ..] => {
                let ugid = flag(&words, "--users").expect("the recipe grants to the user");
                for roleid in flag(&words, "--roles").unwrap().split(',') {
                    seed.acl.push(AclSeed {
                        path: (*path).to_owned(),
                        roleid: roleid.to_owned(),
                        kind: "user".to_owned(),
                        ugid: ugid.to_owned(),
                        propagate: true,
                    });
                }
            }
            other => panic!("a pveum command the test does not model: {other:?}"),
        }
    }
    assert_eq!(
        seed.pools,
        vec!["proxops".to_owned()],
        "the recipe adds one pool"
    );
    assert!(
        !seed.acl.iter().any(|a| a.path.starts_with("/vms")),
        "the recipe grants nothing on /vms"
    );
    seed.check().unwrap();
    (seed, token_id)
}

/// A world whose simulator holds the recipe's pool, user, token, roles and ACL entries
/// (minus `without`), and whose agent.toml uses that token, with `prune = true`.
async fn pool_token_world(without: Option<&str>) -> (World, String) {
    let (seed, token_id) = pool_seed(without);
    let world = World::start_config(
        &[("ct.tar.zst", b"a container template".as_slice())],
        SimConfig {
            seed,
            task_duration: Duration::from_millis(50),
            ..SimConfig::default()
        },
    )
    .await;
    world.write_agent_toml(
        &world
            .agent_toml()
            .token_id(&token_id)
            .policy("prune = true"),
    );
    (world, token_id)
}

fn write_pool_scenario(world: &World) {
    world.write("vm/web.yaml", Some(&vm("web", 120, "proxops")));
    world.write("ctt/debian-12.yaml", Some(&ct_template(world)));
    world.write("lxc/dns-1.yaml", Some(&container("proxops")));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_scoped_token_manages_guests_of_its_pool_end_to_end() {
    let (world, token_id) = pool_token_world(None).await;
    assert_eq!(token_id, "proxops@pve!agent");
    write_pool_scenario(&world);

    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(
        text.contains(&format!(
            "[ok     ] privilege {token_id}: holds every privilege"
        )),
        "{text}"
    );

    // Create (in the pool) and start.
    let out = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&out);
    assert!(
        world.writes().iter().all(|w| w.status == 200),
        "{:?}",
        world.writes()
    );
    let api = Api::new(&world);
    assert_eq!(
        api.pools_of_guests().await,
        vec![(120, Some("proxops".into())), (201, Some("proxops".into()))]
    );
    for (kind, vmid) in [("qemu", 120), ("lxc", 201)] {
        let status = api
            .get(&format!("/nodes/pve1/{kind}/{vmid}/status/current"))
            .await;
        assert_eq!(status["status"], "running", "{kind} {vmid}");
    }

    // Update: what the pool grants is enough on a guest of the pool.
    world.write(
        "vm/web.yaml",
        Some(&vm("web", 120, "proxops").replace("memory: 1GiB", "memory: 2GiB")),
    );
    let out = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&out);
    let config = api.config("pve1", "qemu", 120).await;
    assert_eq!(config["memory"], Value::from("2048"), "{config:?}");

    // Prune: shut down and delete the container no manifest declares any more.
    world.write("lxc/dns-1.yaml", None);
    let out = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&out);
    assert_eq!(
        api.pools_of_guests().await,
        vec![(120, Some("proxops".into()))]
    );
    assert!(
        world.writes().iter().all(|w| w.status == 200),
        "{:?}",
        world.writes()
    );
    assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_scoped_token_cannot_touch_a_guest_outside_its_pool() {
    let (world, _) = pool_token_world(None).await;
    let api = Api::new(&world);
    // Two guests outside the pool, both carrying the ownership tag: one declared, one not.
    for (vmid, name) in [("130", "db"), ("131", "old")] {
        let upid = api
            .post(
                "/nodes/pve1/qemu",
                &[
                    ("vmid", vmid),
                    ("name", name),
                    ("memory", "4096"),
                    ("scsi0", "local-lvm:8"),
                    ("tags", "proxops"),
                ],
            )
            .await;
        api.wait("pve1", upid.as_str().unwrap()).await;
    }
    world.write("vm/web.yaml", Some(&vm("web", 120, "proxops")));
    // The manifest declares guest 130 in the pool (and the ownership tag is on it).
    world.write("vm/db.yaml", Some(&vm("db", 130, "proxops")));

    let before = world.writes().len();
    let out = world.proxops(&["apply", "--yes"]).await;
    let all = all_output(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    // The token does not see guest 130 (`/cluster/resources` hides it), but the cluster's
    // vmid list says it is taken (SOURCE-AUDIT M25): a finding, and no create is sent.
    assert!(
        all.contains("vmid 130 exists in the cluster but is not visible to this token"),
        "{all}"
    );
    let writes: Vec<_> = world.writes().into_iter().skip(before).collect();
    let touched: Vec<_> = writes
        .iter()
        .filter(|w| w.path.contains("/130") || w.path.contains("/131"))
        .collect();
    assert!(touched.is_empty(), "{touched:?}");
    assert!(
        writes.iter().all(|w| w.status == 200)
            && writes
                .iter()
                .all(|w| w.params.get("vmid").map(String::as_str) != Some("130")),
        "nothing is sent for 130 and nothing is refused: {writes:?}"
    );
    // Both stay as they were: same memory, out of the pool, not pruned.
    for vmid in [130u32, 131] {
        let config = api.config("pve1", "qemu", vmid).await;
        assert_eq!(config["memory"], Value::from("4096"), "{vmid}: {config:?}");
    }
    assert_eq!(
        api.pools_of_guests().await,
        vec![(120, Some("proxops".into())), (130, None), (131, None)]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_scoped_token_lacking_power_management_is_told_the_pool_and_pve_refuses_the_start() {
    let (world, token_id) = pool_token_world(Some("VM.PowerMgmt")).await;
    world.write("vm/web.yaml", Some(&vm("web", 120, "proxops")));

    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(
        text.contains(&format!(
            "[PROBLEM] privilege VM.PowerMgmt on /pool/proxops: {token_id} lacks VM.PowerMgmt on /pool/proxops (needed for start VM/web on pve1)"
        )),
        "{text}"
    );
    assert!(
        text.contains("fix: pveum acl modify /pool/proxops --users 'proxops@pve'"),
        "{text}"
    );
    assert!(text.ends_with("1 problem found\n"), "{text}");

    let out = world.proxops(&["apply", "--yes"]).await;
    let all = all_output(&out);
    assert_ne!(out.status.code(), Some(0), "{all}");
    assert!(
        all.contains("Permission check failed (/vms/120, VM.PowerMgmt)"),
        "{all}"
    );
    // Created in the pool, then refused the start.
    let api = Api::new(&world);
    assert_eq!(api.pool_of(120).await.as_deref(), Some("proxops"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_scoped_token_without_pool_audit_is_told_so_by_check() {
    let (world, token_id) = pool_token_world(Some("Pool.Audit")).await;
    world.write("vm/web.yaml", Some(&vm("web", 120, "proxops")));
    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(
        text.contains(&format!(
            "[PROBLEM] privilege Pool.Audit on /pool/proxops: {token_id} lacks Pool.Audit on /pool/proxops (needed for observe the pool of VM/web on pve1)"
        )),
        "{text}"
    );
    // PVE hides the pool of the guests from such a token, so after the create every pass
    // sees the guest out of its pool and tries to move it, which PVE refuses.
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    let out = world.proxops(&["apply", "--yes"]).await;
    let all = all_output(&out);
    assert_ne!(out.status.code(), Some(0), "{all}");
    assert!(
        all.contains("Permission check failed (/pool/proxops, Pool.Allocate)"),
        "{all}"
    );
}
