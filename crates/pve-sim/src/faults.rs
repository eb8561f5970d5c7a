//! Scripted faults for tests: failing storage listings, 500/595 answers on matching paths,
//! added latency, failing the next task of a type, and config lock timeouts. Set through
//! [`crate::SimControl`] or the `/_sim/faults/...` control endpoints; consumed by the request
//! dispatcher and the handlers.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use regex::Regex;
use serde::{Deserialize, Serialize};

/// Errors setting up a fault.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// The path pattern is not a valid regex.
    #[error("invalid path pattern '{pattern}'")]
    Pattern {
        /// The pattern as given.
        pattern: String,
        /// The regex error.
        #[source]
        source: regex::Error,
    },
    /// A status other than 403, 500, 595 or 596 was asked for.
    #[error("unsupported fault status {0} (use 403, 500, 595 or 596)")]
    Status(u16),
}

/// Answer matching requests with an error instead of handling them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HttpFault {
    /// Regex searched in the path below `/api2/json` (e.g. `/qemu/\d+/config$`).
    pub pattern: String,
    /// Only requests with this method (`GET`, ...); all methods when absent.
    #[serde(default)]
    pub method: Option<String>,
    /// 500 or 403 (with `message`), or 595/596 (empty body, as a failed node-to-node proxy).
    #[serde(default = "default_status")]
    pub status: u16,
    /// Error message for 500 answers.
    #[serde(default)]
    pub message: Option<String>,
    /// Fail this many matching requests, then stop (unlimited when absent).
    #[serde(default)]
    pub times: Option<u32>,
    /// Fail each matching request with this probability (always when absent).
    #[serde(default)]
    pub probability: Option<f64>,
}

fn default_status() -> u16 {
    500
}

/// An injected answer for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Injected {
    Die(String),
    Forbidden(String),
    Proxy(u16),
}

#[derive(Debug)]
struct ActiveHttpFault {
    regex: Regex,
    fault: HttpFault,
}

impl ActiveHttpFault {
    fn new(fault: HttpFault) -> Result<Self, FaultError> {
        if !matches!(fault.status, 403 | 500 | 595 | 596) {
            return Err(FaultError::Status(fault.status));
        }
        let regex = Regex::new(&fault.pattern).map_err(|source| FaultError::Pattern {
            pattern: fault.pattern.clone(),
            source,
        })?;
        Ok(Self { regex, fault })
    }
}

#[derive(Debug)]
struct StorageListingFault {
    node: String,
    storage: String,
    remaining: u32,
    message: String,
}

#[derive(Debug)]
struct LatencyFault {
    regex: Option<Regex>,
    delay: Duration,
    /// Delay only this share of matching requests (a spike), every one when absent.
    probability: Option<f64>,
}

/// All active faults.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    http: Vec<ActiveHttpFault>,
    /// Faults fired after the request was handled: PVE acted, the answer was lost.
    lost_answers: Vec<ActiveHttpFault>,
    storage_listing: Vec<StorageListingFault>,
    latency: Vec<LatencyFault>,
    task_failures: Vec<(String, String)>,
    lock_timeouts: Vec<(u32, u32)>,
    /// Seeded source of the probabilistic faults, so a scripted run can be repeated;
    /// the thread RNG when unset.
    rng: Option<StdRng>,
}

impl Faults {
    pub(crate) fn add_http(&mut self, fault: HttpFault) -> Result<(), FaultError> {
        let active = ActiveHttpFault::new(fault)?;
        self.http.push(active);
        Ok(())
    }

    pub(crate) fn add_lost_answer(&mut self, fault: HttpFault) -> Result<(), FaultError> {
        let active = ActiveHttpFault::new(fault)?;
        self.lost_answers.push(active);
        Ok(())
    }

    pub(crate) fn add_storage_listing(
        &mut self,
        node: &str,
        storage: &str,
        times: u32,
        message: Option<String>,
    ) {
        let message = message.unwrap_or_else(|| format!("storage '{storage}' is not online"));
        self.storage_listing.push(StorageListingFault {
            node: node.to_string(),
            storage: storage.to_string(),
            remaining: times,
            message,
        });
    }

    /// Probabilistic faults draw from a generator seeded with `seed` from now on.
    pub(crate) fn seed(&mut self, seed: u64) {
        self.rng = Some(StdRng::seed_from_u64(seed));
    }

    /// Whether a fault with `probability` fires for this request.
    fn fires(&mut self, probability: Option<f64>) -> bool {
        let Some(p) = probability else {
            return true;
        };
        let p = p.clamp(0.0, 1.0);
        match self.rng.as_mut() {
            Some(rng) => rng.random_bool(p),
            None => rand::random_bool(p),
        }
    }

    pub(crate) fn add_latency(
        &mut self,
        pattern: Option<&str>,
        delay: Duration,
        probability: Option<f64>,
    ) -> Result<(), FaultError> {
        let regex = pattern
            .map(|p| {
                Regex::new(p).map_err(|source| FaultError::Pattern {
                    pattern: p.to_string(),
                    source,
                })
            })
            .transpose()?;
        self.latency.push(LatencyFault {
            regex,
            delay,
            probability,
        });
        Ok(())
    }

