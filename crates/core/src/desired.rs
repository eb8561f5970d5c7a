//! The desired state of one revision for one cluster: [`Manifest`], and the checks that need
//! more than one document to decide.
//!
//! Per-document rules (keys, types, values) belong to [`crate::manifest`]; this module takes
//! the resources it produced and checks them against each other: names unique per kind, vmids
//! unique across every guest kind of the cluster, references that resolve, artifacts present on
//! the node of the guest that uses them, clones made on their template's node. Dependency
//! cycles are [`crate::graph`]'s. Nothing here reads files or knows about repository layout.

use std::collections::BTreeMap;

use crate::diagnostic::Diagnostic;
use crate::manifest::{Location, Placement, Reference, Resource, content_type};
use crate::resource::{Kind, ResourceId};

/// The validated desired state of one revision for one cluster, keyed by resource id.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Manifest {
    resources: BTreeMap<ResourceId, Resource>,
}

impl Manifest {
    /// Checks resources against each other and keeps them as one desired state.
    ///
    /// ```
    /// use proxops_core::Manifest;
    /// use proxops_core::manifest::parse_file;
    ///
    /// let vm = "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata: {name: web}\nspec:\n  \
    ///           node: pve1\n  vmid: 100\n  memory: 1GiB\n  cpu: {type: host, cores: 1}\n  \
    ///           hardware: {cdrom: {iso: netinst}}\n  disks: [{storage: local-lvm, size: 8GiB}]\n";
    /// let parsed = parse_file("vm/web.yaml", vm);
    /// assert!(parsed.diagnostics.is_empty());
    ///
    /// let errors = Manifest::from_parsed(parsed.resources).unwrap_err();
    /// assert_eq!(
    ///     errors[0].to_string(),
    ///     "vm/web.yaml:9:27: error: spec.hardware.cdrom.iso: ISO `netinst` is not declared\n  \
    ///      help: add a manifest for ISO `netinst`, or fix the name"
    /// );
    /// ```
    ///
    /// # Errors
    ///
    /// Every cross-resource problem: a duplicate (kind, name), a vmid declared twice, a reference
    /// to a resource that is not declared, an artifact missing from the node of a guest that
    /// uses it, a clone from a template on another node, an artifact that depends on something.
    pub fn from_parsed(resources: Vec<Resource>) -> Result<Manifest, Vec<Diagnostic>> {
        let (manifest, diagnostics) = Self::check(resources);
        if diagnostics.iter().any(Diagnostic::is_error) {
            Err(diagnostics)
        } else {
            Ok(manifest)
        }
    }

    /// Like [`Manifest::from_parsed`], but always returns what it could keep (the first of each
    /// duplicate) next to every problem, so callers can go on to report cycles as well.
    pub(crate) fn check(mut resources: Vec<Resource>) -> (Manifest, Vec<Diagnostic>) {
        // "First" and "second" follow file order, not the order resources were handed in.
        resources.sort_by(|a, b| (&a.path, a.location).cmp(&(&b.path, b.location)));
        let mut diagnostics = Vec::new();
        let mut kept: BTreeMap<ResourceId, Resource> = BTreeMap::new();
        let mut vmids: BTreeMap<u32, ResourceId> = BTreeMap::new();

        for resource in resources {
            if let Some(first) = kept.get(&resource.id) {
                diagnostics.push(
                    error_at(
                        &resource,
                        resource.location,
                        "metadata.name",
                        format!(
                            "duplicate {} `{}`: already declared at {}",
                            resource.id.kind,
                            resource.id.name,
                            place(first, first.location)
                        ),
                    )
                    .with_help(format!(
                        "names are unique per kind; rename one of the two {}s",
                        resource.id.kind
                    )),
                );
                continue;
            }
            if let Placement::Guest {
                vmid,
                vmid_location,
                ..
            } = &resource.placement
            {
                match vmids.get(vmid).and_then(|id| kept.get(id)) {
                    Some(holder) => diagnostics.push(
                        error_at(
                            &resource,
                            *vmid_location,
                            "spec.vmid",
                            format!(
                                "vmid {vmid} is already used by {} `{}` at {}",
                                holder.id.kind,
                                holder.id.name,
                                place(holder, guest_vmid_location(holder))
                            ),
                        )
                        .with_help(
                            "a vmid is unique across the whole cluster and all of VM, LXC, \
                             TemplateVM and TemplateCT (PVE's rule); pick a free one",
                        ),
                    ),
                    None => {
                        vmids.insert(*vmid, resource.id.clone());
                    }
                }
            }
            kept.insert(resource.id.clone(), resource);
        }

        let manifest = Manifest { resources: kept };
        for resource in manifest.resources.values() {
            for reference in &resource.references {
                diagnostics.extend(manifest.check_reference(resource, reference));
            }
        }
        diagnostics.extend(manifest.check_artifact_files());
        (manifest, diagnostics)
    }

