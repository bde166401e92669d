//! NRI mode on the real containerd 1.7.24 (NRI v0.6.1) + runc, on this
//! machine's cgroup v1: the same pod spec through the proxy and through the
//! plugin gets the same cgroup files; kubelet's updates keep them; the plugin
//! survives runtime and agent restarts. Each test has a private containerd
//! 1.7 instance (an NRI plugin sees every pod of its runtime).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_cri::v1 as cri;
use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::{
    self, cgroup_v1, container_config, pod_config, Cri, Testbed, SLEEP_LOOP,
};
use qoslet_integration::{eventually, lazy_channel, scratch, unique};
use qoslet_proto::admin::{admin_client::AdminClient, GetStatusRequest, ListPodsRequest};

const SPEC: &str = r#"{"containers":{"batch":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"128Mi"}}}}"#;
const PODS: &str = "/api/v1/pods";
const CONFIG: &str =
    "policy:\n  resourceQOSStrategy:\n    beClass:\n      cpuQOS: {enable: true}\n";

fn classed(name: &str, cgroup_parent: &str, class: &str) -> cri::PodSandboxConfig {
    let mut p = pod_config(name, cgroup_parent);
    p.labels
        .insert("koordinator.sh/qosClass".into(), class.into());
    p.annotations.insert(
        "node.koordinator.sh/extended-resource-spec".into(),
        SPEC.into(),
    );
    p
}

fn besteffort() -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_shares: 2,
        ..Default::default()
    }
}

/// A BE pod with batch resources and its one container, started through `cri`.
async fn be_pod(cri: &mut Cri, tb: &Testbed, name: &str) -> (String, String, String) {
    let cgp = tb.cgroup_parent_in("besteffort", name);
    let cfg = classed(name, &cgp, "BE");
    run_batch_pod(cri, cfg, cgp).await
}

/// `cfg` and its one container `batch` (kubelet's BestEffort resources),
/// started through `cri`: the pod's id, the container's, its cgroup parent.
async fn run_batch_pod(
    cri: &mut Cri,
    cfg: cri::PodSandboxConfig,
    cgp: String,
) -> (String, String, String) {
    let pod = cri.run_pod(&cfg).await.unwrap();
    let ctr = cri
        .create(
            &pod,
            &cfg,
            container_config("batch", SLEEP_LOOP, Some(besteffort())),
        )
        .await
        .unwrap();
    cri.start(&ctr).await.unwrap();
    (pod, ctr, cgp)
}

/// The files qoslet decides for a BE pod, by name (pod-level and container-level).
fn be_files(cgp: &str, ctr: &str) -> BTreeMap<&'static str, String> {
    let cg = format!("{cgp}/{ctr}");
    BTreeMap::from([
        (
            "container cpu.cfs_quota_us",
            cgroup_v1("cpu", &cg, "cpu.cfs_quota_us"),
        ),
        (
            "container cpu.cfs_period_us",
            cgroup_v1("cpu", &cg, "cpu.cfs_period_us"),
        ),
        ("container cpu.shares", cgroup_v1("cpu", &cg, "cpu.shares")),
        ("container cpu.idle", cgroup_v1("cpu", &cg, "cpu.idle")),
        (
            "container memory.limit_in_bytes",
            cgroup_v1("memory", &cg, "memory.limit_in_bytes"),
        ),
        ("pod cpu.idle", cgroup_v1("cpu", cgp, "cpu.idle")),
        (
            "pod cpu.cfs_quota_us",
            cgroup_v1("cpu", cgp, "cpu.cfs_quota_us"),
        ),
        (
            "pod memory.limit_in_bytes",
            cgroup_v1("memory", cgp, "memory.limit_in_bytes"),
        ),
    ])
}

fn expected_be() -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("container cpu.cfs_quota_us", "100000".to_string()),
        ("container cpu.cfs_period_us", "100000".to_string()),
        ("container cpu.shares", "512".to_string()),
        ("container cpu.idle", "0".to_string()),
        (
            "container memory.limit_in_bytes",
            (128u64 << 20).to_string(),
        ),
        ("pod cpu.idle", "1".to_string()),
        ("pod cpu.cfs_quota_us", "100000".to_string()),
        ("pod memory.limit_in_bytes", (128u64 << 20).to_string()),
    ])
}

