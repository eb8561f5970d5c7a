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
//! - [`cli`]: one module per subcommand, each with a `run` function; exit codes.
//! - [`config`]: agent.toml → validated `AgentConfig` (secrets from files).
//! - [`observe`]: PVE GETs → `ObservedState` (the only pve → core mapping).
//! - [`execute`]: runs a `Plan` on PVE, waits for tasks, reports (core → pve).
//! - [`reconcile`]: one pass (validate → observe → plan → execute), shared by CLI and agent.
//! - [`secrets`]: the cluster's SOPS document (age), decrypted in memory; ref checks.
//! - [`output`]: the only place that prints (human text or JSON).
//! - [`source`]: reading a revision's manifest files (a directory today, git later).
//! - the store is the crate [`proxops_store`] (`crates/store`): the agent's records in SQLite.
//! - [`telemetry`]: logging set-up.
//! - [`webhook`]: `/hooks/<forge>` receiver: checks HMAC signatures, then nudges the agent.

pub mod adopt;
pub mod agent;
pub mod check;
pub mod cli;
pub mod config;
pub mod demo;
pub mod execute;
pub mod http;
pub mod migrate;
pub mod observe;
pub mod output;
pub mod reconcile;
pub mod secrets;
pub mod source;
pub mod telemetry;
pub mod webhook;
