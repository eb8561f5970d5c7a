//! The web UI in a real browser: the built agent against the simulator and a real git server
//! (git daemon), passes with drift (one corrected, one reported, one resolved), a plan
//! pending out of band, then a commit with a typo; Debian's chromium, headless, takes
//! screenshots (1280×800 and a 390 px phone, light and dark) into
//! `<target>/ui-screenshots/` and dumps each page's DOM, which the test reads.
//!
//! Without chromium the test skips with a message, unless `CI` is set: then it fails
//! (`.ci/run` installs chromium).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::agent::{commit_of, start_agent};
use crate::git_server::TestRepo;
use crate::pve_api::Api;
use crate::sim::{World, artifact};
use crate::support::agent::AgentProcess;

const ISO: &[u8] = b"installer bytes";

/// The browser, or `None` (skip) when it is absent and this is not CI.
#[allow(
    clippy::print_stderr,
    reason = "the one line saying the browser test was skipped"
)]
pub(crate) fn chromium() -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser"] {
        let found = Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if found {
            return Some(PathBuf::from(name));
        }
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set and chromium is missing: .ci/run installs it with `apt-get install -y chromium`"
    );
    eprintln!(
        "SKIPPED: chromium is not installed (apt-get install -y chromium); the web UI was not \
         tested in a browser"
    );
    None
}

/// Where screenshots go: `$CARGO_TARGET_DIR/ui-screenshots` or `target/ui-screenshots`.
fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::support::repo_root().join("target"));
    let dir = target.join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs headless chromium with `args` on `url`; its stdout. Fails after a minute.
async fn run_chromium(browser: &Path, profile: &Path, args: &[&str], url: &str) -> String {
    let child = tokio::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--hide-scrollbars",
            &format!("--user-data-dir={}", profile.display()),
        ])
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("chromium did not finish within a minute on {url}"))
        .unwrap();
    assert!(
        output.status.success(),
        "chromium failed on {url}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The page's DOM after load, as chromium serialises it (also kept as `<name>.html` beside
/// the screenshots).
pub(crate) async fn dump_dom(browser: &Path, profile: &Path, url: &str, name: &str) -> String {
    let dom = run_chromium(browser, profile, &["--dump-dom"], url).await;
    std::fs::write(screenshot_dir().join(format!("{name}.html")), &dom).unwrap();
    dom
}

/// Screenshots of `url` at desktop and phone width (and dark, when asked) as
/// `<name>-desktop.png`, `<name>-phone.png`, `<name>-dark.png`.
pub(crate) async fn screenshots(browser: &Path, profile: &Path, url: &str, name: &str, dark: bool) {
    let dir = screenshot_dir();
    let mut shots = vec![
        (format!("{name}-desktop.png"), "1280,800", false),
        (format!("{name}-phone.png"), "390,844", false),
    ];
    if dark {
        shots.push((format!("{name}-dark.png"), "1280,800", true));
    }
    for (file, size, dark) in shots {
        let path = dir.join(&file);
        let _ = std::fs::remove_file(&path);
        let mut args = vec![
            format!("--screenshot={}", path.display()),
            format!("--window-size={size}"),
        ];
        if dark {
            args.push("--force-dark-mode".to_owned());
            args.push("--blink-settings=preferredColorScheme=0".to_owned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_chromium(browser, profile, &args, url).await;
        let png = std::fs::read(&path).unwrap_or_default();
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 5_000,
            "{file}: no screenshot"
        );
    }
}

fn vm(name: &str, vmid: u32, extra_annotations: &str, hardware: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: {name}\n{extra_annotations}spec:\n  \
         node: pve1\n  vmid: {vmid}\n  state: stopped\n  memory: 512MiB\n  cpu: {{type: host, cores: 1}}\n  \
         disks: [{{storage: local-lvm, size: 1GiB}}]\n  networks: [{{bridge: vmbr0}}]\n{hardware}"
    )
}

/// Runs one pass now (SIGHUP) and waits until it is recorded.
async fn one_pass(agent: &AgentProcess) -> serde_json::Value {
    let before = agent.get("/api/v1/status").await["last_attempted"]["id"]
        .as_i64()
        .unwrap_or(0);
    agent.hup();
    agent
        .wait_for(|s| {
            s["last_attempted"]["id"].as_i64().unwrap_or(0) > before
                && s["last_attempted"]["outcome"].is_string()
        })
        .await
}

/// `/api/v1/drift` until `done` holds.
async fn drift_until(agent: &AgentProcess, done: impl Fn(&serde_json::Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let drift = agent.get("/api/v1/drift").await;
        if done(&drift) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "drift never as expected: {drift}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn findings_of<'a>(
    drift: &'a serde_json::Value,
    list: &str,
    resource: &str,
) -> Vec<&'a serde_json::Value> {
    drift[list]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["resource"] == resource)
        .collect()
}

