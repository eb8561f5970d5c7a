//! A guest config as PVE returns it (`GET /nodes/{n}/qemu|lxc/{id}/config`) → [`LiveConfig`]:
//! every value as text, property-string values split into ordered key/value pairs, and the
//! keys PVE fills in itself (`digest`, `smbios1`, `vmgenid`, `meta`, ...) marked as not owned.
//!
//! Reading only: nothing here decides what is drift (that is `compare`). PVE's JSON typing is
//! loose (BEHAVIOUR.md §11), so numbers, booleans and numeric strings are all accepted.

use std::collections::BTreeMap;

use serde_json::Value;

use super::GuestType;
use super::property::{PropertyString, parse_bool};

/// Keys PVE writes itself and ProxOps never owns.
const PVE_FILLED: [&str; 9] = [
    "digest", "smbios1", "vmgenid", "meta", "lock", "template", "ostype", "parent", "bootdisk",
];

/// Why a config could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiveError {
    /// The body (or its `data`) is not a JSON object.
    #[error("guest config is not a JSON object")]
    NotAnObject,
    /// The body of `GET .../pending` (or its `data`) is not a list of `{key, ...}` objects.
    #[error("guest pending list is not a JSON array of objects with a key")]
    NotAPendingList,
}

/// One key of a live config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveEntry {
    /// The value as PVE returned it, as text.
    pub raw: String,
    /// The value split as a property string, for keys whose format is one.
    pub props: Option<PropertyString>,
    /// Whether PVE fills this key in itself (never owned by ProxOps).
    pub pve_filled: bool,
}

/// A guest config as PVE reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveConfig {
    guest_type: GuestType,
    /// The config with pending values applied (what `GET .../config` shows).
    entries: BTreeMap<String, LiveEntry>,
    /// Keys PVE holds a change or a delete for, with the value in effect now (`None`: not
    /// set now). Only known when read from `GET .../pending`.
    pending: BTreeMap<String, Option<String>>,
}

impl LiveConfig {
    /// Reads the body of `GET .../config`: either `{"data": {...}}` or the object itself.
    /// `null` values are skipped; a list of strings (some mocks give `tags` as one) is joined
    /// with `;`; other nested values (raw `lxc` lines) are kept as JSON text.
    ///
    /// # Errors
    ///
    /// [`LiveError::NotAnObject`] when the body is not an object.
    pub fn from_json(guest_type: GuestType, body: &Value) -> Result<Self, LiveError> {
        let object = match body.get("data") {
            Some(data @ Value::Object(_)) => data,
            _ => body,
        };
        let Value::Object(map) = object else {
            return Err(LiveError::NotAnObject);
        };
        let pairs = map
            .iter()
            .filter_map(|(key, value)| Some((key.clone(), text_of(value)?)));
        Ok(Self::from_pairs(guest_type, pairs))
    }

    /// Reads the body of `GET .../pending` (`[{key, value?, pending?, delete?}]`, `digest`
    /// among the keys): the config with pending values applied, as `GET .../config` would
    /// show it, plus which keys are pending and their value in effect now. One request
    /// instead of two.
    ///
    /// # Errors
    ///
    /// [`LiveError::NotAPendingList`] when the body is not such a list.
    pub fn from_pending_json(guest_type: GuestType, body: &Value) -> Result<Self, LiveError> {
        let list = match body.get("data") {
            Some(data @ Value::Array(_)) => data,
            _ => body,
        };
        let Value::Array(items) = list else {
            return Err(LiveError::NotAPendingList);
        };
        let mut merged = Vec::with_capacity(items.len());
        let mut pending = BTreeMap::new();
        for item in items {
            let Some(key) = item.get("key").and_then(Value::as_str) else {
                return Err(LiveError::NotAPendingList);
            };
            let current = item.get("value").and_then(text_of);
            let new = item.get("pending").and_then(text_of);
            let deleted = item
                .get("delete")
                .and_then(text_of)
                .is_some_and(|d| d != "0");
            if new.is_some() || deleted {
                pending.insert(key.to_owned(), current.clone());
            }
            let effective = if deleted { None } else { new.or(current) };
            if let Some(value) = effective {
                merged.push((key.to_owned(), value));
            }
        }
        let mut live = Self::from_pairs(guest_type, merged);
        live.pending = pending;
        Ok(live)
    }

    /// A live config from key/value text pairs (tests, and callers that already hold text).
    pub fn from_pairs<K, V>(guest_type: GuestType, pairs: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        let entries = pairs
            .into_iter()
            .map(|(k, v)| {
                let key: String = k.into();
                let raw: String = v.into();
                let props =
                    property_default_key(guest_type, &key).map(|d| PropertyString::parse(&raw, d));
                let pve_filled = PVE_FILLED.contains(&key.as_str());
                (
                    key,
                    LiveEntry {
                        raw,
                        props,
                        pve_filled,
                    },
                )
            })
            .collect();
        Self {
            guest_type,
            entries,
            pending: BTreeMap::new(),
        }
    }

