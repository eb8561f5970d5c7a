//! The agent's control socket, `<state_dir>/control.sock` (issue 19, item 4): how
//! `proxops approve` / `proxops reject` reach the running agent.
//!
//! - The agent creates it at start ([`ControlSocket::bind`], called by `Agent::start`) and
//!   removes it when it stops. A socket another agent answers on refuses the start; a stale
//!   file (nobody answers) is replaced.
//! - Mode 0600, in the state directory (0700): only its owner, the agent's user, can open
//!   it. The agent checks the peer's uid too (`SO_PEERCRED`, tokio's
//!   `UnixStream::peer_cred`) and refuses any other uid, root included, before reading a
//!   byte, so a socket left with looser permissions is still only the owner's.
//! - One request line per connection ([`protocol`]), read with a size cap and a deadline.
//! - Who decided is recorded as the peer uid's user name (`/etc/passwd`), with the sudo
//!   caller the client names.

pub mod protocol;

use std::io;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use proxops_core::plan::digest::short;
use proxops_store::{ApprovalState, PassId, SharedStore};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error_chain::error_text;
use protocol::{MAX_LINE, Op, Request, Response};

/// How long a client has to send its request line.
const READ_DEADLINE: Duration = Duration::from_secs(5);

/// Path of the control socket inside `state_dir`.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join("control.sock")
}

/// The control socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Another process answers on the socket.
    #[error(
        "another agent is running for {}: it answers on {} (stop it first, or use another state_dir)",
        .state_dir.display(), .path.display()
    )]
    Taken {
        /// The state directory.
        state_dir: PathBuf,
        /// The socket.
        path: PathBuf,
    },
    /// The socket could not be created, or its mode set.
    #[error("creating the control socket {}", .path.display())]
    Create {
        /// The socket.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
}

/// The bound socket, not yet served. Dropping it removes the file.
#[derive(Debug)]
pub struct ControlSocket {
    listener: std::os::unix::net::UnixListener,
    file: SocketFile,
    owner: u32,
}

/// Removes the socket file when dropped.
#[derive(Debug)]
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_file(&self.0)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.0.display(), %error, "removing the control socket failed");
        }
    }
}

/// What the server needs from the agent.
#[derive(Clone)]
pub struct ControlContext {
    /// The state database (approvals).
    pub store: SharedStore,
    /// The node label passes are recorded under.
    pub node: String,
    /// Wakes the agent's loop for a pass (capacity one: approvals coalesce).
    pub wake: mpsc::Sender<()>,
}

impl ControlSocket {
    /// Creates `<state_dir>/control.sock`, mode 0600.
    ///
    /// # Errors
    /// [`ControlError::Taken`] when another agent answers on it; [`ControlError::Create`].
    pub fn bind(state_dir: &Path) -> Result<Self, ControlError> {
        let path = socket_path(state_dir);
        let create = |source| ControlError::Create {
            path: path.clone(),
            source,
        };
        if std::fs::symlink_metadata(&path).is_ok() {
            match std::os::unix::net::UnixStream::connect(&path) {
                Ok(_) => {
                    return Err(ControlError::Taken {
                        state_dir: state_dir.to_path_buf(),
                        path,
                    });
                }
                // Nobody answers: a socket a killed agent left behind.
                Err(_) => std::fs::remove_file(&path).map_err(create)?,
            }
        }
        let listener = std::os::unix::net::UnixListener::bind(&path).map_err(create)?;
        let file = SocketFile(path.clone());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(create)?;
        listener.set_nonblocking(true).map_err(create)?;
        let owner = std::fs::metadata(&path).map_err(create)?.uid();
        Ok(Self {
            listener,
            file,
            owner,
        })
    }

