//! What qoslet changed, and what it believes after a restart, on the real
//! containerd 1.6 + runc and this machine's real cgroup v1 (needs root and the
//! test bed), issue 15 items 9 and 11:
//!
//! * after a restart, an LS quota left scaled above kubelet's limit (by an
//!   earlier run's burst scaling) is read from the file and put back;
//! * `qoslet restore` is refused while qoslet runs, and after it stopped puts a
//!   suppressed node back: the besteffort quota and cpusets, the LS quota and
//!   burst;
//! * `qosEngine.restoreOnExit` does the same on SIGTERM;
//! * (item 10) with kubelet's static CPU manager, a suppressed node still
//!   creates BE containers that kubelet gives the shared pool.

use std::process::Command;
use std::time::Duration;

use k8s_cri::v1 as cri;
use qoslet_integration::process::{kubelet_cgroup_root, qoslet_bin, QosletProcess};
use qoslet_integration::testbed::{
    cgroup_v1, container_config, pod_config, Cleanup, Cri, Testbed, SLEEP_LOOP,
};
use qoslet_integration::{eventually, scratch, unique};

/// Both tests rebuild their qoslet's store from the one containerd, so each
/// would see (and restore, or suppress) the other's pods: they run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This host's CPUs, as the root cpuset lists them.
fn host_cpus() -> Vec<u32> {
    qoslet_cgroups::cgroup::parse_cpu_list(&cgroup_v1("cpuset", "", "cpuset.cpus"))
        .unwrap()
        .into_iter()
        .collect()
}

fn fmt_cpus(cpus: &[u32]) -> String {
    qoslet_cgroups::cgroup::format_cpu_list(&cpus.iter().copied().collect())
}

fn write_v1(controller: &str, cgroup: &str, file: &str, value: &str) {
    let p = std::path::Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(cgroup.trim_start_matches('/'))
        .join(file);
    std::fs::write(&p, value).unwrap_or_else(|e| panic!("write {value} to {}: {e}", p.display()));
}

fn config(sock: &std::path::Path, be_parent: &str, extra: &str) -> String {
    format!(
        "runtimeEndpoint: unix://{}\nkubeletCgroupRoot: {}\nqosEngine:\n  beParent: {be_parent}\n  driftCheckInterval: 1s\n{extra}",
        sock.display(),
        kubelet_cgroup_root(sock),
    )
}

