//! YAML text → a tree of located nodes, one per document, within a fixed budget.
//!
//! Built on serde-saphyr's own event parser (`granit_parser`) rather than on its serde
//! deserializer, because the deserializer stops at the first problem and ProxOps reports every
//! problem of a document at once. Each node keeps its raw scalar text, so the target type
//! decides what `on` or `0755` means (YAML 1.1 would read `discard: on` as a boolean).
//!
//! The budget protects the agent from hostile input: aliases are expanded by copying, and every
//! copied node counts against [`MAX_NODES`], so a "billion laughs" document stops after a few
//! thousand nodes; nesting deeper than [`MAX_DEPTH`] stops the document too. Copied scalar text
//! counts against [`MAX_TEXT_BYTES`], since a node budget alone lets 20,000 aliases of one
//! long scalar copy gigabytes. A syntax error or
//! an exhausted budget abandons that document only; the next `---` starts afresh.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use serde_saphyr::granit_parser::{self, Event, Marker, Parser, ScalarStyle, ScanError};

use super::Location;
use crate::diagnostic::Diagnostic;

/// Most nodes one document may hold, counting every node an alias copies. A full VM manifest
/// has a few hundred.
pub(crate) const MAX_NODES: usize = 20_000;
/// Deepest nesting of sequences and mappings in one document. Manifests need about eight.
pub(crate) const MAX_DEPTH: usize = 32;
/// Most scalar text one document may hold, counting every copy an alias makes: twice the
/// largest file (`MAX_FILE_BYTES`), so a file under the size limit never hits it without aliases.
pub(crate) const MAX_TEXT_BYTES: usize = 2 * super::MAX_FILE_BYTES;

/// One YAML node and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    /// Where the node starts (for a block mapping: its first key).
    pub(crate) location: Location,
    /// The node itself.
    pub(crate) value: Value,
}

/// The content of a node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// `~`, `null`, or nothing at all.
    Null,
    /// Any other scalar, as written (after YAML escapes), and whether it was quoted.
    Scalar {
        /// The text.
        text: String,
        /// Quoted, block or `!!str`-tagged: always a string, never a number or boolean.
        quoted: bool,
    },
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in document order, with duplicate keys already reported and removed.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// The text of a scalar key or value.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The value under `key` when this is a mapping.
    pub(crate) fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The key node under which `key` is stored, when this is a mapping.
    pub(crate) fn key_node(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(k, _)| k),
            _ => None,
        }
    }

    /// A short description of what kind of node this is, for "expected X, found Y".
    pub(crate) fn describe(&self) -> &'static str {
        match &self.value {
            Value::Null => "nothing (null)",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
            Value::Scalar { text, quoted } => {
                if *quoted {
                    "a string"
                } else if parse_bool(text).is_some() {
                    "a boolean"
                } else if text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok() {
                    "an integer"
                } else if text.parse::<f64>().is_ok() {
                    "a number"
                } else {
                    "a string"
                }
            }
        }
    }

    /// Finds the node at a field path such as `spec.disks[1].size`; when part of the path is
    /// absent, the deepest node that exists (so a missing field points at its parent).
    pub(crate) fn locate(&self, path: &str) -> &Node {
        let mut node = self;
        for segment in path_segments(path) {
            let next = match segment {
                Segment::Key(key) => node.get(key),
                Segment::Index(i) => match &node.value {
                    Value::Seq(items) => items.get(i),
                    _ => None,
                },
            };
            match next {
                Some(next) => node = next,
                None => break,
            }
        }
        node
    }
}

/// One step of a field path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Segment<'a> {
    /// A mapping key.
    Key(&'a str),
    /// A list index.
    Index(usize),
}