async fn counters(q: &QosletProcess) -> qoslet_proto::admin::GetStatusResponse {
    AdminClient::new(lazy_channel(&q.admin))
        .get_status(GetStatusRequest {})
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_nri_mode_applies_what_proxy_mode_applies() {
    let tb = Testbed::start_instance("nri", "1.7");
    let mut cleanup = testbed::Cleanup::new(&tb.sock);

    // proxy mode: the reference
    let dir = scratch("nri-proxy");
    let p = QosletProcess::with_config(&dir, &tb.sock, CONFIG, &[]);
    let mut via = Cri::connect(&p.sock).await;
    let name = unique("be-proxy");
    let (pod, ctr, cgp) = be_pod(&mut via, &tb, &name).await;
    cleanup.pods.push(pod.clone());
    cleanup.cgroups.push(cgp.clone());
    let by_proxy = be_files(&cgp, &ctr);
    assert_eq!(by_proxy, expected_be(), "proxy mode");
    drop(via);
    drop(p);

    // NRI mode: the same pod spec straight to containerd, qoslet as its plugin
    let dir = scratch("nri-plugin");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("qoslet.yaml"), CONFIG).unwrap();
    let q = QosletProcess::start_nri(
        &dir,
        &tb.sock,
        &[&format!("--config={}", dir.join("qoslet.yaml").display())],
    );
    q.wait_registered(1).await;
    let mut direct = Cri::connect(&tb.sock).await;
    let name = unique("be-nri");
    let (pod, ctr, cgp) = be_pod(&mut direct, &tb, &name).await;
    cleanup.pods.push(pod.clone());
    cleanup.cgroups.push(cgp.clone());
    let by_nri = be_files(&cgp, &ctr);
    assert_eq!(
        by_nri,
        by_proxy,
        "the same files in both modes\n{}",
        q.log_text()
    );
    // what qoslet recorded (CRI's ContainerStatus does not show NRI
    // adjustments): the pod's class, the container's settings, kubelet's request
    let listed = AdminClient::new(lazy_channel(&q.admin))
        .list_pods(ListPodsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .pods;
    let p = listed
        .iter()
        .find(|p| p.id == pod)
        .expect("the pod in ListPods");
    assert_eq!(
        p.applied.get("class").map(String::as_str),
        Some("BE"),
        "{p:?}"
    );
    let c = p
        .containers
        .iter()
        .find(|c| c.id == ctr)
        .expect("the container");
    assert_eq!(
        c.applied.get("class").map(String::as_str),
        Some("BE"),
        "{c:?}"
    );
    assert_eq!(
        c.requested.as_ref().map(|r| r.cpu_shares),
        Some(2),
        "kubelet's own request"
    );

    // kubelet's periodic update (as kubelet sends it) does not undo the settings
    direct
        .rt
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: ctr.clone(),
            linux: Some(besteffort()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        be_files(&cgp, &ctr),
        expected_be(),
        "after kubelet's update"
    );

    // an LS pod: untouched
    let ls = unique("ls-nri");
    let ls_cgp = tb.cgroup_parent_in("burstable", &ls);
    let ls_cfg = classed(&ls, &ls_cgp, "LS");
    let ls_pod = direct.run_pod(&ls_cfg).await.unwrap();
    cleanup.pods.push(ls_pod.clone());
    cleanup.cgroups.push(ls_cgp.clone());
    let ls_res = cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 1024,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    let ls_ctr = direct
        .create(
            &ls_pod,
            &ls_cfg,
            container_config("batch", SLEEP_LOOP, Some(ls_res)),
        )
        .await
        .unwrap();
    direct.start(&ls_ctr).await.unwrap();
    let lcg = format!("{ls_cgp}/{ls_ctr}");
    assert_eq!(cgroup_v1("cpu", &lcg, "cpu.cfs_quota_us"), "50000");
    assert_eq!(cgroup_v1("cpu", &lcg, "cpu.shares"), "1024");
    assert_eq!(
        cgroup_v1("memory", &lcg, "memory.limit_in_bytes"),
        (64u64 << 20).to_string()
    );
    assert_eq!(cgroup_v1("cpu", &ls_cgp, "cpu.idle"), "0");

    // the admin API tells what the plugin did
    let s = counters(&q).await;
    assert_eq!(s.mode, "nri");
    let c = s.counters.unwrap();
    assert_eq!(c.nri_registrations, 1);
    assert!(c.nri_adjustments >= 1, "{c:?}");
    assert!(
        c.nri_events.get("create_container").copied().unwrap_or(0) >= 2,
        "{c:?}"
    );
    assert_eq!(c.nri_errors, 0, "{c:?}\n{}", q.log_text());
    assert_eq!(c.nri_timeouts, 0);
    assert!(s.backend.unwrap().runtime_version.contains("1.7"));

    direct.remove_pod(&pod).await;
    direct.remove_pod(&ls_pod).await;
    drop(q);
    drop(cleanup);
    tb.down();
}

/// A pod as the API server has it on node-1 whose one container `batch`
/// asks for batch resources in its spec (the ones [`SPEC`] names), with no
/// annotation: no Koordinator webhook copied them.
fn batch_pod_in_spec(name: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "qoslet-e2e", "uid": format!("uid-{name}"),
                     "labels": {"koordinator.sh/qosClass": "BE"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "batch", "image": "busybox",
            "resources": {
                "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"},
                "limits": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "128Mi"}}}]},
        "status": {"phase": "Pending", "qosClass": "BestEffort"}
    })
}

