//! `qoslet batch-resources` offline, on Koordinator's own test objects
//! (`colocation/tests/fixtures`: TestPluginCalculate's node, pods and
//! NodeMetric, its e2e sample ConfigMap): the binary as a user runs it.

use std::process::Command;

use qoslet_integration::process::qoslet_bin;
use serde_json::Value;

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../colocation/tests/fixtures");

fn run(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(qoslet_bin())
        .arg("batch-resources")
        .args([
            "--node",
            &format!("{FIX}/node.yaml"),
            "--pods",
            &format!("{FIX}/pods.yaml"),
        ])
        .args(args)
        .output()
        .expect("qoslet runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn json(args: &[&str]) -> Value {
    let (ok, out, err) = run(&[args, &["-o", "json"]].concat());
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn metric() -> String {
    format!("{FIX}/nodemetric.json")
}

fn config() -> String {
    format!("{FIX}/slo-controller-config.yaml")
}

#[test]
fn koordinators_objects_give_koordinators_numbers() {
    // the node's labels match the nodeConfigs entry: cpu reclaim 65 %, memory 65 %
    let v = json(&[
        "--node-metric",
        &metric(),
        "--colocation",
        &config(),
        "--at",
        "2026-12-07T10:01:00Z",
    ]);
    assert_eq!(
        v["allocatable"]["kubernetes.io/batch-cpu"], "25000",
        "{v:#}"
    );
    assert_eq!(
        v["allocatable"]["kubernetes.io/batch-memory"],
        "33000000000"
    );
    assert_eq!(v["degraded"], false);
    assert_eq!(v["nodeConfig"], "batch-pool");
    let t = &v["terms"];
    assert_eq!(t["capacity"]["cpu"], "100000m");
    assert_eq!(t["margin"]["cpu"], "35000m");
    assert_eq!(t["highPriorityUsed"]["cpu"], "33000m");
    assert_eq!(t["highPriorityRequested"]["memory"], "60000000000");
    assert_eq!(t["systemOrReserved"]["memory"], "12000000000");
    assert_eq!(t["pods"]["highPriority"], 2);
    assert_eq!(t["pods"]["inactive"], 1);
    assert_eq!(t["highPriorityPods"][0]["pod"], "test/podC");
    // the Node shows batch-cpu 20000: 25 % more is over the 10 % threshold;
    // batch-memory is not on the Node yet
    assert_eq!(v["current"]["kubernetes.io/batch-cpu"], "20000");
    assert_eq!(v["write"]["due"], true);
    assert_eq!(v["write"]["reason"]["reason"], "moved");
}

#[test]
fn the_cluster_strategy_and_the_text_form() {
    // without the node's label the cluster's 60 % applies: 100 - 40 - 7 - 33
    let dir = qoslet_integration::scratch("batch-cli");
    let node = std::fs::read_to_string(format!("{FIX}/node.yaml"))
        .unwrap()
        .replace("pool: batch", "pool: web");
    let node_path = dir.join("node.yaml");
    std::fs::write(&node_path, node).unwrap();
    let o = Command::new(qoslet_bin())
        .args(["batch-resources", "--node"])
        .arg(&node_path)
        .args([
            "--pods",
            &format!("{FIX}/pods.yaml"),
            "--node-metric",
            &metric(),
            "--colocation",
            &config(),
        ])
        .args(["--at", "2026-12-07T10:01:00Z"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains("kubernetes.io/batch-cpu: 20000 (milli-cores)"),
        "{out}"
    );
    assert!(out.contains("capacity 100000 - margin 40000 (40% of capacity: cpuReclaimThresholdPercent 60) - max(system 7000, reserved 0) - high-priority used 33000 = 20000"), "{out}");
    assert!(
        out.contains("a write is due: kubernetes.io/batch-memory appears"),
        "{out}"
    );
}

#[test]
fn stale_metrics_missing_metrics_and_co_location_off_advertise_nothing() {
    // 16 minutes after the NodeMetric's update: over degradeTimeMinutes (15)
    let v = json(&[
        "--node-metric",
        &metric(),
        "--colocation",
        &config(),
        "--at",
        "2026-12-07T10:16:01Z",
    ]);
    assert_eq!(v["allocatable"], serde_json::json!({}));
    assert_eq!(v["degraded"], true);
    assert!(
        v["reason"].as_str().unwrap().contains("degradeTimeMinutes"),
        "{v:#}"
    );
    // the keys are removed: the Node's batch-cpu disappears
    assert_eq!(v["write"]["reason"]["reason"], "disappeared");
    let v = json(&["--colocation", &config()]);
    assert_eq!(
        (v["degraded"].clone(), v["reason"].clone()),
        (
            Value::Bool(true),
            Value::from("no NodeMetric figures for this node")
        )
    );
    // no colocation-config: Koordinator's defaults, off
    let v = json(&["--node-metric", &metric(), "--at", "2026-12-07T10:01:00Z"]);
    assert_eq!(v["allocatable"], serde_json::json!({}));
    assert_eq!(v["degraded"], false);
    assert!(v["reason"].as_str().unwrap().contains("co-location is off"));
    // ... but the terms say what it would be
    assert_eq!(v["terms"]["cpuByPolicy"], "20000m");
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = qoslet_integration::scratch("batch-cli-bad");
    let bad = dir.join("cm.yaml");
    std::fs::write(
        &bad,
        "kind: ConfigMap\ndata:\n  colocation-config: '{\"enable\": tru'\n",
    )
    .unwrap();
    let (ok, _, err) = run(&["--colocation", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("not valid JSON for a ColocationStrategy"),
        "{err}"
    );
    let (ok, _, err) = run(&["--node-metric", &format!("{FIX}/node.yaml")]);
    assert!(!ok);
    assert!(err.contains("a Node, not a NodeMetric"), "{err}");
    let (ok, _, err) = run(&["--at", "yesterday"]);
    assert!(!ok && err.contains("not an RFC 3339 time"), "{err}");
}
