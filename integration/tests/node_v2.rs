//! qoslet on a real cgroup v2 + systemd node (issue 44): the VM test bed's
//! guest, where containerd 1.7 runs pods with `SystemdCgroup = true` as under
//! a kubelet with `cgroupDriver: systemd`: pods are slices
//! (`kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice`),
//! containers `cri-containerd-<id>.scope`. Every value is read back from the
//! kernel's v2 files. Runs inside the guest (`integration/vm/suite.sh`).

use std::time::Duration;

use k8s_cri::v1 as cri;
use qoslet_integration::node::{systemctl, Node};
use qoslet_integration::process::QosletProcess;
use qoslet_integration::scratch;
use qoslet_integration::testbed::{container_config, pod_config, Cri, SLEEP_LOOP};

const SPEC: &str = r#"{"containers":{"batch":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"128Mi"}}}}"#;

/// The node's first disk (`/dev/vda` in the guest) and its `major:minor`.
fn first_disk() -> (String, String) {
    let parts = std::fs::read_to_string("/proc/partitions").unwrap();
    parts
        .lines()
        .skip(2)
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = format!("/dev/{}", f.get(3)?);
            std::path::Path::new(&path)
                .exists()
                .then(|| (path, format!("{}:{}", f[0], f[1])))
        })
        .expect("a disk in /proc/partitions")
}

/// qoslet as the isolation test on the host runs it: BE's CPU QoS on, and a
/// read/write limit for BE pods on the first disk.
fn start_qoslet(node: &Node, name: &str) -> (QosletProcess, (String, String)) {
    let dir = scratch(name);
    let disk = first_disk();
    let yaml = format!(
        "policy:\n  resourceQOSStrategy:\n    beClass:\n      cpuQOS: {{enable: true}}\n      blkioQOS:\n        enable: true\n        blocks:\n          - {{name: {}, type: device, ioCfg: {{readBPS: 10485760, writeIOPS: 300}}}}\n",
        disk.0
    );
    (
        QosletProcess::with_config(&dir, &node.sock, &yaml, &[]),
        disk,
    )
}

/// A pod uid without dashes' trouble: systemd slice names take them as nesting.
fn uid(tag: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        % 1_000_000_000;
    format!("{tag}{}x{t}", std::process::id())
}

fn classed(name: &str, slice: &str, class: &str, spec: Option<&str>) -> cri::PodSandboxConfig {
    let mut p = pod_config(name, slice);
    p.labels
        .insert("koordinator.sh/qosClass".into(), class.into());
    if let Some(s) = spec {
        p.annotations.insert(
            "node.koordinator.sh/extended-resource-spec".into(),
            s.into(),
        );
    }
    p
}

/// What kubelet sends for a BestEffort container (batch resources are not cpu/memory).
fn besteffort() -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 0,
        cpu_shares: 2,
        ..Default::default()
    }
}

fn ls_resources() -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 1024,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    }
}