/// The pod of [`batch_pod_in_spec`] through `cri`: labelled BE, no annotation.
async fn spec_only_pod(cri: &mut Cri, tb: &Testbed, name: &str) -> (String, String, String) {
    let cgp = tb.cgroup_parent_in("besteffort", name);
    let mut cfg = pod_config(name, &cgp);
    cfg.labels
        .insert("koordinator.sh/qosClass".into(), "BE".into());
    run_batch_pod(cri, cfg, cgp).await
}

/// Waits until qoslet's pods watch holds `n` pods.
async fn cluster_pods(q: &QosletProcess, n: u64) {
    eventually(
        "the pods watch lists the pods",
        Duration::from_secs(30),
        || async {
            let s = counters(q).await;
            s.cluster
                .iter()
                .any(|w| w.watch == "pods" && w.state == "ok" && w.objects >= n)
                .then_some(())
        },
    )
    .await;
}

/// Issue 46: a BE pod whose batch resources are only in its spec (no
/// Koordinator webhook wrote the `extended-resource-spec` annotation) gets
/// at container create the files the annotation gives, through the proxy
/// and through the plugin, each setting naming the pod spec; a pod the
/// cluster view learns only after its container started gets them from the
/// engine within a tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_batch_resources_from_the_pod_spec_without_the_webhook() {
    let tb = Testbed::start_instance("nrispec", "1.7");
    let mut cleanup = testbed::Cleanup::new(&tb.sock);
    let fake = qoslet_kube_fake::FakeApiServer::start().await;
    let dir = scratch("nri-spec");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kubeconfig"), fake.kubeconfig()).unwrap();
    let config = format!(
        "{CONFIG}kubernetes:\n  enable: true\n  kubeconfig: {}\n  nodeName: node-1\n  reportNodeMetric: false\n",
        dir.join("kubeconfig").display()
    );
    std::fs::write(dir.join("qoslet.yaml"), &config).unwrap();
    let config_flag = format!("--config={}", dir.join("qoslet.yaml").display());
    // what ListPods records of a setting: "value (the rule)"
    let by_spec = |applied: &std::collections::HashMap<String, String>, key: &str, rule: &str| {
        applied
            .get(key)
            .is_some_and(|v| v.contains(rule) && v.contains("(pod spec)"))
    };
    for mode in ["proxy", "nri"] {
        let name = unique(&format!("spec-{mode}"));
        fake.apply(PODS, batch_pod_in_spec(&name));
        let q = if mode == "proxy" {
            QosletProcess::start_with(&dir.join(mode), &tb.sock, &[&config_flag])
        } else {
            let q = QosletProcess::start_nri(&dir.join(mode), &tb.sock, &[&config_flag]);
            q.wait_registered(1).await;
            q
        };
        cluster_pods(&q, 1).await;
        let mut cri = Cri::connect(&q.sock).await;
        let mut direct = Cri::connect(&tb.sock).await;
        let via = if mode == "proxy" {
            &mut cri
        } else {
            &mut direct
        };
        let (pod, ctr, cgp) = spec_only_pod(via, &tb, &name).await;
        cleanup.pods.push(pod.clone());
        cleanup.cgroups.push(cgp.clone());
        assert_eq!(
            be_files(&cgp, &ctr),
            expected_be(),
            "{mode}: at create, from the pod spec\n{}",
            q.log_text()
        );
        let listed = AdminClient::new(lazy_channel(&q.admin))
            .list_pods(ListPodsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .pods;
        let p = listed.iter().find(|p| p.id == pod).expect("the pod");
        let c = p
            .containers
            .iter()
            .find(|c| c.id == ctr)
            .expect("the container");
        assert!(
            by_spec(&c.applied, "cpu.cfs_quota_us", "BE batch-cpu limit 1000m"),
            "{mode}: {c:?}"
        );
        assert!(
            by_spec(
                &p.applied,
                "cpu.cfs_quota_us",
                "BE pod: batch-cpu limits 1000m"
            ),
            "{mode}: {p:?}"
        );
        if mode == "nri" {
            // a pod the cluster view learns late: nothing at create, then the engine's tick
            let late = unique("spec-late");
            let (pod, ctr, cgp) = spec_only_pod(&mut direct, &tb, &late).await;
            cleanup.pods.push(pod.clone());
            cleanup.cgroups.push(cgp.clone());
            assert_eq!(
                cgroup_v1("cpu", &format!("{cgp}/{ctr}"), "cpu.cfs_quota_us"),
                "-1",
                "not known at create: no batch limit"
            );
            fake.apply(PODS, batch_pod_in_spec(&late));
            let t = std::time::Instant::now();
            eventually(
                "the engine applies the spec's batch resources",
                Duration::from_secs(20),
                || {
                    let ok = be_files(&cgp, &ctr) == expected_be();
                    async move { ok.then_some(()) }
                },
            )
            .await;
            eprintln!(
                "late pod: batch limits applied {:?} after the cluster view learned it",
                t.elapsed()
            );
        }
        direct.remove_pod(&pod).await;
        drop(cri);
        drop(q);
    }
    drop(cleanup);
    tb.down();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_nri_plugin_survives_runtime_and_agent_restarts() {
    let tb = Testbed::start_instance("nrirestart", "1.7");
    let mut cleanup = testbed::Cleanup::new(&tb.sock);
    let dir = scratch("nri-restart");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("qoslet.yaml"), CONFIG).unwrap();
    let config = format!("--config={}", dir.join("qoslet.yaml").display());
    let mut q = QosletProcess::start_nri(&dir, &tb.sock, &[&config]);
    q.wait_registered(1).await;
    let mut direct = Cri::connect(&tb.sock).await;

    // more pods than fit one 4 KiB frame of the Synchronize after a restart
    let mut pods = vec![];
    for i in 0..8 {
        let (pod, ctr, cgp) = be_pod(&mut direct, &tb, &unique(&format!("be{i}"))).await;
        cleanup.pods.push(pod.clone());
        cleanup.cgroups.push(cgp.clone());
        pods.push((pod, ctr, cgp));
    }
    for (_, ctr, cgp) in &pods {
        assert_eq!(be_files(cgp, ctr), expected_be());
    }

    // qoslet killed: the runtime carries on without it (fail-open) ...
    q.kill9();
    let (late_pod, late_ctr, late_cgp) = {
        let name = unique("be-late");
        let cgp = tb.cgroup_parent_in("besteffort", &name);
        let cfg = classed(&name, &cgp, "BE");
        let pod = direct
            .run_pod(&cfg)
            .await
            .expect("pods run with the plugin gone");
        let ctr = direct
            .create(
                &pod,
                &cfg,
                container_config("batch", SLEEP_LOOP, Some(besteffort())),
            )
            .await
            .unwrap();
        direct.start(&ctr).await.unwrap();
        (pod, ctr, cgp)
    };
    cleanup.pods.push(late_pod.clone());
    cleanup.cgroups.push(late_cgp.clone());
    assert_eq!(
        cgroup_v1("cpu", &format!("{late_cgp}/{late_ctr}"), "cpu.shares"),
        "2"
    );

    // ... and restarted: Synchronize adopts every pod, the ones it handled
    // unchanged, the one created meanwhile brought to its class
    q.restart();
    q.wait_registered(1).await;
    // (the Synchronize is counted when it arrives; its answer follows)
    let c = eventually(
        "the Synchronize answered",
        Duration::from_secs(10),
        || async {
            let c = counters(&q).await.counters.unwrap();
            (c.nri_updates > 0).then_some(c)
        },
    )
    .await;
    assert_eq!(c.pods, 9, "{c:?}\n{}", q.log_text());
    assert_eq!(c.containers, 9);
    for (_, ctr, cgp) in &pods {
        assert_eq!(
            be_files(cgp, ctr),
            expected_be(),
            "adopted, not rewritten wrongly"
        );
    }
    eventually(
        "the late pod brought to its class",
        Duration::from_secs(10),
        || async { (be_files(&late_cgp, &late_ctr) == expected_be()).then_some(()) },
    )
    .await;
    assert_eq!(c.nri_updates, 1, "only the late container drifted: {c:?}");

    // containerd restarted: the plugin reconnects and the next pod is handled
    tb.stop_containerd();
    tb.start_containerd();
    let mut direct = Cri::connect(&tb.sock).await;
    q.wait_registered(2).await;
    let (pod, ctr, cgp) = be_pod(&mut direct, &tb, &unique("be-after")).await;
    cleanup.pods.push(pod);
    cleanup.cgroups.push(cgp.clone());
    assert_eq!(be_files(&cgp, &ctr), expected_be(), "{}", q.log_text());
    let c = counters(&q).await.counters.unwrap();
    assert!(c.nri_reconnects >= 1, "{c:?}");
    let status = q.sigterm(Duration::from_secs(10));
    assert!(status.success(), "{status:?}\n{}", q.log_text());
    drop(cleanup);
    tb.down();
}

