//! Property-based fuzzing of the simulator's property-string parser and schema validator
//! (issue 8, hostile input): the simulator reads whatever a client sends, so any value of any
//! property-string parameter, and any path, must be parsed or refused with PVE's message,
//! never a panic.
//!
//! CI runs 512 cases per property; `PROPTEST_CASES=100000` runs a long campaign.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::Config;

use super::property_string::parse;
use super::{Schema, SchemaError};

fn config(ci_cases: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = ci_cases;
    }
    config
}

/// Property-string parameters of guest creation, by endpoint template.
const PARAMS: &[(&str, &str)] = &[
    ("/nodes/{node}/qemu", "net0"),
    ("/nodes/{node}/qemu", "scsi0"),
    ("/nodes/{node}/qemu", "virtio1"),
    ("/nodes/{node}/qemu", "ide2"),
    ("/nodes/{node}/qemu", "sata0"),
    ("/nodes/{node}/qemu", "efidisk0"),
    ("/nodes/{node}/qemu", "tpmstate0"),
    ("/nodes/{node}/qemu", "agent"),
    ("/nodes/{node}/qemu", "ipconfig0"),
    ("/nodes/{node}/qemu", "boot"),
    ("/nodes/{node}/qemu", "vga"),
    ("/nodes/{node}/qemu", "rng0"),
    ("/nodes/{node}/qemu", "smbios1"),
    ("/nodes/{node}/qemu", "hostpci0"),
    ("/nodes/{node}/lxc", "net0"),
    ("/nodes/{node}/lxc", "rootfs"),
    ("/nodes/{node}/lxc", "mp0"),
    ("/nodes/{node}/lxc", "features"),
];

/// Values shaped like property strings (keys, `=`, `,`, volumes, MACs, booleans), or any text.
const SHAPED: &str = "(([a-z0-9]{0,8}=)?[a-zA-Z0-9:./_-]{0,16},?){0,6}|.{0,80}";

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn splitting_any_text_gives_unique_non_empty_keys_or_pves_message(
        value in SHAPED,
        default_key in proptest::option::of("[a-z]{1,6}"),
    ) {
        match parse(&value, default_key.as_deref()) {
            Ok(pairs) => {
                for (i, (key, val)) in pairs.iter().enumerate() {
                    prop_assert!(!key.is_empty() && !val.contains(','), "{key:?}={val:?}");
                    prop_assert!(pairs[..i].iter().all(|(k, _)| k != key), "duplicate {key}");
                }
            }
            Err(message) => prop_assert!(
                message.contains("comma-separated list property")
                    || message.contains("does not define a default key"),
                "{message}"
            ),
        }
    }

    #[test]
    fn any_value_of_a_property_string_parameter_is_parsed_or_refused(
        param in 0..PARAMS.len(),
        value in SHAPED,
    ) {
        let (template, name) = PARAMS[param];
        let schema = Schema::vendored();
        // `None` for the formats whose definitions the API dump lacks (`pve-qm-rng`,
        // `pve-qm-smbios1`, `pve-qm-hostpci`): the validator still reads the value below.
        let parsed = schema.parse_property_string("POST", template, name, &value);
        let unvendored = ["rng0", "smbios1", "hostpci0"].contains(&name);
        prop_assert!(parsed.is_some() || unvendored, "{name} of POST {template}");
        let path = template.replace("{node}", "pve1");
        let params = BTreeMap::from([
            ("vmid".to_owned(), "100".to_owned()),
            (name.to_owned(), value),
        ]);
        match schema.check("POST", &path, &params) {
            Ok(_) => {}
            Err(SchemaError::Invalid(errors)) => prop_assert!(!errors.is_empty()),
            Err(SchemaError::NotImplemented) => prop_assert!(false, "POST {path} exists"),
        }
    }

    #[test]
    fn any_path_and_method_is_routed_or_not_implemented(
        method in "GET|POST|PUT|DELETE|PATCH|[A-Z]{0,6}",
        path in "(/[a-z0-9{}%.]{0,10}){0,7}|.{0,40}",
        params in proptest::collection::btree_map("[a-z0-9-]{1,10}", ".{0,20}", 0..4),
    ) {
        let schema = Schema::vendored();
        match schema.check(&method, &path, &params) {
            Ok(_) | Err(SchemaError::NotImplemented) => {}
            Err(SchemaError::Invalid(errors)) => prop_assert!(!errors.is_empty()),
        }
    }
}