fn restore(config: &std::path::Path, state_dir: &std::path::Path) -> std::process::Output {
    Command::new(qoslet_bin())
        .arg("restore")
        .arg(format!("--config={}", config.display()))
        .arg(format!("--state-dir={}", state_dir.display()))
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_restart_reads_scaled_quotas_and_restore_puts_a_suppressed_node_back() {
    let _serial = SERIAL.lock().await;
    let tb = Testbed::main();
    let dir = scratch("restore");
    let root = tb.cgroup_parent(&unique("restore"));
    let be_parent = format!("{root}/besteffort");
    let yaml = dir.join("qoslet.yaml");
    let mut q = QosletProcess::with_config(&dir, &tb.sock, &config(&tb.sock, &be_parent, ""), &[]);
    let mut via = Cri::connect(&q.sock).await;
    let mut cleanup = Cleanup::new(&tb.sock);

    let be_cgp = format!("{be_parent}/podbe");
    let mut be_cfg = pod_config(&unique("be"), &be_cgp);
    // the test bed's private QoS dirs are not kubelet's names: the class by label
    be_cfg
        .labels
        .insert("koordinator.sh/qosClass".into(), "BE".into());
    let be_pod = via.run_pod(&be_cfg).await.unwrap();
    cleanup.pods.push(be_pod.clone());
    let ls_cgp = format!("{root}/burstable/podls");
    let ls_cfg = pod_config(&unique("ls"), &ls_cgp);
    let ls_pod = via.run_pod(&ls_cfg).await.unwrap();
    cleanup.pods.push(ls_pod.clone());
    cleanup.cgroups = vec![
        be_cgp.clone(),
        ls_cgp.clone(),
        be_parent.clone(),
        format!("{root}/burstable"),
        root.clone(),
    ];
    let be_ctr = via
        .create(
            &be_pod,
            &be_cfg,
            container_config(
                "be",
                SLEEP_LOOP,
                Some(cri::LinuxContainerResources {
                    cpu_period: 100_000,
                    cpu_shares: 2,
                    ..Default::default()
                }),
            ),
        )
        .await
        .unwrap();
    via.start(&be_ctr).await.unwrap();
    let ls_ctr = via
        .create(
            &ls_pod,
            &ls_cfg,
            container_config(
                "ls",
                SLEEP_LOOP,
                Some(cri::LinuxContainerResources {
                    cpu_period: 100_000,
                    cpu_quota: 100_000,
                    cpu_shares: 1024,
                    ..Default::default()
                }),
            ),
        )
        .await
        .unwrap();
    via.start(&ls_ctr).await.unwrap();
    let be_c = format!("{be_cgp}/{be_ctr}");
    let ls_c = format!("{ls_cgp}/{ls_ctr}");
    let scale = |q: &str, burst: &str| {
        // the pod first: v1 refuses a child above its parent's quota
        write_v1("cpu", &ls_cgp, "cpu.cfs_quota_us", q);
        write_v1("cpu", &ls_c, "cpu.cfs_quota_us", q);
        write_v1("cpu", &ls_c, "cpu.cfs_burst_us", burst);
    };

    // item 9: a quota an earlier run scaled to 3x is found after the restart and put back
    tokio::time::sleep(Duration::from_millis(500)).await; // checkpointed
    assert!(q.sigterm(Duration::from_secs(20)).success());
    scale("300000", "100000");
    q.restart();
    eventually(
        "the scaled LS quota back to the limit",
        Duration::from_secs(20),
        || async { (cgroup_v1("cpu", &ls_c, "cpu.cfs_quota_us") == "100000").then_some(()) },
    )
    .await;
    assert_eq!(
        cgroup_v1("cpu", &ls_c, "cpu.cfs_burst_us"),
        "0",
        "burst off writes 0"
    );

    // item 11: refused while qoslet holds the state dir
    let out = restore(&yaml, &q.state_dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("running"), "{err}");

    // a suppressed node, as a stopped qoslet (or anything else) left it
    assert!(q.sigterm(Duration::from_secs(20)).success());
    // suppressed to this host's last CPU
    let narrow = host_cpus().last().unwrap().to_string();
    let suppress = || {
        write_v1("cpu", &be_parent, "cpu.cfs_quota_us", "2000");
        // children first (the pod's sandbox container too): v1's containment rule
        let pod_dir = format!("/sys/fs/cgroup/cpuset{be_cgp}");
        for e in std::fs::read_dir(&pod_dir).unwrap().flatten() {
            if e.path().is_dir() {
                std::fs::write(e.path().join("cpuset.cpus"), &narrow).unwrap();
            }
        }
        for cg in [&be_cgp, &be_parent] {
            write_v1("cpuset", cg, "cpuset.cpus", &narrow);
        }
    };
    suppress();
    scale("250000", "200000");
    // a BE pod started while qoslet was down: v1 gives its new cgroups the
    // suppressed parent's CPUs, and the checkpoint does not know it
    let mut direct = Cri::connect(&tb.sock).await;
    let late_cgp = format!("{be_parent}/podlate");
    let late_cfg = pod_config(&unique("late"), &late_cgp);
    let late = direct.run_pod(&late_cfg).await.unwrap();
    cleanup.pods.push(late.clone());
    cleanup.cgroups.insert(0, late_cgp.clone());
    let out = restore(&yaml, &q.state_dir);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let all = cgroup_v1("cpuset", "", "cpuset.cpus");
    assert_eq!(cgroup_v1("cpu", &be_parent, "cpu.cfs_quota_us"), "-1");
    for cg in [&be_parent, &be_cgp, &be_c, &late_cgp] {
        assert_eq!(cgroup_v1("cpuset", cg, "cpuset.cpus"), all, "{cg}");
    }
    // the sandboxes' own cgroups too (no CRI container names them)
    for pod in [&be_cgp, &late_cgp] {
        for e in std::fs::read_dir(format!("/sys/fs/cgroup/cpuset{pod}"))
            .unwrap()
            .flatten()
        {
            if e.path().is_dir() {
                let got = std::fs::read_to_string(e.path().join("cpuset.cpus")).unwrap();
                assert_eq!(got.trim(), all, "{}", e.path().display());
            }
        }
    }
    assert_eq!(cgroup_v1("cpu", &ls_c, "cpu.cfs_quota_us"), "100000");
    assert_eq!(cgroup_v1("cpu", &ls_c, "cpu.cfs_burst_us"), "0");
    assert_eq!(cgroup_v1("cpu", &ls_cgp, "cpu.cfs_quota_us"), "100000");

    // restoreOnExit: a node suppressed by qoslet itself is put back on SIGTERM
    std::fs::write(
        &yaml,
        config(
            &tb.sock,
            &be_parent,
            "  restoreOnExit: true\npolicy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressPolicy: cfsQuota\n    cpuSuppressThresholdPercent: 1\n",
        ),
    )
    .unwrap();
    q.restart();
    eventually("qoslet to suppress BE", Duration::from_secs(20), || async {
        (cgroup_v1("cpu", &be_parent, "cpu.cfs_quota_us") != "-1").then_some(())
    })
    .await;
    assert!(q.sigterm(Duration::from_secs(20)).success());
    assert_eq!(cgroup_v1("cpu", &be_parent, "cpu.cfs_quota_us"), "-1");
    assert!(q.log_text().contains("restoreOnExit"), "{}", q.log_text());
}

/// Issue 15 item 10: kubelet's static CPU manager gives every container a
/// cpuset (non-exclusive ones the shared pool). With the BE cpuset suppressed
/// on the besteffort parent (CPU 1, CPU 0 bound to an LSE pod), a new BE
/// container given `0-1` fails in runc (v1: a child's CPUs must be within its
/// parent's). With `cpuManagerPolicy: static` qoslet narrows BE containers
/// only, so the container is created, and then narrowed within a tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_static_cpu_manager_keeps_be_containers_creatable_under_suppression() {
    let _serial = SERIAL.lock().await;
    // this host's CPUs: an LSE pod takes all but the last, BE is left the last
    // (koordlet's cpuset suppress never gives BE an LSE pod's CPUs; an LSR pod's
    // it shares in proportion)
    let cpus = host_cpus();
    assert!(
        cpus.len() >= 2,
        "this test needs at least two CPUs: {cpus:?}"
    );
    let all = fmt_cpus(&cpus);
    let last = fmt_cpus(&cpus[cpus.len() - 1..]);
    let lsr_cpus = fmt_cpus(&cpus[..cpus.len() - 1]);
    let tb = Testbed::main();
    let dir = scratch("static-cpu");
    let root = tb.cgroup_parent(&unique("static"));
    let be_parent = format!("{root}/besteffort");
    let policy = |mode: &str| {
        config(
            &tb.sock,
            &be_parent,
            &format!("  cpuManagerPolicy: {mode}\npolicy:\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressPolicy: cpuset\n    cpuSuppressThresholdPercent: 1\n"),
        )
    };
    let mut q = QosletProcess::with_config(&dir, &tb.sock, &policy("none"), &[]);
    let yaml = dir.join("qoslet.yaml");
    let mut via = Cri::connect(&q.sock).await;
    let mut cleanup = Cleanup::new(&tb.sock);

    // an LSE pod bound to all CPUs but the last: the BE share pool is the last
    let lsr = unique("lsr");
    let lsr_cgp = format!("{root}/pod{lsr}");
    let mut lsr_cfg = pod_config(&lsr, &lsr_cgp);
    lsr_cfg
        .labels
        .insert("koordinator.sh/qosClass".into(), "LSE".into());
    lsr_cfg.annotations.insert(
        "scheduling.koordinator.sh/resource-status".into(),
        format!(r#"{{"cpuset":"{lsr_cpus}"}}"#),
    );
    let lsr_pod = via.run_pod(&lsr_cfg).await.unwrap();
    cleanup.pods.push(lsr_pod.clone());
    let lsr_ctr = via
        .create(
            &lsr_pod,
            &lsr_cfg,
            container_config(
                "app",
                SLEEP_LOOP,
                Some(cri::LinuxContainerResources {
                    cpu_period: 100_000,
                    // an untrusted LSE pod binds to no more CPUs than its limit
                    cpu_quota: 100_000 * (cpus.len() as i64 - 1),
                    cpu_shares: 1024,
                    memory_limit_in_bytes: 64 << 20,
                    ..Default::default()
                }),
            ),
        )
        .await
        .unwrap();
    via.start(&lsr_ctr).await.unwrap();

    let be_cgp = format!("{be_parent}/podbe");
    let mut be_cfg = pod_config(&unique("be"), &be_cgp);
    be_cfg
        .labels
        .insert("koordinator.sh/qosClass".into(), "BE".into());
    let be_pod = via.run_pod(&be_cfg).await.unwrap();
    cleanup.pods.push(be_pod.clone());
    cleanup.cgroups = vec![
        be_cgp.clone(),
        be_parent.clone(),
        lsr_cgp.clone(),
        root.clone(),
    ];
    // kubelet's static policy: the shared pool for every non-exclusive container
    let shared = || cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_shares: 2,
        cpuset_cpus: all.clone(),
        ..Default::default()
    };
    let first = via
        .create(
            &be_pod,
            &be_cfg,
            container_config("first", SLEEP_LOOP, Some(shared())),
        )
        .await
        .unwrap();
    via.start(&first).await.unwrap();
    eventually(
        "BE suppressed to CPU 1 on the parent",
        Duration::from_secs(20),
        || async { (cgroup_v1("cpuset", &be_parent, "cpuset.cpus") == last).then_some(()) },
    )
    .await;
    // the defect: a new BE container with the shared pool cannot start
    let failed = match via
        .create(
            &be_pod,
            &be_cfg,
            container_config("second", SLEEP_LOOP, Some(shared())),
        )
        .await
    {
        Ok(id) => via.start(&id).await.is_err(),
        Err(_) => true,
    };
    assert!(failed, "v1 refuses a container cpuset outside its parent's");

    // static mode: the parent and the pod get all CPUs back, the containers are narrowed
    assert!(q.sigterm(Duration::from_secs(20)).success());
    std::fs::write(&yaml, policy("static")).unwrap();
    write_v1("cpuset", &be_parent, "cpuset.cpus", &last); // as the old mode left it
    q.restart();
    let mut via = Cri::connect(&q.sock).await;
    // the parent the other mode narrowed gets all CPUs back by itself
    eventually(
        "the parent back to all CPUs",
        Duration::from_secs(20),
        || async { (cgroup_v1("cpuset", &be_parent, "cpuset.cpus") == all).then_some(()) },
    )
    .await;
    eventually(
        "the first BE container narrowed to CPU 1",
        Duration::from_secs(20),
        || async {
            (cgroup_v1("cpuset", &format!("{be_cgp}/{first}"), "cpuset.cpus") == last).then_some(())
        },
    )
    .await;
    assert_eq!(
        cgroup_v1("cpuset", &be_parent, "cpuset.cpus"),
        all,
        "the parent keeps all CPUs"
    );
    assert_eq!(
        cgroup_v1("cpuset", &be_cgp, "cpuset.cpus"),
        all,
        "the pod keeps all CPUs"
    );
    let third = via
        .create(
            &be_pod,
            &be_cfg,
            container_config("third", SLEEP_LOOP, Some(shared())),
        )
        .await
        .expect("a BE container with the shared pool is created under static mode");
    via.start(&third).await.expect("and starts");
    eventually(
        "the new BE container narrowed to CPU 1",
        Duration::from_secs(20),
        || async {
            (cgroup_v1("cpuset", &format!("{be_cgp}/{third}"), "cpuset.cpus") == last).then_some(())
        },
    )
    .await;
}