    /// Two artifacts that name the same file on the same node: whichever downloads first wins
    /// and the other is then seen as present, so one manifest silently describes nothing.
    /// A warning, because the Go program accepts it.
    fn check_artifact_files(&self) -> Vec<Diagnostic> {
        let mut artifacts: Vec<&Resource> = self.resources().collect();
        artifacts.sort_by(|a, b| (&a.path, a.location).cmp(&(&b.path, b.location)));
        let mut files: BTreeMap<(&str, &str, &str, &str), &Resource> = BTreeMap::new();
        let mut diagnostics = Vec::new();
        for resource in artifacts {
            let Placement::Artifact {
                nodes,
                storage,
                filename,
            } = &resource.placement
            else {
                continue;
            };
            let content = content_type(resource.id.kind);
            for node in nodes {
                let key = (node.as_str(), storage.as_str(), content, filename.as_str());
                match files.get(&key) {
                    Some(first) if first.id != resource.id => {
                        let volid = format!("{storage}:{content}/{filename}");
                        diagnostics.push(
                            error_at(
                                resource,
                                resource.location,
                                "",
                                format!(
                                    "{volid} on node `{node}` is also declared by {} `{}` at {}",
                                    first.id.kind,
                                    first.id.name,
                                    place(first, first.location)
                                ),
                            )
                            .with_help("declare each file once and list every node in spec.nodes")
                            .into_warning(),
                        );
                    }
                    Some(_) => {}
                    None => {
                        files.insert(key, resource);
                    }
                }
            }
        }
        diagnostics
    }

    /// The problem with one reference, if it has one.
    fn check_reference(&self, from: &Resource, reference: &Reference) -> Option<Diagnostic> {
        let target_id = &reference.target;
        if from.id.kind.is_artifact() {
            return Some(
                reference_error(
                    from,
                    reference,
                    format!("an artifact cannot depend on `{target_id}`"),
                )
                .with_help("artifacts are downloaded first (level 0); remove this dependency"),
            );
        }
        let Some(target) = self.get(target_id) else {
            let message = if reference.explicit {
                format!("depends-on target `{target_id}` does not exist")
            } else {
                format!("{} `{}` is not declared", target_id.kind, target_id.name)
            };
            let help = match self.closest_name(target_id) {
                Some(name) => format!("did you mean `{name}`?"),
                None => format!(
                    "add a manifest for {} `{}`, or fix the name",
                    target_id.kind, target_id.name
                ),
            };
            return Some(reference_error(from, reference, message).with_help(help));
        };
        // Ordering-only edges (depends-on) may cross nodes; structured references may not.
        if reference.explicit {
            return None;
        }
        let Placement::Guest { node, .. } = &from.placement else {
            return None;
        };
        match &target.placement {
            Placement::Artifact { nodes, .. } if !nodes.contains(node) => Some(
                reference_error(
                    from,
                    reference,
                    format!(
                        "{} `{}` is not on node `{node}`, where {} `{}` runs: {} declares it on {}",
                        target_id.kind,
                        target_id.name,
                        from.id.kind,
                        from.id.name,
                        target.path,
                        nodes.join(", ")
                    ),
                )
                .with_help(format!(
                    "add `{node}` to spec.nodes of {} `{}`",
                    target_id.kind, target_id.name
                )),
            ),
            Placement::Guest {
                node: source_node, ..
            } if source_node != node => Some(
                reference_error(
                    from,
                    reference,
                    format!(
                        "{} `{}` is on node `{source_node}`, not on `{node}` where {} `{}` runs",
                        target_id.kind, target_id.name, from.id.kind, from.id.name
                    ),
                )
                .with_help(format!(
                    "PVE clones on the template's node: put {} `{}` on `{source_node}`, or \
                     declare a template on `{node}`",
                    from.id.kind, from.id.name
                )),
            ),
            _ => None,
        }
    }

