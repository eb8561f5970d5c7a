//! The write gate: what the write circuit breaker lets a pass run of its plan. Closed, the
//! whole plan; half-open, its first action as the one probe write; open, nothing. Actions
//! held back are recorded as skipped with the reason, so the pass's records show what the
//! agent would have done while read-only. Between levels, [`between_levels`] holds the rest
//! back when the breaker opened during the pass (the executor asks it).

use std::sync::Mutex;
use std::time::Instant;

use proxops_core::plan::{Action, Plan};

use crate::agent::breaker::{Breaker, Permit};
use crate::execute::LevelGate;
use crate::timefmt::rfc3339;
use proxops_store::BreakerMark;

/// Why actions are reported skipped when the breaker holds them back.
pub const HELD_BACK: &str = "the write circuit breaker is not closed";

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
pub fn permit(breaker: &Mutex<Breaker>) -> GatePermit {
    let mut breaker = breaker
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

/// The executor's question before level `index`: the first level runs under the permit the
/// pass was given; a later one only while the breaker lets every write through (it opens
/// when writes of earlier levels failed).
pub fn between_levels(breaker: &Mutex<Breaker>, index: usize) -> LevelGate {
    let read_only = breaker
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .is_read_only();
    if index > 0 && read_only {
        LevelGate::HoldBack(HELD_BACK.to_owned())
    } else {
        LevelGate::Continue
    }
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

    fn tripped_breaker() -> Mutex<Breaker> {
        let mut breaker = Breaker::new(1, Duration::from_secs(60));
        breaker.record(false, Instant::now());
        Mutex::new(breaker)
    }

    #[test]
    fn the_first_level_runs_under_the_pass_permit_even_with_an_open_breaker() {
        assert_eq!(between_levels(&tripped_breaker(), 0), LevelGate::Continue);
    }

    #[test]
    fn later_levels_run_while_the_breaker_is_closed() {
        let closed = Mutex::new(Breaker::new(3, Duration::from_secs(60)));
        assert_eq!(between_levels(&closed, 1), LevelGate::Continue);
        assert_eq!(between_levels(&closed, 5), LevelGate::Continue);
    }

    #[test]
    fn a_breaker_that_opened_during_the_pass_holds_the_later_levels_back() {
        assert_eq!(
            between_levels(&tripped_breaker(), 1),
            LevelGate::HoldBack(HELD_BACK.to_owned())
        );
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
