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
//! an exhausted document budget abandons that document only; the next `---` starts afresh.
//!
//! A per-document budget alone does not bound a file: a 2 KB document can expand to 16 MiB
//! under every per-document limit, and an 8 MiB file holds thousands of such documents
//! (SECURITY-AUDIT.md H3). So a file also has one budget across all its documents
//! ([`MAX_DOCUMENTS_PER_FILE`], [`MAX_FILE_NODES`], [`MAX_FILE_TEXT_BYTES`]), and every file of
//! a revision draws on one [`RevisionBudget`] shared by the parse threads. Exhausting either
//! stops reading the file. Documents are handed to the caller one at a time
//! ([`for_each_document`]), so only one document's tree is alive per parsing thread.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
/// Most `---` documents one file may hold, empty ones included. The 10,000-resource benchmark
/// repository holds about one document per file.
pub const MAX_DOCUMENTS_PER_FILE: usize = 10_000;
/// Most nodes one file may hold across all its documents, counting alias copies: an 8 MiB file
/// of plain manifests holds about 700,000.
pub const MAX_FILE_NODES: usize = 1_000_000;
/// Most scalar text one file may hold across all its documents, counting alias copies: the
/// per-document limit, so a file without aliases never reaches it.
pub const MAX_FILE_TEXT_BYTES: usize = MAX_TEXT_BYTES;
/// Most non-empty documents a revision may hold across its files: 2.5 times the
/// 10,000-resource benchmark repository.
pub const MAX_REVISION_DOCUMENTS: usize = 25_000;
/// Most YAML nodes a revision may hold across its files after expanding aliases.
pub const MAX_REVISION_NODES: usize = 4_000_000;
/// Most scalar text a revision may hold across its files after expanding aliases.
pub const MAX_REVISION_TEXT_BYTES: usize = 64 * 1024 * 1024;
/// Charges to the shared revision budget are batched per thread, in steps this large.
const NODE_BATCH: usize = 4096;
const TEXT_BATCH: usize = 256 * 1024;

/// What one revision may hold in all, shared by every file parsed for it (and by the parse
/// threads: the counters are atomic). Once a limit is passed the budget stays exhausted, and
/// every file still being read stops.
#[derive(Debug)]
pub struct RevisionBudget {
    limits: RevisionLimits,
    documents: AtomicUsize,
    nodes: AtomicUsize,
    text_bytes: AtomicUsize,
    exhausted: AtomicBool,
}

/// The limits of a [`RevisionBudget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RevisionLimits {
    /// Non-empty documents.
    pub documents: usize,
    /// YAML nodes after expanding aliases.
    pub nodes: usize,
    /// Scalar text bytes after expanding aliases.
    pub text_bytes: usize,
}

impl RevisionLimits {
    /// The limits the agent and the CLI apply.
    pub const DEFAULT: RevisionLimits = RevisionLimits {
        documents: MAX_REVISION_DOCUMENTS,
        nodes: MAX_REVISION_NODES,
        text_bytes: MAX_REVISION_TEXT_BYTES,
    };
}

impl Default for RevisionBudget {
    fn default() -> Self {
        RevisionBudget::new(RevisionLimits::DEFAULT)
    }
}

impl RevisionBudget {
    /// A fresh budget with these limits.
    pub fn new(limits: RevisionLimits) -> Self {
        RevisionBudget {
            limits,
            documents: AtomicUsize::new(0),
            nodes: AtomicUsize::new(0),
            text_bytes: AtomicUsize::new(0),
            exhausted: AtomicBool::new(false),
        }
    }

    /// Whether a limit was passed: the revision cannot be read in full.
    pub fn is_exhausted(&self) -> bool {
        self.exhausted.load(Ordering::Relaxed)
    }

    /// Adds to the shared counters; the name of the limit passed, if one was.
    fn charge(&self, documents: usize, nodes: usize, text: usize) -> Option<&'static str> {
        let over = |counter: &AtomicUsize, add: usize, limit: usize| {
            add > 0
                && counter
                    .fetch_add(add, Ordering::Relaxed)
                    .saturating_add(add)
                    > limit
        };
        let passed = if over(&self.documents, documents, self.limits.documents) {
            Some("documents")
        } else if over(&self.nodes, nodes, self.limits.nodes) {
            Some("nodes")
        } else if over(&self.text_bytes, text, self.limits.text_bytes) {
            Some("text")
        } else {
            None
        };
        if passed.is_some() {
            self.exhausted.store(true, Ordering::Relaxed);
        }
        passed
    }
}

