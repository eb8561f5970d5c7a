//! Typed Proxmox VE REST client for ProxOps.
//!
//! Knows PVE's API and nothing of manifests, plans or the agent: the binary maps these types
//! into `proxops-core`'s vocabulary (`observe.rs`) and back (`execute/`).
//!
//! # Layout
//!
//! - [`request`]: pure builders, one per endpoint, producing [`Request`] values (method,
//!   percent-encoded path, query, form). Unit-tested without a socket; the contract test in
//!   `tests/contract.rs` checks each against PVE's API schema.
//! - [`client`]: [`PveClient`] sends a `Request` with API-token auth, timeouts and safe
//!   retries, and unwraps the `{"data": ...}` envelope; typed calls for the common reads.
//! - [`trust`]: [`Trust`] (CA file, fingerprint pin, insecure) and the rustls config.
//! - [`error`]: [`PveError`] with PVE's status, message and per-parameter errors, classified
//!   by what the caller should do (`is_transient`, `is_lock_timeout`, `is_not_found`).
//! - [`upid`]: [`Upid`], PVE's task id.
//! - [`task`]: [`TaskStatus`], [`wait_for_task`] (the [`next_poll`] schedule, timeout,
//!   cancellation) and the task log.
//! - [`cluster`], [`storage`]: response types and their parameters.
//! - [`backup`]: `vzdump` (backup before delete) and PVE's HA status (nodes in maintenance).
//! - `lenient`: serde helpers for PVE's loose JSON typing (numbers as strings, 0/1 booleans).

#![warn(missing_docs)]

pub mod backup;
pub mod client;
pub mod cluster;
pub mod error;
mod lenient;
pub mod request;
pub mod storage;
pub mod task;
pub mod trust;
pub mod upid;
#[cfg(test)]
mod upid_fuzz_tests;

pub use client::{ClientConfig, PveClient, RetryPolicy, Timeouts};
pub use cluster::{ClusterResource, NodeInfo, ResourceType, Version};
pub use error::{PveError, TransportKind};
pub use request::{Method, Request};
pub use secrecy::SecretString;
pub use storage::{
    Checksum, ChecksumAlgorithm, ContentItem, ContentType, DownloadUrl, StorageConfig, StorageInfo,
};
pub use task::{
    TaskDurations, TaskError, TaskLogLine, TaskState, TaskStatus, WaitOptions, next_poll,
    wait_for_task,
};
pub use trust::{Fingerprint, Trust};
pub use upid::Upid;
