//! The HTTP front as kube-scheduler calls it: golden requests in the v1 wire
//! shape (PascalCase and lower-case keys, nulls), `NodeNames` and `Nodes`,
//! LoadAware's Filter and Score tables (`load_aware_test.go`) as JSON
//! objects in the API's own shape, and the front's limits. A peer we did not
//! write (curl) speaks to it too.

use std::net::SocketAddr;
use std::sync::Arc;

use qoslet_kube_api::view::NodeMetricView;
use qoslet_kube_api::view::NodeView;
use qoslet_scheduler::args::Args;
use qoslet_scheduler::extender::{Extender, UNKNOWN_NODE};
use qoslet_scheduler::facts::{metric_facts, node_facts};
use qoslet_scheduler::serve::{serve, Front};
use qoslet_scheduler::watch::{now_ms, Status};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn rfc3339(ms: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_millisecond(ms)
        .unwrap()
        .to_string()
}

/// A node of `load_aware_test.go`: 96 CPUs, 512 GiB.
fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "96", "memory": "512Gi", "pods": "110"},
                   "capacity": {"cpu": "96", "memory": "512Gi"}}})
}

/// Its NodeMetric reported `age_s` ago (`None`: never) with this usage.
fn node_metric(name: &str, age_s: Option<i64>, cpu: &str, memory: &str) -> Value {
    let mut status =
        json!({"nodeMetric": {"nodeUsage": {"resources": {"cpu": cpu, "memory": memory}}}});
    if let Some(a) = age_s {
        status["updateTime"] = json!(rfc3339(now_ms() - a * 1000));
    }
    json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
        "metadata": {"name": name},
        "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 60}},
        "status": status})
}

fn pod(name: &str, resources: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": resources}]},
        "status": {"phase": "Pending"}})
}

fn put_node(ext: &Extender, n: &Value) {
    let v: NodeView = serde_json::from_value(n.clone()).unwrap();
    let name = v.metadata.name.clone().unwrap();
    ext.cache.write().unwrap().set_node(name, node_facts(&v));
}

fn put_metric(ext: &Extender, m: &Value) {
    let v: NodeMetricView = serde_json::from_value(m.clone()).unwrap();
    let name = v.metadata.name.clone().unwrap();
    ext.cache
        .write()
        .unwrap()
        .set_metric(&name, metric_facts(&v));
}

struct Running {
    addr: SocketAddr,
    _stop: tokio::sync::watch::Sender<bool>,
}

async fn start(ext: Arc<Extender>, max_body: usize) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let front = Arc::new(Front::new(ext, Arc::new(Status::default()), max_body));
    tokio::spawn(serve(listener, front, rx));
    Running { addr, _stop: tx }
}

/// One HTTP/1.1 request on its own connection: (status, body).
async fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    // a refused body may close the connection before all of it is written
    let _ = s.write_all(body).await;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

async fn post(addr: SocketAddr, verb: &str, v: &Value) -> Value {
    let (code, body) = request(addr, "POST", verb, &serde_json::to_vec(v).unwrap()).await;
    assert_eq!(code, 200, "{verb}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{verb}: {e}: {body}"))
}

fn cluster() -> Arc<Extender> {
    let ext = Arc::new(Extender::new(Args::default()));
    for (name, cpu, mem, age) in [
        ("n-60cpu", "60", "256Gi", Some(0)),
        ("n-70cpu", "70", "256Gi", Some(0)),
        ("n-500gi", "30", "500Gi", Some(0)),
        ("n-expired", "10", "10Gi", Some(180)),
        ("n-never", "10", "10Gi", None),
        ("n-32cpu", "32", "10Gi", Some(0)),
        ("n-empty", "0", "0", Some(0)),
    ] {
        put_node(&ext, &node(name));
        put_metric(&ext, &node_metric(name, age, cpu, mem));
    }
    put_node(&ext, &node("n-nometric"));
    ext
}

