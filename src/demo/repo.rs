//! The demo's manifest repository: the files of `examples/` (compiled into the binary, so the
//! demo needs no checkout), their artifact URLs rewritten to the demo's own file server, a
//! generated stand-in for every artifact, and a git repository made with the `git` binary in an
//! isolated environment (no system or global config, a fixed author and date).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;

/// The files of `examples/`, by path relative to it. A unit test keeps this list equal to
/// the folder.
pub(crate) const EXAMPLES: &[(&str, &str)] = &[
    (
        "clusters/homelab/resources.yaml",
        include_str!("../../examples/clusters/homelab/resources.yaml"),
    ),
    (
        "ctt/base/debian-12-standard.yaml",
        include_str!("../../examples/ctt/base/debian-12-standard.yaml"),
    ),
    (
        "diskimage/base/debian-12-genericcloud.yaml",
        include_str!("../../examples/diskimage/base/debian-12-genericcloud.yaml"),
    ),
    (
        "iso/base/debian-netinst.yaml",
        include_str!("../../examples/iso/base/debian-netinst.yaml"),
    ),
    (
        "lxc/homelab/dns-1.yaml",
        include_str!("../../examples/lxc/homelab/dns-1.yaml"),
    ),
    (
        "templatevm/homelab/debian-12-template.yaml",
        include_str!("../../examples/templatevm/homelab/debian-12-template.yaml"),
    ),
    (
        "vm/homelab/app-1.yaml",
        include_str!("../../examples/vm/homelab/app-1.yaml"),
    ),
    (
        "vm/homelab/installer.yaml",
        include_str!("../../examples/vm/homelab/installer.yaml"),
    ),
    (
        "vm/homelab/web-1.yaml",
        include_str!("../../examples/vm/homelab/web-1.yaml"),
    ),
];

/// The example files with every `url:` of an artifact pointing at `base` (`http://host:port`),
/// and the file names the server must serve (the last path segment of each original URL).
pub(crate) fn rewritten(base: &str) -> (BTreeMap<String, String>, Vec<String>) {
    let mut served = Vec::new();
    let files = EXAMPLES
        .iter()
        .map(|(path, text)| {
            let mut out = String::with_capacity(text.len());
            for line in text.split_inclusive('\n') {
                let body = line.trim_end_matches('\n');
                let indent = body.len() - body.trim_start().len();
                match body.trim_start().strip_prefix("url: ") {
                    Some(url) => {
                        let name = url.trim().rsplit('/').next().unwrap_or_default().to_owned();
                        out.push_str(&body[..indent]);
                        out.push_str(&format!("url: {base}/{name}"));
                        out.push_str(&line[body.len()..]);
                        served.push(name);
                    }
                    None => out.push_str(line),
                }
            }
            ((*path).to_owned(), out)
        })
        .collect();
    served.sort();
    served.dedup();
    (files, served)
}

/// The generated content served for `name`: a few KiB of text that says what it is.
pub(crate) fn stand_in(name: &str) -> Vec<u8> {
    let line = format!("ProxOps demo stand-in for {name}; not a real image.\n");
    line.repeat(64).into_bytes()
}

/// Writes `files` into `dir`, makes it a git repository on `main` and commits them; returns
/// the commit id.
///
/// # Errors
/// When a file cannot be written or `git` fails (or is not installed).
pub(crate) async fn create(dir: &Path, files: &BTreeMap<String, String>) -> anyhow::Result<String> {
    for (path, text) in files {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    }
    git(dir, &["init", "--quiet", "-b", "main"]).await?;
    git(dir, &["add", "--all"]).await?;
    git(
        dir,
        &[
            "commit",
            "--quiet",
            "-m",
            "examples/ for the ProxOps demo (artifact URLs point at the demo's file server)",
        ],
    )
    .await?;
    git(dir, &["rev-parse", "HEAD"]).await
}

/// Runs `git args` in `dir` with no system or global config and a fixed identity and date;
/// returns its trimmed stdout.
async fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    const WHO: &str = "ProxOps Demo";
    const EMAIL: &str = "demo@proxops.invalid";
    const WHEN: &str = "2026-01-01T00:00:00Z";
    let output = tokio::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", WHO)
        .env("GIT_AUTHOR_EMAIL", EMAIL)
        .env("GIT_AUTHOR_DATE", WHEN)
        .env("GIT_COMMITTER_NAME", WHO)
        .env("GIT_COMMITTER_EMAIL", EMAIL)
        .env("GIT_COMMITTER_DATE", WHEN)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("running `git` (the demo needs git installed)")?;
    if !output.status.success() {
        anyhow::bail!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_examples_are_the_examples_folder() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let mut on_disk = Vec::new();
        for entry in walkdir::WalkDir::new(&root) {
            let entry = entry.expect("examples/ is readable");
            if entry.file_type().is_file() {
                let rel = entry
                    .path()
                    .strip_prefix(&root)
                    .expect("below examples/")
                    .to_string_lossy()
                    .replace('\\', "/");
                let text = std::fs::read_to_string(entry.path()).expect("a text file");
                on_disk.push((rel, text));
            }
        }
        on_disk.sort();
        let embedded: Vec<(String, String)> = EXAMPLES
            .iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect();
        assert_eq!(
            embedded, on_disk,
            "src/demo/repo.rs EXAMPLES must list every file of examples/"
        );
    }

    #[test]
    fn every_artifact_url_points_at_the_local_server() {
        let (files, served) = rewritten("http://127.0.0.1:1");
        assert_eq!(
            served,
            [
                "debian-12-genericcloud-amd64.qcow2",
                "debian-12-standard_12.12-1_amd64.tar.zst",
                "debian-13.2.0-amd64-netinst.iso",
            ]
        );
        let iso = &files["iso/base/debian-netinst.yaml"];
        assert!(iso.contains("\n  url: http://127.0.0.1:1/debian-13.2.0-amd64-netinst.iso\n"));
        assert!(files.values().all(|t| !t.contains("https://")));
        let loaded = proxops_core::repository::load(&files);
        assert!(!loaded.has_errors(), "{:?}", loaded.diagnostics);
    }
}
