//! Resource pools as pve-manager's `API2/Pool.pm` and pve-access-control's pool ACLs make
//! them: a guest in a pool inherits what `/pool/<pool>` grants, a create or clone into the
//! pool needs `VM.Allocate` there, `PUT /pools` moves guests with `allow-move` and the
//! handler's own checks, and `/cluster/resources` shows a guest's pool only with `Pool.Audit`.

use proxops_pve_sim::{AclSeed, RoleSeed, Seed, SimConfig, TokenSeed, UserSeed};

use crate::{Sim, TOKEN, sim_with};

const AGENT: &str = "PVEAPIToken=proxops@pve!agent=s3cret";

/// The guest privileges of the pool-scoped recipe (docs/operations.md).
const GUESTS: &[&str] = &[
    "VM.Audit",
    "VM.Allocate",
    "VM.PowerMgmt",
    "VM.Config.Disk",
    "VM.Config.CPU",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "Pool.Audit",
];

/// Pools `lab` and `prod`; `proxops@pve!agent` (no privilege separation) whose user holds
/// `pool_privs` on `/pool/lab` and the storage and bridge privileges a create needs, nothing
/// on `/vms`. The client starts as root.
async fn pool_sim(pool_privs: &[&str]) -> Sim {
    let mut seed = Seed::default();
    seed.users.push(UserSeed {
        userid: "proxops@pve".into(),
        password: None,
        tokens: vec![TokenSeed {
            id: "agent".into(),
            secret: "s3cret".into(),
            privsep: false,
        }],
    });
    for (roleid, path, privs) in [
        ("Guests", "/pool/lab", pool_privs),
        ("Storage", "/storage", &["Datastore.AllocateSpace"][..]),
        ("Network", "/sdn/zones/localnetwork", &["SDN.Use"][..]),
    ] {
        seed.roles.push(RoleSeed {
            roleid: roleid.into(),
            privs: privs.iter().map(|p| (*p).to_owned()).collect(),
        });
        seed.acl.push(AclSeed {
            path: path.into(),
            roleid: roleid.into(),
            kind: "user".into(),
            ugid: "proxops@pve".into(),
            propagate: true,
        });
    }
    seed.pools = vec!["lab".into(), "prod".into()];
    sim_with(SimConfig {
        seed,
        tls: false,
        task_duration: crate::TASK,
        ..SimConfig::default()
    })
    .await
}

fn as_agent(s: &mut Sim) {
    s.auth = Some(AGENT.into());
}

fn as_root(s: &mut Sim) {
    s.auth = Some(TOKEN.into());
}

async fn pool_in_resources(s: &Sim, vmid: u64) -> Option<String> {
    let r = s.get_q("/cluster/resources", &[("type", "vm")]).await;
    r.data()
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["vmid"] == vmid)
        .and_then(|e| e["pool"].as_str().map(str::to_owned))
}

#[tokio::test]
async fn a_guest_created_in_a_pool_is_managed_through_the_pools_acl_and_others_are_refused() {
    let mut s = pool_sim(GUESTS).await;
    // Outside the pool, made by root.
    s.create_vm("101", &[]).await;
    as_agent(&mut s);
    // VM.Allocate on /pool/lab is enough to create in it (qemu-server `create_vm`).
    s.create_vm("100", &[("pool", "lab")]).await;
    assert_eq!(pool_in_resources(&s, 100).await.as_deref(), Some("lab"));
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("memory", "2048")])
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    // The guest outside the pool is neither listed nor writable.
    assert_eq!(pool_in_resources(&s, 101).await, None);
    let listed = s.get_q("/cluster/resources", &[("type", "vm")]).await;
    assert!(
        listed
            .data()
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["vmid"] != 101),
        "{listed:?}"
    );
    let r = s
        .put("/nodes/pve1/qemu/101/config", &[("memory", "2048")])
        .await;
    assert_eq!(r.status, 403, "{r:?}");
    // The schema's `any` of VM.Config.* fails before the handler's per-key check.
    assert!(
        r.message()
            .starts_with("Permission check failed (/vms/101, VM.Config.Disk|"),
        "{r:?}"
    );
    let r = s.post("/nodes/pve1/qemu/101/status/start", &[]).await;
    assert_eq!(r.status, 403, "{r:?}");
    // Nor may it create outside the pool.
    let r = s
        .post(
            "/nodes/pve1/qemu",
            &[("vmid", "102"), ("memory", "512"), ("scsi0", "local-lvm:1")],
        )
        .await;
    assert_eq!(r.status, 403, "{r:?}");
    // GET /access/permissions lists the pool's guest with what the pool grants.
    let p = s.get("/access/permissions").await;
    assert_eq!(p.data()["/vms/100"]["VM.PowerMgmt"], 0, "{p:?}");
    assert!(p.data().get("/vms/101").is_none(), "{p:?}");
}

#[tokio::test]
async fn a_create_into_a_pool_without_vm_allocate_there_or_into_a_missing_pool_is_refused() {
    let mut s = pool_sim(&GUESTS[..GUESTS.len() - 1]).await;
    as_agent(&mut s);
    let form = |pool: &'static str| {
        vec![
            ("vmid", "100"),
            ("memory", "512"),
            ("scsi0", "local-lvm:1"),
            ("pool", pool),
        ]
    };
    let r = s.post("/nodes/pve1/qemu", &form("nope")).await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        r.message(),
        "Permission check failed (pool 'nope' does not exist)\n"
    );
    let r = s.post("/nodes/pve1/qemu", &form("prod")).await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(r.message(), "Permission check failed\n");
}

