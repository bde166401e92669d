//! The QoS engine on the real containerd 1.6 + runc and this machine's real
//! cgroup v1 (needs root and the test bed): an LS pod and a BE pod spinning on
//! CPU; the BE quota is cut when LS load rises, restored stepwise when it
//! stops, the kernel's throttling counters agree, and a steady state writes
//! nothing. Then the policy is reloaded (an invalid file is refused, a valid
//! one applies), and a dry run plans without writing.

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use qoslet_integration::process::QosletProcess;
use qoslet_integration::testbed::{
    cgroup_v1, container_config, exec, pod_config, Cleanup, Cri, Testbed,
};
use qoslet_integration::{channel, eventually, free_port, http_get, scratch, unique};
use qoslet_proto::admin::{admin_client::AdminClient, GetPlanRequest, GetPlanResponse};

fn classed(name: &str, cgroup_parent: &str, class: &str) -> cri::PodSandboxConfig {
    let mut p = pod_config(name, cgroup_parent);
    p.labels
        .insert("koordinator.sh/qosClass".into(), class.into());
    p
}

fn besteffort() -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_shares: 2,
        ..Default::default()
    }
}

fn policy(be_parent: &str, extra: &str) -> String {
    format!(
        "policy:\n  resourceQOSStrategy:\n    beClass:\n      cpuQOS: {{\"enable\": true}}\n  resourceUsedThresholdWithBE:\n    enable: true\n    cpuSuppressPolicy: cfsQuota\n    cpuSuppressThresholdPercent: 45\n{extra}\
         qosEngine:\n  beParent: {be_parent}\n  driftCheckInterval: 3s\n"
    )
}

async fn plan(admin: &std::path::Path, plugin: &str) -> GetPlanResponse {
    try_plan(admin, plugin).await.unwrap()
}

