//! What the VM and LXC mappings share: the record of what a guest's config held that the
//! manifest cannot say (gaps, with secret values redacted), the keys already mapped, and the
//! value conversions (sizes, booleans, tags).

use std::collections::BTreeSet;

use proxops_core::guest::{LiveConfig, OWNERSHIP_TAG, PropertyString, parse_bool, parse_pve_size};
use serde::Serialize;

use super::yaml::Value;

/// Shown instead of the value of a secret-bearing key.
pub(crate) const REDACTED: &str = "<redacted>";

/// Keys whose values are secrets or key material: never copied into a report or a file.
const SECRET_KEYS: [&str; 3] = ["cipassword", "sshkeys", "password"];

/// Whether a config key's value must never leave PVE.
pub(crate) fn is_secret_key(key: &str) -> bool {
    let base = key.split('.').next().unwrap_or(key);
    SECRET_KEYS.contains(&base) || base.contains("password") || base.contains("secret")
}

/// One thing PVE has that the adopted manifest does not say.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Gap {
    /// `VM/web-1`.
    pub resource: String,
    /// The PVE key (`cicustom`, `scsi0.cache`).
    pub key: String,
    /// The value as PVE reported it, or `<redacted>`.
    pub value: String,
    /// Why it is not in the manifest, or what the manifest says instead.
    pub note: String,
}

/// The mapping of one guest config: which keys were used, and the gaps found.
pub(crate) struct Mapping<'a> {
    pub(crate) config: &'a LiveConfig,
    resource: String,
    used: BTreeSet<String>,
    pub(crate) gaps: Vec<Gap>,
    /// Fields the operator must fill in before the manifest is valid.
    pub(crate) fill: Vec<String>,
    /// Keys PVE's config does not hold, written as the default PVE runs the guest with.
    pub(crate) defaults: Vec<String>,
}

impl<'a> Mapping<'a> {
    pub(crate) fn new(config: &'a LiveConfig, resource: String) -> Self {
        Self {
            config,
            resource,
            used: BTreeSet::new(),
            gaps: Vec::new(),
            fill: Vec::new(),
            defaults: Vec::new(),
        }
    }

    /// The raw value of `key`, marking it mapped.
    pub(crate) fn take(&mut self, key: &str) -> Option<&'a str> {
        let value = self.config.get(key)?;
        self.used.insert(key.to_owned());
        Some(value)
    }

    /// The value of `key` split as a property string, marking it mapped.
    pub(crate) fn take_props(&mut self, key: &str, bare: Option<&str>) -> Option<PropertyString> {
        self.take(key).map(|raw| PropertyString::parse(raw, bare))
    }

    /// A boolean key, marking it mapped; a value that is not a boolean is a gap.
    pub(crate) fn take_bool(&mut self, key: &str) -> Option<bool> {
        let raw = self.take(key)?;
        let parsed = parse_bool(raw.split(',').next().unwrap_or(raw));
        if parsed.is_none() {
            self.gap(key, raw, "not a boolean; not adopted");
        }
        parsed
    }

    /// Records a gap; the value is redacted when the key bears a secret.
    pub(crate) fn gap(&mut self, key: &str, value: &str, note: &str) {
        let value = if is_secret_key(key) {
            REDACTED.to_owned()
        } else {
            value.to_owned()
        };
        self.gaps.push(Gap {
            resource: self.resource.clone(),
            key: key.to_owned(),
            value,
            note: note.to_owned(),
        });
    }

    /// Parts of a property string other than `known`, each recorded as a gap `key.part`.
    pub(crate) fn extra_parts(&mut self, key: &str, props: &PropertyString, known: &[&str]) {
        for (part, value) in props.items() {
            if !known.contains(&part.as_str()) {
                self.gap(
                    &format!("{key}.{part}"),
                    value,
                    "not modelled by ProxOps; left as PVE has it",
                );
            }
        }
    }

    /// Records that `key` is absent from PVE's config and the manifest says PVE's default
    /// for it, which the planner compares an absent key with: not a gap, no write.
    pub(crate) fn defaulted(&mut self, key: &str) {
        self.defaults.push(key.to_owned());
    }

    /// Marks a key as mapped without reading it.
    pub(crate) fn mark(&mut self, key: &str) {
        self.used.insert(key.to_owned());
    }

    /// Every key that is neither mapped nor filled in by PVE, as a gap.
    pub(crate) fn finish(&mut self) {
        let rest: Vec<(String, String)> = self
            .config
            .entries()
            .filter(|(key, entry)| !entry.pve_filled && !self.used.contains(*key))
            .map(|(key, entry)| (key.to_owned(), entry.raw.clone()))
            .collect();
        for (key, raw) in rest {
            self.gap(&key, &raw, "not modelled by ProxOps; left as PVE has it");
        }
        self.gaps.sort();
    }
}

/// A PVE size (`32G`, `512M`, `4M`) as a manifest quantity (`32GiB`); `None` when unreadable.
pub(crate) fn quantity(pve_size: &str) -> Option<String> {
    let bytes = parse_pve_size(pve_size)?;
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    if bytes == 0 {
        return None;
    }
    for (shift, unit) in UNITS {
        if bytes.is_multiple_of(1u64 << shift) {
            return Some(format!("{}{unit}", bytes >> shift));
        }
    }
    Some(bytes.to_string())
}

/// MiB as written in PVE's `memory`/`swap` (`2048`) → `2GiB` / `512MiB`.
pub(crate) fn mib_quantity(mib: u64) -> String {
    if mib != 0 && mib.is_multiple_of(1024) {
        format!("{}GiB", mib / 1024)
    } else {
        format!("{mib}MiB")
    }
}

/// The guest's tags, lower-cased and sorted, without the ownership tag.
pub(crate) fn tags(config: &LiveConfig) -> Vec<Value> {
    let set: BTreeSet<String> = config
        .tags()
        .into_iter()
        .filter(|t| t != OWNERSHIP_TAG)
        .collect();
    set.into_iter().map(Value::Text).collect()
}

/// The storage of a volume id (`local-lvm:vm-100-disk-0` → `local-lvm`).
pub(crate) fn volume_storage(volid: &str) -> Option<&str> {
    volid.split_once(':').map(|(storage, _)| storage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pve_sizes_become_binary_quantities() {
        assert_eq!(quantity("32G").as_deref(), Some("32GiB"));
        assert_eq!(quantity("4M").as_deref(), Some("4MiB"));
        assert_eq!(quantity("1536M").as_deref(), Some("1536MiB"));
        assert_eq!(quantity("nonsense"), None);
        assert_eq!(mib_quantity(2048), "2GiB");
        assert_eq!(mib_quantity(512), "512MiB");
    }

    #[test]
    fn secret_bearing_keys_are_recognised() {
        assert!(is_secret_key("cipassword"));
        assert!(is_secret_key("sshkeys"));
        assert!(!is_secret_key("cicustom"));
    }
}
