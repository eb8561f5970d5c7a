//! The schema's path templates indexed by segment, built once when the schema loads.
//!
//! A lookup walks the path's segments down a tree of literal segments, one shared branch for
//! every `{param}` at that depth and the rest-of-path parameters, so it visits only the
//! templates that can match. Among the templates that match it picks the one the linear scan
//! it replaces picked: the greatest rank (per position, a literal segment beats a parameter,
//! compared position by position, as PVE's router prefers a literal), and on equal ranks the
//! first template in sorted order. `mod.rs`'s tests check that against that scan for every
//! template of the vendored schema.
//!
//! PVE routes the same way, one segment at a time down a tree (pve-common @ f665029,
//! `src/PVE/RESTHandler.pm`, `map_path_to_methods`): each level is either one `{param}`
//! (`regex`) or literal `folders`, and a `fragmentDelimiter => ''` subclass takes the rest of
//! the path as one parameter (pve-storage's `{volume}`). A level never holds both, so the
//! literal-over-parameter rank only decides between templates PVE could not register side by
//! side; it is kept from the scan so that routing is unchanged.

use std::collections::HashMap;

use super::Segment;

/// Templates by segment; template numbers are positions in the schema's sorted list.
#[derive(Debug, Default)]
pub(super) struct RouteIndex {
    root: Node,
    /// Per template, per position: whether the segment is a literal.
    ranks: Vec<Vec<bool>>,
}

#[derive(Debug, Default)]
struct Node {
    /// The next segment is this literal.
    literals: HashMap<String, Node>,
    /// The next segment is a parameter, whatever its name.
    param: Option<Box<Node>>,
    /// Templates whose next segment takes the rest of the path (one segment or more).
    rest: Vec<usize>,
    /// Templates that end here.
    end: Vec<usize>,
}

impl RouteIndex {
    /// Indexes the templates, given as their segments in sorted template order.
    pub(super) fn new<'a>(patterns: impl Iterator<Item = &'a [Segment]>) -> Self {
        let mut index = Self::default();
        for (number, pattern) in patterns.enumerate() {
            index.ranks.push(
                pattern
                    .iter()
                    .map(|s| matches!(s, Segment::Literal(_)))
                    .collect(),
            );
            let mut node = &mut index.root;
            let mut rest = false;
            for segment in pattern {
                match segment {
                    Segment::Literal(literal) => {
                        node = node.literals.entry(literal.clone()).or_default();
                    }
                    Segment::Param(_) => node = node.param.get_or_insert_with(Box::default),
                    Segment::Rest(_) => {
                        node.rest.push(number);
                        rest = true;
                        break;
                    }
                }
            }
            if !rest {
                node.end.push(number);
            }
        }
        index
    }

    /// The number of the template that `segments` (a path split at `/`, empty segments
    /// dropped) resolves to, if any matches.
    pub(super) fn best(&self, segments: &[&str]) -> Option<usize> {
        let mut best = None;
        self.visit(&self.root, segments, &mut best);
        best
    }

    fn visit(&self, node: &Node, segments: &[&str], best: &mut Option<usize>) {
        let Some((first, rest)) = segments.split_first() else {
            for &number in &node.end {
                self.offer(number, best);
            }
            return;
        };
        for &number in &node.rest {
            self.offer(number, best);
        }
        if let Some(child) = node.literals.get(*first) {
            self.visit(child, rest, best);
        }
        if let Some(child) = &node.param {
            self.visit(child, rest, best);
        }
    }

    /// Keeps `number` when it outranks the best so far, or ranks the same and sorts first.
    fn offer(&self, number: usize, best: &mut Option<usize>) {
        let better = match *best {
            None => true,
            Some(current) => match self.ranks[number].cmp(&self.ranks[current]) {
                std::cmp::Ordering::Greater => true,
                std::cmp::Ordering::Equal => number < current,
                std::cmp::Ordering::Less => false,
            },
        };
        if better {
            *best = Some(number);
        }
    }
}