    /// The declared name of `id`'s kind closest to `id.name`, when one is close enough to be
    /// a likely typo.
    fn closest_name(&self, id: &ResourceId) -> Option<&str> {
        let same_kind = ResourceId::new(id.kind, "")..;
        self.resources
            .range(same_kind)
            .take_while(|(candidate, _)| candidate.kind == id.kind)
            .map(|(candidate, _)| {
                (
                    strsim::levenshtein(&candidate.name, &id.name),
                    &candidate.name,
                )
            })
            .filter(|(distance, _)| *distance <= (id.name.len() / 3).max(2))
            .min()
            .map(|(_, name)| name.as_str())
    }

    /// Every resource, sorted by id.
    pub fn resources(&self) -> impl ExactSizeIterator<Item = &Resource> {
        self.resources.values()
    }

    /// Every resource id, sorted.
    pub fn ids(&self) -> impl ExactSizeIterator<Item = &ResourceId> {
        self.resources.keys()
    }

    /// Every resource of one kind, sorted by name.
    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = &Resource> {
        self.resources
            .range(ResourceId::new(kind, "")..)
            .take_while(move |(id, _)| id.kind == kind)
            .map(|(_, resource)| resource)
    }

    /// The resource with this id.
    pub fn get(&self, id: &ResourceId) -> Option<&Resource> {
        self.resources.get(id)
    }

    /// Gives the VM or TemplateVM `id` the values the binary resolved for its SOPS references
    /// (the one change a validated manifest takes); `false` when `id` is no such guest.
    pub fn set_resolved_cloud_init(
        &mut self,
        id: &ResourceId,
        resolved: crate::secret::ResolvedCloudInit,
    ) -> bool {
        match self.resources.get_mut(id).and_then(|r| r.spec.as_mut()) {
            Some(crate::manifest::Spec::Vm(vm)) => {
                vm.cloud_init_data.resolved = Some(resolved);
                true
            }
            _ => false,
        }
    }

    /// Gives a VM or TemplateVM its resolved cloud-init snippets (the binary reads their
    /// text and names them before planning); `false` when `id` is no such resource.
    pub fn set_resolved_snippets(
        &mut self,
        id: &ResourceId,
        resolved: crate::snippet::ResolvedSnippets,
    ) -> bool {
        match self.resources.get_mut(id).and_then(|r| r.spec.as_mut()) {
            Some(crate::manifest::Spec::Vm(vm)) => {
                vm.cloud_init_data.snippets.resolved = Some(resolved);
                true
            }
            _ => false,
        }
    }

    /// The VMs and TemplateVMs that declare cloud-init snippets, with their resource
    /// (file, location) and snippets.
    pub fn snippet_vms(&self) -> impl Iterator<Item = (&Resource, &crate::manifest::Snippets)> {
        self.resources.values().filter_map(|r| match &r.spec {
            Some(crate::manifest::Spec::Vm(vm)) if !vm.cloud_init_data.snippets.is_empty() => {
                Some((r, &vm.cloud_init_data.snippets))
            }
            _ => None,
        })
    }

    /// The VMs and TemplateVMs whose cloud-init data names SOPS references
    /// (`ssh-key-refs`, `ci-password-ref`), with that data.
    pub fn cloud_init_refs(
        &self,
    ) -> impl Iterator<Item = (&ResourceId, &crate::manifest::CloudInitData)> {
        self.resources.values().filter_map(|r| match &r.spec {
            Some(crate::manifest::Spec::Vm(vm))
                if !vm.cloud_init_data.ssh_key_refs.is_empty()
                    || vm.cloud_init_data.ci_password_ref.is_some() =>
            {
                Some((&r.id, &vm.cloud_init_data))
            }
            _ => None,
        })
    }

