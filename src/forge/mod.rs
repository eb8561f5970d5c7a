//! The forge loop: per-node commit statuses on GitHub, Gitea or Forgejo (`[forge]`).
//!
//! A pass calls [`Forge::pass_started`] once it knows its commit and [`Forge::pass_ended`]
//! once it is recorded; both only queue (never wait, never fail the pass). One delivery
//! task per configuration sends the queue in order (so for one commit the newer status is
//! always sent last), retrying a connection error, a timeout, 408, 429 or a 5xx with the
//! loop's [`Backoff`] until it is delivered or [`MAX_AGE`] old; another 4xx is the
//! configuration's fault and is given up at once with a log line naming the status.
//! The token goes only in the `Authorization` header of requests to `api_url`'s host;
//! redirects are never followed (the client of
//! [`crate::notify::deliver::http_client_trusting`]).
//!
//! What is sent per pass (the HEAD commit the pass fetched):
//! - `pending` when a pass starts on a commit this configuration has not reported yet;
//! - `success` when the pass applied it or found nothing to change;
//! - `failure` when actions failed: how many, and the first with its error;
//! - `error` when the revision is invalid: the first diagnostic;
//! - nothing for an interrupted pass or one with no commit (git unreachable).
//!
//! A final status already sent for a commit is not sent again while it stays the same.
//! Descriptions are cut to [`MAX_DESCRIPTION`] characters (GitHub's limit).
//! Plan previews on pull requests (`preview = true`) are [`preview`]'s, with the comment
//! and `…/plan` status calls in [`comment`].

pub mod comment;
pub mod config;
pub mod preview;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proxops_store::{ActionOutcome, PassCounts, PassId, PassOutcome, SharedStore};
use secrecy::ExposeSecret;
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::agent::retry::{Backoff, MIN_BACKOFF, Verdict};
use crate::error_chain::error_text;
use config::{ForgeConfig, ForgeKind};

/// GitHub's limit on a status description.
pub const MAX_DESCRIPTION: usize = 140;
/// How long a status is retried before it is given up.
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// Statuses the queue holds; a full queue drops its oldest (logged).
pub const QUEUE_CAPACITY: usize = 256;

/// A commit state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// A pass is working on it.
    Pending,
    /// Applied, or nothing to change.
    Success,
    /// Actions failed.
    Failure,
    /// The revision is invalid.
    Error,
}

impl State {
    /// The API's name.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Success => "success",
            State::Failure => "failure",
            State::Error => "error",
        }
    }
}

/// One status waiting to be sent.
#[derive(Debug, Clone, PartialEq)]
pub struct CommitStatus {
    /// The commit.
    pub sha: String,
    /// Its state.
    pub state: State,
    /// At most [`MAX_DESCRIPTION`] characters.
    pub description: String,
    /// The pass's page in the UI, when `public_url` is set.
    pub target_url: Option<String>,
    /// When it was queued.
    pub queued_at: Instant,
}

/// What a pass's end says, as [`Forge::pass_ended`] needs it.
#[derive(Debug, Clone)]
pub struct PassFacts<'a> {
    /// The pass.
    pub pass: PassId,
    /// The HEAD commit it fetched.
    pub commit: Option<&'a str>,
    /// How it ended.
    pub outcome: PassOutcome,
    /// Its counts.
    pub counts: PassCounts,
    /// The first diagnostic of an invalid revision, as `path:line:column: field: message`.
    pub first_diagnostic: Option<String>,
    /// The pass's note (why it failed or was refused).
    pub note: Option<&'a str>,
}

#[derive(Debug, Default)]
struct Memory {
    /// The commit `pending` was last sent for.
    pending_for: Option<String>,
    /// The last final status sent: commit, state, description.
    last_final: Option<(String, State, String)>,
}

/// The forge of one configuration: its queue, memory and delivery task (stopped when it
/// is dropped, e.g. by a reload that builds a new one).
pub struct Forge {
    config: ForgeConfig,
    context: String,
    queue: Arc<StatusQueue>,
    memory: Mutex<Memory>,
    stop: CancellationToken,
}

