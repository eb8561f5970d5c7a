//! PVE property strings (`local-lvm:vm-101-disk-0,iothread=1,size=32G`,
//! `virtio=BC:24:11:00:00:01,bridge=vmbr0`): split into ordered key/value pairs and joined
//! back, plus the value encodings PVE uses inside guest configs (percent-encoded `sshkeys`,
//! binary size suffixes, `0`/`1` booleans).
//!
//! Syntax only: which keys a value may hold is the renderer's and comparer's business.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// One property string, its parts in the order written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PropertyString {
    items: Vec<(String, String)>,
}

impl PropertyString {
    /// Splits `value` on commas; a part without `=` is stored under `default_key`
    /// (or under the empty key when there is none).
    pub fn parse(value: &str, default_key: Option<&str>) -> Self {
        let items = value
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .map(|part| match part.split_once('=') {
                Some((k, v)) => (k.trim().to_owned(), v.trim().to_owned()),
                None => (default_key.unwrap_or("").to_owned(), part.to_owned()),
            })
            .collect();
        Self { items }
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.items
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Sets `key`, keeping its position when present, appending it otherwise.
    pub fn set(&mut self, key: &str, value: &str) {
        match self.items.iter_mut().find(|(k, _)| k == key) {
            Some(item) => value.clone_into(&mut item.1),
            None => self.items.push((key.to_owned(), value.to_owned())),
        }
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        let at = self.items.iter().position(|(k, _)| k == key)?;
        Some(self.items.remove(at).1)
    }

    /// Every pair, in order.
    pub fn items(&self) -> &[(String, String)] {
        &self.items
    }

    /// Joins the pairs back; the value of `bare_key` is written first and without `key=`
    /// (unless it holds a `=`, which would read back as a key), the other pairs in order.
    pub fn to_value(&self, bare_key: Option<&str>) -> String {
        let is_bare = |k: &str, v: &str| k.is_empty() || (Some(k) == bare_key && !v.contains('='));
        let bare = self
            .items
            .iter()
            .filter(|(k, v)| is_bare(k, v))
            .map(|(_, v)| v.clone());
        let rest = self
            .items
            .iter()
            .filter(|(k, v)| !is_bare(k, v))
            .map(|(k, v)| format!("{k}={v}"));
        bare.chain(rest).collect::<Vec<_>>().join(",")
    }
}

/// What [`percent_encode`] escapes: every byte outside RFC 3986's unreserved set
/// (`A-Za-z0-9-._~`).
const SSHKEYS_ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes every byte outside RFC 3986's unreserved set (`A-Za-z0-9-._~`) as
/// uppercase `%XX`, as PVE's `sshkeys` requires (spaces `%20`, newlines `%0A`).
pub fn percent_encode(text: &str) -> String {
    utf8_percent_encode(text, SSHKEYS_ESCAPED).to_string()
}

/// Decodes `%XX` sequences (either case); anything else, `+` included, stays as written,
/// since PVE's decoder does not read `+` as a space. A `%` not followed by two hex digits
/// (`%zz`, `%+1`) stays too; bytes that are not UTF-8 become U+FFFD.
pub fn percent_decode(text: &str) -> String {
    percent_decode_str(text).decode_utf8_lossy().into_owned()
}

/// Reads a size as PVE reports it on volumes (`32G`, `512M`, `4K`, `1T`, bare bytes); the
/// suffixes are binary.
pub fn parse_pve_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (number, shift) = match text.char_indices().last()? {
        (at, 'K' | 'k') => (&text[..at], 10),
        (at, 'M' | 'm') => (&text[..at], 20),
        (at, 'G' | 'g') => (&text[..at], 30),
        (at, 'T' | 't') => (&text[..at], 40),
        (at, 'P' | 'p') => (&text[..at], 50),
        _ => (text, 0),
    };
    if let Ok(n) = number.parse::<u64>() {
        return n.checked_mul(1u64 << shift);
    }
    // PVE prints whole units, but a fractional report is read rather than refused.
    let n = number
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite() && *n >= 0.0)?;
    let bytes = (n * (1u64 << shift) as f64) as u64;
    Some(bytes)
}

/// Prints bytes in the largest binary unit that divides them, as PVE prints `size=`.
pub fn format_pve_size(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "T"), (30, "G"), (20, "M"), (10, "K")];
    for (shift, unit) in UNITS {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// A PVE boolean (`1`/`0`, and the spellings PVE's parser also takes) as a bool.
pub fn parse_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "yes" | "true" => Some(true),
        "0" | "off" | "no" | "false" => Some(false),
        _ => None,
    }
}

/// A bool as PVE takes it: `1` or `0`.
pub(crate) fn bool_value(b: bool) -> &'static str {
    if b { "1" } else { "0" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drive_string_splits_into_the_volume_and_its_options_in_order() {
        let p = PropertyString::parse("local-lvm:vm-101-disk-0,iothread=1,size=32G", Some("file"));
        assert_eq!(p.get("file"), Some("local-lvm:vm-101-disk-0"));
        assert_eq!(p.get("size"), Some("32G"));
        assert_eq!(
            p.to_value(Some("file")),
            "local-lvm:vm-101-disk-0,iothread=1,size=32G"
        );
    }

    #[test]
    fn a_default_key_value_holding_an_equals_sign_is_written_with_its_key() {
        let p = PropertyString::parse("file=local:iso/a=b.iso,media=cdrom", Some("file"));
        assert_eq!(p.get("file"), Some("local:iso/a=b.iso"));
        let joined = p.to_value(Some("file"));
        assert_eq!(joined, "file=local:iso/a=b.iso,media=cdrom");
        assert_eq!(PropertyString::parse(&joined, Some("file")), p);
    }

    #[test]
    fn percent_encoding_keeps_only_unreserved_bytes_and_round_trips() {
        let key = "ssh-ed25519 AAAA+/= user@host\nssh-rsa B~._-";
        let encoded = percent_encode(key);
        assert_eq!(
            encoded,
            "ssh-ed25519%20AAAA%2B%2F%3D%20user%40host%0Assh-rsa%20B~._-"
        );
        assert_eq!(percent_decode(&encoded), key);
        assert_eq!(percent_decode("a%2bb+c%zz"), "a+b+c%zz");
        // A sign is not a hex digit (7402441: the hand-written decoder once read `%+1` as 0x01).
        assert_eq!(percent_decode("%+1%-f"), "%+1%-f");
    }

    #[test]
    fn pve_sizes_use_binary_suffixes() {
        assert_eq!(parse_pve_size("32G"), Some(32 << 30));
        assert_eq!(parse_pve_size("512M"), Some(512 << 20));
        assert_eq!(parse_pve_size("4K"), Some(4096));
        assert_eq!(parse_pve_size("1000"), Some(1000));
        assert_eq!(parse_pve_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_pve_size("x"), None);
        assert_eq!(format_pve_size(8 << 30), "8G");
        assert_eq!(format_pve_size(512 << 20), "512M");
        assert_eq!(format_pve_size(1000), "1000");
    }
}
