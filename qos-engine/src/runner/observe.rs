//! What the loop reads of the node: the topology (again on CPU hotplug),
//! the besteffort parent and kube QoS dirs of kubelet's cgroup driver, the
//! store's pods as the engine plans them ([`Skeleton`], rebuilt per store
//! generation), and the one assembly of a [`NodeState`] ([`Look`]) for the
//! tick and for putting back what qoslet changed ([`restore`]).

use super::*;

/// The CPUs of each NUMA node, else all online CPUs as one node, else
/// `0..capacity` (sysfs as `qoslet_cgroups::topology` reads it).
pub(super) fn numa(sys_root: &Path, capacity: f64) -> Vec<Vec<u32>> {
    use qoslet_cgroups::topology;
    let nodes = topology::numa_nodes(sys_root);
    if !nodes.is_empty() {
        return nodes
            .into_values()
            .map(|c| c.into_iter().collect())
            .collect();
    }
    if let Some(c) = topology::online_cpus(sys_root) {
        return vec![c.into_iter().collect()];
    }
    vec![(0..capacity.max(1.0) as u32).collect()]
}

/// Each CPU's core and socket; a CPU whose core cannot be read is left out
/// (it then counts as its own core on socket 0).
fn places(sys_root: &Path, numa: &[Vec<u32>]) -> BTreeMap<u32, crate::cpuset::CpuPlace> {
    use qoslet_cgroups::topology;
    numa.iter()
        .flatten()
        .filter_map(|&c| {
            Some((
                c,
                crate::cpuset::CpuPlace {
                    core: topology::core_of(sys_root, c)?,
                    socket: topology::socket_of(sys_root, c).unwrap_or(0),
                },
            ))
        })
        .collect()
}

/// The NUMA layout and the CPUs' places, read again whenever the online CPUs
/// change (CPU hotplug): one small sysfs read per tick.
#[derive(Default)]
pub(super) struct Topology {
    seen: Option<Option<String>>,
    pub(super) numa: Vec<Vec<u32>>,
    pub(super) places: BTreeMap<u32, crate::cpuset::CpuPlace>,
}

impl Topology {
    pub(super) fn refresh(&mut self, sys_root: &Path, capacity: f64) -> &Self {
        let online = qoslet_cgroups::topology::online_text(sys_root);
        if self.seen.as_ref() != Some(&online) {
            self.numa = numa(sys_root, capacity);
            self.places = places(sys_root, &self.numa);
            self.seen = Some(online);
        }
        self
    }
}

/// The drivers to look under, the pods' own first (`systemd`: what the
/// store's pods use, if known).
fn drivers(systemd: Option<bool>) -> [bool; 2] {
    match systemd {
        Some(true) => [true, false],
        _ => [false, true],
    }
}

/// The besteffort parent: as configured, else the first of the cgroupfs and
/// systemd drivers' names that exists.
pub(super) fn find_be_parent(
    cgroups: &Cgroups,
    configured: Option<&CgroupPath>,
    root: &qoslet_cgroups::PodRoot,
    systemd: Option<bool>,
) -> Option<CgroupPath> {
    if let Some(c) = configured {
        return Some(c.clone());
    }
    drivers(systemd)
        .into_iter()
        .map(|systemd| root.qos_dirs(systemd)[2].clone())
        .find(|cg| cgroups.read(cg, "cpu", "cgroup.procs").is_ok())
}

/// The kube QoS dirs of whichever cgroup driver this node's kubelet uses
/// (empty until kubepods exists).
pub(super) fn find_qos_dirs(
    cgroups: &Cgroups,
    root: &qoslet_cgroups::PodRoot,
    systemd: Option<bool>,
) -> Vec<(qoslet_hooks::KubeQos, CgroupPath)> {
    use qoslet_hooks::KubeQos;
    let exists = |cg: &CgroupPath| cgroups.read(cg, "cpu", "cgroup.procs").is_ok();
    drivers(systemd)
        .into_iter()
        .map(|systemd| root.qos_dirs(systemd))
        .find(|d| exists(&d[0]))
        .map(|[g, b, e]| {
            [
                (KubeQos::Guaranteed, g),
                (KubeQos::Burstable, b),
                (KubeQos::BestEffort, e),
            ]
            .into_iter()
            .filter(|(_, cg)| exists(cg))
            .collect()
        })
        .unwrap_or_default()
}

