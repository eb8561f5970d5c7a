//! In-memory Proxmox VE 9 simulator over HTTP(S).
//!
//! Built from PVE 9.1's published API schema and `shared/pve-api/BEHAVIOUR.md`, never from
//! what the ProxOps client sends. Shares no types with `proxops-pve`.

pub mod schema;