    /// Whether a resource with this id is declared.
    pub fn contains(&self, id: &ResourceId) -> bool {
        self.resources.contains_key(id)
    }

    /// Number of resources.
    pub fn len(&self) -> usize {
        self.resources.len()
    }

    /// Whether no resource is declared.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }
}

/// An error in `resource`'s file.
fn error_at(resource: &Resource, at: Location, field: &str, message: String) -> Diagnostic {
    Diagnostic::error(&resource.path, at.line, at.column, field, message)
}

/// An error on the field that makes `reference`.
fn reference_error(from: &Resource, reference: &Reference, message: String) -> Diagnostic {
    error_at(from, reference.location, &reference.field, message)
}

/// `path:line:col`, for naming the other party of a conflict.
fn place(resource: &Resource, at: Location) -> String {
    format!("{}:{}:{}", resource.path, at.line, at.column)
}

fn guest_vmid_location(resource: &Resource) -> Location {
    match &resource.placement {
        Placement::Guest { vmid_location, .. } => *vmid_location,
        Placement::Artifact { .. } => resource.location,
    }
}

/// Hand-made resources for unit tests, as the manifest parser would produce them.
#[cfg(test)]
pub(crate) mod fixture {
    use super::*;

    fn resource(kind: Kind, name: &str, placement: Placement) -> Resource {
        Resource {
            id: ResourceId::new(kind, name),
            path: format!("{}/base/{name}.yaml", kind.root()),
            location: Location { line: 4, column: 9 },
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            placement,
            references: Vec::new(),
            spec: None,
        }
    }

    fn guest(kind: Kind, name: &str, node: &str, vmid: u32) -> Resource {
        let vmid_location = Location { line: 8, column: 9 };
        resource(
            kind,
            name,
            Placement::Guest {
                node: node.to_owned(),
                vmid,
                vmid_location,
            },
        )
    }

    fn artifact(kind: Kind, name: &str, nodes: &[&str], filename: &str) -> Resource {
        let nodes = nodes.iter().map(|n| (*n).to_owned()).collect();
        let placement = Placement::Artifact {
            nodes,
            storage: "local".to_owned(),
            filename: filename.to_owned(),
        };
        resource(kind, name, placement)
    }

    /// A VM at `vm/base/<name>.yaml`.
    pub(crate) fn vm(name: &str, node: &str, vmid: u32) -> Resource {
        guest(Kind::Vm, name, node, vmid)
    }

    /// An LXC at `lxc/base/<name>.yaml`.
    pub(crate) fn lxc(name: &str, node: &str, vmid: u32) -> Resource {
        guest(Kind::Lxc, name, node, vmid)
    }

    /// A TemplateVM at `templatevm/base/<name>.yaml`.
    pub(crate) fn template_vm(name: &str, node: &str, vmid: u32) -> Resource {
        guest(Kind::TemplateVm, name, node, vmid)
    }

    /// An ISO on `local` of each node.
    pub(crate) fn iso(name: &str, nodes: &[&str]) -> Resource {
        artifact(Kind::Iso, name, nodes, &format!("{name}.iso"))
    }

    /// A DiskImage on `local` of each node.
    pub(crate) fn disk_image(name: &str, nodes: &[&str]) -> Resource {
        artifact(Kind::DiskImage, name, nodes, &format!("{name}.qcow2"))
    }

    /// A CTTemplate on `local` of each node.
    pub(crate) fn ct_template(name: &str, nodes: &[&str]) -> Resource {
        artifact(Kind::CtTemplate, name, nodes, &format!("{name}.tar.zst"))
    }

    /// Builders for the parts of a resource tests vary.
    pub(crate) trait ResourceFixture: Sized {
        /// Adds a structured reference made by `field`.
        fn referencing(self, kind: Kind, name: &str, field: &str) -> Self;
        /// Adds a `proxops/depends-on` edge.
        fn depending_on(self, kind: Kind, name: &str) -> Self;
        /// Moves the resource to another file.
        fn in_file(self, path: &str) -> Self;
        /// Sets an artifact's `spec.filename`.
        fn with_filename(self, filename: &str) -> Self;