impl Api {
    async fn delete(&self, path: &str) -> serde_json::Value {
        self.call(reqwest::Method::DELETE, path, &[]).await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_web_ui_shows_passes_drift_the_next_plan_and_an_invalid_head_in_a_real_browser() {
    let Some(browser) = chromium() else {
        return;
    };
    let world = World::start(&[("a.iso", ISO)]).await;
    let api = Api::new(&world);
    let repo = TestRepo::new();
    let iso = artifact(
        "ISO",
        "installer",
        &["pve1"],
        "a.iso",
        &format!("{}/a.iso", world.files_url),
        None,
    );
    let report = "  annotations:\n    proxops/drift: report\n";
    let cdrom = "  hardware:\n    cdrom:\n      iso: installer\n";
    let good = repo.commit_files(
        &[
            ("iso/installer.yaml", &iso),
            ("vm/web-1.yaml", &vm("web-1", 101, report, "")),
            ("vm/db-1.yaml", &vm("db-1", 102, "", "")),
            ("vm/cache-1.yaml", &vm("cache-1", 103, "", cdrom)),
        ],
        "an ISO and three VMs",
    );
    let (agent, _daemon) = start_agent(&world, &repo, |t| {
        t.poll("1h")
            .policy("prune = true")
            .http("commit_url = \"https://forge.example.org/ops/infra/commit/{sha}\"")
    })
    .await;
    agent
        .wait_for(|s| commit_of(s, "last_applied").as_deref() == Some(good.as_str()))
        .await;

    // Drift: db-1 is corrected by the next pass; web-1 (report only) is found, put back by
    // hand (resolved), then changed again (stays open).
    api.put("/nodes/pve1/qemu/102/config", &[("memory", "1024")])
        .await;
    api.put("/nodes/pve1/qemu/101/config", &[("memory", "1024")])
        .await;
    one_pass(&agent).await;
    drift_until(&agent, |d| !findings_of(d, "open", "VM/web-1").is_empty()).await;
    assert_eq!(api.config("pve1", "qemu", 102).await["memory"], "512");
    api.put("/nodes/pve1/qemu/101/config", &[("memory", "512")])
        .await;
    one_pass(&agent).await;
    drift_until(&agent, |d| {
        !findings_of(d, "resolved", "VM/web-1").is_empty()
    })
    .await;
    api.put("/nodes/pve1/qemu/101/config", &[("cores", "2")])
        .await;
    one_pass(&agent).await;
    drift_until(&agent, |d| !findings_of(d, "open", "VM/web-1").is_empty()).await;

    // Out of band, with no pass to follow: the ISO and cache-1 deleted, db-1's memory
    // changed, a guest with the ownership tag created. The preview must plan all four and
    // write nothing.
    api.delete("/nodes/pve1/qemu/103").await;
    api.delete("/nodes/pve1/storage/local/content/local:iso/a.iso")
        .await;
    api.put("/nodes/pve1/qemu/102/config", &[("memory", "2048")])
        .await;
    api.post_and_wait(
        "pve1",
        "/nodes/pve1/qemu",
        &[
            ("vmid", "150"),
            ("name", "leftover"),
            ("tags", "proxops"),
            ("memory", "512"),
        ],
    )
    .await;
    world.sim.control().clear_requests();

    let profile = tempfile::tempdir().unwrap();
    let plan_dom = dump_dom(&browser, profile.path(), &agent.url("/ui/plan"), "plan").await;
    assert!(
        world.writes().is_empty(),
        "the plan preview wrote to PVE: {:?}",
        world.writes()
    );
    assert!(
        world.requests().iter().any(|r| r.method == "GET"),
        "the preview read PVE"
    );
    for line in [
        "+ download ISO/installer on pve1",
        "+ create VM/cache-1 on pve1 (vmid 103)",
        "~ update VM/db-1 on pve1: memory: 2048 → 512",
        "- delete VM/leftover on pve1 (vmid 150)",
    ] {
        assert!(
            plan_dom.contains(line),
            "the plan preview lacks `{line}`:\n{plan_dom}"
        );
    }
    let action_lines = plan_dom
        .lines()
        .filter(|l| {
            [
                "<span class=\"add\">",
                "<span class=\"change\">",
                "<span class=\"del\">",
            ]
            .iter()
            .any(|m| l.contains(m))
        })
        .filter(|l| !l.contains("      "))
        .count();
    let boxes = plan_dom.matches("<g class=\"plan-node").count();
    // The four above, and the shutdown that precedes the delete.
    assert_eq!(action_lines, 5, "{plan_dom}");
    assert_eq!(
        boxes, action_lines,
        "one SVG box per planned action:\n{plan_dom}"
    );
    assert!(
        plan_dom.contains("<h2>Dependency levels (5 actions)</h2>"),
        "{plan_dom}"
    );
    assert!(
        // Boxes in reading order: the download (0), db-1's update (1), cache-1's create (2).
        plan_dom.contains("data-from=\"0\" data-to=\"2\""),
        "the ISO's download leads to cache-1's creation:\n{plan_dom}"
    );
    screenshots(
        &browser,
        profile.path(),
        &agent.url("/ui/plan"),
        "plan",
        true,
    )
    .await;
    assert!(
        world.writes().is_empty(),
        "screenshots of the preview wrote: {:?}",
        world.writes()
    );

    // A typo, and a value that is markup: the revision is invalid.
    let typo = vm("web-1", 101, report, "")
        .replace("  memory: 512MiB\n", "  memroy: 512MiB\n")
        .replace(
            "  state: stopped\n",
            "  state: \"<script>alert(1)</script>\"\n",
        );
    let bad = repo.commit_files(&[("vm/web-1.yaml", &typo)], "typo");
    let status = one_pass(&agent).await;
    assert_eq!(
        commit_of(&status, "last_attempted").as_deref(),
        Some(bad.as_str())
    );
    assert_eq!(status["last_attempted"]["outcome"], "invalid");
    let invalid_pass = status["last_attempted"]["id"].as_i64().unwrap();

    let overview = dump_dom(&browser, profile.path(), &agent.url("/"), "overview").await;
    assert!(overview.contains("id=\"head-invalid\""), "{overview}");
    assert!(
        overview.contains(&format!(
            "href=\"https://forge.example.org/ops/infra/commit/{bad}\""
        )),
        "HEAD links to the forge:\n{overview}"
    );
    assert!(
        overview.contains(&format!(
            "href=\"https://forge.example.org/ops/infra/commit/{good}\""
        )),
        "the applied revision links to the forge:\n{overview}"
    );
    assert!(overview.contains("vm/web-1.yaml:"), "{overview}");
    screenshots(&browser, profile.path(), &agent.url("/"), "overview", true).await;

    let pass_url = agent.url(&format!("/ui/passes/{invalid_pass}"));
    let pass_dom = dump_dom(&browser, profile.path(), &pass_url, "pass-invalid").await;
    let line = typo.lines().position(|l| l.contains("memroy")).unwrap() + 1;
    assert!(
        pass_dom.contains(&format!("vm/web-1.yaml:{line}:")),
        "the typo's path:line is on the pass page:\n{pass_dom}"
    );
    assert!(pass_dom.contains("memroy"), "{pass_dom}");
    // The markup in the repository is text on the page, never an element.
    assert!(
        pass_dom.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{pass_dom}"
    );
    assert!(!pass_dom.contains("<script>alert(1)"), "{pass_dom}");
    assert_eq!(
        pass_dom.matches("<script").count(),
        1,
        "only the UI's own script:\n{pass_dom}"
    );
    screenshots(&browser, profile.path(), &pass_url, "pass-invalid", false).await;

    // While HEAD is invalid, the preview plans the revision in force and says why.
    let plan_invalid = dump_dom(
        &browser,
        profile.path(),
        &agent.url("/ui/plan"),
        "plan-invalid",
    )
    .await;
    assert!(
        plan_invalid.contains("is invalid, so no pass plans from it; the next pass enforces"),
        "{plan_invalid}"
    );
    assert!(
        plan_invalid.contains(&format!("title=\"{good}\"")),
        "{plan_invalid}"
    );
    assert!(plan_invalid.contains("memroy"), "{plan_invalid}");

    let resources = dump_dom(
        &browser,
        profile.path(),
        &agent.url("/ui/resources"),
        "resources",
    )
    .await;
    for name in ["<td>web-1</td>", "<td>db-1</td>", "<td>installer</td>"] {
        assert!(
            resources.contains(name),
            "objects stay listed while HEAD is invalid: {name}\n{resources}"
        );
    }
    screenshots(
        &browser,
        profile.path(),
        &agent.url("/ui/resources"),
        "resources",
        false,
    )
    .await;

    let drift = dump_dom(&browser, profile.path(), &agent.url("/ui/drift"), "drift").await;
    let open = drift.find("id=\"open\"").unwrap();
    let resolved = drift.find("id=\"resolved\"").unwrap();
    assert!(
        drift[open..resolved].contains("<td>VM/web-1</td>"),
        "{drift}"
    );
    assert!(drift[resolved..].contains("<td>VM/web-1</td>"), "{drift}");
    // The drift the agent corrected is resolved by the pass that corrected it.
    assert!(drift[resolved..].contains("<td>VM/db-1</td>"), "{drift}");
    assert!(drift[resolved..].contains("corrected by pass"), "{drift}");
    screenshots(
        &browser,
        profile.path(),
        &agent.url("/ui/drift"),
        "drift",
        true,
    )
    .await;

    // The timeline filters without JavaScript: a plain GET form.
    let invalid_only = dump_dom(
        &browser,
        profile.path(),
        &agent.url("/ui/passes?outcome=invalid"),
        "passes-invalid",
    )
    .await;
    assert!(
        invalid_only.contains(&format!("href=\"/ui/passes/{invalid_pass}\"")),
        "{invalid_only}"
    );
    assert!(!invalid_only.contains(">applied</span>"), "{invalid_only}");
    let all = dump_dom(&browser, profile.path(), &agent.url("/ui/passes"), "passes").await;
    assert!(
        all.contains(">applied</span>") && all.contains(">invalid</span>"),
        "{all}"
    );
    screenshots(
        &browser,
        profile.path(),
        &agent.url("/ui/passes"),
        "passes",
        false,
    )
    .await;
    let (code, body) = agent.get_text("/ui/passes?since=yesterday").await;
    assert_eq!(code, 400);
    assert!(body.contains("since: `yesterday` is not a time"), "{body}");

    // A pass with an action: its UPID and result are listed.
    let passes = agent.get("/api/v1/revisions").await;
    let corrected = passes
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["actions_ok"].as_u64().unwrap_or(0) > 0 && p["commit"] == good.as_str())
        .map(|p| p["id"].as_i64().unwrap())
        .min_by_key(|id| std::cmp::Reverse(*id))
        .expect("a pass that corrected db-1");
    let corrected_dom = dump_dom(
        &browser,
        profile.path(),
        &agent.url(&format!("/ui/passes/{corrected}")),
        "pass-corrected",
    )
    .await;
    assert!(
        corrected_dom.contains("<td>VM/db-1</td>"),
        "{corrected_dom}"
    );
    assert!(
        corrected_dom.contains(">succeeded</span>"),
        "{corrected_dom}"
    );
    screenshots(
        &browser,
        profile.path(),
        &agent.url(&format!("/ui/passes/{corrected}")),
        "pass-corrected",
        false,
    )
    .await;

    // No page carries the PVE token's secret or an absolute path of the node.
    let state_dir = world.dir.path().join("state-pve1");
    for page in std::fs::read_dir(screenshot_dir()).unwrap() {
        let path = page.unwrap().path();
        if path.extension().is_some_and(|e| e == "html") {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains("proxops-dev-secret"), "{}", path.display());
            assert!(
                !text.contains(&state_dir.display().to_string()),
                "{}",
                path.display()
            );
        }
    }

    let mut agent = agent;
    assert!(agent.terminate().success());
}
