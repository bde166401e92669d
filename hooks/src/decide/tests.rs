use super::*;
use crate::batch::{SpecBatch, ANNOTATION_EXTENDED_RESOURCE_SPEC};
use crate::policy::{MemoryQos, ResourceQosStrategy};

/// Koordinator's defaults with cpuQOS on for every class (as deploy/qoslet.yaml).
fn cpu_on() -> ResourceQosStrategy {
    let mut p = ResourceQosStrategy::default();
    for c in [
        &mut p.lsr_class,
        &mut p.ls_class,
        &mut p.be_class,
        &mut p.system_class,
    ] {
        c.cpu_qos.enable = true;
    }
    p
}

/// A 16-CPU node with 64 GiB, two NUMA nodes of 8 CPUs.
static NO_DEVICES: BTreeMap<String, Device> = BTreeMap::new();

/// A decision's context: no block devices, no share pool, 4 KiB pages.
fn ctx<'a>(
    features: &'a Features,
    v2: bool,
    policy: &'a ResourceQosStrategy,
    node: &'a NodeFacts,
) -> Context<'a> {
    Context {
        features,
        v2,
        policy,
        page_size: 4096,
        node,
        devices: &NO_DEVICES,
        share_pool: None,
    }
}

fn node() -> NodeFacts {
    NodeFacts {
        online_cpus: (0..16).collect(),
        reserved_cpus: BTreeSet::new(),
        milli_cpus: 16_000,
        memory_bytes: 64 << 30,
        numa: [(0, (0..8).collect()), (1, (8..16).collect())].into(),
    }
}

/// A class set by an untrusted pod's label, on a pod of the Kubernetes QoS
/// that class usually has.
fn labelled(class: QosClass) -> PodClass {
    PodClass {
        class,
        by_label: true,
        trusted: false,
        kube: match class {
            QosClass::Be => Some(KubeQos::BestEffort),
            QosClass::Ls => Some(KubeQos::Burstable),
            QosClass::Lsr | QosClass::Lse => Some(KubeQos::Guaranteed),
            QosClass::System => None,
        },
    }
}

/// The same, from a trusted pod.
fn trusted(class: QosClass) -> PodClass {
    PodClass {
        trusted: true,
        ..labelled(class)
    }
}

fn run(
    class: QosClass,
    name: &str,
    ann: &BTreeMap<String, String>,
    f: &Features,
) -> ContainerDecision {
    run_as(labelled(class), name, ann, f)
}

fn run_as(
    pc: PodClass,
    name: &str,
    ann: &BTreeMap<String, String>,
    f: &Features,
) -> ContainerDecision {
    let p = cpu_on();
    container(
        pc,
        name,
        ann,
        SpecBatch::Unknown,
        &Requested::default(),
        &ctx(f, false, &p, &node()),
    )
}

fn run_pod(class: QosClass, f: &Features) -> PodDecision {
    let p = cpu_on();
    pod(
        labelled(class),
        &BTreeMap::new(),
        SpecBatch::Unknown,
        &SandboxLimits::default(),
        &ctx(f, false, &p, &node()),
    )
}

/// kubelet's `GetContainerOOMScoreAdjust` (Burstable: 1000 - 1000 x
/// request / node memory, within 3..=999) read backwards.
#[test]
fn kubelets_oom_score_adj_gives_a_burstable_request_away() {
    let gib = 1u64 << 30;
    let node = 1000 * gib; // a thousandth of the node is 1 GiB
    let r = |adj, limit| kubelet_memory_request(adj, node, limit).map(|r| (r.lo, r.hi));
    // 4 GiB requested: adj 996
    assert_eq!(r(996, None), Some((4 * gib, 5 * gib)));
    assert_eq!(
        r(996, Some(4 * gib + 1)),
        Some((4 * gib, 4 * gib + 1)),
        "within the limit"
    );
    // kubelet's clamps: 999 is any request under 2 thousandths; 3 anything above 99.7 %
    assert_eq!(r(999, None), Some((0, 2 * gib)));
    assert_eq!(r(3, None), Some((997 * gib, node)));
    // Guaranteed / critical (-997), BestEffort (1000), unknown (0): not Burstable values
    for adj in [-997, 1000, 0, 2, -1] {
        assert_eq!(r(adj, None), None, "{adj}");
    }
    assert_eq!(
        kubelet_memory_request(500, 0, None),
        None,
        "node memory unknown"
    );
    // the formula forward, for a few requests on a 64 GiB node: always within the bounds
    let node = 64 * gib;
    for req in [1u64, 100 << 20, gib, 3 * gib + 7, 63 * gib] {
        let adj = (1000 - (1000 * req as u128 / node as u128) as i64).clamp(3, 999);
        let b = kubelet_memory_request(adj, node, None).unwrap();
        assert!(b.lo <= req && req <= b.hi, "{req}: {b:?}");
    }
}

