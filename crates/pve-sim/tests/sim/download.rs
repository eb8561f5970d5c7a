//! download-url: real fetches from a local file server, content and extension rules,
//! checksums, refusing to overwrite.

use sha2::Digest;

use crate::{Sim, file_server, sim};

/// Puts a file on a storage through download-url (and waits for it).
pub async fn place_file(s: &Sim, storage: &str, content: &str, name: &str, bytes: Vec<u8>) {
    let path: &'static str = Box::leak(format!("/{name}").into_boxed_str());
    let base = file_server(vec![(path, bytes)]).await;
    let url = format!("{base}/{name}");
    let upid = s
        .post(
            &format!("/nodes/pve1/storage/{storage}/download-url"),
            &[("url", &url), ("filename", name), ("content", content)],
        )
        .await
        .upid();
    s.wait_ok(&upid).await;
}

async fn download(s: &Sim, url: &str, filename: &str, extra: &[(&str, &str)]) -> crate::Resp {
    let mut form = vec![("url", url), ("filename", filename), ("content", "iso")];
    form.extend_from_slice(extra);
    s.post("/nodes/pve1/storage/local/download-url", &form)
        .await
}

#[tokio::test]
async fn download_url_fetches_the_file_and_lists_it_with_size_and_ctime() {
    let s = sim().await;
    let base = file_server(vec![("/debian.iso", vec![42u8; 12345])]).await;
    let upid = download(&s, &format!("{base}/debian.iso"), "debian.iso", &[])
        .await
        .upid();
    assert!(upid.contains(":download:debian.iso:"), "{upid}");
    s.wait_ok(&upid).await;
    let r = s
        .get_q("/nodes/pve1/storage/local/content", &[("content", "iso")])
        .await;
    let vol = &r.data()[0];
    assert_eq!(vol["volid"], "local:iso/debian.iso");
    assert_eq!(vol["format"], "iso");
    assert_eq!(vol["size"], 12345);
    assert!(vol["ctime"].as_u64().unwrap() > 1_700_000_000);
}

#[tokio::test]
async fn download_url_with_the_right_checksum_succeeds() {
    let s = sim().await;
    let bytes = b"an iso image".to_vec();
    let sum = hex::encode(sha2::Sha256::digest(&bytes));
    let base = file_server(vec![("/a.iso", bytes)]).await;
    let upid = download(
        &s,
        &format!("{base}/a.iso"),
        "a.iso",
        &[("checksum", &sum), ("checksum-algorithm", "sha256")],
    )
    .await
    .upid();
    s.wait_ok(&upid).await;
}

#[tokio::test]
async fn download_url_with_wrong_checksum_fails_the_task() {
    let s = sim().await;
    let base = file_server(vec![("/a.iso", b"an iso image".to_vec())]).await;
    let wrong = "0".repeat(64);
    let upid = download(
        &s,
        &format!("{base}/a.iso"),
        "a.iso",
        &[("checksum", &wrong), ("checksum-algorithm", "sha256")],
    )
    .await
    .upid();
    let status = s.wait(&upid).await;
    let exit = status["exitstatus"].as_str().unwrap();
    assert!(exit.starts_with("checksum mismatch: got '"), "{exit}");
    assert!(exit.ends_with(&format!("' != expect '{wrong}'")), "{exit}");
    let list = s.get("/nodes/pve1/storage/local/content").await;
    assert_eq!(list.data().as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn download_url_checksum_needs_its_algorithm() {
    let s = sim().await;
    let r = download(
        &s,
        "http://127.0.0.1:9/a.iso",
        "a.iso",
        &[("checksum", "abc")],
    )
    .await;
    assert_eq!(r.status, 400);
    // The wording is the schema module's (JSONSchema.pm); only the key is checked here.
    assert!(r.error("checksum-algorithm").contains("checksum"), "{r:?}");
}

#[tokio::test]
async fn download_url_refuses_to_override_an_existing_file() {
    let s = sim().await;
    place_file(&s, "local", "iso", "a.iso", vec![1, 2, 3]).await;
    let base = file_server(vec![("/a.iso", vec![4, 5, 6])]).await;
    let upid = download(&s, &format!("{base}/a.iso"), "a.iso", &[])
        .await
        .upid();
    let status = s.wait(&upid).await;
    assert_eq!(
        status["exitstatus"],
        "refusing to override existing file '/var/lib/vz/template/iso/a.iso'"
    );
}

#[tokio::test]
async fn download_url_normalises_the_filename_and_checks_the_extension() {
    let s = sim().await;
    let base = file_server(vec![("/x", vec![1])]).await;
    let url = format!("{base}/x");
    let upid = download(&s, &url, "my disk (1).iso", &[]).await.upid();
    assert!(upid.contains(":download:my_disk__1_.iso:"), "{upid}");
    s.wait_ok(&upid).await;
    let r = download(&s, &url, "disk.qcow2", &[]).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error("filename"), "wrong file extension");
    let r = s
        .post(
            "/nodes/pve1/storage/local/download-url",
            &[
                ("url", &url),
                ("filename", "disk.img"),
                ("content", "import"),
            ],
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error("filename"), "invalid filename or wrong extension");
}

#[tokio::test]
async fn download_url_needs_a_file_storage_with_the_content_type() {
    let s = sim().await;
    let r = s
        .post(
            "/nodes/pve1/storage/local-lvm/download-url",
            &[
                ("url", "http://127.0.0.1:9/a.iso"),
                ("filename", "a.iso"),
                ("content", "iso"),
            ],
        )
        .await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.message(),
        "can't upload to storage type 'lvmthin', not a file based storage!\n"
    );
}

