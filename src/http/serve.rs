//! The accept loop of the agent's listeners (SECURITY-AUDIT.md H2): bounded connections,
//! header-read and body timeouts, HTTP/1.1 only.
//!
//! `axum::serve` runs hyper with its defaults and no limits: 1,100 half-sent requests held
//! for 40 s pinned the agent at its 1,024 file descriptors, `/healthz` stopped answering and
//! 19 passes in a row could not open the git mirror. Here:
//!
//! - **A connection cap** per listener ([`Limits::max_connections`]), far below the fd limit,
//!   so the agent's own files, git and PVE sockets always have descriptors left.
//! - **Eviction of the oldest idle connection** when the cap is reached: a new connection is
//!   never refused while some connection is only holding a slot (a half-sent header, an
//!   idle keep-alive). The one that waited longest is closed instead. A slowloris attack
//!   thus costs the attacker its oldest sockets while `/healthz`, a webhook or `proxops
//!   status` still get in. Only when every slot is in the middle of a request is a new
//!   connection answered 503 and closed at once (each request is bounded by
//!   [`Limits::request_timeout`]).
//!   No crate does this: tower's `ConcurrencyLimit` bounds requests, not sockets, and a
//!   semaphore in the accept loop would make `/healthz` wait behind the attacker.
//! - **hyper's `header_read_timeout`** ([`Limits::header_read_timeout`], with hyper-util's
//!   `TokioTimer`): a request whose head is not complete in time (or a keep-alive connection
//!   idle that long) is closed.
//! - **tower-http's `RequestBodyTimeoutLayer` and `TimeoutLayer`**: a body that stalls, or a
//!   request not answered within [`Limits::request_timeout`], ends with 408.
//! - **Small buffers**: at most [`MAX_HEADER_BYTES`] of request head per connection.
//! - HTTP/1.1 only: no h2c, whose stream multiplexing would need limits of its own.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;
use tower_http::timeout::{RequestBodyTimeoutLayer, TimeoutLayer};

use crate::webhook::tally::Tally;

/// The largest request head (request line and headers) read from a connection.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// How long open connections get to finish after shutdown was asked for.
const DRAIN: Duration = Duration::from_secs(5);

/// What one listener allows.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Time to receive a request's head (and how long a keep-alive connection may idle).
    pub header_read_timeout: Duration,
    /// Longest wait for the next piece of a request body.
    pub body_timeout: Duration,
    /// Longest time from a request's head to its answer (the body read included).
    pub request_timeout: Duration,
}

impl Limits {
    /// `[http] listen`: the status API, page and metrics (and webhooks, when they share it).
    pub const STATUS: Limits = Limits {
        // With the webhook listener's 128, 640 sockets at most: under systemd's default soft
        // limit of 1,024 descriptors that leaves 384 for the database, git and PVE. A client
        // keeping a pool of 256 connections busy (tests/it/flood.rs) stays below the cap.
        max_connections: 512,
        header_read_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(15),
    };

    /// `[webhook] listen`: forges send a handful of deliveries at a time.
    pub const WEBHOOK: Limits = Limits {
        max_connections: 128,
        ..Limits::STATUS
    };
}

/// Counters of what the listener did to protect itself.
#[derive(Debug, Default)]
pub struct ListenerCounts {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Idle connections closed to make room for a new one.
    pub evicted: AtomicU64,
    /// New connections closed at once because every slot was busy.
    pub refused: AtomicU64,
}

/// Open connections of one listener, oldest first.
#[derive(Debug, Default)]
struct Slots {
    next_id: u64,
    open: BTreeMap<u64, Slot>,
}

#[derive(Debug)]
struct Slot {
    /// Requests of this connection being served (0: idle or still sending its head).
    busy: Arc<AtomicUsize>,
    /// Closes the connection.
    evict: CancellationToken,
}

#[derive(Debug)]
struct Registry {
    max: usize,
    slots: Mutex<Slots>,
}

/// A connection's place in the registry; freed on drop.
struct Admitted {
    registry: Arc<Registry>,
    id: u64,
    busy: Arc<AtomicUsize>,
    evict: CancellationToken,
}

enum Admission {
    Admitted(Admitted),
    /// Admitted after closing the oldest idle connection.
    Evicted(Admitted),
    Refused,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn admit(self: &Arc<Self>) -> Admission {
        let mut slots = self.lock();
        let mut evicted = false;
        if slots.open.len() >= self.max {
            let oldest_idle = slots
                .open
                .iter()
                .find(|(_, slot)| slot.busy.load(Ordering::SeqCst) == 0)
                .map(|(id, _)| *id);
            match oldest_idle.and_then(|id| slots.open.remove(&id)) {
                Some(slot) => {
                    slot.evict.cancel();
                    evicted = true;
                }
                None => return Admission::Refused,
            }
        }
        let id = slots.next_id;
        slots.next_id += 1;
        let busy = Arc::new(AtomicUsize::new(0));
        let evict = CancellationToken::new();
        slots.open.insert(
            id,
            Slot {
                busy: busy.clone(),
                evict: evict.clone(),
            },
        );
        let admitted = Admitted {
            registry: self.clone(),
            id,
            busy,
            evict,
        };
        if evicted {
            Admission::Evicted(admitted)
        } else {
            Admission::Admitted(admitted)
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.registry.lock().open.remove(&self.id);
    }
}

/// Marks a connection busy while one of its requests is served.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn new(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The router with the request and body timeouts of `limits`.
fn with_timeouts(app: Router, limits: Limits) -> Router {
    app.layer(RequestBodyTimeoutLayer::new(limits.body_timeout))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            limits.request_timeout,
        ))
}

