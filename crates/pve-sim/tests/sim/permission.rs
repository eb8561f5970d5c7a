//! The handlers' own permission checks as PVE 9's sources make them: qemu-server `create_vm`
//! and `$update_vm_api`, pve-container `check_ct_modify_config_perm`, pve-guest-common
//! `assert_tag_permissions` and `check_vnet_access`, pve-manager's bridge listing. Each test
//! seeds a `--privsep 0` token whose user holds one custom role on `/`, minus what the test
//! is about.

use std::time::Duration;

use proxops_pve_sim::{AclSeed, DatacenterSeed, RoleSeed, Seed, SimConfig, TokenSeed, UserSeed};

use crate::{Sim, sim_with};

/// Every privilege a ProxOps pass may need on `/` (propagating).
pub const ALL: &[&str] = &[
    "VM.Audit",
    "VM.Allocate",
    "VM.Clone",
    "VM.PowerMgmt",
    "VM.Config.Disk",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.HWType",
    "VM.Config.Options",
    "VM.Config.Cloudinit",
    "Datastore.Audit",
    "Datastore.AllocateSpace",
    "Datastore.AllocateTemplate",
    "SDN.Use",
    "Sys.Audit",
    "Sys.AccessNetwork",
];

/// A simulator whose client is `proxops@pve!agent` (no privilege separation), its user
/// holding `privs` on `/` plus the extra ACL entries (path, privileges), with a CT template
/// and an ISO on `local` and the given datacenter tag settings.
pub async fn token_sim(
    privs: &[&str],
    extra: &[(&str, &[&str])],
    datacenter: DatacenterSeed,
) -> Sim {
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
    let mut grant = |roleid: String, path: &str, privs: &[&str]| {
        seed.roles.push(RoleSeed {
            roleid: roleid.clone(),
            privs: privs.iter().map(|p| (*p).to_owned()).collect(),
        });
        seed.acl.push(AclSeed {
            path: path.into(),
            roleid,
            kind: "user".into(),
            ugid: "proxops@pve".into(),
            propagate: true,
        });
    };
    grant("Base".into(), "/", privs);
    for (i, (path, privs)) in extra.iter().enumerate() {
        grant(format!("Extra{i}"), path, privs);
    }
    seed.pools.push("lab".into());
    seed.datacenter = datacenter;
    for volid in [
        "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst",
        "local:iso/netinst.iso",
    ] {
        seed.volumes.push(proxops_pve_sim::VolumeSeed {
            node: "pve1".into(),
            volid: volid.into(),
            size: 4096,
        });
    }
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

/// [`ALL`] without `without`.
pub fn all_but(without: &[&str]) -> Vec<&'static str> {
    ALL.iter()
        .copied()
        .filter(|p| !without.contains(p))
        .collect()
}

pub const TEMPLATE: &str = "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst";

#[tokio::test]
async fn a_vm_create_needs_no_disk_or_cdrom_privilege_only_storage_access() {
    let s = token_sim(
        &all_but(&["VM.Config.Disk", "VM.Config.CDROM"]),
        &[],
        DatacenterSeed::default(),
    )
    .await;
    let r = s
        .post(
            "/nodes/pve1/qemu",
            &[
                ("vmid", "100"),
                ("name", "web"),
                ("scsi0", "local-lvm:4"),
                ("ide2", "local:iso/netinst.iso,media=cdrom"),
                ("ide0", "local-lvm:cloudinit"),
                ("net0", "virtio,bridge=vmbr0"),
                ("tags", "proxops"),
            ],
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    s.wait_ok(&r.upid()).await;
    // Without Datastore.AllocateSpace the new disk is refused on its storage.
    let s = token_sim(
        &all_but(&["Datastore.AllocateSpace"]),
        &[],
        DatacenterSeed::default(),
    )
    .await;
    let r = s
        .post(
            "/nodes/pve1/qemu",
            &[("vmid", "100"), ("scsi0", "local-lvm:4")],
        )
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.message(),
        "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)\n"
    );
}

#[tokio::test]
async fn adding_a_cloud_init_drive_to_an_existing_vm_needs_cloudinit_and_cdrom() {
    let s = token_sim(
        &all_but(&["VM.Config.CDROM"]),
        &[],
        DatacenterSeed::default(),
    )
    .await;
    let upid = s
        .post("/nodes/pve1/qemu", &[("vmid", "100"), ("name", "web")])
        .await
        .upid();
    s.wait_ok(&upid).await;
    let r = s
        .put(
            "/nodes/pve1/qemu/100/config",
            &[("ide0", "local-lvm:cloudinit")],
        )
        .await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        r.message(),
        "Permission check failed (/vms/100, VM.Config.CDROM)\n"
    );
    // Swapping the ISO of a CD-ROM needs VM.Config.CDROM too.
    let r = s
        .put(
            "/nodes/pve1/qemu/100/config",
            &[("ide2", "local:iso/netinst.iso,media=cdrom")],
        )
        .await;
    assert_eq!(
        r.message(),
        "Permission check failed (/vms/100, VM.Config.CDROM)\n"
    );
    let s = token_sim(
        &all_but(&["VM.Config.Cloudinit"]),
        &[],
        DatacenterSeed::default(),
    )
    .await;
    let upid = s
        .post("/nodes/pve1/qemu", &[("vmid", "100"), ("name", "web")])
        .await
        .upid();
    s.wait_ok(&upid).await;
    let r = s
        .put(
            "/nodes/pve1/qemu/100/config",
            &[("ide0", "local-lvm:cloudinit")],
        )
        .await;
    assert_eq!(
        r.message(),
        "Permission check failed (/vms/100, VM.Config.Cloudinit)\n"
    );
    // The cloud-init keys are any-of Cloudinit or Network.
    let r = s
        .put("/nodes/pve1/qemu/100/config", &[("ciuser", "admin")])
        .await;
    assert_eq!(r.status, 200, "{r:?}");
}