/// One file's use of its own budget and of the revision's, carried from document to document.
struct Meter<'b> {
    budget: &'b RevisionBudget,
    file_nodes: usize,
    file_text: usize,
    /// Not yet charged to `budget` (charges are batched).
    pending_nodes: usize,
    pending_text: usize,
}

/// Which budget stopped a file.
enum Exceeded {
    /// The file's document cap.
    FileDocuments,
    /// The file's own node budget.
    FileNodes,
    /// The file's own text budget.
    FileText,
    /// The revision's budget (documents, nodes or text), first passed in this file.
    Revision(&'static str),
    /// The revision's budget, passed in another file: this one stops without a word.
    Elsewhere,
}

impl<'b> Meter<'b> {
    fn new(budget: &'b RevisionBudget) -> Self {
        Meter {
            budget,
            file_nodes: 0,
            file_text: 0,
            pending_nodes: 0,
            pending_text: 0,
        }
    }

    fn charge(&mut self, nodes: usize, text: usize) -> Result<(), Exceeded> {
        self.file_nodes = self.file_nodes.saturating_add(nodes);
        self.file_text = self.file_text.saturating_add(text);
        self.pending_nodes = self.pending_nodes.saturating_add(nodes);
        self.pending_text = self.pending_text.saturating_add(text);
        if self.file_nodes > MAX_FILE_NODES {
            return Err(Exceeded::FileNodes);
        }
        if self.file_text > MAX_FILE_TEXT_BYTES {
            return Err(Exceeded::FileText);
        }
        if self.pending_nodes >= NODE_BATCH || self.pending_text >= TEXT_BATCH {
            self.flush(0)?;
        }
        Ok(())
    }

