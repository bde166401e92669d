use super::observe::{find_be_parent, numa, Topology};
use super::*;
use crate::policy::ResourceThresholdStrategy;
use crate::source::{PolicyConfig, Published};
use qoslet_hooks::{PodClass, QosClass};
use qoslet_state::inventory::{ContainerEntry, PodEntry};

/// Ticks pushed by the test, as the metrics collector would.
#[derive(Default)]
struct FakeTicks {
    latest: Mutex<Option<Arc<Tick>>>,
    ticked: tokio::sync::Notify,
}

impl FakeTicks {
    fn push(&self, ts: u32, node_cores: f64) {
        *lock(&self.latest) = Some(Arc::new(Tick {
            ts,
            node: vec![(Metric::CpuCapacity, 4.0), (Metric::CpuUsage, node_cores)],
            system: vec![(Metric::CpuUsage, 0.1)],
            be: vec![(Metric::CpuUsage, 0.0)],
            ..Default::default()
        }));
        self.ticked.notify_waiters();
    }
}

impl Ticks for FakeTicks {
    fn latest(&self) -> Option<Arc<Tick>> {
        lock(&self.latest).clone()
    }
    fn ticked(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(self.ticked.notified())
    }
}

/// The synthetic node's pods as an inventory.
struct FakeInventory(Arc<Inventory>);

impl InventorySource for FakeInventory {
    fn current(&self) -> Arc<Inventory> {
        self.0.clone()
    }
}

