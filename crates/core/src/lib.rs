//! ProxOps pure core.
#![warn(missing_docs)]
