//! In-memory Proxmox VE 9 simulator over HTTP(S).
//!
//! Built from PVE 9.1's published API schema and `shared/pve-api/BEHAVIOUR.md`, never from
//! what the ProxOps client sends. Shares no types with `proxops-pve`.
//!
//! # Layout
//!
//! * `server` — listener, TLS, connection handling; [`start`], [`SimConfig`], [`RunningSim`].
//! * `tls` — the self-signed certificate and its fingerprint.
//! * `api` — the dispatcher (faults, auth, parameters, schema check, routing) and one
//!   handler module per API area; `api/control.rs` is the `/_sim/` control API.
//! * `auth` — API tokens, tickets, CSRF.
//! * `acl` — roles, ACL entries, token privilege separation: the privileges a caller holds.
//! * `cluster` — the state: nodes, storages and volumes, guests, tasks, pools, users.
//! * `guest`, `storage`, `property` — rules of guest configs, volumes and property strings.
//! * `task` — UPIDs and the task runner.
//! * `download` — download-url's fetch, checksums and filename rules.
//! * `faults`, `request_log`, `control` — fault injection and the request log ([`SimControl`]).
//! * `seed` — the initial cluster ([`Seed`]).
//! * `schema` — parameter validation against the vendored PVE schema.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> Result<(), proxops_pve_sim::SimError> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(proxops_pve_sim::SimError::Listener)?;
//! let sim = proxops_pve_sim::start(proxops_pve_sim::SimConfig::default(), listener).await?;
//! println!("{} {:?}", sim.base_url(), sim.fingerprint());
//! sim.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod acl;
mod api;
mod auth;
mod cluster;
mod control;
mod download;
mod error;
mod faults;
mod guest;
mod property;
mod request_log;
pub mod schema;
mod seed;
mod server;
mod state;
mod storage;
mod task;
mod tls;

pub use control::SimControl;
pub use error::SimError;
pub use faults::{FaultError, HttpFault};
pub use request_log::{RequestLog, RequestRecord};
pub use seed::{
    AclSeed, DatacenterSeed, GroupSeed, GuestSeed, HaSeed, NodeSeed, REALISTIC_3NODE, RoleSeed,
    Seed, SeedError, StorageSeed, TokenSeed, UserSeed, VolumeSeed,
};
pub use server::{
    DEFAULT_LOCK_TIMEOUT, DEFAULT_PROXY_TIMEOUT, DEFAULT_STATS_INTERVAL, DEFAULT_TASK_DURATION,
    RunningSim, SimConfig, start,
};
