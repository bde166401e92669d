//! The cluster side with a real containerd + runc (the test bed's 1.6 on
//! cgroup v1, or the VM guest's on v2 + systemd), and
//! the in-process fake API server (real HTTP/JSON list, watch and the
//! Eviction API; no real kube-apiserver can run on these machines): under
//! real memory pressure qoslet evicts through the Eviction API, a pod a
//! PodDisruptionBudget protects survives (never stopped through CRI) while
//! the next candidate is evicted, each with its Event.

use std::time::Duration;

use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::{container_config, pod_config, Cleanup, Cri, Knob, Testbed};
use qoslet_integration::{eventually, free_port, http_get, scratch, unique};
use qoslet_kube_fake::FakeApiServer;
use serde_json::{json, Value};

const PODS: &str = "/api/v1/pods";

/// The eviction test evicts from the test bed's whole kubepods: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The pod as the API server would have it on node-1 (the UID the sandbox
/// metadata carries, BestEffort, priority 0).
fn api_pod(name: &str) -> Value {
    json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "qoslet-e2e", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-04T10:00:00Z"},
        "spec": {"nodeName": "node-1", "priority": 0, "terminationGracePeriodSeconds": 3,
                 "containers": [{"name": "hold", "image": "busybox", "resources": {}}]},
        "status": {"phase": "Running", "qosClass": "BestEffort"}
    })
}

/// A BE pod through qoslet holding `mib` MiB.
async fn holding(
    through: &mut Cri,
    tb: &Testbed,
    cleanup: &mut Cleanup,
    name: &str,
    mib: u64,
) -> (String, String) {
    let parent = tb.cgroup_parent_in("besteffort", name);
    let id = through.run_pod(&pod_config(name, &parent)).await.unwrap();
    cleanup.pods.push(id.clone());
    cleanup.cgroups.push(parent.clone());
    let script = format!(
        "x=$(head -c {} /dev/zero | tr '\\0' a); while true; do sleep 0.2; done",
        mib << 20
    );
    let c = through
        .create(
            &id,
            &pod_config(name, &parent),
            container_config("hold", &script, None),
        )
        .await
        .unwrap();
    through.start(&c).await.unwrap();
    (id, parent)
}

/// Issue 31: two BE pods press the node (260 and 110 MiB of a 640 MiB node
/// with `memory.available: 300Mi` hard); kubelet's ranking picks the larger,
/// which a PodDisruptionBudget protects: the Eviction API refuses it (429),
/// it keeps running (no CRI stop), an EvictionRefused Event is recorded and
/// the smaller is evicted through the API with its UID (an Evicted Event),
/// and over the next 20 s of lasting pressure (no kubelet stops it) neither
/// is asked for again. The pods' watch joined them by UID first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_pressure_evicts_through_the_api_and_a_budget_protects() {
    let _one = ONE_AT_A_TIME.lock().await;
    let tb = Testbed::main();
    let kubepods = tb.kubepods_cg();
    let fake = FakeApiServer::start().await;
    let dir = scratch("cluster-evict");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kubeconfig"), fake.kubeconfig()).unwrap();
    let big_name = unique("api-big");
    let small_name = unique("api-small");
    fake.apply(PODS, api_pod(&big_name));
    fake.apply(PODS, api_pod(&small_name));
    fake.protect("qoslet-e2e", &big_name);
    let port = free_port();
    // no threshold until both pods hold their memory (the larger must be
    // the larger when pressure is met), then set by editing the file
    let yaml = format!(
        "kubernetes:\n  enable: true\n  kubeconfig: {}\n  nodeName: node-1\n\
         eviction:\n  memoryCapacity: 640Mi\n  cgroupScope: {kubepods}\n  enforceNodeAllocatable: false\n  \
         evictionPressureTransitionPeriod: 30s\n",
        dir.join("kubeconfig").display()
    );
    let listen = format!("--metrics-listen=127.0.0.1:{port}");
    let q = QosletProcess::with_config(&dir, &tb.sock, &yaml, &[listen.as_str()]);
    let mut cleanup = Cleanup::new(&tb.sock);
    let mut direct = Cri::connect(&tb.sock).await;
    let mut through = Cri::connect(&q.sock).await;
    let (big, big_cg) = holding(&mut through, &tb, &mut cleanup, &big_name, 260).await;
    let (small, small_cg) = holding(&mut through, &tb, &mut cleanup, &small_name, 110).await;
    eventually(
        "both pods hold their memory",
        Duration::from_secs(60),
        || {
            let (b, s) = (tb.pod_cg(&big_cg), tb.pod_cg(&small_cg));
            let tb = tb.clone();
            async move {
                (tb.memory_usage_mib(&b) >= 255 && tb.memory_usage_mib(&s) >= 105).then_some(())
            }
        },
    )
    .await;
    std::fs::write(
        dir.join("qoslet.yaml"),
        format!("{yaml}  evictionHard:\n    memory.available: 300Mi\n"),
    )
    .unwrap();
    let evicted = eventually(
        "the smaller pod evicted through the API",
        Duration::from_secs(90),
        || {
            let f = fake.clone();
            let uid = format!("uid-{small_name}");
            async move {
                f.evictions()
                    .into_iter()
                    .find(|e| e["deleteOptions"]["preconditions"]["uid"] == json!(uid))
            }
        },
    )
    .await;
    // a hard threshold: kubelet kills without the pod's grace period; qoslet
    // asks for 1 s, not 0 (0 through the API is a force deletion, before
    // kubelet has stopped anything)
    assert_eq!(evicted["deleteOptions"]["gracePeriodSeconds"], json!(1));
    assert!(
        fake.evictions()
            .iter()
            .all(|e| e["metadata"]["name"] != json!(big_name)),
        "the protected pod's eviction was accepted"
    );
    // the Eviction API deletes; kubelet (absent here) would stop: qoslet
    // stops neither pod through CRI
    assert!(
        direct.sandbox_ready(&big).await,
        "the protected pod was stopped"
    );
    assert!(
        direct.sandbox_ready(&small).await,
        "the evicted pod was stopped through CRI"
    );
    // the Events are recorded after the eviction, off its path (a slow
    // Events API never holds an eviction): they arrive shortly after it
    let on = |name: &str, reason: &str| {
        fake.list("/api/v1/events")
            .iter()
            .any(|e| e["involvedObject"]["name"] == json!(name) && e["reason"] == json!(reason))
    };
    eventually("both Events recorded", Duration::from_secs(15), || {
        let both = on(&big_name, "EvictionRefused") && on(&small_name, "Evicted");
        async move { both.then_some(()) }
    })
    .await;
    // no kubelet here: the evicted pod keeps running with its deletion
    // requested, the pressure stays. qoslet follows the pod it evicted (not
    // evicted again while it terminates) and passes the protected one over
    // (no second refusal, no second Event)
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(fake.evictions().len(), 1, "{:?}", fake.evictions());
    let events = fake.list("/api/v1/events");
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(direct.sandbox_ready(&big).await && direct.sandbox_ready(&small).await);
    let (_, metrics) = http_get(port, "/metrics");
    assert!(
        metrics.contains("qoslet_cluster_evictions_total{outcome=\"refused\"}")
            && !metrics.contains("qoslet_cluster_evictions_total{outcome=\"refused\"} 0\n"),
        "{metrics}"
    );
    assert!(metrics.contains("qoslet_cluster_watch_state{watch=\"pods\",state=\"ok\"} 1"));
    drop(q);
    drop(cleanup);
}

