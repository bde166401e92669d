//! The extender's figures (docs/benchmarks.md): filter + prioritize per
//! request through the HTTP front at 1,000 and 5,000 nodes, with
//! `nodeCacheCapable` (names) and with whole Node objects; the cache's
//! memory per 1,000 nodes; watch events applied per second.
//!
//!   cargo run --release -p qoslet-scheduler --example bench

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use qoslet_kube_api::view::NodeMetricView;
use qoslet_kube_api::view::{NodeView, PodView};
use qoslet_scheduler::args::Args;
use qoslet_scheduler::extender::Extender;
use qoslet_scheduler::facts::{assigned, metric_facts, node_facts, pod_facts};
use qoslet_scheduler::serve::{serve, Front};
use qoslet_scheduler::watch::{now_ms, Status};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PODS_PER_NODE: usize = 20;

fn node(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": format!("node-{i:05}"), "uid": format!("n-{i}"),
            "labels": {"kubernetes.io/hostname": format!("node-{i:05}"), "kubernetes.io/os": "linux",
                       "topology.kubernetes.io/zone": "zone-a", "node.kubernetes.io/instance-type": "m5.4xlarge"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"podCIDR": "10.0.0.0/24", "providerID": format!("aws:///zone-a/i-{i:016x}")},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"},
                   "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"},
                   "conditions": (0..5).map(|c| json!({"type": format!("Cond{c}"), "status": "False",
                        "lastHeartbeatTime": "2026-12-07T10:00:00Z", "lastTransitionTime": "2026-12-07T10:00:00Z",
                        "reason": "KubeletHasSufficientMemory", "message": "kubelet has sufficient memory available"})).collect::<Vec<_>>(),
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": format!("node-{i:05}")}],
                   "nodeInfo": {"kubeletVersion": "v1.33.0", "containerRuntimeVersion": "containerd://1.7.24",
                                "osImage": "Debian GNU/Linux 13", "kernelVersion": "6.12.0", "architecture": "amd64",
                                "operatingSystem": "linux", "machineID": "0", "systemUUID": "0", "bootID": "0",
                                "kubeProxyVersion": "", "containerRuntimeVersion2": ""},
                   "images": (0..10).map(|k| json!({"names": [format!("registry.example/app-{k}:v1")], "sizeBytes": 12345678})).collect::<Vec<_>>()}})
}

fn pod_name(i: usize, k: usize) -> String {
    format!("app-{i}-{k}")
}

fn metric(i: usize) -> Value {
    let pods: Vec<Value> = (0..PODS_PER_NODE)
        .map(|k| {
            json!({"namespace": "default", "name": pod_name(i, k), "priority": "koord-prod",
            "podUsage": {"resources": {"cpu": "150m", "memory": "300Mi"}}})
        })
        .collect();
    json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric",
        "metadata": {"name": format!("node-{i:05}")},
        "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 60}},
        "status": {"updateTime": k8s_openapi::jiff::Timestamp::from_millisecond(now_ms()).unwrap().to_string(),
            "nodeMetric": {"nodeUsage": {"resources": {"cpu": format!("{}m", 2000 + (i % 7) * 700), "memory": "20Gi"}},
                "systemUsage": {"resources": {"cpu": "300m", "memory": "2Gi"}},
                "aggregatedNodeUsages": [{"duration": "5m0s", "usage": {"p95": {"resources": {"cpu": "5", "memory": "22Gi"}}}}]},
            "podsMetric": pods}})
}