        fn with_iso(self, name: &str) -> Self {
            self.referencing(Kind::Iso, name, "spec.hardware.cdrom.iso")
        }
        fn with_image(self, name: &str) -> Self {
            self.referencing(Kind::DiskImage, name, "spec.disks[0].image")
        }
        fn with_template(self, name: &str) -> Self {
            self.referencing(Kind::CtTemplate, name, "spec.template")
        }
        fn cloned_from(self, name: &str) -> Self {
            self.referencing(Kind::TemplateVm, name, "spec.clone")
        }
    }

    impl ResourceFixture for Resource {
        fn referencing(mut self, kind: Kind, name: &str, field: &str) -> Self {
            let line = 10 + self.references.len();
            self.references.push(Reference {
                target: ResourceId::new(kind, name),
                field: field.to_owned(),
                location: Location { line, column: 11 },
                explicit: false,
            });
            self
        }

        fn depending_on(mut self, kind: Kind, name: &str) -> Self {
            self.references.push(Reference {
                target: ResourceId::new(kind, name),
                field: "metadata.annotations.proxops/depends-on".to_owned(),
                location: Location {
                    line: 6,
                    column: 27,
                },
                explicit: true,
            });
            self
        }

        fn in_file(mut self, path: &str) -> Self {
            path.clone_into(&mut self.path);
            self
        }