/// This node's NodeSLO with BE `cpuQOS` off, then turned on mid-run.
fn be_cpu_qos_nodeslo(enable: bool) -> Value {
    json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
           "metadata": {"name": "node-1"},
           "spec": {"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": enable}}}}})
}

/// Issue 31: a NodeSLO changed mid-run reaches the hooks and the engine: BE
/// `cpuQOS` off, a BE pod runs with `cpu.idle` 0; the NodeSLO turns it on
/// (the file says nothing of it): the engine puts SCHED_IDLE on the running
/// BE pod, and a BE pod created now gets it at its runtime hook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_nodeslo_edit_reaches_the_hooks_and_the_engine() {
    let _one = ONE_AT_A_TIME.lock().await;
    let tb = Testbed::main();
    let fake = FakeApiServer::start().await;
    let dir = scratch("cluster-nodeslo");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kubeconfig"), fake.kubeconfig()).unwrap();
    const NODESLOS: &str = "/apis/slo.koordinator.sh/v1alpha1/nodeslos";
    fake.apply(NODESLOS, be_cpu_qos_nodeslo(false));
    let yaml = format!(
        "kubernetes:\n  enable: true\n  kubeconfig: {}\n  nodeName: node-1\n  reportNodeMetric: false\n",
        dir.join("kubeconfig").display()
    );
    let q = QosletProcess::with_config(&dir, &tb.sock, &yaml, &[]);
    let mut cleanup = Cleanup::new(&tb.sock);
    let mut through = Cri::connect(&q.sock).await;
    // the NodeSLO is listed before the first pod (the watch starts with qoslet)
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let idle = |parent: String| tb.cg(&tb.pod_cg(&parent), Knob::CpuIdle);
    let be = |name: String| {
        let parent = tb.cgroup_parent_in("besteffort", &name);
        (name, parent)
    };
    let (n1, p1) = be(unique("slo-be1"));
    let id1 = through.run_pod(&pod_config(&n1, &p1)).await.unwrap();
    cleanup.pods.push(id1.clone());
    cleanup.cgroups.push(p1.clone());
    let c = through
        .create(
            &id1,
            &pod_config(&n1, &p1),
            container_config("app", qoslet_integration::testbed::SLEEP_LOOP, None),
        )
        .await
        .unwrap();
    through.start(&c).await.unwrap();
    assert_eq!(idle(p1.clone()), "0", "BE cpuQOS is off in the NodeSLO");
    // turned on in the cluster
    fake.apply(NODESLOS, be_cpu_qos_nodeslo(true));
    eventually(
        "the engine puts SCHED_IDLE on the running BE pod",
        Duration::from_secs(20),
        || {
            let p = p1.clone();
            async move { (idle(p) == "1").then_some(()) }
        },
    )
    .await;
    let (n2, p2) = be(unique("slo-be2"));
    let id2 = through.run_pod(&pod_config(&n2, &p2)).await.unwrap();
    cleanup.pods.push(id2.clone());
    cleanup.cgroups.push(p2.clone());
    assert_eq!(
        idle(p2.clone()),
        "1",
        "the hook at RunPodSandbox follows the NodeSLO"
    );
    drop(q);
    drop(cleanup);
}

