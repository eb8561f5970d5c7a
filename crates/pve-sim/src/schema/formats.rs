//! Validators behind PVE's named `format` strings (`pve-vmid`, `pve-node`, `pve-tag`, ...).
//!
//! Each validator mirrors the Perl function registered under that name (pve-common
//! `JSONSchema.pm`, pve-storage, qemu-server, pve-container, pve-access-control; see
//! `shared/pve-api/named_formats.json`) and fails with the Perl `die` text, without its trailing
//! newline. The `-list` and `-opt` suffixes and hash (property-string) formats are handled by
//! the caller in `validate.rs`. Formats not implemented here are accepted unchecked; `UNCHECKED`
//! names the ones our endpoints use, so the gap is explicit.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use regex::Regex;

/// Named formats used by the vendored endpoints that are accepted without any check. Most are
/// hash formats whose key definitions the API dump does not carry (`pve-vm-cpu-conf`,
/// `pve-qm-hostpci`, ...); the rest need host state (`pve-priv` needs the privilege list).
/// vzdump's property strings (`fleecing`, `performance`, `prune-backups`) and its `mailto`
/// list are never sent by ProxOps (issue 19).
pub(crate) const UNCHECKED: &[&str] = &[
    "backup-fleecing",
    "backup-performance",
    "email-or-username",
    "prune-backups",
    "pve-cpuset",
    "pve-hotplug-features",
    "pve-lxc-dev-string",
    "pve-priv",
    "pve-qemu-sev-fmt",
    "pve-qemu-tdx-fmt",
    "pve-qm-bootdisk",
    "pve-qm-hostpci",
    "pve-qm-rng",
    "pve-qm-smbios1",
    "pve-qm-watchdog",
    "pve-vm-cpu-conf",
    "storage-pair",
];

/// Checks `value` against the registered format `name` (without `-list`/`-opt` suffix).
///
/// Returns `None` when the format is not implemented (the value is then accepted), otherwise
/// the validator's verdict with PVE's message.
pub(crate) fn check(name: &str, value: &str) -> Option<Result<(), String>> {
    let verdict = match name {
        // pve-common registers 'string' so that 'string-list' works; it checks nothing.
        "string" => Ok(()),
        "pve-vmid" => require_match(
            &VMID,
            value,
            "value does not look like a valid VM ID".into(),
        ),
        "pve-node" => require_match(
            &NODE,
            value,
            "value does not look like a valid node name".into(),
        ),
        "pve-storage-id" => storage_id(value),
        "pve-bridge-id" => require_match(&BRIDGE, value, format!("invalid bridge ID '{value}'")),
        "pve-configid" => require_match(
            &CONFIGID,
            value,
            format!("invalid configuration ID '{value}'"),
        ),
        "pve-tag" => require_match(&TAG, value, "invalid characters in tag".into()),
        "pve-poolid" => poolid(value),
        "pve-realm" => require_match(
            &REALM,
            value,
            "value does not look like a valid realm".into(),
        ),
        "pve-volume-id" => volume_id(value),
        "pve-volume-id-or-absolute-path" => volume_id_or_absolute_path(value),
        "pve-volume-id-or-qm-path" => {
            if value == "none" || value == "cdrom" {
                Ok(())
            } else {
                volume_id_or_absolute_path(value)
            }
        }
        "pve-storage-content" => storage_content(value),
        "disk-size" => require_match(
            &DISK_SIZE,
            value,
            format!("value does not look like a valid disk size: {value}"),
        ),
        "dns-name" => require_match(
            &DNS_NAME,
            value,
            "value does not look like a valid DNS name".into(),
        ),
        "address" => ok_if(
            is_ip(value) || DNS_NAME.is_match(value),
            format!("value does not look like a valid address: {value}"),
        ),
        "ip" => ok_if(
            is_ip(value),
            "value does not look like a valid IP address".into(),
        ),
        "ipv4" => ok_if(
            is_ipv4(value),
            "value does not look like a valid IPv4 address".into(),
        ),
        "ipv6" => ok_if(
            is_ipv6(value),
            "value does not look like a valid IPv6 address".into(),
        ),
        "CIDRv4" => ok_if(
            is_cidr_v4(value),
            "value does not look like a valid IPv4 CIDR network".into(),
        ),
        "CIDRv6" => ok_if(
            is_cidr_v6(value),
            "value does not look like a valid IPv6 CIDR network".into(),
        ),
        "CIDR" => ok_if(
            is_cidr_v4(value) || is_cidr_v6(value),
            "value does not look like a valid CIDR network".into(),
        ),
        "pve-ipv4-config" => ok_if(
            matches!(value, "dhcp" | "manual") || is_cidr_v4(value),
            "value does not look like a valid ipv4 network configuration".into(),
        ),
        "pve-ipv6-config" => ok_if(
            matches!(value, "auto" | "dhcp" | "manual") || is_cidr_v6(value),
            "value does not look like a valid ipv6 network configuration".into(),
        ),
        "mac-addr" => require_match(
            &MAC_ADDR,
            value,
            "value does not look like a valid unicast MAC address".into(),
        ),
        "urlencoded" => require_match(
            &URLENCODED,
            value,
            format!("invalid urlencoded string: {value}"),
        ),
        "pve-startup-order" => ok_if(
            is_startup_order(value),
            "unable to parse startup options".into(),
        ),
        "pve-task-status-type" => {
            require_match(&TASK_STATUS, value, format!("invalid status '{value}'"))
        }
        "pve-iface" => require_match(
            &IFACE,
            value,
            format!("invalid network interface name '{value}'"),
        ),
        "pve-lxc-mp-string" => ok_if(
            !MP_ILLEGAL.is_match(value),
            format!("{value} contains illegal character sequences"),
        ),
        "pve-ct-timezone" => timezone(value),
        "lxc-ip-with-ll-iface" => ip_with_ll_iface(value),
        "pve-qm-bootdev" => ok_if(is_bootdev(value), format!("invalid boot device '{value}'")),
        _ => return None,
    };
    Some(verdict)
}

