//! A serde deserializer over the located YAML tree that records problems instead of stopping.
//!
//! serde's derived `Deserialize` gives up at the first error. This deserializer never hands it
//! one for a problem in the input: an unknown key is reported (with a "did you mean") and
//! skipped, a value of the wrong type or an unknown enum word is reported and replaced by a
//! placeholder (`0`, `""`, `false`, an empty list or mapping, the first variant), so decoding
//! runs to the end and every problem of the document is found in one pass. Validation then
//! skips checks under a field that already has a problem (see [`is_reported`]), so one mistake
//! gives one message.
//!
//! The raw types are therefore written with every field optional (`Option` or
//! `#[serde(default)]`); required fields are checked by validation, which knows where the
//! parent mapping is. Messages never name Rust types.

use std::cell::RefCell;
use std::fmt::{self, Display};

use serde::de::value::StrDeserializer;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};

use super::raw::QUANTITY;
use super::yaml::{Node, Value, parse_bool};
use crate::diagnostic::Diagnostic;

/// An error serde itself raised; it only ever happens for a raw type this module cannot serve,
/// which is a bug, and is still reported as a diagnostic rather than a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct DecodeError(String);

impl de::Error for DecodeError {
    fn custom<T: Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

/// A field path built up while descending, rendered only when a problem is recorded.
#[derive(Clone, Copy)]
struct FieldPath<'a> {
    parent: Option<&'a FieldPath<'a>>,
    segment: Segment<'a>,
}

#[derive(Clone, Copy)]
enum Segment<'a> {
    Root,
    Key(&'a str),
    Index(usize),
}

impl FieldPath<'_> {
    fn render(&self) -> String {
        let mut parts = Vec::new();
        let mut at = Some(self);
        while let Some(p) = at {
            parts.push(p.segment);
            at = p.parent;
        }
        let mut out = String::new();
        for segment in parts.iter().rev() {
            match segment {
                Segment::Root => {}
                Segment::Key(key) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(key);
                }
                Segment::Index(i) => {
                    out.push('[');
                    out.push_str(&i.to_string());
                    out.push(']');
                }
            }
        }
        out
    }
}

/// Where problems go while decoding one document.
struct Sink<'f> {
    file: &'f str,
    problems: RefCell<Vec<Diagnostic>>,
}

/// Decodes `node` into `T`, appending every problem to `problems`. `None` only if serde
/// raised an error of its own (reported too).
pub(crate) fn decode<T: DeserializeOwned>(
    file: &str,
    node: &Node,
    problems: &mut Vec<Diagnostic>,
) -> Option<T> {
    let sink = Sink {
        file,
        problems: RefCell::new(Vec::new()),
    };
    let root = FieldPath {
        parent: None,
        segment: Segment::Root,
    };
    let result = T::deserialize(NodeDeserializer {
        node,
        path: root,
        sink: &sink,
    });
    problems.extend(sink.problems.into_inner());
    match result {
        Ok(value) => Some(value),
        Err(DecodeError(message)) => {
            problems.push(Diagnostic::error(
                file,
                node.location.line,
                node.location.column,
                "",
                message,
            ));
            None
        }
    }
}

/// Whether a problem was already reported at `field` or at one of its parents.
pub(crate) fn is_reported(problems: &[Diagnostic], field: &str) -> bool {
    problems.iter().any(|p| {
        p.field == field
            || (field.starts_with(p.field.as_str())
                && matches!(field.as_bytes().get(p.field.len()), Some(b'.' | b'[')))
    })
}

/// The closest of `candidates` to a misspelt `word`, if any is close enough to suggest.
pub(crate) fn did_you_mean<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let normal = word.to_ascii_lowercase().replace('_', "-");
    if let Some(exact) = candidates.iter().find(|c| c.eq_ignore_ascii_case(&normal)) {
        return Some(exact);
    }
    // `virtio-net` for `virtio`: a known word with something added or cut off.
    let affix = |c: &str| {
        c.len() >= 3
            && normal
                .strip_prefix(c)
                .is_some_and(|rest| rest.starts_with(|r: char| !r.is_ascii_alphanumeric()))
    };
    if let Some(c) = candidates
        .iter()
        .filter(|c| affix(&c.to_ascii_lowercase()))
        .max_by_key(|c| c.len())
    {
        return Some(c);
    }
    candidates
        .iter()
        .map(|c| (strsim::osa_distance(&normal, &c.to_ascii_lowercase()), *c))
        .filter(|(distance, c)| *distance <= 3 && distance * 3 <= c.len().max(normal.len()))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, c)| c)
}