/// The store's ready pods and running containers as the engine sees them,
/// rebuilt only when the store changes (paths validated, classes decided once).
pub(super) struct Skeleton {
    pub(super) generation: u64,
    pub(super) pods: Vec<Pod>,
    /// Per pod: its metrics entity and its containers' (same order as `pods`).
    entities: Vec<(String, Vec<String>)>,
}

impl Skeleton {
    pub(super) fn build(inv: &qoslet_state::Inventory) -> Self {
        let pods: Vec<Pod> = inv.pods.iter().filter_map(Pod::from_entry).collect();
        let entities = pods
            .iter()
            .map(|p| {
                (
                    format!("pod/{}", p.id),
                    p.containers
                        .iter()
                        .map(|c| format!("container/{}", c.entry.id))
                        .collect(),
                )
            })
            .collect();
        Self {
            generation: inv.generation,
            pods,
            entities,
        }
    }

    /// Keeps the BE pods' sandbox cgroups that exist (the pause container's:
    /// the cpuset suppress writes them with the containers; other pods' are not
    /// read).
    pub(super) fn find_sandboxes(&mut self, cgroups: &Cgroups) {
        for p in &mut self.pods {
            if p.class != qoslet_hooks::QosClass::Be {
                p.sandbox = None;
            } else if let Some(sb) = &p.sandbox {
                if cgroups.read(sb, "cpuset", "cgroup.procs").is_err() {
                    p.sandbox = None;
                }
            }
        }
    }

    /// Whether the pods are under the systemd driver's slices (`None`: no pod).
    pub(super) fn systemd(&self) -> Option<bool> {
        self.pods
            .first()
            .map(|p| p.cgroup.as_str().contains(".slice/"))
    }

    /// The pods with this tick's usage.
    pub(super) fn with_usage(&self, t: &Tick) -> Vec<Pod> {
        let readings: HashMap<&str, &qoslet_metrics::collect::Reading> = t
            .readings
            .iter()
            .map(|r| (r.target.entity.as_str(), r))
            .collect();
        let usage = |entity: &str, m: Metric| {
            readings
                .get(entity)
                .and_then(|r| sample(&r.samples, m))
                .unwrap_or(0.0)
        };
        let mut pods = self.pods.clone();
        for (p, (pe, ces)) in pods.iter_mut().zip(&self.entities) {
            p.cpu_cores = usage(pe, Metric::CpuUsage);
            for (c, ce) in p.containers.iter_mut().zip(ces) {
                c.cpu_cores = usage(ce, Metric::CpuUsage);
                c.throttled_ratio = usage(ce, Metric::CpuThrottledRatio);
            }
        }
        pods
    }
}

/// What one look at the node's files finds besides the metrics: the
/// besteffort parent with its quota and cpuset, the v1 cpuset ceiling, the
/// NUMA layout, the kube QoS dirs, kubelet's CPU manager. The one place a
/// [`NodeState`] is put together: the tick adds the metrics' usage, restore
/// plans with it as it is.
pub(super) struct Look<'a> {
    pub cgroups: &'a Cgroups,
    /// `None`: not found (the state's parent is the root, its quota unknown).
    pub be_parent: Option<&'a CgroupPath>,
    pub topology: &'a Topology,
    pub qos_dirs: &'a [(qoslet_hooks::KubeQos, CgroupPath)],
    pub cpu_manager: &'a CpuManagerState,
    pub capacity: f64,
    pub reserved: f64,
}