/// A BE pod with batch resources and an LS pod through the CRI proxy, with the
/// systemd driver: the BE container's scope gets the batch limits, its pod's
/// slice runs SCHED_IDLE and is bounded by them; the LS pod keeps kubelet's
/// values; kubelet's periodic update undoes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_isolates_be_and_ls_pods_with_the_systemd_driver() {
    let node = Node::systemd_v2();
    let (q, disk) = start_qoslet(&node, "node-v2-proxy");
    let mut via = Cri::connect(&q.sock).await;

    let be = uid("be");
    let be_slice = Node::slice("besteffort", &be);
    let be_cfg = classed(&be, &be_slice, "BE", Some(SPEC));
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
    let check_be = || {
        let c = Some(be_ctr.as_str());
        assert_eq!(
            node.read(&be_slice, c, "cpu.max"),
            "100000 100000",
            "batch-cpu limit 1000m"
        );
        assert_eq!(
            node.read(&be_slice, c, "memory.max"),
            (128u64 << 20).to_string(),
            "batch-memory limit"
        );
        // shares 512 (batch-cpu request 500m), as runc converts them to a weight
        assert_eq!(
            node.read(&be_slice, c, "cpu.weight"),
            "20",
            "batch-cpu request 500m"
        );
        assert_eq!(
            node.read(&be_slice, None, "cpu.idle"),
            "1",
            "BE pod runs SCHED_IDLE"
        );
        assert_eq!(node.read(&be_slice, None, "cpu.max"), "100000 100000");
        assert_eq!(
            node.read(&be_slice, None, "memory.max"),
            (128u64 << 20).to_string()
        );
        assert_eq!(
            node.read(&be_slice, None, "io.max"),
            format!("{} rbps=10485760 wbps=max riops=max wiops=300", disk.1),
            "BE's block I/O limits"
        );
    };
    check_be();

    let ls = uid("ls");
    let ls_slice = Node::slice("burstable", &ls);
    let ls_cfg = classed(&ls, &ls_slice, "LS", None);
    let ls_pod = via.run_pod(&ls_cfg).await.unwrap();
    let ls_ctr = via
        .create(
            &ls_pod,
            &ls_cfg,
            container_config("app", SLEEP_LOOP, Some(ls_resources())),
        )
        .await
        .unwrap();
    via.start(&ls_ctr).await.unwrap();
    let lc = Some(ls_ctr.as_str());
    assert_eq!(node.read(&ls_slice, lc, "cpu.max"), "50000 100000");
    assert_eq!(
        node.read(&ls_slice, lc, "memory.max"),
        (64u64 << 20).to_string()
    );
    assert_eq!(node.read(&ls_slice, None, "cpu.idle"), "0");
    assert_eq!(node.read(&ls_slice, None, "cpu.max"), "max 100000");
    assert_eq!(
        node.read(&ls_slice, None, "io.max"),
        "",
        "blkioQOS is BE's only"
    );

    // kubelet's periodic update sends what it sent at create: nothing is undone
    via.rt
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: be_ctr.clone(),
            linux: Some(besteffort()),
            ..Default::default()
        })
        .await
        .unwrap();
    check_be();

    via.remove_pod(&be_pod).await;
    via.remove_pod(&ls_pod).await;
    drop(q);
}

/// What systemd does to qoslet's writes: `systemctl daemon-reload`, a unit
/// property changed on a pod's slice, and a containerd restart leave no
/// qoslet value undone for longer than one engine tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_does_not_undo_qoslets_values() {
    let node = Node::systemd_v2();
    let (q, _) = start_qoslet(&node, "node-v2-systemd");
    let mut via = Cri::connect(&q.sock).await;
    let be = uid("sd");
    let be_slice = Node::slice("besteffort", &be);
    let be_cfg = classed(&be, &be_slice, "BE", Some(SPEC));
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
    let c = Some(be_ctr.as_str());
    let values = || {
        (
            node.read(&be_slice, c, "cpu.max"),
            node.read(&be_slice, c, "memory.max"),
            node.read(&be_slice, None, "cpu.idle"),
            node.read(&be_slice, None, "cpu.max"),
            node.read(&be_slice, None, "memory.max"),
            node.read(&be_slice, None, "io.max"),
        )
    };
    let want = values();
    assert_eq!(want.0, "100000 100000", "{want:?}");
    assert_eq!(want.2, "1", "{want:?}");
    // one engine tick (1 s) and the time to read a file
    let within_a_tick = Duration::from_millis(1500);
    let unit = Node::unit(&be_slice, None);
    let steps: [(&str, Vec<&str>); 3] = [
        ("systemctl daemon-reload", vec!["daemon-reload"]),
        (
            "a property of the pod's slice",
            vec!["set-property", "--runtime", &unit, "CPUWeight=50"],
        ),
        ("containerd restarted", vec!["restart", "containerd"]),
    ];
    for (what, args) in steps {
        systemctl(&args);
        let t0 = std::time::Instant::now();
        let mut now = values();
        while now != want && t0.elapsed() < within_a_tick {
            tokio::time::sleep(Duration::from_millis(50)).await;
            now = values();
        }
        assert_eq!(
            now, want,
            "qoslet's values not back {within_a_tick:?} after {what}"
        );
    }
    // systemd did undo them (a unit property change applies all the unit's
    // properties again): qoslet put them back, and says so
    let log = q.log_text();
    assert!(
        log.contains("cgroup drift put back") && log.contains(&be_slice),
        "{log}"
    );
    let mut direct = Cri::connect(&node.sock).await;
    direct.remove_pod(&be_pod).await;
    drop(q);
}