impl Drop for Forge {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl std::fmt::Debug for Forge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forge")
            .field("config", &self.config)
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

impl Forge {
    /// Starts the delivery task; `None` when `status = false` or the HTTP client cannot be
    /// built (logged). Must be called within the tokio runtime.
    pub fn start(
        config: &ForgeConfig,
        cluster: Option<&str>,
        node_label: &str,
    ) -> Option<Arc<Self>> {
        if !config.status {
            return None;
        }
        let http = match crate::notify::deliver::http_client_trusting(config.ca_file.as_deref()) {
            Ok(http) => http,
            Err(error) => {
                tracing::error!(forge = config.kind.as_str(), %error, "commit statuses disabled");
                return None;
            }
        };
        let context = config.context_for(cluster, node_label);
        let queue = Arc::new(StatusQueue::default());
        let stop = CancellationToken::new();
        let sender = Sender {
            config: config.clone(),
            context: context.clone(),
            queue: queue.clone(),
            http,
        };
        tokio::spawn(sender.run(stop.clone()));
        Some(Arc::new(Self {
            config: config.clone(),
            context,
            queue,
            memory: Mutex::new(Memory::default()),
            stop,
        }))
    }

    /// The status context this agent writes.
    pub fn context(&self) -> &str {
        &self.context
    }

    /// A pass `pass` started on `commit`: `pending` when the commit is new here.
    pub fn pass_started(&self, pass: PassId, commit: &str) {
        let mut memory = self.memory();
        if memory.pending_for.as_deref() == Some(commit) {
            return;
        }
        memory.pending_for = Some(commit.to_owned());
        drop(memory);
        self.push(
            commit,
            State::Pending,
            &format!("applying {}", short(commit)),
            pass,
        );
    }

    /// A pass ended (and is recorded in `store`): its final status, unless the same was
    /// already sent for that commit.
    pub fn pass_ended(&self, store: &SharedStore, facts: &PassFacts<'_>) {
        let Some(commit) = facts.commit else { return };
        let Some((state, description)) = final_status(store, facts) else {
            return;
        };
        let description = truncate(&description, MAX_DESCRIPTION);
        let key = (commit.to_owned(), state, description.clone());
        {
            let mut memory = self.memory();
            // The same state again says nothing new; a success stays the first one (the
            // pass that applied the commit, not the no-change passes after it).
            let same = memory.last_final.as_ref().is_some_and(|(c, s, d)| {
                c == commit && *s == state && (state == State::Success || *d == key.2)
            });
            if same {
                return;
            }
            memory.last_final = Some(key);
            memory.pending_for = Some(commit.to_owned());
        }
        self.push(commit, state, &description, facts.pass);
    }