/// Splits a `-list` value the way PVE's `split_list` does: on NUL if there is one, otherwise
/// on `,`, `;` and whitespace, dropping empty elements.
pub(crate) fn split_list(value: &str) -> Vec<&str> {
    if value.contains('\0') {
        // Perl's split drops trailing empty fields but keeps leading ones.
        let mut parts: Vec<&str> = value.split('\0').collect();
        while parts.last().is_some_and(|p| p.is_empty()) {
            parts.pop();
        }
        return parts;
    }
    value
        .split(|c: char| c == ',' || c == ';' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .collect()
}

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).expect("built-in format regexes are valid")
}

static VMID: LazyLock<Regex> = LazyLock::new(|| re(r"^[1-9][0-9]{2,8}$"));
static NODE: LazyLock<Regex> = LazyLock::new(|| re(r"^([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$"));
static STORAGE_ID: LazyLock<Regex> = LazyLock::new(|| re(r"(?i)^[a-z][a-z0-9\-_.]*[a-z0-9]$"));
static BRIDGE: LazyLock<Regex> = LazyLock::new(|| re(r"^[-_.\w\d]+$"));
static CONFIGID: LazyLock<Regex> = LazyLock::new(|| re(r"(?i)^[a-z][a-z0-9_-]+$"));
static TAG: LazyLock<Regex> = LazyLock::new(|| re(r"(?i)^[a-z0-9_][a-z0-9_\-+.]*$"));
static POOLID: LazyLock<Regex> =
    LazyLock::new(|| re(r"^[A-Za-z0-9.\-_]+(?:/[A-Za-z0-9.\-_]+){0,2}$"));
static REALM: LazyLock<Regex> = LazyLock::new(|| re(r"^[A-Za-z][A-Za-z0-9.\-_]+$"));
static VOLUME_ID: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)^([a-z][a-z0-9\-_.]*[a-z0-9]):(.+)$"));
static DISK_SIZE: LazyLock<Regex> = LazyLock::new(|| re(r"^(\d+(\.\d+)?)([KMGT](?:iB)?)?$"));
static DNS_NAME: LazyLock<Regex> = LazyLock::new(|| {
    re(r"^(([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)\.)*([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$")
});
static MAC_ADDR: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)^[a-f0-9][02468ace](?::[a-f0-9]{2}){5}$"));
static URLENCODED: LazyLock<Regex> = LazyLock::new(|| re(r"^[-%a-zA-Z0-9_.!~*'()]*$"));
static TASK_STATUS: LazyLock<Regex> = LazyLock::new(|| re(r"(?i)^(ok|error|warning|unknown)$"));
static IFACE: LazyLock<Regex> = LazyLock::new(|| re(r"(?i)^[a-z][a-z0-9_]{1,20}([:.]\d+)?$"));
/// `/./` or `/../` anywhere, `/.` or `/..` at the end, `../` at the start.
static MP_ILLEGAL: LazyLock<Regex> = LazyLock::new(|| re(r"/\.\.?/|/\.\.?$|^\.\./"));
/// Syntactic stand-in for a lookup in the host's `zone.tab` (`Area/Location[/Sub]`).
static TIMEZONE: LazyLock<Regex> =
    LazyLock::new(|| re(r"^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+)+$"));

fn require_match(regex: &Regex, value: &str, message: String) -> Result<(), String> {
    ok_if(regex.is_match(value), message)
}

