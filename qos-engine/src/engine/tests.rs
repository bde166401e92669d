use super::*;
use crate::reconcile::Container;
use qoslet_cgroups::memfs::MemFs;

fn pod(id: &str, class: QosClass, parent: &str, cores: f64, quota: i64) -> Pod {
    let cg = CgroupPath::parse(&format!("{parent}/pod{id}")).unwrap();
    Pod {
        id: id.into(),
        class,
        by_label: true,
        trusted: true,
        kube: None,
        cgroup: cg.clone(),
        annotations: BTreeMap::new(),
        spec_batch: None,
        limits: Default::default(),
        sandbox: None,
        cpu_cores: cores,
        containers: vec![Container {
            entry: qoslet_state::inventory::ContainerEntry {
                id: format!("c{id}"),
                name: "main".into(),
                cgroup: cg.container(&format!("c{id}")).unwrap(),
                memory_limit: 0,
                cpu_quota: quota,
                cpu_period: 100_000,
                cpuset_cpus: String::new(),
                oom_score_adj: 0,
                cpu_shares: 0,
            },
            cpu_cores: cores,
            throttled_ratio: 0.5,
        }],
    }
}

fn state(ls: f64, be: f64, quota: Option<u64>) -> NodeState {
    NodeState {
        pods_usage_cores: None,
        be_usage_cores: None,
        usage_known: true,
        capacity_cores: 16.0,
        node_usage_cores: ls + be + 0.5,
        system_usage_cores: 0.5,
        reserved_cores: 1.0,
        pods: vec![
            pod("ls", QosClass::Ls, "/kubepods/burstable", ls, 200_000),
            pod("be", QosClass::Be, "/kubepods/besteffort", be, -1),
        ],
        be_parent: CgroupPath::parse("/kubepods/besteffort").unwrap(),
        be_quota_us: quota,
        period_us: 100_000,
        numa: vec![(0..16).collect()],
        places: BTreeMap::new(),
        be_cpuset: None,
        qos_dirs: Vec::new(),
        cpuset_ceiling: None,
        static_cpu_manager: false,
        shared_pool: None,
        ancestors: BTreeMap::new(),
        pods_generation: None,
    }
}

