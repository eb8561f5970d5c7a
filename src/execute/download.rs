//! The download action: `POST .../download-url`, then wait for PVE's `download` task.

use std::time::Duration;

use proxops_core::plan::{Action, Download};
use proxops_pve::{
    ChecksumAlgorithm, ContentType, DownloadUrl, PveClient, TaskError, wait_for_task,
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
    let started = tokio::time::Instant::now();
    let mut delay = Duration::from_millis(500);
    let upid = loop {
        match pve
            .download_url(&action.node, &download.storage, &request)
            .await
        {
            Ok(upid) => break upid,
            // PVE refused before doing anything: safe to send again after a pause.
            Err(error) if error.is_lock_timeout() && started.elapsed() < options.lock_retry_for => {
                tracing::info!(node = %action.node, resource = %action.resource, "storage locked; retrying");
                tokio::select! {
                    () = cancel.cancelled() => return Outcome::Skipped { reason: "interrupted".into() },
                    () = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            Err(error) => {
                return Outcome::Failed {
                    class: FailureClass::of_pve(&error),
                    upid: None,
                    error: error_text(&error),
                };
            }
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