/// Serves `app` on `listener` within `limits` until `shutdown`; then stops accepting, asks
/// open connections to finish and waits for them up to a few seconds.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    counts: Arc<ListenerCounts>,
    shutdown: CancellationToken,
) {
    let name = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    let app = with_timeouts(app, limits);
    let registry = Arc::new(Registry {
        max: limits.max_connections,
        slots: Mutex::default(),
    });
    let crowded = Tally::default();
    let accept_errors = Tally::default();
    let tracker = TaskTracker::new();
    let mut flush = tokio::time::interval(Duration::from_secs(5));
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            _ = flush.tick() => {
                report(&crowded, &accept_errors, &name, Instant::now(), false);
                continue;
            }
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    // EMFILE/ENFILE and friends: the connection stays in the backlog; back
                    // off a little rather than spin on it.
                    if accept_errors.note("accept", Instant::now()) {
                        tracing::warn!(listen = %name, %error, "accepting a connection failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        counts.accepted.fetch_add(1, Ordering::Relaxed);
        let admitted = match registry.admit() {
            Admission::Admitted(admitted) => admitted,
            Admission::Evicted(admitted) => {
                counts.evicted.fetch_add(1, Ordering::Relaxed);
                if crowded.note("evicted", Instant::now()) {
                    tracing::warn!(
                        listen = %name,
                        max_connections = limits.max_connections,
                        "connection cap reached: closing the oldest idle connection for a new one"
                    );
                }
                admitted
            }
            Admission::Refused => {
                counts.refused.fetch_add(1, Ordering::Relaxed);
                if crowded.note("refused", Instant::now()) {
                    tracing::warn!(
                        listen = %name,
                        max_connections = limits.max_connections,
                        "connection cap reached and every connection is busy: closing a new one"
                    );
                }
                // An answer the client can read, without waiting for its request.
                let _ = stream.try_write(
                    b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
                );
                drop(stream);
                continue;
            }
        };
        tracker.spawn(connection(
            stream,
            peer,
            app.clone(),
            limits,
            admitted,
            shutdown.clone(),
        ));
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(DRAIN, tracker.wait()).await.is_err() {
        tracing::debug!(listen = %name, "connections still open after the drain period; closing them");
    }
    report(&crowded, &accept_errors, &name, Instant::now(), true);
}

fn report(crowded: &Tally, accept_errors: &Tally, name: &str, now: Instant, force: bool) {
    if let Some(summary) = crowded.flush(now, force) {
        tracing::warn!(
            listen = %name,
            count = summary.total,
            seconds = summary.over.as_secs(),
            reasons = %summary.by_reason,
            "more connections were closed at the connection cap"
        );
    }
    if let Some(summary) = accept_errors.flush(now, force) {
        tracing::warn!(
            listen = %name,
            count = summary.total,
            seconds = summary.over.as_secs(),
            "more connections could not be accepted"
        );
    }
}

/// Serves one connection until it ends, is evicted, or shutdown drains it.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: Limits,
    admitted: Admitted,
    shutdown: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let busy = admitted.busy.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let marker = Busy::new(&busy);
        let app = app.clone();
        async move {
            let response = app.oneshot(request.map(Body::new)).await;
            drop(marker);
            response.map_err(|never: Infallible| match never {})
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service));
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(error) = result {
                tracing::trace!(%peer, %error, "connection ended with an error");
            }
        }
        () = admitted.evict.cancelled() => {
            tracing::trace!(%peer, "idle connection evicted at the connection cap");
        }
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN, conn.as_mut()).await;
        }
    }
    drop(admitted);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(max: usize) -> Arc<Registry> {
        Arc::new(Registry {
            max,
            slots: Mutex::default(),
        })
    }

    fn admitted(admission: Admission) -> Admitted {
        match admission {
            Admission::Admitted(a) | Admission::Evicted(a) => a,
            Admission::Refused => panic!("refused"),
        }
    }

    #[test]
    fn at_the_cap_the_oldest_idle_connection_is_evicted_for_a_new_one() {
        let registry = registry(2);
        let first = admitted(registry.admit());
        let second = admitted(registry.admit());
        let third = registry.admit();
        assert!(matches!(third, Admission::Evicted(_)));
        assert!(first.evict.is_cancelled());
        assert!(!second.evict.is_cancelled());
        assert_eq!(registry.lock().open.len(), 2);
        drop(first);
        assert_eq!(
            registry.lock().open.len(),
            2,
            "an evicted slot is already gone"
        );
    }

    #[test]
    fn busy_connections_are_never_evicted_and_a_full_house_of_them_refuses() {
        let registry = registry(2);
        let first = admitted(registry.admit());
        let second = admitted(registry.admit());
        let _serving = Busy::new(&first.busy);
        let third = admitted(registry.admit());
        assert!(!first.evict.is_cancelled());
        assert!(second.evict.is_cancelled());
        let _also_serving = Busy::new(&third.busy);
        assert!(matches!(registry.admit(), Admission::Refused));
    }

    #[test]
    fn a_closed_connection_frees_its_slot() {
        let registry = registry(1);
        let only = admitted(registry.admit());
        let _busy = Busy::new(&only.busy);
        assert!(matches!(registry.admit(), Admission::Refused));
        drop(_busy);
        drop(only);
        assert!(matches!(registry.admit(), Admission::Admitted(_)));
    }
}