        fn with_filename(mut self, name: &str) -> Self {
            if let Placement::Artifact { filename, .. } = &mut self.placement {
                name.clone_into(filename);
            }
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::*;
    use super::*;

    fn errors(resources: Vec<Resource>) -> Vec<String> {
        let mut diagnostics = Manifest::from_parsed(resources).expect_err("invalid");
        crate::diagnostic::sort_diagnostics(&mut diagnostics);
        diagnostics.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn valid_resources_make_a_manifest_sorted_by_id() {
        let manifest = Manifest::from_parsed(vec![
            vm("web", "pve1", 100)
                .with_iso("netinst")
                .with_image("debian"),
            lxc("db", "pve1", 101).with_template("debian-ct"),
            vm("clone", "pve1", 102).cloned_from("golden"),
            template_vm("golden", "pve1", 9000),
            iso("netinst", &["pve1", "pve2"]),
            disk_image("debian", &["pve1"]),
            ct_template("debian-ct", &["pve1"]),
        ])
        .expect("valid");
        assert_eq!(manifest.len(), 7);
        let names: Vec<String> = manifest.ids().map(ToString::to_string).collect();
        assert_eq!(
            names,
            [
                "ISO/netinst",
                "CTTemplate/debian-ct",
                "DiskImage/debian",
                "TemplateVM/golden",
                "VM/clone",
                "VM/web",
                "LXC/db"
            ]
        );
        assert_eq!(manifest.of_kind(Kind::Vm).count(), 2);
        assert!(manifest.contains(&ResourceId::new(Kind::Lxc, "db")));
    }

    #[test]
    fn duplicate_name_points_at_the_second_and_names_the_first() {
        let first = vm("web", "pve1", 100).in_file("vm/base/a.yaml");
        let second = vm("web", "pve1", 101).in_file("vm/base/b.yaml");
        assert_eq!(
            errors(vec![second, first]),
            [
                "vm/base/b.yaml:4:9: error: metadata.name: duplicate VM `web`: already declared at \
              vm/base/a.yaml:4:9\n  help: names are unique per kind; rename one of the two VMs"
            ]
        );
    }

    #[test]
    fn same_name_in_different_kinds_is_fine() {
        assert!(
            Manifest::from_parsed(vec![vm("web", "pve1", 100), lxc("web", "pve1", 101)]).is_ok()
        );
    }

    #[test]
    fn vmid_is_unique_across_guest_kinds_and_nodes() {
        let found = errors(vec![vm("web", "pve1", 100), lxc("db", "pve2", 100)]);
        assert_eq!(found.len(), 1);
        assert!(
            found[0].starts_with(
                "vm/base/web.yaml:8:9: error: spec.vmid: vmid 100 is already used by LXC `db` at \
                 lxc/base/db.yaml:8:9"
            ),
            "{found:?}"
        );
    }

    #[test]
    fn reference_to_a_missing_artifact_names_the_field_and_suggests_a_name() {
        let found = errors(vec![
            vm("web", "pve1", 100).with_iso("netins"),
            iso("netinst", &["pve1"]),
        ]);
        assert_eq!(
            found,
            [
                "vm/base/web.yaml:10:11: error: spec.hardware.cdrom.iso: ISO `netins` is not declared\n  \
              help: did you mean `netinst`?"
            ]
        );
    }

    #[test]
    fn each_kind_of_missing_reference_is_reported() {
        let found = errors(vec![
            vm("web", "pve1", 100).with_image("img").cloned_from("tpl"),
            lxc("db", "pve1", 101)
                .with_template("ct")
                .depending_on(Kind::Vm, "nope"),
        ]);
        assert_eq!(found.len(), 4, "{found:?}");
        assert!(
            found
                .iter()
                .any(|d| d.contains("spec.template: CTTemplate `ct` is not declared"))
        );
        assert!(
            found
                .iter()
                .any(|d| d.contains("spec.disks[0].image: DiskImage `img` is not declared"))
        );
        assert!(
            found
                .iter()
                .any(|d| d.contains("spec.clone: TemplateVM `tpl` is not declared"))
        );
        assert!(
            found
                .iter()
                .any(|d| d.contains("depends-on target `VM/nope` does not exist"))
        );
    }

    #[test]
    fn artifact_missing_from_the_guest_node_names_both() {
        let found = errors(vec![
            lxc("db", "pve2", 101).with_template("debian"),
            ct_template("debian", &["pve1"]),
        ]);
        assert_eq!(
            found,
            [
                "lxc/base/db.yaml:10:11: error: spec.template: CTTemplate `debian` is not on node \
              `pve2`, where LXC `db` runs: ctt/base/debian.yaml declares it on pve1\n  help: add \
              `pve2` to spec.nodes of CTTemplate `debian`"
            ]
        );
    }

    #[test]
    fn clone_from_a_template_on_another_node_is_an_error() {
        let found = errors(vec![
            vm("web", "pve2", 100).cloned_from("golden"),
            template_vm("golden", "pve1", 9000),
        ]);
        assert_eq!(found.len(), 1);
        assert!(
            found[0].contains("spec.clone: TemplateVM `golden` is on node `pve1`, not on `pve2`")
        );
    }

    #[test]
    fn two_artifacts_naming_the_same_file_on_a_node_is_a_warning() {
        let (manifest, diagnostics) = Manifest::check(vec![
            iso("netinst", &["pve1", "pve2"]),
            iso("installer", &["pve2"]).with_filename("netinst.iso"),
            disk_image("netinst", &["pve2"]),
        ]);
        assert_eq!(manifest.len(), 3);
        let rendered: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
        assert_eq!(
            rendered,
            [
                "iso/base/netinst.yaml:4:9: warning: local:iso/netinst.iso on node `pve2` is also \
                 declared by ISO `installer` at iso/base/installer.yaml:4:9\n  help: declare each \
                 file once and list every node in spec.nodes"
            ]
        );
    }

    #[test]
    fn depends_on_may_cross_nodes() {
        assert!(
            Manifest::from_parsed(vec![
                vm("web", "pve2", 100).depending_on(Kind::Iso, "netinst"),
                iso("netinst", &["pve1"]),
            ])
            .is_ok()
        );
    }

    #[test]
    fn an_artifact_cannot_depend_on_anything() {
        let found = errors(vec![
            iso("netinst", &["pve1"]).depending_on(Kind::Vm, "web"),
            vm("web", "pve1", 100),
        ]);
        assert_eq!(found.len(), 1);
        assert!(found[0].contains("an artifact cannot depend on `VM/web`"));
    }
}
