//! `proxops check` against the simulator: version, node, storages with content types, bridges
//! and privileges. The default simulator token (`root@pam!proxops`) holds every privilege;
//! the least-privilege tests seed the user, token, roles and ACL entries that the `pveum`
//! commands of docs/operations.md create, so the documented set is what is tested.

use std::time::Duration;

use proxops_pve_sim::{AclSeed, RoleSeed, Seed, SimConfig, TokenSeed, UserSeed};

use crate::sim::{World, artifact};
use crate::support::{repo_root, stderr, stdout};

const VM: &str = "apiVersion: proxops/v1alpha1
kind: VM
metadata:
  name: web
spec:
  node: pve1
  vmid: 120
  memory: 1GiB
  cpu:
    type: host
    cores: 1
  disks:
    - storage: local-lvm
      size: 8GiB
      interface: scsi0
  networks:
    - bridge: vmbr0
";

#[tokio::test(flavor = "multi_thread")]
async fn a_repository_the_cluster_can_serve_passes_and_nothing_is_written() {
    let world = World::start(&[]).await;
    let url = format!("{}/netinst.iso", world.files_url);
    world.write(
        "iso/netinst.yaml",
        Some(&artifact(
            "ISO",
            "netinst",
            &["pve1"],
            "netinst.iso",
            &url,
            None,
        )),
    );
    world.write("vm/web.yaml", Some(VM));

    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("[ok     ] pve version: Proxmox VE 9."),
        "{text}"
    );
    assert!(
        text.contains("[ok     ] node pve1: exists and is online"),
        "{text}"
    );
    assert!(
        text.contains("[ok     ] storage local on pve1: has content iso"),
        "{text}"
    );
    assert!(
        text.contains("[ok     ] storage local-lvm on pve1: has content images"),
        "{text}"
    );
    assert!(
        text.contains("[ok     ] bridge vmbr0 on pve1: exists"),
        "{text}"
    );
    assert!(
        text.contains("[ok     ] privilege root@pam!proxops: holds every privilege"),
        "{text}"
    );
    assert!(
        text.contains("[ok     ] ha status: root@pam!proxops may read PVE's HA status"),
        "{text}"
    );
    assert!(text.ends_with("all checks passed\n"), "{text}");
    assert!(world.writes().is_empty(), "check never writes");
    let perms = world
        .requests()
        .into_iter()
        .filter(|r| r.endpoint == "/access/permissions")
        .count();
    assert!(perms >= 1, "asks PVE for the token's privileges");
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_storages_and_content_types_are_problems_with_a_fix() {
    let world = World::start(&[]).await;
    let url = format!("{}/debian.tar.zst", world.files_url);
    // A container template on local-lvm (images, rootdir: no vztmpl) and an ISO on a storage
    // the cluster does not have.
    world.write(
        "ctt/debian.yaml",
        Some(
            &artifact(
                "CTTemplate",
                "debian",
                &["pve1"],
                "debian.tar.zst",
                &url,
                None,
            )
            .replace("storage: local", "storage: local-lvm"),
        ),
    );
    world.write(
        "iso/netinst.yaml",
        Some(
            &artifact("ISO", "netinst", &["pve1"], "netinst.iso", &url, None)
                .replace("storage: local", "storage: nas"),
        ),
    );

    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(
        text.contains(
            "[PROBLEM] storage local-lvm on pve1: content vztmpl missing (has images,rootdir; \
             needed by CTTemplate/debian)"
        ) || text.contains("[PROBLEM] storage local-lvm on pve1: content vztmpl missing"),
        "{text}"
    );
    assert!(
        text.contains("fix: pvesm set local-lvm --content images,rootdir,vztmpl"),
        "{text}"
    );
    assert!(
        text.contains("[PROBLEM] storage nas on pve1: storage `nas` does not exist on pve1"),
        "{text}"
    );
    assert!(text.ends_with("2 problems found\n"), "{text}");

    let json = world.proxops(&["check", "--json"]).await;
    assert_eq!(json.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["ok"], false);
    let problems: Vec<&str> = report["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["status"] == "problem")
        .map(|i| i["subject"].as_str().unwrap())
        .collect();
    assert_eq!(problems, vec!["local-lvm on pve1", "nas on pve1"]);
    assert!(world.writes().is_empty(), "check never writes");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_the_cluster_does_not_have_is_a_problem() {
    let world = World::start(&[]).await;
    world.write("vm/web.yaml", Some(VM));
    let out = world.proxops(&["check", "--node", "pve9"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("[PROBLEM] node pve9: no such node (the cluster has pve1, pve2, pve3)"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_the_node_does_not_have_is_a_problem() {
    let world = World::start(&[]).await;
    world.write("vm/web.yaml", Some(&VM.replace("vmbr0", "vmbr7")));
    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("[PROBLEM] bridge vmbr7 on pve1: no bridge `vmbr7` on pve1 (used by VM/web)"),
        "{text}"
    );
    assert!(text.contains("fix: create it on pve1"), "{text}");
    assert!(world.writes().is_empty(), "check never writes");
}

/// The `pveum` commands of docs/operations.md section 1, each as its words (shell quoting
/// and `\` line continuations resolved; comments dropped).
fn documented_pveum_commands() -> Vec<Vec<String>> {
    pveum_commands("docs/operations.md", "## 1. A least-privilege API token")
}

/// The `pveum` commands of the first `sh` block after `heading` in `file`.
pub(crate) fn pveum_commands(file: &str, heading: &str) -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(repo_root().join(file)).unwrap();
    let section = doc
        .split(heading)
        .nth(1)
        .and_then(|rest| rest.split("```sh").nth(1))
        .and_then(|block| block.split("```").next())
        .unwrap_or_else(|| panic!("{file}: no sh block after {heading}"));
    let joined = section.replace("\\\n", " ");
    joined
        .lines()
        .map(|line| line.split(" #").next().unwrap_or(line).trim())
        .filter(|line| line.starts_with("pveum "))
        .map(shell_words)
        .collect()
}

#[test]
fn readme_and_the_operations_guide_give_the_same_pveum_commands() {
    let readme = pveum_commands("README.md", "## Running on a real cluster");
    assert!(readme.len() >= 4, "{readme:?}");
    assert_eq!(readme, documented_pveum_commands());
}

/// Splits a shell line into words: single and double quotes group, `$(...)` stays one word.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

pub(crate) fn flag<'a>(words: &'a [String], name: &str) -> Option<&'a str> {
    words
        .iter()
        .position(|w| w == name)
        .and_then(|i| words.get(i + 1))
        .map(String::as_str)
}

/// The simulator seed those commands produce (token secret `proxops-dev-secret`), with
/// `without` removed from every role.
fn documented_seed(without: Option<&str>) -> (Seed, String) {
    let mut seed = Seed::default();
    let mut token_id = String::new();
    for words in documented_pveum_commands() {
        let args: Vec<&str> = words.iter().map(String::as_str).collect();
        match args.as_slice() {
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
                let (kind, ugid) = match (flag(&words, "--users"), flag(&words, "--tokens")) {
                    (Some(u), _) => ("user", u),
                    (None, Some(t)) => ("token", t),
                    _ => panic!("acl modify without --users or --tokens: {words:?}"),
                };
                for roleid in flag(&words, "--roles").unwrap().split(',') {
                    seed.acl.push(AclSeed {
                        path: (*path).to_owned(),
                        roleid: roleid.to_owned(),
                        kind: kind.to_owned(),
                        ugid: ugid.to_owned(),
                        propagate: true,
                    });
                }
            }
            other => panic!("a pveum command the test does not model: {other:?}"),
        }
    }
    assert!(!token_id.is_empty(), "the doc creates a token");
    seed.check().unwrap();
    (seed, token_id)
}

/// A world whose simulator is seeded with the documented token (minus `without`), and whose
/// agent.toml uses that token.
async fn least_privilege_world(files: &[(&str, &[u8])], without: Option<&str>) -> (World, String) {
    let mut world = World::start(files).await;
    let (seed, token_id) = documented_seed(without);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = proxops_pve_sim::start(
        SimConfig {
            seed,
            task_duration: Duration::from_millis(50),
            ..SimConfig::default()
        },
        listener,
    )
    .await
    .unwrap();
    std::mem::replace(&mut world.sim, sim).shutdown().await;
    world.write_agent_toml(&world.agent_toml().token_id(&token_id));
    (world, token_id)
}

/// An ISO to download and a VM that boots it (so it depends on the download).
fn write_iso_and_installer(world: &World) {
    let url = format!("{}/netinst.iso", world.files_url);
    world.write(
        "iso/netinst.yaml",
        Some(&artifact(
            "ISO",
            "netinst",
            &["pve1"],
            "netinst.iso",
            &url,
            None,
        )),
    );
    world.write(
        "vm/web.yaml",
        Some(&format!(
            "{VM}  hardware:\n    cdrom:\n      iso: netinst\n"
        )),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_lacking_allocate_template_is_told_the_privilege_and_path_and_apply_stops_at_the_403()
 {
    let (world, token_id) = least_privilege_world(
        &[("netinst.iso", b"an installer".as_slice())],
        Some("Datastore.AllocateTemplate"),
    )
    .await;
    assert_eq!(token_id, "proxops@pve!agent");
    write_iso_and_installer(&world);

    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(
        text.contains(
            "[PROBLEM] privilege Datastore.AllocateTemplate on /storage/local: proxops@pve!agent \
             lacks Datastore.AllocateTemplate on /storage/local (needed for download \
             ISO/netinst on pve1)"
        ),
        "{text}"
    );
    assert!(
        text.contains("fix: pveum acl modify /storage/local --users 'proxops@pve'"),
        "{text}"
    );
    assert!(text.ends_with("1 problem found\n"), "{text}");
    assert!(world.writes().is_empty(), "check never writes");

    // apply: PVE refuses the download with its 403; the VM that boots the ISO is skipped,
    // so the only write is the refused download.
    let out = world.proxops(&["apply", "--yes"]).await;
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert_ne!(out.status.code(), Some(0), "{all}");
    assert!(
        all.contains("Permission check failed (/storage/local, Datastore.AllocateTemplate)"),
        "{all}"
    );
    let writes = world.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        writes[0].endpoint,
        "/nodes/{node}/storage/{storage}/download-url"
    );
    assert_eq!(writes[0].status, 403);
    assert!(world.listing("pve1", "local", "iso").await.is_empty());
}

/// A CT template to download and an unprivileged container from it.
fn write_template_and_container(world: &World) {
    let url = format!("{}/ct.tar.zst", world.files_url);
    world.write(
        "ctt/debian-12.yaml",
        Some(&artifact(
            "CTTemplate",
            "debian-12",
            &["pve1"],
            "debian-12-standard_12.12-1_amd64.tar.zst",
            &url,
            None,
        )),
    );
    world.write(
        "lxc/dns-1.yaml",
        Some(
            "apiVersion: proxops/v1alpha1
kind: LXC
metadata: {name: dns-1}
spec:
  node: pve1
  vmid: 201
  template: debian-12
  memory: 512MiB
  cpu: {cores: 1}
  root: {storage: local-lvm, size: 8GiB}
  networks:
    - {bridge: vmbr0, ip: 192.0.2.53/24, gw: 192.0.2.1}
  dns: {hostname: dns-1, nameservers: [1.1.1.1]}
  options: {unprivileged: true, nesting: true}
",
        ),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_documented_least_privilege_token_passes_check_and_applies() {
    let (world, token_id) = least_privilege_world(
        &[
            ("netinst.iso", b"an installer".as_slice()),
            ("ct.tar.zst", b"a container template".as_slice()),
        ],
        None,
    )
    .await;
    write_iso_and_installer(&world);
    write_template_and_container(&world);

    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(
        text.contains(&format!(
            "[ok     ] privilege {token_id}: holds every privilege"
        )),
        "{text}"
    );
    assert!(
        text.contains("[ok     ] bridge vmbr0 on pve1: exists"),
        "{text}"
    );

    let out = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        world.writes().iter().all(|w| w.status == 200),
        "{:?}",
        world.writes()
    );
    assert_eq!(
        world.listing("pve1", "local", "iso").await,
        vec!["local:iso/netinst.iso".to_owned()]
    );
    // One VM and one container created (in any order: same level, concurrent).
    let mut created: Vec<String> = world
        .requests()
        .into_iter()
        .filter(|r| {
            r.method == "POST"
                && (r.endpoint == "/nodes/{node}/qemu" || r.endpoint == "/nodes/{node}/lxc")
        })
        .map(|r| r.endpoint)
        .collect();
    created.sort();
    assert_eq!(created, vec!["/nodes/{node}/lxc", "/nodes/{node}/qemu"]);
}

/// The refusals `text` names: `Permission check failed (<path>, <privilege>)` as
/// (path, privilege), and a bare `Permission check failed` (PVE's `raise_perm_exc()`, which
/// create handlers give for `VM.Allocate`) as ("", "").
fn refusals(text: &str) -> std::collections::BTreeSet<(String, String)> {
    let mut out = std::collections::BTreeSet::new();
    for (i, _) in text.match_indices("Permission check failed") {
        let rest = &text[i + "Permission check failed".len()..];
        match rest
            .strip_prefix(" (")
            .and_then(|r| r.split_once(')'))
            .and_then(|(inner, _)| inner.split_once(", "))
        {
            Some((path, privilege)) if path.starts_with('/') => {
                out.insert((path.to_owned(), privilege.to_owned()));
            }
            _ => {
                out.insert((String::new(), String::new()));
            }
        }
    }
    out
}

/// The privilege problems of a `check` output: `[PROBLEM] privilege <P> on <path>:`.
fn predicted(text: &str) -> std::collections::BTreeSet<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("[PROBLEM] privilege "))
        .filter_map(|l| l.split_once(':').map(|(s, _)| s))
        .filter_map(|s| s.split_once(" on "))
        .map(|(p, path)| (path.to_owned(), p.to_owned()))
        .collect()
}

/// An ISO and a VM booting it (started, on a VLAN), a CT template and a container that does
/// not declare `unprivileged` (PVE 9 makes it unprivileged).
fn write_least_privilege_scenario(world: &World) {
    write_iso_and_installer(world);
    world.write(
        "vm/web.yaml",
        Some(&format!(
            "{}  state: started\n  hardware:\n    cdrom:\n      iso: netinst\n",
            VM.replace("- bridge: vmbr0\n", "- {bridge: vmbr0, vlan: 20}\n")
        )),
    );
    write_template_and_container(world);
    let lxc = std::fs::read_to_string(world.repo().join("lxc/dns-1.yaml")).unwrap();
    world.write(
        "lxc/dns-1.yaml",
        Some(&lxc.replace("{unprivileged: true, nesting: true}", "{nesting: true}")),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn check_with_each_documented_privilege_removed_names_exactly_the_refusal_pve_gives() {
    let files: &[(&str, &[u8])] = &[
        ("netinst.iso", b"an installer".as_slice()),
        ("ct.tar.zst", b"a container template".as_slice()),
    ];
    // The documented recipe is enough: check passes and apply converges.
    let (world, token_id) = least_privilege_world(files, None).await;
    write_least_privilege_scenario(&world);
    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    let out = world.proxops(&["apply", "--yes"]).await;
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(refusals(&all).is_empty(), "{all}");
    drop(world);

    let documented: Vec<String> = documented_pveum_commands()
        .into_iter()
        .filter(|w| w.get(1).map(String::as_str) == Some("role"))
        .filter_map(|w| flag(&w, "--privs").map(str::to_owned))
        .flat_map(|p| p.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    let mut needed = Vec::new();
    for privilege in &documented {
        let (world, _) = least_privilege_world(files, Some(privilege)).await;
        write_least_privilege_scenario(&world);
        let out = world.proxops(&["check"]).await;
        let check = stdout(&out);
        let predicted = predicted(&check);
        let out = world.proxops(&["apply", "--yes"]).await;
        let apply = format!("{}{}", stdout(&out), stderr(&out));
        let refused = refusals(&apply);
        assert!(
            predicted.iter().all(|(_, p)| p == privilege),
            "without {privilege}, check names other privileges:\n{check}"
        );
        if predicted.is_empty() {
            // Not needed by this scenario: PVE refuses nothing either.
            assert!(refused.is_empty(), "without {privilege}:\n{check}\n{apply}");
            assert_eq!(out.status.code(), Some(0), "without {privilege}:\n{apply}");
            continue;
        }
        needed.push(privilege.clone());
        if refused.is_empty() {
            // Reads are not refused: PVE hides what the token may not see (guests without
            // VM.Audit, storages without Datastore.AllocateSpace|Audit), so the pass cannot
            // act on them, and the next plan reports the hidden vmid (M25) rather than
            // creating it again.
            let plan = stdout(&world.proxops(&["plan"]).await);
            assert!(
                apply.contains("observe-failed")
                    || plan.contains("not visible to this token")
                    || plan.contains("+ create VM/web"),
                "without {privilege} PVE refused nothing and nothing was hidden:\n{apply}\n{plan}"
            );
            continue;
        }
        for refusal in &refused {
            if refusal.0.is_empty() {
                // A bare refusal: the create handlers' VM.Allocate check (`raise_perm_exc()`)
                // and the download's `or` of Sys.AccessNetwork / Sys.Audit+Sys.Modify.
                assert!(
                    ["VM.Allocate", "Sys.AccessNetwork"].contains(&privilege.as_str()),
                    "without {privilege}:\n{apply}"
                );
            } else {
                assert!(
                    predicted.contains(refusal),
                    "without {privilege}, PVE refused {refusal:?}, check predicted \
                     {predicted:?}:\n{check}\n{apply}"
                );
            }
        }
    }
    // This scenario exercises every privilege of the recipe except those that only updates
    // of existing guests or clones need (VM.Clone, VM.Config.CDROM, VM.Config.Cloudinit; the
    // simulator's permission tests cover them).
    for p in [
        "VM.Audit",
        "VM.Allocate",
        "VM.PowerMgmt",
        "VM.Config.Disk",
        "VM.Config.CPU",
        "VM.Config.Memory",
        "VM.Config.Network",
        "VM.Config.Options",
        "Datastore.AllocateSpace",
        "Datastore.AllocateTemplate",
        "SDN.Use",
        "Sys.AccessNetwork",
    ] {
        assert!(
            needed.iter().any(|n| n == p),
            "{p} was not needed: {needed:?}"
        );
    }
    let _ = token_id;
}

/// A second VM of the scenarios below, which the prune tests remove again.
fn old_vm() -> String {
    VM.replace("name: web", "name: old")
        .replace("vmid: 120", "vmid: 121")
}

/// The documented token (minus `without`) applies `vm/web.yaml` (and `vm/old.yaml` when
/// `with_old`) through `proxops apply`, so the guests exist and carry the ownership tag.
async fn applied_world(without: Option<&str>, with_old: bool) -> (World, String) {
    let (world, token_id) = least_privilege_world(&[], without).await;
    world.write("vm/web.yaml", Some(VM));
    if with_old {
        world.write("vm/old.yaml", Some(&old_vm()));
    }
    let out = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    (world, token_id)
}

/// The `[PROBLEM] privilege` lines of a check output.
fn privilege_problems(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("[PROBLEM] privilege "))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn with_snapshot_policy_risky_a_token_without_vm_snapshot_is_told_it_lacks_it() {
    let (world, token_id) = applied_world(Some("VM.Snapshot"), false).await;
    // A memory change is a risky update: the agent snapshots the guest first.
    world.write(
        "vm/web.yaml",
        Some(&VM.replace("memory: 1GiB", "memory: 2GiB")),
    );
    world.write_agent_toml(
        &world
            .agent_toml()
            .token_id(&token_id)
            .policy("snapshot = \"risky\""),
    );

    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert_eq!(
        privilege_problems(&text),
        vec![
            "[PROBLEM] privilege VM.Snapshot on /vms/120: proxops@pve!agent lacks VM.Snapshot \
             on /vms/120 (needed for snapshot VM/web on pve1 before its update ([policy] \
             snapshot = \"risky\"; proxops rollback needs it too))"
        ],
        "{text}"
    );
    assert!(
        text.contains(
            "fix: pveum acl modify /vms/120 --users 'proxops@pve' --roles <a role with \
             VM.Snapshot>"
        ),
        "{text}"
    );
    assert!(text.ends_with("1 problem found\n"), "{text}");

    // The guest's annotation wins over the policy, as in the agent: no snapshot, nothing
    // asked.
    world.write(
        "vm/web.yaml",
        Some(&VM.replace("memory: 1GiB", "memory: 2GiB").replace(
            "  name: web\n",
            "  name: web\n  annotations:\n    proxops/snapshot: \"off\"\n",
        )),
    );
    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(!text.contains("VM.Snapshot"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_backup_before_delete_a_token_without_vm_backup_is_told_it_lacks_it_for_the_prune() {
    let (world, token_id) = applied_world(None, true).await;
    world.write("vm/old.yaml", None);
    world.write_agent_toml(
        &world
            .agent_toml()
            .token_id(&token_id)
            .policy("prune = true\nbackup_before_delete = \"local\""),
    );

    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert_eq!(
        privilege_problems(&text),
        vec![
            "[PROBLEM] privilege VM.Backup on /vms/121: proxops@pve!agent lacks VM.Backup on \
             /vms/121 (needed for back up VM/old on pve1 before its delete ([policy] \
             backup_before_delete = \"local\"))"
        ],
        "{text}"
    );
    // The backup storage is checked for content `backup` like the executor does.
    assert!(
        text.contains("[ok     ] storage local on pve1: has content")
            && text
                .lines()
                .any(|l| l.starts_with("[ok     ] storage local on pve1:") && l.contains("backup")),
        "{text}"
    );
    assert!(text.ends_with("1 problem found\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_guest_agent_health_a_token_without_guest_agent_audit_is_told_it_lacks_it() {
    let (world, token_id) = least_privilege_world(&[], None).await;
    // A started VM this node's pass creates: the rollout's health pings its guest agent.
    world.write("vm/web.yaml", Some(&format!("{VM}  state: started\n")));
    let pmxcfs = crate::support::pmxcfs::Pmxcfs::new(Duration::from_secs(120));
    world.write_agent_toml(
        &world
            .agent_toml()
            .token_id(&token_id)
            .raw(&pmxcfs.toml("1s"))
            .raw("[rollout]\nwaves = [[\"pve1\"]]\nhealth = \"guest-agent\"\n"),
    );

    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert_eq!(
        privilege_problems(&text),
        vec![
            "[PROBLEM] privilege VM.GuestAgent.Audit on /vms/120: proxops@pve!agent lacks \
             VM.GuestAgent.Audit on /vms/120 (needed for ping the guest agent of VM/web on \
             pve1 after the pass ([rollout] health = \"guest-agent\")); or grant \
             VM.GuestAgent.Unrestricted on /vms/120"
        ],
        "{text}"
    );

    // With the default health (`power`) nothing is pinged and nothing asked.
    world.write_agent_toml(
        &world
            .agent_toml()
            .token_id(&token_id)
            .raw(&pmxcfs.toml("1s"))
            .raw("[rollout]\nwaves = [[\"pve1\"]]\n"),
    );
    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(!text.contains("GuestAgent"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_safety_net_off_check_asks_for_nothing_more_and_ha_is_only_a_warning() {
    // A token without VM.Snapshot, VM.Backup, a guest agent privilege or Sys.Audit.
    let (world, token_id) = applied_world(Some("VM.Snapshot"), true).await;
    // A risky update, a prune and a started VM: each would need more with its feature on.
    world.write("vm/old.yaml", None);
    world.write(
        "vm/web.yaml",
        Some(&format!(
            "{}  state: started\n",
            VM.replace("memory: 1GiB", "memory: 2GiB")
        )),
    );
    let off = world
        .agent_toml()
        .token_id(&token_id)
        .policy("snapshot = \"off\"\nprune = true");
    world.write_agent_toml(&off);

    let out = world.proxops(&["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(
        text.contains(&format!(
            "[ok     ] privilege {token_id}: holds every privilege"
        )),
        "{text}"
    );
    for privilege in ["VM.Snapshot", "VM.Backup", "GuestAgent", "VM.Monitor"] {
        assert!(!text.contains(privilege), "{privilege}:\n{text}");
    }
    // The HA status read is the agent's every pass: without Sys.Audit on / a warning, and
    // check still passes.
    assert!(
        text.contains(
            "[warning] ha status: proxops@pve!agent lacks Sys.Audit on / (needed to read PVE's \
             HA status each agent pass"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "fix: if you use HA: pveum acl modify / --users 'proxops@pve' --roles PVEAuditor"
        ),
        "{text}"
    );
    assert!(text.ends_with("all checks passed (1 warning)\n"), "{text}");
    let json = world.proxops(&["check", "--json"]).await;
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["ok"], true);
    assert!(
        report["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["check"] == "ha" && i["status"] == "warning"),
        "{report:#}"
    );

    // The same plan with the features on: both are asked for.
    world.write_agent_toml(
        &world
            .agent_toml()
            .token_id(&token_id)
            .policy("snapshot = \"risky\"\nprune = true\nbackup_before_delete = \"local\""),
    );
    let text = stdout(&world.proxops(&["check"]).await);
    let problems = privilege_problems(&text);
    assert_eq!(problems.len(), 2, "{text}");
    assert!(
        problems[0].starts_with("[PROBLEM] privilege VM.Snapshot on /vms/120"),
        "{text}"
    );
    assert!(
        problems[1].starts_with("[PROBLEM] privilege VM.Backup on /vms/121"),
        "{text}"
    );
}
