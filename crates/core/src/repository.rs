//! A manifest repository → one validated desired state per cluster, or every problem in it.
//!
//! [`load`] is the entry point of the CLI and the agent. It takes file contents keyed by
//! repository-relative path (the caller reads git or disk) and decides the layout: with a
//! `clusters/` folder, composition mode (each `clusters/<cluster>/resources.yaml` lists that
//! cluster's manifest files, which live under `<kind-root>/base/` and `<kind-root>/<cluster>/`);
//! without one, plain mode (every manifest file is part of the one desired state). Each file is
//! parsed once by [`crate::manifest::parse_file`], even when several clusters list it; each
//! cluster is then checked as a whole ([`Manifest`]) and levelled ([`DependencyGraph`]). Edges
//! never resolve across clusters. Nothing here reads files or talks to PVE.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::desired::Manifest;
use crate::diagnostic::{Diagnostic, sort_diagnostics};
use crate::graph::DependencyGraph;
use crate::manifest::{Location, ParsedFile, RevisionBudget, RevisionLimits, parse_file_within};
use crate::resource::{Kind, ResourceId};

/// The folder that holds one composition per cluster.
const CLUSTERS: &str = "clusters";
/// The composition file of a cluster, inside `clusters/<cluster>/`.
const COMPOSITION: &str = "resources.yaml";
/// Longest cluster folder name the Go program accepts.
const MAX_CLUSTER_NAME: usize = 64;
/// Most threads that parse files at once; the agent shares its machine with PVE.
const MAX_PARSE_THREADS: usize = 4;
/// Below this many files per thread, starting threads costs more than it saves.
const MIN_FILES_PER_THREAD: usize = 32;
/// Most manifest files a revision may hold: twice the 9,061 files of the 10,000-resource
/// benchmark repository. The git source checks it from the tree before reading a blob.
pub const MAX_REVISION_FILES: usize = 20_000;
/// Most manifest bytes a revision may hold in all, before parsing: five times the 5.9 MiB of
/// the 10,000-resource benchmark repository. The git source checks it from blob headers
/// before inflating any.
pub const MAX_REVISION_BYTES: usize = 32 * 1024 * 1024;

/// How the repository is laid out (DESIGN.md §2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// No `clusters/` folder: every manifest file is part of one desired state.
    Plain,
    /// `clusters/<cluster>/resources.yaml` compositions over `<kind-root>/` folders.
    Composition,
}

impl Layout {
    /// `plain` or `composition`, as shown in output.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Plain => "plain",
            Layout::Composition => "composition",
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The validated desired state of one cluster (or of a plain repository).
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredState {
    /// The cluster's name; `None` in plain mode.
    pub cluster: Option<String>,
    /// Every resource, checked against the others.
    pub manifest: Manifest,
    /// Resources grouped by dependency level, each level sorted by id.
    pub levels: Vec<Vec<ResourceId>>,
    /// The manifest files this state was read from: listed order in composition mode, sorted in
    /// plain mode.
    pub files: Vec<String>,
}

/// The outcome of loading a repository.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The layout that was detected.
    pub layout: Layout,
    /// Every cluster folder found under `clusters/`, sorted; empty in plain mode.
    pub clusters: Vec<String>,
    /// One state per cluster (or the plain repository) that has no error, sorted by cluster.
    pub states: Vec<DesiredState>,
    /// Every problem found, sorted and without duplicates.
    pub diagnostics: Vec<Diagnostic>,
}

impl Loaded {
    /// Whether any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }

    /// The valid state of a cluster (`None` asks for the plain repository's state).
    pub fn state(&self, cluster: Option<&str>) -> Option<&DesiredState> {
        self.states
            .iter()
            .find(|state| state.cluster.as_deref() == cluster)
    }
}

/// Loads and validates a whole repository.
///
/// `files` holds every `.yaml`/`.yml` file of the repository, keyed by repository-relative path
/// with `/` separators. Files under a dot-directory, dot-files and other extensions are skipped.
/// Every cluster is validated, and every problem is reported; a cluster with any error gets no
/// [`DesiredState`].
///
/// ```
/// use std::collections::BTreeMap;
/// use proxops_core::repository::{Layout, load};
///
/// let files = BTreeMap::from([(
///     "clusters/prod/resources.yaml".to_owned(),
///     "resources: []\n".to_owned(),
/// )]);
/// let loaded = load(&files);
/// assert_eq!(loaded.layout, Layout::Composition);
/// assert!(!loaded.has_errors());
/// assert_eq!(loaded.states[0].cluster.as_deref(), Some("prod"));
/// ```
pub fn load(files: &BTreeMap<String, String>) -> Loaded {
    load_within(files, RevisionLimits::DEFAULT)
}

