//! Planning guests (VM, LXC, TemplateVM, TemplateCT) as DESIGN.md §2.4–2.6 and §3 say.
//!
//! Per declared guest in scope, by what PVE reports at its vmid:
//! - nothing → `create` (or `clone` from its TemplateVM), then `promote` for a template or
//!   `start` when `state: started`;
//! - a guest on another node → a `moved` finding, never a second guest; a guest ProxOps does
//!   not own (no `proxops` tag, no `proxops/adopt: "true"`) or of the other type → an
//!   `unmanaged-vmid` finding; a live template declared as VM/LXC → `template-mismatch`;
//! - an owned guest → `compare` → `update` with only the changed keys, `delete=` and the
//!   digest; changes PVE leaves pending on a running guest → `needs-reboot`, or a `reboot`
//!   under `restart_on_change` / `proxops/restart: on-change`; `proxops/drift: report` turns
//!   every correction into a `drift` finding; then `start`/`shutdown` for the power state,
//!   and `promote` for a live non-template declared as a template.
//!
//! Prune (`plan_prune`): an owned guest (inventory and `proxops` tag) no manifest declares is
//! an `orphaned` finding, or with `prune` a `shutdown` + `delete` in the last level: never
//! when PVE `protection` is set or its config is unreadable, at most `max_prune` per pass,
//! and not at all for a guest type with no manifests while its candidates exceed
//! `max_prune`, nor when the revision declares no guest at all (a probable bad push).

use std::collections::{BTreeMap, BTreeSet};

use crate::guest::{
    self, Artifacts, CompareContext, GuestDiff, GuestType, LiveConfig, RenderedConfig,
    format_pve_size, parse_bool,
};
use crate::manifest::{ADOPT, DRIFT, Placement, PowerState, RESTART, Resource, Spec};
use crate::observed::{ObservedGuest, ObservedState};
use crate::plan::{
    Action, Change, CloneFrom, Create, Finding, FindingKind, Grow, GuestRef, Inventory, Plan,
    Policy, PoolMove, Update, Verb,
};
use crate::repository::DesiredState;
use crate::resource::{Kind, ResourceId};

/// The manifest kind a live guest is counted as.
pub(crate) fn kind_of(guest_type: GuestType, template: bool) -> Kind {
    match (guest_type, template) {
        (GuestType::Qemu, false) => Kind::Vm,
        (GuestType::Qemu, true) => Kind::TemplateVm,
        (GuestType::Lxc, false) => Kind::Lxc,
        (GuestType::Lxc, true) => Kind::TemplateCt,
    }
}

fn guest_type_of(kind: Kind) -> GuestType {
    match kind {
        Kind::Lxc | Kind::TemplateCt => GuestType::Lxc,
        _ => GuestType::Qemu,
    }
}

/// A declared guest: where it is and what state it should be in.
struct Declared<'a> {
    resource: &'a Resource,
    node: &'a str,
    vmid: u32,
    state: PowerState,
    guest_type: GuestType,
}

impl<'a> Declared<'a> {
    fn of(resource: &'a Resource) -> Option<Self> {
        let (node, vmid, state) = match resource.spec.as_ref()? {
            Spec::Vm(spec) => (spec.node.as_str(), spec.vmid.get(), spec.state),
            Spec::Lxc(spec) => (spec.node.as_str(), spec.vmid.get(), spec.state),
            Spec::Artifact(_) => return None,
        };
        Some(Self {
            resource,
            node,
            vmid,
            state,
            guest_type: guest_type_of(resource.id.kind),
        })
    }

    fn id(&self) -> &ResourceId {
        &self.resource.id
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.resource.annotations.get(key).map(String::as_str)
    }

    fn template(&self) -> bool {
        matches!(self.resource.id.kind, Kind::TemplateVm | Kind::TemplateCt)
    }

    fn guest_ref(&self) -> GuestRef {
        GuestRef {
            vmid: self.vmid,
            guest_type: self.guest_type,
        }
    }

    fn action(&self, verb: Verb, reason: String) -> Action {
        Action {
            resource: self.id().clone(),
            node: self.node.to_owned(),
            verb,
            reason,
        }
    }

    fn finding(&self, kind: FindingKind, field: &str, desired: &str, observed: &str) -> Finding {
        Finding {
            resource: self.id().clone(),
            node: self.node.to_owned(),
            kind,
            field: field.to_owned(),
            desired: desired.to_owned(),
            observed: observed.to_owned(),
            message: String::new(),
        }
    }
}

fn with_message(mut finding: Finding, message: String) -> Finding {
    finding.message = message;
    finding
}

/// The plan when `/cluster/resources` could not be read: no action at all, a finding for
/// every resource in scope, and every one of them blocked.
pub(crate) fn abort(desired: &DesiredState, policy: &Policy, reason: &str, plan: &mut Plan) {
    let message = format!(
        "listing the cluster's guests (/cluster/resources) failed: {reason}; nothing is written this pass, the next pass retries"
    );
    plan.aborted = Some(message.clone());
    for resource in desired.manifest.resources() {
        let nodes: Vec<String> = match &resource.placement {
            Placement::Guest { node, .. } => vec![node.clone()],
            Placement::Artifact { nodes, .. } => nodes.clone(),
        };
        for node in nodes.into_iter().filter(|n| policy.scope.includes(n)) {
            plan.findings.push(Finding {
                resource: resource.id.clone(),
                node: node.clone(),
                kind: FindingKind::ObserveFailed,
                field: String::new(),
                desired: String::new(),
                observed: String::new(),
                message: message.clone(),
            });
            plan.blocked.insert((resource.id.clone(), node));
        }
    }
}

/// The dependency level of every resource.
pub(super) fn level_index(desired: &DesiredState) -> BTreeMap<&ResourceId, usize> {
    desired
        .levels
        .iter()
        .enumerate()
        .flat_map(|(i, ids)| ids.iter().map(move |id| (id, i)))
        .collect()
}

/// How ProxOps created a guest: the create-only facts PVE does not keep in the config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Creation {
    /// The TemplateVM it was fully cloned from (`None`: created, not cloned).
    pub clone: Option<String>,
    /// The `ostemplate` volid an LXC was created from.
    pub ostemplate: Option<String>,
    /// Disk slot → the volid its image was imported from (`import-from=`).
    pub imports: BTreeMap<String, String>,
}

impl Creation {
    /// The creation facts of a create or clone action (`None` for other verbs).
    pub fn of(verb: &Verb) -> Option<Self> {
        match verb {
            Verb::Clone(clone) => Some(Self::cloned_from(&clone.source)),
            Verb::Create(create) => Some(Self::created_with(&create.params)),
            _ => None,
        }
    }

    /// A guest fully cloned from the TemplateVM `source`.
    pub fn cloned_from(source: &str) -> Self {
        Self {
            clone: Some(source.to_owned()),
            ..Self::default()
        }
    }

    /// A guest created with these create parameters.
    pub fn created_with(params: &BTreeMap<String, String>) -> Self {
        Self {
            clone: None,
            ostemplate: params.get("ostemplate").cloned(),
            imports: params
                .iter()
                .filter_map(|(slot, value)| {
                    let props = guest::PropertyString::parse(value, Some("file"));
                    Some((slot.clone(), props.get("import-from")?.to_owned()))
                })
                .collect(),
        }
    }
}

/// `requires-recreate` findings for the create-only fields PVE does not keep: the clone
/// source, an LXC's `template` and a disk's `image`, against how ProxOps created the guest.
/// Without a record (the CLI has no store; a guest adopted or created by the Go program)
/// there is nothing to compare, so nothing is reported.
fn recreate_findings(
    declared: &Declared<'_>,
    rendered: &RenderedConfig,
    creation: &Creation,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut report = |field: &str, desired: &str, recorded: &str| {
        let finding = declared.finding(FindingKind::RequiresRecreate, field, desired, recorded);
        let message = format!(
            "{field} was {} when the guest was created; it can only be set then, so the guest is left as is (recreate it by hand to apply it)",
            if recorded.is_empty() {
                "not set"
            } else {
                recorded
            }
        );
        out.push(with_message(finding, message));
    };
    if rendered.clone != creation.clone {
        report(
            "spec.clone",
            rendered.clone.as_deref().unwrap_or(""),
            creation.clone.as_deref().unwrap_or(""),
        );
    }
    if let Some(ostemplate) = rendered.create_only.get("ostemplate")
        && creation
            .ostemplate
            .as_ref()
            .is_some_and(|o| o != ostemplate)
    {
        report(
            "spec.template",
            ostemplate,
            creation.ostemplate.as_deref().unwrap_or(""),
        );
    }
    // A clone's disks come from its template: only a created guest's imports compare.
    if creation.clone.is_none() {
        for (slot, owned) in &rendered.owned {
            let guest::Rule::Disk(rule) = &owned.rule else {
                continue;
            };
            let Some(image) = &rule.import_from else {
                continue;
            };
            let recorded = creation.imports.get(slot);
            if recorded != Some(image) {
                report(
                    &format!("{slot}.image"),
                    image,
                    recorded.map_or("", String::as_str),
                );
            }
        }
    }
    out
}