#[tokio::test]
async fn download_url_of_an_unreachable_url_fails_in_the_task() {
    let s = sim().await;
    let base = file_server(vec![]).await;
    let upid = download(&s, &format!("{base}/missing.iso"), "missing.iso", &[])
        .await
        .upid();
    let status = s.wait(&upid).await;
    assert_eq!(status["exitstatus"], "download failed: exit code 8");
}

#[tokio::test]
async fn download_url_with_a_matching_checksum_of_an_existing_file_succeeds_without_fetching() {
    let s = sim().await;
    let bytes = vec![9u8; 100];
    let sum = hex::encode(sha2::Sha256::digest(&bytes));
    place_file(&s, "local", "iso", "a.iso", bytes).await;
    // Nothing listens here: a fetch would fail.
    let upid = download(
        &s,
        "http://127.0.0.1:9/a.iso",
        "a.iso",
        &[("checksum", &sum), ("checksum-algorithm", "sha256")],
    )
    .await
    .upid();
    s.wait_ok(&upid).await;
    assert_eq!(
        task_log(&s, &upid).await,
        [
            "downloading http://127.0.0.1:9/a.iso to /var/lib/vz/template/iso/a.iso",
            "calculating checksum of existing file...OK, got correct file already, no need to \
             download",
            "TASK OK",
        ]
    );
}