/// [`load`] with other limits on what the whole revision may hold after expanding aliases
/// (documents, nodes, text). The file count and byte total ([`MAX_REVISION_FILES`],
/// [`MAX_REVISION_BYTES`]) are checked first, before any file is parsed.
pub fn load_within(files: &BTreeMap<String, String>, limits: RevisionLimits) -> Loaded {
    let files: BTreeMap<&str, &str> = files
        .iter()
        .map(|(path, contents)| (path.strip_prefix("./").unwrap_or(path), contents.as_str()))
        .filter(|(path, _)| is_yaml(path) && !is_hidden(path))
        .collect();
    let is_composition = files.keys().any(|path| path.starts_with("clusters/"));
    let layout = if is_composition {
        Layout::Composition
    } else {
        Layout::Plain
    };
    if let Some(too_large) = check_revision_size(&files) {
        return Loaded {
            layout,
            clusters: Vec::new(),
            states: Vec::new(),
            diagnostics: vec![too_large],
        };
    }
    let mut repository = Repository {
        files,
        parsed: BTreeMap::new(),
        uses: BTreeMap::new(),
        budget: RevisionBudget::new(limits),
    };
    let mut loaded = if is_composition {
        repository.load_compositions()
    } else {
        repository.load_plain()
    };
    sort_diagnostics(&mut loaded.diagnostics);
    loaded
}

/// The files being loaded and what parsing them found, each file parsed at most once.
struct Repository<'a> {
    files: BTreeMap<&'a str, &'a str>,
    /// Parsed files that another cluster still lists.
    parsed: BTreeMap<&'a str, ParsedFile>,
    /// How many clusters still have to check each file; absent means one (plain mode).
    uses: BTreeMap<&'a str, usize>,
    /// What the whole revision may hold, drawn on by every file parsed.
    budget: RevisionBudget,
}

/// The revision's file count and byte total against [`MAX_REVISION_FILES`] and
/// [`MAX_REVISION_BYTES`], located at the largest file (the one to look at first).
fn check_revision_size(files: &BTreeMap<&str, &str>) -> Option<Diagnostic> {
    let total: usize = files.values().map(|contents| contents.len()).sum();
    let largest = files
        .iter()
        .max_by_key(|(path, contents)| (contents.len(), std::cmp::Reverse(**path)))
        .map(|(path, contents)| (*path, contents.len()))?;
    let message = if files.len() > MAX_REVISION_FILES {
        format!(
            "repository too large: {} manifest files, more than the {MAX_REVISION_FILES} a \
             revision may hold",
            files.len()
        )
    } else if total > MAX_REVISION_BYTES {
        format!(
            "repository too large: {} manifest files hold {total} bytes, more than the {} MiB a \
             revision may hold (the largest is this one, {} bytes)",
            files.len(),
            MAX_REVISION_BYTES / (1024 * 1024),
            largest.1
        )
    } else {
        return None;
    };
    Some(Diagnostic::error(largest.0, 1, 1, "", message).with_help(
        "remove large or generated .yaml files from the repository (or move them into a \
         dot-folder, which is never read), or split the repository between agents",
    ))
}

/// What checking one set of manifest files found, before cluster names are attached.
struct Checked {
    state: Option<DesiredState>,
    /// Problems found by parsing single files: the same wherever the file is listed.
    file_diagnostics: Vec<Diagnostic>,
    /// Problems between resources: they depend on which cluster the files are part of.
    cross_diagnostics: Vec<Diagnostic>,
}

impl<'a> Repository<'a> {
    fn load_plain(&mut self) -> Loaded {
        // SOPS files hold encrypted credentials, never manifests; `snippets/` holds the
        // cloud-init snippets manifests name with `file:`.
        let files: Vec<&'a str> = self
            .files
            .keys()
            .copied()
            .filter(|path| !is_sops(path) && !path.starts_with(crate::snippet::REPOSITORY_FOLDER))
            .collect();
        self.parse_all(&files);
        let checked = self.check(None, &files);
        let mut diagnostics = checked.file_diagnostics;
        diagnostics.extend(checked.cross_diagnostics);
        Loaded {
            layout: Layout::Plain,
            clusters: Vec::new(),
            states: checked.state.into_iter().collect(),
            diagnostics,
        }
    }

