//! `proxops freeze` / `proxops unfreeze`: hold every write of the agent, or let writes go
//! again. The freeze is written straight into the agent's state database (the SQLite file in
//! `state_dir`, found through `--config`): SQLite's locking makes that safe beside the
//! running agent, which reads the freeze before every write of every pass. No socket yet:
//! the agent has no control channel, and a row in the database it already reads needs none
//! (approvals will add `control.sock`). While frozen, passes still observe, report and
//! record drift; only writes are held.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use proxops_store::{Freeze, Store};

use crate::agent::database_path;
use crate::cli::Exit;
use crate::cli::pass::DEFAULT_CONFIG;
use crate::config::AgentConfig;
use crate::output;
use crate::timefmt::rfc3339;

/// Arguments of `proxops freeze`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent configuration (for its state directory).
    #[arg(long, short = 'c', default_value = DEFAULT_CONFIG, env = "PROXOPS_CONFIG")]
    pub config: PathBuf,
    /// How long the freeze lasts (e.g. `4h`, `30m`, `2d`); without it, until `proxops unfreeze`.
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_for)]
    pub for_: Option<Duration>,
    /// Why, for the other operators (shown by `proxops status`, the UI and the API).
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// Arguments of `proxops unfreeze`.
#[derive(Debug, clap::Args)]
pub struct UnfreezeArgs {
    /// The agent configuration (for its state directory).
    #[arg(long, short = 'c', default_value = DEFAULT_CONFIG, env = "PROXOPS_CONFIG")]
    pub config: PathBuf,
}

fn parse_for(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|e| format!("`{text}`: {e}; write e.g. 4h, 30m or 2d"))?;
    if duration.is_zero() {
        return Err("must be longer than 0; to lift a freeze, run proxops unfreeze".to_owned());
    }
    Ok(duration)
}

fn open_store(config: &std::path::Path) -> anyhow::Result<Store> {
    let config = AgentConfig::load(config)?;
    let db = database_path(&config.state_dir);
    Store::open(&db).with_context(|| {
        format!(
            "opening the agent's state database {} (run as the agent's user, e.g. with sudo)",
            db.display()
        )
    })
}

/// The Unix user running the command: the name of the process's uid in `/etc/passwd` (or
/// `uid N`), with the sudo caller when run through sudo.
fn who() -> String {
    use std::os::unix::fs::MetadataExt as _;
    let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    let name = uid.and_then(|uid| {
        let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
        passwd.lines().find_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let id: u32 = fields.nth(1)?.parse().ok()?;
            (id == uid).then(|| name.to_owned())
        })
    });
    let name = match (name, uid) {
        (Some(name), _) => name,
        (None, Some(uid)) => format!("uid {uid}"),
        (None, None) => "unknown user".to_owned(),
    };
    match std::env::var("SUDO_USER") {
        Ok(caller) if !caller.is_empty() && caller != name => format!("{caller} (as {name})"),
        _ => name,
    }
}

/// Records the freeze.
pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let mut store = open_store(&args.config)?;
    let now = SystemTime::now();
    let freeze = Freeze {
        until: args.for_.map(|d| now + d),
        reason: args.reason.clone(),
        who: who(),
        since: now,
    };
    store.set_freeze(&freeze)?;
    let until = freeze
        .until
        .map_or_else(|| "proxops unfreeze".to_owned(), rfc3339);
    output::print_line(&format!(
        "frozen until {until}: the agent holds every write (drift is still reported)"
    ));
    Ok(Exit::Success)
}

/// Removes the freeze.
pub fn unfreeze(args: &UnfreezeArgs) -> anyhow::Result<Exit> {
    let mut store = open_store(&args.config)?;
    output::print_line(&match store.clear_freeze()? {
        Some(old) => format!(
            "unfrozen (frozen by {} since {}); the agent's next pass may write",
            old.who,
            rfc3339(old.since)
        ),
        None => "not frozen; nothing to do".to_owned(),
    });
    Ok(Exit::Success)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freeze_duration_parses_and_zero_or_nonsense_says_what_to_write() {
        assert_eq!(parse_for("4h"), Ok(Duration::from_secs(4 * 3600)));
        assert!(parse_for("0s").unwrap_err().contains("proxops unfreeze"));
        assert!(parse_for("soon").unwrap_err().contains("write e.g. 4h"));
    }
}
