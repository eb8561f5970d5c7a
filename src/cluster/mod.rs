//! Cluster mode on pmxcfs (`[pmxcfs]`, issue 22): each node's agent publishes a small status
//! file in the replicated `/etc/pve`, any node shows the whole cluster from those files, and
//! work only one node should do runs under a pmxcfs lock. The cluster (corosync and pmxcfs)
//! is the distributed engine; ProxOps adds no coordination service of its own (DESIGN.md §8).
//!
//! - [`config`]: the `[pmxcfs]` table.
//! - [`status_file`]: the per-node document [`status_file::NodeStatus`].
//! - [`fs`]: atomic replace and how a read-only (no quorum) `/etc/pve` shows.
//! - [`lock`]: cluster-wide locks made as pve-cluster's `cfs_lock` makes them.
//! - [`publish`]: the task that writes this node's file after each pass and every heartbeat.
//! - [`view`]: every node of `/cluster/status` with its file (the API, UI and CLI view).
//! - [`rollout`] and [`rollout_config`]: `[rollout]` waves, the pure decision whether a new
//!   commit may be written on this node now.
//!
//! Nothing here blocks or fails a pass: without quorum publishing is skipped (and said so
//! once a minute), the view says `unknown`, and a shared download goes on without the lock
//! after checking the storage again ([`lock`]).

pub mod config;
pub mod fs;
pub mod lock;
pub mod publish;
pub mod rollout;
pub mod rollout_config;
pub mod rollout_state;
pub mod status_file;
pub mod view;