    pub(crate) fn add_task_failure(&mut self, kind: &str, message: &str) {
        self.task_failures
            .push((kind.to_string(), message.to_string()));
    }

    pub(crate) fn add_lock_timeout(&mut self, vmid: u32, times: u32) {
        self.lock_timeouts.push((vmid, times));
    }

    /// Removes every fault; a seeded generator keeps its sequence.
    pub(crate) fn clear(&mut self) {
        let rng = self.rng.take();
        *self = Self::default();
        self.rng = rng;
    }

    /// Total delay to add before answering `path`.
    pub(crate) fn latency_for(&mut self, path: &str) -> Duration {
        let matching: Vec<(Duration, Option<f64>)> = self
            .latency
            .iter()
            .filter(|l| l.regex.as_ref().is_none_or(|r| r.is_match(path)))
            .map(|l| (l.delay, l.probability))
            .collect();
        matching
            .into_iter()
            .filter(|(_, p)| self.fires(*p))
            .map(|(delay, _)| delay)
            .sum()
    }

    /// The injected answer for this request, if a fault fires (consuming one use).
    pub(crate) fn take_http(&mut self, method: &str, path: &str) -> Option<Injected> {
        let mut faults = std::mem::take(&mut self.http);
        let fired = self.take_from(&mut faults, method, path);
        self.http = faults;
        fired
    }

    /// The answer replacing the reply to a request PVE has handled, if a lost-answer fault
    /// fires (consuming one use).
    pub(crate) fn take_lost_answer(&mut self, method: &str, path: &str) -> Option<Injected> {
        let mut faults = std::mem::take(&mut self.lost_answers);
        let fired = self.take_from(&mut faults, method, path);
        self.lost_answers = faults;
        fired
    }

    fn take_from(
        &mut self,
        faults: &mut Vec<ActiveHttpFault>,
        method: &str,
        path: &str,
    ) -> Option<Injected> {
        let mut fired = None;
        for active in faults.iter_mut() {
            let f = &active.fault;
            if f.method
                .as_deref()
                .is_some_and(|m| !m.eq_ignore_ascii_case(method))
                || !active.regex.is_match(path)
                || f.times == Some(0)
            {
                continue;
            }
            if !self.fires(f.probability) {
                continue;
            }
            let f = &mut active.fault;
            if let Some(t) = f.times.as_mut() {
                *t -= 1;
            }
            fired = Some(match f.status {
                500 => Injected::Die(
                    f.message
                        .clone()
                        .unwrap_or_else(|| "injected failure".to_string()),
                ),
                403 => Injected::Forbidden(
                    f.message
                        .clone()
                        .unwrap_or_else(|| "Permission check failed (/, Sys.Audit)".to_string()),
                ),
                s => Injected::Proxy(s),
            });
            break;
        }
        faults.retain(|a| a.fault.times != Some(0));
        fired
    }

    /// The error for a listing of `storage` on `node`, if one is scheduled.
    pub(crate) fn take_storage_listing(&mut self, node: &str, storage: &str) -> Option<String> {
        let f = self
            .storage_listing
            .iter_mut()
            .find(|f| f.node == node && f.storage == storage && f.remaining > 0)?;
        f.remaining -= 1;
        let message = f.message.clone();
        self.storage_listing.retain(|f| f.remaining > 0);
        Some(message)
    }

    /// The injected failure message for the next task of `kind`.
    pub(crate) fn take_task_failure(&mut self, kind: &str) -> Option<String> {
        let pos = self.task_failures.iter().position(|(k, _)| k == kind)?;
        Some(self.task_failures.remove(pos).1)
    }

    /// Whether taking the config lock of `vmid` should time out now.
    pub(crate) fn take_lock_timeout(&mut self, vmid: u32) -> bool {
        let Some(entry) = self
            .lock_timeouts
            .iter_mut()
            .find(|(id, left)| *id == vmid && *left > 0)
        else {
            return false;
        };
        entry.1 -= 1;
        self.lock_timeouts.retain(|(_, left)| *left > 0);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern_of_fires(seed: u64) -> Vec<bool> {
        let mut faults = Faults::default();
        faults.seed(seed);
        faults
            .add_http(HttpFault {
                pattern: "/qemu$".into(),
                method: None,
                status: 500,
                message: None,
                times: None,
                probability: Some(0.3),
            })
            .unwrap();
        faults
            .add_latency(Some("/qemu$"), Duration::from_millis(5), Some(0.5))
            .unwrap();
        (0..200)
            .flat_map(|_| {
                let spike = !faults.latency_for("/nodes/pve1/qemu").is_zero();
                let fired = faults.take_http("POST", "/nodes/pve1/qemu").is_some();
                [spike, fired]
            })
            .collect()
    }

    #[test]
    fn the_same_seed_fires_the_same_probabilistic_faults_and_another_seed_does_not() {
        let first = pattern_of_fires(7);
        assert_eq!(first, pattern_of_fires(7));
        assert_ne!(first, pattern_of_fires(8));
        let fired = first.iter().skip(1).step_by(2).filter(|f| **f).count();
        assert!((30..=90).contains(&fired), "about 30% of 200: {fired}");
    }
}
