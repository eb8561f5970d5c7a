//! Arguments and set-up shared by `plan` and `apply`: which repository, which config, which
//! node and cluster; turned into the files of the revision and a reconcile `Context`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use proxops_pve::PveClient;

use crate::config::{AgentConfig, NodeScope};
use crate::reconcile::{Context, PlanOptions};
use crate::source::directory::read_manifest_files;

/// Default config path, as packaged.
pub const DEFAULT_CONFIG: &str = "/etc/proxops/agent.toml";

/// Arguments of a pass run from the command line.
#[derive(Debug, clap::Args)]
pub struct PassArgs {
    /// Root of the manifest repository.
    #[arg(default_value = ".")]
    pub path: PathBuf,
    /// The agent configuration (PVE URL, token, trust, node, policy).
    #[arg(long, short = 'c', default_value = DEFAULT_CONFIG, env = "PROXOPS_CONFIG")]
    pub config: PathBuf,
    /// Plan for this node instead of the config's `node` (`*` = every node).
    #[arg(long)]
    pub node: Option<String>,
    /// The cluster to reconcile in composition mode (default: the config's `cluster`, or the
    /// only one).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Everything a CLI pass needs.
pub struct Prepared {
    /// The manifest files of the revision.
    pub files: BTreeMap<String, String>,
    /// The cluster to reconcile, if chosen.
    pub cluster: Option<String>,
    /// The reconcile context.
    pub context: Context,
    /// Prune and restart policy from `[policy]`; the CLI has no store, so the owned guests
    /// are the observed ones with the ownership tag.
    pub plan: PlanOptions,
}

impl PassArgs {
    /// Reads the config and the repository and builds the PVE client.
    pub fn prepare(&self) -> anyhow::Result<Prepared> {
        let config = AgentConfig::load(&self.config)?;
        let files = read_manifest_files(&self.path)
            .with_context(|| format!("reading manifests from {}", self.path.display()))?;
        let scope = match self.node.as_deref() {
            Some("*") => NodeScope::All,
            Some(node) => NodeScope::Node(node.to_owned()),
            None => config.node.clone(),
        };
        let pve = PveClient::new(config.pve.client_config())
            .with_context(|| format!("connecting to PVE at {}", config.pve.url))?;
        let context = Context::from_config(pve, scope, &config);
        let plan = PlanOptions::from_config(&config);
        Ok(Prepared {
            files,
            cluster: self.cluster.clone().or(config.cluster),
            context,
            plan,
        })
    }
}
