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

use proxops_core::plan::{Action, Download};
use proxops_pve::{
    ChecksumAlgorithm, ContentType, DownloadUrl, PveClient, TaskError, Upid, wait_for_task,
};
use tokio_util::sync::CancellationToken;

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
            let volid = format!(
                "{}:{}/{}",
                download.storage, download.content, download.filename
            );
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