    /// The same config carrying `digest` (read separately, when a pending list lacks it).
    #[must_use]
    pub fn with_digest(mut self, digest: &str) -> LiveConfig {
        self.entries.insert(
            "digest".to_owned(),
            LiveEntry {
                raw: digest.to_owned(),
                props: None,
                pve_filled: true,
            },
        );
        self
    }

    /// The keys PVE holds a change or delete for until the guest restarts.
    pub fn pending_keys(&self) -> impl Iterator<Item = &str> {
        self.pending.keys().map(String::as_str)
    }

    /// The config in effect now: pending values and deletes not applied. The same config
    /// when nothing is pending (or it was read from `GET .../config`, which cannot tell).
    #[must_use]
    pub fn current(&self) -> LiveConfig {
        let mut pairs: BTreeMap<String, String> = self
            .entries
            .iter()
            .map(|(k, e)| (k.clone(), e.raw.clone()))
            .collect();
        for (key, value) in &self.pending {
            match value {
                Some(v) => pairs.insert(key.clone(), v.clone()),
                None => pairs.remove(key),
            };
        }
        Self::from_pairs(self.guest_type, pairs)
    }

    /// Whether this is a qemu or an lxc config.
    pub fn guest_type(&self) -> GuestType {
        self.guest_type
    }

    /// The entry under `key`.
    pub fn entry(&self, key: &str) -> Option<&LiveEntry> {
        self.entries.get(key)
    }

    /// The raw value under `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.get(key).map(|e| e.raw.as_str())
    }

    /// Every key and entry, sorted by key.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &LiveEntry)> {
        self.entries.iter().map(|(k, e)| (k.as_str(), e))
    }

    /// The `digest` to send back with an update (optimistic concurrency).
    pub fn digest(&self) -> Option<&str> {
        self.get("digest")
    }

    /// Whether PVE reports the guest as a template (`template: 1`).
    pub fn is_template(&self) -> bool {
        self.get("template").and_then(parse_bool).unwrap_or(false)
    }

    /// The ownership tags split as PVE accepts them (`;`, `,` or spaces), lowercased.
    pub fn tags(&self) -> Vec<String> {
        self.get("tags").map(split_tags).unwrap_or_default()
    }
}

/// A JSON value as config text: `null` is absent; a list of strings (some mocks give `tags`
/// as one) is joined with `;`; other nested values (raw `lxc` lines, a list of pairs ProxOps
/// never owns) are kept as their JSON text rather than refusing the whole config.
fn text_of(value: &Value) -> Option<String> {
    Some(match value {
        Value::Null => return None,
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => if *b { "1" } else { "0" }.to_owned(),
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(";"),
        Value::Array(_) | Value::Object(_) => value.to_string(),
    })
}

/// Splits a `tags` value on `;`, `,` and spaces, lowercased, empty parts dropped.
pub fn split_tags(value: &str) -> Vec<String> {
    value
        .split([';', ',', ' '])
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// For keys whose value is a property string: the key a bare leading part belongs to
/// (`Some(None)` when the format has no default key). `None` for plain values.
pub(crate) fn property_default_key(
    guest_type: GuestType,
    key: &str,
) -> Option<Option<&'static str>> {
    let qemu = guest_type == GuestType::Qemu;
    Some(match key {
        "cpu" if qemu => Some("cputype"),
        "agent" if qemu => Some("enabled"),
        "vga" | "machine" if qemu => Some("type"),
        "memory" if qemu => Some("current"),
        "efidisk0" | "tpmstate0" if qemu => Some("file"),
        "rootfs" if !qemu => Some("volume"),
        "boot" | "startup" | "features" | "smbios1" | "meta" => None,
        _ if qemu && is_disk_key(key) => Some("file"),
        _ if qemu && numbered(key, "net") => Some("model"),
        _ if qemu && numbered(key, "hostpci") => Some("host"),
        // LIVE-FACTS §1.4 also reports a bare `dhcp`.
        _ if qemu && numbered(key, "ipconfig") => Some("ip"),
        _ if !qemu && numbered(key, "net") => None,
        _ if !qemu && numbered(key, "mp") => Some("volume"),
        _ if numbered(key, "unused") => Some("file"),
        _ => return None,
    })
}

