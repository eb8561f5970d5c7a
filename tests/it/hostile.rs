//! Hostile manifest files through the built `proxops validate` (issue 8, hostile input): YAML
//! bombs (alias expansion of collections and of long scalars, deep nesting), a 200 MiB file and
//! a 7 MiB scalar are refused or read with a clear error, and the process's peak RSS stays
//! bounded. The peak is read with `/usr/bin/time -f %M` (the kernel's `ru_maxrss` of the child)
//! and written to stderr for RELIABILITY.md.

use crate::support::agent::recorded_diagnostics;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::stderr;

/// What every hostile file must stay under; an idle `proxops validate` peaks near 10 MiB.
const RSS_BOUND_KIB: u64 = 128 * 1024;

/// `proxops validate <dir>` with its peak RSS in KiB (when `/usr/bin/time` is present).
fn validate_measured(dir: &Path) -> (Output, Option<u64>, Duration) {
    let time = Path::new("/usr/bin/time");
    let start = Instant::now();
    let mut command = if time.exists() {
        let mut c = Command::new(time);
        c.args([
            "-f",
            "proxops-peak-rss-kib=%M",
            env!("CARGO_BIN_EXE_proxops"),
        ]);
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_proxops"))
    };
    let output = command
        .arg("validate")
        .arg(dir)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let elapsed = start.elapsed();
    let peak = stderr(&output)
        .lines()
        .find_map(|l| l.strip_prefix("proxops-peak-rss-kib="))
        .map(|kib| kib.trim().parse().unwrap());
    (output, peak, elapsed)
}

#[allow(clippy::print_stderr, reason = "the figures RELIABILITY.md reports")]
pub(crate) fn report(case: &str, peak: Option<u64>, elapsed: Duration) {
    match peak {
        Some(kib) => eprintln!(
            "hostile input: {case}: peak RSS {:.1} MiB, {elapsed:.2?}",
            kib as f64 / 1024.0
        ),
        None => eprintln!("hostile input: {case}: {elapsed:.2?} (no /usr/bin/time)"),
    }
}

/// Writes `files` into a fresh repository, validates it, and checks the refusal and the peak.
pub(crate) fn assert_refused(case: &str, files: &[(&str, &str)], expected: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    assert_refused_in(case, dir.path(), expected);
}

pub(crate) fn assert_refused_in(case: &str, dir: &Path, expected: &[&str]) {
    let (output, peak, elapsed) = validate_measured(dir);
    report(case, peak, elapsed);
    let err = stderr(&output);
    assert!(!output.status.success(), "{case}: accepted\n{err}");
    for text in expected {
        assert!(err.contains(text), "{case}: expected {text:?} in\n{err}");
    }
    assert!(!err.contains("panicked"), "{case}: {err}");
    if let Some(kib) = peak {
        assert!(kib < RSS_BOUND_KIB, "{case}: peak RSS {kib} KiB");
    }
    assert!(
        elapsed < Duration::from_secs(30),
        "{case}: took {elapsed:?}"
    );
}

#[test]
fn a_billion_laughs_manifest_is_refused_in_bounded_memory() {
    let mut yaml = String::from(
        "a: &a [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n",
    );
    for (name, prev) in ('b'..='i').zip('a'..='h') {
        let refs = vec![format!("*{prev}"); 9].join(", ");
        yaml.push_str(&format!("{name}: &{name} [{refs}]\n"));
    }
    assert_refused(
        "billion laughs (9 levels x 9 aliases)",
        &[("bomb.yaml", &yaml)],
        &[
            "bomb.yaml:",
            "document too large: more than 20000 YAML nodes after expanding aliases",
        ],
    );
}

#[test]
fn aliases_of_a_long_scalar_are_refused_in_bounded_memory() {
    // Under the node budget, but 19,990 copies of a 1 MiB string would be 20 GB.
    let mut yaml = format!("a: &a \"{}\"\nb: [", "x".repeat(1024 * 1024));
    yaml.push_str(&"*a, ".repeat(19_990));
    yaml.push_str("*a]\n");
    assert_refused(
        "19,991 aliases of a 1 MiB scalar",
        &[("bomb.yaml", &yaml)],
        &[
            "bomb.yaml:2:",
            "document too large: more than 16 MiB of text after expanding aliases",
        ],
    );
}

#[test]
fn deeply_nested_manifests_are_refused_in_bounded_memory() {
    let flow = "[".repeat(1_000_000);
    assert_refused(
        "1,000,000 nested flow sequences",
        &[("deep.yaml", &flow)],
        &["deep.yaml:1:"],
    );
    let block: String = (0..2_000)
        .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
        .collect();
    assert_refused(
        "2,000 nested block mappings",
        &[("deep.yaml", &block)],
        &["deep.yaml:", "nesting deeper than 32 levels"],
    );
}

