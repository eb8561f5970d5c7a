//! [`SimControl`]: the library handle tests use to script faults and read the request log;
//! the `/_sim/...` HTTP control API calls the same methods.

use std::sync::Arc;
use std::time::Duration;

use crate::faults::{FaultError, HttpFault};
use crate::request_log::RequestLog;
use crate::state::Shared;

/// Handle on a running simulator's faults and request log. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SimControl {
    shared: Arc<Shared>,
}

impl SimControl {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The next `times` content listings of `storage` on `node` fail with 500
    /// `storage '<storage>' is not online` (or `message`).
    pub fn fail_storage_listing(
        &self,
        node: &str,
        storage: &str,
        times: u32,
        message: Option<&str>,
    ) {
        self.shared
            .faults()
            .add_storage_listing(node, storage, times, message.map(str::to_string));
    }

    /// Answers requests whose path matches with 500 or 595/596.
    ///
    /// # Errors
    /// A bad pattern or an unsupported status.
    pub fn fail_requests(&self, fault: HttpFault) -> Result<(), FaultError> {
        self.shared.faults().add_http(fault)
    }

    /// Handles requests whose path matches, then answers 500 or 595/596 instead of PVE's
    /// reply: PVE acted and the caller never learns it (a proxied connection dropped after
    /// the target node ran the request).
    ///
    /// # Errors
    /// A bad pattern or an unsupported status.
    pub fn lose_answers(&self, fault: HttpFault) -> Result<(), FaultError> {
        self.shared.faults().add_lost_answer(fault)
    }

    /// Delays every request whose path matches `pattern` (all when `None`).
    ///
    /// # Errors
    /// A bad pattern.
    pub fn add_latency(&self, pattern: Option<&str>, delay: Duration) -> Result<(), FaultError> {
        self.shared.faults().add_latency(pattern, delay, None)
    }

    /// Delays each request whose path matches `pattern` (all when `None`) with
    /// `probability`: latency spikes rather than a slow link.
    ///
    /// # Errors
    /// A bad pattern.
    pub fn add_latency_spikes(
        &self,
        pattern: Option<&str>,
        delay: Duration,
        probability: f64,
    ) -> Result<(), FaultError> {
        self.shared
            .faults()
            .add_latency(pattern, delay, Some(probability))
    }

    /// Probabilistic faults (HTTP faults and latency spikes with a probability) draw from a
    /// generator seeded with `seed` from now on, so a scripted run can be repeated (as far
    /// as the order of the requests that reach them repeats).
    pub fn seed_faults(&self, seed: u64) {
        self.shared.faults().seed(seed);
    }

    /// The next task of `task_type` (e.g. `qmcreate`, `download`) fails with `message`.
    pub fn fail_next_task(&self, task_type: &str, message: &str) {
        self.shared.faults().add_task_failure(task_type, message);
    }

    /// The next `times` writes to guest `vmid` fail with
    /// `can't lock file '...' - got timeout`.
    pub fn time_out_lock(&self, vmid: u32, times: u32) {
        self.shared.faults().add_lock_timeout(vmid, times);
    }

    /// Whether guest `vmid`'s OS ignores ACPI power-down requests (as a hung guest does):
    /// its `shutdown` then waits the request's `timeout` and fails, or stops it with
    /// `forceStop=1`. Returns false when there is no such guest.
    pub fn ignore_shutdown(&self, vmid: u32, ignores: bool) -> bool {
        let mut cluster = self.shared.cluster();
        cluster
            .guests
            .get_mut(&vmid)
            .map(|g| g.ignores_shutdown = ignores)
            .is_some()
    }

    /// Whether the QEMU guest agent inside VM `vmid` answers (the default) or not, as when
    /// the `qemu-guest-agent` service in the guest is stopped or hung: then every
    /// `/agent/<command>` call fails with "QEMU guest agent is not running" (qemu-server @
    /// e6352be6 `src/PVE/QemuServer/Agent.pm`, `assert_agent_available` after
    /// `qga_check_running`'s `guest-ping` times out). Returns false when there is no such
    /// guest.
    pub fn set_guest_agent_running(&self, vmid: u32, running: bool) -> bool {
        let mut cluster = self.shared.cluster();
        cluster
            .guests
            .get_mut(&vmid)
            .map(|g| g.agent_stopped = !running)
            .is_some()
    }

    /// Runs pvestatd's status update now, as if its next 10 s tick had come: guests created,
    /// started, stopped or promoted since the last run show their new `status`, `name` and
    /// `template` in `/cluster/resources`. Does nothing when the stats interval is zero.
    pub fn refresh_stats(&self) {
        self.shared.cluster().refresh_stats();
    }

    /// Puts `node` into PVE's HA maintenance mode, or takes it out (`ha-manager crm-command
    /// node-maintenance enable|disable <node>`); turns HA on. Returns false for an unknown
    /// node.
    pub fn set_ha_maintenance(&self, node: &str, enable: bool) -> bool {
        let mut cluster = self.shared.cluster();
        if !cluster.nodes.contains_key(node) {
            return false;
        }
        let nodes = cluster.ha.get_or_insert_default();
        if enable {
            nodes.insert(node.to_string());
        } else {
            nodes.remove(node);
        }
        true
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.shared.faults().clear();
    }

    /// A copy of the request log and counters.
    pub fn requests(&self) -> RequestLog {
        self.shared.log().clone()
    }

    /// Empties the request log and counters.
    pub fn clear_requests(&self) {
        self.shared.log().clear();
    }

    /// The request log and counters, emptied in the same step so no request is lost
    /// between reading and clearing (long runs read it in pieces: the log keeps at most
    /// 10,000 entries).
    pub fn take_requests(&self) -> RequestLog {
        let mut log = self.shared.log();
        let taken = log.clone();
        log.clear();
        taken
    }
}