    /// Charges what is pending, plus `documents` new documents, to the revision.
    fn flush(&mut self, documents: usize) -> Result<(), Exceeded> {
        if self.budget.is_exhausted() {
            return Err(Exceeded::Elsewhere);
        }
        let (nodes, text) = (self.pending_nodes, self.pending_text);
        self.pending_nodes = 0;
        self.pending_text = 0;
        match self.budget.charge(documents, nodes, text) {
            Some(limit) => Err(Exceeded::Revision(limit)),
            None => Ok(()),
        }
    }
}

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
#[cfg(test)]
pub(crate) fn parse_documents(path: &str, contents: &str) -> Vec<Document> {
    let mut documents = Vec::new();
    for_each_document(path, contents, &RevisionBudget::default(), |doc| {
        documents.push(doc);
    });
    documents
}

/// Reads the documents of `contents` one at a time, handing each non-empty one (or one that
/// has problems) to `each` before the next is read, within the file's budget and `budget`.
/// When a budget runs out, the last document handed over says which, and reading stops (no
/// document at all when `budget` ran out while another file was read).
pub(crate) fn for_each_document(
    path: &str,
    contents: &str,
    budget: &RevisionBudget,
    mut each: impl FnMut(Document),
) {
    let mut options = granit_parser::Options::default();
    // Our own depth check reports first and more clearly; these only bound the parser itself.
    options.flow_nesting_limit = MAX_DEPTH + 8;
    options.block_nesting_limit = MAX_DEPTH + 8;
    let mut parser = Parser::new_from_str_with_options(contents, options);
    let mut meter = Meter::new(budget);
    let mut started = 0usize;
    loop {
        let mut builder = Builder::new(path, meter);
        let outcome = builder.run(&mut parser);
        let Builder {
            root,
            problems,
            meter: returned,
            last_at,
            first_at,
            ..
        } = builder;
        meter = returned;
        let stop = |problem: Option<Diagnostic>, each: &mut dyn FnMut(Document)| {
            if let Some(problem) = problem {
                let mut problems = problems.clone();
                problems.push(problem);
                each(Document {
                    root: None,
                    problems,
                });
            }
        };
        let ended = matches!(outcome, Outcome::End);
        let non_empty = match &outcome {
            Outcome::Document => {
                root.as_ref().is_some_and(|r| r.value != Value::Null) || !problems.is_empty()
            }
            Outcome::End => !problems.is_empty(),
            Outcome::Abandoned(_) | Outcome::Stopped(_) => true,
        };
        if !ended {
            started += 1;
        }
        // A file's document count and the revision's are checked as each document ends.
        let counted = if started > MAX_DOCUMENTS_PER_FILE {
            Err(Exceeded::FileDocuments)
        } else {
            meter.flush(usize::from(non_empty && !ended))
        };
        if let Err(exceeded) = counted
            && !matches!(outcome, Outcome::Stopped(_))
        {
            let at = match exceeded {
                Exceeded::FileDocuments | Exceeded::Revision("documents") => {
                    first_at.unwrap_or(last_at)
                }
                _ => last_at,
            };
            stop(
                exceeded_problem(path, at, &exceeded, budget.limits),
                &mut each,
            );
            return;
        }
        match outcome {
            Outcome::Document => {
                if non_empty {
                    each(Document {
                        root: root.filter(|r| r.value != Value::Null),
                        problems,
                    });
                }
            }
            Outcome::End => {
                if non_empty {
                    each(Document {
                        root: None,
                        problems,
                    });
                }
                return;
            }
            Outcome::Abandoned(problem) => {
                each(Document {
                    root: None,
                    problems: vec![*problem],
                });
                match parser.proceed_next_document() {
                    Ok(true) => {}
                    Ok(false) | Err(_) => return,
                }
            }
            Outcome::Stopped(problem) => {
                stop(problem.map(|p| *p), &mut each);
                return;
            }
        }
    }
}

/// The diagnostic for an exhausted file or revision budget, at `at`; `None` when another file
/// exhausted the revision's budget (that file says so).
fn exceeded_problem(
    path: &str,
    at: Location,
    exceeded: &Exceeded,
    limits: RevisionLimits,
) -> Option<Diagnostic> {
    let mib = |bytes: usize| bytes / (1024 * 1024);
    let (message, help) = match exceeded {
        Exceeded::FileDocuments => (
            format!("file too large: more than {MAX_DOCUMENTS_PER_FILE} YAML documents"),
            "split the manifests into several files".to_owned(),
        ),
        Exceeded::FileNodes => (
            format!(
                "file too large: more than {MAX_FILE_NODES} YAML nodes across its documents after \
                 expanding aliases"
            ),
            "a manifest needs a few hundred nodes; check for repeated aliases, or split the file"
                .to_owned(),
        ),
        Exceeded::FileText => (
            format!(
                "file too large: more than {} MiB of text across its documents after expanding \
                 aliases",
                mib(MAX_FILE_TEXT_BYTES)
            ),
            "check for aliases that repeat long values; a file without aliases never gets here"
                .to_owned(),
        ),
        Exceeded::Revision(limit) => {
            let what = match *limit {
                "documents" => format!("{} documents", limits.documents),
                "nodes" => format!("{} YAML nodes after expanding aliases", limits.nodes),
                _ => format!(
                    "{} MiB of text after expanding aliases",
                    mib(limits.text_bytes)
                ),
            };
            (
                format!(
                    "repository too large: more than {what} across all manifest files (the \
                     revision's budget ran out in this file)"
                ),
                format!(
                    "a revision may hold {} documents, {} nodes and {} MiB of text after \
                     expanding aliases; check the largest files for repeated aliases, or split \
                     the repository between agents",
                    limits.documents,
                    limits.nodes,
                    mib(limits.text_bytes)
                ),
            )
        }
        Exceeded::Elsewhere => return None,
    };
    Some(Diagnostic::error(path, at.line, at.column, "", message).with_help(help))
}

/// How reading one document ended.
enum Outcome {
    /// A complete document (possibly empty).
    Document,
    /// The end of the stream; no further document.
    End,
    /// A syntax error or an exhausted document budget: the next document starts afresh.
    Abandoned(Box<Diagnostic>),
    /// The file's or the revision's budget ran out: nothing more of the file is read.
    Stopped(Option<Box<Diagnostic>>),
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
struct Builder<'p, 'b> {
    path: &'p str,
    meter: Meter<'b>,
    /// Where the last event started (where a budget ran out).
    last_at: Location,
    /// Where the document's first node starts (where a document too many is reported).
    first_at: Option<Location>,
    stack: Vec<Frame>,
    root: Option<Node>,
    /// Anchored nodes with their node count and scalar text bytes (what an alias copies).
    anchors: HashMap<usize, (Node, usize, usize)>,
    nodes: usize,
    text_bytes: usize,
    problems: Vec<Diagnostic>,
    /// The file's or the revision's budget that ran out, if one did.
    exceeded: Option<Exceeded>,
}

fn location(marker: &Marker) -> Location {
    Location {
        line: marker.line(),
        column: marker.col() + 1,
    }
}

impl<'p, 'b> Builder<'p, 'b> {
    fn new(path: &'p str, meter: Meter<'b>) -> Self {
        Self {
            path,
            meter,
            last_at: Location { line: 1, column: 1 },
            first_at: None,
            stack: Vec::new(),
            root: None,
            anchors: HashMap::new(),
            nodes: 0,
            text_bytes: 0,
            problems: Vec::new(),
            exceeded: None,
        }
    }

