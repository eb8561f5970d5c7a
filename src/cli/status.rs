//! `proxops status`: the last applied and last attempted revision of this node. Asks the
//! running agent (`GET /api/v1/status` on its loopback listener) and, when none answers,
//! reads the state database read-only, so it never writes under the agent's feet. An agent
//! whose `[http] listen` has port 0 is found at the address it wrote to `state_dir/http.addr`.
//! With `[http] token_file` set the request carries that token (`Authorization: Bearer`); an
//! agent listening on every address (`0.0.0.0`, `::`) is asked on loopback, a host its
//! `[http] allowed_hosts` admits by default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use proxops_store::{Store, StoreError};
use serde::de::DeserializeOwned;

use crate::agent::{database_path, http_addr_path, node_label};
use crate::cli::Exit;
use crate::cli::pass::DEFAULT_CONFIG;
use crate::config::AgentConfig;
use crate::http::{StatusJson, status_offline};
use crate::output;

/// Arguments of `proxops status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent configuration (for its listen address and state directory).
    #[arg(long, short = 'c', default_value = DEFAULT_CONFIG, env = "PROXOPS_CONFIG")]
    pub config: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Every node of the cluster instead: the status files under `[pmxcfs] dir`, read
    /// directly, with PVE's `/cluster/status` when PVE answers.
    #[arg(long)]
    pub cluster: bool,
}

/// Prints the status.
pub async fn run(args: &Args) -> anyhow::Result<Exit> {
    if args.cluster {
        return cluster(args).await;
    }
    // Read from the database (no agent answers), writes are judged with this config's
    // `[[policy.window]]`, as the agent would, and held for a node the last pass found in
    // PVE's HA maintenance (its open `ha-maintenance` findings).
    let windows = AgentConfig::load(&args.config)
        .map(|c| c.policy.windows)
        .unwrap_or_default();
    let status: StatusJson = ask_agent_or_store(&args.config, "/api/v1/status", |s, node| {
        status_offline(s, node, &windows)
    })
    .await?;
    if args.json {
        output::print_json(&status)?;
    } else {
        output::print_status(&status);
    }
    Ok(Exit::Success)
}

/// `--cluster`: the view from the files (no agent needed) and PVE's member list. Exits
/// non-zero without `[pmxcfs]`.
async fn cluster(args: &Args) -> anyhow::Result<Exit> {
    let config = AgentConfig::load(&args.config)?;
    let Some(pmxcfs) = &config.pmxcfs else {
        anyhow::bail!(
            "{}: no [pmxcfs] table: cluster mode is off, so no node publishes a status file \
             (add `[pmxcfs]` to agent.toml on every node)",
            args.config.display()
        );
    };
    let pve = proxops_pve::PveClient::new(config.pve.client_config());
    if let Err(error) = &pve {
        tracing::info!(%error, "no PVE client; the view lists the status files only");
    }
    let view = crate::cluster::view::gather(pmxcfs, pve.as_ref().ok(), None).await;
    if args.json {
        output::print_json(&view)?;
    } else {
        output::print_line(view.table().trim_end());
    }
    Ok(Exit::Success)
}

/// Reads `path` from the running agent, or computes the same answer from the database.
pub(crate) async fn ask_agent_or_store<T: DeserializeOwned>(
    config_path: &std::path::Path,
    path: &str,
    from_store: impl FnOnce(&Store, &str) -> Result<T, StoreError>,
) -> anyhow::Result<T> {
    let config = AgentConfig::load(config_path)?;
    let address = agent_address(config.listen, &config.state_dir);
    match &address {
        Ok(listen) => {
            let url = format!("http://{}{path}", loopback_if_unspecified(*listen));
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .context("building the HTTP client")?;
            let mut request = client.get(&url);
            if let Some(token) = &config.http.token {
                request = request.bearer_auth(secrecy::ExposeSecret::expose_secret(token));
            }
            match request.send().await {
                Ok(response) if response.status().is_success() => {
                    return response
                        .json()
                        .await
                        .with_context(|| format!("reading {url}"));
                }
                Ok(response) => {
                    tracing::info!(status = %response.status(), "agent answered with an error; reading the database")
                }
                Err(error) => tracing::info!(%error, "no agent answers; reading the database"),
            }
        }
        Err(error) => {
            tracing::info!(error = %format!("{error:#}"), "no agent address; reading the database")
        }
    }
    let db = database_path(&config.state_dir);
    let store = Store::open_read_only(&db).with_context(|| match &address {
        Ok(listen) => format!("no agent answers on {listen}"),
        Err(error) => format!("no agent to ask ({error:#})"),
    })?;
    Ok(from_store(&store, &node_label(&config.node))?)
}

/// `0.0.0.0:P` → `127.0.0.1:P`, `[::]:P` → `[::1]:P`; any other address as it is.
fn loopback_if_unspecified(address: SocketAddr) -> SocketAddr {
    match address.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), address.port())
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), address.port())
        }
        _ => address,
    }
}

/// Where the agent's status API answers: `listen` itself, or, when its port is 0 (any free
/// port), the address the agent bound and wrote to `state_dir/http.addr`.
fn agent_address(listen: SocketAddr, state_dir: &Path) -> anyhow::Result<SocketAddr> {
    if listen.port() != 0 {
        return Ok(listen);
    }
    let file = http_addr_path(state_dir);
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "[http] listen has port 0 and {} cannot be read (the agent writes the address it \
             bound there when it starts)",
            file.display()
        )
    })?;
    text.trim()
        .parse()
        .with_context(|| format!("{}: `{}` is not an address", file.display(), text.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_address_is_the_configured_one_when_its_port_is_not_0() {
        let dir = tempfile::tempdir().unwrap();
        let listen: SocketAddr = "127.0.0.1:9494".parse().unwrap();
        assert_eq!(agent_address(listen, dir.path()).unwrap(), listen);
    }

    #[test]
    fn agent_address_for_port_0_is_read_from_http_addr_in_the_state_dir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("http.addr"), "127.0.0.1:40123\n").unwrap();
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert_eq!(
            agent_address(listen, dir.path()).unwrap(),
            "127.0.0.1:40123".parse::<SocketAddr>().unwrap()
        );
    }

    #[test]
    fn agent_address_for_port_0_without_http_addr_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let error = format!("{:#}", agent_address(listen, dir.path()).unwrap_err());
        let file = dir.path().join("http.addr");
        assert!(
            error.starts_with(&format!(
                "[http] listen has port 0 and {} cannot be read",
                file.display()
            )),
            "{error}"
        );
    }
}
