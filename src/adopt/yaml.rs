//! A small deterministic YAML writer for the manifests adopt writes: block mappings in the
//! order built, 2-space indent, short scalar lists in flow style, and every string that a
//! YAML 1.1 or 1.2 reader could take for something else (a number, a boolean, null, an
//! indicator) double-quoted. Written by hand rather than through a serializer so that key
//! order is the manifest's reading order and the bytes never depend on a library's formatting
//! choices.
//!
//! # Why not serde-saphyr's serializer
//!
//! serde-saphyr 2.2 (already our YAML reader) can serialize with key order kept, flow lists
//! (`FlowSeq`) and YAML 1.1-aware quoting, and its output is as safe for YAML 1.1 readers as
//! this writer's. It is not byte-identical, so adopt keeps this writer. Compared on a full VM
//! manifest (scratch crate, 2026-12, serde-saphyr 2.2.0 with `serialize`), with
//! `compact_list_indent: false` and `prefer_block_scalars: false` (its defaults write
//! `disks:\n- storage:` without indenting list items, and multi-line strings as `|-` blocks),
//! the two outputs still differ in quoting, because serde-saphyr quotes only what a reader
//! would misread and this writer quotes everything outside `[A-Za-z0-9-_./@+]` or starting
//! with a digit (quantities such as `32GiB` aside):
//!
//! - `mac: BC:24:11:00:00:01`, `startup: order=1,up=30`, `ipconfig0: ip=10.0.0.5/24,gw=...`
//!   and `web server` are plain there, double-quoted here;
//! - control characters use YAML's short escapes there (`"bell\a"`), `\uXXXX` here;
//! - flow vs block for a list is chosen per type there (`FlowSeq`), by rendered width
//!   (`FLOW_WIDTH`) here, which a derived `Serialize` would need a hand-written wrapper for;
//! - header comments (`# adopted from ...`) are not part of serde's data model either way.
//!
//! Both forms read back to the same strings; the test
//! `serde_saphyr_would_write_these_plain_or_with_other_escapes` pins the differences. The
//! `serialize` feature is not enabled even for tests: as a dev-dependency feature it would
//! split serde-saphyr, and with it `proxops-core`, `proxops-sops` and this crate, into two
//! builds (tests with it, `cargo build` and `cargo doc` without).

/// A YAML value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// A string.
    Text(String),
    /// A non-negative integer.
    Int(u64),
    /// `true` / `false`.
    Bool(bool),
    /// A sequence.
    List(Vec<Value>),
    /// A mapping, in insertion order.
    Map(Map),
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Text(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Text(s)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Self {
        Value::Int(n)
    }
}

impl From<u32> for Value {
    fn from(n: u32) -> Self {
        Value::Int(u64::from(n))
    }
}

impl From<Map> for Value {
    fn from(m: Map) -> Self {
        Value::Map(m)
    }
}

impl From<Vec<String>> for Value {
    fn from(items: Vec<String>) -> Self {
        Value::List(items.into_iter().map(Value::Text).collect())
    }
}

/// A mapping whose keys keep the order they were inserted in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Map(Vec<(String, Value)>);

impl Map {
    /// An empty mapping.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Appends `key: value`.
    pub(crate) fn set(&mut self, key: &str, value: impl Into<Value>) {
        self.0.push((key.to_owned(), value.into()));
    }

    /// Appends `key: value` when there is a value.
    pub(crate) fn set_opt<V: Into<Value>>(&mut self, key: &str, value: Option<V>) {
        if let Some(v) = value {
            self.set(key, v);
        }
    }

    /// Appends `key: value` unless `value` is an empty mapping.
    pub(crate) fn set_map(&mut self, key: &str, value: Map) {
        if !value.is_empty() {
            self.set(key, value);
        }
    }

    /// Appends `key: [items]` unless there are none.
    pub(crate) fn set_list(&mut self, key: &str, items: Vec<Value>) {
        if !items.is_empty() {
            self.set(key, Value::List(items));
        }
    }

    /// Whether the mapping has no keys.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Flow lists longer than this are written one item per line.
const FLOW_WIDTH: usize = 72;

/// One YAML document: `# comment` lines, then the mapping.
pub(crate) fn document(comments: &[String], root: &Map) -> String {
    let mut out = String::new();
    for comment in comments {
        for line in comment.lines() {
            out.push_str("# ");
            // A comment ends at a line break and may not hold control characters: those
            // (only ever from PVE-provided text) are shown escaped.
            for c in line.chars() {
                if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}') {
                    out.push_str(&format!("\\u{:04X}", u32::from(c)));
                } else {
                    out.push(c);
                }
            }
            out.push('\n');
        }
    }
    write_map(&mut out, root, 0);
    out
}

