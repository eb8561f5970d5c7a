//! The risk level of every action: `safe`, `risky` or `destructive` (issue 19, item 1).
//!
//! One pure function, [`risk`], with an exhaustive match over [`Verb`], so a new verb cannot
//! be added without being classed. The levels:
//!
//! - `safe`: nothing running changes behaviour and nothing is lost: downloads, creates and
//!   clones of new guests, starts, pool moves (`PUT /pools`: membership and the permissions
//!   it grants, nothing in the guest), snippet writes (content-addressed new files), config writes
//!   that only touch keys PVE applies at once even on a running VM, and the removal of a
//!   ProxOps snippet no guest names (see below).
//! - `risky`: a running guest can change behaviour or stop: any other config write (disks,
//!   controllers, `machine`, `bios`, `cpu`, NIC models, memory, cores, …), a volume resize,
//!   a cloud-init regeneration ([`super::Update::regenerate_cloudinit`]), a shutdown, a
//!   reboot, and marking a guest a template (PVE cannot undo it).
//! - `destructive`: data is dropped: a prune `delete` (PVE destroys the guest's volumes).
//!
//! Config keys are classed by qemu-server's own list of keys it writes at once even on a
//! running VM, `$fast_plug_option` (verified in PVE's sources: proxmox/qemu-server @ e6352be6,
//! `src/PVE/QemuServer.pm`, `vmconfig_hotplug_pending`): `description`, `hookscript`,
//! `lock`, `migrate_downtime`, `migrate_speed`, `name`, `onboot`, `protection`, `shares`,
//! `startup`, `tags`, `vmstatestorage`. Every other key may be held as pending on a running
//! guest or hot-plugged into it (a disk, a NIC, memory), so it is `risky`. The plan does not
//! know whether the guest runs when it classes the action, so this is conservative: a write
//! to a stopped guest's `cores` is classed `risky` too. The same list is used for LXC
//! (assumed: pve-container hot-applies more keys, e.g. `hostname`, but classing them risky
//! only errs on the safe side).
//!
//! `remove-snippet` is `safe`: the file is one ProxOps wrote, no guest's `cicustom` (current
//! or pending) names it, its grace period is over, and its content is a pure function of
//! git (the name is the text's hash), so a later pass writes it again byte for byte if a
//! manifest names it again. Nothing an operator could not get back is lost.

use std::fmt;

use serde::Serialize;

use super::{Action, Plan, Update, Verb};

/// How much harm an action can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Risk {
    /// Nothing running changes behaviour, nothing is lost.
    Safe,
    /// A running guest may change behaviour, restart or stop.
    Risky,
    /// Data is dropped (a guest and its volumes).
    Destructive,
}

impl Risk {
    /// `safe`, `risky` or `destructive`.
    pub fn name(self) -> &'static str {
        match self {
            Risk::Safe => "safe",
            Risk::Risky => "risky",
            Risk::Destructive => "destructive",
        }
    }

    /// Parses [`Risk::name`]'s output.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "safe" => Some(Risk::Safe),
            "risky" => Some(Risk::Risky),
            "destructive" => Some(Risk::Destructive),
            _ => None,
        }
    }
}

impl fmt::Display for Risk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether writing or deleting `key` takes effect at once without touching the running guest.
fn applied_at_once(key: &str) -> bool {
    crate::guest::QEMU_FAST_PLUG.contains(&key)
}

fn update_risk(update: &Update) -> Risk {
    let all_at_once = update
        .set
        .keys()
        .chain(update.delete.iter())
        .all(|k| applied_at_once(k));
    if all_at_once && update.grow.is_empty() && !update.regenerate_cloudinit {
        Risk::Safe
    } else {
        Risk::Risky
    }
}

/// The risk level of one action.
pub fn risk(action: &Action) -> Risk {
    match &action.verb {
        Verb::Download(_)
        | Verb::WriteSnippet(_)
        | Verb::RemoveSnippet(_)
        | Verb::Create(_)
        | Verb::Clone(_)
        | Verb::Pool(_)
        | Verb::Start(_) => Risk::Safe,
        Verb::Update(update) => update_risk(update),
        Verb::Shutdown(_) | Verb::Reboot(_) | Verb::Promote(_) => Risk::Risky,
        Verb::Delete(_) => Risk::Destructive,
    }
}

/// How many actions of each level a plan holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RiskSummary {
    /// `safe` actions.
    pub safe: usize,
    /// `risky` actions.
    pub risky: usize,
    /// `destructive` actions.
    pub destructive: usize,
}