#[tokio::test]
async fn a_vlan_tagged_nic_is_checked_on_the_vlan_path_only() {
    let s = token_sim(
        &all_but(&["SDN.Use"]),
        &[("/sdn/zones/localnetwork/vmbr0/20", &["SDN.Use"])],
        DatacenterSeed::default(),
    )
    .await;
    let create = |vmid: &'static str, net: &'static str| {
        let s = &s;
        async move {
            s.post("/nodes/pve1/qemu", &[("vmid", vmid), ("net0", net)])
                .await
        }
    };
    let ok = create("100", "virtio,bridge=vmbr0,tag=20").await;
    assert_eq!(ok.status, 200, "{ok:?}");
    let other = create("101", "virtio,bridge=vmbr0,tag=30").await;
    assert_eq!(
        other.message(),
        "Permission check failed (/sdn/zones/localnetwork/vmbr0/30, SDN.Use)\n"
    );
    let untagged = create("102", "virtio,bridge=vmbr0").await;
    assert_eq!(
        untagged.message(),
        "Permission check failed (/sdn/zones/localnetwork/vmbr0, SDN.Use)\n"
    );
    // A grant on a VLAN lets the token see the bridge; Sys.Audit on the node does not.
    let bridges = s.get_q("/nodes/pve1/network", &[("type", "bridge")]).await;
    assert_eq!(bridges.data()[0]["iface"], "vmbr0");
    let s = token_sim(&all_but(&["SDN.Use"]), &[], DatacenterSeed::default()).await;
    let bridges = s.get_q("/nodes/pve1/network", &[("type", "bridge")]).await;
    assert_eq!(
        bridges.data().as_array().map(Vec::len),
        Some(0),
        "{bridges:?}"
    );
}

#[tokio::test]
async fn a_container_tag_outside_the_allowed_list_needs_sys_modify_on_root() {
    let dc = DatacenterSeed {
        user_allow: Some("list".into()),
        user_allow_list: vec!["proxops".into()],
        registered_tags: vec!["prod".into()],
    };
    let s = token_sim(ALL, &[], dc.clone()).await;
    let ct = |vmid: &'static str, tags: &'static str| {
        let s = &s;
        async move {
            s.post(
                "/nodes/pve1/lxc",
                &[
                    ("vmid", vmid),
                    ("ostemplate", TEMPLATE),
                    ("rootfs", "local-lvm:8"),
                    ("tags", tags),
                ],
            )
            .await
        }
    };
    let ok = ct("200", "proxops").await;
    assert_eq!(ok.status, 200, "{ok:?}");
    let web = ct("201", "proxops;web").await;
    assert_eq!(web.status, 403);
    assert_eq!(
        web.message(),
        "Permission check failed (/, Sys.Modify for modifying tag 'web')\n"
    );
    let prod = ct("202", "prod").await;
    assert_eq!(
        prod.message(),
        "Permission check failed (/, Sys.Modify for modifying tag 'prod')\n"
    );
    // Every tag change needs VM.Config.Options on the guest itself.
    let s = token_sim(&all_but(&["VM.Config.Options"]), &[], dc).await;
    let r = s
        .post(
            "/nodes/pve1/lxc",
            &[
                ("vmid", "203"),
                ("ostemplate", TEMPLATE),
                ("rootfs", "local-lvm:8"),
                ("tags", "proxops"),
            ],
        )
        .await;
    assert_eq!(
        r.message(),
        "Permission check failed (/vms/203, VM.Config.Options)\n"
    );
}