/// Plans every declared guest in scope into `levels` (indexed by dependency level).
pub(crate) fn plan_guests(
    desired: &DesiredState,
    observed: &ObservedState,
    inventory: &Inventory,
    policy: &Policy,
    levels: &mut [Vec<Action>],
    plan: &mut Plan,
) {
    let artifacts = Artifacts::from_manifest(&desired.manifest);
    let level_of = level_index(desired);
    for resource in desired.manifest.resources() {
        let Some(declared) = Declared::of(resource) else {
            continue;
        };
        if !policy.scope.includes(declared.node) {
            continue;
        }
        let Some(rendered) = guest::render(resource, &artifacts) else {
            continue;
        };
        for unsent in &rendered.unsent {
            plan.findings.push(with_message(
                declared.finding(FindingKind::NotSent, &unsent.field, "", ""),
                format!(
                    "{} is accepted but never sent to PVE: {}",
                    unsent.field, unsent.reason
                ),
            ));
        }
        let level = level_of.get(&resource.id).copied().unwrap_or(0);
        let mut actions = Vec::new();
        let creation = inventory
            .created
            .get(&(declared.node.to_owned(), declared.vmid));
        plan_one(
            desired,
            &declared,
            &rendered,
            (observed, creation),
            policy,
            &mut actions,
            plan,
        );
        if let Some(slot) = levels.get_mut(level) {
            slot.extend(actions);
        } else if let Some(last) = levels.last_mut() {
            last.extend(actions);
        }
    }
}

fn plan_one(
    desired: &DesiredState,
    declared: &Declared<'_>,
    rendered: &RenderedConfig,
    (observed, creation): (&ObservedState, Option<&Creation>),
    policy: &Policy,
    actions: &mut Vec<Action>,
    plan: &mut Plan,
) {
    let vmid = declared.vmid;
    let Some(live) = observed.guest(vmid) else {
        if observed.hidden_vmids.contains(&vmid) {
            // SOURCE-AUDIT.md M25: a create would be refused `already exists` on every pass.
            plan.findings.push(with_message(
                declared.finding(FindingKind::ObserveFailed, "spec.vmid", "", "hidden"),
                format!(
                    "vmid {vmid} exists in the cluster but is not visible to this token (PVE lists a guest only with VM.Audit on /vms/{vmid}), so it is not created: a create would be refused `already exists`; grant the token's user VM.Audit on /vms/{vmid} (e.g. `pveum acl modify /vms/{vmid} --users <user> --roles PVEAuditor`) to let ProxOps see it, or declare a free vmid"
                ),
            ));
            plan.blocked
                .insert((declared.id().clone(), declared.node.to_owned()));
            return;
        }
        plan_absent(desired, declared, rendered, actions, plan);
        return;
    };
    let block = |plan: &mut Plan| {
        plan.blocked
            .insert((declared.id().clone(), declared.node.to_owned()));
    };
    if live.node != declared.node {
        plan.findings.push(with_message(
            declared.finding(FindingKind::Moved, "spec.node", declared.node, &live.node),
            format!(
                "vmid {vmid} is on node {} (moved, e.g. by HA); it is not created a second time on {}",
                live.node, declared.node
            ),
        ));
        block(plan);
        return;
    }
    if live.guest_type != declared.guest_type {
        plan.findings.push(with_message(
            declared.finding(
                FindingKind::UnmanagedVmid,
                "spec.vmid",
                declared.guest_type.as_str(),
                live.guest_type.as_str(),
            ),
            format!(
                "vmid {vmid} is held by a {} guest where a {} is declared; it is left untouched",
                live.guest_type.as_str(),
                declared.id().kind
            ),
        ));
        block(plan);
        return;
    }
    let adopt = declared.annotation(ADOPT) == Some("true");
    if !live.is_owned() && !adopt {
        plan.findings.push(with_message(
            declared.finding(FindingKind::UnmanagedVmid, "tags", "proxops", &tags_text(live)),
            format!(
                "vmid {vmid} is held by an unmanaged guest (no `proxops` tag); it is left untouched unless the manifest says proxops/adopt: \"true\""
            ),
        ));
        block(plan);
        return;
    }
    if let Some(lock) = &live.lock {
        plan.findings.push(with_message(
            declared.finding(FindingKind::ObserveFailed, "lock", "", lock),
            format!("guest {vmid} is locked ({lock}); nothing is changed this pass, the next pass retries"),
        ));
        block(plan);
        return;
    }
    let config = match &live.config {
        Some(Ok(config)) => config,
        Some(Err(reason)) => {
            plan.findings.push(with_message(
                declared.finding(FindingKind::ObserveFailed, "", "", ""),
                format!("reading the config of guest {vmid} failed: {reason}; nothing is changed this pass, the next pass retries"),
            ));
            block(plan);
            return;
        }
        None => {
            plan.findings.push(with_message(
                declared.finding(FindingKind::ObserveFailed, "", "", ""),
                format!("the config of guest {vmid} was not read; nothing is changed this pass"),
            ));
            block(plan);
            return;
        }
    };
    if (live.template || config.is_template()) && !declared.template() {
        plan.findings.push(with_message(
            declared.finding(FindingKind::TemplateMismatch, "template", "0", "1"),
            format!(
                "guest {vmid} is a template where a {} is declared; PVE cannot turn a template back, so it is left as is",
                declared.id().kind
            ),
        ));
        return;
    }
    if let Some(creation) = creation {
        plan.findings
            .extend(recreate_findings(declared, rendered, creation));
    }
    plan_present(declared, rendered, live, config, policy, actions, plan);
}

fn tags_text(live: &ObservedGuest) -> String {
    live.tags.iter().cloned().collect::<Vec<_>>().join(";")
}

fn grows(resizes: &[guest::Resize]) -> Vec<Grow> {
    resizes
        .iter()
        .map(|r| Grow {
            slot: r.slot.clone(),
            size: format_pve_size(r.size.bytes()),
        })
        .collect()
}

fn plan_absent(
    desired: &DesiredState,
    declared: &Declared<'_>,
    rendered: &RenderedConfig,
    actions: &mut Vec<Action>,
    plan: &mut Plan,
) {
    let vmid = declared.vmid;
    if let Some(source) = &rendered.clone {
        let source_id = ResourceId::new(Kind::TemplateVm, source.clone());
        let source_vmid = match desired.manifest.get(&source_id).map(|r| &r.placement) {
            Some(Placement::Guest { vmid, .. }) => *vmid,
            _ => {
                plan.findings.push(with_message(
                    declared.finding(FindingKind::ObserveFailed, "spec.clone", source, ""),
                    format!("the TemplateVM {source} to clone from is not declared"),
                ));
                return;
            }
        };
        actions.push(declared.action(
            Verb::Clone(CloneFrom {
                vmid,
                source: source.clone(),
                source_vmid,
                name: rendered.value("name").unwrap_or_default().to_owned(),
                pool: rendered.pool.clone(),
            }),
            format!(
                "no guest has vmid {vmid}: full clone of TemplateVM/{source} (vmid {source_vmid}), then its own config is written"
            ),
        ));
    } else {
        let mut params = rendered.create_params();
        params.insert("start".to_owned(), "0".to_owned());
        // PVE checks a create's `tags` with `check_vm_perm($vmid, undef, ['VM.Config.Options'])`
        // (pve-guest-common @ 4a8f6cb `GuestHelpers.pm` `assert_tag_permissions`, called by
        // qemu-server @ e6352be6 `create_vm` and pve-container @ 94f5585
        // `check_ct_modify_config_perm`), on `/vms/<vmid>` alone, before `add_vm_to_pool`: a
        // token whose grants are on the pool is refused. Into a pool, the tags are written
        // right after the create instead, when the guest is a member.
        let after: BTreeMap<String, String> = match &rendered.pool {
            Some(_) => params.remove_entry("tags").into_iter().collect(),
            None => BTreeMap::new(),
        };
        actions.push(declared.action(
            Verb::Create(Create {
                vmid,
                guest_type: declared.guest_type,
                params,
                grow: grows(&rendered.grow_after_create),
                after,
            }),
            format!("no guest has vmid {vmid}"),
        ));
    }
    if declared.template() {
        actions.push(declared.action(
            Verb::Promote(declared.guest_ref()),
            format!("{} is declared as a template", declared.id().kind),
        ));
    } else if declared.state == PowerState::Started {
        actions.push(declared.action(
            Verb::Start(declared.guest_ref()),
            "state: started".to_owned(),
        ));
    }
}