    fn load_compositions(&mut self) -> Loaded {
        let mut diagnostics = Vec::new();
        let mut clusters = BTreeSet::new();
        for path in self
            .files
            .keys()
            .filter(|path| path.starts_with("clusters/"))
        {
            let mut parts = path.split('/').skip(1);
            match (parts.next(), parts.next()) {
                (Some(cluster), Some(_)) => {
                    clusters.insert(cluster);
                }
                _ => diagnostics.push(
                    Diagnostic::error(*path, 1, 1, "", "file is not in a cluster folder; ignored")
                        .with_help("a cluster's files live in clusters/<cluster>/")
                        .into_warning(),
                ),
            }
        }
        if clusters.is_empty() {
            diagnostics.push(
                Diagnostic::error(CLUSTERS, 1, 1, "", "no cluster folder under clusters/")
                    .with_help(
                        "create clusters/<cluster>/resources.yaml listing its manifest files",
                    ),
            );
        }

        let legacy = self.legacy_layout();
        let blocks_every_cluster = !legacy.is_empty();
        diagnostics.extend(legacy);

        let mut states = Vec::new();
        // A diagnostic between resources, keyed by its text, with the clusters that raised it.
        let mut cross: BTreeMap<Diagnostic, Vec<&str>> = BTreeMap::new();
        // Read every composition first, so each file knows how many clusters still need it.
        let compositions: Vec<(&str, Vec<Diagnostic>, Vec<&'a str>)> = clusters
            .iter()
            .map(|&cluster| {
                let mut cluster_diagnostics = check_cluster_name(cluster);
                let files = self.composition(cluster, &mut cluster_diagnostics);
                (cluster, cluster_diagnostics, files)
            })
            .collect();
        for (_, _, files) in &compositions {
            for &path in files {
                *self.uses.entry(path).or_default() += 1;
            }
        }
        let listed: Vec<&'a str> = self.uses.keys().copied().collect();
        self.parse_all(&listed);
        for (cluster, cluster_diagnostics, files) in compositions {
            let checked = self.check(Some(cluster), &files);
            let is_valid = !cluster_diagnostics.iter().any(Diagnostic::is_error);
            diagnostics.extend(cluster_diagnostics);
            diagnostics.extend(checked.file_diagnostics);
            for diagnostic in checked.cross_diagnostics {
                cross.entry(diagnostic).or_default().push(cluster);
            }
            if let Some(state) = checked.state.filter(|_| is_valid && !blocks_every_cluster) {
                states.push(state);
            }
        }
        // With several clusters, say which ones a cross-resource problem is in: a base file
        // can be fine in one cluster and wrong in another.
        for (mut diagnostic, in_clusters) in cross {
            if clusters.len() > 1 {
                let names: Vec<String> = in_clusters.iter().map(|c| format!("`{c}`")).collect();
                let noun = if names.len() == 1 {
                    "cluster"
                } else {
                    "clusters"
                };
                diagnostic.message =
                    format!("{} (in {noun} {})", diagnostic.message, names.join(", "));
            }
            diagnostics.push(diagnostic);
        }
        Loaded {
            layout: Layout::Composition,
            clusters: clusters.into_iter().map(str::to_owned).collect(),
            states,
            diagnostics,
        }
    }

    /// Manifest files directly under a kind root (`vm/web.yaml`): the layout before
    /// compositions, which the Go program rejects too.
    fn legacy_layout(&self) -> Vec<Diagnostic> {
        self.files
            .keys()
            .filter_map(|path| {
                let (root, file) = path.split_once('/')?;
                let is_direct = !file.contains('/') && kind_root(root).is_some();
                is_direct.then(|| {
                    Diagnostic::error(
                        *path,
                        1,
                        1,
                        "",
                        format!("manifest directly under the kind root `{root}/` (legacy layout)"),
                    )
                    .with_help(format!(
                        "move it into `{root}/base/` or `{root}/<cluster>/` and list it in \
                         clusters/<cluster>/resources.yaml"
                    ))
                })
            })
            .collect()
    }

    /// The manifest files a cluster's `resources.yaml` lists, as repository paths, with a
    /// diagnostic for each entry that cannot be used.
    fn composition(&self, cluster: &str, diagnostics: &mut Vec<Diagnostic>) -> Vec<&'a str> {
        let folder = format!("{CLUSTERS}/{cluster}");
        let composition_path = format!("{folder}/{COMPOSITION}");
        let Some(contents) = self.files.get(composition_path.as_str()) else {
            let mut missing = Diagnostic::error(
                &folder,
                1,
                1,
                "",
                format!("cluster folder has no {COMPOSITION}"),
            );
            missing = if self
                .files
                .contains_key(format!("{folder}/resources.yml").as_str())
            {
                missing.with_help(format!("rename resources.yml to {COMPOSITION}"))
            } else {
                missing.with_help(format!(
                    "create {composition_path} listing the cluster's manifest files"
                ))
            };
            diagnostics.push(missing);
            return Vec::new();
        };
        let (entries, field_prefix) = match parse_composition(contents) {
            Ok(parsed) => parsed,
            Err((message, at)) => {
                diagnostics.push(
                    Diagnostic::error(&composition_path, at.line, at.column, "", message)
                        .with_help("write `resources:` followed by a list of manifest paths"),
                );
                return Vec::new();
            }
        };

        let mut listed: BTreeMap<String, usize> = BTreeMap::new();
        let mut files = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            let at = entry.referenced;
            let (line, column) = (to_usize(at.line()), to_usize(at.column()));
            let written = entry.value.as_str();
            let field = format!("{field_prefix}[{i}]");
            let error = |message: String| {
                Diagnostic::error(&composition_path, line, column, &field, message)
            };
            let Some(path) = normalise(&folder, written) else {
                diagnostics.push(
                    error(format!("`{written}` is outside the repository")).with_help(format!(
                        "paths are relative to {folder}/ and stay inside the repository, e.g. \
                         `../../vm/base/web.yaml`"
                    )),
                );
                continue;
            };
            if !is_yaml(&path) {
                diagnostics.push(
                    error(format!("`{written}` is not a manifest file"))
                        .with_help("manifest files end .yaml or .yml"),
                );
                continue;
            }
            if let Some(first_line) = listed.get(&path) {
                diagnostics.push(
                    error(format!(
                        "`{written}` is listed twice: {path} is already listed at line {first_line}"
                    ))
                    .with_help("remove one of the two entries"),
                );
                continue;
            }
            listed.insert(path.clone(), line);
            let Some((&existing, _)) = self.files.get_key_value(path.as_str()) else {
                let mut missing = error(format!("`{written}` does not exist ({path})"));
                missing = if is_hidden(&path) {
                    missing.with_help("files in dot-folders and dot-files are never read")
                } else if let Some(close) = self.closest_manifest(&path) {
                    missing.with_help(format!("did you mean `../../{close}`?"))
                } else {
                    missing.with_help("create the file or remove the entry")
                };
                diagnostics.push(missing);
                continue;
            };
            let root = path.split('/').next().unwrap_or_default();
            if kind_root(root).is_none() {
                diagnostics.push(
                    error(format!("`{written}` is not under a kind root ({path})")).with_help(
                        format!(
                            "manifests live in <root>/base/ or <root>/{cluster}/, root one of {}",
                            kind_roots().join(", ")
                        ),
                    ),
                );
                continue;
            }
            files.push(existing);
        }
        files
    }

    /// The existing manifest path closest to a missing one, when close enough to be a typo.
    fn closest_manifest(&self, missing: &str) -> Option<&'a str> {
        self.files
            .keys()
            .copied()
            .filter(|path| !path.starts_with("clusters/"))
            .map(|path| (strsim::levenshtein(path, missing), path))
            .filter(|(distance, _)| *distance <= 3)
            .min()
            .map(|(_, path)| path)
    }

    /// Parses every file of `paths` that is not parsed yet, on every core the machine offers.
    ///
    /// Files are independent and parsing them is most of the time `load` takes (a 10,000
    /// resource repository is ~6 MiB of YAML), so they are shared out among scoped threads; each
    /// result is kept by path, so the outcome is the same as parsing them one after another.
    /// `load` still returns only when every file is done: callers see a synchronous function.
    fn parse_all(&mut self, paths: &[&'a str]) {
        let todo: Vec<(&'a str, &'a str)> = paths
            .iter()
            .filter(|path| !self.parsed.contains_key(*path))
            .filter_map(|path| self.files.get_key_value(path))
            .map(|(path, contents)| (*path, *contents))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let workers = std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .min(MAX_PARSE_THREADS)
            .min(todo.len() / MIN_FILES_PER_THREAD);
        if workers < 2 {
            for (path, contents) in todo {
                self.parsed
                    .insert(path, parse_file_within(path, contents, &self.budget));
            }
            return;
        }
        // Threads take the next file as they finish one, so a few large files do not leave a
        // core idle.
        let next = AtomicUsize::new(0);
        let budget = &self.budget;
        let parse_some = || {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(path, contents)) = todo.get(i) else {
                    return done;
                };
                done.push((path, parse_file_within(path, contents, budget)));
            }
        };
        let parsed: Vec<Vec<(&'a str, ParsedFile)>> = std::thread::scope(|scope| {
            let helpers: Vec<_> = (1..workers).map(|_| scope.spawn(parse_some)).collect();
            let mut parsed = vec![parse_some()];
            for helper in helpers {
                // A panic in the parser is a bug: let it reach the caller as it would unthreaded.
                parsed.push(
                    helper
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                );
            }
            parsed
        });
        self.parsed.extend(parsed.into_iter().flatten());
    }

    /// Checks `files` as one desired state, parsing any not parsed yet.
    fn check(&mut self, cluster: Option<&str>, files: &[&'a str]) -> Checked {
        let mut file_diagnostics = Vec::new();
        let mut resources = Vec::new();
        for &path in files {
            let remaining = self.uses.get_mut(path).map_or(0, |uses| {
                *uses = uses.saturating_sub(1);
                *uses
            });
            // The last cluster to need a file takes its resources instead of copying them.
            let parsed = match self.parsed.remove(path) {
                Some(parsed) => parsed,
                None => parse_file_within(
                    path,
                    self.files.get(path).copied().unwrap_or_default(),
                    &self.budget,
                ),
            };
            if remaining == 0 {
                file_diagnostics.extend(parsed.diagnostics);
                resources.extend(parsed.resources);
            } else {
                file_diagnostics.extend(parsed.diagnostics.iter().cloned());
                resources.extend(parsed.resources.iter().cloned());
                self.parsed.insert(path, parsed);
            }
        }
        // A revision over its budget was not read in full: what is missing would only show up
        // as false problems between resources.
        if self.budget.is_exhausted() {
            return Checked {
                state: None,
                file_diagnostics,
                cross_diagnostics: Vec::new(),
            };
        }
        // Cross-resource checks and cycles run even when a file has errors, so one run reports
        // everything; the parser keeps every resource that has an identity.
        let (manifest, mut cross_diagnostics) = Manifest::check(resources);
        let levels = DependencyGraph::from_manifest(&manifest).levels();
        let levels = match levels {
            Ok(levels) => Some(levels),
            Err(cycles) => {
                cross_diagnostics.extend(cycles.iter().map(|cycle| cycle.to_diagnostic()));
                None
            }
        };
        let has_errors = file_diagnostics
            .iter()
            .chain(&cross_diagnostics)
            .any(Diagnostic::is_error);
        let state = levels.filter(|_| !has_errors).map(|levels| DesiredState {
            cluster: cluster.map(str::to_owned),
            manifest,
            levels,
            files: files.iter().map(|path| (*path).to_owned()).collect(),
        });
        Checked {
            state,
            file_diagnostics,
            cross_diagnostics,
        }
    }
}