#[tokio::test]
async fn a_guest_moves_to_another_pool_only_with_allow_move() {
    let s = pool_sim(GUESTS).await;
    s.create_vm("100", &[("pool", "lab")]).await;
    let r = s.put("/pools", &[("poolid", "prod"), ("vms", "100")]).await;
    assert_eq!(r.status, 500, "{r:?}");
    assert_eq!(
        r.message(),
        "update pools failed: VM 100 belongs already to pool 'lab' and 'allow-move' is not set\n"
    );
    let r = s
        .put(
            "/pools",
            &[("poolid", "prod"), ("vms", "100"), ("allow-move", "1")],
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(pool_in_resources(&s, 100).await.as_deref(), Some("prod"));
    assert_eq!(
        s.get("/pools/lab").await.data()["members"],
        serde_json::json!([])
    );
    let members = s.get_q("/pools", &[("poolid", "prod")]).await;
    assert_eq!(members.data()[0]["members"][0]["vmid"], 100);
    // Adding a member again, or removing one that is not, is refused.
    let r = s.put("/pools", &[("poolid", "prod"), ("vms", "100")]).await;
    assert_eq!(
        r.message(),
        "update pools failed: VM 100 is already a pool member\n"
    );
    let r = s
        .put(
            "/pools",
            &[("poolid", "lab"), ("vms", "100"), ("delete", "1")],
        )
        .await;
    assert_eq!(
        r.message(),
        "update pools failed: VM 100 is not a pool member\n"
    );
    // The older path form takes the same parameters.
    let r = s
        .put("/pools/lab", &[("vms", "100"), ("allow-move", "1")])
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(pool_in_resources(&s, 100).await.as_deref(), Some("lab"));
}

#[tokio::test]
async fn a_pool_move_needs_pool_allocate_on_both_pools_and_modify_rights_on_the_guest() {
    let mut s = pool_sim(&[GUESTS, &["Pool.Allocate"]].concat()).await;
    s.create_vm("101", &[]).await;
    s.create_vm("102", &[("pool", "prod")]).await;
    as_agent(&mut s);
    // A guest in no pool the token may modify: check_perm_modify on /vms/101.
    let r = s.put("/pools", &[("poolid", "lab"), ("vms", "101")]).await;
    assert_eq!(r.status, 500, "{r:?}");
    assert_eq!(
        r.message(),
        "update pools failed: 403 Permission check failed (/vms/101, Permissions.Modify|VM.Allocate)\n"
    );
    // Out of another pool: the token lacks Pool.Allocate on /pool/prod (and rights on 102).
    let r = s
        .put(
            "/pools",
            &[("poolid", "lab"), ("vms", "102"), ("allow-move", "1")],
        )
        .await;
    assert_eq!(r.status, 500, "{r:?}");
    assert!(
        r.message()
            .starts_with("update pools failed: 403 Permission check failed"),
        "{r:?}"
    );
    // Into a pool it holds nothing on: the schema's Pool.Allocate check, a plain 403.
    let r = s.put("/pools", &[("poolid", "prod"), ("vms", "101")]).await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        r.message(),
        "Permission check failed (/pool/prod, Pool.Allocate)\n"
    );
    as_root(&mut s);
    assert_eq!(pool_in_resources(&s, 101).await, None);
    assert_eq!(pool_in_resources(&s, 102).await.as_deref(), Some("prod"));
}

#[tokio::test]
async fn a_token_without_pool_audit_sees_its_guests_but_not_their_pool() {
    let mut s = pool_sim(&GUESTS[..GUESTS.len() - 1]).await;
    s.create_vm("100", &[("pool", "lab")]).await;
    as_agent(&mut s);
    let r = s.get_q("/cluster/resources", &[("type", "vm")]).await;
    let entry = &r.data()[0];
    assert_eq!(entry["vmid"], 100, "{r:?}");
    assert!(entry.get("pool").is_none(), "{r:?}");
    // The pool list leaves out pools without Pool.Audit.
    assert_eq!(s.get("/pools").await.data(), &serde_json::json!([]));
}

#[tokio::test]
async fn a_destroyed_guest_leaves_its_pool() {
    let s = pool_sim(GUESTS).await;
    s.create_vm("100", &[("pool", "lab")]).await;
    let upid = s.delete("/nodes/pve1/qemu/100", &[]).await.upid();
    s.wait_ok(&upid).await;
    assert_eq!(
        s.get("/pools/lab").await.data()["members"],
        serde_json::json!([])
    );
    let r = s.delete("/pools/lab", &[]).await;
    assert_eq!(r.status, 200, "{r:?}");
}

#[tokio::test]
async fn a_guest_added_to_or_removed_from_a_pool_after_a_first_request_is_seen_by_the_next() {
    let mut s = pool_sim(GUESTS).await;
    s.create_vm("101", &[]).await;
    as_agent(&mut s);
    // The first request computes what the agent holds on /vms/101: nothing.
    let r = s.get("/nodes/pve1/qemu/101/config").await;
    assert_eq!(r.status, 403, "{r:?}");
    as_root(&mut s);
    let r = s.put("/pools", &[("poolid", "lab"), ("vms", "101")]).await;
    assert_eq!(r.status, 200, "{r:?}");
    as_agent(&mut s);
    let r = s.get("/nodes/pve1/qemu/101/config").await;
    assert_eq!(r.status, 200, "granted through the pool: {r:?}");
    as_root(&mut s);
    let r = s
        .put(
            "/pools",
            &[("poolid", "lab"), ("vms", "101"), ("delete", "1")],
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    as_agent(&mut s);
    let r = s.get("/nodes/pve1/qemu/101/config").await;
    assert_eq!(r.status, 403, "revoked with the pool membership: {r:?}");
}