    /// Charges `nodes` and `text` bytes to the file's and the revision's budgets. The error is
    /// a placeholder: `run` turns `exceeded` into the diagnostic.
    fn charge(&mut self, nodes: usize, text: usize) -> Result<(), Diagnostic> {
        match self.meter.charge(nodes, text) {
            Ok(()) => Ok(()),
            Err(exceeded) => {
                self.exceeded = Some(exceeded);
                Err(self.error(self.last_at, "budget exhausted"))
            }
        }
    }

    /// How reading ends when the file's or the revision's budget ran out.
    fn stopped(&mut self) -> Option<Outcome> {
        let exceeded = self.exceeded.take()?;
        Some(Outcome::Stopped(
            exceeded_problem(self.path, self.last_at, &exceeded, self.meter.budget.limits)
                .map(Box::new),
        ))
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
            self.last_at = at;
            if matches!(
                event,
                Event::Scalar(..) | Event::SequenceStart(..) | Event::MappingStart(..)
            ) {
                self.first_at.get_or_insert(at);
            }
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
                    if self.charge(0, text.len()).is_err() {
                        return self.stopped().unwrap_or(Outcome::End);
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
                Event::Alias(id) => match self
                    .anchors
                    .get(&id)
                    .map(|(_, size, bytes)| (*size, *bytes))
                {
                    Some((size, bytes)) => {
                        self.text_bytes = self.text_bytes.saturating_add(bytes);
                        if self.nodes.saturating_add(size) > MAX_NODES {
                            Err(self.too_large(at))
                        } else if self.text_bytes > MAX_TEXT_BYTES {
                            Err(self.too_much_text(at))
                        } else if let Err(placeholder) = self.charge(0, bytes) {
                            Err(placeholder)
                        } else {
                            let mut copy = self.anchors[&id].0.clone();
                            copy.location = at;
                            self.push(copy, size, size, 0)
                        }
                    }
                    None => Err(self.error(at, "alias to an unknown anchor")),
                },
                _ => Ok(()),
            };
            if let Err(problem) = result {
                if let Some(stopped) = self.stopped() {
                    return stopped;
                }
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
        self.charge(1, 0)?;
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
        let is_merge = |key: &Node| matches!(&key.value, Value::Scalar { text, quoted: false } if text == "<<");
        // Nearly every mapping has neither merge keys nor duplicates: keep it as it was read,
        // rather than moving its entries through two new vectors (issue 20: these moves and
        // allocations showed in `proxops validate`'s profile).
        if entries.len() <= 16
            && !entries.iter().enumerate().any(|(i, (key, _))| {
                is_merge(key) || {
                    let text = key_text(key);
                    entries[..i].iter().any(|(k, _)| key_text_eq(k, &text))
                }
            })
        {
            return entries;
        }
        let mut own = Vec::with_capacity(entries.len());
        let mut merged = Vec::new();
        for (key, value) in entries {
            if !is_merge(&key) {
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
        self.charge(added, 0)?;
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
pub(crate) mod tests {
    use super::*;

    fn one(yaml: &str) -> Document {
        let mut docs = parse_documents("t.yaml", yaml);
        assert_eq!(docs.len(), 1, "{docs:?}");
        docs.remove(0)
    }

    /// The audit's generator (SECURITY-AUDIT.md H3): an 839-byte anchored scalar, a list of
    /// 140 aliases of it and 140 aliases of that list. About 2 KB that expands to 15.8 MiB
    /// and 19,890 nodes, under every per-document limit.
    pub(crate) fn small_bomb() -> String {
        let list = vec!["*a"; 140].join(", ");
        let lists = vec!["*b"; 140].join(", ");
        format!(
            "a: &a \"{}\"\nb: &b [{list}]\nc: [{lists}]\n",
            "x".repeat(839)
        )
    }

    fn rendered(docs: &[Document]) -> Vec<String> {
        docs.iter()
            .flat_map(|d| d.problems.iter().map(ToString::to_string))
            .collect()
    }

    #[test]
    fn one_small_bomb_stays_under_every_per_document_limit() {
        let bomb = small_bomb();
        assert!(bomb.len() < 2_100, "{}", bomb.len());
        let docs = parse_documents("t.yaml", &bomb);
        assert_eq!(rendered(&docs), Vec::<String>::new());
        assert!(text_bytes(docs[0].root.as_ref().unwrap()) > 15 * 1024 * 1024);
    }

    #[test]
    fn a_file_of_many_small_bombs_stops_at_the_file_text_budget() {
        let file = vec![small_bomb(); 100].join("---\n");
        let start = std::time::Instant::now();
        let docs = parse_documents("bombs.yaml", &file);
        assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
        // The first document is whole; the second one runs out of the file's budget and the
        // remaining 98 are never read.
        assert_eq!(docs.len(), 2);
        let problems = rendered(&docs);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(
            problems[0].starts_with("bombs.yaml:7:")
                && problems[0].contains(
                    "file too large: more than 16 MiB of text across its documents after \
                     expanding aliases"
                ),
            "{problems:#?}"
        );
    }

    #[test]
    fn a_file_of_more_documents_than_the_cap_is_refused_at_the_first_one_over() {
        let file = "a: 1\n---\n".repeat(MAX_DOCUMENTS_PER_FILE + 5);
        let docs = parse_documents("many.yaml", &file);
        assert_eq!(docs.len(), MAX_DOCUMENTS_PER_FILE + 1);
        let problems = rendered(&docs);
        assert_eq!(
            problems,
            [format!(
                "many.yaml:{}:1: error: file too large: more than {MAX_DOCUMENTS_PER_FILE} YAML \
                 documents\n  help: split the manifests into several files",
                2 * MAX_DOCUMENTS_PER_FILE + 1
            )]
        );
    }

    #[test]
    fn the_revision_budget_is_shared_by_files_and_stops_the_one_that_passes_it() {
        let budget = RevisionBudget::new(RevisionLimits {
            documents: 100,
            nodes: usize::MAX,
            text_bytes: 40 * 1024 * 1024,
        });
        let read = |path: &str, contents: &str| {
            let mut docs = Vec::new();
            for_each_document(path, contents, &budget, |d| docs.push(d));
            rendered(&docs)
        };
        // Two bombs of 15.8 MiB fit in 40 MiB; the third passes it.
        assert_eq!(read("a.yaml", &small_bomb()), Vec::<String>::new());
        assert_eq!(read("b.yaml", &small_bomb()), Vec::<String>::new());
        let third = read("c.yaml", &small_bomb());
        assert_eq!(third.len(), 1, "{third:#?}");
        assert!(
            third[0].starts_with("c.yaml:3:")
                && third[0].contains(
                    "repository too large: more than 40 MiB of text after expanding aliases \
                     across all manifest files (the revision's budget ran out in this file)"
                ),
            "{third:#?}"
        );
        // Once exhausted, later files stop without a word of their own.
        assert_eq!(read("d.yaml", "x: 1\n"), Vec::<String>::new());
        assert!(budget.is_exhausted());

        let budget = RevisionBudget::new(RevisionLimits {
            documents: 2,
            nodes: 10_000,
            text_bytes: usize::MAX,
        });
        let mut docs = Vec::new();
        for_each_document("e.yaml", &small_bomb(), &budget, |d| docs.push(d));
        assert!(
            rendered(&docs)[0].contains("more than 10000 YAML nodes"),
            "{docs:#?}"
        );
        let budget = RevisionBudget::new(RevisionLimits {
            documents: 2,
            nodes: usize::MAX,
            text_bytes: usize::MAX,
        });
        let mut docs = Vec::new();
        for_each_document("f.yaml", "a: 1\n---\nb: 1\n---\nc: 1\n", &budget, |d| {
            docs.push(d);
        });
        assert_eq!(
            rendered(&docs),
            [
                "f.yaml:5:1: error: repository too large: more than 2 documents across all \
              manifest files (the revision's budget ran out in this file)\n  help: a revision \
              may hold 2 documents, 18446744073709551615 nodes and 17592186044415 MiB of text \
              after expanding aliases; check the largest files for repeated aliases, or split \
              the repository between agents"
            ]
        );
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