/// The entries of a `resources.yaml`, and the field path they sit under (`resources` or empty
/// for a bare list).
type Composition = (Vec<Spanned<String>>, &'static str);

/// `resources.yaml` as a mapping. Unknown keys are errors: a misspelt `resources:` would
/// otherwise read as an empty composition.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompositionFile {
    #[serde(default)]
    resources: Option<Vec<Spanned<String>>>,
}

/// Parses `resources.yaml`: `resources: [paths]`, a bare list of paths, or nothing at all.
fn parse_composition(contents: &str) -> Result<Composition, (String, Location)> {
    if let Ok(entries) = serde_saphyr::from_str::<Vec<Spanned<String>>>(contents) {
        return Ok((entries, ""));
    }
    match serde_saphyr::from_str::<Option<CompositionFile>>(contents) {
        Ok(file) => Ok((
            file.and_then(|f| f.resources).unwrap_or_default(),
            "resources",
        )),
        Err(error) => {
            let at = error
                .location()
                .map_or(Location { line: 1, column: 1 }, |at| Location {
                    line: to_usize(at.line()),
                    column: to_usize(at.column()),
                });
            let message = error.without_snippet().to_string();
            // The location is ours to render; drop the parser's own " at line L, column C".
            let message = match message.rfind(" at line ") {
                Some(cut) => message[..cut].to_owned(),
                None => message,
            };
            Err((message, at))
        }
    }
}

