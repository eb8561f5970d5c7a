//! The download action: `POST .../download-url`, then wait for PVE's `download` task.
//!
//! A refusal fails the action; nothing is resent. download-url takes no lock at all
//! (pve-storage 0c56bad `src/PVE/API2/Storage/Status.pm` `download_url` forks its worker
//! without `lock_storage`/`cluster_lock_storage`), so it never answers `can't lock file`
//! and there is no lock to wait for (SOURCE-AUDIT M19; GAPS 8 assumed one).
//!
//! When the answer is lost (a 596, a timeout: [`proxops_pve::PveError::is_unknown_outcome`])
//! the executor asks PVE: the `download` task this token started for the file since the
//! action began (its id is the file name), else the storage's listing (the file is there:
//! PVE downloaded it); when PVE shows neither the action fails as `unknown`.
//!
//! Since download-url locks nothing, two nodes' agents downloading the same new file to a
//! storage PVE reports as `shared` would race (the second worker fails with `refusing to
//! override existing file`, or both fetch it). With `[pmxcfs]` the download runs under the
//! cluster-wide lock `proxops-download-<storage>-<hash of the volid>`
//! ([`crate::cluster::lock`]): the holder looks at the storage again and downloads only if
//! the file is still absent; the others wait for the lock, then find the file and record it
//! present without a request. Without quorum no lock can be taken: the storage is looked at
//! again and the download goes on without the lock (issue 22; GAPS 163).

use proxops_core::plan::{Action, Download};
use proxops_pve::{
    ChecksumAlgorithm, ContentType, DownloadUrl, PveClient, TaskError, Upid, wait_for_task,
};
use sha2::Digest as _;
use tokio_util::sync::CancellationToken;

use crate::cluster::lock::{Acquire, ClusterLock, LockError};
use crate::error_chain::error_text;
use crate::execute::{Event, FailureClass, Options, Outcome, Progress};