/// Whether `key` is `<prefix><digits>`.
pub(crate) fn numbered(key: &str, prefix: &str) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `key` is a qemu disk slot (`scsiN`, `virtioN`, `sataN`, `ideN`, `nvmeN`).
pub(crate) fn is_disk_key(key: &str) -> bool {
    ["scsi", "virtio", "sata", "ide", "nvme"]
        .iter()
        .any(|p| numbered(key, p))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_recorded_qemu_config_parses_with_pve_filled_keys_marked() {
        // shared/testdata/pve/qemu-config-103.cpx-inventory.json, abridged.
        let body = json!({"data": {
            "scsi1": "storage:vm-103-disk-3,size=30G", "sockets": 1, "memory": 8192,
            "scsihw": "virtio-scsi-pci", "net0": "virtio=ff:ff:ff:ff:ff:ff,bridge=vmbr0",
            "scsi0": "storage:vm-103-disk-0,size=10G", "name": "test-qemu-multi-nic",
            "digest": "51b7599f869b9a3f564804a0aed290f3de803292",
            "smbios1": "uuid=863b31c3-42ca-4a92-aed7-4111f342f70a", "agent": "1,type=virtio",
            "ide2": "none,media=cdrom", "vmgenid": "ddfb79b2-b484-4d66-88e7-6e76f2d1be77",
            "onboot": 1, "tablet": 0
        }});
        let live = LiveConfig::from_json(GuestType::Qemu, &body).unwrap();
        assert_eq!(live.get("memory"), Some("8192"));
        assert_eq!(
            live.digest(),
            Some("51b7599f869b9a3f564804a0aed290f3de803292")
        );
        assert!(live.entry("smbios1").unwrap().pve_filled);
        assert!(live.entry("vmgenid").unwrap().pve_filled);
        assert!(!live.entry("scsi0").unwrap().pve_filled);
        let scsi0 = live.entry("scsi0").unwrap().props.as_ref().unwrap();
        assert_eq!(scsi0.get("file"), Some("storage:vm-103-disk-0"));
        assert_eq!(scsi0.get("size"), Some("10G"));
        let net0 = live.entry("net0").unwrap().props.as_ref().unwrap();
        assert_eq!(
            net0.items()[0],
            ("virtio".into(), "ff:ff:ff:ff:ff:ff".into())
        );
        let agent = live.entry("agent").unwrap().props.as_ref().unwrap();
        assert_eq!(agent.get("enabled"), Some("1"));
        assert_eq!(agent.get("type"), Some("virtio"));
        assert!(!live.is_template());
    }

    #[test]
    fn lxc_nets_have_no_default_key_and_mount_points_name_their_volume() {
        let live = LiveConfig::from_json(
            GuestType::Lxc,
            &json!({"net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:02,type=veth",
                    "mp0": "local-lvm:vm-201-disk-1,mp=/data,size=16G",
                    "template": 1, "tags": "db;proxops", "description": null}),
        )
        .unwrap();
        let net0 = live.entry("net0").unwrap().props.as_ref().unwrap();
        assert_eq!(net0.get("name"), Some("eth0"));
        let mp0 = live.entry("mp0").unwrap().props.as_ref().unwrap();
        assert_eq!(mp0.get("volume"), Some("local-lvm:vm-201-disk-1"));
        assert!(live.is_template());
        assert_eq!(live.tags(), ["db", "proxops"]);
        assert_eq!(live.get("description"), None);
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused_but_raw_lxc_lines_are_kept() {
        assert_eq!(
            LiveConfig::from_json(GuestType::Qemu, &json!([1])),
            Err(LiveError::NotAnObject)
        );
        let live = LiveConfig::from_json(
            GuestType::Lxc,
            &json!({"lxc": [["lxc.apparmor.profile", "unconfined"]], "tags": ["a", "b"]}),
        )
        .unwrap();
        assert_eq!(
            live.get("lxc"),
            Some(r#"[["lxc.apparmor.profile","unconfined"]]"#)
        );
        assert_eq!(live.get("tags"), Some("a;b"));
    }

    #[test]
    fn a_pending_list_reads_as_the_merged_config_with_its_digest_and_current_values() {
        // The shape of qemu-server's `GET .../pending` (GuestHelpers::config_with_pending_array).
        let body = json!({"data": [
            {"key": "memory", "value": "2048", "pending": "4096"},
            {"key": "cores", "value": 2},
            {"key": "ciuser", "value": "debian", "delete": 1},
            {"key": "net1", "pending": "virtio=BC:24:11:00:00:01,bridge=vmbr1"},
            {"key": "digest", "value": "5e1f0000000000000000000000000000000000aa"}
        ]});
        let live = LiveConfig::from_pending_json(GuestType::Qemu, &body).unwrap();
        assert_eq!(live.get("memory"), Some("4096"));
        assert_eq!(live.get("cores"), Some("2"));
        assert_eq!(live.get("ciuser"), None);
        assert!(live.get("net1").is_some());
        assert_eq!(
            live.digest(),
            Some("5e1f0000000000000000000000000000000000aa")
        );
        assert_eq!(
            live.pending_keys().collect::<Vec<_>>(),
            ["ciuser", "memory", "net1"]
        );
        let current = live.current();
        assert_eq!(current.get("memory"), Some("2048"));
        assert_eq!(current.get("ciuser"), Some("debian"));
        assert_eq!(current.get("net1"), None);
        assert_eq!(current.pending_keys().count(), 0);
    }

    #[test]
    fn a_pending_body_that_is_not_a_list_of_keys_is_refused() {
        for body in [json!({"data": {"memory": 1}}), json!([{"value": "1"}])] {
            assert_eq!(
                LiveConfig::from_pending_json(GuestType::Qemu, &body),
                Err(LiveError::NotAPendingList)
            );
        }
    }

    #[test]
    fn tags_split_on_semicolons_commas_and_spaces() {
        assert_eq!(split_tags("b;A, c  d"), ["b", "a", "c", "d"]);
    }
}