/// `TestFilterUsage` and `TestFilterExpiredNodeMetric` through `/filter`,
/// PascalCase keys, `NodeNames` (nodeCacheCapable); an unknown node is
/// answered as failed; the answer is a subset of the request.
#[tokio::test]
async fn loadaware_filter_table_over_http() {
    let r = start(cluster(), 1 << 20).await;
    let names = [
        "n-60cpu",
        "n-70cpu",
        "n-500gi",
        "n-expired",
        "n-never",
        "n-nometric",
        "n-gone",
    ];
    let out = post(
        r.addr,
        "/filter",
        &json!({"Pod": pod("p", json!({})), "Nodes": null, "NodeNames": names}),
    )
    .await;
    assert_eq!(out["NodeNames"], json!(["n-60cpu", "n-nometric"]), "{out}");
    assert_eq!(out["Nodes"], Value::Null);
    assert_eq!(
        out["FailedNodes"],
        json!({
            "n-70cpu": "node(s) cpu usage exceed threshold",
            "n-500gi": "node(s) memory usage exceed threshold",
            "n-expired": "node(s) nodeMetric expired",
            "n-never": "node(s) nodeMetric expired",
            "n-gone": UNKNOWN_NODE,
        })
    );
    assert_eq!(out["FailedAndUnresolvableNodes"], json!({}));
    assert_eq!(out["Error"], "");
    // a DaemonSet's pod passes everywhere, a node not known yet too
    let mut ds = pod("ds", json!({}));
    ds["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
        "name": "d", "uid": "x", "controller": true}]);
    let out = post(r.addr, "/filter", &json!({"Pod": ds, "NodeNames": names})).await;
    assert_eq!(out["NodeNames"].as_array().unwrap().len(), 7, "{out}");
}

/// `TestScore` through `/prioritize`, lower-case keys (Go decodes keys in
/// any case), scores on the extender's 0-10.
#[tokio::test]
async fn loadaware_score_table_over_http() {
    let r = start(cluster(), 1 << 20).await;
    let big = json!({"requests": {"cpu": "16", "memory": "32Gi"}, "limits": {"cpu": "16", "memory": "32Gi"}});
    let out = post(
        r.addr,
        "/prioritize",
        &json!({"pod": pod("big", big.clone()), "nodes": null,
                "nodenames": ["n-empty", "n-32cpu", "n-expired", "n-nometric", "n-gone"]}),
    )
    .await;
    // LoadAware: 90, 72, 0 (expired), 0 (no NodeMetric); unknown: 0
    assert_eq!(
        out,
        json!([{"Host": "n-empty", "Score": 9}, {"Host": "n-32cpu", "Score": 7},
               {"Host": "n-expired", "Score": 0}, {"Host": "n-nometric", "Score": 0},
               {"Host": "n-gone", "Score": 0}])
    );
    // the best node holds the pod tentatively: an identical pod scores
    // n-empty as LoadAware's "one just-assigned identical pod" row would
    // (its estimate counts: 90 -> 81 on 0-100)
    let out = post(
        r.addr,
        "/prioritize",
        &json!({"Pod": pod("big2", big.clone()), "NodeNames": ["n-empty"]}),
    )
    .await;
    assert_eq!(out, json!([{"Host": "n-empty", "Score": 8}]));
    // a pod with no requests (250m, 200 MiB): 32.25 of 96 CPUs -> 66,
    // 10.2 of 512 GiB -> 98, (66 + 98) / 2 = 82 -> 8
    let out = post(
        r.addr,
        "/prioritize",
        &json!({"Pod": pod("small", json!({})), "NodeNames": ["n-32cpu"]}),
    )
    .await;
    assert_eq!(out[0]["Score"], 8, "{out}");
}

