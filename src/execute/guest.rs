//! The guest actions: create, clone, update, start, shutdown, reboot, promote and delete,
//! each sent with `proxops-pve`'s request builders and waited for when PVE runs a task.
//!
//! Nothing here decides what to change: the plan says it. The one write computed after the
//! fact, the config of a fresh clone, comes from the core's `clone_update` over the config
//! PVE reports for the clone. Writes PVE refuses because a guest or config lock is busy
//! (`can't lock file ... got timeout`, `is locked`) are sent again with a doubling pause, for
//! at most `lock_retry_for`; any other refusal fails the action (a digest mismatch too: the
//! next pass observes afresh and converges).
//!
//! A write whose answer is lost (a 596 from pveproxy, whose 30 s proxy timeout may run out
//! while PVE's handler goes on, or a timeout: [`PveError::is_unknown_outcome`]) is never
//! sent again. Before anything else the executor asks PVE what happened ([`Lost`]): the task
//! the write starts (listed by node, type, guest and the token's user), or, for a
//! synchronous config write, whether the config's digest moved. It follows a task it finds
//! as the write's own, so the action is recorded with that UPID; when PVE shows nothing the
//! action fails as `unknown`, and the next pass observes what PVE did.

#![allow(
    clippy::result_large_err,
    reason = "a StepError is built at most once per failed action"
)]

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use proxops_core::guest::{GuestType, LiveConfig, allocates_volume, percent_decode, sealed_value};
use proxops_core::plan::{
    Action, CloneFrom, Create, Grow, GuestRef, PoolMove, Update, Verb, clone_update,
};
use proxops_core::repository::DesiredState;
use proxops_pve::request::{
    self, CloneOptions, ConfigUpdate, DeleteOptions, Params, PoolUpdate, TaskFilter,
};
use proxops_pve::{PveClient, PveError, Request, TaskError, Upid, wait_for_task};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::error_chain::error_text;
use crate::execute::{Event, FailureClass, Options, Outcome, Progress};

/// Seconds since the epoch, as PVE writes a task's start time.
fn epoch_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Why a step of a guest action did not succeed. Large (it holds a parsed UPID), but built at
/// most once per failed action, so it is not boxed (hence the module's `result_large_err`).
enum StepError {
    /// PVE refused the request or the task failed.
    Failed {
        class: FailureClass,
        upid: Option<Upid>,
        error: String,
    },
    /// Cancelled while waiting.
    Interrupted,
}

type Step<T> = Result<T, StepError>;

/// A step that succeeded: its task, if PVE ran one, and PVE's exit status.
type Done = (Option<Upid>, String);

/// One guest action, from the request to the end of its last task.
pub(super) struct GuestRun<'a> {
    pub(super) pve: &'a PveClient,
    pub(super) desired: &'a DesiredState,
    pub(super) action: &'a Action,
    pub(super) options: &'a Options,
    pub(super) progress: &'a Progress,
    pub(super) cancel: &'a CancellationToken,
}