fn cfs(threshold: i64) -> Policy {
    Policy {
        threshold: ResourceThresholdStrategy {
            enable: true,
            cpu_suppress_threshold_percent: threshold,
            cpu_suppress_policy: CpuSuppressPolicy::CfsQuota,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn suppress_writes(t: &TickResult) -> Vec<&Write> {
    t.plan
        .writes()
        .iter()
        .filter(|w| w.plugin == Plugin::CpuSuppress)
        .collect()
}

fn tree() -> (std::sync::Arc<MemFs>, Cgroups) {
    let mut files = vec![
        ("cpu/cgroup.procs".to_string(), ""),
        ("cpuset/cgroup.procs".to_string(), ""),
    ];
    for cg in [
        "kubepods/besteffort",
        "kubepods/besteffort/podbe",
        "kubepods/besteffort/podbe/cbe",
        "kubepods/burstable/podls",
        "kubepods/burstable/podls/cls",
    ] {
        files.push((format!("cpu/{cg}/cpu.cfs_quota_us"), "-1\n"));
        files.push((format!("cpu/{cg}/cpu.cfs_period_us"), "100000\n"));
        files.push((format!("cpuset/{cg}/cpuset.cpus"), "0-15\n"));
    }
    MemFs::v1_tree(&files)
}

/// Issue 14 item 5 on a v1 tree: an LSR pod bound to CPUs 2-3 runs
/// without CFS quota (pod and container, koordlet's
/// `SetContainerCPUSetAndUnsetCFS` / `UnsetPodCPUQuota` reconcilers); the LS
/// pod moves to the share pool without them (`calCPUSharePools`); when the
/// binding goes (here: the pod is no longer trusted nor labelled), quota and
/// cpusets go back to kubelet's, and the LS pod back to every CPU.
#[test]
fn cpuset_bound_pods_unset_quota_and_ls_share_the_rest() {
    let mut files = vec![
        ("cpu/cgroup.procs".to_string(), ""),
        ("cpuset/cgroup.procs".to_string(), ""),
    ];
    for (cg, quota) in [
        ("kubepods/burstable/podls", "200000\n"),
        ("kubepods/burstable/podls/cls", "200000\n"),
        ("kubepods/podlsr", "200000\n"),
        ("kubepods/podlsr/clsr", "200000\n"),
    ] {
        files.push((format!("cpu/{cg}/cpu.cfs_quota_us"), quota));
        files.push((format!("cpu/{cg}/cpu.cfs_period_us"), "100000\n"));
        files.push((format!("cpuset/{cg}/cpuset.cpus"), "0-15\n"));
    }
    let (m, cg) = MemFs::v1_tree(&files);
    let env = Env {
        features: cg.host().features.clone(),
        node: NodeFacts {
            online_cpus: (0..16).collect(),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut lsr = pod("lsr", QosClass::Lsr, "/kubepods", 1.0, 200_000);
    lsr.annotations.insert(
        qoslet_hooks::decide::ANNOTATION_RESOURCE_STATUS.into(),
        r#"{"cpuset":"2-3"}"#.into(),
    );
    lsr.limits = qoslet_hooks::decide::SandboxLimits {
        memory_limit: 0,
        cpu_quota: 200_000,
        cpu_period: 100_000,
    };
    let ls = pod("ls", QosClass::Ls, "/kubepods/burstable", 1.0, 200_000);
    let mut s = state(1.0, 0.0, None);
    s.pods = vec![ls.clone(), lsr.clone()];
    let mut e = Engine::new(1);
    let get = |f: &str| m.at(f).unwrap();
    let t = e.plan(&s, &Policy::default(), &env);
    let r = e.execute(&t.plan, &cg);
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(get("cpuset/kubepods/podlsr/clsr/cpuset.cpus"), "2-3");
    assert_eq!(get("cpu/kubepods/podlsr/clsr/cpu.cfs_quota_us"), "-1");
    assert_eq!(get("cpu/kubepods/podlsr/cpu.cfs_quota_us"), "-1");
    assert_eq!(
        get("cpuset/kubepods/burstable/podls/cls/cpuset.cpus"),
        "0-1,4-15"
    );
    assert_eq!(
        get("cpu/kubepods/burstable/podls/cls/cpu.cfs_quota_us"),
        "200000"
    );
    // the LSR container not running (a crash, a restart): its pod's binding
    // still keeps its CPUs out of the pool
    let mut restarting = lsr.clone();
    restarting.containers.clear();
    s.pods = vec![ls.clone(), restarting];
    let t = e.plan(&s, &Policy::default(), &env);
    assert_eq!(
        t.plan
            .get(&(
                ls.containers[0].entry.cgroup.clone(),
                KnobKind::CpusetCpus,
                None
            ))
            .map(|w| w.knob.clone()),
        Some(Knob::CpusetCpus("0-1,4-15".into()))
    );
    // the LSR pod gone: the LS container back on every CPU (once); the
    // binding's quota -1 is what the runtime keeps, never "restored" under it
    s.pods = vec![ls.clone()];
    let t = e.plan(&s, &Policy::default(), &env);
    assert!(
        !t.plan
            .writes()
            .iter()
            .any(|w| matches!(w.knob, Knob::CpusetCpus(_))),
        "nothing pinned: {:?}",
        t.plan.writes()
    );
    let r = e.execute(&t.plan, &cg);
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(
        get("cpuset/kubepods/burstable/podls/cls/cpuset.cpus"),
        "0-15"
    );
    assert_eq!(get("cpu/kubepods/podlsr/clsr/cpu.cfs_quota_us"), "-1");
    // `qoslet restore` puts the bound pod's own quota back to its containers'
    // sum (kubelet's); the containers' stay as the runtime has them
    let mut s2 = s.clone();
    s2.pods.push(lsr.clone());
    let plan = restore_plan(&s2, &Policy::default(), &env, &Found::default());
    assert_eq!(
        plan.get(&(lsr.cgroup.clone(), KnobKind::CpuQuota, None))
            .map(|w| w.knob.clone()),
        Some(Knob::CpuQuota {
            quota: Some(200_000),
            period: 100_000
        })
    );
    assert_eq!(
        plan.get(&(
            ls.containers[0].entry.cgroup.clone(),
            KnobKind::CpusetCpus,
            None
        ))
        .map(|w| w.knob.clone()),
        Some(Knob::CpusetCpus("0-15".into())),
        "a share-pool cpuset back to every CPU"
    );
    // and stay so (restored once, not rewritten every tick)
    let before = m.writes().len();
    let t = e.plan(&s, &Policy::default(), &env);
    let r = e.execute(&t.plan, &cg);
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(m.writes().len(), before);
}

/// Issue 14: on an Anolis-shaped tree (`cpu.bvt_warp_ns` in every cgroup),
/// group identity lands on the pods, their containers and the kube QoS
/// dirs (kubepods 0, burstable LS 2, besteffort BE -1, as koordlet's
/// groupidentity rule), and turning cpuQOS off writes 0 back everywhere.
#[test]
fn group_identity_on_an_anolis_tree_and_written_back_when_off() {
    let mut files = vec![("cpu/cgroup.procs".to_string(), "")];
    let dirs = [
        "kubepods",
        "kubepods/besteffort",
        "kubepods/besteffort/podbe",
        "kubepods/besteffort/podbe/cbe",
        "kubepods/burstable",
        "kubepods/burstable/podls",
        "kubepods/burstable/podls/cls",
    ];
    for cg in dirs {
        files.push((format!("cpu/{cg}/cgroup.procs"), ""));
        files.push((format!("cpu/{cg}/cpu.bvt_warp_ns"), "0\n"));
        files.push((format!("cpu/{cg}/cpu.cfs_quota_us"), "-1\n"));
        files.push((format!("cpu/{cg}/cpu.cfs_period_us"), "100000\n"));
    }
    let (m, cg) = MemFs::v1_tree(&files);
    assert!(cg.host().features.bvt, "cpu.bvt_warp_ns detected");
    let env = Env {
        features: cg.host().features.clone(),
        ..Default::default()
    };
    let mut s = state(1.0, 1.0, None);
    s.qos_dirs = vec![
        (KubeQos::Guaranteed, CgroupPath::parse("kubepods").unwrap()),
        (
            KubeQos::Burstable,
            CgroupPath::parse("kubepods/burstable").unwrap(),
        ),
        (
            KubeQos::BestEffort,
            CgroupPath::parse("kubepods/besteffort").unwrap(),
        ),
    ];
    let read = |cg: &str| m.at(&format!("cpu/{cg}/cpu.bvt_warp_ns")).unwrap();
    let mut p = Policy::default();
    for c in [
        &mut p.qos.lsr_class,
        &mut p.qos.ls_class,
        &mut p.qos.be_class,
    ] {
        c.cpu_qos.enable = true;
    }
    let mut e = Engine::new(1);
    let t = e.plan(&s, &p, &env);
    let r = e.execute(&t.plan, &cg);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    // kubepods, besteffort dir, BE pod, its container, burstable dir, LS pod, its container
    let got: Vec<String> = dirs.iter().map(|c| read(c)).collect();
    assert_eq!(got, ["0", "-1", "-1", "-1", "2", "2", "2"], "{dirs:?}");
    // cpuQOS off: 0 written back everywhere
    let off = Policy::default();
    let t = e.plan(&s, &off, &env);
    let r = e.execute(&t.plan, &cg);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    for c in dirs {
        assert_eq!(read(c), "0", "{c}");
    }
}

/// Issue 13: figures the collector has not measured (the agent's first
/// tick) leave the BE quota as it is; a pod without a reading this tick is
/// still counted through the pods' root cgroup.
#[test]
fn unmeasured_usage_leaves_the_quota_and_unread_pods_still_count() {
    let env = Env::default();
    let p = cfs(50);
    let mut e = Engine::new(10);
    let mut s = state(6.0, 4.0, Some(300_000));
    s.usage_known = false;
    let t = e.plan(&s, &p, &env);
    let w = suppress_writes(&t);
    assert_eq!(
        w[0].knob,
        Knob::CpuQuota {
            quota: Some(300_000),
            period: 100_000
        },
        "left as it is: {w:?}"
    );
    assert!(w[0].rule.contains("not measured"), "{}", w[0].rule);
    // an unlimited quota stays unlimited
    let mut s = state(6.0, 4.0, None);
    s.usage_known = false;
    assert!(suppress_writes(&e.plan(&s, &p, &env)).is_empty());
    // the LS pod has no reading (0), but the pods' root used 10 cores, 4 of
    // them BE: LS is 6, so BE gets 16 x 50% - 6 - 1 = 1 core, not 7
    let mut s = state(0.0, 4.0, None);
    s.pods_usage_cores = Some(10.0);
    let t = e.plan(&s, &p, &env);
    assert_eq!(
        suppress_writes(&t)[0].knob,
        Knob::CpuQuota {
            quota: Some(100_000),
            period: 100_000
        }
    );
    // a BE pod without a reading this tick (0 here) while the besteffort
    // cgroup used 4 cores: those 4 are BE, not LS (10 - 0 would leave BE
    // nothing), so the result is the same 1 core
    let mut s = state(0.0, 0.0, None);
    s.pods_usage_cores = Some(10.0);
    s.be_usage_cores = Some(4.0);
    let t = e.plan(&s, &p, &env);
    assert_eq!(
        suppress_writes(&t)[0].knob,
        Knob::CpuQuota {
            quota: Some(100_000),
            period: 100_000
        }
    );
}

#[test]
fn ls_load_cuts_be_quota_and_steady_state_writes_nothing() {
    let (m, cg) = tree();
    let env = Env::default();
    let p = cfs(50);
    let mut e = Engine::new(10);
    // 16 x 50% - LS 6 - max(system 0.5, reserved 1) = 1 core for BE
    let t = e.plan(&state(6.0, 4.0, None), &p, &env);
    assert_eq!(t.level, Level::Mid);
    assert_eq!(suppress_writes(&t).len(), 1);
    let r = e.execute(&t.plan, &cg);
    assert_eq!((r.written, r.errors.len()), (1, 0), "{r:?}");
    let q = m.at("cpu/kubepods/besteffort/cpu.cfs_quota_us").unwrap();
    assert_eq!(q, "100000");
    // steady state: the plugin keeps the quota, the executor writes nothing
    let t = e.plan(&state(6.0, 4.0, Some(100_000)), &p, &env);
    assert_eq!(
        suppress_writes(&t)[0].knob,
        Knob::CpuQuota {
            quota: Some(100_000),
            period: 100_000
        }
    );
    assert!(suppress_writes(&t)[0].rule.contains("unchanged"));
    assert_eq!(e.execute(&t.plan, &cg).written, 0);
    // LS load gone: restored stepwise (at most 1.6 cores per tick on 16 CPUs)
    let t = e.plan(&state(0.0, 4.0, Some(100_000)), &p, &env);
    assert_eq!(
        suppress_writes(&t)[0].knob,
        Knob::CpuQuota {
            quota: Some(260_000),
            period: 100_000
        }
    );
    // suppress disabled: the quota goes back to unlimited
    let mut off = cfs(50);
    off.threshold.enable = false;
    let t = e.plan(&state(6.0, 4.0, Some(100_000)), &off, &env);
    assert_eq!(
        suppress_writes(&t)[0].knob,
        Knob::CpuQuota {
            quota: None,
            period: 100_000
        }
    );
    assert_eq!(t.level, Level::None);
}

#[test]
fn v1_be_children_are_capped_under_the_parent_and_given_back_their_own() {
    let (m, cg) = tree();
    let mut s = state(7.0, 4.0, None);
    s.pods[1].containers[0].entry.cpu_quota = 300_000; // the BE container's own 3 cores
    let mut e = Engine::new(10);
    let t = e.plan(&s, &cfs(50), &Env::default());
    let w = suppress_writes(&t);
    assert_eq!(w.len(), 2, "{w:?}");
    let r = e.execute(&t.plan, &cg);
    assert!(r.errors.is_empty(), "{r:?}");
    // 16 x 50% - 7 - 1 = 0 -> the floor
    let read = |f: &str| m.at(f).unwrap();
    assert_eq!(read("cpu/kubepods/besteffort/cpu.cfs_quota_us"), "2000");
    assert_eq!(
        read("cpu/kubepods/besteffort/podbe/cbe/cpu.cfs_quota_us"),
        "2000"
    );
    // LS gone: the parent grows stepwise, the child gets its own 3 cores back once under it
    s.pods[0].cpu_cores = 0.0;
    for _ in 0..6 {
        s.be_quota_us = Some(
            read("cpu/kubepods/besteffort/cpu.cfs_quota_us")
                .parse()
                .unwrap(),
        );
        let t = e.plan(&s, &cfs(50), &Env::default());
        let r = e.execute(&t.plan, &cg);
        assert!(r.errors.is_empty(), "{r:?}");
        let parent: u64 = read("cpu/kubepods/besteffort/cpu.cfs_quota_us")
            .parse()
            .unwrap();
        let child: u64 = read("cpu/kubepods/besteffort/podbe/cbe/cpu.cfs_quota_us")
            .parse()
            .unwrap();
        assert!(child <= parent, "child {child} under parent {parent}");
    }
    assert_eq!(
        read("cpu/kubepods/besteffort/podbe/cbe/cpu.cfs_quota_us"),
        "300000"
    );
}

#[test]
fn cpuset_policy_covers_the_be_tree_and_is_put_back_when_off() {
    let (m, cg) = tree();
    let p = Policy {
        threshold: ResourceThresholdStrategy {
            enable: true,
            cpu_suppress_threshold_percent: 50,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut e = Engine::new(10);
    let t = e.plan(&state(6.0, 4.0, None), &p, &Env::default());
    let w = suppress_writes(&t);
    assert_eq!(w.len(), 3, "parent, pod, container: {w:?}");
    // the lowest cores first (koordlet's calculateBESuppressCPUSetPolicy)
    assert!(w.iter().all(|w| w.knob == Knob::CpusetCpus("0-1".into())));
    let r = e.execute(&t.plan, &cg);
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(
        m.at("cpuset/kubepods/besteffort/podbe/cbe/cpuset.cpus")
            .unwrap(),
        "0-1"
    );
    let mut s = state(6.0, 4.0, None);
    s.be_cpuset = Some([0, 1].into());
    let mut off = p.clone();
    off.threshold.cpu_suppress_policy = CpuSuppressPolicy::CfsQuota;
    let t = e.plan(&s, &off, &Env::default());
    assert!(t
        .plan
        .writes()
        .iter()
        .any(|w| w.knob == Knob::CpusetCpus("0-15".into())));
}

#[test]
fn memory_protection_is_summed_up_to_the_qos_dir_and_kubepods() {
    let spec = r#"{"containers":{"main":{"requests":{"kubernetes.io/batch-memory":"1Gi"},"limits":{"kubernetes.io/batch-memory":"2Gi"}}}}"#;
    let mut s = state(1.0, 1.0, None);
    let mut second = s.pods[1].clone();
    second.id = "be2".into();
    second.cgroup = CgroupPath::parse("/kubepods/besteffort/podbe2").unwrap();
    second.containers[0].entry.cgroup = second.cgroup.container("cbe2").unwrap();
    s.pods.push(second);
    for p in s.pods.iter_mut().filter(|p| p.class == QosClass::Be) {
        p.annotations.insert(
            "node.koordinator.sh/extended-resource-spec".into(),
            spec.into(),
        );
    }
    let mut p = cfs(50);
    p.qos.be_class.memory_qos.enable = true;
    p.qos.be_class.memory_qos.min_limit_percent = 50;
    let env = Env {
        features: Features {
            memory_qos: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let t = tick(&s, &p, &env, &HashMap::new());
    let min = |cg: &str| {
        t.plan
            .get(&(CgroupPath::parse(cg).unwrap(), KnobKind::MemoryMin, None))
            .map(|w| w.knob.clone())
    };
    assert_eq!(
        min("kubepods/besteffort/podbe"),
        Some(Knob::MemoryMin(512 << 20))
    );
    assert_eq!(min("kubepods/besteffort"), Some(Knob::MemoryMin(1 << 30)));
    assert_eq!(min("kubepods"), Some(Knob::MemoryMin(1 << 30)));
    assert_eq!(min("kubepods/burstable"), None, "no LS protection asked");
}

/// Review of issue 15 item 10: a parent claims what its children finally
/// got (kubelet's value on the burstable dir plus BE's sum, not the larger
/// of the two, so BE does not share out LS's protection); qoslet's own value
/// read back page-rounded is not another writer's; and another writer's
/// value stays planned when qoslet's sum drops to 0 (never written down to 0).
#[test]
fn ancestors_claim_their_childrens_final_values() {
    let spec = r#"{"containers":{"main":{"requests":{"kubernetes.io/batch-memory":"1Gi"},"limits":{"kubernetes.io/batch-memory":"2Gi"}}}}"#;
    let mut s = state(1.0, 1.0, None);
    s.pods[1].annotations.insert(
        "node.koordinator.sh/extended-resource-spec".into(),
        spec.into(),
    );
    let mut p = cfs(50);
    p.qos.be_class.memory_qos.enable = true;
    p.qos.be_class.memory_qos.min_limit_percent = 30;
    let env = Env {
        features: Features {
            memory_qos: true,
            ..Default::default()
        },
        page_size: 4096,
        ..Default::default()
    };
    let kp = CgroupPath::parse("kubepods").unwrap();
    let bu = CgroupPath::parse("kubepods/burstable").unwrap();
    let be = CgroupPath::parse("kubepods/besteffort").unwrap();
    let gib = 1u64 << 30;
    let min = |t: &TickResult, cg: &CgroupPath| match t
        .plan
        .get(&(cg.clone(), KnobKind::MemoryMin, None))
        .map(|w| &w.knob)
    {
        Some(Knob::MemoryMin(v)) => Some(*v),
        _ => None,
    };
    let be_min = gib * 30 / 100; // 322122547: not a whole number of pages
    let mut e = Engine::new(1);
    s.ancestors = BTreeMap::from([
        ((kp.clone(), KnobKind::MemoryMin), 0),
        ((bu.clone(), KnobKind::MemoryMin), 0),
        ((be.clone(), KnobKind::MemoryMin), 0),
    ]);
    let t = e.plan(&s, &p, &env);
    assert_eq!(min(&t, &be), Some(be_min));
    // the files as the kernel keeps them (whole pages), kubelet's 8 GiB on burstable
    s.ancestors = BTreeMap::from([
        ((kp.clone(), KnobKind::MemoryMin), be_min / 4096 * 4096),
        ((bu.clone(), KnobKind::MemoryMin), 8 * gib),
        ((be.clone(), KnobKind::MemoryMin), be_min / 4096 * 4096),
    ]);
    let t = e.plan(&s, &p, &env);
    assert_eq!(
        min(&t, &be),
        Some(be_min),
        "its own rounded value is not another writer's"
    );
    assert_eq!(min(&t, &bu), Some(8 * gib), "kubelet's value kept");
    assert_eq!(
        min(&t, &kp),
        Some(8 * gib + be_min),
        "the children's claims, summed"
    );
    // BE's protection gone: burstable keeps kubelet's value (not written down to 0)
    s.pods[1].annotations.clear();
    let t = e.plan(&s, &p, &env);
    assert_eq!(min(&t, &bu), Some(8 * gib));
    assert_eq!(min(&t, &kp), Some(8 * gib));
}

/// Issue 15 item 10: kubelet's MemoryQoS writes its own memory.min on the
/// QoS dirs every minute. qoslet keeps the higher of that and its pods' sum
/// instead of writing its sum back each time; a value found at the first
/// sight (an earlier run's own) does not pin the protection.
#[test]
fn an_ancestors_memory_min_from_another_writer_is_kept_when_higher() {
    let spec = r#"{"containers":{"main":{"requests":{"kubernetes.io/batch-memory":"1Gi"},"limits":{"kubernetes.io/batch-memory":"2Gi"}}}}"#;
    let mut s = state(1.0, 1.0, None);
    s.pods[1].annotations.insert(
        "node.koordinator.sh/extended-resource-spec".into(),
        spec.into(),
    );
    let mut p = cfs(50);
    p.qos.be_class.memory_qos.enable = true;
    p.qos.be_class.memory_qos.min_limit_percent = 100;
    let env = Env {
        features: Features {
            memory_qos: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let kp = CgroupPath::parse("kubepods").unwrap();
    let be = CgroupPath::parse("kubepods/besteffort").unwrap();
    let gib = 1u64 << 30;
    let files = |kubepods: u64, besteffort: u64| {
        BTreeMap::from([
            ((kp.clone(), KnobKind::MemoryMin), kubepods),
            ((be.clone(), KnobKind::MemoryMin), besteffort),
        ])
    };
    let min = |t: &TickResult, cg: &CgroupPath| match t
        .plan
        .get(&(cg.clone(), KnobKind::MemoryMin, None))
        .map(|w| &w.knob)
    {
        Some(Knob::MemoryMin(v)) => *v,
        k => panic!("{k:?}"),
    };
    let mut e = Engine::new(1);
    // an earlier run left 5 GiB: taken as qoslet's own, so its sum applies
    s.ancestors = files(5 * gib, 0);
    let t = e.plan(&s, &p, &env);
    assert_eq!((min(&t, &kp), min(&t, &be)), (gib, gib));
    // kubelet writes 3 GiB on kubepods: kept (no fight)
    s.ancestors = files(3 * gib, gib);
    let t = e.plan(&s, &p, &env);
    assert_eq!(min(&t, &kp), 3 * gib);
    assert!(t
        .plan
        .get(&(kp.clone(), KnobKind::MemoryMin, None))
        .unwrap()
        .rule
        .contains("kept"));
    // and stays kept on the next tick (the file now holds what qoslet planned)
    let t = e.plan(&s, &p, &env);
    assert_eq!(min(&t, &kp), 3 * gib);
    // kubelet lowers it below the pods' sum: the sum wins
    s.ancestors = files(gib / 2, gib);
    let t = e.plan(&s, &p, &env);
    assert_eq!(min(&t, &kp), gib);
    // the stateless tick (no files read) plans the sum
    s.ancestors = files(3 * gib, gib);
    assert_eq!(min(&tick(&s, &p, &env, &HashMap::new()), &kp), gib);
}

#[test]
fn reconcile_is_reused_for_the_same_pods_and_policy_only() {
    let env = Env {
        features: Features {
            cpu_idle: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut s = state(1.0, 1.0, None);
    s.pods_generation = Some(7);
    let mut p = cfs(50);
    p.qos.be_class.cpu_qos.enable = true;
    let mut e = Engine::new(10);
    let idle = |t: &TickResult| {
        t.plan
            .writes()
            .iter()
            .any(|w| w.knob == Knob::CpuIdle(true))
    };
    let first = e.plan(&s, &p, &env);
    assert!(idle(&first));
    assert_eq!(
        e.plan(&s, &p, &env).plan,
        first.plan,
        "reused: the same plan"
    );
    p.qos.be_class.cpu_qos.enable = false;
    assert!(
        !idle(&e.plan(&s, &p, &env)),
        "a new policy is reconciled at once"
    );
    p.qos.be_class.cpu_qos.enable = true;
    s.pods.pop();
    s.pods_generation = Some(8);
    assert!(
        !idle(&e.plan(&s, &p, &env)),
        "new pods are reconciled at once"
    );
}

/// Issue 14 item 6, as koordlet's cpuburst plugin does it
/// (`IsPodCPUBurstable`, `getNodeStateForBurst`, `applyCPUBurst`): every pod
/// but those labelled LSR/LSE/BE bursts; the pod's burst is the sum of its
/// containers'; the share pool is the node minus LSE/LSR requests, its usage
/// the node's minus LSE/LSR/BE usage.
#[test]
fn burst_eligibility_pod_sum_and_share_pool_as_koordlet() {
    let mut p = cfs(65);
    p.burst.policy = BurstPolicy::CpuBurstOnly;
    p.burst.cpu_burst_percent = 50;
    let env = Env {
        features: Features {
            cpu_burst: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut s = state(1.0, 1.0, None);
    let labelled_lsr = pod("lsr", QosClass::Lsr, "/kubepods", 2.0, 400_000);
    let unlabelled_gu = Pod {
        by_label: false,
        ..pod("gu", QosClass::Lsr, "/kubepods", 0.5, 200_000)
    };
    let system = pod("sys", QosClass::System, "/kubepods/burstable", 0.1, 100_000);
    let mut two = pod("two", QosClass::Ls, "/kubepods/burstable", 0.2, 100_000);
    let mut second = two.containers[0].clone();
    second.entry.id = "ctwo2".into();
    second.entry.cgroup = two.cgroup.container("ctwo2").unwrap();
    two.containers.push(second);
    s.pods.extend([labelled_lsr, unlabelled_gu, system, two]);
    let t = Engine::new(10).plan(&s, &p, &env);
    let burst_of = |cg: &str| {
        t.plan
            .writes()
            .iter()
            .find_map(|w| match (&w.knob, w.cgroup.as_str() == cg) {
                (Knob::CpuBurst(b), true) => Some(*b),
                _ => None,
            })
    };
    assert_eq!(
        burst_of("kubepods/podlsr/clsr"),
        None,
        "labelled LSR: no burst"
    );
    assert_eq!(burst_of("kubepods/podbe/cbe"), None, "BE: no burst");
    assert_eq!(
        burst_of("kubepods/podgu/cgu"),
        Some(100_000),
        "unlabelled Guaranteed: 50%"
    );
    assert_eq!(
        burst_of("kubepods/burstable/podsys/csys"),
        Some(50_000),
        "SYSTEM"
    );
    assert_eq!(
        burst_of("kubepods/burstable/podtwo"),
        Some(100_000),
        "pod: 2 x 50,000"
    );
    assert_eq!(burst_of("kubepods/burstable/podls"), Some(100_000));
    // the share pool: 16 cores - 4 (the LSR pod's request); usage: the node's
    // 5 minus the LSR pod's 2 and the BE pod's 1 (the unlabelled Guaranteed pod stays in)
    s.node_usage_cores = 5.0;
    let (cap, usage) = burst_pool(&s);
    assert!((cap - 12.0).abs() < 1e-9, "{cap}");
    assert!((usage - 2.0).abs() < 1e-9, "{usage}");
}

/// Review of issue 15 item 7: the kernel checks each quota write against
/// the burst in force. Switching from quota scaling to burst only must not
/// leave a burst above the limit the quota returns to; a burst never exceeds
/// kubelet's limit (the runtime re-writes it on a cpuset-only update); and an
/// in-place resize up is never held below the new limit.
#[test]
fn bursts_stay_within_the_quota_kubelet_and_the_kernel_write() {
    let env = Env {
        features: Features {
            cpu_burst: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut p = cfs(65);
    p.burst.policy = BurstPolicy::Auto;
    let mut e = Engine::new(10);
    let of = |t: &TickResult, cg: &str, burst: bool| {
        t.plan
            .writes()
            .iter()
            .find_map(|w| match (&w.knob, w.cgroup.as_str() == cg) {
                (Knob::CpuBurst(b), true) if burst => Some(*b),
                (Knob::CpuQuota { quota, .. }, true) if !burst => *quota,
                _ => None,
            })
    };
    let c = "kubepods/burstable/podls/cls";
    for _ in 0..3 {
        let t = e.plan(&state(1.0, 1.0, None), &p, &env);
        assert!(
            of(&t, c, true).unwrap() <= 200_000,
            "burst within the limit"
        );
    }
    p.burst.policy = BurstPolicy::CpuBurstOnly;
    let t = e.plan(&state(1.0, 1.0, None), &p, &env);
    assert_eq!(of(&t, c, false), Some(200_000), "quota back to the limit");
    assert_eq!(
        of(&t, c, true),
        Some(200_000),
        "burst within the quota written"
    );
    // kubelet resizes the container up to 4 CPUs: the quota follows at once
    p.burst.policy = BurstPolicy::Auto;
    e.plan(&state(1.0, 1.0, None), &p, &env);
    let mut s = state(10.0, 1.0, None);
    s.pods[0].containers[0].entry.cpu_quota = 400_000;
    let t = e.plan(&s, &p, &env);
    assert!(
        of(&t, c, false).unwrap_or(400_000) >= 400_000,
        "{:?}",
        of(&t, c, false)
    );
}

#[test]
fn burst_scales_ls_quota_while_the_pool_is_idle_and_gives_it_back() {
    let mut p = cfs(65);
    p.burst.policy = BurstPolicy::Auto;
    let env = Env {
        features: Features {
            cpu_burst: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut e = Engine::new(10);
    let quota_of = |t: &TickResult, cg: &str| {
        t.plan
            .writes()
            .iter()
            .find_map(|w| match (&w.knob, w.cgroup.as_str() == cg) {
                (Knob::CpuQuota { quota, .. }, true) => *quota,
                _ => None,
            })
    };
    // idle pool (2.5 of 16 cores), container throttled: x1.2 per tick, pod follows
    let t = e.plan(&state(1.0, 1.0, None), &p, &env);
    assert_eq!(quota_of(&t, "kubepods/burstable/podls/cls"), Some(240_000));
    assert_eq!(quota_of(&t, "kubepods/burstable/podls"), Some(240_000));
    assert!(
        t.plan
            .writes()
            .iter()
            .any(|w| w.knob == Knob::CpuBurst(200_000)),
        "burst clamped to the quota"
    );
    let t = e.plan(&state(1.0, 1.0, None), &p, &env);
    assert_eq!(quota_of(&t, "kubepods/burstable/podls/cls"), Some(288_000));
    // overloaded pool: x0.8 back toward the limit
    let t = e.plan(&state(10.0, 1.0, None), &p, &env);
    assert_eq!(quota_of(&t, "kubepods/burstable/podls/cls"), Some(230_400));
    // burst turned off: back to the limit at once
    p.burst.policy = BurstPolicy::None;
    let t = e.plan(&state(1.0, 1.0, None), &p, &env);
    assert_eq!(quota_of(&t, "kubepods/burstable/podls/cls"), Some(200_000));
    assert_eq!(quota_of(&t, "kubepods/burstable/podls"), Some(200_000));
    let t = e.plan(&state(1.0, 1.0, None), &p, &env);
    assert_eq!(
        quota_of(&t, "kubepods/burstable/podls/cls"),
        None,
        "no longer owned"
    );
}

/// Issue 15 item 9: burst scaling's state is the file's. After a restart
/// (a new engine) an LS quota left at 3x the limit by an earlier run's
/// scaling is put back to the limit when scaling is off, and scaled down
/// from there (not from the limit) when it is on and the pool is overloaded.
#[test]
fn a_scaled_quota_found_after_a_restart_is_taken_from_the_file() {
    let s = state(1.0, 1.0, None);
    let ls = &s.pods[0].containers[0];
    let quota_of = |t: &TickResult| {
        t.plan
            .writes()
            .iter()
            .find(|w| w.cgroup == ls.entry.cgroup && w.knob.kind() == KnobKind::CpuQuota)
            .map(|w| w.knob.clone())
    };
    // scaling off: without the seed nothing is written (the defect)
    let mut e = Engine::new(1);
    assert_eq!(
        quota_of(&e.plan(&s, &Policy::default(), &Env::default())),
        None
    );
    let mut e = Engine::new(1);
    e.seed_quota(ls, Some(600_000));
    let t = e.plan(&s, &Policy::default(), &Env::default());
    assert_eq!(
        quota_of(&t),
        Some(Knob::CpuQuota {
            quota: Some(200_000),
            period: 100_000
        })
    );
    // then the limit is the state: no more seed, no more write after it is put back
    assert!(t.burst_quota.is_empty());
    // scaling on, pool overloaded: 600000 x 0.8
    let mut p = Policy::default();
    p.burst.policy = BurstPolicy::CfsQuotaBurstOnly;
    let mut busy = s.clone();
    busy.node_usage_cores = 15.0;
    let mut e = Engine::new(1);
    e.seed_quota(ls, Some(600_000));
    assert_eq!(
        quota_of(&e.plan(&busy, &p, &Env::default())),
        Some(Knob::CpuQuota {
            quota: Some(480_000),
            period: 100_000
        })
    );
    // a file at or below the limit says nothing; a seed never overrides what the engine knows
    let mut e = Engine::new(1);
    e.seed_quota(ls, Some(100_000));
    assert_eq!(
        quota_of(&e.plan(&s, &Policy::default(), &Env::default())),
        None
    );
}

/// Burst off writes 0 on every limited container and its pod (koordlet's
/// behaviour), so a burst an earlier run left is reset after a restart.
#[test]
fn burst_off_writes_zero() {
    let s = state(1.0, 1.0, None);
    let mut env = Env::default();
    env.features.cpu_burst = true;
    let t = tick(&s, &Policy::default(), &env, &HashMap::new());
    let bursts: Vec<(String, Knob)> = t
        .plan
        .writes()
        .iter()
        .filter(|w| w.knob.kind() == KnobKind::CpuBurst)
        .map(|w| (w.cgroup.as_str().to_string(), w.knob.clone()))
        .collect();
    assert_eq!(
        bursts,
        vec![
            ("kubepods/burstable/podls/cls".into(), Knob::CpuBurst(0)),
            ("kubepods/burstable/podls".into(), Knob::CpuBurst(0)),
        ]
    );
}

/// Issue 15 item 12: a BE child with a shorter CFS period than the
/// besteffort parent is capped at the parent's ratio, never lifted above
/// it by the 2000 us floor (v1 refuses a child above its parent's ratio).
#[test]
fn a_short_period_child_stays_within_the_parents_ratio() {
    let mut s = state(1.0, 1.0, Some(2_000));
    s.pods[1].containers[0].entry.cpu_quota = 5_000;
    s.pods[1].containers[0].entry.cpu_period = 10_000;
    let mut plan = Plan::new();
    cap_be_children(&s, Some(2_000), &mut plan);
    let c = plan
        .get(&(
            s.pods[1].containers[0].entry.cgroup.clone(),
            KnobKind::CpuQuota,
            None,
        ))
        .unwrap();
    match c.knob {
        Knob::CpuQuota {
            quota: Some(q),
            period,
        } => assert!(
            (q as f64 / period as f64) <= 2_000.0 / 100_000.0 + 1e-9 && q >= 1_000,
            "{q}/{period}"
        ),
        ref k => panic!("{k:?}"),
    }
}

/// Issue 15 item 12: on v2 the BE cpuset goes back to the inherited empty
/// value, not a fixed list.
#[test]
fn v2_cpuset_restore_is_the_empty_value() {
    let mut s = state(1.0, 1.0, None);
    s.be_cpuset = Some((0..4).collect());
    let env = Env {
        v2: true,
        ..Default::default()
    };
    let t = tick(&s, &Policy::default(), &env, &HashMap::new());
    let sets: Vec<&Knob> = t
        .plan
        .writes()
        .iter()
        .filter(|w| w.knob.kind() == KnobKind::CpusetCpus)
        .map(|w| &w.knob)
        .collect();
    assert_eq!(sets.len(), 3, "parent, pod, container");
    assert!(sets.iter().all(|k| **k == Knob::CpusetCpus(String::new())));
    let env = Env::default();
    let t = tick(&s, &Policy::default(), &env, &HashMap::new());
    assert!(t
        .plan
        .writes()
        .iter()
        .filter(|w| w.knob.kind() == KnobKind::CpusetCpus)
        .all(|w| w.knob == Knob::CpusetCpus("0-15".into())));
    // and the v2 plan executes on a v2-shaped tree (the empty value is written)
    let mut files = vec![(
        "cgroup.controllers".to_string(),
        "cpuset cpu io memory pids\n",
    )];
    for cg in [
        "kubepods/besteffort",
        "kubepods/besteffort/podbe",
        "kubepods/besteffort/podbe/cbe",
    ] {
        files.push((format!("{cg}/cpuset.cpus"), "0-3\n"));
    }
    let m = MemFs::new();
    for (f, c) in &files {
        m.set(f, c);
    }
    let cg = m.v2(Default::default());
    assert!(cg.host().is_v2());
    let env = Env {
        v2: true,
        ..Default::default()
    };
    let t = tick(&s, &Policy::default(), &env, &HashMap::new());
    let r = Executor::new(1).execute(&t.plan, &cg);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(
        m.at("kubepods/besteffort/podbe/cbe/cpuset.cpus").unwrap(),
        ""
    );
}

/// Issue 15 item 11: the restore plan on a suppressed v1 tree puts the
/// besteffort quota and cpuset back, the LS quota to kubelet's limit and
/// its burst to 0, and executes in an order the kernel accepts.
#[test]
fn restore_plan_puts_back_quota_cpuset_and_burst() {
    let (m, _) = tree();
    for cg in [
        "",
        "kubepods/besteffort",
        "kubepods/besteffort/podbe",
        "kubepods/besteffort/podbe/cbe",
        "kubepods/burstable/podls",
        "kubepods/burstable/podls/cls",
    ] {
        m.set(
            &format!("cpu/{cg}/cpu.cfs_burst_us").replace("//", "/"),
            "0\n",
        );
    }
    let set = |f: &str, v: &str| m.set(f, v);
    set("cpu/kubepods/besteffort/cpu.cfs_quota_us", "2000\n");
    set("cpuset/kubepods/besteffort/cpuset.cpus", "14-15\n");
    set("cpuset/kubepods/besteffort/podbe/cpuset.cpus", "14-15\n");
    set("cpuset/kubepods/besteffort/podbe/cbe/cpuset.cpus", "15\n");
    set(
        "cpu/kubepods/burstable/podls/cls/cpu.cfs_quota_us",
        "600000\n",
    );
    set(
        "cpu/kubepods/burstable/podls/cls/cpu.cfs_burst_us",
        "200000\n",
    );
    let cg = m.detect_v1();
    let env = Env {
        features: cg.host().features.clone(),
        ..Default::default()
    };
    assert!(env.features.cpu_burst, "burst detected off the tree");
    let s = state(1.0, 1.0, Some(2_000));
    // what the caller reads: the quotas, and the besteffort subtree (a pod the
    // store never saw, left on CPU 15)
    set(
        "cpu/kubepods/besteffort/podbe/cbe/cpu.cfs_quota_us",
        "50000\n",
    );
    set("cpu/kubepods/burstable/podls/cpu.cfs_quota_us", "650000\n");
    set("cpuset/kubepods/besteffort/podnew/cpuset.cpus", "15\n");
    let mut found = Found::default();
    let q = |cg: &str, v: Option<u64>| (CgroupPath::parse(cg).unwrap(), (v, 100_000));
    found.quotas.extend([
        q("kubepods/burstable/podls/cls", Some(600_000)),
        // kubelet's pod quota had 50000 more than its container (an init container, overhead)
        q("kubepods/burstable/podls", Some(650_000)),
        // a BE container kubelet gave no quota: not qoslet's to change
        q("kubepods/besteffort/podbe/cbe", Some(50_000)),
    ]);
    found.be_subtree = [
        "kubepods/besteffort/podbe",
        "kubepods/besteffort/podbe/cbe",
        "kubepods/besteffort/podnew",
    ]
    .iter()
    .map(|c| CgroupPath::parse(c).unwrap())
    .collect();
    let plan = restore_plan(&s, &Policy::default(), &env, &found);
    let r = Executor::new(1).execute(&plan, &cg);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let get = |f: &str| m.at(f).unwrap();
    assert_eq!(get("cpu/kubepods/besteffort/cpu.cfs_quota_us"), "-1");
    for cg in ["", "/podbe", "/podbe/cbe"] {
        assert_eq!(
            get(&format!("cpuset/kubepods/besteffort{cg}/cpuset.cpus")),
            "0-15"
        );
    }
    assert_eq!(
        get("cpu/kubepods/burstable/podls/cls/cpu.cfs_quota_us"),
        "200000"
    );
    assert_eq!(
        get("cpu/kubepods/burstable/podls/cls/cpu.cfs_burst_us"),
        "0"
    );
    assert_eq!(
        get("cpu/kubepods/burstable/podls/cpu.cfs_quota_us"),
        "250000",
        "the pod loses what scaling added, keeps kubelet's own extra"
    );
    assert_eq!(
        get("cpu/kubepods/besteffort/podbe/cbe/cpu.cfs_quota_us"),
        "50000"
    );
    assert_eq!(get("cpuset/kubepods/besteffort/podnew/cpuset.cpus"), "0-15");
}

/// Issue 15 item 10: with kubelet's static CPU manager the BE cpuset goes
/// on BE containers only (the parent and pods keep all CPUs, so a new BE
/// container given the shared pool is inside them), and comes back to
/// kubelet's own cpuset when suppression stops.
#[test]
fn static_cpu_manager_suppresses_on_containers_only() {
    let mut s = state(6.0, 4.0, None);
    s.static_cpu_manager = true;
    s.pods[1].containers[0].entry.cpuset_cpus = "0-13".into();
    let mut p = cfs(50);
    p.threshold.cpu_suppress_policy = CpuSuppressPolicy::Cpuset;
    let sets = |t: &TickResult| -> Vec<(String, Knob)> {
        t.plan
            .writes()
            .iter()
            .filter(|w| w.knob.kind() == KnobKind::CpusetCpus)
            .map(|w| (w.cgroup.as_str().to_string(), w.knob.clone()))
            .collect()
    };
    let t = tick(&s, &p, &Env::default(), &HashMap::new());
    let got = sets(&t);
    assert_eq!(got.len(), 3, "{got:?}");
    for (cg, k) in &got {
        if cg == "kubepods/besteffort/podbe/cbe" {
            assert_eq!(*k, Knob::CpusetCpus("0-1".into()), "the suppressed set");
        } else {
            assert_eq!(*k, Knob::CpusetCpus("0-15".into()), "{cg} keeps all CPUs");
        }
    }
    let t = tick(&s, &cfs(50), &Env::default(), &HashMap::new());
    assert!(sets(&t).contains(&(
        "kubepods/besteffort/podbe/cbe".to_string(),
        Knob::CpusetCpus("0-13".into())
    )));
    // the same node without the static policy narrows the parent and the pod too
    s.static_cpu_manager = false;
    assert_eq!(
        sets(&tick(&s, &p, &Env::default(), &HashMap::new())).len(),
        3
    );
}

/// Issue 14 item 7: the cpuset policy as koordlet's `adjustByCPUSet`
/// takes CPUs: never LSE's, LSR's in proportion; kubelet's reserved CPUs
/// are BE's too (koordlet leaves out only the node annotation's reservation).
#[test]
fn be_cpuset_leaves_lse_cpus_and_takes_lsr_in_proportion() {
    let mut s = state(6.0, 4.0, None);
    for (id, class, cpus) in [("lsr", QosClass::Lsr, "2-3"), ("lse", QosClass::Lse, "4-5")] {
        let mut p = pod(id, class, "/kubepods", 0.0, 200_000);
        p.annotations.insert(
            qoslet_hooks::decide::ANNOTATION_RESOURCE_STATUS.into(),
            format!(r#"{{"cpuset":"{cpus}"}}"#),
        );
        s.pods.push(p);
    }
    let env = Env {
        node: NodeFacts {
            online_cpus: (0..16).collect(),
            reserved_cpus: [0, 1].into(),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut p = cfs(100);
    p.threshold.cpu_suppress_policy = CpuSuppressPolicy::Cpuset;
    let t = tick(&s, &p, &env, &HashMap::new());
    let be = t
        .plan
        .get(&(s.be_parent.clone(), KnobKind::CpusetCpus, None))
        .expect("the BE cpuset");
    // allowance 16 x 100% - 6 - max(0.5, 1) = 9 CPUs of the 14 not LSE's:
    // 9 x 2/14 = 1 from LSR's {2, 3}, 8 from the rest, lowest first
    assert_eq!(be.knob, Knob::CpusetCpus("0-2,6-11".into()), "{}", be.rule);
}

/// Issue 14 item 8: a Burstable pod's own memory protection is its
/// containers' (their requests from kubelet's oom_score_adj), and the kube
/// QoS dirs get their class's OOM priority where the kernel has the files.
#[test]
fn burstable_pods_protect_their_containers_sum_and_qos_dirs_their_oom_priority() {
    let gib = 1u64 << 30;
    let mut s = state(1.0, 0.0, None);
    let mut ls = pod("ls", QosClass::Ls, "/kubepods/burstable", 1.0, 200_000);
    ls.kube = Some(KubeQos::Burstable);
    let mut second = ls.containers[0].clone();
    second.entry.id = "cls2".into();
    second.entry.name = "side".into();
    second.entry.cgroup = ls.cgroup.container("cls2").unwrap();
    ls.containers.push(second);
    for c in &mut ls.containers {
        c.entry.oom_score_adj = 996; // 4 GiB each on a 1000 GiB node
        c.entry.memory_limit = (8 * gib) as i64;
    }
    s.pods = vec![ls.clone()];
    s.qos_dirs = vec![(
        KubeQos::Burstable,
        CgroupPath::parse("/kubepods/burstable").unwrap(),
    )];
    let mut features = Features {
        memory_qos: true,
        ..Default::default()
    };
    features.memory_tunes = features
        .memory_tunes
        .with(qoslet_cgroups::MemTune::Priority);
    let env = Env {
        features,
        node: NodeFacts {
            memory_bytes: 1000 * gib,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut p = Policy::default();
    p.qos.ls_class.memory_qos.enable = true;
    p.qos.ls_class.memory_qos.min_limit_percent = 50;
    p.qos.ls_class.memory_qos.priority = 8;
    let t = tick(&s, &p, &env, &HashMap::new());
    let get = |cg: &CgroupPath, name| {
        t.plan
            .get(&(cg.clone(), name, None))
            .map(|w| w.knob.clone())
    };
    assert_eq!(
        get(&ls.containers[0].entry.cgroup, KnobKind::MemoryMin),
        Some(Knob::MemoryMin(2 * gib))
    );
    assert_eq!(
        get(&ls.cgroup, KnobKind::MemoryMin),
        Some(Knob::MemoryMin(4 * gib)),
        "the pod: its containers' sum"
    );
    let dir = CgroupPath::parse("/kubepods/burstable").unwrap();
    assert_eq!(
        get(
            &dir,
            KnobKind::MemoryTune(qoslet_cgroups::MemTune::Priority)
        ),
        Some(Knob::MemoryTune(qoslet_cgroups::MemTune::Priority, 8))
    );
    assert_eq!(
        get(
            &ls.cgroup,
            KnobKind::MemoryTune(qoslet_cgroups::MemTune::Priority)
        ),
        Some(Knob::MemoryTune(qoslet_cgroups::MemTune::Priority, 8))
    );
    // off: none of it planned (the executor writes NoneMemoryQOS back)
    let t = tick(&s, &Policy::default(), &env, &HashMap::new());
    assert!(
        !t.plan
            .writes()
            .iter()
            .any(|w| w.plugin == Plugin::MemoryQos),
        "{:?}",
        t.plan.writes()
    );
}

/// Issue 14: cfsQuotaBurstPeriodSeconds. A container held at 3x its limit
/// (throttled, the share pool idle) is scaled up only while its bucket
/// lasts, then scaled back down to the limit; without the setting it stays up.
#[test]
fn cfs_quota_burst_period_bounds_how_long_a_quota_stays_scaled_up() {
    let mut s = state(0.0, 0.0, None);
    s.capacity_cores = 64.0;
    s.node_usage_cores = 6.5;
    let mut ls = pod("ls", QosClass::Ls, "/kubepods/burstable", 6.0, 200_000);
    ls.containers[0].cpu_cores = 6.0; // 300 % of its 2-core limit
    s.pods = vec![ls.clone()];
    let id = ls.containers[0].entry.id.clone();
    let run = |s: &NodeState, period: i64| {
        let mut p = Policy::default();
        p.burst.policy = BurstPolicy::CfsQuotaBurstOnly;
        p.burst.cfs_quota_burst_period_seconds = period;
        let mut e = Engine::new(1);
        (0..30)
            .map(|t| {
                let r = e.plan_at(s, &p, &Env::default(), t as f64);
                r.burst_quota.get(&id).copied().unwrap_or(200_000)
            })
            .collect::<Vec<u64>>()
    };
    let unbounded = run(&s, -1);
    assert_eq!(
        *unbounded.last().unwrap(),
        600_000,
        "scaled up to 300 % and kept: {unbounded:?}"
    );
    // 5 s: 5 x 200 = 1000 percent-seconds, spent at 200 a second
    let bounded = run(&s, 5);
    let top = *bounded.iter().max().unwrap();
    assert!(top > 200_000, "scaled up first: {bounded:?}");
    assert_eq!(
        *bounded.last().unwrap(),
        200_000,
        "then back to the limit: {bounded:?}"
    );
    let first_down = bounded.windows(2).position(|w| w[1] < w[0]).unwrap();
    assert!(
        first_down <= 6,
        "within the period (and a bucket started at most half full): {bounded:?}"
    );
    // the pod's own koordinator.sh/cpuBurst (koordlet's genPodBurstConfig) over
    // the node's unbounded config: the same bound; `policy: none`: never scaled
    for a in [
        r#"{"cfsQuotaBurstPeriodSeconds":5}"#,
        r#"{"policy":"none"}"#,
    ] {
        s.pods[0].annotations = [(burst::ANNOTATION_CPU_BURST.to_string(), a.to_string())].into();
        let r = run(&s, -1);
        assert_eq!(*r.last().unwrap(), 200_000, "{a}: {r:?}");
        if a.contains("none") {
            assert!(r.iter().all(|q| *q == 200_000), "{r:?}");
        } else {
            assert!(r.iter().any(|q| *q > 200_000), "{r:?}");
        }
    }
}

/// Review of issue 14 item 5: a pod bound to CPUs (here a trusted,
/// unlabelled Guaranteed pod) runs without quota: burst scaling leaves it.
#[test]
fn burst_leaves_pods_bound_to_cpus() {
    let mut s = state(1.0, 0.0, None);
    let mut g = pod("g", QosClass::Lsr, "/kubepods", 1.0, 200_000);
    g.by_label = false;
    g.annotations.insert(
        qoslet_hooks::decide::ANNOTATION_RESOURCE_STATUS.into(),
        r#"{"cpuset":"2-3"}"#.into(),
    );
    s.pods = vec![g.clone()];
    let env = Env {
        node: NodeFacts {
            online_cpus: (0..16).collect(),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut p = Policy::default();
    p.burst.policy = BurstPolicy::Auto;
    let t = tick(&s, &p, &env, &HashMap::new());
    let q = t
        .plan
        .get(&(
            g.containers[0].entry.cgroup.clone(),
            KnobKind::CpuQuota,
            None,
        ))
        .map(|w| w.knob.clone());
    assert_eq!(
        q,
        Some(Knob::CpuQuota {
            quota: None,
            period: 100_000
        }),
        "the hook's -1 stands: {:?}",
        t.plan.writes()
    );
    assert!(t.burst_quota.is_empty(), "{:?}", t.burst_quota);
    // the online CPUs unknown (no sysfs: the NUMA layout is made up from the
    // capacity): nothing is bound against it, the pod is burst-scaled
    let t = tick(&s, &p, &Env::default(), &HashMap::new());
    assert!(t.burst_quota.contains_key(&g.containers[0].entry.id));
    // unbound, the same pod is burst-scaled as before
    s.pods[0].annotations.clear();
    let t = tick(&s, &p, &env, &HashMap::new());
    assert!(t.burst_quota.contains_key(&g.containers[0].entry.id));
}

/// Review of issue 15 items 10-12: the BE cpuset never takes CPUs outside
/// kubelet's shared pool under the static policy (they are Guaranteed pods'
/// exclusive ones) nor above the v1 ceiling after a CPU came back online.
#[test]
fn be_cpuset_stays_in_the_shared_pool_and_under_the_ceiling() {
    let mut p = cfs(50);
    p.threshold.cpu_suppress_policy = CpuSuppressPolicy::Cpuset;
    let set_of = |s: &NodeState| -> BTreeSet<u32> {
        let t = tick(s, &p, &Env::default(), &HashMap::new());
        let w = t
            .plan
            .get(&(
                s.pods[1].containers[0].entry.cgroup.clone(),
                KnobKind::CpusetCpus,
                None,
            ))
            .unwrap();
        match &w.knob {
            Knob::CpusetCpus(l) => crate::cpuset::parse_cpus(l).unwrap(),
            k => panic!("{k:?}"),
        }
    };
    let mut s = state(6.0, 4.0, None);
    assert!(set_of(&s).contains(&0), "the lowest cores first");
    s.static_cpu_manager = true;
    s.shared_pool = Some((4..16).collect());
    let got = set_of(&s);
    assert!(!got.is_empty() && got.iter().all(|c| *c >= 4), "{got:?}");
    let mut s = state(6.0, 4.0, None);
    s.cpuset_ceiling = Some((2..16).collect());
    let got = set_of(&s);
    assert!(!got.is_empty() && got.iter().all(|c| *c >= 2), "{got:?}");
}

/// Review: a BE container capped below its limit is given its limit back
/// by restore, and its pod (which the cap did not touch) is left alone.
#[test]
fn restore_gives_a_capped_be_container_its_limit_and_leaves_its_pod() {
    let mut s = state(1.0, 1.0, Some(2_000));
    s.pods[1].containers[0].entry.cpu_quota = 200_000;
    let be_c = s.pods[1].containers[0].entry.cgroup.clone();
    let be_p = s.pods[1].cgroup.clone();
    let mut found = Found::default();
    found.quotas.insert(be_c.clone(), (Some(50_000), 100_000));
    found.quotas.insert(be_p.clone(), (Some(200_000), 100_000));
    let plan = restore_plan(&s, &Policy::default(), &Env::default(), &found);
    assert_eq!(
        plan.get(&(be_c, KnobKind::CpuQuota, None))
            .map(|w| w.knob.clone()),
        Some(Knob::CpuQuota {
            quota: Some(200_000),
            period: 100_000
        })
    );
    assert!(plan.get(&(be_p, KnobKind::CpuQuota, None)).is_none());
}

/// Koordinator's BE CPU-satisfaction inputs: the real limit is the BE
/// cpuset's CPUs × 1000 capped by the besteffort quota; requests are the
/// trusted BE-labelled pods' batch-cpu requests (bounded by the node), an
/// untrusted pod's counted as none.
#[test]
fn be_cpu_for_satisfaction_eviction() {
    let spec = |milli: u64| {
        format!(
            r#"{{"containers":{{"a":{{"requests":{{"kubernetes.io/batch-cpu":"{milli}"}}}},"b":{{"requests":{{"kubernetes.io/batch-cpu":"500"}}}}}}}}"#
        )
    };
    let mut s = state(2.0, 1.5, None);
    s.be_usage_cores = Some(1.5);
    s.pods[1].annotations.insert(
        qoslet_hooks::batch::ANNOTATION_EXTENDED_RESOURCE_SPEC.into(),
        spec(2000),
    );
    let mut untrusted = pod("evil", QosClass::Be, "/kubepods/besteffort", 0.25, -1);
    untrusted.trusted = false;
    untrusted.annotations.insert(
        qoslet_hooks::batch::ANNOTATION_EXTENDED_RESOURCE_SPEC.into(),
        spec(1_000_000),
    );
    s.pods.push(untrusted);
    // (BE cpuset, quota us per 100 ms, real limit)
    for (cpuset, quota, limit) in [
        (None, None, 16_000),
        (Some(0..4), None, 4_000),
        (Some(0..4), Some(250_000), 2_500),
        (None, Some(1_000_000), 10_000),
        (Some(0..2), Some(1_000_000), 2_000),
    ] {
        s.be_cpuset = cpuset.map(|r| r.collect());
        s.be_quota_us = quota;
        let b = s.be_cpu();
        assert_eq!(
            b.real_limit_milli, limit,
            "cpuset {:?} quota {quota:?}",
            s.be_cpuset
        );
        assert_eq!(b.request_milli, 2_500);
        assert_eq!(b.untrusted, 1);
        assert_eq!(b.usage_milli, Some(1_500));
        assert_eq!(b.pods["be"], (1_500, 2_500));
        assert_eq!(b.pods["evil"], (250, 0));
        assert!(!b.pods.contains_key("ls"));
    }
    // a request above the node is bounded by it
    s.pods[1].annotations.insert(
        qoslet_hooks::batch::ANNOTATION_EXTENDED_RESOURCE_SPEC.into(),
        spec(100_000),
    );
    assert_eq!(s.be_cpu().request_milli, 16_000);
}
