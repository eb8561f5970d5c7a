//! `proxops migrate-config` end to end: a Go repository's `proxops.yaml` plus
//! `clusters/<c>/config.yaml` and the `PROXOPS_*` environment → an agent.toml that
//! `AgentConfig::load` accepts, with the secrets in 0600 files and never on stdout or stderr.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use proxops::config::AgentConfig;
use secrecy::ExposeSecret;

use crate::support::fixture;

const PVE_SECRET: &str = "0f0e0d0c-1111-2222-3333-444455556666";
const GIT_SECRET: &str = "gitea-token-from-env-0123";

#[test]
fn a_go_repository_becomes_a_loadable_agent_toml_with_secrets_in_0600_files() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("ops");
    std::fs::create_dir_all(repo.join("clusters/lab")).unwrap();
    std::fs::copy(fixture("migrate/proxops.yaml"), repo.join("proxops.yaml")).unwrap();
    std::fs::write(
        repo.join("clusters/lab/config.yaml"),
        "pve:\n  ca-file: /etc/pve/pve-root-ca.pem\n  user: proxops@pve\n  token-id: agent\n  \
         clusters:\n    lab:\n      base-url: https://192.168.1.2:8006\n      nodes: [pve2]\n\
         git:\n  branch: prod\n",
    )
    .unwrap();
    let secrets = dir.path().join("etc");
    let out_file = dir.path().join("agent.toml");

    let out = Command::new(env!("CARGO_BIN_EXE_proxops"))
        .args(["migrate-config", "--repo"])
        .arg(&repo)
        .arg("--secrets-dir")
        .arg(&secrets)
        .env_remove("PROXOPS_CONFIG")
        .env_remove("PROXOPS_PVE_TOKEN_VALUE")
        .env_remove("PROXOPS_PVE_USER")
        .env("PROXOPS_PVE_TOKEN", PVE_SECRET)
        .env("PROXOPS_GIT_TOKEN", GIT_SECRET)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    for text in [&stdout, &stderr] {
        assert!(!text.contains(PVE_SECRET), "a secret was printed:\n{text}");
        assert!(!text.contains(GIT_SECRET), "a secret was printed:\n{text}");
    }
    assert!(stdout.contains("cluster = \"lab\""), "{stdout}");
    assert!(
        stdout.contains("token_id = \"proxops@pve!agent\""),
        "{stdout}"
    );
    assert!(stderr.contains("mapped: PROXOPS_PVE_TOKEN →"), "{stderr}");
    assert!(
        stderr.contains("warning: prune is OFF by default in ProxOps"),
        "{stderr}"
    );
    assert!(stderr.contains("summary: "), "{stderr}");

    for (name, value) in [("pve-token-secret", PVE_SECRET), ("git-token", GIT_SECRET)] {
        let path = secrets.join(name);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name}");
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim_end(), value);
    }

    // The same run with --out writes the file; it loads as an agent config.
    let out = Command::new(env!("CARGO_BIN_EXE_proxops"))
        .args(["migrate-config", "--repo"])
        .arg(&repo)
        .arg("--secrets-dir")
        .arg(&secrets)
        .arg("--out")
        .arg(&out_file)
        .env_remove("PROXOPS_CONFIG")
        .env("PROXOPS_PVE_TOKEN", PVE_SECRET)
        .env("PROXOPS_GIT_TOKEN", GIT_SECRET)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
    let config = AgentConfig::load(&out_file).unwrap();
    assert_eq!(config.cluster.as_deref(), Some("lab"));
    assert_eq!(config.pve.url, "https://192.168.1.2:8006");
    assert_eq!(config.pve.token_id, "proxops@pve!agent");
    assert_eq!(config.pve.token_secret.expose_secret(), PVE_SECRET);
    assert_eq!(config.listen.to_string(), "0.0.0.0:9494");
    assert!(!config.policy.prune);
    assert_eq!(config.policy.max_prune, 3);
    let source = config.source.unwrap();
    assert!(source.url.starts_with("file:///"), "{}", source.url);
    assert_eq!(source.branch, "prod");
    assert_eq!(source.token.unwrap().expose_secret(), GIT_SECRET);
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert!(
        text.contains(&format!("{}/pve-token-secret", secrets.display())),
        "{text}"
    );

    // agent.toml beside the secrets (the packaged layout): the files are named by their
    // credential names, which resolve beside agent.toml.
    let beside = secrets.join("agent.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_proxops"))
        .args(["migrate-config", "--repo"])
        .arg(&repo)
        .arg("--secrets-dir")
        .arg(&secrets)
        .arg("--out")
        .arg(&beside)
        .env_remove("PROXOPS_CONFIG")
        .env("PROXOPS_PVE_TOKEN", PVE_SECRET)
        .env("PROXOPS_GIT_TOKEN", GIT_SECRET)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = std::fs::read_to_string(&beside).unwrap();
    assert!(
        text.contains("token_secret_file = \"pve-token-secret\"\n"),
        "{text}"
    );
    let config = AgentConfig::load(&beside).unwrap();
    assert_eq!(config.pve.token_secret.expose_secret(), PVE_SECRET);
}

#[test]
fn ticket_auth_exits_1_and_never_prints_the_password() {
    let out = Command::new(env!("CARGO_BIN_EXE_proxops"))
        .args(["migrate-config", "--from"])
        .arg(fixture("migrate/ticket.yaml"))
        .args(["--secrets-dir", "/nonexistent/never-written"])
        .env_remove("PROXOPS_CONFIG")
        .env("PROXOPS_PVE_PASSWORD", "env-password-123")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("error: pve.auth: ticket: ProxOps authenticates with API tokens only"));
    let all = format!("{}{stderr}", String::from_utf8_lossy(&out.stdout));
    assert!(
        !all.contains("hunter2") && !all.contains("env-password-123"),
        "{all}"
    );
}
