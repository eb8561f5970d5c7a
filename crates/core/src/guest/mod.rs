//! Guests ⇄ PVE guest configs, pure: a validated VM or LXC spec rendered to the config keys
//! ProxOps owns (`render`), a config as PVE returns it read back (`live`), and a semantic
//! comparison of the two that says what to write, what to delete, what to grow and what to
//! report (`compare`).
//!
//! No IO and no decisions about power or ordering: the planner turns a [`GuestDiff`] into
//! actions and findings. Wire forms follow DESIGN.md §2.4–2.5 and pve-api/LIVE-FACTS.md.

mod compare;
pub(crate) use compare::QEMU_FAST_PLUG;
mod live;
mod property;
#[cfg(test)]
mod property_fuzz_tests;
mod render;
#[cfg(test)]
pub(crate) mod testing;

pub use compare::{
    CompareContext, Finding, FindingKind, GuestDiff, PoolDrift, allocates_volume, compare,
    compare_pool,
};
pub use live::{LiveConfig, LiveEntry, LiveError, split_tags};
pub use property::{
    PropertyString, format_pve_size, parse_bool, parse_pve_size, percent_decode, percent_encode,
};
pub use render::{
    Artifacts, DiskRole, DiskRule, OWNERSHIP_TAG, Owned, RenderedConfig, Resize, Rule, Unsent,
    render, render_lxc, render_vm, sealed_value,
};

/// The two PVE guest types, which have different config vocabularies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GuestType {
    /// A QEMU VM (`/nodes/{n}/qemu/{id}`).
    Qemu,
    /// An LXC container (`/nodes/{n}/lxc/{id}`).
    Lxc,
}

impl GuestType {
    /// PVE's name: `qemu` or `lxc`.
    pub fn as_str(self) -> &'static str {
        match self {
            GuestType::Qemu => "qemu",
            GuestType::Lxc => "lxc",
        }
    }
}
