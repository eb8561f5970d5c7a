//! The dependency graph of one desired state and its levels.
//!
//! Edges come from each resource's references (structured fields and `proxops/depends-on`);
//! a resource is one level above its deepest prerequisite, so resources without prerequisites
//! (every artifact) are at level 0. Levels are sorted by [`ResourceId`] and never depend on the
//! order resources were given in. A graph with cycles has no levels: every cycle is reported
//! instead. References to resources that are not in the graph are ignored here; reporting them
//! is [`crate::desired::Manifest`]'s job.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use crate::desired::Manifest;
use crate::diagnostic::Diagnostic;
use crate::manifest::{Location, Resource};
use crate::resource::ResourceId;

/// Which resources must exist before which, over one desired state.
#[derive(Debug, Clone, Default)]
pub struct DependencyGraph {
    /// Every resource, sorted; a node's index is its position here.
    ids: Vec<ResourceId>,
    /// The file each resource came from, for locating cycles.
    paths: Vec<String>,
    /// Per node, its distinct prerequisites sorted by index.
    prerequisites: Vec<Vec<Edge>>,
}

/// One "depends on" edge, kept with the reference that made it.
#[derive(Debug, Clone)]
struct Edge {
    target: usize,
    field: String,
    location: Location,
}

/// A dependency cycle: each member depends on the next, and the last on the first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The members in dependency order, starting with the smallest id; not repeated at the end.
    pub members: Vec<ResourceId>,
    /// File of the first member.
    pub path: String,
    /// The first member's field that references the second member.
    pub field: String,
    /// Where that reference is.
    pub location: Location,
}

impl Cycle {
    /// The validation error for this cycle, located at the first member's reference.
    pub fn to_diagnostic(&self) -> Diagnostic {
        Diagnostic::error(
            &self.path,
            self.location.line,
            self.location.column,
            &self.field,
            format!("cycle: {self}"),
        )
        .with_help("remove one of these references; a resource cannot wait for itself")
    }
}

impl fmt::Display for Cycle {
    /// `VM/a -> LXC/b -> VM/a`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for member in &self.members {
            write!(f, "{member} -> ")?;
        }
        match self.members.first() {
            Some(first) => write!(f, "{first}"),
            None => Ok(()),
        }
    }
}

impl DependencyGraph {
    /// The graph of a validated manifest.
    pub fn from_manifest(manifest: &Manifest) -> Self {
        Self::from_resources(manifest.resources())
    }