impl RiskSummary {
    /// Counts the actions given.
    pub fn of<'a>(actions: impl IntoIterator<Item = &'a Action>) -> Self {
        let mut summary = Self::default();
        for action in actions {
            match risk(action) {
                Risk::Safe => summary.safe += 1,
                Risk::Risky => summary.risky += 1,
                Risk::Destructive => summary.destructive += 1,
            }
        }
        summary
    }

    /// The highest level present, if any action is.
    pub fn highest(&self) -> Option<Risk> {
        if self.destructive > 0 {
            Some(Risk::Destructive)
        } else if self.risky > 0 {
            Some(Risk::Risky)
        } else if self.safe > 0 {
            Some(Risk::Safe)
        } else {
            None
        }
    }
}

impl fmt::Display for RiskSummary {
    /// `3 safe, 1 risky, 1 destructive`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} safe, {} risky, {} destructive",
            self.safe, self.risky, self.destructive
        )
    }
}

impl Plan {
    /// How many actions of each risk level the plan holds.
    pub fn risk_summary(&self) -> RiskSummary {
        RiskSummary::of(self.actions())
    }
}

/// How an [`Action`] reads in JSON: its fields plus its `risk`.
#[derive(Serialize)]
struct ActionJson<'a> {
    resource: &'a crate::resource::ResourceId,
    node: &'a str,
    verb: &'a Verb,
    reason: &'a str,
    risk: Risk,
}

impl Serialize for Action {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ActionJson {
            resource: &self.resource,
            node: &self.node,
            verb: &self.verb,
            reason: &self.reason,
            risk: risk(self),
        }
        .serialize(serializer)
    }
}

/// How a [`Plan`] reads in JSON: its fields plus the `risk` summary.
#[derive(Serialize)]
struct PlanJson<'a> {
    levels: &'a [Vec<Action>],
    findings: &'a [super::Finding],
    blocked: &'a std::collections::BTreeSet<(crate::resource::ResourceId, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aborted: Option<&'a String>,
    risk: RiskSummary,
}

impl Serialize for Plan {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        PlanJson {
            levels: &self.levels,
            findings: &self.findings,
            blocked: &self.blocked,
            aborted: self.aborted.as_ref(),
            risk: self.risk_summary(),
        }
        .serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::guest::GuestType;
    use crate::plan::{CloneFrom, Create, Download, Grow, GuestRef, PoolMove, Snippet};
    use crate::resource::{Kind, ResourceId};

    fn action(verb: Verb) -> Action {
        Action {
            resource: ResourceId::new(Kind::Vm, "web".to_owned()),
            node: "pve1".to_owned(),
            verb,
            reason: "test".to_owned(),
        }
    }

    const GUEST: GuestRef = GuestRef {
        vmid: 100,
        guest_type: GuestType::Qemu,
    };

    fn update(set: &[&str], delete: &[&str], grow: bool, regenerate: bool) -> Verb {
        Verb::Update(Update {
            vmid: 100,
            guest_type: GuestType::Qemu,
            set: set
                .iter()
                .map(|k| ((*k).to_owned(), "v".to_owned()))
                .collect(),
            delete: delete.iter().map(|k| (*k).to_owned()).collect(),
            digest: None,
            grow: if grow {
                vec![Grow {
                    slot: "scsi0".to_owned(),
                    size: "32G".to_owned(),
                }]
            } else {
                Vec::new()
            },
            changes: Vec::new(),
            regenerate_cloudinit: regenerate,
        })
    }

    fn snippet() -> Snippet {
        Snippet {
            storage: "local".to_owned(),
            file: "proxops-web-user-abc.yaml".to_owned(),
            sha256: "abc".to_owned(),
            secret: false,
            shared: false,
        }
    }