/// Issue 14 item 8: memory QoS for LS and SYSTEM pods (koordlet's
/// `calculateContainerResources` from the container's request), the
/// request from kubelet's oom_score_adj, and the Anolis files written
/// where the kernel has them.
#[test]
fn memory_qos_for_ls_and_system_and_the_anolis_files() {
    let gib = 1u64 << 30;
    let mut p = ResourceQosStrategy::default();
    let on = MemoryQos {
        enable: true,
        min_limit_percent: 50,
        low_limit_percent: 100,
        throttling_percent: 50,
        priority_enable: 1,
        priority: 6,
        oom_kill_group: 1,
        ..p.ls_class.memory_qos.clone()
    };
    p.ls_class.memory_qos = on.clone();
    p.system_class.memory_qos = MemoryQos {
        wmark_ratio: 0,
        ..on
    };
    let mut n = node();
    n.memory_bytes = 1000 * gib;
    let anolis = Features {
        memory_qos: true,
        memory_tunes: qoslet_cgroups::MemTune::ALL
            .into_iter()
            .fold(Default::default(), |s, t| s.with(t)),
        ..Default::default()
    };
    let run_with =
        |p: &ResourceQosStrategy, pc: PodClass, adj: i64, limit: i64, f: &Features, v2: bool| {
            container(
                pc,
                "app",
                &BTreeMap::new(),
                SpecBatch::Unknown,
                &Requested {
                    memory_limit: limit,
                    oom_score_adj: adj,
                    ..Default::default()
                },
                &Context {
                    features: f,
                    v2,
                    policy: p,
                    page_size: 4096,
                    node: &n,
                    devices: &BTreeMap::new(),
                    share_pool: None,
                },
            )
        };
    let run = |pc: PodClass, adj: i64, limit: i64, f: &Features, v2: bool| {
        run_with(&p, pc, adj, limit, f, v2)
    };
    // an LS container with 4 GiB requested (adj 996) and an 8 GiB limit, on v2
    let d = run(labelled(QosClass::Ls), 996, (8 * gib) as i64, &anolis, true);
    let u = d.patch().unified;
    assert_eq!(
        u["memory.min"],
        (2 * gib).to_string(),
        "50% of the request's low end"
    );
    assert_eq!(u["memory.low"], (4 * gib).to_string());
    // throttling from the high end: 5 + (8 - 5) x 50% = 6.5 GiB
    assert_eq!(u["memory.high"], (13 * gib / 2).to_string());
    let tunes: Vec<(&str, String)> = d
        .cgroup()
        .iter()
        .filter(|k| matches!(k, Knob::MemoryTune(..)))
        .map(|k| {
            let (f, v) = k.describe(true);
            (
                qoslet_cgroups::MemTune::ALL
                    .into_iter()
                    .find(|t| t.file() == f)
                    .unwrap()
                    .file(),
                v,
            )
        })
        .collect();
    assert_eq!(
        tunes,
        [
            ("memory.wmark_ratio", "95".to_string()),
            ("memory.wmark_scale_factor", "20".into()),
            ("memory.wmark_min_adj", "-25".into()),
            ("memory.use_priority_oom", "1".into()),
            ("memory.priority", "6".into()),
            ("memory.oom.group", "1".into()),
        ]
    );
    // no limit: the node's memory stands for it (koordlet: allocatable)
    let d = run(labelled(QosClass::Ls), 996, 0, &anolis, true);
    let h: u64 = d.patch().unified["memory.high"].parse().unwrap();
    assert_eq!(h, (5 * gib + (995 * gib) / 2) / 4096 * 4096);
    // SYSTEM on a Burstable pod, v1 Anolis: written after start
    let sys = PodClass {
        kube: Some(KubeQos::Burstable),
        ..labelled(QosClass::System)
    };
    let d = run(sys, 996, (8 * gib) as i64, &anolis, false);
    assert!(d.cgroup().contains(&Knob::MemoryMin(2 * gib)), "{d:?}");
    assert!(d
        .cgroup()
        .contains(&Knob::MemoryTune(qoslet_cgroups::MemTune::WmarkRatio, 0)));
    // a kernel without the Anolis files: memory.min/low/high only
    let upstream_v2 = Features {
        memory_qos: true,
        ..Default::default()
    };
    let d = run(
        labelled(QosClass::Ls),
        996,
        (8 * gib) as i64,
        &upstream_v2,
        true,
    );
    assert!(!d.patch().unified.is_empty());
    assert!(!d.cgroup().iter().any(|k| matches!(k, Knob::MemoryTune(..))));
    // a Guaranteed LS pod requests its limit; a BestEffort one (adj 1000) nothing
    let g = PodClass {
        kube: Some(KubeQos::Guaranteed),
        ..labelled(QosClass::Ls)
    };
    let d = run(g, -997, (2 * gib) as i64, &upstream_v2, true);
    assert_eq!(d.patch().unified["memory.min"], gib.to_string());
    let be = PodClass {
        kube: Some(KubeQos::BestEffort),
        ..labelled(QosClass::Ls)
    };
    let d = run(be, 1000, 0, &upstream_v2, true);
    assert!(d.patch().unified.is_empty());
    // kubelet's -997 on a Burstable pod (a critical one): no request known
    let d = run(sys, -997, (8 * gib) as i64, &upstream_v2, true);
    assert!(d.patch().unified.is_empty());
    // oomKillGroup 0 leaves memory.oom.group to kubelet (it sets 1 on v2)
    let zero = MemoryQos {
        oom_kill_group: 0,
        ..p.ls_class.memory_qos.clone()
    };
    let mut p0 = p.clone();
    p0.ls_class.memory_qos = zero;
    let d = run_with(
        &p0,
        labelled(QosClass::Ls),
        996,
        (8 * gib) as i64,
        &anolis,
        true,
    );
    assert!(!d
        .cgroup()
        .iter()
        .any(|k| matches!(k, Knob::MemoryTune(qoslet_cgroups::MemTune::OomGroup, _))));
    // memory QoS off for the class: nothing at all
    let mut off = p.clone();
    off.ls_class.memory_qos.enable = false;
    let d = run_with(
        &off,
        labelled(QosClass::Ls),
        996,
        (8 * gib) as i64,
        &anolis,
        true,
    );
    assert!(d.patch().is_empty() && d.cgroup().is_empty(), "{d:?}");
}

#[test]
fn memory_qos_per_host_and_policy() {
    let mut p = ResourceQosStrategy::default();
    let on = MemoryQos {
        enable: true,
        min_limit_percent: 100,
        low_limit_percent: 100,
        throttling_percent: 80,
        ..Default::default()
    };
    p.be_class.memory_qos = on.clone();
    p.lsr_class.memory_qos = on;
    let spec = r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-memory":"128Mi"}}}}"#;
    let a: BTreeMap<String, String> = [(
        ANNOTATION_EXTENDED_RESOURCE_SPEC.to_string(),
        spec.to_string(),
    )]
    .into();
    let upstream = Features {
        cpu_idle: true,
        ..Default::default()
    };
    // cgroup v2: through CRI's unified map
    let d = container(
        trusted(QosClass::Be),
        "app",
        &a,
        SpecBatch::Unknown,
        &Requested::default(),
        &ctx(&upstream, true, &p, &node()),
    );
    assert_eq!(
        d.patch().unified.get("memory.min").map(String::as_str),
        Some("67108864")
    );
    assert_eq!(
        d.patch().unified.get("memory.high").map(String::as_str),
        Some(
            (((64u64 << 20) + (64u64 << 20) * 80 / 100) / 4096 * 4096)
                .to_string()
                .as_str()
        )
    );
    // each memory setting is decided once, as CRI-carried, and named as v2 names it
    let mem: Vec<_> = d
        .decisions
        .iter()
        .filter(|x| matches!(x.knob(), Some(Knob::MemoryMin(_) | Knob::MemoryHigh(_))))
        .collect();
    assert_eq!(mem.len(), 2);
    assert!(mem.iter().all(|x| matches!(x.action, Action::Cri(_))));
    assert_eq!(
        mem[0].setting(true),
        ("memory.min".into(), "67108864".into())
    );
    assert!(d.cgroup().is_empty(), "nothing written by qoslet on v2");
    // cgroup v1 without the files: a warning, nothing written
    let d = container(
        trusted(QosClass::Be),
        "app",
        &a,
        SpecBatch::Unknown,
        &Requested::default(),
        &ctx(&upstream, false, &p, &node()),
    );
    assert!(d.patch().unified.is_empty() && d.warnings.len() == 1);
    // cgroup v1 with them (Alibaba kernels): written after start
    let ali = Features {
        memory_qos: true,
        ..Default::default()
    };
    let d = container(
        trusted(QosClass::Be),
        "app",
        &a,
        SpecBatch::Unknown,
        &Requested::default(),
        &ctx(&ali, false, &p, &node()),
    );
    assert!(d.cgroup().contains(&Knob::MemoryMin(64 << 20)));
    // LSR: the request is the limit kubelet asked for
    let d = container(
        labelled(QosClass::Lsr),
        "app",
        &BTreeMap::new(),
        SpecBatch::Unknown,
        &Requested {
            memory_limit: 1 << 30,
            ..Default::default()
        },
        &ctx(&upstream, true, &p, &node()),
    );
    assert_eq!(
        d.patch().unified.get("memory.low").map(String::as_str),
        Some("1073741824")
    );
    // off by default
    let d = container(
        labelled(QosClass::Lsr),
        "app",
        &BTreeMap::new(),
        SpecBatch::Unknown,
        &Requested {
            memory_limit: 1 << 30,
            ..Default::default()
        },
        &ctx(&upstream, true, &ResourceQosStrategy::default(), &node()),
    );
    assert!(d.patch().unified.is_empty());
}

const SPEC: &str = r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"500"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"256Mi"}}}}"#;

fn ann(v: &str) -> BTreeMap<String, String> {
    [(ANNOTATION_EXTENDED_RESOURCE_SPEC.to_string(), v.to_string())].into()
}

fn upstream() -> Features {
    Features {
        cpu_idle: true,
        cpu_burst: true,
        ..Default::default()
    }
}

