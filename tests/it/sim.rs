//! A scenario world: the PVE simulator in-process, a file server on 127.0.0.1 for
//! download-url, a manifest repository and an agent.toml in a temp dir, and the built
//! `proxops` binary run against them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use proxops_pve_sim::{RequestRecord, RunningSim, SimConfig};

use crate::support::agent::AgentToml;

/// Simulator + file server + temp repository.
pub(crate) struct World {
    pub(crate) sim: RunningSim,
    pub(crate) files_url: String,
    pub(crate) dir: tempfile::TempDir,
}

impl World {
    /// Starts the simulator (HTTPS, short tasks) and a file server serving `files`.
    pub(crate) async fn start(files: &[(&str, &[u8])]) -> World {
        World::start_with(files, Duration::from_millis(50)).await
    }

    /// As [`World::start`], with every PVE task taking `task_duration`.
    pub(crate) async fn start_with(files: &[(&str, &[u8])], task_duration: Duration) -> World {
        let config = SimConfig {
            task_duration,
            ..SimConfig::default()
        };
        World::start_config(files, config).await
    }

    /// As [`World::start`], with the simulator started from `config` (its seed, task
    /// duration, pvestatd interval, ...).
    pub(crate) async fn start_config(files: &[(&str, &[u8])], config: SimConfig) -> World {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sim = proxops_pve_sim::start(config, listener).await.unwrap();
        let files_url = serve_files(files).await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("repo")).unwrap();
        std::fs::write(dir.path().join("token"), "proxops-dev-secret\n").unwrap();
        AgentToml::new(&sim).write(&dir.path().join("agent.toml"));
        World {
            sim,
            files_url,
            dir,
        }
    }

    /// The agent.toml of this world's CLI runs (`agent.toml` in its temp dir) as a builder:
    /// node `pve1`, the simulator's URL and pin, the token in `token`.
    pub(crate) fn agent_toml(&self) -> AgentToml {
        AgentToml::new(&self.sim)
    }

    /// Replaces the CLI's agent.toml with `toml` (e.g. `world.agent_toml().node("*")`).
    pub(crate) fn write_agent_toml(&self, toml: &AgentToml) {
        toml.write(&self.dir.path().join("agent.toml"));
    }

    /// The manifest repository folder.
    pub(crate) fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    /// Writes (or with `None`, removes) a manifest file in the repository.
    pub(crate) fn write(&self, rel: &str, contents: Option<&str>) {
        let path = self.repo().join(rel);
        match contents {
            Some(text) => {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, text).unwrap();
            }
            None => std::fs::remove_file(path).unwrap(),
        }
    }

    /// Runs `proxops <args> <repo> --config <agent.toml>` in a blocking thread.
    pub(crate) async fn proxops(&self, args: &[&str]) -> Output {
        let mut full: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        full.push(self.repo().display().to_string());
        full.push("--config".into());
        full.push(self.dir.path().join("agent.toml").display().to_string());
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_proxops"))
                .args(&full)
                .env_remove("RUST_LOG")
                .env_remove("PROXOPS_CONFIG")
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    }

    /// Every request the simulator saw.
    pub(crate) fn requests(&self) -> Vec<RequestRecord> {
        self.sim.control().requests().requests
    }

    /// Requests other than GET.
    pub(crate) fn writes(&self) -> Vec<RequestRecord> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }

    /// Volids of `content` on (node, storage), read through the simulator's API.
    pub(crate) async fn listing(&self, node: &str, storage: &str, content: &str) -> Vec<String> {
        let client = reqwest_client();
        let url = format!(
            "{}/nodes/{node}/storage/{storage}/content?content={content}",
            self.sim.base_url()
        );
        let body: serde_json::Value = client
            .get(url)
            .header(
                "Authorization",
                "PVEAPIToken=root@pam!proxops=proxops-dev-secret",
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let mut volids: Vec<String> = body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["volid"].as_str().unwrap().to_owned())
            .collect();
        volids.sort();
        volids
    }
}

/// Asserts that no request the simulator answered was refused by its schema check
/// (400 parameter verification or 501 unknown endpoint). `GET /cluster/nextid?vmid=` is the
/// exception: its 400 `VM N already exists` is the answer observe asks for.
pub(crate) fn assert_all_requests_valid(world: &World) {
    for r in world.requests() {
        if r.endpoint == "/cluster/nextid" && r.status == 400 {
            continue;
        }
        assert!(
            r.status != 400 && r.status != 501,
            "request refused by PVE's schema: {r:?}"
        );
    }
}

fn reqwest_client() -> reqwest::Client {
    // The simulator's certificate is self-signed; these reads only check test outcomes.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap()
}

/// Serves `files` by name over plain HTTP on 127.0.0.1, as the mirror PVE downloads from;
/// its base URL.
pub(crate) async fn serve_files(files: &[(&str, &[u8])]) -> String {
    let files: Arc<BTreeMap<String, Vec<u8>>> = Arc::new(
        files
            .iter()
            .map(|(n, b)| ((*n).to_owned(), b.to_vec()))
            .collect(),
    );
    let app = axum::Router::new().route(
        "/{name}",
        axum::routing::get(
            move |axum::extract::Path(name): axum::extract::Path<String>| {
                let files = files.clone();
                async move {
                    match files.get(&name) {
                        Some(bytes) => Ok(bytes.clone()),
                        None => Err(axum::http::StatusCode::NOT_FOUND),
                    }
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// SHA-256 of `bytes` in hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// An artifact manifest.
pub(crate) fn artifact(
    kind: &str,
    name: &str,
    nodes: &[&str],
    filename: &str,
    url: &str,
    checksum: Option<&str>,
) -> String {
    let mut text = format!(
        "apiVersion: proxops/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}\nspec:\n  nodes: [{}]\n  storage: local\n  filename: {filename}\n  url: {url}\n",
        nodes.join(", ")
    );
    if let Some(sum) = checksum {
        text.push_str(&format!(
            "  checksum:\n    algorithm: sha256\n    value: {sum}\n"
        ));
    }
    text
}
