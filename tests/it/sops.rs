//! `proxops validate` checks `ssh-key-refs` / `ci-password-ref` against the key names of the
//! cluster's SOPS document (tests/fixtures/sops-repo), without an age identity.

use std::path::Path;

use crate::support::{fixture, proxops, stderr, stdout};

/// A copy of the fixture repository, with `edit` applied to its VM manifest.
fn repo_with(edit: impl Fn(String) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture("sops-repo"), dir.path());
    let vm = dir.path().join("vm/base/web.yaml");
    let text = std::fs::read_to_string(&vm).unwrap();
    std::fs::write(&vm, edit(text)).unwrap();
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn validate_accepts_refs_that_name_keys_of_the_sops_document() {
    let out = proxops(&["validate", "tests/fixtures/sops-repo"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "cluster lab: 1 resources in 1 files, 1 levels\n"
    );
    assert_eq!(stderr(&out), "");
}

#[test]
fn validate_reports_a_ref_missing_from_the_sops_document_at_the_ref() {
    let repo = repo_with(|t| {
        t.replace("cloud-init.ssh-keys.admin", "cloud-init.ssh-keys.ops")
            .replace("cloud-init.passwords.default", "cloud-init.passwords.root")
    });
    let out = proxops(&["validate", repo.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "vm/base/web.yaml:26:9: error: spec.cloud-init-data.ssh-key-refs[0]: `cloud-init.ssh-keys.ops` is not a key of clusters/lab/secrets.sops.yaml\n  \
         help: add it with `sops edit clusters/lab/secrets.sops.yaml` under `cloud-init.ssh-keys`, or use a name it has (admin, deploy)\n\
         vm/base/web.yaml:28:22: error: spec.cloud-init-data.ci-password-ref: `cloud-init.passwords.root` is not a key of clusters/lab/secrets.sops.yaml\n  \
         help: add it with `sops edit clusters/lab/secrets.sops.yaml` under `cloud-init.passwords`, or use a name it has (default, rescue)\n\
         error: 2 problems found; nothing of this revision would be applied\n"
    );
}

#[test]
fn validate_refuses_a_plain_secrets_file_and_a_missing_one() {
    let repo = repo_with(|t| t);
    let secrets = repo.path().join("clusters/lab/secrets.sops.yaml");
    std::fs::write(
        &secrets,
        "cloud-init:\n  ssh-keys:\n    admin: ssh-ed25519 AAAA x\n",
    )
    .unwrap();
    let out = proxops(&["validate", repo.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with(
            "clusters/lab/secrets.sops.yaml:1:1: error: not encrypted by sops (no `sops` metadata)\n"
        ),
        "{}",
        stderr(&out)
    );

    std::fs::remove_file(&secrets).unwrap();
    let out = proxops(&["validate", repo.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(
            "vm/base/web.yaml:26:9: error: spec.cloud-init-data.ssh-key-refs[0]: `cloud-init.ssh-keys.admin` cannot be resolved: cluster `lab` has no SOPS document clusters/lab/secrets.sops.yaml\n"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn validate_follows_the_secrets_file_named_in_the_cluster_config() {
    let repo = repo_with(|t| t);
    let lab = repo.path().join("clusters/lab");
    std::fs::rename(lab.join("secrets.sops.yaml"), lab.join("creds.sops.yaml")).unwrap();
    std::fs::write(
        lab.join("config.yaml"),
        "pve:\n  clusters:\n    lab:\n      base-url: https://10.0.0.1:8006\n      secrets-file: creds.sops.yaml\n",
    )
    .unwrap();
    let out = proxops(&["validate", repo.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
}

// ---------------------------------------------------------------------------------------------
// Applying: refs resolved from the SOPS document, written to PVE, and never shown anywhere.

use std::process::Command;

use crate::git_server::{GitDaemon, TestRepo};
use crate::pve_api::Api;
use crate::sim::World;
use crate::support::agent::{AgentProcess, database_values};

/// Every secret value of the fixture VM: the two public keys and the password.
const SECRETS: [&str; 3] = [
    "AAAAC3NzaC1lZDI1NTE5AAAAIHdvAdminKeyForTestsOnly",
    "AAAAC3NzaC1lZDI1NTE5AAAAIDeployKeyForTestsOnly",
    "s3cr3t-Passw0rd",
];

/// The keys as PVE stores them: joined in ref order, percent-encoded.
const ENCODED_KEYS: &str = "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIHdvAdminKeyForTestsOnly%20admin%40example%0A\
     ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIDeployKeyForTestsOnly%20deploy%40example";

fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(
            !text.contains(secret),
            "{what} holds the secret `{secret}`:\n{text}"
        );
    }
}

/// The fixture repository's files, by repository-relative path.
fn fixture_files() -> Vec<(String, String)> {
    [
        "clusters/lab/resources.yaml",
        "clusters/lab/secrets.sops.yaml",
        "vm/base/web.yaml",
    ]
    .iter()
    .map(|p| {
        let text = std::fs::read_to_string(fixture("sops-repo").join(p)).unwrap();
        ((*p).to_owned(), text)
    })
    .collect()
}

/// The test age identity, copied into `dir` readable only by its owner.
fn identity_in(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("age-identity.txt");
    std::fs::copy(fixture("sops/getsops-sops/keys.txt"), &path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A World whose repository is the SOPS fixture repository, `edit` applied to it, and whose
/// agent.toml names `identity` (none: no `[secrets]` section).
fn world_repo(world: &World, identity: Option<&Path>) {
    for (path, text) in fixture_files() {
        world.write(&path, Some(&text));
    }
    if let Some(identity) = identity {
        world.write_agent_toml(&world.agent_toml().age_key_file(identity));
    }
}

/// `proxops <args> <repo> --config <agent.toml>`, with no identity from the environment.
async fn cli(world: &World, args: &[&str]) -> std::process::Output {
    let mut full: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    full.push(world.repo().display().to_string());
    full.push("--config".into());
    full.push(world.dir.path().join("agent.toml").display().to_string());
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_proxops"))
            .args(&full)
            .env("RUST_LOG", "trace")
            .env_remove("PROXOPS_CONFIG")
            .env_remove("SOPS_AGE_KEY_FILE")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// Reads a guest's config through the simulator's API.
async fn guest_config(world: &World, vmid: u32) -> serde_json::Value {
    Api::new(world)
        .get(&format!("/nodes/pve1/qemu/{vmid}/config"))
        .await
}

/// The agent as a child process at trace level, following `repo` over git:// (served while
/// the returned daemon lives) for cluster `lab`, polling every second, with `identity`.
fn start_sops_agent(world: &World, repo: &TestRepo, identity: &Path) -> (AgentProcess, GitDaemon) {
    let daemon = repo.serve();
    let dir = world.dir.path();
    let toml = world
        .agent_toml()
        .cluster("lab")
        .state_dir(dir.join("state"))
        .source(&daemon.url("origin.git"))
        .poll("1s")
        .age_key_file(identity);
    let agent = AgentProcess::spawn(&toml, &dir.join("agent-sops.toml"), "trace");
    (agent, daemon)
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_and_password_from_refs_are_applied_by_the_agent_and_never_shown_anywhere() {
    let world = World::start(&[]).await;
    let identity = identity_in(world.dir.path());
    world_repo(&world, Some(&identity));

    // The CLI plan from the checkout: the VM is created with markers naming the refs.
    let plan = cli(&world, &["plan"]).await;
    assert_eq!(plan.status.code(), Some(2), "{}", stderr(&plan));
    let plan_json = cli(&world, &["plan", "--json"]).await;
    let plan_value: serde_json::Value = serde_json::from_slice(&plan_json.stdout).unwrap();
    let create = &plan_value["plan"]["levels"][0][0]["verb"];
    assert_eq!(create["verb"], "create", "{plan_value}");
    assert_eq!(
        create["params"]["sshkeys"],
        "(secret: cloud-init.ssh-keys.admin, cloud-init.ssh-keys.deploy)"
    );
    assert_eq!(
        create["params"]["cipassword"],
        "(secret: cloud-init.passwords.default)"
    );
    assert!(
        stdout(&plan).contains("+ create VM/web on pve1 (vmid 120)"),
        "{}",
        stdout(&plan)
    );
    let mut shown = vec![
        ("plan", stdout(&plan) + &stderr(&plan)),
        ("plan --json", stdout(&plan_json) + &stderr(&plan_json)),
    ];

    // The agent applies the commit of the same files.
    let repo = TestRepo::new();
    let files = fixture_files();
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    let commit = repo.commit_files(&files, "a VM whose keys and password are SOPS refs");
    let (agent, _daemon) = start_sops_agent(&world, &repo, &identity);
    agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(commit.as_str()))
        .await;

    let config = guest_config(&world, 120).await;
    assert_eq!(config["sshkeys"], ENCODED_KEYS, "{config}");
    assert_eq!(config["cipassword"], "**********", "{config}");
    assert_eq!(config["ciuser"], "debian", "{config}");
    let create = world
        .writes()
        .into_iter()
        .find(|r| r.method == "POST" && r.endpoint == "/nodes/{node}/qemu")
        .expect("the VM was created");
    assert_eq!(create.params["sshkeys"], ENCODED_KEYS);
    assert!(create.params.contains_key("cipassword"), "{create:?}");

    // Later passes (polling every second) write nothing: keys and password are in sync.
    let writes = world.writes().len();
    let applied = agent.wait_for(|_| true).await["last_applied"]["id"].clone();
    let later = agent
        .wait_for(|s| {
            s["last_attempted"]["id"].as_u64() > applied.as_u64()
                && s["last_attempted"]["outcome"].is_string()
        })
        .await;
    assert_eq!(later["last_attempted"]["outcome"], "no-change", "{later}");
    assert_eq!(world.writes().len(), writes, "a second pass wrote to PVE");

    // And the plan now plans nothing.
    let again = cli(&world, &["plan"]).await;
    assert_eq!(again.status.code(), Some(0), "{}", stdout(&again));
    shown.push(("second plan", stdout(&again) + &stderr(&again)));

    for path in [
        "/status",
        "/api/v1/status",
        "/api/v1/revisions",
        "/api/v1/drift",
        "/metrics",
        "/",
    ] {
        shown.push((path, agent.get_text(path).await.1));
    }
    let database = std::fs::read_dir(&agent.state_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "db"))
        .expect("the agent's database");
    let values = database_values(&database);
    let text: Vec<String> = values.into_values().flatten().map(|(_, t)| t).collect();
    shown.push(("database", text.join("\n")));
    assert!(
        shown
            .last()
            .is_some_and(|(_, db)| db.contains("(secret: cloud-init.passwords.default)")),
        "the database records the create with its markers"
    );
    let log = agent.log_text();
    assert!(
        log.contains("TRACE"),
        "the agent did not log at trace level"
    );
    shown.push(("agent log (trace)", log));
    for (what, text) in &shown {
        assert_no_secret(what, text);
    }
}

// ---------------------------------------------------------------------------------------------
// Failing closed: every way a ref cannot be resolved refuses the pass before any PVE request.

/// Runs `proxops apply --yes` on a World set up by `setup` and returns stderr; asserts exit 1
/// and that the simulator saw no request at all (not even a read, so certainly no write).
async fn refused_apply(setup: impl FnOnce(&World)) -> String {
    let world = World::start(&[]).await;
    setup(&world);
    let out = cli(&world, &["apply", "--yes"]).await;
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        world.requests().is_empty(),
        "PVE was asked: {:?}",
        world.requests()
    );
    assert_no_secret("stderr", &text);
    assert_no_secret("stdout", &stdout(&out));
    text
}

/// The error line of a refused apply (trace lines aside).
fn error_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or(stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ref_missing_from_the_document_refuses_the_pass_before_any_pve_request() {
    let text = refused_apply(|world| {
        let identity = identity_in(world.dir.path());
        world_repo(world, Some(&identity));
        let vm = world.repo().join("vm/base/web.yaml");
        let edited = std::fs::read_to_string(&vm)
            .unwrap()
            .replace("cloud-init.ssh-keys.deploy", "cloud-init.ssh-keys.ops");
        std::fs::write(vm, edited).unwrap();
    })
    .await;
    assert_eq!(
        error_line(&text),
        "error: cloud-init references cannot be resolved: clusters/lab/secrets.sops.yaml: \
         spec.cloud-init-data.ssh-key-refs[1]: `cloud-init.ssh-keys.ops` is missing in the SOPS document"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_age_identity_refuses_the_pass_before_any_pve_request() {
    let text = refused_apply(|world| world_repo(world, None)).await;
    assert_eq!(
        error_line(&text),
        "error: cloud-init references cannot be resolved: no age identity to decrypt \
         clusters/lab/secrets.sops.yaml: set [secrets] age_key_file in agent.toml or SOPS_AGE_KEY_FILE"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_age_identity_refuses_the_pass_before_any_pve_request() {
    let text = refused_apply(|world| {
        let other = world.dir.path().join("other-identity.txt");
        std::fs::copy(fixture("sops/fluxcd/age.txt"), &other).unwrap();
        world_repo(world, Some(&other));
    })
    .await;
    assert!(
        error_line(&text).starts_with(
            "error: cloud-init references cannot be resolved: clusters/lab/secrets.sops.yaml: wrong age identity: "
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unencrypted_document_refuses_the_pass_before_any_pve_request() {
    let text = refused_apply(|world| {
        let identity = identity_in(world.dir.path());
        world_repo(world, Some(&identity));
        world.write(
            "clusters/lab/secrets.sops.yaml",
            Some("cloud-init:\n  ssh-keys:\n    admin: ssh-ed25519 AAAA x\n    deploy: ssh-ed25519 AAAB y\n  passwords:\n    default: plain\n"),
        );
    })
    .await;
    assert_eq!(
        error_line(&text),
        "error: cloud-init references cannot be resolved: clusters/lab/secrets.sops.yaml: \
         not encrypted by sops (no `sops` metadata); encrypt it with `sops encrypt --age ...`"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tampered_document_refuses_the_pass_before_any_pve_request() {
    let text = refused_apply(|world| {
        let identity = identity_in(world.dir.path());
        world_repo(world, Some(&identity));
        // One value swapped for another's ciphertext: each still authenticates on its own
        // key path only if untouched, and the MAC covers them all.
        let path = world.repo().join("clusters/lab/secrets.sops.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let mac_line = text
            .lines()
            .find(|l| l.trim_start().starts_with("mac: ENC["))
            .unwrap()
            .to_owned();
        let tampered_mac = flip_base64_char(&mac_line, "data:");
        std::fs::write(path, text.replace(&mac_line, &tampered_mac)).unwrap();
    })
    .await;
    assert_eq!(
        error_line(&text),
        "error: cloud-init references cannot be resolved: clusters/lab/secrets.sops.yaml: \
         MAC mismatch: the file was changed without sops"
    );
}

/// `line` with the first base64 character after `marker` changed to another one.
fn flip_base64_char(line: &str, marker: &str) -> String {
    let at = line.find(marker).unwrap() + marker.len();
    let old = line.as_bytes()[at];
    let new = if old == b'A' { 'B' } else { 'A' };
    format!("{}{new}{}", &line[..at], &line[at + 1..])
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_records_an_unresolvable_ref_as_a_refused_revision_and_writes_nothing() {
    let world = World::start(&[]).await;
    let other = world.dir.path().join("other-identity.txt");
    std::fs::copy(fixture("sops/fluxcd/age.txt"), &other).unwrap();
    let repo = TestRepo::new();
    let files = fixture_files();
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    let commit = repo.commit_files(&files, "refs the agent's identity cannot decrypt");
    let (agent, _daemon) = start_sops_agent(&world, &repo, &other);
    let status = agent
        .wait_for(|s| {
            s["last_attempted"]["commit"].as_str() == Some(commit.as_str())
                && s["last_attempted"]["outcome"].is_string()
        })
        .await;
    assert_eq!(status["last_attempted"]["outcome"], "invalid", "{status}");
    assert!(status["last_applied"].is_null(), "{status}");
    let reason = agent.get_text("/status").await.1;
    assert!(reason.contains("wrong age identity"), "{reason}");
    assert!(world.writes().is_empty(), "{:?}", world.writes());
}

/// A config write through the simulator's API, as an operator would make out of band.
async fn pve_put(world: &World, vmid: u32, form: &[(&str, &str)]) {
    Api::new(world)
        .put(&format!("/nodes/pve1/qemu/{vmid}/config"), form)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_out_of_band_key_is_corrected_and_the_password_is_written_only_when_pve_has_none() {
    let world = World::start(&[]).await;
    let identity = identity_in(world.dir.path());
    world_repo(&world, Some(&identity));
    let out = cli(&world, &["apply", "--yes"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // A foreign key replaces ours: the plan corrects sshkeys only (the password is present),
    // showing the refs, never the live keys.
    pve_put(
        &world,
        120,
        &[("sshkeys", "ssh-rsa%20AAAAB3intruder%20x%40y")],
    )
    .await;
    let plan = cli(&world, &["plan"]).await;
    assert_eq!(plan.status.code(), Some(2), "{}", stderr(&plan));
    let text = stdout(&plan);
    assert!(
        text.contains("sshkeys") && text.contains("cloud-init.ssh-keys.admin"),
        "{text}"
    );
    assert!(!text.contains("cipassword"), "{text}");
    assert!(!text.contains("intruder"), "live keys are shown: {text}");
    assert_no_secret("plan", &text);
    world.sim.control().clear_requests();
    let out = cli(&world, &["apply", "--yes"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let writes = world.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].params["sshkeys"], ENCODED_KEYS);
    assert!(!writes[0].params.contains_key("cipassword"), "{writes:?}");
    assert_eq!(guest_config(&world, 120).await["sshkeys"], ENCODED_KEYS);

    // The password removed out of band: written again, once.
    pve_put(&world, 120, &[("delete", "cipassword")]).await;
    assert!(guest_config(&world, 120).await.get("cipassword").is_none());
    world.sim.control().clear_requests();
    let out = cli(&world, &["apply", "--yes"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_no_secret("apply", &(stdout(&out) + &stderr(&out)));
    let writes = world.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert!(writes[0].params.contains_key("cipassword"), "{writes:?}");
    assert!(!writes[0].params.contains_key("sshkeys"), "{writes:?}");
    assert_eq!(guest_config(&world, 120).await["cipassword"], "**********");

    let settled = cli(&world, &["plan"]).await;
    assert_eq!(settled.status.code(), Some(0), "{}", stdout(&settled));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clone_gets_its_own_keys_and_password_instead_of_its_templates() {
    let world = World::start(&[]).await;
    let identity = identity_in(world.dir.path());
    world_repo(&world, Some(&identity));
    world.write(
        "clusters/lab/resources.yaml",
        Some("resources:\n  - ../../templatevm/base/golden.yaml\n  - ../../vm/base/app.yaml\n"),
    );
    world.write("vm/base/web.yaml", None);
    world.write(
        "templatevm/base/golden.yaml",
        Some(
            "apiVersion: proxops/v1alpha1\nkind: TemplateVM\nmetadata: {name: golden}\nspec:\n  \
             node: pve1\n  vmid: 9000\n  memory: 1GiB\n  cpu: {type: host, cores: 1}\n  \
             disks: [{storage: local-lvm, size: 4GiB}]\n  networks: [{bridge: vmbr0}]\n  \
             hardware:\n    cloud-init: {enabled: true, storage: local-lvm}\n  \
             cloud-init-data:\n    ssh-key-refs: [cloud-init.ssh-keys.deploy]\n    \
             ci-password-ref: cloud-init.passwords.rescue\n",
        ),
    );
    world.write(
        "vm/base/app.yaml",
        Some(
            "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata: {name: app}\nspec:\n  node: pve1\n  \
             vmid: 301\n  clone: golden\n  memory: 1GiB\n  cpu: {type: host, cores: 1}\n  \
             networks: [{bridge: vmbr0}]\n  cloud-init-data:\n    \
             ssh-key-refs: [cloud-init.ssh-keys.admin]\n    \
             ci-password-ref: cloud-init.passwords.default\n",
        ),
    );
    let out = cli(&world, &["apply", "--yes"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_no_secret("apply", &(stdout(&out) + &stderr(&out)));

    let config = guest_config(&world, 301).await;
    assert_eq!(
        config["sshkeys"],
        "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIHdvAdminKeyForTestsOnly%20admin%40example"
    );
    assert_eq!(config["cipassword"], "**********");
    let clone_config_writes: Vec<_> = world
        .writes()
        .into_iter()
        .filter(|r| r.path.starts_with("/nodes/pve1/qemu/301/config"))
        .collect();
    assert_eq!(clone_config_writes.len(), 1, "{clone_config_writes:?}");
    assert!(
        clone_config_writes[0].params.contains_key("cipassword"),
        "the template's password was kept: {clone_config_writes:?}"
    );

    let again = cli(&world, &["plan"]).await;
    assert_eq!(again.status.code(), Some(0), "{}", stdout(&again));
}

// `proxops check` resolves the references like a pass would, and reports a failure as a
// checklist problem instead of stopping.

/// The `secrets` line of `proxops check`'s output.
fn secrets_line(stdout: &str) -> &str {
    stdout
        .lines()
        .find(|l| l.contains("] secrets SOPS: "))
        .unwrap_or("(no secrets line)")
}

#[tokio::test(flavor = "multi_thread")]
async fn check_reports_the_references_resolved_with_the_agents_identity() {
    let world = World::start(&[]).await;
    let identity = identity_in(world.dir.path());
    world_repo(&world, Some(&identity));
    let out = cli(&world, &["check"]).await;
    let text = stdout(&out);
    assert_eq!(
        secrets_line(&text),
        "[ok     ] secrets SOPS: the cloud-init references of 1 guest(s) resolve from the cluster's document",
        "{text}"
    );
    assert_no_secret("check output", &text);
    assert_no_secret("check log", &stderr(&out));
    assert!(world.writes().is_empty(), "{:?}", world.writes());
}

#[tokio::test(flavor = "multi_thread")]
async fn check_names_a_wrong_identity_as_a_problem_with_what_to_do() {
    let world = World::start(&[]).await;
    let other = world.dir.path().join("other-identity.txt");
    std::fs::copy(fixture("sops/fluxcd/age.txt"), &other).unwrap();
    world_repo(&world, Some(&other));
    let out = cli(&world, &["check"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        secrets_line(&text).starts_with(
            "[PROBLEM] secrets SOPS: cloud-init references cannot be resolved: \
             clusters/lab/secrets.sops.yaml: wrong age identity: "
        ),
        "{text}"
    );
    assert!(
        text.contains("fix: fix the reference or the document, or give the agent its age identity")
    );
    assert_no_secret("check output", &text);
    assert!(world.writes().is_empty(), "{:?}", world.writes());
}
