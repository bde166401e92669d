//! Koordinator parity (issue 14) on the real containerd 1.6 + runc and this
//! machine's real cgroup v1 (needs root and the test bed): a node configured
//! for Koordinator gets the same effect through qoslet.

use std::time::Duration;

use k8s_cri::v1 as cri;
use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::{
    cgroup_v1, container_config, pod_config, Cleanup, Cri, Testbed, SLEEP_LOOP,
};
use qoslet_integration::{channel, eventually, free_port, scratch, unique};
use qoslet_proto::admin::{admin_client::AdminClient, GetPlanRequest};

/// Koordinator's webhook re-marshals quantities, so one core of batch-cpu
/// arrives as `"1k"`; koordlet reads every quantity with `Quantity.Value()`
/// (batch-cpu in milli-cores: `"2"` is two milli-cores). A BE pod whose
/// annotation is written that way gets its batch resources on its real
/// cgroups, with Koordinator's whole default NodeSLO as qoslet's policy (what
/// qoslet does not implement listed by `qoslet plan`, not refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_canonical_quantities_and_koordinators_default_node_slo() {
    let tb = Testbed::main();
    let dir = scratch("parity-quantities");
    let node_slo = include_str!("../../hooks/tests/fixtures/koordinator-default-nodeslo.json");
    let port = free_port();
    let q = QosletProcess::with_config(
        &dir,
        &tb.sock,
        &format!("policy: {node_slo}\n"),
        &[&format!("--metrics-listen=127.0.0.1:{port}")],
    );
    let mut via = Cri::connect(&q.sock).await;
    let mut cleanup = Cleanup::new(&tb.sock);

    let spec = r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"128Mi"},"limits":{"kubernetes.io/batch-cpu":"2k","kubernetes.io/batch-memory":"128Mi"}},"side":{"requests":{"kubernetes.io/batch-cpu":"2"},"limits":{"kubernetes.io/batch-cpu":"1.5k","kubernetes.io/batch-memory":"64Mi"}}}}"#;
    let name = unique("be-quantities");
    let cgp = tb.cgroup_parent_in("besteffort", &name);
    let mut cfg = pod_config(&name, &cgp);
    cfg.annotations.insert(
        "node.koordinator.sh/extended-resource-spec".into(),
        spec.into(),
    );
    let pod = via.run_pod(&cfg).await.unwrap();
    cleanup.pods.push(pod.clone());
    cleanup.cgroups.push(cgp.clone());
    let besteffort = cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_shares: 2,
        ..Default::default()
    };
    let mut ids = Vec::new();
    for c in ["app", "side"] {
        let id = via
            .create(
                &pod,
                &cfg,
                container_config(c, SLEEP_LOOP, Some(besteffort.clone())),
            )
            .await
            .unwrap();
        via.start(&id).await.unwrap();
        ids.push(id);
    }
    let (app, side) = (format!("{cgp}/{}", ids[0]), format!("{cgp}/{}", ids[1]));
    // "1k" requested = one core: 1024 shares; "2k" limit = two cores
    assert_eq!(cgroup_v1("cpu", &app, "cpu.shares"), "1024");
    assert_eq!(cgroup_v1("cpu", &app, "cpu.cfs_quota_us"), "200000");
    assert_eq!(
        cgroup_v1("memory", &app, "memory.limit_in_bytes"),
        (128u64 << 20).to_string()
    );
    // "2" = two milli-cores (kubelet's minimum shares), "1.5k" = 1.5 cores
    assert_eq!(cgroup_v1("cpu", &side, "cpu.shares"), "2");
    assert_eq!(cgroup_v1("cpu", &side, "cpu.cfs_quota_us"), "150000");
    // the pod: the sum of its containers' limits (3.5 cores), within this 2-CPU node
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let n = qoslet_cgroups::cgroup::cpu_count(&cpus) as i64;
    assert_eq!(
        cgroup_v1("cpu", &cgp, "cpu.cfs_quota_us"),
        (350_000.min(n * 100_000)).to_string()
    );
    assert_eq!(
        cgroup_v1("memory", &cgp, "memory.limit_in_bytes"),
        (192u64 << 20).to_string()
    );
    // Koordinator's default: cpuQOS off, so no SCHED_IDLE
    assert_eq!(cgroup_v1("cpu", &cgp, "cpu.idle"), "0");

    // qoslet plan lists what of the NodeSLO qoslet does not act on
    let plan = eventually(
        "the engine's first tick",
        Duration::from_secs(15),
        || async {
            let p = AdminClient::new(channel(&q.admin).await)
                .get_plan(GetPlanRequest::default())
                .await
                .ok()?
                .into_inner();
            (p.tick > 0).then_some(p)
        },
    )
    .await;
    let listed = plan.not_implemented.join("\n");
    for f in [
        "resourceQOSStrategy.policies.netQOSPolicy",
        "resourceQOSStrategy.beClass.networkQOS",
    ] {
        assert!(listed.contains(f), "{f} not in:\n{listed}");
    }
    assert!(plan.policy_error.is_empty(), "{}", plan.policy_error);
    assert!(q.log_text().contains("not implemented by qoslet"));
}