/// nodeCacheCapable false: whole Node objects in `Nodes`; the answer's
/// `Nodes` are the ones that pass, as sent (unknown fields kept).
#[tokio::test]
async fn nodes_mode_answers_the_objects_sent() {
    let ext = cluster();
    let r = start(ext, 1 << 20).await;
    let mut hot = node("n-70cpu");
    hot["spec"] = json!({"podCIDR": "10.0.0.0/24", "taints": null});
    let fresh = node("n-new");
    let out = post(
        r.addr,
        "/filter",
        &json!({"Pod": pod("p", json!({})),
                "Nodes": {"kind": "NodeList", "apiVersion": "v1", "metadata": {},
                          "items": [node("n-60cpu"), hot, fresh.clone()]},
                "NodeNames": null}),
    )
    .await;
    assert_eq!(out["NodeNames"], Value::Null);
    assert_eq!(out["Nodes"]["items"], json!([node("n-60cpu"), fresh]));
    assert_eq!(
        out["FailedNodes"],
        json!({"n-70cpu": "node(s) cpu usage exceed threshold"})
    );
    let out = post(
        r.addr,
        "/prioritize",
        &json!({"Pod": pod("p2", json!({})), "Nodes": {"items": [node("n-32cpu"), node("n-new")]}}),
    )
    .await;
    assert_eq!(out[1], json!({"Host": "n-new", "Score": 0}));
}

/// Bad input: a clear status, never a crash; the front keeps serving.
#[tokio::test]
async fn bad_requests_get_clear_answers() {
    let r = start(cluster(), 4096).await;
    let (code, body) = request(r.addr, "POST", "/filter", b"{not json").await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("not an ExtenderArgs object"), "{body}");
    let (code, _) = request(r.addr, "POST", "/filter", &vec![b' '; 5000]).await;
    assert_eq!(code, 413);
    let (code, _) = request(r.addr, "GET", "/filter", b"").await;
    assert_eq!(code, 405);
    let (code, _) = request(r.addr, "POST", "/bind", b"{}").await;
    assert_eq!(code, 404);
    // no pod: kube-scheduler shows the Error
    let out = post(
        r.addr,
        "/filter",
        &json!({"Pod": null, "NodeNames": ["n-60cpu"]}),
    )
    .await;
    assert_eq!(out["Error"], "the request has no Pod");
    // a hostile pod: huge quantities, a bad annotation, a long label
    let mut p = pod(
        "x",
        json!({"requests": {"cpu": "9e18", "memory": "-1"}, "limits": {"cpu": "abc"}}),
    );
    p["metadata"]["labels"] = json!({"koordinator.sh/priority-class": "k".repeat(100)});
    let out = post(
        r.addr,
        "/prioritize",
        &json!({"Pod": p, "NodeNames": ["n-empty"]}),
    )
    .await;
    assert_eq!(out[0]["Host"], "n-empty");
    // neither list: nothing passes, nothing fails
    let out = post(r.addr, "/filter", &json!({"Pod": pod("y", json!({}))})).await;
    assert_eq!(out["NodeNames"], json!([]));
    // the health and metrics endpoints
    let (code, body) = request(r.addr, "GET", "/healthz", b"").await;
    assert_eq!(code, 503, "no watch has listed: {body}");
    let (code, body) = request(r.addr, "GET", "/metrics", b"").await;
    assert_eq!(code, 200);
    assert!(
        body.contains("qoslet_extender_bad_requests_total 4"),
        "{body}"
    );
    assert!(
        body.contains("qoslet_extender_cache_objects{kind=\"nodes\"} 8"),
        "{body}"
    );
    assert!(
        body.contains("qoslet_extender_request_seconds_count{verb=\"filter\"} 2"),
        "{body}"
    );
}