    /// Serves requests until `shutdown` fires, then removes the socket.
    pub fn serve(
        self,
        context: ControlContext,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let Self {
                listener,
                file,
                owner,
            } = self;
            let listener = match tokio::net::UnixListener::from_std(listener) {
                Ok(listener) => listener,
                Err(error) => {
                    tracing::error!(%error, "serving the control socket failed");
                    return;
                }
            };
            tracing::info!(path = %file.0.display(), "control socket listening");
            loop {
                let accepted = tokio::select! {
                    () = shutdown.cancelled() => break,
                    accepted = listener.accept() => accepted,
                };
                match accepted {
                    Ok((stream, _)) => {
                        let context = context.clone();
                        tokio::spawn(async move { connection(stream, owner, &context).await });
                    }
                    Err(error) => {
                        tracing::warn!(%error, "accepting on the control socket failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            drop(file);
        })
    }
}

/// One connection: the peer check, one request line, one response line.
async fn connection(mut stream: tokio::net::UnixStream, owner: u32, context: &ControlContext) {
    let response = match stream.peer_cred() {
        Ok(peer) if peer.uid() == owner => match read_line(&mut stream).await {
            Ok(line) => match protocol::parse_request(&line) {
                Ok(request) => handle(
                    context,
                    &request,
                    &who(peer.uid(), request.sudo_user.as_deref()),
                ),
                Err(message) => Response::refused(message),
            },
            Err(message) => Response::refused(message),
        },
        Ok(peer) => {
            tracing::warn!(
                uid = peer.uid(),
                owner,
                "control socket: a connection from another user was refused"
            );
            Response::refused(format!(
                "refused: only the agent's user ({}) may use the control socket; run the \
                 command as that user (e.g. sudo -u {} proxops approve …)",
                user_name(owner).unwrap_or_else(|| format!("uid {owner}")),
                user_name(owner).unwrap_or_else(|| owner.to_string()),
            ))
        }
        Err(error) => {
            Response::refused(format!("the peer's credentials could not be read: {error}"))
        }
    };
    let _ = stream.write_all(response.line().as_bytes()).await;
    let _ = stream.shutdown().await;
}

async fn read_line(stream: &mut tokio::net::UnixStream) -> Result<String, String> {
    let mut line = String::new();
    let mut reader = BufReader::new(stream.take(MAX_LINE as u64 + 1));
    match tokio::time::timeout(READ_DEADLINE, reader.read_line(&mut line)).await {
        Err(_) => Err(format!(
            "no request line within {} s",
            READ_DEADLINE.as_secs()
        )),
        Ok(Err(error)) => Err(format!("reading the request failed: {error}")),
        Ok(Ok(_)) if line.len() > MAX_LINE => {
            Err(format!("the request is longer than {MAX_LINE} bytes"))
        }
        Ok(Ok(_)) => Ok(line),
    }
}

/// Does what `request` asks, as `who`.
fn handle(context: &ControlContext, request: &Request, who: &str) -> Response {
    let (pass, approve, reason) = match &request.op {
        Op::Approve { pass, reason } => (*pass, true, reason),
        Op::Reject { pass, reason } => (*pass, false, reason),
    };
    let mut store = context
        .store
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let record = match store.approval_of_pass(PassId(pass)) {
        Ok(record) => record,
        Err(error) => {
            return Response::refused(format!("reading pass {pass}: {}", error_text(&error)));
        }
    };
    let Some(record) = record.filter(|r| r.node == context.node) else {
        return Response::refused(format!("pass {pass} has nothing awaiting approval"));
    };
    match record.state {
        ApprovalState::Lapsed => {
            let newer = store
                .open_approval(&context.node)
                .ok()
                .flatten()
                .map_or_else(String::new, |open| {
                    format!(
                        "; pass {} holds digest {}: review it with proxops status, then approve {}",
                        open.pass.0,
                        short(&open.digest),
                        open.pass.0
                    )
                });
            return Response::refused(format!(
                "pass {pass}'s approval lapsed: a newer plan differs (digest {} was held, pass {} \
                 planned another change){newer}",
                short(&record.digest),
                record.closed.map_or(0, |(_, p)| p.0),
            ));
        }
        ApprovalState::Cleared => {
            return Response::refused(format!(
                "pass {pass} has nothing awaiting approval: pass {} held nothing any more \
                 (applied, or no longer planned)",
                record.closed.map_or(0, |(_, p)| p.0)
            ));
        }
        ApprovalState::Awaiting | ApprovalState::Approved | ApprovalState::Rejected => {}
    }
    if let Err(error) = store.decide_approval(record.id, approve, who, reason, SystemTime::now()) {
        return Response::refused(format!("recording the decision: {}", error_text(&error)));
    }
    drop(store);
    let count =
        serde_json::from_str::<Vec<serde_json::Value>>(&record.actions).map_or(0, |a| a.len());
    let what = format!(
        "pass {} ({count} action{}, digest {})",
        record.pass.0,
        if count == 1 { "" } else { "s" },
        short(&record.digest)
    );
    if approve {
        tracing::info!(pass = record.pass.0, digest = short(&record.digest), %who, "approved");
        // A full channel already has a pass coming.
        let _ = context.wake.try_send(());
        Response::done(format!(
            "approved {what} as {who}: the agent runs the held actions in a pass starting now, \
             if it still plans the same change"
        ))
    } else {
        tracing::info!(pass = record.pass.0, digest = short(&record.digest), %who, "rejected");
        Response::done(format!(
            "rejected {what} as {who}: the actions stay held until the plan changes"
        ))
    }
}

/// The name `/etc/passwd` gives `uid`.
pub fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id: u32 = fields.nth(1)?.parse().ok()?;
        (id == uid).then(|| name.to_owned())
    })
}

