//! PVE property strings (`local-lvm:8,iothread=1`, `virtio,bridge=vmbr0`): split into ordered
//! key/value pairs and printed back the way PVE prints them (default key first, then the
//! remaining keys sorted).
//!
//! Only the syntax lives here. Which keys exist and what values they take is checked by
//! `schema` before a handler runs; handlers use this module to read and rewrite values
//! (fill in a MAC, replace `local-lvm:8` with the allocated volume, ...).

/// One parsed property string, in input order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PropertyString {
    items: Vec<(String, String)>,
}

impl PropertyString {
    /// Parses `value`; a part without `key=` is stored under `default_key`, or under the
    /// empty key when the format has none.
    pub(crate) fn parse(value: &str, default_key: Option<&str>) -> Self {
        let items = value
            .split(',')
            .filter(|part| !part.is_empty())
            .map(|part| match part.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (default_key.unwrap_or("").to_string(), part.to_string()),
            })
            .collect();
        Self { items }
    }

    /// The value stored under `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.items
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Sets `key`, keeping its position when it already exists.
    pub(crate) fn set(&mut self, key: &str, value: &str) {
        match self.items.iter_mut().find(|(k, _)| k == key) {
            Some(item) => item.1 = value.to_string(),
            None => self.items.push((key.to_string(), value.to_string())),
        }
    }

    /// Removes `key`, returning its value.
    pub(crate) fn remove(&mut self, key: &str) -> Option<String> {
        let pos = self.items.iter().position(|(k, _)| k == key)?;
        Some(self.items.remove(pos).1)
    }

    /// All pairs in input order.
    pub(crate) fn items(&self) -> &[(String, String)] {
        &self.items
    }

    /// Prints the value of `first` bare (or as `first=value` when `bare_first` is false)
    /// at the front, then every other key sorted, as `print_property_string` does.
    pub(crate) fn print(&self, first: Option<&str>, bare_first: bool) -> String {
        let mut parts = Vec::new();
        if let Some(first) = first
            && let Some(v) = self.get(first)
        {
            if bare_first {
                parts.push(v.to_string());
            } else {
                parts.push(format!("{first}={v}"));
            }
        }
        let mut rest: Vec<&(String, String)> = self
            .items
            .iter()
            .filter(|(k, _)| Some(k.as_str()) != first)
            .collect();
        rest.sort_by(|a, b| a.0.cmp(&b.0));
        for (k, v) in rest {
            parts.push(format!("{k}={v}"));
        }
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drive_strings_print_the_volume_first_and_the_rest_sorted() {
        let mut p = PropertyString::parse("local-lvm:8,size=8G,iothread=1", Some("file"));
        assert_eq!(p.get("file"), Some("local-lvm:8"));
        p.set("file", "local-lvm:vm-100-disk-0");
        assert_eq!(
            p.print(Some("file"), true),
            "local-lvm:vm-100-disk-0,iothread=1,size=8G"
        );
    }

    #[test]
    fn named_first_keys_keep_their_name() {
        let p = PropertyString::parse("type=veth,bridge=vmbr0,name=eth0", None);
        assert_eq!(
            p.print(Some("name"), false),
            "name=eth0,bridge=vmbr0,type=veth"
        );
    }
}
