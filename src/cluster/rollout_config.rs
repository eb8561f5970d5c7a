//! `[rollout]` of agent.toml (issue 22, item 4): the waves a new commit goes through node by
//! node, how long each wave bakes, how long a wave waits for a node that is down, and what
//! "healthy" means. Errors are located: the line and column of the node name in `waves`, the
//! key (`rollout.waves[1][0]`) and what to do.
//!
//! This agent's node must be in a wave: an agent that is in no wave is refused rather than
//! put in an implicit last wave, so that adding a node to the cluster never silently lets it
//! write before the waves that were planned (write it into the last wave to get that).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use proxops_core::plan::NodeScope;
use serde::Deserialize;

use crate::config::ConfigError;

/// Default `[rollout] bake`.
pub const DEFAULT_BAKE: Duration = Duration::from_secs(600);
/// Default `[rollout] wave_timeout`.
pub const DEFAULT_WAVE_TIMEOUT: Duration = Duration::from_secs(1800);

/// What a node of an earlier wave must show, besides no failed action, to count as healthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Health {
    /// Every guest in its declared power state (no power-state drift after the pass).
    #[default]
    Power,
    /// `power`, and the QEMU guest agent of every VM of the node that passes of the revision
    /// touched (declared `started`) answers a ping (`crate::agent::rollout::guests_to_ping`).
    GuestAgent,
}

impl Health {
    /// The name in agent.toml.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Power => "power",
            Health::GuestAgent => "guest-agent",
        }
    }
}

/// `[rollout]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRollout {
    waves: Option<Vec<toml::Spanned<Vec<toml::Spanned<String>>>>>,
    bake: Option<String>,
    wave_timeout: Option<String>,
    health: Option<Health>,
}

/// `[rollout]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutConfig {
    /// The waves in order; wave 1 is `waves[0]`. Every node is in exactly one.
    pub waves: Vec<Vec<String>>,
    /// How long every node of the earlier waves must have been healthy on the new commit.
    pub bake: Duration,
    /// How long after the commit was first seen in the cluster a node of an earlier wave
    /// that is down, stale or in HA maintenance is waited for before it is skipped.
    pub wave_timeout: Duration,
    /// What healthy means.
    pub health: Health,
}

impl RolloutConfig {
    /// The 0-based wave of `node`.
    pub fn wave_of(&self, node: &str) -> Option<usize> {
        self.waves.iter().position(|w| w.iter().any(|n| n == node))
    }
}

