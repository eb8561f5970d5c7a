//! Property-based fuzzing of the UPID parser (issue 8, hostile input): a UPID comes from the
//! PVE API's answer, so any text must parse or be refused without panicking, a parsed UPID must
//! print back byte for byte, and every UPID PVE can write must parse into its fields.
//!
//! CI runs 1,024 cases per property; `PROPTEST_CASES=100000` runs a long campaign.

use proptest::prelude::*;
use proptest::test_runner::Config;

use crate::upid::Upid;

fn config(ci_cases: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = ci_cases;
    }
    config
}

/// The parts of a UPID as PVE writes them (pve-common `UPID.pm`).
fn parts() -> impl Strategy<Value = (String, u32, u64, u32, String, String, String)> {
    (
        "[a-zA-Z0-9]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?",
        any::<u32>(),
        0u64..=0xF_FFFF_FFFF,
        any::<u32>(),
        "[^:\\s/]{1,20}",
        "[^:\\s/]{0,20}",
        "[^:\\s/]{1,30}",
    )
}

fn write(parts: &(String, u32, u64, u32, String, String, String), upper: bool) -> String {
    let (node, pid, pstart, starttime, task_type, id, user) = parts;
    let hex = if upper {
        format!("{pid:08X}:{pstart:08X}:{starttime:08X}")
    } else {
        format!("{pid:08x}:{pstart:08x}:{starttime:08x}")
    };
    format!("UPID:{node}:{hex}:{task_type}:{id}:{user}:")
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn any_text_parses_or_is_refused_and_a_parsed_upid_prints_back_unchanged(text in ".{0,120}") {
        match text.parse::<Upid>() {
            Ok(upid) => prop_assert_eq!(upid.to_string(), text),
            Err(err) => prop_assert_eq!(err.value, text),
        }
    }

    #[test]
    fn text_shaped_like_a_upid_never_panics(
        fields in proptest::collection::vec("[0-9A-Fa-fxg:@!/ \\-]{0,12}", 0..10),
    ) {
        let text = format!("UPID:{}", fields.join(":"));
        if let Ok(upid) = text.parse::<Upid>() {
            prop_assert_eq!(upid.as_str(), text.as_str());
        }
    }

    #[test]
    fn every_upid_pve_can_write_parses_into_its_fields(parts in parts(), upper in any::<bool>()) {
        let text = write(&parts, upper);
        let upid: Upid = text.parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(upid.node(), parts.0.as_str());
        prop_assert_eq!(upid.pid(), parts.1);
        prop_assert_eq!(upid.pstart(), parts.2);
        prop_assert_eq!(upid.starttime(), parts.3);
        prop_assert_eq!(upid.task_type(), parts.4.as_str());
        prop_assert_eq!(upid.id(), parts.5.as_str());
        prop_assert_eq!(upid.user(), parts.6.as_str());
        prop_assert_eq!(upid.to_string(), text);
    }

    #[test]
    fn a_upid_with_one_byte_changed_never_panics(
        parts in parts(),
        at in any::<usize>(),
        byte in any::<char>(),
    ) {
        let mut text: Vec<char> = write(&parts, true).chars().collect();
        let at = at % text.len();
        text[at] = byte;
        let text: String = text.into_iter().collect();
        if let Ok(upid) = text.parse::<Upid>() {
            prop_assert_eq!(upid.to_string(), text);
        }
    }
}
