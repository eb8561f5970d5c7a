//! The per-document validation context: where problems go and how they are located.
//!
//! Checks name a field by its path (`spec.disks[1].size`); the location is looked up in the
//! document's tree only when a problem is reported, so valid documents pay nothing for it.

use super::Location;
use super::decode::is_reported;
use super::yaml::{Node, Segment, Value, path_segments};
use crate::diagnostic::Diagnostic;

/// Collects the problems of one document.
pub(crate) struct Checker<'a> {
    /// Repository-relative path of the file.
    pub(crate) file: &'a str,
    /// The document's root node.
    pub(crate) root: &'a Node,
    /// Problems so far, including those found while decoding.
    pub(crate) problems: Vec<Diagnostic>,
}

impl<'a> Checker<'a> {
    /// A context for the document at `root`.
    pub(crate) fn new(file: &'a str, root: &'a Node) -> Self {
        Self {
            file,
            root,
            problems: Vec::new(),
        }
    }

    /// Where the value at `field` is (or its nearest existing parent).
    pub(crate) fn location(&self, field: &str) -> Location {
        self.root.locate(field).location
    }

    /// Reports a problem with the value at `field`, with a fix.
    pub(crate) fn error_help(
        &mut self,
        field: &str,
        message: impl Into<String>,
        help: impl Into<String>,
    ) {
        let at = self.location(field);
        self.problems
            .push(Diagnostic::error(self.file, at.line, at.column, field, message).with_help(help));
    }

    /// Reports a problem at the key of `field` (for problems about the key, not its value).
    pub(crate) fn error_at_key(
        &mut self,
        field: &str,
        message: impl Into<String>,
        help: impl Into<String>,
    ) {
        let at = self.key_location(field);
        self.problems
            .push(Diagnostic::error(self.file, at.line, at.column, field, message).with_help(help));
    }

    /// Whether a problem is already reported at `field` or above it.
    pub(crate) fn reported(&self, field: &str) -> bool {
        is_reported(&self.problems, field)
    }

    /// Whether the document has any error so far.
    pub(crate) fn has_errors(&self) -> bool {
        self.problems.iter().any(Diagnostic::is_error)
    }

    /// Reports that the required `field` is absent, at the key of its parent mapping.
    pub(crate) fn missing(&mut self, field: &str, help: Option<String>) {
        let parent = parent_of(field);
        if self.reported(field) || (!parent.is_empty() && self.reported(parent)) {
            return;
        }
        let at = if parent.is_empty() {
            self.root.location
        } else {
            self.key_location(parent)
        };
        let mut d = Diagnostic::error(
            self.file,
            at.line,
            at.column,
            field,
            "missing required field",
        );
        d.help = help;
        self.problems.push(d);
    }

    /// The value of a required field, reporting it when absent.
    pub(crate) fn required<'v, T>(&mut self, value: &'v Option<T>, field: &str) -> Option<&'v T> {
        if value.is_none() {
            self.missing(field, None);
        }
        value.as_ref()
    }

    /// Where the key of `field` is (`spec:` for `spec`), or the value for list items.
    fn key_location(&self, field: &str) -> Location {
        let segments: Vec<Segment<'_>> = path_segments(field).collect();
        let Some((last, parents)) = segments.split_last() else {
            return self.root.location;
        };
        let mut node = self.root;
        for segment in parents {
            let next = match segment {
                Segment::Key(key) => node.get(key),
                Segment::Index(i) => match &node.value {
                    Value::Seq(items) => items.get(*i),
                    _ => None,
                },
            };
            match next {
                Some(next) => node = next,
                None => return node.location,
            }
        }
        match last {
            Segment::Key(key) => node.key_node(key).map_or(node.location, |k| k.location),
            Segment::Index(_) => self.location(field),
        }
    }
}

/// `spec.disks[1]` for `spec.disks[1].size`, `spec.disks` for `spec.disks[1]`, `` for `spec`.
pub(crate) fn parent_of(field: &str) -> &str {
    match field.rfind(['.', '[']) {
        Some(i) => &field[..i],
        None => "",
    }
}
