//! The extender against the in-process fake API server (real HTTP/JSON
//! list and watch): its cache follows Node, NodeMetric and Pod events, a
//! node deleted, a pod finishing (it leaves the field selector: DELETED), a
//! 410 (relist); and a simulated cluster where 200 pods are placed one after
//! another by filter + prioritize over HTTP, their bindings showing on the
//! pod watch some pods later, as they do.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use qoslet_kube_fake::FakeApiServer;
use qoslet_scheduler::args::Args;
use qoslet_scheduler::extender::Extender;
use qoslet_scheduler::serve::{serve, Front};
use qoslet_scheduler::watch::{follow_all, now_ms, Kind, Status};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NODES: &str = "/api/v1/nodes";
const PODS: &str = "/api/v1/pods";
const METRICS: &str = "/apis/slo.koordinator.sh/v1alpha1/nodemetrics";

struct Env {
    fake: Arc<FakeApiServer>,
    ext: Arc<Extender>,
    status: Arc<Status>,
    addr: SocketAddr,
    _stop: tokio::sync::watch::Sender<bool>,
    dir: std::path::PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn env(tag: &str, args: Args) -> Env {
    let fake = FakeApiServer::start().await;
    let dir = std::env::temp_dir().join(format!("qoslet-extender-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kc = dir.join("kubeconfig");
    std::fs::write(&kc, fake.kubeconfig()).unwrap();
    let client = qoslet_kube_api::connect::client(Some(&kc)).await.unwrap();
    let ext = Arc::new(Extender::new(args));
    let status = Arc::new(Status::default());
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(follow_all(client, ext.clone(), status.clone(), rx.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let front = Arc::new(Front::new(ext.clone(), status.clone(), 1 << 20));
    tokio::spawn(serve(listener, front, rx));
    Env {
        fake,
        ext,
        status,
        addr,
        _stop: tx,
        dir,
    }
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

fn rfc3339(ms: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_millisecond(ms)
        .unwrap()
        .to_string()
}

fn node(name: &str, cpu: &str, memory: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"allocatable": {"cpu": cpu, "memory": memory}}})
}

/// A NodeMetric reported `age_s` ago, with its node's and pods' usage.
fn metric(name: &str, age_s: i64, cpu_milli: i64, memory: i64, pods: &[(String, i64)]) -> Value {
    json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
        "metadata": {"name": name},
        "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 60}},
        "status": {"updateTime": rfc3339(now_ms() - age_s * 1000),
            "nodeMetric": {"nodeUsage": {"resources": {"cpu": format!("{cpu_milli}m"), "memory": memory.to_string()}}},
            "podsMetric": pods.iter().map(|(n, cpu)| json!({"namespace": "default", "name": n,
                "podUsage": {"resources": {"cpu": format!("{cpu}m"), "memory": "100Mi"}}})).collect::<Vec<_>>()}})
}

fn pod(name: &str, node: Option<&str>, phase: &str) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "c", "resources": {
            "requests": {"cpu": "200m", "memory": "256Mi"},
            "limits": {"cpu": "200m", "memory": "256Mi"}}}]},
        "status": {"phase": phase}});
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
        p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True",
            "lastTransitionTime": rfc3339(now_ms())}]);
    }
    p
}

async fn post(addr: SocketAddr, path: &str, v: &Value) -> Value {
    let body = serde_json::to_vec(v).unwrap();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&body).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    let (_, body) = text.split_once("\r\n\r\n").unwrap();
    serde_json::from_str(body).unwrap()
}