fn inventory(pods: &[Pod]) -> Inventory {
    Inventory {
        generation: 1,
        pods: pods
            .iter()
            .map(|p| PodEntry {
                id: p.id.clone(),
                name: p.id.clone(),
                namespace: "ns".into(),
                uid: String::new(),
                labels: Default::default(),
                created_at: 0,
                priority: None,
                cluster: None,
                cgroup: p.cgroup.clone(),
                class: Some(PodClass {
                    class: p.class,
                    by_label: true,
                    trusted: true,
                    kube: None,
                }),
                annotations: p.annotations.clone(),
                limits: p.limits,
                containers: p
                    .containers
                    .iter()
                    .map(|c| ContainerEntry {
                        id: c.entry.id.clone(),
                        name: c.entry.name.clone(),
                        cgroup: c.entry.cgroup.clone(),
                        memory_limit: c.entry.memory_limit,
                        cpu_quota: c.entry.cpu_quota,
                        cpu_period: c.entry.cpu_period,
                        cpuset_cpus: c.entry.cpuset_cpus.clone(),
                        oom_score_adj: c.entry.oom_score_adj,
                        cpu_shares: 0,
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The runner's loop under paused time: it ticks once per fresh metrics tick
/// (never on a stale one), plans from the inventory and the published policy,
/// writes the BE quota when LS load rises, takes a reloaded policy at its next
/// tick, and stops on shutdown.
#[tokio::test(start_paused = true)]
async fn the_loop_ticks_on_fresh_metrics_follows_the_policy_and_stops() {
    let (d, cg, inv, settings, env) = synthetic("runner");
    assert!(inv
        .pods
        .iter()
        .any(|p| p.class.is_some_and(|c| c.class == QosClass::Be)));
    let shared = Shared::new(cg.clone(), false);
    let mut policy = PolicyConfig {
        resource_used_threshold_with_be: ResourceThresholdStrategy {
            enable: true,
            cpu_suppress_policy: CpuSuppressPolicy::CfsQuota,
            ..Default::default()
        },
        ..Default::default()
    };
    let (ptx, prx) = watch::channel(Arc::new(Published::new(policy.clone())));
    let ticks = Arc::new(FakeTicks::default());
    let inv = Arc::new(FakeInventory(Arc::new(inv)));
    let (stop, stopped) = watch::channel(false);
    let task =
        tokio::spawn(
            shared
                .clone()
                .run(settings, prx, env, None, ticks.clone(), inv, stopped),
        );
    let tick_no = |s: &Shared| lock(&s.last).as_ref().map(|l| l.seq).unwrap_or(0);
    // no metrics yet: no tick
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(tick_no(&shared), 0);
    // a fresh tick each second: planned right after it (not at the loop's next
    // second), one engine tick each, the BE quota cut for LS load
    for ts in 1..=3 {
        ticks.push(ts, 3.5);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            tick_no(&shared),
            u64::from(ts),
            "planned right after metrics tick {ts}"
        );
        tokio::time::sleep(Duration::from_millis(990)).await;
    }
    assert_eq!(tick_no(&shared), 3, "one tick per fresh metrics tick");
    let quota = crate::synth::be_quota(&cg).unwrap();
    assert!(
        quota.is_some_and(|q| q < 400_000),
        "BE capped under LS load: {quota:?}"
    );
    // the same metrics tick again: nothing planned
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(
        tick_no(&shared),
        3,
        "a stale metrics tick is not planned again"
    );
    // a reloaded policy (suppress off) is in force at the next tick
    policy.resource_used_threshold_with_be.enable = false;
    ptx.send(Arc::new(Published::new(policy))).unwrap();
    ticks.push(4, 3.5);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(tick_no(&shared), 4);
    assert_eq!(
        lock(&shared.last).as_ref().map(|l| l.policy),
        Some("disabled"),
        "the reloaded policy is the one planned with"
    );
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the loop stops on shutdown")
        .unwrap();
    let _ = std::fs::remove_dir_all(&d);
}

fn scratch(tag: &str) -> PathBuf {
    qoslet_cgroups::testing::tree::<&str, &str>(&format!("runner-{tag}"), &[])
}

/// Issue 15 item 12: the NUMA layout follows CPU hotplug.
#[test]
fn topology_is_read_again_when_cpus_go_online() {
    let d = scratch("topology");
    let node = |n: u32, cpus: &str| {
        let p = d.join(format!("devices/system/node/node{n}"));
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("cpulist"), cpus).unwrap();
    };
    std::fs::create_dir_all(d.join("devices/system/cpu")).unwrap();
    std::fs::write(d.join("devices/system/cpu/online"), "0-1\n").unwrap();
    node(0, "0-1\n");
    // hyper-thread siblings: CPUs 0 and 2 share core 0, 1 and 3 core 1, on socket 0
    for (cpu, siblings) in [(0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")] {
        let p = d.join(format!("devices/system/cpu/cpu{cpu}/topology"));
        std::fs::create_dir_all(&p).unwrap();
        // core ids that mislead (arm64 clusters restart them): siblings decide
        std::fs::write(p.join("core_id"), "0\n").unwrap();
        std::fs::write(p.join("thread_siblings_list"), format!("{siblings}\n")).unwrap();
        std::fs::write(p.join("physical_package_id"), "0\n").unwrap();
    }
    let mut t = Topology::default();
    assert_eq!(t.refresh(&d, 2.0).numa, [vec![0, 1]]);
    node(1, "2-3\n");
    assert_eq!(
        t.refresh(&d, 2.0).numa,
        [vec![0, 1]],
        "no change online: no re-read"
    );
    std::fs::write(d.join("devices/system/cpu/online"), "0-3\n").unwrap();
    let t = t.refresh(&d, 4.0);
    assert_eq!(t.numa, [vec![0, 1], vec![2, 3]]);
    let cores: Vec<(u32, u32)> = t.places.iter().map(|(c, p)| (*c, p.core)).collect();
    assert_eq!(cores, [(0, 0), (1, 1), (2, 0), (3, 1)]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn numa_nodes_from_sys_with_fallbacks() {
    let d = scratch("numa");
    for (n, l) in [("node1", "4-7\n"), ("node0", "0-3\n")] {
        std::fs::create_dir_all(d.join("devices/system/node").join(n)).unwrap();
        std::fs::write(d.join("devices/system/node").join(n).join("cpulist"), l).unwrap();
    }
    assert_eq!(numa(&d, 8.0), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    std::fs::remove_dir_all(d.join("devices/system/node")).unwrap();
    std::fs::create_dir_all(d.join("devices/system/cpu")).unwrap();
    std::fs::write(d.join("devices/system/cpu/online"), "0-1\n").unwrap();
    assert_eq!(numa(&d, 8.0), vec![vec![0, 1]]);
    assert_eq!(numa(&d.join("none"), 3.0), vec![vec![0, 1, 2]]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn be_parent_and_its_quota_on_v1_and_v2() {
    let d = scratch("quota");
    for (f, c) in [
        ("v1/cpu/cgroup.procs", ""),
        ("v1/cpu/kubepods/besteffort/cgroup.procs", ""),
        ("v1/cpu/kubepods/besteffort/cpu.cfs_quota_us", "-1\n"),
        ("v1/cpu/kubepods/besteffort/cpu.cfs_period_us", "100000\n"),
        ("v2/cgroup.controllers", "cpu memory\n"),
        (
            "v2/kubepods.slice/kubepods-besteffort.slice/cgroup.procs",
            "",
        ),
        (
            "v2/kubepods.slice/kubepods-besteffort.slice/cpu.max",
            "20000 50000\n",
        ),
    ] {
        std::fs::create_dir_all(d.join(f).parent().unwrap()).unwrap();
        std::fs::write(d.join(f), c).unwrap();
    }
    let v1 = Cgroups::detect(&d.join("v1")).unwrap();
    let bp = find_be_parent(&v1, None, &qoslet_cgroups::PodRoot::default(), None).unwrap();
    assert_eq!(bp.as_str(), "kubepods/besteffort");
    assert_eq!(v1.read_cpu_quota(&bp), Some((None, 100_000)));
    let v2 = Cgroups::detect(&d.join("v2")).unwrap();
    let bp = find_be_parent(&v2, None, &qoslet_cgroups::PodRoot::default(), None).unwrap();
    assert_eq!(bp.as_str(), "kubepods.slice/kubepods-besteffort.slice");
    assert_eq!(v2.read_cpu_quota(&bp), Some((Some(20_000), 50_000)));
    let other = CgroupPath::parse("/custom/be").unwrap();
    assert_eq!(
        find_be_parent(&v2, Some(&other), &qoslet_cgroups::PodRoot::default(), None),
        Some(other)
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// A synthetic v1 node (2 LS, 2 BE pods on 4 CPUs), its settings and env.
fn synthetic(tag: &str) -> (PathBuf, Cgroups, Inventory, Settings, Env) {
    let d = scratch(tag);
    let shape = crate::synth::Shape {
        ls_pods: 2,
        be_pods: 2,
        containers_per_pod: 1,
        ls_limit_cores: 2.0,
        cpus: 4,
    };
    let pods = crate::synth::build(&d, &shape).unwrap();
    let cg = Cgroups::detect(&d).unwrap();
    let settings = Settings {
        interval: Duration::from_secs(1),
        dry_run: false,
        be_parent: Some(crate::synth::be_parent()),
        reserved: Default::default(),
        verify_every: 10,
        sys_root: d.join("sys"),
        trust: Default::default(),
        pod_root: Default::default(),
        proc_root: d.join("proc"),
        restore_on_exit: false,
        cpu_manager: CpuManager::None,
    };
    let env = Env {
        features: cg.host().features.clone(),
        v2: false,
        devices: Default::default(),
        page_size: 4096,
        node: Default::default(),
    };
    let inv = inventory(&pods);
    (d, cg, inv, settings, env)
}

fn metrics_tick(ts: u32, node_cores: Option<f64>) -> Tick {
    let mut node = vec![(Metric::CpuCapacity, 4.0)];
    node.extend(node_cores.map(|c| (Metric::CpuUsage, c)));
    Tick {
        ts,
        node,
        system: vec![(Metric::CpuUsage, 0.1)],
        be: vec![(Metric::CpuUsage, 0.0)],
        ..Default::default()
    }
}

fn suppress_on() -> Policy {
    PolicyConfig {
        resource_used_threshold_with_be: ResourceThresholdStrategy {
            enable: true,
            cpu_suppress_policy: CpuSuppressPolicy::CfsQuota,
            ..Default::default()
        },
        ..Default::default()
    }
    .engine()
}

/// Issue 28 item 7: one tick is a synchronous function, tested without a
/// runtime: it writes the BE quota under LS load, then holds (the files are
/// right: nothing written, the writes skipped until their drift check).
#[test]
fn a_step_plans_and_applies_and_the_next_one_holds() {
    let (d, cg, inv, s, env) = synthetic("step");
    let policy = suppress_on();
    let mut step = Step::new(s.verify_every);
    let t1 = metrics_tick(1, Some(3.5));
    let first = step.step(&input(&s, &cg, &t1, &inv, &policy, &env));
    assert_eq!(first.seq, 1);
    assert_eq!(first.policy, "cfsQuota");
    assert!(first.counts.0 > 0, "written: {:?}", first.counts);
    assert!(first.errors.is_empty(), "{:?}", first.errors);
    let quota = crate::synth::be_quota(&cg).unwrap();
    assert!(quota.is_some_and(|q| q < 400_000), "BE capped: {quota:?}");
    let t2 = metrics_tick(2, Some(3.5));
    let second = step.step(&input(&s, &cg, &t2, &inv, &policy, &env));
    assert_eq!(second.seq, 2);
    assert_eq!(second.counts.0, 0, "nothing to write: {:?}", second.counts);
    assert!(second.counts.2 > 0, "skipped: {:?}", second.counts);
    let _ = std::fs::remove_dir_all(&d);
}

/// One tick's inputs (no resctrl).
fn input<'a>(
    settings: &'a Settings,
    cgroups: &'a Cgroups,
    tick: &'a Tick,
    inventory: &'a Inventory,
    policy: &'a Policy,
    env: &'a Env,
) -> Input<'a> {
    Input {
        settings,
        cgroups,
        rdt: None,
        tick,
        inventory,
        policy,
        env,
    }
}

/// A node CPU figure the collector could not measure is the last one for
/// five ticks, then unknown (suppress leaves the BE quota alone).
#[test]
fn a_missing_node_figure_is_the_last_one_for_five_ticks_then_unknown() {
    let (d, cg, inv, s, env) = synthetic("stale");
    let policy = suppress_on();
    let mut step = Step::new(s.verify_every);
    let mut run = |ts: u32, cores: Option<f64>| {
        let t = metrics_tick(ts, cores);
        let l = step.step(&input(&s, &cg, &t, &inv, &policy, &env));
        (l.state.usage_known, l.state.node_usage_cores)
    };
    assert_eq!(run(1, Some(3.5)), (true, 3.5));
    for ts in 2..=6 {
        assert_eq!(run(ts, None), (true, 3.5), "tick {ts}: the last figure");
    }
    assert!(!run(7, None).0, "older than five ticks: unknown");
    assert_eq!(run(8, Some(1.0)), (true, 1.0));
    let _ = std::fs::remove_dir_all(&d);
}

/// Without a besteffort parent, CPU suppress is off (said once, not every
/// tick) and nothing is written to a cgroup that is not there.
#[test]
fn no_be_parent_turns_suppress_off_for_the_tick() {
    let (d, cg, inv, mut s, env) = synthetic("nobe");
    // not configured, and kubelet's pods are under another root: none found
    s.be_parent = None;
    s.pod_root = qoslet_cgroups::PodRoot::new("elsewhere").unwrap();
    let policy = suppress_on();
    let mut step = Step::new(s.verify_every);
    let t = metrics_tick(1, Some(3.5));
    let l = step.step(&input(&s, &cg, &t, &inv, &policy, &env));
    assert_eq!(l.policy, "disabled");
    assert_eq!(l.state.be_parent, CgroupPath::root());
    assert_eq!(
        crate::synth::be_quota(&cg).unwrap(),
        None,
        "BE left unlimited"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Issue 28 item 7: the share pool is computed once — the hooks' placement
/// (from the inventory) and the engine's tick (from its pods) bind the same
/// CPUs with one function, against the CPUs online now.
#[test]
fn the_hooks_and_the_engine_take_one_share_pool() {
    let d = scratch("pool");
    let shape = crate::synth::Shape {
        ls_pods: 3,
        be_pods: 1,
        containers_per_pod: 2,
        ls_limit_cores: 2.0,
        cpus: 8,
    };
    let mut pods = crate::synth::build(&d, &shape).unwrap();
    let ls: Vec<usize> = (0..pods.len())
        .filter(|&i| pods[i].class == QosClass::Ls)
        .collect();
    for (i, class, cpus) in [(ls[0], QosClass::Lsr, "2-3"), (ls[1], QosClass::Lse, "4-5")] {
        pods[i].class = class;
        pods[i].annotations.insert(
            qoslet_hooks::decide::ANNOTATION_RESOURCE_STATUS.into(),
            format!(r#"{{"cpuset":"{cpus}"}}"#),
        );
    }
    let node = qoslet_hooks::decide::NodeFacts {
        online_cpus: (0..8).collect(),
        ..Default::default()
    };
    let inv = inventory(&pods);
    let hooks = inv.bound(&node);
    let mut state = crate::synth::node_state(8, 1.0, 0.1, &pods, None);
    state.numa = vec![(0..8).collect()];
    let env = Env {
        node: node.clone(),
        ..Default::default()
    };
    let policy = Policy::default();
    let (_, engine) = crate::engine::reconcile_all(&state, &env.context(&policy.qos));
    assert_eq!(hooks, engine);
    assert_eq!(hooks.lsr, [2, 3].into());
    assert_eq!(hooks.lse, [4, 5].into());
    assert_eq!(hooks.pods.len(), 2);
    assert_eq!(
        hooks.share_pool(&node.online_cpus),
        [0, 1, 6, 7].into(),
        "the share pool both place LS containers on"
    );
    let _ = std::fs::remove_dir_all(&d);
}
