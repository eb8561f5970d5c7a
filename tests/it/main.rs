//! End-to-end tests: the built `proxops` binary on example and fixture repositories.
//!
//! One test binary (STYLE H10) with a module per area.

// Test helpers outside #[test] functions may panic on setup failures: that is a failed test.
#![allow(clippy::unwrap_used)]

mod adopt;
mod agent;
mod approvals;
mod artifacts;
mod backup_before_delete;
mod check;
mod cli_validate;
mod cluster;
mod demo;
mod drift_history;
mod fidelity;
mod flood;
mod forge;
mod freeze;
mod git_server;
mod guard_rails;
mod guests;
mod ha_maintenance;
mod hostile;
mod hotplug;
mod invalid_head;
mod listener;
mod migrate;
mod notify;
mod one_iso;
mod plan_safety_net;
mod pools;
mod preview;
mod pve_api;
mod readme;
mod reliability;
mod repository_budget;
mod risk;
mod rollout;
mod scope;
mod secrets_never_leak;
mod sim;
mod snapshots_before_updates;
mod snippets;
mod sops;
mod stats_lag;
mod support;
mod tls;
mod ui;
mod verify;