fn map_kind(kind: guest::FindingKind) -> FindingKind {
    match kind {
        guest::FindingKind::LiveOnlySlot => FindingKind::LiveOnlySlot,
        guest::FindingKind::UnsafeVolumeChange => FindingKind::UnsafeVolumeChange,
        guest::FindingKind::RequiresRecreate => FindingKind::RequiresRecreate,
        guest::FindingKind::Drift => FindingKind::Drift,
    }
}

fn finding_message(kind: FindingKind, field: &str) -> String {
    match kind {
        FindingKind::LiveOnlySlot => {
            format!("{field} exists on PVE but is not declared; it is never removed")
        }
        FindingKind::UnsafeVolumeChange => format!(
            "{field}: a pool change, a shrink or a write over a live volume would lose data; it is not done"
        ),
        FindingKind::RequiresRecreate => format!(
            "{field} can only be set when the guest is created; recreate it by hand to apply it"
        ),
        _ => format!("{field} differs from the manifest and has no write form; reported only"),
    }
}

/// The field changes of a diff, for people (`cipassword` never shown, nor the live value of a
/// key whose desired value is sealed: it may hold the secret keys).
fn changes(diff: &GuestDiff, live: &LiveConfig) -> Vec<Change> {
    let sealed = |key: &str| {
        key == "cipassword"
            || diff
                .set
                .get(key)
                .is_some_and(|v| crate::secret::is_marker(v))
    };
    let shown = |key: &str, value: &str| {
        if crate::secret::is_marker(value) {
            value.to_owned()
        } else if sealed(key) {
            crate::secret::REDACTED.to_owned()
        } else {
            value.to_owned()
        }
    };
    let mut out: Vec<Change> = diff
        .set
        .iter()
        .map(|(k, v)| Change {
            field: k.clone(),
            observed: shown(k, live.get(k).unwrap_or("")),
            desired: shown(k, v),
        })
        .collect();
    out.extend(diff.delete.iter().map(|k| Change {
        field: k.clone(),
        observed: shown(k, live.get(k).unwrap_or("")),
        desired: String::new(),
    }));
    out.extend(diff.resize.iter().map(|r| {
        let observed = live
            .entry(&r.slot)
            .and_then(|e| e.props.as_ref())
            .and_then(|p| p.get("size"))
            .unwrap_or("")
            .to_owned();
        Change {
            field: format!("{}.size", r.slot),
            observed,
            desired: format_pve_size(r.size.bytes()),
        }
    }));
    out
}

/// The update a diff asks for (`None` when it changes nothing).
fn update_of(vmid: u32, guest_type: GuestType, diff: &GuestDiff, live: &LiveConfig) -> Update {
    Update {
        vmid,
        guest_type,
        set: diff.set.clone(),
        delete: diff.delete.clone(),
        digest: live.digest().map(str::to_owned),
        grow: grows(&diff.resize),
        changes: changes(diff, live),
        regenerate_cloudinit: diff.set.contains_key("cicustom"),
    }
}

fn plan_present(
    declared: &Declared<'_>,
    rendered: &RenderedConfig,
    live: &ObservedGuest,
    config: &LiveConfig,
    policy: &Policy,
    actions: &mut Vec<Action>,
    plan: &mut Plan,
) {
    let vmid = declared.vmid;
    let report_only = declared.annotation(DRIFT) == Some("report");
    let restart_allowed = match declared.annotation(RESTART) {
        Some("on-change") => true,
        Some("never") => false,
        _ => policy.restart_on_change,
    };
    let diff = guest::compare(rendered, config, &CompareContext::default());
    // Against the values in effect now: what stays pending once the manifest is written
    // (the same diff when PVE holds nothing).
    let diff_now = if config.pending_keys().next().is_some() {
        guest::compare(rendered, &config.current(), &CompareContext::default())
    } else {
        diff.clone()
    };
    for f in &diff.findings {
        let kind = map_kind(f.kind);
        plan.findings.push(with_message(
            declared.finding(kind, &f.field, &f.desired, &f.observed),
            finding_message(kind, &f.field),
        ));
    }
    let running = live.is_running();
    let mut updating = false;
    if diff.has_changes() {
        let update = update_of(vmid, declared.guest_type, &diff, config);
        if report_only {
            for change in &update.changes {
                plan.findings.push(with_message(
                    declared.finding(
                        FindingKind::Drift,
                        &change.field,
                        &change.desired,
                        &change.observed,
                    ),
                    format!(
                        "{} differs from the manifest; proxops/drift: report, so it is left as is",
                        change.field
                    ),
                ));
            }
        } else {
            let fields: Vec<&str> = update.changes.iter().map(|c| c.field.as_str()).collect();
            actions.push(declared.action(
                Verb::Update(update.clone()),
                format!("drift in {}", fields.join(", ")),
            ));
            updating = true;
        }
    }
    plan_pool(declared, rendered, live, report_only, actions, plan);

    // Power and template state.
    let wants_template = declared.template();
    let mut power_change = false;
    // `/cluster/resources` reports `template` from pvestatd's last run (pve-manager
    // `PVE/API2Tools.pm` `extract_vm_stats`, refreshed every 10 s by `pvestatd.pm`), so a
    // pass right after a promote still sees `template: 0` there; the config just read has
    // `template: 1` at once (qemu-server `template_create`, pve-container `vztemplate`
    // worker `$conf->{template} = 1`). Either says the guest is a template.
    let is_template = live.template || config.is_template();
    if wants_template && !is_template {
        if report_only {
            plan.findings.push(with_message(
                declared.finding(FindingKind::Drift, "template", "1", "0"),
                "the guest is not a template; proxops/drift: report, so it is left as is"
                    .to_owned(),
            ));
            return;
        }
        if running {
            actions.push(declared.action(
                Verb::Shutdown(declared.guest_ref()),
                "a template must be stopped before it is marked".to_owned(),
            ));
        }
        actions.push(declared.action(
            Verb::Promote(declared.guest_ref()),
            format!(
                "guest {vmid} is not a template; {} is declared",
                declared.id().kind
            ),
        ));
        return;
    }
    if wants_template {
        return;
    }
    let power = match declared.state {
        PowerState::Started if live.is_stopped() => Some((
            Verb::Start(declared.guest_ref()),
            "state: started, PVE reports it stopped",
        )),
        PowerState::Stopped if running => Some((
            Verb::Shutdown(declared.guest_ref()),
            "state: stopped, PVE reports it running",
        )),
        _ => None,
    };
    if let Some((verb, reason)) = power {
        power_change = true;
        if report_only {
            plan.findings.push(with_message(
                declared.finding(
                    FindingKind::Drift,
                    "spec.state",
                    match declared.state {
                        PowerState::Started => "started",
                        PowerState::Stopped => "stopped",
                    },
                    &live.status,
                ),
                format!("{reason}; proxops/drift: report, so it is left as is"),
            ));
        } else {
            actions.push(declared.action(verb, reason.to_owned()));
        }
    }

    // Changes PVE holds until the running guest restarts.
    if !running || power_change {
        return;
    }
    let pending = held_for_restart(rendered, config, live, &diff, &diff_now, updating);
    if pending.is_empty() {
        return;
    }
    let keys = pending.into_iter().collect::<Vec<_>>().join(", ");
    if restart_allowed && !report_only {
        actions.push(declared.action(
            Verb::Reboot(declared.guest_ref()),
            format!(
                "pending changes ({keys}) apply only after a restart, and restarts are allowed"
            ),
        ));
    } else {
        plan.findings.push(with_message(
            declared.finding(FindingKind::NeedsReboot, &keys, "", ""),
            format!(
                "PVE holds changes to {keys} until the guest restarts; restart it, or allow it with restart_on_change or proxops/restart: on-change"
            ),
        ));
    }
}

