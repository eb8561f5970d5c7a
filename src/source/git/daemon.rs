//! `git://` connections made by us rather than by gix, so the socket can be tuned: with Nagle's
//! algorithm on and the peer's delayed ACKs, each request/response turn of a fetch stalled
//! about 40 ms (Linux's minimum delayed-ACK time).
//!
//! Why, as measured (`strace -f` of `cargo bench --bench agent -- fetch`, issue 20): gix's
//! packet-line writer sends every line as three `write`s (length, payload, newline), so after
//! the first small segment Nagle holds the rest of a request until the server ACKs it, which
//! `git upload-pack` delays; and upload-pack writes a response as several small writes, whose
//! later segments its own Nagle holds until we ACK, which our kernel delays the same way. With
//! delayed ACKs turned off on loopback (`ip route … quickack 1`) the agent's fetch of one change
//! took 31.5 ms instead of 158.5 ms, and git's CLI 43.1 ms instead of 129.9 ms. git's CLI writes
//! each request in one `write`; gix, and a shallow fetch's extra `shallow-info` section, met one
//! stall more per fetch than git's CLI.
//!
//! So: `TCP_NODELAY` (every write leaves at once) and `TCP_QUICKACK` re-armed before every read
//! (Linux leaves quick-ACK mode by itself; the flag is not sticky). Everything else is what
//! gix's own `git://` connect does (gix-transport 0.62 `client::git::blocking_io::connect`):
//! a 5 s connect timeout, protocol v2 unless configured otherwise, the URL's host and port as the
//! virtual host — but not `GIT_OVERRIDE_VIRTUAL_HOST` from the environment, which gix reads.

use std::io::Read;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use gix::protocol::transport::client::blocking_io::Transport;
use gix::protocol::transport::client::git::{ConnectMode, blocking_io::Connection};

/// How long the TCP connect may take: gix's own value for `git://`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to the git daemon named by `url` (scheme `git`) for `version` of the protocol.
///
/// # Errors
/// The host does not resolve, the connection is refused or times out, or the URL carries a user
/// name (which `git://` has no way to send; gix refuses it too).
pub(super) fn connect(
    url: &gix::Url,
    version: gix::protocol::transport::Protocol,
) -> std::io::Result<Box<dyn Transport + Send>> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_owned());
    if url.user().is_some() {
        return Err(invalid("a git:// URL cannot carry a user name"));
    }
    let host = url
        .host()
        .ok_or_else(|| invalid("the git:// URL has no host"))?;
    let port = url.port;
    let address = (host, port.unwrap_or(9418))
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| invalid("the git server's host name resolved to no address"))?;
    let stream = TcpStream::connect_timeout(&address, CONNECT_TIMEOUT)?;
    stream.set_nodelay(true)?;
    let write = stream.try_clone()?;
    Ok(Box::new(Connection::new(
        QuickAck(stream),
        write,
        version,
        url.path.clone(),
        Some((host.to_owned(), port)),
        ConnectMode::Daemon,
        false,
    )))
}

/// The read half of the connection, asking the kernel to ACK at once whatever arrives next.
struct QuickAck(TcpStream);

impl Read for QuickAck {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // Best effort: a socket that refuses the option only reads slower.
        let _ = rustix::net::sockopt::set_tcp_quickack(&self.0, true);
        self.0.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gix::bstr::ByteSlice;
    use gix::protocol::transport::Protocol;
    use std::io::Write;
    use std::net::TcpListener;

    #[test]
    fn a_git_url_with_a_user_name_is_refused_before_connecting() {
        let url =
            gix::url::parse("git://someone@127.0.0.1:1/repo.git".as_bytes().as_bstr()).unwrap();
        let err = connect(&url, Protocol::V2).err().unwrap();
        assert!(err.to_string().contains("user name"), "{err}");
    }

    #[test]
    fn the_connection_greets_the_daemon_with_the_path_virtual_host_and_protocol_v2() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = gix::url::parse(
            format!("git://127.0.0.1:{port}/origin.git")
                .as_bytes()
                .as_bstr(),
        )
        .unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            // One pkt-line, which may arrive in several segments (no Nagle): its length first.
            let mut length = [0u8; 4];
            stream.read_exact(&mut length).unwrap();
            let length = usize::from_str_radix(std::str::from_utf8(&length).unwrap(), 16).unwrap();
            let mut greeting = vec![0u8; length - 4];
            stream.read_exact(&mut greeting).unwrap();
            // A v2 server would now advertise; closing is enough for this test.
            stream.write_all(b"0000").unwrap();
            String::from_utf8_lossy(&greeting).into_owned()
        });
        let mut transport = connect(&url, Protocol::V2).unwrap();
        let _ = transport.handshake(gix::protocol::transport::Service::UploadPack, &[]);
        let greeting = server.join().unwrap();
        assert!(
            greeting.contains("git-upload-pack /origin.git\0host=127.0.0.1:"),
            "{greeting:?}"
        );
        assert!(greeting.contains("version=2"), "{greeting:?}");
    }
}