/// Joins a path written in `clusters/<c>/resources.yaml` to its folder and resolves `.` and
/// `..` lexically; `None` when it leaves the repository.
fn normalise(folder: &str, written: &str) -> Option<String> {
    if written.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in folder.split('/').chain(written.split('/')) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// Checks a folder name under `clusters/` against `^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$`, at most
/// 64 characters (the Go program's rule).
fn check_cluster_name(name: &str) -> Vec<Diagnostic> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let is_valid = name.len() <= MAX_CLUSTER_NAME
        && name.starts_with(allowed)
        && name.ends_with(allowed)
        && name.chars().all(|c| allowed(c) || c == '-');
    if is_valid {
        return Vec::new();
    }
    vec![
        Diagnostic::error(
            format!("{CLUSTERS}/{name}"),
            1,
            1,
            "",
            format!("invalid cluster name `{name}`"),
        )
        .with_help(
            "cluster names are lowercase letters, digits and inner hyphens, at most 64 characters",
        ),
    ]
}

fn kind_root(folder: &str) -> Option<Kind> {
    Kind::ALL.into_iter().find(|kind| kind.root() == folder)
}

fn kind_roots() -> Vec<&'static str> {
    Kind::ALL.iter().map(|kind| kind.root()).collect()
}

fn is_yaml(path: &str) -> bool {
    path.ends_with(".yaml") || path.ends_with(".yml")
}

fn is_hidden(path: &str) -> bool {
    path.split('/').any(|part| part.starts_with('.'))
}