fn sizes(e: &Env) -> (usize, usize, usize) {
    let s = e.ext.cache.read().unwrap().sizes();
    (s.nodes, s.node_metrics, s.pods)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_follows_the_cluster() {
    let e = env("follow", Args::default()).await;
    e.fake.apply(NODES, node("n1", "8", "32Gi"));
    e.fake.apply(NODES, node("n2", "8", "32Gi"));
    e.fake.apply(METRICS, metric("n1", 0, 1000, 1 << 30, &[]));
    e.fake.apply(PODS, pod("running", Some("n1"), "Running"));
    e.fake.apply(PODS, pod("pending", None, "Pending"));
    e.fake.apply(PODS, pod("done", Some("n2"), "Succeeded"));
    until("the first lists", || {
        e.status.ready() && sizes(&e) == (2, 1, 1)
    })
    .await;
    // the watch asked for bound, unfinished pods only
    let seen = e.fake.seen();
    assert!(
        seen.iter().any(|s| s.path == PODS
            && s.query.contains("fieldSelector=spec.nodeName%21%3D%2Cstatus.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed")),
        "{seen:?}"
    );
    let load = |n: &str| {
        e.ext
            .cache
            .read()
            .unwrap()
            .load(n)
            .map(|l| l.pods())
            .unwrap_or(0)
    };
    assert_eq!(load("n1"), 1);
    // a binding shows
    e.fake.apply(PODS, pod("pending", Some("n2"), "Running"));
    until("the binding", || sizes(&e).2 == 2 && load("n2") == 1).await;
    // a pod finishes: it leaves the selector (DELETED)
    e.fake.apply(PODS, pod("running", Some("n1"), "Succeeded"));
    until("the finished pod gone", || {
        sizes(&e).2 == 1 && load("n1") == 0
    })
    .await;
    // a node deleted, a NodeMetric deleted
    e.fake.delete(NODES, "n2");
    e.fake.delete(METRICS, "n1");
    until("node and NodeMetric gone", || sizes(&e) == (1, 0, 1)).await;
    // the history compacted and the watches ended: a watch whose
    // resourceVersion is older (no bookmark since) gets 410 and relists
    let relists = || {
        Kind::ALL
            .map(|k| {
                e.status
                    .of(k)
                    .relists
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
            .iter()
            .sum::<u64>()
    };
    let before = relists();
    e.fake.compact();
    e.fake.end_watches();
    e.fake.apply(NODES, node("n3", "8", "32Gi"));
    e.fake.apply(METRICS, metric("n3", 0, 1000, 1 << 30, &[]));
    until("the relist", || {
        sizes(&e) == (2, 1, 1) && e.status.ready() && relists() > before
    })
    .await;
}

/// The API server gone: the watches go stale, `/healthz` says so (503)
/// and `/metrics` shows each watch down, while the cache keeps what it
/// knew and requests are still answered from it; the API server back: ok.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_cannot_be_kept_shows() {
    let e = env("stale", Args::default()).await;
    e.fake.apply(NODES, node("n1", "8", "32Gi"));
    e.fake.apply(METRICS, metric("n1", 0, 1000, 1 << 30, &[]));
    until("the lists", || e.status.ready() && sizes(&e) == (1, 1, 0)).await;
    let get = |path: &'static str| {
        let addr = e.addr;
        async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.unwrap();
            String::from_utf8_lossy(&out).to_string()
        }
    };
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
    e.fake.go_down();
    until("a watch stale", || !e.status.ready()).await;
    let health = get("/healthz").await;
    assert!(
        health.starts_with("HTTP/1.1 503") && health.contains("stale"),
        "{health}"
    );
    let metrics = get("/metrics").await;
    assert!(metrics.contains(",state=\"stale\"} 0"), "{metrics}");
    // the cache still answers
    let out = post(
        e.addr,
        "/filter",
        &json!({"Pod": pod("x", None, "Pending"), "NodeNames": ["n1"]}),
    )
    .await;
    assert_eq!(out["NodeNames"], json!(["n1"]));
    e.fake.come_back().await;
    for _ in 0..600 {
        if e.status.ready() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(e.status.ready(), "the watches back within 30 s");
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
}

/// 200 pods placed one after another: kube-scheduler's side is modelled as
/// the extender's score (weight 1, x10) plus a least-requested score of its
/// own (it knows its own placements), the highest total winning, ties to
/// the first; each binding reaches the API server three pods later; the
/// nodes report their NodeMetric every 50 pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_pods_spread_by_load() {
    let e = env("simulate", Args::default()).await;
    // 10 nodes of 16 CPUs, 64 GiB; base usage in CPUs: hot ones (n0, n1 over
    // 65 %), one stale from the start (n2), the others from light to busy
    let base_cpu = [
        12_000, 11_000, 500, 1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000,
    ];
    let names: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        e.fake.apply(NODES, node(n, "16", "64Gi"));
        let age = if i == 2 { 600 } else { 0 };
        e.fake
            .apply(METRICS, metric(n, age, base_cpu[i], 8 << 30, &[]));
    }
    until("the lists", || e.status.ready() && sizes(&e) == (10, 10, 0)).await;
    let mut placed: Vec<Vec<String>> = vec![Vec::new(); 10];
    let mut pending: std::collections::VecDeque<(String, usize)> = Default::default();
    let mut failed_reasons = std::collections::BTreeSet::new();
    let mut stale_n3_after = None;
    for i in 0..200 {
        let name = format!("p{i}");
        let p = pod(&name, None, "Pending");
        let f = post(e.addr, "/filter", &json!({"Pod": p, "NodeNames": names})).await;
        for v in f["FailedNodes"].as_object().unwrap().values() {
            failed_reasons.insert(v.as_str().unwrap().to_string());
        }
        let passed: Vec<String> = serde_json::from_value(f["NodeNames"].clone()).unwrap();
        assert!(!passed.is_empty(), "pod {i}: no node passes: {f}");
        let chosen = if passed.len() == 1 {
            passed[0].clone()
        } else {
            let scores = post(
                e.addr,
                "/prioritize",
                &json!({"Pod": p, "NodeNames": passed}),
            )
            .await;
            let mut best = (i64::MIN, String::new());
            for h in scores.as_array().unwrap() {
                let host = h["Host"].as_str().unwrap();
                let idx: usize = host[1..].parse().unwrap();
                // kube-scheduler's NodeResourcesFit (least allocated, by requests)
                let requested = placed[idx].len() as i64 * 200;
                let fit = (16_000 - requested) * 100 / 16_000;
                let total = h["Score"].as_i64().unwrap() * 10 + fit;
                if total > best.0 {
                    best = (total, host.to_string());
                }
            }
            best.1
        };
        let idx: usize = chosen[1..].parse().unwrap();
        placed[idx].push(name.clone());
        pending.push_back((name, idx));
        // the binding reaches the API server three pods later
        if pending.len() > 3 {
            let (n, idx) = pending.pop_front().unwrap();
            e.fake.apply(PODS, pod(&n, Some(&names[idx]), "Running"));
            // and the cache sees it before the next pod: the lag is counted
            // in pods, so that the outcome does not depend on timing
            let uid = format!("uid-{n}");
            until("the binding", || {
                e.ext.cache.read().unwrap().is_bound(&uid, &names[idx])
            })
            .await;
        }
        // the nodes report: each pod uses 150m of its 200m
        if i % 50 == 49 {
            let sent = now_ms();
            for (k, n) in names.iter().enumerate() {
                let age = if k == 2 { 600 } else { 0 };
                let pods: Vec<(String, i64)> = placed[k].iter().map(|p| (p.clone(), 150)).collect();
                let usage = base_cpu[k] + 150 * pods.len() as i64;
                if k == 3 && i >= 99 {
                    // n3's qoslet stops reporting at pod 100: its NodeMetric grows old
                    stale_n3_after.get_or_insert(placed[3].len());
                    e.fake.apply(METRICS, metric(n, 200, usage, 8 << 30, &pods));
                    continue;
                }
                e.fake.apply(METRICS, metric(n, age, usage, 8 << 30, &pods));
            }
            // this round's reports reach the cache before the next pod (n9's
            // is the last sent; a fresh-looking older one does not count: the
            // test runs 200 pods in seconds)
            until("the reports", || {
                let c = e.ext.cache.read().unwrap();
                c.load("n9")
                    .and_then(|l| l.metric())
                    .and_then(|m| m.update_time)
                    .is_some_and(|t| t >= sent)
            })
            .await;
        }
    }
    let counts: Vec<usize> = placed.iter().map(Vec::len).collect();
    // hot nodes and the stale one got nothing; n3 nothing after it went stale
    assert_eq!(&counts[..3], &[0, 0, 0], "{counts:?}");
    assert_eq!(counts[3], stale_n3_after.unwrap(), "{counts:?}");
    for why in [
        "node(s) cpu usage exceed threshold",
        "node(s) nodeMetric expired",
    ] {
        assert!(failed_reasons.contains(why), "{failed_reasons:?}");
    }
    // by load: the lighter a node was, the more pods it took
    for k in 4..9 {
        assert!(counts[k] >= counts[k + 1], "{counts:?}");
    }
    // and the fresh nodes end near the same load (estimates: 170m a pod),
    // within two of the extender's score steps (10 % of 16 CPUs each)
    let loads: Vec<i64> = (4..10)
        .map(|k| base_cpu[k] + 170 * counts[k] as i64)
        .collect();
    let spread = loads.iter().max().unwrap() - loads.iter().min().unwrap();
    assert!(spread <= 3_200, "{counts:?} {loads:?}");
    eprintln!("placed: {counts:?}; estimated loads (milli-CPU) of n4..n9: {loads:?}");
}
