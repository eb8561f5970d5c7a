//! Property-based fuzzing of the manifest loader (issue 8, hostile input): arbitrary bytes,
//! YAML-shaped noise and structure-aware mutations of the example manifests go through
//! `parse_file` and `repository::load`. Nothing may panic, every diagnostic must name the file
//! and a line, and the same input must give the same output.
//!
//! CI runs a few hundred cases per property; `PROPTEST_CASES=100000` runs a long campaign
//! (see RELIABILITY.md, "Hostile input").

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::Config;

use super::yaml::{MAX_NODES, MAX_TEXT_BYTES};
use super::{MAX_FILE_BYTES, parse_file};
use crate::repository;

/// The example repository (composition mode), as the seeds of the mutations.
const EXAMPLES: [(&str, &str); 9] = [
    (
        "clusters/homelab/resources.yaml",
        include_str!("../../../../examples/clusters/homelab/resources.yaml"),
    ),
    (
        "ctt/base/debian-12-standard.yaml",
        include_str!("../../../../examples/ctt/base/debian-12-standard.yaml"),
    ),
    (
        "diskimage/base/debian-12-genericcloud.yaml",
        include_str!("../../../../examples/diskimage/base/debian-12-genericcloud.yaml"),
    ),
    (
        "iso/base/debian-netinst.yaml",
        include_str!("../../../../examples/iso/base/debian-netinst.yaml"),
    ),
    (
        "lxc/homelab/dns-1.yaml",
        include_str!("../../../../examples/lxc/homelab/dns-1.yaml"),
    ),
    (
        "templatevm/homelab/debian-12-template.yaml",
        include_str!("../../../../examples/templatevm/homelab/debian-12-template.yaml"),
    ),
    (
        "vm/homelab/app-1.yaml",
        include_str!("../../../../examples/vm/homelab/app-1.yaml"),
    ),
    (
        "vm/homelab/installer.yaml",
        include_str!("../../../../examples/vm/homelab/installer.yaml"),
    ),
    (
        "vm/homelab/web-1.yaml",
        include_str!("../../../../examples/vm/homelab/web-1.yaml"),
    ),
];

/// Fragments that stress the YAML parser and the decoder: indicators, anchors and aliases,
/// tags, directives, odd numbers and control characters.
const FRAGMENTS: &[&str] = &[
    ":",
    ": ",
    "- ",
    "-",
    "? ",
    ",",
    "[",
    "]",
    "{",
    "}",
    "&a ",
    "*a",
    "&b [*a, *a]",
    "<<: *a",
    "!!str ",
    "!!int ",
    "!custom ",
    "!!binary ",
    "---\n",
    "...\n",
    "%YAML 1.2\n",
    "%TAG ! x\n",
    "|",
    "|-\n  ",
    ">",
    "\"",
    "'",
    "\\",
    "#",
    "\t",
    "\r",
    "\n",
    "\n  ",
    "\n    - ",
    "\u{0}",
    "\u{feff}",
    "\u{85}",
    "\u{2028}",
    "é",
    "🦀",
    "~",
    "null",
    "true",
    "on",
    "0x1F",
    "0o17",
    "1e400",
    "-0",
    ".inf",
    ".nan",
    "99999999999999999999999",
    "-1",
    "18446744073709551616",
    "4294967296",
    "0755",
    "32G",
    "32 GiB",
    "1.5",
    "vmid: ",
    "name: ",
    "spec: ",
    "kind: VM",
    "kind: LXC",
    "apiVersion: proxops/v1alpha1",
    "metadata: {}",
    "spec: []",
    "proxops/depends-on: ",
    "VM/web-1",
    "../../",
    "/etc/passwd",
    "resources: ",
    "pve1",
    "local-lvm:32",
];

