//! Rollout waves, the pure decision (issue 22, item 4): may this node write a new commit now?
//! No I/O: the caller passes the waves, this node, the commit, what every node of the earlier
//! waves published (`<dir>/status/<node>.json`), when the commit was first seen in the
//! cluster (`<dir>/rollout/<commit>.json`) and the clock.
//!
//! A node of wave k writes a new commit only once every node of waves 1..k-1 reports that
//! commit applied and healthy for `bake`. A node of an earlier wave that failed an action
//! on the commit, or is unhealthy on it, halts the later waves. A node that is down, stale,
//! missing or in HA maintenance is waited for until `wave_timeout` after the commit was first
//! seen, then skipped (and reported). Only new commits are held: a commit this node applied
//! before (drift correction of an applied revision, a rollback to one) always proceeds, and
//! a newer commit supersedes an older one (the decision is about the commit at hand only: a
//! failure on an older commit does not halt it).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::cluster::rollout_config::RolloutConfig;

/// Why a node of an earlier wave cannot answer for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// No status file: its agent never published.
    Missing,
    /// Its heartbeat is older than three heartbeat intervals.
    Stale,
    /// PVE reports the node offline.
    Down,
    /// The node is in HA maintenance mode.
    Maintenance,
}

impl Unavailable {
    /// In words: `down`, `stale (no heartbeat)`, ….
    pub fn as_str(self) -> &'static str {
        match self {
            Unavailable::Missing => "missing (no status published)",
            Unavailable::Stale => "stale (no recent heartbeat)",
            Unavailable::Down => "down",
            Unavailable::Maintenance => "in HA maintenance",
        }
    }
}

/// What a node of an earlier wave published, as the decision needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The node.
    pub node: String,
    /// Its last applied revision.
    pub applied: Option<String>,
    /// Whether it is healthy on `applied`, and since when.
    pub healthy_since: Option<DateTime<Utc>>,
    /// Why it is unhealthy on `applied`, if it is.
    pub unhealthy: Option<String>,
    /// Its last attempted revision and how many actions of that pass failed.
    pub attempted: Option<(String, u64)>,
    /// Set when it cannot answer (down, stale, missing, in maintenance).
    pub unavailable: Option<Unavailable>,
}

/// A node of an earlier wave that was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// 1-based wave.
    pub wave: usize,
    /// The node.
    pub node: String,
    /// Why.
    pub why: Unavailable,
}

impl Skipped {
    /// `wave 1 node pve3 skipped: down past wave_timeout 30m`.
    pub fn sentence(&self, wave_timeout: Duration) -> String {
        format!(
            "wave {} node {} skipped: {} past wave_timeout {}",
            self.wave,
            self.node,
            self.why.as_str(),
            humantime::format_duration(wave_timeout)
        )
    }
}

/// What this node does with the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Write. `skipped`: earlier-wave nodes skipped on the way.
    Proceed {
        /// Skipped nodes, reported.
        skipped: Vec<Skipped>,
    },
    /// Hold writes until the earlier waves are done.
    Wait {
        /// In words for operators.
        reason: String,
        /// 1-based wave waited for.
        wave: usize,
        /// The node waited for.
        node: String,
        /// When waiting ends at the latest if nothing changes (bake end, skip time).
        until: Option<DateTime<Utc>>,
        /// Skipped nodes, reported.
        skipped: Vec<Skipped>,
    },
    /// An earlier wave failed: hold writes of this commit.
    Halt {
        /// 1-based wave that failed.
        wave: usize,
        /// The node that failed.
        node: String,
        /// What failed.
        why: String,
    },
}

/// Everything the decision looks at.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    /// `[rollout]`.
    pub config: &'a RolloutConfig,
    /// This agent's node.
    pub node: &'a str,
    /// The commit to write.
    pub commit: &'a str,
    /// Whether this node applied `commit` before (then it is never held).
    pub applied_before: bool,
    /// When the commit was first seen in the cluster.
    pub first_seen: DateTime<Utc>,
    /// What the nodes of the earlier waves published; a node with no entry is missing.
    pub peers: &'a [Peer],
    /// The clock.
    pub now: DateTime<Utc>,
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

