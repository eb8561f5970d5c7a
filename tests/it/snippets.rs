//! Cloud-init snippets written on the node (issue 21): the simulator's storages are real
//! directories (`SimConfig::storage_root`), and the agent, on the same machine, writes the
//! snippets into them. The file names are content-addressed; `cicustom` points at them; a
//! changed text is a new file, a new `cicustom`, a regenerated drive, and the old file goes
//! once the grace period is over. Secrets from the SOPS document are in the file only.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proxops_pve_sim::SimConfig;
use sha2::{Digest, Sha256};

use crate::pve_api::Api;
use crate::sim::World;
use crate::support::{stderr, stdout};

/// A VM with a cloud-init drive and `user-data`.
fn vm(user_data: &str, extra: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1
kind: VM
metadata: {{name: web}}
spec:
  node: pve1
  vmid: 130
  memory: 1GiB
  cpu: {{type: host, cores: 1}}
  disks:
    - {{storage: local-lvm, size: 4GiB}}
  hardware:
    cloud-init: {{enabled: true, storage: local-lvm}}
  cloud-init-data:
    user-data: |
{}
{extra}",
        user_data
            .lines()
            .map(|l| format!("      {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

/// A world whose file based storages live under `root`, the CLI's agent.toml with a short
/// grace period.
async fn world(root: &Path) -> World {
    let config = SimConfig {
        task_duration: Duration::from_millis(20),
        storage_root: Some(root.to_path_buf()),
        ..SimConfig::default()
    };
    let world = World::start_config(&[], config).await;
    world.write_agent_toml(&world.agent_toml().raw("[snippets]\ngrace = \"1s\"\n"));
    world
}

fn snippets_dir(root: &Path) -> PathBuf {
    root.join("local").join("snippets")
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn hash_name(kind: &str, text: &str) -> String {
    let hex = hex::encode(Sha256::digest(text.as_bytes()));
    format!("proxops-web-{kind}-{}.yaml", &hex[..12])
}

fn assert_ok(output: &std::process::Output) {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(output),
        stderr(output)
    );
}

async fn cicustom(world: &World) -> String {
    let config = Api::new(world).config("pve1", "qemu", 130).await;
    config
        .get("cicustom")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn user_data_is_written_by_hash_pointed_at_replaced_when_edited_and_the_old_file_removed_after_the_grace()
 {
    let root = tempfile::tempdir().unwrap();
    let world = world(root.path()).await;
    let first = "#cloud-config\npackages: [nginx]\n";
    world.write("vm/web.yaml", Some(&vm(first, "")));

    let plan = world.proxops(&["plan"]).await;
    let first_name = hash_name("user", first);
    assert!(
        stdout(&plan).contains(&format!(
            "+ write snippet local:snippets/{first_name} for VM/web on pve1"
        )),
        "{}",
        stdout(&plan)
    );
    assert!(
        !stdout(&plan).contains("nginx"),
        "plans never show snippet text"
    );
    assert!(
        files_in(&snippets_dir(root.path())).is_empty(),
        "plan writes nothing"
    );

    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    let dir = snippets_dir(root.path());
    assert_eq!(files_in(&dir), std::slice::from_ref(&first_name));
    assert_eq!(
        std::fs::read_to_string(dir.join(&first_name)).unwrap(),
        first
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join(&first_name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644, "readable by PVE");
    }
    assert_eq!(
        cicustom(&world).await,
        format!("user=local:snippets/{first_name}")
    );
    assert_eq!(
        world.listing("pve1", "local", "snippets").await,
        [format!("local:snippets/{first_name}")],
        "PVE lists the file ProxOps wrote"
    );

    // A second pass changes nothing.
    let writes = world.writes().len();
    let again = world.proxops(&["apply", "--yes"]).await;
    assert_ok(&again);
    assert!(stdout(&again).contains("no changes"), "{}", stdout(&again));
    assert_eq!(world.writes().len(), writes, "a second pass wrote to PVE");

    // Edited: a new file, cicustom updated, the drive regenerated; the old file stays for now.
    let second = "#cloud-config\npackages: [nginx, curl]\n";
    world.write("vm/web.yaml", Some(&vm(second, "")));
    let second_name = hash_name("user", second);
    let plan = world.proxops(&["plan"]).await;
    assert!(
        stdout(&plan).contains("then regenerate the cloud-init drive"),
        "{}",
        stdout(&plan)
    );
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    assert_eq!(
        cicustom(&world).await,
        format!("user=local:snippets/{second_name}")
    );
    assert_eq!(
        std::fs::read_to_string(dir.join(&second_name)).unwrap(),
        second
    );
    let regenerated: Vec<_> = world
        .writes()
        .into_iter()
        .filter(|r| r.method == "PUT" && r.endpoint == "/nodes/{node}/qemu/{vmid}/cloudinit")
        .collect();
    assert_eq!(regenerated.len(), 1, "one PUT .../cloudinit");
    assert_eq!(regenerated[0].status, 200);
    assert!(
        dir.join(&first_name).exists(),
        "kept during the grace period"
    );

    // Later passes remove the old file once its grace is over, and never the new one.
    let deadline = Instant::now() + Duration::from_secs(30);
    while dir.join(&first_name).exists() {
        assert!(
            Instant::now() < deadline,
            "the old snippet was never removed"
        );
        assert_ok(&world.proxops(&["apply", "--yes"]).await);
    }
    assert_eq!(files_in(&dir), [second_name]);
    crate::sim::assert_all_requests_valid(&world);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_of_another_tool_in_the_snippets_directory_is_never_removed() {
    let root = tempfile::tempdir().unwrap();
    let world = world(root.path()).await;
    let dir = snippets_dir(root.path());
    std::fs::write(dir.join("hand-made.yaml"), "#cloud-config\n").unwrap();
    std::fs::write(
        dir.join("proxops-old-user-0123456789ab.yaml"),
        "#cloud-config\n",
    )
    .unwrap();
    world.write("vm/web.yaml", Some(&vm("#cloud-config\n", "")));
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    let deadline = Instant::now() + Duration::from_secs(30);
    while dir.join("proxops-old-user-0123456789ab.yaml").exists() {
        assert!(
            Instant::now() < deadline,
            "the unreferenced ProxOps file stayed"
        );
        assert_ok(&world.proxops(&["apply", "--yes"]).await);
    }
    assert!(
        dir.join("hand-made.yaml").exists(),
        "only files with ProxOps's prefix go"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snippets_storage_without_snippets_content_is_a_finding_that_says_what_to_change() {
    let root = tempfile::tempdir().unwrap();
    let world = world(root.path()).await;
    world.write(
        "vm/web.yaml",
        Some(&vm("#cloud-config\n", "    snippets-storage: local-lvm\n")),
    );
    let plan = world.proxops(&["plan"]).await;
    let out = stdout(&plan);
    assert!(
        out.contains(
            "! snippets-storage VM/web on pve1: storage local-lvm has no `snippets` content (it has: images,rootdir)"
        ),
        "{out}"
    );
    assert!(
        out.contains("`pvesm set local-lvm --content images,rootdir,snippets`"),
        "{out}"
    );
    assert!(
        !out.contains("+ create"),
        "the VM is not created without its snippet: {out}"
    );
    let writes = world.writes().len();
    world.proxops(&["apply", "--yes"]).await;
    assert_eq!(world.writes().len(), writes, "nothing is written");
}

#[tokio::test(flavor = "multi_thread")]
async fn cicustom_in_extra_next_to_user_data_is_a_located_error() {
    let root = tempfile::tempdir().unwrap();
    let world = world(root.path()).await;
    world.write(
        "vm/web.yaml",
        Some(&vm(
            "#cloud-config\n",
            "  extra:\n    cicustom: user=local:snippets/mine.yaml\n",
        )),
    );
    let out = crate::support::proxops(&["validate", world.repo().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(
            "vm/web.yaml:17:5: error: spec.extra.cicustom: `cicustom` is set in `extra` next to `spec.cloud-init-data` snippets"
        ),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("help: ProxOps sets `cicustom`"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snippet_file_missing_from_the_repository_is_a_located_error_before_any_pve_request() {
    let root = tempfile::tempdir().unwrap();
    let world = world(root.path()).await;
    let manifest = vm("#cloud-config\n", "").replace(
        "    user-data: |\n      #cloud-config\n",
        "    user-data: {file: snippets/web-user.yaml}\n",
    );
    world.write("vm/web.yaml", Some(&manifest));
    let out = world.proxops(&["apply", "--yes"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "vm/web.yaml:14:23: error: spec.cloud-init-data.user-data.file: `snippets/web-user.yaml` is not in the revision"
        ),
        "{}",
        stderr(&out)
    );
    assert!(world.requests().is_empty(), "no PVE request");

    // Committed, the file's text is the snippet (and `snippets/` is never read as manifests).
    world.write(
        "snippets/web-user.yaml",
        Some("#cloud-config\nhostname: web\n"),
    );
    assert_ok(&world.proxops(&["apply", "--yes"]).await);
    let name = hash_name("user", "#cloud-config\nhostname: web\n");
    assert_eq!(
        cicustom(&world).await,
        format!("user=local:snippets/{name}")
    );
    assert!(snippets_dir(root.path()).join(name).exists());
}

/// The password of `cloud-init.passwords.default` in the fixture SOPS document.
const SECRET: &str = "s3cr3t-Passw0rd";

#[tokio::test(flavor = "multi_thread")]
async fn a_sops_value_in_a_snippet_is_in_the_file_only_and_nowhere_else() {
    use std::os::unix::fs::PermissionsExt;

    use crate::git_server::TestRepo;
    use crate::support::agent::{AgentProcess, database_values};
    use crate::support::fixture;

    let root = tempfile::tempdir().unwrap();
    let world = world(root.path()).await;
    let identity = world.dir.path().join("age-identity.txt");
    std::fs::copy(fixture("sops/getsops-sops/keys.txt"), &identity).unwrap();
    std::fs::set_permissions(&identity, std::fs::Permissions::from_mode(0o600)).unwrap();
    let user_data = "#cloud-config\nchpasswd:\n  users:\n    - {name: debian, password: ${secret:cloud-init.passwords.default}}\n";
    let files: Vec<(String, String)> = vec![
        (
            "clusters/lab/resources.yaml".into(),
            "resources:\n  - ../../vm/base/web.yaml\n".into(),
        ),
        (
            "clusters/lab/secrets.sops.yaml".into(),
            std::fs::read_to_string(fixture("sops-repo/clusters/lab/secrets.sops.yaml")).unwrap(),
        ),
        ("vm/base/web.yaml".into(), vm(user_data, "")),
    ];
    for (path, text) in &files {
        world.write(path, Some(text));
    }
    world.write_agent_toml(
        &world
            .agent_toml()
            .age_key_file(&identity)
            .raw("[snippets]\ngrace = \"1s\"\n"),
    );
    let cli = |args: &[&str]| {
        let mut full: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        full.push(world.repo().display().to_string());
        full.push("--config".into());
        full.push(world.dir.path().join("agent.toml").display().to_string());
        std::process::Command::new(env!("CARGO_BIN_EXE_proxops"))
            .args(&full)
            .env("RUST_LOG", "trace")
            .env_remove("PROXOPS_CONFIG")
            .env_remove("SOPS_AGE_KEY_FILE")
            .output()
            .unwrap()
    };
    let mut shown: Vec<(String, String)> = Vec::new();
    for args in [&["plan"][..], &["plan", "--json"][..]] {
        let out = cli(args);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        shown.push((args.join(" "), stdout(&out) + &stderr(&out)));
    }
    assert!(
        shown[0]
            .1
            .contains("+ write snippet local:snippets/proxops-web-user-"),
        "{}",
        shown[0].1
    );
    assert!(
        shown[0]
            .1
            .contains("content changed (it holds SOPS values, not shown)"),
        "{}",
        shown[0].1
    );

    // The agent applies the same files from git, records the pass, and serves its API.
    let repo = TestRepo::new();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    let commit = repo.commit_files(&refs, "a VM whose user-data holds a SOPS value");
    let daemon = repo.serve();
    let dir = world.dir.path();
    let toml = world
        .agent_toml()
        .cluster("lab")
        .state_dir(dir.join("state"))
        .source(&daemon.url("origin.git"))
        .poll("1s")
        .age_key_file(&identity)
        .raw("[snippets]\ngrace = \"1s\"\n");
    let mut agent = AgentProcess::spawn(&toml, &dir.join("agent-snippets.toml"), "trace");
    agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(commit.as_str()))
        .await;

    let snippets = snippets_dir(root.path());
    let names = files_in(&snippets);
    assert_eq!(names.len(), 1, "{names:?}");
    let written = std::fs::read_to_string(snippets.join(&names[0])).unwrap();
    assert!(
        written.contains(&format!("password: {SECRET}}}")),
        "{written}"
    );
    assert!(!written.contains("${secret:"), "{written}");
    let mode = std::fs::metadata(snippets.join(&names[0]))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "a snippet with secrets is root-readable only"
    );
    assert_eq!(
        cicustom(&world).await,
        format!("user=local:snippets/{}", names[0])
    );

    for path in [
        "/status",
        "/api/v1/status",
        "/api/v1/revisions",
        "/api/v1/drift",
        "/metrics",
        "/",
    ] {
        shown.push((path.to_owned(), agent.get_text(path).await.1));
    }
    assert!(agent.terminate().success());
    let database = std::fs::read_dir(&agent.state_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "db"))
        .expect("the agent's database");
    let text: Vec<String> = database_values(&database)
        .into_values()
        .flatten()
        .map(|(_, t)| t)
        .collect();
    let text = text.join("\n");
    assert!(
        text.contains(&names[0]),
        "the database records the write by file name"
    );
    shown.push(("database".into(), text));
    let log = agent.log_text() + &agent.stdout_text();
    assert!(log.contains("TRACE"), "the agent logged at trace level");
    shown.push(("agent log".into(), log));
    let requests = serde_json::to_string(&world.requests()).unwrap();
    shown.push(("PVE requests".into(), requests));
    for (what, text) in &shown {
        assert!(!text.contains(SECRET), "{what} holds the secret:\n{text}");
    }
}
