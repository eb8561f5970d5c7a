//! ProxOps: a GitOps pull agent for Proxmox VE.
//!
//! This crate is the shell around the pure core (`proxops-core`): everything that touches the
//! world lives here. Data flow of one pass (see ARCHITECTURE.md):
//! source (files of a revision) → `proxops_core::repository::load` (validate, levels) →
//! observe (PVE GETs) → plan (pure) → execute (PVE writes) → store (SQLite).
//!
//! Layout:
//! - [`adopt`]: existing guests and storage files → manifests, reading PVE with GETs only.
//! - [`agent`]: the long-running loop (schedule, triggers, retry).
//! - [`check`]: `proxops check`: does PVE have the storages, bridges and privileges the
//!   manifests and the current plan need (read-only).
//! - [`cli`]: one module per subcommand, each with a `run` function; exit codes.
//! - [`config`]: agent.toml → validated `AgentConfig` (secrets from files).
//! - [`demo`]: `proxops demo`: the agent against an in-process simulator and `examples/`.
//! - [`observe`]: PVE GETs → `ObservedState` (pve → core).
//! - [`execute`]: runs a `Plan` on PVE, waits for tasks, reports (core → pve).
//! - [`http`]: the agent's HTTP surface: status API, metrics, status page.
//! - [`migrate`]: `proxops migrate-config`: the Go ProxOps's configuration → agent.toml.
//! - [`reconcile`]: one pass (validate → observe → plan → execute), shared by CLI and agent.
//! - [`secrets`]: the cluster's SOPS document (age), decrypted in memory; ref checks.
//! - [`output`]: the output sink (human text or JSON); commands return data.
//! - [`source`]: reading a revision's manifest files (a directory, or the agent's git mirror).
//! - the agent's records in SQLite (passes, actions, drift, inventory) are the crate
//!   [`proxops_store`] (`crates/store`).
//! - [`telemetry`]: logging set-up.
//! - [`webhook`]: `/hooks/<forge>` receiver: checks HMAC signatures, then nudges the agent.

pub mod adopt;
pub mod agent;
pub mod check;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod demo;
pub mod error_chain;
pub mod execute;
pub mod forge;
pub mod html;
pub mod http;
pub mod metrics;
pub mod migrate;
pub mod notify;
pub mod observe;
pub mod output;
pub mod reconcile;
pub mod scope;
pub mod secrets;
pub mod serve;
pub mod snippets;
pub mod source;
pub mod telemetry;
pub mod timefmt;
pub mod validate;
pub mod webhook;