fn write_map(out: &mut String, map: &Map, indent: usize) {
    let pad = " ".repeat(indent);
    for (key, value) in &map.0 {
        out.push_str(&pad);
        out.push_str(&scalar(key));
        out.push(':');
        match value {
            Value::Map(m) if m.is_empty() => out.push_str(" {}\n"),
            Value::Map(m) => {
                out.push('\n');
                write_map(out, m, indent + 2);
            }
            Value::List(items) => match flow(items) {
                Some(text) => {
                    out.push(' ');
                    out.push_str(&text);
                    out.push('\n');
                }
                None => {
                    out.push('\n');
                    write_list(out, items, indent + 2);
                }
            },
            scalar_value => {
                out.push(' ');
                out.push_str(&scalar_text(scalar_value));
                out.push('\n');
            }
        }
    }
}

fn write_list(out: &mut String, items: &[Value], indent: usize) {
    let pad = " ".repeat(indent);
    for item in items {
        match item {
            Value::Map(m) if !m.is_empty() => {
                // The mapping written two deeper, its first line's indent replaced by `- `.
                let mut nested = String::new();
                write_map(&mut nested, m, indent + 2);
                out.push_str(&pad);
                out.push_str("- ");
                out.push_str(&nested[indent + 2..]);
            }
            Value::Map(_) => {
                out.push_str(&pad);
                out.push_str("- {}\n");
            }
            Value::List(inner) => {
                out.push_str(&pad);
                out.push_str("- ");
                out.push_str(&flow(inner).unwrap_or_else(|| "[]".to_owned()));
                out.push('\n');
            }
            scalar_value => {
                out.push_str(&pad);
                out.push_str("- ");
                out.push_str(&scalar_text(scalar_value));
                out.push('\n');
            }
        }
    }
}

/// `[a, b]` when every item is a scalar and the line stays short.
fn flow(items: &[Value]) -> Option<String> {
    let mut parts = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::Map(_) | Value::List(_) => return None,
            other => parts.push(scalar_text(other)),
        }
    }
    let text = format!("[{}]", parts.join(", "));
    (text.len() <= FLOW_WIDTH).then_some(text)
}

fn scalar_text(value: &Value) -> String {
    match value {
        Value::Text(s) => scalar(s),
        Value::Int(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::List(_) | Value::Map(_) => String::new(),
    }
}

/// Words some YAML reader takes for a boolean or null.
const SPECIAL_WORDS: [&str; 11] = [
    "true", "false", "yes", "no", "on", "off", "y", "n", "null", "~", "",
];

/// A string as a plain scalar when no reader can misread it, else double-quoted.
pub(crate) fn scalar(s: &str) -> String {
    if is_plain_safe(s) {
        s.to_owned()
    } else {
        quoted(s)
    }
}

fn is_plain_safe(s: &str) -> bool {
    if SPECIAL_WORDS.contains(&s.to_ascii_lowercase().as_str()) {
        return false;
    }
    let Some(first) = s.chars().next() else {
        return false;
    };
    let body_ok = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | '@' | '+'));
    // Anything starting with a digit or sign could be a number in some YAML version
    // (`1e3`, `0x1F`, `1_000`, sexagesimal `1:20`), except a quantity such as `32GiB`.
    let first_ok = first.is_ascii_alphabetic() || first == '/' || first == '_' || is_quantity(s);
    body_ok && first_ok
}

/// `<digits><K|M|G|T|P>iB`: unambiguous text in every YAML version.
fn is_quantity(s: &str) -> bool {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && matches!(&s[digits..], "KiB" | "MiB" | "GiB" | "TiB" | "PiB")
}

fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{85}' => out.push_str("\\N"),
            '\u{2028}' => out.push_str("\\L"),
            '\u{2029}' => out.push_str("\\P"),
            c if c.is_control() || c == '\u{feff}' => {
                out.push_str(&format!("\\u{:04X}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_a_reader_could_misread_are_quoted_and_others_are_plain() {
        assert_eq!(scalar("web-1"), "web-1");
        assert_eq!(scalar("local-lvm"), "local-lvm");
        assert_eq!(scalar("32GiB"), "32GiB");
        assert_eq!(scalar("true"), "\"true\"");
        assert_eq!(scalar("No"), "\"No\"");
        assert_eq!(scalar("0000:01:00.0"), "\"0000:01:00.0\"");
        assert_eq!(scalar("1e3"), "\"1e3\"");
        assert_eq!(scalar("a: b"), "\"a: b\"");
        assert_eq!(scalar("#x"), "\"#x\"");
        assert_eq!(scalar(""), "\"\"");
        assert_eq!(
            scalar("line1\nline \"2\"\\"),
            "\"line1\\nline \\\"2\\\"\\\\\""
        );
        assert_eq!(scalar("bell\u{7}"), "\"bell\\u0007\"");
    }

    #[test]
    fn mappings_lists_and_nested_mappings_are_written_in_block_style() {
        let mut disk = Map::new();
        disk.set("storage", "local-lvm");
        disk.set("size", "32GiB");
        let mut spec = Map::new();
        spec.set("vmid", 100u32);
        spec.set("tags", vec!["a".to_owned(), "b".to_owned()]);
        spec.set("disks", Value::List(vec![Value::Map(disk)]));
        spec.set("options", Map::new());
        let mut root = Map::new();
        root.set("spec", spec);
        assert_eq!(
            document(&["adopted".to_owned()], &root),
            "# adopted\nspec:\n  vmid: 100\n  tags: [a, b]\n  disks:\n    - storage: local-lvm\n      size: 32GiB\n  options: {}\n"
        );
    }

    /// (input, this writer's line, serde-saphyr 2.2's line with `prefer_block_scalars: false`):
    /// the documented comparison of the module doc. Both lines read back to the input.
    const SAPHYR_DIFFERENCES: [(&str, &str, &str); 5] = [
        (
            "BC:24:11:00:00:01",
            "k: \"BC:24:11:00:00:01\"\n",
            "k: BC:24:11:00:00:01\n",
        ),
        (
            "ip=10.0.0.5/24,gw=10.0.0.1",
            "k: \"ip=10.0.0.5/24,gw=10.0.0.1\"\n",
            "k: ip=10.0.0.5/24,gw=10.0.0.1\n",
        ),
        (
            "order=1,up=30",
            "k: \"order=1,up=30\"\n",
            "k: order=1,up=30\n",
        ),
        ("web server", "k: \"web server\"\n", "k: web server\n"),
        ("bell\u{7}", "k: \"bell\\u0007\"\n", "k: \"bell\\a\"\n"),
    ];

    #[test]
    fn serde_saphyr_would_write_these_plain_or_with_other_escapes() {
        for (text, ours, saphyr) in SAPHYR_DIFFERENCES {
            let mut root = Map::new();
            root.set("k", text);
            assert_eq!(document(&[], &root), ours, "{text:?}");
            assert_ne!(ours, saphyr);
            for written in [ours, saphyr] {
                let back: std::collections::BTreeMap<String, String> =
                    serde_saphyr::from_str(written).unwrap();
                assert_eq!(back["k"], text, "{written:?}");
            }
        }
    }

    #[test]
    fn long_scalar_lists_go_one_per_line() {
        let items: Vec<String> = (0..12)
            .map(|i| format!("search-domain-{i}.example"))
            .collect();
        let mut root = Map::new();
        root.set("list", items);
        let text = document(&[], &root);
        assert!(text.starts_with("list:\n  - search-domain-0.example\n"));
    }
}

#[cfg(test)]
mod round_trip {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use proxops_core::manifest::Spec;
    use proxops_core::repository::load;

    use super::*;

    /// Writes a VM whose description and one tag are `text`, and reads it back with the
    /// manifest parser.
    fn read_back(text: &str) -> Option<String> {
        let mut cpu = Map::new();
        cpu.set("type", "host");
        cpu.set("cores", 1u32);
        let mut disk = Map::new();
        disk.set("storage", "local-lvm");
        disk.set("size", "1GiB");
        let mut spec = Map::new();
        spec.set("node", "pve1");
        spec.set("vmid", 100u32);
        spec.set("memory", "512MiB");
        spec.set("cpu", cpu);
        spec.set("disks", Value::List(vec![Value::Map(disk)]));
        spec.set("pve-description", text);
        let mut metadata = Map::new();
        metadata.set("name", "vm");
        let mut annotations = Map::new();
        annotations.set("note", text);
        metadata.set("annotations", annotations);
        let mut doc = Map::new();
        doc.set("apiVersion", "proxops/v1alpha1");
        doc.set("kind", "VM");
        doc.set("metadata", metadata);
        doc.set("spec", spec);
        let files = BTreeMap::from([("vm.yaml".to_owned(), document(&[text.to_owned()], &doc))]);
        let loaded = load(&files);
        let resource = loaded.states.first()?.manifest.resources().next()?.clone();
        assert_eq!(
            resource.annotations.get("note").map(String::as_str),
            Some(text)
        );
        match resource.spec? {
            Spec::Vm(vm) => vm.pve_description,
            _ => None,
        }
    }

    #[test]
    fn indicator_and_escape_heavy_strings_read_back_unchanged() {
        for text in [
            "- item",
            "? key",
            ": value",
            "@at",
            "`tick",
            "!tag",
            "&anchor",
            "*alias",
            "|",
            ">",
            "%directive",
            "# comment",
            "a # b",
            "a: b",
            "'single'",
            "\"double\"",
            "  lead",
            "trail  ",
            "tab\there",
            "yes",
            "NULL",
            "0o17",
            "1_000",
            ".inf",
            "-.5",
            "+1",
            "2026-11-29",
            "line\r\nbreak",
            "über ✓",
            "\u{85}\u{2028}",
            "{flow}",
            "[list]",
        ] {
            assert_eq!(read_back(text).as_deref(), Some(text), "{text:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn any_string_reads_back_unchanged(text in "(?s).{1,40}") {
            let back = read_back(&text);
            prop_assert_eq!(back.as_deref(), Some(text.as_str()));
        }
    }
}
