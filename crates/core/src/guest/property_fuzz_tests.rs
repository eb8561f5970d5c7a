//! Property-based fuzzing of the PVE property-string reader (issue 8, hostile input): guest
//! configs come from the PVE API, so any value must split without panicking, joining must be a
//! fixed point of splitting, and the value encodings must round-trip.
//!
//! CI runs 1,024 cases per property; `PROPTEST_CASES=100000` runs a long campaign.

use proptest::prelude::*;
use proptest::test_runner::Config;

use super::property::{
    PropertyString, format_pve_size, parse_bool, parse_pve_size, percent_decode, percent_encode,
};

fn config(ci_cases: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = ci_cases;
    }
    config
}

/// Text made mostly of the characters that matter to property strings.
const SHAPED: &str = "[a-z0-9=,:%. \\t-]{0,80}|.{0,80}";

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn a_property_string_pve_accepts_reads_back_the_same_pairs_after_joining(
        value in SHAPED,
        default_key in proptest::option::of("[a-z]{1,6}"),
    ) {
        let key = default_key.as_deref();
        let parsed = PropertyString::parse(&value, key);
        let _ = parsed.to_value(key);
        // Keep what PVE's own parser accepts: non-empty keys and values, each key once (PVE
        // answers "missing key" or "duplicate key" otherwise, so it never reports such text).
        let mut valid = PropertyString::default();
        for (k, v) in parsed.items() {
            prop_assert!(!k.contains(',') && !v.contains(','), "{k:?}={v:?}");
            if !k.is_empty() && !v.is_empty() && valid.get(k).is_none() {
                valid.set(k, v);
            }
        }
        let joined = valid.to_value(key);
        let reparsed = PropertyString::parse(&joined, key);
        let sorted = |p: &PropertyString| {
            let mut items = p.items().to_vec();
            items.sort();
            items
        };
        prop_assert_eq!(sorted(&reparsed), sorted(&valid), "joined as {:?}", joined);
        prop_assert_eq!(reparsed.to_value(key), joined);
    }

    #[test]
    fn setting_and_removing_a_key_never_panics_and_is_seen_by_get(
        value in SHAPED,
        key in "[a-z]{1,6}",
        new in "[a-zA-Z0-9:.-]{0,20}",
    ) {
        let mut parsed = PropertyString::parse(&value, Some("file"));
        parsed.set(&key, &new);
        prop_assert_eq!(parsed.get(&key), Some(new.as_str()));
        prop_assert_eq!(parsed.remove(&key), Some(new));
    }

    #[test]
    fn percent_encoding_round_trips_any_text(text in ".{0,200}") {
        let encoded = percent_encode(&text);
        prop_assert!(encoded.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)));
        prop_assert_eq!(percent_decode(&encoded), text);
    }

    #[test]
    fn percent_decoding_changes_only_percent_and_two_hex_digits(
        text in "[%0-9a-fA-F+g-z-]{0,60}|.{0,60}",
    ) {
        let decoded = percent_decode(&text);
        let has_escape = text
            .as_bytes()
            .windows(3)
            .any(|w| w[0] == b'%' && w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit());
        if !has_escape {
            prop_assert_eq!(decoded, text);
        }
    }

    #[test]
    fn sizes_pve_prints_read_back_and_any_size_text_never_panics(
        bytes in any::<u64>(),
        text in "[0-9.eE+-]{0,25}[KMGTPkmgtpx]?|.{0,30}",
    ) {
        prop_assert_eq!(parse_pve_size(&format_pve_size(bytes)), Some(bytes));
        let _ = parse_pve_size(&text);
        let _ = parse_bool(&text);
    }
}
