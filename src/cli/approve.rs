//! `proxops approve <pass>` / `proxops reject <pass>`: decide on the actions a pass held
//! for approval (`[policy] approve`). The command talks to the running agent over its
//! control socket, `<state_dir>/control.sock` (`crate::control`): the agent records who
//! decided, when and on which digest, and an approval wakes a pass at once. Run it as the
//! agent's user: the socket is mode 0600 and the agent checks the caller's uid.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;

use crate::cli::Exit;
use crate::cli::pass::DEFAULT_CONFIG;
use crate::config::AgentConfig;
use crate::control::protocol::{self, MAX_LINE, Op, Request, Response};
use crate::control::socket_path;
use crate::output;

/// How long the agent has to answer.
const ANSWER_DEADLINE: Duration = Duration::from_secs(30);

/// Arguments of `proxops approve` and `proxops reject`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The pass that holds the actions (`proxops status` names it).
    pub pass: i64,
    /// Why, for the record (shown by `proxops status`, the UI and the API).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// The agent configuration (for its state directory).
    #[arg(long, short = 'c', default_value = DEFAULT_CONFIG, env = "PROXOPS_CONFIG")]
    pub config: PathBuf,
}

/// Approves (`approve`) or rejects the actions `args.pass` held.
///
/// # Errors
/// No agent running, the socket refused, or the agent refused (its message says why).
pub fn run(args: &Args, approve: bool) -> anyhow::Result<Exit> {
    let config = AgentConfig::load(&args.config)?;
    let op = if approve {
        Op::Approve {
            pass: args.pass,
            reason: args.reason.clone(),
        }
    } else {
        Op::Reject {
            pass: args.pass,
            reason: args.reason.clone(),
        }
    };
    let request = Request {
        v: protocol::VERSION,
        op,
        sudo_user: std::env::var("SUDO_USER").ok().filter(|u| !u.is_empty()),
    };
    let response = ask(&config.state_dir, &request)?;
    if response.ok {
        output::print_line(&response.message);
        Ok(Exit::Success)
    } else {
        anyhow::bail!("{}", response.message)
    }
}

/// Sends `request` to the agent of `state_dir` and reads its answer.
fn ask(state_dir: &Path, request: &Request) -> anyhow::Result<Response> {
    let path = socket_path(state_dir);
    let mut stream = UnixStream::connect(&path).map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => anyhow::anyhow!(
            "no agent is running for {} (nothing answers on {})",
            state_dir.display(),
            path.display()
        ),
        std::io::ErrorKind::PermissionDenied => anyhow::anyhow!(
            "{}: permission denied: run the command as the agent's user (e.g. sudo -u proxops \
             proxops approve …)",
            path.display()
        ),
        _ => anyhow::Error::new(error).context(format!("connecting to {}", path.display())),
    })?;
    stream.set_read_timeout(Some(ANSWER_DEADLINE))?;
    stream.set_write_timeout(Some(ANSWER_DEADLINE))?;
    let mut line = serde_json::to_string(request)?;
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .with_context(|| format!("sending the request to {}", path.display()))?;
    let mut answer = String::new();
    BufReader::new(stream.take(MAX_LINE as u64 + 1))
        .read_line(&mut answer)
        .with_context(|| format!("reading the agent's answer from {}", path.display()))?;
    serde_json::from_str(answer.trim_end()).with_context(|| {
        format!(
            "the agent's answer on {} is not one this proxops understands (is the agent another \
             version?)",
            path.display()
        )
    })
}