fn pod(i: usize, k: usize, node: Option<&str>) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(i, k), "namespace": "default", "uid": format!("uid-{i}-{k}"),
            "labels": {"app": "web"}, "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": true}]},
        "spec": {"containers": [{"name": "main", "image": "registry.example/web:v1",
            "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}],
            "priority": 9500},
        "status": {"phase": "Running"}});
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    p
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Fills the cache as the watches would: every object decoded from JSON.
fn fill(ext: &Extender, nodes: usize) {
    let args = Args::default();
    let mut c = ext.cache.write().unwrap();
    for i in 0..nodes {
        let n: NodeView = serde_json::from_value(node(i)).unwrap();
        c.set_node(n.metadata.name.clone().unwrap(), node_facts(&n));
        let m: NodeMetricView = serde_json::from_value(metric(i)).unwrap();
        c.set_metric(&format!("node-{i:05}"), metric_facts(&m));
        for k in 0..PODS_PER_NODE {
            let name = format!("node-{i:05}");
            let p: PodView = serde_json::from_value(pod(i, k, Some(&name))).unwrap();
            let f = pod_facts(&p);
            c.set_pod(&f.uid.clone(), &name, assigned(&p, &f, &args, now_ms()));
        }
    }
}

async fn post(addr: SocketAddr, path: &str, body: &[u8]) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    assert!(
        out.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&out[..out.len().min(300)])
    );
    out
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// The cache's memory, measured in a process of its own (this one run
/// again): the resident set before and after filling the cache, each object
/// decoded and dropped in turn as the watches do.
fn memory(nodes: usize) -> f64 {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .env("QOSLET_BENCH_MEMORY", nodes.to_string())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(f64::NAN)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Ok(n) = std::env::var("QOSLET_BENCH_MEMORY") {
        let nodes: usize = n.parse().unwrap();
        // the decoders' and the allocator's own start-up first
        fill(&Extender::new(Args::default()), 1);
        let before = rss_kib();
        let ext = Extender::new(Args::default());
        fill(&ext, nodes);
        println!("{}", rss_kib().saturating_sub(before) as f64 / 1024.0);
        std::hint::black_box(&ext);
        return;
    }
    println!("qoslet scheduler extender: {PODS_PER_NODE} pods per node, NodeMetrics with podsMetric and a p95 window");
    for nodes in [1_000usize, 5_000] {
        let mib = memory(nodes);
        let ext = Arc::new(Extender::new(Args::default()));
        let t = Instant::now();
        fill(&ext, nodes);
        let fill_s = t.elapsed().as_secs_f64();
        let events = nodes * (2 + PODS_PER_NODE);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_tx, rx) = tokio::sync::watch::channel(false);
        let front = Arc::new(Front::new(
            ext.clone(),
            Arc::new(Status::default()),
            256 << 20,
        ));
        tokio::spawn(serve(listener, front, rx));
        let names: Vec<String> = (0..nodes).map(|i| format!("node-{i:05}")).collect();
        let objects: Vec<Value> = (0..nodes).map(node).collect();
        for (mode, nodes_field) in [
            ("NodeNames", json!({"NodeNames": names})),
            ("Nodes", json!({"Nodes": {"items": objects}})),
        ] {
            let rounds = if mode == "Nodes" { 40 } else { 200 };
            let mut f_ms = Vec::new();
            let mut p_ms = Vec::new();
            let mut body_bytes = 0;
            for r in 0..rounds {
                let mut req = nodes_field.clone();
                req["Pod"] = pod(9_999_999, r, None);
                let body = serde_json::to_vec(&req).unwrap();
                body_bytes = body.len();
                let t = Instant::now();
                post(addr, "/filter", &body).await;
                f_ms.push(t.elapsed().as_secs_f64() * 1e3);
                let t = Instant::now();
                post(addr, "/prioritize", &body).await;
                p_ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            println!(
                "{nodes:>5} nodes, {mode:<9} ({:>6.1} KiB a request): filter p50 {:>7.3} ms p99 {:>7.3} ms | prioritize p50 {:>7.3} ms p99 {:>7.3} ms",
                body_bytes as f64 / 1024.0,
                pct(&mut f_ms.clone(), 0.5), pct(&mut f_ms, 0.99), pct(&mut p_ms.clone(), 0.5), pct(&mut p_ms, 0.99)
            );
        }
        println!(
            "{nodes:>5} nodes: cache filled from {events} objects in {:.2} s ({:.0} events/s decoded and applied); its memory (a process of its own) RSS +{mib:.1} MiB ({:.2} MiB per 1,000 nodes)",
            fill_s, events as f64 / fill_s, mib / nodes as f64 * 1000.0
        );
        drop(ext);
    }
}