/// A body that does not arrive in time is dropped (408), without holding
/// the front.
#[tokio::test(start_paused = false)]
async fn a_slow_body_times_out() {
    let r = start(cluster(), 1 << 20).await;
    let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    s.write_all(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .await
        .unwrap();
    // clients that declare bodies and send next to nothing hold only what
    // they sent: eighty of them declaring the largest body (80 MiB, over
    // the 64 MiB budget), and kube-scheduler's requests are answered at once
    let mut slow = Vec::new();
    for _ in 0..80 {
        let mut c = tokio::net::TcpStream::connect(r.addr).await.unwrap();
        c.write_all(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n{")
            .await
            .unwrap();
        slow.push(c);
    }
    // (one declaring more than the limit is refused before a byte is read)
    let mut big = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    big.write_all(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1048577\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    big.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 413");
    let t = std::time::Instant::now();
    let out = post(
        r.addr,
        "/filter",
        &json!({"Pod": pod("q", json!({})), "NodeNames": []}),
    )
    .await;
    assert_eq!(out["NodeNames"], json!([]));
    // (not a speed check: waiting on them would take the body timeout)
    assert!(
        t.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        t.elapsed()
    );
    let mut out = Vec::new();
    let t = std::time::Instant::now();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(20), s.read_to_end(&mut out)).await;
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.1 408"),
        "{:?}",
        t.elapsed()
    );
}

/// curl (HTTP/1.1 with keep-alive, a client we did not write) posts two
/// requests on one connection.
#[tokio::test]
async fn curl_keeps_alive() {
    let r = start(cluster(), 1 << 20).await;
    let url = format!("http://{}/filter", r.addr);
    let body = json!({"Pod": pod("c", json!({})), "NodeNames": ["n-60cpu", "n-70cpu"]}).to_string();
    let out = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &body,
            &url,
        ])
        .args([
            "--next",
            "-sS",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &body,
            &url,
        ])
        .arg("-w")
        .arg("\n%{num_connects}")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.matches(r#""NodeNames":["n-60cpu"]"#).count(),
        2,
        "{text}"
    );
    // the second request reused the first one's connection
    assert!(text.ends_with("\n0"), "{text}");
}

/// The args the manifests ship are koord-scheduler's defaults, written out,
/// and read as `--config` reads them.
#[test]
fn the_shipped_args_are_the_defaults() {
    let text = include_str!("../../deploy/kubernetes/scheduler-extender/loadaware.yaml");
    assert_eq!(qoslet_scheduler::read_args(text).unwrap(), Args::default());
    // unknown fields and refused features are errors, not ignored
    assert!(qoslet_scheduler::read_args("usageThreshold: {cpu: 50}\n").is_err());
    assert!(qoslet_scheduler::read_args("allowCustomizeEstimation: true\n").is_err());
}

