//! Per-token privileges: roles and ACL entries from the seed, `GET /access/permissions` as PVE
//! answers it, the schema's permission checks (403 `Permission check failed (<path>, <priv>)`)
//! and the handlers' own checks (guest create, listings filtered); `GET /nodes/{n}/network`.

use std::time::Duration;

use proxops_pve_sim::{AclSeed, RoleSeed, Seed, SimConfig, TokenSeed, UserSeed};
use serde_json::json;

use crate::{Sim, sim_with};

fn acl(path: &str, roleid: &str, kind: &str, ugid: &str) -> AclSeed {
    AclSeed {
        path: path.into(),
        roleid: roleid.into(),
        kind: kind.into(),
        ugid: ugid.into(),
        propagate: true,
    }
}

/// `proxops@pve!agent` (privilege separation) with a role that has everything ProxOps needs
/// except `Datastore.AllocateTemplate`; its user is PVEAdmin on `/`.
async fn restricted() -> Sim {
    let mut seed = Seed::default();
    seed.nodes[1].bridges = vec!["vmbr0".into(), "vmbr1".into()];
    seed.users.push(UserSeed {
        userid: "proxops@pve".into(),
        password: None,
        tokens: vec![TokenSeed {
            id: "agent".into(),
            secret: "s3cret".into(),
            privsep: true,
        }],
    });
    seed.roles.push(RoleSeed {
        roleid: "ProxOpsNoTemplates".into(),
        privs: [
            "VM.Allocate",
            "VM.Audit",
            "VM.Config.Disk",
            "VM.Config.CPU",
            "VM.Config.Memory",
            "VM.Config.Network",
            "VM.Config.Options",
            "VM.PowerMgmt",
            "Datastore.AllocateSpace",
            "Datastore.Audit",
            "Sys.Audit",
            "SDN.Use",
        ]
        .map(String::from)
        .to_vec(),
    });
    seed.acl = vec![
        acl("/", "PVEAdmin", "user", "proxops@pve"),
        acl("/", "ProxOpsNoTemplates", "token", "proxops@pve!agent"),
    ];
    let mut s = sim_with(SimConfig {
        seed,
        tls: false,
        task_duration: crate::TASK,
        lock_timeout: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await;
    s.auth = Some("PVEAPIToken=proxops@pve!agent=s3cret".into());
    s
}

#[tokio::test]
async fn a_token_lacking_allocate_template_gets_pves_403_on_download_url() {
    let s = restricted().await;
    let r = s
        .post(
            "/nodes/pve1/storage/local/download-url",
            &[
                ("content", "iso"),
                ("filename", "x.iso"),
                ("url", "http://127.0.0.1:9/x.iso"),
            ],
        )
        .await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        r.body,
        json!({"data": null, "message": "Permission check failed (/storage/local, Datastore.AllocateTemplate)\n"})
    );
    // Nothing was started.
    let tasks = s.get("/nodes/pve1/tasks").await;
    assert_eq!(tasks.data(), &json!([]));
}

#[tokio::test]
async fn access_permissions_reports_the_tokens_privileges_with_propagate_flags() {
    let s = restricted().await;
    let all = s.get("/access/permissions").await;
    assert_eq!(all.status, 200, "{all:?}");
    let storage = &all.data()["/storage"];
    assert_eq!(storage["Datastore.AllocateSpace"], 1);
    assert!(storage.get("Datastore.AllocateTemplate").is_none());
    // The token's role on / holds Sys.Audit, but the intersection with PVEAdmin drops nothing
    // else the role has; PVEAdmin itself has no Sys.Modify, so neither has the token.
    assert_eq!(all.data()["/"]["Sys.Audit"], 1);
    assert!(all.data()["/"].get("Sys.Modify").is_none());
    let one = s
        .get_q("/access/permissions", &[("path", "/storage/local")])
        .await;
    let keys: Vec<&String> = one.data()["/storage/local"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert!(keys.contains(&&"Datastore.Audit".to_string()), "{keys:?}");
    assert!(!keys.contains(&&"Datastore.AllocateTemplate".to_string()));
    // Another user's privileges need Sys.Audit on /access (the token has Sys.Audit there).
    let root = s
        .get_q("/access/permissions", &[("userid", "root@pam")])
        .await;
    assert_eq!(root.status, 200, "{root:?}");
    assert_eq!(root.data()["/"]["Permissions.Modify"], 1);
}

#[tokio::test]
async fn root_tokens_keep_every_privilege_by_default() {
    let s = crate::sim().await;
    let r = s
        .get_q("/access/permissions", &[("path", "/storage/local")])
        .await;
    assert_eq!(r.data()["/storage/local"]["Datastore.AllocateTemplate"], 1);
    assert_eq!(r.data()["/storage/local"]["Sys.Modify"], 1);
}

#[tokio::test]
async fn guest_create_needs_the_privileges_of_its_keys_and_storages() {
    let s = restricted().await;
    // The role lacks VM.Config.HWType.
    let r = s
        .post(
            "/nodes/pve1/qemu",
            &[("vmid", "100"), ("scsihw", "virtio-scsi-pci")],
        )
        .await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        r.message(),
        "Permission check failed (/vms/100, VM.Config.HWType)\n"
    );
    let ok = s
        .post(
            "/nodes/pve1/qemu",
            &[
                ("vmid", "101"),
                ("memory", "1024"),
                ("scsi0", "local-lvm:4"),
                ("net0", "virtio,bridge=vmbr0"),
            ],
        )
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    s.wait_ok(&ok.upid()).await;
    let cfg = s.get("/nodes/pve1/qemu/101/config").await;
    assert_eq!(cfg.data()["scsi0"], "local-lvm:vm-101-disk-0,size=4G");
}

#[tokio::test]
async fn listings_show_only_what_the_token_may_see() {
    let mut seed = Seed::default();
    seed.users.push(UserSeed {
        userid: "auditor@pve".into(),
        password: None,
        tokens: vec![TokenSeed {
            id: "ro".into(),
            secret: "s".into(),
            privsep: false,
        }],
    });
    seed.acl = vec![acl("/storage/local", "PVEAuditor", "user", "auditor@pve")];
    let mut s = sim_with(SimConfig {
        seed,
        tls: false,
        ..SimConfig::default()
    })
    .await;
    s.auth = Some("PVEAPIToken=auditor@pve!ro=s".into());
    let list = s.get("/nodes/pve1/storage").await;
    let ids: Vec<&str> = list
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["storage"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["local"]);
    let lvm = s.get("/nodes/pve1/storage/local-lvm/content").await;
    assert_eq!(lvm.status, 403);
    assert_eq!(
        lvm.message(),
        "Permission check failed (/storage/local-lvm, Datastore.Audit|Datastore.AllocateSpace)\n"
    );
    // /cluster/status needs Sys.Audit on /.
    assert_eq!(s.get("/cluster/status").await.status, 403);
}

#[tokio::test]
async fn the_network_listing_names_each_nodes_bridges() {
    let s = restricted().await;
    let bridges = |r: &crate::Resp| -> Vec<String> {
        r.data()
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["iface"].as_str().unwrap().to_owned())
            .collect()
    };
    let pve1 = s.get_q("/nodes/pve1/network", &[("type", "bridge")]).await;
    assert_eq!(pve1.status, 200, "{pve1:?}");
    assert_eq!(bridges(&pve1), vec!["vmbr0"]);
    assert_eq!(pve1.data()[0]["type"], "bridge");
    let pve2 = s
        .get_q("/nodes/pve2/network", &[("type", "any_bridge")])
        .await;
    assert_eq!(bridges(&pve2), vec!["vmbr0", "vmbr1"]);
    let all = s.get("/nodes/pve1/network").await;
    assert_eq!(bridges(&all), vec!["eno1", "vmbr0"]);
    let bad = s.get_q("/nodes/pve1/network", &[("type", "wifi")]).await;
    assert_eq!(bad.status, 400);
}