/// The plan, or why not: the admin API answers once the store is rebuilt,
/// the engine starts just after (UNAVAILABLE "not running" in between).
async fn try_plan(admin: &std::path::Path, plugin: &str) -> Result<GetPlanResponse, tonic::Status> {
    AdminClient::new(channel(admin).await)
        .get_plan(GetPlanRequest {
            plugin: plugin.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

/// The next tick after `after` (the engine ticks once a second).
async fn next_tick(admin: &std::path::Path, after: u64) -> GetPlanResponse {
    eventually("the next engine tick", Duration::from_secs(10), || async {
        let p = plan(admin, "cpu-suppress").await;
        (p.tick > after).then_some(p)
    })
    .await
}

fn quota(be_parent: &str) -> i64 {
    cgroup_v1("cpu", be_parent, "cpu.cfs_quota_us")
        .parse()
        .unwrap()
}

fn throttled(be_parent: &str) -> u64 {
    cgroup_v1("cpu", be_parent, "cpu.stat")
        .lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .unwrap()
        .parse()
        .unwrap()
}

fn cpu_ns(be_parent: &str) -> u64 {
    cgroup_v1("cpuacct", be_parent, "cpuacct.usage")
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_ls_load_cuts_be_quota_and_it_comes_back_stepwise() {
    let tb = Testbed::main();
    let dir = scratch("engine");
    let root = tb.cgroup_parent(&unique("engine"));
    let be_parent = format!("{root}/besteffort");
    let config = dir.join("qoslet.yaml");
    std::fs::write(&config, policy(&be_parent, "")).unwrap();
    let port = free_port();
    let mut q = QosletProcess::start_with(
        &dir,
        &tb.sock,
        &[
            &format!("--config={}", config.display()),
            &format!("--metrics-listen=127.0.0.1:{port}"),
        ],
    );
    let mut via = Cri::connect(&q.sock).await;
    let mut cleanup = Cleanup {
        sock: tb.sock.clone(),
        pods: Vec::new(),
        cgroups: Vec::new(),
    };

    // a BE pod spinning two loops (all of this 2-CPU machine), an LS pod waiting for a signal
    let be_cgp = format!("{be_parent}/podbe");
    let be_cfg = classed(&unique("be"), &be_cgp, "BE");
    let be_pod = via.run_pod(&be_cfg).await.unwrap();
    cleanup.pods.push(be_pod.clone());
    let be_ctr = via
        .create(
            &be_pod,
            &be_cfg,
            container_config(
                "spin",
                "while :; do :; done & while :; do :; done",
                Some(besteffort()),
            ),
        )
        .await
        .unwrap();
    via.start(&be_ctr).await.unwrap();
    let ls_cgp = format!("{root}/burstable/podls");
    let ls_cfg = classed(&unique("ls"), &ls_cgp, "LS");
    let ls_pod = via.run_pod(&ls_cfg).await.unwrap();
    cleanup.pods.push(ls_pod.clone());
    cleanup.cgroups = vec![
        be_cgp.clone(),
        ls_cgp.clone(),
        be_parent.clone(),
        format!("{root}/burstable"),
        root.clone(),
    ];
    let ls_ctr = via
        .create(
            &ls_pod,
            &ls_cfg,
            container_config(
                "spin",
                "while [ ! -e /tmp/go ]; do sleep 0.1; done; while [ ! -e /tmp/stop ]; do :; done; while :; do sleep 1; done",
                Some(cri::LinuxContainerResources {
                    cpu_period: 100_000,
                    cpu_shares: 1024,
                    ..Default::default()
                }),
            ),
        )
        .await
        .unwrap();
    via.start(&ls_ctr).await.unwrap();

    // LS idle: BE may use 2 x 45% - system, about 0.8 cores; the quota settles there
    let q0 = eventually(
        "the BE quota to settle",
        Duration::from_secs(30),
        || async {
            let p = try_plan(&q.admin, "cpu-suppress").await.ok()?;
            let cur = quota(&be_parent);
            (p.be_usage_cores > 0.5 && cur > 50_000 && cur <= 100_000 && p.written == 0)
                .then_some(cur)
        },
    )
    .await;
    let p = plan(&q.admin, "cpu-suppress").await;
    assert_eq!(p.suppress_policy, "cfsQuota");
    assert!(p.writes[0].rule.contains("BE allowance"), "{p:?}");
    assert_eq!(
        p.writes[0].files[1].path,
        format!("/sys/fs/cgroup/cpu{be_parent}/cpu.cfs_quota_us")
    );

    // LS load rises: the quota is cut within 2 ticks of the engine seeing it
    // (the load begins inside the exec, and runc exec under load can take
    // longer than a tick: the ticks the exec took are allowed on top)
    let start = plan(&q.admin, "").await.tick;
    exec(&mut via, &ls_ctr, "touch /tmp/go").await;
    let exec_ticks = plan(&q.admin, "").await.tick - start;
    let seen = eventually(
        "the engine to see the LS load",
        Duration::from_secs(10),
        || async {
            let p = plan(&q.admin, "").await;
            (p.non_be_usage_cores >= 0.3).then_some(p.tick)
        },
    )
    .await;
    assert!(
        seen - start <= 3 + exec_ticks,
        "LS load seen {} ticks after it began (the exec took {exec_ticks})",
        seen - start
    );
    next_tick(&q.admin, seen).await;
    let cut = quota(&be_parent);
    assert!(
        cut <= q0 / 2,
        "BE quota {cut} not cut from {q0} within 2 ticks"
    );
    // at the floor (2 x 45% - 1 core of LS < 0): level high, and the kernel throttles BE
    let p = eventually("BE at the floor", Duration::from_secs(10), || async {
        let p = plan(&q.admin, "cpu-suppress").await;
        (quota(&be_parent) == 2000 && p.level == "high").then_some(p)
    })
    .await;
    let (_, text) = http_get(port, "/metrics");
    assert!(text.contains("\nqoslet_be_suppress_level 2\n"), "{text}");
    let (thr0, ns0, t0) = (throttled(&be_parent), cpu_ns(&be_parent), Instant::now());
    // steady: three ticks in a row write nothing at all
    let mut tick = p.tick;
    for _ in 0..3 {
        let p = next_tick(&q.admin, tick).await;
        tick = p.tick;
        assert_eq!(p.written, 0, "steady state wrote: {p:?}");
        assert!(p.drift.is_empty() && p.errors.is_empty(), "{p:?}");
    }
    let secs = t0.elapsed().as_secs_f64();
    let periods = throttled(&be_parent) - thr0;
    let be_cores = (cpu_ns(&be_parent) - ns0) as f64 / 1e9 / secs;
    assert!(
        periods as f64 >= secs * 10.0 * 0.8,
        "{periods} throttled periods in {secs:.1}s"
    );
    assert!(be_cores < 0.05, "BE used {be_cores:.3} cores at the floor");

    // LS load stops: the quota comes back stepwise, at most 10% of the node (0.2 cores) a tick
    exec(&mut via, &ls_ctr, "touch /tmp/stop").await;
    let mut steps = vec![quota(&be_parent)];
    let deadline = Instant::now() + Duration::from_secs(30);
    while *steps.last().unwrap() < q0 * 9 / 10 {
        assert!(Instant::now() < deadline, "not restored: {steps:?}");
        let p = next_tick(&q.admin, tick).await;
        tick = p.tick;
        let cur = quota(&be_parent);
        if cur != *steps.last().unwrap() {
            steps.push(cur);
        }
    }
    assert!(steps.len() >= 4, "restored in one go: {steps:?}");
    for w in steps.windows(2) {
        assert!(
            w[1] - w[0] <= 20_000 + 100,
            "a step over 10% of the node: {steps:?}"
        );
    }

    // someone else raises the BE quota: cut back at the next tick
    std::fs::write(
        format!("/sys/fs/cgroup/cpu{be_parent}/cpu.cfs_quota_us"),
        "500000",
    )
    .unwrap();
    let p = next_tick(&q.admin, tick).await;
    next_tick(&q.admin, p.tick).await;
    assert!(quota(&be_parent) < 500_000);
    // drift in a file the hooks set (the BE pod's SCHED_IDLE): put back within the
    // drift check interval (3 s) and reported
    assert_eq!(cgroup_v1("cpu", &be_cgp, "cpu.idle"), "1");
    std::fs::write(format!("/sys/fs/cgroup/cpu{be_cgp}/cpu.idle"), "0").unwrap();
    let drift = eventually("drift put back", Duration::from_secs(10), || async {
        let p = plan(&q.admin, "").await;
        (!p.drift.is_empty()).then_some(p.drift)
    })
    .await;
    assert!(
        drift[0].contains("podbe") && drift[0].contains("cpu-idle"),
        "{drift:?}"
    );
    assert_eq!(cgroup_v1("cpu", &be_cgp, "cpu.idle"), "1");

    // an invalid policy is refused and the last good one stays in force
    tokio::time::sleep(Duration::from_millis(1100)).await; // a new mtime second
    std::fs::write(
        &config,
        policy(&be_parent, "").replace(
            "cpuSuppressThresholdPercent: 45",
            "cpuSuppressThresholdPercent: 450",
        ),
    )
    .unwrap();
    let err = eventually("the reload error", Duration::from_secs(10), || async {
        let p = plan(&q.admin, "").await;
        (!p.policy_error.is_empty()).then_some(p.policy_error)
    })
    .await;
    assert!(err.contains("cpuSuppressThresholdPercent"), "{err}");
    let p = plan(&q.admin, "").await;
    assert_eq!(p.suppress_policy, "cfsQuota");
    // the policy hub says which source is in force and that the file's change was refused
    assert_eq!(p.policy_source, "file");
    assert!(
        p.policy_sources
            .iter()
            .any(|s| s.source == "file" && s.state == "invalid" && s.in_force),
        "{:?}",
        p.policy_sources
    );
    // a valid one applies at once: suppress off puts the quota back to unlimited
    std::fs::write(
        &config,
        policy(&be_parent, "").replace("enable: true", "enable: false"),
    )
    .unwrap();
    eventually(
        "suppress off, quota unlimited",
        Duration::from_secs(10),
        || async {
            let p = plan(&q.admin, "").await;
            (p.policy_error.is_empty()
                && p.suppress_policy == "disabled"
                && quota(&be_parent) == -1)
                .then_some(())
        },
    )
    .await;
    assert!(q.sigterm(Duration::from_secs(10)).success());

    // a dry run plans the cut but writes nothing
    std::fs::write(&config, policy(&be_parent, "")).unwrap();
    let q2 = QosletProcess::start_with(
        &dir,
        &tb.sock,
        &[&format!("--config={}", config.display()), "--dry-run"],
    );
    let p = eventually("a dry-run plan", Duration::from_secs(30), || async {
        let p = try_plan(&q2.admin, "cpu-suppress").await.ok()?;
        (!p.writes.is_empty()).then_some(p)
    })
    .await;
    assert!(p.dry_run);
    assert_eq!(p.writes[0].state, "would-write", "{p:?}");
    assert_eq!(quota(&be_parent), -1, "a dry run wrote");
    drop(q2);

    drop(cleanup);
}