    fn push(&self, sha: &str, state: State, description: &str, pass: PassId) {
        let status = CommitStatus {
            sha: sha.to_owned(),
            state,
            description: truncate(description, MAX_DESCRIPTION),
            target_url: self.config.pass_url(pass.0),
            queued_at: Instant::now(),
        };
        if let Some(dropped) = self.queue.push(status) {
            tracing::warn!(
                forge = self.config.kind.as_str(),
                commit = short(&dropped.sha),
                state = dropped.state.as_str(),
                "commit status dropped: the queue is full"
            );
        }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Statuses waiting (for tests and the UI).
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
}

/// The final state and description of a pass; `None` when it says nothing about its commit.
fn final_status(store: &SharedStore, facts: &PassFacts<'_>) -> Option<(State, String)> {
    match facts.outcome {
        PassOutcome::Applied => Some((
            State::Success,
            format!(
                "applied: {} action{} succeeded",
                facts.counts.actions_ok,
                plural(facts.counts.actions_ok)
            ),
        )),
        PassOutcome::NoChange => Some((State::Success, "no change: PVE matches".to_owned())),
        PassOutcome::Invalid => Some((
            State::Error,
            facts
                .first_diagnostic
                .clone()
                .or_else(|| facts.note.map(str::to_owned))
                .unwrap_or_else(|| "the revision is invalid".to_owned()),
        )),
        PassOutcome::Failed => {
            let failed = facts.counts.actions_failed;
            if failed == 0 {
                return Some((
                    State::Failure,
                    format!("failed: {}", facts.note.unwrap_or("see the pass")),
                ));
            }
            let first = store
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .actions_of(facts.pass)
                .ok()
                .and_then(|actions| {
                    actions.into_iter().find_map(|a| match a.outcome {
                        Some(ActionOutcome::Failed { error }) => {
                            Some(format!("{} {}: {error}", a.verb, a.resource))
                        }
                        _ => None,
                    })
                });
            Some((
                State::Failure,
                match first {
                    Some(first) => {
                        format!("{failed} action{} failed; first: {first}", plural(failed))
                    }
                    None => format!("{failed} action{} failed", plural(failed)),
                },
            ))
        }
        PassOutcome::Interrupted => None,
        // `[source] verify` refused it: the note is `unverified: <commit>: <why>`.
        PassOutcome::Unverified => Some((
            State::Error,
            facts
                .note
                .map_or_else(|| "unverified".to_owned(), str::to_owned),
        )),
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

/// `text` cut to `max` characters, an ellipsis marking the cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// A bounded FIFO that drops its oldest status when full.
#[derive(Debug, Default)]
struct StatusQueue {
    statuses: Mutex<VecDeque<CommitStatus>>,
    ready: Notify,
}

impl StatusQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<CommitStatus>> {
        self.statuses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn push(&self, status: CommitStatus) -> Option<CommitStatus> {
        let dropped = {
            let mut statuses = self.lock();
            let dropped = if statuses.len() >= QUEUE_CAPACITY {
                statuses.pop_front()
            } else {
                None
            };
            statuses.push_back(status);
            dropped
        };
        self.ready.notify_one();
        dropped
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    fn pop_sent(&self, sent: &CommitStatus) {
        let mut statuses = self.lock();
        if statuses.front() == Some(sent) {
            statuses.pop_front();
        }
    }

    async fn next(&self) -> CommitStatus {
        loop {
            let ready = self.ready.notified();
            if let Some(status) = self.lock().front().cloned() {
                return status;
            }
            ready.await;
        }
    }
}

struct Sender {
    config: ForgeConfig,
    context: String,
    queue: Arc<StatusQueue>,
    http: reqwest::Client,
}

struct SendError {
    retry: bool,
    text: String,
}

impl Sender {
    async fn run(self, stop: CancellationToken) {
        loop {
            let status = tokio::select! {
                () = stop.cancelled() => return,
                status = self.queue.next() => status,
            };
            self.deliver(&status, &stop).await;
            self.queue.pop_sent(&status);
        }
    }

    async fn deliver(&self, status: &CommitStatus, stop: &CancellationToken) {
        let mut backoff = Backoff::default();
        loop {
            let result = tokio::select! {
                () = stop.cancelled() => return,
                result = self.send(status) => result,
            };
            match result {
                Ok(()) => {
                    tracing::info!(
                        forge = self.config.kind.as_str(),
                        commit = short(&status.sha),
                        state = status.state.as_str(),
                        context = %self.context,
                        "commit status sent"
                    );
                    return;
                }
                Err(error) if error.retry && status.queued_at.elapsed() < MAX_AGE => {
                    let delay = backoff
                        .after(Verdict::Transient, rand::random::<f64>())
                        .unwrap_or(MIN_BACKOFF);
                    tracing::warn!(
                        forge = self.config.kind.as_str(),
                        commit = short(&status.sha),
                        state = status.state.as_str(),
                        error = %error.text,
                        retry_in = ?delay,
                        "commit status not delivered; retrying"
                    );
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                Err(error) => {
                    tracing::error!(
                        forge = self.config.kind.as_str(),
                        commit = short(&status.sha),
                        state = status.state.as_str(),
                        error = %error.text,
                        "commit status given up"
                    );
                    return;
                }
            }
        }
    }

    async fn send(&self, status: &CommitStatus) -> Result<(), SendError> {
        let url = self.config.status_url(&status.sha);
        // The token goes to api_url's host only (the URL is built from it; checked anyway).
        if url.host_str() != self.config.api_url.host_str()
            || url.port_or_known_default() != self.config.api_url.port_or_known_default()
        {
            return Err(SendError {
                retry: false,
                text: "internal: a status URL outside api_url".to_owned(),
            });
        }
        let mut body = json!({
            "state": status.state.as_str(),
            "description": status.description,
            "context": self.context,
        });
        if let Some(target) = &status.target_url {
            body["target_url"] = json!(target);
        }
        let token = self.config.token.expose_secret();
        let request = self.http.post(url).json(&body);
        let request = match self.config.kind {
            ForgeKind::GitHub => request
                .bearer_auth(token)
                .header("Accept", "application/vnd.github+json")
                .header("X-GitHub-Api-Version", "2022-11-28"),
            ForgeKind::Gitea | ForgeKind::Forgejo => {
                request.header("Authorization", format!("token {token}"))
            }
        };
        match request.send().await {
            Ok(response) if response.status().is_success() => Ok(()),
            Ok(response) => {
                let (retry, text) = refused(response.status());
                Err(SendError { retry, text })
            }
            Err(error) => Err(SendError {
                retry: true,
                text: error_text(&error.without_url()),
            }),
        }
    }
}

/// A forge's answer `code` that is not a success: whether to try again (5xx, 429, 408) and
/// what to log (a redirect is never followed: the token stays with `api_url`'s host).
pub(crate) fn refused(code: reqwest::StatusCode) -> (bool, String) {
    let retry = code.is_server_error()
        || code == reqwest::StatusCode::TOO_MANY_REQUESTS
        || code == reqwest::StatusCode::REQUEST_TIMEOUT;
    let text = if code.is_redirection() {
        format!("the forge answered HTTP {code}; redirects are not followed")
    } else {
        format!("the forge answered HTTP {code}")
    };
    (retry, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unverified_pass_is_an_error_status_naming_the_commit_and_why() {
        let store: SharedStore = std::sync::Arc::new(std::sync::Mutex::new(
            proxops_store::Store::memory().unwrap(),
        ));
        let note = "unverified: 0123456789ab: no signature";
        let facts = PassFacts {
            pass: PassId(1),
            commit: Some("0123456789abcdef0123456789abcdef01234567"),
            outcome: PassOutcome::Unverified,
            counts: PassCounts::default(),
            first_diagnostic: None,
            note: Some(note),
        };
        let (state, description) = final_status(&store, &facts).unwrap();
        assert_eq!(state, State::Error);
        assert_eq!(description, note);
    }

    #[test]
    fn a_long_description_is_cut_to_140_characters_with_an_ellipsis() {
        let long = "é".repeat(200);
        let cut = truncate(&long, MAX_DESCRIPTION);
        assert_eq!(cut.chars().count(), MAX_DESCRIPTION);
        assert!(cut.ends_with('…'));
        assert_eq!(truncate("short", MAX_DESCRIPTION), "short");
    }

    #[test]
    fn the_queue_keeps_order_and_drops_its_oldest_when_full() {
        let queue = StatusQueue::default();
        let status = |sha: &str| CommitStatus {
            sha: sha.to_owned(),
            state: State::Pending,
            description: String::new(),
            target_url: None,
            queued_at: Instant::now(),
        };
        for i in 0..QUEUE_CAPACITY {
            assert!(queue.push(status(&i.to_string())).is_none());
        }
        assert_eq!(queue.push(status("new")).unwrap().sha, "0");
        assert_eq!(queue.lock().front().unwrap().sha, "1");
        assert_eq!(queue.lock().back().unwrap().sha, "new");
    }
}
