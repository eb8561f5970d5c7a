//! SOPS file text → an order-preserving tree of located YAML nodes, one per document.
//!
//! SOPS's MAC hashes the leaves in document order, and its additional data is the path of keys,
//! so the tree keeps every mapping in the order it was written and every key's line and column.
//! It is built on serde-saphyr's event parser (`granit_parser`), like the manifest reader in
//! `proxops-core`, and keeps each scalar's raw text and whether it was quoted: whether a clear
//! `true` is the boolean `True` or the string `true` changes the MAC. JSON is read the same way
//! (it is YAML flow syntax). Aliases are refused and the tree is bounded in size and depth, so
//! a hostile file cannot blow up the agent. Nothing here decrypts or reads files.
//!
//! `proxops-core` has a located tree of its own for manifests (`manifest/yaml.rs`); this one
//! exists because SOPS needs what that one drops: each scalar's raw text and quoting, and every
//! key and sequence item's enclosing path, which places encrypted comments.

use serde_saphyr::granit_parser::{self, Event, Marker, Parser, ScalarStyle, ScanError};

/// Most nodes one file may hold. A SOPS document of keys and passwords has a few hundred.
const MAX_NODES: usize = 100_000;
/// Deepest nesting of sequences and mappings.
const MAX_DEPTH: usize = 64;

/// One YAML node and where it starts (1-based line and column).
#[derive(Clone, PartialEq)]
pub struct Node {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// The node itself.
    pub value: Value,
}

/// The content of a node. Deliberately without `Debug`: scalars may be secrets.
#[derive(Clone, PartialEq)]
pub enum Value {
    /// `~`, `null`, or nothing at all.
    Null,
    /// Any other scalar, as written (after YAML escapes).
    Scalar {
        /// The text.
        text: String,
        /// Quoted, block or `!!str`-tagged: always a string, never a number or boolean.
        quoted: bool,
    },
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping in document order; keys are scalars.
    Map(Vec<(Key, Node)>),
}

/// A mapping key and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// The key's text.
    pub text: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

impl Node {
    /// The value under `key` when this is a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(entries) => entries.iter().find(|(k, _)| k.text == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The text of a scalar.
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The entries of a mapping (empty for anything else).
    pub fn entries(&self) -> &[(Key, Node)] {
        match &self.value {
            Value::Map(entries) => entries,
            _ => &[],
        }
    }
}

/// The documents of a file and the line ranges its multi-line scalars cover.
pub struct Parsed {
    /// Every non-empty document, in order.
    pub documents: Vec<Node>,
    /// Every mapping key and sequence item with the path of keys that encloses it: where
    /// comment lines are placed (see [`SopsDocument::comments`](crate::SopsDocument::comments)).
    pub anchors: Vec<Anchor>,
    /// `(first, last)` lines of scalars that span several lines; `#` lines inside are text.
    pub multiline: Vec<(usize, usize)>,
}

/// A mapping key or sequence start, with the keys of the mapping or sequence it belongs to.
#[derive(Debug, Clone)]
pub struct Anchor {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// The keys from the document root to the enclosing collection.
    pub parent: Vec<String>,
    /// The keys to the node itself (the key's own path; for a sequence, its path).
    pub own: Vec<String>,
}

/// Why the text is not a YAML document this reader accepts. Never holds file content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong, as a lowercase fragment.
    pub message: String,
}

enum Frame {
    Seq {
        line: usize,
        column: usize,
        items: Vec<Node>,
    },
    Map {
        line: usize,
        column: usize,
        entries: Vec<(Key, Node)>,
        key: Option<Key>,
    },
}