fn ok_if(ok: bool, message: String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(message) }
}

fn storage_id(value: &str) -> Result<(), String> {
    if value.chars().count() < 2 {
        return Err(format!(
            "storage ID '{value}' cannot be shorter than 2 characters"
        ));
    }
    require_match(
        &STORAGE_ID,
        value,
        format!("storage ID '{value}' contains illegal characters"),
    )
}

fn poolid(value: &str) -> Result<(), String> {
    // Perl's split("/") drops trailing empty fields before counting levels.
    let mut levels: Vec<&str> = value.split('/').collect();
    while levels.last().is_some_and(|l| l.is_empty()) {
        levels.pop();
    }
    if levels.len() > 3 {
        return Err(format!(
            "pool name '{value}' nested too deeply (max levels = 3)"
        ));
    }
    require_match(
        &POOLID,
        value,
        format!("pool name '{value}' contains invalid characters"),
    )
}

fn volume_id(value: &str) -> Result<(), String> {
    require_match(
        &VOLUME_ID,
        value,
        format!("unable to parse volume ID '{value}'"),
    )
}

fn volume_id_or_absolute_path(value: &str) -> Result<(), String> {
    if value.starts_with('/') {
        Ok(())
    } else {
        volume_id(value)
    }
}

fn storage_content(value: &str) -> Result<(), String> {
    const CONTENT: [&str; 7] = [
        "images", "rootdir", "vztmpl", "iso", "backup", "snippets", "import",
    ];
    ok_if(
        CONTENT.contains(&value),
        format!("invalid content type '{value}'"),
    )
}

// Rust's address parsers reject leading zeros in IPv4 octets, as PVE's $IPV4RE does.
fn is_ipv4(value: &str) -> bool {
    value.parse::<Ipv4Addr>().is_ok()
}

fn is_ipv6(value: &str) -> bool {
    value.parse::<Ipv6Addr>().is_ok()
}

fn is_ip(value: &str) -> bool {
    is_ipv4(value) || is_ipv6(value)
}

fn cidr_parts(value: &str) -> Option<(&str, u32)> {
    let (address, prefix) = value.split_once('/')?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((address, prefix.parse().ok()?))
}

fn is_cidr_v4(value: &str) -> bool {
    cidr_parts(value).is_some_and(|(a, p)| is_ipv4(a) && (8..=32).contains(&p))
}

fn is_cidr_v6(value: &str) -> bool {
    cidr_parts(value).is_some_and(|(a, p)| is_ipv6(a) && (8..=128).contains(&p))
}

/// pve-common `pve_parse_startup_order`: `[order=]N`, `up=N`, `down=N`, comma-separated.
fn is_startup_order(value: &str) -> bool {
    static PART: LazyLock<Regex> = LazyLock::new(|| re(r"^(?:(?:order=)?\d+|up=\d+|down=\d+)$"));
    // Perl: `return undef if !$value`, so "" and "0" are rejected.
    if value.is_empty() || value == "0" {
        return false;
    }
    value
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .all(|p| PART.is_match(p))
}

/// pve-container `verify_ct_timezone`: `host`, `UTC` or a zone from the host's zone.tab. The
/// simulator has no zone.tab, so any `Area/Location` spelling is accepted.
fn timezone(value: &str) -> Result<(), String> {
    ok_if(
        value == "host" || value == "UTC" || TIMEZONE.is_match(value),
        format!("invalid time zone '{value}'"),
    )
}

/// pve-container `verify_ip_with_ll_iface`: an IP, or a link-local `fe80:...%<iface>`.
fn ip_with_ll_iface(value: &str) -> Result<(), String> {
    static LL: LazyLock<Regex> = LazyLock::new(|| re(r"(?i)^(fe80:[^%]+)%(.*)$"));
    if let Some(caps) = LL.captures(value) {
        let (address, iface) = (&caps[1], &caps[2]);
        if is_ip(address) && IFACE.is_match(iface) {
            return Ok(());
        }
    }
    ok_if(
        is_ip(value),
        "value does not look like a valid IP address".into(),
    )
}

