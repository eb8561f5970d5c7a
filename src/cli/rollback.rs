//! `proxops rollback <kind>/<name> [--snapshot NAME] [--yes]`: roll a guest back to a
//! snapshot ProxOps took before a risky update (issue 19, item 2), on the operator's command.
//!
//! - Which snapshot: `--snapshot NAME`, or the newest one the agent's state database recorded
//!   for the guest (found through `--config`, like `proxops freeze`).
//! - A name the database does not know (someone else's snapshot, or one ProxOps lost track
//!   of) is refused unless `--yes` is given too: it is not one ProxOps knows the content of.
//! - Rolling back discards everything written to the guest's disks and config since the
//!   snapshot, so on a terminal it asks first; without a terminal it needs `--yes`.
//! - PVE stops a running guest to roll it back (qemu-server @ e6352be6
//!   `QemuConfig::__snapshot_rollback_vm_stop`; pve-container @ 94f5585
//!   `LXC::Config::__snapshot_rollback_vm_stop`) and does not start it again, as ProxOps's
//!   snapshots hold no RAM state: the agent's next pass starts it if its manifest says
//!   `running`, and reports the drift between the rolled-back config and the revision (the
//!   agent corrects it unless the manifest is reverted too or the guest is in `report` drift
//!   mode; say so to whoever rolls back).
//!
//! The command sends `POST .../snapshot/{snapname}/rollback` and waits for the
//! `qmrollback`/`vzrollback` task.

use std::io::IsTerminal as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use proxops_core::resource::{Kind, ResourceId};
use proxops_pve::request::{self, SnapshotEntry, SnapshotGuest};
use proxops_pve::{PveClient, Upid, WaitOptions, wait_for_task};
use proxops_store::Store;
use tokio_util::sync::CancellationToken;

use crate::agent::database_path;
use crate::cli::Exit;
use crate::cli::pass::DEFAULT_CONFIG;
use crate::config::AgentConfig;
use crate::output;

/// Arguments of `proxops rollback`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The guest, as `<kind>/<name>` (e.g. `VM/web`, `LXC/db`).
    pub target: String,
    /// The snapshot to roll back to (default: the newest one ProxOps took of the guest).
    #[arg(long)]
    pub snapshot: Option<String>,
    /// Do not ask; also allows a snapshot the state database has no record of.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// The agent configuration (state directory and PVE credentials).
    #[arg(long, short = 'c', default_value = DEFAULT_CONFIG, env = "PROXOPS_CONFIG")]
    pub config: PathBuf,
}

/// Where the snapshot is: the guest and its name.
struct Target {
    node: String,
    vmid: u32,
    guest: SnapshotGuest,
    snapshot: String,
    recorded: bool,
}

fn parse_target(text: &str) -> anyhow::Result<ResourceId> {
    let Some((kind, name)) = text.split_once('/') else {
        bail!("`{text}` is not `<kind>/<name>`; write e.g. `VM/web` or `LXC/db`");
    };
    let kind: Kind = kind
        .parse()
        .map_err(|_| anyhow::anyhow!("`{kind}` in `{text}` is not a kind; write VM or LXC"))?;
    if !matches!(kind, Kind::Vm | Kind::Lxc) {
        bail!("`{text}`: only VMs and LXC containers have snapshots ProxOps takes");
    }
    Ok(ResourceId::new(kind, name))
}

fn guest_of(kind: Kind) -> SnapshotGuest {
    if kind == Kind::Lxc {
        SnapshotGuest::Lxc
    } else {
        SnapshotGuest::Qemu
    }
}

/// The snapshot to roll back to, from the state database.
fn find(store: &Store, resource: &ResourceId, args: &Args) -> anyhow::Result<Target> {
    let recorded = store.snapshots_of(resource)?;
    let guest = guest_of(resource.kind);
    match &args.snapshot {
        None => {
            let newest = recorded.first().with_context(|| {
                format!(
                    "the state database records no snapshot ProxOps took of {resource}; name one with --snapshot"
                )
            })?;
            Ok(Target {
                node: newest.node.clone(),
                vmid: newest.vmid,
                guest,
                snapshot: newest.name.clone(),
                recorded: true,
            })
        }
        Some(name) => {
            if let Some(record) = recorded.iter().find(|r| &r.name == name) {
                return Ok(Target {
                    node: record.node.clone(),
                    vmid: record.vmid,
                    guest,
                    snapshot: name.clone(),
                    recorded: true,
                });
            }
            if !args.yes {
                bail!(
                    "snapshot {name} of {resource} is not one ProxOps took (the state database has \
                     no record of it); check it with `qm listsnapshot` / `pct listsnapshot`, then \
                     pass --yes to roll back to it anyway"
                );
            }
            let (node, vmid) = match recorded.first() {
                Some(r) => (r.node.clone(), r.vmid),
                None => {
                    let owned = store.owned(None)?;
                    let guest = owned.iter().find(|g| &g.resource == resource).with_context(|| {
                        format!("the state database knows no guest for {resource}, so its node and vmid are unknown")
                    })?;
                    (guest.node.clone(), guest.vmid)
                }
            };
            Ok(Target {
                node,
                vmid,
                guest,
                snapshot: name.clone(),
                recorded: false,
            })
        }
    }
}