/// One edit of a manifest's text.
#[derive(Debug, Clone)]
enum Mutation {
    /// Insert a fragment at a (relative) position.
    Insert(usize, usize),
    /// Delete up to `len` bytes at a position.
    Delete(usize, usize),
    /// Duplicate a line.
    DuplicateLine(usize),
    /// Swap two lines.
    SwapLines(usize, usize),
    /// Change a line's indentation.
    Reindent(usize, usize),
    /// Replace the value after a line's first `: ` with arbitrary text.
    ReplaceValue(usize, String),
    /// Truncate the text at a position.
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0..FRAGMENTS.len()).prop_map(|(at, f)| Mutation::Insert(at, f)),
        (any::<usize>(), 1usize..40).prop_map(|(at, len)| Mutation::Delete(at, len)),
        any::<usize>().prop_map(Mutation::DuplicateLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        (any::<usize>(), 0usize..12).prop_map(|(l, n)| Mutation::Reindent(l, n)),
        (any::<usize>(), ".{0,40}").prop_map(|(l, v)| Mutation::ReplaceValue(l, v)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

/// The nearest char boundary at or before `at % (len + 1)`.
fn boundary(text: &str, at: usize) -> usize {
    let mut at = at % (text.len() + 1);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn apply(text: &str, mutation: &Mutation) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let line = |i: usize, lines: &Vec<String>| i % lines.len().max(1);
    match mutation {
        Mutation::Insert(at, fragment) => {
            let at = boundary(text, *at);
            format!("{}{}{}", &text[..at], FRAGMENTS[*fragment], &text[at..])
        }
        Mutation::Delete(at, len) => {
            let start = boundary(text, *at);
            let end = boundary(text, start.saturating_add(*len).min(text.len()));
            format!("{}{}", &text[..start], &text[end.max(start)..])
        }
        Mutation::Truncate(at) => text[..boundary(text, *at)].to_owned(),
        _ if lines.is_empty() => text.to_owned(),
        Mutation::DuplicateLine(i) => {
            let i = line(*i, &lines);
            let copy = lines[i].clone();
            lines.insert(i, copy);
            lines.join("\n")
        }
        Mutation::SwapLines(a, b) => {
            let (a, b) = (line(*a, &lines), line(*b, &lines));
            lines.swap(a, b);
            lines.join("\n")
        }
        Mutation::Reindent(i, n) => {
            let i = line(*i, &lines);
            lines[i] = format!("{}{}", " ".repeat(*n), lines[i].trim_start());
            lines.join("\n")
        }
        Mutation::ReplaceValue(i, value) => {
            let i = line(*i, &lines);
            if let Some((key, _)) = lines[i].split_once(": ") {
                lines[i] = format!("{key}: {value}");
            }
            lines.join("\n")
        }
    }
}

/// The case count for CI unless `PROPTEST_CASES` asks for a long run.
fn config(ci_cases: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = ci_cases;
    }
    config
}

/// Parses `contents` and checks what must hold for any input.
fn check_file(path: &str, contents: &str) {
    let first = parse_file(path, contents);
    for diagnostic in &first.diagnostics {
        assert_eq!(diagnostic.path, path, "{diagnostic}");
        assert!(diagnostic.line >= 1, "no line: {diagnostic}");
        assert!(!diagnostic.message.is_empty(), "no message: {diagnostic:?}");
    }
    for resource in &first.resources {
        assert_eq!(resource.path, path);
    }
    let again = parse_file(path, contents);
    assert_eq!(first.diagnostics, again.diagnostics, "not deterministic");
    assert_eq!(first.resources, again.resources, "not deterministic");
}

/// Loads a repository and checks what must hold for any input.
fn check_repository(files: &BTreeMap<String, String>) {
    let loaded = repository::load(files);
    for diagnostic in &loaded.diagnostics {
        assert!(!diagnostic.path.is_empty(), "no file: {diagnostic}");
        assert!(!diagnostic.message.is_empty(), "no message: {diagnostic:?}");
    }
    let again = repository::load(files);
    assert_eq!(loaded.diagnostics, again.diagnostics, "not deterministic");
    assert_eq!(loaded.states.len(), again.states.len(), "not deterministic");
}

fn examples() -> BTreeMap<String, String> {
    EXAMPLES
        .iter()
        .map(|(path, text)| ((*path).to_owned(), (*text).to_owned()))
        .collect()
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn parse_file_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        check_file("fuzz.yaml", &String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn parse_file_never_panics_on_yaml_shaped_noise(
        parts in proptest::collection::vec(0..FRAGMENTS.len(), 0..200),
    ) {
        let text: String = parts.iter().map(|&i| FRAGMENTS[i]).collect();
        check_file("fuzz.yaml", &text);
    }

    #[test]
    fn mutated_example_manifests_never_panic_and_parse_deterministically(
        seed in 0..EXAMPLES.len(),
        mutations in proptest::collection::vec(mutation(), 1..8),
    ) {
        let (path, text) = EXAMPLES[seed];
        let mutated = mutations.iter().fold(text.to_owned(), |t, m| apply(&t, m));
        check_file(path, &mutated);
    }
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn a_repository_with_a_mutated_file_loads_without_panicking(
        seed in 0..EXAMPLES.len(),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let mut files = examples();
        let (path, text) = EXAMPLES[seed];
        let mutated = mutations.iter().fold(text.to_owned(), |t, m| apply(&t, m));
        files.insert(path.to_owned(), mutated);
        check_repository(&files);
    }

    #[test]
    fn repositories_of_arbitrary_layout_load_without_panicking(
        layout in proptest::collection::btree_map(
            "(clusters/[a-z.]{0,4}/|\\.\\./|[a-z]{1,3}/|/){0,4}[a-z.]{0,6}\\.ya?ml",
            prop_oneof![
                (0..EXAMPLES.len()).prop_map(|i| EXAMPLES[i].1.to_owned()),
                proptest::collection::vec(
                    "(\\.\\./){0,5}[a-z/.]{0,12}(\\.yaml)?", 0..6,
                ).prop_map(|list| format!(
                    "resources:\n{}",
                    list.iter().map(|p| format!("  - {p}\n")).collect::<String>()
                )),
                ".{0,200}",
            ],
            0..12,
        ),
    ) {
        let mut files = examples();
        files.extend(layout);
        check_repository(&files);
        check_repository(&files.into_iter().filter(|(p, _)| !p.starts_with("clusters/")).collect());
    }
}

#[test]
fn a_scalar_repeated_through_aliases_is_refused_within_the_text_budget() {
    // 20,000 nodes under the node budget, but each alias would copy 1 MiB of text: 20 GB.
    let big = "x".repeat(1024 * 1024);
    let mut yaml = format!("a: &a \"{big}\"\nb: [");
    yaml.push_str(&"*a, ".repeat(MAX_NODES - 10));
    yaml.push_str("*a]\n");
    let start = std::time::Instant::now();
    let file = parse_file("bomb.yaml", &yaml);
    assert!(start.elapsed().as_secs() < 5, "took {:?}", start.elapsed());
    let messages: Vec<String> = file.diagnostics.iter().map(ToString::to_string).collect();
    assert_eq!(messages.len(), 1, "{messages:#?}");
    assert!(
        messages[0].starts_with("bomb.yaml:2:")
            && messages[0].contains(&format!(
                "document too large: more than {} MiB of text after expanding aliases",
                MAX_TEXT_BYTES / (1024 * 1024)
            )),
        "{messages:#?}"
    );
}

#[test]
fn a_file_over_the_size_limit_is_refused_without_being_parsed() {
    let yaml = format!("# {}\n", "x".repeat(MAX_FILE_BYTES));
    let file = parse_file("huge.yaml", &yaml);
    let messages: Vec<String> = file.diagnostics.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [format!(
            "huge.yaml:1:1: error: file too large: {} bytes, more than the {} MiB a manifest \
             file may hold\n  help: split the manifests into several files",
            yaml.len(),
            MAX_FILE_BYTES / (1024 * 1024)
        )]
    );
}