fn add(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Decides whether this node may write `input.commit` now.
pub fn decide(input: &Input<'_>) -> Decision {
    let config = input.config;
    let Some(mine) = config.wave_of(input.node) else {
        // The configuration refuses this; a node in no wave is held by nothing.
        return Decision::Proceed {
            skipped: Vec::new(),
        };
    };
    if input.applied_before || mine == 0 {
        return Decision::Proceed {
            skipped: Vec::new(),
        };
    }
    let commit = short(input.commit);
    let skip_at = add(input.first_seen, config.wave_timeout);
    let mut skipped = Vec::new();
    let mut wait: Option<Decision> = None;
    let my_wave = mine + 1;
    for (index, wave) in config.waves[..mine].iter().enumerate() {
        let number = index + 1;
        for node in wave {
            let peer = input.peers.iter().find(|p| &p.node == node);
            let applied = peer.is_some_and(|p| p.applied.as_deref() == Some(input.commit));
            if let Some(peer) = peer {
                if let Some((attempted, failed)) = &peer.attempted
                    && attempted == input.commit
                    && *failed > 0
                {
                    return Decision::Halt {
                        wave: number,
                        node: node.clone(),
                        why: format!("{failed} action(s) failed applying {commit}"),
                    };
                }
                if applied && let Some(why) = &peer.unhealthy {
                    return Decision::Halt {
                        wave: number,
                        node: node.clone(),
                        why: format!("unhealthy on {commit}: {why}"),
                    };
                }
            }
            let unavailable = match peer {
                None => Some(Unavailable::Missing),
                Some(p) => p.unavailable,
            };
            let waiting = if let Some(why) = unavailable {
                if input.now >= skip_at {
                    skipped.push(Skipped {
                        wave: number,
                        node: node.clone(),
                        why,
                    });
                    continue;
                }
                Some((
                    format!(
                        "wave {my_wave} waits for {node} (wave {number}): {}; skipped at {} \
                         (wave_timeout)",
                        why.as_str(),
                        crate::timefmt::rfc3339(skip_at.into())
                    ),
                    Some(skip_at),
                ))
            } else if !applied {
                Some((
                    format!("wave {my_wave} waits for {node} (wave {number}) to apply {commit}"),
                    None,
                ))
            } else {
                match peer.and_then(|p| p.healthy_since) {
                    // Applied, but published no health (an older agent): not known healthy.
                    None => Some((
                        format!(
                            "wave {my_wave} waits for {node} (wave {number}) to report its \
                             health on {commit}"
                        ),
                        None,
                    )),
                    Some(since) => {
                        let baked = add(since, config.bake);
                        (input.now < baked).then(|| {
                            (
                                format!(
                                    "wave {my_wave} waits for {node} (wave {number}) (bake \
                                     until {})",
                                    crate::timefmt::rfc3339(baked.into())
                                ),
                                Some(baked),
                            )
                        })
                    }
                }
            };
            if let (Some((reason, until)), None) = (waiting, &wait) {
                wait = Some(Decision::Wait {
                    reason,
                    wave: number,
                    node: node.clone(),
                    until,
                    skipped: Vec::new(),
                });
            }
        }
    }
    match wait {
        Some(Decision::Wait {
            reason,
            wave,
            node,
            until,
            ..
        }) => Decision::Wait {
            reason,
            wave,
            node,
            until,
            skipped,
        },
        _ => Decision::Proceed { skipped },
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::cluster::rollout_config::Health;

    const NEW: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const OLD: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2027, 3, 1, 12, 0, 0).unwrap() + chrono::Duration::seconds(seconds)
    }

    fn config() -> RolloutConfig {
        RolloutConfig {
            waves: vec![
                vec!["pve3".to_owned()],
                vec!["pve1".to_owned(), "pve2".to_owned()],
                vec!["pve4".to_owned()],
            ],
            bake: Duration::from_secs(600),
            wave_timeout: Duration::from_secs(1800),
            health: Health::Power,
        }
    }

    fn peer(node: &str) -> Peer {
        Peer {
            node: node.to_owned(),
            applied: Some(OLD.to_owned()),
            healthy_since: Some(at(-86_400)),
            unhealthy: None,
            attempted: Some((OLD.to_owned(), 0)),
            unavailable: None,
        }
    }

    /// `node` applied NEW and has been healthy since `since`.
    fn applied(node: &str, since: i64) -> Peer {
        Peer {
            applied: Some(NEW.to_owned()),
            healthy_since: Some(at(since)),
            attempted: Some((NEW.to_owned(), 0)),
            ..peer(node)
        }
    }

    fn decide_for(node: &str, peers: &[Peer], now: i64) -> Decision {
        decide(&Input {
            config: &config(),
            node,
            commit: NEW,
            applied_before: false,
            first_seen: at(0),
            peers,
            now: at(now),
        })
    }

    #[test]
    fn the_first_wave_proceeds_at_once_whatever_the_others_report() {
        let failed = Peer {
            attempted: Some((NEW.to_owned(), 3)),
            ..peer("pve1")
        };
        assert_eq!(
            decide_for("pve3", &[failed], 0),
            Decision::Proceed {
                skipped: Vec::new()
            }
        );
    }

    #[test]
    fn a_later_wave_waits_until_every_earlier_node_applied_the_commit_and_baked() {
        // Table: (what pve3 reports, seconds since first seen) → wait reason fragment / proceed.
        let cases: [(Peer, i64, Option<&str>, Option<i64>); 4] = [
            (
                peer("pve3"),
                5,
                Some("wave 2 waits for pve3 (wave 1) to apply bbbbbbbbbbbb"),
                None,
            ),
            (
                applied("pve3", 60),
                120,
                Some("wave 2 waits for pve3 (wave 1) (bake until 2027-03-01T12:11:00Z)"),
                Some(660),
            ),
            (applied("pve3", 60), 659, Some("bake until"), Some(660)),
            (applied("pve3", 60), 660, None, None),
        ];
        for (pve3, now, reason, until) in cases {
            let decision = decide_for("pve1", std::slice::from_ref(&pve3), now);
            match (reason, &decision) {
                (None, Decision::Proceed { skipped }) => assert!(skipped.is_empty()),
                (
                    Some(fragment),
                    Decision::Wait {
                        reason,
                        wave,
                        node,
                        until: got,
                        skipped,
                    },
                ) => {
                    assert!(reason.contains(fragment), "{now}: {reason}");
                    assert_eq!((*wave, node.as_str()), (1, "pve3"));
                    assert_eq!(*got, until.map(at), "{now}");
                    assert!(skipped.is_empty());
                }
                _ => panic!("at {now}: {decision:?}"),
            }
        }
    }

    #[test]
    fn the_third_wave_waits_for_every_node_of_both_earlier_waves() {
        let peers = [applied("pve3", 0), applied("pve1", 0), peer("pve2")];
        let Decision::Wait { node, wave, .. } = decide_for("pve4", &peers, 3600) else {
            panic!("pve2 has not applied");
        };
        assert_eq!((wave, node.as_str()), (2, "pve2"));
        let peers = [applied("pve3", 0), applied("pve1", 0), applied("pve2", 0)];
        assert!(matches!(
            decide_for("pve4", &peers, 3600),
            Decision::Proceed { .. }
        ));
    }

    #[test]
    fn a_failed_action_on_an_earlier_node_halts_the_later_waves_naming_wave_and_node() {
        let failed = Peer {
            attempted: Some((NEW.to_owned(), 2)),
            ..peer("pve3")
        };
        assert_eq!(
            decide_for("pve2", std::slice::from_ref(&failed), 10),
            Decision::Halt {
                wave: 1,
                node: "pve3".to_owned(),
                why: "2 action(s) failed applying bbbbbbbbbbbb".to_owned(),
            }
        );
        // Failed, then down: still halted, never skipped.
        let down = Peer {
            unavailable: Some(Unavailable::Down),
            ..failed
        };
        assert!(matches!(
            decide_for("pve2", &[down], 7200),
            Decision::Halt { wave: 1, .. }
        ));
        // Unhealthy after applying halts too.
        let unhealthy = Peer {
            unhealthy: Some("vm 101 is stopped, declared running".to_owned()),
            healthy_since: None,
            ..applied("pve3", 0)
        };
        let Decision::Halt { why, .. } = decide_for("pve1", &[unhealthy], 10) else {
            panic!("unhealthy must halt");
        };
        assert_eq!(
            why,
            "unhealthy on bbbbbbbbbbbb: vm 101 is stopped, declared running"
        );
    }

    #[test]
    fn a_down_stale_missing_or_maintenance_node_is_waited_for_then_skipped_and_reported() {
        for why in [
            Unavailable::Down,
            Unavailable::Stale,
            Unavailable::Maintenance,
            Unavailable::Missing,
        ] {
            let peers: Vec<Peer> = match why {
                Unavailable::Missing => Vec::new(),
                _ => vec![Peer {
                    unavailable: Some(why),
                    ..peer("pve3")
                }],
            };
            let Decision::Wait {
                reason,
                until,
                skipped,
                ..
            } = decide_for("pve1", &peers, 1799)
            else {
                panic!("{why:?}: waits before wave_timeout");
            };
            assert!(reason.contains(why.as_str()), "{reason}");
            assert!(
                reason.contains("skipped at 2027-03-01T12:30:00Z"),
                "{reason}"
            );
            assert_eq!(until, Some(at(1800)));
            assert!(skipped.is_empty());
            let decision = decide_for("pve1", &peers, 1800);
            let expected = Skipped {
                wave: 1,
                node: "pve3".to_owned(),
                why,
            };
            assert_eq!(
                decision,
                Decision::Proceed {
                    skipped: vec![expected.clone()]
                }
            );
            assert_eq!(
                expected.sentence(Duration::from_secs(1800)),
                format!(
                    "wave 1 node pve3 skipped: {} past wave_timeout 30m",
                    why.as_str()
                )
            );
        }
    }

    #[test]
    fn a_skipped_node_is_reported_while_the_wave_still_waits_for_another() {
        let peers = [
            Peer {
                unavailable: Some(Unavailable::Down),
                ..peer("pve3")
            },
            applied("pve1", 1790),
            applied("pve2", 0),
        ];
        let Decision::Wait { node, skipped, .. } = decide_for("pve4", &peers, 1800) else {
            panic!("pve1 still bakes");
        };
        assert_eq!(node, "pve1");
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].node, "pve3");
    }

    #[test]
    fn a_commit_this_node_applied_before_is_never_held() {
        let failed = Peer {
            attempted: Some((NEW.to_owned(), 1)),
            ..peer("pve3")
        };
        let decision = decide(&Input {
            config: &config(),
            node: "pve1",
            commit: NEW,
            applied_before: true,
            first_seen: at(0),
            peers: &[failed],
            now: at(1),
        });
        assert_eq!(
            decision,
            Decision::Proceed {
                skipped: Vec::new()
            }
        );
    }

    #[test]
    fn a_newer_commit_supersedes_a_halt_on_an_older_one() {
        // pve3 failed on OLD; the commit at hand is NEW: waited for, not halted.
        let failed_old = Peer {
            attempted: Some((OLD.to_owned(), 4)),
            ..peer("pve3")
        };
        assert!(matches!(
            decide_for("pve1", &[failed_old], 10),
            Decision::Wait { .. }
        ));
        // pve3 retried NEW and its last attempt succeeded: the halt is lifted.
        let failed_new = Peer {
            attempted: Some((NEW.to_owned(), 1)),
            ..peer("pve3")
        };
        assert!(matches!(
            decide_for("pve1", std::slice::from_ref(&failed_new), 600),
            Decision::Halt { .. }
        ));
        assert!(matches!(
            decide_for("pve1", &[applied("pve3", 0)], 600),
            Decision::Proceed { .. }
        ));
    }

    #[test]
    fn an_applied_node_that_published_no_health_is_waited_for() {
        let silent = Peer {
            healthy_since: None,
            ..applied("pve3", 0)
        };
        let Decision::Wait { reason, until, .. } = decide_for("pve1", &[silent], 7200) else {
            panic!("no health, no bake");
        };
        assert!(reason.contains("to report its health"), "{reason}");
        assert_eq!(until, None);
    }
}