#[tokio::test]
async fn a_vm_create_with_tags_fails_in_its_task_unless_tags_are_free_as_qemu_server_checks_them() {
    let dc = DatacenterSeed {
        user_allow: Some("list".into()),
        user_allow_list: vec!["proxops".into()],
        registered_tags: Vec::new(),
    };
    let s = token_sim(ALL, &[], dc).await;
    let r = s
        .post(
            "/nodes/pve1/qemu",
            &[
                ("vmid", "100"),
                ("scsi0", "local-lvm:4"),
                ("tags", "proxops"),
            ],
        )
        .await;
    // The checks before the worker pass; the worker's tag check "removes" the tag its own
    // `{}` stringifies to, which `user-allow=list` does not allow.
    assert_eq!(r.status, 200, "{r:?}");
    let status = s.wait(&r.upid()).await;
    assert_eq!(
        status["exitstatus"],
        "unable to create VM 100 - Permission check failed (/, Sys.Modify for modifying tag \
         'HASH(0x5a1e0c0ffee0)')"
    );
    assert_eq!(s.get("/nodes/pve1/qemu/100/config").await.status, 500);
    let lvm = s.get("/nodes/pve1/storage/local-lvm/content").await;
    assert_eq!(lvm.data().as_array().map(Vec::len), Some(0), "disks freed");
    // With the default `free` the same create succeeds.
    let s = token_sim(ALL, &[], DatacenterSeed::default()).await;
    let r = s
        .post("/nodes/pve1/qemu", &[("vmid", "100"), ("tags", "proxops")])
        .await;
    s.wait_ok(&r.upid()).await;
}

#[tokio::test]
async fn a_create_naming_a_pool_that_does_not_exist_is_refused_with_pves_403() {
    for auth in [
        None,
        Some("PVEAPIToken=root@pam!proxops=proxops-dev-secret"),
    ] {
        let mut s = token_sim(ALL, &[], DatacenterSeed::default()).await;
        if let Some(a) = auth {
            s.auth = Some(a.into());
        }
        let vm = s
            .post("/nodes/pve1/qemu", &[("vmid", "100"), ("pool", "nope")])
            .await;
        assert_eq!(vm.status, 403, "{vm:?}");
        assert_eq!(
            vm.message(),
            "Permission check failed (pool 'nope' does not exist)\n"
        );
        let ct = s
            .post(
                "/nodes/pve1/lxc",
                &[("vmid", "200"), ("ostemplate", TEMPLATE), ("pool", "nope")],
            )
            .await;
        assert_eq!(ct.status, 403, "{ct:?}");
        assert_eq!(
            ct.message(),
            "Permission check failed (pool 'nope' does not exist)\n"
        );
    }
}

#[tokio::test]
async fn vm_allocate_is_refused_without_naming_a_path() {
    let s = token_sim(&all_but(&["VM.Allocate"]), &[], DatacenterSeed::default()).await;
    let r = s.post("/nodes/pve1/qemu", &[("vmid", "100")]).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.message(), "Permission check failed\n");
    let r = s
        .post(
            "/nodes/pve1/lxc",
            &[("vmid", "200"), ("ostemplate", TEMPLATE)],
        )
        .await;
    assert_eq!(r.message(), "Permission check failed\n");
}

#[tokio::test]
async fn nesting_on_a_container_needs_vm_allocate_and_a_template_needs_read_access() {
    let mut s = token_sim(&all_but(&["VM.Allocate"]), &[], DatacenterSeed::default()).await;
    let token = s.auth.replace(crate::TOKEN.into());
    let r = s
        .post(
            "/nodes/pve1/lxc",
            &[
                ("vmid", "200"),
                ("ostemplate", TEMPLATE),
                ("rootfs", "local-lvm:8"),
            ],
        )
        .await;
    s.wait_ok(&r.upid()).await;
    s.auth = token;
    let r = s
        .put("/nodes/pve1/lxc/200/config", &[("features", "nesting=1")])
        .await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        r.message(),
        "Permission check failed (/vms/200, VM.Allocate)\n"
    );
    let s = token_sim(
        &all_but(&["Datastore.Audit", "Datastore.AllocateSpace"]),
        &[("/storage/local-lvm", &["Datastore.AllocateSpace"])],
        DatacenterSeed::default(),
    )
    .await;
    let r = s
        .post(
            "/nodes/pve1/lxc",
            &[
                ("vmid", "200"),
                ("ostemplate", TEMPLATE),
                ("rootfs", "local-lvm:8"),
            ],
        )
        .await;
    assert_eq!(
        r.message(),
        "Permission check failed (/storage/local, Datastore.AllocateSpace|Datastore.Audit)\n"
    );
    // The wrong content type is named before any privilege.
    let r = s
        .post(
            "/nodes/pve1/lxc",
            &[("vmid", "200"), ("ostemplate", "local:iso/netinst.iso")],
        )
        .await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.message(),
        "unable to use volume local:iso/netinst.iso - content type needs to be 'vztmpl'\n"
    );
}

#[tokio::test]
async fn cluster_options_show_the_tag_settings_only_with_sys_audit_on_root() {
    let dc = DatacenterSeed {
        user_allow: Some("existing".into()),
        user_allow_list: vec!["proxops".into()],
        registered_tags: vec!["prod".into()],
    };
    let s = token_sim(ALL, &[], dc.clone()).await;
    let r = s.get("/cluster/options").await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.data(),
        &serde_json::json!({
            "user-tag-access": {"user-allow": "existing", "user-allow-list": ["proxops"]},
            "registered-tags": ["prod"],
            "allowed-tags": ["proxops"],
        })
    );
    let s = token_sim(&all_but(&["Sys.Audit"]), &[], dc).await;
    let r = s.get("/cluster/options").await;
    assert_eq!(r.data(), &serde_json::json!({"allowed-tags": ["proxops"]}));
}