#[test]
fn be_with_batch_resources_on_an_upstream_kernel() {
    let d = run(QosClass::Be, "app", &ann(SPEC), &upstream());
    assert_eq!(
        d.patch(),
        ResourcePatch {
            cpu_shares: Some(512),
            cpu_quota: Some(100_000),
            cpu_period: Some(100_000),
            memory_limit_in_bytes: Some(256 << 20),
            cpuset_cpus: None,
            unified: BTreeMap::new(),
        }
    );
    assert!(d.cgroup().is_empty(), "cpu.idle is a pod-level setting");
    assert_eq!(
        d.decisions
            .iter()
            .map(|r| r.setting(false).0)
            .collect::<Vec<_>>(),
        vec!["cpu.shares", "cpu.cfs_quota_us", "memory.limit_in_bytes",]
    );
    assert!(d.warnings.is_empty());
}

/// Issue 46: the pod spec's batch resources (no webhook, so no annotation)
/// give what the annotation would, the spec wins over an annotation that
/// differs (Koordinator's webhook rewrites it), and each setting names
/// where it came from.
#[test]
fn batch_resources_from_the_pod_spec_as_the_annotation_would_give() {
    let requests: BTreeMap<String, String> = [
        ("cpu".to_string(), "0".to_string()),
        (crate::batch::BATCH_CPU.to_string(), "500".to_string()),
    ]
    .into();
    let limits: BTreeMap<String, String> = [
        (crate::batch::BATCH_CPU.to_string(), "1k".to_string()),
        (crate::batch::BATCH_MEMORY.to_string(), "256Mi".to_string()),
        ("nvidia.com/gpu".to_string(), "1".to_string()),
    ]
    .into();
    let spec = crate::batch::spec_json([
        ("app", Some(&requests), Some(&limits)),
        ("sidecar", None, None),
    ])
    .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&spec).unwrap(),
        serde_json::json!({"containers": {"app": {
            "requests": {"kubernetes.io/batch-cpu": "500"},
            "limits": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "256Mi"}}}}),
        "only the two batch resources, only containers naming one"
    );
    assert_eq!(
        crate::batch::spec_json([("a", None, Some(&BTreeMap::new()))]),
        None
    );
    let p = cpu_on();
    let go = |a: &BTreeMap<String, String>, from_spec: SpecBatch| {
        container(
            labelled(QosClass::Be),
            "app",
            a,
            from_spec,
            &Requested::default(),
            &ctx(&upstream(), false, &p, &node()),
        )
    };
    let by_annotation = go(&ann(SPEC), SpecBatch::Unknown);
    let by_spec = go(&BTreeMap::new(), SpecBatch::Some(&spec));
    assert_eq!(by_spec.patch(), by_annotation.patch(), "the same settings");
    assert_eq!(by_spec.patch().cpu_quota, Some(100_000));
    assert!(by_spec
        .decisions
        .iter()
        .all(|d| d.because.ends_with("(pod spec)")));
    assert!(by_annotation
        .decisions
        .iter()
        .all(|d| d.because.ends_with("(extended-resource-spec annotation)")));
    // an annotation that says otherwise loses to the spec
    let other = r#"{"containers":{"app":{"limits":{"kubernetes.io/batch-cpu":"8000"}}}}"#;
    assert_eq!(
        go(&ann(other), SpecBatch::Some(&spec)).patch(),
        by_spec.patch()
    );
    // a pod the cluster knows, whose spec asks for none: its annotation is
    // read, as koordlet reads a hand-written one where no webhook runs
    let d = go(&ann(SPEC), SpecBatch::None);
    assert_eq!(d.patch(), by_annotation.patch());
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    // the pod's own cgroup too
    let pd = pod(
        labelled(QosClass::Be),
        &BTreeMap::new(),
        SpecBatch::Some(&spec),
        &SandboxLimits::default(),
        &ctx(&upstream(), false, &p, &node()),
    );
    assert!(pd.decisions.iter().any(|d| d.knob()
        == Some(&Knob::CpuQuota {
            quota: Some(100_000),
            period: 100_000
        })
        && d.because == "BE pod: batch-cpu limits 1000m in all (pod spec)"));
    // an untrusted Burstable pod labelled BE: refused, and the warning names the spec
    let d = container(
        PodClass {
            kube: Some(KubeQos::Burstable),
            ..labelled(QosClass::Be)
        },
        "app",
        &BTreeMap::new(),
        SpecBatch::Some(&spec),
        &Requested::default(),
        &ctx(&upstream(), false, &p, &node()),
    );
    assert_eq!(d.patch().cpu_quota, None);
    assert_eq!(
        d.warnings[0].to_string(),
        "batch resources of the pod spec ignored: the pod is Burstable, not BestEffort, and not trusted"
    );
}

#[test]
fn classes_kernels_and_bad_input() {
    let bvt = Features {
        bvt: true,
        ..Default::default()
    };
    // (class, annotation, kernel, expected patch, expected container cgroup writes, warnings)
    type Case<'a> = (QosClass, &'a str, Features, ResourcePatch, Vec<Knob>, usize);
    let table: &[Case] = &[
        (
            QosClass::Ls,
            SPEC,
            upstream(),
            ResourcePatch::default(),
            vec![],
            0,
        ),
        (
            QosClass::Lsr,
            SPEC,
            bvt.clone(),
            ResourcePatch::default(),
            vec![Knob::GroupIdentity(2)],
            0,
        ),
        (
            QosClass::Be,
            "",
            bvt.clone(),
            ResourcePatch::default(),
            vec![Knob::GroupIdentity(-1)],
            1,
        ),
        (
            QosClass::Be,
            "{not json",
            upstream(),
            ResourcePatch::default(),
            vec![],
            1,
        ),
        (
            QosClass::Be,
            SPEC,
            Features::default(),
            ResourcePatch {
                cpu_shares: Some(512),
                cpu_quota: Some(100_000),
                cpu_period: Some(100_000),
                memory_limit_in_bytes: Some(256 << 20),
                cpuset_cpus: None,
                unified: BTreeMap::new(),
            },
            vec![],
            0,
        ),
        (
            QosClass::System,
            SPEC,
            bvt,
            ResourcePatch::default(),
            vec![Knob::GroupIdentity(0)],
            0,
        ),
    ];
    for (class, a, f, patch, knobs, warnings) in table {
        let d = run(*class, "app", &ann(a), f);
        assert_eq!(
            (&d.patch(), &d.cgroup(), d.warnings.len()),
            (patch, knobs, *warnings),
            "{class:?} {a:?} {f:?}"
        );
    }
    // another container of the pod: no batch entry, class settings only
    let d = run(QosClass::Be, "sidecar", &ann(SPEC), &upstream());
    assert!(d.patch().is_empty());
    assert!(d.cgroup().is_empty());
}