/// `a`, `b` and `c` as a list for messages.
pub(crate) fn one_of(words: &[&str]) -> String {
    words
        .iter()
        .map(|w| format!("`{w}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

struct NodeDeserializer<'a> {
    node: &'a Node,
    path: FieldPath<'a>,
    sink: &'a Sink<'a>,
}

impl NodeDeserializer<'_> {
    fn report(&self, at: &Node, message: String, help: Option<String>) {
        let mut d = Diagnostic::error(
            self.sink.file,
            at.location.line,
            at.location.column,
            self.path.render(),
            message,
        );
        d.help = help;
        self.sink.problems.borrow_mut().push(d);
    }

    fn mismatch(&self, expected: &str) {
        self.report(
            self.node,
            format!("expected {expected}, found {}", self.node.describe()),
            None,
        );
    }

    /// The text of a plain (unquoted) scalar: what may be a number or a boolean.
    fn plain(&self) -> Option<&str> {
        match &self.node.value {
            Value::Scalar {
                text,
                quoted: false,
            } => Some(text),
            _ => None,
        }
    }

    fn integer(&self, min: i128, max: i128) -> i128 {
        let text = self.plain().map(str::trim);
        match text.and_then(|t| t.parse::<i128>().ok()) {
            Some(n) if (min..=max).contains(&n) => n,
            Some(n) if n < min && min == 0 => {
                self.report(
                    self.node,
                    format!("expected a whole number, found `{n}`"),
                    None,
                );
                0
            }
            Some(n) if n < min => {
                self.report(
                    self.node,
                    format!("`{n}` is too small (at least {min})"),
                    None,
                );
                0
            }
            Some(n) => {
                self.report(
                    self.node,
                    format!("`{n}` is too large (at most {max})"),
                    None,
                );
                0
            }
            None if text
                .is_some_and(|t| t.bytes().all(|b| b.is_ascii_digit()) && !t.is_empty()) =>
            {
                self.report(
                    self.node,
                    format!(
                        "`{}` is too large (at most {max})",
                        text.unwrap_or_default()
                    ),
                    None,
                );
                0
            }
            None => {
                self.mismatch(if min >= 0 {
                    "a whole number"
                } else {
                    "an integer"
                });
                0
            }
        }
    }
}

macro_rules! integer {
    ($method:ident, $visit:ident, $ty:ty) => {
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
            let n = self.integer(i128::from(<$ty>::MIN), i128::from(<$ty>::MAX));
            visitor.$visit(<$ty>::try_from(n).unwrap_or_default())
        }
    };
}

