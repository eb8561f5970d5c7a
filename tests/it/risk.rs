//! Issue 19, item 1, end to end: `proxops plan` against the simulator marks each risky or
//! destructive action and sums the plan up by risk, in text and in `--json`.

use crate::invalid_head::vm;
use crate::pve_api::Api;
use crate::sim::World;
use crate::support::stdout;

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_write_back_is_marked_risky_in_the_plan_and_counted_in_its_risk_summary() {
    let world = World::start(&[]).await;
    world.write("vm/app.yaml", Some(&vm("app", 151, "memory: 512MiB")));
    let out = world.proxops(&["apply", "--yes"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A create is safe: no marker, and the summary counts it.
    assert!(!stdout(&out).contains("[risky]"), "{}", stdout(&out));

    // Memory drifts: writing it back is risky (PVE may hold it pending on a running VM).
    Api::new(&world)
        .put("/nodes/pve1/qemu/151/config", &[("memory", "1024")])
        .await;
    let out = world.proxops(&["plan"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("~ update VM/app on pve1: memory: 1024 → 512 [risky]"),
        "{text}"
    );
    assert!(
        text.contains("  risk: 0 safe, 1 risky, 0 destructive"),
        "{text}"
    );

    let out = world.proxops(&["plan", "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let plan = &json["plan"];
    assert_eq!(plan["levels"][0][0]["risk"], "risky", "{plan:#}");
    assert_eq!(plan["risk"]["risky"], 1, "{plan:#}");
    assert_eq!(plan["risk"]["safe"], 0, "{plan:#}");
}