/// qemu-server `verify_bootdev`: a disk drive (not efidisk/tpmstate), or an existing
/// `netN`, `usbN` or `hostpciN` option.
fn is_bootdev(value: &str) -> bool {
    const DEVICES: [(&str, u32); 7] = [
        ("ide", 3),
        ("sata", 5),
        ("scsi", 30),
        ("virtio", 15),
        ("net", 31),
        ("usb", 13),
        ("hostpci", 15),
    ];
    let base = value.trim_end_matches(|c: char| c.is_ascii_digit());
    let digits = &value[base.len()..];
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return false;
    }
    let Ok(index) = digits.parse::<u32>() else {
        return false;
    };
    DEVICES
        .iter()
        .any(|(name, max)| *name == base && index <= *max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmid_format_rejects_two_digit_ids_with_pves_message() {
        assert_eq!(
            check("pve-vmid", "99"),
            Some(Err("value does not look like a valid VM ID".into()))
        );
        assert_eq!(check("pve-vmid", "100"), Some(Ok(())));
    }

    #[test]
    fn node_names_allow_hyphens_but_not_dots() {
        assert_eq!(check("pve-node", "pve-1"), Some(Ok(())));
        assert!(matches!(check("pve-node", "pve.example"), Some(Err(_))));
    }

    #[test]
    fn storage_ids_report_length_before_characters() {
        assert_eq!(
            check("pve-storage-id", "a"),
            Some(Err(
                "storage ID 'a' cannot be shorter than 2 characters".into()
            ))
        );
        assert_eq!(
            check("pve-storage-id", "local_"),
            Some(Err("storage ID 'local_' contains illegal characters".into()))
        );
        assert_eq!(check("pve-storage-id", "local-lvm"), Some(Ok(())));
    }

    #[test]
    fn volume_formats_accept_paths_and_qm_keywords_where_pve_does() {
        assert_eq!(check("pve-volume-id", "local:iso/x.iso"), Some(Ok(())));
        assert_eq!(
            check("pve-volume-id", "nocolon"),
            Some(Err("unable to parse volume ID 'nocolon'".into()))
        );
        assert_eq!(
            check("pve-volume-id-or-absolute-path", "/dev/sdb"),
            Some(Ok(()))
        );
        assert_eq!(check("pve-volume-id-or-qm-path", "cdrom"), Some(Ok(())));
        assert_eq!(
            check("pve-volume-id-or-qm-path", "local-lvm:32"),
            Some(Ok(()))
        );
    }

    #[test]
    fn ip_configs_need_a_prefix_of_at_least_eight() {
        assert_eq!(check("pve-ipv4-config", "10.0.0.5/24"), Some(Ok(())));
        assert_eq!(check("pve-ipv4-config", "dhcp"), Some(Ok(())));
        assert!(matches!(
            check("pve-ipv4-config", "10.0.0.5/4"),
            Some(Err(_))
        ));
        assert!(matches!(
            check("pve-ipv4-config", "10.0.0.05/24"),
            Some(Err(_))
        ));
        assert_eq!(check("pve-ipv6-config", "fd00::5/64"), Some(Ok(())));
        assert_eq!(check("pve-ipv6-config", "auto"), Some(Ok(())));
    }

    #[test]
    fn mac_addresses_must_be_unicast() {
        assert_eq!(check("mac-addr", "BC:24:11:00:00:01"), Some(Ok(())));
        assert_eq!(
            check("mac-addr", "01:24:11:00:00:01"),
            Some(Err(
                "value does not look like a valid unicast MAC address".into()
            ))
        );
    }

    #[test]
    fn pool_names_nest_at_most_three_levels() {
        assert_eq!(check("pve-poolid", "a/b/c"), Some(Ok(())));
        assert_eq!(
            check("pve-poolid", "a/b/c/d"),
            Some(Err(
                "pool name 'a/b/c/d' nested too deeply (max levels = 3)".into()
            ))
        );
        assert_eq!(
            check("pve-poolid", "a b"),
            Some(Err("pool name 'a b' contains invalid characters".into()))
        );
    }

    #[test]
    fn boot_devices_are_drives_nets_usbs_or_hostpcis() {
        assert!(is_bootdev("scsi0"));
        assert!(is_bootdev("net31"));
        assert!(!is_bootdev("scsi31"));
        assert!(!is_bootdev("efidisk0"));
        assert!(!is_bootdev("net01"));
    }

    #[test]
    fn lists_split_on_commas_semicolons_spaces_or_nul() {
        assert_eq!(split_list("a;b, c"), vec!["a", "b", "c"]);
        assert_eq!(split_list("a,b\0c"), vec!["a,b", "c"]);
        assert!(split_list("").is_empty());
    }

    #[test]
    fn unimplemented_formats_are_unchecked() {
        for name in UNCHECKED {
            assert_eq!(check(name, "anything"), None, "{name}");
        }
    }

    #[test]
    fn startup_order_accepts_order_up_and_down() {
        assert_eq!(
            check("pve-startup-order", "order=1,up=30,down=60"),
            Some(Ok(()))
        );
        assert_eq!(check("pve-startup-order", "2"), Some(Ok(())));
        assert_eq!(
            check("pve-startup-order", "first"),
            Some(Err("unable to parse startup options".into()))
        );
    }
}