#[test]
fn lsr_cpusets_from_the_scheduler() {
    let a = |v: &str| -> BTreeMap<String, String> {
        [(ANNOTATION_RESOURCE_STATUS.to_string(), v.to_string())].into()
    };
    let d = run_as(
        trusted(QosClass::Lsr),
        "app",
        &a(r#"{"cpuset":"0-3,8"}"#),
        &upstream(),
    );
    assert_eq!(d.patch().cpuset_cpus.as_deref(), Some("0-3,8"));
    assert_eq!(d.decisions[0].setting(false).0, "cpuset.cpus");
    assert!(
        run(QosClass::Ls, "app", &a(r#"{"cpuset":"1"}"#), &upstream())
            .patch()
            .is_empty(),
        "LS shares the pool"
    );
    for bad in [
        r#"{"cpuset":"1;rm -rf /"}"#,
        r#"{"cpuset":"x"}"#,
        "[]",
        "{",
        r#"{"cpuset":"3-1"}"#,
    ] {
        let d = run_as(trusted(QosClass::Lse), "app", &a(bad), &upstream());
        assert!(
            d.patch().is_empty() && d.warnings.len() == 1,
            "{bad}: {d:?}"
        );
    }
    assert!(run_as(
        trusted(QosClass::Lsr),
        "app",
        &a(r#"{"numaNodeResources":[]}"#),
        &upstream()
    )
    .warnings
    .is_empty());
}

/// Issue 14 item 5: pods with and without a cpuset, as koordlet's cpuset
/// hook places them (`pkg/koordlet/runtimehooks/hooks/cpuset`:
/// `SetContainerCPUSetAndUnsetCFS`, `UnsetContainerCPUQuota` /
/// `IsPodCfsQuotaNeedUnset`, `cpusetRule.getContainerCPUSet`), on a
/// 16-CPU node whose share pool has lost CPUs 2-3 to an LSR pod.
#[test]
fn cpuset_pods_and_the_share_pool_as_koordlets_cpuset_hook() {
    let p = ResourceQosStrategy::default();
    let online = node().online_cpus;
    let pool = share_pool(&online, [BTreeSet::from([2, 3])]);
    let unset = Some(-1);
    let kube = |pc: PodClass, k: KubeQos| PodClass {
        kube: Some(k),
        ..pc
    };
    let unlabelled = |c: QosClass, k: KubeQos| PodClass {
        class: c,
        by_label: false,
        trusted: false,
        kube: Some(k),
    };
    let bound = r#"{"cpuset":"2-3"}"#;
    let numa0 = r#"{"numaNodeResources":[{"node":0,"resources":{"cpu":"4","memory":"4Gi"}}]}"#;
    let numa_both = r#"{"numaNodeResources":[{"node":0,"resources":{"cpu":"2"}},{"node":1,"resources":{"kubernetes.io/batch-cpu":"2k"}}]}"#;
    let numa_mem = r#"{"numaNodeResources":[{"node":1,"resources":{"memory":"4Gi"}}]}"#;
    let numa7 = r#"{"numaNodeResources":[{"node":7,"resources":{"cpu":"1"}}]}"#;
    // (pod, annotation, kubelet's quota (period 100 ms), kubelet's cpuset,
    //  expected cpuset, expected quota, warnings)
    type Case<'a> = (
        PodClass,
        &'a str,
        i64,
        &'a str,
        Option<&'a str>,
        Option<i64>,
        usize,
    );
    #[rustfmt::skip]
    let table: &[Case] = &[
        // getContainerCPUSet: the annotation's cpuset; UnsetContainerCPUQuota: -1
        (trusted(QosClass::Lsr), bound, 200_000, "", Some("2-3"), unset, 0),
        (trusted(QosClass::Lse), bound, -1, "", Some("2-3"), unset, 0),
        // an untrusted pod bound within its 2-CPU limit: quota unset too
        (labelled(QosClass::Lsr), bound, 200_000, "", Some("2-3"), unset, 0),
        // ... but 2 CPUs for a 1.5-CPU limit, or one CPU for 10m: not bound (the
        // scheduler binds whole CPUs), kubelet's quota stands; on the share pool
        (labelled(QosClass::Lsr), bound, 150_000, "", Some("0-1,4-15"), None, 1),
        (labelled(QosClass::Lsr), r#"{"cpuset":"5"}"#, 1_000, "", Some("0-1,4-15"), None, 1),
        // QoS=LS: all share pool (kubelet's none policy)
        (labelled(QosClass::Ls), "", 200_000, "", Some("0-1,4-15"), None, 0),
        // QoS=LS under kubelet's static policy: the share pool within kubelet's shared pool
        (labelled(QosClass::Ls), "", 200_000, "0-7", Some("0-1,4-7"), None, 0),
        (labelled(QosClass::Ls), "", 200_000, "2-3", None, None, 1),
        // no QoS label, Burstable / Guaranteed, none policy: all share pool
        (unlabelled(QosClass::Ls, KubeQos::Burstable), "", 200_000, "", Some("0-1,4-15"), None, 0),
        (unlabelled(QosClass::Lsr, KubeQos::Guaranteed), "", 200_000, "", Some("0-1,4-15"), None, 0),
        // ... static policy: kubelet's cpuset stands ("do nothing")
        (unlabelled(QosClass::Lsr, KubeQos::Guaranteed), "", 200_000, "4-5", None, None, 0),
        // SYSTEM (no system QoS cpuset here): as its Kubernetes QoS
        (kube(labelled(QosClass::System), KubeQos::Burstable), "", 200_000, "", Some("0-1,4-15"), None, 0),
        // BestEffort, and BE on any Kubernetes QoS: kubelet's cpuset stands
        // (cpuset suppress writes BE pods' cgroups; koordlet clears BestEffort's)
        (labelled(QosClass::Be), "", -1, "", None, None, 0),
        (labelled(QosClass::Be), "", -1, "0-15", None, None, 0),
        (unlabelled(QosClass::Be, KubeQos::BestEffort), "", -1, "", None, None, 0),
        (kube(labelled(QosClass::Be), KubeQos::Burstable), "", 200_000, "", None, None, 0),
        // an LS pod's cpuset annotation binds nothing (Koordinator's scheduler binds LSE/LSR)
        (labelled(QosClass::Ls), bound, 200_000, "", Some("0-1,4-15"), None, 0),
        // isNUMAAware: the share pool of the NUMA nodes the scheduler allocated
        // the pod's CPUs on (node 0: 0-7 without the bound 2-3), whatever its class
        (labelled(QosClass::Ls), numa0, 200_000, "", Some("0-1,4-7"), None, 0),
        (unlabelled(QosClass::Lsr, KubeQos::Guaranteed), numa0, 200_000, "4-5", Some("4-5"), None, 0),
        (labelled(QosClass::Ls), numa_both, 200_000, "", Some("0-1,4-15"), None, 0),
        // no CPU on the node entry (memory only): not NUMA-aware
        (labelled(QosClass::Ls), numa_mem, 200_000, "", Some("0-1,4-15"), None, 0),
        // a node this host does not have: a warning, the whole share pool
        (labelled(QosClass::Ls), numa7, 200_000, "", Some("0-1,4-15"), None, 1),
        // BE: left to cpuset suppress
        (labelled(QosClass::Be), numa0, -1, "", None, None, 0),
    ];
    for (pc, a, quota, kubelet, cpuset, q, warnings) in table {
        let ann: BTreeMap<String, String> = if a.is_empty() {
            BTreeMap::new()
        } else {
            [(ANNOTATION_RESOURCE_STATUS.to_string(), a.to_string())].into()
        };
        let d = container(
            *pc,
            "app",
            &ann,
            SpecBatch::Unknown,
            &Requested {
                cpu_quota: *quota,
                cpu_period: 100_000,
                cpuset_cpus: kubelet,
                memory_limit: 0,
                oom_score_adj: 0,
                pod_milli_cpu: 0,
            },
            &Context {
                features: &upstream(),
                v2: false,
                policy: &p,
                page_size: 4096,
                node: &node(),
                devices: &BTreeMap::new(),
                share_pool: Some(SharePool {
                    cpus: &pool,
                    whole: &online,
                    explicit: false,
                }),
            },
        );
        let patch = d.patch();
        assert_eq!(
            (
                patch.cpuset_cpus.as_deref(),
                patch.cpu_quota,
                d.warnings.len()
            ),
            (*cpuset, *q, *warnings),
            "{pc:?} {a} quota {quota} kubelet {kubelet:?}: {d:?}"
        );
        if q.is_some() {
            assert_eq!(patch.cpu_period, Some(100_000));
        }
    }
    // a share pool that is all the CPUs pins nothing, unless asked to carry
    // it (UpdateContainerResources); no share pool known: nothing
    let ctx = |pool: Option<SharePool<'static>>| {
        let d = container(
            labelled(QosClass::Ls),
            "app",
            &BTreeMap::new(),
            SpecBatch::Unknown,
            &Requested::default(),
            &Context {
                features: &upstream(),
                v2: false,
                policy: &p,
                page_size: 4096,
                node: &node(),
                devices: &BTreeMap::new(),
                share_pool: pool,
            },
        );
        d.patch().cpuset_cpus
    };
    let whole: &'static BTreeSet<u32> = Box::leak(Box::new(online.clone()));
    let share = |explicit| SharePool {
        cpus: whole,
        whole,
        explicit,
    };
    assert_eq!(ctx(Some(share(false))), None);
    assert_eq!(ctx(Some(share(true))).as_deref(), Some("0-15"));
    assert_eq!(ctx(None), None);
    // the pool is taken within what the container may use (its pod's cpuset on v1)
    let narrow: &'static BTreeSet<u32> = Box::leak(Box::new((0..8).collect()));
    let d = ctx(Some(SharePool {
        cpus: Box::leak(Box::new(pool.clone())),
        whole: narrow,
        explicit: false,
    }));
    assert_eq!(d.as_deref(), Some("0-1,4-7"));
}

/// Review: the scheduler binds a pod, all its containers to the same CPUs
/// (koordlet takes the pod's cpuset for every container): an untrusted
/// pod's binding is sized by the pod's limit, each container's quota unset
/// only within its own.
#[test]
fn every_container_of_a_bound_pod_shares_its_cpus() {
    let ann: BTreeMap<String, String> = [(
        ANNOTATION_RESOURCE_STATUS.to_string(),
        r#"{"cpuset":"2-5"}"#.to_string(),
    )]
    .into();
    let p = ResourceQosStrategy::default();
    // a 4-CPU pod: a 3-CPU app and a 1-CPU sidecar
    for (quota, pod, cpuset, unset) in [
        (300_000, 400_000, Some("2-5"), false),
        (100_000, 400_000, Some("2-5"), false),
        (400_000, 400_000, Some("2-5"), true),
        // the pod's limit unknown: the container's own
        (100_000, 0, None, false),
    ] {
        let d = container(
            labelled(QosClass::Lsr),
            "app",
            &ann,
            SpecBatch::Unknown,
            &Requested {
                cpu_quota: quota,
                cpu_period: 100_000,
                pod_milli_cpu: pod / 100,
                ..Default::default()
            },
            &ctx(&upstream(), false, &p, &node()),
        );
        let patch = d.patch();
        assert_eq!(patch.cpuset_cpus.as_deref(), cpuset, "{quota} {pod}: {d:?}");
        assert_eq!(patch.cpu_quota == Some(-1), unset, "{quota} {pod}: {d:?}");
    }
}

/// koordlet's `UnsetPodCPUQuota` on the pod's own cgroup: for an untrusted
/// pod only while the CPUs bound are within the sandbox's CPU limit.
#[test]
fn a_pod_bound_to_cpus_runs_without_its_quota() {
    let p = ResourceQosStrategy::default();
    let ann: BTreeMap<String, String> = [(
        ANNOTATION_RESOURCE_STATUS.to_string(),
        r#"{"cpuset":"2-3"}"#.to_string(),
    )]
    .into();
    let limits = |q: i64, period: i64| SandboxLimits {
        memory_limit: 0,
        cpu_quota: q,
        cpu_period: period,
    };
    let unset = |period| Knob::CpuQuota {
        quota: None,
        period,
    };
    // (pod, sandbox quota and period, unset at period?)
    let table = [
        (trusted(QosClass::Lsr), -1, 0, Some(100_000)),
        (labelled(QosClass::Lsr), 200_000, 100_000, Some(100_000)),
        (labelled(QosClass::Lse), 150_000, 50_000, Some(50_000)),
        // 2 CPUs for a 1.5-CPU limit; no limit to size a binding by: not bound
        (labelled(QosClass::Lsr), 150_000, 100_000, None),
        (labelled(QosClass::Lsr), -1, 0, None),
        (labelled(QosClass::Ls), 200_000, 100_000, None),
    ];
    for (pc, q, period, want) in table {
        let d = pod(
            pc,
            &ann,
            SpecBatch::Unknown,
            &limits(q, period),
            &ctx(&Features::default(), false, &p, &node()),
        );
        let got = d
            .cgroup()
            .into_iter()
            .find(|k| matches!(k, Knob::CpuQuota { .. }));
        assert_eq!(got, want.map(unset), "{pc:?} {q}: {d:?}");
        assert_eq!(
            pod_binding(pc, &ann, &limits(q, period), &node()).is_some(),
            want.is_some(),
            "the pod's binding keeps its CPUs out of the pool"
        );
    }
}

/// koordlet's `calCPUSharePools`: every CPU a pod is bound to leaves the
/// LS pool; kubelet's reserved CPUs stay in it (`calcNodeTopo`).
#[test]
fn share_pool_is_the_cpus_no_pod_is_bound_to() {
    let online: BTreeSet<u32> = (0..8).collect();
    let pool = share_pool(&online, [BTreeSet::from([2, 3]), BTreeSet::from([3, 4])]);
    assert_eq!(format_cpu_list(&pool), "0-1,5-7");
    assert_eq!(format_cpu_list(&share_pool(&online, [])), "0-7");
}

/// Issue 12: the scheduler's cpuset annotation as a pod author could write it.
#[test]
fn resource_status_cpusets_by_trust_and_node() {
    let mut n = node();
    n.reserved_cpus = [0, 1].into();
    let p = ResourceQosStrategy::default();
    let hostile = format!(r#"{{"cpuset":"{}"}}"#, "0-65536,".repeat(32 << 10));
    // (class, by label, trusted, kubelet's cpuset, annotation, expected cpuset, warning kinds)
    type Case<'a> = (
        QosClass,
        bool,
        bool,
        &'a str,
        &'a str,
        Option<&'a str>,
        &'a [&'a str],
    );
    let table: &[Case] = &[
        // a Guaranteed pod without an LSE/LSR label keeps kubelet's cpuset
        (
            QosClass::Lsr,
            false,
            false,
            "",
            r#"{"cpuset":"2-3"}"#,
            None,
            &["binding-refused"],
        ),
        (
            QosClass::Lsr,
            true,
            false,
            "",
            r#"{"cpuset":"3,2"}"#,
            Some("2-3"),
            &[],
        ),
        // never reserved CPUs, never CPUs the node does not have
        (
            QosClass::Lse,
            true,
            false,
            "",
            r#"{"cpuset":"0-3"}"#,
            Some("2-3"),
            &["binding-narrowed"],
        ),
        (
            QosClass::Lsr,
            true,
            false,
            "",
            r#"{"cpuset":"14-20"}"#,
            Some("14-15"),
            &["binding-narrowed"],
        ),
        (
            QosClass::Lsr,
            true,
            false,
            "",
            r#"{"cpuset":"20-30"}"#,
            None,
            &["binding-refused"],
        ),
        (
            QosClass::Lsr,
            true,
            false,
            "",
            r#"{"cpuset":"0-1"}"#,
            None,
            &["binding-refused"],
        ),
        // an untrusted pod stays within kubelet's cpuset (others' exclusive CPUs are outside it)
        (
            QosClass::Lsr,
            true,
            false,
            "4-7",
            r#"{"cpuset":"2-5"}"#,
            Some("4-5"),
            &["binding-narrowed"],
        ),
        (
            QosClass::Lsr,
            true,
            false,
            "8-9",
            r#"{"cpuset":"2-5"}"#,
            None,
            &["binding-refused"],
        ),
        // trusted (Koordinator's scheduler): the annotation wins over kubelet's, within the node
        (
            QosClass::Lsr,
            true,
            true,
            "4-7",
            r#"{"cpuset":"2-5"}"#,
            Some("2-5"),
            &[],
        ),
        (
            QosClass::Lsr,
            false,
            true,
            "",
            r#"{"cpuset":"2-3"}"#,
            Some("2-3"),
            &[],
        ),
        // hostile or malformed input: a warning, kubelet's cpuset
        (
            QosClass::Lsr,
            true,
            true,
            "",
            &hostile,
            None,
            &["binding-refused"],
        ),
        (
            QosClass::Lsr,
            true,
            true,
            "",
            r#"{"cpuset":"99999999999"}"#,
            None,
            &["binding-refused"],
        ),
        (
            QosClass::Lsr,
            true,
            false,
            "x",
            r#"{"cpuset":"2"}"#,
            None,
            &["binding-refused"],
        ),
        // an untrusted pod binds to no more CPUs than its 4-CPU limit
        (
            QosClass::Lsr,
            true,
            false,
            "",
            r#"{"cpuset":"2-6"}"#,
            None,
            &["binding-refused"],
        ),
        (
            QosClass::Lsr,
            true,
            true,
            "",
            r#"{"cpuset":"2-6"}"#,
            Some("2-6"),
            &[],
        ),
        // LS shares the pool
        (
            QosClass::Ls,
            true,
            true,
            "",
            r#"{"cpuset":"2-3"}"#,
            None,
            &[],
        ),
    ];
    for (class, by_label, trusted, kubelet, a, want, warnings) in table {
        let ann: BTreeMap<String, String> =
            [(ANNOTATION_RESOURCE_STATUS.to_string(), a.to_string())].into();
        let d = container(
            PodClass {
                class: *class,
                by_label: *by_label,
                trusted: *trusted,
                kube: Some(KubeQos::Guaranteed),
            },
            "app",
            &ann,
            SpecBatch::Unknown,
            &Requested {
                cpuset_cpus: kubelet,
                cpu_quota: 400_000,
                cpu_period: 100_000,
                ..Default::default()
            },
            &ctx(&upstream(), false, &p, &n),
        );
        let short: String = a.chars().take(40).collect();
        assert_eq!(
            (
                d.patch().cpuset_cpus.as_deref(),
                d.warnings.iter().map(Warning::kind).collect::<Vec<_>>()
            ),
            (*want, warnings.to_vec()),
            "{class:?} label={by_label} trusted={trusted} kubelet={kubelet:?} {short}: {:?}",
            d.warnings
        );
        assert!(
            d.warnings.iter().all(|w| w.to_string().len() < 400),
            "warnings stay short"
        );
    }
}

/// Review of issue 12: lowering a Burstable pod to BE must not let its
/// batch annotation raise its CPU weight, nor an untrusted batch request
/// buy memory protection.
#[test]
fn untrusted_batch_annotations_only_on_besteffort_pods_and_without_protection() {
    let mut p = ResourceQosStrategy::default();
    p.be_class.memory_qos = MemoryQos {
        enable: true,
        min_limit_percent: 100,
        low_limit_percent: 100,
        ..Default::default()
    };
    let spec = r#"{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"4000","kubernetes.io/batch-memory":"1Gi"},"limits":{"kubernetes.io/batch-cpu":"4000","kubernetes.io/batch-memory":"2Gi"}}}}"#;
    let v2 = Features {
        memory_qos: true,
        ..Default::default()
    };
    let go = |pc: PodClass| {
        container(
            pc,
            "app",
            &ann(spec),
            SpecBatch::Unknown,
            &Requested::default(),
            &ctx(&v2, true, &p, &node()),
        )
    };
    let burstable_as_be = PodClass {
        kube: Some(KubeQos::Burstable),
        ..labelled(QosClass::Be)
    };
    let d = go(burstable_as_be);
    assert_eq!(d.patch().cpu_shares, None, "no weight from the annotation");
    assert_eq!(
        d.warnings,
        [Warning::BatchNotBestEffort {
            kube: Some(KubeQos::Burstable),
            from: crate::batch::Source::Annotation,
        }]
    );
    assert!(d.warnings[0]
        .to_string()
        .contains("the pod is Burstable, not BestEffort"));
    let d = go(labelled(QosClass::Be));
    assert_eq!(d.patch().cpu_shares, Some(4096));
    assert!(
        !d.patch().unified.contains_key("memory.min"),
        "no protection"
    );
    let d = go(PodClass {
        trusted: true,
        ..burstable_as_be
    });
    assert_eq!(d.patch().cpu_shares, Some(4096));
    assert_eq!(
        d.patch().unified.get("memory.min").map(String::as_str),
        Some("1073741824")
    );
}

/// Batch resources narrow what kubelet gave and stay within the node; never widen.
#[test]
fn batch_resources_are_bounded_by_kubelet_and_the_node() {
    let p = ResourceQosStrategy::default();
    let mut n = node();
    n.milli_cpus = 500;
    let d = container(
        labelled(QosClass::Be),
        "app",
        &ann(SPEC),
        SpecBatch::Unknown,
        &Requested {
            memory_limit: 128 << 20,
            ..Default::default()
        },
        &ctx(&upstream(), false, &p, &n),
    );
    assert_eq!(
        d.patch().memory_limit_in_bytes,
        Some(128 << 20),
        "kubelet's 128Mi, not 256Mi"
    );
    assert_eq!(d.patch().cpu_quota, Some(50_000), "the node's 500m");
    assert_eq!(d.warnings.len(), 2, "{:?}", d.warnings);
    // kubelet's own CPU limit bounds it too
    let d = container(
        labelled(QosClass::Be),
        "app",
        &ann(SPEC),
        SpecBatch::Unknown,
        &Requested {
            cpu_quota: 20_000,
            cpu_period: 100_000,
            ..Default::default()
        },
        &ctx(&upstream(), false, &p, &node()),
    );
    assert_eq!(d.patch().cpu_quota, Some(20_000));
}

/// Issue 14 item 9: the pod-level `koordinator.sh/cpuQOS` annotation, as
/// koordlet's groupidentity `SetPodBvtValue` takes it (LS-labelled pods
/// only; `groupIdentity` when given, 0 unless enabled), bounded for
/// untrusted pods (only lowered).
#[test]
fn a_pods_cpu_qos_annotation_over_its_class() {
    let bvt = Features {
        bvt: true,
        ..Default::default()
    };
    let gi = |pc: PodClass, a: &str| {
        let ann: BTreeMap<String, String> =
            [(ANNOTATION_CPU_QOS.to_string(), a.to_string())].into();
        let d = container(
            pc,
            "app",
            &ann,
            SpecBatch::Unknown,
            &Requested::default(),
            &ctx(&bvt, false, &cpu_on(), &node()),
        );
        let v = d.cgroup().iter().find_map(|k| match k {
            Knob::GroupIdentity(v) => Some(*v),
            _ => None,
        });
        (v, d.warnings.len())
    };
    let table: &[(PodClass, &str, Option<i64>, usize)] = &[
        // LS to BE: what koordlet allows
        (
            labelled(QosClass::Ls),
            r#"{"enable":true,"groupIdentity":-1}"#,
            Some(-1),
            0,
        ),
        // disabled (or enable unset): 0
        (labelled(QosClass::Ls), r#"{"enable":false}"#, Some(0), 0),
        (
            labelled(QosClass::Ls),
            r#"{"groupIdentity":-1}"#,
            Some(0),
            0,
        ),
        (labelled(QosClass::Ls), r#"{"enable":true}"#, Some(2), 0),
        // out of range, malformed: a warning, the class's value
        (
            labelled(QosClass::Ls),
            r#"{"enable":true,"groupIdentity":5}"#,
            Some(2),
            1,
        ),
        (labelled(QosClass::Ls), "{", Some(2), 1),
        // not an LS-labelled pod: the annotation is not read
        (
            labelled(QosClass::Be),
            r#"{"enable":true,"groupIdentity":2}"#,
            Some(-1),
            0,
        ),
        (
            trusted(QosClass::Lsr),
            r#"{"enable":true,"groupIdentity":-1}"#,
            Some(2),
            0,
        ),
    ];
    for (pc, a, want, warnings) in table {
        assert_eq!(gi(*pc, a), (*want, *warnings), "{pc:?} {a}");
    }
    // an untrusted pod may not raise itself above its class's value; a trusted one may
    let mut low = cpu_on();
    low.ls_class.cpu_qos.group_identity = 0;
    let raised = r#"{"enable":true,"groupIdentity":2}"#;
    let ann: BTreeMap<String, String> =
        [(ANNOTATION_CPU_QOS.to_string(), raised.to_string())].into();
    for (pc, want) in [(labelled(QosClass::Ls), 0), (trusted(QosClass::Ls), 2)] {
        let d = pod(
            pc,
            &ann,
            SpecBatch::Unknown,
            &SandboxLimits::default(),
            &ctx(&bvt, false, &low, &node()),
        );
        assert!(
            d.cgroup().contains(&Knob::GroupIdentity(want)),
            "{pc:?}: {d:?}"
        );
    }
}

/// Issue 14 item 9: the pod-level `koordinator.sh/memoryQOS` annotation as
/// koordlet's `mergePodResourceQoSForMemoryQoS` takes it, bounded for
/// untrusted pods.
#[test]
fn a_pods_memory_qos_annotation_over_its_class() {
    let mut p = ResourceQosStrategy::default();
    p.ls_class.memory_qos.enable = true;
    p.ls_class.memory_qos.min_limit_percent = 50;
    p.ls_class.memory_qos.low_limit_percent = 80;
    p.ls_class.memory_qos.throttling_percent = 60;
    let qp = |p: &ResourceQosStrategy, pc: PodClass, a: &str| {
        let ann: BTreeMap<String, String> =
            [(ANNOTATION_MEMORY_QOS.to_string(), a.to_string())].into();
        let mut w = Vec::new();
        let m = pod_memory_qos(pc, &ann, p, &mut w);
        (
            m.enable,
            m.min_limit_percent,
            m.low_limit_percent,
            m.throttling_percent,
            w.len(),
        )
    };
    let q = |pc: PodClass, a: &str| qp(&p, pc, a);
    let ls = labelled(QosClass::Ls);
    let tls = trusted(QosClass::Ls);
    // (enable, min%, low%, throttling%, warnings)
    type Got = (bool, i64, i64, i64, usize);
    let table: &[(PodClass, &str, Got)] = &[
        // an untrusted pod's none drops its protection, keeps its throttling
        (ls, r#"{"policy":"none"}"#, (true, 0, 0, 60, 0)),
        (tls, r#"{"policy":"none"}"#, (false, 50, 80, 60, 0)),
        // an untrusted pod's auto would take Koordinator's defaults (no throttling): ignored
        (
            ls,
            r#"{"policy":"auto","throttlingPercent":100}"#,
            (true, 50, 80, 60, 2),
        ),
        (ls, r#"{"minLimitPercent":20}"#, (true, 20, 80, 60, 0)),
        // raises from an untrusted pod: ignored, with a warning
        (
            ls,
            r#"{"minLimitPercent":90,"lowLimitPercent":10}"#,
            (true, 50, 10, 60, 1),
        ),
        (ls, r#"{"throttlingPercent":0}"#, (true, 50, 80, 60, 1)),
        (ls, r#"{"throttlingPercent":30}"#, (true, 50, 80, 30, 0)),
        (
            tls,
            r#"{"minLimitPercent":90,"throttlingPercent":0}"#,
            (true, 90, 80, 0, 0),
        ),
        // auto: Koordinator's defaults for the class (0 %), the class's switch
        (tls, r#"{"policy":"auto"}"#, (true, 0, 0, 0, 0)),
        (ls, r#"{"policy":"sometimes"}"#, (true, 50, 80, 60, 1)),
        (ls, r#"{"minLimitPercent":"x"}"#, (true, 50, 80, 60, 1)),
        (tls, r#"{"minLimitPercent":101}"#, (true, 50, 80, 60, 1)),
    ];
    for (pc, a, want) in table {
        assert_eq!(q(*pc, a), *want, "{pc:?} {a}");
    }
    // a class with memory QoS off: a trusted pod's fields turn it on for the
    // pod (they replace the class's); an untrusted pod's cannot
    let mut off = p.clone();
    off.ls_class.memory_qos.enable = false;
    assert!(qp(&off, tls, r#"{"minLimitPercent":40}"#).0);
    assert!(!qp(&off, ls, r#"{"minLimitPercent":40}"#).0);
}

/// Group identity as koordlet sets it (groupidentity/rule.go, `parseRule`,
/// `getPodBvtValue`, `getKubeQOSDirBvtValue`): a class's value when its
/// cpuQOS is on, 0 when off (written back), SYSTEM by its Kubernetes QoS,
/// kube QoS dirs kubepods 0 / burstable LS / besteffort BE, all 0 under
/// coreSched.
#[test]
fn group_identity_as_koordlet_sets_it() {
    let on = cpu_on();
    let off = ResourceQosStrategy::default();
    let mut only_be = ResourceQosStrategy::default();
    only_be.be_class.cpu_qos.enable = true;
    let mut only_ls = ResourceQosStrategy::default();
    only_ls.ls_class.cpu_qos.enable = true;
    let mut core = cpu_on();
    core.cpu_policy = CpuPolicy::CoreSched;
    core.be_class.cpu_qos.sched_idle = 1;
    let sys = |kube| PodClass {
        kube: Some(kube),
        ..labelled(QosClass::System)
    };
    // (pod, policy, value)
    let table: &[(PodClass, &ResourceQosStrategy, i64)] = &[
        (labelled(QosClass::Lsr), &on, 2),
        (labelled(QosClass::Lse), &on, 2),
        (labelled(QosClass::Ls), &on, 2),
        (labelled(QosClass::Be), &on, -1),
        (labelled(QosClass::Be), &off, 0),
        (labelled(QosClass::Ls), &only_be, 0),
        (labelled(QosClass::Be), &only_be, -1),
        (sys(KubeQos::Guaranteed), &on, 2),
        (sys(KubeQos::Guaranteed), &only_be, 0),
        (sys(KubeQos::BestEffort), &on, -1),
        (labelled(QosClass::Be), &core, 0),
        // an unlabelled Guaranteed pod with LS on and LSR off: LS's value (koordlet's
        // kubeQOSPodParams), not LSR's
        (
            PodClass {
                by_label: false,
                ..labelled(QosClass::Lsr)
            },
            &only_ls,
            2,
        ),
        (
            PodClass {
                by_label: false,
                ..labelled(QosClass::Be)
            },
            &only_be,
            -1,
        ),
    ];
    for (pc, p, want) in table {
        assert_eq!(group_identity(*pc, p).0, *want, "{pc:?} {:?}", p.cpu_policy);
    }
    assert_eq!(
        kube_qos_dirs(&on),
        [
            (KubeQos::Guaranteed, 0, false),
            (KubeQos::Burstable, 2, false),
            (KubeQos::BestEffort, -1, false)
        ]
    );
    assert_eq!(
        kube_qos_dirs(&off).map(|d| d.1),
        [0, 0, 0],
        "off: written back to 0"
    );
    assert_eq!(
        kube_qos_dirs(&core),
        [
            (KubeQos::Guaranteed, 0, false),
            (KubeQos::Burstable, 0, false),
            (KubeQos::BestEffort, 0, true)
        ],
        "coreSched: no bvt, SCHED_IDLE on the besteffort dir (schedIdle: 1)"
    );
    // on a bvt kernel: with the rule on, a class that is off gets 0; with it
    // off, nothing is planned (the executor writes back what it set before)
    let bvt = Features {
        bvt: true,
        ..Default::default()
    };
    let on_bvt = |p: &ResourceQosStrategy| {
        container(
            labelled(QosClass::Ls),
            "app",
            &BTreeMap::new(),
            SpecBatch::Unknown,
            &Requested::default(),
            &ctx(&bvt, false, p, &node()),
        )
    };
    let d = on_bvt(&only_be);
    assert_eq!(d.cgroup(), vec![Knob::GroupIdentity(0)]);
    assert_eq!(d.decisions[0].setting(false).0, "cpu.bvt_warp_ns");
    assert!(on_bvt(&off).cgroup().is_empty());
}

#[test]
fn pod_level() {
    assert_eq!(
        run_pod(QosClass::Be, &upstream()).cgroup(),
        vec![Knob::CpuIdle(true)]
    );
    assert!(run_pod(QosClass::Ls, &upstream()).cgroup().is_empty());
}

fn pod_with(
    class: QosClass,
    ann: &[(&str, &str)],
    sandbox_limit: i64,
    f: &Features,
    v2: bool,
    p: &ResourceQosStrategy,
    devices: &BTreeMap<String, Device>,
) -> PodDecision {
    let a: BTreeMap<String, String> = ann
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    pod(
        trusted(class),
        &a,
        SpecBatch::Unknown,
        &SandboxLimits {
            memory_limit: sandbox_limit,
            ..Default::default()
        },
        &Context {
            features: f,
            v2,
            policy: p,
            page_size: 4096,
            node: &node(),
            devices,
            share_pool: None,
        },
    )
}

#[test]
fn be_pod_quota_is_the_sum_of_its_containers() {
    let spec = r#"{"containers":{"a":{"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"64Mi"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"128Mi"}},"b":{"requests":{"kubernetes.io/batch-cpu":"500"},"limits":{"kubernetes.io/batch-cpu":"1000","kubernetes.io/batch-memory":"64Mi"}}}}"#;
    let p = cpu_on();
    let none = BTreeMap::new();
    let d = pod_with(
        QosClass::Be,
        &[(ANNOTATION_EXTENDED_RESOURCE_SPEC, spec)],
        0,
        &upstream(),
        false,
        &p,
        &none,
    );
    assert_eq!(
        d.cgroup(),
        vec![
            Knob::CpuIdle(true),
            Knob::CpuQuota {
                quota: Some(200_000),
                period: 100_000
            },
            Knob::MemoryLimit(Some(192 << 20)),
        ]
    );
    assert!(d.decisions.iter().any(|r| r.setting(false)
        == ("cpu.cfs_quota_us".into(), "200000".into())
        && r.because.contains("2000m")));
    // on v2 the same decision names cpu.max, with its period
    assert!(d
        .decisions
        .iter()
        .any(|r| r.setting(true) == ("cpu.max".into(), "200000 100000".into())));
    // without cpu.idle (bvt kernels, or cpuQOS off) the pod gets the summed shares
    let bvt = Features {
        bvt: true,
        ..Default::default()
    };
    let d = pod_with(
        QosClass::Be,
        &[(ANNOTATION_EXTENDED_RESOURCE_SPEC, spec)],
        0,
        &bvt,
        false,
        &p,
        &none,
    );
    assert!(d.cgroup().contains(&Knob::CpuShares(1024)), "{d:?}");
    assert!(d.cgroup().contains(&Knob::GroupIdentity(-1)));
    // not BE, or no spec, or a malformed one: identity only (and a warning)
    let d = pod_with(
        QosClass::Ls,
        &[(ANNOTATION_EXTENDED_RESOURCE_SPEC, spec)],
        0,
        &upstream(),
        false,
        &p,
        &none,
    );
    assert!(d.cgroup().is_empty());
    let d = pod_with(
        QosClass::Be,
        &[(ANNOTATION_EXTENDED_RESOURCE_SPEC, "{nope")],
        0,
        &upstream(),
        false,
        &p,
        &none,
    );
    assert_eq!(d.cgroup(), vec![Knob::CpuIdle(true)]);
    assert_eq!(d.warnings.len(), 1, "{d:?}");
}

#[test]
fn pod_memory_qos_where_the_request_is_known() {
    let mut p = ResourceQosStrategy::default();
    p.lsr_class.memory_qos = MemoryQos {
        enable: true,
        min_limit_percent: 100,
        low_limit_percent: 0,
        ..Default::default()
    };
    let none = BTreeMap::new();
    let v2 = Features {
        memory_qos: true,
        ..Default::default()
    };
    let d = pod_with(QosClass::Lsr, &[], 1 << 30, &v2, true, &p, &none);
    assert!(d.cgroup().contains(&Knob::MemoryMin(1 << 30)), "{d:?}");
    assert!(d.cgroup().contains(&Knob::MemoryLow(0)));
    // a guaranteed pod has no room between request and limit: no memory.high
    assert!(!d.cgroup().iter().any(|k| matches!(k, Knob::MemoryHigh(_))));
    // v1 without the files: a warning, nothing written
    let d = pod_with(QosClass::Lsr, &[], 1 << 30, &upstream(), false, &p, &none);
    assert!(d.cgroup().is_empty() && d.warnings.len() == 1, "{d:?}");
    // off by policy (LS default): nothing
    let d = pod_with(QosClass::Ls, &[], 1 << 30, &v2, true, &p, &none);
    assert!(d.cgroup().is_empty() && d.warnings.is_empty());
}

#[test]
fn blkio_limits_per_class_and_device() {
    let mut p = ResourceQosStrategy::default();
    p.be_class.blkio_qos = crate::policy::BlkIoQos {
        enable: true,
        blocks: vec![
            crate::policy::BlockCfg {
                name: "/dev/vda".into(),
                block_type: "device".into(),
                read_bps: 10 << 20,
                write_iops: 200,
                ..Default::default()
            },
            crate::policy::BlockCfg {
                name: "/dev/gone".into(),
                block_type: "device".into(),
                read_bps: 1,
                ..Default::default()
            },
        ],
    };
    let vda = Device {
        major: 254,
        minor: 0,
    };
    let devices: BTreeMap<String, Device> = [("/dev/vda".to_string(), vda)].into();
    let f = Features {
        blkio_throttle: true,
        ..Default::default()
    };
    let d = pod_with(QosClass::Be, &[], 0, &f, false, &p, &devices);
    assert_eq!(
        d.cgroup(),
        vec![Knob::IoLimit {
            device: vda,
            limits: qoslet_cgroups::IoLimits {
                read_bps: Some(10 << 20),
                write_iops: Some(200),
                ..Default::default()
            }
        }]
    );
    assert_eq!(
        d.decisions[0].setting(false),
        (
            "blkio.throttle 254:0".into(),
            "rbps=10485760 wbps=max riops=max wiops=200".into()
        )
    );
    assert_eq!(d.decisions[0].setting(true).0, "io.max 254:0");
    assert_eq!(
        d.warnings,
        [Warning::NotABlockDevice {
            name: "/dev/gone".into()
        }],
        "{d:?}"
    );
    assert!(pod_with(QosClass::Ls, &[], 0, &f, false, &p, &devices)
        .cgroup()
        .is_empty());
    let d = pod_with(
        QosClass::Be,
        &[],
        0,
        &Features::default(),
        false,
        &p,
        &devices,
    );
    assert!(
        d.cgroup().is_empty() && d.warnings.len() == 1,
        "no io controller: {d:?}"
    );
}
