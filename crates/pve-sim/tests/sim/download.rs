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
    let log = s
        .get(&format!("/nodes/pve1/tasks/{}/log", crate::encode(&upid)))
        .await;
    assert_eq!(
        log.data()[0]["t"],
        "OK, got correct file already, no need to download"
    );
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