/// Pool membership: a guest outside its declared pool is moved there (`PUT /pools` with
/// `allow-move`, which also takes it out of the pool it is in), or reported under
/// `proxops/drift: report`.
fn plan_pool(
    declared: &Declared<'_>,
    rendered: &RenderedConfig,
    live: &ObservedGuest,
    report_only: bool,
    actions: &mut Vec<Action>,
    plan: &mut Plan,
) {
    let Some(drift) = guest::compare_pool(rendered.pool.as_deref(), live.pool.as_deref()) else {
        return;
    };
    let observed = drift.observed.as_deref().unwrap_or("");
    let was = drift
        .observed
        .as_deref()
        .map_or_else(|| "in no pool".to_owned(), |p| format!("in pool {p}"));
    if report_only {
        plan.findings.push(with_message(
            declared.finding(FindingKind::Drift, "spec.pool", &drift.desired, observed),
            format!(
                "the guest is {was}, not in pool {}; proxops/drift: report, so it is left as is",
                drift.desired
            ),
        ));
        return;
    }
    actions.push(declared.action(
        Verb::Pool(PoolMove {
            vmid: declared.vmid,
            guest_type: declared.guest_type,
            pool: drift.desired.clone(),
            from: drift.observed.clone(),
        }),
        format!(
            "drift in spec.pool: the guest is {was}, the manifest says pool {}",
            drift.desired
        ),
    ));
}

/// The owned keys PVE will hold for a restart of the running guest once this pass is done.
///
/// A key PVE holds pending counts when the manifest's value differs from the value in effect
/// now: a pending value equal to the manifest (ProxOps's own earlier write) waits for a
/// restart, and so does the manifest's value written over an operator's pending change. A
/// pending change that differs from the manifest is drift (`diff` has it), and when the
/// value in effect already matches the manifest, writing it clears the pending entry (PVE's
/// `cleanup_pending`): nothing to restart for. Keys this pass writes that PVE cannot
/// hotplug are held too. Pending keys known only by name (no value in effect) count as
/// held. Pending changes to keys ProxOps does not own are the operator's business.
fn held_for_restart(
    rendered: &RenderedConfig,
    config: &LiveConfig,
    live: &ObservedGuest,
    diff: &GuestDiff,
    diff_now: &GuestDiff,
    updating: bool,
) -> BTreeSet<String> {
    let differs_now = |k: &str| diff_now.set.contains_key(k) || diff_now.delete.contains(k);
    let drifted = |k: &str| diff.set.contains_key(k) || diff.delete.contains(k);
    let mut held: BTreeSet<String> = config
        .pending_keys()
        .filter(|k| rendered.owned.contains_key(*k))
        .filter(|k| differs_now(k) && (updating || !drifted(k)))
        .map(str::to_owned)
        .collect();
    if let Some(Ok(keys)) = &live.pending {
        held.extend(
            keys.iter()
                .filter(|k| rendered.owned.contains_key(*k))
                .filter(|k| config.pending_keys().all(|p| p != k.as_str()))
                .filter(|k| updating || !drifted(k))
                .cloned(),
        );
    }
    if updating {
        held.extend(diff.stop_keys.iter().filter(|k| differs_now(k)).cloned());
    }
    held
}

/// The config write that follows a full clone: the VM's own config against the clone's live
/// config (inherited cloud-init identity keys the manifest does not own are deleted). `None`
/// when there is nothing to write or `id` is not a declared clone.
///
/// The executor calls this after the clone task, because only then is there a config to
/// compare with; the decision stays here, in the pure core.
pub fn clone_update(desired: &DesiredState, id: &ResourceId, live: &LiveConfig) -> Option<Update> {
    let resource = desired.manifest.get(id)?;
    let declared = Declared::of(resource)?;
    let rendered = guest::render(resource, &Artifacts::from_manifest(&desired.manifest))?;
    let diff = guest::compare(&rendered, live, &CompareContext { clone_backed: true });
    diff.has_changes()
        .then(|| update_of(declared.vmid, declared.guest_type, &diff, live))
}

/// A prune candidate, with what decides its fate.
struct Candidate<'a> {
    node: &'a str,
    vmid: u32,
    resource: &'a ResourceId,
    live: &'a ObservedGuest,
}

