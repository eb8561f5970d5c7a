//! The write gate: what the write circuit breaker lets a pass run of its plan. Closed, the
//! whole plan; half-open, its first action as the one probe write; open, nothing. Actions
//! held back are recorded as skipped with the reason, so the pass's records show what the
//! agent would have done while read-only.

use std::time::Instant;

use proxops_core::plan::{Action, Plan};

use crate::agent::breaker::Permit;
use crate::agent::pass::{PassDeps, rfc3339};
use proxops_core::repository::DesiredState;
use tokio_util::sync::CancellationToken;

use crate::execute::{self, ActionResult, ApplyReport, Event, Outcome, Progress};
use proxops_store::BreakerMark;

/// The breaker's answer when a pass is about to write.
#[derive(Debug, Clone, Copy)]
pub struct GatePermit {
    /// What may be written.
    pub permit: Permit,
    /// The breaker's state after asking (an open breaker past its cool-down is half-open).
    pub mark: BreakerMark,
}

/// A plan split by the gate.
#[derive(Debug, Clone)]
pub struct Gated {
    /// What to execute.
    pub run: Plan,
    /// What is held back.
    pub held: Vec<Action>,
    /// Why actions are held back, when some are.
    pub reason: Option<String>,
    /// The run is a probe.
    pub probed: bool,
}

/// Asks the breaker what this pass may write, now.
pub fn permit(deps: &PassDeps) -> GatePermit {
    let mut breaker = deps
        .breaker
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let permit = breaker.permit(Instant::now());
    GatePermit {
        permit,
        mark: breaker.mark(),
    }
}

/// Splits `plan` into what runs and what is held back under `permit`.
pub fn split(plan: &Plan, permit: GatePermit) -> Gated {
    let all: Vec<Action> = plan.actions().cloned().collect();
    match permit.permit {
        Permit::All => Gated {
            run: plan.clone(),
            held: Vec::new(),
            reason: None,
            probed: false,
        },
        Permit::Probe => {
            // The first action of the first level depends on nothing this pass writes.
            let mut actions = all.into_iter();
            let probe = actions.next();
            let held: Vec<Action> = actions.collect();
            let reason = (!held.is_empty()).then(|| {
                format!(
                    "write circuit breaker half-open: one probe write, {} action(s) held back \
                     until it succeeds",
                    held.len()
                )
            });
            Gated {
                run: Plan {
                    levels: probe.into_iter().map(|a| vec![a]).collect(),
                    ..plan.clone()
                },
                held,
                reason,
                probed: true,
            }
        }
        Permit::None { until } => {
            let at = std::time::SystemTime::now() + until.saturating_duration_since(Instant::now());
            let reason = format!(
                "write circuit breaker open: read-only until {}, {} action(s) held back",
                rfc3339(at),
                all.len()
            );
            Gated {
                run: Plan {
                    levels: Vec::new(),
                    ..plan.clone()
                },
                held: all,
                reason: Some(reason),
                probed: false,
            }
        }
    }
}

/// Runs `plan` level by level and asks the breaker between levels: when it opened during
/// this pass, the later levels are held back (recorded skipped) and their number returned.
/// Running levels one call at a time is what the executor does inside one call: a level
/// starts when the previous one ended, and what failed or was skipped there blocks its
/// dependants (carried over in `blocked`).
pub async fn apply_levels(
    deps: &PassDeps,
    desired: &DesiredState,
    plan: &Plan,
    progress: &Progress,
    cancel: &CancellationToken,
) -> (ApplyReport, usize) {
    let mut report = ApplyReport::default();
    let mut blocked = plan.blocked.clone();
    for (index, level) in plan.levels.iter().enumerate() {
        if index > 0 && !deps.writes_allowed() {
            let held: Vec<Action> = plan.levels[index..].iter().flatten().cloned().collect();
            report.results.extend(hold_back(&held, progress));
            return (report, held.len());
        }
        let one = Plan {
            levels: vec![level.clone()],
            blocked: blocked.clone(),
            ..plan.clone()
        };
        let done = execute::apply(
            &deps.context.pve,
            desired,
            &one,
            &deps.context.execute,
            progress,
            cancel,
        )
        .await;
        for result in &done.results {
            if !matches!(result.outcome, Outcome::Succeeded { .. }) {
                blocked.insert((result.action.resource.clone(), result.action.node.clone()));
            }
        }
        report.results.extend(done.results);
    }
    (report, 0)
}

/// Reports every held-back action as skipped (through `progress`, which records it).
pub fn hold_back(held: &[Action], progress: &Progress) -> Vec<ActionResult> {
    held.iter()
        .map(|action| {
            let result = ActionResult {
                action: action.clone(),
                outcome: Outcome::Skipped {
                    reason: "held back: the write circuit breaker is not closed".to_owned(),
                },
            };
            progress(&Event::Finished {
                result: result.clone(),
            });
            result
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proxops_core::guest::GuestType;
    use proxops_core::plan::{GuestRef, Verb};
    use proxops_core::resource::{Kind, ResourceId};

    use super::*;

    fn action(name: &str) -> Action {
        Action {
            resource: ResourceId::new(Kind::Vm, name),
            node: "pve1".into(),
            verb: Verb::Start(GuestRef {
                vmid: 100,
                guest_type: GuestType::Qemu,
            }),
            reason: "declared running".into(),
        }
    }

    fn plan() -> Plan {
        Plan {
            levels: vec![vec![action("a"), action("b")], vec![action("c")]],
            ..Plan::default()
        }
    }

    #[test]
    fn a_closed_breaker_runs_the_whole_plan() {
        let gated = split(
            &plan(),
            GatePermit {
                permit: Permit::All,
                mark: BreakerMark::Closed,
            },
        );
        assert_eq!(gated.run, plan());
        assert!(gated.held.is_empty() && gated.reason.is_none() && !gated.probed);
    }

    #[test]
    fn a_half_open_breaker_runs_only_the_first_action_as_a_probe() {
        let gated = split(
            &plan(),
            GatePermit {
                permit: Permit::Probe,
                mark: BreakerMark::HalfOpen,
            },
        );
        assert_eq!(gated.run.actions().count(), 1);
        assert_eq!(gated.run.levels[0][0], action("a"));
        assert_eq!(gated.held, [action("b"), action("c")]);
        assert!(gated.probed);
        assert!(gated.reason.unwrap().contains("2 action(s) held back"));
    }

    #[test]
    fn an_open_breaker_runs_nothing_and_says_until_when() {
        let gated = split(
            &plan(),
            GatePermit {
                permit: Permit::None {
                    until: Instant::now() + Duration::from_secs(60),
                },
                mark: BreakerMark::Open,
            },
        );
        assert!(!gated.run.has_changes());
        assert_eq!(gated.held.len(), 3);
        let reason = gated.reason.unwrap();
        assert!(reason.contains("read-only until"), "{reason}");
    }
}
