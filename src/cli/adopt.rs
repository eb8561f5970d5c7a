//! `proxops adopt --config FILE [--cluster C] [--out DIR] [--node N|*] [--json]`: read the
//! live cluster (GET only) and write manifests for what is on it, in the composition layout
//! under `--out` (default: the current directory, the repository root). Logic in
//! [`crate::adopt`]. `resources.yaml` is never edited: the lines to add are printed.
//!
//! Exit codes: 0 when the manifests were written, 1 on any error (including a write request
//! counted by the PVE client, which makes adopt fail).

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use proxops_pve::PveClient;

use crate::adopt::{self, Existing, SshKeyRefs};
use crate::cli::Exit;
use crate::cli::pass::DEFAULT_CONFIG;
use crate::config::{AgentConfig, NodeScope};
use crate::output;
use crate::secrets::resolve::{cluster_document_path, open_cluster_document};

/// Arguments of `proxops adopt`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent configuration (PVE URL, token, trust, node, cluster).
    #[arg(long, short = 'c', default_value = DEFAULT_CONFIG, env = "PROXOPS_CONFIG")]
    config: PathBuf,
    /// The cluster whose folders the manifests go in (default: the config's `cluster`).
    #[arg(long)]
    cluster: Option<String>,
    /// The repository root to write into.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Adopt this node instead of the config's `node` (`*` = every node).
    #[arg(long)]
    node: Option<String>,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Reads the cluster, writes the manifests, prints the report.
pub async fn run(args: &Args) -> anyhow::Result<Exit> {
    let config = AgentConfig::load(&args.config)
        .with_context(|| format!("loading {}", args.config.display()))?;
    let Some(cluster) = args.cluster.clone().or(config.cluster.clone()) else {
        anyhow::bail!(
            "adopt needs a cluster name for the composition folders: give --cluster, or set `cluster` in {}",
            args.config.display()
        );
    };
    let scope = match args.node.as_deref() {
        Some("*") => NodeScope::All,
        Some(node) => NodeScope::Node(node.to_owned()),
        None => config.node.clone(),
    };
    let pve = PveClient::new(config.pve.client_config())
        .with_context(|| format!("connecting to PVE at {}", config.pve.url))?;
    adopt::check_cluster(&cluster)?;
    let (existing, existing_note) = Existing::read(&args.out, &cluster);
    let (ssh_keys, ssh_note) = ssh_key_refs(args, &cluster, &config);
    let mut adoption = adopt::adopt(&pve, &scope, &cluster, &ssh_keys, &existing)
        .await
        .with_context(|| format!("adopting from PVE at {}", config.pve.url))?;
    adoption.report.notes.extend(existing_note);
    adoption.report.notes.extend(ssh_note);
    adopt::write(&args.out, &adoption)?;
    if args.json {
        output::print_json(&adoption.report)?;
    } else {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(adoption.report.render().as_bytes())?;
    }
    Ok(Exit::Success)
}

/// The SSH key entries of the cluster's SOPS document under `--out`, when it has one, and a
/// note saying how keys were matched. A document that cannot be opened (no identity, wrong
/// key) is not an error: keys are then adopted as `["*"]`, which is always safe.
fn ssh_key_refs(args: &Args, cluster: &str, config: &AgentConfig) -> (SshKeyRefs, Option<String>) {
    let path = cluster_document_path(&args.out, cluster, &config.secrets);
    if !path.is_file() {
        return (SshKeyRefs::default(), None);
    }
    match open_cluster_document(&args.out, cluster, &config.secrets) {
        Ok(document) => (
            SshKeyRefs::from_document(&document),
            Some(format!(
                "SSH keys matched against {}: a guest whose keys are all there gets ssh-key-refs",
                path.display()
            )),
        ),
        Err(error) => (
            SshKeyRefs::default(),
            Some(format!(
                "{} could not be opened ({error}); SSH keys are adopted as [\"*\"]",
                path.display()
            )),
        ),
    }
}