impl Look<'_> {
    /// The node with `pods` (their usage as given) and no usage figures of
    /// its own yet (`usage_known`; the tick sets them).
    pub(super) fn node_state(&self, pods: Vec<Pod>, generation: Option<u64>) -> NodeState {
        let cg = self.cgroups;
        let (be_quota_us, period_us) = self
            .be_parent
            .and_then(|bp| cg.read_cpu_quota(bp))
            .unwrap_or((None, 100_000));
        let be_parent = self.be_parent.cloned().unwrap_or_else(CgroupPath::root);
        let cpuset_ceiling = be_parent
            .parent()
            .filter(|_| !cg.host().is_v2())
            .and_then(|p| cg.read_cpuset(&p));
        let mut be_cpuset = self.be_parent.and_then(|bp| cg.read_cpuset(bp));
        if self.cpu_manager.is_static {
            // the BE cpuset lives on BE containers only: the smallest of a few of
            // theirs (one kubelet just created still has the whole shared pool)
            be_cpuset = pods
                .iter()
                .filter(|p| p.class == qoslet_hooks::QosClass::Be)
                .flat_map(|p| &p.containers)
                .filter_map(|c| cg.read_cpuset(&c.entry.cgroup))
                .take(4)
                .min_by_key(|c| c.len());
        }
        NodeState {
            capacity_cores: self.capacity,
            node_usage_cores: 0.0,
            system_usage_cores: 0.0,
            pods_usage_cores: None,
            be_usage_cores: None,
            usage_known: true,
            reserved_cores: self.reserved,
            pods,
            be_parent,
            be_quota_us,
            period_us,
            numa: self.topology.numa.clone(),
            places: self.topology.places.clone(),
            be_cpuset,
            qos_dirs: self.qos_dirs.to_vec(),
            cpuset_ceiling,
            static_cpu_manager: self.cpu_manager.is_static,
            shared_pool: self.cpu_manager.shared_pool.clone(),
            ancestors: BTreeMap::new(),
            pods_generation: generation,
        }
    }
}

/// Puts back every file the engine (and the hooks' own cgroup writes) may
/// have changed, for the pods in `inv`: the besteffort parent's quota and
/// cpuset, scaled LS quotas, bursts, group identity, SCHED_IDLE, memory QoS
/// (see [`crate::engine::restore_plan`]). Cgroups that are gone
/// are skipped. Runs the kernel-ordered executor once.
pub fn restore(
    cgroups: &Cgroups,
    s: &Settings,
    inv: &Inventory,
    policy: &Policy,
    env: &Env,
) -> crate::execute::Report {
    Executor::new(1).execute(&restore_plan(cgroups, s, inv, policy, env), cgroups)
}

/// [`restore`]'s writes and what each would do (dry run).
pub fn restore_preview(
    cgroups: &Cgroups,
    s: &Settings,
    inv: &Inventory,
    policy: &Policy,
    env: &Env,
) -> Vec<(crate::plan::Write, crate::execute::Preview)> {
    let plan = restore_plan(cgroups, s, inv, policy, env);
    let previews = Executor::preview(&plan, cgroups);
    plan.writes().iter().cloned().zip(previews).collect()
}

fn restore_plan(
    cgroups: &Cgroups,
    s: &Settings,
    inv: &Inventory,
    policy: &Policy,
    env: &Env,
) -> crate::plan::Plan {
    let mut k = Skeleton::build(inv);
    k.find_sandboxes(cgroups);
    let systemd = k.systemd();
    let be_parent = find_be_parent(cgroups, s.be_parent.as_ref(), &s.pod_root, systemd);
    let capacity = std::thread::available_parallelism()
        .map(|n| n.get() as f64)
        .unwrap_or(1.0);
    let mut topology = Topology::default();
    let look = Look {
        cgroups,
        be_parent: be_parent.as_ref(),
        topology: topology.refresh(&s.sys_root, capacity),
        qos_dirs: &find_qos_dirs(cgroups, &s.pod_root, systemd),
        cpu_manager: &s.cpu_manager.read(),
        capacity,
        reserved: s.reserved.cores(),
    };
    let state = look.node_state(k.pods, None);
    let mut found = crate::engine::Found::default();
    for p in &state.pods {
        for cg in std::iter::once(&p.cgroup).chain(p.containers.iter().map(|c| &c.entry.cgroup)) {
            if let Some(q) = cgroups.read_cpu_quota(cg) {
                found.quotas.insert(cg.clone(), q);
            }
        }
    }
    if !state.be_parent.as_str().is_empty() {
        for pod in cgroups.children(&state.be_parent, "cpuset") {
            found.be_subtree.extend(cgroups.children(&pod, "cpuset"));
            found.be_subtree.push(pod);
        }
    }
    let plan = crate::engine::restore_plan(&state, policy, env, &found);
    // pods removed since the store last saw them: nothing to put back
    let mut live = crate::plan::Plan::new();
    for w in plan.writes() {
        if cgroups.read(&w.cgroup, "cpu", "cgroup.procs").is_ok() {
            live.add(w.clone());
        }
    }
    live
}