async fn task_log(s: &Sim, upid: &str) -> Vec<String> {
    let log = s
        .get(&format!("/nodes/pve1/tasks/{}/log", crate::encode(upid)))
        .await;
    log.data()
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["t"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn the_download_log_verifies_the_checksum_before_it_says_finished_as_pve_prints_it() {
    let s = sim().await;
    let bytes = b"an iso image".to_vec();
    let sum = hex::encode(sha2::Sha256::digest(&bytes));
    let base = file_server(vec![("/a.iso", bytes)]).await;
    let url = format!("{base}/a.iso");
    let upid = download(
        &s,
        &url,
        "a.iso",
        &[("checksum", &sum), ("checksum-algorithm", "sha256")],
    )
    .await
    .upid();
    s.wait_ok(&upid).await;
    let dest = "/var/lib/vz/template/iso/a.iso";
    assert_eq!(
        task_log(&s, &upid).await,
        [
            format!("downloading {url} to {dest}"),
            "calculating checksum...OK, checksum verified".to_string(),
            format!("download of '{url}' to '{dest}' finished"),
            "TASK OK".to_string(),
        ]
    );
}

#[tokio::test]
async fn a_wrong_checksum_of_an_existing_file_fails_with_aborting_after_the_existing_file_line() {
    let s = sim().await;
    place_file(&s, "local", "iso", "a.iso", vec![7u8; 10]).await;
    let wrong = "0".repeat(64);
    let upid = download(
        &s,
        "http://127.0.0.1:9/a.iso",
        "a.iso",
        &[("checksum", &wrong), ("checksum-algorithm", "sha256")],
    )
    .await
    .upid();
    let log = {
        s.wait(&upid).await;
        task_log(&s, &upid).await
    };
    assert_eq!(log[1], "calculating checksum of existing file...");
    assert!(
        log[2].starts_with("TASK ERROR: checksum mismatch: got '"),
        "{log:?}"
    );
    assert!(
        log[2].ends_with(&format!("' != expect '{wrong}', aborting")),
        "{log:?}"
    );
}

#[tokio::test]
async fn two_overlapping_downloads_of_one_new_file_on_a_shared_storage_both_succeed() {
    // The downloads take long enough that the second starts while the first still runs.
    let mut seed = proxops_pve_sim::Seed::default();
    seed.storages.push(proxops_pve_sim::StorageSeed {
        storage: "nfs".into(),
        kind: "nfs".into(),
        content: vec!["iso".into()],
        nodes: None,
        shared: true,
        path: None,
        total: 1 << 40,
        enabled: true,
    });
    let s = crate::sim_with(proxops_pve_sim::SimConfig {
        seed,
        tls: false,
        task_duration: crate::TASK,
        task_durations: [("download".to_string(), std::time::Duration::from_secs(2))].into(),
        ..proxops_pve_sim::SimConfig::default()
    })
    .await;
    let base = file_server(vec![("/a.iso", vec![3u8; 64])]).await;
    let url = format!("{base}/a.iso");
    let form = [
        ("url", url.as_str()),
        ("filename", "a.iso"),
        ("content", "iso"),
    ];
    let first = s
        .post("/nodes/pve1/storage/nfs/download-url", &form)
        .await
        .upid();
    let second = s
        .post("/nodes/pve2/storage/nfs/download-url", &form)
        .await
        .upid();
    let running = s
        .get(&format!(
            "/nodes/pve1/tasks/{}/status",
            crate::encode(&first)
        ))
        .await;
    assert_eq!(
        running.data()["status"],
        "running",
        "the first download is still running"
    );
    let first_status = s.wait(&first).await;
    assert_eq!(first_status["exitstatus"], "OK", "{first_status}");
    let second_status = {
        let mut waited = None;
        for _ in 0..1000 {
            let r = s
                .get(&format!(
                    "/nodes/pve2/tasks/{}/status",
                    crate::encode(&second)
                ))
                .await;
            if r.data()["status"] == "stopped" {
                waited = Some(r.data().clone());
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        waited.expect("the second download stops")
    };
    assert_eq!(second_status["exitstatus"], "OK", "{second_status}");
    // A later, sequential download of the now existing file is refused.
    let third = s
        .post("/nodes/pve3/storage/nfs/download-url", &form)
        .await
        .upid();
    let mut exit = serde_json::Value::Null;
    for _ in 0..1000 {
        let r = s
            .get(&format!(
                "/nodes/pve3/tasks/{}/status",
                crate::encode(&third)
            ))
            .await;
        if r.data()["status"] == "stopped" {
            exit = r.data()["exitstatus"].clone();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        exit,
        "refusing to override existing file '/mnt/pve/nfs/template/iso/a.iso'"
    );
}

#[tokio::test]
async fn compression_is_checked_in_the_task_not_by_the_schema() {
    let s = sim().await;
    let base = file_server(vec![("/a.tar.gz", vec![1u8; 8])]).await;
    let url = format!("{base}/a.tar.gz");
    let r = s
        .post(
            "/nodes/pve1/storage/local/download-url",
            &[
                ("url", &url),
                ("filename", "a.tar.gz"),
                ("content", "vztmpl"),
                ("compression", "gz"),
            ],
        )
        .await;
    let status = s.wait(&r.upid()).await;
    assert_eq!(
        status["exitstatus"],
        "decompression not supported for vztmpl"
    );
    let r = s
        .post(
            "/nodes/pve1/storage/local/download-url",
            &[
                ("url", &url),
                ("filename", "a.iso"),
                ("content", "iso"),
                ("compression", "rar"),
            ],
        )
        .await;
    let status = s.wait(&r.upid()).await;
    assert_eq!(status["exitstatus"], "no decompression method found");
}

#[tokio::test]
async fn download_url_of_import_images_lands_in_import() {
    let s = sim().await;
    place_file(&s, "local", "import", "debian.qcow2", vec![1; 10]).await;
    let r = s
        .get_q(
            "/nodes/pve1/storage/local/content",
            &[("content", "import")],
        )
        .await;
    assert_eq!(r.data()[0]["volid"], "local:import/debian.qcow2");
    assert_eq!(r.data()[0]["format"], "qcow2");
}