/// Validates `[rollout]` of the config file at `path` (whose text is `text`, for line
/// numbers) for an agent of `node`.
///
/// # Errors
/// [`ConfigError::Syntax`] located at the node name for a node in two waves or an invalid
/// name; at the wave for an empty wave; [`ConfigError::Invalid`] for no waves, a bad
/// duration, this node in no wave, `[rollout]` on a whole-cluster agent or without
/// `[pmxcfs]` (`cluster_mode`: the waves are read from the status files it publishes).
pub fn parse(
    raw: Option<RawRollout>,
    path: &Path,
    text: &str,
    node: &NodeScope,
    cluster_mode: bool,
) -> Result<Option<RolloutConfig>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let invalid = |key: &str, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        key: key.to_owned(),
        message,
    };
    let located = |offset: usize, key: &str, message: String| {
        let (line, column) = line_column(text, offset);
        ConfigError::Syntax {
            path: path.to_path_buf(),
            line,
            column,
            message: format!("{key}: {message}"),
        }
    };
    if !cluster_mode {
        return Err(invalid(
            "rollout",
            "waves need cluster mode: add a [pmxcfs] table, so that each node's agent \
             publishes its status for the later waves to read"
                .to_owned(),
        ));
    }
    let NodeScope::Node(this) = node else {
        return Err(invalid(
            "rollout",
            "a whole-cluster agent (node = \"*\") writes to every node in one pass and cannot \
             take part in waves; run one agent per node (node = \"<name>\") or remove [rollout]"
                .to_owned(),
        ));
    };
    let raw_waves = raw.waves.unwrap_or_default();
    if raw_waves.is_empty() {
        return Err(invalid(
            "rollout.waves",
            "no waves; write the nodes in the order they take a new commit, e.g. \
             waves = [[\"pve3\"], [\"pve1\", \"pve2\"]]"
                .to_owned(),
        ));
    }
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut waves = Vec::with_capacity(raw_waves.len());
    for (w, wave) in raw_waves.iter().enumerate() {
        if wave.get_ref().is_empty() {
            return Err(located(
                wave.span().start,
                &format!("rollout.waves[{w}]"),
                format!(
                    "wave {} is empty; put at least one node in it or remove it",
                    w + 1
                ),
            ));
        }
        let mut nodes = Vec::with_capacity(wave.get_ref().len());
        for (n, name) in wave.get_ref().iter().enumerate() {
            let key = format!("rollout.waves[{w}][{n}]");
            let value = name.get_ref();
            if !crate::config::is_node_name(value) {
                return Err(located(
                    name.span().start,
                    &key,
                    format!("`{value}` is not a PVE node name"),
                ));
            }
            if let Some(first) = seen.get(value) {
                return Err(located(
                    name.span().start,
                    &key,
                    format!(
                        "`{value}` is already in {first}; a node belongs to exactly one wave, \
                         remove one of them"
                    ),
                ));
            }
            seen.insert(value.clone(), format!("wave {} ({key})", w + 1));
            nodes.push(value.clone());
        }
        waves.push(nodes);
    }
    if !seen.contains_key(this) {
        return Err(invalid(
            "rollout.waves",
            format!(
                "this agent's node `{this}` is in no wave; add it to the wave it belongs to \
                 (the last one to take new commits after every other node)"
            ),
        ));
    }
    let duration = |key: &str, value: Option<&String>, default: Duration| match value {
        None => Ok(default),
        Some(text) => match humantime::parse_duration(text) {
            Ok(d) if !d.is_zero() || key == "rollout.bake" => Ok(d),
            Ok(_) => Err(invalid(
                key,
                "must be longer than 0 (a node that is down would be skipped at once)".to_owned(),
            )),
            Err(e) => Err(invalid(
                key,
                format!("`{text}`: {e}; write e.g. \"10m\" or \"1h\""),
            )),
        },
    };
    let health = raw.health.unwrap_or_default();
    Ok(Some(RolloutConfig {
        waves,
        bake: duration("rollout.bake", raw.bake.as_ref(), DEFAULT_BAKE)?,
        wave_timeout: duration(
            "rollout.wave_timeout",
            raw.wave_timeout.as_ref(),
            DEFAULT_WAVE_TIMEOUT,
        )?,
        health,
    }))
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Doc {
        rollout: Option<RawRollout>,
    }

    fn load(node: &str, text: &str) -> Result<Option<RolloutConfig>, String> {
        let doc: Doc = toml::from_str(text).map_err(|e| e.to_string())?;
        let scope = if node == "*" {
            NodeScope::All
        } else {
            NodeScope::Node(node.to_owned())
        };
        parse(doc.rollout, Path::new("agent.toml"), text, &scope, true).map_err(|e| e.to_string())
    }

    #[test]
    fn waves_bake_timeout_and_health_are_read_with_defaults_for_what_is_left_out() {
        let config = load(
            "pve1",
            "[rollout]\nwaves = [[\"pve3\"], [\"pve1\", \"pve2\"]]\nbake = \"5s\"\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.waves, [vec!["pve3"], vec!["pve1", "pve2"]]);
        assert_eq!(config.bake, Duration::from_secs(5));
        assert_eq!(config.wave_timeout, DEFAULT_WAVE_TIMEOUT);
        assert_eq!(config.health, Health::Power);
        assert_eq!(config.wave_of("pve1"), Some(1));
        let config = load(
            "pve3",
            "[rollout]\nwaves = [[\"pve3\"]]\nwave_timeout = \"2m\"\nhealth = \"power\"\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.wave_timeout, Duration::from_secs(120));
        assert_eq!(config.health, Health::Power);
        assert_eq!(load("pve1", "").unwrap(), None);
    }

    #[test]
    fn a_node_in_two_waves_is_refused_at_its_second_place_naming_the_first() {
        let err = load(
            "pve1",
            "[rollout]\nwaves = [[\"pve3\"],\n  [\"pve1\", \"pve3\"]]\n",
        )
        .unwrap_err();
        assert_eq!(
            err,
            "agent.toml:3:12: rollout.waves[1][1]: `pve3` is already in wave 1 \
             (rollout.waves[0][0]); a node belongs to exactly one wave, remove one of them"
        );
    }

    #[test]
    fn an_empty_wave_is_refused_at_the_wave() {
        let err = load("pve1", "[rollout]\nwaves = [[\"pve1\"], []]\n").unwrap_err();
        assert_eq!(
            err,
            "agent.toml:2:20: rollout.waves[1]: wave 2 is empty; put at least one node in it \
             or remove it"
        );
        let err = load("pve1", "[rollout]\nbake = \"1m\"\n").unwrap_err();
        assert!(
            err.contains("rollout.waves: no waves; write the nodes"),
            "{err}"
        );
    }

    #[test]
    fn this_agents_node_in_no_wave_is_refused_with_what_to_do() {
        let err = load("pve4", "[rollout]\nwaves = [[\"pve1\"]]\n").unwrap_err();
        assert_eq!(
            err,
            "agent.toml: rollout.waves: this agent's node `pve4` is in no wave; add it to the \
             wave it belongs to (the last one to take new commits after every other node)"
        );
        let err = load("*", "[rollout]\nwaves = [[\"pve1\"]]\n").unwrap_err();
        assert!(
            err.contains("agent.toml: rollout: a whole-cluster agent"),
            "{err}"
        );
        let doc: Doc = toml::from_str("[rollout]\nwaves = [[\"pve1\"]]\n").unwrap();
        let scope = NodeScope::Node("pve1".to_owned());
        let err = parse(doc.rollout, Path::new("agent.toml"), "", &scope, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("agent.toml: rollout: waves need cluster mode: add a [pmxcfs] table"),
            "{err}"
        );
    }

    #[test]
    fn bad_durations_names_and_health_are_refused_with_the_key() {
        let waves = "[rollout]\nwaves = [[\"pve1\"]]\n";
        let err = load("pve1", &format!("{waves}bake = \"soon\"\n")).unwrap_err();
        assert!(
            err.starts_with("agent.toml: rollout.bake: `soon`:"),
            "{err}"
        );
        let err = load("pve1", &format!("{waves}wave_timeout = \"0s\"\n")).unwrap_err();
        assert!(
            err.contains("rollout.wave_timeout: must be longer than 0"),
            "{err}"
        );
        assert_eq!(
            load("pve1", &format!("{waves}bake = \"0s\"\n"))
                .unwrap()
                .unwrap()
                .bake,
            Duration::ZERO
        );
        let err = load("pve1", "[rollout]\nwaves = [[\"pve 1\"]]\n").unwrap_err();
        assert!(
            err.starts_with("agent.toml:2:11: rollout.waves[0][0]: `pve 1` is not a PVE node"),
            "{err}"
        );
        assert!(load("pve1", &format!("{waves}health = \"ping\"\n")).is_err());
        let agent = load("pve1", &format!("{waves}health = \"guest-agent\"\n"));
        assert_eq!(agent.unwrap().unwrap().health, Health::GuestAgent);
    }
}