pub(super) async fn run(
    pve: &PveClient,
    action: &Action,
    download: &Download,
    options: &Options,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Outcome {
    let request = match request(download) {
        Ok(request) => request,
        Err(error) => {
            return Outcome::Failed {
                class: FailureClass::Refused,
                upid: None,
                error,
            };
        }
    };
    // Held until the download task ends (dropped on return).
    let _lock = match shared_download_lock(pve, action, download, options, cancel).await {
        Ok(lock) => lock,
        Err(outcome) => return outcome,
    };
    let started = super::guest::now();
    let upid = match pve
        .download_url(&action.node, &download.storage, &request)
        .await
    {
        Ok(upid) => upid,
        Err(error) if error.is_unknown_outcome() => {
            match find_out(pve, action, download, &error, started).await {
                Found::Task(upid) => upid,
                Found::File => {
                    return Outcome::Succeeded {
                        upid: None,
                        exitstatus: "OK".to_owned(),
                    };
                }
                Found::Nothing(error) => {
                    return Outcome::Failed {
                        class: FailureClass::Unknown,
                        upid: None,
                        error,
                    };
                }
            }
        }
        Err(error) => {
            return Outcome::Failed {
                class: FailureClass::of_pve(&error),
                upid: None,
                error: error_text(&error),
            };
        }
    };
    progress(&Event::TaskStarted {
        action: action.clone(),
        upid: upid.clone(),
    });
    match wait_for_task(pve, &upid, &options.wait, cancel).await {
        Ok(status) => Outcome::Succeeded {
            upid: Some(upid),
            exitstatus: status.exitstatus.unwrap_or_else(|| "OK".to_owned()),
        },
        Err(error) => {
            let class = FailureClass::of_task(&error);
            let error = match error {
                TaskError::Failed { exitstatus, .. } => exitstatus,
                other => error_text(&other),
            };
            Outcome::Failed {
                class,
                upid: Some(upid),
                error,
            }
        }
    }
}

/// The cluster-wide lock for a download to a shared storage (see the module doc): `Ok(None)`
/// when there is none to take (no `[pmxcfs]`, not shared, no quorum), `Ok(Some)` when held
/// and the file is still absent, `Err` with the outcome to record otherwise (the file is
/// there now: succeeded without a request; the lock could not be had: failed, `lock`).
async fn shared_download_lock(
    pve: &PveClient,
    action: &Action,
    download: &Download,
    options: &Options,
    cancel: &CancellationToken,
) -> Result<Option<ClusterLock>, Outcome> {
    let Some(lock_dir) = &options.cluster_lock_dir else {
        return Ok(None);
    };
    let shared = match pve.storages(&action.node).await {
        Ok(storages) => storages
            .iter()
            .any(|s| s.storage == download.storage && s.shared == Some(true)),
        Err(error) => {
            return Err(Outcome::Failed {
                class: FailureClass::of_pve(&error),
                upid: None,
                error: format!(
                    "asking PVE whether storage {} is shared: {}",
                    download.storage,
                    error_text(&error)
                ),
            });
        }
    };
    if !shared {
        return Ok(None);
    }
    let volid = volid(download);
    let name = format!(
        "download-{}-{}",
        download.storage,
        &hex::encode(sha2::Sha256::digest(volid.as_bytes()))[..16]
    );
    let how = Acquire {
        // Another node's download of the same file may take as long as a task may.
        wait: options.wait.timeout,
        ..Acquire::default()
    };
    let lock = match ClusterLock::acquire(lock_dir, &name, how, cancel).await {
        Ok(lock) => Some(lock),
        Err(error @ LockError::NoQuorum(..)) => {
            tracing::warn!(
                resource = %action.resource,
                error = %error_text(&error),
                "no quorum: downloading to the shared storage without the cluster lock, after looking at it again"
            );
            None
        }
        Err(error) => {
            return Err(Outcome::Failed {
                class: FailureClass::Lock,
                upid: None,
                error: error_text(&error),
            });
        }
    };
    let content = download.content.parse::<ContentType>().ok();
    match pve
        .storage_content(&action.node, &download.storage, content)
        .await
    {
        Ok(items) if items.iter().any(|item| item.volid == volid) => {
            tracing::info!(resource = %action.resource, %volid, "another node downloaded the file to the shared storage; recorded present");
            Err(Outcome::Succeeded {
                upid: None,
                exitstatus: format!(
                    "OK: {volid} is present (another node downloaded it to the shared storage)"
                ),
            })
        }
        Ok(_) => Ok(lock),
        Err(error) => Err(Outcome::Failed {
            class: FailureClass::of_pve(&error),
            upid: None,
            error: format!(
                "listing storage {} again before the download: {}",
                download.storage,
                error_text(&error)
            ),
        }),
    }
}

fn volid(download: &Download) -> String {
    format!(
        "{}:{}/{}",
        download.storage, download.content, download.filename
    )
}

/// What PVE shows of a download whose answer was lost.
enum Found {
    /// The `download` task the POST started.
    Task(Upid),
    /// No task, but the file is on the storage.
    File,
    /// Neither; the error to record.
    Nothing(String),
}

async fn find_out(
    pve: &PveClient,
    action: &Action,
    download: &Download,
    error: &proxops_pve::PveError,
    started: u64,
) -> Found {
    tracing::warn!(
        node = %action.node,
        resource = %action.resource,
        error = %error_text(error),
        "the answer to a download was lost; asking PVE what it did"
    );
    let lost = |what: String| {
        Found::Nothing(format!(
            "{}: the answer was lost, so the download was not sent again; {what}; the next pass observes what PVE did",
            error_text(error)
        ))
    };
    match super::guest::find_our_task(
        pve,
        &action.node,
        "download",
        &download.filename,
        None,
        started,
    )
    .await
    {
        Ok(Some(upid)) => return Found::Task(upid),
        Ok(None) => {}
        Err(e) => {
            return lost(format!(
                "listing PVE's tasks failed too ({})",
                error_text(&e)
            ));
        }
    }
    let content = download.content.parse::<ContentType>().ok();
    match pve
        .storage_content(&action.node, &download.storage, content)
        .await
    {
        Ok(items) => {
            let volid = volid(download);
            if items.iter().any(|item| item.volid == volid) {
                Found::File
            } else {
                lost(format!(
                    "PVE lists no download task for {} by this token since the action began, and {volid} is not on the storage",
                    download.filename
                ))
            }
        }
        Err(e) => lost(format!(
            "listing the storage failed too ({})",
            error_text(&e)
        )),
    }
}

fn request(download: &Download) -> Result<DownloadUrl, String> {
    let content: ContentType = download
        .content
        .parse()
        .map_err(|_| format!("unknown content type {}", download.content))?;
    let mut request = DownloadUrl::new(content, download.url.clone(), download.filename.clone());
    if let Some(checksum) = &download.checksum {
        let algorithm = match checksum.algorithm.as_str() {
            "md5" => ChecksumAlgorithm::Md5,
            "sha1" => ChecksumAlgorithm::Sha1,
            "sha224" => ChecksumAlgorithm::Sha224,
            "sha256" => ChecksumAlgorithm::Sha256,
            "sha384" => ChecksumAlgorithm::Sha384,
            "sha512" => ChecksumAlgorithm::Sha512,
            other => return Err(format!("unknown checksum algorithm {other}")),
        };
        request = request.with_checksum(algorithm, checksum.value.clone());
    }
    Ok(request)
}