/// Rolls the guest back.
pub async fn run(args: &Args) -> anyhow::Result<Exit> {
    let resource = parse_target(&args.target)?;
    let config = AgentConfig::load(&args.config)?;
    let db = database_path(&config.state_dir);
    let store = Store::open(&db).with_context(|| {
        format!(
            "opening the agent's state database {} (run as the agent's user, e.g. with sudo)",
            db.display()
        )
    })?;
    let target = find(&store, &resource, args)?;
    drop(store);
    let pve = PveClient::new(config.pve.client_config())
        .with_context(|| format!("connecting to PVE at {}", config.pve.url))?;
    let where_ = format!("{} {} on {}", resource, target.vmid, target.node);
    let listed: Vec<SnapshotEntry> = pve
        .execute_as(&request::snapshot_list(
            target.guest,
            &target.node,
            target.vmid,
        ))
        .await
        .with_context(|| format!("listing the snapshots of {where_}"))?;
    if !listed.iter().any(|s| s.name == target.snapshot) {
        bail!(
            "PVE lists no snapshot {} of {where_} (it lists: {})",
            target.snapshot,
            names(&listed)
        );
    }
    if !args.yes {
        let question = format!(
            "roll {where_} back to snapshot {}? Everything written to it since is lost, and a running guest is stopped",
            target.snapshot
        );
        let confirmed = if std::io::stdin().is_terminal() {
            output::confirm(&question)?
        } else {
            bail!("refusing to roll back without --yes: stdin is not a terminal to confirm on");
        };
        if !confirmed {
            output::print_line("not rolled back");
            return Ok(Exit::Failure);
        }
    }
    let answer = pve
        .execute(&request::snapshot_rollback(
            target.guest,
            &target.node,
            target.vmid,
            &target.snapshot,
        ))
        .await
        .with_context(|| format!("rolling {where_} back to {}", target.snapshot))?;
    if let Some(text) = answer.as_str() {
        let upid: Upid = text
            .parse()
            .map_err(|_| anyhow::anyhow!("PVE answered `{text}`, which is not a task id"))?;
        let wait = WaitOptions {
            timeout: config.policy.task_timeout,
            ..WaitOptions::default()
        };
        wait_for_task(&pve, &upid, &wait, &CancellationToken::new())
            .await
            .with_context(|| {
                format!("rolling {where_} back to {} (task {upid})", target.snapshot)
            })?;
    }
    let whose = if target.recorded {
        "taken by ProxOps"
    } else {
        "not recorded by ProxOps"
    };
    output::print_line(&format!(
        "rolled {where_} back to snapshot {} ({whose}); it is stopped. The agent's next pass \
         starts it if its manifest says running, and corrects drift from the revision unless \
         the manifest is changed too",
        target.snapshot
    ));
    Ok(Exit::Success)
}

fn names(listed: &[SnapshotEntry]) -> String {
    let names: Vec<&str> = listed
        .iter()
        .map(|s| s.name.as_str())
        .filter(|n| *n != "current")
        .collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_kind_slash_name_and_only_guests() {
        assert_eq!(
            parse_target("VM/web").unwrap(),
            ResourceId::new(Kind::Vm, "web")
        );
        assert_eq!(
            parse_target("lxc/db").unwrap(),
            ResourceId::new(Kind::Lxc, "db")
        );
        assert!(
            parse_target("web")
                .unwrap_err()
                .to_string()
                .contains("<kind>/<name>")
        );
        assert!(
            parse_target("ISO/x")
                .unwrap_err()
                .to_string()
                .contains("only VMs")
        );
    }
}