impl GuestRun<'_> {
    /// Runs the action and says how it ended.
    pub(super) async fn run(&self) -> Outcome {
        let result = match &self.action.verb {
            Verb::Create(create) => self.create(create).await,
            Verb::Clone(clone) => self.clone_from(clone).await,
            Verb::Update(update) => self.update(update).await,
            Verb::Pool(pool) => self.pool_move(pool).await,
            Verb::Start(g) => self.power(*g, Power::Start).await,
            Verb::Shutdown(g) => self.power(*g, Power::Shutdown).await,
            Verb::Reboot(g) => self.power(*g, Power::Reboot).await,
            Verb::Promote(g) => self.promote(*g).await,
            Verb::Delete(g) => self.delete(*g).await,
            Verb::Download(_) | Verb::WriteSnippet(_) | Verb::RemoveSnippet(_) => {
                Err(StepError::Failed {
                    class: FailureClass::Refused,
                    upid: None,
                    error: "not a guest action".to_owned(),
                })
            }
        };
        match result {
            Ok((upid, exitstatus)) => Outcome::Succeeded { upid, exitstatus },
            Err(StepError::Failed { class, upid, error }) => Outcome::Failed { class, upid, error },
            Err(StepError::Interrupted) => Outcome::Skipped {
                reason: "interrupted".to_owned(),
            },
        }
    }

    fn node(&self) -> &str {
        &self.action.node
    }

    /// Sends a write, again after a pause while PVE reports a busy lock. When the answer is
    /// lost, finds out from PVE what the write did (`lost`) instead of sending it again.
    async fn send(&self, req: &Request, lost: &Lost<'_>) -> Step<Value> {
        let started = tokio::time::Instant::now();
        let started_epoch = epoch_now();
        let mut delay = Duration::from_millis(250);
        loop {
            match self.pve.execute(req).await {
                Ok(value) => return Ok(value),
                Err(error) if error.is_unknown_outcome() => {
                    return self.find_out(&error, lost, started_epoch).await;
                }
                Err(error)
                    if error.is_lock_timeout()
                        && started.elapsed() < self.options.lock_retry_for =>
                {
                    tracing::info!(
                        node = %self.action.node,
                        resource = %self.action.resource,
                        error = %error_text(&error),
                        "guest locked; retrying"
                    );
                    tokio::select! {
                        () = self.cancel.cancelled() => return Err(StepError::Interrupted),
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(error) => return Err(refused(&error)),
            }
        }
    }

    /// What a write whose answer was lost did, asked of PVE: the UPID of the task it started
    /// (followed by [`wait`](Self::wait) as the write's own), `null` for a synchronous write
    /// PVE made, or an `unknown` failure when PVE shows neither.
    async fn find_out(&self, error: &PveError, lost: &Lost<'_>, started: u64) -> Step<Value> {
        tracing::warn!(
            node = %self.action.node,
            resource = %self.action.resource,
            error = %error_text(error),
            "the answer to a write was lost; asking PVE what it did"
        );
        let unknown = |what: String| StepError::Failed {
            class: FailureClass::Unknown,
            upid: None,
            error: format!(
                "{}: the answer was lost, so the write was not sent again; {what}; the next pass observes what PVE did",
                error_text(error)
            ),
        };
        match lost {
            Lost::Task {
                task_type,
                id,
                vmid,
                creates,
            } => match self.our_task(task_type, id, *vmid, started).await {
                Ok(Some(upid)) => {
                    if let Some(new) = creates
                        && self.guest_config(GuestType::Qemu, *new).await.is_err()
                    {
                        return Err(unknown(format!(
                            "the newest {task_type} task {upid} did not create {new}"
                        )));
                    }
                    tracing::warn!(
                        node = %self.action.node,
                        resource = %self.action.resource,
                        %upid,
                        "following the task the lost write started"
                    );
                    Ok(Value::String(upid.to_string()))
                }
                Ok(None) => Err(unknown(format!(
                    "PVE lists no {task_type} task for {id} by this token since the action began"
                ))),
                Err(list) => Err(unknown(format!(
                    "listing PVE's tasks failed too ({})",
                    error_text(&list)
                ))),
            },
            Lost::Config {
                guest_type,
                vmid,
                digest,
            } => self
                .config_written(*guest_type, *vmid, *digest)
                .await
                .map_err(unknown),
            Lost::Pool { pool, vmid } => self.pool_member(pool, *vmid).await.map_err(unknown),
        }
    }

    /// Whether a pool move whose answer was lost went through: `GET /pools?poolid=<pool>`
    /// lists the guest among the members.
    async fn pool_member(&self, pool: &str, vmid: u32) -> Result<Value, String> {
        let body = self
            .pve
            .execute(&request::pools(Some(pool)))
            .await
            .map_err(|e| format!("reading pool {pool} failed too ({})", error_text(&e)))?;
        let member = body
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("members").and_then(Value::as_array))
            .flatten()
            .any(|m| m.get("vmid").and_then(Value::as_u64) == Some(u64::from(vmid)));
        if member {
            Ok(Value::Null)
        } else {
            Err(format!("pool {pool} does not list guest {vmid}"))
        }
    }

    async fn our_task(
        &self,
        task_type: &str,
        id: &str,
        vmid: Option<u32>,
        started: u64,
    ) -> Result<Option<Upid>, PveError> {
        find_our_task(self.pve, self.node(), task_type, id, vmid, started).await
    }

    async fn guest_config(&self, guest_type: GuestType, vmid: u32) -> Result<Value, PveError> {
        let req = match guest_type {
            GuestType::Qemu => request::qemu_config(self.node(), vmid, false),
            GuestType::Lxc => request::lxc_config(self.node(), vmid, false),
        };
        self.pve.execute(&req).await
    }

    /// Whether a synchronous config write whose answer was lost went through: the config's
    /// digest moved away from the one the write carried (PVE refuses a write whose digest is
    /// stale, so a moved digest is this write, or one after it that the next pass sees).
    /// The handler may still be running (a disk import), so this watches for at most the
    /// task wait.
    async fn config_written(
        &self,
        guest_type: GuestType,
        vmid: u32,
        digest: Option<&str>,
    ) -> Result<Value, String> {
        let Some(sent) = digest else {
            return Err("the write carried no digest to compare with".to_owned());
        };
        let deadline = tokio::time::Instant::now() + self.options.wait.timeout;
        loop {
            let now = match self.guest_config(guest_type, vmid).await {
                Ok(config) => config
                    .get("digest")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                Err(e) => {
                    return Err(format!(
                        "reading the config failed too ({})",
                        error_text(&e)
                    ));
                }
            };
            if now.as_deref().is_some_and(|d| d != sent) {
                tracing::warn!(
                    node = %self.action.node,
                    resource = %self.action.resource,
                    "the config digest moved: PVE made the write whose answer was lost"
                );
                return Ok(Value::Null);
            }
            if tokio::time::Instant::now() >= deadline || self.cancel.is_cancelled() {
                return Err(format!(
                    "the config digest is still the one the write carried after {:?}",
                    self.options.wait.timeout
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits for the task a write answered with (`null`: PVE did it synchronously).
    async fn wait(&self, answer: &Value) -> Step<Done> {
        let Some(text) = answer.as_str() else {
            return Ok((None, "OK".to_owned()));
        };
        let upid: Upid = text.parse().map_err(|_| StepError::Failed {
            class: FailureClass::Refused,
            upid: None,
            error: format!("PVE answered `{text}`, which is not a task id"),
        })?;
        (self.progress)(&Event::TaskStarted {
            action: self.action.clone(),
            upid: upid.clone(),
        });
        match wait_for_task(self.pve, &upid, &self.options.wait, self.cancel).await {
            Ok(status) => Ok((
                Some(upid),
                status.exitstatus.unwrap_or_else(|| "OK".to_owned()),
            )),
            Err(TaskError::Cancelled { .. }) => Err(StepError::Interrupted),
            Err(error) => {
                let class = FailureClass::of_task(&error);
                let error = match error {
                    TaskError::Failed { exitstatus, .. } => exitstatus,
                    other => error_text(&other),
                };
                Err(StepError::Failed {
                    class,
                    upid: Some(upid),
                    error,
                })
            }
        }
    }

    async fn send_and_wait(&self, req: &Request, lost: &Lost<'_>) -> Step<Done> {
        let answer = self.send(req, lost).await?;
        self.wait(&answer).await
    }

    /// How to find out what a write that starts a `task_type` task for guest `vmid` did.
    fn task_of(task_type: &'static str, vmid: u32) -> Lost<'static> {
        Lost::Task {
            task_type,
            id: vmid.to_string(),
            vmid: Some(vmid),
            creates: None,
        }
    }

    /// The parameters to send: planned values, with SOPS markers swapped for the sealed
    /// values only here, as the request is built (plans and records hold only the markers).
    /// The values swapped in are returned too, to be scrubbed from PVE's answer should it
    /// quote one (its 400s quote parameter values).
    fn unsealed(&self, planned: &BTreeMap<String, String>) -> Step<(Params, Scrub)> {
        let resource = self.desired.manifest.get(&self.action.resource);
        let mut scrub = Scrub::default();
        let params = planned.iter().try_fold(Params::new(), |p, (k, v)| {
            let value = sealed_value(resource, k, v).map_err(|error| StepError::Failed {
                class: FailureClass::Refused,
                upid: None,
                error,
            })?;
            if let Cow::Owned(secret) = &value {
                scrub.add(secret);
            }
            Ok(p.set(k.clone(), value.into_owned()))
        })?;
        Ok((params, scrub))
    }

    async fn create(&self, create: &Create) -> Step<Done> {
        let (params, scrub) = self.unsealed(&create.params)?;
        let req = match create.guest_type {
            GuestType::Qemu => request::qemu_create(self.node(), create.vmid, &params),
            GuestType::Lxc => request::lxc_create(self.node(), create.vmid, &params),
        };
        let started = epoch_now();
        let task_type = match create.guest_type {
            GuestType::Qemu => "qmcreate",
            GuestType::Lxc => "vzcreate",
        };
        let answer = match self
            .send(&req, &Self::task_of(task_type, create.vmid))
            .await
        {
            Ok(answer) => answer,
            Err(error) => {
                match self
                    .task_behind_lost_answer(&error, create.vmid, task_type, started)
                    .await
                {
                    Some(upid) => Value::String(upid.to_string()),
                    None => return Err(scrub.apply(taken_but_hidden(error, create.vmid))),
                }
            }
        };
        let done = self.wait(&answer).await.map_err(|e| scrub.apply(e))?;
        self.grow(create.vmid, create.guest_type, &create.grow)
            .await?;
        if !create.after.is_empty() {
            self.write_after_create(create).await?;
        }
        Ok(done)
    }

    /// The keys a create into a pool leaves for later (its `tags`), written now that PVE
    /// has put the guest in the pool, against the new config's digest.
    async fn write_after_create(&self, create: &Create) -> Step<Done> {
        let config = self
            .guest_config(create.guest_type, create.vmid)
            .await
            .map_err(|e| refused(&e))?;
        let update = Update {
            vmid: create.vmid,
            guest_type: create.guest_type,
            set: create.after.clone(),
            delete: std::collections::BTreeSet::new(),
            digest: config
                .get("digest")
                .and_then(Value::as_str)
                .map(str::to_owned),
            grow: Vec::new(),
            changes: Vec::new(),
            regenerate_cloudinit: false,
        };
        self.update(&update).await
    }

    /// The task our own earlier attempt started, when a resent create is refused because the
    /// guest `already exists`: the client resends a write only after a 595, which proves
    /// PVE never saw it, but a proxy in front of PVE may still answer so after PVE acted
    /// (GAPS 47). Only a task of this type, for this vmid, by this token, started since the
    /// action began (less five minutes of clock skew between us and the node) counts;
    /// anything else leaves the refusal as it is.
    async fn task_behind_lost_answer(
        &self,
        error: &StepError,
        vmid: u32,
        task_type: &str,
        started: u64,
    ) -> Option<Upid> {
        let StepError::Failed {
            upid: None, error, ..
        } = error
        else {
            return None;
        };
        if !error.contains("already exists") {
            return None;
        }
        let upid = self
            .our_task(task_type, &vmid.to_string(), Some(vmid), started)
            .await
            .ok()??;
        tracing::warn!(
            node = %self.action.node,
            resource = %self.action.resource,
            %upid,
            "create refused as `already exists` after a lost answer: following the task the first attempt started"
        );
        Some(upid)
    }

    async fn grow(&self, vmid: u32, guest_type: GuestType, grow: &[Grow]) -> Step<()> {
        for g in grow {
            let req = match guest_type {
                GuestType::Qemu => request::qemu_resize(self.node(), vmid, &g.slot, &g.size),
                GuestType::Lxc => request::lxc_resize(self.node(), vmid, &g.slot, &g.size),
            };
            self.send_and_wait(&req, &Self::task_of("resize", vmid))
                .await?;
        }
        Ok(())
    }

    async fn clone_from(&self, clone: &CloneFrom) -> Step<Done> {
        let opts = CloneOptions {
            newid: clone.vmid,
            name: Some(clone.name.clone()).filter(|n| !n.is_empty()),
            full: Some(true),
            pool: clone.pool.clone(),
            ..CloneOptions::default()
        };
        let req = request::qemu_clone(self.node(), clone.source_vmid, &opts);
        // The `qmclone` task's id is the source; the new guest's config tells this clone's
        // task from an earlier clone of the same source.
        let lost = Lost::Task {
            task_type: "qmclone",
            id: clone.source_vmid.to_string(),
            vmid: Some(clone.source_vmid),
            creates: Some(clone.vmid),
        };
        let done = self.send_and_wait(&req, &lost).await?;
        // The clone's own config, computed by the core from what PVE reports for it.
        let read = request::qemu_config(self.node(), clone.vmid, false);
        let body = self.pve.execute(&read).await.map_err(|e| refused(&e))?;
        let live =
            LiveConfig::from_json(GuestType::Qemu, &body).map_err(|e| StepError::Failed {
                class: FailureClass::Refused,
                upid: done.0.clone(),
                error: format!("reading the clone's config: {e}"),
            })?;
        if let Some(update) = clone_update(self.desired, &self.action.resource, &live) {
            self.update(&update).await?;
        }
        Ok(done)
    }

    async fn update(&self, update: &Update) -> Step<Done> {
        let mut done = (None, "OK".to_owned());
        if !update.set.is_empty() || !update.delete.is_empty() {
            let (set, scrub) = self.unsealed(&update.set)?;
            let change = ConfigUpdate {
                set,
                delete: update.delete.iter().cloned().collect(),
                revert: Vec::new(),
                digest: update.digest.clone(),
            };
            // A qemu write that allocates or imports a volume runs as a `qmconfig` task
            // (`POST`): the synchronous `PUT` would copy the whole image before answering.
            let allocates = update.guest_type == GuestType::Qemu
                && update
                    .set
                    .iter()
                    .any(|(k, v)| allocates_volume(update.guest_type, k, v));
            let (req, lost) = match update.guest_type {
                GuestType::Qemu if allocates => (
                    request::qemu_config_post(self.node(), update.vmid, &change),
                    Self::task_of("qmconfig", update.vmid),
                ),
                GuestType::Qemu => (
                    request::qemu_config_put(self.node(), update.vmid, &change),
                    Lost::Config {
                        guest_type: GuestType::Qemu,
                        vmid: update.vmid,
                        digest: update.digest.as_deref(),
                    },
                ),
                GuestType::Lxc => (
                    request::lxc_config_put(self.node(), update.vmid, &change),
                    Lost::Config {
                        guest_type: GuestType::Lxc,
                        vmid: update.vmid,
                        digest: update.digest.as_deref(),
                    },
                ),
            };
            done = self
                .send_and_wait(&req, &lost)
                .await
                .map_err(|e| scrub.apply(e))?;
        }
        self.grow(update.vmid, update.guest_type, &update.grow)
            .await?;
        if update.regenerate_cloudinit && update.guest_type == GuestType::Qemu {
            super::snippets::after_cicustom_change(self.pve, self.node(), update)
                .await
                .map_err(|e| refused(&e))?;
        }
        Ok(done)
    }

    async fn power(&self, g: GuestRef, power: Power) -> Step<Done> {
        let node = self.node();
        let req = match (g.guest_type, power) {
            (GuestType::Qemu, Power::Start) => request::qemu_start(node, g.vmid),
            (GuestType::Qemu, Power::Shutdown) => {
                request::qemu_shutdown_or_stop(node, g.vmid, self.shutdown_timeout())
            }
            (GuestType::Qemu, Power::Reboot) => request::qemu_reboot(node, g.vmid, None),
            (GuestType::Lxc, Power::Start) => request::lxc_start(node, g.vmid),
            (GuestType::Lxc, Power::Shutdown) => {
                request::lxc_shutdown_or_stop(node, g.vmid, self.shutdown_timeout())
            }
            (GuestType::Lxc, Power::Reboot) => request::lxc_reboot(node, g.vmid, None),
        };
        let task_type = match (g.guest_type, power) {
            (GuestType::Qemu, Power::Start) => "qmstart",
            (GuestType::Qemu, Power::Shutdown) => "qmshutdown",
            (GuestType::Qemu, Power::Reboot) => "qmreboot",
            (GuestType::Lxc, Power::Start) => "vzstart",
            (GuestType::Lxc, Power::Shutdown) => "vzshutdown",
            (GuestType::Lxc, Power::Reboot) => "vzreboot",
        };
        match self
            .send_and_wait(&req, &Self::task_of(task_type, g.vmid))
            .await
        {
            // Already in the wanted state (lxc says so synchronously): nothing to do.
            Err(StepError::Failed { error, .. })
                if (power == Power::Start && error.contains("already running"))
                    || (power == Power::Shutdown && error.contains("not running")) =>
            {
                Ok((None, "OK".to_owned()))
            }
            other => other,
        }
    }

    /// Seconds PVE waits for a clean (ACPI) shutdown before it stops the guest hard
    /// (`forceStop`): half the task wait, so the stop still ends inside it, and at most
    /// [`MAX_SHUTDOWN_WAIT`]. A guest that ignores ACPI would otherwise hold a prune or a
    /// `state: stopped` until the task wait gives up, and stay running.
    fn shutdown_timeout(&self) -> u32 {
        let half = (self.options.wait.timeout / 2).min(MAX_SHUTDOWN_WAIT);
        u32::try_from(half.as_secs()).unwrap_or(u32::MAX).max(1)
    }

    /// `PUT /pools` with `allow-move`: PVE takes the guest out of the pool it is in and adds
    /// it to `pool` (pve-manager @ 14a22df3 `PVE/API2/Pool.pm` `update_pool`: `Pool.Allocate`
    /// on `/pool/<pool>`, `VM.Allocate` or `Permissions.Modify` on `/vms/<vmid>`
    /// (`check_perm_modify`), and `Pool.Allocate` on the pool it leaves). Synchronous: PVE
    /// answers `null`.
    async fn pool_move(&self, pool: &PoolMove) -> Step<Done> {
        let update = PoolUpdate {
            poolid: pool.pool.clone(),
            vms: vec![pool.vmid],
            allow_move: true,
            ..PoolUpdate::default()
        };
        let lost = Lost::Pool {
            pool: &pool.pool,
            vmid: pool.vmid,
        };
        self.send(&request::pool_update(&update), &lost).await?;
        Ok((None, "OK".to_owned()))
    }

    /// Marks a guest as a template. An LXC `template` POST answers `null` although PVE runs
    /// a `vztemplate` worker, which writes `template: 1` only at its end and sets no config
    /// lock meanwhile (pve-container @ 94f55852 `src/PVE/API2/LXC.pm` `template`:
    /// `fork_worker('vztemplate', ...)`, `return undef`); the worker is in PVE's active task
    /// list before the answer (pve-common @ f665029e `src/PVE/RESTEnvironment.pm`
    /// `fork_worker`: `active_workers($upid)` before it returns). So after a `null` the
    /// executor looks that task up and waits for it: the action ends when the container is a
    /// template, and no later pass can find it half-converted and send the POST again
    /// (PVE: `you can't convert a template to a template`, or a lock timeout).
    async fn promote(&self, g: GuestRef) -> Step<Done> {
        let req = match g.guest_type {
            GuestType::Qemu => request::qemu_template(self.node(), g.vmid),
            GuestType::Lxc => request::lxc_template(self.node(), g.vmid),
        };
        let task_type = match g.guest_type {
            GuestType::Qemu => "qmtemplate",
            GuestType::Lxc => "vztemplate",
        };
        let started = epoch_now();
        let answer = self.send(&req, &Self::task_of(task_type, g.vmid)).await?;
        if answer.is_null() && g.guest_type == GuestType::Lxc {
            match self
                .our_task(task_type, &g.vmid.to_string(), Some(g.vmid), started)
                .await
            {
                Ok(Some(upid)) => return self.wait(&Value::String(upid.to_string())).await,
                Ok(None) => tracing::warn!(
                    node = %self.action.node,
                    resource = %self.action.resource,
                    "the template POST answered null but PVE lists no vztemplate task by this token"
                ),
                Err(error) => tracing::warn!(
                    node = %self.action.node,
                    resource = %self.action.resource,
                    error = %error_text(&error),
                    "listing PVE's tasks after the template POST failed"
                ),
            }
        }
        self.wait(&answer).await
    }

    async fn delete(&self, g: GuestRef) -> Step<Done> {
        let opts = DeleteOptions {
            purge: true,
            destroy_unreferenced_disks: false,
        };
        let req = match g.guest_type {
            GuestType::Qemu => request::qemu_delete(self.node(), g.vmid, opts),
            GuestType::Lxc => request::lxc_delete(self.node(), g.vmid, opts),
        };
        let task_type = match g.guest_type {
            GuestType::Qemu => "qmdestroy",
            GuestType::Lxc => "vzdestroy",
        };
        self.send_and_wait(&req, &Self::task_of(task_type, g.vmid))
            .await
    }
}

/// A create refused `already exists` with no task of ours behind it: the plan saw no guest
/// with the vmid, so one exists that `/cluster/resources` hides from this token (no VM.Audit
/// on it; SOURCE-AUDIT.md M25). The error says so, and what to grant; the next pass's
/// observe finds the vmid taken (`GET /cluster/nextid`) and plans no create.
fn taken_but_hidden(error: StepError, vmid: u32) -> StepError {
    match error {
        StepError::Failed { class, upid, error } if error.contains("already exists") => {
            StepError::Failed {
                class,
                upid,
                error: format!(
                    "{error} (vmid {vmid} is taken by a guest this token cannot see: grant VM.Audit on /vms/{vmid}, or declare a free vmid)"
                ),
            }
        }
        other => other,
    }
}

/// The newest task of `task_type` for `id` on `node` that this client's token started at or
/// after `started` (less five minutes of clock skew between us and the node). PVE filters by
/// the token's user (archived tasks are matched after the token id is split off, pve-manager
/// `PVE/API2/Tasks.pm` `node_tasks`); the UPID itself says which token started it.
pub(super) async fn find_our_task(
    pve: &PveClient,
    node: &str,
    task_type: &str,
    id: &str,
    vmid: Option<u32>,
    started: u64,
) -> Result<Option<Upid>, PveError> {
    let not_before = started.saturating_sub(300);
    let filter = TaskFilter {
        task_type,
        vmid,
        user: pve.token_id(),
        since: not_before,
    };
    let tasks = pve.execute(&request::node_tasks(node, &filter)).await?;
    let found = tasks.as_array().into_iter().flatten().find_map(|task| {
        let upid: Upid = task.get("upid")?.as_str()?.parse().ok()?;
        let ours = upid.user() == pve.token_id()
            && upid.task_type() == task_type
            && upid.id() == id
            && u64::from(upid.starttime()) >= not_before;
        ours.then_some(upid)
    });
    Ok(found)
}

/// Seconds since the epoch, for [`find_our_task`].
pub(super) fn now() -> u64 {
    epoch_now()
}

/// How to find out from PVE what a write whose answer was lost did.
enum Lost<'a> {
    /// The write starts a task: its type, its id (the vmid; a clone's source), the guest to
    /// list tasks for, and for a clone the new guest that must exist when the task is ours.
    Task {
        task_type: &'static str,
        id: String,
        vmid: Option<u32>,
        creates: Option<u32>,
    },
    /// A synchronous config write carrying `digest`.
    Config {
        guest_type: GuestType,
        vmid: u32,
        digest: Option<&'a str>,
    },
    /// A pool move: the guest is then a member of `pool`.
    Pool { pool: &'a str, vmid: u32 },
}

/// The longest clean shutdown ProxOps waits for before PVE stops the guest hard.
const MAX_SHUTDOWN_WAIT: Duration = Duration::from_secs(180);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Power {
    Start,
    Shutdown,
    Reboot,
}

/// Secret values sent in one request, to be kept out of the error recorded when PVE
/// refuses it: each value, and each line of it percent-decoded (PVE quotes `sshkeys`
/// decoded).
#[derive(Default)]
struct Scrub(Vec<String>);

impl Scrub {
    fn add(&mut self, secret: &str) {
        self.0.push(secret.to_owned());
        self.0.extend(
            percent_decode(secret)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned),
        );
    }

    fn apply(&self, error: StepError) -> StepError {
        match error {
            StepError::Failed {
                class,
                upid,
                mut error,
            } => {
                for secret in self.0.iter().filter(|s| !s.is_empty()) {
                    error = error.replace(secret.as_str(), proxops_core::secret::REDACTED);
                }
                StepError::Failed { class, upid, error }
            }
            other => other,
        }
    }
}

/// The client's error already names the method and path; its class says whether it may heal.
fn refused(error: &PveError) -> StepError {
    StepError::Failed {
        class: FailureClass::of_pve(error),
        upid: None,
        error: error_text(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_write_records_no_secret_value_pve_quoted() {
        let mut scrub = Scrub::default();
        scrub.add("ssh-ed25519%20AAAAkey%20admin%40example%0Assh-rsa%20BBBBkey%20x");
        scrub.add("s3cr3t-Passw0rd");
        let refused = StepError::Failed {
            class: FailureClass::Refused,
            upid: None,
            error: "POST /nodes/pve1/qemu: 400: sshkeys: invalid urlencoded string: ssh-rsa BBBBkey x; \
                    cipassword: s3cr3t-Passw0rd"
                .to_owned(),
        };
        let StepError::Failed { error, .. } = scrub.apply(refused) else {
            panic!("still a failure");
        };
        assert_eq!(
            error,
            "POST /nodes/pve1/qemu: 400: sshkeys: invalid urlencoded string: (secret); cipassword: (secret)"
        );
    }
}