#[test]
fn a_200_mib_manifest_file_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let file = std::fs::File::create(dir.path().join("huge.yaml")).unwrap();
    // A sparse file: refusing it must not depend on reading it.
    file.set_len(200 * 1024 * 1024).unwrap();
    assert_refused_in(
        "200 MiB file",
        dir.path(),
        &["huge.yaml is 209715200 bytes, more than the 8 MiB a manifest file may hold"],
    );
}

#[test]
fn a_7_mib_scalar_is_read_and_reported_in_bounded_memory() {
    let name = "x".repeat(7 * 1024 * 1024);
    let yaml = format!(
        "apiVersion: proxops/v1alpha1\nkind: ISO\nmetadata:\n  name: {name}\nspec:\n  nodes: [pve1]\n  storage: local\n  filename: a.iso\n  url: https://example.org/a.iso\n"
    );
    assert_refused(
        "a 7 MiB metadata.name",
        &[("long.yaml", &yaml)],
        &["long.yaml:4:9: error: metadata.name:"],
    );
}

/// A push to `main` naming `after`, so each delivery differs (identical ones are replays).
pub(crate) fn push_naming(after: &str) -> String {
    format!(r#"{{"ref":"refs/heads/main","after":"{after}","commits":[]}}"#)
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_commits_are_refused_by_the_running_agent_which_keeps_the_last_good_revision() {
    use crate::one_iso::{Setup, TrustLine};

    let setup = Setup::start("hostile-token-secret", "hostile-webhook-secret").await;
    let agent = setup.spawn("hostile", &TrustLine::Pin, "info");
    agent
        .wait_for(|s| s["last_applied"]["commit"].as_str() == Some(setup.commit.as_str()))
        .await;
    let deliver = |after: String| {
        let body = push_naming(&after);
        let signature = agent.github_signature(body.as_bytes());
        agent
            .http
            .post(agent.url("/hooks/github"))
            .header("X-GitHub-Event", "push")
            .header("X-Hub-Signature-256", signature)
            .body(body)
            .send()
    };

    // A billion-laughs manifest: the revision is invalid, with the located diagnostic.
    let start = Instant::now();
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
    for (name, prev) in ('b'..='i').zip('a'..='h') {
        bomb.push_str(&format!(
            "{name}: &{name} [{}]\n",
            vec![format!("*{prev}"); 9].join(", ")
        ));
    }
    let invalid = setup.repo.commit_files(&[("iso/bomb.yaml", &bomb)], "bomb");
    assert_eq!(deliver(invalid.clone()).await.unwrap().status(), 202);
    let status = agent
        .wait_for(|s| {
            // The pass on it must have ended: a running one is listed with no outcome yet.
            s["last_attempted"]["commit"].as_str() == Some(invalid.as_str())
                && s["last_attempted"]["outcome"].is_string()
        })
        .await;
    assert_eq!(status["last_attempted"]["outcome"], "invalid", "{status}");
    assert_eq!(
        status["last_applied"]["commit"].as_str(),
        Some(setup.commit.as_str())
    );
    // The located diagnostic is recorded with the pass (the API shows only the outcome).
    let diagnostics = recorded_diagnostics(&setup.state_dir("hostile"), &invalid);
    assert!(
        diagnostics.contains("iso/bomb.yaml")
            && diagnostics.contains("document too large: more than 20000 YAML nodes"),
        "{diagnostics}"
    );

    // A 9 MiB manifest: refused from its size, before it is read; the last good revision stays.
    setup.repo.remove("iso/bomb.yaml");
    setup
        .repo
        .write("iso/huge.yaml", vec![b'#'; 9 * 1024 * 1024]);
    let huge = setup.repo.commit("huge");
    setup.repo.push();
    assert_eq!(deliver(huge).await.unwrap().status(), 202);
    let limit = "iso/huge.yaml in commit";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !agent.log_text().contains(limit) {
        assert!(Instant::now() < deadline, "{}", agent.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let line = agent
        .log_text()
        .lines()
        .find(|l| l.contains(limit))
        .unwrap()
        .to_owned();
    assert!(
        line.contains("is 9437184 bytes, more than the 8 MiB a manifest file may hold"),
        "{line}"
    );
    let status = agent.wait_for(|s| s["last_attempted"].is_object()).await;
    assert_eq!(
        status["last_applied"]["commit"].as_str(),
        Some(setup.commit.as_str())
    );
    let (code, _) = agent.get_text("/healthz").await;
    assert_eq!(code, 200);
    let peak = agent.peak_rss_kib();
    assert!(peak < 256 * 1024, "agent peak RSS {peak} KiB");
    report(
        "the agent after a bomb commit and a 9 MiB commit",
        Some(peak),
        start.elapsed(),
    );
}