impl<'de> de::Deserializer<'de> for NodeDeserializer<'_> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match &self.node.value {
            Value::Null => visitor.visit_unit(),
            Value::Scalar { text, quoted: true } => visitor.visit_string(text.clone()),
            Value::Scalar {
                text,
                quoted: false,
            } => {
                if let Some(b) = parse_bool(text) {
                    visitor.visit_bool(b)
                } else if let Ok(n) = text.parse::<u64>() {
                    visitor.visit_u64(n)
                } else if let Ok(n) = text.parse::<i64>() {
                    visitor.visit_i64(n)
                } else if let Ok(n) = text.parse::<f64>() {
                    visitor.visit_f64(n)
                } else {
                    visitor.visit_string(text.clone())
                }
            }
            Value::Seq(_) => self.deserialize_seq(visitor),
            Value::Map(_) => self.deserialize_map(visitor),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.plain().and_then(parse_bool) {
            Some(b) => visitor.visit_bool(b),
            None => {
                self.mismatch("`true` or `false`");
                visitor.visit_bool(false)
            }
        }
    }

    integer!(deserialize_i8, visit_i8, i8);
    integer!(deserialize_i16, visit_i16, i16);
    integer!(deserialize_i32, visit_i32, i32);
    integer!(deserialize_i64, visit_i64, i64);
    integer!(deserialize_u8, visit_u8, u8);
    integer!(deserialize_u16, visit_u16, u16);
    integer!(deserialize_u32, visit_u32, u32);
    integer!(deserialize_u64, visit_u64, u64);

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self
            .plain()
            .and_then(|t| t.parse::<f64>().ok())
            .filter(|n| n.is_finite())
        {
            Some(n) => visitor.visit_f64(n),
            None => {
                self.mismatch("a number");
                visitor.visit_f64(0.0)
            }
        }
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_string(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_string(visitor)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match &self.node.value {
            // A plain `8080` or `true` is text when text is wanted, as in the Go program.
            Value::Scalar { text, .. } => visitor.visit_string(text.clone()),
            _ => {
                self.mismatch("a string");
                visitor.visit_string(String::new())
            }
        }
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_string(visitor)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_string(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.node.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        if self.node.value != Value::Null {
            self.mismatch("nothing");
        }
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        if name == QUANTITY && !matches!(self.node.value, Value::Scalar { .. }) {
            self.mismatch("a quantity such as `4GiB`");
            let empty: StrDeserializer<'_, DecodeError> = "".into_deserializer();
            return visitor.visit_newtype_struct(empty);
        }
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match &self.node.value {
            Value::Seq(items) => visitor.visit_seq(Items {
                items,
                next: 0,
                path: self.path,
                sink: self.sink,
            }),
            _ => {
                self.mismatch("a list");
                visitor.visit_seq(Items {
                    items: &[],
                    next: 0,
                    path: self.path,
                    sink: self.sink,
                })
            }
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.entries(None, visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.entries(Some(fields), visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        let text = self.node.as_str();
        let chosen = match text {
            Some(t) if variants.contains(&t) => t,
            _ => {
                let found = match text {
                    Some(t) => format!("`{t}`"),
                    None => self.node.describe().to_owned(),
                };
                let help = text
                    .and_then(|t| did_you_mean(t, variants))
                    .map(|s| format!("did you mean `{s}`?"));
                self.report(
                    self.node,
                    format!("expected one of {}, found {found}", one_of(variants)),
                    help,
                );
                variants.first().copied().unwrap_or_default()
            }
        };
        let word: StrDeserializer<'_, DecodeError> = chosen.into_deserializer();
        visitor.visit_enum(word)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_string(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_unit()
    }
}

impl<'a> NodeDeserializer<'a> {
    /// A mapping; with `fields`, a struct whose unknown keys are reported and skipped.
    fn entries<'de, V: Visitor<'de>>(
        self,
        fields: Option<&'static [&'static str]>,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        let Value::Map(entries) = &self.node.value else {
            self.mismatch("a mapping");
            return visitor.visit_map(Entries {
                entries: Vec::new(),
                next: 0,
                path: self.path,
                sink: self.sink,
            });
        };
        let mut kept = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            let Some(name) = key.as_str() else {
                self.report(
                    key,
                    format!("expected a key name, found {}", key.describe()),
                    None,
                );
                continue;
            };
            if let Some(fields) = fields
                && !fields.contains(&name)
            {
                let help = match did_you_mean(name, fields) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => format!("expected one of {}", one_of(fields)),
                };
                let path = FieldPath {
                    parent: Some(&self.path),
                    segment: Segment::Key(name),
                };
                let mut d = Diagnostic::error(
                    self.sink.file,
                    key.location.line,
                    key.location.column,
                    path.render(),
                    format!("unknown key `{name}`"),
                );
                d.help = Some(help);
                self.sink.problems.borrow_mut().push(d);
                continue;
            }
            kept.push((name, value));
        }
        visitor.visit_map(Entries {
            entries: kept,
            next: 0,
            path: self.path,
            sink: self.sink,
        })
    }
}

struct Items<'a> {
    items: &'a [Node],
    next: usize,
    path: FieldPath<'a>,
    sink: &'a Sink<'a>,
}

impl<'de> de::SeqAccess<'de> for Items<'_> {
    type Error = DecodeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DecodeError> {
        let Some(node) = self.items.get(self.next) else {
            return Ok(None);
        };
        let path = FieldPath {
            parent: Some(&self.path),
            segment: Segment::Index(self.next),
        };
        self.next += 1;
        seed.deserialize(NodeDeserializer {
            node,
            path,
            sink: self.sink,
        })
        .map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len() - self.next)
    }
}

struct Entries<'a> {
    entries: Vec<(&'a str, &'a Node)>,
    next: usize,
    path: FieldPath<'a>,
    sink: &'a Sink<'a>,
}

impl<'de> de::MapAccess<'de> for Entries<'_> {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DecodeError> {
        let Some((key, _)) = self.entries.get(self.next) else {
            return Ok(None);
        };
        let key: StrDeserializer<'_, DecodeError> = key.into_deserializer();
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, DecodeError> {
        let Some(&(key, node)) = self.entries.get(self.next) else {
            return Err(DecodeError("value without a key".to_owned()));
        };
        self.next += 1;
        let path = FieldPath {
            parent: Some(&self.path),
            segment: Segment::Key(key),
        };
        seed.deserialize(NodeDeserializer {
            node,
            path,
            sink: self.sink,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len() - self.next)
    }
}

impl fmt::Debug for FieldPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}