    /// One row per verb (and per kind of update), with the level it must have.
    fn table() -> Vec<(&'static str, Verb, Risk)> {
        vec![
            (
                "download",
                Verb::Download(Download {
                    storage: "local".to_owned(),
                    content: "iso".to_owned(),
                    filename: "x.iso".to_owned(),
                    url: "https://example.org/x.iso".to_owned(),
                    checksum: None,
                    volid: "local:iso/x.iso".to_owned(),
                }),
                Risk::Safe,
            ),
            ("write-snippet", Verb::WriteSnippet(snippet()), Risk::Safe),
            ("remove-snippet", Verb::RemoveSnippet(snippet()), Risk::Safe),
            (
                "create",
                Verb::Create(Create {
                    vmid: 100,
                    guest_type: GuestType::Qemu,
                    params: BTreeMap::new(),
                    grow: Vec::new(),
                    after: BTreeMap::new(),
                }),
                Risk::Safe,
            ),
            (
                "clone",
                Verb::Clone(CloneFrom {
                    vmid: 100,
                    source: "base".to_owned(),
                    source_vmid: 9000,
                    name: "web".to_owned(),
                    pool: None,
                }),
                Risk::Safe,
            ),
            ("start", Verb::Start(GUEST), Risk::Safe),
            (
                "pool",
                Verb::Pool(PoolMove {
                    vmid: 100,
                    guest_type: GuestType::Qemu,
                    pool: "prod".to_owned(),
                    from: None,
                }),
                Risk::Safe,
            ),
            (
                "update of tags and description",
                update(&["tags", "description"], &[], false, false),
                Risk::Safe,
            ),
            (
                "update deleting onboot",
                update(&[], &["onboot"], false, false),
                Risk::Safe,
            ),
            (
                "update of a disk",
                update(&["scsi0"], &[], false, false),
                Risk::Risky,
            ),
            (
                "update of the controller",
                update(&["scsihw"], &[], false, false),
                Risk::Risky,
            ),
            (
                "update of machine",
                update(&["machine"], &[], false, false),
                Risk::Risky,
            ),
            (
                "update of bios",
                update(&["bios"], &[], false, false),
                Risk::Risky,
            ),
            (
                "update of cpu type",
                update(&["cpu"], &[], false, false),
                Risk::Risky,
            ),
            (
                "update of a NIC",
                update(&["tags", "net0"], &[], false, false),
                Risk::Risky,
            ),
            (
                "update of memory (pending on a running guest)",
                update(&["memory"], &[], false, false),
                Risk::Risky,
            ),
            (
                "update deleting a disk key",
                update(&[], &["virtio1"], false, false),
                Risk::Risky,
            ),
            (
                "update with a resize",
                update(&["tags"], &[], true, false),
                Risk::Risky,
            ),
            (
                "update regenerating cloud-init",
                update(&["tags"], &[], false, true),
                Risk::Risky,
            ),
            ("shutdown", Verb::Shutdown(GUEST), Risk::Risky),
            ("reboot", Verb::Reboot(GUEST), Risk::Risky),
            ("promote", Verb::Promote(GUEST), Risk::Risky),
            ("delete", Verb::Delete(GUEST), Risk::Destructive),
        ]
    }

    #[test]
    fn every_verb_has_the_risk_level_the_table_gives() {
        let rows = table();
        let verbs: BTreeSet<&str> = rows.iter().map(|(_, v, _)| v.name()).collect();
        // Every verb appears in the table (the match in `risk` is exhaustive; this keeps the
        // table in step with it).
        for name in [
            "download",
            "write-snippet",
            "remove-snippet",
            "create",
            "clone",
            "update",
            "pool",
            "shutdown",
            "promote",
            "start",
            "reboot",
            "delete",
        ] {
            assert!(verbs.contains(name), "{name} missing from the table");
        }
        for (what, verb, expected) in rows {
            assert_eq!(risk(&action(verb)), expected, "{what}");
        }
    }

    #[test]
    fn the_summary_counts_each_level_and_names_the_highest() {
        let plan = Plan {
            levels: vec![
                vec![
                    action(Verb::Start(GUEST)),
                    action(update(&["tags"], &[], false, false)),
                ],
                vec![action(Verb::Reboot(GUEST)), action(Verb::Delete(GUEST))],
            ],
            ..Plan::default()
        };
        let summary = plan.risk_summary();
        assert_eq!(summary.to_string(), "2 safe, 1 risky, 1 destructive");
        assert_eq!(summary.highest(), Some(Risk::Destructive));
        assert_eq!(Plan::default().risk_summary().highest(), None);
    }

    #[test]
    fn the_json_of_an_action_and_a_plan_carries_the_risk() {
        let plan = Plan {
            levels: vec![vec![action(Verb::Delete(GUEST))]],
            ..Plan::default()
        };
        let json = serde_json::to_value(&plan).expect("json");
        assert_eq!(json["levels"][0][0]["risk"], "destructive");
        assert_eq!(json["levels"][0][0]["verb"]["verb"], "delete");
        assert_eq!(json["risk"]["destructive"], 1);
        assert_eq!(json["risk"]["safe"], 0);
    }

    #[test]
    fn risk_names_parse_back() {
        for r in [Risk::Safe, Risk::Risky, Risk::Destructive] {
            assert_eq!(Risk::parse(r.name()), Some(r));
        }
        assert_eq!(Risk::parse("harmless"), None);
    }
}
