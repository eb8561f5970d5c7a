//! Readiness notifications to systemd (`sd_notify`), for `Type=notify` in
//! `packaging/proxops-agent.service`: `READY=1` once the HTTP listener is bound and the loop
//! is about to start its first pass, `RELOADING=1` … `READY=1` around a SIGHUP reload, and
//! `STOPPING=1` as soon as a graceful stop begins.
//!
//! Outside systemd (`NOTIFY_SOCKET` unset: a shell, the tests) every call is a no-op, and a
//! failure to notify is logged at debug level and otherwise ignored: it must never stop the
//! agent.

use sd_notify::NotifyState;

/// Start-up is complete: the listener is bound and the first pass is starting.
pub fn ready(listen: std::net::SocketAddr) {
    let status = format!("STATUS=listening on {listen}");
    send(&[NotifyState::Ready, NotifyState::Custom(&status)]);
}

/// A SIGHUP reload begins. `MONOTONIC_USEC` lets systemd ≥ 253 match it to the reload it
/// asked for; older versions ignore it.
pub fn reloading() {
    let mut states = vec![NotifyState::Reloading];
    if let Ok(now) = NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    send(&states);
}

/// The reload finished (applied or refused; either way the agent runs on).
pub fn reloaded() {
    send(&[NotifyState::Ready]);
}

/// A graceful stop begins: the current step finishes, then the process exits.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::debug!(%error, "telling systemd the agent's state");
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;
    use std::time::Duration;

    const CHILD: &str = "agent::notify::tests::child_sends_every_state";

    /// Runs in a child process (see below) with `NOTIFY_SOCKET` set; ignored otherwise.
    #[test]
    #[ignore = "run by notifications_reach_the_socket_named_by_notify_socket"]
    fn child_sends_every_state() {
        super::ready("127.0.0.1:9494".parse().unwrap());
        super::reloading();
        super::reloaded();
        super::stopping();
    }

    #[test]
    fn without_notify_socket_every_call_is_a_quiet_no_op() {
        // The test harness does not run under systemd.
        assert!(std::env::var_os("NOTIFY_SOCKET").is_none());
        super::ready("127.0.0.1:9494".parse().unwrap());
        super::reloading();
        super::reloaded();
        super::stopping();
    }

    #[test]
    fn notifications_reach_the_socket_named_by_notify_socket() {
        // The environment is process-wide, so the sending side runs in a child process.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([CHILD, "--exact", "--ignored", "--nocapture"])
            .env("NOTIFY_SOCKET", &path)
            .status()
            .unwrap();
        assert!(status.success());
        let mut messages = Vec::new();
        let mut buffer = [0_u8; 512];
        for _ in 0..4 {
            let n = socket.recv(&mut buffer).unwrap();
            messages.push(String::from_utf8_lossy(&buffer[..n]).into_owned());
        }
        assert_eq!(messages[0], "READY=1\nSTATUS=listening on 127.0.0.1:9494\n");
        assert!(
            messages[1].starts_with("RELOADING=1\nMONOTONIC_USEC="),
            "{messages:?}"
        );
        assert_eq!(messages[2], "READY=1\n");
        assert_eq!(messages[3], "STOPPING=1\n");
    }
}
