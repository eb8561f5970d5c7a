//! Typed Proxmox VE REST client (grows with the PVE client issue).