/// Splits `spec.disks[1].size` into `spec`, `disks`, `1`, `size`.
pub(crate) fn path_segments(path: &str) -> impl Iterator<Item = Segment<'_>> {
    path.split(['.', '['])
        .filter(|part| !part.is_empty())
        .map(|part| match part.strip_suffix(']') {
            Some(index) => index
                .parse::<usize>()
                .map_or(Segment::Key(part), Segment::Index),
            None => Segment::Key(part),
        })
}

/// YAML 1.2 booleans plus the YAML 1.1 words the Go program's YAML library accepts for a
/// boolean field.
pub(crate) fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
        "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

/// One document of a file: its tree, or why it has none.
#[derive(Debug)]
pub(crate) struct Document {
    /// The root node; `None` when the document was abandoned (see `problems`).
    pub(crate) root: Option<Node>,
    /// Problems found while reading the YAML itself.
    pub(crate) problems: Vec<Diagnostic>,
}

/// Reads every non-empty document of `contents`. `path` only labels diagnostics.
pub(crate) fn parse_documents(path: &str, contents: &str) -> Vec<Document> {
    let mut options = granit_parser::Options::default();
    // Our own depth check reports first and more clearly; these only bound the parser itself.
    options.flow_nesting_limit = MAX_DEPTH + 8;
    options.block_nesting_limit = MAX_DEPTH + 8;
    let mut parser = Parser::new_from_str_with_options(contents, options);
    let mut documents = Vec::new();
    loop {
        let mut builder = Builder::new(path);
        let outcome = builder.run(&mut parser);
        let Builder { root, problems, .. } = builder;
        match outcome {
            Outcome::Document => {
                if root.as_ref().is_some_and(|r| r.value != Value::Null) || !problems.is_empty() {
                    documents.push(Document {
                        root: root.filter(|r| r.value != Value::Null),
                        problems,
                    });
                }
            }
            Outcome::End => {
                if !problems.is_empty() {
                    documents.push(Document {
                        root: None,
                        problems,
                    });
                }
                break;
            }
            Outcome::Abandoned(problem) => {
                documents.push(Document {
                    root: None,
                    problems: vec![*problem],
                });
                match parser.proceed_next_document() {
                    Ok(true) => {}
                    Ok(false) | Err(_) => break,
                }
            }
        }
    }
    documents
}

/// How reading one document ended.
enum Outcome {
    /// A complete document (possibly empty).
    Document,
    /// The end of the stream; no further document.
    End,
    /// A syntax error or an exhausted budget.
    Abandoned(Box<Diagnostic>),
}

/// A collection being read.
enum Frame {
    Seq {
        location: Location,
        anchor: usize,
        items: Vec<Node>,
        size: usize,
    },
    Map {
        location: Location,
        anchor: usize,
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
        size: usize,
    },
}

/// Builds the tree of one document from parser events.
struct Builder<'p> {
    path: &'p str,
    stack: Vec<Frame>,
    root: Option<Node>,
    /// Anchored nodes with their node count and scalar text bytes (what an alias copies).
    anchors: HashMap<usize, (Node, usize, usize)>,
    nodes: usize,
    text_bytes: usize,
    problems: Vec<Diagnostic>,
}

fn location(marker: &Marker) -> Location {
    Location {
        line: marker.line(),
        column: marker.col() + 1,
    }
}

impl<'p> Builder<'p> {
    fn new(path: &'p str) -> Self {
        Self {
            path,
            stack: Vec::new(),
            root: None,
            anchors: HashMap::new(),
            nodes: 0,
            text_bytes: 0,
            problems: Vec::new(),
        }
    }

    fn error(&self, at: Location, message: impl Into<String>) -> Diagnostic {
        Diagnostic::error(self.path, at.line, at.column, "", message)
    }

    fn syntax_error(&self, error: &ScanError) -> Diagnostic {
        self.error(
            location(error.marker()),
            format!("invalid YAML: {}", error.kind()),
        )
    }