    /// The graph of some resources. When an id occurs twice, the first occurrence counts.
    pub fn from_resources<'a>(resources: impl IntoIterator<Item = &'a Resource>) -> Self {
        let mut by_id: BTreeMap<&ResourceId, &Resource> = BTreeMap::new();
        for resource in resources {
            by_id.entry(&resource.id).or_insert(resource);
        }
        let ids: Vec<ResourceId> = by_id.keys().map(|id| (*id).clone()).collect();
        let index: BTreeMap<&ResourceId, usize> =
            by_id.keys().enumerate().map(|(i, id)| (*id, i)).collect();

        let mut paths = Vec::with_capacity(ids.len());
        let mut prerequisites = Vec::with_capacity(ids.len());
        for resource in by_id.values() {
            paths.push(resource.path.clone());
            // One edge per distinct target: the first reference in document order names it.
            let mut edges: BTreeMap<usize, Edge> = BTreeMap::new();
            for reference in &resource.references {
                if let Some(&target) = index.get(&reference.target) {
                    edges.entry(target).or_insert_with(|| Edge {
                        target,
                        field: reference.field.clone(),
                        location: reference.location,
                    });
                }
            }
            prerequisites.push(edges.into_values().collect());
        }
        Self {
            ids,
            paths,
            prerequisites,
        }
    }

    /// Number of resources.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the graph has no resources.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The resources `id` depends on directly, sorted; empty for an unknown id.
    pub fn prerequisites(&self, id: &ResourceId) -> Vec<&ResourceId> {
        match self.ids.binary_search(id) {
            Ok(i) => self.prerequisites[i]
                .iter()
                .map(|e| &self.ids[e.target])
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Resources grouped by level, each level sorted by id.
    ///
    /// # Errors
    ///
    /// Every cycle, when the graph has any (see [`DependencyGraph::cycles`]).
    pub fn levels(&self) -> Result<Vec<Vec<ResourceId>>, Vec<Cycle>> {
        let n = self.ids.len();
        let mut dependants: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut waiting: Vec<usize> = vec![0; n];
        for (node, edges) in self.prerequisites.iter().enumerate() {
            waiting[node] = edges.len();
            for edge in edges {
                dependants[edge.target].push(node);
            }
        }

        let mut level = vec![0usize; n];
        let mut ready: VecDeque<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
        let mut placed = 0;
        while let Some(node) = ready.pop_front() {
            placed += 1;
            for &dependant in &dependants[node] {
                level[dependant] = level[dependant].max(level[node] + 1);
                waiting[dependant] -= 1;
                if waiting[dependant] == 0 {
                    ready.push_back(dependant);
                }
            }
        }
        if placed < n {
            return Err(self.cycles());
        }

        let depth = level.iter().max().map_or(0, |deepest| deepest + 1);
        let mut levels: Vec<Vec<ResourceId>> = vec![Vec::new(); depth];
        // Indices follow id order, so each level comes out sorted.
        for (node, &l) in level.iter().enumerate() {
            levels[l].push(self.ids[node].clone());
        }
        Ok(levels)
    }

    /// Every cycle, sorted by members; empty when the graph is acyclic.
    ///
    /// Each strongly connected component with an edge inside it yields cycles until every one of
    /// its members is named by at least one; each reported cycle is a simple cycle (no member
    /// twice), found by a shortest path, so the same graph always yields the same cycles.
    pub fn cycles(&self) -> Vec<Cycle> {
        let mut cycles = Vec::new();
        for component in self.strongly_connected_components() {
            let inside = |node: usize| component.binary_search(&node).is_ok();
            let is_cyclic = component.len() > 1
                || self.prerequisites[component[0]]
                    .iter()
                    .any(|e| e.target == component[0]);
            if !is_cyclic {
                continue;
            }
            let mut named = vec![false; component.len()];
            for (position, &start) in component.iter().enumerate() {
                if named[position] {
                    continue;
                }
                let members = self.shortest_cycle_through(start, &inside);
                for member in &members {
                    if let Ok(p) = component.binary_search(member) {
                        named[p] = true;
                    }
                }
                cycles.push(self.cycle_from(members));
            }
        }
        cycles.sort_by(|a, b| a.members.cmp(&b.members));
        cycles.dedup();
        cycles
    }

    /// A shortest path from `start` back to `start` inside one component (breadth first over
    /// prerequisites in index order). The component is strongly connected, so one exists.
    fn shortest_cycle_through(&self, start: usize, inside: &dyn Fn(usize) -> bool) -> Vec<usize> {
        let mut parent: BTreeMap<usize, usize> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        while let Some(node) = queue.pop_front() {
            for edge in &self.prerequisites[node] {
                if edge.target == start {
                    let mut members = vec![node];
                    let mut current = node;
                    while current != start {
                        current = parent[&current];
                        members.push(current);
                    }
                    members.reverse();
                    return members;
                }
                if inside(edge.target) && !parent.contains_key(&edge.target) {
                    parent.insert(edge.target, node);
                    queue.push_back(edge.target);
                }
            }
        }
        vec![start]
    }

    /// Names a cycle of node indices, rotated to start at its smallest member.
    fn cycle_from(&self, mut members: Vec<usize>) -> Cycle {
        if let Some(smallest) = members
            .iter()
            .enumerate()
            .min_by_key(|(_, m)| **m)
            .map(|(i, _)| i)
        {
            members.rotate_left(smallest);
        }
        let first = members[0];
        let next = members.get(1).copied().unwrap_or(first);
        let edge = self.prerequisites[first].iter().find(|e| e.target == next);
        Cycle {
            members: members.iter().map(|&m| self.ids[m].clone()).collect(),
            path: self.paths[first].clone(),
            field: edge.map(|e| e.field.clone()).unwrap_or_default(),
            location: edge.map(|e| e.location).unwrap_or_default(),
        }
    }

    /// Tarjan's algorithm without recursion (a long chain of depends-on must not overflow the
    /// stack). Each component comes back sorted by index.
    fn strongly_connected_components(&self) -> Vec<Vec<usize>> {
        const UNVISITED: usize = usize::MAX;
        let n = self.ids.len();
        let mut index = vec![UNVISITED; n];
        let mut lowlink = vec![0; n];
        let mut on_stack = vec![false; n];
        let mut stack = Vec::new();
        let mut components = Vec::new();
        let mut counter = 0;
        // (node, next edge to look at)
        let mut work: Vec<(usize, usize)> = Vec::new();

        for root in 0..n {
            if index[root] != UNVISITED {
                continue;
            }
            work.push((root, 0));
            while let Some(&mut (node, ref mut next)) = work.last_mut() {
                if *next == 0 && index[node] == UNVISITED {
                    index[node] = counter;
                    lowlink[node] = counter;
                    counter += 1;
                    stack.push(node);
                    on_stack[node] = true;
                }
                if let Some(edge) = self.prerequisites[node].get(*next) {
                    *next += 1;
                    let target = edge.target;
                    if index[target] == UNVISITED {
                        work.push((target, 0));
                    } else if on_stack[target] {
                        lowlink[node] = lowlink[node].min(index[target]);
                    }
                    continue;
                }
                work.pop();
                if let Some(&(parent, _)) = work.last() {
                    lowlink[parent] = lowlink[parent].min(lowlink[node]);
                }
                if lowlink[node] == index[node] {
                    let mut component = Vec::new();
                    while let Some(member) = stack.pop() {
                        on_stack[member] = false;
                        component.push(member);
                        if member == node {
                            break;
                        }
                    }
                    component.sort_unstable();
                    components.push(component);
                }
            }
        }
        components
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::desired::fixture::{ResourceFixture, iso, lxc, vm};
    use crate::resource::Kind;

    fn id(kind: Kind, name: &str) -> ResourceId {
        ResourceId::new(kind, name)
    }

    #[test]
    fn levels_put_every_prerequisite_below_its_dependant() {
        let resources = [
            vm("web", "pve1", 100)
                .with_iso("netinst")
                .depending_on(Kind::Lxc, "db"),
            lxc("db", "pve1", 101).depending_on(Kind::Iso, "netinst"),
            iso("netinst", &["pve1"]),
            vm("lonely", "pve1", 102),
        ];
        let levels = DependencyGraph::from_resources(&resources)
            .levels()
            .expect("acyclic");
        assert_eq!(
            levels,
            vec![
                vec![id(Kind::Iso, "netinst"), id(Kind::Vm, "lonely")],
                vec![id(Kind::Lxc, "db")],
                vec![id(Kind::Vm, "web")],
            ]
        );
    }

    #[test]
    fn empty_graph_has_no_levels() {
        assert_eq!(DependencyGraph::default().levels(), Ok(Vec::new()));
    }

    #[test]
    fn references_to_undeclared_resources_are_ignored() {
        let resources = [vm("web", "pve1", 100).with_iso("missing")];
        let graph = DependencyGraph::from_resources(&resources);
        assert!(graph.prerequisites(&id(Kind::Vm, "web")).is_empty());
        assert_eq!(graph.levels(), Ok(vec![vec![id(Kind::Vm, "web")]]));
    }

    #[test]
    fn cycle_names_every_member_in_order_starting_at_the_smallest() {
        let resources = [
            vm("a", "pve1", 100).depending_on(Kind::Lxc, "b"),
            lxc("b", "pve1", 101).depending_on(Kind::Vm, "c"),
            vm("c", "pve1", 102).depending_on(Kind::Vm, "a"),
        ];
        let cycles = DependencyGraph::from_resources(&resources)
            .levels()
            .unwrap_err();
        assert_eq!(cycles.len(), 1);
        assert_eq!(cycles[0].to_string(), "VM/a -> LXC/b -> VM/c -> VM/a");
        let diagnostic = cycles[0].to_diagnostic();
        assert_eq!(diagnostic.path, "vm/base/a.yaml");
        assert_eq!(diagnostic.field, "metadata.annotations.proxops/depends-on");
        assert_eq!(diagnostic.message, "cycle: VM/a -> LXC/b -> VM/c -> VM/a");
    }

    #[test]
    fn self_dependency_is_a_cycle_of_one() {
        let resources = [vm("a", "pve1", 100).depending_on(Kind::Vm, "a")];
        let cycles = DependencyGraph::from_resources(&resources)
            .levels()
            .unwrap_err();
        assert_eq!(cycles.len(), 1);
        assert_eq!(cycles[0].to_string(), "VM/a -> VM/a");
    }

    #[test]
    fn two_cycles_sharing_a_member_are_both_reported() {
        let resources = [
            vm("a", "pve1", 100)
                .depending_on(Kind::Vm, "b")
                .depending_on(Kind::Vm, "c"),
            vm("b", "pve1", 101).depending_on(Kind::Vm, "a"),
            vm("c", "pve1", 102).depending_on(Kind::Vm, "a"),
            vm("d", "pve1", 103).depending_on(Kind::Vm, "a"),
        ];
        let cycles = DependencyGraph::from_resources(&resources).cycles();
        let rendered: Vec<String> = cycles.iter().map(ToString::to_string).collect();
        assert_eq!(rendered, ["VM/a -> VM/b -> VM/a", "VM/a -> VM/c -> VM/a"]);
    }

    #[test]
    fn a_long_chain_does_not_overflow_the_stack() {
        let resources: Vec<Resource> = (0..20_000)
            .map(|i| {
                vm(&format!("g{i:05}"), "pve1", 100 + i)
                    .depending_on(Kind::Vm, &format!("g{:05}", i + 1))
            })
            .collect();
        let levels = DependencyGraph::from_resources(&resources)
            .levels()
            .expect("acyclic");
        assert_eq!(levels.len(), 20_000);
    }

    /// A random graph over `n` VMs named `g00`..: each pair is (dependant, prerequisite).
    fn graph_of(n: usize, edges: &[(usize, usize)]) -> Vec<Resource> {
        (0..n)
            .map(|i| {
                let mut resource = vm(&format!("g{i:02}"), "pve1", 100 + i as u32);
                for &(from, to) in edges {
                    if from == i {
                        resource = resource.depending_on(Kind::Vm, &format!("g{to:02}"));
                    }
                }
                resource
            })
            .collect()
    }

    fn arbitrary_graph() -> impl Strategy<Value = (usize, Vec<(usize, usize)>)> {
        (1usize..24).prop_flat_map(|n| (Just(n), prop::collection::vec((0..n, 0..n), 0..48)))
    }

    fn arbitrary_dag() -> impl Strategy<Value = (usize, Vec<(usize, usize)>)> {
        arbitrary_graph().prop_map(|(n, edges)| {
            // Orient every edge from the higher index to the lower: no cycle is possible.
            let dag = edges
                .into_iter()
                .filter(|(a, b)| a != b)
                .map(|(a, b)| (a.max(b), a.min(b)))
                .collect();
            (n, dag)
        })
    }

    proptest! {
        #[test]
        fn every_edge_goes_from_a_lower_to_a_higher_level((n, edges) in arbitrary_dag()) {
            let resources = graph_of(n, &edges);
            let levels = DependencyGraph::from_resources(&resources).levels().expect("acyclic");
            let level_of: BTreeMap<&ResourceId, usize> = levels
                .iter()
                .enumerate()
                .flat_map(|(l, ids)| ids.iter().map(move |id| (id, l)))
                .collect();
            prop_assert_eq!(level_of.len(), n);
            for resource in &resources {
                for reference in &resource.references {
                    prop_assert!(level_of[&reference.target] < level_of[&resource.id]);
                }
            }
            // Deepest prerequisite + 1: a resource above level 0 has a prerequisite just below.
            for resource in &resources {
                let level = level_of[&resource.id];
                let deepest = resource.references.iter().map(|r| level_of[&r.target] + 1).max();
                prop_assert_eq!(level, deepest.unwrap_or(0));
            }
        }

        #[test]
        fn any_cycle_is_reported_and_every_reported_member_is_on_it(
            (n, edges) in arbitrary_graph()
        ) {
            let resources = graph_of(n, &edges);
            let graph = DependencyGraph::from_resources(&resources);
            let has_cycle = has_cycle(n, &edges);
            match graph.levels() {
                Ok(_) => prop_assert!(!has_cycle),
                Err(cycles) => {
                    prop_assert!(has_cycle);
                    prop_assert!(!cycles.is_empty());
                    for cycle in &cycles {
                        // Each member depends on the next, the last on the first, none twice.
                        let members = &cycle.members;
                        for (i, member) in members.iter().enumerate() {
                            let next = &members[(i + 1) % members.len()];
                            prop_assert!(graph.prerequisites(member).contains(&next));
                            prop_assert_eq!(members.iter().filter(|m| *m == member).count(), 1);
                        }
                    }
                    // No cycle goes unmentioned: every resource on some cycle is named.
                    for node in (0..n).filter(|&v| is_on_a_cycle(v, n, &edges)) {
                        let id = ResourceId::new(Kind::Vm, format!("g{node:02}"));
                        prop_assert!(cycles.iter().any(|c| c.members.contains(&id)), "{id}");
                    }
                }
            }
        }

        #[test]
        fn levels_are_independent_of_input_order(
            (n, edges) in arbitrary_graph(),
            seed in any::<u64>(),
        ) {
            let resources = graph_of(n, &edges);
            let mut shuffled = resources.clone();
            // A deterministic shuffle driven by the seed.
            let mut state = seed | 1;
            for i in (1..shuffled.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                shuffled.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let a = DependencyGraph::from_resources(&resources);
            let b = DependencyGraph::from_resources(&shuffled);
            prop_assert_eq!(a.levels(), b.levels());
        }
    }

    /// Reference answer: `start` is on a cycle iff it can reach itself.
    fn is_on_a_cycle(start: usize, n: usize, edges: &[(usize, usize)]) -> bool {
        let mut seen = vec![false; n];
        let mut stack: Vec<usize> = edges.iter().filter(|e| e.0 == start).map(|e| e.1).collect();
        while let Some(node) = stack.pop() {
            if node == start {
                return true;
            }
            if !seen[node] {
                seen[node] = true;
                stack.extend(edges.iter().filter(|e| e.0 == node).map(|e| e.1));
            }
        }
        false
    }

    /// Reference answer: a graph has a cycle iff repeatedly removing nodes without remaining
    /// prerequisites leaves something.
    fn has_cycle(n: usize, edges: &[(usize, usize)]) -> bool {
        let mut alive = vec![true; n];
        loop {
            let removable: Vec<usize> = (0..n)
                .filter(|&i| alive[i] && !edges.iter().any(|&(a, b)| a == i && alive[b]))
                .collect();
            if removable.is_empty() {
                return alive.iter().any(|&a| a);
            }
            for i in removable {
                alive[i] = false;
            }
        }
    }
}