fn is_sops(path: &str) -> bool {
    path.ends_with(".sops.yaml") || path.ends_with(".sops.yml")
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse_file;
    use crate::manifest::yaml::tests::small_bomb;

    /// A valid ISO manifest.
    fn iso(name: &str) -> String {
        format!(
            "apiVersion: proxops/v1alpha1\nkind: ISO\nmetadata:\n  name: {name}\nspec:\n  nodes: \
             [pve1]\n  storage: local\n  filename: {name}.iso\n  url: https://example.org/{name}.iso\n"
        )
    }

    /// A repository; [`MANIFEST`] stands for a valid ISO named after the file.
    fn repo(files: &[(&str, &str)]) -> BTreeMap<String, String> {
        files
            .iter()
            .map(|(path, contents)| {
                let contents = if *contents == MANIFEST {
                    let file = path.rsplit('/').next().unwrap_or_default();
                    iso(file.split('.').next().unwrap_or_default())
                } else {
                    (*contents).to_owned()
                };
                ((*path).to_owned(), contents)
            })
            .collect()
    }

    fn rendered(loaded: &Loaded) -> Vec<String> {
        loaded.diagnostics.iter().map(ToString::to_string).collect()
    }

    const MANIFEST: &str = "<manifest>";

    #[test]
    fn repository_without_clusters_folder_is_plain() {
        let loaded = load(&repo(&[
            ("vms/web.yaml", MANIFEST),
            ("isos/a.yml", MANIFEST),
        ]));
        assert_eq!(loaded.layout, Layout::Plain);
        assert!(loaded.clusters.is_empty());
        assert_eq!(loaded.states.len(), 1);
        assert_eq!(loaded.states[0].cluster, None);
        assert_eq!(loaded.states[0].files, ["isos/a.yml", "vms/web.yaml"]);
    }

    #[test]
    fn dot_folders_dot_files_sops_and_other_extensions_are_skipped() {
        let loaded = load(&repo(&[
            (".github/workflows/ci.yaml", MANIFEST),
            ("vm/.hidden.yaml", MANIFEST),
            ("README.md", MANIFEST),
            ("secrets.sops.yaml", MANIFEST),
            ("vm/web.yaml", MANIFEST),
        ]));
        assert_eq!(loaded.states[0].files, ["vm/web.yaml"]);
    }

    #[test]
    fn composition_lists_files_relative_to_the_cluster_folder() {
        let loaded = load(&repo(&[
            (
                "clusters/prod/resources.yaml",
                "resources:\n  - ../../vm/base/web.yaml\n  - ../../vm/prod/db.yaml\n",
            ),
            ("clusters/prod/config.yaml", "pve: {}\n"),
            ("clusters/prod/secrets.sops.yaml", "sops: {}\n"),
            ("vm/base/web.yaml", MANIFEST),
            ("vm/prod/db.yaml", MANIFEST),
            ("vm/base/unlisted.yaml", MANIFEST),
        ]));
        assert_eq!(loaded.layout, Layout::Composition);
        assert_eq!(rendered(&loaded), Vec::<String>::new());
        assert_eq!(loaded.clusters, ["prod"]);
        let state = loaded.state(Some("prod")).expect("valid");
        assert_eq!(state.files, ["vm/base/web.yaml", "vm/prod/db.yaml"]);
    }

    #[test]
    fn composition_may_be_a_bare_list_or_empty() {
        let loaded = load(&repo(&[
            ("clusters/a/resources.yaml", "- ../../vm/base/web.yaml\n"),
            ("clusters/b/resources.yaml", ""),
            ("clusters/c/resources.yaml", "resources:\n"),
            ("vm/base/web.yaml", MANIFEST),
        ]));
        assert_eq!(rendered(&loaded), Vec::<String>::new());
        assert_eq!(loaded.states.len(), 3);
        assert_eq!(loaded.states[0].files, ["vm/base/web.yaml"]);
        assert!(loaded.states[1].files.is_empty());
    }

    #[test]
    fn composition_entries_that_cannot_be_used_are_located_at_the_entry() {
        let loaded = load(&repo(&[
            (
                "clusters/prod/resources.yaml",
                "resources:\n  - ../../vm/base/web.yaml\n  - ../../../etc/passwd.yaml\n  - \
                 ../../vm/./base/web.yaml\n  - ../../vm/base/notes.txt\n  - ../../vm/base/wbe.yaml\n  \
                 - config.yaml\n",
            ),
            ("clusters/prod/config.yaml", "pve: {}\n"),
            ("vm/base/web.yaml", MANIFEST),
        ]));
        assert_eq!(
            rendered(&loaded),
            [
                "clusters/prod/resources.yaml:3:5: error: resources[1]: `../../../etc/passwd.yaml` \
                 is outside the repository\n  help: paths are relative to clusters/prod/ and stay \
                 inside the repository, e.g. `../../vm/base/web.yaml`",
                "clusters/prod/resources.yaml:4:5: error: resources[2]: `../../vm/./base/web.yaml` \
                 is listed twice: vm/base/web.yaml is already listed at line 2\n  help: remove one \
                 of the two entries",
                "clusters/prod/resources.yaml:5:5: error: resources[3]: `../../vm/base/notes.txt` \
                 is not a manifest file\n  help: manifest files end .yaml or .yml",
                "clusters/prod/resources.yaml:6:5: error: resources[4]: `../../vm/base/wbe.yaml` \
                 does not exist (vm/base/wbe.yaml)\n  help: did you mean `../../vm/base/web.yaml`?",
                "clusters/prod/resources.yaml:7:5: error: resources[5]: `config.yaml` is not under \
                 a kind root (clusters/prod/config.yaml)\n  help: manifests live in <root>/base/ \
                 or <root>/prod/, root one of iso, ctt, diskimage, templatevm, templatect, vm, lxc",
            ]
        );
        assert!(loaded.states.is_empty());
    }

    #[test]
    fn manifest_directly_under_a_kind_root_is_reported_once_and_blocks_every_cluster() {
        let loaded = load(&repo(&[
            (
                "clusters/a/resources.yaml",
                "resources:\n  - ../../vm/web.yaml\n",
            ),
            ("clusters/b/resources.yaml", "resources: []\n"),
            ("vm/web.yaml", MANIFEST),
        ]));
        assert_eq!(
            rendered(&loaded),
            [
                "vm/web.yaml:1:1: error: manifest directly under the kind root `vm/` (legacy \
              layout)\n  help: move it into `vm/base/` or `vm/<cluster>/` and list it in \
              clusters/<cluster>/resources.yaml"
            ]
        );
        assert!(loaded.states.is_empty());
    }

    #[test]
    fn cluster_folder_needs_a_valid_name_and_a_composition() {
        let loaded = load(&repo(&[
            ("clusters/Prod/resources.yaml", "resources: []\n"),
            ("clusters/dev/config.yaml", "pve: {}\n"),
            ("clusters/ok/resources.yaml", "resources: []\n"),
        ]));
        assert_eq!(
            rendered(&loaded),
            [
                "clusters/Prod:1:1: error: invalid cluster name `Prod`\n  help: cluster names are \
                 lowercase letters, digits and inner hyphens, at most 64 characters",
                "clusters/dev:1:1: error: cluster folder has no resources.yaml\n  help: create \
                 clusters/dev/resources.yaml listing the cluster's manifest files",
            ]
        );
        assert_eq!(loaded.clusters, ["Prod", "dev", "ok"]);
        assert_eq!(loaded.states.len(), 1);
        assert_eq!(loaded.states[0].cluster.as_deref(), Some("ok"));
    }

    #[test]
    fn misspelt_resources_key_is_an_error_not_an_empty_cluster() {
        let loaded = load(&repo(&[(
            "clusters/prod/resources.yaml",
            "resource:\n  - a.yaml\n",
        )]));
        assert_eq!(loaded.diagnostics.len(), 1);
        let d = &loaded.diagnostics[0];
        assert_eq!(
            (d.path.as_str(), d.line, d.column),
            ("clusters/prod/resources.yaml", 1, 1)
        );
        assert!(
            d.message.contains("unknown field `resource`"),
            "{}",
            d.message
        );
        assert!(loaded.states.is_empty());
    }

    #[test]
    fn base_file_shared_by_two_clusters_is_part_of_both() {
        let loaded = load(&repo(&[
            (
                "clusters/a/resources.yaml",
                "- ../../iso/base/netinst.yaml\n- ../../iso/a/tools.yaml\n",
            ),
            (
                "clusters/b/resources.yaml",
                "- ../../iso/base/netinst.yaml\n",
            ),
            ("iso/base/netinst.yaml", MANIFEST),
            ("iso/a/tools.yaml", MANIFEST),
        ]));
        assert_eq!(rendered(&loaded), Vec::<String>::new());
        let a = loaded.state(Some("a")).expect("a is valid");
        let b = loaded.state(Some("b")).expect("b is valid");
        assert_eq!(a.manifest.len(), 2);
        assert_eq!(b.manifest.len(), 1);
        assert_eq!(b.levels, [vec![ResourceId::new(Kind::Iso, "netinst")]]);
    }

    #[test]
    fn problem_between_resources_names_the_clusters_it_is_in() {
        let duplicate = iso("netinst");
        let loaded = load(&repo(&[
            (
                "clusters/a/resources.yaml",
                "- ../../iso/base/netinst.yaml\n",
            ),
            (
                "clusters/b/resources.yaml",
                "- ../../iso/base/netinst.yaml\n- ../../iso/b/copy.yaml\n",
            ),
            ("iso/base/netinst.yaml", MANIFEST),
            ("iso/b/copy.yaml", &duplicate),
        ]));
        assert_eq!(
            rendered(&loaded),
            [
                "iso/base/netinst.yaml:4:9: error: metadata.name: duplicate ISO `netinst`: already declared \
              at iso/b/copy.yaml:4:9 (in cluster `b`)\n  help: names are unique per kind; \
              rename one of the two ISOs"
            ]
        );
        assert_eq!(loaded.states.len(), 1);
        assert!(loaded.state(Some("a")).is_some());
    }

    #[test]
    fn edges_never_resolve_across_clusters() {
        let web = "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: web\n  annotations:\n    \
                   proxops/depends-on: \"ISO:tools\"\nspec:\n  node: pve1\n  vmid: 100\n  memory: 1GiB\n  \
                   cpu: {type: host, cores: 1}\n  disks: [{storage: local-lvm, size: 8GiB}]\n";
        let loaded = load(&repo(&[
            ("clusters/a/resources.yaml", "- ../../iso/a/tools.yaml\n"),
            ("clusters/b/resources.yaml", "- ../../vm/b/web.yaml\n"),
            ("iso/a/tools.yaml", MANIFEST),
            ("vm/b/web.yaml", web),
        ]));
        let errors = rendered(&loaded);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("depends-on target `ISO/tools` does not exist (in cluster `b`)")
        );
    }

    #[test]
    fn many_files_load_as_if_parsed_one_after_another() {
        // Enough files for several parsing threads; every seventh one is broken.
        let files: BTreeMap<String, String> = (0..300)
            .map(|i| {
                let name = format!("iso-{i:03}");
                let contents = if i % 7 == 0 {
                    iso(&name).replace("https", "ftp")
                } else {
                    iso(&name)
                };
                (format!("isos/{name}.yaml"), contents)
            })
            .collect();
        let loaded = load(&files);
        let mut expected: Vec<Diagnostic> = files
            .iter()
            .flat_map(|(path, contents)| parse_file(path, contents).diagnostics)
            .collect();
        sort_diagnostics(&mut expected);
        assert_eq!(expected.len(), 43);
        assert_eq!(loaded.diagnostics, expected);
        assert_eq!(loaded, load(&files), "loading twice gives the same result");
    }

    #[test]
    fn a_revision_over_the_byte_budget_is_refused_before_any_file_is_parsed() {
        // Five 7 MiB files: each under the file limit, 35 MiB together. Not YAML at all, so a
        // parse would report every one of them.
        let junk = "[".repeat(7 * 1024 * 1024);
        let files: BTreeMap<String, String> = (0..5)
            .map(|i| (format!("vm/base/f{i}.yaml"), junk.clone()))
            .chain([("vm/base/small.yaml".to_owned(), iso("small"))])
            .collect();
        let loaded = load(&files);
        assert_eq!(
            rendered(&loaded),
            [format!(
                "vm/base/f0.yaml:1:1: error: repository too large: 6 manifest files hold {} \
                 bytes, more than the 32 MiB a revision may hold (the largest is this one, \
                 7340032 bytes)\n  help: remove large or generated .yaml files from the \
                 repository (or move them into a dot-folder, which is never read), or split the \
                 repository between agents",
                5 * junk.len() + iso("small").len()
            )]
        );
        assert!(loaded.states.is_empty());
    }

    #[test]
    fn a_revision_of_too_many_files_is_refused_before_any_file_is_parsed() {
        let files: BTreeMap<String, String> = (0..=MAX_REVISION_FILES)
            .map(|i| (format!("iso/i{i:05}.yaml"), String::new()))
            .collect();
        let loaded = load(&files);
        assert_eq!(loaded.diagnostics.len(), 1);
        assert_eq!(
            loaded.diagnostics[0].message,
            "repository too large: 20001 manifest files, more than the 20000 a revision may hold"
        );
    }

    #[test]
    fn small_bombs_spread_over_files_are_refused_within_the_revision_budget() {
        // Each file holds one 2 KB document that expands to 15.8 MiB: under every per-document
        // and per-file limit, but five of them pass the revision's 64 MiB.
        let mut files: BTreeMap<String, String> = (0..8)
            .map(|i| (format!("iso/b{i}.yaml"), small_bomb()))
            .collect();
        files.insert("iso/ok.yaml".to_owned(), iso("ok"));
        let loaded = load(&files);
        let errors = rendered(&loaded);
        assert!(loaded.states.is_empty());
        let budget: Vec<&String> = errors
            .iter()
            .filter(|e| e.contains("repository too large"))
            .collect();
        assert_eq!(budget.len(), 1, "{errors:#?}");
        assert!(
            budget[0].starts_with("iso/b4.yaml:")
                && budget[0].contains(
                    "more than 64 MiB of text after expanding aliases across all manifest files"
                ),
            "{errors:#?}"
        );
        // Nothing is reported about files that were never read, nor between resources.
        assert!(
            errors.iter().all(|e| !e.starts_with("iso/b5.yaml")
                && !e.starts_with("iso/ok.yaml")
                && !e.contains("does not exist")),
            "{errors:#?}"
        );
        // The same repository within bigger limits is read in full.
        let roomy = load_within(
            &files,
            RevisionLimits {
                text_bytes: usize::MAX,
                ..RevisionLimits::DEFAULT
            },
        );
        assert!(rendered(&roomy).iter().all(|e| !e.contains("too large")));
    }

    #[test]
    fn path_normalisation_resolves_dots_and_refuses_to_leave_the_repository() {
        assert_eq!(
            normalise("clusters/a", "../../vm/base/x.yaml").as_deref(),
            Some("vm/base/x.yaml")
        );
        assert_eq!(
            normalise("clusters/a", "./../b/../../vm//x.yaml").as_deref(),
            Some("vm/x.yaml")
        );
        assert_eq!(normalise("clusters/a", "../../../x.yaml"), None);
        assert_eq!(normalise("clusters/a", "/etc/x.yaml"), None);
    }

    #[test]
    fn cluster_names_follow_the_go_rule() {
        for good in ["prod", "a", "eu-west-1", &"a".repeat(64)] {
            assert!(check_cluster_name(good).is_empty(), "{good}");
        }
        for bad in ["Prod", "-a", "a-", "a_b", &"a".repeat(65)] {
            assert!(!check_cluster_name(bad).is_empty(), "{bad}");
        }
    }
}