    fn run<'i>(&mut self, parser: &mut Parser<'i, granit_parser::StrInput<'i>>) -> Outcome {
        let mut started = false;
        loop {
            let (event, span) = match parser.next_event() {
                None => return Outcome::End,
                Some(Err(error)) => return Outcome::Abandoned(Box::new(self.syntax_error(&error))),
                Some(Ok(pair)) => pair,
            };
            let at = location(&span.start);
            let result = match event {
                Event::StreamStart => Ok(()),
                Event::StreamEnd => return Outcome::End,
                Event::DocumentStart(..) => {
                    started = true;
                    Ok(())
                }
                Event::DocumentEnd => {
                    if started {
                        return Outcome::Document;
                    }
                    Ok(())
                }
                Event::Scalar(text, style, anchor, tag) => {
                    self.text_bytes = self.text_bytes.saturating_add(text.len());
                    if self.text_bytes > MAX_TEXT_BYTES {
                        return Outcome::Abandoned(Box::new(self.too_much_text(at)));
                    }
                    let core = tag.as_ref().map(|t| {
                        t.core_suffix()
                            .map(str::to_owned)
                            .ok_or_else(|| t.original())
                    });
                    let quoted = !matches!(style, ScalarStyle::Plain);
                    let value = match core {
                        Some(Err(custom)) => {
                            let problem = self
                                .error(at, format!("YAML tag `{custom}` is not supported"))
                                .with_help("remove the tag; manifests use plain values");
                            self.problems.push(problem);
                            Value::Scalar {
                                text: text.into_owned(),
                                quoted,
                            }
                        }
                        Some(Ok(core)) if core == "str" => Value::Scalar {
                            text: text.into_owned(),
                            quoted: true,
                        },
                        Some(Ok(core)) if core == "null" => Value::Null,
                        _ if !quoted
                            && matches!(text.as_ref(), "" | "~" | "null" | "Null" | "NULL") =>
                        {
                            Value::Null
                        }
                        _ => Value::Scalar {
                            text: text.into_owned(),
                            quoted,
                        },
                    };
                    self.push(
                        Node {
                            location: at,
                            value,
                        },
                        1,
                        1,
                        anchor,
                    )
                }
                Event::SequenceStart(_, anchor, _) => self.open(
                    at,
                    Frame::Seq {
                        location: at,
                        anchor,
                        items: Vec::new(),
                        size: 1,
                    },
                ),
                Event::MappingStart(_, anchor, _) => self.open(
                    at,
                    Frame::Map {
                        location: at,
                        anchor,
                        entries: Vec::new(),
                        key: None,
                        size: 1,
                    },
                ),
                Event::SequenceEnd | Event::MappingEnd => self.close(),
                Event::Alias(id) => match self.anchors.get(&id) {
                    Some((node, size, bytes)) => {
                        let size = *size;
                        self.text_bytes = self.text_bytes.saturating_add(*bytes);
                        if self.nodes.saturating_add(size) > MAX_NODES {
                            Err(self.too_large(at))
                        } else if self.text_bytes > MAX_TEXT_BYTES {
                            Err(self.too_much_text(at))
                        } else {
                            let mut copy = node.clone();
                            copy.location = at;
                            self.push(copy, size, size, 0)
                        }
                    }
                    None => Err(self.error(at, "alias to an unknown anchor")),
                },
                _ => Ok(()),
            };
            if let Err(problem) = result {
                return Outcome::Abandoned(Box::new(problem));
            }
        }
    }

    fn too_large(&self, at: Location) -> Diagnostic {
        self.error(
            at,
            format!("document too large: more than {MAX_NODES} YAML nodes after expanding aliases"),
        )
        .with_help("a manifest needs a few hundred nodes; check for recursive or repeated aliases")
    }

    fn too_much_text(&self, at: Location) -> Diagnostic {
        self.error(
            at,
            format!(
                "document too large: more than {} MiB of text after expanding aliases",
                MAX_TEXT_BYTES / (1024 * 1024)
            ),
        )
        .with_help("check for aliases that repeat long values")
    }

    fn open(&mut self, at: Location, frame: Frame) -> Result<(), Diagnostic> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(self
                .error(at, format!("nesting deeper than {MAX_DEPTH} levels"))
                .with_help(
                    "manifests nest a few levels deep; check the indentation and brackets",
                ));
        }
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(self.too_large(at));
        }
        self.stack.push(frame);
        Ok(())
    }

    fn close(&mut self) -> Result<(), Diagnostic> {
        let Some(frame) = self.stack.pop() else {
            return Ok(());
        };
        let (node, size, anchor) = match frame {
            Frame::Seq {
                location,
                anchor,
                items,
                size,
            } => (
                Node {
                    location,
                    value: Value::Seq(items),
                },
                size,
                anchor,
            ),
            Frame::Map {
                location,
                anchor,
                entries,
                size,
                ..
            } => {
                let entries = self.merge_and_dedupe(entries);
                (
                    Node {
                        location,
                        value: Value::Map(entries),
                    },
                    size,
                    anchor,
                )
            }
        };
        // The collection and its children were counted as they were read.
        self.push(node, size, 0, anchor)
    }

    /// Applies `<<` merge keys (explicit keys win) and reports and drops duplicate keys.
    fn merge_and_dedupe(&mut self, entries: Vec<(Node, Node)>) -> Vec<(Node, Node)> {
        let mut own = Vec::with_capacity(entries.len());
        let mut merged = Vec::new();
        for (key, value) in entries {
            let is_merge =
                matches!(&key.value, Value::Scalar { text, quoted: false } if text == "<<");
            if !is_merge {
                own.push((key, value));
                continue;
            }
            match value.value {
                Value::Map(more) => merged.extend(more),
                Value::Seq(items) => {
                    for item in items {
                        match item.value {
                            Value::Map(more) => merged.extend(more),
                            _ => self.problems.push(self.error(
                                item.location,
                                "a merge key (`<<`) takes a mapping or a list of mappings",
                            )),
                        }
                    }
                }
                _ => self.problems.push(self.error(
                    value.location,
                    "a merge key (`<<`) takes a mapping or a list of mappings",
                )),
            }
        }
        // Most mappings are small: compare keys in place rather than hashing copies of them.
        let mut result: Vec<(Node, Node)> = Vec::with_capacity(own.len() + merged.len());
        let mut seen: HashSet<String> = HashSet::new();
        let large = own.len() + merged.len() > 16;
        let mut is_new = |result: &[(Node, Node)], key: &Node| {
            let text = key_text(key);
            if large {
                seen.insert(text.into_owned())
            } else {
                !result.iter().any(|(k, _)| key_text_eq(k, &text))
            }
        };
        for (key, value) in own {
            if !is_new(&result, &key) {
                let text = key_text(&key);
                let problem = self
                    .error(key.location, format!("duplicate key `{text}`"))
                    .with_help("a key may appear once per mapping; remove one of them");
                self.problems.push(problem);
                continue;
            }
            result.push((key, value));
        }
        for (key, value) in merged {
            if is_new(&result, &key) {
                result.push((key, value));
            }
        }
        result
    }

    /// Adds a finished node to its parent; `added` is how many new nodes it brings to the
    /// budget and `size` how many it holds in all (what an alias to it would copy).
    fn push(
        &mut self,
        node: Node,
        size: usize,
        added: usize,
        anchor: usize,
    ) -> Result<(), Diagnostic> {
        self.nodes += added;
        if self.nodes > MAX_NODES {
            return Err(self.too_large(node.location));
        }
        if anchor != 0 {
            self.anchors
                .insert(anchor, (node.clone(), size, text_bytes(&node)));
        }
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq {
                items, size: total, ..
            }) => {
                *total += size;
                items.push(node);
            }
            Some(Frame::Map {
                entries,
                key,
                size: total,
                ..
            }) => {
                *total += size;
                match key.take() {
                    None => *key = Some(node),
                    Some(k) => entries.push((k, node)),
                }
            }
        }
        Ok(())
    }
}