/// Issue 30: eviction in NRI mode, the same loop as in proxy mode: qoslet as
/// containerd 1.7's plugin; a BE pod created straight at containerd that
/// grows past `memory.available` is stopped through the runtime's CRI
/// socket, and while MemoryPressure lasts a new BE pod's first container is
/// refused by the plugin with the figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_nri_mode_evicts_and_refuses_under_memory_pressure() {
    let tb = Testbed::start_instance("nrievict", "1.7");
    let root = qoslet_integration::process::kubelet_cgroup_root(&tb.sock);
    let mut cleanup = testbed::Cleanup::new(&tb.sock);
    let dir = scratch("nri-evict");
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = format!(
        "runtimeEndpoint: unix://{}\neviction:\n  memoryCapacity: 640Mi\n  cgroupScope: {root}/kubepods\n  \
         enforceNodeAllocatable: false\n  evictionHard:\n    memory.available: 300Mi\n  \
         evictionPressureTransitionPeriod: 60s\n",
        tb.sock.display()
    );
    std::fs::write(dir.join("qoslet.yaml"), yaml).unwrap();
    let q = QosletProcess::start_nri(
        &dir,
        &tb.sock,
        &[&format!("--config={}", dir.join("qoslet.yaml").display())],
    );
    q.wait_registered(1).await;
    let mut direct = Cri::connect(&tb.sock).await;
    let name = unique("nri-grow");
    let cgp = tb.cgroup_parent_in("besteffort", &name);
    let cfg = pod_config(&name, &cgp);
    let pod = direct.run_pod(&cfg).await.unwrap();
    cleanup.pods.push(pod.clone());
    cleanup.cgroups.push(cgp.clone());
    let grow = "x=$(head -c 335544320 /dev/zero | tr '\\0' a); while true; do sleep 0.2; done";
    let c = direct
        .create(
            &pod,
            &cfg,
            container_config("grow", grow, Some(besteffort())),
        )
        .await
        .unwrap();
    direct.start(&c).await.unwrap();
    eventually(
        "the BE pod evicted in NRI mode",
        Duration::from_secs(40),
        || {
            let (mut d, pod) = (direct.clone(), pod.clone());
            async move { (!d.sandbox_ready(&pod).await).then_some(()) }
        },
    )
    .await;
    // (qoslet logs the eviction once the runtime's stop returned: the test can see the
    // sandbox stopped a moment before the line is written)
    let logged = || {
        let log = q.log_text();
        log.contains("evicted") && log.contains("memory.available")
    };
    for _ in 0..100 {
        if logged() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(logged(), "no eviction in the log:\n{}", q.log_text());
    // a new BE pod: its sandbox runs (NRI sees no sandbox it could refuse),
    // its first container is refused with the condition and the figures
    let name = unique("nri-late");
    let cgp = tb.cgroup_parent_in("besteffort", &name);
    let cfg = pod_config(&name, &cgp);
    let late = direct.run_pod(&cfg).await.unwrap();
    cleanup.pods.push(late.clone());
    cleanup.cgroups.push(cgp.clone());
    let refused = direct
        .create(
            &late,
            &cfg,
            container_config("app", SLEEP_LOOP, Some(besteffort())),
        )
        .await
        .expect_err("a BE container created under memory pressure");
    assert!(refused.message().contains("MemoryPressure"), "{refused:?}");
    drop(q);
    drop(cleanup);
    tb.down();
}
