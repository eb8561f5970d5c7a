//! Cluster mode on pmxcfs (issue 22).

pub mod rollout;
pub mod rollout_config;