/// Review of issue 15 item 7: with a CFS burst equal to the quota (what the
/// engine sets), kubelet's in-place resize down (UpdateContainerResources with
/// a smaller quota) would meet the kernel's EINVAL in runc; qoslet lowers the
/// burst first, so the update goes through on the real cgroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_resize_down_below_a_burst_goes_through() {
    let tb = Testbed::main();
    let dir = scratch("parity-resize");
    let q = QosletProcess::start(&dir, &tb.sock);
    let mut via = Cri::connect(&q.sock).await;
    let mut cleanup = Cleanup::new(&tb.sock);
    let name = unique("resize");
    let cgp = tb.cgroup_parent_in("burstable", &name);
    let cfg = pod_config(&name, &cgp);
    let pod = via.run_pod(&cfg).await.unwrap();
    cleanup.pods.push(pod.clone());
    cleanup.cgroups.push(cgp.clone());
    let res = |quota| cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: quota,
        cpu_shares: 1024,
        ..Default::default()
    };
    let id = via
        .create(
            &pod,
            &cfg,
            container_config("app", SLEEP_LOOP, Some(res(200_000))),
        )
        .await
        .unwrap();
    via.start(&id).await.unwrap();
    let ccg = format!("{cgp}/{id}");
    let burst = format!("/sys/fs/cgroup/cpu{ccg}/cpu.cfs_burst_us");
    std::fs::write(&burst, "200000").expect("this kernel has cpu.cfs_burst_us");
    via.rt
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: id.clone(),
            linux: Some(res(100_000)),
            ..Default::default()
        })
        .await
        .expect("the resize down goes through");
    assert_eq!(cgroup_v1("cpu", &ccg, "cpu.cfs_quota_us"), "100000");
    assert_eq!(cgroup_v1("cpu", &ccg, "cpu.cfs_burst_us"), "100000");
}

/// Issue 16 item 2: the policy has one source that the hooks follow on their
/// own, so a changed `policy:` reaches them with metrics and the QoS engine
/// off (it used to reach them only through the engine's loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_policy_reload_reaches_the_hooks_with_the_engine_off() {
    let tb = Testbed::main();
    let dir = scratch("reload-no-engine");
    let yaml = |be_cpu_qos: bool| {
        format!(
            "metrics: false\nqosEngine:\n  enable: false\npolicy:\n  resourceQOSStrategy:\n    beClass:\n      cpuQOS:\n        enable: {be_cpu_qos}\n"
        )
    };
    let q = QosletProcess::with_config(&dir, &tb.sock, &yaml(false), &[]);
    let mut via = Cri::connect(&q.sock).await;
    let mut cleanup = Cleanup::new(&tb.sock);
    let be_pod = |tag: &str| {
        let name = unique(tag);
        let cgp = tb.cgroup_parent_in("besteffort", &name);
        (pod_config(&name, &cgp), cgp)
    };
    let (cfg1, cgp1) = be_pod("reload-before");
    cleanup.cgroups.push(cgp1.clone());
    let p1 = via.run_pod(&cfg1).await.unwrap();
    cleanup.pods.push(p1);
    assert_eq!(
        cgroup_v1("cpu", &cgp1, "cpu.idle"),
        "0",
        "cpuQOS off: not idle"
    );
    std::fs::write(dir.join("qoslet.yaml"), yaml(true)).unwrap();
    eventually("the policy reloaded", Duration::from_secs(10), || async {
        q.log_text().contains("policy reloaded").then_some(())
    })
    .await;
    // the hooks take the new policy from a subscriber on the serving
    // runtime, a moment after the log line: a new BE pod until one gets it
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (cfg2, cgp2) = be_pod("reload-after");
        cleanup.cgroups.push(cgp2.clone());
        let p2 = via.run_pod(&cfg2).await.unwrap();
        cleanup.pods.push(p2);
        let idle = cgroup_v1("cpu", &cgp2, "cpu.idle");
        if idle == "1" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reloaded policy (BE cpuQOS on: SCHED_IDLE where there is no bvt) not in force at the hooks: cpu.idle {idle}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
