//! QoS isolation applied at the runtime hooks, on the real containerd 1.6 +
//! runc and this machine's real cgroup v1 (needs root and the test bed).

use std::collections::HashMap;
use std::time::Duration;

use k8s_cri::v1 as cri;
use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::{
    self, cgroup_v1, container_config, first_disk, pod_config, Cri, Testbed, SLEEP_LOOP,
};
use qoslet_integration::{channel, eventually, scratch, unique};
use qoslet_proto::admin::{admin_client::AdminClient, ListPodsRequest, Pod};

const SPEC: &str = r#"{"containers":{"batch":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"128Mi"}}}}"#;

fn classed(
    name: &str,
    cgroup_parent: &str,
    class: &str,
    annotations: &[(&str, &str)],
) -> cri::PodSandboxConfig {
    let mut p = pod_config(name, cgroup_parent);
    p.labels
        .insert("koordinator.sh/qosClass".into(), class.into());
    for (k, v) in annotations {
        p.annotations.insert(k.to_string(), v.to_string());
    }
    p
}

/// What kubelet sends for a BestEffort container (batch resources are not cpu/memory).
fn besteffort() -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 0,
        cpu_shares: 2,
        memory_limit_in_bytes: 0,
        ..Default::default()
    }
}

async fn pod(admin: &std::path::Path, id: &str) -> Pod {
    let pods = AdminClient::new(channel(admin).await)
        .list_pods(ListPodsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .pods;
    pods.into_iter()
        .find(|p| p.id == id)
        .expect("pod in ListPods")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_be_pod_with_batch_resources_gets_its_class_settings_and_keeps_them() {
    let tb = Testbed::main();
    let dir = scratch("isolation");
    // BE pods get a read limit on this machine's first disk
    let disk = first_disk();
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("qoslet.yaml");
    std::fs::write(
        &config,
        format!(
            "policy:\n  resourceQOSStrategy:\n    beClass:\n      cpuQOS: {{enable: true}}\n      blkioQOS:\n        enable: true\n        blocks:\n          - {{name: {}, type: device, ioCfg: {{readBPS: 10485760, writeIOPS: 300}}}}\n",
            disk.0
        ),
    )
    .unwrap();
    let mut q =
        QosletProcess::start_with(&dir, &tb.sock, &[&format!("--config={}", config.display())]);
    let mut via = Cri::connect(&q.sock).await;

    // a BE pod with batch resources
    let be = unique("be");
    let be_cgp = tb.cgroup_parent_in("besteffort", &be);
    let be_cfg = classed(
        &be,
        &be_cgp,
        "BE",
        &[("node.koordinator.sh/extended-resource-spec", SPEC)],
    );
    let be_pod = via.run_pod(&be_cfg).await.unwrap();
    let be_ctr = via
        .create(
            &be_pod,
            &be_cfg,
            container_config("batch", SLEEP_LOOP, Some(besteffort())),
        )
        .await
        .unwrap();
    via.start(&be_ctr).await.unwrap();
    let cg = format!("{be_cgp}/{be_ctr}");
    let check_be = || {
        assert_eq!(
            cgroup_v1("cpu", &cg, "cpu.cfs_quota_us"),
            "100000",
            "batch-cpu limit 1000m"
        );
        assert_eq!(cgroup_v1("cpu", &cg, "cpu.cfs_period_us"), "100000");
        assert_eq!(
            cgroup_v1("cpu", &cg, "cpu.shares"),
            "512",
            "batch-cpu request 500m"
        );
        assert_eq!(
            cgroup_v1("memory", &cg, "memory.limit_in_bytes"),
            (128u64 << 20).to_string(),
            "batch-memory limit"
        );
        // SCHED_IDLE on the pod's cgroup (the kernel refuses shares writes on an idle cgroup,
        // and the runtime writes the container's shares at every update)
        assert_eq!(
            cgroup_v1("cpu", &be_cgp, "cpu.idle"),
            "1",
            "BE pod runs SCHED_IDLE"
        );
        assert_eq!(cgroup_v1("cpu", &cg, "cpu.idle"), "0");
        // the pod's own cgroup is bounded by the sum of its containers' batch limits
        assert_eq!(cgroup_v1("cpu", &be_cgp, "cpu.cfs_quota_us"), "100000");
        assert_eq!(
            cgroup_v1("memory", &be_cgp, "memory.limit_in_bytes"),
            (128u64 << 20).to_string()
        );
        // and by the class's block I/O limits
        assert_eq!(
            cgroup_v1("blkio", &be_cgp, "blkio.throttle.read_bps_device"),
            format!("{} 10485760", disk.1)
        );
        assert_eq!(
            cgroup_v1("blkio", &be_cgp, "blkio.throttle.write_iops_device"),
            format!("{} 300", disk.1)
        );
    };
    check_be();

    // an LS pod: untouched
    let ls = unique("ls");
    let ls_cgp = tb.cgroup_parent_in("burstable", &ls);
    let ls_cfg = classed(
        &ls,
        &ls_cgp,
        "LS",
        &[("node.koordinator.sh/extended-resource-spec", SPEC)],
    );
    let ls_pod = via.run_pod(&ls_cfg).await.unwrap();
    let ls_res = cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 1024,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    let ls_ctr = via
        .create(
            &ls_pod,
            &ls_cfg,
            container_config("batch", SLEEP_LOOP, Some(ls_res.clone())),
        )
        .await
        .unwrap();
    via.start(&ls_ctr).await.unwrap();
    let lcg = format!("{ls_cgp}/{ls_ctr}");
    assert_eq!(cgroup_v1("cpu", &lcg, "cpu.cfs_quota_us"), "50000");
    assert_eq!(cgroup_v1("cpu", &lcg, "cpu.shares"), "1024");
    assert_eq!(cgroup_v1("cpu", &lcg, "cpu.idle"), "0");
    assert_eq!(cgroup_v1("cpu", &ls_cgp, "cpu.cfs_quota_us"), "-1");
    assert_eq!(
        cgroup_v1("blkio", &ls_cgp, "blkio.throttle.read_bps_device"),
        "",
        "blkioQOS is BE's only"
    );

    // an LSR pod bound to CPU 1 by the scheduler
    let lsr = unique("lsr");
    let lsr_cgp = tb.cgroup_parent(&lsr);
    let lsr_cfg = classed(
        &lsr,
        &lsr_cgp,
        "LSR",
        &[(
            "scheduling.koordinator.sh/resource-status",
            r#"{"cpuset":"1"}"#,
        )],
    );
    let lsr_pod = via.run_pod(&lsr_cfg).await.unwrap();
    let lsr_res = cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 100_000,
        cpu_shares: 1024,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    let lsr_ctr = via
        .create(
            &lsr_pod,
            &lsr_cfg,
            container_config("app", SLEEP_LOOP, Some(lsr_res.clone())),
        )
        .await
        .unwrap();
    via.start(&lsr_ctr).await.unwrap();
    let rcg = format!("{lsr_cgp}/{lsr_ctr}");
    assert_eq!(cgroup_v1("cpuset", &rcg, "cpuset.cpus"), "1");
    // koordlet's cpuset hook: a container bound within its 1-CPU limit runs without CFS quota
    assert_eq!(cgroup_v1("cpu", &rcg, "cpu.cfs_quota_us"), "-1");
    via.rt
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: lsr_ctr.clone(),
            linux: Some(lsr_res),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (
            cgroup_v1("cpuset", &rcg, "cpuset.cpus"),
            cgroup_v1("cpu", &rcg, "cpu.cfs_quota_us")
        ),
        ("1".into(), "-1".into()),
        "kept through kubelet's update"
    );
    // the LS pod shares what no LSE/LSR container is bound to: a container created
    // now starts on CPU 0, the one that ran before is moved there by the engine
    let ls2 = via
        .create(
            &ls_pod,
            &ls_cfg,
            container_config("web", SLEEP_LOOP, Some(ls_res.clone())),
        )
        .await
        .unwrap();
    via.start(&ls2).await.unwrap();
    let lcg2 = format!("{ls_cgp}/{ls2}");
    assert_eq!(
        cgroup_v1("cpuset", &lcg2, "cpuset.cpus"),
        "0",
        "the share pool"
    );
    assert_eq!(cgroup_v1("cpu", &lcg2, "cpu.cfs_quota_us"), "50000");
    eventually(
        "the LS container on the share pool",
        Duration::from_secs(15),
        || async { (cgroup_v1("cpuset", &lcg, "cpuset.cpus") == "0").then_some(()) },
    )
    .await;
    via.remove_pod(&lsr_pod).await;
    testbed::remove_cgroup_dirs(&lsr_cgp);
    // the binding gone, the share pool is the whole node again: kubelet's cpusets back
    eventually(
        "the LS containers back on every CPU",
        Duration::from_secs(15),
        || async {
            let all = cgroup_v1("cpuset", "", "cpuset.cpus");
            (cgroup_v1("cpuset", &lcg, "cpuset.cpus") == all
                && cgroup_v1("cpuset", &lcg2, "cpuset.cpus") == all)
                .then_some(())
        },
    )
    .await;

    // kubelet's periodic update does not undo the class's settings
    via.rt
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: be_ctr.clone(),
            linux: Some(besteffort()),
            ..Default::default()
        })
        .await
        .unwrap();
    check_be();

    // what qoslet applied, and why, is visible
    let status = via
        .rt
        .container_status(cri::ContainerStatusRequest {
            container_id: be_ctr.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(
        status
            .annotations
            .get("qoslet.io/qos-class")
            .map(String::as_str),
        Some("BE")
    );
    let lr = status
        .resources
        .and_then(|r| r.linux)
        .expect("runtime's resources");
    assert_eq!(
        (lr.cpu_shares, lr.cpu_quota, lr.memory_limit_in_bytes),
        (512, 100_000, 128 << 20),
        "the runtime applied the patch"
    );
    let p = pod(&q.admin, &be_pod).await;
    assert_eq!(p.applied.get("class").map(String::as_str), Some("BE"));
    assert!(
        !p.applied.contains_key("error"),
        "every pod-level setting applied: {:?}",
        p.applied
    );
    let c = p.containers.iter().find(|c| c.id == be_ctr).unwrap();
    assert_eq!(c.applied.get("class").map(String::as_str), Some("BE"));
    assert!(
        c.applied["cpu.cfs_quota_us"].starts_with("100000 (BE batch-cpu limit 1000m"),
        "{:?}",
        c.applied
    );
    assert!(p.applied["cpu.idle"].starts_with('1'), "{:?}", p.applied);
    assert_eq!(
        c.requested.as_ref().unwrap().cpu_shares,
        2,
        "what kubelet asked for stays recorded"
    );

    // `qoslet explain` says why
    let out = std::process::Command::new(qoslet_integration::process::qoslet_bin())
        .args([
            "explain",
            &format!("--admin=unix://{}", q.admin.display()),
            &format!("qoslet-e2e/{be}"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("class BE, from label koordinator.sh/qosClass"),
        "{text}"
    );
    assert!(
        text.contains("cpu.cfs_quota_us = 100000    <- BE batch-cpu limit 1000m"),
        "{text}"
    );
    assert!(text.contains("pod cgroup: cpu.idle = 1"), "{text}");
    assert!(
        text.contains(&format!("blkio.throttle {} = rbps=10485760", disk.1)),
        "{text}"
    );

    // qoslet killed and restarted: it still knows what it applied; the files are unchanged
    qoslet_integration::eventually("checkpoint written", Duration::from_secs(5), || {
        let p = q.state_dir.join("store.json");
        async move {
            std::fs::read_to_string(p)
                .ok()
                .filter(|s| s.contains("BE batch-cpu limit"))
                .map(|_| ())
        }
    })
    .await;
    q.kill9();
    q.restart();
    let c = pod(&q.admin, &be_pod)
        .await
        .containers
        .into_iter()
        .find(|c| c.id == be_ctr)
        .unwrap();
    assert!(
        c.applied.contains_key("cpu.cfs_quota_us"),
        "{:?}",
        c.applied
    );
    check_be();

    let mut via = Cri::connect(&q.sock).await;
    via.remove_pod(&be_pod).await;
    via.remove_pod(&ls_pod).await;
    testbed::remove_cgroup_dirs(&be_cgp);
    testbed::remove_cgroup_dirs(&ls_cgp);
    let _ = HashMap::<(), ()>::new();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_hostile_cgroup_parent_is_never_written_outside_the_cgroup_root() {
    let tb = Testbed::main();
    let dir = scratch("hostile");
    let q = QosletProcess::start(&dir, &tb.sock);
    let mut via = Cri::connect(&q.sock).await;
    // a file qoslet would overwrite if it joined the parent naively to /sys/fs/cgroup/cpu
    let evil = std::path::PathBuf::from(format!("/tmp/qoslet-evil-{}", std::process::id()));
    std::fs::create_dir_all(&evil).unwrap();
    std::fs::write(evil.join("cpu.idle"), "0\n").unwrap();
    let name = unique("hostile");
    let parent = format!("/qoslet-test/a/../../../../../../..{}", evil.display());
    let cfg = classed(&name, &parent, "BE", &[]);
    // containerd/runc clean the path themselves (and stay inside the cgroup root); whatever they
    // do with it, qoslet refuses the parent and writes nothing
    if let Ok(pod) = via.run_pod(&cfg).await {
        if let Ok(ctr) = via
            .create(
                &pod,
                &cfg,
                container_config("app", SLEEP_LOOP, Some(besteffort())),
            )
            .await
        {
            let _ = via.start(&ctr).await;
        }
        via.remove_pod(&pod).await;
    }
    assert_eq!(
        std::fs::read_to_string(evil.join("cpu.idle")).unwrap(),
        "0\n",
        "nothing written outside the cgroup root"
    );
    eventually("the refusal is logged", Duration::from_secs(5), || {
        let log = q.log_text();
        async move { log.contains("refused").then_some(()) }
    })
    .await;
    std::fs::remove_dir_all(&evil).unwrap();
    testbed::remove_cgroup_dirs(&evil.display().to_string());
    testbed::remove_cgroup_dirs("/tmp");
}