/// Hostile values a node or its NodeMetric may carry (a node agent or a
/// kubelet writes them): a duration too large for any clock is no duration,
/// never a panic; a DaemonSet's pod passes a node not known yet.
#[tokio::test]
async fn hostile_durations_and_unknown_nodes() {
    let ext = cluster();
    let mut n = node("n-hostile");
    n["metadata"]["annotations"] = json!({"scheduling.koordinator.sh/usage-thresholds":
        r#"{"aggregatedUsage":{"usageThresholds":{"cpu":1},"usageAggregationType":"p95","usageAggregatedDuration":"6000000000000000h"}}"#});
    put_node(&ext, &n);
    let mut m = node_metric("n-hostile", Some(0), "1", "1Gi");
    m["status"]["nodeMetric"]["aggregatedNodeUsages"] =
        json!([{"duration": "6000000000000000h", "usage": {"p95": {"resources": {"cpu": "90"}}}}]);
    put_metric(&ext, &m);
    let r = start(ext, 1 << 20).await;
    let out = post(
        r.addr,
        "/filter",
        &json!({"Pod": pod("h", json!({})), "NodeNames": ["n-hostile"]}),
    )
    .await;
    assert_eq!(out["NodeNames"], json!(["n-hostile"]), "{out}");
    let mut ds = pod("ds2", json!({}));
    ds["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "x"}]);
    let out = post(
        r.addr,
        "/filter",
        &json!({"Pod": ds, "NodeNames": ["n-new"]}),
    )
    .await;
    assert_eq!(out["NodeNames"], json!(["n-new"]), "{out}");
}

/// kube-scheduler posts to `<urlPrefix>/<verb>`: a prefix with a path of
/// its own works; a request naming more nodes than any cluster has is
/// answered with an error, not read node by node.
#[tokio::test]
async fn verbs_under_a_prefix_and_too_many_nodes() {
    let r = start(cluster(), 1 << 20).await;
    let out = post(
        r.addr,
        "/scheduler/qoslet/filter",
        &json!({"Pod": pod("a", json!({})), "NodeNames": ["n-70cpu"]}),
    )
    .await;
    assert_eq!(
        out["FailedNodes"]["n-70cpu"],
        "node(s) cpu usage exceed threshold"
    );
    let out = post(
        r.addr,
        "/x/prioritize/",
        &json!({"Pod": pod("a", json!({})), "NodeNames": ["n-32cpu"]}),
    )
    .await;
    assert_eq!(out[0]["Host"], "n-32cpu");
    let many: Vec<String> = (0..50_001).map(|i| format!("n{i}")).collect();
    let out = post(
        r.addr,
        "/filter",
        &json!({"Pod": pod("a", json!({})), "NodeNames": many}),
    )
    .await;
    assert_eq!(out["Error"], "the request names more than 50000 nodes");
}

/// The tentative assignment: on the node best by LoadAware's own 0-100
/// (the 0-10 answered ties more often), none on a tie; it ends when the pod
/// is filtered again, and at its TTL.
#[tokio::test]
async fn tentative_assignments() {
    let ext = cluster();
    put_node(&ext, &node("n-twin"));
    put_metric(&ext, &node_metric("n-twin", Some(0), "0", "0"));
    let r = start(ext.clone(), 1 << 20).await;
    let tentative = || ext.cache.read().unwrap().sizes().tentative;
    // n-empty and n-twin score the same: nothing assumed
    let p = pod("t", json!({"requests": {"cpu": "4"}}));
    post(
        r.addr,
        "/prioritize",
        &json!({"Pod": p, "NodeNames": ["n-empty", "n-twin"]}),
    )
    .await;
    assert_eq!(tentative(), 0);
    // 0 and 32 CPUs used: n-empty is best
    post(
        r.addr,
        "/prioritize",
        &json!({"Pod": p, "NodeNames": ["n-32cpu", "n-empty"]}),
    )
    .await;
    assert_eq!(ext.cache.read().unwrap().assumed("uid-t"), Some("n-empty"));
    // filtered again: its cycle failed, the guess goes
    post(
        r.addr,
        "/filter",
        &json!({"Pod": p, "NodeNames": ["n-32cpu"]}),
    )
    .await;
    // (one node left by the filter: it is assumed there, as no scores follow)
    assert_eq!(ext.cache.read().unwrap().assumed("uid-t"), Some("n-32cpu"));
    drop(r);
    // the TTL: a short one ends it at the next request
    let mut short = Extender::new(Args::default());
    short.assume_ttl_ms = 50;
    let short = Arc::new(short);
    put_node(&short, &node("a"));
    put_metric(&short, &node_metric("a", Some(0), "1", "1Gi"));
    put_node(&short, &node("b"));
    put_metric(&short, &node_metric("b", Some(0), "50", "1Gi"));
    let r = start(short.clone(), 1 << 20).await;
    post(
        r.addr,
        "/prioritize",
        &json!({"Pod": pod("u", json!({})), "NodeNames": ["a", "b"]}),
    )
    .await;
    assert_eq!(short.cache.read().unwrap().sizes().tentative, 1);
    tokio::time::sleep(std::time::Duration::from_millis(80)).await;
    post(
        r.addr,
        "/prioritize",
        &json!({"Pod": pod("v", json!({})), "NodeNames": ["b"]}),
    )
    .await;
    let c = short.cache.read().unwrap();
    assert_eq!(c.assumed("uid-u"), None);
    assert_eq!(c.load("a").map(|l| l.pods()).unwrap_or(0), 0);
}