/// Issue 46: the Node's batch-cpu falls when an LS pod starts burning CPU,
/// with real containerd and this node's real cgroups: qoslet
/// (`batchResources: auto`, Koordinator's ConfigMap turning co-location on)
/// writes the two keys from its own figures, then writes again once the LS
/// pod's usage shows in them; `qoslet batch-resources` asks the running
/// qoslet and names the pod. The Node's capacity is the fake's (64 cores),
/// with a 10 % reclaim threshold so that one core is over the 10 % move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_batch_cpu_falls_when_an_ls_pod_burns_cpu() {
    let _one = ONE_AT_A_TIME.lock().await;
    let tb = Testbed::main();
    let fake = FakeApiServer::start().await;
    let dir = scratch("cluster-batch");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kubeconfig"), fake.kubeconfig()).unwrap();
    const NODES: &str = "/api/v1/nodes";
    fake.apply(NODES, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"},
        "status": {"capacity": {"cpu": "64", "memory": "256Gi"}, "allocatable": {"cpu": "64", "memory": "256Gi"}}}));
    fake.apply("/api/v1/namespaces/koordinator-system/configmaps", json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"},
        "data": {"colocation-config": "{\"enable\": true, \"cpuReclaimThresholdPercent\": 10, \"memoryReclaimThresholdPercent\": 10}"}}));
    let yaml = format!(
        "kubernetes:\n  enable: true\n  kubeconfig: {}\n  nodeName: node-1\n  reportNodeMetric: false\n  batchResources: auto\n  reportInterval: 30s\n",
        dir.join("kubeconfig").display()
    );
    let q = QosletProcess::with_config(&dir, &tb.sock, &yaml, &[]);
    let admin = q.admin.clone();
    let mut cleanup = Cleanup::new(&tb.sock);
    let mut through = Cri::connect(&q.sock).await;
    let batch_cpu = || {
        fake.get(NODES, "node-1")
            .and_then(|n| {
                n["status"]["allocatable"]["kubernetes.io/batch-cpu"]
                    .as_str()
                    .map(str::to_string)
            })
            .and_then(|v| v.parse::<i64>().ok())
    };
    let before = eventually(
        "the first batch-cpu on the Node",
        Duration::from_secs(60),
        || {
            let v = batch_cpu();
            async move { v }
        },
    )
    .await;
    // 64 cores - 57.6 (the 90 % margin) - the system's use: at most 6400
    assert!((1..=6400).contains(&before), "{before}");
    // an LS (Burstable) pod burning a core
    let name = unique("ls-burn");
    let parent = tb.cgroup_parent_in("burstable", &name);
    let id = through.run_pod(&pod_config(&name, &parent)).await.unwrap();
    cleanup.pods.push(id.clone());
    cleanup.cgroups.push(parent.clone());
    let c = through
        .create(
            &id,
            &pod_config(&name, &parent),
            container_config("burn", "while :; do :; done", None),
        )
        .await
        .unwrap();
    through.start(&c).await.unwrap();
    let after = eventually(
        "batch-cpu falls by the burning core",
        Duration::from_secs(100),
        || {
            let v = batch_cpu().filter(|v| *v <= before - 500);
            async move { v }
        },
    )
    .await;
    // the running qoslet explains it, and names the pod (its last write is
    // recorded once the API server answered, a moment after the Node shows it)
    let explain = || {
        let o = std::process::Command::new(qoslet_integration::process::qoslet_bin())
            .args([
                "batch-resources",
                "--admin",
                &format!("unix://{}", admin.display()),
                "-o",
                "json",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<Value>(&o.stdout).unwrap()
    };
    let v = eventually("the write explained", Duration::from_secs(10), || {
        let v = explain();
        let moved = v["lastWrite"]["why"]
            .as_str()
            .is_some_and(|w| w.contains("batch-cpu moves"));
        async move { moved.then_some(v) }
    })
    .await;
    assert_eq!(v["state"], "advertising", "{v:#}");
    let pods = v["terms"]["highPriorityPods"].as_array().unwrap();
    assert!(
        pods.iter()
            .any(|p| p["pod"].as_str().unwrap().ends_with(&name)),
        "{v:#}"
    );
    let text = std::process::Command::new(qoslet_integration::process::qoslet_bin())
        .args(["status", "--admin", &format!("unix://{}", admin.display())])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("batch resources: advertising; last write"),
        "{text}"
    );
    eprintln!("batch-cpu {before} -> {after} with an LS pod burning a core");
    drop(q);
    drop(cleanup);
}