/// Plans prunes: returns the actions of the last level, adds findings to `plan`.
pub(crate) fn plan_prune(
    desired: &DesiredState,
    observed: &ObservedState,
    inventory: &Inventory,
    policy: &Policy,
    plan: &mut Plan,
) -> Vec<Action> {
    let declared: Vec<Declared<'_>> = desired
        .manifest
        .resources()
        .filter_map(Declared::of)
        .collect();
    let declared_vmids: BTreeSet<u32> = declared.iter().map(|d| d.vmid).collect();
    let declared_types: BTreeSet<GuestType> = declared.iter().map(|d| d.guest_type).collect();
    let candidates: Vec<Candidate<'_>> = inventory
        .guests
        .iter()
        .filter(|((node, vmid), _)| policy.scope.includes(node) && !declared_vmids.contains(vmid))
        .filter_map(|((node, vmid), resource)| {
            let live = observed.guest(*vmid)?;
            (live.node == *node && live.is_owned()).then_some(Candidate {
                node,
                vmid: *vmid,
                resource,
                live,
            })
        })
        .collect();
    let mut per_type: BTreeMap<GuestType, usize> = BTreeMap::new();
    for c in &candidates {
        *per_type.entry(c.live.guest_type).or_default() += 1;
    }
    let max = usize::try_from(policy.max_prune).unwrap_or(usize::MAX);
    let mut budget = max;
    let mut actions = Vec::new();
    for c in candidates {
        let orphan = |message: String| Finding {
            resource: c.resource.clone(),
            node: c.node.to_owned(),
            kind: FindingKind::Orphaned,
            field: String::new(),
            desired: String::new(),
            observed: format!("vmid {}", c.vmid),
            message,
        };
        let Some(config) = c.live.live() else {
            plan.findings.push(orphan(format!(
                "guest {} is owned and no longer declared, but its config could not be read; it is never pruned blind",
                c.vmid
            )));
            continue;
        };
        if !policy.prune {
            plan.findings.push(orphan(format!(
                "guest {} is owned and no longer declared; prune is off, so it is kept",
                c.vmid
            )));
            continue;
        }
        if config.get("protection").and_then(parse_bool) == Some(true) {
            plan.findings.push(orphan(format!(
                "guest {} is no longer declared but PVE protection is set; it is never deleted",
                c.vmid
            )));
            continue;
        }
        if declared.is_empty() {
            plan.findings.push(orphan(format!(
                "guest {} is no longer declared, but the revision declares no guest at all (probable bad push); nothing is pruned",
                c.vmid
            )));
            continue;
        }
        let type_count = per_type.get(&c.live.guest_type).copied().unwrap_or(0);
        if !declared_types.contains(&c.live.guest_type) && type_count > max {
            plan.findings.push(orphan(format!(
                "guest {} is no longer declared, but no {} is declared while {type_count} would be pruned (over max_prune {max}; probable bad push); nothing of that kind is pruned",
                c.vmid,
                match c.live.guest_type {
                    GuestType::Qemu => "VM",
                    GuestType::Lxc => "LXC",
                }
            )));
            continue;
        }
        if budget == 0 {
            plan.findings.push(orphan(format!(
                "guest {} is no longer declared; deferred: max_prune ({max}) reached this pass",
                c.vmid
            )));
            continue;
        }
        budget -= 1;
        let guest_ref = GuestRef {
            vmid: c.vmid,
            guest_type: c.live.guest_type,
        };
        let action = |verb, reason: String| Action {
            resource: c.resource.clone(),
            node: c.node.to_owned(),
            verb,
            reason,
        };
        if !c.live.is_stopped() {
            actions.push(action(
                Verb::Shutdown(guest_ref),
                "it is deleted next and must be stopped".to_owned(),
            ));
        }
        actions.push(action(
            Verb::Delete(guest_ref),
            format!(
                "guest {} is owned (tag proxops) and no manifest declares it; prune is on",
                c.vmid
            ),
        ));
    }
    actions
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::guest::testing::as_pve_would_store;
    use crate::guest::{Artifacts, GuestType, LiveConfig, render};
    use crate::observed::{ObservedGuest, ObservedState};
    use crate::plan::render::render_human;
    use crate::plan::{
        Action, Creation, FindingKind, Inventory, NodeScope, Plan, Policy, Verb, clone_update, plan,
    };
    use crate::repository::{DesiredState, load};
    use crate::resource::{Kind, ResourceId};

    fn desired(docs: &[&str]) -> DesiredState {
        let files: BTreeMap<String, String> = docs
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("doc{i}.yaml"), (*c).to_owned()))
            .collect();
        let loaded = load(&files);
        assert!(loaded.diagnostics.is_empty(), "{:?}", loaded.diagnostics);
        loaded.states.into_iter().next().expect("one desired state")
    }

    fn vm(name: &str, vmid: u32, extra: &str) -> String {
        format!(
            "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: {name}\n{extra}spec:\n  node: pve1\n  vmid: {vmid}\n  memory: 2GiB\n  cpu: {{type: host, cores: 2}}\n  disks:\n    - {{storage: local-lvm, size: 8GiB}}\n  networks:\n    - {{bridge: vmbr0}}\n"
        )
    }

    fn with_state(doc: &str, state: &str) -> String {
        doc.replace(
            "  memory: 2GiB",
            &format!("  state: {state}\n  memory: 2GiB"),
        )
    }

    /// The config PVE would report for the declared guest `name` (`kind`) of `state`.
    fn live_of(state: &DesiredState, kind: Kind, name: &str, vmid: u32) -> LiveConfig {
        let resource = state
            .manifest
            .get(&ResourceId::new(kind, name))
            .expect("declared");
        let rendered =
            render(resource, &Artifacts::from_manifest(&state.manifest)).expect("a guest");
        as_pve_would_store(&rendered, vmid)
    }

    fn guest(vmid: u32, status: &str, config: LiveConfig) -> ObservedGuest {
        let guest_type = config.guest_type();
        let mut g = ObservedGuest::new(vmid, "pve1", guest_type, status)
            .with_tags(config.get("tags").unwrap_or(""));
        g.template = config.is_template();
        g.config = Some(Ok(config));
        g.pending = Some(Ok(Default::default()));
        g
    }

    fn config_with(config: &LiveConfig, changes: &[(&str, Option<&str>)]) -> LiveConfig {
        let mut pairs: BTreeMap<String, String> = config
            .entries()
            .map(|(k, e)| (k.to_owned(), e.raw.clone()))
            .collect();
        for (k, v) in changes {
            match v {
                Some(v) => pairs.insert((*k).to_owned(), (*v).to_owned()),
                None => pairs.remove(*k),
            };
        }
        LiveConfig::from_pairs(config.guest_type(), pairs)
    }

    fn all() -> Policy {
        Policy::new(NodeScope::All)
    }

    fn run(state: &DesiredState, observed: &ObservedState, policy: &Policy) -> Plan {
        plan(state, observed, &Inventory::from_tags(observed), policy)
    }

    fn verbs(plan: &Plan) -> Vec<(String, &'static str)> {
        plan.actions()
            .map(|a| (a.resource.to_string(), a.verb.name()))
            .collect()
    }

    fn kinds(plan: &Plan) -> Vec<FindingKind> {
        plan.findings.iter().map(|f| f.kind).collect()
    }

    fn update(action: &Action) -> &crate::plan::Update {
        match &action.verb {
            Verb::Update(u) => u,
            other => panic!("not an update: {other:?}"),
        }
    }

    #[test]
    fn an_absent_vm_is_created_stopped_with_the_ownership_tag_then_started() {
        let state = desired(&[&vm("web", 101, "")]);
        let plan = run(&state, &ObservedState::default(), &all());
        assert_eq!(
            verbs(&plan),
            [("VM/web".into(), "create"), ("VM/web".into(), "start")]
        );
        let Verb::Create(create) = &plan.levels[0][0].verb else {
            panic!("a create")
        };
        assert_eq!(create.params["start"], "0");
        assert_eq!(create.params["tags"], "proxops");
        assert_eq!(create.params["scsi0"], "local-lvm:8");
        assert!(render_human(&plan, "repo").contains("+ create VM/web on pve1 (vmid 101)"));
    }

    #[test]
    fn a_guest_that_matches_its_manifest_plans_nothing() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        let config = live_of(&state, Kind::Vm, "web", 101);
        observed.add_guest(guest(101, "running", config));
        let plan = run(&state, &observed, &all());
        assert!(!plan.has_changes(), "{plan:?}");
        assert!(plan.findings.is_empty(), "{:?}", plan.findings);
    }

    fn in_pool(doc: &str, pool: &str) -> String {
        doc.replace("  memory: 2GiB", &format!("  pool: {pool}\n  memory: 2GiB"))
    }

    #[test]
    fn a_guest_with_a_pool_is_created_in_it() {
        let state = desired(&[&in_pool(&vm("web", 101, ""), "prod")]);
        let plan = run(&state, &ObservedState::default(), &all());
        let Verb::Create(create) = &plan.levels[0][0].verb else {
            panic!("a create")
        };
        assert_eq!(create.params["pool"], "prod");
        // The ownership tag follows once the guest is in its pool.
        assert!(!create.params.contains_key("tags"), "{create:?}");
        assert_eq!(create.after["tags"], "proxops");
    }

    #[test]
    fn a_guest_outside_its_declared_pool_is_moved_there_and_nothing_else_changes() {
        let state = desired(&[&in_pool(&vm("web", 101, ""), "prod")]);
        for observed_pool in [None, Some("lab")] {
            let mut observed = ObservedState::default();
            let mut g = guest(101, "running", live_of(&state, Kind::Vm, "web", 101));
            g.pool = observed_pool.map(str::to_owned);
            observed.add_guest(g);
            let plan = run(&state, &observed, &all());
            assert_eq!(verbs(&plan), [("VM/web".into(), "pool")], "{plan:?}");
            let Verb::Pool(pool) = &plan.levels[0][0].verb else {
                panic!("a pool move")
            };
            assert_eq!(pool.pool, "prod");
            assert_eq!(pool.from.as_deref(), observed_pool);
            assert!(
                render_human(&plan, "repo").contains(&format!(
                    "~ update VM/web on pve1: pool: {} → prod",
                    observed_pool.unwrap_or("(none)")
                )),
                "{}",
                render_human(&plan, "repo")
            );
        }
        // In the pool: nothing to do.
        let mut observed = ObservedState::default();
        let mut g = guest(101, "running", live_of(&state, Kind::Vm, "web", 101));
        g.pool = Some("prod".to_owned());
        observed.add_guest(g);
        assert!(!run(&state, &observed, &all()).has_changes());
    }

    #[test]
    fn a_pool_is_not_managed_when_the_manifest_declares_none() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        let mut g = guest(101, "running", live_of(&state, Kind::Vm, "web", 101));
        g.pool = Some("lab".to_owned());
        observed.add_guest(g);
        let plan = run(&state, &observed, &all());
        assert!(!plan.has_changes(), "{plan:?}");
        assert!(plan.findings.is_empty(), "{:?}", plan.findings);
    }

    #[test]
    fn pool_drift_under_the_report_annotation_is_only_a_finding() {
        let state = desired(&[&in_pool(
            &vm("web", 101, "  annotations:\n    proxops/drift: report\n"),
            "prod",
        )]);
        let mut observed = ObservedState::default();
        let mut g = guest(101, "running", live_of(&state, Kind::Vm, "web", 101));
        g.pool = Some("lab".to_owned());
        observed.add_guest(g);
        let plan = run(&state, &observed, &all());
        assert!(!plan.has_changes(), "{plan:?}");
        assert_eq!(kinds(&plan), [FindingKind::Drift]);
        assert_eq!(plan.findings[0].field, "spec.pool");
        assert_eq!(plan.findings[0].desired, "prod");
        assert_eq!(plan.findings[0].observed, "lab");
    }

    #[test]
    fn drift_becomes_one_update_with_only_the_changed_keys_and_the_digest() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        let config = config_with(
            &live_of(&state, Kind::Vm, "web", 101),
            &[("memory", Some("1024")), ("name", Some("renamed"))],
        );
        observed.add_guest(guest(101, "stopped", config));
        let plan = run(&state, &observed, &all());
        assert_eq!(
            verbs(&plan),
            [("VM/web".into(), "update"), ("VM/web".into(), "start")]
        );
        let u = update(&plan.levels[0][0]);
        assert_eq!(u.set.keys().collect::<Vec<_>>(), ["memory", "name"]);
        assert!(u.delete.is_empty());
        assert_eq!(
            u.digest.as_deref(),
            Some("0123456789abcdef0123456789abcdef01234567")
        );
        let text = render_human(&plan, "repo");
        assert!(text.contains("memory: 1024 → 2048"), "{text}");
    }

    #[test]
    fn drift_under_report_annotation_is_only_a_finding() {
        let annotations = "  annotations:\n    proxops/drift: report\n";
        let state = desired(&[&vm("web", 101, annotations)]);
        let mut observed = ObservedState::default();
        let config = config_with(
            &live_of(&state, Kind::Vm, "web", 101),
            &[("memory", Some("1024"))],
        );
        observed.add_guest(guest(101, "running", config));
        let plan = run(&state, &observed, &all());
        assert!(!plan.has_changes());
        assert_eq!(kinds(&plan), [FindingKind::Drift]);
        assert_eq!(plan.findings[0].field, "memory");
    }

    #[test]
    fn an_untagged_guest_at_the_vmid_is_left_untouched_unless_adopted() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        let config = config_with(
            &live_of(&state, Kind::Vm, "web", 101),
            &[("tags", Some("prod"))],
        );
        observed.add_guest(guest(101, "running", config));
        let plan = run(&state, &observed, &all());
        assert!(!plan.has_changes());
        assert_eq!(kinds(&plan), [FindingKind::UnmanagedVmid]);

        let adopt = desired(&[&vm(
            "web",
            101,
            "  annotations:\n    proxops/adopt: \"true\"\n",
        )]);
        let plan = run(&adopt, &observed, &all());
        let u = update(&plan.levels[0][0]);
        assert_eq!(u.set["tags"], "proxops");
    }

    #[test]
    fn a_guest_on_another_node_is_reported_moved_and_never_created_twice() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        let mut g = guest(101, "running", live_of(&state, Kind::Vm, "web", 101));
        g.node = "pve2".into();
        observed.add_guest(g);
        let plan = run(&state, &observed, &all());
        assert!(!plan.has_changes());
        assert_eq!(kinds(&plan), [FindingKind::Moved]);
    }

    #[test]
    fn a_live_template_declared_as_a_vm_is_a_template_mismatch() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        let config = config_with(
            &live_of(&state, Kind::Vm, "web", 101),
            &[("template", Some("1"))],
        );
        observed.add_guest(guest(101, "stopped", config));
        let plan = run(&state, &observed, &all());
        assert!(!plan.has_changes());
        assert_eq!(kinds(&plan), [FindingKind::TemplateMismatch]);
    }

    #[test]
    fn a_template_vm_is_created_and_promoted_but_never_started() {
        let tvm = vm("golden", 9000, "").replace("kind: VM", "kind: TemplateVM");
        let state = desired(&[&tvm]);
        let plan = run(&state, &ObservedState::default(), &all());
        assert_eq!(
            verbs(&plan),
            [
                ("TemplateVM/golden".into(), "create"),
                ("TemplateVM/golden".into(), "promote")
            ]
        );
    }

    #[test]
    fn a_running_non_template_declared_as_a_template_is_shut_down_and_promoted() {
        let tvm = vm("golden", 9000, "").replace("kind: VM", "kind: TemplateVM");
        let state = desired(&[&tvm]);
        let mut observed = ObservedState::default();
        let config = config_with(
            &live_of(&state, Kind::TemplateVm, "golden", 9000),
            &[("template", None)],
        );
        observed.add_guest(guest(9000, "running", config));
        let plan = run(&state, &observed, &all());
        assert_eq!(
            verbs(&plan),
            [
                ("TemplateVM/golden".into(), "shutdown"),
                ("TemplateVM/golden".into(), "promote")
            ]
        );
    }

    #[test]
    fn a_template_whose_config_says_template_is_not_promoted_while_cluster_resources_lags() {
        // Right after a promote: the config has `template: 1`, pvestatd has not published
        // it yet, so `/cluster/resources` still says `template: 0` (or has no entry).
        let tvm = vm("golden", 9000, "").replace("kind: VM", "kind: TemplateVM");
        let state = desired(&[&tvm]);
        for status in ["stopped", "unknown"] {
            let mut observed = ObservedState::default();
            let config = live_of(&state, Kind::TemplateVm, "golden", 9000);
            assert!(config.is_template());
            let mut g = guest(9000, status, config);
            g.template = false;
            observed.add_guest(g);
            let plan = run(&state, &observed, &all());
            assert_eq!(
                verbs(&plan),
                Vec::<(String, &str)>::new(),
                "status {status}"
            );
        }
    }

    #[test]
    fn a_clone_comes_one_level_after_its_template_and_then_drops_inherited_identity() {
        let tvm = vm("golden", 9000, "").replace("kind: VM", "kind: TemplateVM");
        let clone = "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: app\nspec:\n  node: pve1\n  vmid: 103\n  clone: golden\n  memory: 4GiB\n  cpu: {type: host, cores: 4}\n  networks:\n    - {bridge: vmbr0}\n";
        let state = desired(&[&tvm, clone]);
        let plan = run(&state, &ObservedState::default(), &all());
        assert_eq!(plan.levels.len(), 2);
        let Verb::Clone(c) = &plan.levels[1][0].verb else {
            panic!("a clone")
        };
        assert_eq!((c.vmid, c.source_vmid, c.name.as_str()), (103, 9000, "app"));
        assert_eq!(plan.levels[1][1].verb.name(), "start");

        // After the clone: the template's config under the new vmid, with inherited keys.
        let inherited = config_with(
            &live_of(&state, Kind::TemplateVm, "golden", 103),
            &[("template", None), ("ciuser", Some("root")), ("name", None)],
        );
        let u = clone_update(&state, &ResourceId::new(Kind::Vm, "app"), &inherited)
            .expect("a config write");
        assert_eq!(u.set["memory"], "4096");
        assert_eq!(u.set["name"], "app");
        assert!(u.delete.contains("ciuser"), "{u:?}");
        assert!(u.set.keys().all(|k| !u.delete.contains(k)));
    }

    #[test]
    fn a_stop_required_change_on_a_running_guest_needs_a_reboot_unless_restarts_are_allowed() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        let config = config_with(
            &live_of(&state, Kind::Vm, "web", 101),
            &[("cores", Some("1"))],
        );
        observed.add_guest(guest(101, "running", config));
        let plan = run(&state, &observed, &all());
        assert_eq!(verbs(&plan), [("VM/web".into(), "update")]);
        assert_eq!(kinds(&plan), [FindingKind::NeedsReboot]);

        let restart = Policy {
            restart_on_change: true,
            ..all()
        };
        let plan = run(&state, &observed, &restart);
        assert_eq!(
            verbs(&plan),
            [("VM/web".into(), "update"), ("VM/web".into(), "reboot")]
        );
        assert!(plan.findings.is_empty());

        let annotated = desired(&[&vm(
            "web",
            101,
            "  annotations:\n    proxops/restart: on-change\n",
        )]);
        let plan = run(&annotated, &observed, &all());
        assert_eq!(plan.actions().last().unwrap().verb.name(), "reboot");
    }

    #[test]
    fn changes_already_pending_on_a_running_guest_are_reported_on_later_passes() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        let mut g = guest(101, "running", live_of(&state, Kind::Vm, "web", 101));
        g.pending = Some(Ok(["cores".to_owned()].into()));
        observed.add_guest(g);
        let plan = run(&state, &observed, &all());
        assert!(!plan.has_changes());
        assert_eq!(kinds(&plan), [FindingKind::NeedsReboot]);
    }

    /// `config` as `GET .../pending` reports it with `key` pending: `current` in effect,
    /// `pending` held for a restart.
    fn with_pending(config: &LiveConfig, key: &str, current: &str, pending: &str) -> LiveConfig {
        let items: Vec<serde_json::Value> = config
            .entries()
            .filter(|(k, _)| *k != key)
            .map(|(k, e)| serde_json::json!({"key": k, "value": e.raw}))
            .chain([serde_json::json!({"key": key, "value": current, "pending": pending})])
            .collect();
        LiveConfig::from_pending_json(config.guest_type(), &serde_json::Value::Array(items))
            .expect("a pending list")
    }

    #[test]
    fn an_out_of_band_pending_change_on_a_running_vm_is_drift_and_corrected_without_a_reboot() {
        let state = desired(&[&vm("web", 101, "")]);
        let live = with_pending(
            &live_of(&state, Kind::Vm, "web", 101),
            "memory",
            "2048",
            "4096",
        );
        let mut observed = ObservedState::default();
        observed.add_guest(guest(101, "running", live.clone()));
        let plan = run(&state, &observed, &all());
        assert_eq!(verbs(&plan), [("VM/web".into(), "update")]);
        assert_eq!(update(&plan.levels[0][0]).set["memory"], "2048");
        assert!(plan.findings.is_empty(), "{:?}", plan.findings);

        // Reported only: a drift finding, the same on every pass, never needs-reboot.
        let report = desired(&[&vm(
            "web",
            101,
            "  annotations:\n    proxops/drift: report\n",
        )]);
        let mut observed = ObservedState::default();
        observed.add_guest(guest(101, "running", live));
        for _ in 0..2 {
            let plan = run(&report, &observed, &all());
            assert!(!plan.has_changes());
            assert_eq!(kinds(&plan), [FindingKind::Drift]);
            assert_eq!(plan.findings[0].field, "memory");
        }
    }

    #[test]
    fn a_pending_value_equal_to_the_manifest_on_a_running_vm_needs_a_reboot_and_nothing_else() {
        let state = desired(&[&vm("web", 101, "")]);
        let live = with_pending(
            &live_of(&state, Kind::Vm, "web", 101),
            "memory",
            "1024",
            "2048",
        );
        let mut observed = ObservedState::default();
        observed.add_guest(guest(101, "running", live));
        let plan = run(&state, &observed, &all());
        assert!(!plan.has_changes());
        assert_eq!(kinds(&plan), [FindingKind::NeedsReboot]);
        assert_eq!(plan.findings[0].field, "memory");
    }

    #[test]
    fn an_out_of_band_pending_change_over_a_stale_value_is_corrected_and_needs_a_reboot() {
        let state = desired(&[&vm("web", 101, "")]);
        let live = with_pending(
            &live_of(&state, Kind::Vm, "web", 101),
            "memory",
            "1024",
            "4096",
        );
        let mut observed = ObservedState::default();
        observed.add_guest(guest(101, "running", live));
        let plan = run(&state, &observed, &all());
        assert_eq!(verbs(&plan), [("VM/web".into(), "update")]);
        assert_eq!(kinds(&plan), [FindingKind::NeedsReboot]);
    }

    #[test]
    fn fields_with_no_pve_write_form_are_reported_as_not_sent() {
        let doc = vm("web", 101, "")
            .replace("cores: 2}", "cores: 2, flags: [+aes]}")
            .replace("  disks:", "  options: {nested-virt: true}\n  disks:");
        let state = desired(&[&doc]);
        let mut observed = ObservedState::default();
        observed.add_guest(guest(101, "running", live_of(&state, Kind::Vm, "web", 101)));
        let plan = run(&state, &observed, &all());
        assert!(!plan.has_changes());
        let fields: Vec<(FindingKind, &str)> = plan
            .findings
            .iter()
            .map(|f| (f.kind, f.field.as_str()))
            .collect();
        assert_eq!(
            fields,
            [
                (FindingKind::NotSent, "spec.cpu.flags"),
                (FindingKind::NotSent, "spec.options.nested-virt")
            ]
        );
        assert!(plan.findings[0].message.contains("never sent"));
        // Planned on create too: the guest is created without them, and says so.
        let plan = run(&state, &ObservedState::default(), &all());
        assert_eq!(kinds(&plan), [FindingKind::NotSent, FindingKind::NotSent]);
    }

    #[test]
    fn a_changed_clone_source_template_or_image_requires_a_recreate_and_is_never_destroyed() {
        let tvm =
            |name: &str, vmid: u32| vm(name, vmid, "").replace("kind: VM", "kind: TemplateVM");
        let clone = "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: app\nspec:\n  node: pve1\n  vmid: 103\n  clone: golden-v2\n  memory: 2GiB\n  cpu: {type: host, cores: 2}\n  networks:\n    - {bridge: vmbr0}\n";
        let state = desired(&[&tvm("golden", 9000), &tvm("golden-v2", 9001), clone]);
        let mut observed = ObservedState::default();
        for (name, vmid) in [("golden", 9000), ("golden-v2", 9001)] {
            let config = live_of(&state, Kind::TemplateVm, name, vmid);
            observed.add_guest(guest(vmid, "stopped", config));
        }
        // The live VM as its clone from `golden` left it (disks of the template's).
        let config = config_with(
            &live_of(&state, Kind::TemplateVm, "golden", 103),
            &[("template", None), ("name", Some("app"))],
        );
        observed.add_guest(guest(103, "running", config));
        let recorded = |creation: Creation| {
            Inventory::from_tags(&observed).with_created([("pve1".to_owned(), 103, creation)])
        };
        let from_golden = Creation {
            clone: Some("golden".into()),
            ..Creation::default()
        };
        let planned = plan(&state, &observed, &recorded(from_golden), &all());
        let recreate: Vec<_> = planned
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::RequiresRecreate)
            .map(|f| (f.field.as_str(), f.desired.as_str(), f.observed.as_str()))
            .collect();
        assert_eq!(recreate, [("spec.clone", "golden-v2", "golden")]);
        assert!(
            planned
                .actions()
                .all(|a| !matches!(a.verb.name(), "delete" | "clone" | "create")),
            "{:?}",
            verbs(&planned)
        );
        // Without a record (the CLI) there is nothing to compare.
        let unrecorded = run(&state, &observed, &all());
        assert!(
            unrecorded
                .findings
                .iter()
                .all(|f| f.kind != FindingKind::RequiresRecreate)
        );

        // A created VM whose disk image changed since.
        let image = "apiVersion: proxops/v1alpha1\nkind: DiskImage\nmetadata: {name: deb}\nspec: {nodes: [pve1], storage: local, filename: deb13.qcow2, url: 'http://x/deb13.qcow2'}\n";
        let web = vm("web", 101, "").replace(
            "{storage: local-lvm, size: 8GiB}",
            "{storage: local-lvm, size: 8GiB, image: deb}",
        );
        let state = desired(&[image, &web]);
        let mut observed = ObservedState::default();
        observed.add_guest(guest(101, "running", live_of(&state, Kind::Vm, "web", 101)));
        let created = Creation {
            imports: [("scsi0".to_owned(), "local:import/deb12.qcow2".to_owned())].into(),
            ..Creation::default()
        };
        let inventory =
            Inventory::from_tags(&observed).with_created([("pve1".to_owned(), 101, created)]);
        let planned = plan(&state, &observed, &inventory, &all());
        let recreate: Vec<_> = planned
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::RequiresRecreate)
            .map(|f| (f.field.as_str(), f.desired.as_str(), f.observed.as_str()))
            .collect();
        assert_eq!(
            recreate,
            [(
                "scsi0.image",
                "local:import/deb13.qcow2",
                "local:import/deb12.qcow2"
            )]
        );
    }

    #[test]
    fn a_changed_ct_template_requires_a_recreate() {
        let lxc = "apiVersion: proxops/v1alpha1\nkind: CTTemplate\nmetadata: {name: deb}\nspec: {nodes: [pve1], storage: local, filename: d13.tar.zst, url: 'http://x/d13.tar.zst'}\n---\napiVersion: proxops/v1alpha1\nkind: LXC\nmetadata: {name: ct}\nspec: {node: pve1, vmid: 200, template: deb, memory: 512MiB, cpu: {cores: 1}, root: {storage: local-lvm, size: 4GiB}}\n";
        let state = desired(&[lxc]);
        let mut observed = ObservedState::default();
        observed.add_guest(guest(200, "running", live_of(&state, Kind::Lxc, "ct", 200)));
        let created = Creation {
            ostemplate: Some("local:vztmpl/d12.tar.zst".into()),
            ..Creation::default()
        };
        let inventory =
            Inventory::from_tags(&observed).with_created([("pve1".to_owned(), 200, created)]);
        let planned = plan(&state, &observed, &inventory, &all());
        let recreate: Vec<_> = planned
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::RequiresRecreate)
            .map(|f| (f.field.as_str(), f.desired.as_str(), f.observed.as_str()))
            .collect();
        assert_eq!(
            recreate,
            [(
                "spec.template",
                "local:vztmpl/d13.tar.zst",
                "local:vztmpl/d12.tar.zst"
            )]
        );
        assert!(planned.actions().all(|a| a.verb.name() != "delete"));
    }

    #[test]
    fn the_creation_facts_come_from_the_create_or_clone_action() {
        let state = desired(&[&vm("web", 101, "")]);
        let plan = run(&state, &ObservedState::default(), &all());
        let creation = Creation::of(&plan.levels[0][0].verb).expect("a create");
        assert_eq!(creation, Creation::default());
        let Some(start) = plan.actions().find(|a| a.verb.name() == "start") else {
            panic!("a start")
        };
        assert_eq!(Creation::of(&start.verb), None);
    }

    #[test]
    fn the_power_state_is_converged_with_start_and_shutdown() {
        let state = desired(&[&with_state(&vm("web", 101, ""), "stopped")]);
        let mut observed = ObservedState::default();
        observed.add_guest(guest(101, "running", live_of(&state, Kind::Vm, "web", 101)));
        let plan = run(&state, &observed, &all());
        assert_eq!(verbs(&plan), [("VM/web".into(), "shutdown")]);
    }

    #[test]
    fn a_declared_vmid_held_by_a_guest_the_token_cannot_see_is_a_finding_not_a_create() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        observed.hidden_vmids.insert(101);
        let plan = run(&state, &observed, &all());
        assert!(verbs(&plan).is_empty(), "{:?}", verbs(&plan));
        assert_eq!(kinds(&plan), [FindingKind::ObserveFailed]);
        let message = &plan.findings[0].message;
        assert!(
            message.contains("vmid 101 exists in the cluster but is not visible"),
            "{message}"
        );
        assert!(message.contains("VM.Audit on /vms/101"), "{message}");
    }

    #[test]
    fn a_failed_guest_listing_plans_no_write_at_all() {
        let iso = "apiVersion: proxops/v1alpha1\nkind: ISO\nmetadata: {name: netinst}\nspec: {nodes: [pve1], storage: local, filename: n.iso, url: 'http://x/n.iso'}\n";
        let state = desired(&[&vm("web", 101, ""), iso]);
        let observed = ObservedState {
            resources: Err("500 Internal Server Error".into()),
            ..ObservedState::default()
        };
        let plan = run(&state, &observed, &all());
        assert!(!plan.has_changes());
        assert!(plan.aborted.as_deref().unwrap().contains("500"));
        assert_eq!(
            kinds(&plan),
            [FindingKind::ObserveFailed, FindingKind::ObserveFailed]
        );
    }

    /// An owned guest nobody declares any more.
    fn orphan(vmid: u32, status: &str, protection: bool) -> ObservedGuest {
        let mut pairs = vec![
            ("name", format!("old-{vmid}")),
            ("tags", "proxops".to_owned()),
            ("digest", "d".to_owned()),
        ];
        if protection {
            pairs.push(("protection", "1".to_owned()));
        }
        let config = LiveConfig::from_pairs(GuestType::Qemu, pairs);
        let mut g = guest(vmid, status, config);
        g.name = Some(format!("old-{vmid}"));
        g
    }

    #[test]
    fn an_owned_guest_no_longer_declared_is_only_orphaned_while_prune_is_off() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        observed.add_guest(guest(101, "running", live_of(&state, Kind::Vm, "web", 101)));
        observed.add_guest(orphan(150, "running", false));
        let plan = run(&state, &observed, &all());
        assert!(!plan.has_changes());
        assert_eq!(kinds(&plan), [FindingKind::Orphaned]);
    }

    #[test]
    fn prune_shuts_down_and_deletes_last_but_never_a_protected_or_unowned_guest() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        observed.add_guest(guest(101, "running", live_of(&state, Kind::Vm, "web", 101)));
        observed.add_guest(orphan(150, "running", false));
        observed.add_guest(orphan(151, "stopped", true));
        let mut unowned = orphan(152, "stopped", false);
        unowned.tags.clear();
        observed.add_guest(unowned);
        let prune = Policy {
            prune: true,
            ..all()
        };
        let plan = run(&state, &observed, &prune);
        let last = plan.levels.last().unwrap();
        let pruned: Vec<_> = last
            .iter()
            .map(|a| (a.verb.name(), a.verb.guest().unwrap().vmid))
            .collect();
        assert_eq!(pruned, [("shutdown", 150), ("delete", 150)]);
        assert_eq!(kinds(&plan), [FindingKind::Orphaned]);
        assert!(plan.findings[0].message.contains("protection"));
        assert!(render_human(&plan, "repo").contains("- delete VM/old-150 on pve1 (vmid 150)"));
    }

    #[test]
    fn prune_stops_at_max_prune_and_defers_the_rest() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        for vmid in 150..155 {
            observed.add_guest(orphan(vmid, "stopped", false));
        }
        let prune = Policy {
            prune: true,
            max_prune: 2,
            ..all()
        };
        let plan = run(&state, &observed, &prune);
        let deleted: Vec<u32> = plan
            .actions()
            .filter(|a| a.verb.name() == "delete")
            .map(|a| a.verb.guest().unwrap().vmid)
            .collect();
        assert_eq!(deleted, [150, 151]);
        assert_eq!(plan.findings.len(), 3);
        assert!(
            plan.findings
                .iter()
                .all(|f| f.message.contains("max_prune"))
        );
    }

    #[test]
    fn prune_refuses_a_kind_with_no_manifests_when_its_candidates_exceed_max_prune() {
        let lxc = "apiVersion: proxops/v1alpha1\nkind: CTTemplate\nmetadata: {name: deb}\nspec: {nodes: [pve1], storage: local, filename: d.tar.zst, url: 'http://x/d.tar.zst'}\n---\napiVersion: proxops/v1alpha1\nkind: LXC\nmetadata: {name: ct}\nspec: {node: pve1, vmid: 200, template: deb, memory: 512MiB, cpu: {cores: 1}, root: {storage: local-lvm, size: 4GiB}}\n";
        let state = desired(&[lxc]);
        let mut observed = ObservedState::default();
        for vmid in 150..154 {
            observed.add_guest(orphan(vmid, "stopped", false));
        }
        let prune = Policy {
            prune: true,
            ..all()
        };
        let plan = run(&state, &observed, &prune);
        assert!(plan.actions().all(|a| a.verb.name() != "delete"));
        let orphaned: Vec<_> = plan
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::Orphaned)
            .collect();
        assert_eq!(orphaned.len(), 4);
        assert!(
            orphaned
                .iter()
                .all(|f| f.message.contains("probable bad push"))
        );
    }

    #[test]
    fn an_empty_revision_prunes_nothing() {
        let state = desired(&[]);
        let mut observed = ObservedState::default();
        observed.add_guest(orphan(150, "stopped", false));
        let prune = Policy {
            prune: true,
            ..all()
        };
        let plan = run(&state, &observed, &prune);
        assert!(!plan.has_changes());
        assert!(plan.findings[0].message.contains("probable bad push"));
    }

    #[test]
    fn only_guests_in_the_recorded_inventory_are_pruned() {
        let state = desired(&[&vm("web", 101, "")]);
        let mut observed = ObservedState::default();
        observed.add_guest(orphan(150, "stopped", false));
        observed.add_guest(orphan(151, "stopped", false));
        let inventory =
            Inventory::recorded([("pve1".to_owned(), 151, ResourceId::new(Kind::Vm, "gone"))]);
        let prune = Policy {
            prune: true,
            ..all()
        };
        let plan = plan(&state, &observed, &inventory, &prune);
        let deleted: Vec<String> = plan
            .actions()
            .filter(|a| a.verb.name() == "delete")
            .map(|a| a.resource.to_string())
            .collect();
        assert_eq!(deleted, ["VM/gone"]);
    }

    #[test]
    fn a_mixed_plan_renders_as_operators_expect() {
        let tvm = vm("golden", 9000, "").replace("kind: VM", "kind: TemplateVM");
        let state = desired(&[&vm("web", 101, ""), &vm("new", 102, ""), &tvm]);
        let mut observed = ObservedState::default();
        let config = config_with(
            &live_of(&state, Kind::Vm, "web", 101),
            &[("memory", Some("4096")), ("tags", Some("proxops;old"))],
        );
        observed.add_guest(guest(101, "stopped", config));
        observed.add_guest(orphan(150, "running", false));
        let prune = Policy {
            prune: true,
            ..all()
        };
        insta::assert_snapshot!(render_human(&run(&state, &observed, &prune), "repository"));
    }

    #[test]
    fn the_same_inputs_give_the_same_plan() {
        let state = desired(&[&vm("a", 101, ""), &vm("b", 102, "")]);
        let mut observed = ObservedState::default();
        observed.add_guest(orphan(150, "running", false));
        let a = render_human(&run(&state, &observed, &all()), "x");
        let b = render_human(&run(&state, &observed, &all()), "x");
        assert_eq!(a, b);
    }
}
