//! `git http-backend` (git's own smart-HTTP CGI program) behind a TLS server on 127.0.0.1,
//! for benches: a local CA (rcgen) signs a certificate for 127.0.0.1; the CA's PEM is written
//! to a file that `SSL_CERT_FILE` (gix's reqwest, through rustls-platform-verifier's
//! rustls-native-certs roots) and `GIT_SSL_CAINFO` (git's CLI) name.
//!
//! HTTP/1.1 with keep-alive (both clients reuse one connection for the requests of a fetch),
//! one thread per connection; request bodies by `Content-Length` or chunked; the CGI's answer
//! is buffered and sent with a `Content-Length`. CGI variables as git's `http-backend`
//! documentation lists them (`GIT_PROJECT_ROOT`, `GIT_HTTP_EXPORT_ALL`, `PATH_INFO`,
//! `REQUEST_METHOD`, `QUERY_STRING`, `CONTENT_TYPE`, `GIT_PROTOCOL`, `HTTP_CONTENT_ENCODING`).
#![allow(dead_code, reason = "each bench uses a subset")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

/// The CA's certificate (PEM) for `SSL_CERT_FILE`, written into `dir`.
pub(crate) fn write_ca(dir: &Path) -> (PathBuf, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "proxops bench CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    (ca_file, leaf.pem(), leaf_key.serialize_pem())
}

/// Serves the bare repositories under `root` over https on 127.0.0.1; returns the port.
pub(crate) fn serve(root: &Path, cert_pem: &str, key_pem: &str) -> u16 {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap()],
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap(),
    )
    .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let root = root.to_owned();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let _ = stream.set_nodelay(true);
            let config = Arc::clone(&config);
            let root = root.clone();
            std::thread::spawn(move || {
                let connection = rustls::ServerConnection::new(config).unwrap();
                let tls = rustls::StreamOwned::new(connection, stream);
                let mut reader = BufReader::new(tls);
                while serve_one(&mut reader, &root).unwrap_or(false) {}
            });
        }
    });
    port
}

/// One request on a kept-alive connection; `Ok(false)` when the client closed it.
fn serve_one<S: Read + Write>(reader: &mut BufReader<S>, root: &Path) -> std::io::Result<bool> {
    let mut request_line = String::new();
    if reader.read_line(&mut request_line)? == 0 {
        return Ok(false);
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(false);
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(length) = header("content-length").and_then(|v| v.parse().ok()) {
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut cgi = Command::new("git");
    cgi.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", &method)
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("CONTENT_LENGTH", body.len().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (name, var) in [
        ("content-type", "CONTENT_TYPE"),
        ("git-protocol", "GIT_PROTOCOL"),
        ("content-encoding", "HTTP_CONTENT_ENCODING"),
    ] {
        if let Some(value) = header(name) {
            cgi.env(var, value);
        }
    }
    let mut child = cgi.spawn()?;
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&body);
    });
    let output = child.wait_with_output()?;
    let _ = writer.join();
    let out = output.stdout;
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| (at, 4))
        .or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|at| (at, 2)));
    let (head, content) = match split {
        Some((at, len)) => (
            String::from_utf8_lossy(&out[..at]).into_owned(),
            &out[at + len..],
        ),
        None => (String::new(), &out[..]),
    };
    let mut status = "200 OK".to_owned();
    let mut response_headers = String::new();
    for line in head.lines() {
        if let Some(value) = line.strip_prefix("Status:") {
            status = value.trim().to_owned();
        } else if !line.is_empty() {
            response_headers.push_str(line.trim_end());
            response_headers.push_str("\r\n");
        }
    }
    let stream = reader.get_mut();
    write!(
        stream,
        "HTTP/1.1 {status}\r\n{response_headers}Content-Length: {}\r\n\r\n",
        content.len()
    )?;
    stream.write_all(content)?;
    stream.flush()?;
    Ok(true)
}