/// Parses every document of `text`.
pub fn parse(text: &str) -> Result<Parsed, SyntaxError> {
    let mut options = granit_parser::Options::default();
    options.flow_nesting_limit = MAX_DEPTH + 8;
    options.block_nesting_limit = MAX_DEPTH + 8;
    let mut parser = Parser::new_from_str_with_options(text, options);
    let mut builder = Builder::default();
    loop {
        let (event, span) = match parser.next_event() {
            None => break,
            Some(Err(error)) => return Err(scan_error(&error)),
            Some(Ok(pair)) => pair,
        };
        let (line, column) = position(&span.start);
        match event {
            Event::StreamEnd => break,
            Event::DocumentEnd => {
                if let Some(root) = builder.root.take()
                    && root.value != Value::Null
                {
                    builder.documents.push(root);
                }
            }
            Event::Scalar(text, style, _, tag) => {
                let core = tag
                    .as_ref()
                    .and_then(|t| t.core_suffix().map(str::to_owned));
                let quoted = !matches!(style, ScalarStyle::Plain);
                if matches!(style, ScalarStyle::Literal | ScalarStyle::Folded)
                    || span.end.line() > span.start.line()
                {
                    builder.multiline.push((span.start.line(), span.end.line()));
                }
                let value = match core.as_deref() {
                    Some("str" | "binary") => Value::Scalar {
                        text: text.into_owned(),
                        quoted: true,
                    },
                    Some("null") => Value::Null,
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
                builder.push(Node {
                    line,
                    column,
                    value,
                })?;
            }
            Event::SequenceStart(..) => {
                let own = builder.own_path();
                builder.anchors.push(Anchor {
                    line,
                    column,
                    parent: own.clone(),
                    own,
                });
                builder.open(Frame::Seq {
                    line,
                    column,
                    items: Vec::new(),
                })?;
            }
            Event::MappingStart(..) => builder.open(Frame::Map {
                line,
                column,
                entries: Vec::new(),
                key: None,
            })?,
            Event::SequenceEnd | Event::MappingEnd => builder.close()?,
            Event::Alias(_) | Event::UnresolvedAlias(_) => {
                return Err(SyntaxError {
                    line,
                    column,
                    message: "YAML aliases are not supported in a SOPS file".to_owned(),
                });
            }
            _ => {}
        }
    }
    Ok(Parsed {
        documents: builder.documents,
        anchors: builder.anchors,
        multiline: builder.multiline,
    })
}

fn position(marker: &Marker) -> (usize, usize) {
    (marker.line(), marker.col() + 1)
}

fn scan_error(error: &ScanError) -> SyntaxError {
    let (line, column) = position(error.marker());
    SyntaxError {
        line,
        column,
        message: format!("invalid YAML: {}", error.kind()),
    }
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    root: Option<Node>,
    documents: Vec<Node>,
    anchors: Vec<Anchor>,
    multiline: Vec<(usize, usize)>,
    nodes: usize,
}

impl Builder {
    /// The keys from the root to the node about to be pushed.
    fn own_path(&self) -> Vec<String> {
        let mut path = Vec::new();
        for frame in &self.stack {
            if let Frame::Map { key: Some(key), .. } = frame {
                path.push(key.text.clone());
            }
        }
        path
    }

    fn count(&mut self, line: usize, column: usize) -> Result<(), SyntaxError> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(SyntaxError {
                line,
                column,
                message: format!("file too large: more than {MAX_NODES} YAML nodes"),
            });
        }
        Ok(())
    }

    fn open(&mut self, frame: Frame) -> Result<(), SyntaxError> {
        let (line, column) = match &frame {
            Frame::Seq { line, column, .. } | Frame::Map { line, column, .. } => (*line, *column),
        };
        if self.stack.len() >= MAX_DEPTH {
            return Err(SyntaxError {
                line,
                column,
                message: format!("nesting deeper than {MAX_DEPTH} levels"),
            });
        }
        self.count(line, column)?;
        self.stack.push(frame);
        Ok(())
    }

    fn close(&mut self) -> Result<(), SyntaxError> {
        let Some(frame) = self.stack.pop() else {
            return Ok(());
        };
        let node = match frame {
            Frame::Seq {
                line,
                column,
                items,
            } => Node {
                line,
                column,
                value: Value::Seq(items),
            },
            Frame::Map {
                line,
                column,
                entries,
                ..
            } => Node {
                line,
                column,
                value: Value::Map(entries),
            },
        };
        self.attach(node)
    }

    fn push(&mut self, node: Node) -> Result<(), SyntaxError> {
        self.count(node.line, node.column)?;
        self.attach(node)
    }

    fn attach(&mut self, node: Node) -> Result<(), SyntaxError> {
        let parent_path = self.own_path();
        match self.stack.last_mut() {
            None => {
                self.root = Some(node);
                Ok(())
            }
            Some(Frame::Seq { items, .. }) => {
                items.push(node);
                Ok(())
            }
            Some(Frame::Map { entries, key, .. }) => match key.take() {
                Some(k) => {
                    entries.push((k, node));
                    Ok(())
                }
                None => {
                    let Value::Scalar { text, .. } = node.value else {
                        return Err(SyntaxError {
                            line: node.line,
                            column: node.column,
                            message: "a mapping key is not a string".to_owned(),
                        });
                    };
                    if entries.iter().any(|(k, _)| k.text == text) {
                        return Err(SyntaxError {
                            line: node.line,
                            column: node.column,
                            message: format!("duplicate key `{text}`"),
                        });
                    }
                    let mut own = parent_path.clone();
                    own.push(text.clone());
                    self.anchors.push(Anchor {
                        line: node.line,
                        column: node.column,
                        parent: parent_path,
                        own,
                    });
                    *key = Some(Key {
                        text,
                        line: node.line,
                        column: node.column,
                    });
                    Ok(())
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_keep_document_order_and_locations() {
        let parsed = parse("b: 1\na:\n  z: 'x'\n  y: [1, 2]\n").unwrap();
        let root = &parsed.documents[0];
        let keys: Vec<&str> = root
            .entries()
            .iter()
            .map(|(k, _)| k.text.as_str())
            .collect();
        assert_eq!(keys, ["b", "a"]);
        let a = root.get("a").unwrap();
        assert_eq!(a.entries()[0].0.line, 3);
        assert_eq!(a.entries()[0].0.column, 3);
        assert!(matches!(
            a.get("z").unwrap().value,
            Value::Scalar { quoted: true, .. }
        ));
    }

    #[test]
    fn aliases_and_duplicate_keys_are_refused() {
        let e = parse("a: &x 1\nb: *x\n").err().unwrap();
        assert!(e.message.contains("aliases"), "{}", e.message);
        let e = parse("a: 1\na: 2\n").err().unwrap();
        assert_eq!((e.line, e.message.as_str()), (2, "duplicate key `a`"));
    }

    #[test]
    fn anchors_record_the_enclosing_keys() {
        let parsed = parse("a:\n    b:\n        c: 1\n").unwrap();
        let c = parsed.anchors.iter().find(|a| a.line == 3).unwrap();
        assert_eq!(c.parent, ["a", "b"]);
        assert_eq!(c.own, ["a", "b", "c"]);
    }
}
