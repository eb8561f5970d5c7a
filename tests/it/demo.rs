//! `proxops demo` end to end: the built binary runs the whole demo (simulator, file server,
//! git repository, agent, out-of-band change, webhook, correction) and exits 0, its output
//! shows each stage, and no secret of the run appears in it.

use std::time::{Duration, Instant};

use crate::support::{proxops, stderr, stdout};

#[test]
fn demo_applies_the_examples_and_corrects_an_out_of_band_change_without_printing_secrets() {
    let started = Instant::now();
    let output = proxops(&["demo", "--keep"]);
    let elapsed = started.elapsed();
    let out = stdout(&output);
    let err = stderr(&output);
    let kept = out
        .lines()
        .find_map(|l| l.strip_prefix("kept "))
        .and_then(|rest| rest.split(' ').next())
        .map(std::path::PathBuf::from);
    let secrets: Vec<String> = kept
        .iter()
        .flat_map(|dir| ["pve-token-secret", "webhook-secret"].map(|f| dir.join(f)))
        .map(|file| std::fs::read_to_string(file).unwrap().trim().to_owned())
        .collect();
    if let Some(dir) = &kept {
        std::fs::remove_dir_all(dir).unwrap();
    }
    assert!(
        output.status.success(),
        "demo failed\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert!(elapsed < Duration::from_secs(60), "demo took {elapsed:?}");

    let iso = "local:iso/debian-13.2.0-amd64-netinst.iso";
    let expect = |needle: &str| {
        assert!(
            out.contains(needle),
            "output lacks {needle:?}\nstdout:\n{out}\nstderr:\n{err}"
        );
    };
    // The local stand-ins, and that the demo says it rewrote the URLs.
    expect("generated stand-in files");
    expect("points them at this local server");
    // The plan of the first pass.
    expect("cluster homelab:");
    expect(&format!("+ download ISO/debian-netinst on pve1 → {iso}"));
    expect("plan: 6 to download");
    // The applied actions and the record of the first pass.
    expect("download ISO/debian-netinst on pve1: ok (OK)");
    expect("download CTTemplate/debian-12-standard on pve2: ok (OK)");
    expect("recorded: pass 1 (startup trigger)");
    assert!(
        out.lines().any(|l| l.contains("recorded: pass 1")
            && l.contains(": applied:")
            && l.contains(" 0 failed")),
        "pass 1 applied without failures\n{out}"
    );
    // The out-of-band change, the drift as the next plan sees it, the webhook, the correction.
    expect(&format!("DELETE /nodes/pve1/storage/local/content/{iso}"));
    expect("the plan now (what the next pass will find)");
    expect(&format!("because {iso} is absent on pve1"));
    expect("/hooks/github");
    expect("-> 202");
    expect("recorded: pass 2 (webhook trigger)");
    expect(&format!(
        "drift found: download ISO/debian-netinst on pve1, because {iso} is absent on pve1: succeeded"
    ));
    expect(&format!("corrected: {iso} is on pve1 again"));
    if out.contains("PUT /nodes/pve2/qemu/102/config memory=1024") {
        expect("update VM/installer on pve2: memory: 1024 → 2048");
        expect("corrected: VM/installer (vmid 102) has memory 2048 again");
    }
    expect("status: node *, last applied");
    expect("open drift findings 0");
    expect("stopped the agent, the file server and the simulator");
    assert!(!out.contains("NOT corrected"), "{out}");

    // No secret of the run, nor the simulator's default one, is printed.
    assert_eq!(secrets.len(), 2, "the demo kept its secret files\n{out}");
    for secret in secrets
        .iter()
        .map(String::as_str)
        .chain(["proxops-dev-secret"])
    {
        assert!(!secret.is_empty());
        assert!(
            !out.contains(secret) && !err.contains(secret),
            "a secret was printed\nstdout:\n{out}\nstderr:\n{err}"
        );
    }
}
