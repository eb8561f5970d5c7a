//! `proxops demo`: the whole product in one command, with no cluster and no config.
//!
//! It starts the PVE simulator in-process (HTTPS, a two-node cluster `homelab`, every task
//! taking [`TASK_DURATION`] so a person can follow), a file server on 127.0.0.1 serving
//! generated stand-ins for the artifacts of `examples/` (whose URLs point to the internet; the
//! demo's copy points them at this server), a git repository made from `examples/`, and an
//! agent.toml in a temporary directory. Then it runs the real agent loop
//! ([`crate::serve::run`], the code path of `proxops agent`) and shows: the plan of the first
//! pass (computed by the same `reconcile` functions the pass uses), the pass's progress and
//! record (read from the agent's store as it writes it), an out-of-band change made through
//! PVE's API (a downloaded ISO deleted; a VM's memory changed when this build manages guests),
//! the drift as the next plan sees it, a signed webhook delivery to the agent's own listener,
//! the correcting pass, and the records as the agent's status API answers them. Then it stops
//! everything and removes the temporary directory (kept with `--keep`).
//!
//! Secrets: the simulator's token secret and the webhook secret are random per run, live only
//! in files of the temporary directory, and are never printed.

mod repo;
mod show;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hmac::{KeyInit, Mac};
use proxops_pve::request::{self, ConfigUpdate, Params};
use proxops_pve::{PveClient, Upid, WaitOptions, wait_for_task};
use proxops_pve_sim::{RunningSim, Seed, SimConfig};
use proxops_store::{ActionRecord, PassId, PassSummary, Store};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::agent::{AgentError, database_path, http_addr_path};
use crate::config::AgentConfig;
use crate::http::{PassJson, StatusJson};
use crate::output;
use crate::reconcile::{self, Context, Mode, NoHooks, Pass, PlanOptions};
use crate::source::directory::read_manifest_files;

/// How long every simulated PVE task runs.
pub const TASK_DURATION: Duration = Duration::from_millis(300);
/// The longest the demo waits for one pass.
const PASS_TIMEOUT: Duration = Duration::from_secs(60);
/// Steps shown.
const STEPS: usize = 7;

/// The artifact deleted out of band: the ISO of `examples/iso/base/debian-netinst.yaml` on the
/// node whose guests do not use it.
const ISO_NODE: &str = "pve1";
const ISO_STORAGE: &str = "local";
const ISO_VOLID: &str = "local:iso/debian-13.2.0-amd64-netinst.iso";
/// The guest changed out of band: `examples/vm/homelab/installer.yaml` (stopped, 2GiB).
const VM_NODE: &str = "pve2";
const VM_VMID: u32 = 102;
const VM_NAME: &str = "VM/installer";
const VM_MEMORY_DECLARED: &str = "2048";
const VM_MEMORY_CHANGED: &str = "1024";

/// What `proxops demo` was asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Leave the temporary directory (repository, agent.toml, state database) in place.
    pub keep: bool,
}

/// Runs the demo. `Ok(true)` when the agent applied the repository and corrected the drift.
///
/// # Errors
/// When something the demo needs could not be set up (no `git`, no free port, …).
pub async fn run(options: Options) -> anyhow::Result<bool> {
    let scratch = Scratch::create(options.keep)?;
    let path = scratch.path.clone();
    let result = run_in(&path).await;
    drop(scratch);
    if options.keep {
        show::line(&format!(
            "kept {} (repo/, agent.toml, state/state.db)",
            path.display()
        ));
    } else {
        show::line(&format!("removed {}", path.display()));
    }
    result
}

/// The temporary directory, removed on drop unless kept.
struct Scratch {
    path: PathBuf,
    keep: bool,
}

