//! Cloud-init snippets on the node (issue 21): PVE's API cannot upload them, so the agent,
//! which runs on the node, writes `user-data`, `vendor-data` and `network-data` itself into
//! a storage's `snippets/` directory, content-addressed (`proxops_core::snippet`).
//!
//! - `config.rs`: `[snippets]` of agent.toml (default storage, grace period).
//! - `resolve.rs`: the pass's snippets read, secrets replaced, hashed and named.
//! - `file.rs`: the atomic, link-refusing writes, touches and removals.
//!
//! The executor's side (the storage's directory from `GET /storage/{storage}`, the
//! `write-snippet` and `remove-snippet` actions) is `execute/snippets.rs`. This module uses
//! no other module of the crate.

pub mod config;
pub mod file;
pub mod resolve;

pub use config::SnippetsConfig;