/// The scalar text a node holds, keys included; depth is bounded by `MAX_DEPTH`.
fn text_bytes(node: &Node) -> usize {
    match &node.value {
        Value::Null => 0,
        Value::Scalar { text, .. } => text.len(),
        Value::Seq(items) => items.iter().map(text_bytes).sum(),
        Value::Map(entries) => entries
            .iter()
            .map(|(k, v)| text_bytes(k) + text_bytes(v))
            .sum(),
    }
}

/// Whether `key` reads as `text`.
fn key_text_eq(key: &Node, text: &str) -> bool {
    match &key.value {
        Value::Scalar { text: t, .. } => t == text,
        _ => key_text(key) == text,
    }
}

/// A key as text; non-scalar keys never match a field and are reported by the decoder.
fn key_text(key: &Node) -> Cow<'_, str> {
    match &key.value {
        Value::Scalar { text, .. } => Cow::Borrowed(text),
        Value::Null => Cow::Borrowed("~"),
        Value::Seq(_) => Cow::Borrowed("[...]"),
        Value::Map(_) => Cow::Borrowed("{...}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(yaml: &str) -> Document {
        let mut docs = parse_documents("t.yaml", yaml);
        assert_eq!(docs.len(), 1, "{docs:?}");
        docs.remove(0)
    }

    #[test]
    fn scalars_keep_their_text_and_location() {
        let doc = one("a: on\nb: 'x'\n");
        let root = doc.root.unwrap();
        let a = root.get("a").unwrap();
        assert_eq!(
            a.value,
            Value::Scalar {
                text: "on".into(),
                quoted: false
            }
        );
        assert_eq!(a.location, Location { line: 1, column: 4 });
        assert!(matches!(
            &root.get("b").unwrap().value,
            Value::Scalar { quoted: true, .. }
        ));
    }

    #[test]
    fn empty_documents_are_skipped() {
        let docs = parse_documents("t.yaml", "---\n---\na: 1\n---\n# nothing\n");
        assert_eq!(docs.len(), 1);
    }

    #[test]
    fn a_syntax_error_abandons_only_its_document() {
        let docs = parse_documents("t.yaml", "a: [1, 2\n---\nb: 2\n");
        assert_eq!(docs.len(), 2);
        assert!(docs[0].root.is_none());
        assert!(
            docs[0].problems[0].message.starts_with("invalid YAML"),
            "{:?}",
            docs[0].problems
        );
        assert!(docs[1].root.is_some());
    }

    #[test]
    fn duplicate_keys_are_reported_and_the_first_is_kept() {
        let doc = one("a: 1\na: 2\n");
        assert_eq!(doc.problems[0].message, "duplicate key `a`");
        assert_eq!(doc.problems[0].line, 2);
        assert_eq!(doc.root.unwrap().get("a").unwrap().as_str(), Some("1"));
    }

    #[test]
    fn merge_keys_copy_entries_that_are_not_set_explicitly() {
        let doc = one("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  y: 3\n");
        let c = doc.root.unwrap().get("c").cloned().unwrap();
        assert_eq!(c.get("x").unwrap().as_str(), Some("1"));
        assert_eq!(c.get("y").unwrap().as_str(), Some("3"));
    }

    #[test]
    fn locate_falls_back_to_the_deepest_existing_node() {
        let doc = one("spec:\n  disks:\n    - storage: a\n    - size: 1G\n");
        let root = doc.root.unwrap();
        assert_eq!(
            root.locate("spec.disks[1].size").location,
            Location {
                line: 4,
                column: 13
            }
        );
        assert_eq!(
            root.locate("spec.disks[1].storage").location,
            Location { line: 4, column: 7 }
        );
    }
}