/// Who decided: the peer uid's user, with the sudo caller the client names.
fn who(uid: u32, sudo_user: Option<&str>) -> String {
    let name = user_name(uid).unwrap_or_else(|| format!("uid {uid}"));
    match sudo_user {
        Some(caller) if !caller.is_empty() && caller != name => {
            format!(
                "{} (sudo, as {name})",
                caller.chars().take(64).collect::<String>()
            )
        }
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use proxops_store::Store;

    use super::*;

    fn context() -> (ControlContext, mpsc::Receiver<()>) {
        let (wake, woken) = mpsc::channel(1);
        let store = Arc::new(Mutex::new(Store::memory().unwrap()));
        (
            ControlContext {
                store,
                node: "pve1".into(),
                wake,
            },
            woken,
        )
    }

    fn request(op: Op) -> Request {
        Request {
            v: protocol::VERSION,
            op,
            sudo_user: None,
        }
    }

    #[test]
    fn approving_records_who_and_wakes_a_pass_and_a_lapsed_one_is_refused() {
        let (context, mut woken) = context();
        let nothing = handle(
            &context,
            &request(Op::Approve {
                pass: 4,
                reason: String::new(),
            }),
            "alice",
        );
        assert_eq!(nothing.message, "pass 4 has nothing awaiting approval");
        assert!(!nothing.ok);
        {
            let mut store = context.store.lock().unwrap();
            store
                .hold(
                    "pve1",
                    PassId(4),
                    "sha256:aaaa",
                    "[{}]",
                    "destructive",
                    SystemTime::now(),
                )
                .unwrap();
        }
        let done = handle(
            &context,
            &request(Op::Approve {
                pass: 4,
                reason: "ok".into(),
            }),
            "alice",
        );
        assert!(done.ok, "{}", done.message);
        assert!(done.message.contains("1 action,"), "{}", done.message);
        assert!(woken.try_recv().is_ok());
        let record = context
            .store
            .lock()
            .unwrap()
            .approval_of_pass(PassId(4))
            .unwrap()
            .unwrap();
        assert_eq!(record.state, ApprovalState::Approved);
        assert_eq!(record.decided.unwrap().0, "alice");

        context
            .store
            .lock()
            .unwrap()
            .hold(
                "pve1",
                PassId(5),
                "sha256:bbbb",
                "[]",
                "destructive",
                SystemTime::now(),
            )
            .unwrap();
        let lapsed = handle(
            &context,
            &request(Op::Reject {
                pass: 4,
                reason: String::new(),
            }),
            "alice",
        );
        assert!(!lapsed.ok);
        assert!(
            lapsed
                .message
                .starts_with("pass 4's approval lapsed: a newer plan differs"),
            "{}",
            lapsed.message
        );
        assert!(lapsed.message.contains("approve 5"), "{}", lapsed.message);
    }

    #[test]
    fn a_sudo_caller_is_recorded_beside_the_peers_user() {
        let me = std::fs::metadata("/proc/self").unwrap().uid();
        let name = user_name(me).unwrap_or_else(|| format!("uid {me}"));
        assert_eq!(who(me, None), name);
        assert_eq!(who(me, Some("carol")), format!("carol (sudo, as {name})"));
    }

    #[tokio::test]
    async fn the_socket_is_private_and_a_second_agent_is_refused_and_it_is_removed_at_stop() {
        let dir = tempfile::tempdir().unwrap();
        let socket = ControlSocket::bind(dir.path()).unwrap();
        let path = socket_path(dir.path());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (context, _woken) = context();
        let shutdown = CancellationToken::new();
        let served = socket.serve(context, shutdown.clone());
        let second = ControlSocket::bind(dir.path()).unwrap_err();
        assert!(matches!(second, ControlError::Taken { .. }), "{second}");
        shutdown.cancel();
        served.await.unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn a_stale_socket_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(dir.path());
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let socket = ControlSocket::bind(dir.path()).unwrap();
        drop(socket);
        assert!(!path.exists());
    }
}