impl Scratch {
    fn create(keep: bool) -> anyhow::Result<Scratch> {
        use std::os::unix::fs::DirBuilderExt;
        let path =
            std::env::temp_dir().join(format!("proxops-demo-{:016x}", rand::random::<u64>()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(Scratch { path, keep })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A random secret (128 bits, hex).
fn secret() -> String {
    format!("{:032x}", rand::random::<u128>())
}

async fn run_in(dir: &Path) -> anyhow::Result<bool> {
    show::line("ProxOps demo: a simulated two-node PVE cluster, a git repository made from");
    show::line(
        "examples/, and the real agent loop (`proxops agent`) keeping one in line with the other.",
    );

    // 1. The simulator and the file server.
    show::step(
        1,
        STEPS,
        "start a simulated PVE cluster and a file server for the artifacts",
    );
    let token_secret = secret();
    let mut seed = Seed {
        cluster_name: "homelab".to_owned(),
        ..Seed::default()
    };
    seed.nodes.retain(|n| n.name == "pve1" || n.name == "pve2");
    let sim_config = SimConfig {
        seed,
        tls: true,
        root_password: secret(),
        token_secret: token_secret.clone(),
        task_duration: TASK_DURATION,
        ..SimConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the simulator's port")?;
    let sim = proxops_pve_sim::start(sim_config, listener)
        .await
        .context("starting the PVE simulator")?;
    let outcome = with_sim(dir, &sim, &token_secret).await;
    sim.shutdown().await;
    show::line("");
    show::line("stopped the agent, the file server and the simulator");
    outcome
}

async fn with_sim(dir: &Path, sim: &RunningSim, token_secret: &str) -> anyhow::Result<bool> {
    let fingerprint = sim
        .fingerprint()
        .context("the simulator serves HTTPS and has a fingerprint")?
        .to_owned();
    let pve_url = sim.base_url().trim_end_matches("/api2/json").to_owned();
    show::info(&format!(
        "PVE simulator (in this process): {pve_url}, cluster homelab, nodes pve1 and pve2, every task takes {} ms",
        TASK_DURATION.as_millis()
    ));
    show::info(&format!("certificate fingerprint (SHA-256): {fingerprint}"));

    let files_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the file server's port")?;
    let files_base = format!("http://{}", files_listener.local_addr()?);
    let (manifests, served) = repo::rewritten(&files_base);
    let stop_files = CancellationToken::new();
    let files_task = tokio::spawn(serve_files(
        files_listener,
        served
            .iter()
            .map(|n| (n.clone(), repo::stand_in(n)))
            .collect(),
        stop_files.clone(),
    ));
    show::info(&format!(
        "file server: {files_base}/ serving {} generated stand-in files:",
        served.len()
    ));
    for name in &served {
        show::info(&format!("  {files_base}/{name}"));
    }
    show::info("note: the artifact URLs in examples/ point to the internet; the demo's copy of");
    show::info(
        "      the repository points them at this local server (nothing comes from the internet)",
    );

    let outcome = with_files(dir, &manifests, &pve_url, &fingerprint, token_secret).await;
    stop_files.cancel();
    let _ = files_task.await;
    outcome
}

async fn with_files(
    dir: &Path,
    manifests: &BTreeMap<String, String>,
    pve_url: &str,
    fingerprint: &str,
    token_secret: &str,
) -> anyhow::Result<bool> {
    // 2. The git repository and agent.toml.
    show::step(
        2,
        STEPS,
        "make a git repository from examples/ and write agent.toml",
    );
    let repo_dir = dir.join("repo");
    std::fs::create_dir(&repo_dir).with_context(|| format!("creating {}", repo_dir.display()))?;
    let commit = repo::create(&repo_dir, manifests).await?;
    show::info(&format!(
        "{}: {} files, commit {} on branch main",
        repo_dir.display(),
        manifests.len(),
        show::short(&commit)
    ));
    write_secret(&dir.join("pve-token-secret"), token_secret)?;
    let webhook_secret = secret();
    write_secret(&dir.join("webhook-secret"), &webhook_secret)?;
    let config_text = agent_toml(dir, &repo_dir, pve_url, fingerprint);
    let config_path = dir.join("agent.toml");
    std::fs::write(&config_path, &config_text)
        .with_context(|| format!("writing {}", config_path.display()))?;
    show::info(&format!(
        "{} (the secrets are in the files it names; they are never shown):",
        config_path.display()
    ));
    for line in config_text.lines() {
        show::info(&format!("  {line}"));
    }
    let config = AgentConfig::load(&config_path)?;
    let ctx = context(&config)?;

    // 3. The plan of the first pass.
    show::step(
        3,
        STEPS,
        "the plan: what the agent's first pass will do (`proxops plan` shows the same)",
    );
    let files = read_manifest_files(&repo_dir)
        .with_context(|| format!("reading {}", repo_dir.display()))?;
    let planned = plan_only(&ctx, &files, config.cluster.as_deref()).await?;
    let first_total = planned.plan.actions().count();
    output::print_plan(&planned);

    // 4. The agent.
    let shutdown = CancellationToken::new();
    let (reload_tx, reload_rx) = mpsc::channel(1);
    let agent = tokio::spawn({
        let shutdown = shutdown.clone();
        let config_path = config_path.clone();
        async move { crate::serve::run(&config_path, shutdown, reload_rx).await }
    });
    let mut demo = Demo {
        http: reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .context("building the HTTP client")?,
        listen: config.listen,
        webhook_secret,
        agent,
        store: None,
        state_dir: config.state_dir.clone(),
        ctx,
    };
    let outcome = demo
        .scenario(&files, config.cluster.as_deref(), first_total)
        .await;
    shutdown.cancel();
    let stopped = demo.agent.await;
    drop(reload_tx);
    let outcome = outcome?;
    match stopped {
        Ok(Ok(())) => Ok(outcome),
        Ok(Err(error)) => Err(anyhow::Error::new(error).context("the agent")),
        Err(join) => Err(anyhow::anyhow!("the agent task failed: {join}")),
    }
}

/// The running demo: the agent and how to reach it.
struct Demo {
    http: reqwest::Client,
    /// The configured address until the agent has bound one (port 0: any free port).
    listen: SocketAddr,
    webhook_secret: String,
    agent: JoinHandle<Result<(), AgentError>>,
    store: Option<Store>,
    state_dir: PathBuf,
    ctx: Context,
}

impl Demo {
    async fn scenario(
        &mut self,
        files: &BTreeMap<String, String>,
        cluster: Option<&str>,
        first_total: usize,
    ) -> anyhow::Result<bool> {
        self.wait_until_listening().await?;
        show::step(
            4,
            STEPS,
            &format!(
                "run the agent (status API and webhooks on http://{}); its first pass, as it records it",
                self.listen
            ),
        );
        let (first, _) = self.follow(None, first_total).await?;
        show::pass_record(&first);
        let mut success = first.outcome.is_some_and(|o| o.is_applied());

        // 5. Out-of-band changes.
        show::step(
            5,
            STEPS,
            "change PVE behind the agent's back, through PVE's API (as someone at the console would)",
        );
        let pve = self.ctx.pve.clone();
        delete_iso(&pve).await?;
        let vm_changed = change_vm(&pve).await?;
        show::info("the plan now (what the next pass will find):");
        let drift = plan_only(&self.ctx, files, cluster).await?;
        let drift_total = drift.plan.actions().count();
        output::print_plan(&drift);

        // 6. A webhook delivery triggers the next pass.
        show::step(
            6,
            STEPS,
            "nudge the agent with a signed webhook (as a forge does on push); it finds the drift and corrects it",
        );
        let code = self.deliver_webhook().await?;
        show::info(&format!(
            "POST http://{}/hooks/github (X-GitHub-Event: push, X-Hub-Signature-256 signed with the webhook secret) -> {code}",
            self.listen
        ));
        show::info(
            "(no new commit: the pass compares PVE with the same revision and corrects what differs)",
        );
        let (second, actions) = self.follow(Some(first.id), drift_total).await?;
        show::pass_record(&second);
        show::corrections(&actions);
        success &= second.outcome.is_some_and(|o| o.is_applied()) && !actions.is_empty();
        success &= check_iso(&pve).await;
        if vm_changed {
            success &= check_vm(&pve).await;
        }

        // 7. The records, from the agent's status API.
        show::step(
            7,
            STEPS,
            "the records, as the agent's status API answers them (GET /api/v1/revisions, /api/v1/status)",
        );
        let passes: Vec<PassJson> = self.get("/api/v1/revisions").await?;
        let status: StatusJson = self.get("/api/v1/status").await?;
        show::records(&passes, &status);
        Ok(success)
    }

    /// Waits until the agent listens (it opens its store before) and answers `/healthz`: the
    /// config says port 0, and the agent writes the address it bound to `state_dir/http.addr`.
    async fn wait_until_listening(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let file = http_addr_path(&self.state_dir);
        loop {
            if self.agent.is_finished() {
                bail!("the agent stopped before it was listening");
            }
            if let Ok(text) = std::fs::read_to_string(&file)
                && let Ok(listen) = text.trim().parse()
            {
                self.listen = listen;
                let url = format!("http://{listen}/healthz");
                if let Ok(response) = self.http.get(url).send().await
                    && response.status().is_success()
                {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the agent did not start listening (its address is written to {})",
                    file.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Follows the first pass recorded after `after` until it finishes, printing its actions'
    /// progress as the store records it; returns the pass and its actions.
    async fn follow(
        &mut self,
        after: Option<PassId>,
        total: usize,
    ) -> anyhow::Result<(PassSummary, Vec<ActionRecord>)> {
        let deadline = Instant::now() + PASS_TIMEOUT;
        let mut progress = show::Progress::new(total);
        loop {
            if self.agent.is_finished() {
                bail!("the agent stopped unexpectedly");
            }
            if self.store.is_none() {
                self.store = Store::open_read_only(&database_path(&self.state_dir)).ok();
            }
            if let Some(store) = &self.store {
                let pass = store
                    .recent_passes(Some("*"), 10)?
                    .into_iter()
                    .filter(|p| after.is_none_or(|a| p.id > a))
                    .min_by_key(|p| p.id);
                if let Some(pass) = pass {
                    let actions = store.actions_of(pass.id)?;
                    progress.update(&actions);
                    if pass.ended_at.is_some() {
                        return Ok((pass, actions));
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the agent's pass did not finish within {} s",
                    PASS_TIMEOUT.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A GitHub push delivery for `main`, signed with the agent's webhook secret.
    async fn deliver_webhook(&self) -> anyhow::Result<String> {
        let body = r#"{"ref":"refs/heads/main","after":"0000000000000000000000000000000000000000","commits":[]}"#;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(self.webhook_secret.as_bytes())
            .context("the webhook key")?;
        mac.update(body.as_bytes());
        let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        let response = self
            .http
            .post(format!("http://{}/hooks/github", self.listen))
            .header("content-type", "application/json")
            .header("X-GitHub-Event", "push")
            .header("X-Hub-Signature-256", signature)
            .body(body)
            .send()
            .await
            .context("delivering the webhook")?;
        let status = response.status();
        if !status.is_success() {
            bail!("the agent refused the webhook: {status}");
        }
        let text = response.text().await.unwrap_or_default();
        Ok(format!("{} {}", status.as_u16(), text.trim()))
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.http
            .get(format!("http://{}{path}", self.listen))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("GET {path} from the agent"))?
            .json()
            .await
            .with_context(|| format!("reading {path} from the agent"))
    }
}

/// Deletes the ISO from one node's storage and waits for PVE's task.
async fn delete_iso(pve: &PveClient) -> anyhow::Result<()> {
    let answer = pve
        .execute(&request::storage_volume_delete(
            ISO_NODE,
            ISO_STORAGE,
            ISO_VOLID,
            None,
        ))
        .await
        .context("deleting the ISO through PVE's API")?;
    let upid_text = answer.as_str().unwrap_or_default().to_owned();
    show::info(&format!(
        "DELETE /nodes/{ISO_NODE}/storage/{ISO_STORAGE}/content/{ISO_VOLID}"
    ));
    if let Ok(upid) = upid_text.parse::<Upid>() {
        let wait = WaitOptions {
            poll_interval: Duration::from_millis(100),
            max_poll_interval: Duration::from_millis(500),
            timeout: Duration::from_secs(30),
        };
        let status = wait_for_task(pve, &upid, &wait, &CancellationToken::new())
            .await
            .context("waiting for PVE to delete the ISO")?;
        show::info(&format!(
            "  -> task {upid_text}: {}",
            status.exitstatus.as_deref().unwrap_or("OK")
        ));
    }
    show::info(&format!("  {ISO_VOLID} is gone from {ISO_NODE}"));
    Ok(())
}

/// Changes the VM's memory when the VM exists (this build manages guests); `Ok(false)` when
/// it does not.
async fn change_vm(pve: &PveClient) -> anyhow::Result<bool> {
    let Ok(config) = pve
        .execute(&request::qemu_config(VM_NODE, VM_VMID, false))
        .await
    else {
        show::info(&format!(
            "(no VM {VM_VMID} on {VM_NODE}: this build does not create guests, so no VM is changed)"
        ));
        return Ok(false);
    };
    let before = text_of(&config["memory"]);
    let update = ConfigUpdate {
        set: Params::new().set("memory", VM_MEMORY_CHANGED),
        ..ConfigUpdate::default()
    };
    pve.execute(&request::qemu_config_put(VM_NODE, VM_VMID, &update))
        .await
        .context("changing the VM's memory through PVE's API")?;
    show::info(&format!(
        "PUT /nodes/{VM_NODE}/qemu/{VM_VMID}/config memory={VM_MEMORY_CHANGED}  ({VM_NAME} declares 2GiB; it had memory {before})"
    ));
    Ok(true)
}

/// Whether the ISO is back, printed.
async fn check_iso(pve: &PveClient) -> bool {
    let listing = pve.storage_content(ISO_NODE, ISO_STORAGE, None).await;
    let found = listing
        .ok()
        .and_then(|items| items.into_iter().find(|i| i.volid == ISO_VOLID));
    match found {
        Some(item) => {
            show::info(&format!(
                "corrected: {ISO_VOLID} is on {ISO_NODE} again ({} bytes, downloaded again from the file server)",
                item.size.unwrap_or(0)
            ));
            true
        }
        None => {
            show::info(&format!(
                "NOT corrected: {ISO_VOLID} is still missing on {ISO_NODE}"
            ));
            false
        }
    }
}

/// Whether the VM's memory is back, printed.
async fn check_vm(pve: &PveClient) -> bool {
    let memory = pve
        .execute(&request::qemu_config(VM_NODE, VM_VMID, false))
        .await
        .map(|c| text_of(&c["memory"]))
        .unwrap_or_default();
    let restored = memory == VM_MEMORY_DECLARED;
    if restored {
        show::info(&format!(
            "corrected: {VM_NAME} (vmid {VM_VMID}) has memory {memory} again"
        ));
    } else {
        show::info(&format!(
            "NOT corrected: {VM_NAME} (vmid {VM_VMID}) has memory {memory}"
        ));
    }
    restored
}

/// A config value as text (PVE answers numbers or strings).
fn text_of(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

/// The reconcile context the agent builds from the same config (see `agent::build`).
/// What a pass would do now, as `proxops plan` shows it: the pipeline in report mode.
async fn plan_only(
    ctx: &Context,
    files: &BTreeMap<String, String>,
    cluster: Option<&str>,
) -> anyhow::Result<Pass> {
    let no_progress: crate::execute::Progress = Arc::new(|_| {});
    reconcile::reconcile_once(
        ctx,
        files,
        cluster,
        Mode::Report,
        &PlanOptions::default(),
        &mut NoHooks,
        &no_progress,
        &CancellationToken::new(),
    )
    .await
    .map_err(output::reconcile_error)
}

fn context(config: &AgentConfig) -> anyhow::Result<Context> {
    let pve = PveClient::new(config.pve.client_config())
        .with_context(|| format!("setting up the PVE client for {}", config.pve.url))?;
    Ok(Context::from_config(pve, config.node.clone(), config))
}

/// The agent's configuration: every node, the demo repository over `file://`, a poll so rare
/// that only webhooks trigger passes after the first, secrets in files, the status API on any
/// free port (the agent says which in `state_dir/http.addr`), and a `[scope]` that lets the
/// artifacts come from the demo's file server (loopback, plain http, stand-ins without
/// checksums).
fn agent_toml(dir: &Path, repo: &Path, pve_url: &str, fingerprint: &str) -> String {
    let quoted = |s: &str| toml::Value::String(s.to_owned()).to_string();
    let source = format!("file://{}", repo.display());
    let state = dir.join("state");
    format!(
        "node = \"*\"\n\
         cluster = \"homelab\"\n\
         state_dir = {state}\n\
         \n\
         [source]\n\
         url = {source}\n\
         branch = \"main\"\n\
         poll = \"1h\"\n\
         \n\
         [webhook]\n\
         secret_file = \"webhook-secret\"\n\
         \n\
         [http]\n\
         listen = \"127.0.0.1:0\"\n\
         \n\
         [pve]\n\
         url = {pve_url}\n\
         token_id = \"root@pam!proxops\"\n\
         token_secret_file = \"pve-token-secret\"\n\
         fingerprint = \"{fingerprint}\"\n\
         \n\
         [policy]\n\
         task_timeout = \"60s\"\n\
         \n\
         [scope]\n\
         artifact_hosts = [\"127.0.0.1\"]\n\
         allow_http_without_checksum = true\n",
        state = quoted(&state.display().to_string()),
        source = quoted(&source),
        pve_url = quoted(pve_url),
    )
}

/// Writes a secret file readable only by this user.
fn write_secret(path: &Path, secret: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    writeln!(file, "{secret}").with_context(|| format!("writing {}", path.display()))
}

/// Serves `files` by name at `/<name>` until `stop` fires.
async fn serve_files(
    listener: tokio::net::TcpListener,
    files: BTreeMap<String, Vec<u8>>,
    stop: CancellationToken,
) {
    let files = Arc::new(files);
    let app = axum::Router::new().route(
        "/{name}",
        axum::routing::get(
            move |axum::extract::Path(name): axum::extract::Path<String>| {
                let files = files.clone();
                async move {
                    files
                        .get(&name)
                        .cloned()
                        .ok_or(axum::http::StatusCode::NOT_FOUND)
                }
            },
        ),
    );
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
    {
        tracing::error!(%error, "the demo's file server stopped");
    }
}
